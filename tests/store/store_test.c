/* store_test.c - the store over both backends: insert-once replies, claims, job progress
 * and results, durability across close/reopen and across a kill -9 in the middle of a job,
 * argument checks, and several threads sharing handles. Each such test runs twice: on a SQLite
 * file in a fresh mkdtemp dir, and on a fresh PostgreSQL database (AR_TEST_PG_URL, required).
 * Then what only one backend has: SQLite's checkpoints and file checks; PostgreSQL's
 * concurrent migrations, pooled connections, time limits, and a private server stopped and
 * started again. */
#include "harness/harness.h"
#include "harness/pg.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

struct fixture {
    bool pg;            /* the test runs on PostgreSQL */
    char dir[64];       /* a fresh folder (both backends) */
    char path[128];     /* the SQLite file */
    char url[512];      /* what the test opens: path, or the PostgreSQL database's URL */
    struct th_pg_db db; /* PostgreSQL: the fresh database */
    char svc_dir[64];   /* a private server's folder, stopped at teardown even after a failure */
};

static int setup_with(void **state, bool pg)
{
    struct fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    f->pg = pg;
    snprintf(f->dir, sizeof(f->dir), "/tmp/ar_store_test_XXXXXX");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    snprintf(f->path, sizeof(f->path), "%s/store.db", f->dir);
    snprintf(f->url, sizeof(f->url), "%s", f->path);
    if (pg) {
        if (th_pg_create(&f->db) != 0) {
            rmdir(f->dir);
            free(f);
            return -1;
        }
        snprintf(f->url, sizeof(f->url), "%s", f->db.url);
    }
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, false);
}

static int setup_pg(void **state)
{
    return setup_with(state, true);
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    DIR *d;
    if (f->pg && th_pg_drop(&f->db) != 0)
        fprintf(stderr, "could not drop %s\n", f->db.name);
    if (f->svc_dir[0]) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "sh deploy/services.sh stop-all %s >/dev/null 2>&1; rm -rf %s",
                 f->svc_dir, f->svc_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", f->svc_dir);
    }
    d = opendir(f->dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", f->dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(f->dir);
    free(f);
    return 0;
}

static struct store *open_store(const char *url)
{
    struct store *st = NULL;
    struct ar_err err = {0};
    enum ar_status s = store_open_url(url, &st, &err);
    if (s != AR_OK)
        fail_msg("store_open_url(%s): %s: %s", url, ar_status_str(s), err.msg);
    return st;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct store_reply sample_reply(const char *shop, const char *review, const char *reply)
{
    struct store_reply r = {0};
    r.shop_id = shop;
    r.review_id = review;
    r.text = "物流很快，包装完好，宝贝质量不错！";
    r.rating = 5;
    r.lang = "zh";
    r.reply = reply;
    r.needs_human = false;
    r.sentiment = 0.75f;
    r.cached = true;
    r.model = "qwen2-0.5b-q4_0";
    r.created_s = 1700000000;
    return r;
}

/* ---- replies ------------------------------------------------------------------------ */

static void reply_put_twice_keeps_the_first_reply(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply a = sample_reply("shop-1", "r-100", "感谢您的好评，期待再次光临！");
    struct store_reply b = sample_reply("shop-1", "r-100", "a different reply");
    struct store_reply out = {0};
    bool existed = true, found = false;

    assert_int_equal(store_reply_put(st, &a, &out, &existed, NULL), AR_OK);
    assert_false(existed);
    assert_string_equal(out.reply, a.reply);
    store_reply_fini(&out);

    b.rating = 1;
    b.needs_human = true;
    assert_int_equal(store_reply_put(st, &b, &out, &existed, NULL), AR_OK);
    assert_true(existed);
    /* the stored row is the first one, field for field */
    assert_string_equal(out.shop_id, "shop-1");
    assert_string_equal(out.review_id, "r-100");
    assert_string_equal(out.text, a.text);
    assert_string_equal(out.reply, a.reply);
    assert_int_equal(out.rating, 5);
    assert_string_equal(out.lang, "zh");
    assert_false(out.needs_human);
    assert_true(fabsf(out.sentiment - 0.75f) < 1e-6f);
    assert_true(out.cached);
    assert_string_equal(out.model, "qwen2-0.5b-q4_0");
    assert_int_equal(out.created_s, 1700000000);
    store_reply_fini(&out);
    assert_null(out.storage);

    assert_int_equal(store_reply_get(st, "shop-1", "r-100", &out, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(out.reply, a.reply);
    store_reply_fini(&out);

    /* the same review id in another shop is another record */
    assert_int_equal(store_reply_get(st, "shop-2", "r-100", &out, &found, NULL), AR_OK);
    assert_false(found);
    b.shop_id = "shop-2";
    assert_int_equal(store_reply_put(st, &b, NULL, &existed, NULL), AR_OK);
    assert_false(existed);
    assert_int_equal(store_reply_get(st, "shop-2", "r-100", &out, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(out.reply, "a different reply");
    assert_int_equal(out.rating, 1);
    assert_true(out.needs_human);
    store_reply_fini(&out);
    store_close(st);
}

static void reply_put_fills_defaults(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply r = sample_reply("shop-1", "r-7", "");
    struct store_reply out = {0};
    int64_t before = (int64_t)time(NULL);
    r.lang = NULL;
    r.model = NULL;
    r.created_s = 0;
    r.text = "";
    assert_int_equal(store_reply_put(st, &r, &out, NULL, NULL), AR_OK);
    assert_string_equal(out.lang, "");
    assert_string_equal(out.model, "");
    assert_string_equal(out.text, "");
    assert_string_equal(out.reply, "");
    assert_true(out.created_s >= before && out.created_s <= (int64_t)time(NULL));
    store_reply_fini(&out);
    store_close(st);
}

static void invalid_reply_arguments_are_rejected(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply good = sample_reply("shop-1", "r-1", "谢谢");
    struct store_reply r, out;
    struct ar_err err = {0};
    char long_id[STORE_ID_MAX + 2];
    bool found = true;
    memset(long_id, 'x', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';

    r = good, r.shop_id = NULL;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, &err), AR_EINVAL);
    assert_int_equal(err.code, AR_EINVAL);
    r = good, r.shop_id = "";
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    r = good, r.review_id = "";
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    r = good, r.review_id = long_id;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    r = good, r.rating = 0;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    r = good, r.rating = 6;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    r = good, r.sentiment = NAN;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    r = good, r.text = NULL;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    r = good, r.reply = NULL;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_EINVAL);
    assert_int_equal(store_reply_put(NULL, &good, NULL, NULL, NULL), AR_EINVAL);
    assert_int_equal(store_reply_put(st, NULL, NULL, NULL, NULL), AR_EINVAL);

    assert_int_equal(store_reply_get(st, "", "r-1", &out, &found, NULL), AR_EINVAL);
    assert_false(found);
    assert_int_equal(store_reply_get(st, NULL, "r-1", &out, &found, NULL), AR_EINVAL);
    assert_int_equal(store_reply_get(st, "shop-1", NULL, &out, &found, NULL), AR_EINVAL);
    /* none of the rejected puts left a row behind */
    assert_int_equal(store_reply_get(st, "shop-1", "r-1", &out, &found, NULL), AR_OK);
    assert_false(found);

    assert_int_equal(store_open(NULL, &(struct store *){NULL}, NULL), AR_EINVAL);
    assert_int_equal(store_open("", &(struct store *){NULL}, NULL), AR_EINVAL);
    store_close(st);
    store_close(NULL);
}

/* A new row's put result is what a later get reads from the database, field for field. */
static void new_reply_put_returns_the_row_as_read_back(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply r = sample_reply("shop-9", "r-9", "谢谢！");
    struct store_reply put = {0}, got = {0};
    bool existed = true, found = false;
    r.sentiment = -0.3f; /* not exact in binary: the stored double must round-trip */
    r.needs_human = true;
    r.cached = false;
    assert_int_equal(store_reply_put(st, &r, &put, &existed, NULL), AR_OK);
    assert_false(existed);
    assert_int_equal(store_reply_get(st, "shop-9", "r-9", &got, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(put.shop_id, got.shop_id);
    assert_string_equal(put.review_id, got.review_id);
    assert_string_equal(put.text, got.text);
    assert_string_equal(put.lang, got.lang);
    assert_string_equal(put.reply, got.reply);
    assert_string_equal(put.model, got.model);
    assert_int_equal(put.rating, got.rating);
    assert_int_equal(put.needs_human, got.needs_human);
    assert_true(put.sentiment == got.sentiment);
    assert_int_equal(put.cached, got.cached);
    assert_int_equal(put.created_s, got.created_s);
    store_reply_fini(&put);
    store_reply_fini(&got);
    store_close(st);
}

/* Rows in the main database file alone (the WAL ignored), read by a separate connection. */
static int rows_in_main_file(const char *path)
{
    char uri[256];
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    int n = -1;
    snprintf(uri, sizeof(uri), "file:%s?immutable=1", path);
    if (sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "SELECT count(*) FROM replies", -1, &s, NULL) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW)
        n = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

/* Commits reach the database file while the handle stays open and idle: checkpoints happen
 * in the background, not only at close. */
static void commits_are_checkpointed_in_the_background(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char id[32];
    int n = -1;
    for (int i = 0; i < 300; i++) {
        struct store_reply r;
        snprintf(id, sizeof(id), "r-%d", i);
        r = sample_reply("shop-c", id, "谢谢");
        assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
    }
    for (int t = 0; t < 100 && (n = rows_in_main_file(f->path)) != 300; t++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(n, 300);
    store_close(st);
}

/* ---- jobs --------------------------------------------------------------------------- */

static const char *const job_lines[] = {
    "{\"review_id\":\"a1\",\"text\":\"质量很好，物流也快\",\"rating\":5}",
    "{\"review_id\":\"a2\",\"text\":\"Arrived broken, very disappointed\",\"rating\":1}",
    "{\"review_id\":\"a3\",\"text\":\"还行吧\",\"rating\":3}",
    "{\"review_id\":\"a4\",\"text\":\"客服态度差\",\"rating\":2}",
    "{\"review_id\":\"a5\",\"text\":\"Great value for money!\",\"rating\":5}",
};

/* Lines 1, 2, 4, 7, 9 (a gap, as when blank lines were skipped). */
static const int64_t job_line_numbers[] = {1, 2, 4, 7, 9};

/* What the five lines weigh: the bytes a job of them keeps. */
static int64_t job_lines_bytes(void)
{
    int64_t n = 0;
    for (size_t i = 0; i < AR_ARRAY_LEN(job_lines); i++)
        n += (int64_t)strlen(job_lines[i]);
    return n;
}

/* make_job for an owner, with a callback URL (NULL: none). */
static void make_owned_job(struct store *st, const char *owner, const char *callback,
                           char id[STORE_JOB_ID_LEN + 1])
{
    struct store_item_in in[5];
    struct store_job_spec spec = {"shop-9", owner, callback};
    struct ar_err err = {0};
    enum ar_status s;
    for (int i = 0; i < 5; i++) {
        in[i].line = job_line_numbers[i];
        in[i].input = job_lines[i];
    }
    s = store_job_create_spec(st, &spec, in, 5, id, &err);
    if (s != AR_OK)
        fail_msg("store_job_create_spec: %s: %s", ar_status_str(s), err.msg);
}

static void make_job(struct store *st, char id[STORE_JOB_ID_LEN + 1])
{
    struct store_item_in in[5];
    struct ar_err err = {0};
    enum ar_status s;
    for (int i = 0; i < 5; i++) {
        in[i].line = job_line_numbers[i];
        in[i].input = job_lines[i];
    }
    s = store_job_create(st, "shop-9", in, 5, id, &err);
    if (s != AR_OK)
        fail_msg("store_job_create: %s: %s", ar_status_str(s), err.msg);
}

struct collected {
    int n;
    int stop_after;
    int64_t lines[64];
    enum store_item_status status[64];
    char result[64][64];
    char input[64][128];
};

static bool collect_item(const struct store_item *it, void *user)
{
    struct collected *c = user;
    assert_null(it->storage);
    if (c->n < 64) {
        c->lines[c->n] = it->line;
        c->status[c->n] = it->status;
        snprintf(c->result[c->n], sizeof(c->result[0]), "%s", it->result ? it->result : "(null)");
        snprintf(c->input[c->n], sizeof(c->input[0]), "%s", it->input);
    }
    c->n++;
    return c->stop_after == 0 || c->n < c->stop_after;
}

static void job_progresses_from_queued_to_done(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char id[STORE_JOB_ID_LEN + 1];
    struct store_job_info info;
    struct store_item *items = NULL;
    struct collected col = {0};
    struct ar_err err = {0};
    size_t n = 0;
    bool found = false;

    make_job(st, id);
    assert_int_equal(strlen(id), STORE_JOB_ID_LEN);
    assert_int_equal(strspn(id, "0123456789abcdef"), STORE_JOB_ID_LEN);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(info.id, id);
    assert_int_equal(info.status, STORE_JOB_QUEUED);
    assert_int_equal(info.n_total, 5);
    assert_int_equal(info.n_done, 0);
    assert_int_equal(info.n_failed, 0);
    assert_string_equal(info.shop_id, "shop-9");
    assert_true(info.created_s > 0 && info.updated_s == info.created_s);

    /* pages of pending lines in line order */
    assert_int_equal(store_job_next_pending(st, id, 0, 2, &items, &n, NULL), AR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(items[0].line, 1);
    assert_int_equal(items[1].line, 2);
    assert_string_equal(items[0].input, job_lines[0]);
    assert_string_equal(items[1].input, job_lines[1]);
    assert_int_equal(items[0].status, STORE_ITEM_PENDING);
    assert_null(items[0].result);
    store_items_free(items, n);
    assert_int_equal(store_job_next_pending(st, id, 2, 100, &items, &n, NULL), AR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(items[0].line, 4);
    assert_int_equal(items[2].line, 9);
    assert_string_equal(items[2].input, job_lines[4]);
    store_items_free(items, n);

    assert_int_equal(store_job_item_done(st, id, 1, "{\"reply\":\"谢谢亲\"}", NULL), AR_OK);
    assert_int_equal(store_job_item_error(st, id, 4, "model timeout", NULL), AR_OK);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.status, STORE_JOB_RUNNING);
    assert_int_equal(info.n_done, 1);
    assert_int_equal(info.n_failed, 1);

    /* a finished line is never finished again, and nothing is counted twice */
    assert_int_equal(store_job_item_done(st, id, 1, "{}", &err), AR_EINVAL);
    assert_non_null(strstr(err.msg, "already done"));
    assert_int_equal(store_job_item_done(st, id, 4, "{}", NULL), AR_EINVAL);
    assert_int_equal(store_job_item_done(st, id, 3, "{}", &err), AR_EINVAL); /* no line 3 */
    assert_non_null(strstr(err.msg, "no line 3"));
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.n_done, 1);
    assert_int_equal(info.n_failed, 1);

    assert_int_equal(store_job_next_pending(st, id, 0, 10, &items, &n, NULL), AR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(items[0].line, 2);
    assert_int_equal(items[1].line, 7);
    assert_int_equal(items[2].line, 9);
    for (size_t i = 0; i < n; i++) {
        char res[64];
        snprintf(res, sizeof(res), "{\"line\":%lld}", (long long)items[i].line);
        assert_int_equal(store_job_item_done(st, id, items[i].line, res, NULL), AR_OK);
    }
    store_items_free(items, n);
    assert_int_equal(store_job_next_pending(st, id, 0, 10, &items, &n, NULL), AR_OK);
    assert_int_equal(n, 0);
    assert_null(items);

    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.status, STORE_JOB_DONE);
    assert_int_equal(info.n_done, 4);
    assert_int_equal(info.n_failed, 1);

    assert_int_equal(store_job_results(st, id, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, 5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(col.lines[i], job_line_numbers[i]);
        assert_string_equal(col.input[i], job_lines[i]);
    }
    assert_string_equal(col.result[0], "{\"reply\":\"谢谢亲\"}");
    assert_int_equal(col.status[0], STORE_ITEM_DONE);
    assert_string_equal(col.result[1], "{\"line\":2}");
    assert_int_equal(col.status[2], STORE_ITEM_ERROR);
    assert_string_equal(col.result[2], "model timeout");
    assert_string_equal(col.result[4], "{\"line\":9}");

    memset(&col, 0, sizeof(col));
    col.stop_after = 2;
    assert_int_equal(store_job_results(st, id, collect_item, &col, NULL), AR_ECANCELED);
    assert_int_equal(col.n, 2);
    store_close(st);
}

/* A queue consumer reads one line before working on it: status, input and result, for
 * pending, done and failed lines; and a job is published once, after its creation. */
static void job_lines_are_read_one_by_one_and_jobs_get_published(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char id[STORE_JOB_ID_LEN + 1];
    const char *missing = "0123456789abcdef0123456789abcdef";
    struct store_job_info info;
    struct store_item it = {0}, *heap;
    struct ar_err err = {0};
    bool found = false;

    make_job(st, id);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_false(info.published);

    assert_int_equal(store_job_item_get(st, id, 4, &it, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(it.line, 4);
    assert_int_equal(it.status, STORE_ITEM_PENDING);
    assert_string_equal(it.input, job_lines[2]);
    assert_null(it.result);
    store_item_fini(&it);
    assert_null(it.storage);

    assert_int_equal(store_job_item_done(st, id, 4, "{\"reply\":\"好\"}", NULL), AR_OK);
    assert_int_equal(store_job_item_error(st, id, 9, "bad line", NULL), AR_OK);
    assert_int_equal(store_job_item_get(st, id, 4, &it, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(it.status, STORE_ITEM_DONE);
    assert_string_equal(it.input, job_lines[2]);
    assert_string_equal(it.result, "{\"reply\":\"好\"}");
    store_item_fini(&it);
    /* a heap item is released with store_items_free(out, 1) */
    heap = ar_calloc(1, sizeof(*heap));
    assert_non_null(heap);
    assert_int_equal(store_job_item_get(st, id, 9, heap, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(heap->status, STORE_ITEM_ERROR);
    assert_string_equal(heap->result, "bad line");
    assert_string_equal(heap->input, job_lines[4]);
    store_items_free(heap, 1);

    /* no such line, no such job, bad ids */
    assert_int_equal(store_job_item_get(st, id, 3, &it, &found, NULL), AR_OK);
    assert_false(found);
    assert_null(it.storage);
    assert_int_equal(store_job_item_get(st, missing, 1, &it, &found, NULL), AR_OK);
    assert_false(found);
    assert_int_equal(store_job_item_get(st, "nope", 1, &it, &found, NULL), AR_EINVAL);
    assert_int_equal(store_job_item_get(st, id, 1, NULL, &found, NULL), AR_EINVAL);
    assert_int_equal(store_job_item_get(st, id, 1, &it, NULL, NULL), AR_EINVAL);

    assert_int_equal(store_job_set_published(st, id, NULL), AR_OK);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(info.published);
    /* publishing changes nothing else */
    assert_int_equal(info.status, STORE_JOB_RUNNING);
    assert_int_equal(info.n_done, 1);
    assert_int_equal(info.n_failed, 1);
    assert_int_equal(store_job_set_published(st, id, NULL), AR_OK); /* again: still published */
    assert_int_equal(store_job_set_published(st, missing, &err), AR_EINVAL);
    assert_non_null(strstr(err.msg, missing));
    assert_int_equal(store_job_set_published(st, "xyz", NULL), AR_EINVAL);
    store_close(st);
}

static bool count_job(const struct store_job_info *info, void *user)
{
    struct collected *c = user;
    if (c->n < 64)
        snprintf(c->input[c->n], sizeof(c->input[0]), "%s", info->id);
    c->n++;
    return true;
}

static bool collect_published(const struct store_job_info *info, void *user)
{
    struct collected *c = user;
    if (c->n < 64)
        snprintf(c->input[c->n], sizeof(c->input[0]), "%s:%d", info->id, info->published);
    c->n++;
    return true;
}

static void cancelled_and_finished_jobs_are_not_unfinished(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char a[STORE_JOB_ID_LEN + 1], b[STORE_JOB_ID_LEN + 1], c[STORE_JOB_ID_LEN + 1];
    struct collected col = {0};
    struct store_job_info info;
    bool found;
    make_job(st, a);
    make_job(st, b);
    make_job(st, c);
    assert_string_not_equal(a, b);
    assert_string_not_equal(b, c);
    assert_int_equal(store_job_set_status(st, b, STORE_JOB_CANCELLED, NULL), AR_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(store_job_item_done(st, c, job_line_numbers[i], "{}", NULL), AR_OK);
    assert_int_equal(store_jobs_unfinished(st, count_job, &col, NULL), AR_OK);
    assert_int_equal(col.n, 1);
    assert_string_equal(col.input[0], a);
    /* unfinished jobs say whether they were published */
    {
        struct collected pub = {0};
        char want[STORE_JOB_ID_LEN + 3];
        assert_int_equal(store_job_set_published(st, a, NULL), AR_OK);
        assert_int_equal(store_jobs_unfinished(st, collect_published, &pub, NULL), AR_OK);
        assert_int_equal(pub.n, 1);
        snprintf(want, sizeof(want), "%s:1", a);
        assert_string_equal(pub.input[0], want);
    }

    /* a line finished after cancelling is recorded but the job stays cancelled */
    assert_int_equal(store_job_item_done(st, b, 1, "{}", NULL), AR_OK);
    assert_int_equal(store_job_get(st, b, &info, &found, NULL), AR_OK);
    assert_int_equal(info.status, STORE_JOB_CANCELLED);
    assert_int_equal(info.n_done, 1);

    assert_int_equal(store_job_get(st, "0123456789abcdef0123456789abcdef", &info, &found, NULL),
                     AR_OK);
    assert_false(found);
    assert_int_equal(
        store_job_set_status(st, "0123456789abcdef0123456789abcdef", STORE_JOB_FAILED, NULL),
        AR_EINVAL);
    store_close(st);
}

static void invalid_job_arguments_are_rejected(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_item_in in[3] = {{1, "{}"}, {2, "{}"}, {3, "{}"}};
    char id[STORE_JOB_ID_LEN + 1];
    struct store_job_info info;
    struct store_item *items;
    struct collected col = {0};
    struct ar_err err = {0};
    size_t n;
    bool found;

    assert_int_equal(store_job_create(st, NULL, in, 3, id, NULL), AR_EINVAL);
    assert_int_equal(store_job_create(st, "", in, 3, id, NULL), AR_EINVAL);
    assert_int_equal(store_job_create(st, "shop", in, 0, id, NULL), AR_EINVAL);
    assert_int_equal(store_job_create(st, "shop", NULL, 3, id, NULL), AR_EINVAL);
    in[1].line = 0;
    assert_int_equal(store_job_create(st, "shop", in, 3, id, NULL), AR_EINVAL);
    in[1].line = 2;
    in[2].input = NULL;
    assert_int_equal(store_job_create(st, "shop", in, 3, id, NULL), AR_EINVAL);
    /* a duplicate line is caught by the database, and the whole job is rolled back */
    in[2].input = "{}";
    in[2].line = 1;
    assert_int_equal(store_job_create(st, "shop", in, 3, id, &err), AR_EINVAL);
    assert_string_equal(id, "");
    assert_true(strlen(err.msg) > 0);
    assert_int_equal(store_jobs_unfinished(st, count_job, &col, NULL), AR_OK);
    assert_int_equal(col.n, 0);

    assert_int_equal(store_job_get(st, "not-a-job-id", &info, &found, NULL), AR_EINVAL);
    assert_int_equal(store_job_get(st, NULL, &info, &found, NULL), AR_EINVAL);
    assert_int_equal(store_job_next_pending(st, "xyz", 0, 1, &items, &n, NULL), AR_EINVAL);
    make_job(st, id);
    assert_int_equal(store_job_next_pending(st, id, 0, 0, &items, &n, NULL), AR_EINVAL);
    assert_int_equal(store_job_item_done(st, id, 1, NULL, NULL), AR_EINVAL);
    assert_int_equal(store_job_set_status(st, id, (enum store_job_status)42, NULL), AR_EINVAL);
    assert_int_equal(
        store_job_results(st, "0123456789abcdef0123456789abcdef", collect_item, &col, NULL),
        AR_EINVAL);
    assert_int_equal(store_job_results(st, id, NULL, NULL, NULL), AR_EINVAL);
    store_close(st);
}

/* ---- durability --------------------------------------------------------------------- */

static int64_t pragma_int(const char *path, const char *sql, char *text, size_t text_size)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    int64_t v = -1;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    if (sqlite3_step(s) == SQLITE_ROW) {
        v = sqlite3_column_int64(s, 0);
        if (text)
            snprintf(text, text_size, "%s", (const char *)sqlite3_column_text(s, 0));
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

static void reopen_keeps_replies_and_jobs(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply r = sample_reply("shop-1", "r-1", "Thanks for your feedback!");
    struct store_reply out;
    struct store_job_info info;
    char id[STORE_JOB_ID_LEN + 1], mode[16];
    struct collected col = {0};
    bool found;

    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
    make_job(st, id);
    assert_int_equal(store_job_item_done(st, id, 2, "{\"ok\":true}", NULL), AR_OK);
    store_close(st);

    if (f->pg) {
        /* every version recorded once */
        assert_int_equal(th_pg_scalar(&f->db, "SELECT max(version) FROM schema_migrations"),
                         STORE_PG_SCHEMA_VERSION);
        assert_int_equal(th_pg_scalar(&f->db, "SELECT count(*) FROM schema_migrations"),
                         STORE_PG_SCHEMA_VERSION);
    } else {
        assert_int_equal(pragma_int(f->path, "PRAGMA user_version", NULL, 0), STORE_SCHEMA_VERSION);
        pragma_int(f->path, "PRAGMA journal_mode", mode, sizeof(mode));
        assert_string_equal(mode, "wal");
    }

    st = open_store(f->url);
    assert_string_equal(store_backend_name(st), f->pg ? "postgres" : "sqlite");
    assert_int_equal(store_reply_get(st, "shop-1", "r-1", &out, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(out.reply, "Thanks for your feedback!");
    store_reply_fini(&out);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(info.status, STORE_JOB_RUNNING);
    assert_int_equal(info.n_done, 1);
    assert_int_equal(store_job_results(st, id, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, 5);
    assert_int_equal(col.status[1], STORE_ITEM_DONE);
    assert_string_equal(col.result[1], "{\"ok\":true}");
    assert_int_equal(col.status[0], STORE_ITEM_PENDING);
    store_close(st);
}

static void open_rejects_non_database_and_newer_schema(void **state)
{
    struct fixture *f = *state;
    struct store *st = NULL;
    struct ar_err err = {0};
    char junk[160], newer[160];
    FILE *fp;
    snprintf(junk, sizeof(junk), "%s/junk.db", f->dir);
    fp = fopen(junk, "wb");
    assert_non_null(fp);
    for (int i = 0; i < 200; i++)
        fputs("this is not an sqlite database. ", fp);
    fclose(fp);
    assert_int_equal(store_open(junk, &st, &err), AR_EFORMAT);
    assert_null(st);
    assert_true(strlen(err.msg) > 0);

    snprintf(newer, sizeof(newer), "%s/newer.db", f->dir);
    {
        sqlite3 *db = NULL;
        assert_int_equal(sqlite3_open(newer, &db), SQLITE_OK);
        assert_int_equal(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
    }
    assert_int_equal(store_open(newer, &st, &err), AR_EFORMAT);
    assert_null(st);
    assert_non_null(strstr(err.msg, "99"));
}

/* A version-1 database (no published column) is migrated at open: its jobs read back as
 * unpublished, and can be published. */
static void version_one_database_is_migrated(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char id[STORE_JOB_ID_LEN + 1];
    struct store_job_info info;
    bool found = false;
    sqlite3 *db = NULL;
    struct store_reply old = sample_reply("s1", "r-old", "旧的回复"), got;
    make_job(st, id);
    assert_int_equal(store_job_set_published(st, id, NULL), AR_OK);
    old.status = STORE_REVIEW_SENT; /* version 1 kept no status: it reads as pending */
    assert_int_equal(store_reply_put(st, &old, NULL, NULL, NULL), AR_OK);
    store_close(st);
    /* back to version 1 as it was: the column did not exist */
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
                                  "DROP TABLE shop_profiles;"
                                  "DROP TABLE review_audit;"
                                  "DROP INDEX replies_by_created;"
                                  "DROP INDEX replies_by_status;"
                                  "ALTER TABLE replies DROP COLUMN status;"
                                  "ALTER TABLE replies DROP COLUMN updated_s;"
                                  "DROP TABLE reply_claims;"
                                  "DROP INDEX jobs_by_owner;"
                                  "DROP INDEX jobs_to_notify;"
                                  "ALTER TABLE jobs DROP COLUMN owner;"
                                  "ALTER TABLE jobs DROP COLUMN bytes;"
                                  "ALTER TABLE jobs DROP COLUMN callback_url;"
                                  "ALTER TABLE jobs DROP COLUMN notified;"
                                  "ALTER TABLE jobs DROP COLUMN published;"
                                  "PRAGMA user_version = 1;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);

    st = open_store(f->url);
    assert_int_equal(pragma_int(f->path, "PRAGMA user_version", NULL, 0), STORE_SCHEMA_VERSION);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_false(info.published);
    assert_int_equal(info.n_total, 5);
    /* the columns of version 4: no owner, the size computed from the stored lines */
    assert_string_equal(info.owner, "");
    assert_int_equal(info.bytes, job_lines_bytes());
    assert_string_equal(info.callback_url, "");
    assert_int_equal(store_job_set_published(st, id, NULL), AR_OK);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(info.published);
    /* version 5: a reply from before reads as pending, last changed when it was made */
    assert_int_equal(store_reply_get(st, "s1", "r-old", &got, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(got.status, STORE_REVIEW_PENDING);
    assert_int_equal(got.updated_s, old.created_s);
    store_reply_fini(&got);
    store_close(st);
}

/* ---- owners, lists, quotas, cancel, delete, notices ---------------------------------------- */

struct listed {
    int n;
    char ids[16][STORE_JOB_ID_LEN + 1];
    int64_t seqs[16];
    char owners[16][STORE_ID_MAX + 1];
};

static bool collect_job(const struct store_job_info *info, void *user)
{
    struct listed *l = user;
    assert_true(l->n < 16);
    snprintf(l->ids[l->n], sizeof(l->ids[0]), "%s", info->id);
    snprintf(l->owners[l->n], sizeof(l->owners[0]), "%s", info->owner);
    l->seqs[l->n++] = info->seq;
    return true;
}

/* Jobs keep their owner, size and callback; an owner's list holds only its jobs, newest first,
 * and pages on by seq. */
static void jobs_belong_to_owners_and_list_newest_first(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char a1[STORE_JOB_ID_LEN + 1], a2[STORE_JOB_ID_LEN + 1], a3[STORE_JOB_ID_LEN + 1];
    char b1[STORE_JOB_ID_LEN + 1], old[STORE_JOB_ID_LEN + 1];
    struct store_job_info info;
    struct listed l = {0};
    bool found = false;

    make_owned_job(st, "key:0", NULL, a1);
    make_owned_job(st, "key:1", "http://127.0.0.1:9/hook", b1);
    make_owned_job(st, "key:0", NULL, a2);
    make_job(st, old); /* no owner: "" */
    make_owned_job(st, "key:0", "http://127.0.0.1:9/x?y=1", a3);

    assert_int_equal(store_job_get(st, b1, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(info.owner, "key:1");
    assert_string_equal(info.callback_url, "http://127.0.0.1:9/hook");
    assert_int_equal(info.bytes, job_lines_bytes());
    assert_false(info.notified);
    assert_true(info.seq > 0);

    /* a page of two, then the rest */
    assert_int_equal(store_jobs_list(st, "key:0", 0, 2, collect_job, &l, NULL), AR_OK);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.ids[0], a3);
    assert_string_equal(l.ids[1], a2);
    assert_true(l.seqs[0] > l.seqs[1]);
    {
        int64_t before = l.seqs[1];
        memset(&l, 0, sizeof(l));
        assert_int_equal(store_jobs_list(st, "key:0", before, 2, collect_job, &l, NULL), AR_OK);
        assert_int_equal(l.n, 1);
        assert_string_equal(l.ids[0], a1);
        assert_true(l.seqs[0] < before);
    }
    memset(&l, 0, sizeof(l));
    assert_int_equal(store_jobs_list(st, "key:1", 0, 10, collect_job, &l, NULL), AR_OK);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.ids[0], b1);
    memset(&l, 0, sizeof(l));
    assert_int_equal(store_jobs_list(st, "", 0, 10, collect_job, &l, NULL), AR_OK);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.ids[0], old);
    memset(&l, 0, sizeof(l));
    assert_int_equal(store_jobs_list(st, "nobody", 0, 10, collect_job, &l, NULL), AR_OK);
    assert_int_equal(l.n, 0);

    /* bad arguments */
    assert_int_equal(store_jobs_list(st, "key:0", 0, 0, collect_job, &l, NULL), AR_EINVAL);
    assert_int_equal(store_jobs_list(st, "key:0", -1, 5, collect_job, &l, NULL), AR_EINVAL);
    {
        struct store_item_in in = {1, "{}"};
        struct store_job_spec spec = {"s", "o", "http://x/"};
        char id[STORE_JOB_ID_LEN + 1], longer[STORE_URL_MAX + 2];
        memset(longer, 'a', sizeof(longer) - 1);
        longer[sizeof(longer) - 1] = '\0';
        spec.callback_url = longer;
        assert_int_equal(store_job_create_spec(st, &spec, &in, 1, id, NULL), AR_EINVAL);
    }
    store_close(st);
}

static void usage_is(struct store *st, const char *owner, int64_t open_jobs, int64_t bytes)
{
    int64_t o = -1, b = -1;
    assert_int_equal(store_job_usage(st, owner, &o, &b, NULL), AR_OK);
    if (o != open_jobs || b != bytes)
        fail_msg("%s: %lld open jobs and %lld bytes, want %lld and %lld", owner, (long long)o,
                 (long long)b, (long long)open_jobs, (long long)bytes);
}

/* Usage counts open jobs and all bytes; cancelling keeps finished lines and stops the job's
 * progress; deleting frees the bytes and the lines; a done job's notice is claimed once. */
static void usage_cancel_delete_and_notices(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url), *st2 = open_store(f->url);
    char j1[STORE_JOB_ID_LEN + 1], j2[STORE_JOB_ID_LEN + 1], j3[STORE_JOB_ID_LEN + 1];
    const int64_t b = job_lines_bytes();
    struct store_job_info info;
    struct collected col = {0};
    bool found = false, ok = false, ok2 = false;

    usage_is(st, "key:0", 0, 0);
    make_owned_job(st, "key:0", NULL, j1);
    make_owned_job(st, "key:0", "http://127.0.0.1:9/done", j2);
    make_owned_job(st, "key:1", NULL, j3);
    usage_is(st, "key:0", 2, 2 * b);
    usage_is(st, "key:1", 1, b);

    /* j1: one line finished, then cancelled */
    assert_int_equal(store_job_item_done(st, j1, 1, "{\"r\":1}", NULL), AR_OK);
    assert_int_equal(store_job_cancel(st, j1, &ok, NULL), AR_OK);
    assert_true(ok);
    assert_int_equal(store_job_cancel(st, j1, &ok, NULL), AR_OK);
    assert_false(ok); /* not open any more */
    usage_is(st, "key:0", 1, 2 * b);
    /* a line that was being answered may still finish; the job stays cancelled */
    assert_int_equal(store_job_item_done(st, j1, 2, "{\"r\":2}", NULL), AR_OK);
    assert_int_equal(store_job_get(st, j1, &info, &found, NULL), AR_OK);
    assert_int_equal(info.status, STORE_JOB_CANCELLED);
    assert_int_equal(info.n_done, 2);
    assert_int_equal(store_job_results(st, j1, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, 5);
    assert_int_equal(col.status[0], STORE_ITEM_DONE);
    assert_int_equal(col.status[2], STORE_ITEM_PENDING);
    /* a cancelled job is no longer unfinished */
    {
        struct listed l = {0};
        assert_int_equal(store_jobs_unfinished(st, collect_job, &l, NULL), AR_OK);
        for (int i = 0; i < l.n; i++)
            assert_string_not_equal(l.ids[i], j1);
    }

    /* deleting frees its bytes and lines; a second delete finds nothing */
    assert_int_equal(store_job_delete(st, j1, &found, NULL), AR_OK);
    assert_true(found);
    usage_is(st, "key:0", 1, b);
    assert_int_equal(store_job_get(st, j1, &info, &found, NULL), AR_OK);
    assert_false(found);
    assert_int_equal(store_job_results(st, j1, collect_item, &col, NULL), AR_EINVAL);
    {
        struct store_item it;
        assert_int_equal(store_job_item_get(st, j1, 1, &it, &found, NULL), AR_OK);
        assert_false(found);
    }
    assert_int_equal(store_job_delete(st, j1, &found, NULL), AR_OK);
    assert_false(found);
    assert_int_equal(store_job_cancel(st, j1, &ok, NULL), AR_OK);
    assert_false(ok);

    /* notices: none before the job is done, none without a callback, then exactly one */
    assert_int_equal(store_job_claim_notify(st, j2, &ok, NULL), AR_OK);
    assert_false(ok);
    for (int i = 0; i < 5; i++)
        assert_int_equal(store_job_item_done(st, j2, job_line_numbers[i], "{}", NULL), AR_OK);
    assert_int_equal(store_job_claim_notify(st, j3, &ok, NULL), AR_OK);
    assert_false(ok);
    {
        /* what a sweeper finds: done, with a callback, not claimed */
        struct listed l = {0};
        assert_int_equal(store_jobs_unnotified(st, collect_job, &l, NULL), AR_OK);
        assert_int_equal(l.n, 1);
        assert_string_equal(l.ids[0], j2);
    }
    assert_int_equal(store_job_claim_notify(st, j2, &ok, NULL), AR_OK);
    assert_int_equal(store_job_claim_notify(st2, j2, &ok2, NULL), AR_OK);
    assert_true(ok);
    assert_false(ok2);
    assert_int_equal(store_job_get(st2, j2, &info, &found, NULL), AR_OK);
    assert_true(info.notified);
    assert_int_equal(info.status, STORE_JOB_DONE);
    {
        struct listed l = {0};
        assert_int_equal(store_jobs_unnotified(st, collect_job, &l, NULL), AR_OK);
        assert_int_equal(l.n, 0);
    }
    usage_is(st, "key:0", 0, b); /* done: not open, still stored */
    store_close(st2);
    store_close(st);
}

/* Pages of results: the lines after a line, at most a limit, in line order. */
static void results_come_in_pages(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char id[STORE_JOB_ID_LEN + 1];
    struct collected col = {0};
    make_job(st, id); /* lines 1, 2, 4, 7, 9 */
    assert_int_equal(store_job_item_done(st, id, 4, "{\"four\":4}", NULL), AR_OK);
    assert_int_equal(store_job_results_page(st, id, 2, 2, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, 2);
    assert_int_equal(col.lines[0], 4);
    assert_int_equal(col.lines[1], 7);
    assert_int_equal(col.status[0], STORE_ITEM_DONE);
    assert_string_equal(col.result[0], "{\"four\":4}");
    assert_string_equal(col.input[1], job_lines[3]);
    memset(&col, 0, sizeof(col));
    assert_int_equal(store_job_results_page(st, id, 7, 0, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, 1);
    assert_int_equal(col.lines[0], 9);
    memset(&col, 0, sizeof(col));
    assert_int_equal(store_job_results_page(st, id, 0, 1, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, 1);
    assert_int_equal(col.lines[0], 1);
    memset(&col, 0, sizeof(col));
    assert_int_equal(store_job_results_page(st, id, 9, 5, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, 0);
    assert_int_equal(store_job_results_page(st, id, -1, 5, collect_item, &col, NULL), AR_EINVAL);
    assert_int_equal(store_job_results_page(st, "0123456789abcdef0123456789abcdef", 0, 5,
                                            collect_item, &col, NULL),
                     AR_EINVAL);
    store_close(st);
}

/* A database of PostgreSQL schema version 1 (jobs without owners) is migrated at open: its
 * jobs have no owner and their size computed from the stored lines. */
static void pg_version_one_database_is_migrated(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    char id[STORE_JOB_ID_LEN + 1];
    struct store_job_info info;
    bool found = false;
    struct store_reply old = sample_reply("s1", "r-old", "旧的回复"), got;
    make_job(st, id);
    old.status = STORE_REVIEW_SENT; /* version 1 kept no status: it reads as pending */
    assert_int_equal(store_reply_put(st, &old, NULL, NULL, NULL), AR_OK);
    store_close(st);
    assert_int_equal(th_pg_scalar(&f->db, "DROP TABLE shop_profiles; DROP TABLE review_audit;"
                                          "DROP INDEX replies_by_created;"
                                          "DROP INDEX replies_by_status;"
                                          "ALTER TABLE replies DROP COLUMN status,"
                                          "  DROP COLUMN updated_s;"
                                          "DROP INDEX jobs_by_owner; DROP INDEX jobs_to_notify;"
                                          "ALTER TABLE jobs DROP COLUMN owner, DROP COLUMN bytes,"
                                          "  DROP COLUMN callback_url, DROP COLUMN notified;"
                                          "DELETE FROM schema_migrations WHERE version > 1;"
                                          "SELECT 1"),
                     1);
    st = open_store(f->url);
    assert_int_equal(th_pg_scalar(&f->db, "SELECT max(version) FROM schema_migrations"),
                     STORE_PG_SCHEMA_VERSION);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(info.owner, "");
    assert_int_equal(info.bytes, job_lines_bytes());
    usage_is(st, "", 1, job_lines_bytes());
    assert_int_equal(store_reply_get(st, "s1", "r-old", &got, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(got.status, STORE_REVIEW_PENDING);
    assert_int_equal(got.updated_s, old.created_s);
    store_reply_fini(&got);
    store_close(st);
}

#define CRASH_LINES 20

/* The child: finishes lines 1-7, fails line 8, then starts a transaction that would finish
 * line 9 and dies by SIGKILL before committing it. The store handle is never closed. */
static void crash_child(const struct fixture *f, const char *id)
{
    static const char lost[] =
        "BEGIN;"
        "UPDATE job_items SET status = 'done', result = 'lost' WHERE line = 9;"
        "UPDATE jobs SET n_done = n_done + 1;";
    struct store *st = NULL;
    sqlite3 *db = NULL;
    char res[64];
    if (store_open_url(f->url, &st, NULL) != AR_OK)
        _exit(3);
    for (int line = 1; line <= 7; line++) {
        snprintf(res, sizeof(res), "{\"by\":\"child\",\"line\":%d}", line);
        if (store_job_item_done(st, id, line, res, NULL) != AR_OK)
            _exit(4);
    }
    if (store_job_item_error(st, id, 8, "bad input", NULL) != AR_OK)
        _exit(5);
    if (f->pg) {
        PGconn *c = PQconnectdb(f->url);
        PGresult *r = PQexec(c, lost);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            _exit(6);
        kill(getpid(), SIGKILL);
    }
    if (sqlite3_open(f->path, &db) != SQLITE_OK)
        _exit(6);
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_exec(db, lost, NULL, NULL, NULL) != SQLITE_OK)
        _exit(7);
    kill(getpid(), SIGKILL);
    _exit(8); /* not reached */
}

static void kill_mid_job_then_resume_finishes_each_line_once(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_item_in in[CRASH_LINES];
    char inputs[CRASH_LINES][64];
    char id[STORE_JOB_ID_LEN + 1];
    struct store_job_info info;
    struct store_item *items;
    struct collected col = {0};
    size_t n;
    bool found;
    pid_t pid;
    int wstatus = 0;

    for (int i = 0; i < CRASH_LINES; i++) {
        snprintf(inputs[i], sizeof(inputs[i]), "{\"review_id\":\"c%d\",\"rating\":4}", i + 1);
        in[i].line = i + 1;
        in[i].input = inputs[i];
    }
    assert_int_equal(store_job_create(st, "shop-crash", in, CRASH_LINES, id, NULL), AR_OK);
    store_close(st); /* the child opens its own connection */

    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        crash_child(f, id);
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    assert_true(WIFSIGNALED(wstatus));
    assert_int_equal(WTERMSIG(wstatus), SIGKILL);

    /* restart: the job is unfinished, with exactly the committed progress */
    st = open_store(f->url);
    assert_int_equal(store_jobs_unfinished(st, count_job, &col, NULL), AR_OK);
    assert_int_equal(col.n, 1);
    assert_string_equal(col.input[0], id);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.status, STORE_JOB_RUNNING);
    assert_int_equal(info.n_done, 7);
    assert_int_equal(info.n_failed, 1);

    /* resume in pages of 5, as a worker would */
    int64_t after = 0;
    int resumed = 0;
    for (;;) {
        assert_int_equal(store_job_next_pending(st, id, after, 5, &items, &n, NULL), AR_OK);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++) {
            char res[64];
            assert_true(items[i].line >= 9);
            assert_string_equal(items[i].input, inputs[items[i].line - 1]);
            snprintf(res, sizeof(res), "{\"by\":\"parent\",\"line\":%lld}",
                     (long long)items[i].line);
            assert_int_equal(store_job_item_done(st, id, items[i].line, res, NULL), AR_OK);
            after = items[i].line;
            resumed++;
        }
        store_items_free(items, n);
    }
    assert_int_equal(resumed, CRASH_LINES - 8);
    /* re-finishing a line the child finished is refused */
    assert_int_equal(store_job_item_done(st, id, 3, "{}", NULL), AR_EINVAL);

    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.status, STORE_JOB_DONE);
    assert_int_equal(info.n_done, CRASH_LINES - 1);
    assert_int_equal(info.n_failed, 1);
    assert_int_equal(info.n_done + info.n_failed, info.n_total);

    memset(&col, 0, sizeof(col));
    assert_int_equal(store_job_results(st, id, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, CRASH_LINES);
    for (int i = 0; i < CRASH_LINES; i++) {
        char want[64];
        int line = i + 1;
        assert_int_equal(col.lines[i], line);
        if (line == 8) {
            assert_int_equal(col.status[i], STORE_ITEM_ERROR);
            assert_string_equal(col.result[i], "bad input");
            continue;
        }
        assert_int_equal(col.status[i], STORE_ITEM_DONE);
        snprintf(want, sizeof(want), "{\"by\":\"%s\",\"line\":%d}", line <= 7 ? "child" : "parent",
                 line);
        assert_string_equal(col.result[i], want);
    }
    assert_int_equal(store_jobs_unfinished(st, count_job, &(struct collected){0}, NULL), AR_OK);
    store_close(st);
}

/* ---- threads ------------------------------------------------------------------------ */

#define N_THREADS 4
#define N_PUTS 40

struct put_worker {
    struct store *st;
    int index;
    int n_new;
    int n_fail;
};

static void *put_worker_run(void *arg)
{
    struct put_worker *w = arg;
    char review[32];
    for (int i = 0; i < N_PUTS; i++) {
        /* even i: a key every thread writes; odd i: this thread's own key */
        struct store_reply r = sample_reply("shop-t", review, "thanks");
        bool existed = true;
        if (i % 2 == 0)
            snprintf(review, sizeof(review), "shared-%d", i);
        else
            snprintf(review, sizeof(review), "own-%d-%d", w->index, i);
        if (store_reply_put(w->st, &r, NULL, &existed, NULL) != AR_OK)
            w->n_fail++;
        else if (!existed)
            w->n_new++;
    }
    return NULL;
}

static void threads_sharing_handles_insert_each_key_once(void **state)
{
    struct fixture *f = *state;
    struct store *st[2] = {open_store(f->url), open_store(f->url)};
    struct put_worker w[N_THREADS];
    pthread_t th[N_THREADS];
    int n_new = 0;
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (struct put_worker){st[i % 2], i, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, put_worker_run, &w[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].n_fail, 0);
        n_new += w[i].n_new;
    }
    /* N_PUTS/2 shared keys once, plus every thread's own keys */
    assert_int_equal(n_new, N_PUTS / 2 + N_THREADS * (N_PUTS / 2));
    store_close(st[0]);
    store_close(st[1]);
}

/* A job of more lines than one insert takes, with inputs that need quoting anywhere (quotes,
 * backslashes, braces, commas, the word NULL, an empty line), reads back byte for byte. */
static void large_job_with_awkward_inputs_reads_back_exactly(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    enum { N = 1234 };
    static const char *const awkward[] = {
        "{\"text\":\"say \\\"hi\\\" \\\\ there\"}",
        "NULL",
        "",
        "a,b,{c},\"d\"",
        "  spaced  ",
        "\\",
        "\"",
        "物流很快，\t包装完好\n第二行",
        "{}",
        "null",
    };
    struct store_item_in *in = calloc(N, sizeof(*in));
    char(*inputs)[96] = calloc(N, sizeof(*inputs));
    char id[STORE_JOB_ID_LEN + 1];
    struct store_item *items = NULL;
    struct collected col = {0};
    struct store_job_info info;
    size_t n = 0;
    bool found = false;
    assert_non_null(in);
    assert_non_null(inputs);
    for (int i = 0; i < N; i++) {
        snprintf(inputs[i], sizeof(inputs[i]), "%s#%d", awkward[i % 10], i);
        if (i % 10 == 2)
            inputs[i][0] = '\0'; /* an empty input */
        in[i].line = 3 * i + 1;
        in[i].input = inputs[i];
    }
    assert_int_equal(store_job_create(st, "shop-big", in, N, id, NULL), AR_OK);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.n_total, N);
    for (int64_t after = 0, k = 0;;) {
        assert_int_equal(store_job_next_pending(st, id, after, 300, &items, &n, NULL), AR_OK);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++, k++) {
            assert_int_equal(items[i].line, 3 * k + 1);
            assert_string_equal(items[i].input, inputs[k]);
            after = items[i].line;
        }
        store_items_free(items, n);
    }
    assert_int_equal(store_job_item_done(st, id, 3 * 700 + 1, inputs[5], NULL), AR_OK);
    col.stop_after = 0;
    assert_int_equal(store_job_results(st, id, collect_item, &col, NULL), AR_OK);
    assert_int_equal(col.n, N);
    assert_int_equal(col.lines[63], 3 * 63 + 1);
    {
        struct store_item it;
        assert_int_equal(store_job_item_get(st, id, 3 * 700 + 1, &it, &found, NULL), AR_OK);
        assert_true(found);
        assert_string_equal(it.input, inputs[700]);
        assert_string_equal(it.result, inputs[5]);
        store_item_fini(&it);
    }
    free(in);
    free(inputs);
    store_close(st);
}

/* ---- claims --------------------------------------------------------------------------- */

static void claims_are_owned_held_renewed_and_ended(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply r = sample_reply("shop-c", "r-1", "谢谢惠顾");
    struct store_reply row;
    enum store_claim c = STORE_CLAIM_STORED;
    struct ar_err err = {0};

    assert_int_equal(store_reply_claim(st, "shop-c", "r-1", "a", 60, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    assert_null(row.storage);
    /* another owner waits; the owner itself renews */
    assert_int_equal(store_reply_claim(st, "shop-c", "r-1", "b", 60, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_HELD);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-1", "a", 60, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    /* a claim is per review: the same id in another shop is free */
    assert_int_equal(store_reply_claim(st, "shop-d", "r-1", "b", 60, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    /* only the owner gives a claim up */
    assert_int_equal(store_reply_unclaim(st, "shop-c", "r-1", "b", NULL), AR_OK);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-1", "b", 60, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_HELD);
    assert_int_equal(store_reply_unclaim(st, "shop-c", "r-1", "a", NULL), AR_OK);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-1", "b", 60, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    /* the put ends b's claim; from then on everyone reads the stored row */
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(store_reply_claim(st, "shop-c", "r-1", i ? "b" : "z", 60, &c, &row, NULL),
                         AR_OK);
        assert_int_equal(c, STORE_CLAIM_STORED);
        assert_string_equal(row.reply, "谢谢惠顾");
        assert_string_equal(row.text, r.text);
        assert_int_equal(row.created_s, 1700000000);
        store_reply_fini(&row);
    }
    /* unclaiming with no claim left is fine */
    assert_int_equal(store_reply_unclaim(st, "shop-c", "r-1", "b", NULL), AR_OK);

    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "", 60, &c, &row, &err), AR_EINVAL);
    assert_non_null(strstr(err.msg, "owner"));
    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "a", 0, &c, &row, NULL), AR_EINVAL);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "a", -1, &c, &row, NULL), AR_EINVAL);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "a", NAN, &c, &row, NULL), AR_EINVAL);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "a", 1e9, &c, &row, NULL), AR_EINVAL);
    assert_int_equal(store_reply_claim(st, "", "r-2", "a", 1, &c, &row, NULL), AR_EINVAL);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "a", 1, NULL, &row, NULL), AR_EINVAL);
    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "a", 1, &c, NULL, NULL), AR_EINVAL);
    assert_int_equal(store_reply_unclaim(st, "shop-c", "r-2", NULL, NULL), AR_EINVAL);
    assert_int_equal(store_reply_unclaim(NULL, "shop-c", "r-2", "a", NULL), AR_EINVAL);
    /* none of the refused claims holds r-2 */
    assert_int_equal(store_reply_claim(st, "shop-c", "r-2", "q", 60, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    store_close(st);
}

/* A restarted instance ends the claims of its previous run by owner prefix, and no others. */
static void claims_are_released_by_owner_prefix(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    static const char *const owners[] = {"host/p1/1", "host/p1/2", "host/p2/9", "hostx/p1/1",
                                         "other/host/1"};
    struct store_reply row;
    enum store_claim c;
    int64_t n = -1;
    char review[16];
    for (int i = 0; i < 5; i++) {
        snprintf(review, sizeof(review), "r-%d", i);
        assert_int_equal(store_reply_claim(st, "shop-p", review, owners[i], 600, &c, &row, NULL),
                         AR_OK);
        assert_int_equal(c, STORE_CLAIM_OWNED);
    }
    assert_int_equal(store_reply_claims_release(st, "host/", &n, NULL), AR_OK);
    assert_int_equal(n, 3);
    for (int i = 0; i < 5; i++) {
        snprintf(review, sizeof(review), "r-%d", i);
        assert_int_equal(store_reply_claim(st, "shop-p", review, "new", 600, &c, &row, NULL),
                         AR_OK);
        assert_int_equal(c, i < 3 ? STORE_CLAIM_OWNED : STORE_CLAIM_HELD);
    }
    /* a prefix with LIKE's wildcards means just those characters */
    assert_int_equal(store_reply_claims_release(st, "h%", &n, NULL), AR_OK);
    assert_int_equal(n, 0);
    assert_int_equal(store_reply_claims_release(st, "", &n, NULL), AR_EINVAL);
    assert_int_equal(store_reply_claims_release(NULL, "host/", &n, NULL), AR_EINVAL);
    store_close(st);
}

/* An owner that died (never puts, never unclaims) holds the review only for its lease. */
static void an_expired_lease_is_taken_over(void **state)
{
    struct fixture *f = *state;
    struct store *a = open_store(f->url), *b = open_store(f->url);
    struct store_reply row;
    enum store_claim c = STORE_CLAIM_STORED;
    double t0;
    assert_int_equal(store_reply_claim(a, "shop-l", "r-1", "dead", 0.2, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    t0 = now_s();
    assert_int_equal(store_reply_claim(b, "shop-l", "r-1", "next", 30, &c, &row, NULL), AR_OK);
    if (now_s() - t0 < 0.15) /* asked well within the lease */
        assert_int_equal(c, STORE_CLAIM_HELD);
    sleep_ms(300);
    assert_int_equal(store_reply_claim(b, "shop-l", "r-1", "next", 30, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    /* now the new owner's live lease holds the first one off */
    assert_int_equal(store_reply_claim(a, "shop-l", "r-1", "dead", 0.2, &c, &row, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_HELD);
    store_close(a);
    store_close(b);
}

#define RACE_THREADS 8

struct racer {
    struct store *st;
    pthread_barrier_t *go;
    char owner[32];
    int n_owned, n_held;
    enum ar_status fail;
    char reply[128]; /* what the thread ends up answering */
};

/* What an instance does for one review: claim; generate (sleep) and put when owned; poll while
 * held; answer from the stored row. */
static void *race_run(void *arg)
{
    struct racer *w = arg;
    pthread_barrier_wait(w->go);
    for (int tries = 0; tries < 1000; tries++) {
        struct store_reply row;
        enum store_claim c;
        enum ar_status s =
            store_reply_claim(w->st, "shop-race", "r-42", w->owner, 30, &c, &row, NULL);
        if (s != AR_OK) {
            w->fail = s;
            return NULL;
        }
        if (c == STORE_CLAIM_STORED) {
            snprintf(w->reply, sizeof(w->reply), "%s", row.reply);
            store_reply_fini(&row);
            return NULL;
        }
        if (c == STORE_CLAIM_OWNED) {
            char text[64];
            struct store_reply r, out;
            w->n_owned++;
            sleep_ms(50); /* the generation */
            snprintf(text, sizeof(text), "reply by %s", w->owner);
            r = sample_reply("shop-race", "r-42", text);
            if ((s = store_reply_put(w->st, &r, &out, NULL, NULL)) != AR_OK) {
                w->fail = s;
                return NULL;
            }
            snprintf(w->reply, sizeof(w->reply), "%s", out.reply);
            store_reply_fini(&out);
            return NULL;
        }
        w->n_held++;
        sleep_ms(10);
    }
    w->fail = AR_EBUSY;
    return NULL;
}

/* Two handles ("instances"), eight threads at once on one new review: one generation, and
 * every thread answers the one stored reply. */
static void two_instances_racing_on_a_review_generate_once(void **state)
{
    struct fixture *f = *state;
    struct store *st[2] = {open_store(f->url), open_store(f->url)};
    struct racer w[RACE_THREADS];
    pthread_t th[RACE_THREADS];
    pthread_barrier_t go;
    struct store_reply row;
    bool found = false;
    int owned = 0, held = 0;
    pthread_barrier_init(&go, NULL, RACE_THREADS);
    for (int i = 0; i < RACE_THREADS; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].st = st[i % 2];
        w[i].go = &go;
        snprintf(w[i].owner, sizeof(w[i].owner), "inst%d-thread%d", i % 2, i);
        assert_int_equal(pthread_create(&th[i], NULL, race_run, &w[i]), 0);
    }
    for (int i = 0; i < RACE_THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(store_reply_get(st[0], "shop-race", "r-42", &row, &found, NULL), AR_OK);
    assert_true(found);
    for (int i = 0; i < RACE_THREADS; i++) {
        assert_int_equal(w[i].fail, AR_OK);
        owned += w[i].n_owned;
        held += w[i].n_held;
        assert_string_equal(w[i].reply, row.reply);
        if (w[i].n_owned) {
            char want[64];
            snprintf(want, sizeof(want), "reply by %s", w[i].owner);
            assert_string_equal(row.reply, want); /* the owner's generation is the one stored */
        }
    }
    assert_int_equal(owned, 1);
    assert_true(held >= 1); /* someone did wait for the owner */
    store_reply_fini(&row);
    store_close(st[0]);
    store_close(st[1]);
}

struct finisher {
    struct store *st;
    pthread_barrier_t *go;
    const char *job_id;
    int n_ok, n_refused;
    enum ar_status other;
};

static void *finish_run(void *arg)
{
    struct finisher *w = arg;
    pthread_barrier_wait(w->go);
    for (int i = 0; i < 5; i++) {
        enum ar_status s = store_job_item_done(w->st, w->job_id, job_line_numbers[i], "{}", NULL);
        if (s == AR_OK)
            w->n_ok++;
        else if (s == AR_EINVAL)
            w->n_refused++;
        else
            w->other = s;
    }
    return NULL;
}

/* Every line finished by two instances at once (two threads on each) is counted once. */
static void item_done_twice_across_handles_counts_once(void **state)
{
    struct fixture *f = *state;
    struct store *st[2] = {open_store(f->url), open_store(f->url)};
    char id[STORE_JOB_ID_LEN + 1];
    struct finisher w[4];
    pthread_t th[4];
    pthread_barrier_t go;
    struct store_job_info info;
    bool found = false;
    int ok = 0, refused = 0;
    make_job(st[0], id);
    pthread_barrier_init(&go, NULL, 4);
    for (int i = 0; i < 4; i++) {
        w[i] = (struct finisher){st[i % 2], &go, id, 0, 0, AR_OK};
        assert_int_equal(pthread_create(&th[i], NULL, finish_run, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].other, AR_OK);
        ok += w[i].n_ok;
        refused += w[i].n_refused;
    }
    pthread_barrier_destroy(&go);
    assert_int_equal(ok, 5);
    assert_int_equal(refused, 15);
    assert_int_equal(store_job_get(st[1], id, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(info.n_done, 5);
    assert_int_equal(info.n_failed, 0);
    assert_int_equal(info.status, STORE_JOB_DONE);
    store_close(st[0]);
    store_close(st[1]);
}

/* ---- PostgreSQL only -------------------------------------------------------------------- */

struct opener {
    const char *url;
    pthread_barrier_t *go;
    enum ar_status s;
    char msg[256];
    struct store *st;
};

static void *open_run(void *arg)
{
    struct opener *o = arg;
    struct ar_err err = {0};
    pthread_barrier_wait(o->go);
    o->s = store_open_url(o->url, &o->st, &err);
    snprintf(o->msg, sizeof(o->msg), "%s", err.msg);
    return NULL;
}

/* Four instances starting at once on an empty database: all open, the schema is made once. */
static void concurrent_opens_migrate_once(void **state)
{
    struct fixture *f = *state;
    struct opener o[4];
    pthread_t th[4];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 4);
    for (int i = 0; i < 4; i++) {
        o[i] = (struct opener){f->url, &go, AR_EIO, "", NULL};
        assert_int_equal(pthread_create(&th[i], NULL, open_run, &o[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 4; i++) {
        if (o[i].s != AR_OK)
            fail_msg("open %d: %s: %s", i, ar_status_str(o[i].s), o[i].msg);
    }
    assert_int_equal(th_pg_scalar(&f->db, "SELECT count(*) FROM schema_migrations"),
                     STORE_PG_SCHEMA_VERSION);
    assert_int_equal(th_pg_scalar(&f->db, "SELECT count(DISTINCT version) FROM schema_migrations"),
                     STORE_PG_SCHEMA_VERSION);
    assert_int_equal(th_pg_scalar(&f->db, "SELECT count(*) FROM pg_tables WHERE tablename IN "
                                          "('replies', 'reply_claims', 'jobs', 'job_items')"),
                     4);
    /* and they work together */
    {
        struct store_reply r = sample_reply("shop-m", "r-1", "ok"), out;
        bool existed = true;
        assert_int_equal(store_reply_put(o[0].st, &r, NULL, &existed, NULL), AR_OK);
        assert_false(existed);
        assert_int_equal(store_reply_put(o[3].st, &r, &out, &existed, NULL), AR_OK);
        assert_true(existed);
        assert_string_equal(out.reply, "ok");
        store_reply_fini(&out);
    }
    for (int i = 0; i < 4; i++)
        store_close(o[i].st);
}

static void pg_newer_schema_and_bad_urls_are_refused(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct ar_err err = {0};
    char url[600];
    double t0;
    store_close(st);
    st = NULL;
    assert_int_equal(th_pg_admin(f->db.url, "INSERT INTO schema_migrations (version) VALUES (99)"),
                     0);
    assert_int_equal(store_open_url(f->url, &st, &err), AR_EFORMAT);
    assert_null(st);
    assert_non_null(strstr(err.msg, "99"));

    /* a URL libpq cannot parse */
    assert_int_equal(store_open_url("postgres://[bad", &st, &err), AR_EINVAL);
    assert_null(st);
    assert_true(strlen(err.msg) > 0);
    /* nobody listening: unavailable, at once */
    assert_int_equal(
        th_pg_url_with(url, sizeof(url), "postgres://postgres@127.0.0.1:1/x", "x", NULL), 0);
    t0 = now_s();
    assert_int_equal(store_open_url(url, &st, &err), AR_EUNAVAIL);
    assert_true(now_s() - t0 < STORE_PG_CONNECT_TIMEOUT_S + 1.0);
    assert_null(st);
    assert_int_equal(store_open_url(NULL, &st, NULL), AR_EINVAL);
    assert_int_equal(store_open_url("", &st, NULL), AR_EINVAL);
}

struct blocked {
    struct store *st;
    const char *job_id;
    enum ar_status s;
    double took_s;
    atomic_bool done;
};

static void *blocked_run(void *arg)
{
    struct blocked *b = arg;
    double t0 = now_s();
    b->s = store_job_item_done(b->st, b->job_id, 1, "{\"late\":true}", NULL);
    b->took_s = now_s() - t0;
    atomic_store(&b->done, true);
    return NULL;
}

/* A row lock held from outside the store (another instance's transaction) keeps one call
 * waiting: other calls on the same handle go on meanwhile (a pool, not one lock), and the
 * waiting one ends within the lock timeout. */
static void pooled_calls_run_in_parallel_and_waits_are_bounded(void **state)
{
    struct fixture *f = *state;
    char url[600], id[STORE_JOB_ID_LEN + 1], sql[160];
    struct store *st;
    struct blocked b;
    pthread_t th;
    PGconn *holder;
    PGresult *r;
    struct store_job_info info;
    bool found = false;
    double t0;

    /* a lock timeout of 1.5 s from the URL's options, which the store keeps */
    assert_int_equal(
        th_pg_url_with(url, sizeof(url), f->db.url, f->db.name, "options=-c%20lock_timeout%3D1500"),
        0);
    st = open_store(url);
    make_job(st, id);
    holder = PQconnectdb(f->db.url);
    assert_int_equal(PQstatus(holder), CONNECTION_OK);
    snprintf(sql, sizeof(sql),
             "BEGIN; SELECT 1 FROM job_items WHERE job_id = '%s' AND line = 1 FOR UPDATE", id);
    r = PQexec(holder, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);

    memset(&b, 0, sizeof(b));
    b.st = st;
    b.job_id = id;
    assert_int_equal(pthread_create(&th, NULL, blocked_run, &b), 0);
    sleep_ms(200); /* it is waiting for the row now */
    t0 = now_s();
    for (int i = 0; i < 20; i++) {
        assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
        assert_true(found);
        assert_int_equal(store_job_item_done(st, id, 2, "{}", NULL) == AR_OK, i == 0);
    }
    /* twenty calls while one waits on the lock: done long before it gives up */
    assert_true(now_s() - t0 < 1.0);
    assert_false(atomic_load(&b.done));
    pthread_join(th, NULL);
    /* the waiting call gave up after the lock timeout, changing nothing */
    assert_int_equal(b.s, AR_EBUSY);
    assert_true(b.took_s > 1.2 && b.took_s < 4.0);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.n_done, 1);

    /* once the lock is gone the same call goes through */
    memset(&b, 0, sizeof(b));
    b.st = st;
    b.job_id = id;
    assert_int_equal(pthread_create(&th, NULL, blocked_run, &b), 0);
    sleep_ms(200);
    r = PQexec(holder, "COMMIT");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    pthread_join(th, NULL);
    assert_int_equal(b.s, AR_OK);
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.n_done, 2);
    PQfinish(holder);
    store_close(st);
}

/* The server drops every connection of the handle (as a restart does between two calls): the
 * next calls find their pooled connections gone and succeed on new ones, with no error. */
static void dropped_connections_are_replaced_without_an_error(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply r = sample_reply("shop-x", "r-1", "谢谢"), out;
    char id[STORE_JOB_ID_LEN + 1], sql[256];
    struct store_job_info info;
    bool found = false;
    make_job(st, id);
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
    for (int round = 0; round < 3; round++) {
        snprintf(sql, sizeof(sql),
                 "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                 "WHERE datname = '%s' AND pid <> pg_backend_pid()",
                 f->db.name);
        assert_true(th_pg_scalar(&f->db, sql) >= 1);
        sleep_ms(100); /* the backends are gone */
        assert_int_equal(store_reply_get(st, "shop-x", "r-1", &out, &found, NULL), AR_OK);
        assert_true(found);
        assert_string_equal(out.reply, "谢谢");
        store_reply_fini(&out);
        assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
        assert_true(found);
        assert_int_equal(store_job_item_done(st, id, job_line_numbers[round], "{}", NULL), AR_OK);
    }
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_int_equal(info.n_done, 3);
    store_close(st);
}

/* Runs deploy/services.sh with args; its stdout (the URL, for start) goes to out. What it
 * wrote to stderr is printed only when it fails, with the server logs of DIR (the third
 * word of args), so a server that did not start says why in the test's output. */
static int services(const char *args, char *out, size_t out_size)
{
    char cmd[768], err_path[] = "/tmp/ar_services_XXXXXX";
    FILE *p;
    size_t n = 0;
    int rc, fd = mkstemp(err_path);
    if (fd < 0)
        return -1;
    close(fd);
    snprintf(cmd, sizeof(cmd), "sh deploy/services.sh %s 2>%s", args, err_path);
    p = popen(cmd, "r");
    if (!p) {
        unlink(err_path);
        return -1;
    }
    if (out && out_size) {
        n = fread(out, 1, out_size - 1, p);
        out[n] = '\0';
        out[strcspn(out, "\n")] = '\0';
    } else {
        char sink[256];
        while (fread(sink, 1, sizeof(sink), p) > 0)
            ;
    }
    rc = pclose(p);
    if (rc != 0) {
        char dir[256] = "", show[1024];
        sscanf(args, "%*s %*s %255s", dir);
        snprintf(show, sizeof(show),
                 "cat %s; for f in %s/postgres.init.log %s/postgres/server.log; do "
                 "[ -f \"$f\" ] && echo \"== $f\" && tail -n 20 \"$f\"; done; true",
                 err_path, dir, dir);
        print_error("services.sh %s exited %d:\n", args, rc);
        if (system(show) != 0)
            print_error("could not show its output\n");
    }
    unlink(err_path);
    return rc;
}

static int read_int_file(const char *path)
{
    FILE *fp = fopen(path, "r");
    int v = -1;
    if (fp) {
        if (fscanf(fp, "%d", &v) != 1)
            v = -1;
        fclose(fp);
    }
    return v;
}

/* A private server, stopped under a handle: calls fail fast with AR_EUNAVAIL (never hang, never
 * crash) while it is down, and work again once it is back on the same port. */
static void stopped_server_fails_fast_then_recovers(void **state)
{
    struct fixture *f = *state;
    char dir[64], args[256], url[512], port_file[160];
    struct store *st = NULL;
    struct store_reply r = sample_reply("shop-down", "r-1", "before"), out;
    struct ar_err err = {0};
    enum store_claim c;
    bool found = false;
    double t0, worst = 0;
    int port;

    /* its own folder: the server's user must be able to reach it (services.sh opens it) */
    snprintf(dir, sizeof(dir), "/tmp/ar_pg_down_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(f->svc_dir, sizeof(f->svc_dir), "%s", dir);
    snprintf(args, sizeof(args), "start postgres %s", dir);
    assert_int_equal(services(args, url, sizeof(url)), 0);
    assert_non_null(strstr(url, "postgres://"));
    snprintf(port_file, sizeof(port_file), "%s/postgres.port", dir);
    port = read_int_file(port_file);
    assert_true(port > 0);

    st = open_store(url);
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);

    snprintf(args, sizeof(args), "stop postgres %s", dir);
    assert_int_equal(services(args, NULL, 0), 0);

    for (int i = 0; i < 10; i++) {
        char id[32];
        snprintf(id, sizeof(id), "r-%d", i);
        t0 = now_s();
        memset(&err, 0, sizeof(err));
        switch (i % 3) {
        case 0:
            assert_int_equal(store_reply_get(st, "shop-down", "r-1", &out, &found, &err),
                             AR_EUNAVAIL);
            assert_false(found);
            break;
        case 1:
            assert_int_equal(store_reply_claim(st, "shop-down", id, "me", 10, &c, &out, &err),
                             AR_EUNAVAIL);
            break;
        default:
            r.review_id = id;
            assert_int_equal(store_reply_put(st, &r, &out, NULL, &err), AR_EUNAVAIL);
            assert_null(out.storage);
            break;
        }
        assert_int_equal(err.code, AR_EUNAVAIL);
        assert_true(strlen(err.msg) > 0);
        worst = AR_MAX(worst, now_s() - t0);
        sleep_ms(50);
    }
    assert_true(worst < STORE_PG_CONNECT_TIMEOUT_S + 0.5);

    snprintf(args, sizeof(args), "start postgres %s %d", dir, port);
    assert_int_equal(services(args, url, sizeof(url)), 0);
    /* back within the longest pause between attempts (and a little) */
    {
        enum ar_status s = AR_EUNAVAIL;
        t0 = now_s();
        while (now_s() - t0 < 10 &&
               (s = store_reply_get(st, "shop-down", "r-1", &out, &found, NULL)) != AR_OK)
            sleep_ms(50);
        assert_int_equal(s, AR_OK);
        assert_true(found);
        assert_string_equal(out.reply, "before");
        store_reply_fini(&out);
    }
    r.review_id = "r-after";
    r.reply = "after";
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
    assert_int_equal(store_reply_claim(st, "shop-down", "r-new", "me", 10, &c, &out, NULL), AR_OK);
    assert_int_equal(c, STORE_CLAIM_OWNED);
    store_close(st);

    /* teardown stops the server and removes its folder */
}

/* Each test on both backends, named after the backend. */

/* ---- the review workflow ------------------------------------------------------------------ */

#define WF_N 40

/* The reviews of the listing test: shops s0..s2, ratings 1..5, sentiments across the three
 * buckets, every status, and created times with many ties (the cursor must break them). */
struct wf_row {
    char shop[8], review[16], reply[32];
    int rating;
    float sentiment;
    enum store_review_status status;
    int64_t created;
};

static void wf_rows(struct wf_row *rows)
{
    for (int i = 0; i < WF_N; i++) {
        struct wf_row *w = &rows[i];
        snprintf(w->shop, sizeof(w->shop), "s%d", i % 3);
        snprintf(w->review, sizeof(w->review), "r%02d", (i * 7) % WF_N);
        snprintf(w->reply, sizeof(w->reply), "reply %d", i);
        w->rating = 1 + i % 5;
        w->sentiment = (float)((i % 9) - 4) * 0.1f; /* -0.4 .. 0.4 */
        w->status = (enum store_review_status)(i % STORE_REVIEW_STATUS_COUNT);
        w->created = 1700000000 + i / 6; /* six reviews share each second */
    }
}

static void wf_put_rows(struct store *st, struct wf_row *rows)
{
    wf_rows(rows);
    for (int i = 0; i < WF_N; i++) {
        struct store_reply r = sample_reply(rows[i].shop, rows[i].review, rows[i].reply);
        struct store_reply out;
        r.rating = rows[i].rating;
        r.sentiment = rows[i].sentiment;
        r.status = rows[i].status;
        r.created_s = rows[i].created;
        assert_int_equal(store_reply_put(st, &r, &out, NULL, NULL), AR_OK);
        assert_int_equal(out.status, rows[i].status);
        assert_int_equal(out.updated_s, rows[i].created);
        store_reply_fini(&out);
    }
}

/* Newest first: created descending, then shop_id, then review_id descending (strcmp). */
static int wf_cmp(const void *a, const void *b)
{
    const struct wf_row *x = a, *y = b;
    int c;
    if (x->created != y->created)
        return x->created > y->created ? -1 : 1;
    if ((c = strcmp(x->shop, y->shop)) != 0)
        return -c;
    return -strcmp(x->review, y->review);
}

struct wf_page {
    int n;
    char keys[WF_N][48];
    int64_t created[WF_N];
    char shop[WF_N][8], review[WF_N][16];
};

static bool wf_collect(const struct store_reply *r, void *user)
{
    struct wf_page *p = user;
    assert_true(p->n < WF_N);
    snprintf(p->keys[p->n], sizeof(p->keys[0]), "%s/%s", r->shop_id, r->review_id);
    snprintf(p->shop[p->n], sizeof(p->shop[0]), "%s", r->shop_id);
    snprintf(p->review[p->n], sizeof(p->review[0]), "%s", r->review_id);
    p->created[p->n] = r->created_s;
    p->n++;
    return true;
}

/* Lists every review matching f in pages of `limit`, each page starting after the last row of
 * the one before; checks the concatenation against the rows filtered and sorted here. */
static void wf_check_pages(struct store *st, const struct wf_row *rows,
                           const struct store_review_filter *f, size_t limit)
{
    struct wf_row want[WF_N];
    struct wf_page all = {0};
    int n_want = 0;
    struct store_review_cursor cur = {0, NULL, NULL};
    char cur_shop[8], cur_review[16];
    for (int i = 0; i < WF_N; i++) {
        const struct wf_row *w = &rows[i];
        if (f->status >= 0 && (int)w->status != f->status)
            continue;
        if (f->shop_id && f->shop_id[0] && strcmp(f->shop_id, w->shop) != 0)
            continue;
        if (f->rating && w->rating != f->rating)
            continue;
        if (f->by_sentiment &&
            ((double)w->sentiment < f->sentiment_min || (double)w->sentiment > f->sentiment_max))
            continue;
        want[n_want++] = *w;
    }
    qsort(want, (size_t)n_want, sizeof(want[0]), wf_cmp);
    for (int pages = 0;; pages++) {
        struct wf_page page = {0};
        assert_true(pages <= WF_N);
        assert_int_equal(store_reviews_list(st, f, cur.shop_id ? &cur : NULL, limit, wf_collect,
                                            &page, NULL),
                         AR_OK);
        assert_true(page.n <= (int)limit);
        for (int i = 0; i < page.n; i++) {
            assert_true(all.n < WF_N);
            memcpy(all.keys[all.n++], page.keys[i], sizeof(page.keys[0]));
        }
        if (page.n < (int)limit)
            break;
        snprintf(cur_shop, sizeof(cur_shop), "%s", page.shop[page.n - 1]);
        snprintf(cur_review, sizeof(cur_review), "%s", page.review[page.n - 1]);
        cur.created_s = page.created[page.n - 1];
        cur.shop_id = cur_shop;
        cur.review_id = cur_review;
    }
    /* no duplicate, no gap, in order */
    assert_int_equal(all.n, n_want);
    for (int i = 0; i < n_want; i++) {
        char k[48];
        snprintf(k, sizeof(k), "%.8s/%.16s", want[i].shop, want[i].review);
        assert_string_equal(all.keys[i], k);
    }
}

static void reviews_list_by_filter_in_pages(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct wf_row rows[WF_N];
    struct store_review_filter any = {.status = -1};
    struct store_review_filter pending = {.status = STORE_REVIEW_PENDING};
    struct store_review_filter shop1 = {.status = -1, .shop_id = "s1", .rating = 0};
    struct store_review_filter stars3 = {.status = -1, .rating = 3};
    /* the pipeline's buckets: negative below -0.15, neutral to 0.15, positive above */
    struct store_review_filter neg = {.status = -1, .by_sentiment = true,
                                      .sentiment_min = -1, .sentiment_max = -0.15000001};
    struct store_review_filter neutral = {.status = -1, .by_sentiment = true,
                                          .sentiment_min = -0.15, .sentiment_max = 0.15};
    struct store_review_filter mixed = {.status = STORE_REVIEW_SENT, .shop_id = "s2",
                                        .by_sentiment = true, .sentiment_min = 0.15000001,
                                        .sentiment_max = 1};
    struct store_review_filter bad = {.status = 9};
    struct wf_page page = {0};
    wf_put_rows(st, rows);
    wf_check_pages(st, rows, &any, 7);
    wf_check_pages(st, rows, &any, 1);
    wf_check_pages(st, rows, &any, 1000);
    wf_check_pages(st, rows, &pending, 3);
    wf_check_pages(st, rows, &shop1, 4);
    wf_check_pages(st, rows, &stars3, 2);
    wf_check_pages(st, rows, &neg, 5);
    wf_check_pages(st, rows, &neutral, 5);
    wf_check_pages(st, rows, &mixed, 2);
    /* a review stored after the first page was read comes before it, never inside the next */
    {
        struct store_review_cursor cur = {rows[0].created, "s0", "r00"};
        struct store_reply r = sample_reply("s0", "new", "newest");
        r.created_s = 1800000000;
        assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
        assert_int_equal(store_reviews_list(st, NULL, &cur, 1000, wf_collect, &page, NULL),
                         AR_OK);
        for (int i = 0; i < page.n; i++)
            assert_string_not_equal(page.keys[i], "s0/new");
    }
    assert_int_equal(store_reviews_list(st, &bad, NULL, 10, wf_collect, &page, NULL), AR_EINVAL);
    assert_int_equal(store_reviews_list(st, NULL, NULL, 0, wf_collect, &page, NULL), AR_EINVAL);
    assert_int_equal(store_reviews_list(st, NULL, NULL, 1001, wf_collect, &page, NULL),
                     AR_EINVAL);
    store_close(st);
}

struct audit_log {
    int n;
    struct {
        char key[16], action[16], before[32], after[32];
        enum store_review_status from, to;
        int64_t at;
    } e[8];
};

static bool audit_collect(const struct store_audit *a, void *user)
{
    struct audit_log *l = user;
    assert_true(l->n < 8);
    snprintf(l->e[l->n].key, sizeof(l->e[0].key), "%s", a->key);
    snprintf(l->e[l->n].action, sizeof(l->e[0].action), "%s", a->action);
    snprintf(l->e[l->n].before, sizeof(l->e[0].before), "%s", a->before);
    snprintf(l->e[l->n].after, sizeof(l->e[0].after), "%s", a->after);
    l->e[l->n].from = a->from;
    l->e[l->n].to = a->to;
    l->e[l->n].at = a->at_s;
    l->n++;
    return true;
}

#define FROM(s) (1u << (s))

static void review_changes_check_the_status_and_are_audited(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct store_reply r = sample_reply("s1", "r1", "draft"), out;
    struct store_review_change approve = {"s1", "r1", FROM(STORE_REVIEW_PENDING),
                                          STORE_REVIEW_APPROVED, "edited", "key:1", "approve"};
    struct store_review_change reject = {"s1", "r1", FROM(STORE_REVIEW_PENDING),
                                         STORE_REVIEW_REJECTED, NULL, NULL, "reject"};
    struct store_review_change ghost = approve;
    struct audit_log log = {0};
    enum store_change_result res;
    int64_t t0 = (int64_t)time(NULL);
    bool found = false;
    assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
    /* pending -> approved with an edit */
    assert_int_equal(store_review_change(st, &approve, &out, &res, NULL), AR_OK);
    assert_int_equal(res, STORE_CHANGED);
    assert_int_equal(out.status, STORE_REVIEW_APPROVED);
    assert_string_equal(out.reply, "edited");
    assert_true(out.updated_s >= t0);
    assert_int_equal(out.created_s, r.created_s);
    store_reply_fini(&out);
    assert_int_equal(store_reply_get(st, "s1", "r1", &out, &found, NULL), AR_OK);
    assert_int_equal(out.status, STORE_REVIEW_APPROVED);
    assert_string_equal(out.reply, "edited");
    assert_string_equal(out.text, r.text); /* the review itself never changes */
    store_reply_fini(&out);
    /* approved is not pending: refused, the row as it is */
    assert_int_equal(store_review_change(st, &reject, &out, &res, NULL), AR_OK);
    assert_int_equal(res, STORE_CHANGE_REFUSED);
    assert_int_equal(out.status, STORE_REVIEW_APPROVED);
    store_reply_fini(&out);
    /* unknown review */
    ghost.review_id = "nope";
    assert_int_equal(store_review_change(st, &ghost, &out, &res, NULL), AR_OK);
    assert_int_equal(res, STORE_CHANGE_NOT_FOUND);
    assert_null(out.storage);
    /* approved -> rejected when allowed, text kept */
    reject.from_mask |= FROM(STORE_REVIEW_APPROVED);
    assert_int_equal(store_review_change(st, &reject, NULL, &res, NULL), AR_OK);
    assert_int_equal(res, STORE_CHANGED);
    /* the log: one entry per change, oldest first; a refused change left none */
    assert_int_equal(store_review_audit(st, "s1", "r1", audit_collect, &log, NULL), AR_OK);
    assert_int_equal(log.n, 2);
    assert_string_equal(log.e[0].key, "key:1");
    assert_string_equal(log.e[0].action, "approve");
    assert_string_equal(log.e[0].before, "draft");
    assert_string_equal(log.e[0].after, "edited");
    assert_int_equal(log.e[0].from, STORE_REVIEW_PENDING);
    assert_int_equal(log.e[0].to, STORE_REVIEW_APPROVED);
    assert_true(log.e[0].at >= t0);
    assert_string_equal(log.e[1].key, "");
    assert_string_equal(log.e[1].before, "edited");
    assert_string_equal(log.e[1].after, "edited");
    assert_int_equal(log.e[1].to, STORE_REVIEW_REJECTED);
    log.n = 0;
    assert_int_equal(store_review_audit(st, "s1", "nope", audit_collect, &log, NULL), AR_OK);
    assert_int_equal(log.n, 0);
    /* bad arguments */
    approve.action = "";
    assert_int_equal(store_review_change(st, &approve, NULL, &res, NULL), AR_EINVAL);
    approve.action = "approve";
    approve.to = (enum store_review_status)7;
    assert_int_equal(store_review_change(st, &approve, NULL, &res, NULL), AR_EINVAL);
    store_close(st);
}

struct change_race {
    const char *url;
    struct store_review_change c;
    pthread_barrier_t *go;
    int changed;
};

static void *change_run(void *arg)
{
    struct change_race *cr = arg;
    struct store *st = open_store(cr->url);
    char review[16];
    for (int i = 0; i < 20; i++) {
        enum store_change_result res = STORE_CHANGE_NOT_FOUND;
        snprintf(review, sizeof(review), "race%d", i);
        cr->c.review_id = review;
        pthread_barrier_wait(cr->go);
        if (store_review_change(st, &cr->c, NULL, &res, NULL) == AR_OK && res == STORE_CHANGED)
            cr->changed |= 1 << i;
    }
    store_close(st);
    return NULL;
}

/* An approve and a reject of the same pending review on two handles at once: exactly one wins,
 * every time, and the stored status is the winner's. */
static void approve_and_reject_at_once_one_wins(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    pthread_barrier_t go;
    struct change_race a = {f->url, {"s1", NULL, FROM(STORE_REVIEW_PENDING),
                                     STORE_REVIEW_APPROVED, "ok", "key:0", "approve"}, &go, 0};
    struct change_race b = {f->url, {"s1", NULL, FROM(STORE_REVIEW_PENDING),
                                     STORE_REVIEW_REJECTED, NULL, "key:1", "reject"}, &go, 0};
    pthread_t ta, tb;
    for (int i = 0; i < 20; i++) {
        char review[16];
        struct store_reply r;
        snprintf(review, sizeof(review), "race%d", i);
        r = sample_reply("s1", review, "draft");
        assert_int_equal(store_reply_put(st, &r, NULL, NULL, NULL), AR_OK);
    }
    pthread_barrier_init(&go, NULL, 2);
    assert_int_equal(pthread_create(&ta, NULL, change_run, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, change_run, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(a.changed & b.changed, 0);
    assert_int_equal(a.changed | b.changed, (1 << 20) - 1);
    for (int i = 0; i < 20; i++) {
        char review[16];
        struct store_reply out;
        struct audit_log log = {0};
        bool found = false;
        snprintf(review, sizeof(review), "race%d", i);
        assert_int_equal(store_reply_get(st, "s1", review, &out, &found, NULL), AR_OK);
        assert_int_equal(out.status, (a.changed >> i) & 1 ? STORE_REVIEW_APPROVED
                                                          : STORE_REVIEW_REJECTED);
        store_reply_fini(&out);
        assert_int_equal(store_review_audit(st, "s1", review, audit_collect, &log, NULL), AR_OK);
        assert_int_equal(log.n, 1);
    }
    store_close(st);
}

struct shop_seen {
    int n;
    char ids[4][16];
    char json[4][64];
};

static bool shop_collect(const char *shop_id, const char *json, int64_t updated_s, void *user)
{
    struct shop_seen *s = user;
    assert_true(s->n < 4);
    assert_true(updated_s > 0);
    snprintf(s->ids[s->n], sizeof(s->ids[0]), "%s", shop_id);
    snprintf(s->json[s->n], sizeof(s->json[0]), "%s", json);
    s->n++;
    return true;
}

static void shop_profiles_are_stored_and_replaced(void **state)
{
    struct fixture *f = *state;
    struct store *st = open_store(f->url);
    struct shop_seen seen = {0};
    char *json = NULL;
    int64_t at = 0;
    bool found = true;
    assert_int_equal(store_shop_get(st, "b", &json, &at, &found, NULL), AR_OK);
    assert_false(found);
    assert_null(json);
    assert_int_equal(store_shop_put(st, "b", "{\"mode\":\"suggest\"}", NULL), AR_OK);
    assert_int_equal(store_shop_put(st, "a", "{\"lang\":\"zh\"}", NULL), AR_OK);
    assert_int_equal(store_shop_put(st, "b", "{\"mode\":\"auto\"}", NULL), AR_OK);
    assert_int_equal(store_shop_get(st, "b", &json, &at, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(json, "{\"mode\":\"auto\"}");
    assert_true(at >= (int64_t)time(NULL) - 5);
    ar_free(json);
    store_close(st);
    /* durable, listed in shop order */
    st = open_store(f->url);
    assert_int_equal(store_shops_list(st, shop_collect, &seen, NULL), AR_OK);
    assert_int_equal(seen.n, 2);
    assert_string_equal(seen.ids[0], "a");
    assert_string_equal(seen.json[0], "{\"lang\":\"zh\"}");
    assert_string_equal(seen.ids[1], "b");
    assert_int_equal(store_shop_put(st, "", "{}", NULL), AR_EINVAL);
    assert_int_equal(store_shop_put(st, "c", "", NULL), AR_EINVAL);
    store_close(st);
}

#define BOTH(f)                                                                                    \
    {"sqlite/" #f, f, setup, teardown, NULL},                                                      \
    {                                                                                              \
        "postgres/" #f, f, setup_pg, teardown, NULL                                                \
    }
#define SQLITE(f)                                                                                  \
    {                                                                                              \
        "sqlite/" #f, f, setup, teardown, NULL                                                     \
    }
#define PG(f)                                                                                      \
    {                                                                                              \
        "postgres/" #f, f, setup_pg, teardown, NULL                                                \
    }

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(reply_put_twice_keeps_the_first_reply),
        BOTH(reply_put_fills_defaults),
        BOTH(new_reply_put_returns_the_row_as_read_back),
        SQLITE(commits_are_checkpointed_in_the_background),
        BOTH(invalid_reply_arguments_are_rejected),
        BOTH(job_progresses_from_queued_to_done),
        BOTH(cancelled_and_finished_jobs_are_not_unfinished),
        BOTH(invalid_job_arguments_are_rejected),
        BOTH(job_lines_are_read_one_by_one_and_jobs_get_published),
        SQLITE(version_one_database_is_migrated),
        PG(pg_version_one_database_is_migrated),
        BOTH(jobs_belong_to_owners_and_list_newest_first),
        BOTH(usage_cancel_delete_and_notices),
        BOTH(results_come_in_pages),
        BOTH(reopen_keeps_replies_and_jobs),
        SQLITE(open_rejects_non_database_and_newer_schema),
        BOTH(kill_mid_job_then_resume_finishes_each_line_once),
        BOTH(threads_sharing_handles_insert_each_key_once),
        BOTH(large_job_with_awkward_inputs_reads_back_exactly),
        BOTH(claims_are_owned_held_renewed_and_ended),
        BOTH(claims_are_released_by_owner_prefix),
        BOTH(an_expired_lease_is_taken_over),
        BOTH(two_instances_racing_on_a_review_generate_once),
        BOTH(item_done_twice_across_handles_counts_once),
        BOTH(reviews_list_by_filter_in_pages),
        BOTH(review_changes_check_the_status_and_are_audited),
        BOTH(approve_and_reject_at_once_one_wins),
        BOTH(shop_profiles_are_stored_and_replaced),
        PG(concurrent_opens_migrate_once),
        PG(pg_newer_schema_and_bad_urls_are_refused),
        PG(pooled_calls_run_in_parallel_and_waits_are_bounded),
        PG(dropped_connections_are_replaced_without_an_error),
        PG(stopped_server_fails_fast_then_recovers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
