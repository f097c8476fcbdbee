/* store.c - the store's public functions: argument checks, then the backend's operation
 * (store_internal.h); plus what the backends share: status names, job ids, copies of rows
 * into caller-owned structs, and the choice of backend by URL. */
#include "store_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/random.h>
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
    int s = status_from_name(store_review_status_names, AR_ARRAY_LEN(store_review_status_names),
                             name);
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

static bool id_ok(const char *id)
{
    return id && id[0] && strlen(id) <= STORE_ID_MAX;
}

static bool job_id_ok(const char *id)
{
    if (!id || strlen(id) != STORE_JOB_ID_LEN)
        return false;
    for (const char *p = id; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

static enum ar_status bad_arg(struct ar_err *err, const char *what)
{
    return ar_err_set(err, AR_EINVAL, 0, "store: %s", what);
}

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

/* ---- open / close -------------------------------------------------------------------- */

enum ar_status store_open(const char *path, struct store **out, struct ar_err *err)
{
    if (!out)
        return bad_arg(err, "out is NULL");
    *out = NULL;
    if (!path || !path[0])
        return bad_arg(err, "empty database path");
    return store_sqlite_open(path, out, err);
}

enum ar_status store_open_url(const char *url, struct store **out, struct ar_err *err)
{
    if (!out)
        return bad_arg(err, "out is NULL");
    *out = NULL;
    if (!url || !url[0])
        return bad_arg(err, "empty store URL");
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

/* ---- replies ------------------------------------------------------------------------- */

enum ar_status store_reply_get(struct store *st, const char *shop_id, const char *review_id,
                               struct store_reply *out, bool *found, struct ar_err *err)
{
    if (found)
        *found = false;
    if (out)
        memset(out, 0, sizeof(*out));
    if (!st || !out || !found)
        return bad_arg(err, "NULL argument");
    if (!id_ok(shop_id) || !id_ok(review_id))
        return bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    return st->ops->reply_get(st, shop_id, review_id, out, found, err);
}

enum ar_status store_reply_put(struct store *st, const struct store_reply *r,
                               struct store_reply *out, bool *existed, struct ar_err *err)
{
    enum ar_status res;
    struct store_reply fresh = {0};
    bool ex = false;
    int64_t created;
    if (out)
        memset(out, 0, sizeof(*out));
    if (!st || !r)
        return bad_arg(err, "NULL argument");
    if (!id_ok(r->shop_id) || !id_ok(r->review_id))
        return bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if (!r->text || !r->reply)
        return bad_arg(err, "review text and reply must not be NULL");
    if (r->rating < 1 || r->rating > 5)
        return bad_arg(err, "rating must be 1 to 5");
    if (!isfinite(r->sentiment))
        return bad_arg(err, "sentiment must be finite");
    if (r->created_s < 0)
        return bad_arg(err, "negative created time");
    if ((unsigned)r->status >= STORE_REVIEW_STATUS_COUNT)
        return bad_arg(err, "unknown review status");
    created = r->created_s ? r->created_s : store_now_s();
    /* a new row holds r's values as bound: copied without a read-back (a lookup on the hot
     * path of every new review), and before the write, so that running out of memory never
     * reports a failure for a reply that was stored */
    if (out) {
        struct store_reply as_new = *r;
        as_new.updated_s = created;
        if (store_reply_copy(&as_new, created, &fresh) != AR_OK)
            return ar_err_set(err, AR_ENOMEM, 0, "store: out of memory");
    }
    res = st->ops->reply_put(st, r, created, out, &ex, err);
    if (res != AR_OK) {
        store_reply_fini(&fresh);
        return res;
    }
    if (existed)
        *existed = ex;
    if (out && !ex)
        *out = fresh;
    else
        store_reply_fini(&fresh);
    return AR_OK;
}

/* ---- the review workflow ------------------------------------------------------------------ */

enum ar_status store_reviews_list(struct store *st, const struct store_review_filter *f,
                                  const struct store_review_cursor *after, size_t limit,
                                  store_reply_fn fn, void *user, struct ar_err *err)
{
    struct store_review_filter any = {.status = -1};
    struct store_review_cursor start = {INT64_MAX, NULL, NULL};
    if (!st || !fn)
        return bad_arg(err, "NULL argument");
    if (limit < 1 || limit > 1000)
        return bad_arg(err, "a list holds 1 to 1000 reviews");
    if (f) {
        if (f->status < -1 || f->status >= STORE_REVIEW_STATUS_COUNT)
            return bad_arg(err, "unknown review status");
        if (f->rating < 0 || f->rating > 5)
            return bad_arg(err, "rating must be 1 to 5 (0: any)");
        if (f->shop_id && strlen(f->shop_id) > STORE_ID_MAX)
            return bad_arg(err, "shop_id must be at most 256 bytes");
        if (f->by_sentiment && !(f->sentiment_min <= f->sentiment_max))
            return bad_arg(err, "empty or undefined sentiment range");
        any = *f;
    }
    if (!any.shop_id)
        any.shop_id = "";
    if (!any.by_sentiment) {
        any.sentiment_min = -1e300;
        any.sentiment_max = 1e300;
    }
    if (after && after->shop_id) {
        if (!id_ok(after->shop_id) || !id_ok(after->review_id) || after->created_s < 0)
            return bad_arg(err, "malformed cursor");
        start = *after;
    }
    return st->ops->reviews_list(st, &any, &start, limit, fn, user, err);
}

enum ar_status store_review_change(struct store *st, const struct store_review_change *c,
                                   struct store_reply *out, enum store_change_result *res,
                                   struct ar_err *err)
{
    struct store_review_change ch;
    if (out)
        memset(out, 0, sizeof(*out));
    if (res)
        *res = STORE_CHANGE_NOT_FOUND;
    if (!st || !c || !res)
        return bad_arg(err, "NULL argument");
    if (!id_ok(c->shop_id) || !id_ok(c->review_id))
        return bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if ((unsigned)c->to >= STORE_REVIEW_STATUS_COUNT ||
        (c->from_mask & ~((1u << STORE_REVIEW_STATUS_COUNT) - 1)) != 0)
        return bad_arg(err, "unknown review status");
    if (!c->action || !c->action[0] || strlen(c->action) > 32)
        return bad_arg(err, "an action must be 1 to 32 bytes");
    if (c->key && strlen(c->key) > STORE_ID_MAX)
        return bad_arg(err, "a key's name must be at most 256 bytes");
    ch = *c;
    if (!ch.key)
        ch.key = "";
    return st->ops->review_change(st, &ch, store_now_s(), out, res, err);
}

enum ar_status store_review_audit(struct store *st, const char *shop_id, const char *review_id,
                                  store_audit_fn fn, void *user, struct ar_err *err)
{
    if (!st || !fn)
        return bad_arg(err, "NULL argument");
    if (!id_ok(shop_id) || !id_ok(review_id))
        return bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    return st->ops->review_audit(st, shop_id, review_id, fn, user, err);
}

/* ---- shop profiles ------------------------------------------------------------------------ */

#define SHOP_JSON_MAX ((size_t)1 << 20)

enum ar_status store_shop_put(struct store *st, const char *shop_id, const char *json,
                              struct ar_err *err)
{
    if (!st || !json)
        return bad_arg(err, "NULL argument");
    if (!id_ok(shop_id))
        return bad_arg(err, "shop_id must be 1 to 256 bytes");
    if (!json[0] || strlen(json) > SHOP_JSON_MAX)
        return bad_arg(err, "a profile is 1 byte to 1 MiB of JSON");
    return st->ops->shop_put(st, shop_id, json, store_now_s(), err);
}

enum ar_status store_shop_get(struct store *st, const char *shop_id, char **json,
                              int64_t *updated_s, bool *found, struct ar_err *err)
{
    int64_t t = 0;
    enum ar_status res;
    if (json)
        *json = NULL;
    if (found)
        *found = false;
    if (updated_s)
        *updated_s = 0;
    if (!st || !json || !found)
        return bad_arg(err, "NULL argument");
    if (!id_ok(shop_id))
        return bad_arg(err, "shop_id must be 1 to 256 bytes");
    res = st->ops->shop_get(st, shop_id, json, &t, found, err);
    if (res == AR_OK && updated_s)
        *updated_s = t;
    return res;
}

enum ar_status store_shops_list(struct store *st, store_shop_fn fn, void *user,
                                struct ar_err *err)
{
    if (!st || !fn)
        return bad_arg(err, "NULL argument");
    return st->ops->shops_list(st, fn, user, err);
}

enum ar_status store_reply_claim(struct store *st, const char *shop_id, const char *review_id,
                                 const char *owner, double lease_s, enum store_claim *out,
                                 struct store_reply *row, struct ar_err *err)
{
    if (row)
        memset(row, 0, sizeof(*row));
    if (out)
        *out = STORE_CLAIM_HELD;
    if (!st || !out || !row)
        return bad_arg(err, "NULL argument");
    if (!id_ok(shop_id) || !id_ok(review_id))
        return bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if (!id_ok(owner))
        return bad_arg(err, "a claim's owner must be 1 to 256 bytes");
    if (!(lease_s > 0 && lease_s <= 86400))
        return bad_arg(err, "a claim's lease must be more than 0 and at most 86400 seconds");
    return st->ops->reply_claim(st, shop_id, review_id, owner, lease_s, out, row, err);
}

enum ar_status store_reply_unclaim(struct store *st, const char *shop_id, const char *review_id,
                                   const char *owner, struct ar_err *err)
{
    if (!st)
        return bad_arg(err, "NULL argument");
    if (!id_ok(shop_id) || !id_ok(review_id))
        return bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if (!id_ok(owner))
        return bad_arg(err, "a claim's owner must be 1 to 256 bytes");
    return st->ops->reply_unclaim(st, shop_id, review_id, owner, err);
}

enum ar_status store_reply_claims_release(struct store *st, const char *owner_prefix,
                                          int64_t *n_out, struct ar_err *err)
{
    int64_t n = 0;
    enum ar_status res;
    if (n_out)
        *n_out = 0;
    if (!st)
        return bad_arg(err, "NULL argument");
    if (!id_ok(owner_prefix))
        return bad_arg(err, "an owner prefix must be 1 to 256 bytes");
    res = st->ops->reply_claims_release(st, owner_prefix, &n, err);
    if (res == AR_OK && n_out)
        *n_out = n;
    return res;
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
        return bad_arg(err, "NULL argument");
    job_id[0] = '\0';
    if (!id_ok(spec->shop_id))
        return bad_arg(err, "shop_id must be 1 to 256 bytes");
    sp.shop_id = spec->shop_id;
    sp.owner = spec->owner ? spec->owner : "";
    sp.callback_url = spec->callback_url ? spec->callback_url : "";
    if (strlen(sp.owner) > STORE_ID_MAX)
        return bad_arg(err, "a job's owner must be at most 256 bytes");
    if (strlen(sp.callback_url) > STORE_URL_MAX)
        return bad_arg(err, "a callback URL must be at most 2048 bytes");
    if (n == 0 || n > INT64_MAX)
        return bad_arg(err, "a job needs at least one line");
    for (size_t i = 0; i < n; i++) {
        if (items[i].line < 1 || !items[i].input)
            return bad_arg(err, "line numbers start at 1 and every line needs input");
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
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    if (max == 0)
        return bad_arg(err, "max must be at least 1");
    return st->ops->job_next_pending(st, job_id, after_line, max, items_out, n_out, err);
}

static enum ar_status item_finish(struct store *st, const char *job_id, int64_t line,
                                  enum store_item_status status, const char *text,
                                  struct ar_err *err)
{
    if (!st || !text)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
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
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    return st->ops->job_item_get(st, job_id, line, out, found, err);
}

enum ar_status store_job_set_status(struct store *st, const char *job_id,
                                    enum store_job_status status, struct ar_err *err)
{
    if (!st)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    if ((unsigned)status >= AR_ARRAY_LEN(store_job_status_names))
        return bad_arg(err, "unknown job status");
    return st->ops->job_set_status(st, job_id, status, err);
}

enum ar_status store_job_set_published(struct store *st, const char *job_id, struct ar_err *err)
{
    if (!st)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    return st->ops->job_set_published(st, job_id, err);
}

enum ar_status store_job_get(struct store *st, const char *job_id, struct store_job_info *info,
                             bool *found, struct ar_err *err)
{
    if (!st || !info || !found)
        return bad_arg(err, "NULL argument");
    *found = false;
    memset(info, 0, sizeof(*info));
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    return st->ops->job_get(st, job_id, info, found, err);
}

enum ar_status store_job_results(struct store *st, const char *job_id, store_item_fn fn, void *user,
                                 struct ar_err *err)
{
    if (!st || !fn)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    return st->ops->job_results(st, job_id, 0, 0, fn, user, err);
}

enum ar_status store_job_results_page(struct store *st, const char *job_id, int64_t after_line,
                                      size_t limit, store_item_fn fn, void *user,
                                      struct ar_err *err)
{
    if (!st || !fn)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    if (after_line < 0 || limit > INT32_MAX)
        return bad_arg(err, "after_line must be 0 or more, limit at most 2^31-1");
    return st->ops->job_results(st, job_id, after_line, limit, fn, user, err);
}

enum ar_status store_jobs_list(struct store *st, const char *owner, int64_t before_seq,
                               size_t limit, store_job_fn fn, void *user, struct ar_err *err)
{
    if (!st || !fn || !owner)
        return bad_arg(err, "NULL argument");
    if (strlen(owner) > STORE_ID_MAX)
        return bad_arg(err, "a job's owner must be at most 256 bytes");
    if (limit < 1 || limit > 1000 || before_seq < 0)
        return bad_arg(err, "a list holds 1 to 1000 jobs, before a seq of 0 or more");
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
        return bad_arg(err, "NULL argument");
    if (strlen(owner) > STORE_ID_MAX)
        return bad_arg(err, "a job's owner must be at most 256 bytes");
    return st->ops->job_usage(st, owner, open_jobs, bytes, err);
}

enum ar_status store_job_cancel(struct store *st, const char *job_id, bool *cancelled,
                                struct ar_err *err)
{
    if (cancelled)
        *cancelled = false;
    if (!st || !cancelled)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    return st->ops->job_cancel(st, job_id, cancelled, err);
}

enum ar_status store_job_delete(struct store *st, const char *job_id, bool *found,
                                struct ar_err *err)
{
    if (found)
        *found = false;
    if (!st || !found)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    return st->ops->job_delete(st, job_id, found, err);
}

enum ar_status store_jobs_unnotified(struct store *st, store_job_fn fn, void *user,
                                     struct ar_err *err)
{
    if (!st || !fn)
        return bad_arg(err, "NULL argument");
    return st->ops->jobs_unnotified(st, fn, user, err);
}

enum ar_status store_job_claim_notify(struct store *st, const char *job_id, bool *claimed,
                                      struct ar_err *err)
{
    if (claimed)
        *claimed = false;
    if (!st || !claimed)
        return bad_arg(err, "NULL argument");
    if (!job_id_ok(job_id))
        return bad_arg(err, "malformed job id");
    return st->ops->job_claim_notify(st, job_id, claimed, err);
}

enum ar_status store_jobs_unfinished(struct store *st, store_job_fn fn, void *user,
                                     struct ar_err *err)
{
    if (!st || !fn)
        return bad_arg(err, "NULL argument");
    return st->ops->jobs_unfinished(st, fn, user, err);
}
