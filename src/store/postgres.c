/* postgres.c - the PostgreSQL store that a fleet of instances shares: the schema versioned in
 * schema_migrations and migrated at open under an advisory lock; a small pool of connections
 * with prepared statements (each prepared on first use per connection); every wait bounded by
 * a deadline on the client's side beside the server's statement timeout; a broken connection
 * replaced by a new one, with a growing pause between failed attempts (AR_EUNAVAIL at once
 * meanwhile). Arguments arrive checked (store_replies.c, store_jobs.c); every value is bound,
 * never spliced. */
#include "base/deadline.h"
#include "store_internal.h"

#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* the client waits for an answer this long beyond the statement timeout */
#define PG_MARGIN_S 2.0
/* pauses between failed connection attempts grow from the first to the last */
#define PG_BACKOFF_FIRST_S 0.05
#define PG_BACKOFF_LAST_S 1.0
/* lines per INSERT when a job is created */
#define PG_ITEMS_PER_INSERT 500
/* lines per SELECT when a job's results are read */
#define PG_RESULTS_PAGE 500
#define PG_STR_(x) #x
#define PG_STR(x) PG_STR_(x)
/* pg_advisory_xact_lock key that serialises migrations ("autorply" in ASCII) */
#define PG_MIGRATION_LOCK 0x6175746f72706c79LL

/* ---- schema ------------------------------------------------------------------------- */

/* migrations[v] moves a database from version v to v + 1. Append only. */
static const char *const migrations[] = {
    "CREATE TABLE replies ("
    "  shop_id text NOT NULL,"
    "  review_id text NOT NULL,"
    "  review_text text NOT NULL,"
    "  rating integer NOT NULL CHECK (rating BETWEEN 1 AND 5),"
    "  lang text NOT NULL,"
    "  reply text NOT NULL,"
    "  needs_human boolean NOT NULL,"
    "  sentiment double precision NOT NULL,"
    "  cached boolean NOT NULL,"
    "  model text NOT NULL,"
    "  created_s bigint NOT NULL,"
    "  PRIMARY KEY (shop_id, review_id));"
    "CREATE TABLE reply_claims ("
    "  shop_id text NOT NULL,"
    "  review_id text NOT NULL,"
    "  owner text NOT NULL,"
    "  expires_at timestamptz NOT NULL,"
    "  PRIMARY KEY (shop_id, review_id));"
    "CREATE TABLE jobs ("
    "  id text PRIMARY KEY,"
    "  seq bigserial NOT NULL,"
    "  status text NOT NULL"
    "    CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),"
    "  shop_id text NOT NULL,"
    "  n_total bigint NOT NULL,"
    "  n_done bigint NOT NULL DEFAULT 0,"
    "  n_failed bigint NOT NULL DEFAULT 0,"
    "  created_s bigint NOT NULL,"
    "  updated_s bigint NOT NULL,"
    "  published boolean NOT NULL DEFAULT false);"
    "CREATE INDEX jobs_by_status ON jobs (status, created_s, seq);"
    "CREATE TABLE job_items ("
    "  job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    "  line bigint NOT NULL,"
    "  input text NOT NULL,"
    "  status text NOT NULL CHECK (status IN ('pending', 'done', 'error')),"
    "  result text,"
    "  PRIMARY KEY (job_id, line));"
    "CREATE INDEX job_items_by_status ON job_items (job_id, status, line);",
    /* 1 -> 2: a job belongs to who created it (jobs from before belong to "": nobody the
     * HTTP API names), keeps its size for quotas (computed for the jobs there are), an
     * optional completion callback, and whether its completion notice was claimed */
    "ALTER TABLE jobs ADD COLUMN owner text NOT NULL DEFAULT '',"
    "  ADD COLUMN bytes bigint NOT NULL DEFAULT 0,"
    "  ADD COLUMN callback_url text NOT NULL DEFAULT '',"
    "  ADD COLUMN notified boolean NOT NULL DEFAULT false;"
    "UPDATE jobs SET bytes = coalesce((SELECT sum(octet_length(input)) FROM job_items "
    "  WHERE job_id = jobs.id), 0);"
    "CREATE INDEX jobs_by_owner ON jobs (owner, seq);"
    /* the few jobs whose completion notice is still to be claimed (the sweeper's look) */
    "CREATE INDEX jobs_to_notify ON jobs (seq) "
    "  WHERE status = 'done' AND NOT notified AND callback_url <> '';",
    /* 2 -> 3: the review workflow. A reply has a status and the time of its last change;
     * the store never kept the action of replies from before, so they read as pending (a
     * person sees them once). Every change by a person is kept in review_audit; a shop's
     * profile saved through the API in shop_profiles. */
    "ALTER TABLE replies ADD COLUMN status text NOT NULL DEFAULT 'pending'"
    "  CHECK (status IN ('pending', 'approved', 'sent', 'rejected')),"
    "  ADD COLUMN updated_s bigint NOT NULL DEFAULT 0;"
    "UPDATE replies SET updated_s = created_s;"
    "CREATE INDEX replies_by_created ON replies (created_s, shop_id, review_id);"
    "CREATE INDEX replies_by_status ON replies (status, created_s, shop_id, review_id);"
    "CREATE TABLE review_audit ("
    "  id bigserial PRIMARY KEY,"
    "  shop_id text NOT NULL,"
    "  review_id text NOT NULL,"
    "  at_s bigint NOT NULL,"
    "  api_key text NOT NULL,"
    "  action text NOT NULL,"
    "  reply_before text NOT NULL,"
    "  reply_after text NOT NULL,"
    "  from_status text NOT NULL,"
    "  to_status text NOT NULL);"
    "CREATE INDEX review_audit_by_review ON review_audit (shop_id, review_id, id);"
    "CREATE TABLE shop_profiles ("
    "  shop_id text PRIMARY KEY,"
    "  profile text NOT NULL,"
    "  updated_s bigint NOT NULL);",
};
#define PG_SCHEMA_VERSION STORE_PG_SCHEMA_VERSION
_Static_assert(AR_ARRAY_LEN(migrations) == STORE_PG_SCHEMA_VERSION, "one migration per version");

/* ---- statements --------------------------------------------------------------------- */

enum pg_stmt {
    P_REPLY_GET,
    P_REPLY_PUT,
    P_CLAIM_TAKE,
    P_CLAIM_DROP,
    P_CLAIM_RELEASE,
    P_JOB_INSERT,
    P_ITEMS_INSERT,
    P_ITEM_PENDING,
    P_ITEM_FINISH,
    P_ITEM_STATUS,
    P_ITEM_GET,
    P_JOB_SET_STATUS,
    P_JOB_SET_PUBLISHED,
    P_JOB_GET,
    P_JOB_ITEMS,
    P_JOBS_UNFINISHED,
    P_JOBS_LIST,
    P_JOB_USAGE,
    P_JOB_CANCEL,
    P_JOB_DELETE,
    P_JOB_CLAIM_NOTIFY,
    P_JOBS_UNNOTIFIED,
    P_REVIEWS_LIST,
    P_REVIEW_LOCK,
    P_REVIEW_SET,
    P_AUDIT_INSERT,
    P_AUDIT_LIST,
    P_SHOP_PUT,
    P_SHOP_GET,
    P_SHOPS_LIST,
    P_COUNT
};
_Static_assert(P_COUNT <= 64, "pg_conn.prepared has a bit per statement");

#define REPLY_COLS                                                                                 \
    "shop_id, review_id, review_text, rating, lang, reply, needs_human, sentiment, cached, "       \
    "model, created_s, status, updated_s"
#define JOB_COLS                                                                                   \
    "id, status, n_total, n_done, n_failed, created_s, updated_s, shop_id, published, owner, "    \
    "bytes, seq, callback_url, notified"

static const char *const stmt_sql[P_COUNT] = {
    [P_REPLY_GET] = "SELECT " REPLY_COLS " FROM replies WHERE shop_id = $1 AND review_id = $2",
    /* one statement, so one transaction: the claim ends with the insert */
    [P_REPLY_PUT] =
        "WITH ended AS (DELETE FROM reply_claims WHERE shop_id = $1 AND review_id = $2),"
        " ins AS (INSERT INTO replies (" REPLY_COLS ") "
        "  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $11) "
        "  ON CONFLICT (shop_id, review_id) DO NOTHING RETURNING 1) "
        "SELECT count(*) FROM ins",
    /* a new claim, one whose lease expired, or the owner's own: a row back means taken. The
     * lease runs on the database's clock. */
    [P_CLAIM_TAKE] = "INSERT INTO reply_claims AS c (shop_id, review_id, owner, expires_at) "
                     "VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4::float8)) "
                     "ON CONFLICT (shop_id, review_id) DO UPDATE "
                     "SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at "
                     "WHERE c.expires_at <= clock_timestamp() OR c.owner = EXCLUDED.owner "
                     "RETURNING owner",
    [P_CLAIM_DROP] = "DELETE FROM reply_claims WHERE shop_id = $1 AND review_id = $2 "
                     "AND owner = $3",
    [P_CLAIM_RELEASE] = "DELETE FROM reply_claims WHERE left(owner, length($1)) = $1",
    [P_JOB_INSERT] = "INSERT INTO jobs (id, status, shop_id, n_total, created_s, updated_s, "
                     "published, owner, bytes, callback_url) "
                     "VALUES ($1, 'queued', $2, $3, $4, $4, false, $5, $6, $7)",
    [P_ITEMS_INSERT] = "INSERT INTO job_items (job_id, line, input, status) "
                       "SELECT $1, t.line, t.input, 'pending' "
                       "FROM unnest($2::bigint[], $3::text[]) AS t (line, input)",
    [P_ITEM_PENDING] = "SELECT line, input FROM job_items "
                       "WHERE job_id = $1 AND status = 'pending' AND line > $2 "
                       "ORDER BY line LIMIT $3",
    /* the line changes only from pending, and the job is counted only when it did, in one
     * statement: a line finished by two instances at once is counted once */
    [P_ITEM_FINISH] = "WITH item AS (UPDATE job_items SET status = $3, result = $4 "
                      "  WHERE job_id = $1 AND line = $2 AND status = 'pending' RETURNING 1) "
                      "UPDATE jobs SET n_done = n_done + $5::bigint, "
                      "n_failed = n_failed + $6::bigint, updated_s = $7, status = CASE "
                      "  WHEN status NOT IN ('queued', 'running') THEN status "
                      "  WHEN n_done + $5::bigint + n_failed + $6::bigint >= n_total THEN 'done' "
                      "  ELSE 'running' END "
                      "FROM item WHERE id = $1 RETURNING 1",
    [P_ITEM_STATUS] = "SELECT status FROM job_items WHERE job_id = $1 AND line = $2",
    [P_ITEM_GET] = "SELECT line, status, input, result FROM job_items "
                   "WHERE job_id = $1 AND line = $2",
    [P_JOB_SET_STATUS] = "UPDATE jobs SET status = $2, updated_s = $3 WHERE id = $1",
    [P_JOB_SET_PUBLISHED] = "UPDATE jobs SET published = true WHERE id = $1",
    [P_JOB_GET] = "SELECT " JOB_COLS " FROM jobs WHERE id = $1",
    [P_JOB_ITEMS] = "SELECT line, status, input, result FROM job_items "
                    "WHERE job_id = $1 AND line > $2 ORDER BY line LIMIT $3",
    [P_JOBS_UNFINISHED] = "SELECT " JOB_COLS " FROM jobs "
                          "WHERE status IN ('queued', 'running') ORDER BY created_s, seq",
    [P_JOBS_LIST] = "SELECT " JOB_COLS " FROM jobs WHERE owner = $1 AND seq < $2 "
                    "ORDER BY seq DESC LIMIT $3",
    [P_JOB_USAGE] = "SELECT count(*) FILTER (WHERE status IN ('queued', 'running')), "
                    "coalesce(sum(bytes), 0) FROM jobs WHERE owner = $1",
    [P_JOB_CANCEL] = "UPDATE jobs SET status = 'cancelled', updated_s = $2 "
                     "WHERE id = $1 AND status IN ('queued', 'running')",
    /* the lines go with the job (ON DELETE CASCADE) */
    [P_JOB_DELETE] = "DELETE FROM jobs WHERE id = $1",
    [P_JOB_CLAIM_NOTIFY] = "UPDATE jobs SET notified = true WHERE id = $1 AND status = 'done' "
                           "AND NOT notified AND callback_url <> ''",
    [P_JOBS_UNNOTIFIED] = "SELECT " JOB_COLS " FROM jobs WHERE status = 'done' AND NOT notified "
                          "AND callback_url <> '' ORDER BY seq LIMIT 100",
    /* "" and 0 match anything; the cursor is the last row of the previous page (the largest
     * bigint before the first page), compared as a row value in the list's order */
    [P_REVIEWS_LIST] = "SELECT " REPLY_COLS " FROM replies "
                       "WHERE ($1::text = '' OR status = $1::text) "
                       "AND ($2::text = '' OR shop_id = $2::text) "
                       "AND ($3::int = 0 OR rating = $3::int) "
                       "AND sentiment BETWEEN $4::float8 AND $5::float8 "
                       "AND (created_s, shop_id, review_id) < ($6::bigint, $7::text, $8::text) "
                       "ORDER BY created_s DESC, shop_id DESC, review_id DESC LIMIT $9::bigint",
    /* the row stays locked until the change commits: a second change waits, then reads the
     * status the first one left */
    [P_REVIEW_LOCK] = "SELECT " REPLY_COLS " FROM replies WHERE shop_id = $1 AND review_id = $2 "
                      "FOR UPDATE",
    [P_REVIEW_SET] = "UPDATE replies SET status = $3, reply = $4, updated_s = $5 "
                     "WHERE shop_id = $1 AND review_id = $2",
    [P_AUDIT_INSERT] = "INSERT INTO review_audit (shop_id, review_id, at_s, api_key, action, "
                       "reply_before, reply_after, from_status, to_status) "
                       "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    [P_AUDIT_LIST] = "SELECT at_s, api_key, action, reply_before, reply_after, from_status, "
                     "to_status FROM review_audit WHERE shop_id = $1 AND review_id = $2 "
                     "ORDER BY id",
    [P_SHOP_PUT] = "INSERT INTO shop_profiles (shop_id, profile, updated_s) VALUES ($1, $2, $3) "
                   "ON CONFLICT (shop_id) DO UPDATE "
                   "SET profile = EXCLUDED.profile, updated_s = EXCLUDED.updated_s",
    [P_SHOP_GET] = "SELECT profile, updated_s FROM shop_profiles WHERE shop_id = $1",
    [P_SHOPS_LIST] = "SELECT shop_id, profile, updated_s FROM shop_profiles ORDER BY shop_id",
};

/* what each statement is called in messages */
static const char *const stmt_what[P_COUNT] = {
    [P_REPLY_GET] = "reply lookup",
    [P_REPLY_PUT] = "reply insert",
    [P_CLAIM_TAKE] = "reply claim",
    [P_CLAIM_DROP] = "reply unclaim",
    [P_CLAIM_RELEASE] = "claims release",
    [P_JOB_INSERT] = "job insert",
    [P_ITEMS_INSERT] = "job lines insert",
    [P_ITEM_PENDING] = "pending lines",
    [P_ITEM_FINISH] = "line update",
    [P_ITEM_STATUS] = "line lookup",
    [P_ITEM_GET] = "line lookup",
    [P_JOB_SET_STATUS] = "job status",
    [P_JOB_SET_PUBLISHED] = "job published",
    [P_JOB_GET] = "job lookup",
    [P_JOB_ITEMS] = "job lines",
    [P_JOBS_UNFINISHED] = "unfinished jobs",
    [P_JOBS_LIST] = "jobs list",
    [P_JOB_USAGE] = "job usage",
    [P_JOB_CANCEL] = "job cancel",
    [P_JOB_DELETE] = "job delete",
    [P_JOB_CLAIM_NOTIFY] = "job notify",
    [P_JOBS_UNNOTIFIED] = "jobs to notify",
    [P_REVIEWS_LIST] = "reviews list",
    [P_REVIEW_LOCK] = "review lookup",
    [P_REVIEW_SET] = "review update",
    [P_AUDIT_INSERT] = "audit insert",
    [P_AUDIT_LIST] = "audit list",
    [P_SHOP_PUT] = "shop profile put",
    [P_SHOP_GET] = "shop profile lookup",
    [P_SHOPS_LIST] = "shop profiles",
};

static const int stmt_n_params[P_COUNT] = {
    [P_REPLY_GET] = 2,         [P_REPLY_PUT] = 12,  [P_CLAIM_TAKE] = 4,   [P_CLAIM_DROP] = 3,
    [P_CLAIM_RELEASE] = 1,     [P_JOB_INSERT] = 7,  [P_ITEMS_INSERT] = 3, [P_ITEM_PENDING] = 3,
    [P_ITEM_FINISH] = 7,       [P_ITEM_STATUS] = 2, [P_ITEM_GET] = 2,     [P_JOB_SET_STATUS] = 3,
    [P_JOB_SET_PUBLISHED] = 1, [P_JOB_GET] = 1,     [P_JOB_ITEMS] = 3,    [P_JOBS_UNFINISHED] = 0,
    [P_JOBS_LIST] = 3,         [P_JOB_USAGE] = 1,   [P_JOB_CANCEL] = 2,   [P_JOB_DELETE] = 1,
    [P_JOB_CLAIM_NOTIFY] = 1,  [P_JOBS_UNNOTIFIED] = 0,
    [P_REVIEWS_LIST] = 9,      [P_REVIEW_LOCK] = 2,     [P_REVIEW_SET] = 5,   [P_AUDIT_INSERT] = 9,
    [P_AUDIT_LIST] = 2,        [P_SHOP_PUT] = 3,        [P_SHOP_GET] = 1,     [P_SHOPS_LIST] = 0,
};

/* ---- the pool ----------------------------------------------------------------------- */

struct pg_conn {
    PGconn *c;
    uint64_t prepared;     /* bit i: statement i is prepared on this connection */
    uint64_t epoch;        /* the pool's epoch when it connected */
    bool reused;           /* taken from the idle list (it may have gone stale there) */
    bool broken;           /* must not go back to the pool */
    int n_ok;              /* statements that succeeded since it was taken */
    double stmt_timeout_s; /* the session's statement_timeout */
    struct pg_conn *next;  /* idle list */
};

struct pg_store {
    struct store base; /* first: the handle */
    char *url;
    pthread_mutex_t mu; /* guards the fields below */
    pthread_cond_t cv;  /* a connection went back, or a slot freed */
    struct pg_conn *idle;
    int n_open;         /* connections open, in use or idle, or being opened */
    uint64_t epoch;     /* bumped when a connection broke: older idle ones are dropped */
    double retry_at;    /* monotonic seconds: no connection attempt before */
    double backoff_s;   /* the pause after the next failed attempt */
    char down_msg[160]; /* why the last attempt failed */
    double wait_s;      /* the client's deadline for one answer, and for a free connection
                           (set at open from the first connection's statement timeout) */
};

static void pg_close(struct store *base);
static const struct store_ops pg_ops;

/* Maps an error result to a status, by SQLSTATE class (and the connection's state). */
static enum ar_status pg_status_of(PGconn *c, const PGresult *r)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (PQstatus(c) != CONNECTION_OK || !state)
        return AR_EUNAVAIL;
    if (strncmp(state, "08", 2) == 0 || strcmp(state, "57P01") == 0 ||
        strcmp(state, "57P02") == 0 || strcmp(state, "57P03") == 0)
        return AR_EUNAVAIL; /* connection exceptions, server shutting down or starting */
    if (strcmp(state, "57014") == 0 || strcmp(state, "55P03") == 0 ||
        strncmp(state, "40", 2) == 0 || strncmp(state, "53", 2) == 0)
        return AR_EBUSY; /* timeouts, lock waits, conflicts, out of resources */
    if (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0)
        return AR_EINVAL; /* bad data, constraint violations */
    return AR_EIO;
}

/* The first line of libpq's message (they end in a newline). */
static void first_line(char *dst, size_t size, const char *msg)
{
    size_t n = msg ? strcspn(msg, "\n") : 0;
    snprintf(dst, size, "%.*s", (int)AR_MIN(n, size - 1), msg ? msg : "");
}

static enum ar_status conn_error(struct pg_conn *pc, enum ar_status code, struct ar_err *err,
                                 const char *what, const char *msg)
{
    char line[200];
    first_line(line, sizeof(line), msg);
    if (code == AR_EUNAVAIL)
        pc->broken = true;
    return ar_err_set(err, code, 0, "postgres: %s: %s", what, line);
}

/* Waits for every result of the command sent last; *out (may be NULL) receives the last one
 * when all succeeded. Bounded by the pool's deadline: past it the connection is given up. */
static enum ar_status wait_results(struct pg_store *ps, struct pg_conn *pc, const char *what,
                                   PGresult **out, struct ar_err *err)
{
    double deadline = ar_time_s() + ps->wait_s;
    PGresult *keep = NULL, *bad = NULL;
    enum ar_status s;
    for (;;) {
        PGresult *r;
        while (PQisBusy(pc->c)) {
            double left = deadline - ar_time_s();
            struct pollfd p = {.fd = PQsocket(pc->c), .events = POLLIN};
            int n;
            if (left <= 0) {
                PQclear(keep);
                PQclear(bad);
                pc->broken = true;
                return ar_err_set(err, AR_EUNAVAIL, 0,
                                  "postgres: %s: no answer within %.1f s", what, ps->wait_s);
            }
            if (p.fd < 0) {
                PQclear(keep);
                PQclear(bad);
                return conn_error(pc, AR_EUNAVAIL, err, what, PQerrorMessage(pc->c));
            }
            n = poll(&p, 1, (int)(left * 1000.0) + 1);
            if (n < 0 && errno != EINTR) {
                PQclear(keep);
                PQclear(bad);
                return conn_error(pc, AR_EUNAVAIL, err, what, strerror(errno));
            }
            if (n > 0 && !PQconsumeInput(pc->c)) {
                PQclear(keep);
                PQclear(bad);
                return conn_error(pc, AR_EUNAVAIL, err, what, PQerrorMessage(pc->c));
            }
        }
        r = PQgetResult(pc->c);
        if (!r)
            break;
        if (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK) {
            PQclear(keep);
            keep = r;
        } else if (!bad) {
            bad = r;
        } else {
            PQclear(r);
        }
    }
    if (bad) {
        s = pg_status_of(pc->c, bad);
        conn_error(pc, s, err, what, PQresultErrorMessage(bad));
        PQclear(bad);
        PQclear(keep);
        return s;
    }
    if (PQstatus(pc->c) != CONNECTION_OK) {
        PQclear(keep);
        return conn_error(pc, AR_EUNAVAIL, err, what, PQerrorMessage(pc->c));
    }
    if (out)
        *out = keep;
    else
        PQclear(keep);
    return AR_OK;
}

/* Runs constant SQL (possibly several statements) through the simple protocol; what names it
 * in messages. */
static enum ar_status run_sql(struct pg_store *ps, struct pg_conn *pc, const char *sql,
                              const char *what, PGresult **out, struct ar_err *err)
{
    if (out)
        *out = NULL;
    if (!PQsendQuery(pc->c, sql))
        return conn_error(pc, pg_status_of(pc->c, NULL), err, what, PQerrorMessage(pc->c));
    return wait_results(ps, pc, what, out, err);
}

/* The server's notices (e.g. "already exists, skipping") are not for the user: libpq's own
 * processor would print them. */
static void notice_ignore(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static void conn_free(struct pg_conn *pc)
{
    if (!pc)
        return;
    PQfinish(pc->c);
    ar_free(pc);
}

/* The session's limits, where the URL's options leave them at 0 (none), and the statement
 * timeout in effect. */
#define PG_LIMIT_MS PG_STR(STORE_PG_STATEMENT_TIMEOUT_MS)
static const char session_sql[] =
    "SELECT set_config('statement_timeout', '" PG_LIMIT_MS "', false) "
    "WHERE current_setting('statement_timeout') = '0';"
    "SELECT set_config('lock_timeout', '" PG_LIMIT_MS "', false) "
    "WHERE current_setting('lock_timeout') = '0';"
    "SELECT set_config('idle_in_transaction_session_timeout', '" PG_LIMIT_MS "', false) "
    "WHERE current_setting('idle_in_transaction_session_timeout') = '0';"
    "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'";

/* Connects and sets the session's limits (those the URL's options leave at 0), learning the
 * statement timeout the client's deadline follows. */
static enum ar_status conn_connect(struct pg_store *ps, PGconn **out, double *stmt_timeout_s,
                                   struct ar_err *err)
{
    char connect_timeout[16];
    const char *kw[] = {"connect_timeout",
                        "application_name",
                        "keepalives",
                        "keepalives_idle",
                        "keepalives_interval",
                        "keepalives_count",
                        "tcp_user_timeout",
                        "dbname",
                        NULL};
    const char *val[] = {connect_timeout, "autoreply", "1", "10", "5", "3", "15000", ps->url, NULL};
    struct pg_conn tmp = {0};
    PGresult *r = NULL;
    enum ar_status s;
    char line[200];
    snprintf(connect_timeout, sizeof(connect_timeout), "%d", STORE_PG_CONNECT_TIMEOUT_S);
    *out = NULL;
    /* the keywords before dbname are defaults: the URL's own values replace them */
    tmp.c = PQconnectdbParams(kw, val, 1);
    if (!tmp.c)
        return ar_err_set(err, AR_ENOMEM, 0, "postgres: out of memory");
    if (PQstatus(tmp.c) != CONNECTION_OK) {
        /* a URL libpq cannot parse fails here too: say so rather than "unreachable" */
        PQconninfoOption *opts = PQconninfoParse(ps->url, NULL);
        first_line(line, sizeof(line), PQerrorMessage(tmp.c));
        PQfinish(tmp.c);
        if (!opts)
            return ar_err_set(err, AR_EINVAL, 0, "postgres: bad URL: %s", line);
        PQconninfoFree(opts);
        return ar_err_set(err, AR_EUNAVAIL, 0, "postgres: cannot connect: %s", line);
    }
    PQsetNoticeProcessor(tmp.c, notice_ignore, NULL);
    s = run_sql(ps, &tmp, session_sql, "session setup", &r, err);
    if (s == AR_OK && PQntuples(r) == 1) {
        double ms = strtod(PQgetvalue(r, 0, 0), NULL);
        if (ms > 0)
            *stmt_timeout_s = ms / 1000.0;
    }
    PQclear(r);
    if (s != AR_OK) {
        PQfinish(tmp.c);
        return s;
    }
    *out = tmp.c;
    return AR_OK;
}

/* Connects pc afresh, unless attempts are paused after a failure (then AR_EUNAVAIL at once).
 * Called without ps->mu. */
static enum ar_status conn_open(struct pg_store *ps, struct pg_conn *pc, struct ar_err *err)
{
    enum ar_status s;
    PGconn *c = NULL;
    double now = ar_time_s();
    pthread_mutex_lock(&ps->mu);
    if (now < ps->retry_at) {
        s = ar_err_set(err, AR_EUNAVAIL, 0,
                       "postgres: unreachable (next attempt in %.2f s): %s",
                       ps->retry_at - now, ps->down_msg);
        pthread_mutex_unlock(&ps->mu);
        return s;
    }
    pthread_mutex_unlock(&ps->mu);
    s = conn_connect(ps, &c, &pc->stmt_timeout_s, err);
    pthread_mutex_lock(&ps->mu);
    if (s == AR_EUNAVAIL) {
        ps->backoff_s =
            ps->backoff_s > 0 ? AR_MIN(ps->backoff_s * 2, PG_BACKOFF_LAST_S) : PG_BACKOFF_FIRST_S;
        ps->retry_at = ar_time_s() + ps->backoff_s;
        snprintf(ps->down_msg, sizeof(ps->down_msg), "%.*s", (int)sizeof(ps->down_msg) - 1,
                 err ? err->msg : "cannot connect");
    } else if (s == AR_OK) {
        ps->backoff_s = 0;
        ps->retry_at = 0;
        pc->c = c;
        pc->prepared = 0;
        pc->epoch = ps->epoch;
        pc->broken = false;
        pc->reused = false;
    }
    pthread_mutex_unlock(&ps->mu);
    return s;
}

/* Replaces pc's connection, found broken, by a new one; the idle ones, opened before it broke,
 * are dropped as suspect. On failure pc stays broken. */
static enum ar_status conn_replace(struct pg_store *ps, struct pg_conn *pc, struct ar_err *err)
{
    enum ar_status s;
    PQfinish(pc->c);
    pc->c = NULL;
    pthread_mutex_lock(&ps->mu);
    ps->epoch++;
    pthread_mutex_unlock(&ps->mu);
    if ((s = conn_open(ps, pc, err)) != AR_OK)
        pc->broken = true;
    return s;
}

/* Healthy until a connection attempt fails, again once one succeeds. */
static bool pg_healthy(struct store *base)
{
    struct pg_store *ps = (struct pg_store *)base;
    bool ok;
    pthread_mutex_lock(&ps->mu);
    ok = ps->retry_at == 0;
    pthread_mutex_unlock(&ps->mu);
    return ok;
}

/* Takes a connection: an idle one, a new one while fewer than STORE_PG_POOL_MAX are open, or
 * the next one given back within the deadline (else AR_EBUSY). */
static enum ar_status pool_get(struct pg_store *ps, struct pg_conn **out, struct ar_err *err)
{
    double deadline = ar_time_s() + ps->wait_s;
    enum ar_status s;
    *out = NULL;
    pthread_mutex_lock(&ps->mu);
    for (;;) {
        struct pg_conn *pc = ps->idle;
        if (pc) {
            ps->idle = pc->next;
            if (pc->epoch < ps->epoch) {
                /* opened before a connection broke: likely broken as well */
                ps->n_open--;
                pthread_mutex_unlock(&ps->mu);
                conn_free(pc);
                pthread_mutex_lock(&ps->mu);
                continue;
            }
            pthread_mutex_unlock(&ps->mu);
            pc->next = NULL;
            pc->reused = true;
            pc->n_ok = 0;
            *out = pc;
            return AR_OK;
        }
        if (ps->n_open < STORE_PG_POOL_MAX) {
            ps->n_open++;
            pthread_mutex_unlock(&ps->mu);
            pc = ar_calloc(1, sizeof(*pc));
            s = pc ? conn_open(ps, pc, err) : ar_err_set(err, AR_ENOMEM, 0, "store: out of memory");
            if (s != AR_OK) {
                ar_free(pc);
                pthread_mutex_lock(&ps->mu);
                ps->n_open--;
                pthread_cond_signal(&ps->cv);
                pthread_mutex_unlock(&ps->mu);
                return s;
            }
            *out = pc;
            return AR_OK;
        }
        {
            struct timespec until;
            double left = deadline - ar_time_s();
            if (left <= 0) {
                pthread_mutex_unlock(&ps->mu);
                return ar_err_set(err, AR_EBUSY, 0,
                                  "postgres: all %d connections stayed busy",
                                  STORE_PG_POOL_MAX);
            }
            until = ar_deadline_in(CLOCK_REALTIME, left);
            pthread_cond_timedwait(&ps->cv, &ps->mu, &until);
        }
    }
}

/* Gives a connection back: to the idle list when it is healthy and outside a transaction
 * (an open one is rolled back first), else closed. */
static void pool_put(struct pg_store *ps, struct pg_conn *pc)
{
    bool keep;
    if (!pc)
        return;
    keep = !pc->broken && pc->c && PQstatus(pc->c) == CONNECTION_OK;
    if (keep && PQtransactionStatus(pc->c) != PQTRANS_IDLE)
        keep = run_sql(ps, pc, "ROLLBACK", "rollback", NULL, NULL) == AR_OK &&
               PQtransactionStatus(pc->c) == PQTRANS_IDLE;
    pthread_mutex_lock(&ps->mu);
    if (keep) {
        pc->next = ps->idle;
        ps->idle = pc;
    } else {
        ps->n_open--;
        if (pc->broken)
            ps->epoch++; /* the server may have gone: the idle ones are suspect too */
    }
    pthread_cond_signal(&ps->cv);
    pthread_mutex_unlock(&ps->mu);
    if (!keep)
        conn_free(pc);
}

/* Runs prepared statement id with text values (NULL: SQL NULL); *out (may be NULL) receives
 * the result. When the first statement on a connection taken from the idle list finds it
 * broken (the server restarted while it sat there), it runs once more on a new connection:
 * every statement that may come first is safe to repeat. */
static enum ar_status pg_exec(struct pg_store *ps, struct pg_conn *pc, enum pg_stmt id,
                              const char *const *vals, PGresult **out, struct ar_err *err)
{
    char name[16];
    enum ar_status s;
    if (out)
        *out = NULL;
    snprintf(name, sizeof(name), "ar_%d", (int)id);
    for (int attempt = 0;; attempt++) {
        s = AR_OK;
        if (!(pc->prepared & ((uint64_t)1 << id))) {
            if (!PQsendPrepare(pc->c, name, stmt_sql[id], stmt_n_params[id], NULL))
                s = conn_error(pc, pg_status_of(pc->c, NULL), err, "prepare",
                               PQerrorMessage(pc->c));
            else
                s = wait_results(ps, pc, stmt_what[id], NULL, err);
            if (s == AR_OK)
                pc->prepared |= (uint64_t)1 << id;
        }
        if (s == AR_OK) {
            if (!PQsendQueryPrepared(pc->c, name, stmt_n_params[id], vals, NULL, NULL, 0))
                s = conn_error(pc, pg_status_of(pc->c, NULL), err, "send", PQerrorMessage(pc->c));
            else
                s = wait_results(ps, pc, stmt_what[id], out, err);
        }
        if (s == AR_OK) {
            pc->n_ok++;
            return AR_OK;
        }
        if (!pc->broken || !pc->reused || pc->n_ok > 0 || attempt > 0)
            return s;
        /* a stale connection from the pool: replace it and try once more */
        if ((s = conn_replace(ps, pc, err)) != AR_OK)
            return s;
    }
}

/* pg_exec on a connection taken from the pool for this one statement. */
static enum ar_status pg_run(struct pg_store *ps, enum pg_stmt id, const char *const *vals,
                             PGresult **out, struct ar_err *err)
{
    struct pg_conn *pc;
    enum ar_status s;
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        return s;
    s = pg_exec(ps, pc, id, vals, out, err);
    pool_put(ps, pc);
    return s;
}

static enum ar_status tx_begin(struct pg_store *ps, struct pg_conn *pc, struct ar_err *err)
{
    enum ar_status s = AR_OK;
    /* BEGIN is the first statement, so a stale pooled connection is replaced here */
    for (int attempt = 0; attempt < 2; attempt++) {
        s = run_sql(ps, pc, "BEGIN", "begin", NULL, err);
        if (s == AR_OK || !pc->broken || !pc->reused || attempt > 0)
            break;
        if ((s = conn_replace(ps, pc, err)) != AR_OK)
            break;
    }
    if (s == AR_OK)
        pc->n_ok++;
    return s;
}

/* ---- open / close ------------------------------------------------------------------- */

static enum ar_status migrate(struct pg_store *ps, struct pg_conn *pc, struct ar_err *err)
{
    PGresult *r = NULL;
    enum ar_status s;
    long version;
    char sql[96];
    if ((s = run_sql(ps, pc, "BEGIN", "begin", NULL, err)) != AR_OK)
        return s;
    /* instances starting at once wait here for each other; the first one migrates */
    snprintf(sql, sizeof(sql), "SELECT pg_advisory_xact_lock(%lld)", (long long)PG_MIGRATION_LOCK);
    if ((s = run_sql(ps, pc, sql, "schema migration", NULL, err)) != AR_OK)
        goto fail;
    if ((s = run_sql(ps, pc,
                     "CREATE TABLE IF NOT EXISTS schema_migrations ("
                     "  version integer PRIMARY KEY,"
                     "  applied_at timestamptz NOT NULL DEFAULT now())",
                     "schema migration", NULL, err)) != AR_OK)
        goto fail;
    if ((s = run_sql(ps, pc, "SELECT coalesce(max(version), 0) FROM schema_migrations",
                     "schema version", &r, err)) != AR_OK)
        goto fail;
    version = PQntuples(r) == 1 ? strtol(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    if (version < 0 || version > PG_SCHEMA_VERSION) {
        s = ar_err_set(err, AR_EFORMAT, 0, "postgres: schema version %ld is not %d or older",
                       version, PG_SCHEMA_VERSION);
        goto fail;
    }
    for (long v = version; v < PG_SCHEMA_VERSION; v++) {
        if ((s = run_sql(ps, pc, migrations[v], "schema migration", NULL, err)) != AR_OK)
            goto fail;
        /* our own constant, not input */
        snprintf(sql, sizeof(sql), "INSERT INTO schema_migrations (version) VALUES (%ld)", v + 1);
        if ((s = run_sql(ps, pc, sql, "schema migration", NULL, err)) != AR_OK)
            goto fail;
    }
    if ((s = run_sql(ps, pc, "COMMIT", "commit", NULL, err)) == AR_OK)
        return AR_OK;
fail:
    if (pc->c && PQtransactionStatus(pc->c) != PQTRANS_IDLE)
        run_sql(ps, pc, "ROLLBACK", "rollback", NULL, NULL);
    return s;
}

enum ar_status store_pg_open(const char *url, struct store **out, struct ar_err *err)
{
    struct pg_store *ps;
    struct pg_conn *pc = NULL;
    enum ar_status s;
    *out = NULL;
    ps = ar_calloc(1, sizeof(*ps));
    if (!ps)
        return AR_ENOMEM;
    ps->base.ops = &pg_ops;
    ps->wait_s = STORE_PG_STATEMENT_TIMEOUT_MS / 1000.0 + PG_MARGIN_S;
    ps->url = ar_strdup(url);
    if (!ps->url) {
        ar_free(ps);
        return AR_ENOMEM;
    }
    if (pthread_mutex_init(&ps->mu, NULL) != 0) {
        ar_free(ps->url);
        ar_free(ps);
        return ar_err_set(err, AR_ENOMEM, 0, "store: cannot create mutex");
    }
    if (pthread_cond_init(&ps->cv, NULL) != 0) {
        pthread_mutex_destroy(&ps->mu);
        ar_free(ps->url);
        ar_free(ps);
        return ar_err_set(err, AR_ENOMEM, 0, "store: cannot create condition variable");
    }
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        goto fail;
    if (pc->stmt_timeout_s > 0) /* no other thread knows the handle yet */
        ps->wait_s = pc->stmt_timeout_s + PG_MARGIN_S;
    s = migrate(ps, pc, err);
    pool_put(ps, pc);
    if (s != AR_OK)
        goto fail;
    *out = &ps->base;
    return AR_OK;
fail:
    pg_close(&ps->base);
    return s;
}

static void pg_close(struct store *base)
{
    struct pg_store *ps = (struct pg_store *)base;
    while (ps->idle) {
        struct pg_conn *pc = ps->idle;
        ps->idle = pc->next;
        conn_free(pc);
    }
    pthread_cond_destroy(&ps->cv);
    pthread_mutex_destroy(&ps->mu);
    ar_free(ps->url);
    ar_free(ps);
}

/* ---- values ------------------------------------------------------------------------- */

static int64_t int_at(const PGresult *r, int row, int col)
{
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static bool bool_at(const PGresult *r, int row, int col)
{
    return PQgetvalue(r, row, col)[0] == 't';
}

/* A column that may be NULL. */
static const char *text_at(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

static enum ar_status reply_from_res(const PGresult *res, int row, struct store_reply *out)
{
    struct store_reply r;
    memset(&r, 0, sizeof(r));
    r.shop_id = PQgetvalue(res, row, 0);
    r.review_id = PQgetvalue(res, row, 1);
    r.text = PQgetvalue(res, row, 2);
    r.rating = (int)int_at(res, row, 3);
    r.lang = PQgetvalue(res, row, 4);
    r.reply = PQgetvalue(res, row, 5);
    r.needs_human = bool_at(res, row, 6);
    r.sentiment = (float)strtod(PQgetvalue(res, row, 7), NULL);
    r.cached = bool_at(res, row, 8);
    r.model = PQgetvalue(res, row, 9);
    r.status = store_review_status_of(PQgetvalue(res, row, 11));
    r.updated_s = int_at(res, row, 12);
    return store_reply_copy(&r, int_at(res, row, 10), out);
}

static void job_from_res(const PGresult *r, int row, struct store_job_info *info)
{
    store_job_info_init(info, PQgetvalue(r, row, 0), PQgetvalue(r, row, 1), PQgetvalue(r, row, 7));
    info->n_total = int_at(r, row, 2);
    info->n_done = int_at(r, row, 3);
    info->n_failed = int_at(r, row, 4);
    info->created_s = int_at(r, row, 5);
    info->updated_s = int_at(r, row, 6);
    info->published = bool_at(r, row, 8);
    store_job_info_owner(info, PQgetvalue(r, row, 9), PQgetvalue(r, row, 12));
    info->bytes = int_at(r, row, 10);
    info->seq = int_at(r, row, 11);
    info->notified = bool_at(r, row, 13);
}

static enum store_item_status item_status_at(const PGresult *r, int row, int col)
{
    return store_item_status_of(PQgetvalue(r, row, col));
}

/* ---- replies ------------------------------------------------------------------------ */

static enum ar_status reply_get_on(struct pg_store *ps, struct pg_conn *pc, const char *shop_id,
                                   const char *review_id, struct store_reply *out, bool *found,
                                   struct ar_err *err)
{
    const char *v[2] = {shop_id, review_id};
    PGresult *r = NULL;
    enum ar_status s = pg_exec(ps, pc, P_REPLY_GET, v, &r, err);
    *found = false;
    if (s == AR_OK && PQntuples(r) > 0) {
        s = reply_from_res(r, 0, out);
        *found = s == AR_OK;
    }
    PQclear(r);
    return s;
}

static enum ar_status pg_reply_get(struct store *base, const char *shop_id, const char *review_id,
                                   struct store_reply *out, bool *found, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    struct pg_conn *pc;
    enum ar_status s = pool_get(ps, &pc, err);
    if (s != AR_OK)
        return s;
    s = reply_get_on(ps, pc, shop_id, review_id, out, found, err);
    pool_put(ps, pc);
    return s;
}

static enum ar_status pg_reply_put(struct store *base, const struct store_reply *r, int64_t created,
                                   struct store_reply *out, bool *existed, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char rating[8], sentiment[40], created_s[24];
    const char *v[12];
    struct pg_conn *pc;
    PGresult *res = NULL;
    bool found = false;
    enum ar_status s;
    snprintf(rating, sizeof(rating), "%d", r->rating);
    /* 17 digits: the double (and so the float) comes back exactly */
    snprintf(sentiment, sizeof(sentiment), "%.17g", (double)r->sentiment);
    snprintf(created_s, sizeof(created_s), "%lld", (long long)created);
    v[0] = r->shop_id;
    v[1] = r->review_id;
    v[2] = r->text;
    v[3] = rating;
    v[4] = r->lang ? r->lang : "";
    v[5] = r->reply;
    v[6] = r->needs_human ? "t" : "f";
    v[7] = sentiment;
    v[8] = r->cached ? "t" : "f";
    v[9] = r->model ? r->model : "";
    v[10] = created_s;
    v[11] = store_review_status_names[r->status];
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        return s;
    s = pg_exec(ps, pc, P_REPLY_PUT, v, &res, err);
    if (s == AR_OK) {
        *existed = PQntuples(res) == 1 && int_at(res, 0, 0) == 0;
        if (*existed && out) {
            /* rows are never deleted, so the existing row is still there */
            s = reply_get_on(ps, pc, r->shop_id, r->review_id, out, &found, err);
            if (s == AR_OK && !found)
                s = ar_err_set(err, AR_EIO, 0, "store: reply vanished after insert");
        }
    }
    PQclear(res);
    pool_put(ps, pc);
    return s;
}

static enum ar_status pg_reply_claim(struct store *base, const char *shop_id, const char *review_id,
                                     const char *owner, double lease_s, enum store_claim *out,
                                     struct store_reply *row, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char lease[40];
    const char *v[4] = {shop_id, review_id, owner, lease};
    struct pg_conn *pc;
    PGresult *r = NULL;
    bool found = false, taken;
    enum ar_status s;
    snprintf(lease, sizeof(lease), "%.6f", lease_s);
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        return s;
    /* a review answered already costs one read */
    if ((s = reply_get_on(ps, pc, shop_id, review_id, row, &found, err)) != AR_OK || found)
        goto out;
    if ((s = pg_exec(ps, pc, P_CLAIM_TAKE, v, &r, err)) != AR_OK)
        goto out;
    taken = PQntuples(r) == 1;
    PQclear(r);
    /* Read again after claiming: a put ends the claim in the transaction that inserts the
     * reply, so a claim taken after that put's commit finds the reply here, and one taken
     * before it makes the put wait; either way the reply is not generated twice. */
    if ((s = reply_get_on(ps, pc, shop_id, review_id, row, &found, err)) != AR_OK)
        goto out;
    if (found) {
        if (taken) /* a claim on a stored reply means nothing; tidy it up */
            pg_exec(ps, pc, P_CLAIM_DROP, v, NULL, NULL);
        goto out;
    }
    *out = taken ? STORE_CLAIM_OWNED : STORE_CLAIM_HELD;
out:
    if (s == AR_OK && found)
        *out = STORE_CLAIM_STORED;
    if (s != AR_OK)
        store_reply_fini(row);
    pool_put(ps, pc);
    return s;
}

static enum ar_status pg_reply_unclaim(struct store *base, const char *shop_id,
                                       const char *review_id, const char *owner, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    const char *v[3] = {shop_id, review_id, owner};
    struct pg_conn *pc;
    enum ar_status s = pool_get(ps, &pc, err);
    if (s != AR_OK)
        return s;
    s = pg_exec(ps, pc, P_CLAIM_DROP, v, NULL, err);
    pool_put(ps, pc);
    return s;
}

static enum ar_status pg_reply_claims_release(struct store *base, const char *owner_prefix,
                                              int64_t *n_out, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    const char *v[1] = {owner_prefix};
    struct pg_conn *pc;
    PGresult *r = NULL;
    enum ar_status s = pool_get(ps, &pc, err);
    if (s != AR_OK)
        return s;
    s = pg_exec(ps, pc, P_CLAIM_RELEASE, v, &r, err);
    pool_put(ps, pc);
    if (s == AR_OK)
        *n_out = strtoll(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return s;
}

/* ---- jobs --------------------------------------------------------------------------- */

/* Appends s as one element of an array literal: in double quotes, with " and \ escaped. */
static void array_put_text(struct ar_buf *b, const char *s)
{
    ar_buf_put(b, "\"", 1);
    for (const char *p = s;;) {
        size_t n = strcspn(p, "\"\\");
        ar_buf_put(b, p, n);
        p += n;
        if (!*p)
            break;
        ar_buf_put(b, "\\", 1);
        ar_buf_put(b, p, 1);
        p++;
    }
    ar_buf_put(b, "\"", 1);
}

static enum ar_status pg_job_create(struct store *base, const char *job_id,
                                    const struct store_job_spec *spec, int64_t bytes,
                                    const struct store_item_in *items, size_t n, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char total[24], now[24], nbytes[24];
    const char *v[7] = {job_id, spec->shop_id, total, now, spec->owner, nbytes, spec->callback_url};
    struct pg_conn *pc;
    enum ar_status s;
    snprintf(total, sizeof(total), "%lld", (long long)n);
    snprintf(now, sizeof(now), "%lld", (long long)store_now_s());
    snprintf(nbytes, sizeof(nbytes), "%lld", (long long)bytes);
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        return s;
    if ((s = tx_begin(ps, pc, err)) != AR_OK)
        goto out;
    if ((s = pg_exec(ps, pc, P_JOB_INSERT, v, NULL, err)) != AR_OK)
        goto out;
    for (size_t i = 0; i < n && s == AR_OK; i += PG_ITEMS_PER_INSERT) {
        struct ar_buf lines = {0}, inputs = {0};
        size_t end = AR_MIN(n, i + PG_ITEMS_PER_INSERT);
        const char *iv[3];
        char num[24], *line_arr, *input_arr;
        ar_buf_put(&lines, "{", 1);
        ar_buf_put(&inputs, "{", 1);
        for (size_t k = i; k < end; k++) {
            if (k > i) {
                ar_buf_put(&lines, ",", 1);
                ar_buf_put(&inputs, ",", 1);
            }
            snprintf(num, sizeof(num), "%lld", (long long)items[k].line);
            ar_buf_puts(&lines, num);
            array_put_text(&inputs, items[k].input);
        }
        ar_buf_put(&lines, "}", 1);
        ar_buf_put(&inputs, "}", 1);
        line_arr = ar_buf_take(&lines, NULL);
        input_arr = ar_buf_take(&inputs, NULL);
        iv[0] = job_id;
        iv[1] = line_arr;
        iv[2] = input_arr;
        if (!line_arr || !input_arr)
            s = ar_err_set(err, AR_ENOMEM, 0, "store: out of memory");
        else if ((s = pg_exec(ps, pc, P_ITEMS_INSERT, iv, NULL, err)) == AR_EINVAL && err) {
            char why[sizeof(err->msg)];
            snprintf(why, sizeof(why), "%s", err->msg);
            ar_err_set(err, AR_EINVAL, 0, "store: job line insert (duplicate line number?): %s",
                       why);
        }
        ar_free(line_arr);
        ar_free(input_arr);
    }
    if (s == AR_OK)
        s = run_sql(ps, pc, "COMMIT", "commit", NULL, err);
out:
    pool_put(ps, pc); /* rolls back what did not commit */
    return s;
}

static enum ar_status pg_job_next_pending(struct store *base, const char *job_id,
                                          int64_t after_line, size_t max,
                                          struct store_item **items_out, size_t *n_out,
                                          struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char after[24], limit[24];
    const char *v[3] = {job_id, after, limit};
    struct store_item *items = NULL;
    PGresult *r = NULL;
    size_t n = 0, rows;
    enum ar_status s;
    snprintf(after, sizeof(after), "%lld", (long long)after_line);
    snprintf(limit, sizeof(limit), "%lld", (long long)(max > INT64_MAX ? INT64_MAX : (int64_t)max));
    s = pg_run(ps, P_ITEM_PENDING, v, &r, err);
    if (s != AR_OK)
        return s;
    rows = (size_t)PQntuples(r);
    if (rows > 0) {
        items = ar_calloc(rows, sizeof(*items));
        if (!items)
            s = AR_ENOMEM;
    }
    for (; s == AR_OK && n < rows; n++) {
        s = store_item_copy(&items[n], int_at(r, (int)n, 0), STORE_ITEM_PENDING,
                            PQgetvalue(r, (int)n, 1), NULL);
        if (s != AR_OK)
            break;
    }
    PQclear(r);
    if (s != AR_OK) {
        store_items_free(items, n);
        return s;
    }
    *items_out = items;
    *n_out = n;
    return AR_OK;
}

static enum ar_status pg_job_item_finish(struct store *base, const char *job_id, int64_t line,
                                         enum store_item_status status, const char *text,
                                         struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char ln[24], now[24];
    const char *v[7] = {job_id,
                        ln,
                        store_item_status_names[status],
                        text,
                        status == STORE_ITEM_DONE ? "1" : "0",
                        status == STORE_ITEM_ERROR ? "1" : "0",
                        now};
    struct pg_conn *pc;
    PGresult *r = NULL;
    enum ar_status s;
    snprintf(ln, sizeof(ln), "%lld", (long long)line);
    snprintf(now, sizeof(now), "%lld", (long long)store_now_s());
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        return s;
    s = pg_exec(ps, pc, P_ITEM_FINISH, v, &r, err);
    if (s == AR_OK && PQntuples(r) == 0) {
        /* say why: no such line, or finished already */
        PQclear(r);
        r = NULL;
        s = pg_exec(ps, pc, P_ITEM_STATUS, v, &r, err);
        if (s == AR_OK && PQntuples(r) > 0)
            s = ar_err_set(err, AR_EINVAL, 0, "store: job %s line %lld is already %s", job_id,
                           (long long)line, PQgetvalue(r, 0, 0));
        else if (s == AR_OK)
            s = ar_err_set(err, AR_EINVAL, 0, "store: job %s has no line %lld", job_id,
                           (long long)line);
    }
    PQclear(r);
    pool_put(ps, pc);
    return s;
}

static enum ar_status pg_job_item_get(struct store *base, const char *job_id, int64_t line,
                                      struct store_item *out, bool *found, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char ln[24];
    const char *v[2] = {job_id, ln};
    PGresult *r = NULL;
    enum ar_status s;
    snprintf(ln, sizeof(ln), "%lld", (long long)line);
    s = pg_run(ps, P_ITEM_GET, v, &r, err);
    if (s == AR_OK && PQntuples(r) > 0) {
        s = store_item_copy(out, int_at(r, 0, 0), item_status_at(r, 0, 1), PQgetvalue(r, 0, 2),
                            text_at(r, 0, 3));
        *found = s == AR_OK;
    }
    PQclear(r);
    return s;
}

/* Runs an UPDATE of one job; AR_EINVAL when no job has the id. */
static enum ar_status job_update(struct pg_store *ps, enum pg_stmt id, const char *const *v,
                                 struct ar_err *err)
{
    PGresult *r = NULL;
    enum ar_status s;
    s = pg_run(ps, id, v, &r, err);
    if (s == AR_OK && strcmp(PQcmdTuples(r), "0") == 0)
        s = ar_err_set(err, AR_EINVAL, 0, "store: no job %s", v[0]);
    PQclear(r);
    return s;
}

static enum ar_status pg_job_set_status(struct store *base, const char *job_id,
                                        enum store_job_status status, struct ar_err *err)
{
    char now[24];
    const char *v[3] = {job_id, store_job_status_names[status], now};
    snprintf(now, sizeof(now), "%lld", (long long)store_now_s());
    return job_update((struct pg_store *)base, P_JOB_SET_STATUS, v, err);
}

static enum ar_status pg_job_set_published(struct store *base, const char *job_id,
                                           struct ar_err *err)
{
    const char *v[1] = {job_id};
    return job_update((struct pg_store *)base, P_JOB_SET_PUBLISHED, v, err);
}

static enum ar_status job_get_on(struct pg_store *ps, struct pg_conn *pc, const char *job_id,
                                 struct store_job_info *info, bool *found, struct ar_err *err)
{
    const char *v[1] = {job_id};
    PGresult *r = NULL;
    enum ar_status s = pg_exec(ps, pc, P_JOB_GET, v, &r, err);
    *found = s == AR_OK && PQntuples(r) > 0;
    if (*found)
        job_from_res(r, 0, info);
    PQclear(r);
    return s;
}

static enum ar_status pg_job_get(struct store *base, const char *job_id,
                                 struct store_job_info *info, bool *found, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    struct pg_conn *pc;
    enum ar_status s = pool_get(ps, &pc, err);
    if (s != AR_OK)
        return s;
    s = job_get_on(ps, pc, job_id, info, found, err);
    pool_put(ps, pc);
    return s;
}

/* In pages of PG_RESULTS_PAGE lines, so that a slow callback never holds a statement open
 * past its timeout; each line is read whole. */
static enum ar_status pg_job_results(struct store *base, const char *job_id, int64_t after_line,
                                     size_t limit, store_item_fn fn, void *user,
                                     struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    struct store_job_info info;
    char after[24], lim[24];
    const char *v[3] = {job_id, after, lim};
    struct pg_conn *pc;
    bool found = false;
    int64_t last = after_line;
    size_t left = limit ? limit : SIZE_MAX;
    enum ar_status s;
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        return s;
    if ((s = job_get_on(ps, pc, job_id, &info, &found, err)) != AR_OK)
        goto out;
    if (!found) {
        s = ar_err_set(err, AR_EINVAL, 0, "store: no job %s", job_id);
        goto out;
    }
    for (;;) {
        PGresult *r = NULL;
        int rows;
        size_t page = AR_MIN(left, (size_t)PG_RESULTS_PAGE);
        snprintf(after, sizeof(after), "%lld", (long long)last);
        snprintf(lim, sizeof(lim), "%zu", page);
        if ((s = pg_exec(ps, pc, P_JOB_ITEMS, v, &r, err)) != AR_OK)
            break;
        rows = PQntuples(r);
        left -= (size_t)rows;
        for (int i = 0; i < rows && s == AR_OK; i++) {
            struct store_item it;
            it.line = int_at(r, i, 0);
            it.status = item_status_at(r, i, 1);
            it.input = PQgetvalue(r, i, 2);
            it.result = text_at(r, i, 3);
            it.storage = NULL;
            last = it.line;
            if (!fn(&it, user))
                s = AR_ECANCELED;
        }
        PQclear(r);
        if (s != AR_OK || (size_t)rows < page || left == 0)
            break;
    }
out:
    pool_put(ps, pc);
    return s;
}

/* fn for each job row of r (job_from_res), until it returns false (AR_ECANCELED then). */
static enum ar_status job_rows_each(PGresult *r, store_job_fn fn, void *user)
{
    for (int i = 0; i < PQntuples(r); i++) {
        struct store_job_info info;
        job_from_res(r, i, &info);
        if (!fn(&info, user))
            return AR_ECANCELED;
    }
    return AR_OK;
}

/* Calls fn for each job statement id (no values) returns. */
static enum ar_status jobs_each(struct pg_store *ps, enum pg_stmt id, store_job_fn fn, void *user,
                                struct ar_err *err)
{
    PGresult *r = NULL;
    enum ar_status s;
    s = pg_run(ps, id, NULL, &r, err);
    if (s == AR_OK)
        s = job_rows_each(r, fn, user);
    PQclear(r);
    return s;
}

static enum ar_status pg_jobs_list(struct store *base, const char *owner, int64_t before_seq,
                                   size_t limit, store_job_fn fn, void *user, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char before[24], lim[24];
    const char *v[3] = {owner, before, lim};
    PGresult *r = NULL;
    enum ar_status s;
    snprintf(before, sizeof(before), "%lld", (long long)(before_seq > 0 ? before_seq : INT64_MAX));
    snprintf(lim, sizeof(lim), "%zu", limit);
    s = pg_run(ps, P_JOBS_LIST, v, &r, err);
    if (s == AR_OK)
        s = job_rows_each(r, fn, user);
    PQclear(r);
    return s;
}

static enum ar_status pg_job_usage(struct store *base, const char *owner, int64_t *open_jobs,
                                   int64_t *bytes, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    const char *v[1] = {owner};
    PGresult *r = NULL;
    enum ar_status s;
    s = pg_run(ps, P_JOB_USAGE, v, &r, err);
    if (s == AR_OK && PQntuples(r) == 1) {
        *open_jobs = int_at(r, 0, 0);
        *bytes = int_at(r, 0, 1);
    }
    PQclear(r);
    return s;
}

/* Runs statement id on one job ($1, then v's other values) and says whether it changed a row. */
static enum ar_status job_change(struct pg_store *ps, enum pg_stmt id, const char *const *v,
                                 bool *changed, struct ar_err *err)
{
    PGresult *r = NULL;
    enum ar_status s;
    s = pg_run(ps, id, v, &r, err);
    *changed = s == AR_OK && strcmp(PQcmdTuples(r), "0") != 0;
    PQclear(r);
    return s;
}

static enum ar_status pg_job_cancel(struct store *base, const char *job_id, bool *cancelled,
                                    struct ar_err *err)
{
    char now[24];
    const char *v[2] = {job_id, now};
    snprintf(now, sizeof(now), "%lld", (long long)store_now_s());
    return job_change((struct pg_store *)base, P_JOB_CANCEL, v, cancelled, err);
}

static enum ar_status pg_job_delete(struct store *base, const char *job_id, bool *found,
                                    struct ar_err *err)
{
    const char *v[1] = {job_id};
    return job_change((struct pg_store *)base, P_JOB_DELETE, v, found, err);
}

static enum ar_status pg_job_claim_notify(struct store *base, const char *job_id, bool *claimed,
                                          struct ar_err *err)
{
    const char *v[1] = {job_id};
    return job_change((struct pg_store *)base, P_JOB_CLAIM_NOTIFY, v, claimed, err);
}

static enum ar_status pg_jobs_unfinished(struct store *base, store_job_fn fn, void *user,
                                         struct ar_err *err)
{
    return jobs_each((struct pg_store *)base, P_JOBS_UNFINISHED, fn, user, err);
}

static enum ar_status pg_jobs_unnotified(struct store *base, store_job_fn fn, void *user,
                                         struct ar_err *err)
{
    return jobs_each((struct pg_store *)base, P_JOBS_UNNOTIFIED, fn, user, err);
}

/* ---- the review workflow ------------------------------------------------------------------ */

static enum ar_status pg_reviews_list(struct store *base, const struct store_review_filter *f,
                                      const struct store_review_cursor *after, size_t limit,
                                      store_reply_fn fn, void *user, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    char rating[8], lo[40], hi[40], created[24], lim[24];
    const char *v[9] = {f->status < 0 ? "" : store_review_status_names[f->status],
                        f->shop_id,
                        rating,
                        lo,
                        hi,
                        created,
                        after->shop_id ? after->shop_id : "",
                        after->review_id ? after->review_id : "",
                        lim};
    PGresult *r = NULL;
    enum ar_status s;
    snprintf(rating, sizeof(rating), "%d", f->rating);
    snprintf(lo, sizeof(lo), "%.17g", f->sentiment_min);
    snprintf(hi, sizeof(hi), "%.17g", f->sentiment_max);
    snprintf(created, sizeof(created), "%lld", (long long)after->created_s);
    snprintf(lim, sizeof(lim), "%zu", limit);
    s = pg_run(ps, P_REVIEWS_LIST, v, &r, err);
    for (int i = 0; s == AR_OK && i < PQntuples(r); i++) {
        struct store_reply row;
        if ((s = reply_from_res(r, i, &row)) != AR_OK)
            break;
        if (!fn(&row, user))
            s = AR_ECANCELED;
        store_reply_fini(&row);
    }
    PQclear(r);
    return s;
}

static enum ar_status pg_review_change(struct store *base, const struct store_review_change *c,
                                       int64_t now, struct store_reply *out,
                                       enum store_change_result *result, struct ar_err *err)
{
    struct pg_store *ps = (struct pg_store *)base;
    const char *key[2] = {c->shop_id, c->review_id};
    struct store_reply row, after;
    char at[24];
    struct pg_conn *pc;
    PGresult *r = NULL;
    enum ar_status s;
    memset(&row, 0, sizeof(row));
    snprintf(at, sizeof(at), "%lld", (long long)now);
    if ((s = pool_get(ps, &pc, err)) != AR_OK)
        return s;
    if ((s = tx_begin(ps, pc, err)) != AR_OK)
        goto out;
    if ((s = pg_exec(ps, pc, P_REVIEW_LOCK, key, &r, err)) != AR_OK)
        goto out;
    if (PQntuples(r) == 0) {
        *result = STORE_CHANGE_NOT_FOUND;
        goto out;
    }
    if ((s = reply_from_res(r, 0, &row)) != AR_OK)
        goto out;
    if (!(c->from_mask & (1u << row.status))) {
        *result = STORE_CHANGE_REFUSED;
        if (out) {
            *out = row;
            memset(&row, 0, sizeof(row));
        }
        goto out; /* the lock goes with the rollback */
    }
    after = row;
    after.status = c->to;
    after.updated_s = now;
    if (c->reply)
        after.reply = c->reply;
    {
        const char *set[5] = {c->shop_id, c->review_id, store_review_status_names[c->to],
                              after.reply, at};
        const char *audit[9] = {c->shop_id,
                                c->review_id,
                                at,
                                c->key,
                                c->action,
                                row.reply,
                                after.reply,
                                store_review_status_names[row.status],
                                store_review_status_names[c->to]};
        if ((s = pg_exec(ps, pc, P_REVIEW_SET, set, NULL, err)) != AR_OK ||
            (s = pg_exec(ps, pc, P_AUDIT_INSERT, audit, NULL, err)) != AR_OK)
            goto out;
    }
    if ((s = run_sql(ps, pc, "COMMIT", "commit", NULL, err)) != AR_OK)
        goto out;
    *result = STORE_CHANGED;
    if (out)
        s = store_reply_copy(&after, row.created_s, out);
out:
    PQclear(r);
    pool_put(ps, pc); /* rolls back what did not commit */
    store_reply_fini(&row);
    if (s != AR_OK)
        store_reply_fini(out);
    return s;
}

static enum ar_status pg_review_audit(struct store *base, const char *shop_id,
                                      const char *review_id, store_audit_fn fn, void *user,
                                      struct ar_err *err)
{
    const char *v[2] = {shop_id, review_id};
    PGresult *r = NULL;
    enum ar_status s = pg_run((struct pg_store *)base, P_AUDIT_LIST, v, &r, err);
    for (int i = 0; s == AR_OK && i < PQntuples(r); i++) {
        struct store_audit a;
        a.at_s = int_at(r, i, 0);
        a.key = PQgetvalue(r, i, 1);
        a.action = PQgetvalue(r, i, 2);
        a.before = PQgetvalue(r, i, 3);
        a.after = PQgetvalue(r, i, 4);
        a.from = store_review_status_of(PQgetvalue(r, i, 5));
        a.to = store_review_status_of(PQgetvalue(r, i, 6));
        if (!fn(&a, user))
            s = AR_ECANCELED;
    }
    PQclear(r);
    return s;
}

static enum ar_status pg_shop_put(struct store *base, const char *shop_id, const char *json,
                                  int64_t now, struct ar_err *err)
{
    char at[24];
    const char *v[3] = {shop_id, json, at};
    PGresult *r = NULL;
    enum ar_status s;
    snprintf(at, sizeof(at), "%lld", (long long)now);
    s = pg_run((struct pg_store *)base, P_SHOP_PUT, v, &r, err);
    PQclear(r);
    return s;
}

static enum ar_status pg_shop_get(struct store *base, const char *shop_id, char **json,
                                  int64_t *updated_s, bool *found, struct ar_err *err)
{
    const char *v[1] = {shop_id};
    PGresult *r = NULL;
    enum ar_status s = pg_run((struct pg_store *)base, P_SHOP_GET, v, &r, err);
    if (s == AR_OK && PQntuples(r) > 0) {
        *json = ar_strdup(PQgetvalue(r, 0, 0));
        *updated_s = int_at(r, 0, 1);
        *found = *json != NULL;
        if (!*json)
            s = AR_ENOMEM;
    }
    PQclear(r);
    return s;
}

static enum ar_status pg_shops_list(struct store *base, store_shop_fn fn, void *user,
                                    struct ar_err *err)
{
    PGresult *r = NULL;
    enum ar_status s = pg_run((struct pg_store *)base, P_SHOPS_LIST, NULL, &r, err);
    for (int i = 0; s == AR_OK && i < PQntuples(r); i++)
        if (!fn(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), int_at(r, i, 2), user))
            s = AR_ECANCELED;
    PQclear(r);
    return s;
}

static const struct store_ops pg_ops = {
    .name = "postgres",
    .close = pg_close,
    .healthy = pg_healthy,
    .reply_get = pg_reply_get,
    .reply_put = pg_reply_put,
    .reply_claim = pg_reply_claim,
    .reply_unclaim = pg_reply_unclaim,
    .reply_claims_release = pg_reply_claims_release,
    .job_create = pg_job_create,
    .job_next_pending = pg_job_next_pending,
    .job_item_finish = pg_job_item_finish,
    .job_item_get = pg_job_item_get,
    .job_set_status = pg_job_set_status,
    .job_set_published = pg_job_set_published,
    .job_get = pg_job_get,
    .job_results = pg_job_results,
    .jobs_unfinished = pg_jobs_unfinished,
    .jobs_list = pg_jobs_list,
    .job_usage = pg_job_usage,
    .job_cancel = pg_job_cancel,
    .job_delete = pg_job_delete,
    .job_claim_notify = pg_job_claim_notify,
    .jobs_unnotified = pg_jobs_unnotified,
    .reviews_list = pg_reviews_list,
    .review_change = pg_review_change,
    .review_audit = pg_review_audit,
    .shop_put = pg_shop_put,
    .shop_get = pg_shop_get,
    .shops_list = pg_shops_list,
};
