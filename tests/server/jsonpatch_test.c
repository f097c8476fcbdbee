/* jsonpatch_test.c - JSON Patch (src/server/jsonpatch.c) against the behaviour RFC 6902 states
 * in its appendix A (each example: document, patch, result or error), the JSON Pointer examples
 * of RFC 6901 section 5, and the cases the sessions rely on: a failing operation leaves the
 * document untouched, errors are told apart (bad patch, failed test, too big). Results are
 * compared with cJSON_Compare, not with the module's own equality. */
#include "harness/harness.h"

#include "server/server_internal.h"

static cJSON *parse(const char *s)
{
    cJSON *j = cJSON_Parse(s);
    if (!j)
        fail_msg("test JSON does not parse: %s", s);
    return j;
}

/* Equal trees: cJSON_Compare, or the same text (cJSON_Compare finds no object with a name
 * given twice equal, not even to itself). */
static bool same(const cJSON *a, const cJSON *b)
{
    char *x, *y;
    bool eq;
    if (cJSON_Compare(a, b, true))
        return true;
    x = cJSON_PrintUnformatted(a);
    y = cJSON_PrintUnformatted(b);
    eq = x && y && !strcmp(x, y);
    cJSON_free(x);
    cJSON_free(y);
    return eq;
}

/* Applies patch to doc; expects result r and, for SERVER_JSONPATCH_OK, the document want. Checks
 * that doc itself never changes. */
static void check(const char *doc, const char *patch, enum server_jsonpatch_result r,
                  const char *want)
{
    cJSON *d = parse(doc), *p = parse(patch), *before = cJSON_Duplicate(d, true), *out = NULL;
    struct server_jsonpatch_err e;
    enum server_jsonpatch_result got = server_jsonpatch_apply(d, p, NULL, &out, &e);
    if (got != r)
        fail_msg("%s on %s: result %d (%s), want %d", patch, doc, got, e.msg, r);
    assert_int_equal(e.result, got);
    assert_true(same(d, before));
    if (r == SERVER_JSONPATCH_OK) {
        cJSON *w = parse(want);
        if (!same(out, w)) {
            char *s = cJSON_PrintUnformatted(out);
            fail_msg("%s on %s gave %s, want %s", patch, doc, s, want);
        }
        cJSON_Delete(w);
    } else {
        assert_null(out);
        assert_true(e.msg[0] != '\0');
    }
    cJSON_Delete(out);
    cJSON_Delete(before);
    cJSON_Delete(p);
    cJSON_Delete(d);
}

/* ---- RFC 6902 appendix A --------------------------------------------------------------------- */

static void a1_add_member(void **state)
{
    (void)state;
    check("{\"foo\":\"bar\"}", "[{\"op\":\"add\",\"path\":\"/baz\",\"value\":\"qux\"}]",
          SERVER_JSONPATCH_OK, "{\"baz\":\"qux\",\"foo\":\"bar\"}");
}

static void a2_add_array_element(void **state)
{
    (void)state;
    check("{\"foo\":[\"bar\",\"baz\"]}", "[{\"op\":\"add\",\"path\":\"/foo/1\",\"value\":\"qux\"}]",
          SERVER_JSONPATCH_OK, "{\"foo\":[\"bar\",\"qux\",\"baz\"]}");
}

static void a3_remove_member(void **state)
{
    (void)state;
    check("{\"baz\":\"qux\",\"foo\":\"bar\"}", "[{\"op\":\"remove\",\"path\":\"/baz\"}]",
          SERVER_JSONPATCH_OK, "{\"foo\":\"bar\"}");
}

static void a4_remove_array_element(void **state)
{
    (void)state;
    check("{\"foo\":[\"bar\",\"qux\",\"baz\"]}", "[{\"op\":\"remove\",\"path\":\"/foo/1\"}]",
          SERVER_JSONPATCH_OK, "{\"foo\":[\"bar\",\"baz\"]}");
}

static void a5_replace(void **state)
{
    (void)state;
    check("{\"baz\":\"qux\",\"foo\":\"bar\"}",
          "[{\"op\":\"replace\",\"path\":\"/baz\",\"value\":\"boo\"}]", SERVER_JSONPATCH_OK,
          "{\"baz\":\"boo\",\"foo\":\"bar\"}");
}

static void a6_move_member(void **state)
{
    (void)state;
    check("{\"foo\":{\"bar\":\"baz\",\"waldo\":\"fred\"},\"qux\":{\"corge\":\"grault\"}}",
          "[{\"op\":\"move\",\"from\":\"/foo/waldo\",\"path\":\"/qux/thud\"}]", SERVER_JSONPATCH_OK,
          "{\"foo\":{\"bar\":\"baz\"},\"qux\":{\"corge\":\"grault\",\"thud\":\"fred\"}}");
}

static void a7_move_array_element(void **state)
{
    (void)state;
    check("{\"foo\":[\"all\",\"grass\",\"cows\",\"eat\"]}",
          "[{\"op\":\"move\",\"from\":\"/foo/1\",\"path\":\"/foo/3\"}]", SERVER_JSONPATCH_OK,
          "{\"foo\":[\"all\",\"cows\",\"eat\",\"grass\"]}");
}

static void a8_test_succeeds(void **state)
{
    (void)state;
    check("{\"baz\":\"qux\",\"foo\":[\"a\",2,\"c\"]}",
          "[{\"op\":\"test\",\"path\":\"/baz\",\"value\":\"qux\"},"
          "{\"op\":\"test\",\"path\":\"/foo/1\",\"value\":2}]",
          SERVER_JSONPATCH_OK, "{\"baz\":\"qux\",\"foo\":[\"a\",2,\"c\"]}");
}

static void a9_test_fails(void **state)
{
    (void)state;
    check("{\"baz\":\"qux\"}", "[{\"op\":\"test\",\"path\":\"/baz\",\"value\":\"bar\"}]",
          SERVER_JSONPATCH_ETEST, NULL);
}

static void a10_add_nested_object(void **state)
{
    (void)state;
    check("{\"foo\":\"bar\"}",
          "[{\"op\":\"add\",\"path\":\"/child\",\"value\":{\"grandchild\":{}}}]",
          SERVER_JSONPATCH_OK, "{\"foo\":\"bar\",\"child\":{\"grandchild\":{}}}");
}

static void a11_unknown_members_ignored(void **state)
{
    (void)state;
    check("{\"foo\":\"bar\"}", "[{\"op\":\"add\",\"path\":\"/baz\",\"value\":\"qux\",\"xyz\":123}]",
          SERVER_JSONPATCH_OK, "{\"foo\":\"bar\",\"baz\":\"qux\"}");
}

static void a12_add_to_missing_parent(void **state)
{
    (void)state;
    check("{\"foo\":\"bar\"}", "[{\"op\":\"add\",\"path\":\"/baz/bat\",\"value\":\"qux\"}]",
          SERVER_JSONPATCH_EINVAL, NULL);
}

static void a13_member_named_twice(void **state)
{
    (void)state;
    check("{\"foo\":\"bar\"}",
          "[{\"op\":\"add\",\"path\":\"/baz\",\"value\":\"qux\",\"op\":\"remove\"}]",
          SERVER_JSONPATCH_EINVAL, NULL);
}

static void a14_tilde_escapes(void **state)
{
    (void)state;
    /* "~01" is "~1" (the key), not "~/" */
    check("{\"/\":9,\"~1\":10}", "[{\"op\":\"test\",\"path\":\"/~01\",\"value\":10}]",
          SERVER_JSONPATCH_OK, "{\"/\":9,\"~1\":10}");
}

static void a15_string_is_not_number(void **state)
{
    (void)state;
    check("{\"/\":9,\"~1\":10}", "[{\"op\":\"test\",\"path\":\"/~01\",\"value\":\"10\"}]",
          SERVER_JSONPATCH_ETEST, NULL);
}

static void a16_append_array_value(void **state)
{
    (void)state;
    check("{\"foo\":[\"bar\"]}",
          "[{\"op\":\"add\",\"path\":\"/foo/-\",\"value\":[\"abc\",\"def\"]}]", SERVER_JSONPATCH_OK,
          "{\"foo\":[\"bar\",[\"abc\",\"def\"]]}");
}

/* ---- RFC 6901 section 5 --------------------------------------------------------------------- */

static void pointers_of_rfc6901(void **state)
{
    cJSON *d = parse("{\"foo\":[\"bar\",\"baz\"],\"\":0,\"a/b\":1,\"c%d\":2,\"e^f\":3,\"g|h\":4,"
                     "\"i\\\\j\":5,\"k\\\"l\":6,\" \":7,\"m~n\":8}");
    static const struct {
        const char *ptr;
        double num; /* -1: see str */
        const char *str;
    } cases[] = {
        {"/foo/0", -1, "bar"}, {"/", 0, NULL},     {"/a~1b", 1, NULL},    {"/c%d", 2, NULL},
        {"/e^f", 3, NULL},     {"/g|h", 4, NULL},  {"/i\\j", 5, NULL},    {"/k\"l", 6, NULL},
        {"/ ", 7, NULL},       {"/m~0n", 8, NULL}, {"/foo/1", -1, "baz"},
    };
    (void)state;
    assert_ptr_equal(server_jsonpatch_get(d, ""), d);
    assert_true(cJSON_IsArray(server_jsonpatch_get(d, "/foo")));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const cJSON *v = server_jsonpatch_get(d, cases[i].ptr);
        if (!v)
            fail_msg("%s: not found", cases[i].ptr);
        if (cases[i].str)
            assert_string_equal(cJSON_GetStringValue(v), cases[i].str);
        else
            assert_true(cJSON_IsNumber(v) && v->valuedouble == cases[i].num);
    }
    /* not pointers, or nothing there */
    assert_null(server_jsonpatch_get(d, "foo"));
    assert_null(server_jsonpatch_get(d, "/foo/2"));
    assert_null(server_jsonpatch_get(d, "/foo/01"));
    assert_null(server_jsonpatch_get(d, "/foo/-"));
    assert_null(server_jsonpatch_get(d, "/m~2n"));
    assert_null(server_jsonpatch_get(d, "/m~"));
    assert_null(server_jsonpatch_get(d, "/a/b"));
    cJSON_Delete(d);
}

/* ---- the rest of each operation ------------------------------------------------------------- */

static void add_replaces_and_bounds(void **state)
{
    (void)state;
    /* add on an existing member replaces it */
    check("{\"a\":1}", "[{\"op\":\"add\",\"path\":\"/a\",\"value\":2}]", SERVER_JSONPATCH_OK,
          "{\"a\":2}");
    /* index == length appends; beyond it or a leading zero is an error */
    check("{\"a\":[1]}", "[{\"op\":\"add\",\"path\":\"/a/1\",\"value\":2}]", SERVER_JSONPATCH_OK,
          "{\"a\":[1,2]}");
    check("{\"a\":[1]}", "[{\"op\":\"add\",\"path\":\"/a/2\",\"value\":2}]",
          SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":[1]}", "[{\"op\":\"add\",\"path\":\"/a/01\",\"value\":2}]",
          SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":[1]}", "[{\"op\":\"add\",\"path\":\"/a/x\",\"value\":2}]",
          SERVER_JSONPATCH_EINVAL, NULL);
    /* "" names the whole document */
    check("{\"a\":1}", "[{\"op\":\"add\",\"path\":\"\",\"value\":{\"b\":2}}]", SERVER_JSONPATCH_OK,
          "{\"b\":2}");
    /* a scalar has no children */
    check("{\"a\":1}", "[{\"op\":\"add\",\"path\":\"/a/b\",\"value\":2}]", SERVER_JSONPATCH_EINVAL,
          NULL);
    /* missing value, bad pointer, unknown op, not an array, not an object */
    check("{}", "[{\"op\":\"add\",\"path\":\"/a\"}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{}", "[{\"op\":\"add\",\"path\":\"a\",\"value\":1}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{}", "[{\"op\":\"add\",\"path\":\"/~x\",\"value\":1}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{}", "[{\"op\":\"merge\",\"path\":\"/a\",\"value\":1}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{}", "[{\"path\":\"/a\",\"value\":1}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{}", "[{\"op\":\"add\",\"value\":1}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{}", "{\"op\":\"add\",\"path\":\"/a\",\"value\":1}", SERVER_JSONPATCH_EINVAL, NULL);
    check("{}", "[1]", SERVER_JSONPATCH_EINVAL, NULL);
    /* an empty patch changes nothing */
    check("{\"a\":1}", "[]", SERVER_JSONPATCH_OK, "{\"a\":1}");
}

static void remove_and_replace_need_a_target(void **state)
{
    (void)state;
    check("{\"a\":1}", "[{\"op\":\"remove\",\"path\":\"/b\"}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":[1]}", "[{\"op\":\"remove\",\"path\":\"/a/1\"}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":[1]}", "[{\"op\":\"remove\",\"path\":\"/a/-\"}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":1}", "[{\"op\":\"remove\",\"path\":\"\"}]", SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":1}", "[{\"op\":\"replace\",\"path\":\"/b\",\"value\":2}]",
          SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":[1,2,3]}", "[{\"op\":\"replace\",\"path\":\"/a/1\",\"value\":9}]",
          SERVER_JSONPATCH_OK, "{\"a\":[1,9,3]}");
    check("{\"a\":[1,2,3]}", "[{\"op\":\"replace\",\"path\":\"/a/2\",\"value\":9}]",
          SERVER_JSONPATCH_OK, "{\"a\":[1,2,9]}");
    check("{\"a\":1}", "[{\"op\":\"replace\",\"path\":\"\",\"value\":[1]}]", SERVER_JSONPATCH_OK,
          "[1]");
}

static void move_and_copy(void **state)
{
    (void)state;
    check("{\"a\":{\"b\":1}}", "[{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/c\"}]",
          SERVER_JSONPATCH_OK, "{\"a\":{\"b\":1},\"c\":{\"b\":1}}");
    /* a copy is a copy: changing it leaves the original */
    check("{\"a\":{\"b\":1}}",
          "[{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/c\"},"
          "{\"op\":\"replace\",\"path\":\"/c/b\",\"value\":2}]",
          SERVER_JSONPATCH_OK, "{\"a\":{\"b\":1},\"c\":{\"b\":2}}");
    check("{\"a\":[1,2]}", "[{\"op\":\"copy\",\"from\":\"/a/0\",\"path\":\"/a/-\"}]",
          SERVER_JSONPATCH_OK, "{\"a\":[1,2,1]}");
    check("{\"a\":1}", "[{\"op\":\"copy\",\"from\":\"/x\",\"path\":\"/c\"}]",
          SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":1}", "[{\"op\":\"copy\",\"path\":\"/c\"}]", SERVER_JSONPATCH_EINVAL, NULL);
    /* a location cannot move into its own child; onto itself is nothing */
    check("{\"a\":{\"b\":1}}", "[{\"op\":\"move\",\"from\":\"/a\",\"path\":\"/a/c\"}]",
          SERVER_JSONPATCH_EINVAL, NULL);
    check("{\"a\":{\"b\":1}}", "[{\"op\":\"move\",\"from\":\"/a\",\"path\":\"/a\"}]",
          SERVER_JSONPATCH_OK, "{\"a\":{\"b\":1}}");
    /* "/ab" is not a child of "/a" */
    check("{\"a\":1,\"ab\":{}}", "[{\"op\":\"move\",\"from\":\"/a\",\"path\":\"/ab/x\"}]",
          SERVER_JSONPATCH_OK, "{\"ab\":{\"x\":1}}");
    check("{\"a\":[1,2,3]}", "[{\"op\":\"move\",\"from\":\"/a/0\",\"path\":\"/a/-\"}]",
          SERVER_JSONPATCH_OK, "{\"a\":[2,3,1]}");
    check("{\"a\":1}", "[{\"op\":\"move\",\"from\":\"/x\",\"path\":\"/b\"}]",
          SERVER_JSONPATCH_EINVAL, NULL);
}

static void test_compares_json_values(void **state)
{
    (void)state;
    /* objects in any member order, numbers by value */
    check("{\"a\":{\"x\":1,\"y\":[true,null]}}",
          "[{\"op\":\"test\",\"path\":\"/a\",\"value\":{\"y\":[true,null],\"x\":1.0}}]",
          SERVER_JSONPATCH_OK, "{\"a\":{\"x\":1,\"y\":[true,null]}}");
    check("{\"a\":{\"x\":1}}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":{\"x\":1,\"y\":2}}]",
          SERVER_JSONPATCH_ETEST, NULL);
    check("{\"a\":[1,2]}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":[2,1]}]",
          SERVER_JSONPATCH_ETEST, NULL);
    check("{\"a\":[1,2]}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":[1,2,3]}]",
          SERVER_JSONPATCH_ETEST, NULL);
    check("{\"a\":true}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":1}]", SERVER_JSONPATCH_ETEST,
          NULL);
    check("{\"a\":null}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":false}]",
          SERVER_JSONPATCH_ETEST, NULL);
    check("{\"a\":\"x\"}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":\"X\"}]",
          SERVER_JSONPATCH_ETEST, NULL);
    check("{}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":null}]", SERVER_JSONPATCH_EINVAL,
          NULL);
    /* a name given twice counts once, with the value a pointer finds (the first) */
    check("{\"a\":{\"x\":1,\"x\":2}}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":{\"x\":1}}]",
          SERVER_JSONPATCH_OK, "{\"a\":{\"x\":1,\"x\":2}}");
    check("{\"a\":{\"x\":1,\"x\":2}}", "[{\"op\":\"test\",\"path\":\"/a\",\"value\":{\"x\":2}}]",
          SERVER_JSONPATCH_ETEST, NULL);
    check("{\"a\":{\"x\":1,\"x\":2}}", "[{\"op\":\"test\",\"path\":\"/a/x\",\"value\":1}]",
          SERVER_JSONPATCH_OK, "{\"a\":{\"x\":1,\"x\":2}}");
    check("{\"a\":1}", "[{\"op\":\"test\",\"path\":\"\",\"value\":{\"a\":1}}]", SERVER_JSONPATCH_OK,
          "{\"a\":1}");
}

static void all_or_nothing(void **state)
{
    (void)state;
    /* the first operations succeed on the copy; the failing one discards them all */
    check("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
          "[{\"op\":\"add\",\"path\":\"/messages/"
          "-\",\"value\":{\"role\":\"user\",\"content\":\"x\"}},"
          "{\"op\":\"remove\",\"path\":\"/messages/0\"},"
          "{\"op\":\"test\",\"path\":\"/messages/0/content\",\"value\":\"hi\"}]",
          SERVER_JSONPATCH_ETEST, NULL);
    check("{\"a\":1}",
          "[{\"op\":\"replace\",\"path\":\"/a\",\"value\":2},{\"op\":\"remove\",\"path\":\"/zz\"}]",
          SERVER_JSONPATCH_EINVAL, NULL);
}

static void limits_hold_while_applying(void **state)
{
    struct server_jsonpatch_limits lim = {.max_depth = 6, .max_nodes = 200};
    struct server_jsonpatch_err e;
    cJSON *d = parse("{\"a\":[1,2,3,4,5,6,7,8]}"), *out = NULL;
    /* each copy doubles the document: 9 -> 18 -> ... beyond 200 values */
    cJSON *p = parse("[{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/a/-\"},"
                     "{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/a/-\"},"
                     "{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/a/-\"},"
                     "{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/a/-\"},"
                     "{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/a/-\"}]");
    (void)state;
    assert_int_equal(server_jsonpatch_apply(d, p, &lim, &out, &e), SERVER_JSONPATCH_ETOOBIG);
    assert_null(out);
    cJSON_Delete(p);
    /* nesting: /a/8 is 2 tokens deep, a value 5 levels deep puts the leaf at 7 */
    p = parse("[{\"op\":\"add\",\"path\":\"/a/-\",\"value\":[[[[1]]]]}]");
    assert_int_equal(server_jsonpatch_apply(d, p, &lim, &out, &e), SERVER_JSONPATCH_ETOOBIG);
    cJSON_Delete(p);
    p = parse("[{\"op\":\"add\",\"path\":\"/a/-\",\"value\":[[[1]]]}]");
    assert_int_equal(server_jsonpatch_apply(d, p, &lim, &out, &e), SERVER_JSONPATCH_OK);
    cJSON_Delete(out);
    cJSON_Delete(p);
    cJSON_Delete(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a1_add_member),
        cmocka_unit_test(a2_add_array_element),
        cmocka_unit_test(a3_remove_member),
        cmocka_unit_test(a4_remove_array_element),
        cmocka_unit_test(a5_replace),
        cmocka_unit_test(a6_move_member),
        cmocka_unit_test(a7_move_array_element),
        cmocka_unit_test(a8_test_succeeds),
        cmocka_unit_test(a9_test_fails),
        cmocka_unit_test(a10_add_nested_object),
        cmocka_unit_test(a11_unknown_members_ignored),
        cmocka_unit_test(a12_add_to_missing_parent),
        cmocka_unit_test(a13_member_named_twice),
        cmocka_unit_test(a14_tilde_escapes),
        cmocka_unit_test(a15_string_is_not_number),
        cmocka_unit_test(a16_append_array_value),
        cmocka_unit_test(pointers_of_rfc6901),
        cmocka_unit_test(add_replaces_and_bounds),
        cmocka_unit_test(remove_and_replace_need_a_target),
        cmocka_unit_test(move_and_copy),
        cmocka_unit_test(test_compares_json_values),
        cmocka_unit_test(all_or_nothing),
        cmocka_unit_test(limits_hold_while_applying),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
