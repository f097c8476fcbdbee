/* reply_fakes.h - what the tests of the reply service and its endpoints share around their
 * scripted generators: a stable number per review text (so that replies differ per review),
 * and a caller's token budget that behaves like the server's. */
#ifndef AR_TEST_REPLY_FAKES_H
#define AR_TEST_REPLY_FAKES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/hash.h"
#include "reply/reply.h"
#include "store/store.h"

/* The built-in profiles with one generation per review (no candidates, no aspect notes): the
 * tests that count model calls per review or per job line. */
static inline enum ar_status th_profiles_single(struct reply_profiles **out)
{
    static const char json[] = "{\"default\": {\"candidates\": 1, \"aspect_notes\": false}}";
    return reply_profiles_parse(json, strlen(json), out, NULL);
}

/* FNV-1a of s. */
static inline uint32_t th_fnv32(const char *s)
{
    return ar_fnv1a32(AR_FNV32_BASIS, s, strlen(s));
}

/* A token bucket like the server's: admission needs min(n, cap) tokens, charges may go into
 * debt. Initialise as {PTHREAD_MUTEX_INITIALIZER, level, cap, 0, 0}. */
struct th_budget {
    pthread_mutex_t mu;
    double level, cap;
    int64_t charged;
    int refused;
};

/* The reply_call charge callback over a struct th_budget (user); refusals ask for 7 s. */
static inline bool th_budget_charge(void *user, int64_t n, bool admission, double *retry_after_s)
{
    struct th_budget *b = user;
    bool ok = true;
    pthread_mutex_lock(&b->mu);
    if (admission && b->level < ((double)n < b->cap ? (double)n : b->cap)) {
        *retry_after_s = 7.0;
        b->refused++;
        ok = false;
    } else {
        b->level -= (double)n;
        b->charged += n;
    }
    pthread_mutex_unlock(&b->mu);
    return ok;
}

/* A reply service over an in-memory store and a scripted generator, for the fault-injection
 * tests: one worker, no sweeps or lease expiry during a test. */
struct th_reply_fx {
    struct store *store;
    struct reply_profiles *profiles;
    struct reply_service *svc;
    struct reply_generator gen;
};

/* Fills *x (zeroed by the caller); single: th_profiles_single, else the built-in profiles.
 * cJSON allocates through ar_malloc, so its allocations are injected too. */
static inline int th_reply_fx_open(struct th_reply_fx *x,
                                   enum ar_status (*generate)(struct reply_generator *,
                                                              const struct reply_gen_request *,
                                                              char **, size_t *),
                                   bool single)
{
    struct reply_service_params p = reply_service_default_params();
    ar_json_use_ar_alloc();
    ar_log_set_level(AR_LOG_ERROR);
    if (store_open(":memory:", &x->store, NULL) != AR_OK ||
        (single ? th_profiles_single(&x->profiles) : reply_profiles_default(&x->profiles)) != AR_OK)
        return -1;
    x->gen.generate = generate;
    x->gen.model_name = "fake";
    p.profiles = x->profiles;
    p.store = x->store;
    p.gen = &x->gen;
    p.n_workers = 1;
    p.job_sweep_s = 86400;
    p.claim_lease_s = 86400;
    p.instance = "faults-test";
    return reply_service_create(&p, &x->svc) == AR_OK ? 0 : -1;
}

static inline void th_reply_fx_close(struct th_reply_fx *x)
{
    reply_service_destroy(x->svc);
    reply_profiles_destroy(x->profiles);
    store_close(x->store);
}

#endif
