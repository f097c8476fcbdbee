/* faults_test.c - the server's request handling under allocation failures (cJSON's included):
 * the n-th allocation fails for n = 1.. until the request succeeds untouched
 * (tests/harness/faults.h). Bodies are parsed and answers written (codec.c, JSON and
 * MessagePack), and the review routes below HTTP (server_review_handle: one review, a batch, a
 * JSONL job) run over a reply service with a scripted generator and an in-memory SQLite store.
 * Each failed request must still be answered exactly once, with an error status and an error
 * body ({"error": ...}) or none at all when even that could not be built, never a success
 * with a broken body; a failed job creation stores no job; nothing leaks (LeakSanitizer in the
 * ASan build). I/O errors: a store that cannot write (a file-size limit) gives an error
 * answer, and the service answers again once it can. The service's periodic work is pushed out of
 * the test's time so that only the request allocates while a failure is armed. */
#include "harness/faults.h"
#include "harness/harness.h"
#include "harness/reply_fakes.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reply/reply.h"
#include "server/server_internal.h"
#include "store/store.h"

static enum ar_status fake_generate(struct reply_generator *g, const struct reply_gen_request *r,
                                    char **text, size_t *len)
{
    char buf[160];
    (void)g;
    snprintf(buf, sizeof(buf), "感谢您的评价，编号%u已记录，欢迎再来！", th_fnv32(r->user));
    *text = ar_strdup(buf);
    *len = strlen(buf);
    return *text ? AR_OK : AR_ENOMEM;
}

static int setup(void **state)
{
    struct th_reply_fx *x = calloc(1, sizeof(*x));
    if (!x || th_reply_fx_open(x, fake_generate, true) != 0)
        return -1;
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    th_reply_fx_close(*state);
    free(*state);
    return 0;
}

/* ---- bodies in and out ----------------------------------------------------------------------- */

static const char review_json[] =
    "{\"shop_id\":\"s1\",\"review_id\":\"r1\",\"text\":\"很好吃，下次还来\",\"rating\":5,"
    "\"tags\":[\"a\",\"b\",{\"k\":[1,2.5,null,true]}]}";

/* Parses the body as JSON, writes it as MessagePack, parses that back: each step either
 * works or says out of memory, and what comes back is the same tree. */
static enum ar_status codec_round_trip(void *user, uint64_t n, uint64_t *made)
{
    cJSON *j = NULL, *back = NULL;
    char *mp = NULL;
    size_t len = 0;
    enum ar_status st;
    (void)user;
    ar_alloc_fail_after(n);
    st = server_codec_parse(SERVER_CODEC_JSON, review_json, strlen(review_json), &j, NULL);
    if (st == AR_OK)
        st = server_codec_write(SERVER_CODEC_MSGPACK, j, &mp, &len);
    if (st == AR_OK)
        st = server_codec_parse(SERVER_CODEC_MSGPACK, mp, len, &back, NULL);
    *made = ar_alloc_fail_after(0);
    if (st != AR_OK)
        assert_int_equal(st, AR_ENOMEM);
    else
        assert_true(cJSON_Compare(j, back, true));
    cJSON_Delete(j);
    cJSON_Delete(back);
    ar_free(mp);
    return st;
}

static void bodies_parse_and_write_or_say_out_of_memory(void **state)
{
    (void)state;
    th_fail_each_alloc("codec JSON -> MessagePack -> tree", codec_round_trip, NULL, 10000);
}

/* ---- the review routes ----------------------------------------------------------------------- */

struct answer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    int status;
    cJSON *json;
    bool text;
};

static void on_answer(void *ctx, int status, cJSON *json, const char *text, size_t len,
                      const char *ctype)
{
    struct answer *a = ctx;
    (void)len;
    (void)ctype;
    pthread_mutex_lock(&a->mu);
    a->calls++;
    a->status = status;
    a->json = json;
    a->text = text != NULL;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* One request through server_review_handle, armed from the call until its answer arrived. */
static void request(struct th_reply_fx *x, enum server_review_ep ep, const char *path, const cJSON *body,
                    const char *raw, uint64_t n, uint64_t *made, struct answer *a)
{
    memset(a, 0, sizeof(*a));
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    ar_alloc_fail_after(n);
    server_review_handle(x->svc, ep, path, body, raw, raw ? strlen(raw) : 0, NULL, on_answer, a,
                         NULL);
    pthread_mutex_lock(&a->mu);
    while (a->calls == 0)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    *made = ar_alloc_fail_after(0);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    assert_int_equal(a->calls, 1);
}

/* A failed answer: an error status and an {"error": {...}} body, or no body at all (when not
 * even that could be built). Returns AR_OK for a success (status < 300). */
static enum ar_status judge(const struct answer *a, uint64_t n, const char *what)
{
    if (a->status >= 200 && a->status < 300) {
        if (!a->json && !a->text)
            fail_msg("%s with allocation %llu failed: status %d without a body", what,
                     (unsigned long long)n, a->status);
        return AR_OK;
    }
    if (a->status < 400)
        fail_msg("%s with allocation %llu failed: status %d", what, (unsigned long long)n,
                 a->status);
    if (a->json && !cJSON_IsObject(cJSON_GetObjectItem(a->json, "error")))
        fail_msg("%s with allocation %llu failed: status %d with a body that is no error", what,
                 (unsigned long long)n, a->status);
    return AR_ENOMEM;
}

struct route_ctx {
    struct th_reply_fx *x;
    cJSON *body;
};

/* A new review each attempt (its own id and text). */
static enum ar_status reply_route(void *user, uint64_t n, uint64_t *made)
{
    struct route_ctx *c = user;
    struct answer a;
    char text[64];
    enum ar_status st;
    snprintf(text, sizeof(text), "第%llu次，味道不错", (unsigned long long)n);
    cJSON_ReplaceItemInObject(c->body, "text", cJSON_CreateString(text));
    cJSON_ReplaceItemInObject(c->body, "review_id", cJSON_CreateString(text));
    request(c->x, SERVER_REVIEW_REPLY, "/v1/reviews/reply", c->body, NULL, n, made, &a);
    st = judge(&a, n, "POST /v1/reviews/reply");
    if (st == AR_OK)
        assert_true(cJSON_IsString(cJSON_GetObjectItem(a.json, "reply")));
    cJSON_Delete(a.json);
    return st;
}

static void review_route_answers_cleanly_at_every_allocation(void **state)
{
    struct route_ctx c = {*state, cJSON_Parse(review_json)};
    assert_non_null(c.body);
    th_fail_each_alloc("POST /v1/reviews/reply", reply_route, &c, 100000);
    cJSON_Delete(c.body);
}

static enum ar_status batch_route(void *user, uint64_t n, uint64_t *made)
{
    struct route_ctx *c = user;
    struct answer a;
    char shop[32];
    enum ar_status st;
    snprintf(shop, sizeof(shop), "shop-%llu", (unsigned long long)n);
    cJSON_ReplaceItemInObject(c->body, "shop_id", cJSON_CreateString(shop));
    request(c->x, SERVER_REVIEW_BATCH, "/v1/reviews/batch", c->body, NULL, n, made, &a);
    st = judge(&a, n, "POST /v1/reviews/batch");
    if (st == AR_OK)
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(a.json, "results")), 3);
    cJSON_Delete(a.json);
    return st;
}

static void batch_route_answers_cleanly_at_every_allocation(void **state)
{
    struct route_ctx c = {*state, cJSON_Parse("{\"shop_id\":\"s\",\"reviews\":["
                                              "{\"review_id\":\"a\",\"text\":\"好\",\"rating\":5},"
                                              "{\"review_id\":\"b\",\"text\":\"差\",\"rating\":1},"
                                              "{\"id\":\"c\",\"text\":\"ok\",\"rating\":3}]}")};
    assert_non_null(c.body);
    th_fail_each_alloc("POST /v1/reviews/batch", batch_route, &c, 100000);
    cJSON_Delete(c.body);
}

/* A JSONL job: a failed creation stores no job. */
static enum ar_status job_route(void *user, uint64_t n, uint64_t *made)
{
    struct route_ctx *c = user;
    static const char body[] = "{\"shop_id\":\"s1\",\"review_id\":\"j1\",\"text\":\"很好\","
                               "\"rating\":5}\n\n{\"shop_id\":\"s1\",\"review_id\":\"j2\","
                               "\"text\":\"太慢\",\"rating\":2}\n";
    struct answer a;
    int64_t before, after, bytes;
    enum ar_status st;
    assert_int_equal(store_job_usage(c->x->store, "", &before, &bytes, NULL), AR_OK);
    request(c->x, SERVER_REVIEW_JOB_CREATE, "/v1/jobs", NULL, body, n, made, &a);
    st = judge(&a, n, "POST /v1/jobs");
    assert_int_equal(store_job_usage(c->x->store, "", &after, &bytes, NULL), AR_OK);
    if (st != AR_OK && after != before)
        fail_msg("POST /v1/jobs failed at allocation %llu (status %d), yet a job was stored",
                 (unsigned long long)n, a.status);
    if (st == AR_OK) {
        assert_int_equal(after, before + 1);
        assert_true(cJSON_IsString(cJSON_GetObjectItem(a.json, "job_id")) ||
                    cJSON_IsString(cJSON_GetObjectItem(a.json, "id")));
    }
    cJSON_Delete(a.json);
    return st;
}

static void job_route_creates_all_or_nothing_at_every_allocation(void **state)
{
    struct route_ctx c = {*state, NULL};
    th_fail_each_alloc("POST /v1/jobs", job_route, &c, 100000);
}

/* ---- I/O errors ------------------------------------------------------------------------------ */

/* Disk full under the review route: in a child (a file-size limit is per process; SIGXFSZ
 * ignored, so writes fail with EFBIG), a service over a SQLite file answers reviews with long
 * texts until the store cannot write; that answer must be an error status with an error body,
 * and once the limit is lifted the same review is answered. Exit codes name what went wrong. */
static int disk_full_child(const char *dir)
{
    struct store *store = NULL;
    struct reply_profiles *profiles = NULL;
    struct reply_service *svc = NULL;
    struct reply_generator gen = {fake_generate, NULL, "fake"};
    struct reply_service_params p = reply_service_default_params();
    struct th_reply_fx x;
    struct rlimit rl;
    static char text[REPLY_TEXT_MAX];
    char path[128];
    int failed_at = -1, rc = 0;
    signal(SIGXFSZ, SIG_IGN);
    snprintf(path, sizeof(path), "%s/replies.db", dir);
    if (store_open(path, &store, NULL) != AR_OK || th_profiles_single(&profiles) != AR_OK)
        return 2;
    p.profiles = profiles;
    p.store = store;
    p.gen = &gen;
    p.n_workers = 1;
    p.job_sweep_s = 86400;
    p.claim_lease_s = 86400;
    if (reply_service_create(&p, &svc) != AR_OK)
        return 3;
    x.store = store;
    x.profiles = profiles;
    x.svc = svc;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = 256 * 1024;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
        return 4;
    for (int i = 0; i < 200 && failed_at < 0; i++) {
        cJSON *body = cJSON_CreateObject();
        struct answer a;
        uint64_t made;
        char id[32];
        snprintf(id, sizeof(id), "long-%d", i);
        memset(text, 'a' + i % 26, sizeof(text) - 1);
        cJSON_AddStringToObject(body, "shop_id", "s1");
        cJSON_AddStringToObject(body, "review_id", id);
        cJSON_AddStringToObject(body, "text", text);
        cJSON_AddNumberToObject(body, "rating", 4);
        request(&x, SERVER_REVIEW_REPLY, "/v1/reviews/reply", body, NULL, 0, &made, &a);
        if (a.status != 200) {
            failed_at = i;
            if (a.status < 500 || !cJSON_IsObject(cJSON_GetObjectItem(a.json, "error")))
                rc = 5;
            printf("file-size limit: review %d answered %d\n", i, a.status);
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_FSIZE, &rl);
            cJSON_Delete(a.json);
            request(&x, SERVER_REVIEW_REPLY, "/v1/reviews/reply", body, NULL, 0, &made, &a);
            if (a.status != 200 && rc == 0)
                rc = 6;
        }
        cJSON_Delete(a.json);
        cJSON_Delete(body);
    }
    if (failed_at < 0 && rc == 0)
        rc = 7; /* the limit never bit */
    reply_service_destroy(svc);
    reply_profiles_destroy(profiles);
    store_close(store);
    fflush(stdout);
    return rc;
}

static void a_store_that_cannot_write_gives_an_error_answer(void **state)
{
    char dir[64], cmd[128];
    pid_t pid;
    int status;
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/ar_srv_faults_XXXXXX");
    assert_non_null(mkdtemp(dir));
    fflush(stdout);
    pid = fork();
    if (pid == 0)
        _exit(disk_full_child(dir));
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bodies_parse_and_write_or_say_out_of_memory),
        cmocka_unit_test_setup_teardown(review_route_answers_cleanly_at_every_allocation, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(batch_route_answers_cleanly_at_every_allocation, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(job_route_creates_all_or_nothing_at_every_allocation, setup,
                                        teardown),
        cmocka_unit_test(a_store_that_cannot_write_gives_an_error_answer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
