/* pipeline.c - the reply service: one review through store, profile, sentiment, reply cache,
 * generation with guardrails and retries, signature, cache and store (reply.h lists the
 * steps), plus many reviews at once on short-lived threads, the async worker pool and the
 * reply metrics. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/deadline.h"
#include "normalize.h"
#include "reply_internal.h"

struct reply_service_params reply_service_default_params(void)
{
    struct reply_service_params p;
    memset(&p, 0, sizeof(p));
    p.max_retries = 2;
    p.temperature = 0.0f;
    p.retry_temperature = 0.7f;
    p.seed = 1234;
    p.max_tokens = 160;
    p.timeout_s = 60;
    p.n_workers = 8;
    p.queue_max = 256;
    p.claim_lease_s = 15;
    p.job_sweep_s = 10;
    p.webhook_tries = 4;
    p.webhook_backoff_s = 1;
    p.webhook_timeout_s = 5;
    return p;
}

const char *reply_source_str(enum reply_source s)
{
    static const char *const names[] = {"model", "cache", "store", "fallback", "off"};
    return (unsigned)s < AR_ARRAY_LEN(names) ? names[s] : "unknown";
}

void reply_generator_destroy(struct reply_generator *g)
{
    if (g && g->destroy)
        g->destroy(g);
}

const char *reply_action_str(enum reply_action a)
{
    return a == REPLY_ACTION_SEND ? "send" : a == REPLY_ACTION_SUGGEST ? "suggest" : "none";
}

/* ---- metrics ----------------------------------------------------------------------------- */

static struct metrics_child *counter(struct metrics_registry *reg, const char *name,
                                     const char *help, const char *label, const char *value)
{
    struct metrics_family *f;
    const char *names[2] = {label, NULL};
    const char *values[1] = {value};
    if (metrics_counter(reg, name, help, label ? names : NULL, &f) != AR_OK)
        return NULL;
    return metrics_child(f, label ? values : NULL);
}

static struct metrics_child *counter2(struct metrics_registry *reg, const char *name,
                                      const char *help, const char *label1, const char *value1,
                                      const char *label2, const char *value2)
{
    struct metrics_family *f;
    const char *names[3] = {label1, label2, NULL};
    const char *values[2] = {value1, value2};
    if (metrics_counter(reg, name, help, names, &f) != AR_OK)
        return NULL;
    return metrics_child(f, values);
}

static void metrics_setup(struct reply_service *svc)
{
    struct metrics_registry *reg = svc->p.metrics;
    struct reply_metrics *m = &svc->m;
    struct metrics_family *f;
    if (!reg)
        return;
    for (int s = 0; s < 5; s++)
        m->src[s] = counter(reg, "autoreply_reply_replies_total",
                            "Review replies answered, by where the reply came from", "source",
                            reply_source_str((enum reply_source)s));
    m->errors = counter(reg, "autoreply_reply_errors_total",
                        "Review requests answered with an error (bad input, busy, failure)",
                        NULL, NULL);
    for (int c = 0; c < CACHE_N_CLASSES; c++) {
        const char *cls = cache_class_str((enum cache_class)c);
        for (int l = 0; l < 2; l++)
            m->cache_hits[c][l] =
                counter2(reg, "autoreply_reply_cache_hits_total",
                         "Reply cache lookups that found a reply, by the traffic class that "
                         "looked (interactive, bulk) and the cache level that answered (l1: in "
                         "process, l2: shared)",
                         "class", cls, "level", l ? "l2" : "l1");
        m->cache_misses[c] = counter(reg, "autoreply_reply_cache_misses_total",
                                     "Reply cache lookups that found nothing, by the traffic "
                                     "class that looked",
                                     "class", cls);
        m->cache_evictions[c] = counter(reg, "autoreply_reply_cache_evictions_total",
                                        "Reply cache entries pushed out by the byte budget, by "
                                        "the class whose budget it was",
                                        "class", cls);
    }
    m->cache_errors = counter(reg, "autoreply_cache_backend_errors_total",
                              "Reply cache calls its backend server failed (unreachable, error "
                              "reply)",
                              "backend", "redis");
    m->needs_human = counter(reg, "autoreply_reply_needs_human_total",
                             "Replies routed to a person (low rating, negative, sensitive)",
                             NULL, NULL);
    m->model_calls = counter(reg, "autoreply_reply_model_calls_total",
                             "Reviews this instance sent to the model (each once, whatever its "
                             "regenerations): the generations a fleet pays for",
                             NULL, NULL);
    for (int g = 1; g < REPLY_GUARD_COUNT; g++)
        m->retries[g] = counter(reg, "autoreply_reply_guard_rejections_total",
                                "Generated replies rejected by a guardrail, by reason", "reason",
                                reply_guard_str((enum reply_guard)g));
    {
        static const char *const cached_label[] = {"cached", NULL};
        if (metrics_histogram(reg, "autoreply_reply_latency_seconds",
                              "Time to answer one review, by whether the reply was cached (reply "
                              "cache or store) or generated",
                              cached_label, NULL, 0, &f) == AR_OK) {
            m->latency[0] = metrics_child(f, (const char *const[]){"false"});
            m->latency[1] = metrics_child(f, (const char *const[]){"true"});
        }
    }
    m->job_items_done = counter(reg, "autoreply_jobs_items_total",
                                "Job lines finished, by status (done: a reply; error: a bad line)",
                                "status", "done");
    m->job_items_error = counter(reg, "autoreply_jobs_items_total",
                                 "Job lines finished, by status (done: a reply; error: a bad line)",
                                 "status", "error");
}

/* The cache of a class (NULL: none). */
static struct cache *class_cache(const struct reply_service *svc, enum cache_class cls)
{
    return cls == CACHE_CLASS_BULK ? svc->p.bulk_cache : svc->p.cache;
}

/* Counts a class's evictions and backend errors by the difference of its cache's own
 * counters since the last look. */
static void note_cache_counters(struct reply_service *svc, enum cache_class cls)
{
    struct cache *c = class_cache(svc, cls);
    struct cache_stats cs;
    uint64_t delta = 0, errors = 0;
    if (!c)
        return;
    if (c == svc->p.cache)
        cls = CACHE_CLASS_INTERACTIVE; /* one cache for both classes: counted once, as its own */
    cache_stats(c, &cs);
    pthread_mutex_lock(&svc->mu);
    if (cs.evictions > svc->evictions_seen[cls]) {
        delta = cs.evictions - svc->evictions_seen[cls];
        svc->evictions_seen[cls] = cs.evictions;
    }
    if (cs.errors > svc->errors_seen[cls]) {
        errors = cs.errors - svc->errors_seen[cls];
        svc->errors_seen[cls] = cs.errors;
    }
    pthread_mutex_unlock(&svc->mu);
    if (delta)
        metrics_inc(svc->m.cache_evictions[cls], (double)delta);
    if (errors)
        metrics_inc(svc->m.cache_errors, (double)errors);
}

/* Looks the key up for a class: interactive in its own cache; bulk in the interactive cache
 * read-only (a reply a customer got is a hit, but bulk lookups must not keep entries there
 * alive or copy L2 hits into its L1), then in its own. Returns the level that answered (0: a
 * miss); *hit is new. */
static int class_lookup(struct reply_service *svc, enum cache_class cls, const char *key,
                        size_t key_len, char **hit)
{
    int level = 0;
    *hit = NULL;
    if (cls == CACHE_CLASS_BULK && svc->p.cache)
        level = cache_get_flags(svc->p.cache, key, key_len, CACHE_GET_READ_ONLY, hit, NULL);
    if (!level && class_cache(svc, cls))
        level = cache_get(class_cache(svc, cls), key, key_len, hit, NULL);
    return level;
}

/* ---- worker pool ------------------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    struct reply_service *svc = arg;
    for (;;) {
        struct reply_task *t;
        pthread_mutex_lock(&svc->q_mu);
        while (!svc->q_head && !svc->stopping)
            pthread_cond_wait(&svc->q_cv, &svc->q_mu);
        t = svc->q_head;
        if (!t) { /* stopping and drained */
            pthread_mutex_unlock(&svc->q_mu);
            return NULL;
        }
        svc->q_head = t->next;
        if (!svc->q_head)
            svc->q_tail = NULL;
        svc->q_len--;
        pthread_mutex_unlock(&svc->q_mu);
        t->fn(t->arg);
        ar_free(t);
    }
}

enum ar_status reply_submit(struct reply_service *svc, void (*fn)(void *), void *arg, bool bounded)
{
    struct reply_task *t = ar_calloc(1, sizeof(*t));
    if (!t)
        return AR_ENOMEM;
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_lock(&svc->q_mu);
    if (svc->stopping || (bounded && svc->q_len >= svc->p.queue_max)) {
        pthread_mutex_unlock(&svc->q_mu);
        ar_free(t);
        return AR_EBUSY;
    }
    if (svc->q_tail)
        svc->q_tail->next = t;
    else
        svc->q_head = t;
    svc->q_tail = t;
    svc->q_len++;
    pthread_cond_signal(&svc->q_cv);
    pthread_mutex_unlock(&svc->q_mu);
    return AR_OK;
}

static void release_old_claims(const struct reply_service_params *p);

/* ---- lifetime ---------------------------------------------------------------------------- */

/* Renews the claims in progress (their owners are alive) every lease / 3. The renewals run
 * under claims_mu, so a claim is never renewed after its answer unregistered it (and then
 * stored or gave it up). */
static void *renewer_main(void *arg)
{
    struct reply_service *svc = arg;
    double period = svc->p.claim_lease_s / 3;
    pthread_mutex_lock(&svc->claims_mu);
    while (!svc->renewer_stop) {
        struct timespec ts = ar_deadline_in(CLOCK_REALTIME, period);
        pthread_cond_timedwait(&svc->claims_cv, &svc->claims_mu, &ts);
        if (svc->renewer_stop)
            break;
        for (struct reply_held_claim *c = svc->claims; c; c = c->next) {
            struct ar_err err = {AR_OK, 0, {0}};
            struct store_reply row;
            enum store_claim got = STORE_CLAIM_HELD;
            enum ar_status st;
            memset(&row, 0, sizeof(row));
            st = store_reply_claim(svc->p.store, c->shop_id, c->review_id, c->owner,
                                   svc->p.claim_lease_s, &got, &row, &err);
            if (got == STORE_CLAIM_STORED)
                store_reply_fini(&row);
            if (st != AR_OK)
                AR_WARN("reply: renewing the claim on %s/%s: %s: %s", c->shop_id, c->review_id,
                        ar_status_str(st), err.msg);
            else if (got == STORE_CLAIM_HELD)
                AR_WARN("reply: the claim on %s/%s went to another instance while answering it",
                        c->shop_id, c->review_id);
        }
    }
    pthread_mutex_unlock(&svc->claims_mu);
    return NULL;
}

static void claim_register(struct reply_service *svc, struct reply_held_claim *c)
{
    pthread_mutex_lock(&svc->claims_mu);
    c->prev = NULL;
    c->next = svc->claims;
    if (svc->claims)
        svc->claims->prev = c;
    svc->claims = c;
    pthread_mutex_unlock(&svc->claims_mu);
}

static void claim_unregister(struct reply_service *svc, struct reply_held_claim *c)
{
    pthread_mutex_lock(&svc->claims_mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        svc->claims = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&svc->claims_mu);
}

static bool service_stopping(struct reply_service *svc)
{
    bool s;
    pthread_mutex_lock(&svc->q_mu);
    s = svc->stopping;
    pthread_mutex_unlock(&svc->q_mu);
    return s;
}

enum ar_status reply_service_create(const struct reply_service_params *p,
                                    struct reply_service **out)
{
    struct reply_service *svc;
    ar_json_use_ar_alloc(); /* job lines and stored replies counted with the rest */
    if (!p || !p->profiles || !p->store || p->max_retries < 0 || p->max_tokens < 1 ||
        p->n_workers < 1 || p->queue_max < 1 ||
        !(p->claim_lease_s > 0 && p->claim_lease_s <= 86400))
        return AR_EINVAL;
    svc = ar_calloc(1, sizeof(*svc));
    if (!svc)
        return AR_ENOMEM;
    release_old_claims(p);
    svc->p = *p;
    svc->gen = p->gen;
    pthread_mutex_init(&svc->mu, NULL);
    pthread_mutex_init(&svc->q_mu, NULL);
    pthread_cond_init(&svc->q_cv, NULL);
    pthread_mutex_init(&svc->claims_mu, NULL);
    pthread_cond_init(&svc->claims_cv, NULL);
    reply_shops_init(svc);
    metrics_setup(svc);
    if (pthread_create(&svc->renewer, NULL, renewer_main, svc) != 0) {
        reply_service_destroy(svc);
        return AR_ENOMEM;
    }
    svc->renewer_on = true;
    if (reply_jobs_init(svc) != AR_OK) {
        reply_service_destroy(svc);
        return AR_ENOMEM;
    }
    svc->workers = ar_calloc((size_t)p->n_workers, sizeof(pthread_t));
    if (!svc->workers) {
        reply_service_destroy(svc);
        return AR_ENOMEM;
    }
    for (int i = 0; i < p->n_workers; i++) {
        if (pthread_create(&svc->workers[i], NULL, worker_main, svc) != 0) {
            reply_service_destroy(svc);
            return AR_ENOMEM;
        }
        svc->n_workers++;
    }
    *out = svc;
    return AR_OK;
}

void reply_service_destroy(struct reply_service *svc)
{
    if (!svc)
        return;
    pthread_mutex_lock(&svc->q_mu);
    svc->stopping = true;
    pthread_cond_broadcast(&svc->q_cv);
    pthread_mutex_unlock(&svc->q_mu);
    reply_jobs_stop(svc);
    for (int i = 0; i < svc->n_workers; i++)
        pthread_join(svc->workers[i], NULL);
    ar_free(svc->workers);
    reply_jobs_fini(svc);
    if (svc->renewer_on) {
        pthread_mutex_lock(&svc->claims_mu);
        svc->renewer_stop = true;
        pthread_cond_signal(&svc->claims_cv);
        pthread_mutex_unlock(&svc->claims_mu);
        pthread_join(svc->renewer, NULL);
    }
    pthread_cond_destroy(&svc->claims_cv);
    pthread_mutex_destroy(&svc->claims_mu);
    pthread_cond_destroy(&svc->q_cv);
    pthread_mutex_destroy(&svc->q_mu);
    pthread_mutex_destroy(&svc->mu);
    reply_shops_fini(svc);
    ar_free(svc);
}

void reply_service_set_generator(struct reply_service *svc, struct reply_generator *gen)
{
    pthread_mutex_lock(&svc->mu);
    svc->gen = gen;
    pthread_mutex_unlock(&svc->mu);
}

/* ---- input ------------------------------------------------------------------------------- */

static bool id_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n > 0 && n <= STORE_ID_MAX && !memchr(s, 0x1f, n) && ar_utf8_valid(s, n);
}

/* Checks rv; on a problem writes msg and returns false. */
static bool review_ok(const struct reply_review *rv, char *msg, size_t msg_size)
{
    if (!id_ok(rv->shop_id)) {
        snprintf(msg, msg_size, "shop_id must be 1..%d bytes of UTF-8", STORE_ID_MAX);
        return false;
    }
    if (!id_ok(rv->review_id)) {
        snprintf(msg, msg_size, "review_id must be 1..%d bytes of UTF-8", STORE_ID_MAX);
        return false;
    }
    if (!rv->text) {
        snprintf(msg, msg_size, "text is required");
        return false;
    }
    if (rv->text_len > REPLY_TEXT_MAX) {
        snprintf(msg, msg_size, "text is %zu bytes, more than the limit of %d", rv->text_len,
                 REPLY_TEXT_MAX);
        return false;
    }
    if (!ar_utf8_valid(rv->text, rv->text_len) || memchr(rv->text, 0, rv->text_len)) {
        snprintf(msg, msg_size, "text is not valid UTF-8");
        return false;
    }
    {
        /* a text of only spaces and markup has nothing to answer */
        char *clean;
        size_t clean_len = 0;
        if (reply_sanitize_review(rv->text, rv->text_len, &clean, &clean_len) == AR_OK)
            ar_free(clean);
        if (clean_len == 0) {
            snprintf(msg, msg_size, "text is empty");
            return false;
        }
    }
    if (rv->rating < 1 || rv->rating > 5) {
        snprintf(msg, msg_size, "rating must be an integer from 1 to 5");
        return false;
    }
    if (rv->product && (strlen(rv->product) > REPLY_PRODUCT_MAX ||
                        !ar_utf8_valid(rv->product, strlen(rv->product)))) {
        snprintf(msg, msg_size, "product must be at most %d bytes of UTF-8", REPLY_PRODUCT_MAX);
        return false;
    }
    if (rv->lang && strcmp(rv->lang, "zh") != 0 && strcmp(rv->lang, "en") != 0) {
        snprintf(msg, msg_size, "lang must be \"zh\" or \"en\"");
        return false;
    }
    return true;
}

static const char *json_str(const cJSON *j, const char *key, bool *bad)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v))
        return NULL;
    if (!cJSON_IsString(v)) {
        *bad = true;
        return NULL;
    }
    return v->valuestring;
}

enum ar_status reply_review_from_json(const cJSON *j, const char *default_shop,
                                      struct reply_review *rv, char *msg, size_t msg_size)
{
    const cJSON *rating, *text;
    bool bad = false;
    memset(rv, 0, sizeof(*rv));
    if (!cJSON_IsObject(j)) {
        snprintf(msg, msg_size, "a review must be a JSON object");
        return AR_EINVAL;
    }
    rv->shop_id = json_str(j, "shop_id", &bad);
    if (bad) {
        snprintf(msg, msg_size, "shop_id must be a string");
        return AR_EINVAL;
    }
    if (!rv->shop_id)
        rv->shop_id = default_shop;
    rv->review_id = json_str(j, "review_id", &bad);
    if (bad) {
        snprintf(msg, msg_size, "review_id must be a string");
        return AR_EINVAL;
    }
    {
        /* data files name it "id": either is the review's id, both only when they agree */
        const char *id = json_str(j, "id", &bad);
        if (bad) {
            snprintf(msg, msg_size, "id (the review_id) must be a string");
            return AR_EINVAL;
        }
        if (rv->review_id && id && strcmp(rv->review_id, id) != 0) {
            snprintf(msg, msg_size,
                     "review_id \"%.60s\" and id \"%.60s\" differ: both name the review's id; "
                     "give one of them",
                     rv->review_id, id);
            return AR_EINVAL;
        }
        if (!rv->review_id)
            rv->review_id = id;
    }
    text = cJSON_GetObjectItemCaseSensitive(j, "text");
    if (!text || cJSON_IsNull(text)) {
        snprintf(msg, msg_size, "text is required");
        return AR_EINVAL;
    }
    if (!cJSON_IsString(text)) {
        snprintf(msg, msg_size, "text must be a string");
        return AR_EINVAL;
    }
    rv->text = text->valuestring;
    rv->text_len = strlen(text->valuestring);
    rating = cJSON_GetObjectItemCaseSensitive(j, "rating");
    if (!cJSON_IsNumber(rating) || rating->valuedouble != floor(rating->valuedouble) ||
        rating->valuedouble < 1 || rating->valuedouble > 5) {
        snprintf(msg, msg_size, "rating must be an integer from 1 to 5");
        return AR_EINVAL;
    }
    rv->rating = (int)rating->valuedouble;
    rv->product = json_str(j, "product", &bad);
    rv->lang = json_str(j, "lang", &bad);
    if (bad) {
        snprintf(msg, msg_size, "product and lang must be strings");
        return AR_EINVAL;
    }
    return review_ok(rv, msg, msg_size) ? AR_OK : AR_EINVAL;
}

/* ---- results ----------------------------------------------------------------------------- */

void reply_result_fini(struct reply_result *r)
{
    if (!r)
        return;
    ar_free(r->reply);
    memset(r, 0, sizeof(*r));
}

static void set_error(struct reply_result *r, enum reply_error e, const char *fmt, ...)
    AR_PRINTF(3, 4);
static void set_error(struct reply_result *r, enum reply_error e, const char *fmt, ...)
{
    va_list ap;
    r->err = e;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof(r->error), fmt, ap);
    va_end(ap);
}

cJSON *reply_result_to_json(const struct reply_result *r, const char *review_id)
{
    cJSON *j = cJSON_CreateObject();
    bool ok = j != NULL;
    if (ok && review_id)
        ok = cJSON_AddStringToObject(j, "review_id", review_id) != NULL;
    if (ok && r->err != REPLY_OK) {
        cJSON *e = cJSON_AddObjectToObject(j, "error");
        ok = e && cJSON_AddStringToObject(e, "message", r->error) &&
             cJSON_AddStringToObject(e, "code", reply_error_code(r->err));
    } else if (ok) {
        ok = cJSON_AddStringToObject(j, "reply", r->reply ? r->reply : "") &&
             cJSON_AddBoolToObject(j, "cached", r->cached) &&
             cJSON_AddBoolToObject(j, "needs_human", r->needs_human) &&
             cJSON_AddStringToObject(j, "sentiment", reply_sentiment_str(r->sentiment)) &&
             cJSON_AddNumberToObject(j, "sentiment_score",
                                     round((double)r->sentiment_score * 1000.0) / 1000.0) &&
             cJSON_AddStringToObject(j, "lang", r->lang) &&
             cJSON_AddStringToObject(j, "model", r->model) &&
             cJSON_AddNumberToObject(j, "latency_ms", round(r->latency_ms * 1000.0) / 1000.0) &&
             cJSON_AddStringToObject(j, "source", reply_source_str(r->source)) &&
             cJSON_AddStringToObject(j, "action", reply_action_str(r->action));
    }
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* ---- one review -------------------------------------------------------------------------- */

static bool has_sensitive(const struct reply_profile *p, const char *text, size_t len)
{
    return reply_find_word(text, len, p->sensitive, p->n_sensitive) >= 0;
}

static enum reply_action decide_action(const struct reply_profile *p, int rating,
                                       bool needs_human)
{
    if (p->mode == REPLY_MODE_OFF)
        return REPLY_ACTION_NONE;
    if (p->mode == REPLY_MODE_SUGGEST)
        return REPLY_ACTION_SUGGEST;
    if (rating < p->auto_min_rating || (needs_human && p->hold_needs_human))
        return REPLY_ACTION_SUGGEST;
    return REPLY_ACTION_SEND;
}

/* ---- candidates ---------------------------------------------------------------------------
 * A review's first round generates prof->candidates replies at once: candidate 0 as a single
 * generation always was (greedy, the service's seed), the others sampled with their own seeds.
 * They are submitted together from their own threads, so the engine batches them and its
 * prefix cache serves the shared prompt once; the round costs about one generation's latency
 * plus the batch's extra decode work, not n generations one after another. */

#define CANDIDATES_MAX 8
#define NOTES_MAX 4 /* aspects one note names */
/* Once the greedy candidate is done, the sampled ones get this share of its time more, then the
 * ones still generating are stopped and drop out: a sampled reply that rambles to max_tokens
 * must not make the review wait for it (today's reply is always at hand by then). The round
 * so stays within about 1.5 times one batched generation. */
#define EXTRA_WAIT 0.25
#define EXTRA_WAIT_MIN_S 0.005

struct candidate {
    struct reply_generator *gen;
    struct reply_gen_request gr;
    struct reply_gen_usage usage;
    enum ar_status st;
    char *out;
    size_t out_len;
    pthread_t th;
    bool threaded;
    struct reply_call *sub; /* a sampled candidate's own call (charges go to the caller's) */
    struct round *round;
    bool done;              /* under round->mu */
};

struct round {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct candidate *cands;
    int n;
};

static void candidate_main_plain(struct candidate *c)
{
    c->st = c->gen->generate(c->gen, &c->gr, &c->out, &c->out_len);
}

static void *candidate_main(void *arg)
{
    struct candidate *c = arg;
    candidate_main_plain(c);
    pthread_mutex_lock(&c->round->mu);
    c->done = true;
    pthread_cond_broadcast(&c->round->cv);
    pthread_mutex_unlock(&c->round->mu);
    return NULL;
}

/* A sampled candidate's call charges the caller's budget (reply_call_charge does not hold its
 * own lock across the charge function, so there is no lock order to keep). */
static bool charge_parent(void *user, int64_t n_tokens, bool admission, double *retry_after_s)
{
    return reply_call_charge(user, n_tokens, admission, retry_after_s);
}

/* The caller went away: the sampled candidates stop too (called under the caller's lock; the
 * sub-calls' locks are only ever taken after it). */
static void cancel_extras(void *arg)
{
    struct round *rd = arg;
    for (int i = 1; i < rd->n; i++)
        reply_call_cancel(rd->cands[i].sub);
}

static bool round_all_done(struct round *rd)
{
    for (int i = 1; i < rd->n; i++)
        if (rd->cands[i].threaded && !rd->cands[i].done)
            return false;
    return true;
}

/* Runs cands[0..n) concurrently: 1..n-1 on threads with calls of their own, 0 on the caller's
 * thread (a thread that cannot be made runs its candidate afterwards on the caller's). Once 0
 * is done the others get EXTRA_WAIT of its time to finish, then are stopped. */
static void run_candidates(struct candidate *cands, int n, struct reply_call *call)
{
    struct round rd = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, cands, n};
    struct reply_call_hook hook = {cancel_extras, &rd, NULL, NULL};
    bool watched;
    double t0, wait_s;
    struct timespec until;
    if (n == 1) {
        candidate_main_plain(&cands[0]);
        return;
    }
    for (int i = 1; i < n; i++) {
        cands[i].round = &rd;
        if (reply_call_create(charge_parent, call, &cands[i].sub) == AR_OK)
            cands[i].gr.call = cands[i].sub;
    }
    watched = reply_call_watch(call, &hook);
    if (!watched)
        cancel_extras(&rd); /* cancelled already */
    for (int i = 1; i < n; i++)
        cands[i].threaded = pthread_create(&cands[i].th, NULL, candidate_main, &cands[i]) == 0;
    t0 = ar_time_s();
    candidate_main_plain(&cands[0]);
    wait_s = AR_MAX((ar_time_s() - t0) * EXTRA_WAIT, EXTRA_WAIT_MIN_S);
    until = ar_deadline_in(CLOCK_REALTIME, wait_s);
    pthread_mutex_lock(&rd.mu);
    while (!round_all_done(&rd) && pthread_cond_timedwait(&rd.cv, &rd.mu, &until) == 0)
        ;
    pthread_mutex_unlock(&rd.mu);
    for (int i = 1; i < n; i++)
        if (cands[i].threaded && cands[i].sub)
            reply_call_cancel(cands[i].sub); /* a finished one ignores it */
    for (int i = 1; i < n; i++) {
        if (cands[i].threaded)
            pthread_join(cands[i].th, NULL);
        else if (!reply_call_cancelled(cands[i].sub))
            candidate_main_plain(&cands[i]);
        else
            cands[i].st = AR_ECANCELED;
    }
    if (watched)
        reply_call_unwatch(call, &hook);
    for (int i = 1; i < n; i++) {
        reply_call_destroy(cands[i].sub);
        cands[i].sub = NULL;
        cands[i].gr.call = call;
    }
    pthread_cond_destroy(&rd.cv);
    pthread_mutex_destroy(&rd.mu);
}

/* The outcome of the generation step. */
struct gen_outcome {
    int source;      /* REPLY_SOURCE_MODEL or REPLY_SOURCE_FALLBACK; -1: r->err is set */
    char *text;      /* new */
    bool held;       /* the chosen reply repeats itself: never sent without a person */
    bool cacheable;  /* a model reply that may be served again from the reply cache */
};

/* Why an attempt's failure ends the review (-1 with r's error set) or not (0). */
static int attempt_error(struct reply_result *r, enum ar_status st, const struct reply_gen_usage *u,
                         bool first)
{
    if (st == AR_ECANCELED) {
        /* never a fallback reply for a caller that left: nothing is stored */
        set_error(r, REPLY_ECANCELLED, "the client went away; the generation was cancelled");
        return -1;
    }
    if (st == AR_EBUSY && u->limited) {
        r->retry_after_s = u->retry_after_s;
        set_error(r, REPLY_ELIMITED, "token rate limit reached; retry after %.0f s",
                  ceil(u->retry_after_s));
        return -1;
    }
    if (st == AR_EBUSY || (st != AR_OK && first)) {
        set_error(r,
                  st == AR_EBUSY    ? REPLY_EBUSY
                  : st == AR_ERANGE ? REPLY_EINVAL
                                    : REPLY_EINTERNAL,
                  "generation failed: %s", st == AR_ERANGE ? "the review does not fit the "
                  "model's context" : ar_status_str(st));
        return -1;
    }
    return 0;
}

/* A generated text through the guardrails: the checked reply (new) or NULL, counted in the
 * rejection metrics. out is consumed. */
static char *checked(struct reply_service *svc, const struct reply_profile *prof,
                     const struct reply_review *rv, const char *reply_lang, char *out,
                     size_t out_len, int attempt)
{
    char *fixed = NULL;
    enum reply_guard g;
    /* a reasoning model's <think> blocks are never part of a reply */
    out_len = tokenizer_strip_think(out, out_len);
    g = reply_guard_check(prof, reply_lang, out, out_len, &fixed);
    ar_free(out);
    if (g == REPLY_GUARD_OK) {
        /* a clause said twice verbatim (the demo model's habit) is said once: the cut is safe,
         * unlike a shared phrase, which reply_find_repeat still catches */
        char *once = NULL, *checked_once = NULL;
        if (reply_find_repeat(fixed, strlen(fixed)) == REPLY_REPEAT_CLAUSE &&
            reply_drop_repeated_clauses(fixed, strlen(fixed), &once) == AR_OK &&
            reply_guard_check(prof, reply_lang, once, strlen(once), &checked_once) ==
                REPLY_GUARD_OK) {
            ar_free(fixed);
            fixed = checked_once;
        }
        ar_free(once);
        return fixed;
    }
    metrics_inc(svc->m.retries[g], 1);
    AR_DEBUG("reply %s/%s: attempt %d rejected (%s)", rv->shop_id, rv->review_id, attempt,
             reply_guard_str(g));
    return NULL;
}

/* Of the checked candidates (NULL: rejected), the index with the best score; the first wins a
 * tie, so the greedy reply stays the answer unless another is better. -1 when none. */
static int best_candidate(const struct reply_profile *prof, const struct reply_review *rv,
                          const char *reply_lang, unsigned wanted, char **texts, int n,
                          struct reply_score *best)
{
    int pick = -1;
    for (int i = 0; i < n; i++) {
        struct reply_score sc;
        if (!texts[i])
            continue;
        reply_candidate_score(prof, reply_lang, rv->rating, wanted, texts[i], strlen(texts[i]),
                              &sc);
        if (pick < 0 || sc.total > best->total) {
            pick = i;
            *best = sc;
        }
    }
    return pick;
}

/* The chosen reply with notes for the aspects it misses (prof->aspect_notes). Consumes text. */
static char *with_notes(const struct reply_profile *prof, const struct reply_review *rv,
                        const char *reply_lang, unsigned wanted, const struct reply_score *sc,
                        char *text)
{
    unsigned missing = wanted & ~sc->named;
    char *noted = NULL;
    if (!prof->aspect_notes || !missing || sc->repeat != REPLY_REPEAT_NONE)
        return text;
    if (reply_add_aspect_notes(text, strlen(text), reply_lang, rv->rating, missing, NOTES_MAX,
                               prof->max_chars, &noted) != AR_OK)
        return text; /* out of memory: the reply as generated */
    if (reply_find_repeat(noted, strlen(noted)) != REPLY_REPEAT_NONE ||
        reply_find_word(noted, strlen(noted), prof->banned, prof->n_banned) >= 0) {
        ar_free(noted); /* a note that echoes the reply's own words, or a banned one */
        return text;
    }
    ar_free(text);
    return noted;
}

/* Generates candidates, then (when none passes the guardrails) single regenerations with other
 * seeds up to max_retries times, then the fallback template; of the candidates that pass, the
 * best score (reply_candidate_score: the review's aspects named, language, repetition, banned
 * words, length, tone) is the reply. fresh: a person asked for another reply than the one there
 * is, so every candidate samples (retry_temperature) from a random seed instead of the
 * reproducible first round. */
static void generate(struct reply_service *svc, const struct reply_profile *prof,
                     const struct reply_review *rv, const char *review_lang,
                     const char *reply_lang, bool negative, enum engine_priority prio,
                     struct reply_call *call, bool fresh, struct reply_result *r,
                     struct gen_outcome *o)
{
    uint64_t seed = svc->p.seed;
    struct reply_generator *gen;
    struct candidate cands[CANDIDATES_MAX];
    char *texts[CANDIDATES_MAX];
    struct reply_score best;
    char *user = NULL;
    int n = AR_MAX(1, AR_MIN(prof->candidates, CANDIDATES_MAX)), pick;
    unsigned wanted = reply_aspects_of_review(rv->text, rv->text_len);
    int64_t n_prompt = 0, n_gen = 0;
    memset(o, 0, sizeof(*o));
    o->source = -1;
    pthread_mutex_lock(&svc->mu);
    gen = svc->gen;
    pthread_mutex_unlock(&svc->mu);
    if (!gen) {
        set_error(r, REPLY_EBUSY, "the model is not loaded yet");
        return;
    }
    snprintf(r->model, sizeof(r->model), "%s", gen->model_name ? gen->model_name : "");
    if (reply_user_message(rv->text, rv->text_len, rv->rating, review_lang, &user) != AR_OK) {
        set_error(r, REPLY_EINTERNAL, "out of memory");
        return;
    }
    memset(cands, 0, sizeof(cands));
    memset(texts, 0, sizeof(texts));
    if (fresh && getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = svc->p.seed ^ (uint64_t)time(NULL);
    for (int attempt = 0; attempt <= svc->p.max_retries; attempt++) {
        int m = attempt == 0 ? n : 1; /* regenerations are single */
        for (int i = 0; i < m; i++) {
            struct candidate *c = &cands[i];
            memset(c, 0, sizeof(*c));
            c->gen = gen;
            c->gr.system = prof->system;
            c->gr.user = user;
            c->gr.max_tokens = svc->p.max_tokens;
            c->gr.priority = prio;
            c->gr.timeout_s = svc->p.timeout_s;
            c->gr.call = call;
            c->gr.usage = &c->usage;
            /* candidate 0 of the first round is the single generation of before (greedy by
             * default); sampled candidates take seeds no regeneration uses */
            c->gr.temperature = attempt == 0 && i == 0 && !fresh ? svc->p.temperature
                                                                 : svc->p.retry_temperature;
            if (fresh && !(c->gr.temperature > 0))
                c->gr.temperature = 0.7f;
            c->gr.seed = i == 0 ? seed + (uint64_t)attempt : seed + 0x10000u + (uint64_t)i;
            /* every candidate of the first round asks the caller's budget (each one's tokens
             * are real work); a regeneration finishes what was admitted */
            c->gr.admission = attempt == 0;
            if (reply_call_cancelled(call))
                c->st = AR_ECANCELED;
        }
        if (!reply_call_cancelled(call))
            run_candidates(cands, m, call);
        r->attempts += m;
        for (int i = 0; i < m; i++) {
            n_prompt += cands[i].usage.n_prompt;
            n_gen += cands[i].usage.n_gen;
        }
        r->n_prompt_tokens = n_prompt;
        r->n_gen_tokens = n_gen;
        for (int i = 0; i < m; i++) {
            struct candidate *c = &cands[i];
            if (c->st != AR_OK && c->st != AR_ECANCELED && reply_call_cancelled(call))
                c->st = AR_ECANCELED; /* whatever stopped it, the caller is gone */
        }
        /* candidate 0 speaks for the round: its failure is the review's, as it always was;
         * another candidate's failure only drops that candidate */
        if (cands[0].st != AR_OK && attempt_error(r, cands[0].st, &cands[0].usage,
                                                  attempt == 0) < 0) {
            for (int i = 0; i < m; i++)
                ar_free(cands[i].out);
            ar_free(user);
            return;
        }
        if (cands[0].st != AR_OK && attempt > 0)
            break; /* a later attempt failed: the fallback answers */
        for (int i = 0; i < m; i++) {
            texts[i] = cands[i].st == AR_OK && cands[i].out
                           ? checked(svc, prof, rv, reply_lang, cands[i].out, cands[i].out_len,
                                     attempt)
                           : (ar_free(cands[i].out), NULL);
            cands[i].out = NULL;
        }
        pick = best_candidate(prof, rv, reply_lang, wanted, texts, m, &best);
        if (pick >= 0) {
            o->text = texts[pick];
            texts[pick] = NULL;
            for (int i = 0; i < m; i++)
                ar_free(texts[i]);
            ar_free(user);
            o->held = best.repeat != REPLY_REPEAT_NONE;
            o->cacheable = !o->held; /* a cache hit would be sent without this check */
            if (o->held)
                AR_INFO("reply %s/%s: every candidate repeats itself (%s): held for a person",
                        rv->shop_id, rv->review_id, reply_repeat_str(best.repeat));
            o->text = with_notes(prof, rv, reply_lang, wanted, &best, o->text);
            o->source = REPLY_SOURCE_MODEL;
            return;
        }
    }
    ar_free(user);
    o->text = ar_strdup(reply_fallback_text(reply_lang, negative));
    if (!o->text) {
        set_error(r, REPLY_EINTERNAL, "out of memory");
        return;
    }
    o->source = REPLY_SOURCE_FALLBACK;
}

/* Signature, then banned words removed once more (the signature or a template may hold one):
 * no banned word ever leaves the service. */
static char *finish_text(const struct reply_profile *prof, const char *text)
{
    struct ar_buf b = {0};
    char *joined, *clean = NULL;
    size_t n;
    ar_buf_puts(&b, text);
    if (prof->signature && *prof->signature) {
        ar_buf_puts(&b, "\n");
        ar_buf_puts(&b, prof->signature);
    }
    joined = ar_buf_take(&b, &n);
    if (!joined)
        return NULL;
    if (reply_strip_words(joined, n, prof->banned, prof->n_banned, &clean, NULL) != AR_OK)
        clean = NULL;
    ar_free(joined);
    return clean;
}

/* Whether the review text equals the stored one after normalization (normalize.h): the same
 * review sent again with other spacing, width or trailing punctuation is the same review. */
static bool same_text(const char *a, size_t a_len, const char *b, size_t b_len)
{
    char *na = NULL, *nb = NULL;
    size_t la = 0, lb = 0;
    bool same;
    if (a_len == b_len && !memcmp(a, b, a_len))
        return true;
    if (reply_normalize(a, a_len, &na, &la) != AR_OK ||
        reply_normalize(b, b_len, &nb, &lb) != AR_OK) {
        ar_free(na);
        return false;
    }
    same = la == lb && !memcmp(na, nb, la);
    ar_free(na);
    ar_free(nb);
    return same;
}

/* The answer of a review already stored: the stored record exactly (reply, needs_human,
 * sentiment, lang, model), the action decided from the stored rating; REPLY_ECONFLICT when
 * the review asked now is another text or another rating under the same id. */
static void answer_from_row(const struct reply_profile *prof, const struct reply_review *rv,
                            const struct store_reply *row, struct reply_result *r)
{
    const char *stored = row->text ? row->text : "";
    if (!same_text(rv->text, rv->text_len, stored, strlen(stored))) {
        set_error(r, REPLY_ECONFLICT,
                  "review_id %.60s of shop %.60s was answered for another text; a review id "
                  "stands for one review (use a new id for a new review)",
                  rv->review_id, rv->shop_id);
        return;
    }
    /* the same words with other stars are another review: answering a 1-star review with a
     * stored 5-star reply (and its action: "send" in an auto shop) would be wrong */
    if (row->rating >= 1 && row->rating <= 5 && row->rating != rv->rating) {
        set_error(r, REPLY_ECONFLICT,
                  "review_id %.60s of shop %.60s was answered for a rating of %d, not %d; a "
                  "review id stands for one review (use a new id for a new review)",
                  rv->review_id, rv->shop_id, row->rating, rv->rating);
        return;
    }
    ar_free(r->reply);
    r->reply = ar_strdup(row->reply ? row->reply : "");
    if (!r->reply) {
        set_error(r, REPLY_EINTERNAL, "out of memory");
        return;
    }
    r->needs_human = row->needs_human;
    r->sentiment_score = row->sentiment;
    r->sentiment = reply_sentiment_label(row->sentiment);
    snprintf(r->lang, sizeof(r->lang), "%s", row->lang ? row->lang : "");
    snprintf(r->model, sizeof(r->model), "%s", row->model ? row->model : "");
    r->cached = true;
    r->source = REPLY_SOURCE_STORE;
    r->action = decide_action(prof, row->rating, row->needs_human);
    r->err = REPLY_OK;
}

/* ---- idempotency across requests and instances ------------------------------------------ */

/* Claim owners are "<instance>/<process>/<counter>": the instance's name (the host's name
 * when none is given), this process's random id, and a counter, so that every request owns its
 * own claim and a restarted instance can end what its previous run left. */
static char host_name[64];
static char process_id[20];

static void claim_names_init(void)
{
    uint64_t v = 0;
    if (gethostname(host_name, sizeof(host_name)) != 0 || !host_name[0])
        snprintf(host_name, sizeof(host_name), "autoreply");
    host_name[sizeof(host_name) - 1] = '\0';
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = (uint64_t)getpid() ^ (uint64_t)time(NULL) << 20;
    snprintf(process_id, sizeof(process_id), "%016llx", (unsigned long long)v);
}

static const char *instance_name(const struct reply_service_params *p)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, claim_names_init);
    return p->instance && p->instance[0] ? p->instance : host_name;
}

static void claim_owner(const struct reply_service *svc, char *owner, size_t size)
{
    static atomic_ullong counter;
    snprintf(owner, size, "%.200s/%s/%llu", instance_name(&svc->p), process_id,
             (unsigned long long)atomic_fetch_add(&counter, 1));
}

/* The claims this instance's previous run left when it died end now, so that their reviews
 * (a resumed job's lines, a client's retry) need not wait for the leases. */
static void release_old_claims(const struct reply_service_params *p)
{
    struct ar_err err = {AR_OK, 0, {0}};
    char prefix[STORE_ID_MAX];
    int64_t n = 0;
    enum ar_status st;
    snprintf(prefix, sizeof(prefix), "%.200s/", instance_name(p));
    st = store_reply_claims_release(p->store, prefix, &n, &err);
    if (st != AR_OK)
        AR_WARN("reply: ending the claims of %s's previous run: %s: %s", prefix, ar_status_str(st),
                err.msg);
    else if (n > 0)
        AR_INFO("reply: ended %lld claims left by %s's previous run", (long long)n, prefix);
}

/* Claims the review for owner: *c ends STORED (row filled) or OWNED. While another request
 * holds it, asks again after a short sleep growing from 10 ms to 100 ms, for at most the
 * generation timeout, and stops early when the call is cancelled. Sets r's error otherwise. */
static bool claim_review(struct reply_service *svc, const struct reply_review *rv,
                         struct reply_call *call, const char *owner, enum store_claim *c,
                         struct store_reply *row, struct reply_result *r)
{
    double deadline = ar_time_s() + svc->p.timeout_s;
    long sleep_ms = 10;
    for (;;) {
        struct ar_err err = {AR_OK, 0, {0}};
        enum ar_status st = store_reply_claim(svc->p.store, rv->shop_id, rv->review_id, owner,
                                              svc->p.claim_lease_s, c, row, &err);
        struct timespec ts;
        if (st != AR_OK) {
            set_error(r, reply_error_of_backend(st), "store: %s", err.msg);
            return false;
        }
        if (*c != STORE_CLAIM_HELD)
            return true;
        if (service_stopping(svc)) {
            set_error(r, REPLY_EBUSY, "this instance is stopping; retry shortly");
            return false;
        }
        if (reply_call_cancelled(call)) {
            set_error(r, REPLY_ECANCELLED,
                      "the client went away while the review was answered elsewhere");
            return false;
        }
        if (ar_time_s() + (double)sleep_ms / 1000.0 > deadline) {
            set_error(r, REPLY_EBUSY,
                      "review_id %.60s of shop %.60s is being answered by another request; "
                      "retry shortly",
                      rv->review_id, rv->shop_id);
            return false;
        }
        ts.tv_sec = 0;
        ts.tv_nsec = sleep_ms * 1000000L;
        nanosleep(&ts, NULL);
        sleep_ms = AR_MIN(sleep_ms * 2, 100);
    }
}

/* Step 4: the reply text (owned, consumed) gets the shop's signature and is stored once; if
 * another request stored a reply meanwhile, that one wins and is what r answers. *stored_out
 * says whether the store now holds the review (which ends a claim on it). */
static void store_answer(struct reply_service *svc, const struct reply_profile *prof,
                         const struct reply_review *rv, const char *reply_lang, char *text,
                         int src, struct reply_result *r, bool *stored_out)
{
    struct store_reply row, stored;
    struct ar_err err = {AR_OK, 0, {0}};
    bool existed = false;
    enum ar_status st;
    char *final = finish_text(prof, text);
    ar_free(text);
    if (!final) {
        set_error(r, REPLY_EINTERNAL, "out of memory");
        return;
    }
    r->reply = final;
    r->source = (enum reply_source)src;
    memset(&row, 0, sizeof(row));
    memset(&stored, 0, sizeof(stored));
    row.shop_id = rv->shop_id;
    row.review_id = rv->review_id;
    row.text = rv->text;
    row.rating = rv->rating;
    row.lang = reply_lang;
    row.reply = r->reply;
    row.needs_human = r->needs_human;
    row.sentiment = isfinite(r->sentiment_score) ? r->sentiment_score : 0.0f;
    row.cached = r->cached;
    row.model = r->model;
    /* sent means sent automatically; anything else waits for a person */
    row.status = r->action == REPLY_ACTION_SEND ? STORE_REVIEW_SENT : STORE_REVIEW_PENDING;
    st = store_reply_put(svc->p.store, &row, &stored, &existed, &err);
    if (st != AR_OK) {
        set_error(r, reply_error_of_backend(st), "store: %s", err.msg);
        return;
    }
    *stored_out = true;
    if (existed)
        answer_from_row(prof, rv, &stored, r);
    store_reply_fini(&stored);
}

/* Step 3 for a review this request owns (claimed): the model behind the guardrails, the store,
 * then the cache put. In that order because a cache hit stores without a claim: with the put
 * first, a request for the same review at another instance sharing the cache could hit it and
 * store the row before this one, which then found the row there and answered "store", so that
 * no request reported the reply it had generated (seen in the fleet test's race of nine). */
static void generate_and_store(struct reply_service *svc, const struct reply_profile *prof,
                               const struct reply_review *rv, const char *review_lang,
                               const char *reply_lang, bool negative, enum engine_priority prio,
                               struct reply_call *call, const char *key, size_t key_len,
                               enum cache_class cls, struct reply_result *r, bool *stored_out)
{
    struct gen_outcome o;
    metrics_inc(svc->m.model_calls, 1);
    generate(svc, prof, rv, review_lang, reply_lang, negative, prio, call, false, r, &o);
    if (o.source < 0)
        return;
    if (o.held) {
        /* a reply that repeats a clause is a draft for a person, never sent as is */
        r->needs_human = true; /* counted in the metrics with the others when answered */
        r->action = decide_action(prof, rv->rating, true);
        if (r->action == REPLY_ACTION_SEND)
            r->action = REPLY_ACTION_SUGGEST; /* a shop that does not hold needs_human */
    }
    /* the cache holds the checked reply without the signature (store_answer takes o.text and
     * adds it); a class inserts only into its own cache, so bulk work never evicts interactive
     * entries */
    char *plain = o.source == REPLY_SOURCE_MODEL && o.cacheable && key && class_cache(svc, cls)
                      ? ar_strdup(o.text)
                      : NULL;
    store_answer(svc, prof, rv, reply_lang, o.text, o.source, r, stored_out);
    if (plain && *stored_out && r->err == REPLY_OK && r->source == REPLY_SOURCE_MODEL) {
        (void)cache_put(class_cache(svc, cls), key, key_len, plain, strlen(plain));
        note_cache_counters(svc, cls);
    }
    ar_free(plain);
}

/* The path of one review:
 *   1. the reply cache: a hit is stored under the review's id insert-once, so an id answered
 *      before (idempotency) gets its stored row back, checked against this text, and a new one
 *      costs the store one statement and no claim;
 *   2. a miss is claimed (a claim first looks the review up: an id answered before is answered
 *      as stored, without the model), so that of the requests for a new review on any instance
 *      sharing the store one generates and the others wait for its stored reply. */
static void answer(struct reply_service *svc, const struct reply_review *rv,
                   enum engine_priority prio, struct reply_call *call, struct reply_result *r)
{
    const struct reply_profile *prof;
    const char *review_lang, *reply_lang;
    struct store_reply stored;
    struct ar_err err = {AR_OK, 0, {0}};
    enum store_claim claim = STORE_CLAIM_HELD;
    char owner[STORE_ID_MAX], *key = NULL;
    size_t key_len = 0;
    bool found = false, put = false, negative;
    enum cache_class cls = prio == ENGINE_PRIO_BULK ? CACHE_CLASS_BULK : CACHE_CLASS_INTERACTIVE;
    enum ar_status st;

    memset(&stored, 0, sizeof(stored));
    if (!review_ok(rv, r->error, sizeof(r->error))) {
        r->err = REPLY_EINVAL;
        return;
    }
    prof = reply_profile_of(svc, rv->shop_id);

    review_lang = rv->lang ? rv->lang : reply_guess_lang(rv->text, rv->text_len);
    reply_lang = prof->lang_policy == REPLY_LANG_ZH   ? "zh"
                 : prof->lang_policy == REPLY_LANG_EN ? "en"
                                                      : review_lang;
    snprintf(r->lang, sizeof(r->lang), "%s", reply_lang);
    r->sentiment =
        reply_sentiment_classify(rv->text, rv->text_len, review_lang, rv->rating,
                                 &r->sentiment_score);
    negative = rv->rating <= 2 || r->sentiment == REPLY_SENT_NEGATIVE;
    r->needs_human = negative || has_sensitive(prof, rv->text, rv->text_len);
    r->action = decide_action(prof, rv->rating, r->needs_human);
    if (prof->mode == REPLY_MODE_OFF) {
        /* nothing is generated or stored; a review answered before is answered as stored */
        st = store_reply_get(svc->p.store, rv->shop_id, rv->review_id, &stored, &found, &err);
        if (st != AR_OK) {
            set_error(r, reply_error_of_backend(st), "store: %s", err.msg);
        } else if (found) {
            answer_from_row(prof, rv, &stored, r);
            store_reply_fini(&stored);
        } else {
            r->reply = ar_strdup("");
            r->source = REPLY_SOURCE_OFF;
            r->err = r->reply ? REPLY_OK : REPLY_EINTERNAL;
        }
        return;
    }

    /* 1. the reply cache of the request's class (its key holds the shop, the rating bucket and
     *    the language) */
    if ((svc->p.cache || class_cache(svc, cls)) &&
        reply_normalize_key(rv->shop_id, rv->rating, review_lang, rv->text, rv->text_len, &key,
                            &key_len) == AR_OK) {
        char *hit = NULL;
        int level = class_lookup(svc, cls, key, key_len, &hit);
        if (level) {
            metrics_inc(svc->m.cache_hits[cls][level > 1], 1);
            r->cached = true;
            pthread_mutex_lock(&svc->mu);
            if (svc->gen && svc->gen->model_name)
                snprintf(r->model, sizeof(r->model), "%s", svc->gen->model_name);
            pthread_mutex_unlock(&svc->mu);
            ar_free(key);
            store_answer(svc, prof, rv, reply_lang, hit, REPLY_SOURCE_CACHE, r, &put);
            return;
        }
        metrics_inc(svc->m.cache_misses[cls], 1);
        note_cache_counters(svc, cls);
        if (cls == CACHE_CLASS_BULK)
            note_cache_counters(svc, CACHE_CLASS_INTERACTIVE); /* its backend errors */
    }

    /* 2. claim, then the model */
    claim_owner(svc, owner, sizeof(owner));
    if (!claim_review(svc, rv, call, owner, &claim, &stored, r)) {
        ar_free(key);
        return;
    }
    if (claim == STORE_CLAIM_STORED) { /* answered before, or by another request meanwhile */
        memset(r, 0, sizeof(*r));
        answer_from_row(prof, rv, &stored, r);
        store_reply_fini(&stored);
        ar_free(key);
        return;
    }
    {
        struct reply_held_claim held = {rv->shop_id, rv->review_id, owner, NULL, NULL};
        claim_register(svc, &held);
        generate_and_store(svc, prof, rv, review_lang, reply_lang, negative, prio, call, key,
                           key_len, cls, r, &put);
        claim_unregister(svc, &held);
    }
    ar_free(key);
    /* nothing stored (an error): the next request need not wait for the lease */
    if (!put &&
        (st = store_reply_unclaim(svc->p.store, rv->shop_id, rv->review_id, owner, &err)) != AR_OK)
        AR_WARN("reply: giving up the claim on %s/%s: %s: %s", rv->shop_id, rv->review_id,
                ar_status_str(st), err.msg);
}

void reply_service_answer_call(struct reply_service *svc, const struct reply_review *rv,
                               enum engine_priority prio, struct reply_call *call,
                               struct reply_result *out)
{
    double t0 = ar_time_s();
    memset(out, 0, sizeof(*out));
    answer(svc, rv, prio, call, out);
    out->latency_ms = (ar_time_s() - t0) * 1000.0;
    if (out->err == REPLY_OK) {
        metrics_inc(svc->m.src[out->source], 1);
        if (out->needs_human)
            metrics_inc(svc->m.needs_human, 1);
        metrics_observe(svc->m.latency[out->cached ? 1 : 0], out->latency_ms / 1000.0);
    } else {
        metrics_inc(svc->m.errors, 1);
        ar_free(out->reply);
        out->reply = NULL;
    }
}

void reply_service_answer(struct reply_service *svc, const struct reply_review *rv,
                          enum engine_priority prio, struct reply_result *out)
{
    reply_service_answer_call(svc, rv, prio, NULL, out);
}

/* ---- many reviews ------------------------------------------------------------------------ */

struct many {
    struct reply_service *svc;
    const struct reply_review *rv;
    struct reply_result *out;
    const size_t *todo; /* indexes to answer */
    size_t n_todo;
    enum engine_priority prio;
    struct reply_call *call;
    pthread_mutex_t mu;
    size_t next;
};

static void *many_main(void *arg)
{
    struct many *m = arg;
    for (;;) {
        size_t k;
        pthread_mutex_lock(&m->mu);
        k = m->next < m->n_todo ? m->todo[m->next++] : (size_t)-1;
        pthread_mutex_unlock(&m->mu);
        if (k == (size_t)-1)
            return NULL;
        reply_service_answer_call(m->svc, &m->rv[k], m->prio, m->call, &m->out[k]);
    }
}

static void run_many(struct reply_service *svc, const struct reply_review *rv,
                     struct reply_result *out, const size_t *todo, size_t n_todo,
                     enum engine_priority prio, struct reply_call *call)
{
    struct many m = {svc, rv, out, todo, n_todo, prio, call, PTHREAD_MUTEX_INITIALIZER, 0};
    pthread_t th[64];
    size_t n_th = AR_MIN(AR_MIN((size_t)svc->p.n_workers, n_todo), AR_ARRAY_LEN(th)), started = 0;
    for (size_t i = 0; i + 1 < n_th; i++) {
        if (pthread_create(&th[i], NULL, many_main, &m) != 0)
            break;
        started++;
    }
    many_main(&m); /* the caller works too */
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&m.mu);
}

static bool same_review(const struct reply_review *a, const struct reply_review *b)
{
    return a->shop_id && b->shop_id && a->review_id && b->review_id &&
           !strcmp(a->shop_id, b->shop_id) && !strcmp(a->review_id, b->review_id);
}

void reply_service_answer_many(struct reply_service *svc, const struct reply_review *rv,
                               size_t n, enum engine_priority prio, enum reply_dup_policy dup,
                               struct reply_result *out)
{
    reply_service_answer_many_call(svc, rv, n, prio, dup, NULL, out);
}

void reply_service_answer_many_call(struct reply_service *svc, const struct reply_review *rv,
                                    size_t n, enum engine_priority prio,
                                    enum reply_dup_policy dup, struct reply_call *call,
                                    struct reply_result *out)
{
    size_t *first = ar_malloc(sizeof(size_t) * (n ? n : 1));
    size_t *second = ar_malloc(sizeof(size_t) * (n ? n : 1));
    size_t n_first = 0, n_second = 0;
    memset(out, 0, sizeof(*out) * n);
    if (!first || !second) {
        for (size_t i = 0; i < n; i++)
            set_error(&out[i], REPLY_EINTERNAL, "out of memory");
        ar_free(first);
        ar_free(second);
        return;
    }
    /* quadratic duplicate scan: n is at most a batch or a job chunk */
    for (size_t i = 0; i < n; i++) {
        bool dup_of_earlier = false;
        for (size_t j = 0; j < i && !dup_of_earlier; j++)
            dup_of_earlier = same_review(&rv[i], &rv[j]);
        if (!dup_of_earlier)
            first[n_first++] = i;
        else if (dup == REPLY_DUP_SAME)
            second[n_second++] = i;
        else
            set_error(&out[i], REPLY_EDUPLICATE, "review_id %.150s appears earlier in this batch",
                      rv[i].review_id);
    }
    run_many(svc, rv, out, first, n_first, prio, call);
    if (n_second) /* after their first occurrence is stored: the same reply, from the store */
        run_many(svc, rv, out, second, n_second, prio, call);
    ar_free(first);
    ar_free(second);
}

/* ---- the review workflow ------------------------------------------------------------------ */

void reply_service_regenerate(struct reply_service *svc, const char *shop_id,
                              const char *review_id, const char *key, struct reply_call *call,
                              struct store_reply *row, struct reply_result *r)
{
    struct store_reply stored;
    struct store_review_change ch;
    struct reply_review rv;
    struct ar_err err = {AR_OK, 0, {0}};
    const struct reply_profile *prof;
    const char *review_lang;
    enum store_change_result res = STORE_CHANGE_NOT_FOUND;
    struct gen_outcome o;
    char *final;
    bool found = false, negative;
    enum ar_status st;
    double t0 = ar_time_s();
    memset(r, 0, sizeof(*r));
    memset(row, 0, sizeof(*row));
    if (!id_ok(shop_id) || !id_ok(review_id)) {
        set_error(r, REPLY_ENOTFOUND, "no such review");
        return;
    }
    st = store_reply_get(svc->p.store, shop_id, review_id, &stored, &found, &err);
    if (st != AR_OK) {
        set_error(r, reply_error_of_backend(st), "store: %s", err.msg);
        return;
    }
    if (!found) {
        set_error(r, REPLY_ENOTFOUND, "no reply is stored for review %.60s of shop %.60s",
                  review_id, shop_id);
        return;
    }
    if (stored.status == STORE_REVIEW_SENT) {
        set_error(r, REPLY_ECONFLICT, "review %.60s of shop %.60s was sent already", review_id,
                  shop_id);
        store_reply_fini(&stored);
        return;
    }
    /* the review as it was answered, through the shop's profile now */
    memset(&rv, 0, sizeof(rv));
    rv.shop_id = shop_id;
    rv.review_id = review_id;
    rv.text = stored.text;
    rv.text_len = strlen(stored.text);
    rv.rating = stored.rating;
    prof = reply_profile_of(svc, shop_id);
    review_lang = reply_guess_lang(rv.text, rv.text_len);
    snprintf(r->lang, sizeof(r->lang), "%s", stored.lang[0] ? stored.lang : review_lang);
    r->sentiment =
        reply_sentiment_classify(rv.text, rv.text_len, review_lang, rv.rating, &r->sentiment_score);
    negative = rv.rating <= 2 || r->sentiment == REPLY_SENT_NEGATIVE;
    r->needs_human = stored.needs_human;
    r->action = REPLY_ACTION_SUGGEST;
    metrics_inc(svc->m.model_calls, 1);
    generate(svc, prof, &rv, review_lang, r->lang, negative, ENGINE_PRIO_INTERACTIVE, call, true,
             r, &o);
    if (o.source < 0) {
        store_reply_fini(&stored);
        return;
    }
    r->source = (enum reply_source)o.source;
    if (o.held)
        r->needs_human = true; /* every candidate repeats itself: a person sees why */
    final = finish_text(prof, o.text);
    ar_free(o.text);
    if (!final) {
        set_error(r, REPLY_EINTERNAL, "out of memory");
        store_reply_fini(&stored);
        return;
    }
    r->reply = final;
    /* only if nobody changed it while the model ran */
    memset(&ch, 0, sizeof(ch));
    ch.shop_id = shop_id;
    ch.review_id = review_id;
    ch.from_mask = 1u << stored.status;
    ch.to = STORE_REVIEW_PENDING;
    ch.reply = final;
    ch.key = key;
    ch.action = "regenerate";
    st = store_review_change(svc->p.store, &ch, row, &res, &err);
    store_reply_fini(&stored);
    if (st != AR_OK)
        set_error(r, reply_error_of_backend(st), "store: %s", err.msg);
    else if (res == STORE_CHANGE_NOT_FOUND)
        set_error(r, REPLY_ENOTFOUND, "review %.60s of shop %.60s is gone", review_id, shop_id);
    else if (res == STORE_CHANGE_REFUSED)
        set_error(r, REPLY_ECONFLICT,
                  "review %.60s of shop %.60s changed while it was regenerated (now %s)",
                  review_id, shop_id, store_review_status_str(row->status));
    if (r->err != REPLY_OK) {
        store_reply_fini(row);
        ar_free(r->reply);
        r->reply = NULL;
    }
    r->latency_ms = (ar_time_s() - t0) * 1000.0;
}
