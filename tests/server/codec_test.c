/* codec_test.c - the server's pure parts: MessagePack/JSON bodies, UTF-8 checks, OpenAI
 * request validation, API key files and token buckets. MessagePack inputs are written by
 * hand from the format specification. */
#include "harness/harness.h"

#include <fcntl.h>
#include <unistd.h>

#include "server/server_internal.h"

static cJSON *parse_ok(enum server_codec_format f, const char *data, size_t len)
{
    cJSON *j = NULL;
    struct ar_err err = {0};
    enum ar_status st = server_codec_parse(f, data, len, &j, &err);
    if (st != AR_OK)
        fail_msg("parse failed: %s", err.msg);
    return j;
}

static enum ar_status parse_st(enum server_codec_format f, const char *data, size_t len)
{
    cJSON *j = NULL;
    enum ar_status st = server_codec_parse(f, data, len, &j, NULL);
    cJSON_Delete(j);
    return st;
}

static void msgpack_and_json_give_the_same_tree(void **state)
{
    /* {"a": 1, "b": [true, null, "x"], "c": -5, "d": 1.5, "e": 300, "f": -200} */
    static const unsigned char mp[] = {0x86, 0xa1, 'a',  0x01, 0xa1, 'b',  0x93, 0xc3, 0xc0,
                                       0xa1, 'x',  0xa1, 'c',  0xfb, 0xa1, 'd',  0xcb, 0x3f,
                                       0xf8, 0,    0,    0,    0,    0,    0,    0xa1, 'e',
                                       0xcd, 0x01, 0x2c, 0xa1, 'f',  0xd1, 0xff, 0x38};
    const char *js = "{\"a\":1,\"b\":[true,null,\"x\"],\"c\":-5,\"d\":1.5,\"e\":300,\"f\":-200}";
    cJSON *a, *b;
    (void)state;
    a = parse_ok(SERVER_CODEC_MSGPACK, (const char *)mp, sizeof(mp));
    b = parse_ok(SERVER_CODEC_JSON, js, strlen(js));
    assert_true(cJSON_Compare(a, b, true));
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void msgpack_bin_reads_as_string_and_big_ints_work(void **state)
{
    /* {"s": bin8 "hi", "u": uint32 70000, "i": int64 -1, "f": float32 0.5, "t": str8 "yo"} */
    static const unsigned char mp[] = {0x85, 0xa1, 's',  0xc4, 2,    'h',  'i',  0xa1, 'u',  0xce,
                                       0,    1,    0x11, 0x70, 0xa1, 'i',  0xd3, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0xff, 0xff, 0xa1, 'f',  0xca, 0x3f, 0,
                                       0,    0,    0xa1, 't',  0xd9, 2,    'y',  'o'};
    cJSON *j;
    (void)state;
    j = parse_ok(SERVER_CODEC_MSGPACK, (const char *)mp, sizeof(mp));
    assert_string_equal(cJSON_GetObjectItem(j, "s")->valuestring, "hi");
    assert_true(cJSON_GetObjectItem(j, "u")->valuedouble == 70000.0);
    assert_true(cJSON_GetObjectItem(j, "i")->valuedouble == -1.0);
    assert_true(cJSON_GetObjectItem(j, "f")->valuedouble == 0.5);
    assert_string_equal(cJSON_GetObjectItem(j, "t")->valuestring, "yo");
    cJSON_Delete(j);
}

static void msgpack_rejects_bad_input(void **state)
{
    static const unsigned char int_key[] = {0x81, 0x01, 0x02};                /* {1: 2} */
    static const unsigned char ext[] = {0x81, 0xa1, 'a', 0xd4, 0x01, 0x00};   /* fixext1 */
    static const unsigned char huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}; /* array32 */
    static const unsigned char huge_map[] = {0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa0, 0xc0};
    static const unsigned char trunc[] = {0x81, 0xa5, 'a', 'b'};
    static const unsigned char trailing[] = {0x80, 0x80};
    static const unsigned char bad_utf8[] = {0x81, 0xa1, 'a', 0xa2, 0xc0, 0x80};
    static const unsigned char nul[] = {0x81, 0xa1, 'a', 0xa2, 'x', 0x00};
    static const unsigned char reserved[] = {0xc1};
    static const unsigned char nan32[] = {0xca, 0x7f, 0xc0, 0, 0};
    unsigned char deep[40];
    (void)state;
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)int_key, sizeof(int_key)),
                     AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)ext, sizeof(ext)), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)huge, sizeof(huge)), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)huge_map, sizeof(huge_map)),
                     AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)trunc, sizeof(trunc)),
                     AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)trailing, sizeof(trailing)),
                     AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)bad_utf8, sizeof(bad_utf8)),
                     AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)nul, sizeof(nul)), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)reserved, 1), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)nan32, sizeof(nan32)),
                     AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, "", 0), AR_EFORMAT);
    /* 32 nested arrays are fine, 33 are not */
    memset(deep, 0x91, sizeof(deep));
    deep[31] = 0x90;
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)deep, 32), AR_OK);
    deep[31] = 0x91;
    deep[32] = 0x90;
    assert_int_equal(parse_st(SERVER_CODEC_MSGPACK, (const char *)deep, 33), AR_EFORMAT);
}

/* A NUL in a string, escaped in JSON or raw in MessagePack, is refused naming the field:
 * cJSON would cut the string at it ("victim\u0000attacker" read as "victim"). */
static void nul_in_a_string_is_refused_naming_the_field(void **state)
{
    static const unsigned char mp_nul[] = {0x82, 0xa1, 'a', 0x01, 0xa7, 's', 'h', 'o', 'p', '_',
                                           'i', 'd', 0xa3, 'v', 0x00, 'x'};
    const char *js = "{\"text\":\"ok\",\"shop_id\":\"victim\\u0000attacker\",\"rating\":5}";
    const char *esc = "{\"shop_id\":\"a\\\\u0000\"}"; /* an escaped backslash: text */
    struct ar_err err = {0};
    cJSON *j = NULL;
    (void)state;
    assert_int_equal(server_codec_parse(SERVER_CODEC_JSON, js, strlen(js), &j, &err), AR_EFORMAT);
    assert_null(j);
    assert_non_null(strstr(err.msg, "\"shop_id\""));
    assert_non_null(strstr(err.msg, "NUL"));
    memset(&err, 0, sizeof(err));
    assert_int_equal(
        server_codec_parse(SERVER_CODEC_MSGPACK, (const char *)mp_nul, sizeof(mp_nul), &j, &err),
        AR_EFORMAT);
    assert_non_null(strstr(err.msg, "\"shop_id\""));
    j = parse_ok(SERVER_CODEC_JSON, esc, strlen(esc));
    assert_string_equal(cJSON_GetObjectItem(j, "shop_id")->valuestring, "a\\u0000");
    cJSON_Delete(j);
    /* other control characters are text */
    j = parse_ok(SERVER_CODEC_JSON, "{\"t\":\"a\\u0001b\"}", 16);
    assert_int_equal(strlen(cJSON_GetObjectItem(j, "t")->valuestring), 3);
    cJSON_Delete(j);
}

static void json_rejects_invalid_utf8_deep_nesting_and_trailing_data(void **state)
{
    char deep[80];
    (void)state;
    assert_int_equal(parse_st(SERVER_CODEC_JSON, "{\"a\":\"\xff\"}", 9), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_JSON, "{\"\xed\xa0\x80\":1}", 10), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_JSON, "{\"a\":1} x", 9), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_JSON, "{\"a\":1}\n", 8), AR_OK);
    assert_int_equal(parse_st(SERVER_CODEC_JSON, "{\"a\":", 5), AR_EFORMAT);
    assert_int_equal(parse_st(SERVER_CODEC_JSON, "{\"a\0b\":1}", 9), AR_EFORMAT); /* raw NUL */
    assert_int_equal(parse_st(SERVER_CODEC_JSON, "[1e40099]", 9), AR_EFORMAT);    /* overflows */
    memset(deep, '[', 32);
    memset(deep + 32, ']', 32);
    assert_int_equal(parse_st(SERVER_CODEC_JSON, deep, 64), AR_OK);
    memset(deep, '[', 33);
    memset(deep + 33, ']', 33);
    assert_int_equal(parse_st(SERVER_CODEC_JSON, deep, 66), AR_EFORMAT);
}

static void msgpack_writer_emits_spec_bytes(void **state)
{
    /* {"a": 1, "b": "x", "c": 0.5, "d": [null, false]} */
    static const unsigned char want[] = {0x84, 0xa1, 'a',  0x01, 0xa1, 'b',  0xa1, 'x',
                                         0xa1, 'c',  0xcb, 0x3f, 0xe0, 0,    0,    0,
                                         0,    0,    0,    0xa1, 'd',  0x92, 0xc0, 0xc2};
    cJSON *j = cJSON_Parse("{\"a\":1,\"b\":\"x\",\"c\":0.5,\"d\":[null,false]}");
    char *out = NULL;
    size_t len = 0;
    (void)state;
    assert_int_equal(server_codec_write(SERVER_CODEC_MSGPACK, j, &out, &len), AR_OK);
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(out, want, sizeof(want));
    ar_free(out);
    cJSON_Delete(j);
}

static void utf8_checker_follows_the_standard(void **state)
{
    size_t n;
    char *s;
    (void)state;
    assert_true(ar_utf8_valid("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10));
    assert_false(ar_utf8_valid("\xc0\x80", 2));         /* overlong NUL */
    assert_false(ar_utf8_valid("\xe0\x80\x80", 3));     /* overlong */
    assert_false(ar_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    assert_false(ar_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    assert_false(ar_utf8_valid("\xe2\x82", 2));         /* truncated */
    assert_false(ar_utf8_valid("\x80", 1));
    s = ar_utf8_sanitize("a\xff"
                            "b",
                            3, &n);
    assert_int_equal(n, 5);
    assert_string_equal(s, "a\xef\xbf\xbd"
                           "b");
    ar_free(s);
}

/* ---- requests ---------------------------------------------------------------------------- */

static enum ar_status req_parse(enum server_oai_kind k, const char *js,
                                struct server_oai_request *r, struct server_oai_error *e)
{
    cJSON *j = cJSON_Parse(js);
    enum ar_status st;
    assert_non_null(j);
    st = server_oai_request_parse(k, j, 128, 1000, r, e);
    cJSON_Delete(j); /* r's borrowed pointers are not read afterwards */
    return st;
}

static void expect_400(enum server_oai_kind k, const char *js, const char *param, const char *code)
{
    struct server_oai_request r;
    struct server_oai_error e = {0};
    enum ar_status st = req_parse(k, js, &r, &e);
    server_oai_request_fini(&r);
    if (st != AR_EINVAL)
        fail_msg("accepted: %s", js);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (code)
        assert_string_equal(e.code, code);
}

static void wrong_types_name_the_field(void **state)
{
    (void)state;
    expect_400(SERVER_OAI_CHAT, "{\"messages\":\"hi\"}", "messages", "invalid_type");
    expect_400(SERVER_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":1}]}",
               "messages[0].content", "invalid_type");
    expect_400(SERVER_OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}",
               "temperature", "invalid_type");
    expect_400(SERVER_OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}",
               "max_tokens", "invalid_type");
    expect_400(SERVER_OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", "stream",
               "invalid_type");
    expect_400(SERVER_OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", "stop",
               "invalid_type");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":{}}", "prompt", "invalid_type");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"seed\":\"1\"}", "seed", "invalid_type");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"model\":3}", "model", "invalid_type");
}

static void out_of_range_and_missing_values_are_rejected(void **state)
{
    (void)state;
    expect_400(SERVER_OAI_CHAT, "{\"messages\":[]}", "messages", "invalid_value");
    expect_400(SERVER_OAI_CHAT, "{}", "messages", "missing_required_parameter");
    expect_400(SERVER_OAI_CHAT, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}",
               "messages[0].role", "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens",
               "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":-3}", "max_tokens",
               "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":129}", "max_tokens",
               "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"max_completion_tokens\":1e12}",
               "max_completion_tokens", "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"top_p\":1.5}", "top_p", "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"temperature\":-1}", "temperature",
               "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":[1,2,1000]}", "prompt", "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":[]}", "prompt", "invalid_value");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":\"x\",\"priority\":\"urgent\"}", "priority",
               "invalid_value");
    expect_400(SERVER_OAI_COMPLETION,
               "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\","
               "\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
               "stop", "invalid_value");
}

static void unsupported_features_are_refused(void **state)
{
    (void)state;
    expect_400(SERVER_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}",
               "n", "unsupported_parameter");
    expect_400(SERVER_OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
               "\"function\"}]}",
               "tools", "unsupported_parameter");
    expect_400(SERVER_OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true}",
               "logprobs", "unsupported_parameter");
    expect_400(SERVER_OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{"
               "\"type\":\"json_object\"}}",
               "response_format", "unsupported_parameter");
    expect_400(SERVER_OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt",
               "unsupported_parameter");
}

static void valid_request_fills_the_engine_fields(void **state)
{
    struct server_oai_request r;
    struct server_oai_error e = {0};
    cJSON *j = cJSON_Parse(
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hel\"},{\"type\":\"text\","
        "\"text\":\"lo\"}]}],\"max_completion_tokens\":7,\"temperature\":0,\"top_k\":5000,"
        "\"seed\":42,\"stop\":[\"\\n\",\"END\"],\"priority\":\"bulk\",\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"n\":1,\"response_format\":{\"type\":"
        "\"text\"},\"user\":\"ignored\",\"tools\":[],\"truncate\":true}");
    (void)state;
    assert_int_equal(server_oai_request_parse(SERVER_OAI_CHAT, j, 128, 1000, &r, &e), AR_OK);
    assert_int_equal(r.n_msgs, 2);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[1].content, "hello");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.sampling.temperature == 0.0f);
    assert_int_equal(r.sampling.top_k, 1000); /* clamped to the vocabulary */
    assert_true(r.seed_set);
    assert_int_equal(r.sampling.seed, 42);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "END");
    assert_int_equal(r.priority, ENGINE_PRIO_BULK);
    assert_true(r.stream && r.include_usage && r.truncate);
    assert_string_equal(r.model, "m");
    server_oai_request_fini(&r);
    cJSON_Delete(j);

    j = cJSON_Parse("{\"prompt\":[5,6,7],\"priority\":0}");
    assert_int_equal(server_oai_request_parse(SERVER_OAI_COMPLETION, j, 128, 1000, &r, &e), AR_OK);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 7);
    assert_int_equal(r.max_tokens, 0);
    assert_int_equal(r.priority, ENGINE_PRIO_INTERACTIVE);
    assert_false(r.seed_set);
    server_oai_request_fini(&r);
    cJSON_Delete(j);
}

/* ---- keys and buckets --------------------------------------------------------------------- */

static void key_file_skips_comments_and_blank_lines(void **state)
{
    char path[] = "/tmp/ar_keys_XXXXXX";
    int fd = mkstemp(path);
    struct server_keys *k = NULL;
    const char *text = "# keys\n\n  sk-one  \nsk-two\n#sk-three\n";
    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(server_keys_load(path, &k, NULL), AR_OK);
    assert_int_equal(server_keys_find(k, "sk-one", 6), 0);
    assert_int_equal(server_keys_find(k, "sk-two", 6), 1);
    assert_int_equal(server_keys_find(k, "sk-three", 8), -1);
    assert_int_equal(server_keys_find(k, "sk-on", 5), -1);
    assert_int_equal(server_keys_find(k, "#sk-three", 9), -1);
    server_keys_destroy(k);
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "# none\n", 7), 7);
    close(fd);
    assert_int_equal(server_keys_load(path, &k, NULL), AR_EFORMAT);
    unlink(path);
    assert_int_equal(server_keys_load(path, &k, NULL), AR_EIO);
}

static void request_bucket_refills_at_its_rate(void **state)
{
    struct server_limiter *l;
    double retry = 0;
    (void)state;
    assert_int_equal(server_limiter_create(2.0, 3.0, 0, &l), AR_OK);
    for (int i = 0; i < 3; i++)
        assert_true(server_limiter_request(l, "a", 100.0, &retry));
    assert_false(server_limiter_request(l, "a", 100.0, &retry));
    assert_true(retry > 0.49 && retry < 0.51);               /* one request at 2/s */
    assert_true(server_limiter_request(l, "b", 100.0, &retry)); /* other clients unaffected */
    assert_false(server_limiter_request(l, "a", 100.25, &retry));
    assert_true(server_limiter_request(l, "a", 100.5, &retry));
    server_limiter_destroy(l);
}

static void token_bucket_charges_admission_and_debt(void **state)
{
    struct server_limiter *l;
    double retry = 0;
    (void)state;
    assert_int_equal(server_limiter_create(0, 0, 600.0, &l), AR_OK); /* 10 tokens/s, size 600 */
    assert_true(server_limiter_tokens(l, "k", 500, true, 0.0, &retry));
    assert_true(server_limiter_tokens(l, "k", 300, false, 0.0, &retry)); /* level -200 */
    assert_false(server_limiter_tokens(l, "k", 100, true, 0.0, &retry));
    assert_true(retry > 29.9 && retry < 30.1); /* from -200 to 100 at 10/s */
    assert_true(server_limiter_tokens(l, "k", 100, true, 30.0, &retry));
    /* a prompt larger than the bucket waits for a full bucket, not forever */
    assert_false(server_limiter_tokens(l, "k", 5000, true, 30.0, &retry));
    assert_true(server_limiter_tokens(l, "k", 5000, true, 200.0, &retry));
    server_limiter_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(msgpack_and_json_give_the_same_tree),
        cmocka_unit_test(msgpack_bin_reads_as_string_and_big_ints_work),
        cmocka_unit_test(msgpack_rejects_bad_input),
        cmocka_unit_test(json_rejects_invalid_utf8_deep_nesting_and_trailing_data),
        cmocka_unit_test(nul_in_a_string_is_refused_naming_the_field),
        cmocka_unit_test(msgpack_writer_emits_spec_bytes),
        cmocka_unit_test(utf8_checker_follows_the_standard),
        cmocka_unit_test(wrong_types_name_the_field),
        cmocka_unit_test(out_of_range_and_missing_values_are_rejected),
        cmocka_unit_test(unsupported_features_are_refused),
        cmocka_unit_test(valid_request_fills_the_engine_fields),
        cmocka_unit_test(key_file_skips_comments_and_blank_lines),
        cmocka_unit_test(request_bucket_refills_at_its_rate),
        cmocka_unit_test(token_bucket_charges_admission_and_debt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
