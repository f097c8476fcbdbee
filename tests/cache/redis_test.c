/* redis_test.c - the Redis reply cache (redis.c, redis_pool.c) and the tiered cache over it,
 * against real Redis servers: the shared one of tests/run.sh (AR_TEST_REDIS_URL, required)
 * for values, TTLs, prefixes and two instances sharing L2; private ones (deploy/services.sh)
 * that the tests stop and restart to watch the breaker, the backoff and the recovery; and a
 * socket that accepts and never answers, for the command timeout. What the cache stored is
 * checked with a connection of the test's own. */
#include "harness/harness.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "harness/private_services.h"

/* A unique key prefix per test and run, so runs never see each other's keys. */
static const char *prefix(const char *name)
{
    static char buf[128];
    snprintf(buf, sizeof(buf), "test:%d:%s:", (int)getpid(), name);
    return buf;
}

static struct cache *make_redis(const char *url, const char *key_prefix, double ttl_s)
{
    struct cache_redis_params p = cache_redis_default_params();
    struct ar_err err = {AR_OK, 0, {0}};
    struct cache *c = NULL;
    p.url = url;
    p.key_prefix = key_prefix;
    p.ttl_s = ttl_s;
    if (cache_redis_create(&p, &c, &err) != AR_OK)
        fail_msg("cache_redis_create(%s): %s", url, err.msg);
    assert_non_null(c);
    assert_string_equal(c->ops->name, "redis");
    return c;
}

/* ---- URLs --------------------------------------------------------------------------------- */

static void urls_are_parsed_and_bad_ones_rejected_with_a_reason(void **state)
{
    static const char *const bad[] = {
        NULL,
        "",
        "http://127.0.0.1:6379/0",
        "redis:/127.0.0.1",
        "redis://",
        "redis://:6379/0",
        "redis://host:0/0",
        "redis://host:65536/0",
        "redis://host:63x9/0",
        "redis://host:/0",
        "redis://host:6379/x",
        "redis://host:6379/-1",
        "redis://host:6379/0?timeout=1",
        "redis://host:6379/0/1",
        "redis://host 1:6379/0",
        "redis://user@host:6379/0",
        "redis://user:@host:6379/0",
        "redis://[::1:6379/0",
        "redis://[::1]x:6379/0",
    };
    struct cache_redis_url u;
    struct ar_err err;
    (void)state;
    assert_int_equal(cache_redis_url_parse("redis://127.0.0.1:34567/3", &u, NULL), AR_OK);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 34567);
    assert_int_equal(u.db, 3);
    assert_string_equal(u.password, "");
    assert_int_equal(cache_redis_url_parse("redis://cache.local", &u, NULL), AR_OK);
    assert_string_equal(u.host, "cache.local");
    assert_int_equal(u.port, 6379);
    assert_int_equal(u.db, 0);
    assert_int_equal(cache_redis_url_parse("redis://h:1/", &u, NULL), AR_OK);
    assert_int_equal(u.port, 1);
    assert_int_equal(cache_redis_url_parse("redis://:s3cr@t@h:2/15", &u, NULL), AR_OK);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "s3cr@t");
    assert_string_equal(u.host, "h");
    assert_int_equal(u.db, 15);
    assert_int_equal(cache_redis_url_parse("redis://app:pw@[::1]:7000/1", &u, NULL), AR_OK);
    assert_string_equal(u.user, "app");
    assert_string_equal(u.password, "pw");
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 7000);
    for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
        memset(&err, 0, sizeof(err));
        if (cache_redis_url_parse(bad[i], &u, &err) != AR_EINVAL)
            fail_msg("accepted bad URL '%s'", bad[i] ? bad[i] : "(null)");
        assert_int_equal(err.code, AR_EINVAL);
        assert_true(strlen(err.msg) > 10);
        assert_non_null(strstr(err.msg, "Redis"));
    }
}

static void bad_parameters_are_rejected_and_nothing_is_created(void **state)
{
    struct cache_redis_params p = cache_redis_default_params();
    struct ar_err err = {AR_OK, 0, {0}};
    struct cache *c = (struct cache *)1;
    (void)state;
    p.url = "redis://127.0.0.1:6379/zero";
    assert_int_equal(cache_redis_create(&p, &c, &err), AR_EINVAL);
    assert_null(c);
    assert_non_null(strstr(err.msg, "database"));
    p.url = th_env_url("AR_TEST_REDIS_URL");
    p.pool_size = 0;
    assert_int_equal(cache_redis_create(&p, &c, &err), AR_EINVAL);
    p = cache_redis_default_params();
    p.url = th_env_url("AR_TEST_REDIS_URL");
    p.ttl_s = (double)NAN;
    assert_int_equal(cache_redis_create(&p, &c, &err), AR_EINVAL);
    p.ttl_s = 10;
    p.backoff_min_ms = 200;
    p.backoff_max_ms = 100;
    assert_int_equal(cache_redis_create(&p, &c, &err), AR_EINVAL);
    assert_int_equal(cache_redis_create(NULL, &c, &err), AR_EINVAL);
    assert_null(c);
}

/* ---- values, TTL, prefixes ---------------------------------------------------------------- */

static void get_returns_what_put_stored_byte_for_byte(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    const char *pre = prefix("values");
    struct cache *c = make_redis(url, pre, 60);
    static const char bin[] = {'a', '\0', 'b', '\xff', '\r', '\n', '\0'};
    struct cache_stats s;
    redisContext *rc = th_redis_direct(url);
    redisReply *r;
    char *v = NULL;
    size_t n = 99;
    (void)state;
    assert_true(cache_redis_healthy(c));
    assert_int_equal(cache_get(c, "missing", 7, &v, &n), 0);
    assert_null(v);
    assert_int_equal(n, 0);
    assert_int_equal(cache_put(c, "bin", 3, bin, sizeof(bin)), AR_OK);
    assert_int_equal(cache_get(c, "bin", 3, &v, &n), 2);
    assert_int_equal(n, sizeof(bin));
    assert_memory_equal(v, bin, sizeof(bin));
    assert_int_equal(v[n], '\0'); /* NUL-terminated past the value */
    ar_free(v);
    assert_int_equal(
        cache_put(c, "感谢", strlen("感谢"), "谢谢您的好评！", strlen("谢谢您的好评！")), AR_OK);
    assert_int_equal(cache_get(c, "感谢", strlen("感谢"), &v, NULL), 2);
    assert_string_equal(v, "谢谢您的好评！");
    ar_free(v);
    assert_int_equal(cache_put(c, "empty", 5, NULL, 0), AR_OK); /* an empty value is a value */
    assert_int_equal(cache_get(c, "empty", 5, &v, &n), 2);
    assert_int_equal(n, 0);
    ar_free(v);
    assert_int_equal(cache_get(c, "bin", 3, NULL, NULL), 2);   /* presence only */
    assert_int_equal(cache_put(c, "bin", 3, "new", 3), AR_OK); /* replaces */
    /* what Redis holds, seen from outside: the prefixed key, the bytes, a TTL of 60 s */
    {
        char key[200];
        snprintf(key, sizeof(key), "%sbin", pre);
        r = redisCommand(rc, "GET %s", key);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        assert_int_equal(r->len, 3);
        assert_memory_equal(r->str, "new", 3);
        freeReplyObject(r);
        r = redisCommand(rc, "PTTL %s", key);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        assert_true(r->integer > 55000 && r->integer <= 60000);
        freeReplyObject(r);
        snprintf(key, sizeof(key), "%sempty", pre);
        r = redisCommand(rc, "STRLEN %s", key);
        assert_int_equal(r->integer, 0);
        freeReplyObject(r);
        r = redisCommand(rc, "EXISTS bin");
        assert_int_equal(r->integer, 0); /* never without the prefix */
        freeReplyObject(r);
    }
    /* bad arguments */
    assert_int_equal(cache_put(c, "", 0, "v", 1), AR_EINVAL);
    assert_int_equal(cache_put(c, NULL, 1, "v", 1), AR_EINVAL);
    assert_int_equal(cache_put(c, "k", 1, NULL, 1), AR_EINVAL);
    assert_int_equal(cache_get(c, NULL, 1, &v, NULL), 0);
    cache_stats(c, &s);
    assert_int_equal(s.hits, 4);
    assert_int_equal(s.misses, 1); /* the bad get is not a lookup */
    assert_int_equal(s.errors, 0);
    assert_int_equal(s.l2_hits, 0);
    redisFree(rc);
    cache_destroy(c);
}

static void entries_expire_after_their_ttl(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    const char *pre = prefix("ttl");
    struct cache *c = make_redis(url, pre, 0.3);
    struct cache *forever = make_redis(url, pre, 0);
    redisContext *rc = th_redis_direct(url);
    redisReply *r;
    char key[200];
    double t0;
    (void)state;
    t0 = ar_time_s();
    assert_int_equal(cache_put(c, "short", 5, "v", 1), AR_OK);
    assert_int_equal(cache_put(forever, "long", 4, "v", 1), AR_OK);
    snprintf(key, sizeof(key), "%sshort", pre);
    r = redisCommand(rc, "PTTL %s", key);
    assert_true(r->integer > 0 && r->integer <= 300);
    freeReplyObject(r);
    snprintf(key, sizeof(key), "%slong", pre);
    r = redisCommand(rc, "PTTL %s", key);
    assert_int_equal(r->integer, -1); /* no TTL */
    freeReplyObject(r);
    if (ar_time_s() - t0 < 0.25) /* else the machine is too slow to see it alive */
        assert_int_equal(cache_get(c, "short", 5, NULL, NULL), 2);
    th_sleep_s(0.45);
    assert_int_equal(cache_get(c, "short", 5, NULL, NULL), 0);
    assert_int_equal(cache_get(c, "long", 4, NULL, NULL), 2);
    r = redisCommand(rc, "DEL %s", key);
    freeReplyObject(r);
    redisFree(rc);
    cache_destroy(c);
    cache_destroy(forever);
}

static void caches_with_other_prefixes_do_not_see_each_other(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    char pa[160], pb[160];
    struct cache *a, *b;
    (void)state;
    snprintf(pa, sizeof(pa), "%sA:", prefix("prefixes"));
    snprintf(pb, sizeof(pb), "%sB:", prefix("prefixes"));
    a = make_redis(url, pa, 60);
    b = make_redis(url, pb, 60);
    assert_int_equal(cache_put(a, "k", 1, "from a", 6), AR_OK);
    assert_int_equal(cache_get(b, "k", 1, NULL, NULL), 0);
    assert_int_equal(cache_get(a, "k", 1, NULL, NULL), 2);
    cache_destroy(a);
    cache_destroy(b);
}

/* ---- two instances: memory L1s over one Redis L2 ------------------------------------------ */

static struct cache *make_instance(const char *url, const char *pre)
{
    struct cache_memory_params mp = cache_memory_default_params();
    struct cache *l1 = NULL, *t = NULL;
    mp.max_bytes = 1 << 20;
    assert_int_equal(cache_memory_create(&mp, &l1), AR_OK);
    assert_int_equal(cache_tiered_create(l1, make_redis(url, pre, 60), &t), AR_OK);
    return t;
}

static void a_reply_put_by_one_instance_is_an_l2_then_l1_hit_on_another(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    const char *pre = prefix("instances");
    struct cache *a = make_instance(url, pre), *b = make_instance(url, pre);
    struct cache_stats s;
    char *v = NULL;
    (void)state;
    assert_int_equal(cache_get(b, "review", 6, NULL, NULL), 0);
    assert_int_equal(cache_put(a, "review", 6, "感谢您的好评！", strlen("感谢您的好评！")), AR_OK);
    assert_int_equal(cache_get(a, "review", 6, NULL, NULL), 1); /* a's own L1 */
    assert_int_equal(cache_get(b, "review", 6, &v, NULL), 2);   /* from Redis */
    assert_string_equal(v, "感谢您的好评！");
    ar_free(v);
    assert_int_equal(cache_get(b, "review", 6, &v, NULL), 1); /* now in b's L1 */
    assert_string_equal(v, "感谢您的好评！");
    ar_free(v);
    cache_stats(b, &s);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.l2_hits, 1);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.errors, 0);
    assert_int_equal(s.n_entries, 1);
    assert_true(cache_redis_healthy(a) && cache_redis_healthy(b));
    cache_destroy(a);
    cache_destroy(b);
}

/* ---- cache_open --------------------------------------------------------------------------- */

static void cache_open_picks_the_implementation_by_url(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    struct cache_memory_params mp = cache_memory_default_params();
    struct ar_err err = {AR_OK, 0, {0}};
    struct cache *c = (struct cache *)1;
    redisContext *rc = th_redis_direct(url);
    redisReply *r;
    char key[64];
    (void)state;
    assert_int_equal(cache_open(NULL, NULL, &c, &err), AR_OK);
    assert_string_equal(c->ops->name, "memory");
    cache_destroy(c);
    assert_int_equal(cache_open("memory", &mp, &c, &err), AR_OK);
    assert_string_equal(c->ops->name, "memory");
    cache_destroy(c);
    assert_int_equal(cache_open("rediss://127.0.0.1:6379/0", NULL, &c, &err), AR_EINVAL);
    assert_null(c);
    assert_non_null(strstr(err.msg, "redis://host:port/db"));
    assert_int_equal(cache_open("redis://127.0.0.1:0/0", NULL, &c, &err), AR_EINVAL);
    assert_non_null(strstr(err.msg, "port"));
    /* Redis: a tiered cache whose Redis entries live as long as the in-process ones */
    mp.ttl_s = 5;
    assert_int_equal(cache_open(url, &mp, &c, &err), AR_OK);
    assert_string_equal(c->ops->name, "tiered");
    snprintf(key, sizeof(key), "open-%d", (int)getpid());
    assert_int_equal(cache_put(c, key, strlen(key), "v", 1), AR_OK);
    r = redisCommand(rc, "PTTL ar:rc:%s", key);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_true(r->integer > 4000 && r->integer <= 5000);
    freeReplyObject(r);
    freeReplyObject(redisCommand(rc, "DEL ar:rc:%s", key));
    assert_true(cache_redis_healthy(c));
    cache_destroy(c);
    /* no in-process level: Redis alone, whose hits are the shared level's; no cache at all
     * without Redis */
    mp.max_bytes = 0;
    assert_int_equal(cache_open(url, &mp, &c, &err), AR_OK);
    assert_string_equal(c->ops->name, "redis");
    assert_int_equal(cache_put(c, key, strlen(key), "v", 1), AR_OK);
    assert_int_equal(cache_get(c, key, strlen(key), NULL, NULL), 2);
    freeReplyObject(redisCommand(rc, "DEL ar:rc:%s", key));
    cache_destroy(c);
    c = (struct cache *)1;
    assert_int_equal(cache_open(NULL, &mp, &c, &err), AR_OK);
    assert_null(c);
    redisFree(rc);
}

/* ---- traffic classes ------------------------------------------------------------------------ */

static long long pttl(redisContext *rc, const char *prefix_, const char *key)
{
    redisReply *r = redisCommand(rc, "PTTL %s%s", prefix_, key);
    long long v;
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    v = r->integer;
    freeReplyObject(r);
    return v;
}

static struct cache *open_class(const char *url, enum cache_class cls, double ttl_s)
{
    struct cache_memory_params mp = cache_memory_default_params();
    struct ar_err err = {AR_OK, 0, {0}};
    struct cache *c = NULL;
    mp.max_bytes = 1 << 20;
    mp.ttl_s = ttl_s;
    if (cache_open_class(url, cls, &mp, &c, &err) != AR_OK)
        fail_msg("cache_open_class(%s): %s", cache_class_str(cls), err.msg);
    assert_string_equal(c->ops->name, "tiered");
    return c;
}

/* The interactive and bulk caches of a fleet share one Redis but not its keys: each class
 * writes under its own prefix with its own TTL (an expiry set by the SET itself), so the
 * same review key can hold a different entry per class and neither class reads the other's
 * through its own cache; another instance finds each in L2 under its class. */
static void classes_keep_their_own_keys_and_ttls_in_redis(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    const char *pi = cache_class_redis_prefix(CACHE_CLASS_INTERACTIVE);
    const char *pb = cache_class_redis_prefix(CACHE_CLASS_BULK);
    redisContext *rc = th_redis_direct(url);
    struct cache *ci = open_class(url, CACHE_CLASS_INTERACTIVE, 30);
    struct cache *cb = open_class(url, CACHE_CLASS_BULK, 5);
    struct cache *ci2, *cb2;
    struct cache_stats s;
    char key[64], *v = NULL;
    long long t;
    (void)state;
    snprintf(key, sizeof(key), "classes-%d", (int)getpid());
    assert_int_equal(cache_put(cb, key, strlen(key), "bulk reply", 10), AR_OK);
    t = pttl(rc, pb, key);
    assert_true(t > 4000 && t <= 5000);
    assert_int_equal(pttl(rc, pi, key), -2); /* no such key */
    assert_int_equal(cache_get(ci, key, strlen(key), NULL, NULL), 0);
    assert_int_equal(cache_put(ci, key, strlen(key), "live reply", 10), AR_OK);
    t = pttl(rc, pi, key);
    assert_true(t > 29000 && t <= 30000);

    /* another instance: empty L1s, each class finds its own entry in L2 */
    ci2 = open_class(url, CACHE_CLASS_INTERACTIVE, 30);
    cb2 = open_class(url, CACHE_CLASS_BULK, 5);
    assert_int_equal(cache_get(cb2, key, strlen(key), &v, NULL), 2);
    assert_string_equal(v, "bulk reply");
    ar_free(v);
    /* bulk work reading the interactive cache read-only: an L2 hit that its L1 does not keep */
    assert_int_equal(cache_get_flags(ci2, key, strlen(key), CACHE_GET_READ_ONLY, &v, NULL), 2);
    assert_string_equal(v, "live reply");
    ar_free(v);
    cache_stats(ci2, &s);
    assert_int_equal(s.n_entries, 0);
    assert_int_equal(cache_get(ci2, key, strlen(key), NULL, NULL), 2); /* a plain get copies */
    assert_int_equal(cache_get(ci2, key, strlen(key), NULL, NULL), 1);

    freeReplyObject(redisCommand(rc, "DEL %s%s %s%s", pi, key, pb, key));
    cache_destroy(ci);
    cache_destroy(cb);
    cache_destroy(ci2);
    cache_destroy(cb2);
    redisFree(rc);
}

static double fake_now(void *user)
{
    return *(double *)user;
}

/* An instance copying a Redis hit into its L1 keeps it only as long as Redis does (PTTL), so
 * no instance serves a reply older than the TTL from process memory. */
static void an_l1_copy_of_a_redis_hit_expires_with_the_redis_entry(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    const char *pre = prefix("copy-ttl");
    struct cache_memory_params mp = cache_memory_default_params();
    struct cache *writer = make_redis(url, pre, 2); /* another instance: 2 s in Redis */
    struct cache *l1 = NULL, *t = NULL;
    double now = 1000.0; /* the reader's L1 clock, moved by hand */
    (void)state;
    mp.max_bytes = 1 << 20;
    mp.ttl_s = 3600; /* a long L1 TTL: only the Redis entry's life can shorten the copy */
    mp.clock = fake_now;
    mp.clock_user = &now;
    assert_int_equal(cache_memory_create(&mp, &l1), AR_OK);
    assert_int_equal(cache_tiered_create(l1, make_redis(url, pre, 2), &t), AR_OK);
    assert_int_equal(cache_put(writer, "k", 1, "v", 1), AR_OK);
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 2);
    assert_int_equal(cache_get(t, "k", 1, NULL, NULL), 1); /* copied into L1 */
    now += 2.5; /* past what Redis had left when the copy was made */
    assert_int_equal(cache_get(l1, "k", 1, NULL, NULL), 0);
    cache_destroy(t);
    cache_destroy(writer);
}

/* ---- failures ----------------------------------------------------------------------------- */

struct timing {
    int n, n_slow; /* calls, calls that took more than 5 ms */
    double max_s;
};

static void timed(struct timing *t, double t0)
{
    double d = ar_time_s() - t0;
    t->n++;
    if (d > 0.005)
        t->n_slow++;
    if (d > t->max_s)
        t->max_s = d;
}

static void redis_down_means_fast_misses_then_recovery_by_itself(void **state)
{
    struct cache_redis_params p = cache_redis_default_params();
    struct cache *c = NULL, *t = NULL, *l1 = NULL;
    struct cache_memory_params mp = cache_memory_default_params();
    struct cache_stats s0, s;
    struct timing tg = {0, 0, 0}, tp = {0, 0, 0};
    double t_restart, t_back = -1;
    (void)state;
    th_private_start(&th_priv, "redis");
    p.url = th_priv.url;
    p.ttl_s = 60;
    assert_int_equal(cache_redis_create(&p, &c, NULL), AR_OK);
    assert_int_equal(cache_memory_create(&mp, &l1), AR_OK);
    assert_int_equal(cache_tiered_create(l1, c, &t), AR_OK);
    assert_int_equal(cache_put(c, "k", 1, "v", 1), AR_OK);
    assert_int_equal(cache_get(c, "k", 1, NULL, NULL), 2);
    assert_true(cache_redis_healthy(c));
    cache_stats(c, &s0);
    assert_int_equal(s0.errors, 0);

    th_private_stop(&th_priv);
    /* ~1 s of traffic against a dead server */
    for (double end = ar_time_s() + 1.0; ar_time_s() < end;) {
        double t0 = ar_time_s();
        assert_int_equal(cache_get(c, "k", 1, NULL, NULL), 0);
        timed(&tg, t0);
        t0 = ar_time_s();
        assert_int_equal(cache_put(c, "k", 1, "v", 1), AR_EUNAVAIL);
        timed(&tp, t0);
        th_sleep_s(0.002);
    }
    assert_false(cache_redis_healthy(c));
    assert_false(cache_redis_healthy(t)); /* the tiered cache over it says so too */
    /* the tiered cache keeps working from L1: the put lands there, the get finds it */
    assert_int_equal(cache_put(t, "t", 1, "local", 5), AR_EUNAVAIL);
    assert_int_equal(cache_get(t, "t", 1, NULL, NULL), 1);
    cache_stats(c, &s);
    /* every failed call is counted */
    assert_true(s.errors - s0.errors >= (uint64_t)(tg.n + tp.n));
    /* none waits long, and all but the few tries the backoff allows return at once */
    assert_true(tg.max_s < 0.3 && tp.max_s < 0.3);
    assert_true(tg.n > 100);
    assert_true(tg.n_slow + tp.n_slow <= 8);

    th_private_restart(&th_priv);
    t_restart = ar_time_s();
    while (ar_time_s() - t_restart < 8.0) {
        if (cache_put(c, "k", 1, "again", 5) == AR_OK) {
            t_back = ar_time_s() - t_restart;
            break;
        }
        th_sleep_s(0.01);
    }
    /* the backoff had reached at most 1.6 s after ~1 s of outage (0.1, 0.2, 0.4, 0.8 ...) */
    if (t_back < 0)
        fail_msg("the cache did not recover within 8 s of Redis coming back");
    assert_true(t_back < 2.5);
    assert_true(cache_redis_healthy(c));
    assert_true(cache_redis_healthy(t));
    {
        char *v = NULL;
        assert_int_equal(cache_get(c, "k", 1, &v, NULL), 2);
        assert_string_equal(v, "again");
        ar_free(v);
    }
    cache_destroy(t);
    th_private_cleanup(&th_priv);
}

static void a_cache_created_while_redis_is_down_connects_later(void **state)
{
    struct cache_redis_params p = cache_redis_default_params();
    struct cache *c = NULL;
    char url[300];
    double t0, t_back = -1;
    (void)state;
    th_private_start(&th_priv, "redis");
    snprintf(url, sizeof(url), "%s", th_priv.url);
    th_private_stop(&th_priv);
    p.url = url;
    p.backoff_max_ms = 400;
    t0 = ar_time_s();
    assert_int_equal(cache_redis_create(&p, &c, NULL), AR_OK);
    assert_true(ar_time_s() - t0 < 0.3);
    assert_false(cache_redis_healthy(c));
    assert_int_equal(cache_get(c, "k", 1, NULL, NULL), 0);
    assert_int_equal(cache_put(c, "k", 1, "v", 1), AR_EUNAVAIL);
    th_private_restart(&th_priv);
    t0 = ar_time_s();
    while (ar_time_s() - t0 < 5.0) {
        if (cache_put(c, "k", 1, "v", 1) == AR_OK) {
            t_back = ar_time_s() - t0;
            break;
        }
        th_sleep_s(0.01);
    }
    if (t_back < 0)
        fail_msg("never connected");
    assert_true(t_back < 0.4 + 0.3); /* within the largest backoff */
    assert_true(cache_redis_healthy(c));
    assert_int_equal(cache_get(c, "k", 1, NULL, NULL), 2);
    cache_destroy(c);
    th_private_cleanup(&th_priv);
}

/* A server that takes connections and never answers: each call would wait for the command
 * timeout; the breaker makes only the first (and the tries the backoff allows) wait. */
static void a_server_that_never_answers_costs_one_command_timeout(void **state)
{
    struct cache_redis_params p = cache_redis_default_params();
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    struct cache *c = NULL;
    struct cache_stats s;
    struct timing tg = {0, 0, 0};
    char url[64];
    double t0, first;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    (void)state;
    assert_true(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 64), 0); /* the kernel completes connections; nobody reads */
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", ntohs(a.sin_port));
    p.url = url;
    p.command_timeout_ms = 100;
    assert_int_equal(cache_redis_create(&p, &c, NULL), AR_OK);
    assert_true(cache_redis_healthy(c)); /* it connected: nothing known to be wrong yet */
    t0 = ar_time_s();
    assert_int_equal(cache_get(c, "k", 1, NULL, NULL), 0);
    first = ar_time_s() - t0;
    assert_true(first >= 0.09 && first < 0.35); /* the command timeout, not more */
    assert_false(cache_redis_healthy(c));
    for (int i = 0; i < 200; i++) {
        t0 = ar_time_s();
        assert_int_equal(cache_get(c, "k", 1, NULL, NULL), 0);
        timed(&tg, t0);
    }
    /* 200 calls in far less than 200 timeouts: the breaker answered most at once */
    assert_true(tg.n_slow <= 3);
    assert_true(tg.max_s < 0.35);
    cache_stats(c, &s);
    assert_int_equal(s.errors, 201);
    assert_int_equal(s.misses, 201);
    cache_destroy(c);
    close(fd);
}

/* ---- threads ------------------------------------------------------------------------------ */

#define N_THREADS 4
#define N_OPS 400
#define N_KEYS 50

struct worker {
    struct cache *c;
    int id;
    int n_hits, n_bad, n_err;
};

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    uint64_t seed = 0x1234u + (uint64_t)w->id;
    for (int i = 0; i < N_OPS; i++) {
        int k = (int)(ar_splitmix64(&seed) % N_KEYS);
        char key[32], val[64], *v = NULL;
        size_t n = 0;
        int kl = snprintf(key, sizeof(key), "k%d", k);
        int vl = snprintf(val, sizeof(val), "value-of-k%d-from-%d", k, w->id);
        if (ar_splitmix64(&seed) % 3 == 0) {
            if (cache_put(w->c, key, (size_t)kl, val, (size_t)vl) != AR_OK)
                w->n_err++;
        } else if (cache_get(w->c, key, (size_t)kl, &v, &n)) {
            char want[32];
            int wl = snprintf(want, sizeof(want), "value-of-k%d-", k);
            w->n_hits++;
            /* any writer's value, but always this key's */
            if (n != strlen(v) || strncmp(v, want, (size_t)wl) != 0)
                w->n_bad++;
            ar_free(v);
        }
    }
    return NULL;
}

static void threads_share_one_cache_and_its_connections(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    struct cache_redis_params p = cache_redis_default_params();
    struct cache_memory_params mp = cache_memory_default_params();
    struct cache *l1 = NULL, *l2 = NULL, *t = NULL;
    struct worker w[N_THREADS];
    pthread_t th[N_THREADS];
    struct cache_stats s;
    int hits = 0;
    (void)state;
    p.url = url;
    p.key_prefix = prefix("threads");
    p.pool_size = 2;             /* fewer connections than threads: they wait for one */
    p.command_timeout_ms = 2000; /* sanitizers slow everything down */
    assert_int_equal(cache_redis_create(&p, &l2, NULL), AR_OK);
    mp.max_bytes = 4096; /* a small L1, so that gets reach Redis too */
    mp.n_shards = 1;
    assert_int_equal(cache_memory_create(&mp, &l1), AR_OK);
    assert_int_equal(cache_tiered_create(l1, l2, &t), AR_OK);
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (struct worker){t, i, 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].n_bad, 0);
        assert_int_equal(w[i].n_err, 0);
        hits += w[i].n_hits;
    }
    cache_stats(t, &s);
    assert_int_equal(s.hits, (uint64_t)hits);
    assert_true(s.l2_hits > 0);
    assert_int_equal(s.errors, 0);
    cache_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(urls_are_parsed_and_bad_ones_rejected_with_a_reason),
        cmocka_unit_test(bad_parameters_are_rejected_and_nothing_is_created),
        cmocka_unit_test(get_returns_what_put_stored_byte_for_byte),
        cmocka_unit_test(entries_expire_after_their_ttl),
        cmocka_unit_test(caches_with_other_prefixes_do_not_see_each_other),
        cmocka_unit_test(a_reply_put_by_one_instance_is_an_l2_then_l1_hit_on_another),
        cmocka_unit_test(cache_open_picks_the_implementation_by_url),
        cmocka_unit_test(classes_keep_their_own_keys_and_ttls_in_redis),
        cmocka_unit_test(an_l1_copy_of_a_redis_hit_expires_with_the_redis_entry),
        cmocka_unit_test_teardown(redis_down_means_fast_misses_then_recovery_by_itself,
                                  th_private_teardown),
        cmocka_unit_test_teardown(a_cache_created_while_redis_is_down_connects_later,
                                  th_private_teardown),
        cmocka_unit_test(a_server_that_never_answers_costs_one_command_timeout),
        cmocka_unit_test(threads_share_one_cache_and_its_connections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
