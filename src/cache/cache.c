/* cache.c - the cache interface: each call dispatches through the handle's ops table, so
 * callers never know which implementation (memory.c, redis.c, tiered.c) they hold. */
#include "cache.h"

int cache_get(struct cache *c, const char *key, size_t key_len, char **value_out, size_t *value_len)
{
    if (!c) {
        if (value_out)
            *value_out = NULL;
        if (value_len)
            *value_len = 0;
        return 0;
    }
    return c->ops->get(c, key, key_len, value_out, value_len);
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
