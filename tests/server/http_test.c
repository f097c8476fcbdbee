/* http_test.c - the review-reply product over real HTTP: `autoreply serve` (./bin/autoreply, or
 * $AR_BIN) started as a child process on 127.0.0.1 with a temporary data directory and the demo
 * model, driven by a small socket client. Checks the answers against the review data (language,
 * needs_human, banned words), the reply cache and idempotency through the server's own
 * counters, per-item batch answers, jobs with a malformed line, bad input, auth and rate limits
 * on the product routes, a job that survives kill -9 of the server (one reply per review,
 * counted in the SQLite file itself), and the instance name on every response. */
#include "harness/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <sqlite3.h>

#include "base/base.h"
#include "harness/http_client.h"
#include "harness/process.h"

#define REPLY_BATCH_MAX_TEST 256 /* reviews in one batch request (src/reply/reply.h) */

/* ---- the server as a child process ------------------------------------------------------- */

struct child {
    pid_t pid;
    int port;
    char dir[256]; /* data directory */
    char log[300];
};

static pid_t g_pids[8];    /* servers running: a failed test leaves none behind */
static char g_tmp[64];     /* everything the test writes */
static char g_model[512];  /* the demo model */
static struct child g_srv; /* the main server: shops file, default flags */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- JSON answers (the client: tests/harness/http_client.h) --------------------------------- */

static cJSON *get_json(int port, const char *path, const char *extra, int *status)
{
    struct resp r;
    cJSON *j;
    http(port, "GET", path, extra, NULL, 0, &r);
    *status = r.status;
    j = cJSON_Parse(r.body);
    if (!j)
        fail_msg("GET %s: not JSON (status %d): %.300s", path, r.status, r.body);
    resp_free(&r);
    return j;
}

static const char *jstr(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double jnum(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : (double)NAN;
}

static bool jbool(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsBool(v))
        fail_msg("\"%s\" is not a boolean", key);
    return cJSON_IsTrue(v);
}

/* The same, 0 for a series not created yet (a label set never observed). */
static double metric0(int port, const char *series)
{
    double v = metric(port, series);
    return isnan(v) ? 0 : v;
}

/* ---- starting and stopping servers --------------------------------------------------------- */

/* Starts bin serve on a fresh port with data directory dir and the extra arguments (NULL
 * terminated), and waits until /health answers 200 (the model is loaded). */
static void server_start(struct child *c, const char *dir, const char *const *extra)
{
    static int n_started;
    char port_s[16];
    const char *argv[40];
    int n = 0;
    double t0 = now_s();
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "%s", dir);
    snprintf(c->log, sizeof(c->log), "%s/server-%d.log", g_tmp, ++n_started);
    c->port = th_free_port();
    snprintf(port_s, sizeof(port_s), "%d", c->port);
    argv[n++] = th_bin_path();
    argv[n++] = "serve";
    argv[n++] = "-m";
    argv[n++] = g_model;
    argv[n++] = "--port";
    argv[n++] = port_s;
    argv[n++] = "--data-dir";
    argv[n++] = dir;
    argv[n++] = "-t";
    argv[n++] = "2";
    for (int i = 0; extra && extra[i] && n < 38; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        int fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* and if the test itself dies */
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], (char *const *)(uintptr_t)argv);
        _exit(127);
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(g_pids); i++) {
        if (!g_pids[i]) {
            g_pids[i] = c->pid;
            break;
        }
    }
    for (;;) {
        struct resp r;
        int st;
        if (http_try(c->port, "GET", "/health", NULL, NULL, 0, &r) && r.status == 200) {
            resp_free(&r);
            return;
        }
        resp_free(&r);
        if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
            char *log = th_read_file(c->log, NULL);
            for (size_t i = 0; i < AR_ARRAY_LEN(g_pids); i++)
                if (g_pids[i] == c->pid)
                    g_pids[i] = 0;
            c->pid = 0;
            fail_msg("%s serve exited (status %d): %s", th_bin_path(), st, log ? log : "");
        }
        if (now_s() - t0 > 60)
            fail_msg("%s serve: not ready after 60 s", th_bin_path());
        th_sleep_s(0.02);
    }
}

/* SIGTERM (graceful) or SIGKILL; returns the exit status (128 + signal when killed). */
static int server_stop(struct child *c, int sig)
{
    int st = 0;
    if (c->pid <= 0)
        return -1;
    kill(c->pid, sig);
    waitpid(c->pid, &st, 0);
    for (size_t i = 0; i < AR_ARRAY_LEN(g_pids); i++)
        if (g_pids[i] == c->pid)
            g_pids[i] = 0;
    c->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- review data --------------------------------------------------------------------------- */

struct review {
    char id[64];
    char *text; /* owned */
    int rating;
    char lang[4];
};

static struct review *g_reviews;
static int g_n_reviews;

static void load_reviews(void)
{
    char path[512];
    char *data = th_read_file(th_shared_path(path, sizeof(path), "data/reviews-eval.jsonl"), NULL);
    int cap = 0;
    if (!data)
        fail_msg("cannot read %s", path);
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        struct review *rv;
        if (!j)
            continue;
        if (g_n_reviews == cap)
            g_reviews = realloc(g_reviews, (size_t)(cap = cap ? cap * 2 : 256) * sizeof(*rv));
        rv = &g_reviews[g_n_reviews++];
        snprintf(rv->id, sizeof(rv->id), "%s", jstr(j, "id"));
        rv->text = strdup(jstr(j, "text"));
        rv->rating = (int)jnum(j, "rating");
        snprintf(rv->lang, sizeof(rv->lang), "%s", jstr(j, "lang"));
        cJSON_Delete(j);
    }
    free(data);
    assert_true(g_n_reviews > 1000);
}

static bool pick_match(const struct review *rv, const char *lang, bool low)
{
    return !strcmp(rv->lang, lang) && (low ? rv->rating <= 2 : rv->rating >= 4);
}

/* The k-th review (0-based, modulo their number) of language lang whose rating is low (<= 2)
 * or high (>= 4). */
static const struct review *pick(const char *lang, bool low, int k)
{
    int n = 0;
    for (int i = 0; i < g_n_reviews; i++)
        n += pick_match(&g_reviews[i], lang, low);
    assert_true(n > 0);
    k %= n;
    for (int i = 0; i < g_n_reviews; i++)
        if (pick_match(&g_reviews[i], lang, low) && k-- == 0)
            return &g_reviews[i];
    return NULL;
}

/* {"shop_id","review_id","text","rating"} as JSON text (free()). */
static char *review_json(const char *shop, const char *review_id, const char *text, int rating)
{
    cJSON *j = cJSON_CreateObject();
    char *s;
    cJSON_AddStringToObject(j, "shop_id", shop);
    cJSON_AddStringToObject(j, "review_id", review_id);
    cJSON_AddStringToObject(j, "text", text);
    cJSON_AddNumberToObject(j, "rating", rating);
    s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* POST /v1/reviews/reply from a thread of the test: no cmocka assertion (they must run on the
 * main thread); the parsed answer or NULL, and the status (-1: no answer). */
static cJSON *reply_in_thread(int port, const char *shop, const char *review_id, const char *text,
                              int rating, int *status)
{
    char *body = review_json(shop, review_id, text, rating);
    struct resp r;
    cJSON *j = NULL;
    if (http_try(port, "POST", "/v1/reviews/reply", "Content-Type: application/json\r\n", body,
                 strlen(body), &r))
        j = cJSON_Parse(r.body);
    *status = r.status;
    resp_free(&r);
    free(body);
    return j;
}

/* POST /v1/reviews/reply; the answer (status 200 required). */
static cJSON *reply_ok(int port, const char *shop, const char *review_id, const char *text,
                       int rating)
{
    char *body = review_json(shop, review_id, text, rating);
    int status;
    cJSON *j = post_json(port, "/v1/reviews/reply", NULL, body, &status);
    if (status != 200) {
        char *s = cJSON_PrintUnformatted(j);
        fail_msg("reply %s/%s: status %d: %s", shop, review_id, status, s);
    }
    free(body);
    return j;
}

/* ---- text checks (independent of the code under test) -------------------------------------- */

/* Counts CJK ideographs (U+4E00..U+9FFF, U+3400..U+4DBF) and ASCII letters of UTF-8 text. */
static void count_scripts(const char *s, int *cjk, int *latin)
{
    const unsigned char *p = (const unsigned char *)s;
    *cjk = *latin = 0;
    while (*p) {
        if (*p < 0x80) {
            if ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'z')
                (*latin)++;
            p++;
        } else if ((*p & 0xF0) == 0xE0 && p[1] && p[2]) {
            unsigned cp = ((unsigned)(*p & 0x0F) << 12) | ((unsigned)(p[1] & 0x3F) << 6) |
                          (unsigned)(p[2] & 0x3F);
            if ((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF))
                (*cjk)++;
            p += 3;
        } else {
            p++;
        }
    }
}

/* ---- fixtures -------------------------------------------------------------------------------- */

/* Words the demo model puts in most Chinese replies, banned for shop "ban". */
static const char *const banned[] = {"感谢", "谢谢"};

static int group_setup(void **state)
{
    char shops[128], dir[128];
    FILE *f;
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (access(th_bin_path(), X_OK) != 0)
        fail_msg("%s not found: build it first (make bin/autoreply)", th_bin_path());
    th_shared_path(g_model, sizeof(g_model), "models/autoreply-demo-q8_0.gguf");
    if (access(g_model, R_OK) != 0)
        snprintf(g_model, sizeof(g_model), "models/autoreply-demo-q8_0.gguf");
    load_reviews();
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/ar_http_XXXXXX");
    assert_non_null(mkdtemp(g_tmp));
    snprintf(shops, sizeof(shops), "%s/shops.json", g_tmp);
    f = fopen(shops, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"shops\": {\"ban\": {\"banned_words\": [\"%s\", \"%s\"]},\n"
            " \"quiet\": {\"mode\": \"off\"},\n"
            " \"sugg\": {\"mode\": \"suggest\"},\n"
            " \"auto\": {\"mode\": \"auto\", \"auto_min_rating\": 4},\n"
            " \"auto-nohold\": {\"mode\": \"auto\", \"auto_min_rating\": 3,\n"
            "                 \"hold_needs_human\": false}}}\n",
            banned[0], banned[1]);
    fclose(f);
    /* a data directory that does not exist yet, two levels deep: serve creates it */
    snprintf(dir, sizeof(dir), "%s/main/var", g_tmp);
    server_start(&g_srv, dir, (const char *const[]){"--shops", shops, NULL});
    return 0;
}

static int group_teardown(void **state)
{
    char cmd[128];
    int rc;
    (void)state;
    rc = server_stop(&g_srv, SIGTERM);
    for (size_t i = 0; i < AR_ARRAY_LEN(g_pids); i++) {
        if (g_pids[i]) { /* left by a failed test */
            kill(g_pids[i], SIGKILL);
            waitpid(g_pids[i], NULL, 0);
        }
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_tmp);
    if (system(cmd) != 0)
        return -1;
    for (int i = 0; i < g_n_reviews; i++)
        free(g_reviews[i].text);
    free(g_reviews);
    /* a clean shutdown: the reply service, engine and server stop in order, nothing leaks
     * (LeakSanitizer's exit status when $AR_BIN is a sanitizer build) */
    return rc == 0 ? 0 : -1;
}

/* ---- tests: single reviews ----------------------------------------------------------------- */

struct lang_job {
    const struct review *rv[10];
    cJSON *out[10];
    int status[10];
};

static void *lang_main(void *p)
{
    struct lang_job *jb = p;
    for (int i = 0; i < 10; i++) {
        char body_id[80];
        snprintf(body_id, sizeof(body_id), "lang-%s", jb->rv[i]->id);
        jb->out[i] = reply_in_thread(g_srv.port, "shop-lang", body_id, jb->rv[i]->text,
                                     jb->rv[i]->rating, &jb->status[i]);
    }
    return NULL;
}

static void reviews_are_answered_in_their_language_and_low_ratings_need_a_human(void **state)
{
    struct lang_job jobs[4];
    pthread_t th[4];
    double nh0 = metric(g_srv.port, "autoreply_reply_needs_human_total"), n_low = 0;
    (void)state;
    /* 40 reviews: zh low, zh high, en low, en high; four clients at once */
    for (int i = 0; i < 10; i++) {
        jobs[0].rv[i] = pick("zh", true, i);
        jobs[1].rv[i] = pick("zh", false, i);
        jobs[2].rv[i] = pick("en", true, i);
        jobs[3].rv[i] = pick("en", false, i);
    }
    for (int t = 0; t < 4; t++)
        assert_int_equal(pthread_create(&th[t], NULL, lang_main, &jobs[t]), 0);
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < 10; i++) {
            const struct review *rv = jobs[t].rv[i];
            cJSON *j = jobs[t].out[i];
            const char *reply = jstr(j, "reply");
            int cjk, latin;
            if (jobs[t].status[i] != 200 || !reply)
                fail_msg("review %s: status %d", rv->id, jobs[t].status[i]);
            if (!*reply)
                fail_msg("empty reply to %s", rv->id);
            count_scripts(reply, &cjk, &latin);
            if (!strcmp(rv->lang, "zh") && cjk == 0)
                fail_msg("zh review %s got a reply without Chinese: %s", rv->id, reply);
            if (!strcmp(rv->lang, "en") && (latin == 0 || cjk > 0))
                fail_msg("en review %s got a reply not in English: %s", rv->id, reply);
            assert_string_equal(jstr(j, "lang"), rv->lang);
            if (rv->rating <= 2) {
                n_low++;
                if (!jbool(j, "needs_human"))
                    fail_msg("rating %d review %s not routed to a human", rv->rating, rv->id);
            }
            cJSON_Delete(j);
        }
    }
    /* the server's own counter saw at least the low-rated ones */
    assert_true(metric(g_srv.port, "autoreply_reply_needs_human_total") - nh0 >= n_low);
}

static void repeated_review_text_is_served_from_the_cache(void **state)
{
    const struct review *rv = pick("zh", false, 40);
    double hits0 =
        metric(g_srv.port, "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l1\"}");
    double lat0 = metric0(g_srv.port, "autoreply_reply_latency_seconds_count{cached=\"true\"}");
    double unc0 = metric0(g_srv.port, "autoreply_reply_latency_seconds_count{cached=\"false\"}");
    cJSON *a, *b;
    (void)state;
    a = reply_ok(g_srv.port, "shop-cache", "cache-1", rv->text, rv->rating);
    assert_false(jbool(a, "cached"));
    assert_string_equal(jstr(a, "source"), "model");
    /* one latency histogram, owned by the service, labelled by cached: observed once each */
    assert_true(metric0(g_srv.port, "autoreply_reply_latency_seconds_count{cached=\"false\"}") -
                    unc0 ==
                1);
    assert_true(isnan(metric(g_srv.port, "autoreply_reply_latency_seconds_count")));
    /* another review (new id) with the same text, rating and shop */
    b = reply_ok(g_srv.port, "shop-cache", "cache-2", rv->text, rv->rating);
    assert_true(jbool(b, "cached"));
    assert_string_equal(jstr(b, "source"), "cache");
    assert_string_equal(jstr(b, "reply"), jstr(a, "reply"));
    assert_string_equal(jstr(b, "review_id"), "cache-2");
    assert_true(
        metric(g_srv.port, "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l1\"}") -
            hits0 ==
        1);
    assert_true(
        metric0(g_srv.port, "autoreply_reply_latency_seconds_count{cached=\"true\"}") - lat0 == 1);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void same_review_id_returns_the_stored_reply_without_the_model(void **state)
{
    const struct review *rv = pick("en", false, 12);
    double tok0, store0;
    cJSON *a, *b;
    (void)state;
    a = reply_ok(g_srv.port, "shop-idem", "idem-1", rv->text, rv->rating);
    assert_string_equal(jstr(a, "source"), "model");
    tok0 = metric(g_srv.port, "autoreply_prompt_tokens_total");
    store0 = metric(g_srv.port, "autoreply_reply_replies_total{source=\"store\"}");
    assert_false(isnan(tok0));
    b = reply_ok(g_srv.port, "shop-idem", "idem-1", rv->text, rv->rating);
    assert_string_equal(jstr(b, "reply"), jstr(a, "reply"));
    assert_string_equal(jstr(b, "source"), "store");
    assert_true(jbool(b, "cached"));
    /* the engine processed no prompt for it */
    assert_true(metric(g_srv.port, "autoreply_prompt_tokens_total") == tok0);
    assert_true(metric(g_srv.port, "autoreply_reply_replies_total{source=\"store\"}") - store0 ==
                1);
    cJSON_Delete(b);
    /* the same text claiming another rating is another review: 409, never the stored answer */
    {
        char *body = review_json("shop-idem", "idem-1", rv->text, rv->rating == 5 ? 1 : 5);
        int status;
        b = post_json(g_srv.port, "/v1/reviews/reply", NULL, body, &status);
        free(body);
        assert_int_equal(status, 409);
        assert_string_equal(jstr(cJSON_GetObjectItem(b, "error"), "code"), "review_id_conflict");
        assert_null(jstr(b, "reply"));
        cJSON_Delete(b);
    }
    /* another text under the used id: 409 with a clear error, still no model */
    {
        char *body = review_json("shop-idem", "idem-1", "A different review altogether", 3);
        int status;
        b = post_json(g_srv.port, "/v1/reviews/reply", NULL, body, &status);
        free(body);
        assert_int_equal(status, 409);
        assert_string_equal(jstr(cJSON_GetObjectItem(b, "error"), "code"), "review_id_conflict");
        assert_non_null(strstr(jstr(cJSON_GetObjectItem(b, "error"), "message"), "idem-1"));
        assert_null(jstr(b, "reply"));
        cJSON_Delete(b);
    }
    assert_true(metric(g_srv.port, "autoreply_prompt_tokens_total") == tok0);
    cJSON_Delete(a);
}

static const cJSON *result_at(const cJSON *j, int i);

static void a_review_may_be_named_by_id_in_single_and_batch_requests(void **state)
{
    const struct review *a = pick("zh", false, 90), *b = pick("en", false, 20);
    char body[4096];
    int status;
    cJSON *j, *j2;
    (void)state;
    j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "shop_id", "shop-id");
    cJSON_AddStringToObject(j, "id", "as-id-1");
    cJSON_AddStringToObject(j, "text", a->text);
    cJSON_AddNumberToObject(j, "rating", a->rating);
    {
        char *s1 = cJSON_PrintUnformatted(j);
        j2 = post_json(g_srv.port, "/v1/reviews/reply", NULL, s1, &status);
        free(s1);
    }
    assert_int_equal(status, 200);
    assert_string_equal(jstr(j2, "review_id"), "as-id-1");
    assert_true(strlen(jstr(j2, "reply")) > 0);
    cJSON_Delete(j2);
    cJSON_Delete(j);
    /* a bare-array batch: "id" items, one answered above (stored) and one new */
    snprintf(body, sizeof(body),
             "[{\"shop_id\":\"shop-id\",\"id\":\"as-id-1\",\"text\":%s,\"rating\":%d},"
             "{\"shop_id\":\"shop-id\",\"id\":\"as-id-2\",\"text\":%s,\"rating\":%d}]",
             "\"PLACEHOLDER_A\"", a->rating, "\"PLACEHOLDER_B\"", b->rating);
    {
        cJSON *arr = cJSON_Parse(body);
        char *s1;
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(arr, 0), "text", cJSON_CreateString(a->text));
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(arr, 1), "text", cJSON_CreateString(b->text));
        s1 = cJSON_PrintUnformatted(arr);
        cJSON_Delete(arr);
        j = post_json(g_srv.port, "/v1/reviews/batch", NULL, s1, &status);
        free(s1);
    }
    assert_int_equal(status, 200);
    assert_string_equal(jstr(result_at(j, 0), "review_id"), "as-id-1");
    assert_string_equal(jstr(result_at(j, 0), "source"), "store");
    assert_string_equal(jstr(result_at(j, 1), "review_id"), "as-id-2");
    assert_true(strlen(jstr(result_at(j, 1), "reply")) > 0);
    cJSON_Delete(j);
}

static void banned_words_of_a_shop_never_appear(void **state)
{
    int with_word_elsewhere = 0;
    (void)state;
    for (int i = 0; i < 10; i++) {
        const struct review *rv = pick("zh", i % 2 == 0, 60 + i);
        char id[80];
        cJSON *a, *b;
        snprintf(id, sizeof(id), "ban-%d", i);
        a = reply_ok(g_srv.port, "ban", id, rv->text, rv->rating);
        b = reply_ok(g_srv.port, "free", id, rv->text, rv->rating);
        assert_true(strlen(jstr(a, "reply")) > 0);
        for (size_t w = 0; w < AR_ARRAY_LEN(banned); w++) {
            if (strstr(jstr(a, "reply"), banned[w]))
                fail_msg("banned word %s in reply: %s", banned[w], jstr(a, "reply"));
            with_word_elsewhere += strstr(jstr(b, "reply"), banned[w]) != NULL;
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
    /* the words are ones the model does use: the check above had something to catch */
    assert_true(with_word_elsewhere > 0);
}

static void mp_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void json_and_msgpack_give_the_same_reply(void **state)
{
    const struct review *rv = pick("zh", true, 30);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    struct resp r;
    const msgpack_object *reply, *source;
    cJSON *j;
    (void)state;
    /* two shops (so no cache or store is shared), the same review: both from the model */
    j = reply_ok(g_srv.port, "shop-json", "mp-1", rv->text, rv->rating);
    assert_string_equal(jstr(j, "source"), "model");

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    mp_str(&pk, "shop_id");
    mp_str(&pk, "shop-msgpack");
    mp_str(&pk, "review_id");
    mp_str(&pk, "mp-1");
    mp_str(&pk, "text");
    mp_str(&pk, rv->text);
    mp_str(&pk, "rating");
    msgpack_pack_int(&pk, rv->rating);
    post_msgpack(g_srv.port, "/v1/reviews/reply", &sb, &up, &r);
    reply = mp_get(&up.data, "reply");
    source = mp_get(&up.data, "source");
    assert_non_null(reply);
    assert_non_null(source);
    assert_int_equal(reply->type, MSGPACK_OBJECT_STR);
    assert_int_equal(source->via.str.size, 5);
    assert_memory_equal(source->via.str.ptr, "model", 5);
    assert_int_equal(reply->via.str.size, strlen(jstr(j, "reply")));
    assert_memory_equal(reply->via.str.ptr, jstr(j, "reply"), reply->via.str.size);
    msgpack_unpacked_destroy(&up);
    resp_free(&r);
    cJSON_Delete(j);
}

/* ---- tests: batches ------------------------------------------------------------------------ */

static const cJSON *result_at(const cJSON *j, int i)
{
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(j, "results");
    assert_true(cJSON_IsArray(res));
    return cJSON_GetArrayItem(res, i);
}

static void batch_answers_each_item_on_its_own(void **state)
{
    const struct review *a = pick("zh", false, 80), *b = pick("en", true, 14);
    char *ja = review_json("shop-batch", "b-1", a->text, a->rating);
    char *jb = review_json("shop-batch", "b-2", b->text, b->rating);
    char *jbad = review_json("shop-batch", "b-3", a->text, 9);
    char *jdup = review_json("shop-batch", "b-1", b->text, b->rating);
    char body[8192];
    const cJSON *it;
    int status;
    cJSON *j;
    (void)state;
    snprintf(body, sizeof(body), "{\"reviews\": [%s, %s, %s, %s]}", ja, jbad, jb, jdup);
    j = post_json(g_srv.port, "/v1/reviews/batch", NULL, body, &status);
    assert_int_equal(status, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "results")), 4);
    it = result_at(j, 0);
    assert_string_equal(jstr(it, "review_id"), "b-1");
    assert_true(strlen(jstr(it, "reply")) > 0);
    it = result_at(j, 1); /* rating 9 */
    assert_null(jstr(it, "reply"));
    assert_true(jnum(it, "status") == 400);
    assert_string_equal(jstr(cJSON_GetObjectItem(it, "error"), "code"), "invalid_review");
    it = result_at(j, 2);
    assert_string_equal(jstr(it, "review_id"), "b-2");
    assert_true(strlen(jstr(it, "reply")) > 0);
    assert_true(jbool(it, "needs_human")); /* a low rating */
    it = result_at(j, 3);                  /* b-1 again in the same batch */
    assert_null(jstr(it, "reply"));
    assert_true(jnum(it, "status") == 409);
    assert_string_equal(jstr(cJSON_GetObjectItem(it, "error"), "code"), "duplicate_review_id");
    cJSON_Delete(j);

    /* a bare array is a batch too; answered ones come back from the store */
    snprintf(body, sizeof(body), "[%s, %s]", jb, ja);
    j = post_json(g_srv.port, "/v1/reviews/batch", NULL, body, &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(result_at(j, 0), "review_id"), "b-2");
    assert_string_equal(jstr(result_at(j, 0), "source"), "store");
    assert_string_equal(jstr(result_at(j, 1), "source"), "store");
    cJSON_Delete(j);
    free(ja);
    free(jb);
    free(jbad);
    free(jdup);
}

/* ---- tests: jobs --------------------------------------------------------------------------- */

static bool is_job_id(const char *s)
{
    if (!s || strlen(s) != 32)
        return false;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

static void expect_error(int port, const char *method, const char *path, const char *ctype,
                         const char *body, size_t len, int status);

/* POST path (/v1/jobs and a query) with body and content type; the job id (202 required) into
 * id. */
static void job_submit_to(int port, const char *path, const char *auth, const char *ctype,
                          const char *body, size_t len, char id[33], int expect_total)
{
    struct resp r;
    char hdr[256];
    cJSON *j;
    snprintf(hdr, sizeof(hdr), "Content-Type: %s\r\n%s", ctype, auth ? auth : "");
    http(port, "POST", path, hdr, body, len, &r);
    if (r.status != 202)
        fail_msg("POST /v1/jobs: status %d: %.300s", r.status, r.body);
    j = cJSON_Parse(r.body);
    assert_non_null(j);
    assert_true(is_job_id(jstr(j, "id")));
    assert_true(jnum(j, "total") == expect_total);
    memcpy(id, jstr(j, "id"), 33);
    cJSON_Delete(j);
    resp_free(&r);
}

static void job_submit(int port, const char *auth, const char *ctype, const char *body, size_t len,
                       char id[33], int expect_total)
{
    job_submit_to(port, "/v1/jobs", auth, ctype, body, len, id, expect_total);
}

/* Polls GET /v1/jobs/{id} until the job is done; its final state. */
static cJSON *job_wait(int port, const char *auth, const char *id, double timeout_s)
{
    char path[64];
    double t0 = now_s();
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    for (;;) {
        int status;
        cJSON *j = get_json(port, path, auth, &status);
        assert_int_equal(status, 200);
        assert_string_equal(jstr(j, "id"), id);
        if (!strcmp(jstr(j, "status"), "done"))
            return j;
        assert_string_not_equal(jstr(j, "status"), "failed");
        cJSON_Delete(j);
        if (now_s() - t0 > timeout_s)
            fail_msg("job %s not done after %.0f s", id, timeout_s);
        th_sleep_s(0.05);
    }
}

/* GET /v1/jobs/{id}/results as an array of parsed lines; *n_lines receives their count. */
static cJSON *job_results(int port, const char *auth, const char *id)
{
    char path[80], ct[64];
    struct resp r;
    cJSON *arr = cJSON_CreateArray();
    snprintf(path, sizeof(path), "/v1/jobs/%s/results", id);
    http(port, "GET", path, auth, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(resp_header(&r, "Content-Type", ct, sizeof(ct)));
    assert_string_equal(ct, "application/x-ndjson");
    assert_true(r.body_len > 0 && r.body[r.body_len - 1] == '\n');
    for (char *save = NULL, *line = strtok_r(r.body, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        if (!j)
            fail_msg("result line is not JSON: %s", line);
        cJSON_AddItemToArray(arr, j);
    }
    resp_free(&r);
    return arr;
}

static void job_answers_every_line_and_records_a_malformed_one(void **state)
{
    char body[16384], id[33];
    size_t len = 0;
    const int n = 12, bad_line = 5;
    double err0 = metric0(g_srv.port, "autoreply_jobs_items_total{status=\"error\"}");
    cJSON *info, *res;
    (void)state;
    for (int i = 1; i <= n; i++) {
        if (i == bad_line) {
            len += (size_t)snprintf(body + len, sizeof(body) - len, "{\"text\": \"unterminated\n");
        } else {
            const struct review *rv = pick(i % 3 ? "zh" : "en", i % 2, 100 + i);
            char rid[32], *js;
            snprintf(rid, sizeof(rid), "job-%d", i);
            js = review_json("shop-job", rid, rv->text, rv->rating);
            len += (size_t)snprintf(body + len, sizeof(body) - len, "%s\n", js);
            free(js);
        }
    }
    /* refused as a whole unless the client asks for per-line errors */
    expect_error(g_srv.port, "POST", "/v1/jobs", "application/x-ndjson", body, len, 400);
    job_submit_to(g_srv.port, "/v1/jobs?errors=per_line", NULL, "application/x-ndjson", body, len,
                  id, n);
    info = job_wait(g_srv.port, NULL, id, 60);
    assert_true(jnum(info, "total") == n);
    assert_true(jnum(info, "done") == n - 1);
    assert_true(jnum(info, "failed") == 1);
    assert_true(jnum(info, "pending") == 0);
    cJSON_Delete(info);

    res = job_results(g_srv.port, NULL, id);
    assert_int_equal(cJSON_GetArraySize(res), n);
    for (int i = 1; i <= n; i++) {
        const cJSON *it = cJSON_GetArrayItem(res, i - 1);
        char rid[32];
        assert_true(jnum(it, "line") == i);
        if (i == bad_line) {
            assert_non_null(jstr(it, "error"));
            assert_null(jstr(it, "reply"));
            continue;
        }
        snprintf(rid, sizeof(rid), "job-%d", i);
        assert_string_equal(jstr(it, "review_id"), rid);
        assert_true(strlen(jstr(it, "reply")) > 0);
    }
    cJSON_Delete(res);
    assert_true(metric0(g_srv.port, "autoreply_jobs_items_total{status=\"error\"}") - err0 == 1);
    /* one job-line counter: the former duplicate is gone */
    assert_true(isnan(metric(g_srv.port, "autoreply_job_lines_total{outcome=\"error\"}")));
    assert_true(isnan(metric(g_srv.port, "autoreply_job_lines_total{outcome=\"done\"}")));

    /* a JSON array body, and data-file lines that name the review "id" (curl --data-binary
     * sends them as form-urlencoded unless told: that is 415 now, JSONL has its own type) */
    {
        const struct review *a = pick("zh", true, 120), *b = pick("en", false, 16);
        char *ja = review_json("shop-job", "arr-1", a->text, a->rating);
        snprintf(body, sizeof(body), "[%s]", ja);
        free(ja);
        job_submit(g_srv.port, NULL, "application/json", body, strlen(body), id, 1);
        cJSON_Delete(job_wait(g_srv.port, NULL, id, 60));
        res = job_results(g_srv.port, NULL, id);
        assert_int_equal(cJSON_GetArraySize(res), 1);
        assert_string_equal(jstr(cJSON_GetArrayItem(res, 0), "review_id"), "arr-1");
        cJSON_Delete(res);

        snprintf(body, sizeof(body), "{\"id\": \"%s\", \"text\": \"%s\", \"rating\": %d}\n", b->id,
                 b->text, b->rating);
        expect_error(g_srv.port, "POST", "/v1/jobs", "application/x-www-form-urlencoded", body,
                     strlen(body), 415);
        job_submit(g_srv.port, NULL, "application/jsonl", body, strlen(body), id, 1);
        info = job_wait(g_srv.port, NULL, id, 60);
        assert_string_equal(jstr(info, "shop_id"), "default");
        assert_true(jnum(info, "done") == 1);
        cJSON_Delete(info);
        res = job_results(g_srv.port, NULL, id);
        assert_string_equal(jstr(cJSON_GetArrayItem(res, 0), "review_id"), b->id);
        cJSON_Delete(res);
    }
}

/* ---- tests: bad input ---------------------------------------------------------------------- */

static void expect_error(int port, const char *method, const char *path, const char *ctype,
                         const char *body, size_t len, int status)
{
    struct resp r;
    char hdr[128];
    cJSON *j, *e;
    snprintf(hdr, sizeof(hdr), "Content-Type: %s\r\n", ctype);
    http(port, method, path, body ? hdr : NULL, body, len, &r);
    if (r.status != status)
        fail_msg("%s %s: status %d, want %d: %.300s", method, path, r.status, status, r.body);
    j = cJSON_Parse(r.body);
    if (!j)
        fail_msg("%s %s: error body is not JSON: %.200s", method, path, r.body);
    e = cJSON_GetObjectItem(j, "error");
    assert_non_null(jstr(e, "message"));
    assert_non_null(jstr(e, "type"));
    assert_non_null(jstr(e, "code"));
    cJSON_Delete(j);
    resp_free(&r);
}

static void bad_input_gets_json_errors(void **state)
{
    static const char *const bodies[] = {
        "{\"shop_id\":\"s\",\"review_id\":\"x1\",\"rating\":5}",                 /* no text */
        "{\"shop_id\":\"s\",\"review_id\":\"x2\",\"text\":\"ok\",\"rating\":0}", /* rating 0 */
        "{\"shop_id\":\"s\",\"review_id\":\"x3\",\"text\":\"ok\",\"rating\":6}", /* rating 6 */
        "{\"shop_id\":\"s\",\"review_id\":\"x4\",\"text\":\"ok\",\"rating\":4.5}",
        "{\"shop_id\":\"s\",\"review_id\":\"x5\",\"text\":\"\\u0000\",\"rating\":4}",
        "{\"shop_id\":\"s\",\"text\":\"ok\",\"rating\":4}", /* no review id */
        "[1, 2]",
        "{\"shop_id\":\"s\",\"review_id\":\"x6\",\"text\":\"ok\",",
    };
    const char *bad_utf8 = "{\"shop_id\":\"s\",\"review_id\":\"x7\",\"text\":\"bad \xff\xfe "
                           "\xc3\x28\",\"rating\":5}";
    const size_t big = 1000000;
    char *huge = malloc(big + 200);
    size_t n;
    double err0 =
        metric0(g_srv.port, "autoreply_http_request_duration_seconds_count{method=\"POST\","
                            "endpoint=\"/v1/reviews/reply\",status=\"400\"}");
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(bodies); i++)
        expect_error(g_srv.port, "POST", "/v1/reviews/reply", "application/json", bodies[i],
                     strlen(bodies[i]), 400);
    expect_error(g_srv.port, "POST", "/v1/reviews/reply", "application/json", bad_utf8,
                 strlen(bad_utf8), 400);
    /* a 1 MB review fits the body limit but not the review limit */
    n = (size_t)snprintf(huge, 100,
                         "{\"shop_id\":\"s\",\"review_id\":\"x8\",\"rating\":5,\"text\":\"");
    memset(huge + n, 'a', big);
    n += big;
    n += (size_t)snprintf(huge + n, 10, "\"}");
    expect_error(g_srv.port, "POST", "/v1/reviews/reply", "application/json", huge, n, 400);
    /* the body limit of the OpenAI routes applies here too (1 MiB) ... */
    free(huge);
    huge = malloc(2 << 20);
    memset(huge, ' ', 2 << 20);
    huge[0] = '{';
    huge[(2 << 20) - 1] = '}';
    expect_error(g_srv.port, "POST", "/v1/reviews/reply", "application/json", huge, 2 << 20, 413);
    expect_error(g_srv.port, "POST", "/v1/reviews/batch", "application/json", huge, 2 << 20, 413);
    /* ... while a job may be larger (--max-job-body, 64 MiB): 2 MiB of blank lines and one
     * review are accepted */
    {
        const char *line =
            "{\"shop_id\":\"s\",\"review_id\":\"big-1\",\"text\":\"好\",\"rating\":5}\n";
        char id[33];
        memset(huge, '\n', 2 << 20);
        memcpy(huge + 1000, line, strlen(line));
        job_submit(g_srv.port, NULL, "application/x-ndjson", huge, 2 << 20, id, 1);
        cJSON_Delete(job_wait(g_srv.port, NULL, id, 60));
    }
    free(huge);
    /* batches: not a list, empty, too long */
    expect_error(g_srv.port, "POST", "/v1/reviews/batch", "application/json", "{\"reviews\": 3}",
                 14, 400);
    expect_error(g_srv.port, "POST", "/v1/reviews/batch", "application/json", "[]", 2, 400);
    /* jobs: no body, no reviews, blank lines only */
    expect_error(g_srv.port, "POST", "/v1/jobs", "application/x-ndjson", "", 0, 400);
    expect_error(g_srv.port, "POST", "/v1/jobs", "application/json", "{\"reviews\": 1}", 14, 400);
    expect_error(g_srv.port, "POST", "/v1/jobs", "application/x-ndjson", "\n\n  \n", 5, 400);
    expect_error(g_srv.port, "POST", "/v1/jobs", "text/plain", "\n\n  \n", 5, 415);
    expect_error(g_srv.port, "POST", "/v1/jobs", "application/msgpack", "\xc1", 1, 400);
    /* unknown jobs */
    expect_error(g_srv.port, "GET", "/v1/jobs/00000000000000000000000000000000", NULL, NULL, 0,
                 404);
    expect_error(g_srv.port, "GET", "/v1/jobs/00000000000000000000000000000000/results", NULL, NULL,
                 0, 404);
    expect_error(g_srv.port, "GET", "/v1/jobs/nope", NULL, NULL, 0, 404);
    expect_error(g_srv.port, "GET", "/v1/jobs/", NULL, NULL, 0, 404);
    expect_error(g_srv.port, "DELETE", "/v1/jobs/00000000000000000000000000000000", NULL, NULL, 0,
                 404);
    expect_error(g_srv.port, "PUT", "/v1/jobs/00000000000000000000000000000000", NULL, NULL, 0,
                 405);
    expect_error(g_srv.port, "GET", "/v1/reviews/reply", NULL, NULL, 0, 405);
    /* the HTTP metrics count the product's routes like the others */
    assert_true(metric(g_srv.port, "autoreply_http_request_duration_seconds_count{method=\"POST\","
                                   "endpoint=\"/v1/reviews/reply\",status=\"400\"}") -
                    err0 >=
                (double)AR_ARRAY_LEN(bodies) + 2);
}

/* ---- tests: auth and rate limits ------------------------------------------------------------ */

static void product_routes_need_the_api_key_and_obey_rate_limits(void **state)
{
    char dir[128], keys[128];
    struct child c;
    struct resp r;
    const char *ok = "Authorization: Bearer k-123\r\n";
    char *body;
    int status;
    cJSON *j;
    FILE *f;
    (void)state;
    snprintf(keys, sizeof(keys), "%s/keys", g_tmp);
    f = fopen(keys, "w");
    assert_non_null(f);
    fputs("# test key\nk-123\n", f);
    fclose(f);
    snprintf(dir, sizeof(dir), "%s/auth", g_tmp);
    server_start(&c, dir,
                 (const char *const[]){"--api-key-file", keys, "--rate-rps", "0.01", "--rate-burst",
                                       "3", NULL});
    body = review_json("s", "auth-1", "物流很快，包装完好", 5);
    j = post_json(c.port, "/v1/reviews/reply", NULL, body, &status);
    assert_int_equal(status, 401);
    cJSON_Delete(j);
    expect_error(c.port, "POST", "/v1/jobs", "application/x-ndjson", body, strlen(body), 401);
    expect_error(c.port, "GET", "/v1/jobs/00000000000000000000000000000000", NULL, NULL, 0, 401);
    /* a burst of 3 for the key, shared by every route */
    j = post_json(c.port, "/v1/reviews/reply", ok, body, &status);
    assert_int_equal(status, 200);
    cJSON_Delete(j);
    http(c.port, "GET", "/v1/jobs/00000000000000000000000000000000", ok, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    j = post_json(c.port, "/v1/reviews/batch", ok, "{\"reviews\": [{}]}", &status);
    assert_int_equal(status, 200);
    cJSON_Delete(j);
    {
        char hdr[256], ra[16];
        snprintf(hdr, sizeof(hdr), "Content-Type: application/json\r\n%s", ok);
        http(c.port, "POST", "/v1/reviews/reply", hdr, body, strlen(body), &r);
        assert_int_equal(r.status, 429);
        assert_non_null(resp_header(&r, "Retry-After", ra, sizeof(ra)));
        resp_free(&r);
    }
    free(body);
    assert_int_equal(server_stop(&c, SIGTERM), 0);
}

/* ---- tests: features off (what the benchmarks compare against) ---------------------------- */

struct par_arg {
    int port, i, status;
    cJSON *out;
    atomic_bool back;
};

static void *par_main(void *p)
{
    struct par_arg *a = p;
    char id[32];
    snprintf(id, sizeof(id), "off-%d", a->i);
    a->out = reply_in_thread(a->port, "shop-off", id, "物流很快，包装完好", 5, &a->status);
    atomic_store(&a->back, true);
    return NULL;
}

static void reply_cache_prefix_cache_and_batching_can_be_switched_off(void **state)
{
    char dir[128];
    struct child c;
    struct par_arg args[4];
    pthread_t th[4];
    double max_running = 0;
    bool all_back = false;
    (void)state;
    snprintf(dir, sizeof(dir), "%s/off", g_tmp);
    server_start(
        &c, dir,
        (const char *const[]){"--no-reply-cache", "--no-prefix-cache", "--parallel", "1", NULL});
    /* the same review four times at once under new ids */
    for (int i = 0; i < 4; i++) {
        args[i].port = c.port;
        args[i].i = i;
        args[i].out = NULL;
        atomic_init(&args[i].back, false);
        assert_int_equal(pthread_create(&th[i], NULL, par_main, &args[i]), 0);
    }
    /* one sequence at a time, however many wait */
    while (!all_back) {
        max_running = AR_MAX(max_running, metric(c.port, "autoreply_running_sequences"));
        all_back = true;
        for (int i = 0; i < 4; i++)
            all_back = all_back && atomic_load(&args[i].back);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        if (args[i].status != 200 || !args[i].out)
            fail_msg("request %d: status %d", i, args[i].status);
        /* no reply cache: each one from the model, all the same (greedy) */
        assert_string_equal(jstr(args[i].out, "source"), "model");
        assert_string_equal(jstr(args[i].out, "reply"), jstr(args[0].out, "reply"));
    }
    for (int i = 0; i < 4; i++)
        cJSON_Delete(args[i].out);
    assert_true(max_running <= 1);
    assert_true(
        metric(c.port, "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l1\"}") ==
        0);
    assert_true(metric(c.port, "autoreply_reply_cache_misses_total{class=\"interactive\"}") == 0);
    assert_true(metric(c.port, "autoreply_prefix_cache_queries_total") == 0);
    assert_true(metric(c.port, "autoreply_prefix_cache_hit_tokens_total") == 0);
    assert_true(metric(c.port, "autoreply_prompt_tokens_total") > 0);
    assert_int_equal(server_stop(&c, SIGTERM), 0);
}

/* ---- tests: kill -9 in the middle of a job ------------------------------------------------- */

/* Runs one integer query on the SQLite file in dir. */
static long long db_count(const char *dir, const char *sql)
{
    char path[300];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    long long v = -1;
    snprintf(path, sizeof(path), "%s/replies.db", dir);
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static void job_survives_kill_9_with_one_reply_per_review(void **state)
{
    enum { N = 60 };
    char dir[128], id[33], path[64], *body = malloc(64 * 1024);
    size_t len = 0;
    struct child c;
    bool seen[N] = {false};
    bool killed_mid_job = false;
    double t0;
    cJSON *info, *res;
    (void)state;
    for (int i = 0; i < N; i++) {
        const struct review *rv = pick(i % 4 ? "zh" : "en", i % 3 == 0, 200 + i);
        char rid[32], *js;
        snprintf(rid, sizeof(rid), "crash-%d", i);
        js = review_json("shop-crash", rid, rv->text, rv->rating);
        len += (size_t)snprintf(body + len, 64 * 1024 - len, "%s\n", js);
        free(js);
    }
    snprintf(dir, sizeof(dir), "%s/crash", g_tmp);
    /* one sequence at a time: the job takes long enough to be caught in the middle */
    server_start(&c, dir, (const char *const[]){"--parallel", "1", NULL});
    job_submit(c.port, NULL, "application/x-ndjson", body, len, id, N);
    free(body);
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    t0 = now_s();
    while (!killed_mid_job) {
        int status;
        cJSON *j = get_json(c.port, path, NULL, &status);
        double done = jnum(j, "done");
        cJSON_Delete(j);
        assert_true(done < N); /* too fast to be interrupted: the test would prove nothing */
        if (done >= 8) {
            assert_int_equal(server_stop(&c, SIGKILL), 128 + SIGKILL);
            killed_mid_job = true;
        }
        if (now_s() - t0 > 60)
            fail_msg("job made no progress");
        th_sleep_s(0.01);
    }
    /* the file holds lines left to do */
    assert_true(db_count(dir, "SELECT COUNT(*) FROM job_items WHERE status = 'pending'") > 0);

    /* a new process on the same data directory finishes the job by itself */
    server_start(&c, dir, NULL);
    info = job_wait(c.port, NULL, id, 60);
    assert_true(jnum(info, "total") == N);
    assert_true(jnum(info, "done") == N);
    assert_true(jnum(info, "failed") == 0);
    cJSON_Delete(info);
    res = job_results(c.port, NULL, id);
    assert_int_equal(cJSON_GetArraySize(res), N);
    for (int i = 0; i < N; i++) {
        const cJSON *it = cJSON_GetArrayItem(res, i);
        const char *rid = jstr(it, "review_id");
        int k;
        assert_true(jnum(it, "line") == i + 1);
        assert_non_null(rid);
        assert_int_equal(sscanf(rid, "crash-%d", &k), 1);
        assert_true(k >= 0 && k < N);
        if (seen[k])
            fail_msg("review %s answered twice", rid);
        seen[k] = true;
        assert_true(strlen(jstr(it, "reply")) > 0);
    }
    cJSON_Delete(res);
    assert_int_equal(server_stop(&c, SIGTERM), 0);
    /* exactly one stored reply per review */
    assert_int_equal(db_count(dir, "SELECT COUNT(*) FROM replies WHERE shop_id = 'shop-crash'"), N);
    assert_int_equal(
        db_count(dir, "SELECT COUNT(DISTINCT review_id) FROM replies WHERE shop_id = 'shop-crash'"),
        N);
}


/* ---- tests: reply modes and routing to a person ---------------------------------------------- */

/* POST one review to the main server; checks source/needs_human/action and returns the answer. */
static cJSON *expect_action(const char *shop, const char *id, const char *text, int rating,
                            bool needs_human, const char *action)
{
    cJSON *j = reply_ok(g_srv.port, shop, id, text, rating);
    if (jbool(j, "needs_human") != needs_human || strcmp(jstr(j, "action"), action) != 0)
        fail_msg("%s/%s (%d stars): needs_human %d action %s, want %d %s", shop, id, rating,
                 jbool(j, "needs_human"), jstr(j, "action"), needs_human, action);
    return j;
}

static void reply_modes_and_needs_human_decide_the_action(void **state)
{
    const char *good = "物流很快，包装完好，很满意";
    const char *meh = "还行吧，一般般";
    const char *fake = "质量不错，但是怀疑是假货"; /* 假货: a default sensitive word */
    const char *bad = "太差了，完全不能用";
    double tok0;
    int status;
    cJSON *j;
    (void)state;
    /* off: no reply and no model */
    tok0 = metric(g_srv.port, "autoreply_prompt_tokens_total");
    j = expect_action("quiet", "mode-1", good, 5, false, "none");
    assert_string_equal(jstr(j, "reply"), "");
    assert_string_equal(jstr(j, "source"), "off");
    cJSON_Delete(j);
    j = expect_action("quiet", "mode-2", bad, 1, true, "none");
    cJSON_Delete(j);
    assert_true(metric(g_srv.port, "autoreply_prompt_tokens_total") == tok0);
    /* suggest: a reply for a person to send, whatever the rating */
    j = expect_action("sugg", "mode-3", good, 5, false, "suggest");
    assert_true(strlen(jstr(j, "reply")) > 0);
    cJSON_Delete(j);
    /* auto from 4 stars, a needs_human reply held */
    j = expect_action("auto", "mode-4", good, 5, false, "send");
    assert_true(strlen(jstr(j, "reply")) > 0);
    cJSON_Delete(j);
    cJSON_Delete(expect_action("auto", "mode-5", meh, 3, false, "suggest"));
    cJSON_Delete(expect_action("auto", "mode-6", fake, 5, true, "suggest"));
    cJSON_Delete(expect_action("auto", "mode-7", bad, 1, true, "suggest"));
    /* auto from 3 stars without holding needs_human */
    cJSON_Delete(expect_action("auto-nohold", "mode-8", fake, 5, true, "send"));
    cJSON_Delete(expect_action("auto-nohold", "mode-9", meh, 3, false, "send"));
    cJSON_Delete(expect_action("auto-nohold", "mode-10", bad, 1, true, "suggest"));
    /* the stored answer keeps the action of the stored rating (asked with another rating it
     * is a conflict: pipeline_test, same_id_with_another_rating_is_a_conflict) */
    j = reply_ok(g_srv.port, "auto", "mode-5", meh, 3);
    assert_string_equal(jstr(j, "source"), "store");
    assert_string_equal(jstr(j, "action"), "suggest");
    cJSON_Delete(j);
    /* a batch decides per item */
    {
        char *a = review_json("quiet", "mode-b1", good, 5), *b = review_json("auto", "mode-b2", good, 5);
        char *c = review_json("auto", "mode-b3", fake, 5), body[2048];
        snprintf(body, sizeof(body), "{\"reviews\": [%s, %s, %s]}", a, b, c);
        j = post_json(g_srv.port, "/v1/reviews/batch", NULL, body, &status);
        assert_int_equal(status, 200);
        assert_string_equal(jstr(result_at(j, 0), "action"), "none");
        assert_string_equal(jstr(result_at(j, 1), "action"), "send");
        assert_string_equal(jstr(result_at(j, 2), "action"), "suggest");
        assert_true(jbool(result_at(j, 2), "needs_human"));
        cJSON_Delete(j);
        free(a);
        free(b);
        free(c);
    }
}

/* ---- tests: the token rate limit covers review replies ---------------------------------------- */

static void generated_replies_are_charged_to_the_token_rate_limit(void **state)
{
    char dir[128];
    struct child c;
    const struct review *first = pick("zh", false, 300);
    int n_ok = 0, status = 0;
    char ra[16];
    double tok0, gen0;
    cJSON *j;
    (void)state;
    snprintf(dir, sizeof(dir), "%s/tpm", g_tmp);
    /* 1200 tokens a minute: a handful of generated replies (prompt + reply each) */
    server_start(&c, dir, (const char *const[]){"--rate-tpm", "1200", NULL});
    j = reply_ok(c.port, "shop-tpm", "tpm-0", first->text, first->rating);
    assert_string_equal(jstr(j, "source"), "model");
    cJSON_Delete(j);
    /* cache hits and stored replies cost nothing: 30 of them leave the budget as it was */
    for (int i = 0; i < 15; i++) {
        char id[32];
        snprintf(id, sizeof(id), "tpm-c%d", i);
        j = reply_ok(c.port, "shop-tpm", id, first->text, first->rating);
        assert_string_equal(jstr(j, "source"), "cache");
        cJSON_Delete(j);
        j = reply_ok(c.port, "shop-tpm", "tpm-0", first->text, first->rating);
        assert_string_equal(jstr(j, "source"), "store");
        cJSON_Delete(j);
    }
    /* new reviews until the budget is spent */
    tok0 = metric(c.port, "autoreply_prompt_tokens_total");
    gen0 = metric(c.port, "autoreply_generation_tokens_total");
    for (int i = 0; i < 60; i++) {
        const struct review *rv = pick(i % 2 ? "zh" : "en", i % 3 == 0, 400 + i);
        char id[32], *body;
        struct resp r;
        snprintf(id, sizeof(id), "tpm-%d", i + 1);
        body = review_json("shop-tpm", id, rv->text, rv->rating);
        http(c.port, "POST", "/v1/reviews/reply", "Content-Type: application/json\r\n", body,
             strlen(body), &r);
        free(body);
        status = r.status;
        if (status == 429) {
            cJSON *e = cJSON_GetObjectItem(j = cJSON_Parse(r.body), "error");
            assert_string_equal(jstr(e, "code"), "rate_limit_exceeded");
            assert_string_equal(jstr(e, "type"), "rate_limit_error");
            assert_non_null(resp_header(&r, "Retry-After", ra, sizeof(ra)));
            assert_true(atoi(ra) >= 1);
            cJSON_Delete(j);
            resp_free(&r);
            break;
        }
        assert_int_equal(status, 200);
        n_ok++;
        resp_free(&r);
    }
    assert_int_equal(status, 429);
    /* the first new review after the free answers was admitted; the bucket ran dry at about
     * its size in engine tokens (prompt + generated), not after a fixed number of requests */
    assert_true(n_ok >= 1);
    {
        double used = metric(c.port, "autoreply_prompt_tokens_total") - tok0 +
                      metric(c.port, "autoreply_generation_tokens_total") - gen0;
        if (used < 600 || used > 1200 + 400)
            fail_msg("429 after %d replies and %.0f tokens (bucket 1200)", n_ok, used);
    }
    /* a stored reply is still answered while the budget is spent */
    j = reply_ok(c.port, "shop-tpm", "tpm-0", first->text, first->rating);
    assert_string_equal(jstr(j, "source"), "store");
    cJSON_Delete(j);
    assert_int_equal(server_stop(&c, SIGTERM), 0);
}

/* ---- tests: a client that leaves mid-generation --------------------------------------------- */

static void client_leaving_mid_generation_cancels_it_and_frees_the_kv(void **state)
{
    enum { N = REPLY_BATCH_MAX_TEST };
    char dir[128], head[256];
    struct child c;
    cJSON *arr = cJSON_CreateArray();
    char *body;
    double base_used, t0, gen1, model0;
    long long stored;
    int fd;
    (void)state;
    for (int i = 0; i < N; i++) {
        const struct review *rv = &g_reviews[(i * 7) % g_n_reviews];
        cJSON *o = cJSON_CreateObject();
        char id[32];
        snprintf(id, sizeof(id), "gone-%d", i);
        cJSON_AddStringToObject(o, "shop_id", "shop-gone");
        cJSON_AddStringToObject(o, "review_id", id);
        cJSON_AddStringToObject(o, "text", rv->text);
        cJSON_AddNumberToObject(o, "rating", rv->rating);
        cJSON_AddItemToArray(arr, o);
    }
    body = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    snprintf(dir, sizeof(dir), "%s/gone", g_tmp);
    /* one sequence at a time and no caches: the batch takes a while, all of it generation */
    server_start(&c, dir,
                 (const char *const[]){"--no-reply-cache", "--no-prefix-cache", "--parallel", "1",
                                       NULL});
    base_used = metric(c.port, "autoreply_kv_blocks_used");
    model0 = metric0(c.port, "autoreply_reply_replies_total{source=\"model\"}");
    assert_true(base_used == 0);
    fd = connect_port(c.port);
    snprintf(head, sizeof(head),
             "POST /v1/reviews/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n",
             strlen(body));
    assert_true(send_all(fd, head, strlen(head)));
    assert_true(send_all(fd, body, strlen(body)));
    free(body);
    /* a reply is being generated (its sequence holds KV), then the client hangs up */
    t0 = now_s();
    while (metric(c.port, "autoreply_kv_blocks_used") == base_used && now_s() - t0 < 30)
        th_sleep_s(0.002);
    assert_true(metric(c.port, "autoreply_kv_blocks_used") > base_used);
    close(fd);
    /* the server notices, cancels the generation in flight and starts no other: KV back to
     * the baseline, nothing running, nothing generated any more */
    t0 = now_s();
    while ((metric(c.port, "autoreply_kv_blocks_used") != base_used ||
            metric(c.port, "autoreply_running_sequences") != 0) &&
           now_s() - t0 < 10)
        th_sleep_s(0.02);
    th_sleep_s(0.5); /* not just a gap between two replies */
    assert_true(metric(c.port, "autoreply_kv_blocks_used") == base_used);
    assert_true(metric(c.port, "autoreply_running_sequences") == 0);
    gen1 = metric(c.port, "autoreply_generation_tokens_total");
    th_sleep_s(0.5);
    assert_true(metric(c.port, "autoreply_generation_tokens_total") == gen1);
    /* most of the batch was never answered, and nothing the client did not get was kept
     * beyond what was finished before it left */
    assert_true(metric0(c.port, "autoreply_reply_replies_total{source=\"model\"}") +
                    metric0(c.port, "autoreply_reply_replies_total{source=\"fallback\"}") -
                    model0 <
                N / 2);
    assert_int_equal(server_stop(&c, SIGTERM), 0);
    stored = db_count(dir, "SELECT COUNT(*) FROM replies WHERE shop_id = 'shop-gone'");
    assert_true(stored >= 0 && stored < N / 2);
    /* a later request for the same reviews is answered by the model, not from a store left
     * by the cancelled one */
    server_start(&c, dir, (const char *const[]){"--no-reply-cache", NULL});
    {
        const struct review *rv = &g_reviews[((N - 1) * 7) % g_n_reviews];
        char id[32];
        cJSON *j;
        snprintf(id, sizeof(id), "gone-%d", N - 1);
        j = reply_ok(c.port, "shop-gone", id, rv->text, rv->rating);
        assert_string_equal(jstr(j, "source"), "model");
        cJSON_Delete(j);
    }
    assert_int_equal(server_stop(&c, SIGTERM), 0);
}

/* The instance header as a proxy in front of a fleet sees it: the name given to serve, else
 * "<host name>:<port>"; a name that cannot be a header value stops serve with one clear line. */
static void serve_names_its_instance_in_every_response(void **state)
{
    struct child c;
    char dir[300], host[256], want[300], v[300], cmd[1024];
    struct resp r;
    FILE *p;
    size_t n;
    int st;
    (void)state;
    /* the main server runs with no name: host and port */
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    host[sizeof(host) - 1] = '\0';
    snprintf(want, sizeof(want), "%s:%d", host, g_srv.port);
    http(g_srv.port, "GET", "/health", NULL, NULL, 0, &r);
    assert_string_equal(resp_header(&r, "X-Autoreply-Instance", v, sizeof(v)), want);
    resp_free(&r);
    /* a named one: its health, a review and an error */
    snprintf(dir, sizeof(dir), "%s/named", g_tmp);
    server_start(&c, dir, (const char *const[]){"--instance-name", "fleet-a", NULL});
    http(c.port, "GET", "/health", NULL, NULL, 0, &r);
    assert_string_equal(resp_header(&r, "X-Autoreply-Instance", v, sizeof(v)), "fleet-a");
    assert_non_null(strstr(r.body, "\"instance\":\"fleet-a\""));
    resp_free(&r);
    {
        const char *body = "{\"shop_id\":\"named\",\"review_id\":\"n1\",\"text\":\"很好\",\"rating\":5}";
        http(c.port, "POST", "/v1/reviews/reply", "Content-Type: application/json\r\n", body,
             strlen(body), &r);
        assert_int_equal(r.status, 200);
        assert_string_equal(resp_header(&r, "X-Autoreply-Instance", v, sizeof(v)), "fleet-a");
        resp_free(&r);
    }
    http(c.port, "GET", "/v1/jobs/nope", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(resp_header(&r, "X-Autoreply-Instance", v, sizeof(v)), "fleet-a");
    resp_free(&r);
    assert_int_equal(server_stop(&c, SIGTERM), 0);
    /* a name with a line break is refused before anything listens */
    snprintf(cmd, sizeof(cmd),
             "%s serve -m %s --port 0 --data-dir %s/bad --instance-name 'a\nb' 2>&1", th_bin_path(),
             g_model, g_tmp);
    assert_non_null(p = popen(cmd, "r"));
    n = fread(v, 1, sizeof(v) - 1, p);
    v[n] = '\0';
    st = pclose(p);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    if (!strstr(v, "instance name"))
        fail_msg("serve with a bad instance name said: %s", v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reviews_are_answered_in_their_language_and_low_ratings_need_a_human),
        cmocka_unit_test(repeated_review_text_is_served_from_the_cache),
        cmocka_unit_test(same_review_id_returns_the_stored_reply_without_the_model),
        cmocka_unit_test(a_review_may_be_named_by_id_in_single_and_batch_requests),
        cmocka_unit_test(banned_words_of_a_shop_never_appear),
        cmocka_unit_test(json_and_msgpack_give_the_same_reply),
        cmocka_unit_test(batch_answers_each_item_on_its_own),
        cmocka_unit_test(job_answers_every_line_and_records_a_malformed_one),
        cmocka_unit_test(bad_input_gets_json_errors),
        cmocka_unit_test(product_routes_need_the_api_key_and_obey_rate_limits),
        cmocka_unit_test(reply_cache_prefix_cache_and_batching_can_be_switched_off),
        cmocka_unit_test(job_survives_kill_9_with_one_reply_per_review),
        cmocka_unit_test(reply_modes_and_needs_human_decide_the_action),
        cmocka_unit_test(generated_replies_are_charged_to_the_token_rate_limit),
        cmocka_unit_test(client_leaving_mid_generation_cancels_it_and_frees_the_kv),
        cmocka_unit_test(serve_names_its_instance_in_every_response),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
