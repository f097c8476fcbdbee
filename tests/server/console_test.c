/* console_test.c - the console's server side over real HTTP, in process (no model needed):
 * every file of web/console/ served at /console/<name> byte for byte as it is on disk (the
 * file itself is the truth, read here), with its Content-Type, an ETag that answers 304, and
 * gzip that inflates back to the file; GET /v1/stats computed from the metrics registry
 * against figures fed into it here (percentiles inside the buckets that hold the true ones,
 * the console's own requests left out, rates over a window); and who may ask: without API keys
 * loopback clients only (a non-loopback address of this machine gets 403), with keys the page
 * is open and the API needs one. */
#include "harness/harness.h"

#include <dirent.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zlib.h>

#include "harness/http_client.h"
#include "metrics/metrics.h"
#include "server/server.h"
#include "server/server_internal.h"

#define WEB "web/console"

static struct server *start(const char *host, const char *key_file, struct metrics_registry *reg)
{
    struct server_params sp = server_default_params();
    struct server *s = NULL;
    struct ar_err err = {0};
    sp.host = host;
    sp.port = 0;
    sp.api_key_file = key_file;
    sp.metrics = reg;
    if (server_create(&sp, &s, &err) != AR_OK || server_start(s, &err) != AR_OK)
        fail_msg("server: %s", err.msg);
    return s;
}

static cJSON *get_json(int port, const char *path, const char *extra, int *status)
{
    struct resp r;
    cJSON *j;
    http(port, "GET", path, extra, NULL, 0, &r);
    *status = r.status;
    j = cJSON_Parse(r.body);
    if (!j)
        fail_msg("GET %s: not JSON (status %d): %.300s", path, r.status, r.body);
    resp_free(&r);
    return j;
}

static double num(const cJSON *o, const char *path)
{
    char buf[128];
    const cJSON *v = o;
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
        v = cJSON_GetObjectItemCaseSensitive(v, tok);
    if (!cJSON_IsNumber(v))
        fail_msg("%s is not a number", path);
    return v->valuedouble;
}

/* ---- the page's files ----------------------------------------------------------------------- */

static const char *type_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot)
        return NULL;
    if (!strcmp(dot, ".html"))
        return "text/html";
    if (!strcmp(dot, ".js"))
        return "text/javascript";
    if (!strcmp(dot, ".css"))
        return "text/css";
    if (!strcmp(dot, ".svg"))
        return "image/svg+xml";
    return NULL;
}

static void check_file(int port, const char *name)
{
    char path[512], url[512], etag[128], ct[128], hdr[256];
    size_t len = 0;
    char *want;
    struct resp r;
    snprintf(path, sizeof(path), "%s/%s", WEB, name);
    snprintf(url, sizeof(url), "/console/%s", name);
    want = th_read_file(path, &len);
    assert_non_null(want);
    http(port, "GET", url, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, len);
    assert_memory_equal(r.body, want, len);
    assert_non_null(resp_header(&r, "Content-Type", ct, sizeof(ct)));
    assert_non_null(type_of(name));
    if (strncmp(ct, type_of(name), strlen(type_of(name))))
        fail_msg("%s: Content-Type %s, want %s", name, ct, type_of(name));
    assert_non_null(resp_header(&r, "ETag", etag, sizeof(etag)));
    assert_non_null(resp_header(&r, "Cache-Control", ct, sizeof(ct)));
    resp_free(&r);
    /* the same ETag: 304 without a body; another: the file again */
    snprintf(hdr, sizeof(hdr), "If-None-Match: %s\r\n", etag);
    http(port, "GET", url, hdr, NULL, 0, &r);
    assert_int_equal(r.status, 304);
    assert_int_equal(r.body_len, 0);
    resp_free(&r);
    http(port, "GET", url, "If-None-Match: \"0-0\"\r\n", NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, len);
    resp_free(&r);
    free(want);
}

static void test_files_served_as_on_disk(void **state)
{
    struct server *s = start("127.0.0.1", NULL, NULL);
    int port = server_port(s), n = 0;
    DIR *d = opendir(WEB);
    struct dirent *e;
    struct resp r, idx;
    (void)state;
    assert_non_null(d);
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        check_file(port, e->d_name);
        n++;
    }
    closedir(d);
    assert_true(n >= 4); /* index.html, console.js, i18n.js, console.css */
    /* /console and /console/ are index.html */
    http(port, "GET", "/console", NULL, NULL, 0, &r);
    http(port, "GET", "/console/index.html", NULL, NULL, 0, &idx);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, idx.body_len);
    assert_memory_equal(r.body, idx.body, r.body_len);
    resp_free(&r);
    http(port, "GET", "/console/", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, idx.body_len);
    resp_free(&r);
    resp_free(&idx);
    /* nothing else: no other file, no way out of the folder */
    http(port, "GET", "/console/nope.js", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    http(port, "GET", "/console/x/../../Makefile", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    http(port, "POST", "/console", NULL, "", 0, &r);
    assert_int_equal(r.status, 405);
    resp_free(&r);
    server_destroy(s);
}

/* console.js is large enough to be gzipped: for a client that accepts it, zlib's own inflater
 * must give the file back; for one that does not, the plain bytes. */
static void test_gzip_when_accepted(void **state)
{
    struct server *s = start("127.0.0.1", NULL, NULL);
    int port = server_port(s);
    size_t len = 0;
    char *want = th_read_file(WEB "/console.js", &len);
    char ce[64];
    struct resp r;
    z_stream zs = {0};
    unsigned char *out;
    (void)state;
    assert_non_null(want);
    assert_true(len > 8192);
    http(port, "GET", "/console/console.js", "Accept-Encoding: gzip\r\n", NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(resp_header(&r, "Content-Encoding", ce, sizeof(ce)));
    assert_string_equal(ce, "gzip");
    assert_true(r.body_len < len);
    out = malloc(len + 1);
    assert_int_equal(inflateInit2(&zs, 16 + MAX_WBITS), Z_OK);
    zs.next_in = (unsigned char *)r.body;
    zs.avail_in = (uInt)r.body_len;
    zs.next_out = out;
    zs.avail_out = (uInt)len + 1;
    assert_int_equal(inflate(&zs, Z_FINISH), Z_STREAM_END);
    assert_int_equal(zs.total_out, len);
    assert_memory_equal(out, want, len);
    inflateEnd(&zs);
    free(out);
    resp_free(&r);
    http(port, "GET", "/console/console.js", "Accept-Encoding: identity\r\n", NULL, 0, &r);
    assert_null(resp_header(&r, "Content-Encoding", ce, sizeof(ce)));
    assert_int_equal(r.body_len, len);
    resp_free(&r);
    free(want);
    server_destroy(s);
}

/* ---- GET /v1/stats ----------------------------------------------------------------------------
 */

static struct metrics_child *http_child(struct metrics_registry *reg, const char *method,
                                        const char *endpoint)
{
    static const char *const labels[] = {"method", "endpoint", "status", NULL};
    struct metrics_family *f;
    assert_int_equal(
        metrics_histogram(reg, "autoreply_http_request_duration_seconds", "x", labels, NULL, 0, &f),
        AR_OK);
    return metrics_child(f, (const char *const[]){method, endpoint, "200"});
}

static void test_stats_from_registry(void **state)
{
    static const char *const hit_labels[] = {"class", "level", NULL};
    static const char *const miss_labels[] = {"class", NULL};
    static const char *const cached_labels[] = {"cached", NULL};
    struct metrics_registry *reg;
    struct metrics_family *f;
    struct metrics_child *api, *own;
    struct server *s;
    cJSON *j;
    int st, port;
    (void)state;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    s = start("127.0.0.1", NULL, reg);
    port = server_port(s);
    /* 100 API requests whose true median is 2 ms and true 99th percentile 4 s; the console's
     * own polling, 1000 of 50 s, must not count */
    api = http_child(reg, "POST", "/v1/reviews/reply");
    own = http_child(reg, "GET", "/v1/stats");
    for (int i = 0; i < 98; i++)
        metrics_observe(api, 0.002);
    metrics_observe(api, 4.0);
    metrics_observe(api, 4.0);
    for (int i = 0; i < 1000; i++)
        metrics_observe(own, 50.0);
    /* 3 cache hits (two levels, two classes) and 1 miss */
    assert_int_equal(metrics_counter(reg, "autoreply_reply_cache_hits_total", "x", hit_labels, &f),
                     AR_OK);
    metrics_inc(metrics_child(f, (const char *const[]){"interactive", "l1"}), 2);
    metrics_inc(metrics_child(f, (const char *const[]){"bulk", "l2"}), 1);
    assert_int_equal(
        metrics_counter(reg, "autoreply_reply_cache_misses_total", "x", miss_labels, &f), AR_OK);
    metrics_inc(metrics_child(f, (const char *const[]){"interactive"}), 1);
    /* generated replies took 2 s and 4 s (mean 3 s); cached ones 1 ms, which must not count */
    assert_int_equal(
        metrics_histogram(reg, "autoreply_reply_latency_seconds", "x", cached_labels, NULL, 0, &f),
        AR_OK);
    metrics_observe(metrics_child(f, (const char *const[]){"false"}), 2.0);
    metrics_observe(metrics_child(f, (const char *const[]){"false"}), 4.0);
    metrics_observe(metrics_child(f, (const char *const[]){"true"}), 0.001);
    assert_int_equal(metrics_counter(reg, "autoreply_reply_model_calls_total", "x", NULL, &f),
                     AR_OK);
    metrics_inc(metrics_child(f, NULL), 2);

    j = get_json(port, "/v1/stats", NULL, &st);
    assert_int_equal(st, 200);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "stats");
    assert_true(num(j, "totals.requests") == 100);
    /* an estimate inside the bucket that holds the truth: (1, 2.5] ms and (3, 5] s */
    assert_true(num(j, "latency_p50_ms") > 1.0 && num(j, "latency_p50_ms") <= 2.5);
    assert_true(num(j, "latency_p99_ms") > 3000 && num(j, "latency_p99_ms") <= 5000);
    assert_true(fabs(num(j, "cache_hit_ratio") - 0.75) < 1e-9);
    assert_true(num(j, "totals.cache_hits") == 3 && num(j, "totals.cache_misses") == 1);
    assert_true(fabs(num(j, "cache_savings.model_seconds") - 9.0) < 1e-9); /* 3 hits x 3 s */
    assert_true(num(j, "requests_per_s") > 0);
    assert_true(num(j, "queue_depth") == 0); /* no engine */
    cJSON_Delete(j);

    /* a window: only what happened after the sample the first call left */
    th_sleep_s(1.2);
    for (int i = 0; i < 10; i++)
        metrics_observe(api, 0.2);
    j = get_json(port, "/v1/stats?window=1", NULL, &st);
    assert_int_equal(st, 200);
    assert_true(num(j, "window_s") >= 1.0);
    assert_true(fabs(num(j, "requests_per_s") * num(j, "window_s") - 10) < 1e-6);
    assert_true(num(j, "latency_p50_ms") > 100 && num(j, "latency_p50_ms") <= 250);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "cache_hit_ratio"))); /* no lookups */
    assert_true(num(j, "totals.requests") == 110);
    cJSON_Delete(j);

    /* the console's own requests (its files, this route) still do not count */
    {
        struct resp r;
        http(port, "GET", "/console", NULL, NULL, 0, &r);
        resp_free(&r);
    }
    j = get_json(port, "/v1/stats", NULL, &st);
    assert_true(num(j, "totals.requests") == 110);
    cJSON_Delete(j);

    for (int i = 0; i < 4; i++) {
        static const char *const bad[] = {"0", "abc", "1000", "5x"};
        char path[64];
        snprintf(path, sizeof(path), "/v1/stats?window=%s", bad[i]);
        j = get_json(port, path, NULL, &st);
        assert_int_equal(st, 400);
        assert_non_null(cJSON_GetObjectItem(j, "error"));
        cJSON_Delete(j);
    }
    server_destroy(s);
    metrics_registry_destroy(reg);
}

/* ---- who may ask ------------------------------------------------------------------------------
 */

static void test_loopback_addresses(void **state)
{
    (void)state;
    assert_true(server_address_is_loopback("127.0.0.1"));
    assert_true(server_address_is_loopback("127.255.0.9"));
    assert_true(server_address_is_loopback("::1"));
    assert_true(server_address_is_loopback("::ffff:127.0.0.1"));
    assert_false(server_address_is_loopback("128.0.0.1"));
    assert_false(server_address_is_loopback("10.0.0.1"));
    assert_false(server_address_is_loopback("::ffff:10.0.0.1"));
    assert_false(server_address_is_loopback("fd00::1"));
    assert_false(server_address_is_loopback("::"));
    assert_false(server_address_is_loopback("unknown"));
    assert_false(server_address_is_loopback(""));
    assert_false(server_address_is_loopback(NULL));
}

/* An IPv4 address of this machine that is not a loopback one; false when it has none. */
static bool outside_address(struct in_addr *out)
{
    struct ifaddrs *ifs, *i;
    bool found = false;
    if (getifaddrs(&ifs) != 0)
        return false;
    for (i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        *out = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
        found = (ntohl(out->s_addr) >> 24) != 127;
    }
    freeifaddrs(ifs);
    return found;
}

/* GET path from the address a (the connection's source is then that address too); the status. */
static int status_from(struct in_addr a, int port, const char *path, char *body, size_t size)
{
    struct sockaddr_in sa = {0};
    struct timeval tv = {10, 0};
    char req[256];
    size_t n;
    char *raw;
    struct resp r;
    int fd = socket(AF_INET, SOCK_STREAM, 0), status;
    assert_true(fd >= 0);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr = a;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        fail_msg("cannot connect to port %d", port);
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    assert_true(send_all(fd, req, strlen(req)));
    raw = read_all(fd, &n);
    close(fd);
    parse_response(raw, n, &r);
    free(raw);
    status = r.status;
    if (body)
        snprintf(body, size, "%s", r.body ? r.body : "");
    resp_free(&r);
    return status;
}

static void test_no_keys_loopback_only(void **state)
{
    struct in_addr out, lo = {htonl(INADDR_LOOPBACK)};
    struct server *s;
    char body[1024];
    int port;
    (void)state;
    if (!outside_address(&out)) {
        /* the decision itself is tested above (test_loopback_addresses) */
        print_message("no non-loopback IPv4 address on this machine: only loopback checked\n");
    }
    s = start("0.0.0.0", NULL, NULL);
    port = server_port(s);
    assert_int_equal(status_from(lo, port, "/v1/stats", NULL, 0), 200);
    assert_int_equal(status_from(lo, port, "/console", NULL, 0), 200);
    if (outside_address(&out)) {
        cJSON *j;
        assert_int_equal(status_from(out, port, "/v1/stats", body, sizeof(body)), 403);
        j = cJSON_Parse(body);
        assert_non_null(j);
        assert_string_equal(
            cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring,
            "loopback_only");
        cJSON_Delete(j);
        assert_int_equal(status_from(out, port, "/console", NULL, 0), 403);
        assert_int_equal(status_from(out, port, "/console/console.js", NULL, 0), 403);
        assert_int_equal(status_from(out, port, "/v1/models", NULL, 0), 403);
        /* probes stay open: a load balancer's health check, Prometheus without metrics_auth */
        assert_int_equal(status_from(out, port, "/health", NULL, 0), 503); /* loading */
        assert_int_equal(status_from(out, port, "/metrics", NULL, 0), 200);
    }
    server_destroy(s);
}

static void test_keys_page_open_api_closed(void **state)
{
    char dir[] = "/tmp/ar_console_XXXXXX", keys[128];
    struct in_addr out, lo = {htonl(INADDR_LOOPBACK)};
    struct server *s;
    struct resp r;
    FILE *f;
    int port;
    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(keys, sizeof(keys), "%s/keys", dir);
    f = fopen(keys, "w");
    assert_non_null(f);
    fputs("sk-console-test\n", f);
    fclose(f);
    s = start("0.0.0.0", keys, NULL);
    port = server_port(s);
    assert_int_equal(status_from(lo, port, "/console", NULL, 0), 200);
    assert_int_equal(status_from(lo, port, "/v1/stats", NULL, 0), 401);
    http(port, "GET", "/v1/stats", "Authorization: Bearer sk-console-test\r\n", NULL, 0, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    if (outside_address(&out)) { /* with keys the address does not matter */
        assert_int_equal(status_from(out, port, "/console", NULL, 0), 200);
        assert_int_equal(status_from(out, port, "/v1/stats", NULL, 0), 401);
    }
    server_destroy(s);
    unlink(keys);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_served_as_on_disk),
        cmocka_unit_test(test_gzip_when_accepted),
        cmocka_unit_test(test_stats_from_registry),
        cmocka_unit_test(test_loopback_addresses),
        cmocka_unit_test(test_no_keys_loopback_only),
        cmocka_unit_test(test_keys_page_open_api_closed),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
