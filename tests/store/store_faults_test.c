/* store_faults_test.c - the SQLite store under allocation failures and I/O errors. SQLite's own
 * allocations are routed through ar_malloc here (sqlite3_config before its first use), so the
 * n-th allocation failing (tests/harness/faults.h) reaches inside SQLite as well as the store's
 * code: every store call must then end in a clean error (a status and a message, or
 * AR_ENOMEM), leave the database as it was (a failed write is not half done), and leak nothing
 * (LeakSanitizer in the ASan build). I/O errors: a missing folder, a file that is not a
 * database, a database cut short, and a file-size limit that stops
 * writes (the disk-full case). The allocation cases run on ":memory:" databases: a file
 * database has a checkpointer thread whose allocations the one-thread hook would also fail. */
#include "harness/faults.h"
#include "harness/harness.h"

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/store.h"

/* ---- SQLite's allocator over ar_malloc ------------------------------------------------------ */

static void *sq_malloc(int n)
{
    return ar_malloc((size_t)n);
}
static void sq_free(void *p)
{
    ar_free(p);
}
static void *sq_realloc(void *p, int n)
{
    return ar_realloc(p, (size_t)n);
}
static int sq_size(void *p)
{
    return p ? (int)malloc_usable_size(p) : 0;
}
static int sq_roundup(int n)
{
    return (n + 7) & ~7;
}
static int sq_init(void *u)
{
    (void)u;
    return SQLITE_OK;
}
static void sq_shutdown(void *u)
{
    (void)u;
}

static int route_sqlite_allocations(void)
{
    static const sqlite3_mem_methods m = {sq_malloc,  sq_free, sq_realloc,  sq_size,
                                          sq_roundup, sq_init, sq_shutdown, NULL};
    return sqlite3_config(SQLITE_CONFIG_MALLOC, &m) == SQLITE_OK ? 0 : -1;
}

/* A clean error: AR_ENOMEM, or any error with a message. */
static void assert_clean(enum ar_status st, const struct ar_err *err, const char *what, uint64_t n)
{
    if (st == AR_OK)
        return;
    if (st != AR_ENOMEM && err->msg[0] == '\0')
        fail_msg("%s with allocation %llu failed: %s without a message", what,
                 (unsigned long long)n, ar_status_str(st));
}

static struct store_reply sample(const char *review_id)
{
    struct store_reply r = {0};
    r.shop_id = "shop-1";
    r.review_id = review_id;
    r.text = "很好吃，下次还来";
    r.rating = 5;
    r.lang = "zh";
    r.reply = "感谢您的好评，欢迎再来！";
    r.sentiment = 0.8f;
    r.model = "demo";
    return r;
}

/* ---- allocation failures ------------------------------------------------------------------- */

static enum ar_status open_close(void *user, uint64_t n, uint64_t *made)
{
    struct store *s = (struct store *)1;
    struct ar_err err = {0};
    enum ar_status st;
    (void)user;
    ar_alloc_fail_after(n);
    st = store_open(":memory:", &s, &err);
    *made = ar_alloc_fail_after(0);
    assert_clean(st, &err, "store_open", n);
    if (st != AR_OK) {
        assert_null(s);
        return st;
    }
    store_close(s);
    return AR_OK;
}

static void open_fails_cleanly_at_every_allocation(void **state)
{
    (void)state;
    th_fail_each_alloc("store_open(:memory:)", open_close, NULL, 100000);
}

struct put_ctx {
    struct store *s;
};

/* Puts one reply armed; then, unarmed: after a failure the row is absent, after success it
 * reads back as put. */
static enum ar_status put_get(void *user, uint64_t n, uint64_t *made)
{
    struct put_ctx *c = user;
    struct store_reply r = sample("r-1"), out = {0}, back = {0};
    struct ar_err err = {0};
    bool existed = true, found = true;
    enum ar_status st;
    ar_alloc_fail_after(n);
    st = store_reply_put(c->s, &r, &out, &existed, &err);
    *made = ar_alloc_fail_after(0);
    assert_clean(st, &err, "store_reply_put", n);
    assert_int_equal(store_reply_get(c->s, "shop-1", "r-1", &back, &found, NULL), AR_OK);
    if (st != AR_OK) {
        if (found)
            fail_msg("store_reply_put failed at allocation %llu, yet the row is stored",
                     (unsigned long long)n);
        return st;
    }
    assert_true(found);
    assert_false(existed);
    assert_string_equal(back.reply, r.reply);
    assert_string_equal(out.reply, r.reply);
    store_reply_fini(&out);
    store_reply_fini(&back);
    return AR_OK;
}

static void reply_put_fails_cleanly_and_stores_nothing(void **state)
{
    struct put_ctx c = {0};
    (void)state;
    assert_int_equal(store_open(":memory:", &c.s, NULL), AR_OK);
    th_fail_each_alloc("store_reply_put", put_get, &c, 100000);
    store_close(c.s);
}

/* Gets an existing reply armed: a failure is clean and leaves *out empty. */
static enum ar_status get_only(void *user, uint64_t n, uint64_t *made)
{
    struct put_ctx *c = user;
    struct store_reply out = {0};
    struct ar_err err = {0};
    bool found = false;
    enum ar_status st;
    ar_alloc_fail_after(n);
    st = store_reply_get(c->s, "shop-1", "r-1", &out, &found, &err);
    *made = ar_alloc_fail_after(0);
    assert_clean(st, &err, "store_reply_get", n);
    if (st == AR_OK) {
        assert_true(found);
        assert_string_equal(out.text, "很好吃，下次还来");
    }
    store_reply_fini(&out);
    return st;
}

static void reply_get_fails_cleanly(void **state)
{
    struct put_ctx c = {0};
    struct store_reply r = sample("r-1");
    (void)state;
    assert_int_equal(store_open(":memory:", &c.s, NULL), AR_OK);
    assert_int_equal(store_reply_put(c.s, &r, NULL, NULL, NULL), AR_OK);
    th_fail_each_alloc("store_reply_get", get_only, &c, 100000);
    store_close(c.s);
}

/* A job's life armed: create (3 lines), read the pending lines, finish one, read its results.
 * Unarmed afterwards: a job either exists whole (3 lines) or not at all. */
static enum ar_status job_life(void *user, uint64_t n, uint64_t *made)
{
    struct put_ctx *c = user;
    static const struct store_item_in items[] = {
        {1, "{\"review_id\":\"a\",\"text\":\"好\",\"rating\":5}"},
        {2, "{\"review_id\":\"b\",\"text\":\"差\",\"rating\":1}"},
        {4, "{\"review_id\":\"c\",\"text\":\"ok\",\"rating\":3}"}};
    struct store_job_spec spec = {"shop-1", "owner-1", NULL};
    char id[STORE_JOB_ID_LEN + 1] = "";
    struct store_item *pending = NULL;
    size_t n_pending = 0;
    struct ar_err err = {0};
    int64_t open_before = -1, open_after = -1, bytes;
    enum ar_status st;
    assert_int_equal(store_job_usage(c->s, "owner-1", &open_before, &bytes, NULL), AR_OK);
    ar_alloc_fail_after(n);
    st = store_job_create_spec(c->s, &spec, items, 3, id, &err);
    if (st == AR_OK)
        st = store_job_next_pending(c->s, id, 0, 8, &pending, &n_pending, &err);
    if (st == AR_OK)
        st = store_job_item_done(c->s, id, 1, "{\"reply\":\"谢谢\"}", &err);
    *made = ar_alloc_fail_after(0);
    assert_clean(st, &err, "job create/next/done", n);
    store_items_free(pending, n_pending);
    assert_int_equal(store_job_usage(c->s, "owner-1", &open_after, &bytes, NULL), AR_OK);
    if (id[0]) {
        struct store_job_info info;
        bool found = false;
        assert_int_equal(store_job_get(c->s, id, &info, &found, NULL), AR_OK);
        assert_true(found);
        assert_int_equal(info.n_total, 3);
        assert_int_equal(open_after, open_before + 1);
        assert_true(info.n_done == 0 || info.n_done == 1);
        if (st == AR_OK)
            assert_int_equal(info.n_done, 1);
    } else {
        assert_int_equal(open_after, open_before); /* all or nothing */
    }
    return st;
}

static void job_calls_fail_cleanly_and_jobs_stay_whole(void **state)
{
    struct put_ctx c = {0};
    (void)state;
    assert_int_equal(store_open(":memory:", &c.s, NULL), AR_OK);
    th_fail_each_alloc("store job create/next/done", job_life, &c, 100000);
    store_close(c.s);
}

/* ---- I/O errors ------------------------------------------------------------------------------ */

static void open_in_a_missing_folder_is_an_io_error(void **state)
{
    struct store *s = (struct store *)1;
    struct ar_err err = {0};
    (void)state;
    assert_int_equal(store_open("/nonexistent-dir-ar/x/store.db", &s, &err), AR_EIO);
    assert_null(s);
    assert_true(err.msg[0] != '\0');
}

static void make_dir(char *dir, size_t size)
{
    snprintf(dir, size, "/tmp/ar_store_faults_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void write_bytes(const char *path, const void *p, size_t n, long at)
{
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, p, n, at), (ssize_t)n);
    close(fd);
}

static void a_file_that_is_not_a_database_is_refused(void **state)
{
    char dir[64], path[128], junk[4096];
    struct store *s = (struct store *)1;
    struct ar_err err = {0};
    enum ar_status st;
    (void)state;
    make_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/store.db", dir);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (char)(i * 131 + 7);
    write_bytes(path, junk, sizeof(junk), 0);
    st = store_open(path, &s, &err);
    assert_int_not_equal(st, AR_OK);
    assert_null(s);
    assert_true(err.msg[0] != '\0');
    remove_dir(dir);
}

/* A database cut short (a torn copy, a failing disk): the store either refuses to open it or
 * answers the reads of rows on the missing pages with clean errors; none crashes. */
static void a_truncated_database_gives_clean_errors(void **state)
{
    char dir[64], path[128], big[3000];
    struct store *s = NULL;
    struct store_reply r = sample("r-1"), out = {0};
    struct ar_err err = {0};
    enum ar_status st;
    bool found;
    int errors = 0;
    (void)state;
    make_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/store.db", dir);
    assert_int_equal(store_open(path, &s, NULL), AR_OK);
    memset(big, 'y', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    r.reply = big; /* about one page per row */
    for (int i = 0; i < 60; i++) {
        char id[16];
        snprintf(id, sizeof(id), "r-%d", i);
        r.review_id = id;
        assert_int_equal(store_reply_put(s, &r, NULL, NULL, NULL), AR_OK);
    }
    store_close(s); /* the last connection: the WAL goes into the file */
    s = NULL;
    assert_int_equal(truncate(path, 6 * 4096), 0);
    st = store_open(path, &s, &err);
    if (st != AR_OK) {
        assert_true(err.msg[0] != '\0');
        assert_null(s);
        print_message("truncated database: refused at open (%s)\n", err.msg);
        remove_dir(dir);
        return;
    }
    for (int i = 0; i < 60; i++) {
        char id[16];
        snprintf(id, sizeof(id), "r-%d", i);
        memset(&err, 0, sizeof(err));
        st = store_reply_get(s, "shop-1", id, &out, &found, &err);
        store_reply_fini(&out);
        if (st != AR_OK) {
            assert_true(err.msg[0] != '\0');
            errors++;
        }
    }
    print_message("truncated database: %d of 60 reads failed cleanly\n", errors);
    assert_true(errors > 0);
    store_close(s);
    remove_dir(dir);
}

/* Disk full: in a child, a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored, so writes fail
 * with EFBIG) just above the database's size; puts of large replies must soon fail with a
 * clean error, and the replies stored before stay readable. */
static void writes_past_a_file_size_limit_fail_cleanly(void **state)
{
    char dir[64], path[128];
    pid_t pid;
    int status;
    (void)state;
    make_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/store.db", dir);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        struct store *s = NULL;
        struct store_reply r = sample("r-0"), out = {0};
        struct rlimit rl;
        static char big[16384];
        bool found = false;
        int stored = 0;
        signal(SIGXFSZ, SIG_IGN);
        if (store_open(path, &s, NULL) != AR_OK || store_reply_put(s, &r, NULL, NULL, NULL))
            _exit(2);
        memset(big, 'x', sizeof(big) - 1);
        r.reply = big;
        getrlimit(RLIMIT_FSIZE, &rl);
        rl.rlim_cur = 256 * 1024;
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(3);
        for (int i = 1; i < 200; i++) {
            char id[16];
            struct ar_err err = {0};
            enum ar_status st;
            snprintf(id, sizeof(id), "r-%d", i);
            r.review_id = id;
            st = store_reply_put(s, &r, NULL, NULL, &err);
            if (st != AR_OK) {
                if (err.msg[0] == '\0')
                    _exit(4);
                printf("file-size limit: put %d failed cleanly (%s: %s)\n", i, ar_status_str(st),
                       err.msg);
                break;
            }
            stored++;
        }
        if (stored >= 199)
            _exit(5); /* the limit never bit */
        if (store_reply_get(s, "shop-1", "r-0", &out, &found, NULL) != AR_OK || !found)
            _exit(6);
        store_reply_fini(&out);
        store_close(s);
        fflush(stdout);
        _exit(0);
    }
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(open_fails_cleanly_at_every_allocation),
        cmocka_unit_test(reply_put_fails_cleanly_and_stores_nothing),
        cmocka_unit_test(reply_get_fails_cleanly),
        cmocka_unit_test(job_calls_fail_cleanly_and_jobs_stay_whole),
        cmocka_unit_test(open_in_a_missing_folder_is_an_io_error),
        cmocka_unit_test(a_file_that_is_not_a_database_is_refused),
        cmocka_unit_test(a_truncated_database_gives_clean_errors),
        cmocka_unit_test(writes_past_a_file_size_limit_fail_cleanly),
    };
    if (route_sqlite_allocations() != 0) {
        printf("sqlite3_config(SQLITE_CONFIG_MALLOC) refused\n");
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
