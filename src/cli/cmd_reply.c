/* cmd_reply.c - the review-reply product on the command line: `autoreply reply` answers one
 * review, `autoreply batch` answers a JSONL file as a resumable bulk job (the store's job
 * tables, keyed by the input file's path, size and mtime; results are written out line by line
 * as they are stored, with progress on stderr), and the wiring of the product for
 * `autoreply serve` (profiles, store, cache, service and generator; the HTTP endpoints are the
 * server's, src/server/reviews.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/hash.h"
#include "base/opts.h"
#include "cli.h"
#include "cli_internal.h"
#include "engine/engine.h"
#include "model/model.h"
#include "queue/queue.h"
#include "reply/reply.h"
#include "server/server.h"
#include "store/store.h"
#include "tokenizer/tokenizer.h"

#define DEFAULT_DATA_DIR "./var"
#define DEFAULT_SHOP "default"
/* The bulk class's in-process reply cache, MiB: a quarter of the interactive default, enough
 * for duplicates within a job without taking memory from live traffic. */
#define CLI_BULK_CACHE_MB 16

/* ---- shared setup -------------------------------------------------------------------------- */

struct product {
    struct reply_profiles *profiles;
    struct store *store;
    struct cache *cache;      /* interactive: the reply command */
    struct cache *bulk_cache; /* bulk: the batch command's job lines */
    struct model *model;
    struct tokenizer *tok;
    struct engine *engine;
    struct reply_generator *gen;
    struct reply_service *svc;
};

struct product_opts {
    const char *model;
    const char *shops;
    const char *data_dir;
    const char *shop;      /* the review's shop (reply), or that of lines without shop_id (batch) */
    const char *store_url; /* postgres://... or a SQLite file; NULL: <data_dir>/replies.db */
    const char *tokenizer_pre; /* --tokenizer-pre, or NULL */
    int threads;
};

static const struct product_opts product_opts_default = {
    .data_dir = DEFAULT_DATA_DIR, .shop = DEFAULT_SHOP, .threads = 2};

/* mkdir -p */
static bool make_dir(const char *dir)
{
    char path[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof(path)) {
        cli_error("bad data directory '%s'", dir);
        return false;
    }
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            cli_error("cannot create %s: %s", path, strerror(errno));
            return false;
        }
        path[i] = i < n ? '/' : '\0';
    }
    return true;
}

static bool open_profiles_store(const struct product_opts *o, struct product *p)
{
    struct ar_err err = {AR_OK, 0, {0}};
    char db[PATH_MAX];
    if (o->shops) {
        if (reply_profiles_load(o->shops, &p->profiles, &err) != AR_OK) {
            cli_error("--shops %s: %s", o->shops, err.msg);
            return false;
        }
    } else if (reply_profiles_default(&p->profiles) != AR_OK) {
        cli_error("out of memory");
        return false;
    }
    if (!make_dir(o->data_dir))
        return false;
    snprintf(db, sizeof(db), "%s/replies.db", o->data_dir);
    if (store_open_url(o->store_url ? o->store_url : db, &p->store, &err) != AR_OK) {
        cli_error("%s: %s", o->store_url ? "--store" : db, err.msg);
        return false;
    }
    return true;
}

static bool product_open(const struct product_opts *o, struct product *p)
{
    struct ar_err err = {AR_OK, 0, {0}};
    struct engine_params ep = engine_default_params();
    struct cache_memory_params cp = cache_memory_default_params();
    struct reply_service_params sp = reply_service_default_params();
    char path[PATH_MAX];
    const char *model = o->model;
    char *name;
    memset(p, 0, sizeof(*p));
    if (!model) {
        if (!cli_default_model(path, sizeof(path))) {
            cli_error("no model given (-m) and %s not found in <exe dir>/../models/ or "
                      "./models/",
                      CLI_DEFAULT_MODEL);
            return false;
        }
        model = path;
    }
    if (!open_profiles_store(o, p))
        return false;
    if (cache_memory_create(&cp, &p->cache) != AR_OK) {
        cli_error("out of memory");
        return false;
    }
    cp.max_bytes = (size_t)CLI_BULK_CACHE_MB << 20;
    if (cache_memory_create(&cp, &p->bulk_cache) != AR_OK) {
        cli_error("out of memory");
        return false;
    }
    if (model_load(model, &p->model, &err) != AR_OK) {
        cli_error("%s: %s", model, err.msg);
        return false;
    }
    if (tokenizer_load_opts(model_gguf(p->model), &(struct tokenizer_opts){o->tokenizer_pre},
                            &p->tok, &err) != AR_OK) {
        cli_error("%s: tokenizer: %s", model, err.msg);
        return false;
    }
    ep.n_threads = o->threads;
    if (engine_create(p->model, p->tok, &ep, &p->engine, &err) != AR_OK) {
        cli_error("engine: %s", err.msg);
        return false;
    }
    name = cli_model_name(model);
    if (!name || reply_engine_generator(p->engine, p->tok, name, &p->gen) != AR_OK) {
        ar_free(name);
        cli_error("out of memory");
        return false;
    }
    ar_free(name);
    sp.profiles = p->profiles;
    sp.store = p->store;
    sp.cache = p->cache;
    sp.bulk_cache = p->bulk_cache;
    sp.gen = p->gen;
    if (reply_service_create(&sp, &p->svc) != AR_OK) {
        cli_error("cannot start the reply service");
        return false;
    }
    return true;
}

static void product_close(struct product *p)
{
    reply_service_destroy(p->svc);
    reply_generator_destroy(p->gen);
    engine_destroy(p->engine);
    tokenizer_destroy(p->tok);
    model_destroy(p->model);
    cache_destroy(p->cache);
    cache_destroy(p->bulk_cache);
    store_close(p->store);
    reply_profiles_destroy(p->profiles);
}

#define MAX_OPTS 16

/* A command's table (opts, MAX_OPTS entries): the options reply and batch share, then own's
 * n_own; returns the count. --shop is worded by each command. */
static size_t product_opts_table(struct product_opts *o, const struct ar_opt *own, size_t n_own,
                                 struct ar_opt opts[MAX_OPTS])
{
    const struct ar_opt common[] = {
        {"model", 'm', AR_OPT_STRING, &o->model, 0, 0, "FILE", "GGUF model",
         "<exe dir>/../models/" CLI_DEFAULT_MODEL ", then ./models/", NULL},
        /* model-loading options (--tokenizer-pre NAME, ...) go here, beside --model */
        {"tokenizer-pre", 0, AR_OPT_STRING, &o->tokenizer_pre, 0, 0, "NAME",
         "pre-tokenizer instead of the model's tokenizer.ggml.pre", NULL, NULL},
        {"shops", 0, AR_OPT_STRING, &o->shops, 0, 0, "FILE",
         "shop profiles (JSON; see src/reply/reply.h)", "built in", NULL},
        {"data-dir", 0, AR_OPT_STRING, &o->data_dir, 0, 0, "DIR", "where replies.db lives", NULL,
         NULL},
        {"threads", 't', AR_OPT_INT, &o->threads, 1, 256, "N", "model threads", NULL, NULL},
    };
    size_t n = AR_MIN(AR_ARRAY_LEN(common), (size_t)MAX_OPTS);
    memcpy(opts, common, n * sizeof(*opts));
    n_own = AR_MIN(n_own, MAX_OPTS - n);
    memcpy(opts + n, own, n_own * sizeof(*opts));
    return n + n_own;
}

/* ---- autoreply reply ------------------------------------------------------------------------ */

/* Seed of the FNV-1a keys below (review ids "cli-...", batch job files). Not FNV's offset
 * basis (a digit short of 14695981039346656037), kept so that ids and job files made by
 * earlier versions keep their names: a rerun finds its job and its stored replies. */
#define CLI_KEY_SEED 1469598103934665603ull

int cmd_reply(int argc, char **argv)
{
    struct product_opts o = product_opts_default;
    struct product p;
    const char *text = NULL, *review_id = NULL, *lang = NULL;
    char id_buf[40];
    int64_t rating = 0;
    bool json = false;
    struct reply_review rv;
    struct reply_result res;
    int rc = 1;
    struct ar_opt opts[MAX_OPTS];
    const struct ar_opt own[] = {
        {"shop", 0, AR_OPT_STRING, &o.shop, 0, 0, "ID", "shop (profile) the review belongs to",
         NULL, NULL},
        {"rating", 'r', AR_OPT_I64, &rating, 1, 5, "N", "the review's rating, 1 to 5 (required)",
         "", NULL},
        {"review-id", 0, AR_OPT_STRING, &review_id, 0, 0, "ID",
         "the review's id; asking again returns the stored reply", "a hash of text and rating",
         NULL},
        {"lang", 0, AR_OPT_STRING, &lang, 0, 0, "zh|en", "the review's language", "guessed",
         NULL},
        {"json", 0, AR_OPT_SET, &json, 0, 0, NULL, "print the whole answer as JSON", NULL, NULL},
    };
    const struct ar_opts spec = {.cmd = "reply",
                                 .usage = "reply TEXT --rating N [options]",
                                 .opts = opts,
                                 .n_opts = product_opts_table(&o, own, AR_ARRAY_LEN(own), opts),
                                 .max_args = -1};
    int first_arg;
    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    rc = 1;
    if (argc - first_arg > 1) {
        cli_error("reply: one review text at a time (quote it)");
        return 2;
    }
    if (first_arg < argc)
        text = argv[first_arg];
    if (!text || rating == 0) {
        cli_error("reply: usage: autoreply reply TEXT --rating N (1-5)");
        return 2;
    }
    if (!review_id) {
        uint64_t h = ar_fnv1a64(CLI_KEY_SEED, text, strlen(text));
        h = ar_fnv1a64(h, &rating, sizeof(rating));
        snprintf(id_buf, sizeof(id_buf), "cli-%016llx", (unsigned long long)h);
        review_id = id_buf;
    }
    if (!product_open(&o, &p)) {
        product_close(&p);
        return 1;
    }
    memset(&rv, 0, sizeof(rv));
    rv.shop_id = o.shop;
    rv.review_id = review_id;
    rv.text = text;
    rv.text_len = strlen(text);
    rv.rating = (int)rating;
    rv.lang = lang;
    reply_service_answer(p.svc, &rv, ENGINE_PRIO_INTERACTIVE, &res);
    if (json) {
        /* the same JSON as POST /v1/reviews/reply answers */
        cJSON *j = server_review_result_json(&res, review_id);
        char *s = j ? cJSON_Print(j) : NULL;
        if (s)
            printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(j);
        rc = res.err == REPLY_OK ? 0 : 1;
    } else if (res.err == REPLY_OK) {
        printf("%s\n", res.reply);
        fprintf(stderr,
                "autoreply: %s, sentiment %s, needs_human %s, action %s, %.0f ms (review %s/%s)\n",
                reply_source_str(res.source), reply_sentiment_str(res.sentiment),
                res.needs_human ? "yes" : "no", reply_action_str(res.action), res.latency_ms,
                o.shop, review_id);
        rc = 0;
    } else {
        cli_error("reply: %s", res.error);
        rc = res.err == REPLY_EINVAL ? 2 : 1;
    }
    reply_result_fini(&res);
    product_close(&p);
    return rc;
}

/* ---- autoreply batch ------------------------------------------------------------------------ */

#define BATCH_TTY_PERIOD_S 0.25 /* the bar is redrawn at most this often */
#define BATCH_LOG_PERIOD_S 3.0  /* a progress line when stderr is not a terminal */
#define BATCH_NOTES_MAX 20      /* per-line errors told on stderr (all are in the results) */

/* Where results go and what the user is told while they come. */
struct batch_run {
    int fd;           /* the -o file or stdout */
    const char *name; /* for messages */
    int write_errno;  /* the first failed write (0: none); the job goes on in the store */
    bool quiet, tty;
    int64_t total;     /* lines in the job */
    int64_t fin0;      /* finished (done or error) before this run */
    int64_t fin, errs; /* finished and errors so far, earlier runs included */
    double t0, last;   /* when this run started, when progress was last shown */
    bool bar_shown;    /* the bar is on the terminal's current line */
    int64_t notes;     /* per-line errors told */
};

/* "45s", "1m35s", "2h03m" */
static void fmt_duration(double s, char *out, size_t size)
{
    long t = s < 0 ? 0 : s > 359999999.0 ? 359999999 : (long)(s + 0.5);
    if (t < 60)
        snprintf(out, size, "%lds", t);
    else if (t < 3600)
        snprintf(out, size, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, size, "%ldh%02ldm", t / 3600, t / 60 % 60);
}

/* "40.1/s" and "ETA 1m35s" from the lines finished in this run; "" when none is yet. */
static void batch_rate(const struct batch_run *b, double now, char *rate, char *eta, size_t size)
{
    double dt = now - b->t0, r = dt > 0 ? (double)(b->fin - b->fin0) / dt : 0;
    rate[0] = eta[0] = '\0';
    if (r <= 0)
        return;
    snprintf(rate, size, "%.1f/s", r);
    fmt_duration((double)(b->total - b->fin) / r, eta, size);
}

static void batch_show(struct batch_run *b, bool final)
{
    double now = ar_time_s();
    char rate[32], eta[32], took[32], errs[48] = "";
    if (b->quiet || (!final && now - b->last < (b->tty ? BATCH_TTY_PERIOD_S : BATCH_LOG_PERIOD_S)))
        return;
    b->last = now;
    batch_rate(b, now, rate, eta, sizeof(rate));
    fmt_duration(now - b->t0, took, sizeof(took));
    if (b->errs)
        snprintf(errs, sizeof(errs), ", %lld error%s", (long long)b->errs, b->errs > 1 ? "s" : "");
    if (b->tty) {
        enum { WIDTH = 30 };
        static const char hashes[WIDTH + 1] = "##############################";
        int fill = b->total ? (int)(WIDTH * b->fin / b->total) : WIDTH;
        /* \r and erase to the end of the line: the bar is redrawn in place */
        fprintf(stderr, "\r\033[K[%.*s%*s] %lld/%lld%s%s%s %s %s", fill, hashes, WIDTH - fill, "",
                (long long)b->fin, (long long)b->total, errs, rate[0] ? "  " : "", rate,
                final    ? "in"
                : eta[0] ? "ETA"
                         : "",
                final ? took : eta);
        b->bar_shown = !final;
        if (final)
            fputc('\n', stderr);
    } else if (final) {
        fprintf(stderr, "batch: %lld/%lld done%s%s%s, took %s\n", (long long)b->fin,
                (long long)b->total, errs, rate[0] ? ", " : "", rate, took);
    } else {
        fprintf(stderr, "batch: %lld/%lld done%s%s%s%s%s\n", (long long)b->fin, (long long)b->total,
                errs, rate[0] ? ", " : "", rate, eta[0] ? ", ETA " : "", eta);
    }
    fflush(stderr);
}

/* One result line, written whole in one call (so a kill never leaves half a line) and at once:
 * what is in the file is what the store has, and a rerun rewrites it from the store. */
static void batch_write(struct batch_run *b, const char *json)
{
    struct iovec iov[2] = {{(void *)(uintptr_t)json, strlen(json)}, {(void *)(uintptr_t) "\n", 1}};
    size_t want = iov[0].iov_len + 1;
    ssize_t n;
    if (b->write_errno)
        return;
    do
        n = writev(b->fd, iov, 2);
    while (n < 0 && errno == EINTR);
    if (n < 0 || (size_t)n != want) /* a short write to a file: the disk is full */
        b->write_errno = n < 0 ? errno : ENOSPC;
}

/* A line finished in an earlier run (the resumed output starts with them). */
static void batch_earlier_line(void *user, int64_t line, const char *json, const char *error)
{
    struct batch_run *b = user;
    (void)line;
    batch_write(b, json);
    b->fin0++;
    b->fin++;
    b->errs += error != NULL;
}

static void batch_line(void *user, int64_t line, const char *json, const char *error)
{
    struct batch_run *b = user;
    batch_write(b, json);
    b->fin++;
    if (error) {
        b->errs++;
        if (!b->quiet && b->notes < BATCH_NOTES_MAX) {
            if (b->bar_shown) /* the note goes on its own line, the bar is redrawn below it */
                fputs("\r\033[K", stderr);
            fprintf(stderr, "batch: line %lld: %s\n", (long long)line, error);
            if (++b->notes == BATCH_NOTES_MAX)
                fprintf(stderr, "batch: further line errors are only in the results\n");
            if (b->bar_shown)
                b->last = 0; /* the bar comes back at once */
            b->bar_shown = false;
        }
    }
    batch_show(b, false);
}

static void batch_progress(void *user, const struct store_job_info *info)
{
    struct batch_run *b = user;
    b->total = info->n_total; /* the counts come from the lines as they finish */
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!f)
        return NULL;
    for (;;) {
        size_t got;
        if (n + 65536 > cap) {
            char *q = realloc(buf, cap = cap ? cap * 2 : 1 << 20);
            if (!q) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = q;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (!got)
            break;
    }
    fclose(f);
    *len = n;
    return buf;
}

static bool write_atomic(const char *path, const char *data, size_t len)
{
    char tmp[PATH_MAX + 80];
    FILE *f;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        if (f)
            fclose(f);
        return false;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        return false;
    return true;
}

/* The job of this exact input file (path, size, mtime, shop), remembered beside the store in
 * map_path: the one found there (resumed), or a new one. False (reported, *rc set) when the
 * file cannot be read or is not a job. */
static bool batch_job(struct product *p, const struct product_opts *o, const char *input,
                      const char *real, const char *map_path, bool quiet,
                      char job_id[STORE_JOB_ID_LEN + 1], int *rc)
{
    struct ar_err err = {AR_OK, 0, {0}};
    struct store_job_info info;
    bool found = false;
    FILE *f = fopen(map_path, "r");
    size_t len = 0;
    int64_t n = 0;
    char *body;
    enum ar_status st;
    job_id[0] = '\0';
    if (f) {
        if (fscanf(f, "%32s", job_id) != 1)
            job_id[0] = '\0';
        fclose(f);
    }
    if (job_id[0] && (store_job_get(p->store, job_id, &info, &found, NULL) != AR_OK || !found))
        job_id[0] = '\0';
    if (job_id[0]) {
        if (!quiet)
            fprintf(stderr, "autoreply: resuming job %s (%lld of %lld lines done)\n", job_id,
                    (long long)(info.n_done + info.n_failed), (long long)info.n_total);
        return true;
    }
    if (!(body = read_all(real, &len))) {
        cli_error("batch: cannot read %s", input);
        return false;
    }
    st = reply_job_create(p->svc, o->shop, body, len, job_id, &n, &err);
    free(body);
    if (st != AR_OK) {
        cli_error("batch: %s: %s", input, err.msg[0] ? err.msg : ar_status_str(st));
        *rc = st == AR_EINVAL ? 2 : 1;
        return false;
    }
    {
        char line[STORE_JOB_ID_LEN + 2];
        snprintf(line, sizeof(line), "%s\n", job_id);
        if (!write_atomic(map_path, line, strlen(line)))
            AR_WARN("batch: cannot write %s: an interrupted run will start over", map_path);
    }
    if (!quiet)
        fprintf(stderr, "autoreply: job %s: %lld lines\n", job_id, (long long)n);
    return true;
}

int cmd_batch(int argc, char **argv)
{
    struct product_opts o = product_opts_default;
    struct product p;
    const char *input = NULL, *output = NULL;
    char real[PATH_MAX], map_path[PATH_MAX + 64], job_id[STORE_JOB_ID_LEN + 1] = "";
    struct stat sb;
    struct batch_run b;
    struct store_job_info info;
    struct ar_err err = {AR_OK, 0, {0}};
    bool quiet = false, found = false;
    uint64_t key;
    int rc = 1;
    enum ar_status st;
    memset(&b, 0, sizeof(b));
    b.fd = -1;
    struct ar_opt opts[MAX_OPTS];
    const struct ar_opt own[] = {
        {"shop", 0, AR_OPT_STRING, &o.shop, 0, 0, "ID", "shop of lines without shop_id", NULL,
         NULL},
        {"output", 'o', AR_OPT_STRING, &output, 0, 0, "FILE",
         "results, one JSON line per input line, each written as soon\n"
         "as it is answered",
         "stdout", NULL},
        {"quiet", 'q', AR_OPT_SET, &quiet, 0, 0, NULL,
         "no progress on stderr (a bar on a terminal, else a line every\n"
         "few seconds) and no per-line notes",
         NULL, NULL},
    };
    const struct ar_opts spec = {
        .cmd = "batch",
        .usage = "batch REVIEWS.jsonl [-o REPLIES.jsonl] [options]",
        .about = "Each line: {\"review_id\" (or \"id\"), \"text\", \"rating\", \"shop_id\"?, "
                 "\"product\"?, \"lang\"?};\n"
                 "a bad line gets {\"line\": N, \"error\": \"...\"} in the results. An "
                 "interrupted batch resumes\n"
                 "where it stopped when run again on the same unchanged file (the results are "
                 "rewritten whole).",
        .opts = opts,
        .n_opts = product_opts_table(&o, own, AR_ARRAY_LEN(own), opts),
        .max_args = -1};
    int first_arg;
    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    rc = 1;
    if (argc - first_arg > 1) {
        cli_error("batch: one input file");
        return 2;
    }
    if (first_arg < argc)
        input = argv[first_arg];
    if (!input) {
        cli_error("batch: usage: autoreply batch REVIEWS.jsonl [-o REPLIES.jsonl]");
        return 2;
    }
    if (!realpath(input, real) || stat(real, &sb) != 0) {
        cli_error("batch: %s: %s", input, strerror(errno));
        return 1;
    }
    key = ar_fnv1a64(CLI_KEY_SEED, real, strlen(real));
    key = ar_fnv1a64(key, &sb.st_size, sizeof(sb.st_size));
    key = ar_fnv1a64(key, &sb.st_mtim, sizeof(sb.st_mtim));
    key = ar_fnv1a64(key, o.shop, strlen(o.shop));
    snprintf(map_path, sizeof(map_path), "%s/batch-%016llx.job", o.data_dir,
             (unsigned long long)key);
    if (!product_open(&o, &p))
        goto done;
    if (!batch_job(&p, &o, input, real, map_path, quiet, job_id, &rc))
        goto done;
    if ((st = store_job_get(p.store, job_id, &info, &found, &err)) != AR_OK || !found) {
        cli_error("batch: job %s: %s", job_id, found ? err.msg : "gone from the store");
        goto done;
    }
    /* the output is opened only now (a file that is not a job leaves it alone), and starts
     * over: first what earlier runs finished, from the store, then each line as it is answered */
    b.name = output ? output : "stdout";
    b.fd = output ? open(output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : 1;
    if (b.fd < 0) {
        cli_error("batch: cannot write %s: %s", output, strerror(errno));
        goto done;
    }
    b.quiet = quiet;
    b.tty = isatty(2);
    b.total = info.n_total;
    if ((st = reply_job_results_each(p.svc, job_id, batch_earlier_line, &b, &err)) != AR_OK) {
        cli_error("batch: job %s: results: %s", job_id, err.msg[0] ? err.msg : ar_status_str(st));
        goto done;
    }
    b.t0 = ar_time_s();
    st = reply_job_run_lines(p.svc, job_id, batch_progress, batch_line, &b, &err);
    if (!b.write_errno && output && fsync(b.fd) != 0 && errno != EINVAL)
        b.write_errno = errno;
    if (b.bar_shown && (st != AR_OK || b.write_errno)) /* the error goes below the bar */
        fputc('\n', stderr);
    if (st != AR_OK) {
        cli_error("batch: job %s: %s (run again to resume)", job_id,
                  err.msg[0] ? err.msg : ar_status_str(st));
        goto done;
    }
    if (b.write_errno) {
        cli_error("batch: cannot write %s: %s (every reply is stored: run again to write them)",
                  b.name, strerror(b.write_errno));
        goto done;
    }
    batch_show(&b, true);
    rc = 0;
done:
    if (b.fd > 1 && close(b.fd) != 0 && rc == 0) {
        cli_error("batch: cannot write %s: %s", b.name, strerror(errno));
        rc = 1;
    }
    product_close(&p);
    return rc;
}

/* ---- serve wiring ------------------------------------------------------------------------ */

struct cli_reply {
    struct product p; /* profiles, store, cache, svc (model and engine belong to serve) */
    struct reply_generator *gen;
    struct queue *queue; /* job lines: RabbitMQ with --queue, else NULL (in process) */
    struct server *srv;  /* borrowed */
};

/* /health's "postgres" and "rabbitmq": what each backend knew at its last contact */
static int store_health(void *user)
{
    struct cli_reply *cr = user;
    return store_healthy(cr->p.store) ? SERVER_HEALTH_OK : SERVER_HEALTH_DOWN;
}

static int queue_health(void *user)
{
    struct cli_reply *cr = user;
    return queue_healthy(cr->queue) ? SERVER_HEALTH_OK : SERVER_HEALTH_DOWN;
}

/* /health's "redis": the shared reply cache and the rate-limit buckets both reach it */
static int redis_health(void *user)
{
    struct cli_reply *cr = user;
    bool cache_ok = cache_redis_healthy(cr->p.cache) && cache_redis_healthy(cr->p.bulk_cache);
    bool rate_ok = server_rate_limit_healthy(cr->srv);
    return cache_ok && rate_ok ? SERVER_HEALTH_OK : SERVER_HEALTH_DOWN;
}

int cli_reply_attach(struct server *srv, const struct cli_reply_opts *opts, struct cli_reply **out)
{
    struct ar_err err = {AR_OK, 0, {0}};
    struct product_opts o = product_opts_default;
    struct cache_memory_params cp = cache_memory_default_params();
    struct reply_service_params sp = reply_service_default_params();
    struct server_reviews_params rp = server_reviews_default_params();
    struct cli_reply *cr = calloc(1, sizeof(*cr));
    enum ar_status st;
    if (!cr)
        return 1;
    cr->srv = srv;
    o.shops = opts->shops_file;
    o.store_url = opts->store_url;
    if (opts->data_dir)
        o.data_dir = opts->data_dir;
    if (!open_profiles_store(&o, &cr->p))
        goto fail;
    for (int c = 0; opts->reply_cache && c < CACHE_N_CLASSES; c++) {
        struct cache **slot = c == CACHE_CLASS_BULK ? &cr->p.bulk_cache : &cr->p.cache;
        cp = cache_memory_default_params();
        if (c == CACHE_CLASS_BULK)
            cp.max_bytes = (size_t)CLI_BULK_CACHE_MB << 20;
        if (opts->cache_mb[c] >= 0) /* 0: no in-process level (with --cache: Redis alone) */
            cp.max_bytes = (size_t)opts->cache_mb[c] << 20;
        if (opts->cache_ttl_s[c] >= 0)
            cp.ttl_s = opts->cache_ttl_s[c]; /* 0: never */
        if (cache_open_class(opts->cache_url, (enum cache_class)c, &cp, slot, &err) != AR_OK) {
            cli_error("serve: %s reply cache: %s", cache_class_str((enum cache_class)c),
                      err.msg[0] ? err.msg : "cannot create it");
            goto fail;
        }
    }
    if (opts->cache_url && server_add_health_check(srv, "redis", redis_health, cr) != AR_OK) {
        cli_error("serve: out of memory");
        goto fail;
    }
    if (opts->queue_url) {
        struct queue_params qp = queue_default_params();
        if (queue_open(opts->queue_url, &qp, &cr->queue, &err) != AR_OK) {
            cli_error("serve: --queue: %s", err.msg[0] ? err.msg : "cannot open the queue");
            goto fail;
        }
        if (server_add_health_check(srv, "rabbitmq", queue_health, cr) != AR_OK) {
            cli_error("serve: out of memory");
            goto fail;
        }
    }
    if (opts->store_url && strcmp(store_backend_name(cr->p.store), "postgres") == 0 &&
        server_add_health_check(srv, "postgres", store_health, cr) != AR_OK) {
        cli_error("serve: out of memory");
        goto fail;
    }
    sp.profiles = cr->p.profiles;
    sp.store = cr->p.store;
    sp.cache = cr->p.cache;
    sp.bulk_cache = cr->p.bulk_cache;
    sp.queue = cr->queue;
    sp.job_slots = opts->job_slots; /* bulk lines held at once: the engine's batch */
    sp.metrics = server_metrics(srv);
    sp.n_workers = 32;                       /* mostly waiting on the engine */
    sp.instance = server_instance_name(srv); /* the owner of this instance's claims */
    if (reply_service_create(&sp, &cr->p.svc) != AR_OK) {
        cli_error("serve: cannot start the reply service");
        goto fail;
    }
    if (opts->max_job_body)
        rp.max_job_body = opts->max_job_body;
    if (opts->job_max_open)
        rp.job_max_open = opts->job_max_open;
    if (opts->job_max_bytes)
        rp.job_max_bytes = opts->job_max_bytes;
    if ((st = server_reviews_attach(srv, cr->p.svc, &rp)) != AR_OK) {
        cli_error("serve: cannot add the review routes: %s", ar_status_str(st));
        goto fail;
    }
    *out = cr;
    return 0;
fail:
    cli_reply_detach(cr);
    return 1;
}

void cli_reply_set_engine(struct cli_reply *cr, struct engine *e, const struct tokenizer *tok,
                          const char *model_name)
{
    if (reply_engine_generator(e, tok, model_name, &cr->gen) != AR_OK) {
        cli_error("serve: reply service: out of memory");
        return;
    }
    reply_service_set_generator(cr->p.svc, cr->gen);
    if (reply_jobs_start(cr->p.svc) != AR_OK)
        cli_error("serve: cannot start the job runner");
}

void cli_reply_detach(struct cli_reply *cr)
{
    if (!cr)
        return;
    reply_service_destroy(cr->p.svc); /* stops the job runner: unacked lines go back */
    queue_destroy(cr->queue);
    reply_generator_destroy(cr->gen);
    cache_destroy(cr->p.cache);
    cache_destroy(cr->p.bulk_cache);
    store_close(cr->p.store);
    reply_profiles_destroy(cr->p.profiles);
    free(cr);
}
