/* cache_test.c - the in-process cache (memory.c): hits and misses, TTL on a fake clock, LRU
 * eviction under the byte budget checked against a plain reference model, shop isolation
 * through real keys, oversized values, four threads at once, allocation failures, and
 * dispatch through the ops table. Includes memory.c to check its SipHash on the paper's
 * test vector. */
#include "harness/harness.h"

#include <pthread.h>

#include "../../src/cache/memory.c"
#include "../../src/reply/normalize.c" /* reply_normalize_key: real keys */

struct fake_clock {
    double now;
};

static double fake_now(void *user)
{
    return ((struct fake_clock *)user)->now;
}

static struct cache *make_cache(size_t max_bytes, double ttl_s, int n_shards,
                                struct fake_clock *clk)
{
    struct cache_memory_params p = cache_memory_default_params();
    struct cache *c = NULL;
    p.max_bytes = max_bytes;
    p.ttl_s = ttl_s;
    p.n_shards = n_shards;
    if (clk) {
        p.clock = fake_now;
        p.clock_user = clk;
    }
    assert_int_equal(cache_memory_create(&p, &c), AR_OK);
    assert_non_null(c);
    return c;
}

static bool get_str(struct cache *c, const char *key, char **v)
{
    size_t n = 0;
    bool hit = cache_get(c, key, strlen(key), v, &n);
    if (hit)
        assert_int_equal(n, strlen(*v));
    return hit;
}

static void put_str(struct cache *c, const char *key, const char *value)
{
    assert_int_equal(cache_put(c, key, strlen(key), value, strlen(value)), AR_OK);
}

static void siphash_matches_reference_vector(void **state)
{
    unsigned char msg[15];
    (void)state;
    for (int i = 0; i < 15; i++)
        msg[i] = (unsigned char)i;
    /* key 00 01 .. 0f, message 00 01 .. 0e (the SipHash paper, appendix A) */
    assert_true(siphash24(0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull, msg, 15) ==
                0xa129ca6149be45e5ull);
}

static void get_returns_a_copy_of_what_put_stored(void **state)
{
    struct cache *c = make_cache(1 << 20, 0, 4, NULL);
    struct cache_stats s;
    static const char value[] = {'o', 'k', '\0', 'x'}; /* a NUL inside */
    char *v = NULL;
    size_t n = 0;
    (void)state;
    assert_string_equal(c->ops->name, "memory");
    assert_false(get_str(c, "k1", &v));
    assert_null(v);
    put_str(c, "k1", "感谢您的好评！");
    assert_true(get_str(c, "k1", &v));
    assert_string_equal(v, "感谢您的好评！");
    v[0] = 'X'; /* the caller's copy, not the cache's */
    ar_free(v);
    assert_true(get_str(c, "k1", &v));
    assert_string_equal(v, "感谢您的好评！");
    ar_free(v);

    assert_int_equal(cache_put(c, "bin", 3, value, sizeof(value)), AR_OK);
    assert_true(cache_get(c, "bin", 3, &v, &n));
    assert_int_equal(n, sizeof(value));
    assert_memory_equal(v, value, sizeof(value));
    assert_int_equal(v[n], '\0');
    ar_free(v);
    assert_true(cache_get(c, "bin", 3, NULL, NULL)); /* presence only */
    assert_false(cache_get(c, "bi", 2, NULL, NULL)); /* prefixes are other keys */

    put_str(c, "k1", "replaced");
    assert_true(get_str(c, "k1", &v));
    assert_string_equal(v, "replaced");
    ar_free(v);

    cache_stats(c, &s);
    assert_int_equal(s.hits, 5);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.expired, 0);
    assert_int_equal(s.n_entries, 2);
    assert_int_equal(s.n_bytes, cache_entry_size(2, 8) + cache_entry_size(3, sizeof(value)));
    cache_destroy(c);
}

static void entries_expire_after_ttl_on_the_injected_clock(void **state)
{
    struct fake_clock clk = {1000.0};
    struct cache *c = make_cache(1 << 20, 10.0, 2, &clk);
    struct cache_stats s;
    char *v;
    (void)state;
    put_str(c, "a", "A");
    put_str(c, "b", "B");
    clk.now = 1009.5;
    assert_true(get_str(c, "a", &v));
    ar_free(v);
    put_str(c, "b", "B2"); /* a new put restarts the TTL */
    clk.now = 1010.0;
    assert_false(get_str(c, "a", &v)); /* expiry is absolute: touching does not extend it */
    assert_true(get_str(c, "b", &v));
    assert_string_equal(v, "B2");
    ar_free(v);
    clk.now = 1019.4;
    assert_true(get_str(c, "b", &v));
    ar_free(v);
    clk.now = 1019.5;
    assert_false(get_str(c, "b", &v));
    assert_false(get_str(c, "b", &v)); /* gone, so no second expiry */
    cache_stats(c, &s);
    assert_int_equal(s.expired, 2);
    assert_int_equal(s.hits, 3);
    assert_int_equal(s.misses, 3);
    assert_int_equal(s.n_entries, 0);
    assert_int_equal(s.n_bytes, 0);
    cache_destroy(c);

    /* ttl 0: never expires */
    c = make_cache(1 << 20, 0, 1, &clk);
    put_str(c, "a", "A");
    clk.now += 1e9;
    assert_true(get_str(c, "a", &v));
    ar_free(v);
    cache_destroy(c);
}

static void least_recently_used_goes_first_under_the_byte_budget(void **state)
{
    size_t e = cache_entry_size(1, 10);
    struct cache *c = make_cache(3 * e, 0, 1, NULL);
    struct cache_stats s;
    char *v;
    (void)state;
    put_str(c, "a", "0123456789");
    put_str(c, "b", "0123456789");
    put_str(c, "c", "0123456789");
    assert_true(get_str(c, "a", &v)); /* a is now the most recent: b is the oldest */
    ar_free(v);
    put_str(c, "d", "0123456789");
    assert_false(get_str(c, "b", &v));
    assert_true(get_str(c, "c", &v)); /* order now: c, d, a (oldest) */
    ar_free(v);
    assert_true(get_str(c, "d", &v)); /* order now: d, c, a */
    ar_free(v);
    put_str(c, "f", "0123456789"); /* a goes */
    assert_false(get_str(c, "a", &v));
    assert_true(cache_get(c, "c", 1, NULL, NULL));
    cache_stats(c, &s);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.n_entries, 3);
    assert_int_equal(s.n_bytes, 3 * e);
    cache_destroy(c);

    c = make_cache(3 * e, 0, 1, NULL);
    char big[256];
    memset(big, 'z', sizeof(big));
    put_str(c, "a", "0123456789");
    put_str(c, "b", "0123456789");
    put_str(c, "c", "0123456789");
    /* an entry of 2e bytes: value length 2e - overhead(1, 0) */
    size_t big_len = 2 * e - cache_entry_size(1, 0);
    assert_true(big_len <= sizeof(big));
    assert_int_equal(cache_put(c, "e", 1, big, big_len), AR_OK);
    assert_false(cache_get(c, "a", 1, NULL, NULL));
    assert_false(cache_get(c, "b", 1, NULL, NULL));
    assert_true(cache_get(c, "c", 1, NULL, NULL));
    assert_true(cache_get(c, "e", 1, NULL, NULL));
    cache_stats(c, &s);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.n_entries, 2);
    assert_int_equal(s.n_bytes, 3 * e);
    cache_destroy(c);
}

/* ---- reference model ---------------------------------------------------------------- */

#define REF_KEYS 24

struct ref_model {
    bool present[REF_KEYS];
    size_t len[REF_KEYS];
    char val[REF_KEYS];
    uint64_t used[REF_KEYS];
    uint64_t tick;
    size_t bytes, budget;
};

static void ref_put(struct ref_model *m, int k, size_t len, char val)
{
    if (m->present[k])
        m->bytes -= cache_entry_size(2, m->len[k]);
    m->present[k] = true;
    m->len[k] = len;
    m->val[k] = val;
    m->used[k] = ++m->tick;
    m->bytes += cache_entry_size(2, len);
    while (m->bytes > m->budget) {
        int oldest = -1;
        for (int i = 0; i < REF_KEYS; i++)
            if (m->present[i] && (oldest < 0 || m->used[i] < m->used[oldest]))
                oldest = i;
        m->present[oldest] = false;
        m->bytes -= cache_entry_size(2, m->len[oldest]);
    }
}

static void lru_matches_a_reference_model_on_random_operations(void **state)
{
    struct ref_model m = {0};
    struct th_rng r = {777};
    struct cache *c;
    struct cache_stats s;
    char buf[200];
    (void)state;
    m.budget = 8 * cache_entry_size(2, 60);
    c = make_cache(m.budget, 0, 1, NULL);
    for (int iter = 0; iter < 20000; iter++) {
        int k = (int)(th_rng_u64(&r) % REF_KEYS);
        char key[3] = {'k', (char)('a' + k), 0};
        if (th_rng_u64(&r) % 2) {
            size_t len = th_rng_u64(&r) % 120;
            char val = (char)('A' + th_rng_u64(&r) % 26);
            memset(buf, val, len);
            assert_int_equal(cache_put(c, key, 2, buf, len), AR_OK);
            ref_put(&m, k, len, val);
        } else {
            char *v = NULL;
            size_t n = 0;
            bool hit = cache_get(c, key, 2, &v, &n);
            assert_int_equal(hit, m.present[k]);
            if (hit) {
                assert_int_equal(n, m.len[k]);
                for (size_t i = 0; i < n; i++)
                    assert_int_equal(v[i], m.val[k]);
                m.used[k] = ++m.tick;
            }
            ar_free(v);
        }
    }
    cache_stats(c, &s);
    assert_int_equal(s.n_bytes, m.bytes);
    assert_true(s.n_bytes <= m.budget);
    cache_destroy(c);
}

static void keys_of_one_shop_are_never_returned_for_another(void **state)
{
    struct cache *c = make_cache(1 << 20, 0, 16, NULL);
    static const char *const texts[] = {"质量很好！！", "Great quality!!", "物流太慢了", "还行吧。",
                                        "👍👍👍"};
    char *ka, *kb, *v;
    size_t na, nb;
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(texts); i++) {
        assert_int_equal(
            reply_normalize_key("shop-A", 5, NULL, texts[i], strlen(texts[i]), &ka, &na), AR_OK);
        assert_int_equal(cache_put(c, ka, na, "reply for A", 11), AR_OK);
        ar_free(ka);
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(texts); i++) {
        assert_int_equal(
            reply_normalize_key("shop-B", 5, NULL, texts[i], strlen(texts[i]), &kb, &nb), AR_OK);
        assert_false(cache_get(c, kb, nb, &v, NULL));
        /* the same review in shop A, written differently, is a hit */
        assert_int_equal(
            reply_normalize_key("shop-A", 4, NULL, texts[i], strlen(texts[i]), &ka, &na), AR_OK);
        assert_true(cache_get(c, ka, na, &v, NULL));
        assert_string_equal(v, "reply for A");
        ar_free(v);
        ar_free(ka);
        ar_free(kb);
    }
    cache_destroy(c);
}

static void value_larger_than_the_budget_is_not_stored(void **state)
{
    struct cache *c = make_cache(4096, 0, 1, NULL);
    struct cache_stats s;
    char *big = calloc(1, 8192);
    (void)state;
    assert_non_null(big);
    memset(big, 'x', 8191);
    put_str(c, "small", "kept");
    put_str(c, "k", "old value");
    assert_int_equal(cache_put(c, "k", 1, big, 8191), AR_ERANGE);
    assert_false(cache_get(c, "k", 1, NULL, NULL)); /* the stale value went too */
    assert_true(cache_get(c, "small", 5, NULL, NULL));
    cache_stats(c, &s);
    assert_int_equal(s.n_entries, 1);
    assert_int_equal(s.evictions, 0);
    cache_destroy(c);

    /* with 16 shards: larger than the whole budget */
    c = make_cache(4096, 0, 16, NULL);
    assert_int_equal(cache_put(c, "k", 1, big, 5000), AR_ERANGE);
    assert_false(cache_get(c, "k", 1, NULL, NULL));
    cache_stats(c, &s);
    assert_int_equal(s.n_entries, 0);
    assert_int_equal(s.n_bytes, 0);
    cache_destroy(c);
    free(big);
}

static void bad_arguments_are_rejected(void **state)
{
    struct cache_memory_params p = cache_memory_default_params();
    struct cache *c = (struct cache *)1;
    (void)state;
    p.max_bytes = 0;
    assert_int_equal(cache_memory_create(&p, &c), AR_EINVAL);
    assert_null(c);
    p = cache_memory_default_params();
    p.n_shards = 0;
    assert_int_equal(cache_memory_create(&p, &c), AR_EINVAL);
    p.n_shards = 257;
    assert_int_equal(cache_memory_create(&p, &c), AR_EINVAL);
    assert_int_equal(cache_memory_create(NULL, &c), AR_EINVAL);
    assert_int_equal(cache_memory_create(&p, NULL), AR_EINVAL);
    c = make_cache(1024, 0, 2, NULL);
    assert_int_equal(cache_put(c, "", 0, "v", 1), AR_EINVAL);
    assert_int_equal(cache_put(c, NULL, 3, "v", 1), AR_EINVAL);
    assert_int_equal(cache_put(c, "k", 1, NULL, 1), AR_EINVAL);
    assert_int_equal(cache_put(c, "k", 1, NULL, 0), AR_OK); /* empty value is fine */
    assert_true(cache_get(c, "k", 1, NULL, NULL));
    assert_false(cache_get(c, NULL, 3, NULL, NULL));
    assert_int_equal(cache_put(NULL, "k", 1, "v", 1), AR_EINVAL);
    assert_false(cache_get(NULL, "k", 1, NULL, NULL));
    cache_destroy(c);
    cache_destroy(NULL);
}

static void allocation_failures_are_errors_without_leaks(void **state)
{
    struct cache_memory_params p = cache_memory_default_params();
    struct cache *c = NULL;
    struct cache_stats s;
    char *v = (char *)1;
    uint64_t n_allocs;
    (void)state;
    p.n_shards = 4;
    /* count the allocations of a successful create (counting needs the hook armed, so
     * arm it far away), then fail each in turn */
    ar_alloc_fail_after(1000000);
    assert_int_equal(cache_memory_create(&p, &c), AR_OK);
    n_allocs = ar_alloc_fail_after(0);
    cache_destroy(c);
    assert_true(n_allocs >= 2);
    for (uint64_t i = 1; i <= n_allocs; i++) {
        c = (struct cache *)1;
        ar_alloc_fail_after(i);
        assert_int_equal(cache_memory_create(&p, &c), AR_ENOMEM);
        ar_alloc_fail_after(0);
        assert_null(c);
    }
    c = make_cache(1 << 16, 0, 1, NULL);
    ar_alloc_fail_after(1);
    assert_int_equal(cache_put(c, "k", 1, "v", 1), AR_ENOMEM);
    ar_alloc_fail_after(0);
    put_str(c, "k", "v");
    ar_alloc_fail_after(1);
    assert_false(cache_get(c, "k", 1, &v, NULL)); /* the copy failed: a miss */
    ar_alloc_fail_after(0);
    assert_null(v);
    cache_stats(c, &s);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.n_entries, 1);
    cache_destroy(c);
}

/* ---- another implementation behind the same ops ------------------------------------- */

struct fake_cache {
    struct cache base;
    int n_get, n_put, n_stats;
};

static int fake_get(struct cache *c, const char *key, size_t key_len, unsigned flags,
                    char **value_out, size_t *value_len)
{
    (void)key, (void)key_len, (void)flags;
    ((struct fake_cache *)c)->n_get++;
    *value_out = ar_strdup("from fake");
    *value_len = 9;
    return 3; /* any level: passed through as is */
}

static enum ar_status fake_put(struct cache *c, const char *key, size_t key_len, const char *value,
                               size_t value_len)
{
    (void)key, (void)key_len, (void)value, (void)value_len;
    ((struct fake_cache *)c)->n_put++;
    return AR_EBUSY;
}

static void fake_stats(struct cache *c, struct cache_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->hits = (uint64_t)((struct fake_cache *)c)->n_get;
    ((struct fake_cache *)c)->n_stats++;
}

static bool fake_healthy(struct cache *c)
{
    (void)c;
    return false;
}

static void fake_destroy(struct cache *c)
{
    ((struct fake_cache *)c)->n_get = -1;
}

static void calls_dispatch_through_the_ops_table(void **state)
{
    static const struct cache_ops ops = {"fake",       fake_get,     fake_put, fake_stats,
                                         fake_healthy, fake_destroy, NULL,     NULL};
    struct fake_cache f = {{&ops}, 0, 0, 0};
    struct cache_stats s;
    char *v;
    size_t n;
    (void)state;
    assert_int_equal(cache_get(&f.base, "k", 1, &v, &n), 3);
    assert_string_equal(v, "from fake");
    ar_free(v);
    assert_int_equal(cache_put(&f.base, "k", 1, "v", 1), AR_EBUSY);
    cache_stats(&f.base, &s);
    assert_int_equal(s.hits, 1);
    assert_int_equal(f.n_put, 1);
    assert_int_equal(f.n_stats, 1);
    assert_false(cache_redis_healthy(&f.base));
    cache_destroy(&f.base);
    assert_int_equal(f.n_get, -1);
    /* the in-process cache has no server to lose, nor has no cache at all */
    {
        struct cache *c = make_cache(1 << 16, 0, 1, NULL);
        assert_true(cache_redis_healthy(c));
        assert_true(cache_redis_healthy(NULL));
        cache_destroy(c);
    }
}

/* ---- two levels (tiered.c) over two in-process caches ----------------------------------- */

static void tiered_get_tries_l1_then_l2_and_copies_l2_hits_into_l1(void **state)
{
    struct cache *l1 = make_cache(1 << 20, 0, 4, NULL), *l2 = make_cache(1 << 20, 0, 4, NULL);
    struct cache *t = NULL;
    struct cache_stats s;
    char *v = NULL;
    size_t n = 0;
    (void)state;
    assert_int_equal(cache_tiered_create(l1, l2, &t), AR_OK);
    assert_string_equal(t->ops->name, "tiered");
    /* another instance put it: only L2 has it */
    put_str(l2, "k", "from another instance");
    assert_false(cache_get(l1, "k", 1, NULL, NULL));
    assert_int_equal(cache_get(t, "k", 1, &v, &n), 2);
    assert_string_equal(v, "from another instance");
    assert_int_equal(n, strlen(v));
    ar_free(v);
    /* now copied into L1: the next get stays in process */
    assert_int_equal(cache_get(l1, "k", 1, NULL, NULL), 1);
    assert_int_equal(cache_get(t, "k", 1, &v, NULL), 1);
    assert_string_equal(v, "from another instance");
    ar_free(v);
    assert_int_equal(cache_get(t, "nope", 4, &v, &n), 0);
    assert_null(v);
    assert_int_equal(n, 0);
    /* a put reaches both levels */
    assert_int_equal(cache_put(t, "p", 1, "both", 4), AR_OK);
    assert_int_equal(cache_get(l1, "p", 1, NULL, NULL), 1);
    assert_int_equal(cache_get(l2, "p", 1, NULL, NULL), 1);
    cache_stats(t, &s);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.l2_hits, 1);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.errors, 0);
    assert_int_equal(s.n_entries, 2); /* L1's: k and p */
    assert_true(cache_redis_healthy(t));
    cache_destroy(t); /* and both levels (ASan: nothing leaks) */
}

static void tiered_put_reports_the_first_level_that_failed(void **state)
{
    /* L1 holds entries up to ~600 bytes, L2 much more */
    size_t e = cache_entry_size(1, 600);
    struct cache *l1 = make_cache(e, 0, 1, NULL), *l2 = make_cache(1 << 20, 0, 4, NULL);
    struct cache *t = NULL;
    char big[2000];
    (void)state;
    memset(big, 'b', sizeof(big));
    assert_int_equal(cache_tiered_create(l1, l2, &t), AR_OK);
    assert_int_equal(cache_put(t, "k", 1, big, sizeof(big)), AR_ERANGE);
    /* L2 still took it: every get is an L2 hit that L1 cannot keep */
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 2);
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 2);
    assert_false(cache_get(l1, "k", 1, NULL, NULL));
    cache_destroy(t);
}

/* A read-only get (what bulk work does in the interactive cache) answers like a get but
 * leaves the LRU order as it was, so it cannot keep an entry alive that interactive traffic
 * has stopped using; an expired entry is still a miss, and dropped. */
static void read_only_gets_do_not_promote_and_still_expire(void **state)
{
    size_t e = cache_entry_size(1, 10);
    struct fake_clock clk = {1000.0};
    struct cache *c = make_cache(3 * e, 60, 1, &clk);
    struct cache_stats s;
    char *v = NULL;
    size_t n = 0;
    (void)state;
    put_str(c, "a", "0123456789");
    put_str(c, "b", "0123456789");
    put_str(c, "c", "0123456789");
    /* a hit with its value, but a stays the oldest */
    assert_int_equal(cache_get_flags(c, "a", 1, CACHE_GET_READ_ONLY, &v, &n), 1);
    assert_string_equal(v, "0123456789");
    assert_int_equal(n, 10);
    ar_free(v);
    put_str(c, "d", "0123456789"); /* evicts the least recently used: a, not b */
    assert_false(cache_get(c, "a", 1, NULL, NULL));
    assert_true(cache_get(c, "b", 1, NULL, NULL));
    /* the control: the same steps with a plain get keep the entry read */
    put_str(c, "a", "0123456789");                 /* evicts c: order a, b, d */
    assert_true(cache_get(c, "d", 1, NULL, NULL)); /* d, a, b */
    assert_true(cache_get(c, "b", 1, NULL, NULL)); /* b, d, a */
    assert_true(cache_get(c, "a", 1, NULL, NULL)); /* a, b, d */
    put_str(c, "e", "0123456789");                 /* evicts d, the oldest */
    assert_true(cache_get(c, "a", 1, NULL, NULL));
    assert_false(cache_get(c, "d", 1, NULL, NULL));
    /* past the TTL a read-only get is a miss that drops the entry */
    clk.now += 61;
    cache_stats(c, &s);
    assert_int_equal(s.n_entries, 3);
    assert_false(cache_get_flags(c, "a", 1, CACHE_GET_READ_ONLY, NULL, NULL));
    cache_stats(c, &s);
    assert_int_equal(s.expired, 1);
    assert_int_equal(s.n_entries, 2);
    cache_destroy(c);
}

/* A read-only get through a tiered cache finds an L2 entry without copying it into L1. */
static void tiered_read_only_get_does_not_fill_l1(void **state)
{
    struct cache *l1 = make_cache(1 << 16, 0, 1, NULL), *l2 = make_cache(1 << 16, 0, 1, NULL);
    struct cache *t = NULL;
    struct cache_stats s;
    char *v = NULL;
    (void)state;
    assert_int_equal(cache_tiered_create(l1, l2, &t), AR_OK);
    put_str(l2, "k", "from l2");
    assert_int_equal(cache_get_flags(t, "k", 1, CACHE_GET_READ_ONLY, &v, NULL), 2);
    assert_string_equal(v, "from l2");
    ar_free(v);
    cache_stats(l1, &s);
    assert_int_equal(s.n_entries, 0);
    /* a plain get copies it, so the next one is answered in process */
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 2);
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 1);
    cache_destroy(t);
}

/* A copy of an L2 hit in L1 expires when the L2 entry does, not a whole L1 TTL after the copy:
 * a TTL counts from the reply's first put. */
static void tiered_copy_expires_with_the_l2_entry(void **state)
{
    struct fake_clock clk = {1000.0};
    struct cache *l1 = make_cache(1 << 16, 3600, 1, &clk), *l2 = make_cache(1 << 16, 10, 1, &clk);
    struct cache *t = NULL;
    struct cache_stats s;
    (void)state;
    assert_int_equal(cache_tiered_create(l1, l2, &t), AR_OK);
    put_str(l2, "k", "v"); /* put by another instance at t = 1000, lives until 1010 */
    clk.now = 1008;
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 2); /* copied with 2 s left */
    clk.now = 1009;
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 1);
    clk.now = 1010.5; /* past the first put's TTL: gone from both levels */
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 0);
    cache_stats(l1, &s);
    assert_int_equal(s.expired, 1);
    cache_destroy(t);
    /* an L2 entry without a TTL gets L1's own */
    l1 = make_cache(1 << 16, 100, 1, &clk);
    l2 = make_cache(1 << 16, 0, 1, &clk);
    assert_int_equal(cache_tiered_create(l1, l2, &t), AR_OK);
    put_str(l2, "k", "v");
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 2);
    clk.now += 99;
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 1);
    clk.now += 2;
    assert_int_equal(cache_get(l1, "k", 1, NULL, NULL), 0);
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 2); /* L2 keeps it */
    cache_destroy(t);
}

/* Class names round-trip, and the Redis prefixes of the classes differ in a way no key can
 * bridge (neither is a prefix of the other). */
static void cache_classes_have_names_and_distinct_redis_prefixes(void **state)
{
    enum cache_class cls = CACHE_CLASS_BULK;
    const char *pi = cache_class_redis_prefix(CACHE_CLASS_INTERACTIVE);
    const char *pb = cache_class_redis_prefix(CACHE_CLASS_BULK);
    (void)state;
    for (int c = 0; c < CACHE_N_CLASSES; c++) {
        const char *name = cache_class_str((enum cache_class)c);
        assert_true(cache_class_parse(name, strlen(name), &cls));
        assert_int_equal((int)cls, c);
    }
    assert_string_equal(cache_class_str(CACHE_CLASS_INTERACTIVE), "interactive");
    assert_string_equal(cache_class_str(CACHE_CLASS_BULK), "bulk");
    assert_false(cache_class_parse("bul", 3, &cls));
    assert_false(cache_class_parse("bulky", 5, &cls));
    assert_false(cache_class_parse("", 0, &cls));
    assert_false(cache_class_parse(NULL, 0, &cls));
    assert_int_equal(strlen(pi), strlen(pb));
    assert_true(strcmp(pi, pb) != 0);
}

static void tiered_create_takes_its_levels_even_when_it_fails(void **state)
{
    struct cache *t = (struct cache *)1;
    (void)state;
    /* on failure the levels are destroyed too: ASan reports a leak otherwise */
    assert_int_equal(cache_tiered_create(make_cache(1 << 16, 0, 1, NULL), NULL, &t), AR_EINVAL);
    assert_null(t);
    assert_int_equal(cache_tiered_create(NULL, make_cache(1 << 16, 0, 1, NULL), &t), AR_EINVAL);
    {
        struct cache *c = make_cache(1 << 16, 0, 1, NULL);
        assert_int_equal(cache_tiered_create(c, c, &t), AR_EINVAL); /* one level twice */
    }
    {
        struct cache *a = make_cache(1 << 16, 0, 1, NULL), *b = make_cache(1 << 16, 0, 1, NULL);
        ar_alloc_fail_after(1); /* the tiered handle itself */
        assert_int_equal(cache_tiered_create(a, b, &t), AR_ENOMEM);
        ar_alloc_fail_after(0);
        assert_null(t);
    }
}

static void tiered_is_unhealthy_when_a_level_is(void **state)
{
    static const struct cache_ops ops = {"fake",       fake_get,     fake_put, fake_stats,
                                         fake_healthy, fake_destroy, NULL,     NULL};
    struct fake_cache f = {{&ops}, 0, 0, 0};
    struct cache *t = NULL;
    (void)state;
    assert_int_equal(cache_tiered_create(make_cache(1 << 16, 0, 1, NULL), &f.base, &t), AR_OK);
    assert_false(cache_redis_healthy(t));
    cache_destroy(t);
    assert_int_equal(f.n_get, -1); /* the fake level was destroyed with it */
}

/* ---- threads ------------------------------------------------------------------------ */

#define N_THREADS 4
#define N_OPS 20000
#define N_KEYS 300

struct worker {
    struct cache *c;
    uint64_t seed;
    uint64_t n_gets, n_hits, n_bad;
};

/* A value tells which key it belongs to, so a hit can be checked. */
static size_t make_value(char *buf, size_t size, int k, uint64_t salt)
{
    int n = snprintf(buf, size, "reply-%d-%llu-", k, (unsigned long long)salt);
    size_t len = (size_t)n + (size_t)(salt % 50);
    memset(buf + n, 'p', len - (size_t)n);
    return len;
}

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    struct th_rng r = {w->seed};
    char key[32], val[128], prefix[32];
    for (int i = 0; i < N_OPS; i++) {
        int k = (int)(th_rng_u64(&r) % N_KEYS);
        int kl = snprintf(key, sizeof(key), "shop\x1fpos\x1fzh\x1fkey-%d", k);
        if (th_rng_u64(&r) % 3 == 0) {
            size_t vl = make_value(val, sizeof(val), k, th_rng_u64(&r) % 1000);
            if (cache_put(w->c, key, (size_t)kl, val, vl) != AR_OK)
                w->n_bad++;
        } else {
            char *v = NULL;
            size_t n = 0;
            w->n_gets++;
            if (cache_get(w->c, key, (size_t)kl, &v, &n)) {
                int pl = snprintf(prefix, sizeof(prefix), "reply-%d-", k);
                w->n_hits++;
                if (n < (size_t)pl || memcmp(v, prefix, (size_t)pl) != 0 || strlen(v) != n)
                    w->n_bad++;
                ar_free(v);
            }
        }
    }
    return NULL;
}

static void four_threads_share_the_cache_consistently(void **state)
{
    /* small enough that evictions happen all the time */
    size_t budget = 60 * cache_entry_size(24, 80);
    struct cache *c = make_cache(budget, 0, 4, NULL);
    struct worker w[N_THREADS];
    pthread_t th[N_THREADS];
    struct cache_stats s;
    uint64_t gets = 0, hits = 0;
    (void)state;
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (struct worker){c, 1000 + (uint64_t)i, 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].n_bad, 0);
        gets += w[i].n_gets;
        hits += w[i].n_hits;
    }
    cache_stats(c, &s);
    assert_int_equal(s.hits, hits);
    assert_int_equal(s.misses, gets - hits);
    assert_true(s.evictions > 0);
    assert_true(hits > 0);
    assert_true(s.n_bytes <= budget);
    assert_true(s.n_entries <= N_KEYS);
    cache_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(siphash_matches_reference_vector),
        cmocka_unit_test(get_returns_a_copy_of_what_put_stored),
        cmocka_unit_test(entries_expire_after_ttl_on_the_injected_clock),
        cmocka_unit_test(least_recently_used_goes_first_under_the_byte_budget),
        cmocka_unit_test(lru_matches_a_reference_model_on_random_operations),
        cmocka_unit_test(keys_of_one_shop_are_never_returned_for_another),
        cmocka_unit_test(value_larger_than_the_budget_is_not_stored),
        cmocka_unit_test(bad_arguments_are_rejected),
        cmocka_unit_test(allocation_failures_are_errors_without_leaks),
        cmocka_unit_test(calls_dispatch_through_the_ops_table),
        cmocka_unit_test(tiered_get_tries_l1_then_l2_and_copies_l2_hits_into_l1),
        cmocka_unit_test(tiered_put_reports_the_first_level_that_failed),
        cmocka_unit_test(tiered_create_takes_its_levels_even_when_it_fails),
        cmocka_unit_test(read_only_gets_do_not_promote_and_still_expire),
        cmocka_unit_test(tiered_read_only_get_does_not_fill_l1),
        cmocka_unit_test(tiered_copy_expires_with_the_l2_entry),
        cmocka_unit_test(cache_classes_have_names_and_distinct_redis_prefixes),
        cmocka_unit_test(tiered_is_unhealthy_when_a_level_is),
        cmocka_unit_test(four_threads_share_the_cache_consistently),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
