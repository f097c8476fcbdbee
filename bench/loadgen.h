/* loadgen.h - what the serving benchmarks (bench/serve.c, bench/replay.c) share: a monotonic
 * clock, growable buffers, an incremental HTTP/1.1 response parser (Content-Length, chunked,
 * until-close bodies), blocking loopback requests, starting `autoreply serve` as a child on a
 * free port and stopping it, reading Prometheus samples, percentiles. Header-only: every
 * function is static inline so that a program uses what it needs without warnings.
 * Loopback only: every connection goes to 127.0.0.1. */
#ifndef AR_BENCH_LOADGEN_H
#define AR_BENCH_LOADGEN_H

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h" /* ar_splitmix64 */

/* ---- clock and small helpers ------------------------------------------------------------- */

static inline double lg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void lg_sleep(double s)
{
    struct timespec ts;
    if (s <= 0)
        return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* argv strings are not modified by execv; this drops const without a cast warning */
static inline char *lg_unconst(const char *s)
{
    char *p;
    memcpy(&p, &s, sizeof(p));
    return p;
}

static inline void *lg_xalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static inline void *lg_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return q;
}

/* uniform in [0, 1): deterministic workloads from a seed (ar_splitmix64 gives the raw bits) */
static inline double lg_rand01(uint64_t *s)
{
    return (double)(ar_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- growable byte buffer ------------------------------------------------------------------ */

struct lg_buf {
    char *p; /* owned, NUL-terminated when len < cap */
    size_t len, cap;
};

static inline void lg_buf_reserve(struct lg_buf *b, size_t extra)
{
    if (b->len + extra + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + extra + 1)
            cap *= 2;
        b->p = lg_xrealloc(b->p, cap);
        b->cap = cap;
    }
}

static inline void lg_buf_add(struct lg_buf *b, const void *data, size_t len)
{
    lg_buf_reserve(b, len);
    memcpy(b->p + b->len, data, len);
    b->len += len;
    b->p[b->len] = 0;
}

static inline void lg_buf_printf(struct lg_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void lg_buf_printf(struct lg_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    lg_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static inline void lg_buf_clear(struct lg_buf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = 0;
}

static inline void lg_buf_free(struct lg_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- HTTP/1.1 response parser ------------------------------------------------------------
 * Bytes go into raw (lg_http_feed); lg_http_parse consumes what it can and appends the
 * decoded body to body. One response at a time (no pipelining). */

enum lg_http_state {
    LG_HTTP_HEAD = 0,
    LG_HTTP_BODY,     /* Content-Length bytes left */
    LG_HTTP_BODY_EOF, /* body until the connection closes */
    LG_HTTP_CHUNK_SIZE,
    LG_HTTP_CHUNK_DATA,
    LG_HTTP_CHUNK_CRLF,
    LG_HTTP_TRAILER,
    LG_HTTP_DONE
};

struct lg_http {
    struct lg_buf raw; /* received, not yet consumed from pos */
    size_t pos;
    enum lg_http_state state;
    int status;
    bool keep_alive;    /* the server did not say Connection: close (HTTP/1.1) */
    int64_t left;       /* body or chunk bytes still to come */
    struct lg_buf body; /* decoded */
};

static inline void lg_http_reset(struct lg_http *h)
{
    lg_buf_clear(&h->raw);
    lg_buf_clear(&h->body);
    h->pos = 0;
    h->state = LG_HTTP_HEAD;
    h->status = 0;
    h->keep_alive = true;
    h->left = 0;
}

static inline void lg_http_free(struct lg_http *h)
{
    lg_buf_free(&h->raw);
    lg_buf_free(&h->body);
}

static inline void lg_http_feed(struct lg_http *h, const char *data, size_t len)
{
    if (h->pos > 0 && h->pos == h->raw.len) {
        h->pos = 0;
        lg_buf_clear(&h->raw);
    }
    lg_buf_add(&h->raw, data, len);
}

/* Finds "\r\n" at or after from in raw; index or -1. */
static inline long lg_http_find_crlf(const struct lg_http *h, size_t from)
{
    for (size_t i = from; i + 1 < h->raw.len; i++)
        if (h->raw.p[i] == '\r' && h->raw.p[i + 1] == '\n')
            return (long)i;
    return -1;
}

static inline bool lg_hdr_is(const char *line, size_t len, const char *name, const char **val)
{
    size_t n = strlen(name);
    if (len <= n || strncasecmp(line, name, n) != 0 || line[n] != ':')
        return false;
    *val = line + n + 1;
    while (*val < line + len && (**val == ' ' || **val == '\t'))
        (*val)++;
    return true;
}

/* 1: a whole response is parsed; 0: more bytes needed; -1: malformed. */
static inline int lg_http_parse(struct lg_http *h)
{
    for (;;) {
        size_t avail = h->raw.len - h->pos;
        switch (h->state) {
        case LG_HTTP_HEAD: {
            const char *p = h->raw.p ? h->raw.p + h->pos : NULL, *end = NULL;
            int64_t clen = -1;
            bool chunked = false;
            for (size_t i = 0; p && i + 3 < avail; i++)
                if (!memcmp(p + i, "\r\n\r\n", 4)) {
                    end = p + i;
                    break;
                }
            if (!end)
                return avail > (64u << 10) ? -1 : 0;
            if (avail < 12 || strncmp(p, "HTTP/1.", 7) != 0)
                return -1;
            h->status = atoi(p + 9);
            if (h->status < 100 || h->status > 599)
                return -1;
            h->keep_alive = p[7] == '1';
            for (const char *line = strstr(p, "\r\n") + 2; line < end;) {
                const char *eol = strstr(line, "\r\n"), *v;
                size_t ll = (size_t)(eol - line);
                if (lg_hdr_is(line, ll, "content-length", &v))
                    clen = strtoll(v, NULL, 10);
                else if (lg_hdr_is(line, ll, "transfer-encoding", &v))
                    chunked = strncasecmp(v, "chunked", 7) == 0;
                else if (lg_hdr_is(line, ll, "connection", &v))
                    h->keep_alive = strncasecmp(v, "close", 5) != 0;
                line = eol + 2;
            }
            h->pos += (size_t)(end - p) + 4;
            if (h->status == 204 || h->status == 304 || (h->status >= 100 && h->status < 200)) {
                h->state = LG_HTTP_DONE;
            } else if (chunked) {
                h->state = LG_HTTP_CHUNK_SIZE;
            } else if (clen >= 0) {
                h->left = clen;
                h->state = LG_HTTP_BODY;
            } else {
                h->keep_alive = false;
                h->state = LG_HTTP_BODY_EOF;
            }
            break;
        }
        case LG_HTTP_BODY:
        case LG_HTTP_CHUNK_DATA: {
            size_t take = (size_t)h->left < avail ? (size_t)h->left : avail;
            lg_buf_add(&h->body, h->raw.p + h->pos, take);
            h->pos += take;
            h->left -= (int64_t)take;
            if (h->left > 0)
                return 0;
            h->state = h->state == LG_HTTP_BODY ? LG_HTTP_DONE : LG_HTTP_CHUNK_CRLF;
            break;
        }
        case LG_HTTP_BODY_EOF:
            lg_buf_add(&h->body, h->raw.p + h->pos, avail);
            h->pos += avail;
            return 0; /* lg_http_eof finishes it */
        case LG_HTTP_CHUNK_SIZE: {
            long e = lg_http_find_crlf(h, h->pos);
            char *q;
            long long n;
            if (e < 0)
                return avail > 256 ? -1 : 0;
            n = strtoll(h->raw.p + h->pos, &q, 16);
            if (q == h->raw.p + h->pos || n < 0)
                return -1;
            h->pos = (size_t)e + 2;
            h->left = n;
            h->state = n ? LG_HTTP_CHUNK_DATA : LG_HTTP_TRAILER;
            break;
        }
        case LG_HTTP_CHUNK_CRLF:
            if (avail < 2)
                return 0;
            if (memcmp(h->raw.p + h->pos, "\r\n", 2))
                return -1;
            h->pos += 2;
            h->state = LG_HTTP_CHUNK_SIZE;
            break;
        case LG_HTTP_TRAILER: {
            long e = lg_http_find_crlf(h, h->pos);
            if (e < 0)
                return avail > (16u << 10) ? -1 : 0;
            bool empty = (size_t)e == h->pos;
            h->pos = (size_t)e + 2;
            if (empty)
                h->state = LG_HTTP_DONE;
            break;
        }
        case LG_HTTP_DONE:
            return 1;
        }
    }
}

/* The peer closed the connection: 1 when that completes the response, else -1. */
static inline int lg_http_eof(struct lg_http *h)
{
    if (h->state == LG_HTTP_BODY_EOF) {
        h->state = LG_HTTP_DONE;
        return 1;
    }
    return h->state == LG_HTTP_DONE ? 1 : -1;
}

/* ---- sockets ------------------------------------------------------------------------------ */

/* A port that was free a moment ago on 127.0.0.1 (bound to 0, read back, closed). */
static inline int lg_free_port(void)
{
    struct sockaddr_in a = {0};
    socklen_t al = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    if (fd < 0)
        return 0;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* A TCP connection to 127.0.0.1:port (TCP_NODELAY); nonblocking: connect may be in progress.
 * -1 on failure. */
static inline int lg_connect(int port, bool nonblocking)
{
    struct sockaddr_in a = {0};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (nonblocking)
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 &&
        !(nonblocking && errno == EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline bool lg_send_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* Appends a request head + body to out. */
static inline void lg_request(struct lg_buf *out, const char *method, const char *path,
                              const char *body, size_t body_len, bool close_after)
{
    lg_buf_printf(out,
                  "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: autoreply-bench\r\n"
                  "%s",
                  method, path, close_after ? "Connection: close\r\n" : "");
    if (body)
        lg_buf_printf(out, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      body_len);
    else
        lg_buf_printf(out, "\r\n");
    if (body)
        lg_buf_add(out, body, body_len);
}

/* Reads a response on a blocking socket until it is complete or timeout_s passes.
 * on_data (may be NULL) sees the decoded body after each read. true: h holds the response. */
static inline bool lg_read_response(int fd, struct lg_http *h, double timeout_s,
                                    void (*on_data)(void *user, struct lg_http *h), void *user)
{
    double end = lg_now() + timeout_s;
    char buf[16384];
    for (;;) {
        int r = lg_http_parse(h);
        if (r < 0)
            return false;
        if (r > 0)
            return true;
        double left = end - lg_now();
        if (left <= 0)
            return false;
        struct pollfd pf = {fd, POLLIN, 0};
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return false;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return false;
        if (n == 0)
            return lg_http_eof(h) > 0;
        lg_http_feed(h, buf, (size_t)n);
        if (on_data) {
            r = lg_http_parse(h);
            if (r < 0)
                return false;
            on_data(user, h);
            if (r > 0)
                return true;
        }
    }
}

/* One request on a fresh connection (Connection: close). Returns the status (0 when no
 * answer came); the body goes to body (may be NULL). */
static inline int lg_http_simple(int port, const char *method, const char *path,
                                 const char *req_body, struct lg_buf *body, double timeout_s)
{
    struct lg_buf req = {0};
    struct lg_http h = {0};
    int status = 0, fd = lg_connect(port, false);
    if (fd < 0)
        return 0;
    lg_http_reset(&h);
    lg_request(&req, method, path, req_body, req_body ? strlen(req_body) : 0, true);
    if (lg_send_all(fd, req.p, req.len) && lg_read_response(fd, &h, timeout_s, NULL, NULL)) {
        status = h.status;
        if (body) {
            lg_buf_clear(body);
            lg_buf_add(body, h.body.p ? h.body.p : "", h.body.len);
        }
    }
    close(fd);
    lg_buf_free(&req);
    lg_http_free(&h);
    return status;
}

/* ---- the server as a child process -------------------------------------------------------- */

struct lg_server {
    pid_t pid;
    int port;
    char log_path[2048];
};

static inline void lg_print_cmd(FILE *out, const char *prefix, char *const argv[])
{
    fprintf(out, "%s", prefix);
    for (int i = 0; argv[i]; i++)
        fprintf(out, "%s%s", i ? " " : "", argv[i]);
    fprintf(out, "\n");
}

static inline void lg_print_log_tail(const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long size, from;
    size_t n;
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    from = size > (long)max ? size - (long)max : 0;
    fseek(f, from, SEEK_SET);
    buf = lg_xalloc(max + 1);
    n = fread(buf, 1, max, f);
    buf[n] = 0;
    fprintf(stderr, "---- %s (last %zu bytes) ----\n%s\n----\n", path, n, buf);
    free(buf);
    fclose(f);
}

/* Starts argv (argv[0] a path) with stdout and stderr into log_path, in directory cwd (may be
 * NULL), and waits up to timeout_s for GET /health on port to answer 200. The child gets
 * SIGTERM if this process dies. false (child stopped, log shown) on failure. */
static inline bool lg_server_start(struct lg_server *s, char *const argv[], int port,
                                   const char *cwd, const char *log_path, double timeout_s)
{
    double end = lg_now() + timeout_s;
    memset(s, 0, sizeof(*s));
    s->port = port;
    snprintf(s->log_path, sizeof(s->log_path), "%s", log_path);
    fflush(NULL);
    s->pid = fork();
    if (s->pid < 0) {
        perror("fork");
        return false;
    }
    if (s->pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (cwd && chdir(cwd) != 0)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    while (lg_now() < end) {
        int wst;
        if (waitpid(s->pid, &wst, WNOHANG) == s->pid) {
            fprintf(stderr, "the server exited early (%s %d)\n",
                    WIFEXITED(wst) ? "status" : "signal",
                    WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst));
            lg_print_log_tail(log_path, 4000);
            s->pid = 0;
            return false;
        }
        if (lg_http_simple(port, "GET", "/health", NULL, NULL, 2.0) == 200)
            return true;
        lg_sleep(0.1);
    }
    fprintf(stderr, "the server did not become ready within %.0f s\n", timeout_s);
    lg_print_log_tail(log_path, 4000);
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return false;
}

/* The start of an `autoreply serve` command line on 127.0.0.1: bin serve -m model --host
 * 127.0.0.1 --port port -t threads, written to argv; port_s and threads_s are the caller's
 * (they hold the numbers as text as long as argv is used). Returns the count written. */
static inline int lg_serve_argv(char **argv, const char *bin, const char *model, int port,
                                char port_s[16], int threads, char threads_s[16])
{
    int n = 0;
    snprintf(port_s, 16, "%d", port);
    snprintf(threads_s, 16, "%d", threads);
    argv[n++] = lg_unconst(bin);
    argv[n++] = "serve";
    argv[n++] = "-m";
    argv[n++] = lg_unconst(model);
    argv[n++] = "--host";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--port";
    argv[n++] = port_s;
    argv[n++] = "-t";
    argv[n++] = threads_s;
    return n;
}

/* SIGTERM, up to grace_s for a clean exit, then SIGKILL. */
static inline void lg_server_stop(struct lg_server *s, double grace_s)
{
    double end = lg_now() + grace_s;
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGTERM);
    while (lg_now() < end) {
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            return;
        }
        lg_sleep(0.05);
    }
    fprintf(stderr, "the server did not stop within %.0f s: killed\n", grace_s);
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

/* Runs `argv[0] serve --help` and returns its stdout (caller frees), or NULL. */
static inline char *lg_serve_help(const char *bin)
{
    int pfd[2];
    pid_t pid;
    struct lg_buf out = {0};
    char buf[4096];
    ssize_t n;
    if (pipe(pfd) != 0)
        return NULL;
    fflush(NULL);
    if ((pid = fork()) == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execl(bin, bin, "serve", "--help", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    while ((n = read(pfd[0], buf, sizeof(buf))) > 0 && out.len < (1u << 20))
        lg_buf_add(&out, buf, (size_t)n);
    close(pfd[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    if (!out.p)
        lg_buf_add(&out, "", 0);
    return out.p;
}

/* True when help text names flag as an option (followed by a space, '=', ',' or newline). */
static inline bool lg_has_flag(const char *help, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = help; p && (p = strstr(p, flag)); p += n) {
        char c = p[n];
        bool start_ok = p == help || p[-1] == ' ' || p[-1] == '\n' || p[-1] == '[' ||
                        p[-1] == '|' || p[-1] == ',';
        if (start_ok && (c == ' ' || c == '=' || c == ',' || c == '\n' || c == ']' || c == 0))
            return true;
    }
    return false;
}

/* The first field of /proc/loadavg (other work on the machine skews the figures), or -1. */
static inline double lg_loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* ---- Prometheus text --------------------------------------------------------------------- */

/* Sum of every sample of metric name (any labels). false when there is none. */
static inline bool lg_metric_sum(const char *text, const char *name, double *out)
{
    size_t n = strlen(name);
    bool found = false;
    double sum = 0;
    for (const char *line = text; line && *line;) {
        const char *eol = strchr(line, '\n');
        if (line[0] != '#' && !strncmp(line, name, n) && (line[n] == ' ' || line[n] == '{')) {
            const char *v = line + n;
            if (*v == '{')
                v = strchr(v, '}');
            if (v && (!eol || v < eol)) {
                sum += strtod(v + 1, NULL);
                found = true;
            }
        }
        line = eol ? eol + 1 : NULL;
    }
    *out = sum;
    return found;
}

/* ---- statistics -------------------------------------------------------------------------- */

struct lg_samples {
    double *v;
    size_t n, cap;
};

static inline void lg_samples_add(struct lg_samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = lg_xrealloc(s->v, s->cap * sizeof(double));
    }
    s->v[s->n++] = x;
}

static inline int lg_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile (p in 0..100) of the samples (sorts them); NAN when empty. */
static inline double lg_percentile(struct lg_samples *s, double p)
{
    size_t k;
    if (!s->n)
        return (double)NAN;
    qsort(s->v, s->n, sizeof(double), lg_cmp_double);
    k = (size_t)((p / 100.0) * (double)s->n + 0.999999);
    if (k < 1)
        k = 1;
    if (k > s->n)
        k = s->n;
    return s->v[k - 1];
}

static inline double lg_mean(const struct lg_samples *s)
{
    double sum = 0;
    if (!s->n)
        return (double)NAN;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    return sum / (double)s->n;
}

static inline void lg_samples_free(struct lg_samples *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

/* ---- command line ---------------------------------------------------------------------------- */

/* For the option loops of the bench programs, which hold the index in i, the option in a and
 * the argument after it (or NULL) in v: takes v as the option's value (i moves past it), or
 * returns 2 from main after saying that it is missing. */
#define LG_NEEDV()                                                                                 \
    do {                                                                                           \
        if (!v) {                                                                                  \
            fprintf(stderr, "%s needs a value\n", a);                                              \
            return 2;                                                                              \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)

/* Parses "1,4,16,64" into out (at most max); count or -1. */
static inline int lg_parse_int_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s || v < 1 || v > 100000 || n == max)
            return -1;
        out[n++] = (int)v;
        s = e;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n;
}

#endif
