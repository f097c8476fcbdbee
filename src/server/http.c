/* http.c - the HTTP core over libmicrohttpd: route table, body intake with limits (gzip and
 * deflate bodies inflated as they come in), auth and request-rate limits, content negotiation
 * (gzip for large replies), replies from any thread via suspend/resume, SSE
 * streams, the instance header on every response, health checks of backends, the watchdog
 * (slow senders, vanished clients) and graceful stop.
 *
 * A request (struct server_req) is reference counted: one reference for the HTTP connection
 * (dropped when libmicrohttpd reports it complete), one while a handler owes its final reply,
 * one per streaming response object. Lock order: server.conn_mu before server_req.mu; nothing
 * is called out (handlers, abort hooks, libmicrohttpd entry points that may block) while
 * conn_mu is held. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>
#define ZLIB_CONST /* next_in is const */
#include <zlib.h>

#include "server/server_internal.h"

#define WATCHDOG_PERIOD_S 0.1
/* Near the connection limit (fewer than max_conns / CONN_RESERVE_DIV free slots) idle
 * connections older than IDLE_EVICT_MIN_S are closed, oldest first, so that a new client gets in
 * instead of waiting for idle ones to time out. */
#define CONN_RESERVE_DIV 8
#define IDLE_EVICT_MIN_S 0.2
#define STREAM_BLOCK 16384
/* Whole replies at least this long are gzipped for a client that accepts it (smaller ones gain
 * too little for the time); they carry Vary: Accept-Encoding either way. */
#define GZIP_MIN_REPLY 4096
#define INFLATE_BLOCK 16384

struct route {
    char *method; /* owned */
    char *path;   /* owned */
    size_t path_len;
    server_handler_fn fn;
    void *user;
    unsigned flags;
    size_t max_body; /* resolved: never 0 */
};

/* One TCP connection (libmicrohttpd's socket context). */
struct conn {
    struct conn *prev, *next;
    int fd;
    bool receiving;    /* waiting for (the rest of) a request since phase_start */
    bool killed;       /* shut down by the watchdog */
    bool bad_target;   /* the current request's target holds a NUL (set by on_uri) */
    bool started;      /* a request line has come in since phase_start (set by on_uri) */
    bool in_body;      /* the request's headers are in, its body is coming */
    bool body_stalled; /* answered 408 by the watchdog: no body byte for body_timeout_s */
    double phase_start;
    double body_seen;       /* when the headers or the last body bytes came (with in_body) */
    struct server_req *req; /* the request whose handler runs or owes a reply */
};

struct arena_block {
    struct arena_block *next;
    void (*cleanup)(void *);
    _Alignas(16) unsigned char data[];
};

struct server_req {
    pthread_mutex_t mu;
    int refs; /* under mu */
    struct server *srv;
    struct MHD_Connection *conn; /* NULL once libmicrohttpd is done with it (under mu) */
    struct conn *cs;
    const struct route *route;
    char method[16];
    char *path; /* owned */
    char client[80];
    enum codec_format in_fmt, out_fmt;
    double t0;
    /* body */
    char *body; /* owned */
    size_t body_len, body_cap;
    uint64_t discarded;
    bool too_large;
    /* Content-Encoding of the body: inflated as it comes in, so that the route's limit holds
     * for what it decompresses to */
    enum { CODING_IDENTITY, CODING_GZIP, CODING_DEFLATE } coding;
    z_stream zs;
    bool zs_live;     /* zs is initialised (inflateEnd owed) */
    bool zs_end;      /* the compressed stream has ended */
    bool bad_coding;  /* the body is not valid data of its Content-Encoding */
    bool accept_gzip; /* Accept-Encoding allows gzip (set by admit, read-only afterwards) */
    cJSON *json;      /* owned */
    struct arena_block *arena;
    /* reply state, under mu */
    bool handled;     /* the request was fully received and dispatched */
    bool active;      /* a handler owes the final reply (holds a reference) */
    bool final;       /* the final reply has been made */
    bool reply_ready; /* a whole reply waits in out */
    int status;
    char *out; /* owned */
    size_t out_len;
    const char *out_type;
    bool out_gzip;    /* out is gzip-compressed */
    bool out_vary;    /* out's encoding depends on Accept-Encoding */
    char *hdrs[8][2]; /* owned extra headers */
    int n_hdrs;
    bool stream, stream_queued, stream_end;
    char *sbuf; /* owned stream bytes not yet taken by libmicrohttpd: sbuf[soff..slen) */
    size_t slen, scap, soff;
    bool suspended; /* we suspended the connection and owe it a resume */
    bool gone;      /* client gone or server stopping: discard replies */
    bool abort_called;
    void (*abort_fn)(struct server_req *, void *);
    void *abort_user;
};

struct health_check {
    char name[64];
    int (*fn)(void *user);
    void *user;
};

struct server {
    struct server_params p;
    char *host, *model_name; /* owned copies */
    /* the X-Autoreply-Instance value (owned): set by server_create when named, else by
     * server_start, which holds inst_mu until it is set so that no response goes out before */
    _Atomic(char *) instance;
    pthread_mutex_t inst_mu;
    pthread_mutex_t health_mu;
    struct health_check *checks; /* owned, (n_checks), under health_mu */
    int n_checks;
    struct MHD_Daemon *mhd;
    int port;
    struct route *routes; /* owned, (n_routes) */
    void *route_data[4];  /* owned by the routes' users: ar_free at destroy (server_keep) */
    int n_route_data;
    int n_routes;
    struct srv_keys *keys;
    struct srv_limiter *limiter;
    struct metrics_registry *metrics;
    bool own_metrics;
    struct srv_metrics m;
    _Atomic(struct engine *) engine;
    const struct model *model;
    const struct tokenizer *tok;
    atomic_bool stopping;
    bool stopped;
    /* connections and requests owing replies */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv; /* n_active dropped, or the watchdog should stop */
    struct conn *conns;
    int n_conns;
    int n_active;
    bool hard_stop; /* no new handler may start */
    bool wd_run;
    bool wd_started;
    pthread_t wd;
};

/* ---- small helpers ------------------------------------------------------------------------- */

struct server_params server_default_params(void)
{
    struct server_params p = {0};
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_body = 1 << 20;
    p.timeout_s = 30;
    p.body_timeout_s = 10;
    p.max_conns = 512;
    p.max_conns_per_ip = -1; /* half of max_conns */
    p.http_threads = 1;
    p.model_name = "autoreply";
    p.retry_after_s = 1;
    return p;
}

bool server_rate_limit_healthy(const struct server *s)
{
    return srv_limiter_backend_healthy(s->limiter);
}

struct engine *server_engine(const struct server *s)
{
    return atomic_load(&s->engine);
}
const struct model *server_model(const struct server *s)
{
    return server_engine(s) ? s->model : NULL;
}
const struct tokenizer *server_tokenizer(const struct server *s)
{
    return server_engine(s) ? s->tok : NULL;
}
const char *server_model_name(const struct server *s)
{
    return s->model_name;
}
int server_n_ctx(const struct server *s)
{
    struct engine *e = server_engine(s);
    int n = e ? engine_n_ctx(e) : 0;
    return s->p.n_ctx > 0 && s->p.n_ctx < n ? s->p.n_ctx : n;
}
struct metrics_registry *server_metrics(const struct server *s)
{
    return s->metrics;
}
int server_port(const struct server *s)
{
    return s->port;
}
const char *server_instance_name(const struct server *s)
{
    const char *n = atomic_load(&s->instance);
    return n ? n : "autoreply";
}
double srv_retry_after_s(const struct server *s)
{
    return s->p.retry_after_s;
}
struct srv_metrics *srv_metrics_of(struct server *s)
{
    return &s->m;
}
bool srv_stopping(const struct server *s)
{
    return atomic_load(&s->stopping);
}

/* ---- request lifetime ---------------------------------------------------------------------- */

static void req_destroy(struct server_req *r)
{
    while (r->arena) {
        struct arena_block *b = r->arena;
        r->arena = b->next;
        if (b->cleanup)
            b->cleanup(b->data);
        ar_free(b);
    }
    for (int i = 0; i < r->n_hdrs; i++) {
        ar_free(r->hdrs[i][0]);
        ar_free(r->hdrs[i][1]);
    }
    if (r->zs_live)
        inflateEnd(&r->zs);
    cJSON_Delete(r->json);
    ar_free(r->body);
    ar_free(r->out);
    ar_free(r->sbuf);
    ar_free(r->path);
    pthread_mutex_destroy(&r->mu);
    ar_free(r);
}

static void req_release(struct server_req *r)
{
    int left;
    pthread_mutex_lock(&r->mu);
    left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0)
        req_destroy(r);
}

/* Resumes the connection if we suspended it. Under r->mu. */
static void wake(struct server_req *r)
{
    if (r->suspended && r->conn) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
}

/* The handler has made its final reply: drop its reference. Not under r->mu. */
static void deactivate(struct server_req *r)
{
    struct server *s = r->srv;
    bool was;
    pthread_mutex_lock(&s->conn_mu);
    pthread_mutex_lock(&r->mu);
    was = r->active;
    r->active = false;
    pthread_mutex_unlock(&r->mu);
    if (was) {
        s->n_active--;
        if (r->cs && r->cs->req == r)
            r->cs->req = NULL;
        pthread_cond_broadcast(&s->conn_cv);
    }
    pthread_mutex_unlock(&s->conn_mu);
    if (was)
        req_release(r);
}

/* Calls the abort hook once (the client is gone). The caller holds a reference. */
static void req_abort(struct server_req *r)
{
    void (*fn)(struct server_req *, void *) = NULL;
    void *user = NULL;
    pthread_mutex_lock(&r->mu);
    r->gone = true;
    if (!r->final && !r->abort_called) {
        r->abort_called = true;
        fn = r->abort_fn;
        user = r->abort_user;
    }
    pthread_mutex_unlock(&r->mu);
    if (fn)
        fn(r, user);
}

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
    bool ok = srv_limiter_tokens(req->srv->limiter, req->client, n_tokens, admission, ar_time_s(),
                                 &retry);
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
    wake(r);
    deact = r->active;
    pthread_mutex_unlock(&r->mu);
    if (deact)
        deactivate(r);
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
    enum codec_format f = req->out_fmt;
    struct metrics_child *rejected = rejection_of(req->srv, status, body);
    bool counted;
    if (!body || codec_write(f, body, &out, &len) != AR_OK) {
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
    set_reply(req, status, f == CODEC_MSGPACK ? "application/msgpack" : "application/json", out,
              len);
}

void srv_retry_after_header(struct server_req *req, double retry_after_s)
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
        srv_retry_after_header(req, retry_after_s);
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
                wake(req);
                pthread_mutex_unlock(&req->mu);
                return;
            }
            req->sbuf = nb;
            req->scap = nc;
        }
        memcpy(req->sbuf + req->slen, data, len);
        req->slen += len;
        wake(req);
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
    wake(req);
    deact = req->active;
    pthread_mutex_unlock(&req->mu);
    if (deact)
        deactivate(req);
}

/* ---- libmicrohttpd glue ---------------------------------------------------------------------- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct server_req *r = cls;
    ssize_t n;
    (void)pos;
    pthread_mutex_lock(&r->mu);
    if (r->soff < r->slen) {
        size_t k = AR_MIN(max, r->slen - r->soff);
        memcpy(buf, r->sbuf + r->soff, k);
        r->soff += k;
        if (r->soff == r->slen)
            r->soff = r->slen = 0;
        n = (ssize_t)k;
    } else if (r->stream_end) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (r->gone || !r->conn) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        /* nothing ready: park the connection until the next write resumes it */
        r->suspended = true;
        MHD_suspend_connection(r->conn);
        n = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

static void stream_free(void *cls)
{
    req_release(cls);
}

/* Queues r's whole reply (stream false) or its stream, for which the caller took a reference
 * and set stream_queued under r->mu. Event-loop thread, r->mu not held: a whole reply and its
 * headers no longer change once final; the stream's buffer is read under the lock. */
static enum MHD_Result queue_reply(struct server_req *r, bool stream)
{
    struct MHD_Response *resp;
    enum MHD_Result ok;
    if (!stream) {
        resp = MHD_create_response_from_buffer(r->out_len, r->out ? r->out : (char *)"",
                                               MHD_RESPMEM_MUST_COPY);
        if (resp && r->out_len)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->out_type);
        if (resp && r->out_gzip)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, "gzip");
        if (resp && r->out_vary)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, MHD_HTTP_HEADER_ACCEPT_ENCODING);
    } else {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, r,
                                                 stream_free);
        if (!resp) {
            req_release(r);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->out_type);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    }
    if (!resp)
        return MHD_NO;
    if (!atomic_load(&r->srv->instance)) { /* server_start is naming it right now */
        pthread_mutex_lock(&r->srv->inst_mu);
        pthread_mutex_unlock(&r->srv->inst_mu);
    }
    MHD_add_response_header(resp, SERVER_INSTANCE_HEADER, server_instance_name(r->srv));
    for (int i = 0; i < r->n_hdrs; i++)
        MHD_add_response_header(resp, r->hdrs[i][0], r->hdrs[i][1]);
    ok = MHD_queue_response(r->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp); /* may run stream_free when queueing failed */
    return ok;
}

/* How well rt matches path: 0 not at all, SIZE_MAX exactly, else the prefix length (so the
 * longest prefix wins and an exact route beats every prefix). */
static size_t route_match(const struct route *rt, const char *path)
{
    if (rt->flags & SERVER_ROUTE_PREFIX)
        return strncmp(rt->path, path, rt->path_len) == 0 ? rt->path_len : 0;
    return strcmp(rt->path, path) == 0 ? SIZE_MAX : 0;
}

static const struct route *find_route(const struct server *s, const char *method, const char *path,
                                      bool *path_known, char *allow, size_t allow_size)
{
    const struct route *hit = NULL;
    size_t used = 0, best = 0;
    *path_known = false;
    allow[0] = '\0';
    for (int i = 0; i < s->n_routes; i++)
        best = AR_MAX(best, route_match(&s->routes[i], path));
    if (best == 0)
        return NULL;
    for (int i = 0; i < s->n_routes; i++) {
        const struct route *rt = &s->routes[i];
        if (route_match(rt, path) != best)
            continue;
        *path_known = true;
        used += (size_t)snprintf(allow + used, used < allow_size ? allow_size - used : 0, "%s%s",
                                 used ? ", " : "", rt->method);
        if (!strcmp(rt->method, method))
            hit = rt;
    }
    return hit;
}

static void client_address(struct MHD_Connection *c, char *out, size_t size)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, size, "unknown");
    if (!ci || !ci->client_addr)
        return;
    if (ci->client_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_addr,
                  out, (socklen_t)size);
    else if (ci->client_addr->sa_family == AF_INET6)
        inet_ntop(AF_INET6,
                  &((const struct sockaddr_in6 *)(const void *)ci->client_addr)->sin6_addr, out,
                  (socklen_t)size);
}

bool srv_address_is_loopback(const char *addr)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (!addr)
        return false;
    if (inet_pton(AF_INET, addr, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &a6) != 1)
        return false;
    if (IN6_IS_ADDR_LOOPBACK(&a6))
        return true;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}

/* Content-Type -> format; false for types we do not read. */
static bool body_format(const char *ct, enum codec_format *f)
{
    size_t n;
    *f = CODEC_JSON;
    if (!ct || !*ct)
        return true;
    n = strcspn(ct, "; \t");
    /* curl -d sends form-urlencoded: read it as JSON like text/plain */
    if ((n == 16 && !strncasecmp(ct, "application/json", n)) ||
        (n == 10 && !strncasecmp(ct, "text/plain", n)) ||
        (n == 33 && !strncasecmp(ct, "application/x-www-form-urlencoded", n)))
        return true;
    if ((n == 19 && !strncasecmp(ct, "application/msgpack", n)) ||
        (n == 21 && !strncasecmp(ct, "application/x-msgpack", n))) {
        *f = CODEC_MSGPACK;
        return true;
    }
    return false;
}

/* Whether an Accept-Encoding value lets us send gzip (RFC 9110 12.5.3): "gzip" or "x-gzip",
 * else "*", with a q-value above 0; "gzip;q=0" refuses it even when "*" would allow it. */
static bool accepts_gzip(const char *v)
{
    int gzip = -1, star = -1; /* -1 not named, else whether its q is above 0 */
    while (v && *v) {
        size_t item, name;
        const char *semi;
        double q = 1;
        v += strspn(v, " \t");
        item = strcspn(v, ",");
        name = strcspn(v, " \t;,");
        semi = memchr(v, ';', item);
        if (semi) { /* parameters: only q matters ("q=0.5", spaces allowed around '=') */
            const char *p = semi + 1 + strspn(semi + 1, " \t");
            if (*p == 'q' || *p == 'Q') {
                p++;
                p += strspn(p, " \t");
                if (*p == '=')
                    q = strtod(p + 1, NULL);
            }
        }
        if ((name == 4 && !strncasecmp(v, "gzip", 4)) ||
            (name == 6 && !strncasecmp(v, "x-gzip", 6)))
            gzip = q > 0;
        else if (name == 1 && *v == '*')
            star = q > 0;
        v += item;
        if (*v == ',')
            v++;
    }
    return gzip >= 0 ? gzip == 1 : star == 1;
}

struct coding_scan {
    int n;
    const char *value; /* the first Content-Encoding */
};

static enum MHD_Result coding_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    struct coding_scan *cs = cls;
    (void)kind;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_ENCODING) && cs->n++ == 0)
        cs->value = value ? value : "";
    return MHD_YES;
}

/* The body's Content-Encoding: none, identity, gzip (x-gzip) or deflate (the zlib format, RFC
 * 9110 8.4.1.2), one coding only; false for anything else. */
static bool body_coding(struct MHD_Connection *c, struct server_req *r)
{
    struct coding_scan cs = {0};
    size_t a, b;
    MHD_get_connection_values(c, MHD_HEADER_KIND, coding_header, &cs);
    r->coding = CODING_IDENTITY;
    if (cs.n == 0)
        return true;
    if (cs.n > 1)
        return false;
    a = strspn(cs.value, " \t");
    b = strlen(cs.value);
    while (b > a && (cs.value[b - 1] == ' ' || cs.value[b - 1] == '\t'))
        b--;
    if ((b - a == 4 && !strncasecmp(cs.value + a, "gzip", 4)) ||
        (b - a == 6 && !strncasecmp(cs.value + a, "x-gzip", 6)))
        r->coding = CODING_GZIP;
    else if (b - a == 7 && !strncasecmp(cs.value + a, "deflate", 7))
        r->coding = CODING_DEFLATE;
    else if (!(b - a == 8 && !strncasecmp(cs.value + a, "identity", 8)))
        return false;
    return true;
}

static struct conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* libmicrohttpd's view of the request line, before the target is split and unescaped: it has
 * cut the line at the space before the version, so a target whose C string ends early has a
 * NUL inside (MHD would route "GET /health\0x" to /health). "%00" is one too once unescaped. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    struct server *s = cls;
    struct conn *cs = conn_of(c);
    size_t n = strlen(uri);
    size_t path_len = strcspn(uri, "?");
    bool bad = strncmp(uri + n + 1, "HTTP/", 5) != 0 || memmem(uri, path_len, "%00", 3);
    if (cs) {
        pthread_mutex_lock(&s->conn_mu);
        cs->bad_target = bad;
        cs->started = true;
        pthread_mutex_unlock(&s->conn_mu);
    }
    return NULL;
}

struct framing {
    int n_len, n_te;
    const char *len; /* the first Content-Length */
    bool len_differs, te_other;
};

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    struct framing *f = cls;
    (void)kind;
    if (!value)
        value = "";
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (f->n_len++ == 0)
            f->len = value;
        else if (strcmp(f->len, value))
            f->len_differs = true;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        /* the only coding we read is chunked, alone */
        size_t a = strspn(value, " \t"), b = strlen(value);
        while (b > a && (value[b - 1] == ' ' || value[b - 1] == '\t'))
            b--;
        if (f->n_te++ > 0 || b - a != 7 || strncasecmp(value + a, "chunked", 7))
            f->te_other = true;
    }
    return MHD_YES;
}

/* The request's framing is one we read unambiguously; else answers it (400 or 501: the
 * connection is then closed, its body never read) and returns false. */
static bool framing_ok(struct server *s, struct server_req *r, struct MHD_Connection *c)
{
    struct framing f = {0};
    bool bad_target = false;
    pthread_mutex_lock(&s->conn_mu);
    if (r->cs)
        bad_target = r->cs->bad_target;
    pthread_mutex_unlock(&s->conn_mu);
    if (bad_target) {
        server_reply_error(r, 400, "invalid_request_error", "bad_request_target",
                           "the request target holds a NUL byte");
        return false;
    }
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
    if (f.te_other) {
        server_reply_error(r, 501, "invalid_request_error", "unsupported_transfer_encoding",
                           "the only Transfer-Encoding read is chunked");
        return false;
    }
    if (f.n_te && f.n_len) {
        server_reply_error(r, 400, "invalid_request_error", "ambiguous_length",
                           "Content-Length and Transfer-Encoding together");
        return false;
    }
    if (f.len_differs) {
        server_reply_error(r, 400, "invalid_request_error", "ambiguous_length",
                           "Content-Length headers that differ");
        return false;
    }
    return true;
}

/* First call: headers are in. Routing, auth, limits; errors are answered before any body is
 * read (libmicrohttpd then closes the connection instead of reading the rest). */
static void admit(struct server *s, struct server_req *r, struct MHD_Connection *c)
{
    bool known;
    char allow[128];
    const char *v;
    double retry;
    const struct route *rt = find_route(s, r->method, r->path, &known, allow, sizeof(allow));
    v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    r->out_fmt = v && strstr(v, "msgpack") ? CODEC_MSGPACK : CODEC_JSON;
    r->accept_gzip =
        accepts_gzip(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept-Encoding"));
    client_address(c, r->client, sizeof(r->client));
    if (!framing_ok(s, r, c))
        return;
    r->route = rt;
    if (!rt) {
        if (known) {
            server_reply_header(r, "Allow", allow);
            server_reply_error(r, 405, "invalid_request_error", "method_not_allowed",
                               "%s is not allowed on %s", r->method, r->path);
        } else {
            server_reply_error(r, 404, "not_found_error", "not_found", "no route for %s %s",
                               r->method, r->path);
        }
        return;
    }
    if (!s->keys && !(rt->flags & SERVER_ROUTE_PUBLIC) &&
        (!(rt->flags & SERVER_ROUTE_METRICS) || s->p.metrics_auth) &&
        !srv_address_is_loopback(r->client)) {
        /* no key tells an operator's clients from anyone else: only this machine's are */
        server_reply_error(r, 403, "permission_error", "loopback_only",
                           "without API keys (--api-key-file) this server answers clients on "
                           "its own machine only");
        return;
    }
    if (s->keys && !(rt->flags & (SERVER_ROUTE_PUBLIC | SERVER_ROUTE_PAGE)) &&
        (!(rt->flags & SERVER_ROUTE_METRICS) || s->p.metrics_auth)) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        int idx = -1;
        if (auth && !strncasecmp(auth, "Bearer ", 7)) {
            const char *k = auth + 7;
            while (*k == ' ')
                k++;
            idx = srv_keys_find(s->keys, k, strlen(k));
        }
        if (idx < 0) {
            server_reply_header(r, "WWW-Authenticate", "Bearer");
            server_reply_error(r, 401, "authentication_error", "invalid_api_key",
                               "a valid API key is required (Authorization: Bearer <key>)");
            return;
        }
        snprintf(r->client, sizeof(r->client), "key:%d", idx);
    }
    if (!(rt->flags & (SERVER_ROUTE_PUBLIC | SERVER_ROUTE_METRICS | SERVER_ROUTE_PAGE)) &&
        !srv_limiter_request(s->limiter, r->client, ar_time_s(), &retry)) {
        server_reply_error_ex(r, 429, "rate_limit_error", "rate_limit_exceeded", NULL, retry,
                              "too many requests; retry after %.0f s", ceil(retry));
        return;
    }
    if (atomic_load(&s->stopping)) {
        server_reply_error(r, 503, "server_error", "shutting_down", "the server is stopping");
        return;
    }
    if ((rt->flags & SERVER_ROUTE_ENGINE) && !server_engine(s)) {
        server_reply_error(r, 503, "server_error", "loading", "the model is loading");
        return;
    }
    if (rt->flags & (SERVER_ROUTE_BODY | SERVER_ROUTE_RAW)) {
        v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if (!body_format(v, &r->in_fmt) && !(rt->flags & SERVER_ROUTE_RAW)) {
            server_reply_error(r, 415, "invalid_request_error", "unsupported_media_type",
                               "Content-Type must be application/json or application/msgpack");
            return;
        }
        if (!body_coding(c, r)) {
            server_reply_error(r, 415, "invalid_request_error", "unsupported_content_encoding",
                               "Content-Encoding must be gzip, deflate or identity (one coding)");
            return;
        }
        v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (v) {
            char *end;
            unsigned long long n = strtoull(v, &end, 10);
            if (end != v && n > rt->max_body) {
                server_reply_error(r, 413, "invalid_request_error", "request_too_large",
                                   "the body is larger than %zu bytes", rt->max_body);
                return;
            }
        }
    }
}

/* Decoded body bytes: kept up to limit; beyond, the body is too large and dropped. False when
 * out of memory. */
static bool keep_body(struct server_req *r, size_t limit, const char *data, size_t n)
{
    if (r->body_len + n > limit) {
        r->too_large = true;
        r->discarded = r->body_len + n;
        ar_free(r->body);
        r->body = NULL;
        r->body_len = r->body_cap = 0;
        return true;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        size_t nc = AR_MIN(AR_MAX(r->body_cap * 2, r->body_len + n + 1), limit + 1);
        char *nb = ar_realloc(r->body, nc);
        if (!nb)
            return false;
        r->body = nb;
        r->body_cap = nc;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    return true;
}

/* Compressed body bytes: inflated through a small buffer into keep_body, which stops at the
 * limit, so a zip bomb costs the limit and the time to inflate that much, never more. A second
 * gzip member may follow the first (RFC 1952); anything after a deflate stream, or bytes that
 * are no such stream, make the body bad. False when out of memory. */
static bool inflate_body(struct server_req *r, size_t limit, const char *data, size_t n)
{
    unsigned char out[INFLATE_BLOCK];
    if (!r->zs_live) {
        memset(&r->zs, 0, sizeof(r->zs));
        /* 16 + window bits: gzip only; window bits alone: the zlib format only */
        if (inflateInit2(&r->zs, r->coding == CODING_GZIP ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK)
            return false;
        r->zs_live = true;
    }
    while (n > 0 && !r->too_large && !r->bad_coding) {
        size_t piece = AR_MIN(n, (size_t)UINT_MAX);
        r->zs.next_in = (const Bytef *)data;
        r->zs.avail_in = (uInt)piece;
        /* until this input is used up and no output is pending (a full out may hold more) */
        while (!r->too_large && !r->bad_coding) {
            int rc;
            size_t got;
            if (r->zs_end) {
                if (r->zs.avail_in == 0)
                    break;
                if (r->coding != CODING_GZIP || inflateReset(&r->zs) != Z_OK) {
                    r->bad_coding = true;
                    break;
                }
                r->zs_end = false;
            }
            r->zs.next_out = out;
            r->zs.avail_out = sizeof(out);
            rc = inflate(&r->zs, Z_NO_FLUSH);
            got = sizeof(out) - r->zs.avail_out;
            if (got && !keep_body(r, limit, (const char *)out, got))
                return false;
            if (rc == Z_STREAM_END)
                r->zs_end = true;
            else if (rc == Z_MEM_ERROR)
                return false;
            else if (rc == Z_BUF_ERROR && r->zs.avail_in == 0)
                break;           /* nothing pending: it needs more input */
            else if (rc != Z_OK) /* Z_DATA_ERROR, Z_NEED_DICT */
                r->bad_coding = true;
            if (!r->zs_end && r->zs.avail_in == 0 && r->zs.avail_out > 0)
                break;
        }
        data += piece;
        n -= piece;
    }
    return true;
}

/* Body bytes: kept (inflated first when the body is compressed) up to max_body; beyond, or
 * once the coding is bad, counted and dropped so that an error can still be sent, up to a
 * bound after which the connection is closed. */
static bool take_body(struct server *s, struct server_req *r, const char *data, size_t n)
{
    size_t limit = r->route ? r->route->max_body : s->p.max_body;
    if (r->too_large || r->bad_coding || !r->route ||
        !(r->route->flags & (SERVER_ROUTE_BODY | SERVER_ROUTE_RAW))) {
        r->discarded += n;
        return r->discarded <= (uint64_t)limit + (1u << 20);
    }
    if (r->coding != CODING_IDENTITY)
        return inflate_body(r, limit, data, n);
    return keep_body(r, limit, data, n);
}

/* SERVER_ROUTE_RAW | SERVER_ROUTE_BODY: parses what is one object or array, keeps the raw
 * bytes either way. False when a reply has been made (bad MessagePack, out of memory). */
static bool parse_raw(struct server_req *r)
{
    struct ar_err err = {0};
    enum ar_status st;
    size_t a = 0;
    if (r->in_fmt == CODEC_JSON) {
        /* only what can be one JSON object or array is tried (JSONL fails fast: trailing
         * data after its first line) */
        while (a < r->body_len && (r->body[a] == ' ' || r->body[a] == '\t' || r->body[a] == '\r' ||
                                   r->body[a] == '\n'))
            a++;
        if (a == r->body_len || (r->body[a] != '{' && r->body[a] != '['))
            return true;
    }
    st = codec_parse(r->in_fmt, r->body ? r->body : "", r->body_len, &r->json, &err);
    if (st == AR_ENOMEM) {
        server_reply_error(r, 503, "server_error", "out_of_memory", "out of memory");
        return false;
    }
    if (st == AR_OK && !cJSON_IsObject(r->json) && !cJSON_IsArray(r->json)) {
        cJSON_Delete(r->json);
        r->json = NULL;
        st = AR_EFORMAT;
        snprintf(err.msg, sizeof(err.msg), "not an object or an array");
    }
    if (st != AR_OK && r->in_fmt == CODEC_MSGPACK) {
        server_reply_error(r, 400, "invalid_request_error", "invalid_msgpack",
                           "cannot parse the body: %s", err.msg);
        return false;
    }
    return true;
}

/* The request is complete: parse the body and call the handler. */
static void dispatch(struct server *s, struct server_req *r)
{
    struct ar_err err = {0};
    enum ar_status st;
    bool refused;
    pthread_mutex_lock(&s->conn_mu);
    if (r->cs) {
        r->cs->receiving = false;
        r->cs->in_body = false;
    }
    pthread_mutex_unlock(&s->conn_mu);
    if (r->too_large) {
        server_reply_error(r, 413, "invalid_request_error", "request_too_large",
                           "the body is larger than %zu bytes", r->route->max_body);
        return;
    }
    if (r->coding != CODING_IDENTITY &&
        (r->route->flags & (SERVER_ROUTE_BODY | SERVER_ROUTE_RAW))) {
        /* an empty body is no compressed stream either */
        if (r->bad_coding || !r->zs_end) {
            server_reply_error(r, 400, "invalid_request_error", "invalid_content_encoding",
                               "the body is not complete %s data",
                               r->coding == CODING_GZIP ? "gzip" : "deflate (zlib)");
            return;
        }
        inflateEnd(&r->zs);
        r->zs_live = false;
    }
    if (r->route->flags & SERVER_ROUTE_RAW) {
        if (r->body)
            r->body[r->body_len] = '\0'; /* take_body keeps room for it */
        if ((r->route->flags & SERVER_ROUTE_BODY) && !parse_raw(r))
            return;
    } else if (r->route->flags & SERVER_ROUTE_BODY) {
        st = codec_parse(r->in_fmt, r->body ? r->body : "", r->body_len, &r->json, &err);
        ar_free(r->body);
        r->body = NULL;
        if (st == AR_ENOMEM) {
            server_reply_error(r, 503, "server_error", "out_of_memory", "out of memory");
            return;
        }
        if (st != AR_OK) {
            server_reply_error(r, 400, "invalid_request_error",
                               r->in_fmt == CODEC_JSON ? "invalid_json" : "invalid_msgpack",
                               "cannot parse the body: %s", err.msg);
            return;
        }
        if (!cJSON_IsObject(r->json) &&
            !((r->route->flags & SERVER_ROUTE_ARRAY) && cJSON_IsArray(r->json))) {
            server_reply_error(r, 400, "invalid_request_error", "invalid_type",
                               (r->route->flags & SERVER_ROUTE_ARRAY)
                                   ? "the body must be an object or an array"
                                   : "the body must be an object");
            return;
        }
    }
    /* the handler owes a reply from now on */
    pthread_mutex_lock(&s->conn_mu);
    refused = s->hard_stop;
    if (!refused) {
        s->n_active++;
        if (r->cs)
            r->cs->req = r;
        pthread_mutex_lock(&r->mu);
        r->active = true;
        r->refs++;
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&s->conn_mu);
    if (refused) {
        server_reply_error(r, 503, "server_error", "shutting_down", "the server is stopping");
        return;
    }
    r->route->fn(r, r->route->user);
}

/* Answers on the socket itself, for errors found while a body comes in (libmicrohttpd takes a
 * reply only before or after the body): a JSON error, Connection: close, the write side shut so
 * that the client reads the answer and its end at once. The caller then closes the connection;
 * what the client has sent and we have not read is drained first so that the close is not a
 * reset that could overtake the answer. raw_answer writes it; send_raw_error, on the event-loop
 * thread of the connection, also makes it the request's final reply. */
static void raw_answer(struct server *s, int fd, int status, const char *reason, const char *code,
                       const char *msg)
{
    char head[512], drain[4096];
    char *body;
    int hl;
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    if (e) {
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "type", "invalid_request_error");
        cJSON_AddStringToObject(e, "code", code);
    }
    body = e ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (fd >= 0 && body) {
        hl =
            snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n%s: %s\r\n\r\n",
                     status, reason, strlen(body), SERVER_INSTANCE_HEADER, server_instance_name(s));
        if (hl > 0 && (size_t)hl < sizeof(head) &&
            send(fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl)
            (void)!send(fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
        shutdown(fd, SHUT_WR);
        for (int i = 0; i < 256 && recv(fd, drain, sizeof(drain), MSG_DONTWAIT) > 0; i++)
            ;
    }
    cJSON_free(body);
}

static void send_raw_error(struct server_req *r, int status, const char *reason, const char *code,
                           const char *msg)
{
    int fd = -1;
    pthread_mutex_lock(&r->srv->conn_mu);
    if (r->cs && !r->cs->killed)
        fd = r->cs->fd;
    pthread_mutex_unlock(&r->srv->conn_mu);
    pthread_mutex_lock(&r->mu);
    r->final = true; /* nothing else goes out for this request */
    r->status = status;
    pthread_mutex_unlock(&r->mu);
    raw_answer(r->srv, fd, status, reason, code, msg);
}

/* The headers (first) or more body bytes have come: the watchdog's body_timeout_s counts from
 * now. */
static void body_progress(struct server *s, struct server_req *r, bool first)
{
    pthread_mutex_lock(&s->conn_mu);
    if (r->cs && r->cs->receiving) {
        if (first)
            r->cs->in_body = true;
        r->cs->body_seen = ar_time_s();
    }
    pthread_mutex_unlock(&s->conn_mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    struct server *s = cls;
    struct server_req *r = *con_cls;
    enum MHD_Result ret = MHD_NO;
    int queue = 0;
    (void)version;
    (void)upload_data;
    if (!r) {
        if (!(r = ar_calloc(1, sizeof(*r))))
            return MHD_NO;
        pthread_mutex_init(&r->mu, NULL);
        r->refs = 1;
        r->srv = s;
        r->conn = c;
        r->cs = conn_of(c);
        r->t0 = ar_time_s();
        snprintf(r->method, sizeof(r->method), "%s", method);
        if (!(r->path = ar_strdup(url))) {
            req_destroy(r);
            return MHD_NO;
        }
        *con_cls = r;
        admit(s, r, c);
        if (r->reply_ready)
            return queue_reply(r, false);
        body_progress(s, r, true);
        return MHD_YES;
    }
    if (*upload_size) {
        bool was = r->too_large, was_bad = r->bad_coding;
        body_progress(s, r, false);
        bool ok = take_body(s, r, upload_data, *upload_size);
        *upload_size = 0;
        if (ok && r->too_large && !was) {
            /* libmicrohttpd cannot queue a reply while a body comes in: answer on the socket
             * and close it rather than take the rest (up to a bound) or reset it */
            send_raw_error(r, 413, "Payload Too Large", "request_too_large",
                           r->coding != CODING_IDENTITY
                               ? "the decompressed body is larger than the limit of this route"
                               : "the body is larger than the limit of this route");
            return MHD_NO;
        }
        if (ok && r->bad_coding && !was_bad) { /* the same, for bytes that do not inflate */
            send_raw_error(r, 400, "Bad Request", "invalid_content_encoding",
                           r->coding == CODING_GZIP ? "the body is not valid gzip data"
                                                    : "the body is not valid deflate (zlib) data");
            return MHD_NO;
        }
        return ok ? MHD_YES : MHD_NO;
    }
    if (!r->handled) {
        r->handled = true;
        dispatch(s, r);
    }
    pthread_mutex_lock(&r->mu);
    if (r->gone && !r->reply_ready) {
        ret = MHD_NO;
    } else if (r->reply_ready) {
        queue = 1;
    } else if (r->stream) {
        queue = 2;
        r->stream_queued = true;
        r->status = 200;
        r->refs++; /* the response object's, dropped by stream_free */
    } else {
        /* no reply yet: park the connection; a reply resumes it and we are called again */
        if (!r->suspended) {
            r->suspended = true;
            MHD_suspend_connection(c);
        }
        ret = MHD_YES;
    }
    pthread_mutex_unlock(&r->mu);
    if (queue)
        ret = queue_reply(r, queue == 2);
    return ret;
}

static void observe_http(struct server *s, struct server_req *r, int status)
{
    char st[16];
    const char *labels[3];
    static const char *const methods[] = {"GET",  "POST",    "PUT",  "DELETE",
                                          "HEAD", "OPTIONS", "PATCH"};
    labels[0] = "OTHER";
    for (size_t i = 0; i < AR_ARRAY_LEN(methods); i++)
        if (!strcmp(r->method, methods[i]))
            labels[0] = methods[i];
    labels[1] = r->route ? r->route->path : "other";
    snprintf(st, sizeof(st), "%d", status);
    labels[2] = st;
    metrics_observe(metrics_child(s->m.http_duration, labels), ar_time_s() - r->t0);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct server *s = cls;
    struct server_req *r = *con_cls;
    void (*fn)(struct server_req *, void *) = NULL;
    void *user = NULL;
    int status;
    (void)c;
    if (!r)
        return;
    *con_cls = NULL;
    pthread_mutex_lock(&r->mu);
    r->conn = NULL;
    r->suspended = false;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !r->final)
        r->gone = true;
    if (!r->final && !r->abort_called && r->abort_fn) {
        r->abort_called = true;
        fn = r->abort_fn;
        user = r->abort_user;
    }
    status = r->final || r->reply_ready ? r->status : 499; /* 499: client closed first */
    if (status == 0)
        status = 499;
    pthread_mutex_unlock(&r->mu);
    if (fn)
        fn(r, user);
    pthread_mutex_lock(&s->conn_mu);
    if (r->cs) {
        if (r->cs->body_stalled) /* the watchdog's answer */
            status = 408;
        if (r->cs->req == r)
            r->cs->req = NULL;
        r->cs->in_body = false;
        r->cs->receiving = true;
        r->cs->started = false;
        r->cs->phase_start = ar_time_s();
        r->cs = NULL; /* the connection may close and free it now */
    }
    pthread_mutex_unlock(&s->conn_mu);
    observe_http(s, r, status);
    req_release(r);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct server *s = cls;
    struct conn *cs = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!(cs = ar_calloc(1, sizeof(*cs))))
            return; /* the connection goes on without watchdog */
        cs->fd = ci ? ci->connect_fd : -1;
        cs->receiving = true;
        cs->phase_start = ar_time_s();
        pthread_mutex_lock(&s->conn_mu);
        cs->next = s->conns;
        if (s->conns)
            s->conns->prev = cs;
        s->conns = cs;
        s->n_conns++;
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = cs;
    } else if (cs) { /* closed: the socket is still open until we return */
        pthread_mutex_lock(&s->conn_mu);
        if (cs->prev)
            cs->prev->next = cs->next;
        else
            s->conns = cs->next;
        if (cs->next)
            cs->next->prev = cs->prev;
        s->n_conns--;
        pthread_mutex_unlock(&s->conn_mu);
        ar_free(cs);
        *socket_context = NULL;
    }
}

/* ---- watchdog ------------------------------------------------------------------------------- */

/* True when the peer has closed (or reset) the connection. Only looks, never consumes. */
static bool peer_gone(int fd)
{
    char b;
    ssize_t n;
    if (fd < 0)
        return false;
    n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

/* Idle: waiting for a request that has not begun (a fresh or kept-alive connection). */
static bool conn_idle(const struct conn *cs, double now)
{
    return cs->receiving && !cs->started && !cs->killed && cs->fd >= 0 &&
           now - cs->phase_start >= IDLE_EVICT_MIN_S;
}

/* Near the connection limit, closes the oldest idle connections until max_conns /
 * CONN_RESERVE_DIV slots are free (counting those already being closed as free). A client that
 * holds idle sockets cannot lock others out; a request in progress is never cut. Under
 * conn_mu. */
static void evict_idle(struct server *s, double now)
{
    int live = 0, keep = s->p.max_conns - AR_MAX(1, s->p.max_conns / CONN_RESERVE_DIV);
    for (struct conn *cs = s->conns; cs; cs = cs->next)
        live += !cs->killed;
    while (live > keep) {
        struct conn *oldest = NULL;
        for (struct conn *cs = s->conns; cs; cs = cs->next)
            if (conn_idle(cs, now) && (!oldest || cs->phase_start < oldest->phase_start))
                oldest = cs;
        if (!oldest)
            return;
        shutdown(oldest->fd, SHUT_RDWR);
        oldest->killed = true;
        live--;
    }
}

static void *watchdog_main(void *arg)
{
    struct server *s = arg;
    pthread_mutex_lock(&s->conn_mu);
    while (s->wd_run) {
        struct server_req *gone[64];
        int n_gone = 0;
        struct timespec ts;
        double now;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(WATCHDOG_PERIOD_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &ts);
        if (!s->wd_run)
            break;
        now = ar_time_s();
        for (struct conn *cs = s->conns; cs; cs = cs->next) {
            if (cs->receiving) {
                /* the whole request must arrive within timeout_s (slow senders) */
                if (!cs->killed && cs->fd >= 0 && now - cs->phase_start > s->p.timeout_s) {
                    shutdown(cs->fd, SHUT_RDWR);
                    cs->killed = true;
                } else if (!cs->killed && cs->fd >= 0 && cs->in_body && s->p.body_timeout_s > 0 &&
                           now - cs->body_seen > s->p.body_timeout_s) {
                    /* a body that stopped coming: among others a chunk that declares more than
                     * the limit and then nothing (libmicrohttpd keeps the declared size to
                     * itself, so that cannot be told from a stall before bytes come) */
                    raw_answer(s, cs->fd, 408, "Request Timeout", "body_timeout",
                               "the request body stopped coming");
                    shutdown(cs->fd, SHUT_RDWR);
                    cs->killed = true;
                    cs->body_stalled = true;
                }
            } else if (cs->req && n_gone < (int)AR_ARRAY_LEN(gone) && peer_gone(cs->fd)) {
                struct server_req *r = cs->req;
                pthread_mutex_lock(&r->mu);
                if (!r->final && !r->abort_called) {
                    r->refs++;
                    gone[n_gone++] = r;
                }
                pthread_mutex_unlock(&r->mu);
            }
        }
        evict_idle(s, now);
        pthread_mutex_unlock(&s->conn_mu);
        for (int i = 0; i < n_gone; i++) {
            req_abort(gone[i]);
            req_release(gone[i]);
        }
        pthread_mutex_lock(&s->conn_mu);
    }
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

/* ---- lifetime ------------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 2, 0)))
#endif
static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    size_t n;
    (void)cls;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    AR_DEBUG("http: %s", msg);
}

static enum ar_status register_metrics(struct server *s)
{
    static const char *const http_labels[] = {"method", "endpoint", "status", NULL};
    static const char *const prio_labels[] = {"priority", NULL};
    static const char *const reason_labels[] = {"reason", NULL};
    static const double tok_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                         0.15,  0.2,    0.3,   0.5,  0.75,  1.0,  2.5};
    struct metrics_registry *g = s->metrics;
    struct metrics_family *f;
    enum ar_status st;
#define FAM(call)                                                                                  \
    do {                                                                                           \
        if ((st = (call)) != AR_OK)                                                                \
            return st;                                                                             \
    } while (0)
    FAM(metrics_histogram(g, "autoreply_http_request_duration_seconds",
                          "HTTP request latency, headers in to reply done.", http_labels, NULL, 0,
                          &s->m.http_duration));
    FAM(metrics_histogram(g, "autoreply_time_to_first_token_seconds",
                          "Submit to first generated token.", NULL, NULL, 0, &f));
    s->m.ttft = metrics_child(f, NULL);
    FAM(metrics_histogram(g, "autoreply_time_per_output_token_seconds",
                          "Mean time between generated tokens of a request.", NULL, tok_buckets,
                          AR_ARRAY_LEN(tok_buckets), &f));
    s->m.tpot = metrics_child(f, NULL);
    FAM(metrics_histogram(g, "autoreply_queue_time_seconds", "Submit to admission.", NULL, NULL, 0,
                          &f));
    s->m.queue_time = metrics_child(f, NULL);
    FAM(metrics_histogram(g, "autoreply_e2e_request_latency_seconds", "Submit to last token.", NULL,
                          NULL, 0, &f));
    s->m.e2e = metrics_child(f, NULL);
    FAM(metrics_gauge(g, "autoreply_queue_length", "Requests waiting for admission.", prio_labels,
                      &s->m.queue_length));
    FAM(metrics_gauge(g, "autoreply_running_sequences", "Sequences being generated.", NULL, &f));
    s->m.running = metrics_child(f, NULL);
    FAM(metrics_gauge(g, "autoreply_kv_blocks_used", "KV cache blocks in use.", NULL, &f));
    s->m.kv_used = metrics_child(f, NULL);
    FAM(metrics_gauge(g, "autoreply_kv_blocks_capacity", "KV cache blocks in all.", NULL, &f));
    s->m.kv_total = metrics_child(f, NULL);
    FAM(metrics_gauge(g, "autoreply_kv_local_blocks_used",
                      "Local-pool KV blocks in use (sliding-window layers).", NULL, &f));
    s->m.kv_local_used = metrics_child(f, NULL);
    FAM(metrics_gauge(g, "autoreply_kv_local_blocks_capacity",
                      "Local-pool KV blocks in all (0: the model has no sliding-window layers).",
                      NULL, &f));
    s->m.kv_local_total = metrics_child(f, NULL);
    FAM(metrics_counter(g, "autoreply_prefix_cache_queries_total",
                        "Admitted requests that looked up the prefix cache.", NULL, &f));
    s->m.prefix_queries = metrics_child(f, NULL);
    FAM(metrics_counter(g, "autoreply_prefix_cache_hit_tokens_total",
                        "Prompt tokens whose KV came from the prefix cache.", NULL, &f));
    s->m.prefix_hit_tokens = metrics_child(f, NULL);
    FAM(metrics_counter(g, "autoreply_preemptions_total", "Sequences preempted for KV space.", NULL,
                        &f));
    s->m.preemptions = metrics_child(f, NULL);
    FAM(metrics_counter(g, "autoreply_prompt_tokens_total", "Prompt tokens processed.", NULL, &f));
    s->m.prompt_tokens = metrics_child(f, NULL);
    FAM(metrics_counter(g, "autoreply_generation_tokens_total", "Tokens generated.", NULL, &f));
    s->m.generation_tokens = metrics_child(f, NULL);
    FAM(metrics_counter(g, "autoreply_rejected_total",
                        "Requests refused for load: rate_limit (429, a client over its request or "
                        "token rate), queue_full (503, engine queue), overloaded (503, review "
                        "workers or engine busy).",
                        reason_labels, &f));
    s->m.rejected_rate = metrics_child(f, (const char *const[]){"rate_limit"});
    s->m.rejected_queue = metrics_child(f, (const char *const[]){"queue_full"});
    s->m.rejected_overloaded = metrics_child(f, (const char *const[]){"overloaded"});
    FAM(metrics_process_register(g));
#undef FAM
    return AR_OK;
}

/* A header value we can send as is: printable ASCII, no surrounding spaces. */
static bool instance_name_ok(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > SERVER_INSTANCE_NAME_MAX || n[0] == ' ' || n[len - 1] == ' ')
        return false;
    for (size_t i = 0; i < len; i++)
        if (n[i] < 0x20 || n[i] > 0x7e)
            return false;
    return true;
}

/* "<host name>:<port>", or "autoreply" when the host has no usable name. */
static char *default_instance_name(int port)
{
    char host[256], name[sizeof(host) + 16]; /* too long for a name: "autoreply" */
    if (gethostname(host, sizeof(host)) != 0)
        host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    snprintf(name, sizeof(name), "%s:%d", host, port);
    return ar_strdup(host[0] && instance_name_ok(name) ? name : "autoreply");
}

enum ar_status server_create(const struct server_params *p, struct server **out, struct ar_err *err)
{
    struct server *s;
    enum ar_status st;
    *out = NULL;
    ar_json_use_ar_alloc(); /* request bodies and answers counted with the rest */
    if (!p || p->max_body == 0 || p->timeout_s <= 0 || !(p->body_timeout_s >= 0) ||
        p->max_conns < 1 || p->http_threads < 1 || p->port < 0 || p->port > 65535 ||
        p->rate_rps < 0 || p->rate_tpm < 0 || p->n_ctx < 0)
        return ar_err_set(err, AR_EINVAL, 0, "invalid server parameters");
    if (!(s = ar_calloc(1, sizeof(*s))))
        return AR_ENOMEM;
    s->p = *p;
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_cond_init(&s->conn_cv, NULL);
    pthread_mutex_init(&s->inst_mu, NULL);
    pthread_mutex_init(&s->health_mu, NULL);
    if (p->instance_name && !instance_name_ok(p->instance_name)) {
        st = ar_err_set(err, AR_EINVAL, 0,
                        "bad instance name: 1 to %d printable ASCII characters, no surrounding "
                        "spaces",
                        SERVER_INSTANCE_NAME_MAX);
        goto fail;
    }
    s->host = ar_strdup(p->host ? p->host : "127.0.0.1");
    s->model_name = ar_strdup(p->model_name ? p->model_name : "autoreply");
    if (!s->host || !s->model_name) {
        st = AR_ENOMEM;
        goto fail;
    }
    if (p->instance_name) {
        char *n = ar_strdup(p->instance_name);
        if (!n) {
            st = AR_ENOMEM;
            goto fail;
        }
        atomic_store(&s->instance, n);
    }
    s->p.host = s->host;
    s->p.model_name = s->model_name;
    s->p.instance_name = NULL; /* see s->instance */
    s->p.api_key_file = NULL;
    s->p.rate_redis_url = NULL; /* used below, not kept */
    if (s->p.retry_after_s < 1)
        s->p.retry_after_s = 1;
    if (p->api_key_file && (st = srv_keys_load(p->api_key_file, &s->keys, err)) != AR_OK)
        goto fail;
    if ((st = srv_limiter_create(p->rate_rps, p->rate_burst, p->rate_tpm, &s->limiter)) != AR_OK)
        goto fail;
    if (p->metrics) {
        s->metrics = p->metrics;
    } else {
        if ((st = metrics_registry_create(&s->metrics)) != AR_OK)
            goto fail;
        s->own_metrics = true;
    }
    if (p->rate_redis_url &&
        (st = srv_limiter_use_redis(s->limiter, p->rate_redis_url, s->metrics, err)) != AR_OK)
        goto fail;
    if ((st = register_metrics(s)) != AR_OK || (st = openai_register(s)) != AR_OK ||
        (st = console_register(s)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot register the server's metrics and routes");
        goto fail;
    }
    *out = s;
    return AR_OK;
fail:
    server_destroy(s);
    return st;
}

enum ar_status server_keep(struct server *s, void *data)
{
    if (!s || !data || s->mhd || s->n_route_data == (int)AR_ARRAY_LEN(s->route_data))
        return AR_EINVAL;
    s->route_data[s->n_route_data++] = data;
    return AR_OK;
}

enum ar_status server_add_route(struct server *s, const struct server_route *r)
{
    struct route *nr;
    if (!r || !r->method || !r->path || !r->fn || s->mhd)
        return AR_EINVAL;
    for (int i = 0; i < s->n_routes; i++)
        if (!strcmp(s->routes[i].method, r->method) && !strcmp(s->routes[i].path, r->path) &&
            (s->routes[i].flags & SERVER_ROUTE_PREFIX) == (r->flags & SERVER_ROUTE_PREFIX))
            return AR_EINVAL;
    nr = ar_realloc(s->routes, (size_t)(s->n_routes + 1) * sizeof(*nr));
    if (!nr)
        return AR_ENOMEM;
    s->routes = nr;
    nr = &s->routes[s->n_routes];
    nr->method = ar_strdup(r->method);
    nr->path = ar_strdup(r->path);
    if (!nr->method || !nr->path) {
        ar_free(nr->method);
        ar_free(nr->path);
        return AR_ENOMEM;
    }
    nr->path_len = strlen(nr->path);
    nr->fn = r->fn;
    nr->user = r->user;
    nr->flags = r->flags;
    nr->max_body = r->max_body ? r->max_body : s->p.max_body;
    s->n_routes++;
    return AR_OK;
}

/* ---- health checks ---------------------------------------------------------------------- */

const char *server_health_str(int h)
{
    return h == SERVER_HEALTH_OK ? "ok" : h == SERVER_HEALTH_DEGRADED ? "degraded" : "down";
}

enum ar_status server_add_health_check(struct server *s, const char *name, int (*check)(void *user),
                                       void *user)
{
    struct health_check *nc;
    size_t len = name ? strlen(name) : 0;
    enum ar_status st = AR_OK;
    if (!s || !check || len == 0 || len >= sizeof(nc->name))
        return AR_EINVAL;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return AR_EINVAL;
    }
    pthread_mutex_lock(&s->health_mu);
    for (int i = 0; i < s->n_checks && st == AR_OK; i++)
        if (!strcmp(s->checks[i].name, name))
            st = AR_EINVAL;
    if (st == AR_OK) {
        nc = ar_realloc(s->checks, (size_t)(s->n_checks + 1) * sizeof(*nc));
        if (!nc) {
            st = AR_ENOMEM;
        } else {
            s->checks = nc;
            nc = &s->checks[s->n_checks++];
            memcpy(nc->name, name, len + 1);
            nc->fn = check;
            nc->user = user;
        }
    }
    pthread_mutex_unlock(&s->health_mu);
    return st;
}

int srv_health_run(struct server *s, cJSON *backends, int *n)
{
    struct health_check *copy = NULL;
    int n_copy, worst = SERVER_HEALTH_OK;
    /* the checks run outside the lock (a check may take a moment) on a copy of the list */
    pthread_mutex_lock(&s->health_mu);
    n_copy = s->n_checks;
    if (n_copy && (copy = ar_malloc((size_t)n_copy * sizeof(*copy))))
        memcpy(copy, s->checks, (size_t)n_copy * sizeof(*copy));
    pthread_mutex_unlock(&s->health_mu);
    if (n_copy && !copy) { /* out of memory: we cannot tell, so we do not claim ok */
        if (n)
            *n = n_copy;
        return SERVER_HEALTH_DEGRADED;
    }
    for (int i = 0; i < n_copy; i++) {
        int h = copy[i].fn(copy[i].user);
        if (h != SERVER_HEALTH_OK && h != SERVER_HEALTH_DEGRADED)
            h = SERVER_HEALTH_DOWN;
        if (h > worst)
            worst = h;
        if (backends)
            cJSON_AddStringToObject(backends, copy[i].name, server_health_str(h));
    }
    ar_free(copy);
    if (n)
        *n = n_copy;
    return worst;
}

enum ar_status server_start(struct server *s, struct ar_err *err)
{
    struct addrinfo hints = {0}, *ai = NULL;
    char port[16];
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    const union MHD_DaemonInfo *di;
    int rc;
    if (s->mhd || s->stopped)
        return AR_EINVAL;
    snprintf(port, sizeof(port), "%d", s->p.port);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if ((rc = getaddrinfo(s->host, port, &hints, &ai)) != 0 || !ai)
        return ar_err_set(err, AR_EIO, 0, "cannot resolve %s: %s", s->host, gai_strerror(rc));
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    pthread_mutex_lock(&s->inst_mu); /* no response goes out before the instance is named */
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ceil(s->p.timeout_s), MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->p.max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)(s->p.max_conns_per_ip < 0 ? AR_MAX(1, s->p.max_conns / 2)
                                             : s->p.max_conns_per_ip),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(s->p.http_threads > 1 ? s->p.http_threads : 0),
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->mhd) {
        int e = errno;
        pthread_mutex_unlock(&s->inst_mu);
        return ar_err_set(err, AR_EIO, 0, "cannot listen on %s:%d (%s)", s->host, s->p.port,
                          strerror(e));
    }
    di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    if (!atomic_load(&s->instance))
        atomic_store(&s->instance, default_instance_name(s->port)); /* NULL: "autoreply" */
    pthread_mutex_unlock(&s->inst_mu);
    s->wd_run = true;
    if (pthread_create(&s->wd, NULL, watchdog_main, s) != 0) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        s->wd_run = false;
        return ar_err_set(err, AR_ENOMEM, 0, "cannot start the watchdog thread");
    }
    s->wd_started = true;
    return AR_OK;
}

void server_set_engine(struct server *s, struct engine *e, const struct model *m,
                       const struct tokenizer *tok)
{
    s->model = m;
    s->tok = tok;
    atomic_store(&s->engine, e); /* publishes model and tok too */
}

/* Waits until no handler owes a reply or until deadline (ar_time_s). Under conn_mu. */
static void wait_idle(struct server *s, double deadline)
{
    while (s->n_active > 0) {
        struct timespec ts;
        double left = deadline - ar_time_s();
        if (left <= 0)
            break;
        clock_gettime(CLOCK_REALTIME, &ts);
        left = AR_MIN(left, 0.05);
        ts.tv_nsec += (long)(left * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &ts);
    }
}

/* Calls the abort hooks of every request that still owes a reply. */
static void abort_all(struct server *s)
{
    for (;;) {
        struct server_req *batch[64];
        int n = 0;
        pthread_mutex_lock(&s->conn_mu);
        for (struct conn *cs = s->conns; cs && n < (int)AR_ARRAY_LEN(batch); cs = cs->next) {
            struct server_req *r = cs->req;
            if (!r)
                continue;
            pthread_mutex_lock(&r->mu);
            if (!r->final && !r->abort_called) {
                r->refs++;
                batch[n++] = r;
            }
            pthread_mutex_unlock(&r->mu);
        }
        pthread_mutex_unlock(&s->conn_mu);
        for (int i = 0; i < n; i++) {
            req_abort(batch[i]);
            req_release(batch[i]);
        }
        if (n < (int)AR_ARRAY_LEN(batch))
            return;
    }
}

void server_stop(struct server *s, double grace_s)
{
    MHD_socket lfd;
    if (!s || !s->mhd || s->stopped)
        return;
    atomic_store(&s->stopping, true);
    lfd = MHD_quiesce_daemon(s->mhd);
    pthread_mutex_lock(&s->conn_mu);
    wait_idle(s, ar_time_s() + grace_s);
    pthread_mutex_unlock(&s->conn_mu);
    abort_all(s);
    pthread_mutex_lock(&s->conn_mu);
    wait_idle(s, ar_time_s() + 5.0);
    /* whatever still waits (a handler that never replies) is closed: resume it so that
     * libmicrohttpd can drop it; nothing may suspend from now on */
    s->hard_stop = true;
    for (struct conn *cs = s->conns; cs; cs = cs->next) {
        struct server_req *r = cs->req;
        if (!r)
            continue;
        pthread_mutex_lock(&r->mu);
        r->gone = true;
        wake(r);
        pthread_mutex_unlock(&r->mu);
    }
    s->wd_run = false;
    pthread_cond_broadcast(&s->conn_cv);
    pthread_mutex_unlock(&s->conn_mu);
    if (s->wd_started) {
        pthread_join(s->wd, NULL);
        s->wd_started = false;
    }
    MHD_stop_daemon(s->mhd);
    if (lfd != MHD_INVALID_SOCKET)
        close(lfd);
    s->mhd = NULL;
    s->stopped = true;
}

void server_destroy(struct server *s)
{
    if (!s)
        return;
    server_stop(s, 0);
    for (int i = 0; i < s->n_routes; i++) {
        ar_free(s->routes[i].method);
        ar_free(s->routes[i].path);
    }
    ar_free(s->routes);
    for (int i = 0; i < s->n_route_data; i++)
        ar_free(s->route_data[i]);
    srv_keys_destroy(s->keys);
    srv_limiter_destroy(s->limiter);
    if (s->own_metrics)
        metrics_registry_destroy(s->metrics);
    pthread_cond_destroy(&s->conn_cv);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_mutex_destroy(&s->inst_mu);
    pthread_mutex_destroy(&s->health_mu);
    ar_free(s->checks);
    ar_free(atomic_load(&s->instance));
    ar_free(s->host);
    ar_free(s->model_name);
    ar_free(s);
}
