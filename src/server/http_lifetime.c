/* http_lifetime.c - a server's life: default parameters and accessors, server_create (the
 * metric families, keys, rate limiter, built-in routes), server_start (libmicrohttpd's daemon,
 * the instance name, the watchdog thread), the watchdog (slow senders, stalled bodies, vanished
 * clients, idle connections near the limit), graceful server_stop and server_destroy. */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/deadline.h"
#include "http_internal.h"

#define WATCHDOG_PERIOD_S 0.1
/* Near the connection limit (fewer than max_conns / CONN_RESERVE_DIV free slots) idle
 * connections older than IDLE_EVICT_MIN_S are closed, oldest first, so that a new client gets in
 * instead of waiting for idle ones to time out. */
#define CONN_RESERVE_DIV 8
#define IDLE_EVICT_MIN_S 0.2

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
    return server_limiter_backend_healthy(s->limiter);
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
double server_retry_after_s(const struct server *s)
{
    return s->p.retry_after_s;
}
struct server_http_metrics *server_http_metrics_of(struct server *s)
{
    return &s->m;
}
bool server_stopping(const struct server *s)
{
    return atomic_load(&s->stopping);
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
        struct timespec ts = ar_deadline_in(CLOCK_REALTIME, WATCHDOG_PERIOD_S);
        double now;
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
                    server_raw_answer(s, cs->fd, 408, "Request Timeout", "body_timeout",
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
            server_req_abort(gone[i]);
            server_req_release(gone[i]);
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
    if (p->api_key_file && (st = server_keys_load(p->api_key_file, &s->keys, err)) != AR_OK)
        goto fail;
    if ((st = server_limiter_create(p->rate_rps, p->rate_burst, p->rate_tpm, &s->limiter)) != AR_OK)
        goto fail;
    if (p->metrics) {
        s->metrics = p->metrics;
    } else {
        if ((st = metrics_registry_create(&s->metrics)) != AR_OK)
            goto fail;
        s->own_metrics = true;
    }
    if (p->rate_redis_url &&
        (st = server_limiter_use_redis(s->limiter, p->rate_redis_url, s->metrics, err)) != AR_OK)
        goto fail;
    if ((st = register_metrics(s)) != AR_OK || (st = server_openai_register(s)) != AR_OK ||
        (st = server_console_register(s)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot register the server's metrics and routes");
        goto fail;
    }
    *out = s;
    return AR_OK;
fail:
    server_destroy(s);
    return st;
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
        flags, (uint16_t)s->p.port, NULL, NULL, server_on_request, s, MHD_OPTION_SOCK_ADDR,
        ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ceil(s->p.timeout_s),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->p.max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)(s->p.max_conns_per_ip < 0 ? AR_MAX(1, s->p.max_conns / 2)
                                             : s->p.max_conns_per_ip),
        MHD_OPTION_NOTIFY_COMPLETED, server_on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        server_on_connection, s, MHD_OPTION_URI_LOG_CALLBACK, server_on_uri, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)(s->p.http_threads > 1 ? s->p.http_threads : 0), MHD_OPTION_END);
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
        ts = ar_deadline_in(CLOCK_REALTIME, AR_MIN(left, 0.05));
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
            server_req_abort(batch[i]);
            server_req_release(batch[i]);
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
        server_req_wake(r);
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
    server_keys_destroy(s->keys);
    server_limiter_destroy(s->limiter);
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
