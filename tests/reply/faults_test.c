/* faults_test.c - the reply service and its jobs under allocation failures (cJSON's included):
 * the n-th allocation fails for n = 1.. until the call succeeds untouched
 * (tests/harness/faults.h). Each failed run must end in a clean error (a status with a
 * message, or an error code and text in the reply result), leave nothing half done (no job
 * without all its lines), and leak nothing (LeakSanitizer in the ASan build). The service runs
 * with a scripted generator and an in-memory SQLite store, its periodic work (job sweeps,
 * claim renewals) pushed out of the test's time so that only the thread under test
 * allocates while a failure is armed. */
#include "harness/faults.h"
#include "harness/harness.h"
#include "harness/reply_fakes.h"

#include "reply/reply.h"
#include "reply/reply_internal.h"
#include "store/store.h"

static enum ar_status fake_generate(struct reply_generator *g, const struct reply_gen_request *r,
                                    char **text, size_t *len)
{
    char buf[160];
    (void)g;
    if (strncmp(r->user, "评分", strlen("评分")) == 0)
        snprintf(buf, sizeof(buf), "感谢您的评价，编号%u已记录，欢迎再来！", th_fnv32(r->user));
    else
        snprintf(buf, sizeof(buf), "Thank you for your review, note %u. See you soon!",
                 th_fnv32(r->user));
    *text = ar_strdup(buf);
    *len = strlen(buf);
    return *text ? AR_OK : AR_ENOMEM;
}

static int setup(void **state)
{
    struct th_reply_fx *x = calloc(1, sizeof(*x));
    if (!x || th_reply_fx_open(x, fake_generate, false) != 0)
        return -1;
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    th_reply_fx_close(*state);
    free(*state);
    return 0;
}

/* ---- one review ------------------------------------------------------------------------------ */

/* A new review each attempt (its own id and text, so no store or cache hit hides the path). A
 * failure is an error code with a message and no reply; a success (a fallback included) has a
 * reply. */
static enum ar_status answer_one(void *user, uint64_t n, uint64_t *made)
{
    struct th_reply_fx *x = user;
    char id[32], text[96];
    struct reply_review rv = {0};
    struct reply_result res;
    enum ar_status st;
    snprintf(id, sizeof(id), "r-%llu", (unsigned long long)n);
    snprintf(text, sizeof(text), "第%llu次点的，很好吃，送得也快", (unsigned long long)n);
    rv.shop_id = "shop-1";
    rv.review_id = id;
    rv.text = text;
    rv.text_len = strlen(text);
    rv.rating = 5;
    ar_alloc_fail_after(n);
    reply_service_answer(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, &res);
    *made = ar_alloc_fail_after(0);
    if (res.err != REPLY_OK) {
        if (res.error[0] == '\0')
            fail_msg("allocation %llu failed: reply error %d without a message",
                     (unsigned long long)n, (int)res.err);
        assert_null(res.reply);
        st = AR_ENOMEM;
    } else {
        assert_non_null(res.reply);
        st = AR_OK;
    }
    reply_result_fini(&res);
    return st;
}

static void answering_a_review_fails_cleanly_at_every_allocation(void **state)
{
    th_fail_each_alloc("reply_service_answer", answer_one, *state, 100000);
}

/* The answer as the JSON the server sends: NULL (out of memory) or the whole object. */
static enum ar_status result_json(void *user, uint64_t n, uint64_t *made)
{
    struct reply_result res = {0};
    cJSON *j;
    (void)user;
    res.err = REPLY_OK;
    res.reply = ar_strdup("感谢您的好评！");
    assert_non_null(res.reply);
    snprintf(res.lang, sizeof(res.lang), "zh");
    snprintf(res.model, sizeof(res.model), "fake");
    ar_alloc_fail_after(n);
    j = reply_result_to_json(&res, "r-1");
    *made = ar_alloc_fail_after(0);
    reply_result_fini(&res);
    if (!j)
        return AR_ENOMEM;
    assert_non_null(cJSON_GetObjectItem(j, "reply"));
    assert_non_null(cJSON_GetObjectItem(j, "review_id"));
    cJSON_Delete(j);
    return AR_OK;
}

static void result_json_is_whole_or_null(void **state)
{
    (void)state;
    th_fail_each_alloc("reply_result_to_json", result_json, NULL, 10000);
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static const char job_body[] =
    "{\"review_id\":\"a\",\"text\":\"很好吃\",\"rating\":5}\n"
    "\n"
    "{\"review_id\":\"b\",\"text\":\"送得太慢了\",\"rating\":2}\n"
    "{\"id\":\"c\",\"text\":\"Great, thanks\",\"rating\":4,\"lang\":\"en\"}\n";

/* Submits a 3-line job for owner "faults"; afterwards (unarmed) the owner has one job more
 * exactly when the submit succeeded, and that job has its 3 lines. */
static enum ar_status submit_job(void *user, uint64_t n, uint64_t *made)
{
    struct th_reply_fx *x = user;
    struct reply_job_opts o = {0};
    struct reply_job_outcome out;
    struct ar_err err = {0};
    int64_t before, after, bytes;
    enum ar_status st;
    o.default_shop = "shop-1";
    o.owner = "faults";
    assert_int_equal(store_job_usage(x->store, "faults", &before, &bytes, NULL), AR_OK);
    ar_alloc_fail_after(n);
    st = reply_job_submit(x->svc, &o, job_body, strlen(job_body), NULL, &out, &err);
    *made = ar_alloc_fail_after(0);
    assert_int_equal(store_job_usage(x->store, "faults", &after, &bytes, NULL), AR_OK);
    if (st != AR_OK) {
        if (st != AR_ENOMEM && err.msg[0] == '\0')
            fail_msg("reply_job_submit with allocation %llu failed: %s without a message",
                     (unsigned long long)n, ar_status_str(st));
        if (after != before)
            fail_msg("reply_job_submit failed at allocation %llu (%s), yet a job was stored",
                     (unsigned long long)n, err.msg);
        return st;
    }
    assert_int_equal(after, before + 1);
    assert_int_equal(out.n_lines, 3);
    assert_int_equal(out.n_invalid, 0);
    {
        struct store_job_info info;
        bool found = false;
        assert_int_equal(store_job_get(x->store, out.id, &info, &found, NULL), AR_OK);
        assert_true(found);
        assert_int_equal(info.n_total, 3);
    }
    return AR_OK;
}

static void submitting_a_job_is_all_or_nothing_at_every_allocation(void **state)
{
    th_fail_each_alloc("reply_job_submit", submit_job, *state, 100000);
}

/* The JSONL split alone (the fuzz target's entry), strict and lenient. */
static enum ar_status split_lines(void *user, uint64_t n, uint64_t *made)
{
    struct ar_err err = {0};
    int64_t lines = -1, bad = -1, lines2 = -1, bad2 = -1;
    enum ar_status st, st2;
    (void)user;
    ar_alloc_fail_after(n);
    st = reply_job_lines_check(job_body, strlen(job_body), "shop-1", true, &lines, &bad, &err);
    st2 = st == AR_OK
              ? reply_job_lines_check(job_body, strlen(job_body), NULL, false, &lines2, &bad2, &err)
              : st;
    *made = ar_alloc_fail_after(0);
    if (st2 != AR_OK) {
        assert_int_equal(st2, AR_ENOMEM);
        assert_true(err.msg[0] != '\0');
        return st2;
    }
    assert_int_equal(lines, 3);
    assert_int_equal(bad, 0);
    assert_int_equal(lines2, 3);
    return AR_OK;
}

static void splitting_a_job_body_fails_cleanly(void **state)
{
    (void)state;
    th_fail_each_alloc("reply_job_lines_check", split_lines, NULL, 10000);
}

/* A job of 3 new reviews (its own shop each attempt), created unarmed, run armed. A failed run
 * is a clean error that loses no line: run again unarmed, the job finishes with every line
 * done or failed. */
static enum ar_status run_job(void *user, uint64_t n, uint64_t *made)
{
    struct th_reply_fx *x = user;
    char shop[32], job[STORE_JOB_ID_LEN + 1];
    struct store_job_info info;
    struct ar_err err = {0};
    int64_t n_lines = 0;
    bool found = false;
    enum ar_status st;
    snprintf(shop, sizeof(shop), "shop-%llu", (unsigned long long)n);
    assert_int_equal(
        reply_job_create(x->svc, shop, job_body, strlen(job_body), job, &n_lines, NULL), AR_OK);
    assert_int_equal(n_lines, 3);
    ar_alloc_fail_after(n);
    st = reply_job_run(x->svc, job, NULL, NULL, &err);
    *made = ar_alloc_fail_after(0);
    if (st != AR_OK) {
        if (st != AR_ENOMEM && err.msg[0] == '\0')
            fail_msg("reply_job_run with allocation %llu failed: %s without a message",
                     (unsigned long long)n, ar_status_str(st));
        assert_int_equal(reply_job_run(x->svc, job, NULL, NULL, NULL), AR_OK);
    }
    assert_int_equal(store_job_get(x->store, job, &info, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(info.n_done + info.n_failed, 3);
    if (st == AR_OK && *made < n)
        assert_int_equal(info.n_done, 3);
    return st;
}

static void running_a_job_loses_no_line_at_any_allocation(void **state)
{
    th_fail_each_alloc("reply_job_run", run_job, *state, 100000);
}

/* ---- profiles (their JSON now allocates through ar_malloc) ------------------------------------
 */

static enum ar_status parse_profiles(void *user, uint64_t n, uint64_t *made)
{
    static const char json[] =
        "{\"default\":{\"name\":\"店\",\"banned_words\":[\"差评\"]},"
        "\"shops\":{\"s1\":{\"lang\":\"en\",\"signature\":\"- Ann\"},\"s2\":{\"mode\":\"auto\"}}}";
    struct reply_profiles *ps = NULL;
    struct ar_err err = {0};
    enum ar_status st;
    (void)user;
    ar_alloc_fail_after(n);
    st = reply_profiles_parse(json, strlen(json), &ps, &err);
    *made = ar_alloc_fail_after(0);
    if (st != AR_OK) {
        assert_null(ps);
        /* out of memory is said as such, never as bad text (ar_json_oom_take) */
        if (st != AR_ENOMEM)
            fail_msg("reply_profiles_parse with allocation %llu failed: %s (%s), not out of "
                     "memory",
                     (unsigned long long)n, ar_status_str(st), err.msg);
        return st;
    }
    assert_int_equal(reply_profiles_count(ps), 2);
    reply_profiles_destroy(ps);
    return AR_OK;
}

static void parsing_profiles_fails_cleanly_with_cjson_counted(void **state)
{
    (void)state;
    th_fail_each_alloc("reply_profiles_parse", parse_profiles, NULL, 10000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(result_json_is_whole_or_null),
        cmocka_unit_test(splitting_a_job_body_fails_cleanly),
        cmocka_unit_test(parsing_profiles_fails_cleanly_with_cjson_counted),
        cmocka_unit_test_setup_teardown(answering_a_review_fails_cleanly_at_every_allocation, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(submitting_a_job_is_all_or_nothing_at_every_allocation,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(running_a_job_loses_no_line_at_any_allocation, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
