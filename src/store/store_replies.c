/* store_replies.c - the store's public functions for replies (get, put, claims), the review
 * workflow (list, change, audit) and shop profiles: argument checks, then the backend's
 * operation (store_internal.h). */
#include "store_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- replies ------------------------------------------------------------------------- */

enum ar_status store_reply_get(struct store *st, const char *shop_id, const char *review_id,
                               struct store_reply *out, bool *found, struct ar_err *err)
{
    if (found)
        *found = false;
    if (out)
        memset(out, 0, sizeof(*out));
    if (!st || !out || !found)
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(shop_id) || !store_id_ok(review_id))
        return store_bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
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
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(r->shop_id) || !store_id_ok(r->review_id))
        return store_bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if (!r->text || !r->reply)
        return store_bad_arg(err, "review text and reply must not be NULL");
    if (r->rating < 1 || r->rating > 5)
        return store_bad_arg(err, "rating must be 1 to 5");
    if (!isfinite(r->sentiment))
        return store_bad_arg(err, "sentiment must be finite");
    if (r->created_s < 0)
        return store_bad_arg(err, "negative created time");
    if ((unsigned)r->status >= STORE_REVIEW_STATUS_COUNT)
        return store_bad_arg(err, "unknown review status");
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
        return store_bad_arg(err, "NULL argument");
    if (limit < 1 || limit > 1000)
        return store_bad_arg(err, "a list holds 1 to 1000 reviews");
    if (f) {
        if (f->status < -1 || f->status >= STORE_REVIEW_STATUS_COUNT)
            return store_bad_arg(err, "unknown review status");
        if (f->rating < 0 || f->rating > 5)
            return store_bad_arg(err, "rating must be 1 to 5 (0: any)");
        if (f->shop_id && strlen(f->shop_id) > STORE_ID_MAX)
            return store_bad_arg(err, "shop_id must be at most 256 bytes");
        if (f->by_sentiment && !(f->sentiment_min <= f->sentiment_max))
            return store_bad_arg(err, "empty or undefined sentiment range");
        any = *f;
    }
    if (!any.shop_id)
        any.shop_id = "";
    if (!any.by_sentiment) {
        any.sentiment_min = -1e300;
        any.sentiment_max = 1e300;
    }
    if (after && after->shop_id) {
        if (!store_id_ok(after->shop_id) || !store_id_ok(after->review_id) || after->created_s < 0)
            return store_bad_arg(err, "malformed cursor");
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
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(c->shop_id) || !store_id_ok(c->review_id))
        return store_bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if ((unsigned)c->to >= STORE_REVIEW_STATUS_COUNT ||
        (c->from_mask & ~((1u << STORE_REVIEW_STATUS_COUNT) - 1)) != 0)
        return store_bad_arg(err, "unknown review status");
    if (!c->action || !c->action[0] || strlen(c->action) > 32)
        return store_bad_arg(err, "an action must be 1 to 32 bytes");
    if (c->key && strlen(c->key) > STORE_ID_MAX)
        return store_bad_arg(err, "a key's name must be at most 256 bytes");
    ch = *c;
    if (!ch.key)
        ch.key = "";
    return st->ops->review_change(st, &ch, store_now_s(), out, res, err);
}

enum ar_status store_review_audit(struct store *st, const char *shop_id, const char *review_id,
                                  store_audit_fn fn, void *user, struct ar_err *err)
{
    if (!st || !fn)
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(shop_id) || !store_id_ok(review_id))
        return store_bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    return st->ops->review_audit(st, shop_id, review_id, fn, user, err);
}

/* ---- shop profiles ------------------------------------------------------------------------ */

#define SHOP_JSON_MAX ((size_t)1 << 20)

enum ar_status store_shop_put(struct store *st, const char *shop_id, const char *json,
                              struct ar_err *err)
{
    if (!st || !json)
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(shop_id))
        return store_bad_arg(err, "shop_id must be 1 to 256 bytes");
    if (!json[0] || strlen(json) > SHOP_JSON_MAX)
        return store_bad_arg(err, "a profile is 1 byte to 1 MiB of JSON");
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
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(shop_id))
        return store_bad_arg(err, "shop_id must be 1 to 256 bytes");
    res = st->ops->shop_get(st, shop_id, json, &t, found, err);
    if (res == AR_OK && updated_s)
        *updated_s = t;
    return res;
}

enum ar_status store_shops_list(struct store *st, store_shop_fn fn, void *user, struct ar_err *err)
{
    if (!st || !fn)
        return store_bad_arg(err, "NULL argument");
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
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(shop_id) || !store_id_ok(review_id))
        return store_bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if (!store_id_ok(owner))
        return store_bad_arg(err, "a claim's owner must be 1 to 256 bytes");
    if (!(lease_s > 0 && lease_s <= 86400))
        return store_bad_arg(err, "a claim's lease must be more than 0 and at most 86400 seconds");
    return st->ops->reply_claim(st, shop_id, review_id, owner, lease_s, out, row, err);
}

enum ar_status store_reply_unclaim(struct store *st, const char *shop_id, const char *review_id,
                                   const char *owner, struct ar_err *err)
{
    if (!st)
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(shop_id) || !store_id_ok(review_id))
        return store_bad_arg(err, "shop_id and review_id must be 1 to 256 bytes");
    if (!store_id_ok(owner))
        return store_bad_arg(err, "a claim's owner must be 1 to 256 bytes");
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
        return store_bad_arg(err, "NULL argument");
    if (!store_id_ok(owner_prefix))
        return store_bad_arg(err, "an owner prefix must be 1 to 256 bytes");
    res = st->ops->reply_claims_release(st, owner_prefix, &n, err);
    if (res == AR_OK && n_out)
        *n_out = n;
    return res;
}
