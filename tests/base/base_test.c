/* base_test.c - half-precision conversion, type table, thread pool, fault injection. */
#include "harness/harness.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/base.h"
#include "base/cpu.h"
#include "base/pool.h"
#include "base/types.h"

static void f16_roundtrips_every_non_nan_value(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ar_f16_to_f32((ar_f16)h);
        if (isnan(f))
            continue;
        assert_int_equal(ar_f32_to_f16(f), h);
    }
}

/* Independent reference: the nearest binary16 by exhaustive search over the 65536 values,
 * ties to the even bit pattern. */
static ar_f16 nearest_f16(float x)
{
    double best = INFINITY;
    uint32_t best_h = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double v = ar_f16_to_f32((ar_f16)h);
        double d = fabs(v - fabs((double)x));
        if (d < best || (d == best && !(h & 1))) {
            best = d;
            best_h = h;
        }
    }
    /* beyond the largest finite value + half an ulp: infinity */
    if (fabs((double)x) >= 65520.0)
        best_h = 0x7c00;
    return (ar_f16)(best_h | (signbit(x) ? 0x8000 : 0));
}

static void f32_to_f16_rounds_to_nearest_even(void **state)
{
    struct th_rng r = {42};
    (void)state;
    for (int i = 0; i < 300; i++) {
        /* spread over the whole binary16 range, subnormals included */
        float x = th_rng_f32(&r) * ldexpf(1.0f, (int)(th_rng_u64(&r) % 44) - 26);
        assert_int_equal(ar_f32_to_f16(x), nearest_f16(x));
    }
    /* exact halfway cases */
    assert_int_equal(ar_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    assert_int_equal(ar_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    assert_int_equal(ar_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ar_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(ar_f32_to_f16(-INFINITY), 0xfc00);
}

static void bf16_rounds_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(ar_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(ar_f32_to_bf16(ar_bits_f32(0x3f808000u)), 0x3f80); /* tie, even down */
    assert_int_equal(ar_f32_to_bf16(ar_bits_f32(0x3f818000u)), 0x3f82); /* tie, even up */
    assert_int_equal(ar_f32_to_bf16(ar_bits_f32(0x3f808001u)), 0x3f81);
    assert_true(isnan(ar_bf16_to_f32(ar_f32_to_bf16(NAN))));
}

static void type_table_matches_gguf_sizes(void **state)
{
    enum ar_type t;
    (void)state;
    assert_int_equal(ar_type_row_size(AR_TYPE_Q8_0, 256), 8 * 34);
    assert_int_equal(ar_type_row_size(AR_TYPE_Q4_K, 256), 144);
    assert_int_equal(ar_type_row_size(AR_TYPE_Q6_K, 512), 420);
    assert_int_equal(ar_type_row_size(AR_TYPE_Q4_0, 33), 0);
    assert_int_equal(ar_type_row_size(99, 32), 0);
    assert_true(ar_type_from_name("Q4_K", &t));
    assert_int_equal(t, AR_TYPE_Q4_K);
    assert_false(ar_type_from_name("q9_9", &t));
    assert_string_equal(ar_type_name(123), "?");
}

struct sum_job {
    int64_t n;
    int64_t partial[8];
    int calls[8];
};

static void sum_range(void *ctx, int ith, int nth)
{
    struct sum_job *j = ctx;
    int64_t b, e, s = 0;
    ar_pool_range(j->n, 4, ith, nth, &b, &e);
    for (int64_t i = b; i < e; i++)
        s += i;
    j->partial[ith] = s;
    j->calls[ith]++;
}

static void pool_runs_every_thread_once_per_job(void **state)
{
    (void)state;
    for (int nth = 1; nth <= 4; nth++) {
        struct ar_pool *p;
        assert_int_equal(ar_pool_create(nth, &p), AR_OK);
        assert_int_equal(ar_pool_size(p), nth);
        for (int rep = 0; rep < 200; rep++) {
            struct sum_job j = {.n = 1001 + rep};
            int64_t total = 0;
            ar_pool_run(p, sum_range, &j);
            for (int i = 0; i < nth; i++) {
                assert_int_equal(j.calls[i], 1);
                total += j.partial[i];
            }
            assert_int_equal(total, j.n * (j.n - 1) / 2);
        }
        ar_pool_destroy(p);
    }
}

struct claim_job {
    atomic_int next;
    int n;
    atomic_int done[4096];
    atomic_int calls;
};

static void claim_items(void *ctx, int ith, int nth)
{
    struct claim_job *j = ctx;
    int i;
    (void)ith;
    (void)nth;
    atomic_fetch_add(&j->calls, 1);
    while ((i = atomic_fetch_add(&j->next, 1)) < j->n)
        atomic_fetch_add(&j->done[i], 1);
}

static void pool_shared_runs_every_item_once(void **state)
{
    (void)state;
    for (int nth = 1; nth <= 3; nth++) {
        struct ar_pool *p;
        static struct claim_job j;
        assert_int_equal(ar_pool_create(nth, &p), AR_OK);
        for (int rep = 0; rep < 300; rep++) {
            memset(&j, 0, sizeof(j));
            j.n = 1 + (rep * 37) % 4096;
            ar_pool_run_shared(p, claim_items, &j);
            /* the caller always runs; late workers may skip, never run twice */
            assert_true(atomic_load(&j.calls) >= 1 && atomic_load(&j.calls) <= nth);
            for (int i = 0; i < j.n; i++)
                assert_int_equal(atomic_load(&j.done[i]), 1);
            /* regular jobs in between still reach every thread exactly once */
            if (rep % 7 == 0) {
                struct sum_job sj = {.n = 100};
                ar_pool_run(p, sum_range, &sj);
                for (int i = 0; i < nth; i++)
                    assert_int_equal(sj.calls[i], 1);
            }
        }
        ar_pool_destroy(p);
    }
}

static void pool_range_covers_without_overlap(void **state)
{
    (void)state;
    for (int64_t n = 0; n < 70; n++) {
        for (int nth = 1; nth <= 5; nth++) {
            int64_t expect = 0;
            for (int i = 0; i < nth; i++) {
                int64_t b, e;
                ar_pool_range(n, 8, i, nth, &b, &e);
                assert_int_equal(b, expect);
                assert_true(e >= b);
                assert_true(b % 8 == 0 || b == n);
                expect = e;
            }
            assert_int_equal(expect, n);
        }
    }
}

static void pool_rejects_bad_sizes(void **state)
{
    struct ar_pool *p = NULL;
    (void)state;
    assert_int_equal(ar_pool_create(0, &p), AR_EINVAL);
    assert_null(p);
}

/* ar_huge_alloc: zeroed, page aligned, writable over its whole size, outside the fault
 * injection (the packed weights fall back to the file's layout on their own), and size 0 and
 * NULL are refused or ignored. */
static void huge_alloc_gives_zeroed_aligned_memory(void **state)
{
    (void)state;
    size_t size = (size_t)3 << 20 | 123; /* past a 2 MiB page, not a multiple of any page */
    ar_alloc_fail_after(1);
    uint8_t *p = ar_huge_alloc(size);
    ar_alloc_fail_after(0);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 4096, 0);
    for (size_t i = 0; i < size; i += 4096)
        assert_int_equal(p[i], 0);
    assert_int_equal(p[size - 1], 0);
    memset(p, 0xa5, size);
    assert_int_equal(p[size - 1], 0xa5);
    ar_huge_free(p, size);
    assert_null(ar_huge_alloc(0));
    ar_huge_free(NULL, 0);
}

/* The bandwidth probe's reads: every word, or the first word of each 64-byte line, of exactly
 * the bytes given (word i holds i * i + 7, so a word read twice, skipped, or past the end
 * changes the sum). */
static void read_words_and_lines_sum_what_they_read(void **state)
{
    static const size_t sizes[] = {64, 128, 192, 4096, 64 * 1001};
    (void)state;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k] / 8;
        uint64_t *u = ar_malloc_aligned((n + 16) * 8), words = 0, lines = 0;
        assert_non_null(u);
        for (size_t i = 0; i < n + 16; i++)
            u[i] = i * i + 7;
        for (size_t i = 0; i < n; i++) {
            words += u[i];
            lines += i % 8 ? 0 : u[i];
        }
        assert_int_equal(ar_read_words(u, sizes[k]), words);
        assert_int_equal(ar_read_lines(u, sizes[k]), lines);
        ar_free_aligned(u);
    }
}

static void fault_injection_fails_nth_allocation(void **state)
{
    void *a, *b;
    (void)state;
    ar_alloc_fail_after(2);
    a = ar_malloc(10);
    b = ar_malloc(10);
    ar_alloc_fail_after(0);
    assert_non_null(a);
    assert_null(b);
    ar_free(a);
}

/* ar_json_has_nul against texts whose NULs (and their places) are known by construction. */
static void json_nul_found_with_its_field(void **state)
{
    char field[128];
    size_t off = 0;
    (void)state;
    const char *a = "{\"shop_id\":\"victim\\u0000attacker\",\"text\":\"x\"}";
    assert_true(ar_json_has_nul(a, strlen(a), &off, field, sizeof(field)));
    assert_string_equal(field, "shop_id");
    assert_int_equal(off, (size_t)(strstr(a, "\\u0000") - a));
    const char *b = "{\"reviews\":[{\"id\":\"1\",\"text\":\"ok\"},{\"text\":\"a\\u0000\"}]}";
    assert_true(ar_json_has_nul(b, strlen(b), NULL, field, sizeof(field)));
    assert_string_equal(field, "reviews[].text");
    const char *c = "{\"a\\u0000b\":1}";
    assert_true(ar_json_has_nul(c, strlen(c), NULL, field, sizeof(field)));
    assert_string_equal(field, "(a key)");
    const char *d = "[\"x\\u0000\"]";
    assert_true(ar_json_has_nul(d, strlen(d), NULL, field, sizeof(field)));
    assert_string_equal(field, "[]");
    /* a raw 0 byte in a string */
    const char e[] = "{\"t\":\"a\0b\"}";
    assert_true(ar_json_has_nul(e, sizeof(e) - 1, &off, field, sizeof(field)));
    assert_string_equal(field, "t");
    assert_int_equal(off, 7);
}

static void json_nul_not_found_in_lookalikes(void **state)
{
    (void)state;
    /* an escaped backslash then "u0000" is text; \u00001 is NUL then '1' (found); other escapes */
    const char *a = "{\"t\":\"a\\\\u0000\",\"u\":\"\\u0001\\u1000\\\"\\u0000\"}";
    char field[64];
    assert_true(ar_json_has_nul(a, strlen(a), NULL, field, sizeof(field)));
    assert_string_equal(field, "u"); /* the one after \" in u, not the one in t */
    const char *b = "{\"t\":\"a\\\\u0000\",\"u\":\"\\u0001\\u1000 0000\"}";
    assert_false(ar_json_has_nul(b, strlen(b), NULL, field, sizeof(field)));
    assert_false(ar_json_has_nul("\"\\u000", 6, NULL, NULL, 0)); /* cut escape */
    assert_false(ar_json_has_nul("", 0, NULL, NULL, 0));
}

static void err_set_formats_message(void **state)
{
    struct ar_err e;
    (void)state;
    assert_int_equal(ar_err_set(&e, AR_EFORMAT, 12, "bad %s", "magic"), AR_EFORMAT);
    assert_string_equal(e.msg, "bad magic");
    assert_int_equal(e.offset, 12);
    assert_int_equal(ar_err_set(NULL, AR_EIO, 0, "x"), AR_EIO);
    assert_string_equal(ar_status_str(AR_ENOMEM), "out of memory");
}

static void cpu_detection_is_consistent(void **state)
{
    const struct ar_cpu_features *c = ar_cpu_features_get();
    (void)state;
    /* implications that must hold whatever the machine */
    if (c->avx512vnni)
        assert_true(c->avx512f);
    if (c->avx512bw)
        assert_true(c->avx512f);
    if (c->avx2)
        assert_true(c->avx);
    assert_ptr_equal(c, ar_cpu_features_get());
}

/* vendor and family against the kernel's own reading of CPUID (/proc/cpuinfo), where there is
 * one: the first processor's "vendor_id" and "cpu family" lines */
static void cpu_family_matches_proc_cpuinfo(void **state)
{
    const struct ar_cpu_features *c = ar_cpu_features_get();
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256], vendor[64] = "";
    int family = -1;
    (void)state;
    if (!f) {
        skip();
        return;
    }
    while (fgets(line, sizeof(line), f) && (family < 0 || !vendor[0])) {
        if (!vendor[0] && sscanf(line, "vendor_id : %63s", vendor) == 1)
            continue;
        if (family < 0)
            (void)sscanf(line, "cpu family : %d", &family);
    }
    fclose(f);
#if defined(__x86_64__) || defined(__i386__)
    assert_true(vendor[0] && family >= 0);
    assert_int_equal(c->amd, strcmp(vendor, "AuthenticAMD") == 0);
    assert_int_equal(c->family, family);
#else
    assert_false(c->amd);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_roundtrips_every_non_nan_value),
        cmocka_unit_test(f32_to_f16_rounds_to_nearest_even),
        cmocka_unit_test(bf16_rounds_to_nearest_even),
        cmocka_unit_test(type_table_matches_gguf_sizes),
        cmocka_unit_test(pool_runs_every_thread_once_per_job),
        cmocka_unit_test(pool_range_covers_without_overlap),
        cmocka_unit_test(pool_shared_runs_every_item_once),
        cmocka_unit_test(pool_rejects_bad_sizes),
        cmocka_unit_test(fault_injection_fails_nth_allocation),
        cmocka_unit_test(huge_alloc_gives_zeroed_aligned_memory),
        cmocka_unit_test(read_words_and_lines_sum_what_they_read),
        cmocka_unit_test(err_set_formats_message),
        cmocka_unit_test(json_nul_found_with_its_field),
        cmocka_unit_test(json_nul_not_found_in_lookalikes),
        cmocka_unit_test(cpu_detection_is_consistent),
        cmocka_unit_test(cpu_family_matches_proc_cpuinfo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
