/* store_jobs.c - the store's public functions for batch jobs and their items (create, the
 * next pending item, results, pages, cancel, delete, notification claims): argument checks,
 * then the backend's operation (store_internal.h); job ids from the system's randomness. */
#include "store_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

/* 128 bits from the operating system's randomness as STORE_JOB_ID_LEN hex digits. */
static enum ar_status random_job_id(char id[STORE_JOB_ID_LEN + 1], struct ar_err *err)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[STORE_JOB_ID_LEN / 2];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return ar_err_set(err, AR_EIO, 0, "store: no random bytes for a job id");
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(b); i++) {
        id[2 * i] = hex[b[i] >> 4];
        id[2 * i + 1] = hex[b[i] & 15];
    }
    id[STORE_JOB_ID_LEN] = '\0';
    return AR_OK;
}

/* ---- jobs ---------------------------------------------------------------------------- */

enum ar_status store_job_create(struct store *st, const char *shop_id,
                                const struct store_item_in *items, size_t n,
                                char job_id[STORE_JOB_ID_LEN + 1], struct ar_err *err)
{
    struct store_job_spec spec = {shop_id, NULL, NULL};
    return store_job_create_spec(st, &spec, items, n, job_id, err);
}

enum ar_status store_job_create_spec(struct store *st, const struct store_job_spec *spec,
                                     const struct store_item_in *items, size_t n,
                                     char job_id[STORE_JOB_ID_LEN + 1], struct ar_err *err)
{
    enum ar_status res;
    char id[STORE_JOB_ID_LEN + 1];
    struct store_job_spec sp;
    int64_t bytes = 0;
    if (!st || !job_id || !items || !spec)
        return store_bad_arg(err, "NULL argument");
    job_id[0] = '\0';
    if (!store_id_ok(spec->shop_id))
        return store_bad_arg(err, "shop_id must be 1 to 256 bytes");
    sp.shop_id = spec->shop_id;
    sp.owner = spec->owner ? spec->owner : "";
    sp.callback_url = spec->callback_url ? spec->callback_url : "";
    if (strlen(sp.owner) > STORE_ID_MAX)
        return store_bad_arg(err, "a job's owner must be at most 256 bytes");
    if (strlen(sp.callback_url) > STORE_URL_MAX)
        return store_bad_arg(err, "a callback URL must be at most 2048 bytes");
    if (n == 0 || n > INT64_MAX)
        return store_bad_arg(err, "a job needs at least one line");
    for (size_t i = 0; i < n; i++) {
        if (items[i].line < 1 || !items[i].input)
            return store_bad_arg(err, "line numbers start at 1 and every line needs input");
        bytes += (int64_t)strlen(items[i].input);
    }
    if ((res = random_job_id(id, err)) != AR_OK)
        return res;
    res = st->ops->job_create(st, id, &sp, bytes, items, n, err);
    if (res == AR_OK)
        memcpy(job_id, id, sizeof(id));
    return res;
}

enum ar_status store_job_next_pending(struct store *st, const char *job_id, int64_t after_line,
                                      size_t max, struct store_item **items_out, size_t *n_out,
                                      struct ar_err *err)
{
    if (items_out)
        *items_out = NULL;
    if (n_out)
        *n_out = 0;
    if (!st || !items_out || !n_out)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    if (max == 0)
        return store_bad_arg(err, "max must be at least 1");
    return st->ops->job_next_pending(st, job_id, after_line, max, items_out, n_out, err);
}

static enum ar_status item_finish(struct store *st, const char *job_id, int64_t line,
                                  enum store_item_status status, const char *text,
                                  struct ar_err *err)
{
    if (!st || !text)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_item_finish(st, job_id, line, status, text, err);
}

enum ar_status store_job_item_done(struct store *st, const char *job_id, int64_t line,
                                   const char *result_json, struct ar_err *err)
{
    return item_finish(st, job_id, line, STORE_ITEM_DONE, result_json, err);
}

enum ar_status store_job_item_error(struct store *st, const char *job_id, int64_t line,
                                    const char *message, struct ar_err *err)
{
    return item_finish(st, job_id, line, STORE_ITEM_ERROR, message, err);
}

enum ar_status store_job_item_get(struct store *st, const char *job_id, int64_t line,
                                  struct store_item *out, bool *found, struct ar_err *err)
{
    if (found)
        *found = false;
    if (out)
        memset(out, 0, sizeof(*out));
    if (!st || !out || !found)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_item_get(st, job_id, line, out, found, err);
}

enum ar_status store_job_set_status(struct store *st, const char *job_id,
                                    enum store_job_status status, struct ar_err *err)
{
    if (!st)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    if ((unsigned)status >= AR_ARRAY_LEN(store_job_status_names))
        return store_bad_arg(err, "unknown job status");
    return st->ops->job_set_status(st, job_id, status, err);
}

enum ar_status store_job_set_published(struct store *st, const char *job_id, struct ar_err *err)
{
    if (!st)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_set_published(st, job_id, err);
}

enum ar_status store_job_get(struct store *st, const char *job_id, struct store_job_info *info,
                             bool *found, struct ar_err *err)
{
    if (!st || !info || !found)
        return store_bad_arg(err, "NULL argument");
    *found = false;
    memset(info, 0, sizeof(*info));
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_get(st, job_id, info, found, err);
}

enum ar_status store_job_results(struct store *st, const char *job_id, store_item_fn fn, void *user,
                                 struct ar_err *err)
{
    if (!st || !fn)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_results(st, job_id, 0, 0, fn, user, err);
}

enum ar_status store_job_results_page(struct store *st, const char *job_id, int64_t after_line,
                                      size_t limit, store_item_fn fn, void *user,
                                      struct ar_err *err)
{
    if (!st || !fn)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    if (after_line < 0 || limit > INT32_MAX)
        return store_bad_arg(err, "after_line must be 0 or more, limit at most 2^31-1");
    return st->ops->job_results(st, job_id, after_line, limit, fn, user, err);
}

enum ar_status store_jobs_list(struct store *st, const char *owner, int64_t before_seq,
                               size_t limit, store_job_fn fn, void *user, struct ar_err *err)
{
    if (!st || !fn || !owner)
        return store_bad_arg(err, "NULL argument");
    if (strlen(owner) > STORE_ID_MAX)
        return store_bad_arg(err, "a job's owner must be at most 256 bytes");
    if (limit < 1 || limit > 1000 || before_seq < 0)
        return store_bad_arg(err, "a list holds 1 to 1000 jobs, before a seq of 0 or more");
    return st->ops->jobs_list(st, owner, before_seq, limit, fn, user, err);
}

enum ar_status store_job_usage(struct store *st, const char *owner, int64_t *open_jobs,
                               int64_t *bytes, struct ar_err *err)
{
    if (open_jobs)
        *open_jobs = 0;
    if (bytes)
        *bytes = 0;
    if (!st || !owner || !open_jobs || !bytes)
        return store_bad_arg(err, "NULL argument");
    if (strlen(owner) > STORE_ID_MAX)
        return store_bad_arg(err, "a job's owner must be at most 256 bytes");
    return st->ops->job_usage(st, owner, open_jobs, bytes, err);
}

enum ar_status store_job_cancel(struct store *st, const char *job_id, bool *cancelled,
                                struct ar_err *err)
{
    if (cancelled)
        *cancelled = false;
    if (!st || !cancelled)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_cancel(st, job_id, cancelled, err);
}

enum ar_status store_job_delete(struct store *st, const char *job_id, bool *found,
                                struct ar_err *err)
{
    if (found)
        *found = false;
    if (!st || !found)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_delete(st, job_id, found, err);
}

enum ar_status store_jobs_unnotified(struct store *st, store_job_fn fn, void *user,
                                     struct ar_err *err)
{
    if (!st || !fn)
        return store_bad_arg(err, "NULL argument");
    return st->ops->jobs_unnotified(st, fn, user, err);
}

enum ar_status store_job_claim_notify(struct store *st, const char *job_id, bool *claimed,
                                      struct ar_err *err)
{
    if (claimed)
        *claimed = false;
    if (!st || !claimed)
        return store_bad_arg(err, "NULL argument");
    if (!store_job_id_ok(job_id))
        return store_bad_arg(err, "malformed job id");
    return st->ops->job_claim_notify(st, job_id, claimed, err);
}

enum ar_status store_jobs_unfinished(struct store *st, store_job_fn fn, void *user,
                                     struct ar_err *err)
{
    if (!st || !fn)
        return store_bad_arg(err, "NULL argument");
    return st->ops->jobs_unfinished(st, fn, user, err);
}
