/* kernels.h - compute on tensor types: dequantize, quantize, dot products and matrix tiles,
 * plus the few f32 vector ops of a transformer layer. Every operation has a scalar reference
 * (ref.c, the spec); SIMD variants (avx2.c, avx512.c, avx512_vnni.c, avx512_bf16.c) are
 * chosen at run time from the CPU features. Kernels know nothing of models or threads:
 * callers split rows. */
#ifndef AR_KERNELS_H
#define AR_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/cpu.h"
#include "base/types.h"

/* Activation type consumed by the dot product of weight type t:
 * F32 -> F32, F16 -> F16, BF16 -> BF16, Q8_0/Q4_0/Q5_0 -> Q8_0, Q4_K/Q5_K/Q6_K -> Q8_K
 * (as llama.cpp's CPU backend rounds activations). AR_TYPE_COUNT when unsupported.
 * Q4_1/Q5_1 -> Q8_0 as well: llama.cpp pairs them with Q8_1 (Q8_0 plus s = d * sum(q) in f16)
 * for the min term; we take the same activations as Q8_0 and compute that term per block as
 * m * d_y * sum(q_y) from the integer sum, which is the same quantity without s's f16
 * rounding. */
enum ar_type kernels_vec_dot_type(enum ar_type t);

struct kernel_ops {
    const char *name; /* "ref", "avx2", "avx512", "avx512_vnni", "avx512_bf16" */

    /* Per weight type t (indexed by enum ar_type); n is a multiple of t's block size. */
    /* x: row of n elements of type t -> y: n floats. */
    void (*to_float[AR_TYPE_COUNT])(const void *x, float *y, int64_t n);
    /* n floats -> row of type t (activation quantizers Q8_0, Q8_K, F16, BF16, F32). */
    void (*from_float[AR_TYPE_COUNT])(const float *x, void *y, int64_t n);
    /* *s = dot(x, y): x a row of type t, y a row of kernels_vec_dot_type(t). */
    void (*vec_dot[AR_TYPE_COUNT])(int n, float *s, const void *x, const void *y);
    /* Tile of a matrix product: for i < nr, j < nc:
     *   y[j * ldy + i] = dot(w row i, x row j)
     * w rows are w_row bytes apart (type t), x rows x_row bytes apart (vec_dot type); every
     * row starts 4-byte aligned (GGUF data is 32-byte aligned, activation buffers 64). */
    void (*gemm[AR_TYPE_COUNT])(int n, int nr, int nc, const void *w, size_t w_row,
                                const void *x, size_t x_row, float *y, size_t ldy);
    /* The same tile from weights packed by kernels_pack_rows (wp: the group holding row 0 of
     * the tile, kernels_packed_offset), bit for bit what gemm[t] gives on the rows unpacked.
     * Only a variant that streams the packed layout faster sets it; never inherited from a
     * lower variant (NULL: use gemm). */
    void (*gemm_packed[AR_TYPE_COUNT])(int n, int nr, int nc, const void *wp, const void *x,
                                       size_t x_row, float *y, size_t ldy);

    /* f32 vector ops */
    float (*dot_f32)(int n, const float *x, const float *y);
    float (*dot_f16_f32)(int n, const ar_f16 *x, const float *y);
    void (*axpy_f32)(int n, float a, const float *x, float *y); /* y += a * x */
    void (*axpy_f16)(int n, float a, const ar_f16 *x, float *y);
    /* out = x / rms(x) * w, rms over n with eps */
    void (*rmsnorm)(int n, float *out, const float *x, const float *w, float eps);
    /* x = softmax(x) in place over n */
    void (*softmax)(int n, float *x);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*silu_mul)(int n, float *out, const float *gate, const float *up);
    /* out[i] = gelu(gate[i]) * up[i], GELU in its tanh form 0.5 g (1 + tanh(u)),
     * u = sqrt(2/pi) (g + 0.044715 g^3), computed as g * sigmoid(2u) (the same function;
     * no cancellation where tanh(u) is near -1) */
    void (*gelu_mul)(int n, float *out, const float *gate, const float *up);
    /* Rotates the first rope_dim dims of each of n_heads heads of x (head_dim floats apart) by
     * cs, rope_dim / 2 (cos, sin) pairs: NEOX pairs (i, i + rope_dim / 2), else (2i, 2i + 1);
     * a pair (x0, x1) becomes (x0 cos - x1 sin, x0 sin + x1 cos), each product rounded on its
     * own (no fused multiply-add), so every variant gives the reference's bits. */
    void (*rope)(float *x, int n_heads, int head_dim, int rope_dim, bool neox, const float *cs);

    /* Attention of nq query heads (q: nq rows of hd floats, one after another) that share
     * one KV head, over nt key/value rows of hd elements of type kt (F32 or F16), rows
     * kv_stride bytes apart:
     *   attn_scores: s[h * s_stride + t] = scale * dot(q row h, k row t)
     *   attn_values: out[h * hd + i] += s[h * s_stride + t] * v row t [i], t in order
     * Where hd is a multiple of 16 a score is exactly the table's dot_f32 (dot_f16_f32) times
     * scale and the sums exactly its axpy_f32 (axpy_f16) row by row, whatever nq: the
     * reference pass, which uses those, then agrees with the fast pass bit for bit. */
    void (*attn_scores)(int hd, int nq, int nt, const float *q, const void *k, size_t kv_stride,
                        enum ar_type kt, float scale, float *s, size_t s_stride);
    void (*attn_values)(int hd, int nq, int nt, const float *s, size_t s_stride, const void *v,
                        size_t kv_stride, enum ar_type kt, float *out);

    /* The int8 multiply-accumulate loop `bench` times for the machine's int8 peak, built from
     * the instruction this variant's Q8_0 kernels multiply with (int8_peak_insn, e.g.
     * "vpdpbusd zmm"): n rounds, each adding KERNELS_PEAK_CHAINS times, per int32 lane
     * l < 16, the 4 products a[4l + j] * b[4l + j] (j < 4) into independent accumulators;
     * out[l] gets lane l's total modulo 2^32. a: 64 bytes in 0..127, b: 64 bytes in -64..63
     * (so no int16 sum saturates where the instruction has one). Returns the multiply-
     * accumulates done: n x KERNELS_PEAK_CHAINS x 64. */
    uint64_t (*int8_peak)(int64_t n, const uint8_t *a, const int8_t *b, uint32_t *out);
    const char *int8_peak_insn;

    /* Choices within a variant made per CPU model, where two CPUs measured differently with
     * the same instructions, in words for `bench` (e.g. "K-quant decode prefetch: 2 ahead
     * into L1"); NULL where the variant makes none. */
    const char *tuning;

    /* Which variant supplied each per-type entry ("ref", "avx2", ...), recorded by select.c
     * while it fills a table from the best variant down, so that `bench` can say what runs.
     * gemm_loop[t]: gemm[t] is the generic tile loop over vec_dot[t] of variant gemm_by[t]
     * (a variant with a vec_dot of its own and no gemm). NULL where the entry is NULL. */
    const char *gemm_by[AR_TYPE_COUNT];
    const char *vec_dot_by[AR_TYPE_COUNT];
    bool gemm_loop[AR_TYPE_COUNT];
    const char *int8_peak_by;
};

/* Accumulator chains per round of int8_peak: enough independent chains to cover the latency of
 * vpdpbusd (4-5 cycles) at two per cycle. */
#define KERNELS_PEAK_CHAINS 12

/* The reference table (every entry set). */
const struct kernel_ops *kernels_ref(void);
/* The best table for this CPU, with every entry a variant lacks filled from the next best
 * (finally from ref). AR_KERNELS=ref|avx2|avx512|avx512_vnni|avx512_bf16 in the environment
 * forces one (falling back to ref with a warning when the CPU lacks it). Thread-safe. */
const struct kernel_ops *kernels_get(void);
/* All variants this CPU can run, best first, each completed as above; returns the count.
 * Used by tests to hold each variant to the reference. */
int kernels_variants(const struct kernel_ops **out, int max);

/* Reference quantizer for weights (used by `autoreply quantize` and gen-model):
 * quantizes n floats (a multiple of t's block size) into dst. Supports F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. Returns bytes written, 0 if t is unsupported. */
size_t kernels_quantize_row(enum ar_type t, const float *src, void *dst, int64_t n);
/* Reference dequantizer for any supported type (same as kernels_ref()->to_float[t]). */
void kernels_dequantize_row(enum ar_type t, const void *src, float *dst, int64_t n);

/* Packed weights ("x16"): a matrix's rows in groups of 16 (the last group filled up by
 * repeating its last row), each group stored whole and in order, so that the 16 rows a lane
 * kernel computes at once are one contiguous stream instead of 16:
 *   group g (rows 16g..16g+15) at byte g * kernels_packed_group(t, n), block after block
 *   (32 elements; K-quants: super-blocks of 256), each as many bytes as the 16 rows' blocks
 *   in the file. A block holds the rows' fields one after another, each field of the 16 rows
 *   side by side: quants as lane vectors of 64 bytes (vector v's 4-byte lane r holding row
 *   r's bytes 4v..4v+3 of the field), f16 scales as 16 x 2 bytes, Q6_K's int8 scales as
 *   byte planes (plane s: the 16 rows' scale s). Per type:
 *     Q8_0: its 32 quants as unsigned q + 128 (8 vectors), d;
 *     Q4_0: its 16 nibble bytes as stored (low nibble quant i, high nibble quant i + 16;
 *       4 vectors), d;
 *     Q5_0: its nibbles (4 vectors), then the high-bit plane, 64 bytes: byte 4r + j holds in
 *       bit v the high bit of row r's quant 4v + j (lane vector v's byte j once unpacked), d;
 *     Q4_K: the 12 bytes of 6-bit scales and mins (3 vectors), d, dmin, qs (32 vectors);
 *     Q5_K: scales and mins (3 vectors), d, dmin, qh (8 vectors), qs (32 vectors);
 *     Q6_K: scales (16 byte planes), d, then per half of the super-block (elements 0..127,
 *       128..255) its ql bytes 0..31 and its 32 bytes of qh a vector of each in turn (16
 *       vectors: ql 4t..4t+3, then qh 4t..4t+3, for t = 0..7), its ql bytes 32..63 (8
 *       vectors); then 32 zero bytes, so that blocks stay 64-byte aligned (the only bytes
 *       packing adds);
 *     F16: its 64 bytes as 32 units of one element (2 bytes), 16 rows' units side by side;
 *     BF16: the same in units of a pair of elements (4 bytes, as vdpbf16ps multiplies them).
 * kernels_packed_group returns 0 for other types or n not a multiple of the block. Packing is
 * a copy in another order (Q6_K: plus its padding): kernels_unpack_row gives the rows back. */
#define KERNELS_PACK_ROWS 16
size_t kernels_packed_group(enum ar_type t, int64_t n);
/* Bytes of nr rows packed (0 when t cannot be packed or on overflow). */
size_t kernels_packed_size(enum ar_type t, int64_t n, int64_t nr);
/* Byte offset of the group holding row i (a multiple of 16). */
size_t kernels_packed_offset(enum ar_type t, int64_t n, int64_t i);
/* Packs rows [0, nr) of w (rows w_row bytes apart) into dst (kernels_packed_size bytes). */
void kernels_pack_rows(enum ar_type t, const void *w, size_t w_row, int64_t n, int64_t nr,
                       void *dst);
/* Row i (< the packed row count) of packed data wp back into its GGUF layout at dst. */
void kernels_unpack_row(enum ar_type t, const void *wp, int64_t n, int64_t i, void *dst);

#endif
