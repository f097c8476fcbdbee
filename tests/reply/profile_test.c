/* profile_test.c - shop profiles: a sample config, inheritance from the default, the built-in
 * default's system prompt against the model card's text, and rejected configs. */
#include "harness/harness.h"

#include <unistd.h>

#include "base/base.h"
#include "reply/reply.h"

static const char sample[] =
    "{\n"
    "  \"default\": {\"max_chars\": 200, \"banned_words\": [\"微信\"]},\n"
    "  \"shops\": {\n"
    "    \"tea-house\": {\"name\": \"Tea House\", \"persona\": \"语气温柔，称呼顾客为亲。\",\n"
    "                    \"lang\": \"zh\", \"min_chars\": 8, \"max_chars\": 120,\n"
    "                    \"refund_policy\": \"七天无理由退换。\",\n"
    "                    \"banned_words\": [\"谢谢\", \"Cheap\"],\n"
    "                    \"sensitive_words\": [\"中毒\"], \"signature\": \"—— 茶舍\",\n"
    "                    \"mode\": \"auto\", \"auto_min_rating\": 4,\n"
    "                    \"hold_needs_human\": false},\n"
    "    \"gadgets\": {\"lang\": \"en\", \"mode\": \"off\"}\n"
    "  }\n"
    "}\n";

/* The default system prompt as the model card states it (the indented line after "Default
 * system prompt"), read from the card itself. */
static char *card_system_prompt(void)
{
    char path[512];
    char *card = th_read_file(th_shared_path(path, sizeof(path), "models/MODEL_CARD.md"), NULL);
    char *p, *e, *out;
    assert_non_null(card);
    p = strstr(card, "Default system prompt");
    assert_non_null(p);
    p = strstr(p, "\n\n");
    assert_non_null(p);
    p += 2;
    while (*p == ' ')
        p++;
    e = strchr(p, '\n');
    assert_non_null(e);
    out = strndup(p, (size_t)(e - p));
    free(card);
    return out;
}

static struct reply_profiles *parse_ok(const char *json)
{
    struct reply_profiles *ps = NULL;
    struct ar_err err = {0};
    enum ar_status st = reply_profiles_parse(json, strlen(json), &ps, &err);
    if (st != AR_OK)
        fail_msg("parse failed: %s", err.msg);
    return ps;
}

static void sample_config_sets_every_field(void **state)
{
    struct reply_profiles *ps = parse_ok(sample);
    const struct reply_profile *p = reply_profiles_get(ps, "tea-house");
    (void)state;
    assert_int_equal(reply_profiles_count(ps), 2);
    assert_string_equal(p->shop_id, "tea-house");
    assert_string_equal(p->name, "Tea House");
    assert_int_equal(p->lang_policy, REPLY_LANG_ZH);
    assert_int_equal(p->min_chars, 8);
    assert_int_equal(p->max_chars, 120);
    assert_int_equal(p->n_banned, 2);
    assert_string_equal(p->banned[0], "谢谢");
    assert_string_equal(p->banned[1], "Cheap");
    assert_int_equal(p->n_sensitive, 1);
    assert_string_equal(p->sensitive[0], "中毒");
    assert_string_equal(p->signature, "—— 茶舍");
    assert_int_equal(p->mode, REPLY_MODE_AUTO);
    assert_int_equal(p->auto_min_rating, 4);
    assert_false(p->hold_needs_human);
    reply_profiles_destroy(ps);
}

static void shops_inherit_the_file_default(void **state)
{
    struct reply_profiles *ps = parse_ok(sample);
    const struct reply_profile *g = reply_profiles_get(ps, "gadgets");
    (void)state;
    assert_string_equal(g->shop_id, "gadgets");
    assert_int_equal(g->lang_policy, REPLY_LANG_EN);
    assert_int_equal(g->mode, REPLY_MODE_OFF);
    assert_int_equal(g->max_chars, 200); /* from "default" */
    assert_int_equal(g->n_banned, 1);
    assert_string_equal(g->banned[0], "微信");
    assert_true(g->n_sensitive > 0); /* built-in list kept */
    reply_profiles_destroy(ps);
}

static void unknown_shop_gets_the_default_profile(void **state)
{
    struct reply_profiles *ps = parse_ok(sample);
    const struct reply_profile *d = reply_profiles_get(ps, "nobody");
    (void)state;
    assert_string_equal(d->shop_id, "");
    assert_int_equal(d->max_chars, 200);
    assert_ptr_equal(d, reply_profiles_get(ps, NULL));
    reply_profiles_destroy(ps);
}

static void builtin_default_uses_the_model_card_prompt_verbatim(void **state)
{
    struct reply_profiles *ps = NULL;
    const struct reply_profile *d;
    char *want = card_system_prompt();
    (void)state;
    assert_int_equal(reply_profiles_default(&ps), AR_OK);
    d = reply_profiles_get(ps, "any-shop");
    assert_string_equal(d->system, want);
    assert_int_equal(d->lang_policy, REPLY_LANG_SAME);
    assert_int_equal(d->mode, REPLY_MODE_SUGGEST);
    assert_true(d->min_chars <= d->max_chars);
    /* the examples of sensitive words */
    {
        const char *must[] = {"假货", "诈骗", "过敏"};
        for (size_t i = 0; i < 3; i++) {
            bool found = false;
            for (int k = 0; k < d->n_sensitive; k++)
                found |= strcmp(d->sensitive[k], must[i]) == 0;
            assert_true(found);
        }
    }
    reply_profiles_destroy(ps);
    free(want);
}

static void persona_and_policy_are_appended_only_when_set(void **state)
{
    struct reply_profiles *ps = parse_ok(sample);
    char *base = card_system_prompt();
    char want[1024];
    (void)state;
    snprintf(want, sizeof(want), "%s\n%s\n%s", base, "语气温柔，称呼顾客为亲。", "七天无理由退换。");
    assert_string_equal(reply_profiles_get(ps, "tea-house")->system, want);
    assert_string_equal(reply_profiles_get(ps, "gadgets")->system, base);
    reply_profiles_destroy(ps);
    free(base);
}

static void system_prompt_member_replaces_the_base(void **state)
{
    struct reply_profiles *ps =
        parse_ok("{\"shops\": {\"s\": {\"system_prompt\": \"You are a shop.\", "
                 "\"persona\": \"Be brief.\"}}}");
    (void)state;
    assert_string_equal(reply_profiles_get(ps, "s")->system, "You are a shop.\nBe brief.");
    reply_profiles_destroy(ps);
}

static void expect_bad(const char *json, const char *needle)
{
    struct reply_profiles *ps = NULL;
    struct ar_err err = {0};
    enum ar_status st = reply_profiles_parse(json, strlen(json), &ps, &err);
    if (st == AR_OK)
        fail_msg("accepted: %s", json);
    assert_int_equal(st, AR_EFORMAT);
    assert_null(ps);
    if (!strstr(err.msg, needle))
        fail_msg("error \"%s\" does not name \"%s\"", err.msg, needle);
}

static void bad_configs_are_rejected_with_the_member_named(void **state)
{
    (void)state;
    expect_bad("{\"shops\": ", "JSON");
    expect_bad("[1, 2]", "object");
    expect_bad("{\"shop\": {}}", "shop");
    expect_bad("{\"shops\": {\"a\": {\"tone\": \"x\"}}}", "tone");
    expect_bad("{\"shops\": {\"a\": {\"lang\": \"fr\"}}}", "lang");
    expect_bad("{\"shops\": {\"a\": {\"mode\": \"always\"}}}", "mode");
    expect_bad("{\"shops\": {\"a\": {\"max_chars\": \"100\"}}}", "max_chars");
    expect_bad("{\"shops\": {\"a\": {\"max_chars\": 0}}}", "max_chars");
    expect_bad("{\"shops\": {\"a\": {\"min_chars\": 50, \"max_chars\": 10}}}", "min_chars");
    expect_bad("{\"shops\": {\"a\": {\"auto_min_rating\": 6}}}", "auto_min_rating");
    expect_bad("{\"shops\": {\"a\": {\"banned_words\": [\"ok\", 3]}}}", "banned_words");
    expect_bad("{\"shops\": {\"a\": {\"banned_words\": [\"\"]}}}", "banned_words");
    expect_bad("{\"shops\": {\"a\": {\"hold_needs_human\": 1}}}", "hold_needs_human");
    expect_bad("{\"shops\": {\"\": {}}}", "shop id");
    expect_bad("{\"default\": {\"persona\": 5}}", "persona");
    expect_bad("{\"shops\": {\"a\": {\"candidates\": 0}}}", "candidates");
    expect_bad("{\"shops\": {\"a\": {\"candidates\": 9}}}", "candidates");
    expect_bad("{\"shops\": {\"a\": {\"candidates\": 2.5}}}", "candidates");
    expect_bad("{\"shops\": {\"a\": {\"aspect_notes\": \"yes\"}}}", "aspect_notes");
}

static void candidates_and_notes_are_set_per_shop(void **state)
{
    static const char json[] = "{\"default\": {\"candidates\": 4},"
                               " \"shops\": {\"a\": {\"candidates\": 1, \"aspect_notes\": false}}}";
    struct reply_profiles *ps = parse_ok(json);
    (void)state;
    assert_int_equal(reply_profiles_get(ps, "a")->candidates, 1);
    assert_false(reply_profiles_get(ps, "a")->aspect_notes);
    assert_int_equal(reply_profiles_get(ps, "b")->candidates, 4); /* the file's default */
    assert_true(reply_profiles_get(ps, "b")->aspect_notes);       /* the built-in default */
    reply_profiles_destroy(ps);
}

static void missing_file_is_an_io_error(void **state)
{
    struct reply_profiles *ps = NULL;
    struct ar_err err = {0};
    (void)state;
    assert_int_equal(reply_profiles_load("/nonexistent/shops.json", &ps, &err), AR_EIO);
    assert_null(ps);
}

static void load_reads_a_file(void **state)
{
    char path[] = "/tmp/ar_profiles_XXXXXX";
    int fd = mkstemp(path);
    struct reply_profiles *ps = NULL;
    FILE *f;
    (void)state;
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    fputs(sample, f);
    fclose(f);
    assert_int_equal(reply_profiles_load(path, &ps, NULL), AR_OK);
    assert_int_equal(reply_profiles_count(ps), 2);
    reply_profiles_destroy(ps);
    unlink(path);
}

static void parse_survives_every_allocation_failure(void **state)
{
    (void)state;
    for (uint64_t n = 1; n < 400; n++) {
        struct reply_profiles *ps = NULL;
        enum ar_status st;
        ar_alloc_fail_after(n);
        st = reply_profiles_parse(sample, strlen(sample), &ps, NULL);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            reply_profiles_destroy(ps);
            return;
        }
        assert_int_equal(st, AR_ENOMEM);
        assert_null(ps);
    }
    fail_msg("parse never succeeded");
}

/* A shop's profile from one object (the PUT /v1/shops body) equals the config file's profile of
 * the same members; shown as JSON it reads back to the same profile (what the console edits and
 * saves again); a member named wrongly is refused by name. */
static void one_profile_from_json_matches_the_file_and_round_trips(void **state)
{
    struct reply_profiles *ps = NULL;
    struct reply_profile *p = NULL, *q = NULL;
    const struct reply_profile *file;
    struct ar_err err = {0};
    cJSON *root = cJSON_Parse(sample), *tea, *shown, *again, *en = cJSON_Parse("{\"lang\":\"en\"}");
    (void)state;
    assert_int_equal(reply_profiles_parse(sample, strlen(sample), &ps, &err), AR_OK);
    file = reply_profiles_get(ps, "tea-house");
    tea = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "shops"), "tea-house");
    assert_non_null(tea);
    assert_int_equal(reply_profile_from_json(ps, "tea-house", tea, &p, &err), AR_OK);
    assert_string_equal(p->shop_id, "tea-house");
    assert_string_equal(p->system, file->system);
    assert_int_equal(p->mode, file->mode);
    assert_int_equal(p->min_chars, file->min_chars);
    assert_int_equal(p->n_banned, file->n_banned);
    assert_string_equal(p->banned[1], "Cheap");
    assert_string_equal(p->signature, file->signature);
    assert_false(p->hold_needs_human);
    /* shown, then read back: the same JSON (shop_id included, as PUT accepts it) */
    shown = reply_profile_to_json(p);
    assert_non_null(shown);
    assert_string_equal(cJSON_GetObjectItem(shown, "shop_id")->valuestring, "tea-house");
    assert_int_equal(reply_profile_from_json(ps, "tea-house", shown, &q, &err), AR_OK);
    again = reply_profile_to_json(q);
    assert_true(cJSON_Compare(shown, again, true));
    assert_string_equal(q->system, p->system);
    /* the candidates' settings travel too (the console shows and saves them) */
    assert_int_equal(cJSON_GetObjectItem(shown, "candidates")->valueint, p->candidates);
    cJSON_ReplaceItemInObject(shown, "candidates", cJSON_CreateNumber(5));
    cJSON_ReplaceItemInObject(shown, "aspect_notes", cJSON_CreateBool(!p->aspect_notes));
    reply_profile_destroy(q);
    q = NULL;
    assert_int_equal(reply_profile_from_json(ps, "tea-house", shown, &q, &err), AR_OK);
    assert_int_equal(q->candidates, 5);
    assert_int_equal(q->aspect_notes, !p->aspect_notes);
    /* the default's max_chars (200, from the file) where the object says nothing */
    reply_profile_destroy(q);
    q = NULL;
    assert_int_equal(reply_profile_from_json(ps, "new", en, &q, &err), AR_OK);
    assert_int_equal(q->max_chars, 200);
    assert_int_equal(q->lang_policy, REPLY_LANG_EN);
    reply_profile_destroy(q);
    q = NULL;
    /* refused by name: another shop's id, a bad mode */
    assert_int_not_equal(reply_profile_from_json(ps, "x", shown, &q, &err), AR_OK);
    assert_non_null(strstr(err.msg, "shop_id"));
    assert_null(q);
    cJSON_Delete(again);
    cJSON_Delete(shown);
    cJSON_Delete(en);
    cJSON_Delete(root);
    reply_profile_destroy(p);
    reply_profiles_destroy(ps);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sample_config_sets_every_field),
        cmocka_unit_test(shops_inherit_the_file_default),
        cmocka_unit_test(unknown_shop_gets_the_default_profile),
        cmocka_unit_test(builtin_default_uses_the_model_card_prompt_verbatim),
        cmocka_unit_test(persona_and_policy_are_appended_only_when_set),
        cmocka_unit_test(system_prompt_member_replaces_the_base),
        cmocka_unit_test(bad_configs_are_rejected_with_the_member_named),
        cmocka_unit_test(candidates_and_notes_are_set_per_shop),
        cmocka_unit_test(missing_file_is_an_io_error),
        cmocka_unit_test(load_reads_a_file),
        cmocka_unit_test(parse_survives_every_allocation_failure),
        cmocka_unit_test(one_profile_from_json_matches_the_file_and_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
