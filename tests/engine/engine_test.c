/* engine_test.c - the serving engine on real model files: greedy output against llama.cpp's
 * reference continuations, batched = alone, the prefix cache (same tokens as without it),
 * priorities and bulk aging, the queue bound, cancellation, timeouts, preemption under a
 * tiny KV cache, stop strings, end-of-generation, max_tokens and the context limit; a
 * sliding-window model (gemma3) with its local KV pool: bounded local blocks, exact tokens,
 * the prefix cache reused past the window.
 * A "gate" lets a test park the scheduler inside a request's first on_token callback, so
 * queue states are set up without timing races. */
#include "harness/harness.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define PATH_LEN 512
#define MAX_GEN 512
#define MAX_TEXT 16384
#define MAX_ORDER 64

/* ---- observation of requests ------------------------------------------------------------- */

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done;
    int order[MAX_ORDER]; /* tags in on_done order */
    int n_order;
    /* gate: a request with gated set blocks in its first on_token until open */
    bool gate_entered;
    bool gate_open;
};

struct obs {
    struct waiter *w;
    int tag;
    bool gated;
    double sleep_first_s; /* sleep this long inside the first on_token */
    int32_t tok[MAX_GEN]; /* tokens passed to on_token (>= 0) */
    int n_tok;
    int n_calls;
    char stream[MAX_TEXT]; /* concatenated on_token text */
    size_t stream_len;
    int n_done;
    struct engine_result res;
    int32_t res_tok[MAX_GEN];
    char res_text[MAX_TEXT];
};

static void waiter_init(struct waiter *w)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static void waiter_fini(struct waiter *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* When set, on_token records the most local-pool blocks in use once a request has
 * LOCAL_WATCH_FROM tokens (scheduler thread; engine_get_stats takes the engine's lock, which
 * the scheduler does not hold during callbacks). */
#define LOCAL_WATCH_FROM 20
static struct engine *local_watch;
static int64_t local_used_max;

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    struct obs *o = user;
    o->n_calls++;
    if (local_watch && o->n_tok >= LOCAL_WATCH_FROM) {
        struct engine_stats st;
        engine_get_stats(local_watch, &st);
        local_used_max = AR_MAX(local_used_max, st.kv_local_blocks_used);
    }
    if (token >= 0 && o->n_tok < MAX_GEN)
        o->tok[o->n_tok++] = token;
    if (o->stream_len + len < MAX_TEXT) {
        memcpy(o->stream + o->stream_len, text, len);
        o->stream_len += len;
    }
    if (o->n_calls == 1 && o->sleep_first_s > 0)
        sleep_s(o->sleep_first_s);
    if (o->n_calls == 1 && o->gated) {
        pthread_mutex_lock(&o->w->mu);
        o->w->gate_entered = true;
        pthread_cond_broadcast(&o->w->cv);
        while (!o->w->gate_open)
            pthread_cond_wait(&o->w->cv, &o->w->mu);
        pthread_mutex_unlock(&o->w->mu);
    }
}

static void on_done(void *user, const struct engine_result *res)
{
    struct obs *o = user;
    o->res = *res;
    if (res->n_gen > 0 && res->n_gen <= MAX_GEN)
        memcpy(o->res_tok, res->tokens, (size_t)res->n_gen * sizeof(*res->tokens));
    if (res->text_len < MAX_TEXT) {
        memcpy(o->res_text, res->text, res->text_len);
        o->res_text[res->text_len] = '\0';
    }
    pthread_mutex_lock(&o->w->mu);
    o->n_done++;
    o->w->n_done++;
    if (o->w->n_order < MAX_ORDER)
        o->w->order[o->w->n_order++] = o->tag;
    pthread_cond_broadcast(&o->w->cv);
    pthread_mutex_unlock(&o->w->mu);
}

/* Waits (20 s at most) until n requests are done. */
static void wait_done(struct waiter *w, int n)
{
    double t_end = ar_time_s() + 20.0;
    pthread_mutex_lock(&w->mu);
    while (w->n_done < n && ar_time_s() < t_end) {
        pthread_mutex_unlock(&w->mu);
        sleep_s(0.001);
        pthread_mutex_lock(&w->mu);
    }
    int got = w->n_done;
    pthread_mutex_unlock(&w->mu);
    if (got < n)
        fail_msg("only %d of %d requests finished in time", got, n);
}

static void wait_gate_entered(struct waiter *w)
{
    double t_end = ar_time_s() + 20.0;
    pthread_mutex_lock(&w->mu);
    while (!w->gate_entered && ar_time_s() < t_end) {
        pthread_mutex_unlock(&w->mu);
        sleep_s(0.001);
        pthread_mutex_lock(&w->mu);
    }
    bool ok = w->gate_entered;
    pthread_mutex_unlock(&w->mu);
    if (!ok)
        fail_msg("the gated request never produced a token");
}

static void open_gate(struct waiter *w)
{
    pthread_mutex_lock(&w->mu);
    w->gate_open = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- models ------------------------------------------------------------------------------- */

struct loaded {
    struct model *m;
    struct tokenizer *tok;
};

static struct loaded llama_f32, demo, gemma3;

static void load(const char *rel, struct loaded *out)
{
    char path[PATH_LEN];
    struct ar_err err;
    memset(&err, 0, sizeof(err));
    if (model_load(th_shared_path(path, sizeof(path), rel), &out->m, &err) != AR_OK)
        fail_msg("model_load %s: %s", path, err.msg);
    if (tokenizer_load(model_gguf(out->m), &out->tok, &err) != AR_OK)
        fail_msg("tokenizer_load %s: %s", path, err.msg);
}

static int group_setup(void **state)
{
    (void)state;
    load("fixtures/models/tiny-llama-f32.gguf", &llama_f32);
    load("models/autoreply-demo-q8_0.gguf", &demo);
    load("fixtures-arch/models/tiny-gemma3-f32.gguf", &gemma3);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    tokenizer_destroy(llama_f32.tok);
    model_destroy(llama_f32.m);
    tokenizer_destroy(demo.tok);
    model_destroy(demo.m);
    tokenizer_destroy(gemma3.tok);
    model_destroy(gemma3.m);
    return 0;
}

static struct engine_params small_params(void)
{
    struct engine_params p = engine_default_params();
    p.n_threads = 1;
    p.kv_tokens = 2048;
    p.n_seq_max = 8;
    p.n_batch = 128;
    p.prefill_chunk = 64;
    p.queue_max = 32;
    return p;
}

static struct engine *make_engine(const struct loaded *l, const struct engine_params *p)
{
    struct engine *e = NULL;
    struct ar_err err;
    memset(&err, 0, sizeof(err));
    if (engine_create(l->m, l->tok, p, &e, &err) != AR_OK)
        fail_msg("engine_create: %s", err.msg);
    return e;
}

static struct engine_request greedy_request(const int32_t *prompt, int n, int max_tokens,
                                            struct obs *o)
{
    struct engine_request r;
    memset(&r, 0, sizeof(r));
    r.prompt = prompt;
    r.n_prompt = n;
    r.max_tokens = max_tokens;
    r.sampling = sampler_default_params();
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    r.priority = ENGINE_PRIO_INTERACTIVE;
    r.on_token = on_token;
    r.on_done = on_done;
    r.user = o;
    return r;
}

static void submit_ok(struct engine *e, const struct engine_request *r, uint64_t *id)
{
    uint64_t tmp;
    enum ar_status st = engine_submit(e, r, id ? id : &tmp);
    if (st != AR_OK)
        fail_msg("engine_submit: %s", ar_status_str(st));
}

/* BOS then n - 1 random ordinary tiny-llama ids in [3, 768). */
static void random_prompt(struct th_rng *rng, int32_t *out, int n)
{
    out[0] = 1;
    for (int i = 1; i < n; i++)
        out[i] = 3 + (int32_t)(th_rng_u64(rng) % 765);
}

/* Everything every finished request must satisfy: on_done once, streamed text = final text,
 * streamed tokens = result tokens. */
static void check_consistent(const struct obs *o)
{
    assert_int_equal(o->n_done, 1);
    assert_int_equal(o->stream_len, o->res.text_len);
    assert_memory_equal(o->stream, o->res_text, o->stream_len);
    assert_int_equal(o->n_tok, o->res.n_gen);
    if (o->n_tok > 0)
        assert_memory_equal(o->tok, o->res_tok, (size_t)o->n_tok * sizeof(int32_t));
}

/* Runs one request alone on its own engine (one sequence at a time) and returns it. */
static void run_alone(const struct loaded *l, const struct engine_params *p0,
                      const struct engine_request *req0, struct obs *o)
{
    struct engine_params p = *p0;
    struct waiter w;
    struct engine *e;
    struct engine_request req = *req0;
    waiter_init(&w);
    memset(o, 0, sizeof(*o));
    o->w = &w;
    req.user = o;
    p.n_seq_max = 1;
    e = make_engine(l, &p);
    submit_ok(e, &req, NULL);
    wait_done(&w, 1);
    engine_destroy(e);
    check_consistent(o);
    o->w = NULL;
    waiter_fini(&w);
}

/* ---- generation ----------------------------------------------------------------------------- */

static int32_t *json_ints(const cJSON *arr, int *n)
{
    int len = cJSON_GetArraySize(arr);
    int32_t *v = malloc(sizeof(*v) * (size_t)(len ? len : 1));
    assert_non_null(v);
    for (int i = 0; i < len; i++)
        v[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    *n = len;
    return v;
}

/* The four fixture prompts at once, F32 KV: greedy tokens equal llama.cpp's greedy
 * continuation as long as the reference's top-1/top-2 margin is clear of the F32 logit
 * tolerance (1e-3, README section 3). */
static void greedy_generation_matches_reference_continuation(void **state)
{
    char path[PATH_LEN];
    cJSON *j = th_read_json(th_shared_path(path, sizeof(path), "fixtures/logits/tiny-llama-f32.json"));
    cJSON *cases = cJSON_GetObjectItem(j, "cases");
    int n_cases = cJSON_GetArraySize(cases);
    struct engine_params p = small_params();
    struct waiter w;
    struct obs *o = calloc((size_t)n_cases, sizeof(*o));
    int32_t *prompts[8];
    struct engine *e;
    (void)state;
    assert_true(n_cases >= 1 && n_cases <= 8);
    p.kv_type = AR_TYPE_F32;
    p.prefill_chunk = 48; /* the 300-token prompt takes several steps, mixed with decodes */
    waiter_init(&w);
    e = make_engine(&llama_f32, &p);
    for (int c = 0; c < n_cases; c++) {
        int n;
        prompts[c] = json_ints(cJSON_GetObjectItem(cJSON_GetArrayItem(cases, c), "prompt_tokens"), &n);
        o[c].w = &w;
        struct engine_request r = greedy_request(prompts[c], n, 32, &o[c]);
        submit_ok(e, &r, NULL);
    }
    wait_done(&w, n_cases);
    for (int c = 0; c < n_cases; c++) {
        int n_ref, n_margin;
        const cJSON *cs = cJSON_GetArrayItem(cases, c);
        int32_t *ref = json_ints(cJSON_GetObjectItem(cs, "greedy_tokens"), &n_ref);
        const cJSON *margins = cJSON_GetObjectItem(cs, "greedy_margins");
        n_margin = cJSON_GetArraySize(margins);
        check_consistent(&o[c]);
        assert_int_equal(o[c].res.finish, ENGINE_FINISH_LENGTH);
        assert_int_equal(o[c].res.n_gen, 32);
        for (int i = 0; i < n_ref && i < n_margin; i++) {
            assert_int_equal(o[c].res_tok[i], ref[i]);
            if (cJSON_GetArrayItem(margins, i)->valuedouble <= 2e-3)
                break;
        }
        free(ref);
        free(prompts[c]);
    }
    engine_destroy(e);
    waiter_fini(&w);
    free(o);
    cJSON_Delete(j);
}

/* Six different prompts at once (small prefill chunks, so decode rows and prompt chunks of
 * other sequences share steps) give exactly the tokens each gives alone. */
static void batched_generation_equals_generation_alone(void **state)
{
    enum { N = 6, GEN = 16 };
    static const int lens[N] = {3, 7, 16, 17, 33, 50};
    int32_t prompts[N][64];
    struct obs alone[N], batched[N];
    struct engine_params p = small_params();
    struct th_rng rng = {12345};
    struct waiter w;
    struct engine_stats st;
    struct engine *e;
    uint64_t rows = 0;
    (void)state;
    p.prefix_cache = false;
    p.prefill_chunk = 8;
    p.n_batch = 24;
    for (int i = 0; i < N; i++) {
        random_prompt(&rng, prompts[i], lens[i]);
        struct engine_request r = greedy_request(prompts[i], lens[i], GEN, NULL);
        run_alone(&llama_f32, &p, &r, &alone[i]);
        assert_int_equal(alone[i].res.n_gen, GEN);
    }
    waiter_init(&w);
    memset(batched, 0, sizeof(batched));
    p.n_threads = 2; /* results do not depend on the thread count either */
    e = make_engine(&llama_f32, &p);
    for (int i = 0; i < N; i++) {
        batched[i].w = &w;
        struct engine_request r = greedy_request(prompts[i], lens[i], GEN, &batched[i]);
        submit_ok(e, &r, NULL);
    }
    wait_done(&w, N);
    for (int i = 0; i < N; i++) {
        check_consistent(&batched[i]);
        assert_int_equal(batched[i].res.n_gen, GEN);
        assert_memory_equal(batched[i].res_tok, alone[i].res_tok, GEN * sizeof(int32_t));
        assert_int_equal(batched[i].res.text_len, alone[i].res.text_len);
        assert_memory_equal(batched[i].res_text, alone[i].res_text, alone[i].res.text_len);
        rows += (uint64_t)(lens[i] + GEN - 1); /* every token but the last is fed once */
    }
    engine_get_stats(e, &st);
    assert_int_equal(st.batch_rows_sum, rows);
    assert_int_equal(st.generated_tokens, N * GEN);
    uint64_t steps = 0, multi = 0;
    for (int b = 0; b < 11; b++) {
        steps += st.batch_hist[b];
        if (b >= 2)
            multi += st.batch_hist[b];
    }
    assert_int_equal(steps, st.steps);
    assert_true(multi > 0); /* steps of 3 or more rows happened: it did batch */
    assert_true(st.steps < rows);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    engine_destroy(e);
    waiter_fini(&w);
}

/* ---- prefix cache --------------------------------------------------------------------------- */

static void run_on(struct engine *e, const int32_t *prompt, int n, int gen, struct obs *o)
{
    struct waiter w;
    waiter_init(&w);
    memset(o, 0, sizeof(*o));
    o->w = &w;
    struct engine_request r = greedy_request(prompt, n, gen, o);
    submit_ok(e, &r, NULL);
    wait_done(&w, 1);
    check_consistent(o);
    o->w = NULL;
    waiter_fini(&w);
}

static void prefix_cache_reuses_shared_blocks_without_changing_output(void **state)
{
    enum { GEN = 12 };
    int32_t a[80], b[80], q[64], q_last[64], q_mid[64];
    struct engine_params p = small_params();
    struct th_rng rng = {777};
    struct obs oa, ob, ob_ref, oa2, oq, oq2, oql, oql_ref, oqm, oqm_ref;
    struct engine_stats st;
    struct engine *e;
    (void)state;
    /* a and b share 71 tokens (4 full blocks of 16, and 7 more) */
    random_prompt(&rng, a, 80);
    memcpy(b, a, sizeof(b));
    for (int i = 71; i < 80; i++)
        b[i] = 3 + (int32_t)(th_rng_u64(&rng) % 765);
    b[71] = a[71] == 100 ? 101 : 100;
    /* q: exactly 4 blocks; q_last differs in the last token only, q_mid at position 40 */
    random_prompt(&rng, q, 64);
    memcpy(q_last, q, sizeof(q));
    q_last[63] = q[63] == 200 ? 201 : 200;
    memcpy(q_mid, q, sizeof(q));
    q_mid[40] = q[40] == 300 ? 301 : 300;

    e = make_engine(&llama_f32, &p);
    run_on(e, a, 76, GEN, &oa);
    assert_int_equal(oa.res.n_cached, 0);
    run_on(e, b, 78, GEN, &ob);
    assert_int_equal(ob.res.n_cached, 64);
    run_on(e, a, 76, GEN, &oa2); /* the same prompt again */
    assert_int_equal(oa2.res.n_cached, 64);
    assert_memory_equal(oa2.res_tok, oa.res_tok, GEN * sizeof(int32_t));
    run_on(e, q, 64, GEN, &oq);
    run_on(e, q, 64, GEN, &oq2); /* whole prompt cached: the last block is recomputed */
    assert_int_equal(oq2.res.n_cached, 48);
    assert_memory_equal(oq2.res_tok, oq.res_tok, GEN * sizeof(int32_t));
    run_on(e, q_last, 64, GEN, &oql);
    assert_int_equal(oql.res.n_cached, 48);
    run_on(e, q_mid, 64, GEN, &oqm);
    assert_int_equal(oqm.res.n_cached, 32);
    engine_get_stats(e, &st);
    assert_int_equal(st.prefix_queries, 7);
    assert_int_equal(st.prefix_hit_tokens, 64 + 64 + 48 + 48 + 32);
    assert_true(st.kv_blocks_cached > 0);
    assert_int_equal(st.kv_blocks_used, st.kv_blocks_cached); /* nothing running */
    engine_destroy(e);

    /* the same requests with the cache off give the same tokens */
    p.prefix_cache = false;
    e = make_engine(&llama_f32, &p);
    run_on(e, b, 78, GEN, &ob_ref);
    run_on(e, q_last, 64, GEN, &oql_ref);
    run_on(e, q_mid, 64, GEN, &oqm_ref);
    assert_int_equal(ob_ref.res.n_cached, 0);
    engine_get_stats(e, &st);
    assert_int_equal(st.prefix_queries, 0);
    engine_destroy(e);
    assert_memory_equal(ob.res_tok, ob_ref.res_tok, GEN * sizeof(int32_t));
    assert_memory_equal(oql.res_tok, oql_ref.res_tok, GEN * sizeof(int32_t));
    assert_memory_equal(oqm.res_tok, oqm_ref.res_tok, GEN * sizeof(int32_t));
}

/* A conversation's next turn starts with the previous prompt and its reply: with
 * cache_generated the reply's full blocks are in the prefix cache too, without it only the
 * prompt's; either way the next turn's tokens are those of an engine without a cache. */
static void generated_blocks_enter_the_prefix_cache_when_asked(void **state)
{
    enum { N_A = 40, GEN = 30, N_MORE = 10 };
    int32_t a[N_A], next[N_A + GEN + N_MORE];
    struct engine_params p = small_params();
    struct th_rng rng = {4242};
    struct obs o1, o2, oref;
    struct waiter w;
    (void)state;
    random_prompt(&rng, a, N_A);
    for (int keep = 0; keep < 2; keep++) {
        struct engine *e = make_engine(&llama_f32, &p);
        struct engine_request r;
        waiter_init(&w);
        memset(&o1, 0, sizeof(o1));
        o1.w = &w;
        r = greedy_request(a, N_A, GEN, &o1);
        r.cache_generated = keep != 0;
        submit_ok(e, &r, NULL);
        wait_done(&w, 1);
        check_consistent(&o1);
        o1.w = NULL;
        waiter_fini(&w);
        assert_int_equal(o1.res.n_gen, GEN);
        memcpy(next, a, sizeof(a));
        memcpy(next + N_A, o1.res_tok, GEN * sizeof(int32_t));
        for (int i = 0; i < N_MORE; i++)
            next[N_A + GEN + i] = 3 + (int32_t)(th_rng_u64(&rng) % 765);
        run_on(e, next, N_A + GEN + N_MORE, 8, &o2);
        /* KV exists for the prompt and every generated token but the last (max_tokens ended
         * it before it ran): 69 positions, 4 full blocks; the prompt alone fills 2 */
        assert_int_equal(o2.res.n_cached, keep ? (N_A + GEN - 1) / 16 * 16 : N_A / 16 * 16);
        engine_destroy(e);
        p.prefix_cache = false;
        e = make_engine(&llama_f32, &p);
        run_on(e, next, N_A + GEN + N_MORE, 8, &oref);
        engine_destroy(e);
        p.prefix_cache = true;
        assert_memory_equal(o2.res_tok, oref.res_tok, 8 * sizeof(int32_t));
    }
}

/* ---- scheduling ------------------------------------------------------------------------------ */

static void interactive_requests_run_before_earlier_bulk_ones(void **state)
{
    int32_t prompt[4] = {1, 50, 60, 70};
    struct engine_params p = small_params();
    struct waiter w;
    struct obs o[5];
    struct engine *e;
    static const int order_want[5] = {0, 3, 4, 1, 2};
    (void)state;
    p.n_seq_max = 1;
    p.bulk_max_wait_s = 100.0;
    waiter_init(&w);
    memset(o, 0, sizeof(o));
    e = make_engine(&llama_f32, &p);
    for (int i = 0; i < 5; i++) {
        o[i].w = &w;
        o[i].tag = i;
    }
    o[0].gated = true;
    struct engine_request r = greedy_request(prompt, 4, 2, &o[0]);
    submit_ok(e, &r, NULL);
    wait_gate_entered(&w);
    for (int i = 1; i < 5; i++) {
        r = greedy_request(prompt, 4, 1, &o[i]);
        r.priority = i <= 2 ? ENGINE_PRIO_BULK : ENGINE_PRIO_INTERACTIVE;
        submit_ok(e, &r, NULL);
    }
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.queued[ENGINE_PRIO_BULK], 2);
    assert_int_equal(st.queued[ENGINE_PRIO_INTERACTIVE], 2);
    assert_int_equal(st.running, 1);
    open_gate(&w);
    wait_done(&w, 5);
    assert_memory_equal(w.order, order_want, sizeof(order_want));
    for (int i = 0; i < 5; i++)
        check_consistent(&o[i]);
    engine_destroy(e);
    waiter_fini(&w);
}

static void bulk_request_waiting_too_long_goes_first(void **state)
{
    int32_t prompt[4] = {1, 50, 60, 70};
    struct engine_params p = small_params();
    struct waiter w;
    struct obs o[4];
    struct engine *e;
    static const int order_want[4] = {0, 1, 2, 3};
    (void)state;
    p.n_seq_max = 1;
    p.bulk_max_wait_s = 0.15;
    waiter_init(&w);
    memset(o, 0, sizeof(o));
    e = make_engine(&llama_f32, &p);
    for (int i = 0; i < 4; i++) {
        o[i].w = &w;
        o[i].tag = i;
    }
    o[0].gated = true;
    struct engine_request r = greedy_request(prompt, 4, 2, &o[0]);
    submit_ok(e, &r, NULL);
    wait_gate_entered(&w);
    r = greedy_request(prompt, 4, 1, &o[1]); /* bulk, will have waited long */
    r.priority = ENGINE_PRIO_BULK;
    submit_ok(e, &r, NULL);
    sleep_s(0.3);
    r = greedy_request(prompt, 4, 1, &o[2]); /* interactive, fresh */
    submit_ok(e, &r, NULL);
    r = greedy_request(prompt, 4, 1, &o[3]); /* bulk, fresh: after the interactive one */
    r.priority = ENGINE_PRIO_BULK;
    submit_ok(e, &r, NULL);
    open_gate(&w);
    wait_done(&w, 4);
    assert_memory_equal(w.order, order_want, sizeof(order_want));
    engine_destroy(e);
    waiter_fini(&w);
}

static void full_queue_rejects_and_every_accepted_request_finishes_once(void **state)
{
    int32_t prompt[4] = {1, 50, 60, 70};
    struct engine_params p = small_params();
    struct waiter w;
    struct obs o[6];
    struct engine *e;
    struct engine_stats st;
    uint64_t id;
    (void)state;
    p.n_seq_max = 1;
    p.queue_max = 3;
    waiter_init(&w);
    memset(o, 0, sizeof(o));
    e = make_engine(&llama_f32, &p);
    for (int i = 0; i < 6; i++)
        o[i].w = &w;
    o[0].gated = true;
    struct engine_request r = greedy_request(prompt, 4, 2, &o[0]);
    submit_ok(e, &r, NULL);
    wait_gate_entered(&w); /* running, not queued */
    for (int i = 1; i <= 3; i++) {
        r = greedy_request(prompt, 4, 2, &o[i]);
        r.priority = i == 2 ? ENGINE_PRIO_BULK : ENGINE_PRIO_INTERACTIVE;
        submit_ok(e, &r, NULL);
    }
    r = greedy_request(prompt, 4, 2, &o[4]);
    assert_int_equal(engine_submit(e, &r, &id), AR_EBUSY);
    r.priority = ENGINE_PRIO_BULK;
    assert_int_equal(engine_submit(e, &r, &id), AR_EBUSY); /* the bound covers both classes */
    engine_get_stats(e, &st);
    assert_int_equal(st.rejected_full, 2);
    assert_int_equal(st.queued[0] + st.queued[1], 3);
    open_gate(&w);
    wait_done(&w, 4);
    /* room again */
    r = greedy_request(prompt, 4, 2, &o[5]);
    submit_ok(e, &r, NULL);
    wait_done(&w, 5);
    engine_destroy(e);
    for (int i = 0; i < 6; i++) {
        if (i == 4) {
            assert_int_equal(o[i].n_done, 0);
            continue;
        }
        check_consistent(&o[i]);
        assert_int_equal(o[i].res.finish, ENGINE_FINISH_LENGTH);
    }
    waiter_fini(&w);
}

static void cancel_frees_kv_of_running_and_removes_queued_requests(void **state)
{
    int32_t prompt[40];
    struct engine_params p = small_params();
    struct th_rng rng = {99};
    struct waiter w;
    struct obs o[3];
    struct engine *e;
    struct engine_stats st;
    uint64_t id_run, id_queued, id_other;
    (void)state;
    p.n_seq_max = 1;
    p.prefix_cache = false;
    random_prompt(&rng, prompt, 40);
    waiter_init(&w);
    memset(o, 0, sizeof(o));
    e = make_engine(&llama_f32, &p);
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    for (int i = 0; i < 3; i++) {
        o[i].w = &w;
        o[i].tag = i;
    }
    o[0].gated = true;
    struct engine_request r = greedy_request(prompt, 40, 400, &o[0]);
    submit_ok(e, &r, &id_run);
    wait_gate_entered(&w);
    r = greedy_request(prompt, 40, 3, &o[1]);
    submit_ok(e, &r, &id_queued);
    r = greedy_request(prompt, 40, 3, &o[2]);
    submit_ok(e, &r, &id_other);
    engine_get_stats(e, &st);
    assert_true(st.kv_blocks_used >= 3); /* 41 tokens of 16 */
    double t0 = ar_time_s();
    engine_cancel(e, id_queued);
    engine_cancel(e, id_run);
    engine_cancel(e, 123456); /* unknown: ignored */
    open_gate(&w);
    wait_done(&w, 3);
    assert_true(ar_time_s() - t0 < 5.0);
    assert_int_equal(o[0].res.finish, ENGINE_FINISH_CANCELLED);
    assert_true(o[0].res.n_gen >= 1 && o[0].res.n_gen < 400);
    assert_int_equal(o[1].res.finish, ENGINE_FINISH_CANCELLED);
    assert_int_equal(o[1].res.n_gen, 0);
    assert_int_equal(o[2].res.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(o[2].res.n_gen, 3);
    engine_cancel(e, id_other); /* finished: ignored */
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.running, 0);
    engine_destroy(e);
    for (int i = 0; i < 3; i++)
        check_consistent(&o[i]);
    waiter_fini(&w);
}

static void timeouts_end_running_and_queued_requests(void **state)
{
    int32_t prompt[8] = {1, 40, 41, 42, 43, 44, 45, 46};
    struct engine_params p = small_params();
    struct waiter w;
    struct obs o[2];
    struct engine *e;
    (void)state;
    p.n_seq_max = 1;
    waiter_init(&w);
    memset(o, 0, sizeof(o));
    e = make_engine(&llama_f32, &p);
    o[0].w = o[1].w = &w;
    o[0].sleep_first_s = 0.3; /* the scheduler stalls past both deadlines */
    struct engine_request r = greedy_request(prompt, 8, 400, &o[0]);
    r.timeout_s = 0.1;
    submit_ok(e, &r, NULL);
    r = greedy_request(prompt, 8, 400, &o[1]);
    r.timeout_s = 0.1;
    submit_ok(e, &r, NULL);
    wait_done(&w, 2);
    assert_int_equal(o[0].res.finish, ENGINE_FINISH_TIMEOUT);
    assert_true(o[0].res.n_gen >= 1 && o[0].res.n_gen < 400);
    assert_int_equal(o[1].res.finish, ENGINE_FINISH_TIMEOUT);
    assert_int_equal(o[1].res.n_gen, 0);
    check_consistent(&o[0]);
    check_consistent(&o[1]);
    engine_destroy(e);
    waiter_fini(&w);
}

/* KV for 6 blocks of 16 tokens, three requests that need 4 blocks each at the end: they
 * cannot all run to completion together, yet all finish with their tokens from alone. */
static void preempted_requests_finish_with_the_same_tokens(void **state)
{
    enum { N = 3, GEN = 40, LEN = 20 };
    int32_t prompts[N][LEN];
    struct engine_params p = small_params();
    struct th_rng rng = {4242};
    struct obs alone[N], o[N];
    struct waiter w;
    struct engine *e;
    struct engine_stats st;
    int n_pre = 0;
    (void)state;
    for (int i = 0; i < N; i++) {
        random_prompt(&rng, prompts[i], LEN);
        struct engine_request r = greedy_request(prompts[i], LEN, GEN, NULL);
        run_alone(&llama_f32, &p, &r, &alone[i]);
    }
    for (int cache = 0; cache < 2; cache++) {
        n_pre = 0;
        p.kv_tokens = 96;
        p.n_seq_max = N;
        p.prefix_cache = cache != 0;
        waiter_init(&w);
        memset(o, 0, sizeof(o));
        e = make_engine(&llama_f32, &p);
        for (int i = 0; i < N; i++) {
            o[i].w = &w;
            struct engine_request r = greedy_request(prompts[i], LEN, GEN, &o[i]);
            r.priority = i == 0 ? ENGINE_PRIO_BULK : ENGINE_PRIO_INTERACTIVE;
            submit_ok(e, &r, NULL);
        }
        wait_done(&w, N);
        engine_get_stats(e, &st);
        assert_true(st.preemptions > 0);
        for (int i = 0; i < N; i++) {
            check_consistent(&o[i]);
            assert_int_equal(o[i].res.finish, ENGINE_FINISH_LENGTH);
            assert_int_equal(o[i].res.n_gen, GEN);
            assert_memory_equal(o[i].res_tok, alone[i].res_tok, GEN * sizeof(int32_t));
            assert_int_equal(o[i].res.text_len, alone[i].res.text_len);
            assert_memory_equal(o[i].res_text, alone[i].res_text, alone[i].res.text_len);
            n_pre += o[i].res.n_preempted;
        }
        assert_true(n_pre > 0);
        assert_int_equal(st.kv_blocks_used, st.kv_blocks_cached);
        engine_destroy(e);
        waiter_fini(&w);
    }
}

/* Many requests sharing prefixes of random lengths, both priorities, some cancelled, on a KV
 * cache small enough to need prefix eviction and preemption: every request finishes once,
 * each one's tokens are those it gets alone, and in the end only cached blocks remain. */
static void mixed_workload_keeps_every_request_exact(void **state)
{
    enum { N = 12, GEN = 24 };
    static int32_t prompts[N][80];
    static struct obs alone[N], o[N];
    int lens[N];
    int32_t base[80];
    uint64_t ids[N];
    struct th_rng rng = {31337};
    struct engine_params p = small_params();
    struct engine_stats st;
    struct waiter w;
    struct engine *e;
    int n_cancelled = 0;
    (void)state;
    random_prompt(&rng, base, 80);
    for (int i = 0; i < N; i++) {
        int keep = (int)(th_rng_u64(&rng) % 70) + 1;
        memcpy(prompts[i], base, sizeof(base));
        lens[i] = keep + (int)(th_rng_u64(&rng) % 10) + 1;
        for (int k = keep; k < lens[i]; k++)
            prompts[i][k] = 3 + (int32_t)(th_rng_u64(&rng) % 765);
        struct engine_request r = greedy_request(prompts[i], lens[i], GEN, NULL);
        run_alone(&llama_f32, &p, &r, &alone[i]);
    }
    p.kv_tokens = 160;
    p.n_seq_max = 6;
    p.prefill_chunk = 16;
    p.n_batch = 40;
    waiter_init(&w);
    memset(o, 0, sizeof(o));
    e = make_engine(&llama_f32, &p);
    for (int i = 0; i < N; i++) {
        o[i].w = &w;
        struct engine_request r = greedy_request(prompts[i], lens[i], GEN, &o[i]);
        r.priority = i % 3 == 0 ? ENGINE_PRIO_BULK : ENGINE_PRIO_INTERACTIVE;
        submit_ok(e, &r, &ids[i]);
        if (i % 5 == 4)
            engine_cancel(e, ids[i - 1]);
    }
    wait_done(&w, N);
    engine_get_stats(e, &st);
    for (int i = 0; i < N; i++) {
        check_consistent(&o[i]);
        if (o[i].res.finish == ENGINE_FINISH_CANCELLED) {
            n_cancelled++;
            assert_true(o[i].res.n_gen <= GEN);
        } else {
            assert_int_equal(o[i].res.finish, ENGINE_FINISH_LENGTH);
            assert_int_equal(o[i].res.n_gen, GEN);
        }
        assert_memory_equal(o[i].res_tok, alone[i].res_tok, (size_t)o[i].res.n_gen * sizeof(int32_t));
    }
    assert_true(n_cancelled <= 2);
    assert_true(st.prefix_hit_tokens > 0);
    assert_int_equal(st.kv_blocks_used, st.kv_blocks_cached);
    assert_int_equal(st.queued[0] + st.queued[1] + st.running, 0);
    engine_destroy(e);
    waiter_fini(&w);
}

/* ---- stops and limits -------------------------------------------------------------------------- */

/* The demo model's ChatML prompt for one review; ids freed by the caller (ar_free). */
static int32_t *demo_prompt(int *n)
{
    struct tokenizer_chat_msg msgs[2] = {
        {"system", "你是一家网店的客服，负责回复顾客的商品评价。回复要礼貌、真诚、简洁，使用与顾客相同的语言。"},
        {"user", "评分：5星\n评价：质量很好，物流也很快，下次还会再来！"},
    };
    char *text;
    size_t len;
    int32_t *ids;
    int64_t n_ids;
    assert_int_equal(tokenizer_chat_format(tokenizer_chat_family(demo.tok), msgs, 2, true, &text,
                                           &len),
                     AR_OK);
    assert_int_equal(tokenizer_encode(demo.tok, text, len, true, true, &ids, &n_ids), AR_OK);
    ar_free(text);
    *n = (int)n_ids;
    return ids;
}

static size_t utf8_back_to_boundary(const char *s, size_t i)
{
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
        i--;
    return i;
}

static void generation_stops_at_eog_stop_strings_and_max_tokens(void **state)
{
    struct engine_params p = small_params();
    struct obs full, cut, held, shortr;
    int n;
    int32_t *prompt = demo_prompt(&n);
    (void)state;
    /* end of generation: the demo model closes its reply with <|im_end|> */
    struct engine_request r = greedy_request(prompt, n, 200, NULL);
    r.ignore_eos = false;
    run_alone(&demo, &p, &r, &full);
    assert_int_equal(full.res.finish, ENGINE_FINISH_STOP);
    assert_true(full.res.n_gen > 4 && full.res.n_gen < 200);
    for (int i = 0; i < full.res.n_gen; i++)
        assert_false(tokenizer_is_eog(demo.tok, full.res_tok[i]));
    assert_null(strstr(full.res_text, "<|im_end|>"));
    char *dec;
    size_t dec_len;
    assert_int_equal(tokenizer_decode(demo.tok, full.res_tok, full.res.n_gen, true, &dec, &dec_len),
                     AR_OK);
    assert_int_equal(dec_len, full.res.text_len);
    assert_memory_equal(dec, full.res_text, dec_len);
    ar_free(dec);

    /* a stop string from the middle of that text (whole characters, several tokens long) */
    size_t len = full.res.text_len;
    assert_true(len >= 8);
    size_t a = utf8_back_to_boundary(full.res_text, len / 2);
    size_t b = utf8_back_to_boundary(full.res_text, AR_MIN(len, a + 7));
    if (b <= a)
        b = len;
    char stop[64];
    memcpy(stop, full.res_text + a, b - a);
    stop[b - a] = '\0';
    size_t first = (size_t)(strstr(full.res_text, stop) - full.res_text);
    const char *stops[2] = {"never-appears-xyz", stop};
    r.stop = stops;
    r.n_stop = 2;
    run_alone(&demo, &p, &r, &cut);
    assert_int_equal(cut.res.finish, ENGINE_FINISH_STOP);
    assert_int_equal(cut.res.text_len, first);
    assert_memory_equal(cut.res_text, full.res_text, first);
    assert_true(cut.res.n_gen <= full.res.n_gen);
    assert_memory_equal(cut.res_tok, full.res_tok, (size_t)cut.res.n_gen * sizeof(int32_t));

    /* a stop string that starts like the text's first character but never completes: held
     * back each time, then released; nothing is lost */
    char never[16];
    size_t c1 = 1; /* bytes of the first character */
    while (c1 < len && ((unsigned char)full.res_text[c1] & 0xc0) == 0x80)
        c1++;
    memcpy(never, full.res_text, c1);
    never[c1] = '\x01';
    never[c1 + 1] = '\0';
    const char *stops2[1] = {never};
    r.stop = stops2;
    r.n_stop = 1;
    run_alone(&demo, &p, &r, &held);
    assert_int_equal(held.res.finish, ENGINE_FINISH_STOP);
    assert_int_equal(held.res.text_len, full.res.text_len);
    assert_memory_equal(held.res_text, full.res_text, len);

    /* max_tokens */
    r.stop = NULL;
    r.n_stop = 0;
    r.max_tokens = 3;
    run_alone(&demo, &p, &r, &shortr);
    assert_int_equal(shortr.res.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(shortr.res.n_gen, 3);
    assert_memory_equal(shortr.res_tok, full.res_tok, 3 * sizeof(int32_t));
    ar_free(prompt);
}

static void context_limit_ends_generation_and_bad_requests_are_refused(void **state)
{
    struct engine_params p = small_params();
    int32_t prompt[64];
    struct th_rng rng = {5};
    struct obs o;
    struct engine *e;
    uint64_t id;
    (void)state;
    p.kv_tokens = 64;
    random_prompt(&rng, prompt, 64);
    e = make_engine(&llama_f32, &p);
    assert_int_equal(engine_n_ctx(e), 64);
    struct engine_request r = greedy_request(prompt, 64, 10, NULL);
    assert_int_equal(engine_submit(e, &r, &id), AR_ERANGE);
    r.n_prompt = 0;
    assert_int_equal(engine_submit(e, &r, &id), AR_EINVAL);
    r.n_prompt = 4;
    r.max_tokens = 0;
    assert_int_equal(engine_submit(e, &r, &id), AR_EINVAL);
    r.max_tokens = 4;
    r.sampling.top_p = 2.0f;
    assert_int_equal(engine_submit(e, &r, &id), AR_EINVAL);
    r.sampling.top_p = 1.0f;
    int32_t bad[2] = {1, 768};
    r.prompt = bad;
    r.n_prompt = 2;
    assert_int_equal(engine_submit(e, &r, &id), AR_EINVAL);
    run_on(e, prompt, 61, 100, &o);
    assert_int_equal(o.res.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(o.res.n_gen, 3); /* prompt + generated = the context */
    engine_destroy(e);
}

static void destroy_cancels_queued_and_running_requests(void **state)
{
    int32_t prompt[4] = {1, 50, 60, 70};
    struct engine_params p = small_params();
    struct waiter w;
    struct obs o[3];
    struct engine *e;
    (void)state;
    p.n_seq_max = 1;
    waiter_init(&w);
    memset(o, 0, sizeof(o));
    e = make_engine(&llama_f32, &p);
    for (int i = 0; i < 3; i++)
        o[i].w = &w;
    o[0].gated = true;
    struct engine_request r = greedy_request(prompt, 4, 400, &o[0]);
    submit_ok(e, &r, NULL);
    wait_gate_entered(&w);
    for (int i = 1; i < 3; i++) {
        r = greedy_request(prompt, 4, 400, &o[i]);
        submit_ok(e, &r, NULL);
    }
    open_gate(&w);
    engine_destroy(e);
    for (int i = 0; i < 3; i++) {
        check_consistent(&o[i]);
        assert_int_equal(o[i].res.finish, ENGINE_FINISH_CANCELLED);
    }
    waiter_fini(&w);
}

static void create_fails_cleanly_on_every_allocation(void **state)
{
    struct engine_params p = small_params();
    (void)state;
    for (uint64_t n = 1;; n++) {
        struct engine *e = NULL;
        enum ar_status st;
        ar_alloc_fail_after(n);
        st = engine_create(llama_f32.m, llama_f32.tok, &p, &e, NULL);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            engine_destroy(e);
            assert_true(n > 1);
            break;
        }
        assert_int_equal(st, AR_ENOMEM);
        assert_null(e);
    }
}

/* ---- sliding-window models ------------------------------------------------------------------ */

/* Greedy tokens of prompt + gen through model_forward with one pool that keeps every block,
 * in the engine's schedule for a request alone (prompt chunks of `chunk` rows, logits of the
 * last row only, then one row per step; one thread), so its logits are the engine's bit for
 * bit when the local pool changes nothing. */
static void greedy_one_pool(const struct model *m, const int32_t *prompt, int n, int gen,
                            int chunk, int32_t *out)
{
    int nv = model_hparams(m)->n_vocab, total = n + gen;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)total), *pos = malloc(sizeof(int32_t) * (size_t)chunk);
    int32_t *seq = calloc((size_t)chunk, sizeof(int32_t));
    uint8_t *want = calloc((size_t)chunk, 1);
    float *logits = malloc(sizeof(float) * (size_t)nv);
    struct model_ctx *ctx;
    struct kv_params kp;
    struct kv_cache *kv = NULL;
    struct kv_seq s, *sp = &s;
    assert_true(toks && pos && seq && want && logits);
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)n);
    assert_int_equal(model_ctx_create(m, chunk, NULL, &ctx), AR_OK);
    model_kv_params(m, 16, (total + 15) / 16, AR_TYPE_F16, &kp);
    assert_int_equal(kv_create(&kp, &kv), AR_OK);
    assert_false(kv_has_local(kv));
    kv_seq_init(&s);
    for (int p0 = 0; p0 < total - 1;) {
        int c = p0 < n ? AR_MIN(chunk, n - p0) : 1;
        for (int i = 0; i < c; i++) {
            pos[i] = p0 + i;
            want[i] = p0 + i == (p0 < n ? n : p0 + 1) - 1;
        }
        assert_int_equal(kv_seq_reserve(kv, &s, p0 + c), AR_OK);
        struct model_batch b = {.n_tokens = c, .tokens = toks + p0, .pos = pos, .seq = seq,
                                .logits = want, .n_seqs = 1};
        assert_int_equal(model_forward(ctx, kv, &sp, &b, logits), AR_OK);
        p0 += c;
        if (p0 >= n) {
            int best = 0;
            for (int i = 1; i < nv; i++)
                if (logits[i] > logits[best])
                    best = i;
            toks[p0] = best;
        }
    }
    memcpy(out, toks + n, sizeof(int32_t) * (size_t)gen);
    kv_seq_fini(kv, &s);
    kv_destroy(kv);
    model_ctx_destroy(ctx);
    free(toks);
    free(pos);
    free(seq);
    free(want);
    free(logits);
}

/* gemma3 (window 64 on layer 0): an engine gets a local pool smaller than the global one;
 * three 300-position requests at once hold at most ceil(64 / 16) + 2 local blocks each while
 * decoding, and every request's tokens are those of a single pool keeping all K/V. With the
 * prefix cache, a prompt sharing 270 tokens reuses 256 of them (past the window, its local
 * blocks from the cache) and still gives those tokens. */
static void sliding_window_model_frees_local_blocks_and_keeps_tokens(void **state)
{
    enum { N = 3, PROMPT = 200, GEN = 100, CHUNK = 64 };
    int32_t prompt[N][PROMPT + 80], want[N][GEN], b[280], want_b[20];
    struct engine_params p = small_params();
    struct th_rng rng = {9090};
    struct obs o[N], oa, ob;
    struct waiter w;
    struct engine_stats st;
    struct engine *e;
    int nv = model_hparams(gemma3.m)->n_vocab;
    (void)state;
    assert_int_equal(model_hparams(gemma3.m)->swa_window, 64);
    assert_true(model_hparams(gemma3.m)->n_ctx_train >= 300);
    p.prefill_chunk = CHUNK;
    p.n_seq_max = 4;
    for (int k = 0; k < N; k++) {
        prompt[k][0] = 2; /* <bos> */
        for (int i = 1; i < PROMPT + 80; i++)
            prompt[k][i] = 7 + (int32_t)(th_rng_u64(&rng) % (uint64_t)(nv - 7));
        greedy_one_pool(gemma3.m, prompt[k], PROMPT, GEN, CHUNK, want[k]);
    }

    /* cache off: what the local pool holds is the sequences' own blocks */
    p.prefix_cache = false;
    e = make_engine(&gemma3, &p);
    engine_get_stats(e, &st);
    assert_true(st.kv_local_blocks_total > 0 && st.kv_local_blocks_total < st.kv_blocks_total);
    assert_int_equal(st.kv_local_blocks_used, 0);
    waiter_init(&w);
    local_used_max = 0;
    local_watch = e;
    for (int k = 0; k < N; k++) {
        memset(&o[k], 0, sizeof(o[k]));
        o[k].w = &w;
        struct engine_request r = greedy_request(prompt[k], PROMPT, GEN, &o[k]);
        submit_ok(e, &r, NULL);
    }
    wait_done(&w, N);
    local_watch = NULL;
    for (int k = 0; k < N; k++) {
        check_consistent(&o[k]);
        assert_int_equal(o[k].n_tok, GEN);
        assert_memory_equal(o[k].tok, want[k], sizeof(int32_t) * GEN);
    }
    /* a decoding sequence holds its window, 64 positions: at most 5 blocks of 16, +1 being
     * opened; one still prefilling (when the test thread submitted late) a chunk of 64 and
     * its window: at most ceil((63 + 64) / 16) + 1 = 9. Keeping every block would take 19
     * blocks per sequence. */
    assert_true(local_used_max > 0);
    assert_true(local_used_max <= N * 9);
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_local_blocks_used, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    engine_destroy(e);
    waiter_fini(&w);

    /* cache on: a registers its 280-token prompt; b shares its first 270 tokens */
    p.prefix_cache = true;
    memcpy(b, prompt[0], sizeof(b));
    for (int i = 270; i < 280; i++)
        b[i] = prompt[1][i];
    greedy_one_pool(gemma3.m, b, 280, 20, CHUNK, want_b);
    e = make_engine(&gemma3, &p);
    run_on(e, prompt[0], 280, 20, &oa);
    run_on(e, b, 280, 20, &ob);
    assert_int_equal(ob.res.n_cached, 256);
    assert_memory_equal(ob.tok, want_b, sizeof(want_b));
    engine_get_stats(e, &st);
    assert_true(st.kv_local_blocks_used > 0); /* the cache keeps some */
    engine_destroy(e);

    /* a KV cache for 480 tokens (the local pool then as large as the global one, 30 blocks):
     * two requests of 13 blocks fit, growing to 19 each they do not; one is preempted and
     * recomputed, the prefix cache gives up blocks, and the tokens stay exact */
    p.kv_tokens = 480;
    e = make_engine(&gemma3, &p);
    waiter_init(&w);
    for (int k = 0; k < N; k++) {
        memset(&o[k], 0, sizeof(o[k]));
        o[k].w = &w;
        struct engine_request r = greedy_request(prompt[k], PROMPT, GEN, &o[k]);
        submit_ok(e, &r, NULL);
    }
    wait_done(&w, N);
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_local_blocks_total, 30);
    assert_true(st.preemptions > 0);
    for (int k = 0; k < N; k++) {
        check_consistent(&o[k]);
        assert_memory_equal(o[k].tok, want[k], sizeof(int32_t) * GEN);
    }
    engine_destroy(e);
    waiter_fini(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_generation_matches_reference_continuation),
        cmocka_unit_test(batched_generation_equals_generation_alone),
        cmocka_unit_test(prefix_cache_reuses_shared_blocks_without_changing_output),
        cmocka_unit_test(generated_blocks_enter_the_prefix_cache_when_asked),
        cmocka_unit_test(interactive_requests_run_before_earlier_bulk_ones),
        cmocka_unit_test(bulk_request_waiting_too_long_goes_first),
        cmocka_unit_test(full_queue_rejects_and_every_accepted_request_finishes_once),
        cmocka_unit_test(cancel_frees_kv_of_running_and_removes_queued_requests),
        cmocka_unit_test(timeouts_end_running_and_queued_requests),
        cmocka_unit_test(preempted_requests_finish_with_the_same_tokens),
        cmocka_unit_test(mixed_workload_keeps_every_request_exact),
        cmocka_unit_test(generation_stops_at_eog_stop_strings_and_max_tokens),
        cmocka_unit_test(context_limit_ends_generation_and_bad_requests_are_refused),
        cmocka_unit_test(destroy_cancels_queued_and_running_requests),
        cmocka_unit_test(create_fails_cleanly_on_every_allocation),
        cmocka_unit_test(sliding_window_model_frees_local_blocks_and_keeps_tokens),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
