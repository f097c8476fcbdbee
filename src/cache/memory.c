/* memory.c - the in-process reply cache behind struct cache_ops: a keyed hash
 * (SipHash-2-4, random key per cache, so crafted reviews cannot flood one chain) picks a
 * shard; each shard is a chained hash table plus an LRU list under one mutex. */
#include "cache.h"

#include <math.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <sys/random.h>

/* ---- SipHash-2-4 (Aumasson and Bernstein, 2012) ------------------------------------- */

static uint64_t rotl64(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#define SIP_ROUND(v0, v1, v2, v3)                                                                  \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl64(v1, 13);                                                                       \
        v1 ^= v0;                                                                                  \
        v0 = rotl64(v0, 32);                                                                       \
        v2 += v3;                                                                                  \
        v3 = rotl64(v3, 16);                                                                       \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl64(v3, 21);                                                                       \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl64(v1, 17);                                                                       \
        v1 ^= v2;                                                                                  \
        v2 = rotl64(v2, 32);                                                                       \
    } while (0)

static uint64_t siphash24(uint64_t k0, uint64_t k1, const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull;
    uint64_t v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull;
    uint64_t v3 = k1 ^ 0x7465646279746573ull;
    uint64_t b = (uint64_t)len << 56;
    size_t i;
    for (i = 0; i + 8 <= len; i += 8) {
        uint64_t m = load_le64(p + i);
        v3 ^= m;
        SIP_ROUND(v0, v1, v2, v3);
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    for (size_t j = 0; i + j < len; j++)
        b |= (uint64_t)p[i + j] << (8 * j);
    v3 ^= b;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= b;
    v2 ^= 0xff;
    for (int r = 0; r < 4; r++)
        SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- structures --------------------------------------------------------------------- */

/* LRU links; first member of struct entry, so a node pointer is an entry pointer. */
struct lru_node {
    struct lru_node *prev, *next;
};

struct entry {
    struct lru_node lru; /* list through the shard: sentinel.next is the most recent */
    struct entry *hnext; /* hash chain */
    uint64_t hash;
    double expires; /* clock seconds; INFINITY without TTL */
    size_t size;    /* bytes charged */
    size_t key_len, value_len;
    char data[]; /* key, value, NUL */
};

struct shard {
    alignas(64) pthread_mutex_t mu;
    struct entry **buckets; /* owned, (n_buckets), a power of two */
    size_t n_buckets;
    size_t n_entries;
    size_t n_bytes;
    struct lru_node lru; /* sentinel of a circular list */
};

struct mem_cache {
    struct cache base;    /* first: the handle callers hold */
    struct shard *shards; /* owned, aligned, (n_shards) */
    int n_shards;
    size_t shard_budget;
    double ttl_s;
    cache_clock_fn clock;
    void *clock_user;
    uint64_t k0, k1; /* hash key */
    _Atomic uint64_t hits, misses, evictions, expired;
};

#define INITIAL_BUCKETS 16

size_t cache_entry_size(size_t key_len, size_t value_len)
{
    /* header, the NUL, and two bucket slots (the table is at most twice the entries) */
    return sizeof(struct entry) + 1 + 2 * sizeof(struct entry *) + key_len + value_len;
}

static double default_clock(void *user)
{
    (void)user;
    return ar_time_s();
}

static void random_key(uint64_t *k0, uint64_t *k1)
{
    uint64_t k[2] = {0, 0};
    if (getrandom(k, sizeof(k), GRND_NONBLOCK) != (ssize_t)sizeof(k)) {
        /* no entropy yet: still differs from run to run */
        double t = ar_time_s();
        memcpy(&k[0], &t, sizeof(t));
        k[1] = (uint64_t)(uintptr_t)&k ^ 0x9e3779b97f4a7c15ull;
    }
    *k0 = k[0];
    *k1 = k[1];
}

/* ---- shard internals (mutex held) --------------------------------------------------- */

static void lru_unlink(struct entry *e)
{
    e->lru.prev->next = e->lru.next;
    e->lru.next->prev = e->lru.prev;
}

static void lru_push_front(struct shard *s, struct entry *e)
{
    e->lru.prev = &s->lru;
    e->lru.next = s->lru.next;
    s->lru.next->prev = &e->lru;
    s->lru.next = &e->lru;
}

static struct entry **find_slot(struct shard *s, uint64_t hash, const char *key, size_t key_len)
{
    struct entry **pp = &s->buckets[hash & (s->n_buckets - 1)];
    for (; *pp; pp = &(*pp)->hnext) {
        struct entry *e = *pp;
        if (e->hash == hash && e->key_len == key_len && memcmp(e->data, key, key_len) == 0)
            return pp;
    }
    return pp;
}

/* Unlinks the entry at *pp from the table and the list, and frees it. */
static void remove_at(struct shard *s, struct entry **pp)
{
    struct entry *e = *pp;
    *pp = e->hnext;
    lru_unlink(e);
    s->n_entries--;
    s->n_bytes -= e->size;
    ar_free(e);
}

static void remove_entry(struct shard *s, struct entry *e)
{
    struct entry **pp = &s->buckets[e->hash & (s->n_buckets - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    remove_at(s, pp);
}

/* Doubles the table; keeps the old one when memory is short (chains just get longer). */
static void grow(struct shard *s)
{
    size_t n = s->n_buckets * 2;
    struct entry **b = ar_calloc(n, sizeof(*b));
    if (!b)
        return;
    for (size_t i = 0; i < s->n_buckets; i++) {
        struct entry *e = s->buckets[i];
        while (e) {
            struct entry *next = e->hnext;
            size_t j = e->hash & (n - 1);
            e->hnext = b[j];
            b[j] = e;
            e = next;
        }
    }
    ar_free(s->buckets);
    s->buckets = b;
    s->n_buckets = n;
}

/* ---- operations --------------------------------------------------------------------- */

static struct shard *shard_for(struct mem_cache *mc, uint64_t hash)
{
    /* high bits pick the shard, low bits the bucket */
    return &mc->shards[(hash >> 32) % (uint64_t)mc->n_shards];
}

static int mem_get_ttl(struct cache *c, const char *key, size_t key_len, unsigned flags,
                       char **value_out, size_t *value_len, double *ttl_left_s)
{
    struct mem_cache *mc = (struct mem_cache *)c;
    struct shard *s;
    struct entry **pp;
    uint64_t hash;
    double now;
    bool hit = false;
    if (ttl_left_s)
        *ttl_left_s = 0;
    if (value_out)
        *value_out = NULL;
    if (value_len)
        *value_len = 0;
    if (!key && key_len)
        return 0;
    hash = siphash24(mc->k0, mc->k1, key, key_len);
    now = mc->clock(mc->clock_user);
    s = shard_for(mc, hash);
    pthread_mutex_lock(&s->mu);
    pp = find_slot(s, hash, key, key_len);
    if (*pp && now >= (*pp)->expires) {
        remove_at(s, pp);
        atomic_fetch_add_explicit(&mc->expired, 1, memory_order_relaxed);
    } else if (*pp) {
        struct entry *e = *pp;
        char *copy = NULL;
        if (value_out)
            copy = ar_strndup(e->data + e->key_len, e->value_len);
        if (!value_out || copy) {
            hit = true;
            if (ttl_left_s)
                *ttl_left_s = e->expires - now; /* INFINITY without TTL */
            if (!(flags & CACHE_GET_READ_ONLY)) {
                lru_unlink(e);
                lru_push_front(s, e);
            }
            if (value_out)
                *value_out = copy;
            if (value_len)
                *value_len = e->value_len;
        }
    }
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add_explicit(hit ? &mc->hits : &mc->misses, 1, memory_order_relaxed);
    return hit ? 1 : 0;
}

static int mem_get(struct cache *c, const char *key, size_t key_len, unsigned flags,
                   char **value_out, size_t *value_len)
{
    return mem_get_ttl(c, key, key_len, flags, value_out, value_len, NULL);
}

static enum ar_status mem_put_ttl(struct cache *c, const char *key, size_t key_len,
                                  const char *value, size_t value_len, double life_s)
{
    struct mem_cache *mc = (struct mem_cache *)c;
    size_t size;
    struct entry *e = NULL, **pp;
    struct shard *s;
    uint64_t hash;
    double now;
    if (!key || key_len == 0 || (!value && value_len) || isnan(life_s) || life_s <= 0)
        return AR_EINVAL;
    if (key_len > SIZE_MAX / 4 || value_len > SIZE_MAX / 4)
        return AR_ERANGE;
    size = cache_entry_size(key_len, value_len);
    hash = siphash24(mc->k0, mc->k1, key, key_len);
    now = mc->clock(mc->clock_user);
    if (size <= mc->shard_budget) {
        e = ar_malloc(sizeof(*e) + key_len + value_len + 1);
        if (!e)
            return AR_ENOMEM;
        e->hash = hash;
        e->expires = now + fmin(mc->ttl_s > 0 ? mc->ttl_s : (double)INFINITY, life_s);
        e->size = size;
        e->key_len = key_len;
        e->value_len = value_len;
        memcpy(e->data, key, key_len);
        if (value_len)
            memcpy(e->data + key_len, value, value_len);
        e->data[key_len + value_len] = '\0';
    }
    s = shard_for(mc, hash);
    pthread_mutex_lock(&s->mu);
    pp = find_slot(s, hash, key, key_len);
    if (*pp)
        remove_at(s, pp); /* replaced, or stale when the new value does not fit */
    if (e) {
        if (s->n_entries >= s->n_buckets)
            grow(s);
        pp = &s->buckets[hash & (s->n_buckets - 1)];
        e->hnext = *pp;
        *pp = e;
        lru_push_front(s, e);
        s->n_entries++;
        s->n_bytes += size;
        /* the new entry fits alone, so eviction stops before reaching it */
        while (s->n_bytes > mc->shard_budget) {
            remove_entry(s, (struct entry *)s->lru.prev);
            atomic_fetch_add_explicit(&mc->evictions, 1, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return e ? AR_OK : AR_ERANGE;
}

static enum ar_status mem_put(struct cache *c, const char *key, size_t key_len, const char *value,
                              size_t value_len)
{
    return mem_put_ttl(c, key, key_len, value, value_len, (double)INFINITY);
}

static void mem_stats(struct cache *c, struct cache_stats *out)
{
    struct mem_cache *mc = (struct mem_cache *)c;
    memset(out, 0, sizeof(*out));
    out->hits = atomic_load_explicit(&mc->hits, memory_order_relaxed);
    out->misses = atomic_load_explicit(&mc->misses, memory_order_relaxed);
    out->evictions = atomic_load_explicit(&mc->evictions, memory_order_relaxed);
    out->expired = atomic_load_explicit(&mc->expired, memory_order_relaxed);
    for (int i = 0; i < mc->n_shards; i++) {
        struct shard *s = &mc->shards[i];
        pthread_mutex_lock(&s->mu);
        out->n_entries += s->n_entries;
        out->n_bytes += s->n_bytes;
        pthread_mutex_unlock(&s->mu);
    }
}

static void mem_destroy(struct cache *c)
{
    struct mem_cache *mc = (struct mem_cache *)c;
    if (!mc)
        return;
    for (int i = 0; mc->shards && i < mc->n_shards; i++) {
        struct shard *s = &mc->shards[i];
        if (!s->buckets)
            continue; /* never initialised: creation failed here */
        while (s->lru.next != &s->lru)
            remove_entry(s, (struct entry *)s->lru.next);
        ar_free(s->buckets);
        pthread_mutex_destroy(&s->mu);
    }
    ar_free_aligned(mc->shards);
    ar_free(mc);
}

static const struct cache_ops mem_ops = {
    .name = "memory",
    .get = mem_get,
    .put = mem_put,
    .stats = mem_stats,
    .healthy = NULL,
    .destroy = mem_destroy,
    .get_ttl = mem_get_ttl,
    .put_ttl = mem_put_ttl,
};

struct cache_memory_params cache_memory_default_params(void)
{
    struct cache_memory_params p = {0};
    p.max_bytes = (size_t)64 << 20;
    p.ttl_s = 3600.0;
    p.n_shards = 16;
    return p;
}

enum ar_status cache_memory_create(const struct cache_memory_params *p, struct cache **out)
{
    struct mem_cache *mc;
    if (!out)
        return AR_EINVAL;
    *out = NULL;
    if (!p || p->max_bytes == 0 || p->n_shards < 1 || p->n_shards > 256 || isnan(p->ttl_s))
        return AR_EINVAL;
    mc = ar_calloc(1, sizeof(*mc));
    if (!mc)
        return AR_ENOMEM;
    mc->base.ops = &mem_ops;
    mc->n_shards = p->n_shards;
    mc->shard_budget = p->max_bytes / (size_t)p->n_shards;
    mc->ttl_s = p->ttl_s;
    mc->clock = p->clock ? p->clock : default_clock;
    mc->clock_user = p->clock_user;
    random_key(&mc->k0, &mc->k1);
    atomic_init(&mc->hits, 0);
    atomic_init(&mc->misses, 0);
    atomic_init(&mc->evictions, 0);
    atomic_init(&mc->expired, 0);
    mc->shards = ar_malloc_aligned((size_t)p->n_shards * sizeof(struct shard));
    if (!mc->shards)
        goto fail;
    memset(mc->shards, 0, (size_t)p->n_shards * sizeof(struct shard));
    for (int i = 0; i < p->n_shards; i++) {
        struct shard *s = &mc->shards[i];
        s->buckets = ar_calloc(INITIAL_BUCKETS, sizeof(*s->buckets));
        if (!s->buckets)
            goto fail;
        if (pthread_mutex_init(&s->mu, NULL) != 0) {
            ar_free(s->buckets);
            s->buckets = NULL;
            goto fail;
        }
        s->n_buckets = INITIAL_BUCKETS;
        s->lru.next = s->lru.prev = &s->lru;
    }
    *out = &mc->base;
    return AR_OK;
fail:
    mem_destroy(&mc->base);
    return AR_ENOMEM;
}
