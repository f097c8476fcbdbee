/* runner.c - one sequence over model + paged KV + thread pool: what `generate`, `bench` and
 * `check-fixtures` need. (The serving engine batches many sequences; this is its simplest
 * client.) */
#include <stdio.h>
#include <string.h>

#include "cli_internal.h"
#include "kv/kv.h"
#include "model/model.h"

#define RUNNER_BLOCK_TOKENS 16
#define RUNNER_BATCH 512

struct cli_runner {
    struct model *model;
    struct model_ctx *ctx;
    struct kv_cache *kv;
    struct kv_seq seq;
    struct ar_pool *pool;
    int n_ctx, n_vocab, n_past;
    int n_batch; /* prompt chunk size (scratch is sized for this many rows) */
    int32_t *pos, *seq_idx; /* (n_ctx) */
    uint8_t *want;          /* (n_ctx) */
    float *logits;          /* (n_ctx, n_vocab) when all rows are asked, else (n_vocab) */
    size_t logits_rows;
};

enum ar_status cli_runner_open(const char *path, int n_threads, enum ar_type kv_type, int n_ctx,
                               struct cli_runner **out, struct ar_err *err)
{
    enum ar_status st;
    struct kv_params kp;
    struct cli_runner *r = ar_calloc(1, sizeof(*r));
    if (!r)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    kv_seq_init(&r->seq);
    if ((st = model_load(path, &r->model, err)) != AR_OK)
        goto fail;
    if (n_ctx <= 0)
        n_ctx = model_hparams(r->model)->n_ctx_train;
    r->n_ctx = n_ctx;
    r->n_vocab = model_hparams(r->model)->n_vocab;
    if ((st = ar_pool_create(n_threads, &r->pool)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot start %d threads", n_threads);
        goto fail;
    }
    r->n_batch = n_ctx < RUNNER_BATCH ? n_ctx : RUNNER_BATCH;
    model_kv_params(r->model, RUNNER_BLOCK_TOKENS,
                    (n_ctx + RUNNER_BLOCK_TOKENS - 1) / RUNNER_BLOCK_TOKENS, kv_type, &kp);
    if (kp.swa_layers) /* sliding layers: their window and one chunk, +2 for the block edges */
        kp.n_local_blocks = AR_MIN(kp.n_blocks, (kp.swa_window + r->n_batch) / RUNNER_BLOCK_TOKENS + 3);
    if ((st = kv_create(&kp, &r->kv)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot allocate the KV cache (%d tokens)", n_ctx);
        goto fail;
    }
    if ((st = model_ctx_create(r->model, r->n_batch, r->pool, &r->ctx)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot allocate scratch buffers for %d tokens", r->n_batch);
        goto fail;
    }
    model_ctx_set_n_ctx(r->ctx, n_ctx);
    r->pos = ar_malloc(sizeof(int32_t) * (size_t)n_ctx);
    r->seq_idx = ar_calloc((size_t)n_ctx, sizeof(int32_t));
    r->want = ar_malloc((size_t)n_ctx);
    r->logits = ar_malloc(sizeof(float) * (size_t)r->n_vocab);
    r->logits_rows = 1;
    if (!r->pos || !r->seq_idx || !r->want || !r->logits) {
        st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        goto fail;
    }
    *out = r;
    return AR_OK;
fail:
    cli_runner_close(r);
    return st;
}

void cli_runner_close(struct cli_runner *r)
{
    if (!r)
        return;
    if (r->kv)
        kv_seq_fini(r->kv, &r->seq);
    model_ctx_destroy(r->ctx);
    kv_destroy(r->kv);
    ar_pool_destroy(r->pool);
    model_destroy(r->model);
    ar_free(r->pos);
    ar_free(r->seq_idx);
    ar_free(r->want);
    ar_free(r->logits);
    ar_free(r);
}

int cli_runner_n_vocab(const struct cli_runner *r)
{
    return r->n_vocab;
}
int cli_runner_n_ctx(const struct cli_runner *r)
{
    return r->n_ctx;
}
int cli_runner_n_past(const struct cli_runner *r)
{
    return r->n_past;
}
const struct model *cli_runner_model(const struct cli_runner *r)
{
    return r->model;
}

static enum ar_status run(struct cli_runner *r, const int32_t *tokens, int n, bool all,
                          float **logits, struct ar_err *err)
{
    enum ar_status st;
    struct kv_seq *seqs[1] = {&r->seq};
    struct model_batch b = {.n_seqs = 1};
    size_t rows = all ? (size_t)n : 1;
    if (n <= 0)
        return ar_err_set(err, AR_EINVAL, 0, "empty prompt");
    if (r->n_past + n > r->n_ctx)
        return ar_err_set(err, AR_ERANGE, 0, "%d tokens do not fit the context of %d tokens",
                          r->n_past + n, r->n_ctx);
    if (rows > r->logits_rows) {
        float *nl = ar_realloc(r->logits, sizeof(float) * rows * (size_t)r->n_vocab);
        if (!nl)
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        r->logits = nl;
        r->logits_rows = rows;
    }
    if ((st = kv_seq_reserve_at(r->kv, &r->seq, r->n_past + n, INT64_MAX)) != AR_OK)
        return ar_err_set(err, st, 0, "KV cache full");
    /* the prompt in chunks of n_batch rows; logits rows land in order. Sliding layers take
     * local blocks for each chunk and give back those behind the window after it. */
    for (int done = 0; done < n; done += b.n_tokens) {
        b.n_tokens = AR_MIN(r->n_batch, n - done);
        if ((st = kv_seq_reserve_at(r->kv, &r->seq, r->n_past + done + b.n_tokens,
                                    r->n_past + done)) != AR_OK)
            return ar_err_set(err, st, 0, "KV cache full");
        for (int i = 0; i < b.n_tokens; i++) {
            r->pos[i] = r->n_past + done + i;
            r->want[i] = all || done + i == n - 1;
        }
        b.tokens = tokens + done;
        b.pos = r->pos;
        b.seq = r->seq_idx;
        b.logits = r->want;
        float *dst = r->logits + (all ? (size_t)done * (size_t)r->n_vocab : 0);
        if ((st = model_forward(r->ctx, r->kv, seqs, &b, dst)) != AR_OK)
            return ar_err_set(err, st, 0, "forward pass failed: %s", ar_status_str(st));
        kv_seq_slide(r->kv, &r->seq, r->n_past + done + b.n_tokens);
    }
    r->n_past += n;
    *logits = r->logits;
    return AR_OK;
}

enum ar_status cli_runner_prefill(struct cli_runner *r, const int32_t *tokens, int n, bool all,
                                  float **logits, struct ar_err *err)
{
    kv_seq_fini(r->kv, &r->seq);
    r->n_past = 0;
    return run(r, tokens, n, all, logits, err);
}

enum ar_status cli_runner_decode(struct cli_runner *r, int32_t token, float **logits,
                                 struct ar_err *err)
{
    return run(r, &token, 1, false, logits, err);
}

/* The best value is kept in a register: comparing against x[best] made every step wait on
 * the load its previous step chose (about 0.6 ms for a 152k vocabulary, 3 % of a decode
 * step of a 0.5B model; now about 0.1 ms). Ties go to the lowest id. */
int32_t cli_argmax(const float *x, int n)
{
    int32_t best = 0;
    float m = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > m) {
            m = x[i];
            best = i;
        }
    return best;
}
