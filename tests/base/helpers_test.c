/* helpers_test.c - the small helpers every module shares: FNV-1a against the published test
 * vectors, UTF-8 against Unicode's table of well-formed sequences, deadlines against the
 * clock. */
#include "harness/harness.h"

#include <math.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/deadline.h"
#include "base/hash.h"
#include "base/utf8.h"

/* ---- FNV-1a ------------------------------------------------------------------------------ */

/* The vectors of the FNV reference test suite (Noll's fnv_test.c). */
static void fnv1a_matches_published_vectors(void **state)
{
    (void)state;
    assert_int_equal(ar_fnv1a32(AR_FNV32_BASIS, "", 0), 0x811c9dc5u);
    assert_int_equal(ar_fnv1a32(AR_FNV32_BASIS, "a", 1), 0xe40c292cu);
    assert_int_equal(ar_fnv1a32(AR_FNV32_BASIS, "foobar", 6), 0xbf9cf968u);
    assert_true(ar_fnv1a64(AR_FNV64_BASIS, "", 0) == 0xcbf29ce484222325ull);
    assert_true(ar_fnv1a64(AR_FNV64_BASIS, "a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(ar_fnv1a64(AR_FNV64_BASIS, "foobar", 6) == 0x85944171f73967e8ull);
    /* the constants are FNV's (16777619, 1099511628211, 14695981039346656037) */
    assert_int_equal(AR_FNV32_PRIME, 16777619u);
    assert_int_equal(AR_FNV32_BASIS, 2166136261u);
    assert_true(AR_FNV64_PRIME == 1099511628211ull);
    assert_true(AR_FNV64_BASIS == 14695981039346656037ull);
}

static void fnv1a_chains_over_pieces(void **state)
{
    (void)state;
    assert_int_equal(ar_fnv1a32(ar_fnv1a32(AR_FNV32_BASIS, "foo", 3), "bar", 3),
                     ar_fnv1a32(AR_FNV32_BASIS, "foobar", 6));
    assert_true(ar_fnv1a64(ar_fnv1a64(AR_FNV64_BASIS, "fo", 2), "obar", 4) ==
                ar_fnv1a64(AR_FNV64_BASIS, "foobar", 6));
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* The Unicode Standard, table 3-7 "Well-Formed UTF-8 Byte Sequences": each row is a range of
 * code points and the allowed range of each byte. Within a row, sequences in byte order are
 * consecutive code points. */
struct row {
    uint32_t first, last;
    int len;
    uint8_t lo[4], hi[4];
};
static const struct row table37[] = {
    {0x0000, 0x007f, 1, {0x00}, {0x7f}},
    {0x0080, 0x07ff, 2, {0xc2, 0x80}, {0xdf, 0xbf}},
    {0x0800, 0x0fff, 3, {0xe0, 0xa0, 0x80}, {0xe0, 0xbf, 0xbf}},
    {0x1000, 0xcfff, 3, {0xe1, 0x80, 0x80}, {0xec, 0xbf, 0xbf}},
    {0xd000, 0xd7ff, 3, {0xed, 0x80, 0x80}, {0xed, 0x9f, 0xbf}},
    {0xe000, 0xffff, 3, {0xee, 0x80, 0x80}, {0xef, 0xbf, 0xbf}},
    {0x10000, 0x3ffff, 4, {0xf0, 0x90, 0x80, 0x80}, {0xf0, 0xbf, 0xbf, 0xbf}},
    {0x40000, 0xfffff, 4, {0xf1, 0x80, 0x80, 0x80}, {0xf3, 0xbf, 0xbf, 0xbf}},
    {0x100000, 0x10ffff, 4, {0xf4, 0x80, 0x80, 0x80}, {0xf4, 0x8f, 0xbf, 0xbf}},
};

/* Whether b[0..len) is a row of the table. */
static bool table_accepts(const uint8_t *b, int len)
{
    for (size_t r = 0; r < AR_ARRAY_LEN(table37); r++) {
        bool ok = table37[r].len == len;
        for (int i = 0; ok && i < len; i++)
            ok = b[i] >= table37[r].lo[i] && b[i] <= table37[r].hi[i];
        if (ok)
            return true;
    }
    return false;
}

/* Every sequence of every row, in byte order: decoded to the next code point of the row,
 * encoded back to the same bytes, every proper prefix incomplete and not decodable. */
static void utf8_every_scalar_value_of_table_3_7(void **state)
{
    size_t total = 0;
    (void)state;
    for (size_t r = 0; r < AR_ARRAY_LEN(table37); r++) {
        const struct row *w = &table37[r];
        uint8_t b[4];
        uint32_t want = w->first;
        memcpy(b, w->lo, 4);
        for (;;) {
            char enc[4];
            uint32_t cp = 0xffffffffu;
            int i;
            assert_int_equal(ar_utf8_decode((const char *)b, (size_t)w->len, &cp), w->len);
            assert_int_equal(cp, want);
            assert_int_equal(ar_utf8_encode(want, enc), w->len);
            assert_memory_equal(enc, b, (size_t)w->len);
            assert_false(ar_utf8_incomplete((const char *)b, (size_t)w->len));
            for (int k = 1; k < w->len; k++) {
                assert_int_equal(ar_utf8_decode((const char *)b, (size_t)k, &cp), 0);
                assert_true(ar_utf8_incomplete((const char *)b, (size_t)k));
            }
            cp = 0;
            assert_int_equal(ar_utf8_decode_lax((const char *)b, (size_t)w->len, &cp), w->len);
            assert_int_equal(cp, want);
            total++;
            /* next sequence of the row in byte order (last byte fastest) */
            for (i = w->len - 1; i >= 0 && b[i] == w->hi[i]; i--)
                b[i] = w->lo[i];
            if (i < 0)
                break;
            b[i]++;
            want++;
        }
        assert_int_equal(want, w->last);
    }
    /* all of U+0000..U+10FFFF but the 2048 surrogates */
    assert_int_equal(total, 0x110000 - 0x800);
}

/* Every 1-, 2- and 3-byte string, and 4-byte strings over every first two bytes: decoded as
 * a whole exactly when the table has it; never a longer length than given. */
static void utf8_decodes_nothing_the_table_lacks(void **state)
{
    static const uint8_t tail[] = {0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f,
                                   0xa0, 0xbf, 0xc0, 0xc2, 0xf4, 0xff};
    uint8_t b[4];
    uint32_t cp;
    (void)state;
    for (uint32_t v = 0; v < (1u << 24); v++) {
        b[0] = (uint8_t)(v >> 16);
        b[1] = (uint8_t)(v >> 8);
        b[2] = (uint8_t)v;
        if (b[0] < 0x80)
            continue; /* an ASCII byte is a sequence of its own */
        assert_int_equal(ar_utf8_decode((const char *)b, 3, &cp) == 3, table_accepts(b, 3));
        if (b[2] == 0) {
            assert_int_equal(ar_utf8_decode((const char *)b, 2, &cp) == 2, table_accepts(b, 2));
            if (b[1] == 0)
                assert_int_equal(ar_utf8_decode((const char *)b, 1, &cp), 0);
        }
    }
    for (uint32_t v = 0xf000; v <= 0xffff; v++)
        for (size_t i = 0; i < sizeof(tail); i++)
            for (size_t j = 0; j < sizeof(tail); j++) {
                size_t k;
                b[0] = (uint8_t)(v >> 8);
                b[1] = (uint8_t)v;
                b[2] = tail[i];
                b[3] = tail[j];
                k = ar_utf8_decode((const char *)b, 4, &cp);
                assert_int_equal(k == 4, table_accepts(b, 4));
                assert_true(k == 0 || k == 4);
            }
}

static void utf8_rejects_overlongs_surrogates_and_beyond(void **state)
{
    static const char *const bad[] = {
        "\xc0\x80",             /* overlong U+0000 */
        "\xc1\xbf",             /* overlong U+007F */
        "\xe0\x80\x80",         /* overlong */
        "\xe0\x9f\xbf",         /* overlong U+07FF */
        "\xf0\x8f\xbf\xbf",     /* overlong U+FFFF */
        "\xed\xa0\x80",         /* U+D800 */
        "\xed\xbf\xbf",         /* U+DFFF */
        "\xf4\x90\x80\x80",     /* U+110000 */
        "\xf5\x80\x80\x80",     /* > U+10FFFF */
        "\xf8\x88\x80\x80\x80", /* 5-byte form */
        "\xff",
        "\x80", /* lone continuation */
        "\xe2\x82",
        "\xe2\x82\x41", /* continuation missing */
    };
    uint32_t cp;
    char out[4];
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
        assert_int_equal(ar_utf8_decode(bad[i], strlen(bad[i]), &cp), 0);
        assert_false(ar_utf8_valid(bad[i], strlen(bad[i])));
    }
    /* a prefix that no more bytes can complete is not incomplete */
    assert_false(ar_utf8_incomplete("\xe0\x80", 2));
    assert_false(ar_utf8_incomplete("\xed\xa0", 2));
    assert_false(ar_utf8_incomplete("\xf4\x90", 2));
    assert_false(ar_utf8_incomplete("\xc0", 1));
    assert_false(ar_utf8_incomplete("\x80", 1));
    assert_false(ar_utf8_incomplete("\xf5", 1));
    assert_false(ar_utf8_incomplete("A", 1));
    assert_int_equal(ar_utf8_decode("", 0, &cp), 0);
    assert_int_equal(ar_utf8_encode(0xd800, out), 0);
    assert_int_equal(ar_utf8_encode(0xdfff, out), 0);
    assert_int_equal(ar_utf8_encode(0x110000, out), 0);
}

/* The examples of RFC 3629, section 7. */
static void utf8_rfc3629_examples(void **state)
{
    static const struct {
        const char *bytes;
        uint32_t cps[5];
        int n;
    } ex[] = {
        {"\x41\xe2\x89\xa2\xce\x91\x2e", {0x41, 0x2262, 0x391, 0x2e}, 4},
        {"\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4", {0xd55c, 0xad6d, 0xc5b4}, 3},
        {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", {0x65e5, 0x672c, 0x8a9e}, 3},
        {"\xef\xbb\xbf\xf0\xa3\x8e\xb4", {0xfeff, 0x233b4}, 2},
    };
    (void)state;
    for (size_t e = 0; e < AR_ARRAY_LEN(ex); e++) {
        const char *s = ex[e].bytes;
        size_t n = strlen(s), i = 0;
        int k = 0;
        assert_true(ar_utf8_valid(s, n));
        while (i < n) {
            uint32_t cp;
            size_t l = ar_utf8_decode(s + i, n - i, &cp);
            assert_true(l > 0);
            assert_true(k < ex[e].n);
            assert_int_equal(cp, ex[e].cps[k++]);
            i += l;
        }
        assert_int_equal(k, ex[e].n);
    }
}

static void utf8_sanitize_replaces_each_bad_byte(void **state)
{
    size_t n = 0;
    char *s;
    (void)state;
    s = ar_utf8_sanitize("a\xff"
                         "b\xe2\x82",
                         5, &n);
    assert_non_null(s);
    assert_int_equal(n, 1 + 3 + 1 + 6);
    assert_memory_equal(s,
                        "a\xef\xbf\xbd"
                        "b\xef\xbf\xbd\xef\xbf\xbd",
                        n + 1);
    ar_free(s);
    s = ar_utf8_sanitize("\xe6\x97\xa5", 3, NULL);
    assert_non_null(s);
    assert_string_equal(s, "\xe6\x97\xa5");
    ar_free(s);
    ar_alloc_fail_after(1);
    assert_null(ar_utf8_sanitize("x", 1, NULL));
    ar_alloc_fail_after(0);
}

/* The tokenizer's reading: length from the lead byte's high bits, any continuation bytes. */
static void utf8_lax_reading(void **state)
{
    uint32_t cp = 0;
    (void)state;
    for (int c = 0; c < 256; c++) {
        size_t want = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        assert_int_equal(ar_utf8_lax_len((uint8_t)c), want);
    }
    assert_int_equal(ar_utf8_decode_lax("\xc0\xa1", 2, &cp), 2); /* overlong '!' */
    assert_int_equal(cp, 0x21);
    assert_int_equal(ar_utf8_decode_lax("\xed\xa0\x80", 3, &cp), 3); /* surrogate */
    assert_int_equal(cp, 0xd800);
    assert_int_equal(ar_utf8_decode_lax("\x80", 1, &cp), 0);
    assert_int_equal(ar_utf8_decode_lax("\xe2\x82", 2, &cp), 0);
    assert_int_equal(ar_utf8_decode_lax("\xe2\x41\x82", 3, &cp), 0);
    assert_int_equal(ar_utf8_decode_lax("", 0, &cp), 0);
}

/* ---- deadlines --------------------------------------------------------------------------- */

static int64_t ns_of(struct timespec t)
{
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t now_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return ns_of(t);
}

static void deadline_is_now_plus_seconds(void **state)
{
    static const double secs[] = {0, 1e-9, 0.01, 0.5, 0.999999999, 1, 1.5, 3.25, 3600};
    static const clockid_t clocks[] = {CLOCK_MONOTONIC, CLOCK_REALTIME};
    (void)state;
    for (size_t c = 0; c < AR_ARRAY_LEN(clocks); c++)
        for (size_t i = 0; i < AR_ARRAY_LEN(secs); i++)
            for (int rep = 0; rep < 200; rep++) {
                int64_t add = (int64_t)(secs[i] * 1e9), before, after, got;
                struct timespec d;
                before = now_ns(clocks[c]);
                d = ar_deadline_in(clocks[c], secs[i]);
                after = now_ns(clocks[c]);
                assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
                got = ns_of(d);
                /* 1 ns of rounding either way in the fraction */
                assert_true(got >= before + add - 1);
                assert_true(got <= after + add + 1);
            }
}

static void deadline_clamps_what_would_overflow(void **state)
{
    int64_t before, after, got;
    struct timespec d;
    (void)state;
    before = now_ns(CLOCK_MONOTONIC);
    d = ar_deadline_in(CLOCK_MONOTONIC, -5);
    after = now_ns(CLOCK_MONOTONIC);
    got = ns_of(d);
    assert_true(got >= before && got <= after);
    d = ar_deadline_in(CLOCK_MONOTONIC, NAN);
    assert_true(ns_of(d) >= after && ns_of(d) <= now_ns(CLOCK_MONOTONIC));
    before = now_ns(CLOCK_MONOTONIC);
    d = ar_deadline_in(CLOCK_MONOTONIC, 1e300);
    after = now_ns(CLOCK_MONOTONIC);
    assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    assert_true(ns_of(d) >= before + 1000000000LL * 1000000000LL);
    assert_true(ns_of(d) <= after + 1000000000LL * 1000000000LL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fnv1a_matches_published_vectors),
        cmocka_unit_test(fnv1a_chains_over_pieces),
        cmocka_unit_test(utf8_every_scalar_value_of_table_3_7),
        cmocka_unit_test(utf8_decodes_nothing_the_table_lacks),
        cmocka_unit_test(utf8_rejects_overlongs_surrogates_and_beyond),
        cmocka_unit_test(utf8_rfc3629_examples),
        cmocka_unit_test(utf8_sanitize_replaces_each_bad_byte),
        cmocka_unit_test(utf8_lax_reading),
        cmocka_unit_test(deadline_is_now_plus_seconds),
        cmocka_unit_test(deadline_clamps_what_would_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
