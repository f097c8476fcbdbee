/* openai.c - the built-in endpoints: OpenAI chat and text completions (whole or as SSE
 * streams), /v1/models, /tokenize, /detokenize, /health and /metrics. A completion is
 * validated (request.c), tokenized and handed to the engine; the engine's callbacks stream
 * chunks and make the final reply, and a client that leaves cancels its request. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "server_internal.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static _Atomic uint64_t id_counter;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A fresh 64-bit value per call (ids, default seeds); not cryptographic. */
static uint64_t fresh_u64(void)
{
    uint64_t n = atomic_fetch_add(&id_counter, 1);
    return mix64(n ^ (uint64_t)(ar_time_s() * 1e9) ^ ((uint64_t)time(NULL) << 32));
}

static void reply_oai_error(struct server_req *req, const struct server_oai_error *e)
{
    cJSON *extra = NULL;
    if (e->param[0] && (extra = cJSON_CreateObject()))
        cJSON_AddStringToObject(extra, "param", e->param);
    server_reply_error_ex(req, e->status, e->type, e->code, extra, 1, "%s", e->message);
}

/* Adds a string that may hold invalid UTF-8 (token pieces): replaced bytes become U+FFFD. */
static void add_text(cJSON *o, const char *name, const char *s, size_t len)
{
    if (ar_utf8_valid(s, len) && !memchr(s, 0, len)) {
        char *z = ar_strndup(s, len);
        if (z)
            cJSON_AddStringToObject(o, name, z);
        ar_free(z);
    } else {
        char *z = ar_utf8_sanitize(s, len, NULL);
        if (z)
            cJSON_AddStringToObject(o, name, z);
        ar_free(z);
    }
}

/* ---- completions ------------------------------------------------------------------------- */

struct gen {
    struct server *srv;
    struct server_req *req;
    struct engine *eng;
    enum server_oai_kind kind;
    bool stream, include_usage;
    struct tokenizer_think think; /* chat: what of the streamed text is outside <think> */
    uint64_t id; /* engine request id */
    char cid[48];
    double created;
    int32_t *prompt; /* owned, (n_prompt) */
    int n_prompt;
};

static void gen_cleanup(void *p)
{
    struct gen *g = p;
    ar_free(g->prompt);
}

static void gen_abort(struct server_req *req, void *user)
{
    struct gen *g = user;
    (void)req;
    engine_cancel(g->eng, g->id);
}

/* The common top of every reply object. */
static cJSON *reply_head(const struct gen *g, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", g->cid);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", floor(g->created));
    cJSON_AddStringToObject(o, "model", server_model_name(g->srv));
    return o;
}

cJSON *server_oai_usage_json(const struct engine_result *res)
{
    cJSON *u = cJSON_CreateObject(), *d;
    if (!u)
        return NULL;
    cJSON_AddNumberToObject(u, "prompt_tokens", res->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", res->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", res->n_prompt + res->n_gen);
    d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (d)
        cJSON_AddNumberToObject(d, "cached_tokens", res->n_cached);
    return u;
}

/* One SSE event "data: <json>\n\n"; takes o. */
static void send_event(struct server_req *req, cJSON *o)
{
    char *js = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!js)
        return;
    size_t n = strlen(js);
    char *ev = ar_malloc(n + 8);
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, js, n);
        memcpy(ev + 6 + n, "\n\n", 2);
        server_stream_write(req, ev, n + 8);
        ar_free(ev);
    }
    cJSON_free(js);
}

/* A streamed chunk: delta text (chat: {"content"} or the role; completion: "text"). */
static cJSON *chunk(const struct gen *g, const char *text, size_t len, bool role,
                    const char *finish)
{
    bool chat = g->kind == SERVER_OAI_CHAT;
    cJSON *o = reply_head(g, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices, *c;
    if (!o)
        return NULL;
    choices = cJSON_AddArrayToObject(o, "choices");
    c = cJSON_CreateObject();
    if (!choices || !c) {
        cJSON_Delete(c);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (d && role)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (d && (text || role))
            add_text(d, "content", text ? text : "", len);
    } else {
        add_text(c, "text", text ? text : "", len);
        cJSON_AddNullToObject(c, "logprobs");
    }
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return o;
}

/* Streams text; a chat's content leaves out <think> blocks (a reasoning model's thoughts). */
static void stream_text(struct gen *g, const char *text, size_t len)
{
    char small[512], *vis = small;
    size_t k;
    if (g->kind != SERVER_OAI_CHAT) {
        if (len)
            send_event(g->req, chunk(g, text, len, false, NULL));
        return;
    }
    if (len + 8 > sizeof(small) && !(vis = ar_malloc(len + 8)))
        return;
    k = len ? tokenizer_think_push(&g->think, text, len, vis)
            : tokenizer_think_flush(&g->think, vis);
    if (k)
        send_event(g->req, chunk(g, vis, k, false, NULL));
    if (vis != small)
        ar_free(vis);
}

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    struct gen *g = user;
    (void)token;
    if (g->stream && len)
        stream_text(g, text, len);
}

static void observe_result(struct gen *g, const struct engine_result *res)
{
    struct server_http_metrics *m = server_http_metrics_of(g->srv);
    if (res->status != AR_OK)
        return;
    metrics_observe(m->queue_time, res->queue_s);
    metrics_observe(m->e2e, res->total_s);
    if (res->n_gen > 0)
        metrics_observe(m->ttft, res->first_token_s);
    if (res->n_gen > 1)
        metrics_observe(m->tpot, (res->total_s - res->first_token_s) / (res->n_gen - 1));
}

static void on_done(void *user, const struct engine_result *res)
{
    struct gen *g = user;
    struct server_req *req = g->req;
    const char *finish = res->finish == ENGINE_FINISH_STOP ? "stop" : "length";
    observe_result(g, res);
    server_req_charge_tokens(req, res->n_gen, false, NULL);
    if (res->status != AR_OK || res->finish == ENGINE_FINISH_ERROR ||
        res->finish == ENGINE_FINISH_CANCELLED) {
        bool stopping = server_stopping(g->srv) || res->finish == ENGINE_FINISH_CANCELLED;
        int status = stopping ? 503 : 500;
        if (g->stream) {
            cJSON *e = cJSON_CreateObject(), *in = cJSON_AddObjectToObject(e, "error");
            if (in) {
                cJSON_AddStringToObject(
                    in, "message", stopping ? "generation cancelled" : ar_status_str(res->status));
                cJSON_AddStringToObject(in, "type", "server_error");
            }
            send_event(req, e);
            server_stream_write(req, "data: [DONE]\n\n", 14);
            server_stream_end(req);
        } else {
            server_reply_error(req, status, "server_error",
                               stopping ? "cancelled" : "internal_error", "generation failed: %s",
                               stopping ? "cancelled" : ar_status_str(res->status));
        }
        return;
    }
    if (g->stream) {
        stream_text(g, NULL, 0); /* a held "<thi..." that was not a tag after all */
        send_event(req, chunk(g, NULL, 0, false, finish));
        if (g->include_usage) {
            cJSON *o = reply_head(g, g->kind == SERVER_OAI_CHAT ? "chat.completion.chunk"
                                                                : "text_completion");
            if (o) {
                cJSON_AddArrayToObject(o, "choices");
                cJSON_AddItemToObject(o, "usage", server_oai_usage_json(res));
            }
            send_event(req, o);
        }
        server_stream_write(req, "data: [DONE]\n\n", 14);
        server_stream_end(req);
        return;
    }
    cJSON *o = reply_head(g, g->kind == SERVER_OAI_CHAT ? "chat.completion" : "text_completion");
    cJSON *choices = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *c = cJSON_CreateObject();
    if (!choices || !c) {
        cJSON_Delete(c);
        cJSON_Delete(o);
        server_reply_error(req, 500, "server_error", "internal_error", "out of memory");
        return;
    }
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (g->kind == SERVER_OAI_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        char *content = ar_strndup(res->text ? res->text : "", res->text_len);
        if (msg && content) {
            cJSON_AddStringToObject(msg, "role", "assistant");
            add_text(msg, "content", content, tokenizer_strip_think(content, res->text_len));
        } else {
            ar_free(content);
            cJSON_Delete(o);
            server_reply_error(req, 500, "server_error", "internal_error", "out of memory");
            return;
        }
        ar_free(content);
    } else {
        add_text(c, "text", res->text ? res->text : "", res->text_len);
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", finish);
    cJSON_AddItemToObject(o, "usage", server_oai_usage_json(res));
    server_reply_json(req, 200, o);
}

static void reply_context_exceeded(struct server_req *req, int n_prompt, int n_ctx,
                                   const char *param)
{
    cJSON *extra = cJSON_CreateObject();
    if (extra) {
        cJSON_AddStringToObject(extra, "param", param);
        cJSON_AddNumberToObject(extra, "n_prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(extra, "n_ctx", n_ctx);
    }
    server_reply_error_ex(req, 400, "invalid_request_error", "context_length_exceeded", extra, 1,
                          "the prompt has %d tokens but the context holds %d tokens "
                          "(prompt plus at least one generated token)",
                          n_prompt, n_ctx);
}

/* Token ids of the request's prompt; *ids owned by the caller (ar_free). */
static enum ar_status build_prompt(const struct tokenizer *tok, const struct server_oai_request *rq,
                                   int32_t **ids, int64_t *n)
{
    enum ar_status st;
    if (rq->kind == SERVER_OAI_CHAT) {
        char *text = NULL;
        size_t len = 0;
        enum tokenizer_chat fam = tokenizer_chat_family(tok);
        st = tokenizer_chat_format(fam, rq->msgs, rq->n_msgs, true, &text, &len);
        if (st != AR_OK)
            return st;
        /* the template carries its control tokens as text */
        st = tokenizer_encode(tok, text, len, tokenizer_add_bos(tok), true, ids, n);
        ar_free(text);
        return st;
    }
    if (rq->prompt_ids) {
        if (!(*ids = ar_malloc((size_t)rq->n_prompt_ids * sizeof(int32_t))))
            return AR_ENOMEM;
        memcpy(*ids, rq->prompt_ids, (size_t)rq->n_prompt_ids * sizeof(int32_t));
        *n = rq->n_prompt_ids;
        return AR_OK;
    }
    return tokenizer_encode(tok, rq->prompt, rq->prompt_len, true, true, ids, n);
}

static void handle_completion(struct server_req *req, enum server_oai_kind kind)
{
    struct server *s = server_req_server(req);
    struct engine *eng = server_engine(s);
    const struct tokenizer *tok = server_tokenizer(s);
    struct server_oai_request rq;
    struct server_oai_error e = {0};
    struct engine_request er = {0};
    int32_t *ids = NULL;
    int64_t n = 0;
    int n_ctx = server_n_ctx(s);
    double retry = 0;
    struct gen *g;
    enum ar_status st;

    st = server_oai_request_parse(kind, server_req_body(req), n_ctx, tokenizer_n_vocab(tok), &rq,
                                  &e);
    if (st != AR_OK) {
        server_oai_request_fini(&rq);
        if (st == AR_ENOMEM)
            server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        else
            reply_oai_error(req, &e);
        return;
    }
    /* one model is served: another id is OpenAI's 404, never silently answered by this one
     * (none or "" means the served one) */
    if (rq.model && rq.model[0] && strcmp(rq.model, server_model_name(s)) != 0) {
        server_reply_error(req, 404, "invalid_request_error", "model_not_found",
                           "The model '%.128s' does not exist; this server serves '%s' (see "
                           "/v1/models)",
                           rq.model, server_model_name(s));
        server_oai_request_fini(&rq);
        return;
    }
    if ((st = build_prompt(tok, &rq, &ids, &n)) != AR_OK) {
        server_oai_request_fini(&rq);
        server_reply_error(req, st == AR_ENOMEM ? 503 : 400,
                           st == AR_ENOMEM ? "server_error" : "invalid_request_error",
                           st == AR_ENOMEM ? "out_of_memory" : "invalid_value",
                           "cannot tokenize the prompt: %s", ar_status_str(st));
        return;
    }
    if (n == 0) {
        ar_free(ids);
        server_oai_request_fini(&rq);
        server_reply_error(req, 400, "invalid_request_error", "invalid_value",
                           "the prompt is empty");
        return;
    }
    /* the prompt plus one generated token must fit; with truncate keep the tail */
    {
        int reserve = rq.max_tokens ? rq.max_tokens : AR_MIN(256, n_ctx / 2);
        if (rq.truncate && n + reserve > n_ctx) {
            int64_t keep = AR_MAX(1, n_ctx - reserve);
            if (keep < n) {
                memmove(ids, ids + (n - keep), (size_t)keep * sizeof(int32_t));
                n = keep;
            }
        }
        if (n + 1 > n_ctx) {
            ar_free(ids);
            server_oai_request_fini(&rq);
            reply_context_exceeded(req, (int)AR_MIN(n, INT32_MAX), n_ctx,
                                   kind == SERVER_OAI_CHAT ? "messages" : "prompt");
            return;
        }
    }
    if (!server_req_charge_tokens(req, n, true, &retry)) {
        ar_free(ids);
        server_oai_request_fini(&rq);
        server_reply_error_ex(req, 429, "rate_limit_error", "rate_limit_exceeded", NULL, retry,
                              "token rate limit reached; retry after %.0f s", ceil(retry));
        return;
    }
    if (!(g = server_req_alloc(req, sizeof(*g), gen_cleanup))) {
        ar_free(ids);
        server_oai_request_fini(&rq);
        server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        return;
    }
    g->srv = s;
    g->req = req;
    g->eng = eng;
    g->kind = kind;
    g->stream = rq.stream;
    g->include_usage = rq.include_usage;
    tokenizer_think_init(&g->think);
    g->prompt = ids;
    g->n_prompt = (int)n;
    g->created = (double)time(NULL);
    snprintf(g->cid, sizeof(g->cid), "%s-%016llx", kind == SERVER_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)fresh_u64());

    er.prompt = ids;
    er.n_prompt = (int)n;
    er.max_tokens = rq.max_tokens ? AR_MIN(rq.max_tokens, n_ctx - (int)n) : n_ctx - (int)n;
    er.sampling = rq.sampling;
    if (!rq.seed_set)
        er.sampling.seed = fresh_u64();
    er.ignore_eos = rq.ignore_eos;
    er.stop = rq.stop;
    er.n_stop = rq.n_stop;
    er.priority = rq.priority;
    er.on_token = on_token;
    er.on_done = on_done;
    er.user = g;
    if (g->stream) {
        /* an error reply below replaces the stream, which has not started yet */
        server_stream_begin(req, "text/event-stream");
        if (kind == SERVER_OAI_CHAT)
            send_event(req, chunk(g, NULL, 0, true, NULL));
    }
    st = engine_submit(eng, &er, &g->id);
    server_oai_request_fini(&rq);
    if (st == AR_OK) {
        server_req_on_abort(req, gen_abort, g);
        return;
    }
    if (st == AR_EBUSY) {
        server_reply_error(req, 503, "server_error", "queue_full",
                           "the request queue is full; retry later");
    } else if (st == AR_ERANGE) {
        reply_context_exceeded(req, (int)n, n_ctx, kind == SERVER_OAI_CHAT ? "messages" : "prompt");
    } else if (st == AR_EINVAL) {
        server_reply_error(req, 400, "invalid_request_error", "invalid_value",
                           "the engine refused the request parameters");
    } else {
        server_reply_error(req, st == AR_ENOMEM ? 503 : 500, "server_error", "internal_error",
                           "cannot queue the request: %s", ar_status_str(st));
    }
}

static void h_chat(struct server_req *req, void *user)
{
    (void)user;
    handle_completion(req, SERVER_OAI_CHAT);
}

static void h_completions(struct server_req *req, void *user)
{
    (void)user;
    handle_completion(req, SERVER_OAI_COMPLETION);
}

/* ---- models, apply-template, tokenize, detokenize ---------------------------------------- */

/* POST /apply-template {"messages": [...]}: the prompt text a chat request with these
 * messages runs on, rendered in the model's own chat format -> {"prompt": text}. */
static void h_apply_template(struct server_req *req, void *user)
{
    struct server *s = server_req_server(req);
    const struct tokenizer *tok = server_tokenizer(s);
    struct server_oai_request rq;
    struct server_oai_error e = {0};
    char *text = NULL;
    size_t len = 0;
    cJSON *o;
    enum ar_status st;
    (void)user;
    st = server_oai_request_parse(SERVER_OAI_CHAT, server_req_body(req), server_n_ctx(s),
                                  tokenizer_n_vocab(tok), &rq, &e);
    if (st == AR_OK)
        st = tokenizer_chat_format(tokenizer_chat_family(tok), rq.msgs, rq.n_msgs, true, &text,
                                   &len);
    else if (st != AR_ENOMEM) {
        server_oai_request_fini(&rq);
        reply_oai_error(req, &e);
        return;
    }
    server_oai_request_fini(&rq);
    if (st != AR_OK || !(o = cJSON_CreateObject())) {
        ar_free(text);
        server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        return;
    }
    cJSON_AddStringToObject(o, "prompt", text);
    cJSON_AddStringToObject(o, "template", tokenizer_chat_name(tokenizer_chat_family(tok)));
    ar_free(text);
    server_reply_json(req, 200, o);
}

static void h_models(struct server_req *req, void *user)
{
    struct server *s = server_req_server(req);
    const struct model *m = server_model(s);
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data"), *x, *meta;
    (void)user;
    cJSON_AddStringToObject(o, "object", "list");
    x = cJSON_CreateObject();
    if (data && x) {
        cJSON_AddItemToArray(data, x);
        cJSON_AddStringToObject(x, "id", server_model_name(s));
        cJSON_AddStringToObject(x, "object", "model");
        cJSON_AddNumberToObject(x, "created", 0);
        cJSON_AddStringToObject(x, "owned_by", "autoreply");
        meta = cJSON_AddObjectToObject(x, "meta");
        if (meta && m) {
            const struct model_hparams *hp = model_hparams(m);
            cJSON_AddStringToObject(meta, "arch", model_arch_name(hp->arch));
            cJSON_AddNumberToObject(meta, "n_vocab", hp->n_vocab);
            cJSON_AddNumberToObject(meta, "n_ctx_train", hp->n_ctx_train);
            cJSON_AddNumberToObject(meta, "n_ctx", server_n_ctx(s));
        }
    } else {
        cJSON_Delete(x);
    }
    server_reply_json(req, 200, o);
}

static bool opt_bool(const cJSON *body, const char *name, bool def, struct server_req *req,
                     bool *ok)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!j || cJSON_IsNull(j))
        return def;
    if (!cJSON_IsBool(j)) {
        struct server_oai_error e;
        server_oai_error_set(&e, 400, "invalid_request_error", "invalid_type", name,
                             "'%s' must be a boolean", name);
        reply_oai_error(req, &e);
        *ok = false;
        return def;
    }
    return cJSON_IsTrue(j);
}

static void h_tokenize(struct server_req *req, void *user)
{
    const struct tokenizer *tok = server_tokenizer(server_req_server(req));
    const cJSON *body = server_req_body(req);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(body, "content");
    bool ok = true, add_special, parse_special, pieces;
    int32_t *ids = NULL;
    int64_t n = 0;
    cJSON *o, *arr;
    (void)user;
    if (!c || cJSON_IsNull(c))
        c = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (!cJSON_IsString(c)) {
        server_reply_error(req, 400, "invalid_request_error",
                           c ? "invalid_type" : "missing_required_parameter",
                           "'content' must be a string");
        return;
    }
    add_special = opt_bool(body, "add_special", false, req, &ok);
    parse_special = ok ? opt_bool(body, "parse_special", true, req, &ok) : false;
    pieces = ok ? opt_bool(body, "with_pieces", false, req, &ok) : false;
    if (!ok)
        return;
    if (tokenizer_encode(tok, c->valuestring, strlen(c->valuestring), add_special, parse_special,
                         &ids, &n) != AR_OK) {
        server_reply_error(req, 503, "server_error", "out_of_memory", "cannot tokenize");
        return;
    }
    o = cJSON_CreateObject();
    arr = cJSON_AddArrayToObject(o, "tokens");
    for (int64_t i = 0; arr && i < n; i++) {
        if (!pieces) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            continue;
        }
        size_t len = 0;
        const char *p = tokenizer_token_piece(tok, ids[i], &len);
        cJSON *t = cJSON_CreateObject();
        if (!t)
            break;
        cJSON_AddItemToArray(arr, t);
        cJSON_AddNumberToObject(t, "id", ids[i]);
        if (p && ar_utf8_valid(p, len) && !memchr(p, 0, len)) {
            add_text(t, "piece", p, len);
        } else { /* a partial character: its bytes */
            cJSON *b = cJSON_AddArrayToObject(t, "piece");
            for (size_t k = 0; b && p && k < len; k++)
                cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)p[k]));
        }
    }
    ar_free(ids);
    server_reply_json(req, 200, o);
}

static void h_detokenize(struct server_req *req, void *user)
{
    const struct tokenizer *tok = server_tokenizer(server_req_server(req));
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(server_req_body(req), "tokens");
    int n, i = 0;
    int32_t *ids;
    char *text = NULL;
    size_t len = 0;
    cJSON *o;
    (void)user;
    if (!cJSON_IsArray(t)) {
        server_reply_error(req, 400, "invalid_request_error",
                           t ? "invalid_type" : "missing_required_parameter",
                           "'tokens' must be an array of token ids");
        return;
    }
    n = cJSON_GetArraySize(t);
    if (!(ids = ar_malloc((size_t)(n ? n : 1) * sizeof(int32_t)))) {
        server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        return;
    }
    for (const cJSON *x = t->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= (double)tokenizer_n_vocab(tok)) {
            ar_free(ids);
            server_reply_error(req, 400, "invalid_request_error", "invalid_value",
                               "'tokens[%d]' is not a token id of this vocabulary", i);
            return;
        }
        ids[i] = (int32_t)x->valuedouble;
    }
    if (tokenizer_decode(tok, ids, n, false, &text, &len) != AR_OK) {
        ar_free(ids);
        server_reply_error(req, 400, "invalid_request_error", "invalid_value", "cannot detokenize");
        return;
    }
    o = cJSON_CreateObject();
    add_text(o, "content", text, len);
    ar_free(text);
    ar_free(ids);
    server_reply_json(req, 200, o);
}

/* ---- health and metrics ------------------------------------------------------------------ */

/* 503 "loading" until the engine is set; then 200, "ok" or "degraded" when a backend is not
 * (the instance still serves what it can, so a proxy keeps it in rotation). */
static void h_health(struct server_req *req, void *user)
{
    struct server *s = server_req_server(req);
    cJSON *o = cJSON_CreateObject(), *backends = cJSON_CreateObject();
    bool ready = server_engine(s) != NULL;
    int n = 0, worst = server_health_run(s, backends, &n);
    (void)user;
    cJSON_AddStringToObject(o, "status",
                            !ready                      ? "loading"
                            : worst == SERVER_HEALTH_OK ? "ok"
                                                        : "degraded");
    cJSON_AddStringToObject(o, "instance", server_instance_name(s));
    if (n > 0 && o && backends) {
        cJSON_AddItemToObject(o, "backends", backends);
        backends = NULL;
    }
    cJSON_Delete(backends);
    if (!ready)
        server_reply_header(req, "Retry-After", "1");
    server_reply_json(req, ready ? 200 : 503, o);
}

/* Adds the part of an engine counter not yet added (counters only move forward). */
static void sync_counter(struct metrics_child *c, _Atomic uint64_t *seen, uint64_t now)
{
    uint64_t prev = atomic_load(seen);
    while (now > prev && !atomic_compare_exchange_weak(seen, &prev, now))
        ;
    if (now > prev)
        metrics_inc(c, (double)(now - prev));
}

static void h_metrics(struct server_req *req, void *user)
{
    struct server *s = server_req_server(req);
    struct server_http_metrics *m = server_http_metrics_of(s);
    struct engine *eng = server_engine(s);
    struct engine_stats st = {0};
    char *text = NULL, *all;
    size_t len = 0, extra_cap = 2048, used;
    (void)user;
    if (eng) {
        engine_get_stats(eng, &st);
        metrics_set(metrics_child(m->queue_length, (const char *const[]){"interactive"}),
                    st.queued[ENGINE_PRIO_INTERACTIVE]);
        metrics_set(metrics_child(m->queue_length, (const char *const[]){"bulk"}),
                    st.queued[ENGINE_PRIO_BULK]);
        metrics_set(m->running, st.running);
        metrics_set(m->kv_used, (double)st.kv_blocks_used);
        metrics_set(m->kv_total, (double)st.kv_blocks_total);
        metrics_set(m->kv_local_used, (double)st.kv_local_blocks_used);
        metrics_set(m->kv_local_total, (double)st.kv_local_blocks_total);
        sync_counter(m->prefix_queries, &m->seen[0], st.prefix_queries);
        sync_counter(m->prefix_hit_tokens, &m->seen[1], st.prefix_hit_tokens);
        sync_counter(m->preemptions, &m->seen[2], st.preemptions);
        sync_counter(m->prompt_tokens, &m->seen[3], st.prompt_tokens);
        sync_counter(m->generation_tokens, &m->seen[4], st.generated_tokens);
    }
    if (metrics_render(server_metrics(s), &text, &len) != AR_OK) {
        server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        return;
    }
    if (!(all = ar_malloc(len + extra_cap))) {
        ar_free(text);
        server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
        return;
    }
    memcpy(all, text, len);
    used = len;
    ar_free(text);
    if (eng) {
        /* rows per engine step, from the engine's own bucket counts (cumulative here) */
        uint64_t cum = 0;
        used += (size_t)snprintf(all + used, len + extra_cap - used,
                                 "# HELP autoreply_batch_size Rows per engine step.\n"
                                 "# TYPE autoreply_batch_size histogram\n");
        for (int i = 0; i < 11; i++) {
            cum += st.batch_hist[i];
            if (i < 10)
                used += (size_t)snprintf(all + used, len + extra_cap - used,
                                         "autoreply_batch_size_bucket{le=\"%d\"} %llu\n", 1 << i,
                                         (unsigned long long)cum);
        }
        used += (size_t)snprintf(all + used, len + extra_cap - used,
                                 "autoreply_batch_size_bucket{le=\"+Inf\"} %llu\n"
                                 "autoreply_batch_size_sum %llu\n"
                                 "autoreply_batch_size_count %llu\n",
                                 (unsigned long long)cum, (unsigned long long)st.batch_rows_sum,
                                 (unsigned long long)cum);
        /* engine overhead = step time outside the model's forward pass */
        used += (size_t)snprintf(all + used, len + extra_cap - used,
                                 "# HELP autoreply_engine_step_seconds_total Time the scheduler "
                                 "spent in steps.\n"
                                 "# TYPE autoreply_engine_step_seconds_total counter\n"
                                 "autoreply_engine_step_seconds_total %.6f\n"
                                 "# HELP autoreply_engine_forward_seconds_total Time inside the "
                                 "model's forward pass.\n"
                                 "# TYPE autoreply_engine_forward_seconds_total counter\n"
                                 "autoreply_engine_forward_seconds_total %.6f\n"
                                 "# HELP autoreply_engine_steps_total Scheduler steps.\n"
                                 "# TYPE autoreply_engine_steps_total counter\n"
                                 "autoreply_engine_steps_total %llu\n",
                                 st.busy_s, st.forward_s, (unsigned long long)st.steps);
    }
    server_reply_text(req, 200, "text/plain; version=0.0.4; charset=utf-8", all, used);
    ar_free(all);
}

/* ---- registration -------------------------------------------------------------------------- */

enum ar_status server_openai_register(struct server *s)
{
    static const struct server_route routes[] = {
        {"POST", "/v1/chat/completions", h_chat, NULL, SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY, 0},
        {"POST", "/v1/completions", h_completions, NULL, SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY,
         0},
        {"GET", "/v1/models", h_models, NULL, 0, 0},
        {"POST", "/apply-template", h_apply_template, NULL, SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY,
         0},
        {"POST", "/tokenize", h_tokenize, NULL, SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY, 0},
        {"POST", "/detokenize", h_detokenize, NULL, SERVER_ROUTE_ENGINE | SERVER_ROUTE_BODY, 0},
        {"GET", "/health", h_health, NULL, SERVER_ROUTE_PUBLIC, 0},
        {"GET", "/metrics", h_metrics, NULL, SERVER_ROUTE_METRICS, 0},
    };
    for (size_t i = 0; i < AR_ARRAY_LEN(routes); i++) {
        enum ar_status st = server_add_route(s, &routes[i]);
        if (st != AR_OK)
            return st;
    }
    return AR_OK;
}
