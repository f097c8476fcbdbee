/* http_reply.c - what a handler calls on its request: the request's method, path, client,
 * headers, query and body, memory that lives as long as the request, the abort hook, and the
 * replies from any thread: whole ones (JSON or MessagePack as the client accepts, gzip for large
 * ones), errors in the {"error": {...}} shape, SSE streams. A reply resumes the suspended
 * connection; http.c queues it. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http_internal.h"

/* Whole replies at least this long are gzipped for a client that accepts it (smaller ones gain
 * too little for the time); they carry Vary: Accept-Encoding either way. */
#define GZIP_MIN_REPLY 4096

/* ---- handler-side API ------------------------------------------------------------------------ */

struct server *server_req_server(const struct server_req *req)
{
    return req->srv;
}
const cJSON *server_req_body(const struct server_req *req)
{
    return req->json;
}
const char *server_req_raw_body(const struct server_req *req, size_t *len)
{
    if (!req->route || !(req->route->flags & SERVER_ROUTE_RAW)) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = req->body ? req->body_len : 0;
    return req->body ? req->body : "";
}
const char *server_req_method(const struct server_req *req)
{
    return req->method;
}
const char *server_req_path(const struct server_req *req)
{
    return req->path;
}
const char *server_req_client(const struct server_req *req)
{
    return req->client;
}

const char *server_req_header(struct server_req *r, const char *name)
{
    const char *v = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->conn)
        v = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
    pthread_mutex_unlock(&r->mu);
    return v;
}

const char *server_req_query(struct server_req *r, const char *name)
{
    const char *v = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->conn)
        v = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
    pthread_mutex_unlock(&r->mu);
    return v;
}

void *server_req_alloc(struct server_req *req, size_t size, void (*cleanup)(void *))
{
    struct arena_block *b;
    if (size > SIZE_MAX - sizeof(*b))
        return NULL;
    b = ar_calloc(1, sizeof(*b) + size);
    if (!b)
        return NULL;
    b->cleanup = cleanup;
    pthread_mutex_lock(&req->mu);
    b->next = req->arena;
    req->arena = b;
    pthread_mutex_unlock(&req->mu);
    return b->data;
}

void server_req_on_abort(struct server_req *req, void (*fn)(struct server_req *, void *),
                         void *user)
{
    bool now;
    pthread_mutex_lock(&req->mu);
    req->abort_fn = fn;
    req->abort_user = user;
    /* the client left before the hook was set: fire it at once */
    now = req->gone && !req->final && !req->abort_called && fn;
    if (now)
        req->abort_called = true;
    pthread_mutex_unlock(&req->mu);
    if (now)
        fn(req, user);
}

bool server_req_aborted(struct server_req *r)
{
    bool g;
    pthread_mutex_lock(&r->mu);
    g = r->gone;
    pthread_mutex_unlock(&r->mu);
    return g;
}

bool server_req_charge_tokens(struct server_req *req, int64_t n_tokens, bool admission,
                              double *retry_after_s)
{
    double retry = 0;
    bool ok = server_limiter_tokens(req->srv->limiter, req->client, n_tokens, admission,
                                    ar_time_s(), &retry);
    if (retry_after_s)
        *retry_after_s = retry;
    return ok;
}

/* ---- replies --------------------------------------------------------------------------------- */

void server_reply_header(struct server_req *req, const char *name, const char *value)
{
    pthread_mutex_lock(&req->mu);
    if (!req->final && req->n_hdrs < (int)AR_ARRAY_LEN(req->hdrs)) {
        char *n = ar_strdup(name), *v = ar_strdup(value);
        if (n && v) {
            req->hdrs[req->n_hdrs][0] = n;
            req->hdrs[req->n_hdrs][1] = v;
            req->n_hdrs++;
        } else {
            ar_free(n);
            ar_free(v);
        }
    }
    pthread_mutex_unlock(&req->mu);
}

/* data[0..len) as one gzip member (ar_malloc'd, *out_len its length); NULL when it cannot be
 * made. */
static char *gzip_bytes(const char *data, size_t len, size_t *out_len)
{
    z_stream zs;
    char *out;
    uLong cap;
    int rc;
    if (len > UINT_MAX)
        return NULL;
    memset(&zs, 0, sizeof(zs));
    /* 16 + window bits: a gzip header and trailer; level 5: most of the gain, quickly */
    if (deflateInit2(&zs, 5, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    cap = deflateBound(&zs, (uLong)len);
    if (cap > UINT_MAX || !(out = ar_malloc(cap))) {
        deflateEnd(&zs);
        return NULL;
    }
    zs.next_in = (const Bytef *)data;
    zs.avail_in = (uInt)len;
    zs.next_out = (Bytef *)out;
    zs.avail_out = (uInt)cap;
    rc = deflate(&zs, Z_FINISH);
    *out_len = zs.total_out;
    deflateEnd(&zs);
    if (rc != Z_STREAM_END) {
        ar_free(out);
        return NULL;
    }
    return out;
}

/* Makes the final reply; takes data (may be NULL when out of memory: 500 without body).
 * Returns whether this reply's status is the one sent (not a later reply, nor an error after a
 * stream started). */
static bool set_reply(struct server_req *r, int status, const char *type, char *data, size_t len)
{
    bool deact, sent = false, gz = false, vary = false;
    /* compressed here, on the handler's thread, not on the event loop */
    if (data && len >= GZIP_MIN_REPLY) {
        size_t zlen = 0;
        char *z = r->accept_gzip ? gzip_bytes(data, len, &zlen) : NULL;
        vary = true;
        if (z && zlen < len) {
            ar_free(data);
            data = z;
            len = zlen;
            gz = true;
        } else {
            ar_free(z);
        }
    }
    pthread_mutex_lock(&r->mu);
    if (r->final) {
        pthread_mutex_unlock(&r->mu);
        ar_free(data);
        return false;
    }
    r->final = true;
    if (r->stream && r->stream_queued) {
        /* the status line is out: all we can do is end the stream */
        r->stream_end = true;
        ar_free(data);
    } else {
        if (r->stream) { /* a stream that has not started is replaced */
            r->stream = false;
            ar_free(r->sbuf);
            r->sbuf = NULL;
            r->slen = r->soff = r->scap = 0;
        }
        r->reply_ready = true;
        r->status = data || !len ? status : 500;
        sent = r->status == status;
        r->out = data;
        r->out_len = data ? len : 0;
        r->out_type = type;
        r->out_gzip = gz;
        r->out_vary = vary;
    }
    server_req_wake(r);
    deact = r->active;
    pthread_mutex_unlock(&r->mu);
    if (deact)
        server_req_deactivate(r);
    return sent;
}

/* The autoreply_rejected_total child of a refusal for load, by the error code of a 429 or 503
 * body (whichever module made it); NULL for any other answer (503 "loading" is no refusal). */
static struct metrics_child *rejection_of(struct server *s, int status, const cJSON *body)
{
    const cJSON *code;
    if (status != 429 && status != 503)
        return NULL;
    code =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(body, "error"), "code");
    if (!cJSON_IsString(code))
        return NULL;
    if (status == 429 && !strcmp(code->valuestring, "rate_limit_exceeded"))
        return s->m.rejected_rate;
    if (status == 503 && !strcmp(code->valuestring, "queue_full"))
        return s->m.rejected_queue;
    if (status == 503 && !strcmp(code->valuestring, "overloaded"))
        return s->m.rejected_overloaded;
    return NULL;
}

void server_reply_json(struct server_req *req, int status, cJSON *body)
{
    char *out = NULL;
    size_t len = 0;
    enum server_codec_format f = req->out_fmt;
    struct metrics_child *rejected = rejection_of(req->srv, status, body);
    bool counted;
    if (!body || server_codec_write(f, body, &out, &len) != AR_OK) {
        out = NULL;
        len = 1; /* marks the failure: 500 */
        status = 500;
        rejected = NULL;
    }
    cJSON_Delete(body);
    /* A refusal is counted before it can reach the client (set_reply wakes the connection): a
     * client reading /metrics after its 429 sees it. Not counted when this reply will not be
     * the one sent (set_reply's conditions: a reply made already, a stream under way). */
    pthread_mutex_lock(&req->mu);
    counted = rejected && !req->final && !(req->stream && req->stream_queued);
    pthread_mutex_unlock(&req->mu);
    if (counted)
        metrics_inc(rejected, 1);
    set_reply(req, status, f == SERVER_CODEC_MSGPACK ? "application/msgpack" : "application/json",
              out, len);
}

void server_retry_after_header(struct server_req *req, double retry_after_s)
{
    char v[32];
    double secs = ceil(retry_after_s);
    if (!(secs >= 1)) /* also NaN */
        secs = 1;
    if (secs > 86400)
        secs = 86400;
    snprintf(v, sizeof(v), "%.0f", secs);
    server_reply_header(req, "Retry-After", v);
}

static void reply_error_v(struct server_req *req, int status, const char *type, const char *code,
                          cJSON *extra, double retry_after_s, const char *fmt, va_list ap)
{
    char msg[512];
    cJSON *root = cJSON_CreateObject(), *e = cJSON_CreateObject();
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (root && e) {
        cJSON_AddItemToObject(root, "error", e);
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "type", type);
        if (code)
            cJSON_AddStringToObject(e, "code", code);
        else
            cJSON_AddNullToObject(e, "code");
        if (extra) {
            while (extra->child) {
                cJSON *it = cJSON_DetachItemViaPointer(extra, extra->child);
                cJSON_AddItemToObject(e, it->string, it);
            }
        }
    } else {
        cJSON_Delete(e);
    }
    cJSON_Delete(extra);
    if (status == 429 || status == 503)
        server_retry_after_header(req, retry_after_s);
    server_reply_json(req, status, root);
}

void server_reply_error_ex(struct server_req *req, int status, const char *type, const char *code,
                           cJSON *extra, double retry_after_s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(req, status, type, code, extra, retry_after_s, fmt, ap);
    va_end(ap);
}

void server_reply_error(struct server_req *req, int status, const char *type, const char *code,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(req, status, type, code, NULL, req->srv->p.retry_after_s, fmt, ap);
    va_end(ap);
}

void server_reply_text(struct server_req *req, int status, const char *content_type,
                       const char *data, size_t len)
{
    char *copy = ar_malloc(len ? len : 1);
    if (copy)
        memcpy(copy, data, len);
    set_reply(req, status, content_type, copy, len);
}

void server_stream_begin(struct server_req *req, const char *content_type)
{
    pthread_mutex_lock(&req->mu);
    if (!req->final && !req->stream) {
        req->stream = true;
        req->out_type = content_type;
    }
    pthread_mutex_unlock(&req->mu);
}

void server_stream_write(struct server_req *req, const char *data, size_t len)
{
    pthread_mutex_lock(&req->mu);
    if (req->stream && !req->final && !req->gone && len) {
        if (req->slen + len > req->scap) {
            size_t nc = AR_MAX(req->scap * 2, req->slen + len + 4096);
            char *nb = ar_realloc(req->sbuf, nc);
            if (!nb) { /* cannot buffer: the client misses this piece; end the stream */
                req->gone = true;
                server_req_wake(req);
                pthread_mutex_unlock(&req->mu);
                return;
            }
            req->sbuf = nb;
            req->scap = nc;
        }
        memcpy(req->sbuf + req->slen, data, len);
        req->slen += len;
        server_req_wake(req);
    }
    pthread_mutex_unlock(&req->mu);
}

bool server_stream_wait(struct server_req *req, size_t max_buffered, double timeout_s)
{
    double until = ar_time_s() + timeout_s;
    for (;;) {
        bool ok, gone;
        pthread_mutex_lock(&req->mu);
        gone = req->gone || req->final || !req->stream;
        ok = !gone && req->slen - req->soff <= max_buffered;
        pthread_mutex_unlock(&req->mu);
        if (ok)
            return true;
        if (gone || ar_time_s() >= until)
            return false;
        /* the reader (libmicrohttpd, at the client's pace) drains the buffer */
        {
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

void server_stream_end(struct server_req *req)
{
    bool deact;
    pthread_mutex_lock(&req->mu);
    if (req->final || !req->stream) {
        pthread_mutex_unlock(&req->mu);
        return;
    }
    req->final = true;
    req->stream_end = true;
    server_req_wake(req);
    deact = req->active;
    pthread_mutex_unlock(&req->mu);
    if (deact)
        server_req_deactivate(req);
}
