/* http.c - the HTTP core over libmicrohttpd: a request's lifetime, and its framing as
 * libmicrohttpd hands it over: the target and framing checks, admission (routing, auth,
 * request-rate limits, content negotiation), body intake with limits (gzip and deflate bodies
 * inflated as they come in), dispatch to the handler, queueing whole replies and SSE streams,
 * and the connection list the watchdog walks. Handlers' calls are in http_reply.c, the route
 * table and health checks in http_routes.c, create/start/stop and the watchdog in
 * http_lifetime.c; http_internal.h has the structures and the reference and lock rules. */
#include <arpa/inet.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "http_internal.h"

#define STREAM_BLOCK 16384
#define INFLATE_BLOCK 16384

/* ---- request lifetime ---------------------------------------------------------------------- */

void server_req_destroy(struct server_req *r)
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

void server_req_release(struct server_req *r)
{
    int left;
    pthread_mutex_lock(&r->mu);
    left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0)
        server_req_destroy(r);
}

/* Resumes the connection if we suspended it. Under r->mu. */
void server_req_wake(struct server_req *r)
{
    if (r->suspended && r->conn) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
}

/* The handler has made its final reply: drop its reference. Not under r->mu. */
void server_req_deactivate(struct server_req *r)
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
        server_req_release(r);
}

/* Calls the abort hook once (the client is gone). The caller holds a reference. */
void server_req_abort(struct server_req *r)
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
    server_req_release(cls);
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
            server_req_release(r);
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

bool server_address_is_loopback(const char *addr)
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
static bool body_format(const char *ct, enum server_codec_format *f)
{
    size_t n;
    *f = SERVER_CODEC_JSON;
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
        *f = SERVER_CODEC_MSGPACK;
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
void *server_on_uri(void *cls, const char *uri, struct MHD_Connection *c)
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
    const struct route *rt = server_find_route(s, r->method, r->path, &known, allow, sizeof(allow));
    v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    r->out_fmt = v && strstr(v, "msgpack") ? SERVER_CODEC_MSGPACK : SERVER_CODEC_JSON;
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
        !server_address_is_loopback(r->client)) {
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
            idx = server_keys_find(s->keys, k, strlen(k));
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
        !server_limiter_request(s->limiter, r->client, ar_time_s(), &retry)) {
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
    if (r->in_fmt == SERVER_CODEC_JSON) {
        /* only what can be one JSON object or array is tried (JSONL fails fast: trailing
         * data after its first line) */
        while (a < r->body_len && (r->body[a] == ' ' || r->body[a] == '\t' || r->body[a] == '\r' ||
                                   r->body[a] == '\n'))
            a++;
        if (a == r->body_len || (r->body[a] != '{' && r->body[a] != '['))
            return true;
    }
    st = server_codec_parse(r->in_fmt, r->body ? r->body : "", r->body_len, &r->json, &err);
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
    if (st != AR_OK && r->in_fmt == SERVER_CODEC_MSGPACK) {
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
        st = server_codec_parse(r->in_fmt, r->body ? r->body : "", r->body_len, &r->json, &err);
        ar_free(r->body);
        r->body = NULL;
        if (st == AR_ENOMEM) {
            server_reply_error(r, 503, "server_error", "out_of_memory", "out of memory");
            return;
        }
        if (st != AR_OK) {
            server_reply_error(r, 400, "invalid_request_error",
                               r->in_fmt == SERVER_CODEC_JSON ? "invalid_json" : "invalid_msgpack",
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
void server_raw_answer(struct server *s, int fd, int status, const char *reason, const char *code,
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
    server_raw_answer(r->srv, fd, status, reason, code, msg);
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

enum MHD_Result server_on_request(void *cls, struct MHD_Connection *c, const char *url,
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
            server_req_destroy(r);
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

void server_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
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
    server_req_release(r);
}

void server_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
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
