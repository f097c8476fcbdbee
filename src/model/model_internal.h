/* model_internal.h - shared inside model/ only: the loaded model (weight views into the
 * mapped GGUF file) used by the loader (model.c) and the forward pass (forward.c). */
#ifndef AR_MODEL_INTERNAL_H
#define AR_MODEL_INTERNAL_H

#include "model.h"

/* A weight matrix view: n_out rows of n_in elements of type `type`, row_size bytes apart.
 * GGUF ne[0] = n_in (row length), ne[1] = n_out. */
struct model_mat {
    const void *data; /* into the mapping */
    /* the rows packed for the kernels' packed gemm (kernels.h, "x16"), in the model's packed
     * region; NULL: the kernels read data */
    const void *packed;
    enum ar_type type;
    enum ar_type vec_type; /* kernels_vec_dot_type(type): what the input rows become */
    int64_t n_in;
    int64_t n_out;
    size_t row_size;
};

/* A fixed description of one architecture: what its layers contain and how they combine.
 * Everything else comes from the file's metadata and which tensors it holds. */
struct model_arch_desc {
    enum model_arch arch;
    const char *name;      /* general.architecture */
    bool rope_neox;        /* NEOX pairs (i, i + n_rot/2), else NORM pairs (2i, 2i+1) */
    enum model_act act;    /* FFN gate activation */
    bool fused_qkv;        /* attn_qkv: q rows, then k rows, then v rows (bias likewise) */
    bool fused_gate_up;    /* ffn_up holds the gate rows, then the up rows (no ffn_gate) */
    bool qk_norm;          /* per-head RMSNorm of q and k (attn_q_norm, attn_k_norm) */
    bool post_norms;       /* post_attention_norm and post_ffw_norm on each block's output */
    bool moe;              /* mixture-of-experts FFN (ffn_gate_inp, ffn_*_exps) */
    bool embd_scaled;      /* embeddings multiplied by sqrt(n_embd) */
    bool sliding_window;   /* gemma3's interleaved sliding-window layers */
    bool rope_factors;     /* LongRoPE factors (rope_factors_short/long), attn_factor */
};

/* The description of the architecture named s (len bytes), or NULL. */
const struct model_arch_desc *model_arch_find(const char *s, size_t len);
const struct model_arch_desc *model_arch_desc(enum model_arch a);

/* One rope configuration: layers of the same kind share it. */
struct model_rope {
    double *inv_freq; /* owned, (rope_dim / 2): freq_scale * base^(-2i/rope_dim) / factor_i */
    float mscale;     /* cos and sin are multiplied by it */
};

/* Experts a token may use (the passes keep their outputs' pointers on the stack). */
#define MODEL_MAX_EXPERTS_USED 64

struct model_layer {
    const float *attn_norm; /* (n_embd) */
    const float *ffn_norm;  /* (n_embd) */
    const float *bq;        /* (n_heads * head_dim) or NULL */
    const float *bk;        /* (n_kv_heads * head_dim) or NULL */
    const float *bv;        /* (n_kv_heads * head_dim) or NULL */
    const float *q_norm;    /* (head_dim) or NULL: per-head norm of q before rope */
    const float *k_norm;    /* (head_dim) or NULL */
    const float *post_attn_norm; /* (n_embd) or NULL: norm of the attention block's output */
    const float *post_ffn_norm;  /* (n_embd) or NULL: norm of the FFN block's output */
    struct model_mat wq;    /* n_embd -> n_heads * head_dim */
    struct model_mat wk;    /* n_embd -> n_kv_heads * head_dim */
    struct model_mat wv;    /* n_embd -> n_kv_heads * head_dim */
    struct model_mat wo;    /* n_heads * head_dim -> n_embd */
    /* dense FFN (n_expert == 0); views into a fused ffn_up where the file fuses them */
    struct model_mat wgate; /* n_embd -> n_ff */
    struct model_mat wup;   /* n_embd -> n_ff */
    struct model_mat wdown; /* n_ff -> n_embd */
    /* mixture of experts: router and, per expert e, views into the 3-D tensors */
    struct model_mat router;   /* n_embd -> n_expert */
    struct model_mat *exp_gate; /* owned, (n_expert): n_embd -> n_ff_exp */
    struct model_mat *exp_up;   /* owned, (n_expert): n_embd -> n_ff_exp */
    struct model_mat *exp_down; /* owned, (n_expert): n_ff_exp -> n_embd */
    int rope;       /* index into model.rope */
    int swa_window; /* 0: attends to every earlier position */
};

struct model {
    struct gguf_file *file; /* owned */
    const struct model_arch_desc *desc;
    struct model_hparams hp;
    struct model_mat tok_embd;  /* n_embd x n_vocab: row t is token t's embedding */
    struct model_mat output;    /* n_embd -> n_vocab (may be tok_embd's data) */
    const float *output_norm;   /* (n_embd) */
    struct model_layer *layers; /* owned, (n_layers) */
    uint8_t *swa_layers;        /* owned, (n_layers): 1 for a sliding-window layer */
    struct model_rope rope[2];  /* [0] global layers, [1] sliding-window layers (gemma3) */
    int n_rope;                 /* 1 or 2 */
    /* LongRoPE (phi3): rope[0] carries the short factors; this one the long factors, used
     * instead when the context exceeds n_ctx_orig (inv_freq NULL when the file has none) */
    struct model_rope rope_long;
    uint64_t weight_bytes;
    uint64_t active_weight_bytes;
    void *packed;        /* owned mapping holding every packed matrix (NULL: none packed) */
    size_t packed_size;  /* its bytes */
};

struct kernel_ops;
/* out[i] = act(gate[i]) * up[i] over n: SiLU through ops (the kernels' silu_mul), GELU(tanh)
 * in plain C. Both passes call it, so they agree bit for bit. */
void model_act_mul(const struct kernel_ops *ops, enum model_act act, int n, float *out,
                   const float *gate, const float *up);

/* Rope k (0 global, 1 sliding-window layers) for a context of n_ctx tokens: LongRoPE's long
 * factors replace the short ones beyond original_context_length, as llama.cpp chooses by its
 * context size. */
const struct model_rope *model_rope_for(const struct model *m, int k, int64_t n_ctx);
/* The (cos, sin) pairs of rope r at position pos into cs (rope_dim floats): angle
 * pos * inv_freq[i] in double, both multiplied by the rope's mscale. The kernels' rope
 * (kernels.h) rotates by them. */
void model_rope_table(const struct model *m, const struct model_rope *r, int32_t pos, float *cs);
/* A mixture-of-experts router: logits (n_expert, overwritten by their softmax) -> the
 * n_expert_used most probable experts, best first (lowest index on ties), in sel and their
 * probabilities renormalized to sum 1 in w. */
void model_moe_route(const struct kernel_ops *ops, const struct model_hparams *hp, float *logits,
                     int32_t *sel, float *w);
/* out = sum_j w[j] * outs[j] over the n_expert_used expert outputs (n_embd each), j in order. */
void model_moe_combine(const struct model_hparams *hp, const float *const *outs, const float *w,
                       float *out);

struct model_ctx;
/* The layers whose gate and up products took the fused stage (forward.c, stage_gu) in the
 * context's last model_forward: tests use it to know the fused path ran. */
int model_ctx_gu_fused(const struct model_ctx *c);

#endif
