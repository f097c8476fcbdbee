/* ref.c - the scalar reference kernels: dequantization, activation quantization, dot products,
 * matrix tiles and the f32 vector ops. Plain loops, no tricks: this file is the spec that every
 * SIMD variant is tested against, so clarity wins over speed everywhere here.
 * Built without any -m flag and under -std=c11 (no FMA contraction), so float results are the
 * same on every x86-64 machine. */
#include <math.h>
#include <string.h>

#include "kernels_internal.h"

/* Round to nearest, ties to even (the default rounding mode), as the K-quant activation
 * quantizer does. Valid for |x| < 2^31; callers clamp. */
static int nearest_even(float x)
{
    return (int)rintf(x);
}

/* ---- element types ----------------------------------------------------------------------- */

enum ar_type kernels_vec_dot_type(enum ar_type t)
{
    switch (t) {
    case AR_TYPE_F32:
        return AR_TYPE_F32;
    case AR_TYPE_F16:
        return AR_TYPE_F16;
    case AR_TYPE_BF16:
        return AR_TYPE_BF16;
    case AR_TYPE_Q8_0:
    case AR_TYPE_Q4_0:
    case AR_TYPE_Q4_1:
    case AR_TYPE_Q5_0:
    case AR_TYPE_Q5_1:
        return AR_TYPE_Q8_0;
    case AR_TYPE_Q4_K:
    case AR_TYPE_Q5_K:
    case AR_TYPE_Q6_K:
        return AR_TYPE_Q8_K;
    default:
        return AR_TYPE_COUNT;
    }
}

/* ---- to_float: dequantization exactly as GGUF defines it ------------------------------------
 * The order of float operations below (for example (d * sc) * q - (dmin * m) for the K-quants)
 * is part of the spec: it reproduces the published dequantized values bit for bit. */

static void f32_to_float(const void *x, float *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f16_to_float(const void *x, float *y, int64_t n)
{
    const ar_f16 *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = ar_f16_to_f32(h[i]);
}

static void bf16_to_float(const void *x, float *y, int64_t n)
{
    const ar_bf16 *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = ar_bf16_to_f32(h[i]);
}

static void q8_0_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q8_0 *b = x;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d = ar_f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++)
            y[i * QK8_0 + j] = (float)b[i].qs[j] * d;
    }
}

static void q4_0_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q4_0 *b = x;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        float d = ar_f16_to_f32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int lo = (b[i].qs[j] & 0x0f) - 8;
            int hi = (b[i].qs[j] >> 4) - 8;
            y[i * QK4_0 + j] = (float)lo * d;
            y[i * QK4_0 + j + QK4_0 / 2] = (float)hi * d;
        }
    }
}

static void q4_1_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q4_1 *b = x;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        float d = ar_f16_to_f32(b[i].d);
        float m = ar_f16_to_f32(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            int lo = b[i].qs[j] & 0x0f;
            int hi = b[i].qs[j] >> 4;
            y[i * QK4_1 + j] = (float)lo * d + m;
            y[i * QK4_1 + j + QK4_1 / 2] = (float)hi * d + m;
        }
    }
}

/* The 5-bit value (0..31) of element e (0..31) of a Q5_0/Q5_1 block: the low or high nibble of
 * qs[e % 16] plus bit e of qh (a little-endian uint32) as the fifth bit. */
static int q5_quant(const uint8_t *qh, const uint8_t *qs, int e)
{
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                 (uint32_t)qh[3] << 24;
    int lo = e < 16 ? qs[e] & 0x0f : qs[e - 16] >> 4;
    return lo | (int)((h >> e) & 1) << 4;
}

static void q5_0_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q5_0 *b = x;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        float d = ar_f16_to_f32(b[i].d);
        for (int e = 0; e < QK5_0; e++)
            y[i * QK5_0 + e] = (float)(q5_quant(b[i].qh, b[i].qs, e) - 16) * d;
    }
}

static void q5_1_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q5_1 *b = x;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        float d = ar_f16_to_f32(b[i].d);
        float m = ar_f16_to_f32(b[i].m);
        for (int e = 0; e < QK5_1; e++)
            y[i * QK5_1 + e] = (float)q5_quant(b[i].qh, b[i].qs, e) * d + m;
    }
}

/* Scale and min of sub-block j (0..7) from the 12 packed bytes of a Q4_K/Q5_K block:
 * sub-blocks 0..3 keep their 6 bits in the low bits of bytes j (scale) and j + 4 (min);
 * sub-blocks 4..7 keep their low 4 bits in byte j + 4 (scale low nibble, min high nibble)
 * and their top 2 bits in the top 2 bits of bytes j - 4 (scale) and j (min). */
static void k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 4-bit (Q4_K) or 5-bit (Q5_K) value of element e (0..255) of a block. Elements come in
 * 4 chunks of 64: the low nibbles of qs[32c .. 32c + 31] hold elements 64c .. 64c + 31, the high
 * nibbles elements 64c + 32 .. 64c + 63. For Q5_K, bit 2c (first half) or 2c + 1 (second half)
 * of qh[e % 32] is the fifth bit. */
static int k_quant(const uint8_t *qs, const uint8_t *qh, int e)
{
    int c = e / 64, half = (e % 64) / 32, l = e % 32;
    int q = half ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0x0f;
    if (qh && (qh[l] >> (2 * c + half)) & 1)
        q += 16;
    return q;
}

static void qk45_to_float(ar_f16 dh, ar_f16 dminh, const uint8_t *scales, const uint8_t *qs,
                          const uint8_t *qh, float *y)
{
    float d = ar_f16_to_f32(dh);
    float dmin = ar_f16_to_f32(dminh);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        k_scale_min(j, scales, &sc, &m);
        float d1 = d * (float)sc;
        float m1 = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            y[32 * j + l] = d1 * (float)k_quant(qs, qh, 32 * j + l) - m1;
    }
}

static void q4_K_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q4_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++)
        qk45_to_float(b[i].d, b[i].dmin, b[i].scales, b[i].qs, NULL, y + i * QK_K);
}

static void q5_K_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q5_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++)
        qk45_to_float(b[i].d, b[i].dmin, b[i].scales, b[i].qs, b[i].qh, y + i * QK_K);
}

/* The 6-bit value (0..63, offset 32) of element e of a Q6_K block. Two halves of 128; in half
 * h, with l = e % 32 and quarter k = (e % 128) / 32: the low 4 bits are the low (k < 2) or
 * high (k >= 2) nibble of ql[64h + 32 * (k % 2) + l], the top 2 bits are bits 2k, 2k + 1 of
 * qh[32h + l]. The sub-block scale of element e is scales[e / 16]. */
static int q6_K_quant(const struct block_q6_K *b, int e)
{
    int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t lbyte = b->ql[64 * h + 32 * (k % 2) + l];
    int lo = k < 2 ? lbyte & 0x0f : lbyte >> 4;
    int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return lo | (hi << 4);
}

static void q6_K_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q6_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = ar_f16_to_f32(b[i].d);
        for (int e = 0; e < QK_K; e++)
            y[i * QK_K + e] = d * (float)b[i].scales[e / 16] * (float)(q6_K_quant(&b[i], e) - 32);
    }
}

static void q8_K_to_float(const void *x, float *y, int64_t n)
{
    const struct block_q8_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int j = 0; j < QK_K; j++)
            y[i * QK_K + j] = b[i].d * (float)b[i].qs[j];
}

/* ---- from_float: activation quantizers ------------------------------------------------------ */

static void f32_from_float(const float *x, void *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f16_from_float(const float *x, void *y, int64_t n)
{
    ar_f16 *h = y;
    for (int64_t i = 0; i < n; i++)
        h[i] = ar_f32_to_f16(x[i]);
}

static void bf16_from_float(const float *x, void *y, int64_t n)
{
    ar_bf16 *h = y;
    for (int64_t i = 0; i < n; i++)
        h[i] = ar_f32_to_bf16(x[i]);
}

/* Q8_0, per 32 values: d = amax / 127, q = round(x * (1 / d)) with halves away from zero.
 * The float d (not its f16 rounding, which is what is stored) sets the q values. */
static void q8_0_from_float(const float *x, void *y, int64_t n)
{
    struct block_q8_0 *b = y;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *xb = x + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ar_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++)
            b[i].qs[j] = (int8_t)roundf(xb[j] * id);
    }
}

/* Q8_K, per 256 values: max is the value of largest magnitude (the first one on ties),
 * iscale = -127 / max (so max maps to -127), q = min(127, nearest-even(iscale * x)),
 * d = 1 / iscale, bsums[k] = sum of q[16k .. 16k + 15]. An all-zero block is all zeros. */
static void q8_K_from_float(const float *x, void *y, int64_t n)
{
    struct block_q8_K *b = y;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        memset(&b[i], 0, sizeof(b[i]));
        if (amax == 0.0f)
            continue;
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = nearest_even(iscale * xb[j]);
            b[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int k = 0; k < QK_K / 16; k++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += b[i].qs[16 * k + j];
            b[i].bsums[k] = (int16_t)sum;
        }
        b[i].d = 1.0f / iscale;
    }
}

/* ---- vec_dot: one weight row against one activation row -------------------------------------
 * Float types accumulate products in float, in order. Quantized types sum integer products per
 * block (exact) and scale each block's sum once, accumulating the blocks in float. */

static void vec_dot_f32(int n, float *s, const void *x, const void *y)
{
    const float *a = x, *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += a[i] * b[i];
    *s = sum;
}

static void vec_dot_f16(int n, float *s, const void *x, const void *y)
{
    const ar_f16 *a = x, *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += ar_f16_to_f32(a[i]) * ar_f16_to_f32(b[i]);
    *s = sum;
}

static void vec_dot_bf16(int n, float *s, const void *x, const void *y)
{
    const ar_bf16 *a = x, *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += ar_bf16_to_f32(a[i]) * ar_bf16_to_f32(b[i]);
    *s = sum;
}

static void vec_dot_q8_0(int n, float *s, const void *x, const void *y)
{
    const struct block_q8_0 *a = x, *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++)
            sumi += a[i].qs[j] * b[i].qs[j];
        sum += (float)sumi * (ar_f16_to_f32(a[i].d) * ar_f16_to_f32(b[i].d));
    }
    *s = sum;
}

static void vec_dot_q4_0(int n, float *s, const void *x, const void *y)
{
    const struct block_q4_0 *a = x;
    const struct block_q8_0 *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((a[i].qs[j] & 0x0f) - 8) * b[i].qs[j];
            sumi += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + QK4_0 / 2];
        }
        sum += (float)sumi * (ar_f16_to_f32(a[i].d) * ar_f16_to_f32(b[i].d));
    }
    *s = sum;
}

/* Q4_1/Q5_1 against Q8_0 activations: w = d * q + m and a = yd * y, so per block
 * dot = (d * yd) * sum(q * y) + (m * yd) * sum(y), both sums exact in integers. (The sum of y
 * times yd is what a Q8_1 activation block would carry as its s.) */
static void vec_dot_q4_1(int n, float *s, const void *x, const void *y)
{
    const struct block_q4_1 *a = x;
    const struct block_q8_0 *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK4_1; i++) {
        int sumi = 0, sumy = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            sumi += (a[i].qs[j] & 0x0f) * b[i].qs[j];
            sumi += (a[i].qs[j] >> 4) * b[i].qs[j + QK4_1 / 2];
        }
        for (int j = 0; j < QK8_0; j++)
            sumy += b[i].qs[j];
        float yd = ar_f16_to_f32(b[i].d);
        sum += (float)sumi * (ar_f16_to_f32(a[i].d) * yd) +
               (float)sumy * (ar_f16_to_f32(a[i].m) * yd);
    }
    *s = sum;
}

static void vec_dot_q5_0(int n, float *s, const void *x, const void *y)
{
    const struct block_q5_0 *a = x;
    const struct block_q8_0 *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK5_0; i++) {
        int sumi = 0;
        for (int e = 0; e < QK5_0; e++)
            sumi += (q5_quant(a[i].qh, a[i].qs, e) - 16) * b[i].qs[e];
        sum += (float)sumi * (ar_f16_to_f32(a[i].d) * ar_f16_to_f32(b[i].d));
    }
    *s = sum;
}

static void vec_dot_q5_1(int n, float *s, const void *x, const void *y)
{
    const struct block_q5_1 *a = x;
    const struct block_q8_0 *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK5_1; i++) {
        int sumi = 0, sumy = 0;
        for (int e = 0; e < QK5_1; e++) {
            sumi += q5_quant(a[i].qh, a[i].qs, e) * b[i].qs[e];
            sumy += b[i].qs[e];
        }
        float yd = ar_f16_to_f32(b[i].d);
        sum += (float)sumi * (ar_f16_to_f32(a[i].d) * yd) +
               (float)sumy * (ar_f16_to_f32(a[i].m) * yd);
    }
    *s = sum;
}

/* Q4_K/Q5_K block against a Q8_K block: w = d * sc * q - dmin * m, so
 * dot = d * yd * sum_j sc_j * sum(q * y) - dmin * yd * sum_j m_j * sum(y over sub-block j),
 * where the sums of y come from the activation's bsums (two per sub-block of 32). */
static float qk45_dot_block(ar_f16 dh, ar_f16 dminh, const uint8_t *scales, const uint8_t *qs,
                            const uint8_t *qh, const struct block_q8_K *b)
{
    int sumi = 0, summ = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        int sub = 0;
        k_scale_min(j, scales, &sc, &m);
        for (int l = 0; l < 32; l++)
            sub += k_quant(qs, qh, 32 * j + l) * b->qs[32 * j + l];
        sumi += sc * sub;
        summ += m * (b->bsums[2 * j] + b->bsums[2 * j + 1]);
    }
    float d = ar_f16_to_f32(dh) * b->d;
    float dmin = ar_f16_to_f32(dminh) * b->d;
    return d * (float)sumi - dmin * (float)summ;
}

static void vec_dot_q4_K(int n, float *s, const void *x, const void *y)
{
    const struct block_q4_K *a = x;
    const struct block_q8_K *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK_K; i++)
        sum += qk45_dot_block(a[i].d, a[i].dmin, a[i].scales, a[i].qs, NULL, &b[i]);
    *s = sum;
}

static void vec_dot_q5_K(int n, float *s, const void *x, const void *y)
{
    const struct block_q5_K *a = x;
    const struct block_q8_K *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK_K; i++)
        sum += qk45_dot_block(a[i].d, a[i].dmin, a[i].scales, a[i].qs, a[i].qh, &b[i]);
    *s = sum;
}

/* Q6_K block against a Q8_K block: dot = d * yd * sum_j scales_j * sum((q - 32) * y). */
static void vec_dot_q6_K(int n, float *s, const void *x, const void *y)
{
    const struct block_q6_K *a = x;
    const struct block_q8_K *b = y;
    float sum = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            int sub = 0;
            for (int l = 0; l < 16; l++)
                sub += (q6_K_quant(&a[i], 16 * j + l) - 32) * b[i].qs[16 * j + l];
            sumi += a[i].scales[j] * sub;
        }
        sum += ar_f16_to_f32(a[i].d) * b[i].d * (float)sumi;
    }
    *s = sum;
}

/* ---- gemm: the tile loop over vec_dot -------------------------------------------------------- */

typedef void (*vec_dot_fn)(int n, float *s, const void *x, const void *y);

static void gemm_over(vec_dot_fn dot, int n, int nr, int nc, const void *w, size_t w_row,
                      const void *x, size_t x_row, float *y, size_t ldy)
{
    const uint8_t *wb = w, *xb = x;
    for (int j = 0; j < nc; j++)
        for (int i = 0; i < nr; i++)
            dot(n, &y[(size_t)j * ldy + (size_t)i], wb + (size_t)i * w_row, xb + (size_t)j * x_row);
}

#define REF_GEMM(name)                                                                             \
    static void gemm_##name(int n, int nr, int nc, const void *w, size_t w_row, const void *x,     \
                            size_t x_row, float *y, size_t ldy)                                    \
    {                                                                                              \
        gemm_over(vec_dot_##name, n, nr, nc, w, w_row, x, x_row, y, ldy);                          \
    }
REF_GEMM(f32)
REF_GEMM(f16)
REF_GEMM(bf16)
REF_GEMM(q8_0)
REF_GEMM(q4_0)
REF_GEMM(q4_1)
REF_GEMM(q5_0)
REF_GEMM(q5_1)
REF_GEMM(q4_K)
REF_GEMM(q5_K)
REF_GEMM(q6_K)
#undef REF_GEMM

/* ---- f32 vector ops ------------------------------------------------------------------------- */

static float dot_f32(int n, const float *x, const float *y)
{
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += x[i] * y[i];
    return sum;
}

static float dot_f16_f32(int n, const ar_f16 *x, const float *y)
{
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += ar_f16_to_f32(x[i]) * y[i];
    return sum;
}

static void axpy_f32(int n, float a, const float *x, float *y)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void axpy_f16(int n, float a, const ar_f16 *x, float *y)
{
    for (int i = 0; i < n; i++)
        y[i] += a * ar_f16_to_f32(x[i]);
}

/* The squares are float products summed in double (as llama.cpp's CPU rms_norm does); then
 * scale = 1 / sqrtf(mean + eps) in float and out = (x * scale) * w. */
static void rmsnorm(int n, float *out, const float *x, const float *w, float eps)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    float mean = (float)(sum / n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++)
        out[i] = (x[i] * scale) * w[i];
}

/* Subtract the max, expf, sum in double, multiply by the float reciprocal of the sum. */
static void softmax(int n, float *x)
{
    float max = -INFINITY;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        max = fmaxf(max, x[i]);
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += (double)x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

static void silu_mul(int n, float *out, const float *gate, const float *up)
{
    for (int i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void rope(float *x, int n_heads, int head_dim, int rope_dim, bool neox, const float *cs)
{
    for (int h = 0; h < n_heads; h++, x += head_dim)
        kernels_rope_pairs(x, 0, rope_dim, neox, cs);
}

static void gelu_mul(int n, float *out, const float *gate, const float *up)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        float u2 = 2.0f * KERNELS_GELU_K * (g + KERNELS_GELU_A * g * g * g);
        out[i] = g / (1.0f + expf(-u2)) * up[i];
    }
}

/* One KV head's attention over a run of key / value rows, with the dot and axpy above. */
static void attn_scores(int hd, int nq, int nt, const float *q, const void *k, size_t kv_stride,
                        enum ar_type kt, float scale, float *s, size_t s_stride)
{
    kernels_attn_scores_loop(dot_f32, dot_f16_f32, hd, nq, nt, q, k, kv_stride, kt, scale, s,
                             s_stride);
}

static void attn_values(int hd, int nq, int nt, const float *s, size_t s_stride, const void *v,
                        size_t kv_stride, enum ar_type kt, float *out)
{
    kernels_attn_values_loop(axpy_f32, axpy_f16, hd, nq, nt, s, s_stride, v, kv_stride, kt, out);
}

/* ---- the table ------------------------------------------------------------------------------ */

/* The int8 peak loop's arithmetic written out (see kernels.h): each round adds every lane's
 * 4 products KERNELS_PEAK_CHAINS times, in unsigned arithmetic so that the wrap is defined. */
static uint64_t int8_peak(int64_t n, const uint8_t *a, const int8_t *b, uint32_t *out)
{
    uint32_t acc[KERNELS_PEAK_CHAINS][16] = {{0}};
    for (int64_t r = 0; r < n; r++)
        for (int c = 0; c < KERNELS_PEAK_CHAINS; c++)
            for (int l = 0; l < 16; l++)
                for (int j = 0; j < 4; j++)
                    acc[c][l] += (uint32_t)((int32_t)a[4 * l + j] * (int32_t)b[4 * l + j]);
    for (int l = 0; l < 16; l++) {
        out[l] = 0;
        for (int c = 0; c < KERNELS_PEAK_CHAINS; c++)
            out[l] += acc[c][l];
    }
    return (uint64_t)n * KERNELS_PEAK_CHAINS * 64;
}

void kernels_fill_ref(struct kernel_ops *ops)
{
    ops->name = "ref";
    ops->int8_peak = int8_peak;
    ops->int8_peak_insn = "scalar C";

    kernels_fill_packed_ref(ops);
    ops->to_float[AR_TYPE_F32] = f32_to_float;
    ops->to_float[AR_TYPE_F16] = f16_to_float;
    ops->to_float[AR_TYPE_BF16] = bf16_to_float;
    ops->to_float[AR_TYPE_Q8_0] = q8_0_to_float;
    ops->to_float[AR_TYPE_Q4_0] = q4_0_to_float;
    ops->to_float[AR_TYPE_Q4_1] = q4_1_to_float;
    ops->to_float[AR_TYPE_Q5_0] = q5_0_to_float;
    ops->to_float[AR_TYPE_Q5_1] = q5_1_to_float;
    ops->to_float[AR_TYPE_Q4_K] = q4_K_to_float;
    ops->to_float[AR_TYPE_Q5_K] = q5_K_to_float;
    ops->to_float[AR_TYPE_Q6_K] = q6_K_to_float;
    ops->to_float[AR_TYPE_Q8_K] = q8_K_to_float;

    ops->from_float[AR_TYPE_F32] = f32_from_float;
    ops->from_float[AR_TYPE_F16] = f16_from_float;
    ops->from_float[AR_TYPE_BF16] = bf16_from_float;
    ops->from_float[AR_TYPE_Q8_0] = q8_0_from_float;
    ops->from_float[AR_TYPE_Q8_K] = q8_K_from_float;

    ops->vec_dot[AR_TYPE_F32] = vec_dot_f32;
    ops->vec_dot[AR_TYPE_F16] = vec_dot_f16;
    ops->vec_dot[AR_TYPE_BF16] = vec_dot_bf16;
    ops->vec_dot[AR_TYPE_Q8_0] = vec_dot_q8_0;
    ops->vec_dot[AR_TYPE_Q4_0] = vec_dot_q4_0;
    ops->vec_dot[AR_TYPE_Q4_1] = vec_dot_q4_1;
    ops->vec_dot[AR_TYPE_Q5_0] = vec_dot_q5_0;
    ops->vec_dot[AR_TYPE_Q5_1] = vec_dot_q5_1;
    ops->vec_dot[AR_TYPE_Q4_K] = vec_dot_q4_K;
    ops->vec_dot[AR_TYPE_Q5_K] = vec_dot_q5_K;
    ops->vec_dot[AR_TYPE_Q6_K] = vec_dot_q6_K;

    ops->gemm[AR_TYPE_F32] = gemm_f32;
    ops->gemm[AR_TYPE_F16] = gemm_f16;
    ops->gemm[AR_TYPE_BF16] = gemm_bf16;
    ops->gemm[AR_TYPE_Q8_0] = gemm_q8_0;
    ops->gemm[AR_TYPE_Q4_0] = gemm_q4_0;
    ops->gemm[AR_TYPE_Q4_1] = gemm_q4_1;
    ops->gemm[AR_TYPE_Q5_0] = gemm_q5_0;
    ops->gemm[AR_TYPE_Q5_1] = gemm_q5_1;
    ops->gemm[AR_TYPE_Q4_K] = gemm_q4_K;
    ops->gemm[AR_TYPE_Q5_K] = gemm_q5_K;
    ops->gemm[AR_TYPE_Q6_K] = gemm_q6_K;

    ops->dot_f32 = dot_f32;
    ops->dot_f16_f32 = dot_f16_f32;
    ops->axpy_f32 = axpy_f32;
    ops->axpy_f16 = axpy_f16;
    ops->rmsnorm = rmsnorm;
    ops->softmax = softmax;
    ops->silu_mul = silu_mul;
    ops->gelu_mul = gelu_mul;
    ops->rope = rope;
    ops->attn_scores = attn_scores;
    ops->attn_values = attn_values;
}

void kernels_dequantize_row(enum ar_type t, const void *src, float *dst, int64_t n)
{
    const struct kernel_ops *ref = kernels_ref();
    if ((unsigned)t < AR_TYPE_COUNT && ref->to_float[t])
        ref->to_float[t](src, dst, n);
}
