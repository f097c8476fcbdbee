/* reviews.c - the review-reply product on the HTTP server: its routes, the shape of their bodies
 * and paths, the work run on the reply service's workers (the event loop is never blocked by
 * the model or the database), the answer's status from the product's error (the one mapping
 * enum reply_error -> HTTP status), and the glue to the HTTP core: a request's token budget and
 * cancellation (reply_call), Retry-After, JSON or JSONL replies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

#define DEFAULT_MAX_JOB_BODY ((size_t)64 << 20)

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
static void fail(srv_review_done_fn done, void *ctx, enum reply_error e, const char *code,
                 const char *msg)
{
    done(ctx, server_status_of_reply_error(e), error_body(code ? code : reply_error_code(e), msg),
         NULL, 0, NULL);
}

struct task {
    struct reply_service *svc;
    enum srv_review_ep ep;
    const cJSON *body;
    const char *raw;
    size_t raw_len;
    char job_id[STORE_JOB_ID_LEN + 1];
    struct reply_call *call;
    srv_review_done_fn done;
    void *ctx;
};

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

static void do_job_create(struct task *t)
{
    char id[STORE_JOB_ID_LEN + 1];
    int64_t n = 0;
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st;
    const char *shop = NULL;
    cJSON *j;
    const cJSON *reviews = cJSON_GetObjectItemCaseSensitive(t->body, "reviews");
    const cJSON *jsonl = cJSON_GetObjectItemCaseSensitive(t->body, "jsonl");
    if (cJSON_IsArray(t->body)) {
        st = reply_job_create_json(t->svc, NULL, t->body, id, &n, &err);
    } else if (cJSON_IsObject(t->body) && (reviews || jsonl)) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(t->body, "shop_id");
        if (s &&
            (!cJSON_IsString(s) || !*s->valuestring || strlen(s->valuestring) > STORE_ID_MAX)) {
            fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
                 "shop_id must be a non-empty string");
            return;
        }
        shop = s ? s->valuestring : NULL;
        if (cJSON_IsArray(reviews))
            st = reply_job_create_json(t->svc, shop, reviews, id, &n, &err);
        else if (cJSON_IsString(jsonl))
            st = reply_job_create(t->svc, shop, jsonl->valuestring, strlen(jsonl->valuestring), id,
                                  &n, &err);
        else
            st = ar_err_set(&err, AR_EINVAL, 0,
                            "the body needs \"reviews\" (an array) or \"jsonl\" (a string)");
    } else if (t->raw && t->raw_len) {
        /* JSONL text (an object alone on its one line is a job of one review) */
        st = reply_job_create(t->svc, NULL, t->raw, t->raw_len, id, &n, &err);
    } else if (t->body) {
        st = ar_err_set(&err, AR_EINVAL, 0,
                        "the body needs \"reviews\" (an array) or \"jsonl\" (a string)");
    } else {
        st = ar_err_set(&err, AR_EINVAL, 0, "no body");
    }
    if (st == AR_EINVAL) {
        fail(t->done, t->ctx, REPLY_EINVAL, "invalid_request",
             err.msg[0] ? err.msg : ar_status_str(st));
        return;
    }
    if (st != AR_OK) {
        fail_backend(t, st, err.msg);
        return;
    }
    j = cJSON_CreateObject();
    if (j && cJSON_AddStringToObject(j, "id", id) &&
        cJSON_AddStringToObject(j, "status", "queued") &&
        cJSON_AddNumberToObject(j, "total", (double)n))
        t->done(t->ctx, 202, j, NULL, 0, NULL);
    else {
        cJSON_Delete(j);
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
    }
}

static void do_job_get(struct task *t)
{
    struct store_job_info info;
    bool found = false;
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st = reply_job_get(t->svc, t->job_id, &info, &found, &err);
    cJSON *j;
    if (st != AR_OK) {
        fail_backend(t, st, err.msg);
        return;
    }
    if (!found) {
        fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such job");
        return;
    }
    j = reply_job_info_to_json(&info);
    if (j)
        t->done(t->ctx, 200, j, NULL, 0, NULL);
    else
        fail(t->done, t->ctx, REPLY_EINTERNAL, NULL, "out of memory");
}

static void do_job_results(struct task *t)
{
    char *text = NULL;
    size_t len = 0;
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st = reply_job_results_jsonl(t->svc, t->job_id, &text, &len, &err);
    if (st == AR_EINVAL) {
        fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such job");
        return;
    }
    if (st != AR_OK) {
        fail_backend(t, st, err.msg);
        return;
    }
    t->done(t->ctx, 200, NULL, text, len, "application/x-ndjson");
    ar_free(text);
}

static void run_task(void *arg)
{
    struct task *t = arg;
    switch (t->ep) {
    case SRV_REVIEW_REPLY:
        do_reply(t);
        break;
    case SRV_REVIEW_BATCH:
        do_batch(t);
        break;
    case SRV_REVIEW_JOB_CREATE:
        do_job_create(t);
        break;
    case SRV_REVIEW_JOB_GET:
        do_job_get(t);
        break;
    case SRV_REVIEW_JOB_RESULTS:
        do_job_results(t);
        break;
    default:
        fail(t->done, t->ctx, REPLY_ENOTFOUND, NULL, "no such endpoint");
        break;
    }
    ar_free(t);
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
    if (*id == '\0' || !strcmp(id, "/"))
        t->ep = SRV_REVIEW_JOB_GET;
    else if (!strcmp(id, "/results"))
        t->ep = SRV_REVIEW_JOB_RESULTS;
    else
        return false;
    return true;
}

void srv_review_handle(struct reply_service *svc, enum srv_review_ep ep, const char *path,
                       const cJSON *body, const char *raw, size_t raw_len, struct reply_call *call,
                       srv_review_done_fn done, void *ctx)
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
    if (ep == SRV_REVIEW_JOB_GET || ep == SRV_REVIEW_JOB_RESULTS) {
        if (!parse_job_path(path, t)) {
            ar_free(t);
            fail(done, ctx, REPLY_ENOTFOUND, NULL, "no such job");
            return;
        }
    } else if (ep == SRV_REVIEW_REPLY && !cJSON_IsObject(body)) {
        ar_free(t);
        fail(done, ctx, REPLY_EINVAL, "invalid_request", "the body must be a JSON object");
        return;
    } else if (ep == SRV_REVIEW_BATCH && !cJSON_IsObject(body) && !cJSON_IsArray(body)) {
        ar_free(t);
        fail(done, ctx, REPLY_EINVAL, "invalid_request", "the body must be a JSON object or array");
        return;
    }
    if (reply_service_submit(svc, run_task, t) != AR_OK) {
        ar_free(t);
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
            srv_retry_after_header(req, srv_retry_after_s(server_req_server(req)));
        if (status == 429 || limited)
            srv_retry_after_header(req, reply_call_retry_after(hc->call));
        if (limited)
            metrics_inc(srv_metrics_of(server_req_server(req))->rejected_rate, limited);
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

static void http_route(struct server_req *req, struct reply_service *svc, enum srv_review_ep ep)
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
    srv_review_handle(svc, ep, server_req_path(req), body, raw, raw_len, hc->call, http_done, hc);
}

/* One handler per route, each with the service as its user pointer (nothing to free). */
static void h_reply(struct server_req *req, void *svc)
{
    http_route(req, svc, SRV_REVIEW_REPLY);
}
static void h_batch(struct server_req *req, void *svc)
{
    http_route(req, svc, SRV_REVIEW_BATCH);
}
static void h_job_create(struct server_req *req, void *svc)
{
    http_route(req, svc, SRV_REVIEW_JOB_CREATE);
}
static void h_job_get(struct server_req *req, void *svc)
{
    http_route(req, svc, SRV_REVIEW_JOB_GET); /* .../results too */
}

struct server_reviews_params server_reviews_default_params(void)
{
    struct server_reviews_params p = {0};
    p.max_job_body = DEFAULT_MAX_JOB_BODY;
    return p;
}

enum ar_status server_reviews_attach(struct server *s, struct reply_service *svc,
                                     const struct server_reviews_params *p)
{
    /* Answers that need the model wait for it (503 "loading" before); jobs are stored and read
     * without it (the runner starts with the model and picks up what was queued). */
    const struct server_route routes[] = {
        {"POST", "/v1/reviews/reply", h_reply, svc, SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY, 0},
        /* {"reviews": [...]} or the bare array */
        {"POST", "/v1/reviews/batch", h_batch, svc,
         SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY | SERVER_ROUTE_ARRAY, 0},
        /* JSON object or array, MessagePack, or JSONL text */
        {"POST", "/v1/jobs", h_job_create, svc, SERVER_ROUTE_BODY | SERVER_ROUTE_RAW,
         p && p->max_job_body ? p->max_job_body : DEFAULT_MAX_JOB_BODY},
        /* GET /v1/jobs/{id} and GET /v1/jobs/{id}/results */
        {"GET", "/v1/jobs/", h_job_get, svc, SERVER_ROUTE_PREFIX, 0},
    };
    if (!s || !svc)
        return AR_EINVAL;
    for (size_t i = 0; i < AR_ARRAY_LEN(routes); i++) {
        enum ar_status st = server_add_route(s, &routes[i]);
        if (st != AR_OK)
            return st;
    }
    return AR_OK;
}
