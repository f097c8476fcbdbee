/* tiered.c - two caches as one: an in-process L1 in front of a shared L2 (Redis). A get
 * tries L1, then L2, and copies an L2 hit into L1 so the next one stays in process; a put
 * goes to both, so other instances find the reply in L2. A read-only get (CACHE_GET_READ_ONLY)
 * copies nothing. */
#include "cache.h"

#include <math.h>
#include <stdatomic.h>

struct tiered_cache {
    struct cache base;     /* first: the handle callers hold */
    struct cache *l1, *l2; /* owned */
    _Atomic uint64_t hits1, hits2, misses;
};

static int tc_get(struct cache *c, const char *key, size_t key_len, unsigned flags,
                  char **value_out, size_t *value_len)
{
    struct tiered_cache *tc = (struct tiered_cache *)c;
    char *v = NULL;
    size_t n = 0;
    double left = (double)INFINITY; /* L2 cannot tell: L1's own TTL */
    if (value_out)
        *value_out = NULL;
    if (value_len)
        *value_len = 0;
    if (!key && key_len)
        return 0;
    if (cache_get_flags(tc->l1, key, key_len, flags, value_out, value_len)) {
        atomic_fetch_add_explicit(&tc->hits1, 1, memory_order_relaxed);
        return 1;
    }
    if (!(tc->l2->ops->get_ttl ? tc->l2->ops->get_ttl(tc->l2, key, key_len, flags, &v, &n, &left)
                               : cache_get_flags(tc->l2, key, key_len, flags, &v, &n))) {
        atomic_fetch_add_explicit(&tc->misses, 1, memory_order_relaxed);
        return 0;
    }
    /* an entry L1 cannot hold (AR_ERANGE) is still a hit; a read-only get leaves L1 as it was;
     * the copy lives no longer than the L2 entry has left (a TTL counts from the first put) */
    if (!(flags & CACHE_GET_READ_ONLY) && left > 0) {
        if (isfinite(left) && tc->l1->ops->put_ttl)
            (void)tc->l1->ops->put_ttl(tc->l1, key, key_len, v, n, left);
        else
            (void)cache_put(tc->l1, key, key_len, v, n);
    }
    atomic_fetch_add_explicit(&tc->hits2, 1, memory_order_relaxed);
    if (value_out)
        *value_out = v;
    else
        ar_free(v);
    if (value_len)
        *value_len = n;
    return 2;
}

static enum ar_status tc_put(struct cache *c, const char *key, size_t key_len, const char *value,
                             size_t value_len)
{
    struct tiered_cache *tc = (struct tiered_cache *)c;
    enum ar_status st1 = cache_put(tc->l1, key, key_len, value, value_len);
    enum ar_status st2 = cache_put(tc->l2, key, key_len, value, value_len);
    return st1 != AR_OK ? st1 : st2;
}

static void tc_stats(struct cache *c, struct cache_stats *out)
{
    struct tiered_cache *tc = (struct tiered_cache *)c;
    struct cache_stats s1, s2;
    cache_stats(tc->l1, &s1);
    cache_stats(tc->l2, &s2);
    memset(out, 0, sizeof(*out));
    out->l2_hits = atomic_load_explicit(&tc->hits2, memory_order_relaxed);
    out->hits = atomic_load_explicit(&tc->hits1, memory_order_relaxed) + out->l2_hits;
    out->misses = atomic_load_explicit(&tc->misses, memory_order_relaxed);
    out->evictions = s1.evictions;
    out->expired = s1.expired;
    out->n_entries = s1.n_entries;
    out->n_bytes = s1.n_bytes;
    out->errors = s1.errors + s2.errors;
}

static bool tc_healthy(struct cache *c)
{
    struct tiered_cache *tc = (struct tiered_cache *)c;
    return cache_redis_healthy(tc->l1) && cache_redis_healthy(tc->l2);
}

static void tc_destroy(struct cache *c)
{
    struct tiered_cache *tc = (struct tiered_cache *)c;
    cache_destroy(tc->l1);
    cache_destroy(tc->l2);
    ar_free(tc);
}

static const struct cache_ops tiered_ops = {
    .name = "tiered",
    .get = tc_get,
    .put = tc_put,
    .stats = tc_stats,
    .healthy = tc_healthy,
    .destroy = tc_destroy,
};

enum ar_status cache_tiered_create(struct cache *l1, struct cache *l2, struct cache **out)
{
    struct tiered_cache *tc = NULL;
    if (out)
        *out = NULL;
    if (!out || !l1 || !l2 || l1 == l2 || !(tc = ar_calloc(1, sizeof(*tc)))) {
        enum ar_status st = !out || !l1 || !l2 || l1 == l2 ? AR_EINVAL : AR_ENOMEM;
        cache_destroy(l1);
        if (l2 != l1)
            cache_destroy(l2);
        return st;
    }
    tc->base.ops = &tiered_ops;
    tc->l1 = l1;
    tc->l2 = l2;
    atomic_init(&tc->hits1, 0);
    atomic_init(&tc->hits2, 0);
    atomic_init(&tc->misses, 0);
    *out = &tc->base;
    return AR_OK;
}
