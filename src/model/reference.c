/* reference.c - the transformer, written to be read. One sequence, one thread, no batching
 * tricks: a loop over layers in which every step of every architecture is visible, in the
 * order llama.cpp computes it. The matrix products round their input rows to the weight's
 * activation type (as llama.cpp's CPU backend does) and use the running CPU's kernel variant
 * (the one the fast pass uses; the kernel tests hold each variant to the scalar reference),
 * so this pass is the definition the fast pass (forward.c) is held to by tests.
 *
 * Shapes: T tokens, E = n_embd, H = n_heads, G = n_kv_heads, D = head_dim, F = n_ff (or
 * n_ff_exp), V = n_vocab. */
#include "model_internal.h"

#include <math.h>

#include "kernels/kernels.h"

/* Scratch of one pass, all f32. */
struct ref {
    const struct model *m;
    const struct kernel_ops *ops; /* the scalar reference kernels */
    float *x;      /* (T, E) the residual stream */
    float *h;      /* (E) a normed row */
    float *q;      /* (H*D) */
    float *kc;     /* (L, T, G*D) every layer's keys at every position: the K cache */
    float *vc;     /* (L, T, G*D) values */
    float *att;    /* (H*D) attention output */
    float *o;      /* (E) a block's output */
    float *scores; /* (T) */
    float *gate;   /* (F) */
    float *up;     /* (F) */
    float *hid;    /* (F) */
    float *eo;     /* (n_expert_used, E): each chosen expert's output */
    float *rl;     /* (n_expert) router logits */
    float *cs;     /* (rope_dim) cos, sin pairs */
    void *act;     /* an input row in the weight's activation type */
    size_t n;      /* T */
};

/* y (w->n_out) = W x: x rounded to W's activation type, then one dot product per row. */
static void matvec(const struct ref *r, const struct model_mat *w, const float *x, float *y)
{
    const void *xa = x;
    if (w->vec_type != AR_TYPE_F32) {
        r->ops->from_float[w->vec_type](x, r->act, w->n_in);
        xa = r->act;
    }
    for (int64_t i = 0; i < w->n_out; i++)
        r->ops->vec_dot[w->type]((int)w->n_in, &y[i],
                                 (const uint8_t *)w->data + (size_t)i * w->row_size, xa);
}

/* out (E) = FFN(h): down(act(gate h) * up h) with the given matrices. */
static void ffn(const struct ref *r, const struct model_mat *gate, const struct model_mat *up,
                const struct model_mat *down, const float *h, float *out)
{
    int f = (int)gate->n_out;
    matvec(r, gate, h, r->gate);
    matvec(r, up, h, r->up);
    model_act_mul(r->ops, r->m->hp.act, f, r->hid, r->gate, r->up);
    matvec(r, down, r->hid, out);
}

/* out (E) = the mixture of experts at h: the router's softmax picks the top-k experts, whose
 * outputs are summed with their renormalized probabilities. */
static void moe(const struct ref *r, const struct model_layer *L, const float *h, float *out)
{
    const struct model_hparams *hp = &r->m->hp;
    int32_t sel[MODEL_MAX_EXPERTS_USED];
    float w[MODEL_MAX_EXPERTS_USED];
    const float *outs[MODEL_MAX_EXPERTS_USED];
    matvec(r, &L->router, h, r->rl);
    model_moe_route(r->ops, hp, r->rl, sel, w);
    for (int j = 0; j < hp->n_expert_used; j++) {
        outs[j] = r->eo + (size_t)j * (size_t)hp->n_embd;
        ffn(r, &L->exp_gate[sel[j]], &L->exp_up[sel[j]], &L->exp_down[sel[j]], h,
            r->eo + (size_t)j * (size_t)hp->n_embd);
    }
    model_moe_combine(hp, outs, w, out);
}

/* att (H*D) = causal attention of position p's query heads over keys/values 0..p (or the
 * sliding window's last positions); query head i uses KV head i / (H/G). */
static void attention(const struct ref *r, const struct model_layer *L, const float *kc,
                      const float *vc, int p)
{
    const struct model_hparams *hp = &r->m->hp;
    int D = hp->head_dim, kv_w = hp->n_kv_heads * D, group = hp->n_heads / hp->n_kv_heads;
    int first = L->swa_window > 0 && p + 1 > L->swa_window ? p + 1 - L->swa_window : 0;
    float scale = (float)(1.0 / sqrt((double)D));
    for (int i = 0; i < hp->n_heads; i++) {
        const float *qi = r->q + (size_t)i * D;
        int g = i / group;
        float *out = r->att + (size_t)i * D;
        for (int t = first; t <= p; t++)
            r->scores[t] = r->ops->dot_f32(D, qi, kc + (size_t)t * kv_w + (size_t)g * D) *
                           scale;
        r->ops->softmax(p + 1 - first, r->scores + first);
        memset(out, 0, (size_t)D * sizeof(float));
        for (int t = first; t <= p; t++)
            r->ops->axpy_f32(D, r->scores[t], vc + (size_t)t * kv_w + (size_t)g * D, out);
    }
}

/* x += o, after o = rmsnorm(o) * post when the block has a post norm. */
static void add_output(const struct ref *r, float *x, float *o, const float *post)
{
    const struct model_hparams *hp = &r->m->hp;
    if (post)
        r->ops->rmsnorm(hp->n_embd, o, o, post, hp->rms_eps);
    for (int i = 0; i < hp->n_embd; i++)
        x[i] += o[i];
}

/* One layer for position p (x: its residual row). */
static void layer(struct ref *r, int l, int p, float *x)
{
    const struct model *m = r->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = &m->layers[l];
    int D = hp->head_dim, kv_w = hp->n_kv_heads * D;
    float *kc = r->kc + (size_t)l * r->n * kv_w, *vc = r->vc + (size_t)l * r->n * kv_w;
    float *k = kc + (size_t)p * kv_w, *v = vc + (size_t)p * kv_w;

    /* attention block */
    r->ops->rmsnorm(hp->n_embd, r->h, x, L->attn_norm, hp->rms_eps); /* h = rms(x) * w */
    matvec(r, &L->wq, r->h, r->q);                                   /* q (H*D) = Wq h */
    matvec(r, &L->wk, r->h, k);                                      /* k (G*D) = Wk h */
    matvec(r, &L->wv, r->h, v);                                      /* v (G*D) = Wv h */
    for (int i = 0; L->bq && i < hp->n_heads * D; i++)               /* + biases */
        r->q[i] += L->bq[i];
    for (int i = 0; L->bk && i < kv_w; i++)
        k[i] += L->bk[i];
    for (int i = 0; L->bv && i < kv_w; i++)
        v[i] += L->bv[i];
    for (int i = 0; L->q_norm && i < hp->n_heads; i++) /* per-head norms (D each) */
        r->ops->rmsnorm(D, r->q + (size_t)i * D, r->q + (size_t)i * D, L->q_norm, hp->rms_eps);
    for (int i = 0; L->k_norm && i < hp->n_kv_heads; i++)
        r->ops->rmsnorm(D, k + (size_t)i * D, k + (size_t)i * D, L->k_norm, hp->rms_eps);
    /* rotate the first rope_dim dims of each head (this pass's context is its n tokens) */
    model_rope_table(m, model_rope_for(m, L->rope, (int64_t)r->n), p, r->cs);
    r->ops->rope(r->q, hp->n_heads, D, hp->rope_dim, hp->rope_neox, r->cs);
    r->ops->rope(k, hp->n_kv_heads, D, hp->rope_dim, hp->rope_neox, r->cs);
    attention(r, L, kc, vc, p);          /* att (H*D) */
    matvec(r, &L->wo, r->att, r->o);     /* o (E) = Wo att */
    add_output(r, x, r->o, L->post_attn_norm);

    /* feed-forward block */
    r->ops->rmsnorm(hp->n_embd, r->h, x, L->ffn_norm, hp->rms_eps);
    if (L->exp_gate)
        moe(r, L, r->h, r->o);
    else
        ffn(r, &L->wgate, &L->wup, &L->wdown, r->h, r->o);
    add_output(r, x, r->o, L->post_ffn_norm);
}

static void ref_free(struct ref *r)
{
    float **bufs[] = {&r->x,  &r->h,   &r->q,    &r->kc,  &r->vc, &r->att, &r->o,
                      &r->scores, &r->gate, &r->up, &r->hid, &r->eo, &r->rl, &r->cs};
    for (size_t i = 0; i < AR_ARRAY_LEN(bufs); i++)
        ar_free(*bufs[i]);
    ar_free(r->act);
}

static enum ar_status ref_alloc(struct ref *r, const struct model *m, int n)
{
    const struct model_hparams *hp = &m->hp;
    size_t T = (size_t)n, E = (size_t)hp->n_embd, D = (size_t)hp->head_dim;
    size_t F = (size_t)AR_MAX(hp->n_ff, hp->n_ff_exp), act = 0;
    memset(r, 0, sizeof(*r));
    r->m = m;
    r->ops = kernels_get();
    /* the widest input row in any activation type: 4 bytes an element bounds them all */
    act = 4 * AR_MAX(AR_MAX(E, F), (size_t)hp->n_heads * D) + 64;
    r->x = ar_calloc(T * E, sizeof(float));
    r->h = ar_calloc(E, sizeof(float));
    r->q = ar_calloc((size_t)hp->n_heads * D, sizeof(float));
    r->n = T;
    r->kc = ar_calloc((size_t)hp->n_layers * T * (size_t)hp->n_kv_heads * D, sizeof(float));
    r->vc = ar_calloc((size_t)hp->n_layers * T * (size_t)hp->n_kv_heads * D, sizeof(float));
    r->att = ar_calloc((size_t)hp->n_heads * D, sizeof(float));
    r->o = ar_calloc(E, sizeof(float));
    r->scores = ar_calloc(T, sizeof(float));
    r->gate = ar_calloc(F, sizeof(float));
    r->up = ar_calloc(F, sizeof(float));
    r->hid = ar_calloc(F, sizeof(float));
    r->eo = ar_calloc((size_t)AR_MAX(hp->n_expert_used, 1) * E, sizeof(float));
    r->rl = ar_calloc((size_t)AR_MAX(hp->n_expert, 1), sizeof(float));
    r->cs = ar_calloc((size_t)hp->rope_dim, sizeof(float));
    r->act = ar_calloc(act, 1);
    if (!r->x || !r->h || !r->q || !r->kc || !r->vc || !r->att || !r->o || !r->scores ||
        !r->gate || !r->up || !r->hid || !r->eo || !r->rl || !r->cs || !r->act) {
        ref_free(r);
        return AR_ENOMEM;
    }
    return AR_OK;
}

enum ar_status model_forward_reference(const struct model *m, const int32_t *tokens, int n,
                                       float *logits)
{
    const struct model_hparams *hp;
    struct ref r;
    enum ar_status st;
    if (!m || !tokens || !logits || n < 1 || n > (1 << 20) || m->hp.n_expert_used > MODEL_MAX_EXPERTS_USED)
        return AR_EINVAL;
    hp = &m->hp;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return AR_EINVAL;
    if ((st = ref_alloc(&r, m, n)) != AR_OK)
        return st;
    for (int p = 0; p < n; p++) {
        float *x = r.x + (size_t)p * (size_t)hp->n_embd;
        /* x (E) = token_embd[token] * embd_scale */
        r.ops->to_float[m->tok_embd.type](
            (const uint8_t *)m->tok_embd.data + (size_t)tokens[p] * m->tok_embd.row_size, x,
            hp->n_embd);
        for (int i = 0; i < hp->n_embd; i++)
            x[i] *= hp->embd_scale;
        for (int l = 0; l < hp->n_layers; l++)
            layer(&r, l, p, x);
        /* logits (V) = W_out rms(x) */
        r.ops->rmsnorm(hp->n_embd, r.h, x, m->output_norm, hp->rms_eps);
        matvec(&r, &m->output, r.h, logits + (size_t)p * (size_t)hp->n_vocab);
    }
    ref_free(&r);
    return AR_OK;
}
