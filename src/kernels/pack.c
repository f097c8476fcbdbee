/* pack.c - the packed weight layout (kernels.h, "x16") and its reference: packing and
 * unpacking byte by byte, and the reference packed gemm (unpack the tile's rows, then the
 * reference gemm), which the SIMD packed kernels are held to. */
#include <string.h>

#include "kernels_internal.h"
#include "quants.h"

/* ---- F16, BF16: units of 2 (one element) or 4 bytes (a pair) of 16 rows side by side ---- */

static size_t float_unit(enum ar_type t)
{
    return t == AR_TYPE_F16 ? 2 : t == AR_TYPE_BF16 ? 4 : 0;
}

static void float_pack_rows(size_t us, const void *w, size_t w_row, int64_t n, int64_t nr,
                            void *dst)
{
    size_t row = (size_t)n * 2, group = row * KERNELS_PACK_ROWS;
    for (int64_t g0 = 0; g0 < nr; g0 += KERNELS_PACK_ROWS) {
        uint8_t *gp = (uint8_t *)dst + (size_t)(g0 / KERNELS_PACK_ROWS) * group;
        for (int r = 0; r < KERNELS_PACK_ROWS; r++) {
            const uint8_t *src = (const uint8_t *)w + (size_t)AR_MIN(g0 + r, nr - 1) * w_row;
            for (size_t u = 0; u < row / us; u++)
                memcpy(gp + (u * KERNELS_PACK_ROWS + (size_t)r) * us, src + u * us, us);
        }
    }
}

static void float_unpack_row(size_t us, const void *wp, int64_t n, int64_t i, void *dst)
{
    size_t row = (size_t)n * 2, r = (size_t)(i % KERNELS_PACK_ROWS);
    const uint8_t *gp = (const uint8_t *)wp + kernels_packed_offset(AR_TYPE_F16, n, i);
    for (size_t u = 0; u < row / us; u++)
        memcpy((uint8_t *)dst + u * us, gp + (u * KERNELS_PACK_ROWS + r) * us, us);
}

/* Bytes of one block of one row other than its scale d (its quants: Q5_0's high bits
 * included), so a group's block holds 16 of these and 16 scales: 16 rows' bytes. */
static size_t quant_bytes(enum ar_type t)
{
    switch (t) {
    case AR_TYPE_Q8_0:
        return QK8_0;
    case AR_TYPE_Q4_0:
        return QK4_0 / 2;
    case AR_TYPE_Q5_0:
        return QK5_0 / 2 + 4;
    default:
        return 0;
    }
}

/* bytes of one block of a group: 16 rows' quants and their 16 scales */
static size_t block_bytes(size_t q)
{
    return KERNELS_PACK_ROWS * q + 2 * KERNELS_PACK_ROWS;
}

size_t kernels_packed_group(enum ar_type t, int64_t n)
{
    size_t q = quant_bytes(t);
    if (float_unit(t) && n >= 32 && n % 32 == 0)
        return (size_t)n * 2 * KERNELS_PACK_ROWS;
    if (!q || n < 32 || n % 32 != 0)
        return 0;
    return (size_t)(n / 32) * block_bytes(q);
}

size_t kernels_packed_size(enum ar_type t, int64_t n, int64_t nr)
{
    size_t g = kernels_packed_group(t, n);
    uint64_t bytes;
    if (!g || nr < 1 ||
        ar_mul_overflow_u64((uint64_t)(nr + KERNELS_PACK_ROWS - 1) / KERNELS_PACK_ROWS, g, &bytes) ||
        bytes > SIZE_MAX)
        return 0;
    return (size_t)bytes;
}

size_t kernels_packed_offset(enum ar_type t, int64_t n, int64_t i)
{
    return (size_t)(i / KERNELS_PACK_ROWS) * kernels_packed_group(t, n);
}

/* Within block b of a group (q = quant_bytes): where row r keeps byte k of its lane vectors
 * (k < 32 for Q8_0, < 16 for Q4_0's and Q5_0's nibbles), Q5_0's high-bit byte j (< 4), and
 * its scale. */
static size_t lane_at(size_t q, int b, int r, size_t k)
{
    return (size_t)b * block_bytes(q) + (k / 4) * 64 + (size_t)r * 4 + k % 4;
}

static size_t high_at(size_t q, int b, int r, int j)
{
    return (size_t)b * block_bytes(q) + 256 + (size_t)r * 4 + (size_t)j;
}

static size_t scale_at(size_t q, int b, int r)
{
    return (size_t)b * block_bytes(q) + KERNELS_PACK_ROWS * q + (size_t)r * 2;
}

/* Q5_0's high bits (qh: bit i is quant i's bit 4) as the group's plane: byte j of row r
 * holds in bit v the high bit of quant 4v + j (v < 8: lane vector v's byte j). */
static uint8_t high_plane_byte(uint32_t qh, int j)
{
    uint8_t e = 0;
    for (int v = 0; v < 8; v++)
        e |= (uint8_t)(((qh >> (4 * v + j)) & 1u) << v);
    return e;
}

void kernels_pack_rows(enum ar_type t, const void *w, size_t w_row, int64_t n, int64_t nr,
                       void *dst)
{
    size_t q = quant_bytes(t), g = kernels_packed_group(t, n), bs = 2 + q;
    size_t lanes = t == AR_TYPE_Q5_0 ? QK5_0 / 2 : q; /* lane bytes (Q5_0: its nibbles) */
    size_t qs_off = t == AR_TYPE_Q5_0 ? 6 : 2;      /* where the lane bytes sit in a block */
    int nb = (int)(n / 32);
    /* Q8_0: signed -> unsigned + 128, four bytes at a time */
    uint32_t flip = t == AR_TYPE_Q8_0 ? 0x80808080u : 0;
    if (!g)
        return;
    if (float_unit(t)) {
        float_pack_rows(float_unit(t), w, w_row, n, nr, dst);
        return;
    }
    for (int64_t g0 = 0; g0 < nr; g0 += KERNELS_PACK_ROWS) {
        uint8_t *gp = (uint8_t *)dst + (size_t)(g0 / KERNELS_PACK_ROWS) * g;
        for (int r = 0; r < KERNELS_PACK_ROWS; r++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)AR_MIN(g0 + r, nr - 1) * w_row;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * bs; /* d (f16), [qh], the quants */
                uint8_t *qd = gp + lane_at(q, b, r, 0);
                memcpy(gp + scale_at(q, b, r), blk, 2);
                for (size_t k = 0; k < lanes; k += 4) { /* lane r of vector k / 4 */
                    uint32_t v;
                    memcpy(&v, blk + qs_off + k, 4);
                    v ^= flip;
                    memcpy(qd + (k / 4) * 64, &v, 4);
                }
                if (t == AR_TYPE_Q5_0) {
                    uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 |
                                  (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
                    for (int j = 0; j < 4; j++)
                        gp[high_at(q, b, r, j)] = high_plane_byte(qh, j);
                }
            }
        }
    }
}

void kernels_unpack_row(enum ar_type t, const void *wp, int64_t n, int64_t i, void *dst)
{
    size_t q = quant_bytes(t), bs = 2 + q;
    size_t lanes = t == AR_TYPE_Q5_0 ? QK5_0 / 2 : q, qs_off = t == AR_TYPE_Q5_0 ? 6 : 2;
    int nb = (int)(n / 32), r = (int)(i % KERNELS_PACK_ROWS);
    const uint8_t *gp = (const uint8_t *)wp + kernels_packed_offset(t, n, i);
    uint8_t flip = t == AR_TYPE_Q8_0 ? 0x80 : 0;
    if (float_unit(t) && kernels_packed_group(t, n)) {
        float_unpack_row(float_unit(t), wp, n, i, dst);
        return;
    }
    if (!q)
        return;
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = (uint8_t *)dst + (size_t)b * bs;
        memcpy(blk, gp + scale_at(q, b, r), 2);
        for (size_t k = 0; k < lanes; k++)
            blk[qs_off + k] = (uint8_t)(gp[lane_at(q, b, r, k)] ^ flip);
        if (t == AR_TYPE_Q5_0) {
            uint32_t qh = 0;
            for (int j = 0; j < 4; j++)
                for (int v = 0; v < 8; v++)
                    qh |= (uint32_t)((gp[high_at(q, b, r, j)] >> v) & 1u) << (4 * v + j);
            for (int k = 0; k < 4; k++)
                blk[2 + k] = (uint8_t)(qh >> (8 * k));
        }
    }
}

/* The reference: the tile's rows unpacked a few at a time, then the reference gemm. */
#define REF_ROWS 16
static void gemm_packed_ref(enum ar_type t, int n, int nr, int nc, const void *wp,
                            const void *x, size_t x_row, float *y, size_t ldy)
{
    const struct kernel_ops *ref = kernels_ref();
    size_t row = ar_type_row_size(t, n);
    uint8_t buf[REF_ROWS * (2 + QK8_0) * 64]; /* 16 rows of up to 2048 elements */
    int step = row * REF_ROWS <= sizeof(buf) ? REF_ROWS : (int)AR_MAX(1, sizeof(buf) / row);
    for (int i0 = 0; i0 < nr; i0 += step) {
        int k = AR_MIN(step, nr - i0);
        if (row > sizeof(buf)) { /* rows longer than the buffer: dot by dot */
            uint8_t *one = ar_malloc(row);
            if (!one)
                return;
            for (int i = 0; i < k; i++) {
                kernels_unpack_row(t, wp, n, i0 + i, one);
                ref->gemm[t](n, 1, nc, one, row, x, x_row, y + i0 + i, ldy);
            }
            ar_free(one);
            continue;
        }
        for (int i = 0; i < k; i++)
            kernels_unpack_row(t, wp, n, i0 + i, buf + (size_t)i * row);
        ref->gemm[t](n, k, nc, buf, row, x, x_row, y + i0, ldy);
    }
}

static void q8_0_gemm_packed_ref(int n, int nr, int nc, const void *wp, const void *x,
                                 size_t x_row, float *y, size_t ldy)
{
    gemm_packed_ref(AR_TYPE_Q8_0, n, nr, nc, wp, x, x_row, y, ldy);
}

static void q4_0_gemm_packed_ref(int n, int nr, int nc, const void *wp, const void *x,
                                 size_t x_row, float *y, size_t ldy)
{
    gemm_packed_ref(AR_TYPE_Q4_0, n, nr, nc, wp, x, x_row, y, ldy);
}

static void q5_0_gemm_packed_ref(int n, int nr, int nc, const void *wp, const void *x,
                                 size_t x_row, float *y, size_t ldy)
{
    gemm_packed_ref(AR_TYPE_Q5_0, n, nr, nc, wp, x, x_row, y, ldy);
}

static void f16_gemm_packed_ref(int n, int nr, int nc, const void *wp, const void *x,
                                size_t x_row, float *y, size_t ldy)
{
    gemm_packed_ref(AR_TYPE_F16, n, nr, nc, wp, x, x_row, y, ldy);
}

static void bf16_gemm_packed_ref(int n, int nr, int nc, const void *wp, const void *x,
                                 size_t x_row, float *y, size_t ldy)
{
    gemm_packed_ref(AR_TYPE_BF16, n, nr, nc, wp, x, x_row, y, ldy);
}

void kernels_fill_packed_ref(struct kernel_ops *ops)
{
    ops->gemm_packed[AR_TYPE_F16] = f16_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_BF16] = bf16_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q8_0] = q8_0_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q4_0] = q4_0_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q5_0] = q5_0_gemm_packed_ref;
}
