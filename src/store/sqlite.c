/* sqlite.c - the SQLite store: schema and migrations, prepared statements, replies with
 * insert-once semantics and claims, bulk jobs whose lines are finished one transaction at a
 * time, and the background checkpointer. Every statement is prepared once at open and every
 * value is bound, never spliced. Arguments arrive checked (store_replies.c, store_jobs.c). */
#include "base/deadline.h"
#include "store_internal.h"

#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <time.h>

/* ---- schema ------------------------------------------------------------------------- */

/* migrations[v] moves a database from user_version v to v + 1. Append only. */
static const char *const migrations[STORE_SCHEMA_VERSION] = {
    "CREATE TABLE replies ("
    "  shop_id TEXT NOT NULL,"
    "  review_id TEXT NOT NULL,"
    "  review_text TEXT NOT NULL,"
    "  rating INTEGER NOT NULL CHECK (rating BETWEEN 1 AND 5),"
    "  lang TEXT NOT NULL,"
    "  reply TEXT NOT NULL,"
    "  needs_human INTEGER NOT NULL,"
    "  sentiment REAL NOT NULL,"
    "  cached INTEGER NOT NULL,"
    "  model TEXT NOT NULL,"
    "  created_s INTEGER NOT NULL,"
    "  PRIMARY KEY (shop_id, review_id)"
    ") WITHOUT ROWID;"
    "CREATE TABLE jobs ("
    "  id TEXT PRIMARY KEY,"
    "  status TEXT NOT NULL"
    "    CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),"
    "  shop_id TEXT NOT NULL,"
    "  n_total INTEGER NOT NULL,"
    "  n_done INTEGER NOT NULL DEFAULT 0,"
    "  n_failed INTEGER NOT NULL DEFAULT 0,"
    "  created_s INTEGER NOT NULL,"
    "  updated_s INTEGER NOT NULL"
    ");"
    "CREATE INDEX jobs_by_status ON jobs (status, created_s);"
    "CREATE TABLE job_items ("
    "  job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    "  line INTEGER NOT NULL,"
    "  input TEXT NOT NULL,"
    "  status TEXT NOT NULL CHECK (status IN ('pending', 'done', 'error')),"
    "  result TEXT,"
    "  PRIMARY KEY (job_id, line)"
    ") WITHOUT ROWID;"
    "CREATE INDEX job_items_by_status ON job_items (job_id, status, line);",
    /* 1 -> 2: a job is published once its lines were handed to a queue; jobs from before
     * count as unpublished, so that a consumer that resumes unpublished jobs picks them up */
    "ALTER TABLE jobs ADD COLUMN published INTEGER NOT NULL DEFAULT 0;",
    /* 2 -> 3: claims on reviews being generated; expires_at in unix seconds */
    "CREATE TABLE reply_claims ("
    "  shop_id TEXT NOT NULL,"
    "  review_id TEXT NOT NULL,"
    "  owner TEXT NOT NULL,"
    "  expires_at REAL NOT NULL,"
    "  PRIMARY KEY (shop_id, review_id)"
    ") WITHOUT ROWID;",
    /* 3 -> 4: a job belongs to who created it (jobs from before belong to "": nobody the
     * HTTP API names), keeps its size for quotas (computed for the jobs there are), an
     * optional completion callback, and whether its completion notice was claimed */
    "ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE jobs ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN callback_url TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE jobs ADD COLUMN notified INTEGER NOT NULL DEFAULT 0;"
    "UPDATE jobs SET bytes = (SELECT coalesce(sum(length(CAST(input AS BLOB))), 0) "
    "  FROM job_items WHERE job_id = jobs.id);"
    "CREATE INDEX jobs_by_owner ON jobs (owner, status);"
    /* the few jobs whose completion notice is still to be claimed (the sweeper's look) */
    "CREATE INDEX jobs_to_notify ON jobs (status) WHERE notified = 0 AND callback_url <> '';",
    /* 4 -> 5: the review workflow. A reply has a status and the time of its last change;
     * the store never kept the action of replies from before, so they read as pending (a
     * person sees them once). Every change by a person is kept in review_audit; a shop's
     * profile saved through the API in shop_profiles. */
    "ALTER TABLE replies ADD COLUMN status TEXT NOT NULL DEFAULT 'pending'"
    "  CHECK (status IN ('pending', 'approved', 'sent', 'rejected'));"
    "ALTER TABLE replies ADD COLUMN updated_s INTEGER NOT NULL DEFAULT 0;"
    "UPDATE replies SET updated_s = created_s;"
    "CREATE INDEX replies_by_created ON replies (created_s, shop_id, review_id);"
    "CREATE INDEX replies_by_status ON replies (status, created_s, shop_id, review_id);"
    "CREATE TABLE review_audit ("
    "  id INTEGER PRIMARY KEY,"
    "  shop_id TEXT NOT NULL,"
    "  review_id TEXT NOT NULL,"
    "  at_s INTEGER NOT NULL,"
    "  api_key TEXT NOT NULL,"
    "  action TEXT NOT NULL,"
    "  reply_before TEXT NOT NULL,"
    "  reply_after TEXT NOT NULL,"
    "  from_status TEXT NOT NULL,"
    "  to_status TEXT NOT NULL);"
    "CREATE INDEX review_audit_by_review ON review_audit (shop_id, review_id, id);"
    "CREATE TABLE shop_profiles ("
    "  shop_id TEXT PRIMARY KEY,"
    "  profile TEXT NOT NULL,"
    "  updated_s INTEGER NOT NULL"
    ") WITHOUT ROWID;",
};

/* ---- statements --------------------------------------------------------------------- */

enum stmt_id {
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_REPLY_GET,
    S_REPLY_INSERT,
    S_CLAIM_TAKE,
    S_CLAIM_END,
    S_CLAIM_DROP,
    S_CLAIM_RELEASE,
    S_JOB_INSERT,
    S_ITEM_INSERT,
    S_ITEM_PENDING,
    S_ITEM_FINISH,
    S_ITEM_STATUS,
    S_ITEM_GET,
    S_JOB_COUNT,
    S_JOB_SET_PUBLISHED,
    S_JOB_SET_STATUS,
    S_JOB_GET,
    S_JOB_ITEMS,
    S_JOBS_UNFINISHED,
    S_JOB_ITEMS_PAGE,
    S_JOBS_LIST,
    S_JOB_USAGE,
    S_JOB_CANCEL,
    S_JOB_DELETE_ITEMS,
    S_JOB_DELETE,
    S_JOB_CLAIM_NOTIFY,
    S_JOBS_UNNOTIFIED,
    S_REVIEWS_LIST,
    S_REVIEW_SET,
    S_AUDIT_INSERT,
    S_AUDIT_LIST,
    S_SHOP_PUT,
    S_SHOP_GET,
    S_SHOPS_LIST,
    S_COUNT
};

#define REPLY_COLS                                                                                 \
    "shop_id, review_id, review_text, rating, lang, reply, needs_human, sentiment, cached, "       \
    "model, created_s, status, updated_s"
/* unix seconds with a fraction, on this machine's clock (the database's, for SQLite) */
#define NOW_S "((julianday('now') - 2440587.5) * 86400.0)"
#define JOB_COLS                                                                                   \
    "id, status, n_total, n_done, n_failed, created_s, updated_s, shop_id, published, owner, "     \
    "bytes, rowid, callback_url, notified"

static const char *const stmt_sql[S_COUNT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_REPLY_GET] = "SELECT " REPLY_COLS " FROM replies WHERE shop_id = ?1 AND review_id = ?2",
    [S_REPLY_INSERT] = "INSERT INTO replies (" REPLY_COLS ") "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?11) "
                       "ON CONFLICT (shop_id, review_id) DO NOTHING",
    /* a new claim, or one that expired, or the owner's own: changes() says whether taken */
    [S_CLAIM_TAKE] =
        "INSERT INTO reply_claims (shop_id, review_id, owner, expires_at) "
        "VALUES (?1, ?2, ?3, " NOW_S " + ?4) "
        "ON CONFLICT (shop_id, review_id) DO UPDATE "
        "SET owner = excluded.owner, expires_at = excluded.expires_at "
        "WHERE reply_claims.expires_at <= " NOW_S " OR reply_claims.owner = excluded.owner",
    [S_CLAIM_END] = "DELETE FROM reply_claims WHERE shop_id = ?1 AND review_id = ?2",
    [S_CLAIM_DROP] = "DELETE FROM reply_claims WHERE shop_id = ?1 AND review_id = ?2 "
                     "AND owner = ?3",
    [S_CLAIM_RELEASE] = "DELETE FROM reply_claims WHERE substr(owner, 1, length(?1)) = ?1",
    [S_JOB_INSERT] = "INSERT INTO jobs (id, status, shop_id, n_total, created_s, updated_s, "
                     "published, owner, bytes, callback_url) "
                     "VALUES (?1, 'queued', ?2, ?3, ?4, ?4, 0, ?5, ?6, ?7)",
    [S_ITEM_INSERT] = "INSERT INTO job_items (job_id, line, input, status) "
                      "VALUES (?1, ?2, ?3, 'pending')",
    [S_ITEM_PENDING] = "SELECT line, input FROM job_items "
                       "WHERE job_id = ?1 AND status = 'pending' AND line > ?2 "
                       "ORDER BY line LIMIT ?3",
    [S_ITEM_FINISH] = "UPDATE job_items SET status = ?3, result = ?4 "
                      "WHERE job_id = ?1 AND line = ?2 AND status = 'pending'",
    [S_ITEM_STATUS] = "SELECT status FROM job_items WHERE job_id = ?1 AND line = ?2",
    [S_ITEM_GET] = "SELECT line, status, input, result FROM job_items "
                   "WHERE job_id = ?1 AND line = ?2",
    /* every right-hand side sees the old row */
    [S_JOB_COUNT] = "UPDATE jobs SET n_done = n_done + ?2, n_failed = n_failed + ?3, "
                    "updated_s = ?4, status = CASE "
                    "  WHEN status NOT IN ('queued', 'running') THEN status "
                    "  WHEN n_done + ?2 + n_failed + ?3 >= n_total THEN 'done' "
                    "  ELSE 'running' END "
                    "WHERE id = ?1",
    [S_JOB_SET_STATUS] = "UPDATE jobs SET status = ?2, updated_s = ?3 WHERE id = ?1",
    [S_JOB_SET_PUBLISHED] = "UPDATE jobs SET published = 1 WHERE id = ?1",
    [S_JOB_GET] = "SELECT " JOB_COLS " FROM jobs WHERE id = ?1",
    [S_JOB_ITEMS] = "SELECT line, status, input, result FROM job_items "
                    "WHERE job_id = ?1 ORDER BY line",
    [S_JOBS_UNFINISHED] = "SELECT " JOB_COLS " FROM jobs "
                          "WHERE status IN ('queued', 'running') ORDER BY created_s, rowid",
    [S_JOB_ITEMS_PAGE] = "SELECT line, status, input, result FROM job_items "
                         "WHERE job_id = ?1 AND line > ?2 ORDER BY line LIMIT ?3",
    /* rowid: a job's seq; a rowid is reused only after the newest job is deleted, so a
     * later job never sorts before an earlier one still there */
    [S_JOBS_LIST] = "SELECT " JOB_COLS " FROM jobs WHERE owner = ?1 AND rowid < ?2 "
                    "ORDER BY rowid DESC LIMIT ?3",
    [S_JOB_USAGE] = "SELECT coalesce(sum(status IN ('queued', 'running')), 0), "
                    "coalesce(sum(bytes), 0) FROM jobs WHERE owner = ?1",
    [S_JOB_CANCEL] = "UPDATE jobs SET status = 'cancelled', updated_s = ?2 "
                     "WHERE id = ?1 AND status IN ('queued', 'running')",
    [S_JOB_DELETE_ITEMS] = "DELETE FROM job_items WHERE job_id = ?1",
    [S_JOB_DELETE] = "DELETE FROM jobs WHERE id = ?1",
    [S_JOB_CLAIM_NOTIFY] = "UPDATE jobs SET notified = 1 WHERE id = ?1 AND status = 'done' "
                           "AND notified = 0 AND callback_url <> ''",
    [S_JOBS_UNNOTIFIED] = "SELECT " JOB_COLS " FROM jobs WHERE status = 'done' AND notified = 0 "
                          "AND callback_url <> '' ORDER BY rowid LIMIT 100",
    /* "" and 0 match anything; the cursor is the last row of the previous page (INT64_MAX
     * before the first page), compared as a row value in the list's order */
    [S_REVIEWS_LIST] = "SELECT " REPLY_COLS " FROM replies "
                       "WHERE (?1 = '' OR status = ?1) AND (?2 = '' OR shop_id = ?2) "
                       "AND (?3 = 0 OR rating = ?3) AND sentiment BETWEEN ?4 AND ?5 "
                       "AND (created_s, shop_id, review_id) < (?6, ?7, ?8) "
                       "ORDER BY created_s DESC, shop_id DESC, review_id DESC LIMIT ?9",
    [S_REVIEW_SET] = "UPDATE replies SET status = ?3, reply = ?4, updated_s = ?5 "
                     "WHERE shop_id = ?1 AND review_id = ?2",
    [S_AUDIT_INSERT] = "INSERT INTO review_audit (shop_id, review_id, at_s, api_key, action, "
                       "reply_before, reply_after, from_status, to_status) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [S_AUDIT_LIST] = "SELECT at_s, api_key, action, reply_before, reply_after, from_status, "
                     "to_status FROM review_audit WHERE shop_id = ?1 AND review_id = ?2 "
                     "ORDER BY id",
    [S_SHOP_PUT] = "INSERT INTO shop_profiles (shop_id, profile, updated_s) VALUES (?1, ?2, ?3) "
                   "ON CONFLICT (shop_id) DO UPDATE "
                   "SET profile = excluded.profile, updated_s = excluded.updated_s",
    [S_SHOP_GET] = "SELECT profile, updated_s FROM shop_profiles WHERE shop_id = ?1",
    [S_SHOPS_LIST] = "SELECT shop_id, profile, updated_s FROM shop_profiles ORDER BY shop_id",
};

/* Background checkpoints: the request connection never checkpoints (its WAL hook replaces
 * SQLite's auto-checkpoint), so no request pays for copying pages into the database file or
 * for the fsyncs around it. A thread with its own connection runs PASSIVE checkpoints (they
 * neither take the write lock nor wait for readers) every STORE_CKPT_PERIOD_MS, or sooner once
 * the WAL holds STORE_CKPT_PAGES pages. Under a steady stream of writes a passive checkpoint
 * never catches the last commit, so the WAL would only grow; when it passes
 * STORE_CKPT_RESET_PAGES the thread checkpoints the remaining tail (a few pages) with the
 * store's mutex held, after which the next commit starts the WAL over from its beginning. */
#define STORE_CKPT_PERIOD_MS 1000
#define STORE_CKPT_PAGES 1000
#define STORE_CKPT_RESET_PAGES 8192

struct sqlite_store {
    struct store base; /* first: the handle */
    sqlite3 *db;
    sqlite3_stmt *stmt[S_COUNT];
    pthread_mutex_t mu; /* guards db and stmt */
    bool mu_ready;
    /* the checkpointer (absent for in-memory databases, or when it could not start: SQLite's
     * auto-checkpoint then stays on) */
    sqlite3 *ck_db;
    pthread_t ck_thread;
    pthread_mutex_t ck_mu; /* guards the fields below */
    pthread_cond_t ck_cv;
    bool ck_ready, ck_running, ck_stop, ck_due;
    int ck_wal_pages;    /* WAL size after the last commit on db */
    int ck_mark;         /* WAL size that the last checkpoint saw (0 after a restart) */
    uint64_t ck_commits; /* commits on db so far */
};

/* ---- helpers ------------------------------------------------------------------------ */

/* Maps an SQLite result code to a status and puts SQLite's message into err. */
static enum ar_status db_fail(struct sqlite_store *st, int rc, struct ar_err *err, const char *what)
{
    enum ar_status code;
    switch (rc & 0xff) {
    case SQLITE_NOMEM:
        code = AR_ENOMEM;
        break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        code = AR_EBUSY;
        break;
    case SQLITE_CONSTRAINT:
    case SQLITE_TOOBIG:
    case SQLITE_RANGE:
        code = AR_EINVAL;
        break;
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
        code = AR_EFORMAT;
        break;
    default:
        code = AR_EIO;
        break;
    }
    return ar_err_set(err, code, 0, "store: %s: %s", what,
                      st && st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
}

/* Clears a statement after use, so that no read transaction stays open. */
static void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

static int bind_str(sqlite3_stmt *s, int i, const char *v)
{
    return sqlite3_bind_text(s, i, v ? v : "", -1, SQLITE_STATIC);
}

/* A value for a statement's next parameter: text (NULL binds ""), integer or real. */
struct sq_arg {
    enum { SQ_ARG_TEXT, SQ_ARG_INT, SQ_ARG_REAL } type;
    const char *text;
    int64_t num;
    double real;
};
#define SQ_TEXT(v) ((struct sq_arg){.type = SQ_ARG_TEXT, .text = (v)})
#define SQ_INT(v) ((struct sq_arg){.type = SQ_ARG_INT, .num = (int64_t)(v)})
#define SQ_REAL(v) ((struct sq_arg){.type = SQ_ARG_REAL, .real = (double)(v)})
/* The array and the count of the values given, as step_args and exec_args take them. */
#define SQ_ARGS(...)                                                                               \
    (const struct sq_arg[]){__VA_ARGS__},                                                          \
        (int)(sizeof((const struct sq_arg[]){__VA_ARGS__}) / sizeof(struct sq_arg))

/* Binds args[0..n) to ?1..?n; returns SQLite's code. */
static int bind_args(sqlite3_stmt *s, const struct sq_arg *args, int n)
{
    int rc = SQLITE_OK;
    for (int i = 0; i < n && rc == SQLITE_OK; i++) {
        if (args[i].type == SQ_ARG_TEXT)
            rc = bind_str(s, i + 1, args[i].text);
        else if (args[i].type == SQ_ARG_INT)
            rc = sqlite3_bind_int64(s, i + 1, args[i].num);
        else
            rc = sqlite3_bind_double(s, i + 1, args[i].real);
    }
    return rc;
}

/* Binds args and steps once; returns SQLite's code (SQLITE_ROW: a row to read). */
static int step_args(sqlite3_stmt *s, const struct sq_arg *args, int n)
{
    int rc = bind_args(s, args, n);
    return rc == SQLITE_OK ? sqlite3_step(s) : rc;
}

/* Runs statement id, which returns no rows, with args bound; *changes (may be NULL) receives
 * the number of rows it changed. what names it in messages. */
static enum ar_status exec_args(struct sqlite_store *st, enum stmt_id id, const struct sq_arg *args,
                                int n, int *changes, const char *what, struct ar_err *err)
{
    sqlite3_stmt *s = st->stmt[id];
    int rc = step_args(s, args, n);
    if (changes)
        *changes = rc == SQLITE_DONE ? sqlite3_changes(st->db) : 0;
    stmt_done(s);
    if (rc != SQLITE_DONE)
        return db_fail(st, rc, err, what);
    return AR_OK;
}

/* Runs a statement that takes no values and returns no rows. */
static enum ar_status exec_stmt(struct sqlite_store *st, enum stmt_id id, struct ar_err *err)
{
    return exec_args(st, id, NULL, 0, NULL, stmt_sql[id], err);
}

static enum ar_status tx_begin(struct sqlite_store *st, struct ar_err *err)
{
    return exec_stmt(st, S_BEGIN, err);
}

static enum ar_status tx_commit(struct sqlite_store *st, struct ar_err *err)
{
    enum ar_status s = exec_stmt(st, S_COMMIT, err);
    if (s != AR_OK && !sqlite3_get_autocommit(st->db))
        exec_stmt(st, S_ROLLBACK, NULL);
    return s;
}

static void tx_rollback(struct sqlite_store *st)
{
    if (!sqlite3_get_autocommit(st->db))
        exec_stmt(st, S_ROLLBACK, NULL);
}

/* Ends the transaction: commits when res is AR_OK, else rolls back. Returns the outcome. */
static enum ar_status tx_end(struct sqlite_store *st, enum ar_status res, struct ar_err *err)
{
    if (res == AR_OK)
        return tx_commit(st, err);
    tx_rollback(st);
    return res;
}

/* ---- open / close ------------------------------------------------------------------- */

/* Runs one PRAGMA (or any statement) with no bound values; *text receives the first column
 * of the first row when asked. Only constant SQL from this file comes here. */
static enum ar_status exec_const(struct sqlite_store *st, const char *sql, char *text,
                                 size_t text_size, int64_t *num, struct ar_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return db_fail(st, rc, err, sql);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        if (text && text_size) {
            const unsigned char *t = sqlite3_column_text(s, 0);
            snprintf(text, text_size, "%s", t ? (const char *)t : "");
        }
        if (num)
            *num = sqlite3_column_int64(s, 0);
        while ((rc = sqlite3_step(s)) == SQLITE_ROW)
            ;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return db_fail(st, rc, err, sql);
    return AR_OK;
}

static enum ar_status migrate(struct sqlite_store *st, struct ar_err *err)
{
    enum ar_status s;
    int64_t version = 0;
    char *msg = NULL;
    int rc;
    if ((s = exec_const(st, "BEGIN IMMEDIATE", NULL, 0, NULL, err)) != AR_OK)
        return s;
    if ((s = exec_const(st, "PRAGMA user_version", NULL, 0, &version, err)) != AR_OK)
        goto fail;
    if (version < 0 || version > STORE_SCHEMA_VERSION) {
        s = ar_err_set(err, AR_EFORMAT, 0, "store: schema version %lld is not %d or older",
                       (long long)version, STORE_SCHEMA_VERSION);
        goto fail;
    }
    for (int64_t v = version; v < STORE_SCHEMA_VERSION; v++) {
        rc = sqlite3_exec(st->db, migrations[v], NULL, NULL, &msg);
        if (rc != SQLITE_OK) {
            s = db_fail(st, rc, err, "schema migration");
            sqlite3_free(msg);
            goto fail;
        }
    }
    if (version != STORE_SCHEMA_VERSION) {
        /* PRAGMA takes no bound values; the number is our own constant */
        char sql[64];
        snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", STORE_SCHEMA_VERSION);
        if ((s = exec_const(st, sql, NULL, 0, NULL, err)) != AR_OK)
            goto fail;
    }
    if ((s = exec_const(st, "COMMIT", NULL, 0, NULL, err)) == AR_OK)
        return AR_OK;
fail:
    if (!sqlite3_get_autocommit(st->db))
        exec_const(st, "ROLLBACK", NULL, 0, NULL, NULL);
    return s;
}

/* ---- background checkpoints ----------------------------------------------------------- */

/* Called by SQLite after every commit on the request connection (with the store's mutex
 * held): notes the WAL's size and wakes the checkpointer when a checkpoint is due. */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int n_pages)
{
    struct sqlite_store *st = arg;
    (void)db;
    (void)name;
    pthread_mutex_lock(&st->ck_mu);
    if (n_pages < st->ck_mark)
        st->ck_mark = 0; /* the WAL started over */
    st->ck_wal_pages = n_pages;
    st->ck_commits++;
    if (n_pages - st->ck_mark >= STORE_CKPT_PAGES && !st->ck_due) {
        st->ck_due = true;
        pthread_cond_signal(&st->ck_cv);
    }
    pthread_mutex_unlock(&st->ck_mu);
    return SQLITE_OK;
}

static void *checkpointer_main(void *arg)
{
    struct sqlite_store *st = arg;
    uint64_t commits_seen = 0;
    pthread_mutex_lock(&st->ck_mu);
    while (!st->ck_stop) {
        struct timespec until;
        int n_log = -1, n_ckpt = -1, rc;
        bool idle;
        until = ar_deadline_in(CLOCK_REALTIME, STORE_CKPT_PERIOD_MS / 1000.0);
        while (!st->ck_stop && !st->ck_due &&
               pthread_cond_timedwait(&st->ck_cv, &st->ck_mu, &until) == 0)
            ;
        if (st->ck_stop)
            break;
        st->ck_due = false;
        idle = st->ck_commits == commits_seen;
        commits_seen = st->ck_commits;
        if (idle && st->ck_wal_pages == 0)
            continue; /* nothing written since the WAL last started over */
        pthread_mutex_unlock(&st->ck_mu);
        /* the bulk of the work (page copies, the WAL's and the database's fsyncs) runs
         * beside the requests */
        rc = sqlite3_wal_checkpoint_v2(st->ck_db, NULL, SQLITE_CHECKPOINT_PASSIVE, &n_log, &n_ckpt);
        if (rc == SQLITE_OK && n_log > n_ckpt && (n_log >= STORE_CKPT_RESET_PAGES || idle)) {
            /* the tail, with no request in the way, so that the WAL starts over */
            pthread_mutex_lock(&st->mu);
            rc = sqlite3_wal_checkpoint_v2(st->ck_db, NULL, SQLITE_CHECKPOINT_PASSIVE, &n_log,
                                           &n_ckpt);
            pthread_mutex_unlock(&st->mu);
        }
        if (rc != SQLITE_OK && rc != SQLITE_BUSY)
            AR_WARN("store: background checkpoint: %s", sqlite3_errstr(rc));
        pthread_mutex_lock(&st->ck_mu);
        if (rc == SQLITE_OK && n_log >= 0) {
            st->ck_mark = n_log;
            if (n_log == n_ckpt && st->ck_commits == commits_seen)
                st->ck_wal_pages = 0; /* all in the database file; nothing new since */
        }
    }
    pthread_mutex_unlock(&st->ck_mu);
    return NULL;
}

/* Moves checkpoints off the request connection when the database is a WAL file. On any
 * failure SQLite's auto-checkpoint simply stays on. */
static void checkpointer_start(struct sqlite_store *st, const char *path)
{
    int rc;
    if (pthread_mutex_init(&st->ck_mu, NULL) != 0)
        return;
    if (pthread_cond_init(&st->ck_cv, NULL) != 0) {
        pthread_mutex_destroy(&st->ck_mu);
        return;
    }
    st->ck_ready = true;
    rc = sqlite3_open_v2(path, &st->ck_db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_busy_timeout(st->ck_db, STORE_BUSY_TIMEOUT_MS);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(st->ck_db, "PRAGMA synchronous = NORMAL", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        AR_WARN("store: %s: no background checkpoints: %s", path, sqlite3_errstr(rc));
        sqlite3_close(st->ck_db);
        st->ck_db = NULL;
        return;
    }
    sqlite3_wal_autocheckpoint(st->ck_db, 0);
    if (pthread_create(&st->ck_thread, NULL, checkpointer_main, st) != 0) {
        AR_WARN("store: %s: no background checkpoints: cannot start a thread", path);
        sqlite3_close(st->ck_db);
        st->ck_db = NULL;
        return;
    }
    st->ck_running = true;
    /* replaces the auto-checkpoint of the request connection */
    sqlite3_wal_hook(st->db, wal_hook, st);
}

static void checkpointer_stop(struct sqlite_store *st)
{
    if (st->ck_running) {
        pthread_mutex_lock(&st->ck_mu);
        st->ck_stop = true;
        pthread_cond_signal(&st->ck_cv);
        pthread_mutex_unlock(&st->ck_mu);
        pthread_join(st->ck_thread, NULL);
        st->ck_running = false;
    }
    /* closed before the request connection, whose close (the last one) checkpoints and
     * removes the WAL */
    sqlite3_close(st->ck_db);
    st->ck_db = NULL;
    if (st->ck_ready) {
        pthread_cond_destroy(&st->ck_cv);
        pthread_mutex_destroy(&st->ck_mu);
        st->ck_ready = false;
    }
}

static const struct store_ops sqlite_ops;

static void sq_close(struct store *base)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    checkpointer_stop(st);
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(st->stmt[i]);
    sqlite3_close(st->db); /* all statements are finalized, so this closes */
    if (st->mu_ready)
        pthread_mutex_destroy(&st->mu);
    ar_free(st);
}

enum ar_status store_sqlite_open(const char *path, struct store **out, struct ar_err *err)
{
    enum ar_status s;
    struct sqlite_store *st;
    char mode[16];
    int rc;
    *out = NULL;
    st = ar_calloc(1, sizeof(*st));
    if (!st)
        return AR_ENOMEM;
    st->base.ops = &sqlite_ops;
    /* our mutex serialises the connection, so SQLite's own may be skipped */
    rc = sqlite3_open_v2(path, &st->db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        s = db_fail(st, rc, err, path);
        goto fail;
    }
    sqlite3_busy_timeout(st->db, STORE_BUSY_TIMEOUT_MS);
    if ((s = exec_const(st, "PRAGMA journal_mode = WAL", mode, sizeof(mode), NULL, err)) != AR_OK)
        goto fail;
    if (strcmp(mode, "wal") != 0 && strcmp(path, ":memory:") != 0) {
        s = ar_err_set(err, AR_EIO, 0, "store: %s: cannot use WAL mode (got %s)", path, mode);
        goto fail;
    }
    if ((s = exec_const(st, "PRAGMA synchronous = NORMAL", NULL, 0, NULL, err)) != AR_OK)
        goto fail;
    if ((s = exec_const(st, "PRAGMA foreign_keys = ON", NULL, 0, NULL, err)) != AR_OK)
        goto fail;
    if ((s = migrate(st, err)) != AR_OK)
        goto fail;
    for (int i = 0; i < S_COUNT; i++) {
        rc = sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[i],
                                NULL);
        if (rc != SQLITE_OK) {
            s = db_fail(st, rc, err, stmt_sql[i]);
            goto fail;
        }
    }
    if (pthread_mutex_init(&st->mu, NULL) != 0) {
        s = ar_err_set(err, AR_ENOMEM, 0, "store: cannot create mutex");
        goto fail;
    }
    st->mu_ready = true;
    if (strcmp(mode, "wal") == 0)
        checkpointer_start(st, path);
    *out = &st->base;
    return AR_OK;
fail:
    sq_close(&st->base);
    return s;
}

/* ---- replies ------------------------------------------------------------------------ */

/* Fills out from the current row of a REPLY_COLS select. */
static enum ar_status reply_from_row(sqlite3_stmt *s, struct store_reply *out)
{
    struct store_reply r;
    memset(&r, 0, sizeof(r));
    r.shop_id = (const char *)sqlite3_column_text(s, 0);
    r.review_id = (const char *)sqlite3_column_text(s, 1);
    r.text = (const char *)sqlite3_column_text(s, 2);
    r.rating = sqlite3_column_int(s, 3);
    r.lang = (const char *)sqlite3_column_text(s, 4);
    r.reply = (const char *)sqlite3_column_text(s, 5);
    r.needs_human = sqlite3_column_int(s, 6) != 0;
    r.sentiment = (float)sqlite3_column_double(s, 7);
    r.cached = sqlite3_column_int(s, 8) != 0;
    r.model = (const char *)sqlite3_column_text(s, 9);
    r.status = store_review_status_of((const char *)sqlite3_column_text(s, 11));
    r.updated_s = sqlite3_column_int64(s, 12);
    return store_reply_copy(&r, sqlite3_column_int64(s, 10), out);
}

/* Looks up a reply with the mutex held. */
static enum ar_status reply_get_locked(struct sqlite_store *st, const char *shop_id,
                                       const char *review_id, struct store_reply *out, bool *found,
                                       struct ar_err *err)
{
    sqlite3_stmt *s = st->stmt[S_REPLY_GET];
    enum ar_status r = AR_OK;
    int rc = step_args(s, SQ_ARGS(SQ_TEXT(shop_id), SQ_TEXT(review_id)));
    *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW)
        r = out ? reply_from_row(s, out) : AR_OK;
    else if (rc != SQLITE_DONE)
        r = db_fail(st, rc, err, "reply lookup");
    stmt_done(s);
    return r;
}

static enum ar_status sq_reply_get(struct store *base, const char *shop_id, const char *review_id,
                                   struct store_reply *out, bool *found, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status r;
    pthread_mutex_lock(&st->mu);
    r = reply_get_locked(st, shop_id, review_id, out, found, err);
    pthread_mutex_unlock(&st->mu);
    return r;
}

static enum ar_status sq_reply_put(struct store *base, const struct store_reply *r, int64_t created,
                                   struct store_reply *out, bool *existed, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    bool found = false;
    int changes = 0;
    pthread_mutex_lock(&st->mu);
    if ((res = tx_begin(st, err)) != AR_OK)
        goto out;
    res = exec_args(st, S_REPLY_INSERT,
                    SQ_ARGS(SQ_TEXT(r->shop_id), SQ_TEXT(r->review_id), SQ_TEXT(r->text),
                            SQ_INT(r->rating), SQ_TEXT(r->lang), SQ_TEXT(r->reply),
                            SQ_INT(r->needs_human), SQ_REAL(r->sentiment), SQ_INT(r->cached),
                            SQ_TEXT(r->model), SQ_INT(created),
                            SQ_TEXT(store_review_status_names[r->status])),
                    &changes, "reply insert", err);
    /* DO NOTHING on conflict: no change means the key was there already */
    *existed = res == AR_OK && changes == 0;
    if (res != AR_OK)
        goto out;
    res = exec_args(st, S_CLAIM_END, SQ_ARGS(SQ_TEXT(r->shop_id), SQ_TEXT(r->review_id)), NULL,
                    stmt_sql[S_CLAIM_END], err);
    if (res != AR_OK)
        goto out;
    if (out && *existed) {
        /* rows are never deleted, so the existing row is still there */
        res = reply_get_locked(st, r->shop_id, r->review_id, out, &found, err);
        if (res == AR_OK && !found)
            res = ar_err_set(err, AR_EIO, 0, "store: reply vanished after insert");
        if (res != AR_OK)
            goto out;
    }
    res = tx_commit(st, err);
out:
    if (res != AR_OK) {
        tx_rollback(st);
        store_reply_fini(out);
    }
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_reply_claim(struct store *base, const char *shop_id, const char *review_id,
                                     const char *owner, double lease_s, enum store_claim *out,
                                     struct store_reply *row, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    bool found = false;
    int taken = 0;
    pthread_mutex_lock(&st->mu);
    /* a review answered already needs no write lock */
    res = reply_get_locked(st, shop_id, review_id, row, &found, err);
    if (res != AR_OK || found) {
        if (found)
            *out = STORE_CLAIM_STORED;
        goto out;
    }
    /* the write lock orders this against every other process's claims and puts */
    if ((res = tx_begin(st, err)) != AR_OK)
        goto out;
    if ((res = reply_get_locked(st, shop_id, review_id, row, &found, err)) != AR_OK)
        goto out;
    if (found) {
        *out = STORE_CLAIM_STORED;
        res = tx_commit(st, err);
        goto out;
    }
    res = exec_args(st, S_CLAIM_TAKE,
                    SQ_ARGS(SQ_TEXT(shop_id), SQ_TEXT(review_id), SQ_TEXT(owner), SQ_REAL(lease_s)),
                    &taken, "reply claim", err);
    if (res != AR_OK)
        goto out;
    if ((res = tx_commit(st, err)) == AR_OK)
        *out = taken ? STORE_CLAIM_OWNED : STORE_CLAIM_HELD;
out:
    if (res != AR_OK) {
        tx_rollback(st);
        store_reply_fini(row);
        *out = STORE_CLAIM_HELD;
    }
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_reply_unclaim(struct store *base, const char *shop_id,
                                       const char *review_id, const char *owner, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    pthread_mutex_lock(&st->mu);
    res = exec_args(st, S_CLAIM_DROP, SQ_ARGS(SQ_TEXT(shop_id), SQ_TEXT(review_id), SQ_TEXT(owner)),
                    NULL, stmt_sql[S_CLAIM_DROP], err);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_reply_claims_release(struct store *base, const char *owner_prefix,
                                              int64_t *n_out, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    int changes = 0;
    pthread_mutex_lock(&st->mu);
    res = exec_args(st, S_CLAIM_RELEASE, SQ_ARGS(SQ_TEXT(owner_prefix)), &changes, "claims release",
                    err);
    if (res == AR_OK)
        *n_out = changes;
    pthread_mutex_unlock(&st->mu);
    return res;
}

/* ---- jobs --------------------------------------------------------------------------- */

static enum store_item_status item_status_at(sqlite3_stmt *s, int col)
{
    return store_item_status_of((const char *)sqlite3_column_text(s, col));
}

static void job_from_row(sqlite3_stmt *s, struct store_job_info *info)
{
    store_job_info_init(info, (const char *)sqlite3_column_text(s, 0),
                        (const char *)sqlite3_column_text(s, 1),
                        (const char *)sqlite3_column_text(s, 7));
    info->n_total = sqlite3_column_int64(s, 2);
    info->n_done = sqlite3_column_int64(s, 3);
    info->n_failed = sqlite3_column_int64(s, 4);
    info->created_s = sqlite3_column_int64(s, 5);
    info->updated_s = sqlite3_column_int64(s, 6);
    info->published = sqlite3_column_int(s, 8) != 0;
    store_job_info_owner(info, (const char *)sqlite3_column_text(s, 9),
                         (const char *)sqlite3_column_text(s, 12));
    info->bytes = sqlite3_column_int64(s, 10);
    info->seq = sqlite3_column_int64(s, 11);
    info->notified = sqlite3_column_int(s, 13) != 0;
}

static enum ar_status sq_job_create(struct store *base, const char *id,
                                    const struct store_job_spec *spec, int64_t bytes,
                                    const struct store_item_in *items, size_t n, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    int64_t now = store_now_s();
    pthread_mutex_lock(&st->mu);
    res = tx_begin(st, err);
    if (res == AR_OK)
        res = exec_args(st, S_JOB_INSERT,
                        SQ_ARGS(SQ_TEXT(id), SQ_TEXT(spec->shop_id), SQ_INT(n), SQ_INT(now),
                                SQ_TEXT(spec->owner), SQ_INT(bytes), SQ_TEXT(spec->callback_url)),
                        NULL, "job insert", err);
    for (size_t i = 0; i < n && res == AR_OK; i++)
        res = exec_args(st, S_ITEM_INSERT,
                        SQ_ARGS(SQ_TEXT(id), SQ_INT(items[i].line), SQ_TEXT(items[i].input)), NULL,
                        "job line insert (duplicate line number?)", err);
    res = tx_end(st, res, err);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_job_next_pending(struct store *base, const char *job_id,
                                          int64_t after_line, size_t max,
                                          struct store_item **items_out, size_t *n_out,
                                          struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    struct store_item *items = NULL;
    size_t n = 0, cap = 0;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_ITEM_PENDING];
    rc = bind_args(s, SQ_ARGS(SQ_TEXT(job_id), SQ_INT(after_line),
                              SQ_INT(max > INT64_MAX ? INT64_MAX : (int64_t)max)));
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : AR_MIN(max, 64);
            struct store_item *p = ar_realloc(items, ncap * sizeof(*items));
            if (!p) {
                res = AR_ENOMEM;
                break;
            }
            items = p;
            cap = ncap;
        }
        res = store_item_copy(&items[n], sqlite3_column_int64(s, 0), STORE_ITEM_PENDING,
                              (const char *)sqlite3_column_text(s, 1), NULL);
        if (res != AR_OK)
            break;
        n++;
        rc = SQLITE_OK;
    }
    if (res == AR_OK && rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "pending lines");
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    if (res != AR_OK) {
        store_items_free(items, n);
        return res;
    }
    if (n == 0) {
        ar_free(items);
        items = NULL;
    }
    *items_out = items;
    *n_out = n;
    return AR_OK;
}

static enum ar_status sq_job_item_finish(struct store *base, const char *job_id, int64_t line,
                                         enum store_item_status status, const char *text,
                                         struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    sqlite3_stmt *s;
    int rc, changed = 0;
    pthread_mutex_lock(&st->mu);
    if ((res = tx_begin(st, err)) != AR_OK)
        goto out;
    res = exec_args(st, S_ITEM_FINISH,
                    SQ_ARGS(SQ_TEXT(job_id), SQ_INT(line), SQ_TEXT(store_item_status_names[status]),
                            SQ_TEXT(text)),
                    &changed, "line update", err);
    if (res != AR_OK)
        goto out;
    if (changed == 0) {
        /* say why: no such line, or finished already */
        s = st->stmt[S_ITEM_STATUS];
        rc = step_args(s, SQ_ARGS(SQ_TEXT(job_id), SQ_INT(line)));
        if (rc == SQLITE_ROW)
            res = ar_err_set(err, AR_EINVAL, 0, "store: job %s line %lld is already %s", job_id,
                             (long long)line, (const char *)sqlite3_column_text(s, 0));
        else if (rc == SQLITE_DONE)
            res = ar_err_set(err, AR_EINVAL, 0, "store: job %s has no line %lld", job_id,
                             (long long)line);
        else
            res = db_fail(st, rc, err, "line lookup");
        stmt_done(s);
        goto out;
    }
    res = exec_args(st, S_JOB_COUNT,
                    SQ_ARGS(SQ_TEXT(job_id), SQ_INT(status == STORE_ITEM_DONE),
                            SQ_INT(status == STORE_ITEM_ERROR), SQ_INT(store_now_s())),
                    NULL, "job counts", err);
out:
    res = tx_end(st, res, err);
    pthread_mutex_unlock(&st->mu);
    return res;
}

/* Runs an UPDATE of one job by id (?1) with an optional status (?2) and time (?3). */
static enum ar_status job_update(struct sqlite_store *st, enum stmt_id id, const char *job_id,
                                 const char *status, struct ar_err *err)
{
    const struct sq_arg args[] = {SQ_TEXT(job_id), SQ_TEXT(status), SQ_INT(store_now_s())};
    enum ar_status res;
    int changes = 0;
    pthread_mutex_lock(&st->mu);
    res = exec_args(st, id, args, status ? 3 : 1, &changes, "job update", err);
    if (res == AR_OK && changes == 0)
        res = ar_err_set(err, AR_EINVAL, 0, "store: no job %s", job_id);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_job_set_status(struct store *base, const char *job_id,
                                        enum store_job_status status, struct ar_err *err)
{
    return job_update((struct sqlite_store *)base, S_JOB_SET_STATUS, job_id,
                      store_job_status_names[status], err);
}

static enum ar_status sq_job_set_published(struct store *base, const char *job_id,
                                           struct ar_err *err)
{
    return job_update((struct sqlite_store *)base, S_JOB_SET_PUBLISHED, job_id, NULL, err);
}

static enum ar_status sq_job_item_get(struct store *base, const char *job_id, int64_t line,
                                      struct store_item *out, bool *found, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_ITEM_GET];
    rc = step_args(s, SQ_ARGS(SQ_TEXT(job_id), SQ_INT(line)));
    if (rc == SQLITE_ROW) {
        res = store_item_copy(out, sqlite3_column_int64(s, 0), item_status_at(s, 1),
                              (const char *)sqlite3_column_text(s, 2),
                              (const char *)sqlite3_column_text(s, 3));
        *found = res == AR_OK;
    } else if (rc != SQLITE_DONE) {
        res = db_fail(st, rc, err, "line lookup");
    }
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

/* Reads one job with the mutex held. */
static enum ar_status job_get_locked(struct sqlite_store *st, const char *job_id,
                                     struct store_job_info *info, bool *found, struct ar_err *err)
{
    sqlite3_stmt *s = st->stmt[S_JOB_GET];
    enum ar_status res = AR_OK;
    int rc = step_args(s, SQ_ARGS(SQ_TEXT(job_id)));
    *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW)
        job_from_row(s, info);
    else if (rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "job lookup");
    stmt_done(s);
    return res;
}

static enum ar_status sq_job_get(struct store *base, const char *job_id,
                                 struct store_job_info *info, bool *found, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    pthread_mutex_lock(&st->mu);
    res = job_get_locked(st, job_id, info, found, err);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_job_results(struct store *base, const char *job_id, int64_t after_line,
                                     size_t limit, store_item_fn fn, void *user, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    struct store_job_info info;
    enum ar_status res;
    bool found = false;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    if ((res = job_get_locked(st, job_id, &info, &found, err)) != AR_OK)
        goto out;
    if (!found) {
        res = ar_err_set(err, AR_EINVAL, 0, "store: no job %s", job_id);
        goto out;
    }
    if (after_line > 0 || limit > 0) {
        s = st->stmt[S_JOB_ITEMS_PAGE];
        rc = bind_args(s, SQ_ARGS(SQ_TEXT(job_id), SQ_INT(after_line),
                                  SQ_INT(limit ? (int64_t)limit : INT64_MAX)));
    } else {
        s = st->stmt[S_JOB_ITEMS];
        rc = bind_args(s, SQ_ARGS(SQ_TEXT(job_id)));
    }
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct store_item it;
        it.line = sqlite3_column_int64(s, 0);
        it.status = item_status_at(s, 1);
        it.input = (const char *)sqlite3_column_text(s, 2);
        it.result = (const char *)sqlite3_column_text(s, 3);
        it.storage = NULL;
        if (!it.input)
            it.input = "";
        if (!fn(&it, user)) {
            res = AR_ECANCELED;
            break;
        }
        rc = SQLITE_OK;
    }
    /* one SELECT reads one snapshot, so lines finished meanwhile appear whole or not */
    if (res == AR_OK && rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "job lines");
    stmt_done(s);
out:
    pthread_mutex_unlock(&st->mu);
    return res;
}

/* Calls fn for each job statement id (no values) returns. */
static enum ar_status jobs_each(struct sqlite_store *st, enum stmt_id id, store_job_fn fn,
                                void *user, struct ar_err *err)
{
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[id];
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct store_job_info info;
        job_from_row(s, &info);
        if (!fn(&info, user)) {
            res = AR_ECANCELED;
            break;
        }
    }
    if (res == AR_OK && rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "jobs");
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_jobs_unfinished(struct store *base, store_job_fn fn, void *user,
                                         struct ar_err *err)
{
    return jobs_each((struct sqlite_store *)base, S_JOBS_UNFINISHED, fn, user, err);
}

static enum ar_status sq_jobs_unnotified(struct store *base, store_job_fn fn, void *user,
                                         struct ar_err *err)
{
    return jobs_each((struct sqlite_store *)base, S_JOBS_UNNOTIFIED, fn, user, err);
}

static enum ar_status sq_jobs_list(struct store *base, const char *owner, int64_t before_seq,
                                   size_t limit, store_job_fn fn, void *user, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_JOBS_LIST];
    rc = bind_args(
        s, SQ_ARGS(SQ_TEXT(owner), SQ_INT(before_seq > 0 ? before_seq : INT64_MAX), SQ_INT(limit)));
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct store_job_info info;
        job_from_row(s, &info);
        if (!fn(&info, user)) {
            res = AR_ECANCELED;
            break;
        }
        rc = SQLITE_OK;
    }
    if (res == AR_OK && rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "jobs list");
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_job_usage(struct store *base, const char *owner, int64_t *open_jobs,
                                   int64_t *bytes, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_JOB_USAGE];
    rc = step_args(s, SQ_ARGS(SQ_TEXT(owner)));
    if (rc == SQLITE_ROW) {
        *open_jobs = sqlite3_column_int64(s, 0);
        *bytes = sqlite3_column_int64(s, 1);
    } else {
        res = db_fail(st, rc, err, "job usage");
    }
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_job_cancel(struct store *base, const char *job_id, bool *cancelled,
                                    struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    int changes = 0;
    pthread_mutex_lock(&st->mu);
    res = exec_args(st, S_JOB_CANCEL, SQ_ARGS(SQ_TEXT(job_id), SQ_INT(store_now_s())), &changes,
                    "job cancel", err);
    *cancelled = res == AR_OK && changes > 0;
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_job_delete(struct store *base, const char *job_id, bool *found,
                                    struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    int changes = 0;
    pthread_mutex_lock(&st->mu);
    res = tx_begin(st, err);
    if (res == AR_OK)
        res = exec_args(st, S_JOB_DELETE_ITEMS, SQ_ARGS(SQ_TEXT(job_id)), NULL, "job lines delete",
                        err);
    if (res == AR_OK)
        res = exec_args(st, S_JOB_DELETE, SQ_ARGS(SQ_TEXT(job_id)), &changes, "job delete", err);
    res = tx_end(st, res, err);
    *found = res == AR_OK && changes > 0;
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_job_claim_notify(struct store *base, const char *job_id, bool *claimed,
                                          struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    int changes = 0;
    pthread_mutex_lock(&st->mu);
    res = exec_args(st, S_JOB_CLAIM_NOTIFY, SQ_ARGS(SQ_TEXT(job_id)), &changes, "job notify", err);
    *claimed = res == AR_OK && changes > 0;
    pthread_mutex_unlock(&st->mu);
    return res;
}

/* ---- the review workflow ------------------------------------------------------------------ */

static enum ar_status sq_reviews_list(struct store *base, const struct store_review_filter *f,
                                      const struct store_review_cursor *after, size_t limit,
                                      store_reply_fn fn, void *user, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_REVIEWS_LIST];
    rc = bind_args(s, SQ_ARGS(SQ_TEXT(f->status < 0 ? "" : store_review_status_names[f->status]),
                              SQ_TEXT(f->shop_id), SQ_INT(f->rating), SQ_REAL(f->sentiment_min),
                              SQ_REAL(f->sentiment_max), SQ_INT(after->created_s),
                              SQ_TEXT(after->shop_id), SQ_TEXT(after->review_id),
                              SQ_INT(limit)));
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct store_reply r;
        if ((res = reply_from_row(s, &r)) != AR_OK)
            break;
        if (!fn(&r, user))
            res = AR_ECANCELED;
        store_reply_fini(&r);
        if (res != AR_OK)
            break;
        rc = SQLITE_OK;
    }
    if (res == AR_OK && rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "reviews list");
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_review_change(struct store *base, const struct store_review_change *c,
                                       int64_t now, struct store_reply *out,
                                       enum store_change_result *result, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    struct store_reply row, after;
    enum ar_status res;
    bool found = false;
    memset(&row, 0, sizeof(row));
    pthread_mutex_lock(&st->mu);
    /* the write lock from the read on: the check and the change see the same row */
    if ((res = tx_begin(st, err)) != AR_OK)
        goto out;
    if ((res = reply_get_locked(st, c->shop_id, c->review_id, &row, &found, err)) != AR_OK)
        goto out;
    if (!found) {
        *result = STORE_CHANGE_NOT_FOUND;
        goto out;
    }
    if (!(c->from_mask & (1u << row.status))) {
        *result = STORE_CHANGE_REFUSED;
        if (out) {
            *out = row;
            memset(&row, 0, sizeof(row));
        }
        goto out;
    }
    after = row;
    after.status = c->to;
    after.updated_s = now;
    if (c->reply)
        after.reply = c->reply;
    res = exec_args(st, S_REVIEW_SET,
                    SQ_ARGS(SQ_TEXT(c->shop_id), SQ_TEXT(c->review_id),
                            SQ_TEXT(store_review_status_names[c->to]), SQ_TEXT(after.reply),
                            SQ_INT(now)),
                    NULL, "review update", err);
    if (res == AR_OK)
        res = exec_args(st, S_AUDIT_INSERT,
                        SQ_ARGS(SQ_TEXT(c->shop_id), SQ_TEXT(c->review_id), SQ_INT(now),
                                SQ_TEXT(c->key), SQ_TEXT(c->action), SQ_TEXT(row.reply),
                                SQ_TEXT(after.reply), SQ_TEXT(store_review_status_names[row.status]),
                                SQ_TEXT(store_review_status_names[c->to])),
                        NULL, "audit insert", err);
    if (res == AR_OK && out)
        res = store_reply_copy(&after, row.created_s, out);
    if (res == AR_OK)
        *result = STORE_CHANGED;
out:
    res = tx_end(st, res, err);
    pthread_mutex_unlock(&st->mu);
    store_reply_fini(&row);
    if (res != AR_OK)
        store_reply_fini(out);
    return res;
}

static enum ar_status sq_review_audit(struct store *base, const char *shop_id,
                                      const char *review_id, store_audit_fn fn, void *user,
                                      struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_AUDIT_LIST];
    rc = bind_args(s, SQ_ARGS(SQ_TEXT(shop_id), SQ_TEXT(review_id)));
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct store_audit a;
        a.at_s = sqlite3_column_int64(s, 0);
        a.key = (const char *)sqlite3_column_text(s, 1);
        a.action = (const char *)sqlite3_column_text(s, 2);
        a.before = (const char *)sqlite3_column_text(s, 3);
        a.after = (const char *)sqlite3_column_text(s, 4);
        a.from = store_review_status_of((const char *)sqlite3_column_text(s, 5));
        a.to = store_review_status_of((const char *)sqlite3_column_text(s, 6));
        if (!fn(&a, user)) {
            res = AR_ECANCELED;
            break;
        }
        rc = SQLITE_OK;
    }
    if (res == AR_OK && rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "audit list");
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_shop_put(struct store *base, const char *shop_id, const char *json,
                                  int64_t now, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res;
    pthread_mutex_lock(&st->mu);
    res = exec_args(st, S_SHOP_PUT, SQ_ARGS(SQ_TEXT(shop_id), SQ_TEXT(json), SQ_INT(now)), NULL,
                    "shop profile put", err);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_shop_get(struct store *base, const char *shop_id, char **json,
                                  int64_t *updated_s, bool *found, struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_SHOP_GET];
    rc = step_args(s, SQ_ARGS(SQ_TEXT(shop_id)));
    if (rc == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        *json = ar_strdup(t ? t : "");
        *updated_s = sqlite3_column_int64(s, 1);
        *found = *json != NULL;
        if (!*json)
            res = AR_ENOMEM;
    } else if (rc != SQLITE_DONE) {
        res = db_fail(st, rc, err, "shop profile lookup");
    }
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static enum ar_status sq_shops_list(struct store *base, store_shop_fn fn, void *user,
                                    struct ar_err *err)
{
    struct sqlite_store *st = (struct sqlite_store *)base;
    enum ar_status res = AR_OK;
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = st->stmt[S_SHOPS_LIST];
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (!fn((const char *)sqlite3_column_text(s, 0), (const char *)sqlite3_column_text(s, 1),
                sqlite3_column_int64(s, 2), user)) {
            res = AR_ECANCELED;
            break;
        }
    }
    if (res == AR_OK && rc != SQLITE_DONE)
        res = db_fail(st, rc, err, "shop profiles");
    stmt_done(s);
    pthread_mutex_unlock(&st->mu);
    return res;
}

static const struct store_ops sqlite_ops = {
    .name = "sqlite",
    .close = sq_close,
    .reply_get = sq_reply_get,
    .reply_put = sq_reply_put,
    .reply_claim = sq_reply_claim,
    .reply_unclaim = sq_reply_unclaim,
    .reply_claims_release = sq_reply_claims_release,
    .job_create = sq_job_create,
    .job_next_pending = sq_job_next_pending,
    .job_item_finish = sq_job_item_finish,
    .job_item_get = sq_job_item_get,
    .job_set_status = sq_job_set_status,
    .job_set_published = sq_job_set_published,
    .job_get = sq_job_get,
    .job_results = sq_job_results,
    .jobs_unfinished = sq_jobs_unfinished,
    .jobs_list = sq_jobs_list,
    .job_usage = sq_job_usage,
    .job_cancel = sq_job_cancel,
    .job_delete = sq_job_delete,
    .job_claim_notify = sq_job_claim_notify,
    .jobs_unnotified = sq_jobs_unnotified,
    .reviews_list = sq_reviews_list,
    .review_change = sq_review_change,
    .review_audit = sq_review_audit,
    .shop_put = sq_shop_put,
    .shop_get = sq_shop_get,
    .shops_list = sq_shops_list,
};
