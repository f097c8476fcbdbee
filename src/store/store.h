/* store.h - durable records: generated replies keyed by (shop_id, review_id) for
 * idempotency, claims that make one instance of a fleet generate each new review while the
 * others wait for its reply, and bulk jobs with one row per input line so that a restart after
 * a crash (kill -9 included) resumes a job without redoing finished lines.
 *
 * Two backends behind one interface (store_internal.h), chosen at open (store_open_url):
 *
 * SQLite (sqlite.c; store_open, or a URL that is a path): one database file in WAL mode with
 * synchronous=NORMAL: a commit is an append to the WAL without an fsync, so a committed
 * transaction survives a process crash (kill -9 included); after a power loss the commits
 * since the last fsync of the WAL (normally the last second or so, see below) may be lost,
 * never half of one, and the database is not corrupted. Checkpoints (copying the WAL into the
 * database file, with an fsync of the WAL before and of the database after) run on a
 * background thread with its own connection, about once a second or per 1000 WAL pages, never
 * inside a caller's commit; the only fsync left on the caller's side is the WAL header's when
 * the WAL starts over after a complete checkpoint. The schema is created at open and
 * versioned in PRAGMA user_version (STORE_SCHEMA_VERSION). A handle owns one connection
 * guarded by a mutex (plus the checkpointer's), so calls on one handle are serialised;
 * several handles (or processes) may open the same file; SQLite's locking and a busy timeout
 * arbitrate between them.
 *
 * PostgreSQL (postgres.c; "postgres://..." or "postgresql://..."): the database a fleet of
 * instances shares. Its schema is versioned in a schema_migrations table; missing versions
 * are applied at open in one transaction under an advisory lock, so instances starting at
 * once do not race. A handle keeps a small pool of connections (STORE_PG_POOL_MAX), so calls
 * from several threads run at the same time; every call is bounded in time (connect timeout,
 * statement timeout, and a deadline on the client's side); a broken connection is replaced
 * by a new one, with a growing pause between failed attempts during which calls fail at once
 * with AR_EUNAVAIL, and calls succeed again once the server is back.
 *
 * Thread safety: every function may be called from any thread on a shared handle. Callbacks
 * (store_job_results, store_jobs_unfinished) run while the handle holds a connection (SQLite:
 * its mutex) and must not call back into the same handle.
 *
 * Errors: AR_EINVAL for bad arguments (and for unknown job ids or lines, duplicate lines),
 * AR_EBUSY when the database stayed locked past the busy timeout or a statement ran past its
 * timeout (or every pooled connection stayed busy), AR_EUNAVAIL when the PostgreSQL server
 * cannot be reached now, AR_ENOMEM, AR_EFORMAT for a database written by a newer schema, and
 * AR_EIO for anything else the database reports. The optional struct ar_err receives the
 * database's message. */
#ifndef AR_STORE_H
#define AR_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

#define STORE_SCHEMA_VERSION 5    /* SQLite's user_version */
#define STORE_PG_SCHEMA_VERSION 3 /* PostgreSQL's max(schema_migrations.version) */
#define STORE_ID_MAX 256          /* longest shop or review id (and job owner), bytes */
#define STORE_URL_MAX 2048        /* longest job callback URL, bytes */
#define STORE_JOB_ID_LEN 32       /* hex digits of a job id (128 random bits) */
#define STORE_BUSY_TIMEOUT_MS 5000
/* PostgreSQL: connections per handle; seconds a connection attempt may take (libpq's
 * connect_timeout, unless the URL sets one); a statement's time limit (statement_timeout and
 * lock_timeout, unless the URL's options set them); the client waits this plus a margin. */
#define STORE_PG_POOL_MAX 8
#define STORE_PG_CONNECT_TIMEOUT_S 3
#define STORE_PG_STATEMENT_TIMEOUT_MS 5000

struct store;

/* Opens (creating if needed) the SQLite database at path. The caller owns *out (store_close). */
enum ar_status store_open(const char *path, struct store **out, struct ar_err *err);
/* Opens the store a URL names: "postgres://..." or "postgresql://..." (libpq's URI form,
 * e.g. postgres://user@host:5432/db?options=-csearch_path%3Dmine) opens PostgreSQL, creating
 * or migrating the schema; anything else is a SQLite path (store_open). AR_EUNAVAIL when the
 * server cannot be reached. The caller owns *out (store_close). */
enum ar_status store_open_url(const char *url, struct store **out, struct ar_err *err);
/* Closes the connections; NULL does nothing. No call may be in progress on the handle. */
void store_close(struct store *st);
/* "sqlite" or "postgres" (static). */
const char *store_backend_name(const struct store *st);
/* Whether the backend's server answered at its last contact (false while a PostgreSQL that
 * went away is being reconnected to; always true for SQLite and NULL). Quick, never touches
 * the network: for /health. */
bool store_healthy(struct store *st);

/* ---- replies ------------------------------------------------------------------------- */

/* Where an answered review stands in the merchant's workflow. A reply stored with action
 * "send" is sent, with "suggest" pending; a person approves, rejects or regenerates it
 * (store_review_change). Replies stored before the workflow existed read as pending: the
 * store never kept their action, so a person sees them once. */
enum store_review_status {
    STORE_REVIEW_PENDING = 0, /* a draft for a person (suggest mode, or held for a human) */
    STORE_REVIEW_APPROVED,    /* a person approved the (possibly edited) reply */
    STORE_REVIEW_SENT,        /* sent automatically */
    STORE_REVIEW_REJECTED     /* a person rejected the reply */
};
#define STORE_REVIEW_STATUS_COUNT 4
/* "pending", "approved", "sent", "rejected" (static; "unknown" out of range). */
const char *store_review_status_str(enum store_review_status s);
/* The status of a name; false for anything else (also NULL). */
bool store_review_status_parse(const char *name, enum store_review_status *out);

/* One review and the reply generated for it. As an input (store_reply_put) the strings are
 * borrowed; as an output (get, put) they all point into `storage`, owned by the struct and
 * released with store_reply_fini. */
struct store_reply {
    const char *shop_id;   /* non-empty, at most STORE_ID_MAX bytes */
    const char *review_id; /* non-empty, at most STORE_ID_MAX bytes */
    const char *text;      /* the review text (not NULL, may be empty) */
    int rating;            /* stars, 1..5 */
    const char *lang;      /* "zh", "en", ...; NULL is stored as "" */
    const char *reply;     /* the reply text (not NULL, may be empty) */
    bool needs_human;      /* routed to a person instead of (or besides) the reply */
    float sentiment;       /* finite, conventionally -1..1 */
    bool cached;           /* the reply came from the reply cache, not the model */
    const char *model;     /* model name; NULL is stored as "" */
    int64_t created_s;     /* unix seconds; 0 on put means now */
    enum store_review_status status; /* on put: as given (zeroed: pending) */
    int64_t updated_s;     /* unix seconds of the last change (on put: created_s) */
    char *storage;         /* owned by outputs; NULL in inputs */
};

/* Releases an output's storage and zeroes it; NULL or a zeroed struct does nothing. */
void store_reply_fini(struct store_reply *r);

/* Looks up the reply for (shop_id, review_id). *found says whether there is one; when it
 * is, *out is filled (the caller owns it: store_reply_fini). */
enum ar_status store_reply_get(struct store *st, const char *shop_id, const char *review_id,
                               struct store_reply *out, bool *found, struct ar_err *err);

/* Inserts r unless a row with the same (shop_id, review_id) exists; an existing row is
 * never changed. Any claim on the review ends in the same transaction. *existed (may be NULL)
 * says which happened; out (may be NULL) receives the row now stored: r's values, or the
 * existing row's. */
enum ar_status store_reply_put(struct store *st, const struct store_reply *r,
                               struct store_reply *out, bool *existed, struct ar_err *err);

/* ---- the review workflow ------------------------------------------------------------------ */

/* Which answered reviews store_reviews_list returns (every field optional). */
struct store_review_filter {
    int status;          /* enum store_review_status, or -1: any */
    const char *shop_id; /* NULL or "": any */
    int rating;          /* 1..5, or 0: any */
    bool by_sentiment;   /* only scores in [sentiment_min, sentiment_max] (inclusive) */
    double sentiment_min, sentiment_max;
};

/* Where a page of a list starts: after the review with this (created_s, shop_id, review_id)
 * in newest-first order (created_s descending, then shop_id, then review_id descending), so
 * that a page never repeats or skips a review however many are stored meanwhile (new ones
 * come before the first page). The strings are borrowed. */
struct store_review_cursor {
    int64_t created_s;
    const char *shop_id, *review_id;
};

/* Borrowed for the call; false stops the list (AR_ECANCELED). */
typedef bool (*store_reply_fn)(const struct store_reply *r, void *user);

/* Calls fn for at most limit (1..1000) reviews matching f (NULL: all), newest first, starting
 * after `after` (NULL: at the newest). */
enum ar_status store_reviews_list(struct store *st, const struct store_review_filter *f,
                                  const struct store_review_cursor *after, size_t limit,
                                  store_reply_fn fn, void *user, struct ar_err *err);

/* A change of a review's status by a person (or the pipeline on their behalf). */
struct store_review_change {
    const char *shop_id, *review_id;
    unsigned from_mask;              /* the statuses it may change from: bit (1u << status) */
    enum store_review_status to;     /* the status afterwards */
    const char *reply;               /* the new reply text; NULL: kept */
    const char *key;                 /* who made it (an API key's name), "" for nobody; NULL: "" */
    const char *action;              /* what was done ("approve", ...), 1..32 bytes */
};

enum store_change_result {
    STORE_CHANGED = 0,     /* changed, and an audit entry written, in one transaction */
    STORE_CHANGE_NOT_FOUND, /* no reply is stored for the review */
    STORE_CHANGE_REFUSED   /* its status is not in from_mask: nothing changed */
};

/* Changes the review's status (and reply) when its current status is in from_mask, checked
 * and changed atomically (two changes at once, e.g. an approve and a reject of a pending
 * review, never both pass a check the other's change falsifies), and appends an audit entry
 * (at, key, action, reply before and after, status before and after) in the same
 * transaction. *res says what happened; out (may be NULL) receives the row now stored
 * (changed or refused; the caller owns it: store_reply_fini). */
enum ar_status store_review_change(struct store *st, const struct store_review_change *c,
                                   struct store_reply *out, enum store_change_result *res,
                                   struct ar_err *err);

/* One audit entry, borrowed for the call of a store_audit_fn. */
struct store_audit {
    int64_t at_s;
    const char *key, *action, *before, *after;
    enum store_review_status from, to;
};
typedef bool (*store_audit_fn)(const struct store_audit *a, void *user);

/* Calls fn for every audit entry of the review, oldest first (none for an unknown review). */
enum ar_status store_review_audit(struct store *st, const char *shop_id, const char *review_id,
                                  store_audit_fn fn, void *user, struct ar_err *err);

/* ---- shop profiles ------------------------------------------------------------------------
 * A shop's profile saved through the API: JSON text (the profile format of src/reply/reply.h,
 * checked by the caller) that replaces the config file's profile of that shop. */

/* Stores (inserts or replaces) the profile of shop_id; json is 1 byte to 1 MiB. */
enum ar_status store_shop_put(struct store *st, const char *shop_id, const char *json,
                              struct ar_err *err);
/* *found says whether shop_id has a stored profile; then *json is new (ar_free) and
 * *updated_s (may be NULL) its time. */
enum ar_status store_shop_get(struct store *st, const char *shop_id, char **json,
                              int64_t *updated_s, bool *found, struct ar_err *err);
/* Calls fn for every stored profile in shop_id order (strings borrowed for the call). */
typedef bool (*store_shop_fn)(const char *shop_id, const char *json, int64_t updated_s,
                              void *user);
enum ar_status store_shops_list(struct store *st, store_shop_fn fn, void *user,
                                struct ar_err *err);

/* ---- claims: one generation per review across instances ---------------------------------
 * Before generating a reply for a review not stored yet, an instance claims it; the claim is
 * a lease of lease_s seconds on the database's clock (not the instance's), held by owner (a
 * string unique to the caller: instance and thread, say). A claim whose owner died is taken
 * over by the next claimer once its lease expired. */
enum store_claim {
    STORE_CLAIM_STORED, /* a reply exists: *row filled (the caller owns it: store_reply_fini) */
    STORE_CLAIM_OWNED,  /* the caller must generate, then store_reply_put (which ends the
                           claim) or store_reply_unclaim */
    STORE_CLAIM_HELD    /* another owner holds a live lease: ask again later */
};

/* Looks the review up and, when no reply is stored, claims it for owner (1 to STORE_ID_MAX
 * bytes) for lease_s seconds (0 < lease_s <= 86400): *out says which of the three it is; row
 * is filled only for STORE_CLAIM_STORED. A live claim of the same owner is renewed (OWNED). */
enum ar_status store_reply_claim(struct store *st, const char *shop_id, const char *review_id,
                                 const char *owner, double lease_s, enum store_claim *out,
                                 struct store_reply *row, struct ar_err *err);
/* Gives up owner's claim on the review (a failed generation), so that the next claimer need
 * not wait for the lease; a claim of another owner, or none, is left as it is (AR_OK). */
enum ar_status store_reply_unclaim(struct store *st, const char *shop_id, const char *review_id,
                                   const char *owner, struct ar_err *err);

/* Ends every claim whose owner starts with owner_prefix (1 to STORE_ID_MAX bytes): what an
 * instance restarting under its name does with the claims its previous run left when it died,
 * so that nobody waits for their leases. *n_out (may be NULL) receives how many ended. */
enum ar_status store_reply_claims_release(struct store *st, const char *owner_prefix,
                                          int64_t *n_out, struct ar_err *err);

/* ---- bulk jobs ----------------------------------------------------------------------- */

enum store_job_status {
    STORE_JOB_QUEUED = 0, /* created, no line finished yet */
    STORE_JOB_RUNNING,    /* some lines finished */
    STORE_JOB_DONE,       /* every line finished (done or error) */
    STORE_JOB_FAILED,     /* given up as a whole (store_job_set_status) */
    STORE_JOB_CANCELLED   /* cancelled by the client (store_job_set_status) */
};

enum store_item_status {
    STORE_ITEM_PENDING = 0, /* not processed yet (or processed but not recorded) */
    STORE_ITEM_DONE,        /* result holds the result JSON */
    STORE_ITEM_ERROR        /* result holds an error message */
};

/* Static strings ("queued", "pending", ...), never NULL. */
const char *store_job_status_str(enum store_job_status s);
const char *store_item_status_str(enum store_item_status s);

struct store_job_info {
    char id[STORE_JOB_ID_LEN + 1];
    enum store_job_status status;
    int64_t n_total;                /* lines */
    int64_t n_done;                 /* lines finished with a result */
    int64_t n_failed;               /* lines finished with an error */
    int64_t created_s, updated_s;   /* unix seconds */
    char shop_id[STORE_ID_MAX + 1]; /* the job's shop (default for its lines) */
    bool published;                 /* its lines were handed to a queue (store_job_set_published) */
    char owner[STORE_ID_MAX + 1];   /* who created it ("" for jobs from before owners) */
    int64_t bytes;                  /* bytes of its lines' input, as stored */
    int64_t seq;                    /* creation order: a later job has a larger seq (> 0) */
    char callback_url[STORE_URL_MAX + 1]; /* "" for none */
    bool notified;                        /* its completion was claimed (store_job_claim_notify) */
};

/* One input line of a job, as given to store_job_create (strings borrowed). */
struct store_item_in {
    int64_t line;      /* line number in the uploaded file, >= 1, unique within the job */
    const char *input; /* the line's JSON text, not NULL */
};

/* One line as read back. From store_job_next_pending the strings point into `storage`,
 * owned by the item (store_items_free); in a store_job_results callback they are borrowed
 * for the call and storage is NULL. */
struct store_item {
    int64_t line;
    enum store_item_status status;
    const char *input;  /* the line's JSON text */
    const char *result; /* result JSON (done), error message (error), NULL (pending) */
    char *storage;
};

void store_items_free(struct store_item *items, size_t n);
/* Releases one item's storage and zeroes it, for an item in the caller's own memory (as
 * store_job_item_get fills); NULL or a zeroed item does nothing. */
void store_item_fini(struct store_item *it);

/* Creates a queued job holding n >= 1 lines, all pending, in one transaction (all or
 * nothing). job_id receives the new id, STORE_JOB_ID_LEN hex digits and a NUL. */
enum ar_status store_job_create(struct store *st, const char *shop_id,
                                const struct store_item_in *items, size_t n,
                                char job_id[STORE_JOB_ID_LEN + 1], struct ar_err *err);

/* What a job is created with besides its lines (strings borrowed). */
struct store_job_spec {
    const char *shop_id;      /* 1 to STORE_ID_MAX bytes */
    const char *owner;        /* 0 to STORE_ID_MAX bytes; NULL: "" */
    const char *callback_url; /* 0 to STORE_URL_MAX bytes; NULL: "" (none) */
};

/* store_job_create with an owner and a callback URL; the job's bytes are the sum of its
 * lines' input lengths. */
enum ar_status store_job_create_spec(struct store *st, const struct store_job_spec *spec,
                                     const struct store_item_in *items, size_t n,
                                     char job_id[STORE_JOB_ID_LEN + 1], struct ar_err *err);

/* Up to max pending lines of the job with line > after_line, in line order (after_line 0
 * starts at the beginning). *items_out is owned by the caller (store_items_free); it is
 * NULL when *n_out is 0. Lines are not claimed: one worker per job is expected. */
enum ar_status store_job_next_pending(struct store *st, const char *job_id, int64_t after_line,
                                      size_t max, struct store_item **items_out, size_t *n_out,
                                      struct ar_err *err);

/* Records a pending line as done (result JSON) or as failed (error message), and updates
 * the job's counts, updated time and status (queued -> running -> done when every line is
 * finished; a failed or cancelled job keeps its status) in the same transaction. A line
 * that is not pending is left unchanged and AR_EINVAL returned, so a result is never
 * counted twice. */
enum ar_status store_job_item_done(struct store *st, const char *job_id, int64_t line,
                                   const char *result_json, struct ar_err *err);
enum ar_status store_job_item_error(struct store *st, const char *job_id, int64_t line,
                                    const char *message, struct ar_err *err);

/* Sets a job's status (e.g. STORE_JOB_CANCELLED). */
enum ar_status store_job_set_status(struct store *st, const char *job_id,
                                    enum store_job_status status, struct ar_err *err);

/* Marks a job as published: every line was handed to a queue, so that a restart need not
 * hand them over again. New jobs are created unpublished. An unknown job gives AR_EINVAL. */
enum ar_status store_job_set_published(struct store *st, const char *job_id, struct ar_err *err);

/* Reads one line of a job (its status, input and result), so that a queue consumer can skip
 * a line finished already before doing any work. *found says whether the job has that line;
 * when it does, *out is filled and owns its storage: store_item_fini(out) for an item in the
 * caller's memory, store_items_free(out, 1) only when out itself came from ar_malloc. */
enum ar_status store_job_item_get(struct store *st, const char *job_id, int64_t line,
                                  struct store_item *out, bool *found, struct ar_err *err);

/* *found says whether the job exists; when it does, *info is filled. */
enum ar_status store_job_get(struct store *st, const char *job_id, struct store_job_info *info,
                             bool *found, struct ar_err *err);

/* Calls fn for every line of the job in line order (pending ones included). The item is
 * borrowed for the call. fn returns false to stop early; the function then returns
 * AR_ECANCELED. An unknown job id gives AR_EINVAL. */
typedef bool (*store_item_fn)(const struct store_item *item, void *user);
enum ar_status store_job_results(struct store *st, const char *job_id, store_item_fn fn, void *user,
                                 struct ar_err *err);

/* Calls fn for at most limit (0: every) lines with line > after_line, in line order, as
 * store_job_results does: pages of a job's results. */
enum ar_status store_job_results_page(struct store *st, const char *job_id, int64_t after_line,
                                      size_t limit, store_item_fn fn, void *user,
                                      struct ar_err *err);

typedef bool (*store_job_fn)(const struct store_job_info *info, void *user);

/* Calls fn for at most limit (1..1000) jobs of owner ("" included) with seq < before_seq
 * (0: no bound), newest first (by seq). */
enum ar_status store_jobs_list(struct store *st, const char *owner, int64_t before_seq,
                               size_t limit, store_job_fn fn, void *user, struct ar_err *err);

/* What owner keeps: *open_jobs (queued or running jobs) and *bytes (the bytes of all its jobs,
 * finished ones included, until they are deleted). */
enum ar_status store_job_usage(struct store *st, const char *owner, int64_t *open_jobs,
                               int64_t *bytes, struct ar_err *err);

/* Cancels a queued or running job: its pending lines are never answered (a line being
 * answered may still finish); finished lines keep their results. *cancelled says whether it
 * was queued or running (false also for an unknown job). */
enum ar_status store_job_cancel(struct store *st, const char *job_id, bool *cancelled,
                                struct ar_err *err);

/* Deletes a job and all its lines in one transaction. *found says whether it existed. */
enum ar_status store_job_delete(struct store *st, const char *job_id, bool *found,
                                struct ar_err *err);

/* Claims the completion notice of a done job with a callback URL: *claimed is true for
 * exactly one caller, across handles and instances (then the job reads as notified). */
enum ar_status store_job_claim_notify(struct store *st, const char *job_id, bool *claimed,
                                      struct ar_err *err);

/* Calls fn for at most 100 done jobs with a callback URL whose notice nobody claimed (an
 * instance died between a job's last line and the claim), oldest first: what a sweeper hands
 * to store_job_claim_notify. */
enum ar_status store_jobs_unnotified(struct store *st, store_job_fn fn, void *user,
                                     struct ar_err *err);

/* Calls fn for every queued or running job, oldest first (what a restart must resume; info
 * says whether it was published). fn returns false to stop early (AR_ECANCELED). */
enum ar_status store_jobs_unfinished(struct store *st, store_job_fn fn, void *user,
                                     struct ar_err *err);

#endif
