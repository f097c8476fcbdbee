/* reference_test.c - the reference pass (model_forward_reference) against llama.cpp's
 * fixtures and an exact float64 forward (independent truth for the reference itself), and the
 * fast pass (model_forward: batched, threaded, paged K/V) held to the reference for every
 * model file of every family in ../shared/fixtures and ../shared/fixtures-arch: one prefill
 * batch, token-by-token decode, two threads, and small K/V blocks so sliding windows start
 * inside a block. */
#include "harness/harness.h"

#include <dirent.h>
#include <math.h>

#include "base/base.h"
#include "base/pool.h"
#include "harness/process.h"
#include "kernels/kernels.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/model_internal.h" /* model_rope_for, model_rope_table, model_moe_route */

#define PATH_LEN 512
#define MAX_MODELS 64

/* Both passes use the same kernel variant's dot products, but the fast pass tiles them (gemm)
 * and attends block by block, so float sums may round differently. The bound is about 5e-4
 * of the logits' spread (std about 4): far below any fixture tolerance, and a wrong step (a
 * missing norm, a wrong rope) moves logits by units. Both keep K/V in f32 here: with f16 K/V
 * one flipped activation rounding on a quantized file moves logits by ~0.1, which says
 * nothing about the pass (model_test bounds f16 against f32 K/V). */
#define FAST_VS_REF_MAX 2e-3

struct fx {
    char folder[32]; /* "fixtures" or "fixtures-arch" */
    char name[64];   /* model file without .gguf */
};

static int list_models(struct fx *out, int max)
{
    static const char *folders[] = {"fixtures", "fixtures-arch"};
    int k = 0;
    for (size_t f = 0; f < AR_ARRAY_LEN(folders); f++) {
        char rel[64], dir[PATH_LEN];
        struct dirent **ents;
        int n;
        snprintf(rel, sizeof(rel), "%s/models", folders[f]);
        n = scandir(th_shared_path(dir, sizeof(dir), rel), &ents, NULL, alphasort);
        if (n < 0)
            fail_msg("cannot list %s", dir);
        for (int i = 0; i < n; i++) {
            size_t len = strlen(ents[i]->d_name);
            if (len > 5 && len < 64 && strcmp(ents[i]->d_name + len - 5, ".gguf") == 0 &&
                k < max) {
                snprintf(out[k].folder, sizeof(out[k].folder), "%s", folders[f]);
                memcpy(out[k].name, ents[i]->d_name, len - 5);
                out[k].name[len - 5] = '\0';
                k++;
            }
            free(ents[i]);
        }
        free(ents);
    }
    return k;
}

static struct model *load(const struct fx *x)
{
    char rel[160], path[PATH_LEN];
    struct model *m = NULL;
    struct ar_err err = {0};
    snprintf(rel, sizeof(rel), "%s/models/%s.gguf", x->folder, x->name);
    if (model_load(th_shared_path(path, sizeof(path), rel), &m, &err) != AR_OK)
        fail_msg("model_load %s: %s", path, err.msg);
    return m;
}

static cJSON *load_json(const struct fx *x, const char *kind)
{
    char rel[192], path[PATH_LEN];
    snprintf(rel, sizeof(rel), "%s/%s/%s.json", x->folder, kind, x->name);
    return th_read_json(th_shared_path(path, sizeof(path), rel));
}

/* The prompt of case ci from the fixture JSON. */
static int32_t *prompt_of(const cJSON *j, int ci, int *n)
{
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "cases"), ci);
    const cJSON *p = cJSON_GetObjectItem(c, "prompt_tokens");
    int len = cJSON_GetArraySize(p);
    int32_t *v = malloc(sizeof(*v) * (size_t)len);
    assert_non_null(v);
    for (int i = 0; i < len; i++)
        v[i] = (int32_t)cJSON_GetArrayItem(p, i)->valuedouble;
    *n = len;
    return v;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* The acceptance bound for the every-position logits of the 8-token case: as check-fixtures,
 * twice llama.cpp's own distance to the exact forward, at least 1e-3. */
static double bound_all8(const struct fx *x)
{
    char rel[96], path[PATH_LEN], arch[32], type[16];
    const char *dash;
    cJSON *tol, *e;
    double b = -1;
    /* tiny-<arch>-<type> */
    dash = strrchr(x->name, '-');
    assert_non_null(dash);
    snprintf(arch, sizeof(arch), "%.*s", (int)(dash - x->name - 5), x->name + 5);
    snprintf(type, sizeof(type), "%s", dash + 1);
    snprintf(rel, sizeof(rel), "%.31s/tolerances.json", x->folder);
    tol = th_read_json(th_shared_path(path, sizeof(path), rel));
    cJSON_ArrayForEach(e, tol)
    {
        if (strcmp(cJSON_GetObjectItem(e, "arch")->valuestring, arch) ||
            strcmp(cJSON_GetObjectItem(e, "type")->valuestring, type))
            continue;
        b = fmax(1e-3, 2 * fmax(cJSON_GetObjectItem(e, "max_abs_vs_numpy_same_file")->valuedouble,
                                cJSON_GetObjectItem(e, "max_abs_all8_vs_numpy_same_file")
                                    ->valuedouble));
    }
    cJSON_Delete(tol);
    if (b < 0)
        fail_msg("no tolerance for %s %s", arch, type);
    return b;
}

/* The reference pass's logits at every position of the 8-token case are within the fixture
 * bound of the exact float64 forward (logits_numpy, all_logits). */
static void reference_matches_exact_math(const struct fx *x, struct model *m)
{
    cJSON *np = load_json(x, "logits_numpy");
    int n, n_vocab = model_hparams(m)->n_vocab;
    int32_t *toks = prompt_of(np, 1, &n);
    const cJSON *all =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(np, "cases"), 1), "all_logits_8");
    float *got = malloc(sizeof(float) * (size_t)n * (size_t)n_vocab);
    double worst = 0, bound = bound_all8(x);
    assert_non_null(got);
    assert_int_equal(n, 8);
    assert_int_equal(cJSON_GetArraySize(all), n);
    assert_int_equal(model_forward_reference(m, toks, n, got), AR_OK);
    for (int p = 0; p < n; p++) {
        const cJSON *row = cJSON_GetArrayItem(all, p);
        assert_int_equal(cJSON_GetArraySize(row), n_vocab);
        for (int i = 0; i < n_vocab; i++)
            worst = fmax(worst, fabs((double)got[(size_t)p * n_vocab + i] -
                                     cJSON_GetArrayItem(row, i)->valuedouble));
    }
    if (!(worst <= bound))
        fail_msg("%s/%s: reference vs exact forward max %g > %g", x->folder, x->name, worst,
                 bound);
    free(got);
    free(toks);
    cJSON_Delete(np);
}

/* The fast pass on tokens: one batch asking every position's logits (with nth threads), and
 * token by token; both within bound of ref (n x n_vocab). */
static void fast_matches(const struct fx *x, struct model *m, const int32_t *toks, int n,
                         const float *ref, int nth, int block_tokens, enum ar_type kv_type,
                         double bound)
{
    int n_vocab = model_hparams(m)->n_vocab;
    struct ar_pool *pool = NULL;
    struct model_ctx *ctx;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct kv_seq seq_a, seq_b, *s = &seq_a, *s2 = &seq_b;
    float *got = malloc(sizeof(float) * (size_t)n * (size_t)n_vocab);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    uint8_t *want = malloc((size_t)n);
    double d_batch, d_step = 0;
    assert_true(got && pos && seq && want);
    if (nth > 1)
        assert_int_equal(ar_pool_create(nth, &pool), AR_OK);
    assert_int_equal(model_ctx_create(m, n, pool, &ctx), AR_OK);
    model_kv_params(m, block_tokens, 2 * ((n + block_tokens - 1) / block_tokens), kv_type, &kp);
    assert_int_equal(kv_create(&kp, &kv), AR_OK);
    kv_seq_init(s);
    kv_seq_init(s2);

    /* one batch, every position's logits */
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        want[i] = 1;
    }
    assert_int_equal(kv_seq_reserve(kv, s, n), AR_OK);
    struct model_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq,
                            .logits = want, .n_seqs = 1};
    assert_int_equal(model_forward(ctx, kv, &s, &b, got), AR_OK);
    d_batch = max_abs_diff(got, ref, (size_t)n * (size_t)n_vocab);

    /* token by token (the decode path), in a second sequence */
    assert_int_equal(kv_seq_reserve(kv, s2, n), AR_OK);
    for (int i = 0; i < n; i++) {
        struct model_batch one = {.n_tokens = 1, .tokens = toks + i, .pos = pos + i, .seq = seq,
                                  .n_seqs = 1};
        assert_int_equal(model_forward(ctx, kv, &s2, &one, got), AR_OK);
        d_step = fmax(d_step, max_abs_diff(got, ref + (size_t)i * n_vocab, (size_t)n_vocab));
    }
    if (!(d_batch <= bound) || !(d_step <= bound))
        fail_msg("%s/%s (%d tokens, %d threads, blocks of %d, %s K/V): fast vs reference: batch "
                 "%g, decode %g > %g",
                 x->folder, x->name, n, nth, block_tokens, kv_type == AR_TYPE_F32 ? "f32" : "f16",
                 d_batch, d_step, bound);
    kv_seq_fini(kv, s);
    kv_seq_fini(kv, s2);
    kv_destroy(kv);
    model_ctx_destroy(ctx);
    ar_pool_destroy(pool);
    free(got);
    free(pos);
    free(seq);
    free(want);
}

/* Two sequences in one batch: their first n0 tokens interleaved row by row, then one decode
 * row each per step (the small-batch pass), every row's logits within bound of the
 * reference for its own sequence (ref_a, ref_b: n x n_vocab). Rows of one step attend only to
 * their own sequence, and MoE groups both sequences' rows by expert. */
static void two_sequences_match(const struct fx *x, struct model *m, const int32_t *ta,
                                const int32_t *tb, int n, int n0, const float *ref_a,
                                const float *ref_b, double bound)
{
    int n_vocab = model_hparams(m)->n_vocab, rows = 2 * n0;
    struct ar_pool *pool = NULL;
    struct model_ctx *ctx;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct kv_seq sa, sb;
    struct kv_seq *seqs[2] = {&sa, &sb};
    float *got = malloc(sizeof(float) * (size_t)rows * (size_t)n_vocab);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)rows), *pos = malloc(sizeof(int32_t) * (size_t)rows);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)rows);
    uint8_t *want = malloc((size_t)rows);
    double d = 0;
    assert_true(got && tok && pos && seq && want);
    assert_int_equal(ar_pool_create(2, &pool), AR_OK);
    assert_int_equal(model_ctx_create(m, rows, pool, &ctx), AR_OK);
    model_kv_params(m, 8, 2 * ((n + 7) / 8), AR_TYPE_F32, &kp);
    assert_int_equal(kv_create(&kp, &kv), AR_OK);
    kv_seq_init(&sa);
    kv_seq_init(&sb);
    assert_int_equal(kv_seq_reserve(kv, &sa, n), AR_OK);
    assert_int_equal(kv_seq_reserve(kv, &sb, n), AR_OK);
    for (int i = 0; i < n0; i++) {
        tok[2 * i] = ta[i], pos[2 * i] = i, seq[2 * i] = 0, want[2 * i] = 1;
        tok[2 * i + 1] = tb[i], pos[2 * i + 1] = i, seq[2 * i + 1] = 1, want[2 * i + 1] = 1;
    }
    struct model_batch b = {.n_tokens = rows, .tokens = tok, .pos = pos, .seq = seq,
                            .logits = want, .n_seqs = 2};
    assert_int_equal(model_forward(ctx, kv, seqs, &b, got), AR_OK);
    for (int i = 0; i < n0; i++) {
        d = fmax(d, max_abs_diff(got + (size_t)(2 * i) * n_vocab, ref_a + (size_t)i * n_vocab,
                                 (size_t)n_vocab));
        d = fmax(d, max_abs_diff(got + (size_t)(2 * i + 1) * n_vocab,
                                 ref_b + (size_t)i * n_vocab, (size_t)n_vocab));
    }
    for (int i = n0; i < n; i++) {
        tok[0] = ta[i], tok[1] = tb[i], pos[0] = pos[1] = i, seq[0] = 0, seq[1] = 1;
        b.n_tokens = 2;
        assert_int_equal(model_forward(ctx, kv, seqs, &b, got), AR_OK);
        d = fmax(d, max_abs_diff(got, ref_a + (size_t)i * n_vocab, (size_t)n_vocab));
        d = fmax(d, max_abs_diff(got + n_vocab, ref_b + (size_t)i * n_vocab, (size_t)n_vocab));
    }
    if (!(d <= bound))
        fail_msg("%s/%s: two sequences in one batch vs reference: %g > %g", x->folder, x->name,
                 d, bound);
    kv_seq_fini(kv, &sa);
    kv_seq_fini(kv, &sb);
    kv_destroy(kv);
    model_ctx_destroy(ctx);
    ar_pool_destroy(pool);
    free(got);
    free(tok);
    free(pos);
    free(seq);
    free(want);
}

/* Two sequences' prompts in one batch as runs of rows: a's first a1 tokens, b's first b1, then
 * the rest of a, then the rest of b (n tokens each), on 2 threads with K/V blocks of 5. The
 * prefill attention takes runs of one sequence's consecutive positions in blocks of rows;
 * here each sequence's rows come in two runs that are not next to each other in the batch,
 * and with a1 == b1 a's second run continues the positions of b's first (only the change of
 * sequence ends the block). Every row within bound of its own sequence's
 * reference (ref_a, ref_b: n x n_vocab). */
static void sequence_runs_match(const struct fx *x, struct model *m, const int32_t *ta,
                                const int32_t *tb, int n, int a1, int b1, const float *ref_a,
                                const float *ref_b, double bound)
{
    int n_vocab = model_hparams(m)->n_vocab, rows = 2 * n, r = 0;
    struct ar_pool *pool = NULL;
    struct model_ctx *ctx;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct kv_seq sa, sb;
    struct kv_seq *seqs[2] = {&sa, &sb};
    float *got = malloc(sizeof(float) * (size_t)rows * (size_t)n_vocab);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)rows), *pos = malloc(sizeof(int32_t) * (size_t)rows);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)rows);
    uint8_t *want = malloc((size_t)rows);
    const int runs[4][3] = {{0, 0, a1}, {1, 0, b1}, {0, a1, n}, {1, b1, n}}; /* seq, from, to */
    double d = 0;
    assert_true(got && tok && pos && seq && want);
    assert_int_equal(ar_pool_create(2, &pool), AR_OK);
    assert_int_equal(model_ctx_create(m, rows, pool, &ctx), AR_OK);
    model_kv_params(m, 5, 2 * ((n + 4) / 5), AR_TYPE_F32, &kp);
    assert_int_equal(kv_create(&kp, &kv), AR_OK);
    kv_seq_init(&sa);
    kv_seq_init(&sb);
    assert_int_equal(kv_seq_reserve(kv, &sa, n), AR_OK);
    assert_int_equal(kv_seq_reserve(kv, &sb, n), AR_OK);
    for (int k = 0; k < 4; k++) {
        for (int i = runs[k][1]; i < runs[k][2]; i++, r++) {
            tok[r] = (runs[k][0] ? tb : ta)[i];
            pos[r] = i;
            seq[r] = runs[k][0];
            want[r] = 1;
        }
    }
    assert_int_equal(r, rows);
    struct model_batch b = {.n_tokens = rows, .tokens = tok, .pos = pos, .seq = seq,
                            .logits = want, .n_seqs = 2};
    assert_int_equal(model_forward(ctx, kv, seqs, &b, got), AR_OK);
    for (r = 0; r < rows; r++)
        d = fmax(d, max_abs_diff(got + (size_t)r * n_vocab,
                                 (seq[r] ? ref_b : ref_a) + (size_t)pos[r] * n_vocab,
                                 (size_t)n_vocab));
    if (!(d <= bound))
        fail_msg("%s/%s: two sequences in runs of rows vs reference: %g > %g", x->folder,
                 x->name, d, bound);
    kv_seq_fini(kv, &sa);
    kv_seq_fini(kv, &sb);
    kv_destroy(kv);
    model_ctx_destroy(ctx);
    ar_pool_destroy(pool);
    free(got);
    free(tok);
    free(pos);
    free(seq);
    free(want);
}

static void every_model_fast_pass_follows_the_reference(void **state)
{
    static struct fx fx[MAX_MODELS];
    int n_models = list_models(fx, MAX_MODELS), archs_seen = 0;
    char last_arch[32] = "";
    (void)state;
    assert_true(n_models >= 38); /* 14 in fixtures, 24 in fixtures-arch */
    for (int k = 0; k < n_models; k++) {
        struct model *m = load(&fx[k]);
        cJSON *j = load_json(&fx[k], "logits");
        int n_vocab = model_hparams(m)->n_vocab, n;
        /* the 64-token case (it crosses gemma3's 64-position window with the greedy steps; the
         * 300-token one crosses it in the prompt) */
        int ci = model_hparams(m)->swa_window > 0 ? 3 : 2;
        int32_t *toks = prompt_of(j, ci, &n);
        float *ref = malloc(sizeof(float) * (size_t)n * (size_t)n_vocab);
        char arch[32];
        assert_non_null(ref);
        snprintf(arch, sizeof(arch), "%s", model_arch_name(model_hparams(m)->arch));
        if (strcmp(arch, last_arch)) {
            archs_seen++;
            snprintf(last_arch, sizeof(last_arch), "%s", arch);
        }

        reference_matches_exact_math(&fx[k], m);
        assert_int_equal(model_forward_reference(m, toks, n, ref), AR_OK);
        fast_matches(&fx[k], m, toks, n, ref, 1, 16, AR_TYPE_F32, FAST_VS_REF_MAX);
        fast_matches(&fx[k], m, toks, n, ref, 2, 7, AR_TYPE_F32, FAST_VS_REF_MAX);
        {
            /* a second sequence: the same prompt reversed */
            int32_t *rev = malloc(sizeof(int32_t) * (size_t)n);
            float *ref_b = malloc(sizeof(float) * (size_t)n * (size_t)n_vocab);
            int n2 = AR_MIN(n, 80);
            assert_true(rev && ref_b);
            for (int i = 0; i < n2; i++)
                rev[i] = toks[n2 - 1 - i];
            assert_int_equal(model_forward_reference(m, rev, n2, ref_b), AR_OK);
            two_sequences_match(&fx[k], m, toks, rev, n2, 5, ref, ref_b, FAST_VS_REF_MAX);
            sequence_runs_match(&fx[k], m, toks, rev, n2, 21, 21, ref, ref_b, FAST_VS_REF_MAX);
            free(rev);
            free(ref_b);
        }
        free(ref);
        free(toks);
        cJSON_Delete(j);
        model_destroy(m);
    }
    assert_int_equal(archs_seen, 8); /* llama qwen2 chatglm gemma3 glm4 phi3 qwen3 qwen3moe */
}

/* Logits of every row of one prefill batch of toks on nth threads, with the gate and up
 * products fused into one stage (stage_gu) or not (AR_FUSE_FFN=0, read when a context is
 * created); the layers fused in *fused. */
static void prefill_rows(struct model *m, const int32_t *toks, int n, int nth, bool fuse,
                         float *out, int *fused)
{
    struct ar_pool *pool = NULL;
    struct model_ctx *ctx;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct kv_seq s, *sp = &s;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    uint8_t *want = malloc((size_t)n);
    assert_true(pos && seq && want);
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        want[i] = 1;
    }
    if (nth > 1)
        assert_int_equal(ar_pool_create(nth, &pool), AR_OK);
    if (!fuse)
        assert_int_equal(setenv("AR_FUSE_FFN", "0", 1), 0);
    assert_int_equal(model_ctx_create(m, n, pool, &ctx), AR_OK);
    assert_int_equal(unsetenv("AR_FUSE_FFN"), 0);
    model_kv_params(m, 16, (n + 15) / 16, AR_TYPE_F16, &kp);
    assert_int_equal(kv_create(&kp, &kv), AR_OK);
    kv_seq_init(&s);
    assert_int_equal(kv_seq_reserve(kv, &s, n), AR_OK);
    struct model_batch b = {
        .n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .logits = want, .n_seqs = 1};
    assert_int_equal(model_forward(ctx, kv, &sp, &b, out), AR_OK);
    *fused = model_ctx_gu_fused(ctx);
    kv_seq_fini(kv, &s);
    kv_destroy(kv);
    model_ctx_destroy(ctx);
    ar_pool_destroy(pool);
    free(pos);
    free(seq);
    free(want);
}

/* A prefill batch's fused gate/up stage gives the bits of the unfused pass (products to
 * memory, then the activation and the conversion as a row tail), for every model of every
 * family, on 1 and 2 threads; every layer takes it, a mixture-of-experts layer over its
 * chosen experts. */
static void fused_ffn_gives_the_unfused_bits(void **state)
{
    static struct fx fx[MAX_MODELS];
    int n_models = list_models(fx, MAX_MODELS);
    (void)state;
    assert_true(n_models >= 38);
    for (int k = 0; k < n_models; k++) {
        struct model *m = load(&fx[k]);
        cJSON *j = load_json(&fx[k], "logits");
        const struct model_hparams *hp = model_hparams(m);
        int n, f_on, f_off;
        int32_t *toks = prompt_of(j, 2, &n); /* 64 tokens: units of MM_MANY_ROWS rows */
        size_t all = (size_t)n * (size_t)hp->n_vocab;
        float *on = malloc(sizeof(float) * all), *off = malloc(sizeof(float) * all);
        assert_true(on && off && n > 16);
        for (int nth = 1; nth <= 2; nth++) {
            prefill_rows(m, toks, n, nth, true, on, &f_on);
            prefill_rows(m, toks, n, nth, false, off, &f_off);
            if (memcmp(on, off, sizeof(float) * all))
                fail_msg("%s/%s, %d threads: the fused gate/up stage changed the logits",
                         fx[k].folder, fx[k].name, nth);
            assert_int_equal(f_on, hp->n_layers);
            assert_int_equal(f_off, 0);
        }
        free(on);
        free(off);
        free(toks);
        cJSON_Delete(j);
        model_destroy(m);
    }
}

/* A mixture's fused gate/up stage (stage_gu over the experts) at a real expert width (768: units of
 * 256 weight rows at three offsets) and with more rows per expert than one 64-row tile (4 experts,
 * 2 used, 200 rows): the bits of the unfused pass, on 1 and 2 threads, for Q8_0 (down input
 * Q8_0) and Q4_K_M (Q8_K, blocks of 256) weights. The fixtures' mixture has 32-wide experts and
 * about 16 rows each, which exercise neither. */
static void mixture_fused_gate_up_gives_the_unfused_bits(void **state)
{
    static const char *const types[] = {"q8_0", "q4_k_m"};
    enum { N = 200 };
    char path[256];
    int32_t toks[N];
    struct th_rng rng = {0x6a7e0001u};
    (void)state;
    for (int i = 0; i < N; i++)
        toks[i] = (int32_t)(th_rng_u64(&rng) % 300u);
    for (size_t ti = 0; ti < AR_ARRAY_LEN(types); ti++) {
        struct model *m = NULL;
        struct ar_err err = {0};
        snprintf(path, sizeof(path), "/tmp/ar_reference_test_%d_moe_%s.gguf", (int)getpid(),
                 types[ti]);
        struct th_run r = th_sh_run(
            "'%s' gen-model --arch qwen3moe --n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 "
            "--head-dim 64 --n-ff 512 --n-vocab 300 --n-expert 4 --n-expert-used 2 "
            "--n-ff-exp 768 --type %s --seed 7 -o '%s'",
            th_bin_path(), types[ti], path);
        if (r.status != 0)
            fail_msg("gen-model %s: status %d: %s", types[ti], r.status, r.err);
        th_run_free(&r);
        assert_int_equal(model_load(path, &m, &err), AR_OK);
        size_t all = (size_t)N * (size_t)model_hparams(m)->n_vocab;
        float *on = malloc(sizeof(float) * all), *off = malloc(sizeof(float) * all);
        assert_true(on && off);
        for (int nth = 1; nth <= 2; nth++) {
            int f_on, f_off;
            prefill_rows(m, toks, N, nth, true, on, &f_on);
            prefill_rows(m, toks, N, nth, false, off, &f_off);
            assert_int_equal(f_on, 2);
            assert_int_equal(f_off, 0);
            if (memcmp(on, off, sizeof(float) * all))
                fail_msg("%s, %d threads: the fused gate/up stage changed the logits", types[ti],
                         nth);
        }
        free(on);
        free(off);
        model_destroy(m);
        unlink(path);
    }
}

/* The router's choice (model_moe_route) against a plain selection sort over its softmax:
 * the k most probable experts, best first, the lowest index first among equal ones, and
 * their weights renormalized over the chosen. Logits from a few values, so ties are common;
 * k from 1 to every expert. */
static void moe_routing_picks_the_k_most_probable_lowest_index_first(void **state)
{
    const struct kernel_ops *ops = kernels_get();
    uint64_t seed = 0x5eed;
    int rounds = 0;
    (void)state;
    for (int ne = 1; ne <= 160; ne += ne < 8 ? 1 : 19) {
        for (int k = 1; k <= ne && k <= MODEL_MAX_EXPERTS_USED; k += k < 4 ? 1 : 3) {
            for (int rep = 0; rep < 20; rep++, rounds++) {
                struct model_hparams hp = {.n_expert = ne, .n_expert_used = k};
                float logits[160], probs[160], w[MODEL_MAX_EXPERTS_USED];
                float want_w[MODEL_MAX_EXPERTS_USED], sum = 0.0f;
                int32_t sel[MODEL_MAX_EXPERTS_USED], want[MODEL_MAX_EXPERTS_USED];
                bool taken[160] = {false};
                int levels = rep % 2 ? 4 : 1000;
                for (int e = 0; e < ne; e++) {
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    logits[e] = (float)((seed >> 33) % (uint64_t)levels) * 0.25f - 3.0f;
                }
                memcpy(probs, logits, sizeof(float) * (size_t)ne);
                ops->softmax(ne, probs);
                for (int j = 0; j < k; j++) {
                    int best = -1;
                    for (int e = 0; e < ne; e++)
                        if (!taken[e] && (best < 0 || probs[e] > probs[best]))
                            best = e;
                    taken[best] = true;
                    want[j] = best;
                    want_w[j] = probs[best];
                    sum += probs[best];
                }
                sum = AR_MAX(sum, 6.103515625e-5f);
                model_moe_route(ops, &hp, logits, sel, w);
                for (int j = 0; j < k; j++) {
                    if (sel[j] != want[j] || w[j] != want_w[j] / sum)
                        fail_msg("%d of %d experts, slot %d: expert %d weight %.9g, want %d %.9g",
                                 k, ne, j, sel[j], (double)w[j], want[j],
                                 (double)(want_w[j] / sum));
                }
            }
        }
    }
    assert_true(rounds > 500);
}

/* The reference refuses what it cannot run instead of reading out of bounds. */
static void reference_rejects_bad_arguments(void **state)
{
    struct fx x = {"fixtures-arch", "tiny-qwen3-f32"};
    struct model *m = load(&x);
    int32_t good[2] = {1, 2}, bad[2] = {1, 1 << 30};
    float out[2048];
    (void)state;
    assert_int_equal(model_forward_reference(m, bad, 2, out), AR_EINVAL);
    assert_int_equal(model_forward_reference(m, good, 0, out), AR_EINVAL);
    assert_int_equal(model_forward_reference(m, NULL, 2, out), AR_EINVAL);
    assert_int_equal(model_forward_reference(m, good, 2, out), AR_OK);
    for (int i = 0; i < 2048; i++)
        assert_true(isfinite(out[i]));
    model_destroy(m);
}

/* Last-position logits of toks through the fast pass at context n_ctx (one thread). */
static void fast_last(struct model *m, const int32_t *toks, int n, int64_t n_ctx, float *out)
{
    struct model_ctx *ctx;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct kv_seq s;
    int32_t pos[16], seq[16] = {0};
    struct kv_seq *sp = &s;
    assert_true(n <= 16);
    for (int i = 0; i < n; i++)
        pos[i] = i;
    assert_int_equal(model_ctx_create(m, n, NULL, &ctx), AR_OK);
    model_ctx_set_n_ctx(ctx, n_ctx);
    model_kv_params(m, 16, 1, AR_TYPE_F32, &kp);
    assert_int_equal(kv_create(&kp, &kv), AR_OK);
    kv_seq_init(&s);
    assert_int_equal(kv_seq_reserve(kv, &s, n), AR_OK);
    struct model_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .n_seqs = 1};
    assert_int_equal(model_forward(ctx, kv, &sp, &b, out), AR_OK);
    kv_seq_fini(kv, &s);
    kv_destroy(kv);
    model_ctx_destroy(ctx);
}

/* Phi-3/Phi-4 LongRoPE: within original_context_length (4096) the short factors, beyond it the
 * long ones (llama.cpp's choice by context size), each angle p * base^(-2i/n_rot) / factor_i
 * with cos and sin scaled by attn_factor; the factors are read here straight from the file. */
static void phi3_switches_to_long_rope_factors_beyond_the_original_context(void **state)
{
    struct fx x = {"fixtures-arch", "tiny-phi3-f32"};
    struct model *m = load(&x);
    const struct model_hparams *hp = model_hparams(m);
    const struct gguf_tensor *tl = gguf_find_tensor(model_gguf(m), "rope_factors_long.weight");
    const struct gguf_tensor *ts = gguf_find_tensor(model_gguf(m), "rope_factors_short.weight");
    int32_t toks[8] = {5, 17, 300, 41, 9, 700, 2, 88};
    int n_vocab = hp->n_vocab;
    float *a = malloc(sizeof(float) * (size_t)n_vocab), *b = malloc(sizeof(float) * (size_t)n_vocab),
          *c = malloc(sizeof(float) * (size_t)n_vocab), cs[256];
    (void)state;
    assert_true(a && b && c && tl && ts);
    assert_int_equal(hp->n_ctx_orig, 4096);
    assert_int_equal(hp->rope_dim, 48);
    for (int ctx_i = 0; ctx_i < 2; ctx_i++) {
        int64_t n_ctx = ctx_i ? 8192 : 4096;
        const float *ff = (const float *)(ctx_i ? tl : ts)->data;
        int32_t p = 77;
        model_rope_table(m, model_rope_for(m, 0, n_ctx), p, cs);
        for (int i = 0; i < hp->rope_dim / 2; i++) {
            double th = p * pow((double)hp->rope_freq_base, -2.0 * i / hp->rope_dim) / (double)ff[i];
            assert_true(fabs((double)cs[2 * i] - cos(th) * (double)hp->rope_attn_factor) < 1e-5);
            assert_true(fabs((double)cs[2 * i + 1] - sin(th) * (double)hp->rope_attn_factor) < 1e-5);
        }
    }
    fast_last(m, toks, 8, 0, a);    /* unset: short */
    fast_last(m, toks, 8, 4096, b); /* at the limit: still short */
    fast_last(m, toks, 8, 8192, c); /* beyond: long */
    assert_memory_equal(a, b, sizeof(float) * (size_t)n_vocab);
    assert_true(max_abs_diff(a, c, (size_t)n_vocab) > 0.01);
    free(a);
    free(b);
    free(c);
    model_destroy(m);
}

/* ---- the local KV pool of sliding-window layers ------------------------------------------ */

#define SWA_N 300     /* positions, well beyond gemma3's window of 64 */
#define SWA_BT 16     /* tokens per block */
#define SWA_SPLIT 240 /* chunks of SWA_CHUNK rows up to here, then one row per step */
#define SWA_CHUNK 40

struct swa_run {
    struct model_ctx *ctx;
    struct kv_cache *kv;
    struct kv_prefix *pc; /* NULL: nothing registered */
    uint64_t parent;      /* handle of the last registered block */
    int n_reg;            /* blocks registered */
    int64_t max_held;     /* most local blocks the sequence held after a step */
    int64_t max_decode;   /* ... while computing a one-row step */
};

/* Computes toks[from, n) of sequence s as the schedule above, every row's logits into
 * out + pos * n_vocab. Local blocks are taken per step for its rows (the prefix cache's given
 * up when short) and released behind the window after it; with r->pc each full block is
 * registered (with its local block) before that. */
static void swa_run_seq(struct swa_run *r, struct kv_seq *s, const int32_t *toks, int from,
                        int n, int n_vocab, float *out)
{
    int32_t pos[SWA_CHUNK], seq[SWA_CHUNK] = {0};
    uint8_t want[SWA_CHUNK];
    struct kv_seq *sp = s;
    for (int p0 = from; p0 < n;) {
        int c = p0 < SWA_SPLIT ? AR_MIN(SWA_CHUNK, SWA_SPLIT - p0) : 1;
        int64_t n_g, n_l;
        c = AR_MIN(c, n - p0);
        for (int i = 0; i < c; i++) {
            pos[i] = p0 + i;
            want[i] = 1;
        }
        kv_seq_need(r->kv, s, p0 + c, p0, &n_g, &n_l);
        if (r->pc && n_l > kv_pool_n_free(r->kv, KV_POOL_LOCAL))
            kv_prefix_evict_local(r->pc, n_l - kv_pool_n_free(r->kv, KV_POOL_LOCAL));
        assert_int_equal(kv_seq_reserve_at(r->kv, s, p0 + c, p0), AR_OK);
        if (c == 1)
            r->max_decode = AR_MAX(r->max_decode, kv_seq_n_local(s));
        struct model_batch b = {.n_tokens = c, .tokens = toks + p0, .pos = pos, .seq = seq,
                                .logits = want, .n_seqs = 1};
        assert_int_equal(model_forward(r->ctx, r->kv, &sp, &b, out + (size_t)p0 * n_vocab),
                         AR_OK);
        p0 += c;
        while (r->pc && (r->n_reg + 1) * SWA_BT <= p0) {
            assert_int_equal(kv_prefix_insert_local(r->pc, r->parent, toks + r->n_reg * SWA_BT,
                                                    &s->blocks[r->n_reg],
                                                    s->local ? &s->local[r->n_reg] : NULL,
                                                    &r->parent),
                             AR_OK);
            r->n_reg++;
        }
        kv_seq_slide(r->kv, s, p0);
        assert_true(kv_seq_window_held(r->kv, s, p0));
        r->max_held = AR_MAX(r->max_held, kv_seq_n_local(s));
    }
}

static struct kv_cache *swa_kv(const struct model *m, int64_t n_local)
{
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    model_kv_params(m, SWA_BT, 2 * ((SWA_N + SWA_BT - 1) / SWA_BT), AR_TYPE_F32, &kp);
    kp.n_local_blocks = n_local;
    assert_int_equal(kv_create(&kp, &kv), AR_OK);
    assert_true(kv_has_local(kv) == (n_local > 0));
    return kv;
}

/* One whole sequence (from 0) through a fresh cache with n_local local blocks (0: one pool). */
static struct swa_run swa_whole(struct model *m, struct model_ctx *ctx, int64_t n_local,
                                const int32_t *toks, float *out)
{
    struct swa_run r = {.ctx = ctx, .kv = swa_kv(m, n_local)};
    struct kv_seq s;
    int64_t n_blocks = kv_pool_n_blocks(r.kv, KV_POOL_GLOBAL);
    kv_seq_init(&s);
    swa_run_seq(&r, &s, toks, 0, SWA_N, model_hparams(m)->n_vocab, out);
    kv_seq_fini(r.kv, &s);
    assert_int_equal(kv_n_free(r.kv), n_blocks);
    assert_int_equal(kv_pool_n_free(r.kv, KV_POOL_LOCAL), n_local);
    kv_destroy(r.kv);
    return r;
}

/* gemma3 (window 64 on layer 0, layer 1 global), 300 positions in blocks of 16: with a local
 * pool a sequence holds at most ceil(64 / 16) + 1 local blocks after each step (one more while
 * a decode row opens a block), and the logits are bit for bit those of the single pool that
 * keeps everything (same schedule, same threads), which follows the reference pass. A prefix
 * reused past the window, its local blocks from the prefix cache, gives the logits of a
 * fresh computation; a cache whose local blocks are gone serves no match at all. */
static void sliding_layers_release_kv_behind_the_window_without_changing_logits(void **state)
{
    struct fx x = {"fixtures-arch", "tiny-gemma3-f32"};
    struct model *m = load(&x);
    const struct model_hparams *hp = model_hparams(m);
    int nv = hp->n_vocab;
    size_t all = (size_t)SWA_N * (size_t)nv;
    int32_t ta[SWA_N], tb[SWA_N];
    float *plain = malloc(sizeof(float) * all), *got = malloc(sizeof(float) * all),
          *ref = malloc(sizeof(float) * all), *fresh_b = malloc(sizeof(float) * all);
    struct th_rng rng = {0x5eed5a11};
    struct ar_pool *pool = NULL;
    struct model_ctx *ctx;
    struct swa_run r;
    struct kv_seq s;
    int64_t held_max = (64 + SWA_BT - 1) / SWA_BT + 1, matched;
    (void)state;
    assert_true(plain && got && ref && fresh_b);
    assert_int_equal(hp->swa_window, 64);
    assert_true(model_layer_is_swa(hp, 0) && !model_layer_is_swa(hp, 1));
    for (int i = 0; i < SWA_N; i++) {
        ta[i] = (int32_t)(th_rng_u64(&rng) % (uint64_t)nv);
        tb[i] = i < 260 ? ta[i] : (int32_t)(th_rng_u64(&rng) % (uint64_t)nv);
    }
    assert_int_equal(ar_pool_create(2, &pool), AR_OK);
    assert_int_equal(model_ctx_create(m, SWA_CHUNK, pool, &ctx), AR_OK);

    /* one pool (nothing released), against the reference pass */
    r = swa_whole(m, ctx, 0, ta, plain);
    assert_int_equal(r.max_held, 0);
    assert_int_equal(model_forward_reference(m, ta, SWA_N, ref), AR_OK);
    assert_true(max_abs_diff(plain, ref, all) <= FAST_VS_REF_MAX);

    /* a local pool of 8 blocks: what a 40-row chunk and its window can span, no more */
    r = swa_whole(m, ctx, 8, ta, got);
    assert_memory_equal(got, plain, sizeof(float) * all);
    assert_true(r.max_held <= held_max);
    assert_true(r.max_decode <= held_max + 1);
    assert_true(r.max_held >= held_max - 1); /* it did hold a window's worth */

    /* prefix reuse: A registered; B shares A's first 260 tokens (16 full blocks) */
    r = (struct swa_run){.ctx = ctx, .kv = swa_kv(m, 24)};
    assert_int_equal(kv_prefix_create(r.kv, &r.pc), AR_OK);
    kv_seq_init(&s);
    swa_run_seq(&r, &s, ta, 0, SWA_N, nv, got);
    assert_memory_equal(got, plain, sizeof(float) * all);
    kv_seq_fini(r.kv, &s);
    /* the cache holds blocks 0..17 with their local blocks; drop the local ones of 0..11 (least
     * recently used): a match ending at 256 needs blocks 12..15 (positions 193..255) */
    assert_int_equal(kv_prefix_evict_local(r.pc, 12), 12);
    matched = kv_prefix_lookup(r.pc, tb, 288, &s, &r.parent);
    assert_int_equal(matched, 256);
    for (int i = 0; i < 16; i++)
        assert_true((s.local[i] >= 0) == (i >= 12));
    kv_seq_slide(r.kv, &s, matched);
    r.n_reg = 16;
    r.max_held = 0;
    swa_run_seq(&r, &s, tb, 256, SWA_N, nv, got);
    assert_true(r.max_held <= held_max);
    kv_seq_fini(r.kv, &s);
    swa_whole(m, ctx, 0, tb, fresh_b);
    assert_memory_equal(got + (size_t)256 * nv, fresh_b + (size_t)256 * nv,
                        sizeof(float) * (size_t)(SWA_N - 256) * (size_t)nv);
    /* without any local block, no end of B's prefix has its window: no match */
    kv_prefix_evict_local(r.pc, 1000);
    assert_int_equal(kv_pool_n_free(r.kv, KV_POOL_LOCAL), 24);
    assert_int_equal(kv_prefix_lookup(r.pc, tb, 288, &s, &r.parent), 0);
    assert_int_equal(s.n_blocks, 0);
    assert_int_equal(r.parent, 0);
    kv_prefix_destroy(r.pc);
    assert_int_equal(kv_n_free(r.kv), kv_pool_n_blocks(r.kv, KV_POOL_GLOBAL));
    kv_seq_fini(r.kv, &s);
    kv_destroy(r.kv);

    /* a row whose window lost a local block (released, or never taken) is refused, not read */
    {
        struct kv_cache *kv = swa_kv(m, 12);
        struct kv_seq *sp = &s;
        int32_t p1 = 100, zero = 0;
        struct model_batch one = {.n_tokens = 1, .tokens = ta, .pos = &p1, .seq = &zero,
                                  .n_seqs = 1};
        kv_seq_init(&s);
        assert_int_equal(kv_seq_reserve(kv, &s, 128), AR_OK);
        kv_seq_slide(kv, &s, 128); /* keeps blocks 4..7 (positions 65..127 visible) */
        assert_int_equal(model_forward(ctx, kv, &sp, &one, got), AR_EINVAL);
        p1 = 127;
        assert_int_equal(model_forward(ctx, kv, &sp, &one, got), AR_OK);
        assert_int_equal(kv_seq_reserve_at(kv, &s, 160, INT64_MAX), AR_OK); /* no local */
        p1 = 140;
        assert_int_equal(model_forward(ctx, kv, &sp, &one, got), AR_EINVAL);
        kv_seq_fini(kv, &s);
        kv_destroy(kv);
    }

    model_ctx_destroy(ctx);
    ar_pool_destroy(pool);
    free(plain);
    free(got);
    free(ref);
    free(fresh_b);
    model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_model_fast_pass_follows_the_reference),
        cmocka_unit_test(fused_ffn_gives_the_unfused_bits),
        cmocka_unit_test(mixture_fused_gate_up_gives_the_unfused_bits),
        cmocka_unit_test(moe_routing_picks_the_k_most_probable_lowest_index_first),
        cmocka_unit_test(reference_rejects_bad_arguments),
        cmocka_unit_test(phi3_switches_to_long_rope_factors_beyond_the_original_context),
        cmocka_unit_test(sliding_layers_release_kv_behind_the_window_without_changing_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
