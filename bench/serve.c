/* serve.c - serving-engine benchmark (closed loop). Starts `autoreply serve` on a model as a
 * child process on a free loopback port, then runs closed-loop clients at several concurrency
 * levels (each client sends its next request when the previous answer has arrived), every
 * request a shared system prefix plus a distinct "review" part given as token ids, asking for
 * exactly --gen generated tokens (ignore_eos) with SSE streaming. Prints per level the generated
 * tokens/s, latency and time-to-first-token percentiles; then TTFT at concurrency 1 with the
 * prefix cache on against a server started with --no-prefix-cache, and the engine's overhead
 * (busy time / forward time - 1) when /metrics exposes both.
 * Random-weight models from `autoreply gen-model` carry a synthetic vocabulary; prompts are
 * token ids, so its content does not matter. */
#include <pthread.h>
#include <stdatomic.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "loadgen.h"

#define MAX_LEVELS 16
#define MAX_STATUS 8
#define REQ_TIMEOUT_S 600.0
/* prompt ids are drawn from [id_lo, id_hi): normal tokens of the model's vocabulary */
static int id_lo = 300, id_hi = 5900;

struct opts {
    const char *model, *bin;
    int levels[MAX_LEVELS], n_levels;
    int requests; /* per level, all clients together; 0: time-based */
    double seconds;
    int threads, parallel, kv_size;
    int prefix_tokens, review_tokens, gen;
    int ttft_requests;
    float temperature;
    bool json, skip_prefix_compare;
};

/* ---- one streamed completion ------------------------------------------------------------ */

struct result {
    int status;     /* HTTP status; 0: no answer (connection error or timeout) */
    double latency; /* send -> last byte */
    double ttft;    /* send -> first chunk with generated text (0: none) */
    int n_gen, n_prompt, n_cached;
    bool stream_error;
};

struct sse_scan {
    double t0;
    size_t scanned;
    struct result *res;
};

static void sse_event(struct sse_scan *sc, const char *data, size_t len)
{
    cJSON *j, *ch, *u;
    if (len == 6 && !memcmp(data, "[DONE]", 6))
        return;
    if (!(j = cJSON_ParseWithLength(data, len)))
        return;
    if (cJSON_GetObjectItemCaseSensitive(j, "error"))
        sc->res->stream_error = true;
    ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    if (cJSON_IsArray(ch) && cJSON_GetArraySize(ch) > 0 && sc->res->ttft == 0) {
        cJSON *c0 = cJSON_GetArrayItem(ch, 0), *t = cJSON_GetObjectItemCaseSensitive(c0, "text");
        cJSON *d = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        if (!t && d)
            t = cJSON_GetObjectItemCaseSensitive(d, "content");
        if (cJSON_IsString(t) && t->valuestring[0])
            sc->res->ttft = lg_now() - sc->t0;
    }
    u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(u)) {
        cJSON *x = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        cJSON *det = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
        cJSON *ct = det ? cJSON_GetObjectItemCaseSensitive(det, "cached_tokens") : NULL;
        if (cJSON_IsNumber(x))
            sc->res->n_gen = x->valueint;
        if (cJSON_IsNumber(pt))
            sc->res->n_prompt = pt->valueint;
        if (cJSON_IsNumber(ct))
            sc->res->n_cached = ct->valueint;
    }
    cJSON_Delete(j);
}

/* Walks the complete SSE events ("...\n\n") not seen yet. */
static void sse_on_data(void *user, struct lg_http *h)
{
    struct sse_scan *sc = user;
    const char *b = h->body.p;
    if (h->status != 200 || !b)
        return;
    for (;;) {
        const char *ev = b + sc->scanned, *end = NULL;
        for (size_t i = sc->scanned; i + 1 < h->body.len; i++)
            if (b[i] == '\n' && b[i + 1] == '\n') {
                end = b + i;
                break;
            }
        if (!end)
            return;
        for (const char *line = ev; line < end;) {
            const char *eol = memchr(line, '\n', (size_t)(end - line));
            if (!eol)
                eol = end;
            if ((size_t)(eol - line) >= 6 && !memcmp(line, "data: ", 6))
                sse_event(sc, line + 6, (size_t)(eol - line - 6));
            line = eol + 1;
        }
        sc->scanned = (size_t)(end - b) + 2;
    }
}

/* Body of a /v1/completions request: prefix ids (shared) + review ids drawn from seed. */
static void make_body(struct lg_buf *out, const int32_t *prefix, int n_prefix, int n_review,
                      uint64_t seed, int gen, float temperature)
{
    lg_buf_clear(out);
    lg_buf_printf(out, "{\"prompt\":[");
    for (int i = 0; i < n_prefix; i++)
        lg_buf_printf(out, "%s%d", i ? "," : "", prefix[i]);
    for (int i = 0; i < n_review; i++)
        lg_buf_printf(out, "%s%d", n_prefix + i ? "," : "",
                      id_lo + (int)(ar_splitmix64(&seed) % (uint64_t)(id_hi - id_lo)));
    lg_buf_printf(out,
                  "],\"max_tokens\":%d,\"temperature\":%g,\"ignore_eos\":true,\"stream\":true,"
                  "\"stream_options\":{\"include_usage\":true}}",
                  gen, (double)temperature);
}

/* One request on *fd (connected on demand; closed when the server will not keep it). */
static void do_request(int port, int *fd, const char *body, size_t body_len, struct result *res)
{
    struct lg_buf req = {0};
    struct lg_http h = {0};
    struct sse_scan sc = {0};
    bool ok;
    memset(res, 0, sizeof(*res));
    lg_http_reset(&h);
    lg_request(&req, "POST", "/v1/completions", body, body_len, false);
    for (int attempt = 0; attempt < 2; attempt++) {
        bool fresh = *fd < 0;
        if (fresh && (*fd = lg_connect(port, false)) < 0)
            break;
        sc.t0 = lg_now();
        sc.res = res;
        sc.scanned = 0;
        ok = lg_send_all(*fd, req.p, req.len) &&
             lg_read_response(*fd, &h, REQ_TIMEOUT_S, sse_on_data, &sc);
        if (ok) {
            res->status = h.status;
            res->latency = lg_now() - sc.t0;
            if (!h.keep_alive) {
                close(*fd);
                *fd = -1;
            }
            break;
        }
        close(*fd);
        *fd = -1;
        /* a kept-alive connection the server had just closed: retry once on a new one */
        if (fresh || h.raw.len > 0)
            break;
        lg_http_reset(&h);
    }
    lg_buf_free(&req);
    lg_http_free(&h);
}

/* ---- a concurrency level ---------------------------------------------------------------- */

struct level {
    int conc;
    const struct opts *o;
    int port;
    const int32_t *prefix;
    double t_start, deadline;
    _Atomic int next_req; /* requests started (request-count mode) */
    _Atomic uint64_t seq; /* review seeds */
    pthread_mutex_t mu;
    struct lg_samples lat, ttft;
    int64_t tokens, prompt_tokens, cached_tokens;
    int n_ok, n_err, n_short;
    int err_status[MAX_STATUS], err_count[MAX_STATUS];
    double t_last;
};

static void level_record(struct level *lv, const struct result *r)
{
    pthread_mutex_lock(&lv->mu);
    if (r->status == 200 && !r->stream_error) {
        lv->n_ok++;
        lg_samples_add(&lv->lat, r->latency);
        if (r->ttft > 0)
            lg_samples_add(&lv->ttft, r->ttft);
        lv->tokens += r->n_gen;
        lv->prompt_tokens += r->n_prompt;
        lv->cached_tokens += r->n_cached;
        if (r->n_gen != lv->o->gen)
            lv->n_short++;
    } else {
        int st = r->stream_error ? 1 : r->status, k;
        lv->n_err++;
        for (k = 0; k < MAX_STATUS && lv->err_count[k] && lv->err_status[k] != st; k++)
            ;
        if (k < MAX_STATUS) {
            lv->err_status[k] = st;
            lv->err_count[k]++;
        }
    }
    lv->t_last = lg_now();
    pthread_mutex_unlock(&lv->mu);
}

static void *client_main(void *arg)
{
    struct level *lv = arg;
    const struct opts *o = lv->o;
    struct lg_buf body = {0};
    struct result r;
    int fd = -1;
    for (int i = 0; i < 1000000; i++) {
        if (o->requests > 0) {
            if (atomic_fetch_add(&lv->next_req, 1) >= o->requests)
                break;
        } else if (lg_now() >= lv->deadline) {
            break;
        }
        make_body(&body, lv->prefix, o->prefix_tokens, o->review_tokens,
                  atomic_fetch_add(&lv->seq, 1) * 7919u + 17u, o->gen, o->temperature);
        do_request(lv->port, &fd, body.p, body.len, &r);
        level_record(lv, &r);
        if (r.status == 0)
            lg_sleep(0.05); /* no answer at all: do not spin */
    }
    if (fd >= 0)
        close(fd);
    lg_buf_free(&body);
    return NULL;
}

/* Busy and forward seconds from /metrics; false when either is not exposed. */
static bool engine_times(int port, double *busy, double *fwd)
{
    static const char *const busy_names[] = {"autoreply_engine_step_seconds_total",
                                             "autoreply_engine_busy_seconds_total"};
    struct lg_buf m = {0};
    bool have_busy = false, have_fwd;
    if (lg_http_simple(port, "GET", "/metrics", NULL, &m, 10.0) != 200 || !m.p) {
        lg_buf_free(&m);
        return false;
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(busy_names) && !have_busy; i++)
        have_busy = lg_metric_sum(m.p, busy_names[i], busy);
    have_fwd = lg_metric_sum(m.p, "autoreply_engine_forward_seconds_total", fwd);
    lg_buf_free(&m);
    return have_busy && have_fwd;
}

struct level_out {
    int conc, n_ok, n_err, n_short;
    double elapsed, tok_s, lat50, lat99, ttft50, ttft99, cached_frac;
    double busy, fwd; /* seconds during the level; -1 unknown */
    char errors[128];
};

static void run_level(const struct opts *o, int port, const int32_t *prefix, int conc,
                      uint64_t seq0, struct level_out *out)
{
    struct level lv;
    pthread_t th[1024];
    double b0 = 0, f0 = 0, b1 = 0, f1 = 0;
    bool have_times;
    int n_th = 0;
    memset(&lv, 0, sizeof(lv));
    lv.conc = conc;
    lv.o = o;
    lv.port = port;
    lv.prefix = prefix;
    atomic_store(&lv.seq, seq0);
    pthread_mutex_init(&lv.mu, NULL);
    have_times = engine_times(port, &b0, &f0);
    lv.t_start = lg_now();
    lv.deadline = lv.t_start + o->seconds;
    for (int i = 0; i < conc && i < (int)AR_ARRAY_LEN(th); i++)
        if (pthread_create(&th[n_th], NULL, client_main, &lv) == 0)
            n_th++;
    for (int i = 0; i < n_th; i++)
        pthread_join(th[i], NULL);
    have_times = have_times && engine_times(port, &b1, &f1);

    memset(out, 0, sizeof(*out));
    out->conc = conc;
    out->n_ok = lv.n_ok;
    out->n_err = lv.n_err;
    out->n_short = lv.n_short;
    out->elapsed = (lv.t_last > lv.t_start ? lv.t_last : lg_now()) - lv.t_start;
    out->tok_s = out->elapsed > 0 ? (double)lv.tokens / out->elapsed : 0;
    out->lat50 = lg_percentile(&lv.lat, 50);
    out->lat99 = lg_percentile(&lv.lat, 99);
    out->ttft50 = lg_percentile(&lv.ttft, 50);
    out->ttft99 = lg_percentile(&lv.ttft, 99);
    out->cached_frac = lv.prompt_tokens ? (double)lv.cached_tokens / (double)lv.prompt_tokens : 0;
    out->busy = have_times ? b1 - b0 : -1;
    out->fwd = have_times ? f1 - f0 : -1;
    for (int k = 0; k < MAX_STATUS && lv.err_count[k]; k++) {
        size_t l = strlen(out->errors);
        char name[16];
        if (lv.err_status[k] == 0)
            snprintf(name, sizeof(name), "conn");
        else if (lv.err_status[k] == 1)
            snprintf(name, sizeof(name), "stream");
        else
            snprintf(name, sizeof(name), "%d", lv.err_status[k]);
        snprintf(out->errors + l, sizeof(out->errors) - l, "%s%s:%d", l ? " " : "", name,
                 lv.err_count[k]);
    }
    lg_samples_free(&lv.lat);
    lg_samples_free(&lv.ttft);
    pthread_mutex_destroy(&lv.mu);
}

/* Median TTFT of n sequential single requests (max_tokens 1). NAN when none succeeded. */
static double ttft_probe(const struct opts *o, int port, const int32_t *prefix, int n,
                         uint64_t seq0, int *n_cached_out)
{
    struct lg_samples s = {0};
    struct lg_buf body = {0};
    struct result r;
    int fd = -1, cached = 0;
    double med;
    for (int i = 0; i < n; i++) {
        make_body(&body, prefix, o->prefix_tokens, o->review_tokens, seq0 + (uint64_t)i * 31u, 1,
                  o->temperature);
        do_request(port, &fd, body.p, body.len, &r);
        if (r.status == 200 && r.ttft > 0) {
            lg_samples_add(&s, r.ttft);
            cached += r.n_cached;
        }
    }
    if (fd >= 0)
        close(fd);
    med = lg_percentile(&s, 50);
    *n_cached_out = s.n ? cached / (int)s.n : 0;
    lg_samples_free(&s);
    lg_buf_free(&body);
    return med;
}

/* ---- server start ------------------------------------------------------------------------- */

static bool start_server(const struct opts *o, bool prefix_cache, const char *tmpdir,
                         struct lg_server *srv)
{
    char port_s[16], thr[16], par[16], kv[16], log_path[600], data_dir[600];
    char *argv[24], *help;
    int n, port = lg_free_port();
    if (!port) {
        fprintf(stderr, "no free port\n");
        return false;
    }
    snprintf(par, sizeof(par), "%d", o->parallel);
    snprintf(kv, sizeof(kv), "%d", o->kv_size);
    snprintf(log_path, sizeof(log_path), "%s/server-%s.log", tmpdir,
             prefix_cache ? "prefix-on" : "prefix-off");
    n = lg_serve_argv(argv, o->bin, o->model, port, port_s, o->threads, thr);
    argv[n++] = "--parallel";
    argv[n++] = par;
    argv[n++] = "--kv-size";
    argv[n++] = kv;
    if (!prefix_cache)
        argv[n++] = "--no-prefix-cache";
    /* the product's data (replies.db) goes to the temporary directory, not ./var */
    help = lg_serve_help(o->bin);
    if (help && lg_has_flag(help, "--data-dir")) {
        snprintf(data_dir, sizeof(data_dir), "%s/data", tmpdir);
        argv[n++] = "--data-dir";
        argv[n++] = data_dir;
    }
    free(help);
    argv[n] = NULL;
    lg_print_cmd(stderr, "+ ", argv);
    return lg_server_start(srv, argv, port, tmpdir, log_path, 300.0);
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: serve -m MODEL [--levels 1,4,16,64] [--seconds S | --requests N] [--json]\n"
               "             [--threads 2] [--parallel N] [--kv-size TOKENS] [--gen 64]\n"
               "             [--prefix-tokens 300] [--review-tokens 40] [--temperature 0]\n"
               "             [--ttft-requests 11] [--no-prefix-compare] [--bin ./bin/autoreply]\n");
}

static const char *pass_fail(bool ok)
{
    return ok ? "met" : "NOT met";
}

int main(int argc, char **argv)
{
    struct opts o = {.bin = "./bin/autoreply",
                     .seconds = 30,
                     .threads = 2,
                     .kv_size = 32768,
                     .prefix_tokens = 300,
                     .review_tokens = 40,
                     .gen = 64,
                     .ttft_requests = 11,
                     .levels = {1, 4, 16, 64},
                     .n_levels = 4};
    struct level_out res[MAX_LEVELS];
    struct lg_server srv;
    int32_t *prefix;
    char tmpdir[] = "/tmp/autoreply-bench-serve-XXXXXX";
    double ttft_on = (double)NAN, ttft_off = (double)NAN;
    int cached_on = 0, cached_off = 0;
    uint64_t seed = 42;
    char *bin_abs = NULL, *model_abs = NULL;

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
        } else if (!strcmp(a, "--levels")) {
            LG_NEEDV();
            if ((o.n_levels = lg_parse_int_list(v, o.levels, MAX_LEVELS)) <= 0) {
                fprintf(stderr, "--levels: a list like 1,4,16,64\n");
                return 2;
            }
        } else if (!strcmp(a, "--requests")) {
            LG_NEEDV();
            o.requests = atoi(v);
        } else if (!strcmp(a, "--seconds")) {
            LG_NEEDV();
            o.seconds = atof(v);
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            LG_NEEDV();
            o.threads = atoi(v);
        } else if (!strcmp(a, "--parallel")) {
            LG_NEEDV();
            o.parallel = atoi(v);
        } else if (!strcmp(a, "--kv-size")) {
            LG_NEEDV();
            o.kv_size = atoi(v);
        } else if (!strcmp(a, "--gen")) {
            LG_NEEDV();
            o.gen = atoi(v);
        } else if (!strcmp(a, "--prefix-tokens")) {
            LG_NEEDV();
            o.prefix_tokens = atoi(v);
        } else if (!strcmp(a, "--review-tokens")) {
            LG_NEEDV();
            o.review_tokens = atoi(v);
        } else if (!strcmp(a, "--temperature")) {
            LG_NEEDV();
            o.temperature = (float)atof(v);
        } else if (!strcmp(a, "--ttft-requests")) {
            LG_NEEDV();
            o.ttft_requests = atoi(v);
        } else if (!strcmp(a, "--no-prefix-compare")) {
            o.skip_prefix_compare = true;
        } else if (!strcmp(a, "--json")) {
            o.json = true;
        } else {
            fprintf(stderr, "unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o.model) {
        usage(stderr);
        return 2;
    }
    {
        /* the server runs inside a temporary directory: absolute paths */
        char *bin = realpath(o.bin, NULL), *model = realpath(o.model, NULL);
        if (!bin || !model) {
            fprintf(stderr, "%s: not found\n", bin ? o.model : o.bin);
            return 1;
        }
        o.bin = bin_abs = bin;
        o.model = model_abs = model;
    }
    if (o.seconds <= 0 || o.seconds > 3600 || o.requests < 0 || o.requests > 1000000 ||
        o.threads < 1 || o.gen < 1 || o.gen > 4096 || o.prefix_tokens < 0 || o.review_tokens < 1 ||
        o.prefix_tokens + o.review_tokens > 100000 || o.ttft_requests < 1 ||
        o.ttft_requests > 1000) {
        fprintf(stderr, "an option is out of range\n");
        return 2;
    }
    if (!o.parallel)
        for (int i = 0; i < o.n_levels; i++)
            o.parallel = AR_MAX(o.parallel, o.levels[i]);
    {
        /* token ids: skip the specials and byte tokens at the start of the vocabulary */
        struct gguf_file *f = NULL;
        const struct gguf_arr *toks;
        struct ar_err err = {0};
        if (gguf_open(o.model, &f, &err) != AR_OK) {
            fprintf(stderr, "%s: %s\n", o.model, err.msg);
            return 1;
        }
        if (!gguf_get_arr(f, "tokenizer.ggml.tokens", &toks) || toks->n < 600) {
            fprintf(stderr, "%s: no vocabulary of 600+ tokens (autoreply gen-model writes one)\n",
                    o.model);
            gguf_close(f);
            return 1;
        }
        id_lo = 300;
        id_hi = (int)AR_MIN(toks->n, (uint64_t)INT32_MAX);
        gguf_close(f);
    }
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    prefix = lg_xalloc((size_t)AR_MAX(o.prefix_tokens, 1) * sizeof(int32_t));
    for (int i = 0; i < o.prefix_tokens; i++)
        prefix[i] = id_lo + (int32_t)(ar_splitmix64(&seed) % (uint64_t)(id_hi - id_lo));

    double load0 = lg_loadavg();
    if (!start_server(&o, true, tmpdir, &srv))
        return 1;
    fprintf(stderr,
            "model %s, %d threads, --parallel %d; prompt %d shared + %d distinct token ids, "
            "%d generated tokens (ignore_eos, temperature %g); %s per level\n",
            o.model, o.threads, o.parallel, o.prefix_tokens, o.review_tokens, o.gen,
            (double)o.temperature, o.requests ? "a request count" : "a time budget");
    /* warm-up: pages of the weights, the shared prefix in the prefix cache */
    {
        int c;
        ttft_probe(&o, srv.port, prefix, 1, 999999, &c);
    }
    for (int li = 0; li < o.n_levels; li++) {
        run_level(&o, srv.port, prefix, o.levels[li], 1000u + (uint64_t)li * 100000u, &res[li]);
        if (!o.json)
            fprintf(stderr, "  c=%d done: %d ok, %d errors, %.1f tok/s\n", res[li].conc,
                    res[li].n_ok, res[li].n_err, res[li].tok_s);
    }
    if (!o.skip_prefix_compare)
        ttft_on = ttft_probe(&o, srv.port, prefix, o.ttft_requests, 5000000, &cached_on);
    lg_server_stop(&srv, 20);
    if (!o.skip_prefix_compare) {
        if (start_server(&o, false, tmpdir, &srv)) {
            int c;
            ttft_probe(&o, srv.port, prefix, 1, 999999, &c); /* same warm-up */
            ttft_off = ttft_probe(&o, srv.port, prefix, o.ttft_requests, 5000000, &cached_off);
            lg_server_stop(&srv, 20);
        }
    }

    /* ---- report ---- */
    double tok1 = 0, tok16 = 0, busy = 0, fwd = 0;
    bool have_overhead = true;
    for (int li = 0; li < o.n_levels; li++) {
        if (res[li].conc == 1)
            tok1 = res[li].tok_s;
        if (res[li].conc == 16)
            tok16 = res[li].tok_s;
        if (res[li].busy < 0)
            have_overhead = false;
        busy += res[li].busy;
        fwd += res[li].fwd;
    }
    double overhead = have_overhead && fwd > 0 ? busy / fwd - 1 : (double)NAN;
    double ratio = ttft_on > 0 ? ttft_off / ttft_on : (double)NAN;
    if (o.json) {
        cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "levels");
        cJSON_AddStringToObject(j, "model", o.model);
        cJSON_AddNumberToObject(j, "threads", o.threads);
        cJSON_AddNumberToObject(j, "parallel", o.parallel);
        cJSON_AddNumberToObject(j, "prefix_tokens", o.prefix_tokens);
        cJSON_AddNumberToObject(j, "review_tokens", o.review_tokens);
        cJSON_AddNumberToObject(j, "gen_tokens", o.gen);
        cJSON_AddNumberToObject(j, "loadavg_before", load0);
        cJSON_AddNumberToObject(j, "loadavg_after", lg_loadavg());
        for (int li = 0; li < o.n_levels; li++) {
            cJSON *l = cJSON_CreateObject();
            cJSON_AddNumberToObject(l, "concurrency", res[li].conc);
            cJSON_AddNumberToObject(l, "requests_ok", res[li].n_ok);
            cJSON_AddNumberToObject(l, "errors", res[li].n_err);
            cJSON_AddStringToObject(l, "errors_by_status", res[li].errors);
            cJSON_AddNumberToObject(l, "elapsed_s", res[li].elapsed);
            cJSON_AddNumberToObject(l, "gen_tok_s", res[li].tok_s);
            cJSON_AddNumberToObject(l, "latency_p50_s", res[li].lat50);
            cJSON_AddNumberToObject(l, "latency_p99_s", res[li].lat99);
            cJSON_AddNumberToObject(l, "ttft_p50_s", res[li].ttft50);
            cJSON_AddNumberToObject(l, "ttft_p99_s", res[li].ttft99);
            cJSON_AddNumberToObject(l, "cached_prompt_fraction", res[li].cached_frac);
            if (res[li].busy >= 0) {
                cJSON_AddNumberToObject(l, "engine_busy_s", res[li].busy);
                cJSON_AddNumberToObject(l, "engine_forward_s", res[li].fwd);
            }
            cJSON_AddItemToArray(arr, l);
        }
        if (tok1 > 0 && tok16 > 0)
            cJSON_AddNumberToObject(j, "tok_s_c16_over_c1", tok16 / tok1);
        if (!isnan(ttft_on))
            cJSON_AddNumberToObject(j, "ttft_prefix_on_s", ttft_on);
        if (!isnan(ttft_off))
            cJSON_AddNumberToObject(j, "ttft_prefix_off_s", ttft_off);
        if (!isnan(ratio))
            cJSON_AddNumberToObject(j, "ttft_ratio", ratio);
        if (!isnan(overhead))
            cJSON_AddNumberToObject(j, "engine_overhead", overhead);
        else
            cJSON_AddNullToObject(j, "engine_overhead");
        char *s = cJSON_Print(j);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(j);
    } else {
        printf("\nserving benchmark: %s, %d threads, --parallel %d, prompt %d+%d tokens, "
               "%d generated\n",
               o.model, o.threads, o.parallel, o.prefix_tokens, o.review_tokens, o.gen);
        printf("(1-minute load average before %.2f, after %.2f: other work on the machine "
               "skews the figures)\n",
               load0, lg_loadavg());
        printf("%6s %6s %6s %10s %9s %9s %9s %9s %7s %8s  %s\n", "conc", "ok", "err", "gen tok/s",
               "lat p50", "lat p99", "ttft p50", "ttft p99", "cached", "overhead", "errors");
        for (int li = 0; li < o.n_levels; li++) {
            const struct level_out *r = &res[li];
            char ovh[16] = "n/a";
            if (r->busy >= 0 && r->fwd > 0)
                snprintf(ovh, sizeof(ovh), "%.2f%%", 100 * (r->busy / r->fwd - 1));
            printf("%6d %6d %6d %10.1f %8.3fs %8.3fs %8.3fs %8.3fs %6.0f%% %8s  %s%s\n", r->conc,
                   r->n_ok, r->n_err, r->tok_s, r->lat50, r->lat99, r->ttft50, r->ttft99,
                   100 * r->cached_frac, ovh, r->errors,
                   r->n_short ? " (some answers had fewer tokens than asked)" : "");
        }
        printf("\ntargets:\n");
        if (tok1 > 0 && tok16 > 0)
            printf("  tok/s at c16 / c1:        %5.2fx   (target >= 4x: %s)\n", tok16 / tok1,
                   pass_fail(tok16 >= 4 * tok1));
        else
            printf("  tok/s at c16 / c1:        n/a (levels 1 and 16 needed)\n");
        if (!isnan(ratio))
            printf("  TTFT c1, prefix cache:    on %.3fs (%d cached tokens), off %.3fs "
                   "(%d) -> %.1fx   (target >= 5x: %s)\n",
                   ttft_on, cached_on, ttft_off, cached_off, ratio, pass_fail(ratio >= 5));
        else if (!o.skip_prefix_compare)
            printf("  TTFT c1, prefix cache:    n/a (a probe failed)\n");
        if (!isnan(overhead))
            printf("  engine overhead:          %5.2f%% busy/forward - 1 (busy %.2fs, forward "
                   "%.2fs)   (target < 5%%: %s)\n",
                   100 * overhead, busy, fwd, pass_fail(overhead < 0.05));
        else
            printf("  engine overhead:          n/a: /metrics does not expose "
                   "autoreply_engine_step_seconds_total and "
                   "autoreply_engine_forward_seconds_total\n");
    }
    free(prefix);
    free(bin_abs);
    free(model_abs);
    {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return 0;
}
