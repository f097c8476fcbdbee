/* kernels_internal.h - shared inside kernels/ only: how each ISA file registers the entries
 * it implements. select.c builds the tables; each ISA file is compiled with its own -m flags
 * (Makefile FLAGS_<file>) and must not be called on a CPU without those features. */
#ifndef AR_KERNELS_INTERNAL_H
#define AR_KERNELS_INTERNAL_H

#include "kernels.h"
#include "quants.h"

/* Fill the entries this ISA implements; leave the others untouched (NULL). */
void kernels_fill_ref(struct kernel_ops *ops);         /* ref.c: fills every entry */
void kernels_fill_packed_ref(struct kernel_ops *ops);  /* pack.c: ref's gemm_packed */
void kernels_fill_avx2(struct kernel_ops *ops);        /* avx2.c: needs avx2 fma f16c */
void kernels_fill_avx512(struct kernel_ops *ops);      /* avx512.c: + avx512f/bw/vl/dq */
void kernels_fill_avx512_vnni(struct kernel_ops *ops); /* avx512_vnni.c: + avx512vnni */
void kernels_fill_avx512_bf16(struct kernel_ops *ops); /* avx512_bf16.c: + avx512bf16 */

/* Packed Q6_K (kernels.h, "x16"): the byte offsets in a group's super-block of lane vector t
 * (< 8) of half h's ql bytes 0..31 (part 0) or 32..63 (part 1), and of its qh */
#define PK_Q6_QL(h, part, t)                                                                       \
    (288 + 1536 * (size_t)(h) + ((part) ? 1024 + 64 * (size_t)(t) : 128 * (size_t)(t)))
#define PK_Q6_QH(h, t) (288 + 1536 * (size_t)(h) + 128 * (size_t)(t) + 64)

/* Where the K-quant decode GEMV prefetches (avx512.c's pkk_tune) */
enum kq_prefetch {
    KQ_PREFETCH_CPU = -1, /* unset: chosen per CPU */
    KQ_PREFETCH_L2,       /* 8 super-blocks ahead into L2 */
    KQ_PREFETCH_L1,       /* 2 super-blocks ahead into L1 */
    KQ_PREFETCH_OFF,      /* none: the hardware prefetchers alone */
    KQ_PREFETCH_L2_BATCH, /* 8 ahead into L2 from 3 activation rows on, none below */
};

/* AR_KQ_PREFETCH (l1, l2, l2batch or off) as select.c read it before the tables were filled (once,
 * with a warning for any other value), KQ_PREFETCH_CPU where unset */
extern enum kq_prefetch kernels_kq_prefetch_env;

/* The packed Q8_0/Q4_0/Q5_0 gemm's order against 2 to 16 activation rows (batched decode):
 * two groups side by side chunk by chunk (avx512.c's pk_few), or one group at a time block by
 * block with the stream asked for far ahead into L2 (pk_stream). kernels_batch_gemm_env is
 * AR_BATCH_GEMM (pairs or stream) as select.c read it, BATCH_GEMM_CPU where unset;
 * kernels_batch_gemm the order in use, which the AVX-512 VNNI variants resolve per CPU when
 * their tables are filled and read at every call (so a test may set it to run either). */
enum batch_gemm { BATCH_GEMM_CPU = -1, BATCH_GEMM_PAIRS, BATCH_GEMM_STREAM };
extern enum batch_gemm kernels_batch_gemm_env, kernels_batch_gemm;

/* The software prefetch of weights streamed from memory by kernels whose hardware prefetchers
 * fall behind on some CPUs: the AVX-512 VNNI packed Q8_0/Q4_0/Q5_0 GEMV against one activation
 * row (which takes the stream order of the few rows above, with or without the block 16 on
 * asked for into L2), the AVX-512 packed F16/BF16 gemm (float512.h, 8 KiB ahead) and the AVX2
 * packed Q8_0/Q4_0/Q5_0 gemm (16 blocks ahead). select.c resolves it before the tables are
 * filled, so that every variant sees it: AR_DECODE_PREFETCH (off or l2), else per CPU vendor
 * (kernels_decode_prefetch_line says which, for the variants' tuning lines). Read at every
 * call, so a test may set it to run either. */
enum decode_prefetch { DECODE_PREFETCH_CPU = -1, DECODE_PREFETCH_OFF, DECODE_PREFETCH_L2 };
extern enum decode_prefetch kernels_decode_prefetch;
const char *kernels_decode_prefetch_line(void);

/* e^x for x already clamped to [-87.3, 88.7] and k = round(x / ln 2), in vectors of W bits
 * (256 or 512; the caller includes immintrin.h): x = k ln2 + r, |r| <= ln2 / 2, a degree-6
 * polynomial for e^r (the classic Cephes coefficients, relative error about 2e-7), times 2^k in
 * two factors so that k = 128 stays finite. One definition, so that every width computes the
 * same value in every lane. */
#define KERNELS_EXP_POLY(W, x, k, out)                                                             \
    do {                                                                                           \
        __m##W r_ = _mm##W##_fnmadd_ps(k, _mm##W##_set1_ps(0.693359375f), x);                      \
        r_ = _mm##W##_fnmadd_ps(k, _mm##W##_set1_ps(-2.12194440e-4f), r_);                         \
        __m##W p_ = _mm##W##_set1_ps(1.9875691500e-4f);                                            \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(1.3981999507e-3f));                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(8.3334519073e-3f));                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(4.1665795894e-2f));                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(1.6666665459e-1f));                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(5.0000001201e-1f));                        \
        p_ = _mm##W##_fmadd_ps(p_, _mm##W##_mul_ps(r_, r_),                                        \
                               _mm##W##_add_ps(r_, _mm##W##_set1_ps(1.0f)));                       \
        __m##W##i ki_ = _mm##W##_cvtps_epi32(k);                                                   \
        __m##W##i k1_ = _mm##W##_srai_epi32(ki_, 1), k2_ = _mm##W##_sub_epi32(ki_, k1_);           \
        __m##W s1_ = _mm##W##_castsi##W##_ps(                                                      \
            _mm##W##_slli_epi32(_mm##W##_add_epi32(k1_, _mm##W##_set1_epi32(127)), 23));           \
        __m##W s2_ = _mm##W##_castsi##W##_ps(                                                      \
            _mm##W##_slli_epi32(_mm##W##_add_epi32(k2_, _mm##W##_set1_epi32(127)), 23));           \
        (out) = _mm##W##_mul_ps(_mm##W##_mul_ps(p_, s1_), s2_);                                    \
    } while (0)

/* GELU in its tanh form: sqrt(2/pi) and the cubic's coefficient (see gelu_mul). */
#define KERNELS_GELU_K 0.7978845608028654f
#define KERNELS_GELU_A 0.044715f

/* rope (kernels.h) on pairs [i0, rope_dim / 2) of one head: the reference, and the vector
 * variants' tails (built with FMA available). Each product is its own statement, so no
 * compiler contracts it with the sum: GCC under -std=c11 contracts nothing, clang contracts
 * within one expression only. */
static inline void kernels_rope_pairs(float *x, int i0, int rope_dim, bool neox, const float *cs)
{
    int half = rope_dim / 2;
    for (int i = i0; i < half; i++) {
        float cos_t = cs[2 * i], sin_t = cs[2 * i + 1];
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        float x0c = x0 * cos_t, x1s = x1 * sin_t, x0s = x0 * sin_t, x1c = x1 * cos_t;
        x[a] = x0c - x1s;
        x[b] = x0s + x1c;
    }
}

/* The attention loops of variants without a fused kernel: per (query head, key row) the
 * variant's own dot and axpy, rows in order. Inline, so each ISA file compiles them with its
 * own flags around its own vector ops. */
typedef float (*kernels_dot_f32_fn)(int n, const float *x, const float *y);
typedef float (*kernels_dot_f16_fn)(int n, const ar_f16 *x, const float *y);
typedef void (*kernels_axpy_f32_fn)(int n, float a, const float *x, float *y);
typedef void (*kernels_axpy_f16_fn)(int n, float a, const ar_f16 *x, float *y);

static inline void kernels_attn_scores_loop(kernels_dot_f32_fn dot32, kernels_dot_f16_fn dot16,
                                            int hd, int nq, int nt, const float *q, const void *k,
                                            size_t kv_stride, enum ar_type kt, float scale,
                                            float *s, size_t s_stride)
{
    for (int h = 0; h < nq; h++) {
        for (int t = 0; t < nt; t++) {
            const void *kr = (const uint8_t *)k + (size_t)t * kv_stride;
            float d = kt == AR_TYPE_F16 ? dot16(hd, kr, q + (size_t)h * (size_t)hd)
                                        : dot32(hd, kr, q + (size_t)h * (size_t)hd);
            s[(size_t)h * s_stride + (size_t)t] = d * scale;
        }
    }
}

static inline void kernels_attn_values_loop(kernels_axpy_f32_fn axpy32, kernels_axpy_f16_fn axpy16,
                                            int hd, int nq, int nt, const float *s,
                                            size_t s_stride, const void *v, size_t kv_stride,
                                            enum ar_type kt, float *out)
{
    for (int h = 0; h < nq; h++) {
        for (int t = 0; t < nt; t++) {
            const void *vr = (const uint8_t *)v + (size_t)t * kv_stride;
            float a = s[(size_t)h * s_stride + (size_t)t];
            if (kt == AR_TYPE_F16)
                axpy16(hd, a, vr, out + (size_t)h * (size_t)hd);
            else
                axpy32(hd, a, vr, out + (size_t)h * (size_t)hd);
        }
    }
}

#endif
