/* model.h - transformer architectures (llama, qwen2, qwen3, qwen3moe, glm4, chatglm, gemma3,
 * phi3) over GGUF weights: hyperparameters from metadata, and one forward pass over a batch of
 * tokens from many sequences. What differs between the architectures is data (arch.c): which
 * norms sit where, rope style and rotated dimensions, fused projections, biases, dense or
 * mixture-of-experts FFN, the activation and scaling constants.
 * The model is immutable after load and may be shared by threads; a model_ctx holds one
 * caller's scratch buffers and thread pool. */
#ifndef AR_MODEL_H
#define AR_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "base/pool.h"
#include "gguf/gguf.h"
#include "kv/kv.h"

enum model_arch {
    MODEL_ARCH_LLAMA,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_QWEN3,
    MODEL_ARCH_QWEN3MOE,
    MODEL_ARCH_GLM4,
    MODEL_ARCH_CHATGLM,
    MODEL_ARCH_GEMMA3,
    MODEL_ARCH_PHI3,
    MODEL_ARCH_COUNT
};

/* The FFN's gate activation: out = act(gate) * up. */
enum model_act { MODEL_ACT_SILU, MODEL_ACT_GELU_TANH };

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
    int rope_dim;    /* rotated dimensions per head (the rest pass through) */
    bool rope_neox;  /* pairs (i, i + rope_dim/2); else adjacent pairs (2i, 2i+1) */
    float rope_freq_base;
    float rope_freq_scale; /* 1 / linear scaling factor (global layers) */
    float rope_freq_base_swa; /* sliding-window layers' base (gemma3); their scale is 1 */
    float rope_attn_factor;   /* cos and sin multiplied by it (phi3 LongRoPE), else 1 */
    int n_ctx_orig;           /* rope.scaling.original_context_length, 0 if absent */
    float rms_eps;
    bool tied_output; /* output matrix is token_embd */
    enum model_act act;
    float embd_scale;   /* embeddings multiplied by it (gemma3: sqrt(n_embd)), else 1 */
    int swa_window;     /* sliding-window layers see the query and window-1 earlier positions */
    int swa_pattern;    /* layer il is sliding iff swa_window and il % pattern < pattern - 1 */
    int n_expert;       /* 0: dense FFN */
    int n_expert_used;  /* experts per token (top-k of the router's softmax) */
    int n_ff_exp;       /* each expert's hidden width */
};

struct model;

/* Opens and validates a GGUF model; the caller owns *out (model_destroy). Weights stay
 * mmapped and are never copied. */
enum ar_status model_load(const char *path, struct model **out, struct ar_err *err);
/* The same over an opened file, which the model then owns (closed by model_destroy, or here
 * on failure). */
enum ar_status model_load_gguf(struct gguf_file *f, struct model **out, struct ar_err *err);
void model_destroy(struct model *m);
const struct model_hparams *model_hparams(const struct model *m);
/* The underlying file (for the tokenizer, inspect ...): borrowed, valid until destroy. */
const struct gguf_file *model_gguf(const struct model *m);
const char *model_arch_name(enum model_arch a);
/* Bytes of the copy of the matrices packed for the kernels (kernels.h, "x16"): 0 when none
 * is (no packed gemm for the matrices' types, or AR_PACK_WEIGHTS=0 at load). */
uint64_t model_packed_bytes(const struct model *m);
/* Bytes of all weight matrices in the file. */
uint64_t model_weight_bytes(const struct model *m);
/* Bytes of weights one token reads in a decode step: every dense matrix once, and of a
 * mixture-of-experts FFN only n_expert_used experts (the router always). Equals
 * model_weight_bytes for dense models. */
uint64_t model_active_weight_bytes(const struct model *m);
/* Floating-point operations (a multiply-add counts 2) of a prefill of n_tokens from position 0:
 * every row through every layer's matrices (a mixture: the used experts) but the last layer's
 * after its attention, which only the last row goes through, causal attention over the
 * positions each row sees (its window on sliding layers), logits of the last row. */
double model_prefill_flops(const struct model *m, int64_t n_tokens);
/* The matrix part of model_prefill_flops: the rows through the layers' matrices as counted
 * there and the last row's logits, without attention (the work the int8 gemm kernels do for
 * quantized weights). */
double model_prefill_matrix_flops(const struct model *m, int64_t n_tokens);
/* Whether layer il attends over a sliding window (hp->swa_window positions) only. */
bool model_layer_is_swa(const struct model_hparams *hp, int il);
/* KV geometry for this model with n_blocks blocks of block_tokens tokens of type type, its
 * sliding-window layers marked; one pool (set out->n_local_blocks for a local pool). */
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
/* The context length the caller runs sequences up to (its KV capacity per sequence). Only
 * LongRoPE models (phi3) depend on it: beyond their original_context_length they use the
 * long rope factors, as llama.cpp does. Unset (0): the short factors. */
void model_ctx_set_n_ctx(struct model_ctx *ctx, int64_t n_ctx);

/* Runs the batch: writes K/V of every row into its sequence's blocks (which must already be
 * reserved to cover the position), attends causally within each sequence, and writes
 * n_vocab logits for each row that asked for them, in row order, to logits
 * ((number of rows asking) x n_vocab floats). */
enum ar_status model_forward(struct model_ctx *ctx, struct kv_cache *kv, struct kv_seq *const *seqs,
                             const struct model_batch *b, float *logits);

/* The reference forward pass (reference.c): one sequence, one thread, every step of every
 * layer written out plainly, f32 K/V in its own buffers, scalar kernels. It is the readable
 * definition of each architecture; model_forward is held to it by tests. Runs tokens
 * [0, n) at positions 0..n-1 and writes n_vocab logits for every position to logits
 * (n x n_vocab). */
enum ar_status model_forward_reference(const struct model *m, const int32_t *tokens, int n,
                                       float *logits);

#endif
