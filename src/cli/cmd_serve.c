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
#include "cache/cache.h"
#include "cli.h"
#include "cli_internal.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

#define SERVE_GRACE_S 10.0

/* Parses "CLASS=V[,CLASS=V...]" (classes: cache_class_str) for flag into out[class], each V a
 * number in [lo, hi] (whole when integer). Prints why and returns false on anything else. */
static bool parse_class_values(const char *flag, const char *s, double lo, double hi, bool integer,
                               double out[CACHE_N_CLASSES])
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
            cli_error("%s: expected CLASS=VALUE[,CLASS=VALUE], CLASS interactive or bulk, got "
                      "'%s'",
                      flag, s);
            return false;
        }
        if ((size_t)(end - eq - 1) >= sizeof(num)) {
            cli_error("%s: value too long in '%s'", flag, s);
            return false;
        }
        memcpy(num, eq + 1, (size_t)(end - eq - 1));
        num[end - eq - 1] = '\0';
        if (integer) {
            if (!cli_parse_i64(flag, num, (int64_t)lo, (int64_t)hi, &n))
                return false;
            d = (double)n;
        } else if (!cli_parse_f64(flag, num, lo, hi, &d)) {
            return false;
        }
        out[cls] = d;
        if (!*end)
            return true;
        p = end + 1;
    }
}

static void serve_usage(FILE *out)
{
    fprintf(out,
            "usage: autoreply serve [-m MODEL] [options]\n"
            "  -m, --model FILE      GGUF model (default: <exe dir>/../models/%s, then "
            "./models/)\n"
            "  --host ADDR           listen address (127.0.0.1)\n"
            "  --port N              port (8080; 0 picks a free one)\n"
            "  -t, --threads N       model threads (2)\n"
            "  --parallel N          sequences generated at once (16)\n"
            "  --kv-size TOKENS      KV cache capacity in tokens (8192)\n"
            "  --ctx-size N          context per request (model's, capped by the KV cache)\n"
            "  --max-queue N         waiting requests before 503 (256; also --queue N)\n"
            "  --no-prefix-cache     do not reuse KV of shared prompt prefixes\n"
            "  --api-key-file FILE   require Authorization: Bearer <key> (one key per line);\n"
            "                        without it only clients on this machine are answered\n"
            "                        (the API and the console at /console)\n"
            "  --metrics-auth        /metrics needs a key too\n"
            "  --rate-rps R          requests per second per key or IP (off)\n"
            "  --rate-burst B        request burst (max(1, R))\n"
            "  --rate-tpm T          tokens per minute per key or IP (off)\n"
            "  --max-body BYTES      request body limit (1048576)\n"
            "  --max-job-body BYTES  POST /v1/jobs body limit (67108864)\n"
            "  --job-max-open N      queued or running jobs per API key (or client address\n"
            "                        without keys); more: 429 (32)\n"
            "  --job-max-bytes BYTES stored job input per key, finished jobs included until\n"
            "                        deleted; more: 413 (1073741824)\n"
            "  --timeout S           a request must arrive within S seconds (30)\n"
            "  --body-timeout S      a body that stops coming for S s gets 408 (10; 0: off)\n"
            "  --max-conns N         open connections (512)\n"
            "  --max-conns-per-ip N  open connections per client address (half of --max-conns;\n"
            "                        0: no limit, e.g. behind a proxy that is the only client)\n"
            "  --model-name NAME     model id in the API (file name without .gguf)\n"
            "  --tokenizer-pre NAME  pre-tokenizer instead of the model's tokenizer.ggml.pre\n"
            "  --instance-name NAME  this instance in every X-Autoreply-Instance header and "
            "/health (host:port)\n"
            "sessions (/v1/sessions: conversations changed with JSON Patch, in memory):\n"
            "  --session-ttl S       a session unused for S seconds is gone (3600)\n"
            "  --session-max N       sessions one API key may hold (64)\n"
            "  --session-max-bytes B a session document's JSON size (262144)\n"
            "  --session-max-total N sessions in all (1024)\n"
            "review replies (/v1/reviews/reply, /v1/reviews/batch, /v1/jobs):\n"
            "  --shops FILE          shop profiles (JSON, see src/reply/reply.h); built-in "
            "default\n"
            "  --data-dir DIR        replies.db (replies, jobs) lives here (./var; created)\n"
            "  --no-reply-cache      every review not answered before goes to the model\n"
            "  --cache-mb CLASS=N[,CLASS=N]\n"
            "                        in-process reply cache budget per traffic class, MiB:\n"
            "                        interactive (64) for /v1/reviews/..., bulk (16) for job\n"
            "                        lines, so a backfill cannot evict what customers hit;\n"
            "                        0: none (with --cache: Redis alone)\n"
            "  --cache-ttl CLASS=S[,CLASS=S]\n"
            "                        reply cache entry lifetime per class, seconds (3600 each;\n"
            "                        0: never); older entries are misses\n"
            "  --reply-cache-mb N    the same as --cache-mb interactive=N\n"
            "a fleet (several instances sharing backends; see README \"Run a fleet\"):\n"
            "  --store URL           replies and jobs in PostgreSQL (postgres://user@host:port/db)\n"
            "                        or in a SQLite file (default <data-dir>/replies.db)\n"
            "  --cache URL           Redis (redis://host:port/db) as the shared second-level\n"
            "                        reply cache and the home of the rate-limit buckets\n"
            "  --queue URL           RabbitMQ (amqp://user:pass@host:port/vhost) carries job\n"
            "                        items to every instance (default: in process)\n",
            CLI_DEFAULT_MODEL);
}

int cmd_serve(int argc, char **argv)
{
    struct server_params sp = server_default_params();
    struct engine_params ep = engine_default_params();
    const char *model_path = NULL;
    char default_model[4096];
    struct cli_reply_opts ro = {.data_dir = "./var",
                                .reply_cache = true,
                                .cache_mb = {-1, -1},
                                .cache_ttl_s = {-1, -1}};
    double class_values[CACHE_N_CLASSES];
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
    int sig = 0, rc = 1;
    bool named = false;
    struct tokenizer_opts to = {NULL};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int64_t n;
        double d;
#define VALUE()                                                                                    \
    do {                                                                                           \
        if (!(v = cli_value(argc, argv, &i)))                                                      \
            return 2;                                                                              \
    } while (0)
#define INT(lo, hi)                                                                                \
    do {                                                                                           \
        VALUE();                                                                                   \
        if (!cli_parse_i64(a, v, lo, hi, &n))                                                      \
            return 2;                                                                              \
    } while (0)
#define NUM(lo, hi)                                                                                \
    do {                                                                                           \
        VALUE();                                                                                   \
        if (!cli_parse_f64(a, v, lo, hi, &d))                                                      \
            return 2;                                                                              \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VALUE();
            model_path = v;
        } else if (!strcmp(a, "--host")) {
            VALUE();
            sp.host = v;
        } else if (!strcmp(a, "--port")) {
            INT(0, 65535);
            sp.port = (int)n;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            INT(1, 1024);
            ep.n_threads = (int)n;
        } else if (!strcmp(a, "--parallel")) {
            INT(1, 4096);
            ep.n_seq_max = (int)n;
        } else if (!strcmp(a, "--kv-size")) {
            INT(16, (int64_t)1 << 31);
            ep.kv_tokens = n;
        } else if (!strcmp(a, "--ctx-size")) {
            INT(2, (int64_t)1 << 30);
            sp.n_ctx = (int)n;
        } else if (!strcmp(a, "--queue")) {
            /* a broker URL, or (the older meaning) the engine's waiting-request bound */
            VALUE();
            if (strstr(v, "://")) {
                ro.queue_url = v;
            } else {
                if (!cli_parse_i64(a, v, 1, 1 << 24, &n))
                    return 2;
                ep.queue_max = (int)n;
            }
        } else if (!strcmp(a, "--max-queue")) {
            INT(1, 1 << 24);
            ep.queue_max = (int)n;
        } else if (!strcmp(a, "--store")) {
            VALUE();
            ro.store_url = v;
        } else if (!strcmp(a, "--cache")) {
            VALUE();
            ro.cache_url = v;
            sp.rate_redis_url = v; /* the rate-limit buckets live beside the shared cache */
        } else if (!strcmp(a, "--no-prefix-cache")) {
            ep.prefix_cache = false;
        } else if (!strcmp(a, "--api-key-file")) {
            VALUE();
            sp.api_key_file = v;
        } else if (!strcmp(a, "--metrics-auth")) {
            sp.metrics_auth = true;
        } else if (!strcmp(a, "--rate-rps")) {
            NUM(0, 1e9);
            sp.rate_rps = d;
        } else if (!strcmp(a, "--rate-burst")) {
            NUM(0, 1e9);
            sp.rate_burst = d;
        } else if (!strcmp(a, "--rate-tpm")) {
            NUM(0, 1e12);
            sp.rate_tpm = d;
        } else if (!strcmp(a, "--max-body")) {
            INT(1, (int64_t)1 << 40);
            sp.max_body = (size_t)n;
        } else if (!strcmp(a, "--max-job-body")) {
            INT(1, (int64_t)1 << 40);
            ro.max_job_body = (size_t)n;
        } else if (!strcmp(a, "--job-max-open")) {
            INT(1, (int64_t)1 << 30);
            ro.job_max_open = n;
        } else if (!strcmp(a, "--job-max-bytes")) {
            INT(1, (int64_t)1 << 50);
            ro.job_max_bytes = n;
        } else if (!strcmp(a, "--session-ttl")) {
            NUM(0.001, 86400 * 365);
            ssp.ttl_s = d;
        } else if (!strcmp(a, "--session-max")) {
            INT(1, 1 << 20);
            ssp.max_per_key = (int)n;
        } else if (!strcmp(a, "--session-max-total")) {
            INT(1, 1 << 24);
            ssp.max_sessions = (int)n;
        } else if (!strcmp(a, "--session-max-bytes")) {
            INT(64, (int64_t)1 << 30);
            ssp.max_doc_size = (size_t)n;
        } else if (!strcmp(a, "--shops")) {
            VALUE();
            ro.shops_file = v;
        } else if (!strcmp(a, "--data-dir")) {
            VALUE();
            ro.data_dir = v;
        } else if (!strcmp(a, "--reply-cache-mb")) {
            INT(0, (int64_t)1 << 20);
            ro.cache_mb[CACHE_CLASS_INTERACTIVE] = n;
        } else if (!strcmp(a, "--cache-mb") || !strcmp(a, "--cache-ttl")) {
            bool mb = !strcmp(a, "--cache-mb");
            VALUE();
            for (int c = 0; c < CACHE_N_CLASSES; c++)
                class_values[c] = -1;
            if (!parse_class_values(a, v, 0, mb ? (double)(1 << 20) : 1e9, mb, class_values))
                return 2;
            for (int c = 0; c < CACHE_N_CLASSES; c++) {
                if (class_values[c] < 0)
                    continue; /* not named: as before */
                if (mb)
                    ro.cache_mb[c] = (int64_t)class_values[c];
                else
                    ro.cache_ttl_s[c] = class_values[c];
            }
        } else if (!strcmp(a, "--no-reply-cache")) {
            ro.reply_cache = false;
        } else if (!strcmp(a, "--timeout")) {
            NUM(0.1, 86400);
            sp.timeout_s = d;
        } else if (!strcmp(a, "--body-timeout")) {
            NUM(0, 86400);
            sp.body_timeout_s = d;
        } else if (!strcmp(a, "--max-conns")) {
            INT(1, 1 << 20);
            sp.max_conns = (int)n;
        } else if (!strcmp(a, "--max-conns-per-ip")) {
            INT(0, 1 << 20);
            sp.max_conns_per_ip = (int)n;
        } else if (!strcmp(a, "--model-name")) {
            VALUE();
            sp.model_name = v;
            named = true;
        } else if (!strcmp(a, "--instance-name")) {
            VALUE();
            sp.instance_name = v;
        } else if (!strcmp(a, "--tokenizer-pre")) {
            VALUE();
            to.pre = v;
        } else {
            cli_error("serve: unknown option '%s' (autoreply serve --help)", a);
            return 2;
        }
#undef VALUE
#undef INT
#undef NUM
    }
    if (!model_path) {
        if (!cli_default_model(default_model, sizeof(default_model))) {
            cli_error("serve: no model given (-m) and %s not found in <exe dir>/../models/ or "
                      "./models/",
                      CLI_DEFAULT_MODEL);
            return 2;
        }
        model_path = default_model;
    }
    if (!named) {
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
