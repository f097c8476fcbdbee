/* jobs_api_test.c - the jobs API over HTTP, with two API keys: POST /v1/jobs takes only JSONL or
 * JSON content types and checks every line first (the defect "POST /v1/jobs stores anything":
 * garbage with any content type got 202 and was stored), or turns bad lines into per-line
 * errors when asked; per-key quotas on open jobs (429) and stored bytes (413); a job is visible
 * only to the key that made it (404 for any other); GET /v1/jobs lists the caller's jobs newest
 * first in pages; DELETE cancels (pending lines never run) then deletes; results come in pages
 * or as an NDJSON stream; a completion callback reaches a loopback receiver once, after failed
 * attempts retried with a growing pause.
 * Independent truth: the store read directly (what was stored), the fake model's call count,
 * the ids the API handed out in creation order, and what the test's own receiver saw. */
#include "harness/harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "harness/http_client.h"
#include "harness/reply_fakes.h"

#include "base/base.h"
#include "reply/reply.h"
#include "server/server.h"
#include "store/store.h"

#define KEY_A "key-a-0123456789"
#define KEY_B "key-b-9876543210"
#define OWNER_A "key:0" /* the server's identity for the first key of the file */
#define MAX_OPEN 3
#define MAX_BYTES 200000

/* ---- a fake model that counts its calls ---------------------------------------------------- */

struct fake {
    struct reply_generator base;
    atomic_int calls;
};

static enum ar_status fake_generate(struct reply_generator *g, const struct reply_gen_request *r,
                                    char **text, size_t *len)
{
    struct fake *f = (struct fake *)g;
    char buf[128];
    atomic_fetch_add(&f->calls, 1);
    snprintf(buf, sizeof(buf), "Thank you, note %u.", th_fnv32(r->user));
    *text = ar_strdup(buf);
    *len = strlen(buf);
    return *text ? AR_OK : AR_ENOMEM;
}

/* ---- fixture ------------------------------------------------------------------------------- */

struct fx {
    char dir[64];
    struct store *store;
    struct reply_profiles *profiles;
    struct cache *cache;
    struct metrics_registry *metrics;
    struct reply_service *svc;
    struct fake gen;
    struct server *srv;
    int port;
};

static int setup(void **state)
{
    struct fx *x = calloc(1, sizeof(*x));
    struct cache_memory_params cp = cache_memory_default_params();
    struct reply_service_params p = reply_service_default_params();
    struct server_params sp = server_default_params();
    struct server_reviews_params rp = server_reviews_default_params();
    struct ar_err err = {0};
    char path[128], keys[128];
    FILE *kf;
    signal(SIGPIPE, SIG_IGN);
    ar_log_set_level(AR_LOG_ERROR);
    snprintf(x->dir, sizeof(x->dir), "/tmp/ar_jobs_api_XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    snprintf(path, sizeof(path), "%s/replies.db", x->dir);
    assert_int_equal(store_open(path, &x->store, NULL), AR_OK);
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
    p.webhook_tries = 4;
    p.webhook_backoff_s = 0.2;
    p.webhook_timeout_s = 2;
    assert_int_equal(reply_service_create(&p, &x->svc), AR_OK);

    snprintf(keys, sizeof(keys), "%s/keys", x->dir);
    kf = fopen(keys, "w");
    assert_non_null(kf);
    fprintf(kf, "%s\n%s\n", KEY_A, KEY_B);
    fclose(kf);
    sp.host = "127.0.0.1";
    sp.port = 0;
    sp.api_key_file = keys;
    sp.metrics = x->metrics;
    rp.job_max_open = MAX_OPEN;
    rp.job_max_bytes = MAX_BYTES;
    if (server_create(&sp, &x->srv, &err) != AR_OK)
        fail_msg("server_create: %s", err.msg);
    assert_int_equal(server_reviews_attach(x->srv, x->svc, &rp), AR_OK);
    if (server_start(x->srv, &err) != AR_OK)
        fail_msg("server_start: %s", err.msg);
    /* no engine: jobs are stored and read without the model */
    x->port = server_port(x->srv);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fx *x = *state;
    char cmd[160];
    server_stop(x->srv, 5);
    reply_service_destroy(x->svc);
    server_destroy(x->srv);
    metrics_registry_destroy(x->metrics);
    cache_destroy(x->cache);
    reply_profiles_destroy(x->profiles);
    store_close(x->store);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", x->dir);
    assert_int_equal(system(cmd), 0);
    free(x);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* A request as key (NULL: none) with a content type (NULL: none) and extra headers; the
 * answer parsed when it is JSON. */
static cJSON *req_h(struct fx *x, const char *key, const char *method, const char *path,
                    const char *ctype, const char *extra, const void *body, size_t len,
                    struct resp *r)
{
    char head[512];
    int n = 0;
    head[0] = '\0';
    if (key)
        n += snprintf(head + n, sizeof(head) - (size_t)n, "Authorization: Bearer %s\r\n", key);
    if (ctype)
        n += snprintf(head + n, sizeof(head) - (size_t)n, "Content-Type: %s\r\n", ctype);
    if (extra)
        snprintf(head + n, sizeof(head) - (size_t)n, "%s", extra);
    http(x->port, method, path, head, body, len, r);
    return r->body ? cJSON_Parse(r->body) : NULL;
}

static cJSON *req(struct fx *x, const char *key, const char *method, const char *path,
                  const char *ctype, const char *body, struct resp *r)
{
    return req_h(x, key, method, path, ctype, NULL, body, body ? strlen(body) : 0, r);
}

static const char *err_code(const cJSON *j)
{
    const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code");
    return cJSON_IsString(c) ? c->valuestring : "";
}

static const char *str_of(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItem(j, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static int int_of(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItem(j, name);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

/* n good review lines as JSONL, ids from first; new (free). */
static char *good_lines(int first, int n)
{
    size_t cap = (size_t)n * 120 + 1, off = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    s[0] = '\0';
    for (int i = 0; i < n; i++)
        off += (size_t)snprintf(s + off, cap - off,
                                "{\"shop_id\":\"s1\",\"review_id\":\"r%d\",\"text\":\"Review %d "
                                "is fine\",\"rating\":5}\n",
                                first + i, first + i);
    return s;
}

/* Creates a job of n good lines as key; its id into id. */
static void create_job(struct fx *x, const char *key, int first, int n, const char *query,
                       char id[STORE_JOB_ID_LEN + 1])
{
    struct resp r;
    char path[256], *body = good_lines(first, n);
    cJSON *j;
    snprintf(path, sizeof(path), "/v1/jobs%s", query ? query : "");
    j = req(x, key, "POST", path, "application/x-ndjson", body, &r);
    if (r.status != 202)
        fail_msg("create: status %d: %s", r.status, r.body);
    snprintf(id, STORE_JOB_ID_LEN + 1, "%s", str_of(j, "id"));
    assert_int_equal(strlen(id), STORE_JOB_ID_LEN);
    assert_int_equal(int_of(j, "total"), n);
    cJSON_Delete(j);
    resp_free(&r);
    free(body);
}

/* The job bytes of every owner the tests use, read from the store itself. */
static int stored_bytes(struct fx *x)
{
    static const char *const owners[] = {"key:0", "key:1", "", "127.0.0.1"};
    int total = 0;
    for (size_t i = 0; i < AR_ARRAY_LEN(owners); i++) {
        int64_t open = 0, bytes = 0;
        assert_int_equal(store_job_usage(x->store, owners[i], &open, &bytes, NULL), AR_OK);
        total += (int)bytes;
    }
    return total;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (up to 20 s) for the job's status. */
static void wait_status(struct fx *x, const char *id, enum store_job_status want)
{
    double t0 = mono_s();
    for (;;) {
        struct store_job_info info;
        bool found = false;
        assert_int_equal(store_job_get(x->store, id, &info, &found, NULL), AR_OK);
        assert_true(found);
        if (info.status == want)
            return;
        if (mono_s() - t0 > 20)
            fail_msg("job %s stayed %s", id, store_job_status_str(info.status));
        sleep_ms(20);
    }
}

/* ---- the tests ------------------------------------------------------------------------------ */

/* The defect: any bytes with any content type got 202 and were stored. Now a type that is not
 * JSONL or JSON is 415, garbage under a right type is 400, and nothing is stored either way. */
static void garbage_is_refused_and_nothing_is_stored(void **state)
{
    struct fx *x = *state;
    static const char garbage[] = "\x01\xff\xfe garbage \x7f\x80 not a job at all\n\x02\x03";
    static const struct {
        const char *ctype;
        int status;
    } cases[] = {
        {"application/octet-stream", 415},
        {"text/plain", 415},
        {"application/x-www-form-urlencoded", 415},
        {"multipart/form-data; boundary=x", 415},
        {NULL, 415},
        {"application/x-ndjson", 400},
        {"application/jsonl", 400},
        {"application/json-lines", 400},
        {"application/json", 400},
        {"Application/JSON; charset=utf-8", 400},
    };
    for (size_t i = 0; i < AR_ARRAY_LEN(cases); i++) {
        struct resp r;
        cJSON *j = req_h(x, KEY_A, "POST", "/v1/jobs", cases[i].ctype, NULL, garbage,
                         sizeof(garbage) - 1, &r);
        if (r.status != cases[i].status)
            fail_msg("%s: status %d, want %d: %s", cases[i].ctype ? cases[i].ctype : "(none)",
                     r.status, cases[i].status, r.body);
        assert_true(cJSON_IsObject(cJSON_GetObjectItem(j, "error")));
        if (cases[i].status == 415)
            assert_string_equal(err_code(j), "unsupported_media_type");
        cJSON_Delete(j);
        resp_free(&r);
    }
    /* a good job under a wrong type is refused just the same */
    {
        struct resp r;
        char *body = good_lines(1, 2);
        cJSON *j = req(x, KEY_A, "POST", "/v1/jobs", "text/plain", body, &r);
        assert_int_equal(r.status, 415);
        cJSON_Delete(j);
        resp_free(&r);
        free(body);
    }
    assert_int_equal(stored_bytes(x), 0);
    {
        struct resp r;
        cJSON *j = req(x, KEY_A, "GET", "/v1/jobs", NULL, NULL, &r);
        assert_int_equal(r.status, 200);
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "data")), 0);
        cJSON_Delete(j);
        resp_free(&r);
    }
}

/* Every line is checked first: the first bad ones are named (400, nothing stored), unless the
 * client asks for per-line errors: then they are error results and the rest runs. */
static void bad_lines_are_named_or_become_per_line_errors(void **state)
{
    struct fx *x = *state;
    static const char body[] =
        "{\"shop_id\":\"s1\",\"review_id\":\"g1\",\"text\":\"Good one\",\"rating\":5}\n"
        "{not json\n"
        "\n"
        "{\"shop_id\":\"s1\",\"review_id\":\"g2\",\"text\":\"Also good\",\"rating\":4}\n"
        "{\"shop_id\":\"s1\",\"review_id\":\"g3\",\"rating\":5}\n"
        "[1, 2]\n"
        "{\"shop_id\":\"s1\",\"review_id\":\"g4\",\"text\":\"Stars\",\"rating\":9}\n";
    static const int bad[] = {2, 5, 6, 7};
    struct resp r;
    cJSON *j, *lines;
    char id[STORE_JOB_ID_LEN + 1], path[128];

    j = req(x, KEY_A, "POST", "/v1/jobs", "application/x-ndjson", body, &r);
    assert_int_equal(r.status, 400);
    assert_int_equal(int_of(j, "invalid_lines"), 4);
    lines = cJSON_GetObjectItem(j, "lines");
    assert_int_equal(cJSON_GetArraySize(lines), 4);
    for (int i = 0; i < 4; i++) {
        const cJSON *l = cJSON_GetArrayItem(lines, i);
        assert_int_equal(int_of(l, "line"), bad[i]);
        assert_true(strlen(str_of(l, "message")) > 0);
    }
    assert_non_null(strstr(str_of(cJSON_GetObjectItem(j, "error"), "message"), "line 2"));
    cJSON_Delete(j);
    resp_free(&r);
    assert_int_equal(stored_bytes(x), 0);

    /* the same as JSON, {"items": [...]}: the array's elements are its lines */
    j = req(x, KEY_A, "POST", "/v1/jobs", "application/json",
            "{\"items\":[{\"shop_id\":\"s1\",\"review_id\":\"g1\",\"text\":\"ok\",\"rating\":5},"
            "\"a string\",{\"shop_id\":\"s1\",\"review_id\":\"g9\",\"rating\":5}]}",
            &r);
    assert_int_equal(r.status, 400);
    lines = cJSON_GetObjectItem(j, "lines");
    assert_int_equal(cJSON_GetArraySize(lines), 2);
    assert_int_equal(int_of(cJSON_GetArrayItem(lines, 0), "line"), 2);
    assert_int_equal(int_of(cJSON_GetArrayItem(lines, 1), "line"), 3);
    cJSON_Delete(j);
    resp_free(&r);
    assert_int_equal(stored_bytes(x), 0);

    /* per-line errors, asked for in the query */
    j = req(x, KEY_A, "POST", "/v1/jobs?errors=per_line", "application/x-ndjson", body, &r);
    assert_int_equal(r.status, 202);
    assert_int_equal(int_of(j, "total"), 6);
    assert_int_equal(int_of(j, "invalid"), 4);
    snprintf(id, sizeof(id), "%s", str_of(j, "id"));
    cJSON_Delete(j);
    resp_free(&r);
    assert_int_equal(reply_job_run(x->svc, id, NULL, NULL, NULL), AR_OK);
    assert_int_equal(atomic_load(&x->gen.calls), 2); /* only the good lines reach the model */
    snprintf(path, sizeof(path), "/v1/jobs/%s/results?format=json", id);
    j = req(x, KEY_A, "GET", path, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    {
        const cJSON *data = cJSON_GetObjectItem(j, "data");
        static const int want_line[] = {1, 2, 4, 5, 6, 7};
        assert_int_equal(cJSON_GetArraySize(data), 6);
        for (int i = 0; i < 6; i++) {
            const cJSON *it = cJSON_GetArrayItem(data, i);
            bool is_bad = want_line[i] == 2 || want_line[i] >= 5;
            assert_int_equal(int_of(it, "line"), want_line[i]);
            assert_int_equal(cJSON_IsString(cJSON_GetObjectItem(it, "error")), is_bad);
            assert_int_equal(cJSON_IsString(cJSON_GetObjectItem(it, "reply")), !is_bad);
        }
    }
    cJSON_Delete(j);
    resp_free(&r);

    /* ... or in the body */
    j = req(x, KEY_A, "POST", "/v1/jobs", "application/json",
            "{\"errors\":\"per_line\",\"items\":[{\"shop_id\":\"s1\",\"review_id\":\"g5\","
            "\"text\":\"ok\",\"rating\":5},7]}",
            &r);
    assert_int_equal(r.status, 202);
    assert_int_equal(int_of(j, "invalid"), 1);
    cJSON_Delete(j);
    resp_free(&r);
}

/* A key may keep MAX_OPEN unfinished jobs (then 429) and MAX_BYTES stored bytes (then 413);
 * another key has its own quota; cancelling and deleting make room. */
static void quotas_are_per_key(void **state)
{
    struct fx *x = *state;
    char ids[MAX_OPEN][STORE_JOB_ID_LEN + 1], other[STORE_JOB_ID_LEN + 1], path[128];
    struct resp r;
    cJSON *j;
    char *body = good_lines(100, 2), *big;
    for (int i = 0; i < MAX_OPEN; i++)
        create_job(x, KEY_A, 10 * i, 2, NULL, ids[i]);
    j = req(x, KEY_A, "POST", "/v1/jobs", "application/x-ndjson", body, &r);
    assert_int_equal(r.status, 429);
    assert_string_equal(err_code(j), "job_quota_exceeded");
    assert_non_null(
        strstr(str_of(cJSON_GetObjectItem(j, "error"), "message"), "queued or running"));
    cJSON_Delete(j);
    resp_free(&r);
    create_job(x, KEY_B, 200, 2, NULL, other); /* B is not A */

    /* a cancelled job is not open: room for one more */
    snprintf(path, sizeof(path), "/v1/jobs/%s", ids[0]);
    j = req(x, KEY_A, "DELETE", path, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    cJSON_Delete(j);
    resp_free(&r);
    create_job(x, KEY_A, 300, 2, NULL, ids[0]);

    /* bytes: first room under the open-job quota (two of A's jobs cancelled and deleted) */
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "/v1/jobs/%s", ids[i]);
        resp_free(&r);
        cJSON_Delete(req(x, KEY_A, "DELETE", path, NULL, NULL, &r));
        assert_int_equal(r.status, 200);
        resp_free(&r);
        cJSON_Delete(req(x, KEY_A, "DELETE", path, NULL, NULL, &r)); /* and deleted */
        assert_int_equal(r.status, 200);
        resp_free(&r);
    }
    {
        /* one line more than fits beside what A keeps (a stored line has no newline) */
        int64_t open = 0, bytes = 0, line_len;
        char *one = good_lines(1000, 1);
        line_len = (int64_t)strlen(one) - 1;
        free(one);
        assert_int_equal(store_job_usage(x->store, OWNER_A, &open, &bytes, NULL), AR_OK);
        assert_int_equal(open, 1);
        assert_true(bytes >= line_len); /* so the job below alone fits in MAX_BYTES */
        big = good_lines(1000, (int)((MAX_BYTES - bytes) / line_len) + 1);
    }
    j = req(x, KEY_A, "POST", "/v1/jobs", "application/x-ndjson", big, &r);
    assert_int_equal(r.status, 413);
    assert_string_equal(err_code(j), "job_quota_exceeded");
    cJSON_Delete(j);
    resp_free(&r);
    /* B, once its own job is gone, may store it */
    snprintf(path, sizeof(path), "/v1/jobs/%s?purge=true", other);
    cJSON_Delete(req(x, KEY_B, "DELETE", path, NULL, NULL, &r));
    assert_int_equal(r.status, 200);
    resp_free(&r);
    j = req(x, KEY_B, "POST", "/v1/jobs", "application/x-ndjson", big, &r);
    assert_int_equal(r.status, 202);
    cJSON_Delete(j);
    resp_free(&r);
    free(big);
    free(body);
}

/* A job belongs to the key that made it: for any other, it does not exist. */
static void another_key_gets_404_on_everything(void **state)
{
    struct fx *x = *state;
    char id[STORE_JOB_ID_LEN + 1], path[160];
    static const struct {
        const char *method, *suffix;
    } calls[] = {
        {"GET", ""},    {"GET", "/results"},       {"GET", "/results?format=json"},
        {"DELETE", ""}, {"DELETE", "?purge=true"},
    };
    struct resp r;
    cJSON *j;
    create_job(x, KEY_A, 1, 3, NULL, id);
    for (size_t i = 0; i < AR_ARRAY_LEN(calls); i++) {
        snprintf(path, sizeof(path), "/v1/jobs/%s%s", id, calls[i].suffix);
        j = req(x, KEY_B, calls[i].method, path, NULL, NULL, &r);
        if (r.status != 404)
            fail_msg("%s %s as B: %d", calls[i].method, path, r.status);
        assert_null(strstr(r.body, id) ? "the answer names the job" : NULL);
        cJSON_Delete(j);
        resp_free(&r);
    }
    j = req(x, KEY_B, "GET", "/v1/jobs", NULL, NULL, &r);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "data")), 0);
    cJSON_Delete(j);
    resp_free(&r);
    /* untouched for A */
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    j = req(x, KEY_A, "GET", path, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_of(j, "status"), "queued");
    assert_int_equal(int_of(j, "total"), 3);
    cJSON_Delete(j);
    resp_free(&r);
    /* no key at all: 401 */
    j = req(x, NULL, "GET", path, NULL, NULL, &r);
    assert_int_equal(r.status, 401);
    cJSON_Delete(j);
    resp_free(&r);
}

/* GET /v1/jobs: the caller's jobs, newest first, in pages that follow next_cursor. */
static void list_is_newest_first_in_pages(void **state)
{
    struct fx *x = *state;
    char ids[5][STORE_JOB_ID_LEN + 1], other[STORE_JOB_ID_LEN + 1], path[128];
    int seen = 0;
    char cursor[32] = "";
    struct resp r;
    cJSON *j;
    /* more than MAX_OPEN jobs: finish each as it is made */
    for (int i = 0; i < 5; i++) {
        create_job(x, KEY_A, 10 * i, 1, NULL, ids[i]);
        assert_int_equal(reply_job_run(x->svc, ids[i], NULL, NULL, NULL), AR_OK);
        if (i == 2)
            create_job(x, KEY_B, 500, 1, NULL, other);
    }
    for (int page = 0; page < 4; page++) {
        const cJSON *data, *more, *next;
        if (cursor[0])
            snprintf(path, sizeof(path), "/v1/jobs?limit=2&cursor=%s", cursor);
        else
            snprintf(path, sizeof(path), "/v1/jobs?limit=2");
        j = req(x, KEY_A, "GET", path, NULL, NULL, &r);
        assert_int_equal(r.status, 200);
        data = cJSON_GetObjectItem(j, "data");
        more = cJSON_GetObjectItem(j, "has_more");
        next = cJSON_GetObjectItem(j, "next_cursor");
        for (int k = 0; k < cJSON_GetArraySize(data); k++) {
            /* newest first: the ids in the reverse of creation order */
            assert_true(seen < 5);
            assert_string_equal(str_of(cJSON_GetArrayItem(data, k), "id"), ids[4 - seen]);
            assert_string_equal(str_of(cJSON_GetArrayItem(data, k), "status"), "done");
            seen++;
        }
        if (!cJSON_IsTrue(more)) {
            assert_true(cJSON_IsNull(next));
            cJSON_Delete(j);
            resp_free(&r);
            break;
        }
        assert_int_equal(cJSON_GetArraySize(data), 2);
        assert_true(cJSON_IsString(next));
        snprintf(cursor, sizeof(cursor), "%s", next->valuestring);
        cJSON_Delete(j);
        resp_free(&r);
    }
    assert_int_equal(seen, 5);
    /* "after" is the cursor's other name; bad limits and cursors are 400 */
    j = req(x, KEY_A, "GET", "/v1/jobs?limit=0", NULL, NULL, &r);
    assert_int_equal(r.status, 400);
    cJSON_Delete(j);
    resp_free(&r);
    j = req(x, KEY_A, "GET", "/v1/jobs?cursor=abc", NULL, NULL, &r);
    assert_int_equal(r.status, 400);
    cJSON_Delete(j);
    resp_free(&r);
    j = req(x, KEY_A, "GET", "/v1/jobs?limit=1", NULL, NULL, &r);
    snprintf(path, sizeof(path), "/v1/jobs?limit=10&after=%s", str_of(j, "next_cursor"));
    cJSON_Delete(j);
    resp_free(&r);
    j = req(x, KEY_A, "GET", path, NULL, NULL, &r);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "data")), 4);
    assert_string_equal(str_of(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0), "id"),
                        ids[3]);
    cJSON_Delete(j);
    resp_free(&r);
}

/* DELETE cancels: the pending lines never run (even once the runner starts), finished ones
 * stay; a second DELETE deletes; purge=true deletes a finished job at once. */
static void delete_cancels_then_deletes(void **state)
{
    struct fx *x = *state;
    char id[STORE_JOB_ID_LEN + 1], done_id[STORE_JOB_ID_LEN + 1], path[160];
    struct resp r;
    cJSON *j;
    create_job(x, KEY_A, 1, 4, NULL, id);
    /* one line finished before the cancel (as a worker would) */
    assert_int_equal(store_job_item_done(x->store, id, 1, "{\"line\":1,\"reply\":\"kept\"}", NULL),
                     AR_OK);
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    j = req(x, KEY_A, "DELETE", path, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_of(j, "status"), "cancelled");
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "deleted")));
    assert_int_equal(int_of(j, "done"), 1);
    cJSON_Delete(j);
    resp_free(&r);

    assert_int_equal(reply_jobs_start(x->svc), AR_OK);
    sleep_ms(500); /* the runner had its chance at the queued lines */
    assert_int_equal(atomic_load(&x->gen.calls), 0);
    snprintf(path, sizeof(path), "/v1/jobs/%s/results", id);
    j = req(x, KEY_A, "GET", path, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    {
        /* line 1 kept, lines 2-4 cancelled */
        char *p = r.body;
        for (int line = 1; line <= 4; line++) {
            char *nl = strchr(p, '\n');
            cJSON *it;
            assert_non_null(nl);
            it = cJSON_ParseWithLength(p, (size_t)(nl - p));
            assert_int_equal(int_of(it, "line"), line);
            if (line == 1)
                assert_string_equal(str_of(it, "reply"), "kept");
            else
                assert_string_equal(str_of(it, "status"), "cancelled");
            cJSON_Delete(it);
            p = nl + 1;
        }
        assert_string_equal(p, "");
    }
    cJSON_Delete(j);
    resp_free(&r);

    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    j = req(x, KEY_A, "DELETE", path, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "deleted")));
    cJSON_Delete(j);
    resp_free(&r);
    cJSON_Delete(req(x, KEY_A, "GET", path, NULL, NULL, &r));
    assert_int_equal(r.status, 404);
    resp_free(&r);
    cJSON_Delete(req(x, KEY_A, "DELETE", path, NULL, NULL, &r));
    assert_int_equal(r.status, 404);
    resp_free(&r);

    /* a job the runner finishes, then purged */
    create_job(x, KEY_A, 50, 2, NULL, done_id);
    wait_status(x, done_id, STORE_JOB_DONE);
    assert_int_equal(atomic_load(&x->gen.calls), 2);
    snprintf(path, sizeof(path), "/v1/jobs/%s?purge=true", done_id);
    j = req(x, KEY_A, "DELETE", path, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "deleted")));
    cJSON_Delete(j);
    resp_free(&r);
    assert_int_equal(stored_bytes(x), 0);
}

/* Results: JSON pages that follow next_cursor cover every line once, in order; NDJSON pages
 * say where the next starts (X-Next-Cursor); without a limit NDJSON is streamed whole. */
static void results_come_in_pages_and_as_a_stream(void **state)
{
    struct fx *x = *state;
    enum { N = 1500 }; /* results of ~400 KB: more than a stream may hold for a client */
    char id[STORE_JOB_ID_LEN + 1], path[200], cursor[32] = "", hdr[64];
    int next_line = 1;
    struct resp r;
    cJSON *j;
    create_job(x, KEY_A, 1, N, NULL, id);
    assert_int_equal(reply_job_run(x->svc, id, NULL, NULL, NULL), AR_OK);
    for (int page = 0; page < 10; page++) {
        const cJSON *data, *next;
        if (cursor[0])
            snprintf(path, sizeof(path), "/v1/jobs/%s/results?limit=170&cursor=%s", id, cursor);
        else
            snprintf(path, sizeof(path), "/v1/jobs/%s/results?limit=170", id);
        j = req_h(x, KEY_A, "GET", path, NULL, "Accept: application/json\r\n", NULL, 0, &r);
        assert_int_equal(r.status, 200);
        data = cJSON_GetObjectItem(j, "data");
        for (int k = 0; k < cJSON_GetArraySize(data); k++) {
            const cJSON *it = cJSON_GetArrayItem(data, k);
            char rid[16];
            snprintf(rid, sizeof(rid), "r%d", next_line);
            assert_int_equal(int_of(it, "line"), next_line);
            assert_string_equal(str_of(it, "review_id"), rid);
            next_line++;
        }
        next = cJSON_GetObjectItem(j, "next_cursor");
        if (!cJSON_IsTrue(cJSON_GetObjectItem(j, "has_more"))) {
            assert_true(cJSON_IsNull(next));
            cJSON_Delete(j);
            resp_free(&r);
            break;
        }
        assert_int_equal(cJSON_GetArraySize(data), 170);
        snprintf(cursor, sizeof(cursor), "%s", next->valuestring);
        cJSON_Delete(j);
        resp_free(&r);
    }
    assert_int_equal(next_line, N + 1);

    /* an NDJSON page */
    snprintf(path, sizeof(path), "/v1/jobs/%s/results?format=ndjson&limit=10&cursor=5", id);
    cJSON_Delete(req(x, KEY_A, "GET", path, NULL, NULL, &r));
    assert_int_equal(r.status, 200);
    assert_non_null(resp_header(&r, "X-Next-Cursor", hdr, sizeof(hdr)));
    assert_string_equal(hdr, "15");
    {
        int n = 0;
        for (char *p = r.body; (p = strchr(p, '\n')) != NULL; p++)
            n++;
        cJSON *first = cJSON_Parse(r.body); /* the first line */
        assert_int_equal(n, 10);
        assert_int_equal(int_of(first, "line"), 6);
        cJSON_Delete(first);
    }
    resp_free(&r);

    /* the whole stream, to a client that reads nothing for a second first: the server waits
     * for it (a bounded buffer) and every line still arrives, in order */
    snprintf(path, sizeof(path), "/v1/jobs/%s/results", id);
    {
        char head[512];
        int fd = connect_port(x->port), hl;
        size_t n = 0;
        char *raw;
        hl = snprintf(head, sizeof(head),
                      "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Authorization: Bearer %s\r\nAccept: application/x-ndjson\r\n\r\n",
                      path, KEY_A);
        assert_true(send_all(fd, head, (size_t)hl));
        sleep_ms(1000);
        raw = read_all(fd, &n);
        close(fd);
        parse_response(raw, n, &r);
        free(raw);
    }
    assert_int_equal(r.status, 200);
    assert_non_null(resp_header(&r, "Content-Type", hdr, sizeof(hdr)));
    assert_string_equal(hdr, "application/x-ndjson");
    {
        char *p = r.body;
        for (int line = 1; line <= N; line++) {
            char *nl = strchr(p, '\n');
            cJSON *it;
            assert_non_null(nl);
            it = cJSON_ParseWithLength(p, (size_t)(nl - p));
            assert_int_equal(int_of(it, "line"), line);
            assert_true(cJSON_IsString(cJSON_GetObjectItem(it, "reply")));
            cJSON_Delete(it);
            p = nl + 1;
        }
        assert_string_equal(p, "");
    }
    resp_free(&r);
    snprintf(path, sizeof(path), "/v1/jobs/%s/results?format=xml", id);
    cJSON_Delete(req(x, KEY_A, "GET", path, NULL, NULL, &r));
    assert_int_equal(r.status, 400);
    resp_free(&r);
}

/* ---- a loopback receiver for completion callbacks ------------------------------------------ */

struct receiver {
    int fd, port;
    int fail_first; /* answer 500 to this many posts first */
    pthread_t th;
    atomic_bool stop;
    pthread_mutex_t mu;
    int n;        /* posts received */
    double at[8]; /* when */
    char body[8][1024];
    char path[8][128];
};

static void *receiver_main(void *arg)
{
    struct receiver *rc = arg;
    while (!atomic_load(&rc->stop)) {
        struct pollfd pf = {rc->fd, POLLIN, 0};
        char buf[4096];
        size_t got = 0;
        int c, n;
        if (poll(&pf, 1, 50) <= 0)
            continue;
        c = accept(rc->fd, NULL, NULL);
        if (c < 0)
            continue;
        /* the head, then Content-Length bytes of body */
        for (;;) {
            ssize_t k = recv(c, buf + got, sizeof(buf) - 1 - got, 0);
            char *end, *cl;
            if (k <= 0)
                break;
            got += (size_t)k;
            buf[got] = '\0';
            end = strstr(buf, "\r\n\r\n");
            cl = strcasestr(buf, "Content-Length:");
            if (end && cl && got >= (size_t)(end + 4 - buf) + (size_t)atoi(cl + 15))
                break;
            if (got >= sizeof(buf) - 1)
                break;
        }
        pthread_mutex_lock(&rc->mu);
        n = rc->n;
        if (n < 8) {
            char *end = strstr(buf, "\r\n\r\n");
            rc->at[n] = mono_s();
            snprintf(rc->body[n], sizeof(rc->body[n]), "%s", end ? end + 4 : "");
            sscanf(buf, "POST %127s", rc->path[n]);
        }
        rc->n++;
        pthread_mutex_unlock(&rc->mu);
        if (n < rc->fail_first)
            send_all(c, "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", 38);
        else
            send_all(c, "HTTP/1.1 204 No Content\r\n\r\n", 27);
        close(c);
    }
    return NULL;
}

static void receiver_start(struct receiver *rc, int fail_first)
{
    struct sockaddr_in a = {0};
    socklen_t al = sizeof(a);
    memset(rc, 0, sizeof(*rc));
    rc->fail_first = fail_first;
    pthread_mutex_init(&rc->mu, NULL);
    rc->fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(rc->fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(rc->fd, 8), 0);
    assert_int_equal(getsockname(rc->fd, (struct sockaddr *)&a, &al), 0);
    rc->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&rc->th, NULL, receiver_main, rc), 0);
}

static void receiver_stop(struct receiver *rc)
{
    atomic_store(&rc->stop, true);
    pthread_join(rc->th, NULL);
    close(rc->fd);
    pthread_mutex_destroy(&rc->mu);
}

static int receiver_count(struct receiver *rc)
{
    int n;
    pthread_mutex_lock(&rc->mu);
    n = rc->n;
    pthread_mutex_unlock(&rc->mu);
    return n;
}

/* The summary reaches the receiver once the job is done: two failed attempts first, retried
 * after a pause that doubles, then no more. Bad callback URLs are refused at creation. */
static void completion_callback_is_retried_then_sent_once(void **state)
{
    struct fx *x = *state;
    struct receiver rc;
    char id[STORE_JOB_ID_LEN + 1], q[160];
    double t0;
    cJSON *sum;
    receiver_start(&rc, 2);
    snprintf(q, sizeof(q), "?callback_url=http://127.0.0.1:%d/hooks/jobs", rc.port);
    assert_int_equal(reply_jobs_start(x->svc), AR_OK);
    create_job(x, KEY_A, 1, 3, q, id);
    t0 = mono_s();
    while (receiver_count(&rc) < 3 && mono_s() - t0 < 20)
        sleep_ms(20);
    assert_int_equal(receiver_count(&rc), 3);
    sleep_ms(1500); /* past the longest pause there would be: nothing more comes */
    assert_int_equal(receiver_count(&rc), 3);
    /* pauses of 0.2 s, then 0.4 s (backoff 0.2, doubling) */
    assert_true(rc.at[1] - rc.at[0] >= 0.18);
    assert_true(rc.at[2] - rc.at[1] >= 0.38);
    assert_true(rc.at[2] - rc.at[1] > (rc.at[1] - rc.at[0]) * 1.5);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(rc.path[i], "/hooks/jobs");
        sum = cJSON_Parse(rc.body[i]);
        assert_non_null(sum);
        assert_string_equal(str_of(sum, "id"), id);
        assert_string_equal(str_of(sum, "status"), "done");
        assert_string_equal(str_of(sum, "event"), "job.done");
        assert_int_equal(int_of(sum, "total"), 3);
        assert_int_equal(int_of(sum, "done"), 3);
        cJSON_Delete(sum);
    }
    receiver_stop(&rc);

    {
        static const char *const bad[] = {"https://127.0.0.1/x", "ftp://h/x", "http://",
                                          "http://h:99999/", "http://u@h/"};
        for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
            struct resp r;
            char body[300];
            snprintf(body, sizeof(body),
                     "{\"callback_url\":\"%s\",\"items\":[{\"shop_id\":\"s1\",\"review_id\":"
                     "\"cb\",\"text\":\"ok\",\"rating\":5}]}",
                     bad[i]);
            cJSON_Delete(req(x, KEY_A, "POST", "/v1/jobs", "application/json", body, &r));
            if (r.status != 400)
                fail_msg("callback_url %s: %d", bad[i], r.status);
            resp_free(&r);
        }
    }
}

/* A job finished by an instance that died before claiming its notice (done in the store, never
 * claimed, its lines on no queue): the sweeper of the next runner sends it. */
static void unclaimed_notice_is_sent_by_the_sweeper(void **state)
{
    struct fx *x = *state;
    struct receiver rc;
    struct store_item_in in[2] = {
        {1, "{\"shop_id\":\"s1\",\"id\":\"u1\",\"text\":\"ok\",\"rating\":5}"},
        {2, "{\"shop_id\":\"s1\",\"id\":\"u2\",\"text\":\"ok\",\"rating\":5}"}};
    struct store_job_spec spec = {"s1", OWNER_A, NULL};
    char id[STORE_JOB_ID_LEN + 1], url[96];
    double t0;
    cJSON *sum;
    receiver_start(&rc, 0);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/late", rc.port);
    spec.callback_url = url;
    assert_int_equal(store_job_create_spec(x->store, &spec, in, 2, id, NULL), AR_OK);
    assert_int_equal(store_job_item_done(x->store, id, 1, "{\"line\":1}", NULL), AR_OK);
    assert_int_equal(store_job_item_error(x->store, id, 2, "gone", NULL), AR_OK);
    assert_int_equal(reply_jobs_start(x->svc), AR_OK);
    t0 = mono_s();
    while (receiver_count(&rc) < 1 && mono_s() - t0 < 20)
        sleep_ms(20);
    assert_int_equal(receiver_count(&rc), 1);
    sum = cJSON_Parse(rc.body[0]);
    assert_string_equal(str_of(sum, "id"), id);
    assert_int_equal(int_of(sum, "failed"), 1);
    cJSON_Delete(sum);
    sleep_ms(500);
    assert_int_equal(receiver_count(&rc), 1);
    receiver_stop(&rc);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(garbage_is_refused_and_nothing_is_stored),
        T(bad_lines_are_named_or_become_per_line_errors),
        T(quotas_are_per_key),
        T(another_key_gets_404_on_everything),
        T(list_is_newest_first_in_pages),
        T(delete_cancels_then_deletes),
        T(results_come_in_pages_and_as_a_stream),
        T(completion_callback_is_retried_then_sent_once),
        T(unclaimed_notice_is_sent_by_the_sweeper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
