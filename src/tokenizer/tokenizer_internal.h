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

#define TOK_MAX_REGEX 8

/* Pre-tokenizers of byte-level BPE vocabularies (tokenizer.ggml.pre). */
enum tok_pre {
    TOK_PRE_DEFAULT = 0,
    TOK_PRE_GPT2,
    TOK_PRE_LLAMA3,
    TOK_PRE_QWEN2,
    TOK_PRE_DEEPSEEK_LLM,
    TOK_PRE_CHATGLM4, /* "glm4", "chatglm-bpe": Llama 3's split, merges kept, no implicit BOS */
    TOK_PRE_GPT4O     /* "gpt-4o" (Phi-4-mini): o200k split */
};

/* One BPE merge "left right": both strings live in tokenizer.merge_text. */
struct tok_merge {
    uint32_t off;   /* left starts at merge_text + off, right follows it directly */
    uint32_t n_left;
    uint32_t n_right;
};

struct tokenizer {
    enum tokenizer_kind kind;
    enum tok_pre pre;
    int32_t n_vocab;

    char *text;          /* owned: every token's text, each followed by a NUL */
    uint32_t *text_off;  /* owned, (n_vocab) */
    uint32_t *text_len;  /* owned, (n_vocab) */
    float *score;        /* owned, (n_vocab) */
    uint8_t *attr;       /* owned, (n_vocab) TOKENIZER_ATTR_* bits */
    char *piece;         /* owned: decoded bytes of every token, back to back */
    uint32_t *piece_off; /* owned, (n_vocab) */
    uint32_t *piece_len; /* owned, (n_vocab) */

    int32_t *hash;       /* owned: open addressing over token texts, -1 = empty */
    uint32_t hash_mask;  /* slots - 1 (power of two) */

    char *merge_text;         /* owned */
    struct tok_merge *merges; /* owned, (n_merges), index = rank */
    uint32_t n_merges;
    int32_t *merge_hash;      /* owned: ranks by (left, right), -1 = empty */
    uint32_t merge_mask;

    int32_t byte_id[256]; /* SPM byte fallback: token of each byte, -1 if none */
    int16_t unbyte[324];  /* BPE: code point -> byte of GPT-2's table, -1 if none */

    /* special tokens (control, user-defined, unknown) in matching priority order: longer
     * text first, then lower id */
    int32_t *special;      /* owned, (n_special) */
    int32_t *special_prio; /* owned, (n_vocab): index in special[], or -1 */
    int32_t n_special;
    uint32_t special_lens_off[257]; /* lengths of specials starting with byte b are */
    uint32_t *special_lens;         /* special_lens[off[b] .. off[b+1]) (owned, distinct) */

    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t bos, eos, eot, eom, unk, pad;
    int32_t *eog; /* owned, (n_eog) */
    int32_t n_eog;

    pcre2_code *re[TOK_MAX_REGEX];
    int n_re;
    pcre2_general_context *gctx;

    char *chat_template; /* owned, NUL-terminated, or NULL */
    enum tokenizer_chat chat;
    bool chat_known; /* the template was recognized (else ChatML is a fallback) */
};

/* Rank of merge (left, right), or -1. Defined in vocab.c. */
int32_t tok_merge_rank(const struct tokenizer *tok, const char *left, size_t n_left,
                       const char *right, size_t n_right);


/* GPT-2 byte-level table: byte -> code point. */
static inline uint32_t tok_byte_to_cp(uint8_t b)
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
