/* model_internal.h - shared inside model/ only: the loaded model (weight views into the
 * mapped GGUF file) used by the loader (model.c) and the forward pass (forward.c). */
#ifndef AR_MODEL_INTERNAL_H
#define AR_MODEL_INTERNAL_H

#include "model.h"

/* A weight matrix view: n_out rows of n_in elements of type `type`, row_size bytes apart.
 * GGUF ne[0] = n_in (row length), ne[1] = n_out. */
struct model_mat {
    const void *data; /* into the mapping */
    enum ar_type type;
    enum ar_type vec_type; /* kernels_vec_dot_type(type): what the input rows become */
    int64_t n_in;
    int64_t n_out;
    size_t row_size;
};

struct model_layer {
    const float *attn_norm; /* (n_embd) */
    const float *ffn_norm;  /* (n_embd) */
    const float *bq;        /* (n_heads * head_dim) or NULL */
    const float *bk;        /* (n_kv_heads * head_dim) or NULL */
    const float *bv;        /* (n_kv_heads * head_dim) or NULL */
    struct model_mat wq;    /* n_embd -> n_heads * head_dim */
    struct model_mat wk;    /* n_embd -> n_kv_heads * head_dim */
    struct model_mat wv;    /* n_embd -> n_kv_heads * head_dim */
    struct model_mat wo;    /* n_heads * head_dim -> n_embd */
    struct model_mat wgate; /* n_embd -> n_ff */
    struct model_mat wup;   /* n_embd -> n_ff */
    struct model_mat wdown; /* n_ff -> n_embd */
};

struct model {
    struct gguf_file *file; /* owned */
    struct model_hparams hp;
    struct model_mat tok_embd;  /* n_embd x n_vocab: row t is token t's embedding */
    struct model_mat output;    /* n_embd -> n_vocab (may be tok_embd's data) */
    const float *output_norm;   /* (n_embd) */
    struct model_layer *layers; /* owned, (n_layers) */
    double *rope_inv_freq;      /* owned, (rope_dim / 2): freq_scale * base^(-2i/rope_dim) */
    uint64_t weight_bytes;
};

#endif
