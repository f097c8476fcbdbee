/* vocab.c - builds a tokenizer from GGUF tokenizer.* metadata: token table and hash,
 * scores and attributes, BPE merge ranks, special-token tables, decoded pieces, the
 * pre-tokenizer regexes, and the accessors of the public header. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "tokenizer_internal.h"

/* ---- small helpers ------------------------------------------------------------------------ */

static void *pcre_alloc(size_t size, void *data)
{
    (void)data;
    return ar_malloc(size);
}

static void pcre_free(void *p, void *data)
{
    (void)data;
    ar_free(p);
}

static bool str_eq(struct gguf_str s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int32_t tokenizer_find(const struct tokenizer *tok, const char *text, size_t len)
{
    uint32_t i;
    if (!tok || (!text && len))
        return -1;
    i = ar_fnv1a32(AR_FNV32_BASIS, text, len) & tok->hash_mask;
    for (;;) {
        int32_t id = tok->hash[i];
        if (id < 0)
            return -1;
        if (tok->text_len[id] == len && memcmp(tok->text + tok->text_off[id], text, len) == 0)
            return id;
        i = (i + 1) & tok->hash_mask;
    }
}

static uint32_t merge_hash(const char *l, size_t nl, const char *r, size_t nr)
{
    uint32_t h = ar_fnv1a32(AR_FNV32_BASIS, l, nl);
    h = ar_fnv1a32(h, "\xff", 1); /* separator: ("ab","c") and ("a","bc") differ */
    return ar_fnv1a32(h, r, nr);
}

int32_t tokenizer_merge_rank(const struct tokenizer *tok, const char *left, size_t n_left,
                             const char *right, size_t n_right)
{
    uint32_t i;
    if (!tok->merge_hash)
        return -1;
    i = merge_hash(left, n_left, right, n_right) & tok->merge_mask;
    for (;;) {
        int32_t r = tok->merge_hash[i];
        const struct tokenizer_merge *m;
        if (r < 0)
            return -1;
        m = &tok->merges[r];
        if (m->n_left == n_left && m->n_right == n_right &&
            memcmp(tok->merge_text + m->off, left, n_left) == 0 &&
            memcmp(tok->merge_text + m->off + n_left, right, n_right) == 0)
            return r;
        i = (i + 1) & tok->merge_mask;
    }
}

/* Reads an optional token id; absent keeps *id. */
static enum ar_status read_id(const struct gguf_file *f, const char *key, int32_t n_vocab,
                              int32_t *id, struct ar_err *err)
{
    int64_t v;
    if (!gguf_find(f, key))
        return AR_OK;
    if (!gguf_get_i64(f, key, &v))
        return ar_err_set(err, AR_EFORMAT, 0, "%s: not an integer", key);
    if (v < 0 || v >= n_vocab)
        return ar_err_set(err, AR_EFORMAT, 0, "%s = %lld out of range (vocab %d)", key,
                          (long long)v, (int)n_vocab);
    *id = (int32_t)v;
    return AR_OK;
}

static enum ar_status read_bool(const struct gguf_file *f, const char *key, bool *b,
                                struct ar_err *err)
{
    if (!gguf_find(f, key))
        return AR_OK;
    if (!gguf_get_bool(f, key, b))
        return ar_err_set(err, AR_EFORMAT, 0, "%s: not a bool", key);
    return AR_OK;
}

/* ---- tables ---------------------------------------------------------------------------- */

static enum ar_status load_tokens(struct tokenizer *tok, const struct gguf_file *f,
                                  struct ar_err *err)
{
    const struct gguf_arr *toks = NULL, *scores = NULL, *types = NULL;
    uint64_t n, total = 0, off = 0;

    if (!gguf_get_arr(f, "tokenizer.ggml.tokens", &toks) || toks->type != GGUF_VTYPE_STRING)
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.tokens: missing or not strings");
    n = toks->n;
    if (n == 0 || n > (uint64_t)INT32_MAX / 2)
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.tokens: bad count %llu",
                          (unsigned long long)n);
    if (gguf_find(f, "tokenizer.ggml.scores")) {
        if (!gguf_get_arr(f, "tokenizer.ggml.scores", &scores) ||
            (scores->type != GGUF_VTYPE_F32 && scores->type != GGUF_VTYPE_I32))
            return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.scores: not f32/i32");
        if (scores->n != n)
            return ar_err_set(err, AR_EFORMAT, 0,
                              "tokenizer.ggml.scores: %llu entries for %llu tokens",
                              (unsigned long long)scores->n, (unsigned long long)n);
    }
    if (gguf_find(f, "tokenizer.ggml.token_type")) {
        if (!gguf_get_arr(f, "tokenizer.ggml.token_type", &types) ||
            types->type == GGUF_VTYPE_STRING || types->type == GGUF_VTYPE_ARRAY ||
            types->type == GGUF_VTYPE_F32 || types->type == GGUF_VTYPE_F64)
            return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.token_type: not integers");
        if (types->n != n)
            return ar_err_set(err, AR_EFORMAT, 0,
                              "tokenizer.ggml.token_type: %llu entries for %llu tokens",
                              (unsigned long long)types->n, (unsigned long long)n);
    }
    for (uint64_t i = 0; i < n; i++)
        total += gguf_arr_str(toks, i).len + 1;
    if (total > UINT32_MAX)
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.tokens: too much text");

    tok->n_vocab = (int32_t)n;
    tok->text = ar_malloc(total);
    tok->text_off = ar_malloc(n * sizeof(uint32_t));
    tok->text_len = ar_malloc(n * sizeof(uint32_t));
    tok->score = ar_malloc(n * sizeof(float));
    tok->attr = ar_malloc(n);
    tok->hash_mask = pow2_at_least(2 * n) - 1;
    tok->hash = ar_malloc(((size_t)tok->hash_mask + 1) * sizeof(int32_t));
    if (!tok->text || !tok->text_off || !tok->text_len || !tok->score || !tok->attr ||
        !tok->hash)
        return AR_ENOMEM;
    memset(tok->hash, 0xff, ((size_t)tok->hash_mask + 1) * sizeof(int32_t));

    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s = gguf_arr_str(toks, i);
        uint32_t slot;
        tok->text_off[i] = (uint32_t)off;
        tok->text_len[i] = (uint32_t)s.len;
        memcpy(tok->text + off, s.ptr, s.len);
        tok->text[off + s.len] = '\0';
        off += s.len + 1;

        if (scores) {
            float sc = scores->type == GGUF_VTYPE_F32 ? gguf_arr_f32(scores, i)
                                                       : (float)gguf_arr_int(scores, i);
            tok->score[i] = isnan(sc) ? -INFINITY : sc;
        } else {
            tok->score[i] = 0.0f;
        }
        tok->attr[i] = TOKENIZER_ATTR_NORMAL;
        if (types) {
            switch (gguf_arr_int(types, i)) {
            case 1: tok->attr[i] = TOKENIZER_ATTR_NORMAL; break;
            case 2: tok->attr[i] = TOKENIZER_ATTR_UNKNOWN; break;
            case 3: tok->attr[i] = TOKENIZER_ATTR_CONTROL; break;
            case 4: tok->attr[i] = TOKENIZER_ATTR_USER_DEFINED; break;
            case 5: tok->attr[i] = TOKENIZER_ATTR_UNUSED; break;
            case 6: tok->attr[i] = TOKENIZER_ATTR_BYTE; break;
            default: tok->attr[i] = 0; break; /* undefined: renders as nothing */
            }
        }
        if (s.len == 0)
            continue; /* an empty token can never be matched */
        slot = ar_fnv1a32(AR_FNV32_BASIS, s.ptr, s.len) & tok->hash_mask;
        while (tok->hash[slot] >= 0) {
            int32_t o = tok->hash[slot];
            if (tok->text_len[o] == s.len && memcmp(tok->text + tok->text_off[o], s.ptr, s.len) == 0)
                return ar_err_set(err, AR_EFORMAT, 0, "duplicate token text at ids %d and %llu",
                                  (int)o, (unsigned long long)i);
            slot = (slot + 1) & tok->hash_mask;
        }
        tok->hash[slot] = (int32_t)i;
    }
    return AR_OK;
}

static enum ar_status load_merges(struct tokenizer *tok, const struct gguf_file *f,
                                  struct ar_err *err)
{
    const struct gguf_arr *arr = NULL;
    uint64_t total = 0, off = 0;
    uint32_t n = 0;

    if (!gguf_get_arr(f, "tokenizer.ggml.merges", &arr) || arr->type != GGUF_VTYPE_STRING)
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.merges: missing or not strings");
    if (arr->n > (uint64_t)INT32_MAX / 4)
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.merges: too many");
    for (uint64_t i = 0; i < arr->n; i++)
        total += gguf_arr_str(arr, i).len;
    if (total > UINT32_MAX)
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.merges: too much text");
    tok->merge_text = ar_malloc(total ? total : 1);
    tok->merges = ar_malloc((arr->n ? arr->n : 1) * sizeof(struct tokenizer_merge));
    if (!tok->merge_text || !tok->merges)
        return AR_ENOMEM;

    /* "left right", split at the first space after the first byte. The rank is the index in
     * the file; a pair listed twice keeps its first rank. Lines without a space are kept as
     * ranks that can never match so that later ranks keep their numbers. */
    for (uint64_t i = 0; i < arr->n; i++) {
        struct gguf_str s = gguf_arr_str(arr, i);
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        struct tokenizer_merge *m = &tok->merges[n];
        n++;
        m->off = (uint32_t)off;
        m->n_left = m->n_right = 0;
        if (!sp)
            continue;
        m->n_left = (uint32_t)(sp - s.ptr);
        m->n_right = (uint32_t)(s.len - m->n_left - 1);
        memcpy(tok->merge_text + off, s.ptr, m->n_left);
        memcpy(tok->merge_text + off + m->n_left, sp + 1, m->n_right);
        off += m->n_left + m->n_right;
    }
    tok->n_merges = n;
    return AR_OK;
}

/* The merge ranks by text, for vocabularies that cannot use the merges by ids. */
static enum ar_status setup_merge_hash(struct tokenizer *tok)
{
    tok->merge_mask = pow2_at_least(2 * (uint64_t)tok->n_merges) - 1;
    tok->merge_hash = ar_malloc(((size_t)tok->merge_mask + 1) * sizeof(int32_t));
    if (!tok->merge_hash)
        return AR_ENOMEM;
    memset(tok->merge_hash, 0xff, ((size_t)tok->merge_mask + 1) * sizeof(int32_t));
    for (uint32_t r = 0; r < tok->n_merges; r++) {
        const struct tokenizer_merge *m = &tok->merges[r];
        const char *t = tok->merge_text + m->off;
        uint32_t slot;
        bool dup = false;
        if (!m->n_left)
            continue;
        slot = merge_hash(t, m->n_left, t + m->n_left, m->n_right) & tok->merge_mask;
        while (tok->merge_hash[slot] >= 0) {
            const struct tokenizer_merge *o = &tok->merges[tok->merge_hash[slot]];
            if (o->n_left == m->n_left && o->n_right == m->n_right &&
                memcmp(tok->merge_text + o->off, t, m->n_left + m->n_right) == 0) {
                dup = true; /* listed twice: the first rank stays */
                break;
            }
            slot = (slot + 1) & tok->merge_mask;
        }
        if (!dup)
            tok->merge_hash[slot] = (int32_t)r;
    }
    return AR_OK;
}

/* ---- special tokens ------------------------------------------------------------------------ */

/* "<｜end▁of▁sentence｜>" (full-width bars, U+2581), in octal so no escape runs on */
#define TOKENIZER_DEEPSEEK_EOS "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>"

/* Texts that mark an end of turn, in order of preference for the eot id. */
static const char *const eot_texts[] = {
    "<|eot_id|>",      "<|im_end|>", "<|end|>", "<end_of_turn>",        "<|endoftext|>",
    "<|end_of_text|>", "<EOT>",      "_<EOT>",  TOKENIZER_DEEPSEEK_EOS, "<end_of_utterance>",
};
/* Texts of tokens that end generation. */
static const char *const eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    TOKENIZER_DEEPSEEK_EOS,
};

static int32_t find_cstr(const struct tokenizer *tok, const char *s)
{
    return tokenizer_find(tok, s, strlen(s));
}

static enum ar_status add_eog(struct tokenizer *tok, int32_t id)
{
    if (id < 0)
        return AR_OK;
    for (int32_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id)
            return AR_OK;
    {
        int32_t *p = ar_realloc(tok->eog, (size_t)(tok->n_eog + 1) * sizeof(int32_t));
        if (!p)
            return AR_ENOMEM;
        tok->eog = p;
        p[tok->n_eog++] = id;
    }
    /* a token that ends generation must not be spelled out from plain text */
    tok->attr[id] |= TOKENIZER_ATTR_CONTROL;
    return AR_OK;
}

static enum ar_status setup_eog(struct tokenizer *tok)
{
    enum ar_status st;
    if (tok->eot < 0) {
        for (size_t i = 0; i < AR_ARRAY_LEN(eot_texts) && tok->eot < 0; i++)
            tok->eot = find_cstr(tok, eot_texts[i]);
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(eog_texts); i++)
        if ((st = add_eog(tok, find_cstr(tok, eog_texts[i]))) != AR_OK)
            return st;
    if ((st = add_eog(tok, tok->eos)) != AR_OK || (st = add_eog(tok, tok->eot)) != AR_OK ||
        (st = add_eog(tok, tok->eom)) != AR_OK)
        return st;
    return AR_OK;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static enum ar_status setup_specials(struct tokenizer *tok)
{
    const unsigned special_bits =
        TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED | TOKENIZER_ATTR_UNKNOWN;
    uint32_t counts[256] = {0};
    uint64_t *keys;
    int32_t n = 0;

    for (int32_t i = 0; i < tok->n_vocab; i++)
        if ((tok->attr[i] & special_bits) && tok->text_len[i] > 0)
            n++;
    tok->special = ar_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    tok->special_prio = ar_malloc((size_t)tok->n_vocab * sizeof(int32_t));
    tok->special_lens = ar_malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    if (!tok->special || !tok->special_prio || !tok->special_lens)
        return AR_ENOMEM;
    keys = ar_malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (!keys)
        return AR_ENOMEM;
    n = 0;
    for (int32_t i = 0; i < tok->n_vocab; i++) /* sort key: longer first, then lower id */
        if ((tok->attr[i] & special_bits) && tok->text_len[i] > 0)
            keys[n++] = (uint64_t)(UINT32_MAX - tok->text_len[i]) << 32 | (uint32_t)i;
    qsort(keys, (size_t)n, sizeof(uint64_t), cmp_u64);
    for (int32_t k = 0; k < n; k++)
        tok->special[k] = (int32_t)(keys[k] & 0xffffffffu);
    ar_free(keys);
    tok->n_special = n;
    memset(tok->special_prio, 0xff, (size_t)tok->n_vocab * sizeof(int32_t));
    for (int32_t k = 0; k < n; k++)
        tok->special_prio[tok->special[k]] = k;

    /* distinct text lengths per first byte, so that matching tries only those */
    for (int32_t k = 0; k < n; k++)
        counts[(uint8_t)tok->text[tok->text_off[tok->special[k]]]]++;
    tok->special_lens_off[0] = 0;
    for (int b = 0; b < 256; b++)
        tok->special_lens_off[b + 1] = tok->special_lens_off[b] + counts[b];
    memset(counts, 0, sizeof(counts));
    for (int32_t k = 0; k < n; k++) {
        int32_t id = tok->special[k];
        uint8_t b = (uint8_t)tok->text[tok->text_off[id]];
        uint32_t *lens = tok->special_lens + tok->special_lens_off[b];
        bool seen = false;
        for (uint32_t j = 0; j < counts[b]; j++)
            seen |= lens[j] == tok->text_len[id];
        if (!seen)
            lens[counts[b]++] = tok->text_len[id];
    }
    /* compact: unused tail slots of each byte are marked 0 and skipped by the matcher */
    for (int b = 0; b < 256; b++)
        for (uint32_t j = tok->special_lens_off[b] + counts[b]; j < tok->special_lens_off[b + 1];
             j++)
            tok->special_lens[j] = 0;
    return AR_OK;
}

/* Some models' special tokens swallow the whitespace after them (Phi-3). */
static void setup_strip(struct tokenizer *tok, const struct gguf_file *f)
{
    struct gguf_str name;
    char low[64];
    size_t n;
    int32_t id;
    if (!gguf_get_str(f, "general.name", &name))
        return;
    n = AR_MIN(name.len, sizeof(low) - 1);
    for (size_t i = 0; i < n; i++) {
        char c = name.ptr[i];
        low[i] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    low[n] = '\0';
    if (!strstr(low, "phi-3") && !strstr(low, "phi3"))
        return;
    for (int32_t k = 0; k < tok->n_special; k++)
        tok->attr[tok->special[k]] |= TOKENIZER_ATTR_RSTRIP;
    if ((id = find_cstr(tok, "</s>")) >= 0)
        tok->attr[id] |= TOKENIZER_ATTR_RSTRIP;
    if ((id = find_cstr(tok, "<unk>")) >= 0)
        tok->attr[id] &= (uint8_t)~TOKENIZER_ATTR_RSTRIP;
    if ((id = find_cstr(tok, "<s>")) >= 0)
        tok->attr[id] &= (uint8_t)~TOKENIZER_ATTR_RSTRIP;
    if ((id = find_cstr(tok, "<|endoftext|>")) >= 0)
        tok->attr[id] &= (uint8_t)~TOKENIZER_ATTR_RSTRIP;
}

/* ---- bytes and pieces ---------------------------------------------------------------------- */

static int hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Byte of a "<0xNN>" token, or -1. */
static int byte_of_text(const char *s, size_t n)
{
    int hi, lo;
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return -1;
    hi = hex_val(s[3]);
    lo = hex_val(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void setup_bytes(struct tokenizer *tok)
{
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        char one = (char)b;
        int32_t id = tokenizer_find(tok, buf, 6);
        if (id < 0)
            id = tokenizer_find(tok, &one, 1);
        if (id < 0)
            id = tok->unk;
        tok->byte_id[b] = id;
    }
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tokenizer_byte_to_cp((uint8_t)b);
        if (cp < 0x80) { /* all table code points are below 0x800 */
            tok->byte_text[b][0] = (char)cp;
            tok->byte_text[b][1] = 0;
        } else {
            tok->byte_text[b][0] = (char)(0xc0 | (cp >> 6));
            tok->byte_text[b][1] = (char)(0x80 | (cp & 0x3f));
        }
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(tok->unbyte); i++)
        tok->unbyte[i] = -1;
    for (int b = 0; b < 256; b++)
        tok->unbyte[tokenizer_byte_to_cp((uint8_t)b)] = (int16_t)b;
}

/* Writes the piece of token id to out (at most 3x the text length) and returns its length. */
static size_t make_piece(const struct tokenizer *tok, int32_t id, char *out)
{
    const char *s = tok->text + tok->text_off[id];
    size_t n = tok->text_len[id], o = 0;
    unsigned a = tok->attr[id];

    if (a & (TOKENIZER_ATTR_UNKNOWN | TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED)) {
        memcpy(out, s, n);
        return n;
    }
    if (a & TOKENIZER_ATTR_NORMAL) {
        if (tok->kind == TOKENIZER_KIND_SPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    out[o++] = ' ';
                    i += 3;
                } else {
                    out[o++] = s[i++];
                }
            }
            return o;
        }
        for (size_t i = 0; i < n;) {
            uint32_t cp = 0;
            /* lax: a piece's overlong form of a table code point maps to its byte too */
            size_t l = ar_utf8_decode_lax(s + i, n - i, &cp);
            if (l && cp < AR_ARRAY_LEN(tok->unbyte) && tok->unbyte[cp] >= 0) {
                out[o++] = (char)tok->unbyte[cp];
                i += l;
            } else { /* not from the byte table: keep the bytes */
                l = l ? l : 1;
                memcpy(out + o, s + i, l);
                o += l;
                i += l;
            }
        }
        return o;
    }
    if (a & TOKENIZER_ATTR_BYTE) {
        int b = byte_of_text(s, n);
        if (b < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[0] = (char)b;
        return 1;
    }
    return 0; /* unused or undefined tokens render as nothing */
}

static enum ar_status setup_pieces(struct tokenizer *tok)
{
    size_t total = 0, off = 0;
    for (int32_t i = 0; i < tok->n_vocab; i++)
        total += tok->text_len[i];
    if (total > UINT32_MAX)
        return AR_ENOMEM;
    tok->piece = ar_malloc(total + 1);
    tok->piece_off = ar_malloc((size_t)tok->n_vocab * sizeof(uint32_t));
    tok->piece_len = ar_malloc((size_t)tok->n_vocab * sizeof(uint32_t));
    if (!tok->piece || !tok->piece_off || !tok->piece_len)
        return AR_ENOMEM;
    /* pieces are never longer than the token text: "▁"->" ", two-byte table code point ->
     * one byte, byte token -> one byte */
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        size_t n = make_piece(tok, i, tok->piece + off);
        tok->piece_off[i] = (uint32_t)off;
        tok->piece_len[i] = (uint32_t)n;
        off += n;
    }
    return AR_OK;
}

/* Merges by token ids (struct tokenizer_pair). Left out (the string merges stay in use) when a
 * byte's character is not a plain token or a merge of two tokens gives no token at all,
 * where only the string path matches the reference. A merge may give a control token (Qwen3
 * spells "</s>" that way): the merger keeps it, and a word that ends on it falls back to the
 * single-byte tokens of its text, as the string path does. */
static bool plain_id(const struct tokenizer *tok, int32_t id)
{
    return id >= 0 && !(tok->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN));
}

static void pair_tables_free(struct tokenizer *tok)
{
    ar_free(tok->char_index);
    ar_free(tok->chars);
    tok->char_index = NULL;
    tok->chars = NULL;
    tok->n_chars = 0;
    ar_free(tok->pairs);
    ar_free(tok->pair_bits);
    tok->pairs = NULL;
    tok->pair_bits = NULL;
}

/* ---- characters taken whole ------------------------------------------------------------------
 *
 * A Chinese character is three bytes, and merging them costs the merger about four lookups in
 * the large merge table (two merges, each with its two new neighbour pairs). Starting such a
 * character as one symbol gives the same tokens when nothing outside it can take part of it:
 *   - its bytes alone merge into one token c, the highest rank on the way being R;
 *   - no merge of rank <= R joins a symbol that holds its first byte on the way (or c) to
 *     anything ending in the byte before it, nor one that holds its last byte (or c) to
 *     anything starting with the byte after it.
 * Then, in the merger's run from single bytes, while the character is in pieces one of its
 * own merges (rank <= R) is always pending, so no pair across its edges is ever the best; a
 * merge taken elsewhere meanwhile ranks below that pending one, so also below any pair with
 * c (rank > R), and the run that starts with c whole takes it too, in the same order; once
 * the character is whole the two runs are the same. The left and right masks of struct
 * tokenizer_char hold the bytes allowed next to it. Tests hold the result to a textbook
 * merge loop (pretok_test). */

/* A merge seen from one of its sides: the token on the other side and the rank. */
struct side {
    int32_t other, rank;
};

/* The merges of the pair table by their left token ([0]) and by their right token ([1]):
 * those of token t are list[k][off[k][t] .. off[k][t + 1]). */
struct sides {
    uint32_t *off[2];
    struct side *list[2];
};

static void sides_free(struct sides *sd)
{
    for (int k = 0; k < 2; k++) {
        ar_free(sd->off[k]);
        ar_free(sd->list[k]);
    }
}

static enum ar_status sides_build(const struct tokenizer *tok, struct sides *sd)
{
    size_t n = (size_t)tok->n_vocab, total = 0;
    uint32_t *pos[2] = {NULL, NULL};
    enum ar_status st = AR_ENOMEM;
    memset(sd, 0, sizeof(*sd));
    for (uint32_t i = 0; i <= tok->pair_mask; i++)
        total += tok->pairs[i].key != TOKENIZER_PAIR_EMPTY;
    for (int k = 0; k < 2; k++) {
        sd->off[k] = ar_calloc(n + 1, sizeof(uint32_t));
        sd->list[k] = ar_malloc((total ? total : 1) * sizeof(struct side));
        pos[k] = ar_malloc((n + 1) * sizeof(uint32_t));
        if (!sd->off[k] || !sd->list[k] || !pos[k])
            goto done;
    }
    for (uint32_t i = 0; i <= tok->pair_mask; i++) {
        uint64_t key = tok->pairs[i].key;
        if (key == TOKENIZER_PAIR_EMPTY)
            continue;
        sd->off[0][(key >> 32) + 1]++;
        sd->off[1][(uint32_t)key + 1]++;
    }
    for (int k = 0; k < 2; k++) {
        for (size_t t = 1; t <= n; t++)
            sd->off[k][t] += sd->off[k][t - 1];
        memcpy(pos[k], sd->off[k], (n + 1) * sizeof(uint32_t));
    }
    for (uint32_t i = 0; i <= tok->pair_mask; i++) {
        const struct tokenizer_pair *p = &tok->pairs[i];
        uint32_t l = (uint32_t)(p->key >> 32), r = (uint32_t)p->key;
        if (p->key == TOKENIZER_PAIR_EMPTY)
            continue;
        sd->list[0][pos[0][l]++] = (struct side){(int32_t)r, p->rank};
        sd->list[1][pos[1][r]++] = (struct side){(int32_t)l, p->rank};
    }
    st = AR_OK;
done:
    ar_free(pos[0]);
    ar_free(pos[1]);
    if (st != AR_OK)
        sides_free(sd);
    return st;
}

/* The byte behind the first (last = false) or last character of token id's text, or -1 when
 * that character is not one of the byte table's (such a token is never a word's symbol). */
static int edge_byte(const struct tokenizer *tok, int32_t id, bool last)
{
    const char *t = tok->text + tok->text_off[id];
    size_t n = tok->text_len[id], i = 0;
    uint32_t cp = 0;
    if (last && n)
        for (i = n - 1; i > 0 && ((uint8_t)t[i] & 0xc0) == 0x80;)
            i--;
    if (!ar_utf8_decode(t + i, n - i, &cp) || cp >= AR_ARRAY_LEN(tok->unbyte))
        return -1;
    return tok->unbyte[cp];
}

/* The raw bytes of token id when its text is one 2- or 3-byte UTF-8 character spelled in the
 * byte table; returns their number, else 0. */
static int char_bytes(const struct tokenizer *tok, int32_t id, uint8_t b[3])
{
    const char *t = tok->text + tok->text_off[id];
    size_t n = tok->text_len[id], i = 0;
    int m = 0;
    uint32_t cp;
    while (i < n && m < 3) {
        size_t l = ar_utf8_decode(t + i, n - i, &cp);
        if (!l || cp >= AR_ARRAY_LEN(tok->unbyte) || tok->unbyte[cp] < 0)
            return 0;
        b[m++] = (uint8_t)tok->unbyte[cp];
        i += l;
    }
    if (i < n || m < 2 || ar_utf8_decode((const char *)b, (size_t)m, &cp) != (size_t)m)
        return 0;
    return m;
}

/* Merges the n bytes b alone, as the merger would: returns the token they end in, or -1 if
 * they do not end in one symbol. *max_rank: the highest rank merged; edge[0] / edge[1]: the
 * symbols that held the first / last byte before the end (*n_edge[k] of them). */
static int32_t merge_alone(const struct tokenizer *tok, const uint8_t *b, int n,
                           int32_t *max_rank, int32_t edge[2][3], int n_edge[2])
{
    int32_t id[3];
    int first[3], last[3], m = n;
    *max_rank = -1;
    for (int i = 0; i < n; i++) {
        id[i] = tok->byte_tok[b[i]];
        first[i] = last[i] = i;
    }
    edge[0][0] = id[0];
    edge[1][0] = id[n - 1];
    n_edge[0] = n_edge[1] = 1;
    while (m > 1) {
        const struct tokenizer_pair *best = NULL;
        int at = 0;
        for (int i = 0; i + 1 < m; i++) {
            const struct tokenizer_pair *p = tokenizer_pair_find(tok, id[i], id[i + 1]);
            if (p && (!best || p->rank < best->rank)) {
                best = p;
                at = i;
            }
        }
        if (!best)
            return -1;
        *max_rank = AR_MAX(*max_rank, best->rank);
        id[at] = best->id;
        last[at] = last[at + 1];
        for (int i = at + 1; i + 1 < m; i++) {
            id[i] = id[i + 1];
            first[i] = first[i + 1];
            last[i] = last[i + 1];
        }
        if (--m == 1)
            break;
        if (first[at] == 0)
            edge[0][n_edge[0]++] = id[at];
        if (last[at] == n - 1)
            edge[1][n_edge[1]++] = id[at];
    }
    return id[0];
}

/* Clears in mask the bytes next to which symbol p may merge at rank <= max_rank: k = 1 looks
 * at merges with p on the right (the last byte of their left token), k = 0 the other way. */
static void forbid(const struct tokenizer *tok, const struct sides *sd, int k, int32_t p,
                   int32_t max_rank, uint32_t mask[8])
{
    for (uint32_t j = sd->off[k][p]; j < sd->off[k][p + 1]; j++) {
        int b;
        if (sd->list[k][j].rank > max_rank ||
            (b = edge_byte(tok, sd->list[k][j].other, k == 1)) < 0)
            continue;
        mask[b >> 5] &= ~(1u << (b & 31));
    }
}

static enum ar_status setup_chars(struct tokenizer *tok)
{
    struct sides sd;
    int32_t cap = 0;
    enum ar_status st = sides_build(tok, &sd);
    if (st != AR_OK)
        return st;
    if (!(tok->char_index = ar_malloc(65536 * sizeof(int32_t)))) {
        st = AR_ENOMEM;
        goto done;
    }
    memset(tok->char_index, 0xff, 65536 * sizeof(int32_t));
    for (int32_t t = 0; t < tok->n_vocab; t++) {
        uint8_t b[3];
        int n = char_bytes(tok, t, b), n_edge[2];
        int32_t edge[2][3], max_rank, id;
        uint32_t cp = 0;
        struct tokenizer_char *c;
        if (!n || (id = merge_alone(tok, b, n, &max_rank, edge, n_edge)) < 0)
            continue;
        ar_utf8_decode((const char *)b, (size_t)n, &cp);
        if (tok->char_index[cp] >= 0)
            continue; /* the same text twice */
        if (tok->n_chars == cap) {
            struct tokenizer_char *v;
            cap = cap ? 2 * cap : 1024;
            if (!(v = ar_realloc(tok->chars, (size_t)cap * sizeof(*v)))) {
                st = AR_ENOMEM;
                goto done;
            }
            tok->chars = v;
        }
        c = &tok->chars[tok->n_chars];
        c->id = id;
        memset(c->left, 0xff, sizeof(c->left));
        memset(c->right, 0xff, sizeof(c->right));
        forbid(tok, &sd, 1, id, max_rank, c->left);
        forbid(tok, &sd, 0, id, max_rank, c->right);
        for (int i = 0; i < n_edge[0]; i++)
            forbid(tok, &sd, 1, edge[0][i], max_rank, c->left);
        for (int i = 0; i < n_edge[1]; i++)
            forbid(tok, &sd, 0, edge[1][i], max_rank, c->right);
        tok->char_index[cp] = tok->n_chars++;
    }
done:
    sides_free(&sd);
    return st;
}

static enum ar_status setup_pairs(struct tokenizer *tok)
{
    uint32_t mask;
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        const char *t = tok->text + tok->text_off[i];
        uint32_t n = tok->text_len[i], chars = 0, cp = 0;
        /* a word's text is its bytes' table characters: a token starting with another
         * character is never a word */
        if (!ar_utf8_decode(t, n, &cp) || cp >= AR_ARRAY_LEN(tok->unbyte) || tok->unbyte[cp] < 0)
            continue;
        for (uint32_t k = 0; k < n; k++) /* characters: bytes that start one */
            chars += ((uint8_t)t[k] & 0xc0) != 0x80;
        tok->max_len_first[tok->unbyte[cp]] = AR_MAX(tok->max_len_first[tok->unbyte[cp]], chars);
    }
    for (int b = 0; b < 256; b++) {
        const char *c = tok->byte_text[b];
        size_t n = (uint8_t)c[0] >= 0x80 ? 2 : 1;
        tok->byte_tok[b] = tokenizer_find(tok, c, n);
        if (!plain_id(tok, tok->byte_tok[b]))
            return AR_OK;
        for (size_t k = 0; k < 2; k++) { /* single bytes of that text that are tokens */
            int32_t id = k < n ? tokenizer_find(tok, c + k, 1) : -1;
            tok->byte_fallback[b][k] = plain_id(tok, id) ? id : -1;
        }
    }
    mask = pow2_at_least((uint64_t)tok->n_merges * 3 / 2 + 1) - 1;
    /* 8 bits per merge (a few percent of false "maybe"), at least 64 */
    tok->pair_bits_mask = pow2_at_least((uint64_t)tok->n_merges * 8 + 64) - 1;
    tok->pairs = ar_malloc(((size_t)mask + 1) * sizeof(struct tokenizer_pair));
    tok->pair_bits = ar_calloc(((size_t)tok->pair_bits_mask + 1) / 64, sizeof(uint64_t));
    if (!tok->pairs || !tok->pair_bits)
        return AR_ENOMEM;
    tok->pair_mask = mask;
    for (size_t i = 0; i <= mask; i++)
        tok->pairs[i].key = TOKENIZER_PAIR_EMPTY;
    for (uint32_t r = 0; r < tok->n_merges; r++) {
        const struct tokenizer_merge *m = &tok->merges[r];
        const char *t = tok->merge_text + m->off;
        int32_t l, rt, id;
        uint64_t key;
        uint32_t i;
        if (!m->n_left)
            continue;
        l = tokenizer_find(tok, t, m->n_left);
        rt = tokenizer_find(tok, t + m->n_left, m->n_right);
        if (l < 0 || rt < 0)
            continue; /* a side that is no token is never formed */
        id = tokenizer_find(tok, t, m->n_left + m->n_right);
        if (id < 0) {
            pair_tables_free(tok);
            return AR_OK;
        }
        key = (uint64_t)(uint32_t)l << 32 | (uint32_t)rt;
        for (i = tokenizer_pair_slot(key, mask); tok->pairs[i].key != TOKENIZER_PAIR_EMPTY;
             i = (i + 1) & mask)
            if (tok->pairs[i].key == key)
                break; /* listed twice: the first rank stays */
        if (tok->pairs[i].key == key)
            continue;
        tok->pairs[i].key = key;
        tok->pairs[i].rank = (int32_t)r;
        tok->pairs[i].id = id;
        i = tokenizer_pair_bit(key, tok->pair_bits_mask);
        tok->pair_bits[i >> 6] |= 1ull << (i & 63);
    }
    return setup_chars(tok);
}

enum ar_status tokenizer_use_text_merges(struct tokenizer *tok)
{
    pair_tables_free(tok);
    return tok->merge_hash || tok->kind != TOKENIZER_KIND_BPE ? AR_OK : setup_merge_hash(tok);
}

/* ---- pre-tokenizer selection ----------------------------------------------------------------- */

static atomic_flag warned_pre = ATOMIC_FLAG_INIT;
static atomic_flag warned_chat = ATOMIC_FLAG_INIT;

/* The pre-tokenizer of a BPE vocabulary: the override when given, else tokenizer.ggml.pre
 * (absent: "default", as the reference). An unknown name is refused, never replaced. */
static enum ar_status choose_pre(struct tokenizer *tok, const struct gguf_file *f,
                                 const char *override, struct ar_err *err)
{
    struct gguf_str s = {NULL, 0};
    const struct tokenizer_pre_info *p;
    const char *what = override ? "--tokenizer-pre" : "tokenizer.ggml.pre";
    if (override) {
        s.ptr = override;
        s.len = strlen(override);
    } else if (!gguf_get_str(f, "tokenizer.ggml.pre", &s)) {
        if (!atomic_flag_test_and_set(&warned_pre))
            AR_WARN("tokenizer: no tokenizer.ggml.pre in the file, using 'default' "
                    "(the model may have been trained on a different split)");
        s.ptr = "default";
        s.len = 7;
    }
    p = tokenizer_pre_lookup(s.ptr, s.len);
    if (!p)
        return ar_err_set(err, override ? AR_EINVAL : AR_EFORMAT, 0,
                          "%s: unknown pre-tokenizer '%.*s'%s", what, (int)AR_MIN(s.len, 64),
                          s.ptr,
                          override ? "" : " (refused rather than guessed; --tokenizer-pre NAME "
                                          "chooses one)");
    if (p->flags & TOKENIZER_PRE_UNSUPPORTED)
        return ar_err_set(err, AR_ENOTSUP, 0, "%s: pre-tokenizer '%s' is not supported", what,
                          p->name);
    tok->split = p->split;
    tok->ignore_merges = (p->flags & TOKENIZER_PRE_IGNORE_MERGES) != 0;
    tok->add_bos = (p->flags & TOKENIZER_PRE_ADD_BOS) != 0;
    tok->clean_spaces = !(p->flags & TOKENIZER_PRE_KEEP_SPACES);
    return AR_OK;
}

static enum ar_status compile_regexes(struct tokenizer *tok, struct ar_err *err)
{
    const char *const *pats;
    size_t n = (size_t)tokenizer_split_patterns(tok->split, &pats);
    if (n > TOKENIZER_MAX_REGEX)
        return ar_err_set(err, AR_ENOTSUP, 0, "pre-tokenizer: too many patterns");
    tok->gctx = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
    if (!tok->gctx)
        return AR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        pcre2_compile_context *cc = pcre2_compile_context_create(tok->gctx);
        int code = 0;
        PCRE2_SIZE at = 0;
        if (!cc)
            return AR_ENOMEM;
        tok->re[i] = pcre2_compile((PCRE2_SPTR)pats[i], PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                                       PCRE2_DOLLAR_ENDONLY,
                                   &code, &at, cc);
        pcre2_compile_context_free(cc);
        if (!tok->re[i]) {
            if (code == PCRE2_ERROR_HEAP_FAILED || code == PCRE2_ERROR_NOMEMORY)
                return AR_ENOMEM;
            return ar_err_set(err, AR_ENOTSUP, 0, "pre-tokenizer regex %zu: PCRE2 error %d", i,
                              code);
        }
        tok->n_re = (int)i + 1;
        (void)pcre2_jit_compile(tok->re[i], PCRE2_JIT_COMPLETE); /* optional speed-up */
    }
    return AR_OK;
}

/* ---- load ---------------------------------------------------------------------------------- */

static enum ar_status load_chat(struct tokenizer *tok, const struct gguf_file *f)
{
    struct gguf_str s;
    bool known = false;
    if (gguf_get_str(f, "tokenizer.chat_template", &s)) {
        tok->chat_template = ar_strndup(s.ptr, s.len);
        if (!tok->chat_template)
            return AR_ENOMEM;
        tok->chat = tokenizer_chat_detect(s.ptr, s.len, &known);
    } else {
        tok->chat = tokenizer_chat_detect(NULL, 0, &known);
    }
    tok->chat_known = known;
    return AR_OK;
}

static enum ar_status load(struct tokenizer *tok, const struct gguf_file *f, const char *pre,
                           struct ar_err *err)
{
    enum ar_status st;
    struct gguf_str model;

    if (!gguf_get_str(f, "tokenizer.ggml.model", &model))
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.model: missing");
    if (str_eq(model, "llama"))
        tok->kind = TOKENIZER_KIND_SPM;
    else if (str_eq(model, "gpt2"))
        tok->kind = TOKENIZER_KIND_BPE;
    else
        return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.model: unknown model '%.*s'",
                          (int)AR_MIN(model.len, 64), model.ptr);
    if ((st = load_tokens(tok, f, err)) != AR_OK)
        return st;

    tok->bos = tok->eos = tok->eot = tok->eom = tok->unk = tok->pad = tok->sep = -1;
    if (tok->kind == TOKENIZER_KIND_SPM) {
        /* SentencePiece defaults, used when the keys are absent */
        tok->bos = tok->n_vocab > 1 ? 1 : -1;
        tok->eos = tok->n_vocab > 2 ? 2 : -1;
        tok->unk = 0;
        tok->add_bos = true;
        tok->add_space_prefix = true;
    } else {
        if ((st = choose_pre(tok, f, pre, err)) != AR_OK ||
            (st = load_merges(tok, f, err)) != AR_OK)
            return st;
    }
    if ((st = read_id(f, "tokenizer.ggml.bos_token_id", tok->n_vocab, &tok->bos, err)) ||
        (st = read_id(f, "tokenizer.ggml.eos_token_id", tok->n_vocab, &tok->eos, err)) ||
        (st = read_id(f, "tokenizer.ggml.eot_token_id", tok->n_vocab, &tok->eot, err)) ||
        (st = read_id(f, "tokenizer.ggml.eom_token_id", tok->n_vocab, &tok->eom, err)) ||
        (st = read_id(f, "tokenizer.ggml.unknown_token_id", tok->n_vocab, &tok->unk, err)) ||
        (st = read_id(f, "tokenizer.ggml.padding_token_id", tok->n_vocab, &tok->pad, err)) ||
        /* the key's spelling is the format's */
        (st = read_id(f, "tokenizer.ggml.seperator_token_id", tok->n_vocab, &tok->sep, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_bos_token", &tok->add_bos, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_eos_token", &tok->add_eos, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_sep_token", &tok->add_sep, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_space_prefix", &tok->add_space_prefix, err)))
        return st;
    if (tok->kind == TOKENIZER_KIND_BPE)
        tok->add_space_prefix = false;
    if (tok->add_bos && tok->bos < 0)
        return ar_err_set(err, AR_EFORMAT, 0, "add_bos_token is set but there is no bos id");
    if (tok->add_eos && tok->eos < 0)
        return ar_err_set(err, AR_EFORMAT, 0, "add_eos_token is set but there is no eos id");
    if (tok->add_sep && tok->sep < 0)
        return ar_err_set(err, AR_EFORMAT, 0,
                          "add_sep_token is set but there is no separator id "
                          "(tokenizer.ggml.seperator_token_id)");

    if ((st = setup_eog(tok)) != AR_OK || (st = setup_specials(tok)) != AR_OK)
        return st;
    setup_strip(tok, f);
    setup_bytes(tok);
    if (tok->kind == TOKENIZER_KIND_BPE &&
        ((st = setup_pairs(tok)) != AR_OK || (!tok->pairs && (st = setup_merge_hash(tok)))))
        return st;
    if ((st = setup_pieces(tok)) != AR_OK)
        return st;
    if (tok->kind == TOKENIZER_KIND_BPE && (st = compile_regexes(tok, err)) != AR_OK)
        return st;
    return load_chat(tok, f);
}

enum ar_status tokenizer_load(const struct gguf_file *f, struct tokenizer **out,
                              struct ar_err *err)
{
    return tokenizer_load_opts(f, NULL, out, err);
}

enum ar_status tokenizer_load_opts(const struct gguf_file *f, const struct tokenizer_opts *opts,
                                   struct tokenizer **out, struct ar_err *err)
{
    enum ar_status st;
    struct tokenizer *tok;
    if (!f || !out)
        return ar_err_set(err, AR_EINVAL, 0, "tokenizer_load: NULL argument");
    *out = NULL;
    /* checked for every vocabulary, so that a typo is caught on an SPM model too */
    if (opts && opts->pre && !tokenizer_pre_lookup(opts->pre, strlen(opts->pre)))
        return ar_err_set(err, AR_EINVAL, 0, "--tokenizer-pre: unknown pre-tokenizer '%.64s'",
                          opts->pre);
    tok = ar_calloc(1, sizeof(*tok));
    if (!tok)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    st = load(tok, f, opts ? opts->pre : NULL, err);
    if (st != AR_OK) {
        if (st == AR_ENOMEM)
            ar_err_set(err, AR_ENOMEM, 0, "out of memory loading the tokenizer");
        tokenizer_destroy(tok);
        return st;
    }
    *out = tok;
    return AR_OK;
}

void tokenizer_destroy(struct tokenizer *tok)
{
    if (!tok)
        return;
    for (int i = 0; i < tok->n_re; i++)
        pcre2_code_free(tok->re[i]);
    pcre2_general_context_free(tok->gctx);
    ar_free(tok->chat_template);
    ar_free(tok->eog);
    ar_free(tok->special_lens);
    ar_free(tok->special_prio);
    ar_free(tok->special);
    pair_tables_free(tok);
    ar_free(tok->merge_hash);
    ar_free(tok->merges);
    ar_free(tok->merge_text);
    ar_free(tok->hash);
    ar_free(tok->piece_len);
    ar_free(tok->piece_off);
    ar_free(tok->piece);
    ar_free(tok->attr);
    ar_free(tok->score);
    ar_free(tok->text_len);
    ar_free(tok->text_off);
    ar_free(tok->text);
    ar_free(tok);
}

/* ---- accessors ------------------------------------------------------------------------------- */

enum tokenizer_kind tokenizer_kind(const struct tokenizer *tok)
{
    return tok->kind;
}

int32_t tokenizer_n_vocab(const struct tokenizer *tok)
{
    return tok->n_vocab;
}

int32_t tokenizer_bos(const struct tokenizer *tok)
{
    return tok->bos;
}

int32_t tokenizer_eos(const struct tokenizer *tok)
{
    return tok->eos;
}

int32_t tokenizer_eot(const struct tokenizer *tok)
{
    return tok->eot;
}

int32_t tokenizer_unk(const struct tokenizer *tok)
{
    return tok->unk;
}

int32_t tokenizer_pad(const struct tokenizer *tok)
{
    return tok->pad;
}

bool tokenizer_add_bos(const struct tokenizer *tok)
{
    return tok->add_bos;
}

bool tokenizer_add_eos(const struct tokenizer *tok)
{
    return tok->add_eos;
}

bool tokenizer_is_eog(const struct tokenizer *tok, int32_t id)
{
    for (int32_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id)
            return true;
    return false;
}

unsigned tokenizer_token_attr(const struct tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab ? tok->attr[id] : 0;
}

const char *tokenizer_token_text(const struct tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || id >= tok->n_vocab)
        return NULL;
    if (len)
        *len = tok->text_len[id];
    return tok->text + tok->text_off[id];
}

const char *tokenizer_token_piece(const struct tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || id >= tok->n_vocab)
        return NULL;
    if (len)
        *len = tok->piece_len[id];
    return tok->piece + tok->piece_off[id];
}

enum tokenizer_chat tokenizer_chat_family(const struct tokenizer *tok)
{
    /* reported when a chat prompt is actually needed, not for every vocabulary loaded */
    if (!tok->chat_known && !atomic_flag_test_and_set(&warned_chat))
        AR_WARN("tokenizer: %s chat template, using ChatML",
                tok->chat_template ? "unrecognized" : "no");
    return tok->chat;
}

const char *tokenizer_chat_template(const struct tokenizer *tok)
{
    return tok->chat_template;
}
