/* engine.h - the serving engine: many generation requests on one model. A bounded priority
 * queue (interactive before bulk, FIFO within a class, bulk never starved), continuous batching
 * (each step runs the decode tokens of all running sequences together with prompt chunks of
 * admitted ones; requests join and leave between steps), the paged KV cache with a prefix cache
 * (full prompt blocks hashed with their prefix, shared by reference count, LRU-evicted),
 * preemption of the lowest-priority sequence when KV runs out (recomputed later, never dropped),
 * cancellation and timeouts.
 *
 * Threads: the engine runs its own scheduler thread (plus the model's worker threads). Every
 * public function is thread-safe. Callbacks run on the scheduler thread: they must be quick and
 * must not call engine_destroy; they may call engine_submit / engine_cancel. */
#ifndef AR_ENGINE_H
#define AR_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "base/types.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

enum engine_priority {
    ENGINE_PRIO_INTERACTIVE = 0, /* a customer is waiting */
    ENGINE_PRIO_BULK = 1,        /* backfills, jobs */
    ENGINE_PRIO_COUNT
};

struct engine_params {
    int n_threads;          /* model threads (>= 1) */
    int64_t kv_tokens;      /* KV capacity in tokens (rounded up to blocks) */
    int block_tokens;       /* tokens per KV block (16) */
    enum ar_type kv_type;   /* AR_TYPE_F16 (default) or AR_TYPE_F32 */
    int n_seq_max;          /* sequences running at once (--parallel) */
    int n_batch;            /* max rows per forward step (decode + prefill chunks) */
    int prefill_chunk;      /* max prompt tokens of one sequence per step */
    int queue_max;          /* waiting requests, all priorities; beyond: AR_EBUSY */
    bool prefix_cache;      /* reuse KV of identical prompt prefixes */
    double bulk_max_wait_s; /* a bulk request waiting longer than this is served next */
};

/* n_threads 2, kv_tokens 8192, block_tokens 16, F16, n_seq_max 16, n_batch 512,
 * prefill_chunk 256, queue_max 256, prefix_cache on, bulk_max_wait_s 10. */
struct engine_params engine_default_params(void);

enum engine_finish {
    ENGINE_FINISH_STOP,      /* end-of-generation token or a stop string */
    ENGINE_FINISH_LENGTH,    /* max_tokens reached, or the context is full */
    ENGINE_FINISH_CANCELLED, /* engine_cancel (e.g. the client went away) */
    ENGINE_FINISH_TIMEOUT,   /* the request's timeout passed */
    ENGINE_FINISH_ERROR      /* see status */
};

struct engine_result {
    enum ar_status status;
    enum engine_finish finish;
    int n_prompt;        /* prompt tokens */
    int n_cached;        /* prompt tokens whose KV came from the prefix cache */
    int n_gen;           /* generated tokens (the stop token excluded) */
    const int32_t *tokens; /* (n_gen) borrowed for the duration of the callback */
    const char *text;    /* generated text (UTF-8, stop string cut), borrowed likewise */
    size_t text_len;
    double queue_s;       /* submit -> admitted */
    double first_token_s; /* submit -> first generated token (0 if none) */
    double total_s;       /* submit -> done */
    int n_preempted;      /* times this request was preempted and recomputed */
};

/* text: newly completed UTF-8 bytes of the generated text (may be empty while a multi-byte
 * character or a possible stop string is held back). At the end, text still held back (a
 * tail that did not become a stop string) comes in one last call with token -1, before
 * on_done; so the concatenated texts equal engine_result.text. */
typedef void (*engine_token_fn)(void *user, int32_t token, const char *text, size_t len);
/* Called exactly once per accepted request, last. */
typedef void (*engine_done_fn)(void *user, const struct engine_result *res);

struct engine_request {
    const int32_t *prompt; /* (n_prompt) copied by engine_submit */
    int n_prompt;
    int max_tokens;        /* >= 1 */
    struct sampler_params sampling;
    bool ignore_eos;       /* do not stop at end-of-generation tokens */
    const char *const *stop; /* (n_stop) stop strings, copied */
    int n_stop;
    enum engine_priority priority;
    double timeout_s;      /* 0: none */
    bool cache_generated;  /* with the prefix cache: its full blocks of generated tokens are
                              kept there too (a conversation's next turn starts with them) */
    engine_token_fn on_token; /* may be NULL */
    engine_done_fn on_done;   /* may be NULL */
    void *user;
};

struct engine_stats {
    int queued[ENGINE_PRIO_COUNT];
    int running;
    int64_t kv_blocks_used, kv_blocks_total; /* used includes kv_blocks_cached */
    int64_t kv_blocks_cached; /* held only by the prefix cache (evictable) */
    /* the local pool of a sliding-window model (gemma3): blocks of its sliding layers, held
     * for the positions still inside some window (and by the prefix cache); 0 and 0 when
     * the model has none */
    int64_t kv_local_blocks_used, kv_local_blocks_total;
    uint64_t prefix_queries;  /* admitted requests that looked up the prefix cache */
    uint64_t prefix_hit_tokens;
    uint64_t prompt_tokens, generated_tokens;
    uint64_t preemptions;
    uint64_t steps;
    uint64_t rejected_full;   /* engine_submit answered AR_EBUSY */
    /* rows per forward step: counts for buckets <=1, <=2, <=4, ... <=512, >512 */
    uint64_t batch_hist[11];
    uint64_t batch_rows_sum;
    double busy_s;            /* time spent in steps */
    double forward_s;         /* of which inside model_forward */
};

struct engine;

/* Starts the scheduler. model and tok are borrowed and must outlive the engine. */
enum ar_status engine_create(const struct model *m, const struct tokenizer *tok,
                             const struct engine_params *p, struct engine **out,
                             struct ar_err *err);
/* Cancels everything still queued or running (their on_done runs), then stops. */
void engine_destroy(struct engine *e);

/* Queues a request. AR_EBUSY: queue full (retry later); AR_ERANGE: n_prompt + 1 exceeds the
 * context (the model's training context or the KV capacity); AR_EINVAL: bad parameters.
 * On success *id identifies it for engine_cancel and on_done will be called. */
enum ar_status engine_submit(struct engine *e, const struct engine_request *req, uint64_t *id);
/* Cancels a queued or running request; unknown or finished ids are ignored. Its KV blocks are
 * freed before on_done runs. */
void engine_cancel(struct engine *e, uint64_t id);

void engine_get_stats(struct engine *e, struct engine_stats *out);
/* Largest prompt + generation the engine accepts (tokens). */
int engine_n_ctx(const struct engine *e);

#endif
