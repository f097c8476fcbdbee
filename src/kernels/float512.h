/* float512.h - F16 and BF16 weight rows for the 512-bit variants: vec_dot, gemm on the file's
 * rows and gemm_packed on the "x16" layout (kernels.h). Included by avx512.c only, so that it
 * is compiled once per variant with that variant's flags; where __AVX512BF16__ is defined
 * (avx512_bf16.c) BF16 products go through vdpbf16ps, else BF16 is widened to floats.
 *
 * One order of operations for every entry, so that a product is bit for bit the same in a
 * vec_dot, in any tile of gemm and in gemm_packed (the batch-independence rule, kernels.h):
 *   8 chains per (weight row, activation row); chain c sums, in order, the terms of the
 *   elements k with k mod 8 == c (F16, BF16 widened) or of the element pairs (2v, 2v + 1)
 *   with v mod 8 == c (vdpbf16ps: one instruction adds a pair's two exact products);
 *   a short last step (n not a multiple of the step) adds zeros to the chains it lacks;
 *   then s = (c0 + c4) + (c2 + c6) + ((c1 + c5) + (c3 + c7)) as hsum8 pairs them:
 *   c + (c + 4), then + 2, + 1.
 * A row of the file fills one ymm per step (lane = chain); a packed group holds 16 rows per
 * element (F16) or pair (BF16), so there a zmm is one element of 16 rows (lane = row) and the
 * 8 chains are 8 accumulators, reduced across registers in the same pairing. 8 chains, not 16:
 * a packed group then needs 8 registers per activation row, so it takes 3 activation rows per
 * weight load. */

/* (c + 4), (c + 2), (c + 1) over the 8 lanes */
AR_INLINE float hsum8(__m256 v)
{
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* the same pairing across 8 accumulators: lane r of the result is row r's sum */
AR_INLINE __m512 hsum8_across(__m512 *acc)
{
    for (int c = 0; c < 4; c++)
        acc[c] = _mm512_add_ps(acc[c], acc[c + 4]);
    for (int c = 0; c < 2; c++)
        acc[c] = _mm512_add_ps(acc[c], acc[c + 2]);
    return _mm512_add_ps(acc[0], acc[1]);
}

/* 8 elements (fewer: zeros after m) of a row at any byte offset, as floats */
AR_INLINE __m256 f16x8(const uint8_t *p, int m)
{
    __m128i h = m >= 8 ? _mm_loadu_si128(cv128(p))
                       : _mm_maskz_loadu_epi16((__mmask8)((1u << m) - 1u), p);
    return _mm256_cvtph_ps(h);
}

AR_INLINE __m256 bf16x8(const uint8_t *p, int m)
{
    __m128i h = m >= 8 ? _mm_loadu_si128(cv128(p))
                       : _mm_maskz_loadu_epi16((__mmask8)((1u << m) - 1u), p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

#ifdef __AVX512BF16__
/* 16 elements (8 pairs; fewer: zeros after m) */
AR_INLINE __m256bh bf16x16p(const uint8_t *p, int m)
{
    __m256i h = m >= 16 ? _mm256_loadu_si256(cv256(p))
                        : _mm256_maskz_loadu_epi16((__mmask16)((1u << m) - 1u), p);
    return (__m256bh)h;
}
#define FL_BF16_STEP 16
#else
#define FL_BF16_STEP 8
#endif

/* ---- the file's rows: register tiles of RW weight rows x RX activation rows -------------- */

AR_INLINE void fl_tile(const bool BF16, const int RW, const int RX, int n, const uint8_t *w,
                       size_t w_row, const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    __m256 acc[4][4];
    const int step = BF16 ? FL_BF16_STEP : 8;
    _Pragma("GCC unroll 4") for (int i = 0; i < RW; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < RX; j++) acc[i][j] = _mm256_setzero_ps();
    for (int k = 0; k < n; k += step) {
        int m = n - k;
        size_t off = (size_t)k * 2;
#ifdef __AVX512BF16__
        if (BF16) {
            __m256bh xv[4];
            _Pragma("GCC unroll 4") for (int j = 0; j < RX; j++) xv[j] =
                bf16x16p(x + (size_t)j * x_row + off, m);
            _Pragma("GCC unroll 4") for (int i = 0; i < RW; i++)
            {
                __m256bh wv = bf16x16p(w + (size_t)i * w_row + off, m);
                _Pragma("GCC unroll 4") for (int j = 0; j < RX; j++) acc[i][j] =
                    _mm256_dpbf16_ps(acc[i][j], wv, xv[j]);
            }
            continue;
        }
#endif
        __m256 xv[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < RX; j++) xv[j] =
            BF16 ? bf16x8(x + (size_t)j * x_row + off, m) : f16x8(x + (size_t)j * x_row + off, m);
        _Pragma("GCC unroll 4") for (int i = 0; i < RW; i++)
        {
            __m256 wv = BF16 ? bf16x8(w + (size_t)i * w_row + off, m)
                             : f16x8(w + (size_t)i * w_row + off, m);
            _Pragma("GCC unroll 4") for (int j = 0; j < RX; j++) acc[i][j] =
                _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < RW; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < RX; j++) y[(size_t)j * ldy + (size_t)i] =
            hsum8(acc[i][j]);
}

/* RX activation rows (x) against all nr weight rows: tiles of 4, then single rows */
AR_INLINE void fl_cols(const bool BF16, const int RX, int n, int nr, const uint8_t *w,
                       size_t w_row, const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    int i = 0;
    for (; i + 4 <= nr; i += 4)
        fl_tile(BF16, 4, RX, n, w + (size_t)i * w_row, w_row, x, x_row, y + i, ldy);
    for (; i < nr; i++)
        fl_tile(BF16, 1, RX, n, w + (size_t)i * w_row, w_row, x, x_row, y + i, ldy);
}

AR_INLINE void fl_gemm(const bool BF16, int n, int nr, int nc, const void *w, size_t w_row,
                       const void *x, size_t x_row, float *y, size_t ldy)
{
    const uint8_t *wb = w, *xb = x;
    int j = 0;
    if (nc == 1) { /* a row at a time: one address stream (side by side rows stream slower) */
        for (int i = 0; i < nr; i++)
            fl_tile(BF16, 1, 1, n, wb + (size_t)i * w_row, w_row, xb, x_row, y + i, ldy);
        return;
    }
    for (; j + 4 <= nc; j += 4)
        fl_cols(BF16, 4, n, nr, wb, w_row, xb + (size_t)j * x_row, x_row, y + (size_t)j * ldy, ldy);
    for (; j < nc; j++)
        fl_cols(BF16, 1, n, nr, wb, w_row, xb + (size_t)j * x_row, x_row, y + (size_t)j * ldy, ldy);
}

static void f16_gemm512(int n, int nr, int nc, const void *w, size_t w_row, const void *x,
                        size_t x_row, float *y, size_t ldy)
{
    fl_gemm(false, n, nr, nc, w, w_row, x, x_row, y, ldy);
}

static void bf16_gemm512(int n, int nr, int nc, const void *w, size_t w_row, const void *x,
                         size_t x_row, float *y, size_t ldy)
{
    fl_gemm(true, n, nr, nc, w, w_row, x, x_row, y, ldy);
}

static void f16_vec_dot512(int n, float *s, const void *x, const void *y)
{
    fl_tile(false, 1, 1, n, x, 0, y, 0, s, 1);
}

static void bf16_vec_dot512(int n, float *s, const void *x, const void *y)
{
    fl_tile(true, 1, 1, n, x, 0, y, 0, s, 1);
}

/* ---- packed groups (n a multiple of 32): XN activation rows against a group's 16 rows ----
 * F16: element k of the 16 rows is 32 bytes at 32k; BF16: pair v is 64 bytes at 64v (lane r:
 * row r's elements 2v, 2v + 1). Each weight vector is loaded (and converted) once for the XN
 * rows; activations are broadcast from a float copy (F16, BF16 widened) or as pairs. */

/* activation elements converted to floats at a time (on the stack), per activation row */
#define FL_X_CHUNK 512
/* Where the group functions ask for their weights into L2 with pf (kernels_decode_prefetch):
 * this many bytes ahead of the vectors computed. Intel Xeon (family 6 model 0xcf, 2026-12-07),
 * one thread, a 600 MB matrix 1024 wide in calls of 4864 rows from memory, GB/s of the
 * weights (a plain read: 17): BF16 against one row 12.2-12.5 without, 14.8-15.3 2 KiB ahead,
 * 15.4-15.8 at 4 to 16 KiB; F16 10.9-11.7 -> 15.0-15.5 at 4 to 16 KiB; BF16 against 2 rows
 * 10.0-10.4 -> 13.2-13.3, 3 rows 8.6-8.7 -> 12.7-13.0 at 8 KiB. */
#define FL_PF_AHEAD 8192

AR_INLINE void f16_group(const int XN, int n, const uint8_t *gp, const uint8_t *x, size_t x_row,
                         bool pf, __m512 *out)
{
    __m512 acc[3][8];
    float xf[3][FL_X_CHUNK] __attribute__((aligned(64)));
    _Pragma("GCC unroll 3") for (int j = 0; j < XN; j++)
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) acc[j][c] = _mm512_setzero_ps();
    for (int k0 = 0; k0 < n; k0 += FL_X_CHUNK) {
        int m = AR_MIN(FL_X_CHUNK, n - k0);
        for (int j = 0; j < XN; j++)
            for (int k = 0; k < m; k += 16)
                _mm512_store_ps(xf[j] + k, _mm512_cvtph_ps(_mm256_loadu_si256(
                                               cv256(x + (size_t)j * x_row + (size_t)(k0 + k) * 2))));
        for (int k = 0; k < m; k += 8, gp += 8 * 32) {
            if (pf)
                prefetch_l2(gp + FL_PF_AHEAD, 8 * 32);
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
            {
                __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256(cv256(gp + c * 32)));
                _Pragma("GCC unroll 3") for (int j = 0; j < XN; j++) acc[j][c] =
                    _mm512_fmadd_ps(wv, _mm512_set1_ps(xf[j][k + c]), acc[j][c]);
            }
        }
    }
    _Pragma("GCC unroll 3") for (int j = 0; j < XN; j++) out[j] = hsum8_across(acc[j]);
}

AR_INLINE void bf16_group(const int XN, int n, const uint8_t *gp, const uint8_t *x, size_t x_row,
                          bool pf, __m512 *out)
{
    __m512 acc[3][8];
    _Pragma("GCC unroll 3") for (int j = 0; j < XN; j++)
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) acc[j][c] = _mm512_setzero_ps();
#ifdef __AVX512BF16__
    /* 8 pairs per round: pair v into chain v mod 8 */
    for (int k = 0; k < n; k += 16, gp += 8 * 64, x += 32) {
        if (pf)
            prefetch_l2(gp + FL_PF_AHEAD, 8 * 64);
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
        {
            __m512bh wv = (__m512bh)_mm512_loadu_si512(gp + c * 64);
            _Pragma("GCC unroll 3") for (int j = 0; j < XN; j++)
            {
                int32_t xp;
                memcpy(&xp, x + (size_t)j * x_row + c * 4, 4);
                acc[j][c] = _mm512_dpbf16_ps(acc[j][c], wv, (__m512bh)_mm512_set1_epi32(xp));
            }
        }
    }
#else
    /* 4 pairs per round: element 2v into chain 2v mod 8, element 2v + 1 into the next */
    const __m512i hi = _mm512_set1_epi32((int32_t)0xffff0000u);
    for (int k = 0; k < n; k += 8, gp += 4 * 64, x += 16) {
        if (pf)
            prefetch_l2(gp + FL_PF_AHEAD, 4 * 64);
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
        {
            __m512i wv = _mm512_loadu_si512(gp + c * 64);
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(wv, hi));
            _Pragma("GCC unroll 3") for (int j = 0; j < XN; j++)
            {
                uint32_t xp;
                memcpy(&xp, x + (size_t)j * x_row + c * 4, 4);
                acc[j][2 * c] = _mm512_fmadd_ps(
                    we, _mm512_set1_ps(ar_bf16_to_f32((ar_bf16)(xp & 0xffffu))), acc[j][2 * c]);
                acc[j][2 * c + 1] = _mm512_fmadd_ps(
                    wo, _mm512_set1_ps(ar_bf16_to_f32((ar_bf16)(xp >> 16))), acc[j][2 * c + 1]);
            }
        }
    }
#endif
    _Pragma("GCC unroll 3") for (int j = 0; j < XN; j++) out[j] = hsum8_across(acc[j]);
}

#define FL_GROUP_FN(NAME, BODY, XN)                                                                \
    static void NAME(int n, const uint8_t *gp, const uint8_t *x, size_t x_row, bool pf,            \
                     __m512 *out)                                                                  \
    {                                                                                              \
        BODY(XN, n, gp, x, x_row, pf, out);                                                        \
    }
FL_GROUP_FN(f16_group3, f16_group, 3)
FL_GROUP_FN(f16_group1, f16_group, 1)
FL_GROUP_FN(bf16_group3, bf16_group, 3)
FL_GROUP_FN(bf16_group1, bf16_group, 1)

AR_INLINE void fl_gemm_packed(const bool BF16, int n, int nr, int nc, const void *wp,
                              const void *x, size_t x_row, float *y, size_t ldy)
{
    const uint8_t *gp = wp, *xb = x;
    size_t group = (size_t)n * 2 * KERNELS_PACK_ROWS;
    const bool pf = kernels_decode_prefetch == DECODE_PREFETCH_L2;
    for (int i = 0; i < nr; i += KERNELS_PACK_ROWS, gp += group) {
        int rows = AR_MIN(KERNELS_PACK_ROWS, nr - i);
        __mmask16 keep = (__mmask16)((1u << rows) - 1u);
        __m512 s[3];
        int j = 0;
        for (; j + 3 <= nc; j += 3) {
            if (BF16)
                bf16_group3(n, gp, xb + (size_t)j * x_row, x_row, pf, s);
            else
                f16_group3(n, gp, xb + (size_t)j * x_row, x_row, pf, s);
            for (int q = 0; q < 3; q++)
                _mm512_mask_storeu_ps(y + (size_t)(j + q) * ldy + (size_t)i, keep, s[q]);
        }
        for (; j < nc; j++) {
            if (BF16)
                bf16_group1(n, gp, xb + (size_t)j * x_row, x_row, pf, s);
            else
                f16_group1(n, gp, xb + (size_t)j * x_row, x_row, pf, s);
            _mm512_mask_storeu_ps(y + (size_t)j * ldy + (size_t)i, keep, s[0]);
        }
    }
}

static void f16_gemm_packed512(int n, int nr, int nc, const void *wp, const void *x,
                               size_t x_row, float *y, size_t ldy)
{
    fl_gemm_packed(false, n, nr, nc, wp, x, x_row, y, ldy);
}

static void bf16_gemm_packed512(int n, int nr, int nc, const void *wp, const void *x,
                                size_t x_row, float *y, size_t ldy)
{
    fl_gemm_packed(true, n, nr, nc, wp, x, x_row, y, ldy);
}

static void fill_float512(struct kernel_ops *ops)
{
    ops->vec_dot[AR_TYPE_F16] = f16_vec_dot512;
    ops->vec_dot[AR_TYPE_BF16] = bf16_vec_dot512;
    ops->gemm[AR_TYPE_F16] = f16_gemm512;
    ops->gemm[AR_TYPE_BF16] = bf16_gemm512;
    ops->gemm_packed[AR_TYPE_F16] = f16_gemm_packed512;
    ops->gemm_packed[AR_TYPE_BF16] = bf16_gemm_packed512;
}
