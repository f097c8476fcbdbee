/* guard.c - text checks around the model: review sanitizing and the user turn (prompt side),
 * and the guardrails on generated replies (empty, repetition loops, language, banned words,
 * length bounds) with template fallbacks. Pure functions over UTF-8 bytes. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "reply_internal.h"

/* ---- UTF-8 and strings ------------------------------------------------------------------ */

bool reply_is_cjk(uint32_t cp)
{
    return (cp >= 0x3400 && cp <= 0x4dbf) || (cp >= 0x4e00 && cp <= 0x9fff) ||
           (cp >= 0xf900 && cp <= 0xfaff) || (cp >= 0x20000 && cp <= 0x2fa1f);
}

size_t reply_utf8_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

/* ---- the prompt side -------------------------------------------------------------------- */

/* Chat markup that must never reach a prompt from review text. "<|...|>" of up to 40 bytes
 * without spaces is matched generally (ChatML, Llama 3, Phi, GLM control tokens). */
static const char *const markup[] = {"<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>",
                                     "<unk>", "[gMASK]", "<sop>", "<eop>"};

static size_t markup_at(const char *s, size_t n)
{
    if (n >= 4 && s[0] == '<' && s[1] == '|') {
        for (size_t j = 2; j + 1 < n && j < 40; j++) {
            if (s[j] == ' ' || s[j] == '\n' || s[j] == '<')
                break;
            if (s[j] == '|' && s[j + 1] == '>')
                return j + 2;
        }
    }
    for (size_t k = 0; k < AR_ARRAY_LEN(markup); k++) {
        size_t m = strlen(markup[k]);
        if (m <= n && memcmp(s, markup[k], m) == 0)
            return m;
    }
    return 0;
}

enum ar_status reply_sanitize_review(const char *text, size_t len, char **out, size_t *out_len)
{
    struct ar_buf b = {0};
    size_t i = 0;
    bool again = true;
    char *cur;
    size_t cur_len;
    if (!text && len)
        return AR_EINVAL;
    /* removing markup can join two halves into new markup ("<|im_<|x|>start|>"): repeat */
    cur = ar_strndup(text ? text : "", len);
    if (!cur)
        return AR_ENOMEM;
    cur_len = len;
    while (again) {
        again = false;
        for (i = 0; i < cur_len;) {
            size_t m = markup_at(cur + i, cur_len - i);
            if (m) {
                again = true;
                i += m;
                continue;
            }
            if (cur[i] == '\n' || cur[i] == '\r' || cur[i] == '\t' || cur[i] == '\v' ||
                cur[i] == '\f')
                ar_buf_put(&b, " ", 1);
            else
                ar_buf_put(&b, cur + i, 1);
            i++;
        }
        ar_free(cur);
        cur = ar_buf_take(&b, &cur_len);
        if (!cur)
            return AR_ENOMEM;
    }
    /* trim ASCII spaces */
    {
        size_t a = 0, e = cur_len;
        while (a < e && cur[a] == ' ')
            a++;
        while (e > a && cur[e - 1] == ' ')
            e--;
        memmove(cur, cur + a, e - a);
        cur[e - a] = '\0';
        cur_len = e - a;
    }
    *out = cur;
    if (out_len)
        *out_len = cur_len;
    return AR_OK;
}

#define PROMPT_TEXT_MAX_CHARS 300

enum ar_status reply_user_message(const char *text, size_t len, int rating, const char *lang,
                                  char **out)
{
    char *clean;
    size_t clean_len;
    char head[64];
    struct ar_buf b = {0};
    enum ar_status st;
    if (rating < 1 || rating > 5)
        return AR_EINVAL;
    if ((st = reply_sanitize_review(text, len, &clean, &clean_len)) != AR_OK)
        return st;
    /* the demo model saw reviews of at most 160 characters: keep the prompt near that */
    if (reply_utf8_count(clean, clean_len) > PROMPT_TEXT_MAX_CHARS) {
        size_t i = 0, chars = 0;
        while (i < clean_len && chars < PROMPT_TEXT_MAX_CHARS) {
            i++;
            while (i < clean_len && ((unsigned char)clean[i] & 0xc0) == 0x80)
                i++;
            chars++;
        }
        clean_len = i;
    }
    if (lang && strcmp(lang, "zh") == 0)
        snprintf(head, sizeof(head), "评分：%d星\n评价：", rating);
    else
        snprintf(head, sizeof(head), "Rating: %d stars\nReview: ", rating);
    ar_buf_puts(&b, head);
    ar_buf_put(&b, clean, clean_len);
    ar_free(clean);
    *out = ar_buf_take(&b, NULL);
    return *out ? AR_OK : AR_ENOMEM;
}

/* ---- banned words -------------------------------------------------------------------------- */

static bool match_ci(const char *s, const char *w, size_t m)
{
    for (size_t i = 0; i < m; i++)
        if (tolower((unsigned char)s[i]) != tolower((unsigned char)w[i]))
            return false;
    return true;
}

/* Byte offset of the first occurrence of w in text (ASCII case-insensitive), or -1. */
static long find_ci(const char *text, size_t len, const char *w)
{
    size_t m = strlen(w);
    if (!m || m > len)
        return -1;
    for (size_t i = 0; i + m <= len; i++)
        if (match_ci(text + i, w, m))
            return (long)i;
    return -1;
}

int reply_find_word(const char *text, size_t len, char *const *words, int n_words)
{
    for (int k = 0; k < n_words; k++)
        if (find_ci(text, len, words[k]) >= 0)
            return k;
    return -1;
}

enum ar_status reply_strip_words(const char *text, size_t len, char *const *words, int n_words,
                                 char **out, size_t *out_len)
{
    char *cur = ar_strndup(text ? text : "", len);
    size_t n = len;
    bool again = true;
    if (!cur)
        return AR_ENOMEM;
    while (again) {
        again = false;
        for (int k = 0; k < n_words; k++) {
            size_t m = strlen(words[k]);
            long at;
            while ((at = find_ci(cur, n, words[k])) >= 0) {
                memmove(cur + at, cur + at + m, n - (size_t)at - m + 1);
                n -= m;
                again = true;
            }
        }
    }
    *out = cur;
    if (out_len)
        *out_len = n;
    return AR_OK;
}

/* ---- repetition ------------------------------------------------------------------------ */

#define REP_MAX_CPS 2048

static bool is_punct(uint32_t c)
{
    return (c < 0x80 && ispunct((int)c)) || (c >= 0x3000 && c <= 0x303f) ||
           (c >= 0xff00 && c <= 0xff0f) || c == 0x2026 || c == 0xff1f || c == 0xff01 ||
           c == 0xff0c || c == 0xff1b || c == 0xff1a;
}

static bool is_space(uint32_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x3000;
}

/* Decodes into cps (invalid bytes skipped); returns the count (at most cap). */
static size_t decode_all(const char *s, size_t len, uint32_t *cps, size_t cap)
{
    size_t i = 0, n = 0;
    while (i < len && n < cap) {
        uint32_t cp;
        size_t k = ar_utf8_decode(s + i, len - i, &cp);
        if (!k) {
            i++;
            continue;
        }
        cps[n++] = cp;
        i += k;
    }
    return n;
}

static bool loop_in_a_row(const uint32_t *c, size_t n)
{
    for (size_t unit = 1; unit <= 32 && unit * 3 <= n; unit++) {
        size_t need = unit == 1 ? 5 : 3;
        for (size_t i = 0; i + unit * need <= n; i++) {
            size_t reps = 1;
            bool letters = false;
            if (unit == 1 && (is_punct(c[i]) || is_space(c[i])))
                continue;
            for (size_t k = 0; k < unit; k++) /* digit runs are numbers, not loops */
                letters |= !is_punct(c[i + k]) && !is_space(c[i + k]) &&
                           !(c[i + k] >= '0' && c[i + k] <= '9');
            if (!letters)
                continue;
            while (i + unit * (reps + 1) <= n &&
                   memcmp(c + i, c + i + unit * reps, unit * sizeof(*c)) == 0)
                reps++;
            if (reps >= need)
                return true;
        }
    }
    return false;
}

/* Some n-gram of ngram code points (no spaces or punctuation inside) occurs 3+ times,
 * non-overlapping. */
static bool ngram_thrice(const uint32_t *c, size_t n, size_t ngram)
{
    for (size_t i = 0; i + ngram <= n; i++) {
        size_t count = 1, j;
        bool clean = true;
        for (size_t k = 0; k < ngram; k++)
            clean &= !is_punct(c[i + k]) && !is_space(c[i + k]);
        if (!clean)
            continue;
        for (j = i + ngram; j + ngram <= n;) {
            if (memcmp(c + i, c + j, ngram * sizeof(*c)) == 0) {
                if (++count >= 3)
                    return true;
                j += ngram;
            } else {
                j++;
            }
        }
    }
    return false;
}

/* English: some 3-word sequence (lower-cased ASCII words) occurs 3+ times. */
static bool word_trigram_thrice(const char *s, size_t len)
{
    size_t starts[256], ends[256], n = 0, i = 0;
    while (i < len && n < 256) {
        while (i < len && !isalnum((unsigned char)s[i]) && s[i] != '\'')
            i++;
        if (i >= len)
            break;
        starts[n] = i;
        while (i < len && (isalnum((unsigned char)s[i]) || s[i] == '\''))
            i++;
        ends[n++] = i;
    }
    for (size_t a = 0; a + 3 <= n; a++) {
        int count = 1;
        for (size_t b = a + 3; b + 3 <= n; b++) {
            bool same = true;
            for (size_t k = 0; k < 3 && same; k++) {
                size_t la = ends[a + k] - starts[a + k], lb = ends[b + k] - starts[b + k];
                same = la == lb && match_ci(s + starts[a + k], s + starts[b + k], la);
            }
            if (same) {
                if (++count >= 3)
                    return true;
                b += 2;
            }
        }
    }
    return false;
}

bool reply_is_repetitive(const char *text, size_t len)
{
    uint32_t cps[REP_MAX_CPS];
    size_t n = decode_all(text, len, cps, REP_MAX_CPS);
    bool cjk = false;
    if (loop_in_a_row(cps, n))
        return true;
    for (size_t i = 0; i < n; i++)
        cjk |= reply_is_cjk(cps[i]);
    return cjk ? ngram_thrice(cps, n, 6) : word_trigram_thrice(text, len);
}

/* ---- language, length --------------------------------------------------------------------- */

bool reply_lang_ok(const char *text, size_t len, const char *lang)
{
    size_t i = 0, n_cjk = 0, n_latin = 0;
    while (i < len) {
        uint32_t cp;
        size_t k = ar_utf8_decode(text + i, len - i, &cp);
        if (!k) {
            i++;
            continue;
        }
        if (reply_is_cjk(cp))
            n_cjk++;
        else if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            n_latin++;
        i += k;
    }
    if (lang && strcmp(lang, "zh") == 0)
        return n_cjk > 0 && n_latin * 2 <= n_cjk;
    return n_latin > 0 && n_cjk == 0;
}

static bool is_sentence_end(uint32_t c)
{
    return c == 0x3002 || c == 0xff01 || c == 0xff1f || c == '!' || c == '?' || c == '.' ||
           c == '~' || c == 0xff5e || c == 0x2026 || c == 0xff1b || c == ';';
}

static bool is_closer(uint32_t c)
{
    return c == '"' || c == '\'' || c == ')' || c == 0x201d || c == 0x2019 || c == 0xff09 ||
           c == 0x300d || c == 0x300f;
}

size_t reply_cut_sentence(const char *text, size_t len, int max_chars)
{
    size_t i = 0, best = 0;
    int chars = 0;
    while (i < len && chars < max_chars) {
        uint32_t cp;
        size_t k = ar_utf8_decode(text + i, len - i, &cp);
        if (!k)
            return best;
        i += k;
        chars++;
        if (is_sentence_end(cp)) {
            /* a run of enders and closers belongs to the sentence ("！！", "。」") */
            size_t j = i;
            int c2 = chars;
            while (j < len && c2 < max_chars) {
                uint32_t nx;
                size_t k2 = ar_utf8_decode(text + j, len - j, &nx);
                if (!k2 || !(is_sentence_end(nx) || is_closer(nx)))
                    break;
                j += k2;
                c2++;
            }
            /* an ASCII '.' inside a number or word ("3.5", "e.g") is no boundary */
            if (cp == '.' && i < len && text[i] != ' ' && j == i)
                continue;
            best = j;
        }
    }
    return best;
}

enum reply_guard reply_guard_check(const struct reply_profile *p, const char *lang,
                                   const char *text, size_t len, char **fixed)
{
    size_t a = 0, e = len, chars;
    if (fixed)
        *fixed = NULL;
    while (a < e && (text[a] == ' ' || text[a] == '\n' || text[a] == '\t' || text[a] == '\r'))
        a++;
    while (e > a && (text[e - 1] == ' ' || text[e - 1] == '\n' || text[e - 1] == '\t' ||
                     text[e - 1] == '\r'))
        e--;
    text += a;
    len = e - a;
    if (len == 0)
        return REPLY_GUARD_EMPTY;
    if (reply_is_repetitive(text, len))
        return REPLY_GUARD_REPEAT;
    if (!reply_lang_ok(text, len, lang))
        return REPLY_GUARD_LANG;
    if (reply_find_word(text, len, p->banned, p->n_banned) >= 0)
        return REPLY_GUARD_BANNED;
    chars = reply_utf8_count(text, len);
    if (p->max_chars > 0 && chars > (size_t)p->max_chars) {
        size_t cut = reply_cut_sentence(text, len, p->max_chars);
        if (!cut || reply_utf8_count(text, cut) < (size_t)p->min_chars)
            return REPLY_GUARD_LONG;
        len = cut;
        chars = reply_utf8_count(text, len);
    }
    if (chars < (size_t)p->min_chars)
        return REPLY_GUARD_SHORT;
    if (fixed) {
        *fixed = ar_strndup(text, len);
        if (!*fixed)
            return REPLY_GUARD_EMPTY; /* out of memory: treated as a failed attempt */
    }
    return REPLY_GUARD_OK;
}

const char *reply_guard_str(enum reply_guard g)
{
    static const char *const names[REPLY_GUARD_COUNT] = {"ok",     "empty", "repeat", "lang",
                                                         "banned", "short", "long"};
    return (unsigned)g < REPLY_GUARD_COUNT ? names[g] : "unknown";
}

const char *reply_fallback_text(const char *lang, bool negative)
{
    bool zh = lang && strcmp(lang, "zh") == 0;
    if (negative)
        return zh ? "非常抱歉给您带来不好的体验，我们会尽快联系您处理，请您留意消息。"
                  : "We are sorry for your experience. Our team will contact you shortly to "
                    "make it right.";
    return zh ? "感谢您的评价与支持，期待您再次光临！"
              : "Thank you for your review and support. We hope to see you again soon!";
}
