/* gzip_test.c - compressed request bodies and replies over real HTTP: `autoreply serve`
 * (./bin/autoreply, or $AR_BIN) as a child process with the demo model. A gzip or deflate body
 * must give the answer of the same body sent plain (zlib's own compressor makes them); a zip
 * bomb must get 413 within a second while the server's peak memory barely moves; corrupt,
 * truncated and unknown encodings get 400 and 415; a large reply is gzipped only for a client
 * that accepts it and inflates (zlib's own inflater) to the plain reply. */
#include "harness/harness.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#define TH_HTTP_RECV_TIMEOUT_S 20
#include "harness/http_client.h"
#include "harness/serve.h"

#define MIB (1u << 20)

static struct {
    char dir[64];
    char model[512];
    struct th_serve srv;
} g;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int group_setup(void **state)
{
    char data[128], log[128];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (access(th_bin_path(), X_OK) != 0)
        fail_msg("%s not found: build it first (make bin/autoreply)", th_bin_path());
    th_shared_path(g.model, sizeof(g.model), "models/autoreply-demo-q8_0.gguf");
    if (access(g.model, R_OK) != 0)
        snprintf(g.model, sizeof(g.model), "models/autoreply-demo-q8_0.gguf");
    snprintf(g.dir, sizeof(g.dir), "/tmp/ar_gzip_XXXXXX");
    assert_non_null(mkdtemp(g.dir));
    snprintf(data, sizeof(data), "%s/var", g.dir);
    snprintf(log, sizeof(log), "%s/serve.log", g.dir);
    th_serve_spawn(
        &g.srv, log,
        (const char *const[]){"-m", g.model, "--port", "0", "--data-dir", data, "-t", "1", NULL});
    return th_serve_wait_ready(&g.srv, 60) ? 0 : -1;
}

static int group_teardown(void **state)
{
    char cmd[128];
    int rc;
    (void)state;
    rc = th_serve_stop(&g.srv);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g.dir);
    if (system(cmd) != 0)
        return -1;
    return rc == 0 ? 0 : -1;
}

/* ---- zlib's side -------------------------------------------------------------------------- */

/* data as one zlib stream: window_bits 16 + 15 gzip, 15 the zlib format (HTTP's "deflate"). */
static unsigned char *compress_with(const void *data, size_t len, int window_bits, size_t *out_len)
{
    z_stream zs = {0};
    unsigned char *out;
    uLong cap;
    assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
    cap = deflateBound(&zs, (uLong)len);
    out = malloc(cap);
    zs.next_in = (Bytef *)(uintptr_t)data;
    zs.avail_in = (uInt)len;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    *out_len = zs.total_out;
    deflateEnd(&zs);
    return out;
}

/* A whole gzip member inflated (zlib's inflater); NULL when it is not one. Caller frees. */
static char *gunzip(const void *data, size_t len, size_t *out_len)
{
    z_stream zs = {0};
    size_t cap = 4 * len + 4096;
    char *out = malloc(cap + 1);
    int rc;
    assert_int_equal(inflateInit2(&zs, 16 + MAX_WBITS), Z_OK);
    zs.next_in = (Bytef *)(uintptr_t)data;
    zs.avail_in = (uInt)len;
    for (;;) {
        zs.next_out = (Bytef *)out + zs.total_out;
        zs.avail_out = (uInt)(cap - zs.total_out);
        rc = inflate(&zs, Z_NO_FLUSH);
        if (rc != Z_OK || zs.avail_out > 0)
            break;
        out = realloc(out, (cap *= 2) + 1);
    }
    *out_len = zs.total_out;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END || zs.avail_in != 0) {
        free(out);
        return NULL;
    }
    out[*out_len] = '\0';
    return out;
}

/* A valid gzip member of mib MiB of zero bytes, made cheaply: after Z_FULL_FLUSH deflate starts
 * afresh, so one compressed MiB of zeros repeats (checked), and the trailer's CRC-32 is
 * combined from that of one MiB. About 1 KB per MiB. */
static unsigned char *zip_bomb(size_t mib, size_t *out_len)
{
    static const unsigned char head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 3};
    static unsigned char zeros[MIB];
    unsigned char seg[2][8192], tail[64], *out, *p;
    size_t seg_len[2], tail_len;
    z_stream zs = {0};
    uLong crc1 = crc32(crc32(0, NULL, 0), zeros, MIB), crc = crc32(0, NULL, 0);
    uint32_t isize = (uint32_t)((uint64_t)mib * MIB);
    assert_int_equal(deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 9, Z_DEFAULT_STRATEGY), Z_OK);
    for (int i = 0; i < 2; i++) {
        zs.next_in = zeros;
        zs.avail_in = MIB;
        zs.next_out = seg[i];
        zs.avail_out = sizeof(seg[i]);
        assert_int_equal(deflate(&zs, Z_FULL_FLUSH), Z_OK);
        assert_int_equal(zs.avail_in, 0);
        seg_len[i] = sizeof(seg[i]) - zs.avail_out;
    }
    assert_int_equal(seg_len[0], seg_len[1]);
    assert_memory_equal(seg[0], seg[1], seg_len[0]);
    zs.next_out = tail;
    zs.avail_out = sizeof(tail);
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    tail_len = sizeof(tail) - zs.avail_out;
    deflateEnd(&zs);
    *out_len = sizeof(head) + mib * seg_len[0] + tail_len + 8;
    p = out = malloc(*out_len);
    memcpy(p, head, sizeof(head));
    p += sizeof(head);
    for (size_t i = 0; i < mib; i++, p += seg_len[0]) {
        memcpy(p, seg[0], seg_len[0]);
        crc = crc32_combine(crc, crc1, MIB);
    }
    memcpy(p, tail, tail_len);
    p += tail_len;
    for (int i = 0; i < 4; i++)
        *p++ = (unsigned char)(crc >> (8 * i));
    for (int i = 0; i < 4; i++)
        *p++ = (unsigned char)(isize >> (8 * i));
    return out;
}

/* ---- requests ----------------------------------------------------------------------------- */

enum coding { PLAIN, GZIP, DEFLATE };

/* POST json (encoded as asked, under the Content-Encoding name given) and the parsed answer. */
static cJSON *post_coded(const char *path, const char *json, enum coding c, const char *name,
                         int *status)
{
    size_t len = strlen(json);
    unsigned char *z = NULL;
    char hdr[256];
    struct resp r;
    cJSON *j;
    if (c != PLAIN)
        z = compress_with(json, len, c == GZIP ? 16 + MAX_WBITS : MAX_WBITS, &len);
    snprintf(hdr, sizeof(hdr), "Content-Type: application/json\r\n%s%s%s",
             name ? "Content-Encoding: " : "", name ? name : "", name ? "\r\n" : "");
    http(g.srv.port, "POST", path, hdr, z ? (const void *)z : json, len, &r);
    free(z);
    *status = r.status;
    j = cJSON_Parse(r.body);
    if (!j)
        fail_msg("POST %s (%s): not JSON, status %d: %.200s", path, name ? name : "plain", r.status,
                 r.body);
    resp_free(&r);
    return j;
}

static const cJSON *at(const cJSON *j, const char *path)
{
    char buf[128], *save = NULL, *tok;
    snprintf(buf, sizeof(buf), "%s", path);
    for (tok = strtok_r(buf, ".", &save); tok && j; tok = strtok_r(NULL, ".", &save))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(tok)) : cJSON_GetObjectItem(j, tok);
    return j;
}

/* The field of both answers must be present and equal. */
static void expect_same(const cJSON *a, const cJSON *b, const char *path, const char *what)
{
    const cJSON *x = at(a, path), *y = at(b, path);
    if (!x || !y || !cJSON_Compare(x, y, true))
        fail_msg("%s: %s differs from the plain body's", what, path);
}

/* POST raw body bytes with these extra header lines; the answer must have this status and
 * error code. */
static void expect_error(const char *path, const char *extra, const void *body, size_t len,
                         int status, const char *code, const char *what)
{
    struct resp r;
    char hdr[256];
    cJSON *j;
    snprintf(hdr, sizeof(hdr), "Content-Type: application/json\r\n%s", extra);
    http(g.srv.port, "POST", path, hdr, body, len, &r);
    j = cJSON_Parse(r.body);
    if (r.status != status || !j || !cJSON_IsString(at(j, "error.code")) ||
        strcmp(at(j, "error.code")->valuestring, code))
        fail_msg("%s: status %d, want %d %s: %.200s", what, r.status, status, code, r.body);
    cJSON_Delete(j);
    resp_free(&r);
}

/* Peak resident memory of the server process (VmHWM), KiB. */
static long server_peak_kib(void)
{
    char path[64], line[256];
    long kib = -1;
    FILE *f;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)g.srv.pid);
    f = fopen(path, "r"); /* read line by line: /proc files have no size */
    assert_non_null(f);
    while (kib < 0 && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6))
            kib = atol(line + 6);
    fclose(f);
    assert_true(kib > 0);
    return kib;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void zip_bomb_construction_is_valid_gzip(void **state)
{
    size_t n, m;
    unsigned char *b = zip_bomb(4, &n);
    char *z = gunzip(b, n, &m);
    (void)state;
    assert_non_null(z);
    assert_int_equal(m, 4 * MIB);
    for (size_t i = 0; i < m; i++)
        if (z[i])
            fail_msg("byte %zu of the inflated bomb is not 0", i);
    free(z);
    free(b);
}

static void compressed_bodies_give_the_answer_of_plain_ones(void **state)
{
    static const char *const names[] = {"gzip", "deflate", "x-gzip", " GZIP "};
    static const enum coding codings[] = {GZIP, DEFLATE, GZIP, GZIP};
    const char *review = "{\"shop_id\":\"gz\",\"review_id\":\"gz-1\",\"rating\":4,\"text\":"
                         "\"The noodles were fresh and the staff very kind, we will be back.\"}";
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Say something about rice"
                       "\"}],\"max_tokens\":12,\"temperature\":0}";
    const char *tok = "{\"content\":\"Compressed bodies must tokenize like plain ones.\"}";
    cJSON *plain_rv, *plain_chat, *plain_tok, *plain, *j;
    int st;
    (void)state;
    plain_rv = post_coded("/v1/reviews/reply", review, PLAIN, NULL, &st);
    assert_int_equal(st, 200);
    plain_chat = post_coded("/v1/chat/completions", chat, PLAIN, NULL, &st);
    assert_int_equal(st, 200);
    plain_tok = post_coded("/tokenize", tok, PLAIN, NULL, &st);
    assert_int_equal(st, 200);
    for (size_t i = 0; i < AR_ARRAY_LEN(names); i++) {
        /* the same review id: a different text would be a 409 conflict, the same one returns
         * the stored reply */
        j = post_coded("/v1/reviews/reply", review, codings[i], names[i], &st);
        if (st != 200)
            fail_msg("review, %s: status %d", names[i], st);
        expect_same(plain_rv, j, "reply", names[i]);
        expect_same(plain_rv, j, "needs_human", names[i]);
        cJSON_Delete(j);
        j = post_coded("/v1/chat/completions", chat, codings[i], names[i], &st);
        if (st != 200)
            fail_msg("chat, %s: status %d", names[i], st);
        expect_same(plain_chat, j, "choices.0.message.content", names[i]);
        expect_same(plain_chat, j, "usage.prompt_tokens", names[i]);
        cJSON_Delete(j);
        j = post_coded("/tokenize", tok, codings[i], names[i], &st);
        assert_int_equal(st, 200);
        expect_same(plain_tok, j, "tokens", names[i]);
        cJSON_Delete(j);
    }
    /* a body that inflates to far more than it is (inflated in many steps, the last ones with
     * all input taken and output still pending) */
    {
        size_t big = 512 * 1024, k = 0;
        char *text = malloc(big + 64);
        k += (size_t)snprintf(text, 64, "{\"content\":\"");
        while (k < big)
            k += (size_t)snprintf(text + k, big + 64 - k, "the soup was hot and good. ");
        snprintf(text + k, big + 64 - k, "\"}");
        plain = post_coded("/tokenize", text, PLAIN, NULL, &st);
        assert_int_equal(st, 200);
        for (int c = GZIP; c <= DEFLATE; c++) {
            j = post_coded("/tokenize", text, (enum coding)c, c == GZIP ? "gzip" : "deflate", &st);
            if (st != 200)
                fail_msg("512 KB of text, %s: status %d", c == GZIP ? "gzip" : "deflate", st);
            expect_same(plain, j, "tokens", "512 KB of text");
            cJSON_Delete(j);
        }
        cJSON_Delete(plain);
        free(text);
    }
    /* identity is no coding; a body in two gzip members (RFC 1952 allows it) is their join */
    j = post_coded("/tokenize", tok, PLAIN, "identity", &st);
    assert_int_equal(st, 200);
    expect_same(plain_tok, j, "tokens", "identity");
    cJSON_Delete(j);
    {
        size_t half = strlen(tok) / 2, n1, n2;
        unsigned char *a = compress_with(tok, half, 16 + MAX_WBITS, &n1);
        unsigned char *b = compress_with(tok + half, strlen(tok) - half, 16 + MAX_WBITS, &n2);
        unsigned char *both = malloc(n1 + n2);
        struct resp r;
        memcpy(both, a, n1);
        memcpy(both + n1, b, n2);
        http(g.srv.port, "POST", "/tokenize",
             "Content-Type: application/json\r\nContent-Encoding: gzip\r\n", both, n1 + n2, &r);
        assert_int_equal(r.status, 200);
        j = cJSON_Parse(r.body);
        expect_same(plain_tok, j, "tokens", "two gzip members");
        cJSON_Delete(j);
        resp_free(&r);
        free(a);
        free(b);
        free(both);
    }
    cJSON_Delete(plain_rv);
    cJSON_Delete(plain_chat);
    cJSON_Delete(plain_tok);
}

/* Sends head, then body as 64 KiB chunks while the server has not answered; the raw answer
 * (caller frees), *secs from the first body byte to the answer's end, *sent body bytes. */
static char *send_chunked(const char *head, const unsigned char *body, size_t len, double *secs,
                          size_t *sent, size_t *n)
{
    int fd = connect_port(g.srv.port);
    double t0;
    char *raw;
    assert_true(send_all(fd, head, strlen(head)));
    t0 = now_s();
    *sent = 0;
    while (*sent < len) {
        char line[32];
        struct pollfd p = {fd, POLLIN, 0};
        size_t k = AR_MIN(len - *sent, (size_t)65536);
        int hl = snprintf(line, sizeof(line), "%zx\r\n", k);
        if (poll(&p, 1, 0) > 0 || !send_all(fd, line, (size_t)hl) ||
            !send_all(fd, body + *sent, k) || !send_all(fd, "\r\n", 2))
            break;
        *sent += k;
    }
    if (*sent == len)
        (void)!send_all(fd, "0\r\n\r\n", 5);
    raw = read_all(fd, n);
    *secs = now_s() - t0;
    close(fd);
    return raw;
}

static void zip_bomb_gets_413_quickly_with_bounded_memory(void **state)
{
    size_t len, sent, n;
    double secs;
    long peak0 = server_peak_kib(), grown;
    unsigned char *bomb = zip_bomb(1024, &len); /* 1 GiB of zeros in about 1 MB */
    struct resp r;
    char *raw;
    (void)state;
    /* chunked: the declared length says nothing, the inflated bytes must be counted */
    raw = send_chunked("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       "application/json\r\nContent-Encoding: gzip\r\nTransfer-Encoding: "
                       "chunked\r\n\r\n",
                       bomb, len, &secs, &sent, &n);
    if (n == 0)
        fail_msg("no answer to a 1 GiB zip bomb (%zu of %zu bytes sent)", sent, len);
    parse_response(raw, n, &r);
    if (r.status != 413 || !strstr(r.body, "request_too_large"))
        fail_msg("1 GiB zip bomb, chunked: status %d: %.200s", r.status, r.body);
    if (secs > 1.0)
        fail_msg("1 GiB zip bomb, chunked: answered after %.2f s", secs);
    resp_free(&r);
    free(raw);
    free(bomb);
    /* with a Content-Length under the limit (256 MiB in about 256 KB), on another POST route */
    bomb = zip_bomb(256, &len);
    assert_true(len < MIB);
    {
        double t0 = now_s();
        http(g.srv.port, "POST", "/v1/reviews/reply",
             "Content-Type: application/json\r\nContent-Encoding: gzip\r\n", bomb, len, &r);
        secs = now_s() - t0;
    }
    if (r.status != 413 || !strstr(r.body, "request_too_large"))
        fail_msg("256 MiB zip bomb: status %d: %.200s", r.status, r.body);
    if (secs > 1.0)
        fail_msg("256 MiB zip bomb: answered after %.2f s", secs);
    resp_free(&r);
    free(bomb);
    /* the server never held more than about its 1 MiB limit of inflated bytes */
    grown = server_peak_kib() - peak0;
    if (grown > 64 * 1024)
        fail_msg("the server's peak memory grew by %ld KiB", grown);
    http(g.srv.port, "GET", "/health", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

static void corrupt_and_unknown_encodings_are_refused(void **state)
{
    const char *tok = "{\"content\":\"a body that will be damaged on the way\"}";
    const char *path = "/tokenize";
    size_t n;
    unsigned char *gz = compress_with(tok, strlen(tok), 16 + MAX_WBITS, &n);
    unsigned char *withjunk = malloc(n + 4);
    static const unsigned char junk[] = "\x1f\x8b\x08\x00 this is no deflate data at all";
    struct resp r;
    (void)state;
    expect_error(path, "Content-Encoding: gzip\r\n", junk, sizeof(junk) - 1, 400,
                 "invalid_content_encoding", "gzip header then junk");
    expect_error(path, "Content-Encoding: gzip\r\n", tok, strlen(tok), 400,
                 "invalid_content_encoding", "plain JSON said to be gzip");
    expect_error(path, "Content-Encoding: gzip\r\n", gz, n - 6, 400, "invalid_content_encoding",
                 "gzip cut short");
    expect_error(path, "Content-Encoding: gzip\r\n", "", 0, 400, "invalid_content_encoding",
                 "an empty gzip body");
    expect_error(path, "Content-Encoding: deflate\r\n", gz, n, 400, "invalid_content_encoding",
                 "gzip said to be deflate");
    memcpy(withjunk, gz, n);
    memcpy(withjunk + n, "junk", 4);
    expect_error(path, "Content-Encoding: gzip\r\n", withjunk, n + 4, 400,
                 "invalid_content_encoding", "gzip then trailing junk");
    gz[n / 2] ^= 0x55; /* a damaged byte inside: the CRC or the data itself tells */
    expect_error(path, "Content-Encoding: gzip\r\n", gz, n, 400, "invalid_content_encoding",
                 "a damaged gzip body");
    expect_error(path, "Content-Encoding: br\r\n", tok, strlen(tok), 415,
                 "unsupported_content_encoding", "br");
    expect_error(path, "Content-Encoding: gzip, gzip\r\n", tok, strlen(tok), 415,
                 "unsupported_content_encoding", "gzip twice");
    expect_error(path, "Content-Encoding: gzip\r\nContent-Encoding: deflate\r\n", tok, strlen(tok),
                 415, "unsupported_content_encoding", "two Content-Encoding headers");
    expect_error("/v1/reviews/reply", "Content-Encoding: compress\r\n", tok, strlen(tok), 415,
                 "unsupported_content_encoding", "compress on /v1/reviews/reply");
    free(gz);
    free(withjunk);
    http(g.srv.port, "GET", "/health", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

/* GET or POST with an Accept-Encoding line (NULL: none); the response. */
static void fetch(const char *method, const char *path, const char *body, const char *accept,
                  struct resp *r)
{
    char hdr[256];
    snprintf(hdr, sizeof(hdr), "Content-Type: application/json\r\n%s%s%s",
             accept ? "Accept-Encoding: " : "", accept ? accept : "", accept ? "\r\n" : "");
    http(g.srv.port, method, path, hdr, body, body ? strlen(body) : 0, r);
    assert_int_equal(r->status, 200);
}

static void large_replies_are_gzipped_for_clients_that_accept_it(void **state)
{
    static const char *const yes[] = {"gzip", "deflate, gzip;q=0.5", "*", "br, GZIP",
                                      "identity;q=1, x-gzip"};
    static const char *const no[] = {NULL, "identity", "gzip;q=0", "gzip; q=0, *", "br", "*;q=0"};
    char body[16384], h[128];
    struct resp plain, r;
    int n = snprintf(body, sizeof(body), "{\"content\":\"");
    (void)state;
    /* a long text: its token list is a reply of several KB */
    for (int i = 0; n < (int)sizeof(body) - 400; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "review %d was lovely; ", i);
    snprintf(body + n, sizeof(body) - (size_t)n, "\"}");
    fetch("POST", "/tokenize", body, NULL, &plain);
    assert_true(plain.body_len > 8192);
    assert_null(resp_header(&plain, "Content-Encoding", h, sizeof(h)));
    assert_non_null(resp_header(&plain, "Vary", h, sizeof(h)));
    assert_string_equal(h, "Accept-Encoding");
    for (size_t i = 0; i < AR_ARRAY_LEN(yes); i++) {
        size_t m;
        char *z;
        fetch("POST", "/tokenize", body, yes[i], &r);
        if (!resp_header(&r, "Content-Encoding", h, sizeof(h)) || strcmp(h, "gzip"))
            fail_msg("Accept-Encoding: %s: not gzipped", yes[i]);
        assert_non_null(resp_header(&r, "Vary", h, sizeof(h)));
        assert_string_equal(h, "Accept-Encoding");
        assert_true(r.body_len < plain.body_len);
        z = gunzip(r.body, r.body_len, &m);
        if (!z)
            fail_msg("Accept-Encoding: %s: the reply is not one gzip member", yes[i]);
        assert_int_equal(m, plain.body_len);
        assert_memory_equal(z, plain.body, m);
        free(z);
        resp_free(&r);
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(no); i++) {
        fetch("POST", "/tokenize", body, no[i], &r);
        if (resp_header(&r, "Content-Encoding", h, sizeof(h)))
            fail_msg("Accept-Encoding: %s: Content-Encoding %s", no[i] ? no[i] : "(none)", h);
        assert_int_equal(r.body_len, plain.body_len);
        assert_memory_equal(r.body, plain.body, r.body_len);
        resp_free(&r);
    }
    resp_free(&plain);
    /* a text reply too (the metrics page is several KB); a small reply stays as it is */
    fetch("GET", "/metrics", NULL, "gzip", &r);
    assert_non_null(resp_header(&r, "Content-Encoding", h, sizeof(h)));
    {
        size_t m;
        char *z = gunzip(r.body, r.body_len, &m);
        assert_non_null(z);
        assert_non_null(strstr(z, "autoreply_http_request_duration_seconds"));
        free(z);
    }
    resp_free(&r);
    fetch("GET", "/health", NULL, "gzip", &r);
    assert_null(resp_header(&r, "Content-Encoding", h, sizeof(h)));
    {
        cJSON *j = cJSON_Parse(r.body);
        assert_non_null(j);
        cJSON_Delete(j);
    }
    resp_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(zip_bomb_construction_is_valid_gzip),
        cmocka_unit_test(compressed_bodies_give_the_answer_of_plain_ones),
        cmocka_unit_test(zip_bomb_gets_413_quickly_with_bounded_memory),
        cmocka_unit_test(corrupt_and_unknown_encodings_are_refused),
        cmocka_unit_test(large_replies_are_gzipped_for_clients_that_accept_it),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
