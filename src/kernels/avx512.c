/* avx512.c - 512-bit kernels for the quantized dot products and gemm (Q8_0, Q4_0, Q4_K, Q5_K,
 * Q6_K), chosen at run time by select.c; every other entry comes from the avx2 table.
 * avx512_vnni.c compiles this same file with -mavx512vnni: where __AVX512VNNI__ is defined the
 * integer dot products use vpdpbusd / vpdpwssd instead of vpmaddubsw + vpmaddwd. */
#include <immintrin.h>

#include "kernels_internal.h"

#define AR_INLINE static inline __attribute__((always_inline))

/* ---- helpers ------------------------------------------------------------------------------ */

AR_INLINE float f16_to_f32(ar_f16 h)
{
    return _cvtsh_ss(h);
}

AR_INLINE const __m256i *cv256(const void *p)
{
    return (const __m256i *)p;
}

AR_INLINE const __m128i *cv128(const void *p)
{
    return (const __m128i *)p;
}

/* acc + per int32 lane the sum of 4 products of 16-bit pairs (p16 from maddubs) and scales */
AR_INLINE __m512i add_madd16(__m512i acc, __m512i p16, __m512i sc16)
{
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(acc, p16, sc16);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p16, sc16));
#endif
}

/* Two 256-bit halves into one vector. */
AR_INLINE __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* 16 floats: a in lanes 0..7, b in lanes 8..15 */
AR_INLINE __m512 join_ps(float a, float b)
{
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

/* ---- register tiles ------------------------------------------------------------------------
 * As in avx2.c: BLOCK(wb, xb, &acc, k) adds k blocks (STEP at a time, then a final single
 * block when the count is odd) of one weight row against one activation row. */

#define TILE_RW 4
#define TILE_RX 4

#define DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, RW, RX)                                             \
    static void NAME##_tile_##RW##x##RX(int nb, const uint8_t *w, size_t w_row, const uint8_t *x,  \
                                        size_t x_row, float *y, size_t ldy)                        \
    {                                                                                              \
        __m512 acc[RW][RX];                                                                        \
        int b = 0;                                                                                 \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                      \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] = _mm512_setzero_ps();  \
        for (; b + (STEP) <= nb; b += (STEP)) {                                                    \
            _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                  \
            {                                                                                      \
                const WT *wb = (const WT *)(const void *)(w + (size_t)i * w_row) + b;              \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) BLOCK(                        \
                    wb, (const XT *)(const void *)(x + (size_t)j * x_row) + b, &acc[i][j], STEP);  \
            }                                                                                      \
        }                                                                                          \
        if (b < nb) {                                                                              \
            _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                  \
            {                                                                                      \
                const WT *wb = (const WT *)(const void *)(w + (size_t)i * w_row) + b;              \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) BLOCK(                        \
                    wb, (const XT *)(const void *)(x + (size_t)j * x_row) + b, &acc[i][j], 1);     \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                      \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++)                                  \
                y[(size_t)j * ldy + (size_t)i] = _mm512_reduce_add_ps(acc[i][j]);                  \
    }

AR_INLINE void prefetch_bytes(const uint8_t *p, size_t size)
{
    for (size_t k = 0; k < size; k += 64)
        _mm_prefetch((const char *)p + k, _MM_HINT_T0);
}

/* With one activation row, a weight row at a time (a GEMV at memory bandwidth); otherwise
 * whole tiles with the next tile's weights prefetched in order, then the edges. */
#define DEFINE_GEMM(NAME, WT, XT, BLOCK, STEP, QK)                                                 \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 4, 4)                                                   \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 4, 1)                                                   \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 1, 4)                                                   \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 1, 1)                                                   \
    static void NAME##_gemm(int n, int nr, int nc, const void *w, size_t w_row, const void *x,     \
                            size_t x_row, float *y, size_t ldy)                                    \
    {                                                                                              \
        const uint8_t *wp = w, *xp = x;                                                            \
        int nb = n / (QK), i = 0;                                                                  \
        if (nc == 1) {                                                                             \
            for (; i < nr; i++)                                                                    \
                NAME##_tile_1x1(nb, wp + (size_t)i * w_row, w_row, xp, x_row, y + i, ldy);         \
            return;                                                                                \
        }                                                                                          \
        for (; i + TILE_RW <= nr; i += TILE_RW) {                                                  \
            const uint8_t *wi = wp + (size_t)i * w_row;                                            \
            int j = 0;                                                                             \
            if (i + 2 * TILE_RW <= nr)                                                             \
                prefetch_bytes(wi + TILE_RW * w_row, TILE_RW * w_row);                             \
            for (; j + TILE_RX <= nc; j += TILE_RX)                                                \
                NAME##_tile_4x4(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy);                                     \
            for (; j < nc; j++)                                                                    \
                NAME##_tile_4x1(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy);                                     \
        }                                                                                          \
        for (; i < nr; i++) {                                                                      \
            const uint8_t *wi = wp + (size_t)i * w_row;                                            \
            int j = 0;                                                                             \
            for (; j + TILE_RX <= nc; j += TILE_RX)                                                \
                NAME##_tile_1x4(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy);                                     \
            for (; j < nc; j++)                                                                    \
                NAME##_tile_1x1(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy);                                     \
        }                                                                                          \
    }                                                                                              \
    static void NAME##_vec_dot(int n, float *s, const void *x, const void *y)                      \
    {                                                                                              \
        NAME##_tile_1x1(n / (QK), x, 0, y, 0, s, 0);                                               \
    }

/* ---- Q8_0 and Q4_0 weights against Q8_0 activations, two blocks per vector --------------- */

/* The qs of k (1 or 2) consecutive Q8_0 blocks; the upper half is zero when k is 1. */
AR_INLINE __m512i q8_0_load(const struct block_q8_0 *b, int k)
{
    if (k == 2)
        return join256(_mm256_loadu_si256(cv256(b[0].qs)), _mm256_loadu_si256(cv256(b[1].qs)));
    return _mm512_zextsi256_si512(_mm256_loadu_si256(cv256(b[0].qs)));
}

/* d of each block times d of the activation block, per half */
AR_INLINE __m512 pair_scales(ar_f16 w0, ar_f16 w1, ar_f16 x0, ar_f16 x1, int k)
{
    if (k == 2)
        return _mm512_mul_ps(join_ps(f16_to_f32(w0), f16_to_f32(w1)),
                             join_ps(f16_to_f32(x0), f16_to_f32(x1)));
    return _mm512_set1_ps(f16_to_f32(w0) * f16_to_f32(x0));
}

#ifdef __AVX512VNNI__
/* u8 weights (signed value + off) against s8 activations: vpdpbusd started from
 * -off * (sum of each 4 activations), so the offset cancels exactly. */
AR_INLINE __m512i dot_offset(__m512i wu, uint8_t off, __m512i xv)
{
    __m512i corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)off), xv);
    return _mm512_dpbusd_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), corr), wu, xv);
}
#else
/* Signed dot product per int32 lane: |w| * (x negated where w < 0). */
AR_INLINE __m512i dot_s8s8(__m512i wv, __m512i xv)
{
    __mmask64 neg = _mm512_movepi8_mask(wv);
    __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(wv), sx), _mm512_set1_epi16(1));
}
#endif

AR_INLINE void q8_0_block(const struct block_q8_0 *w, const struct block_q8_0 *x, __m512 *acc,
                          int k)
{
    __m512i wv = q8_0_load(w, k), xv = q8_0_load(x, k);
#ifdef __AVX512VNNI__
    __m512i p = dot_offset(_mm512_xor_si512(wv, _mm512_set1_epi8((char)0x80)), 0x80, xv);
#else
    __m512i p = dot_s8s8(wv, xv);
#endif
    __m512 d = pair_scales(w[0].d, k == 2 ? w[1].d : 0, x[0].d, k == 2 ? x[1].d : 0, k);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, *acc);
}
DEFINE_GEMM(q8_0, struct block_q8_0, struct block_q8_0, q8_0_block, 2, QK8_0)

/* q (0..15) of k Q4_0 blocks: per block, its low nibbles (elements 0..15) then its high
 * nibbles (16..31), each in one 128-bit lane. */
AR_INLINE __m512i q4_0_load(const struct block_q4_0 *b, int k)
{
    __m128i r0 = _mm_loadu_si128(cv128(b[0].qs));
    __m128i r1 = k == 2 ? _mm_loadu_si128(cv128(b[1].qs)) : _mm_setzero_si128();
    __m512i v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                         _mm512_zextsi256_si512(_mm256_set_m128i(r1, r0)));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    return _mm512_mask_blend_epi64(0xcc, _mm512_and_si512(v, m4),
                                   _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
}

AR_INLINE void q4_0_block(const struct block_q4_0 *w, const struct block_q8_0 *x, __m512 *acc,
                          int k)
{
    __m512i q = q4_0_load(w, k), xv = q8_0_load(x, k);
#ifdef __AVX512VNNI__
    __m512i p = dot_offset(q, 8, xv);
#else
    __m512i p = dot_s8s8(_mm512_sub_epi8(q, _mm512_set1_epi8(8)), xv);
#endif
    __m512 d = pair_scales(w[0].d, k == 2 ? w[1].d : 0, x[0].d, k == 2 ? x[1].d : 0, k);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, *acc);
}
DEFINE_GEMM(q4_0, struct block_q4_0, struct block_q8_0, q4_0_block, 2, QK4_0)

/* ---- K-quants against Q8_K activations, one super-block per step ----------------------------- */

/* The 8 six-bit scales and mins of a Q4_K/Q5_K block (layout in ref.c's k_scale_min). */
AR_INLINE void k_scales_mins(const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0x0f) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* int16 index vector: lanes 0..15 pick a, lanes 16..31 pick b */
AR_INLINE __m512i idx2(int a, int b)
{
    return join256(_mm256_set1_epi16((short)a), _mm256_set1_epi16((short)b));
}

AR_INLINE void qk45_block(ar_f16 dh, ar_f16 dminh, const uint8_t *scales, const uint8_t *qs,
                          const uint8_t *qh, const struct block_q8_K *x, __m512 *acc)
{
    uint8_t sc[8], m[8];
    k_scales_mins(scales, sc, m);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(cv128(sc))));
    __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(cv128(m)));
    __m256i mv = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i hb = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256(cv256(qh))) : _mm512_setzero_si512();
    __m512i isum = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        /* 64 elements: sub-block 2c (low nibbles) in the lower half, 2c + 1 in the upper */
        __m256i raw = _mm256_loadu_si256(cv256(qs + 32 * c));
        __m512i q = _mm512_and_si512(join256(raw, _mm256_srli_epi16(raw, 4)), m4);
        if (qh) {
            __m512i bit = join256(_mm256_set1_epi8((char)(1 << (2 * c))),
                                  _mm256_set1_epi8((char)(2 << (2 * c))));
            __mmask64 k5 = _mm512_test_epi8_mask(hb, bit);
            q = _mm512_mask_add_epi8(q, k5, q, _mm512_set1_epi8(16));
        }
        __m512i y = _mm512_loadu_si512((const void *)(x->qs + 64 * c));
        __m512i scv = _mm512_permutexvar_epi16(idx2(2 * c, 2 * c + 1), sc16);
        isum = add_madd16(isum, _mm512_maddubs_epi16(q, y), scv);
    }
    __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256(cv256(x->bsums)), mv);
    float d = f16_to_f32(dh) * x->d;
    float dmin = f16_to_f32(dminh) * x->d;
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d), *acc);
    *acc = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(msum)), _mm512_set1_ps(dmin),
                            *acc);
}

AR_INLINE void q4_K_block(const struct block_q4_K *w, const struct block_q8_K *x, __m512 *acc,
                          int k)
{
    (void)k;
    qk45_block(w->d, w->dmin, w->scales, w->qs, NULL, x, acc);
}
DEFINE_GEMM(q4_K, struct block_q4_K, struct block_q8_K, q4_K_block, 1, QK_K)

AR_INLINE void q5_K_block(const struct block_q5_K *w, const struct block_q8_K *x, __m512 *acc,
                          int k)
{
    (void)k;
    qk45_block(w->d, w->dmin, w->scales, w->qs, w->qh, x, acc);
}
DEFINE_GEMM(q5_K, struct block_q5_K, struct block_q8_K, q5_K_block, 1, QK_K)

/* Q6_K: sum(sc * (q - 32) * y) = sum(sc * q * y) - 32 * sum(sc * bsum), all in int32. */
AR_INLINE void q6_K_block(const struct block_q6_K *w, const struct block_q8_K *x, __m512 *acc,
                          int k)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(cv128(w->scales)));
    __m512i sc512 = _mm512_zextsi256_si512(sc16);
    /* per int16 lane: which scale (of the half) covers it, 8 lanes = 16 elements each */
    const __m512i sub = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                         12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        3);
    const __m512i shl = join256(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    const __m512i shr = join256(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    __m512i isum = _mm512_setzero_si512();
    (void)k;
    for (int h = 0; h < 2; h++) {
        /* ql[64h ..]: bytes 0..31 give elements 0..31 and 64..95, bytes 32..63 elements 32..63
         * and 96..127 of the half; qh bit pairs 0-1, 2-3, 4-5, 6-7 are the top bits of those */
        __m512i ql = _mm512_loadu_si512((const void *)(w->ql + 64 * h));
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(cv256(w->qh + 32 * h)));
        __m512i qa = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                     _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
        __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                     _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
        __m512i ya = _mm512_loadu_si512((const void *)(x->qs + 128 * h));
        __m512i yb = _mm512_loadu_si512((const void *)(x->qs + 128 * h + 64));
        __m512i sa = _mm512_permutexvar_epi16(_mm512_add_epi16(sub, _mm512_set1_epi16((short)(8 * h))), sc512);
        __m512i sb = _mm512_permutexvar_epi16(_mm512_add_epi16(sub, _mm512_set1_epi16((short)(8 * h + 4))), sc512);
        isum = add_madd16(isum, _mm512_maddubs_epi16(qa, ya), sa);
        isum = add_madd16(isum, _mm512_maddubs_epi16(qb, yb), sb);
    }
    __m256i off = _mm256_madd_epi16(_mm256_loadu_si256(cv256(x->bsums)), sc16);
    isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
    float d = f16_to_f32(w->d) * x->d;
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d), *acc);
}
DEFINE_GEMM(q6_K, struct block_q6_K, struct block_q8_K, q6_K_block, 1, QK_K)

/* ---- the table ------------------------------------------------------------------------------ */

void kernels_fill_avx512(struct kernel_ops *ops)
{
    ops->vec_dot[AR_TYPE_Q8_0] = q8_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_0] = q4_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_K] = q4_K_vec_dot;
    ops->vec_dot[AR_TYPE_Q5_K] = q5_K_vec_dot;
    ops->vec_dot[AR_TYPE_Q6_K] = q6_K_vec_dot;

    ops->gemm[AR_TYPE_Q8_0] = q8_0_gemm;
    ops->gemm[AR_TYPE_Q4_0] = q4_0_gemm;
    ops->gemm[AR_TYPE_Q4_K] = q4_K_gemm;
    ops->gemm[AR_TYPE_Q5_K] = q5_K_gemm;
    ops->gemm[AR_TYPE_Q6_K] = q6_K_gemm;
}
