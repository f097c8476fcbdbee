/* sentiment_test.c - the lexicon classifier against human labels that do not derive from a
 * rating: the raw labelled sets in shared/data/raw (waimai_10k.csv, yelp_labelled.txt,
 * amazon_cells_labelled.txt: text and a human 0/1 label, no rating), classified with the rating
 * withheld; the text-only accuracy on reviews-eval.jsonl (whose ratings were made from the labels,
 * so only the text is measured there); reviews written by hand whose text contradicts their
 * rating, held to what the combination rule promises; negation and contrast cases. */
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

/* Reviews whose text contradicts their rating, labelled by hand from the combination rule in
 * reply/sentiment.c (score = 0.6 x rating part + 0.4 x text part, |text part| < 1, labels at
 * +-0.15): at 1 and 5 stars the rating decides whatever the words; at 2 and 4 stars a clearly
 * contrary text pulls the label to neutral (it cannot flip it); at 3 stars (the rating says
 * nothing) and with the rating withheld (0) the text alone decides. Each text is strongly
 * worded on purpose, so a classifier that ignored the text, ignored the rating or weighed them
 * the other way round would fail some row. */
static const struct contra {
    const char *text, *lang;
    int rating;
    enum reply_sentiment want;
    const char *why;
} contradictions[] = {
    {"太好了，非常满意，强烈推荐，好吃", "zh", 1, REPLY_SENT_NEGATIVE, "1 star decides"},
    {"Excellent, great, I love it, highly recommended", "en", 1, REPLY_SENT_NEGATIVE,
     "1 star decides"},
    {"太差了，难吃，再也不买了，很失望", "zh", 5, REPLY_SENT_POSITIVE, "5 stars decide"},
    {"Terrible, awful, broke after a day, very disappointed", "en", 5, REPLY_SENT_POSITIVE,
     "5 stars decide"},
    {"太好了，非常满意，强烈推荐，好吃", "zh", 2, REPLY_SENT_NEUTRAL,
     "praise lifts 2 stars to neutral"},
    {"Excellent, great, I love it, highly recommended", "en", 2, REPLY_SENT_NEUTRAL,
     "praise lifts 2 stars to neutral"},
    {"太差了，难吃，再也不买了，很失望", "zh", 4, REPLY_SENT_NEUTRAL,
     "complaints pull 4 stars to neutral"},
    {"Terrible, awful, broke after a day, very disappointed", "en", 4, REPLY_SENT_NEUTRAL,
     "complaints pull 4 stars to neutral"},
    {"太好了，非常满意，强烈推荐，好吃", "zh", 3, REPLY_SENT_POSITIVE, "3 stars: the text decides"},
    {"Terrible, awful, broke after a day, very disappointed", "en", 3, REPLY_SENT_NEGATIVE,
     "3 stars: the text decides"},
    {"太差了，难吃，再也不买了，很失望", "zh", 0, REPLY_SENT_NEGATIVE,
     "no rating: the text decides"},
    {"Excellent, great, I love it, highly recommended", "en", 0, REPLY_SENT_POSITIVE,
     "no rating: the text decides"},
};

static void text_contradicting_the_rating_gets_the_rule_s_label(void **state)
{
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(contradictions); i++) {
        const struct contra *c = &contradictions[i];
        float s;
        enum reply_sentiment got =
            reply_sentiment_classify(c->text, strlen(c->text), c->lang, c->rating, &s);
        if (got != c->want)
            fail_msg("\"%s\" with %d stars: %s (score %.3f), want %s (%s)", c->text, c->rating,
                     reply_sentiment_str(got), (double)s, reply_sentiment_str(c->want), c->why);
    }
}

struct tally {
    int n, ok, neutral, positive, pos_ok;
};

/* Classifies one human-labelled text with the rating withheld. */
static void tally_one(struct tally *t, const char *text, const char *lang, bool positive)
{
    enum reply_sentiment got = reply_sentiment_classify(text, strlen(text), lang, 0, NULL);
    enum reply_sentiment want = positive ? REPLY_SENT_POSITIVE : REPLY_SENT_NEGATIVE;
    t->n++;
    t->ok += got == want; /* a "no cue" (neutral) answer counts as wrong */
    t->neutral += got == REPLY_SENT_NEUTRAL;
    t->positive += positive;
    t->pos_ok += positive && got == want;
}

/* The mean of the two classes' recalls: what always answering one label scores 50 % on. */
static double balanced(const struct tally *t)
{
    int neg = t->n - t->positive;
    return 0.5 * ((double)t->pos_ok / t->positive + (double)(t->ok - t->pos_ok) / neg);
}

/* waimai_10k.csv: "label,review" (1 positive, 0 negative), the review maybe in quotes. */
static void tally_waimai(struct tally *t, char *data)
{
    char *save = NULL, *line = strtok_r(data, "\r\n", &save); /* the header */
    while ((line = strtok_r(NULL, "\r\n", &save))) {
        char *text = line + 2;
        size_t n;
        if ((line[0] != '0' && line[0] != '1') || line[1] != ',')
            fail_msg("waimai_10k.csv: unexpected line \"%s\"", line);
        n = strlen(text);
        if (n >= 2 && text[0] == '"' && text[n - 1] == '"') {
            text[n - 1] = '\0';
            text++;
        }
        tally_one(t, text, "zh", line[0] == '1');
    }
}

/* The UCI sentence files: "sentence<TAB>label". The amazon copy also holds 25 Vietnamese
 * questions labelled 2 (not part of the UCI set, no sentiment): lines not labelled 0 or 1 are
 * left out. */
static void tally_uci(struct tally *t, char *data, const char *name)
{
    char *save = NULL;
    for (char *line = strtok_r(data, "\r\n", &save); line; line = strtok_r(NULL, "\r\n", &save)) {
        char *tab = strrchr(line, '\t');
        if (!tab)
            fail_msg("%s: unexpected line \"%s\"", name, line);
        if ((tab[1] != '0' && tab[1] != '1') || tab[2])
            continue;
        *tab = '\0';
        tally_one(t, line, "en", tab[1] == '1');
    }
}

/* The larger of the two classes: what always answering the majority label would score. */
static double majority_rate(const struct tally *t)
{
    int maj = t->positive > t->n - t->positive ? t->positive : t->n - t->positive;
    return (double)maj / t->n;
}

static char *read_raw(const char *name)
{
    char rel[128], path[512];
    char *data;
    snprintf(rel, sizeof(rel), "data/raw/%s", name);
    data = th_read_file(th_shared_path(path, sizeof(path), rel), NULL);
    if (!data)
        th_skip_missing(path);
    return data;
}

/* The floors: each language must beat always answering its majority label by 5 points (the
 * waimai set is 2:1 negative, so 67 % is free there), and its balanced accuracy (the mean of
 * the two classes' recalls, 50 % for any one-label answer) must be well above chance. Neutral
 * answers count as wrong; short English sentences often carry no cue word. Measured when
 * written: zh 73.1 % (balanced 73.9 %), en 65.3 % (balanced 65.3 %); the floors leave a few points
 * for lexicon changes, not for a classifier that stopped reading the text. */
static void rating_withheld_accuracy_on_independent_labels(void **state)
{
    struct tally zh = {0}, en = {0};
    char *waimai, *yelp, *amazon;
    (void)state;
    waimai = read_raw("waimai_10k.csv");
    yelp = read_raw("yelp_labelled.txt");
    amazon = read_raw("amazon_cells_labelled.txt");
    tally_waimai(&zh, waimai);
    tally_uci(&en, yelp, "yelp_labelled.txt");
    tally_uci(&en, amazon, "amazon_cells_labelled.txt");
    free(waimai);
    free(yelp);
    free(amazon);
    print_message("rating withheld, human labels: zh %.1f%% of %d (majority %.1f%%, balanced "
                  "%.1f%%, no cue %.1f%%), en %.1f%% of %d (majority %.1f%%, balanced %.1f%%, "
                  "no cue %.1f%%)\n",
                  100.0 * zh.ok / zh.n, zh.n, 100.0 * majority_rate(&zh), 100.0 * balanced(&zh),
                  100.0 * zh.neutral / zh.n, 100.0 * en.ok / en.n, en.n, 100.0 * majority_rate(&en),
                  100.0 * balanced(&en), 100.0 * en.neutral / en.n);
    assert_true(zh.n > 10000);
    assert_true(en.n > 1900);
    assert_true((double)zh.ok / zh.n >= majority_rate(&zh) + 0.05);
    assert_true((double)en.ok / en.n >= majority_rate(&en) + 0.05);
    assert_true(balanced(&zh) >= 0.65);
    assert_true(balanced(&en) >= 0.60);
    assert_true(zh.ok >= 0.70 * zh.n);
    assert_true(en.ok >= 0.60 * en.n);
}

/* reviews-eval.jsonl: its ratings were made from its labels, so only the text is measured. */
static void eval_set_text_only_accuracy_is_above_the_floor(void **state)
{
    char path[512];
    char *data = th_read_file(th_shared_path(path, sizeof(path), "data/reviews-eval.jsonl"), NULL);
    struct tally all = {0}, by_lang[2] = {{0}, {0}};
    char *line, *save = NULL;
    (void)state;
    if (!data)
        th_skip_missing(path);
    for (line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const char *text, *label, *lang;
        bool positive;
        assert_non_null(j);
        text = cJSON_GetObjectItem(j, "text")->valuestring;
        label = cJSON_GetObjectItem(j, "label")->valuestring;
        lang = cJSON_GetObjectItem(j, "lang")->valuestring;
        positive = strcmp(label, "positive") == 0;
        tally_one(&all, text, lang, positive);
        tally_one(&by_lang[strcmp(lang, "zh") == 0 ? 0 : 1], text, lang, positive);
        cJSON_Delete(j);
    }
    free(data);
    print_message("text only on %d eval reviews: %.1f%% (zh %.1f%% of %d, en %.1f%% of %d, "
                  "no cue %.1f%%)\n",
                  all.n, 100.0 * all.ok / all.n, 100.0 * by_lang[0].ok / by_lang[0].n, by_lang[0].n,
                  100.0 * by_lang[1].ok / by_lang[1].n, by_lang[1].n, 100.0 * all.neutral / all.n);
    assert_true(all.n > 2000);
    assert_true(all.ok >= 0.75 * all.n);
    assert_true(by_lang[1].ok >= 0.55 * by_lang[1].n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(negation_and_contrast_turn_the_polarity),
        cmocka_unit_test(rating_dominates_the_combined_label),
        cmocka_unit_test(text_contradicting_the_rating_gets_the_rule_s_label),
        cmocka_unit_test(rating_withheld_accuracy_on_independent_labels),
        cmocka_unit_test(eval_set_text_only_accuracy_is_above_the_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
