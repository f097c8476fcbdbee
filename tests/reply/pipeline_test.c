/* pipeline_test.c - the reply service with a scripted generator in place of the model: cache
 * hits and idempotency never call the model, guardrail retries and fallbacks, routing to a
 * human, bad input, batches with duplicate ids, token budgets and cancellation, and a bulk job
 * killed with SIGKILL in a child process that a restart completes with one reply per review.
 * (The HTTP endpoints over the service are tested in tests/server/reviews_test.c.) */
#include "harness/harness.h"

#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness/reply_fakes.h"

#include "base/base.h"
#include "reply/reply.h"

/* the reply cache's series, by traffic class */
#define HITS_I_L1 "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l1\"}"
#define HITS_I_L2 "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l2\"}"
#define MISSES_I "autoreply_reply_cache_misses_total{class=\"interactive\"}"
#define HITS_B_L1 "autoreply_reply_cache_hits_total{class=\"bulk\",level=\"l1\"}"
#define HITS_B_L2 "autoreply_reply_cache_hits_total{class=\"bulk\",level=\"l2\"}"
#define MISSES_B "autoreply_reply_cache_misses_total{class=\"bulk\"}"
#define EVICTIONS_I "autoreply_reply_cache_evictions_total{class=\"interactive\"}"
#define EVICTIONS_B "autoreply_reply_cache_evictions_total{class=\"bulk\"}"

/* ---- a scripted generator -------------------------------------------------------------- */

struct fake {
    struct reply_generator base;
    atomic_int calls;
    const char *script[4]; /* outputs for calls 0, 1, 2, 3+ (NULL: the default reply) */
    /* when set[0] is: outputs by candidate (greedy: 0; sampled candidate i: seed 1234 +
     * 0x10000 + i), whatever order the concurrent calls come in */
    const char *by_candidate[4];
    int candidate_delay_ms[4]; /* by candidate: a wait that stops when the call is cancelled */
    int delay_ms;
    float temps[8];
    uint64_t seeds[8];
    bool admission[8];
    bool block;            /* wait (up to 10 s) until the request's call is cancelled */
    atomic_int started;    /* generations that got past the budget */
    atomic_int hooks_fired;
};

/* The cancel hook of a blocked fake generation: wakes it. */
struct fake_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool fired;
    struct fake *f;
};

static void fake_cancel(void *arg)
{
    struct fake_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->fired = true;
    atomic_fetch_add(&w->f->hooks_fired, 1);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static enum ar_status fake_generate(struct reply_generator *g, const struct reply_gen_request *r,
                                    char **text, size_t *len)
{
    struct fake *f = (struct fake *)g;
    int k = atomic_fetch_add(&f->calls, 1);
    char buf[256];
    const char *s = f->script[k < 3 ? k : 3];
    int cand = r->temperature <= 0.0f ? 0 : (int)((r->seed - 1234u) & 3u);
    if (f->by_candidate[0])
        s = f->by_candidate[cand];
    if (k < 8) {
        f->temps[k] = r->temperature;
        f->seeds[k] = r->seed;
        f->admission[k] = r->admission;
    }
    /* the generator contract (reply.h): the prompt is charged first (one token per byte of
     * the user turn here), asking on a review's first attempt */
    if (reply_call_cancelled(r->call))
        return AR_ECANCELED;
    {
        double retry = 0;
        if (!reply_call_charge(r->call, (int64_t)strlen(r->user), r->admission, &retry)) {
            if (r->usage) {
                r->usage->limited = true;
                r->usage->retry_after_s = retry;
            }
            return AR_EBUSY;
        }
        if (r->usage)
            r->usage->n_prompt += (int64_t)strlen(r->user);
    }
    atomic_fetch_add(&f->started, 1);
    if (f->block) {
        struct fake_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, f};
        struct reply_call_hook h = {fake_cancel, &w, NULL, NULL};
        struct timespec until;
        bool fired;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        if (reply_call_watch(r->call, &h)) {
            pthread_mutex_lock(&w.mu);
            while (!w.fired && pthread_cond_timedwait(&w.cv, &w.mu, &until) == 0)
                ;
            pthread_mutex_unlock(&w.mu);
            reply_call_unwatch(r->call, &h);
        }
        fired = reply_call_cancelled(r->call);
        pthread_cond_destroy(&w.cv);
        pthread_mutex_destroy(&w.mu);
        if (fired)
            return AR_ECANCELED;
    }
    if (f->delay_ms) {
        struct timespec ts = {0, (long)f->delay_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (int ms = 0; ms < f->candidate_delay_ms[cand]; ms++) {
        struct timespec ts = {0, 1000000L};
        if (reply_call_cancelled(r->call))
            return AR_ECANCELED;
        nanosleep(&ts, NULL);
    }
    if (!s) {
        /* answers in the language of the user turn, distinct per review */
        if (strncmp(r->user, "评分", strlen("评分")) == 0)
            snprintf(buf, sizeof(buf), "感谢您的评价，编号%u已记录，欢迎再来！", th_fnv32(r->user));
        else
            snprintf(buf, sizeof(buf), "Thank you for your review, note %u. See you soon!",
                     th_fnv32(r->user));
        s = buf;
    }
    *text = ar_strdup(s);
    *len = strlen(s);
    reply_call_charge(r->call, (int64_t)*len, false, NULL); /* "generated tokens" */
    if (r->usage)
        r->usage->n_gen += (int64_t)*len;
    return *text ? AR_OK : AR_ENOMEM;
}

static void fake_init(struct fake *f)
{
    memset(f, 0, sizeof(*f));
    f->base.generate = fake_generate;
    f->base.model_name = "fake";
}

/* ---- fixture ------------------------------------------------------------------------------ */

struct fx {
    char dir[64];
    char db[128];
    struct store *store;
    struct reply_profiles *profiles;
    struct cache *cache;
    struct metrics_registry *metrics;
    struct reply_service *svc;
    struct fake gen;
};

/* The default profile generates one reply without notes, as before candidates: the tests of
 * retries count calls in order. The "cand" shops generate three candidates. */
static const char shops[] =
    "{\"default\": {\"candidates\": 1, \"aspect_notes\": false},"
    " \"shops\": {"
    " \"cand\": {\"candidates\": 3, \"aspect_notes\": false},"
    " \"cand-notes\": {\"candidates\": 3, \"aspect_notes\": true},"
    " \"cand-auto\": {\"candidates\": 3, \"aspect_notes\": false, \"mode\": \"auto\"},"
    " \"ban\": {\"banned_words\": [\"谢谢\"], \"signature\": \"—— 小店谢谢\"},"
    " \"en-only\": {\"lang\": \"en\"},"
    " \"quiet\": {\"mode\": \"off\"},"
    " \"auto\": {\"mode\": \"auto\", \"auto_min_rating\": 4}"
    "}}";

static void fx_open_service(struct fx *x)
{
    struct reply_service_params p = reply_service_default_params();
    p.profiles = x->profiles;
    p.store = x->store;
    p.cache = x->cache;
    p.metrics = x->metrics;
    p.gen = &x->gen.base;
    p.n_workers = 4;
    assert_int_equal(reply_service_create(&p, &x->svc), AR_OK);
}

static int setup(void **state)
{
    struct fx *x = calloc(1, sizeof(*x));
    struct cache_memory_params cp = cache_memory_default_params();
    snprintf(x->dir, sizeof(x->dir), "/tmp/ar_reply_XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    snprintf(x->db, sizeof(x->db), "%s/replies.db", x->dir);
    assert_int_equal(store_open(x->db, &x->store, NULL), AR_OK);
    assert_int_equal(reply_profiles_parse(shops, strlen(shops), &x->profiles, NULL), AR_OK);
    cp.max_bytes = 1 << 20;
    assert_int_equal(cache_memory_create(&cp, &x->cache), AR_OK);
    assert_int_equal(metrics_registry_create(&x->metrics), AR_OK);
    fake_init(&x->gen);
    fx_open_service(x);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fx *x = *state;
    char cmd[160];
    reply_service_destroy(x->svc);
    metrics_registry_destroy(x->metrics);
    cache_destroy(x->cache);
    reply_profiles_destroy(x->profiles);
    store_close(x->store);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", x->dir);
    assert_int_equal(system(cmd), 0);
    free(x);
    return 0;
}

static struct reply_review review(const char *shop, const char *id, const char *text, int rating)
{
    struct reply_review rv;
    memset(&rv, 0, sizeof(rv));
    rv.shop_id = shop;
    rv.review_id = id;
    rv.text = text;
    rv.text_len = strlen(text);
    rv.rating = rating;
    return rv;
}

static void ask(struct fx *x, struct reply_review rv, struct reply_result *res)
{
    reply_service_answer(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, res);
}

static double metric(struct fx *x, const char *line_prefix)
{
    char *text = NULL;
    size_t len;
    double v;
    assert_int_equal(metrics_render(x->metrics, &text, &len), AR_OK);
    v = th_metric_sample(text, line_prefix, -1);
    ar_free(text);
    return v;
}

/* ---- cache and idempotency ------------------------------------------------------------- */

static void repeated_review_text_is_a_cache_hit_with_the_same_reply(void **state)
{
    struct fx *x = *state;
    struct reply_result a, b;
    ask(x, review("s1", "r1", "物流很快，包装也好！", 5), &a);
    assert_int_equal(a.err, REPLY_OK);
    assert_int_equal(a.source, REPLY_SOURCE_MODEL);
    assert_false(a.cached);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    /* same text but for a run of exclamation marks, another review id */
    ask(x, review("s1", "r2", "物流很快，包装也好！！！", 5), &b);
    assert_int_equal(b.err, REPLY_OK);
    assert_int_equal(b.source, REPLY_SOURCE_CACHE);
    assert_true(b.cached);
    assert_string_equal(b.reply, a.reply);
    assert_int_equal(atomic_load(&x->gen.calls), 1); /* never touched the model */
    assert_true(metric(x, HITS_I_L1) == 1.0);
    assert_true(metric(x, HITS_I_L2) == 0.0);
    assert_true(metric(x, MISSES_I) == 1.0);
    /* one latency histogram, labelled by whether the answer was cached */
    assert_true(metric(x, "autoreply_reply_latency_seconds_count{cached=\"false\"}") == 1.0);
    assert_true(metric(x, "autoreply_reply_latency_seconds_count{cached=\"true\"}") == 1.0);
    assert_true(metric(x, "autoreply_reply_latency_seconds_count") == -1); /* no unlabelled one */
    reply_result_fini(&a);
    reply_result_fini(&b);
    /* another shop does not share the entry */
    ask(x, review("s2", "r1", "物流很快，包装也好！", 5), &a);
    assert_int_equal(a.source, REPLY_SOURCE_MODEL);
    assert_int_equal(atomic_load(&x->gen.calls), 2);
    reply_result_fini(&a);
}

/* A level that forwards to a cache it does not own (so that two instances' tiered caches can
 * share one L2, as they share Redis) and reports backend errors on demand. */
struct shared_l2 {
    struct cache base;
    struct cache *target; /* borrowed */
    uint64_t errors;
};

static int shared_get(struct cache *c, const char *key, size_t key_len, unsigned flags, char **v,
                      size_t *n)
{
    return cache_get_flags(((struct shared_l2 *)c)->target, key, key_len, flags, v, n);
}

static enum ar_status shared_put(struct cache *c, const char *key, size_t key_len,
                                 const char *value, size_t value_len)
{
    return cache_put(((struct shared_l2 *)c)->target, key, key_len, value, value_len);
}

static void shared_stats(struct cache *c, struct cache_stats *out)
{
    cache_stats(((struct shared_l2 *)c)->target, out);
    out->errors = ((struct shared_l2 *)c)->errors;
}

static void shared_destroy(struct cache *c)
{
    (void)c;
}

static const struct cache_ops shared_ops = {"shared", shared_get,     shared_put, shared_stats,
                                            NULL,     shared_destroy, NULL,       NULL};

static struct cache *instance_cache(struct shared_l2 *l2)
{
    struct cache_memory_params cp = cache_memory_default_params();
    struct cache *l1 = NULL, *t = NULL;
    cp.max_bytes = 1 << 20;
    assert_int_equal(cache_memory_create(&cp, &l1), AR_OK);
    assert_int_equal(cache_tiered_create(l1, &l2->base, &t), AR_OK);
    return t;
}

static void another_instance_finds_the_reply_in_l2_and_hits_are_counted_by_level(void **state)
{
    struct fx *x = *state; /* instance b: x's store, generator and metrics */
    struct cache_memory_params cp = cache_memory_default_params();
    struct cache *shared = NULL, *ca, *cb;
    struct shared_l2 la = {{&shared_ops}, NULL, 0}, lb = {{&shared_ops}, NULL, 0};
    struct metrics_registry *ma = NULL;
    struct reply_service *sa = NULL;
    struct reply_service_params p = reply_service_default_params();
    struct reply_result r;
    const char *text = "物流很快，包装也好！";
    assert_int_equal(cache_memory_create(&cp, &shared), AR_OK);
    la.target = lb.target = shared;
    ca = instance_cache(&la);
    cb = instance_cache(&lb);
    /* instance a: its own service, metrics and L1 over the shared L2, the same store */
    assert_int_equal(metrics_registry_create(&ma), AR_OK);
    p.profiles = x->profiles;
    p.store = x->store;
    p.cache = ca;
    p.metrics = ma;
    p.gen = &x->gen.base;
    assert_int_equal(reply_service_create(&p, &sa), AR_OK);
    reply_service_destroy(x->svc); /* instance b: x's service, now over cb */
    cache_destroy(x->cache);
    x->cache = cb;
    fx_open_service(x);

    {
        struct reply_review rv = review("s1", "a1", text, 5);
        reply_service_answer(sa, &rv, ENGINE_PRIO_INTERACTIVE, &r);
        assert_int_equal(r.source, REPLY_SOURCE_MODEL);
        reply_result_fini(&r);
    }
    /* b never saw this text: its L1 misses, the shared L2 answers */
    ask(x, review("s1", "b1", text, 5), &r);
    assert_int_equal(r.source, REPLY_SOURCE_CACHE);
    reply_result_fini(&r);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    assert_true(metric(x, HITS_I_L2) == 1.0);
    assert_true(metric(x, HITS_I_L1) == 0.0);
    /* copied into b's L1: the next one stays in process */
    ask(x, review("s1", "b2", text, 5), &r);
    assert_int_equal(r.source, REPLY_SOURCE_CACHE);
    reply_result_fini(&r);
    assert_true(metric(x, HITS_I_L1) == 1.0);
    assert_true(metric(x, HITS_I_L2) == 1.0);
    assert_true(metric(x, MISSES_I) == 0.0);
    /* the backend's errors show up as they grow (here: on the next miss) */
    assert_true(metric(x, "autoreply_cache_backend_errors_total{backend=\"redis\"}") == 0.0);
    lb.errors = 3;
    ask(x, review("s1", "b3", "完全不一样的评价", 5), &r);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    reply_result_fini(&r);
    assert_true(metric(x, MISSES_I) == 1.0);
    assert_true(metric(x, "autoreply_cache_backend_errors_total{backend=\"redis\"}") == 3.0);
    reply_service_destroy(sa);
    metrics_registry_destroy(ma);
    cache_destroy(ca);
    /* before la, lb and shared go: teardown then finds nothing left to destroy */
    reply_service_destroy(x->svc);
    x->svc = NULL;
    cache_destroy(cb);
    x->cache = NULL;
    cache_destroy(shared);
}

/* A shared level (shared_l2, its first member, forwards gets and puts) that records at each put
 * whether the review it watches was already in the store. */
struct spy_l2 {
    struct shared_l2 l2;
    struct store *store;
    const char *shop, *id;
    int puts, stored_at_put;
};

static enum ar_status spy_put(struct cache *c, const char *key, size_t key_len, const char *value,
                              size_t value_len)
{
    struct spy_l2 *s = (struct spy_l2 *)c;
    struct store_reply row;
    struct ar_err err = {AR_OK, 0, {0}};
    bool found = false;
    memset(&row, 0, sizeof(row));
    assert_int_equal(store_reply_get(s->store, s->shop, s->id, &row, &found, &err), AR_OK);
    store_reply_fini(&row);
    s->puts++;
    s->stored_at_put += found;
    return shared_put(c, key, key_len, value, value_len);
}

static const struct cache_ops spy_ops = {"spy", shared_get,     spy_put, shared_stats,
                                         NULL,  shared_destroy, NULL,    NULL};

/* The generating request stores its reply before the reply enters the cache. A cache hit
 * stores without a claim, so with the put first a request for the same review at another
 * instance sharing the cache could store the row ahead of the generating request, which then
 * found it there and answered "store": no response said "model" (the fleet test's race of nine
 * requests caught it). */
static void a_generated_reply_is_stored_before_it_enters_the_cache(void **state)
{
    struct fx *x = *state;
    struct cache_memory_params cp = cache_memory_default_params();
    struct cache *shared = NULL, *l1 = NULL, *t = NULL;
    /* static: a failed assertion leaves it to teardown, which destroys the tiered cache over it */
    static struct spy_l2 spy;
    struct reply_result r;
    cp.max_bytes = 1 << 20;
    assert_int_equal(cache_memory_create(&cp, &shared), AR_OK);
    assert_int_equal(cache_memory_create(&cp, &l1), AR_OK);
    spy = (struct spy_l2){{{&spy_ops}, shared, 0}, x->store, "s1", "p1", 0, 0};
    assert_int_equal(cache_tiered_create(l1, &spy.l2.base, &t), AR_OK);
    reply_service_destroy(x->svc);
    cache_destroy(x->cache);
    x->cache = t;
    fx_open_service(x);
    ask(x, review("s1", "p1", "物流很快，包装也好！", 5), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    reply_result_fini(&r);
    assert_int_equal(spy.puts, 1);
    assert_int_equal(spy.stored_at_put, 1);
    /* the next review with that text is a hit that reached the shared level */
    ask(x, review("s1", "p2", "物流很快，包装也好！", 5), &r);
    assert_int_equal(r.source, REPLY_SOURCE_CACHE);
    reply_result_fini(&r);
    reply_service_destroy(x->svc);
    x->svc = NULL;
    cache_destroy(t);
    x->cache = NULL;
    cache_destroy(shared);
}

static void same_review_id_returns_the_stored_reply(void **state)
{
    struct fx *x = *state;
    struct reply_result a, b;
    struct store_reply row;
    bool found = false;
    ask(x, review("s1", "r7", "Great phone, fast shipping.", 2), &a);
    assert_int_equal(a.err, REPLY_OK);
    assert_true(a.needs_human); /* 2 stars */
    /* asked again with the same text (but for spacing, case and trailing punctuation) and
     * rating, while the model has another name: the stored record, no model call */
    x->gen.base.model_name = "fake-2";
    ask(x, review("s1", "r7", "great phone,  fast shipping!!", 2), &b);
    assert_int_equal(b.err, REPLY_OK);
    assert_int_equal(b.source, REPLY_SOURCE_STORE);
    assert_true(b.cached);
    assert_string_equal(b.reply, a.reply);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    /* every field as stored, none recomputed from the new request */
    assert_true(b.needs_human);
    assert_int_equal(b.sentiment, a.sentiment);
    assert_true(b.sentiment_score == a.sentiment_score);
    assert_string_equal(b.lang, a.lang);
    assert_string_equal(b.model, "fake");
    assert_int_equal(b.action, a.action);
    reply_result_fini(&b);

    /* another text under the same id: 409, the stored row unchanged, no model call */
    ask(x, review("s1", "r7", "Something else entirely", 2), &b);
    assert_int_equal(b.err, REPLY_ECONFLICT);
    assert_string_equal(reply_error_code(b.err), "review_id_conflict");
    assert_null(b.reply);
    assert_non_null(strstr(b.error, "r7"));
    {
        cJSON *j = reply_result_to_json(&b, "r7");
        assert_string_equal(
            cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring,
            "review_id_conflict");
        cJSON_Delete(j);
    }
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    assert_int_equal(store_reply_get(x->store, "s1", "r7", &row, &found, NULL), AR_OK);
    assert_true(found);
    assert_string_equal(row.reply, a.reply);
    assert_string_equal(row.text, "Great phone, fast shipping.");
    assert_int_equal(row.rating, 2);
    store_reply_fini(&row);
    reply_result_fini(&a);
    reply_result_fini(&b);
}

static void same_id_with_another_rating_is_a_conflict(void **state)
{
    struct fx *x = *state;
    struct reply_result a, b;
    struct store_reply row;
    bool found = false;
    /* auto mode sends from 4 stars: a 5-star review is sent; the same text under the same id
     * with 1 star is another review, never answered (nor sent) as the 5-star one */
    ask(x, review("auto", "st1", "质量很好，很满意", 5), &a);
    assert_int_equal(a.err, REPLY_OK);
    assert_int_equal(a.action, REPLY_ACTION_SEND);
    ask(x, review("auto", "st1", "质量很好，很满意", 1), &b);
    assert_int_equal(b.err, REPLY_ECONFLICT);
    assert_string_equal(reply_error_code(b.err), "review_id_conflict");
    assert_null(b.reply);
    assert_non_null(strstr(b.error, "rating"));
    reply_result_fini(&b);
    /* the stored row is unchanged and the same review still gets it */
    assert_int_equal(store_reply_get(x->store, "auto", "st1", &row, &found, NULL), AR_OK);
    assert_true(found);
    assert_int_equal(row.rating, 5);
    store_reply_fini(&row);
    ask(x, review("auto", "st1", "质量很好，很满意", 5), &b);
    assert_int_equal(b.err, REPLY_OK);
    assert_int_equal(b.source, REPLY_SOURCE_STORE);
    assert_string_equal(b.reply, a.reply);
    assert_int_equal(b.action, REPLY_ACTION_SEND);
    reply_result_fini(&a);
    reply_result_fini(&b);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    /* job lines (duplicates answered from the store) repeating an id with another text or
     * another rating are conflicts too */
    {
        struct reply_review rv[3] = {review("s1", "st2", "很好用", 5),
                                     review("s1", "st2", "很难用", 5),
                                     review("s1", "st2", "很好用", 2)};
        struct reply_result res[3];
        reply_service_answer_many(x->svc, rv, 3, ENGINE_PRIO_BULK, REPLY_DUP_SAME, res);
        assert_int_equal(res[0].err, REPLY_OK);
        assert_int_equal(res[1].err, REPLY_ECONFLICT);
        assert_int_equal(res[2].err, REPLY_ECONFLICT);
        assert_string_equal(reply_error_code(res[2].err), "review_id_conflict");
        for (int i = 0; i < 3; i++)
            reply_result_fini(&res[i]);
    }
}

/* ---- guardrails ---------------------------------------------------------------------------- */

static void banned_word_output_is_regenerated_then_replaced(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.script[0] = x->gen.script[1] = x->gen.script[2] = x->gen.script[3] =
        "谢谢您的好评，欢迎再来！";
    ask(x, review("ban", "b1", "东西不错", 5), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_int_equal(r.source, REPLY_SOURCE_FALLBACK);
    assert_int_equal(atomic_load(&x->gen.calls), 3); /* 1 + max_retries */
    assert_null(strstr(r.reply, "谢谢"));            /* also stripped from the signature */
    assert_non_null(strstr(r.reply, "—— 小店"));
    assert_true(reply_lang_ok(r.reply, strlen(r.reply), "zh"));
    /* retries sample with other seeds */
    assert_true(x->gen.temps[0] == 0.0f);
    assert_true(x->gen.temps[1] > 0.0f);
    assert_true(x->gen.seeds[1] != x->gen.seeds[0] && x->gen.seeds[2] != x->gen.seeds[1]);
    assert_true(metric(x, "autoreply_reply_guard_rejections_total{reason=\"banned\"}") == 3.0);
    reply_result_fini(&r);
}

static void banned_word_on_the_first_try_only_keeps_the_retry(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.script[0] = "谢谢您的好评，欢迎再来！";
    x->gen.script[1] = "感谢您的好评，欢迎再来！";
    ask(x, review("ban", "b2", "东西不错", 5), &r);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    assert_int_equal(atomic_load(&x->gen.calls), 2);
    assert_string_equal(r.reply, "感谢您的好评，欢迎再来！\n—— 小店");
    reply_result_fini(&r);
}

static void degenerate_and_empty_outputs_are_not_sent(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.script[0] = "";
    x->gen.script[1] = "好的好的好的好的好的好的";
    x->gen.script[2] = "感谢您的支持，期待再次光临。";
    ask(x, review("s1", "d1", "还不错吧", 4), &r);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    assert_string_equal(r.reply, "感谢您的支持，期待再次光临。");
    assert_int_equal(r.attempts, 3);
    reply_result_fini(&r);
}

/* A reasoning model's thoughts never reach the reply; an answer that was all thinking (the
 * block never closed) is an empty output and is regenerated. */
static void think_blocks_are_not_part_of_the_reply(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.script[0] = "<think>\nThe customer is happy. 谢谢 is banned here.";
    x->gen.script[1] = "<think>\nThe customer is happy; thank them.\n</think>\n\n"
                       "感谢您的支持，期待再次光临。";
    ask(x, review("s1", "t1", "东西很好", 5), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    assert_int_equal(r.attempts, 2);
    assert_string_equal(r.reply, "感谢您的支持，期待再次光临。");
    reply_result_fini(&r);
}

static void fixed_reply_language_falls_back_in_that_language(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    /* the generator answers in the review's language (zh); the shop wants English */
    ask(x, review("en-only", "l1", "质量很好，很满意", 5), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_string_equal(r.lang, "en");
    assert_int_equal(r.source, REPLY_SOURCE_FALLBACK);
    assert_true(reply_lang_ok(r.reply, strlen(r.reply), "en"));
    reply_result_fini(&r);
}

/* ---- routing ---------------------------------------------------------------------------- */

static void low_ratings_always_need_a_human(void **state)
{
    struct fx *x = *state;
    char path[512];
    char *data = th_read_file(th_shared_path(path, sizeof(path), "data/reviews-eval.jsonl"), NULL);
    char *line, *save = NULL;
    int n_low = 0, n_neg_label_flagged = 0, n_neg_label = 0;
    assert_non_null(data);
    for (line = strtok_r(data, "\n", &save); line && n_low + n_neg_label < 300;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        struct reply_result r;
        int rating = cJSON_GetObjectItem(j, "rating")->valueint;
        const char *text = cJSON_GetObjectItem(j, "text")->valuestring;
        const char *id = cJSON_GetObjectItem(j, "id")->valuestring;
        ask(x, review("s1", id, text, rating), &r);
        assert_int_equal(r.err, REPLY_OK);
        if (rating <= 2) {
            n_low++;
            assert_true(r.needs_human);
            assert_int_not_equal(r.sentiment, REPLY_SENT_POSITIVE);
        }
        if (!strcmp(cJSON_GetObjectItem(j, "label")->valuestring, "negative")) {
            n_neg_label++;
            n_neg_label_flagged += r.needs_human;
        }
        reply_result_fini(&r);
        cJSON_Delete(j);
    }
    free(data);
    assert_true(n_low > 50);
    assert_int_equal(n_neg_label_flagged, n_neg_label); /* the eval ratings follow the labels */
}

static void sensitive_words_need_a_human_even_at_five_stars(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    ask(x, review("s1", "h1", "宝宝用了以后过敏了，不过客服很好", 5), &r);
    assert_true(r.needs_human);
    reply_result_fini(&r);
    ask(x, review("s1", "h2", "非常好用，很满意，推荐", 5), &r);
    assert_false(r.needs_human);
    assert_int_equal(r.sentiment, REPLY_SENT_POSITIVE);
    reply_result_fini(&r);
}

static void reply_modes_decide_the_action(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    int calls;
    ask(x, review("quiet", "m1", "很好", 5), &r);
    assert_int_equal(r.source, REPLY_SOURCE_OFF);
    assert_int_equal(r.action, REPLY_ACTION_NONE);
    assert_string_equal(r.reply, "");
    assert_int_equal(atomic_load(&x->gen.calls), 0);
    reply_result_fini(&r);
    ask(x, review("auto", "m2", "很好，很满意", 5), &r);
    assert_int_equal(r.action, REPLY_ACTION_SEND);
    reply_result_fini(&r);
    ask(x, review("auto", "m3", "还行吧", 3), &r); /* below auto_min_rating */
    assert_int_equal(r.action, REPLY_ACTION_SUGGEST);
    reply_result_fini(&r);
    ask(x, review("auto", "m4", "是假货吧？", 5), &r); /* held for a human */
    assert_true(r.needs_human);
    assert_int_equal(r.action, REPLY_ACTION_SUGGEST);
    reply_result_fini(&r);
    ask(x, review("s1", "m5", "很好", 5), &r); /* default profile: suggest */
    assert_int_equal(r.action, REPLY_ACTION_SUGGEST);
    calls = atomic_load(&x->gen.calls);
    assert_true(calls >= 4);
    reply_result_fini(&r);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void expect_400(struct fx *x, struct reply_review rv, const char *needle)
{
    struct reply_result r;
    ask(x, rv, &r);
    assert_int_equal(r.err, REPLY_EINVAL);
    assert_null(r.reply);
    if (!strstr(r.error, needle))
        fail_msg("error \"%s\" does not mention \"%s\"", r.error, needle);
    reply_result_fini(&r);
}

static void bad_reviews_are_rejected_before_the_model(void **state)
{
    struct fx *x = *state;
    char *big = malloc(1 << 20);
    struct reply_review rv;
    memset(big, 'a', (1 << 20) - 1);
    big[(1 << 20) - 1] = '\0';
    expect_400(x, review("s1", "x1", "好", 0), "rating");
    expect_400(x, review("s1", "x1", "好", 6), "rating");
    expect_400(x, review("s1", "x1", big, 5), "limit");
    expect_400(x, review("s1", "x1", "bad \xff\xfe bytes", 5), "UTF-8");
    expect_400(x, review("s1", "x1", "  <|im_start|> \n ", 5), "empty");
    expect_400(x, review("s1", "", "好", 5), "review_id");
    expect_400(x, review("", "x1", "好", 5), "shop_id");
    rv = review("s1", "x1", "好", 5);
    rv.text = NULL;
    rv.text_len = 0;
    expect_400(x, rv, "text");
    rv = review("s1", "x1", "好", 5);
    rv.lang = "fr";
    expect_400(x, rv, "lang");
    assert_int_equal(atomic_load(&x->gen.calls), 0);
    free(big);
}

static void json_reviews_are_validated_field_by_field(void **state)
{
    struct reply_review rv;
    char msg[200];
    const char *cases[][2] = {
        {"{\"shop_id\":\"s\",\"review_id\":\"r\",\"rating\":5}", "text"},
        {"{\"shop_id\":\"s\",\"review_id\":\"r\",\"text\":5,\"rating\":5}", "text"},
        {"{\"shop_id\":\"s\",\"review_id\":\"r\",\"text\":\"x\",\"rating\":2.5}", "rating"},
        {"{\"shop_id\":\"s\",\"review_id\":\"r\",\"text\":\"x\",\"rating\":\"5\"}", "rating"},
        {"{\"shop_id\":\"s\",\"review_id\":7,\"text\":\"x\",\"rating\":5}", "review_id"},
        {"{\"review_id\":\"r\",\"text\":\"x\",\"rating\":5}", "shop_id"},
        {"{\"shop_id\":\"s\",\"id\":7,\"text\":\"x\",\"rating\":5}", "id"},
        {"{\"shop_id\":\"s\",\"text\":\"x\",\"rating\":5}", "review_id"},
        {"[1]", "object"},
    };
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(cases); i++) {
        cJSON *j = cJSON_Parse(cases[i][0]);
        assert_int_equal(reply_review_from_json(j, NULL, &rv, msg, sizeof(msg)), AR_EINVAL);
        if (!strstr(msg, cases[i][1]))
            fail_msg("%s: \"%s\" does not mention %s", cases[i][0], msg, cases[i][1]);
        cJSON_Delete(j);
    }
    {
        cJSON *j = cJSON_Parse("{\"review_id\":\"r\",\"text\":\"好\",\"rating\":4,\"product\":\"茶\"}");
        assert_int_equal(reply_review_from_json(j, "dflt", &rv, msg, sizeof(msg)), AR_OK);
        assert_string_equal(rv.shop_id, "dflt");
        assert_int_equal(rv.rating, 4);
        assert_string_equal(rv.product, "茶");
        cJSON_Delete(j);
    }
    /* "id" stands for a missing "review_id"; both may be given only when they agree */
    {
        cJSON *j = cJSON_Parse("{\"shop_id\":\"s\",\"id\":\"d-1\",\"text\":\"好\",\"rating\":4}");
        assert_int_equal(reply_review_from_json(j, NULL, &rv, msg, sizeof(msg)), AR_OK);
        assert_string_equal(rv.review_id, "d-1");
        cJSON_Delete(j);
        j = cJSON_Parse("{\"shop_id\":\"s\",\"id\":\"r-1\",\"review_id\":\"r-1\",\"text\":\"好\","
                        "\"rating\":4}");
        assert_int_equal(reply_review_from_json(j, NULL, &rv, msg, sizeof(msg)), AR_OK);
        assert_string_equal(rv.review_id, "r-1");
        cJSON_Delete(j);
        j = cJSON_Parse("{\"shop_id\":\"s\",\"id\":\"d-1\",\"review_id\":\"r-1\",\"text\":\"好\","
                        "\"rating\":4}");
        assert_int_equal(reply_review_from_json(j, NULL, &rv, msg, sizeof(msg)), AR_EINVAL);
        if (!strstr(msg, "d-1") || !strstr(msg, "r-1") || !strstr(msg, "differ"))
            fail_msg("\"%s\" does not name both ids", msg);
        cJSON_Delete(j);
    }
}

/* ---- batches ------------------------------------------------------------------------------ */

static void duplicate_ids_in_a_batch_get_409_or_the_same_reply(void **state)
{
    struct fx *x = *state;
    struct reply_review rv[4] = {review("s1", "a", "好吃", 5), review("s1", "b", "难吃", 1),
                                 review("s1", "a", "好吃", 5), review("s2", "a", "好吃", 5)};
    struct reply_result res[4];
    reply_service_answer_many(x->svc, rv, 4, ENGINE_PRIO_INTERACTIVE, REPLY_DUP_ERROR, res);
    assert_int_equal(res[0].err, REPLY_OK);
    assert_int_equal(res[1].err, REPLY_OK);
    assert_int_equal(res[2].err, REPLY_EDUPLICATE);
    assert_int_equal(res[3].err, REPLY_OK); /* another shop: not a duplicate */
    assert_true(res[1].needs_human);
    for (int i = 0; i < 4; i++)
        reply_result_fini(&res[i]);
    rv[0].review_id = rv[2].review_id = "c";
    reply_service_answer_many(x->svc, rv, 3, ENGINE_PRIO_BULK, REPLY_DUP_SAME, res);
    assert_int_equal(res[2].err, REPLY_OK);
    assert_string_equal(res[2].reply, res[0].reply);
    assert_int_equal(res[2].source, REPLY_SOURCE_STORE);
    for (int i = 0; i < 3; i++)
        reply_result_fini(&res[i]);
}

/* ---- a caller's token budget and cancellation ----------------------------------------------- */

static bool store_has(struct fx *x, const char *shop, const char *id)
{
    struct store_reply row;
    bool found = false;
    assert_int_equal(store_reply_get(x->store, shop, id, &row, &found, NULL), AR_OK);
    store_reply_fini(&row);
    return found;
}

static void generations_are_charged_to_the_caller_and_cached_answers_are_free(void **state)
{
    struct fx *x = *state;
    struct th_budget b = {PTHREAD_MUTEX_INITIALIZER, 1000, 1000, 0, 0};
    struct reply_call *c;
    struct reply_review rv = review("s1", "t1", "物流很快，包装也好", 5);
    struct reply_result r;
    int64_t after_first;
    assert_int_equal(reply_call_create(th_budget_charge, &b, &c), AR_OK);
    reply_service_answer_call(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, c, &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    assert_true(x->gen.admission[0]); /* a review's first generation asks the budget */
    /* what the generation used (user turn bytes + reply bytes here) is what was charged */
    assert_true(r.n_prompt_tokens > 0 && r.n_gen_tokens > 0);
    assert_true(b.charged == r.n_prompt_tokens + r.n_gen_tokens);
    assert_true(reply_call_tokens(c) == b.charged);
    after_first = b.charged;
    reply_result_fini(&r);
    /* a cache hit (same text, new id) and the stored reply (same id) cost nothing */
    rv.review_id = "t2";
    reply_service_answer_call(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, c, &r);
    assert_int_equal(r.source, REPLY_SOURCE_CACHE);
    reply_result_fini(&r);
    rv.review_id = "t1";
    reply_service_answer_call(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, c, &r);
    assert_int_equal(r.source, REPLY_SOURCE_STORE);
    reply_result_fini(&r);
    assert_true(b.charged == after_first);
    assert_int_equal(atomic_load(&x->gen.calls), 1); /* the model was asked once */
    /* a regeneration after a failed check finishes what was admitted: charged, not asked */
    atomic_store(&x->gen.calls, 0);
    x->gen.script[0] = "谢谢您的好评，欢迎再来！";
    x->gen.script[1] = "感谢您的好评，欢迎再来！";
    rv = review("ban", "t3", "东西不错", 5);
    reply_service_answer_call(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, c, &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_int_equal(r.attempts, 2);
    assert_true(x->gen.admission[0] && !x->gen.admission[1]);
    assert_true(b.charged - after_first == r.n_prompt_tokens + r.n_gen_tokens);
    reply_result_fini(&r);
    x->gen.script[0] = x->gen.script[1] = NULL;
    /* a spent budget: 429 with the budget's wait, no generation, nothing stored */
    b.level = 3;
    rv = review("s1", "t4", "第二次买了，还是很好", 5);
    {
        int started = atomic_load(&x->gen.started);
        reply_service_answer_call(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, c, &r);
        assert_int_equal(r.err, REPLY_ELIMITED);
        assert_string_equal(reply_error_code(r.err), "rate_limit_exceeded");
        assert_true(r.retry_after_s == 7.0);
        assert_true(reply_call_retry_after(c) == 7.0);
        assert_int_equal(atomic_load(&x->gen.started), started);
        assert_false(store_has(x, "s1", "t4"));
        reply_result_fini(&r);
    }
    /* ... while a stored reply is still answered */
    rv = review("s1", "t1", "物流很快，包装也好", 5);
    reply_service_answer_call(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, c, &r);
    assert_int_equal(r.err, REPLY_OK);
    reply_result_fini(&r);
    reply_call_destroy(c);
}

struct many_arg {
    struct fx *x;
    struct reply_review rv[6];
    struct reply_result res[6];
    struct reply_call *call;
};

static void *many_main(void *p)
{
    struct many_arg *m = p;
    reply_service_answer_many_call(m->x->svc, m->rv, 6, ENGINE_PRIO_INTERACTIVE, REPLY_DUP_ERROR,
                                   m->call, m->res);
    return NULL;
}

static void cancelled_call_stops_its_generations_and_stores_nothing(void **state)
{
    struct fx *x = *state;
    struct many_arg m;
    pthread_t th;
    char ids[6][16];
    double t0, err0 = metric(x, "autoreply_reply_errors_total");
    static const char *const texts[6] = {"Works great", "质量很好", "Love the color",
                                         "很满意",      "Fast delivery", "会回购"};
    m.x = x;
    for (int i = 0; i < 6; i++) {
        snprintf(ids[i], sizeof(ids[i]), "c%d", i);
        m.rv[i] = review("s1", ids[i], texts[i], 5);
    }
    x->gen.block = true; /* each generation runs until cancelled (or 10 s) */
    assert_int_equal(reply_call_create(NULL, NULL, &m.call), AR_OK);
    t0 = ar_time_s();
    assert_int_equal(pthread_create(&th, NULL, many_main, &m), 0);
    while (atomic_load(&x->gen.started) < 1 && ar_time_s() - t0 < 5) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_true(atomic_load(&x->gen.started) >= 1);
    reply_call_cancel(m.call); /* the client went away */
    reply_call_cancel(m.call); /* idempotent */
    pthread_join(th, NULL);
    assert_true(ar_time_s() - t0 < 5); /* stopped, not timed out */
    assert_true(reply_call_cancelled(m.call));
    /* the generations in flight were stopped through their hooks; no review was answered */
    assert_true(atomic_load(&x->gen.hooks_fired) >= 1);
    assert_true(atomic_load(&x->gen.hooks_fired) <= atomic_load(&x->gen.started));
    assert_true(atomic_load(&x->gen.started) <= 4); /* n_workers: the rest never started */
    for (int i = 0; i < 6; i++) {
        assert_int_equal(m.res[i].err, REPLY_ECANCELLED);
        assert_string_equal(reply_error_code(m.res[i].err), "cancelled");
        assert_null(m.res[i].reply);
        assert_false(store_has(x, "s1", ids[i]));
        reply_result_fini(&m.res[i]);
    }
    assert_true(metric(x, "autoreply_reply_errors_total") - err0 == 6.0);
    assert_true(metric(x, HITS_I_L1) <= 0); /* none */
    /* a call cancelled before it starts never reaches the generator */
    {
        int calls = atomic_load(&x->gen.calls);
        struct reply_result r;
        struct reply_review rv = review("s1", "c9", "新的评价", 5);
        reply_service_answer_call(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, m.call, &r);
        assert_int_equal(r.err, REPLY_ECANCELLED);
        assert_int_equal(atomic_load(&x->gen.calls), calls);
        reply_result_fini(&r);
    }
    reply_call_destroy(m.call);
    /* the same reviews without the cancelled call are answered normally afterwards */
    x->gen.block = false;
    {
        struct reply_result r;
        ask(x, m.rv[0], &r);
        assert_int_equal(r.err, REPLY_OK);
        assert_int_equal(r.source, REPLY_SOURCE_MODEL);
        reply_result_fini(&r);
    }
}

/* ---- crash safety ------------------------------------------------------------------------- */

#define KILL_LINES 60

static int64_t job_finished(struct store *st, const char *id)
{
    struct store_job_info info;
    bool found = false;
    if (store_job_get(st, id, &info, &found, NULL) != AR_OK || !found)
        return -1;
    return info.n_done + info.n_failed;
}

static void job_killed_with_sigkill_resumes_without_duplicates(void **state)
{
    struct fx *x = *state;
    char body[KILL_LINES * 128], id[STORE_JOB_ID_LEN + 1];
    size_t off = 0;
    int64_t n_lines = 0, at_kill;
    pid_t pid;
    int status;
    sqlite3 *db;
    sqlite3_stmt *s;
    /* 60 lines, 55 distinct reviews: lines 56..60 repeat ids of lines 1..5 */
    for (int i = 0; i < KILL_LINES; i++)
        off += (size_t)snprintf(body + off, sizeof(body) - off,
                                "{\"shop_id\":\"k\",\"review_id\":\"k%d\",\"text\":\"第%d条评价，"
                                "质量不错\",\"rating\":%d}\n",
                                i < 55 ? i : i - 55, i < 55 ? i : i - 55, 1 + i % 5);
    assert_int_equal(reply_job_create(x->svc, NULL, body, off, id, &n_lines, NULL), AR_OK);
    assert_int_equal(n_lines, KILL_LINES);
    reply_service_destroy(x->svc); /* no threads across fork */
    x->svc = NULL;

    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the child: its own connection and service, a slow model */
        struct store *st;
        struct reply_profiles *ps;
        struct reply_service *svc;
        struct reply_service_params p = reply_service_default_params();
        struct fake g;
        fake_init(&g);
        g.delay_ms = 20;
        if (store_open(x->db, &st, NULL) != AR_OK || reply_profiles_default(&ps) != AR_OK)
            _exit(3);
        p.profiles = ps;
        p.store = st;
        p.gen = &g.base;
        p.n_workers = 2;
        if (reply_service_create(&p, &svc) != AR_OK)
            _exit(4);
        reply_job_run(svc, id, NULL, NULL, NULL);
        _exit(5); /* should have been killed before */
    }
    /* wait until the child is part-way, then kill it hard */
    for (int i = 0; i < 2000 && job_finished(x->store, id) < 10; i++) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    at_kill = job_finished(x->store, id);
    assert_true(at_kill >= 10 && at_kill < KILL_LINES);

    /* restart: a new service resumes the job */
    atomic_store(&x->gen.calls, 0);
    fx_open_service(x);
    assert_int_equal(reply_job_run(x->svc, id, NULL, NULL, NULL), AR_OK);
    assert_int_equal(job_finished(x->store, id), KILL_LINES);
    /* finished lines were not redone: at most one chunk in flight at the kill */
    assert_true(atomic_load(&x->gen.calls) <= KILL_LINES - at_kill + 16);

    /* exactly one stored reply per distinct review, and every line's result matches it */
    assert_int_equal(sqlite3_open(x->db, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT COUNT(*), COUNT(DISTINCT review_id) FROM "
                                            "replies WHERE shop_id = 'k'", -1, &s, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(s, 0), 55);
    assert_int_equal(sqlite3_column_int(s, 1), 55);
    sqlite3_finalize(s);
    sqlite3_close(db);
    {
        char *jsonl = NULL, *line, *save = NULL;
        size_t len;
        int n = 0;
        assert_int_equal(reply_job_results_jsonl(x->svc, id, &jsonl, &len, NULL), AR_OK);
        for (line = strtok_r(jsonl, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            cJSON *j = cJSON_Parse(line);
            struct store_reply row;
            bool found = false;
            const char *rid = cJSON_GetObjectItem(j, "review_id")->valuestring;
            assert_int_equal(cJSON_GetObjectItem(j, "line")->valueint, n + 1);
            assert_int_equal(store_reply_get(x->store, "k", rid, &row, &found, NULL), AR_OK);
            assert_true(found);
            assert_string_equal(cJSON_GetObjectItem(j, "reply")->valuestring, row.reply);
            store_reply_fini(&row);
            cJSON_Delete(j);
            n++;
        }
        assert_int_equal(n, KILL_LINES);
        ar_free(jsonl);
    }
}

static void background_runner_finishes_queued_jobs(void **state)
{
    struct fx *x = *state;
    char id[STORE_JOB_ID_LEN + 1];
    cJSON *arr = cJSON_Parse("[{\"review_id\":\"g1\",\"text\":\"好\",\"rating\":5},"
                             "{\"review_id\":\"g2\",\"text\":\"bad\",\"rating\":1}, 42]");
    assert_int_equal(reply_job_create_json(x->svc, "bg", arr, id, NULL, NULL), AR_OK);
    cJSON_Delete(arr);
    assert_int_equal(reply_jobs_start(x->svc), AR_OK);
    for (int i = 0; i < 1000 && job_finished(x->store, id) < 3; i++) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(job_finished(x->store, id), 3);
}

/* ---- cache classes: bulk work kept out of the interactive cache ---------------------------- */

/* Replaces the fixture's service (and its metrics, so counts start at zero) with one over the
 * given caches (borrowed; the same cache twice: one budget shared by both classes, the
 * behaviour before classes). */
static void fx_reopen_with_caches(struct fx *x, struct cache *interactive, struct cache *bulk)
{
    struct reply_service_params p = reply_service_default_params();
    reply_service_destroy(x->svc);
    metrics_registry_destroy(x->metrics);
    assert_int_equal(metrics_registry_create(&x->metrics), AR_OK);
    p.profiles = x->profiles;
    p.store = x->store;
    p.cache = interactive;
    p.bulk_cache = bulk;
    p.metrics = x->metrics;
    p.gen = &x->gen.base;
    p.n_workers = 4;
    assert_int_equal(reply_service_create(&p, &x->svc), AR_OK);
}

struct fake_clock_t {
    double now;
};

static double fake_clock_now(void *user)
{
    return ((struct fake_clock_t *)user)->now;
}

/* One shard, so the budget is exact. */
static struct cache *small_cache(size_t max_bytes, double ttl_s, struct fake_clock_t *clk)
{
    struct cache_memory_params cp = cache_memory_default_params();
    struct cache *c = NULL;
    cp.max_bytes = max_bytes;
    cp.ttl_s = ttl_s;
    cp.n_shards = 1;
    if (clk) {
        cp.clock = fake_clock_now;
        cp.clock_user = clk;
    }
    assert_int_equal(cache_memory_create(&cp, &c), AR_OK);
    return c;
}

#define WARM_N 50                    /* reviews live customers keep asking about */
#define JOB_N 2000                   /* a backfill of distinct reviews, none of them warm */
#define JOB_WARM 10                  /* job lines whose text is one of the warm ones */
#define CLASS_CACHE_BYTES (64 << 10) /* room for a few hundred replies: all the warm ones */

static void warm_text(int i, char *buf, size_t size)
{
    snprintf(buf, size, "Warm review %d: the teapot arrived quickly and pours well.", i);
}

/* Asks the WARM_N warm texts interactively under new review ids (so the store cannot answer
 * them) and returns the share the reply cache answered, from the interactive class's
 * counters, which must have counted each lookup exactly once. */
static double interactive_round(struct fx *x, const char *tag)
{
    double h0 = metric(x, HITS_I_L1) + metric(x, HITS_I_L2), m0 = metric(x, MISSES_I), hits;
    for (int i = 0; i < WARM_N; i++) {
        char id[64], text[128];
        struct reply_result r;
        snprintf(id, sizeof(id), "%s-%d", tag, i);
        warm_text(i, text, sizeof(text));
        ask(x, review("cc", id, text, 5), &r);
        assert_int_equal(r.err, REPLY_OK);
        reply_result_fini(&r);
    }
    hits = metric(x, HITS_I_L1) + metric(x, HITS_I_L2) - h0;
    assert_true(hits + (metric(x, MISSES_I) - m0) == WARM_N);
    return hits / WARM_N;
}

/* A job of JOB_WARM lines with warm texts (first) and JOB_N distinct other reviews, run to
 * the end in this thread, as the job runner does (ENGINE_PRIO_BULK). */
static void run_backfill(struct fx *x)
{
    size_t cap = (size_t)(JOB_N + JOB_WARM) * 160, off = 0;
    char *body = malloc(cap), id[STORE_JOB_ID_LEN + 1];
    int64_t n_lines = 0;
    assert_non_null(body);
    for (int i = 0; i < JOB_WARM + JOB_N; i++) {
        char text[128];
        if (i < JOB_WARM)
            warm_text(i, text, sizeof(text));
        else
            snprintf(text, sizeof(text), "Backfill review %d: the blanket is warm and soft.", i);
        off += (size_t)snprintf(body + off, cap - off,
                                "{\"shop_id\":\"cc\",\"review_id\":\"job-%d\",\"text\":\"%s\","
                                "\"rating\":5}\n",
                                i, text);
    }
    assert_true(off < cap);
    assert_int_equal(reply_job_create(x->svc, NULL, body, off, id, &n_lines, NULL), AR_OK);
    assert_int_equal(n_lines, JOB_WARM + JOB_N);
    assert_int_equal(reply_job_run(x->svc, id, NULL, NULL, NULL), AR_OK);
    assert_int_equal(job_finished(x->store, id), JOB_WARM + JOB_N);
    free(body);
}

/* The test: warm the interactive cache, run a large job, and the interactive hit ratio
 * for the same reviews stays where it was; every lookup is counted in its class. */
static void a_large_job_leaves_the_interactive_hit_ratio_where_it_was(void **state)
{
    struct fx *x = *state;
    struct cache *ic = small_cache(CLASS_CACHE_BYTES, 0, NULL);
    struct cache *bc = small_cache(CLASS_CACHE_BYTES, 0, NULL);
    struct cache_stats si0, si1, sb;
    double before, after;
    int calls;
    fx_reopen_with_caches(x, ic, bc);
    assert_true(interactive_round(x, "w0") == 0.0); /* cold: every reply generated */
    before = interactive_round(x, "w1");
    assert_true(before == 1.0);
    cache_stats(ic, &si0);
    assert_int_equal(si0.n_entries, WARM_N);

    run_backfill(x);
    /* the job's lookups are bulk ones: the warm texts found in the interactive cache (read
     * only), every other one a miss that went to the model and into the bulk cache */
    assert_true(metric(x, HITS_B_L1) == JOB_WARM);
    assert_true(metric(x, HITS_B_L2) == 0);
    assert_true(metric(x, MISSES_B) == JOB_N);
    cache_stats(bc, &sb);
    assert_true(sb.evictions > 0); /* the bulk budget was far too small for the job */
    assert_true(metric(x, EVICTIONS_B) == (double)sb.evictions);
    /* ... and the interactive cache was not touched: same entries, nothing evicted */
    cache_stats(ic, &si1);
    assert_int_equal(si1.n_entries, WARM_N);
    assert_int_equal(si1.evictions, 0);
    assert_true(metric(x, EVICTIONS_I) == 0);
    /* interactive counters saw only the two rounds */
    assert_true(metric(x, HITS_I_L1) == WARM_N);
    assert_true(metric(x, MISSES_I) == WARM_N);

    calls = atomic_load(&x->gen.calls);
    after = interactive_round(x, "w2");
    assert_true(after == before);
    assert_int_equal(atomic_load(&x->gen.calls), calls); /* no review went to the model */

    reply_service_destroy(x->svc);
    x->svc = NULL;
    cache_destroy(ic);
    cache_destroy(bc);
}

/* The control: the same steps with one shared budget (the behaviour before classes) lose the
 * warm replies, so the test above would fail on it. */
static void one_shared_budget_loses_the_warm_replies_to_the_job(void **state)
{
    struct fx *x = *state;
    struct cache *c = small_cache(CLASS_CACHE_BYTES, 0, NULL);
    struct cache_stats s;
    double before, after;
    fx_reopen_with_caches(x, c, c);
    assert_true(interactive_round(x, "w0") == 0.0);
    before = interactive_round(x, "w1");
    assert_true(before == 1.0);
    run_backfill(x);
    cache_stats(c, &s);
    assert_true(s.evictions >= WARM_N);
    /* one cache: its evictions counted once, as the interactive class's */
    assert_true(metric(x, EVICTIONS_I) == (double)s.evictions);
    assert_true(metric(x, EVICTIONS_B) == 0);
    after = interactive_round(x, "w2");
    assert_true(after < 0.5 * before);
    reply_service_destroy(x->svc);
    x->svc = NULL;
    cache_destroy(c);
}

/* Each class's TTL: an entry older than it is a miss (counted as such, and as expired), a
 * younger one a hit. The bulk TTL is the shorter one here. */
static void entries_older_than_their_class_ttl_are_misses(void **state)
{
    struct fx *x = *state;
    struct fake_clock_t clk = {1000.0};
    struct cache *ic = small_cache(1 << 20, 100, &clk), *bc = small_cache(1 << 20, 10, &clk);
    const char *ti = "Interactive review: lovely mug, sturdy handle.";
    const char *tb = "Bulk review: the lamp is bright and easy to set up.";
    struct cache_stats s;
    struct reply_result r;
    int calls;
    fx_reopen_with_caches(x, ic, bc);
#define ASK(text, id, prio, want)                                                                  \
    do {                                                                                           \
        struct reply_review rv_ = review("ttl", id, text, 5);                                      \
        reply_service_answer(x->svc, &rv_, prio, &r);                                              \
        assert_int_equal(r.err, REPLY_OK);                                                         \
        assert_int_equal(r.source, want);                                                          \
        reply_result_fini(&r);                                                                     \
    } while (0)
    ASK(ti, "i1", ENGINE_PRIO_INTERACTIVE, REPLY_SOURCE_MODEL);
    ASK(tb, "b1", ENGINE_PRIO_BULK, REPLY_SOURCE_MODEL);
    clk.now += 9; /* younger than both TTLs */
    ASK(ti, "i2", ENGINE_PRIO_INTERACTIVE, REPLY_SOURCE_CACHE);
    ASK(tb, "b2", ENGINE_PRIO_BULK, REPLY_SOURCE_CACHE);
    clk.now += 2; /* 11 s: past the bulk TTL only */
    calls = atomic_load(&x->gen.calls);
    ASK(tb, "b3", ENGINE_PRIO_BULK, REPLY_SOURCE_MODEL);
    assert_int_equal(atomic_load(&x->gen.calls), calls + 1);
    ASK(ti, "i3", ENGINE_PRIO_INTERACTIVE, REPLY_SOURCE_CACHE);
    cache_stats(bc, &s);
    assert_int_equal(s.expired, 1);
    clk.now += 90; /* 101 s: past the interactive TTL too */
    ASK(ti, "i4", ENGINE_PRIO_INTERACTIVE, REPLY_SOURCE_MODEL);
    cache_stats(ic, &s);
    assert_int_equal(s.expired, 1);
#undef ASK
    /* interactive: i1 miss, i2 hit, i3 hit, i4 miss; bulk: b1 miss, b2 hit, b3 miss */
    assert_true(metric(x, HITS_I_L1) == 2);
    assert_true(metric(x, MISSES_I) == 2);
    assert_true(metric(x, HITS_B_L1) == 1);
    assert_true(metric(x, MISSES_B) == 2);
    reply_service_destroy(x->svc);
    x->svc = NULL;
    cache_destroy(ic);
    cache_destroy(bc);
}

/* Without a bulk cache, bulk work still reads the interactive one but stores nothing in it. */
static void without_a_bulk_cache_bulk_replies_are_not_cached(void **state)
{
    struct fx *x = *state;
    struct cache_stats s;
    struct reply_result r;
    struct reply_review a = review("nb", "a1", "A warm review: the scarf is soft.", 5);
    struct reply_review b = review("nb", "b1", "A bulk review: the kettle is quiet.", 5);
    ask(x, a, &r); /* interactive: cached */
    reply_result_fini(&r);
    a.review_id = "a2";
    reply_service_answer(x->svc, &a, ENGINE_PRIO_BULK, &r);
    assert_int_equal(r.source, REPLY_SOURCE_CACHE); /* read from the interactive cache */
    reply_result_fini(&r);
    reply_service_answer(x->svc, &b, ENGINE_PRIO_BULK, &r);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    reply_result_fini(&r);
    b.review_id = "b2";
    reply_service_answer(x->svc, &b, ENGINE_PRIO_BULK, &r);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL); /* not cached anywhere */
    reply_result_fini(&r);
    cache_stats(x->cache, &s);
    assert_int_equal(s.n_entries, 1);
    assert_true(metric(x, HITS_B_L1) == 1);
    assert_true(metric(x, MISSES_B) == 2);
}

/* ---- candidates ---------------------------------------------------------------------------- */

#define GENERIC_ZH "十分抱歉，这次没有让您满意。感谢您的反馈，我们一定改正。"
#define ASPECT_ZH "非常抱歉，包装没有保护好商品。再次致歉，希望您再给一次机会。"
#define REPEAT_ZH "谢谢您对我们包装的认可，谢谢您对我们包装的认可。"
/* the greedy candidate takes this long, as a model would; the sampled ones, run at the same
 * time, are waited for a while after it (they are stopped when far slower) */
#define GREEDY_MS 40

/* Three candidates are generated at once: the greedy one and two sampled with their own seeds;
 * the one that answers the review's point (the packaging) wins over a generic apology, though
 * the generic one is the greedy reply. */
static void a_candidate_naming_the_aspect_beats_a_generic_one(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.candidate_delay_ms[0] = GREEDY_MS;
    x->gen.by_candidate[0] = GENERIC_ZH;
    x->gen.by_candidate[1] = GENERIC_ZH;
    x->gen.by_candidate[2] = ASPECT_ZH;
    ask(x, review("cand", "c1", "包装太差，盒子都扁了", 1), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    assert_string_equal(r.reply, ASPECT_ZH);
    assert_int_equal(atomic_load(&x->gen.calls), 3);
    assert_int_equal(r.attempts, 3);
    /* one greedy, two sampled with distinct seeds */
    {
        int greedy = 0;
        for (int i = 0; i < 3; i++)
            greedy += x->gen.temps[i] == 0.0f;
        assert_int_equal(greedy, 1);
        assert_true(x->gen.seeds[0] != x->gen.seeds[1] && x->gen.seeds[1] != x->gen.seeds[2] &&
                    x->gen.seeds[0] != x->gen.seeds[2]);
    }
    /* every candidate's tokens are charged: three prompts */
    assert_int_equal(r.n_prompt_tokens, 3 * (int64_t)strlen("评分：1星\n评价：包装太差，盒子都扁了"));
    reply_result_fini(&r);
}

/* Candidates that are equally good leave the greedy reply, today's reply, as the answer. */
static void the_greedy_candidate_wins_a_tie(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.candidate_delay_ms[0] = GREEDY_MS;
    x->gen.by_candidate[0] = "十分抱歉，这次没有让您满意。感谢您的反馈。";
    x->gen.by_candidate[1] = GENERIC_ZH;
    x->gen.by_candidate[2] = "抱歉给您添麻烦了，我们非常重视您的反馈。";
    ask(x, review("cand", "c2", "不太满意", 2), &r);
    assert_string_equal(r.reply, "十分抱歉，这次没有让您满意。感谢您的反馈。");
    reply_result_fini(&r);
}

/* A shop in auto mode never sends a reply that repeats itself: a clause said twice verbatim
 * is said once; a phrase shared by two clauses (no safe cut) loses to any candidate without
 * one, and when every candidate has one, the chosen reply is held for a person and not cached
 * (a cache hit would be sent). */
#define NGRAM_ZH "谢谢您对包装的认可，也谢谢您对配送的认可。"
static void a_repeated_clause_is_never_sent_automatically(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.candidate_delay_ms[0] = GREEDY_MS;
    x->gen.by_candidate[0] = x->gen.by_candidate[1] = x->gen.by_candidate[2] = REPEAT_ZH;
    ask(x, review("cand-auto", "r0", "包装很好，很结实", 5), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_string_equal(r.reply, "谢谢您对我们包装的认可。");
    assert_int_equal(r.action, REPLY_ACTION_SEND);
    reply_result_fini(&r);

    x->gen.by_candidate[0] = NGRAM_ZH;
    x->gen.by_candidate[1] = NGRAM_ZH;
    x->gen.by_candidate[2] = "谢谢您的好评，包装我们会继续用心做好！";
    ask(x, review("cand-auto", "r1", "包装不错，盒子很结实", 5), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_string_equal(r.reply, "谢谢您的好评，包装我们会继续用心做好！");
    assert_int_equal(r.action, REPLY_ACTION_SEND);
    assert_false(r.needs_human);
    reply_result_fini(&r);

    x->gen.by_candidate[2] = NGRAM_ZH;
    ask(x, review("cand-auto", "r2", "包装精美，送人很合适", 5), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_int_equal(reply_find_repeat(r.reply, strlen(r.reply)), REPLY_REPEAT_NGRAM);
    assert_int_equal(r.action, REPLY_ACTION_SUGGEST);
    assert_true(r.needs_human);
    reply_result_fini(&r);
    /* the stored answer keeps it held */
    ask(x, review("cand-auto", "r2", "包装精美，送人很合适", 5), &r);
    assert_int_equal(r.source, REPLY_SOURCE_STORE);
    assert_int_equal(r.action, REPLY_ACTION_SUGGEST);
    reply_result_fini(&r);
    /* the same text under a new id is generated again, not served from the cache */
    atomic_store(&x->gen.calls, 0);
    ask(x, review("cand-auto", "r3", "包装精美，送人很合适", 5), &r);
    assert_false(r.cached);
    assert_int_equal(atomic_load(&x->gen.calls), 3);
    assert_int_equal(r.action, REPLY_ACTION_SUGGEST);
    reply_result_fini(&r);
}

/* An aspect no candidate names gets a short note before the closing sentence. */
static void an_aspect_no_candidate_names_gets_a_note(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.candidate_delay_ms[0] = GREEDY_MS;
    x->gen.by_candidate[0] = x->gen.by_candidate[1] = x->gen.by_candidate[2] = GENERIC_ZH;
    ask(x, review("cand-notes", "n1", "包装太差，盒子都扁了", 1), &r);
    assert_int_equal(r.err, REPLY_OK);
    assert_non_null(strstr(r.reply, "包装"));
    assert_true(reply_aspects_of_reply(r.reply, strlen(r.reply)) &
                (1u << REPLY_ASPECT_PACKAGING));
    /* the closing stays last */
    assert_non_null(strstr(r.reply, "感谢您的反馈，我们一定改正。"));
    assert_int_equal(reply_find_repeat(r.reply, strlen(r.reply)), REPLY_REPEAT_NONE);
    reply_result_fini(&r);
}

/* A sampled candidate that fails (here: the guardrails, an empty output) only drops out. */
static void a_failed_candidate_drops_out(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    x->gen.candidate_delay_ms[0] = GREEDY_MS;
    x->gen.by_candidate[0] = GENERIC_ZH;
    x->gen.by_candidate[1] = "";
    x->gen.by_candidate[2] = "Thank you!";
    ask(x, review("cand", "f1", "包装太差，盒子都扁了", 1), &r);
    assert_int_equal(r.source, REPLY_SOURCE_MODEL);
    assert_string_equal(r.reply, GENERIC_ZH);
    reply_result_fini(&r);
}

/* A sampled candidate still generating well after the greedy one is stopped and drops out:
 * the review does not wait for it, and the caller's call is not cancelled by it. */
static void a_slow_candidate_is_stopped_and_the_review_does_not_wait(void **state)
{
    struct fx *x = *state;
    struct reply_result r;
    double t0;
    x->gen.by_candidate[0] = GENERIC_ZH;
    x->gen.by_candidate[1] = GENERIC_ZH;
    x->gen.by_candidate[2] = ASPECT_ZH; /* better, but too late */
    x->gen.candidate_delay_ms[0] = 50;
    x->gen.candidate_delay_ms[2] = 5000;
    t0 = ar_time_s();
    ask(x, review("cand", "s1", "包装太差，盒子都扁了", 1), &r);
    assert_true(ar_time_s() - t0 < 2.0);
    assert_int_equal(r.err, REPLY_OK);
    assert_string_equal(r.reply, GENERIC_ZH);
    reply_result_fini(&r);
    /* a sampled candidate done before the greedy one is still counted */
    x->gen.candidate_delay_ms[0] = 100;
    x->gen.candidate_delay_ms[2] = 20;
    ask(x, review("cand", "s2", "包装太差，盒子都压扁了", 1), &r);
    assert_string_equal(r.reply, ASPECT_ZH);
    reply_result_fini(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(repeated_review_text_is_a_cache_hit_with_the_same_reply),
        T(another_instance_finds_the_reply_in_l2_and_hits_are_counted_by_level),
        T(a_generated_reply_is_stored_before_it_enters_the_cache),
        T(same_review_id_returns_the_stored_reply),
        T(same_id_with_another_rating_is_a_conflict),
        T(banned_word_output_is_regenerated_then_replaced),
        T(banned_word_on_the_first_try_only_keeps_the_retry),
        T(degenerate_and_empty_outputs_are_not_sent),
        T(think_blocks_are_not_part_of_the_reply),
        T(fixed_reply_language_falls_back_in_that_language),
        T(low_ratings_always_need_a_human),
        T(sensitive_words_need_a_human_even_at_five_stars),
        T(reply_modes_decide_the_action),
        T(bad_reviews_are_rejected_before_the_model),
        cmocka_unit_test(json_reviews_are_validated_field_by_field),
        T(a_candidate_naming_the_aspect_beats_a_generic_one),
        T(the_greedy_candidate_wins_a_tie),
        T(a_repeated_clause_is_never_sent_automatically),
        T(an_aspect_no_candidate_names_gets_a_note),
        T(a_failed_candidate_drops_out),
        T(a_slow_candidate_is_stopped_and_the_review_does_not_wait),
        T(duplicate_ids_in_a_batch_get_409_or_the_same_reply),
        T(generations_are_charged_to_the_caller_and_cached_answers_are_free),
        T(cancelled_call_stops_its_generations_and_stores_nothing),
        T(job_killed_with_sigkill_resumes_without_duplicates),
        T(background_runner_finishes_queued_jobs),
        T(a_large_job_leaves_the_interactive_hit_ratio_where_it_was),
        T(one_shared_budget_loses_the_warm_replies_to_the_job),
        T(entries_older_than_their_class_ttl_are_misses),
        T(without_a_bulk_cache_bulk_replies_are_not_cached),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
