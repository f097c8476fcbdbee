/* cache.h - the reply cache: normalized-review key (normalize.h) -> generated reply.
 * An interface (struct cache_ops) with one implementation here, in process: sharded
 * hash tables, each shard under its own mutex with its own LRU list and byte budget, and a
 * time-to-live checked on every get. A Redis-backed implementation can sit beside it
 * behind the same ops when several servers share one cache.
 *
 * Keys and values are byte strings (not necessarily NUL-terminated); the cache copies both
 * on put and hands out copies on get, so no pointer into the cache ever escapes a call.
 *
 * Thread safety: every function except destroy may be called from any thread at once. */
#ifndef AR_CACHE_H
#define AR_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

/* Counters since creation. hits + misses == number of gets; a get that finds an expired
 * entry counts as a miss and as expired. Evictions are entries pushed out by the byte
 * budget (replacing a key's value is not an eviction). */
struct cache_stats {
    uint64_t hits;
    uint64_t misses;
    uint64_t evictions;
    uint64_t expired;
    uint64_t n_entries; /* entries held now (expired ones not yet dropped included) */
    uint64_t n_bytes;   /* bytes charged now, see cache_entry_size */
};

struct cache;

/* What every implementation provides; cache_get & co dispatch through it. */
struct cache_ops {
    const char *name; /* "memory", "redis", ... */
    bool (*get)(struct cache *c, const char *key, size_t key_len, char **value_out,
                size_t *value_len);
    enum ar_status (*put)(struct cache *c, const char *key, size_t key_len, const char *value,
                          size_t value_len);
    void (*stats)(struct cache *c, struct cache_stats *out);
    void (*destroy)(struct cache *c);
};

/* The head of every implementation's handle (its first member). */
struct cache {
    const struct cache_ops *ops;
};

/* Seconds on a monotonic clock; injectable so that tests can move time. */
typedef double (*cache_clock_fn)(void *user);

struct cache_memory_params {
    size_t max_bytes;           /* total budget, split evenly over the shards */
    double ttl_s;               /* entries expire this long after their put; <= 0: never */
    int n_shards;               /* 1..256 */
    cache_clock_fn clock; /* NULL: ar_time_s */
    void *clock_user;
};

/* 64 MiB, one hour, 16 shards, the monotonic clock. */
struct cache_memory_params cache_memory_default_params(void);

/* Creates the in-process cache. Each shard holds at most max_bytes / n_shards bytes,
 * evicting its least recently used entries to stay there. The caller owns *out
 * (cache_destroy). AR_EINVAL for a zero budget or a shard count out of range. */
enum ar_status cache_memory_create(const struct cache_memory_params *p, struct cache **out);

/* Bytes an entry is charged: key, value and a fixed overhead (entry header and its share
 * of the hash table). An entry larger than one shard's budget is never stored. */
size_t cache_entry_size(size_t key_len, size_t value_len);

/* On a hit returns true and, when value_out is not NULL, sets *value_out to a new
 * NUL-terminated copy of the value (the caller owns it: ar_free) and *value_len (may be
 * NULL) to its length; the entry becomes the most recently used. Returns false on a miss,
 * on an expired entry (which is dropped), on bad arguments, and when the copy cannot be
 * allocated (counted as a miss). */
bool cache_get(struct cache *c, const char *key, size_t key_len, char **value_out,
                     size_t *value_len);

/* Stores a copy of (key, value), replacing the key's previous value and restarting its
 * TTL. AR_ERANGE when the entry would be larger than a shard's budget: then nothing is
 * stored and a previous value of the key is dropped (it is stale). AR_EINVAL for an empty
 * key or NULL pointers with non-zero lengths, AR_ENOMEM. */
enum ar_status cache_put(struct cache *c, const char *key, size_t key_len,
                               const char *value, size_t value_len);

void cache_stats(struct cache *c, struct cache_stats *out);

/* Frees the cache and every entry; NULL does nothing. No call may be in flight. */
void cache_destroy(struct cache *c);

#endif
