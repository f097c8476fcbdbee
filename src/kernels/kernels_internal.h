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

/* AR_KQ_PREFETCH as select.c read it before the tables were filled (once, with a warning for
 * a value that is neither): 1 for l1, 0 for l2, -1 where unset (each variant chooses). */
extern int kernels_kq_prefetch_env;

/* GELU in its tanh form: sqrt(2/pi) and the cubic's coefficient (see gelu_mul). */
#define KERNELS_GELU_K 0.7978845608028654f
#define KERNELS_GELU_A 0.044715f

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
