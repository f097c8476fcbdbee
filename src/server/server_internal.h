/* server_internal.h - shared by the files of src/server/: the body codec (codec.c), the
 * OpenAI request validator (request.c), API keys and token buckets (limits.c), the review
 * endpoints without the HTTP core (reviews.c), and the hooks between the HTTP core (http.c) and
 * the handlers (openai.c, reviews.c). Not part of the API. */
#ifndef AR_SERVER_INTERNAL_H
#define AR_SERVER_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/utf8.h"
#include "server.h"

/* ---- codec.c: bodies ⇄ cJSON ------------------------------------------------------------- */

#define SERVER_CODEC_MAX_DEPTH 32

enum server_codec_format { SERVER_CODEC_JSON, SERVER_CODEC_MSGPACK };

/* Parses a body into a new tree (cJSON_Delete). JSON: any JSON text; MessagePack: exactly one
 * object, string map keys only, no ext types, bin read as a string, nesting <= 32. Every
 * string must be valid UTF-8 and NUL-free. AR_EFORMAT with a message in err, AR_ENOMEM. */
enum ar_status server_codec_parse(enum server_codec_format fmt, const char *data, size_t len,
                                  cJSON **out, struct ar_err *err);
/* Serializes a tree; *out is a new buffer (ar_free) of *len bytes (JSON: NUL-terminated).
 * Integral numbers below 2^63 in magnitude become MessagePack integers. AR_ENOMEM. */
enum ar_status server_codec_write(enum server_codec_format fmt, const cJSON *j, char **out,
                                  size_t *len);

/* ---- request.c: OpenAI completion requests ---------------------------------------------- */

#define SERVER_OAI_MAX_STOP 16
#define SERVER_OAI_MAX_STOP_LEN 256
#define SERVER_OAI_MAX_MESSAGES 4096

enum server_oai_kind { SERVER_OAI_CHAT, SERVER_OAI_COMPLETION };

/* A rejected request: the HTTP status and OpenAI error fields. */
struct server_oai_error {
    int status;
    const char *type; /* static */
    const char *code; /* static */
    char param[64];
    char message[256];
};

struct server_oai_request {
    enum server_oai_kind kind;
    const char *model; /* borrowed from the body, or NULL */
    /* chat */
    struct tokenizer_chat_msg *msgs; /* owned, (n_msgs); contents borrowed or in owned_text */
    size_t n_msgs;
    char **owned_text; /* owned, (n_msgs) joined content parts, NULL entries when borrowed */
    /* completion: a text prompt (borrowed) or token ids (owned) */
    const char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    int n_prompt_ids;
    /* generation */
    int max_tokens; /* 0: not given (fill the context) */
    struct sampler_params sampling;
    bool seed_set;
    const char *stop[SERVER_OAI_MAX_STOP]; /* borrowed */
    int n_stop;
    bool ignore_eos, stream, include_usage, truncate;
    enum engine_priority priority;
};

/* Validates body for kind against a context of n_ctx tokens and a vocabulary of n_vocab.
 * AR_EINVAL fills e (400 with the field name, or unsupported features); AR_ENOMEM.
 * On success out holds borrowed pointers into body: keep body alive while using out.
 * server_oai_request_fini must be called either way. */
enum ar_status server_oai_request_parse(enum server_oai_kind kind, const cJSON *body, int n_ctx,
                                        int32_t n_vocab, struct server_oai_request *out,
                                        struct server_oai_error *e);
void server_oai_request_fini(struct server_oai_request *r);
struct engine_result;
/* OpenAI's "usage" object of a finished request: prompt, completion and total tokens, and
 * prompt_tokens_details.cached_tokens (the prompt tokens the prefix cache supplied). */
cJSON *server_oai_usage_json(const struct engine_result *res);

/* Sets e: 400 invalid_request_error with code and param. */
void server_oai_error_set(struct server_oai_error *e, int status, const char *type,
                          const char *code, const char *param, const char *fmt, ...)
    AR_PRINTF(6, 7);

/* ---- limits.c: API keys and token buckets ------------------------------------------------ */

struct server_keys;
/* Reads a key file: one key per line, blank lines and '#' comments skipped, surrounding
 * whitespace trimmed. No key at all: AR_EFORMAT. */
enum ar_status server_keys_load(const char *path, struct server_keys **out, struct ar_err *err);
void server_keys_destroy(struct server_keys *k);
/* Index of the key equal to key[0..len) (compared in time independent of where they
 * differ), or -1. */
int server_keys_find(const struct server_keys *k, const char *key, size_t len);

/* Token buckets per client: a request bucket (rps, burst) and a token bucket (tpm). */
struct server_limiter;
enum ar_status server_limiter_create(double rps, double burst, double tpm,
                                     struct server_limiter **out);
void server_limiter_destroy(struct server_limiter *l);
/* Takes one request from client's bucket at time now (seconds). false: none left, and
 * *retry_s is when one will be. Thread-safe. */
bool server_limiter_request(struct server_limiter *l, const char *client, double now,
                            double *retry_s);
/* See server_req_charge_tokens. Thread-safe. */
bool server_limiter_tokens(struct server_limiter *l, const char *client, int64_t n, bool admission,
                           double now, double *retry_s);
/* Keeps the buckets in the Redis at url from now on (limits_redis.c), shared by every
 * instance that does the same; a call Redis cannot answer falls back to this process's
 * buckets. Checks the URL (AR_EINVAL); Redis need not be up. reg (may be NULL) gets
 * autoreply_rate_limit_backend_errors_total{backend="redis"}. Before any other call. */
enum ar_status server_limiter_use_redis(struct server_limiter *l, const char *url,
                                        struct metrics_registry *reg, struct ar_err *err);
/* False while the limiter's Redis cannot be reached (its last contact failed). */
bool server_limiter_backend_healthy(const struct server_limiter *l);

/* ---- limits_redis.c: the same buckets in Redis ------------------------------------------- */

/* The arithmetic of server_limiter_request/server_limiter_tokens on a hash per client in Redis,
 * done atomically by a Lua script on Redis's clock (so `now` is not an argument). AR_OK: *ok
 * and, when refused, *retry_s. Anything else (AR_EUNAVAIL, AR_EIO for an odd answer): the
 * caller decides in process; the failure is counted. Thread-safe. */
struct server_rlimit;
enum ar_status server_rlimit_create(const char *url, struct metrics_registry *reg,
                                    struct server_rlimit **out, struct ar_err *err);
void server_rlimit_destroy(struct server_rlimit *rl);
enum ar_status server_rlimit_request(struct server_rlimit *rl, const char *client, double rps,
                                     double burst, double tpm, bool *ok, double *retry_s);
enum ar_status server_rlimit_tokens(struct server_rlimit *rl, const char *client, double rps,
                                    double burst, double tpm, int64_t n, bool admission, bool *ok,
                                    double *retry_s);
bool server_rlimit_healthy(const struct server_rlimit *rl);
/* Failed calls to Redis since creation. */
uint64_t server_rlimit_errors(const struct server_rlimit *rl);

/* ---- jsonpatch.c: JSON Patch (RFC 6902) and JSON Pointer (RFC 6901) ---------------------- */

enum server_jsonpatch_result {
    SERVER_JSONPATCH_OK = 0,
    SERVER_JSONPATCH_EINVAL,  /* a malformed patch or operation, a bad pointer, a missing target */
    SERVER_JSONPATCH_ETEST,   /* a "test" operation found another value */
    SERVER_JSONPATCH_ETOOBIG, /* the result would pass server_jsonpatch_limits */
    SERVER_JSONPATCH_ENOMEM
};

struct server_jsonpatch_err {
    enum server_jsonpatch_result result;
    int op; /* index of the failing operation, -1 for the patch as a whole */
    char msg[192];
};

/* Bounds on the patched document, checked as each operation runs: nesting (a scalar is 1
 * level) and values (every node of the tree). */
struct server_jsonpatch_limits {
    int max_depth;    /* 64 */
    size_t max_nodes; /* 2^20 */
};
struct server_jsonpatch_limits server_jsonpatch_default_limits(void);

/* Applies patch (an array of operations) to a copy of doc: *out is the new document
 * (cJSON_Delete) when every operation succeeded, else NULL with e filled, and doc is never
 * touched. Members of an operation other than op/path/value/from are ignored; a member named
 * twice is an error. lim NULL: the defaults. */
enum server_jsonpatch_result server_jsonpatch_apply(const cJSON *doc, const cJSON *patch,
                                                    const struct server_jsonpatch_limits *lim,
                                                    cJSON **out, struct server_jsonpatch_err *e);
/* The value pointer names in doc ("" is doc itself), or NULL (missing, malformed pointer). */
const cJSON *server_jsonpatch_get(const cJSON *doc, const char *pointer);
/* JSON equality as "test" uses it: same type; numbers by value, strings by code points,
 * arrays element by element, objects by member names and values in any order (a name given
 * twice counts once, with its first value, the one a pointer names). */
bool server_jsonpatch_equal(const cJSON *a, const cJSON *b);
/* Inserts item (owned from now on) into arr before element idx (appends for the length);
 * false when out of memory (item not taken). */
bool server_jsonpatch_array_insert(cJSON *arr, int idx, cJSON *item);

/* ---- openai.c ---------------------------------------------------------------------------- */

/* Registers the built-in routes and metric families. */
enum ar_status server_openai_register(struct server *s);
/* console.c: GET /console (the page compiled in from web/console/) and GET /v1/stats. */
enum ar_status server_console_register(struct server *s);
/* Whether a client address (as inet_ntop writes it) is a loopback one: 127.0.0.0/8, ::1, or
 * ::ffff:127.x.y.z. Without API keys the server answers only such clients. */
bool server_address_is_loopback(const char *addr);

/* Server-wide metrics the HTTP core updates (http.c owns them, openai.c observes). */
struct server_http_metrics {
    struct metrics_family *http_duration; /* {method, endpoint, status} */
    struct metrics_child *ttft, *tpot, *queue_time, *e2e;
    /* refusals for load, counted by server_reply_json from the error code of 429/503 answers */
    struct metrics_child *rejected_rate, *rejected_queue, *rejected_overloaded;
    struct metrics_family *queue_length; /* {priority} */
    struct metrics_child *running, *kv_used, *kv_total, *kv_local_used, *kv_local_total;
    struct metrics_child *prefix_queries, *prefix_hit_tokens, *preemptions;
    struct metrics_child *prompt_tokens, *generation_tokens;
    _Atomic uint64_t seen[5]; /* engine counters already added (prefix queries, hit tokens,
                                 preemptions, prompt tokens, generated tokens) */
};
struct server_http_metrics *server_http_metrics_of(struct server *s);
/* Whether the server is stopping (engine cancellations then answer 503). */
bool server_stopping(const struct server *s);
/* server_params.retry_after_s (>= 1). */
double server_retry_after_s(const struct server *s);
/* Adds Retry-After: secs rounded up to whole seconds, from 1 (also for NaN) to a day. */
void server_retry_after_header(struct server_req *req, double secs);
/* Runs every health check (server_add_health_check); adds {name: "ok"|"degraded"|"down"} to
 * backends (may be NULL) and returns the worst state (SERVER_HEALTH_OK without checks); *n
 * (may be NULL) receives the number of checks. */
int server_health_run(struct server *s, cJSON *backends, int *n);

/* ---- reviews.c: the review endpoints below HTTP -------------------------------------------
 * What a review route does, apart from libmicrohttpd: the body's shape, the job path, the work
 * on a service worker, the answer's status (server_status_of_reply_error) and JSON. The HTTP
 * glue in reviews.c (and the tests) drive it. */

enum server_review_ep {
    SERVER_REVIEW_REPLY = 0,   /* POST /v1/reviews/reply */
    SERVER_REVIEW_BATCH,       /* POST /v1/reviews/batch */
    SERVER_REVIEW_JOB_CREATE,  /* POST /v1/jobs */
    SERVER_REVIEW_JOB_GET,     /* GET /v1/jobs/{id} */
    SERVER_REVIEW_JOB_RESULTS, /* GET /v1/jobs/{id}/results */
    SERVER_REVIEW_JOB_LIST,    /* GET /v1/jobs */
    SERVER_REVIEW_JOB_DELETE,  /* DELETE /v1/jobs/{id} */
    SERVER_REVIEW_COUNT
};

/* The answer: a JSON body (owned by the callee) or a text body (borrowed for the call, with
 * its content type). */
typedef void (*server_review_done_fn)(void *ctx, int status, cJSON *json, const char *text,
                                      size_t text_len, const char *content_type);
/* Handles one request; done is called exactly once, from a service worker (or from the
 * calling thread when the answer is immediate: a bad body or path, a full queue). path is the
 * request path (SERVER_REVIEW_JOB_GET also serves ".../results" and sets the endpoint from it);
 * body the parsed object or array (borrowed until done) or NULL; raw/raw_len the body text or
 * NULL; call (may be NULL; must outlive done) the request's budget and cancellation. */
#define SERVER_QUERY_MAX 2048 /* longest query value kept (callback_url) */

/* What the jobs API reads besides the body (copied by server_review_handle). */
struct server_review_opts {
    const char *owner; /* the caller (server_req_client); NULL: "" (jobs made below HTTP) */
    bool jsonl;        /* POST /v1/jobs: the body is JSONL text (an NDJSON content type) */
    /* query arguments, NULL when absent */
    const char *errors;               /* "per_line": bad lines become error results */
    const char *callback_url;         /* completion webhook (also a body field) */
    const char *shop_id;              /* default shop of a JSONL job */
    const char *limit;                /* page size */
    const char *cursor;               /* page start ("after" too) */
    const char *format;               /* results: "ndjson" or "json" */
    const char *purge;                /* DELETE: "true" deletes at once */
    bool accept_json;                 /* results: Accept names application/json, not NDJSON */
    int64_t max_open_jobs, max_bytes; /* the caller's quota; 0: none */
    struct server_req *stream; /* results without a limit are streamed over it (NULL: one body) */
};

void server_review_handle(struct reply_service *svc, enum server_review_ep ep, const char *path,
                          const cJSON *body, const char *raw, size_t raw_len,
                          struct reply_call *call, server_review_done_fn done, void *ctx,
                          const struct server_review_opts *opts);

/* ---- workflow.c: the review workflow and shop profiles ------------------------------------ */

/* Adds GET /v1/reviews, GET /v1/reviews/{shop}/{review}, POST .../approve|reject|regenerate,
 * GET /v1/shops, GET and PUT /v1/shops/{shop} over svc (server_reviews_attach calls it). */
enum ar_status server_workflow_attach(struct server *s, struct reply_service *svc);

#endif
