/* simd_test.c - every SIMD kernel variant this CPU can run, held to the scalar reference
 * (kernels_ref(), the spec) on fixed-seed random data at awkward sizes. Only entries whose
 * pointer differs from the reference's are tested (the others are the reference itself).
 * Tolerances: integer-sum dot products and gemm within 1e-5 of sum |w_i * x_i| (float
 * accumulation order is all that differs); quantizers byte for byte; f32 ops as stated. */
#include "harness/harness.h"

#include <math.h>

#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"
#include "kernels/quants.h"

#define MAX_VARIANTS 8

static const int f32_sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 255, 256, 257, 1000};
static const int block_counts[] = {1, 2, 3, 7, 8, 9};
static const int tile_sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The SIMD variants this build has (kernels_internal.h). Each per-variant test case runs once
 * per name (its state), and skips, counted by tests/run.sh, when the CPU lacks that variant:
 * a test that compared nothing never passes. */
static const char *const simd_names[] = {"avx2", "avx512", "avx512_vnni", "avx512_bf16"};

/* The variant the test case is for (*state names it; "ref" for the cases that also hold the
 * reference to an independent truth) as a one-entry list; skips the case when the CPU cannot
 * run it. */
static int simd_variants(void **state, const struct kernel_ops **out)
{
    const struct kernel_ops *all[MAX_VARIANTS];
    const char *want = *state;
    int n = kernels_variants(all, MAX_VARIANTS);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++)
        if (strcmp(all[i]->name, want) == 0) {
            out[0] = all[i];
            return 1;
        }
    char why[96];
    snprintf(why, sizeof(why), "this CPU cannot run the %s kernels", want);
    th_skip_hw(why);
    return 0;
}

/* Comparisons made by the helpers below (dot, quantizer bytes, f32 values). */
static int g_compared;

/* Ends a per-variant case: prints what it compared, and skips when that was nothing (the
 * variant has no entry of its own of this kind: all inherited from ref). */
static void done(void **state, const char *what, int checked)
{
    if (checked == 0) {
        char why[128];
        snprintf(why, sizeof(why), "%s has no %s of its own to compare", (const char *)*state,
                 what);
        th_skip_hw(why);
    }
    print_message("[%s] %s: %d comparisons\n", (const char *)*state, what, checked);
}

static void fill_f32(struct th_rng *r, float *x, int n, float scale)
{
    for (int i = 0; i < n; i++)
        x[i] = th_rng_f32(r) * scale;
}

static const enum ar_type weight_types[] = {
    AR_TYPE_F32,  AR_TYPE_F16,  AR_TYPE_BF16, AR_TYPE_Q8_0, AR_TYPE_Q4_0, AR_TYPE_Q4_1,
    AR_TYPE_Q5_0, AR_TYPE_Q5_1, AR_TYPE_Q4_K, AR_TYPE_Q5_K, AR_TYPE_Q6_K};

static bool is_float_type(enum ar_type t)
{
    return t == AR_TYPE_F32 || t == AR_TYPE_F16 || t == AR_TYPE_BF16;
}

static ar_f16 random_scale(struct th_rng *r, float lo, float hi)
{
    float v = lo + (hi - lo) * 0.5f * (th_rng_f32(r) + 1.0f);
    return ar_f32_to_f16(th_rng_u64(r) & 1 ? -v : v);
}

/* A weight row of n elements of type t: float types from random floats; quantized types from
 * random bytes (every bit pattern of the quants, scales and mins) with sane f16 scales. */
static void make_weight_row(struct th_rng *r, enum ar_type t, int n, uint8_t *dst)
{
    const struct ar_type_info *ti = ar_type_info(t);
    size_t size = ar_type_row_size(t, n);
    if (is_float_type(t)) {
        float *f = malloc((size_t)n * sizeof(float));
        assert_non_null(f);
        fill_f32(r, f, n, 1.0f);
        assert_int_equal(kernels_quantize_row(t, f, dst, n), size);
        free(f);
        return;
    }
    for (size_t i = 0; i < size; i++)
        dst[i] = (uint8_t)th_rng_u64(r);
    for (int b = 0; b < n / ti->block_size; b++) {
        uint8_t *blk = dst + (size_t)b * (size_t)ti->type_size;
        ar_f16 d = random_scale(r, 0.001f, 0.02f), dmin = random_scale(r, 0.001f, 0.02f);
        switch (t) {
        case AR_TYPE_Q8_0:
        case AR_TYPE_Q4_0:
        case AR_TYPE_Q5_0:
            memcpy(blk, &d, 2);
            break;
        case AR_TYPE_Q4_1: /* d, then a signed min m */
        case AR_TYPE_Q5_1:
        case AR_TYPE_Q4_K:
        case AR_TYPE_Q5_K:
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
            break;
        case AR_TYPE_Q6_K:
            memcpy(blk + offsetof(struct block_q6_K, d), &d, 2);
            break;
        default:
            fail_msg("no weight maker for type %d", t);
        }
    }
}

/* An activation row of n elements in the vec-dot type of t, made by the reference quantizer. */
static void make_act_row(struct th_rng *r, enum ar_type t, int n, uint8_t *dst)
{
    enum ar_type at = kernels_vec_dot_type(t);
    float *f = malloc((size_t)n * sizeof(float));
    assert_non_null(f);
    fill_f32(r, f, n, 2.0f);
    kernels_ref()->from_float[at](f, dst, n);
    free(f);
}

/* sum |w_i * x_i| over the dequantized rows: the scale of the rounding allowance. */
static double abs_terms(enum ar_type t, int n, const void *w, const void *x)
{
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    double s = 0.0;
    assert_non_null(a);
    assert_non_null(b);
    kernels_dequantize_row(t, w, a, n);
    kernels_dequantize_row(kernels_vec_dot_type(t), x, b, n);
    for (int i = 0; i < n; i++)
        s += fabs((double)a[i] * (double)b[i]);
    free(a);
    free(b);
    return s;
}

static void assert_dot_close(float got, float want, double terms, const char *what, const char *v,
                             enum ar_type t, int n)
{
    double tol = 1e-5 * terms + 1e-30;
    if (!(fabs((double)got - (double)want) <= tol))
        fail_msg("%s %s %s n=%d: got %.9g want %.9g (tol %.3g)", v, what, ar_type_name(t), n,
                 (double)got, (double)want, tol);
}

/* ---- dot products ---------------------------------------------------------------------------- */

static void vec_dot_matches_reference_for_every_weight_type(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs), checked = 0;
    for (int v = 0; v < nv; v++) {
        for (int ti = 0; ti < COUNT(weight_types); ti++) {
            enum ar_type t = weight_types[ti];
            int bs = ar_type_info(t)->block_size;
            int nsizes = is_float_type(t) ? COUNT(f32_sizes) : COUNT(block_counts);
            if (vs[v]->vec_dot[t] == ref->vec_dot[t])
                continue;
            for (int si = 0; si < nsizes; si++) {
                int n = is_float_type(t) ? f32_sizes[si] : block_counts[si] * bs;
                struct th_rng r = {0x5eed0000u + (uint64_t)(ti * 100 + si)};
                uint8_t *w = malloc(ar_type_row_size(t, n));
                uint8_t *x = malloc(ar_type_row_size(kernels_vec_dot_type(t), n));
                float got = NAN, want = NAN;
                assert_non_null(w);
                assert_non_null(x);
                make_weight_row(&r, t, n, w);
                make_act_row(&r, t, n, x);
                ref->vec_dot[t](n, &want, w, x);
                vs[v]->vec_dot[t](n, &got, w, x);
                assert_dot_close(got, want, abs_terms(t, n, w, x), "vec_dot", vs[v]->name, t, n);
                checked++;
                free(w);
                free(x);
            }
        }
    }
    done(state, "vec_dot", checked);
}

/* Every (nr, nc) tile edge, with row strides padded past the row size and ldy > nr, so a tile
 * that reads the wrong row or writes outside its slot is caught. */
static void gemm_matches_reference_dot_at_every_tile_edge(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs), checked = 0;
    for (int v = 0; v < nv; v++) {
        for (int ti = 0; ti < COUNT(weight_types); ti++) {
            enum ar_type t = weight_types[ti];
            enum ar_type at = kernels_vec_dot_type(t);
            int n = is_float_type(t) ? 37 : 2 * ar_type_info(t)->block_size;
            int maxr = tile_sizes[COUNT(tile_sizes) - 1];
            size_t w_row = ar_type_row_size(t, n) + 8, x_row = ar_type_row_size(at, n) + 24;
            struct th_rng r = {0x9e3779b9u + (uint64_t)ti};
            uint8_t *w, *x;
            float *y;
            if (vs[v]->gemm[t] == ref->gemm[t])
                continue;
            w = calloc((size_t)maxr, w_row);
            x = calloc((size_t)maxr, x_row);
            y = malloc(sizeof(float) * (size_t)(maxr + 3) * (size_t)maxr);
            assert_non_null(w);
            assert_non_null(x);
            assert_non_null(y);
            for (int i = 0; i < maxr; i++) {
                make_weight_row(&r, t, n, w + (size_t)i * w_row);
                make_act_row(&r, t, n, x + (size_t)i * x_row);
            }
            for (int a = 0; a < COUNT(tile_sizes); a++) {
                for (int b = 0; b < COUNT(tile_sizes); b++) {
                    int nr = tile_sizes[a], nc = tile_sizes[b];
                    size_t ldy = (size_t)nr + 3;
                    for (size_t k = 0; k < ldy * (size_t)nc; k++)
                        y[k] = -12345.0f;
                    vs[v]->gemm[t](n, nr, nc, w, w_row, x, x_row, y, ldy);
                    for (int j = 0; j < nc; j++) {
                        for (int i = 0; i < nr; i++) {
                            const uint8_t *wi = w + (size_t)i * w_row, *xj = x + (size_t)j * x_row;
                            float want;
                            ref->vec_dot[t](n, &want, wi, xj);
                            assert_dot_close(y[(size_t)j * ldy + (size_t)i], want,
                                             abs_terms(t, n, wi, xj), "gemm", vs[v]->name, t, n);
                        }
                        for (size_t i = (size_t)nr; i < ldy; i++)
                            assert_true(y[(size_t)j * ldy + i] == -12345.0f);
                    }
                    checked++;
                }
            }
            free(w);
            free(x);
            free(y);
        }
    }
    done(state, "gemm tile shapes", checked);
}

/* Batch-sized products (many activation rows, long rows): the shapes of a prompt's matmuls,
 * where kernels may take a different path than for a few rows (k split in chunks, more than
 * 64 activation rows, partial groups of 16 weight rows). */
static int check_gemm_shapes(void **state, const int (*shapes)[3], int n_shapes, const char *what)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs), checked = 0;
    for (int v = 0; v < nv; v++) {
        for (int ti = 0; ti < COUNT(weight_types); ti++) {
            enum ar_type t = weight_types[ti], at = kernels_vec_dot_type(t);
            if (vs[v]->gemm[t] == ref->gemm[t])
                continue;
            for (int si = 0; si < n_shapes; si++) {
                int nr = shapes[si][0], nc = shapes[si][1];
                int n = shapes[si][2] * (is_float_type(t) ? 8 : ar_type_info(t)->block_size);
                size_t w_row = ar_type_row_size(t, n) + 4, x_row = ar_type_row_size(at, n) + 12;
                size_t ldy = (size_t)nr + 5;
                struct th_rng r = {0xbadc0deu + (uint64_t)(ti * 10 + si)};
                uint8_t *w = calloc((size_t)nr, w_row), *x = calloc((size_t)nc, x_row);
                float *y = malloc(sizeof(float) * ldy * (size_t)nc);
                assert_true(w && x && y);
                for (int i = 0; i < nr; i++)
                    make_weight_row(&r, t, n, w + (size_t)i * w_row);
                for (int j = 0; j < nc; j++)
                    make_act_row(&r, t, n, x + (size_t)j * x_row);
                for (size_t k = 0; k < ldy * (size_t)nc; k++)
                    y[k] = -12345.0f;
                vs[v]->gemm[t](n, nr, nc, w, w_row, x, x_row, y, ldy);
                for (int j = 0; j < nc; j++) {
                    for (int i = 0; i < nr; i++) {
                        const uint8_t *wi = w + (size_t)i * w_row, *xj = x + (size_t)j * x_row;
                        float want;
                        ref->vec_dot[t](n, &want, wi, xj);
                        assert_dot_close(y[(size_t)j * ldy + (size_t)i], want,
                                         abs_terms(t, n, wi, xj), what, vs[v]->name, t, n);
                    }
                    for (size_t i = (size_t)nr; i < ldy; i++)
                        assert_true(y[(size_t)j * ldy + i] == -12345.0f);
                }
                checked++;
                free(w);
                free(x);
                free(y);
            }
        }
    }
    return checked;
}

static void gemm_matches_reference_dot_on_batch_shapes(void **state)
{
    static const int shapes[][3] = {{33, 70, 19}, {16, 8, 9}, {5, 65, 40}, {48, 12, 1}};
    done(state, "batch gemm shapes", check_gemm_shapes(state, shapes, COUNT(shapes), "batch gemm"));
}

/* The decode prefetch settings (kernels_internal.h): the kernels against one activation row
 * take another path with it on, so the tests of that case run both */
static const enum decode_prefetch decode_prefetches[] = {DECODE_PREFETCH_OFF, DECODE_PREFETCH_L2};

/* One activation row (decode): kernels may prepare the activation row once per call and
 * stream the weights; rows of an odd block count, and rows longer than 32768 activations
 * (which some kernels take in chunks), over a few weight rows; the decode prefetch off and
 * on. */
static void gemm_matches_reference_dot_for_one_activation_row(void **state)
{
    static const int shapes[][3] = {{7, 1, 1}, {3, 1, 3}, {9, 1, 28}, {5, 1, 152},
                                    {3, 1, 1027}, {2, 1, 2048}};
    const enum decode_prefetch chosen = kernels_decode_prefetch;
    int checked = 0;
    for (int p = 0; p < COUNT(decode_prefetches); p++) {
        kernels_decode_prefetch = decode_prefetches[p];
        checked += check_gemm_shapes(state, shapes, COUNT(shapes),
                                     p ? "gemv, decode prefetch on" : "gemv, decode prefetch off");
    }
    kernels_decode_prefetch = chosen;
    done(state, "gemv shapes", checked);
}

/* Whether a batch row's products depend on the batch: the same weight and activation rows
 * give bit-identical outputs with few activation rows (kernels may take another loop order
 * for them) as with many, and when the weight rows are split into calls at any row. 12 and 16
 * rows against rows of a 40-row call: all at or above the sizes where kernels switch from
 * register tiles to lane-packed products (whose sums round differently). */
static void gemm_rows_do_not_depend_on_batch_size_or_row_split(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs), checked = 0;
    const int nr = 37, nc_many = 40, few[] = {12, 16};
    for (int v = 0; v < nv; v++) {
        for (int ti = 0; ti < COUNT(weight_types); ti++) {
            enum ar_type t = weight_types[ti], at = kernels_vec_dot_type(t);
            int n = (is_float_type(t) ? 8 : ar_type_info(t)->block_size) * 11;
            size_t w_row = ar_type_row_size(t, n), x_row = ar_type_row_size(at, n) + 4;
            size_t ldy = (size_t)nr;
            struct th_rng r = {0x5eed5u + (uint64_t)ti};
            uint8_t *w, *x;
            float *ym, *yf;
            if (vs[v]->gemm[t] == ref->gemm[t])
                continue;
            w = calloc((size_t)nr, w_row);
            x = calloc((size_t)nc_many, x_row);
            ym = malloc(sizeof(float) * ldy * (size_t)nc_many);
            yf = malloc(sizeof(float) * ldy * (size_t)nc_many);
            assert_true(w && x && ym && yf);
            for (int i = 0; i < nr; i++)
                make_weight_row(&r, t, n, w + (size_t)i * w_row);
            for (int j = 0; j < nc_many; j++)
                make_act_row(&r, t, n, x + (size_t)j * x_row);
            vs[v]->gemm[t](n, nr, nc_many, w, w_row, x, x_row, ym, ldy);
            for (int f = 0; f < COUNT(few); f++) {
                /* rows [0, 21) and [21, 37) in two calls, over activation rows 3.. */
                const uint8_t *xf = x + 3 * x_row;
                vs[v]->gemm[t](n, 21, few[f], w, w_row, xf, x_row, yf, ldy);
                vs[v]->gemm[t](n, nr - 21, few[f], w + 21 * w_row, w_row, xf, x_row, yf + 21, ldy);
                for (int j = 0; j < few[f]; j++)
                    for (int i = 0; i < nr; i++)
                        if (memcmp(&yf[(size_t)j * ldy + (size_t)i],
                                   &ym[(size_t)(j + 3) * ldy + (size_t)i], sizeof(float)) != 0)
                            fail_msg("%s type %s: %d activation rows, output (%d, %d): %.9g, "
                                     "with %d rows %.9g",
                                     vs[v]->name, ar_type_info(t)->name, few[f], i, j,
                                     (double)yf[(size_t)j * ldy + (size_t)i], nc_many,
                                     (double)ym[(size_t)(j + 3) * ldy + (size_t)i]);
                checked++;
            }
            free(w);
            free(x);
            free(ym);
            free(yf);
        }
    }
    done(state, "batch-size independence cases", checked);
}

/* The orders and prefetches a packed gemm may take per CPU (kernels_internal.h), set in turn:
 * the pairs unprefetched, the stream prefetched */
static const struct {
    enum batch_gemm batch;
    enum decode_prefetch prefetch;
    const char *name;
} packed_orders[] = {{BATCH_GEMM_PAIRS, DECODE_PREFETCH_OFF, "pairs, unprefetched"},
                     {BATCH_GEMM_STREAM, DECODE_PREFETCH_L2, "stream, prefetched"}};

/* In each of packed_orders (the CPU's own restored after), every variant's packed gemm of type
 * t against its gemm on the unpacked rows, bit for bit, at every tile of nrs x ncs (the tile
 * starting at the second group where there is one): w holds nr_max rows, wp the same packed.
 * Returns the number of tiles checked; *variants (if not NULL): the variants with a packed
 * gemm of t. */
static int packed_passes(enum ar_type t, int n, const uint8_t *w, size_t w_row, const uint8_t *wp,
                         int nr_max, const uint8_t *x, size_t x_row, const int *nrs, int n_nrs,
                         const int *ncs, int n_ncs, float *y1, float *y2, int *variants)
{
    const struct kernel_ops *vs[MAX_VARIANTS];
    const enum batch_gemm chosen = kernels_batch_gemm;
    const enum decode_prefetch chosen_prefetch = kernels_decode_prefetch;
    int nv = kernels_variants(vs, MAX_VARIANTS), checked = 0;
    if (variants)
        *variants = 0;
    for (int o = 0; o < COUNT(packed_orders); o++) {
        kernels_batch_gemm = packed_orders[o].batch;
        kernels_decode_prefetch = packed_orders[o].prefetch;
        for (int v = 0; v < nv; v++) {
            if (!vs[v]->gemm_packed[t])
                continue;
            if (variants && o == 0)
                (*variants)++;
            for (int a = 0; a < n_nrs; a++) {
                for (int c = 0; c < n_ncs; c++) {
                    int nr = nrs[a], nc = ncs[c], i0 = nr_max - nr >= 16 ? 16 : 0;
                    vs[v]->gemm[t](n, nr, nc, w + (size_t)i0 * w_row, w_row, x, x_row, y1,
                                   (size_t)nr);
                    vs[v]->gemm_packed[t](n, nr, nc, wp + kernels_packed_offset(t, n, i0), x, x_row,
                                          y2, (size_t)nr);
                    for (int k = 0; k < nr * nc; k++)
                        if (memcmp(&y1[k], &y2[k], sizeof(float)) != 0)
                            fail_msg("%s %s n=%d (%s): packed (%d, %d) of %d x %d: %.9g, "
                                     "gemm %.9g",
                                     vs[v]->name, ar_type_name(t), n, packed_orders[o].name, k % nr,
                                     k / nr, nr, nc, (double)y2[k], (double)y1[k]);
                    checked++;
                }
            }
        }
    }
    kernels_batch_gemm = chosen;
    kernels_decode_prefetch = chosen_prefetch;
    return checked;
}

/* Packed weights (kernels.h "x16"): unpacking gives every row back byte for byte, the
 * reference packed gemm equals the reference gemm bit for bit, and each variant's packed gemm
 * equals its own gemm on the unpacked rows bit for bit, at row counts that leave a partial
 * last group, tiles that start at any group, one to 70 activation rows and odd block
 * counts. */
static void packed_gemm_equals_gemm_on_the_unpacked_rows(void **state)
{
    int checked = 0, packed_variants = 0;
    static const enum ar_type types[] = {AR_TYPE_Q8_0, AR_TYPE_Q4_0, AR_TYPE_Q5_0, AR_TYPE_Q4_K,
                                         AR_TYPE_Q5_K, AR_TYPE_Q6_K, AR_TYPE_F16, AR_TYPE_BF16};
    static const int nrs[] = {1, 15, 16, 17, 40, 67};
    static const int ncs[] = {1, 2, 5, 7, 8, 13, 16, 17, 33, 48, 49, 70};
    static const int nbs[] = {1, 3, 8, 9, 24};
    (void)state;
    assert_int_equal(kernels_packed_group(AR_TYPE_Q4_1, 256), 0);
    assert_int_equal(kernels_packed_group(AR_TYPE_Q8_0, 48), 0);
    assert_int_equal(kernels_packed_group(AR_TYPE_Q6_K, 384), 0);
    assert_int_equal(kernels_packed_group(AR_TYPE_F16, 48), 0);
    assert_int_equal(kernels_packed_group(AR_TYPE_F32, 64), 0);
    for (int ti = 0; ti < COUNT(types); ti++) {
        enum ar_type t = types[ti];
        for (int bi = 0; bi < COUNT(nbs); bi++) {
            /* blocks of 32 elements (F16/BF16 too), K-quants' super-blocks of 256 */
            int n = AR_MAX(32, ar_type_info(t)->block_size) * nbs[bi], nr_max = 67, nc_max = 70;
            size_t w_row = ar_type_row_size(t, n);
            size_t x_row = ar_type_row_size(kernels_vec_dot_type(t), n);
            size_t psize = kernels_packed_size(t, n, nr_max);
            struct th_rng r = {0x9ac4edu + (uint64_t)(ti * 31 + bi)};
            uint8_t *w = malloc(w_row * nr_max), *x = malloc(x_row * nc_max);
            uint8_t *wp = ar_malloc_aligned(psize), *back = malloc(w_row);
            float *y1 = malloc(sizeof(float) * nr_max * nc_max);
            float *y2 = malloc(sizeof(float) * nr_max * nc_max);
            assert_true(w && x && wp && back && y1 && y2);
            /* a copy in another order: 16 rows' bytes per group, nothing added but Q6_K's
             * 32 bytes per block of a group */
            assert_int_equal(psize, (w_row + (t == AR_TYPE_Q6_K ? 2 * (size_t)nbs[bi] : 0)) *
                                        (size_t)((nr_max + 15) / 16 * 16));
            for (int i = 0; i < nr_max; i++)
                make_weight_row(&r, t, n, w + (size_t)i * w_row);
            for (int j = 0; j < nc_max; j++)
                make_act_row(&r, t, n, x + (size_t)j * x_row);
            kernels_pack_rows(t, w, w_row, n, nr_max, wp);
            for (int i = 0; i < nr_max; i++) {
                kernels_unpack_row(t, wp, n, i, back);
                assert_memory_equal(back, w + (size_t)i * w_row, w_row);
            }
            /* each order (kernels_internal.h), whichever the CPU chose */
            int variants;
            checked += packed_passes(t, n, w, w_row, wp, nr_max, x, x_row, nrs, COUNT(nrs), ncs,
                                     COUNT(ncs), y1, y2, &variants);
            if (bi == 0 && ti == 0)
                packed_variants = variants;
            free(w);
            free(x);
            ar_free_aligned(wp);
            free(back);
            free(y1);
            free(y2);
        }
    }
    /* the reference table has a packed gemm, so every CPU runs this test */
    assert_true(packed_variants >= 1);
    print_message("packed gemm: %d tiles over %d variant(s) with a packed gemm\n", checked,
                  packed_variants);
}

/* Long rows: the one-row GEMV holds a row's activation sums for up to 16 x 512 blocks (avx512.c
 * pk_gemm), a few rows' for up to 512; past that the packed gemm takes its many-rows order.
 * Each side of both bounds, one to three rows, bit for bit against the gemm on the unpacked rows.
 */
static void packed_gemm_over_long_rows_equals_gemm(void **state)
{
    int checked = 0;
    static const enum ar_type types[] = {AR_TYPE_Q8_0, AR_TYPE_Q4_0, AR_TYPE_Q5_0};
    static const int nbs[] = {512, 513, 8192, 8193};
    static const int nrs[] = {17}, ncs[] = {1, 2, 3};
    const int nr_max = 33, nc_max = 17;
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    const int nv = kernels_variants(vs, MAX_VARIANTS);
    (void)state;
    for (int ti = 0; ti < COUNT(types); ti++) {
        enum ar_type t = types[ti];
        for (int bi = 0; bi < COUNT(nbs); bi++) {
            int n = 32 * nbs[bi];
            size_t w_row = ar_type_row_size(t, n);
            size_t x_row = ar_type_row_size(kernels_vec_dot_type(t), n);
            size_t psize = kernels_packed_size(t, n, nr_max);
            struct th_rng r = {0x51ab3u + (uint64_t)(ti * 7 + bi)};
            uint8_t *w = malloc(w_row * nr_max), *x = malloc(x_row * nc_max);
            uint8_t *wp = ar_malloc_aligned(psize);
            float *y1 = malloc(sizeof(float) * nr_max * nc_max);
            float *y2 = malloc(sizeof(float) * nr_max * nc_max);
            assert_true(w && x && wp && y1 && y2);
            for (int i = 0; i < nr_max; i++)
                make_weight_row(&r, t, n, w + (size_t)i * w_row);
            for (int j = 0; j < nc_max; j++)
                make_act_row(&r, t, n, x + (size_t)j * x_row);
            kernels_pack_rows(t, w, w_row, n, nr_max, wp);
            checked += packed_passes(t, n, w, w_row, wp, nr_max, x, x_row, nrs, COUNT(nrs), ncs,
                                     COUNT(ncs), y1, y2, NULL);
            /* each variant's gemm against the reference with 17 activation rows (kernels may
             * take 16 rows, then 1, with blocks in chunks whose length depends on the rows) */
            for (int v = 0; v < nv; v++) {
                if (vs[v]->gemm[t] == ref->gemm[t])
                    continue;
                vs[v]->gemm[t](n, 17, nc_max, w, w_row, x, x_row, y1, 17);
                for (int j = 0; j < nc_max; j++)
                    for (int i = 0; i < 17; i++) {
                        const uint8_t *wi = w + (size_t)i * w_row, *xj = x + (size_t)j * x_row;
                        float want;
                        ref->vec_dot[t](n, &want, wi, xj);
                        assert_dot_close(y1[j * 17 + i], want, abs_terms(t, n, wi, xj),
                                         "long-row gemm", vs[v]->name, t, n);
                    }
                checked++;
            }
            free(w);
            free(x);
            ar_free_aligned(wp);
            free(y1);
            free(y2);
        }
    }
    /* at least the reference's packed gemm, every type, every length, both orders */
    assert_true(checked >= COUNT(types) * COUNT(nbs) * COUNT(packed_orders) * COUNT(ncs));
    print_message("packed gemm over long rows: %d tiles\n", checked);
}

/* The stronger form, for every variant (the reference included) and weight type: a 40 x 37
 * product in one call is the reference for the same products computed with the activation
 * rows in calls of 1, 2, 3, 5, 8, 9, 12, 16 or 17 rows and the weight rows in calls of 1, 3,
 * 16, 17 or all 40 rows (every combination, so each output falls at many tile and lane
 * positions), and with vec_dot: all bit-identical. Row lengths are odd in blocks (pairs of
 * blocks with a single last one) and, for float types, not a multiple of the vector width. */
static void gemm_outputs_are_bit_identical_for_every_call_split(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS];
    const enum decode_prefetch chosen = kernels_decode_prefetch;
    int nv = kernels_variants(vs, MAX_VARIANTS), checked = 0;
    enum { NR = 40, NC = 37 };
    static const int col_splits[] = {1, 2, 3, 5, 8, 9, 12, 16, 17};
    static const int row_splits[] = {1, 3, 16, 17, NR};
    (void)state;
    for (int vp = 0; vp < nv * COUNT(decode_prefetches); vp++) {
        const int v = vp % nv;
        kernels_decode_prefetch = decode_prefetches[vp / nv];
        for (int ti = 0; ti < COUNT(weight_types); ti++) {
            enum ar_type t = weight_types[ti], at = kernels_vec_dot_type(t);
            int bs = ar_type_info(t)->block_size;
            int n = is_float_type(t) ? 8 * 11 + 3 : bs == QK_K ? 3 * bs : 11 * bs;
            size_t w_row = ar_type_row_size(t, n) + 8, x_row = ar_type_row_size(at, n) + 12;
            size_t ldy = NR + 3;
            struct th_rng r = {0xb17b17u + (uint64_t)ti};
            uint8_t *w = calloc(NR, w_row), *x = calloc(NC, x_row);
            float *y1 = malloc(sizeof(float) * ldy * NC), *ys = malloc(sizeof(float) * ldy * NC);
            assert_true(w && x && y1 && ys);
            for (int i = 0; i < NR; i++)
                make_weight_row(&r, t, n, w + (size_t)i * w_row);
            for (int j = 0; j < NC; j++)
                make_act_row(&r, t, n, x + (size_t)j * x_row);
            vs[v]->gemm[t](n, NR, NC, w, w_row, x, x_row, y1, ldy);
            for (int a = 0; a < COUNT(row_splits); a++) {
                for (int b = 0; b < COUNT(col_splits); b++) {
                    int rs = row_splits[a], cs = col_splits[b];
                    for (size_t k = 0; k < ldy * NC; k++)
                        ys[k] = NAN;
                    for (int i0 = 0; i0 < NR; i0 += rs)
                        for (int j0 = 0; j0 < NC; j0 += cs)
                            vs[v]->gemm[t](n, AR_MIN(rs, NR - i0), AR_MIN(cs, NC - j0),
                                           w + (size_t)i0 * w_row, w_row, x + (size_t)j0 * x_row,
                                           x_row, ys + (size_t)j0 * ldy + (size_t)i0, ldy);
                    for (int j = 0; j < NC; j++)
                        for (int i = 0; i < NR; i++)
                            if (memcmp(&ys[(size_t)j * ldy + (size_t)i],
                                       &y1[(size_t)j * ldy + (size_t)i], sizeof(float)) != 0)
                                fail_msg("%s %s: output (%d, %d) in calls of %d x %d rows "
                                         "(decode prefetch %s): %.9g, in one call: %.9g",
                                         vs[v]->name, ar_type_name(t), i, j, rs, cs,
                                         vp / nv ? "on" : "off",
                                         (double)ys[(size_t)j * ldy + (size_t)i],
                                         (double)y1[(size_t)j * ldy + (size_t)i]);
                    checked++;
                }
            }
            for (int j = 0; j < NC; j++) {
                for (int i = 0; i < NR; i++) {
                    float d = NAN;
                    vs[v]->vec_dot[t](n, &d, w + (size_t)i * w_row, x + (size_t)j * x_row);
                    if (memcmp(&d, &y1[(size_t)j * ldy + (size_t)i], sizeof(float)) != 0)
                        fail_msg("%s %s: vec_dot of (%d, %d) %.9g, gemm %.9g", vs[v]->name,
                                 ar_type_name(t), i, j, (double)d,
                                 (double)y1[(size_t)j * ldy + (size_t)i]);
                }
            }
            checked++;
            free(w);
            free(x);
            free(y1);
            free(ys);
        }
    }
    kernels_decode_prefetch = chosen;
    print_message("call-split independence: %d cases over %d variant(s), decode prefetch off and "
                  "on\n",
                  checked, nv);
}

/* ---- activation quantizers ---------------------------------------------------------------- */

static const enum ar_type act_types[] = {AR_TYPE_Q8_0, AR_TYPE_Q8_K, AR_TYPE_F16, AR_TYPE_BF16};

static void check_from_float(const struct kernel_ops *v, enum ar_type t, const float *x, int n)
{
    size_t size = ar_type_row_size(t, n);
    uint8_t *a = malloc(size), *b = malloc(size);
    assert_non_null(a);
    assert_non_null(b);
    memset(a, 0xaa, size);
    memset(b, 0x55, size);
    kernels_ref()->from_float[t](x, a, n);
    v->from_float[t](x, b, n);
    for (size_t i = 0; i < size; i++)
        if (a[i] != b[i])
            fail_msg("%s from_float %s n=%d: byte %zu is %02x, reference %02x", v->name,
                     ar_type_name(t), n, i, b[i], a[i]);
    g_compared++;
    free(a);
    free(b);
}

static void activation_quantizers_match_reference_bytes(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs), checked = 0;
    for (int v = 0; v < nv; v++) {
        for (int ti = 0; ti < COUNT(act_types); ti++) {
            enum ar_type t = act_types[ti];
            int bs = ar_type_info(t)->block_size;
            bool blocked = bs > 1;
            int nsizes = blocked ? COUNT(block_counts) : COUNT(f32_sizes);
            if (vs[v]->from_float[t] == ref->from_float[t])
                continue;
            for (int si = 0; si < nsizes; si++) {
                int n = blocked ? block_counts[si] * bs : f32_sizes[si];
                struct th_rng r = {0xc0ffeeu + (uint64_t)(ti * 100 + si)};
                float *x = malloc((size_t)n * sizeof(float));
                assert_non_null(x);
                /* magnitudes spread over many binades, with an all-zero first block */
                for (int i = 0; i < n; i++)
                    x[i] = th_rng_f32(&r) * ldexpf(1.0f, (int)(th_rng_u64(&r) % 24) - 12);
                if (si == 1)
                    memset(x, 0, (size_t)bs * sizeof(float));
                check_from_float(vs[v], t, x, n);
                checked++;
                free(x);
            }
        }
    }
    done(state, "from_float", checked);
}

/* Exact halves: with amax 127 (Q8_0, d = 1) or max -127 (Q8_K, iscale = 1), x * scale is
 * exactly x, so 2.5 must go to 3 in Q8_0 (away from zero) and to 2 in Q8_K (to even). */
static void activation_quantizers_round_exact_halves_like_reference(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs);
    float x[QK_K];
    for (int i = 0; i < QK_K; i++)
        x[i] = (float)((i % 50) - 25) + 0.5f;
    for (int i = 0; i < QK_K; i += QK8_0)
        x[i] = -127.0f; /* every Q8_0 block has amax 127; the Q8_K max is -127 */
    g_compared = 0;
    for (int v = 0; v < nv; v++) {
        if (vs[v]->from_float[AR_TYPE_Q8_0] != ref->from_float[AR_TYPE_Q8_0])
            check_from_float(vs[v], AR_TYPE_Q8_0, x, QK_K);
        if (vs[v]->from_float[AR_TYPE_Q8_K] != ref->from_float[AR_TYPE_Q8_K])
            check_from_float(vs[v], AR_TYPE_Q8_K, x, QK_K);
    }
    /* the reference itself: independent truth for the two rounding rules */
    struct block_q8_0 q0[QK_K / QK8_0];
    struct block_q8_K qk;
    ref->from_float[AR_TYPE_Q8_0](x, q0, QK_K);
    ref->from_float[AR_TYPE_Q8_K](x, &qk, QK_K);
    assert_int_equal(q0[0].qs[1], (int)roundf(x[1])); /* x[1] = -23.5 -> -24 */
    assert_int_equal(q0[0].qs[1], -24);
    assert_int_equal(qk.qs[1], -24); /* -23.5 -> even */
    assert_int_equal(qk.qs[2], -22); /* -22.5 -> even */
    done(state, "exact-half quantizer rows", g_compared);
}

/* Q8_K takes its scale's sign from the first value of largest magnitude: with +3 before -3
 * the block maps +3 to -127, with -3 first it maps -3 there (two blocks, one each way) */
static void q8_K_first_largest_magnitude_sets_the_sign(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs);
    float x[2 * QK_K];
    struct block_q8_K qk[2];
    for (int i = 0; i < 2 * QK_K; i++)
        x[i] = (float)(i % 7) * 0.25f - 0.75f;
    x[37] = 3.0f;
    x[200] = -3.0f;
    x[QK_K + 21] = -3.0f;
    x[QK_K + 250] = 3.0f;
    g_compared = 0;
    for (int v = 0; v < nv; v++)
        if (vs[v]->from_float[AR_TYPE_Q8_K] != ref->from_float[AR_TYPE_Q8_K])
            check_from_float(vs[v], AR_TYPE_Q8_K, x, 2 * QK_K);
    /* the reference itself */
    ref->from_float[AR_TYPE_Q8_K](x, qk, 2 * QK_K);
    assert_int_equal(qk[0].qs[37], -127);
    assert_int_equal(qk[0].qs[200], 127);
    assert_int_equal(qk[1].qs[21], -127);
    assert_int_equal(qk[1].qs[250], 127);
    done(state, "Q8_K first-maximum rows", g_compared);
}

/* ---- f32 vector ops ----------------------------------------------------------------------- */

static void close_or_fail(float got, float want, double tol, const char *v, const char *what,
                          int n, int i)
{
    if (!(fabs((double)got - (double)want) <= tol))
        fail_msg("%s %s n=%d [%d]: got %.9g want %.9g (tol %.3g)", v, what, n, i, (double)got,
                 (double)want, tol);
    g_compared++;
}

static void f32_ops_match_reference(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS], *ref = kernels_ref();
    int nv = simd_variants(state, vs);
    g_compared = 0;
    for (int v = 0; v < nv; v++) {
        const struct kernel_ops *k = vs[v];
        for (int si = 0; si < COUNT(f32_sizes); si++) {
            int n = f32_sizes[si];
            struct th_rng r = {0xf00du + (uint64_t)si};
            float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
            float *c = malloc(sizeof(float) * (size_t)n), *d = malloc(sizeof(float) * (size_t)n);
            ar_f16 *h = malloc(sizeof(ar_f16) * (size_t)n);
            double terms = 0.0;
            assert_true(a && b && c && d && h);
            fill_f32(&r, a, n, 3.0f);
            fill_f32(&r, b, n, 3.0f);
            for (int i = 0; i < n; i++)
                h[i] = ar_f32_to_f16(a[i]);
            for (int i = 0; i < n; i++)
                terms += fabs((double)a[i] * (double)b[i]);
            /* dot products: 1e-5 of sum |terms| */
            if (k->dot_f32 != ref->dot_f32)
                close_or_fail(k->dot_f32(n, a, b), ref->dot_f32(n, a, b), 1e-5 * terms, k->name,
                              "dot_f32", n, 0);
            if (k->dot_f16_f32 != ref->dot_f16_f32)
                close_or_fail(k->dot_f16_f32(n, h, b), ref->dot_f16_f32(n, h, b),
                              1e-5 * terms + 1e-6, k->name, "dot_f16_f32", n, 0);
            /* axpy: per element, 1e-6 of |y| + |a x| (fused vs separate rounding) */
            if (k->axpy_f32 != ref->axpy_f32) {
                memcpy(c, b, sizeof(float) * (size_t)n);
                memcpy(d, b, sizeof(float) * (size_t)n);
                k->axpy_f32(n, 0.7f, a, c);
                ref->axpy_f32(n, 0.7f, a, d);
                for (int i = 0; i < n; i++)
                    close_or_fail(c[i], d[i], 1e-6 * (fabs((double)b[i]) + fabs(0.7 * (double)a[i])),
                                  k->name, "axpy_f32", n, i);
            }
            if (k->axpy_f16 != ref->axpy_f16) {
                memcpy(c, b, sizeof(float) * (size_t)n);
                memcpy(d, b, sizeof(float) * (size_t)n);
                k->axpy_f16(n, -1.3f, h, c);
                ref->axpy_f16(n, -1.3f, h, d);
                for (int i = 0; i < n; i++)
                    close_or_fail(c[i], d[i], 1e-6 * (fabs((double)b[i]) + fabs(1.3 * (double)a[i])),
                                  k->name, "axpy_f16", n, i);
            }
            /* rmsnorm: relative 1e-6 per element */
            if (k->rmsnorm != ref->rmsnorm) {
                k->rmsnorm(n, c, a, b, 1e-5f);
                ref->rmsnorm(n, d, a, b, 1e-5f);
                for (int i = 0; i < n; i++)
                    close_or_fail(c[i], d[i], 1e-6 * fabs((double)d[i]) + 1e-30, k->name,
                                  "rmsnorm", n, i);
            }
            /* softmax over a spread of logits: relative 1e-5 per element (vector expf) */
            if (k->softmax != ref->softmax) {
                for (int i = 0; i < n; i++)
                    c[i] = d[i] = a[i] * 10.0f;
                k->softmax(n, c);
                ref->softmax(n, d);
                for (int i = 0; i < n; i++)
                    close_or_fail(c[i], d[i], 1e-5 * fabs((double)d[i]) + 1e-12, k->name,
                                  "softmax", n, i);
            }
            /* silu_mul with gates out to +-30: relative 1e-5 per element */
            if (k->silu_mul != ref->silu_mul) {
                for (int i = 0; i < n; i++)
                    a[i] *= 10.0f;
                k->silu_mul(n, c, a, b);
                ref->silu_mul(n, d, a, b);
                for (int i = 0; i < n; i++)
                    close_or_fail(c[i], d[i], 1e-5 * fabs((double)d[i]) + 1e-30, k->name,
                                  "silu_mul", n, i);
            }
            /* gelu_mul, gates now out to +-30 (far into both tails): relative 2e-5 */
            if (k->gelu_mul != ref->gelu_mul) {
                k->gelu_mul(n, c, a, b);
                ref->gelu_mul(n, d, a, b);
                for (int i = 0; i < n; i++)
                    close_or_fail(c[i], d[i], 2e-5 * fabs((double)d[i]) + 1e-30, k->name,
                                  "gelu_mul", n, i);
            }
            free(a);
            free(b);
            free(c);
            free(d);
            free(h);
        }
    }
    done(state, "f32 op values", g_compared);
}

/* One attention case for variant vs: scores and value sums of nq query rows over nt key/value
 * rows of head size hd against plain double-precision loops over the same rows. */
static void attention_case(const struct kernel_ops *vs, int hd, int nq, int nt, bool f16,
                           uint64_t seed)
{
    enum ar_type kt = f16 ? AR_TYPE_F16 : AR_TYPE_F32;
    size_t es = f16 ? 2 : 4, stride = (size_t)hd * es * 3 + 8, s_stride = (size_t)nt + 5;
    struct th_rng r = {seed};
    float *q = malloc(sizeof(float) * (size_t)(nq * hd));
    float *kf = malloc(sizeof(float) * (size_t)(nt * hd));
    float *vf = malloc(sizeof(float) * (size_t)(nt * hd));
    uint8_t *k = calloc((size_t)nt, stride), *vv = calloc((size_t)nt, stride);
    float *sc = malloc(sizeof(float) * s_stride * (size_t)nq);
    float *out = malloc(sizeof(float) * (size_t)(nq * hd));
    assert_true(q && kf && vf && k && vv && sc && out);
    fill_f32(&r, q, nq * hd, 1.0f);
    for (int t = 0; t < nt; t++) {
        for (int i = 0; i < hd; i++) {
            float a = th_rng_f32(&r), b = th_rng_f32(&r);
            if (f16) {
                ar_f16 ha = ar_f32_to_f16(a), hb = ar_f32_to_f16(b);
                kf[t * hd + i] = ar_f16_to_f32(ha);
                vf[t * hd + i] = ar_f16_to_f32(hb);
                memcpy(k + (size_t)t * stride + 2 * (size_t)i, &ha, 2);
                memcpy(vv + (size_t)t * stride + 2 * (size_t)i, &hb, 2);
            } else {
                kf[t * hd + i] = a;
                vf[t * hd + i] = b;
                memcpy(k + (size_t)t * stride + 4 * (size_t)i, &a, 4);
                memcpy(vv + (size_t)t * stride + 4 * (size_t)i, &b, 4);
            }
        }
    }
    /* a score the kernel does not write would keep this */
    for (size_t i = 0; i < s_stride * (size_t)nq; i++)
        sc[i] = NAN;
    vs->attn_scores(hd, nq, nt, q, k, stride, kt, 0.125f, sc, s_stride);
    for (int h = 0; h < nq; h++) {
        for (int t = 0; t < nt; t++) {
            double want = 0, terms = 0;
            for (int i = 0; i < hd; i++) {
                want += (double)q[h * hd + i] * (double)kf[t * hd + i];
                terms += fabs((double)q[h * hd + i] * (double)kf[t * hd + i]);
            }
            close_or_fail(sc[(size_t)h * s_stride + (size_t)t], (float)(want * 0.125),
                          1e-6 * terms + 1e-7, vs->name, "attn_scores", hd, h * 1000 + t);
        }
        /* the reference pass scores with the table's own dot product: equal to it, bit for
         * bit, where the head size is a multiple of 16 (see kernels.h) */
        for (int t = 0; hd % 16 == 0 && t < nt; t++) {
            const void *kr = k + (size_t)t * stride;
            float want = (f16 ? vs->dot_f16_f32(hd, kr, q + h * hd) : vs->dot_f32(hd, kr, q + h * hd)) *
                         0.125f;
            if (memcmp(&want, &sc[(size_t)h * s_stride + (size_t)t], sizeof(want)))
                fail_msg("%s attn_scores hd %d nq %d nt %d [%d, %d]: %.9g, its dot product %.9g",
                         vs->name, hd, nq, nt, h, t, (double)sc[(size_t)h * s_stride + (size_t)t],
                         (double)want);
        }
        /* nothing past the nt scores of a row */
        for (size_t t = (size_t)nt; t < s_stride; t++)
            if (!isnan(sc[(size_t)h * s_stride + t]))
                fail_msg("%s attn_scores hd %d nq %d nt %d: wrote past row %d", vs->name, hd, nq,
                         nt, h);
    }
    for (int i = 0; i < nq * hd; i++)
        out[i] = 0.5f;
    vs->attn_values(hd, nq, nt, sc, s_stride, vv, stride, kt, out);
    /* and sums values with its own axpy, rows in order */
    for (int h = 0; hd % 16 == 0 && h < nq; h++) {
        float want[256];
        for (int i = 0; i < hd; i++)
            want[i] = 0.5f;
        for (int t = 0; t < nt; t++) {
            const void *vr = vv + (size_t)t * stride;
            float a = sc[(size_t)h * s_stride + (size_t)t];
            if (f16)
                vs->axpy_f16(hd, a, vr, want);
            else
                vs->axpy_f32(hd, a, vr, want);
        }
        if (memcmp(want, out + h * hd, sizeof(float) * (size_t)hd))
            fail_msg("%s attn_values hd %d nq %d nt %d row %d: not its axpy's sums", vs->name, hd,
                     nq, nt, h);
    }
    for (int h = 0; h < nq; h++) {
        for (int i = 0; i < hd; i++) {
            double want = 0.5, terms = 0.5;
            for (int t = 0; t < nt; t++) {
                double p = (double)sc[(size_t)h * s_stride + (size_t)t] * (double)vf[t * hd + i];
                want += p;
                terms += fabs(p);
            }
            close_or_fail(out[h * hd + i], (float)want, 1e-6 * terms, vs->name, "attn_values", hd,
                          h * 1000 + i);
        }
    }
    free(q);
    free(kf);
    free(vf);
    free(k);
    free(vv);
    free(sc);
    free(out);
}

/* Attention over one KV head for F32 and F16 rows, common and odd head sizes (80: a multiple
 * of 16 but not of 64), 1 to 40 query rows (the forward pass's prefill tiles: rows x heads per
 * KV head) and 1 to 70 key rows (partial and several chunks of 16). */
static void attention_ops_match_plain_loops(void **state)
{
    static const int hds[] = {64, 128, 256, 80, 24};
    static const int nqs[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 40};
    static const int nts[] = {1, 3, 13, 16, 17, 70};
    const struct kernel_ops *vs[MAX_VARIANTS + 1];
    int nv = simd_variants(state, vs), checked = 0;
    for (int v = 0; v < nv; v++)
        for (int hi = 0; hi < COUNT(hds); hi++)
            for (int qi = 0; qi < COUNT(nqs); qi++)
                for (int ti = 0; ti < COUNT(nts); ti++)
                    for (int f16 = 0; f16 < 2; f16++, checked++)
                        attention_case(vs[v], hds[hi], nqs[qi], nts[ti], f16,
                                       0xa77e0u + (uint64_t)(hi * 1000 + qi * 100 + ti * 10 + f16));
    done(state, "attention cases", checked);
}

/* rope over whole and partial rotations (rope_dim < head_dim), both pair layouts, rotated
 * halves of 1 to 64 pairs (vector bodies and scalar tails): a variant gives the reference's
 * bits, dims past rope_dim untouched; the reference is within a few roundings of the rotation
 * computed in double. */
static void rope_matches_reference_bits(void **state)
{
    static const int shapes[][3] = {/* head_dim, rope_dim, heads */
                                    {64, 64, 3}, {128, 128, 2}, {128, 64, 2}, {96, 96, 1},
                                    {80, 40, 2}, {256, 256, 1}, {8, 8, 2},    {2, 2, 3}};
    const struct kernel_ops *vs[MAX_VARIANTS + 1];
    const struct kernel_ops *ref = kernels_ref();
    int nv = simd_variants(state, vs), checked = 0;
    for (int v = 0; v < nv; v++) {
        for (int si = 0; si < COUNT(shapes); si++) {
            for (int neox = 0; neox < 2; neox++) {
                int hd = shapes[si][0], rd = shapes[si][1], nh = shapes[si][2], n = hd * nh;
                struct th_rng r = {0x20be + (uint64_t)(si * 2 + neox)};
                float x[768], a[768], b[768], cs[256];
                for (int i = 0; i < n; i++)
                    x[i] = th_rng_f32(&r) * 8.0f;
                for (int i = 0; i < rd; i++)
                    cs[i] = th_rng_f32(&r);
                memcpy(a, x, sizeof(float) * (size_t)n);
                memcpy(b, x, sizeof(float) * (size_t)n);
                ref->rope(a, nh, hd, rd, neox, cs);
                if (vs[v] == ref) {
                    /* the reference against the rotation in double */
                    for (int h = 0; h < nh; h++)
                        for (int i = 0; i < rd / 2; i++) {
                            int p = h * hd + (neox ? i : 2 * i);
                            int q = h * hd + (neox ? i + rd / 2 : 2 * i + 1);
                            double c = cs[2 * i], s = cs[2 * i + 1], x0 = x[p], x1 = x[q];
                            double mag = fabs(x0 * c) + fabs(x1 * s) + fabs(x0 * s) + fabs(x1 * c);
                            close_or_fail(a[p], (float)(x0 * c - x1 * s), 1e-6 * mag, "ref", "rope",
                                          hd, p);
                            close_or_fail(a[q], (float)(x0 * s + x1 * c), 1e-6 * mag, "ref", "rope",
                                          hd, q);
                        }
                } else {
                    vs[v]->rope(b, nh, hd, rd, neox, cs);
                    if (memcmp(a, b, sizeof(float) * (size_t)n))
                        fail_msg("%s rope head_dim %d rope_dim %d heads %d neox %d: not the "
                                 "reference's bits",
                                 vs[v]->name, hd, rd, nh, neox);
                }
                for (int h = 0; h < nh; h++)
                    for (int i = rd; i < hd; i++)
                        if (memcmp(&a[h * hd + i], &x[h * hd + i], sizeof(float)))
                            fail_msg("rope wrote past rope_dim (head %d dim %d)", h, i);
                checked++;
            }
        }
    }
    done(state, "rope shapes", vs[0] == ref || vs[0]->rope != ref->rope ? checked : 0);
}

static void variants_are_listed_best_first_and_reported(void **state)
{
    const struct kernel_ops *all[MAX_VARIANTS];
    int n = kernels_variants(all, MAX_VARIANTS);
    char line[256] = "";
    (void)state;
    assert_true(n >= 1);
    assert_ptr_equal(all[n - 1], kernels_ref());
    for (int i = 0; i < n; i++) {
        strncat(line, " ", sizeof(line) - strlen(line) - 1);
        strncat(line, all[i]->name, sizeof(line) - strlen(line) - 1);
    }
    print_message("kernel variants on this CPU:%s\n", line);
    /* every variant the CPU runs has its per-variant cases below; say which are not run */
    line[0] = '\0';
    for (int i = 0; i < n - 1; i++) {
        bool known = false;
        for (int j = 0; j < COUNT(simd_names); j++)
            known |= strcmp(all[i]->name, simd_names[j]) == 0;
        if (!known)
            fail_msg("variant %s has no test cases: add it to simd_names", all[i]->name);
    }
    for (int j = 0; j < COUNT(simd_names); j++) {
        bool present = false;
        for (int i = 0; i < n; i++)
            present |= strcmp(all[i]->name, simd_names[j]) == 0;
        if (!present) {
            strncat(line, " ", sizeof(line) - strlen(line) - 1);
            strncat(line, simd_names[j], sizeof(line) - strlen(line) - 1);
        }
    }
    print_message("SIMD variants tested: all above but ref; not on this CPU (their cases "
                  "skip):%s\n",
                  line[0] ? line : " none");
}

/* int8_peak of every variant, ref included, against the closed form: each of 16 lanes gets
 * n x KERNELS_PEAK_CHAINS x its 4-byte dot product, modulo 2^32 (n = 20000 wraps it); the
 * extreme inputs 127 x -64 would saturate an int16 pair sum if the ranges were wrong. */
static void int8_peak_loop_computes_the_stated_sum(void **state)
{
    const struct kernel_ops *vs[MAX_VARIANTS];
    int nv = kernels_variants(vs, MAX_VARIANTS);
    static const int64_t rounds[] = {0, 1, 2, 5, 37, 20000};
    struct th_rng r = {0x1234567u};
    uint8_t a[64];
    int8_t b[64];
    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 64; i++) {
            a[i] = pass ? 127 : (uint8_t)(th_rng_u64(&r) % 128);
            b[i] = pass ? -64 : (int8_t)((int)(th_rng_u64(&r) % 128) - 64);
        }
        for (int v = 0; v < nv; v++) {
            for (int k = 0; k < COUNT(rounds); k++) {
                uint32_t out[16];
                uint64_t macs = vs[v]->int8_peak(rounds[k], a, b, out);
                assert_true(macs == (uint64_t)rounds[k] * KERNELS_PEAK_CHAINS * 64);
                for (int l = 0; l < 16; l++) {
                    int64_t d = 0;
                    for (int j = 0; j < 4; j++)
                        d += (int64_t)a[4 * l + j] * b[4 * l + j];
                    uint32_t want = (uint32_t)(d * rounds[k] * KERNELS_PEAK_CHAINS);
                    if (out[l] != want)
                        fail_msg("%s int8_peak n=%lld lane %d: %u, want %u", vs[v]->name,
                                 (long long)rounds[k], l, out[l], want);
                }
            }
        }
    }
}

/* Cases run once per SIMD variant (the variant's name is the state); named "case[variant]". */
struct per_variant {
    const char *name;
    CMUnitTestFunction fn;
    bool with_ref; /* also held against an independent truth on the reference table */
};

#define PV(f, r) {#f, f, r}
static const struct per_variant per_variant[] = {
    PV(vec_dot_matches_reference_for_every_weight_type, false),
    PV(gemm_matches_reference_dot_at_every_tile_edge, false),
    PV(gemm_matches_reference_dot_on_batch_shapes, false),
    PV(gemm_matches_reference_dot_for_one_activation_row, false),
    PV(gemm_rows_do_not_depend_on_batch_size_or_row_split, false),
    PV(attention_ops_match_plain_loops, true),
    PV(activation_quantizers_match_reference_bytes, false),
    PV(activation_quantizers_round_exact_halves_like_reference, false),
    PV(q8_K_first_largest_magnitude_sets_the_sign, false),
    PV(f32_ops_match_reference, false),
    PV(rope_matches_reference_bits, true),
};

int main(void)
{
    static struct CMUnitTest tests[64];
    static char names[64][128];
    static const char *const ref_name = "ref";
    int n = 0;
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(variants_are_listed_best_first_and_reported),
        cmocka_unit_test(int8_peak_loop_computes_the_stated_sum),
        cmocka_unit_test(gemm_outputs_are_bit_identical_for_every_call_split),
        cmocka_unit_test(packed_gemm_equals_gemm_on_the_unpacked_rows),
        cmocka_unit_test(packed_gemm_over_long_rows_equals_gemm),
    };
    for (int i = 0; i < COUNT(fixed); i++)
        tests[n++] = fixed[i];
    for (int i = 0; i < COUNT(per_variant); i++) {
        for (int v = -1; v < COUNT(simd_names); v++) {
            const char *vn = v < 0 ? ref_name : simd_names[v];
            if (v < 0 && !per_variant[i].with_ref)
                continue;
            if (n >= COUNT(tests))
                return 1;
            snprintf(names[n], sizeof(names[n]), "%s[%s]", per_variant[i].name, vn);
            tests[n] =
                (struct CMUnitTest){names[n], per_variant[i].fn, NULL, NULL, (void *)(uintptr_t)vn};
            n++;
        }
    }
    return _cmocka_run_group_tests("simd_test", tests, (size_t)n, NULL, NULL);
}
