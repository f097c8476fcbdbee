/* reviews.c - the review-reply product on the HTTP server: its routes, the shape of their bodies
 * and paths, the work run on the reply service's workers (the event loop is never blocked by
 * the model or the database), the answer's status from the product's error (the one mapping
 * enum reply_error -> HTTP status), and the glue to the HTTP core: a request's token budget and
 * cancellation (reply_call), Retry-After, JSON or JSONL replies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

#define DEFAULT_MAX_JOB_BODY ((size_t)64 << 20)
#define DEFAULT_JOB_MAX_OPEN 32
#define DEFAULT_JOB_MAX_BYTES ((int64_t)1 << 30)
#define JOB_LIST_DEFAULT 20 /* GET /v1/jobs page */
#define JOB_LIST_MAX 100
#define RESULTS_PAGE_DEFAULT 100 /* GET /v1/jobs/{id}/results page */
#define RESULTS_PAGE_MAX 1000
#define RESULTS_STREAM_PAGE 256            /* lines read per step of a stream */
#define RESULTS_STREAM_BUFFER (256 * 1024) /* bytes a stream may hold for a slow client */
#define RESULTS_STREAM_WAIT_S 30.0         /* a client that reads nothing this long is cut */

/* ---- errors as HTTP ------------------------------------------------------------------------ */

int server_status_of_reply_error(enum reply_error e)
{
    switch (e) {
    case REPLY_OK:
        return 200;
    case REPLY_EINVAL:
        return 400;
    case REPLY_EDUPLICATE:
    case REPLY_ECONFLICT:
        return 409;
    case REPLY_ELIMITED:
        return 429;
    case REPLY_ECANCELLED:
        return 499;
    case REPLY_EBUSY:
    case REPLY_EUNAVAIL:
        return 503;
    case REPLY_ENOTFOUND:
        return 404;
    case REPLY_EINTERNAL:
    case REPLY_ERROR_COUNT:
        break;
    }
    return 500;
}

static const char *error_type(int status)
{
    return status == 429  ? "rate_limit_error"
           : status < 500 ? "invalid_request_error"
                          : "server_error";
}

cJSON *server_review_result_json(const struct reply_result *r, const char *review_id)
{
    cJSON *j, *e;
    int status;
    if (r->err == REPLY_OK)
        return reply_result_to_json(r, review_id);
    status = server_status_of_reply_error(r->err);
    j = cJSON_CreateObject();
    e = j && (!review_id || cJSON_AddStringToObject(j, "review_id", review_id))
            ? cJSON_AddObjectToObject(j, "error")
            : NULL;
    if (!e || !cJSON_AddStringToObject(e, "message", r->error) ||
        !cJSON_AddStringToObject(e, "type", error_type(status)) ||
        !cJSON_AddStringToObject(e, "code", reply_error_code(r->err)) ||
        !cJSON_AddNumberToObject(j, "status", status)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* ---- answers ----------------------------------------------------------------------------- */

/* The body of an error the endpoints find themselves (not a review's): its type is
 * "invalid_request_error" whatever the status, as clients have always seen it. */
static cJSON *error_body(const char *code, const char *msg)
{
    cJSON *j = cJSON_CreateObject(), *e = j ? cJSON_AddObjectToObject(j, "error") : NULL;
    if (!e || !cJSON_AddStringToObject(e, "message", msg) ||
        !cJSON_AddStringToObject(e, "type", "invalid_request_error") ||
        !cJSON_AddStringToObject(e, "code", code)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* code NULL: reply_error_code(e). */
static void fail(server_review_done_fn done, void *ctx, enum reply_error e, const char *code,
                 const char *msg)
{
    done(ctx, server_status_of_reply_error(e), error_body(code ? code : reply_error_code(e), msg),
         NULL, 0, NULL);
}

struct task {
    struct reply_service *svc;
    enum server_review_ep ep;
    const cJSON *body;
    const char *raw;
    size_t raw_len;
    char job_id[STORE_JOB_ID_LEN + 1];
    struct reply_call *call;
    server_review_done_fn done;
    void *ctx;
    /* the jobs API (copies of struct server_review_opts) */
    bool api;   /* from HTTP: strict creation, quotas */
    bool jsonl; /* the body is JSONL text */
    char owner[STORE_ID_MAX + 1];
    char errors[16], limit[24], cursor[24], format[16], purge[8];
    char *shop_id;      /* owned, NULL: absent */
    char *callback_url; /* owned, NULL: absent */
    bool accept_json;
    int64_t max_open_jobs, max_bytes;
    struct server_req *stream;
};

static void task_free(struct task *t)
{
    if (!t)
        return;
    ar_free(t->shop_id);
    ar_free(t->callback_url);
    ar_free(t);
}

/* A backend failed reading or writing a job: 503 when it may work again soon (busy, out of
 * reach), else 500 (the client did not go away: never 499 here). The code stays
 * "internal_error" for a busy store, as before backends could be out of reach. */
static void fail_backend(struct task *t, enum ar_status st, const char *msg)
{
    enum reply_error e = reply_error_of_backend(st);
    if (e != REPLY_EBUSY && e != REPLY_EUNAVAIL)
        e = REPLY_EINTERNAL;
    fail(t->done, t->ctx, e, e == REPLY_EUNAVAIL ? NULL : "internal_error",
         msg && *msg ? msg : ar_status_str(st));
}

/* ---- the work ---------------------------------------------------------------------------- */

static void do_reply(struct task *t)
{
    struct reply_review rv;
    struct reply_result res;
    char msg[200];
    cJSON *j;
    if (reply_review_from_json(t->body, NULL, &rv, msg, sizeof(msg)) != AR_OK) {
        fail(t->done, t->ctx, REPLY_EINVAL, NULL, msg);
        return;
    }
    reply_service_answer_call(t->svc, &rv, ENGINE_PRIO_INTERACTIVE, t->call, &res);
    j = server_review_result_json(&res, rv.review_id);
    t->done(t->ctx, j ? server_status_of_reply_error(res.err) : 500, j, NULL, 0, NULL);
    reply_result_fini(&res);
}

static void do_batch(struct task *t)
{
    /* {"reviews": [...], "shop_id"?} or the bare array */
    const cJSON *arr =
        cJSON_IsArray(t->body) ? t->body : cJSON_GetObjectItemCaseSensitive(t->body, "reviews");
    const cJSON *shop = cJSON_GetObjectItemCaseSensitive(t->body, "shop_id"), *it;
    const char *default_shop = cJSON_IsString(shop) ? shop->valuestring : NULL;
    struct reply_review *rv = NULL, *ok_rv = NULL;
    struct reply_result *res = NULL;
    char(*msgs)[200] = NULL;
    size_t *idx = NULL, n, n_ok = 0, i = 0;
    cJSON *out = NULL, *results;
    if (!cJSON_IsArray(arr)) {
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request", "reviews must be an array");
        return;
    }
    n = (size_t)cJSON_GetArraySize(arr);
    if (n == 0 || n > REPLY_BATCH_MAX) {
        char m[96];
        snprintf(m, sizeof(m), "a batch holds 1 to %d reviews", REPLY_BATCH_MAX);
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request", m);
        return;
    }
    rv = ar_calloc(n, sizeof(*rv));
    ok_rv = ar_calloc(n, sizeof(*ok_rv));
    res = ar_calloc(n, sizeof(*res));
    msgs = ar_calloc(n, sizeof(*msgs));
    idx = ar_calloc(n, sizeof(*idx));
    if (!rv || !ok_rv || !res || !msgs || !idx)
        goto oom;
    cJSON_ArrayForEach(it, arr)
    {
        if (reply_review_from_json(it, default_shop, &rv[i], msgs[i], sizeof(msgs[i])) == AR_OK) {
            idx[n_ok] = i;
            ok_rv[n_ok++] = rv[i];
        } else {
            res[i].err = REPLY_EINVAL;
            snprintf(res[i].error, sizeof(res[i].error), "%s", msgs[i]);
        }
        i++;
    }
    {
        struct reply_result *ok_res = ar_calloc(n_ok ? n_ok : 1, sizeof(*ok_res));
        if (!ok_res)
            goto oom;
        reply_service_answer_many_call(t->svc, ok_rv, n_ok, ENGINE_PRIO_INTERACTIVE,
                                       REPLY_DUP_ERROR, t->call, ok_res);
        for (size_t k = 0; k < n_ok; k++)
            res[idx[k]] = ok_res[k];
        ar_free(ok_res);
    }
    out = cJSON_CreateObject();
    results = out ? cJSON_AddArrayToObject(out, "results") : NULL;
    if (!results)
        goto oom;
    i = 0;
    cJSON_ArrayForEach(it, arr)
    {
        /* the item's id as parsed ("review_id", else "id"), or as sent when it did not parse */
        const cJSON *rid = cJSON_GetObjectItemCaseSensitive(it, "review_id");
        const char *id = rv[i].review_id;
        cJSON *j;
        if (!id && !rid)
            rid = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!id && cJSON_IsString(rid))
            id = rid->valuestring;
        j = server_review_result_json(&res[i], id);
        if (!j || !cJSON_AddItemToArray(results, j)) {
            cJSON_Delete(j);
            goto oom;
        }
        i++;
    }
    t->done(t->ctx, 200, out, NULL, 0, NULL);
    out = NULL;
    goto done;
oom:
    cJSON_Delete(out);
    fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
done:
    if (res)
        for (size_t k = 0; k < n; k++)
            reply_result_fini(&res[k]);
    ar_free(rv);
    ar_free(ok_rv);
    ar_free(res);
    ar_free(msgs);
    ar_free(idx);
}

/* 400 naming the first bad lines: {"error": {..., "code": "invalid_request"}, "lines":
 * [{"line", "message"}...], "invalid_lines": N}. */
static void fail_bad_lines(struct task *t, const struct reply_job_outcome *o, const char *msg)
{
    cJSON *j = error_body("invalid_request", msg), *arr;
    arr = j ? cJSON_AddArrayToObject(j, "lines") : NULL;
    for (size_t i = 0; arr && i < o->n_bad; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(arr, e)) {
            cJSON_Delete(e);
            break;
        }
        cJSON_AddNumberToObject(e, "line", (double)o->bad[i].line);
        cJSON_AddStringToObject(e, "message", o->bad[i].why);
    }
    if (j)
        cJSON_AddNumberToObject(j, "invalid_lines", (double)o->n_invalid);
    if (j)
        t->done(t->ctx, 400, j, NULL, 0, NULL);
    else
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
}

/* A string option of a JSON body object (NULL when absent); false when it is not a string. */
static bool body_string(const cJSON *body, const char *name, const char **out)
{
    const cJSON *v = cJSON_IsObject(body) ? cJSON_GetObjectItemCaseSensitive(body, name) : NULL;
    *out = NULL;
    if (!v || cJSON_IsNull(v))
        return true;
    if (!cJSON_IsString(v))
        return false;
    *out = v->valuestring;
    return true;
}

static void do_job_create(struct task *t)
{
    struct reply_job_opts o = {0};
    struct reply_job_outcome *out = ar_calloc(1, sizeof(*out));
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st;
    const cJSON *items = NULL;
    const char *jsonl = NULL, *shop = t->shop_id, *cb = t->callback_url, *errors = NULL;
    size_t jsonl_len = 0;
    cJSON *j;
    if (!out) {
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
        return;
    }
    if (t->jsonl) {
        jsonl = t->raw ? t->raw : "";
        jsonl_len = t->raw ? t->raw_len : 0;
    } else if (cJSON_IsArray(t->body)) {
        items = t->body;
    } else if (cJSON_IsObject(t->body)) {
        /* {"items": [...]} ({"reviews": [...]} as before), or {"jsonl": "..."}; options */
        const cJSON *txt = cJSON_GetObjectItemCaseSensitive(t->body, "jsonl");
        items = cJSON_GetObjectItemCaseSensitive(t->body, "items");
        if (!items)
            items = cJSON_GetObjectItemCaseSensitive(t->body, "reviews");
        if (!body_string(t->body, "shop_id", &shop) || !body_string(t->body, "errors", &errors) ||
            !body_string(t->body, "callback_url", &cb)) {
            fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
                 "shop_id, errors and callback_url must be strings");
            goto done;
        }
        shop = shop ? shop : t->shop_id;
        cb = cb ? cb : t->callback_url;
        if (cJSON_IsString(txt) && !items) {
            jsonl = txt->valuestring;
            jsonl_len = strlen(jsonl);
        } else if (!cJSON_IsArray(items)) {
            fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
                 "the body needs \"items\" (an array of reviews) or \"jsonl\" (a string)");
            goto done;
        }
    } else if (t->api) {
        /* the HTTP core leaves a JSON body it cannot take to the handler: a NUL in a string
         * is refused by name (cJSON would cut the string there), anything else is not JSON */
        char field[96], m[200];
        if (t->raw && t->raw_len &&
            ar_json_has_nul(t->raw, t->raw_len, NULL, field, sizeof(field))) {
            snprintf(m, sizeof(m), "\"%s\" contains a NUL character (\\u0000)",
                     field[0] ? field : "(the body)");
            fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request", m);
        } else {
            fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
                 t->raw && t->raw_len ? "the body is not valid JSON (send JSONL as "
                                        "Content-Type: application/x-ndjson)"
                                      : "no body");
        }
        goto done;
    } else if (t->raw && t->raw_len) {
        jsonl = t->raw; /* below HTTP: raw text is JSONL */
        jsonl_len = t->raw_len;
    } else {
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request", "no body");
        goto done;
    }
    if (shop && (!*shop || strlen(shop) > STORE_ID_MAX)) {
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
             "shop_id must be a non-empty string");
        goto done;
    }
    if (!errors && t->errors[0])
        errors = t->errors;
    if (errors && strcmp(errors, "per_line") != 0 && strcmp(errors, "reject") != 0) {
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
             "errors must be \"reject\" (the default) or \"per_line\"");
        goto done;
    }
    o.default_shop = shop;
    o.owner = t->owner;
    o.callback_url = cb && *cb ? cb : NULL;
    /* below HTTP (the CLI, in-process callers), bad lines have always been per-line errors */
    o.per_line_errors = !t->api || (errors && !strcmp(errors, "per_line"));
    o.max_open_jobs = t->max_open_jobs;
    o.max_bytes = t->max_bytes;
    /* the 202 answer is built before the job is stored and filled in after without allocating:
     * running out of memory once the job exists would answer 500, and the client would upload
     * the same job again */
    {
        char placeholder[STORE_JOB_ID_LEN + 1];
        memset(placeholder, '0', STORE_JOB_ID_LEN);
        placeholder[STORE_JOB_ID_LEN] = '\0';
        j = cJSON_CreateObject();
        if (!j || !cJSON_AddStringToObject(j, "id", placeholder) ||
            !cJSON_AddStringToObject(j, "status", "queued") ||
            !cJSON_AddNumberToObject(j, "total", 0) || !cJSON_AddNumberToObject(j, "invalid", 0)) {
            cJSON_Delete(j);
            fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
            goto done;
        }
    }
    st = reply_job_submit(t->svc, &o, jsonl, jsonl_len, jsonl ? NULL : items, out, &err);
    if (st != AR_OK)
        cJSON_Delete(j);
    if (st == AR_EINVAL) {
        const char *msg = err.msg[0] ? err.msg : ar_status_str(st);
        switch (out->refused) {
        case REPLY_JOB_BAD_LINES:
            fail_bad_lines(t, out, msg);
            break;
        case REPLY_JOB_TOO_MANY_OPEN:
            t->done(t->ctx, 429, error_body("job_quota_exceeded", msg), NULL, 0, NULL);
            break;
        case REPLY_JOB_TOO_LARGE:
            t->done(t->ctx, 413, error_body("job_quota_exceeded", msg), NULL, 0, NULL);
            break;
        default:
            fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request", msg);
            break;
        }
        goto done;
    }
    if (st != AR_OK) {
        fail_backend(t, st, err.msg);
        goto done;
    }
    memcpy(cJSON_GetObjectItemCaseSensitive(j, "id")->valuestring, out->id, STORE_JOB_ID_LEN);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "total"), (double)out->n_lines);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "invalid"), (double)out->n_invalid);
    t->done(t->ctx, 202, j, NULL, 0, NULL);
done:
    ar_free(out);
}

/* Reads the caller's job: false (answered 404 or the backend's error) when it is not there or
 * belongs to another caller, who learns nothing about it. */
static bool own_job(struct task *t, struct store_job_info *info)
{
    bool found = false;
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st = reply_job_get(t->svc, t->job_id, info, &found, &err);
    if (st != AR_OK) {
        fail_backend(t, st, err.msg);
        return false;
    }
    if (!found || strcmp(info->owner, t->owner) != 0) {
        fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such job");
        return false;
    }
    return true;
}

static void do_job_get(struct task *t)
{
    struct store_job_info info;
    cJSON *j;
    if (!own_job(t, &info))
        return;
    j = reply_job_info_to_json(&info);
    if (j)
        t->done(t->ctx, 200, j, NULL, 0, NULL);
    else
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
}

/* A page size from the query: def when absent; false (400 answered) when not 1..max. */
static bool page_limit(struct task *t, int64_t def, int64_t max, int64_t *out)
{
    char *end;
    long long v;
    char m[96];
    *out = def;
    if (!t->limit[0])
        return true;
    v = strtoll(t->limit, &end, 10);
    if (*end == '\0' && end != t->limit && v >= 1 && v <= max) {
        *out = v;
        return true;
    }
    snprintf(m, sizeof(m), "limit must be a whole number from 1 to %lld", (long long)max);
    fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request", m);
    return false;
}

/* A cursor (a number this API handed out): 0 when absent; false (400 answered) when bad. */
static bool page_cursor(struct task *t, int64_t *out)
{
    char *end;
    long long v;
    *out = 0;
    if (!t->cursor[0])
        return true;
    v = strtoll(t->cursor, &end, 10);
    if (*end == '\0' && end != t->cursor && v >= 0 &&
        strspn(t->cursor, "0123456789") == strlen(t->cursor)) {
        *out = v;
        return true;
    }
    fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
         "cursor must be the next_cursor of a previous page");
    return false;
}

/* GET /v1/jobs: newest first, {"object": "list", "data", "has_more", "next_cursor"}. */
struct job_list {
    cJSON *data;
    int64_t n, limit, last_seq;
    bool more, oom;
};

static bool list_job(const struct store_job_info *info, void *user)
{
    struct job_list *l = user;
    cJSON *j;
    if (l->n == l->limit) {
        l->more = true; /* the one read past the page */
        return false;
    }
    j = reply_job_info_to_json(info);
    if (!j || !cJSON_AddItemToArray(l->data, j)) {
        cJSON_Delete(j);
        l->oom = true;
        return false;
    }
    l->n++;
    l->last_seq = info->seq;
    return true;
}

static void do_job_list(struct task *t)
{
    struct job_list l = {0};
    struct ar_err err = {AR_OK, 0, {0}};
    int64_t before;
    enum ar_status st;
    cJSON *j;
    if (!page_limit(t, JOB_LIST_DEFAULT, JOB_LIST_MAX, &l.limit) || !page_cursor(t, &before))
        return;
    j = cJSON_CreateObject();
    l.data = j && cJSON_AddStringToObject(j, "object", "list") ? cJSON_AddArrayToObject(j, "data")
                                                               : NULL;
    if (!l.data) {
        cJSON_Delete(j);
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
        return;
    }
    st = store_jobs_list(reply_service_store(t->svc), t->owner, before, (size_t)l.limit + 1,
                         list_job, &l, &err);
    if (st != AR_OK && st != AR_ECANCELED) {
        cJSON_Delete(j);
        fail_backend(t, st, err.msg);
        return;
    }
    if (l.oom || !cJSON_AddBoolToObject(j, "has_more", l.more)) {
        cJSON_Delete(j);
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
        return;
    }
    if (l.more) {
        char c[24];
        snprintf(c, sizeof(c), "%lld", (long long)l.last_seq);
        cJSON_AddStringToObject(j, "next_cursor", c);
    } else {
        cJSON_AddNullToObject(j, "next_cursor");
    }
    t->done(t->ctx, 200, j, NULL, 0, NULL);
}

/* DELETE /v1/jobs/{id}: cancels a queued or running job (its finished lines stay readable);
 * deletes a finished, failed or cancelled one, or any with purge=true. */
static void do_job_delete(struct task *t)
{
    struct store_job_info info;
    struct ar_err err = {AR_OK, 0, {0}};
    struct store *store = reply_service_store(t->svc);
    bool open, purge = !strcmp(t->purge, "true") || !strcmp(t->purge, "1"), ok = false;
    enum ar_status st;
    cJSON *j;
    if (t->purge[0] && !purge && strcmp(t->purge, "false") != 0 && strcmp(t->purge, "0") != 0) {
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request", "purge must be true or false");
        return;
    }
    if (!own_job(t, &info))
        return;
    open = info.status == STORE_JOB_QUEUED || info.status == STORE_JOB_RUNNING;
    if (open) {
        /* first cancelled, so that no line starts while the job is being deleted */
        st = store_job_cancel(store, t->job_id, &ok, &err);
        if (st != AR_OK) {
            fail_backend(t, st, err.msg);
            return;
        }
    }
    if (open && !purge) {
        bool found = false;
        st = reply_job_get(t->svc, t->job_id, &info, &found, &err);
        if (st != AR_OK) {
            fail_backend(t, st, err.msg);
            return;
        }
        j = found ? reply_job_info_to_json(&info) : NULL;
        if (j && cJSON_AddBoolToObject(j, "deleted", false))
            t->done(t->ctx, 200, j, NULL, 0, NULL);
        else if (!found)
            fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such job");
        else {
            cJSON_Delete(j);
            fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
        }
        return;
    }
    st = store_job_delete(store, t->job_id, &ok, &err);
    if (st != AR_OK) {
        fail_backend(t, st, err.msg);
        return;
    }
    if (!ok) {
        fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such job");
        return;
    }
    j = cJSON_CreateObject();
    if (j && cJSON_AddStringToObject(j, "id", t->job_id) &&
        cJSON_AddBoolToObject(j, "deleted", true))
        t->done(t->ctx, 200, j, NULL, 0, NULL);
    else {
        cJSON_Delete(j);
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
    }
}

/* Lines of results gathered as NDJSON text (a page, or a stream's step). */
struct results_buf {
    struct ar_buf b;
    enum store_job_status job_status;
    int64_t n, limit, last_line;
    bool more;
};

static bool results_line(const struct store_item *it, void *user)
{
    struct results_buf *r = user;
    if (r->limit && r->n == r->limit) {
        r->more = true; /* the one read past the page */
        return false;
    }
    if (!reply_job_result_line(&r->b, it, r->job_status))
        return false;
    r->n++;
    r->last_line = it->line;
    return true;
}

/* Streams every line after `after` as NDJSON, a page at a time, holding at most
 * RESULTS_STREAM_BUFFER bytes for a slow client. */
static void stream_results(struct task *t, const struct store_job_info *info, int64_t after)
{
    struct store *store = reply_service_store(t->svc);
    server_stream_begin(t->stream, "application/x-ndjson");
    for (;;) {
        struct results_buf r = {.job_status = info->status, .limit = RESULTS_STREAM_PAGE};
        struct ar_err err = {AR_OK, 0, {0}};
        enum ar_status st = store_job_results_page(
            store, t->job_id, after, (size_t)RESULTS_STREAM_PAGE + 1, results_line, &r, &err);
        bool more = r.more;
        if (st == AR_ECANCELED && r.b.oom)
            st = AR_ENOMEM;
        if (st != AR_OK && st != AR_ECANCELED) {
            /* the status line is out: say so in the stream itself */
            char line[300];
            int n = snprintf(line, sizeof(line),
                             "{\"error\":{\"message\":\"reading the results failed: %s\","
                             "\"code\":\"internal_error\"}}\n",
                             ar_status_str(st));
            ar_free(r.b.s);
            server_stream_write(t->stream, line, (size_t)AR_MAX(n, 0));
            break;
        }
        if (r.b.n)
            server_stream_write(t->stream, r.b.s, r.b.n);
        ar_free(r.b.s);
        after = r.last_line;
        if (!more || !server_stream_wait(t->stream, RESULTS_STREAM_BUFFER, RESULTS_STREAM_WAIT_S))
            break;
    }
    server_stream_end(t->stream);
}

/* GET /v1/jobs/{id}/results: NDJSON (the default; streamed whole unless limit is given), or a
 * JSON page {"object": "list", "data", "has_more", "next_cursor"} with format=json or Accept:
 * application/json. A page's cursor is the last line it holds. */
static void do_job_results(struct task *t)
{
    struct store_job_info info;
    struct results_buf r = {0};
    struct ar_err err = {AR_OK, 0, {0}};
    bool json = !strcmp(t->format, "json") || (!t->format[0] && t->accept_json);
    int64_t after;
    enum ar_status st;
    char next[24] = "";
    if (t->format[0] && strcmp(t->format, "json") != 0 && strcmp(t->format, "ndjson") != 0 &&
        strcmp(t->format, "jsonl") != 0) {
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
             "format must be ndjson (the default) or json");
        return;
    }
    if (!page_cursor(t, &after) ||
        !page_limit(t, json ? RESULTS_PAGE_DEFAULT : 0, RESULTS_PAGE_MAX, &r.limit))
        return;
    if (!own_job(t, &info))
        return;
    if (!json && !r.limit && t->stream) {
        stream_results(t, &info, after);
        return;
    }
    r.job_status = info.status;
    st = store_job_results_page(reply_service_store(t->svc), t->job_id, after,
                                r.limit ? (size_t)r.limit + 1 : 0, results_line, &r, &err);
    if (st == AR_ECANCELED && r.b.oom)
        st = AR_ENOMEM;
    if (st != AR_OK && st != AR_ECANCELED) {
        ar_free(r.b.s);
        if (st == AR_EINVAL)
            fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such job");
        else
            fail_backend(t, st, err.msg);
        return;
    }
    if (r.more)
        snprintf(next, sizeof(next), "%lld", (long long)r.last_line);
    if (json) {
        /* each line is one JSON object already: parse them back into the page */
        cJSON *j = cJSON_CreateObject(), *data = NULL;
        bool ok = j && cJSON_AddStringToObject(j, "object", "list") &&
                  (data = cJSON_AddArrayToObject(j, "data")) != NULL;
        for (char *p = r.b.s, *nl; ok && p && *p; p = nl + 1) {
            cJSON *it;
            nl = strchr(p, '\n');
            if (!nl)
                break;
            it = cJSON_ParseWithLength(p, (size_t)(nl - p));
            ok = it && cJSON_AddItemToArray(data, it);
            if (!ok)
                cJSON_Delete(it);
        }
        ok = ok && cJSON_AddBoolToObject(j, "has_more", r.more) &&
             (next[0] ? cJSON_AddStringToObject(j, "next_cursor", next) != NULL
                      : cJSON_AddNullToObject(j, "next_cursor") != NULL);
        ar_free(r.b.s);
        if (ok) {
            t->done(t->ctx, 200, j, NULL, 0, NULL);
        } else {
            cJSON_Delete(j);
            fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
        }
        return;
    }
    if (next[0] && t->stream)
        server_reply_header(t->stream, "X-Next-Cursor", next);
    t->done(t->ctx, 200, NULL, r.b.s ? r.b.s : "", r.b.n, "application/x-ndjson");
    ar_free(r.b.s);
}

static void run_task(void *arg)
{
    struct task *t = arg;
    switch (t->ep) {
    case SERVER_REVIEW_REPLY:
        do_reply(t);
        break;
    case SERVER_REVIEW_BATCH:
        do_batch(t);
        break;
    case SERVER_REVIEW_JOB_CREATE:
        do_job_create(t);
        break;
    case SERVER_REVIEW_JOB_GET:
        do_job_get(t);
        break;
    case SERVER_REVIEW_JOB_RESULTS:
        do_job_results(t);
        break;
    case SERVER_REVIEW_JOB_LIST:
        do_job_list(t);
        break;
    case SERVER_REVIEW_JOB_DELETE:
        do_job_delete(t);
        break;
    default:
        fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such endpoint");
        break;
    }
    task_free(t);
}

/* "/v1/jobs/<32 hex>" or ".../results": the id into t->job_id, the endpoint into t->ep. */
static bool parse_job_path(const char *path, struct task *t)
{
    const char *p = "/v1/jobs/";
    size_t n = strlen(p);
    const char *id;
    if (!path || strncmp(path, p, n) != 0)
        return false;
    id = path + n;
    for (size_t i = 0; i < STORE_JOB_ID_LEN; i++) {
        char c = id[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    memcpy(t->job_id, id, STORE_JOB_ID_LEN);
    t->job_id[STORE_JOB_ID_LEN] = '\0';
    id += STORE_JOB_ID_LEN;
    if (t->ep == SERVER_REVIEW_JOB_DELETE)
        return *id == '\0' || !strcmp(id, "/");
    if (*id == '\0' || !strcmp(id, "/"))
        t->ep = SERVER_REVIEW_JOB_GET;
    else if (!strcmp(id, "/results"))
        t->ep = SERVER_REVIEW_JOB_RESULTS;
    else
        return false;
    return true;
}

/* Copies a query value into dst (size n); false when it does not fit. */
static bool copy_query(char *dst, size_t n, const char *v)
{
    if (!v)
        return true;
    if (strlen(v) >= n)
        return false;
    memcpy(dst, v, strlen(v) + 1);
    return true;
}

/* Takes what the jobs API reads from opts into t; a message when a value is too long. */
static const char *task_opts(struct task *t, const struct server_review_opts *o)
{
    t->api = true;
    t->jsonl = o->jsonl;
    t->accept_json = o->accept_json;
    t->max_open_jobs = o->max_open_jobs;
    t->max_bytes = o->max_bytes;
    t->stream = o->stream;
    if (!copy_query(t->owner, sizeof(t->owner), o->owner))
        return "the caller's identity is too long";
    if (!copy_query(t->errors, sizeof(t->errors), o->errors))
        return "errors must be \"reject\" or \"per_line\"";
    if (!copy_query(t->limit, sizeof(t->limit), o->limit))
        return "limit is too long";
    if (!copy_query(t->cursor, sizeof(t->cursor), o->cursor))
        return "cursor is too long";
    if (!copy_query(t->format, sizeof(t->format), o->format))
        return "format must be ndjson or json";
    if (!copy_query(t->purge, sizeof(t->purge), o->purge))
        return "purge must be true or false";
    if (o->shop_id && strlen(o->shop_id) > STORE_ID_MAX)
        return "shop_id must be at most 256 bytes";
    if (o->callback_url && strlen(o->callback_url) > STORE_URL_MAX)
        return "callback_url must be at most 2048 bytes";
    if ((o->shop_id && !(t->shop_id = ar_strdup(o->shop_id))) ||
        (o->callback_url && !(t->callback_url = ar_strdup(o->callback_url))))
        return "out of memory";
    return NULL;
}

void server_review_handle(struct reply_service *svc, enum server_review_ep ep, const char *path,
                          const cJSON *body, const char *raw, size_t raw_len,
                          struct reply_call *call, server_review_done_fn done, void *ctx,
                          const struct server_review_opts *opts)
{
    struct task *t = ar_calloc(1, sizeof(*t));
    if (!t) {
        fail(done, ctx, REPLY_EINTERNAL, NULL, "out of memory");
        return;
    }
    t->svc = svc;
    t->ep = ep;
    t->body = body;
    t->raw = raw;
    t->raw_len = raw_len;
    t->call = call;
    t->done = done;
    t->ctx = ctx;
    if (opts) {
        const char *why = task_opts(t, opts);
        if (why) {
            task_free(t);
            fail(done, ctx, REPLY_EINVAL, "invalid_request", why);
            return;
        }
    }
    if (ep == SERVER_REVIEW_JOB_GET || ep == SERVER_REVIEW_JOB_RESULTS ||
        ep == SERVER_REVIEW_JOB_DELETE) {
        if (!parse_job_path(path, t)) {
            task_free(t);
            fail(done, ctx, REPLY_ENOTFOUND, NULL, "no such job");
            return;
        }
    } else if (ep == SERVER_REVIEW_REPLY && !cJSON_IsObject(body)) {
        task_free(t);
        fail(done, ctx, REPLY_EINVAL, "invalid_request", "the body must be a JSON object");
        return;
    } else if (ep == SERVER_REVIEW_BATCH && !cJSON_IsObject(body) && !cJSON_IsArray(body)) {
        task_free(t);
        fail(done, ctx, REPLY_EINVAL, "invalid_request", "the body must be a JSON object or array");
        return;
    }
    if (reply_service_submit(svc, run_task, t) != AR_OK) {
        task_free(t);
        fail(done, ctx, REPLY_EBUSY, NULL, "too many requests in progress, retry later");
    }
}

/* ---- HTTP glue ------------------------------------------------------------------------------ */

/* One review request on the server: its reply_call charges the generations to the client's
 * token bucket (rate_tpm) and is cancelled by the server's abort hook when the client goes
 * away. Lives in the request's memory (server_req_alloc), so it outlives the abort hook and
 * the answer. */
struct http_call {
    struct server_req *req;
    struct reply_call *call; /* NULL when out of memory: no budget, no cancel */
};

static void http_call_cleanup(void *p)
{
    struct http_call *hc = p;
    reply_call_destroy(hc->call);
}

static bool http_charge(void *user, int64_t n_tokens, bool admission, double *retry_after_s)
{
    return server_req_charge_tokens(user, n_tokens, admission, retry_after_s);
}

static void http_abort(struct server_req *req, void *user)
{
    (void)req;
    reply_call_cancel(user);
}

/* The items of a batch answer refused for the caller's token budget (429
 * rate_limit_exceeded); 0 for any other answer. */
static int batch_items_limited(int status, const cJSON *json)
{
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(json, "results"), *it;
    int n = 0;
    if (status != 200 || !cJSON_IsArray(results))
        return 0;
    cJSON_ArrayForEach(it, results)
    {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(it, "status");
        const cJSON *code =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(it, "error"), "code");
        if (cJSON_IsNumber(st) && st->valueint == 429 && cJSON_IsString(code) &&
            !strcmp(code->valuestring, reply_error_code(REPLY_ELIMITED)))
            n++;
    }
    return n;
}

static void http_done(void *c, int status, cJSON *json, const char *text, size_t len,
                      const char *ctype)
{
    struct http_call *hc = c;
    struct server_req *req = hc->req;
    if (json) {
        /* a batch answers 200 with each item's status: items refused for the budget are
         * refusals for load all the same (the HTTP core counts those of a 429 answer), and
         * the client learns when to retry them */
        int limited = batch_items_limited(status, json);
        if (status == 503)
            server_retry_after_header(req, server_retry_after_s(server_req_server(req)));
        if (status == 429 || limited)
            server_retry_after_header(req, reply_call_retry_after(hc->call));
        if (limited)
            metrics_inc(server_http_metrics_of(server_req_server(req))->rejected_rate, limited);
        server_reply_json(req, status, json);
    } else if (text) {
        server_reply_text(req, status, ctype ? ctype : "text/plain", text, len);
    } else {
        server_reply_error(req, 500, "server_error", "internal_error", "out of memory");
    }
}

/* MessagePack bodies are only ever read parsed (never as JSONL text). */
static bool is_msgpack(struct server_req *req)
{
    const char *ct = server_req_header(req, "Content-Type");
    return ct && strstr(ct, "msgpack");
}

/* The media type of a Content-Type (lowercase, without parameters) into out; "" for none. */
static void media_type(const char *ct, char *out, size_t n)
{
    size_t k = 0;
    while (ct && (*ct == ' ' || *ct == '\t'))
        ct++;
    for (; ct && *ct && *ct != ';' && *ct != ' ' && *ct != '\t' && k + 1 < n; ct++)
        out[k++] = (char)(*ct >= 'A' && *ct <= 'Z' ? *ct - 'A' + 'a' : *ct);
    out[k] = '\0';
}

/* POST /v1/jobs takes JSONL (NDJSON) or JSON (MessagePack too, the server's other encoding of
 * JSON): *jsonl says which; false for any other content type (415). */
static bool job_media_type(struct server_req *req, bool *jsonl)
{
    static const char *const lines[] = {"application/x-ndjson", "application/jsonl",
                                        "application/json-lines", "application/x-jsonlines",
                                        "application/jsonlines"};
    static const char *const json[] = {"application/json", "application/msgpack",
                                       "application/x-msgpack"};
    char mt[64];
    media_type(server_req_header(req, "Content-Type"), mt, sizeof(mt));
    *jsonl = false;
    for (size_t i = 0; i < AR_ARRAY_LEN(lines); i++)
        if (!strcmp(mt, lines[i]))
            return *jsonl = true;
    for (size_t i = 0; i < AR_ARRAY_LEN(json); i++)
        if (!strcmp(mt, json[i]))
            return true;
    return false;
}

/* The jobs API's view of a request: its caller, query, content type and quota. */
static void http_job_opts(struct server_req *req, const struct server_reviews_params *p,
                          struct server_review_opts *o)
{
    const char *accept = server_req_header(req, "Accept");
    memset(o, 0, sizeof(*o));
    o->owner = server_req_client(req);
    o->errors = server_req_query(req, "errors");
    o->callback_url = server_req_query(req, "callback_url");
    o->shop_id = server_req_query(req, "shop_id");
    o->limit = server_req_query(req, "limit");
    o->cursor = server_req_query(req, "cursor");
    if (!o->cursor)
        o->cursor = server_req_query(req, "after");
    o->format = server_req_query(req, "format");
    o->purge = server_req_query(req, "purge");
    o->accept_json = accept && strstr(accept, "application/json") && !strstr(accept, "ndjson") &&
                     !strstr(accept, "jsonl") && !strstr(accept, "json-lines");
    o->max_open_jobs = p->job_max_open;
    o->max_bytes = p->job_max_bytes;
    o->stream = req;
}

/* What a route's handler is given: the service and the jobs API's parameters. */
struct review_routes {
    struct reply_service *svc;
    struct server_reviews_params p;
};

static void http_route(struct server_req *req, struct reply_service *svc, enum server_review_ep ep,
                       const struct server_reviews_params *p)
{
    const cJSON *body = server_req_body(req);
    size_t raw_len = 0;
    const char *raw = server_req_raw_body(req, &raw_len);
    struct http_call *hc = server_req_alloc(req, sizeof(*hc), http_call_cleanup);
    if (!hc) {
        server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        return;
    }
    hc->req = req;
    if (reply_call_create(http_charge, req, &hc->call) != AR_OK)
        hc->call = NULL;
    else
        server_req_on_abort(req, http_abort, hc->call);
    if (raw && body && is_msgpack(req))
        raw = NULL;
    if (p) {
        struct server_review_opts o;
        http_job_opts(req, p, &o);
        if (ep == SERVER_REVIEW_JOB_CREATE && !job_media_type(req, &o.jsonl)) {
            /* nothing is stored from a body whose type says it is not a job */
            server_reply_error(req, 415, "invalid_request_error", "unsupported_media_type",
                               "POST /v1/jobs takes JSONL (Content-Type: application/x-ndjson) "
                               "or JSON (application/json: an array of reviews, or "
                               "{\"items\": [...]})");
            return;
        }
        server_review_handle(svc, ep, server_req_path(req), o.jsonl ? NULL : body, raw, raw_len,
                             hc->call, http_done, hc, &o);
        return;
    }
    server_review_handle(svc, ep, server_req_path(req), body, raw, raw_len, hc->call, http_done, hc,
                         NULL);
}

/* One handler per route: the review routes take the service as their user pointer, the jobs
 * API's its struct review_routes (freed with the server: see server_reviews_attach). */
static void h_reply(struct server_req *req, void *svc)
{
    http_route(req, svc, SERVER_REVIEW_REPLY, NULL);
}
static void h_batch(struct server_req *req, void *svc)
{
    http_route(req, svc, SERVER_REVIEW_BATCH, NULL);
}
static void h_job_create(struct server_req *req, void *rr)
{
    struct review_routes *r = rr;
    http_route(req, r->svc, SERVER_REVIEW_JOB_CREATE, &r->p);
}
static void h_job_get(struct server_req *req, void *rr)
{
    struct review_routes *r = rr;
    http_route(req, r->svc, SERVER_REVIEW_JOB_GET, &r->p); /* .../results too */
}
static void h_job_list(struct server_req *req, void *rr)
{
    struct review_routes *r = rr;
    http_route(req, r->svc, SERVER_REVIEW_JOB_LIST, &r->p);
}
static void h_job_delete(struct server_req *req, void *rr)
{
    struct review_routes *r = rr;
    http_route(req, r->svc, SERVER_REVIEW_JOB_DELETE, &r->p);
}

struct server_reviews_params server_reviews_default_params(void)
{
    struct server_reviews_params p = {0};
    p.max_job_body = DEFAULT_MAX_JOB_BODY;
    p.job_max_open = DEFAULT_JOB_MAX_OPEN;
    p.job_max_bytes = DEFAULT_JOB_MAX_BYTES;
    return p;
}

enum ar_status server_reviews_attach(struct server *s, struct reply_service *svc,
                                     const struct server_reviews_params *p)
{
    /* Answers that need the model wait for it (503 "loading" before); jobs are stored and read
     * without it (the runner starts with the model and picks up what was queued). */
    struct review_routes *rr;
    if (!s || !svc)
        return AR_EINVAL;
    rr = ar_calloc(1, sizeof(*rr));
    if (!rr)
        return AR_ENOMEM;
    rr->svc = svc;
    rr->p = p ? *p : server_reviews_default_params();
    if (!rr->p.max_job_body)
        rr->p.max_job_body = DEFAULT_MAX_JOB_BODY;
    if (rr->p.job_max_open <= 0)
        rr->p.job_max_open = DEFAULT_JOB_MAX_OPEN;
    if (rr->p.job_max_bytes <= 0)
        rr->p.job_max_bytes = DEFAULT_JOB_MAX_BYTES;
    if (server_keep(s, rr) != AR_OK) {
        ar_free(rr);
        return AR_EINVAL;
    }
    const struct server_route routes[] = {
        {"POST", "/v1/reviews/reply", h_reply, svc, SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY, 0},
        /* {"reviews": [...]} or the bare array */
        {"POST", "/v1/reviews/batch", h_batch, svc,
         SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY | SERVER_ROUTE_ARRAY, 0},
        /* JSONL (NDJSON) text, or JSON: an array or {"items": [...]}; other types: 415 */
        {"POST", "/v1/jobs", h_job_create, rr, SERVER_ROUTE_BODY | SERVER_ROUTE_RAW,
         rr->p.max_job_body},
        /* the caller's jobs, newest first */
        {"GET", "/v1/jobs", h_job_list, rr, 0, 0},
        /* GET /v1/jobs/{id} and GET /v1/jobs/{id}/results */
        {"GET", "/v1/jobs/", h_job_get, rr, SERVER_ROUTE_PREFIX, 0},
        /* cancel, then delete */
        {"DELETE", "/v1/jobs/", h_job_delete, rr, SERVER_ROUTE_PREFIX, 0},
    };
    for (size_t i = 0; i < AR_ARRAY_LEN(routes); i++) {
        enum ar_status st = server_add_route(s, &routes[i]);
        if (st != AR_OK)
            return st;
    }
    /* the merchant's workflow over the same service (workflow.c) */
    return server_workflow_attach(s, svc);
}
