/* handlers.c - the product's endpoints without HTTP: a route list for the server to register
 * and one entry point that validates a request, runs the work on a service worker (the
 * caller's thread, e.g. an HTTP event loop, is never blocked by the model or the database) and
 * answers through a callback with a status and a JSON or JSONL body. A request's reply_call
 * (token budget, cancellation) goes with its reviews to the service. */
#include <stdio.h>
#include <string.h>

#include "reply_internal.h"

static const struct reply_route routes[] = {
    {"POST", "/v1/reviews/reply", false, true, REPLY_EP_REPLY},
    {"POST", "/v1/reviews/batch", false, true, REPLY_EP_BATCH},
    {"POST", "/v1/jobs", false, true, REPLY_EP_JOB_CREATE},
    /* GET /v1/jobs/{id} and GET /v1/jobs/{id}/results */
    {"GET", "/v1/jobs/", true, false, REPLY_EP_JOB_GET},
};

const struct reply_route *reply_routes(size_t *n)
{
    *n = AR_ARRAY_LEN(routes);
    return routes;
}

/* ---- answers ----------------------------------------------------------------------------- */

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

static void fail(reply_done_fn done, void *ctx, int status, const char *code, const char *msg)
{
    done(ctx, status, error_body(code, msg), NULL, 0, NULL);
}

struct task {
    struct reply_service *svc;
    enum reply_endpoint ep;
    const cJSON *body;
    const char *raw;
    size_t raw_len;
    char job_id[STORE_JOB_ID_LEN + 1];
    struct reply_call *call;
    reply_done_fn done;
    void *ctx;
};

/* ---- the work ---------------------------------------------------------------------------- */

static void do_reply(struct task *t)
{
    struct reply_review rv;
    struct reply_result res;
    char msg[200];
    cJSON *j;
    if (reply_review_from_json(t->body, NULL, &rv, msg, sizeof(msg)) != AR_OK) {
        fail(t->done, t->ctx, 400, "invalid_review", msg);
        return;
    }
    reply_service_answer_call(t->svc, &rv, ENGINE_PRIO_INTERACTIVE, t->call, &res);
    j = reply_result_to_json(&res, rv.review_id);
    t->done(t->ctx, j ? res.status : 500, j, NULL, 0, NULL);
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
        fail(t->done, t->ctx, 400, "invalid_request", "reviews must be an array");
        return;
    }
    n = (size_t)cJSON_GetArraySize(arr);
    if (n == 0 || n > REPLY_BATCH_MAX) {
        char m[96];
        snprintf(m, sizeof(m), "a batch holds 1 to %d reviews", REPLY_BATCH_MAX);
        fail(t->done, t->ctx, 400, "invalid_request", m);
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
            res[i].status = 400;
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
        j = reply_result_to_json(&res[i], id);
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
    fail(t->done, t->ctx, 500, "internal_error", "out of memory");
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
            fail(t->done, t->ctx, 400, "invalid_request", "shop_id must be a non-empty string");
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
    if (st != AR_OK) {
        fail(t->done, t->ctx,
             st == AR_EINVAL  ? 400
             : st == AR_EBUSY ? 503
                              : 500,
             st == AR_EINVAL ? "invalid_request" : "internal_error",
             err.msg[0] ? err.msg : ar_status_str(st));
        return;
    }
    j = cJSON_CreateObject();
    if (j && cJSON_AddStringToObject(j, "id", id) &&
        cJSON_AddStringToObject(j, "status", "queued") &&
        cJSON_AddNumberToObject(j, "total", (double)n))
        t->done(t->ctx, 202, j, NULL, 0, NULL);
    else {
        cJSON_Delete(j);
        fail(t->done, t->ctx, 500, "internal_error", "out of memory");
    }
}

static void do_job_get(struct task *t)
{
    struct store_job_info info;
    bool found = false;
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st = store_job_get(t->svc->p.store, t->job_id, &info, &found, &err);
    cJSON *j;
    if (st != AR_OK) {
        fail(t->done, t->ctx, st == AR_EBUSY ? 503 : 500, "internal_error", err.msg);
        return;
    }
    if (!found) {
        fail(t->done, t->ctx, 404, "not_found", "no such job");
        return;
    }
    j = reply_job_info_to_json(&info);
    if (j)
        t->done(t->ctx, 200, j, NULL, 0, NULL);
    else
        fail(t->done, t->ctx, 500, "internal_error", "out of memory");
}

static void do_job_results(struct task *t)
{
    char *text = NULL;
    size_t len = 0;
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st = reply_job_results_jsonl(t->svc, t->job_id, &text, &len, &err);
    if (st == AR_EINVAL) {
        fail(t->done, t->ctx, 404, "not_found", "no such job");
        return;
    }
    if (st != AR_OK) {
        fail(t->done, t->ctx, st == AR_EBUSY ? 503 : 500, "internal_error", err.msg);
        return;
    }
    t->done(t->ctx, 200, NULL, text, len, "application/x-ndjson");
    ar_free(text);
}

static void run_task(void *arg)
{
    struct task *t = arg;
    switch (t->ep) {
    case REPLY_EP_REPLY:
        do_reply(t);
        break;
    case REPLY_EP_BATCH:
        do_batch(t);
        break;
    case REPLY_EP_JOB_CREATE:
        do_job_create(t);
        break;
    case REPLY_EP_JOB_GET:
        do_job_get(t);
        break;
    case REPLY_EP_JOB_RESULTS:
        do_job_results(t);
        break;
    default:
        fail(t->done, t->ctx, 404, "not_found", "no such endpoint");
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
        t->ep = REPLY_EP_JOB_GET;
    else if (!strcmp(id, "/results"))
        t->ep = REPLY_EP_JOB_RESULTS;
    else
        return false;
    return true;
}

void reply_handle(struct reply_service *svc, enum reply_endpoint ep, const char *path,
                  const cJSON *body, const char *raw, size_t raw_len, reply_done_fn done, void *ctx)
{
    reply_handle_call(svc, ep, path, body, raw, raw_len, NULL, done, ctx);
}

void reply_handle_call(struct reply_service *svc, enum reply_endpoint ep, const char *path,
                       const cJSON *body, const char *raw, size_t raw_len,
                       struct reply_call *call, reply_done_fn done, void *ctx)
{
    struct task *t = ar_calloc(1, sizeof(*t));
    enum ar_status st;
    if (!t) {
        fail(done, ctx, 500, "internal_error", "out of memory");
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
    if (ep == REPLY_EP_JOB_GET || ep == REPLY_EP_JOB_RESULTS) {
        if (!parse_job_path(path, t)) {
            ar_free(t);
            fail(done, ctx, 404, "not_found", "no such job");
            return;
        }
    } else if (ep == REPLY_EP_REPLY && !cJSON_IsObject(body)) {
        ar_free(t);
        fail(done, ctx, 400, "invalid_request", "the body must be a JSON object");
        return;
    } else if (ep == REPLY_EP_BATCH && !cJSON_IsObject(body) && !cJSON_IsArray(body)) {
        ar_free(t);
        fail(done, ctx, 400, "invalid_request", "the body must be a JSON object or array");
        return;
    }
    st = rp_submit(svc, run_task, t, true);
    if (st != AR_OK) {
        ar_free(t);
        fail(done, ctx, 503, "overloaded", "too many requests in progress, retry later");
    }
}
