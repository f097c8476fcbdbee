/* generate.c - the public API's engine (include/autoreply.h): ar_engine wraps the serving
 * engine (src/engine/engine.h) over an ar_model. A request's public params become an
 * engine_request; its callbacks are forwarded through a small per-request record that
 * on_done frees, and ar_engine_generate waits on a condition variable as the reply
 * module's generator does. */
#include <pthread.h>
#include <string.h>

#include "api_internal.h"

struct ar_engine_params ar_engine_params_default(void)
{
    struct engine_params d = engine_default_params();
    struct ar_engine_params p;
    memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.n_threads = 0;
    p.n_seq_max = d.n_seq_max;
    p.kv_tokens = d.kv_tokens;
    p.n_batch = d.n_batch;
    p.queue_max = d.queue_max;
    p.prefix_cache = d.prefix_cache;
    return p;
}

struct ar_request_params ar_request_params_default(void)
{
    struct sampler_params s = sampler_default_params();
    struct ar_request_params p;
    memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.max_tokens = 128;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.repeat_penalty = s.repeat_penalty;
    p.repeat_last_n = s.repeat_last_n;
    p.seed = s.seed;
    p.add_special = true;
    return p;
}

const char *ar_finish_str(enum ar_finish f)
{
    switch (f) {
    case AR_FINISH_STOP:
        return "stop";
    case AR_FINISH_LENGTH:
        return "length";
    case AR_FINISH_CANCELLED:
        return "cancelled";
    case AR_FINISH_TIMEOUT:
        return "timeout";
    case AR_FINISH_ERROR:
        return "error";
    }
    return "unknown";
}

enum ar_status ar_engine_create(struct ar_model *m, const struct ar_engine_params *params,
                                struct ar_engine **out, struct ar_err *err)
{
    struct ar_engine_params p = ar_engine_params_default();
    struct engine_params ep = engine_default_params();
    struct ar_engine *e;
    enum ar_status st;
    if (!out)
        return ar_err_set(err, AR_EINVAL, 0, "ar_engine_create: out is NULL");
    *out = NULL;
    if (!m)
        return ar_err_set(err, AR_EINVAL, 0, "ar_engine_create: no model");
    if ((st = api_params(&p, params, sizeof(p), "ar_engine_params", err)) != AR_OK)
        return st;
    ep.n_threads = p.n_threads > 0 ? p.n_threads : m->n_threads;
    ep.n_seq_max = p.n_seq_max;
    ep.kv_tokens = p.kv_tokens;
    ep.n_batch = p.n_batch;
    ep.queue_max = p.queue_max;
    ep.prefix_cache = p.prefix_cache;
    ep.kv_type = p.kv_f32 ? AR_TYPE_F32 : AR_TYPE_F16;
    if (p.n_threads < 0 || p.n_threads > 1024 || p.n_seq_max < 1 || p.kv_tokens < 1 ||
        p.n_batch < 1 || p.queue_max < 1)
        return ar_err_set(err, AR_EINVAL, 0,
                          "engine params out of range (n_threads %d, n_seq_max %d, kv_tokens "
                          "%lld, n_batch %d, queue_max %d)",
                          p.n_threads, p.n_seq_max, (long long)p.kv_tokens, p.n_batch,
                          p.queue_max);
    if (ep.prefill_chunk > ep.n_batch)
        ep.prefill_chunk = ep.n_batch;
    e = ar_calloc(1, sizeof(*e));
    if (!e)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    e->m = m;
    api_err_begin(err);
    if ((st = engine_create(m->model, m->tok, &ep, &e->e, err)) != AR_OK) {
        ar_free(e);
        return api_err_end(err, st);
    }
    *out = e;
    return AR_OK;
}

void ar_engine_free(struct ar_engine *e)
{
    if (!e)
        return;
    engine_destroy(e->e);
    ar_free(e);
}

int32_t ar_engine_n_ctx(const struct ar_engine *e)
{
    return e ? engine_n_ctx(e->e) : 0;
}

void ar_engine_cancel(struct ar_engine *e, uint64_t id)
{
    if (e)
        engine_cancel(e->e, id);
}

/* ---- submitting ---------------------------------------------------------------------------- */

/* The caller's callbacks for one accepted request; freed by on_done. */
struct relay {
    ar_token_fn on_token;
    ar_done_fn on_done;
    void *user;
};

static void relay_token(void *user, int32_t token, const char *text, size_t len)
{
    struct relay *r = user;
    if (r->on_token)
        r->on_token(r->user, token, text, len);
}

static enum ar_finish finish_of(enum engine_finish f)
{
    switch (f) {
    case ENGINE_FINISH_STOP:
        return AR_FINISH_STOP;
    case ENGINE_FINISH_LENGTH:
        return AR_FINISH_LENGTH;
    case ENGINE_FINISH_CANCELLED:
        return AR_FINISH_CANCELLED;
    case ENGINE_FINISH_TIMEOUT:
        return AR_FINISH_TIMEOUT;
    case ENGINE_FINISH_ERROR:
        break;
    }
    return AR_FINISH_ERROR;
}

static void relay_done(void *user, const struct engine_result *res)
{
    struct relay *r = user;
    struct ar_result out;
    memset(&out, 0, sizeof(out));
    out.status = res->status;
    out.finish = finish_of(res->finish);
    out.n_prompt = res->n_prompt;
    out.n_cached = res->n_cached;
    out.n_gen = res->n_gen;
    out.text = res->text ? res->text : "";
    out.text_len = res->text ? res->text_len : 0;
    out.queue_s = res->queue_s;
    out.first_token_s = res->first_token_s;
    out.total_s = res->total_s;
    if (r->on_done)
        r->on_done(r->user, &out);
    ar_free(r);
}

static enum ar_status submit_ids(struct ar_engine *e, const int32_t *ids, int32_t n,
                                 const struct ar_request_params *params, uint64_t *id,
                                 struct ar_err *err)
{
    struct ar_request_params p = ar_request_params_default();
    struct engine_request req;
    struct relay *r;
    uint64_t rid = 0;
    enum ar_status st;
    if ((st = api_params(&p, params, sizeof(p), "ar_request_params", err)) != AR_OK)
        return st;
    if (n < 1)
        return ar_err_set(err, AR_EINVAL, 0, "the prompt is empty");
    if (p.max_tokens < 1)
        return ar_err_set(err, AR_EINVAL, 0, "max_tokens %d is not >= 1", p.max_tokens);
    if (p.n_stop < 0 || (p.n_stop > 0 && !p.stop))
        return ar_err_set(err, AR_EINVAL, 0, "n_stop %d without stop strings", p.n_stop);
    for (int32_t i = 0; i < p.n_stop; i++)
        if (!p.stop[i] || !*p.stop[i])
            return ar_err_set(err, AR_EINVAL, 0, "stop string %d is NULL or empty", i);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(e->m->tok))
            return ar_err_set(err, AR_EINVAL, 0, "prompt token %d at %d is not in 0..%d",
                              ids[i], i, tokenizer_n_vocab(e->m->tok) - 1);
    if ((int64_t)n + p.max_tokens > engine_n_ctx(e->e))
        return ar_err_set(err, AR_ERANGE, 0,
                          "%d prompt tokens and max_tokens %d do not fit the context of %d", n,
                          p.max_tokens, engine_n_ctx(e->e));
    memset(&req, 0, sizeof(req));
    req.prompt = ids;
    req.n_prompt = n;
    req.max_tokens = p.max_tokens;
    req.sampling = sampler_default_params();
    req.sampling.temperature = p.temperature;
    req.sampling.top_k = p.top_k;
    req.sampling.top_p = p.top_p;
    req.sampling.min_p = p.min_p;
    req.sampling.repeat_penalty = p.repeat_penalty;
    req.sampling.repeat_last_n = p.repeat_last_n;
    req.sampling.seed = p.seed;
    req.ignore_eos = p.ignore_eos;
    req.stop = p.stop;
    req.n_stop = p.n_stop;
    req.priority = p.bulk ? ENGINE_PRIO_BULK : ENGINE_PRIO_INTERACTIVE;
    req.timeout_s = p.timeout_s;
    r = ar_malloc(sizeof(*r));
    if (!r)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    r->on_token = p.on_token;
    r->on_done = p.on_done;
    r->user = p.user_data;
    req.on_token = p.on_token ? relay_token : NULL;
    req.on_done = relay_done;
    req.user = r;
    if ((st = engine_submit(e->e, &req, &rid)) != AR_OK) {
        ar_free(r);
        switch (st) {
        case AR_EBUSY:
            return ar_err_set(err, st, 0, "the engine's queue is full: retry later");
        case AR_ERANGE:
            return ar_err_set(err, st, 0, "the prompt and max_tokens do not fit the context");
        case AR_EINVAL:
            return ar_err_set(err, st, 0, "invalid sampling parameters");
        default:
            return ar_err_set(err, st, 0, "cannot submit: %s", ar_status_str(st));
        }
    }
    if (id)
        *id = rid;
    return AR_OK;
}

enum ar_status ar_engine_submit_tokens(struct ar_engine *e, const int32_t *ids, int32_t n,
                                       const struct ar_request_params *params, uint64_t *id,
                                       struct ar_err *err)
{
    if (!e || (!ids && n))
        return ar_err_set(err, AR_EINVAL, 0, "ar_engine_submit_tokens: NULL engine or ids");
    return submit_ids(e, ids, n, params, id, err);
}

/* The prompt's ids as params say (add_special, parse_special). *ids new. */
static enum ar_status prompt_ids(struct ar_engine *e, const char *prompt,
                                 const struct ar_request_params *params, int32_t **ids,
                                 int32_t *n, struct ar_err *err)
{
    struct ar_request_params p = ar_request_params_default();
    enum ar_status st;
    int64_t n64 = 0;
    if ((st = api_params(&p, params, sizeof(p), "ar_request_params", err)) != AR_OK)
        return st;
    st = tokenizer_encode(e->m->tok, prompt, strlen(prompt), p.add_special, p.parse_special,
                          ids, &n64);
    if (st != AR_OK)
        return ar_err_set(err, st, 0, "cannot tokenize the prompt: %s", ar_status_str(st));
    if (n64 > INT32_MAX) {
        ar_free(*ids);
        return ar_err_set(err, AR_ERANGE, 0, "the prompt has too many tokens");
    }
    *n = (int32_t)n64;
    return AR_OK;
}

enum ar_status ar_engine_submit(struct ar_engine *e, const char *prompt,
                                const struct ar_request_params *params, uint64_t *id,
                                struct ar_err *err)
{
    int32_t *ids = NULL, n = 0;
    enum ar_status st;
    if (!e || !prompt)
        return ar_err_set(err, AR_EINVAL, 0, "ar_engine_submit: NULL engine or prompt");
    if ((st = prompt_ids(e, prompt, params, &ids, &n, err)) != AR_OK)
        return st;
    st = submit_ids(e, ids, n, params, id, err); /* the engine copies the prompt */
    ar_free(ids);
    return st;
}

/* ---- waiting --------------------------------------------------------------------------- */

struct wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    struct ar_result res; /* text: w.text */
    char *text;           /* owned copy of the result's text */
    ar_token_fn on_token; /* the caller's, still called */
    void *user;
};

static void wait_token(void *user, int32_t token, const char *text, size_t len)
{
    struct wait *w = user;
    w->on_token(w->user, token, text, len);
}

static void wait_done(void *user, const struct ar_result *res)
{
    struct wait *w = user;
    char *copy = ar_strndup(res->text, res->text_len);
    pthread_mutex_lock(&w->mu);
    w->res = *res;
    w->res.text = copy;
    w->text = copy;
    if (!copy && w->res.status == AR_OK)
        w->res.status = AR_ENOMEM;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

enum ar_status ar_engine_generate(struct ar_engine *e, const char *prompt,
                                  const struct ar_request_params *params, char **text,
                                  struct ar_result *res, struct ar_err *err)
{
    struct ar_request_params p = ar_request_params_default();
    struct wait w;
    enum ar_status st;
    if (text)
        *text = NULL;
    if (!e || !prompt || !text)
        return ar_err_set(err, AR_EINVAL, 0, "ar_engine_generate: NULL engine, prompt or text");
    if ((st = api_params(&p, params, sizeof(p), "ar_request_params", err)) != AR_OK)
        return st;
    memset(&w, 0, sizeof(w));
    w.on_token = p.on_token;
    w.user = p.user_data;
    p.struct_size = sizeof(p);
    p.on_token = w.on_token ? wait_token : NULL;
    p.on_done = wait_done;
    p.user_data = &w;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    if ((st = ar_engine_submit(e, prompt, &p, NULL, err)) == AR_OK) {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        st = w.res.status;
        if (st == AR_OK && w.res.finish == AR_FINISH_ERROR)
            st = AR_EIO;
        if (st != AR_OK) {
            ar_err_set(err, st, 0, "generation failed: %s", ar_status_str(st));
            ar_free(w.text);
        } else {
            *text = w.text;
            if (res)
                *res = w.res;
        }
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return st;
}
