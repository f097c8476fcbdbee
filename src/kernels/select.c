/* select.c - builds the kernel tables once from the CPU features and picks one: ref, then
 * avx2, avx512, avx512_vnni, avx512_bf16, each starting as a copy of the next lower table so
 * that entries an ISA file leaves NULL fall back. AR_KERNELS=<name> forces a table. AMX is never used. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

enum { V_REF, V_AVX2, V_AVX512, V_AVX512_VNNI, V_AVX512_BF16, V_COUNT };

static const char *const variant_names[V_COUNT] = {"ref", "avx2", "avx512", "avx512_vnni",
                                                   "avx512_bf16"};
static void (*const variant_fill[V_COUNT])(struct kernel_ops *) = {
    kernels_fill_ref, kernels_fill_avx2, kernels_fill_avx512, kernels_fill_avx512_vnni,
    kernels_fill_avx512_bf16};

static struct kernel_ops tables[V_COUNT];
static bool table_ok[V_COUNT];
static int chosen;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static bool cpu_can_run(int v, const struct ar_cpu_features *cpu)
{
    bool avx2 = cpu->avx2 && cpu->fma && cpu->f16c;
    bool avx512 = avx2 && cpu->avx512f && cpu->avx512bw && cpu->avx512vl && cpu->avx512dq;
    switch (v) {
    case V_REF:
        return true;
    case V_AVX2:
        return avx2;
    case V_AVX512:
        return avx512;
    case V_AVX512_VNNI:
        return avx512 && cpu->avx512vnni;
    case V_AVX512_BF16:
        return avx512 && cpu->avx512vnni && cpu->avx512bf16;
    default:
        return false;
    }
}

/* ---- generic gemm over a table's own vec_dot -------------------------------------------------
 * A table copied from a lower one keeps that table's gemm, which calls the lower vec_dot. When an
 * ISA file supplies a faster vec_dot[t] but no gemm[t], the tile loop is rebound to the faster
 * vec_dot through these small per-(table, type) wrappers. */

static void gemm_loop(void (*dot)(int, float *, const void *, const void *), int n, int nr, int nc,
                      const void *w, size_t w_row, const void *x, size_t x_row, float *y,
                      size_t ldy)
{
    const uint8_t *wb = w, *xb = x;
    for (int j = 0; j < nc; j++)
        for (int i = 0; i < nr; i++)
            dot(n, &y[(size_t)j * ldy + (size_t)i], wb + (size_t)i * w_row, xb + (size_t)j * x_row);
}

#define GEMM_WRAP(v, ty)                                                                           \
    static void gemm_##v##_##ty(int n, int nr, int nc, const void *w, size_t w_row, const void *x, \
                                size_t x_row, float *y, size_t ldy)                                \
    {                                                                                              \
        gemm_loop(tables[v].vec_dot[AR_TYPE_##ty], n, nr, nc, w, w_row, x, x_row, y, ldy);         \
    }
#define GEMM_WRAP_ALL(v)                                                                           \
    GEMM_WRAP(v, F32)                                                                              \
    GEMM_WRAP(v, F16)                                                                              \
    GEMM_WRAP(v, BF16)                                                                             \
    GEMM_WRAP(v, Q8_0)                                                                             \
    GEMM_WRAP(v, Q4_0)                                                                             \
    GEMM_WRAP(v, Q4_K)                                                                             \
    GEMM_WRAP(v, Q5_K)                                                                             \
    GEMM_WRAP(v, Q6_K)
GEMM_WRAP_ALL(V_AVX2)
GEMM_WRAP_ALL(V_AVX512)
GEMM_WRAP_ALL(V_AVX512_VNNI)
GEMM_WRAP_ALL(V_AVX512_BF16)

typedef void (*gemm_fn)(int, int, int, const void *, size_t, const void *, size_t, float *, size_t);
#define GEMM_ROW(v)                                                                                \
    {                                                                                              \
        [AR_TYPE_F32] = gemm_##v##_F32, [AR_TYPE_F16] = gemm_##v##_F16,                            \
        [AR_TYPE_BF16] = gemm_##v##_BF16, [AR_TYPE_Q8_0] = gemm_##v##_Q8_0,                        \
        [AR_TYPE_Q4_0] = gemm_##v##_Q4_0, [AR_TYPE_Q4_K] = gemm_##v##_Q4_K,                        \
        [AR_TYPE_Q5_K] = gemm_##v##_Q5_K, [AR_TYPE_Q6_K] = gemm_##v##_Q6_K,                        \
    }
static const gemm_fn gemm_wrappers[V_COUNT][AR_TYPE_COUNT] = {
    [V_AVX2] = GEMM_ROW(V_AVX2),
    [V_AVX512] = GEMM_ROW(V_AVX512),
    [V_AVX512_VNNI] = GEMM_ROW(V_AVX512_VNNI),
    [V_AVX512_BF16] = GEMM_ROW(V_AVX512_BF16),
};

/* ---- building ------------------------------------------------------------------------------ */

enum kq_prefetch kernels_kq_prefetch_env = KQ_PREFETCH_CPU;
enum batch_gemm kernels_batch_gemm_env = BATCH_GEMM_CPU, kernels_batch_gemm = BATCH_GEMM_PAIRS;
enum decode_prefetch kernels_decode_prefetch = DECODE_PREFETCH_OFF;

/* The decode prefetch (kernels_internal.h) per CPU: on Intel, where (Xeon family 6 model 0xcf,
 * 2026-12-07, one thread, matrices of 300-650 MB from memory, GB/s of the weights, a plain
 * read 17) it took the AVX-512 Q8_0 GEMV from 14.5-14.7 to 16.3-16.8 (avx512.c pk_gemm's
 * note), BF16 from 12.2-12.5 to 15.4-15.8 (float512.h), the AVX2 Q8_0 gemm against one row
 * from 10.5-10.8 to 15.1-15.2 and Q4_0 from 9.6-9.9 to 13.3-14.3 (avx2.c); and on an AMD
 * without AVX-512 (Zen 3, family 0x19 model 1, 2026-12-07; qwen05 decode efficiency on 1 / 2
 * threads, off -> on): Q8_0 0.88 / 0.90 -> 0.92 / 0.87, Q4_0 0.66 / 0.78 -> 0.83 / 0.88,
 * Q4_K_M 0.71 / 0.80 -> 0.86 / 0.83, and the AVX2 F16/BF16 GEMV (avx2.c DEFINE_GEMM_LOOP).
 * Not on the AMDs with AVX-512, where it was measured on the AVX-512 Q8_0 GEMV before the
 * stream order (Zen 4: 512 to 8192 bytes ahead gained nothing, the GEMV streamed at 0.9 of a
 * plain read) and the AVX2 Q8_0 decode read about the bandwidth without it (Zen 4, session
 * 21). */
static enum decode_prefetch decode_prefetch_for(const struct ar_cpu_features *cpu,
                                                enum decode_prefetch env)
{
    if (env != DECODE_PREFETCH_CPU)
        return env;
    return cpu->amd && cpu->avx512f ? DECODE_PREFETCH_OFF : DECODE_PREFETCH_L2;
}

const char *kernels_decode_prefetch_line(void)
{
    return kernels_decode_prefetch == DECODE_PREFETCH_L2
               ? "decode stream prefetch into L2 (16 blocks, 8 KiB ahead)"
               : "decode stream prefetch off";
}

/* The index in names (n of them) of the value of the variable var; -1 where it is unset or
 * empty, or, with a warning that lists the values allowed, names none of them */
static int env_choice(const char *var, const char *const names[], int n, const char *allowed)
{
    const char *v = getenv(var);
    if (!v || !*v)
        return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i]))
            return i;
    AR_WARN("%s=%s is not %s; the CPU's choice stands", var, v, allowed);
    return -1;
}

static void build_tables(void)
{
    static const char *const kq_names[] = {[KQ_PREFETCH_L2] = "l2",
                                           [KQ_PREFETCH_L1] = "l1",
                                           [KQ_PREFETCH_OFF] = "off",
                                           [KQ_PREFETCH_L2_BATCH] = "l2batch"};
    static const char *const batch_names[] = {
        [BATCH_GEMM_PAIRS] = "pairs", [BATCH_GEMM_STREAM] = "stream"};
    static const char *const decode_names[] = {
        [DECODE_PREFETCH_OFF] = "off", [DECODE_PREFETCH_L2] = "l2"};
    const struct ar_cpu_features *cpu = ar_cpu_features_get();
    const char *env = getenv("AR_KERNELS");

    /* -1 (none given) is each enum's "chosen per CPU" */
    kernels_kq_prefetch_env = (enum kq_prefetch)env_choice(
        "AR_KQ_PREFETCH", kq_names, (int)AR_ARRAY_LEN(kq_names), "l1, l2, l2batch or off");
    kernels_batch_gemm_env = (enum batch_gemm)env_choice(
        "AR_BATCH_GEMM", batch_names, (int)AR_ARRAY_LEN(batch_names), "pairs or stream");
    kernels_decode_prefetch = decode_prefetch_for(
        cpu, (enum decode_prefetch)env_choice("AR_DECODE_PREFETCH", decode_names,
                                              (int)AR_ARRAY_LEN(decode_names), "off or l2"));

    kernels_fill_ref(&tables[V_REF]);
    for (int t = 0; t < AR_TYPE_COUNT; t++) {
        tables[V_REF].gemm_by[t] = tables[V_REF].gemm[t] ? variant_names[V_REF] : NULL;
        tables[V_REF].vec_dot_by[t] = tables[V_REF].vec_dot[t] ? variant_names[V_REF] : NULL;
    }
    tables[V_REF].int8_peak_by = variant_names[V_REF];
    table_ok[V_REF] = true;
    for (int v = V_AVX2; v < V_COUNT; v++) {
        const struct kernel_ops *lower = &tables[v - 1];
        if (!table_ok[v - 1] || !cpu_can_run(v, cpu))
            break;
        /* start empty so we can see what the ISA file filled, then fall back entry by entry */
        memset(&tables[v], 0, sizeof(tables[v]));
        variant_fill[v](&tables[v]);
        for (int t = 0; t < AR_TYPE_COUNT; t++) {
            if (!tables[v].to_float[t])
                tables[v].to_float[t] = lower->to_float[t];
            if (!tables[v].from_float[t])
                tables[v].from_float[t] = lower->from_float[t];
            /* record who supplied vec_dot and gemm: this variant, or the lower table's
             * supplier; a gemm wrapper belongs to this variant as a loop over its vec_dot */
            tables[v].vec_dot_by[t] = variant_names[v];
            if (!tables[v].vec_dot[t]) {
                tables[v].vec_dot[t] = lower->vec_dot[t];
                tables[v].vec_dot_by[t] = lower->vec_dot_by[t];
            }
            tables[v].gemm_by[t] = variant_names[v];
            if (!tables[v].gemm[t]) {
                tables[v].gemm[t] = lower->gemm[t];
                tables[v].gemm_by[t] = lower->gemm_by[t];
                tables[v].gemm_loop[t] = lower->gemm_loop[t];
                if (tables[v].vec_dot[t] != lower->vec_dot[t] && gemm_wrappers[v][t]) {
                    tables[v].gemm[t] = gemm_wrappers[v][t];
                    tables[v].gemm_by[t] = variant_names[v];
                    tables[v].gemm_loop[t] = true;
                }
            }
        }
        tables[v].int8_peak_by = variant_names[v];
        if (!tables[v].int8_peak) {
            tables[v].int8_peak = lower->int8_peak;
            tables[v].int8_peak_insn = lower->int8_peak_insn;
            tables[v].int8_peak_by = lower->int8_peak_by;
        }
#define FALL_BACK(f)                                                                               \
    if (!tables[v].f)                                                                              \
        tables[v].f = lower->f;
        FALL_BACK(dot_f32)
        FALL_BACK(dot_f16_f32)
        FALL_BACK(axpy_f32)
        FALL_BACK(axpy_f16)
        FALL_BACK(rmsnorm)
        FALL_BACK(softmax)
        FALL_BACK(silu_mul)
        FALL_BACK(gelu_mul)
        FALL_BACK(rope)
        FALL_BACK(attn_scores)
        FALL_BACK(attn_values)
#undef FALL_BACK
        tables[v].name = variant_names[v];
        table_ok[v] = true;
    }

    chosen = V_REF;
    for (int v = 0; v < V_COUNT; v++)
        if (table_ok[v])
            chosen = v;
    if (env && *env) {
        int want = -1;
        for (int v = 0; v < V_COUNT; v++)
            if (strcmp(env, variant_names[v]) == 0)
                want = v;
        if (want < 0) {
            AR_WARN("AR_KERNELS=%s is not a kernel variant (ref, avx2, avx512, avx512_vnni, "
                    "avx512_bf16); "
                    "using ref",
                    env);
            chosen = V_REF;
        } else if (!table_ok[want]) {
            AR_WARN("AR_KERNELS=%s: this CPU cannot run it; using ref", env);
            chosen = V_REF;
        } else {
            chosen = want;
        }
    }
}

const struct kernel_ops *kernels_ref(void)
{
    pthread_once(&once, build_tables);
    return &tables[V_REF];
}

const struct kernel_ops *kernels_get(void)
{
    pthread_once(&once, build_tables);
    return &tables[chosen];
}

int kernels_variants(const struct kernel_ops **out, int max)
{
    int n = 0;
    pthread_once(&once, build_tables);
    for (int v = V_COUNT - 1; v >= 0; v--)
        if (table_ok[v] && n < max)
            out[n++] = &tables[v];
    return n;
}
