/* gen_engine.c - the reply generator over the serving engine: the chat prompt is rendered in
 * the model's template family, template markup and the texts are tokenized separately (review
 * text without special-token parsing, so it can never open or close a turn), submitted to the
 * engine, and the caller's thread waits for on_done. */
#include <stdio.h>
#include <string.h>

#include "reply_internal.h"

/* ---- prompt tokens ------------------------------------------------------------------------- */

#define PH_SYSTEM "\x01\x02S\x02\x01"
#define PH_USER "\x01\x02U\x02\x01"
#define SPECIAL_MAX_LEN 64

struct ivec {
    int32_t *v;
    int64_t n, cap;
};

static enum ar_status ivec_add(struct ivec *a, const int32_t *ids, int64_t n)
{
    if (a->n + n > a->cap) {
        int64_t cap = a->cap ? a->cap : 256;
        int32_t *p;
        while (cap < a->n + n)
            cap *= 2;
        p = ar_realloc(a->v, (size_t)cap * sizeof(int32_t));
        if (!p)
            return AR_ENOMEM;
        a->v = p;
        a->cap = cap;
    }
    if (n)
        memcpy(a->v + a->n, ids, (size_t)n * sizeof(int32_t));
    a->n += n;
    return AR_OK;
}

/* Length of the special (control, unknown or user-defined) token whose text starts at s, or 0;
 * *id receives it. The longest one wins. */
static size_t special_at(const struct tokenizer *tok, const char *s, size_t n, int32_t *id)
{
    for (size_t l = AR_MIN(n, (size_t)SPECIAL_MAX_LEN); l >= 1; l--) {
        int32_t t = tokenizer_find(tok, s, l);
        if (t >= 0 && (tokenizer_token_attr(tok, t) & (TOKENIZER_ATTR_CONTROL |
                                                       TOKENIZER_ATTR_UNKNOWN |
                                                       TOKENIZER_ATTR_USER_DEFINED))) {
            *id = t;
            return l;
        }
    }
    return 0;
}

/* Encodes the pending plain text run (if any) without special-token parsing. */
static enum ar_status flush_run(const struct tokenizer *tok, struct ar_buf *run, bool rstrip,
                                struct ivec *out)
{
    enum ar_status st = AR_OK;
    size_t a = 0;
    int32_t *ids = NULL;
    int64_t n = 0;
    if (run->oom)
        return AR_ENOMEM;
    if (!run->s || run->n == 0)
        return AR_OK;
    if (rstrip)
        while (a < run->n && (run->s[a] == ' ' || run->s[a] == '\n' || run->s[a] == '\t' ||
                              run->s[a] == '\r'))
            a++;
    if (a < run->n) {
        st = tokenizer_encode(tok, run->s + a, run->n - a, false, false, &ids, &n);
        if (st == AR_OK)
            st = ivec_add(out, ids, n);
        ar_free(ids);
    }
    run->n = 0;
    run->s[0] = '\0';
    return st;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Appends s, without leading and trailing whitespace when trim is set: the Llama 3 and Gemma
 * formats trim every message, which the placeholders would otherwise hide. */
static void put_content(struct ar_buf *b, const char *s, bool trim)
{
    size_t n = strlen(s), a = 0;
    while (trim && a < n && is_blank(s[a]))
        a++;
    while (trim && n > a && is_blank(s[n - 1]))
        n--;
    ar_buf_put(b, s + a, n - a);
}

enum ar_status reply_prompt_tokens(const struct tokenizer *tok, const char *system,
                                   const char *user, int32_t **ids, int64_t *n)
{
    struct tokenizer_chat_msg msgs[2] = {{"system", PH_SYSTEM}, {"user", PH_USER}};
    enum tokenizer_chat fam;
    char *fmt = NULL;
    size_t fmt_len = 0, i = 0;
    struct ar_buf run = {0};
    struct ivec out = {0};
    bool rstrip = false;
    enum ar_status st;
    bool trim, has_system = system && *system;

    if (!tok || !user)
        return AR_EINVAL;
    fam = tokenizer_chat_family(tok);
    trim = fam == TOKENIZER_CHAT_LLAMA3 || fam == TOKENIZER_CHAT_GEMMA;
    if (has_system && trim) { /* a blank system message is no system message there */
        has_system = false;
        for (const char *c = system; *c && !has_system; c++)
            has_system = !is_blank(*c);
    }
    st = tokenizer_chat_format(fam, has_system ? msgs : msgs + 1, has_system ? 2 : 1, true, &fmt,
                               &fmt_len);
    if (st != AR_OK)
        return st;
    if (tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0) {
        int32_t bos = tokenizer_bos(tok);
        if ((st = ivec_add(&out, &bos, 1)) != AR_OK)
            goto done;
    }
    while (i < fmt_len) {
        int32_t id;
        size_t l;
        if (fmt[i] == '\x01' && fmt_len - i >= sizeof(PH_USER) - 1) {
            if (!memcmp(fmt + i, PH_SYSTEM, sizeof(PH_SYSTEM) - 1)) {
                put_content(&run, system, trim);
                i += sizeof(PH_SYSTEM) - 1;
                continue;
            }
            if (!memcmp(fmt + i, PH_USER, sizeof(PH_USER) - 1)) {
                put_content(&run, user, trim);
                i += sizeof(PH_USER) - 1;
                continue;
            }
        }
        l = special_at(tok, fmt + i, fmt_len - i, &id);
        if (l) {
            if ((st = flush_run(tok, &run, rstrip, &out)) != AR_OK ||
                (st = ivec_add(&out, &id, 1)) != AR_OK)
                goto done;
            rstrip = (tokenizer_token_attr(tok, id) & TOKENIZER_ATTR_RSTRIP) != 0;
            i += l;
            continue;
        }
        ar_buf_put(&run, fmt + i, 1);
        i++;
    }
    st = flush_run(tok, &run, rstrip, &out);
done:
    ar_free(fmt);
    ar_free(run.s);
    if (st != AR_OK) {
        ar_free(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return AR_OK;
}

/* ---- the generator --------------------------------------------------------------------------- */

struct engine_gen {
    struct reply_generator base; /* first */
    struct engine *e;
    const struct tokenizer *tok;
    char *name; /* owned */
};

struct wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    enum ar_status status;
    enum engine_finish finish;
    int n_gen;
    char *text; /* owned copy */
    size_t len;
};

/* A request in flight, for the call's cancel hook. */
struct inflight {
    struct engine *e;
    uint64_t id;
};

static void cancel_inflight(void *arg)
{
    struct inflight *f = arg;
    engine_cancel(f->e, f->id);
}

static void on_done(void *user, const struct engine_result *res)
{
    struct wait *w = user;
    pthread_mutex_lock(&w->mu);
    w->status = res->status;
    w->finish = res->finish;
    w->n_gen = res->n_gen;
    if (res->status == AR_OK) {
        w->text = ar_strndup(res->text ? res->text : "", res->text_len);
        w->len = res->text_len;
        if (!w->text)
            w->status = AR_ENOMEM;
    }
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static enum ar_status generate_on_engine(struct reply_generator *g,
                                         const struct reply_gen_request *r, char **text,
                                         size_t *len)
{
    struct engine_gen *eg = (struct engine_gen *)g;
    struct engine_request req;
    struct wait w;
    const char *const *stops = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    struct inflight fl = {eg->e, 0};
    struct reply_call_hook hook = {cancel_inflight, &fl, NULL, NULL};
    double retry = 0;
    enum ar_status st;

    if (reply_call_cancelled(r->call))
        return AR_ECANCELED;
    if ((st = reply_prompt_tokens(eg->tok, r->system, r->user, &ids, &n)) != AR_OK)
        return st;
    if (n + r->max_tokens > engine_n_ctx(eg->e)) {
        ar_free(ids);
        return AR_ERANGE;
    }
    /* the whole prompt is charged, like the OpenAI routes (a cached prefix included) */
    if (!reply_call_charge(r->call, n, r->admission, &retry)) {
        ar_free(ids);
        if (r->usage) {
            r->usage->limited = true;
            r->usage->retry_after_s = retry;
        }
        return AR_EBUSY;
    }
    if (r->usage)
        r->usage->n_prompt += n;
    memset(&req, 0, sizeof(req));
    req.prompt = ids;
    req.n_prompt = (int)n;
    req.max_tokens = r->max_tokens;
    req.sampling = sampler_default_params();
    req.sampling.temperature = r->temperature;
    req.sampling.seed = r->seed;
    req.n_stop = tokenizer_chat_stops(tokenizer_chat_family(eg->tok), &stops);
    req.stop = stops;
    req.priority = r->priority;
    req.timeout_s = r->timeout_s;
    req.on_done = on_done;
    req.user = &w;
    memset(&w, 0, sizeof(w));
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    st = engine_submit(eg->e, &req, &fl.id);
    ar_free(ids);
    if (st == AR_OK) {
        /* the caller may leave from now on: its cancel stops this request (and frees its KV);
         * if it left already, stop it here */
        bool watched = reply_call_watch(r->call, &hook);
        if (!watched)
            engine_cancel(eg->e, fl.id);
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        if (watched)
            reply_call_unwatch(r->call, &hook);
        reply_call_charge(r->call, w.n_gen, false, NULL);
        if (r->usage)
            r->usage->n_gen += w.n_gen;
        st = w.status;
        if (st == AR_OK && w.finish == ENGINE_FINISH_CANCELLED)
            st = reply_call_cancelled(r->call) ? AR_ECANCELED : AR_EBUSY;
        else if (st == AR_OK && w.finish == ENGINE_FINISH_TIMEOUT)
            st = AR_EBUSY;
        else if (st == AR_OK && w.finish == ENGINE_FINISH_ERROR)
            st = AR_EIO;
        if (st != AR_OK && st != AR_ECANCELED && reply_call_cancelled(r->call))
            st = AR_ECANCELED;
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    if (st != AR_OK) {
        ar_free(w.text);
        return st;
    }
    *text = w.text;
    *len = w.len;
    return AR_OK;
}

static void destroy_engine_gen(struct reply_generator *g)
{
    struct engine_gen *eg = (struct engine_gen *)g;
    ar_free(eg->name);
    ar_free(eg);
}

enum ar_status reply_engine_generator(struct engine *e, const struct tokenizer *tok,
                                      const char *model_name, struct reply_generator **out)
{
    struct engine_gen *eg;
    if (!e || !tok)
        return AR_EINVAL;
    eg = ar_calloc(1, sizeof(*eg));
    if (!eg)
        return AR_ENOMEM;
    eg->name = ar_strdup(model_name ? model_name : "autoreply");
    if (!eg->name) {
        ar_free(eg);
        return AR_ENOMEM;
    }
    eg->e = e;
    eg->tok = tok;
    eg->base.generate = generate_on_engine;
    eg->base.destroy = destroy_engine_gen;
    eg->base.model_name = eg->name;
    *out = &eg->base;
    return AR_OK;
}
