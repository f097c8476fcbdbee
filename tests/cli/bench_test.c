/* bench_test.c - `autoreply bench --json` on a tiny fixture model: the kernel chosen per tensor
 * type, the int8 peak and prefill's fraction of it, and batched decode ratios are printed with
 * sane values (positive, fractions in (0, 1.5), the matrix part of prefill no more than the
 * whole), and bad lists fail with one line. Speeds themselves are not checked: the machine is
 * shared. */
#include "harness/harness.h"

#include <cjson/cJSON.h>
#include <math.h>

#include "harness/process.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define MODEL "fixtures/models/tiny-qwen2-q4_k_m.gguf"

static const char *const variants[] = {"ref", "avx2", "avx512", "avx512_vnni", "avx512_bf16"};

static bool is_variant(const cJSON *s)
{
    for (size_t i = 0; cJSON_IsString(s) && i < COUNT(variants); i++)
        if (strcmp(s->valuestring, variants[i]) == 0)
            return true;
    return false;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsNumber(v))
        fail_msg("no number \"%s\"", key);
    return v->valuedouble;
}

/* Every line of out parsed as a JSON object; returns the count. */
static int parse_lines(char *out, cJSON **lines, int max)
{
    int n = 0;
    for (char *p = out, *end; *p; p = end + 1) {
        assert_non_null(end = strchr(p, '\n'));
        *end = '\0';
        assert_true(n < max);
        lines[n] = cJSON_Parse(p);
        if (!cJSON_IsObject(lines[n]))
            fail_msg("not a JSON object: %s", p);
        n++;
    }
    return n;
}

/* Runs bench on MODEL with kernels forced to `kernels` (NULL: the default choice) and checks
 * the new fields; `want` is the variant every per-type entry must name (NULL: any). */
static void check_bench_json(const char *kernels, const char *want)
{
    char model[512];
    cJSON *lines[64];
    struct th_run r;
    int n, peaks = 0, pps = 0, batches = 0, by_type = 0;
    th_shared_path(model, sizeof(model), MODEL);
    r = th_sh_run("%s%s %s bench -m %s -t 1,2 -p 16,32 -n 4 -r 1 --bw-mib 64 -b 2 --json",
                  kernels ? "AR_KERNELS=" : "", kernels ? kernels : "", th_bin_path(), model);
    if (r.status != 0)
        fail_msg("bench failed (%d): %s", r.status, r.err);
    n = parse_lines(r.out, lines, 64);
    for (int i = 0; i < n; i++) {
        const cJSON *j = lines[i], *kt = cJSON_GetObjectItem(j, "kernels_by_type");
        const cJSON *test = cJSON_GetObjectItem(j, "test");
        if (kt) {
            /* the fixture's matrices are Q4_K and Q6_K (Q4_K_M) */
            const cJSON *e;
            assert_non_null(cJSON_GetObjectItem(kt, "q4_K"));
            cJSON_ArrayForEach(e, kt)
            {
                const cJSON *g = cJSON_GetObjectItem(e, "gemm"),
                            *d = cJSON_GetObjectItem(e, "vec_dot");
                assert_true(is_variant(g) && is_variant(d));
                assert_true(cJSON_IsBool(cJSON_GetObjectItem(e, "gemm_loop")));
                if (want) {
                    assert_string_equal(g->valuestring, want);
                    assert_string_equal(d->valuestring, want);
                }
            }
            assert_true(is_variant(cJSON_GetObjectItem(j, "int8_peak_kernels")));
            by_type++;
            continue;
        }
        if (!cJSON_IsString(test))
            continue;
        if (strcmp(test->valuestring, "int8_peak") == 0) {
            assert_true(num(j, "int8_peak_gops") > 0);
            peaks++;
        } else if (test->valuestring[0] == 'p' && test->valuestring[1] == 'p') {
            double f = num(j, "int8_fraction"), i8 = num(j, "int8_gops");
            /* a native table's peak is its instruction's real rate, which the kernels cannot
             * pass by much; the ref table's "peak" is a scalar loop that a sanitized build can
             * time below the rate its (compiler-vectorized) gemm reaches (CI saw 1.52) */
            if (!(f > 0 && (want || f < 1.5)))
                fail_msg("%s: int8_fraction %g", test->valuestring, f);
            /* the matrix part of the FLOPs is at most all of them (printed to 0.1) */
            assert_true(i8 > 0 && i8 <= num(j, "gflops_per_s") + 0.1);
            /* fraction = int8_gops / peak, within what printing them to 4 and 3 decimals loses
             * (slow sanitized ref kernels print small numbers) */
            double peak = num(j, "int8_peak_gops");
            if (!(fabs(f - i8 / peak) <= 5e-5 + 5e-4 * (1 + f) / peak + 1e-9))
                fail_msg("%s: int8_fraction %g, int8_gops %g / peak %g = %g", test->valuestring, f,
                         i8, peak, i8 / peak);
            /* the first prefill, timed apart, on the first prompt length's line only */
            cJSON *cold = cJSON_GetObjectItem(j, "cold_tokens_per_s");
            if (strcmp(test->valuestring, "pp16") == 0)
                assert_true(cJSON_IsNumber(cold) && cold->valuedouble > 0);
            else
                assert_true(cJSON_IsNull(cold));
            pps++;
        } else if (strcmp(test->valuestring, "batch") == 0) {
            int b = (int)num(j, "batch");
            double ratio = num(j, "ratio_vs_b1"), ms = num(j, "step_ms");
            assert_true(ms > 0 && ratio > 0);
            assert_true(b == 1 || b == 2);
            if (b == 1)
                assert_true(fabs(ratio - 1.0) < 1e-9);
            /* tokens per second of the step: B rows in step_ms (both printed rounded) */
            assert_true(fabs(num(j, "tokens_per_s") - b / (ms / 1e3)) <
                        0.01 * num(j, "tokens_per_s") + 1);
            batches++;
        }
    }
    assert_int_equal(by_type, 1);
    assert_int_equal(peaks, 2);   /* per thread count */
    assert_int_equal(pps, 4);     /* 2 prompt lengths x 2 thread counts */
    assert_int_equal(batches, 4); /* B = 1 (put first) and 2, per thread count */
    for (int i = 0; i < n; i++)
        cJSON_Delete(lines[i]);
    th_run_free(&r);
}

static void bench_json_prints_kernels_peak_fraction_and_batch_ratios(void **state)
{
    (void)state;
    check_bench_json(NULL, NULL);
}

static void bench_json_names_ref_everywhere_under_ar_kernels_ref(void **state)
{
    (void)state;
    check_bench_json("ref", "ref");
}

/* The machine line names the CPU's vendor and family and the per-CPU choice of the kernels in
 * use (the K-quant decode prefetch of the AVX-512 VNNI tables, the prefetch of their Q8_0 GEMV
 * and F16/BF16 gemm, and their batched decode order), which AR_KQ_PREFETCH, AR_DECODE_PREFETCH
 * and AR_BATCH_GEMM override; the ref table makes no such choice. Returns the machine line's
 * "tuning". */
static char *bench_tuning(const char *env)
{
    char model[512], *tuning = NULL;
    cJSON *lines[64];
    struct th_run r;
    int n, machine = 0;
    th_shared_path(model, sizeof(model), MODEL);
    r = th_sh_run("%s %s bench -m %s -t 1 -p 16 -n 2 -r 1 --bw-mib 64 --json", env, th_bin_path(),
                  model);
    if (r.status != 0)
        fail_msg("bench failed (%d): %s", r.status, r.err);
    n = parse_lines(r.out, lines, 64);
    for (int i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetObjectItem(lines[i], "tuning"),
                    *v = cJSON_GetObjectItem(lines[i], "vendor");
        if (!cJSON_GetObjectItem(lines[i], "cpu"))
            continue;
        assert_true(cJSON_IsString(t) && cJSON_IsString(v));
        assert_true(num(lines[i], "family") >= 0);
        tuning = strdup(t->valuestring);
        machine++;
    }
    assert_int_equal(machine, 1);
    for (int i = 0; i < n; i++)
        cJSON_Delete(lines[i]);
    th_run_free(&r);
    return tuning;
}

static void bench_names_the_per_cpu_choices(void **state)
{
    /* each override and what the tuning line then says: the decode prefetch in every SIMD
     * table's line, the others in the AVX-512 VNNI tables' */
    static const char *const decode[][2] = {
        {"AR_DECODE_PREFETCH=off", "decode stream prefetch off"},
        {"AR_DECODE_PREFETCH=l2", "decode stream prefetch into L2"},
        {"AR_KERNELS=avx2 AR_DECODE_PREFETCH=off", "decode stream prefetch off"},
        {"AR_KERNELS=avx2 AR_DECODE_PREFETCH=l2", "decode stream prefetch into L2"},
    };
    static const char *const overrides[][2] = {
        {"AR_KQ_PREFETCH=l2", "super-blocks ahead into L2;"},
        {"AR_KQ_PREFETCH=off", "K-quant decode prefetch off"},
        {"AR_KQ_PREFETCH=l2batch", "into L2 from 3 activation rows"},
        {"AR_BATCH_GEMM=pairs", "two groups side by side"},
        {"AR_BATCH_GEMM=stream", "one group's stream at a time"},
    };
    char *t = bench_tuning("AR_KERNELS=ref");
    (void)state;
    assert_string_equal(t, "");
    free(t);
    /* a machine without AVX2 runs the ref table, which makes no choice */
    for (size_t i = 0; i < COUNT(decode); i++) {
        t = bench_tuning(decode[i][0]);
        if (*t && !strstr(t, decode[i][1]))
            fail_msg("%s: tuning \"%s\"", decode[i][0], t);
        free(t);
    }
    t = bench_tuning("AR_KQ_PREFETCH=l1");
    if (!strstr(t, "K-quant")) {
        free(t);
        return;
    }
    assert_non_null(strstr(t, "into L1"));
    free(t);
    for (size_t i = 0; i < COUNT(overrides); i++) {
        t = bench_tuning(overrides[i][0]);
        if (!strstr(t, overrides[i][1]))
            fail_msg("%s: tuning \"%s\"", overrides[i][0], t);
        free(t);
    }
}

static void bench_rejects_bad_lists_with_one_line(void **state)
{
    static char *bad[][2] = {{"-b", "0"}, {"-b", "1,x"}, {"-p", ","}, {"-t", "1,2,3,4,5,6,7,8,9"}};
    (void)state;
    for (size_t i = 0; i < COUNT(bad); i++) {
        struct th_run r = th_run_exec(
            th_bin_path(),
            (char *const[]){"autoreply", "bench", "-m", "x.gguf", bad[i][0], bad[i][1], NULL}, NULL,
            false);
        if (r.status != 2 || !strstr(r.err, bad[i][0]) ||
            strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
            fail_msg("bench %s %s: status %d, stderr: %s", bad[i][0], bad[i][1], r.status, r.err);
        th_run_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bench_json_prints_kernels_peak_fraction_and_batch_ratios),
        cmocka_unit_test(bench_json_names_ref_everywhere_under_ar_kernels_ref),
        cmocka_unit_test(bench_names_the_per_cpu_choices),
        cmocka_unit_test(bench_rejects_bad_lists_with_one_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
