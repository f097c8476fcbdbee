/* model.c - loading a transformer from GGUF: architecture and hyperparameters from the
 * metadata, every weight tensor located and checked (shape, type, size) against them, and
 * views into the mapping built once. The forward pass lives in forward.c. */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/kernels.h"

/* Sanity bounds for sizes read from files: large enough for any real model, small enough
 * that products of two of them cannot overflow 64-bit byte counts. */
#define MODEL_MAX_DIM (1 << 20)
#define MODEL_MAX_LAYERS 4096
#define MODEL_MAX_VOCAB (1 << 26)

/* ---- metadata ------------------------------------------------------------------------ */

/* Reads "<arch>.<suffix>" as an integer in [lo, hi]. Absent: *out = def and OK when
 * required is false, AR_EFORMAT otherwise. */
static enum ar_status read_int(const struct gguf_file *f, const char *arch, const char *suffix,
                               bool required, int64_t def, int64_t lo, int64_t hi, int *out,
                               struct ar_err *err)
{
    char key[128];
    int64_t v;
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) {
        if (required)
            return ar_err_set(err, AR_EFORMAT, 0, "missing metadata key %s", key);
        *out = (int)def;
        return AR_OK;
    }
    if (!gguf_get_i64(f, key, &v))
        return ar_err_set(err, AR_EFORMAT, 0, "metadata key %s is not a single integer", key);
    if (v < lo || v > hi)
        return ar_err_set(err, AR_EFORMAT, 0, "metadata key %s = %lld out of range [%lld, %lld]",
                          key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return AR_OK;
}

/* Reads "<arch>.<suffix>" as a float; absent: *out = def (found = false). */
static enum ar_status read_float(const struct gguf_file *f, const char *arch, const char *suffix,
                                 float def, float *out, bool *found, struct ar_err *err)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    *found = false;
    *out = def;
    if (!gguf_find(f, key))
        return AR_OK;
    if (!gguf_get_f32(f, key, out) || !isfinite(*out))
        return ar_err_set(err, AR_EFORMAT, 0, "metadata key %s is not a finite float", key);
    *found = true;
    return AR_OK;
}

static bool str_eq(struct gguf_str s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

static enum ar_status read_rope_scaling(const struct gguf_file *f, const char *arch,
                                        struct model_hparams *hp, struct ar_err *err)
{
    char key[128];
    struct gguf_str type = {"linear", 6}; /* the convention when the key is absent */
    float factor = 0.0f;
    bool found;
    enum ar_status st;
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    if (gguf_find(f, key) && !gguf_get_str(f, key, &type))
        return ar_err_set(err, AR_EFORMAT, 0, "metadata key %s is not a string", key);
    if (str_eq(type, "none")) {
        hp->rope_freq_scale = 1.0f;
        return AR_OK;
    }
    if (!str_eq(type, "linear"))
        return ar_err_set(err, AR_ENOTSUP, 0, "rope scaling type '%.*s' is not supported",
                          (int)AR_MIN(type.len, 64), type.ptr);
    if ((st = read_float(f, arch, "rope.scaling.factor", 0.0f, &factor, &found, err)) != AR_OK)
        return st;
    if (!found || factor == 0.0f)
        if ((st = read_float(f, arch, "rope.scale_linear", 0.0f, &factor, &found, err)) != AR_OK)
            return st;
    if (factor < 0.0f)
        return ar_err_set(err, AR_EFORMAT, 0, "negative rope scaling factor %g", (double)factor);
    hp->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    return AR_OK;
}

/* What only some families have: scaled embeddings, sliding-window layers, experts. */
static enum ar_status read_arch_extras(const struct gguf_file *f, const struct model_arch_desc *d,
                                       struct model_hparams *hp, struct ar_err *err)
{
    const char *arch = d->name;
    enum ar_status st;
    bool found;
    hp->embd_scale = d->embd_scaled ? sqrtf((float)hp->n_embd) : 1.0f;
    hp->rope_freq_base_swa = hp->rope_freq_base;
    if (d->sliding_window) {
        /* llama.cpp's defaults when the converter leaves the keys out: every 6th layer global,
         * local base 10000 */
        if ((st = read_int(f, arch, "attention.sliding_window", true, 0, 1, INT32_MAX,
                           &hp->swa_window, err)) != AR_OK ||
            (st = read_int(f, arch, "attention.sliding_window_pattern", false, 6, 1,
                           MODEL_MAX_LAYERS, &hp->swa_pattern, err)) != AR_OK ||
            (st = read_float(f, arch, "rope.freq_base_swa", 10000.0f, &hp->rope_freq_base_swa,
                             &found, err)) != AR_OK)
            return st;
        if (!(hp->rope_freq_base_swa > 0.0f))
            return ar_err_set(err, AR_EFORMAT, 0, "rope.freq_base_swa %g is not positive",
                              (double)hp->rope_freq_base_swa);
    }
    if (d->moe) {
        if ((st = read_int(f, arch, "expert_count", true, 0, 1, 4096, &hp->n_expert, err)) !=
                AR_OK ||
            /* real models use 2..8 experts a token; both passes keep them on the stack */
            (st = read_int(f, arch, "expert_used_count", true, 0, 1,
                           AR_MIN(hp->n_expert, MODEL_MAX_EXPERTS_USED), &hp->n_expert_used,
                           err)) != AR_OK ||
            (st = read_int(f, arch, "expert_feed_forward_length", true, 0, 1, MODEL_MAX_DIM,
                           &hp->n_ff_exp, err)) != AR_OK)
            return st;
    }
    return AR_OK;
}

static enum ar_status read_hparams(const struct gguf_file *f, struct model_hparams *hp,
                                   const struct model_arch_desc **desc, struct ar_err *err)
{
    const struct model_arch_desc *d;
    struct gguf_str arch_s;
    const char *arch;
    const struct gguf_arr *tokens;
    enum ar_status st;
    bool found;
    int vocab = 0, value_len;

    memset(hp, 0, sizeof(*hp));
    if (!gguf_get_str(f, "general.architecture", &arch_s))
        return ar_err_set(err, AR_EFORMAT, 0, "missing metadata key general.architecture");
    if (!(d = model_arch_find(arch_s.ptr, arch_s.len)))
        return ar_err_set(err, AR_ENOTSUP, 0, "unsupported architecture '%.*s'",
                          (int)AR_MIN(arch_s.len, 64), arch_s.ptr);
    *desc = d;
    hp->arch = d->arch;
    hp->rope_neox = d->rope_neox;
    hp->act = d->act;
    arch = d->name;

    if ((st = read_int(f, arch, "embedding_length", true, 0, 1, MODEL_MAX_DIM, &hp->n_embd,
                       err)) != AR_OK ||
        (st = read_int(f, arch, "block_count", true, 0, 1, MODEL_MAX_LAYERS, &hp->n_layers,
                       err)) != AR_OK ||
        (st = read_int(f, arch, "feed_forward_length", true, 0, 1, MODEL_MAX_DIM, &hp->n_ff,
                       err)) != AR_OK ||
        (st = read_int(f, arch, "attention.head_count", true, 0, 1, MODEL_MAX_DIM, &hp->n_heads,
                       err)) != AR_OK ||
        (st = read_int(f, arch, "attention.head_count_kv", false, hp->n_heads, 1, hp->n_heads,
                       &hp->n_kv_heads, err)) != AR_OK ||
        (st = read_int(f, arch, "context_length", true, 0, 1, INT32_MAX, &hp->n_ctx_train,
                       err)) != AR_OK)
        return st;
    if (hp->n_heads % hp->n_kv_heads != 0)
        return ar_err_set(err, AR_EFORMAT, 0, "head_count %d is not a multiple of head_count_kv %d",
                          hp->n_heads, hp->n_kv_heads);
    if ((st = read_int(f, arch, "attention.key_length", false, 0, 1, MODEL_MAX_DIM / hp->n_heads,
                       &hp->head_dim, err)) != AR_OK)
        return st;
    if (hp->head_dim == 0) {
        if (hp->n_embd % hp->n_heads != 0)
            return ar_err_set(err, AR_EFORMAT, 0,
                              "embedding_length %d is not a multiple of head_count %d",
                              hp->n_embd, hp->n_heads);
        hp->head_dim = hp->n_embd / hp->n_heads;
    }
    if ((st = read_int(f, arch, "attention.value_length", false, hp->head_dim, 1, MODEL_MAX_DIM,
                       &value_len, err)) != AR_OK)
        return st;
    if (value_len != hp->head_dim)
        return ar_err_set(err, AR_ENOTSUP, 0, "value_length %d != key_length %d is not supported",
                          value_len, hp->head_dim);
    if ((st = read_int(f, arch, "rope.dimension_count", false, hp->head_dim, 2, hp->head_dim,
                       &hp->rope_dim, err)) != AR_OK)
        return st;
    if (hp->rope_dim % 2 != 0)
        return ar_err_set(err, AR_EFORMAT, 0, "rope.dimension_count %d is odd", hp->rope_dim);

    if ((st = read_float(f, arch, "attention.layer_norm_rms_epsilon", 0.0f, &hp->rms_eps, &found,
                         err)) != AR_OK)
        return st;
    if (!found)
        return ar_err_set(err, AR_EFORMAT, 0, "missing metadata key %s.attention.layer_norm_rms_epsilon",
                          arch);
    if (!(hp->rms_eps > 0.0f))
        return ar_err_set(err, AR_EFORMAT, 0, "rms epsilon %g is not positive", (double)hp->rms_eps);
    if ((st = read_float(f, arch, "rope.freq_base", 10000.0f, &hp->rope_freq_base, &found,
                         err)) != AR_OK)
        return st;
    if (!(hp->rope_freq_base > 0.0f))
        return ar_err_set(err, AR_EFORMAT, 0, "rope.freq_base %g is not positive",
                          (double)hp->rope_freq_base);
    if ((st = read_rope_scaling(f, arch, hp, err)) != AR_OK)
        return st;
    if ((st = read_float(f, arch, "rope.scaling.attn_factor", 1.0f, &hp->rope_attn_factor, &found,
                         err)) != AR_OK)
        return st;
    if (!(hp->rope_attn_factor > 0.0f))
        return ar_err_set(err, AR_EFORMAT, 0, "rope.scaling.attn_factor %g is not positive",
                          (double)hp->rope_attn_factor);
    if ((st = read_int(f, arch, "rope.scaling.original_context_length", false, 0, 0, INT32_MAX,
                       &hp->n_ctx_orig, err)) != AR_OK)
        return st;
    if ((st = read_arch_extras(f, d, hp, err)) != AR_OK)
        return st;

    /* vocabulary: <arch>.vocab_size, else the token list; checked against token_embd later */
    if ((st = read_int(f, arch, "vocab_size", false, 0, 1, MODEL_MAX_VOCAB, &vocab, err)) != AR_OK)
        return st;
    if (vocab == 0 && gguf_get_arr(f, "tokenizer.ggml.tokens", &tokens)) {
        if (tokens->n < 1 || tokens->n > MODEL_MAX_VOCAB)
            return ar_err_set(err, AR_EFORMAT, 0, "tokenizer.ggml.tokens has %llu entries",
                              (unsigned long long)tokens->n);
        vocab = (int)tokens->n;
    }
    hp->n_vocab = vocab; /* 0: take token_embd's row count */
    return AR_OK;
}

/* ---- tensors ------------------------------------------------------------------------- */

static const struct gguf_tensor *find_tensor(const struct gguf_file *f, char *name, size_t size,
                                             int layer, const char *what)
{
    if (layer >= 0)
        snprintf(name, size, "blk.%d.%s", layer, what);
    else
        snprintf(name, size, "%s", what);
    return gguf_find_tensor(f, name);
}

static bool shape_is(const struct gguf_tensor *t, int64_t ne0, int64_t ne1)
{
    return t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1;
}

/* Checks tensor t (name) as n_out rows of n_in elements: type, row size, byte size. */
static enum ar_status check_mat(const struct gguf_tensor *t, const char *name, int64_t n_in,
                                int64_t n_out, struct model_mat *out, struct ar_err *err)
{
    const struct kernel_ops *ops = kernels_get();
    enum ar_type vt;
    size_t row;
    if ((unsigned)t->type >= AR_TYPE_COUNT || !ar_type_info(t->type)->supported ||
        (vt = kernels_vec_dot_type(t->type)) == AR_TYPE_COUNT || !ops->gemm[t->type] ||
        !ops->to_float[t->type] || (vt != AR_TYPE_F32 && !ops->from_float[vt]))
        return ar_err_set(err, AR_ENOTSUP, 0, "tensor %s has unsupported type %s", name,
                          ar_type_name(t->type));
    row = ar_type_row_size(t->type, n_in);
    if (!row || !ar_type_row_size(vt, n_in))
        return ar_err_set(err, AR_EFORMAT, 0,
                          "tensor %s: row length %lld is not a multiple of the %s block size",
                          name, (long long)n_in, ar_type_name(t->type));
    if (t->size != (uint64_t)row * (uint64_t)n_out || !t->data)
        return ar_err_set(err, AR_EFORMAT, 0, "tensor %s has %llu bytes, expected %llu", name,
                          (unsigned long long)t->size,
                          (unsigned long long)((uint64_t)row * (uint64_t)n_out));
    out->data = t->data;
    out->type = t->type;
    out->vec_type = vt;
    out->n_in = n_in;
    out->n_out = n_out;
    out->row_size = row;
    return AR_OK;
}

/* Locates a weight matrix n_in -> n_out and checks shape, type and byte size. n_out < 0
 * accepts any row count (token_embd before the vocabulary size is known). */
static enum ar_status load_mat(const struct gguf_file *f, int layer, const char *what,
                               int64_t n_in, int64_t n_out, struct model_mat *out,
                               struct ar_err *err)
{
    char name[96];
    const struct gguf_tensor *t = find_tensor(f, name, sizeof(name), layer, what);
    if (!t)
        return ar_err_set(err, AR_EFORMAT, 0, "missing tensor %s", name);
    if (n_out < 0)
        n_out = t->ne[1];
    if (!shape_is(t, n_in, n_out) || n_out < 1)
        return ar_err_set(err, AR_EFORMAT, 0,
                          "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                          name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                          (long long)t->ne[3], (long long)n_in, (long long)n_out);
    return check_mat(t, name, n_in, n_out, out, err);
}

/* Locates an F32 vector of n elements (norm weights, biases). Absent: *out = NULL, which is
 * an error only when required. */
static enum ar_status load_vec(const struct gguf_file *f, int layer, const char *what, int64_t n,
                               bool required, const float **out, struct ar_err *err)
{
    char name[96];
    const struct gguf_tensor *t = find_tensor(f, name, sizeof(name), layer, what);
    *out = NULL;
    if (!t)
        return required ? ar_err_set(err, AR_EFORMAT, 0, "missing tensor %s", name) : AR_OK;
    if (!shape_is(t, n, 1))
        return ar_err_set(err, AR_EFORMAT, 0,
                          "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld]", name,
                          (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                          (long long)t->ne[3], (long long)n);
    if (t->type != AR_TYPE_F32)
        return ar_err_set(err, AR_ENOTSUP, 0, "tensor %s has type %s, expected f32", name,
                          ar_type_name(t->type));
    if (t->size != (uint64_t)n * 4 || !t->data || (uintptr_t)t->data % 4 != 0)
        return ar_err_set(err, AR_EFORMAT, 0, "tensor %s: bad size or alignment", name);
    *out = t->data;
    return AR_OK;
}

static uint64_t mat_bytes(const struct model_mat *w)
{
    return (uint64_t)w->row_size * (uint64_t)w->n_out;
}

/* Rows [r0, r0 + n) of w as a matrix of their own (a view: fused projections are stored as
 * one tensor whose rows are the parts one after another). */
static struct model_mat mat_rows(const struct model_mat *w, int64_t r0, int64_t n)
{
    struct model_mat v = *w;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_size;
    v.n_out = n;
    return v;
}

/* A 3-D expert tensor: n_expert matrices n_in -> n_out one after another (GGUF ne
 * {n_in, n_out, n_expert}); out[e] views expert e. */
static enum ar_status load_experts(const struct gguf_file *f, int layer, const char *what,
                                   int64_t n_in, int64_t n_out, int n_expert,
                                   struct model_mat **out, struct ar_err *err)
{
    char name[96];
    const struct gguf_tensor *t = find_tensor(f, name, sizeof(name), layer, what);
    struct model_mat all;
    enum ar_status st;
    if (!t)
        return ar_err_set(err, AR_EFORMAT, 0, "missing tensor %s", name);
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_expert || t->ne[3] != 1)
        return ar_err_set(err, AR_EFORMAT, 0,
                          "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %d]",
                          name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                          (long long)t->ne[3], (long long)n_in, (long long)n_out, n_expert);
    /* checked as one matrix of n_expert * n_out rows, then cut into experts */
    if ((st = check_mat(t, name, n_in, n_out * n_expert, &all, err)) != AR_OK)
        return st;
    if (!(*out = ar_calloc((size_t)n_expert, sizeof(**out))))
        return AR_ENOMEM;
    for (int e = 0; e < n_expert; e++)
        (*out)[e] = mat_rows(&all, (int64_t)e * n_out, n_out);
    return AR_OK;
}

/* Attention weights: separate q/k/v (with optional biases) or one fused qkv tensor. */
static enum ar_status load_attention(const struct gguf_file *f, const struct model_arch_desc *d,
                                     const struct model_hparams *hp, int l,
                                     struct model_layer *L, struct ar_err *err)
{
    int64_t n_q = (int64_t)hp->n_heads * hp->head_dim;
    int64_t n_kv = (int64_t)hp->n_kv_heads * hp->head_dim;
    enum ar_status st;
    if (d->fused_qkv) {
        struct model_mat qkv;
        const float *b;
        if ((st = load_mat(f, l, "attn_qkv.weight", hp->n_embd, n_q + 2 * n_kv, &qkv, err)) ||
            (st = load_vec(f, l, "attn_qkv.bias", n_q + 2 * n_kv, false, &b, err)))
            return st;
        L->wq = mat_rows(&qkv, 0, n_q);
        L->wk = mat_rows(&qkv, n_q, n_kv);
        L->wv = mat_rows(&qkv, n_q + n_kv, n_kv);
        if (b) {
            L->bq = b;
            L->bk = b + n_q;
            L->bv = b + n_q + n_kv;
        }
    } else if ((st = load_vec(f, l, "attn_q.bias", n_q, false, &L->bq, err)) ||
               (st = load_vec(f, l, "attn_k.bias", n_kv, false, &L->bk, err)) ||
               (st = load_vec(f, l, "attn_v.bias", n_kv, false, &L->bv, err)) ||
               (st = load_mat(f, l, "attn_q.weight", hp->n_embd, n_q, &L->wq, err)) ||
               (st = load_mat(f, l, "attn_k.weight", hp->n_embd, n_kv, &L->wk, err)) ||
               (st = load_mat(f, l, "attn_v.weight", hp->n_embd, n_kv, &L->wv, err))) {
        return st;
    }
    if ((st = load_mat(f, l, "attn_output.weight", n_q, hp->n_embd, &L->wo, err)))
        return st;
    if (d->qk_norm &&
        ((st = load_vec(f, l, "attn_q_norm.weight", hp->head_dim, true, &L->q_norm, err)) ||
         (st = load_vec(f, l, "attn_k_norm.weight", hp->head_dim, true, &L->k_norm, err))))
        return st;
    if (d->post_norms &&
        (st = load_vec(f, l, "post_attention_norm.weight", hp->n_embd, true, &L->post_attn_norm,
                       err)))
        return st;
    return AR_OK;
}

/* FFN weights: dense (separate or fused gate+up) or a router and experts. */
static enum ar_status load_ffn(const struct gguf_file *f, const struct model_arch_desc *d,
                               const struct model_hparams *hp, int l, struct model_layer *L,
                               struct ar_err *err)
{
    enum ar_status st;
    if (d->post_norms &&
        (st = load_vec(f, l, "post_ffw_norm.weight", hp->n_embd, true, &L->post_ffn_norm, err)))
        return st;
    if (d->moe) {
        if ((st = load_mat(f, l, "ffn_gate_inp.weight", hp->n_embd, hp->n_expert, &L->router,
                           err)) ||
            (st = load_experts(f, l, "ffn_gate_exps.weight", hp->n_embd, hp->n_ff_exp,
                               hp->n_expert, &L->exp_gate, err)) ||
            (st = load_experts(f, l, "ffn_up_exps.weight", hp->n_embd, hp->n_ff_exp,
                               hp->n_expert, &L->exp_up, err)) ||
            (st = load_experts(f, l, "ffn_down_exps.weight", hp->n_ff_exp, hp->n_embd,
                               hp->n_expert, &L->exp_down, err)))
            return st;
        return AR_OK;
    }
    if (d->fused_gate_up) {
        struct model_mat gu;
        if ((st = load_mat(f, l, "ffn_up.weight", hp->n_embd, 2 * (int64_t)hp->n_ff, &gu, err)))
            return st;
        L->wgate = mat_rows(&gu, 0, hp->n_ff);
        L->wup = mat_rows(&gu, hp->n_ff, hp->n_ff);
    } else if ((st = load_mat(f, l, "ffn_gate.weight", hp->n_embd, hp->n_ff, &L->wgate, err)) ||
               (st = load_mat(f, l, "ffn_up.weight", hp->n_embd, hp->n_ff, &L->wup, err))) {
        return st;
    }
    return load_mat(f, l, "ffn_down.weight", hp->n_ff, hp->n_embd, &L->wdown, err);
}

/* Bytes of layer L's matrices, counting n_experts of its experts. */
static uint64_t layer_bytes(const struct model_layer *L, int n_experts)
{
    uint64_t b = mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo);
    if (!L->exp_gate)
        return b + mat_bytes(&L->wgate) + mat_bytes(&L->wup) + mat_bytes(&L->wdown);
    return b + mat_bytes(&L->router) +
           (uint64_t)n_experts * (mat_bytes(&L->exp_gate[0]) + mat_bytes(&L->exp_up[0]) +
                                  mat_bytes(&L->exp_down[0]));
}

static enum ar_status load_tensors(struct model *m, struct ar_err *err)
{
    const struct gguf_file *f = m->file;
    const struct model_arch_desc *d = m->desc;
    struct model_hparams *hp = &m->hp;
    enum ar_status st;

    if ((st = load_mat(f, -1, "token_embd.weight", hp->n_embd, hp->n_vocab ? hp->n_vocab : -1,
                       &m->tok_embd, err)) != AR_OK)
        return st;
    if (m->tok_embd.n_out > MODEL_MAX_VOCAB)
        return ar_err_set(err, AR_EFORMAT, 0, "token_embd.weight has too many rows");
    hp->n_vocab = (int)m->tok_embd.n_out;
    if ((st = load_vec(f, -1, "output_norm.weight", hp->n_embd, true, &m->output_norm, err)) !=
        AR_OK)
        return st;
    if (gguf_find_tensor(f, "output.weight")) {
        if ((st = load_mat(f, -1, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err)) !=
            AR_OK)
            return st;
        hp->tied_output = false;
    } else {
        m->output = m->tok_embd;
        hp->tied_output = true;
    }
    m->weight_bytes = mat_bytes(&m->output);
    m->active_weight_bytes = m->weight_bytes;

    m->layers = ar_calloc((size_t)hp->n_layers, sizeof(*m->layers));
    m->swa_layers = ar_calloc((size_t)hp->n_layers, 1);
    if (!m->layers || !m->swa_layers)
        return AR_ENOMEM;
    for (int l = 0; l < hp->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        if ((st = load_vec(f, l, "attn_norm.weight", hp->n_embd, true, &L->attn_norm, err)) ||
            (st = load_vec(f, l, "ffn_norm.weight", hp->n_embd, true, &L->ffn_norm, err)) ||
            (st = load_attention(f, d, hp, l, L, err)) || (st = load_ffn(f, d, hp, l, L, err)))
            return st;
        L->swa_window = model_layer_is_swa(hp, l) ? hp->swa_window : 0;
        L->rope = L->swa_window ? 1 : 0;
        m->swa_layers[l] = L->swa_window ? 1 : 0;
        m->weight_bytes += layer_bytes(L, hp->n_expert);
        m->active_weight_bytes += layer_bytes(L, hp->n_expert_used);
    }
    return AR_OK;
}

/* base^(-2i/n_rot) * freq_scale / factor_i for each rotated pair i. */
static enum ar_status make_rope(struct model_rope *r, int rope_dim, float base, float scale,
                                const float *factors, float mscale)
{
    int half = rope_dim / 2;
    if (!(r->inv_freq = ar_malloc((size_t)half * sizeof(*r->inv_freq))))
        return AR_ENOMEM;
    for (int i = 0; i < half; i++)
        r->inv_freq[i] = (double)scale * pow((double)base, -2.0 * i / rope_dim) /
                         (factors ? (double)factors[i] : 1.0);
    r->mscale = mscale;
    return AR_OK;
}

/* The global rope (with LongRoPE factors: the short ones, which llama.cpp uses while the
 * context stays within original_context_length, and the long ones kept for longer contexts)
 * and, for sliding-window models, the local one (its own base, no scaling). */
static enum ar_status load_ropes(struct model *m, struct ar_err *err)
{
    const struct model_hparams *hp = &m->hp;
    const float *factors = NULL, *factors_long = NULL;
    enum ar_status st;
    if (m->desc->rope_factors &&
        ((st = load_vec(m->file, -1, "rope_factors_short.weight", hp->rope_dim / 2, false,
                        &factors, err)) ||
         (st = load_vec(m->file, -1, "rope_factors_long.weight", hp->rope_dim / 2, false,
                        &factors_long, err))))
        return st;
    for (int i = 0; factors && i < hp->rope_dim / 2; i++)
        if (!(factors[i] > 0.0f) || !isfinite(factors[i]))
            return ar_err_set(err, AR_EFORMAT, 0, "rope_factors_short.weight[%d] = %g", i,
                              (double)factors[i]);
    for (int i = 0; factors_long && i < hp->rope_dim / 2; i++)
        if (!(factors_long[i] > 0.0f) || !isfinite(factors_long[i]))
            return ar_err_set(err, AR_EFORMAT, 0, "rope_factors_long.weight[%d] = %g", i,
                              (double)factors_long[i]);
    if ((st = make_rope(&m->rope[0], hp->rope_dim, hp->rope_freq_base, hp->rope_freq_scale,
                        factors, hp->rope_attn_factor)) != AR_OK)
        return st;
    if (factors_long && hp->n_ctx_orig > 0 &&
        (st = make_rope(&m->rope_long, hp->rope_dim, hp->rope_freq_base, hp->rope_freq_scale,
                        factors_long, hp->rope_attn_factor)) != AR_OK)
        return st;
    m->n_rope = 1;
    if (hp->swa_window > 0) {
        if ((st = make_rope(&m->rope[1], hp->rope_dim, hp->rope_freq_base_swa, 1.0f, NULL,
                            1.0f)) != AR_OK)
            return st;
        m->n_rope = 2;
    }
    return AR_OK;
}

/* ---- public -------------------------------------------------------------------------- */

/* ---- packed weights -------------------------------------------------------------------- */

/* Calls f on every weight matrix the fast pass multiplies by (not tok_embd, whose rows are
 * looked up from the file; output may share its data). */
static void each_mat(struct model *m, void (*f)(struct model *, struct model_mat *, void *),
                     void *arg)
{
    for (int l = 0; l < m->hp.n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        struct model_mat *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown,
                                  &L->router};
        for (size_t i = 0; i < AR_ARRAY_LEN(ws); i++)
            if (ws[i]->data)
                f(m, ws[i], arg);
        for (int e = 0; L->exp_gate && e < m->hp.n_expert; e++) {
            f(m, &L->exp_gate[e], arg);
            f(m, &L->exp_up[e], arg);
            f(m, &L->exp_down[e], arg);
        }
    }
    if (m->output.data)
        f(m, &m->output, arg);
}

/* Two passes of pack_one over the matrices: the first adds up the packed region's size (each
 * packable matrix 64-byte aligned in it), the second (place) packs them into it. */
struct pack_plan {
    const struct kernel_ops *ops;
    size_t size;
    bool place; /* second pass: pack into m->packed */
};

static void pack_one(struct model *m, struct model_mat *w, void *arg)
{
    struct pack_plan *p = arg;
    size_t bytes;
    if (!p->ops->gemm_packed[w->type] ||
        !(bytes = kernels_packed_size(w->type, w->n_in, w->n_out)))
        return;
    if (p->place) {
        void *dst = (uint8_t *)m->packed + p->size;
        kernels_pack_rows(w->type, w->data, w->row_size, w->n_in, w->n_out, dst);
        w->packed = dst;
        /* the fast pass reads the copy from now on; the file's pages can go (where the matrix
         * is also the embedding table, the lookups map back the few pages they read) */
        gguf_release_range(m->file, w->data, w->row_size * (size_t)w->n_out);
    }
    p->size += (bytes + 63) & ~(size_t)63;
}

/* Copies every matrix the chosen kernels have a packed gemm for into the layout they stream
 * best (kernels.h, "x16"), in one anonymous mapping that may take transparent huge pages.
 * AR_PACK_WEIGHTS=0 in the environment keeps the file's layout. Out of memory is not an
 * error: the matrices then stay as they are. */
static void pack_weights(struct model *m)
{
    struct pack_plan p = {.ops = kernels_get()};
    const char *env = getenv("AR_PACK_WEIGHTS");
    void *region;
    if (env && strcmp(env, "0") == 0)
        return;
    each_mat(m, pack_one, &p);
    if (p.size == 0)
        return;
    region = ar_huge_alloc(p.size);
    if (!region) {
        ar_log(AR_LOG_WARN, "model: no memory to pack the weights (%zu bytes); using them as stored",
               p.size);
        return;
    }
    m->packed = region;
    m->packed_size = p.size;
    p.size = 0;
    p.place = true;
    each_mat(m, pack_one, &p);
    if (mprotect(region, m->packed_size, PROT_READ) != 0)
        ar_log(AR_LOG_DEBUG, "model: packed weights stay writable");
}

enum ar_status model_load(const char *path, struct model **out, struct ar_err *err)
{
    struct gguf_file *f;
    enum ar_status st;
    if (!path || !out)
        return ar_err_set(err, AR_EINVAL, 0, "model_load: NULL argument");
    if ((st = gguf_open(path, &f, err)) != AR_OK)
        return st;
    return model_load_gguf(f, out, err);
}

enum ar_status model_load_gguf(struct gguf_file *f, struct model **out, struct ar_err *err)
{
    enum ar_status st;
    struct model *m;
    if (!f || !out) {
        gguf_close(f);
        return ar_err_set(err, AR_EINVAL, 0, "model_load_gguf: NULL argument");
    }
    m = ar_calloc(1, sizeof(*m));
    if (!m) {
        gguf_close(f);
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    m->file = f;
    if ((st = read_hparams(m->file, &m->hp, &m->desc, err)) != AR_OK)
        goto fail;
    if ((st = load_tensors(m, err)) != AR_OK)
        goto fail;
    if ((st = load_ropes(m, err)) != AR_OK)
        goto fail;
    pack_weights(m);
    *out = m;
    return AR_OK;
fail:
    if (st == AR_ENOMEM)
        ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    model_destroy(m);
    return st;
}

void model_destroy(struct model *m)
{
    if (!m)
        return;
    for (int i = 0; i < 2; i++)
        ar_free(m->rope[i].inv_freq);
    ar_free(m->rope_long.inv_freq);
    for (int l = 0; m->layers && l < m->hp.n_layers; l++) {
        ar_free(m->layers[l].exp_gate);
        ar_free(m->layers[l].exp_up);
        ar_free(m->layers[l].exp_down);
    }
    ar_free(m->layers);
    ar_free(m->swa_layers);
    ar_huge_free(m->packed, m->packed_size);
    gguf_close(m->file);
    ar_free(m);
}

const struct model_hparams *model_hparams(const struct model *m)
{
    return &m->hp;
}

const struct model_rope *model_rope_for(const struct model *m, int k, int64_t n_ctx)
{
    if (k == 0 && m->rope_long.inv_freq && n_ctx > m->hp.n_ctx_orig)
        return &m->rope_long;
    return &m->rope[k];
}

const struct gguf_file *model_gguf(const struct model *m)
{
    return m->file;
}

uint64_t model_packed_bytes(const struct model *m)
{
    return m->packed ? m->packed_size : 0;
}

uint64_t model_weight_bytes(const struct model *m)
{
    return m->weight_bytes;
}

/* Products of one token through the matrix w (none when the layer lacks it). */
static uint64_t mat_macs(const struct model_mat *w)
{
    return w->data ? (uint64_t)w->n_in * (uint64_t)w->n_out : 0;
}

/* Products of one token through a layer's matrices (a mixture of experts: its used experts). */
static uint64_t layer_macs(const struct model_layer *L, int n_used)
{
    const struct model_mat *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
    uint64_t n = 0;
    for (size_t i = 0; i < AR_ARRAY_LEN(ws); i++)
        n += mat_macs(ws[i]);
    if (L->exp_gate)
        n += mat_macs(&L->router) +
             (uint64_t)n_used *
                 (mat_macs(&L->exp_gate[0]) + mat_macs(&L->exp_up[0]) + mat_macs(&L->exp_down[0]));
    return n;
}

/* Multiply-adds of layer l's matrices in a prefill of n_tokens: every row through them, but
 * in the last layer only its q, k and v projections (they fill the KV cache): after its
 * attention the pass goes on with the one row whose logits it returns (forward.c,
 * compact_rows). */
static double prefill_layer_macs(const struct model *m, int l, int64_t n_tokens)
{
    const struct model_layer *L = &m->layers[l];
    double all = (double)layer_macs(L, m->hp.n_expert_used);
    if (l < m->hp.n_layers - 1)
        return (double)n_tokens * all;
    double qkv = (double)(mat_macs(&L->wq) + mat_macs(&L->wk) + mat_macs(&L->wv));
    return (double)n_tokens * qkv + (all - qkv);
}

double model_prefill_flops(const struct model *m, int64_t n_tokens)
{
    const struct model_hparams *hp = &m->hp;
    double f = 2.0 * (double)hp->n_embd * (double)hp->n_vocab; /* logits of the last row */
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        double seen = 0; /* positions the rows attend to, all rows together */
        for (int64_t i = 0; i < n_tokens; i++)
            seen += (double)(L->swa_window > 0 ? AR_MIN(i + 1, (int64_t)L->swa_window) : i + 1);
        f += 2.0 * prefill_layer_macs(m, l, n_tokens) +
             4.0 * (double)hp->n_heads * (double)hp->head_dim * seen; /* q·k and p·v */
    }
    return f;
}

double model_prefill_matrix_flops(const struct model *m, int64_t n_tokens)
{
    const struct model_hparams *hp = &m->hp;
    double f = 2.0 * (double)hp->n_embd * (double)hp->n_vocab;
    for (int l = 0; l < hp->n_layers; l++)
        f += 2.0 * prefill_layer_macs(m, l, n_tokens);
    return f;
}

uint64_t model_active_weight_bytes(const struct model *m)
{
    return m->active_weight_bytes;
}

void model_kv_params(const struct model *m, int block_tokens, int64_t n_blocks, enum ar_type type,
                     struct kv_params *out)
{
    out->n_layers = m->hp.n_layers;
    out->n_kv_heads = m->hp.n_kv_heads;
    out->head_dim = m->hp.head_dim;
    out->block_tokens = block_tokens;
    out->n_blocks = n_blocks;
    out->type = type;
    /* one pool unless the caller sizes a local one (n_local_blocks) */
    out->swa_window = m->hp.swa_window;
    out->swa_layers = m->hp.swa_window > 0 ? m->swa_layers : NULL;
    out->n_local_blocks = 0;
}
