/* reply_internal.h - shared by the files of src/reply/ (not the cache and normalizer, which
 * stand alone; the UTF-8 decoder lives in the normalizer): CJK ranges and the service's
 * private state. */
#ifndef AR_REPLY_INTERNAL_H
#define AR_REPLY_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/utf8.h"
#include "normalize.h"
#include "reply.h"

bool reply_is_cjk(uint32_t cp);

/* ---- service internals (pipeline.c, jobs.c, frontend.c) ---------------------------------- */

struct reply_task {
    void (*fn)(void *arg);
    void *arg;
    struct reply_task *next;
};

struct reply_metrics {
    struct metrics_child *src[5];         /* replies by source */
    struct metrics_child *errors;         /* requests answered with an error status */
    /* [class]: {class="interactive"}, {class="bulk"} (enum cache_class); hits by level too:
     * [class][0] {level="l1"}, [class][1] {level="l2"} */
    struct metrics_child *cache_hits[CACHE_N_CLASSES][2];
    struct metrics_child *cache_misses[CACHE_N_CLASSES], *cache_evictions[CACHE_N_CLASSES];
    struct metrics_child *cache_errors;
    struct metrics_child *needs_human;
    struct metrics_child *model_calls;    /* reviews sent to the model (once each, retries
                                             included in the one) */
    struct metrics_child *retries[REPLY_GUARD_COUNT];
    struct metrics_child *latency[2];     /* {cached="false"}, {cached="true"} */
    struct metrics_child *job_items_done, *job_items_error; /* autoreply_jobs_items_total */
    struct metrics_child *job_items_pending;                /* gauge, set by the runner */
};

/* A claim this instance holds while it answers the review (on the answering thread's stack). */
struct reply_held_claim {
    const char *shop_id, *review_id, *owner;
    struct reply_held_claim *prev, *next;
};

struct reply_service {
    struct reply_service_params p;
    pthread_mutex_t mu;
    struct reply_generator *gen; /* under mu */
    struct reply_metrics m;
    uint64_t evictions_seen[CACHE_N_CLASSES]; /* under mu */
    uint64_t errors_seen[CACHE_N_CLASSES];    /* under mu: cache backend errors already counted */
    /* worker pool: async requests and answer_many */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    struct reply_task *q_head, *q_tail;
    int q_len;
    pthread_t *workers;
    int n_workers;
    bool stopping;
    /* the claims being answered, renewed every claim_lease_s / 3 so that a live owner keeps
     * them however long its generation takes and a dead one loses them within the lease */
    pthread_mutex_t claims_mu;
    pthread_cond_t claims_cv; /* stopping */
    struct reply_held_claim *claims;
    pthread_t renewer;
    bool renewer_on, renewer_stop;
    /* jobs (jobs.c) */
    struct queue *queue;       /* p.queue or owned_queue */
    struct queue *owned_queue; /* the in-process queue made when p.queue is NULL */
    struct reply_runner *runner; /* the queue consumer, once reply_jobs_start ran */
    /* shop profiles saved in the store (shops.c) */
    pthread_mutex_t shops_mu;
    struct reply_shop *shops;      /* under shops_mu: shops looked up, with their stored profile */
    struct reply_retired *retired; /* under shops_mu: replaced profiles, freed with the service
                                   (a request may still hold one) */
};

/* shops.c: the profile a review of shop_id is answered with: the one saved in the store
 * (re-read every REPLY_SHOP_REFRESH_S, at once after a put on this instance), else the config
 * file's. Borrowed until the service is destroyed. */
const struct reply_profile *reply_profile_of(struct reply_service *svc, const char *shop_id);
void reply_shops_init(struct reply_service *svc);
void reply_shops_fini(struct reply_service *svc);

/* Queues fn(arg) on the worker pool; AR_EBUSY when the queue is full or stopping. */
enum ar_status reply_submit(struct reply_service *svc, void (*fn)(void *), void *arg, bool bounded);
/* The job side of create (the queue, the gauge) and destroy: reply_jobs_stop waits for the runner's
 * lines in progress and hands the others back; reply_jobs_fini then frees an owned queue. */
enum ar_status reply_jobs_init(struct reply_service *svc);
void reply_jobs_stop(struct reply_service *svc);
void reply_jobs_fini(struct reply_service *svc);

/* jobs.c: a JSONL job body split and judged as job creation does, without a store: strict
 * (reply_job_submit: every non-blank line, each checked as a review against default_shop,
 * the bad ones counted in *n_bad) or lenient (reply_job_create: lines kept as text, a NUL in
 * one refuses the body). The line count in *n_lines. Errors as those functions'. For the
 * JSONL fuzz target (fuzz/jobs_fuzz.c) and fault-injection tests. */
enum ar_status reply_job_lines_check(const char *body, size_t len, const char *default_shop,
                                     bool strict, int64_t *n_lines, int64_t *n_bad,
                                     struct ar_err *err);

#endif
