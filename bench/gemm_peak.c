/* gemm_peak.c - one thread's matrix-tile speed per weight type against the int8 peak.
 *
 *   build/bench/gemm_peak [NR=4864] [N=896] [NC=512] [TYPES=q8_0,q4_K,q6_K,q4_0]
 *
 * Fills an NR x N weight matrix of each type (random values quantized by the reference
 * quantizer) and NC activation rows of its vec_dot type, then times kernels_get()'s gemm over
 * the whole tile on the calling thread: the best of 5 runs, as GOPS (2 x NR x N x NC) and as a
 * fraction of the int8 multiply-accumulate peak the same table's int8_peak loop reaches on
 * this thread (best of 5 runs of 20 ms, measured between the types), and the weight bytes read
 * per second (with NC = 1 and a matrix larger than the caches: decode's streaming rate); where
 * the table has a packed gemm for the type (kernels.h, "x16"), the same for the weights packed. The prefill of
 * `autoreply bench` is this tile at every matrix of the model, plus the rest of the pass:
 * this program isolates the kernel, so a change to it can be judged without a model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/cpu.h"
#include "base/types.h"
#include "kernels/kernels.h"

static double peak_gops(const struct kernel_ops *k)
{
    uint8_t a[64];
    int8_t b[64];
    uint32_t out[16];
    double best = 0;
    int64_t rounds = 1 << 16;
    for (int i = 0; i < 64; i++) {
        a[i] = (uint8_t)(1 + i);
        b[i] = (int8_t)(i % 2 ? -i : i);
    }
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ar_time_s(), dt;
        uint64_t macs = k->int8_peak(rounds, a, b, out);
        dt = ar_time_s() - t0;
        if (dt < 0.02) {
            rounds *= 2;
            rep--;
            continue;
        }
        if (2.0 * (double)macs / dt / 1e9 > best)
            best = 2.0 * (double)macs / dt / 1e9;
    }
    return best;
}

static volatile uint64_t sink; /* keeps the plain read */

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)(1 << 24) * 2.0f - 1.0f;
}

static int run_type(const struct kernel_ops *k, enum ar_type t, int nr, int n, int nc)
{
    enum ar_type vt = kernels_vec_dot_type(t);
    size_t w_row = ar_type_row_size(t, n), x_row = ar_type_row_size(vt, n);
    uint8_t *w = ar_huge_alloc(w_row * (size_t)nr), *x = ar_malloc_aligned(x_row * (size_t)nc);
    float *row = malloc((size_t)n * sizeof(float)), *y = ar_malloc_aligned((size_t)nr * nc * 4);
    uint64_t seed = 42;
    double best = 1e30, ops = 2.0 * nr * (double)n * nc, peak;
    if (n % ar_type_info(t)->block_size) {
        fprintf(stderr, "gemm_peak: %s: N is not a multiple of its block size, skipped\n",
                ar_type_name(t));
        return 0;
    }
    if (!w || !x || !row || !y || !k->gemm[t] || !k->from_float[vt]) {
        fprintf(stderr, "gemm_peak: %s: cannot run\n", ar_type_name(t));
        return 1;
    }
    for (int i = 0; i < nr; i++) {
        for (int e = 0; e < n; e++)
            row[e] = frand(&seed);
        kernels_quantize_row(t, row, w + (size_t)i * w_row, n);
    }
    for (int j = 0; j < nc; j++) {
        for (int e = 0; e < n; e++)
            row[e] = frand(&seed);
        k->from_float[vt](row, x + (size_t)j * x_row, n);
    }
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ar_time_s();
        k->gemm[t](n, nr, nc, w, w_row, x, x_row, y, (size_t)nr);
        double dt = ar_time_s() - t0;
        if (dt < best)
            best = dt;
    }
    double best_p = 0, read_gbs = 0;
    uint8_t *wp = NULL;
    size_t psize = k->gemm_packed[t] ? kernels_packed_size(t, n, nr) : 0;
    if (psize && (wp = ar_huge_alloc(psize)) != NULL) {
        kernels_pack_rows(t, w, w_row, n, nr, wp);
        best_p = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = ar_time_s();
            k->gemm_packed[t](n, nr, nc, wp, x, x_row, y, (size_t)nr);
            double dt = ar_time_s() - t0;
            if (dt < best_p)
                best_p = dt;
        }
        /* the same bytes read as plainly as possible, by words and by lines (base.h):
         * what one thread can stream */
        double best_r = 1e30;
        for (int rep = 0; rep < 10; rep++) {
            double t0 = ar_time_s();
            sink += rep % 2 ? ar_read_lines(wp, psize & ~(size_t)63)
                            : ar_read_words(wp, psize & ~(size_t)63);
            double dt = ar_time_s() - t0;
            if (dt < best_r)
                best_r = dt;
        }
        read_gbs = (double)psize / best_r / 1e9;
        ar_huge_free(wp, psize);
    }
    peak = peak_gops(k);
    printf("{\"type\":\"%s\",\"gemm_by\":\"%s\",\"nr\":%d,\"n\":%d,\"nc\":%d,\"gops\":%.1f,"
           "\"int8_peak_gops\":%.1f,\"fraction\":%.3f,\"weight_gbs\":%.2f",
           ar_type_name(t), k->gemm_by[t], nr, n, nc, ops / best / 1e9, peak,
           ops / best / 1e9 / peak, (double)w_row * nr / best / 1e9);
    if (best_p > 0)
        printf(",\"packed_gops\":%.1f,\"packed_fraction\":%.3f,\"packed_weight_gbs\":%.2f,"
               "\"read_gbs\":%.2f",
               ops / best_p / 1e9, ops / best_p / 1e9 / peak, (double)w_row * nr / best_p / 1e9,
               read_gbs);
    printf("}\n");
    free(row);
    ar_huge_free(w, w_row * (size_t)nr);
    ar_free_aligned(x);
    ar_free_aligned(y);
    return 0;
}

int main(int argc, char **argv)
{
    int nr = argc > 1 ? atoi(argv[1]) : 4864, n = argc > 2 ? atoi(argv[2]) : 1024;
    int nc = argc > 3 ? atoi(argv[3]) : 512;
    const char *types = argc > 4 ? argv[4] : "q8_0,q4_K,q6_K,q4_0";
    const struct kernel_ops *k = kernels_get();
    char buf[256];
    int rc = 0;
    if (nr < 1 || n < 32 || n % 32 || nc < 1 || nr > (1 << 20) || n > 65536 || nc > 4096) {
        fprintf(stderr, "gemm_peak: NR >= 1, N a multiple of 32, 1 <= NC <= 4096\n");
        return 2;
    }
    char feat[256];
    ar_cpu_features_str(ar_cpu_features_get(), feat, sizeof(feat));
    printf("{\"features\":\"%s\",\"kernels\":\"%s\",\"int8_peak_insn\":\"%s\"}\n", feat,
           k->name, k->int8_peak_insn);
    snprintf(buf, sizeof(buf), "%s", types);
    for (char *save = NULL, *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        enum ar_type t;
        if (!ar_type_from_name(s, &t)) {
            fprintf(stderr, "gemm_peak: unknown type '%s'\n", s);
            return 2;
        }
        rc |= run_type(k, t, nr, n, nc);
    }
    return rc;
}
