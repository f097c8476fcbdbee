/* sentiment_test.c - the lexicon classifier against the labels of the held-out reviews
 * (shared/data/reviews-eval.jsonl: real texts with human positive/negative labels), plus
 * negation and contrast cases written by hand. */
#include "harness/harness.h"

#include "base/base.h"
#include "reply/reply.h"

static enum reply_sentiment text_only(const char *s)
{
    float v = reply_sentiment_lexicon(s, strlen(s), NULL);
    return v > 0 ? REPLY_SENT_POSITIVE : v < 0 ? REPLY_SENT_NEGATIVE : REPLY_SENT_NEUTRAL;
}

static void negation_and_contrast_turn_the_polarity(void **state)
{
    (void)state;
    assert_int_equal(text_only("很好吃"), REPLY_SENT_POSITIVE);
    assert_int_equal(text_only("不好吃"), REPLY_SENT_NEGATIVE);
    assert_int_equal(text_only("不太好"), REPLY_SENT_NEGATIVE);
    assert_int_equal(text_only("用了一个月，没问题"), REPLY_SENT_POSITIVE);
    assert_int_equal(text_only("包装不错，但是味道太差了，再也不买了"), REPLY_SENT_NEGATIVE);
    assert_int_equal(text_only("Great sound, works well"), REPLY_SENT_POSITIVE);
    assert_int_equal(text_only("This is not good"), REPLY_SENT_NEGATIVE);
    assert_int_equal(text_only("Terrible, it broke after a day"), REPLY_SENT_NEGATIVE);
    assert_int_equal(text_only("I bought it on Monday"), REPLY_SENT_NEUTRAL);
}

static void rating_dominates_the_combined_label(void **state)
{
    float s;
    const char *praise = "太好了，非常满意，强烈推荐";
    (void)state;
    /* one star is negative whatever the words; five stars with a complaint is not negative */
    assert_int_equal(reply_sentiment_classify(praise, strlen(praise), "zh", 1, &s),
                     REPLY_SENT_NEGATIVE);
    assert_true(s >= -1.0f && s <= 1.0f);
    assert_int_not_equal(reply_sentiment_classify("有点慢", strlen("有点慢"), "zh", 5, NULL),
                         REPLY_SENT_NEGATIVE);
    assert_int_equal(reply_sentiment_classify("还行", strlen("还行"), "zh", 3, NULL),
                     REPLY_SENT_NEUTRAL);
}

struct tally {
    int n, text_ok, combined_ok, neutral;
};

static void eval_set_accuracy_is_above_the_floor(void **state)
{
    char path[512];
    char *data = th_read_file(th_shared_path(path, sizeof(path), "data/reviews-eval.jsonl"), NULL);
    struct tally all = {0}, by_lang[2] = {{0}, {0}};
    char *line, *save = NULL;
    (void)state;
    assert_non_null(data);
    for (line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const char *text, *label, *lang;
        int rating;
        enum reply_sentiment want, t, c;
        struct tally *tl;
        assert_non_null(j);
        text = cJSON_GetObjectItem(j, "text")->valuestring;
        label = cJSON_GetObjectItem(j, "label")->valuestring;
        lang = cJSON_GetObjectItem(j, "lang")->valuestring;
        rating = cJSON_GetObjectItem(j, "rating")->valueint;
        want = strcmp(label, "positive") == 0 ? REPLY_SENT_POSITIVE : REPLY_SENT_NEGATIVE;
        t = text_only(text);
        c = reply_sentiment_classify(text, strlen(text), lang, rating, NULL);
        tl = &by_lang[strcmp(lang, "zh") == 0 ? 0 : 1];
        for (struct tally *x = &all; x; x = x == &all ? tl : NULL) {
            x->n++;
            x->text_ok += t == want;
            x->combined_ok += c == want;
            x->neutral += t == REPLY_SENT_NEUTRAL;
        }
        /* a low rating is never read as positive */
        if (rating <= 2)
            assert_int_not_equal(c, REPLY_SENT_POSITIVE);
        cJSON_Delete(j);
    }
    free(data);
    printf("sentiment on %d eval reviews: text only %.1f%% (zh %.1f%% of %d, en %.1f%% of %d, "
           "no cue %.1f%%), with rating %.1f%%\n",
           all.n, 100.0 * all.text_ok / all.n, 100.0 * by_lang[0].text_ok / by_lang[0].n,
           by_lang[0].n, 100.0 * by_lang[1].text_ok / by_lang[1].n, by_lang[1].n,
           100.0 * all.neutral / all.n, 100.0 * all.combined_ok / all.n);
    assert_true(all.n > 2000);
    /* a "no cue" answer counts as wrong here */
    assert_true(all.text_ok >= 0.75 * all.n);
    assert_true(by_lang[1].text_ok >= 0.55 * by_lang[1].n);
    assert_true(all.combined_ok >= 0.95 * all.n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(negation_and_contrast_turn_the_polarity),
        cmocka_unit_test(rating_dominates_the_combined_label),
        cmocka_unit_test(eval_set_accuracy_is_above_the_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
