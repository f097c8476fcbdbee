/* server.h - the HTTP face of the serving engine: an OpenAI-compatible API (chat and text
 * completions with SSE streaming, tokenize/detokenize, models, health, Prometheus metrics) over
 * libmicrohttpd, JSON or MessagePack bodies, API keys, per-key rate limits, body and
 * connection limits, and the review-reply product's endpoints (reviews.c: /v1/reviews/...,
 * /v1/jobs), whose errors (enum reply_error) it maps to HTTP statuses. Endpoints live in a
 * route table. Every response names the instance that made it (X-Autoreply-Instance), so a
 * fleet behind a proxy can be told apart.
 *
 * Threads: libmicrohttpd's event-loop thread (epoll) reads requests and calls handlers. A
 * handler that needs time (a generation) returns without replying: its connection is
 * suspended, and the reply functions below are later called from any thread (typically an
 * engine callback), which resumes it. A watchdog thread drops clients that send too slowly
 * and notices clients that went away while their request waits (on_abort). */
#ifndef AR_SERVER_H
#define AR_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "engine/engine.h"
#include "metrics/metrics.h"
#include "reply/reply.h"

struct server_params {
    const char *host;         /* numeric address or name to listen on ("127.0.0.1") */
    int port;                 /* 8080; 0: an ephemeral port, see server_port */
    size_t max_body;          /* request body limit, bytes (1 MiB); larger: 413 */
    double timeout_s;         /* a whole request must arrive within this; idle keep-alive
                                 connections are closed after it (30) */
    double body_timeout_s;    /* a body that stops coming (no byte for this long) is answered
                                 408 and its connection closed (10); 0: only timeout_s */
    int max_conns;            /* open connections, all clients (512) */
    int max_conns_per_ip;     /* open connections per client address, more are closed at once
                                 (0: no limit; -1, the default: half of max_conns) */
    int http_threads;         /* event-loop threads (1) */
    const char *api_key_file; /* one key per line, '#' comments; NULL: no authentication */
    bool metrics_auth;        /* /metrics needs a key too */
    double rate_rps;          /* requests per second per key (per client IP without keys); 0 off */
    double rate_burst;        /* request bucket size; 0: max(1, rate_rps) */
    double rate_tpm;          /* tokens per minute per key/IP (prompt + generated); 0 off */
    const char *rate_redis_url; /* redis://host:port/db: the buckets above live there, shared
                                   by every instance (a call Redis cannot answer is decided by
                                   this instance's own buckets); NULL: in this process only */
    const char *model_name;     /* model id in /v1/models and replies ("autoreply") */
    double retry_after_s;       /* Retry-After of 503 answers (queue full, loading), >= 1 (1) */
    int n_ctx;                  /* per-request context (prompt + generation); 0 or more than
                                   the engine's: engine_n_ctx */
    struct metrics_registry *metrics; /* borrowed; NULL: the server owns one */
    const char *instance_name;        /* this instance in the X-Autoreply-Instance header of every
                                         response and in /health (copied; printable ASCII, at most
                                         SERVER_INSTANCE_NAME_MAX bytes); NULL: "<host name>:<port>"
                                         (the bound port), or "autoreply" without a host name */
};

#define SERVER_INSTANCE_NAME_MAX 255
#define SERVER_INSTANCE_HEADER "X-Autoreply-Instance"

/* The defaults noted above. Thread-safe. */
struct server_params server_default_params(void);

struct server;
struct server_req;

/* ---- lifetime ----------------------------------------------------------------------------- */

/* Builds a server with the built-in routes; it does not listen yet (server_start). Reads
 * api_key_file (AR_EIO, AR_EFORMAT for an empty key list). The caller owns *out
 * (server_destroy). */
enum ar_status server_create(const struct server_params *p, struct server **out,
                             struct ar_err *err);
/* Starts listening. Until server_set_engine, /health answers 503 "loading" and routes that
 * need the engine answer 503. AR_EIO when the address cannot be bound. */
enum ar_status server_start(struct server *s, struct ar_err *err);
/* Makes the server ready. engine, model and tok are borrowed and must outlive the server
 * (or server_stop). Thread-safe; call once. */
void server_set_engine(struct server *s, struct engine *e, const struct model *m,
                       const struct tokenizer *tok);
/* The bound port (after server_start), else 0. */
int server_port(const struct server *s);
/* False while the Redis of rate_redis_url cannot be reached (the last contact failed): the
 * instance limits on its own buckets meanwhile. True without rate_redis_url. Thread-safe. */
bool server_rate_limit_healthy(const struct server *s);
/* Graceful stop: stops accepting, lets requests in progress finish for up to grace_s
 * seconds, then aborts the rest (engine_cancel through their on_abort) and closes every
 * connection. Idempotent. Must not be called from a handler or engine callback. */
void server_stop(struct server *s, double grace_s);
/* server_stop(s, 0) if still running, then frees. NULL does nothing. */
void server_destroy(struct server *s);

/* Borrowed; NULL before server_set_engine. */
struct engine *server_engine(const struct server *s);
const struct model *server_model(const struct server *s);
const struct tokenizer *server_tokenizer(const struct server *s);
const char *server_model_name(const struct server *s);
/* The context a request may use (server_params.n_ctx capped by the engine); 0 before
 * server_set_engine. */
int server_n_ctx(const struct server *s);
/* The registry the server's metrics live in (borrowed). */
struct metrics_registry *server_metrics(const struct server *s);
/* The instance name (server_params.instance_name, or the default once server_start has bound
 * the port; "autoreply" before). Borrowed, lives as long as s. */
const char *server_instance_name(const struct server *s);

/* ---- health ------------------------------------------------------------------------------- */

/* What a health check reports about its backend. */
enum server_health {
    SERVER_HEALTH_OK = 0,
    SERVER_HEALTH_DEGRADED, /* reachable but impaired (slow, reconnecting, a replica down) */
    SERVER_HEALTH_DOWN      /* cannot be reached now */
};
const char *server_health_str(int h); /* "ok", "degraded", "down" (any other value: "down") */

/* Adds a backend to /health: check(user) is called for every GET /health, on the event-loop
 * thread, so it must be quick (report a state the backend keeps, e.g. whether its connection
 * is up; never wait on the network) and thread-safe; it returns an enum server_health (any
 * other value counts as down). /health then answers
 *   503 {"status": "loading", "instance", "backends"?}   before server_set_engine;
 *   200 {"status": "ok", "instance", "backends"?}         when every check says ok;
 *   200 {"status": "degraded", "instance", "backends"}    when any says degraded or down: the
 *       instance still serves (a proxy keeps sending to it), clients of that backend get 503s;
 * "backends" maps each name to "ok" / "degraded" / "down" (absent without checks). name is
 * copied (1..63 bytes of [A-Za-z0-9_.-]); a name twice, or a bad name: AR_EINVAL. Any time,
 * from any thread; user must outlive the server. */
enum ar_status server_add_health_check(struct server *s, const char *name, int (*check)(void *user),
                                       void *user);

/* ---- routes ------------------------------------------------------------------------------- */

enum server_route_flags {
    SERVER_ROUTE_PUBLIC = 1u << 0,  /* no API key needed, no request rate limit */
    SERVER_ROUTE_METRICS = 1u << 1, /* needs a key only with metrics_auth */
    SERVER_ROUTE_ENGINE = 1u << 2,  /* 503 until server_set_engine */
    SERVER_ROUTE_BODY = 1u << 3,    /* an object body is parsed for the handler: MessagePack for
                                       application/(x-)msgpack; JSON for application/json,
                                       text/plain, form-urlencoded (curl -d) or none; else 415 */
    SERVER_ROUTE_PREFIX = 1u << 4,  /* path is a prefix: "/v1/jobs/" matches "/v1/jobs/<id>/x".
                                       An exact route wins, then the longest prefix; the
                                       handler reads the rest from server_req_path */
    SERVER_ROUTE_ARRAY = 1u << 5,   /* with BODY: an array body is accepted as well */
    SERVER_ROUTE_RAW = 1u << 6,     /* the body is kept as received (server_req_raw_body), with
                                       any Content-Type. With BODY too, a body that is one JSON
                                       value (MessagePack for msgpack types) holding an object or
                                       an array is also parsed (server_req_body); any other body
                                       is left to the handler (server_req_body NULL), except
                                       MessagePack that does not parse: 400 */
    SERVER_ROUTE_PAGE = 1u << 7     /* a browser page's static file: no API key needed (a
                                       navigation cannot send one) nor request rate limit, but
                                       without API keys only loopback clients, like the API */
};

/* Called on the event-loop thread. It must, now or later and from any thread, finish the
 * request with exactly one of server_reply_json / server_reply_error / server_reply_text /
 * server_stream_end. Returning without doing so suspends the connection until it does. */
typedef void (*server_handler_fn)(struct server_req *req, void *user);

struct server_route {
    const char *method; /* "GET", "POST", ... (copied) */
    const char *path;   /* path without query ("/v1/reply"), or a prefix with
                           SERVER_ROUTE_PREFIX; copied */
    server_handler_fn fn;
    void *user;
    unsigned flags;  /* enum server_route_flags */
    size_t max_body; /* this route's body limit in bytes (larger: 413); 0: the server's
                        max_body */
};

/* Hands data (from ar_malloc) to the server, which ar_frees it when destroyed: what routes'
 * user pointers need to live as long. Before server_start; at most 4. AR_EINVAL otherwise. */
enum ar_status server_keep(struct server *s, void *data);
/* Adds a route; before server_start only. The same method, path and kind (exact or prefix)
 * twice: AR_EINVAL. */
enum ar_status server_add_route(struct server *s, const struct server_route *r);

/* ---- review-reply endpoints (reviews.c) -----------------------------------------------------
 * The product's routes over a reply service:
 *   POST /v1/reviews/reply   a review object (reply_review_from_json: shop_id required, "id"
 *                            for review_id); the result, or its error with the status below
 *   POST /v1/reviews/batch   {"reviews": [...], "shop_id"?} or a bare JSON array of review
 *                            objects (1..REPLY_BATCH_MAX); 200 {"results": [...]} in order,
 *                            each item answered on its own (an error item carries "status")
 *   POST /v1/jobs            JSONL text (application/x-ndjson, application/jsonl,
 *                            application/json-lines), or JSON (application/json, MessagePack):
 *                            a bare array, {"items"|"reviews": [...]} or {"jsonl": "..."}, with
 *                            "shop_id", "errors", "callback_url" (also as query arguments);
 *                            other types 415. Every line is checked first (reply_job_submit):
 *                            400 {error, lines: [{line, message}], invalid_lines} naming the
 *                            first bad ones, unless errors=per_line; over the caller's quota
 *                            429 (open jobs) or 413 (bytes), code "job_quota_exceeded";
 *                            202 {id, status, total, invalid}
 *   GET  /v1/jobs            the caller's jobs, newest first: {object, data, has_more,
 *                            next_cursor}; limit (1..100, 20), cursor (or after)
 *   GET  /v1/jobs/{id}       the job (reply_job_info_to_json)
 *   GET  /v1/jobs/{id}/results   its lines as NDJSON (streamed with a bounded buffer; with limit
 *                            a page, X-Next-Cursor names the next), or with format=json (or
 *                            Accept: application/json) a page {object, data, has_more,
 *                            next_cursor}; limit (1..1000, 100), cursor
 *   DELETE /v1/jobs/{id}     cancels a queued or running job (200, the job, "deleted": false);
 *                            deletes a finished or cancelled one, or any with purge=true
 *                            (200 {id, deleted: true})
 * The merchant's review workflow (workflow.c; REVIEW = {shop_id, review_id, text, rating, lang,
 * reply, status, needs_human, sentiment (label), sentiment_score, cached, model, created,
 * updated}):
 *   GET  /v1/reviews         answered reviews newest first: {object, data, next_cursor};
 *                            status, shop_id, rating (1..5), sentiment (negative < -0.15 <=
 *                            neutral <= 0.15 < positive, the pipeline's labels), limit (1..100,
 *                            20), cursor (opaque: the previous page's next_cursor)
 *   GET  /v1/reviews/{shop_id}/{review_id}   REVIEW plus audit: [{at, key, action, before,
 *                            after, from, to}] oldest first
 *   POST /v1/reviews/{shop_id}/{review_id}/approve  body optional {"reply": edited text} (held
 *                            to the shop's banned words: 400); from pending or approved
 *   POST .../reject          from pending only (an approve and a reject never both pass)
 *   POST .../regenerate      a new draft (pending) from anything not sent
 *                            each 200 REVIEW; 404 unknown; 409 invalid_state otherwise. The
 *                            audit's key is "key:<index>" with API keys, else "".
 *   GET  /v1/shops           {object, data: [PROFILE + shop_id + source]}: the --shops file's
 *                            shops and those saved in the store (source "config" / "store")
 *   GET  /v1/shops/{shop_id} PROFILE (source "default" for a shop named nowhere)
 *   PUT  /v1/shops/{shop_id} PROFILE (reply_profile_from_json: 400 invalid_profile naming the
 *                            member); saved and used at once here, by others within 5 s
 * A job belongs to the caller that made it (server_req_client: the API key, else the address):
 * for anyone else every jobs route answers 404.
 * Reviews and batches answer 503 "loading" until server_set_engine; jobs are stored and read
 * without the engine. Each request's generations are charged to the client's token bucket
 * (rate_tpm) through a reply_call, which the abort hook cancels when the client goes away
 * (499, nothing stored). Work runs on the service's workers (reply_service_submit); a full
 * queue answers 503. 429 and 503 answers carry Retry-After. */

/* The HTTP status of a reply error: OK 200, EINVAL 400, EDUPLICATE 409, ECONFLICT 409,
 * ELIMITED 429, ECANCELLED 499 (the client closed first, as nginx counts it), EBUSY 503,
 * EUNAVAIL 503, ENOTFOUND 404, EINTERNAL (and a value out of range) 500. */
int server_status_of_reply_error(enum reply_error e);
/* One review's answer as the review endpoints send it: reply_result_to_json for an answer;
 * {review_id?, error: {message, type, code}, status} for an error (type "rate_limit_error"
 * for 429, "invalid_request_error" below 500, else "server_error"; code reply_error_code;
 * status server_status_of_reply_error). NULL when out of memory. Thread-safe. */
cJSON *server_review_result_json(const struct reply_result *r, const char *review_id);

struct server_reviews_params {
    size_t max_job_body;   /* POST /v1/jobs body limit in bytes; 0: 64 MiB */
    int64_t job_max_open;  /* queued or running jobs per client (API key, else address);
                              more: 429 (32; 0: the default) */
    int64_t job_max_bytes; /* stored job bytes per client, finished jobs included until they
                              are deleted; more: 413 (1 GiB; 0: the default) */
};
struct server_reviews_params server_reviews_default_params(void);
/* Adds the routes above to s (before server_start) over svc, which is borrowed: it must
 * outlive every request the server answers (server_stop before reply_service_destroy). p may
 * be NULL (the defaults). Nothing to undo: the routes go with the server. AR_EINVAL when a
 * route is taken already, AR_ENOMEM; routes added before the failure stay (over svc). */
enum ar_status server_reviews_attach(struct server *s, struct reply_service *svc,
                                     const struct server_reviews_params *p);

/* ---- sessions: incremental input (sessions.c) ----------------------------------------------
 * Conversations kept by the server, changed with JSON Patch (RFC 6902):
 *   POST   /v1/sessions             a document: {"messages": [...], "system"?, sampling options
 *                                   as chat completions take them, anything else kept as is};
 *                                   201 {id, object: "session", created, expires_at, turns,
 *                                   document}
 *   GET    /v1/sessions/{id}        the same
 *   PATCH  /v1/sessions/{id}        Content-Type: application/json-patch+json (else 415): the
 *                                   operations applied all or none (a failed "test" 409, a bad
 *                                   operation or pointer 400, a document that is no longer a
 *                                   valid session 400, too large 413); ?generate=true then
 *                                   generates a turn as below (a turn that fails after the
 *                                   patch was applied, e.g. 503 queue full, leaves it applied)
 *   POST   /v1/sessions/{id}/generate   the next assistant message from the document's
 *                                   messages, appended to it: 200 {..., document, message,
 *                                   finish_reason, usage}; 409 while another turn runs
 *   DELETE /v1/sessions/{id}
 * A turn's prompt reuses the previous turn's prompt and reply ids, whose KV the engine keeps
 * in its prefix cache (usage.prompt_tokens_details.cached_tokens). Sessions are in this
 * process's memory (not shared by instances, lost on restart), belong to the API key that
 * made them (another key: 404; without keys, one owner for all) and expire ttl_s after their
 * last use. */
struct server_sessions_params {
    double ttl_s;        /* idle lifetime in seconds (3600) */
    int max_per_key;     /* sessions one key may hold (64); beyond: 429 */
    int max_sessions;    /* sessions in all (1024: with the size below at most 256 MiB of
                            documents); beyond: 429 */
    size_t max_doc_size; /* a document's JSON bytes (256 KiB); beyond: 413 */
};
struct server_sessions_params server_sessions_default_params(void);
struct server_sessions;
/* Adds the routes above to s (before server_start). p may be NULL (defaults; zero fields
 * take theirs too). *out is set even when adding a route fails (AR_EINVAL, AR_ENOMEM), as the
 * routes added stay: destroy it with server_sessions_destroy after server_destroy (once no
 * request and no engine callback can reach it). */
enum ar_status server_sessions_attach(struct server *s, const struct server_sessions_params *p,
                                      struct server_sessions **out);
void server_sessions_destroy(struct server_sessions *ss);

/* ---- inside a handler --------------------------------------------------------------------- */
/* Every function below is thread-safe. Pointers returned are borrowed from req and valid until
 * its final reply has been made (req lives at least that long, even if the client is gone). */

struct server *server_req_server(const struct server_req *req);
/* The parsed body (an object; an array too with SERVER_ROUTE_ARRAY or SERVER_ROUTE_RAW) of
 * SERVER_ROUTE_BODY routes, else NULL. JSON and MessagePack give the same tree; every string
 * in it is valid UTF-8. */
const cJSON *server_req_body(const struct server_req *req);
/* The body bytes of SERVER_ROUTE_RAW routes as received (not checked in any way; followed by
 * a NUL byte not counted in *len), "" when there was none; NULL for other routes. */
const char *server_req_raw_body(const struct server_req *req, size_t *len);
const char *server_req_method(const struct server_req *req);
const char *server_req_path(const struct server_req *req);
/* A request header (case-insensitive name) or NULL. Only while the handler runs. */
const char *server_req_header(struct server_req *req, const char *name);
/* A query parameter of the request target (?name=value, unescaped) or NULL; "" for a name
 * without a value. Only while the handler runs. */
const char *server_req_query(struct server_req *req, const char *name);
/* Identity used for rate limits: "key:<index>" with API keys, else the client's address. */
const char *server_req_client(const struct server_req *req);
/* Zeroed memory that lives as long as req; cleanup (may be NULL) runs on it when req is freed,
 * in reverse allocation order. NULL when out of memory. */
void *server_req_alloc(struct server_req *req, size_t size, void (*cleanup)(void *));
/* fn(req, user) is called at most once, from a server thread, if the client goes away (or the
 * server stops) before the final reply. It must be quick (engine_cancel); it may not reply. */
void server_req_on_abort(struct server_req *req, void (*fn)(struct server_req *, void *),
                         void *user);
/* True once the client is known to be gone: further replies are discarded. */
bool server_req_aborted(struct server_req *req);

/* Token-per-minute limit (rate_tpm). Admission: if the client's bucket lacks
 * min(n_tokens, its size), returns false and *retry_after_s (seconds); otherwise (and always
 * when admission is false) subtracts n_tokens, which may leave the bucket in debt. */
bool server_req_charge_tokens(struct server_req *req, int64_t n_tokens, bool admission,
                              double *retry_after_s);

/* ---- replies ------------------------------------------------------------------------------ */

/* An extra header for the final reply (Retry-After, ...); copied. Before the reply. */
void server_reply_header(struct server_req *req, const char *name, const char *value);
/* Takes ownership of body; sends it as JSON or as MessagePack (Accept names msgpack). A 429
 * with error code "rate_limit_exceeded" or a 503 with "queue_full" or "overloaded" counts as
 * a refusal for load in autoreply_rejected_total{reason} (rate_limit, queue_full, overloaded). */
void server_reply_json(struct server_req *req, int status, cJSON *body);
/* {"error": {"message", "type", "code"}} plus the members of extra (owned, may be NULL);
 * 429 and 503 get a Retry-After of retry_after_s (rounded up, >= 1). */
void server_reply_error_ex(struct server_req *req, int status, const char *type, const char *code,
                           cJSON *extra, double retry_after_s, const char *fmt, ...)
    AR_PRINTF(7, 8);
void server_reply_error(struct server_req *req, int status, const char *type, const char *code,
                        const char *fmt, ...) AR_PRINTF(5, 6);
/* data is copied. */
void server_reply_text(struct server_req *req, int status, const char *content_type,
                       const char *data, size_t len);

/* Streaming (200, chunked): begin, any number of writes (copied; sent as soon as the client
 * can take them), end. An error reply made before the handler returned replaces a stream
 * that has begun. Writes after the client went away are discarded. */
void server_stream_begin(struct server_req *req, const char *content_type);
void server_stream_write(struct server_req *req, const char *data, size_t len);
void server_stream_end(struct server_req *req);
/* Waits (from a worker, never the event loop) until at most max_buffered bytes written by
 * server_stream_write wait for the client, so that a producer keeps a bounded amount in memory
 * however slowly the client reads. False when the client is gone, the stream ended, or
 * timeout_s passed first. */
bool server_stream_wait(struct server_req *req, size_t max_buffered, double timeout_s);

#endif
