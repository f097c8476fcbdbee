/* model_fuzz.c - fuzz target for the model loader: arbitrary bytes as a GGUF file, then as a
 * model of any family (every metadata key and tensor shape the loader checks). A model it
 * accepts that is small enough runs three tokens through the reference pass and the fast pass,
 * which must not read out of bounds whatever the (random) weights hold. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

/* Shapes a fuzz iteration can afford to run. */
static int small_enough(const struct model *m)
{
    const struct model_hparams *hp = model_hparams(m);
    return model_weight_bytes(m) <= (8u << 20) && hp->n_embd <= 1024 && hp->n_vocab <= 4096 &&
           hp->n_layers <= 4 && (int64_t)hp->n_heads * hp->head_dim <= 2048 &&
           hp->n_ff <= 4096 && hp->n_expert <= 64;
}

static void run(const struct model *m)
{
    const struct model_hparams *hp = model_hparams(m);
    int32_t toks[3] = {0, hp->n_vocab - 1, 1 % hp->n_vocab}, pos[3] = {0, 1, 2}, seq[3] = {0};
    float *logits = malloc(sizeof(float) * 3 * (size_t)hp->n_vocab);
    struct model_ctx *ctx = NULL;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct kv_seq s, *sp = &s;
    uint8_t want[3] = {1, 1, 1};
    check(logits != NULL);
    check(model_forward_reference(m, toks, 3, logits) == AR_OK);
    if (model_ctx_create(m, 3, NULL, &ctx) == AR_OK) {
        model_kv_params(m, 2, 2, AR_TYPE_F16, &kp);
        if (kv_create(&kp, &kv) == AR_OK) {
            struct model_batch b = {.n_tokens = 3, .tokens = toks, .pos = pos, .seq = seq,
                                    .logits = want, .n_seqs = 1};
            kv_seq_init(&s);
            check(kv_seq_reserve(kv, &s, 3) == AR_OK);
            check(model_forward(ctx, kv, &sp, &b, logits) == AR_OK);
            kv_seq_fini(kv, &s);
            kv_destroy(kv);
        }
        model_ctx_destroy(ctx);
    }
    free(logits);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file *f;
    struct model *m;
    struct ar_err err;
    if (gguf_open_memory(data, size, &f, &err) != AR_OK)
        return 0;
    if (model_load_gguf(f, &m, &err) != AR_OK) {
        /* every refusal says why */
        check(memchr(err.msg, '\0', sizeof(err.msg)) != NULL && err.msg[0] != '\0');
        return 0;
    }
    if (small_enough(m))
        run(m);
    model_destroy(m);
    return 0;
}
