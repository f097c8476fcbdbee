/* deadline.c - see deadline.h. */
#include "deadline.h"

struct timespec ar_deadline_in(clockid_t clock, double s)
{
    struct timespec ts;
    time_t whole;
    clock_gettime(clock, &ts);
    if (!(s > 0)) /* also NaN */
        s = 0;
    if (s > 1e9)
        s = 1e9;
    whole = (time_t)s;
    ts.tv_sec += whole;
    ts.tv_nsec += (long)((s - (double)whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}
