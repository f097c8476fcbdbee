/* avx512.c - 512-bit kernels for the quantized dot products and gemm (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K, Q6_K), chosen at run time by select.c; every other entry comes from the
 * avx2 table.
 * avx512_vnni.c compiles this same file with -mavx512vnni: where __AVX512VNNI__ is defined the
 * integer dot products use vpdpbusd / vpdpwssd instead of vpmaddubsw + vpmaddwd. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"

#include "kernels_internal.h"
#include "simd256.h"

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
 * whole tiles with the next tile's weights prefetched in order, then the edges. The tiles
 * (NAME_tile_4x4, _4x1, _1x4, _1x1) come from DEFINE_TILE or DEFINE_CTILE. */
#define DEFINE_GEMM_LOOP(NAME, QK)                                                                 \
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

#define DEFINE_GEMM(NAME, WT, XT, BLOCK, STEP, QK)                                                 \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 4, 4)                                                   \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 4, 1)                                                   \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 1, 4)                                                   \
    DEFINE_TILE(NAME, WT, XT, BLOCK, STEP, 1, 1)                                                   \
    DEFINE_GEMM_LOOP(NAME, QK)

#ifdef __AVX512VNNI__
/* ---- the canonical order of the VNNI variant ---------------------------------------------------
 * Every path of this variant (lane-packed gemm, register tiles, vec_dot) computes an output the
 * same way, so that its bits depend only on its weight row and activation row, never on how
 * many rows share a call or where they fall in it: per block (Q8_0, Q4_0, Q5_0: 32 elements;
 * K-quants: one super-block of 256) the exact int32 sum of the integer products is converted
 * to float once and added by one fma into a single float accumulator, blocks in order:
 *   acc = fma((float)isum_b, d_w * d_x, acc)
 * and for Q4_K/Q5_K then the mins: acc = fma(-(float)msum_b, dmin_w * d_x, acc).
 * The lane-packed kernels hold 16 such accumulators (16 weight rows) in one vector; the tiles
 * below hold one per output and reduce each block's integer partial sums exactly first.
 * (Q4_1 and Q5_1 have only the register tiles, which agree with themselves at any shape.) */

/* Tile of scalar accumulators: CBLOCK(wb, xb, acc) returns acc after one block's step. */
#define DEFINE_CTILE(NAME, WT, XT, CBLOCK, RW, RX)                                                 \
    static void NAME##_tile_##RW##x##RX(int nb, const uint8_t *w, size_t w_row, const uint8_t *x,  \
                                        size_t x_row, float *y, size_t ldy)                        \
    {                                                                                              \
        __m128 acc[RW][RX];                                                                        \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                      \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] = _mm_setzero_ps();     \
        for (int b = 0; b < nb; b++) {                                                             \
            _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                  \
            {                                                                                      \
                const WT *wb = (const WT *)(const void *)(w + (size_t)i * w_row) + b;              \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] =                   \
                    CBLOCK(wb, (const XT *)(const void *)(x + (size_t)j * x_row) + b, acc[i][j]);  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                      \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++)                                  \
                y[(size_t)j * ldy + (size_t)i] = _mm_cvtss_f32(acc[i][j]);                         \
    }

#define DEFINE_CGEMM(NAME, WT, XT, CBLOCK, QK)                                                     \
    DEFINE_CTILE(NAME, WT, XT, CBLOCK, 4, 4)                                                       \
    DEFINE_CTILE(NAME, WT, XT, CBLOCK, 4, 1)                                                       \
    DEFINE_CTILE(NAME, WT, XT, CBLOCK, 1, 4)                                                       \
    DEFINE_CTILE(NAME, WT, XT, CBLOCK, 1, 1)                                                       \
    DEFINE_GEMM_LOOP(NAME, QK)

/* vec_dot alone (the gemm of these types is lane-packed at every shape) */
#define DEFINE_CDOT(NAME, WT, XT, CBLOCK, QK)                                                      \
    DEFINE_CTILE(NAME, WT, XT, CBLOCK, 1, 1)                                                       \
    static void NAME##_vec_dot(int n, float *s, const void *x, const void *y)                      \
    {                                                                                              \
        NAME##_tile_1x1(n / (QK), x, 0, y, 0, s, 0);                                               \
    }

/* acc + (float)(exact sum of the int32 lanes of p) * d, rounded once */
AR_INLINE __m128 chain_step(__m512i p, float d, __m128 acc)
{
    int32_t s = _mm512_reduce_add_epi32(p);
    return _mm_fmadd_ss(_mm_set_ss((float)s), _mm_set_ss(d), acc);
}
#endif

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
#ifdef __AVX512VNNI__
AR_INLINE __m128 q8_0_cblock(const struct block_q8_0 *w, const struct block_q8_0 *x, __m128 acc)
{
    __m512i p = dot_offset(_mm512_xor_si512(q8_0_load(w, 1), _mm512_set1_epi8((char)0x80)), 0x80,
                           q8_0_load(x, 1));
    return chain_step(p, f16_to_f32(w->d) * f16_to_f32(x->d), acc);
}
DEFINE_CDOT(q8_0, struct block_q8_0, struct block_q8_0, q8_0_cblock, QK8_0)
#else
DEFINE_GEMM(q8_0, struct block_q8_0, struct block_q8_0, q8_0_block, 2, QK8_0)
#endif

/* The nibbles (0..15) of k (1 or 2) blocks' qs: per block, its low nibbles (elements 0..15)
 * then its high nibbles (16..31), each in one 128-bit lane; the upper half is zero when k is 1. */
AR_INLINE __m512i nibbles_load(const uint8_t *qs0, const uint8_t *qs1, int k)
{
    /* each block's 16 bytes broadcast to its two 128-bit lanes, the second lane shifted */
    __m128i r0 = _mm_loadu_si128(cv128(qs0));
    __m512i v = k == 2 ? _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(r0), 0xff00,
                                                     _mm_loadu_si128(cv128(qs1)))
                       : _mm512_maskz_broadcast_i32x4(0x00ff, r0);
    const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004ll, 0x0004000400040004ll, 0, 0,
                                            0x0004000400040004ll, 0x0004000400040004ll);
    return _mm512_and_si512(_mm512_srlv_epi16(v, shift), _mm512_set1_epi8(0x0f));
}

/* q (0..31) of k Q5_0/Q5_1 blocks in the order of nibbles_load, which is element order within
 * each block: the fifth bits (bit e of qh, a little-endian uint32) form a byte mask directly. */
AR_INLINE __m512i q5_load(const uint8_t *qs0, const uint8_t *qh0, const uint8_t *qs1,
                          const uint8_t *qh1, int k)
{
    uint32_t h0, h1 = 0;
    memcpy(&h0, qh0, sizeof(h0));
    if (k == 2)
        memcpy(&h1, qh1, sizeof(h1));
    __m512i q = nibbles_load(qs0, qs1, k);
    __mmask64 hi = (__mmask64)((uint64_t)h0 | (uint64_t)h1 << 32);
    return _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(16));
}

#ifdef __AVX512VNNI__
/* ---- Q8_0 gemm over many activation rows: 16 weight rows in the lanes of one vector --------
 * Each block of 16 weight rows is transposed into 8 vectors whose lane r holds bytes 4t..4t+3
 * of row r (made unsigned: q + 128). One vpdpbusd against 4 bytes of an activation row
 * broadcast to every lane then advances all 16 row sums, and the block's sums need a single
 * conversion and fma (scale d_w per lane times d_x), with no horizontal sums. The + 128 is
 * taken out exactly by starting each block's int32 sum at -128 * (sum of the activation block).
 * Work order: LN_JC activation rows at a time; within them k chunks of LN_KB blocks (activation
 * scales and sums precomputed per chunk); within a chunk, 16 weight rows at a time, transposed
 * once and used against every activation row. Partial sums live in y between chunks. Each
 * output is the same sequence of operations wherever its row and column fall, so any split
 * of rows or columns gives bit-identical results. */

#define LN_KB 8
#define LN_JC 64
/* activation rows per ln_q8_0_rows2 call: 2 x 4 chains. On Zen 5 (2026-12-06, one thread,
 * best of 30-40 alternated runs) 4 rows gave 2-4 % more than 6 for Q8_0 tiles of 3072 x 1024,
 * 4864 x 896, 896 x 4864 and 1152 x 896 against 512 rows, and 3 % for Q4_0; 5 rows no more
 * than 6. */
#ifndef LN_J2
#define LN_J2 4
#endif
#ifndef LN_PF_AHEAD
#define LN_PF_AHEAD 1
#endif

/* v[t] lane r = bytes 4t..4t+3 of the 32 unsigned quants of row r, from z[k] holding row k's
 * 32 bytes in its lower half and row k + 8's in its upper half (an 8 x 8 dword transpose in
 * each 256-bit half). */
AR_INLINE void ln_transpose(__m512i z[8], __m512i v[8])
{
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    __m512i t[8], u[8];
    _Pragma("GCC unroll 8") for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
    /* u[s] (s < 4): rows 0..3 of each 128-bit lane hold dword s of that lane's half;
     * u[4 + s]: rows 4..7 */
    _Pragma("GCC unroll 8") for (int g = 0; g < 2; g++) {
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    _Pragma("GCC unroll 8") for (int s = 0; s < 4; s++) {
        v[s] = _mm512_permutex2var_epi64(u[s], lo, u[4 + s]);
        v[4 + s] = _mm512_permutex2var_epi64(u[s], hi, u[4 + s]);
    }
}

/* Prefetches bytes [off, off + len) of 16 weight rows w_row apart, starting at row i of w
 * (rows past nr are skipped). The lane kernels read 16 rows in turns, a few hundred bytes
 * each: more streams than the hardware prefetchers follow, so with few activation rows (too
 * little work to hide a miss per row) they would wait on memory at every step. */
AR_INLINE void ln_prefetch(const uint8_t *w, size_t w_row, int i, int nr, size_t off, size_t len)
{
    int e = AR_MIN(i + 16, nr);
    for (; i < e; i++) {
        const uint8_t *p = w + (size_t)i * w_row + off;
        uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + len;
        for (; a < end; a += 64)
            _mm_prefetch((const char *)a, _MM_HINT_T0);
    }
}

/* Weight kinds of the lane-packed gemm: the unsigned quants of one block of 32 and the
 * offset taken out of them (q8_0: q + 128; q5_0: 0..31, - 16; q4_0: 0..15, - 8). */
enum { LN_Q8_0, LN_Q5_0, LN_Q4_0 };

/* z[k] (see ln_transpose) for block offset `off` (bytes) of rows[k] and rows[k + 8] */
AR_INLINE void ln_rows_z(const int kind, const uint8_t *const rows[16], size_t off, __m512i z[8])
{
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        const uint8_t *a = rows[k] + off, *b = rows[k + 8] + off;
        if (kind == LN_Q8_0) {
            z[k] = _mm512_xor_si512(join256(_mm256_loadu_si256(cv256(a + 2)),
                                            _mm256_loadu_si256(cv256(b + 2))),
                                    _mm512_set1_epi8((char)0x80));
        } else if (kind == LN_Q5_0) {
            z[k] = q5_load(a + offsetof(struct block_q5_0, qs), a + offsetof(struct block_q5_0, qh),
                           b + offsetof(struct block_q5_0, qs), b + offsetof(struct block_q5_0, qh), 2);
        } else {
            z[k] = nibbles_load(a + offsetof(struct block_q4_0, qs), b + offsetof(struct block_q4_0, qs), 2);
        }
    }
}

/* Share k of LN_KB of the cache lines of [p, p + len), prefetched into L1 (nothing where p is
 * NULL). The few-rows packed gemm asks for the next stretch of its weight stream this way, a
 * share per block computed: with few rows a chunk is little work, and a burst of a hundred
 * prefetches before it fills the L1 miss buffers and stalls the loads behind it (Zen 4,
 * 2026-12-03, two groups' chunks asked for at once: 45 % of the samples on the prefetches). */
AR_INLINE void pf_share(const uint8_t *p, size_t len, int k)
{
    if (!p)
        return;
    for (size_t a = (len + 63) / 64 * (size_t)k / LN_KB,
                e = (len + 63) / 64 * (size_t)(k + 1) / LN_KB;
         a < e; a++)
        _mm_prefetch((const char *)p + 64 * a, _MM_HINT_T0);
}

/* J activation rows against the transposed chunk: y[j * ldy + lane] (masked to m) += the kb
 * blocks' contributions, or = them when first. xd/xc: the rows' block scales and offset
 * corrections, row j's block b at j * xs + b. pf: pf_len bytes to prefetch meanwhile, a share
 * per block (or NULL). */
AR_INLINE void ln_q8_0_rows(const int J, int kb, const uint8_t *wq, const size_t wbs,
                            const __m512 *wd, const uint8_t *x, size_t x_row, const float *xd,
                            const int32_t *xc, int xs, float *y, size_t ldy, __mmask16 m,
                            bool first, const uint8_t *pf, size_t pf_len)
{
    __m512 acc[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++) acc[j] =
        first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y + (size_t)j * ldy);
    for (int b = 0; b < kb; b++) {
        __m512i w[8];
        pf_share(pf, pf_len, b);
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) w[t] =
            _mm512_loadu_si512((const void *)(wq + wbs * (size_t)b + 64 * (size_t)t));
        _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
        {
            const int8_t *q = ((const struct block_q8_0 *)(const void *)(x + (size_t)j * x_row))[b].qs;
            __m512i p = _mm512_set1_epi32(xc[j * xs + b]);
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) p =
                _mm512_dpbusd_epi32(p, w[t], _mm512_set1_epi32(load_i32(q + 4 * t)));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                     _mm512_mul_ps(wd[b], _mm512_set1_ps(xd[j * xs + b])), acc[j]);
        }
    }
    for (int b = kb; b < LN_KB; b++) /* a short last chunk: the rest of the lines */
        pf_share(pf, pf_len, b);
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
        _mm512_mask_storeu_ps(y + (size_t)j * ldy, m, acc[j]);
}

/* ln_q8_0_rows over jn activation rows: groups of 8, then 4, then single rows; the first
 * call prefetches pf */
AR_INLINE void ln_rows_all(int kb, int jn, const uint8_t *wq, const size_t wbs, const __m512 *wd,
                           const uint8_t *x, size_t x_row, const float *xd, const int32_t *xc,
                           int xs, float *y, size_t ldy, __mmask16 m, bool first, const uint8_t *pf,
                           size_t pf_len)
{
    int j = 0;
    for (; j + 8 <= jn; j += 8, pf = NULL)
        ln_q8_0_rows(8, kb, wq, wbs, wd, x + (size_t)j * x_row, x_row, xd + j * xs, xc + j * xs, xs,
                     y + (size_t)j * ldy, ldy, m, first, pf, pf_len);
    for (; j + 4 <= jn; j += 4, pf = NULL)
        ln_q8_0_rows(4, kb, wq, wbs, wd, x + (size_t)j * x_row, x_row, xd + j * xs, xc + j * xs, xs,
                     y + (size_t)j * ldy, ldy, m, first, pf, pf_len);
    for (; j < jn; j++, pf = NULL)
        ln_q8_0_rows(1, kb, wq, wbs, wd, x + (size_t)j * x_row, x_row, xd + j * xs, xc + j * xs, xs,
                     y + (size_t)j * ldy, ldy, m, first, pf, pf_len);
}

/* ln_q8_0_rows for two groups of 16 weight rows at once (wq[0], wq[1]; y[0], y[1] with their
 * masks): each activation broadcast serves both, so a vpdpbusd takes half a broadcast load
 * instead of one, and J rows give 2J independent chains. Every output's operations are those
 * of ln_q8_0_rows, in its order. */
AR_INLINE void ln_q8_0_rows2(const int J, int kb, const uint8_t *const wq[2], const size_t wbs,
                             const __m512 *const wd[2], const uint8_t *x, size_t x_row,
                             const float *xd, const int32_t *xc, int xs, float *const y[2],
                             size_t ldy, const __mmask16 m[2], bool first,
                             const uint8_t *const pf[2], size_t pf_len)
{
    __m512 acc[2][6];
    _Pragma("GCC unroll 6") for (int j = 0; j < J; j++)
        _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++) acc[g][j] =
            first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m[g], y[g] + (size_t)j * ldy);
    for (int b = 0; b < kb; b++) {
        __m512i p[2][6];
        if (pf) {
            pf_share(pf[0], pf_len, b);
            pf_share(pf[1], pf_len, b);
        }
        _Pragma("GCC unroll 6") for (int j = 0; j < J; j++) p[0][j] = p[1][j] =
            _mm512_set1_epi32(xc[j * xs + b]);
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
        {
            __m512i w0 =
                _mm512_loadu_si512((const void *)(wq[0] + wbs * (size_t)b + 64 * (size_t)t));
            __m512i w1 =
                _mm512_loadu_si512((const void *)(wq[1] + wbs * (size_t)b + 64 * (size_t)t));
            _Pragma("GCC unroll 6") for (int j = 0; j < J; j++)
            {
                const int8_t *q =
                    ((const struct block_q8_0 *)(const void *)(x + (size_t)j * x_row))[b].qs;
                __m512i xb = _mm512_set1_epi32(load_i32(q + 4 * t));
                p[0][j] = _mm512_dpbusd_epi32(p[0][j], w0, xb);
                p[1][j] = _mm512_dpbusd_epi32(p[1][j], w1, xb);
            }
        }
        _Pragma("GCC unroll 6") for (int j = 0; j < J; j++)
        {
            __m512 s = _mm512_set1_ps(xd[j * xs + b]);
            _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++) acc[g][j] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[g][j]), _mm512_mul_ps(wd[g][b], s), acc[g][j]);
        }
    }
    for (int b = kb; pf && b < LN_KB; b++) {
        pf_share(pf[0], pf_len, b);
        pf_share(pf[1], pf_len, b);
    }
    _Pragma("GCC unroll 6") for (int j = 0; j < J; j++)
        _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++)
            _mm512_mask_storeu_ps(y[g] + (size_t)j * ldy, m[g], acc[g][j]);
}

/* Beyond this many activation rows the packed gemm asks for the next chunk of weights (the
 * next pair's) a share per tile of rows, each tile's lines at its start, rather than all at
 * once before the first tile. A mixture's expert in a prefill gets about 32 rows (512 x 8 of
 * 128) and reads its weights from memory once per step: the chunk's 136 lines asked for at
 * once filled the L1 miss buffers, stalled that tile and left the memory idle for the others.
 * Zen 5 (2026-12-06, one thread), a qwen3moe layer's 768 x 2048 Q8_0 gate/up products
 * replayed with uniform row counts per expert, GOPS before -> after: 17 rows 395 -> 434, 24
 * 464 -> 508, 32 495 -> 555, 40 523 -> 570, 64 515 -> 565 (best of 10); a dense 4864 x 896
 * tile against 512 rows (its weights in L2) within the noise, 577-622 -> 613-637 (best of 20).
 * From session 16 (c88215d) to this change, 17-48 rows had taken the few-rows order (pk_few,
 * the weights in address order), faster than the burst; it is slower than the spread chunk
 * order at every count measured (32: 495 against 555). Spreading across the blocks of every
 * tile instead (one prefetch among the products) was slower on Zen 5 (session 16) and made
 * Q4_0 prefill 9 % slower on Zen 4 (2026-12-03); the chunk after next, into L1 or L2, was
 * slower too. Not yet measured on Zen 4 or Intel. */
#define LN_PF_TILE_ROWS 16

/* Lines [nl * t / nt, nl * (t + 1) / nt) of each of the two streams pf (nl: pf_len's lines) */
AR_INLINE void pf_tile(const uint8_t *const pf[2], size_t pf_len, int t, int nt)
{
    size_t nl = (pf_len + 63) / 64, a0 = nl * (size_t)t / (size_t)nt;
    size_t a1 = nl * (size_t)(t + 1) / (size_t)nt;
    for (int g = 0; g < 2; g++) {
        for (size_t a = a0; pf[g] && a < a1; a++)
            _mm_prefetch((const char *)pf[g] + 64 * a, _MM_HINT_T0);
    }
}

/* ln_q8_0_rows2 over jn activation rows, LN_J2 at a time, 2 or 3 left in one more pair, a
 * single last row one group at a time. The first call prefetches pf[0] and pf[1] (pf_len
 * bytes each; beyond LN_PF_TILE_ROWS rows every tile its share instead: pf_tile); with
 * pf_y each call first asks for the partial sums of its rows that the next pair will add
 * to. Where y does not fit in L2 (the
 * 4864 x 896 up projections against 64 rows: 1.2 MiB) their reloads missed it: on Zen 4
 * (2026-12-03) gemm_peak's 4864 x 896 x 512 tile went from 0.47-0.66 of the int8 peak to
 * 0.59-0.72 (Q4_0 0.44-0.63 to 0.61-0.64), prefill_cpu on qwen05 3-4 % faster. */
AR_INLINE void ln_rows_all2(int kb, int jn, const uint8_t *const wq[2], const size_t wbs,
                            const __m512 *const wd[2], const uint8_t *x, size_t x_row,
                            const float *xd, const int32_t *xc, int xs, float *const y[2],
                            size_t ldy, const __mmask16 m[2], bool first,
                            const uint8_t *const pf[2], size_t pf_len, bool pf_y)
{
    const bool tiles = pf && jn > LN_PF_TILE_ROWS;
    int j = 0;
    for (; j + LN_J2 <= jn; j += LN_J2) {
        float *const yj[2] = {y[0] + (size_t)j * ldy, y[1] + (size_t)j * ldy};
        if (tiles)
            pf_tile(pf, pf_len, j / LN_J2, jn / LN_J2);
        /* the next pair's partial sums of these rows (32 floats on) */
        for (int k = 0; pf_y && k < LN_J2; k++) {
            _mm_prefetch((const char *)(yj[0] + (size_t)k * ldy + 32), _MM_HINT_T0);
            _mm_prefetch((const char *)(yj[0] + (size_t)k * ldy + 48), _MM_HINT_T0);
        }
        ln_q8_0_rows2(LN_J2, kb, wq, wbs, wd, x + (size_t)j * x_row, x_row, xd + j * xs,
                      xc + j * xs, xs, yj, ldy, m, first, j == 0 && !tiles ? pf : NULL, pf_len);
    }
    /* 2 or 3 rows left: still in pairs */
    if (jn - j >= 2) {
        float *const yj[2] = {y[0] + (size_t)j * ldy, y[1] + (size_t)j * ldy};
        const uint8_t *const *pj = j == 0 ? pf : NULL;
        if (jn - j >= 3)
            ln_q8_0_rows2(3, kb, wq, wbs, wd, x + (size_t)j * x_row, x_row, xd + j * xs,
                          xc + j * xs, xs, yj, ldy, m, first, pj, pf_len);
        else
            ln_q8_0_rows2(2, kb, wq, wbs, wd, x + (size_t)j * x_row, x_row, xd + j * xs,
                          xc + j * xs, xs, yj, ldy, m, first, pj, pf_len);
        j += AR_MIN(3, jn - j);
    }
    for (int g = 0; g < 2 && j < jn; g++)
        ln_rows_all(kb, jn - j, wq[g], wbs, wd[g], x + (size_t)j * x_row, x_row, xd + j * xs,
                    xc + j * xs, xs, y[g] + (size_t)j * ldy, ldy, m[g], first,
                    j == 0 ? pf[g] : NULL, pf_len);
}

/* Scale and offset correction -off * sum(q) of blocks [b0, b0 + kb) of jn activation rows
 * (x: their block b0), row j's block b0 + b at j * xs + b. */
AR_INLINE void ln_x_prep(int jn, int kb, const uint8_t *x, size_t x_row, int32_t off, float *xd,
                         int32_t *xc, int xs)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int j = 0; j < jn; j++) {
        const struct block_q8_0 *xb = (const struct block_q8_0 *)(const void *)(x + (size_t)j * x_row);
        int b = 0;
        /* eight blocks at once: q8_0_block_sum's byte sums (vpsadbw of the quants biased to
         * unsigned), blocks k and k + 4 in one register, the four partial sums of each block
         * then added across registers (one block at a time this took 9 % of a prefill's gemm
         * time on Zen 5) */
        for (; b + 8 <= kb; b += 8) {
            __m512i z[4], a[2];
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) z[k] = _mm512_sad_epu8(
                _mm512_xor_si512(join256(_mm256_loadu_si256(cv256(xb[b + k].qs)),
                                         _mm256_loadu_si256(cv256(xb[b + k + 4].qs))),
                                 flip),
                _mm512_setzero_si512());
            /* 128-bit lane l of a[h]: blocks 2h and 2h + 1 (l < 2) or 2h + 4 and 2h + 5,
             * halves of their sums (lanes 0-1, then 2-3) */
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) a[h] =
                _mm512_add_epi64(_mm512_unpacklo_epi64(z[2 * h], z[2 * h + 1]),
                                 _mm512_unpackhi_epi64(z[2 * h], z[2 * h + 1]));
            /* blocks 0 1 4 5 2 3 6 7 */
            __m512i t = _mm512_add_epi64(_mm512_shuffle_i64x2(a[0], a[1], 0x88),
                                         _mm512_shuffle_i64x2(a[0], a[1], 0xdd));
            __m256i sum = _mm256_sub_epi32(
                _mm256_permutevar8x32_epi32(_mm512_cvtepi64_epi32(t),
                                            _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)),
                _mm256_set1_epi32(32 * 128));
            _mm256_storeu_si256((__m256i *)(void *)(xc + j * xs + b),
                                _mm256_mullo_epi32(sum, _mm256_set1_epi32(-off)));
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) xd[j * xs + b + k] =
                f16_to_f32(xb[b + k].d);
        }
        for (; b < kb; b++) {
            xc[j * xs + b] = -off * q8_0_block_sum(&xb[b]);
            xd[j * xs + b] = f16_to_f32(xb[b].d);
        }
    }
}

/* Weight rows [i0, i0 + 16) (fewer at the end: the last repeats, its lanes masked off), blocks
 * [b0, b0 + kb), against jn activation rows (x: row 0; xd/xc of block b0 of row j at j * xs). */
AR_INLINE void ln_group(const int kind, int nr, int i0, int b0, int kb, int jn, const uint8_t *w,
                        size_t w_row, const uint8_t *x, size_t x_row, const float *xd,
                        const int32_t *xc, int xs, float *y, size_t ldy)
{
    const size_t bs = kind == LN_Q8_0   ? sizeof(struct block_q8_0)
                      : kind == LN_Q5_0 ? sizeof(struct block_q5_0)
                                        : sizeof(struct block_q4_0);
    const size_t xbs = sizeof(struct block_q8_0);
    __m512i wv[LN_KB * 8];
    __m512 wd[LN_KB];
    int rn = AR_MIN(16, nr - i0);
    __mmask16 m = (__mmask16)((1u << rn) - 1u);
    const uint8_t *rows[16];
    for (int r = 0; r < 16; r++)
        rows[r] = w + (size_t)(i0 + AR_MIN(r, rn - 1)) * w_row + (size_t)b0 * bs;
    for (int b = 0; b < kb; b++) {
        __m512i z[8];
        uint16_t dh[16];
        _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++)
            memcpy(&dh[r], rows[r] + (size_t)b * bs, sizeof(dh[r]));
        wd[b] = _mm512_cvtph_ps(_mm256_loadu_si256(cv256(dh)));
        ln_rows_z(kind, rows, (size_t)b * bs, z);
        ln_transpose(z, &wv[8 * b]);
    }
    ln_rows_all(kb, jn, (const uint8_t *)wv, 512, wd, x + (size_t)b0 * xbs, x_row, xd, xc, xs,
                y + (size_t)i0, ldy, m, b0 == 0, NULL, 0);
}

/* Few activation rows (at most LN_FEW, blocks at most LN_FEW_NB): each group of 16 weight rows
 * is taken whole, chunk after chunk, so the weights stream in address order (one contiguous
 * stretch per group, the next group prefetched meanwhile) and the activations (a few KiB)
 * stay in L1. More rows: chunk by chunk over all groups, so a chunk of every activation row
 * stays in L1 while the weight rows pass. Either order does the same operations per output. */
#define LN_FEW 16
#define LN_FEW_NB 512
#ifndef LN_FEW_HINT
#define LN_FEW_HINT _MM_HINT_T0
#endif
#ifndef LN_FEW_AHEAD
#define LN_FEW_AHEAD 1
#endif

/* Lane r of the result = the sum of the 8 int32 lanes of row r, where p[k] holds row k's
 * 8 lanes in its lower half and row k + 8's in its upper half (exact integer adds). */
AR_INLINE __m512i ln_rows_sum(const __m512i p[8])
{
    __m512i q[4], r[2];
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
        q[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * k], p[2 * k + 1]),
                                _mm512_unpackhi_epi32(p[2 * k], p[2 * k + 1]));
    /* per 128-bit lane of r[g]: rows 4g..4g+3 (lanes 0, 1) or 4g+8..4g+11 (lanes 2, 3), each
     * over half of the row's 8 lanes */
    _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++)
        r[g] = _mm512_add_epi32(_mm512_unpacklo_epi64(q[2 * g], q[2 * g + 1]),
                                _mm512_unpackhi_epi64(q[2 * g], q[2 * g + 1]));
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i ib = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    return _mm512_add_epi32(_mm512_permutex2var_epi64(r[0], ia, r[1]),
                            _mm512_permutex2var_epi64(r[0], ib, r[1]));
}

/* One activation row (decode), in the canonical order of the lane kernels with everything in
 * registers: per group of 16 weight rows and block, the rows' scales by one gather, each
 * row's products against the block by vpdpbusd in row order, their 8 lanes per row summed
 * exactly into lane r, then the same conversion and fma as ln_q8_0_rows. The next group is
 * prefetched meanwhile, a block's share at a time. */
AR_INLINE void ln_gemv(const int kind, int nb, int nr, const uint8_t *w, size_t w_row,
                       const uint8_t *x, float *y)
{
    const int32_t off = kind == LN_Q8_0 ? 128 : kind == LN_Q5_0 ? 16 : 8;
    const size_t bs = kind == LN_Q8_0   ? sizeof(struct block_q8_0)
                      : kind == LN_Q5_0 ? sizeof(struct block_q5_0)
                                        : sizeof(struct block_q4_0);
    const struct block_q8_0 *xb = (const struct block_q8_0 *)(const void *)x;
    for (int i0 = 0; i0 < nr; i0 += 16) {
        int rn = AR_MIN(16, nr - i0);
        __mmask16 m = (__mmask16)((1u << rn) - 1u);
        const uint8_t *rows[16];
        int32_t idx[16];
        for (int r = 0; r < 16; r++) {
            idx[r] = (int32_t)((size_t)AR_MIN(r, rn - 1) * w_row);
            rows[r] = w + (size_t)(i0 + AR_MIN(r, rn - 1)) * w_row;
        }
        const __m512i vidx = _mm512_loadu_si512((const void *)idx);
        const uint8_t *next = w + (size_t)(i0 + 16) * w_row;
        size_t nbytes = i0 + 16 < nr ? (size_t)AR_MIN(16, nr - i0 - 16) * w_row : 0;
        __m512 acc = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            size_t p0 = nbytes * (size_t)b / (size_t)nb, p1 = nbytes * (size_t)(b + 1) / (size_t)nb;
            for (size_t o = p0 & ~(size_t)63; o < p1; o += 64)
                _mm_prefetch((const char *)next + o, LN_FEW_HINT);
            __m512i dw = _mm512_i32gather_epi32(vidx, (const void *)(rows[0] + (size_t)b * bs), 1);
            __m512 wd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
            __m256i xq = _mm256_loadu_si256(cv256(xb[b].qs));
            __m512i xx = _mm512_broadcast_i64x4(xq);
            __m512i z[8], pr[8];
            ln_rows_z(kind, rows, (size_t)b * bs, z);
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                pr[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z[k], xx);
            __m512i p = _mm512_add_epi32(ln_rows_sum(pr),
                                         _mm512_set1_epi32(-off * q8_0_block_sum(&xb[b])));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                  _mm512_mul_ps(wd, _mm512_set1_ps(f16_to_f32(xb[b].d))), acc);
        }
        _mm512_mask_storeu_ps(y + i0, m, acc);
    }
}

AR_INLINE void ln_gemm(const int kind, int nb, int nr, int nc, const uint8_t *w, size_t w_row,
                        const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    const int32_t off = kind == LN_Q8_0 ? 128 : kind == LN_Q5_0 ? 16 : 8;
    if (nc == 1) {
        ln_gemv(kind, nb, nr, w, w_row, x, y);
        return;
    }
    if (nc <= LN_FEW && nb <= LN_FEW_NB) {
        static _Thread_local float fxd[LN_FEW * LN_FEW_NB];
        static _Thread_local int32_t fxc[LN_FEW * LN_FEW_NB];
        ln_x_prep(nc, nb, x, x_row, off, fxd, fxc, nb);
        for (int i0 = 0; i0 < nr; i0 += 16) {
            int pi = i0 + 16 * LN_FEW_AHEAD;
            const uint8_t *next = w + (size_t)pi * w_row;
            size_t nbytes = pi < nr ? (size_t)AR_MIN(16, nr - pi) * w_row : 0;
            int n_chunks = (nb + LN_KB - 1) / LN_KB;
            for (int b0 = 0, c = 0; b0 < nb; b0 += LN_KB, c++) {
                /* this chunk's share of the next group's bytes */
                size_t p0 = nbytes * (size_t)c / (size_t)n_chunks;
                size_t p1 = nbytes * (size_t)(c + 1) / (size_t)n_chunks;
                for (size_t o = p0 & ~(size_t)63; o < p1; o += 64)
                    _mm_prefetch((const char *)next + o, LN_FEW_HINT);
                ln_group(kind, nr, i0, b0, AR_MIN(LN_KB, nb - b0), nc, w, w_row, x, x_row,
                         fxd + b0, fxc + b0, nb, y, ldy);
            }
        }
        return;
    }
    float xd[LN_JC * LN_KB];
    int32_t xc[LN_JC * LN_KB];
    const size_t bs = kind == LN_Q8_0   ? sizeof(struct block_q8_0)
                      : kind == LN_Q5_0 ? sizeof(struct block_q5_0)
                                        : sizeof(struct block_q4_0);
    for (int j0 = 0; j0 < nc; j0 += LN_JC) {
        int jn = AR_MIN(LN_JC, nc - j0);
        const uint8_t *xj0 = x + (size_t)j0 * x_row;
        for (int b0 = 0; b0 < nb; b0 += LN_KB) {
            int kb = AR_MIN(LN_KB, nb - b0);
            ln_x_prep(jn, kb, xj0 + (size_t)b0 * sizeof(struct block_q8_0), x_row, off, xd, xc,
                      LN_KB);
            for (int i0 = 0; i0 < nr; i0 += 16) {
                /* the chunk LN_PF_AHEAD groups further on in (chunk, group) order */
                int ng = (nr + 15) / 16, q = (b0 / LN_KB) * ng + i0 / 16 + LN_PF_AHEAD;
                int pb = (q / ng) * LN_KB, pi = (q % ng) * 16;
                if (pb < nb)
                    ln_prefetch(w, w_row, pi, nr, (size_t)pb * bs, (size_t)AR_MIN(LN_KB, nb - pb) * bs);
                ln_group(kind, nr, i0, b0, kb, jn, w, w_row, xj0, x_row, xd, xc, LN_KB,
                         y + (size_t)j0 * ldy, ldy);
            }
        }
    }
}

static void q8_0_gemm_lanes(int nb, int nr, int nc, const uint8_t *w, size_t w_row,
                            const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    ln_gemm(LN_Q8_0, nb, nr, nc, w, w_row, x, x_row, y, ldy);
}

static void q5_0_gemm_lanes(int nb, int nr, int nc, const uint8_t *w, size_t w_row,
                            const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    ln_gemm(LN_Q5_0, nb, nr, nc, w, w_row, x, x_row, y, ldy);
}

static void q4_0_gemm_lanes(int nb, int nr, int nc, const uint8_t *w, size_t w_row,
                            const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    ln_gemm(LN_Q4_0, nb, nr, nc, w, w_row, x, x_row, y, ldy);
}

/* ---- packed weights (kernels.h, "x16") ------------------------------------------------------
 * The lane kernels' arithmetic, in the same order (so bit for bit what they give on the rows
 * unpacked), over weights already in lane order: a group's 16 rows are one contiguous stream
 * and the transposes are gone. Q4_0's vectors hold two lane vectors as nibbles. */

/* quant bytes of one block of a group, and its lane vectors */
#define PK_Q(kind) ((kind) == LN_Q8_0 ? 512 : (kind) == LN_Q5_0 ? 320 : 256)
/* bytes of one block of a group: its quants and 16 f16 scales */
#define PK_B(kind) (PK_Q(kind) + 32)

/* Block b's 8 lane vectors (bytes, 64 apart) at v: Q8_0's as stored; Q4_0's unpacked */
AR_INLINE const uint8_t *pk_block(const int kind, const uint8_t *gq, int b, __m512i v[8])
{
    const uint8_t *p = gq + (size_t)b * PK_B(kind);
    if (kind == LN_Q8_0)
        return p;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
        __m512i q = _mm512_loadu_si512((const void *)(p + 64 * t));
        v[t] = _mm512_and_si512(q, m4);
        v[t + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    }
    if (kind == LN_Q5_0) {
        /* the high-bit plane: bit t of each byte is vector t's bit 4, moved there by a 16-bit
         * shift (the bit that lands at 4 in each byte comes from the same byte) */
        const __m512i b4 = _mm512_set1_epi8(0x10);
        __m512i e = _mm512_loadu_si512((const void *)(p + 256));
        v[0] = _mm512_or_si512(v[0], _mm512_and_si512(_mm512_slli_epi16(e, 4), b4));
        v[1] = _mm512_or_si512(v[1], _mm512_and_si512(_mm512_slli_epi16(e, 3), b4));
        v[2] = _mm512_or_si512(v[2], _mm512_and_si512(_mm512_slli_epi16(e, 2), b4));
        v[3] = _mm512_or_si512(v[3], _mm512_and_si512(_mm512_slli_epi16(e, 1), b4));
        v[4] = _mm512_or_si512(v[4], _mm512_and_si512(e, b4));
        v[5] = _mm512_or_si512(v[5], _mm512_and_si512(_mm512_srli_epi16(e, 1), b4));
        v[6] = _mm512_or_si512(v[6], _mm512_and_si512(_mm512_srli_epi16(e, 2), b4));
        v[7] = _mm512_or_si512(v[7], _mm512_and_si512(_mm512_srli_epi16(e, 3), b4));
    }
    return (const uint8_t *)v;
}

/* Blocks [b0, b0 + kb) of the groups at weight rows i0 and i0 + 16 (one group where no second
 * starts before nr, or where ng_max is 1): their scales in wd[g], their lane vectors at wq[g]
 * (Q4_0/Q5_0 unpacked into wv[g]), the lanes of their rows in m[g]. It leaves in pf[g] what to
 * prefetch while the group is computed: with next_pair the same blocks of the group ng_max on
 * (the next pair's; the last pair's: the first pair's next chunk), prefetched here at once
 * instead where burst (pf[g] NULL then); otherwise the next chunk of its own stream, past its
 * end the first of the group ng_max on. Returns the number of groups. */
AR_INLINE int pk_pair(const int kind, const int ng_max, const uint8_t *wp, size_t gsz, int nr,
                      int i0, int b0, int kb, int nb, bool next_pair, bool burst,
                      __m512i wv[2][LN_KB * 8], __m512 wd[2][LN_KB], const uint8_t *wq[2],
                      __mmask16 m[2], const uint8_t *pf[2])
{
    int ng = ng_max == 2 && i0 + 16 < nr ? 2 : 1;
    for (int g = 0; g < ng; g++) {
        const uint8_t *gq = wp + (size_t)(i0 / 16 + g) * gsz;
        m[g] = (__mmask16)((1u << AR_MIN(16, nr - i0 - 16 * g)) - 1u);
        wq[g] = gq + (size_t)b0 * PK_B(kind);
        pf[g] = b0 + LN_KB < nb ? wq[g] + LN_KB * PK_B(kind) : gq + (size_t)ng_max * gsz;
        if (next_pair) {
            const uint8_t *nx = wq[g] + (size_t)ng_max * gsz;
            if (i0 + 16 * ng_max >= nr)
                nx = wp + (size_t)g * gsz +
                     (b0 + LN_KB < nb ? (size_t)(b0 + LN_KB) * PK_B(kind) : 0);
            pf[g] = nx;
            for (int o = 0; burst && o < LN_KB * PK_B(kind); o += 64)
                _mm_prefetch((const char *)nx + o, _MM_HINT_T0);
            if (burst)
                pf[g] = NULL;
        }
        for (int b = 0; b < kb; b++) {
            wd[g][b] = _mm512_cvtph_ps(
                _mm256_loadu_si256(cv256(gq + (size_t)(b0 + b) * PK_B(kind) + PK_Q(kind))));
            if (kind != LN_Q8_0)
                pk_block(kind, gq, b0 + b, &wv[g][8 * b]);
        }
        if (kind != LN_Q8_0)
            wq[g] = (const uint8_t *)wv[g];
    }
    return ng;
}

/* jn activation rows against the ng (1 or 2) groups pk_pair set up (and prefetching what it
 * set in pf); y: the first group's */
AR_INLINE void pk_rows(const int kind, int ng, int kb, int jn, const uint8_t *const wq[2],
                       const size_t wbs, __m512 wd[2][LN_KB], const uint8_t *x, size_t x_row,
                       const float *xd, const int32_t *xc, int xs, float *y, size_t ldy,
                       const __mmask16 m[2], bool first, const uint8_t *const pf[2], bool pf_y)
{
    const size_t pf_len = LN_KB * PK_B(kind);
    if (ng == 2) {
        const __m512 *const wdp[2] = {wd[0], wd[1]};
        float *const yg[2] = {y, y + 16};
        ln_rows_all2(kb, jn, wq, wbs, wdp, x, x_row, xd, xc, xs, yg, ldy, m, first, pf, pf_len,
                     pf_y);
    } else {
        ln_rows_all(kb, jn, wq[0], wbs, wd[0], x, x_row, xd, xc, xs, y, ldy, m[0], first, pf[0],
                    pf_len);
    }
}

/* The few-rows order of pk_gemm: the weights in address order, two groups side by side (an
 * odd last one alone), the next chunk of each stream prefetched a share per block
 * (pf_share). On Zen 4 (2026-12-03), a 151936 x 896 Q8_0 matrix
 * against 2 and 4 rows streamed at 6-7 GB/s with pairs and the prefetch in bursts, 13-17 with
 * single groups and spread prefetches (10-21 before the pairs came); against 16 rows at 5.5-6
 * GB/s, from 3.6-4.3 before the pairs. Pairs had started at 6 rows; from 2 (ln_rows_all2
 * pairing 2 or 3 rows too), on Zen 5 (2026-12-06) qwen05 Q8_0 batched decode steps of 2, 3
 * and 4 rows went from 1.29-1.36 single-row steps to 1.20-1.31. xd/xc: every row's blocks
 * (row j's block b at j * nb + b). */
AR_INLINE void pk_few(const int kind, int nb, int nr, int nc, const uint8_t *wp, const uint8_t *x,
                      size_t x_row, const float *xd, const int32_t *xc, float *y, size_t ldy)
{
    const size_t gsz = (size_t)nb * PK_B(kind), wbs = kind == LN_Q8_0 ? PK_B(kind) : 512;
    for (int i0 = 0; i0 < nr; i0 += 32) {
        for (int b0 = 0; b0 < nb; b0 += LN_KB) {
            int kb = AR_MIN(LN_KB, nb - b0);
            __m512i wv[2][LN_KB * 8];
            __m512 wd[2][LN_KB];
            const uint8_t *wq[2];
            __mmask16 m[2];
            const uint8_t *pf[2];
            int ng = pk_pair(kind, 2, wp, gsz, nr, i0, b0, kb, nb, false, false, wv, wd, wq, m, pf);
            pk_rows(kind, ng, kb, nc, wq, wbs, wd, x + (size_t)b0 * sizeof(struct block_q8_0),
                    x_row, xd + b0, xc + b0, nb, y + (size_t)i0, ldy, m, b0 == 0, pf, false);
        }
    }
}

/* The stream order of pk_gemm's one row (always) and few rows (kernels_batch_gemm): one group at
 * a time, block by block, up to 4 activation rows per pass (more: the group again, from L1 or L2,
 * for each further 4), the block PK_STREAM_AHEAD on asked for into L2 on the first pass (past
 * the group's end: the next group's; past the matrix's end prefetches do not fault). The pairs
 * (pk_few) read two groups' chunks of 8 blocks side by side, so a few rows' products fetch two
 * streams at once, 4 KiB apart and in bursts. Zen 4 (2026-12-07), one thread, a 300 MB Q8_0
 * matrix in calls of 4864 rows from memory, median GB/s of the weights, pairs -> stream, the
 * two alternated: 1024 wide against 2 rows 9.8-11.3 -> 22.8-26.2, 3 rows 10.5-11.6 -> 21.6-23.8,
 * 4 rows 9.4-10.4 -> 23.2-26.3, 8 rows 8.3 -> 13.0-16.7, 16 rows 5.7-5.8 -> 6.4-6.5 (the 16 rows'
 * products bound it); 896 and 4864 wide against 2 and 4 rows 9.6-13.3 -> 18.8-21.7; Q4_0
 * against 2 and 4 rows 10.1-11.3 -> 18.7-28.1. Without the software prefetch the stream reached
 * 25 against 2 rows but 11-14 against 4; 2 to 8 blocks ahead, or into L1, no better than none.
 * Every output's operations are pk_few's, in its order (an int32 sum's association changes no
 * bit). */
#define PK_STREAM_AHEAD 16

AR_INLINE void pk_stream_rows(const int kind, const int J, int nb, const uint8_t *gq, bool pf,
                              const uint8_t *x, size_t x_row, const float *xd, const int32_t *xc,
                              float *y, size_t ldy, __mmask16 m)
{
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = gq + (size_t)b * PK_B(kind);
        if (pf)
            prefetch_l2(blk + PK_STREAM_AHEAD * PK_B(kind), PK_B(kind));
        __m512i v[8];
        const uint8_t *q = pk_block(kind, gq, b, v);
        if (kind == LN_Q8_0) {
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) v[t] =
                _mm512_loadu_si512((const void *)(q + 64 * t));
        }
        __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256(cv256(blk + PK_Q(kind))));
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
        {
            const int8_t *xq =
                ((const struct block_q8_0 *)(const void *)(x + (size_t)j * x_row))[b].qs;
            /* two chains per row, so that 2 rows still keep 4 in flight */
            __m512i p0 = _mm512_set1_epi32(xc[j * nb + b]), p1 = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int t = 0; t < 8; t += 2)
            {
                p0 = _mm512_dpbusd_epi32(p0, v[t], _mm512_set1_epi32(load_i32(xq + 4 * t)));
                p1 = _mm512_dpbusd_epi32(p1, v[t + 1], _mm512_set1_epi32(load_i32(xq + 4 * t + 4)));
            }
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1)),
                                     _mm512_mul_ps(wd, _mm512_set1_ps(xd[j * nb + b])), acc[j]);
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
        _mm512_mask_storeu_ps(y + (size_t)j * ldy, m, acc[j]);
}

/* nc (1 to LN_FEW) activation rows in the stream order; xd/xc as pk_few's. One row (decode's
 * GEMV) prefetches as kernels_decode_prefetch says, more rows always. */
AR_INLINE void pk_stream(const int kind, int nb, int nr, int nc, const uint8_t *wp,
                         const uint8_t *x, size_t x_row, const float *xd, const int32_t *xc,
                         float *y, size_t ldy)
{
    const size_t gsz = (size_t)nb * PK_B(kind);
    const bool pf = nc > 1 || kernels_decode_prefetch == DECODE_PREFETCH_L2;
    for (int i0 = 0; i0 < nr; i0 += 16) {
        const uint8_t *gq = wp + (size_t)(i0 / 16) * gsz;
        __mmask16 m = (__mmask16)((1u << AR_MIN(16, nr - i0)) - 1u);
        for (int j = 0; j < nc; j += 4) {
            const bool pfj = pf && j == 0; /* the first pass over the group */
            const uint8_t *xj = x + (size_t)j * x_row;
            const float *dj = xd + j * nb;
            const int32_t *cj = xc + j * nb;
            float *yj = y + (size_t)j * ldy + (size_t)i0;
            switch (AR_MIN(4, nc - j)) {
            case 4:
                pk_stream_rows(kind, 4, nb, gq, pfj, xj, x_row, dj, cj, yj, ldy, m);
                break;
            case 3:
                pk_stream_rows(kind, 3, nb, gq, pfj, xj, x_row, dj, cj, yj, ldy, m);
                break;
            case 2:
                pk_stream_rows(kind, 2, nb, gq, pfj, xj, x_row, dj, cj, yj, ldy, m);
                break;
            default:
                pk_stream_rows(kind, 1, nb, gq, pfj, xj, x_row, dj, cj, yj, ldy, m);
                break;
            }
        }
    }
}

AR_INLINE void pk_gemm(const int kind, int nb, int nr, int nc, const uint8_t *wp,
                       const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    const int32_t off = kind == LN_Q8_0 ? 128 : kind == LN_Q5_0 ? 16 : 8;
    const size_t gsz = (size_t)nb * PK_B(kind), wbs = kind == LN_Q8_0 ? PK_B(kind) : 512;
    float xd[LN_JC * LN_KB];
    int32_t xc[LN_JC * LN_KB];
    if (nc <= LN_FEW && (nc == 1 ? nb <= LN_FEW * LN_FEW_NB : nb <= LN_FEW_NB)) {
        /* one row (decode) or a few (batched decode): the weights in address order, group
         * after group, every activation block prepared once (for one row the buffers hold
         * LN_FEW times LN_FEW_NB blocks, n up to 262144). A few rows: the next chunk of the
         * stream is prefetched (past the matrix's end too: prefetches do not fault): from 2 rows
         * on the chunk takes long enough that the hardware prefetchers fall behind. On Zen 5, a
         * 151936 x 896 Q8_0 matrix from memory against 16 rows went from 0.24-0.26 of the int8
         * peak to 0.33-0.36; against 2, 4 and 8 rows Q8_0 and Q4_0 streamed 0-35 % faster.
         * One row always takes the stream order. Intel Xeon (family 6 model 0xcf,
         * 2026-12-07), one thread, a 650 MB Q8_0 matrix 1024 wide in calls of 4864 rows, GB/s
         * of the weights (a plain read: 17): the GEMV this replaced, which summed each
         * activation block inline and added a block's eight products in a tree, 13.4-14.0;
         * the stream without prefetch 14.5-14.7, with it 16.3-16.8 (4 to 64 blocks ahead
         * alike); Q4_0 9.6-10.5 -> 14.3-15.3 with it, Q5_0 9.6-9.9 -> 14.4-15.0. */
        static _Thread_local float fxd[LN_FEW * LN_FEW_NB];
        static _Thread_local int32_t fxc[LN_FEW * LN_FEW_NB];
        ln_x_prep(nc, nb, x, x_row, off, fxd, fxc, nb);
        if (nc == 1 || kernels_batch_gemm == BATCH_GEMM_STREAM)
            pk_stream(kind, nb, nr, nc, wp, x, x_row, fxd, fxc, y, ldy);
        else
            pk_few(kind, nb, nr, nc, wp, x, x_row, fxd, fxc, y, ldy);
        return;
    }
    /* many rows: chunk by chunk over all groups, as ln_gemm, so a chunk of every activation
     * row stays in L1 while the weights pass; the prefetch: the same chunk of the next pair */
    for (int j0 = 0; j0 < nc; j0 += LN_JC) {
        int jn = AR_MIN(LN_JC, nc - j0);
        const uint8_t *xj0 = x + (size_t)j0 * x_row;
        for (int b0 = 0; b0 < nb; b0 += LN_KB) {
            int kb = AR_MIN(LN_KB, nb - b0);
            ln_x_prep(jn, kb, xj0 + (size_t)b0 * sizeof(struct block_q8_0), x_row, off, xd, xc,
                      LN_KB);
            for (int i0 = 0; i0 < nr; i0 += 32) {
                __m512i wv[2][LN_KB * 8];
                __m512 wd[2][LN_KB];
                const uint8_t *wq[2];
                __mmask16 m[2];
                const uint8_t *pf[2];
                int ng = pk_pair(kind, 2, wp, gsz, nr, i0, b0, kb, nb, true, jn <= LN_PF_TILE_ROWS,
                                 wv, wd, wq, m, pf);
                pk_rows(kind, ng, kb, jn, wq, wbs, wd, xj0 + (size_t)b0 * sizeof(struct block_q8_0),
                        x_row, xd, xc, LN_KB, y + (size_t)j0 * ldy + (size_t)i0, ldy, m, b0 == 0,
                        pf, true);
            }
        }
    }
}

/* the table's entry for one packed type: GEMM (pk_gemm, pkk_gemm) of KIND over blocks of QK */
#define DEFINE_GEMM_PACKED(NAME, GEMM, KIND, QK)                                                   \
    static void NAME##_gemm_packed(int n, int nr, int nc, const void *wp, const void *x,          \
                                   size_t x_row, float *y, size_t ldy)                             \
    {                                                                                              \
        GEMM(KIND, n / (QK), nr, nc, wp, x, x_row, y, ldy);                                        \
    }
DEFINE_GEMM_PACKED(q8_0, pk_gemm, LN_Q8_0, QK8_0)
DEFINE_GEMM_PACKED(q4_0, pk_gemm, LN_Q4_0, QK4_0)
DEFINE_GEMM_PACKED(q5_0, pk_gemm, LN_Q5_0, QK5_0)

#endif

AR_INLINE __m512i q4_0_load(const struct block_q4_0 *b, int k)
{
    return nibbles_load(b[0].qs, k == 2 ? b[1].qs : NULL, k);
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
#ifdef __AVX512VNNI__
AR_INLINE __m128 q4_0_cblock(const struct block_q4_0 *w, const struct block_q8_0 *x, __m128 acc)
{
    __m512i p = dot_offset(q4_0_load(w, 1), 8, q8_0_load(x, 1));
    return chain_step(p, f16_to_f32(w->d) * f16_to_f32(x->d), acc);
}
DEFINE_CDOT(q4_0, struct block_q4_0, struct block_q8_0, q4_0_cblock, QK4_0)
#else
DEFINE_GEMM(q4_0, struct block_q4_0, struct block_q8_0, q4_0_block, 2, QK4_0)
#endif

/* ---- Q4_1, Q5_0, Q5_1 against Q8_0 activations, two blocks per vector ---------------------- */

/* Unsigned q (0..31) of k blocks against their activation blocks:
 * acc += (d * yd) * sum(q * y) + (m * yd) * sum(y), per half. */
AR_INLINE void affine_pair(__m512i q, __m512 dd, __m512 md, __m512i xv, __m512 *acc)
{
#ifdef __AVX512VNNI__
    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xv);
    __m512i sy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), xv);
#else
    const __m512i ones = _mm512_set1_epi16(1);
    __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(q, xv), ones);
    __m512i sy = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), xv), ones);
#endif
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), dd, *acc);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sy), md, *acc);
}

AR_INLINE void q4_1_block(const struct block_q4_1 *w, const struct block_q8_0 *x, __m512 *acc,
                          int k)
{
    __m512i q = nibbles_load(w[0].qs, k == 2 ? w[1].qs : NULL, k);
    ar_f16 xd1 = k == 2 ? x[1].d : 0;
    __m512 dd = pair_scales(w[0].d, k == 2 ? w[1].d : 0, x[0].d, xd1, k);
    __m512 md = pair_scales(w[0].m, k == 2 ? w[1].m : 0, x[0].d, xd1, k);
    affine_pair(q, dd, md, q8_0_load(x, k), acc);
}
DEFINE_GEMM(q4_1, struct block_q4_1, struct block_q8_0, q4_1_block, 2, QK4_1)

AR_INLINE void q5_0_block(const struct block_q5_0 *w, const struct block_q8_0 *x, __m512 *acc,
                          int k)
{
    __m512i q = q5_load(w[0].qs, w[0].qh, k == 2 ? w[1].qs : NULL, k == 2 ? w[1].qh : NULL, k);
    __m512i xv = q8_0_load(x, k);
#ifdef __AVX512VNNI__
    __m512i p = dot_offset(q, 16, xv);
#else
    __m512i p = dot_s8s8(_mm512_sub_epi8(q, _mm512_set1_epi8(16)), xv);
#endif
    __m512 d = pair_scales(w[0].d, k == 2 ? w[1].d : 0, x[0].d, k == 2 ? x[1].d : 0, k);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, *acc);
}
#ifdef __AVX512VNNI__
AR_INLINE __m128 q5_0_cblock(const struct block_q5_0 *w, const struct block_q8_0 *x, __m128 acc)
{
    __m512i p = dot_offset(q5_load(w->qs, w->qh, NULL, NULL, 1), 16, q8_0_load(x, 1));
    return chain_step(p, f16_to_f32(w->d) * f16_to_f32(x->d), acc);
}
DEFINE_CDOT(q5_0, struct block_q5_0, struct block_q8_0, q5_0_cblock, QK5_0)
#else
DEFINE_GEMM(q5_0, struct block_q5_0, struct block_q8_0, q5_0_block, 2, QK5_0)
#endif

AR_INLINE void q5_1_block(const struct block_q5_1 *w, const struct block_q8_0 *x, __m512 *acc,
                          int k)
{
    __m512i q = q5_load(w[0].qs, w[0].qh, k == 2 ? w[1].qs : NULL, k == 2 ? w[1].qh : NULL, k);
    ar_f16 xd1 = k == 2 ? x[1].d : 0;
    __m512 dd = pair_scales(w[0].d, k == 2 ? w[1].d : 0, x[0].d, xd1, k);
    __m512 md = pair_scales(w[0].m, k == 2 ? w[1].m : 0, x[0].d, xd1, k);
    affine_pair(q, dd, md, q8_0_load(x, k), acc);
}
DEFINE_GEMM(q5_1, struct block_q5_1, struct block_q8_0, q5_1_block, 2, QK5_1)

#ifdef __AVX512VNNI__
/* Q8_0, Q5_0 and Q4_0 take the lane-packed kernels at every shape, one activation row
 * included: they follow the canonical order by construction (see above). */
static void q8_0_gemm_best(int n, int nr, int nc, const void *w, size_t w_row, const void *x,
                           size_t x_row, float *y, size_t ldy)
{
    q8_0_gemm_lanes(n / QK8_0, nr, nc, w, w_row, x, x_row, y, ldy);
}

static void q5_0_gemm_best(int n, int nr, int nc, const void *w, size_t w_row, const void *x,
                           size_t x_row, float *y, size_t ldy)
{
    q5_0_gemm_lanes(n / QK5_0, nr, nc, w, w_row, x, x_row, y, ldy);
}

static void q4_0_gemm_best(int n, int nr, int nc, const void *w, size_t w_row, const void *x,
                           size_t x_row, float *y, size_t ldy)
{
    q4_0_gemm_lanes(n / QK4_0, nr, nc, w, w_row, x, x_row, y, ldy);
}
#endif

/* ---- K-quants against Q8_K activations, one super-block per step ----------------------------- */

/* The 8 six-bit scales (low 8 bytes) and mins (high 8 bytes) of a Q4_K/Q5_K block (layout in
 * ref.c's k_scale_min), unpacked with 32-bit word operations: sc 0..3 and m 0..3 are the low
 * 6 bits of bytes 0..3 and 4..7; sc/m 4..7 take their low 4 bits from the nibbles of bytes
 * 8..11 and their top 2 bits from the top bits of bytes 0..3 / 4..7. */
AR_INLINE __m128i k_scales_mins(const uint8_t *q)
{
    uint32_t a, b, c;
    memcpy(&a, q, 4);
    memcpy(&b, q + 4, 4);
    memcpy(&c, q + 8, 4);
    uint32_t sc_lo = a & 0x3f3f3f3fu, m_lo = b & 0x3f3f3f3fu;
    uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    return _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
}

/* int16 index vector: lanes 0..15 pick a, lanes 16..31 pick b */
AR_INLINE __m512i idx2(int a, int b)
{
    return join256(_mm256_set1_epi16((short)a), _mm256_set1_epi16((short)b));
}

/* The integer parts of a Q4_K (qh NULL) / Q5_K block: *isum (16 lanes) sums to
 * sum_j sc_j * sum(q * y) over sub-block j, *msum (8 lanes) to sum_j m_j * (bsums of j). */
AR_INLINE void qk45_parts(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                          const struct block_q8_K *x, __m512i *isum_out, __m256i *msum_out)
{
    __m128i scm = k_scales_mins(scales);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(scm));
    __m128i m16 = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(scm, scm));
    __m256i mv = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i hb = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256(cv256(qh))) : _mm512_setzero_si512();
    __m512i isum = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
    {
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
    *isum_out = isum;
    *msum_out = _mm256_madd_epi16(_mm256_loadu_si256(cv256(x->bsums)), mv);
}

AR_INLINE void qk45_block(ar_f16 dh, ar_f16 dminh, const uint8_t *scales, const uint8_t *qs,
                          const uint8_t *qh, const struct block_q8_K *x, __m512 *acc)
{
    __m512i isum;
    __m256i msum;
    qk45_parts(scales, qs, qh, x, &isum, &msum);
    float d = f16_to_f32(dh) * x->d;
    float dmin = f16_to_f32(dminh) * x->d;
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d), *acc);
    *acc = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(msum)), _mm512_set1_ps(dmin),
                            *acc);
}

#ifdef __AVX512VNNI__
/* The canonical step of a Q4_K/Q5_K super-block: both integer sums reduced exactly, then
 * acc = fma((float)isum, d * xd, acc) and acc = fma(-(float)msum, dmin * xd, acc). */
AR_INLINE __m128 qk45_cstep(ar_f16 dh, ar_f16 dminh, __m512i isum, __m256i msum, float xd,
                            __m128 acc)
{
    __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
    /* a0+a1 a2+a3 m0+m1 m2+m3 | a4+a5 a6+a7 m4+m5 m6+m7 */
    __m256i h = _mm256_hadd_epi32(a, msum);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    t = _mm_hadd_epi32(t, t); /* isum, msum, isum, msum */
    __m128 f = _mm_cvtepi32_ps(t);
    acc = _mm_fmadd_ss(f, _mm_set_ss(f16_to_f32(dh) * xd), acc);
    return _mm_fnmadd_ss(_mm_movehdup_ps(f), _mm_set_ss(f16_to_f32(dminh) * xd), acc);
}

AR_INLINE __m128 q4_K_cblock(const struct block_q4_K *w, const struct block_q8_K *x, __m128 acc)
{
    __m512i isum;
    __m256i msum;
    qk45_parts(w->scales, w->qs, NULL, x, &isum, &msum);
    return qk45_cstep(w->d, w->dmin, isum, msum, x->d, acc);
}

AR_INLINE __m128 q5_K_cblock(const struct block_q5_K *w, const struct block_q8_K *x, __m128 acc)
{
    __m512i isum;
    __m256i msum;
    qk45_parts(w->scales, w->qs, w->qh, x, &isum, &msum);
    return qk45_cstep(w->d, w->dmin, isum, msum, x->d, acc);
}
#endif

AR_INLINE void q4_K_block(const struct block_q4_K *w, const struct block_q8_K *x, __m512 *acc,
                          int k)
{
    (void)k;
    qk45_block(w->d, w->dmin, w->scales, w->qs, NULL, x, acc);
}
#ifdef __AVX512VNNI__
DEFINE_CGEMM(q4_K, struct block_q4_K, struct block_q8_K, q4_K_cblock, QK_K)
#else
DEFINE_GEMM(q4_K, struct block_q4_K, struct block_q8_K, q4_K_block, 1, QK_K)
#endif

AR_INLINE void q5_K_block(const struct block_q5_K *w, const struct block_q8_K *x, __m512 *acc,
                          int k)
{
    (void)k;
    qk45_block(w->d, w->dmin, w->scales, w->qs, w->qh, x, acc);
}
#ifdef __AVX512VNNI__
DEFINE_CGEMM(q5_K, struct block_q5_K, struct block_q8_K, q5_K_cblock, QK_K)
#else
DEFINE_GEMM(q5_K, struct block_q5_K, struct block_q8_K, q5_K_block, 1, QK_K)
#endif

/* Q6_K: sum(sc * (q - 32) * y) = sum(sc * q * y) - 32 * sum(sc * bsum), all in int32. */
AR_INLINE __m512i q6_K_parts(const struct block_q6_K *w, const struct block_q8_K *x)
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
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
    {
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
    return _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
}

AR_INLINE void q6_K_block(const struct block_q6_K *w, const struct block_q8_K *x, __m512 *acc,
                          int k)
{
    __m512i isum = q6_K_parts(w, x);
    float d = f16_to_f32(w->d) * x->d;
    (void)k;
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d), *acc);
}

#ifdef __AVX512VNNI__
AR_INLINE __m128 q6_K_cblock(const struct block_q6_K *w, const struct block_q8_K *x, __m128 acc)
{
    return chain_step(q6_K_parts(w, x), f16_to_f32(w->d) * x->d, acc);
}
DEFINE_CGEMM(q6_K, struct block_q6_K, struct block_q8_K, q6_K_cblock, QK_K)
#else
DEFINE_GEMM(q6_K, struct block_q6_K, struct block_q8_K, q6_K_block, 1, QK_K)
#endif

#ifdef __AVX512VNNI__
/* ---- K-quant gemm over many activation rows: 16 weight rows in the lanes of one vector -------
 * As the Q8_0 lane gemm above: per super-block, 16 weight rows' unsigned quants (Q4_K 0..15,
 * Q5_K 0..31, Q6_K 0..63) are transposed into 64 vectors (8 groups of 32 elements), and one
 * vpdpbusd against 4 broadcast activation bytes advances all 16 rows. Each sub-block's int32
 * sum is multiplied by its scale per lane and summed in int32; the mins (Q4_K, Q5_K) come from
 * the activation's bsums by vpdpwssd, and Q6_K's -32 offset starts each sub-block's sum at
 * -32 * bsum. One conversion and fma per super-block and activation row; partial sums live in
 * y between super-blocks. Every output is the same operations wherever its row and column
 * fall, so any split of rows or columns gives the same bits. */

enum { LK_Q4_K, LK_Q5_K, LK_Q6_K };
/* Where the decode path's software prefetch puts a super-block, how far ahead (0: no
 * prefetch) and from how many activation rows on: chosen per CPU when the table is filled (see
 * pkk_tune). */
static bool pkk_into_l1 = true;
static size_t pkk_ahead = 2;
static int pkk_min_rows = 1;

/* Lines [l0, l1) of the super-block pf (none when pf is NULL) into L1 or L2 as pkk_tune
 * chose */
AR_INLINE void pkk_prefetch_lines(const uint8_t *pf, int l0, int l1)
{
    if (!pf)
        return;
    if (pkk_into_l1) {
        for (int l = l0; l < l1; l++)
            _mm_prefetch((const char *)(pf + 64 * l), _MM_HINT_T0);
    } else {
        for (int l = l0; l < l1; l++)
            _mm_prefetch((const char *)(pf + 64 * l), _MM_HINT_T1);
    }
}

/* Below this many activation rows the 4 x 4 tiles are faster (unpacking 16 rows' super-block
 * costs about as much as 10 activation rows' products). */
#define LK_MIN_NC 12
/* The same for packed weights (pkk_gemm): up to 16 rows the few-rows path, which takes each
 * super-block's quants into registers once per 4 rows, streams faster than the lane gemm. Zen
 * 4 (2026-12-07), one thread, a 300 MB matrix from memory in calls of 4864 rows, the two
 * alternated, median GB/s: 1024 wide Q4_K against 12 rows 3.6 -> 6.5, 16 rows 3.0 -> 4.5,
 * Q6_K 4.5 -> 7.3 and 3.9 -> 5.4, Q5_K against 16 3.6 -> 4.3, 3072 wide Q4_K against 16
 * 3.4 -> 5.5; at 20 rows the two were equal, from 24 on the lane gemm faster. From L2 the lane
 * gemm is as fast at 12 rows and faster at 16 (Q6_K 6.3 against 4.9 GB/s), but a batch's
 * weights come from memory. Not measured on other CPUs. */
#define PKK_MIN_NC 17
#ifndef LK_J2
#define LK_J2 4
#endif

struct lk_wt {
    __m512i v[64];     /* transposed quants: group g's vectors at 8g */
    __m512i sc[16];    /* per-lane sub-block scales (Q4_K/Q5_K: 8, Q6_K: 16), int32 */
    __m512i mpair[4];  /* Q4_K/Q5_K: mins (2u, 2u + 1) as int16 pairs per lane */
    __m512 d, dmin;    /* per-lane d and dmin */
};

/* Q6_K's quants of group k (< 4) of a half from its ql bytes l (nibble k / 2 of the bytes for
 * k % 2) and its qh bytes q (bits 2k, 2k + 1 as bits 4, 5), as unsigned bytes */
AR_INLINE __m512i q6_quants(__m512i l, __m512i q, int k)
{
    if (k >= 2)
        l = _mm512_srli_epi16(l, 4);
    q = k < 2 ? _mm512_slli_epi16(q, (unsigned)(4 - 2 * k))
              : _mm512_srli_epi16(q, (unsigned)(2 * k - 4));
    return _mm512_or_si512(_mm512_and_si512(l, _mm512_set1_epi8(0x0f)),
                           _mm512_and_si512(q, _mm512_set1_epi8(0x30)));
}

/* z (see ln_transpose) of group g (32 elements) for rows a (lower half) and b (upper half) */
AR_INLINE __m512i lk_group(const int kind, const uint8_t *a, const uint8_t *b, int g)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (kind == LK_Q6_K) {
        int h = g / 4, k = g % 4;
        size_t lo = offsetof(struct block_q6_K, ql) + 64 * (size_t)h + 32 * (size_t)(k % 2);
        size_t hi = offsetof(struct block_q6_K, qh) + 32 * (size_t)h;
        __m512i l = join256(_mm256_loadu_si256(cv256(a + lo)), _mm256_loadu_si256(cv256(b + lo)));
        __m512i t = join256(_mm256_loadu_si256(cv256(a + hi)), _mm256_loadu_si256(cv256(b + hi)));
        return q6_quants(l, t, k);
    }
    size_t qs = kind == LK_Q4_K ? offsetof(struct block_q4_K, qs) : offsetof(struct block_q5_K, qs);
    __m512i v = join256(_mm256_loadu_si256(cv256(a + qs + 32 * (size_t)(g / 2))),
                        _mm256_loadu_si256(cv256(b + qs + 32 * (size_t)(g / 2))));
    if (g & 1)
        v = _mm512_srli_epi16(v, 4);
    v = _mm512_and_si512(v, m4);
    if (kind == LK_Q5_K) {
        size_t qh = offsetof(struct block_q5_K, qh);
        __m512i t = join256(_mm256_loadu_si256(cv256(a + qh)), _mm256_loadu_si256(cv256(b + qh)));
        __mmask64 k5 = _mm512_test_epi8_mask(t, _mm512_set1_epi8((char)(1 << g)));
        v = _mm512_mask_add_epi8(v, k5, v, _mm512_set1_epi8(16));
    }
    return v;
}

/* The 16 rows' super-block at byte offset off (rows past the last repeat it). */
AR_INLINE void lk_unpack(const int kind, const uint8_t *const rows[16], size_t off, struct lk_wt *wt)
{
    float d[16], dmin[16];
    uint8_t sc[16][16], mn[8][16];
    for (int g = 0; g < 8; g++) {
        __m512i z[8];
        for (int k = 0; k < 8; k++)
            z[k] = lk_group(kind, rows[k] + off, rows[k + 8] + off, g);
        ln_transpose(z, &wt->v[8 * g]);
    }
    for (int r = 0; r < 16; r++) {
        const uint8_t *b = rows[r] + off;
        if (kind == LK_Q6_K) {
            const struct block_q6_K *q = (const struct block_q6_K *)(const void *)b;
            for (int s = 0; s < 16; s++)
                sc[s][r] = (uint8_t)q->scales[s];
            d[r] = f16_to_f32(q->d);
        } else {
            /* d, dmin and scales sit at the same offsets in Q4_K and Q5_K */
            const struct block_q4_K *q = (const struct block_q4_K *)(const void *)b;
            uint8_t bytes[16];
            _mm_storeu_si128((__m128i *)(void *)bytes, k_scales_mins(q->scales));
            for (int j = 0; j < 8; j++) {
                sc[j][r] = bytes[j];
                mn[j][r] = bytes[8 + j];
            }
            d[r] = f16_to_f32(q->d);
            dmin[r] = f16_to_f32(q->dmin);
        }
    }
    wt->d = _mm512_loadu_ps(d);
    if (kind == LK_Q6_K) {
        for (int s = 0; s < 16; s++)
            wt->sc[s] = _mm512_cvtepi8_epi32(_mm_loadu_si128(cv128(sc[s])));
    } else {
        wt->dmin = _mm512_loadu_ps(dmin);
        for (int j = 0; j < 8; j++)
            wt->sc[j] = _mm512_cvtepu8_epi32(_mm_loadu_si128(cv128(sc[j])));
        for (int u = 0; u < 4; u++)
            wt->mpair[u] = _mm512_or_si512(
                _mm512_cvtepu8_epi32(_mm_loadu_si128(cv128(mn[2 * u]))),
                _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(cv128(mn[2 * u + 1]))), 16));
    }
}

/* bytes of one packed super-block of a group, and where its fields start: the scales at 0,
 * then d (and dmin 32 bytes on), Q4_K's qs, Q5_K's qh and qs, Q6_K's ql and qh of half h */
#define PKK_B(kind) ((kind) == LK_Q4_K ? 2304 : (kind) == LK_Q5_K ? 2816 : 3392)
#define PKK_D(kind) ((kind) == LK_Q6_K ? 256 : 192)
#define PKK_QS(kind) ((kind) == LK_Q4_K ? 256 : 768)
#define PKK_QH5 256

AR_INLINE void pkk_group(const int kind, const uint8_t *p, int g, __m512i w[8]);

/* isum[k][j] += the products of row j's activations with the quants w[k] of super-block k
 * (< G: one, or two side by side sharing each activation broadcast) over sub-block sb of group
 * g (Q4_K/Q5_K: the group's 32 elements, sb 0; Q6_K: its half sb of 16), by sub-block scale.
 * sh: the sums first shifted right by sh, for quants taken at 2^sh times their value (Q4_K's
 * high nibbles left in place: the sums are exact multiples of 16, so the shift is exact). */
AR_INLINE void lk_dots_sub(const int kind, const int G, const int J, int g, int sb, const int sh,
                           const __m512i *const w[2], const struct block_q8_K *const xb[8],
                           const struct lk_wt *const wt[2], __m512i isum[2][8])
{
    /* the chains side by side, step t of every row before step t + 1 of any: written row
     * after row, the compiler emitted each row's dependent vpdpbusd in one run, and a 3072 x
     * 1024 x 512 Q4_K tile on Zen 5 ran 4-7 % slower. Under 8 chains: each row's products in
     * two (int32 sums are exact, so the association changes no bit). */
    const int CH = G * J <= 4 ? 2 : 1;
    const int NT = kind == LK_Q6_K ? 4 : 8; /* vectors of 4 elements per sub-block */
    __m512i p[2][2][8];
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
    {
        /* Q6_K's quants are stored + 32: taken out by the activations' sums */
        __m512i p0 = kind == LK_Q6_K ? _mm512_set1_epi32(-32 * (int32_t)xb[j]->bsums[2 * g + sb])
                                     : _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int k = 0; k < G; k++)
        {
            p[k][0][j] = p0;
            p[k][1][j] = _mm512_setzero_si512();
        }
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
        _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
    {
        __m512i xv = _mm512_set1_epi32(load_i32(xb[j]->qs + 32 * g + 16 * sb + 4 * t));
        _Pragma("GCC unroll 2") for (int k = 0; k < G; k++) p[k][t % CH][j] =
            _mm512_dpbusd_epi32(p[k][t % CH][j], w[k][NT * sb + t], xv);
    }
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
        _Pragma("GCC unroll 2") for (int k = 0; k < G; k++)
    {
        __m512i ps = CH == 2 ? _mm512_add_epi32(p[k][0][j], p[k][1][j]) : p[k][0][j];
        if (sh)
            ps = _mm512_srai_epi32(ps, (unsigned)sh);
        __m512i sc = wt[k]->sc[kind == LK_Q6_K ? 2 * g + sb : g];
        isum[k][j] = _mm512_add_epi32(isum[k][j], _mm512_mullo_epi32(ps, sc));
    }
}

/* isum[k][j] += group g's products (lk_dots_sub over its one or two sub-blocks) */
AR_INLINE void lk_dots(const int kind, const int G, const int J, int g, const int sh,
                       const __m512i *const w[2], const struct block_q8_K *const xb[8],
                       const struct lk_wt *const wt[2], __m512i isum[2][8])
{
    lk_dots_sub(kind, G, J, g, 0, sh, w, xb, wt, isum);
    if (kind == LK_Q6_K)
        lk_dots_sub(kind, G, J, g, 1, sh, w, xb, wt, isum);
}

/* The activation block's sums of sub-blocks (2u, 2u + 1) as int16 pairs, for the mins'
 * vpdpwssd (Q4_K/Q5_K) */
AR_INLINE void lk_bsum_pairs(const struct block_q8_K *xb, __m512i sp[4])
{
    const int16_t *bs = xb->bsums;
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
    {
        int32_t s0 = bs[4 * u] + bs[4 * u + 1], s1 = bs[4 * u + 2] + bs[4 * u + 3];
        sp[u] = _mm512_set1_epi32((int32_t)(((uint32_t)s1 << 16) | (uint16_t)s0));
    }
}

/* y[lane] (masked to m) += the contribution of the super-block with the integer sums isum of
 * one activation row (its block xb; sp its lk_bsum_pairs, unused for Q6_K), or = it when
 * first */
AR_INLINE void lk_store(const int kind, const struct lk_wt *wt, const struct block_q8_K *xb,
                        const __m512i sp[4], __m512i isum, float *y, __mmask16 m, bool first)
{
    __m512 xd = _mm512_set1_ps(xb->d);
    __m512 acc = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(wt->d, xd), acc);
    if (kind != LK_Q6_K) {
        __m512i ms = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) ms =
            _mm512_dpwssd_epi32(ms, wt->mpair[u], sp[u]);
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(wt->dmin, xd), acc);
    }
    _mm512_mask_storeu_ps(y, m, acc);
}

/* J activation rows (super-block blocks at x, x_row apart) against the packed super-block pk
 * (kernels.h, "x16"), its quants taken group by group into registers and its scales already
 * in wt: y[j * ldy + lane] (masked to m) += their contributions, or = them when first. The
 * arithmetic is lk_rows2's for one unpacked super-block. */
AR_INLINE void lk_rows(const int kind, const int J, const struct lk_wt *wt, const uint8_t *pk,
                       const uint8_t *pf, const uint8_t *x, size_t x_row, float *y, size_t ldy,
                       __mmask16 m, bool first)
{
    /* pf: a super-block to prefetch into L2 meanwhile, a share of its lines per group */
    const int pf_lines = PKK_B(kind) / 64;
    const struct lk_wt *const wts[2] = {wt, wt};
    __m512i isum[2][8];
    const struct block_q8_K *xb[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
    {
        isum[0][j] = _mm512_setzero_si512();
        xb[j] = (const struct block_q8_K *)(const void *)(x + (size_t)j * x_row);
    }
    if (kind == LK_Q4_K) {
        /* groups 2h and 2h + 1 are the low and high nibbles of the same bytes: read once */
        const __m512i m4 = _mm512_set1_epi8(0x0f), m4h = _mm512_set1_epi8((char)0xf0);
        for (int h = 0; h < 4; h++) {
            const uint8_t *qs = pk + PKK_QS(LK_Q4_K) + 512 * (size_t)h;
            __m512i v[8], w[8];
            const __m512i *const wg[2] = {w, w};
            pkk_prefetch_lines(pf, pf_lines * h / 4, pf_lines * (h + 1) / 4);
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
            {
                v[t] = _mm512_loadu_si512((const void *)(qs + 64 * t));
                w[t] = _mm512_and_si512(v[t], m4);
            }
            lk_dots(kind, 1, J, 2 * h, 0, wg, xb, wts, isum);
            /* the high nibbles in place, 16 times the quants: their sums shifted back */
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) w[t] = _mm512_and_si512(v[t], m4h);
            lk_dots(kind, 1, J, 2 * h + 1, 4, wg, xb, wts, isum);
        }
    } else if (kind == LK_Q6_K) {
        /* groups 4h + k and 4h + k + 2 (k < 2) are the low and high nibbles of the same ql
         * bytes and share the qh bytes: each read once for the two */
        for (int h = 0; h < 2; h++)
            _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++)
            {
                __m512i a[8], q[8], w[8];
                const __m512i *const wg[2] = {w, w};
                pkk_prefetch_lines(pf, pf_lines * (2 * h + k) / 4, pf_lines * (2 * h + k + 1) / 4);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
                {
                    a[t] = _mm512_loadu_si512((const void *)(pk + PK_Q6_QL(h, k, t)));
                    q[t] = _mm512_loadu_si512((const void *)(pk + PK_Q6_QH(h, t)));
                    w[t] = q6_quants(a[t], q[t], k);
                }
                lk_dots(kind, 1, J, 4 * h + k, 0, wg, xb, wts, isum);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) w[t] =
                    q6_quants(a[t], q[t], k + 2);
                lk_dots(kind, 1, J, 4 * h + k + 2, 0, wg, xb, wts, isum);
            }
    } else {
        for (int g = 0; g < 8; g++) {
            __m512i w[8];
            const __m512i *const wg[2] = {w, w};
            pkk_prefetch_lines(pf, pf_lines * g / 8, pf_lines * (g + 1) / 8);
            pkk_group(kind, pk, g, w);
            lk_dots(kind, 1, J, g, 0, wg, xb, wts, isum);
        }
    }
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
    {
        __m512i sp[4];
        if (kind != LK_Q6_K)
            lk_bsum_pairs(xb[j], sp);
        lk_store(kind, wt, xb[j], sp, isum[0][j], y + (size_t)j * ldy, m, first);
    }
}

/* J activation rows (super-block blocks at x, x_row apart) against G (1 or 2) unpacked
 * super-blocks wt[k] of 16 weight rows each: y[k][j * ldy + lane] (masked to m[k]) += their
 * contributions, or = them when first. Two side by side share each activation broadcast, so a
 * vpdpbusd takes half a broadcast load instead of one, as in ln_q8_0_rows2; every output's
 * operations are the same either way, in the same order. */
AR_INLINE void lk_rows2(const int kind, const int G, const int J, const struct lk_wt *const wt[2],
                        const uint8_t *x, size_t x_row, float *const y[2], size_t ldy,
                        const __mmask16 m[2], bool first)
{
    __m512i isum[2][8];
    const struct block_q8_K *xb[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
    {
        isum[0][j] = isum[1][j] = _mm512_setzero_si512();
        xb[j] = (const struct block_q8_K *)(const void *)(x + (size_t)j * x_row);
    }
    for (int g = 0; g < 8; g++) {
        const __m512i *const wg[2] = {&wt[0]->v[8 * g], &wt[G - 1]->v[8 * g]};
        lk_dots(kind, G, J, g, 0, wg, xb, wt, isum);
    }
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++)
    {
        __m512i sp[4];
        if (kind != LK_Q6_K)
            lk_bsum_pairs(xb[j], sp);
        _Pragma("GCC unroll 2") for (int k = 0; k < G; k++)
            lk_store(kind, wt[k], xb[j], sp, isum[k][j], y[k] + (size_t)j * ldy, m[k], first);
    }
}

/* ---- packed K-quants (kernels.h, "x16") -------------------------------------------------------
 * The lane kernels' arithmetic (lk_rows) over super-blocks already in lane order: a group's 16
 * rows are one stream, the quants need only their nibbles and high bits separated, and the
 * scales arrive as lane vectors. Bit for bit what lk_gemm and the register tiles give. */

/* Group g's 8 lane vectors (unsigned quants) of the packed super-block p, as lk_group gives
 * them after the transpose. */
AR_INLINE void pkk_group(const int kind, const uint8_t *p, int g, __m512i w[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (kind == LK_Q6_K) {
        /* ql byte 64h + 32(k % 2) + i (nibble k / 2), qh byte 32h + i (bits 2k, 2k + 1) */
        int h = g / 4, k = g % 4;
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
        {
            __m512i l = _mm512_loadu_si512((const void *)(p + PK_Q6_QL(h, k % 2, t)));
            __m512i q = _mm512_loadu_si512((const void *)(p + PK_Q6_QH(h, t)));
            w[t] = q6_quants(l, q, k);
        }
        return;
    }
    /* qs byte 32(g / 2) + i (nibble g % 2); Q5_K: bit g of qh byte i */
    const uint8_t *qs = p + PKK_QS(kind) + 512 * (size_t)(g / 2);
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
    {
        __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * t));
        if (g & 1)
            v = _mm512_srli_epi16(v, 4);
        v = _mm512_and_si512(v, m4);
        if (kind == LK_Q5_K) {
            __m512i hb = _mm512_loadu_si512((const void *)(p + PKK_QH5 + 64 * t));
            __mmask64 k5 = _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << g)));
            v = _mm512_mask_add_epi8(v, k5, v, _mm512_set1_epi8(16));
        }
        w[t] = v;
    }
}

/* byte k (< 4) of each 32-bit lane, as an int32 */
AR_INLINE __m512i lane_byte(__m512i v, int k)
{
    return _mm512_and_si512(_mm512_srli_epi32(v, (unsigned)(8 * k)), _mm512_set1_epi32(0xff));
}

/* The packed super-block's scales, mins and d into wt (as lk_unpack sets them). Q4_K/Q5_K:
 * k_scales_mins on 16 rows' words at once. */
AR_INLINE void pkk_scales(const int kind, const uint8_t *p, struct lk_wt *wt)
{
    if (kind == LK_Q6_K) {
        _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++)
            wt->sc[k] = _mm512_cvtepi8_epi32(_mm_loadu_si128(cv128(p + 16 * k)));
        wt->d = _mm512_cvtph_ps(_mm256_loadu_si256(cv256(p + PKK_D(kind))));
        return;
    }
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f),
                  t2 = _mm512_set1_epi32(0x30303030);
    __m512i a = _mm512_loadu_si512((const void *)p), b = _mm512_loadu_si512((const void *)(p + 64)),
            c = _mm512_loadu_si512((const void *)(p + 128));
    __m512i sc_lo = _mm512_and_si512(a, m6), m_lo = _mm512_and_si512(b, m6);
    __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(c, m4),
                                    _mm512_and_si512(_mm512_srli_epi32(a, 2), t2));
    __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), m4),
                                   _mm512_and_si512(_mm512_srli_epi32(b, 2), t2));
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
    {
        wt->sc[k] = lane_byte(sc_lo, k);
        wt->sc[4 + k] = lane_byte(sc_hi, k);
    }
    /* mins (2u, 2u + 1) as int16 pairs: bytes 0, 1 (u even) or 2, 3 of m_lo / m_hi */
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
    {
        __m512i mv = u < 2 ? m_lo : m_hi;
        int k = 2 * (u % 2);
        wt->mpair[u] = _mm512_or_si512(lane_byte(mv, k), _mm512_slli_epi32(lane_byte(mv, k + 1), 16));
    }
    wt->d = _mm512_cvtph_ps(_mm256_loadu_si256(cv256(p + PKK_D(kind))));
    wt->dmin = _mm512_cvtph_ps(_mm256_loadu_si256(cv256(p + PKK_D(kind) + 32)));
}

/* The whole packed super-block into wt, for many activation rows */
AR_INLINE void pkk_unpack(const int kind, const uint8_t *p, struct lk_wt *wt)
{
    _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) pkk_group(kind, p, g, &wt->v[8 * g]);
    pkk_scales(kind, p, wt);
}

/* Many activation rows: each super-block of 16 weight rows unpacked once per LN_JC activation
 * rows, from the file's rows (w_row apart; transposed by lk_unpack) or, when packed, from the
 * packed groups (kernels.h, "x16"; pkk_unpack). Two groups' super-blocks go side by side
 * against LK_J2 rows at a time (lk_rows2: 2 x 4 independent chains, half a broadcast per
 * vpdpbusd), an odd last group alone. On Zen 5 (2026-12-06, one thread, a 3072 x 1024 x 512
 * packed tile, best of 40 alternated runs) Q4_K went from 517-529 GOPS with one group against
 * 8 rows to 572-584 with two against 4 (3: 418, 5: 550-575, 6: about 510), and to 638-640
 * once lk_rows2 formed each row's bsum pairs once for both groups; Q6_K from 549-559 to
 * 592-605. */
AR_INLINE void lk_gemm(const int kind, const bool packed, int nb, int nr, int nc,
                       const uint8_t *w, size_t w_row, const uint8_t *x, size_t x_row, float *y,
                       size_t ldy)
{
    const size_t bs = kind == LK_Q4_K   ? sizeof(struct block_q4_K)
                      : kind == LK_Q5_K ? sizeof(struct block_q5_K)
                                        : sizeof(struct block_q6_K);
    const size_t xbs = sizeof(struct block_q8_K), gsz = (size_t)nb * PKK_B(kind);
    struct lk_wt wt[2];
    const struct lk_wt *const wtp[2] = {&wt[0], &wt[1]};
    for (int j0 = 0; j0 < nc; j0 += LN_JC) {
        int jn = AR_MIN(LN_JC, nc - j0);
        const uint8_t *xj0 = x + (size_t)j0 * x_row;
        for (int i0 = 0; i0 < nr; i0 += 32) {
            /* two groups of 16 weight rows, or the last one alone */
            const int G = nr - i0 > 16 ? 2 : 1;
            /* the next super-blocks' prefetch a share per tile (pf_tile) */
            const bool tiles = packed && G == 2 && jn > LN_PF_TILE_ROWS;
            __mmask16 m[2];
            float *yt[2];
            const uint8_t *rows[2][16], *gq[2];
            for (int k = 0; k < G; k++) {
                int ik = i0 + 16 * k, rn = AR_MIN(16, nr - ik);
                m[k] = (__mmask16)((1u << rn) - 1u);
                gq[k] = w + (size_t)(ik / 16) * gsz;
                yt[k] = y + (size_t)j0 * ldy + (size_t)ik;
                for (int r = 0; r < 16 && !packed; r++)
                    rows[k][r] = w + (size_t)(ik + AR_MIN(r, rn - 1)) * w_row;
            }
            for (int b = 0; b < nb; b++) {
                const uint8_t *xb = xj0 + (size_t)b * xbs;
                int j = 0;
                for (int k = 0; k < G; k++) {
                    if (packed) {
                        /* the next super-block of the stream (the next group's first after
                         * the last): on Zen 5, a 151936 x 1024 matrix from memory against 16
                         * rows went from 0.24-0.31 of the int8 peak to 0.32-0.48 for Q4_K and
                         * Q6_K, against 64 rows from 0.36-0.50 to 0.49-0.56. Beyond
                         * LN_PF_TILE_ROWS rows a share per tile: a qwen3moe layer's experts
                         * replayed (Zen 5, 2026-12-06, one thread) went from 466-471 to 480-510
                         * GOPS for Q4_K gate/up, 364-387 to 380-400 for Q6_K down. */
                        for (size_t o = 0; !tiles && o < PKK_B(kind); o += 64)
                            _mm_prefetch((const char *)gq[k] + (size_t)(b + 1) * PKK_B(kind) + o,
                                         _MM_HINT_T0);
                        pkk_unpack(kind, gq[k] + (size_t)b * PKK_B(kind), &wt[k]);
                    } else
                        lk_unpack(kind, rows[k], (size_t)b * bs, &wt[k]);
                }
                if (G == 2) {
                    const uint8_t *const pn[2] = {gq[0] + (size_t)(b + 1) * PKK_B(kind),
                                                  gq[1] + (size_t)(b + 1) * PKK_B(kind)};
                    for (; j + LK_J2 <= jn; j += LK_J2) {
                        float *const yj[2] = {yt[0] + (size_t)j * ldy, yt[1] + (size_t)j * ldy};
                        if (tiles)
                            pf_tile(pn, PKK_B(kind), j / LK_J2, jn / LK_J2);
                        lk_rows2(kind, 2, LK_J2, wtp, xb + (size_t)j * x_row, x_row, yj, ldy, m,
                                 b == 0);
                    }
                }
                /* the rows left over, each group alone */
                for (int k = 0; k < G; k++) {
                    const struct lk_wt *const wk[2] = {&wt[k], &wt[k]};
                    const __mmask16 mk[2] = {m[k], m[k]};
                    for (int i = j; i < jn;) {
                        float *const yk[2] = {yt[k] + (size_t)i * ldy, yt[k] + (size_t)i * ldy};
                        const uint8_t *xi = xb + (size_t)i * x_row;
                        if (i + 4 <= jn) {
                            lk_rows2(kind, 1, 4, wk, xi, x_row, yk, ldy, mk, b == 0);
                            i += 4;
                        } else {
                            lk_rows2(kind, 1, 1, wk, xi, x_row, yk, ldy, mk, b == 0);
                            i++;
                        }
                    }
                }
            }
        }
    }
}

/* The table's K-quant gemm: the lane gemm from LK_MIN_NC activation rows, the register tiles
 * below (both give the same bits) */
#define DEFINE_GEMM_BEST_K(NAME, KIND)                                                             \
    static void NAME##_gemm_best(int n, int nr, int nc, const void *w, size_t w_row,               \
                                 const void *x, size_t x_row, float *y, size_t ldy)                \
    {                                                                                              \
        if (nc >= LK_MIN_NC)                                                                       \
            lk_gemm(KIND, false, n / QK_K, nr, nc, w, w_row, x, x_row, y, ldy);                    \
        else                                                                                       \
            NAME##_gemm(n, nr, nc, w, w_row, x, x_row, y, ldy);                                    \
    }
DEFINE_GEMM_BEST_K(q4_K, LK_Q4_K)
DEFINE_GEMM_BEST_K(q5_K, LK_Q5_K)
DEFINE_GEMM_BEST_K(q6_K, LK_Q6_K)

/* J (1..4) activation rows of the packed super-block p, the quants read in registers */
AR_INLINE void pkk_few(const int kind, int J, const struct lk_wt *wt, const uint8_t *p,
                       const uint8_t *pf, const uint8_t *x, size_t x_row, float *y, size_t ldy,
                       __mmask16 m, bool first)
{
    switch (J) {
    case 4:
        lk_rows(kind, 4, wt, p, pf, x, x_row, y, ldy, m, first);
        break;
    case 3:
        lk_rows(kind, 3, wt, p, pf, x, x_row, y, ldy, m, first);
        break;
    case 2:
        lk_rows(kind, 2, wt, p, pf, x, x_row, y, ldy, m, first);
        break;
    default:
        lk_rows(kind, 1, wt, p, pf, x, x_row, y, ldy, m, first);
        break;
    }
}

/* Few rows: software prefetch of the super-block pkk_ahead on from the one computed. Unlike
 * the Q8_0 stream, a K-quant super-block takes long enough to unpack that the hardware
 * prefetchers fall behind. The lines are asked for a share per group inside lk_rows rather
 * than all at once before the block: on a matrix in L2 that ran Q4_K at 52 instead of 46
 * GB/s, Q6_K at 44 instead of 40. Where the lines should go differs between the two CPUs
 * measured (qwen3-0.6b Q4_K_M decode, 1 thread):
 * - Zen 4 (AMD family 0x19): 2 to 8 ahead into L2 gave 1.4-2x the tokens per second of no
 *   prefetch. Into L1 is slower: on 2026-12-03, CPU ms per decode step 27-29 for 8 ahead into
 *   L1 and 21-27 for 2 into L1, against 17-21 for 2, 4 or 8 ahead into L2.
 * - Zen 5 (family 0x1a, 2026-12-02): 8 ahead into L2 streamed a 151936 x 1024 Q6_K matrix from
 *   memory at 16-27 GB/s, Q4_K at 28-37; 2 ahead into L1 at 28-40 and 38-45 (4 into L1 about
 *   the same; 8 into L2 with hint T2 or NTA no better than T1). The decode went from 52-56 to
 *   62-76 tok/s on 1 thread, 101 to 118 on 2.
 * - Zen 4 again (2026-12-07), after Q4_K's high nibbles were taken in place (lk_rows), the
 *   prefetch's branch left its loop and Q6_K's ql and qh lines were interleaved (kernels.h):
 *   one thread against a 300 MB matrix from memory, best of 5 passes, rounds alternated, Q8_0
 *   (no software prefetch) at 29-33 GB/s: Q4_K with none 31.4-32.4, with 2, 4 or 8 ahead into
 *   L2 21.2-23.0, 2 into L1 23.6; Q5_K none 27.7-30.5, 2 or 8 into L2 24.0-25.6; Q6_K none
 *   22.6-27.3, 2 into L2 23.0-28.8, 8 into L2 26.0-27.5, 2 into L1 17-18. Computed faster,
 *   a super-block no longer outruns the hardware prefetchers there, and the software
 *   prefetches only get in their way. qwen3-0.6b Q4_K_M decode on 1 thread went from 54-56 to
 *   67-70 tok/s (decode efficiency 0.69-0.75 to 0.87).
 * - Zen 4, batched decode (2026-12-07, the same matrix in calls of 4864 rows, no prefetch and
 *   8 ahead into L2 alternated, median GB/s): 3072 wide Q4_K against 3 rows 11.3 -> 18.2, 4
 *   rows 10.0 -> 14.9, 8 rows 5.5 -> 8.2, Q6_K against 3 rows 10.1 -> 17.2, 8 rows 5.3 -> 8.6;
 *   1024 wide Q5_K and Q6_K against 4 and 8 rows 16-18 -> 19 and 5.4-7.1 -> 8.7-10.4, Q4_K
 *   within the noise. Against 2 rows it was no better (Q6_K 21.7-24.9 -> 16.3-22.3, Q4_K
 *   either way by turns), against one worse (above).
 * So Zen 5 and later AMD take 2 ahead into L1, Zen 4 8 ahead into L2 from 3 activation rows
 * and none below, every other CPU 8 ahead into L2 (the setting first measured; Zen 5 and
 * Intel not yet measured with the faster kernels). AR_KQ_PREFETCH=l1, l2, l2batch or off
 * overrides the choice, to measure a new CPU (select.c reads it once,
 * kernels_kq_prefetch_env, and warns about any other value). */
static const char *pkk_tune(void)
{
    const struct ar_cpu_features *cpu = ar_cpu_features_get();
    enum kq_prefetch pf = kernels_kq_prefetch_env;
    if (pf == KQ_PREFETCH_CPU)
        pf = !cpu->amd             ? KQ_PREFETCH_L2
             : cpu->family >= 0x1a ? KQ_PREFETCH_L1
             : cpu->family == 0x19 ? KQ_PREFETCH_L2_BATCH
                                   : KQ_PREFETCH_L2;
    pkk_into_l1 = pf == KQ_PREFETCH_L1;
    pkk_ahead = pf == KQ_PREFETCH_OFF ? 0 : pf == KQ_PREFETCH_L1 ? 2 : 8;
    pkk_min_rows = pf == KQ_PREFETCH_L2_BATCH ? 3 : 1;
    return pf == KQ_PREFETCH_OFF  ? "K-quant decode prefetch off (the hardware's alone)"
           : pf == KQ_PREFETCH_L1 ? "K-quant decode prefetch 2 super-blocks ahead into L1"
           : pf == KQ_PREFETCH_L2 ? "K-quant decode prefetch 8 super-blocks ahead into L2"
                                  : "K-quant decode prefetch 8 super-blocks ahead into L2 "
                                    "from 3 activation rows (none for 1 or 2)";
}

/* The batched decode order of the packed Q8_0/Q4_0/Q5_0 gemm (pk_stream): the stream on Zen 4,
 * where it measured about twice the pairs' rate; the pairs elsewhere, where they were measured
 * (Zen 5, 2026-12-06: against one group at a time in chunks, batched decode steps of 2 to 4
 * rows 1.20-1.31 single-row steps instead of 1.29-1.36; Intel Xeon family 6 model 0xcf,
 * 2026-12-07: the 650 MB matrix of pk_gemm's note against 2 and 4 rows 15.1-16.2 GB/s with
 * pairs, 15.0-16.0 with the stream, against 8 rows 12.6 and 11.7). AR_BATCH_GEMM overrides. */
static const char *pk_tune(void)
{
    const struct ar_cpu_features *cpu = ar_cpu_features_get();
    enum batch_gemm o = kernels_batch_gemm_env;
    if (o == BATCH_GEMM_CPU)
        o = cpu->amd && cpu->family == 0x19 ? BATCH_GEMM_STREAM : BATCH_GEMM_PAIRS;
    kernels_batch_gemm = o;
    return o == BATCH_GEMM_STREAM ? "batched decode gemm: one group's stream at a time"
                                  : "batched decode gemm: two groups side by side";
}

/* The variant's tuning line (kernel_ops.tuning): the two choices above and select.c's decode
 * prefetch */
static void packed_tune(struct kernel_ops *ops)
{
    static char line[320];
    const char *kq = pkk_tune(), *batch = pk_tune();
    snprintf(line, sizeof(line), "%s; %s; %s", kq, kernels_decode_prefetch_line(), batch);
    ops->tuning = line;
}
AR_INLINE void pkk_gemm(const int kind, int nb, int nr, int nc, const uint8_t *wp,
                        const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    const size_t pbs = PKK_B(kind), gsz = (size_t)nb * pbs, xbs = sizeof(struct block_q8_K);
    struct lk_wt wt;
    if (nc >= PKK_MIN_NC) {
        lk_gemm(kind, true, nb, nr, nc, wp, 0, x, x_row, y, ldy);
        return;
    }
    /* few rows (decode): group after group in address order, each super-block's quants taken
     * into registers once per 4 activation rows (past the matrix's end the prefetch reads
     * nothing: prefetches do not fault) */
    const size_t ahead = nc >= pkk_min_rows ? pkk_ahead : 0;
    for (int i0 = 0; i0 < nr; i0 += 16) {
        const uint8_t *gq = wp + (size_t)(i0 / 16) * gsz;
        __mmask16 m = (__mmask16)((1u << AR_MIN(16, nr - i0)) - 1u);
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = gq + (size_t)b * pbs, *xb = x + (size_t)b * xbs;
            pkk_scales(kind, p, &wt);
            for (int j = 0; j < nc; j += 4)
                pkk_few(kind, AR_MIN(4, nc - j), &wt, p, j == 0 && ahead ? p + ahead * pbs : NULL,
                        xb + (size_t)j * x_row, x_row, y + (size_t)j * ldy + (size_t)i0, ldy, m,
                        b == 0);
        }
    }
}

DEFINE_GEMM_PACKED(q4_K, pkk_gemm, LK_Q4_K, QK_K)
DEFINE_GEMM_PACKED(q5_K, pkk_gemm, LK_Q5_K, QK_K)
DEFINE_GEMM_PACKED(q6_K, pkk_gemm, LK_Q6_K, QK_K)
#endif

/* ---- attention over one KV head --------------------------------------------------------------
 * Many query rows (prefill gives the forward pass R rows x the group's heads) go against chunks
 * of 16 key / value rows, each chunk converted from F16 to floats once per call and then
 * serving every query row from L1 (the keys transposed into lanes, scores_lanes); a few
 * (decode: one row's heads) convert where they load, their scores in tiles of QN query rows x
 * 16 / QN key rows: 16 accumulators, summed across their lanes together by one transposing tree
 * (sum16) instead of one horizontal reduction per score.
 * Values go in tiles of up to 4 query rows x 64 columns held in registers over the rows. Head
 * sizes that are not a multiple of 16 (or above ATT_MAX_HD) take plain loops. */

#define ATT_CHUNK 16
#define ATT_MAX_HD 256

AR_INLINE float kv_elem(const uint8_t *row, int i, bool f16)
{
    if (f16) {
        ar_f16 h;
        memcpy(&h, row + 2 * i, sizeof(h));
        return f16_to_f32(h);
    }
    float f;
    memcpy(&f, row + 4 * i, sizeof(f));
    return f;
}

/* n rows of hd F16 elements, `stride` bytes apart, as floats into dst (n, hd) */
static void kv_chunk_f32(int hd, int n, const uint8_t *src, size_t stride, float *dst)
{
    for (int t = 0; t < n; t++)
        for (int i = 0; i < hd; i += 16)
            _mm512_storeu_ps(dst + (size_t)t * (size_t)hd + i,
                             _mm512_cvtph_ps(_mm256_loadu_si256(
                                 cv256(src + (size_t)t * stride + 2 * (size_t)i))));
}

/* x + y, or the larger of the two where MAX */
AR_INLINE __m512 fold2(const bool MAX, __m512 x, __m512 y)
{
    return MAX ? _mm512_max_ps(x, y) : _mm512_add_ps(x, y);
}

/* Lane j of the result = the sum (MAX: the largest) of a[j]'s 16 lanes, added in the order of
 * the AVX2 dot_f32's two 8-lane accumulators and hsum_ps: ((l + l+8) + (l+4 + l+12)) paired the
 * same way down to one, so a score equals dot_f32's bit for bit (the reference pass computes
 * its scores with dot_f32). Each step halves the lanes of every accumulator and packs two
 * accumulators into one register; taking them in transposed order (4k + i as 4i + k) leaves
 * sum j in lane j. */
AR_INLINE __m512 fold16(const bool MAX, const __m512 a[16])
{
    __m512 p[8], q[4], r[2];
    /* lanes l + l+8 (256-bit halves) of two accumulators: the first's in lanes 0-7 */
    _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++)
    {
        __m512 x = a[(2 * m) % 4 * 4 + (2 * m) / 4], y = a[(2 * m + 1) % 4 * 4 + (2 * m + 1) / 4];
        p[m] = fold2(MAX, _mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee));
    }
    /* + lanes 4 apart (128-bit halves of each half): one accumulator per 128-bit lane */
    _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++) q[n] =
        fold2(MAX, _mm512_shuffle_f32x4(p[2 * n], p[2 * n + 1], 0x88),
              _mm512_shuffle_f32x4(p[2 * n], p[2 * n + 1], 0xdd));
    /* + lanes 2 apart: two accumulators per 128-bit lane */
    _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
    {
        __m512d x = _mm512_castps_pd(q[2 * o]), y = _mm512_castps_pd(q[2 * o + 1]);
        r[o] = fold2(MAX, _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                     _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* + neighbours: four accumulators per 128-bit lane, lane 4k + i = a[4i + k] (transposed) */
    return fold2(MAX, _mm512_shuffle_ps(r[0], r[1], 0x88), _mm512_shuffle_ps(r[0], r[1], 0xdd));
}

AR_INLINE __m512 sum16(const __m512 a[16])
{
    return fold16(false, a);
}

/* Element columns [c, c + 16) of a key / value row as floats: converted from F16 in registers
 * or loaded. */
AR_INLINE __m512 kv_load16(const uint8_t *row, int c, bool f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256(cv256(row + 2 * (size_t)c)));
    return _mm512_loadu_ps((const void *)(row + 4 * (size_t)c));
}

/* Scores of QN query rows (q, hd floats apart) against the n key rows k (stride bytes apart,
 * F16 or floats): s[qi * s_stride + j] = scale * dot. Tiles of KN = 16 / QN keys; a short last
 * tile repeats the last key and stores only the real ones. */
AR_INLINE void scores_rows(const int QN, const bool F16, int hd, int n, const float *q,
                           const uint8_t *k, size_t stride, float scale, float *s,
                           size_t s_stride)
{
    const int KN = 16 / QN;
    for (int j0 = 0; j0 < n; j0 += KN) {
        const uint8_t *kr[16];
        __m512 acc[16], e;
        int valid = AR_MIN(KN, n - j0);
        _Pragma("GCC unroll 16") for (int j = 0; j < KN; j++) kr[j] =
            k + (size_t)(j0 + AR_MIN(j, valid - 1)) * stride;
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int c = 0; c < hd; c += 16) {
            __m512 kv[16];
            _Pragma("GCC unroll 16") for (int j = 0; j < KN; j++) kv[j] = kv_load16(kr[j], c, F16);
            _Pragma("GCC unroll 4") for (int qi = 0; qi < QN; qi++)
            {
                __m512 qv = _mm512_loadu_ps(q + (size_t)qi * (size_t)hd + c);
                _Pragma("GCC unroll 16") for (int j = 0; j < KN; j++) acc[qi * KN + j] =
                    _mm512_fmadd_ps(qv, kv[j], acc[qi * KN + j]);
            }
        }
        e = _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale));
        if (QN == 1 && valid == 16) {
            _mm512_storeu_ps(s + j0, e);
        } else {
            float tmp[16] __attribute__((aligned(64)));
            _mm512_store_ps(tmp, e);
            _Pragma("GCC unroll 4") for (int qi = 0; qi < QN; qi++)
                memcpy(s + (size_t)qi * s_stride + (size_t)j0, tmp + qi * KN,
                       (size_t)valid * sizeof(float));
        }
    }
}

/* scores_rows over all nq query rows: groups of 4, then 2, then 1 */
AR_INLINE void scores_all(const bool F16, int hd, int nq, int n, const float *q, const uint8_t *k,
                          size_t stride, float scale, float *s, size_t s_stride)
{
    int h = 0;
    for (; h + 4 <= nq; h += 4)
        scores_rows(4, F16, hd, n, q + (size_t)h * (size_t)hd, k, stride, scale,
                    s + (size_t)h * s_stride, s_stride);
    if (h + 2 <= nq) {
        scores_rows(2, F16, hd, n, q + (size_t)h * (size_t)hd, k, stride, scale,
                    s + (size_t)h * s_stride, s_stride);
        h += 2;
    }
    if (h < nq)
        scores_rows(1, F16, hd, n, q + (size_t)h * (size_t)hd, k, stride, scale,
                    s + (size_t)h * s_stride, s_stride);
}

/* Few query rows (decode), head size 16 * NV: per key row, its vectors converted once into
 * registers, then one dot product per query row, each summed by _mm512_reduce_add_ps (which
 * adds in sum16's order: the AVX2 dot_f32's) */
AR_INLINE void scores_few(const int NV, int nq, int nt, const float *q, const uint8_t *k,
                          size_t kv_stride, bool f16, float scale, float *s, size_t s_stride)
{
    for (int t = 0; t < nt; t++) {
        const uint8_t *kr = k + (size_t)t * kv_stride;
        __m512 kv[16];
        _Pragma("GCC unroll 16") for (int c = 0; c < NV; c++) kv[c] = kv_load16(kr, 16 * c, f16);
        for (int h = 0; h < nq; h++) {
            const float *qh = q + (size_t)h * (size_t)(16 * NV);
            __m512 a = _mm512_mul_ps(kv[0], _mm512_loadu_ps(qh));
            _Pragma("GCC unroll 16") for (int c = 1; c < NV; c++) a =
                _mm512_fmadd_ps(kv[c], _mm512_loadu_ps(qh + 16 * c), a);
            s[(size_t)h * s_stride + (size_t)t] = _mm512_reduce_add_ps(a) * scale;
        }
    }
}

/* Rows r[t] (t < 16) of 16 floats transposed in place: afterwards lane t of r[e] is element e
 * of the row that was r[t] */
AR_INLINE void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
    {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* 128-bit lane L of u[4i + k]: element 4L + k of rows 4i..4i+3 */
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
    {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
    {
        __m512 v = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
        __m512 w = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
        __m512 w2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_f32x4(v, v2, 0x88);
        r[4 + k] = _mm512_shuffle_f32x4(w, w2, 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(v, v2, 0xdd);
        r[12 + k] = _mm512_shuffle_f32x4(w, w2, 0xdd);
    }
}

/* The n (<= 16) key rows k (stride bytes apart) as floats with the keys in lanes: kt[16e + t]
 * = element e of key t (keys past n: zeros) */
AR_INLINE void kv_chunk_lanes(int hd, int n, const uint8_t *k, size_t stride, bool f16, float *kt)
{
    for (int c = 0; c < hd; c += 16) {
        __m512 r[16];
        _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) r[t] =
            t < n ? kv_load16(k + (size_t)t * stride, c, f16) : _mm512_setzero_ps();
        transpose16(r);
        _Pragma("GCC unroll 16") for (int e = 0; e < 16; e++)
            _mm512_store_ps(kt + 16 * (size_t)(c + e), r[e]);
    }
}

/* Scores of QN query rows (q, hd floats apart) against the keys of kt (kv_chunk_lanes), n of
 * them real: s[qi * s_stride + t] = scale * dot. Lane t holds key t, so a score's 16 partial
 * sums (element e goes to sum e % 16, in element order: the lanes of the AVX2 dot_f32's two
 * 8-lane accumulators) are 16 registers, and hsum_ps's tree over them is plain additions:
 * ((p0 + p8) + (p4 + p12)) + ((p2 + p10) + (p6 + p14)), then the same from p1, added last.
 * One quad of partial sums at a time keeps QN x 4 chains in flight. The four passes are
 * unrolled, so the pairs and halves stay in registers: on Zen 5 (2026-12-06, 4 queries against
 * 16 keys in L1) 3-8 % more GFLOP/s, the same bits. */
AR_INLINE void scores_lanes(const int QN, int hd, int n, const float *q, const float *kt,
                            float scale, float *s, size_t s_stride)
{
    static const int quad[4] = {0, 8, 4, 12};
    __m512 half[2][4];
    _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
    {
        __m512 pair[2][4];
        _Pragma("GCC unroll 2") for (int r2 = 0; r2 < 2; r2++)
        {
            int r = o + 2 * r2; /* quads 0 and 2 make the first half, 1 and 3 the second */
            __m512 a[4][4];
            _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++)
                _Pragma("GCC unroll 4") for (int qi = 0; qi < QN; qi++) a[m][qi] =
                    _mm512_setzero_ps();
            for (int c = 0; c < hd; c += 16) {
                _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++)
                {
                    int e = c + r + quad[m];
                    __m512 kv = _mm512_load_ps(kt + 16 * (size_t)e);
                    _Pragma("GCC unroll 4") for (int qi = 0; qi < QN; qi++) a[m][qi] =
                        _mm512_fmadd_ps(kv, _mm512_set1_ps(q[(size_t)qi * (size_t)hd + (size_t)e]),
                                        a[m][qi]);
                }
            }
            _Pragma("GCC unroll 4") for (int qi = 0; qi < QN; qi++) pair[r2][qi] =
                _mm512_add_ps(_mm512_add_ps(a[0][qi], a[1][qi]), _mm512_add_ps(a[2][qi], a[3][qi]));
        }
        _Pragma("GCC unroll 4") for (int qi = 0; qi < QN; qi++) half[o][qi] =
            _mm512_add_ps(pair[0][qi], pair[1][qi]);
    }
    __mmask16 m = (__mmask16)((1u << n) - 1u);
    _Pragma("GCC unroll 4") for (int qi = 0; qi < QN; qi++) _mm512_mask_storeu_ps(
        s + (size_t)qi * s_stride, m,
        _mm512_mul_ps(_mm512_add_ps(half[0][qi], half[1][qi]), _mm512_set1_ps(scale)));
}

/* Up to this many query rows (decode: one row's heads per KV head) F16 rows are converted in
 * registers where they are used (a row at most three times: groups of 4, 2, 1), which costs
 * less than storing and reloading a float copy (512-bit stores are slow), and value sums stay in
 * registers over all rows. */
#define ATT_DIRECT_Q 8

static void attn_scores(int hd, int nq, int nt, const float *q, const void *k, size_t kv_stride,
                        enum ar_type kt, float scale, float *s, size_t s_stride)
{
    bool f16 = kt == AR_TYPE_F16;
    float kbuf[ATT_CHUNK * ATT_MAX_HD] __attribute__((aligned(64)));
    if (hd % 16 != 0 || hd > ATT_MAX_HD) {
        for (int h = 0; h < nq; h++) {
            for (int t = 0; t < nt; t++) {
                const uint8_t *kr = (const uint8_t *)k + (size_t)t * kv_stride;
                float d = 0.0f;
                for (int i = 0; i < hd; i++)
                    d += kv_elem(kr, i, f16) * q[(size_t)h * (size_t)hd + (size_t)i];
                s[(size_t)h * s_stride + (size_t)t] = d * scale;
            }
        }
        return;
    }
    /* decode's common head sizes: faster per key row (measured on qwen3's, gemma3's and
     * qwen2's shapes at 2048 positions) */
    if (nq <= ATT_DIRECT_Q && (hd == 64 || hd == 128 || hd == 256)) {
        if (hd == 64)
            scores_few(4, nq, nt, q, k, kv_stride, f16, scale, s, s_stride);
        else if (hd == 128)
            scores_few(8, nq, nt, q, k, kv_stride, f16, scale, s, s_stride);
        else
            scores_few(16, nq, nt, q, k, kv_stride, f16, scale, s, s_stride);
        return;
    }
    /* many query rows (prefill): chunks of 16 keys turned keys-in-lanes, each serving every
     * query row from L1; at 2048 positions on Zen 5 the scores had taken 15 % of a qwen2-0.5B
     * prefill, twice the values' share for the same arithmetic, with sum16's tree */
    if (nq > ATT_DIRECT_Q) {
        for (int t0 = 0; t0 < nt; t0 += ATT_CHUNK) {
            int n = AR_MIN(ATT_CHUNK, nt - t0), h = 0;
            kv_chunk_lanes(hd, n, (const uint8_t *)k + (size_t)t0 * kv_stride, kv_stride, f16,
                           kbuf);
            for (; h + 4 <= nq; h += 4)
                scores_lanes(4, hd, n, q + (size_t)h * (size_t)hd, kbuf, scale,
                             s + (size_t)h * s_stride + t0, s_stride);
            for (; h < nq; h++)
                scores_lanes(1, hd, n, q + (size_t)h * (size_t)hd, kbuf, scale,
                             s + (size_t)h * s_stride + t0, s_stride);
        }
        return;
    }
    /* few query rows at other head sizes: chunks of 16 keys, F16 converted where loaded */
    for (int t0 = 0; t0 < nt; t0 += ATT_CHUNK) {
        int n = AR_MIN(ATT_CHUNK, nt - t0);
        const uint8_t *kc = (const uint8_t *)k + (size_t)t0 * kv_stride;
        if (f16)
            scores_all(true, hd, nq, n, q, kc, kv_stride, scale, s + t0, s_stride);
        else
            scores_all(false, hd, nq, n, q, kc, kv_stride, scale, s + t0, s_stride);
    }
}

/* out rows of HN query heads (hd floats apart), columns [c0, c0 + 16 * CV), += the n value
 * rows v (stride bytes apart, F16 or floats) weighted by s (s_stride apart per head), rows in
 * order. */
AR_INLINE void values_tile(const int HN, const int CV, const bool F16, int hd, int n,
                           const float *s, size_t s_stride, const uint8_t *v, size_t stride,
                           int c0, float *out)
{
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < CV; c++) acc[h][c] =
            _mm512_loadu_ps(out + (size_t)h * (size_t)hd + c0 + 16 * c);
    for (int t = 0; t < n; t++) {
        const uint8_t *vr = v + (size_t)t * stride;
        __m512 vv[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < CV; c++) vv[c] =
            kv_load16(vr, c0 + 16 * c, F16);
        _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
        {
            __m512 a = _mm512_set1_ps(s[(size_t)h * s_stride + (size_t)t]);
            _Pragma("GCC unroll 4") for (int c = 0; c < CV; c++) acc[h][c] =
                _mm512_fmadd_ps(a, vv[c], acc[h][c]);
        }
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < CV; c++)
            _mm512_storeu_ps(out + (size_t)h * (size_t)hd + c0 + 16 * c, acc[h][c]);
}

/* values_tile over all hd columns (slabs of 64, then of 16) and all nq heads (groups of 4, 2,
 * 1) */
AR_INLINE void values_all(const bool F16, int hd, int nq, int n, const float *s, size_t s_stride,
                          const uint8_t *v, size_t stride, float *out)
{
    for (int h = 0; h < nq;) {
        int hn = nq - h >= 4 ? 4 : nq - h >= 2 ? 2 : 1, c = 0;
        const float *sh = s + (size_t)h * s_stride;
        float *oh = out + (size_t)h * (size_t)hd;
        for (; c + 64 <= hd; c += 64) {
            if (hn == 4)
                values_tile(4, 4, F16, hd, n, sh, s_stride, v, stride, c, oh);
            else if (hn == 2)
                values_tile(2, 4, F16, hd, n, sh, s_stride, v, stride, c, oh);
            else
                values_tile(1, 4, F16, hd, n, sh, s_stride, v, stride, c, oh);
        }
        for (; c < hd; c += 16) {
            if (hn == 4)
                values_tile(4, 1, F16, hd, n, sh, s_stride, v, stride, c, oh);
            else if (hn == 2)
                values_tile(2, 1, F16, hd, n, sh, s_stride, v, stride, c, oh);
            else
                values_tile(1, 1, F16, hd, n, sh, s_stride, v, stride, c, oh);
        }
        h += hn;
    }
}

static void attn_values(int hd, int nq, int nt, const float *s, size_t s_stride, const void *v,
                        size_t kv_stride, enum ar_type kt, float *out)
{
    bool f16 = kt == AR_TYPE_F16;
    float vbuf[ATT_CHUNK * ATT_MAX_HD] __attribute__((aligned(64)));
    if (hd % 16 != 0 || hd > ATT_MAX_HD) {
        for (int h = 0; h < nq; h++) {
            for (int t = 0; t < nt; t++) {
                const uint8_t *vr = (const uint8_t *)v + (size_t)t * kv_stride;
                float a = s[(size_t)h * s_stride + (size_t)t];
                for (int i = 0; i < hd; i++)
                    out[(size_t)h * (size_t)hd + (size_t)i] += a * kv_elem(vr, i, f16);
            }
        }
        return;
    }
    /* few heads: their outputs stay in registers over all nt rows */
    if (nq <= ATT_DIRECT_Q) {
        if (f16)
            values_all(true, hd, nq, nt, s, s_stride, v, kv_stride, out);
        else
            values_all(false, hd, nq, nt, s, s_stride, v, kv_stride, out);
        return;
    }
    /* many: chunks of 16 rows, each serving every head from L1 (F16: as a float copy) */
    for (int t0 = 0; t0 < nt; t0 += ATT_CHUNK) {
        int n = AR_MIN(ATT_CHUNK, nt - t0);
        const uint8_t *vc = (const uint8_t *)v + (size_t)t0 * kv_stride;
        if (f16) {
            kv_chunk_f32(hd, n, vc, kv_stride, vbuf);
            values_all(false, hd, nq, n, s + t0, s_stride, (const uint8_t *)vbuf,
                       (size_t)hd * sizeof(float), out);
        } else {
            values_all(false, hd, nq, n, s + t0, s_stride, vc, kv_stride, out);
        }
    }
}

/* ---- Q8_0 activation rows ------------------------------------------------------------------ */

/* Rounded half away from zero, as ref.c's roundf (avx2.c's round_half_away, 16 wide) */
AR_INLINE __m512 round_half_away512(__m512 v)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, sign));
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_sub_ps(v, t)),
                                      _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm512_mask_add_ps(t, up, t, one);
}

/* Q8_0 as ref.c quantizes it: per block of 32, d = amax / 127, q = x * (1 / d) rounded half
 * away from zero. Sixteen blocks at a time: their maxima folded into one vector, so that the
 * two divisions and d's conversion to f16 run once per 16 blocks (one block at a time they
 * were scalar, and the quantizer took 5 % of a prefill on Zen 5). */
static void q8_0_from_float(const float *x, void *y, int64_t n)
{
    struct block_q8_0 *b = y;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const int64_t nb = n / QK8_0;
    for (int64_t i = 0; i < nb; i += 16) {
        const float *xb = x + i * QK8_0;
        int nk = (int)AR_MIN(16, nb - i);
        __m512 m[16];
        float id[16] __attribute__((aligned(64)));
        uint16_t dh[16] __attribute__((aligned(32)));
        /* blocks past the row's end count as zeros, without a load (masked loads had run
         * slower, and the fused FFN converts spans of 8 blocks) */
        _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++)
        {
            const float *p = xb + QK8_0 * k;
            m[k] = k < nk ? _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(p)),
                                          _mm512_andnot_ps(sign, _mm512_loadu_ps(p + 16)))
                          : _mm512_setzero_ps();
        }
        __m512 d = _mm512_div_ps(fold16(true, m), _mm512_set1_ps(127.0f));
        /* id = d != 0 ? 1 / d : 0 */
        __mmask16 nz = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_store_ps(id, _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d));
        _mm256_store_si256((__m256i *)(void *)dh,
                           _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (int k = 0; k < nk; k++) {
            __m512 iv = _mm512_set1_ps(id[k]);
            b[i + k].d = dh[k];
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
            {
                __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xb + QK8_0 * k + 16 * h), iv);
                _mm_storeu_si128((__m128i *)(void *)(b[i + k].qs + 16 * h),
                                 _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(round_half_away512(v))));
            }
        }
    }
}

/* Q8_K as ref.c quantizes it: per 256 values, the first value of largest magnitude sets
 * iscale = -127 / max, q = min(127, nearest-even(iscale * x)), d = 1 / iscale, bsums the sums
 * of each 16 q. The block stays in registers; the sums of its 16 vectors are folded into one
 * (exact: small integers in floats). The AVX2 one, with its scalar search for the first
 * maximum, took 190 ns a block on Zen 5. */
static void q8_K_from_float(const float *x, void *y, int64_t n)
{
    struct block_q8_K *b = y;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        __m512 v[16], s[16], am = _mm512_setzero_ps();
        _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++)
        {
            v[k] = _mm512_loadu_ps(xb + 16 * k);
            am = _mm512_max_ps(am, _mm512_andnot_ps(sign, v[k]));
        }
        float amax = _mm512_reduce_max_ps(am), max = 0.0f;
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof(b[i]));
            continue;
        }
        for (int k = 0; k < 16; k++) {
            __mmask16 eq =
                _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, v[k]), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (eq) {
                max = xb[16 * k + __builtin_ctz(eq)];
                break;
            }
        }
        float iscale = -127.0f / max;
        _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++)
        {
            __m512i q =
                _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v[k], _mm512_set1_ps(iscale))),
                                 _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(void *)(b[i].qs + 16 * k), _mm512_cvtsepi32_epi8(q));
            s[k] = _mm512_cvtepi32_ps(q);
        }
        _mm256_storeu_si256((__m256i *)(void *)b[i].bsums,
                            _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(fold16(false, s))));
        b[i].d = 1.0f / iscale;
    }
}

/* ---- f32 vector ops ------------------------------------------------------------------------- */

/* avx2.c's exp_ps 16 wide: the same operations (KERNELS_EXP_POLY), so the same value in every
 * lane */
AR_INLINE __m512 exp512(__m512 x)
{
    const __m512 hi = _mm512_set1_ps(88.7f), lo = _mm512_set1_ps(-87.3f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);
    __m512 p;
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    KERNELS_EXP_POLY(512, x, k, p);
    return _mm512_maskz_mov_ps(keep, p);
}

/* Lanes [i, i + 16) of an n-long row: all of them, or the last few of the row */
AR_INLINE __mmask16 tail_mask(int i, int n)
{
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
}

/* x = softmax(x): the exponentials summed in double. Whole steps of 16 unmasked (masked
 * loads and stores over rows of megabytes ran at half the speed on Zen 5), a short last step
 * masked. */
static void softmax512(int n, float *x)
{
    __m512 mv = _mm512_set1_ps(-INFINITY);
    const int n16 = n & ~15;
    const __mmask16 lm = tail_mask(n16, n);
    for (int i = 0; i < n16; i += 16)
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
    mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, lm, x + n16));
    __m512 maxv = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int i = 0; i < n16; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), maxv));
        _mm512_storeu_ps(x + i, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    if (lm) {
        __m512 e = _mm512_maskz_mov_ps(
            lm, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(lm, x + n16), maxv)));
        _mm512_mask_storeu_ps(x + n16, lm, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    __m512 iv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
    for (int i = 0; i < n16; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), iv));
    _mm512_mask_storeu_ps(x + n16, lm, _mm512_mul_ps(_mm512_maskz_loadu_ps(lm, x + n16), iv));
}

/* ref.c's rope 16 floats at a time: NEOX takes 16 pairs (both halves, the (cos, sin) pairs
 * split into two vectors), adjacent pairs 8 (cos and sin duplicated across each pair, the pair
 * swapped for the cross products). Multiplies and one add or subtract per output, as the
 * reference: the same bits. */
static void rope512(float *x, int n_heads, int head_dim, int rope_dim, bool neox, const float *cs)
{
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++, x += head_dim) {
        int i = 0;
        if (neox) {
            for (; i + 16 <= half; i += 16) {
                __m512 a = _mm512_loadu_ps(cs + 2 * i), b = _mm512_loadu_ps(cs + 2 * i + 16);
                __m512 c = _mm512_permutex2var_ps(a, even, b),
                       s = _mm512_permutex2var_ps(a, odd, b);
                __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + half);
                _mm512_storeu_ps(x + i, _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, s)));
                _mm512_storeu_ps(x + i + half,
                                 _mm512_add_ps(_mm512_mul_ps(x0, s), _mm512_mul_ps(x1, c)));
            }
        } else {
            for (; i + 8 <= half; i += 8) {
                __m512 v = _mm512_loadu_ps(x + 2 * i), t = _mm512_loadu_ps(cs + 2 * i);
                /* even lanes x0 c - x1 s; odd lanes x1 c + x0 s (an add is commutative) */
                __m512 p = _mm512_mul_ps(v, _mm512_moveldup_ps(t));
                __m512 q = _mm512_mul_ps(_mm512_permute_ps(v, 0xb1), _mm512_movehdup_ps(t));
                _mm512_storeu_ps(x + 2 * i, _mm512_mask_add_ps(_mm512_sub_ps(p, q), 0xaaaa, p, q));
            }
        }
        kernels_rope_pairs(x, i, rope_dim, neox, cs);
    }
}

/* out = silu(gate) * up = gate / (1 + e^-gate) * up */
static void silu_mul512(int n, float *out, const float *gate, const float *up)
{
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_xor_ps(g, sign))));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
    }
    if (i < n) {
        __mmask16 lm = tail_mask(i, n);
        __m512 g = _mm512_maskz_loadu_ps(lm, gate + i);
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_xor_ps(g, sign))));
        _mm512_mask_storeu_ps(out + i, lm, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lm, up + i)));
    }
}

/* ---- F16 and BF16 rows ---------------------------------------------------------------------- */

#include "float512.h"

/* ---- F32 rows ------------------------------------------------------------------------------
 * The AVX2 table's order of operations for every output (its vec_dot, which this table keeps):
 * 8 lanes; runs of 32 elements summed from zero in 4 fmas, then added to the lanes; then fmas of
 * 8 elements; the lanes added as hsum8 pairs them; the last n mod 8 products added one at a
 * time. The AVX2 tile (4 weight rows by 2 activation rows in 16 registers) loaded a run's
 * activation vectors again for every weight row: 1.5 loads per fma. A ymm tile of 8 x 2 here
 * loaded them once for all its rows (8 of the 32 registers beside 16 sums), 0.6 loads per
 * fma. A mixture of experts' router is such a matrix (128 x 2048 in Qwen3-30B-A3B): on Zen 5
 * (2026-12-06, qwen3moe Q8_0 pp512, one thread) it took 3.4 ms a layer against 4.3-4.4 with the
 * AVX2 tile, and 3.7-3.8 with 4 x 2 tiles alone. Two rows to a zmm (f32_tile2) then took it
 * to 2.4 ms (3.3-3.6 with that 8 x 2 ymm tile, same run). Blocking the activation rows (24-96
 * at a time, for their reuse from L2) measured nothing. */
/* hsum8 of acc (8 lanes), then the products of elements [k, n) one at a time */
AR_INLINE float f32_finish(__m256 acc, const uint8_t *wi, const uint8_t *xj, int k, int n)
{
    float s = hsum8(acc);
    for (int t = k; t < n; t++)
        s += load_f32(wi + 4 * (size_t)t) * load_f32(xj + 4 * (size_t)t);
    return s;
}

/* Two weight rows in one zmm: row i's 8 lanes in the lower half, row i + 1's in the upper, the
 * activation's 8 elements in both halves. Each half is the 8-lane order above, so every output
 * keeps its bits, and a 512-bit fma advances two rows' chains where a 256-bit one advanced one.
 * Tiles of RP pairs (up to 4) by RX activation rows (up to 3): 12 sums and 12 activation
 * vectors in registers, 44 loads for 48 fmas per run of 32. A last odd row is a pair of itself
 * (w_row 0 for the upper half) whose upper half is not stored (odd). */
AR_INLINE __m512 f32_pair_at(const uint8_t *w, size_t w_row, int k)
{
    const float *a = (const float *)(const void *)w + k;
    const float *b = (const float *)(const void *)(w + w_row) + k;
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}

AR_INLINE __m512 f32_both_at(const uint8_t *x, int k)
{
    return _mm512_broadcast_f32x8(_mm256_loadu_ps((const float *)(const void *)x + k));
}

AR_INLINE void f32_tile2(const int RP, const int RX, int n, const uint8_t *w, size_t w_row,
                         const uint8_t *x, size_t x_row, float *y, size_t ldy, bool odd)
{
    const size_t w_up = odd ? 0 : w_row; /* from the lower row to the upper one */
    __m512 acc[4][3];
    int k = 0;
    _Pragma("GCC unroll 4") for (int p = 0; p < RP; p++)
        _Pragma("GCC unroll 3") for (int j = 0; j < RX; j++) acc[p][j] = _mm512_setzero_ps();
    for (; k + 32 <= n; k += 32) {
        __m512 xv[4][3];
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
            _Pragma("GCC unroll 3") for (int j = 0; j < RX; j++) xv[g][j] =
                f32_both_at(x + (size_t)j * x_row, k + 8 * g);
        _Pragma("GCC unroll 4") for (int p = 0; p < RP; p++)
        {
            const uint8_t *wp = w + (size_t)(2 * p) * w_row;
            __m512 t[3];
            _Pragma("GCC unroll 3") for (int j = 0; j < RX; j++) t[j] = _mm512_setzero_ps();
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
            {
                __m512 wv = f32_pair_at(wp, w_up, k + 8 * g);
                _Pragma("GCC unroll 3") for (int j = 0; j < RX; j++) t[j] =
                    _mm512_fmadd_ps(wv, xv[g][j], t[j]);
            }
            _Pragma("GCC unroll 3") for (int j = 0; j < RX; j++) acc[p][j] =
                _mm512_add_ps(acc[p][j], t[j]);
        }
    }
    for (; k + 8 <= n; k += 8) {
        _Pragma("GCC unroll 4") for (int p = 0; p < RP; p++)
        {
            __m512 wv = f32_pair_at(w + (size_t)(2 * p) * w_row, w_up, k);
            _Pragma("GCC unroll 3") for (int j = 0; j < RX; j++) acc[p][j] =
                _mm512_fmadd_ps(wv, f32_both_at(x + (size_t)j * x_row, k), acc[p][j]);
        }
    }
    _Pragma("GCC unroll 4") for (int p = 0; p < RP; p++)
        _Pragma("GCC unroll 3") for (int j = 0; j < RX; j++)
    {
        const uint8_t *wi = w + (size_t)(2 * p) * w_row, *xj = x + (size_t)j * x_row;
        float *yj = y + (size_t)j * ldy + (size_t)(2 * p);
        yj[0] = f32_finish(_mm512_castps512_ps256(acc[p][j]), wi, xj, k, n);
        if (!odd)
            yj[1] = f32_finish(_mm512_extractf32x8_ps(acc[p][j], 1), wi + w_row, xj, k, n);
    }
}

/* RP row pairs (the next ones asked for first where pf_next, as the AVX2 loop does) against
 * every activation row, in tiles of 3 rows, then 2 or 1 */
AR_INLINE void f32_rows2(const int RP, int n, const uint8_t *w, size_t w_row, bool pf_next,
                         const uint8_t *x, size_t x_row, int nc, float *y, size_t ldy, bool odd)
{
    int j = 0;
    if (pf_next)
        for (size_t o = 0; o < (size_t)(2 * RP) * w_row; o += 64)
            _mm_prefetch((const char *)w + (size_t)(2 * RP) * w_row + o, _MM_HINT_T0);
    for (; j + 3 <= nc; j += 3)
        f32_tile2(RP, 3, n, w, w_row, x + (size_t)j * x_row, x_row, y + (size_t)j * ldy, ldy, odd);
    if (nc - j == 2)
        f32_tile2(RP, 2, n, w, w_row, x + (size_t)j * x_row, x_row, y + (size_t)j * ldy, ldy, odd);
    else if (nc - j == 1)
        f32_tile2(RP, 1, n, w, w_row, x + (size_t)j * x_row, x_row, y + (size_t)j * ldy, ldy, odd);
}

static void f32_gemm512(int n, int nr, int nc, const void *w, size_t w_row, const void *x,
                        size_t x_row, float *y, size_t ldy)
{
    const uint8_t *wp = w, *xp = x;
    int i = 0;
    /* one activation row (a GEMV): no prefetch, the rows stream in address order */
    for (; i + 8 <= nr; i += 8)
        f32_rows2(4, n, wp + (size_t)i * w_row, w_row, nc > 1 && i + 16 <= nr, xp, x_row, nc, y + i,
                  ldy, false);
    for (; i + 4 <= nr; i += 4)
        f32_rows2(2, n, wp + (size_t)i * w_row, w_row, false, xp, x_row, nc, y + i, ldy, false);
    for (; i < nr; i += 2)
        f32_rows2(1, n, wp + (size_t)i * w_row, w_row, false, xp, x_row, nc, y + i, ldy,
                  i + 1 == nr);
}

/* ---- the table ------------------------------------------------------------------------------ */

/* ---- int8 peak loop (kernels.h int8_peak): the instruction the Q8_0 kernels multiply with,
 * on 64 bytes, into KERNELS_PEAK_CHAINS independent accumulators: vpdpbusd with VNNI, else
 * vpmaddubsw + vpmaddwd + vpaddd. Without VNNI the empty asm makes the compiler treat a as new
 * at every step, so that it cannot compute the (loop-invariant) products only once. */
#ifdef __AVX512VNNI__
#define PEAK_STEP(acc) acc = _mm512_dpbusd_epi32(acc, av, bv)
#else
#define PEAK_STEP(acc)                                                                             \
    do {                                                                                           \
        __m512i u = av;                                                                            \
        __asm__ volatile("" : "+v"(u));                                                            \
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, bv), ones));        \
    } while (0)
#endif
static uint64_t int8_peak(int64_t n, const uint8_t *a, const int8_t *b, uint32_t *out)
{
    const __m512i av = _mm512_loadu_si512(a), bv = _mm512_loadu_si512(b);
    const __m512i ones = _mm512_set1_epi16(1);
    /* named accumulators, not an array: GCC then keeps each in one register */
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
            c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    _Static_assert(KERNELS_PEAK_CHAINS == 12, "one accumulator per chain");
    (void)ones;
    /* hide that they all start at zero: GCC would merge the 12 identical chains into one */
    __asm__ volatile(""
                     : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6),
                       "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
    for (int64_t r = 0; r < n; r++) {
        PEAK_STEP(c0);
        PEAK_STEP(c1);
        PEAK_STEP(c2);
        PEAK_STEP(c3);
        PEAK_STEP(c4);
        PEAK_STEP(c5);
        PEAK_STEP(c6);
        PEAK_STEP(c7);
        PEAK_STEP(c8);
        PEAK_STEP(c9);
        PEAK_STEP(c10);
        PEAK_STEP(c11);
    }
    c0 = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                          _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    c0 = _mm512_add_epi32(c0, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    _mm512_storeu_si512(out, c0);
    return (uint64_t)n * KERNELS_PEAK_CHAINS * 64;
}
#undef PEAK_STEP

void kernels_fill_avx512(struct kernel_ops *ops)
{
    ops->int8_peak = int8_peak;
#ifdef __AVX512VNNI__
    packed_tune(ops);
#else
    ops->tuning = kernels_decode_prefetch_line(); /* its F16/BF16 gemm's */
#endif
#ifdef __AVX512VNNI__
    ops->int8_peak_insn = "vpdpbusd zmm";
#else
    ops->int8_peak_insn = "vpmaddubsw+vpmaddwd zmm";
#endif
    ops->vec_dot[AR_TYPE_Q8_0] = q8_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_0] = q4_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_1] = q4_1_vec_dot;
    ops->vec_dot[AR_TYPE_Q5_0] = q5_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q5_1] = q5_1_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_K] = q4_K_vec_dot;
    ops->vec_dot[AR_TYPE_Q5_K] = q5_K_vec_dot;
    ops->vec_dot[AR_TYPE_Q6_K] = q6_K_vec_dot;

#ifdef __AVX512VNNI__
    ops->gemm[AR_TYPE_Q8_0] = q8_0_gemm_best;
    ops->gemm[AR_TYPE_Q5_0] = q5_0_gemm_best;
    ops->gemm[AR_TYPE_Q4_0] = q4_0_gemm_best;
    ops->gemm_packed[AR_TYPE_Q8_0] = q8_0_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q4_0] = q4_0_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q5_0] = q5_0_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q4_K] = q4_K_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q5_K] = q5_K_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q6_K] = q6_K_gemm_packed;
#else
    ops->gemm[AR_TYPE_Q8_0] = q8_0_gemm;
    ops->gemm[AR_TYPE_Q5_0] = q5_0_gemm;
    ops->gemm[AR_TYPE_Q4_0] = q4_0_gemm;
#endif
    ops->gemm[AR_TYPE_Q4_1] = q4_1_gemm;
    ops->gemm[AR_TYPE_Q5_1] = q5_1_gemm;
#ifdef __AVX512VNNI__
    ops->gemm[AR_TYPE_Q4_K] = q4_K_gemm_best;
    ops->gemm[AR_TYPE_Q5_K] = q5_K_gemm_best;
    ops->gemm[AR_TYPE_Q6_K] = q6_K_gemm_best;
#else
    ops->gemm[AR_TYPE_Q4_K] = q4_K_gemm;
    ops->gemm[AR_TYPE_Q5_K] = q5_K_gemm;
    ops->gemm[AR_TYPE_Q6_K] = q6_K_gemm;
#endif

    fill_float512(ops);
    ops->gemm[AR_TYPE_F32] = f32_gemm512;

    ops->attn_scores = attn_scores;
    ops->attn_values = attn_values;
    ops->from_float[AR_TYPE_Q8_0] = q8_0_from_float;
    ops->from_float[AR_TYPE_Q8_K] = q8_K_from_float;
    ops->softmax = softmax512;
    ops->silu_mul = silu_mul512;
    ops->rope = rope512;
}
