/* cmd_bench.c - `autoreply bench -m MODEL`: prefill (ppN) and decode (tgN) speed, the memory
 * read bandwidth of this machine measured next to each decode repetition, and decode
 * efficiency = tok/s x weight bytes read per token / bandwidth (per repetition, then the
 * median); for a mixture of experts the bytes per token are the active ones (the used
 * experts), not the file's. Prints the CPU and the kernels in use first (per tensor type of
 * the model: which variant's gemm and vec_dot run). Per thread count also the int8
 * multiply-accumulate peak of the instruction the Q8_0 kernels use (a short timed loop on every
 * thread), prefill's matrix work as a fraction of it, and with -b the time of one decode step
 * of B sequences at once against one sequence. --json prints one object per line. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/cpu.h"
#include "base/opts.h"
#include "base/pool.h"
#include "cli.h"
#include "cli_internal.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kv/kv.h"
#include "model/model.h"

/* ---- memory read bandwidth ------------------------------------------------------------------ */

struct bw_job {
    const uint64_t *buf;
    size_t n; /* uint64 words */
    bool lines; /* one word per 64-byte line (ar_read_lines) rather than every word */
    uint64_t sums[64];
};

static void bw_read(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    int64_t b, e;
    ar_pool_range((int64_t)j->n, 64, ith, nth, &b, &e);
    size_t size = (size_t)(e - b) * sizeof(uint64_t);
    j->sums[ith & 63] =
        j->lines ? ar_read_lines(j->buf + b, size) : ar_read_words(j->buf + b, size);
}

/* Best of `passes` reads of a buffer much larger than the caches in each of ar_read_words's
 * and ar_read_lines's forms, in GB/s (1e9 B/s): the faster form is the nearer estimate of what
 * the memory can deliver (the word read alone had decode efficiency at 1.1-1.2 on an Intel
 * Xeon, whose kernels streamed faster than it). */
static double measure_bandwidth(struct ar_pool *pool, struct bw_job *j, int passes)
{
    double best = 0;
    for (int rep = 0; rep < 2 * passes; rep++) {
        j->lines = rep % 2;
        double t0 = ar_time_s();
        ar_pool_run(pool, bw_read, j);
        double dt = ar_time_s() - t0;
        double gbs = (double)(j->n * sizeof(uint64_t)) / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    return best;
}

/* A buffer of `bytes` for measure_bandwidth, written once (so its pages are mapped). It is in
 * huge pages as the packed weights are (model.c): read through 4 KiB pages, a buffer whose
 * page tables a decode has pushed out of the caches measured 1.5-8 GB/s on a virtual machine
 * that streams 28 GB/s through huge pages, so decode efficiency read 2-15. */
static bool bw_init(struct bw_job *j, size_t bytes)
{
    uint64_t *buf;
    memset(j, 0, sizeof(*j));
    buf = ar_huge_alloc(bytes);
    if (!buf)
        return false;
    j->n = bytes / sizeof(uint64_t);
    for (size_t i = 0; i < j->n; i++)
        buf[i] = i;
    j->buf = buf;
    return true;
}

static void bw_free(struct bw_job *j)
{
    ar_huge_free((void *)(uintptr_t)j->buf, j->n * sizeof(uint64_t));
    j->buf = NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v; the mean of the middle two when n is even). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- int8 multiply-accumulate peak ------------------------------------------------------------
 */

struct peak_job {
    const struct kernel_ops *k;
    int64_t rounds; /* per thread */
    uint8_t a[64];  /* 0..127 and -64..63: the ranges int8_peak takes */
    int8_t b[64];
    uint64_t macs[64];
    uint32_t sums[64][16];
};

static void peak_run(void *ctx, int ith, int nth)
{
    struct peak_job *j = ctx;
    (void)nth;
    j->macs[ith & 63] = j->k->int8_peak(j->rounds, j->a, j->b, j->sums[ith & 63]);
}

/* The int8 peak of the pool's threads in GOPS (a multiply-accumulate counts 2 ops): the rounds
 * doubled until one run takes 20 ms, then the best of 3 runs. */
static double measure_int8_peak(struct ar_pool *pool)
{
    struct peak_job j;
    int nth = ar_pool_size(pool);
    double best = 0, dt = 0;
    memset(&j, 0, sizeof(j));
    j.k = kernels_get();
    for (int i = 0; i < 64; i++) {
        j.a[i] = (uint8_t)(1 + i);
        j.b[i] = (int8_t)(i % 2 ? -i : i);
    }
    for (j.rounds = 256; j.rounds < ((int64_t)1 << 40); j.rounds *= 2) {
        double t0 = ar_time_s();
        ar_pool_run(pool, peak_run, &j);
        if ((dt = ar_time_s() - t0) >= 0.02)
            break;
    }
    for (int rep = 0; rep < 3; rep++) {
        uint64_t macs = 0;
        double t0 = ar_time_s();
        ar_pool_run(pool, peak_run, &j);
        dt = ar_time_s() - t0;
        for (int t = 0; t < nth && t < 64; t++)
            macs += j.macs[t];
        if (dt > 0 && 2.0 * (double)macs / dt / 1e9 > best)
            best = 2.0 * (double)macs / dt / 1e9;
    }
    return best;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static long proc_status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t fl = strlen(field);
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, field, fl) && line[fl] == ':')
            v = strtol(line + fl + 1, NULL, 10);
    fclose(f);
    return v;
}

static const char *file_type_name(uint32_t ft)
{
    switch (ft) {
    case 0:
        return "f32";
    case 1:
        return "f16";
    case 2:
        return "q4_0";
    case 7:
        return "q8_0";
    case 14:
        return "q4_k_s";
    case 15:
        return "q4_k_m";
    case 17:
        return "q5_k_m";
    case 18:
        return "q6_k";
    case 32:
        return "bf16";
    default:
        return "other";
    }
}

/* The CPU's model name from /proc/cpuinfo into buf ("unknown" where there is none). */
static void cpu_model_name(char *buf, size_t size)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(buf, size, "unknown");
    while (f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon)
            continue;
        colon += 1 + strspn(colon + 1, " \t");
        colon[strcspn(colon, "\n")] = 0;
        snprintf(buf, size, "%s", colon);
        break;
    }
    if (f)
        fclose(f);
}

/* Where the figures come from: CPU, its features, the kernels chosen; one line, or one JSON
 * object. */
static void print_machine(bool json)
{
    char cpu[128], feat[256];
    cpu_model_name(cpu, sizeof(cpu));
    ar_cpu_features_str(ar_cpu_features_get(), feat, (int)sizeof(feat));
    for (char *c = cpu; *c; c++)
        if (*c == '"' || *c == '\\')
            *c = ' ';
    const struct ar_cpu_features *f = ar_cpu_features_get();
    const struct kernel_ops *k = kernels_get();
    const char *vendor = f->amd ? "AMD" : "other";
    if (json)
        printf("{\"cpu\":\"%s\",\"vendor\":\"%s\",\"family\":%d,\"features\":\"%s\","
               "\"kernels\":\"%s\",\"tuning\":\"%s\"}\n",
               cpu, vendor, f->family, feat, k->name, k->tuning ? k->tuning : "");
    else
        printf("cpu: %s (%s family 0x%x; %s); kernels: %s%s%s\n", cpu, vendor, (unsigned)f->family,
               feat, k->name, k->tuning ? "; " : "", k->tuning ? k->tuning : "");
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Which variant's gemm and vec_dot run for each type of the model's matrices (tensors of two or
 * more dimensions; 1-D ones take only the f32 ops), and the int8 peak loop's instruction. */
static void print_kernels(const struct model *m, bool json)
{
    const struct kernel_ops *k = kernels_get();
    const struct gguf_file *f = model_gguf(m);
    bool used[AR_TYPE_COUNT] = {false};
    int n = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->n_dims >= 2 && (unsigned)t->type < AR_TYPE_COUNT)
            used[t->type] = true;
    }
    printf(json ? "{\"kernels_by_type\":{" : "kernels by tensor type:");
    for (int t = 0; t < AR_TYPE_COUNT; t++) {
        const char *name = ar_type_name((uint32_t)t), *g = k->gemm_by[t], *d = k->vec_dot_by[t];
        if (!used[t] || !name)
            continue;
        if (json)
            printf("%s\"%s\":{\"gemm\":\"%s\",\"gemm_loop\":%s,\"vec_dot\":\"%s\"}", n ? "," : "",
                   name, g ? g : "none", k->gemm_loop[t] ? "true" : "false", d ? d : "none");
        else
            printf("%s %s: gemm %s%s, vec_dot %s", n ? ";" : "", name, g ? g : "none",
                   k->gemm_loop[t] ? " (loop over vec_dot)" : "", d ? d : "none");
        n++;
    }
    if (json)
        printf("},\"int8_peak_insn\":\"%s\",\"int8_peak_kernels\":\"%s\"}\n", k->int8_peak_insn,
               k->int8_peak_by);
    else
        printf("\nint8 peak loop: %s (%s)\n", k->int8_peak_insn, k->int8_peak_by);
}

/* ---- batched decode -------------------------------------------------------------------------- */

#define BATCH_PROMPT 32 /* tokens each sequence holds before the timed steps */
#define BATCH_STEPS 8   /* timed steps per batch size, after one untimed */
#define BATCH_BLOCK 16

/* For each batch size bs[i]: bs[i] sequences, each given its own BATCH_PROMPT-token prompt,
 * then decode steps of one row per sequence, all at the same position, through one
 * model_forward (the engine's batched decode); step_s[i] gets the median step time. Its own KV
 * cache and scratch over the model, the pool's threads. */
static enum ar_status bench_batch(const struct model *m, struct ar_pool *pool, const int *bs,
                                  int nb, double *step_s, struct ar_err *err)
{
    const int n_vocab = model_hparams(m)->n_vocab, n_tok = BATCH_PROMPT + BATCH_STEPS + 1;
    int bmax = 1;
    for (int i = 0; i < nb; i++)
        bmax = AR_MAX(bmax, bs[i]);
    const int rows = AR_MAX(bmax, BATCH_PROMPT);
    enum ar_status st = AR_OK;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct model_ctx *ctx = NULL;
    struct kv_seq *seqs = ar_calloc((size_t)bmax, sizeof(*seqs));
    struct kv_seq **ptrs = ar_calloc((size_t)bmax, sizeof(*ptrs));
    int32_t *tok = ar_malloc(sizeof(int32_t) * 3 * (size_t)rows);
    int32_t *pos = tok ? tok + rows : NULL, *seq = tok ? tok + 2 * rows : NULL;
    uint8_t *want = ar_malloc((size_t)rows);
    float *logits = ar_malloc(sizeof(float) * (size_t)bmax * (size_t)n_vocab);
    uint64_t rng = 0x2545f4914f6cdd1dull;
    if (!seqs || !ptrs || !tok || !want || !logits) {
        st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        goto out;
    }
    for (int s = 0; s < bmax; s++) {
        kv_seq_init(&seqs[s]);
        ptrs[s] = &seqs[s];
    }
    model_kv_params(m, BATCH_BLOCK, (int64_t)bmax * ((n_tok + BATCH_BLOCK - 1) / BATCH_BLOCK),
                    AR_TYPE_F16, &kp);
    if (kp.swa_layers) /* a local pool as large as the global one: nothing to slide */
        kp.n_local_blocks = kp.n_blocks;
    if ((st = kv_create(&kp, &kv)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot allocate the KV cache for %d sequences", bmax);
        goto out;
    }
    if ((st = model_ctx_create(m, rows, pool, &ctx)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot allocate scratch buffers for %d rows", rows);
        goto out;
    }
    model_ctx_set_n_ctx(ctx, n_tok);
    for (int i = 0; i < nb; i++) {
        const int B = bs[i];
        double times[BATCH_STEPS];
        struct model_batch b = {.tokens = tok, .pos = pos, .seq = seq, .logits = NULL};
        /* each sequence its own random prompt, one forward pass apiece */
        for (int s = 0; s < B; s++) {
            kv_seq_fini(kv, &seqs[s]);
            if ((st = kv_seq_reserve(kv, &seqs[s], n_tok)) != AR_OK) {
                ar_err_set(err, st, 0, "KV cache full");
                goto out;
            }
            for (int r = 0; r < BATCH_PROMPT; r++) {
                tok[r] = (int32_t)(rng_next(&rng) % (uint64_t)n_vocab);
                pos[r] = r;
                seq[r] = 0;
            }
            b.n_tokens = BATCH_PROMPT;
            b.n_seqs = 1;
            b.logits = NULL;
            if ((st = model_forward(ctx, kv, &ptrs[s], &b, logits)) != AR_OK) {
                ar_err_set(err, st, 0, "forward pass failed: %s", ar_status_str(st));
                goto out;
            }
        }
        /* then steps of B rows, row r for sequence r, all at one position */
        for (int step = 0; step <= BATCH_STEPS; step++) {
            for (int r = 0; r < B; r++) {
                tok[r] = (int32_t)(rng_next(&rng) % (uint64_t)n_vocab);
                pos[r] = BATCH_PROMPT + step;
                seq[r] = r;
                want[r] = 1;
            }
            b.n_tokens = B;
            b.n_seqs = B;
            b.logits = want;
            double t0 = ar_time_s();
            if ((st = model_forward(ctx, kv, ptrs, &b, logits)) != AR_OK) {
                ar_err_set(err, st, 0, "forward pass failed: %s", ar_status_str(st));
                goto out;
            }
            if (step > 0) /* the first warms the caches for this batch size */
                times[step - 1] = ar_time_s() - t0;
        }
        step_s[i] = median(times, BATCH_STEPS);
    }
out:
    for (int s = 0; seqs && kv && s < bmax; s++)
        kv_seq_fini(kv, &seqs[s]);
    model_ctx_destroy(ctx);
    kv_destroy(kv);
    ar_free(seqs);
    ar_free(ptrs);
    ar_free(tok);
    ar_free(want);
    ar_free(logits);
    return st;
}

/* Parses "a,b,c" into at most max integers in [lo, hi]; false (after the error) otherwise. */
static bool parse_list(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out,
                       int max, int *n, struct ar_err *err)
{
    char *list = strdup(v), *tok, *save = NULL;
    *n = 0;
    if (!list) {
        ar_err_set(err, AR_ENOMEM, 0, "%s: out of memory", flag);
        return false;
    }
    for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == max) {
            ar_err_set(err, AR_EINVAL, 0, "%s: at most %d values", flag, max);
            free(list);
            return false;
        }
        if (!ar_opts_parse_i64(flag, tok, lo, hi, &out[*n], err)) {
            free(list);
            return false;
        }
        (*n)++;
    }
    free(list);
    if (!*n)
        ar_err_set(err, AR_EINVAL, 0, "%s: empty list", flag);
    return *n > 0;
}

/* ---- the benchmark -------------------------------------------------------------------------- */

#define MAX_LIST 8

#define STR_(x) #x
#define STR(x) STR_(x)

/* The lists bench's options fill. */
struct bench_lists {
    int64_t threads[MAX_LIST], prompts[MAX_LIST], batch[MAX_LIST + 1];
    int n_threads, n_prompts, n_batch;
};

static bool set_threads(void *ctx, const char *flag, const char *v, struct ar_err *err)
{
    struct bench_lists *l = ctx;
    return parse_list(flag, v, 1, 256, l->threads, MAX_LIST, &l->n_threads, err);
}

static bool set_prompts(void *ctx, const char *flag, const char *v, struct ar_err *err)
{
    struct bench_lists *l = ctx;
    return parse_list(flag, v, 1, 65536, l->prompts, MAX_LIST, &l->n_prompts, err);
}

static bool set_batch(void *ctx, const char *flag, const char *v, struct ar_err *err)
{
    struct bench_lists *l = ctx;
    /* room for a 1 put in front: the ratios are to one sequence */
    return parse_list(flag, v, 1, 256, l->batch + 1, MAX_LIST, &l->n_batch, err);
}

int cmd_bench(int argc, char **argv)
{
    const char *path = NULL;
    struct bench_lists l = {.threads = {1, 2}, .prompts = {512}, .n_threads = 2, .n_prompts = 1};
    int64_t *threads = l.threads, *prompts = l.prompts, *batch_list = l.batch;
    int64_t n_gen = 128, reps = 2, bw_mib = 1024;
    bool json = false;
    int rc = 1, first_arg;
    const struct ar_opt opts[] = {
        {"model", 'm', AR_OPT_STRING, &path, 0, 0, "FILE", "GGUF model (required)", NULL, NULL},
        /* model-loading options (--tokenizer-pre NAME, ...) go here, beside --model */
        {"threads", 't', AR_OPT_CALL, NULL, 0, 0, "N[,N]", "thread counts, each measured", "1,2",
         set_threads},
        {NULL, 'p', AR_OPT_CALL, NULL, 0, 0, "N[,N]", "prompt lengths of the prefills", "512",
         set_prompts},
        {NULL, 'n', AR_OPT_I64, &n_gen, 1, 65536, "N", "decode steps", NULL, NULL},
        {"reps", 'r', AR_OPT_I64, &reps, 1, 100, "REPS", "repetitions", NULL, NULL},
        {"batch", 'b', AR_OPT_CALL, NULL, 0, 0, "B[,B]", "batched decode sizes (see below)", "off",
         set_batch},
        {"bw-mib", 0, AR_OPT_I64, &bw_mib, 64, 65536, "MIB", "bandwidth buffer size", NULL, NULL},
        {"json", 0, AR_OPT_SET, &json, 0, 0, NULL, "one JSON object instead of a table", NULL,
         NULL},
    };
    const struct ar_opts spec = {
        .cmd = "bench",
        .usage = "bench -m MODEL [-t 1,2] [-p 512[,2048]] [-n 128] [-r REPS] [-b 1,4,16,64] "
                 "[options]",
        .about =
            "First the CPU, its features and the kernel variant; after loading, per tensor\n"
            "type of the model's matrices the variant whose gemm and vec_dot run\n"
            "(kernels_by_type), and the instruction the int8 peak loop times.\n"
            "Per thread count: int8_peak_gops, the int8 multiply-accumulate peak of those\n"
            "threads (a multiply-add is 2 ops) from a short timed loop of independent\n"
            "accumulator chains of the instruction the Q8_0 kernels use (vpdpbusd zmm\n"
            "with AVX-512 VNNI, vpmaddubsw+vpmaddwd otherwise), best of 3 runs of 20 ms,\n"
            "measured before the repetitions and after each one's prefills: the best.\n"
            "First one prefill of the first -p length, cold: the weights are paged in and\n"
            "the buffers touched (cold_tokens_per_s, not a repetition).\n"
            "Then REPS times (default 2): a ppN prefill per -p value, then N decode steps\n"
            "(tgN), then the memory read bandwidth (best of 3 reads of a --bw-mib buffer\n"
            "by that many threads word by word and 3 touching one word per 64-byte line),\n"
            "measured right after each decode so both see the same\n"
            "machine load. tokens_per_s: the best repetition; bandwidth_gbs: the median\n"
            "of the repetitions' bandwidths; efficiency (decode): the median over\n"
            "repetitions of tok/s x weight bytes per token / that repetition's bandwidth\n"
            "(a mixture of experts: the used experts' bytes, weight_bytes; the file's\n"
            "matrices: weight_bytes_all);\n"
            "tokens_per_s_median: the median decode speed; gflops_per_s (prefill): the\n"
            "pass's floating-point operations (model_prefill_flops: matrices, causal\n"
            "attention, the last row's logits) per second at the best repetition;\n"
            "int8_gops (prefill): the matrix part alone (the work of the int8 kernels) per\n"
            "second; int8_fraction: int8_gops / int8_peak_gops.\n"
            /* clang-format off */
            "-b: batched decode, once per thread count: B sequences with a "
            STR(BATCH_PROMPT) "-token prompt\n"
            "each, then steps of one row per sequence at one position in one forward pass;\n"
            "step_ms: the median of " STR(BATCH_STEPS) " steps; ratio_vs_b1: step_ms / step_ms "
            "at B=1\n"
            "(B=1 is measured first whether listed or not).",
        /* clang-format on */
        .opts = opts,
        .n_opts = AR_ARRAY_LEN(opts),
        .max_args = 0,
        .ctx = &l};

    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    rc = 1;
    int n_thread_sets = l.n_threads, n_prompts = l.n_prompts, n_batch = l.n_batch;
    if (!path) {
        cli_error("bench: -m MODEL is required");
        return 2;
    }
    /* the batch sizes: 1 first, then the list without its 1s */
    int batch[MAX_LIST + 1], nb = 0;
    if (n_batch) {
        batch[nb++] = 1;
        for (int i = 1; i <= n_batch; i++)
            if (batch_list[i] != 1)
                batch[nb++] = (int)batch_list[i];
    }
    int64_t p_max = 1;
    for (int i = 0; i < n_prompts; i++)
        p_max = AR_MAX(p_max, prompts[i]);
    print_machine(json);
    for (int ts = 0; ts < n_thread_sets; ts++) {
        struct cli_runner *r = NULL;
        struct ar_pool *pool = NULL;
        struct ar_err err = {0};
        int nt = (int)threads[ts];
        int n_ctx = (int)(p_max > 1 + n_gen ? p_max : 1 + n_gen);
        if (cli_runner_open(path, nt, AR_TYPE_F16, n_ctx, &r, &err) != AR_OK) {
            cli_error("%s: %s", path, err.msg);
            return 1;
        }
        /* after loading: weights mapped (not read yet), KV cache and scratch allocated */
        long rss_load_kb = proc_status_kb("VmRSS");
        const struct model *m = cli_runner_model(r);
        const struct model_hparams *hp = model_hparams(m);
        uint32_t ft = 0;
        const char *type =
            gguf_get_u32(model_gguf(m), "general.file_type", &ft) ? file_type_name(ft) : "other";
        /* what one decode step reads: all matrices, of a mixture only the used experts */
        uint64_t wbytes = model_active_weight_bytes(m), wbytes_all = model_weight_bytes(m);
        int32_t *toks = ar_malloc(sizeof(int32_t) * (size_t)p_max);
        uint64_t seed = 0x9e3779b97f4a7c15ull;
        float *logits;
        double pp_best[MAX_LIST] = {0}, tg_best = 0, peak = 0, step_s[MAX_LIST + 1];
        /* per repetition: decode tok/s, the bandwidth measured right after it, efficiency */
        double *tg_rep = ar_malloc(sizeof(double) * 3 * (size_t)reps);
        double *bw_rep = tg_rep ? tg_rep + reps : NULL,
               *eff_rep = tg_rep ? tg_rep + 2 * reps : NULL;
        struct bw_job bwj;
        if (!toks || !tg_rep || ar_pool_create(nt, &pool) != AR_OK ||
            !bw_init(&bwj, (size_t)bw_mib << 20)) {
            cli_error("bench: out of memory");
            ar_free(toks);
            ar_free(tg_rep);
            ar_pool_destroy(pool);
            cli_runner_close(r);
            return 1;
        }
        if (ts == 0)
            print_kernels(m, json);
        /* the int8 peak of these threads: now, and again after each repetition's prefills
         * (the machine's load moves; the best is the closest to its capacity) */
        peak = measure_int8_peak(pool);
        for (int64_t i = 0; i < p_max; i++)
            toks[i] = (int32_t)(rng_next(&seed) % (uint64_t)hp->n_vocab);
        /* the first prefill, timed on its own and kept out of the repetitions: it pays for
         * paging the mapped weights in (a mixture's experts: several times a dense model's
         * bytes) and for first touches of the KV cache and scratch, which a serving process
         * pays once (a qwen3moe shape with 2.8 GiB of Q8_0 weights prefilled 512 tokens at
         * 384 tok/s cold against 990 warm; qwen2-0.5B 532 against 630) */
        double t_cold = ar_time_s();
        if (cli_runner_prefill(r, toks, (int)prompts[0], false, &logits, &err) != AR_OK)
            goto fail;
        double pp_cold = (double)prompts[0] / (ar_time_s() - t_cold);
        for (int64_t rep = 0; rep < reps; rep++) {
            double t0, dt;
            for (int pi = 0; pi < n_prompts; pi++) {
                t0 = ar_time_s();
                if (cli_runner_prefill(r, toks, (int)prompts[pi], false, &logits, &err) != AR_OK)
                    goto fail;
                dt = ar_time_s() - t0;
                if ((double)prompts[pi] / dt > pp_best[pi])
                    pp_best[pi] = (double)prompts[pi] / dt;
            }
            peak = AR_MAX(peak, measure_int8_peak(pool));
            if (cli_runner_prefill(r, toks, 1, false, &logits, &err) != AR_OK)
                goto fail;
            t0 = ar_time_s();
            for (int64_t g = 0; g < n_gen; g++)
                if (cli_runner_decode(r, cli_argmax(logits, hp->n_vocab), &logits, &err) != AR_OK)
                    goto fail;
            dt = ar_time_s() - t0;
            tg_rep[rep] = (double)n_gen / dt;
            if (tg_rep[rep] > tg_best)
                tg_best = tg_rep[rep];
            /* the bandwidth available now, under the same load as the decode just run */
            bw_rep[rep] = measure_bandwidth(pool, &bwj, 3);
            eff_rep[rep] = bw_rep[rep] > 0 ? tg_rep[rep] * (double)wbytes / (bw_rep[rep] * 1e9) : 0;
        }
        bw_free(&bwj);
        if (nb && bench_batch(m, pool, batch, nb, step_s, &err) != AR_OK)
            goto fail;
        /* resident memory of the model after the run (every weight page touched by now), the
         * bandwidth buffer already returned */
        long rss_kb = proc_status_kb("VmRSS");
        ar_pool_destroy(pool);
        pool = NULL;
        double bw = median(bw_rep, (int)reps), eff = median(eff_rep, (int)reps);
        double tg_med = median(tg_rep, (int)reps);
        if (json) {
            printf("{\"model\":\"%s\",\"arch\":\"%s\",\"type\":\"%s\",\"threads\":%d,"
                   "\"test\":\"int8_peak\",\"int8_peak_gops\":%.3f,\"insn\":\"%s\"}\n",
                   base_name(path), model_arch_name(hp->arch), type, nt, peak,
                   kernels_get()->int8_peak_insn);
            for (int pi = 0; pi < n_prompts; pi++) {
                double pps = pp_best[pi], np = (double)prompts[pi];
                double i8 = model_prefill_matrix_flops(m, prompts[pi]) * pps / np / 1e9;
                printf("{\"model\":\"%s\",\"arch\":\"%s\",\"type\":\"%s\",\"threads\":%d,\"test\":"
                       "\"pp%" PRId64
                       "\",\"tokens_per_s\":%.3f,\"bandwidth_gbs\":%.3f,\"efficiency\":null,"
                       "\"speedup_vs_decode\":%.3f,\"gflops_per_s\":%.1f,\"int8_gops\":%.3f,"
                       "\"int8_peak_gops\":%.3f,\"int8_fraction\":%.4f,\"weight_bytes\":%" PRIu64
                       ",\"weight_bytes_all\":%" PRIu64 ",\"rss_after_load_kib\":%ld,"
                       "\"rss_after_run_kib\":%ld,\"cold_tokens_per_s\":",
                       base_name(path), model_arch_name(hp->arch), type, nt, prompts[pi], pps, bw,
                       pps / tg_best, model_prefill_flops(m, prompts[pi]) * pps / np / 1e9, i8,
                       peak, peak > 0 ? i8 / peak : 0.0, wbytes, wbytes_all, rss_load_kb, rss_kb);
                if (pi == 0)
                    printf("%.3f}\n", pp_cold);
                else
                    printf("null}\n");
            }
            printf("{\"model\":\"%s\",\"arch\":\"%s\",\"type\":\"%s\",\"threads\":%d,\"test\":"
                   "\"tg%" PRId64
                   "\",\"tokens_per_s\":%.3f,\"bandwidth_gbs\":%.3f,\"efficiency\":%.4f,"
                   "\"tokens_per_s_median\":%.3f,\"reps\":%" PRId64 ",\"weight_bytes\":%" PRIu64
                   ",\"weight_bytes_all\":%" PRIu64 ",\"rss_after_run_kib\":%ld}\n",
                   base_name(path), model_arch_name(hp->arch), type, nt, n_gen, tg_best, bw, eff,
                   tg_med, reps, wbytes, wbytes_all, rss_kb);
            for (int i = 0; i < nb; i++)
                printf("{\"model\":\"%s\",\"arch\":\"%s\",\"type\":\"%s\",\"threads\":%d,"
                       "\"test\":\"batch\",\"batch\":%d,\"step_ms\":%.6f,\"ratio_vs_b1\":%.3f,"
                       "\"tokens_per_s\":%.2f}\n",
                       base_name(path), model_arch_name(hp->arch), type, nt, batch[i],
                       step_s[i] * 1e3, step_s[i] / step_s[0], (double)batch[i] / step_s[i]);
        } else {
            printf("%s (%s, %s, %.1f MiB of weights per token", base_name(path),
                   model_arch_name(hp->arch), type, (double)wbytes / 1048576.0);
            if (wbytes != wbytes_all)
                printf(" of %.1f MiB", (double)wbytes_all / 1048576.0);
            printf("), %d thread%s\n", nt, nt > 1 ? "s" : "");
            printf("  int8 peak %.1f GOPS (%s)\n", peak, kernels_get()->int8_peak_insn);
            for (int pi = 0; pi < n_prompts; pi++) {
                double pps = pp_best[pi], np = (double)prompts[pi];
                double i8 = model_prefill_matrix_flops(m, prompts[pi]) * pps / np / 1e9;
                printf("  pp%-5" PRId64 " %10.2f tok/s   (%.1fx decode, %.1f GFLOP/s; matrices "
                       "%.1f GOPS = %.3f of the int8 peak)\n",
                       prompts[pi], pps, pps / tg_best,
                       model_prefill_flops(m, prompts[pi]) * pps / np / 1e9, i8,
                       peak > 0 ? i8 / peak : 0.0);
            }
            printf("  cold pp%-5" PRId64 " %8.2f tok/s   (the first prefill, not a repetition: "
                   "weights paged in)\n",
                   prompts[0], pp_cold);
            printf("  tg%-5" PRId64 " %10.2f tok/s   (median %.2f)\n", n_gen, tg_best, tg_med);
            printf(
                "  memory read bandwidth %.2f GB/s; decode efficiency %.3f (medians over %" PRId64
                " repetitions)\n",
                bw, eff, reps);
            for (int i = 0; i < nb; i++)
                printf("  batch %-3d %8.2f ms/step (%.2fx one sequence, %.1f tok/s)\n", batch[i],
                       step_s[i] * 1e3, step_s[i] / step_s[0], (double)batch[i] / step_s[i]);
            printf("  resident memory after loading %.1f MiB, after the run %.1f MiB\n",
                   (double)rss_load_kb / 1024.0, (double)rss_kb / 1024.0);
        }
        fflush(stdout);
        ar_free(toks);
        ar_free(tg_rep);
        cli_runner_close(r);
        continue;
    fail:
        cli_error("bench: %s", err.msg);
        ar_free(toks);
        ar_free(tg_rep);
        bw_free(&bwj);
        ar_pool_destroy(pool);
        cli_runner_close(r);
        return rc;
    }
    return 0;
}
