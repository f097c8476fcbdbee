/* sessions_test.c - /v1/sessions end to end: a real server on 127.0.0.1 over the demo model with
 * two API keys. Documents changed by JSON Patch are compared with the documents the patches
 * must give (worked out by hand); failing patches leave the stored document as it was; a turn
 * answers what /v1/chat/completions answers for the same messages, and the next turn finds
 * the previous prompt and reply in the prefix cache; keys, TTL, limits and content types. */
#include "harness/harness.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#define TH_HTTP_RECV_TIMEOUT_S 30
#include "harness/http_client.h"

#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

#define KEY_A "Authorization: Bearer sk-alpha\r\n"
#define KEY_B "Authorization: Bearer sk-beta\r\n"
#define PATCH_CT "Content-Type: application/json-patch+json\r\n"
#define BLOCK 16 /* the engine's KV block (engine_default_params) */
#define RM_SYSTEM "[{\"op\":\"remove\",\"path\":\"/system\"}]"

static struct model *g_model;
static struct tokenizer *g_tok;
static struct engine *g_eng;
static char g_keys[64];

/* One server with its session store. */
struct srv {
    struct server *s;
    struct server_sessions *ss;
    int port;
};

static void srv_start(struct srv *v, const struct server_sessions_params *sp)
{
    struct server_params p = server_default_params();
    struct ar_err err = {0};
    p.host = "127.0.0.1";
    p.port = 0;
    p.model_name = "demo";
    p.api_key_file = g_keys;
    if (server_create(&p, &v->s, &err) != AR_OK)
        fail_msg("server: %s", err.msg);
    assert_int_equal(server_sessions_attach(v->s, sp, &v->ss), AR_OK);
    if (server_start(v->s, &err) != AR_OK)
        fail_msg("server: %s", err.msg);
    server_set_engine(v->s, g_eng, g_model, g_tok);
    v->port = server_port(v->s);
}

static void srv_stop(struct srv *v)
{
    server_stop(v->s, 5);
    server_destroy(v->s);
    server_sessions_destroy(v->ss);
}

static int group_setup(void **state)
{
    char path[512];
    struct ar_err err = {0};
    struct engine_params ep = engine_default_params();
    FILE *f;
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    ar_log_set_level(AR_LOG_WARN);
    snprintf(g_keys, sizeof(g_keys), "/tmp/ar_sessions_keys_%d", (int)getpid());
    if (!(f = fopen(g_keys, "w")))
        return -1;
    fputs("sk-alpha\nsk-beta\n", f);
    fclose(f);
    if (model_load(th_shared_path(path, sizeof(path), "models/autoreply-demo-q8_0.gguf"), &g_model,
                   &err) != AR_OK)
        return -1;
    if (tokenizer_load(model_gguf(g_model), &g_tok, &err) != AR_OK)
        return -1;
    ep.n_threads = 1;
    ep.n_seq_max = 4;
    ep.kv_tokens = 4096;
    assert_int_equal(ep.block_tokens, BLOCK);
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
    unlink(g_keys);
    return 0;
}

/* ---- requests -------------------------------------------------------------------------------- */

/* Any request with a JSON answer; the answer parsed (NULL for an empty body). */
static cJSON *req_json(int port, const char *method, const char *path, const char *hdrs,
                       const char *body, int *status)
{
    struct resp r;
    cJSON *j = NULL;
    http(port, method, path, hdrs, body, body ? strlen(body) : 0, &r);
    *status = r.status;
    if (r.body_len && !(j = cJSON_Parse(r.body)))
        fail_msg("%s %s: not JSON (status %d): %.300s", method, path, r.status, r.body);
    resp_free(&r);
    return j;
}

static const char *error_code(const cJSON *j)
{
    return cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code"));
}

/* Creates a session for key hdr from doc; its id into id. */
static void create(int port, const char *hdr, const char *doc, char *id, size_t size)
{
    char h[256];
    int st;
    cJSON *j;
    snprintf(h, sizeof(h), "Content-Type: application/json\r\n%s", hdr);
    j = req_json(port, "POST", "/v1/sessions", h, doc, &st);
    if (st != 201)
        fail_msg("create: %d %s", st, cJSON_PrintUnformatted(j));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "object")), "session");
    snprintf(id, size, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")));
    assert_true(strlen(id) > 8);
    cJSON_Delete(j);
}

/* The stored document of session id (fails unless GET answers 200). */
static cJSON *get_doc(int port, const char *hdr, const char *id)
{
    char path[128];
    int st;
    cJSON *j, *d;
    snprintf(path, sizeof(path), "/v1/sessions/%s", id);
    j = req_json(port, "GET", path, hdr, NULL, &st);
    assert_int_equal(st, 200);
    d = cJSON_DetachItemFromObject(j, "document");
    assert_non_null(d);
    cJSON_Delete(j);
    return d;
}

static void assert_doc(int port, const char *id, const char *want)
{
    cJSON *d = get_doc(port, KEY_A, id), *w = cJSON_Parse(want);
    assert_non_null(w);
    if (!cJSON_Compare(d, w, true))
        fail_msg("document %s, want %s", cJSON_PrintUnformatted(d), want);
    cJSON_Delete(w);
    cJSON_Delete(d);
}

/* PATCH with the JSON Patch type; the status, the answer in *out (may be NULL). */
static int patch(int port, const char *hdr, const char *id, const char *query, const char *ops,
                 cJSON **out)
{
    char path[160], h[256];
    int st;
    cJSON *j;
    snprintf(path, sizeof(path), "/v1/sessions/%s%s", id, query ? query : "");
    snprintf(h, sizeof(h), PATCH_CT "%s", hdr);
    j = req_json(port, "PATCH", path, h, ops, &st);
    if (out)
        *out = j;
    else
        cJSON_Delete(j);
    return st;
}

/* ---- tests ----------------------------------------------------------------------------------- */

#define DOC0 "{\"system\":\"Be brief.\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static void create_get_delete(void **state)
{
    struct srv v;
    char id[64], path[128];
    int st;
    cJSON *j;
    (void)state;
    srv_start(&v, NULL);
    create(v.port, KEY_A, DOC0, id, sizeof(id));
    assert_doc(v.port, id, DOC0);
    /* a document without messages gets an empty list */
    {
        char id2[64];
        create(v.port, KEY_A, "{\"shop_id\":\"s1\"}", id2, sizeof(id2));
        assert_doc(v.port, id2, "{\"shop_id\":\"s1\",\"messages\":[]}");
    }
    /* not a session document: 400 */
    j = req_json(v.port, "POST", "/v1/sessions", "Content-Type: application/json\r\n" KEY_A,
                 "{\"messages\":5}", &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    j = req_json(v.port, "POST", "/v1/sessions", "Content-Type: application/json\r\n" KEY_A,
                 "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    j = req_json(v.port, "POST", "/v1/sessions", "Content-Type: application/json\r\n" KEY_A,
                 "{\"messages\":[],\"temperature\":\"hot\"}", &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    /* no key: 401 */
    j = req_json(v.port, "POST", "/v1/sessions", "Content-Type: application/json\r\n", DOC0, &st);
    assert_int_equal(st, 401);
    cJSON_Delete(j);
    snprintf(path, sizeof(path), "/v1/sessions/%s", id);
    j = req_json(v.port, "DELETE", path, KEY_A, NULL, &st);
    assert_int_equal(st, 200);
    cJSON_Delete(j);
    j = req_json(v.port, "GET", path, KEY_A, NULL, &st);
    assert_int_equal(st, 404);
    assert_string_equal(error_code(j), "session_not_found");
    cJSON_Delete(j);
    j = req_json(v.port, "DELETE", path, KEY_A, NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    j = req_json(v.port, "GET", "/v1/sessions/sess_nope", KEY_A, NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    srv_stop(&v);
}

static void patch_each_operation(void **state)
{
    struct srv v;
    char id[64];
    cJSON *j = NULL;
    (void)state;
    srv_start(&v, NULL);
    create(v.port, KEY_A, DOC0, id, sizeof(id));
    /* add: append a message, and a member */
    assert_int_equal(patch(v.port, KEY_A, id, NULL,
                           "[{\"op\":\"add\",\"path\":\"/messages/-\",\"value\":{\"role\":"
                           "\"assistant\",\"content\":\"hello\"}},"
                           "{\"op\":\"add\",\"path\":\"/temperature\",\"value\":0}]",
                           &j),
                     200);
    /* the answer carries the new document */
    assert_true(cJSON_GetArraySize(
                    cJSON_GetObjectItem(cJSON_GetObjectItem(j, "document"), "messages")) == 2);
    cJSON_Delete(j);
    assert_doc(v.port, id,
               "{\"system\":\"Be brief.\",\"temperature\":0,\"messages\":[{\"role\":\"user\","
               "\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"hello\"}]}");
    /* replace and test (passing) */
    assert_int_equal(
        patch(v.port, KEY_A, id, NULL,
              "[{\"op\":\"test\",\"path\":\"/messages/1/content\",\"value\":\"hello\"},"
              "{\"op\":\"replace\",\"path\":\"/messages/0/content\",\"value\":"
              "\"hi there\"}]",
              NULL),
        200);
    /* copy and move */
    assert_int_equal(patch(v.port, KEY_A, id, NULL,
                           "[{\"op\":\"copy\",\"from\":\"/messages/0\",\"path\":\"/messages/-\"},"
                           "{\"op\":\"move\",\"from\":\"/system\",\"path\":\"/note\"}]",
                           NULL),
                     200);
    assert_doc(v.port, id,
               "{\"note\":\"Be brief.\",\"temperature\":0,\"messages\":[{\"role\":\"user\","
               "\"content\":\"hi there\"},{\"role\":\"assistant\",\"content\":\"hello\"},"
               "{\"role\":\"user\",\"content\":\"hi there\"}]}");
    /* remove, with "~1" naming a key with a slash */
    assert_int_equal(patch(v.port, KEY_A, id, NULL,
                           "[{\"op\":\"add\",\"path\":\"/a~1b\",\"value\":1},"
                           "{\"op\":\"remove\",\"path\":\"/messages/1\"},"
                           "{\"op\":\"remove\",\"path\":\"/note\"}]",
                           NULL),
                     200);
    assert_doc(v.port, id,
               "{\"a/b\":1,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hi "
               "there\"},{\"role\":\"user\",\"content\":\"hi there\"}]}");
    srv_stop(&v);
}

static void failing_patches_change_nothing(void **state)
{
    struct srv v;
    char id[64], big[2048];
    cJSON *j = NULL, *before, *after;
    struct resp r;
    char path[128];
    struct server_sessions_params sp = server_sessions_default_params();
    (void)state;
    sp.max_doc_size = 1024;
    srv_start(&v, &sp);
    create(v.port, KEY_A, DOC0, id, sizeof(id));
    before = get_doc(v.port, KEY_A, id);
    /* a failing test after a change that would have worked: 409 */
    assert_int_equal(patch(v.port, KEY_A, id, NULL,
                           "[{\"op\":\"add\",\"path\":\"/messages/-\",\"value\":{\"role\":\"user\","
                           "\"content\":\"x\"}},"
                           "{\"op\":\"test\",\"path\":\"/messages/0/content\",\"value\":\"bye\"}]",
                           &j),
                     409);
    assert_string_equal(error_code(j), "patch_test_failed");
    assert_int_equal(
        (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "op_index")),
        1);
    cJSON_Delete(j);
    /* bad pointers, missing targets, unknown operations: 400 */
    static const char *const bad[] = {
        "[{\"op\":\"remove\",\"path\":\"/messages/7\"}]",
        "[{\"op\":\"add\",\"path\":\"messages\",\"value\":1}]",
        "[{\"op\":\"add\",\"path\":\"/x~2\",\"value\":1}]",
        "[{\"op\":\"replace\",\"path\":\"/nothing\",\"value\":1}]",
        "[{\"op\":\"add\",\"path\":\"/a\",\"value\":1},{\"op\":\"frobnicate\",\"path\":\"/a\"}]",
        "[{\"op\":\"move\",\"from\":\"/messages\",\"path\":\"/messages/0/x\"}]",
        "{\"op\":\"add\",\"path\":\"/a\",\"value\":1}",
        "[{\"op\":\"add\",\"path\":\"/a\",\"value\":1}",
        /* a patch that leaves no valid session document */
        "[{\"op\":\"replace\",\"path\":\"/messages\",\"value\":5}]",
        "[{\"op\":\"remove\",\"path\":\"/messages/0/role\"}]",
    };
    for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
        int st = patch(v.port, KEY_A, id, NULL, bad[i], &j);
        if (st != 400)
            fail_msg("%s: %d, want 400", bad[i], st);
        cJSON_Delete(j);
    }
    /* too large: 413 */
    memset(big, 'x', sizeof(big));
    snprintf(big, sizeof(big), "[{\"op\":\"add\",\"path\":\"/pad\",\"value\":\"%01500d\"}]", 7);
    assert_int_equal(patch(v.port, KEY_A, id, NULL, big, NULL), 413);
    /* other content types: 415 */
    snprintf(path, sizeof(path), "/v1/sessions/%s", id);
    http(v.port, "PATCH", path, "Content-Type: application/json\r\n" KEY_A, RM_SYSTEM,
         strlen(RM_SYSTEM), &r);
    assert_int_equal(r.status, 415);
    resp_free(&r);
    http(v.port, "PATCH", path, KEY_A, RM_SYSTEM, strlen(RM_SYSTEM), &r);
    assert_int_equal(r.status, 415);
    resp_free(&r);
    http(v.port, "PATCH", path, "Content-Type: application/merge-patch+json\r\n" KEY_A,
         "{\"system\":null}", strlen("{\"system\":null}"), &r);
    assert_int_equal(r.status, 415);
    resp_free(&r);
    after = get_doc(v.port, KEY_A, id);
    assert_true(cJSON_Compare(before, after, true));
    cJSON_Delete(after);
    /* a parameter after the media type is fine */
    http(v.port, "PATCH", path,
         "Content-Type: application/json-patch+json; charset=utf-8\r\n" KEY_A, RM_SYSTEM,
         strlen(RM_SYSTEM), &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    after = get_doc(v.port, KEY_A, id);
    assert_null(cJSON_GetObjectItem(after, "system"));
    cJSON_Delete(after);
    cJSON_Delete(before);
    srv_stop(&v);
}

static void sessions_belong_to_their_key(void **state)
{
    struct srv v;
    char id[64], path[160];
    int st;
    cJSON *j;
    (void)state;
    srv_start(&v, NULL);
    create(v.port, KEY_A, DOC0, id, sizeof(id));
    snprintf(path, sizeof(path), "/v1/sessions/%s", id);
    j = req_json(v.port, "GET", path, KEY_B, NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    assert_int_equal(
        patch(v.port, KEY_B, id, NULL, "[{\"op\":\"remove\",\"path\":\"/system\"}]", NULL), 404);
    snprintf(path, sizeof(path), "/v1/sessions/%s/generate", id);
    j = req_json(v.port, "POST", path, KEY_B, NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    snprintf(path, sizeof(path), "/v1/sessions/%s", id);
    j = req_json(v.port, "DELETE", path, KEY_B, NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    /* still there for its own key, unchanged */
    assert_doc(v.port, id, DOC0);
    srv_stop(&v);
}

static void sessions_expire_and_are_bounded(void **state)
{
    struct srv v;
    struct server_sessions_params sp = server_sessions_default_params();
    char id[64], id2[64], path[160];
    int st;
    cJSON *j;
    (void)state;
    sp.ttl_s = 1.0;
    sp.max_per_key = 2;
    sp.max_sessions = 3;
    srv_start(&v, &sp);
    create(v.port, KEY_A, DOC0, id, sizeof(id));
    create(v.port, KEY_A, DOC0, id2, sizeof(id2));
    /* a third for the same key: 429; another key still gets one */
    j = req_json(v.port, "POST", "/v1/sessions", "Content-Type: application/json\r\n" KEY_A, DOC0,
                 &st);
    assert_int_equal(st, 429);
    assert_string_equal(error_code(j), "too_many_sessions");
    cJSON_Delete(j);
    {
        char idb[64];
        create(v.port, KEY_B, DOC0, idb, sizeof(idb));
    }
    /* three in all: the server's own bound */
    j = req_json(v.port, "POST", "/v1/sessions", "Content-Type: application/json\r\n" KEY_B, DOC0,
                 &st);
    assert_int_equal(st, 429);
    assert_string_equal(error_code(j), "sessions_full");
    cJSON_Delete(j);
    /* use keeps one alive; the other expires */
    for (int i = 0; i < 6; i++) {
        usleep(250 * 1000);
        cJSON_Delete(get_doc(v.port, KEY_A, id2));
    }
    snprintf(path, sizeof(path), "/v1/sessions/%s", id);
    j = req_json(v.port, "GET", path, KEY_A, NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    cJSON_Delete(get_doc(v.port, KEY_A, id2));
    /* the expired one no longer counts */
    create(v.port, KEY_A, DOC0, id, sizeof(id));
    srv_stop(&v);
}

/* The reply a chat completion gives for messages (temperature 0). */
static char *chat_reply(int port, const char *messages, int max_tokens)
{
    char body[2048];
    int st;
    cJSON *j;
    char *t;
    snprintf(body, sizeof(body), "{\"messages\":%s,\"max_tokens\":%d,\"temperature\":0}", messages,
             max_tokens);
    j = post_json(port, "/v1/chat/completions", KEY_A, body, &st);
    assert_int_equal(st, 200);
    t = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message"),
        "content")));
    cJSON_Delete(j);
    return t;
}

static double usage(const cJSON *j, const char *name)
{
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    if (!strcmp(name, "cached_tokens"))
        u = cJSON_GetObjectItem(u, "prompt_tokens_details");
    return cJSON_GetNumberValue(cJSON_GetObjectItem(u, name));
}

static void turns_reuse_the_kv_of_what_was_seen(void **state)
{
    struct srv v;
    char id[64], path[160], *want;
    const char *msgs = "[{\"role\":\"system\",\"content\":\"You answer shop reviews.\"},"
                       "{\"role\":\"user\",\"content\":\"The noodles were cold and the "
                       "delivery was late.\"}]";
    char doc[1024];
    int st;
    double p1, c1, p2, cached2;
    cJSON *j, *d;
    (void)state;
    srv_start(&v, NULL);
    snprintf(doc, sizeof(doc),
             "{\"system\":\"You answer shop reviews.\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"The noodles were cold and the delivery was late.\"}],"
             "\"max_tokens\":32,\"temperature\":0}");
    create(v.port, KEY_A, doc, id, sizeof(id));
    /* turn 1: what a chat completion answers for the same messages */
    want = chat_reply(v.port, msgs, 32);
    snprintf(path, sizeof(path), "/v1/sessions/%s/generate", id);
    j = req_json(v.port, "POST", path, KEY_A, NULL, &st);
    if (st != 200)
        fail_msg("generate: %d %s", st, cJSON_PrintUnformatted(j));
    assert_string_equal(
        cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "message"), "content")),
        want);
    p1 = usage(j, "prompt_tokens");
    c1 = usage(j, "completion_tokens");
    assert_true(p1 > 0 && c1 > 0);
    /* the reply is in the document now */
    d = cJSON_GetObjectItem(j, "document");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(d, "messages")), 2);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(
                            cJSON_GetArrayItem(cJSON_GetObjectItem(d, "messages"), 1), "content")),
                        want);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "turns")), 1);
    cJSON_Delete(j);
    free(want);

    /* turn 2 in one request: the customer's follow-up patched in, then generated */
    assert_int_equal(patch(v.port, KEY_A, id, "?generate=true",
                           "[{\"op\":\"add\",\"path\":\"/messages/-\",\"value\":{\"role\":\"user\","
                           "\"content\":\"Update: the shop refunded me quickly.\"}}]",
                           &j),
                     200);
    p2 = usage(j, "prompt_tokens");
    cached2 = usage(j, "cached_tokens");
    /* the new prompt holds turn 1's prompt and reply and more */
    assert_true(p2 > p1 + c1);
    /* every full block of turn 1's prompt and reply whose KV was computed comes from the cache
     * (the last reply token has KV when an end-of-turn token followed it, not when max_tokens
     * cut the reply), and nothing new does */
    {
        double seen_blocks = floor((p1 + c1 - 1) / BLOCK) * BLOCK;
        if (cached2 < seen_blocks || cached2 > p1 + c1)
            fail_msg("cached %g tokens; turn 1 had %g prompt + %g reply (%g in full blocks)",
                     cached2, p1, c1, seen_blocks);
        /* the reply's blocks count: more than the prompt's alone when it crossed a block */
        if (floor((p1 + c1 - 1) / BLOCK) > floor(p1 / BLOCK))
            assert_true(cached2 > floor(p1 / BLOCK) * BLOCK);
    }
    d = cJSON_GetObjectItem(j, "document");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(d, "messages")), 4);
    cJSON_Delete(j);

    /* a session is not busy after its turns: a patch works */
    assert_int_equal(patch(v.port, KEY_A, id, NULL,
                           "[{\"op\":\"test\",\"path\":\"/temperature\","
                           "\"value\":0}]",
                           NULL),
                     200);
    srv_stop(&v);
}

struct bg_turn {
    int port;
    char path[160];
    int status;
};

static void *bg_generate(void *arg)
{
    struct bg_turn *b = arg;
    cJSON *j = req_json(b->port, "POST", b->path, KEY_A, NULL, &b->status);
    cJSON_Delete(j);
    return NULL;
}

/* While a turn runs, the session takes no patch and no other turn (409); it does again after. */
static void a_running_turn_holds_the_session(void **state)
{
    struct srv v;
    struct bg_turn b = {0};
    pthread_t th;
    char id[64];
    int busy = 0, n_msgs;
    cJSON *j = NULL, *d;
    (void)state;
    srv_start(&v, NULL);
    create(v.port, KEY_A,
           "{\"messages\":[{\"role\":\"user\",\"content\":\"tell a long story\"}],"
           "\"max_tokens\":400,\"ignore_eos\":true,\"temperature\":0}",
           id, sizeof(id));
    b.port = v.port;
    snprintf(b.path, sizeof(b.path), "/v1/sessions/%s/generate", id);
    assert_int_equal(pthread_create(&th, NULL, bg_generate, &b), 0);
    for (int i = 0; i < 500 && !busy; i++) {
        int st =
            patch(v.port, KEY_A, id, NULL, "[{\"op\":\"add\",\"path\":\"/note\",\"value\":1}]", &j);
        if (st == 409) {
            assert_string_equal(error_code(j), "session_busy");
            busy = 1;
        } else {
            assert_int_equal(st, 200);
        }
        cJSON_Delete(j);
        usleep(2000);
    }
    assert_true(busy);
    pthread_join(th, NULL);
    assert_int_equal(b.status, 200);
    /* the reply is there once, after the user's message */
    d = get_doc(v.port, KEY_A, id);
    n_msgs = cJSON_GetArraySize(cJSON_GetObjectItem(d, "messages"));
    assert_int_equal(n_msgs, 2);
    cJSON_Delete(d);
    assert_int_equal(patch(v.port, KEY_A, id, NULL,
                           "[{\"op\":\"test\",\"path\":\"/messages/1/role\",\"value\":"
                           "\"assistant\"}]",
                           NULL),
                     200);
    srv_stop(&v);
}

static void generate_needs_messages(void **state)
{
    struct srv v;
    char id[64], path[160];
    int st;
    cJSON *j;
    (void)state;
    srv_start(&v, NULL);
    create(v.port, KEY_A, "{\"messages\":[]}", id, sizeof(id));
    snprintf(path, sizeof(path), "/v1/sessions/%s/generate", id);
    j = req_json(v.port, "POST", path, KEY_A, NULL, &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    /* asked in a patch: refused whole, the patch is not kept */
    assert_int_equal(patch(v.port, KEY_A, id, "?generate=true",
                           "[{\"op\":\"add\",\"path\":\"/note\",\"value\":1}]", NULL),
                     400);
    assert_doc(v.port, id, "{\"messages\":[]}");
    snprintf(path, sizeof(path), "/v1/sessions/%s/other", id);
    j = req_json(v.port, "POST", path, KEY_A, NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    srv_stop(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_get_delete),
        cmocka_unit_test(patch_each_operation),
        cmocka_unit_test(failing_patches_change_nothing),
        cmocka_unit_test(sessions_belong_to_their_key),
        cmocka_unit_test(sessions_expire_and_are_bounded),
        cmocka_unit_test(turns_reuse_the_kv_of_what_was_seen),
        cmocka_unit_test(a_running_turn_holds_the_session),
        cmocka_unit_test(generate_needs_messages),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
