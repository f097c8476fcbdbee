/* decode.c - token ids -> bytes: whole-sequence decoding and the streaming detokenizer that
 * the engine uses to send generated text as valid UTF-8 chunks. Pieces were precomputed at
 * load (vocab.c), so both are a concatenation plus the SPM leading-space rule. */
#include "tokenizer_internal.h"

static bool skipped(const struct tokenizer *tok, int32_t id, bool remove_special)
{
    return remove_special &&
           (tok->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN)) != 0;
}

/* The piece of id, without its leading space when it is the first one rendered by an SPM
 * vocabulary that adds a space prefix when encoding. */
static const char *piece_of(const struct tokenizer *tok, int32_t id, bool at_start, size_t *len)
{
    const char *p = tok->piece + tok->piece_off[id];
    size_t n = tok->piece_len[id];
    if (at_start && tok->add_space_prefix && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    *len = n;
    return p;
}

/* ---- tokenization-space clean-up ------------------------------------------------------------ */
/* The clean-up of Hugging Face's clean_up_tokenization_spaces as llama.cpp applies it to a
 * whole detokenized text, in three passes over s[0..n) in place; each returns the new length.
 * Every pass keeps the first byte and reads s[i - 1] as it was before the pass (writes only
 * go to positions already read). */

/* " ?" " !" " ." " ," lose their space. */
static size_t clean_punct(char *s, size_t n)
{
    size_t o = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (s[i - 1] == ' ' && (c == '?' || c == '!' || c == '.' || c == ','))
            o--;
        s[o++] = c;
    }
    return o;
}

/* " ' " becomes "'". The space after the quote is blanked, so a quote right after it is not
 * taken as spaced. */
static size_t clean_lone_quote(char *s, size_t n)
{
    size_t o = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (c == '\'' && i + 1 < n && s[i - 1] == ' ' && s[i + 1] == ' ') {
            o--;
            s[++i] = '\0';
        }
        s[o++] = c;
    }
    return o;
}

/* " 's" " 'm" " 're" " 've" lose their space; " 't" " 'd" " 'll" keep it. */
static size_t clean_contractions(char *s, size_t n)
{
    size_t o = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (s[i - 1] == ' ' && c == '\'' && i + 1 < n) {
            char c1 = s[i + 1], c2 = i + 2 < n ? s[i + 2] : '\0';
            if (c1 == 's' || c1 == 'm')
                o--;
            else if (i + 2 < n && (c1 == 'r' || c1 == 'v') && c2 == 'e')
                o--;
        }
        s[o++] = c;
    }
    return o;
}

static size_t clean_spaces(char *s, size_t n)
{
    n = clean_punct(s, n);
    n = clean_lone_quote(s, n);
    return clean_contractions(s, n);
}

enum ar_status tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, int64_t n,
                                bool remove_special, char **out, size_t *len)
{
    size_t total = 0, o = 0;
    bool at_start = true;
    char *s;
    if (!tok || !out || n < 0 || (!ids && n))
        return AR_EINVAL;
    *out = NULL;
    if (len)
        *len = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_vocab)
            return AR_EINVAL;
        total += tok->piece_len[ids[i]];
    }
    s = ar_malloc(total + 1);
    if (!s)
        return AR_ENOMEM;
    for (int64_t i = 0; i < n; i++) {
        size_t l;
        const char *p;
        if (skipped(tok, ids[i], remove_special))
            continue;
        p = piece_of(tok, ids[i], at_start, &l);
        at_start = false;
        memcpy(s + o, p, l);
        o += l;
    }
    if (tok->clean_spaces)
        o = clean_spaces(s, o);
    s[o] = '\0';
    *out = s;
    if (len)
        *len = o;
    return AR_OK;
}

/* ---- streaming -------------------------------------------------------------------------------- */

void tokenizer_stream_init(struct tokenizer_stream *st, bool remove_special)
{
    memset(st, 0, sizeof(*st));
    st->at_start = true;
    st->remove_special = remove_special;
}

void tokenizer_stream_fini(struct tokenizer_stream *st)
{
    if (!st)
        return;
    ar_free(st->buf);
    memset(st, 0, sizeof(*st));
}

static enum ar_status stream_reserve(struct tokenizer_stream *st, size_t need)
{
    char *p;
    size_t cap;
    if (need <= st->cap)
        return AR_OK;
    cap = st->cap ? st->cap : 64;
    while (cap < need)
        cap *= 2;
    p = ar_realloc(st->buf, cap);
    if (!p)
        return AR_ENOMEM;
    st->buf = p;
    st->cap = cap;
    return AR_OK;
}

static const char replacement[3] = {'\xef', '\xbf', '\xbd'}; /* U+FFFD */

enum ar_status tokenizer_stream_push(const struct tokenizer *tok, struct tokenizer_stream *st,
                                     int32_t id, const char **out, size_t *len)
{
    const char *p;
    const uint8_t *in;
    size_t l, n, o = 0, i = 0;
    enum ar_status rc;

    if (!tok || !st || !out || !len)
        return AR_EINVAL;
    *out = "";
    *len = 0;
    if (id < 0 || id >= tok->n_vocab)
        return AR_EINVAL;
    if (skipped(tok, id, st->remove_special))
        return AR_OK;
    p = piece_of(tok, id, st->at_start, &l);
    st->at_start = false;

    /* layout of buf: output [0, 3n) then input [3n, 4n): output never overtakes input */
    n = st->n_hold + l;
    if ((rc = stream_reserve(st, 4 * n + 1)) != AR_OK)
        return rc;
    memcpy(st->buf + 3 * n, st->hold, st->n_hold);
    memcpy(st->buf + 3 * n + st->n_hold, p, l);
    in = (const uint8_t *)st->buf + 3 * n;
    st->n_hold = 0;
    while (i < n) {
        size_t need;
        if (in[i] < 0x80) {
            st->buf[o++] = (char)in[i++];
            continue;
        }
        need = ar_utf8_decode((const char *)in + i, n - i, NULL);
        if (need) { /* complete character */
            memmove(st->buf + o, in + i, need);
            o += need;
            i += need;
        } else if (ar_utf8_incomplete((const char *)in + i, n - i)) { /* cut by the end: hold */
            st->n_hold = (uint8_t)(n - i);
            memcpy(st->hold, in + i, st->n_hold);
            break;
        } else { /* cannot start or continue a character */
            memcpy(st->buf + o, replacement, 3);
            o += 3;
            i++;
        }
    }
    *out = st->buf;
    *len = o;
    return AR_OK;
}

enum ar_status tokenizer_stream_flush(struct tokenizer_stream *st, const char **out,
                                      size_t *len)
{
    enum ar_status rc;
    size_t o = 0;
    if (!st || !out || !len)
        return AR_EINVAL;
    *out = "";
    *len = 0;
    if (st->n_hold) {
        if ((rc = stream_reserve(st, 4)) != AR_OK)
            return rc;
        memcpy(st->buf, replacement, 3);
        o = 3;
        *out = st->buf;
    }
    *len = o;
    st->n_hold = 0;
    st->at_start = true;
    return AR_OK;
}
