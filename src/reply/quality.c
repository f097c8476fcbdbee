/* quality.c - what a review talks about and whether a reply answers it: the aspects a review
 * raises (delivery, packaging, quality, size ...) and the ones a reply names, from phrase tables
 * per aspect and language; repeated clauses and n-grams; the score that picks one of several
 * generated candidates; and the short aspect notes that complete a reply missing an aspect.
 * Pure functions over UTF-8 bytes, used by the pipeline (pipeline.c). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "reply_internal.h"

/* ---- the tables ----------------------------------------------------------------------------
 * One row per aspect. review_*: phrases by which a customer raises the aspect (chosen from the
 * kinds of reviews in shared/data: takeaway food and parcels of goods); reply_*: phrases by
 * which a reply names it. The reply lists leave out the remedies every apology carries
 * ("联系客服", "refund", "补发"): a reply naming them has not answered a point. English phrases
 * match at the start of a word, ASCII case-insensitively; Chinese ones anywhere. The note is
 * the name used in an aspect note (reply_aspect_note). Lists end with NULL. */

#define PHRASES_MAX 40

struct aspect_row {
    const char *name;
    const char *review_zh[PHRASES_MAX], *review_en[PHRASES_MAX];
    const char *reply_zh[PHRASES_MAX], *reply_en[PHRASES_MAX];
    const char *note_zh, *note_en;
};

static const struct aspect_row aspects[REPLY_ASPECT_COUNT] = {
    [REPLY_ASPECT_DELIVERY] =
        {"delivery",
         {"物流", "快递", "送餐", "配送", "送货", "发货", "送达", "送到", "送的", "送得", "送来",
          "小哥", "骑士", "外卖员", "送餐员", "到货", "速度", "超时", "准时", "及时", "太慢",
          "很慢", "好慢", "等了", "小时才", "很快", "挺快", "超快", "真快", "神速", NULL},
         {"deliver", "shipping", "shipped", "arrived", "arrival", "courier", "on time", "late",
          "slow", "took forever", "waited", "wait time", NULL},
         {"配送", "送达", "送餐", "物流", "快递", "速度", "送到", "久等", "发货", NULL},
         {"deliver", "shipping", "shipment", "arriv", "wait", "courier", NULL},
         "配送",
         "delivery"},
    [REPLY_ASPECT_PACKAGING] =
        {"packaging",
         {"包装", "盒子", "餐盒", "纸箱", "箱子", "包裹", "洒了", "撒了", "洒出", "漏汤", "压坏",
          "破损", "封口", "打包", NULL},
         {"packag", "box", "wrapped", "wrapping", "container", "spill", NULL},
         {"包装", "打包", "餐盒", "封口", NULL},
         {"packag", "box", NULL},
         "包装",
         "packaging"},
    [REPLY_ASPECT_QUALITY] =
        {"quality",
         {"质量", "品质", "做工", "材质", "质感", "效果", "好用", "难用", "坏了", "故障", "死机",
          "屏幕", "电池", "音质", "清晰", "手感", "耐用", "毛病", "掉色", "褪色", "起球", "用了",
          "发热", "卡顿", NULL},
         {"quality", "broke", "defect", "battery", "sound", "screen", "durable", "flimsy",
          "reception", "works", "worked", "stopped working", "junk", "cheaply", "volume", NULL},
         {"质量", "品质", "做工", "产品问题", "故障", "换新", NULL},
         {"quality", "defect", "did not work", "didn't work", "not work", "work as expected",
          "faulty", NULL},
         "商品质量",
         "product quality"},
    [REPLY_ASPECT_SIZE] =
        {"size",
         {"尺码", "尺寸", "大小", "偏大", "偏小", "合身", "码数", "太大", "太小", "号码", "长短",
          "码子", "大一码", "小一码", NULL},
         {"size", "fit", "too small", "too big", "tight", "loose", NULL},
         {"尺码", "尺寸", "换码", "大小", "合身", NULL},
         {"size", "fit", NULL},
         "尺码",
         "size"},
    [REPLY_ASPECT_TASTE] =
        {"taste",
         {"味道", "好吃", "难吃", "口味", "口感", "太咸", "很咸", "咸了", "太淡", "辣", "太甜",
          "油腻", "好喝", "难喝", "香", "入味", "没味", NULL},
         {"taste", "tasty", "delicious", "flavor", "flavour", "bland", "salty", "spicy", "food",
          "dish", "meal", "sauce", NULL},
         {"味道", "口味", "口感", "菜品", "后厨", "厨师", "好吃", NULL},
         {"taste", "flavor", "flavour", "food", "dish", "kitchen", "chef", "meal", NULL},
         "口味",
         "taste"},
    [REPLY_ASPECT_PRICE] =
        {"price",
         {"价格", "价钱", "贵", "便宜", "性价比", "实惠", "划算", "降价", "差价", "值得", "不值",
          "块钱", "元", "优惠", NULL},
         {"price", "expensive", "cheap", "value", "money", "worth", "overpriced", "cost", NULL},
         {"价格", "性价比", "差价", "实惠", "价钱", "物有所值", NULL},
         {"price", "value", "money", "cost", NULL},
         "价格",
         "price"},
    [REPLY_ASPECT_SERVICE] =
        {"service",
         {"服务", "态度", "客服", "售后", "老板", "店家", "热情", "商家回复", NULL},
         {"service", "staff", "waiter", "waitress", "server", "friendly", "rude", "manager",
          "support", "customer care", NULL},
         /* not "为您服务" nor "customer service": closings and remedies every reply has */
         {"服务态度", "态度", "服务质量", "服务不", "服务周到", "服务让", "服务水平", "我们服务",
          "服务的", NULL},
         {"the service", "our service", "service you", "service was", "staff", "attitude",
          NULL},
         "服务态度",
         "service"},
    [REPLY_ASPECT_FRESHNESS] =
        {"freshness",
         {"新鲜", "变质", "烂了", "过期", "保质期", "馊", "发霉", "生产日期", "坏的", NULL},
         {"fresh", "stale", "spoiled", "rotten", "expired", NULL},
         {"新鲜", "变质", "保质", NULL},
         {"fresh", "stale", "expir", NULL},
         "新鲜度",
         "freshness"},
    /* beyond the eight of the issue: what shared/data/reviews-sample.jsonl shows often */
    [REPLY_ASPECT_PORTION] =
        {"portion",
         {"分量", "份量", "量少", "量大", "量足", "饭量", "吃不饱", "不够吃", NULL},
         {"portion", NULL},
         {"分量", "份量", NULL},
         {"portion", NULL},
         "分量",
         "portion size"},
    [REPLY_ASPECT_HYGIENE] =
        {"hygiene",
         {"头发", "卫生", "异物", "虫子", "苍蝇", "不干净", "脏", NULL},
         {"dirty", "hair in", "a hair", "bug", "filthy", "hygien", "unsanitary", NULL},
         {"卫生", "异物", "头发", NULL},
         {"hygien", "clean", NULL},
         "卫生",
         "hygiene"},
    [REPLY_ASPECT_AUTHENTIC] =
        {"authenticity",
         {"正品", "假货", "真货", "盗版", "山寨", "假的", NULL},
         {"fake", "counterfeit", "genuine", "knock-off", "knockoff", NULL},
         {"正品", "真伪", "假货", NULL},
         {"genuine", "authentic", "counterfeit", NULL},
         "正品保障",
         "authenticity"},
    [REPLY_ASPECT_ORDER] =
        {"order accuracy",
         {"漏送", "送错", "少送", "没送", "发错", "少了一", "缺少", "没有送", "漏发", "少发",
          "与描述不符", "不一样", NULL},
         {"wrong item", "wrong order", "missing", "not as described", NULL},
         {"漏送", "送错", "漏发", "发错", "少送", "与描述", NULL},
         {"wrong item", "missing", "wrong order", "as described", NULL},
         "订单内容",
         "order"},
};

const char *reply_aspect_str(enum reply_aspect a)
{
    return (unsigned)a < REPLY_ASPECT_COUNT ? aspects[a].name : "unknown";
}

/* ---- phrase matching ---------------------------------------------------------------------- */

static bool is_ascii_letter(unsigned char c)
{
    return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}

/* Whether text holds phrase: ASCII phrases case-insensitively at the start of a word (so
 * "fit" is not found in "benefit"), others as bytes anywhere. */
static bool has_phrase(const char *text, size_t len, const char *phrase)
{
    size_t m = strlen(phrase);
    bool ascii = is_ascii_letter((unsigned char)phrase[0]);
    if (!m || m > len)
        return false;
    for (size_t i = 0; i + m <= len; i++) {
        if (ascii) {
            if (i > 0 && is_ascii_letter((unsigned char)text[i - 1]))
                continue;
            if (!strncasecmp(text + i, phrase, m))
                return true;
        } else if (!memcmp(text + i, phrase, m)) {
            return true;
        }
    }
    return false;
}

static bool has_any(const char *text, size_t len, const char *const *list)
{
    for (int k = 0; k < PHRASES_MAX && list[k]; k++)
        if (has_phrase(text, len, list[k]))
            return true;
    return false;
}

/* Both languages' lists are tried: a Chinese review may name "iPhone" parts in English and
 * the cost of a false English match in Chinese text is small (English phrases need a word
 * start). */
unsigned reply_aspects_of_review(const char *text, size_t len)
{
    unsigned m = 0;
    for (int a = 0; a < REPLY_ASPECT_COUNT; a++)
        if (has_any(text, len, aspects[a].review_zh) || has_any(text, len, aspects[a].review_en))
            m |= 1u << a;
    return m;
}

unsigned reply_aspects_of_reply(const char *text, size_t len)
{
    unsigned m = 0;
    for (int a = 0; a < REPLY_ASPECT_COUNT; a++)
        if (has_any(text, len, aspects[a].reply_zh) || has_any(text, len, aspects[a].reply_en))
            m |= 1u << a;
    return m;
}

/* ---- repeated clauses and n-grams --------------------------------------------------------- */

#define CLAUSES_MAX 64
#define CPS_MAX 1024

static bool is_clause_end(uint32_t c)
{
    return c == 0xff0c || c == 0x3002 || c == 0xff01 || c == 0xff1f || c == 0xff1b ||
           c == 0x3001 || c == ',' || c == '.' || c == '!' || c == '?' || c == ';' || c == '~' ||
           c == 0xff5e || c == 0x2026 || c == '\n' || c == 0xff1a || c == ':';
}

/* The text as code points split into clauses: clause k is cps[start[k] .. start[k+1]),
 * without its end marks; ASCII letters lowered and spaces kept (English words). */
struct clauses {
    uint32_t cps[CPS_MAX];
    int start[CLAUSES_MAX + 1];
    int n;
};

static void split_clauses(const char *text, size_t len, struct clauses *c)
{
    size_t i = 0;
    int n_cp = 0;
    bool open = false;
    c->n = 0;
    while (i < len && n_cp < CPS_MAX) {
        uint32_t cp;
        size_t k = ar_utf8_decode(text + i, len - i, &cp);
        if (!k) {
            i++;
            continue;
        }
        i += k;
        if (is_clause_end(cp)) {
            open = false;
            continue;
        }
        if (!open && (cp == ' ' || cp == '\t'))
            continue; /* spaces that open a clause */
        if (!open) {
            if (c->n == CLAUSES_MAX)
                break;
            c->start[c->n++] = n_cp;
            open = true;
        }
        c->cps[n_cp++] = cp < 128 ? (uint32_t)tolower((int)cp) : cp;
    }
    c->start[c->n] = n_cp;
}

static int clause_len(const struct clauses *c, int k)
{
    int e = c->start[k + 1];
    while (e > c->start[k] && c->cps[e - 1] == ' ')
        e--; /* trailing spaces */
    return e - c->start[k];
}

static bool same_cps(const uint32_t *a, const uint32_t *b, int n)
{
    return !memcmp(a, b, (size_t)n * sizeof(uint32_t));
}

/* Whether the n CJK code points at cps[0..n) occur, all CJK, in clause k. */
static bool clause_has_cjk_gram(const struct clauses *c, int k, const uint32_t *g, int n)
{
    int s = c->start[k], e = s + clause_len(c, k);
    for (int i = s; i + n <= e; i++)
        if (same_cps(c->cps + i, g, n))
            return true;
    return false;
}

/* English words of clause k: word w is cps[ws[w] .. we[w]). */
static int clause_words(const struct clauses *c, int k, int *ws, int *we, int max)
{
    int s = c->start[k], e = s + clause_len(c, k), n = 0;
    for (int i = s; i < e && n < max;) {
        while (i < e && !(c->cps[i] < 128 && isalnum((int)c->cps[i]) ) && c->cps[i] != '\'')
            i++;
        if (i >= e)
            break;
        ws[n] = i;
        while (i < e && ((c->cps[i] < 128 && isalnum((int)c->cps[i])) || c->cps[i] == '\''))
            i++;
        we[n++] = i;
    }
    return n;
}

#define WORDS_MAX 96

static bool words_equal(const struct clauses *c, const int *ws1, const int *we1, const int *ws2,
                        const int *we2, int n)
{
    for (int t = 0; t < n; t++) {
        int l1 = we1[t] - ws1[t], l2 = we2[t] - ws2[t];
        if (l1 != l2 || !same_cps(c->cps + ws1[t], c->cps + ws2[t], l1))
            return false;
    }
    return true;
}

/* A 3-word run of clause a that clause b holds too. */
static bool clauses_share_trigram(const struct clauses *c, int a, int b)
{
    int wsa[WORDS_MAX], wea[WORDS_MAX], wsb[WORDS_MAX], web[WORDS_MAX];
    int na = clause_words(c, a, wsa, wea, WORDS_MAX), nb = clause_words(c, b, wsb, web, WORDS_MAX);
    for (int i = 0; i + 3 <= na; i++)
        for (int j = 0; j + 3 <= nb; j++)
            if (words_equal(c, wsa + i, wea + i, wsb + j, web + j, 3))
                return true;
    return false;
}

/* A run of 4 CJK code points of clause a that clause b holds too. */
static bool clauses_share_cjk_gram(const struct clauses *c, int a, int b)
{
    int s = c->start[a], e = s + clause_len(c, a);
    for (int i = s; i + 4 <= e; i++) {
        bool all_cjk = true;
        for (int t = 0; t < 4; t++)
            all_cjk = all_cjk && reply_is_cjk(c->cps[i + t]);
        if (all_cjk && clause_has_cjk_gram(c, b, c->cps + i, 4))
            return true;
    }
    return false;
}

enum reply_repeat reply_find_repeat(const char *text, size_t len)
{
    static _Thread_local struct clauses c; /* 4 KiB: kept off small worker stacks */
    split_clauses(text, len, &c);
    /* a clause said twice first: it can be cut (reply_drop_repeated_clauses), a shared
     * phrase elsewhere in the same reply must not hide it */
    for (int a = 0; a < c.n; a++) {
        int la = clause_len(&c, a);
        for (int b = a + 1; b < c.n; b++)
            if (la >= 2 && la == clause_len(&c, b) &&
                same_cps(c.cps + c.start[a], c.cps + c.start[b], la))
                return REPLY_REPEAT_CLAUSE;
    }
    for (int a = 0; a < c.n; a++)
        for (int b = a + 1; b < c.n; b++)
            if (clauses_share_cjk_gram(&c, a, b) || clauses_share_trigram(&c, a, b))
                return REPLY_REPEAT_NGRAM;
    return REPLY_REPEAT_NONE;
}

const char *reply_repeat_str(enum reply_repeat r)
{
    return r == REPLY_REPEAT_CLAUSE ? "clause" : r == REPLY_REPEAT_NGRAM ? "ngram" : "none";
}

/* ---- tone --------------------------------------------------------------------------------- */

static const char *const apology_cues[] = {"抱歉", "对不起", "致歉", "不好意思", "sorry",
                                           "apolog", NULL};
static const char *const thanks_cues[] = {"谢谢", "感谢", "多谢", "thank", "appreciate", NULL};

static bool has_cue(const char *text, size_t len, const char *const *cues)
{
    for (int k = 0; cues[k]; k++)
        if (has_phrase(text, len, cues[k]))
            return true;
    return false;
}

/* ---- the score ---------------------------------------------------------------------------- */

static int popcount(unsigned m)
{
    int n = 0;
    for (; m; m &= m - 1)
        n++;
    return n;
}

float reply_candidate_score(const struct reply_profile *p, const char *lang, int rating,
                            unsigned review_aspects, const char *text, size_t len,
                            struct reply_score *out)
{
    struct reply_score s;
    size_t chars = reply_utf8_count(text, len);
    bool apology = has_cue(text, len, apology_cues), thanks = has_cue(text, len, thanks_cues);
    memset(&s, 0, sizeof(s));
    s.named = reply_aspects_of_reply(text, len);
    s.wanted = popcount(review_aspects);
    s.covered = popcount(s.named & review_aspects);
    s.extra = popcount(s.named & ~review_aspects);
    s.lang_ok = reply_lang_ok(text, len, lang);
    s.repeat = reply_find_repeat(text, len);
    s.banned = p && reply_find_word(text, len, p->banned, p->n_banned) >= 0;
    s.length_ok = chars > 0 && (!p || ((int)chars >= p->min_chars &&
                                       (p->max_chars <= 0 || (int)chars <= p->max_chars)));
    /* tone: an apology for a low rating, thanks without an apology for a high one */
    if (rating >= 1 && rating <= 2)
        s.tone_ok = apology;
    else if (rating >= 4)
        s.tone_ok = thanks && !apology;
    else
        s.tone_ok = true;
    /* The weights: a hard failure (wrong language, banned word, length, repetition) loses to
     * any candidate without one; among the rest each aspect answered is worth more than tone,
     * and an aspect the review never raised (a taste phrase for trousers) costs a little. */
    s.total = 0.0f;
    if (!s.lang_ok)
        s.total -= 1000.0f;
    if (s.banned)
        s.total -= 1000.0f;
    if (!s.length_ok)
        s.total -= 1000.0f;
    if (s.repeat != REPLY_REPEAT_NONE)
        s.total -= 100.0f;
    s.total += 10.0f * (float)s.covered;
    s.total -= 2.0f * (float)s.extra;
    s.total += s.tone_ok ? 3.0f : 0.0f;
    if (out)
        *out = s;
    return s.total;
}

/* ---- aspect notes ------------------------------------------------------------------------- */

/* The names of the aspects of m, at most max of them, joined as a list ("配送、包装和口味",
 * "delivery, packaging and taste"); the number used. */
static int aspect_list(struct ar_buf *b, unsigned m, int max, bool zh)
{
    int idx[REPLY_ASPECT_COUNT], n = 0;
    for (int a = 0; a < REPLY_ASPECT_COUNT && n < max; a++)
        if (m & (1u << a))
            idx[n++] = a;
    for (int k = 0; k < n; k++) {
        if (k > 0)
            ar_buf_puts(b, k == n - 1 ? (zh ? "和" : " and ") : (zh ? "、" : ", "));
        ar_buf_puts(b, zh ? aspects[idx[k]].note_zh : aspects[idx[k]].note_en);
    }
    return n;
}

/* One sentence naming the aspects of m (at most max), worded by the rating: low ratings promise
 * to look into them, others say they were noted; two wordings (variant 0, 1), so that a note
 * can avoid echoing the reply's own phrases. Neither blames nor promises a remedy the shop
 * may not give. */
static void note_sentence(struct ar_buf *b, unsigned m, int max, const char *lang, int rating,
                          int variant)
{
    static const char *const zh_forms[3][2][2] = {
        /* [low, high, middle][variant]: before and after the list */
        {{"", "方面的问题已经记下，会尽快跟进处理。"}, {"您反映的", "问题，店里会逐一核实改进。"}},
        {{"关于", "，您说的我们都记下了。"}, {"您对", "的评价，店里都看到了。"}},
        {{"关于", "，您的意见已经记下。"}, {"您对", "的看法，店里都看到了。"}},
    };
    static const char *const en_forms[2][2][2] = {
        {{"We will look into the ", " problems you raised."},
         {"Your points on the ", " have been passed to the team."}},
        {{"We have noted your comments on the ", "."},
         {"Your words on the ", " have been passed to the team."}},
    };
    bool zh = lang && !strcmp(lang, "zh");
    int tone = rating <= 2 ? 0 : rating >= 4 ? 1 : 2;
    const char *const *form = zh ? zh_forms[tone][variant] : en_forms[tone == 0 ? 0 : 1][variant];
    ar_buf_puts(b, form[0]);
    aspect_list(b, m, max, zh);
    ar_buf_puts(b, form[1]);
}

static bool ends_sentence(uint32_t cp)
{
    return cp == 0x3002 || cp == 0xff01 || cp == 0xff1f || cp == '!' || cp == '?' || cp == '.' ||
           cp == '~' || cp == 0xff5e;
}

static size_t last_sentence_start(const char *text, size_t len)
{
    size_t i = 0, start = 0;
    bool after_end = false;
    while (i < len) {
        uint32_t cp;
        size_t k = ar_utf8_decode(text + i, len - i, &cp);
        if (!k) {
            i++;
            continue;
        }
        if (ends_sentence(cp))
            after_end = true;
        else if (cp != ' ' && after_end) {
            start = i; /* the first character after a run of sentence ends and spaces */
            after_end = false;
        }
        i += k;
    }
    return start;
}

/* text with one note put before its last sentence (or at the end); *out new. */
static enum ar_status insert_note(const char *text, size_t len, const char *lang,
                                  const char *note, size_t note_len, char **out)
{
    struct ar_buf b = {0};
    size_t at = last_sentence_start(text, len);
    bool zh = lang && !strcmp(lang, "zh");
    if (!at)
        at = len;
    ar_buf_put(&b, text, at);
    if (!zh && at == len && len && text[len - 1] != ' ')
        ar_buf_puts(&b, " ");
    ar_buf_put(&b, note, note_len);
    if (!zh && at < len)
        ar_buf_puts(&b, " ");
    ar_buf_put(&b, text + at, len - at);
    *out = ar_buf_take(&b, NULL);
    return *out ? AR_OK : AR_ENOMEM;
}

enum ar_status reply_add_aspect_notes(const char *text, size_t len, const char *lang, int rating,
                                      unsigned missing, int max_notes, int max_chars, char **out)
{
    size_t chars = reply_utf8_count(text, len);
    *out = NULL;
    for (int variant = 0; variant < 2 && missing && max_notes > 0; variant++) {
        /* the most aspects, up to max_notes, whose note keeps the reply within max_chars */
        for (int k = max_notes; k >= 1; k--) {
            struct ar_buf note = {0};
            char *ns, *joined = NULL;
            size_t nl;
            enum ar_status st;
            note_sentence(&note, missing, k, lang, rating, variant);
            if (!(ns = ar_buf_take(&note, &nl)))
                return AR_ENOMEM;
            if (max_chars > 0 && chars + reply_utf8_count(ns, nl) + 1 > (size_t)max_chars) {
                ar_free(ns);
                continue;
            }
            st = insert_note(text, len, lang, ns, nl, &joined);
            ar_free(ns);
            if (st != AR_OK)
                return st;
            if (reply_find_repeat(joined, strlen(joined)) == REPLY_REPEAT_NONE) {
                *out = joined;
                return AR_OK;
            }
            ar_free(joined); /* the note echoes the reply: the other wording */
            break;
        }
    }
    *out = ar_strndup(text, len); /* no note fits, or every wording repeats the reply */
    return *out ? AR_OK : AR_ENOMEM;
}

/* ---- repair ------------------------------------------------------------------------------- */

#define SEGMENTS_MAX 64

/* One clause of a reply as bytes: text [a, b) (spaces trimmed), then its end marks [b, e). */
struct segment {
    size_t a, b, e;
    bool keep;
};

static int split_segments(const char *text, size_t len, struct segment *sg)
{
    size_t i = 0;
    int n = 0;
    while (i < len && n < SEGMENTS_MAX) {
        uint32_t cp = 0;
        size_t k;
        sg[n].a = i;
        /* the clause: up to an end mark */
        while (i < len) {
            k = ar_utf8_decode(text + i, len - i, &cp);
            if (!k)
                k = 1;
            else if (is_clause_end(cp))
                break;
            i += k;
        }
        sg[n].b = i;
        /* its end marks and the spaces after them */
        while (i < len) {
            k = ar_utf8_decode(text + i, len - i, &cp);
            if (!k || !(is_clause_end(cp) || cp == ' '))
                break;
            i += k;
        }
        sg[n].e = i;
        sg[n].keep = true;
        n++;
    }
    if (i < len && n > 0)
        sg[n - 1].e = len; /* more clauses than we split: the rest stays with the last */
    return n;
}

static bool same_clause(const char *text, const struct segment *x, const struct segment *y)
{
    size_t xa = x->a, xb = x->b, ya = y->a, yb = y->b;
    while (xa < xb && text[xa] == ' ')
        xa++;
    while (xb > xa && text[xb - 1] == ' ')
        xb--;
    while (ya < yb && text[ya] == ' ')
        ya++;
    while (yb > ya && text[yb - 1] == ' ')
        yb--;
    return xb - xa >= 2 && xb - xa == yb - ya && !strncasecmp(text + xa, text + ya, xb - xa);
}

enum ar_status reply_drop_repeated_clauses(const char *text, size_t len, char **out)
{
    struct segment sg[SEGMENTS_MAX];
    struct ar_buf b = {0};
    int n = split_segments(text, len, sg), last = -1;
    for (int j = 1; j < n; j++)
        for (int i = 0; i < j && sg[j].keep; i++)
            if (sg[i].keep && same_clause(text, &sg[i], &sg[j]))
                sg[j].keep = false;
    for (int i = 0; i < n; i++) {
        if (sg[i].keep) {
            ar_buf_put(&b, text + sg[i].a, sg[i].e - sg[i].a);
            last = i;
            continue;
        }
        /* a dropped clause's end mark replaces the kept one before it ("，" -> "。") */
        if (last >= 0 && b.s && b.n >= sg[last].e - sg[last].b &&
            sg[i].e > sg[i].b) {
            b.n -= sg[last].e - sg[last].b;
            ar_buf_put(&b, text + sg[i].b, sg[i].e - sg[i].b);
            sg[last].b = sg[i].b; /* its marks are now these */
            sg[last].e = sg[i].e;
        }
    }
    *out = ar_buf_take(&b, NULL);
    return *out ? AR_OK : AR_ENOMEM;
}
