/* store.c - what the store's files and backends share: status names, argument checks, copies
 * of rows into caller-owned structs, and opening a store (the choice of backend by URL). The
 * public functions over the backend's operations (store_internal.h) are in store_replies.c and
 * store_jobs.c: argument checks, then the operation. */
#include "store_internal.h"

#include <stdio.h>
#include <time.h>

/* ---- shared helpers ------------------------------------------------------------------ */

const char *const store_job_status_names[5] = {"queued", "running", "done", "failed", "cancelled"};
const char *const store_item_status_names[3] = {"pending", "done", "error"};

const char *const store_review_status_names[STORE_REVIEW_STATUS_COUNT] = {"pending", "approved",
                                                                          "sent", "rejected"};

const char *store_review_status_str(enum store_review_status s)
{
    if ((unsigned)s < AR_ARRAY_LEN(store_review_status_names))
        return store_review_status_names[s];
    return "unknown";
}

const char *store_job_status_str(enum store_job_status s)
{
    if ((unsigned)s < AR_ARRAY_LEN(store_job_status_names))
        return store_job_status_names[s];
    return "unknown";
}

const char *store_item_status_str(enum store_item_status s)
{
    if ((unsigned)s < AR_ARRAY_LEN(store_item_status_names))
        return store_item_status_names[s];
    return "unknown";
}

/* Index of text in names[0..n), or -1 (also for NULL). */
static int status_from_name(const char *const *names, size_t n, const char *text)
{
    for (size_t i = 0; text && i < n; i++)
        if (strcmp(names[i], text) == 0)
            return (int)i;
    return -1;
}

enum store_job_status store_job_status_of(const char *name)
{
    int s = status_from_name(store_job_status_names, AR_ARRAY_LEN(store_job_status_names), name);
    return s < 0 ? STORE_JOB_FAILED : (enum store_job_status)s;
}

bool store_review_status_parse(const char *name, enum store_review_status *out)
{
    int s =
        status_from_name(store_review_status_names, AR_ARRAY_LEN(store_review_status_names), name);
    if (s < 0)
        return false;
    if (out)
        *out = (enum store_review_status)s;
    return true;
}

enum store_review_status store_review_status_of(const char *name)
{
    enum store_review_status s = STORE_REVIEW_PENDING;
    store_review_status_parse(name, &s);
    return s;
}

enum store_item_status store_item_status_of(const char *name)
{
    int s = status_from_name(store_item_status_names, AR_ARRAY_LEN(store_item_status_names), name);
    return s < 0 ? STORE_ITEM_ERROR : (enum store_item_status)s;
}

void store_job_info_init(struct store_job_info *info, const char *id, const char *status,
                         const char *shop_id)
{
    memset(info, 0, sizeof(*info));
    snprintf(info->id, sizeof(info->id), "%s", id ? id : "");
    info->status = store_job_status_of(status);
    snprintf(info->shop_id, sizeof(info->shop_id), "%s", shop_id ? shop_id : "");
}

void store_job_info_owner(struct store_job_info *info, const char *owner, const char *callback_url)
{
    snprintf(info->owner, sizeof(info->owner), "%s", owner ? owner : "");
    snprintf(info->callback_url, sizeof(info->callback_url), "%s",
             callback_url ? callback_url : "");
}

int64_t store_now_s(void)
{
    return (int64_t)time(NULL);
}

enum ar_status store_reply_copy(const struct store_reply *r, int64_t created,
                                struct store_reply *out)
{
    const char *src[] = {r->shop_id, r->review_id, r->text, r->lang, r->reply, r->model};
    const char **dst[] = {&out->shop_id, &out->review_id, &out->text,
                          &out->lang,    &out->reply,     &out->model};
    size_t len[AR_ARRAY_LEN(src)], total = 0, off = 0;
    char *buf;
    for (size_t i = 0; i < AR_ARRAY_LEN(src); i++) {
        len[i] = src[i] ? strlen(src[i]) : 0;
        total += len[i] + 1;
    }
    buf = ar_malloc(total);
    if (!buf)
        return AR_ENOMEM;
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < AR_ARRAY_LEN(src); i++) {
        if (len[i])
            memcpy(buf + off, src[i], len[i]);
        buf[off + len[i]] = '\0';
        *dst[i] = buf + off;
        off += len[i] + 1;
    }
    out->rating = r->rating;
    out->needs_human = r->needs_human;
    out->sentiment = r->sentiment;
    out->cached = r->cached;
    out->created_s = created;
    out->status = r->status;
    out->updated_s = r->updated_s ? r->updated_s : created;
    out->storage = buf;
    return AR_OK;
}

enum ar_status store_item_copy(struct store_item *it, int64_t line, enum store_item_status status,
                               const char *input, const char *result)
{
    size_t ni = input ? strlen(input) : 0;
    size_t nr = result ? strlen(result) : 0;
    char *buf = ar_malloc(ni + 1 + nr + 1);
    if (!buf)
        return AR_ENOMEM;
    memcpy(buf, input ? input : "", ni + 1);
    it->line = line;
    it->status = status;
    it->input = buf;
    it->result = NULL;
    if (result) {
        memcpy(buf + ni + 1, result, nr + 1);
        it->result = buf + ni + 1;
    }
    it->storage = buf;
    return AR_OK;
}

void store_reply_fini(struct store_reply *r)
{
    if (!r)
        return;
    ar_free(r->storage);
    memset(r, 0, sizeof(*r));
}

void store_items_free(struct store_item *items, size_t n)
{
    if (!items)
        return;
    for (size_t i = 0; i < n; i++)
        ar_free(items[i].storage);
    ar_free(items);
}

void store_item_fini(struct store_item *it)
{
    if (!it)
        return;
    ar_free(it->storage);
    memset(it, 0, sizeof(*it));
}

bool store_id_ok(const char *id)
{
    return id && id[0] && strlen(id) <= STORE_ID_MAX;
}

bool store_job_id_ok(const char *id)
{
    if (!id || strlen(id) != STORE_JOB_ID_LEN)
        return false;
    for (const char *p = id; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

enum ar_status store_bad_arg(struct ar_err *err, const char *what)
{
    return ar_err_set(err, AR_EINVAL, 0, "store: %s", what);
}

/* ---- open / close -------------------------------------------------------------------- */

enum ar_status store_open(const char *path, struct store **out, struct ar_err *err)
{
    if (!out)
        return store_bad_arg(err, "out is NULL");
    *out = NULL;
    if (!path || !path[0])
        return store_bad_arg(err, "empty database path");
    return store_sqlite_open(path, out, err);
}

enum ar_status store_open_url(const char *url, struct store **out, struct ar_err *err)
{
    if (!out)
        return store_bad_arg(err, "out is NULL");
    *out = NULL;
    if (!url || !url[0])
        return store_bad_arg(err, "empty store URL");
    if (strncmp(url, "postgres://", 11) == 0 || strncmp(url, "postgresql://", 13) == 0)
        return store_pg_open(url, out, err);
    return store_sqlite_open(url, out, err);
}

void store_close(struct store *st)
{
    if (st)
        st->ops->close(st);
}

bool store_healthy(struct store *st)
{
    return !st || !st->ops->healthy || st->ops->healthy(st);
}

const char *store_backend_name(const struct store *st)
{
    return st ? st->ops->name : "none";
}
