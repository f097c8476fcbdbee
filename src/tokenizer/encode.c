/* encode.c - text -> token ids: special-token partitioning, the SPM bigram merger and the
 * byte-level BPE merger with its PCRE2 pre-tokenizer. Both mergers keep their symbols in a
 * linked list and their candidate pairs in a binary heap, so text is encoded in
 * O(n log n) time with no per-word cache; the BPE merger by token ids starts the characters
 * that vocab.c allows whole as one symbol. */
#include <stdlib.h>

#include "tokenizer_internal.h"

#define TOKENIZER_MAX_INPUT ((size_t)1 << 30) /* spans are 32-bit; SPM escaping triples spaces */

/* ---- growable arrays ---------------------------------------------------------------------- */

struct ivec {
    int32_t *v; /* owned */
    int64_t n, cap;
};

static enum ar_status ivec_push(struct ivec *a, int32_t x)
{
    if (a->n == a->cap) {
        int64_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = ar_realloc(a->v, (size_t)cap * sizeof(int32_t));
        if (!v)
            return AR_ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return AR_OK;
}

/* Makes room for n elements of size bytes in *p (capacity *cap elements). */
static enum ar_status reserve(void **p, size_t *cap, size_t n, size_t size)
{
    size_t c;
    void *q;
    if (n <= *cap)
        return AR_OK;
    c = *cap ? *cap : 64;
    while (c < n)
        c *= 2;
    q = ar_realloc(*p, c * size);
    if (!q)
        return AR_ENOMEM;
    *p = q;
    *cap = c;
    return AR_OK;
}

struct span {
    uint32_t start, len;
};

/* A symbol of the merge list: text[start .. start + n) of the work buffer. */
struct sym {
    int32_t prev, next;
    uint32_t start, n;
    int32_t id; /* BPE by ids: the symbol's token */
};

/* A candidate merge of symbols left and right (adjacent when queued). Higher p first (SPM:
 * the merged token's score; BPE: minus the merge rank), then the leftmost. */
struct pair {
    double p;
    int32_t left, right;
    uint32_t size; /* bytes of the merged text when queued; stale if sizes changed */
    int32_t id;    /* BPE by ids: the merged token */
};

/* Scratch memory of one encode call, reused across fragments and words. */
struct work {
    char *buf;
    size_t buf_cap;
    struct sym *syms;
    size_t syms_cap;
    struct pair *heap;
    size_t heap_n, heap_cap;
    struct span *spans[2];
    size_t spans_cap[2];
    pcre2_match_data *md;
};

static void work_fini(struct work *w)
{
    ar_free(w->buf);
    ar_free(w->syms);
    ar_free(w->heap);
    ar_free(w->spans[0]);
    ar_free(w->spans[1]);
    pcre2_match_data_free(w->md);
}

/* ---- heap ----------------------------------------------------------------------------------- */

static bool pair_before(const struct pair *a, const struct pair *b)
{
    return a->p > b->p || (a->p == b->p && a->left < b->left);
}

static enum ar_status heap_push(struct work *w, struct pair x)
{
    size_t i;
    enum ar_status st = reserve((void **)&w->heap, &w->heap_cap, w->heap_n + 1, sizeof(x));
    if (st != AR_OK)
        return st;
    i = w->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&x, &w->heap[parent]))
            break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = x;
    return AR_OK;
}

static struct pair heap_pop(struct work *w)
{
    struct pair top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!pair_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

/* ---- symbol list ---------------------------------------------------------------------------- */

/* Splits buf[0..m) into one symbol per UTF-8 character (by lead byte, clipped at the end).
 * A lead byte whose continuation bytes are missing stands alone, so that invalid input
 * cannot swallow the first bytes of the next character (which would make byte fallback
 * lose an escaped space); valid UTF-8 splits exactly as the reference does. */
static enum ar_status split_chars(struct work *w, size_t m, int32_t *n_syms)
{
    int32_t n = 0;
    enum ar_status st = reserve((void **)&w->syms, &w->syms_cap, m, sizeof(struct sym));
    if (st != AR_OK)
        return st;
    for (size_t off = 0; off < m;) {
        size_t l = AR_MIN(ar_utf8_lax_len((uint8_t)w->buf[off]), m - off);
        for (size_t k = 1; k < l; k++)
            if (((uint8_t)w->buf[off + k] & 0xc0) != 0x80)
                l = 1;
        w->syms[n].start = (uint32_t)off;
        w->syms[n].n = (uint32_t)l;
        w->syms[n].prev = n - 1;
        off += l;
        w->syms[n].next = off == m ? -1 : n + 1;
        n++;
    }
    *n_syms = n;
    return AR_OK;
}

typedef enum ar_status (*pair_fn)(const struct tokenizer *tok, struct work *w, int32_t l,
                                  int32_t r);

/* Merges the best queued pair while one is left (both mergers share this loop). */
static enum ar_status merge_all(const struct tokenizer *tok, struct work *w, int32_t n_syms,
                                pair_fn add)
{
    enum ar_status st;
    w->heap_n = 0;
    for (int32_t i = 1; i < n_syms; i++)
        if ((st = add(tok, w, i - 1, i)) != AR_OK)
            return st;
    while (w->heap_n) {
        struct pair b = heap_pop(w);
        struct sym *l = &w->syms[b.left], *r = &w->syms[b.right];
        /* symbols only grow, so unchanged sizes mean the pair is still current */
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue;
        l->n += r->n;
        l->id = b.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->syms[r->next].prev = b.left;
        if ((st = add(tok, w, l->prev, b.left)) != AR_OK ||
            (st = add(tok, w, b.left, l->next)) != AR_OK)
            return st;
    }
    return AR_OK;
}

/* Token of text[0..len) for the mergers. Control and unknown tokens are left out: they come
 * only from special-token matching, never from spelling out ordinary text (so review text
 * cannot smuggle in "<|im_end|>"). */
static int32_t find_plain(const struct tokenizer *tok, const char *text, size_t len)
{
    int32_t id = tokenizer_find(tok, text, len);
    if (id >= 0 && (tok->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN)))
        return -1;
    return id;
}

/* ---- SPM ------------------------------------------------------------------------------------ */

static enum ar_status spm_pair(const struct tokenizer *tok, struct work *w, int32_t l, int32_t r)
{
    uint32_t size;
    int32_t id;
    struct pair p;
    if (l < 0 || r < 0)
        return AR_OK;
    size = w->syms[l].n + w->syms[r].n;
    id = find_plain(tok, w->buf + w->syms[l].start, size);
    if (id < 0)
        return AR_OK;
    p.p = (double)tok->score[id];
    p.left = l;
    p.right = r;
    p.size = size;
    p.id = -1;
    return heap_push(w, p);
}

static enum ar_status spm_encode(const struct tokenizer *tok, struct work *w, const char *text,
                                 size_t len, bool prefix, struct ivec *out)
{
    static const char space[3] = {'\xe2', '\x96', '\x81'}; /* U+2581 */
    size_t m = 0;
    int32_t n_syms;
    enum ar_status st = reserve((void **)&w->buf, &w->buf_cap, 3 * (len + 1), 1);
    if (st != AR_OK)
        return st;
    if (prefix) {
        memcpy(w->buf, space, 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->buf + m, space, 3);
            m += 3;
        } else {
            w->buf[m++] = text[i];
        }
    }
    if ((st = split_chars(w, m, &n_syms)) != AR_OK ||
        (st = merge_all(tok, w, n_syms, spm_pair)) != AR_OK)
        return st;
    for (int32_t i = n_syms ? 0 : -1; i >= 0; i = w->syms[i].next) {
        const struct sym *s = &w->syms[i];
        int32_t id = find_plain(tok, w->buf + s->start, s->n);
        if (id >= 0) {
            if ((st = ivec_push(out, id)) != AR_OK)
                return st;
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++) { /* byte fallback */
            int32_t b = tok->byte_id[(uint8_t)w->buf[s->start + j]];
            if (b >= 0 && (st = ivec_push(out, b)) != AR_OK)
                return st;
        }
    }
    return AR_OK;
}

/* ---- BPE ------------------------------------------------------------------------------------ */

static enum ar_status bpe_pair(const struct tokenizer *tok, struct work *w, int32_t l, int32_t r)
{
    int32_t rank;
    struct pair p;
    if (l < 0 || r < 0)
        return AR_OK;
    rank = tokenizer_merge_rank(tok, w->buf + w->syms[l].start, w->syms[l].n,
                                w->buf + w->syms[r].start, w->syms[r].n);
    if (rank < 0)
        return AR_OK;
    p.p = -(double)rank;
    p.left = l;
    p.right = r;
    p.size = w->syms[l].n + w->syms[r].n;
    p.id = -1;
    return heap_push(w, p);
}

static enum ar_status id_pair(const struct tokenizer *tok, struct work *w, int32_t l, int32_t r)
{
    const struct tokenizer_pair *m;
    struct pair p;
    if (l < 0 || r < 0 || !(m = tokenizer_pair_find(tok, w->syms[l].id, w->syms[r].id)))
        return AR_OK;
    p.p = -(double)m->rank;
    p.left = l;
    p.right = r;
    p.size = w->syms[l].n + w->syms[r].n;
    p.id = m->id;
    return heap_push(w, p);
}

/* The length of the character at u[i] of a word of len bytes when the merger may start it as
 * one symbol (a two- or three-byte character allowed between its neighbour bytes, see
 * vocab.c's setup_chars), its token in *id; else 0. */
static uint32_t whole_char(const struct tokenizer *tok, const uint8_t *u, size_t i, size_t len,
                           int32_t *id)
{
    const struct tokenizer_char *c;
    uint32_t cp;
    size_t n;
    int32_t k;
    if (u[i] < 0xc2 || u[i] >= 0xf0) /* not the lead byte of a 2- or 3-byte character */
        return 0;
    /* well-formed only: the table was built from such characters */
    if (!(n = ar_utf8_decode((const char *)u + i, len - i, &cp)) || (k = tok->char_index[cp]) < 0)
        return 0;
    c = &tok->chars[k];
    if (i > 0 && !(c->left[u[i - 1] >> 5] >> (u[i - 1] & 31) & 1))
        return 0;
    if (i + n < len && !(c->right[u[i + n] >> 5] >> (u[i + n] & 31) & 1))
        return 0;
    *id = c->id;
    return (uint32_t)n;
}

/* The first symbols of a word for the merger by ids: characters taken whole where allowed,
 * else single bytes. Returns their number; s has room for len. */
static int32_t first_syms(const struct tokenizer *tok, const char *word, size_t len,
                          struct sym *s)
{
    const uint8_t *u = (const uint8_t *)word;
    int32_t m = 0;
    for (size_t i = 0; i < len; m++) {
        int32_t id = tok->byte_tok[u[i]];
        uint32_t n = tok->char_index ? whole_char(tok, u, i, len, &id) : 0;
        s[m].start = (uint32_t)i;
        s[m].n = n ? n : 1;
        s[m].id = id;
        i += s[m].n;
    }
    return m;
}

/* The merger by token ids: one symbol per byte (each byte is one character of GPT-2's
 * table) or per character taken whole, merged as the string merger would, without building
 * or hashing any text. */
static enum ar_status bpe_word_ids(const struct tokenizer *tok, struct work *w, const char *word,
                                   size_t len, struct ivec *out)
{
    int32_t n;
    enum ar_status st = reserve((void **)&w->syms, &w->syms_cap, len, sizeof(struct sym));
    if (st != AR_OK)
        return st;
    n = first_syms(tok, word, len, w->syms);
    for (int32_t i = 0; i < n; i++) {
        w->syms[i].prev = i - 1;
        w->syms[i].next = i + 1 < n ? i + 1 : -1;
        /* the first pairs are independent lookups: start their memory loads together */
        if (i > 0) {
            uint64_t key = (uint64_t)(uint32_t)w->syms[i - 1].id << 32 | (uint32_t)w->syms[i].id;
            __builtin_prefetch(&tok->pair_bits[tokenizer_pair_bit(key, tok->pair_bits_mask) >> 6]);
        }
    }
    if ((st = merge_all(tok, w, n, id_pair)) != AR_OK)
        return st;
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->syms[i].next) {
        const struct sym *s = &w->syms[i];
        if (!(tok->attr[s->id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN))) {
            if ((st = ivec_push(out, s->id)) != AR_OK)
                return st;
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++) /* as the string path: its text's single bytes */
            for (int k = 0; k < 2; k++) {
                int32_t b = tok->byte_fallback[(uint8_t)word[s->start + j]][k];
                if (b >= 0 && (st = ivec_push(out, b)) != AR_OK)
                    return st;
            }
    }
    return AR_OK;
}

/* Encodes one pre-token word: bytes mapped through GPT-2's table, then merged. */
static enum ar_status bpe_word(const struct tokenizer *tok, struct work *w, const char *word,
                               size_t len, struct ivec *out)
{
    size_t m = 0;
    int32_t n_syms, id;
    enum ar_status st;
    bool whole = tok->ignore_merges;
    if (tok->pairs && len == 1) /* a single byte is its own token, whole or merged */
        return ivec_push(out, tok->byte_tok[(uint8_t)word[0]]);
    /* ignore_merges: a word is looked up whole first, unless no token starting with its
     * first byte is that long: long words, such as a Chinese clause, go straight to the
     * merger */
    if (tok->ignore_merges && len && len > tok->max_len_first[(uint8_t)word[0]])
        whole = false;
    if (tok->pairs && !whole)
        return bpe_word_ids(tok, w, word, len, out);
    if ((st = reserve((void **)&w->buf, &w->buf_cap, 2 * len + 1, 1)) != AR_OK)
        return st;
    for (size_t i = 0; i < len; i++) { /* 1 or 2 bytes each, as a 2-byte store */
        const char *c = tok->byte_text[(uint8_t)word[i]];
        memcpy(w->buf + m, c, 2);
        m += (size_t)(1 + ((uint8_t)c[0] >= 0x80));
    }
    if (whole && (id = find_plain(tok, w->buf, m)) >= 0)
        return ivec_push(out, id);
    if (tok->pairs)
        return bpe_word_ids(tok, w, word, len, out);
    if ((st = split_chars(w, m, &n_syms)) != AR_OK ||
        (st = merge_all(tok, w, n_syms, bpe_pair)) != AR_OK)
        return st;
    for (int32_t i = n_syms ? 0 : -1; i >= 0; i = w->syms[i].next) {
        const struct sym *s = &w->syms[i];
        id = find_plain(tok, w->buf + s->start, s->n);
        if (id >= 0) {
            if ((st = ivec_push(out, id)) != AR_OK)
                return st;
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++) { /* single bytes that are tokens, as reference */
            int32_t b = find_plain(tok, w->buf + s->start + j, 1);
            if (b >= 0 && (st = ivec_push(out, b)) != AR_OK)
                return st;
        }
    }
    return AR_OK;
}

static enum ar_status span_push(struct work *w, int k, size_t *n, uint32_t start, uint32_t len)
{
    enum ar_status st =
        reserve((void **)&w->spans[k], &w->spans_cap[k], *n + 1, sizeof(struct span));
    if (st != AR_OK)
        return st;
    w->spans[k][*n].start = start;
    w->spans[k][*n].len = len;
    (*n)++;
    return AR_OK;
}

/* Cuts text[seg] into the matches of re and the gaps between them, appended to spans[k]. */
static enum ar_status regex_split(const pcre2_code *re, struct work *w, const char *text,
                                  struct span seg, int k, size_t *n)
{
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + seg.start);
    size_t pos = 0, last = 0;
    enum ar_status st;
    while (pos < seg.len) {
        int rc = pcre2_match(re, subj, seg.len, pos, 0, w->md, NULL);
        PCRE2_SIZE *ov;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
            rc = pcre2_match(re, subj, seg.len, pos, PCRE2_NO_JIT, w->md, NULL);
        if (rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_HEAPLIMIT)
            return AR_ENOMEM;
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
            break; /* match limit or similar: the rest stays one piece */
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        ov = pcre2_get_ovector_pointer(w->md);
        if (ov[1] <= ov[0]) { /* empty match (a lookahead-only pattern): a split point */
            if (ov[0] > last &&
                (st = span_push(w, k, n, seg.start + (uint32_t)last, (uint32_t)(ov[0] - last))))
                return st;
            last = ov[0];
            if (ov[0] >= seg.len)
                break;
            pos = ov[0] + AR_MIN(ar_utf8_lax_len(subj[ov[0]]), seg.len - ov[0]);
            continue;
        }
        if (ov[0] > last &&
            (st = span_push(w, k, n, seg.start + (uint32_t)last, (uint32_t)(ov[0] - last))))
            return st;
        if ((st = span_push(w, k, n, seg.start + (uint32_t)ov[0], (uint32_t)(ov[1] - ov[0]))))
            return st;
        last = pos = ov[1];
    }
    if (last < seg.len &&
        (st = span_push(w, k, n, seg.start + (uint32_t)last, (uint32_t)(seg.len - last))))
        return st;
    return AR_OK;
}

/* Runs the pre-tokenizer's regexes in sequence over text[0..len): the words end up in
 * w->spans[*k][0 .. *n). */
static enum ar_status pre_split(const struct tokenizer *tok, struct work *w, const char *text,
                                size_t len, int *k, size_t *n)
{
    enum ar_status st;
    *k = 0;
    *n = 0;
    if (!w->md && !(w->md = pcre2_match_data_create(4, tok->gctx)))
        return AR_ENOMEM;
    if ((st = span_push(w, 0, n, 0, (uint32_t)len)) != AR_OK)
        return st;
    for (int r = 0; r < tok->n_re; r++) {
        size_t m = 0;
        for (size_t i = 0; i < *n; i++)
            if ((st = regex_split(tok->re[r], w, text, w->spans[*k][i], 1 - *k, &m)) != AR_OK)
                return st;
        *k = 1 - *k;
        *n = m;
    }
    return AR_OK;
}

static enum ar_status bpe_encode(const struct tokenizer *tok, struct work *w, const char *text,
                                 size_t len, struct ivec *out)
{
    enum ar_status st;
    size_t n;
    int k;
    if ((st = pre_split(tok, w, text, len, &k, &n)) != AR_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        struct span s = w->spans[k][i];
        if ((st = bpe_word(tok, w, text + s.start, s.len, out)) != AR_OK)
            return st;
    }
    return AR_OK;
}

enum ar_status tokenizer_pre_split(const struct tokenizer *tok, const char *text, size_t len,
                                   uint32_t **spans, size_t *n)
{
    struct work w;
    enum ar_status st;
    int k;
    *spans = NULL;
    *n = 0;
    if (!tok || tok->kind != TOKENIZER_KIND_BPE || (!text && len))
        return AR_EINVAL;
    if (len > TOKENIZER_MAX_INPUT)
        return AR_ERANGE;
    memset(&w, 0, sizeof(w));
    st = pre_split(tok, &w, text, len, &k, n);
    if (st == AR_OK && *n && !(*spans = ar_malloc(*n * 2 * sizeof(uint32_t))))
        st = AR_ENOMEM;
    for (size_t i = 0; st == AR_OK && i < *n; i++) {
        (*spans)[2 * i] = w.spans[k][i].start;
        (*spans)[2 * i + 1] = w.spans[k][i].len;
    }
    if (st != AR_OK)
        *n = 0;
    work_fini(&w);
    return st;
}

/* ---- special tokens ------------------------------------------------------------------------- */

/* A piece of the input: raw text [start, start + len) or one special token. */
struct frag {
    size_t start, len;
    int32_t id; /* -1 for text */
};

struct occ {
    int32_t prio, id;
    size_t pos;
};

static int cmp_occ(const void *a, const void *b)
{
    const struct occ *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio < y->prio ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int cmp_occ_pos(const void *a, const void *b)
{
    const struct occ *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static bool c_isspace(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static enum ar_status frag_push(struct frag **v, size_t *n, size_t *cap, size_t start,
                                size_t len, int32_t id)
{
    enum ar_status st = reserve((void **)v, cap, *n + 1, sizeof(struct frag));
    if (st != AR_OK)
        return st;
    (*v)[*n].start = start;
    (*v)[*n].len = len;
    (*v)[*n].id = id;
    (*n)++;
    return AR_OK;
}

/* Splits text into raw fragments and special tokens. Special tokens are taken in priority
 * order (longer text first): each takes its leftmost non-overlapping occurrences in text
 * that no earlier token took, so the result is the same as cutting the text token by token.
 * Without parse_special only user-defined tokens are matched. */
static enum ar_status partition(const struct tokenizer *tok, const char *text, size_t len,
                                bool parse_special, struct frag **frags, size_t *n_frags)
{
    struct occ *occ = NULL;
    size_t n_occ = 0, cap_occ = 0, n_acc = 0, cap_frag = 0, prev = 0;
    uint8_t *claimed = NULL; /* 1: part of a token, 2: whitespace stripped after one */
    enum ar_status st = AR_OK;

    *n_frags = 0;
    for (size_t p = 0; p < len && tok->n_special; p++) {
        uint8_t b = (uint8_t)text[p];
        for (uint32_t j = tok->special_lens_off[b]; j < tok->special_lens_off[b + 1]; j++) {
            uint32_t l = tok->special_lens[j];
            int32_t id;
            if (l == 0)
                break;
            if (l > len - p || (id = tokenizer_find(tok, text + p, l)) < 0 ||
                tok->special_prio[id] < 0)
                continue;
            if (!parse_special &&
                (tok->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN)))
                continue;
            if ((st = reserve((void **)&occ, &cap_occ, n_occ + 1, sizeof(*occ))) != AR_OK)
                goto done;
            occ[n_occ].prio = tok->special_prio[id];
            occ[n_occ].id = id;
            occ[n_occ].pos = p;
            n_occ++;
        }
    }
    if (n_occ == 0) {
        if (len)
            st = frag_push(frags, n_frags, &cap_frag, 0, len, -1);
        goto done;
    }

    claimed = ar_calloc(len, 1);
    if (!claimed) {
        st = AR_ENOMEM;
        goto done;
    }
    qsort(occ, n_occ, sizeof(*occ), cmp_occ);
    for (size_t i = 0; i < n_occ; i++) {
        size_t p = occ[i].pos, l = tok->text_len[occ[i].id], q;
        bool free_run = true;
        for (q = p; q < p + l && free_run; q++)
            free_run = claimed[q] == 0;
        if (!free_run)
            continue;
        memset(claimed + p, 1, l);
        if (tok->attr[occ[i].id] & TOKENIZER_ATTR_RSTRIP)
            for (q = p + l; q < len && !claimed[q] && c_isspace(text[q]); q++)
                claimed[q] = 2;
        occ[n_acc++] = occ[i];
    }
    qsort(occ, n_acc, sizeof(*occ), cmp_occ_pos);
    for (size_t i = 0; i <= n_acc; i++) {
        size_t end = i < n_acc ? occ[i].pos : len, a = prev, b = end;
        while (a < b && claimed[a])
            a++;
        while (b > a && claimed[b - 1])
            b--;
        if (a < b && (st = frag_push(frags, n_frags, &cap_frag, a, b - a, -1)) != AR_OK)
            goto done;
        if (i == n_acc)
            break;
        if ((st = frag_push(frags, n_frags, &cap_frag, occ[i].pos, 0, occ[i].id)) != AR_OK)
            goto done;
        prev = occ[i].pos + tok->text_len[occ[i].id];
    }
done:
    ar_free(claimed);
    ar_free(occ);
    return st;
}

/* ---- entry points --------------------------------------------------------------------------- */

static enum ar_status encode(const struct tokenizer *tok, const char *text, size_t len,
                             bool add_special, bool parse_special, struct ivec *out)
{
    struct frag *frags = NULL;
    size_t n_frags = 0;
    struct work w;
    bool prev_special = true; /* SPM: the text start counts as after a special token */
    enum ar_status st;

    if (!tok || (!text && len))
        return AR_EINVAL;
    if (len > TOKENIZER_MAX_INPUT)
        return AR_ERANGE;
    memset(&w, 0, sizeof(w));
    if ((st = partition(tok, text, len, parse_special, &frags, &n_frags)) != AR_OK)
        goto done;
    if (add_special && tok->add_bos && (st = ivec_push(out, tok->bos)) != AR_OK)
        goto done;
    for (size_t i = 0; i < n_frags; i++) {
        const struct frag *fr = &frags[i];
        if (fr->id >= 0) {
            st = ivec_push(out, fr->id);
            prev_special = true;
        } else if (tok->kind == TOKENIZER_KIND_SPM) {
            st = spm_encode(tok, &w, text + fr->start, fr->len,
                            tok->add_space_prefix && prev_special, out);
            prev_special = false;
        } else {
            st = bpe_encode(tok, &w, text + fr->start, fr->len, out);
        }
        if (st != AR_OK)
            goto done;
    }
    if (add_special && tok->add_eos && (st = ivec_push(out, tok->eos)) != AR_OK)
        goto done;
    if (add_special && tok->add_sep) /* after EOS, as the reference */
        st = ivec_push(out, tok->sep);
done:
    work_fini(&w);
    ar_free(frags);
    return st;
}

enum ar_status tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len,
                                bool add_special, bool parse_special, int32_t **ids,
                                int64_t *n)
{
    struct ivec out = {NULL, 0, 0};
    enum ar_status st;
    if (!ids || !n)
        return AR_EINVAL;
    *ids = NULL;
    *n = 0;
    st = encode(tok, text, len, add_special, parse_special, &out);
    if (st != AR_OK) {
        ar_free(out.v);
        return st;
    }
    if (out.n == 0) {
        ar_free(out.v);
        out.v = NULL;
    }
    *ids = out.v;
    *n = out.n;
    return AR_OK;
}

enum ar_status tokenizer_encode_into(const struct tokenizer *tok, const char *text, size_t len,
                                     bool add_special, bool parse_special, int32_t *ids,
                                     int64_t cap, int64_t *n)
{
    int32_t *v = NULL;
    int64_t m = 0;
    enum ar_status st;
    if (!n || cap < 0 || (!ids && cap))
        return AR_EINVAL;
    *n = 0;
    st = tokenizer_encode(tok, text, len, add_special, parse_special, &v, &m);
    if (st != AR_OK)
        return st;
    if (m && cap)
        memcpy(ids, v, (size_t)AR_MIN(m, cap) * sizeof(int32_t));
    ar_free(v);
    *n = m;
    return m > cap ? AR_ERANGE : AR_OK;
}
