/* avx2.c - SIMD kernels for CPUs with avx2 + fma + f16c, chosen at run time by select.c.
 * Every entry matches ref.c: quantizers byte for byte, integer-sum dot products up to the
 * order of the float accumulation. Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and Q6_K weights go through lane
 * kernels (8 weight rows in the lanes of a vector, packed at load or gathered from the file's
 * layout);
 * the other types through register tiles (TILE_RW weight rows by TILE_RX activation rows) so
 * that each weight block fetched from memory serves several activation rows; with one
 * activation row a tile is a GEMV over one weight row. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels_internal.h"
#include "simd256.h"

#define AR_INLINE static inline __attribute__((always_inline))

/* ---- helpers ------------------------------------------------------------------------------ */

AR_INLINE float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AR_INLINE float f16_to_f32(ar_f16 h)
{
    return _cvtsh_ss(h);
}

/* Sum of 4 u8*s8 products per int32 lane. Safe from the int16 saturation of maddubs as long
 * as no pair reaches 2 * 128 * 128: u <= 128 with s >= -127, or u <= 63. */
AR_INLINE __m256i dot_u8s8(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* ---- register tiles ------------------------------------------------------------------------
 * BLOCK(wb, xb, &acc) adds the contribution of one weight block against one activation block
 * to a vector of partial sums; the tile sums the vectors at the end. Fully unrolled, the
 * compiler shares each weight block's loads and unpacking among the RX activation rows (and
 * each activation block's among the RW weight rows). With pf set (decode, see
 * DEFINE_GEMM_LOOP) each step asks for as many bytes from pf on into L2 as it reads, pf
 * advancing as if the tile's RW rows were one stream. */

#define TILE_RW 4
#define TILE_RX 2

#define DEFINE_TILE(NAME, WT, XT, BLOCK, RW, RX)                                                   \
    static void NAME##_tile_##RW##x##RX(int nb, const uint8_t *w, size_t w_row, const uint8_t *x,  \
                                        size_t x_row, float *y, size_t ldy, const uint8_t *pf)     \
    {                                                                                              \
        __m256 acc[RW][RX];                                                                        \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                       \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] = _mm256_setzero_ps();  \
        for (int b = 0; b < nb; b++) {                                                             \
            if (pf)                                                                                \
                prefetch_l2(pf + (size_t)b * sizeof(WT) * (RW), sizeof(WT) * (RW));                \
            _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                   \
            {                                                                                      \
                const WT *wb = (const WT *)(const void *)(w + (size_t)i * w_row) + b;              \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++)                               \
                    BLOCK(wb, (const XT *)(const void *)(x + (size_t)j * x_row) + b, &acc[i][j]);  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                       \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) y[(size_t)j * ldy + (size_t)i] =  \
                hsum_ps(acc[i][j]);                                                                \
    }

/* Touches the bytes [p, p + size) in order so that the next tile's weight rows stream in
 * sequentially while the current tile computes (several rows read side by side straight
 * from memory stream far slower than one row after another). */
AR_INLINE void prefetch_bytes(const uint8_t *p, size_t size)
{
    for (size_t k = 0; k < size; k += 64)
        _mm_prefetch((const char *)p + k, _MM_HINT_T0);
}

/* gemm: with one activation row, a weight row at a time (a GEMV at memory bandwidth), or with
 * DECODE_RW > 1 the 4 x 1 tile, for tiles whose one row is a single chain of fmas (BF16):
 * there the fma latency, not the memory, bounds a row at a time (the 4 x 1 tile computes each
 * output exactly as the 1 x 1 does). With the decode prefetch on (kernels_decode_prefetch)
 * each tile streams into L2 the bytes DECODE_AHEAD past the end of its own as it reads it,
 * a share per step (the tiles' pf); off, a 4 x 1 tile touches the next 4 rows whole into
 * L1 before it starts. Measured on Zen 5 with AR_KERNELS=avx2, that took qwen05 BF16 decode
 * efficiency 0.32-0.41 -> 0.39-0.52 on 1 thread, 0.45-0.47 -> 0.65-0.70 on 2, with the paired
 * loads below; two tiles ahead read 0.31-0.33 on 1 thread. On a Zen 3 (AMD EPYC family 0x19
 * model 1, AVX2 only, 2026-12-07; one thread, GB/s of the weights from memory, a plain read
 * about 17), against that whole-tile touch or none, the stream prefetch took BF16 rows of 896
 * from 11-12 to 16-17 (from 14 KiB past the tile's start; 7 KiB: 14-16), of 4864 from
 * 13.5-14.6 to 15.5-17.6, and F16 rows of 896 a row at a time from 13-15 to 16.6-18.4 (8 to
 * 16 KiB past the row's start).
 * Otherwise whole tiles, then the edges with narrower tiles. vec_dot is the 1 x 1 tile. The
 * tiles take nb in blocks of QK elements. */
#define DECODE_AHEAD 8192
#define DEFINE_GEMM_LOOP(NAME, QK, DECODE_RW)                                                      \
    static void NAME##_gemm(int n, int nr, int nc, const void *w, size_t w_row, const void *x,     \
                            size_t x_row, float *y, size_t ldy)                                    \
    {                                                                                              \
        const uint8_t *wp = w, *xp = x;                                                            \
        int nb = n / (QK), i = 0;                                                                  \
        if (nc == 1) {                                                                             \
            const bool pf = kernels_decode_prefetch == DECODE_PREFETCH_L2;                         \
            for (; (DECODE_RW) > 1 && i + TILE_RW <= nr; i += TILE_RW) {                           \
                const uint8_t *wi = wp + (size_t)i * w_row;                                        \
                if (!pf && i + 2 * TILE_RW <= nr)                                                  \
                    prefetch_bytes(wi + TILE_RW * w_row, TILE_RW * w_row);                         \
                NAME##_tile_4x1(nb, wi, w_row, xp, x_row, y + i, ldy,                              \
                                pf ? wi + TILE_RW * w_row + DECODE_AHEAD : NULL);                  \
            }                                                                                      \
            for (; i < nr; i++) {                                                                  \
                const uint8_t *wi = wp + (size_t)i * w_row;                                        \
                NAME##_tile_1x1(nb, wi, w_row, xp, x_row, y + i, ldy,                              \
                                pf ? wi + w_row + DECODE_AHEAD : NULL);                            \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        for (; i + TILE_RW <= nr; i += TILE_RW) {                                                  \
            const uint8_t *wi = wp + (size_t)i * w_row;                                            \
            int j = 0;                                                                             \
            if (i + 2 * TILE_RW <= nr)                                                             \
                prefetch_bytes(wi + TILE_RW * w_row, TILE_RW * w_row);                             \
            for (; j + TILE_RX <= nc; j += TILE_RX)                                                \
                NAME##_tile_4x2(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy, NULL);                               \
            for (; j < nc; j++)                                                                    \
                NAME##_tile_4x1(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy, NULL);                               \
        }                                                                                          \
        for (; i < nr; i++) {                                                                      \
            const uint8_t *wi = wp + (size_t)i * w_row;                                            \
            int j = 0;                                                                             \
            for (; j + TILE_RX <= nc; j += TILE_RX)                                                \
                NAME##_tile_1x2(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy, NULL);                               \
            for (; j < nc; j++)                                                                    \
                NAME##_tile_1x1(nb, wi, w_row, xp + (size_t)j * x_row, x_row,                      \
                                y + (size_t)j * ldy + i, ldy, NULL);                               \
        }                                                                                          \
    }                                                                                              \
    static void NAME##_vec_dot(int n, float *s, const void *x, const void *y)                      \
    {                                                                                              \
        NAME##_tile_1x1(n / (QK), x, 0, y, 0, s, 0, NULL);                                         \
    }

#define DEFINE_GEMM(NAME, WT, XT, BLOCK, QK)                                                       \
    DEFINE_TILE(NAME, WT, XT, BLOCK, 4, 2)                                                         \
    DEFINE_TILE(NAME, WT, XT, BLOCK, 4, 1)                                                         \
    DEFINE_TILE(NAME, WT, XT, BLOCK, 1, 2)                                                         \
    DEFINE_TILE(NAME, WT, XT, BLOCK, 1, 1)                                                         \
    DEFINE_GEMM_LOOP(NAME, QK, 1)

/* ---- Q4_1, Q5_1 against Q8_0 activations (Q8_0, Q4_0, Q5_0: the lane kernels below) -------- */

/* The 32 nibbles of qs (0..15) in element order: low nibbles (0..15) in the lower lane, high
 * nibbles (16..31) in the upper. */
AR_INLINE __m256i nibbles_unpack(const uint8_t *qs)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m256i q = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(q, _mm256_set1_epi8(0x0f));
}

/* The fifth bits of a Q5_0/Q5_1 block as bytes: 16 where bit e of qh (a little-endian uint32)
 * is set, 0 elsewhere, byte e for element e. */
AR_INLINE __m256i q5_high_bits(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, sizeof(h));
    /* byte e takes byte e / 8 of h (each lane holds a copy), then tests bit e % 8 */
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

/* Unsigned q (0..31) against an activation block: acc += d * yd * sum(q * y) + m * yd * sum(y). */
AR_INLINE void affine_block(__m256i q, ar_f16 dh, ar_f16 mh, const struct block_q8_0 *x,
                            __m256 *acc)
{
    __m256i y = _mm256_loadu_si256((const __m256i *)(const void *)x->qs);
    __m256i p = dot_u8s8(q, y);
    __m256i sy = dot_u8s8(_mm256_set1_epi8(1), y);
    float yd = f16_to_f32(x->d);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16_to_f32(dh) * yd), *acc);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sy), _mm256_set1_ps(f16_to_f32(mh) * yd), *acc);
}

AR_INLINE void q4_1_block(const struct block_q4_1 *w, const struct block_q8_0 *x, __m256 *acc)
{
    affine_block(nibbles_unpack(w->qs), w->d, w->m, x, acc);
}
DEFINE_GEMM(q4_1, struct block_q4_1, struct block_q8_0, q4_1_block, QK4_1)

AR_INLINE void q5_1_block(const struct block_q5_1 *w, const struct block_q8_0 *x, __m256 *acc)
{
    affine_block(_mm256_or_si256(nibbles_unpack(w->qs), q5_high_bits(w->qh)), w->d, w->m, x, acc);
}
DEFINE_GEMM(q5_1, struct block_q5_1, struct block_q8_0, q5_1_block, QK5_1)

/* ---- Q8_0, Q4_0, Q5_0: 8 weight rows in the lanes of one vector -----------------------------
 * A vector's 4-byte lane r holds 4 consecutive quants of weight row r, so one vpmaddubsw
 * against 4 bytes of an activation row broadcast to every lane advances 8 rows at once, with
 * no horizontal sums. The weights come packed (kernels.h, "x16": a group of 16 rows is one
 * stream, its lane vectors 64 bytes, the lower 32 for rows 0..7 and the upper for 8..15) or,
 * from the file's layout, gathered a lane vector at a time (vpgatherdd: 8 rows' dwords).
 * Per output and block: the exact int32 sum of the products (Q4_0, Q5_0: the unsigned quants
 * against the activations, then - off * sum(activations); Q8_0: |q| against x with q's sign,
 * each pair at most 2 * 128 * 127, within int16), then acc = fma(float(sum), d_w * d_x, acc),
 * blocks in order: the arithmetic of the AVX-512 lane kernels, so every split of rows or
 * columns, packed or not, gives the same bits. Decode reads each packed group once in
 * address order (both halves of a block together); activation rows go LN8_J at a time over
 * a group, LN8_ROWS of them before the next group. */

enum { LN8_Q8_0, LN8_Q4_0, LN8_Q5_0 };

/* Up to 4 activation rows per pass, in every lane kernel here and the K-quant ones below: a
 * lane vector of weights is loaded and unpacked (Q8_0: a vpxor and its magnitude; Q4_0, Q5_0
 * and the K-quants: nibbles, high bits) once for all of them, so the more rows share it the
 * fewer instructions per product; with more than 2 rows Q4_0's and Q5_0's products go to int32
 * at once (no registers for int16 sums), and the K-quants' sums and accumulators no longer fit
 * in the 16 registers (the compiler keeps some on the stack, touched once per sub-block or
 * super-block). Zen 3, gemm_peak's tiles, medians of 5-7, fraction of the int8 peak with 2 -> 4
 * rows: Q8_0 4864 x 896 x 512 0.59 -> 0.62; Q4_0 0.78 -> 0.89; Q5_0 (2 -> 3 -> 4) 256 x 896 x 64,
 * the forward pass's calls, 0.62 -> 0.71 -> 0.77; Q4_K 3072 x 1024 x 512 0.71 -> 0.85 (3 rows:
 * 0.77), 256 x 4864 x 64 0.75 -> 0.88; Q6_K 0.49 -> 0.59 and 0.51 -> 0.62; Q5_K 0.48 -> 0.61. */
#define LN8_J 4
/* FN(kind, packed, J, ...) with J the constant jn (1 .. LN8_J): each pass size gets its own
 * unrolled copy of the lane and K-quant kernels */
_Static_assert(LN8_J == 4, "LN8_PASS names every pass size up to LN8_J");
#define LN8_PASS(FN, jn, kind, packed, ...)                                                        \
    do {                                                                                           \
        if ((jn) == 4)                                                                             \
            FN(kind, packed, 4, __VA_ARGS__);                                                      \
        else if ((jn) == 3)                                                                        \
            FN(kind, packed, 3, __VA_ARGS__);                                                      \
        else if ((jn) == 2)                                                                        \
            FN(kind, packed, 2, __VA_ARGS__);                                                      \
        else                                                                                       \
            FN(kind, packed, 1, __VA_ARGS__);                                                      \
    } while (0)
/* Activation rows are taken LN8_ROWS at a time: each group of 16 weight rows, read once from
 * memory (or L3), serves them all from L1/L2, LN8_J rows per pass over the group. Before, the
 * passes went over the whole matrix, so a batched decode step of 4 sequences read the weights
 * twice from beyond L2 (see ln8_gemm). */
#define LN8_ROWS 16
/* activation scales and sums prepared at once, per row and block: a chunk of blocks is
 * LN8_SCALES over the rows taken (one row: 4096 blocks, rows of up to 131072; 16 rows: 256),
 * so that decode reads each group's stream in one piece */
#define LN8_SCALES 4096
/* With the decode prefetch on (kernels_decode_prefetch), the packed block this many on is
 * asked for into L2 as each is computed: without, the hardware prefetchers fell behind the
 * stream on an Intel Xeon (family 6 model 0xcf, 2026-12-07; one thread, a 400 MB Q8_0 matrix
 * 1024 wide from memory in calls of 4864 rows, GB/s of the weights, a plain read 17): one row
 * 10.5-10.8 -> 13.1-13.4 at 4 blocks ahead, 15.1-15.2 at 8 or 16, 15.0-15.6 at 32; two rows
 * 9.3-9.6 -> 13.0-13.1 at 16; Q4_0 one row 9.6-9.9 -> 13.3-14.3 at 16. */
#define LN8_AHEAD 16

/* bytes of one block of a packed group: quants, then (Q5_0) the high-bit plane, then 16 d */
#define LN8_PQ(kind) ((kind) == LN8_Q8_0 ? 512 : (kind) == LN8_Q5_0 ? 320 : 256)
#define LN8_PB(kind) (LN8_PQ(kind) + 32)

/* Where one half (8 rows) of a group's block comes from: packed, the group's block (p); from
 * the file, the block of the group's first row (p) and the half's 8 rows' offsets from it
 * (vidx). */
struct ln8_src {
    const uint8_t *p;
    __m256i vidx;
};

/* The dword at byte off of each of the 8 rows' block (packed: lane vector at pk_off) */
AR_INLINE __m256i ln8_dwords(const bool packed, const struct ln8_src *s, int h, size_t pk_off,
                             size_t file_off)
{
    if (packed)
        return _mm256_loadu_si256((const __m256i *)(const void *)(s->p + pk_off + 32 * (size_t)h));
    return _mm256_i32gather_epi32((const int *)(const void *)(s->p + file_off), s->vidx, 1);
}

/* The f16 in the low (hi 0) or high (hi 1) half of each of 8 gathered dwords, as floats */
AR_INLINE __m256 ln8_f16_halves(__m256i dw, int hi)
{
    const char o = (char)(2 * hi);
    const __m256i pick = _mm256_setr_epi8(
        o, (char)(o + 1), (char)(o + 4), (char)(o + 5), (char)(o + 8), (char)(o + 9),
        (char)(o + 12), (char)(o + 13), -1, -1, -1, -1, -1, -1, -1, -1, o, (char)(o + 1),
        (char)(o + 4), (char)(o + 5), (char)(o + 8), (char)(o + 9), (char)(o + 12), (char)(o + 13),
        -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i d = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dw, pick), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(d));
}

/* The 8 rows' block scales d as floats (from the file: each block's first field) */
AR_INLINE __m256 ln8_scales(const int kind, const bool packed, const struct ln8_src *s, int h)
{
    if (packed)
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)(s->p + LN8_PQ(kind) + 16 * (size_t)h)));
    return ln8_f16_halves(ln8_dwords(false, s, h, 0, 0), 0);
}

/* The two halves' sources of the group of 16 rows whose block is at p (packed: in the group's
 * stream; else row 0's block in the file, the other rows w_row apart; rows past rn repeat the
 * last, as packing does) */
AR_INLINE void ln8_group_src(const bool packed, const uint8_t *p, size_t w_row, int rn,
                             struct ln8_src src[2])
{
    int32_t o[16];
    src[0].p = src[1].p = p;
    if (packed)
        return;
    for (int r = 0; r < 16; r++)
        o[r] = (int32_t)((size_t)AR_MIN(r, rn - 1) * w_row);
    for (int h = 0; h < 2; h++)
        src[h].vidx = _mm256_loadu_si256((const __m256i *)(const void *)(o + 8 * h));
}

/* Q5_0's fifth bits of lane vector u (quants 4u..4u+3 of each row) at bit 4 of each byte:
 * packed, from the high-bit plane e (bit u of each byte); from the file, from each row's qh
 * (bit 4u + j of the dword for byte j) */
AR_INLINE __m256i ln8_q5_high(const bool packed, __m256i e, int u)
{
    const __m256i b4 = _mm256_set1_epi8(0x10);
    if (packed)
        return _mm256_and_si256(u <= 4 ? _mm256_slli_epi16(e, 4 - u) : _mm256_srli_epi16(e, u - 4),
                                b4);
    /* the nibble of bits 4u..4u+3, its bit j moved to bit 0 of byte j, then to bit 4 */
    __m256i t = _mm256_and_si256(_mm256_srli_epi32(e, 4 * u), _mm256_set1_epi32(0xf));
    t = _mm256_and_si256(_mm256_mullo_epi32(t, _mm256_set1_epi32(0x00204081)),
                         _mm256_set1_epi32(0x01010101));
    return _mm256_slli_epi32(t, 4);
}

/* J activation rows (quants xq[j], block b of row j at xq[j] + b * sizeof(struct block_q8_0),
 * scales and offset sums xd/xs at j * xn + b) against blocks [0, kb) of one group's
 * two halves (src[2]; step: bytes from one block to the next): acc[j][h] as above. */
AR_INLINE void ln8_blocks(const int kind, const bool packed, const int J, int kb,
                          struct ln8_src src[2], size_t step, const int8_t *const xq[LN8_J],
                          const float *xd, const int32_t *xs, int xn, bool pf, __m256 acc[LN8_J][2])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const size_t xbs = sizeof(struct block_q8_0);
    for (int b = 0; b < kb; b++) {
        if (pf)
            prefetch_l2(src[0].p + LN8_AHEAD * step, step);
        __m256i p[LN8_J][2];
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) p[j][0] = p[j][1] =
            _mm256_setzero_si256();
        if (kind == LN8_Q8_0) {
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
            {
                __m256i w[2], a[2];
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                {
                    w[h] = ln8_dwords(packed, &src[h], h, 64 * (size_t)t, 2 + 4 * (size_t)t);
                    if (packed) /* stored as q + 128 */
                        w[h] = _mm256_xor_si256(w[h], _mm256_set1_epi8((char)0x80));
                    a[h] = _mm256_sign_epi8(w[h], w[h]);
                }
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
                {
                    __m256i xb = _mm256_set1_epi32(load_i32(xq[j] + (size_t)b * xbs + 4 * t));
                    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                    {
                        p[j][h] = _mm256_add_epi32(
                            p[j][h],
                            _mm256_madd_epi16(
                                _mm256_maddubs_epi16(a[h], _mm256_sign_epi8(xb, w[h])), ones));
                        /* kept a chain per output: gcc otherwise reassociated the 8 steps'
                         * sums and spilled the products to the stack (gemm_peak Q8_0 tile,
                         * Zen 3: 0.53 -> 0.57 of the int8 peak, median of 6) */
                        __asm__("" : "+x"(p[j][h]));
                    }
                }
            }
        } else {
            /* nibble vector t holds lane vectors t (low nibbles) and t + 4 (high); int16 sums of
             * up to 16 products of at most 15 * 127 (Q4_0), or 8 of 31 * 127 (Q5_0) */
            const int per = kind == LN8_Q4_0 ? 4 : 2;
            __m256i e[2];
            if (kind == LN8_Q5_0)
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) e[h] =
                    ln8_dwords(packed, &src[h], h, 256, 2);
            __m256i s16[LN8_J][2];
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
            {
                __m256i lo[2], hi[2];
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                {
                    __m256i q = ln8_dwords(packed, &src[h], h, 64 * (size_t)t,
                                           (kind == LN8_Q5_0 ? 6 : 2) + 4 * (size_t)t);
                    lo[h] = _mm256_and_si256(q, m4);
                    hi[h] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    if (kind == LN8_Q5_0) {
                        lo[h] = _mm256_or_si256(lo[h], ln8_q5_high(packed, e[h], t));
                        hi[h] = _mm256_or_si256(hi[h], ln8_q5_high(packed, e[h], t + 4));
                    }
                }
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
                {
                    const int8_t *q = xq[j] + (size_t)b * xbs;
                    __m256i xa = _mm256_set1_epi32(load_i32(q + 4 * t));
                    __m256i xb = _mm256_set1_epi32(load_i32(q + 16 + 4 * t));
                    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                    {
                        __m256i d = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xa),
                                                     _mm256_maddubs_epi16(hi[h], xb));
                        if (J > 2) { /* no registers for int16 sums */
                            p[j][h] = _mm256_add_epi32(p[j][h], _mm256_madd_epi16(d, ones));
                            continue;
                        }
                        s16[j][h] = t % per == 0 ? d : _mm256_add_epi16(s16[j][h], d);
                        if (t % per == per - 1)
                            p[j][h] = _mm256_add_epi32(p[j][h], _mm256_madd_epi16(s16[j][h], ones));
                    }
                }
            }
        }
        __m256 wd[2];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) wd[h] =
            ln8_scales(kind, packed, &src[h], h);
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
        {
            __m256 xdb = _mm256_set1_ps(xd[(size_t)j * xn + b]);
            if (kind != LN8_Q8_0) /* Q8_0's offset is 0 */
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) p[j][h] =
                    _mm256_add_epi32(p[j][h], _mm256_set1_epi32(xs[(size_t)j * xn + b]));
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) acc[j][h] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[j][h]), _mm256_mul_ps(wd[h], xdb), acc[j][h]);
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) src[h].p += step;
    }
}

/* The first n (any count) of 8 floats at p: loaded, the rest zero; stored, the rest untouched */
AR_INLINE __m256i ln8_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AR_INLINE __m256 ln8_load(const float *p, int n)
{
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, ln8_mask(n));
}

AR_INLINE void ln8_store(float *p, int n, __m256 v)
{
    if (n >= 8)
        _mm256_storeu_ps(p, v);
    else if (n > 0)
        _mm256_maskstore_ps(p, ln8_mask(n), v);
}

/* Rows [0, nr) of w (packed: the group stream, kernels.h "x16"; else the file's rows, w_row
 * bytes apart) times nc activation rows: y[j * ldy + i]. Activation rows LN8_ROWS at a time,
 * blocks LN8_SCALES / rows at a time, then each group of 16 weight rows against them, LN8_J per
 * pass; every output's blocks in order, so any order of rows and passes gives the same bits.
 */
AR_INLINE void ln8_gemm(const int kind, const bool packed, int nb, int nr, int nc, const uint8_t *w,
                        size_t w_row, const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    static _Thread_local float fxd[LN8_SCALES];
    static _Thread_local int32_t fxs[LN8_SCALES];
    const int32_t off = kind == LN8_Q8_0 ? 0 : kind == LN8_Q5_0 ? 16 : 8;
    const size_t bs = kind == LN8_Q8_0   ? sizeof(struct block_q8_0)
                      : kind == LN8_Q5_0 ? sizeof(struct block_q5_0)
                                         : sizeof(struct block_q4_0);
    const size_t gsz = (size_t)nb * LN8_PB(kind), step = packed ? LN8_PB(kind) : bs;
    /* the first pass over a group's chunk only: the later ones find it in L1/L2 */
    const bool pf = packed && kernels_decode_prefetch == DECODE_PREFETCH_L2;
    for (int r0 = 0; r0 < nc; r0 += LN8_ROWS) {
        int rows = AR_MIN(LN8_ROWS, nc - r0);
        const int chunk = LN8_SCALES / rows;
        for (int c0 = 0; c0 < nb; c0 += chunk) {
            int kb = AR_MIN(chunk, nb - c0);
            for (int j = 0; j < rows; j++) {
                const struct block_q8_0 *xb =
                    (const struct block_q8_0 *)(const void *)(x + (size_t)(r0 + j) * x_row) + c0;
                for (int b = 0; b < kb; b++) {
                    fxd[j * chunk + b] = f16_to_f32(xb[b].d);
                    fxs[j * chunk + b] = off ? -off * q8_0_block_sum(&xb[b]) : 0;
                }
            }
            for (int i0 = 0; i0 < nr; i0 += 16) {
                int rn = AR_MIN(16, nr - i0);
                const uint8_t *g0 = packed ? w + (size_t)(i0 / 16) * gsz + (size_t)c0 * step
                                           : w + (size_t)i0 * w_row + (size_t)c0 * bs;
                for (int j0 = 0, jn; j0 < rows; j0 += jn) {
                    const int8_t *xq[LN8_J];
                    float *yj[LN8_J];
                    struct ln8_src src[2];
                    __m256 acc[LN8_J][2];
                    jn = AR_MIN(LN8_J, rows - j0);
                    ln8_group_src(packed, g0, w_row, rn, src);
                    for (int j = 0; j < jn; j++) {
                        const uint8_t *xr = x + (size_t)(r0 + j0 + j) * x_row;
                        xq[j] = ((const struct block_q8_0 *)(const void *)xr)[c0].qs;
                        yj[j] = y + (size_t)(r0 + j0 + j) * ldy + (size_t)i0;
                        for (int h = 0; h < 2; h++)
                            acc[j][h] =
                                c0 > 0 ? ln8_load(yj[j] + 8 * h, rn - 8 * h) : _mm256_setzero_ps();
                    }
                    const float *xd = fxd + j0 * chunk;
                    const int32_t *xs = fxs + j0 * chunk;
                    const bool pf1 = pf && j0 == 0;
                    LN8_PASS(ln8_blocks, jn, kind, packed, kb, src, step, xq, xd, xs, chunk, pf1,
                             acc);
                    for (int j = 0; j < jn; j++)
                        for (int h = 0; h < 2; h++)
                            ln8_store(yj[j] + 8 * h, rn - 8 * h, acc[j][h]);
                }
            }
        }
    }
}

#define DEFINE_LN8(NAME, KIND, WT)                                                                 \
    static void NAME##_gemm(int n, int nr, int nc, const void *w, size_t w_row, const void *x,     \
                            size_t x_row, float *y, size_t ldy)                                    \
    {                                                                                              \
        ln8_gemm(KIND, false, n / 32, nr, nc, w, w_row, x, x_row, y, ldy);                         \
    }                                                                                              \
    static void NAME##_gemm_packed(int n, int nr, int nc, const void *wp, const void *x,           \
                                   size_t x_row, float *y, size_t ldy)                             \
    {                                                                                              \
        ln8_gemm(KIND, true, n / 32, nr, nc, wp, 0, x, x_row, y, ldy);                             \
    }                                                                                              \
    static void NAME##_vec_dot(int n, float *s, const void *w, const void *x)                      \
    {                                                                                              \
        ln8_gemm(KIND, false, n / 32, 1, 1, w, sizeof(WT), x, 0, s, 1);                            \
    }
DEFINE_LN8(q8_0, LN8_Q8_0, struct block_q8_0)
DEFINE_LN8(q4_0, LN8_Q4_0, struct block_q4_0)
DEFINE_LN8(q5_0, LN8_Q5_0, struct block_q5_0)

/* ---- Q4_K, Q5_K and Q6_K: 8 weight rows in the lanes of one vector --------------------------
 * As the lane kernels above, over super-blocks of 256 (kernels.h, "x16": scales first, then d
 * (and dmin), then the quants as lane vectors; or gathered from the file's rows). Per output
 * and super-block the exact int32 sum of Q4_K's (Q5_K's) sum_j sc_j * sum(q * x over sub-block
 * j), and of its mins sum_j m_j * (activation sum of sub-block j); or Q6_K's
 * sum_s sc_s * (sum(q * x) - 32 * bsum_s); then acc = fma(float(isum), d * xd, acc) and for
 * Q4_K and Q5_K acc = fnmadd(float(mins), dmin * xd, acc): the arithmetic of the AVX-512 lane
 * kernels, so packed and unpacked, any split, and vec_dot give the same bits. The int16 sums
 * of vpmaddubsw stay within range: Q4_K 16 products of 15 * 127 before one vpmaddwd by the
 * sub-block's scale, Q5_K 8 of 31 * 127, Q6_K 4 of 63 * 127. */

enum { LK8_Q4_K, LK8_Q5_K, LK8_Q6_K };

/* bytes of a packed super-block of 16 rows, and where its fields lie (kernels.h) */
#define LK8_PB(kind) ((kind) == LK8_Q4_K ? 2304 : (kind) == LK8_Q5_K ? 2816 : 3392)

/* One half's (8 rows') int16 pairs for vpmaddwd, built from the rows' scale bytes:
 * pair (lane byte a, lane byte b) of v as int16s, unsigned (Q4_K) or signed (Q6_K) */
AR_INLINE __m256i lk8_pair(__m256i v, int a, int b, bool sign)
{
    /* each byte to the high byte of its int16, then shifted down */
    const __m256i sel =
        _mm256_setr_epi8(-1, (char)a, -1, (char)b, -1, (char)(4 + a), -1, (char)(4 + b), -1,
                         (char)(8 + a), -1, (char)(8 + b), -1, (char)(12 + a), -1, (char)(12 + b),
                         -1, (char)a, -1, (char)b, -1, (char)(4 + a), -1, (char)(4 + b), -1,
                         (char)(8 + a), -1, (char)(8 + b), -1, (char)(12 + a), -1, (char)(12 + b));
    __m256i t = _mm256_shuffle_epi8(v, sel);
    return sign ? _mm256_srai_epi16(t, 8) : _mm256_srli_epi16(t, 8);
}

/* Q4_K: the rows' 8 six-bit scales (sc) and mins (mn), bytes k of each lane: sc[0] = sc0..3,
 * sc[1] = sc4..7, mn likewise (from the 12 bytes' three dwords a, b, c) */
AR_INLINE void lk8_q4k_scales(__m256i a, __m256i b, __m256i c, __m256i sc[2], __m256i mn[2])
{
    const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f),
                  t2 = _mm256_set1_epi8(0x30);
    sc[0] = _mm256_and_si256(a, m6);
    mn[0] = _mm256_and_si256(b, m6);
    sc[1] = _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_srli_epi32(a, 2), t2));
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(c, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi32(b, 2), t2));
}

/* Q6_K: the rows' int8 scales a and b of a super-block as an int16 pair per lane, a and b in
 * the same 4 scales (a / 4 == b / 4: the callers ask for (s, s) and (2u, 2u + 1)); packed: byte
 * planes of 16 rows at 16 * s; file: the 16 bytes at 192 */
AR_INLINE __m256i lk8_q6k_scale_pair(const bool packed, const struct ln8_src *s, int h, int a,
                                     int b)
{
    if (packed) {
        __m128i pa =
            _mm_loadl_epi64((const __m128i *)(const void *)(s->p + 16 * (size_t)a + 8 * (size_t)h));
        __m128i pb =
            _mm_loadl_epi64((const __m128i *)(const void *)(s->p + 16 * (size_t)b + 8 * (size_t)h));
        return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(pa, pb));
    }
    return lk8_pair(ln8_dwords(false, s, h, 0, 192 + 4 * (size_t)(a / 4)), a % 4, b % 4, true);
}

/* Where on (the packed layout, a group's first pass), software prefetch into L2 of the
 * super-block LK8_AHEAD further on, an eighth of its lines per group g: as on AVX-512 (see
 * pkk_tune there), a super-block takes long enough to compute that the hardware prefetchers
 * fall behind the stream. Past the matrix's end it reads nothing (prefetches do not fault). */
#define LK8_AHEAD 8
AR_INLINE void lk8_prefetch(const bool on, const uint8_t *p, size_t bytes, int g)
{
    size_t lines = bytes / 64, l0 = lines * (size_t)g / 8, l1 = lines * (size_t)(g + 1) / 8;
    if (on)
        prefetch_l2(p + 64 * l0, 64 * (l1 - l0));
}

/* J activation rows (their super-blocks at xb[j]) against kb super-blocks of one group's two
 * halves (src; step bytes apart): acc[j][h] as above. */
AR_INLINE void lk8_blocks(const int kind, const bool packed, const int J, int kb,
                          struct ln8_src src[2], size_t step,
                          const struct block_q8_K *const xb0[LN8_J], bool pf, __m256 acc[LN8_J][2])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int b = 0; b < kb; b++) {
        const struct block_q8_K *xb[LN8_J];
        __m256i isum[LN8_J][2], ms[LN8_J][2];
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
        {
            xb[j] = xb0[j] + b;
            isum[j][0] = isum[j][1] = ms[j][0] = ms[j][1] = _mm256_setzero_si256();
        }
        if (kind != LK8_Q6_K) {
            /* Q5_K: the quants after the 32 bytes of fifth bits (packed: 8 lane vectors); an
             * int16 sum takes 4 lane vectors' products */
            const size_t qs_pk = kind == LK8_Q5_K ? 768 : 256, qs_file = kind == LK8_Q5_K ? 48 : 16;
            const int per = kind == LK8_Q5_K ? 4 : 8;
            const __m256i m10 = _mm256_set1_epi8(0x10);
            __m256i sc[2][2], mn[2][2];
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) lk8_q4k_scales(
                ln8_dwords(packed, &src[h], h, 0, 4), ln8_dwords(packed, &src[h], h, 64, 8),
                ln8_dwords(packed, &src[h], h, 128, 12), sc[h], mn[h]);
            for (int g = 0; g < 8; g++) {
                __m256i s16[LN8_J][2];
                lk8_prefetch(packed && pf, src[0].p + LK8_AHEAD * step, LK8_PB(kind), g);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
                {
                    __m256i w[2];
                    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                    {
                        w[h] = ln8_dwords(packed, &src[h], h,
                                          qs_pk + 512 * (size_t)(g / 2) + 64 * (size_t)t,
                                          qs_file + 32 * (size_t)(g / 2) + 4 * (size_t)t);
                        if (g & 1)
                            w[h] = _mm256_srli_epi16(w[h], 4);
                        w[h] = _mm256_and_si256(w[h], m4);
                        if (kind == LK8_Q5_K) {
                            /* bit g of qh bytes 4t..4t+3 to bit 4 */
                            __m256i e = ln8_dwords(packed, &src[h], h, 256 + 64 * (size_t)t,
                                                   16 + 4 * (size_t)t);
                            e = g <= 4 ? _mm256_slli_epi16(e, 4 - g) : _mm256_srli_epi16(e, g - 4);
                            w[h] = _mm256_or_si256(w[h], _mm256_and_si256(e, m10));
                        }
                    }
                    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
                    {
                        __m256i xv = _mm256_set1_epi32(load_i32(xb[j]->qs + 32 * g + 4 * t));
                        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                        {
                            __m256i d = _mm256_maddubs_epi16(w[h], xv);
                            s16[j][h] = t % per == 0 ? d : _mm256_add_epi16(s16[j][h], d);
                        }
                    }
                    if (t % per == per - 1)
                        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                        {
                            __m256i scp = lk8_pair(sc[h][g / 4], g % 4, g % 4, false);
                            _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) isum[j][h] =
                                _mm256_add_epi32(isum[j][h], _mm256_madd_epi16(s16[j][h], scp));
                        }
                }
            }
            /* mins: pairs (m_2u, m_2u+1) against the activation sums of sub-blocks 2u, 2u + 1 */
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
            {
                __m256i mp[2];
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) mp[h] =
                    lk8_pair(mn[h][u / 2], 2 * (u % 2), 2 * (u % 2) + 1, false);
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
                {
                    const int16_t *bs = xb[j]->bsums;
                    int32_t s0 = bs[4 * u] + bs[4 * u + 1], s1 = bs[4 * u + 2] + bs[4 * u + 3];
                    __m256i sp = _mm256_set1_epi32((int32_t)(((uint32_t)s1 << 16) | (uint16_t)s0));
                    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) ms[j][h] =
                        _mm256_add_epi32(ms[j][h], _mm256_madd_epi16(mp[h], sp));
                }
            }
        } else {
            /* Lane vectors in pairs (t = 2tp, 2tp + 1: one int16 sum of 4 products), both
             * unpacked before the activation rows take them, so that each sum lives in a
             * register for one vpmaddwd; k (which nibble and which 2 high bits) a constant of
             * the unrolled loop, so that the shifts are immediates. Zen 3, gemm_peak's Q6_K
             * tile, medians of 7: 3072 x 1024 x 512 0.57 -> 0.66, 1024 x 3072 x 64 0.62 -> 0.68
             * (t-pairs alone: 0.63, 0.65). */
            for (int hh = 0; hh < 2; hh++)
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
                {
                    const int g = 4 * hh + k;
                    __m256i scp[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                    lk8_prefetch(packed && pf, src[0].p + LK8_AHEAD * step, LK8_PB(kind), g);
                    _Pragma("GCC unroll 4") for (int tp = 0; tp < 4; tp++)
                    {
                        __m256i w[2][2];
                        /* sub-block 2g + tp / 2 of 16 elements: its scale as an int16 pair */
                        if (tp % 2 == 0)
                            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) scp[h] =
                                lk8_q6k_scale_pair(packed, &src[h], h, 2 * g + tp / 2,
                                                   2 * g + tp / 2);
                        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++)
                            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                        {
                            const size_t t = 2 * (size_t)tp + (size_t)u;
                            __m256i l = ln8_dwords(packed, &src[h], h, PK_Q6_QL(hh, k % 2, t),
                                                   64 * (size_t)hh + 32 * (size_t)(k % 2) + 4 * t);
                            __m256i q = ln8_dwords(packed, &src[h], h, PK_Q6_QH(hh, t),
                                                   128 + 32 * (size_t)hh + 4 * t);
                            if (k >= 2)
                                l = _mm256_srli_epi16(l, 4);
                            q = k < 2 ? _mm256_slli_epi16(q, 4 - 2 * k)
                                      : _mm256_srli_epi16(q, 2 * k - 4);
                            w[u][h] =
                                _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(q, m30));
                        }
                        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
                        {
                            const int8_t *xq = xb[j]->qs + 32 * g + 8 * tp;
                            __m256i x0 = _mm256_set1_epi32(load_i32(xq)),
                                    x1 = _mm256_set1_epi32(load_i32(xq + 4));
                            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                            {
                                __m256i d = _mm256_add_epi16(_mm256_maddubs_epi16(w[0][h], x0),
                                                             _mm256_maddubs_epi16(w[1][h], x1));
                                isum[j][h] =
                                    _mm256_add_epi32(isum[j][h], _mm256_madd_epi16(d, scp[h]));
                            }
                        }
                    }
                }
            /* - 32 * sum_s sc_s * bsum_s, the scales in pairs (2u, 2u + 1) */
            _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++)
            {
                __m256i sp2[2];
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) sp2[h] =
                    lk8_q6k_scale_pair(packed, &src[h], h, 2 * u, 2 * u + 1);
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
                {
                    const int16_t *bs = xb[j]->bsums;
                    __m256i bp = _mm256_set1_epi32(
                        (int32_t)(((uint32_t)(uint16_t)bs[2 * u + 1] << 16) | (uint16_t)bs[2 * u]));
                    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) ms[j][h] =
                        _mm256_add_epi32(ms[j][h], _mm256_madd_epi16(sp2[h], bp));
                }
            }
            _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) isum[j][h] =
                    _mm256_sub_epi32(isum[j][h], _mm256_slli_epi32(ms[j][h], 5));
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            __m256 wd, wmin = _mm256_setzero_ps();
            if (packed) {
                const uint8_t *dp = src[h].p + (kind != LK8_Q6_K ? 192 : 256) + 16 * (size_t)h;
                wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)dp));
                if (kind != LK8_Q6_K)
                    wmin =
                        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(dp + 32)));
            } else {
                /* Q4_K, Q5_K: d and dmin the dword at 0; Q6_K: d the low half of the dword at
                 * 208 */
                __m256i dw = ln8_dwords(false, &src[h], h, 0, kind != LK8_Q6_K ? 0 : 208);
                wd = ln8_f16_halves(dw, 0);
                if (kind != LK8_Q6_K)
                    wmin = ln8_f16_halves(dw, 1);
            }
            _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)
            {
                __m256 xd = _mm256_set1_ps(xb[j]->d);
                acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j][h]), _mm256_mul_ps(wd, xd),
                                            acc[j][h]);
                if (kind != LK8_Q6_K)
                    acc[j][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[j][h]),
                                                 _mm256_mul_ps(wmin, xd), acc[j][h]);
            }
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) src[h].p += step;
    }
}

/* Rows [0, nr) of w (packed or the file's rows) times nc Q8_K activation rows, in ln8_gemm's
 * order: LN8_ROWS activation rows at a time, each group of 16 weight rows against them LN8_J
 * per pass, the K-quant prefetch (lk8_prefetch) on a group's first pass only */
AR_INLINE void lk8_gemm(const int kind, const bool packed, int nb, int nr, int nc, const uint8_t *w,
                        size_t w_row, const uint8_t *x, size_t x_row, float *y, size_t ldy)
{
    const size_t bs = kind == LK8_Q4_K   ? sizeof(struct block_q4_K)
                      : kind == LK8_Q5_K ? sizeof(struct block_q5_K)
                                         : sizeof(struct block_q6_K);
    const size_t gsz = (size_t)nb * LK8_PB(kind), step = packed ? LK8_PB(kind) : bs;
    for (int r0 = 0; r0 < nc; r0 += LN8_ROWS) {
        int rows = AR_MIN(LN8_ROWS, nc - r0);
        for (int i0 = 0; i0 < nr; i0 += 16) {
            int rn = AR_MIN(16, nr - i0);
            for (int j0 = 0; j0 < rows; j0 += LN8_J) {
                int jn = AR_MIN(LN8_J, rows - j0);
                const struct block_q8_K *xb[LN8_J];
                struct ln8_src src[2];
                __m256 acc[LN8_J][2];
                for (int j = 0; j < jn; j++)
                    xb[j] = (const struct block_q8_K *)(const void *)(x + (size_t)(r0 + j0 + j) *
                                                                              x_row);
                ln8_group_src(packed, packed ? w + (size_t)(i0 / 16) * gsz : w + (size_t)i0 * w_row,
                              w_row, rn, src);
                for (int j = 0; j < jn; j++)
                    acc[j][0] = acc[j][1] = _mm256_setzero_ps();
                LN8_PASS(lk8_blocks, jn, kind, packed, nb, src, step, xb, j0 == 0, acc);
                for (int j = 0; j < jn; j++)
                    for (int h = 0; h < 2; h++)
                        ln8_store(y + (size_t)(r0 + j0 + j) * ldy + (size_t)i0 + 8 * (size_t)h,
                                  rn - 8 * h, acc[j][h]);
            }
        }
    }
}

#define DEFINE_LK8(NAME, KIND, WT)                                                                 \
    static void NAME##_gemm(int n, int nr, int nc, const void *w, size_t w_row, const void *x,     \
                            size_t x_row, float *y, size_t ldy)                                    \
    {                                                                                              \
        lk8_gemm(KIND, false, n / QK_K, nr, nc, w, w_row, x, x_row, y, ldy);                       \
    }                                                                                              \
    static void NAME##_gemm_packed(int n, int nr, int nc, const void *wp, const void *x,           \
                                   size_t x_row, float *y, size_t ldy)                             \
    {                                                                                              \
        lk8_gemm(KIND, true, n / QK_K, nr, nc, wp, 0, x, x_row, y, ldy);                           \
    }                                                                                              \
    static void NAME##_vec_dot(int n, float *s, const void *w, const void *x)                      \
    {                                                                                              \
        lk8_gemm(KIND, false, n / QK_K, 1, 1, w, sizeof(WT), x, 0, s, 1);                          \
    }
DEFINE_LK8(q4_K, LK8_Q4_K, struct block_q4_K)
DEFINE_LK8(q5_K, LK8_Q5_K, struct block_q5_K)
DEFINE_LK8(q6_K, LK8_Q6_K, struct block_q6_K)

/* ---- float weights: F32, F16, BF16 (8 elements per step, scalar tail) ----------------------- */

AR_INLINE __m256 load_f16x8(const ar_f16 *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

AR_INLINE __m256 load_bf16x8(const ar_bf16 *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* 16 BF16 values as floats in two vectors, by interleaving zero halves: lo holds elements
 * 0-3 and 8-11, hi 4-7 and 12-15 (one load and two shuffles for 16 elements; load_bf16x8 takes
 * a load, a widening and a shift for 8) */
AR_INLINE void load_bf16x16(const ar_bf16 *p, __m256 *lo, __m256 *hi)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p), z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}

/* the types without a paired load take none (PAIRED 0 never calls it) */
AR_INLINE void load_none16(const void *p, __m256 *lo, __m256 *hi)
{
    (void)p;
    *lo = *hi = _mm256_setzero_ps();
}

AR_INLINE __m256 load_f32x8(const float *p)
{
    return _mm256_loadu_ps(p);
}

AR_INLINE float bf16_elem(const ar_bf16 *p)
{
    ar_bf16 v;
    memcpy(&v, p, sizeof(v));
    return ar_bf16_to_f32(v);
}

AR_INLINE float f16_elem(const ar_f16 *p)
{
    ar_f16 v;
    memcpy(&v, p, sizeof(v));
    return f16_to_f32(v);
}

/* With G > 1, runs of G steps of 8 elements are summed into a fresh vector, then added to the
 * output's sum, in every tile: an F16 row holds 16 bytes of weights per fma, so one chain of
 * fmas capped decode at 4 bytes per cycle of fma latency (0.58-0.63 of the bandwidth on one
 * thread, 0.99-1.06 in runs of 4). BF16 stays at one chain (G = 1): its runs cost the 4 x 2
 * tile registers for the converted activations, 10 % of prefill. With PAIRED, steps of 16
 * elements come first, each converted by LOAD2 into two vectors whose lanes hold elements in
 * another order (load_bf16x16): every tile of the type runs the same steps, so an output is
 * the same sum in every tile. For BF16 that took prefill (qwen05, 256 tokens, one thread) from
 * 68-74 to 84-86 tokens per CPU second. */
#define DEFINE_FTILE(NAME, ET, LOAD, LOAD2, PAIRED, ELEM, RW, RX, G)                               \
    static void NAME##_tile_##RW##x##RX(int n, const uint8_t *w, size_t w_row, const uint8_t *x,   \
                                        size_t x_row, float *y, size_t ldy, const uint8_t *pf)     \
    {                                                                                              \
        __m256 acc[RW][RX];                                                                        \
        int k = 0;                                                                                 \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                       \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] = _mm256_setzero_ps();  \
        for (; G > 1 && k + 8 * (G) <= n; k += 8 * (G)) {                                          \
            if (pf)                                                                                \
                prefetch_l2(pf + (size_t)k * sizeof(ET) * (RW), 8 * (G) * sizeof(ET) * (RW));      \
            _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                   \
            {                                                                                      \
                const ET *wi = (const ET *)(const void *)(w + (size_t)i * w_row) + k;              \
                __m256 t[RX];                                                                      \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) t[j] = _mm256_setzero_ps();   \
                _Pragma("GCC unroll 8") for (int g = 0; g < (G); g++)                              \
                {                                                                                  \
                    __m256 wv = LOAD(wi + 8 * g);                                                  \
                    _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) t[j] = _mm256_fmadd_ps(   \
                        wv, LOAD((const ET *)(const void *)(x + (size_t)j * x_row) + k + 8 * g),   \
                        t[j]);                                                                     \
                }                                                                                  \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] =                   \
                    _mm256_add_ps(acc[i][j], t[j]);                                                \
            }                                                                                      \
        }                                                                                          \
        for (; (PAIRED) && k + 16 <= n; k += 16) {                                                 \
            __m256 xl[RX], xh[RX];                                                                 \
            if (pf)                                                                                \
                prefetch_l2(pf + (size_t)k * sizeof(ET) * (RW), 16 * sizeof(ET) * (RW));           \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++)                                   \
                LOAD2((const ET *)(const void *)(x + (size_t)j * x_row) + k, &xl[j], &xh[j]);      \
            _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                   \
            {                                                                                      \
                __m256 wl, wh;                                                                     \
                LOAD2((const ET *)(const void *)(w + (size_t)i * w_row) + k, &wl, &wh);            \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] =                   \
                    _mm256_fmadd_ps(wh, xh[j], _mm256_fmadd_ps(wl, xl[j], acc[i][j]));             \
            }                                                                                      \
        }                                                                                          \
        for (; k + 8 <= n; k += 8) {                                                               \
            if (pf)                                                                                \
                prefetch_l2(pf + (size_t)k * sizeof(ET) * (RW), 8 * sizeof(ET) * (RW));            \
            _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                   \
            {                                                                                      \
                __m256 wv = LOAD((const ET *)(const void *)(w + (size_t)i * w_row) + k);           \
                _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++) acc[i][j] = _mm256_fmadd_ps(  \
                    wv, LOAD((const ET *)(const void *)(x + (size_t)j * x_row) + k), acc[i][j]);   \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int i = 0; i < RW; i++)                                       \
            _Pragma("GCC unroll 8") for (int j = 0; j < RX; j++)                                   \
        {                                                                                          \
            const ET *wi = (const ET *)(const void *)(w + (size_t)i * w_row);                      \
            const ET *xj = (const ET *)(const void *)(x + (size_t)j * x_row);                      \
            float s = hsum_ps(acc[i][j]);                                                          \
            for (int t = k; t < n; t++)                                                            \
                s += ELEM(wi + t) * ELEM(xj + t);                                                  \
            y[(size_t)j * ldy + (size_t)i] = s;                                                    \
        }                                                                                          \
    }

#define DEFINE_FGEMM(NAME, ET, LOAD, LOAD2, PAIRED, ELEM, G)                                       \
    DEFINE_FTILE(NAME, ET, LOAD, LOAD2, PAIRED, ELEM, 4, 2, G)                                     \
    DEFINE_FTILE(NAME, ET, LOAD, LOAD2, PAIRED, ELEM, 4, 1, G)                                     \
    DEFINE_FTILE(NAME, ET, LOAD, LOAD2, PAIRED, ELEM, 1, 2, G)                                     \
    DEFINE_FTILE(NAME, ET, LOAD, LOAD2, PAIRED, ELEM, 1, 1, G)                                     \
    DEFINE_GEMM_LOOP(NAME, 1, ((G) == 1 ? TILE_RW : 1))

DEFINE_FGEMM(f32, float, load_f32x8, load_none16, 0, load_f32, 4)
DEFINE_FGEMM(f16, ar_f16, load_f16x8, load_none16, 0, f16_elem, 4)
DEFINE_FGEMM(bf16, ar_bf16, load_bf16x8, load_bf16x16, 1, bf16_elem, 1)

/* ---- activation quantizers ----------------------------------------------------------------- */

/* round(v) with halves away from zero, exactly as roundf: trunc, then step away from zero
 * when the (exact) dropped fraction is at least one half. */
AR_INLINE __m256 round_half_away(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, sign));
    __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    return _mm256_add_ps(t, step);
}

/* 32 int32 in four vectors -> 32 int8 in element order. */
AR_INLINE __m256i pack_i32_to_i8(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b); /* a0-3 b0-3 | a4-7 b4-7 */
    __m256i cd = _mm256_packs_epi32(c, d);
    __m256i all = _mm256_packs_epi16(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm256_permutevar8x32_epi32(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void q8_0_from_float(const float *x, void *y, int64_t n)
{
    struct block_q8_0 *b = y;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *xb = x + i * QK8_0;
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float d = _mm_cvtss_f32(m) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ar_f32_to_f16(d);
        __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], idv)));
        _mm256_storeu_si256((__m256i *)(void *)b[i].qs, pack_i32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

/* Q8_K: the first value of largest magnitude sets iscale = -127 / max (see ref.c). */
static void q8_K_from_float(const float *x, void *y, int64_t n)
{
    struct block_q8_K *b = y;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        __m256 amaxv = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8)
            amaxv = _mm256_max_ps(amaxv, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + k)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amaxv), _mm256_extractf128_ps(amaxv, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float amax = _mm_cvtss_f32(m);
        memset(&b[i], 0, sizeof(b[i]));
        if (amax == 0.0f)
            continue;
        float max = 0.0f;
        for (int k = 0; k < QK_K; k++) {
            if (fabsf(xb[k]) == amax) {
                max = xb[k];
                break;
            }
        }
        float iscale = -127.0f / max;
        __m256 isv = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int k = 0; k < QK_K; k += 32) {
            __m256i q[4];
            for (int t = 0; t < 4; t++) {
                __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + k + 8 * t), isv),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q[t] = _mm256_min_epi32(_mm256_cvtps_epi32(r), lim);
            }
            __m256i q8 = pack_i32_to_i8(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(void *)(b[i].qs + k), q8);
            /* sums of each 16: widen to int16, add pairs, then fold */
            __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q8);
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); /* 4 per 8 bytes */
            __m128i lo = _mm256_castsi256_si128(s32), hi = _mm256_extracti128_si256(s32, 1);
            __m128i t2 = _mm_hadd_epi32(lo, hi); /* [0-7][8-15][16-23][24-31] */
            t2 = _mm_hadd_epi32(t2, t2);         /* [0-15][16-31] ... */
            b[i].bsums[k / 16] = (int16_t)_mm_cvtsi128_si32(t2);
            b[i].bsums[k / 16 + 1] = (int16_t)_mm_extract_epi32(t2, 1);
        }
        b[i].d = 1.0f / iscale;
    }
}

static void f16_from_float(const float *x, void *y, int64_t n)
{
    ar_f16 *h = y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), 0));
    for (; i < n; i++)
        h[i] = ar_f32_to_f16(x[i]);
}

static void bf16_from_float(const float *x, void *y, int64_t n)
{
    ar_bf16 *h = y;
    int64_t i = 0;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int t = 0; t < 2; t++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 8 * t));
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
            __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(64 << 16));
            r[t] = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(void *)(h + i), p);
    }
    for (; i < n; i++)
        h[i] = ar_f32_to_bf16(x[i]);
}

/* ---- f32 vector ops ------------------------------------------------------------------------- */

/* e^x for x <= 88.7 (larger x saturate at e^88.7); below -87.3 the result flushes to 0
 * (KERNELS_EXP_POLY). */
AR_INLINE __m256 exp_ps(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(88.7f), lo = _mm256_set1_ps(-87.3f);
    __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), p;
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    KERNELS_EXP_POLY(256, x, k, p);
    return _mm256_andnot_ps(underflow, p);
}

static float dot_f32(int n, const float *x, const float *y)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float s = hsum_ps(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += x[i] * y[i];
    return s;
}

static float dot_f16_f32(int n, const ar_f16 *x, const float *y)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(load_f16x8(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(load_f16x8(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(load_f16x8(x + i), _mm256_loadu_ps(y + i), a0);
    float s = hsum_ps(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += f16_to_f32(x[i]) * y[i];
    return s;
}

static void axpy_f32(int n, float a, const float *x, float *y)
{
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static void axpy_f16(int n, float a, const ar_f16 *x, float *y)
{
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, load_f16x8(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * f16_to_f32(x[i]);
}

static void rmsnorm(int n, float *out, const float *x, const float *w, float eps)
{
    /* squares summed in double, as the reference does */
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 sq = _mm256_mul_ps(v, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double sum = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++)
        sum += (double)(x[i] * x[i]);
    float mean = (float)(sum / n);
    float scale = 1.0f / sqrtf(mean + eps);
    __m256 sv = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = (x[i] * scale) * w[i];
}

static void softmax(int n, float *x)
{
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    float max = _mm_cvtss_f32(m);
    for (; i < n; i++)
        max = fmaxf(max, x[i]);
    __m256 maxv = _mm256_set1_ps(max);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), maxv));
        _mm256_storeu_ps(x + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double sum = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += (double)x[i];
    }
    float inv = (float)(1.0 / sum);
    __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
    for (; i < n; i++)
        x[i] *= inv;
}

/* ref.c's rope 8 floats at a time (see avx512.c's rope512): the same bits. */
static void rope(float *x, int n_heads, int head_dim, int rope_dim, bool neox, const float *cs)
{
    int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++, x += head_dim) {
        int i = 0;
        if (neox) {
            for (; i + 8 <= half; i += 8) {
                __m256 a = _mm256_loadu_ps(cs + 2 * i), b = _mm256_loadu_ps(cs + 2 * i + 8);
                /* shuffle_ps takes the pairs per 128-bit lane: 0 2 | 8 10 | 4 6 | 12 14 */
                __m256 c = _mm256_castpd_ps(
                    _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
                __m256 s = _mm256_castpd_ps(
                    _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
                __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + half);
                _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(x + i + half,
                                 _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
            }
        } else {
            for (; i + 4 <= half; i += 4) {
                __m256 v = _mm256_loadu_ps(x + 2 * i), t = _mm256_loadu_ps(cs + 2 * i);
                __m256 p = _mm256_mul_ps(v, _mm256_moveldup_ps(t));
                __m256 q = _mm256_mul_ps(_mm256_permute_ps(v, 0xb1), _mm256_movehdup_ps(t));
                _mm256_storeu_ps(x + 2 * i,
                                 _mm256_blend_ps(_mm256_sub_ps(p, q), _mm256_add_ps(p, q), 0xaa));
            }
        }
        kernels_rope_pairs(x, i, rope_dim, neox, cs);
    }
}

static void silu_mul(int n, float *out, const float *gate, const float *up)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp_ps(_mm256_xor_ps(g, sign));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void gelu_mul(int n, float *out, const float *gate, const float *up)
{
    const __m256 one = _mm256_set1_ps(1.0f), k2 = _mm256_set1_ps(2.0f * KERNELS_GELU_K),
                 a = _mm256_set1_ps(KERNELS_GELU_A), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        /* 2u = 2k (g + a g g g), in the reference's order of operations */
        __m256 c = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(a, g), g), g);
        __m256 u2 = _mm256_mul_ps(k2, _mm256_add_ps(g, c));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp_ps(_mm256_xor_ps(u2, sign))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        float g = gate[i];
        float u2 = 2.0f * KERNELS_GELU_K * (g + KERNELS_GELU_A * g * g * g);
        out[i] = g / (1.0f + expf(-u2)) * up[i];
    }
}

/* One KV head's attention over a run of key / value rows. Several query rows share each key
 * or value row loaded (and F16's conversion): scores_tile's QN queries against one key row at
 * a time, values_tile's HN heads summing 16 output columns in registers over all the rows.
 * Each score is still dot_f32 (dot_f16_f32)'s arithmetic (two accumulators over 16-element
 * steps, then hsum_ps) and each output column axpy's fused multiply-adds, rows in order, so
 * the reference pass, which calls those, agrees bit for bit (kernels.h). Other head sizes
 * take the plain loops. Before, on a Zen 3 (2026-12-07), a qwen2-0.5B-shaped Q8_0 prefill of
 * 512 tokens spent 9 % of its time in attention, for 2 % of its arithmetic. */
AR_INLINE __m256 kv_load8(const uint8_t *r, int i, const bool f16)
{
    return f16 ? load_f16x8((const ar_f16 *)(const void *)r + i)
               : _mm256_loadu_ps((const float *)(const void *)r + i);
}

AR_INLINE void scores_tile(const int QN, const bool f16, int hd, int nt, const float *q,
                           const uint8_t *k, size_t stride, float scale, float *s, size_t s_stride)
{
    for (int t = 0; t < nt; t++) {
        const uint8_t *kr = k + (size_t)t * stride;
        __m256 a0[4], a1[4];
        _Pragma("GCC unroll 4") for (int h = 0; h < QN; h++) a0[h] = a1[h] = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 16) {
            __m256 k0 = kv_load8(kr, i, f16), k1 = kv_load8(kr, i + 8, f16);
            _Pragma("GCC unroll 4") for (int h = 0; h < QN; h++)
            {
                const float *qh = q + (size_t)h * (size_t)hd + i;
                a0[h] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(qh), a0[h]);
                a1[h] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(qh + 8), a1[h]);
            }
        }
        _Pragma("GCC unroll 4") for (int h = 0; h < QN; h++) s[(size_t)h * s_stride + (size_t)t] =
            hsum_ps(_mm256_add_ps(a0[h], a1[h])) * scale;
    }
}

AR_INLINE void values_tile(const int HN, const bool f16, int hd, int nt, const float *s,
                           size_t s_stride, const uint8_t *v, size_t stride, float *out)
{
    for (int c = 0; c < hd; c += 16) {
        __m256 acc[4][2];
        _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
            _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) acc[h][u] =
                _mm256_loadu_ps(out + (size_t)h * (size_t)hd + c + 8 * u);
        for (int t = 0; t < nt; t++) {
            const uint8_t *vr = v + (size_t)t * stride;
            __m256 v0 = kv_load8(vr, c, f16), v1 = kv_load8(vr, c + 8, f16);
            _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
            {
                __m256 a = _mm256_set1_ps(s[(size_t)h * s_stride + (size_t)t]);
                acc[h][0] = _mm256_fmadd_ps(a, v0, acc[h][0]);
                acc[h][1] = _mm256_fmadd_ps(a, v1, acc[h][1]);
            }
        }
        _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
            _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++)
                _mm256_storeu_ps(out + (size_t)h * (size_t)hd + c + 8 * u, acc[h][u]);
    }
}

/* Query rows (heads) in fours, then the one to three left */
#define ATT_TILES(TILE, F16, nq, ...)                                                              \
    for (int h = 0; h < (nq);) {                                                                   \
        int hn = AR_MIN(4, (nq)-h);                                                                \
        if (hn == 4)                                                                               \
            TILE(4, F16, h, __VA_ARGS__);                                                          \
        else if (hn == 3)                                                                          \
            TILE(3, F16, h, __VA_ARGS__);                                                          \
        else if (hn == 2)                                                                          \
            TILE(2, F16, h, __VA_ARGS__);                                                          \
        else                                                                                       \
            TILE(1, F16, h, __VA_ARGS__);                                                          \
        h += hn;                                                                                   \
    }
#define SCORES_AT(QN, F16, h, hd, nt, q, k, stride, scale, s, s_stride)                            \
    scores_tile(QN, F16, hd, nt, (q) + (size_t)(h) * (size_t)(hd), k, stride, scale,               \
                (s) + (size_t)(h) * (s_stride), s_stride)
#define VALUES_AT(HN, F16, h, hd, nt, s, s_stride, v, stride, out)                                 \
    values_tile(HN, F16, hd, nt, (s) + (size_t)(h) * (s_stride), s_stride, v, stride,              \
                (out) + (size_t)(h) * (size_t)(hd))

static void attn_scores(int hd, int nq, int nt, const float *q, const void *k, size_t kv_stride,
                        enum ar_type kt, float scale, float *s, size_t s_stride)
{
    if (hd % 16 != 0) {
        kernels_attn_scores_loop(dot_f32, dot_f16_f32, hd, nq, nt, q, k, kv_stride, kt, scale, s,
                                 s_stride);
        return;
    }
    if (kt == AR_TYPE_F16)
        ATT_TILES(SCORES_AT, true, nq, hd, nt, q, k, kv_stride, scale, s, s_stride)
    else
        ATT_TILES(SCORES_AT, false, nq, hd, nt, q, k, kv_stride, scale, s, s_stride)
}

static void attn_values(int hd, int nq, int nt, const float *s, size_t s_stride, const void *v,
                        size_t kv_stride, enum ar_type kt, float *out)
{
    if (hd % 16 != 0) {
        kernels_attn_values_loop(axpy_f32, axpy_f16, hd, nq, nt, s, s_stride, v, kv_stride, kt,
                                 out);
        return;
    }
    if (kt == AR_TYPE_F16)
        ATT_TILES(VALUES_AT, true, nq, hd, nt, s, s_stride, v, kv_stride, out)
    else
        ATT_TILES(VALUES_AT, false, nq, hd, nt, s, s_stride, v, kv_stride, out)
}

/* ---- the table ------------------------------------------------------------------------------ */

/* ---- int8 peak loop (kernels.h int8_peak): the Q8_0 kernels' dot_u8s8, vpmaddubsw + vpmaddwd
 * + vpaddd on 32 bytes. Each round does KERNELS_PEAK_CHAINS steps over both 32-byte halves;
 * the steps go round 4 accumulator pairs (vpaddd's one-cycle latency needs no more). The empty
 * asm makes the compiler treat a as new at every step, so that it cannot compute the (loop-
 * invariant) products once and only add them up. */
static uint64_t int8_peak(int64_t n, const uint8_t *a, const int8_t *b, uint32_t *out)
{
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)a);
    const __m256i a1 = _mm256_loadu_si256((const __m256i *)(a + 32));
    const __m256i b0 = _mm256_loadu_si256((const __m256i *)b);
    const __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + 32));
    __m256i lo[4], hi[4];
    for (int k = 0; k < 4; k++)
        lo[k] = hi[k] = _mm256_setzero_si256();
    for (int64_t r = 0; r < n; r++) {
        _Pragma("GCC unroll 12") for (int c = 0; c < KERNELS_PEAK_CHAINS; c++)
        {
            __m256i u0 = a0, u1 = a1;
            __asm__ volatile("" : "+x"(u0), "+x"(u1));
            lo[c % 4] = _mm256_add_epi32(lo[c % 4], dot_u8s8(u0, b0));
            hi[c % 4] = _mm256_add_epi32(hi[c % 4], dot_u8s8(u1, b1));
        }
    }
    __m256i slo = _mm256_add_epi32(_mm256_add_epi32(lo[0], lo[1]), _mm256_add_epi32(lo[2], lo[3]));
    __m256i shi = _mm256_add_epi32(_mm256_add_epi32(hi[0], hi[1]), _mm256_add_epi32(hi[2], hi[3]));
    _mm256_storeu_si256((__m256i *)out, slo);
    _mm256_storeu_si256((__m256i *)(out + 8), shi);
    return (uint64_t)n * KERNELS_PEAK_CHAINS * 64;
}

void kernels_fill_avx2(struct kernel_ops *ops)
{
    ops->int8_peak = int8_peak;
    ops->int8_peak_insn = "vpmaddubsw+vpmaddwd ymm";
    ops->tuning = kernels_decode_prefetch_line();
    ops->from_float[AR_TYPE_F16] = f16_from_float;
    ops->from_float[AR_TYPE_BF16] = bf16_from_float;
    ops->from_float[AR_TYPE_Q8_0] = q8_0_from_float;
    ops->from_float[AR_TYPE_Q8_K] = q8_K_from_float;

    ops->vec_dot[AR_TYPE_F32] = f32_vec_dot;
    ops->vec_dot[AR_TYPE_F16] = f16_vec_dot;
    ops->vec_dot[AR_TYPE_BF16] = bf16_vec_dot;
    ops->vec_dot[AR_TYPE_Q8_0] = q8_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_0] = q4_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_1] = q4_1_vec_dot;
    ops->vec_dot[AR_TYPE_Q5_0] = q5_0_vec_dot;
    ops->vec_dot[AR_TYPE_Q5_1] = q5_1_vec_dot;
    ops->vec_dot[AR_TYPE_Q4_K] = q4_K_vec_dot;
    ops->vec_dot[AR_TYPE_Q5_K] = q5_K_vec_dot;
    ops->vec_dot[AR_TYPE_Q6_K] = q6_K_vec_dot;

    ops->gemm[AR_TYPE_F32] = f32_gemm;
    ops->gemm[AR_TYPE_F16] = f16_gemm;
    ops->gemm[AR_TYPE_BF16] = bf16_gemm;
    ops->gemm[AR_TYPE_Q8_0] = q8_0_gemm;
    ops->gemm[AR_TYPE_Q4_0] = q4_0_gemm;
    ops->gemm[AR_TYPE_Q4_1] = q4_1_gemm;
    ops->gemm[AR_TYPE_Q5_0] = q5_0_gemm;
    ops->gemm[AR_TYPE_Q5_1] = q5_1_gemm;
    ops->gemm[AR_TYPE_Q4_K] = q4_K_gemm;
    ops->gemm[AR_TYPE_Q5_K] = q5_K_gemm;
    ops->gemm[AR_TYPE_Q6_K] = q6_K_gemm;
    ops->gemm_packed[AR_TYPE_Q8_0] = q8_0_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q4_0] = q4_0_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q5_0] = q5_0_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q4_K] = q4_K_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q5_K] = q5_K_gemm_packed;
    ops->gemm_packed[AR_TYPE_Q6_K] = q6_K_gemm_packed;

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
