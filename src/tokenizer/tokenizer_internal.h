/* tokenizer_internal.h - the tokenizer object and helpers shared by the files of
 * src/tokenizer/ (vocab.c loads, encode.c tokenizes, decode.c detokenizes, chat.c formats).
 * Not part of the module API. */
#ifndef AR_TOKENIZER_INTERNAL_H
#define AR_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/hash.h"
#include "base/utf8.h"
#include "tokenizer.h"

#define TOKENIZER_MAX_REGEX 8

/* Split rules of byte-level BPE vocabularies: each is a sequence of regexes (pretok.c). */
enum tokenizer_split {
    TOKENIZER_SPLIT_DEFAULT = 0,
    TOKENIZER_SPLIT_GPT2,
    TOKENIZER_SPLIT_LLAMA3,
    TOKENIZER_SPLIT_QWEN2,
    TOKENIZER_SPLIT_QWEN35,
    TOKENIZER_SPLIT_GPT4O,
    TOKENIZER_SPLIT_TEKKEN,
    TOKENIZER_SPLIT_GRANITE_MULTI,
    TOKENIZER_SPLIT_DEEPSEEK_LLM,
    TOKENIZER_SPLIT_DEEPSEEK_CODER,
    TOKENIZER_SPLIT_DEEPSEEK3,
    TOKENIZER_SPLIT_SPARK2_5,
    TOKENIZER_SPLIT_FALCON,
    TOKENIZER_SPLIT_STARCODER,
    TOKENIZER_SPLIT_BLOOM,
    TOKENIZER_SPLIT_VIKING,
    TOKENIZER_SPLIT_CHAMELEON,
    TOKENIZER_SPLIT_JAIS2,
    TOKENIZER_SPLIT_TINY_AYA,
    TOKENIZER_SPLIT_YOUTU,
    TOKENIZER_SPLIT_SUPERBPE,
    TOKENIZER_SPLIT_BAILINGMOE,
    TOKENIZER_SPLIT_SEED_CODER,
    TOKENIZER_SPLIT_LAGUNA,
    TOKENIZER_SPLIT_EXAONE_MOE,
    TOKENIZER_SPLIT_MINICPM5,
    TOKENIZER_SPLIT_AFMOE,
    TOKENIZER_SPLIT_KIMI_K2,
    TOKENIZER_SPLIT_COUNT
};

/* What a tokenizer.ggml.pre name brings besides its split (as the reference's loader). */
enum {
    TOKENIZER_PRE_IGNORE_MERGES = 1u << 0, /* a word that is a token is taken whole */
    TOKENIZER_PRE_ADD_BOS = 1u << 1,       /* BOS by default (add_bos_token may still say no) */
    TOKENIZER_PRE_KEEP_SPACES = 1u << 2,   /* no tokenization-space clean-up when detokenizing */
    TOKENIZER_PRE_UNSUPPORTED = 1u << 3    /* known name whose tokenizer is not implemented here */
};

struct tokenizer_pre_info {
    const char *name;
    enum tokenizer_split split;
    unsigned flags;
};

/* The entry of a tokenizer.ggml.pre name, or NULL (pretok.c). */
const struct tokenizer_pre_info *tokenizer_pre_lookup(const char *name, size_t len);
size_t tokenizer_pre_count(void);
const struct tokenizer_pre_info *tokenizer_pre_at(size_t i);
/* The regexes of a split rule, applied in sequence; returns their number. */
int tokenizer_split_patterns(enum tokenizer_split split, const char *const **re);

/* A merge by ids: key = left << 32 | right. */
struct tokenizer_pair {
    uint64_t key;
    int32_t rank, id; /* id: the merged token */
};
#define TOKENIZER_PAIR_EMPTY UINT64_MAX

static inline uint32_t tokenizer_pair_slot(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & mask;
}

static inline uint32_t tokenizer_pair_bit(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0xc2b2ae3d27d4eb4full) >> 40) & mask;
}

/* The merge of tokens l and r, or NULL. */
static inline const struct tokenizer_pair *tokenizer_pair_find(const struct tokenizer *tok,
                                                               int32_t l, int32_t r);

/* A two- or three-byte character that the merger by ids may start as one symbol instead of
 * its bytes (vocab.c's setup_chars says when that gives the same tokens). */
struct tokenizer_char {
    int32_t id;        /* the token the merges of its bytes alone end in */
    uint32_t left[8];  /* bit b set: may be taken whole after byte b */
    uint32_t right[8]; /* bit b set: may be taken whole before byte b */
};

/* One BPE merge "left right": both strings live in tokenizer.merge_text. */
struct tokenizer_merge {
    uint32_t off;   /* left starts at merge_text + off, right follows it directly */
    uint32_t n_left;
    uint32_t n_right;
};

struct tokenizer {
    enum tokenizer_kind kind;
    enum tokenizer_split split;
    bool clean_spaces; /* detokenize removes the spaces that tokenization put before " ." */
    int32_t n_vocab;

    char *text;          /* owned: every token's text, each followed by a NUL */
    uint32_t *text_off;  /* owned, (n_vocab) */
    uint32_t *text_len;  /* owned, (n_vocab) */
    /* BPE: the most characters of a token whose text starts with the table character of
     * byte b, [b]: a word of more bytes starting with b is no token */
    uint32_t max_len_first[256];
    float *score;        /* owned, (n_vocab) */
    uint8_t *attr;       /* owned, (n_vocab) TOKENIZER_ATTR_* bits */
    char *piece;         /* owned: decoded bytes of every token, back to back */
    uint32_t *piece_off; /* owned, (n_vocab) */
    uint32_t *piece_len; /* owned, (n_vocab) */

    int32_t *hash;       /* owned: open addressing over token texts, -1 = empty */
    uint32_t hash_mask;  /* slots - 1 (power of two) */

    char *merge_text;         /* owned */
    struct tokenizer_merge *merges; /* owned, (n_merges), index = rank */
    uint32_t n_merges;
    int32_t *merge_hash;      /* owned: ranks by (left, right), -1 = empty */
    uint32_t merge_mask;
    /* the same merges by token ids, when every byte and every merge result is a plain
     * token (real vocabularies): one probe of an inline table per candidate pair */
    struct tokenizer_pair
        *pairs; /* owned, (pair_mask + 1) slots, key TOKENIZER_PAIR_EMPTY = empty */
    uint32_t pair_mask;
    uint64_t *pair_bits;      /* owned: one bit per hash of every merge's key, small enough
                               * to stay in cache; a clear bit answers "no merge" at once */
    uint32_t pair_bits_mask;  /* bits - 1 */
    /* characters taken whole (real vocabularies: most Chinese characters, which then cost no
     * merges of their bytes): char_index[code point < 65536] is an index in chars or -1 */
    int32_t *char_index;           /* owned, (65536), or NULL */
    struct tokenizer_char *chars;  /* owned, (n_chars) */
    int32_t n_chars;
    char byte_text[256][2];   /* UTF-8 of the GPT-2 character of each byte (1 or 2 bytes) */
    int32_t byte_tok[256];    /* token of the GPT-2 character of each byte (pairs only) */
    int32_t byte_fallback[256][2]; /* plain tokens of that character's single bytes, or -1 */

    int32_t byte_id[256]; /* SPM byte fallback: token of each byte, -1 if none */
    int16_t unbyte[324];  /* BPE: code point -> byte of GPT-2's table, -1 if none */

    /* special tokens (control, user-defined, unknown) in matching priority order: longer
     * text first, then lower id */
    int32_t *special;      /* owned, (n_special) */
    int32_t *special_prio; /* owned, (n_vocab): index in special[], or -1 */
    int32_t n_special;
    uint32_t special_lens_off[257]; /* lengths of specials starting with byte b are */
    uint32_t *special_lens;         /* special_lens[off[b] .. off[b+1]) (owned, distinct) */

    bool add_bos, add_eos, add_sep, add_space_prefix, ignore_merges;
    int32_t bos, eos, eot, eom, unk, pad, sep; /* sep: the separator appended after EOS */
    int32_t *eog; /* owned, (n_eog) */
    int32_t n_eog;

    pcre2_code *re[TOKENIZER_MAX_REGEX];
    int n_re;
    pcre2_general_context *gctx;

    char *chat_template; /* owned, NUL-terminated, or NULL */
    enum tokenizer_chat chat;
    bool chat_known; /* the template was recognized (else ChatML is a fallback) */
};

static inline const struct tokenizer_pair *tokenizer_pair_find(const struct tokenizer *tok,
                                                               int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t b = tokenizer_pair_bit(key, tok->pair_bits_mask);
    if (!(tok->pair_bits[b >> 6] >> (b & 63) & 1))
        return NULL;
    for (uint32_t i = tokenizer_pair_slot(key, tok->pair_mask);; i = (i + 1) & tok->pair_mask) {
        const struct tokenizer_pair *p = &tok->pairs[i];
        if (p->key == key)
            return p;
        if (p->key == TOKENIZER_PAIR_EMPTY)
            return NULL;
    }
}

/* The pre-tokenizer's words of text[0..len) of a BPE vocabulary, before any merge and
 * without special-token matching: *spans is a new array (ar_free) of *n (start, length)
 * pairs. Defined in encode.c; tests use it to see the split. */
enum ar_status tokenizer_pre_split(const struct tokenizer *tok, const char *text, size_t len,
                                   uint32_t **spans, size_t *n);

/* Switches a BPE tokenizer from the merges by ids to the merges by text (which give the
 * same tokens, more slowly). Defined in vocab.c; tests compare the two. */
enum ar_status tokenizer_use_text_merges(struct tokenizer *tok);

/* Rank of merge (left, right), or -1. Defined in vocab.c. */
int32_t tokenizer_merge_rank(const struct tokenizer *tok, const char *left, size_t n_left,
                             const char *right, size_t n_right);

/* GPT-2 byte-level table: byte -> code point. */
static inline uint32_t tokenizer_byte_to_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    /* the others, in byte order, take 256, 257, ... */
    if (b <= 32)
        return 256u + b;
    if (b <= 160)
        return 256u + 33u + (b - 127u);
    return 256u + 33u + 34u; /* 173 */
}

#endif
