/* tokenizer.h - text <-> token ids for GGUF vocabularies, and chat prompt formatting.
 *
 * Vocabularies come from the GGUF metadata keys tokenizer.ggml.*:
 *   model  "llama": SentencePiece-style (SPM). Tokens carry scores; text is split into UTF-8
 *          characters, spaces become U+2581, and adjacent symbols are merged best score
 *          first while the merged text is a vocabulary token. Characters that end up
 *          outside the vocabulary fall back to <0xNN> byte tokens.
 *   model  "gpt2": byte-level BPE. Text is cut into words by the pre-tokenizer regexes of
 *          tokenizer.ggml.pre (PCRE2), every byte is mapped to a printable code point
 *          (GPT-2's byte<->unicode table), and tokenizer.ggml.merges are applied lowest
 *          rank first inside each word.
 * token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
 * Control and unknown tokens are matched in input text only with parse_special, and are
 * never produced by merging ordinary text, so user text cannot inject "<|im_end|>".
 * User-defined tokens are always matched (as Hugging Face tokenizers do with added tokens).
 * Tokens whose text marks an end of turn (<|im_end|>, </s>, ...) count as control.
 *
 * The results follow llama.cpp's tokenizer for valid UTF-8 (the reference fixtures come from
 * it). Invalid UTF-8 never fails: SPM encodes stray bytes with byte fallback, byte-level BPE
 * maps every byte, and decode gives the bytes back unchanged.
 *
 * Thread safety: a loaded tokenizer is immutable; every function taking a const tokenizer
 * may be called from any number of threads at once. A tokenizer_stream belongs to one
 * thread at a time. */
#ifndef AR_TOKENIZER_H
#define AR_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "gguf/gguf.h"

struct tokenizer;

enum tokenizer_kind {
    TOKENIZER_KIND_SPM = 0, /* tokenizer.ggml.model = "llama" */
    TOKENIZER_KIND_BPE = 1  /* tokenizer.ggml.model = "gpt2" */
};

/* Token attribute bits (a token may carry several, e.g. a user-defined token promoted to
 * control because its text marks an end of turn). */
enum tokenizer_attr {
    TOKENIZER_ATTR_NORMAL = 1u << 0,
    TOKENIZER_ATTR_UNKNOWN = 1u << 1,
    TOKENIZER_ATTR_CONTROL = 1u << 2,
    TOKENIZER_ATTR_USER_DEFINED = 1u << 3,
    TOKENIZER_ATTR_UNUSED = 1u << 4,
    TOKENIZER_ATTR_BYTE = 1u << 5,
    TOKENIZER_ATTR_RSTRIP = 1u << 6 /* whitespace after this special token is dropped */
};

/* ---- loading ---------------------------------------------------------------------------- */

/* Builds a tokenizer from f's tokenizer.* metadata. Everything needed is copied: f may be
 * closed afterwards. The caller owns *out (tokenizer_destroy). Missing or inconsistent
 * metadata (no token list, arrays of different lengths, special ids out of range, unknown
 * model name, duplicate tokens, add_bos without a bos id) gives AR_EFORMAT and a message in
 * err. A byte-level BPE vocabulary is split by the pre-tokenizer that tokenizer.ggml.pre
 * names (any name llama.cpp's loader accepts; an absent key means "default", with a one-time
 * warning). An unknown name is refused (AR_EFORMAT, the message names it) rather than
 * replaced by a guess; a name known to llama.cpp whose tokenizer is not byte-level BPE here
 * (gemma4, sarvam-moe, whitespace, ...) gives AR_ENOTSUP. */
enum ar_status tokenizer_load(const struct gguf_file *f, struct tokenizer **out,
                              struct ar_err *err);

struct tokenizer_opts {
    /* pre-tokenizer to use instead of tokenizer.ggml.pre (BPE vocabularies; ignored for SPM),
     * or NULL. An unknown name gives AR_EINVAL. */
    const char *pre;
};
/* tokenizer_load with options; opts may be NULL. */
enum ar_status tokenizer_load_opts(const struct gguf_file *f, const struct tokenizer_opts *opts,
                                   struct tokenizer **out, struct ar_err *err);
/* True when name is a pre-tokenizer name that tokenizer_load accepts. */
bool tokenizer_pre_known(const char *name);
void tokenizer_destroy(struct tokenizer *tok);

enum tokenizer_kind tokenizer_kind(const struct tokenizer *tok);
int32_t tokenizer_n_vocab(const struct tokenizer *tok);
/* Special ids; -1 when the vocabulary has none. */
int32_t tokenizer_bos(const struct tokenizer *tok);
int32_t tokenizer_eos(const struct tokenizer *tok);
int32_t tokenizer_eot(const struct tokenizer *tok); /* end of turn (<|im_end|>, <|eot_id|>) */
int32_t tokenizer_unk(const struct tokenizer *tok);
int32_t tokenizer_pad(const struct tokenizer *tok);
bool tokenizer_add_bos(const struct tokenizer *tok); /* added by encode with add_special */
bool tokenizer_add_eos(const struct tokenizer *tok);
/* True for tokens that end generation: eos, eot and tokens whose text is a known end
 * marker (<|im_end|>, <|eot_id|>, <|endoftext|>, </s>, <|end|>, <end_of_turn>, ...). */
bool tokenizer_is_eog(const struct tokenizer *tok, int32_t id);
/* TOKENIZER_ATTR_* bits of id; 0 when id is out of range. */
unsigned tokenizer_token_attr(const struct tokenizer *tok, int32_t id);
/* Id of the token whose vocabulary text is exactly text[0..len), or -1. */
int32_t tokenizer_find(const struct tokenizer *tok, const char *text, size_t len);

/* Borrowed (valid until tokenizer_destroy), not NUL-terminated; NULL when id is out of
 * range. token_text: the raw vocabulary entry ("▁the", "Ġthe", "<0x0A>", "<|im_end|>").
 * token_piece: the bytes the token stands for ("▁"/"Ġ" as spaces, byte tokens as their
 * byte, control and user-defined tokens as their text). */
const char *tokenizer_token_text(const struct tokenizer *tok, int32_t id, size_t *len);
const char *tokenizer_token_piece(const struct tokenizer *tok, int32_t id, size_t *len);

/* ---- encoding --------------------------------------------------------------------------- */

/* Tokenizes text[0..len) (any bytes; NUL is an ordinary byte). add_special adds BOS/EOS as
 * the vocabulary asks (tokenizer_add_bos/eos), and the separator token after them when its
 * tokenizer.ggml.add_sep_token is true; parse_special matches control-token text such
 * as "<|im_start|>" to the token instead of spelling it out. On success *ids is a new array
 * of *n ids that the caller frees with ar_free (NULL when *n is 0). Linear time in len. */
enum ar_status tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len,
                                bool add_special, bool parse_special, int32_t **ids,
                                int64_t *n);
/* Same into the caller's ids[0..cap). *n is the number of ids the text needs; if that is
 * more than cap, returns AR_ERANGE and ids holds the first cap of them. */
enum ar_status tokenizer_encode_into(const struct tokenizer *tok, const char *text, size_t len,
                                     bool add_special, bool parse_special, int32_t *ids,
                                     int64_t cap, int64_t *n);

/* ---- decoding --------------------------------------------------------------------------- */

/* Concatenates the pieces of ids[0..n). SPM vocabularies with add_space_prefix drop one
 * leading space from the first rendered piece. Byte-level BPE vocabularies whose
 * pre-tokenizer asks for it (llama.cpp's clean_spaces: "default", "gpt-2", "llama-bpe", ...,
 * not "qwen2", "gpt-4o", "deepseek-v3", ...) then get the tokenization-space clean-up: the
 * space before '?', '!', '.', ',' is removed ("so far ...." -> "so far...."), " ' " becomes
 * "'", and the space before the contractions 's 'm 're 've is removed (not before 't 'd 'll). remove_special=false renders control tokens
 * as their text ("<|im_end|>"); remove_special=true drops control and unknown tokens.
 * Bytes are returned as they are (a truncated UTF-8 sequence stays truncated). On success
 * *out is a new NUL-terminated string of *len bytes (the caller frees it with ar_free).
 * AR_EINVAL if an id is out of range. */
enum ar_status tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, int64_t n,
                                bool remove_special, char **out, size_t *len);

/* Streaming detokenizer for generated tokens: emits only complete UTF-8 characters and
 * holds back an incomplete tail until the next token completes it, so every chunk is valid
 * UTF-8 on its own. Bytes that cannot start or continue a UTF-8 character are replaced by
 * U+FFFD (one per byte). For valid UTF-8 the concatenated chunks equal tokenizer_decode
 * without its space clean-up (pieces are sent as they come, as llama.cpp streams them).
 * Caller storage: tokenizer_stream_init, then push/flush, then tokenizer_stream_fini. */
struct tokenizer_stream {
    char *buf;          /* owned output buffer, grows as needed */
    size_t cap;         /* bytes allocated at buf */
    uint8_t hold[4];    /* incomplete UTF-8 tail carried to the next push */
    uint8_t n_hold;     /* bytes in hold (0..3) */
    bool at_start;      /* nothing rendered yet (SPM leading-space rule) */
    bool remove_special; /* as in tokenizer_decode */
};

void tokenizer_stream_init(struct tokenizer_stream *st, bool remove_special);
void tokenizer_stream_fini(struct tokenizer_stream *st);
/* Appends token id. *out and *len: the bytes ready to emit (possibly 0), borrowed from st and
 * valid until the next call on st. AR_EINVAL if id is out of range, AR_ENOMEM. */
enum ar_status tokenizer_stream_push(const struct tokenizer *tok, struct tokenizer_stream *st,
                                     int32_t id, const char **out, size_t *len);
/* Ends the stream: a held incomplete sequence is emitted as one U+FFFD. Same borrowing as
 * push. The stream can be reused afterwards (it is back at its start state). */
enum ar_status tokenizer_stream_flush(struct tokenizer_stream *st, const char **out,
                                      size_t *len);

/* ---- chat templates --------------------------------------------------------------------- */

/* Prompt formats, recognized from the Jinja text of tokenizer.chat_template by marker
 * strings (no Jinja is executed) the way llama.cpp recognizes its built-in formats, and
 * rendered exactly as llama.cpp's built-in (non-Jinja) formatter renders them. */
enum tokenizer_chat {
    TOKENIZER_CHAT_CHATML = 0, /* <|im_start|>role\ncontent<|im_end|>\n */
    TOKENIZER_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    TOKENIZER_CHAT_LLAMA2,     /* "llama2-sys": [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST]a</s> */
    TOKENIZER_CHAT_MISTRAL,    /* "llama2": [INST] user [/INST]reply</s> (system folded into the
                                * turn; Mistral's templates without <<SYS>>) */
    TOKENIZER_CHAT_GLM4,       /* "chatglm4": [gMASK]<sop><|role|>\ncontent (GLM-4) */
    TOKENIZER_CHAT_CHATGLM3,   /* [gMASK]sop<|role|>\n content (ChatGLM3) */
    TOKENIZER_CHAT_GLMEDGE,    /* <|role|>\ncontent (GLM-Edge) */
    TOKENIZER_CHAT_GEMMA,      /* <start_of_turn>user\ncontent<end_of_turn>\n; system folded into
                                * the first user turn, assistant called "model", trimmed */
    TOKENIZER_CHAT_PHI3,       /* <|role|>\ncontent<|end|>\n (Phi-3, and Phi-4-mini as llama.cpp
                                * renders it) */
    TOKENIZER_CHAT_PHI4,       /* <|im_start|>role<|im_sep|>content<|im_end|> */
    TOKENIZER_CHAT_QWEN3,      /* ChatML whose generation prompt ends in an empty think block
                                * ("<think>\n\n</think>\n\n": thinking off); llama.cpp calls it
                                * "chatml" */
    TOKENIZER_CHAT_COUNT
};

struct tokenizer_chat_msg {
    const char *role;    /* "system", "user", "assistant" (NUL-terminated) */
    const char *content; /* NUL-terminated */
};

/* Family of a template text (NULL or len 0: absent). Absent or unrecognized templates give
 * TOKENIZER_CHAT_CHATML and *known = false (known may be NULL). */
enum tokenizer_chat tokenizer_chat_detect(const char *tmpl, size_t len, bool *known);
/* llama.cpp's name of the format ("chatml", "llama2-sys", "chatglm4", "gemma", "phi3", ...;
 * QWEN3 is "chatml" too); never NULL. */
const char *tokenizer_chat_name(enum tokenizer_chat fam);
/* The format of a llama.cpp built-in name ("chatml" gives plain ChatML; our earlier names
 * "glm4" and "mistral" are accepted too); false when unknown. fam may be NULL. */
bool tokenizer_chat_from_name(const char *name, enum tokenizer_chat *fam);
/* Family of the model's tokenizer.chat_template, detected at load; an absent or unknown
 * template falls back to ChatML and is reported once per process (AR_WARN). */
enum tokenizer_chat tokenizer_chat_family(const struct tokenizer *tok);
/* Borrowed template text (NUL-terminated) or NULL when the file has none. */
const char *tokenizer_chat_template(const struct tokenizer *tok);

/* Renders msgs[0..n) in family fam. add_generation_prompt appends the opening of an
 * assistant turn (ChatML: "<|im_start|>assistant\n"). *out is a new NUL-terminated string of
 * *len bytes, freed by the caller with ar_free. AR_EINVAL on a NULL role or content. */
enum ar_status tokenizer_chat_format(enum tokenizer_chat fam,
                                     const struct tokenizer_chat_msg *msgs, size_t n,
                                     bool add_generation_prompt, char **out, size_t *len);
/* Strings that end an assistant turn in family fam (static storage); returns their count. */
int tokenizer_chat_stops(enum tokenizer_chat fam, const char *const **strs);
/* Token ids of those stop strings that are single tokens of tok, plus eos/eot, without
 * duplicates; writes at most cap of them and returns how many there are. */
int tokenizer_chat_stop_ids(const struct tokenizer *tok, enum tokenizer_chat fam, int32_t *ids,
                            int cap);

/* ---- think blocks ----------------------------------------------------------------------- */

/* Reasoning models (Qwen3, ...) may write "<think>...</think>" before their answer. These
 * remove every such block, and the whitespace right after its "</think>", from generated text,
 * so that only the answer reaches a reply. A block that is never closed hides the rest of
 * the text. The streaming form holds back only a possible start of a "<think>" tag (at most
 * 6 ASCII bytes), so its output stays valid UTF-8 when its input is.
 * Caller storage, zero-initialised or tokenizer_think_init; one thread at a time. */
struct tokenizer_think {
    uint8_t state;   /* outside, inside a block, or skipping whitespace after one */
    uint8_t matched; /* bytes of the tag being matched so far */
    char hold[8];    /* held start of a "<think>" tag (outside only) */
};

void tokenizer_think_init(struct tokenizer_think *t);
/* Filters in[0..n) into out, which must hold n + 8 bytes; returns the bytes written. */
size_t tokenizer_think_push(struct tokenizer_think *t, const char *in, size_t n, char *out);
/* End of text: writes what was held back (out holds 8 bytes), returns its length, and resets
 * t. */
size_t tokenizer_think_flush(struct tokenizer_think *t, char *out);
/* Whole-text form, in place: returns the new length (s is NUL-terminated there if it was
 * longer). */
size_t tokenizer_strip_think(char *s, size_t n);

#endif
