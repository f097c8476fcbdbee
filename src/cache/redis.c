/* redis.c - the reply cache on a Redis server that a fleet shares: GET and SET key value PX
 * ttl under a key prefix; Redis bounds it with its own maxmemory and allkeys-lru
 * (deploy/services.sh starts it so). Failures are ordinary: through redis_pool.c a Redis
 * that is down makes a get a miss and a put AR_EUNAVAIL at once, and is retried by itself. */
#include "cache.h"

#include <hiredis/hiredis.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>

struct redis_cache {
    struct cache base; /* first: the handle callers hold */
    struct cache_redis_pool *pool;
    char *prefix; /* owned */
    size_t prefix_len;
    char ttl_ms[24]; /* decimal milliseconds for PX; "" without TTL */
    _Atomic uint64_t hits, misses;
};

struct cache_redis_params cache_redis_default_params(void)
{
    struct cache_redis_pool_params pp = cache_redis_pool_default_params();
    struct cache_redis_params p;
    memset(&p, 0, sizeof(p));
    p.ttl_s = 3600.0;
    p.key_prefix = "ar:rc:";
    p.connect_timeout_ms = pp.connect_timeout_ms;
    p.command_timeout_ms = pp.command_timeout_ms;
    p.pool_size = pp.pool_size;
    p.backoff_min_ms = pp.backoff_min_ms;
    p.backoff_max_ms = pp.backoff_max_ms;
    return p;
}

/* prefix + key in a new buffer (the caller frees it); NULL when out of memory. */
static char *full_key(const struct redis_cache *rc, const char *key, size_t key_len, size_t *len)
{
    char *k = ar_malloc(rc->prefix_len + key_len + 1);
    if (!k)
        return NULL;
    memcpy(k, rc->prefix, rc->prefix_len);
    if (key_len)
        memcpy(k + rc->prefix_len, key, key_len);
    k[rc->prefix_len + key_len] = '\0';
    *len = rc->prefix_len + key_len;
    return k;
}

static int rc_get(struct cache *c, const char *key, size_t key_len, unsigned flags,
                  char **value_out, size_t *value_len)
{
    struct redis_cache *rc = (struct redis_cache *)c;
    const char *argv[2];
    size_t argvlen[2];
    redisReply *r = NULL;
    char *k;
    int level = 0;
    (void)flags; /* a GET changes nothing that matters: Redis's LRU is approximate anyway */
    if (value_out)
        *value_out = NULL;
    if (value_len)
        *value_len = 0;
    if (!key && key_len)
        return 0;
    if (!(k = full_key(rc, key, key_len, &argvlen[1])))
        goto done;
    argv[0] = "GET";
    argvlen[0] = 3;
    argv[1] = k;
    if (cache_redis_pool_command(rc->pool, 2, argv, argvlen, &r) != AR_OK)
        goto done; /* counted by the pool */
    if (r->type == REDIS_REPLY_STRING) {
        char *copy = NULL;
        if (value_out && !(copy = ar_strndup(r->str, r->len)))
            goto done;
        level = 2; /* the shared level, alone or under an in-process one */
        if (value_out)
            *value_out = copy;
        if (value_len)
            *value_len = r->len;
    } else if (r->type != REDIS_REPLY_NIL) {
        AR_DEBUG("reply cache: Redis GET answered %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected type");
        cache_redis_pool_note_error(rc->pool);
    }
done:
    if (r)
        freeReplyObject(r);
    ar_free(k);
    atomic_fetch_add_explicit(level ? &rc->hits : &rc->misses, 1, memory_order_relaxed);
    return level;
}

/* A GET, then on a hit a PTTL: what the entry has left, so that an in-process copy expires
 * with it (tiered.c). A second round trip, but only on an L2 hit, which fills L1 so that the
 * next ones stay in process. PTTL -1: no expiry; -2 (expired in between) or a failure: 0,
 * which keeps the hit out of L1. */
static int rc_get_ttl(struct cache *c, const char *key, size_t key_len, unsigned flags,
                      char **value_out, size_t *value_len, double *ttl_left_s)
{
    struct redis_cache *rc = (struct redis_cache *)c;
    const char *argv[2];
    size_t argvlen[2];
    redisReply *r = NULL;
    char *k;
    int level = rc_get(c, key, key_len, flags, value_out, value_len);
    *ttl_left_s = 0;
    if (!level || !(k = full_key(rc, key, key_len, &argvlen[1])))
        return level;
    argv[0] = "PTTL";
    argvlen[0] = 4;
    argv[1] = k;
    if (cache_redis_pool_command(rc->pool, 2, argv, argvlen, &r) == AR_OK) {
        if (r->type == REDIS_REPLY_INTEGER && r->integer == -1)
            *ttl_left_s = (double)INFINITY;
        else if (r->type == REDIS_REPLY_INTEGER && r->integer > 0)
            *ttl_left_s = (double)r->integer / 1000.0;
        freeReplyObject(r);
    }
    ar_free(k);
    return level;
}

static enum ar_status rc_put(struct cache *c, const char *key, size_t key_len, const char *value,
                             size_t value_len)
{
    struct redis_cache *rc = (struct redis_cache *)c;
    const char *argv[5];
    size_t argvlen[5];
    int argc = 3;
    redisReply *r = NULL;
    enum ar_status st;
    char *k;
    if (!key || key_len == 0 || (!value && value_len))
        return AR_EINVAL;
    if (!(k = full_key(rc, key, key_len, &argvlen[1])))
        return AR_ENOMEM;
    argv[0] = "SET";
    argvlen[0] = 3;
    argv[1] = k;
    argv[2] = value ? value : "";
    argvlen[2] = value_len;
    if (rc->ttl_ms[0]) {
        argv[3] = "PX";
        argvlen[3] = 2;
        argv[4] = rc->ttl_ms;
        argvlen[4] = strlen(rc->ttl_ms);
        argc = 5;
    }
    st = cache_redis_pool_command(rc->pool, argc, argv, argvlen, &r);
    ar_free(k);
    if (st != AR_OK)
        return st;
    if (r->type == REDIS_REPLY_STATUS) {
        st = AR_OK;
    } else {
        /* OOM under a noeviction policy, a read-only replica ...: Redis is up but refuses */
        AR_DEBUG("reply cache: Redis SET answered %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected type");
        cache_redis_pool_note_error(rc->pool);
        st = AR_EIO;
    }
    freeReplyObject(r);
    return st;
}

static void rc_stats(struct cache *c, struct cache_stats *out)
{
    struct redis_cache *rc = (struct redis_cache *)c;
    memset(out, 0, sizeof(*out));
    out->hits = atomic_load_explicit(&rc->hits, memory_order_relaxed);
    out->misses = atomic_load_explicit(&rc->misses, memory_order_relaxed);
    out->errors = cache_redis_pool_errors(rc->pool);
}

static bool rc_healthy(struct cache *c)
{
    return cache_redis_pool_healthy(((struct redis_cache *)c)->pool);
}

static void rc_destroy(struct cache *c)
{
    struct redis_cache *rc = (struct redis_cache *)c;
    if (!rc)
        return;
    cache_redis_pool_destroy(rc->pool);
    ar_free(rc->prefix);
    ar_free(rc);
}

static const struct cache_ops redis_ops = {
    .name = "redis",
    .get = rc_get,
    .put = rc_put,
    .stats = rc_stats,
    .healthy = rc_healthy,
    .destroy = rc_destroy,
    .get_ttl = rc_get_ttl,
    .put_ttl = NULL, /* the L2 of a tiered cache, never filled from another level */
};

enum ar_status cache_redis_create(const struct cache_redis_params *p, struct cache **out,
                                  struct ar_err *err)
{
    struct cache_redis_pool_params pp = cache_redis_pool_default_params();
    struct redis_cache *rc;
    enum ar_status st;
    if (!out)
        return AR_EINVAL;
    *out = NULL;
    if (!p)
        return ar_err_set(err, AR_EINVAL, 0, "no Redis cache parameters");
    if (isnan(p->ttl_s) || p->ttl_s > 1e9)
        return ar_err_set(err, AR_EINVAL, 0, "Redis cache: the TTL must be at most 1e9 s");
    if (!(rc = ar_calloc(1, sizeof(*rc))))
        return AR_ENOMEM;
    rc->base.ops = &redis_ops;
    atomic_init(&rc->hits, 0);
    atomic_init(&rc->misses, 0);
    if (p->ttl_s > 0)
        snprintf(rc->ttl_ms, sizeof(rc->ttl_ms), "%lld",
                 AR_MAX(1LL, (long long)llround(p->ttl_s * 1000.0)));
    if (!(rc->prefix = ar_strdup(p->key_prefix ? p->key_prefix : "ar:rc:"))) {
        ar_free(rc);
        return AR_ENOMEM;
    }
    rc->prefix_len = strlen(rc->prefix);
    pp.url = p->url;
    pp.what = "reply cache";
    pp.connect_timeout_ms = p->connect_timeout_ms;
    pp.command_timeout_ms = p->command_timeout_ms;
    pp.pool_size = p->pool_size;
    pp.backoff_min_ms = p->backoff_min_ms;
    pp.backoff_max_ms = p->backoff_max_ms;
    if ((st = cache_redis_pool_create(&pp, &rc->pool, err)) != AR_OK) {
        rc_destroy(&rc->base);
        return st;
    }
    *out = &rc->base;
    return AR_OK;
}
