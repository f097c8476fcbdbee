/* http_client.h - a tiny HTTP/1.1 client for the tests that drive a real server on 127.0.0.1
 * (tests/server, tests/reply): one request per connection (Connection: close), chunked bodies
 * joined, JSON and MessagePack answers decoded, /metrics samples read. Before including it
 * a test may define TH_HTTP_RECV_TIMEOUT_S (seconds a read may wait) and TH_HTTP_WHOLE_BODY:
 * then a request body is sent whole even when the server has answered already, and http()
 * fails the test when any of the request could not be sent. */
#ifndef AR_TEST_HTTP_CLIENT_H
#define AR_TEST_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <msgpack.h>

#include "base/base.h"
#include "harness/harness.h"

#ifdef TH_HTTP_WHOLE_BODY
#define TH_HTTP_SEND_WHOLE 1
#else
#define TH_HTTP_SEND_WHOLE 0
#endif

#ifndef TH_HTTP_RECV_TIMEOUT_S
#define TH_HTTP_RECV_TIMEOUT_S 60 /* a server that stops answering fails the test, not hangs it */
#endif

struct resp {
    int status; /* -1: no connection or no answer */
    char *head; /* status line and headers */
    char *body; /* de-chunked, NUL-terminated */
    size_t body_len;
    bool sent_all; /* the whole request went out (false: a send failed or, without
                      TH_HTTP_WHOLE_BODY, the server answered before the body was sent) */
};

static inline void resp_free(struct resp *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

/* A connected socket to 127.0.0.1:port with the receive timeout set; -1 when nobody listens. */
static inline int http_connect(int port)
{
    struct sockaddr_in a = {0};
    struct timeval tv = {TH_HTTP_RECV_TIMEOUT_S, 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* The same, failing the test when nobody listens. */
static inline int connect_port(int port)
{
    int fd = http_connect(port);
    if (fd < 0)
        fail_msg("nothing listens on port %d", port);
    return fd;
}

static inline bool send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

/* Everything until the peer closes (or the receive timeout), NUL-terminated; *n its length.
 * Caller frees. */
static inline char *read_all(int fd, size_t *n)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        ssize_t k;
        if (len + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        k = recv(fd, buf + len, cap - len - 1, 0);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    buf[len] = '\0';
    *n = len;
    return buf;
}

/* Value of a response header (case-insensitive name) copied into buf, or NULL. */
static inline const char *resp_header(const struct resp *r, const char *name, char *buf,
                                      size_t size)
{
    size_t n = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        const char *h = p + 2;
        if (!strncasecmp(h, name, n) && h[n] == ':') {
            const char *v = h + n + 1, *e;
            while (*v == ' ')
                v++;
            e = strstr(v, "\r\n");
            snprintf(buf, size, "%.*s", (int)(e ? e - v : (ptrdiff_t)strlen(v)), v);
            return buf;
        }
    }
    return NULL;
}

/* Splits the raw bytes of a Connection: close response into head and (de-chunked) body; fails
 * the test when there is no HTTP head. */
static inline void parse_response(const char *raw, size_t n, struct resp *out)
{
    const char *sep = memmem(raw, n, "\r\n\r\n", 4);
    char te[64];
    memset(out, 0, sizeof(*out));
    if (!sep)
        fail_msg("no HTTP head in %zu bytes: %.200s", n, raw);
    out->head = strndup(raw, (size_t)(sep - raw) + 2);
    assert_int_equal(sscanf(out->head, "HTTP/1.%*d %d", &out->status), 1);
    sep += 4;
    n -= (size_t)(sep - raw);
    out->body = malloc(n + 1);
    if (resp_header(out, "Transfer-Encoding", te, sizeof(te)) && strstr(te, "chunked")) {
        const char *p = sep, *end = sep + n;
        while (p < end) {
            unsigned long k = strtoul(p, NULL, 16);
            const char *line = memmem(p, (size_t)(end - p), "\r\n", 2);
            if (!line || k == 0)
                break;
            p = line + 2;
            if ((size_t)(end - p) < k)
                k = (unsigned long)(end - p);
            memcpy(out->body + out->body_len, p, k);
            out->body_len += k;
            p += k + 2;
        }
    } else {
        memcpy(out->body, sep, n);
        out->body_len = n;
    }
    out->body[out->body_len] = '\0';
}

/* One request on a fresh connection (Connection: close). extra: more header lines, each ending
 * in \r\n; body may be NULL. A server that answers early (413) stops reading: without
 * TH_HTTP_WHOLE_BODY the rest of the body is not sent once it has answered (out->sent_all
 * says so). False (status -1) when nothing
 * listens or nothing came back. */
static inline bool http_try(int port, const char *method, const char *path, const char *extra,
                            const void *body, size_t body_len, struct resp *out)
{
    char head[2048];
    size_t len;
    char *raw;
    bool sent;
    int hl, fd = http_connect(port);
    memset(out, 0, sizeof(*out));
    out->status = -1;
    if (fd < 0)
        return false;
    hl =
        snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s",
                 method, path, extra ? extra : "");
    if (body)
        hl += snprintf(head + hl, sizeof(head) - (size_t)hl, "Content-Length: %zu\r\n", body_len);
    hl += snprintf(head + hl, sizeof(head) - (size_t)hl, "\r\n");
    sent = send_all(fd, head, (size_t)hl);
    if (sent && body) {
        const char *b = body;
        for (size_t off = 0; off < body_len;) {
            struct pollfd pf = {fd, POLLIN, 0};
            size_t k = AR_MIN(body_len - off, (size_t)65536);
            if ((!TH_HTTP_SEND_WHOLE && poll(&pf, 1, 0) > 0) || !send_all(fd, b + off, k)) {
                sent = false;
                break;
            }
            off += k;
        }
    }
    raw = read_all(fd, &len);
    close(fd);
    if (len == 0) {
        free(raw);
        return false;
    }
    parse_response(raw, len, out);
    out->sent_all = sent;
    free(raw);
    return true;
}

/* The same, failing the test when no answer came. */
static inline void http(int port, const char *method, const char *path, const char *extra,
                        const void *body, size_t body_len, struct resp *out)
{
    if (!http_try(port, method, path, extra, body, body_len, out))
        fail_msg("%s %s: no answer from port %d", method, path, port);
    if (TH_HTTP_SEND_WHOLE && !out->sent_all)
        fail_msg("%s %s: the request could not be sent whole (the answer: %d)", method, path,
                 out->status);
}

/* POST a JSON body; the answer parsed (fails the test when it is not JSON). */
static inline cJSON *post_json(int port, const char *path, const char *extra, const char *json,
                               int *status)
{
    struct resp r;
    char hdr[512];
    cJSON *j;
    snprintf(hdr, sizeof(hdr), "Content-Type: application/json\r\n%s", extra ? extra : "");
    http(port, "POST", path, hdr, json, strlen(json), &r);
    *status = r.status;
    j = cJSON_Parse(r.body);
    if (!j)
        fail_msg("POST %s: not JSON (status %d): %.300s", path, r.status, r.body);
    resp_free(&r);
    return j;
}

/* A sample of the /metrics text: the value of the first line "<series> <value>"; NAN when
 * absent. */
static inline double metric(int port, const char *series)
{
    struct resp r;
    double v;
    http(port, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    v = th_metric_sample(r.body, series, (double)NAN);
    resp_free(&r);
    return v;
}

/* POST the MessagePack body in sb (destroyed here) asking for a MessagePack answer; fails the
 * test unless the answer is 200 with Content-Type application/msgpack and decodes. up holds it
 * and refers to r's body: the caller releases both (msgpack_unpacked_destroy, resp_free). */
static inline void post_msgpack(int port, const char *path, msgpack_sbuffer *sb,
                                msgpack_unpacked *up, struct resp *r)
{
    char ct[64];
    http(port, "POST", path, "Content-Type: application/msgpack\r\nAccept: application/msgpack\r\n",
         sb->data, sb->size, r);
    msgpack_sbuffer_destroy(sb);
    assert_int_equal(r->status, 200);
    assert_string_equal(resp_header(r, "Content-Type", ct, sizeof(ct)), "application/msgpack");
    msgpack_unpacked_init(up);
    assert_int_equal(msgpack_unpack_next(up, r->body, r->body_len, NULL), MSGPACK_UNPACK_SUCCESS);
}

/* Looks up key in a MessagePack map (msgpack-c's own decoder). */
static inline const msgpack_object *mp_get(const msgpack_object *o, const char *key)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            !memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size))
            return &kv->val;
    }
    return NULL;
}

#endif
