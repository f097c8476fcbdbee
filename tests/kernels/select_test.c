/* select_test.c - run-time kernel selection: AR_KERNELS forces a table, unknown names and
 * variants the CPU lacks fall back to ref, the default is the best the CPU has (judged from
 * /proc/cpuinfo and __builtin_cpu_supports, not from the selector's own cpu.c). The choice is made
 * once per process, so each case runs in a forked child that sets the environment before its first
 * kernels_* call; the parent never calls kernels_* itself. */
#include "harness/harness.h"

#include <cpuid.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

/* Child exit codes */
enum { CHILD_OK = 0, CHILD_WRONG_TABLE = 3, CHILD_NO_WARNING = 4 };

static int warnings;

static void count_warnings(enum ar_log_level level, const char *msg, void *user)
{
    (void)msg;
    (void)user;
    if (level == AR_LOG_WARN)
        warnings++;
}

/* ---- what the CPU has, decided without src/base/cpu.c ------------------------------------
 * The selector's own check (ar_cpu_features_get() + select.c) is what is under test, so the truth
 * comes from elsewhere: the kernel's view in /proc/cpuinfo (flags the OS has enabled, XSAVE
 * state included), cross-checked against the compiler's __builtin_cpu_supports (its own cpuid
 * code in libgcc). The two must agree; a selector that misreads a cpuid bit then fails. */

/* Whether /proc/cpuinfo's first "flags" line lists `flag` as a whole word; -1 when there is no
 * such file or line (not Linux, not x86). */
static int cpuinfo_has(const char *flag)
{
    static char flags[8192];
    static int state; /* 0 not read, 1 read, -1 unavailable */
    if (state == 0) {
        FILE *f = fopen("/proc/cpuinfo", "r");
        char line[8192];
        state = -1;
        while (f && fgets(line, sizeof(line), f))
            if (strncmp(line, "flags", 5) == 0 && strchr(line, ':')) {
                snprintf(flags, sizeof(flags), " %s", strchr(line, ':') + 1);
                flags[strcspn(flags, "\n")] = ' ';
                state = 1;
                break;
            }
        if (f)
            fclose(f);
    }
    if (state < 0)
        return -1;
    char word[64];
    snprintf(word, sizeof(word), " %s ", flag);
    return strstr(flags, word) != NULL;
}

/* clang has no __builtin_cpu_supports("f16c"): leaf 1 ECX bit 29 through the compiler's own
 * <cpuid.h> instead (still not our cpu.c). */
static int f16c_by_cpuid(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* One feature: the cpuinfo flag (Linux's spelling) and the builtin's answer; the two agree. */
static bool feature(const char *cpuinfo_name, int builtin)
{
    int c = cpuinfo_has(cpuinfo_name);
    if (c >= 0 && c != (builtin != 0))
        fail_msg("/proc/cpuinfo says %s=%d, __builtin_cpu_supports says %d", cpuinfo_name, c,
                 builtin != 0);
    return builtin != 0;
}

/* Whether a variant named `name` is available in this CPU: true for "ref"; the others from
 * the independent truth above, with the feature sets Makefile FLAGS_<file> compiles each
 * variant for (kernels_internal.h). */
static bool cpu_has(const char *name)
{
    __builtin_cpu_init();
    /* every feature is read (and cross-checked) before any is combined */
    bool f_avx2 = feature("avx2", __builtin_cpu_supports("avx2"));
    bool f_fma = feature("fma", __builtin_cpu_supports("fma"));
    bool f_f16c = feature("f16c", f16c_by_cpuid());
    bool f_512f = feature("avx512f", __builtin_cpu_supports("avx512f"));
    bool f_512bw = feature("avx512bw", __builtin_cpu_supports("avx512bw"));
    bool f_512vl = feature("avx512vl", __builtin_cpu_supports("avx512vl"));
    bool f_512dq = feature("avx512dq", __builtin_cpu_supports("avx512dq"));
    bool vnni = feature("avx512_vnni", __builtin_cpu_supports("avx512vnni"));
    bool bf16 = feature("avx512_bf16", __builtin_cpu_supports("avx512bf16"));
    bool avx2 = f_avx2 && f_fma && f_f16c;
    bool avx512 = avx2 && f_512f && f_512bw && f_512vl && f_512dq;
    if (strcmp(name, "ref") == 0)
        return true;
    if (strcmp(name, "avx2") == 0)
        return avx2;
    if (strcmp(name, "avx512") == 0)
        return avx512;
    if (strcmp(name, "avx512_vnni") == 0)
        return avx512 && vnni;
    if (strcmp(name, "avx512_bf16") == 0)
        return avx512 && vnni && bf16;
    return false;
}

/* The truth itself is checked once: on this machine both sources answered, and they agree. */
static void independent_feature_sources_agree(void **state)
{
    (void)state;
    if (cpuinfo_has("fpu") < 0)
        th_skip_hw("no /proc/cpuinfo flags to cross-check __builtin_cpu_supports against");
    print_message("independent view: avx2 %d, avx512 %d, avx512_vnni %d, avx512_bf16 %d\n",
                  cpu_has("avx2"), cpu_has("avx512"), cpu_has("avx512_vnni"),
                  cpu_has("avx512_bf16"));
}

/* In a child: set the environment variable var to value (NULL: unset; AR_KERNELS and
 * the tuning overrides start unset), call kernels_get() and check that it names `want` (NULL: any
 * table), that its tuning, where the table makes var's choice, contains `tuning` (NULL: any)
 * (AR_DECODE_PREFETCH: every table with a tuning line; the others: the AVX-512 VNNI tables,
 * whose line names the K-quant prefetch), and that exactly
 * `warns` warnings were logged (a bad value warns once, not once per table built). Returns the
 * child's exit code. */
static int run_child_env(const char *var, const char *value, const char *want, const char *tuning,
                         int warns)
{
    pid_t pid = fork();
    int status;
    if (pid == 0) {
        const struct kernel_ops *k;
        ar_log_set(count_warnings, NULL);
        unsetenv("AR_KERNELS");
        unsetenv("AR_KQ_PREFETCH");
        unsetenv("AR_BATCH_GEMM");
        unsetenv("AR_DECODE_PREFETCH");
        if (value)
            setenv(var, value, 1);
        k = kernels_get();
        if (want && strcmp(k->name, want) != 0)
            _exit(CHILD_WRONG_TABLE);
        if (want && strcmp(want, "ref") == 0 && k != kernels_ref())
            _exit(CHILD_WRONG_TABLE);
        bool chooses = k->tuning &&
                       (!strcmp(var, "AR_DECODE_PREFETCH") || strstr(k->tuning, "K-quant") != NULL);
        if (tuning && chooses && !strstr(k->tuning, tuning))
            _exit(CHILD_WRONG_TABLE);
        if (warnings != warns)
            _exit(CHILD_NO_WARNING);
        _exit(CHILD_OK);
    }
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* AR_KERNELS=value: the table `want`, with one warning where `warn` is set */
static int run_child(const char *value, const char *want, bool warn)
{
    return run_child_env("AR_KERNELS", value, want, NULL, warn ? 1 : 0);
}

static void ar_kernels_ref_forces_the_reference_table(void **state)
{
    (void)state;
    assert_int_equal(run_child("ref", "ref", false), CHILD_OK);
}

static void unknown_ar_kernels_name_warns_and_uses_ref(void **state)
{
    (void)state;
    assert_int_equal(run_child("sse9", "ref", true), CHILD_OK);
    assert_int_equal(run_child("AMX", "ref", true), CHILD_OK);
}

static void ar_kernels_names_each_variant_or_falls_back(void **state)
{
    static const char *names[] = {"avx2", "avx512", "avx512_vnni", "avx512_bf16"};
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(names); i++) {
        bool has = cpu_has(names[i]);
        assert_int_equal(run_child(names[i], has ? names[i] : "ref", !has), CHILD_OK);
    }
}

static void default_choice_is_the_best_the_cpu_supports(void **state)
{
    const char *best = cpu_has("avx512_bf16")   ? "avx512_bf16"
                       : cpu_has("avx512_vnni") ? "avx512_vnni"
                       : cpu_has("avx512")    ? "avx512"
                       : cpu_has("avx2")      ? "avx2"
                                              : "ref";
    (void)state;
    assert_int_equal(run_child(NULL, best, false), CHILD_OK);
    assert_int_equal(run_child("", best, false), CHILD_OK);
}

/* ---- which variant supplied each entry --------------------------------------------------- */

static const char *const order[] = {"ref", "avx2", "avx512", "avx512_vnni", "avx512_bf16"};
static void (*const fills[])(struct kernel_ops *) = {kernels_fill_ref, kernels_fill_avx2,
                                                     kernels_fill_avx512, kernels_fill_avx512_vnni,
                                                     kernels_fill_avx512_bf16};

static int variant_index(const char *name)
{
    for (int i = 0; name && i < (int)AR_ARRAY_LEN(order); i++)
        if (strcmp(name, order[i]) == 0)
            return i;
    return -1;
}

/* Checks a completed table against what each variant's own ISA file fills (a zeroed table
 * through its fill function): the variant recorded for an entry supplied exactly the function
 * in the table, and no variant between it and the table's own filled that entry (the best one
 * wins). Returns false on the first mismatch. */
static bool by_matches_own_tables(const struct kernel_ops *k, const struct kernel_ops *own,
                                  int *checked)
{
    int vi = variant_index(k->name);
    if (vi < 0)
        return false;
    for (int t = 0; t < AR_TYPE_COUNT; t++) {
        int by = variant_index(k->vec_dot_by[t]);
        if (!k->vec_dot[t] != !k->vec_dot_by[t])
            return false;
        if (k->vec_dot[t]) {
            if (by < 0 || by > vi || own[by].vec_dot[t] != k->vec_dot[t])
                return false;
            for (int h = by + 1; h <= vi; h++)
                if (own[h].vec_dot[t])
                    return false;
            (*checked)++;
        }
        by = variant_index(k->gemm_by[t]);
        if (!k->gemm[t] != !k->gemm_by[t])
            return false;
        if (!k->gemm[t])
            continue;
        if (by < 0 || by > vi)
            return false;
        if (k->gemm_loop[t]) {
            /* the generic loop over that variant's own vec_dot, which had no gemm */
            if (own[by].gemm[t] || !own[by].vec_dot[t])
                return false;
            for (int h = 0; h <= vi; h++)
                if (own[h].gemm[t] == k->gemm[t])
                    return false;
        } else if (own[by].gemm[t] != k->gemm[t]) {
            return false;
        }
        for (int h = by + 1; h <= vi; h++)
            if (own[h].gemm[t])
                return false;
        (*checked)++;
    }
    int by = variant_index(k->int8_peak_by);
    if (by < 0 || by > vi || own[by].int8_peak != k->int8_peak || !k->int8_peak_insn)
        return false;
    for (int h = by + 1; h <= vi; h++)
        if (own[h].int8_peak)
            return false;
    return true;
}

static void each_entry_records_the_variant_whose_function_it_holds(void **state)
{
    pid_t pid;
    int status;
    (void)state;
    pid = fork();
    if (pid == 0) {
        struct kernel_ops own[AR_ARRAY_LEN(order)];
        const struct kernel_ops *vs[8];
        int n = kernels_variants(vs, 8), checked = 0;
        memset(own, 0, sizeof(own));
        for (size_t i = 0; i < AR_ARRAY_LEN(order); i++)
            fills[i](&own[i]);
        for (int i = 0; i < n; i++)
            if (!by_matches_own_tables(vs[i], own, &checked))
                _exit(CHILD_WRONG_TABLE);
        _exit(checked > 0 ? CHILD_OK : CHILD_WRONG_TABLE);
    }
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), CHILD_OK);
}

static void ar_kernels_ref_records_ref_for_every_entry(void **state)
{
    pid_t pid;
    int status;
    (void)state;
    pid = fork();
    if (pid == 0) {
        const struct kernel_ops *k;
        setenv("AR_KERNELS", "ref", 1);
        k = kernels_get();
        for (int t = 0; t < AR_TYPE_COUNT; t++) {
            if ((k->gemm[t] && strcmp(k->gemm_by[t], "ref") != 0) || k->gemm_loop[t])
                _exit(CHILD_WRONG_TABLE);
            if (k->vec_dot[t] && strcmp(k->vec_dot_by[t], "ref") != 0)
                _exit(CHILD_WRONG_TABLE);
        }
        if (!k->gemm[AR_TYPE_Q8_0] || strcmp(k->int8_peak_by, "ref") != 0)
            _exit(CHILD_WRONG_TABLE);
        _exit(CHILD_OK);
    }
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), CHILD_OK);
}

static void ar_kq_prefetch_overrides_the_choice_and_warns_once_on_a_bad_value(void **state)
{
    (void)state;
    assert_int_equal(run_child_env("AR_KQ_PREFETCH", "l1", NULL, "into L1", 0), CHILD_OK);
    assert_int_equal(run_child_env("AR_KQ_PREFETCH", "l2", NULL, "super-blocks ahead into L2;", 0),
                     CHILD_OK);
    assert_int_equal(run_child_env("AR_KQ_PREFETCH", "l2batch", NULL, "from 3 activation rows", 0),
                     CHILD_OK);
    assert_int_equal(run_child_env("AR_KQ_PREFETCH", "off", NULL, "K-quant decode prefetch off", 0),
                     CHILD_OK);
    assert_int_equal(run_child_env("AR_KQ_PREFETCH", "L3", NULL, NULL, 1), CHILD_OK);
    assert_int_equal(run_child_env("AR_KQ_PREFETCH", "", NULL, NULL, 0), CHILD_OK);
}

static void ar_batch_gemm_overrides_the_order_and_warns_once_on_a_bad_value(void **state)
{
    (void)state;
    assert_int_equal(run_child_env("AR_BATCH_GEMM", "pairs", NULL, "two groups side by side", 0),
                     CHILD_OK);
    assert_int_equal(
        run_child_env("AR_BATCH_GEMM", "stream", NULL, "one group's stream at a time", 0),
        CHILD_OK);
    assert_int_equal(run_child_env("AR_BATCH_GEMM", "rows", NULL, NULL, 1), CHILD_OK);
}

static void ar_decode_prefetch_overrides_the_choice_and_warns_once_on_a_bad_value(void **state)
{
    (void)state;
    assert_int_equal(
        run_child_env("AR_DECODE_PREFETCH", "off", NULL, "decode stream prefetch off", 0),
        CHILD_OK);
    assert_int_equal(
        run_child_env("AR_DECODE_PREFETCH", "l2", NULL, "decode stream prefetch into L2", 0),
        CHILD_OK);
    assert_int_equal(run_child_env("AR_DECODE_PREFETCH", "l1", NULL, NULL, 1), CHILD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(independent_feature_sources_agree),
        cmocka_unit_test(ar_kernels_ref_forces_the_reference_table),
        cmocka_unit_test(unknown_ar_kernels_name_warns_and_uses_ref),
        cmocka_unit_test(ar_kernels_names_each_variant_or_falls_back),
        cmocka_unit_test(default_choice_is_the_best_the_cpu_supports),
        cmocka_unit_test(each_entry_records_the_variant_whose_function_it_holds),
        cmocka_unit_test(ar_kernels_ref_records_ref_for_every_entry),
        cmocka_unit_test(ar_kq_prefetch_overrides_the_choice_and_warns_once_on_a_bad_value),
        cmocka_unit_test(ar_batch_gemm_overrides_the_order_and_warns_once_on_a_bad_value),
        cmocka_unit_test(ar_decode_prefetch_overrides_the_choice_and_warns_once_on_a_bad_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
