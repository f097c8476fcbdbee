/* replay.c - review-reply benchmark (open loop). Replays reviews from
 * ../shared/data/reviews-sample.jsonl as POST /v1/reviews/reply at a fixed offered rate:
 * arrivals are scheduled by the clock (Poisson or uniform), never by answers, over many
 * keep-alive connections driven by one epoll loop; latency counts from the scheduled arrival,
 * so a slow server cannot slow the offered load down. The server (`autoreply serve`) runs as a
 * child on a free loopback port with its data in a temporary directory.
 *
 * Scenario A: warm the reply path with a set of reviews, then replay them at 2,000 requests/s:
 *   A1 with the same review ids (idempotent replays answered from the store), A2 with fresh
 *   ids and the same texts (reply-cache hits). Target: cache-hit p99 < 2 ms.
 * Scenario B: the same realistic traffic (the first 2,000 reviews, repeats drawn Zipf-like,
 *   each request a new review id) against a server with reply cache, batching and prefix cache
 *   on, and one with all three off; mean response times and their ratio (target >= 10x).
 *   The setup it stands for: a shop backfilling its recent reviews through the interactive
 *   endpoint, where the same short reviews ("好评", "很快，好吃") come back over and over
 *   (Zipf s=1 over the pool; the sample file itself has almost no exact repeats), starting
 *   from a cold cache (--warm-b N: a cache warmed by N earlier reviews). Measure it at a few
 *   offered rates (--rate-b 16, 50, 100) and report all of them: while the all-off server is
 *   far from saturated, the ratio is about 1 / (1 - hit ratio), which grows with the number
 *   of requests seen (the cache fills), and a rate near the all-off server's capacity inflates
 *   it by queueing alone. */
#include <sys/epoll.h>
#include <sys/timerfd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "loadgen.h"

#define MAX_STATUS 16
#define MAX_SOURCES 8

struct review {
    char *id;        /* owned */
    char *text_json; /* owned: the text as a JSON string literal, quotes included */
    int rating;
};

struct opts {
    const char *bin, *model, *reviews_path, *scenario, *server_args;
    double rate, seconds;     /* plain runs and scenario A */
    double rate_b, seconds_b; /* scenario B */
    int pool, warm, warm_b, conns, threads, port;
    double zipf, drain_s;
    bool poisson, fresh_ids, json;
    uint64_t seed;
};

/* ---- reviews ------------------------------------------------------------------------------ */

static int load_reviews(const char *path, int max, struct review **out)
{
    FILE *f = fopen(path, "rb");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0;
    struct review *rv = lg_xalloc((size_t)max * sizeof(*rv));
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        free(rv);
        return -1;
    }
    while (n < max && (len = getline(&line, &cap, f)) > 0) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len), *id, *text, *rating;
        if (!j)
            continue;
        id = cJSON_GetObjectItemCaseSensitive(j, "id");
        text = cJSON_GetObjectItemCaseSensitive(j, "text");
        rating = cJSON_GetObjectItemCaseSensitive(j, "rating");
        if (cJSON_IsString(id) && cJSON_IsString(text) && cJSON_IsNumber(rating) &&
            text->valuestring[0]) {
            cJSON *s = cJSON_CreateString(text->valuestring);
            rv[n].id = strdup(id->valuestring);
            rv[n].text_json = cJSON_PrintUnformatted(s);
            rv[n].rating = rating->valueint < 1 ? 1 : rating->valueint > 5 ? 5 : rating->valueint;
            cJSON_Delete(s);
            if (rv[n].id && rv[n].text_json)
                n++;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    *out = rv;
    return n;
}

/* ---- one open-loop run -------------------------------------------------------------------- */

struct arrival {
    double t;   /* seconds after the run's start */
    int review; /* index into the review list */
    bool fresh; /* a new review id (serial below) instead of the review's own */
    uint32_t serial;
};

enum conn_state { C_FREE = 0, C_CONNECTING, C_SENDING, C_READING, C_IDLE };

struct conn {
    int fd;
    enum conn_state state;
    struct lg_buf out;
    size_t out_off;
    struct lg_http h;
    int arr; /* arrival in flight, -1 when none */
    double t_sent;
    bool reused;  /* the connection had served a request before this one */
    bool in_idle; /* listed in run.idle (possibly stale: checked when taken) */
    int tries;
};

struct run_stats {
    char name[64];
    double rate, seconds;
    int n_sched, n_ok, n_hit, n_miss, n_unanswered, n_late, max_open, n_retried;
    struct lg_samples hit, miss, hit_svc, miss_svc, all;
    int err_status[MAX_STATUS], err_count[MAX_STATUS];
    char src_name[MAX_SOURCES][16];
    int src_count[MAX_SOURCES];
    double t_first_done, t_last_done, t_start;
};

struct run {
    int port, max_conns, ep, n_open;
    const char *shop, *tag;
    const struct review *reviews;
    const struct arrival *arr;
    int n_arr, n_done;
    double t0;
    struct conn *conns;
    int *idle, n_idle;
    int *pend, pend_head, pend_tail; /* ring of arrival indices (capacity n_arr) */
    struct run_stats *st;
};

static void count_error(struct run_stats *st, int status)
{
    int k;
    for (k = 0; k < MAX_STATUS && st->err_count[k] && st->err_status[k] != status; k++)
        ;
    if (k < MAX_STATUS) {
        st->err_status[k] = status;
        st->err_count[k]++;
    }
}

static void count_source(struct run_stats *st, const char *src)
{
    int k;
    for (k = 0; k < MAX_SOURCES && st->src_count[k] && strcmp(st->src_name[k], src); k++)
        ;
    if (k < MAX_SOURCES) {
        snprintf(st->src_name[k], sizeof(st->src_name[k]), "%s", src);
        st->src_count[k]++;
    }
}

static void conn_watch(struct run *r, struct conn *c, uint32_t events, bool add)
{
    struct epoll_event ev = {.events = events, .data.u32 = (uint32_t)(c - r->conns)};
    epoll_ctl(r->ep, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_close(struct run *r, struct conn *c)
{
    if (c->fd >= 0) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        r->n_open--;
    }
    c->fd = -1;
    c->state = C_FREE;
}

static void record(struct run *r, int ai, int status, const struct lg_http *h, double t_sent)
{
    struct run_stats *st = r->st;
    double now = lg_now(), lat = now - (r->t0 + r->arr[ai].t), svc = now - t_sent;
    r->n_done++;
    if (status != 200) {
        count_error(st, status);
        return;
    }
    cJSON *j = cJSON_ParseWithLength(h->body.p ? h->body.p : "", h->body.len);
    cJSON *cached = j ? cJSON_GetObjectItemCaseSensitive(j, "cached") : NULL;
    cJSON *src = j ? cJSON_GetObjectItemCaseSensitive(j, "source") : NULL;
    if (!j || !cJSON_IsBool(cached)) {
        count_error(st, 2); /* 200 without a usable body */
        cJSON_Delete(j);
        return;
    }
    st->n_ok++;
    if (!st->t_first_done)
        st->t_first_done = now;
    st->t_last_done = now;
    lg_samples_add(&st->all, lat);
    if (cJSON_IsTrue(cached)) {
        st->n_hit++;
        lg_samples_add(&st->hit, lat);
        lg_samples_add(&st->hit_svc, svc);
    } else {
        st->n_miss++;
        lg_samples_add(&st->miss, lat);
        lg_samples_add(&st->miss_svc, svc);
    }
    count_source(st, cJSON_IsString(src) ? src->valuestring : "?");
    cJSON_Delete(j);
}

static void build_request(struct run *r, struct conn *c, int ai)
{
    const struct arrival *a = &r->arr[ai];
    const struct review *rv = &r->reviews[a->review];
    char id[160], body_hdr[256];
    struct lg_buf body = {0};
    if (a->fresh)
        snprintf(id, sizeof(id), "%s-%s-%u", rv->id, r->tag, a->serial);
    else
        snprintf(id, sizeof(id), "%s-%s", rv->id, r->tag);
    snprintf(body_hdr, sizeof(body_hdr),
             "{\"shop_id\":\"%s\",\"review_id\":\"%s\",\"text\":", r->shop, id);
    lg_buf_printf(&body, "%s%s,\"rating\":%d}", body_hdr, rv->text_json, rv->rating);
    lg_buf_clear(&c->out);
    lg_request(&c->out, "POST", "/v1/reviews/reply", body.p, body.len, false);
    lg_buf_free(&body);
    c->out_off = 0;
}

static void conn_fail(struct run *r, struct conn *c);

/* Writes what the socket takes; on completion waits for the answer. */
static void conn_write(struct run *r, struct conn *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (c->state != C_SENDING) {
                c->state = C_SENDING;
                conn_watch(r, c, EPOLLOUT, false);
            }
            return;
        }
        if (n <= 0) {
            conn_fail(r, c);
            return;
        }
        c->out_off += (size_t)n;
    }
    c->state = C_READING;
    conn_watch(r, c, EPOLLIN | EPOLLRDHUP, false);
}

/* Sends arrival ai on c (a free or idle connection). */
static void conn_start(struct run *r, struct conn *c, int ai)
{
    double now = lg_now();
    c->arr = ai;
    c->t_sent = now;
    c->tries++;
    if (now - (r->t0 + r->arr[ai].t) > 0.001)
        r->st->n_late++;
    lg_http_reset(&c->h);
    if (c->fd < 0) {
        c->reused = false;
        if ((c->fd = lg_connect(r->port, true)) < 0) {
            c->state = C_FREE;
            c->arr = -1;
            record(r, ai, 0, NULL, now);
            return;
        }
        r->n_open++;
        if (r->n_open > r->st->max_open)
            r->st->max_open = r->n_open;
        c->state = C_CONNECTING;
        conn_watch(r, c, EPOLLOUT, true);
        return;
    }
    c->reused = true;
    c->state = C_SENDING;
    conn_write(r, c);
}

/* The connection broke during a request: a kept-alive connection that the server closed
 * before reading it is retried once on a new one; anything else is an error. */
static void conn_fail(struct run *r, struct conn *c)
{
    int ai = c->arr;
    bool retry = c->reused && c->h.raw.len == 0 && c->tries < 2;
    conn_close(r, c);
    c->arr = -1;
    if (ai < 0)
        return;
    if (retry) {
        r->st->n_retried++;
        build_request(r, c, ai);
        conn_start(r, c, ai);
        return;
    }
    c->tries = 0;
    record(r, ai, 0, NULL, c->t_sent);
}

static void conn_done(struct run *r, struct conn *c)
{
    int ai = c->arr;
    record(r, ai, c->h.status, &c->h, c->t_sent);
    c->arr = -1;
    c->tries = 0;
    if (!c->h.keep_alive) {
        conn_close(r, c);
        return;
    }
    c->state = C_IDLE;
    if (!c->in_idle) {
        c->in_idle = true;
        r->idle[r->n_idle++] = (int)(c - r->conns);
    }
}

static void conn_readable(struct run *r, struct conn *c)
{
    char buf[16384];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (c->state == C_IDLE) { /* the server closed an idle connection (or sent junk) */
            conn_close(r, c);
            return;
        }
        if (n <= 0) {
            if (n == 0 && lg_http_eof(&c->h) > 0)
                conn_done(r, c);
            else
                conn_fail(r, c);
            return;
        }
        lg_http_feed(&c->h, buf, (size_t)n);
        int pr = lg_http_parse(&c->h);
        if (pr < 0) {
            c->tries = 2; /* malformed: no retry */
            conn_fail(r, c);
            return;
        }
        if (pr > 0) {
            conn_done(r, c);
            return;
        }
    }
}

static void on_event(struct run *r, struct conn *c, uint32_t ev)
{
    switch (c->state) {
    case C_CONNECTING: {
        int e = 0;
        socklen_t el = sizeof(e);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 || e) {
            conn_fail(r, c);
            return;
        }
        c->state = C_SENDING;
        conn_write(r, c);
        break;
    }
    case C_SENDING:
        if (ev & (EPOLLERR | EPOLLHUP))
            conn_fail(r, c);
        else
            conn_write(r, c);
        break;
    case C_READING:
    case C_IDLE:
        conn_readable(r, c);
        break;
    case C_FREE:
        break;
    }
}

/* A connection for the next request: an idle one, else a new slot; NULL when all are busy. */
static struct conn *take_conn(struct run *r)
{
    while (r->n_idle > 0) {
        struct conn *c = &r->conns[r->idle[--r->n_idle]];
        c->in_idle = false;
        if (c->state == C_IDLE && c->fd >= 0)
            return c;
    }
    if (r->n_open < r->max_conns)
        for (int i = 0; i < r->max_conns; i++)
            if (r->conns[i].state == C_FREE && r->conns[i].arr < 0)
                return &r->conns[i];
    return NULL;
}

static void arm_timer(int tfd, double at)
{
    struct itimerspec its = {0};
    if (at <= 0) {
        timerfd_settime(tfd, 0, &its, NULL);
        return;
    }
    its.it_value.tv_sec = (time_t)at;
    its.it_value.tv_nsec = (long)((at - (double)its.it_value.tv_sec) * 1e9);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1;
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* Sends every arrival at its time over at most max_conns connections and waits for the
 * answers, at most drain_s after the last arrival. */
static void run_open_loop(int port, int max_conns, double drain_s, const char *shop,
                          const char *tag, const struct review *reviews, const struct arrival *arr,
                          int n_arr, struct run_stats *st)
{
    struct run r = {0};
    struct epoll_event evs[256];
    int tfd, next = 0;
    double end;
    r.port = port;
    r.max_conns = max_conns;
    r.shop = shop;
    r.tag = tag;
    r.reviews = reviews;
    r.arr = arr;
    r.n_arr = n_arr;
    r.st = st;
    r.conns = lg_xalloc((size_t)max_conns * sizeof(*r.conns));
    r.idle = lg_xalloc((size_t)max_conns * sizeof(int));
    r.pend = lg_xalloc((size_t)(n_arr + 1) * sizeof(int));
    for (int i = 0; i < max_conns; i++) {
        r.conns[i].fd = -1;
        r.conns[i].arr = -1;
    }
    st->n_sched = n_arr;
    r.ep = epoll_create1(EPOLL_CLOEXEC);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
        epoll_ctl(r.ep, EPOLL_CTL_ADD, tfd, &ev);
    }
    r.t0 = lg_now() + 0.02;
    st->t_start = r.t0;
    end = r.t0 + (n_arr ? arr[n_arr - 1].t : 0) + drain_s;
    while (r.n_done < n_arr) {
        double now = lg_now();
        if (now > end)
            break;
        while (next < n_arr && r.t0 + arr[next].t <= now)
            r.pend[r.pend_tail++] = next++;
        while (r.pend_head < r.pend_tail) {
            struct conn *c = take_conn(&r);
            if (!c)
                break;
            int ai = r.pend[r.pend_head++];
            build_request(&r, c, ai);
            conn_start(&r, c, ai);
        }
        arm_timer(tfd, next < n_arr ? r.t0 + arr[next].t : 0);
        int n = epoll_wait(r.ep, evs, (int)AR_ARRAY_LEN(evs), 100);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u32 == UINT32_MAX) {
                uint64_t x;
                if (read(tfd, &x, sizeof(x)) < 0) {
                    /* nothing to do: the timer only wakes the loop */
                }
                continue;
            }
            on_event(&r, &r.conns[evs[i].data.u32], evs[i].events);
        }
    }
    st->n_unanswered = n_arr - r.n_done;
    for (int i = 0; i < max_conns; i++) {
        if (r.conns[i].fd >= 0)
            conn_close(&r, &r.conns[i]);
        lg_buf_free(&r.conns[i].out);
        lg_http_free(&r.conns[i].h);
    }
    close(tfd);
    close(r.ep);
    free(r.conns);
    free(r.idle);
    free(r.pend);
}

/* ---- workloads ------------------------------------------------------------------------------ */

/* Arrival times over seconds at rate: Poisson (exponential gaps) or evenly spaced. */
static int make_times(double rate, double seconds, bool poisson, uint64_t *seed, double **out)
{
    int cap = (int)(rate * seconds * 1.5) + 16, n = 0;
    double t = 0, *ts = lg_xalloc((size_t)cap * sizeof(double));
    for (int i = 0; i < cap; i++) {
        t = poisson ? t - log(1.0 - lg_rand01(seed)) / rate : (double)i / rate;
        if (t >= seconds)
            break;
        ts[n++] = t;
    }
    *out = ts;
    return n;
}

/* Zipf-like ranks over n items: P(rank k) proportional to 1/k^s. cdf has n entries. */
static double *zipf_cdf(int n, double s)
{
    double *cdf = lg_xalloc((size_t)n * sizeof(double)), sum = 0;
    for (int k = 0; k < n; k++) {
        sum += 1.0 / pow((double)(k + 1), s);
        cdf[k] = sum;
    }
    for (int k = 0; k < n; k++)
        cdf[k] /= sum;
    return cdf;
}

static int zipf_draw(const double *cdf, int n, uint64_t *seed)
{
    double u = lg_rand01(seed);
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---- reporting ---------------------------------------------------------------------------- */

static double ms(double s)
{
    return s * 1000.0;
}

static void stats_free(struct run_stats *st)
{
    lg_samples_free(&st->hit);
    lg_samples_free(&st->miss);
    lg_samples_free(&st->hit_svc);
    lg_samples_free(&st->miss_svc);
    lg_samples_free(&st->all);
}

static double achieved(const struct run_stats *st)
{
    double span = st->t_last_done - st->t_start;
    return span > 0 ? st->n_ok / span : 0;
}

static void errors_str(const struct run_stats *st, char *buf, size_t size)
{
    size_t l = 0;
    buf[0] = 0;
    for (int k = 0; k < MAX_STATUS && st->err_count[k]; k++) {
        int s = st->err_status[k];
        char name[16];
        if (s == 0)
            snprintf(name, sizeof(name), "conn");
        else if (s == 2)
            snprintf(name, sizeof(name), "badbody");
        else
            snprintf(name, sizeof(name), "%d", s);
        l += (size_t)snprintf(buf + l, size - l, "%s%s:%d", l ? " " : "", name, st->err_count[k]);
        if (l >= size)
            return;
    }
    if (st->n_unanswered && l < size)
        l += (size_t)snprintf(buf + l, size - l, "%sunanswered:%d", l ? " " : "", st->n_unanswered);
    if (!l)
        snprintf(buf, size, "none");
}

static void print_stats(struct run_stats *st)
{
    char err[256], src[256] = "";
    size_t l = 0;
    errors_str(st, err, sizeof(err));
    for (int k = 0; k < MAX_SOURCES && st->src_count[k]; k++)
        l += (size_t)snprintf(src + l, sizeof(src) - l, "%s%s %d", l ? ", " : "", st->src_name[k],
                              st->src_count[k]);
    printf("[%s] offered %.0f/s for %.0f s: %d scheduled, %d answered (%.1f replies/s), "
           "hit ratio %.1f%%\n",
           st->name, st->rate, st->seconds, st->n_sched, st->n_ok, achieved(st),
           st->n_ok ? 100.0 * st->n_hit / st->n_ok : 0.0);
    printf("    sources: %s\n", l ? src : "-");
    if (st->n_hit)
        printf("    hits   (%6d): p50 %8.3f ms  p99 %8.3f ms  mean %8.3f ms   "
               "(from the send instead of the scheduled arrival: p99 %.3f ms)\n",
               st->n_hit, ms(lg_percentile(&st->hit, 50)), ms(lg_percentile(&st->hit, 99)),
               ms(lg_mean(&st->hit)), ms(lg_percentile(&st->hit_svc, 99)));
    if (st->n_miss)
        printf("    misses (%6d): p50 %8.3f ms  p99 %8.3f ms  mean %8.3f ms   "
               "(from send: p99 %.3f ms)\n",
               st->n_miss, ms(lg_percentile(&st->miss, 50)), ms(lg_percentile(&st->miss, 99)),
               ms(lg_mean(&st->miss)), ms(lg_percentile(&st->miss_svc, 99)));
    printf("    all: mean %.3f ms; errors: %s; connections %d; late sends (>1 ms) %d; "
           "retried on a new connection %d\n",
           ms(lg_mean(&st->all)), err, st->max_open, st->n_late, st->n_retried);
}

static cJSON *stats_json(struct run_stats *st)
{
    cJSON *j = cJSON_CreateObject(), *src = cJSON_AddObjectToObject(j, "sources");
    char err[256];
    errors_str(st, err, sizeof(err));
    cJSON_AddStringToObject(j, "name", st->name);
    cJSON_AddNumberToObject(j, "offered_rate", st->rate);
    cJSON_AddNumberToObject(j, "seconds", st->seconds);
    cJSON_AddNumberToObject(j, "scheduled", st->n_sched);
    cJSON_AddNumberToObject(j, "answered", st->n_ok);
    cJSON_AddNumberToObject(j, "replies_per_s", achieved(st));
    cJSON_AddNumberToObject(j, "hit_ratio", st->n_ok ? (double)st->n_hit / st->n_ok : 0);
    for (int k = 0; k < MAX_SOURCES && st->src_count[k]; k++)
        cJSON_AddNumberToObject(src, st->src_name[k], st->src_count[k]);
#define ADDMS(key, v)                                                                              \
    do {                                                                                           \
        double x_ = (v);                                                                           \
        if (!isnan(x_))                                                                            \
            cJSON_AddNumberToObject(j, key, ms(x_));                                               \
    } while (0)
    ADDMS("hit_p50_ms", lg_percentile(&st->hit, 50));
    ADDMS("hit_p99_ms", lg_percentile(&st->hit, 99));
    ADDMS("hit_p99_from_send_ms", lg_percentile(&st->hit_svc, 99));
    ADDMS("miss_p50_ms", lg_percentile(&st->miss, 50));
    ADDMS("miss_p99_ms", lg_percentile(&st->miss, 99));
    ADDMS("mean_ms", lg_mean(&st->all));
#undef ADDMS
    cJSON_AddStringToObject(j, "errors", err);
    cJSON_AddNumberToObject(j, "late_sends", st->n_late);
    return j;
}

/* ---- servers ------------------------------------------------------------------------------ */

struct server_cfg {
    bool all_off;      /* reply cache, batching and prefix cache off */
    char missing[256]; /* flags the server lacks for all_off */
};

static bool start_server(const struct opts *o, struct server_cfg *cfg, const char *dir,
                         const char *help, struct lg_server *srv)
{
    char port_s[16], thr[16], log_path[1100], data_dir[1100];
    char *argv[64], *extra = NULL;
    int n, port = lg_free_port();
    if (!port)
        return false;
    snprintf(log_path, sizeof(log_path), "%s/server.log", dir);
    snprintf(data_dir, sizeof(data_dir), "%s/data", dir);
    mkdir(data_dir, 0755);
    n = lg_serve_argv(argv, o->bin, o->model, port, port_s, o->threads, thr);
    /* the data directory: whichever flag the server has (it also runs inside dir) */
    {
        static const char *const data_flags[] = {"--data-dir", "--data", "--db-dir"};
        bool found = false;
        for (size_t i = 0; i < AR_ARRAY_LEN(data_flags) && !found; i++)
            if (lg_has_flag(help, data_flags[i])) {
                argv[n++] = lg_unconst(data_flags[i]);
                argv[n++] = data_dir;
                found = true;
            }
        if (!found && lg_has_flag(help, "--db")) {
            snprintf(data_dir, sizeof(data_dir), "%s/data/autoreply.db", dir);
            argv[n++] = "--db";
            argv[n++] = data_dir;
        }
    }
    cfg->missing[0] = 0;
    if (cfg->all_off) {
        size_t l = 0;
        if (lg_has_flag(help, "--no-reply-cache"))
            argv[n++] = "--no-reply-cache";
        else if (lg_has_flag(help, "--reply-cache-size")) {
            argv[n++] = "--reply-cache-size";
            argv[n++] = "0";
        } else
            l += (size_t)snprintf(cfg->missing + l, sizeof(cfg->missing) - l, "%s",
                                  "--no-reply-cache ");
        argv[n++] = "--parallel";
        argv[n++] = "1";
        if (lg_has_flag(help, "--no-prefix-cache"))
            argv[n++] = "--no-prefix-cache";
        else
            snprintf(cfg->missing + l, sizeof(cfg->missing) - l, "%s", "--no-prefix-cache ");
    }
    if (o->server_args && *o->server_args) {
        extra = strdup(o->server_args);
        for (char *save = NULL, *t = strtok_r(extra, " ", &save); t && n < 60;
             t = strtok_r(NULL, " ", &save))
            argv[n++] = t;
    }
    argv[n] = NULL;
    lg_print_cmd(stderr, "+ ", argv);
    bool ok = lg_server_start(srv, argv, port, dir, log_path, 300.0);
    free(extra);
    return ok;
}

/* ---- scenarios ------------------------------------------------------------------------------ */

static void shuffle(int *a, int n, uint64_t *seed)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(ar_splitmix64(seed) % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* Indices of the first n reviews with distinct texts. */
static int distinct_reviews(const struct review *rv, int n_rv, int n, int *out)
{
    int k = 0;
    for (int i = 0; i < n_rv && k < n; i++) {
        bool dup = false;
        for (int j = 0; j < k && !dup; j++)
            dup = !strcmp(rv[out[j]].text_json, rv[i].text_json);
        if (!dup)
            out[k++] = i;
    }
    return k;
}

/* Closed-loop warm-up: every listed review once, conc at a time. */
static void warm(const struct opts *o, int port, const struct review *rv, const int *idx, int n,
                 const char *tag, int conc)
{
    struct arrival *a = lg_xalloc((size_t)n * sizeof(*a));
    struct run_stats st = {0};
    for (int i = 0; i < n; i++)
        a[i] = (struct arrival){0, idx[i], false, 0};
    snprintf(st.name, sizeof(st.name), "warm-up");
    double t = lg_now();
    run_open_loop(port, conc, 600, "bench", tag, rv, a, n, &st);
    fprintf(stderr, "  warm-up: %d reviews in %.1f s (%d answered, %d misses)\n", n, lg_now() - t,
            st.n_ok, st.n_miss);
    (void)o;
    stats_free(&st);
    free(a);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: replay [-m MODEL] [--scenario all|a|b|plain] [--rate R] [--seconds S]\n"
            "              [--rate-b R] [--seconds-b S] [--pool 2000] [--warm 200] [--zipf 1.0]\n"
            "              [--warm-b 0]\n"
            "              [--ids fresh|reuse] [--arrivals poisson|uniform] [--conns 64]\n"
            "              [--threads 2] [--reviews FILE] [--server-args 'ARGS'] [--port P]\n"
            "              [--drain S] [--seed N] [--bin ./bin/autoreply] [--json]\n"
            "  a:     warm --warm reviews, replay them at --rate (2000/s) for --seconds (10):\n"
            "         same ids (store) then fresh ids (reply cache)\n"
            "  b:     first --pool reviews, Zipf(--zipf) repeats, fresh ids, at --rate-b (16/s)\n"
            "         for --seconds-b (60) against all-on and all-off servers; --warm-b N first\n"
            "         sends N requests of the same mix (16 at a time, not measured): a cache\n"
            "         warmed by earlier traffic\n"
            "  plain: --pool reviews in file order at --rate for --seconds (--ids)\n"
            "  --port: use a server already running on 127.0.0.1:P (no child; b runs one side)\n");
}

static char *abs_path(const char *p)
{
    char *r = realpath(p, NULL);
    if (!r) {
        fprintf(stderr, "%s: not found\n", p);
        exit(1);
    }
    return r;
}

/* Starts a server in a fresh directory under root (or uses --port). */
static bool begin(const struct opts *o, struct server_cfg *cfg, const char *root, const char *name,
                  const char *help, struct lg_server *srv, int *port)
{
    char dir[1024];
    memset(srv, 0, sizeof(*srv));
    if (o->port) {
        *port = o->port;
        return true;
    }
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    mkdir(dir, 0755);
    if (!start_server(o, cfg, dir, help, srv))
        return false;
    *port = srv->port;
    return true;
}

/* Closed-loop warm-up with fresh review ids (repeats of a text are new reviews). */
static void warm_mix(int port, const struct review *rv, const int *idx, int n, const char *tag,
                     int conc)
{
    struct arrival *a = lg_xalloc((size_t)n * sizeof(*a));
    struct run_stats st = {0};
    double t = lg_now();
    for (int i = 0; i < n; i++)
        a[i] = (struct arrival){0, idx[i], true, (uint32_t)i};
    run_open_loop(port, conc, 600, "bench", tag, rv, a, n, &st);
    fprintf(stderr, "  warm-up: %d requests in %.1f s (%d answered, %d hits)\n", n, lg_now() - t,
            st.n_ok, st.n_hit);
    stats_free(&st);
    free(a);
}

int main(int argc, char **argv)
{
    struct opts o = {.bin = "./bin/autoreply",
                     .model = "models/autoreply-demo-q8_0.gguf",
                     .reviews_path = "../shared/data/reviews-sample.jsonl",
                     .scenario = "all",
                     .rate = 2000,
                     .seconds = 10,
                     .rate_b = 16,
                     .seconds_b = 60,
                     .pool = 2000,
                     .warm = 200,
                     .conns = 64,
                     .threads = 2,
                     .zipf = 1.0,
                     .drain_s = 60,
                     .poisson = true,
                     .fresh_ids = true,
                     .seed = 1};
    struct review *rv = NULL;
    int n_rv;
    char root[] = "/tmp/autoreply-bench-replay-XXXXXX";
    char *help, *bin_abs = NULL, *model_abs = NULL;
    cJSON *jout = cJSON_CreateObject(), *jruns = cJSON_AddArrayToObject(jout, "runs");
    int rc = 0;

    signal(SIGPIPE, SIG_IGN);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            LG_NEEDV();
            o.model = v;
        } else if (!strcmp(a, "--bin")) {
            LG_NEEDV();
            o.bin = v;
        } else if (!strcmp(a, "--scenario")) {
            LG_NEEDV();
            o.scenario = v;
        } else if (!strcmp(a, "--rate")) {
            LG_NEEDV();
            o.rate = atof(v);
        } else if (!strcmp(a, "--seconds")) {
            LG_NEEDV();
            o.seconds = atof(v);
        } else if (!strcmp(a, "--rate-b")) {
            LG_NEEDV();
            o.rate_b = atof(v);
        } else if (!strcmp(a, "--seconds-b")) {
            LG_NEEDV();
            o.seconds_b = atof(v);
        } else if (!strcmp(a, "--pool")) {
            LG_NEEDV();
            o.pool = atoi(v);
        } else if (!strcmp(a, "--warm-b")) {
            LG_NEEDV();
            o.warm_b = atoi(v);
        } else if (!strcmp(a, "--warm")) {
            LG_NEEDV();
            o.warm = atoi(v);
        } else if (!strcmp(a, "--zipf")) {
            LG_NEEDV();
            o.zipf = atof(v);
        } else if (!strcmp(a, "--ids")) {
            LG_NEEDV();
            o.fresh_ids = !strcmp(v, "fresh");
        } else if (!strcmp(a, "--arrivals")) {
            LG_NEEDV();
            o.poisson = strcmp(v, "uniform") != 0;
        } else if (!strcmp(a, "--conns")) {
            LG_NEEDV();
            o.conns = atoi(v);
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            LG_NEEDV();
            o.threads = atoi(v);
        } else if (!strcmp(a, "--reviews")) {
            LG_NEEDV();
            o.reviews_path = v;
        } else if (!strcmp(a, "--server-args")) {
            LG_NEEDV();
            o.server_args = v;
        } else if (!strcmp(a, "--port")) {
            LG_NEEDV();
            o.port = atoi(v);
        } else if (!strcmp(a, "--drain")) {
            LG_NEEDV();
            o.drain_s = atof(v);
        } else if (!strcmp(a, "--seed")) {
            LG_NEEDV();
            o.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--json")) {
            o.json = true;
        } else {
            fprintf(stderr, "unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    bool do_a = !strcmp(o.scenario, "all") || !strcmp(o.scenario, "a");
    bool do_b = !strcmp(o.scenario, "all") || !strcmp(o.scenario, "b");
    bool do_plain = !strcmp(o.scenario, "plain");
    if ((!do_a && !do_b && !do_plain) || o.rate <= 0 || o.rate > 1e6 || o.seconds <= 0 ||
        o.seconds > 3600 || o.rate_b <= 0 || o.rate_b > 1e6 || o.seconds_b <= 0 ||
        o.seconds_b > 3600 || o.rate * o.seconds > 5e6 || o.pool < 1 || o.pool > 1000000 ||
        o.warm < 1 || o.warm_b < 0 || o.warm_b > 1000000 || o.conns < 1 || o.conns > 10000 ||
        o.zipf < 0 || o.zipf > 10 || o.drain_s < 0 || o.drain_s > 3600 || o.port < 0 ||
        o.port > 65535) {
        fprintf(stderr, "an option is out of range\n");
        usage(stderr);
        return 2;
    }
    if (!o.port) {
        o.bin = bin_abs = abs_path(o.bin);
        o.model = model_abs = abs_path(o.model);
    }
    n_rv = load_reviews(o.reviews_path, AR_MAX(o.pool, o.warm), &rv);
    if (n_rv <= 0) {
        fprintf(stderr, "%s: no reviews\n", o.reviews_path);
        return 1;
    }
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    help = o.port ? strdup("") : lg_serve_help(o.bin);
    fprintf(stderr, "%d reviews from %s; data under %s\n", n_rv, o.reviews_path, root);
    if (!o.json)
        printf("(1-minute load average before: %.2f)\n", lg_loadavg());
    cJSON_AddNumberToObject(jout, "loadavg_before", lg_loadavg());

    uint64_t seed = o.seed;
    if (do_plain) {
        struct server_cfg cfg = {0};
        struct lg_server srv;
        struct run_stats st = {0};
        struct arrival *arr;
        double *ts;
        int port, n;
        if (!begin(&o, &cfg, root, "plain", help, &srv, &port)) {
            rc = 1;
            goto out;
        }
        n = make_times(o.rate, o.seconds, o.poisson, &seed, &ts);
        arr = lg_xalloc((size_t)AR_MAX(n, 1) * sizeof(*arr));
        for (int i = 0; i < n; i++)
            arr[i] = (struct arrival){ts[i], i % AR_MIN(n_rv, o.pool), o.fresh_ids, (uint32_t)i};
        snprintf(st.name, sizeof(st.name), "plain, %s ids", o.fresh_ids ? "fresh" : "reused");
        st.rate = o.rate;
        st.seconds = o.seconds;
        run_open_loop(port, o.conns, o.drain_s, "bench", "p", rv, arr, n, &st);
        lg_server_stop(&srv, 20);
        if (o.json)
            cJSON_AddItemToArray(jruns, stats_json(&st));
        else
            print_stats(&st);
        stats_free(&st);
        free(arr);
        free(ts);
    }

    if (do_a) {
        struct server_cfg cfg = {0};
        struct lg_server srv;
        int port, *idx = lg_xalloc((size_t)o.warm * sizeof(int)), n_warm;
        double hit99[2] = {(double)NAN, (double)NAN};
        n_warm = distinct_reviews(rv, n_rv, o.warm, idx);
        if (!begin(&o, &cfg, root, "a", help, &srv, &port)) {
            rc = 1;
            free(idx);
            goto out;
        }
        warm(&o, port, rv, idx, n_warm, "a", 16);
        for (int pass = 0; pass < 2; pass++) {
            struct run_stats st = {0};
            struct arrival *arr;
            double *ts;
            int n = make_times(o.rate, o.seconds, o.poisson, &seed, &ts);
            arr = lg_xalloc((size_t)AR_MAX(n, 1) * sizeof(*arr));
            for (int i = 0; i < n; i++)
                arr[i] = (struct arrival){ts[i], idx[ar_splitmix64(&seed) % (uint64_t)n_warm],
                                          pass == 1, (uint32_t)i};
            snprintf(st.name, sizeof(st.name), "%s",
                     pass == 0 ? "A1 same review ids (store)" : "A2 fresh ids (reply cache)");
            st.rate = o.rate;
            st.seconds = o.seconds;
            run_open_loop(port, o.conns, o.drain_s, "bench", "a", rv, arr, n, &st);
            hit99[pass] = lg_percentile(&st.hit, 99);
            if (o.json)
                cJSON_AddItemToArray(jruns, stats_json(&st));
            else
                print_stats(&st);
            stats_free(&st);
            free(arr);
            free(ts);
        }
        lg_server_stop(&srv, 20);
        if (!o.json)
            printf("  target: cache-hit p99 < 2 ms at %.0f requests/s on %d threads: "
                   "A1 %.3f ms (%s), A2 %.3f ms (%s)\n\n",
                   o.rate, o.threads, ms(hit99[0]), hit99[0] < 0.002 ? "met" : "NOT met",
                   ms(hit99[1]), hit99[1] < 0.002 ? "met" : "NOT met");
        cJSON_AddNumberToObject(jout, "a_store_hit_p99_ms", isnan(hit99[0]) ? -1 : ms(hit99[0]));
        cJSON_AddNumberToObject(jout, "a_cache_hit_p99_ms", isnan(hit99[1]) ? -1 : ms(hit99[1]));
        free(idx);
    }

    if (do_b) {
        int n_pool = AR_MIN(o.pool, n_rv), *rank = lg_xalloc((size_t)n_pool * sizeof(int));
        double *cdf = zipf_cdf(n_pool, o.zipf), *ts, mean[2] = {(double)NAN, (double)NAN};
        struct arrival *arr;
        int n;
        char missing[256] = "";
        bool incomplete = false;
        for (int i = 0; i < n_pool; i++)
            rank[i] = i;
        shuffle(rank, n_pool, &seed);
        n = make_times(o.rate_b, o.seconds_b, o.poisson, &seed, &ts);
        arr = lg_xalloc((size_t)AR_MAX(n, 1) * sizeof(*arr));
        for (int i = 0; i < n; i++)
            arr[i] =
                (struct arrival){ts[i], rank[zipf_draw(cdf, n_pool, &seed)], true, (uint32_t)i};
        int *warm_idx = lg_xalloc((size_t)AR_MAX(o.warm_b, 1) * sizeof(int));
        for (int i = 0; i < o.warm_b; i++)
            warm_idx[i] = rank[zipf_draw(cdf, n_pool, &seed)];
        for (int side = 0; side < 2; side++) {
            struct server_cfg cfg = {.all_off = side == 1};
            struct lg_server srv;
            struct run_stats st = {0};
            int port;
            if (o.port && side == 1)
                break;
            if (!begin(&o, &cfg, root, side ? "b-off" : "b-on", help, &srv, &port)) {
                rc = 1;
                break;
            }
            if (side == 1)
                snprintf(missing, sizeof(missing), "%s", cfg.missing);
            if (o.warm_b > 0)
                warm_mix(port, rv, warm_idx, o.warm_b, side ? "bwoff" : "bwon", 16);
            snprintf(st.name, sizeof(st.name), "B %s",
                     o.port ? "as configured"
                     : side ? "all off"
                            : "all on");
            st.rate = o.rate_b;
            st.seconds = o.seconds_b;
            run_open_loop(port, o.conns, o.drain_s, "bench", side ? "boff" : "bon", rv, arr, n,
                          &st);
            lg_server_stop(&srv, 20);
            mean[side] = lg_mean(&st.all);
            if (st.n_unanswered || st.err_count[0])
                incomplete = true;
            if (o.json)
                cJSON_AddItemToArray(jruns, stats_json(&st));
            else
                print_stats(&st);
            stats_free(&st);
        }
        double ratio = mean[1] / mean[0];
        if (!o.json) {
            printf("  B: %d requests over %d reviews (Zipf s=%.2f), offered %.1f/s for %.0f s\n", n,
                   n_pool, o.zipf, o.rate_b, o.seconds_b);
            printf("  target: mean response time, all off / all on: %.1f ms / %.1f ms = %.1fx "
                   "(target >= 10x: %s)\n",
                   ms(mean[1]), ms(mean[0]), ratio,
                   isnan(ratio)  ? "n/a"
                   : ratio >= 10 ? "met"
                                 : "NOT met");
            if (missing[0])
                printf("  note: the server has no %sflag; that part stayed on in the off run\n",
                       missing);
            if (incomplete)
                printf("  note: some requests failed or were not answered in time (see errors): "
                       "the means cover answered requests only\n");
        }
        if (!isnan(ratio))
            cJSON_AddNumberToObject(jout, "b_mean_ratio", ratio);
        if (missing[0])
            cJSON_AddStringToObject(jout, "b_missing_flags", missing);
        free(warm_idx);
        free(rank);
        free(cdf);
        free(ts);
        free(arr);
    }
out:
    cJSON_AddNumberToObject(jout, "loadavg_after", lg_loadavg());
    if (!o.json)
        printf("(1-minute load average after: %.2f)\n", lg_loadavg());
    if (o.json) {
        char *s = cJSON_Print(jout);
        printf("%s\n", s);
        cJSON_free(s);
    }
    cJSON_Delete(jout);
    {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", root);
    }
    for (int i = 0; i < n_rv; i++) {
        free(rv[i].id);
        cJSON_free(rv[i].text_json);
    }
    free(rv);
    free(help);
    free(bin_abs);
    free(model_abs);
    return rc;
}
