/* cache.c - the cache interface: each call dispatches through the handle's ops table, so
 * callers never know which implementation (memory.c, redis.c, tiered.c) they hold; and
 * cache_open, which picks them by URL. */
#include "cache.h"

#include <string.h>

int cache_get(struct cache *c, const char *key, size_t key_len, char **value_out, size_t *value_len)
{
    return cache_get_flags(c, key, key_len, 0, value_out, value_len);
}

int cache_get_flags(struct cache *c, const char *key, size_t key_len, unsigned flags,
                    char **value_out, size_t *value_len)
{
    if (!c) {
        if (value_out)
            *value_out = NULL;
        if (value_len)
            *value_len = 0;
        return 0;
    }
    return c->ops->get(c, key, key_len, flags, value_out, value_len);
}

enum ar_status cache_put(struct cache *c, const char *key, size_t key_len, const char *value,
                         size_t value_len)
{
    if (!c)
        return AR_EINVAL;
    return c->ops->put(c, key, key_len, value, value_len);
}

void cache_stats(struct cache *c, struct cache_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof(*out));
    if (c)
        c->ops->stats(c, out);
}

bool cache_redis_healthy(struct cache *c)
{
    return !c || !c->ops->healthy || c->ops->healthy(c);
}

void cache_destroy(struct cache *c)
{
    if (c)
        c->ops->destroy(c);
}

const char *cache_class_str(enum cache_class cls)
{
    return cls == CACHE_CLASS_BULK ? "bulk" : "interactive";
}

bool cache_class_parse(const char *s, size_t len, enum cache_class *out)
{
    for (int c = 0; c < CACHE_N_CLASSES; c++) {
        const char *name = cache_class_str((enum cache_class)c);
        if (s && len == strlen(name) && memcmp(s, name, len) == 0) {
            *out = (enum cache_class)c;
            return true;
        }
    }
    return false;
}

const char *cache_class_redis_prefix(enum cache_class cls)
{
    return cls == CACHE_CLASS_BULK ? "ar:rc:b:" : "ar:rc:i:";
}

static enum ar_status open_levels(const char *url, const char *redis_prefix,
                                  const struct cache_memory_params *l1, struct cache **out,
                                  struct ar_err *err);

enum ar_status cache_open(const char *url, const struct cache_memory_params *l1, struct cache **out,
                          struct ar_err *err)
{
    return open_levels(url, NULL, l1, out, err);
}

enum ar_status cache_open_class(const char *url, enum cache_class cls,
                                const struct cache_memory_params *l1, struct cache **out,
                                struct ar_err *err)
{
    if ((unsigned)cls >= CACHE_N_CLASSES) {
        if (out)
            *out = NULL;
        return ar_err_set(err, AR_EINVAL, 0, "unknown cache class");
    }
    return open_levels(url, cache_class_redis_prefix(cls), l1, out, err);
}

/* redis_prefix NULL: the Redis cache's default prefix */
static enum ar_status open_levels(const char *url, const char *redis_prefix,
                                  const struct cache_memory_params *l1, struct cache **out,
                                  struct ar_err *err)
{
    struct cache_memory_params mp = l1 ? *l1 : cache_memory_default_params();
    struct cache_redis_params rp = cache_redis_default_params();
    struct cache *mem = NULL, *red = NULL;
    enum ar_status st;
    if (!out)
        return AR_EINVAL;
    *out = NULL;
    if (url && *url && strcmp(url, "memory") != 0 && strncmp(url, "redis://", 8) != 0)
        return ar_err_set(err, AR_EINVAL, 0,
                          "unknown kind of cache: use memory or redis://host:port/db");
    if (mp.max_bytes > 0 && (st = cache_memory_create(&mp, &mem)) != AR_OK)
        return ar_err_set(err, st, 0, "cannot create the in-process cache: %s", ar_status_str(st));
    if (!url || !*url || strcmp(url, "memory") == 0) {
        *out = mem; /* NULL without an in-process level */
        return AR_OK;
    }
    rp.url = url;
    rp.ttl_s = mp.ttl_s;
    if (redis_prefix)
        rp.key_prefix = redis_prefix;
    if ((st = cache_redis_create(&rp, &red, err)) != AR_OK) {
        cache_destroy(mem);
        return st;
    }
    if (!mem) { /* every lookup goes to Redis */
        *out = red;
        return AR_OK;
    }
    return cache_tiered_create(mem, red, out); /* owns both, on failure too */
}
