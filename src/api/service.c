/* service.c - the public API's review-reply service (include/autoreply.h): the reply module's
 * pipeline (src/reply/reply.h) wired as `autoreply reply` wires it (profiles, store, reply
 * cache, the engine generator), with the store in memory unless the caller names one; and
 * the chat prompt the pipeline uses, for callers of the engine. */
#include <stdio.h>
#include <string.h>

#include "cache/cache.h"
#include "reply/reply.h"
#include "store/store.h"
#include "api_internal.h"

#define API_DEFAULT_SHOP "default"

struct ar_reply_service {
    struct reply_profiles *profiles;
    struct store *store;
    struct cache *cache; /* NULL: none */
    struct reply_generator *gen;
    struct reply_service *svc;
    char *shop_id;
};

struct ar_reply_params ar_reply_params_default(void)
{
    struct reply_service_params d = reply_service_default_params();
    struct ar_reply_params p;
    memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.cache_mb = 64;
    p.max_tokens = d.max_tokens;
    p.temperature = d.temperature;
    p.seed = d.seed;
    p.timeout_s = d.timeout_s;
    return p;
}

enum ar_status ar_reply_service_create(struct ar_engine *e, const struct ar_reply_params *params,
                                       struct ar_reply_service **out, struct ar_err *err)
{
    struct ar_reply_params p = ar_reply_params_default();
    struct reply_service_params sp = reply_service_default_params();
    struct ar_reply_service *s;
    enum ar_status st;
    if (!out)
        return ar_err_set(err, AR_EINVAL, 0, "ar_reply_service_create: out is NULL");
    *out = NULL;
    if (!e)
        return ar_err_set(err, AR_EINVAL, 0, "ar_reply_service_create: no engine");
    if ((st = api_params(&p, params, sizeof(p), "ar_reply_params", err)) != AR_OK)
        return st;
    if (p.max_tokens < 1 || p.timeout_s < 0 || p.cache_mb > ((size_t)1 << 20))
        return ar_err_set(err, AR_EINVAL, 0,
                          "reply params out of range (max_tokens %d, timeout_s %g, cache_mb %zu)",
                          p.max_tokens, p.timeout_s, p.cache_mb);
    s = ar_calloc(1, sizeof(*s));
    if (!s)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    api_err_begin(err);
    s->shop_id = ar_strdup(p.shop_id && *p.shop_id ? p.shop_id : API_DEFAULT_SHOP);
    if (!s->shop_id) {
        st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        goto fail;
    }
    if (p.shops)
        st = reply_profiles_load(p.shops, &s->profiles, err);
    else if ((st = reply_profiles_default(&s->profiles)) != AR_OK)
        ar_err_set(err, st, 0, "out of memory");
    if (st != AR_OK)
        goto fail;
    if ((st = store_open_url(p.store && *p.store ? p.store : ":memory:", &s->store, err)) !=
        AR_OK)
        goto fail;
    if (p.cache_mb) {
        struct cache_memory_params cp = cache_memory_default_params();
        cp.max_bytes = p.cache_mb << 20;
        if ((st = cache_memory_create(&cp, &s->cache)) != AR_OK) {
            ar_err_set(err, st, 0, "cannot create the reply cache: %s", ar_status_str(st));
            goto fail;
        }
    }
    if ((st = reply_engine_generator(e->e, e->m->tok, e->m->name, &s->gen)) != AR_OK) {
        ar_err_set(err, st, 0, "out of memory");
        goto fail;
    }
    sp.profiles = s->profiles;
    sp.store = s->store;
    sp.cache = s->cache;
    sp.bulk_cache = s->cache;
    sp.gen = s->gen;
    sp.max_tokens = p.max_tokens;
    sp.temperature = p.temperature;
    sp.seed = p.seed;
    sp.timeout_s = p.timeout_s;
    if ((st = reply_service_create(&sp, &s->svc)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot start the reply service: %s", ar_status_str(st));
        goto fail;
    }
    *out = s;
    return AR_OK;
fail:
    ar_reply_service_free(s);
    return api_err_end(err, st);
}

void ar_reply_service_free(struct ar_reply_service *s)
{
    if (!s)
        return;
    reply_service_destroy(s->svc);
    reply_generator_destroy(s->gen);
    cache_destroy(s->cache);
    store_close(s->store);
    reply_profiles_destroy(s->profiles);
    ar_free(s->shop_id);
    ar_free(s);
}

const char *ar_reply_source_str(enum ar_reply_source s)
{
    switch (s) {
    case AR_REPLY_SOURCE_MODEL:
        return "model";
    case AR_REPLY_SOURCE_CACHE:
        return "cache";
    case AR_REPLY_SOURCE_STORE:
        return "store";
    case AR_REPLY_SOURCE_TEMPLATE:
        return "template";
    case AR_REPLY_SOURCE_OFF:
        return "off";
    }
    return "unknown";
}

static enum ar_reply_source source_of(enum reply_source s)
{
    switch (s) {
    case REPLY_SOURCE_MODEL:
        return AR_REPLY_SOURCE_MODEL;
    case REPLY_SOURCE_CACHE:
        return AR_REPLY_SOURCE_CACHE;
    case REPLY_SOURCE_STORE:
        return AR_REPLY_SOURCE_STORE;
    case REPLY_SOURCE_FALLBACK:
        return AR_REPLY_SOURCE_TEMPLATE;
    case REPLY_SOURCE_OFF:
        break;
    }
    return AR_REPLY_SOURCE_OFF;
}

/* The status a caller of the library sees for a review that was not answered. */
static enum ar_status status_of(enum reply_error e)
{
    switch (e) {
    case REPLY_OK:
        return AR_OK;
    case REPLY_EINVAL:
    case REPLY_EDUPLICATE:
    case REPLY_ECONFLICT:
    case REPLY_ENOTFOUND:
        return AR_EINVAL;
    case REPLY_ELIMITED:
    case REPLY_EBUSY:
        return AR_EBUSY;
    case REPLY_ECANCELLED:
        return AR_ECANCELED;
    case REPLY_EUNAVAIL:
        return AR_EUNAVAIL;
    case REPLY_EINTERNAL:
    case REPLY_ERROR_COUNT:
        break;
    }
    return AR_EIO;
}

enum ar_status ar_reply_answer(struct ar_reply_service *s, const struct ar_review *rv,
                               struct ar_reply *out, struct ar_err *err)
{
    struct reply_review r;
    struct reply_result res;
    enum ar_status st;
    if (!out)
        return ar_err_set(err, AR_EINVAL, 0, "ar_reply_answer: out is NULL");
    memset(out, 0, sizeof(*out));
    snprintf(out->code, sizeof(out->code), "%s", reply_error_code(REPLY_EINVAL));
    if (!s || !rv)
        return ar_err_set(err, AR_EINVAL, 0, "ar_reply_answer: NULL service or review");
    if (!rv->review_id || !*rv->review_id || !rv->text)
        return ar_err_set(err, AR_EINVAL, 0, "a review needs a review_id and a text");
    memset(&r, 0, sizeof(r));
    r.shop_id = rv->shop_id && *rv->shop_id ? rv->shop_id : s->shop_id;
    r.review_id = rv->review_id;
    r.text = rv->text;
    r.text_len = strlen(rv->text);
    r.rating = rv->rating;
    r.product = rv->product;
    r.lang = rv->lang;
    memset(&res, 0, sizeof(res));
    reply_service_answer(s->svc, &r, ENGINE_PRIO_INTERACTIVE, &res);
    snprintf(out->code, sizeof(out->code), "%s", reply_error_code(res.err));
    if (res.err != REPLY_OK) {
        st = ar_err_set(err, status_of(res.err), 0, "%s",
                        res.error[0] ? res.error : reply_error_str(res.err));
        reply_result_fini(&res);
        return st;
    }
    out->text = res.reply;
    res.reply = NULL;
    if (!out->text && !(out->text = ar_strdup(""))) {
        reply_result_fini(&res);
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    out->source = source_of(res.source);
    out->action = res.action == REPLY_ACTION_SEND      ? AR_REPLY_ACTION_SEND
                  : res.action == REPLY_ACTION_SUGGEST ? AR_REPLY_ACTION_SUGGEST
                                                       : AR_REPLY_ACTION_NONE;
    out->needs_human = res.needs_human;
    out->negative = res.sentiment == REPLY_SENT_NEGATIVE;
    out->sentiment = res.sentiment_score;
    snprintf(out->lang, sizeof(out->lang), "%s", res.lang);
    snprintf(out->model, sizeof(out->model), "%s", res.model);
    out->latency_ms = res.latency_ms;
    out->attempts = res.attempts;
    out->n_prompt_tokens = res.n_prompt_tokens;
    out->n_gen_tokens = res.n_gen_tokens;
    reply_result_fini(&res);
    return AR_OK;
}

void ar_reply_clear(struct ar_reply *r)
{
    if (!r)
        return;
    ar_free(r->text);
    memset(r, 0, sizeof(*r));
}

/* ---- the chat prompt ------------------------------------------------------------------- */

enum ar_status ar_chat_tokens(const struct ar_model *m, const char *system, const char *user,
                              int32_t **ids, int32_t *n, struct ar_err *err)
{
    int64_t n64 = 0;
    enum ar_status st;
    if (!m || !user || !ids || !n)
        return ar_err_set(err, AR_EINVAL, 0, "ar_chat_tokens: NULL model, user, ids or n");
    *ids = NULL;
    *n = 0;
    if ((st = reply_prompt_tokens(m->tok, system, user, ids, &n64)) != AR_OK)
        return ar_err_set(err, st, 0, "cannot make the chat prompt: %s", ar_status_str(st));
    if (n64 > INT32_MAX) {
        ar_free(*ids);
        *ids = NULL;
        return ar_err_set(err, AR_ERANGE, 0, "the chat prompt has too many tokens");
    }
    *n = (int32_t)n64;
    return AR_OK;
}
