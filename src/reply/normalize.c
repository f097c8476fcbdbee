/* normalize.c - review text normalization for reply-cache keys, a language guess and the
 * rating bucket. The rules are listed in normalize.h; each step below is one pass over an
 * array of code points. */
#include "normalize.h"

#include <stdbool.h>
#include <stdint.h>

#include "base/utf8.h"

/* ---- character classes -------------------------------------------------------------- */

static bool in(uint32_t cp, uint32_t lo, uint32_t hi)
{
    return cp >= lo && cp <= hi;
}

static bool is_space(uint32_t cp)
{
    return cp == ' ' || in(cp, 0x09, 0x0d) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           in(cp, 0x2000, 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

/* Invisible characters dropped outright (after is_space took the spacing controls). */
static bool is_ignorable(uint32_t cp)
{
    return cp < 0x20 || in(cp, 0x7f, 0x9f) || cp == 0xad || in(cp, 0x200b, 0x200d) ||
           cp == 0x2060 || cp == 0xfeff || in(cp, 0xfe00, 0xfe0f) || cp == 0x20e3 ||
           in(cp, 0x1f3fb, 0x1f3ff) || in(cp, 0xe0000, 0xe007f) || in(cp, 0xe0100, 0xe01ef);
}

static bool is_ideograph(uint32_t cp)
{
    return in(cp, 0x4e00, 0x9fff) || in(cp, 0x3400, 0x4dbf) || in(cp, 0xf900, 0xfaff) ||
           in(cp, 0x20000, 0x2fa1f);
}

/* CJK punctuation, without the letter-like marks of that block (々 〆 〇, 〡..〩 ...). */
static bool is_cjk_punct(uint32_t cp)
{
    return in(cp, 0x3001, 0x3004) || in(cp, 0x3008, 0x3020) || cp == 0x3030 || cp == 0x303d ||
           in(cp, 0xfe10, 0xfe19) || in(cp, 0xfe30, 0xfe4f) || in(cp, 0xfe50, 0xfe6b) ||
           in(cp, 0xff5f, 0xff65);
}

/* Text where a space between two characters carries no meaning. */
static bool is_cjk(uint32_t cp)
{
    return is_ideograph(cp) || in(cp, 0x3040, 0x30ff) || is_cjk_punct(cp) || in(cp, 0xff00, 0xffef);
}

static bool is_punct(uint32_t cp)
{
    return in(cp, 0x21, 0x2f) || in(cp, 0x3a, 0x40) || in(cp, 0x5b, 0x60) || in(cp, 0x7b, 0x7e) ||
           in(cp, 0xa1, 0xbf) || in(cp, 0x2010, 0x205e) || is_cjk_punct(cp);
}

/* Pictographs and the symbol blocks emoji are drawn from; approximate on purpose. */
static bool is_emoji(uint32_t cp)
{
    return in(cp, 0x1f000, 0x1faff) || in(cp, 0x2600, 0x27bf) || in(cp, 0x2190, 0x21ff) ||
           in(cp, 0x2300, 0x23ff) || in(cp, 0x25a0, 0x25ff) || in(cp, 0x2900, 0x297f) ||
           in(cp, 0x2b00, 0x2bff) || cp == 0x3297 || cp == 0x3299 || cp == 0x2122 || cp == 0x2139 ||
           cp == 0xa9 || cp == 0xae;
}

/* Sentence-final punctuation that may end a review without changing what it says. */
static bool is_final_punct(uint32_t cp)
{
    switch (cp) {
    case '.':
    case ',':
    case '!':
    case '?':
    case ';':
    case ':':
    case '~':
    case 0xb7:   /* · */
    case 0x2026: /* … */
    case 0x2014: /* — */
    case 0x3001: /* 、 */
    case 0x3002: /* 。 */
    case 0x301c: /* 〜 */
    case 0xff61: /* ｡ */
    case 0xff64: /* ､ */
        return true;
    }
    return false;
}

/* Sentence-final particles that only add tone. */
static bool is_filler_particle(uint32_t cp)
{
    switch (cp) {
    case 0x5566: /* 啦 */
    case 0x54c8: /* 哈 */
    case 0x5440: /* 呀 */
    case 0x54e6: /* 哦 */
    case 0x5462: /* 呢 */
    case 0x554a: /* 啊 */
        return true;
    }
    return false;
}

static bool is_trailing_filler(uint32_t cp)
{
    return cp == ' ' || is_final_punct(cp) || is_emoji(cp) || is_filler_particle(cp);
}

/* ---- passes ------------------------------------------------------------------------- */

/* Steps 1-2: decode, map, drop. Returns the number of code points written to cps. */
static size_t decode_and_map(const unsigned char *s, size_t len, uint32_t *cps)
{
    size_t n = 0, i = 0;
    while (i < len) {
        uint32_t cp;
        size_t k = ar_utf8_decode((const char *)s + i, len - i, &cp);
        if (k == 0) {
            i++; /* invalid byte: dropped */
            continue;
        }
        i += k;
        if (in(cp, 0xff01, 0xff5e))
            cp -= 0xfee0;
        if (is_space(cp))
            cp = ' ';
        else if (is_ignorable(cp))
            continue;
        if (cp >= 'A' && cp <= 'Z')
            cp += 'a' - 'A';
        cps[n++] = cp;
    }
    return n;
}

/* Step 3, in place. */
static size_t squeeze_spaces(uint32_t *cps, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (cps[i] == ' ') {
            if (m == 0 || cps[m - 1] == ' ')
                continue;
        }
        cps[m++] = cps[i];
    }
    if (m && cps[m - 1] == ' ')
        m--;
    /* now every space has a non-space on both sides */
    n = m;
    m = 0;
    for (size_t i = 0; i < n; i++) {
        if (cps[i] == ' ' && is_cjk(cps[i - 1]) && is_cjk(cps[i + 1]))
            continue;
        cps[m++] = cps[i];
    }
    return m;
}

/* Step 4, in place. */
static size_t collapse_runs(uint32_t *cps, size_t n)
{
    size_t m = 0, run = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i];
        if (m && cps[m - 1] == cp) {
            run++;
            if (is_punct(cp) || is_emoji(cp))
                continue;
            if (run > 2 && !(cp >= '0' && cp <= '9'))
                continue;
        } else {
            run = 1;
        }
        cps[m++] = cp;
    }
    return m;
}

/* Step 5: the new length. */
static size_t strip_filler(const uint32_t *cps, size_t n)
{
    size_t m = n;
    while (m && is_trailing_filler(cps[m - 1]))
        m--;
    return m ? m : n;
}

enum ar_status reply_normalize(const char *text, size_t len, char **out, size_t *out_len)
{
    uint32_t *cps;
    char *buf;
    size_t n, o = 0;
    if (!out)
        return AR_EINVAL;
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!text && len)
        return AR_EINVAL;
    if (len > SIZE_MAX / sizeof(uint32_t) - 1)
        return AR_ENOMEM;
    cps = ar_malloc((len + 1) * sizeof(uint32_t));
    buf = ar_malloc(len + 1);
    if (!cps || !buf) {
        ar_free(cps);
        ar_free(buf);
        return AR_ENOMEM;
    }
    n = len ? decode_and_map((const unsigned char *)text, len, cps) : 0;
    n = squeeze_spaces(cps, n);
    n = collapse_runs(cps, n);
    n = strip_filler(cps, n);
    /* every mapping keeps or shrinks the encoded size, so len bytes are enough */
    for (size_t i = 0; i < n; i++)
        o += ar_utf8_encode(cps[i], buf + o);
    buf[o] = '\0';
    ar_free(cps);
    *out = buf;
    if (out_len)
        *out_len = o;
    return AR_OK;
}

/* ---- language, rating, key ---------------------------------------------------------- */

const char *reply_guess_lang(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (s && i < len) {
        uint32_t cp;
        size_t k = ar_utf8_decode((const char *)s + i, len - i, &cp);
        if (k == 0) {
            i++;
            continue;
        }
        if (is_ideograph(cp))
            return "zh";
        i += k;
    }
    return "en";
}

const char *reply_rating_bucket(int rating)
{
    if (rating >= 1 && rating <= 2)
        return "neg";
    if (rating == 3)
        return "neu";
    if (rating >= 4 && rating <= 5)
        return "pos";
    return NULL;
}

enum ar_status reply_normalize_key(const char *shop_id, int rating, const char *lang,
                                   const char *text, size_t len, char **key_out, size_t *key_len)
{
    const char *bucket = reply_rating_bucket(rating);
    enum ar_status st;
    size_t n_shop, n_bucket, n_lang, n_text, total, o;
    char *norm, *key;
    if (!key_out)
        return AR_EINVAL;
    *key_out = NULL;
    if (key_len)
        *key_len = 0;
    if (!lang)
        lang = reply_guess_lang(text, len);
    if (!bucket || !shop_id || !shop_id[0] || !lang[0] || strchr(shop_id, 0x1f) ||
        strchr(lang, 0x1f))
        return AR_EINVAL;
    if ((st = reply_normalize(text, len, &norm, &n_text)) != AR_OK)
        return st;
    n_shop = strlen(shop_id);
    n_bucket = strlen(bucket);
    n_lang = strlen(lang);
    total = n_shop + n_bucket + n_lang + n_text + 3;
    key = ar_malloc(total + 1);
    if (!key) {
        ar_free(norm);
        return AR_ENOMEM;
    }
    /* the fields, each followed by the separator; the text last */
    memcpy(key, shop_id, n_shop);
    o = n_shop;
    key[o++] = 0x1f;
    memcpy(key + o, bucket, n_bucket);
    o += n_bucket;
    key[o++] = 0x1f;
    memcpy(key + o, lang, n_lang);
    o += n_lang;
    key[o++] = 0x1f;
    memcpy(key + o, norm, n_text);
    o += n_text;
    key[o] = '\0';
    ar_free(norm);
    *key_out = key;
    if (key_len)
        *key_len = total;
    return AR_OK;
}
