/* limits_redis_test.c - rate limits kept in Redis (limits_redis.c behind limits.c) against real
 * Redis servers: the same answers as the in-process buckets for the same calls, two limiter
 * handles (two instances, with clocks a thousand seconds apart) admitting the configured rate
 * between them and not twice it, idle clients' keys expiring, a flushed script sent again, a
 * Redis that goes away (a private one, stopped and restarted) answered by each instance's own
 * buckets meanwhile, and two HTTP servers sharing one request bucket. */
#include "harness/harness.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define TH_HTTP_RECV_TIMEOUT_S 20
#include "harness/http_client.h"
#include "harness/private_services.h"

#include "cache/cache.h"
#include "server/server_internal.h"

/* A client name no other run or test uses. */
static const char *client(const char *name)
{
    static char buf[4][96];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof(buf[i]), "test-%d-%s", (int)getpid(), name);
    return buf[i];
}

static struct server_limiter *limiter(double rps, double burst, double tpm, const char *url,
                                      struct metrics_registry *reg)
{
    struct server_limiter *l = NULL;
    struct ar_err err = {AR_OK, 0, {0}};
    assert_int_equal(server_limiter_create(rps, burst, tpm, &l), AR_OK);
    if (url && server_limiter_use_redis(l, url, reg, &err) != AR_OK)
        fail_msg("server_limiter_use_redis(%s): %s", url, err.msg);
    return l;
}

static double registry_value(struct metrics_registry *reg, const char *series)
{
    char *text = NULL;
    size_t len;
    double v;
    assert_int_equal(metrics_render(reg, &text, &len), AR_OK);
    v = th_metric_sample(text, series, -1);
    ar_free(text);
    return v;
}

#define ERRORS "autoreply_rate_limit_backend_errors_total{backend=\"redis\"}"

/* ---- the same answers as limits.c --------------------------------------------------------- */

enum op { REQ, TOK, TOK_CHARGE, SLEEP };
struct step {
    enum op op;
    double arg; /* tokens, or seconds to sleep */
};

/* Runs steps on both limiters with the same client; answers must agree exactly and retry
 * times within 50 ms (the two clocks read a little apart). */
static void same_answers(double rps, double burst, double tpm, const struct step *steps, int n)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    struct metrics_registry *reg = NULL;
    struct server_limiter *mem = limiter(rps, burst, tpm, NULL, NULL);
    struct server_limiter *red;
    const char *who = client("same");
    char name[128];
    int n_refused = 0;
    static int run;
    snprintf(name, sizeof(name), "%s-%d", who, ++run);
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    red = limiter(rps, burst, tpm, url, reg);
    for (int i = 0; i < n; i++) {
        double rm = -1, rr = -1, now = ar_time_s();
        bool om = true, orr = true;
        switch (steps[i].op) {
        case REQ:
            om = server_limiter_request(mem, name, now, &rm);
            orr = server_limiter_request(red, name, now, &rr);
            break;
        case TOK:
        case TOK_CHARGE:
            om = server_limiter_tokens(mem, name, (int64_t)steps[i].arg, steps[i].op == TOK, now,
                                       &rm);
            orr = server_limiter_tokens(red, name, (int64_t)steps[i].arg, steps[i].op == TOK, now,
                                        &rr);
            break;
        case SLEEP:
            th_sleep_s(steps[i].arg);
            continue;
        }
        if (om != orr)
            fail_msg("step %d: in process %s, Redis %s", i, om ? "admits" : "refuses",
                     orr ? "admits" : "refuses");
        if (!om) {
            n_refused++;
            if (rm - rr > 0.05 || rr - rm > 0.05)
                fail_msg("step %d: retry after %.3f s in process, %.3f s in Redis", i, rm, rr);
        }
    }
    assert_true(n_refused > 0);                    /* each script has refusals to compare */
    assert_true(registry_value(reg, ERRORS) == 0); /* every answer came from Redis */
    assert_true(server_limiter_backend_healthy(red));
    server_limiter_destroy(mem);
    server_limiter_destroy(red);
    metrics_registry_destroy(reg);
}

static void redis_buckets_answer_as_the_in_process_ones(void **state)
{
    /* a burst of 3 at 2/s: the fourth waits ~0.5 s; after 0.55 s one more */
    static const struct step burst[] = {{REQ, 0}, {REQ, 0},      {REQ, 0}, {REQ, 0},
                                        {REQ, 0}, {SLEEP, 0.55}, {REQ, 0}, {REQ, 0}};
    /* the default burst is max(1, rps) */
    static const struct step dflt[] = {{REQ, 0}, {REQ, 0}, {REQ, 0}, {REQ, 0}, {REQ, 0}, {REQ, 0}};
    /* 600 tokens/min: admission needs min(n, 600); a charge always passes and leaves debt */
    static const struct step tokens[] = {{TOK, 1000},     {TOK, 1},     {TOK_CHARGE, 50}, {TOK, 1},
                                         {TOK_CHARGE, 0}, {SLEEP, 0.2}, {TOK, 1}};
    /* both buckets on one client: requests do not spend tokens, nor the reverse */
    static const struct step both[] = {{TOK, 100}, {REQ, 0},   {TOK, 100},
                                       {REQ, 0},   {TOK, 100}, {REQ, 0}};
    (void)state;
    same_answers(2, 3, 0, burst, (int)AR_ARRAY_LEN(burst));
    same_answers(5, 0, 0, dflt, (int)AR_ARRAY_LEN(dflt));
    same_answers(0, 0, 600, tokens, (int)AR_ARRAY_LEN(tokens));
    same_answers(1, 2, 250, both, (int)AR_ARRAY_LEN(both));
}

/* ---- two instances ------------------------------------------------------------------------ */

struct hammer {
    struct server_limiter *l;
    const char *client;
    double skew;     /* added to the clock this "instance" passes */
    int64_t tokens;  /* 0: requests; else admissions of this many tokens */
    double period_s; /* between calls */
    double run_s;
    int admitted, calls;
};

static void *hammer_run(void *arg)
{
    struct hammer *h = arg;
    double end = ar_time_s() + h->run_s, retry;
    while (ar_time_s() < end) {
        bool ok = h->tokens
                      ? server_limiter_tokens(h->l, h->client, h->tokens, true,
                                              ar_time_s() + h->skew, &retry)
                      : server_limiter_request(h->l, h->client, ar_time_s() + h->skew, &retry);
        h->admitted += ok;
        h->calls++;
        th_sleep_s(h->period_s);
    }
    return NULL;
}

/* Two handles with their own clocks 2000 s apart hammer one client for run_s seconds. */
static int pair_admits(double rps, double burst, double tpm, int64_t tokens, double run_s,
                       struct metrics_registry *reg)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    struct hammer h[2];
    pthread_t th[2];
    const char *who = client(tokens ? "pair-tokens" : "pair-requests");
    for (int i = 0; i < 2; i++) {
        h[i] = (struct hammer){limiter(rps, burst, tpm, url, reg),
                               who,
                               i ? -1000.0 : 1000.0,
                               tokens,
                               0.002,
                               run_s,
                               0,
                               0};
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, hammer_run, &h[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_true(h[i].calls > 50); /* both really asked, all along */
        server_limiter_destroy(h[i].l);
    }
    return h[0].admitted + h[1].admitted;
}

static void two_instances_share_one_request_rate(void **state)
{
    struct metrics_registry *reg = NULL;
    int n;
    (void)state;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    /* 10/s with a burst of 10 for 2 s: 10 + 2 * 10 between them (each alone would allow
     * that much, so buckets per instance would admit 60) */
    n = pair_admits(10, 10, 0, 0, 2.0, reg);
    if (n < 27 || n > 32)
        fail_msg("the pair admitted %d requests in 2 s at 10/s, burst 10 (expected ~30)", n);
    assert_true(registry_value(reg, ERRORS) == 0);
    metrics_registry_destroy(reg);
}

static void two_instances_share_one_token_bucket(void **state)
{
    struct metrics_registry *reg = NULL;
    int n;
    (void)state;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    /* 600 tokens/min = 10/s, bucket 600; admissions of 10 tokens for 2 s: 60 from the full
     * bucket + 2 from the refill (separate buckets: 124) */
    n = pair_admits(0, 0, 600, 10, 2.0, reg);
    if (n < 61 || n > 63)
        fail_msg("the pair admitted %d x 10 tokens in 2 s at 600/min (expected ~62)", n);
    assert_true(registry_value(reg, ERRORS) == 0);
    metrics_registry_destroy(reg);
}

/* ---- keys, script --------------------------------------------------------------------------- */

static void an_idle_client_key_expires_once_its_buckets_are_full(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    struct server_limiter *l = limiter(100, 1, 0, url, NULL);
    redisContext *rc = th_redis_direct(url);
    const char *who = client("idle");
    redisReply *r;
    double retry;
    (void)state;
    assert_true(server_limiter_request(l, who, 0, &retry));
    /* one request out of a bucket of 1 at 100/s: full again in 10 ms, kept 1 s longer */
    r = redisCommand(rc, "PTTL ar:rl:%s", who);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_true(r->integer > 800 && r->integer <= 1010);
    freeReplyObject(r);
    r = redisCommand(rc, "HGET ar:rl:%s r", who);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_true(strtod(r->str, NULL) < 0.5); /* the request was taken */
    freeReplyObject(r);
    th_sleep_s(1.2);
    r = redisCommand(rc, "EXISTS ar:rl:%s", who);
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    redisFree(rc);
    server_limiter_destroy(l);
}

static void a_flushed_script_is_sent_again(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    struct metrics_registry *reg = NULL;
    struct server_limiter *l;
    redisContext *rc = th_redis_direct(url);
    const char *who = client("flush");
    redisReply *r;
    double retry;
    (void)state;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    l = limiter(1, 5, 0, url, reg);
    assert_true(server_limiter_request(l, who, 0, &retry));
    freeReplyObject(redisCommand(rc, "SCRIPT FLUSH"));
    assert_true(server_limiter_request(l, who, 0, &retry)); /* NOSCRIPT, then EVAL */
    assert_true(server_limiter_request(l, who, 0, &retry)); /* EVALSHA again */
    r = redisCommand(rc, "HGET ar:rl:%s r", who);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    /* three requests taken from 5 in Redis (plus a little refill at 1/s) */
    assert_true(strtod(r->str, NULL) > 1.9 && strtod(r->str, NULL) < 2.2);
    freeReplyObject(r);
    assert_true(registry_value(reg, ERRORS) == 0);
    redisFree(rc);
    server_limiter_destroy(l);
    metrics_registry_destroy(reg);
}

static void bad_urls_are_rejected(void **state)
{
    struct server_limiter *l = NULL;
    struct ar_err err = {AR_OK, 0, {0}};
    struct server_params sp = server_default_params();
    struct server *s = (struct server *)1;
    (void)state;
    assert_int_equal(server_limiter_create(1, 1, 0, &l), AR_OK);
    assert_int_equal(server_limiter_use_redis(l, "redis://127.0.0.1:99999/0", NULL, &err),
                     AR_EINVAL);
    assert_non_null(strstr(err.msg, "port"));
    server_limiter_destroy(l);
    sp.port = 0;
    sp.rate_rps = 1;
    sp.rate_redis_url = "rediss://127.0.0.1:6379/0";
    assert_int_equal(server_create(&sp, &s, &err), AR_EINVAL);
    assert_non_null(strstr(err.msg, "redis://"));
    assert_null(s);
}

/* ---- Redis goes away ---------------------------------------------------------------------- */

static void without_redis_each_instance_limits_on_its_own_buckets(void **state)
{
    struct metrics_registry *reg = NULL;
    struct server_limiter *l;
    const char *who = client("outage");
    double retry, t0, worst = 0, t_back = -1;
    int admitted = 0, slow = 0;
    redisContext *rc;
    redisReply *r;
    (void)state;
    th_private_start(&th_priv, "redis");
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    l = limiter(5, 5, 0, th_priv.url, reg);
    assert_true(server_limiter_request(l, who, ar_time_s(), &retry)); /* through Redis */
    assert_true(server_limiter_backend_healthy(l));
    th_private_stop(&th_priv);
    /* 8 calls at once: the instance's own fresh bucket of 5 decides, quickly */
    for (int i = 0; i < 8; i++) {
        t0 = ar_time_s();
        retry = -1;
        if (server_limiter_request(l, who, ar_time_s(), &retry))
            admitted++;
        else
            assert_true(retry > 0.1 && retry <= 0.2 + 1e-9); /* (1 - level) / 5 */
        t0 = ar_time_s() - t0;
        worst = AR_MAX(worst, t0);
        slow += t0 > 0.005;
    }
    assert_int_equal(admitted, 5);
    assert_true(worst < 0.3);
    assert_true(slow <= 2);
    assert_false(server_limiter_backend_healthy(l));
    assert_true(registry_value(reg, ERRORS) == 8);

    th_private_restart(&th_priv);
    t0 = ar_time_s();
    while (ar_time_s() - t0 < 5) {
        server_limiter_request(l, who, ar_time_s(), &retry);
        if (server_limiter_backend_healthy(l)) {
            t_back = ar_time_s() - t0;
            break;
        }
        th_sleep_s(0.02);
    }
    if (t_back < 0)
        fail_msg("the limiter did not reach Redis again within 5 s");
    assert_true(t_back < 1.0); /* the backoff was at 0.4 s after three failures */
    /* Redis holds the client's buckets again */
    rc = th_redis_direct(th_priv.url);
    r = redisCommand(rc, "EXISTS ar:rl:%s", who);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    redisFree(rc);
    server_limiter_destroy(l);
    metrics_registry_destroy(reg);
    th_private_cleanup(&th_priv);
}

/* ---- two HTTP servers ----------------------------------------------------------------------- */

static struct server *start_server(const char *url, int *port)
{
    struct server_params sp = server_default_params();
    struct server *s = NULL;
    struct ar_err err = {AR_OK, 0, {0}};
    sp.port = 0;
    sp.rate_rps = 0.2; /* one more every 5 s: none during the test */
    sp.rate_burst = 3;
    sp.rate_redis_url = url;
    if (server_create(&sp, &s, &err) != AR_OK || server_start(s, &err) != AR_OK)
        fail_msg("server: %s", err.msg);
    *port = server_port(s);
    assert_true(server_rate_limit_healthy(s));
    return s;
}

static void two_servers_share_a_client_request_bucket(void **state)
{
    const char *url = th_env_url("AR_TEST_REDIS_URL");
    redisContext *rc = th_redis_direct(url);
    struct server *a, *b;
    struct resp r;
    int pa, pb;
    (void)state;
    /* both servers see this test as client 127.0.0.1: start from a fresh bucket */
    freeReplyObject(redisCommand(rc, "DEL ar:rl:127.0.0.1"));
    a = start_server(url, &pa);
    b = start_server(url, &pb);
    /* the burst of 3, spent on a (503: no engine yet, but past the limiter) */
    for (int i = 0; i < 3; i++) {
        http(pa, "GET", "/v1/models", NULL, NULL, 0, &r);
        assert_true(r.status != 429);
        resp_free(&r);
    }
    /* b has never seen this client, yet the bucket is empty */
    http(pb, "GET", "/v1/models", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 429);
    assert_non_null(strstr(r.body, "rate_limit_exceeded"));
    resp_free(&r);
    http(pa, "GET", "/v1/models", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 429);
    resp_free(&r);
    assert_true(metric(pb, "autoreply_rate_limit_backend_errors_total{backend=\"redis\"}") == 0);
    server_destroy(a);
    server_destroy(b);
    freeReplyObject(redisCommand(rc, "DEL ar:rl:127.0.0.1"));
    redisFree(rc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(redis_buckets_answer_as_the_in_process_ones),
        cmocka_unit_test(two_instances_share_one_request_rate),
        cmocka_unit_test(two_instances_share_one_token_bucket),
        cmocka_unit_test(an_idle_client_key_expires_once_its_buckets_are_full),
        cmocka_unit_test(a_flushed_script_is_sent_again),
        cmocka_unit_test(bad_urls_are_rejected),
        cmocka_unit_test_teardown(without_redis_each_instance_limits_on_its_own_buckets,
                                  th_private_teardown),
        cmocka_unit_test(two_servers_share_a_client_request_bucket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
