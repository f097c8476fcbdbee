/* cache.h - the reply cache: normalized-review key (reply/normalize.h) -> generated reply.
 * One interface (struct cache_ops), three implementations, each in its own file:
 *   memory.c  in process: sharded hash tables, each shard under its own mutex with its own
 *             LRU list and byte budget, and a time-to-live checked on every get;
 *   redis.c   shared by a fleet: SET key value PX ttl on a Redis server bounded by its own
 *             maxmemory + allkeys-lru; a Redis that is down makes gets misses, never errors;
 *   tiered.c  an in-process L1 over a shared L2 (get: L1, then L2 copied into L1; put: both).
 * Below them, the Redis connection pool with reconnection and a circuit breaker (redis_pool.c)
 * that the server's Redis rate limits (server/limits_redis.c) share.
 *
 * Traffic classes (cache_open_class): the server keeps one cache per class, each with its own
 * byte budget, TTL and Redis key prefix, so that bulk work (jobs, backfills) cannot evict the
 * replies interactive requests hit; bulk lookups may read the interactive cache read-only
 * (CACHE_GET_READ_ONLY), bulk inserts go only to the bulk cache.
 *
 * Keys and values are byte strings (not necessarily NUL-terminated); the cache copies both
 * on put and hands out copies on get, so no pointer into the cache ever escapes a call.
 *
 * Thread safety: every function except the destroys may be called from any thread at once. */
#ifndef AR_CACHE_H
#define AR_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Counters since creation. hits + misses == number of gets; a get that finds an expired
 * entry counts as a miss and as expired. Evictions are entries pushed out by the byte
 * budget (replacing a key's value is not an eviction). */
struct cache_stats {
    uint64_t hits; /* all levels */
    uint64_t misses;
    uint64_t evictions; /* in process only (Redis evicts on its own, unseen) */
    uint64_t expired;
    uint64_t n_entries; /* entries held now in process (expired ones not yet dropped included) */
    uint64_t n_bytes;   /* bytes charged now in process, see cache_entry_size */
    uint64_t l2_hits;   /* tiered: of hits, those the second level answered; else 0 */
    uint64_t errors;    /* calls a backend server failed (unreachable, breaker open, error
                           reply); 0 in process */
};

struct cache;

/* What every implementation provides; cache_get & co dispatch through it. */
struct cache_ops {
    const char *name; /* "memory", "redis", "tiered" */
    /* 0: a miss; else the level that answered (1; a tiered cache's L2: 2). flags:
     * CACHE_GET_* */
    int (*get)(struct cache *c, const char *key, size_t key_len, unsigned flags, char **value_out,
               size_t *value_len);
    enum ar_status (*put)(struct cache *c, const char *key, size_t key_len, const char *value,
                          size_t value_len);
    void (*stats)(struct cache *c, struct cache_stats *out);
    bool (*healthy)(struct cache *c); /* NULL: always */
    void (*destroy)(struct cache *c);
    /* Optional (NULL: unknown, i.e. the whole TTL of the level it is copied into). get, and on
     * a hit *ttl_left_s: the seconds the entry has left (INFINITY: no expiry; 0: unknown or
     * gone, do not copy it). What a tiered cache asks its L2, so that a copy in L1 expires
     * with the original, never later. */
    int (*get_ttl)(struct cache *c, const char *key, size_t key_len, unsigned flags,
                   char **value_out, size_t *value_len, double *ttl_left_s);
    /* Optional (NULL: put). put with at most life_s seconds to live (> 0), or less when the
     * cache's own TTL is shorter. */
    enum ar_status (*put_ttl)(struct cache *c, const char *key, size_t key_len, const char *value,
                              size_t value_len, double life_s);
};

/* The head of every implementation's handle (its first member). */
struct cache {
    const struct cache_ops *ops;
};

/* ---- the interface ---------------------------------------------------------------------- */

/* On a hit returns the level that answered (1: in process; 2: shared, i.e. Redis, alone or
 * as a tiered cache's L2) and, when
 * value_out is not NULL, sets *value_out to a new NUL-terminated copy of the value (the
 * caller owns it: ar_free) and *value_len (may be NULL) to its length. Returns 0 on a miss,
 * on an expired entry, on bad arguments, when the copy cannot be allocated and when a
 * backend server cannot answer (counted in errors too). */
int cache_get(struct cache *c, const char *key, size_t key_len, char **value_out,
              size_t *value_len);

/* A get that leaves the cache as it was: no LRU promotion of a hit, no copy of an L2 hit
 * into L1 (an expired entry is still dropped: it was dead already). For readers of another
 * class's cache (bulk work reading the interactive one), so that they cannot change which
 * entries it keeps. */
#define CACHE_GET_READ_ONLY 1u

/* cache_get with flags (CACHE_GET_*). */
int cache_get_flags(struct cache *c, const char *key, size_t key_len, unsigned flags,
                    char **value_out, size_t *value_len);

/* Stores a copy of (key, value), replacing the key's previous value and restarting its
 * TTL. AR_EINVAL for an empty key or NULL pointers with non-zero lengths, AR_ENOMEM;
 * in process AR_ERANGE (see cache_memory_create); Redis AR_EUNAVAIL (see cache_redis_create). */
enum ar_status cache_put(struct cache *c, const char *key, size_t key_len, const char *value,
                         size_t value_len);

/* *out: the counters (all zero for NULL c). */
void cache_stats(struct cache *c, struct cache_stats *out);

/* Frees the cache and every entry; NULL does nothing. No call may be in flight. */
void cache_destroy(struct cache *c);

/* ---- in process (memory.c) -------------------------------------------------------------- */

/* Seconds on a monotonic clock; injectable so that tests can move time. */
typedef double (*cache_clock_fn)(void *user);

struct cache_memory_params {
    size_t max_bytes;     /* total budget, split evenly over the shards */
    double ttl_s;         /* entries expire this long after their put; <= 0: never */
    int n_shards;         /* 1..256 */
    cache_clock_fn clock; /* NULL: ar_time_s */
    void *clock_user;
};

/* 64 MiB, one hour, 16 shards, the monotonic clock. */
struct cache_memory_params cache_memory_default_params(void);

/* Creates the in-process cache. Each shard holds at most max_bytes / n_shards bytes,
 * evicting its least recently used entries to stay there; a get makes its entry the most
 * recently used and drops it when expired. A put of an entry larger than a shard's budget
 * answers AR_ERANGE: nothing is stored and a previous value of the key is dropped (it is
 * stale). The caller owns *out (cache_destroy). AR_EINVAL for a zero budget or a shard
 * count out of range. */
enum ar_status cache_memory_create(const struct cache_memory_params *p, struct cache **out);

/* Bytes an entry is charged: key, value and a fixed overhead (entry header and its share
 * of the hash table). An entry larger than one shard's budget is never stored. */
size_t cache_entry_size(size_t key_len, size_t value_len);

/* ---- shared by a fleet (redis.c) -------------------------------------------------------- */

struct cache_redis_params {
    const char *url;        /* redis://[[user]:password@]host[:port][/db], required */
    double ttl_s;           /* entries expire this long after their put (Redis PX, ms
                               precision); <= 0: never (3600) */
    const char *key_prefix; /* before every key, so caches can share a server ("ar:rc:") */
    int connect_timeout_ms; /* 50 */
    int command_timeout_ms; /* 100 */
    int pool_size;          /* connections, 1..64 (4) */
    int backoff_min_ms;     /* first wait after a failure, doubling ... (100) */
    int backoff_max_ms;     /* ... up to this (5000) */
};

/* The defaults noted above, url NULL. */
struct cache_redis_params cache_redis_default_params(void);

/* Creates a cache on the Redis server at p->url. The URL is checked here (AR_EINVAL with a
 * message in err for a bad one); the server need not be up: the cache connects when it can
 * (creation tries once, within the connect timeout). While Redis cannot be reached, a get
 * is a miss and a put answers AR_EUNAVAIL, both at once without touching the network until
 * the backoff allows another try; a put also answers AR_EIO for an error reply (Redis out of
 * memory with a noeviction policy). The caller owns *out (cache_destroy). */
enum ar_status cache_redis_create(const struct cache_redis_params *p, struct cache **out,
                                  struct ar_err *err);

/* Whether the last contact with every Redis server behind c worked: false for a Redis cache
 * (or a tiered cache over one) that could not be reached last time (for /health
 * "degraded"); true for any other cache and for NULL. Cheap: one atomic load per level. */
bool cache_redis_healthy(struct cache *c);

/* ---- two levels (tiered.c) -------------------------------------------------------------- */

/* A cache that gets from l1, then from l2 (a hit there is copied into l1 to expire when the
 * l2 entry does, when l2 can tell (get_ttl) and l1 can hold it so (put_ttl): a TTL counts from
 * the first put, not from the copy), and puts into both. Takes ownership of l1 and l2, on success
 * and on failure (cache_destroy of the tiered cache destroys both). A put answers AR_OK when both
 * levels stored the entry, else the status of the first level that failed (the other still got it).
 * Stats: hits of both levels (l2_hits: those of l2), misses of both, errors of both, evictions,
 * expired and sizes of l1. AR_EINVAL for NULL levels, AR_ENOMEM. */
enum ar_status cache_tiered_create(struct cache *l1, struct cache *l2, struct cache **out);

/* ---- by URL (cache.c) ------------------------------------------------------------------ */

/* The reply cache a server runs with, by URL: NULL, "" or "memory": in process only;
 * "redis://host:port/db": the in-process cache as L1 over Redis as L2 (cache_tiered_create,
 * Redis entries living l1->ttl_s too, the other Redis settings their defaults). l1: the
 * in-process cache's parameters (NULL: cache_memory_default_params); l1->max_bytes 0 means no
 * in-process level: Redis alone for a Redis URL, and no cache at all (*out NULL, AR_OK) for the
 * others. The caller owns *out (cache_destroy). AR_EINVAL with a message for another scheme or
 * a bad Redis URL; Redis need not be up (see cache_redis_create). */
enum ar_status cache_open(const char *url, const struct cache_memory_params *l1, struct cache **out,
                          struct ar_err *err);

/* ---- traffic classes (cache.c) ---------------------------------------------------------- */

/* Who is asking: interactive requests (a customer waits: /v1/reviews/reply, batch, the reply
 * CLI) or bulk work (job lines, the batch CLI). */
enum cache_class { CACHE_CLASS_INTERACTIVE = 0, CACHE_CLASS_BULK = 1, CACHE_N_CLASSES };

/* "interactive", "bulk". */
const char *cache_class_str(enum cache_class cls);
/* The class named by s[0..len) ("interactive" or "bulk"); false for anything else. */
bool cache_class_parse(const char *s, size_t len, enum cache_class *out);

/* The Redis key prefix of a class's cache: "ar:rc:i:" (interactive), "ar:rc:b:" (bulk). Both
 * end in a fixed-length tag, so no key of one class can be read as a key of the other. */
const char *cache_class_redis_prefix(enum cache_class cls);

/* cache_open for one class: the same levels, with Redis entries under the class's prefix
 * (cache_class_redis_prefix) living l1->ttl_s (Redis PX, i.e. an expiry on every SET). */
enum ar_status cache_open_class(const char *url, enum cache_class cls,
                                const struct cache_memory_params *l1, struct cache **out,
                                struct ar_err *err);

/* ---- Redis connections (redis_pool.c), shared with the server's rate limits --------------- */

/* A few connections to one Redis server, each used by one thread at a time, with a circuit
 * breaker: a failed call (cannot connect, I/O error, timeout) marks the server down and
 * frees the connections; while down, calls fail at once with AR_EUNAVAIL until the backoff
 * (backoff_min_ms doubling up to backoff_max_ms) has passed, then one call tries again (the
 * others keep failing fast) and a success closes the breaker. A connection the server closed
 * (Redis restarted) is retried once on a new connection before the call fails. SIGPIPE from
 * a dead socket is blocked and swallowed in the calling thread, never delivered. */
struct cache_redis_pool;
struct redisReply; /* hiredis */

struct cache_redis_pool_params {
    const char *url;        /* redis://[[user]:password@]host[:port][/db] */
    const char *what;       /* for log lines: "reply cache", "rate limits" */
    int connect_timeout_ms; /* 50 */
    int command_timeout_ms; /* 100 */
    int pool_size;          /* 1..64 (4) */
    int backoff_min_ms;     /* 100 */
    int backoff_max_ms;     /* 5000 */
};

struct cache_redis_pool_params cache_redis_pool_default_params(void);

/* A parsed Redis URL. */
struct cache_redis_url {
    char host[256];     /* name or address ("::1" without brackets) */
    int port;           /* 1..65535 (6379) */
    int db;             /* 0..1000000 (0) */
    char user[128];     /* "" : none (AUTH password) */
    char password[256]; /* "" : none */
};

/* Parses redis://[[user]:password@]host[:port][/db] ("[::1]" for an IPv6 address).
 * AR_EINVAL with a message naming the problem for anything else (another scheme, an empty
 * host, a port or db that is not a number in range, a query or trailing text). */
enum ar_status cache_redis_url_parse(const char *url, struct cache_redis_url *out,
                                     struct ar_err *err);

/* Parses the URL (AR_EINVAL) and tries one connection (a failure is not an error: the
 * pool starts down and retries after the backoff). The caller owns *out
 * (cache_redis_pool_destroy). AR_EINVAL for parameters out of range, AR_ENOMEM. */
enum ar_status cache_redis_pool_create(const struct cache_redis_pool_params *p,
                                       struct cache_redis_pool **out, struct ar_err *err);
void cache_redis_pool_destroy(struct cache_redis_pool *pool);

/* Runs one command (argv as hiredis's redisCommandArgv; argvlen may not be NULL). AR_OK:
 * *reply is Redis's answer, possibly an error reply (the caller owns it: freeReplyObject).
 * AR_EUNAVAIL: the server could not be reached (or the breaker is open), *reply is NULL and
 * the failure is counted. AR_ENOMEM. Thread-safe; blocks at most about connect + command
 * timeouts (twice when a closed connection is retried), waiting for a free connection
 * besides. */
enum ar_status cache_redis_pool_command(struct cache_redis_pool *pool, int argc, const char **argv,
                                        const size_t *argvlen, struct redisReply **reply);

/* Whether the last call reached the server. Thread-safe. */
bool cache_redis_pool_healthy(const struct cache_redis_pool *pool);
/* Failed calls since creation (unreachable, breaker open, plus those noted below). */
uint64_t cache_redis_pool_errors(const struct cache_redis_pool *pool);
/* Counts a failure the caller saw in a reply (an unexpected error reply). */
void cache_redis_pool_note_error(struct cache_redis_pool *pool);

#endif
