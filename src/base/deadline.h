/* deadline.h - absolute deadlines for pthread_cond_timedwait and friends: now on a clock plus
 * a number of seconds, as a normalized struct timespec (0 <= tv_nsec < 1e9). */
#ifndef AR_BASE_DEADLINE_H
#define AR_BASE_DEADLINE_H

#include <time.h>

/* clock's now + s seconds. s below 0 counts as 0 (a deadline already due), s above 1e9 (about
 * 31 years) as 1e9, so that no caller's value can overflow time_t. clock: CLOCK_REALTIME for a
 * condition variable with default attributes, CLOCK_MONOTONIC for one set to it. */
struct timespec ar_deadline_in(clockid_t clock, double s);

#endif
