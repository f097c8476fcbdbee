/* server_test.c - the HTTP server end to end: a real server on 127.0.0.1 (ephemeral port) over
 * the demo model, driven by the small socket client of tests/harness/http_client.h. Checks that
 * HTTP does not change what the engine computes (concurrency, streaming, prefix cache, JSON vs
 * MessagePack, all against the engine called directly or the server's own single-request
 * answers), and the protective behaviour: 4xx shapes, auth, rate limits, overload, body limit,
 * slow clients, cancellation of clients that leave. */
#include "harness/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>

#define TH_HTTP_RECV_TIMEOUT_S 20
#define TH_HTTP_WHOLE_BODY
#include "harness/http_client.h"

#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

static struct model *g_model;
static struct tokenizer *g_tok;
static struct engine *g_eng; /* prefix cache on, 8 parallel */
static struct server *g_srv;
static int g_port;

/* ---- time and JSON answers ------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *jstr(const cJSON *j, const char *path)
{
    /* dotted path with numeric components for arrays: "choices.0.text" */
    char buf[128], *save = NULL, *tok;
    snprintf(buf, sizeof(buf), "%s", path);
    for (tok = strtok_r(buf, ".", &save); tok && j; tok = strtok_r(NULL, ".", &save))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(tok)) : cJSON_GetObjectItem(j, tok);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static double jnum(const cJSON *j, const char *path)
{
    char buf[128], *save = NULL, *tok;
    snprintf(buf, sizeof(buf), "%s", path);
    for (tok = strtok_r(buf, ".", &save); tok && j; tok = strtok_r(NULL, ".", &save))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(tok)) : cJSON_GetObjectItem(j, tok);
    return cJSON_IsNumber(j) ? j->valuedouble : (double)NAN;
}

/* ---- fixtures ------------------------------------------------------------------------------- */

static struct engine *make_engine(int n_seq, int queue, bool prefix_cache)
{
    struct engine_params ep = engine_default_params();
    struct engine *e = NULL;
    struct ar_err err = {0};
    ep.n_threads = 1;
    ep.n_seq_max = n_seq;
    ep.queue_max = queue;
    ep.kv_tokens = 4096;
    ep.prefix_cache = prefix_cache;
    if (engine_create(g_model, g_tok, &ep, &e, &err) != AR_OK)
        fail_msg("engine_create: %s", err.msg);
    return e;
}

static struct server *make_server(struct server_params *sp, struct engine *e, int *port)
{
    struct server *s = NULL;
    struct ar_err err = {0};
    sp->host = "127.0.0.1";
    sp->port = 0;
    sp->model_name = "demo";
    if (server_create(sp, &s, &err) != AR_OK || server_start(s, &err) != AR_OK)
        fail_msg("server: %s", err.msg);
    if (e)
        server_set_engine(s, e, g_model, g_tok);
    *port = server_port(s);
    assert_true(*port > 0);
    return s;
}

static int group_setup(void **state)
{
    char path[512];
    struct ar_err err = {0};
    struct server_params sp = server_default_params();
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    ar_log_set_level(AR_LOG_WARN);
    if (model_load(th_shared_path(path, sizeof(path), "models/autoreply-demo-q8_0.gguf"), &g_model,
                   &err) != AR_OK)
        return -1;
    if (tokenizer_load(model_gguf(g_model), &g_tok, &err) != AR_OK)
        return -1;
    g_eng = make_engine(8, 64, true);
    g_srv = make_server(&sp, g_eng, &g_port);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    server_stop(g_srv, 5);
    engine_destroy(g_eng);
    server_destroy(g_srv);
    tokenizer_destroy(g_tok);
    model_destroy(g_model);
    return 0;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void health_says_loading_until_the_engine_is_set(void **state)
{
    struct server_params sp = server_default_params();
    struct resp r;
    char v[32];
    int port;
    struct server *s = make_server(&sp, NULL, &port);
    (void)state;
    http(port, "GET", "/health", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "\"loading\""));
    assert_non_null(resp_header(&r, "Retry-After", v, sizeof(v)));
    resp_free(&r);
    http(port, "POST", "/v1/completions", "Content-Type: application/json\r\n", "{}", 2, &r);
    assert_int_equal(r.status, 503);
    resp_free(&r);
    server_set_engine(s, g_eng, g_model, g_tok);
    http(port, "GET", "/health", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"ok\""));
    resp_free(&r);
    http(port, "GET", "/v1/models", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"demo\""));
    resp_free(&r);
    server_destroy(s);
}

static const char *const prompts[8] = {
    "The food was great and",     "Delivery was late, but",     "I love this shop because",
    "The package arrived broken", "Thanks for the quick reply", "Terrible service, never",
    "The noodles were cold",      "Five stars for the staff",
};

static char *complete_text(int port, const char *prompt, int max_tokens)
{
    char body[512];
    int status;
    cJSON *j;
    char *t;
    snprintf(body, sizeof(body),
             "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}", prompt,
             max_tokens);
    j = post_json(port, "/v1/completions", NULL, body, &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(j, "object"), "text_completion");
    assert_non_null(jstr(j, "choices.0.text"));
    assert_true(jnum(j, "usage.completion_tokens") == max_tokens);
    assert_true(jnum(j, "usage.total_tokens") ==
                jnum(j, "usage.prompt_tokens") + jnum(j, "usage.completion_tokens"));
    t = strdup(jstr(j, "choices.0.text"));
    cJSON_Delete(j);
    return t;
}

/* The engine called directly, without HTTP: the reference text for one prompt. */
struct direct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    char text[4096];
};

static void direct_done(void *user, const struct engine_result *res)
{
    struct direct *d = user;
    pthread_mutex_lock(&d->mu);
    snprintf(d->text, sizeof(d->text), "%.*s", (int)res->text_len, res->text);
    d->done = true;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static void engine_text(const char *prompt, int max_tokens, char *out, size_t size)
{
    struct direct d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct engine_request er = {0};
    int32_t *ids = NULL;
    int64_t n = 0;
    uint64_t id;
    assert_int_equal(tokenizer_encode(g_tok, prompt, strlen(prompt), true, true, &ids, &n), AR_OK);
    er.prompt = ids;
    er.n_prompt = (int)n;
    er.max_tokens = max_tokens;
    er.sampling = sampler_default_params();
    er.sampling.temperature = 0;
    er.ignore_eos = true;
    er.on_done = direct_done;
    er.user = &d;
    assert_int_equal(engine_submit(g_eng, &er, &id), AR_OK);
    pthread_mutex_lock(&d.mu);
    while (!d.done)
        pthread_cond_wait(&d.cv, &d.mu);
    pthread_mutex_unlock(&d.mu);
    ar_free(ids);
    snprintf(out, size, "%s", d.text);
}

struct par_arg {
    int idx;
    char *text;
};

static void *par_main(void *p)
{
    struct par_arg *a = p;
    a->text = complete_text(g_port, prompts[a->idx], 24);
    return NULL;
}

static void concurrent_greedy_outputs_equal_single_requests(void **state)
{
    char *single[8];
    char ref[4096];
    pthread_t th[8];
    struct par_arg args[8];
    (void)state;
    for (int i = 0; i < 8; i++)
        single[i] = complete_text(g_port, prompts[i], 24);
    engine_text(prompts[0], 24, ref, sizeof(ref));
    assert_string_equal(single[0], ref);
    for (int i = 0; i < 8; i++) {
        args[i].idx = i;
        pthread_create(&th[i], NULL, par_main, &args[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        assert_string_equal(args[i].text, single[i]);
        free(args[i].text);
        free(single[i]);
    }
}

static void sse_stream_assembles_to_the_whole_text(void **state)
{
    const char *base = "{\"messages\":[{\"role\":\"user\",\"content\":\"The soup was salty.\"}],"
                       "\"max_tokens\":32,\"temperature\":0,\"ignore_eos\":true";
    char body[512], ct[64];
    struct resp r;
    cJSON *j;
    int status, n_events = 0;
    char whole[4096], streamed[4096] = "", finish[16] = "";
    bool done = false;
    (void)state;
    snprintf(body, sizeof(body), "%s}", base);
    j = post_json(g_port, "/v1/chat/completions", NULL, body, &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(j, "object"), "chat.completion");
    assert_string_equal(jstr(j, "choices.0.message.role"), "assistant");
    assert_string_equal(jstr(j, "choices.0.finish_reason"), "length");
    snprintf(whole, sizeof(whole), "%s", jstr(j, "choices.0.message.content"));
    cJSON_Delete(j);

    snprintf(body, sizeof(body), "%s,\"stream\":true}", base);
    http(g_port, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n", body,
         strlen(body), &r);
    assert_int_equal(r.status, 200);
    assert_non_null(resp_header(&r, "Content-Type", ct, sizeof(ct)));
    assert_string_equal(ct, "text/event-stream");
    for (char *ev = r.body; ev && *ev;) {
        char *end = strstr(ev, "\n\n");
        assert_non_null(end);
        *end = '\0';
        assert_memory_equal(ev, "data: ", 6);
        assert_false(done); /* nothing after [DONE] */
        if (!strcmp(ev + 6, "[DONE]")) {
            done = true;
        } else {
            cJSON *c = cJSON_Parse(ev + 6);
            const char *piece;
            assert_non_null(c);
            assert_string_equal(jstr(c, "object"), "chat.completion.chunk");
            if ((piece = jstr(c, "choices.0.delta.content")))
                strncat(streamed, piece, sizeof(streamed) - strlen(streamed) - 1);
            if (jstr(c, "choices.0.finish_reason"))
                snprintf(finish, sizeof(finish), "%s", jstr(c, "choices.0.finish_reason"));
            cJSON_Delete(c);
            n_events++;
        }
        ev = end + 2;
    }
    assert_true(done);
    assert_true(n_events >= 3);
    assert_string_equal(streamed, whole);
    assert_string_equal(finish, "length");
    resp_free(&r);
}

static void client_leaving_mid_stream_frees_its_kv(void **state)
{
    struct server_params sp = server_default_params();
    struct engine *e = make_engine(2, 8, false);
    int port, fd;
    struct server *s = make_server(&sp, e, &port);
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":480,\"temperature\":0,"
                       "\"ignore_eos\":true,\"stream\":true}";
    char req[512], buf[8192];
    size_t got = 0;
    double base_used, gen0, t0;
    int n_data = 0;
    (void)state;
    base_used = metric(port, "autoreply_kv_blocks_used");
    gen0 = metric(port, "autoreply_generation_tokens_total");
    assert_true(base_used == 0);
    fd = connect_port(port);
    snprintf(req, sizeof(req),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    assert_true(send_all(fd, req, strlen(req)));
    /* wait for two tokens' events, then hang up */
    while (n_data < 2 && got < sizeof(buf) - 1) {
        ssize_t k = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
        assert_true(k > 0);
        got += (size_t)k;
        buf[got] = '\0';
        n_data = 0;
        for (char *p = strstr(buf, "data: "); p; p = strstr(p + 6, "data: "))
            n_data++;
    }
    assert_true(metric(port, "autoreply_kv_blocks_used") > 0);
    close(fd);
    t0 = now_s();
    while (metric(port, "autoreply_kv_blocks_used") != base_used && now_s() - t0 < 10)
        usleep(20000);
    assert_true(metric(port, "autoreply_kv_blocks_used") == base_used);
    /* it was cancelled, not finished */
    assert_true(metric(port, "autoreply_generation_tokens_total") - gen0 < 480);
    server_stop(s, 1);
    engine_destroy(e);
    server_destroy(s);
}

struct load_arg {
    int port;
    int status;
    bool retry_after;
    char code[32];
};

static void *load_main(void *p)
{
    struct load_arg *a = p;
    struct resp r;
    char v[32];
    const char *body = "{\"prompt\":\"Hello there\",\"max_tokens\":200,\"temperature\":0,"
                       "\"ignore_eos\":true}";
    cJSON *j;
    http(a->port, "POST", "/v1/completions", "Content-Type: application/json\r\n", body,
         strlen(body), &r);
    a->status = r.status;
    a->retry_after = resp_header(&r, "Retry-After", v, sizeof(v)) && atoi(v) >= 1;
    j = cJSON_Parse(r.body);
    if (j && jstr(j, "error.code"))
        snprintf(a->code, sizeof(a->code), "%s", jstr(j, "error.code"));
    cJSON_Delete(j);
    resp_free(&r);
    return NULL;
}

static void overload_answers_503_with_retry_after(void **state)
{
    struct server_params sp = server_default_params();
    struct engine *e = make_engine(1, 1, false);
    int port, n_ok = 0, n_busy = 0;
    struct server *s = make_server(&sp, e, &port);
    pthread_t th[12];
    struct load_arg a[12];
    struct resp r;
    (void)state;
    for (int i = 0; i < 12; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].port = port;
        pthread_create(&th[i], NULL, load_main, &a[i]);
    }
    for (int i = 0; i < 12; i++) {
        pthread_join(th[i], NULL);
        if (a[i].status == 200) {
            n_ok++;
        } else {
            assert_int_equal(a[i].status, 503);
            assert_true(a[i].retry_after);
            assert_string_equal(a[i].code, "queue_full");
            n_busy++;
        }
    }
    assert_true(n_ok >= 1);
    assert_true(n_busy >= 1);
    assert_true(metric(port, "autoreply_rejected_total{reason=\"queue_full\"}") == n_busy);
    http(port, "GET", "/health", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    server_stop(s, 1);
    engine_destroy(e);
    server_destroy(s);
}

static void rate_limits_answer_429_with_retry_after(void **state)
{
    struct server_params sp = server_default_params();
    struct server *s;
    struct resp r;
    char v[32];
    int port, status;
    cJSON *j;
    (void)state;
    /* requests per second: a burst of 2, then 429 */
    sp.rate_rps = 0.5;
    sp.rate_burst = 2;
    s = make_server(&sp, g_eng, &port);
    for (int i = 0; i < 2; i++) {
        http(port, "GET", "/v1/models", NULL, NULL, 0, &r);
        assert_int_equal(r.status, 200);
        resp_free(&r);
    }
    http(port, "GET", "/v1/models", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 429);
    assert_non_null(resp_header(&r, "Retry-After", v, sizeof(v)));
    assert_true(atoi(v) >= 1 && atoi(v) <= 2); /* one request at 0.5/s */
    assert_non_null(strstr(r.body, "rate_limit_exceeded"));
    resp_free(&r);
    http(port, "GET", "/health", NULL, NULL, 0, &r); /* not limited */
    assert_int_equal(r.status, 200);
    resp_free(&r);
    assert_true(metric(port, "autoreply_rejected_total{reason=\"rate_limit\"}") == 1);
    server_destroy(s);

    /* tokens per minute: the first request's tokens put the bucket in debt */
    sp = server_default_params();
    sp.rate_tpm = 30; /* 40 generated tokens leave it in debt */
    s = make_server(&sp, g_eng, &port);
    j = post_json(port, "/v1/completions", NULL,
                  "{\"prompt\":\"Hello\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true}",
                  &status);
    assert_int_equal(status, 200);
    cJSON_Delete(j);
    j = post_json(port, "/v1/completions", NULL, "{\"prompt\":\"Hello\",\"max_tokens\":4}",
                  &status);
    assert_int_equal(status, 429);
    assert_string_equal(jstr(j, "error.code"), "rate_limit_exceeded");
    cJSON_Delete(j);
    assert_true(metric(port, "autoreply_rejected_total{reason=\"rate_limit\"}") == 1);
    server_destroy(s);
}

/* Handlers that refuse in the ways other modules do (the review routes answer 503 "overloaded"
 * through server_reply_json), and 503s that are no refusal for load. */
static void h_refuse(struct server_req *req, void *user)
{
    const char *what = user;
    if (!strcmp(what, "overloaded") || !strcmp(what, "twice")) {
        server_reply_json(
            req, 503, cJSON_Parse("{\"error\":{\"message\":\"busy\",\"code\":\"overloaded\"}}"));
        if (!strcmp(what, "twice")) /* a second reply is ignored, and not counted */
            server_reply_error(req, 503, "server_error", "queue_full", "late");
    } else if (!strcmp(what, "limited")) {
        server_reply_error_ex(req, 429, "rate_limit_error", "rate_limit_exceeded", NULL, 2,
                              "slow down");
    } else if (!strcmp(what, "loading")) {
        server_reply_error(req, 503, "server_error", "loading", "the model is loading");
    } else {
        server_reply_error(req, 503, "server_error", "internal_error", "store busy");
    }
}

static void refusals_for_load_are_counted_by_reason(void **state)
{
    static const char *const kinds[] = {"overloaded", "twice", "limited", "loading", "other"};
    static const int want[] = {503, 503, 429, 503, 503};
    struct server_params sp = server_default_params();
    struct server *s = NULL;
    struct ar_err err = {0};
    struct resp r;
    char path[64];
    (void)state;
    sp.host = "127.0.0.1";
    sp.port = 0;
    assert_int_equal(server_create(&sp, &s, &err), AR_OK);
    for (size_t i = 0; i < AR_ARRAY_LEN(kinds); i++) {
        struct server_route rt = {0};
        snprintf(path, sizeof(path), "/t/%s", kinds[i]);
        rt.method = "GET";
        rt.path = path;
        rt.fn = h_refuse;
        rt.user = (void *)(uintptr_t)kinds[i];
        assert_int_equal(server_add_route(s, &rt), AR_OK);
    }
    assert_int_equal(server_start(s, &err), AR_OK);
    for (size_t i = 0; i < AR_ARRAY_LEN(kinds); i++) {
        snprintf(path, sizeof(path), "/t/%s", kinds[i]);
        http(server_port(s), "GET", path, NULL, NULL, 0, &r);
        assert_int_equal(r.status, want[i]);
        resp_free(&r);
    }
    assert_true(metric(server_port(s), "autoreply_rejected_total{reason=\"overloaded\"}") == 2);
    assert_true(metric(server_port(s), "autoreply_rejected_total{reason=\"rate_limit\"}") == 1);
    assert_true(metric(server_port(s), "autoreply_rejected_total{reason=\"queue_full\"}") == 0);
    /* every answer is in the request histogram all the same */
    assert_true(metric(server_port(s), "autoreply_http_request_duration_seconds_count{method="
                                       "\"GET\",endpoint=\"/t/loading\",status=\"503\"}") == 1);
    server_destroy(s);
}

static void api_keys_guard_everything_but_health_and_metrics(void **state)
{
    struct server_params sp = server_default_params();
    char path[] = "/tmp/ar_srv_keys_XXXXXX";
    int fd = mkstemp(path), port, status;
    struct server *s;
    struct resp r;
    cJSON *j;
    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "# test keys\nsk-alpha\nsk-beta\n", 29), 29);
    close(fd);
    sp.api_key_file = path;
    s = make_server(&sp, g_eng, &port);
    unlink(path);
    http(port, "GET", "/v1/models", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.body, "invalid_api_key"));
    assert_non_null(strstr(r.body, "authentication_error"));
    resp_free(&r);
    http(port, "GET", "/v1/models", "Authorization: Bearer sk-gamma\r\n", NULL, 0, &r);
    assert_int_equal(r.status, 401);
    resp_free(&r);
    http(port, "GET", "/v1/models", "Authorization: Bearer sk-beta\r\n", NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    j = post_json(port, "/tokenize", "Authorization: Bearer sk-alpha\r\n",
                  "{\"content\":\"hello world\"}", &status);
    assert_int_equal(status, 200);
    assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")) > 0);
    cJSON_Delete(j);
    http(port, "GET", "/health", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    http(port, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    server_destroy(s);
}

static void prefix_cache_hits_show_and_keep_outputs(void **state)
{
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"You answer reviews for a noodle shop "
        "in the old town. Be polite, thank the customer, mention the shop by name, and keep "
        "it short.\"},{\"role\":\"user\",\"content\":\"Great noodles!\"}],\"max_tokens\":20,"
        "\"temperature\":0}";
    cJSON *a, *b;
    int status;
    double hits0 = metric(g_port, "autoreply_prefix_cache_hit_tokens_total");
    (void)state;
    a = post_json(g_port, "/v1/chat/completions", NULL, body, &status);
    assert_int_equal(status, 200);
    b = post_json(g_port, "/v1/chat/completions", NULL, body, &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(a, "choices.0.message.content"), jstr(b, "choices.0.message.content"));
    assert_true(jnum(b, "usage.prompt_tokens_details.cached_tokens") >= 16);
    assert_true(jnum(b, "usage.prompt_tokens_details.cached_tokens") <
                jnum(b, "usage.prompt_tokens"));
    assert_true(metric(g_port, "autoreply_prefix_cache_hit_tokens_total") - hits0 >=
                jnum(b, "usage.prompt_tokens_details.cached_tokens"));
    assert_true(metric(g_port, "autoreply_prefix_cache_queries_total") >= 2);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void json_and_msgpack_give_the_same_answer(void **state)
{
    const char *js = "{\"prompt\":\"The rice was perfect\",\"max_tokens\":16,\"temperature\":0,"
                     "\"stop\":[\"zzz\"]}";
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    struct resp r;
    cJSON *j;
    int status;
    const msgpack_object *choices, *text, *usage, *pt;
    (void)state;
    j = post_json(g_port, "/v1/completions", NULL, js, &status);
    assert_int_equal(status, 200);

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    msgpack_pack_str_with_body(&pk, "prompt", 6);
    msgpack_pack_str_with_body(&pk, "The rice was perfect", 20);
    msgpack_pack_str_with_body(&pk, "max_tokens", 10);
    msgpack_pack_int(&pk, 16);
    msgpack_pack_str_with_body(&pk, "temperature", 11);
    msgpack_pack_double(&pk, 0.0);
    msgpack_pack_str_with_body(&pk, "stop", 4);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_bin_with_body(&pk, "zzz", 3); /* bin reads as a string */
    post_msgpack(g_port, "/v1/completions", &sb, &up, &r);
    choices = mp_get(&up.data, "choices");
    assert_non_null(choices);
    assert_int_equal(choices->type, MSGPACK_OBJECT_ARRAY);
    text = mp_get(&choices->via.array.ptr[0], "text");
    assert_non_null(text);
    assert_int_equal(text->via.str.size, strlen(jstr(j, "choices.0.text")));
    assert_memory_equal(text->via.str.ptr, jstr(j, "choices.0.text"), text->via.str.size);
    usage = mp_get(&up.data, "usage");
    pt = usage ? mp_get(usage, "prompt_tokens") : NULL;
    assert_non_null(pt);
    assert_int_equal(pt->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    assert_true((double)pt->via.u64 == jnum(j, "usage.prompt_tokens"));
    msgpack_unpacked_destroy(&up);
    resp_free(&r);
    cJSON_Delete(j);
}

static void expect_error(const char *path, const char *ctype, const char *body, int status,
                         const char *code)
{
    struct resp r;
    char hdr[128];
    cJSON *j;
    snprintf(hdr, sizeof(hdr), "Content-Type: %s\r\n", ctype);
    http(g_port, "POST", path, hdr, body, strlen(body), &r);
    if (r.status != status)
        fail_msg("%s %s: status %d, want %d: %s", path, body, r.status, status, r.body);
    j = cJSON_Parse(r.body);
    assert_non_null(j);
    assert_non_null(jstr(j, "error.message"));
    assert_non_null(jstr(j, "error.type"));
    if (code)
        assert_string_equal(jstr(j, "error.code"), code);
    cJSON_Delete(j);
    resp_free(&r);
}

static void bad_requests_get_4xx_errors(void **state)
{
    const char *j = "application/json";
    char big[8192];
    int n, status;
    cJSON *e;
    struct resp r;
    (void)state;
    expect_error("/v1/chat/completions", j, "{\"messages\":[", 400, "invalid_json");
    expect_error("/v1/chat/completions", j, "[1,2]", 400, "invalid_type");
    expect_error("/v1/chat/completions", j, "{\"messages\":[]}", 400, "invalid_value");
    expect_error("/v1/chat/completions", j,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":\"5\"}",
                 400, "invalid_type");
    expect_error("/v1/completions", j, "{\"prompt\":\"hi\",\"max_tokens\":0}", 400,
                 "invalid_value");
    expect_error("/v1/completions", j, "{\"prompt\":\"hi\",\"max_tokens\":100000}", 400,
                 "invalid_value");
    expect_error("/v1/completions", j, "{\"prompt\":\"hi\",\"n\":3}", 400, "unsupported_parameter");
    expect_error("/v1/completions", j, "{\"prompt\":\"\xc3\x28\"}", 400, "invalid_json");
    expect_error("/v1/completions", "text/html", "{\"prompt\":\"hi\"}", 415,
                 "unsupported_media_type");
    expect_error("/v1/nothing", j, "{}", 404, "not_found");
    expect_error("/detokenize", j, "{\"tokens\":[1,999999]}", 400, "invalid_value");
    http(g_port, "GET", "/v1/completions", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 405);
    resp_free(&r);

    /* a prompt longer than the context: 600 token ids against 512 */
    n = snprintf(big, sizeof(big), "{\"prompt\":[");
    for (int i = 0; i < 600; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, "%s%d", i ? "," : "", 100 + i % 50);
    snprintf(big + n, sizeof(big) - (size_t)n, "],\"max_tokens\":4}");
    e = post_json(g_port, "/v1/completions", NULL, big, &status);
    assert_int_equal(status, 400);
    assert_string_equal(jstr(e, "error.code"), "context_length_exceeded");
    assert_true(jnum(e, "error.n_prompt_tokens") == 600);
    assert_true(jnum(e, "error.n_ctx") == 512);
    assert_non_null(strstr(jstr(e, "error.message"), "600"));
    assert_non_null(strstr(jstr(e, "error.message"), "512"));
    cJSON_Delete(e);
    /* with truncate the tail is kept */
    snprintf(big + n, sizeof(big) - (size_t)n, "],\"max_tokens\":4,\"truncate\":true}");
    e = post_json(g_port, "/v1/completions", NULL, big, &status);
    assert_int_equal(status, 200);
    assert_true(jnum(e, "usage.prompt_tokens") + 4 <= 512);
    cJSON_Delete(e);
}

/* A NUL in a prompt, a message or a text to tokenize is refused (cJSON cut "a\u0000bcdef" to
 * "a"), and an unknown model is OpenAI's 404 model_not_found; the served id, none or an empty
 * one are answered. */
static void nul_texts_and_unknown_models_are_refused(void **state)
{
    const char *j = "application/json";
    struct resp r;
    cJSON *e;
    int status;
    (void)state;
    expect_error("/tokenize", j, "{\"content\":\"a\\u0000bcdef\"}", 400, "invalid_json");
    expect_error("/v1/chat/completions", j,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\\u0000there\"}]}", 400,
                 "invalid_json");
    expect_error("/v1/chat/completions", j,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                 "\"x\\u0000\"}]}]}",
                 400, "invalid_json");
    expect_error("/v1/completions", j, "{\"prompt\":\"hi\\u0000\",\"max_tokens\":2}", 400,
                 "invalid_json");
    /* the message names the field */
    http(g_port, "POST", "/tokenize", "Content-Type: application/json\r\n",
         "{\"content\":\"a\\u0000b\"}", 22, &r);
    e = cJSON_Parse(r.body);
    assert_non_null(strstr(jstr(e, "error.message"), "content"));
    cJSON_Delete(e);
    resp_free(&r);
    /* a NUL escaped as text (\\u0000) is fine */
    e = post_json(g_port, "/tokenize", NULL, "{\"content\":\"a\\\\u0000b\"}", &status);
    assert_int_equal(status, 200);
    assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(e, "tokens")) > 0);
    cJSON_Delete(e);

    expect_error("/v1/chat/completions", j,
                 "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 404,
                 "model_not_found");
    expect_error("/v1/completions", j, "{\"model\":\"demo2\",\"prompt\":\"hi\",\"max_tokens\":2}",
                 404, "model_not_found");
    http(g_port, "POST", "/v1/completions", "Content-Type: application/json\r\n",
         "{\"model\":\"nope\",\"prompt\":\"hi\"}", 30, &r);
    e = cJSON_Parse(r.body);
    assert_int_equal(r.status, 404);
    assert_string_equal(jstr(e, "error.type"), "invalid_request_error");
    assert_string_equal(jstr(e, "error.code"), "model_not_found");
    assert_non_null(strstr(jstr(e, "error.message"), "nope"));
    cJSON_Delete(e);
    resp_free(&r);
    /* the id /v1/models lists, an empty one and none are the served model */
    e = post_json(g_port, "/v1/completions", NULL,
                  "{\"model\":\"demo\",\"prompt\":\"hi\",\"max_tokens\":2}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(e, "model"), "demo");
    cJSON_Delete(e);
    e = post_json(g_port, "/v1/chat/completions", NULL,
                  "{\"model\":\"\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                  "\"max_tokens\":2}",
                  &status);
    assert_int_equal(status, 200);
    cJSON_Delete(e);
    e = post_json(g_port, "/v1/completions", NULL, "{\"prompt\":\"hi\",\"max_tokens\":2}", &status);
    assert_int_equal(status, 200);
    cJSON_Delete(e);
}

static void huge_body_gets_413_before_it_is_read(void **state)
{
    int fd = connect_port(g_port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       "application/json\r\nContent-Length: 100000000\r\n\r\n";
    char chunk[65536];
    size_t sent = 0, n;
    char *raw;
    struct resp r;
    (void)state;
    memset(chunk, ' ', sizeof(chunk));
    assert_true(send_all(fd, head, strlen(head)));
    /* keep sending until the server answers or refuses more; it must not take 100 MB */
    for (int i = 0; i < 64; i++) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0)
            break;
        if (!send_all(fd, chunk, sizeof(chunk)))
            break;
        sent += sizeof(chunk);
    }
    raw = read_all(fd, &n);
    close(fd);
    assert_true(sent < 100000000 / 2);
    parse_response(raw, n, &r);
    assert_int_equal(r.status, 413);
    assert_non_null(strstr(r.body, "request_too_large"));
    resp_free(&r);
    free(raw);
}

/* Sends raw bytes on a fresh connection (then, when feed is set, 1 MB chunks while the server
 * takes them, until it answers), reads until the server closes or 5 s pass; *secs: how long
 * the answer (or the close) took after the bytes went out. Caller frees. */
static char *raw_exchange(int port, const char *bytes, size_t len, bool feed, size_t *n,
                          double *secs, size_t *fed)
{
    struct timeval tv = {5, 0};
    int fd = connect_port(port);
    double t0;
    char *raw;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    t0 = now_s();
    assert_true(send_all(fd, bytes, len));
    if (fed)
        *fed = 0;
    if (feed) { /* 1 MB chunks of spaces, up to 64 MB, while the server reads them */
        static char chunk[(1 << 20) + 16];
        int hl = snprintf(chunk, sizeof(chunk), "%x\r\n", 1 << 20);
        memset(chunk + hl, ' ', 1 << 20);
        memcpy(chunk + hl + (1 << 20), "\r\n", 2);
        t0 = now_s();
        for (int i = 0; i < 64; i++) {
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 0) > 0 || !send_all(fd, chunk, (size_t)hl + (1 << 20) + 2))
                break;
            *fed += 1 << 20;
        }
    }
    raw = read_all(fd, n);
    *secs = now_s() - t0;
    close(fd);
    return raw;
}

/* The answer to raw bytes must have this status, within a second, and be a JSON error when it
 * is one (a 200 is a completion). */
static void expect_framing_error(const char *bytes, size_t len, int status, const char *what)
{
    size_t n;
    double secs;
    struct resp r;
    cJSON *j;
    char *raw = raw_exchange(g_port, bytes, len, false, &n, &secs, NULL);
    if (n == 0)
        fail_msg("%s: no answer (closed or timed out after %.1f s)", what, secs);
    parse_response(raw, n, &r);
    if (r.status != status)
        fail_msg("%s: status %d, want %d", what, r.status, status);
    j = cJSON_Parse(r.body);
    if (!j || !(status < 400 ? jstr(j, "choices.0.text") : jstr(j, "error.message")))
        fail_msg("%s: not a JSON error: %s", what, r.body);
    if (secs > 1.0)
        fail_msg("%s: answered after %.1f s", what, secs);
    cJSON_Delete(j);
    resp_free(&r);
    free(raw);
}

static void http_framing_errors_are_answered_at_once(void **state)
{
    static const char nul_target[] = "GET /health\0x HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char pct_nul_target[] = "GET /health%00x HTTP/1.1\r\nHost: x\r\n\r\n";
    const char *body = "{\"prompt\":\"hi\",\"max_tokens\":1}";
    char req[1024];
    int k;
    struct resp r;
    (void)state;
    /* a transfer coding we do not implement (RFC 9112: 501) */
    k = snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: gzip\r\n\r\n%s",
                 body);
    expect_framing_error(req, (size_t)k, 501, "Transfer-Encoding: gzip");
    k = snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: gzip, chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
                 strlen(body), body);
    expect_framing_error(req, (size_t)k, 501, "Transfer-Encoding: gzip, chunked");
    /* two different lengths, or a length and chunks: which one frames the body is ambiguous
     * (request smuggling behind a proxy that reads the other one) */
    k = snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), strlen(body) + 5, body);
    expect_framing_error(req, (size_t)k, 400, "two Content-Length headers");
    k = snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
                 strlen(body), strlen(body), body);
    expect_framing_error(req, (size_t)k, 400, "Content-Length and chunked");
    /* a NUL in the request target must not route to the part before it */
    expect_framing_error(nul_target, sizeof(nul_target) - 1, 400, "NUL in the target");
    expect_framing_error(pct_nul_target, sizeof(pct_nul_target) - 1, 400, "%00 in the target");
    /* the same lengths twice, a plain chunked body and a query string stay fine */
    k = snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Connection: close\r\nContent-Length: %zu\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), strlen(body), body);
    expect_framing_error(req, (size_t)k, 200, "the same Content-Length twice");
    k = snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Connection: close\r\nTransfer-Encoding: Chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
                 strlen(body), body);
    expect_framing_error(req, (size_t)k, 200, "chunked");
    http(g_port, "GET", "/health?x=1", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

/* A chunked body over the route's limit gets a 413 as soon as the limit is passed (not a reset
 * after more bytes), whether it comes in chunks or in one chunk that declares 2^64-1 bytes.
 * Not covered, and not fixed: a chunk that declares more than the limit and then stalls is read
 * by libmicrohttpd (0.9.75), which parses chunk sizes itself, accepts any that fits 64 bits,
 * calls us only with data bytes and has no call that tells the declared size; a huge size
 * followed by silence looks to us exactly like a body that stalls, and gets the 408 of one
 * after body_timeout_s (stalled_body_gets_408_after_body_timeout). Sizes it cannot read are
 * answered at once (bad_chunk_sizes_are_answered_at_once). */
static void expect_chunked_413(const char *head, const char *what)
{
    size_t n, fed;
    double secs;
    struct resp r;
    char *raw = raw_exchange(g_port, head, strlen(head), true, &n, &secs, &fed);
    if (n == 0)
        fail_msg("%s: no answer to a chunked body over the limit (%zu bytes sent)", what, fed);
    assert_true(fed < 8u << 20); /* it stopped taking bytes soon after the 1 MB limit */
    assert_true(secs < 2.0);
    parse_response(raw, n, &r);
    assert_int_equal(r.status, 413);
    assert_non_null(strstr(r.body, "request_too_large"));
    resp_free(&r);
    free(raw);
}

static void huge_chunked_body_gets_413(void **state)
{
    struct resp r;
    (void)state;
    expect_chunked_413("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       "application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                       "1 MB chunks");
    expect_chunked_413("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       "application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "ffffffffffffffff\r\n",
                       "chunk size ffffffffffffffff");
    /* the server goes on serving */
    http(g_port, "GET", "/health", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

/* A chunk size that is not hexadecimal gets 400 and one that overflows 64 bits 413, within a
 * second and with the connection closed; libmicrohttpd answers these itself (its own short
 * HTML page: it gives the application no say), so only the status and the close are checked. */
static void bad_chunk_sizes_are_answered_at_once(void **state)
{
    static const struct {
        const char *size;
        int status;
    } cases[] = {{"zz", 400},
                 {"-5", 400},
                 {" 5", 400},
                 {"0x10", 400},
                 {"1ffffffffffffffff", 413},
                 {"ffffffffffffffff0", 413}};
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(cases); i++) {
        char req[512];
        size_t n;
        double secs;
        struct resp r;
        char *raw;
        int k = snprintf(req, sizeof(req),
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         "application/json\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\n",
                         cases[i].size);
        raw = raw_exchange(g_port, req, (size_t)k, false, &n, &secs, NULL);
        if (n == 0)
            fail_msg("chunk size \"%s\": no answer after %.1f s", cases[i].size, secs);
        parse_response(raw, n, &r);
        if (r.status != cases[i].status || secs > 1.0)
            fail_msg("chunk size \"%s\": status %d after %.1f s, want %d at once", cases[i].size,
                     r.status, secs, cases[i].status);
        resp_free(&r);
        free(raw);
    }
}

/* A body that stops coming is answered 408 after body_timeout_s, not held until timeout_s: a
 * chunk that declares 2^64-1 bytes and then nothing (the declared size cannot be seen, see
 * above), one that declares 256 bytes and sends 3, a Content-Length body cut short. A body that
 * keeps coming, however slowly, is not cut. */
static void stalled_body_gets_408_after_body_timeout(void **state)
{
    static const char *const stalls[] = {
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n100\r\nabc",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{\"prompt\":",
    };
    static const char *const pieces[] = {"{\"cont", "ent\":\"sl", "ow but ", "steady\"", "}"};
    struct server_params sp = server_default_params();
    struct server *s;
    int port, fd;
    size_t n;
    double secs;
    char *raw;
    struct resp r;
    (void)state;
    sp.body_timeout_s = 0.8; /* timeout_s stays 30 */
    s = make_server(&sp, g_eng, &port);
    for (size_t i = 0; i < AR_ARRAY_LEN(stalls); i++) {
        cJSON *j;
        raw = raw_exchange(port, stalls[i], strlen(stalls[i]), false, &n, &secs, NULL);
        if (n == 0)
            fail_msg("stall %zu: no answer after %.1f s", i, secs);
        parse_response(raw, n, &r);
        j = cJSON_Parse(r.body);
        if (r.status != 408 || !jstr(j, "error.code") ||
            strcmp(jstr(j, "error.code"), "body_timeout"))
            fail_msg("stall %zu: status %d: %s", i, r.status, r.body);
        if (secs < 0.7 || secs > 2.5)
            fail_msg("stall %zu: answered after %.2f s (body timeout 0.8 s)", i, secs);
        cJSON_Delete(j);
        resp_free(&r);
        free(raw);
    }
    assert_true(metric(port, "autoreply_http_request_duration_seconds_count{method=\"POST\","
                             "endpoint=\"/v1/completions\",status=\"408\"}") == 3);
    /* slow but steady: 1.2 s in all, never 0.8 s without a byte */
    fd = connect_port(port);
    {
        const char *head = "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                           "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_true(send_all(fd, head, strlen(head)));
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(pieces); i++) {
        char line[64];
        int k = snprintf(line, sizeof(line), "%zx\r\n%s\r\n", strlen(pieces[i]), pieces[i]);
        usleep(300000);
        assert_true(send_all(fd, line, (size_t)k));
    }
    assert_true(send_all(fd, "0\r\n\r\n", 5));
    raw = read_all(fd, &n);
    close(fd);
    parse_response(raw, n, &r);
    if (r.status != 200)
        fail_msg("a slow but steady body: status %d: %s", r.status, r.body);
    resp_free(&r);
    free(raw);
    server_destroy(s);
}

/* A connected socket from src (a loopback address) to 127.0.0.1:port, receive timeout 5 s. */
static int connect_from(const char *src, int port)
{
    struct sockaddr_in a = {0}, b = {0};
    struct timeval tv = {5, 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    b.sin_family = AF_INET;
    assert_int_equal(inet_pton(AF_INET, src, &b.sin_addr), 1);
    assert_int_equal(bind(fd, (struct sockaddr *)&b, sizeof(b)), 0);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* GET /health on a fresh connection from src: the status, and in *secs how long it took. */
static int health_from(const char *src, int port, double *secs)
{
    static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    double t0 = now_s();
    int fd = connect_from(src, port), status = -1;
    size_t n;
    char *raw;
    assert_true(send_all(fd, req, sizeof(req) - 1));
    raw = read_all(fd, &n);
    *secs = now_s() - t0;
    close(fd);
    if (sscanf(raw, "HTTP/1.%*d %d", &status) != 1)
        status = -1;
    free(raw);
    return status;
}

/* How many of fds the server has closed (EOF or reset) within wait_s. */
static int n_closed(const int *fds, int n, double wait_s)
{
    int closed = 0;
    double t0 = now_s();
    bool *done = calloc((size_t)n, sizeof(*done));
    while (now_s() - t0 < wait_s && closed < n) {
        for (int i = 0; i < n; i++) {
            char b;
            ssize_t k;
            if (done[i])
                continue;
            k = recv(fds[i], &b, 1, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                done[i] = true;
                closed++;
            }
        }
        usleep(20000);
    }
    free(done);
    return closed;
}

/* More idle sockets than the server takes, from one client, must not lock others out: idle
 * connections are closed near the limit (a request in progress is not), and one address may
 * hold only its share of the connections. */
static void idle_sockets_do_not_lock_others_out(void **state)
{
    struct server_params sp = server_default_params();
    struct server *s;
    int port, fds[48], busy, status;
    double secs;
    size_t n;
    char *raw;
    (void)state;
    /* one client, no per-address limit: 48 idle sockets against 32 connections */
    sp.max_conns = 32;
    sp.max_conns_per_ip = 0;
    s = make_server(&sp, g_eng, &port);
    busy = connect_port(port);
    assert_true(send_all(busy, "GET /health HTTP/1.1\r\nHost: x\r\n", 31)); /* not done yet */
    usleep(300000);
    for (int i = 0; i < 48; i++)
        fds[i] = connect_port(port);
    status = health_from("127.0.0.1", port, &secs);
    assert_int_equal(status, 200);
    assert_true(secs < 1.0);
    assert_true(n_closed(fds, 48, 0.5) >= 48 - 32);
    /* the request in progress was left alone: it completes */
    assert_true(send_all(busy, "Connection: close\r\n\r\n", 21));
    raw = read_all(busy, &n);
    assert_int_equal(strncmp(raw, "HTTP/1.1 200", 12), 0);
    free(raw);
    close(busy);
    for (int i = 0; i < 48; i++)
        close(fds[i]);
    server_destroy(s);
    /* the default per-address share (half of max_conns): 127.0.0.1 holding 40 idle sockets gets
     * the ones past 32 closed at once, and 127.0.0.2 is served at once */
    sp = server_default_params();
    sp.max_conns = 64;
    s = make_server(&sp, g_eng, &port);
    for (int i = 0; i < 40; i++)
        fds[i] = connect_port(port);
    assert_int_equal(n_closed(fds, 40, 1.0), 40 - 32);
    status = health_from("127.0.0.2", port, &secs);
    assert_int_equal(status, 200);
    assert_true(secs < 1.0);
    for (int i = 0; i < 40; i++)
        close(fds[i]);
    server_destroy(s);
}

static void slow_client_is_dropped_while_others_are_served(void **state)
{
    struct server_params sp = server_default_params();
    int port, fd;
    struct server *s;
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
    double t0, dropped_at = 0;
    struct resp r;
    (void)state;
    sp.timeout_s = 1;
    s = make_server(&sp, g_eng, &port);
    fd = connect_port(port);
    t0 = now_s();
    /* one byte every 100 ms: never idle long enough for an idle timeout */
    for (size_t i = 0; now_s() - t0 < 4; i = (i + 1) % strlen(head)) {
        struct pollfd p = {fd, POLLIN, 0};
        if (!send_all(fd, head + i, 1) || (poll(&p, 1, 0) > 0 && recv(fd, &(char){0}, 1, 0) <= 0)) {
            dropped_at = now_s() - t0;
            break;
        }
        if (i == 5) { /* others are served meanwhile */
            http(port, "GET", "/health", NULL, NULL, 0, &r);
            assert_int_equal(r.status, 200);
            resp_free(&r);
        }
        usleep(100000);
    }
    close(fd);
    assert_true(dropped_at > 0.8);
    assert_true(dropped_at < 2.5);
    server_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(health_says_loading_until_the_engine_is_set),
        cmocka_unit_test(concurrent_greedy_outputs_equal_single_requests),
        cmocka_unit_test(sse_stream_assembles_to_the_whole_text),
        cmocka_unit_test(client_leaving_mid_stream_frees_its_kv),
        cmocka_unit_test(overload_answers_503_with_retry_after),
        cmocka_unit_test(rate_limits_answer_429_with_retry_after),
        cmocka_unit_test(refusals_for_load_are_counted_by_reason),
        cmocka_unit_test(api_keys_guard_everything_but_health_and_metrics),
        cmocka_unit_test(prefix_cache_hits_show_and_keep_outputs),
        cmocka_unit_test(json_and_msgpack_give_the_same_answer),
        cmocka_unit_test(bad_requests_get_4xx_errors),
        cmocka_unit_test(nul_texts_and_unknown_models_are_refused),
        cmocka_unit_test(huge_body_gets_413_before_it_is_read),
        cmocka_unit_test(slow_client_is_dropped_while_others_are_served),
        cmocka_unit_test(http_framing_errors_are_answered_at_once),
        cmocka_unit_test(huge_chunked_body_gets_413),
        cmocka_unit_test(bad_chunk_sizes_are_answered_at_once),
        cmocka_unit_test(stalled_body_gets_408_after_body_timeout),
        cmocka_unit_test(idle_sockets_do_not_lock_others_out),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
