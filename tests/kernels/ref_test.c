/* ref_test.c - the reference kernels against independent truth: llama.cpp/gguf-py dequantized
 * fixtures (bit for bit), double-precision dot products, quantization error bounds, and the
 * completeness of every kernel table this CPU can run. */
#include "harness/harness.h"

#include <dirent.h>
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/quants.h"

static const enum ar_type weight_types[] = {
    AR_TYPE_F32,  AR_TYPE_F16,  AR_TYPE_BF16, AR_TYPE_Q8_0, AR_TYPE_Q4_0, AR_TYPE_Q4_1,
    AR_TYPE_Q5_0, AR_TYPE_Q5_1, AR_TYPE_Q4_K, AR_TYPE_Q5_K, AR_TYPE_Q6_K};
static const enum ar_type act_types[] = {AR_TYPE_F32, AR_TYPE_F16, AR_TYPE_BF16, AR_TYPE_Q8_0,
                                         AR_TYPE_Q8_K};

/* ---- helpers -------------------------------------------------------------------------------- */

/* Standard normal by Box-Muller from the harness RNG. */
static float rng_gauss(struct th_rng *r)
{
    double u1 = ((double)(th_rng_u64(r) >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    double u2 = (double)(th_rng_u64(r) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static float *gauss_vec(struct th_rng *r, int64_t n, float sigma)
{
    float *v = malloc((size_t)n * sizeof(float));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = sigma * rng_gauss(r);
    return v;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Decodes standard base64 (padding optional, no whitespace); returns the byte count or -1. */
static long b64_decode(const char *s, uint8_t *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (; *s && *s != '='; s++) {
        int v = b64_value(*s);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= cap)
                return -1;
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)n;
}

static void base64_decoder_decodes_known_strings(void **state)
{
    uint8_t buf[16];
    (void)state;
    assert_int_equal(b64_decode("TWFu", buf, sizeof(buf)), 3);
    assert_memory_equal(buf, "Man", 3);
    assert_int_equal(b64_decode("TWE=", buf, sizeof(buf)), 2);
    assert_memory_equal(buf, "Ma", 2);
    assert_int_equal(b64_decode("/+8A", buf, sizeof(buf)), 3);
    assert_int_equal(buf[0], 0xff);
    assert_int_equal(buf[1], 0xef);
    assert_int_equal(buf[2], 0x00);
    assert_int_equal(b64_decode("a*b=", buf, sizeof(buf)), -1);
}

/* ---- dequantization golden ------------------------------------------------------------------ */

struct dequant_case {
    enum ar_type type;
    int64_t ne0, rows;
    uint8_t *raw;  /* rows * row bytes */
    float *values; /* rows * ne0 */
};

/* Reads one "dequant" entry; fails the test on malformed fixtures. */
static void read_dequant_case(const cJSON *e, struct dequant_case *c)
{
    const cJSON *type = cJSON_GetObjectItem(e, "type");
    const cJSON *ne = cJSON_GetObjectItem(e, "ne");
    const cJSON *rows = cJSON_GetObjectItem(e, "rows");
    const cJSON *raw = cJSON_GetObjectItem(e, "raw_base64");
    const cJSON *values = cJSON_GetObjectItem(e, "values");
    const cJSON *row_bytes = cJSON_GetObjectItem(e, "row_bytes");
    assert_true(cJSON_IsString(type) && cJSON_IsArray(ne) && cJSON_IsNumber(rows));
    assert_true(cJSON_IsString(raw) && cJSON_IsArray(values) && cJSON_IsNumber(row_bytes));
    assert_true(ar_type_from_name(type->valuestring, &c->type));
    c->ne0 = (int64_t)cJSON_GetArrayItem(ne, 0)->valuedouble;
    c->rows = rows->valueint;
    size_t rb = ar_type_row_size(c->type, c->ne0);
    assert_int_equal(rb, (size_t)row_bytes->valueint);
    size_t raw_cap = strlen(raw->valuestring);
    c->raw = malloc(raw_cap + 1);
    assert_non_null(c->raw);
    assert_int_equal(b64_decode(raw->valuestring, c->raw, raw_cap), (long)(rb * (size_t)c->rows));
    assert_int_equal(cJSON_GetArraySize(values), c->ne0 * c->rows);
    c->values = malloc((size_t)(c->ne0 * c->rows) * sizeof(float));
    assert_non_null(c->values);
    int i = 0;
    for (const cJSON *v = values->child; v; v = v->next)
        c->values[i++] = (float)v->valuedouble; /* exact: the fixture prints float32 values */
}

static void dequant_matches_fixtures_bit_for_bit(void **state)
{
    char dir_path[512], path[1024];
    bool covered[AR_TYPE_COUNT] = {false};
    int n_files = 0;
    DIR *dir;
    struct dirent *de;
    (void)state;
    th_shared_path(dir_path, sizeof(dir_path), "fixtures/dequant");
    dir = opendir(dir_path);
    assert_non_null(dir);
    while ((de = readdir(dir)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir_path, de->d_name);
        cJSON *j = th_read_json(path);
        const cJSON *list = cJSON_GetObjectItem(j, "dequant");
        assert_true(cJSON_IsArray(list));
        for (const cJSON *e = list->child; e; e = e->next) {
            struct dequant_case c;
            read_dequant_case(e, &c);
            size_t rb = ar_type_row_size(c.type, c.ne0);
            float *out = malloc((size_t)c.ne0 * sizeof(float));
            assert_non_null(out);
            for (int64_t r = 0; r < c.rows; r++) {
                kernels_ref()->to_float[c.type](c.raw + (size_t)r * rb, out, c.ne0);
                for (int64_t i = 0; i < c.ne0; i++) {
                    uint32_t got = ar_f32_bits(out[i]), want = ar_f32_bits(c.values[r * c.ne0 + i]);
                    if (got != want)
                        fail_msg("%s: %s row %ld elem %ld: got %.9g (0x%08x) want %.9g (0x%08x)",
                                 de->d_name, ar_type_name(c.type), (long)r, (long)i, (double)out[i],
                                 got, (double)c.values[r * c.ne0 + i], want);
                }
            }
            /* kernels_dequantize_row is the same function */
            kernels_dequantize_row(c.type, c.raw, out, c.ne0);
            assert_memory_equal(out, c.values, (size_t)c.ne0 * sizeof(float));
            covered[c.type] = true;
            free(out);
            free(c.raw);
            free(c.values);
        }
        cJSON_Delete(j);
        n_files++;
    }
    closedir(dir);
    assert_true(n_files > 0);
    const enum ar_type must[] = {AR_TYPE_F16,  AR_TYPE_BF16, AR_TYPE_Q8_0,
                                 AR_TYPE_Q6_K, AR_TYPE_Q4_0, AR_TYPE_Q4_K};
    for (size_t k = 0; k < AR_ARRAY_LEN(must); k++)
        if (!covered[must[k]])
            fail_msg("no dequant fixture for %s", ar_type_name(must[k]));
}

/* Q5_K has no fixture: it is Q4_K plus a fifth bit. A Q5_K block with the fields of a Q4_K
 * block and qh = 0 dequantizes to the same values; setting bit b of qh[l] adds 16 steps to
 * element 64 * (b / 2) + 32 * (b % 2) + l only. */
static void q5_K_is_q4_K_with_a_fifth_bit(void **state)
{
    struct th_rng r = {7};
    float x[QK_K], y4[QK_K], y5[QK_K], y5b[QK_K];
    struct block_q4_K b4;
    struct block_q5_K b5;
    (void)state;
    for (int i = 0; i < QK_K; i++)
        x[i] = rng_gauss(&r);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q4_K, x, &b4, QK_K), sizeof(b4));
    memset(&b5, 0, sizeof(b5));
    b5.d = b4.d;
    b5.dmin = b4.dmin;
    memcpy(b5.scales, b4.scales, sizeof(b5.scales));
    memcpy(b5.qs, b4.qs, sizeof(b5.qs));
    kernels_ref()->to_float[AR_TYPE_Q4_K](&b4, y4, QK_K);
    kernels_ref()->to_float[AR_TYPE_Q5_K](&b5, y5, QK_K);
    assert_memory_equal(y4, y5, sizeof(y4));
    for (int b = 0; b < 8; b++) {
        for (int l = 0; l < 32; l += 13) {
            int e = 64 * (b / 2) + 32 * (b % 2) + l;
            b5.qh[l] = (uint8_t)(1u << b);
            kernels_ref()->to_float[AR_TYPE_Q5_K](&b5, y5b, QK_K);
            for (int i = 0; i < QK_K; i++) {
                if (i == e) {
                    /* 16 steps of the sub-block, the step being the smallest gap between
                     * its distinct levels (adjacent levels occur among 32 Gaussian values) */
                    float step = INFINITY;
                    for (int a = e / 32 * 32; a < e / 32 * 32 + 32; a++)
                        for (int c = e / 32 * 32; c < e / 32 * 32 + 32; c++)
                            if (y4[a] > y4[c])
                                step = fminf(step, y4[a] - y4[c]);
                    assert_true(fabsf((y5b[i] - y5[i]) / step - 16.0f) < 0.01f);
                } else {
                    assert_true(ar_f32_bits(y5b[i]) == ar_f32_bits(y5[i]));
                }
            }
            b5.qh[l] = 0;
        }
    }
}

/* ---- legacy 32-element types (Q4_1, Q5_0, Q5_1): no fixtures, so the format definition -------
 * Block bytes, little-endian: Q4_1 = d f16, m f16, qs[16]; Q5_0 = d f16, qh[4], qs[16];
 * Q5_1 = d f16, m f16, qh[4], qs[16]. Element e (0..31) has the 4 low bits
 * (qs[e % 16] >> (4 * (e / 16))) & 15 and, for Q5, the fifth bit (qh[e / 8] >> (e % 8)) & 1.
 * w = d * (q - 16) for Q5_0, w = d * q + m for Q4_1 and Q5_1, in float. */

static float le_f16(const uint8_t *p)
{
    return ar_f16_to_f32((ar_f16)(p[0] | p[1] << 8));
}

/* One element of a legacy block by the definition above, straight from the bytes. */
static float legacy_value(enum ar_type t, const uint8_t *blk, int e)
{
    bool has_m = t != AR_TYPE_Q5_0, five = t != AR_TYPE_Q4_1;
    const uint8_t *qh = blk + (has_m ? 4 : 2);
    const uint8_t *qs = qh + (five ? 4 : 0);
    int q = (qs[e % 16] >> (4 * (e / 16))) & 15;
    float d = le_f16(blk);
    if (five)
        q += ((qh[e / 8] >> (e % 8)) & 1) * 16;
    if (t == AR_TYPE_Q5_0)
        return (float)(q - 16) * d;
    return (float)q * d + le_f16(blk + 2);
}

static const enum ar_type legacy_types[] = {AR_TYPE_Q4_1, AR_TYPE_Q5_0, AR_TYPE_Q5_1};

/* Random raw blocks (every bit pattern of qs and qh, random finite f16 d and m of either sign)
 * dequantize bit for bit as the definition says. */
static void legacy_dequant_matches_format_definition(void **state)
{
    struct th_rng r = {4242};
    enum { NB = 200 };
    (void)state;
    for (size_t k = 0; k < AR_ARRAY_LEN(legacy_types); k++) {
        enum ar_type t = legacy_types[k];
        size_t bs = (size_t)ar_type_info(t)->type_size;
        uint8_t *raw = malloc(bs * NB);
        float *y = malloc(sizeof(float) * 32 * NB);
        assert_true(raw && y);
        for (size_t i = 0; i < bs * NB; i++)
            raw[i] = (uint8_t)th_rng_u64(&r);
        for (int b = 0; b < NB; b++) {
            for (int f = 0; f < (t == AR_TYPE_Q5_0 ? 1 : 2); f++) {
                /* d and m: finite f16 over many binades (exponent field 1..29), random sign */
                uint16_t h = (uint16_t)th_rng_u64(&r);
                h = (uint16_t)((h & 0x83ff) | ((1 + (h >> 10) % 29) << 10));
                raw[(size_t)b * bs + 2 * (size_t)f] = (uint8_t)h;
                raw[(size_t)b * bs + 2 * (size_t)f + 1] = (uint8_t)(h >> 8);
            }
        }
        kernels_ref()->to_float[t](raw, y, 32 * NB);
        for (int b = 0; b < NB; b++) {
            for (int e = 0; e < 32; e++) {
                float want = legacy_value(t, raw + (size_t)b * bs, e);
                if (ar_f32_bits(y[32 * b + e]) != ar_f32_bits(want))
                    fail_msg("%s block %d elem %d: got %.9g want %.9g", ar_type_name(t), b, e,
                             (double)y[32 * b + e], (double)want);
            }
        }
        kernels_dequantize_row(t, raw, y, 32);
        for (int e = 0; e < 32; e++)
            assert_true(ar_f32_bits(y[e]) == ar_f32_bits(legacy_value(t, raw, e)));
        free(raw);
        free(y);
    }
}

/* Hand-made blocks with known values: d = 0.5 (f16 0x3800), m = -2 (0xc000), qs[j] = j in the
 * low nibble and 15 - j in the high one, qh = bytes 01 00 00 80 (bits 0 and 31). */
static void legacy_blocks_decode_hand_made_examples(void **state)
{
    uint8_t q41[20] = {0x00, 0x38, 0x00, 0xc0}, q50[22] = {0x00, 0x38, 0x01, 0x00, 0x00, 0x80};
    uint8_t q51[24] = {0x00, 0x38, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x80};
    float y[32];
    (void)state;
    for (int j = 0; j < 16; j++) {
        uint8_t v = (uint8_t)(j | (15 - j) << 4);
        q41[4 + j] = v;
        q50[6 + j] = v;
        q51[8 + j] = v;
    }
    kernels_dequantize_row(AR_TYPE_Q4_1, q41, y, 32);
    for (int e = 0; e < 32; e++) /* q = e (e < 16) or 31 - e */
        assert_true(y[e] == 0.5f * (float)(e < 16 ? e : 31 - e) - 2.0f);
    kernels_dequantize_row(AR_TYPE_Q5_0, q50, y, 32);
    assert_true(y[0] == 0.0f);     /* q = 0 + 16 */
    assert_true(y[1] == -7.5f);    /* q = 1 */
    assert_true(y[15] == -0.5f);   /* q = 15 */
    assert_true(y[16] == -0.5f);   /* q = 15 (high nibble of qs[0]) */
    assert_true(y[30] == -7.5f);   /* q = 1 */
    assert_true(y[31] == 0.0f);    /* q = 0 + 16 */
    kernels_dequantize_row(AR_TYPE_Q5_1, q51, y, 32);
    assert_true(y[0] == 6.0f);     /* 0.5 * 16 - 2 */
    assert_true(y[1] == -1.5f);    /* 0.5 * 1 - 2 */
    assert_true(y[16] == 5.5f);    /* 0.5 * 15 - 2 */
    assert_true(y[31] == 6.0f);    /* 0.5 * 16 - 2 */
}

/* Quantizer bounds per element, from the definitions of the quantizers:
 * Q4_1/Q5_1 (min-max): within half a step d of the stored grid, plus what storing m and d in f16
 * moves the grid's ends; Q5_0 (signed max to -16): half a step, or one step for the values
 * past +15.5 steps that the top level 15 clamps, plus what storing d in f16 costs. */
static void legacy_quantizers_stay_within_half_a_step(void **state)
{
    struct th_rng r = {777};
    enum { N = 32 * 64 };
    uint8_t q[N * 2];
    float y[N];
    (void)state;
    float *x = gauss_vec(&r, N, 0.05f);
    for (int i = 0; i < 32; i++) /* a block far from zero with a tiny range */
        x[32 + i] = 1.0f + 1e-3f * x[32 + i];
    for (int i = 0; i < 32; i++) /* a block whose largest magnitude is negative */
        x[64 + i] = i == 5 ? -0.4f : fabsf(x[64 + i]);
    for (size_t k = 0; k < AR_ARRAY_LEN(legacy_types); k++) {
        enum ar_type t = legacy_types[k];
        int nmax = t == AR_TYPE_Q4_1 ? 15 : 31;
        size_t bs = (size_t)ar_type_info(t)->type_size;
        assert_int_equal(kernels_quantize_row(t, x, q, N), bs * (N / 32));
        kernels_dequantize_row(t, q, y, N);
        for (int b = 0; b < N / 32; b++) {
            const float *xb = x + 32 * b;
            const uint8_t *blk = q + (size_t)b * bs;
            double lo = xb[0], hi = xb[0], amax = 0.0, max = 0.0;
            for (int i = 0; i < 32; i++) {
                lo = fmin(lo, (double)xb[i]);
                hi = fmax(hi, (double)xb[i]);
                if (fabs((double)xb[i]) > amax) {
                    amax = fabs((double)xb[i]);
                    max = (double)xb[i];
                }
            }
            double dh = (double)le_f16(blk);
            for (int i = 0; i < 32; i++) {
                double err = fabs((double)y[32 * b + i] - (double)xb[i]), bound;
                if (t == AR_TYPE_Q5_0) {
                    double df = max / -16.0, steps = (double)xb[i] / df;
                    bound = (steps > 15.5 ? 1.0 : 0.5) * fabs(df) + 16.0 * fabs(dh - df);
                    assert_true(dh * max <= 0.0); /* max maps to -16 */
                } else {
                    double mh = (double)le_f16(blk + 2), df = (hi - lo) / nmax;
                    bound = 0.5 * dh + fabs(mh - lo) + nmax * fabs(dh - df);
                }
                bound += 1e-6 * amax;
                if (!(err <= bound))
                    fail_msg("%s block %d elem %d: x %g err %g > %g", ar_type_name(t), b, i,
                             (double)xb[i], err, bound);
            }
        }
    }
    free(x);
}

/* ---- vec_dot and gemm ------------------------------------------------------------------------ */

/* Quantizes weights (type t) and activations (t's vec_dot type) of random data, dequantizes
 * both, and checks the ref vec_dot against the double dot of the dequantized vectors, with an
 * error relative to sum |w_i a_i|. */
static void vec_dot_matches_double_dot_of_dequantized(void **state)
{
    struct th_rng r = {1234};
    const int sizes[] = {256, 512, 2048};
    (void)state;
    for (size_t ti = 0; ti < AR_ARRAY_LEN(weight_types); ti++) {
        enum ar_type t = weight_types[ti], vt = kernels_vec_dot_type(t);
        assert_int_not_equal(vt, AR_TYPE_COUNT);
        /* float types accumulate n products in float; quantized ones sum integers exactly */
        double tol = (t == AR_TYPE_F32 || t == AR_TYPE_F16 || t == AR_TYPE_BF16) ? 2e-5 : 1e-5;
        for (size_t si = 0; si < AR_ARRAY_LEN(sizes); si++) {
            int n = sizes[si];
            for (int trial = 0; trial < 3; trial++) {
                float *w = gauss_vec(&r, n, 0.05f), *a = gauss_vec(&r, n, 2.0f);
                void *wq = malloc(ar_type_row_size(t, n));
                void *aq = malloc(ar_type_row_size(vt, n));
                float *wd = malloc((size_t)n * sizeof(float)),
                      *ad = malloc((size_t)n * sizeof(float));
                assert_true(wq && aq && wd && ad);
                if (trial == 2) /* a sparse, lopsided activation */
                    for (int i = 0; i < n; i++)
                        a[i] = i % 7 == 0 ? a[i] * 30.0f : 0.0f;
                assert_int_equal(kernels_quantize_row(t, w, wq, n), ar_type_row_size(t, n));
                kernels_ref()->from_float[vt](a, aq, n);
                kernels_ref()->to_float[t](wq, wd, n);
                kernels_ref()->to_float[vt](aq, ad, n);
                double exact = 0.0, mag = 0.0;
                for (int i = 0; i < n; i++) {
                    exact += (double)wd[i] * (double)ad[i];
                    mag += fabs((double)wd[i] * (double)ad[i]);
                }
                float got = NAN;
                kernels_ref()->vec_dot[t](n, &got, wq, aq);
                if (!(fabs((double)got - exact) <= tol * mag))
                    fail_msg("%s n=%d trial %d: got %.9g want %.9g (mag %g)", ar_type_name(t), n,
                             trial, (double)got, exact, mag);
                free(w);
                free(a);
                free(wq);
                free(aq);
                free(wd);
                free(ad);
            }
        }
    }
}

/* gemm writes y[j * ldy + i] = vec_dot(w row i, x row j) for the tile and nothing else. */
static void gemm_is_the_tile_of_vec_dots(void **state)
{
    struct th_rng r = {99};
    enum { N = 512, NR = 3, NC = 4, LDY = 6 };
    (void)state;
    for (size_t ti = 0; ti < AR_ARRAY_LEN(weight_types); ti++) {
        enum ar_type t = weight_types[ti], vt = kernels_vec_dot_type(t);
        size_t w_row = ar_type_row_size(t, N) + 8, x_row = ar_type_row_size(vt, N) + 4;
        /* strides wider than a row: the tile must honour them; keep rows aligned for floats */
        w_row = (w_row + 7) & ~(size_t)7;
        x_row = (x_row + 7) & ~(size_t)7;
        uint8_t *w = calloc(NR, w_row), *x = calloc(NC, x_row);
        float y[NC * LDY];
        assert_true(w && x);
        for (int i = 0; i < NR; i++) {
            float *v = gauss_vec(&r, N, 0.1f);
            kernels_quantize_row(t, v, w + (size_t)i * w_row, N);
            free(v);
        }
        for (int j = 0; j < NC; j++) {
            float *v = gauss_vec(&r, N, 1.0f);
            kernels_ref()->from_float[vt](v, x + (size_t)j * x_row, N);
            free(v);
        }
        for (int k = 0; k < NC * LDY; k++)
            y[k] = -12345.0f;
        kernels_ref()->gemm[t](N, NR, NC, w, w_row, x, x_row, y, LDY);
        for (int j = 0; j < NC; j++) {
            for (int i = 0; i < LDY; i++) {
                if (i >= NR) {
                    assert_true(y[j * LDY + i] == -12345.0f);
                    continue;
                }
                float want;
                kernels_ref()->vec_dot[t](N, &want, w + (size_t)i * w_row, x + (size_t)j * x_row);
                assert_true(ar_f32_bits(y[j * LDY + i]) == ar_f32_bits(want));
            }
        }
        free(w);
        free(x);
    }
}

/* ---- activation quantizers ------------------------------------------------------------------- */

static void q8_0_activation_error_is_within_half_a_step(void **state)
{
    struct th_rng r = {5};
    enum { N = 32 * 40 };
    struct block_q8_0 q[N / QK8_0];
    (void)state;
    float *x = gauss_vec(&r, N, 3.0f);
    for (int i = 0; i < QK8_0; i++) /* one block with a tiny range, one with exact halves */
        x[i] = 1e-4f * x[i];
    for (int i = 0; i < QK8_0; i++) /* amax 127: d = 1, and every other value is a half */
        x[QK8_0 + i] = i == 0 ? -127.0f : (float)(i - 16) + 0.5f;
    kernels_ref()->from_float[AR_TYPE_Q8_0](x, q, N);
    for (int b = 0; b < N / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        float amax = 0.0f;
        for (int i = 0; i < QK8_0; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, dh = ar_f16_to_f32(q[b].d);
        assert_int_equal(q[b].d, ar_f32_to_f16(d));
        for (int i = 0; i < QK8_0; i++) {
            /* half a step of the float scale, plus what storing the scale in f16 costs */
            double bound = (double)d * 0.5 * (1.0 + 1e-6) +
                           fabs((double)q[b].qs[i]) * fabs((double)dh - (double)d);
            double err = fabs((double)xb[i] - (double)dh * q[b].qs[i]);
            if (!(err <= bound))
                fail_msg("block %d elem %d: x %g q %d d %g err %g > %g", b, i, (double)xb[i],
                         q[b].qs[i], (double)d, err, bound);
            assert_true(q[b].qs[i] >= -127);
        }
    }
    /* exact halves round away from zero */
    assert_int_equal(q[1].qs[16], 1);   /* 0.5 */
    assert_int_equal(q[1].qs[15], -1);  /* -0.5 */
    assert_int_equal(q[1].qs[18], 3);   /* 2.5 */
    assert_int_equal(q[1].qs[31], 16);  /* 15.5 */
    assert_int_equal(q[1].qs[1], -15);  /* -14.5 */
    assert_int_equal(q[1].qs[0], -127); /* the max magnitude */
    free(x);
}

static void q8_K_activation_error_is_within_half_a_step(void **state)
{
    struct th_rng r = {6};
    enum { N = QK_K * 6 };
    struct block_q8_K q[N / QK_K];
    (void)state;
    float *x = gauss_vec(&r, N, 1.5f);
    x[QK_K + 17] = 40.0f; /* a positive outlier: it must map to -127 */
    for (int i = 0; i < QK_K; i++)
        x[2 * QK_K + i] = i == 3 ? -1e-3f : 0.0f; /* a single negative nonzero */
    kernels_ref()->from_float[AR_TYPE_Q8_K](x, q, N);
    for (int b = 0; b < N / QK_K; b++) {
        const float *xb = x + b * QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < QK_K; i++) {
            if (fabsf(xb[i]) > amax) {
                amax = fabsf(xb[i]);
                max = xb[i];
            }
        }
        /* the value of largest magnitude maps to -127: d carries the opposite sign */
        assert_true(q[b].d * max < 0.0f);
        if (!(fabsf(fabsf(q[b].d) * 127.0f - amax) <= 1e-6f * amax))
            fail_msg("block %d: d %g amax %g", b, (double)q[b].d, (double)amax);
        for (int i = 0; i < QK_K; i++) {
            if (xb[i] == max)
                assert_int_equal(q[b].qs[i], -127);
            double err = fabs((double)xb[i] - (double)q[b].d * q[b].qs[i]);
            double bound = fabs((double)q[b].d) * 0.5 + 1e-6 * (double)amax;
            if (!(err <= bound))
                fail_msg("block %d elem %d: err %g > %g", b, i, err, bound);
        }
        for (int k = 0; k < QK_K / 16; k++) {
            int sum = 0;
            for (int i = 0; i < 16; i++)
                sum += q[b].qs[16 * k + i];
            assert_int_equal(q[b].bsums[k], sum);
        }
    }
    free(x);
}

static void activation_quantizers_give_zeros_for_zero_input(void **state)
{
    float x[QK_K * 2] = {0.0f}, y[QK_K * 2];
    uint8_t buf[QK_K * 2 * sizeof(float)]; /* the largest of the activation rows */
    (void)state;
    for (size_t k = 0; k < AR_ARRAY_LEN(act_types); k++) {
        enum ar_type t = act_types[k];
        memset(buf, 0x5a, sizeof(buf));
        kernels_ref()->from_float[t](x, buf, QK_K * 2);
        kernels_ref()->to_float[t](buf, y, QK_K * 2);
        for (int i = 0; i < QK_K * 2; i++)
            assert_true(y[i] == 0.0f);
    }
    struct block_q8_K q;
    memset(&q, 0x5a, sizeof(q));
    kernels_ref()->from_float[AR_TYPE_Q8_K](x, &q, QK_K);
    assert_true(q.d == 0.0f);
    for (int k = 0; k < QK_K / 16; k++)
        assert_int_equal(q.bsums[k], 0);
}

static void float_activation_types_round_to_nearest_even(void **state)
{
    struct th_rng r = {8};
    enum { N = 300 };
    float x[N], y[N];
    ar_f16 h[N];
    (void)state;
    for (int i = 0; i < N; i++)
        x[i] = 4.0f * rng_gauss(&r);
    kernels_ref()->from_float[AR_TYPE_F16](x, h, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(h[i], ar_f32_to_f16(x[i]));
    kernels_ref()->from_float[AR_TYPE_BF16](x, h, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(h[i], ar_f32_to_bf16(x[i]));
    kernels_ref()->from_float[AR_TYPE_F32](x, y, N);
    assert_memory_equal(x, y, sizeof(x));
}

/* ---- weight quantizers ----------------------------------------------------------------------- */

/* RMS of (dequant(quant(x)) - x) relative to RMS of x. */
static double quant_rel_rms(enum ar_type t, const float *x, int64_t n)
{
    size_t size = ar_type_row_size(t, n);
    void *q = malloc(size + 1);
    float *y = malloc((size_t)n * sizeof(float));
    double se = 0.0, sx = 0.0;
    assert_true(q && y);
    ((uint8_t *)q)[size] = 0xa5; /* guard byte */
    assert_int_equal(kernels_quantize_row(t, x, q, n), size);
    assert_int_equal(((uint8_t *)q)[size], 0xa5);
    kernels_dequantize_row(t, q, y, n);
    for (int64_t i = 0; i < n; i++) {
        assert_false(isnan(y[i]));
        double d = (double)y[i] - (double)x[i];
        se += d * d;
        sx += (double)x[i] * (double)x[i];
    }
    free(q);
    free(y);
    return sqrt(se / sx);
}

static void weight_quantizers_keep_rms_error_small(void **state)
{
    static const struct {
        enum ar_type t;
        double bound; /* measured (AR_TEST_VERBOSE=1) plus about 20% */
    } cases[] = {
        {AR_TYPE_F32, 0.0},     /* 0 */
        {AR_TYPE_F16, 3e-4},    /* 2.1e-4 .. 2.4e-4 */
        {AR_TYPE_BF16, 2.2e-3}, /* 1.6e-3 .. 1.7e-3 */
        {AR_TYPE_Q8_0, 0.0075}, /* 0.0059 .. 0.0062 */
        {AR_TYPE_Q6_K, 0.025},  /* 0.018 .. 0.021 */
        {AR_TYPE_Q5_K, 0.045},  /* 0.038 .. 0.039 */
        {AR_TYPE_Q4_K, 0.09},   /* 0.073 .. 0.075 */
        {AR_TYPE_Q4_0, 0.125},  /* 0.093 .. 0.105 */
        {AR_TYPE_Q4_1, 0.11},   /* 0.063 .. 0.089 */
        {AR_TYPE_Q5_0, 0.062},  /* 0.038 .. 0.052 */
        {AR_TYPE_Q5_1, 0.055},  /* 0.034 .. 0.045 */
    };
    struct th_rng r = {2024};
    const int64_t sizes[] = {32, 96, 256, 256 * 7, 4096};
    (void)state;
    for (size_t si = 0; si < AR_ARRAY_LEN(sizes); si++) {
        int64_t n = sizes[si];
        float *x = gauss_vec(&r, n, 0.06f);
        for (int64_t i = 0; i < n; i += 97) /* a few outliers, as real weights have */
            x[i] *= 4.0f;
        for (size_t k = 0; k < AR_ARRAY_LEN(cases); k++) {
            if (n % ar_type_info(cases[k].t)->block_size != 0)
                continue; /* one or three blocks of 32: Q8_0 and Q4_0 only */
            double e = quant_rel_rms(cases[k].t, x, n);
            if (getenv("AR_TEST_VERBOSE"))
                printf("%s n=%ld rel rms %.5f\n", ar_type_name(cases[k].t), (long)n, e);
            if (!(e <= cases[k].bound))
                fail_msg("%s n=%ld: relative rms error %.5f > %.5f", ar_type_name(cases[k].t),
                         (long)n, e, cases[k].bound);
        }
        free(x);
    }
}

/* Blocks that are all zero, constant, all positive or all negative: no NaN, and the error
 * stays within the per-type bound relative to the block's own scale. */
static void weight_quantizers_handle_degenerate_blocks(void **state)
{
    enum { N = QK_K };
    float x[N], y[N];
    uint8_t q[N * sizeof(float)];
    (void)state;
    for (int shape = 0; shape < 5; shape++) {
        for (int i = 0; i < N; i++) {
            switch (shape) {
            case 0:
                x[i] = 0.0f;
                break;
            case 1:
                x[i] = -0.75f;
                break;
            case 2:
                x[i] = 0.01f * (float)(i % 17) + 1.0f;
                break;
            case 3:
                x[i] = -0.01f * (float)(i % 13) - 2.0f;
                break;
            default:
                x[i] = i == 100 ? 3.0f : 0.0f;
                break;
            }
        }
        for (size_t k = 0; k < AR_ARRAY_LEN(weight_types); k++) {
            enum ar_type t = weight_types[k];
            double amax = 0.0, maxerr = 0.0;
            assert_int_equal(kernels_quantize_row(t, x, q, N), ar_type_row_size(t, N));
            kernels_dequantize_row(t, q, y, N);
            for (int i = 0; i < N; i++) {
                assert_false(isnan(y[i]));
                amax = fmax(amax, fabs((double)x[i]));
                maxerr = fmax(maxerr, fabs((double)y[i] - (double)x[i]));
            }
            /* 4-bit formats: at worst about a quarter of the range per element */
            if (!(maxerr <= 0.15 * amax + 1e-7))
                fail_msg("%s shape %d: max error %g for amax %g", ar_type_name(t), shape, maxerr,
                         amax);
            if (shape == 0)
                assert_true(maxerr == 0.0);
        }
    }
}

static void q8_0_requantization_is_stable(void **state)
{
    struct th_rng r = {77};
    enum { N = 32 * 16 };
    struct block_q8_0 a[N / 32], b[N / 32];
    float y[N];
    (void)state;
    float *x = gauss_vec(&r, N, 0.3f);
    for (int round = 0; round < 3; round++) {
        kernels_quantize_row(AR_TYPE_Q8_0, x, a, N);
        kernels_dequantize_row(AR_TYPE_Q8_0, a, y, N);
        kernels_quantize_row(AR_TYPE_Q8_0, y, b, N);
        assert_memory_equal(a, b, sizeof(a));
        memcpy(x, y, sizeof(y));
    }
    free(x);
}

static void quantize_row_rejects_unsupported_types_and_sizes(void **state)
{
    float x[64] = {0.0f};
    uint8_t q[256];
    (void)state;
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q2_K, x, q, 256), 0);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q8_1, x, q, 32), 0);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q5_0, x, q, 48), 0);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q5_0, x, q, 64), 44);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q4_1, x, q, 64), 40);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q5_1, x, q, 64), 48);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q8_K, x, q, 32), 0);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q8_0, x, q, 33), 0);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q4_K, x, q, 64), 0);
    assert_int_equal(kernels_quantize_row(AR_TYPE_Q4_0, x, q, 64), 36);
}

/* ---- tables ---------------------------------------------------------------------------------- */

static void check_table_complete(const struct kernel_ops *ops)
{
    assert_non_null(ops->name);
    for (size_t k = 0; k < AR_ARRAY_LEN(weight_types); k++) {
        enum ar_type t = weight_types[k];
        assert_non_null(ops->to_float[t]);
        assert_non_null(ops->vec_dot[t]);
        assert_non_null(ops->gemm[t]);
    }
    assert_non_null(ops->to_float[AR_TYPE_Q8_K]);
    for (size_t k = 0; k < AR_ARRAY_LEN(act_types); k++)
        assert_non_null(ops->from_float[act_types[k]]);
    assert_non_null(ops->dot_f32);
    assert_non_null(ops->dot_f16_f32);
    assert_non_null(ops->axpy_f32);
    assert_non_null(ops->axpy_f16);
    assert_non_null(ops->rmsnorm);
    assert_non_null(ops->softmax);
    assert_non_null(ops->silu_mul);
    assert_non_null(ops->gelu_mul);
    assert_non_null(ops->rope);
}

static void every_table_is_complete_and_ref_comes_last(void **state)
{
    const struct kernel_ops *v[8];
    (void)state;
    int n = kernels_variants(v, 8);
    /* ref, avx2, avx512, avx512_vnni, avx512_bf16: the variants this build has */
    assert_true(n >= 1 && n <= 5);
    for (int i = 0; i < n; i++) {
        check_table_complete(v[i]);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(v[i]->name, v[j]->name);
    }
    assert_ptr_equal(v[n - 1], kernels_ref());
    assert_string_equal(kernels_ref()->name, "ref");
    check_table_complete(kernels_get());
    const char *env = getenv("AR_KERNELS");
    if (!env || !*env)
        assert_ptr_equal(kernels_get(), v[0]);
    assert_int_equal(kernels_variants(v, 1), 1);
    assert_int_equal(kernels_vec_dot_type(AR_TYPE_Q2_K), AR_TYPE_COUNT);
    assert_int_equal(kernels_vec_dot_type(AR_TYPE_Q8_1), AR_TYPE_COUNT);
    for (size_t k = 0; k < AR_ARRAY_LEN(legacy_types); k++) {
        assert_int_equal(kernels_vec_dot_type(legacy_types[k]), AR_TYPE_Q8_0);
        assert_true(ar_type_info(legacy_types[k])->supported);
    }
}

/* ---- f32 ops --------------------------------------------------------------------------------- */

static void f32_ops_match_double_computations(void **state)
{
    struct th_rng r = {31};
    const int sizes[] = {1, 7, 33, 256, 1000};
    (void)state;
    const struct kernel_ops *k = kernels_ref();
    for (size_t si = 0; si < AR_ARRAY_LEN(sizes); si++) {
        int n = sizes[si];
        float *x = gauss_vec(&r, n, 2.0f), *w = gauss_vec(&r, n, 1.0f);
        float *out = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
        ar_f16 *h = malloc((size_t)n * sizeof(ar_f16));
        assert_true(out && y && h);
        for (int i = 0; i < n; i++)
            h[i] = ar_f32_to_f16(w[i]);

        double dot = 0.0, dot16 = 0.0, mag = 0.0, mag16 = 0.0;
        for (int i = 0; i < n; i++) {
            double xi = (double)x[i], wi = (double)w[i], hi = (double)ar_f16_to_f32(h[i]);
            dot += xi * wi;
            mag += fabs(xi * wi);
            dot16 += xi * hi;
            mag16 += fabs(xi * hi);
        }
        assert_true(fabs((double)k->dot_f32(n, x, w) - dot) <= 1e-5 * mag);
        assert_true(fabs((double)k->dot_f16_f32(n, h, x) - dot16) <= 1e-5 * mag16);

        for (int i = 0; i < n; i++)
            y[i] = (float)i;
        k->axpy_f32(n, 0.5f, x, y);
        for (int i = 0; i < n; i++)
            assert_true(fabs((double)y[i] - (i + 0.5 * (double)x[i])) <=
                        1e-6 * (i + fabs((double)x[i])));
        for (int i = 0; i < n; i++)
            y[i] = (float)i;
        k->axpy_f16(n, -1.5f, h, y);
        for (int i = 0; i < n; i++) {
            double want = i - 1.5 * (double)ar_f16_to_f32(h[i]);
            assert_true(fabs((double)y[i] - want) <= 1e-6 * (i + fabs(want)) + 1e-7);
        }

        double ss = 0.0;
        for (int i = 0; i < n; i++)
            ss += (double)x[i] * (double)x[i];
        double scale = 1.0 / sqrt(ss / n + 1e-5);
        k->rmsnorm(n, out, x, w, 1e-5f);
        for (int i = 0; i < n; i++) {
            double want = (double)x[i] * scale * (double)w[i];
            assert_true(fabs((double)out[i] - want) <= 1e-6 * fabs(want) + 1e-7);
        }

        k->silu_mul(n, out, x, w);
        for (int i = 0; i < n; i++) {
            double want = (double)x[i] / (1.0 + exp(-(double)x[i])) * (double)w[i];
            assert_true(fabs((double)out[i] - want) <= 1e-6 * fabs(want) + 1e-7);
        }

        /* GELU (tanh form) against its definition in double, gates out to +-8 */
        for (int i = 0; i < n; i++)
            y[i] = 4.0f * x[i];
        k->gelu_mul(n, out, y, w);
        for (int i = 0; i < n; i++) {
            double g = (double)y[i];
            double want = 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) *
                          (double)w[i];
            assert_true(fabs((double)out[i] - want) <= 2e-6 * fabs(want) + 1e-7);
        }

        double mx = -(double)INFINITY, se = 0.0, sum = 0.0;
        for (int i = 0; i < n; i++) {
            out[i] = 10.0f * x[i]; /* a peaked distribution */
            y[i] = out[i];
            mx = fmax(mx, (double)out[i]);
        }
        for (int i = 0; i < n; i++)
            se += exp((double)out[i] - mx);
        k->softmax(n, y);
        for (int i = 0; i < n; i++) {
            double want = exp((double)out[i] - mx) / se;
            assert_true(y[i] >= 0.0f);
            assert_true(fabs((double)y[i] - want) <= 1e-5 * want + 1e-9);
            sum += (double)y[i];
        }
        assert_true(fabs(sum - 1.0) <= 1e-5);
        free(x);
        free(w);
        free(out);
        free(y);
        free(h);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(base64_decoder_decodes_known_strings),
        cmocka_unit_test(dequant_matches_fixtures_bit_for_bit),
        cmocka_unit_test(q5_K_is_q4_K_with_a_fifth_bit),
        cmocka_unit_test(legacy_dequant_matches_format_definition),
        cmocka_unit_test(legacy_blocks_decode_hand_made_examples),
        cmocka_unit_test(legacy_quantizers_stay_within_half_a_step),
        cmocka_unit_test(vec_dot_matches_double_dot_of_dequantized),
        cmocka_unit_test(gemm_is_the_tile_of_vec_dots),
        cmocka_unit_test(q8_0_activation_error_is_within_half_a_step),
        cmocka_unit_test(q8_K_activation_error_is_within_half_a_step),
        cmocka_unit_test(activation_quantizers_give_zeros_for_zero_input),
        cmocka_unit_test(float_activation_types_round_to_nearest_even),
        cmocka_unit_test(weight_quantizers_keep_rms_error_small),
        cmocka_unit_test(weight_quantizers_handle_degenerate_blocks),
        cmocka_unit_test(q8_0_requantization_is_stable),
        cmocka_unit_test(quantize_row_rejects_unsupported_types_and_sizes),
        cmocka_unit_test(every_table_is_complete_and_ref_comes_last),
        cmocka_unit_test(f32_ops_match_double_computations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
