/* quantize.c - reference weight quantizers (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K), used
 * by `autoreply quantize` and to write random test models. The output is valid GGUF block data;
 * it aims at low squared error, not at byte equality with any other tool's quantizer. */
#include <math.h>
#include <string.h>

#include "kernels_internal.h"

/* Rounds to nearest (ties to even) and clamps to [lo, hi]; NaN gives lo. */
static int round_clamp(float x, int lo, int hi)
{
    if (!(x >= (float)lo))
        return lo;
    if (x >= (float)hi)
        return hi;
    return (int)rintf(x);
}

/* ---- Q4_0 --------------------------------------------------------------------------------- */

/* Per 32: the signed value of largest magnitude maps to -8, d = max / -8,
 * q = min(15, trunc(x / d + 8.5)), w = d * (q - 8). */
static void quantize_q4_0(const float *x, struct block_q4_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        uint8_t q[QK4_0];
        for (int j = 0; j < QK4_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ar_f32_to_f16(d);
        for (int j = 0; j < QK4_0; j++) {
            int v = (int)(x[j] * id + 8.5f);
            q[j] = (uint8_t)(v < 15 ? v : 15);
        }
        for (int j = 0; j < QK4_0 / 2; j++)
            b[i].qs[j] = (uint8_t)(q[j] | (q[j + QK4_0 / 2] << 4));
    }
}

/* ---- Q4_1, Q5_0, Q5_1 ----------------------------------------------------------------------- */

/* Packs 32 values q (0..31) into the nibbles qs (element j low, j + 16 high) and, when qh is
 * not NULL, their fifth bits into qh (bit j of a little-endian uint32 for element j). */
static void pack_legacy(const uint8_t *q, uint8_t *qs, uint8_t *qh)
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    if (!qh)
        return;
    for (int j = 0; j < 32; j++)
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; k++)
        qh[k] = (uint8_t)(h >> (8 * k));
}

/* Per 32, min-max: m = min(x), d = (max(x) - m) / nmax, both stored as f16, then
 * q = round((x - m) / d) against the stored values, clamped to 0..nmax. */
static void quantize_minmax_block(const float *x, int nmax, ar_f16 *dh, ar_f16 *mh, uint8_t *q)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    *dh = ar_f32_to_f16((hi - lo) / (float)nmax);
    *mh = ar_f32_to_f16(lo);
    float d = ar_f16_to_f32(*dh), m = ar_f16_to_f32(*mh);
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)(d > 0.0f ? round_clamp((x[j] - m) / d, 0, nmax) : 0);
}

static void quantize_q4_1(const float *x, struct block_q4_1 *b, int64_t nb)
{
    uint8_t q[QK4_1];
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        quantize_minmax_block(x, 15, &b[i].d, &b[i].m, q);
        pack_legacy(q, b[i].qs, NULL);
    }
}

static void quantize_q5_1(const float *x, struct block_q5_1 *b, int64_t nb)
{
    uint8_t q[QK5_1];
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        quantize_minmax_block(x, 31, &b[i].d, &b[i].m, q);
        pack_legacy(q, b[i].qs, b[i].qh);
    }
}

/* Per 32, as Q4_0 with 16 levels each side: the signed value of largest magnitude maps to
 * -16, d = max / -16, q = min(31, trunc(x / d + 16.5)), w = d * (q - 16). */
static void quantize_q5_0(const float *x, struct block_q5_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        float amax = 0.0f, max = 0.0f;
        uint8_t q[QK5_0];
        for (int j = 0; j < QK5_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ar_f32_to_f16(d);
        for (int j = 0; j < QK5_0; j++) {
            int v = (int)(x[j] * id + 16.5f);
            q[j] = (uint8_t)(v < 31 ? v : 31);
        }
        pack_legacy(q, b[i].qs, b[i].qh);
    }
}

/* ---- K-quant sub-block fitting -------------------------------------------------------------- */

/* Weighted least squares of x ~ s * l + b over n points; returns false when degenerate. */
static bool solve_affine(int n, const float *x, const float *w, const uint8_t *l, float *s,
                         float *b)
{
    float sw = 0.0f, sl = 0.0f, sll = 0.0f, sx = 0.0f, slx = 0.0f;
    for (int i = 0; i < n; i++) {
        sw += w[i];
        sl += w[i] * l[i];
        sll += w[i] * l[i] * l[i];
        sx += w[i] * x[i];
        slx += w[i] * l[i] * x[i];
    }
    float det = sw * sll - sl * sl;
    if (!(det > 0.0f))
        return false;
    *s = (sw * slx - sl * sx) / det;
    *b = (sll * sx - sl * slx) / det;
    if (*b > 0.0f) { /* the format's offset is -dmin * m with m >= 0: refit with b = 0 */
        *b = 0.0f;
        *s = slx / sll;
    }
    return *s > 0.0f;
}

static float affine_err(int n, const float *x, const float *w, const uint8_t *l, float s, float b)
{
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
        float e = s * (float)l[i] + b - x[i];
        err += w[i] * e * e;
    }
    return err;
}

/* Finds s >= 0 and m >= 0 with x ~ s * q - m, q in 0..nmax, minimising the weighted squared
 * error: try a fan of grid spacings around (max - min) / nmax, refit (s, m) by least squares
 * for each grid's q, keep the best, then alternate "requantize with (s, m), refit" a few times.
 * Writes q and *m, returns s. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *q, float *m)
{
    uint8_t l[32];
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    /* the best fit with s = 0: every value -> the offset min(0, weighted mean) */
    float best_s = 0.0f, best_b = lo, best_err;
    memset(q, 0, (size_t)n);
    if (hi <= lo) {
        *m = -lo;
        return 0.0f;
    }
    {
        float sw = 0.0f, sx = 0.0f;
        for (int i = 0; i < n; i++) {
            sw += w[i];
            sx += w[i] * x[i];
        }
        best_b = sw > 0.0f ? fminf(0.0f, sx / sw) : lo;
        best_err = affine_err(n, x, w, q, 0.0f, best_b);
    }
    for (int k = -10; k <= 10; k++) {
        float iscale = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        float s, b;
        for (int i = 0; i < n; i++)
            l[i] = (uint8_t)round_clamp(iscale * (x[i] - lo), 0, nmax);
        if (!solve_affine(n, x, w, l, &s, &b))
            continue;
        float err = affine_err(n, x, w, l, s, b);
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_b = b;
            memcpy(q, l, (size_t)n);
        }
    }
    for (int iter = 0; iter < 4 && best_s > 0.0f; iter++) {
        float s, b;
        for (int i = 0; i < n; i++)
            l[i] = (uint8_t)round_clamp((x[i] - best_b) / best_s, 0, nmax);
        if (!solve_affine(n, x, w, l, &s, &b))
            break;
        float err = affine_err(n, x, w, l, s, b);
        if (!(err < best_err))
            break;
        best_err = err;
        best_s = s;
        best_b = b;
        memcpy(q, l, (size_t)n);
    }
    *m = -best_b;
    return best_s;
}

/* Packs 8 six-bit scales and mins into the 12 bytes of a Q4_K/Q5_K block (the inverse of the
 * unpacking described in ref.c). */
static void pack_k_scales(const uint8_t *sc, const uint8_t *mn, uint8_t *out)
{
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

/* One 256-block of Q4_K (nbits 4) or Q5_K (nbits 5): fit each sub-block of 32, quantize the 8
 * scales and 8 mins to 6 bits against f16 super-scales d and dmin, then requantize every value
 * with the scales as stored. q receives 0..2^nbits - 1 per element. */
static void quantize_k45_block(const float *x, int nbits, ar_f16 *dh, ar_f16 *dminh,
                               uint8_t *scales, uint8_t *q)
{
    const int nmax = (1 << nbits) - 1;
    float w[32], s[QK_K / 32], m[QK_K / 32];
    uint8_t sc[QK_K / 32], mn[QK_K / 32];
    float max_s = 0.0f, max_m = 0.0f;
    for (int i = 0; i < 32; i++)
        w[i] = 1.0f;
    for (int j = 0; j < QK_K / 32; j++) {
        s[j] = fit_scale_min(32, nmax, x + 32 * j, w, q + 32 * j, &m[j]);
        max_s = fmaxf(max_s, s[j]);
        max_m = fmaxf(max_m, m[j]);
    }
    *dh = ar_f32_to_f16(max_s / 63.0f);
    *dminh = ar_f32_to_f16(max_m / 63.0f);
    float d = ar_f16_to_f32(*dh), dmin = ar_f16_to_f32(*dminh);
    for (int j = 0; j < QK_K / 32; j++) {
        sc[j] = (uint8_t)(d > 0.0f ? round_clamp(s[j] / d, 0, 63) : 0);
        mn[j] = (uint8_t)(dmin > 0.0f ? round_clamp(m[j] / dmin, 0, 63) : 0);
        float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
        for (int l = 0; l < 32; l++) {
            float v = x[32 * j + l];
            q[32 * j + l] = (uint8_t)(ds > 0.0f ? round_clamp((v + dm) / ds, 0, nmax) : 0);
        }
    }
    pack_k_scales(sc, mn, scales);
}

/* Low nibbles: chunk c of 64 elements -> qs[32c + l] = q[64c + l] | q[64c + 32 + l] << 4. */
static void pack_k_nibbles(const uint8_t *q, uint8_t *qs)
{
    for (int c = 0; c < QK_K / 64; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)((q[64 * c + l] & 0x0f) | ((q[64 * c + 32 + l] & 0x0f) << 4));
}

static void quantize_q4_K(const float *x, struct block_q4_K *b, int64_t nb)
{
    uint8_t q[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quantize_k45_block(x, 4, &b[i].d, &b[i].dmin, b[i].scales, q);
        pack_k_nibbles(q, b[i].qs);
    }
}

static void quantize_q5_K(const float *x, struct block_q5_K *b, int64_t nb)
{
    uint8_t q[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quantize_k45_block(x, 5, &b[i].d, &b[i].dmin, b[i].scales, q);
        pack_k_nibbles(q, b[i].qs);
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int c = 0; c < QK_K / 64; c++) {
            for (int l = 0; l < 32; l++) {
                if (q[64 * c + l] & 16)
                    b[i].qh[l] |= (uint8_t)(1u << (2 * c));
                if (q[64 * c + 32 + l] & 16)
                    b[i].qh[l] |= (uint8_t)(1u << (2 * c + 1));
            }
        }
    }
}

/* ---- Q6_K --------------------------------------------------------------------------------- */

/* Finds a signed s with x ~ s * l, l in -32..31, minimising the weighted squared error over
 * a fan of candidate scales around -32 / max (max: the value of largest magnitude), each
 * refit by least squares, then refined by requantize/refit. Returns s (0 for an all-zero x). */
static float fit_scale_sym(int n, const float *x, const float *w)
{
    float amax = 0.0f, max = 0.0f, best_s = 0.0f, best_err = 0.0f;
    int l[16];
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
        best_err += w[i] * x[i] * x[i];
    }
    if (amax == 0.0f)
        return 0.0f;
    for (int k = -10; k <= 10 + 4; k++) {
        float sxl = 0.0f, sll = 0.0f, err = 0.0f, s;
        if (k <= 10) { /* grid candidates */
            float iscale = -(32.0f + 0.1f * (float)k) / max;
            for (int i = 0; i < n; i++)
                l[i] = round_clamp(iscale * x[i], -32, 31);
        } else { /* refinement with the best scale so far */
            if (best_s == 0.0f)
                break;
            for (int i = 0; i < n; i++)
                l[i] = round_clamp(x[i] / best_s, -32, 31);
        }
        for (int i = 0; i < n; i++) {
            sxl += w[i] * x[i] * (float)l[i];
            sll += w[i] * (float)(l[i] * l[i]);
        }
        if (!(sll > 0.0f))
            continue;
        s = sxl / sll;
        for (int i = 0; i < n; i++) {
            float e = x[i] - s * (float)l[i];
            err += w[i] * e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = s;
        }
    }
    return best_s;
}

/* Per 256: 16 sub-blocks of 16 with signed 8-bit scales against an f16 super-scale d (the
 * sub-scale of largest magnitude maps to -128), w = d * sc * (q - 32). */
static void quantize_q6_K(const float *x, struct block_q6_K *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float s[QK_K / 16], w[16], max_s = 0.0f, amax_s = 0.0f;
        uint8_t q[QK_K];
        for (int j = 0; j < QK_K / 16; j++) {
            /* weight large values a little more: they carry more of a dot product */
            float sum2 = 0.0f;
            for (int l = 0; l < 16; l++)
                sum2 += x[16 * j + l] * x[16 * j + l];
            for (int l = 0; l < 16; l++)
                w[l] = sum2 / 16.0f + x[16 * j + l] * x[16 * j + l];
            s[j] = fit_scale_sym(16, x + 16 * j, w);
            if (fabsf(s[j]) > amax_s) {
                amax_s = fabsf(s[j]);
                max_s = s[j];
            }
        }
        b[i].d = ar_f32_to_f16(max_s / -128.0f);
        float d = ar_f16_to_f32(b[i].d);
        for (int j = 0; j < QK_K / 16; j++) {
            int sc = d != 0.0f ? round_clamp(s[j] / d, -128, 127) : 0;
            float ds = d * (float)sc;
            b[i].scales[j] = (int8_t)sc;
            for (int l = 0; l < 16; l++) {
                int v = ds != 0.0f ? round_clamp(x[16 * j + l] / ds, -32, 31) : 0;
                q[16 * j + l] = (uint8_t)(v + 32);
            }
        }
        /* layout: see q6_K_quant in ref.c */
        for (int h = 0; h < 2; h++) {
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                b[i].ql[64 * h + l] = (uint8_t)((qq[l] & 0x0f) | ((qq[l + 64] & 0x0f) << 4));
                b[i].ql[64 * h + 32 + l] =
                    (uint8_t)((qq[l + 32] & 0x0f) | ((qq[l + 96] & 0x0f) << 4));
                b[i].qh[32 * h + l] =
                    (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                              ((qq[l + 96] >> 4) << 6));
            }
        }
    }
}

/* ---- entry point ---------------------------------------------------------------------------- */

size_t kernels_quantize_row(enum ar_type t, const float *src, void *dst, int64_t n)
{
    size_t size = ar_type_row_size(t, n);
    int64_t nb;
    if (n <= 0 || size == 0)
        return 0;
    nb = n / ar_type_info(t)->block_size;
    switch (t) {
    case AR_TYPE_F32:
    case AR_TYPE_F16:
    case AR_TYPE_BF16:
    case AR_TYPE_Q8_0: /* the activation quantizer is already the best per-block rounding */
        kernels_ref()->from_float[t](src, dst, n);
        break;
    case AR_TYPE_Q4_0:
        quantize_q4_0(src, dst, nb);
        break;
    case AR_TYPE_Q4_1:
        quantize_q4_1(src, dst, nb);
        break;
    case AR_TYPE_Q5_0:
        quantize_q5_0(src, dst, nb);
        break;
    case AR_TYPE_Q5_1:
        quantize_q5_1(src, dst, nb);
        break;
    case AR_TYPE_Q4_K:
        quantize_q4_K(src, dst, nb);
        break;
    case AR_TYPE_Q5_K:
        quantize_q5_K(src, dst, nb);
        break;
    case AR_TYPE_Q6_K:
        quantize_q6_K(src, dst, nb);
        break;
    default:
        return 0;
    }
    return size;
}
