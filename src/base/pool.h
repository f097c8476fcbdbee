/* pool.h - a fixed-size thread pool for the heavy loops (matmuls, attention).
 * Workers spin only briefly after a job and then block on a condition variable, so a pool
 * on a shared 2-core machine never burns a core another process needs. */
#ifndef AR_POOL_H
#define AR_POOL_H

#include "base.h"

struct ar_pool;

/* fn runs once on each of nth threads with ith in [0, nth); split work by ith. */
typedef void (*ar_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (the calling thread counts as one). The caller owns the pool. */
enum ar_status ar_pool_create(int n_threads, struct ar_pool **out);
void ar_pool_destroy(struct ar_pool *pool);
int ar_pool_size(const struct ar_pool *pool);

/* Runs fn on every thread of the pool (the caller is thread 0) and returns when all are done.
 * One caller at a time per pool; a NULL pool runs fn(ctx, 0, 1). */
void ar_pool_run(struct ar_pool *pool, ar_pool_fn fn, void *ctx);

/* Runs fn on the caller and on whichever workers join before the caller has finished its own
 * call; workers that wake up later skip the job. fn must therefore take its work from a
 * shared counter (claim chunks until none is left) and must not assume that every ith runs:
 * the job is done when the caller's fn returns and the workers that joined have returned.
 * On a machine where another process holds a core, a descheduled worker then costs nothing
 * instead of stalling every step until it is scheduled again. ith is still unique among the
 * threads that run (per-thread scratch stays safe). */
void ar_pool_run_shared(struct ar_pool *pool, ar_pool_fn fn, void *ctx);

/* Splits [0, n) into nth near-equal ranges, rounded to multiples of `align`; range ith. */
void ar_pool_range(int64_t n, int64_t align, int ith, int nth, int64_t *begin, int64_t *end);

#endif
