/* fleet.c - fleet benchmark (closed loop, loopback). Brings up fleets with deploy/fleet.sh
 * (PostgreSQL, Redis, RabbitMQ, `autoreply serve` instances, nginx in front) and plain
 * `autoreply serve` processes, then measures in one run:
 *
 * 1. What nginx, Redis and PostgreSQL add to a reply-cache hit: a review whose normalized text
 *    was answered before, sent under a new review id (so it is a cache hit, not an idempotent
 *    store replay: the review is claimed and its reply written to the store), p50/p99 at
 *    concurrency 1 (and 4) against
 *      a  a plain serve, direct (in-process cache; store: SQLite)
 *      b  the fleet through nginx to an instance run with --reply-cache-mb 0 (every hit a
 *         Redis GET; store: PostgreSQL)
 *      c  the same instance without nginx
 *      d  a serve with the fleet's Redis as its only cache and SQLite as its store, direct
 *    so that b - c is nginx, c - d PostgreSQL instead of SQLite, d - a Redis instead of the
 *    in-process cache. The setups are measured in alternating blocks, so that other work on
 *    the machine spreads over all of them. Target: b - a under 0.5 ms at p50.
 * 2. Replies per second on model misses (every review text unique): 2 instances x 1 thread
 *    against 1 instance x 2 threads, both behind nginx with their own backends, closed loop,
 *    in alternating windows.
 * 3. The shared servers' own capacity on this machine: PostgreSQL single-row inserts per second
 *    (pgbench, one commit each) and Redis SET/GET per second (redis-benchmark), against the
 *    fleet's own servers.
 * Besides latencies it reads each process's CPU time (/proc), Redis INFO, PostgreSQL's WAL
 * position and transaction counter and the instances' /metrics before and after each part, so
 * that the cost of a hit and of a miss comes out per component (docs/scaling.md builds on
 * these). --pg-async-commit runs the fleets' PostgreSQL with synchronous_commit off, to show
 * what waiting for the WAL flush costs a request. Everything it starts is stopped on exit, on
 * failure and on SIGINT/SIGTERM. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>

#include <cjson/cJSON.h>
#include <libpq-fe.h>

#include "base/base.h"
#include "loadgen.h"

#define MAX_INST 8
#define MAX_CONC 256
#define MAX_STATUS 8
#define MAX_LEVELS 4
#define REQ_TIMEOUT_S 120.0
#define SHOP "fleet-bench"

struct opts {
    const char *bin, *model, *reviews_path, *fleet_sh;
    int hit_requests, hit_texts, rounds, miss_conc, n_hit_levels, windows;
    int hit_levels[MAX_LEVELS];
    double miss_seconds, miss_warm_s;
    bool json, keep, backend_bench, pg_async;
};

/* ---- everything started, for the cleanup on any exit ----------------------------------------- */

static char g_tmpdir[] = "/tmp/autoreply-bench-fleet-XXXXXX";
static bool g_have_tmpdir, g_keep;
static char g_fleet_sh[4096];
static char g_fleet_dir[2][4200];  /* fleets that may be up (fleet.sh down is idempotent) */
static _Atomic int g_plain_pid[2]; /* a, and d (with Redis) */
static atomic_flag g_cleaning = ATOMIC_FLAG_INIT;

/* fork + exec + wait: async-signal-safe, usable from the signal handler */
static int run_argv(char *const argv[], bool quiet)
{
    int wst = 0;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (quiet) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
        } else {
            dup2(2, 1); /* progress on stderr: stdout holds only the report */
        }
        execv(argv[0], argv);
        _exit(127);
    }
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(wst) ? WEXITSTATUS(wst) : 128 + WTERMSIG(wst);
}

static int fleet_down(int k)
{
    char *argv[] = {"/bin/sh", g_fleet_sh, "down", "--dir", g_fleet_dir[k], "--grace", "5", NULL};
    int rc;
    if (!g_fleet_dir[k][0])
        return 0;
    rc = run_argv(argv, true);
    g_fleet_dir[k][0] = 0;
    return rc;
}

static void plain_stop(int k)
{
    pid_t pid = atomic_exchange(&g_plain_pid[k], 0);
    struct timespec ts = {0, 50 * 1000 * 1000};
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 200; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void cleanup(void)
{
    if (atomic_flag_test_and_set(&g_cleaning))
        return;
    for (int k = 0; k < 2; k++)
        plain_stop(k);
    for (int k = 0; k < 2; k++)
        fleet_down(k);
    if (g_have_tmpdir && !g_keep) {
        char *argv[] = {"/bin/rm", "-rf", g_tmpdir, NULL};
        run_argv(argv, true);
    }
}

static void on_signal(int sig)
{
    static const char msg[] = "\nfleet bench: interrupted, stopping what it started\n";
    ssize_t n = write(2, msg, sizeof(msg) - 1);
    (void)n;
    cleanup();
    _exit(128 + sig);
}

/* ---- CPU time per component (/proc) --------------------------------------------------------- */

enum comp { C_PLAIN, C_INST, C_NGINX, C_REDIS, C_PG, C_RABBIT, C_LOADGEN, C_N };
static const char *const comp_name[C_N] = {"plain_serve", "instances", "nginx",         "redis",
                                           "postgresql",  "rabbitmq",  "load_generator"};

struct comp_roots {
    pid_t pid[C_N][MAX_INST];
    int n[C_N];
};

struct proc_row {
    pid_t pid, ppid;
    double own, reaped; /* utime + stime; cutime + cstime (children already waited for) */
};

static int proc_cmp(const void *a, const void *b)
{
    const struct proc_row *x = a, *y = b;
    return (x->pid > y->pid) - (x->pid < y->pid);
}

static const struct proc_row *proc_find(const struct proc_row *rows, int n, pid_t pid)
{
    struct proc_row key = {.pid = pid};
    return bsearch(&key, rows, (size_t)n, sizeof(*rows), proc_cmp);
}

/* Seconds on a CPU of every thread of pid (/proc/PID/task/TID/schedstat: nanoseconds), or
 * -1 when the kernel does not say */
static double proc_schedstat(pid_t pid)
{
    char path[64];
    double sum = 0;
    bool any = false;
    DIR *d;
    struct dirent *e;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    if (!(d = opendir(path)))
        return -1;
    while ((e = readdir(d))) {
        char p2[320];
        unsigned long long ns;
        FILE *f;
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(p2, sizeof(p2), "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
        if (!(f = fopen(p2, "r")))
            continue;
        if (fscanf(f, "%llu", &ns) == 1) {
            sum += (double)ns * 1e-9;
            any = true;
        }
        fclose(f);
    }
    closedir(d);
    return any ? sum : -1;
}

static double self_cpu(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Seconds of CPU used so far by each component: its root processes and all their descendants
 * (nginx's workers, PostgreSQL's backends), per thread from schedstat (nanoseconds) where the
 * kernel has it, else from /proc/PID/stat in clock ticks; plus what the roots have reaped.
 * The load generator is this process: read before the /proc walk when end is true, after it
 * otherwise, so that no walk falls inside a measured interval. */
static void cpu_sample(const struct comp_roots *roots, double out[C_N], bool end)
{
    static const double tick_fallback = 100;
    double tick = (double)sysconf(_SC_CLK_TCK), self = end ? self_cpu() : 0;
    struct proc_row *rows = NULL;
    int n = 0, cap = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    if (tick <= 0)
        tick = tick_fallback;
    memset(out, 0, sizeof(double) * C_N);
    while (d && (e = readdir(d))) {
        char path[300], buf[1024], *p;
        unsigned long ut, st;
        long cut, cst;
        int ppid;
        FILE *f;
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
        fclose(f);
        /* after the command name: state ppid pgrp session tty tpgid flags minflt cminflt
         * majflt cmajflt utime stime cutime cstime */
        if (!p || sscanf(p + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %ld %ld", &ppid,
                         &ut, &st, &cut, &cst) != 5)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 512;
            rows = lg_xrealloc(rows, (size_t)cap * sizeof(*rows));
        }
        rows[n].pid = (pid_t)atoi(e->d_name);
        rows[n].ppid = (pid_t)ppid;
        rows[n].own = (double)(ut + st) / tick;
        rows[n].reaped = (double)(cut + cst) / tick;
        n++;
    }
    if (d)
        closedir(d);
    qsort(rows, (size_t)n, sizeof(*rows), proc_cmp);
    for (int i = 0; i < n; i++) {
        const struct proc_row *r = &rows[i];
        for (int depth = 0; r && depth < 16; depth++) {
            for (int c = 0; c < C_N; c++)
                for (int k = 0; k < roots->n[c]; k++)
                    if (roots->pid[c][k] == r->pid) {
                        double ss = proc_schedstat(rows[i].pid);
                        out[c] += (ss >= 0 ? ss : rows[i].own) + (depth == 0 ? rows[i].reaped : 0);
                        goto next;
                    }
            r = r->ppid > 1 ? proc_find(rows, n, r->ppid) : NULL;
        }
    next:;
    }
    free(rows);
    out[C_LOADGEN] = end ? self : self_cpu();
}

/* ---- Redis INFO, PostgreSQL counters, /metrics --------------------------------------------- */

struct redis_stats {
    double cmds, hits, misses;
    bool ok;
};

static double info_field(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ':')
            return strtod(p + n + 1, NULL);
    return (double)NAN;
}

/* INFO stats over RESP on 127.0.0.1:port */
static struct redis_stats redis_stats(int port)
{
    struct redis_stats rs = {0};
    struct lg_buf in = {0};
    char buf[8192];
    long want = -1;
    double end = lg_now() + 5;
    int fd;
    if (port <= 0 || (fd = lg_connect(port, false)) < 0)
        return rs;
    if (lg_send_all(fd, "INFO stats\r\n", 12)) {
        while (lg_now() < end) {
            struct pollfd pf = {fd, POLLIN, 0};
            ssize_t n;
            if (poll(&pf, 1, 1000) <= 0)
                continue;
            if ((n = recv(fd, buf, sizeof(buf), 0)) <= 0)
                break;
            lg_buf_add(&in, buf, (size_t)n);
            if (want < 0 && in.p[0] == '$' && strstr(in.p, "\r\n"))
                want = strtol(in.p + 1, NULL, 10) + (long)(strstr(in.p, "\r\n") - in.p) + 4;
            if (want >= 0 && (long)in.len >= want)
                break;
        }
    }
    close(fd);
    if (want >= 0 && (long)in.len >= want) {
        rs.cmds = info_field(in.p, "total_commands_processed");
        rs.hits = info_field(in.p, "keyspace_hits");
        rs.misses = info_field(in.p, "keyspace_misses");
        rs.ok = !isnan(rs.cmds) && !isnan(rs.hits) && !isnan(rs.misses);
    }
    lg_buf_free(&in);
    return rs;
}

/* Read at once, unlike pg_stat_database (whose counters an idle backend may report up to
 * 10 s late): WAL bytes written so far, and the next transaction id, which only transactions
 * that write take (each a commit that waits for its WAL flush, with synchronous_commit on). */
struct pg_stats {
    double wal_bytes, next_xid;
    bool ok;
};

static struct pg_stats pg_stats(PGconn *c)
{
    struct pg_stats s = {0};
    PGresult *r;
    if (!c)
        return s;
    r = PQexec(c, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8, "
                  "txid_snapshot_xmax(txid_current_snapshot())");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        s.wal_bytes = atof(PQgetvalue(r, 0, 0));
        s.next_xid = atof(PQgetvalue(r, 0, 1));
        s.ok = true;
    }
    PQclear(r);
    return s;
}

struct engine_stats {
    double gen, prompt, prefix_hit;
};

/* token counters summed over the given instance ports */
static struct engine_stats engine_stats(const int *ports, int n)
{
    struct engine_stats es = {0};
    for (int i = 0; i < n; i++) {
        struct lg_buf m = {0};
        double v;
        if (lg_http_simple(ports[i], "GET", "/metrics", NULL, &m, 10) == 200 && m.p) {
            if (lg_metric_sum(m.p, "autoreply_generation_tokens_total", &v))
                es.gen += v;
            if (lg_metric_sum(m.p, "autoreply_prompt_tokens_total", &v))
                es.prompt += v;
            if (lg_metric_sum(m.p, "autoreply_prefix_cache_hit_tokens_total", &v))
                es.prefix_hit += v;
        }
        lg_buf_free(&m);
    }
    return es;
}

/* ---- reviews -------------------------------------------------------------------------------- */

struct review {
    char *text_json; /* owned: a JSON string literal, quotes included */
    int rating;
};

static int load_reviews(const char *path, int max, struct review **out)
{
    FILE *f = fopen(path, "rb");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0;
    struct review *rv;
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    rv = lg_xalloc((size_t)max * sizeof(*rv));
    while (n < max && (len = getline(&line, &cap, f)) > 0) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len), *text, *rating;
        if (!j)
            continue;
        text = cJSON_GetObjectItemCaseSensitive(j, "text");
        rating = cJSON_GetObjectItemCaseSensitive(j, "rating");
        if (cJSON_IsString(text) && text->valuestring[0] && strlen(text->valuestring) < 2000) {
            cJSON *s = cJSON_CreateString(text->valuestring);
            int r = cJSON_IsNumber(rating) ? rating->valueint : 5;
            rv[n].text_json = s ? cJSON_PrintUnformatted(s) : NULL;
            rv[n].rating = r < 1 ? 1 : r > 5 ? 5 : r;
            cJSON_Delete(s);
            if (rv[n].text_json)
                n++;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    *out = rv;
    return n;
}

/* ---- one request ---------------------------------------------------------------------------- */

struct inst_cap {
    char name[32];
    bool done;
};

/* Called after every read: once the head is parsed, takes X-Autoreply-Instance from it (the
 * head is still in raw at that moment: raw is only cleared by the next feed). */
static void capture_instance(void *user, struct lg_http *h)
{
    struct inst_cap *ic = user;
    const char *p, *end;
    if (ic->done || !h->status || !h->raw.p)
        return;
    ic->done = true;
    end = strstr(h->raw.p, "\r\n\r\n");
    p = strcasestr(h->raw.p, "\r\nX-Autoreply-Instance:");
    if (!p || !end || p > end)
        return;
    p += strlen("\r\nX-Autoreply-Instance:");
    while (*p == ' ')
        p++;
    size_t n = strcspn(p, "\r\n");
    snprintf(ic->name, sizeof(ic->name), "%.*s", (int)AR_MIN(n, sizeof(ic->name) - 1), p);
}

/* POST /v1/reviews/reply on *fd (connected on demand, kept alive). Returns the status (0: no
 * answer); h holds the response; inst the answering instance ("" when not said). */
static int post_reply(int port, int *fd, const struct lg_buf *req, struct lg_http *h, char inst[32])
{
    struct inst_cap ic;
    int status = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        bool fresh = *fd < 0;
        memset(&ic, 0, sizeof(ic));
        lg_http_reset(h);
        if (fresh && (*fd = lg_connect(port, false)) < 0)
            break;
        if (lg_send_all(*fd, req->p, req->len) &&
            lg_read_response(*fd, h, REQ_TIMEOUT_S, capture_instance, &ic)) {
            status = h->status;
            if (!h->keep_alive) {
                close(*fd);
                *fd = -1;
            }
            break;
        }
        close(*fd);
        *fd = -1;
        /* a kept-alive connection the server had just closed: once more on a new one */
        if (fresh || h->raw.len > 0)
            break;
    }
    snprintf(inst, 32, "%s", ic.name);
    return status;
}

/* ---- a closed-loop run ---------------------------------------------------------------------- */

enum run_kind {
    RUN_HIT,   /* texts of idx[] in turn, each under a new id */
    RUN_ONCE,  /* idx[k] once each (warm-up and its check); cached flags per request */
    RUN_UNIQUE /* review k % n with a unique suffix: every request a model miss */
};

struct run_result {
    struct lg_samples lat; /* seconds, 200 answers only */
    int n_ok, n_cached, n_uncached, n_err;
    int err_status[MAX_STATUS], err_count[MAX_STATUS];
    char inst[MAX_INST][32];
    int inst_count[MAX_INST];
    double t_start, t_last;
};

struct run {
    int port, conc, n_total; /* n_total 0: until deadline */
    double deadline;
    enum run_kind kind;
    const struct review *rv;
    int n_rv;
    const int *idx;
    int n_idx;
    char tag[48]; /* review ids: SHOP's "<tag>-<k>"; unique suffix for RUN_UNIQUE */
    int warm_per_conn;
    bool *cached_flags; /* RUN_ONCE: n_total entries */
    _Atomic int next;
};

static void result_add_error(struct run_result *r, int status)
{
    int k;
    r->n_err++;
    for (k = 0; k < MAX_STATUS && r->err_count[k] && r->err_status[k] != status; k++)
        ;
    if (k < MAX_STATUS) {
        r->err_status[k] = status;
        r->err_count[k]++;
    }
}

static void result_add_inst(struct run_result *r, const char *name, int count)
{
    int k;
    for (k = 0; k < MAX_INST && r->inst_count[k] && strcmp(r->inst[k], name); k++)
        ;
    if (k < MAX_INST) {
        snprintf(r->inst[k], sizeof(r->inst[k]), "%s", name);
        r->inst_count[k] += count;
    }
}

static void result_merge(struct run_result *into, const struct run_result *r)
{
    for (size_t i = 0; i < r->lat.n; i++)
        lg_samples_add(&into->lat, r->lat.v[i]);
    into->n_ok += r->n_ok;
    into->n_cached += r->n_cached;
    into->n_uncached += r->n_uncached;
    for (int k = 0; k < MAX_STATUS && r->err_count[k]; k++)
        for (int j = 0; j < r->err_count[k]; j++)
            result_add_error(into, r->err_status[k]);
    for (int k = 0; k < MAX_INST && r->inst_count[k]; k++)
        result_add_inst(into, r->inst[k], r->inst_count[k]);
    if (r->t_last > into->t_last)
        into->t_last = r->t_last;
}

static void make_request(const struct run *r, int k, const char *id_extra, struct lg_buf *req,
                         struct lg_buf *body)
{
    const struct review *rv;
    lg_buf_clear(body);
    lg_buf_clear(req);
    if (r->kind == RUN_UNIQUE) {
        rv = &r->rv[k % r->n_rv];
        /* the literal without its closing quote, then " #<tag>x<k>": digits and letters are
         * kept by the normalizer, so no two keys are equal */
        lg_buf_printf(body,
                      "{\"shop_id\":\"" SHOP "\",\"review_id\":\"%s%s-%d\",\"text\":%.*s #%sx%d\","
                      "\"rating\":%d}",
                      r->tag, id_extra, k, (int)strlen(rv->text_json) - 1, rv->text_json, r->tag, k,
                      rv->rating);
    } else {
        rv = &r->rv[r->idx[k % r->n_idx]];
        lg_buf_printf(body,
                      "{\"shop_id\":\"" SHOP "\",\"review_id\":\"%s%s-%d\",\"text\":%s,"
                      "\"rating\":%d}",
                      r->tag, id_extra, k, rv->text_json, rv->rating);
    }
    lg_request(req, "POST", "/v1/reviews/reply", body->p, body->len, false);
}

struct worker {
    struct run *run;
    int id;
    struct run_result res;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->run;
    struct lg_buf req = {0}, body = {0};
    struct lg_http h = {0};
    char inst[32], extra[32];
    int fd = -1;
    /* a few unrecorded requests open the connection (and nginx's to the instance) */
    snprintf(extra, sizeof(extra), "-w%d", w->id);
    for (int j = 0; j < r->warm_per_conn; j++) {
        make_request(r, j + w->id, extra, &req, &body);
        post_reply(r->port, &fd, &req, &h, inst);
    }
    for (;;) {
        int k, status;
        double t0, lat;
        if (r->n_total > 0) {
            if ((k = atomic_fetch_add(&r->next, 1)) >= r->n_total)
                break;
        } else {
            if (lg_now() >= r->deadline)
                break;
            k = atomic_fetch_add(&r->next, 1);
        }
        make_request(r, k, "", &req, &body);
        t0 = lg_now();
        status = post_reply(r->port, &fd, &req, &h, inst);
        lat = lg_now() - t0;
        w->res.t_last = lg_now();
        if (status == 200) {
            cJSON *j = cJSON_ParseWithLength(h.body.p ? h.body.p : "", h.body.len);
            cJSON *cached = j ? cJSON_GetObjectItemCaseSensitive(j, "cached") : NULL;
            if (cJSON_IsBool(cached)) {
                w->res.n_ok++;
                lg_samples_add(&w->res.lat, lat);
                if (cJSON_IsTrue(cached))
                    w->res.n_cached++;
                else
                    w->res.n_uncached++;
                if (r->cached_flags)
                    r->cached_flags[k] = cJSON_IsTrue(cached);
                result_add_inst(&w->res, inst[0] ? inst : "?", 1);
            } else {
                result_add_error(&w->res, 2); /* 200 without a usable body */
            }
            cJSON_Delete(j);
        } else {
            result_add_error(&w->res, status);
            if (status == 0)
                lg_sleep(0.05); /* no answer at all: do not spin */
        }
    }
    if (fd >= 0)
        close(fd);
    lg_buf_free(&req);
    lg_buf_free(&body);
    lg_http_free(&h);
    return NULL;
}

/* Runs r with r->conc clients; the merged result goes to out (which is added to, not reset). */
static void run_closed(struct run *r, struct run_result *out)
{
    pthread_t th[MAX_CONC];
    struct worker *w = lg_xalloc((size_t)r->conc * sizeof(*w));
    int n_th = 0;
    atomic_store(&r->next, 0);
    if (!out->t_start)
        out->t_start = lg_now();
    for (int i = 0; i < r->conc && i < MAX_CONC; i++) {
        w[i].run = r;
        w[i].id = i;
        if (pthread_create(&th[n_th], NULL, worker_main, &w[i]) == 0)
            n_th++;
    }
    for (int i = 0; i < n_th; i++) {
        pthread_join(th[i], NULL);
        result_merge(out, &w[i].res);
        lg_samples_free(&w[i].res.lat);
    }
    free(w);
}

static void result_free(struct run_result *r)
{
    lg_samples_free(&r->lat);
    memset(r, 0, sizeof(*r));
}

static void errors_str(const struct run_result *r, char *out, size_t cap)
{
    out[0] = 0;
    for (int k = 0; k < MAX_STATUS && r->err_count[k]; k++) {
        size_t l = strlen(out);
        int st = r->err_status[k];
        if (st == 0 || st == 2)
            snprintf(out + l, cap - l, "%s%s:%d", l ? " " : "", st ? "body" : "conn",
                     r->err_count[k]);
        else
            snprintf(out + l, cap - l, "%s%d:%d", l ? " " : "", st, r->err_count[k]);
    }
}

/* ---- fleets --------------------------------------------------------------------------------- */

struct fleet {
    int slot; /* index into g_fleet_dir */
    char dir[4200], log[4300];
    int port; /* nginx */
    int n_inst, threads, inst_port[MAX_INST];
    pid_t inst_pid[MAX_INST], nginx_pid, pg_pid, redis_pid, rabbit_pid;
    char pg_url[512], redis_url[512];
    int redis_port;
};

static int url_port(const char *url)
{
    const char *p = strstr(url, "://");
    p = p ? strchr(p + 3, ':') : NULL;
    while (p && strchr(p + 1, ':') && strchr(p + 1, ':') < strchr(p + 1, '/'))
        p = strchr(p + 1, ':'); /* user:pass@host:port */
    return p ? atoi(p + 1) : 0;
}

static void fleet_roots(const struct fleet *f, struct comp_roots *cr)
{
    cr->n[C_INST] = f->n_inst;
    for (int i = 0; i < f->n_inst; i++)
        cr->pid[C_INST][i] = f->inst_pid[i];
    cr->pid[C_NGINX][0] = f->nginx_pid;
    cr->n[C_NGINX] = f->nginx_pid > 0;
    cr->pid[C_REDIS][0] = f->redis_pid;
    cr->n[C_REDIS] = f->redis_pid > 0;
    cr->pid[C_PG][0] = f->pg_pid;
    cr->n[C_PG] = f->pg_pid > 0;
    cr->pid[C_RABBIT][0] = f->rabbit_pid;
    cr->n[C_RABBIT] = f->rabbit_pid > 0;
}

static void sq(struct lg_buf *b, const char *s) /* appends s quoted for sh */
{
    lg_buf_add(b, "'", 1);
    for (; *s; s++)
        if (*s == '\'')
            lg_buf_add(b, "'\\''", 4);
        else
            lg_buf_add(b, s, 1);
    lg_buf_add(b, "'", 1);
}

/* fleet.sh up with n instances of t threads, every instance with --reply-cache-mb 0; parses
 * its "NAME pid PID URL" lines. false (log shown, fleet stopped) on failure. */
static bool fleet_up_once(const struct opts *o, int slot, int attempt, int n, int threads,
                          struct fleet *f)
{
    struct lg_buf cmd = {0};
    char line[1024];
    FILE *p;
    int rc;
    memset(f, 0, sizeof(*f));
    f->slot = slot;
    f->threads = threads;
    snprintf(f->dir, sizeof(f->dir), "%s/fleet%d-%dx%d-%d", g_tmpdir, slot + 1, n, threads,
             attempt);
    snprintf(f->log, sizeof(f->log), "%s.log", f->dir);
    if (mkdir(f->dir, 0755) != 0) {
        perror(f->dir);
        return false;
    }
    f->port = lg_free_port();
    snprintf(g_fleet_dir[slot], sizeof(g_fleet_dir[slot]), "%s", f->dir);
    lg_buf_printf(&cmd, "exec /bin/sh ");
    sq(&cmd, o->fleet_sh);
    lg_buf_printf(&cmd, " up --instances %d --threads %d --port %d --dir ", n, threads, f->port);
    sq(&cmd, f->dir);
    lg_buf_printf(&cmd, " --bin ");
    sq(&cmd, o->bin);
    lg_buf_printf(&cmd, " -- -m ");
    sq(&cmd, o->model);
    lg_buf_printf(&cmd, " --reply-cache-mb 0 2>");
    sq(&cmd, f->log);
    fprintf(stderr,
            "+ fleet.sh up --instances %d --threads %d --port %d --dir %s "
            "-- -m %s --reply-cache-mb 0\n",
            n, threads, f->port, f->dir, o->model);
    fflush(NULL);
    if (!(p = popen(cmd.p, "r"))) {
        perror("popen");
        lg_buf_free(&cmd);
        return false;
    }
    while (fgets(line, sizeof(line), p)) {
        char name[64], url[512];
        int pid;
        if (sscanf(line, "%63s pid %d %511s", name, &pid, url) != 3)
            continue;
        if (!strcmp(name, "postgres")) {
            f->pg_pid = pid;
            snprintf(f->pg_url, sizeof(f->pg_url), "%s", url);
        } else if (!strcmp(name, "redis")) {
            f->redis_pid = pid;
            snprintf(f->redis_url, sizeof(f->redis_url), "%s", url);
            f->redis_port = url_port(url);
        } else if (!strcmp(name, "rabbitmq")) {
            f->rabbit_pid = pid;
        } else if (!strcmp(name, "nginx")) {
            f->nginx_pid = pid;
        } else if (name[0] == 'i' && f->n_inst < MAX_INST) {
            f->inst_pid[f->n_inst] = pid;
            f->inst_port[f->n_inst++] = url_port(url);
        }
    }
    rc = pclose(p);
    lg_buf_free(&cmd);
    if (rc != 0 || f->n_inst != n || !f->nginx_pid || !f->redis_port || !f->pg_url[0]) {
        fprintf(stderr, "fleet.sh up failed (exit status %d)\n",
                WIFEXITED(rc) ? WEXITSTATUS(rc) : rc);
        lg_print_log_tail(f->log, 3000);
        fleet_down(slot);
        return false;
    }
    return true;
}

/* fleet.sh picks its instances' ports by probing for listeners; on a busy machine another
 * program's connection can take one before the instance binds it: a second try, in a new
 * folder, gets other ports */
static bool fleet_up(const struct opts *o, int slot, int n, int threads, struct fleet *f)
{
    for (int attempt = 1; attempt <= 2; attempt++) {
        if (fleet_up_once(o, slot, attempt, n, threads, f))
            return true;
        if (attempt == 1)
            fprintf(stderr, "trying once more\n");
    }
    return false;
}

/* "sqlite" when the instance keeps replies.db in its data dir, else "postgresql" */
static const char *fleet_store_kind(const struct fleet *f, double pg_writes)
{
    char path[4400];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/i1/replies.db", f->dir);
    if (stat(path, &sb) == 0 && pg_writes < 1)
        return "sqlite";
    return pg_writes >= 1 ? "postgresql" : "unknown";
}

/* ---- part 1: a cache hit through each path ----------------------------------------------------
 */

enum setup { S_DIRECT, S_FLEET_NGINX, S_FLEET_DIRECT, S_REDIS_SQLITE, S_N };
static const char *const setup_name[S_N] = {"direct", "fleet_nginx", "fleet_instance",
                                            "redis_sqlite"};
static const char *const setup_text[S_N] = {
    "a  plain serve, direct (in-process cache, SQLite)",
    "b  fleet: nginx -> instance (Redis L2 only, PostgreSQL)",
    "c  fleet: the same instance, direct",
    "d  serve with the fleet's Redis (L2 only), SQLite, direct"};

struct hit_level {
    int conc;
    struct run_result res[S_N];
    double p50[S_N], p99[S_N], mean[S_N];
};

struct hit_out {
    int n_texts, n_levels;
    struct hit_level lv[MAX_LEVELS];
    double cpu[S_N][C_N]; /* seconds over all blocks of the setup */
    int n_hits[S_N];      /* answers counted for cpu[] (all levels) */
    double redis_cmds[S_N], redis_hits[S_N];
    double pg_writes, pg_wal; /* write transactions, WAL bytes */
    bool pg_ok, redis_ok;
    int fleet_hits; /* b + c requests answered during the blocks */
    const char *store_kind;
};

/* Sends each text of idx once under fresh ids (misses: the model answers and fills the cache)
 * and then once more; keeps in keep[] those answered from the cache the second time. */
static int warm_texts(int port, const struct review *rv, const int *idx, int n, const char *tag,
                      bool *keep)
{
    struct run r = {
        .port = port, .conc = 4, .n_total = n, .kind = RUN_ONCE, .rv = rv, .idx = idx, .n_idx = n};
    struct run_result res = {0};
    int n_keep = 0;
    bool *flags = lg_xalloc((size_t)n * sizeof(bool));
    snprintf(r.tag, sizeof(r.tag), "warm-%s", tag);
    run_closed(&r, &res);
    result_free(&res);
    snprintf(r.tag, sizeof(r.tag), "check-%s", tag);
    r.cached_flags = flags;
    run_closed(&r, &res);
    for (int i = 0; i < n; i++) {
        keep[i] = keep[i] && flags[i];
        n_keep += keep[i];
    }
    result_free(&res);
    free(flags);
    return n_keep;
}

static bool part_hits(const struct opts *o, const struct review *rv, int n_rv,
                      const int plain_port[2], const struct fleet *f,
                      const struct comp_roots *roots, PGconn *pg, struct hit_out *out)
{
    int n = AR_MIN(o->hit_texts, n_rv), *idx = lg_xalloc((size_t)n * sizeof(int)), n_idx = 0;
    bool *keep = lg_xalloc((size_t)n * sizeof(bool));
    int port[S_N] = {plain_port[0], f->port, f->inst_port[0], plain_port[1]};
    struct pg_stats pg0, pg1;
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < n; i++) {
        idx[i] = i;
        keep[i] = true;
    }
    fprintf(stderr, "warming the reply caches with %d texts (each answered once by the model)\n",
            n);
    warm_texts(port[S_DIRECT], rv, idx, n, "a", keep);
    warm_texts(port[S_FLEET_NGINX], rv, idx, n, "b", keep);
    for (int i = 0; i < n; i++)
        if (keep[i])
            idx[n_idx++] = i;
    out->n_texts = n_idx;
    if (n_idx == 0) {
        fprintf(stderr, "no text was answered from the reply cache after warm-up\n");
        free(idx);
        free(keep);
        return false;
    }
    pg0 = pg_stats(pg);
    out->n_levels = o->n_hit_levels;
    for (int li = 0; li < o->n_hit_levels; li++) {
        struct hit_level *lv = &out->lv[li];
        int per_block = AR_MAX(o->hit_requests / o->rounds, 1);
        lv->conc = o->hit_levels[li];
        fprintf(stderr, "cache hits at concurrency %d: %d rounds of %d requests per setup\n",
                lv->conc, o->rounds, per_block);
        for (int round = 0; round < o->rounds; round++)
            for (int s0 = 0; s0 < S_N; s0++) {
                int s = (s0 + round) % S_N; /* the order rotates from round to round */
                struct run r = {.port = port[s],
                                .conc = lv->conc,
                                .n_total = per_block,
                                .kind = RUN_HIT,
                                .rv = rv,
                                .idx = idx,
                                .n_idx = n_idx,
                                .warm_per_conn = 3};
                double c0[C_N], c1[C_N];
                struct redis_stats r0, r1;
                int ok0 = lv->res[s].n_cached;
                snprintf(r.tag, sizeof(r.tag), "hit-%s-c%d-r%d", setup_name[s], lv->conc, round);
                r0 = redis_stats(f->redis_port);
                cpu_sample(roots, c0, false);
                run_closed(&r, &lv->res[s]);
                cpu_sample(roots, c1, true);
                r1 = redis_stats(f->redis_port);
                for (int c = 0; c < C_N; c++)
                    out->cpu[s][c] += c1[c] - c0[c];
                /* counts include the per-connection warm requests: they are hits too */
                out->n_hits[s] += lv->res[s].n_cached - ok0 + lv->conc * r.warm_per_conn;
                if (r0.ok && r1.ok) {
                    out->redis_ok = true;
                    out->redis_cmds[s] += r1.cmds - r0.cmds - 1; /* less the first INFO */
                    out->redis_hits[s] += r1.hits - r0.hits;
                } else {
                    out->redis_ok = false;
                }
            }
        for (int s = 0; s < S_N; s++) {
            lv->p50[s] = lg_percentile(&lv->res[s].lat, 50);
            lv->p99[s] = lg_percentile(&lv->res[s].lat, 99);
            lv->mean[s] = lg_mean(&lv->res[s].lat);
        }
    }
    pg1 = pg_stats(pg);
    out->fleet_hits = out->n_hits[S_FLEET_NGINX] + out->n_hits[S_FLEET_DIRECT];
    out->pg_ok = pg0.ok && pg1.ok;
    out->pg_writes = pg1.next_xid - pg0.next_xid;
    out->pg_wal = pg1.wal_bytes - pg0.wal_bytes;
    out->store_kind = fleet_store_kind(f, out->pg_ok ? out->pg_writes : 0);
    free(idx);
    free(keep);
    return true;
}

/* ---- part 2: replies per second on model misses ------------------------------------------------
 */

struct miss_out {
    int n_inst, threads;
    struct run_result res;
    double elapsed, rps, p50, p99;
    double cpu[C_N];
    double pg_writes, pg_wal, redis_cmds;
    bool pg_ok, redis_ok;
    struct engine_stats tok;
};

struct miss_fleet {
    const struct fleet *f;
    PGconn *pg;
    struct comp_roots roots;
    struct pg_stats pg0;
    struct redis_stats r0;
    struct engine_stats e0;
};

/* The two fleets take turns in windows of seconds / windows each (A B B A A B ...), so that
 * other work on the machine weighs on both alike; each fleet's backends see only its own
 * traffic, so their counters are read once around all windows. */
static void part_misses(const struct opts *o, const struct review *rv, int n_rv,
                        struct miss_fleet *mf, int windows, struct miss_out *out)
{
    double window_s = o->miss_seconds / windows;
    for (int k = 0; k < 2; k++) {
        struct run r = {.port = mf[k].f->port,
                        .conc = o->miss_conc,
                        .kind = RUN_UNIQUE,
                        .rv = rv,
                        .n_rv = n_rv};
        struct run_result warm = {0};
        memset(&out[k], 0, sizeof(out[k]));
        out[k].n_inst = mf[k].f->n_inst;
        out[k].threads = mf[k].f->threads;
        fprintf(stderr, "model misses, %d x %d thread(s) behind nginx: %.0f s warm-up\n",
                out[k].n_inst, out[k].threads, o->miss_warm_s);
        snprintf(r.tag, sizeof(r.tag), "miss%d-warm", k);
        r.deadline = lg_now() + o->miss_warm_s;
        run_closed(&r, &warm);
        result_free(&warm);
    }
    for (int k = 0; k < 2; k++) {
        mf[k].pg0 = pg_stats(mf[k].pg);
        mf[k].r0 = redis_stats(mf[k].f->redis_port);
        mf[k].e0 = engine_stats(mf[k].f->inst_port, mf[k].f->n_inst);
    }
    fprintf(stderr,
            "model misses: %d windows of %.1f s per setup at concurrency %d, "
            "alternating\n",
            windows, window_s, o->miss_conc);
    for (int w = 0; w < 2 * windows; w++) {
        int k = (w % 4 == 0 || w % 4 == 3) ? 0 : 1; /* A B B A A B B A ... */
        struct run r = {.port = mf[k].f->port,
                        .conc = o->miss_conc,
                        .kind = RUN_UNIQUE,
                        .rv = rv,
                        .n_rv = n_rv};
        struct run_result res = {0};
        double c0[C_N], c1[C_N];
        snprintf(r.tag, sizeof(r.tag), "miss%d-w%d", k, w);
        cpu_sample(&mf[k].roots, c0, false);
        res.t_start = lg_now();
        r.deadline = res.t_start + window_s;
        run_closed(&r, &res);
        cpu_sample(&mf[k].roots, c1, true);
        for (int c = 0; c < C_N; c++)
            out[k].cpu[c] += c1[c] - c0[c];
        out[k].elapsed += res.t_last - res.t_start;
        res.t_start = 0;
        result_merge(&out[k].res, &res);
        result_free(&res);
    }
    for (int k = 0; k < 2; k++) {
        struct miss_out *x = &out[k];
        struct pg_stats pg1 = pg_stats(mf[k].pg);
        struct redis_stats r1 = redis_stats(mf[k].f->redis_port);
        struct engine_stats e1 = engine_stats(mf[k].f->inst_port, mf[k].f->n_inst);
        x->rps = x->elapsed > 0 ? x->res.n_ok / x->elapsed : 0;
        x->p50 = lg_percentile(&x->res.lat, 50);
        x->p99 = lg_percentile(&x->res.lat, 99);
        x->pg_ok = mf[k].pg0.ok && pg1.ok;
        x->pg_writes = pg1.next_xid - mf[k].pg0.next_xid;
        x->pg_wal = pg1.wal_bytes - mf[k].pg0.wal_bytes;
        x->redis_ok = mf[k].r0.ok && r1.ok;
        x->redis_cmds = r1.cmds - mf[k].r0.cmds - 1;
        x->tok.gen = e1.gen - mf[k].e0.gen;
        x->tok.prompt = e1.prompt - mf[k].e0.prompt;
        x->tok.prefix_hit = e1.prefix_hit - mf[k].e0.prefix_hit;
    }
}

/* ---- part 3: the shared servers' own capacity -------------------------------------------------
 */

struct backend_out {
    double pg_tps_c1, pg_tps_c8, redis_set, redis_get;
    char note[256];
};

/* Runs cmd (sh), returns its stdout (caller frees) or NULL. */
static char *capture(const char *cmd)
{
    struct lg_buf out = {0};
    char buf[4096];
    size_t n;
    FILE *p;
    fflush(NULL);
    if (!(p = popen(cmd, "r")))
        return NULL;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0)
        lg_buf_add(&out, buf, n);
    if (pclose(p) != 0) {
        lg_buf_free(&out);
        return NULL;
    }
    if (!out.p)
        lg_buf_add(&out, "", 0);
    return out.p;
}

static double pgbench_tps(const char *url, const char *script, int clients, int seconds)
{
    struct lg_buf cmd = {0};
    char *out, *p;
    double tps = (double)NAN;
    lg_buf_printf(&cmd, "pgbench -n -f ");
    sq(&cmd, script);
    lg_buf_printf(&cmd, " -c %d -j %d -T %d ", clients, AR_MIN(clients, 2), seconds);
    sq(&cmd, url);
    lg_buf_printf(&cmd, " 2>/dev/null");
    fprintf(stderr, "+ pgbench -n -f %s -c %d -j %d -T %d %s\n", script, clients,
            AR_MIN(clients, 2), seconds, url);
    out = capture(cmd.p);
    if (out && (p = strstr(out, "tps = ")))
        tps = strtod(p + 6, NULL);
    free(out);
    lg_buf_free(&cmd);
    return tps;
}

static void part_backends(const struct fleet *f, PGconn *pg, struct backend_out *out)
{
    static const char *const create =
        "DROP TABLE IF EXISTS fleet_bench_reply; "
        "CREATE TABLE fleet_bench_reply (shop_id text NOT NULL, review_id text NOT NULL, "
        "reply text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (shop_id, review_id))";
    char script[4200];
    FILE *sf;
    PGresult *r;
    struct lg_buf cmd = {0};
    char *csv;
    memset(out, 0, sizeof(*out));
    out->pg_tps_c1 = out->pg_tps_c8 = out->redis_set = out->redis_get = (double)NAN;
    snprintf(script, sizeof(script), "%s/insert.sql", g_tmpdir);
    /* one reply row of a realistic size per transaction, commit as PostgreSQL's defaults
     * (synchronous_commit on, fsync on: what the fleet's store gets) */
    if ((sf = fopen(script, "w"))) {
        fprintf(sf, "\\set shop random(1, 100000)\n"
                    "INSERT INTO fleet_bench_reply (shop_id, review_id, reply) VALUES "
                    "('s' || :shop, md5(random()::text || clock_timestamp()::text), "
                    "repeat('x', 300));\n");
        fclose(sf);
    }
    r = PQexec(pg, create);
    if (PQresultStatus(r) == PGRES_COMMAND_OK && access("/usr/bin/pgbench", X_OK) == 0) {
        out->pg_tps_c1 = pgbench_tps(f->pg_url, script, 1, 4);
        out->pg_tps_c8 = pgbench_tps(f->pg_url, script, 8, 5);
    } else {
        snprintf(out->note, sizeof(out->note), "pgbench not run (%s); ",
                 PQresultStatus(r) == PGRES_COMMAND_OK ? "not installed" : PQerrorMessage(pg));
    }
    PQclear(r);
    PQclear(PQexec(pg, "DROP TABLE IF EXISTS fleet_bench_reply"));
    if (access("/usr/bin/redis-benchmark", X_OK) == 0) {
        /* 400-byte values (a reply and its fields), 16 connections, no pipelining */
        lg_buf_printf(&cmd,
                      "redis-benchmark -h 127.0.0.1 -p %d -c 16 -n 200000 -d 400 -r 100000 "
                      "-t set,get --csv 2>/dev/null",
                      f->redis_port);
        fprintf(stderr, "+ %s\n", cmd.p);
        if ((csv = capture(cmd.p))) {
            const char *p;
            if ((p = strstr(csv, "\"SET\",\"")))
                out->redis_set = strtod(p + 7, NULL);
            if ((p = strstr(csv, "\"GET\",\"")))
                out->redis_get = strtod(p + 7, NULL);
            free(csv);
        }
    } else {
        size_t l = strlen(out->note);
        snprintf(out->note + l, sizeof(out->note) - l, "redis-benchmark not installed");
    }
    lg_buf_free(&cmd);
}

/* ---- report --------------------------------------------------------------------------------- */

static void cpu_model(char *out, size_t cap)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, cap, "unknown");
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            char *v = strchr(line, ':') + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            v[strcspn(v, "\n")] = 0;
            snprintf(out, cap, "%s", v);
            break;
        }
    if (f)
        fclose(f);
}

static double us_per(double seconds, int n)
{
    return n > 0 ? seconds * 1e6 / n : (double)NAN;
}

static const char *met(bool ok)
{
    return ok ? "met" : "NOT met";
}

/* `autoreply serve -t 2` on a free port with its data in the temporary folder; with
 * redis_url, that Redis is its only reply cache (--cache URL --reply-cache-mb 0) */
static bool plain_start(const struct opts *o, int k, const char *redis_url, struct lg_server *srv)
{
    char port_s[16], thr[16], data_dir[1024], log_path[1024], name[16];
    char *sargv[24];
    int n = lg_serve_argv(sargv, o->bin, o->model, lg_free_port(), port_s, 2, thr);
    snprintf(name, sizeof(name), "plain%d", k + 1);
    snprintf(data_dir, sizeof(data_dir), "%s/%s", g_tmpdir, name);
    snprintf(log_path, sizeof(log_path), "%s/%s.log", g_tmpdir, name);
    sargv[n++] = "--data-dir";
    sargv[n++] = data_dir;
    sargv[n++] = "--instance-name";
    sargv[n++] = name;
    if (redis_url) {
        sargv[n++] = "--cache";
        sargv[n++] = lg_unconst(redis_url);
        sargv[n++] = "--reply-cache-mb";
        sargv[n++] = "0";
    }
    sargv[n] = NULL;
    lg_print_cmd(stderr, "+ ", sargv);
    if (!lg_server_start(srv, sargv, atoi(port_s), g_tmpdir, log_path, 120))
        return false;
    atomic_store(&g_plain_pid[k], srv->pid);
    return true;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: fleet [-m MODEL] [--bin ./bin/autoreply] [--fleet-sh deploy/fleet.sh]\n"
               "             [--reviews ../shared/data/reviews-sample.jsonl] [--json] [--keep]\n"
               "             [--hit-requests 3000] [--hit-levels 1,4] [--hit-texts 200] "
               "[--rounds 6]\n"
               "             [--miss-seconds 20] [--windows 4] [--miss-warm 3] [--miss-conc 16]\n"
               "             [--no-backend-bench] [--pg-async-commit]\n");
}

static cJSON *json_cpu(const double cpu[C_N], int n, bool ms)
{
    cJSON *o = cJSON_CreateObject();
    /* components the requests did not reach (a few µs of background) are left out */
    for (int c = 0; c < C_N; c++)
        if (n > 0 && cpu[c] * 1e6 / n >= 0.5)
            cJSON_AddNumberToObject(o, comp_name[c], cpu[c] * (ms ? 1e3 : 1e6) / n);
    return o;
}

int main(int argc, char **argv)
{
    struct opts o = {.bin = "./bin/autoreply",
                     .model = "models/autoreply-demo-q8_0.gguf",
                     .reviews_path = "../shared/data/reviews-sample.jsonl",
                     .fleet_sh = "deploy/fleet.sh",
                     .hit_requests = 3000,
                     .hit_texts = 200,
                     .rounds = 6,
                     .hit_levels = {1, 4},
                     .n_hit_levels = 2,
                     .miss_seconds = 20,
                     .miss_warm_s = 3,
                     .miss_conc = 16,
                     .windows = 4,
                     .backend_bench = true};
    struct review *rv = NULL;
    int n_rv = 0;
    char cpu[256], *bin_abs = NULL, *model_abs = NULL, *fleet_abs = NULL;
    struct lg_server plain[2];
    struct fleet fl[2];
    struct miss_fleet mf[2];
    PGconn *pgc[2] = {NULL, NULL};
    struct comp_roots roots = {0};
    struct hit_out hit = {0};
    struct miss_out miss[2] = {0};
    struct backend_out be;
    char sync_commit[16] = "?";
    double load0, t_begin = lg_now();
    bool ok = false, have_be = false;
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            LG_NEEDV();
            o.model = v;
        } else if (!strcmp(a, "--bin")) {
            LG_NEEDV();
            o.bin = v;
        } else if (!strcmp(a, "--fleet-sh")) {
            LG_NEEDV();
            o.fleet_sh = v;
        } else if (!strcmp(a, "--reviews")) {
            LG_NEEDV();
            o.reviews_path = v;
        } else if (!strcmp(a, "--hit-requests")) {
            LG_NEEDV();
            o.hit_requests = atoi(v);
        } else if (!strcmp(a, "--hit-levels")) {
            LG_NEEDV();
            if ((o.n_hit_levels = lg_parse_int_list(v, o.hit_levels, MAX_LEVELS)) <= 0) {
                fprintf(stderr, "--hit-levels: a list like 1,4\n");
                return 2;
            }
        } else if (!strcmp(a, "--hit-texts")) {
            LG_NEEDV();
            o.hit_texts = atoi(v);
        } else if (!strcmp(a, "--rounds")) {
            LG_NEEDV();
            o.rounds = atoi(v);
        } else if (!strcmp(a, "--miss-seconds")) {
            LG_NEEDV();
            o.miss_seconds = atof(v);
        } else if (!strcmp(a, "--miss-warm")) {
            LG_NEEDV();
            o.miss_warm_s = atof(v);
        } else if (!strcmp(a, "--miss-conc")) {
            LG_NEEDV();
            o.miss_conc = atoi(v);
        } else if (!strcmp(a, "--windows")) {
            LG_NEEDV();
            o.windows = atoi(v);
        } else if (!strcmp(a, "--pg-async-commit")) {
            o.pg_async = true;
        } else if (!strcmp(a, "--no-backend-bench")) {
            o.backend_bench = false;
        } else if (!strcmp(a, "--json")) {
            o.json = true;
        } else if (!strcmp(a, "--keep")) {
            o.keep = true;
        } else {
            fprintf(stderr, "unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (o.hit_requests < 1 || o.hit_requests > 1000000 || o.hit_texts < 1 || o.hit_texts > 100000 ||
        o.rounds < 1 || o.rounds > 1000 || o.miss_seconds <= 0 || o.miss_seconds > 3600 ||
        o.miss_warm_s < 0 || o.miss_warm_s > 600 || o.miss_conc < 1 || o.miss_conc > MAX_CONC ||
        o.windows < 1 || o.windows > 100) {
        fprintf(stderr, "an option is out of range\n");
        return 2;
    }
    for (int i = 0; i < o.n_hit_levels; i++)
        if (o.hit_levels[i] > MAX_CONC) {
            fprintf(stderr, "--hit-levels: at most %d\n", MAX_CONC);
            return 2;
        }
    bin_abs = realpath(o.bin, NULL);
    model_abs = realpath(o.model, NULL);
    fleet_abs = realpath(o.fleet_sh, NULL);
    if (!bin_abs || !model_abs || !fleet_abs) {
        fprintf(stderr, "%s: not found\n", !bin_abs ? o.bin : !model_abs ? o.model : o.fleet_sh);
        goto out;
    }
    o.bin = bin_abs;
    o.model = model_abs;
    o.fleet_sh = fleet_abs;
    snprintf(g_fleet_sh, sizeof(g_fleet_sh), "%s", fleet_abs);
    if ((n_rv = load_reviews(o.reviews_path, 20000, &rv)) < 1) {
        fprintf(stderr, "%s: no reviews\n", o.reviews_path);
        goto out;
    }
    if (!mkdtemp(g_tmpdir)) {
        perror("mkdtemp");
        goto out;
    }
    chmod(g_tmpdir, 0755); /* the servers' users and nginx's workers look inside */
    g_have_tmpdir = true;
    g_keep = o.keep;
    atexit(cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    cpu_model(cpu, sizeof(cpu));
    load0 = lg_loadavg();

    /* A: one instance of 2 threads, as the plain server (b, c and the 1 x 2 misses);
     * B: two instances of 1 thread (the 2 x 1 misses). Both stay up, so that the miss
     * windows can alternate between them. */
    if (!fleet_up(&o, 0, 1, 2, &fl[0]) || !fleet_up(&o, 1, 2, 1, &fl[1]))
        goto out;
    for (int k = 0; k < 2; k++) {
        mf[k].f = &fl[k];
        fleet_roots(&fl[k], &mf[k].roots);
        if (PQstatus(pgc[k] = PQconnectdb(fl[k].pg_url)) != CONNECTION_OK) {
            fprintf(stderr, "%s: %s", fl[k].pg_url, PQerrorMessage(pgc[k]));
            goto out;
        }
        mf[k].pg = pgc[k];
        /* an experiment: what the WAL flush of each commit costs the request path */
        if (o.pg_async) {
            PQclear(PQexec(pgc[k], "ALTER SYSTEM SET synchronous_commit = off"));
            PQclear(PQexec(pgc[k], "SELECT pg_reload_conf()"));
            lg_sleep(0.5);
        }
        {
            PGresult *r = PQexec(pgc[k], "SHOW synchronous_commit");
            if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
                snprintf(sync_commit, sizeof(sync_commit), "%s", PQgetvalue(r, 0, 0));
            PQclear(r);
        }
    }
    /* a: a plain server; d: one with fleet A's Redis as its only reply cache */
    if (!plain_start(&o, 0, NULL, &plain[0]) || !plain_start(&o, 1, fl[0].redis_url, &plain[1]))
        goto out;
    roots = mf[0].roots;
    roots.pid[C_PLAIN][0] = plain[0].pid;
    roots.pid[C_PLAIN][1] = plain[1].pid;
    roots.n[C_PLAIN] = 2;
    {
        int plain_port[2] = {plain[0].port, plain[1].port};
        if (!part_hits(&o, rv, n_rv, plain_port, &fl[0], &roots, pgc[0], &hit))
            goto out;
    }
    plain_stop(0);
    plain_stop(1);
    part_misses(&o, rv, n_rv, mf, o.windows, miss);
    if (o.backend_bench) {
        part_backends(&fl[0], pgc[0], &be);
        have_be = true;
    }
    for (int k = 0; k < 2; k++) {
        PQfinish(pgc[k]);
        pgc[k] = NULL;
        if (fleet_down(k) != 0)
            fprintf(stderr, "fleet.sh down reported a failure (%s)\n", fl[k].dir);
    }
    ok = true;

    {
        /* miss[0]: 1 x 2, miss[1]: 2 x 1 */
        double ratio = miss[0].rps > 0 ? miss[1].rps / miss[0].rps : (double)NAN;
        const struct hit_level *l1 = &hit.lv[0];
        double added50 = (l1->p50[S_FLEET_NGINX] - l1->p50[S_DIRECT]) * 1e3;
        double added99 = (l1->p99[S_FLEET_NGINX] - l1->p99[S_DIRECT]) * 1e3;
        if (o.json) {
            cJSON *j = cJSON_CreateObject(), *h, *levels, *cpuj, *m, *cfgs;
            cJSON_AddStringToObject(j, "bench", "fleet");
            cJSON_AddStringToObject(j, "cpu_model", cpu);
            cJSON_AddNumberToObject(j, "n_cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
            cJSON_AddNumberToObject(j, "loadavg_before", load0);
            cJSON_AddNumberToObject(j, "loadavg_after", lg_loadavg());
            cJSON_AddNumberToObject(j, "runtime_s", lg_now() - t_begin);
            cJSON_AddStringToObject(j, "fleet_store", hit.store_kind);
            cJSON_AddStringToObject(j, "pg_synchronous_commit", sync_commit);
            h = cJSON_AddObjectToObject(j, "hit");
            levels = cJSON_AddArrayToObject(h, "levels");
            m = cJSON_AddObjectToObject(j, "miss");
            cJSON_AddNumberToObject(h, "hit_texts", hit.n_texts);
            for (int li = 0; li < hit.n_levels; li++) {
                const struct hit_level *lv = &hit.lv[li];
                cJSON *l = cJSON_CreateObject();
                cJSON_AddNumberToObject(l, "conc", lv->conc);
                for (int s = 0; s < S_N; s++) {
                    cJSON *x = cJSON_AddObjectToObject(l, setup_name[s]);
                    char errs[128];
                    cJSON_AddNumberToObject(x, "requests", lv->res[s].n_ok + lv->res[s].n_err);
                    cJSON_AddNumberToObject(x, "cached", lv->res[s].n_cached);
                    cJSON_AddNumberToObject(x, "not_cached", lv->res[s].n_uncached);
                    cJSON_AddNumberToObject(x, "errors", lv->res[s].n_err);
                    errors_str(&lv->res[s], errs, sizeof(errs));
                    cJSON_AddStringToObject(x, "error_kinds", errs);
                    cJSON_AddNumberToObject(x, "p50_ms", lv->p50[s] * 1e3);
                    cJSON_AddNumberToObject(x, "p99_ms", lv->p99[s] * 1e3);
                    cJSON_AddNumberToObject(x, "mean_ms", lv->mean[s] * 1e3);
                }
                cJSON_AddNumberToObject(l, "added_p50_ms",
                                        (lv->p50[S_FLEET_NGINX] - lv->p50[S_DIRECT]) * 1e3);
                cJSON_AddNumberToObject(l, "added_p99_ms",
                                        (lv->p99[S_FLEET_NGINX] - lv->p99[S_DIRECT]) * 1e3);
                cJSON_AddNumberToObject(l, "nginx_p50_ms",
                                        (lv->p50[S_FLEET_NGINX] - lv->p50[S_FLEET_DIRECT]) * 1e3);
                cJSON_AddNumberToObject(l, "redis_and_store_p50_ms",
                                        (lv->p50[S_FLEET_DIRECT] - lv->p50[S_DIRECT]) * 1e3);
                cJSON_AddNumberToObject(l, "postgresql_over_sqlite_p50_ms",
                                        (lv->p50[S_FLEET_DIRECT] - lv->p50[S_REDIS_SQLITE]) * 1e3);
                cJSON_AddNumberToObject(l, "redis_over_in_process_p50_ms",
                                        (lv->p50[S_REDIS_SQLITE] - lv->p50[S_DIRECT]) * 1e3);
                cJSON_AddItemToArray(levels, l);
            }
            cpuj = cJSON_AddObjectToObject(h, "cpu_us_per_hit");
            for (int s = 0; s < S_N; s++)
                cJSON_AddItemToObject(cpuj, setup_name[s],
                                      json_cpu(hit.cpu[s], hit.n_hits[s], false));
            if (hit.redis_ok) {
                cJSON_AddNumberToObject(
                    h, "redis_cmds_per_fleet_hit",
                    (hit.redis_cmds[S_FLEET_NGINX] + hit.redis_cmds[S_FLEET_DIRECT]) /
                        AR_MAX(hit.fleet_hits, 1));
                cJSON_AddNumberToObject(
                    h, "redis_keyspace_hits_per_fleet_hit",
                    (hit.redis_hits[S_FLEET_NGINX] + hit.redis_hits[S_FLEET_DIRECT]) /
                        AR_MAX(hit.fleet_hits, 1));
            }
            if (hit.pg_ok) {
                cJSON_AddNumberToObject(h, "pg_write_transactions_per_fleet_hit",
                                        hit.pg_writes / AR_MAX(hit.fleet_hits, 1));
                cJSON_AddNumberToObject(h, "pg_wal_bytes_per_fleet_hit",
                                        hit.pg_wal / AR_MAX(hit.fleet_hits, 1));
            }
            cJSON_AddNumberToObject(h, "target_added_p50_ms", 0.5);
            cJSON_AddBoolToObject(h, "target_met", added50 < 0.5);
            cJSON_AddNumberToObject(m, "conc", o.miss_conc);
            cJSON_AddNumberToObject(m, "seconds", o.miss_seconds);
            cfgs = cJSON_AddArrayToObject(m, "configs");
            for (int k = 0; k < 2; k++) {
                const struct miss_out *x = &miss[k];
                cJSON *c = cJSON_CreateObject(), *pi;
                char errs[128];
                int n = AR_MAX(x->res.n_ok, 1);
                cJSON_AddNumberToObject(c, "instances", x->n_inst);
                cJSON_AddNumberToObject(c, "threads", x->threads);
                cJSON_AddNumberToObject(c, "replies", x->res.n_ok);
                cJSON_AddNumberToObject(c, "cached", x->res.n_cached);
                cJSON_AddNumberToObject(c, "errors", x->res.n_err);
                errors_str(&x->res, errs, sizeof(errs));
                cJSON_AddStringToObject(c, "error_kinds", errs);
                cJSON_AddNumberToObject(c, "elapsed_s", x->elapsed);
                cJSON_AddNumberToObject(c, "replies_per_s", x->rps);
                cJSON_AddNumberToObject(c, "p50_ms", x->p50 * 1e3);
                cJSON_AddNumberToObject(c, "p99_ms", x->p99 * 1e3);
                pi = cJSON_AddObjectToObject(c, "per_instance");
                for (int i = 0; i < MAX_INST && x->res.inst_count[i]; i++)
                    cJSON_AddNumberToObject(pi, x->res.inst[i], x->res.inst_count[i]);
                cJSON_AddItemToObject(c, "cpu_ms_per_reply", json_cpu(x->cpu, x->res.n_ok, true));
                cJSON_AddNumberToObject(c, "generated_tokens_per_reply", x->tok.gen / n);
                cJSON_AddNumberToObject(c, "prompt_tokens_per_reply", x->tok.prompt / n);
                cJSON_AddNumberToObject(c, "prefix_cached_tokens_per_reply", x->tok.prefix_hit / n);
                if (x->pg_ok) {
                    cJSON_AddNumberToObject(c, "pg_write_transactions_per_reply", x->pg_writes / n);
                    cJSON_AddNumberToObject(c, "pg_wal_bytes_per_reply", x->pg_wal / n);
                }
                if (x->redis_ok)
                    cJSON_AddNumberToObject(c, "redis_cmds_per_reply", x->redis_cmds / n);
                cJSON_AddItemToArray(cfgs, c);
            }
            cJSON_AddNumberToObject(m, "ratio_2x1_over_1x2", ratio);
            if (have_be) {
                cJSON *b = cJSON_AddObjectToObject(j, "backends");
                cJSON_AddNumberToObject(b, "pg_insert_tps_1_client", be.pg_tps_c1);
                cJSON_AddNumberToObject(b, "pg_insert_tps_8_clients", be.pg_tps_c8);
                cJSON_AddNumberToObject(b, "redis_set_per_s", be.redis_set);
                cJSON_AddNumberToObject(b, "redis_get_per_s", be.redis_get);
                if (be.note[0])
                    cJSON_AddStringToObject(b, "note", be.note);
            }
            char *s = cJSON_Print(j);
            printf("%s\n", s);
            cJSON_free(s);
            cJSON_Delete(j);
        } else {
            printf("\nfleet benchmark: %s, %ld CPUs, model %s\n", cpu,
                   sysconf(_SC_NPROCESSORS_ONLN), o.model);
            printf("(1-minute load average before %.2f, after %.2f: other work on the machine "
                   "skews the figures; run time %.0f s)\n",
                   load0, lg_loadavg(), lg_now() - t_begin);
            printf("\n1. reply-cache hit (known text, new review id: the reply is stored under "
                   "the new id)\n   %d texts, closed loop, keep-alive, setups in alternating "
                   "blocks; fleet store: %s (synchronous_commit %s)\n",
                   hit.n_texts, hit.store_kind, sync_commit);
            for (int li = 0; li < hit.n_levels; li++) {
                const struct hit_level *lv = &hit.lv[li];
                printf("\n   concurrency %d        %8s %8s %8s %7s %7s  %s\n", lv->conc, "p50",
                       "p99", "mean", "hits", "other", "errors");
                for (int s = 0; s < S_N; s++) {
                    char errs[128];
                    errors_str(&lv->res[s], errs, sizeof(errs));
                    printf("   %-58s %6.3fms %6.3fms %6.3fms %7d %7d  %s\n", setup_text[s],
                           lv->p50[s] * 1e3, lv->p99[s] * 1e3, lv->mean[s] * 1e3,
                           lv->res[s].n_cached, lv->res[s].n_uncached, errs);
                }
                printf("   added by the fleet (b - a): p50 %+.3f ms, p99 %+.3f ms; of it at p50: "
                       "nginx (b - c) %+.3f ms, PostgreSQL instead of SQLite (c - d) %+.3f ms, "
                       "Redis instead of in-process (d - a) %+.3f ms\n",
                       (lv->p50[S_FLEET_NGINX] - lv->p50[S_DIRECT]) * 1e3,
                       (lv->p99[S_FLEET_NGINX] - lv->p99[S_DIRECT]) * 1e3,
                       (lv->p50[S_FLEET_NGINX] - lv->p50[S_FLEET_DIRECT]) * 1e3,
                       (lv->p50[S_FLEET_DIRECT] - lv->p50[S_REDIS_SQLITE]) * 1e3,
                       (lv->p50[S_REDIS_SQLITE] - lv->p50[S_DIRECT]) * 1e3);
            }
            printf("\n   CPU per hit (µs, every thread's run time from /proc; includes the "
                   "other work each process does meanwhile):\n");
            for (int s = 0; s < S_N; s++) {
                printf("     %-15s", setup_name[s]);
                for (int c = 0; c < C_N; c++)
                    if (us_per(hit.cpu[s][c], hit.n_hits[s]) >= 0.5)
                        printf("  %s %.0f", comp_name[c], us_per(hit.cpu[s][c], hit.n_hits[s]));
                printf("\n");
            }
            if (hit.redis_ok)
                printf("   Redis per fleet hit: %.2f commands, %.2f keyspace hits\n",
                       (hit.redis_cmds[S_FLEET_NGINX] + hit.redis_cmds[S_FLEET_DIRECT]) /
                           AR_MAX(hit.fleet_hits, 1),
                       (hit.redis_hits[S_FLEET_NGINX] + hit.redis_hits[S_FLEET_DIRECT]) /
                           AR_MAX(hit.fleet_hits, 1));
            if (hit.pg_ok)
                printf("   PostgreSQL per fleet hit: %.2f write transactions, %.0f WAL bytes\n",
                       hit.pg_writes / AR_MAX(hit.fleet_hits, 1),
                       hit.pg_wal / AR_MAX(hit.fleet_hits, 1));
            printf("\n2. model misses (unique texts), closed loop at concurrency %d, %.0f s, "
                   "behind nginx\n",
                   o.miss_conc, o.miss_seconds);
            printf("   %-22s %9s %8s %8s %8s  %-22s %s\n", "setup", "replies/s", "p50", "p99",
                   "errors", "per instance", "CPU ms per reply");
            for (int k = 0; k < 2; k++) {
                const struct miss_out *x = &miss[k];
                char name[32], pi[128] = "", errs[128];
                int n = AR_MAX(x->res.n_ok, 1);
                snprintf(name, sizeof(name), "%d instance%s x %d thread%s", x->n_inst,
                         x->n_inst > 1 ? "s" : "", x->threads, x->threads > 1 ? "s" : "");
                for (int i = 0; i < MAX_INST && x->res.inst_count[i]; i++) {
                    size_t l = strlen(pi);
                    snprintf(pi + l, sizeof(pi) - l, "%s%s:%d", l ? " " : "", x->res.inst[i],
                             x->res.inst_count[i]);
                }
                errors_str(&x->res, errs, sizeof(errs));
                printf("   %-22s %9.1f %6.1fms %6.1fms %8d  %-22s", name, x->rps, x->p50 * 1e3,
                       x->p99 * 1e3, x->res.n_err, pi);
                for (int c = 0; c < C_N; c++)
                    if (x->cpu[c] * 1e3 / n >= 0.005)
                        printf(" %s %.2f", comp_name[c], x->cpu[c] * 1e3 / n);
                printf("\n     tokens per reply: %.1f generated, %.1f prompt (%.1f from the "
                       "prefix cache)",
                       x->tok.gen / n, x->tok.prompt / n, x->tok.prefix_hit / n);
                if (x->pg_ok)
                    printf("; PostgreSQL %.2f write transactions, %.0f WAL bytes", x->pg_writes / n,
                           x->pg_wal / n);
                if (x->redis_ok)
                    printf("; Redis %.2f commands", x->redis_cmds / n);
                printf("%s%s\n", errs[0] ? "; errors " : "", errs);
            }
            printf("   2 x 1 / 1 x 2: %.2fx\n", ratio);
            if (have_be) {
                printf("\n3. the fleet's own servers on this machine\n");
                printf("   PostgreSQL single-row INSERT, one commit each (pgbench): %.0f/s with "
                       "1 client, %.0f/s with 8\n",
                       be.pg_tps_c1, be.pg_tps_c8);
                printf("   Redis with 400-byte values, 16 connections (redis-benchmark): SET "
                       "%.0f/s, GET %.0f/s\n",
                       be.redis_set, be.redis_get);
                if (be.note[0])
                    printf("   (%s)\n", be.note);
            }
            printf("\ntarget:\n  cache hit, fleet (nginx + Redis + store) over direct in-process, "
                   "concurrency %d: p50 %+.3f ms, p99 %+.3f ms   (target p50 < 0.5 ms: %s)\n",
                   l1->conc, added50, added99, met(added50 < 0.5));
        }
    }
    rc = 0;
out:
    if (!ok)
        fprintf(stderr, "fleet bench: failed; stopping what it started%s\n",
                o.keep ? " (logs kept)" : "");
    for (int k = 0; k < 2; k++)
        if (pgc[k])
            PQfinish(pgc[k]);
    if (g_have_tmpdir && o.keep)
        fprintf(stderr, "logs and data kept in %s\n", g_tmpdir);
    cleanup();
    for (int li = 0; li < MAX_LEVELS; li++)
        for (int s = 0; s < S_N; s++)
            result_free(&hit.lv[li].res[s]);
    for (int k = 0; k < 2; k++)
        result_free(&miss[k].res);
    for (int i = 0; rv && i < n_rv; i++)
        free(rv[i].text_json);
    free(rv);
    free(bin_abs);
    free(model_abs);
    free(fleet_abs);
    return rc;
}
