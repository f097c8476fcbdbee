/* prefill_cpu.c - the CPU time of one prefill, for comparing builds on a shared machine.
 *
 *   build/bench/prefill_cpu MODEL.gguf [N_TOKENS=512] [REPS=3]
 *
 * Runs N_TOKENS random tokens (fixed seed) through model_forward on the calling thread only (no
 * pool), in batches of 512 rows as `autoreply bench` does, F16 K/V in blocks of 16, REPS times,
 * and prints one JSON line: the median and best CPU seconds of the process per prefill and the
 * tokens per CPU second; then the median CPU milliseconds of 16 one-row decode steps
 * (decode_cpu_ms: every matrix streamed once per step, so memory stalls count). CPU time,
 * unlike `bench`'s wall-clock tok/s, barely moves when other
 * processes take the cores: what it cannot hide is their use of the shared caches. Two builds
 * are compared by linking this file against each one's libraries and alternating the runs. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "model/model.h"
#include "kv/kv.h"

#define BATCH 512
#define BLOCK_TOKENS 16
#define MAX_REPS 64

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One prefill of n tokens into a fresh sequence; its CPU seconds in *sec. */
static enum ar_status prefill(struct model_ctx *ctx, struct kv_cache *kv, const int32_t *tok,
                              const int32_t *pos, const int32_t *seq, int n, float *logits,
                              double *sec)
{
    struct kv_seq s, *sp = &s;
    enum ar_status st;
    double t0;
    kv_seq_init(&s);
    if ((st = kv_seq_reserve(kv, &s, n)) != AR_OK)
        return st;
    t0 = cpu_seconds();
    for (int done = 0; done < n && st == AR_OK; done += BATCH) {
        struct model_batch b = {.n_tokens = AR_MIN(BATCH, n - done), .tokens = tok + done,
                                .pos = pos + done, .seq = seq + done, .n_seqs = 1};
        st = model_forward(ctx, kv, &sp, &b, logits);
    }
    *sec = cpu_seconds() - t0;
    kv_seq_fini(kv, &s);
    return st;
}

/* DECODE_STEPS one-row steps of a fresh sequence from position 0 (decode: every matrix read
 * once per token); the median CPU seconds of a step in *sec. */
#define DECODE_STEPS 16
static enum ar_status decode(struct model_ctx *ctx, struct kv_cache *kv, const int32_t *tok,
                             const int32_t *pos, const int32_t *seq, float *logits, double *sec)
{
    struct kv_seq s, *sp = &s;
    enum ar_status st;
    double t[DECODE_STEPS];
    kv_seq_init(&s);
    if ((st = kv_seq_reserve(kv, &s, DECODE_STEPS)) != AR_OK)
        return st;
    for (int i = 0; i < DECODE_STEPS && st == AR_OK; i++) {
        struct model_batch b = {.n_tokens = 1, .tokens = tok + i, .pos = pos + i, .seq = seq,
                                .n_seqs = 1};
        double t0 = cpu_seconds();
        st = model_forward(ctx, kv, &sp, &b, logits);
        t[i] = cpu_seconds() - t0;
    }
    qsort(t, DECODE_STEPS, sizeof(t[0]), cmp_double);
    *sec = t[DECODE_STEPS / 2];
    kv_seq_fini(kv, &s);
    return st;
}

int main(int argc, char **argv)
{
    struct model *m = NULL;
    struct model_ctx *ctx = NULL;
    struct kv_cache *kv = NULL;
    struct kv_params kp;
    struct ar_err err = {0};
    int n = argc > 2 ? atoi(argv[2]) : 512, reps = argc > 3 ? atoi(argv[3]) : 3, n_vocab;
    int32_t *tok = NULL, *pos = NULL, *seq = NULL;
    float *logits = NULL;
    double sec[MAX_REPS];
    int rc = 1;
    if (argc < 2 || n < 1 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: prefill_cpu MODEL.gguf [N_TOKENS>0] [REPS 1..%d]\n", MAX_REPS);
        return 2;
    }
    if (model_load(argv[1], &m, &err) != AR_OK) {
        fprintf(stderr, "prefill_cpu: %s\n", err.msg);
        return 1;
    }
    n_vocab = model_hparams(m)->n_vocab;
    tok = malloc(sizeof(*tok) * (size_t)n);
    pos = malloc(sizeof(*pos) * (size_t)n);
    seq = calloc((size_t)n, sizeof(*seq));
    logits = malloc(sizeof(*logits) * (size_t)n_vocab);
    model_kv_params(m, BLOCK_TOKENS, (n + BLOCK_TOKENS - 1) / BLOCK_TOKENS, AR_TYPE_F16, &kp);
    if (!tok || !pos || !seq || !logits || model_ctx_create(m, AR_MIN(n, BATCH), NULL, &ctx) ||
        kv_create(&kp, &kv)) {
        fprintf(stderr, "prefill_cpu: out of memory\n");
        goto out;
    }
    model_ctx_set_n_ctx(ctx, n);
    srand(7);
    for (int i = 0; i < n; i++) {
        tok[i] = rand() % n_vocab;
        pos[i] = i;
    }
    for (int r = 0; r < reps; r++) {
        if (prefill(ctx, kv, tok, pos, seq, n, logits, &sec[r]) != AR_OK) {
            fprintf(stderr, "prefill_cpu: the forward pass failed\n");
            goto out;
        }
    }
    double dsec = 0;
    if (n >= DECODE_STEPS && decode(ctx, kv, tok, pos, seq, logits, &dsec) != AR_OK) {
        fprintf(stderr, "prefill_cpu: a decode step failed\n");
        goto out;
    }
    qsort(sec, (size_t)reps, sizeof(sec[0]), cmp_double);
    /* logit0: the same in two builds whose passes compute the same numbers */
    printf("{\"tokens\":%d,\"reps\":%d,\"cpu_s_median\":%.4f,\"cpu_s_best\":%.4f,"
           "\"tok_per_cpu_s_median\":%.2f,\"tok_per_cpu_s_best\":%.2f,\"decode_cpu_ms\":%.3f,"
           "\"logit0\":%.6f}\n",
           n, reps, sec[reps / 2], sec[0], n / sec[reps / 2], n / sec[0], dsec * 1e3,
           (double)logits[0]);
    rc = 0;
out:
    kv_destroy(kv);
    model_ctx_destroy(ctx);
    model_destroy(m);
    free(tok);
    free(pos);
    free(seq);
    free(logits);
    return rc;
}
