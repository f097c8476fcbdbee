/* store_internal.h - shared by the files of src/store/: the operations every backend
 * implements (sqlite.c, postgres.c) behind the public functions of store_replies.c and
 * store_jobs.c, and the helpers they share (store.c). The public functions check every argument
 * before they call an operation, so a backend sees only valid ids, lines, statuses and non-NULL
 * outputs. */
#ifndef AR_STORE_INTERNAL_H
#define AR_STORE_INTERNAL_H

#include "store.h"

/* Each operation has the semantics of the public function of the same name (store.h);
 * outputs arrive zeroed. */
struct store_ops {
    const char *name; /* "sqlite", "postgres" */
    void (*close)(struct store *st);
    bool (*healthy)(struct store *st); /* NULL: always */
    enum ar_status (*reply_get)(struct store *st, const char *shop_id, const char *review_id,
                                struct store_reply *out, bool *found, struct ar_err *err);
    /* Inserts r (created: its time, never 0) unless the key exists, and ends any claim on the
     * key, in one transaction. *existed says which; only when it existed and out is not NULL
     * is out filled with the existing row (store_replies.c copies r for a new row). */
    enum ar_status (*reply_put)(struct store *st, const struct store_reply *r, int64_t created,
                                struct store_reply *out, bool *existed, struct ar_err *err);
    enum ar_status (*reply_claim)(struct store *st, const char *shop_id, const char *review_id,
                                  const char *owner, double lease_s, enum store_claim *out,
                                  struct store_reply *row, struct ar_err *err);
    enum ar_status (*reply_unclaim)(struct store *st, const char *shop_id, const char *review_id,
                                    const char *owner, struct ar_err *err);
    enum ar_status (*reply_claims_release)(struct store *st, const char *owner_prefix,
                                           int64_t *n_out, struct ar_err *err);
    /* limit: 1..1000; f and after not NULL (after->shop_id NULL: from the newest) */
    enum ar_status (*reviews_list)(struct store *st, const struct store_review_filter *f,
                                   const struct store_review_cursor *after, size_t limit,
                                   store_reply_fn fn, void *user, struct ar_err *err);
    /* c's strings not NULL; now: the change's time; out may be NULL */
    enum ar_status (*review_change)(struct store *st, const struct store_review_change *c,
                                    int64_t now, struct store_reply *out,
                                    enum store_change_result *res, struct ar_err *err);
    enum ar_status (*review_audit)(struct store *st, const char *shop_id, const char *review_id,
                                   store_audit_fn fn, void *user, struct ar_err *err);
    enum ar_status (*shop_put)(struct store *st, const char *shop_id, const char *json,
                               int64_t now, struct ar_err *err);
    enum ar_status (*shop_get)(struct store *st, const char *shop_id, char **json,
                               int64_t *updated_s, bool *found, struct ar_err *err);
    enum ar_status (*shops_list)(struct store *st, store_shop_fn fn, void *user,
                                 struct ar_err *err);
    /* job_id: a fresh id from store_jobs.c; spec's strings not NULL; bytes: the lines' input */
    enum ar_status (*job_create)(struct store *st, const char *job_id,
                                 const struct store_job_spec *spec, int64_t bytes,
                                 const struct store_item_in *items, size_t n, struct ar_err *err);
    enum ar_status (*job_next_pending)(struct store *st, const char *job_id, int64_t after_line,
                                       size_t max, struct store_item **items_out, size_t *n_out,
                                       struct ar_err *err);
    /* status: STORE_ITEM_DONE or STORE_ITEM_ERROR */
    enum ar_status (*job_item_finish)(struct store *st, const char *job_id, int64_t line,
                                      enum store_item_status status, const char *text,
                                      struct ar_err *err);
    enum ar_status (*job_item_get)(struct store *st, const char *job_id, int64_t line,
                                   struct store_item *out, bool *found, struct ar_err *err);
    enum ar_status (*job_set_status)(struct store *st, const char *job_id,
                                     enum store_job_status status, struct ar_err *err);
    enum ar_status (*job_set_published)(struct store *st, const char *job_id, struct ar_err *err);
    enum ar_status (*job_get)(struct store *st, const char *job_id, struct store_job_info *info,
                              bool *found, struct ar_err *err);
    /* limit 0: every line after after_line */
    enum ar_status (*job_results)(struct store *st, const char *job_id, int64_t after_line,
                                  size_t limit, store_item_fn fn, void *user, struct ar_err *err);
    enum ar_status (*jobs_list)(struct store *st, const char *owner, int64_t before_seq,
                                size_t limit, store_job_fn fn, void *user, struct ar_err *err);
    enum ar_status (*job_usage)(struct store *st, const char *owner, int64_t *open_jobs,
                                int64_t *bytes, struct ar_err *err);
    enum ar_status (*job_cancel)(struct store *st, const char *job_id, bool *cancelled,
                                 struct ar_err *err);
    enum ar_status (*job_delete)(struct store *st, const char *job_id, bool *found,
                                 struct ar_err *err);
    enum ar_status (*job_claim_notify)(struct store *st, const char *job_id, bool *claimed,
                                       struct ar_err *err);
    enum ar_status (*jobs_unnotified)(struct store *st, store_job_fn fn, void *user,
                                      struct ar_err *err);
    enum ar_status (*jobs_unfinished)(struct store *st, store_job_fn fn, void *user,
                                      struct ar_err *err);
};

/* The handle: every backend's own struct starts with it. */
struct store {
    const struct store_ops *ops;
};

/* The backends' open functions (store_open_url picks one). */
enum ar_status store_sqlite_open(const char *path, struct store **out, struct ar_err *err);
enum ar_status store_pg_open(const char *url, struct store **out, struct ar_err *err);

/* ---- shared helpers (store.c) ---------------------------------------------------------- */

/* The names the databases keep, indexed by the enums. */
extern const char *const store_job_status_names[5];
extern const char *const store_item_status_names[3];

/* The status a database keeps by name; a name the CHECK constraints do not admit (or NULL)
 * reads as STORE_JOB_FAILED, STORE_ITEM_ERROR. */
enum store_job_status store_job_status_of(const char *name);
enum store_item_status store_item_status_of(const char *name);

/* Clears info and fills the fields a job row keeps as text (NULL id, shop_id: ""); the
 * backend fills the counts, times and published flag. */
void store_job_info_init(struct store_job_info *info, const char *id, const char *status,
                         const char *shop_id);
/* Fills the text fields added with owners (NULL: ""). */
void store_job_info_owner(struct store_job_info *info, const char *owner, const char *callback_url);

/* The names the databases keep, indexed by enum store_review_status. */
extern const char *const store_review_status_names[STORE_REVIEW_STATUS_COUNT];
/* The status a database keeps by name; an unknown name reads as pending. */
enum store_review_status store_review_status_of(const char *name);

/* Fills out with a copy of r as the store keeps it (NULL lang and model as "", created as
 * its time): one allocation for the strings, like a row read back. */
enum ar_status store_reply_copy(const struct store_reply *r, int64_t created,
                                struct store_reply *out);

/* Fills it with copies of input and result (result may be NULL) in one allocation. */
enum ar_status store_item_copy(struct store_item *it, int64_t line, enum store_item_status status,
                               const char *input, const char *result);

int64_t store_now_s(void); /* unix seconds */

/* Argument checks of the public functions: a shop or review id (1 to STORE_ID_MAX bytes), a job
 * id (STORE_JOB_ID_LEN lowercase hex digits); store_bad_arg sets err to AR_EINVAL "store: what". */
bool store_id_ok(const char *id);
bool store_job_id_ok(const char *id);
enum ar_status store_bad_arg(struct ar_err *err, const char *what);

#endif
