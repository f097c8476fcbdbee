/* pool.c - blocking thread pool: generation counter + condition variables, with a short
 * bounded spin before sleeping so back-to-back jobs of one forward pass stay cheap. */
#define _POSIX_C_SOURCE 200809L
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>

#include "cpu.h"

/* About 20-50 us of spinning: long enough to bridge two consecutive ops of one forward
 * pass, short enough not to matter to other processes when the pool is idle. */
#define POOL_SPIN 2048

struct worker {
    struct ar_pool *pool;
    int ith;
    pthread_t th;
};

struct ar_pool {
    int n;
    struct worker *workers; /* owned, (n - 1) */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    atomic_uint_fast64_t gen; /* (job number << 1) | 1 for ar_pool_run_shared jobs */
    atomic_int pending;       /* workers still running the current job */
    /* shared jobs: (job tag << 32) | closed bit 31 | workers inside fn (bits 0..30) */
    atomic_uint_fast64_t join;
    bool stop;
    ar_pool_fn fn;
    void *ctx;
};

#define JOIN_CLOSED (1ull << 31)
#define JOIN_COUNT (JOIN_CLOSED - 1)

/* A worker enters shared job `tag` only while the job is open; a late worker (the caller has
 * already closed the job, or a newer job has started) leaves without touching it. */
static void worker_join_shared(struct ar_pool *p, int ith, uint32_t tag)
{
    uint64_t cur = atomic_load_explicit(&p->join, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(cur >> 32) != tag || (cur & JOIN_CLOSED))
            return;
        if (atomic_compare_exchange_weak_explicit(&p->join, &cur, cur + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            break;
    }
    /* registered: the caller waits for us, so fn and ctx are this job's */
    p->fn(p->ctx, ith, p->n);
    cur = atomic_fetch_sub_explicit(&p->join, 1, memory_order_acq_rel) - 1;
    if ((cur & JOIN_CLOSED) && (cur & JOIN_COUNT) == 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct ar_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < POOL_SPIN; i++) {
            ar_cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !p->stop)
                pthread_cond_wait(&p->cv_work, &p->mu);
            bool stop = p->stop;
            pthread_mutex_unlock(&p->mu);
            if (stop)
                return NULL;
        }
        seen = g;
        if (g & 1) {
            worker_join_shared(p, w->ith, (uint32_t)g);
            continue;
        }
        p->fn(p->ctx, w->ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

enum ar_status ar_pool_create(int n_threads, struct ar_pool **out)
{
    struct ar_pool *p;
    if (n_threads < 1 || n_threads > 1024)
        return AR_EINVAL;
    p = ar_calloc(1, sizeof(*p));
    if (!p)
        return AR_ENOMEM;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->join, 0);
    if (n_threads > 1) {
        p->workers = ar_calloc((size_t)n_threads - 1, sizeof(*p->workers));
        if (!p->workers) {
            ar_pool_destroy(p);
            return AR_ENOMEM;
        }
        for (int i = 1; i < n_threads; i++) {
            struct worker *w = &p->workers[i - 1];
            w->pool = p;
            w->ith = i;
            if (pthread_create(&w->th, NULL, worker_main, w) != 0) {
                ar_pool_destroy(p);
                return AR_ENOMEM;
            }
            p->n_started++;
        }
    }
    *out = p;
    return AR_OK;
}

void ar_pool_destroy(struct ar_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i].th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    ar_free(p->workers);
    ar_free(p);
}

int ar_pool_size(const struct ar_pool *p)
{
    return p ? p->n : 1;
}

void ar_pool_run(struct ar_pool *p, ar_pool_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->gen, ((atomic_load(&p->gen) >> 1) + 1) << 1,
                          memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) && i < POOL_SPIN; i++)
        ar_cpu_relax();
    if (atomic_load_explicit(&p->pending, memory_order_acquire)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending))
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

void ar_pool_run_shared(struct ar_pool *p, ar_pool_fn fn, void *ctx)
{
    uint64_t g, left;
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    pthread_mutex_lock(&p->mu);
    g = (((atomic_load(&p->gen) >> 1) + 1) << 1) | 1;
    /* open the job before publishing it, so a worker that sees g finds it open */
    atomic_store_explicit(&p->join, (uint64_t)(uint32_t)g << 32, memory_order_release);
    atomic_store_explicit(&p->gen, g, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    /* close the job: from now on no worker enters; wait for those inside */
    left = atomic_fetch_or_explicit(&p->join, JOIN_CLOSED, memory_order_acq_rel) & JOIN_COUNT;
    for (int i = 0; left && i < POOL_SPIN; i++) {
        ar_cpu_relax();
        left = atomic_load_explicit(&p->join, memory_order_acquire) & JOIN_COUNT;
    }
    if (left) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->join) & JOIN_COUNT)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

void ar_pool_range(int64_t n, int64_t align, int ith, int nth, int64_t *begin, int64_t *end)
{
    if (align < 1)
        align = 1;
    int64_t units = (n + align - 1) / align;
    int64_t per = units / nth, rem = units % nth;
    int64_t b = ith * per + (ith < rem ? ith : rem);
    int64_t e = b + per + (ith < rem ? 1 : 0);
    b *= align;
    e *= align;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}
