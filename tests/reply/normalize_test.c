/* normalize_test.c - review text -> cache key. Expected strings are written by hand from
 * the rules in normalize.h; random bytes check the invariants (valid UTF-8 out, never
 * longer than the input, normalizing twice changes nothing). Validity is judged by
 * iconv, not by our decoder. Octal escapes (\257, \037) end a byte where a letter
 * follows, since a hex escape would swallow the letter. */
#include "harness/harness.h"

#include <iconv.h>

#include "base/base.h"
#include "reply/normalize.h"

/* Normalizes a C string; fails the test on error. Caller frees with ar_free. */
static char *norm(const char *s)
{
    char *out = NULL;
    size_t n = 12345;
    assert_int_equal(reply_normalize(s, strlen(s), &out, &n), AR_OK);
    assert_non_null(out);
    assert_int_equal(n, strlen(out));
    return out;
}

static void expect_norm(const char *in, const char *want)
{
    char *got = norm(in);
    if (strcmp(got, want) != 0)
        fail_msg("normalize(\"%s\") = \"%s\", want \"%s\"", in, got, want);
    ar_free(got);
}

/* Every string in the list normalizes to the same text. */
static void expect_same(const char *const *list, size_t n)
{
    char *first = norm(list[0]);
    for (size_t i = 1; i < n; i++) {
        char *got = norm(list[i]);
        if (strcmp(got, first) != 0)
            fail_msg("\"%s\" -> \"%s\" but \"%s\" -> \"%s\"", list[0], first, list[i], got);
        ar_free(got);
    }
    ar_free(first);
}

static bool valid_utf8(const char *s, size_t n)
{
    iconv_t cd = iconv_open("UTF-32LE", "UTF-8");
    char out[4096];
    char *in = (char *)(uintptr_t)s, *o = out;
    size_t in_left = n, out_left = sizeof(out);
    bool ok;
    assert_true(cd != (iconv_t)-1);
    assert_true(n * 4 <= sizeof(out));
    ok = iconv(cd, &in, &in_left, &o, &out_left) != (size_t)-1 && in_left == 0;
    iconv_close(cd);
    return ok;
}

/* ---- the rules one by one ----------------------------------------------------------- */

static void full_width_ascii_becomes_ascii(void **state)
{
    (void)state;
    expect_norm("ＧＯＯＤ　ＱＵＡＬＩＴＹ", "good quality");
    expect_norm("ｉＰｈｏｎｅ１５ Ｐｒｏ", "iphone15 pro");
    expect_norm("１２３４５６", "123456");
    expect_norm("价格（很）实惠", "价格(很)实惠");
    expect_norm("质量很好，物流很快", "质量很好,物流很快");
    expect_norm("＃＄％＆＠", "#$%&@"); /* inner punctuation stays, one of each */
}

static void ascii_case_is_folded(void **state)
{
    (void)state;
    expect_norm("GREAT Product", "great product");
    expect_norm("Ünïcode Straße", "Ünïcode straße"); /* only ASCII folds */
}

static void whitespace_collapses_and_trims(void **state)
{
    (void)state;
    expect_norm("  Hello\t\n  World \r\n", "hello world");
    expect_norm("fast\xc2\xa0shipping", "fast shipping");     /* NBSP */
    expect_norm("fast\xe2\x80\x83shipping", "fast shipping"); /* em space */
    expect_norm("很 好 用", "很好用");                        /* between ideographs */
    expect_norm("很　好", "很好");                            /* ideographic space */
    expect_norm("质量 good 很好", "质量 good 很好");          /* Latin neighbour keeps it */
    expect_norm("배송이 빨라요", "배송이 빨라요");            /* Korean keeps its spaces */
    expect_norm("   ", "");
    expect_norm("", "");
}

static void repeated_punctuation_and_emoji_collapse_to_one(void **state)
{
    (void)state;
    expect_norm("真的吗???真的", "真的吗?真的");
    expect_norm("好。。。。还行", "好。还行");
    expect_norm("赞👍👍👍好评", "赞👍好评");
    expect_norm("wait.....what", "wait.what");
    expect_norm("A--B", "a-b");
}

static void repeated_letters_collapse_to_two_digits_never(void **state)
{
    (void)state;
    expect_norm("好好好好好", "好好");
    expect_norm("好好", "好好");
    expect_norm("很好好好好用", "很好好用");
    expect_norm("soooooo good", "soo good");
    expect_norm("good", "good");
    expect_norm("等了1000000年", "等了1000000年");
    expect_norm("１１１１元", "1111元");
}

static void trailing_filler_is_removed(void **state)
{
    static const char *const great[] = {
        "太棒了！！！！", "太棒了!",      "太棒了",     "太棒了～～", "太棒了~",
        "太棒了😀😀😀",      "太棒了 ! ! !", "太棒了。",   "太棒了啦",   "太棒了哈哈哈",
        "太棒了呀~~",     "太棒了……",     "太棒了!!!😊", "  太棒了  ",
    };
    static const char *const love[] = {"喜欢❤️❤️❤️", "喜欢❤", "喜欢❤️", "喜欢",
                                       "喜欢\xe2\x9d\xa4\xef\xb8\x8f\xe2\x9d\xa4"};
    static const char *const nice[] = {"Nice!!! 👍👍", "nice", "NICE.", "Nice 👍🏻", "nice ~"};
    (void)state;
    expect_same(great, AR_ARRAY_LEN(great));
    expect_norm(great[0], "太棒了");
    expect_same(love, AR_ARRAY_LEN(love));
    expect_norm(love[0], "喜欢");
    expect_same(nice, AR_ARRAY_LEN(nice));
    expect_norm(nice[0], "nice");
    expect_norm("东西还行吧。。。", "东西还行吧"); /* 吧 changes meaning: kept */
    expect_norm("好用吗？", "好用吗");
    expect_norm("收到了", "收到了"); /* 了 is not filler */
    expect_norm("还没到呢", "还没到");
    expect_norm("真的很好用哦~", "真的很好用");
    expect_norm("全家都喜欢👨‍👩‍👧", "全家都喜欢");
    expect_norm("卖家服务很好 😊 下次还来", "卖家服务很好 😊 下次还来"); /* not trailing */
    expect_norm("GREAT product, FAST shipping!!!", "great product, fast shipping");
    expect_norm("不好用，差评！！！", "不好用,差评");
}

static void filler_only_text_keeps_its_collapsed_form(void **state)
{
    (void)state;
    expect_norm("哈哈哈哈", "哈哈");
    expect_norm("！！！", "!");
    expect_norm("👍👍👍", "👍");
    expect_norm("👍🏻", "👍"); /* skin tone dropped */
    expect_norm(" ~ ", "~");
    /* different emoji-only reviews stay different */
    char *a = norm("👍"), *b = norm("😡");
    assert_string_not_equal(a, b);
    ar_free(a);
    ar_free(b);
}

static void invisible_characters_are_dropped(void **state)
{
    (void)state;
    expect_norm("\xef\xbb\xbf好评", "好评");            /* BOM */
    expect_norm("好\xe2\x80\x8b评", "好评");            /* zero-width space */
    expect_norm("good\x01\x7f\xc2\205bye", "good bye"); /* NEL is a space */
    expect_norm("good\x01\x7f\xc2\220bye", "goodbye");  /* C1 control dropped */
    expect_norm("soft\xc2\xadware", "software");        /* soft hyphen */
    {
        char *out = NULL;
        size_t n;
        static const char with_nul[] = {'\xe5', '\xa5', '\xbd', '\0', '\xe8', '\xaf', '\x84'};
        assert_int_equal(reply_normalize(with_nul, sizeof(with_nul), &out, &n), AR_OK);
        assert_string_equal(out, "好评");
        assert_int_equal(n, 6);
        ar_free(out);
    }
}

static void invalid_utf8_is_dropped_byte_by_byte(void **state)
{
    (void)state;
    expect_norm("好\xff\xfe评", "好评");
    expect_norm("好评\xe5\xa5", "好评");          /* truncated at the end */
    expect_norm("a\xc0\257b", "ab");              /* overlong '/' */
    expect_norm("a\xe0\x80\257b", "ab");          /* overlong, 3 bytes */
    expect_norm("a\xed\xa0\200b", "ab");          /* surrogate U+D800 */
    expect_norm("a\xf4\x90\x80\200b", "ab");      /* above U+10FFFF */
    expect_norm("a\x80\x80\200b", "ab");          /* stray continuations */
    expect_norm("\xe5\xa5\xbd\xe5\xa5", "好");    /* good then truncated */
    expect_norm("\xf0\x9f\x91\x8d\xf0\x9f", "👍"); /* emoji then truncated */
}

/* ---- invariants on random bytes ----------------------------------------------------- */

static void random_bytes_give_valid_idempotent_output(void **state)
{
    /* pieces that exercise every rule, glued at random, plus raw random bytes */
    /* clang-format off */
    static const char *const pieces[] = {
        "好", "哈", "了", "！", "!", " ", "　", "\t", "Ａ", "a", "Z", "1", "１", "。", "…", "~", "👍",
        "🏻", "\xef\xb8\x8f", "\xe2\x80\x8d", "❤", "😀", "呢", "啊", "\xff", "\xe5\xa5", "\xc0",
        "\x80", ".", ",", "、", "很", "q", "\xed\xa0\x80", "\x00", "-"
    };
    /* clang-format on */
    struct th_rng r = {20240611};
    char in[256];
    (void)state;
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0, target = th_rng_u64(&r) % 120;
        char *a, *b;
        size_t na, nb;
        while (n < target) {
            if (th_rng_u64(&r) % 4 == 0) {
                in[n++] = (char)(th_rng_u64(&r) & 0xff);
            } else {
                const char *p = pieces[th_rng_u64(&r) % AR_ARRAY_LEN(pieces)];
                size_t k = p[0] ? strlen(p) : 1;
                if (n + k > sizeof(in))
                    break;
                memcpy(in + n, p, k);
                n += k;
            }
        }
        assert_int_equal(reply_normalize(in, n, &a, &na), AR_OK);
        assert_true(na <= n);
        assert_int_equal(strlen(a), na);
        assert_true(valid_utf8(a, na));
        assert_int_equal(reply_normalize(a, na, &b, &nb), AR_OK);
        if (strcmp(a, b) != 0)
            fail_msg("not idempotent: \"%s\" then \"%s\"", a, b);
        /* never ends or starts with a space, never holds a double space */
        if (na) {
            assert_true(a[0] != ' ' && a[na - 1] != ' ');
            assert_null(strstr(a, "  "));
        }
        ar_free(a);
        ar_free(b);
    }
}

/* ---- language, bucket, key ---------------------------------------------------------- */

static void language_guess_is_zh_with_any_ideograph(void **state)
{
    (void)state;
    assert_string_equal(reply_guess_lang("Great product", 13), "en");
    assert_string_equal(reply_guess_lang("Great 产品", strlen("Great 产品")), "zh");
    assert_string_equal(reply_guess_lang("ＧＯＯＤ", strlen("ＧＯＯＤ")), "en");
    assert_string_equal(reply_guess_lang("こんにちは", strlen("こんにちは")), "en");
    assert_string_equal(reply_guess_lang("", 0), "en");
    assert_string_equal(reply_guess_lang(NULL, 0), "en");
    assert_string_equal(reply_guess_lang("\xff\xe4\xb8\xad", 4), "zh"); /* junk, then 中 */
    assert_string_equal(reply_guess_lang("\xe4\xb8", 2), "en");         /* half of 中 */
    assert_string_equal(reply_guess_lang("𠀀", strlen("𠀀")), "zh");    /* extension B */
}

static void rating_buckets(void **state)
{
    (void)state;
    assert_string_equal(reply_rating_bucket(1), "neg");
    assert_string_equal(reply_rating_bucket(2), "neg");
    assert_string_equal(reply_rating_bucket(3), "neu");
    assert_string_equal(reply_rating_bucket(4), "pos");
    assert_string_equal(reply_rating_bucket(5), "pos");
    assert_null(reply_rating_bucket(0));
    assert_null(reply_rating_bucket(6));
    assert_null(reply_rating_bucket(-1));
}

static char *key(const char *shop, int rating, const char *lang, const char *text)
{
    char *k = NULL;
    size_t n = 0;
    assert_int_equal(reply_normalize_key(shop, rating, lang, text, strlen(text), &k, &n), AR_OK);
    assert_int_equal(n, strlen(k));
    return k;
}

static void key_joins_shop_bucket_lang_and_text(void **state)
{
    char *a, *b;
    (void)state;
    a = key("shop-1", 5, NULL, "太棒了！！！！");
    assert_string_equal(a, "shop-1\037pos\037zh\037太棒了");
    b = key("shop-1", 4, "zh", "太棒了!");
    assert_string_equal(a, b);
    ar_free(b);
    b = key("shop-2", 5, NULL, "太棒了！！！！"); /* another shop never shares a key */
    assert_string_not_equal(a, b);
    ar_free(b);
    b = key("shop-1", 3, NULL, "太棒了"); /* another bucket */
    assert_string_equal(b, "shop-1\037neu\037zh\037太棒了");
    ar_free(b);
    b = key("shop-1", 5, "en", "太棒了"); /* the caller's language wins */
    assert_string_equal(b, "shop-1\037pos\037en\037太棒了");
    ar_free(b);
    ar_free(a);
    a = key("s", 1, NULL, "Broken on arrival!!");
    assert_string_equal(a, "s\037neg\037en\037broken on arrival");
    ar_free(a);
    a = key("s", 2, NULL, "");
    assert_string_equal(a, "s\037neg\037en\037");
    ar_free(a);
}

static void key_rejects_bad_arguments(void **state)
{
    char *k = (char *)1;
    size_t n = 99;
    (void)state;
    assert_int_equal(reply_normalize_key("shop", 0, NULL, "x", 1, &k, &n), AR_EINVAL);
    assert_null(k);
    assert_int_equal(n, 0);
    assert_int_equal(reply_normalize_key("shop", 6, NULL, "x", 1, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize_key("", 5, NULL, "x", 1, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize_key(NULL, 5, NULL, "x", 1, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize_key("a\037b", 5, NULL, "x", 1, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize_key("shop", 5, "", "x", 1, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize_key("shop", 5, "z\037", "x", 1, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize_key("shop", 5, NULL, NULL, 3, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize_key("shop", 5, NULL, "x", 1, NULL, &n), AR_EINVAL);
    assert_int_equal(reply_normalize(NULL, 3, &k, &n), AR_EINVAL);
    assert_int_equal(reply_normalize("x", 1, NULL, &n), AR_EINVAL);
    /* a 0x1f in the text cannot forge a field separator */
    k = key("shop", 5, "zh", "a\037pos");
    assert_string_equal(k, "shop\037pos\037zh\037apos");
    ar_free(k);
}

static void out_of_memory_is_reported_without_leaks(void **state)
{
    (void)state;
    for (uint64_t fail_at = 1; fail_at <= 3; fail_at++) {
        char *k = NULL;
        size_t n;
        enum ar_status st;
        ar_alloc_fail_after(fail_at);
        st = reply_normalize_key("shop", 5, NULL, "太棒了！", strlen("太棒了！"), &k, &n);
        ar_alloc_fail_after(0);
        assert_int_equal(st, AR_ENOMEM);
        assert_null(k);
    }
    {
        char *k = NULL;
        size_t n;
        ar_alloc_fail_after(4);
        assert_int_equal(reply_normalize_key("shop", 5, NULL, "x", 1, &k, &n), AR_OK);
        ar_alloc_fail_after(0);
        ar_free(k);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_width_ascii_becomes_ascii),
        cmocka_unit_test(ascii_case_is_folded),
        cmocka_unit_test(whitespace_collapses_and_trims),
        cmocka_unit_test(repeated_punctuation_and_emoji_collapse_to_one),
        cmocka_unit_test(repeated_letters_collapse_to_two_digits_never),
        cmocka_unit_test(trailing_filler_is_removed),
        cmocka_unit_test(filler_only_text_keeps_its_collapsed_form),
        cmocka_unit_test(invisible_characters_are_dropped),
        cmocka_unit_test(invalid_utf8_is_dropped_byte_by_byte),
        cmocka_unit_test(random_bytes_give_valid_idempotent_output),
        cmocka_unit_test(language_guess_is_zh_with_any_ideograph),
        cmocka_unit_test(rating_buckets),
        cmocka_unit_test(key_joins_shop_bucket_lang_and_text),
        cmocka_unit_test(key_rejects_bad_arguments),
        cmocka_unit_test(out_of_memory_is_reported_without_leaks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
