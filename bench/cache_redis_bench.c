/* cache_redis_bench.c - the Redis reply cache under threads: gets and puts per second and the
 * mean call time for 1, 4 and 16 threads, with one connection (a mutex in effect) against a
 * pool of 4 and 8. Needs a Redis: AR_BENCH_REDIS_URL or AR_TEST_REDIS_URL
 * (sh deploy/services.sh start redis DIR prints one). Usage: cache_redis_bench [seconds] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/cache.h"

struct worker {
    struct cache *c;
    int id;
    double end;
    long n_ops;
    double busy_s;
};

static void *run(void *arg)
{
    struct worker *w = arg;
    uint64_t seed = 77 + (uint64_t)w->id;
    char key[32], val[200];
    memset(val, 'r', sizeof(val));
    while (ar_time_s() < w->end) {
        int k = (int)(ar_splitmix64(&seed) % 1000);
        int kl = snprintf(key, sizeof(key), "bench:%d", k);
        double t0 = ar_time_s();
        if (ar_splitmix64(&seed) % 4 == 0) {
            cache_put(w->c, key, (size_t)kl, val, sizeof(val));
        } else {
            char *v = NULL;
            cache_get(w->c, key, (size_t)kl, &v, NULL);
            ar_free(v);
        }
        w->busy_s += ar_time_s() - t0;
        w->n_ops++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *url = getenv("AR_BENCH_REDIS_URL");
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    static const int pools[] = {1, 4, 8};
    static const int threads[] = {1, 4, 16};
    if (!url || !*url)
        url = getenv("AR_TEST_REDIS_URL");
    if (!url || !*url) {
        fprintf(stderr, "cache_redis_bench: set AR_BENCH_REDIS_URL (redis://host:port/db)\n");
        return 2;
    }
    printf("%-6s %-8s %12s %14s\n", "pool", "threads", "ops/s", "mean call us");
    for (size_t pi = 0; pi < AR_ARRAY_LEN(pools); pi++) {
        for (size_t ti = 0; ti < AR_ARRAY_LEN(threads); ti++) {
            struct cache_redis_params p = cache_redis_default_params();
            struct ar_err err = {AR_OK, 0, {0}};
            struct cache *c = NULL;
            struct worker w[16];
            pthread_t th[16];
            long n = 0;
            double busy = 0, t0;
            int nt = threads[ti];
            p.url = url;
            p.key_prefix = "bench:";
            p.pool_size = pools[pi];
            p.command_timeout_ms = 1000;
            if (cache_redis_create(&p, &c, &err) != AR_OK) {
                fprintf(stderr, "cache_redis_bench: %s\n", err.msg);
                return 1;
            }
            t0 = ar_time_s();
            for (int i = 0; i < nt; i++) {
                w[i] = (struct worker){c, i, t0 + seconds, 0, 0};
                pthread_create(&th[i], NULL, run, &w[i]);
            }
            for (int i = 0; i < nt; i++) {
                pthread_join(th[i], NULL);
                n += w[i].n_ops;
                busy += w[i].busy_s;
            }
            printf("%-6d %-8d %12.0f %14.1f\n", pools[pi], nt, (double)n / (ar_time_s() - t0),
                   n ? busy / (double)n * 1e6 : 0.0);
            cache_destroy(c);
        }
    }
    return 0;
}
