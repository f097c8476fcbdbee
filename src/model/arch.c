/* arch.c - the architectures as data. Each row says what a layer of that family holds and
 * how it combines, as llama.cpp's converter lays the real models out in GGUF; the loader
 * (model.c) reads the tensors a row asks for, and both forward passes (reference.c,
 * forward.c) follow the flags, never the architecture's name. */
#include "model_internal.h"

#include <math.h>

#include "kernels/kernels.h"

/* clang-format off */
static const struct model_arch_desc ARCHS[MODEL_ARCH_COUNT] = {
    /*                                 neox   act                  qkv    gate_up qk_norm post   moe    embd   swa    factors */
    [MODEL_ARCH_LLAMA]    = {MODEL_ARCH_LLAMA,    "llama",    false, MODEL_ACT_SILU,      false, false, false, false, false, false, false, false},
    /* qwen2: q/k/v biases (read when present) */
    [MODEL_ARCH_QWEN2]    = {MODEL_ARCH_QWEN2,    "qwen2",    true,  MODEL_ACT_SILU,      false, false, false, false, false, false, false, false},
    /* qwen3: per-head q/k norms; head_dim from key_length, independent of n_embd / n_head */
    [MODEL_ARCH_QWEN3]    = {MODEL_ARCH_QWEN3,    "qwen3",    true,  MODEL_ACT_SILU,      false, false, true,  false, false, false, false, false},
    /* qwen3moe: qwen3's attention, softmax router over experts, top-k renormalized */
    [MODEL_ARCH_QWEN3MOE] = {MODEL_ARCH_QWEN3MOE, "qwen3moe", true,  MODEL_ACT_SILU,      false, false, true,  false, true,  false, false, false},
    /* glm4 (GLM-4-0414): q/k/v biases, post norms, fused gate+up, rope on part of the head */
    [MODEL_ARCH_GLM4]     = {MODEL_ARCH_GLM4,     "glm4",     false, MODEL_ACT_SILU,      false, true,  false, true,  false, false, false, false},
    /* chatglm (GLM-4-9B-chat): fused qkv with bias, fused gate+up, partial rotary */
    [MODEL_ARCH_CHATGLM]  = {MODEL_ARCH_CHATGLM,  "chatglm",  false, MODEL_ACT_SILU,      true,  true,  false, false, false, false, false, false},
    /* gemma3: scaled embeddings, q/k norms, post norms, GELU(tanh), sliding-window layers */
    [MODEL_ARCH_GEMMA3]   = {MODEL_ARCH_GEMMA3,   "gemma3",   true,  MODEL_ACT_GELU_TANH, false, false, true,  true,  false, true,  true,  false},
    /* phi3 (Phi-3.5, Phi-4-mini): fused qkv and gate+up, partial rotary, LongRoPE */
    [MODEL_ARCH_PHI3]     = {MODEL_ARCH_PHI3,     "phi3",     true,  MODEL_ACT_SILU,      true,  true,  false, false, false, false, false, true},
};
/* clang-format on */

const struct model_arch_desc *model_arch_find(const char *s, size_t len)
{
    for (int a = 0; a < MODEL_ARCH_COUNT; a++)
        if (strlen(ARCHS[a].name) == len && memcmp(ARCHS[a].name, s, len) == 0)
            return &ARCHS[a];
    return NULL;
}

const struct model_arch_desc *model_arch_desc(enum model_arch a)
{
    return (unsigned)a < MODEL_ARCH_COUNT ? &ARCHS[a] : NULL;
}

const char *model_arch_name(enum model_arch a)
{
    return (unsigned)a < MODEL_ARCH_COUNT ? ARCHS[a].name : "?";
}

bool model_layer_is_swa(const struct model_hparams *hp, int il)
{
    return hp->swa_window > 0 && hp->swa_pattern > 1 &&
           il % hp->swa_pattern < hp->swa_pattern - 1;
}

void model_act_mul(const struct kernel_ops *ops, enum model_act act, int n, float *out,
                   const float *gate, const float *up)
{
    if (act == MODEL_ACT_GELU_TANH)
        ops->gelu_mul(n, out, gate, up);
    else
        ops->silu_mul(n, out, gate, up);
}

/* ---- math both passes share ------------------------------------------------------------- */

void model_rope_table(const struct model *m, const struct model_rope *r, int32_t pos, float *cs)
{
    for (int i = 0; i < m->hp.rope_dim / 2; i++) {
        double theta = (double)pos * r->inv_freq[i];
        cs[2 * i] = (float)cos(theta) * r->mscale;
        cs[2 * i + 1] = (float)sin(theta) * r->mscale;
    }
}

void model_moe_route(const struct kernel_ops *ops, const struct model_hparams *hp, float *logits,
                     int32_t *sel, float *w)
{
    int k = hp->n_expert_used, n = 0;
    float sum = 0.0f;
    ops->softmax(hp->n_expert, logits); /* now probabilities */
    /* the k best, best first, in one pass: each expert goes in before the first chosen one
     * it is strictly greater than, so of equal ones the lowest index comes first (and where
     * softmax gave NaNs, the first k are chosen); the list keeps its k best */
    for (int e = 0; e < hp->n_expert; e++) {
        int i = n;
        while (i > 0 && logits[e] > w[i - 1])
            i--;
        if (i == k)
            continue;
        for (int t = AR_MIN(n, k - 1); t > i; t--) {
            sel[t] = sel[t - 1];
            w[t] = w[t - 1];
        }
        sel[i] = e;
        w[i] = logits[e];
        n = AR_MIN(n + 1, k);
    }
    for (int j = 0; j < k; j++)
        sum += w[j];
    /* renormalized over the chosen ones; the sum is clamped as llama.cpp clamps it */
    sum = AR_MAX(sum, 6.103515625e-5f);
    for (int j = 0; j < k; j++)
        w[j] /= sum;
}

void model_moe_combine(const struct model_hparams *hp, const float *const *outs, const float *w,
                       float *out)
{
    int n = hp->n_embd, k = hp->n_expert_used, i = 0;
    /* 16 elements at a time, each summed in the same order as alone (so the compiler's
     * vectors give the scalar loop's bits) */
    for (; i + 16 <= n; i += 16) {
        float acc[16] = {0};
        /* each output row 1 KiB ahead: the rows are scattered, 8 short streams that the
         * hardware prefetchers pick up late (a prefill's combine, 33.5 MB of expert outputs
         * per qwen3moe layer, read from memory: 2.36 -> 2.05 ms, Zen 5, one thread) */
        for (int j = 0; j < k && i + 16 + 256 <= n; j++)
            __builtin_prefetch(outs[j] + i + 256);
        for (int j = 0; j < k; j++)
            for (int t = 0; t < 16; t++)
                acc[t] += w[j] * outs[j][i + t];
        memcpy(out + i, acc, sizeof(acc));
    }
    for (; i < n; i++) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++)
            acc += w[j] * outs[j][i];
        out[i] = acc;
    }
}
