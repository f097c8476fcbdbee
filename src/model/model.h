/* model.h - transformer architectures (llama, qwen2) over GGUF weights: hyperparameters
 * from metadata, and one forward pass over a batch of tokens from many sequences.
 * The model is immutable after load and may be shared by threads; a model_ctx holds one
 * caller's scratch buffers and thread pool. */
#ifndef AR_MODEL_H
#define AR_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../base/pool.h"
#include "../gguf/gguf.h"
#include "../kv/kv.h"

enum model_arch { MODEL_ARCH_LLAMA, MODEL_ARCH_QWEN2 };

struct model_hparams {
    enum model_arch arch;
    int n_vocab;
    int n_embd;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;    /* n_embd / n_heads unless the file says otherwise */
    int n_ff;
    int n_ctx_train; /* <arch>.context_length */
    int rope_dim;    /* rotated dimensions per head */
    bool rope_neox;  /* qwen2: halves rotated; llama: adjacent pairs */
    float rope_freq_base;
    float rope_freq_scale; /* 1 / linear scaling factor */
    float rms_eps;
    bool tied_output; /* output matrix is token_embd */
};

struct model;

/* Opens and validates a GGUF model; the caller owns *out (model_destroy). Weights stay
 * mmapped and are never copied. */
enum ar_status model_load(const char *path, struct model **out, struct ar_err *err);
void model_destroy(struct model *m);
const struct model_hparams *model_hparams(const struct model *m);
/* The underlying file (for the tokenizer, inspect ...): borrowed, valid until destroy. */
const struct gguf_file *model_gguf(const struct model *m);
const char *model_arch_name(enum model_arch a);
/* Bytes of weights read for one decode step (all matrices once). */
uint64_t model_weight_bytes(const struct model *m);
/* KV geometry for this model with n_blocks blocks of block_tokens tokens of type type. */
void model_kv_params(const struct model *m, int block_tokens, int64_t n_blocks, enum ar_type type,
                     struct kv_params *out);

/* A batch: n_tokens rows, each (token, position, sequence index, want logits). Tokens of a
 * sequence must appear in increasing position order; each sequence's KV for all positions
 * below a token's position must already be filled or be earlier in this batch. */
struct model_batch {
    int n_tokens;
    const int32_t *tokens;  /* (n_tokens) */
    const int32_t *pos;     /* (n_tokens) */
    const int32_t *seq;     /* (n_tokens) index into the seqs array of model_forward */
    const uint8_t *logits;  /* (n_tokens) nonzero: produce logits for this row; NULL: last row only */
    int n_seqs;             /* optional: entries in seqs, so seq[] can be checked; 0: unchecked */
};

struct model_ctx;

/* Scratch for batches of up to n_batch_max tokens; pool may be NULL (single thread) and is
 * borrowed. The caller owns *out (model_ctx_destroy). */
enum ar_status model_ctx_create(const struct model *m, int n_batch_max, struct ar_pool *pool,
                                struct model_ctx **out);
void model_ctx_destroy(struct model_ctx *ctx);

/* Runs the batch: writes K/V of every row into its sequence's blocks (which must already be
 * reserved to cover the position), attends causally within each sequence, and writes
 * n_vocab logits for each row that asked for them, in row order, to logits
 * ((number of rows asking) x n_vocab floats). */
enum ar_status model_forward(struct model_ctx *ctx, struct kv_cache *kv, struct kv_seq *const *seqs,
                             const struct model_batch *b, float *logits);

#endif
