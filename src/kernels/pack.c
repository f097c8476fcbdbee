/* pack.c - the packed weight layout (kernels.h, "x16") and its reference: packing and
 * unpacking byte by byte from one table of fields per type, and the reference packed gemm
 * (unpack the tile's rows, then the reference gemm), which the SIMD packed kernels are held
 * to. */
#include <string.h>

#include "kernels_internal.h"
#include "quants.h"

/* How the bytes of one field of a row's block move into a group's block: `unit` bytes of a
 * row stay together, the 16 rows' units side by side (4: a lane vector of 64 bytes, lane r
 * row r; 2: 16 f16 scales, one vector's worth when converted; 1: a byte per row), so byte k
 * of row r lands at (k / unit) * 16 * unit + r * unit + k % unit within the field's region
 * (PK_PAIR's two ranges alternate a vector of units each: (k / unit) * 32 * unit + ..., the
 * second range's 16 * unit bytes on). The regions follow one another in the table's order. */
enum pk_xform {
    PK_COPY,
    PK_FLIP,  /* Q8_0 quants: signed -> unsigned + 128 */
    PK_PLANE, /* Q5_0 high bits (4 bytes): byte j holds in bit v the high bit of quant 4v + j */
    PK_PAIR,  /* two ranges of len bytes, [src, ..) and [src2, ..), a unit of each in turn */
};

struct pk_field {
    uint16_t src, len; /* bytes [src, src + len) of the row's block */
    uint8_t unit, xform;
    uint16_t src2; /* PK_PAIR: the second range */
};

struct pk_layout {
    uint16_t qk, bytes; /* elements and bytes of one row's block */
    uint16_t pad;       /* zero bytes after a group's block (keeps blocks 64-byte aligned) */
    uint8_t nf;
    struct pk_field f[6];
};

/* The layouts (kernels.h). Offsets are those of quants.h's blocks. F: a field of bytes
 * [src, src + len) in units of `unit` bytes; FP: two such ranges paired (PK_PAIR) */
/* clang-format off */
#define F(src, len, unit, xform) {src, len, unit, xform, 0}
#define FP(src, src2, len, unit) {src, len, unit, PK_PAIR, src2}
/* clang-format on */
static const struct pk_layout *layout(enum ar_type t)
{
    static const struct pk_layout q8_0 = {
        32, 34, 0, 2, {F(2, 32, 4, PK_FLIP), F(0, 2, 2, PK_COPY)}};
    static const struct pk_layout q4_0 = {
        32, 18, 0, 2, {F(2, 16, 4, PK_COPY), F(0, 2, 2, PK_COPY)}};
    static const struct pk_layout q5_0 = {
        32, 22, 0, 3, {F(6, 16, 4, PK_COPY), F(2, 4, 4, PK_PLANE), F(0, 2, 2, PK_COPY)}};
    /* K-quants: the scales first (Q4_K/Q5_K's 12 bytes of packed 6-bit scales and mins as
     * three lane vectors of 32-bit words; Q6_K's 16 int8 scales as byte planes), d (and dmin),
     * then the quants as lane vectors in the order the kernel first reads them, so that a
     * group's super-block is one ascending stream: Q5_K's qh (read with every part of qs),
     * qs; Q6_K per half of the super-block (elements 0..127, 128..255) the first 32 bytes of
     * its ql and its 32 bytes of qh a lane vector of each in turn (the kernel reads them
     * together), then the other 32 of ql (then 32 bytes of padding) */
    static const struct pk_layout q4_K = {
        256,
        144,
        0,
        4,
        {F(4, 12, 4, PK_COPY), F(0, 2, 2, PK_COPY), F(2, 2, 2, PK_COPY), F(16, 128, 4, PK_COPY)}};
    static const struct pk_layout q5_K = {256,
                                          176,
                                          0,
                                          5,
                                          {F(4, 12, 4, PK_COPY), F(0, 2, 2, PK_COPY),
                                           F(2, 2, 2, PK_COPY), F(16, 32, 4, PK_COPY),
                                           F(48, 128, 4, PK_COPY)}};
    static const struct pk_layout q6_K = {256,
                                          210,
                                          32,
                                          6,
                                          {F(192, 16, 1, PK_COPY), F(208, 2, 2, PK_COPY),
                                           FP(0, 128, 32, 4), F(32, 32, 4, PK_COPY),
                                           FP(64, 160, 32, 4), F(96, 32, 4, PK_COPY)}};
    /* F16, BF16: 32 elements a block, the 16 rows side by side one element (F16) or one pair
     * of elements (BF16, as vdpbf16ps multiplies them) at a time */
    static const struct pk_layout f16 = {32, 64, 0, 1, {F(0, 64, 2, PK_COPY)}};
    static const struct pk_layout bf16 = {32, 64, 0, 1, {F(0, 64, 4, PK_COPY)}};
    switch (t) {
    case AR_TYPE_F16:
        return &f16;
    case AR_TYPE_BF16:
        return &bf16;
    case AR_TYPE_Q8_0:
        return &q8_0;
    case AR_TYPE_Q4_0:
        return &q4_0;
    case AR_TYPE_Q5_0:
        return &q5_0;
    case AR_TYPE_Q4_K:
        return &q4_K;
    case AR_TYPE_Q5_K:
        return &q5_K;
    case AR_TYPE_Q6_K:
        return &q6_K;
    default:
        return NULL;
    }
}
#undef F
#undef FP

/* bytes of one block of a group */
static size_t group_block(const struct pk_layout *l)
{
    return KERNELS_PACK_ROWS * (size_t)l->bytes + l->pad;
}

size_t kernels_packed_group(enum ar_type t, int64_t n)
{
    const struct pk_layout *l = layout(t);
    if (!l || n < l->qk || n % l->qk != 0)
        return 0;
    return (size_t)(n / l->qk) * group_block(l);
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

/* Bytes between a field's consecutive units of one row in a group's block: the 16 rows' units,
 * and for PK_PAIR the second range's after them */
static size_t field_step(const struct pk_field *f)
{
    return KERNELS_PACK_ROWS * (size_t)f->unit * (f->xform == PK_PAIR ? 2 : 1);
}

/* bytes of field f in a group's block */
static size_t field_region(const struct pk_field *f)
{
    return (size_t)(f->len / f->unit) * field_step(f);
}

/* Where byte k of field f of row r sits in a group's block, whose field f starts at `region`
 * (PK_PAIR: byte k of its first range; the second's is KERNELS_PACK_ROWS units further on) */
static size_t field_at(const struct pk_field *f, size_t region, int r, size_t k)
{
    return region + (k / f->unit) * field_step(f) + (size_t)r * f->unit + k % f->unit;
}

/* Q5_0's high bits qh (bit i: quant i's bit 4) as the plane's byte j (bit v: quant 4v + j) */
static uint8_t high_plane_byte(uint32_t qh, int j)
{
    uint8_t e = 0;
    for (int v = 0; v < 8; v++)
        e |= (uint8_t)(((qh >> (4 * v + j)) & 1u) << v);
    return e;
}

/* n units of `unit` bytes from s (s_step apart) to d (d_step apart), each byte XORed with
 * flip; `unit` is a constant at each call, so the inner loop is a 1-, 2- or 4-byte move */
static inline void move_units(uint8_t *d, size_t d_step, const uint8_t *s, size_t s_step,
                              size_t n, const size_t unit, uint8_t flip)
{
    for (size_t u = 0; u < n; u++, d += d_step, s += s_step)
        for (size_t k = 0; k < unit; k++)
            d[k] = (uint8_t)(s[k] ^ flip);
}

/* A field's units from s (s_step apart) to d (d_step apart), Q8_0's flipped: in a group's
 * block a row's units are 16 units apart */
static void field_move(const struct pk_field *f, uint8_t *d, size_t d_step, const uint8_t *s,
                       size_t s_step)
{
    size_t n = f->len / f->unit;
    uint8_t flip = f->xform == PK_FLIP ? 0x80 : 0;
    switch (f->unit) {
    case 4:
        move_units(d, d_step, s, s_step, n, 4, flip);
        break;
    case 2:
        move_units(d, d_step, s, s_step, n, 2, flip);
        break;
    default:
        move_units(d, d_step, s, s_step, n, 1, flip);
        break;
    }
}

/* One field of row r's block blk -> the group's block gb */
static void field_pack(const struct pk_field *f, size_t region, int r, const uint8_t *blk,
                       uint8_t *gb)
{
    const uint8_t *src = blk + f->src;
    uint8_t *d = gb + field_at(f, region, r, 0);
    if (f->xform == PK_PLANE) {
        uint32_t qh = (uint32_t)src[0] | (uint32_t)src[1] << 8 | (uint32_t)src[2] << 16 |
                      (uint32_t)src[3] << 24;
        for (int j = 0; j < 4; j++)
            gb[field_at(f, region, r, (size_t)j)] = high_plane_byte(qh, j);
        return;
    }
    field_move(f, d, field_step(f), src, f->unit);
    if (f->xform == PK_PAIR)
        field_move(f, d + KERNELS_PACK_ROWS * (size_t)f->unit, field_step(f), blk + f->src2,
                   f->unit);
}

/* field_pack's inverse: row r's bytes of field f in the group's block gb -> its block blk */
static void field_unpack(const struct pk_field *f, size_t region, int r, const uint8_t *gb,
                         uint8_t *blk)
{
    uint8_t *dst = blk + f->src;
    const uint8_t *s = gb + field_at(f, region, r, 0);
    if (f->xform == PK_PLANE) {
        uint32_t qh = 0;
        for (int j = 0; j < 4; j++)
            for (int v = 0; v < 8; v++)
                qh |= (uint32_t)((gb[field_at(f, region, r, (size_t)j)] >> v) & 1u) << (4 * v + j);
        for (int k = 0; k < 4; k++)
            dst[k] = (uint8_t)(qh >> (8 * k));
        return;
    }
    field_move(f, dst, f->unit, s, field_step(f));
    if (f->xform == PK_PAIR)
        field_move(f, blk + f->src2, f->unit, s + KERNELS_PACK_ROWS * (size_t)f->unit,
                   field_step(f));
}

void kernels_pack_rows(enum ar_type t, const void *w, size_t w_row, int64_t n, int64_t nr,
                       void *dst)
{
    const struct pk_layout *l = layout(t);
    size_t g = kernels_packed_group(t, n);
    if (!g)
        return;
    for (int64_t g0 = 0; g0 < nr; g0 += KERNELS_PACK_ROWS) {
        uint8_t *gp = (uint8_t *)dst + (size_t)(g0 / KERNELS_PACK_ROWS) * g;
        for (int r = 0; r < KERNELS_PACK_ROWS; r++) {
            /* rows past the last repeat it */
            const uint8_t *row = (const uint8_t *)w + (size_t)AR_MIN(g0 + r, nr - 1) * w_row;
            for (int64_t b = 0; b < n / l->qk; b++) {
                uint8_t *gb = gp + (size_t)b * group_block(l);
                size_t region = 0;
                if (r == 0)
                    memset(gb + KERNELS_PACK_ROWS * (size_t)l->bytes, 0, l->pad);
                for (int i = 0; i < l->nf; i++) {
                    field_pack(&l->f[i], region, r, row + (size_t)b * l->bytes, gb);
                    region += field_region(&l->f[i]);
                }
            }
        }
    }
}

void kernels_unpack_row(enum ar_type t, const void *wp, int64_t n, int64_t i, void *dst)
{
    const struct pk_layout *l = layout(t);
    const uint8_t *gp = (const uint8_t *)wp + kernels_packed_offset(t, n, i);
    int r = (int)(i % KERNELS_PACK_ROWS);
    if (!kernels_packed_group(t, n))
        return;
    for (int64_t b = 0; b < n / l->qk; b++) {
        const uint8_t *gb = gp + (size_t)b * group_block(l);
        size_t region = 0;
        for (int k = 0; k < l->nf; k++) {
            field_unpack(&l->f[k], region, r, gb, (uint8_t *)dst + (size_t)b * l->bytes);
            region += field_region(&l->f[k]);
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
    uint8_t buf[REF_ROWS * (2 + QK8_0) * 64]; /* 16 rows of up to 2048 Q8_0 elements */
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

#define DEFINE_PACKED_REF(NAME, T)                                                                 \
    static void NAME##_gemm_packed_ref(int n, int nr, int nc, const void *wp, const void *x,      \
                                       size_t x_row, float *y, size_t ldy)                         \
    {                                                                                              \
        gemm_packed_ref(T, n, nr, nc, wp, x, x_row, y, ldy);                                       \
    }
DEFINE_PACKED_REF(f16, AR_TYPE_F16)
DEFINE_PACKED_REF(bf16, AR_TYPE_BF16)
DEFINE_PACKED_REF(q8_0, AR_TYPE_Q8_0)
DEFINE_PACKED_REF(q4_0, AR_TYPE_Q4_0)
DEFINE_PACKED_REF(q5_0, AR_TYPE_Q5_0)
DEFINE_PACKED_REF(q4_K, AR_TYPE_Q4_K)
DEFINE_PACKED_REF(q5_K, AR_TYPE_Q5_K)
DEFINE_PACKED_REF(q6_K, AR_TYPE_Q6_K)

void kernels_fill_packed_ref(struct kernel_ops *ops)
{
    ops->gemm_packed[AR_TYPE_F16] = f16_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_BF16] = bf16_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q8_0] = q8_0_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q4_0] = q4_0_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q5_0] = q5_0_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q4_K] = q4_K_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q5_K] = q5_K_gemm_packed_ref;
    ops->gemm_packed[AR_TYPE_Q6_K] = q6_K_gemm_packed_ref;
}
