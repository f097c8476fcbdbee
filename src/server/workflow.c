/* workflow.c - the merchant's review workflow and shop profiles over HTTP (server.h lists the
 * routes): answered reviews listed by status, shop, rating and sentiment in newest-first pages,
 * one review with its audit log, approve (optionally edited, the edit held to the shop's
 * guardrails) / reject / regenerate, and shop profiles read and saved. The store checks and
 * changes a status atomically (store_review_change); each change records the API key that made
 * it. Work runs on the reply service's workers, never on the event loop. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

#define LIST_DEFAULT 20
#define LIST_MAX 100

/* Which transitions each action allows (documented in server.h): approve a draft, or an
 * approved reply again (an edit after approval); reject only a draft, so that an approve and
 * a reject of one draft never both succeed; regenerate anything not sent yet. */
#define FROM(s) (1u << (s))
#define APPROVE_FROM (FROM(STORE_REVIEW_PENDING) | FROM(STORE_REVIEW_APPROVED))
#define REJECT_FROM FROM(STORE_REVIEW_PENDING)

enum wf_ep {
    WF_LIST,
    WF_GET,
    WF_APPROVE,
    WF_REJECT,
    WF_REGENERATE,
    WF_SHOPS,
    WF_SHOP_GET,
    WF_SHOP_PUT
};

struct wf_task {
    struct reply_service *svc;
    struct server_req *req;
    enum wf_ep ep;
    char *shop_id, *review_id;  /* owned: from the path */
    char key[STORE_ID_MAX + 1]; /* who asks: "key:<index>" with API keys, else "" */
    const cJSON *body;          /* borrowed from req until the answer */
    struct reply_call *call;    /* regenerate: the client's budget and cancellation */
    /* GET /v1/reviews */
    struct store_review_filter f;
    struct store_review_cursor after;
    char *after_shop, *after_review; /* owned: the cursor's strings */
    int64_t limit;
};

static void task_free(struct wf_task *t)
{
    if (!t)
        return;
    ar_free(t->shop_id);
    ar_free(t->review_id);
    ar_free(t->after_shop);
    ar_free(t->after_review);
    ar_free(t);
}

static void bad_request(struct server_req *req, const char *msg)
{
    server_reply_error(req, 400, "invalid_request_error", "invalid_request", "%s", msg);
}

/* A store or service failure: 503 when it may pass (busy, out of reach), else 500. */
static void backend_error(struct server_req *req, enum ar_status st, const char *msg)
{
    enum reply_error e = reply_error_of_backend(st);
    if (e == REPLY_EBUSY || e == REPLY_EUNAVAIL)
        server_reply_error(req, 503, "server_error", reply_error_code(e), "%s",
                           msg && *msg ? msg : ar_status_str(st));
    else
        server_reply_error(req, 500, "server_error", "internal_error", "%s",
                           msg && *msg ? msg : ar_status_str(st));
}

/* ---- review JSON ---------------------------------------------------------------------------- */

static cJSON *review_json(const struct store_reply *r)
{
    cJSON *j = cJSON_CreateObject();
    bool ok = j && cJSON_AddStringToObject(j, "shop_id", r->shop_id) &&
              cJSON_AddStringToObject(j, "review_id", r->review_id) &&
              cJSON_AddStringToObject(j, "text", r->text) &&
              cJSON_AddNumberToObject(j, "rating", r->rating) &&
              cJSON_AddStringToObject(j, "lang", r->lang ? r->lang : "") &&
              cJSON_AddStringToObject(j, "reply", r->reply) &&
              cJSON_AddStringToObject(j, "status", store_review_status_str(r->status)) &&
              cJSON_AddBoolToObject(j, "needs_human", r->needs_human) &&
              cJSON_AddStringToObject(j, "sentiment",
                                      reply_sentiment_str(reply_sentiment_label(r->sentiment))) &&
              cJSON_AddNumberToObject(j, "sentiment_score",
                                      round((double)r->sentiment * 1000.0) / 1000.0) &&
              cJSON_AddBoolToObject(j, "cached", r->cached) &&
              cJSON_AddStringToObject(j, "model", r->model ? r->model : "") &&
              cJSON_AddNumberToObject(j, "created", (double)r->created_s) &&
              cJSON_AddNumberToObject(j, "updated", (double)r->updated_s);
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* The cursor of the page after r: hex of "<created>\x1f<shop_id>\x1f<review_id>" (ids never
 * hold 0x1f), opaque to clients. New (ar_free). */
static char *cursor_of(const struct store_reply *r)
{
    static const char hex[] = "0123456789abcdef";
    char head[32];
    struct ar_buf b = {0}, h = {0};
    char *raw, *out;
    size_t n;
    snprintf(head, sizeof(head), "%lld\x1f", (long long)r->created_s);
    ar_buf_puts(&b, head);
    ar_buf_puts(&b, r->shop_id);
    ar_buf_puts(&b, "\x1f");
    ar_buf_puts(&b, r->review_id);
    raw = ar_buf_take(&b, &n);
    if (!raw)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        char two[2] = {hex[(unsigned char)raw[i] >> 4], hex[(unsigned char)raw[i] & 15]};
        ar_buf_put(&h, two, 2);
    }
    ar_free(raw);
    out = ar_buf_take(&h, NULL);
    return out;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Reads a cursor of cursor_of into t->after; false when it is not one. */
static bool cursor_parse(struct wf_task *t, const char *c)
{
    size_t n = strlen(c), len = n / 2;
    char *raw, *sep1, *sep2, *end;
    long long created;
    if (n == 0 || n % 2 || n > 4 * STORE_ID_MAX)
        return false;
    raw = ar_malloc(len + 1);
    if (!raw)
        return false;
    for (size_t i = 0; i < len; i++) {
        int hi = hex_digit(c[2 * i]), lo = hex_digit(c[2 * i + 1]);
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            ar_free(raw);
            return false;
        }
        raw[i] = (char)(hi << 4 | lo);
    }
    raw[len] = '\0';
    sep1 = strchr(raw, 0x1f);
    sep2 = sep1 ? strchr(sep1 + 1, 0x1f) : NULL;
    if (!sep2 || strchr(sep2 + 1, 0x1f) || sep1 == raw) {
        ar_free(raw);
        return false;
    }
    *sep1 = *sep2 = '\0';
    created = strtoll(raw, &end, 10);
    if (*end || created < 0 || !sep1[1] || !sep2[1] || strlen(sep1 + 1) > STORE_ID_MAX ||
        strlen(sep2 + 1) > STORE_ID_MAX) {
        ar_free(raw);
        return false;
    }
    t->after_shop = ar_strdup(sep1 + 1);
    t->after_review = ar_strdup(sep2 + 1);
    ar_free(raw);
    if (!t->after_shop || !t->after_review)
        return false;
    t->after.created_s = created;
    t->after.shop_id = t->after_shop;
    t->after.review_id = t->after_review;
    return true;
}

/* ---- the work ------------------------------------------------------------------------------- */

struct list_acc {
    cJSON *data;
    int64_t n, limit;
    char *next; /* cursor after the last row of a full page */
    bool more, oom;
};

static bool list_row(const struct store_reply *r, void *user)
{
    struct list_acc *l = user;
    cJSON *j;
    if (l->n == l->limit) {
        l->more = true; /* the one read past the page */
        return false;
    }
    j = review_json(r);
    if (!j || !cJSON_AddItemToArray(l->data, j)) {
        cJSON_Delete(j);
        l->oom = true;
        return false;
    }
    l->n++;
    ar_free(l->next);
    l->next = cursor_of(r);
    l->oom = l->oom || !l->next;
    return !l->oom;
}

static void do_list(struct wf_task *t)
{
    struct list_acc l = {0};
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st;
    cJSON *j = cJSON_CreateObject();
    l.limit = t->limit;
    l.data = j && cJSON_AddStringToObject(j, "object", "list") ? cJSON_AddArrayToObject(j, "data")
                                                               : NULL;
    if (!l.data) {
        cJSON_Delete(j);
        backend_error(t->req, AR_ENOMEM, "out of memory");
        return;
    }
    st = store_reviews_list(reply_service_store(t->svc), &t->f, t->after.shop_id ? &t->after : NULL,
                            (size_t)t->limit + 1, list_row, &l, &err);
    if (l.oom)
        st = AR_ENOMEM;
    if (st != AR_OK && st != AR_ECANCELED) {
        ar_free(l.next);
        cJSON_Delete(j);
        backend_error(t->req, st, err.msg);
        return;
    }
    if (!(l.more ? cJSON_AddStringToObject(j, "next_cursor", l.next) != NULL
                 : cJSON_AddNullToObject(j, "next_cursor") != NULL)) {
        ar_free(l.next);
        cJSON_Delete(j);
        backend_error(t->req, AR_ENOMEM, "out of memory");
        return;
    }
    ar_free(l.next);
    server_reply_json(t->req, 200, j);
}

static bool audit_row(const struct store_audit *a, void *user)
{
    cJSON *arr = user, *e = cJSON_CreateObject();
    if (!e || !cJSON_AddNumberToObject(e, "at", (double)a->at_s) ||
        !cJSON_AddStringToObject(e, "key", a->key) ||
        !cJSON_AddStringToObject(e, "action", a->action) ||
        !cJSON_AddStringToObject(e, "before", a->before) ||
        !cJSON_AddStringToObject(e, "after", a->after) ||
        !cJSON_AddStringToObject(e, "from", store_review_status_str(a->from)) ||
        !cJSON_AddStringToObject(e, "to", store_review_status_str(a->to)) ||
        !cJSON_AddItemToArray(arr, e)) {
        cJSON_Delete(e);
        return false;
    }
    return true;
}

static void not_found(struct wf_task *t)
{
    server_reply_error(t->req, 404, "invalid_request_error", "not_found",
                       "no answered review %.100s of shop %.100s", t->review_id, t->shop_id);
}

static void do_get(struct wf_task *t)
{
    struct store *store = reply_service_store(t->svc);
    struct ar_err err = {AR_OK, 0, {0}};
    struct store_reply r;
    bool found = false;
    enum ar_status st;
    cJSON *j, *audit;
    st = store_reply_get(store, t->shop_id, t->review_id, &r, &found, &err);
    if (st != AR_OK) {
        backend_error(t->req, st, err.msg);
        return;
    }
    if (!found) {
        not_found(t);
        return;
    }
    j = review_json(&r);
    store_reply_fini(&r);
    audit = j ? cJSON_AddArrayToObject(j, "audit") : NULL;
    if (!audit) {
        cJSON_Delete(j);
        backend_error(t->req, AR_ENOMEM, "out of memory");
        return;
    }
    st = store_review_audit(store, t->shop_id, t->review_id, audit_row, audit, &err);
    if (st != AR_OK) {
        cJSON_Delete(j);
        backend_error(t->req, st == AR_ECANCELED ? AR_ENOMEM : st, err.msg);
        return;
    }
    server_reply_json(t->req, 200, j);
}

/* Approve or reject: one atomic change in the store. */
static void do_change(struct wf_task *t)
{
    struct store_review_change c = {0};
    struct ar_err err = {AR_OK, 0, {0}};
    struct store_reply out;
    enum store_change_result res = STORE_CHANGE_NOT_FOUND;
    enum ar_status st;
    cJSON *j;
    c.shop_id = t->shop_id;
    c.review_id = t->review_id;
    c.key = t->key;
    if (t->ep == WF_APPROVE) {
        const cJSON *edit =
            cJSON_IsObject(t->body) ? cJSON_GetObjectItemCaseSensitive(t->body, "reply") : NULL;
        char why[200];
        if (edit && !cJSON_IsNull(edit) && !cJSON_IsString(edit)) {
            bad_request(t->req, "reply must be a string (the edited reply)");
            return;
        }
        if (cJSON_IsString(edit)) {
            if (!reply_check_edit(reply_service_profile(t->svc, t->shop_id), edit->valuestring, why,
                                  sizeof(why))) {
                bad_request(t->req, why);
                return;
            }
            c.reply = edit->valuestring;
        }
        c.from_mask = APPROVE_FROM;
        c.to = STORE_REVIEW_APPROVED;
        c.action = "approve";
    } else {
        c.from_mask = REJECT_FROM;
        c.to = STORE_REVIEW_REJECTED;
        c.action = "reject";
    }
    st = store_review_change(reply_service_store(t->svc), &c, &out, &res, &err);
    if (st != AR_OK) {
        backend_error(t->req, st, err.msg);
        return;
    }
    if (res == STORE_CHANGE_NOT_FOUND) {
        not_found(t);
        return;
    }
    if (res == STORE_CHANGE_REFUSED) {
        server_reply_error(t->req, 409, "invalid_request_error", "invalid_state",
                           "cannot %s review %.100s of shop %.100s: it is %s", c.action,
                           t->review_id, t->shop_id, store_review_status_str(out.status));
        store_reply_fini(&out);
        return;
    }
    j = review_json(&out);
    store_reply_fini(&out);
    if (j)
        server_reply_json(t->req, 200, j);
    else
        backend_error(t->req, AR_ENOMEM, "out of memory");
}

static void do_regenerate(struct wf_task *t)
{
    struct reply_result r;
    struct store_reply row;
    int status;
    cJSON *j;
    reply_service_regenerate(t->svc, t->shop_id, t->review_id, t->key, t->call, &row, &r);
    if (r.err != REPLY_OK) {
        status = server_status_of_reply_error(r.err);
        if (r.err == REPLY_ECONFLICT)
            server_reply_error(t->req, 409, "invalid_request_error", "invalid_state", "%s",
                               r.error);
        else if (r.err == REPLY_ELIMITED)
            server_reply_error_ex(t->req, 429, "rate_limit_error", reply_error_code(r.err), NULL,
                                  r.retry_after_s, "%s", r.error);
        else
            server_reply_error(t->req, status,
                               status == 404 || status == 400 ? "invalid_request_error"
                                                              : "server_error",
                               reply_error_code(r.err), "%s", r.error);
        reply_result_fini(&r);
        return;
    }
    j = review_json(&row);
    store_reply_fini(&row);
    reply_result_fini(&r);
    if (j)
        server_reply_json(t->req, 200, j);
    else
        backend_error(t->req, AR_ENOMEM, "out of memory");
}

static void do_shops(struct wf_task *t)
{
    struct ar_err err = {AR_OK, 0, {0}};
    cJSON *arr = NULL, *j;
    enum ar_status st = reply_service_list_shops(t->svc, &arr, &err);
    if (st != AR_OK) {
        backend_error(t->req, st, err.msg);
        return;
    }
    j = cJSON_CreateObject();
    if (!j || !cJSON_AddStringToObject(j, "object", "list") ||
        !cJSON_AddItemToObject(j, "data", arr)) {
        cJSON_Delete(arr);
        cJSON_Delete(j);
        backend_error(t->req, AR_ENOMEM, "out of memory");
        return;
    }
    server_reply_json(t->req, 200, j);
}

static void do_shop(struct wf_task *t)
{
    struct ar_err err = {AR_OK, 0, {0}};
    cJSON *j = NULL;
    enum ar_status st;
    if (t->ep == WF_SHOP_PUT)
        st = reply_service_put_shop(t->svc, t->shop_id, t->body, &j, &err);
    else
        st = reply_service_get_shop(t->svc, t->shop_id, &j, &err);
    if (st == AR_EFORMAT || st == AR_EINVAL)
        server_reply_error(t->req, 400, "invalid_request_error", "invalid_profile", "%s", err.msg);
    else if (st != AR_OK)
        backend_error(t->req, st, err.msg);
    else
        server_reply_json(t->req, 200, j);
}

static void run(void *arg)
{
    struct wf_task *t = arg;
    switch (t->ep) {
    case WF_LIST:
        do_list(t);
        break;
    case WF_GET:
        do_get(t);
        break;
    case WF_APPROVE:
    case WF_REJECT:
        do_change(t);
        break;
    case WF_REGENERATE:
        do_regenerate(t);
        break;
    case WF_SHOPS:
        do_shops(t);
        break;
    case WF_SHOP_GET:
    case WF_SHOP_PUT:
        do_shop(t);
        break;
    }
    task_free(t);
}

/* ---- HTTP glue ------------------------------------------------------------------------------ */

/* The rest of the path after prefix split at '/' into up to max segments (each non-empty, at
 * most STORE_ID_MAX bytes; ids holding '/' cannot be named in a path). Returns how many, or
 * -1. The segments are new (ar_free). */
static int path_segments(const char *path, const char *prefix, char **seg, int max)
{
    const char *p = path + strlen(prefix);
    int n = 0;
    while (*p) {
        size_t len = strcspn(p, "/");
        if (len == 0 || len > STORE_ID_MAX || n == max)
            goto fail;
        if (!(seg[n] = ar_malloc(len + 1)))
            goto fail;
        memcpy(seg[n], p, len);
        seg[n++][len] = '\0';
        p += len;
        if (*p == '/' && p[1] == '\0')
            break; /* one trailing slash is fine */
        if (*p)
            p++;
    }
    return n;
fail:
    while (n > 0)
        ar_free(seg[--n]);
    return -1;
}

static bool charge(void *user, int64_t n_tokens, bool admission, double *retry_after_s)
{
    return server_req_charge_tokens(user, n_tokens, admission, retry_after_s);
}

static void call_cleanup(void *p)
{
    reply_call_destroy(*(struct reply_call **)p);
}

static void call_abort(struct server_req *req, void *user)
{
    (void)req;
    reply_call_cancel(user);
}

/* Queues t on the service's workers (503 when they are full). */
static void submit(struct wf_task *t)
{
    if (reply_service_submit(t->svc, run, t) != AR_OK) {
        server_reply_error(t->req, 503, "server_error", "overloaded",
                           "too many requests in progress, retry later");
        task_free(t);
    }
}

static struct wf_task *task_new(struct server_req *req, void *svc, enum wf_ep ep)
{
    struct wf_task *t = ar_calloc(1, sizeof(*t));
    const char *client = server_req_client(req);
    if (!t) {
        server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        return NULL;
    }
    t->svc = svc;
    t->req = req;
    t->ep = ep;
    t->body = server_req_body(req);
    /* with API keys the client is "key:<index>" (its line among the keys); without, open */
    if (client && !strncmp(client, "key:", 4))
        snprintf(t->key, sizeof(t->key), "%s", client);
    return t;
}

/* A whole number query argument in [lo, hi]; def when absent. */
static bool query_int(struct server_req *req, const char *name, int64_t lo, int64_t hi, int64_t def,
                      int64_t *out)
{
    const char *v = server_req_query(req, name);
    char *end;
    long long x;
    *out = def;
    if (!v)
        return true;
    x = strtoll(v, &end, 10);
    if (!*v || *end || strspn(v, "0123456789") != strlen(v) || x < lo || x > hi)
        return false;
    *out = x;
    return true;
}

static void h_list(struct server_req *req, void *svc)
{
    struct wf_task *t = task_new(req, svc, WF_LIST);
    const char *status, *sentiment, *shop, *cursor;
    int64_t rating = 0;
    /* the buckets of reply_sentiment_label: negative below -0.15, positive above 0.15 (the
     * score is a float, stored as a double) */
    const double edge = (double)0.15f;
    if (!t)
        return;
    t->f.status = -1;
    status = server_req_query(req, "status");
    sentiment = server_req_query(req, "sentiment");
    shop = server_req_query(req, "shop_id");
    cursor = server_req_query(req, "cursor");
    if (status && *status) {
        enum store_review_status s;
        if (!store_review_status_parse(status, &s)) {
            bad_request(req, "status must be pending, approved, sent or rejected");
            goto fail;
        }
        t->f.status = (int)s;
    }
    if (shop && *shop) {
        if (strlen(shop) > STORE_ID_MAX) {
            bad_request(req, "shop_id must be at most 256 bytes");
            goto fail;
        }
        t->f.shop_id = shop; /* copied below: query values live only during the handler */
    }
    if (!query_int(req, "rating", 1, 5, 0, &rating)) {
        bad_request(req, "rating must be a whole number from 1 to 5");
        goto fail;
    }
    t->f.rating = (int)rating;
    if (sentiment && *sentiment) {
        t->f.by_sentiment = true;
        if (!strcmp(sentiment, "negative")) {
            t->f.sentiment_min = -1e300;
            t->f.sentiment_max = nextafter(-edge, -INFINITY);
        } else if (!strcmp(sentiment, "neutral")) {
            t->f.sentiment_min = -edge;
            t->f.sentiment_max = edge;
        } else if (!strcmp(sentiment, "positive")) {
            t->f.sentiment_min = nextafter(edge, INFINITY);
            t->f.sentiment_max = 1e300;
        } else {
            bad_request(req, "sentiment must be negative, neutral or positive");
            goto fail;
        }
    }
    if (!query_int(req, "limit", 1, LIST_MAX, LIST_DEFAULT, &t->limit)) {
        bad_request(req, "limit must be a whole number from 1 to 100");
        goto fail;
    }
    if (cursor && *cursor && !cursor_parse(t, cursor)) {
        bad_request(req, "cursor must be the next_cursor of a previous page");
        goto fail;
    }
    if (t->f.shop_id) {
        if (!(t->shop_id = ar_strdup(t->f.shop_id))) {
            backend_error(req, AR_ENOMEM, "out of memory");
            goto fail;
        }
        t->f.shop_id = t->shop_id;
    }
    submit(t);
    return;
fail:
    task_free(t);
}

/* GET /v1/reviews/{shop_id}/{review_id} and POST .../{approve|reject|regenerate}. */
static void review_route(struct server_req *req, void *svc, bool post)
{
    char *seg[3] = {NULL, NULL, NULL};
    int n = path_segments(server_req_path(req), "/v1/reviews/", seg, 3);
    enum wf_ep ep = WF_GET;
    struct wf_task *t;
    if (post && n == 3) {
        if (!strcmp(seg[2], "approve"))
            ep = WF_APPROVE;
        else if (!strcmp(seg[2], "reject"))
            ep = WF_REJECT;
        else if (!strcmp(seg[2], "regenerate"))
            ep = WF_REGENERATE;
        else
            n = -1;
    } else if (post || n != 2) {
        n = -1;
    }
    ar_free(seg[2]);
    if (n >= 0 && post) {
        size_t len = 0;
        const char *raw = server_req_raw_body(req, &len);
        size_t blank = raw ? strspn(raw, " \t\r\n") : 0;
        if (raw && blank < len && !cJSON_IsObject(server_req_body(req))) {
            ar_free(seg[0]);
            ar_free(seg[1]);
            bad_request(req, "the body must be a JSON object (or none)");
            return;
        }
    }
    if (n < 0) {
        ar_free(seg[0]);
        ar_free(seg[1]);
        server_reply_error(req, 404, "not_found_error", "not_found", "no route for %s %s",
                           server_req_method(req), server_req_path(req));
        return;
    }
    if (!(t = task_new(req, svc, ep))) {
        ar_free(seg[0]);
        ar_free(seg[1]);
        return;
    }
    t->shop_id = seg[0];
    t->review_id = seg[1];
    if (ep == WF_REGENERATE) {
        /* the generation is the client's: its token budget, cancelled when it goes away */
        struct reply_call **slot = server_req_alloc(req, sizeof(*slot), call_cleanup);
        if (slot && reply_call_create(charge, req, slot) == AR_OK) {
            t->call = *slot;
            server_req_on_abort(req, call_abort, t->call);
        }
    }
    submit(t);
}

static void h_review_get(struct server_req *req, void *svc)
{
    review_route(req, svc, false);
}

static void h_review_post(struct server_req *req, void *svc)
{
    review_route(req, svc, true);
}

static void h_shops(struct server_req *req, void *svc)
{
    struct wf_task *t = task_new(req, svc, WF_SHOPS);
    if (t)
        submit(t);
}

static void shop_route(struct server_req *req, void *svc, enum wf_ep ep)
{
    char *seg[1] = {NULL};
    int n = path_segments(server_req_path(req), "/v1/shops/", seg, 1);
    struct wf_task *t;
    if (n != 1) {
        server_reply_error(req, 404, "not_found_error", "not_found", "no route for %s %s",
                           server_req_method(req), server_req_path(req));
        return;
    }
    if (ep == WF_SHOP_PUT && !cJSON_IsObject(server_req_body(req))) {
        ar_free(seg[0]);
        bad_request(req, "the body must be a JSON object (a shop profile)");
        return;
    }
    if (!(t = task_new(req, svc, ep))) {
        ar_free(seg[0]);
        return;
    }
    t->shop_id = seg[0];
    submit(t);
}

static void h_shop_get(struct server_req *req, void *svc)
{
    shop_route(req, svc, WF_SHOP_GET);
}

static void h_shop_put(struct server_req *req, void *svc)
{
    shop_route(req, svc, WF_SHOP_PUT);
}

enum ar_status server_workflow_attach(struct server *s, struct reply_service *svc)
{
    const struct server_route routes[] = {
        {"GET", "/v1/reviews", h_list, svc, 0, 0},
        /* GET /v1/reviews/{shop_id}/{review_id} */
        {"GET", "/v1/reviews/", h_review_get, svc, SERVER_ROUTE_PREFIX, 0},
        /* POST /v1/reviews/{shop_id}/{review_id}/approve|reject|regenerate (the exact
         * /v1/reviews/reply and /v1/reviews/batch win over the prefix); RAW: the body is
         * optional, an object when given */
        {"POST", "/v1/reviews/", h_review_post, svc,
         SERVER_ROUTE_PREFIX | SERVER_ROUTE_BODY | SERVER_ROUTE_RAW, 0},
        {"GET", "/v1/shops", h_shops, svc, 0, 0},
        {"GET", "/v1/shops/", h_shop_get, svc, SERVER_ROUTE_PREFIX, 0},
        {"PUT", "/v1/shops/", h_shop_put, svc, SERVER_ROUTE_PREFIX | SERVER_ROUTE_BODY, 0},
    };
    for (size_t i = 0; i < AR_ARRAY_LEN(routes); i++) {
        enum ar_status st = server_add_route(s, &routes[i]);
        if (st != AR_OK)
            return st;
    }
    return AR_OK;
}
