/* cmd_serve.c - `autoreply serve`: loads a model and serves it over HTTP (OpenAI-compatible
 * API, the review-reply product's /v1/reviews/... and /v1/jobs endpoints, metrics, health)
 * until SIGINT/SIGTERM, then stops gracefully. The server listens before the model is loaded
 * so that /health can say "loading". */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/opts.h"
#include "cache/cache.h"
#include "cli.h"
#include "cli_internal.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

#define SERVE_GRACE_S 10.0

/* Parses "CLASS=V[,CLASS=V...]" (classes: cache_class_str) for flag into out[class], each V a
 * number in [lo, hi] (whole when integer). Fills err (one line) and returns false on anything
 * else. */
static bool parse_class_values(const char *flag, const char *s, double lo, double hi, bool integer,
                               double out[CACHE_N_CLASSES], struct ar_err *err)
{
    const char *p = s;
    for (;;) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        enum cache_class cls;
        char num[64];
        double d;
        int64_t n;
        if (!end)
            end = p + strlen(p);
        if (!eq || eq > end || !cache_class_parse(p, (size_t)(eq - p), &cls)) {
            ar_err_set(err, AR_EINVAL, 0,
                       "%s: expected CLASS=VALUE[,CLASS=VALUE], CLASS interactive or bulk, got "
                       "'%s'",
                       flag, s);
            return false;
        }
        if ((size_t)(end - eq - 1) >= sizeof(num)) {
            ar_err_set(err, AR_EINVAL, 0, "%s: value too long in '%s'", flag, s);
            return false;
        }
        memcpy(num, eq + 1, (size_t)(end - eq - 1));
        num[end - eq - 1] = '\0';
        if (integer) {
            if (!ar_opts_parse_i64(flag, num, (int64_t)lo, (int64_t)hi, &n, err))
                return false;
            d = (double)n;
        } else if (!ar_opts_parse_f64(flag, num, lo, hi, &d, err)) {
            return false;
        }
        out[cls] = d;
        if (!*end)
            return true;
        p = end + 1;
    }
}

/* What the setters of serve's options write. */
struct serve_opts {
    struct server_params *sp;
    struct engine_params *ep;
    struct cli_reply_opts *ro;
};

/* --queue: a broker URL, or (the older meaning) the engine's waiting-request bound. */
static bool set_queue(void *ctx, const char *flag, const char *v, struct ar_err *err)
{
    struct serve_opts *o = ctx;
    int64_t n;
    if (strstr(v, "://")) {
        o->ro->queue_url = v;
        return true;
    }
    if (!ar_opts_parse_i64(flag, v, 1, 1 << 24, &n, err))
        return false;
    o->ep->queue_max = (int)n;
    return true;
}

static bool set_cache(void *ctx, const char *flag, const char *v, struct ar_err *err)
{
    struct serve_opts *o = ctx;
    (void)flag;
    (void)err;
    o->ro->cache_url = v;
    o->sp->rate_redis_url = v; /* the rate-limit buckets live beside the shared cache */
    return true;
}

/* --cache-mb, --cache-ttl: CLASS=V pairs; a class not named keeps its value. */
static bool set_cache_class(void *ctx, const char *flag, const char *v, struct ar_err *err)
{
    struct serve_opts *o = ctx;
    bool mb = !strcmp(flag, "--cache-mb");
    double class_values[CACHE_N_CLASSES];
    for (int c = 0; c < CACHE_N_CLASSES; c++)
        class_values[c] = -1;
    if (!parse_class_values(flag, v, 0, mb ? (double)(1 << 20) : 1e9, mb, class_values, err))
        return false;
    for (int c = 0; c < CACHE_N_CLASSES; c++) {
        if (class_values[c] < 0)
            continue;
        if (mb)
            o->ro->cache_mb[c] = (int64_t)class_values[c];
        else
            o->ro->cache_ttl_s[c] = class_values[c];
    }
    return true;
}

int cmd_serve(int argc, char **argv)
{
    struct tokenizer_opts to = {NULL};
    struct server_params sp = server_default_params();
    struct engine_params ep = engine_default_params();
    const char *model_path = NULL, *model_name = NULL;
    char default_model[4096];
    struct cli_reply_opts ro = {
        .data_dir = "./var", .reply_cache = true, .cache_mb = {-1, -1}, .cache_ttl_s = {-1, -1}};
    struct serve_opts so = {&sp, &ep, &ro};
    struct cli_reply *cr = NULL;
    struct server *srv = NULL;
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    struct engine *eng = NULL;
    struct server_sessions_params ssp = server_sessions_default_params();
    struct server_sessions *sessions = NULL;
    struct ar_err err = {0};
    char *name = NULL;
    sigset_t sigs;
    int sig = 0, rc = 1, first_arg;
    const struct ar_opt opts[] = {
        {"model", 'm', AR_OPT_STRING, &model_path, 0, 0, "FILE", "GGUF model",
         "<exe dir>/../models/" CLI_DEFAULT_MODEL ", then ./models/", NULL},
        /* model-loading options (--tokenizer-pre NAME, ...) go here, beside --model */
        {"tokenizer-pre", 0, AR_OPT_STRING, &to.pre, 0, 0, "NAME",
         "pre-tokenizer instead of the model's tokenizer.ggml.pre", NULL, NULL},
        {"host", 0, AR_OPT_STRING, &sp.host, 0, 0, "ADDR", "listen address", NULL, NULL},
        {"port", 0, AR_OPT_INT, &sp.port, 0, 65535, "N", "port; 0 picks a free one", NULL, NULL},
        {"threads", 't', AR_OPT_INT, &ep.n_threads, 1, 1024, "N", "model threads", NULL, NULL},
        {"parallel", 0, AR_OPT_INT, &ep.n_seq_max, 1, 4096, "N", "sequences generated at once",
         NULL, NULL},
        {"kv-size", 0, AR_OPT_I64, &ep.kv_tokens, 16, (double)((int64_t)1 << 31), "TOKENS",
         "KV cache capacity in tokens", NULL, NULL},
        {"ctx-size", 0, AR_OPT_INT, &sp.n_ctx, 2, 1 << 30, "N", "context per request",
         "the model's, capped by the KV cache", NULL},
        {"max-queue", 0, AR_OPT_INT, &ep.queue_max, 1, 1 << 24, "N",
         "waiting requests before 503 (also --queue N)", NULL, NULL},
        {"no-prefix-cache", 0, AR_OPT_CLEAR, &ep.prefix_cache, 0, 0, NULL,
         "do not reuse KV of shared prompt prefixes", NULL, NULL},
        {"api-key-file", 0, AR_OPT_STRING, &sp.api_key_file, 0, 0, "FILE",
         "require Authorization: Bearer <key> (one key per line);\n"
         "without it only clients on this machine are answered\n"
         "(the API and the console at /console)",
         NULL, NULL},
        {"metrics-auth", 0, AR_OPT_SET, &sp.metrics_auth, 0, 0, NULL, "/metrics needs a key too",
         NULL, NULL},
        {"rate-rps", 0, AR_OPT_DOUBLE, &sp.rate_rps, 0, 1e9, "R",
         "requests per second per key or IP", "off", NULL},
        {"rate-burst", 0, AR_OPT_DOUBLE, &sp.rate_burst, 0, 1e9, "B", "request burst", "max(1, R)",
         NULL},
        {"rate-tpm", 0, AR_OPT_DOUBLE, &sp.rate_tpm, 0, 1e12, "T",
         "tokens per minute per key or IP", "off", NULL},
        {"max-body", 0, AR_OPT_SIZE, &sp.max_body, 1, (double)((int64_t)1 << 40), "BYTES",
         "request body limit", NULL, NULL},
        {"max-job-body", 0, AR_OPT_SIZE, &ro.max_job_body, 1, (double)((int64_t)1 << 40), "BYTES",
         "POST /v1/jobs body limit", "67108864", NULL},
        {"job-max-open", 0, AR_OPT_I64, &ro.job_max_open, 1, (double)((int64_t)1 << 30), "N",
         "queued or running jobs per API key (or client address\nwithout keys); more: 429", "32",
         NULL},
        {"job-max-bytes", 0, AR_OPT_I64, &ro.job_max_bytes, 1, (double)((int64_t)1 << 50), "BYTES",
         "stored job input per key, finished jobs included until\ndeleted; more: 413", "1073741824",
         NULL},
        {"timeout", 0, AR_OPT_DOUBLE, &sp.timeout_s, 0.1, 86400, "S",
         "a request must arrive within S seconds", NULL, NULL},
        {"body-timeout", 0, AR_OPT_DOUBLE, &sp.body_timeout_s, 0, 86400, "S",
         "a body that stops coming for S s gets 408; 0: off", NULL, NULL},
        {"max-conns", 0, AR_OPT_INT, &sp.max_conns, 1, 1 << 20, "N", "open connections", NULL,
         NULL},
        {"max-conns-per-ip", 0, AR_OPT_INT, &sp.max_conns_per_ip, 0, 1 << 20, "N",
         "open connections per client address; 0: no limit,\ne.g. behind a proxy that is the "
         "only client",
         "half of --max-conns", NULL},
        {"model-name", 0, AR_OPT_STRING, &model_name, 0, 0, "NAME", "model id in the API",
         "file name without .gguf", NULL},
        {"instance-name", 0, AR_OPT_STRING, &sp.instance_name, 0, 0, "NAME",
         "this instance in every X-Autoreply-Instance header\nand /health", "host:port", NULL},
        {NULL, 0, AR_OPT_SECTION, NULL, 0, 0, NULL,
         "sessions (/v1/sessions: conversations changed with JSON Patch, in memory):", NULL, NULL},
        {"session-ttl", 0, AR_OPT_DOUBLE, &ssp.ttl_s, 0.001, 86400 * 365, "S",
         "a session unused for S seconds is gone", NULL, NULL},
        {"session-max", 0, AR_OPT_INT, &ssp.max_per_key, 1, 1 << 20, "N",
         "sessions one API key may hold", NULL, NULL},
        {"session-max-bytes", 0, AR_OPT_SIZE, &ssp.max_doc_size, 64, (double)((int64_t)1 << 30),
         "B", "a session document's JSON size", NULL, NULL},
        {"session-max-total", 0, AR_OPT_INT, &ssp.max_sessions, 1, 1 << 24, "N", "sessions in all",
         NULL, NULL},
        {NULL, 0, AR_OPT_SECTION, NULL, 0, 0, NULL,
         "review replies (/v1/reviews/reply, /v1/reviews/batch, /v1/jobs):", NULL, NULL},
        {"shops", 0, AR_OPT_STRING, &ro.shops_file, 0, 0, "FILE",
         "shop profiles (JSON, see src/reply/reply.h)", "built in", NULL},
        {"data-dir", 0, AR_OPT_STRING, &ro.data_dir, 0, 0, "DIR",
         "replies.db (replies, jobs) lives here (created)", NULL, NULL},
        {"no-reply-cache", 0, AR_OPT_CLEAR, &ro.reply_cache, 0, 0, NULL,
         "every review not answered before goes to the model", NULL, NULL},
        {"cache-mb", 0, AR_OPT_CALL, NULL, 0, 0, "CLASS=N[,CLASS=N]",
         "in-process reply cache budget per traffic class, MiB:\n"
         "interactive (64) for /v1/reviews/..., bulk (16) for job\n"
         "lines, so a backfill cannot evict what customers hit;\n"
         "0: none (with --cache: Redis alone)",
         "", set_cache_class},
        {"cache-ttl", 0, AR_OPT_CALL, NULL, 0, 0, "CLASS=S[,CLASS=S]",
         "reply cache entry lifetime per class, seconds (3600 each;\n"
         "0: never); older entries are misses",
         "", set_cache_class},
        {"reply-cache-mb", 0, AR_OPT_I64, &ro.cache_mb[CACHE_CLASS_INTERACTIVE], 0,
         (double)((int64_t)1 << 20), "N", "the same as --cache-mb interactive=N", "", NULL},
        {NULL, 0, AR_OPT_SECTION, NULL, 0, 0, NULL,
         "a fleet (several instances sharing backends; see README \"Run a fleet\"):", NULL, NULL},
        {"store", 0, AR_OPT_STRING, &ro.store_url, 0, 0, "URL",
         "replies and jobs in PostgreSQL (postgres://user@host:port/db)\n"
         "or in a SQLite file",
         "<data-dir>/replies.db", NULL},
        {"cache", 0, AR_OPT_CALL, NULL, 0, 0, "URL",
         "Redis (redis://host:port/db) as the shared second-level\n"
         "reply cache and the home of the rate-limit buckets",
         "", set_cache},
        {"queue", 0, AR_OPT_CALL, NULL, 0, 0, "URL",
         "RabbitMQ (amqp://user:pass@host:port/vhost) carries job\n"
         "items to every instance (default: in process); a number N\n"
         "instead: the same as --max-queue N",
         "", set_queue},
    };
    const struct ar_opts spec = {.cmd = "serve",
                                 .usage = "serve [-m MODEL] [options]",
                                 .opts = opts,
                                 .n_opts = AR_ARRAY_LEN(opts),
                                 .max_args = 0,
                                 .ctx = &so};

    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    rc = 1;
    if (!model_path) {
        if (!cli_default_model(default_model, sizeof(default_model))) {
            cli_error("serve: no model given (-m) and %s not found in <exe dir>/../models/ or "
                      "./models/",
                      CLI_DEFAULT_MODEL);
            return 2;
        }
        model_path = default_model;
    }
    if (model_name) {
        sp.model_name = model_name;
    } else {
        if (!(name = cli_model_name(model_path)))
            return 1;
        sp.model_name = name;
    }

    /* every thread started from here on inherits the blocked signals; main waits for them */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (server_create(&sp, &srv, &err) != AR_OK) {
        cli_error("serve: %s", err.msg[0] ? err.msg : "cannot create the server");
        goto done;
    }
    ro.job_slots = ep.n_seq_max;
    if (cli_reply_attach(srv, &ro, &cr) != 0)
        goto done;
    if (server_sessions_attach(srv, &ssp, &sessions) != AR_OK) {
        cli_error("serve: cannot add the session routes");
        goto done;
    }
    if (server_start(srv, &err) != AR_OK) {
        cli_error("serve: %s", err.msg);
        goto done;
    }
    AR_INFO("serve: listening on http://%s:%d (loading %s)", sp.host, server_port(srv), model_path);
    if (model_load(model_path, &m, &err) != AR_OK) {
        cli_error("serve: %s: %s", model_path, err.msg);
        goto done;
    }
    if (tokenizer_load_opts(model_gguf(m), &to, &tok, &err) != AR_OK) {
        cli_error("serve: %s: tokenizer: %s", model_path, err.msg);
        goto done;
    }
    if (engine_create(m, tok, &ep, &eng, &err) != AR_OK) {
        cli_error("serve: engine: %s", err.msg);
        goto done;
    }
    server_set_engine(srv, eng, m, tok);
    cli_reply_set_engine(cr, eng, tok, sp.model_name);
    AR_INFO("serve: ready: model %s, context %d, %d parallel, KV %lld tokens, queue %d",
            sp.model_name, server_n_ctx(srv), ep.n_seq_max, (long long)ep.kv_tokens, ep.queue_max);
    if (sigwait(&sigs, &sig) != 0)
        sig = SIGTERM;
    AR_INFO("serve: %s: stopping (up to %.0f s for requests in progress)",
            sig == SIGINT ? "SIGINT" : "SIGTERM", SERVE_GRACE_S);
    rc = 0;
done:
    /* the engine's last callbacks reply to the server's requests: stop the server, then the
     * reply service (its workers wait for the engine and reply to the server's requests), then
     * the engine, then free the server */
    server_stop(srv, SERVE_GRACE_S);
    cli_reply_detach(cr);
    engine_destroy(eng);
    server_destroy(srv);
    server_sessions_destroy(sessions); /* no request or engine callback is left to use them */
    tokenizer_destroy(tok);
    model_destroy(m);
    ar_free(name);
    if (rc == 0)
        AR_INFO("serve: stopped");
    return rc;
}
