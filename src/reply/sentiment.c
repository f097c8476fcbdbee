/* sentiment.c - a small lexicon classifier for zh and en reviews, combined with the star
 * rating. zh: longest-match scan over weighted cue words, a negator just before a cue flips it
 * (a negated complaint counts half), the clause after the last contrast word (但是, 不过 ...)
 * weighs more. en: word scan, a negator within the three previous words flips a cue. */
#include <ctype.h>
#include <math.h>
#include <string.h>

#include "normalize.h"
#include "reply_internal.h"

struct cue {
    const char *w;
    float v; /* > 0 positive, < 0 negative */
};

static const struct cue zh_cues[] = {
    /* positive */
    {"好", 1}, {"不错", 2}, {"满意", 2}, {"喜欢", 2}, {"快", 1}, {"赞", 2}, {"棒", 2},
    {"好吃", 2}, {"推荐", 1}, {"值得", 2}, {"划算", 2}, {"实惠", 2}, {"新鲜", 1}, {"准时", 1},
    {"热情", 1}, {"好评", 3}, {"超值", 2}, {"完美", 2}, {"正品", 1}, {"舒服", 2}, {"舒适", 2},
    {"精致", 1}, {"漂亮", 2}, {"合适", 1}, {"好用", 2}, {"方便", 1}, {"给力", 2}, {"满分", 2},
    {"惊喜", 2}, {"物美价廉", 2}, {"性价比高", 2}, {"周到", 1}, {"贴心", 2}, {"及时", 1},
    {"挺好", 2}, {"还行", 1}, {"可以", 1}, {"美味", 2}, {"香", 1}, {"超快", 2}, {"谢谢", 1},
    {"感谢", 1}, {"辛苦", 1}, {"清晰", 1}, {"流畅", 1}, {"耐用", 1}, {"结实", 1}, {"大方", 1},
    {"喜爱", 2}, {"支持", 1}, {"信赖", 2}, {"放心", 1}, {"好看", 2}, {"很快", 2}, {"实用", 1},
    {"好喝", 2}, {"够味", 1}, {"入味", 1}, {"分量足", 2}, {"量足", 2}, {"量大", 1}, {"干净", 1},
    {"靠谱", 2}, {"悦耳", 2}, {"没问题", 2}, {"不差", 1}, {"不贵", 1}, {"相信", 1}, {"过关", 1},
    {"可口", 2}, {"快递快", 2}, {"物流快", 2}, {"很好", 2}, {"好好", 2},
    /* negative */
    {"差", -2}, {"慢", -2}, {"难吃", -3}, {"失望", -3}, {"垃圾", -3}, {"退货", -2}, {"退款", -2},
    {"坑", -2}, {"骗", -3}, {"假货", -3}, {"糟糕", -3}, {"恶心", -3}, {"少", -1}, {"贵", -1},
    {"凉", -1}, {"冷", -1}, {"咸", -1}, {"淡", -1}, {"不好", -2}, {"不行", -2}, {"太差", -3},
    {"一般", -1}, {"问题", -1}, {"坏", -2}, {"破", -1}, {"破损", -2}, {"投诉", -3}, {"烂", -2},
    {"后悔", -3}, {"不满意", -3}, {"无语", -2}, {"再也不", -3}, {"不会再", -3}, {"死机", -2},
    {"发热", -1}, {"卡", -1}, {"漏", -2}, {"错", -1}, {"油腻", -2}, {"硬", -1}, {"难喝", -3},
    {"没送", -2}, {"漏送", -2}, {"送错", -2}, {"不新鲜", -3}, {"变质", -3}, {"异味", -2},
    {"头发", -2}, {"毛发", -2}, {"虫", -2}, {"苍蝇", -3}, {"生的", -1}, {"没熟", -2},
    {"太慢", -3}, {"超时", -2}, {"晚了", -2}, {"迟", -1}, {"等了", -2}, {"小时", -1},
    {"郁闷", -2}, {"气死", -3}, {"差评", -3}, {"不值", -2}, {"不如", -1}, {"不怎么样", -2},
    {"严重", -2}, {"怀疑", -2}, {"不能", -1}, {"没有", -1}, {"无法", -1}, {"缺", -1},
    {"掉色", -2}, {"褪色", -2}, {"起球", -2}, {"质量差", -3}, {"态度差", -3}, {"粗糙", -2},
    {"难看", -2}, {"上当", -3}, {"忽悠", -3}, {"坑爹", -3}, {"难闻", -3}, {"过敏", -2},
    {"痒", -2}, {"脏", -2}, {"旧", -1}, {"二手", -2}, {"不符", -2}, {"偏大", -1}, {"偏小", -1},
    {"不合适", -2}, {"不热", -1}, {"冷了", -2}, {"凉了", -2}, {"坨", -2}, {"稀", -1},
    {"慢死", -3}, {"退", -1}, {"换货", -1}, {"可惜", -2}, {"遗憾", -2}, {"不够", -1},
    {"不太", -1}, {"脱线", -2}, {"瑕疵", -1}, {"不爽", -2}, {"劣质", -3}, {"恶劣", -3},
    {"抢钱", -2}, {"吐槽", -2}, {"发酸", -2}, {"不敢恭维", -3}, {"没想象", -2}, {"没想像", -2},
    {"太甜", -1}, {"有点", -0.5f}, {"麻烦", -1}, {"降价", -1}, {"保价", -1},
    /* neutral words that must win the longest match */
    {"不是", 0}, {"客服", 0}, {"辣", 0}, {"凑合", 0}};

static const char *const zh_negators[] = {"不", "没", "别", "无", "未"};
static const char *const zh_contrast[] = {"但是", "不过", "就是", "只是", "可是", "但"};

static const struct cue en_cues[] = {
    {"good", 2}, {"great", 3}, {"excellent", 3}, {"love", 3}, {"loved", 3}, {"amazing", 3},
    {"awesome", 3}, {"nice", 2}, {"best", 2}, {"perfect", 3}, {"happy", 2}, {"recommend", 2},
    {"fantastic", 3}, {"delicious", 3}, {"wonderful", 3}, {"fast", 1}, {"works", 1},
    {"comfortable", 2}, {"easy", 1}, {"pleased", 2}, {"satisfied", 2}, {"friendly", 2},
    {"fresh", 1}, {"beautiful", 2}, {"impressed", 2}, {"well", 1}, {"fine", 1}, {"clear", 1},
    {"cool", 1}, {"glad", 2}, {"enjoy", 2}, {"enjoyed", 2}, {"worth", 1}, {"quality", 1},
    {"solid", 1}, {"tasty", 2}, {"fun", 1}, {"incredible", 3}, {"favorite", 2},
    {"outstanding", 3}, {"reasonable", 1}, {"sturdy", 1},
    {"bad", -2}, {"terrible", -3}, {"worst", -3}, {"poor", -3}, {"awful", -3}, {"horrible", -3},
    {"disappointed", -3}, {"disappointing", -3}, {"waste", -3}, {"broke", -2}, {"broken", -2},
    {"return", -1}, {"returned", -2}, {"refund", -2}, {"slow", -2}, {"rude", -3}, {"cold", -1},
    {"never", -1}, {"problem", -1}, {"problems", -1}, {"junk", -3}, {"useless", -3},
    {"hate", -3}, {"garbage", -3}, {"cheap", -1}, {"fail", -2}, {"failed", -2}, {"fails", -2},
    {"unreliable", -2}, {"dead", -2}, {"died", -2}, {"sucks", -3}, {"crap", -3},
    {"mediocre", -2}, {"bland", -2}, {"overpriced", -2}, {"dirty", -2}, {"sick", -2},
    {"wrong", -2}, {"nasty", -3}, {"gross", -3}, {"annoying", -2}, {"difficult", -1},
    {"stopped", -2}, {"avoid", -3}, {"disgusting", -3}, {"lacking", -2}, {"flimsy", -2},
    {"unfortunately", -2}, {"doesn't", -1}, {"don't", -1}, {"didn't", -1}, {"won't", -1},
    {"not", -1}, {"no", -1}, {"uncomfortable", -2}, {"noise", -1}, {"static", -1}, {"hard", -1},
    {"weak", -2}, {"drop", -1}, {"dropped", -1}, {"issues", -1}, {"trouble", -2}, {"hours", -1},
    {"minutes", -1}, {"wait", -1}, {"waited", -2}, {"overcooked", -2}, {"undercooked", -2},
    {"dry", -1}, {"burnt", -2}, {"stale", -2}, {"lukewarm", -2}};

static const char *const en_negators[] = {"not",    "no",      "never",    "don't",   "doesn't",
                                          "didn't", "isn't",   "wasn't",   "aren't",  "won't",
                                          "can't",  "cannot",  "couldn't", "wouldn't", "nothing",
                                          "hardly"};

/* ---- zh ----------------------------------------------------------------------------------- */

/* The longest cue starting at s[0..n), or NULL. */
static const struct cue *zh_match(const char *s, size_t n)
{
    const struct cue *best = NULL;
    size_t best_len = 0;
    for (size_t k = 0; k < AR_ARRAY_LEN(zh_cues); k++) {
        size_t m = strlen(zh_cues[k].w);
        if (m > best_len && m <= n && memcmp(s, zh_cues[k].w, m) == 0) {
            best = &zh_cues[k];
            best_len = m;
        }
    }
    return best;
}

static bool zh_is_negator(const char *s, size_t n)
{
    for (size_t k = 0; k < AR_ARRAY_LEN(zh_negators); k++) {
        size_t m = strlen(zh_negators[k]);
        if (m == n && memcmp(s, zh_negators[k], m) == 0)
            return true;
    }
    return false;
}

/* Start offsets of the code points of s, so the scan can look one or two characters back. */
#define ZH_MAX_CPS 4096

static float zh_score(const char *s, size_t len)
{
    size_t offs[ZH_MAX_CPS + 1], n = 0, i = 0;
    float score = 0;
    while (i < len && n < ZH_MAX_CPS) {
        uint32_t cp;
        size_t k = ar_utf8_decode(s + i, len - i, &cp);
        offs[n++] = i;
        i += k ? k : 1;
    }
    offs[n] = i;
    len = i;
    for (size_t c = 0; c < n;) {
        const struct cue *cue = zh_match(s + offs[c], len - offs[c]);
        size_t m, used = 1;
        float v;
        bool neg1, neg2;
        if (!cue) {
            c++;
            continue;
        }
        m = strlen(cue->w);
        while (c + used < n && offs[c + used] < offs[c] + m)
            used++;
        v = cue->v;
        /* negator right before the cue, or two before ("不太好") */
        neg1 = c >= 1 && zh_is_negator(s + offs[c - 1], offs[c] - offs[c - 1]);
        neg2 = c >= 2 && zh_is_negator(s + offs[c - 2], offs[c - 1] - offs[c - 2]);
        if (v > 0 && (neg1 || neg2))
            v = -v;
        else if (v < 0 && neg1)
            v = -v * 0.5f;
        score += v;
        c += used;
    }
    return score;
}

static float zh_score_contrast(const char *s, size_t len)
{
    size_t best = 0;
    bool found = false;
    for (size_t k = 0; k < AR_ARRAY_LEN(zh_contrast); k++) {
        size_t m = strlen(zh_contrast[k]);
        for (size_t i = len >= m ? len - m + 1 : 0; i-- > 0;) {
            if (memcmp(s + i, zh_contrast[k], m) == 0) {
                if (i > 0 && (!found || i > best)) {
                    best = i;
                    found = true;
                }
                break;
            }
        }
    }
    if (!found)
        return zh_score(s, len);
    return 0.7f * zh_score(s, best) + 1.3f * zh_score(s + best, len - best);
}

/* ---- en ------------------------------------------------------------------------------------ */

#define EN_WORD_MAX 24

static float en_cue(const char *w)
{
    for (size_t k = 0; k < AR_ARRAY_LEN(en_cues); k++)
        if (!strcmp(w, en_cues[k].w))
            return en_cues[k].v;
    return 0;
}

static bool en_is_negator(const char *w)
{
    for (size_t k = 0; k < AR_ARRAY_LEN(en_negators); k++)
        if (!strcmp(w, en_negators[k]))
            return true;
    return false;
}

static float en_score(const char *s, size_t len)
{
    /* ring of the last three words: were they negators? */
    bool neg_ring[3] = {false, false, false};
    size_t i = 0, n_words = 0;
    float score = 0;
    while (i < len) {
        char w[EN_WORD_MAX + 1];
        size_t m = 0;
        float v;
        bool is_neg;
        while (i < len && !(isalpha((unsigned char)s[i]) || s[i] == '\''))
            i++;
        if (i >= len)
            break;
        while (i < len && (isalpha((unsigned char)s[i]) || s[i] == '\'')) {
            if (m < EN_WORD_MAX)
                w[m++] = (char)tolower((unsigned char)s[i]);
            i++;
        }
        w[m] = '\0';
        is_neg = en_is_negator(w);
        v = en_cue(w);
        if (v != 0 && !is_neg && (neg_ring[0] || neg_ring[1] || neg_ring[2]))
            v = -v;
        score += v;
        neg_ring[n_words % 3] = is_neg;
        n_words++;
    }
    return score;
}

/* ---- public ------------------------------------------------------------------------------ */

float reply_sentiment_lexicon(const char *text, size_t len, const char *lang)
{
    if (!text || !len)
        return 0;
    if (!lang)
        lang = reply_guess_lang(text, len);
    return strcmp(lang, "zh") == 0 ? zh_score_contrast(text, len) : en_score(text, len);
}

enum reply_sentiment reply_sentiment_classify(const char *text, size_t len, const char *lang,
                                              int rating, float *score)
{
    float t = tanhf(reply_sentiment_lexicon(text, len, lang) / 3.0f);
    float s = rating >= 1 && rating <= 5 ? 0.6f * ((float)rating - 3.0f) / 2.0f + 0.4f * t : t;
    if (score)
        *score = s;
    return reply_sentiment_label(s);
}

enum reply_sentiment reply_sentiment_label(float score)
{
    if (score > 0.15f)
        return REPLY_SENT_POSITIVE;
    if (score < -0.15f)
        return REPLY_SENT_NEGATIVE;
    return REPLY_SENT_NEUTRAL;
}

const char *reply_sentiment_str(enum reply_sentiment s)
{
    return s == REPLY_SENT_NEGATIVE ? "negative" : s == REPLY_SENT_POSITIVE ? "positive" : "neutral";
}
