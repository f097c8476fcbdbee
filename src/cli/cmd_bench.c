/* cmd_bench.c - `autoreply bench -m MODEL`: prefill (ppN) and decode (tgN) speed, the memory
 * read bandwidth of this machine measured next to each decode repetition, and decode
 * efficiency = tok/s x weight bytes read per token / bandwidth (per repetition, then the
 * median); for a mixture of experts the bytes per token are the active ones (the used
 * experts), not the file's. Prints the CPU and the kernels in use first. --json prints one
 * object per line. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/pool.h"
#include "cli.h"
#include "cli_internal.h"
#include "base/cpu.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/model.h"

/* ---- memory read bandwidth ------------------------------------------------------------------ */

struct bw_job {
    const uint64_t *buf;
    size_t n; /* uint64 words */
    uint64_t sums[64];
};

static void bw_read(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    int64_t b, e;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    ar_pool_range((int64_t)j->n, 64, ith, nth, &b, &e);
    for (int64_t i = b; i + 4 <= e; i += 4) {
        s0 += j->buf[i];
        s1 += j->buf[i + 1];
        s2 += j->buf[i + 2];
        s3 += j->buf[i + 3];
    }
    j->sums[ith & 63] = s0 + s1 + s2 + s3;
}

/* Best of `passes` reads of a buffer much larger than the caches, in GB/s (1e9 B/s). */
static double measure_bandwidth(struct ar_pool *pool, struct bw_job *j, int passes)
{
    double best = 0;
    for (int rep = 0; rep < passes; rep++) {
        double t0 = ar_time_s();
        ar_pool_run(pool, bw_read, j);
        double dt = ar_time_s() - t0;
        double gbs = (double)(j->n * sizeof(uint64_t)) / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    return best;
}

/* A buffer of `bytes` for measure_bandwidth, written once (so its pages are mapped). */
static bool bw_init(struct bw_job *j, size_t bytes)
{
    uint64_t *buf = ar_malloc_aligned(bytes);
    memset(j, 0, sizeof(*j));
    if (!buf)
        return false;
    j->n = bytes / sizeof(uint64_t);
    for (size_t i = 0; i < j->n; i++)
        buf[i] = i;
    j->buf = buf;
    return true;
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
    cpu_features_str(cpu_features_get(), feat, (int)sizeof(feat));
    for (char *c = cpu; *c; c++)
        if (*c == '"' || *c == '\\')
            *c = ' ';
    if (json)
        printf("{\"cpu\":\"%s\",\"features\":\"%s\",\"kernels\":\"%s\"}\n", cpu, feat,
               kernels_get()->name);
    else
        printf("cpu: %s (%s); kernels: %s\n", cpu, feat, kernels_get()->name);
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

/* ---- the benchmark -------------------------------------------------------------------------- */

int cmd_bench(int argc, char **argv)
{
    const char *path = NULL;
    int threads[8] = {1, 2};
    int n_thread_sets = 2;
    int64_t n_prompt = 512, n_gen = 128, reps = 2, bw_mib = 1024;
    bool json = false;
    int rc = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(path = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            char *list, *tok, *save = NULL;
            if (!(v = cli_value(argc, argv, &i)))
                return 2;
            list = strdup(v);
            n_thread_sets = 0;
            for (tok = strtok_r(list, ",", &save); tok && n_thread_sets < 8;
                 tok = strtok_r(NULL, ",", &save)) {
                int64_t t;
                if (!cli_parse_i64("-t", tok, 1, 256, &t)) {
                    free(list);
                    return 2;
                }
                threads[n_thread_sets++] = (int)t;
            }
            free(list);
            if (!n_thread_sets) {
                cli_error("-t: empty thread list");
                return 2;
            }
        } else if (!strcmp(a, "-p")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64("-p", v, 1, 65536, &n_prompt))
                return 2;
        } else if (!strcmp(a, "-n")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64("-n", v, 1, 65536, &n_gen))
                return 2;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64("-r", v, 1, 100, &reps))
                return 2;
        } else if (!strcmp(a, "--bw-mib")) {
            if (!(v = cli_value(argc, argv, &i)) ||
                !cli_parse_i64("--bw-mib", v, 64, 65536, &bw_mib))
                return 2;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: autoreply bench -m MODEL [-t 1,2] [-p 512] [-n 128] [-r REPS] "
                   "[--bw-mib 1024] [--json]\n"
                   "Per thread count, REPS times (default 2): a ppN prefill, then N decode steps\n"
                   "(tgN), then the memory read bandwidth (best of 3 reads of a --bw-mib buffer\n"
                   "by that many threads), measured right after each decode so both see the same\n"
                   "machine load. tokens_per_s: the best repetition; bandwidth_gbs: the median\n"
                   "of the repetitions' bandwidths; efficiency (decode): the median over\n"
                   "repetitions of tok/s x weight bytes per token / that repetition's bandwidth\n"
                   "(a mixture of experts: the used experts' bytes, weight_bytes; the file's\n"
                   "matrices: weight_bytes_all);\n"
                   "tokens_per_s_median: the median decode speed; gflops_per_s (prefill): the\n"
                   "pass's floating-point operations (model_prefill_flops: matrices, causal\n"
                   "attention, the last row's logits) per second at the best repetition.\n");
            return 0;
        } else {
            cli_error("bench: unknown option '%s'", a);
            return 2;
        }
    }
    if (!path) {
        cli_error("bench: -m MODEL is required");
        return 2;
    }
    print_machine(json);
    for (int ts = 0; ts < n_thread_sets; ts++) {
        struct cli_runner *r = NULL;
        struct ar_pool *pool = NULL;
        struct ar_err err = {0};
        int nt = threads[ts];
        int n_ctx = (int)(n_prompt > 1 + n_gen ? n_prompt : 1 + n_gen);
        if (cli_runner_open(path, nt, AR_TYPE_F16, n_ctx, &r, &err) != AR_OK) {
            cli_error("%s: %s", path, err.msg);
            return 1;
        }
        /* after loading: weights mapped (not read yet), KV cache and scratch allocated */
        long rss_load_kb = proc_status_kb("VmRSS");
        const struct model *m = cli_runner_model(r);
        const struct model_hparams *hp = model_hparams(m);
        uint32_t ft = 0;
        const char *type = gguf_get_u32(model_gguf(m), "general.file_type", &ft)
                               ? file_type_name(ft)
                               : "other";
        /* what one decode step reads: all matrices, of a mixture only the used experts */
        uint64_t wbytes = model_active_weight_bytes(m), wbytes_all = model_weight_bytes(m);
        int32_t *toks = ar_malloc(sizeof(int32_t) * (size_t)n_prompt);
        uint64_t seed = 0x9e3779b97f4a7c15ull;
        float *logits;
        double pp_best = 0, tg_best = 0;
        /* per repetition: decode tok/s, the bandwidth measured right after it, efficiency */
        double *tg_rep = ar_malloc(sizeof(double) * 3 * (size_t)reps);
        double *bw_rep = tg_rep ? tg_rep + reps : NULL, *eff_rep = tg_rep ? tg_rep + 2 * reps : NULL;
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
        for (int64_t i = 0; i < n_prompt; i++)
            toks[i] = (int32_t)(rng_next(&seed) % (uint64_t)hp->n_vocab);
        for (int64_t rep = 0; rep < reps; rep++) {
            double t0 = ar_time_s();
            if (cli_runner_prefill(r, toks, (int)n_prompt, false, &logits, &err) != AR_OK)
                goto fail;
            double dt = ar_time_s() - t0;
            if ((double)n_prompt / dt > pp_best)
                pp_best = (double)n_prompt / dt;
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
        ar_free_aligned((void *)(uintptr_t)bwj.buf);
        /* resident memory of the model after the run (every weight page touched by now), the
         * bandwidth buffer already returned */
        long rss_kb = proc_status_kb("VmRSS");
        ar_pool_destroy(pool);
        pool = NULL;
        double bw = median(bw_rep, (int)reps), eff = median(eff_rep, (int)reps);
        double tg_med = median(tg_rep, (int)reps);
        if (json) {
            printf("{\"model\":\"%s\",\"arch\":\"%s\",\"type\":\"%s\",\"threads\":%d,\"test\":\"pp%" PRId64
                   "\",\"tokens_per_s\":%.3f,\"bandwidth_gbs\":%.3f,\"efficiency\":null,"
                   "\"speedup_vs_decode\":%.3f,\"gflops_per_s\":%.1f,\"weight_bytes\":%" PRIu64
                   ",\"weight_bytes_all\":%" PRIu64 ",\"rss_after_load_kib\":%ld,"
                   "\"rss_after_run_kib\":%ld}\n",
                   base_name(path), model_arch_name(hp->arch), type, nt, n_prompt, pp_best, bw, pp_best / tg_best,
                   model_prefill_flops(m, n_prompt) * pp_best / (double)n_prompt / 1e9, wbytes,
                   wbytes_all, rss_load_kb, rss_kb);
            printf("{\"model\":\"%s\",\"arch\":\"%s\",\"type\":\"%s\",\"threads\":%d,\"test\":\"tg%" PRId64
                   "\",\"tokens_per_s\":%.3f,\"bandwidth_gbs\":%.3f,\"efficiency\":%.4f,"
                   "\"tokens_per_s_median\":%.3f,\"reps\":%" PRId64 ",\"weight_bytes\":%" PRIu64
                   ",\"weight_bytes_all\":%" PRIu64 ",\"rss_after_run_kib\":%ld}\n",
                   base_name(path), model_arch_name(hp->arch), type, nt, n_gen, tg_best, bw, eff, tg_med, reps, wbytes,
                   wbytes_all, rss_kb);
        } else {
            printf("%s (%s, %s, %.1f MiB of weights per token", base_name(path),
                   model_arch_name(hp->arch), type, (double)wbytes / 1048576.0);
            if (wbytes != wbytes_all)
                printf(" of %.1f MiB", (double)wbytes_all / 1048576.0);
            printf("), %d thread%s\n", nt, nt > 1 ? "s" : "");
            printf("  pp%-5" PRId64 " %10.2f tok/s   (%.1fx decode, %.1f GFLOP/s)\n", n_prompt,
                   pp_best, pp_best / tg_best,
                   model_prefill_flops(m, n_prompt) * pp_best / (double)n_prompt / 1e9);
            printf("  tg%-5" PRId64 " %10.2f tok/s   (median %.2f)\n", n_gen, tg_best, tg_med);
            printf("  memory read bandwidth %.2f GB/s; decode efficiency %.3f (medians over %" PRId64
                   " repetitions)\n",
                   bw, eff, reps);
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
        ar_free_aligned((void *)(uintptr_t)bwj.buf);
        ar_pool_destroy(pool);
        cli_runner_close(r);
        return rc;
    }
    return 0;
}
