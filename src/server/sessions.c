/* sessions.c - incremental input: conversations kept by the server as JSON documents that the
 * client changes with JSON Patch (jsonpatch.c) instead of sending the whole history again, and
 * turns generated from them through the model's chat template. The prompt of a turn starts
 * with the token ids of the previous turn's prompt and reply when its text does, and the
 * engine keeps the KV of generated blocks in its prefix cache for these requests, so a turn
 * prefills only what is new (usage.prompt_tokens_details.cached_tokens shows it).
 *
 * Sessions live in this process's memory only (lost on restart, not shared between
 * instances), under one mutex, bounded in count (per key and in all) and in document size,
 * and expire when unused for ttl_s. A session belongs to the API key that created it; another
 * key (or, without keys, nobody else) cannot see it: 404. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "server_internal.h"

#define SESSION_ID_PREFIX "sess_"
#define SESSIONS_PATH "/v1/sessions"
#define PATCH_TYPE "application/json-patch+json"

struct session {
    struct session *next;
    char id[40];    /* "sess_" + 32 hex digits */
    char owner[80]; /* server_req_client with keys, else "" */
    cJSON *doc;     /* owned */
    size_t doc_size;
    double created_wall; /* time(NULL) */
    double used;         /* ar_time_s() of the last access: expiry counts from here */
    bool busy;           /* a turn is being generated */
    uint64_t version;    /* counts changes of doc */
    int turns;
    /* the last turn's prompt text followed by its reply, and their token ids; the engine's
     * prefix cache holds their KV while nothing evicts it */
    char *ctx_text; /* owned, NUL-terminated */
    size_t ctx_len;
    int32_t *ctx_ids; /* owned, (n_ctx_ids) */
    int n_ctx_ids;
};

struct server_sessions {
    struct server_sessions_params p;
    pthread_mutex_t mu;
    struct session *list; /* under mu */
    int n;                /* under mu */
};

struct server_sessions_params server_sessions_default_params(void)
{
    struct server_sessions_params p = {0};
    p.ttl_s = 3600;
    p.max_per_key = 64;
    p.max_sessions = 1024;
    p.max_doc_size = 256 * 1024;
    return p;
}

static void session_free(struct session *x)
{
    if (!x)
        return;
    cJSON_Delete(x->doc);
    ar_free(x->ctx_text);
    ar_free(x->ctx_ids);
    ar_free(x);
}

void server_sessions_destroy(struct server_sessions *ss)
{
    if (!ss)
        return;
    while (ss->list) {
        struct session *x = ss->list;
        ss->list = x->next;
        session_free(x);
    }
    pthread_mutex_destroy(&ss->mu);
    ar_free(ss);
}

/* ---- the store (mu held) --------------------------------------------------------------------- */

/* Drops sessions unused for ttl_s (a busy one stays until its turn ends). */
static void purge_locked(struct server_sessions *ss, double now)
{
    struct session **pp = &ss->list;
    while (*pp) {
        struct session *x = *pp;
        if (!x->busy && now - x->used > ss->p.ttl_s) {
            *pp = x->next;
            ss->n--;
            session_free(x);
        } else {
            pp = &x->next;
        }
    }
}

static struct session *find_locked(struct server_sessions *ss, const char *id, const char *owner)
{
    for (struct session *x = ss->list; x; x = x->next)
        if (!strcmp(x->id, id) && !strcmp(x->owner, owner))
            return x;
    return NULL;
}

static void unlink_locked(struct server_sessions *ss, struct session *s)
{
    for (struct session **pp = &ss->list; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            ss->n--;
            return;
        }
    }
}

/* ---- helpers --------------------------------------------------------------------------------- */

/* Sessions of one key are one owner; without API keys there is no identity to tell callers
 * apart (a client address changes behind proxies and NAT), so all share one. */
static const char *owner_of(struct server_req *req)
{
    const char *c = server_req_client(req);
    return strncmp(c, "key:", 4) == 0 ? c : "";
}

static void new_id(char *out, size_t size)
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < sizeof(b)) { /* no kernel randomness: still unique, less unguessable */
        static _Atomic uint64_t ctr;
        uint64_t x = (uint64_t)(ar_time_s() * 1e9) ^ (atomic_fetch_add(&ctr, 1) << 40);
        for (size_t i = 0; i < sizeof(b);
             i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
            b[i] = (unsigned char)(x >> 56);
    }
    snprintf(out, size, SESSION_ID_PREFIX);
    for (size_t i = 0; i < sizeof(b); i++)
        snprintf(out + strlen(SESSION_ID_PREFIX) + 2 * i, size - strlen(SESSION_ID_PREFIX) - 2 * i,
                 "%02x", b[i]);
}

static void reply_oai_error(struct server_req *req, const struct server_oai_error *e)
{
    cJSON *extra = NULL;
    if (e->param[0] && (extra = cJSON_CreateObject()))
        cJSON_AddStringToObject(extra, "param", e->param);
    server_reply_error_ex(req, e->status, e->type, e->code, extra, 1, "%s", e->message);
}

static void reply_nomem(struct server_req *req)
{
    server_reply_error(req, 503, "server_error", "out_of_memory", "out of memory");
}

static void reply_not_found(struct server_req *req, const char *id)
{
    server_reply_error(req, 404, "not_found_error", "session_not_found",
                       "no session '%.64s' (it may have expired, or belong to another key)", id);
}

/* Why session id could not be had: unknown (or another key's), a turn running, or memory. */
static void reply_unavailable(struct server_req *req, const char *id, bool found, bool busy)
{
    if (!found)
        reply_not_found(req, id);
    else if (busy)
        server_reply_error(req, 409, "invalid_request_error", "session_busy",
                           "a turn of this session is being generated");
    else
        reply_nomem(req);
}

/* The chat request a document stands for: its members, with "system" (a string) as the
 * first message. For validation (placeholder) an empty message list gets one empty user
 * message. NULL when out of memory. */
static cJSON *chat_body(const cJSON *doc, bool placeholder)
{
    cJSON *b = cJSON_Duplicate(doc, true), *msgs, *sys, *m;
    if (!b)
        return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(b, "stream");
    msgs = cJSON_GetObjectItemCaseSensitive(b, "messages");
    sys = cJSON_GetObjectItemCaseSensitive(b, "system");
    if (cJSON_IsArray(msgs) && cJSON_IsString(sys)) {
        if (!(m = cJSON_CreateObject()) || !cJSON_AddStringToObject(m, "role", "system") ||
            !cJSON_AddStringToObject(m, "content", sys->valuestring) ||
            !server_jsonpatch_array_insert(msgs, 0, m)) {
            cJSON_Delete(m);
            cJSON_Delete(b);
            return NULL;
        }
    }
    if (placeholder && cJSON_IsArray(msgs) && cJSON_GetArraySize(msgs) == 0) {
        if (!(m = cJSON_CreateObject()) || !cJSON_AddStringToObject(m, "role", "user") ||
            !cJSON_AddStringToObject(m, "content", "")) {
            cJSON_Delete(m);
            cJSON_Delete(b);
            return NULL;
        }
        cJSON_AddItemToArray(msgs, m);
    }
    return b;
}

static int n_ctx_of(struct server *s)
{
    return server_engine(s) ? server_n_ctx(s) : INT32_MAX / 2;
}

static int32_t n_vocab_of(struct server *s)
{
    return server_engine(s) ? tokenizer_n_vocab(server_tokenizer(s)) : INT32_MAX;
}

/* A document a session may hold: an object whose "messages" is an array of chat messages (it
 * may be empty), "system" a string if given, and sampling options as chat completions take
 * them; at most max_doc_size bytes of JSON (*size set). False with e filled. */
static bool doc_check(struct server_sessions *ss, struct server *s, const cJSON *doc, size_t *size,
                      struct server_oai_error *e)
{
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(doc, "system");
    struct server_oai_request rq;
    cJSON *b;
    char *js;
    enum ar_status st;
    if (!cJSON_IsObject(doc)) {
        server_oai_error_set(e, 400, "invalid_request_error", "invalid_type", "",
                             "a session document must be an object");
        return false;
    }
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "messages"))) {
        server_oai_error_set(e, 400, "invalid_request_error", "invalid_type", "messages",
                             "'messages' must be an array");
        return false;
    }
    if (sys && !cJSON_IsString(sys) && !cJSON_IsNull(sys)) {
        server_oai_error_set(e, 400, "invalid_request_error", "invalid_type", "system",
                             "'system' must be a string");
        return false;
    }
    if (!(js = cJSON_PrintUnformatted(doc))) {
        server_oai_error_set(e, 503, "server_error", "out_of_memory", "", "out of memory");
        return false;
    }
    *size = strlen(js);
    cJSON_free(js);
    if (*size > ss->p.max_doc_size) {
        server_oai_error_set(e, 413, "invalid_request_error", "session_too_large", "",
                             "the session document would be %zu bytes; the limit is %zu", *size,
                             ss->p.max_doc_size);
        return false;
    }
    if (!(b = chat_body(doc, true))) {
        server_oai_error_set(e, 503, "server_error", "out_of_memory", "", "out of memory");
        return false;
    }
    st = server_oai_request_parse(SERVER_OAI_CHAT, b, n_ctx_of(s), n_vocab_of(s), &rq, e);
    server_oai_request_fini(&rq);
    cJSON_Delete(b);
    if (st == AR_ENOMEM)
        server_oai_error_set(e, 503, "server_error", "out_of_memory", "", "out of memory");
    return st == AR_OK;
}

/* The answer for a session: {id, object, created, expires_at, turns, document} (document
 * copied). NULL when out of memory. mu held. */
static cJSON *session_json(const struct server_sessions *ss, const struct session *x, double now)
{
    cJSON *o = cJSON_CreateObject(), *d = cJSON_Duplicate(x->doc, true);
    if (!o || !d) {
        cJSON_Delete(o);
        cJSON_Delete(d);
        return NULL;
    }
    cJSON_AddStringToObject(o, "id", x->id);
    cJSON_AddStringToObject(o, "object", "session");
    cJSON_AddNumberToObject(o, "created", x->created_wall);
    cJSON_AddNumberToObject(o, "expires_at",
                            floor((double)time(NULL) + ss->p.ttl_s - (now - x->used)));
    cJSON_AddNumberToObject(o, "turns", x->turns);
    cJSON_AddItemToObject(o, "document", d);
    return o;
}

/* "/v1/sessions/<id>[/<verb>]" -> id and verb ("" when none); false for anything else. */
static bool split_path(const char *path, char *id, size_t id_size, const char **verb)
{
    const char *p = path + strlen(SESSIONS_PATH "/"), *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 0 || n >= id_size)
        return false;
    memcpy(id, p, n);
    id[n] = '\0';
    *verb = slash ? slash + 1 : "";
    return true;
}

/* ---- create, read, delete -------------------------------------------------------------------- */

/* Seconds until the oldest of owner's sessions (all sessions when owner is NULL) expires. */
static double first_expiry_locked(const struct server_sessions *ss, const char *owner, double now)
{
    double best = ss->p.ttl_s;
    for (const struct session *x = ss->list; x; x = x->next)
        if (!owner || !strcmp(x->owner, owner))
            best = AR_MIN(best, ss->p.ttl_s - (now - x->used));
    return AR_MAX(1, best);
}

static void h_create(struct server_req *req, void *user)
{
    struct server_sessions *ss = user;
    struct server *s = server_req_server(req);
    const cJSON *body = server_req_body(req);
    const char *owner = owner_of(req);
    struct server_oai_error e = {0};
    struct session *x;
    double now = ar_time_s();
    int mine = 0;
    cJSON *o;
    if (!(x = ar_calloc(1, sizeof(*x)))) {
        reply_nomem(req);
        return;
    }
    if (!(x->doc = cJSON_Duplicate(body, true)) ||
        (!cJSON_GetObjectItemCaseSensitive(x->doc, "messages") &&
         !cJSON_AddArrayToObject(x->doc, "messages"))) {
        session_free(x);
        reply_nomem(req);
        return;
    }
    if (!doc_check(ss, s, x->doc, &x->doc_size, &e)) {
        session_free(x);
        reply_oai_error(req, &e);
        return;
    }
    new_id(x->id, sizeof(x->id));
    snprintf(x->owner, sizeof(x->owner), "%s", owner);
    x->created_wall = (double)time(NULL);
    x->used = now;

    pthread_mutex_lock(&ss->mu);
    purge_locked(ss, now);
    for (struct session *y = ss->list; y; y = y->next)
        mine += !strcmp(y->owner, owner);
    if (mine >= ss->p.max_per_key || ss->n >= ss->p.max_sessions) {
        bool per_key = mine >= ss->p.max_per_key;
        double retry = first_expiry_locked(ss, per_key ? owner : NULL, now);
        pthread_mutex_unlock(&ss->mu);
        session_free(x);
        server_reply_error_ex(req, 429, "rate_limit_error",
                              per_key ? "too_many_sessions" : "sessions_full", NULL, retry,
                              per_key ? "this key holds %d sessions already (the limit); delete "
                                        "one or let one expire"
                                      : "the server holds %d sessions (its limit); retry later",
                              per_key ? ss->p.max_per_key : ss->p.max_sessions);
        return;
    }
    x->next = ss->list;
    ss->list = x;
    ss->n++;
    o = session_json(ss, x, now);
    pthread_mutex_unlock(&ss->mu);
    if (!o) {
        reply_nomem(req);
        return;
    }
    server_reply_json(req, 201, o);
}

static void do_get(struct server_sessions *ss, struct server_req *req, const char *id)
{
    double now = ar_time_s();
    struct session *x;
    cJSON *o = NULL;
    pthread_mutex_lock(&ss->mu);
    purge_locked(ss, now);
    if ((x = find_locked(ss, id, owner_of(req)))) {
        x->used = now;
        o = session_json(ss, x, now);
    }
    pthread_mutex_unlock(&ss->mu);
    if (!x)
        reply_not_found(req, id);
    else if (!o)
        reply_nomem(req);
    else
        server_reply_json(req, 200, o);
}

static void h_get(struct server_req *req, void *user)
{
    char id[40];
    const char *verb;
    if (!split_path(server_req_path(req), id, sizeof(id), &verb) || *verb) {
        server_reply_error(req, 404, "not_found_error", "not_found", "no route for GET %s",
                           server_req_path(req));
        return;
    }
    do_get(user, req, id);
}

static void h_delete(struct server_req *req, void *user)
{
    struct server_sessions *ss = user;
    char id[40];
    const char *verb;
    struct session *x;
    cJSON *o;
    if (!split_path(server_req_path(req), id, sizeof(id), &verb) || *verb) {
        server_reply_error(req, 404, "not_found_error", "not_found", "no route for DELETE %s",
                           server_req_path(req));
        return;
    }
    pthread_mutex_lock(&ss->mu);
    purge_locked(ss, ar_time_s());
    if ((x = find_locked(ss, id, owner_of(req))))
        unlink_locked(ss, x);
    pthread_mutex_unlock(&ss->mu);
    if (!x) {
        reply_not_found(req, id);
        return;
    }
    /* a turn in flight finds the session gone and answers 404 */
    session_free(x);
    if (!(o = cJSON_CreateObject())) {
        reply_nomem(req);
        return;
    }
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "session.deleted");
    cJSON_AddBoolToObject(o, "deleted", true);
    server_reply_json(req, 200, o);
}

/* ---- generating a turn ----------------------------------------------------------------------- */

struct turn {
    struct server_sessions *ss;
    struct server *srv;
    struct server_req *req;
    struct engine *eng;
    uint64_t eng_id;
    char id[40], owner[80];
    char *text; /* owned: the prompt text, (text_len) */
    size_t text_len;
    int32_t *ids; /* owned: the prompt, (n_ids) */
    int n_ids;
};

static void turn_cleanup(void *p)
{
    struct turn *t = p;
    ar_free(t->text);
    ar_free(t->ids);
}

static void turn_abort(struct server_req *req, void *user)
{
    struct turn *t = user;
    (void)req;
    engine_cancel(t->eng, t->eng_id);
}

/* Clears the busy mark of the turn's session (if it still exists). */
static void turn_release(struct turn *t)
{
    struct session *x;
    pthread_mutex_lock(&t->ss->mu);
    if ((x = find_locked(t->ss, t->id, t->owner)))
        x->busy = false;
    pthread_mutex_unlock(&t->ss->mu);
}

/* Whether res->tokens spell exactly the reply's text, control tokens included (not so when a
 * stop string cut the text, or when ignore_eos let an end-of-turn token through, which the
 * text leaves out): only then can the next turn's prompt start with these ids. */
static bool reply_ids_match(const struct tokenizer *tok, const struct engine_result *res)
{
    char *dec = NULL;
    size_t len = 0;
    bool same;
    if (tokenizer_decode(tok, res->tokens, res->n_gen, false, &dec, &len) != AR_OK)
        return false;
    same = len == res->text_len && !memcmp(dec, res->text, len);
    ar_free(dec);
    return same;
}

/* Remembers what this turn ran on for the next one: prompt text + reply, prompt ids + reply
 * ids (or only the prompt's when the reply's ids do not spell its text). mu held. */
static void remember_context_locked(struct session *x, struct turn *t,
                                    const struct engine_result *res, bool with_reply)
{
    size_t len = t->text_len + (with_reply ? res->text_len : 0);
    int n = t->n_ids + (with_reply ? res->n_gen : 0);
    char *text = ar_malloc(len + 1);
    int32_t *ids = ar_malloc((size_t)AR_MAX(n, 1) * sizeof(int32_t));
    ar_free(x->ctx_text);
    ar_free(x->ctx_ids);
    x->ctx_text = NULL;
    x->ctx_ids = NULL;
    x->ctx_len = 0;
    x->n_ctx_ids = 0;
    if (!text || !ids) {
        ar_free(text);
        ar_free(ids);
        return;
    }
    memcpy(text, t->text, t->text_len);
    memcpy(ids, t->ids, (size_t)t->n_ids * sizeof(int32_t));
    if (with_reply) {
        memcpy(text + t->text_len, res->text, res->text_len);
        memcpy(ids + t->n_ids, res->tokens, (size_t)res->n_gen * sizeof(int32_t));
    }
    text[len] = '\0';
    x->ctx_text = text;
    x->ctx_len = len;
    x->ctx_ids = ids;
    x->n_ctx_ids = n;
}

/* Appends the reply to the session and answers; runs on the engine's thread. */
static void turn_done(void *user, const struct engine_result *res)
{
    struct turn *t = user;
    struct server_sessions *ss = t->ss;
    struct server_req *req = t->req;
    const struct tokenizer *tok = server_tokenizer(t->srv);
    const char *finish = res->finish == ENGINE_FINISH_STOP ? "stop" : "length";
    char *content = NULL;
    size_t content_len = 0;
    bool ids_match;
    struct session *x;
    cJSON *msg = NULL, *o = NULL, *m;
    double now = ar_time_s();

    server_req_charge_tokens(req, res->n_gen, false, NULL);
    if (res->status != AR_OK || res->finish == ENGINE_FINISH_ERROR ||
        res->finish == ENGINE_FINISH_CANCELLED || res->finish == ENGINE_FINISH_TIMEOUT) {
        bool stopping = server_stopping(t->srv) || res->finish == ENGINE_FINISH_CANCELLED;
        turn_release(t);
        server_reply_error(req, stopping ? 503 : 500, "server_error",
                           stopping ? "cancelled" : "internal_error", "generation failed: %s",
                           stopping ? "cancelled" : ar_status_str(res->status));
        return;
    }
    /* the document keeps what a chat completion answers: the text without think blocks */
    if ((content = ar_strndup(res->text ? res->text : "", res->text_len)))
        content_len = tokenizer_strip_think(content, res->text_len);
    if (content && !ar_utf8_valid(content, content_len)) {
        char *z = ar_utf8_sanitize(content, content_len, &content_len);
        ar_free(content);
        content = z;
    }
    if (content)
        content[content_len] = '\0';
    ids_match = reply_ids_match(tok, res);
    if (content && (msg = cJSON_CreateObject()) &&
        (!cJSON_AddStringToObject(msg, "role", "assistant") ||
         !cJSON_AddStringToObject(msg, "content", content))) {
        cJSON_Delete(msg);
        msg = NULL;
    }
    ar_free(content);
    if (!msg) {
        turn_release(t);
        reply_nomem(req);
        return;
    }

    pthread_mutex_lock(&ss->mu);
    x = find_locked(ss, t->id, t->owner);
    if (x) {
        cJSON *msgs = cJSON_GetObjectItemCaseSensitive(x->doc, "messages");
        cJSON *copy = cJSON_Duplicate(msg, true);
        char *js = NULL;
        size_t size = 0;
        x->busy = false;
        x->used = now;
        if (copy && cJSON_AddItemToArray(msgs, copy) && (js = cJSON_PrintUnformatted(x->doc)))
            size = strlen(js);
        cJSON_free(js);
        if (!copy || !size || size > ss->p.max_doc_size) {
            /* the reply does not fit: the document stays as it was */
            if (copy)
                cJSON_Delete(cJSON_DetachItemViaPointer(msgs, copy));
            pthread_mutex_unlock(&ss->mu);
            cJSON_Delete(msg);
            if (!size && copy)
                reply_nomem(req);
            else if (!copy)
                reply_nomem(req);
            else
                server_reply_error(req, 413, "invalid_request_error", "session_too_large",
                                   "the reply would make the session document %zu bytes; the "
                                   "limit is %zu",
                                   size, ss->p.max_doc_size);
            return;
        }
        x->doc_size = size;
        x->version++;
        x->turns++;
        remember_context_locked(x, t, res, ids_match);
        o = session_json(ss, x, now);
    }
    pthread_mutex_unlock(&ss->mu);
    if (!x) {
        cJSON_Delete(msg);
        reply_not_found(req, t->id);
        return;
    }
    if (!o) {
        cJSON_Delete(msg);
        reply_nomem(req);
        return;
    }
    cJSON_AddItemToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "finish_reason", finish);
    if ((m = server_oai_usage_json(res)))
        cJSON_AddItemToObject(o, "usage", m);
    server_reply_json(req, 200, o);
}

/* The prompt of a turn: the rendered chat text and its ids. When the text begins with what
 * the previous turn ran on (its prompt and reply), those ids are kept and only the rest is
 * encoded: the engine then finds all of them in its prefix cache. */
static enum ar_status build_turn_prompt(const struct tokenizer *tok,
                                        const struct server_oai_request *rq, const char *ctx_text,
                                        size_t ctx_len, const int32_t *ctx_ids, int n_ctx_ids,
                                        struct turn *t)
{
    enum ar_status st;
    int32_t *rest = NULL;
    int64_t n_rest = 0;
    st = tokenizer_chat_format(tokenizer_chat_family(tok), rq->msgs, rq->n_msgs, true, &t->text,
                               &t->text_len);
    if (st != AR_OK)
        return st;
    if (ctx_text && n_ctx_ids > 0 && t->text_len > ctx_len && !memcmp(t->text, ctx_text, ctx_len)) {
        st = tokenizer_encode(tok, t->text + ctx_len, t->text_len - ctx_len, false, true, &rest,
                              &n_rest);
        if (st != AR_OK)
            return st;
        if (!(t->ids = ar_malloc((size_t)(n_ctx_ids + n_rest) * sizeof(int32_t)))) {
            ar_free(rest);
            return AR_ENOMEM;
        }
        memcpy(t->ids, ctx_ids, (size_t)n_ctx_ids * sizeof(int32_t));
        memcpy(t->ids + n_ctx_ids, rest, (size_t)n_rest * sizeof(int32_t));
        ar_free(rest);
        t->n_ids = (int)AR_MIN(n_ctx_ids + n_rest, INT32_MAX);
        return AR_OK;
    }
    st = tokenizer_encode(tok, t->text, t->text_len, tokenizer_add_bos(tok), true, &rest, &n_rest);
    if (st != AR_OK)
        return st;
    t->ids = rest;
    t->n_ids = (int)AR_MIN(n_rest, INT32_MAX);
    return AR_OK;
}

/* Generates the next assistant message of session id (the caller answered nothing yet). */
static void generate(struct server_sessions *ss, struct server_req *req, const char *id)
{
    struct server *s = server_req_server(req);
    struct engine *eng = server_engine(s);
    const struct tokenizer *tok = server_tokenizer(s);
    const char *owner = owner_of(req);
    struct server_oai_request rq;
    struct server_oai_error e = {0};
    struct engine_request er = {0};
    struct session *x;
    struct turn *t;
    cJSON *body = NULL;
    char *ctx_text = NULL;
    int32_t *ctx_ids = NULL;
    size_t ctx_len = 0;
    int n_ctx_ids = 0, n_ctx = server_n_ctx(s);
    bool found, busy;
    double retry = 0;
    enum ar_status st;

    if (!eng) {
        server_reply_error(req, 503, "server_error", "loading", "the model is loading");
        return;
    }
    if (!(t = server_req_alloc(req, sizeof(*t), turn_cleanup))) {
        reply_nomem(req);
        return;
    }
    /* take the session: its document and context are copied, it is busy until the turn ends */
    pthread_mutex_lock(&ss->mu);
    purge_locked(ss, ar_time_s());
    x = find_locked(ss, id, owner);
    found = x != NULL;
    busy = x && x->busy;
    if (x && !x->busy && (body = chat_body(x->doc, false))) {
        if (x->ctx_text && (ctx_ids = ar_malloc((size_t)x->n_ctx_ids * sizeof(int32_t))) &&
            (ctx_text = ar_strndup(x->ctx_text, x->ctx_len))) {
            memcpy(ctx_ids, x->ctx_ids, (size_t)x->n_ctx_ids * sizeof(int32_t));
            ctx_len = x->ctx_len;
            n_ctx_ids = x->n_ctx_ids;
        }
        x->busy = true;
        x->used = ar_time_s();
    }
    pthread_mutex_unlock(&ss->mu);
    t->ss = ss;
    t->srv = s;
    t->req = req;
    t->eng = eng;
    snprintf(t->id, sizeof(t->id), "%s", id);
    snprintf(t->owner, sizeof(t->owner), "%s", owner);
    if (!body) {
        reply_unavailable(req, id, found, busy);
        return;
    }
    st = server_oai_request_parse(SERVER_OAI_CHAT, body, n_ctx, tokenizer_n_vocab(tok), &rq, &e);
    if (st == AR_OK)
        st = build_turn_prompt(tok, &rq, ctx_text, ctx_len, ctx_ids, n_ctx_ids, t);
    ar_free(ctx_text);
    ar_free(ctx_ids);
    if (st != AR_OK) {
        server_oai_request_fini(&rq);
        cJSON_Delete(body);
        turn_release(t);
        if (st == AR_ENOMEM)
            reply_nomem(req);
        else if (e.status)
            reply_oai_error(req, &e);
        else
            server_reply_error(req, 400, "invalid_request_error", "invalid_value",
                               "cannot build the prompt: %s", ar_status_str(st));
        return;
    }
    if (t->n_ids + 1 > n_ctx) {
        server_oai_request_fini(&rq);
        cJSON_Delete(body);
        turn_release(t);
        server_reply_error(req, 400, "invalid_request_error", "context_length_exceeded",
                           "the session's prompt has %d tokens but the context holds %d "
                           "(prompt plus at least one generated token)",
                           t->n_ids, n_ctx);
        return;
    }
    if (!server_req_charge_tokens(req, t->n_ids, true, &retry)) {
        server_oai_request_fini(&rq);
        cJSON_Delete(body);
        turn_release(t);
        server_reply_error_ex(req, 429, "rate_limit_error", "rate_limit_exceeded", NULL, retry,
                              "token rate limit reached; retry after %.0f s", ceil(retry));
        return;
    }
    er.prompt = t->ids;
    er.n_prompt = t->n_ids;
    er.max_tokens = rq.max_tokens ? AR_MIN(rq.max_tokens, n_ctx - t->n_ids) : n_ctx - t->n_ids;
    er.sampling = rq.sampling;
    if (!rq.seed_set) {
        uint64_t seed;
        if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
            seed = (uint64_t)(ar_time_s() * 1e9);
        er.sampling.seed = seed;
    }
    er.ignore_eos = rq.ignore_eos;
    er.stop = rq.stop;
    er.n_stop = rq.n_stop;
    er.priority = rq.priority;
    er.cache_generated = true; /* the next turn starts with this reply */
    er.on_done = turn_done;
    er.user = t;
    st = engine_submit(eng, &er, &t->eng_id);
    server_oai_request_fini(&rq);
    cJSON_Delete(body);
    if (st == AR_OK) {
        server_req_on_abort(req, turn_abort, t);
        return;
    }
    turn_release(t);
    if (st == AR_EBUSY)
        server_reply_error(req, 503, "server_error", "queue_full",
                           "the request queue is full; retry later");
    else if (st == AR_ERANGE)
        server_reply_error(req, 400, "invalid_request_error", "context_length_exceeded",
                           "the session's prompt (%d tokens) does not fit the context", t->n_ids);
    else
        server_reply_error(req, st == AR_ENOMEM ? 503 : 500, "server_error", "internal_error",
                           "cannot queue the request: %s", ar_status_str(st));
}

/* True for a query parameter that asks for a turn: generate=true or generate=1. */
static bool wants_generate(struct server_req *req)
{
    const char *v = server_req_query(req, "generate");
    return v && (!strcasecmp(v, "true") || !strcmp(v, "1"));
}

/* POST /v1/sessions/{id}/generate */
static void h_post(struct server_req *req, void *user)
{
    char id[40];
    const char *verb;
    if (!split_path(server_req_path(req), id, sizeof(id), &verb) || strcmp(verb, "generate")) {
        server_reply_error(req, 404, "not_found_error", "not_found", "no route for POST %s",
                           server_req_path(req));
        return;
    }
    generate(user, req, id);
}

/* ---- patch ----------------------------------------------------------------------------------- */

static bool is_patch_type(const char *ct)
{
    size_t n = ct ? strcspn(ct, "; \t") : 0;
    return n == strlen(PATCH_TYPE) && !strncasecmp(ct, PATCH_TYPE, n);
}

static void h_patch(struct server_req *req, void *user)
{
    struct server_sessions *ss = user;
    struct server *s = server_req_server(req);
    struct server_jsonpatch_limits lim = server_jsonpatch_default_limits();
    struct server_jsonpatch_err pe;
    struct server_oai_error e = {0};
    struct ar_err err = {0};
    char id[40];
    const char *verb, *raw;
    size_t raw_len = 0, size = 0;
    cJSON *patch = NULL, *doc = NULL, *out = NULL, *o = NULL;
    struct session *x;
    enum server_jsonpatch_result r;
    bool generate_after = wants_generate(req), found, busy;
    uint64_t version = 0;
    double now = ar_time_s();

    if (!split_path(server_req_path(req), id, sizeof(id), &verb) || *verb) {
        server_reply_error(req, 404, "not_found_error", "not_found", "no route for PATCH %s",
                           server_req_path(req));
        return;
    }
    if (!is_patch_type(server_req_header(req, "Content-Type"))) {
        server_reply_error(req, 415, "invalid_request_error", "unsupported_media_type",
                           "a session is changed with Content-Type: " PATCH_TYPE);
        return;
    }
    raw = server_req_raw_body(req, &raw_len);
    if (server_codec_parse(SERVER_CODEC_JSON, raw ? raw : "", raw_len, &patch, &err) != AR_OK) {
        server_reply_error(req, 400, "invalid_request_error", "invalid_json",
                           "cannot parse the patch: %s", err.msg);
        return;
    }
    /* the document is copied under the lock and patched outside it; a change made meanwhile
     * by another request wins and this one is refused (409), so nothing is lost silently */
    pthread_mutex_lock(&ss->mu);
    purge_locked(ss, now);
    x = find_locked(ss, id, owner_of(req));
    found = x != NULL;
    busy = x && x->busy;
    if (x && !x->busy) {
        doc = cJSON_Duplicate(x->doc, true);
        version = x->version;
    }
    pthread_mutex_unlock(&ss->mu);
    if (!doc) {
        cJSON_Delete(patch);
        reply_unavailable(req, id, found, busy);
        return;
    }
    lim.max_depth = SERVER_CODEC_MAX_DEPTH;
    lim.max_nodes = ss->p.max_doc_size / 2 + 64; /* a value takes 2 bytes of JSON at least */
    r = server_jsonpatch_apply(doc, patch, &lim, &out, &pe);
    cJSON_Delete(patch);
    if (r != SERVER_JSONPATCH_OK) {
        cJSON *extra = cJSON_CreateObject();
        cJSON_Delete(doc);
        if (extra && pe.op >= 0)
            cJSON_AddNumberToObject(extra, "op_index", pe.op);
        if (r == SERVER_JSONPATCH_ENOMEM) {
            cJSON_Delete(extra);
            reply_nomem(req);
        } else {
            server_reply_error_ex(req,
                                  r == SERVER_JSONPATCH_ETEST     ? 409
                                  : r == SERVER_JSONPATCH_ETOOBIG ? 413
                                                                  : 400,
                                  "invalid_request_error",
                                  r == SERVER_JSONPATCH_ETEST     ? "patch_test_failed"
                                  : r == SERVER_JSONPATCH_ETOOBIG ? "session_too_large"
                                                                  : "invalid_patch",
                                  extra, 1, "%s", pe.msg);
        }
        return;
    }
    if (!doc_check(ss, s, out, &size, &e)) {
        cJSON_Delete(doc);
        cJSON_Delete(out);
        reply_oai_error(req, &e);
        return;
    }
    /* a turn needs a message: refused before the patch is kept, like any bad patch (a turn
     * that fails later, e.g. on a full queue, leaves the patch applied) */
    if (generate_after &&
        cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(out, "messages")) == 0) {
        cJSON_Delete(doc);
        cJSON_Delete(out);
        server_reply_error(req, 400, "invalid_request_error", "invalid_value",
                           "'messages' must not be empty to generate a turn");
        return;
    }
    pthread_mutex_lock(&ss->mu);
    x = find_locked(ss, id, owner_of(req));
    found = x != NULL;
    if (x && !x->busy && x->version == version) {
        cJSON_Delete(x->doc);
        x->version++;
        x->doc = out;
        x->doc_size = size;
        x->used = now;
        out = NULL;
        if (!generate_after)
            o = session_json(ss, x, now);
    }
    pthread_mutex_unlock(&ss->mu);
    cJSON_Delete(doc);
    if (out) { /* not swapped in */
        cJSON_Delete(out);
        if (!found)
            reply_not_found(req, id);
        else
            server_reply_error(req, 409, "invalid_request_error", "session_busy",
                               "the session changed while this patch was applied; retry");
        return;
    }
    if (generate_after) {
        generate(ss, req, id);
        return;
    }
    if (!o)
        reply_nomem(req);
    else
        server_reply_json(req, 200, o);
}

/* ---- registration ---------------------------------------------------------------------------- */

enum ar_status server_sessions_attach(struct server *s, const struct server_sessions_params *p,
                                      struct server_sessions **out)
{
    struct server_sessions *ss;
    enum ar_status st;
    *out = NULL;
    if (!(ss = ar_calloc(1, sizeof(*ss))))
        return AR_ENOMEM;
    ss->p = p ? *p : server_sessions_default_params();
    {
        struct server_sessions_params d = server_sessions_default_params();
        if (!(ss->p.ttl_s > 0))
            ss->p.ttl_s = d.ttl_s;
        if (ss->p.max_per_key <= 0)
            ss->p.max_per_key = d.max_per_key;
        if (ss->p.max_sessions <= 0)
            ss->p.max_sessions = d.max_sessions;
        if (!ss->p.max_doc_size)
            ss->p.max_doc_size = d.max_doc_size;
    }
    pthread_mutex_init(&ss->mu, NULL);
    {
        /* the patch body may be a little larger than the document it changes */
        size_t max_body = ss->p.max_doc_size + 64 * 1024;
        const struct server_route routes[] = {
            {"POST", SESSIONS_PATH, h_create, ss, SERVER_ROUTE_BODY, max_body},
            {"GET", SESSIONS_PATH "/", h_get, ss, SERVER_ROUTE_PREFIX, 0},
            {"DELETE", SESSIONS_PATH "/", h_delete, ss, SERVER_ROUTE_PREFIX, 0},
            {"PATCH", SESSIONS_PATH "/", h_patch, ss, SERVER_ROUTE_PREFIX | SERVER_ROUTE_RAW,
             max_body},
            {"POST", SESSIONS_PATH "/", h_post, ss, SERVER_ROUTE_PREFIX, 0},
        };
        for (size_t i = 0; i < AR_ARRAY_LEN(routes); i++) {
            if ((st = server_add_route(s, &routes[i])) != AR_OK) {
                /* routes added stay, over a store that must outlive them */
                *out = ss;
                return st;
            }
        }
    }
    *out = ss;
    return AR_OK;
}
