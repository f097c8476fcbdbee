/* reviews_test.c - the review-reply endpoints of the server (src/server/reviews.c) over a reply
 * service whose generator is scripted (the demo model only drives the OpenAI routes and the
 * server's readiness): the endpoints below HTTP (bodies, paths, jobs, a caller's budget), the
 * one mapping from reply errors to HTTP statuses and codes, what clients see of those errors
 * over real HTTP, the X-Autoreply-Instance header on every kind of response, and /health with
 * backend checks. */
#include "harness/harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define TH_HTTP_RECV_TIMEOUT_S 20
#include "harness/http_client.h"
#include "harness/reply_fakes.h"

#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "reply/reply.h"
#include "server/server_internal.h"
#include "tokenizer/tokenizer.h"

#define INSTANCE "review-test-1"

/* ---- a scripted generator -------------------------------------------------------------- */

struct fake {
    struct reply_generator base;
    atomic_int calls;
};

/* Charges the prompt first (one token per byte of the user turn), as generators must
 * (reply.h), then answers in the language of the user turn, distinct per review. */
static enum ar_status fake_generate(struct reply_generator *g, const struct reply_gen_request *r,
                                    char **text, size_t *len)
{
    struct fake *f = (struct fake *)g;
    char buf[256];
    double retry = 0;
    atomic_fetch_add(&f->calls, 1);
    if (reply_call_cancelled(r->call))
        return AR_ECANCELED;
    if (!reply_call_charge(r->call, (int64_t)strlen(r->user), r->admission, &retry)) {
        if (r->usage) {
            r->usage->limited = true;
            r->usage->retry_after_s = retry;
        }
        return AR_EBUSY;
    }
    if (strncmp(r->user, "评分", strlen("评分")) == 0)
        snprintf(buf, sizeof(buf), "感谢您的评价，编号%u已记录，欢迎再来！", th_fnv32(r->user));
    else
        snprintf(buf, sizeof(buf), "Thank you for your review, note %u. See you soon!",
                 th_fnv32(r->user));
    *text = ar_strdup(buf);
    *len = strlen(buf);
    return *text ? AR_OK : AR_ENOMEM;
}

/* ---- fixture ------------------------------------------------------------------------------ */

static struct model *g_model;
static struct tokenizer *g_tok;
static struct engine *g_eng;

struct fx {
    char dir[64];
    char db[128];
    struct store *store;
    struct reply_profiles *profiles;
    struct cache *cache;
    struct cache *bulk_cache; /* NULL but in the cache class test */
    struct metrics_registry *metrics;
    struct reply_service *svc;
    struct fake gen;
    struct server *srv; /* INSTANCE, review routes, engine set */
    int port;
};

static int group_setup(void **state)
{
    char path[512];
    struct ar_err err = {0};
    struct engine_params ep = engine_default_params();
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    ar_log_set_level(AR_LOG_WARN);
    if (model_load(th_shared_path(path, sizeof(path), "models/autoreply-demo-q8_0.gguf"), &g_model,
                   &err) != AR_OK ||
        tokenizer_load(model_gguf(g_model), &g_tok, &err) != AR_OK)
        return -1;
    ep.n_threads = 1;
    ep.n_seq_max = 2;
    ep.queue_max = 16;
    ep.kv_tokens = 2048;
    if (engine_create(g_model, g_tok, &ep, &g_eng, &err) != AR_OK)
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    engine_destroy(g_eng);
    tokenizer_destroy(g_tok);
    model_destroy(g_model);
    return 0;
}

/* A started server on an ephemeral port with the review routes over x's service; instance
 * NULL: the default name; metrics NULL: its own registry. */
static struct server *start_server(struct fx *x, const char *instance, bool engine,
                                   struct metrics_registry *metrics, int *port)
{
    struct server_params sp = server_default_params();
    struct server *s = NULL;
    struct ar_err err = {0};
    sp.host = "127.0.0.1";
    sp.port = 0;
    sp.model_name = "demo";
    sp.metrics = metrics;
    sp.instance_name = instance;
    if (server_create(&sp, &s, &err) != AR_OK)
        fail_msg("server_create: %s", err.msg);
    assert_int_equal(server_reviews_attach(s, x->svc, NULL), AR_OK);
    if (server_start(s, &err) != AR_OK)
        fail_msg("server_start: %s", err.msg);
    if (engine)
        server_set_engine(s, g_eng, g_model, g_tok);
    *port = server_port(s);
    assert_true(*port > 0);
    return s;
}

static int setup(void **state)
{
    struct fx *x = calloc(1, sizeof(*x));
    struct cache_memory_params cp = cache_memory_default_params();
    struct reply_service_params p = reply_service_default_params();
    snprintf(x->dir, sizeof(x->dir), "/tmp/ar_reviews_XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    snprintf(x->db, sizeof(x->db), "%s/replies.db", x->dir);
    assert_int_equal(store_open(x->db, &x->store, NULL), AR_OK);
    /* one generation per review: these tests count model calls and budget refusals per
     * request (candidates are tested in tests/reply/pipeline_test.c) */
    assert_int_equal(th_profiles_single(&x->profiles), AR_OK);
    cp.max_bytes = 1 << 20;
    assert_int_equal(cache_memory_create(&cp, &x->cache), AR_OK);
    assert_int_equal(metrics_registry_create(&x->metrics), AR_OK);
    x->gen.base.generate = fake_generate;
    x->gen.base.model_name = "fake";
    p.profiles = x->profiles;
    p.store = x->store;
    p.cache = x->cache;
    p.metrics = x->metrics;
    p.gen = &x->gen.base;
    p.n_workers = 4;
    assert_int_equal(reply_service_create(&p, &x->svc), AR_OK);
    x->srv = start_server(x, INSTANCE, true, x->metrics, &x->port);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fx *x = *state;
    char cmd[160];
    server_stop(x->srv, 5); /* before the service its routes answer over */
    reply_service_destroy(x->svc);
    server_destroy(x->srv);
    metrics_registry_destroy(x->metrics);
    cache_destroy(x->cache);
    cache_destroy(x->bulk_cache);
    reply_profiles_destroy(x->profiles);
    store_close(x->store);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", x->dir);
    assert_int_equal(system(cmd), 0);
    free(x);
    return 0;
}

static double fx_metric(struct fx *x, const char *line_prefix)
{
    char *text = NULL;
    size_t len;
    double v;
    assert_int_equal(metrics_render(x->metrics, &text, &len), AR_OK);
    v = th_metric_sample(text, line_prefix, -1);
    ar_free(text);
    return v;
}

/* ---- the endpoints below HTTP (moved from tests/reply/pipeline_test.c) ---------------------- */

struct answer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    cJSON *json;
    char *text;
    char ctype[64];
};

static void on_answer(void *ctx, int status, cJSON *json, const char *text, size_t len,
                      const char *ctype)
{
    struct answer *a = ctx;
    pthread_mutex_lock(&a->mu);
    a->status = status;
    a->json = json;
    a->text = text ? strndup(text, len) : NULL;
    snprintf(a->ctype, sizeof(a->ctype), "%s", ctype ? ctype : "");
    a->done = true;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static void call(struct fx *x, enum server_review_ep ep, const char *path, const char *json,
                 const char *raw, struct answer *a)
{
    cJSON *body = json ? cJSON_Parse(json) : NULL;
    memset(a, 0, sizeof(*a));
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    server_review_handle(x->svc, ep, path, body, raw, raw ? strlen(raw) : 0, NULL, on_answer, a,
                         NULL);
    pthread_mutex_lock(&a->mu);
    while (!a->done)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    cJSON_Delete(body);
}

static void answer_fini(struct answer *a)
{
    cJSON_Delete(a->json);
    free(a->text);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
}

static void handlers_answer_reviews_batches_and_jobs(void **state)
{
    struct fx *x = *state;
    struct answer a;
    char path[128], id[STORE_JOB_ID_LEN + 1];

    call(x, SERVER_REVIEW_REPLY, "/v1/reviews/reply",
         "{\"shop_id\":\"s1\",\"review_id\":\"h1\",\"text\":\"Love it\",\"rating\":5}", NULL, &a);
    assert_int_equal(a.status, 200);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(a.json, "reply")));
    assert_true(cJSON_IsBool(cJSON_GetObjectItem(a.json, "cached")));
    assert_true(cJSON_IsBool(cJSON_GetObjectItem(a.json, "needs_human")));
    assert_string_equal(cJSON_GetObjectItem(a.json, "sentiment")->valuestring, "positive");
    assert_string_equal(cJSON_GetObjectItem(a.json, "lang")->valuestring, "en");
    assert_string_equal(cJSON_GetObjectItem(a.json, "model")->valuestring, "fake");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(a.json, "latency_ms")));
    answer_fini(&a);

    /* a single review may name its review "id" too */
    call(x, SERVER_REVIEW_REPLY, "/v1/reviews/reply",
         "{\"shop_id\":\"s1\",\"id\":\"h3\",\"text\":\"Nice\",\"rating\":5}", NULL, &a);
    assert_int_equal(a.status, 200);
    assert_string_equal(cJSON_GetObjectItem(a.json, "review_id")->valuestring, "h3");
    answer_fini(&a);

    call(x, SERVER_REVIEW_REPLY, "/v1/reviews/reply",
         "{\"shop_id\":\"s1\",\"review_id\":\"h2\",\"rating\":5}", NULL, &a);
    assert_int_equal(a.status, 400);
    assert_non_null(cJSON_GetObjectItem(a.json, "error"));
    answer_fini(&a);

    call(x, SERVER_REVIEW_BATCH, "/v1/reviews/batch",
         "{\"shop_id\":\"s1\",\"reviews\":[{\"review_id\":\"q1\",\"text\":\"好\",\"rating\":5},"
         "{\"review_id\":\"q2\",\"text\":\"好\",\"rating\":9},"
         "{\"review_id\":\"q1\",\"text\":\"好\",\"rating\":5},"
         "{\"id\":\"q3\",\"text\":\"好吃\",\"rating\":5}]}",
         NULL, &a);
    assert_int_equal(a.status, 200);
    {
        cJSON *res = cJSON_GetObjectItem(a.json, "results");
        assert_int_equal(cJSON_GetArraySize(res), 4);
        /* a batch item may name its review "id" */
        assert_string_equal(
            cJSON_GetObjectItem(cJSON_GetArrayItem(res, 3), "review_id")->valuestring, "q3");
        assert_true(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 3), "reply")));
        assert_true(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "reply")));
        assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 1), "status")->valueint, 400);
        assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 2), "status")->valueint, 409);
    }
    answer_fini(&a);

    /* a JSONL job with a malformed line and a blank line */
    call(x, SERVER_REVIEW_JOB_CREATE, "/v1/jobs", NULL,
         "{\"shop_id\":\"s1\",\"review_id\":\"j1\",\"text\":\"很好\",\"rating\":5}\n"
         "{not json\n"
         "\n"
         "{\"shop_id\":\"s1\",\"review_id\":\"j2\",\"text\":\"太差\",\"rating\":1}\n",
         &a);
    assert_int_equal(a.status, 202);
    snprintf(id, sizeof(id), "%s", cJSON_GetObjectItem(a.json, "id")->valuestring);
    assert_int_equal(cJSON_GetObjectItem(a.json, "total")->valueint, 3);
    answer_fini(&a);
    assert_int_equal(reply_job_run(x->svc, id, NULL, NULL, NULL), AR_OK);

    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    call(x, SERVER_REVIEW_JOB_GET, path, NULL, NULL, &a);
    assert_int_equal(a.status, 200);
    assert_string_equal(cJSON_GetObjectItem(a.json, "status")->valuestring, "done");
    assert_int_equal(cJSON_GetObjectItem(a.json, "done")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(a.json, "failed")->valueint, 1);
    answer_fini(&a);
    /* job lines are counted once, by status */
    assert_true(fx_metric(x, "autoreply_jobs_items_total{status=\"done\"}") == 2.0);
    assert_true(fx_metric(x, "autoreply_jobs_items_total{status=\"error\"}") == 1.0);
    assert_true(fx_metric(x, "autoreply_job_lines_total{outcome=\"done\"}") == -1);
    assert_true(fx_metric(x, "autoreply_job_lines_total{outcome=\"error\"}") == -1);

    snprintf(path, sizeof(path), "/v1/jobs/%s/results", id);
    call(x, SERVER_REVIEW_JOB_GET, path, NULL, NULL, &a);
    assert_int_equal(a.status, 200);
    assert_string_equal(a.ctype, "application/x-ndjson");
    {
        /* lines 1, 2, 4 of the body, in order; line 2 is the error */
        char *l1 = a.text, *l2 = strchr(l1, '\n') + 1, *l3 = strchr(l2, '\n') + 1;
        cJSON *j1 = cJSON_Parse(l1), *j2 = cJSON_Parse(l2), *j3 = cJSON_Parse(l3);
        assert_int_equal(cJSON_GetObjectItem(j1, "line")->valueint, 1);
        assert_true(cJSON_IsString(cJSON_GetObjectItem(j1, "reply")));
        assert_int_equal(cJSON_GetObjectItem(j2, "line")->valueint, 2);
        assert_non_null(strstr(cJSON_GetObjectItem(j2, "error")->valuestring, "JSON"));
        assert_int_equal(cJSON_GetObjectItem(j3, "line")->valueint, 4);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j3, "needs_human")));
        cJSON_Delete(j1);
        cJSON_Delete(j2);
        cJSON_Delete(j3);
    }
    answer_fini(&a);

    call(x, SERVER_REVIEW_JOB_GET, "/v1/jobs/0123456789abcdef0123456789abcdef", NULL, NULL, &a);
    assert_int_equal(a.status, 404);
    answer_fini(&a);
    call(x, SERVER_REVIEW_JOB_GET, "/v1/jobs/../etc", NULL, NULL, &a);
    assert_int_equal(a.status, 404);
    answer_fini(&a);
    call(x, SERVER_REVIEW_JOB_CREATE, "/v1/jobs", "{\"reviews\": []}", NULL, &a);
    assert_int_equal(a.status, 400);
    answer_fini(&a);
}

static void rate_limited_review_over_the_handler_is_a_429(void **state)
{
    struct fx *x = *state;
    struct th_budget b = {PTHREAD_MUTEX_INITIALIZER, 0, 1000, 0, 0};
    struct reply_call *c;
    struct answer a;
    cJSON *body =
        cJSON_Parse("{\"shop_id\":\"s1\",\"review_id\":\"rl\",\"text\":\"好\",\"rating\":5}");
    assert_int_equal(reply_call_create(th_budget_charge, &b, &c), AR_OK);
    memset(&a, 0, sizeof(a));
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    server_review_handle(x->svc, SERVER_REVIEW_REPLY, "/v1/reviews/reply", body, NULL, 0, c,
                         on_answer, &a, NULL);
    pthread_mutex_lock(&a.mu);
    while (!a.done)
        pthread_cond_wait(&a.cv, &a.mu);
    pthread_mutex_unlock(&a.mu);
    assert_int_equal(a.status, 429);
    {
        cJSON *e = cJSON_GetObjectItem(a.json, "error");
        assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "rate_limit_exceeded");
        assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "rate_limit_error");
    }
    assert_int_equal(b.refused, 1);
    assert_true(reply_call_retry_after(c) == 7.0);
    answer_fini(&a);
    cJSON_Delete(body);
    reply_call_destroy(c);
}

/* ---- errors: one mapping ------------------------------------------------------------------- */

static void every_reply_error_maps_to_one_status_and_code(void **state)
{
    /* the contract clients rely on (server.h, reply.h): status, code and error type */
    static const struct {
        enum reply_error e;
        int status;
        const char *code, *type;
    } want[] = {
        {REPLY_OK, 200, "ok", NULL},
        {REPLY_EINVAL, 400, "invalid_review", "invalid_request_error"},
        {REPLY_EDUPLICATE, 409, "duplicate_review_id", "invalid_request_error"},
        {REPLY_ECONFLICT, 409, "review_id_conflict", "invalid_request_error"},
        {REPLY_ELIMITED, 429, "rate_limit_exceeded", "rate_limit_error"},
        {REPLY_ECANCELLED, 499, "cancelled", "invalid_request_error"},
        {REPLY_EBUSY, 503, "overloaded", "server_error"},
        {REPLY_EUNAVAIL, 503, "backend_unavailable", "server_error"},
        {REPLY_ENOTFOUND, 404, "not_found", "invalid_request_error"},
        {REPLY_EINTERNAL, 500, "internal_error", "server_error"},
    };
    char hi[] = "hi";
    (void)state;
    /* every value has its row: a new error needs its status decided here */
    assert_int_equal(AR_ARRAY_LEN(want), REPLY_ERROR_COUNT);
    for (size_t i = 0; i < AR_ARRAY_LEN(want); i++) {
        struct reply_result r;
        cJSON *j, *e;
        assert_int_equal(want[i].e, (int)i);
        assert_int_equal(server_status_of_reply_error(want[i].e), want[i].status);
        assert_string_equal(reply_error_code(want[i].e), want[i].code);
        assert_true(strlen(reply_error_str(want[i].e)) > 0);
        assert_string_not_equal(reply_error_str(want[i].e), "unknown error");
        for (size_t k = 0; k < i; k++) { /* codes and descriptions tell the errors apart */
            assert_string_not_equal(reply_error_code(want[k].e), reply_error_code(want[i].e));
            assert_string_not_equal(reply_error_str(want[k].e), reply_error_str(want[i].e));
        }
        /* the item as clients see it, and as reply alone shapes it (no HTTP there) */
        memset(&r, 0, sizeof(r));
        r.err = want[i].e;
        snprintf(r.error, sizeof(r.error), "boom %zu", i);
        r.reply = want[i].e == REPLY_OK ? hi : NULL;
        snprintf(r.lang, sizeof(r.lang), "en");
        j = server_review_result_json(&r, "rid");
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItem(j, "review_id")->valuestring, "rid");
        e = cJSON_GetObjectItem(j, "error");
        if (want[i].e == REPLY_OK) {
            assert_string_equal(cJSON_GetObjectItem(j, "reply")->valuestring, "hi");
            assert_null(e);
            assert_null(cJSON_GetObjectItem(j, "status"));
        } else {
            assert_null(cJSON_GetObjectItem(j, "reply"));
            assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, r.error);
            assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, want[i].code);
            assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, want[i].type);
            assert_int_equal(cJSON_GetObjectItem(j, "status")->valueint, want[i].status);
        }
        cJSON_Delete(j);
        j = reply_result_to_json(&r, NULL);
        assert_non_null(j);
        assert_null(cJSON_GetObjectItem(j, "status"));
        assert_null(cJSON_GetObjectItem(j, "review_id"));
        if (want[i].e != REPLY_OK) {
            e = cJSON_GetObjectItem(j, "error");
            assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, want[i].code);
            assert_null(cJSON_GetObjectItem(e, "type"));
        }
        cJSON_Delete(j);
    }
    /* a value out of range is an internal error, never a success */
    assert_int_equal(server_status_of_reply_error(REPLY_ERROR_COUNT), 500);
    assert_string_equal(reply_error_code(REPLY_ERROR_COUNT), "internal_error");
    assert_string_equal(reply_error_str(REPLY_ERROR_COUNT), "unknown error");
    /* backends: a server out of reach is a 503 (retry), our own failures a 500 */
    assert_int_equal(reply_error_of_backend(AR_OK), REPLY_OK);
    assert_int_equal(reply_error_of_backend(AR_EBUSY), REPLY_EBUSY);
    assert_int_equal(reply_error_of_backend(AR_EUNAVAIL), REPLY_EUNAVAIL);
    assert_int_equal(reply_error_of_backend(AR_ECANCELED), REPLY_ECANCELLED);
    {
        static const enum ar_status other[] = {AR_ENOMEM, AR_EIO,     AR_EFORMAT,
                                               AR_EINVAL, AR_ENOTSUP, AR_ERANGE};
        for (size_t i = 0; i < AR_ARRAY_LEN(other); i++)
            assert_int_equal(reply_error_of_backend(other[i]), REPLY_EINTERNAL);
    }
    assert_int_equal(server_status_of_reply_error(reply_error_of_backend(AR_EUNAVAIL)), 503);
}

/* ---- over HTTP ------------------------------------------------------------------------------ */

/* How many times the head carries the instance header, and its (last) value in buf. */
static int instance_headers(const struct resp *r, char *buf, size_t size)
{
    const char *name = "\r\n" SERVER_INSTANCE_HEADER ":";
    int n = 0;
    buf[0] = '\0';
    for (const char *p = strcasestr(r->head, name); p; p = strcasestr(p + 2, name)) {
        const char *v = p + strlen(name), *e;
        while (*v == ' ')
            v++;
        e = strstr(v, "\r\n");
        snprintf(buf, size, "%.*s", (int)(e ? e - v : (ptrdiff_t)strlen(v)), v);
        n++;
    }
    return n;
}

/* The answer carries the instance header exactly once, naming want. */
static void expect_instance(const struct resp *r, const char *want, const char *what)
{
    char v[300];
    int n = instance_headers(r, v, sizeof(v));
    if (n != 1 || strcmp(v, want) != 0)
        fail_msg("%s (status %d): %d instance headers, last \"%s\", want \"%s\"", what, r->status,
                 n, v, want);
}

/* A JSON request; the answer parsed (NULL when its body is not JSON), r kept for its head. */
static cJSON *request(int port, const char *method, const char *path, const char *json,
                      struct resp *r)
{
    http(port, method, path, json ? "Content-Type: application/json\r\n" : NULL, json,
         json ? strlen(json) : 0, r);
    return cJSON_Parse(r->body);
}

static const char *error_code(const cJSON *j)
{
    const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code");
    return cJSON_IsString(c) ? c->valuestring : "";
}

static void review_errors_reach_clients_with_their_status_and_code(void **state)
{
    struct fx *x = *state;
    struct resp r;
    cJSON *j, *res;
    char v[16];
    j = request(x->port, "POST", "/v1/reviews/reply",
                "{\"shop_id\":\"s1\",\"review_id\":\"e1\",\"text\":\"Love it\",\"rating\":5}", &r);
    assert_int_equal(r.status, 200);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "reply")));
    assert_null(cJSON_GetObjectItem(j, "status"));
    cJSON_Delete(j);
    resp_free(&r);
    /* the same id for another text: a conflict */
    j = request(x->port, "POST", "/v1/reviews/reply",
                "{\"shop_id\":\"s1\",\"review_id\":\"e1\",\"text\":\"Hate it\",\"rating\":1}", &r);
    assert_int_equal(r.status, 409);
    assert_string_equal(error_code(j), "review_id_conflict");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "type")->valuestring,
                        "invalid_request_error");
    assert_int_equal(cJSON_GetObjectItem(j, "status")->valueint, 409);
    assert_string_equal(cJSON_GetObjectItem(j, "review_id")->valuestring, "e1");
    assert_null(resp_header(&r, "Retry-After", v, sizeof(v)));
    cJSON_Delete(j);
    resp_free(&r);
    /* the same text with another rating: a conflict too, never the stored 5-star answer */
    j = request(x->port, "POST", "/v1/reviews/reply",
                "{\"shop_id\":\"s1\",\"review_id\":\"e1\",\"text\":\"Love it\",\"rating\":1}", &r);
    assert_int_equal(r.status, 409);
    assert_string_equal(error_code(j), "review_id_conflict");
    assert_null(cJSON_GetObjectItem(j, "reply"));
    cJSON_Delete(j);
    resp_free(&r);
    /* a bad rating: 400 before the model */
    j = request(x->port, "POST", "/v1/reviews/reply",
                "{\"shop_id\":\"s1\",\"review_id\":\"e2\",\"text\":\"ok\",\"rating\":9}", &r);
    assert_int_equal(r.status, 400);
    assert_string_equal(error_code(j), "invalid_review");
    cJSON_Delete(j);
    resp_free(&r);
    /* a batch: each item its own status and code, the request 200 */
    j = request(
        x->port, "POST", "/v1/reviews/batch",
        "{\"shop_id\":\"s1\",\"reviews\":[{\"review_id\":\"b1\",\"text\":\"好\",\"rating\":5},"
        "{\"review_id\":\"b1\",\"text\":\"好\",\"rating\":5},"
        "{\"review_id\":\"b2\",\"text\":\"好\",\"rating\":0}]}",
        &r);
    assert_int_equal(r.status, 200);
    res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(cJSON_GetArraySize(res), 3);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "reply")));
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "status"));
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 1), "status")->valueint, 409);
    assert_string_equal(error_code(cJSON_GetArrayItem(res, 1)), "duplicate_review_id");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 2), "status")->valueint, 400);
    assert_string_equal(error_code(cJSON_GetArrayItem(res, 2)), "invalid_review");
    cJSON_Delete(j);
    resp_free(&r);
    /* an unknown job */
    j = request(x->port, "GET", "/v1/jobs/0123456789abcdef0123456789abcdef", NULL, &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(error_code(j), "not_found");
    cJSON_Delete(j);
    resp_free(&r);
    assert_int_equal(atomic_load(&x->gen.calls), 2); /* e1 and b1; errors never reach the model */
}

/* A NUL in an id or a text is refused (400) on every review route, in JSON and MessagePack,
 * and nothing is stored or generated for it: cJSON used to cut "victim\\u0000attacker" to shop
 * "victim". */
static void nul_in_ids_and_texts_is_refused_on_every_route(void **state)
{
    struct fx *x = *state;
    struct resp r;
    cJSON *j;
    static const unsigned char mp[] = {0x84, 0xa7, 's',  'h', 'o',  'p', '_', 'i', 'd', 0xa3, 'v',
                                       0x00, 'a',  0xa9, 'r', 'e',  'v', 'i', 'e', 'w', '_',  'i',
                                       'd',  0xa2, 'm',  '1', 0xa4, 't', 'e', 'x', 't', 0xa2, 'o',
                                       'k',  0xa6, 'r',  'a', 't',  'i', 'n', 'g', 0x05};
    static const struct {
        const char *path, *body, *code, *field;
        bool jsonl; /* sent as application/x-ndjson */
    } cases[] = {
        {"/v1/reviews/reply",
         "{\"shop_id\":\"victim\\u0000attacker\",\"review_id\":\"r1\",\"text\":\"Great\","
         "\"rating\":5}",
         "invalid_json", "shop_id", false},
        {"/v1/reviews/batch",
         "{\"shop_id\":\"s1\",\"reviews\":[{\"review_id\":\"b1\",\"text\":\"ok\",\"rating\":5},{"
         "\"review_id\":\"b2\",\"text\":\"bad\\u0000x\",\"rating\":1}]}",
         "invalid_json", "reviews[].text", false},
        {"/v1/jobs",
         "{\"reviews\":[{\"id\":\"j1\",\"shop_id\":\"a\\u0000b\",\"text\":\"ok\",\"rating\":5}]}",
         "invalid_request", "shop_id", false},
        {"/v1/jobs",
         "{\"id\":\"j1\",\"text\":\"ok\",\"rating\":5}\n{\"id\":\"j2\\u0000x\",\"text\":\"ok\","
         "\"rating\":5}\n",
         "invalid_request", "line 2", true},
        {"/v1/jobs",
         "{\"jsonl\": "
         "\"{\\\"id\\\":\\\"j3\\\",\\\"text\\\":\\\"a\\\\u0000b\\\",\\\"rating\\\":5}\\n\"}",
         "invalid_request", "line 1", false},
        {"/v1/jobs",
         "[{\"id\":\"j4\",\"text\":\"ok\",\"rating\":5},{\"id\":\"j5\",\"text\":\"x\\u0000\","
         "\"rating\":5}]",
         "invalid_request", "[].text", false},
    };
    for (size_t i = 0; i < AR_ARRAY_LEN(cases); i++) {
        const cJSON *m;
        if (cases[i].jsonl) {
            http(x->port, "POST", cases[i].path, "Content-Type: application/x-ndjson\r\n",
                 cases[i].body, strlen(cases[i].body), &r);
            j = cJSON_Parse(r.body);
        } else {
            j = request(x->port, "POST", cases[i].path, cases[i].body, &r);
        }
        if (r.status != 400)
            fail_msg("case %zu: status %d: %s", i, r.status, r.body);
        assert_string_equal(error_code(j), cases[i].code);
        m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
        assert_true(cJSON_IsString(m));
        if (!strstr(m->valuestring, cases[i].field) || !strstr(m->valuestring, "NUL"))
            fail_msg("case %zu: message \"%s\" does not name %s", i, m->valuestring,
                     cases[i].field);
        cJSON_Delete(j);
        resp_free(&r);
    }
    http(x->port, "POST", "/v1/reviews/reply", "Content-Type: application/msgpack\r\n", mp,
         sizeof(mp), &r);
    assert_int_equal(r.status, 400);
    resp_free(&r);
    assert_int_equal(atomic_load(&x->gen.calls), 0);
    /* nothing was stored under the cut id: another text for shop "victim", id "r1" is new */
    j = request(
        x->port, "POST", "/v1/reviews/reply",
        "{\"shop_id\":\"victim\",\"review_id\":\"r1\",\"text\":\"Other words\",\"rating\":5}", &r);
    assert_int_equal(r.status, 200);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "reply")));
    cJSON_Delete(j);
    resp_free(&r);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
}

/* Under a token limit, a batch whose items were refused for the caller's budget answers 200
 * with per-item 429s and a Retry-After, and each refusal counts in
 * autoreply_rejected_total{reason="rate_limit"}, as a refused /v1/reviews/reply does. */
static void rate_limited_batch_items_carry_retry_after_and_are_counted(void **state)
{
    struct fx *x = *state;
    struct server_params sp = server_default_params();
    struct server *s = NULL;
    struct ar_err err = {0};
    const char *series = "autoreply_rejected_total{reason=\"rate_limit\"}";
    char ra[16], body[2048];
    struct resp r;
    cJSON *j, *res;
    int port, n_limited = 0, n = 0;
    double before;
    /* no limit: no Retry-After on a batch */
    j = request(
        x->port, "POST", "/v1/reviews/batch",
        "{\"shop_id\":\"s1\",\"reviews\":[{\"review_id\":\"n1\",\"text\":\"ok\",\"rating\":5}]}",
        &r);
    assert_int_equal(r.status, 200);
    assert_null(resp_header(&r, "Retry-After", ra, sizeof(ra)));
    cJSON_Delete(j);
    resp_free(&r);

    sp.host = "127.0.0.1";
    sp.port = 0;
    sp.model_name = "demo";
    sp.instance_name = "tpm";
    sp.rate_tpm = 150; /* the fake charges a token per byte of the user turn: about one review */
    if (server_create(&sp, &s, &err) != AR_OK)
        fail_msg("server_create: %s", err.msg);
    assert_int_equal(server_reviews_attach(s, x->svc, NULL), AR_OK);
    if (server_start(s, &err) != AR_OK)
        fail_msg("server_start: %s", err.msg);
    server_set_engine(s, g_eng, g_model, g_tok);
    port = server_port(s);
    before = metric(port, series);
    n += snprintf(body, sizeof(body), "{\"shop_id\":\"tpm\",\"reviews\":[");
    for (int i = 0; i < 5; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n,
                      "%s{\"review_id\":\"t%d\",\"text\":\"Review number %d: the parcel came "
                      "late and the box was torn open, but the phone itself works fine.\","
                      "\"rating\":3}",
                      i ? "," : "", i, i);
    snprintf(body + n, sizeof(body) - (size_t)n, "]}");
    j = request(port, "POST", "/v1/reviews/batch", body, &r);
    assert_int_equal(r.status, 200);
    res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(cJSON_GetArraySize(res), 5);
    for (int i = 0; i < 5; i++) {
        const cJSON *it = cJSON_GetArrayItem(res, i), *st = cJSON_GetObjectItem(it, "status");
        if (st && st->valueint == 429) {
            assert_string_equal(error_code(it), "rate_limit_exceeded");
            n_limited++;
        } else {
            assert_true(cJSON_IsString(cJSON_GetObjectItem(it, "reply")));
        }
    }
    if (n_limited < 1 || n_limited > 4)
        fail_msg("%d of 5 items refused under a budget of about one", n_limited);
    assert_non_null(resp_header(&r, "Retry-After", ra, sizeof(ra)));
    assert_true(atoi(ra) >= 1);
    cJSON_Delete(j);
    resp_free(&r);
    assert_true(metric(port, series) == before + n_limited);
    /* a single review refused for the budget counts as one */
    j = request(port, "POST", "/v1/reviews/reply",
                "{\"shop_id\":\"tpm\",\"review_id\":\"t9\",\"text\":\"Another long review of the "
                "same phone, with more words so that it costs tokens.\",\"rating\":4}",
                &r);
    assert_int_equal(r.status, 429);
    assert_string_equal(error_code(j), "rate_limit_exceeded");
    assert_non_null(resp_header(&r, "Retry-After", ra, sizeof(ra)));
    cJSON_Delete(j);
    resp_free(&r);
    assert_true(metric(port, series) == before + n_limited + 1);
    server_stop(s, 5);
    server_destroy(s);
}

static void every_response_names_the_instance(void **state)
{
    struct fx *x = *state;
    struct resp r;
    cJSON *j;
    char path[96], ct[64];
    const char *stream_body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                              "\"max_tokens\":2,\"stream\":true}";
    /* a normal answer */
    j = request(x->port, "POST", "/v1/reviews/reply",
                "{\"shop_id\":\"s1\",\"review_id\":\"i1\",\"text\":\"Nice\",\"rating\":5}", &r);
    assert_int_equal(r.status, 200);
    expect_instance(&r, INSTANCE, "review answer");
    cJSON_Delete(j);
    resp_free(&r);
    /* an error of the product and errors of the HTTP core */
    j = request(x->port, "POST", "/v1/reviews/reply", "{\"shop_id\":\"s1\",\"rating\":5}", &r);
    assert_int_equal(r.status, 400);
    expect_instance(&r, INSTANCE, "bad review");
    cJSON_Delete(j);
    resp_free(&r);
    http(x->port, "GET", "/no/such/route", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    expect_instance(&r, INSTANCE, "404");
    resp_free(&r);
    http(x->port, "DELETE", "/v1/reviews/reply", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 405);
    expect_instance(&r, INSTANCE, "405");
    resp_free(&r);
    {
        /* answered from the headers, before the body is read */
        size_t big = (2u << 20);
        char *body = malloc(big);
        memset(body, ' ', big);
        http(x->port, "POST", "/v1/reviews/reply", "Content-Type: application/json\r\n", body, big,
             &r);
        free(body);
        assert_int_equal(r.status, 413);
        expect_instance(&r, INSTANCE, "413");
        resp_free(&r);
    }
    /* text answers: metrics, a job's JSONL */
    http(x->port, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    expect_instance(&r, INSTANCE, "metrics");
    resp_free(&r);
    {
        const char *line =
            "{\"shop_id\":\"s1\",\"review_id\":\"j1\",\"text\":\"好\",\"rating\":5}\n";
        http(x->port, "POST", "/v1/jobs", "Content-Type: application/x-ndjson\r\n", line,
             strlen(line), &r);
    }
    assert_int_equal(r.status, 202);
    expect_instance(&r, INSTANCE, "job created");
    j = cJSON_Parse(r.body);
    snprintf(path, sizeof(path), "/v1/jobs/%s/results", cJSON_GetObjectItem(j, "id")->valuestring);
    cJSON_Delete(j);
    resp_free(&r);
    http(x->port, "GET", path, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(resp_header(&r, "Content-Type", ct, sizeof(ct)), "application/x-ndjson");
    expect_instance(&r, INSTANCE, "job results");
    resp_free(&r);
    /* a stream */
    http(x->port, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n", stream_body,
         strlen(stream_body), &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(resp_header(&r, "Content-Type", ct, sizeof(ct)), "text/event-stream");
    assert_non_null(strstr(r.body, "data: [DONE]"));
    expect_instance(&r, INSTANCE, "stream");
    resp_free(&r);
    /* 503s of a server still loading (its own name) */
    {
        int port;
        struct server *s = start_server(x, "loading-2", false, NULL, &port);
        char v[16];
        http(port, "GET", "/health", NULL, NULL, 0, &r);
        assert_int_equal(r.status, 503);
        assert_non_null(resp_header(&r, "Retry-After", v, sizeof(v)));
        expect_instance(&r, "loading-2", "health while loading");
        resp_free(&r);
        j = request(port, "POST", "/v1/reviews/reply",
                    "{\"shop_id\":\"s1\",\"review_id\":\"i2\",\"text\":\"Nice\",\"rating\":5}", &r);
        assert_int_equal(r.status, 503);
        assert_string_equal(error_code(j), "loading");
        expect_instance(&r, "loading-2", "review while loading");
        cJSON_Delete(j);
        resp_free(&r);
        server_stop(s, 1);
        server_destroy(s);
    }
}

static void default_instance_name_is_the_host_and_port(void **state)
{
    struct fx *x = *state;
    char host[256], want[300];
    struct resp r;
    cJSON *j;
    int port;
    struct server *s = start_server(x, NULL, false, NULL, &port);
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    host[sizeof(host) - 1] = '\0';
    snprintf(want, sizeof(want), "%s:%d", host, port);
    assert_string_equal(server_instance_name(s), want);
    http(port, "GET", "/health", NULL, NULL, 0, &r);
    expect_instance(&r, want, "default name");
    j = cJSON_Parse(r.body);
    assert_string_equal(cJSON_GetObjectItem(j, "instance")->valuestring, want);
    cJSON_Delete(j);
    resp_free(&r);
    server_stop(s, 1);
    server_destroy(s);
    /* a named one is named before it starts, the default only once the port is bound */
    assert_string_equal(server_instance_name(x->srv), INSTANCE);
}

static void bad_instance_names_are_refused(void **state)
{
    char longest[SERVER_INSTANCE_NAME_MAX + 1], too_long[SERVER_INSTANCE_NAME_MAX + 2];
    const char *bad[] = {"",          " lead",       "trail ", "a\r\nX-Evil: 1",
                         "tab\there", "caf\xc3\xa9", too_long};
    struct server_params sp = server_default_params();
    struct server *s;
    struct ar_err err = {0};
    struct resp r;
    (void)state;
    memset(longest, 'n', sizeof(longest) - 1);
    longest[sizeof(longest) - 1] = '\0';
    memset(too_long, 'n', sizeof(too_long) - 1);
    too_long[sizeof(too_long) - 1] = '\0';
    sp.port = 0;
    for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
        s = (struct server *)1;
        sp.instance_name = bad[i];
        assert_int_equal(server_create(&sp, &s, &err), AR_EINVAL);
        assert_null(s);
        assert_non_null(strstr(err.msg, "instance name"));
    }
    /* the longest allowed, with inner spaces and punctuation, goes out as given */
    longest[3] = ' ';
    longest[4] = '#';
    sp.instance_name = longest;
    assert_int_equal(server_create(&sp, &s, &err), AR_OK);
    assert_int_equal(server_start(s, &err), AR_OK);
    http(server_port(s), "GET", "/health", NULL, NULL, 0, &r);
    expect_instance(&r, longest, "longest name");
    resp_free(&r);
    server_destroy(s);
}

/* ---- health --------------------------------------------------------------------------------- */

struct fake_backend {
    atomic_int state; /* what the check says */
    atomic_int calls;
};

static int fake_check(void *user)
{
    struct fake_backend *b = user;
    atomic_fetch_add(&b->calls, 1);
    return atomic_load(&b->state);
}

/* GET /health: the status code, body["status"] into st, body["backends"][name] into be (""
 * when absent); returns the number of members of "backends" (-1 without it). */
static int health(int port, int *code, char *st, const char *name, char *be)
{
    struct resp r;
    cJSON *j, *b, *v;
    int n;
    http(port, "GET", "/health", NULL, NULL, 0, &r);
    *code = r.status;
    j = cJSON_Parse(r.body);
    assert_non_null(j);
    snprintf(st, 32, "%s", cJSON_GetObjectItem(j, "status")->valuestring);
    b = cJSON_GetObjectItem(j, "backends");
    v = name ? cJSON_GetObjectItem(b, name) : NULL;
    snprintf(be, 32, "%s", cJSON_IsString(v) ? v->valuestring : "");
    n = b ? cJSON_GetArraySize(b) : -1;
    assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "instance")));
    cJSON_Delete(j);
    resp_free(&r);
    return n;
}

static void health_reports_backends_and_stays_in_rotation(void **state)
{
    struct fx *x = *state;
    struct fake_backend redis = {SERVER_HEALTH_OK, 0}, pg = {SERVER_HEALTH_OK, 0};
    char st[32], be[32], longest[64];
    int code, n;
    /* no checks: today's answer */
    n = health(x->port, &code, st, NULL, be);
    assert_int_equal(code, 200);
    assert_string_equal(st, "ok");
    assert_int_equal(n, -1);
    assert_int_equal(server_add_health_check(x->srv, "redis", fake_check, &redis), AR_OK);
    assert_int_equal(server_add_health_check(x->srv, "postgres", fake_check, &pg), AR_OK);
    n = health(x->port, &code, st, "redis", be);
    assert_int_equal(code, 200);
    assert_string_equal(st, "ok");
    assert_string_equal(be, "ok");
    assert_int_equal(n, 2);
    assert_int_equal(atomic_load(&redis.calls), 1); /* asked on each request, once */
    assert_int_equal(atomic_load(&pg.calls), 1);
    /* one backend down: degraded, still 200, and the instance still answers */
    atomic_store(&redis.state, SERVER_HEALTH_DOWN);
    n = health(x->port, &code, st, "redis", be);
    assert_int_equal(code, 200);
    assert_string_equal(st, "degraded");
    assert_string_equal(be, "down");
    health(x->port, &code, st, "postgres", be);
    assert_string_equal(be, "ok");
    {
        struct resp r;
        cJSON *j =
            request(x->port, "POST", "/v1/reviews/reply",
                    "{\"shop_id\":\"s1\",\"review_id\":\"h1\",\"text\":\"Nice\",\"rating\":5}", &r);
        assert_int_equal(r.status, 200);
        cJSON_Delete(j);
        resp_free(&r);
    }
    atomic_store(&redis.state, SERVER_HEALTH_DEGRADED);
    health(x->port, &code, st, "redis", be);
    assert_int_equal(code, 200);
    assert_string_equal(st, "degraded");
    assert_string_equal(be, "degraded");
    atomic_store(&redis.state, 42); /* not a state: counted as down */
    health(x->port, &code, st, "redis", be);
    assert_string_equal(st, "degraded");
    assert_string_equal(be, "down");
    atomic_store(&redis.state, SERVER_HEALTH_OK);
    health(x->port, &code, st, "redis", be);
    assert_int_equal(code, 200);
    assert_string_equal(st, "ok");
    assert_string_equal(be, "ok");
    /* names: unique, 1..63 of [A-Za-z0-9_.-]; a check function is required */
    assert_int_equal(server_add_health_check(x->srv, "redis", fake_check, &redis), AR_EINVAL);
    assert_int_equal(server_add_health_check(x->srv, "", fake_check, &redis), AR_EINVAL);
    assert_int_equal(server_add_health_check(x->srv, NULL, fake_check, &redis), AR_EINVAL);
    assert_int_equal(server_add_health_check(x->srv, "two words", fake_check, &redis), AR_EINVAL);
    assert_int_equal(server_add_health_check(x->srv, "q\"uote", fake_check, &redis), AR_EINVAL);
    assert_int_equal(server_add_health_check(x->srv, "amqp", NULL, &redis), AR_EINVAL);
    memset(longest, 'b', 63);
    longest[63] = '\0';
    assert_int_equal(server_add_health_check(x->srv, longest, fake_check, &pg), AR_OK);
    {
        char too_long[65];
        memset(too_long, 'c', 64);
        too_long[64] = '\0';
        assert_int_equal(server_add_health_check(x->srv, too_long, fake_check, &pg), AR_EINVAL);
    }
    n = health(x->port, &code, st, longest, be);
    assert_int_equal(n, 3);
    assert_string_equal(be, "ok");
    /* still loading: 503 "loading" whatever the backends say, and they are shown */
    {
        int port;
        struct server *s = start_server(x, "loading-3", false, NULL, &port);
        atomic_store(&redis.state, SERVER_HEALTH_DOWN);
        assert_int_equal(server_add_health_check(s, "redis", fake_check, &redis), AR_OK);
        n = health(port, &code, st, "redis", be);
        assert_int_equal(code, 503);
        assert_string_equal(st, "loading");
        assert_string_equal(be, "down");
        assert_int_equal(n, 1);
        server_stop(s, 1);
        server_destroy(s);
    }
}

/* ---- cache classes over HTTP --------------------------------------------------------------- */

#define CC_WARM 30  /* reviews customers keep asking about */
#define CC_JOB 2000 /* a backfill of distinct other reviews */
#define CC_BYTES (64 << 10)

static struct cache *one_shard_cache(size_t bytes)
{
    struct cache_memory_params cp = cache_memory_default_params();
    struct cache *c = NULL;
    cp.max_bytes = bytes;
    cp.n_shards = 1;
    assert_int_equal(cache_memory_create(&cp, &c), AR_OK);
    return c;
}

/* Asks the warm reviews under new ids over HTTP; the share the cache answered, read from the
 * interactive class's counters on /metrics (which must count every lookup once). */
static double http_warm_round(struct fx *x, const char *tag)
{
    const char *hits = "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l1\"}";
    const char *misses = "autoreply_reply_cache_misses_total{class=\"interactive\"}";
    double h0 = metric(x->port, hits), m0 = metric(x->port, misses), dh;
    for (int i = 0; i < CC_WARM; i++) {
        char body[256];
        int status = 0;
        cJSON *j;
        snprintf(body, sizeof(body),
                 "{\"shop_id\":\"cc\",\"review_id\":\"%s-%d\",\"rating\":5,\"text\":\"Warm "
                 "review %d: the teapot pours well.\"}",
                 tag, i, i);
        j = post_json(x->port, "/v1/reviews/reply", NULL, body, &status);
        assert_int_equal(status, 200);
        cJSON_Delete(j);
    }
    dh = metric(x->port, hits) - h0;
    assert_true(dh + (metric(x->port, misses) - m0) == CC_WARM);
    return dh / CC_WARM;
}

/* The test over HTTP: warm the interactive cache through /v1/reviews/reply, run a job of
 * thousands of distinct reviews through POST /v1/jobs and the background runner, and the hit
 * ratio of the same reviews asked again stays where it was; /metrics counts each class's
 * lookups exactly. */
static void a_large_job_over_http_leaves_the_interactive_hit_ratio(void **state)
{
    struct fx *x = *state;
    struct reply_service_params p = reply_service_default_params();
    size_t cap = (size_t)CC_JOB * 128, off = 0;
    char *body = malloc(cap), path[128];
    double before, after;
    struct resp r;
    cJSON *j;
    /* the fixture's service again, over two small caches, one per class */
    server_stop(x->srv, 5);
    reply_service_destroy(x->svc);
    server_destroy(x->srv);
    cache_destroy(x->cache);
    x->cache = one_shard_cache(CC_BYTES);
    x->bulk_cache = one_shard_cache(CC_BYTES);
    p.profiles = x->profiles;
    p.store = x->store;
    p.cache = x->cache;
    p.bulk_cache = x->bulk_cache;
    p.metrics = x->metrics;
    p.gen = &x->gen.base;
    p.n_workers = 4;
    assert_int_equal(reply_service_create(&p, &x->svc), AR_OK);
    x->srv = start_server(x, INSTANCE, true, x->metrics, &x->port);
    assert_int_equal(reply_jobs_start(x->svc), AR_OK);

    assert_true(http_warm_round(x, "w0") == 0.0);
    before = http_warm_round(x, "w1");
    assert_true(before == 1.0);

    assert_non_null(body);
    for (int i = 0; i < CC_JOB; i++)
        off += (size_t)snprintf(body + off, cap - off,
                                "{\"shop_id\":\"cc\",\"review_id\":\"job-%d\",\"rating\":5,"
                                "\"text\":\"Backfill review %d: the blanket is soft.\"}\n",
                                i, i);
    assert_true(off < cap);
    http(x->port, "POST", "/v1/jobs", "Content-Type: application/x-ndjson\r\n", body, off, &r);
    free(body);
    assert_int_equal(r.status, 202);
    j = cJSON_Parse(r.body);
    snprintf(path, sizeof(path), "/v1/jobs/%s", cJSON_GetObjectItem(j, "id")->valuestring);
    cJSON_Delete(j);
    resp_free(&r);
    for (int i = 0;; i++) {
        const cJSON *st;
        bool done;
        http(x->port, "GET", path, NULL, NULL, 0, &r);
        assert_int_equal(r.status, 200);
        j = cJSON_Parse(r.body);
        st = cJSON_GetObjectItem(j, "status");
        done = cJSON_IsString(st) && strcmp(st->valuestring, "done") == 0;
        if (!done && i >= 1200)
            fail_msg("job not done after 60 s: %s", r.body);
        cJSON_Delete(j);
        resp_free(&r);
        if (done)
            break;
        usleep(50 * 1000);
    }
    /* every job line was a bulk lookup that missed (distinct texts) ... */
    assert_true(metric(x->port, "autoreply_reply_cache_misses_total{class=\"bulk\"}") == CC_JOB);
    assert_true(metric(x->port, "autoreply_reply_cache_hits_total{class=\"bulk\",level=\"l1\"}") ==
                0);
    /* ... pushed its replies through the small bulk budget, and none of the interactive ones */
    assert_true(metric(x->port, "autoreply_reply_cache_evictions_total{class=\"bulk\"}") > 0);
    assert_true(metric(x->port, "autoreply_reply_cache_evictions_total{class=\"interactive\"}") ==
                0);
    after = http_warm_round(x, "w2");
    assert_true(after == before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(handlers_answer_reviews_batches_and_jobs),
        T(rate_limited_review_over_the_handler_is_a_429),
        cmocka_unit_test(every_reply_error_maps_to_one_status_and_code),
        T(review_errors_reach_clients_with_their_status_and_code),
        T(nul_in_ids_and_texts_is_refused_on_every_route),
        T(rate_limited_batch_items_carry_retry_after_and_are_counted),
        T(every_response_names_the_instance),
        T(default_instance_name_is_the_host_and_port),
        cmocka_unit_test(bad_instance_names_are_refused),
        T(health_reports_backends_and_stays_in_rotation),
        T(a_large_job_over_http_leaves_the_interactive_hit_ratio),
#undef T
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
