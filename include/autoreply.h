/* autoreply.h - public C API of libautoreply.
 * Status codes, error details and logging shared by every module and by callers of the
 * library; then the embedding API: a model (ar_model), tokens, the serving engine with
 * streaming callbacks (ar_engine) and the review-reply service (ar_reply_service). Small and
 * boring on purpose: opaque handles, params structs from *_params_default(), no printing, no
 * global error state, no aborts. Link with `pkg-config --cflags --libs autoreply`.
 *
 * Errors: every call that can fail returns enum ar_status and, when err is not NULL, fills
 * *err with the code and a one-line message. Freeing NULL does nothing.
 * Params structs start with struct_size: take them from *_params_default() (which sets it)
 * and change fields; a library older or newer than the header reads only the fields both
 * know, the others keep their defaults. */
#ifndef AUTOREPLY_H
#define AUTOREPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Marks what libautoreply.so exports; everything else in the library is hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define AR_API __attribute__((visibility("default")))
#else
#define AR_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define AR_VERSION "0.1.0"

enum ar_status {
    AR_OK = 0,
    AR_ENOMEM,   /* an allocation failed */
    AR_EIO,      /* open/read/write/mmap failed */
    AR_EFORMAT,  /* bytes from a file or socket are malformed */
    AR_EINVAL,   /* a caller passed an invalid argument */
    AR_EBUSY,    /* a bounded resource is full: retry later */
    AR_ENOTSUP,  /* valid but not supported (tensor type, architecture ...) */
    AR_ERANGE,   /* a value is out of range (prompt longer than the context ...) */
    AR_ECANCELED, /* the operation was cancelled */
    AR_EUNAVAIL   /* a backend server (database, cache, broker) cannot be reached now: retry
                     later; the client reconnects by itself */
};

/* Static string, never NULL. Thread-safe. */
AR_API const char *ar_status_str(enum ar_status st);

/* Optional error detail filled by loaders and parsers next to the returned status. */
struct ar_err {
    enum ar_status code;
    uint64_t offset; /* byte offset in the input where the problem was found, or 0 */
    char msg[256];   /* one line, no trailing newline */
};

enum ar_log_level { AR_LOG_DEBUG = 0, AR_LOG_INFO, AR_LOG_WARN, AR_LOG_ERROR };

typedef void (*ar_log_fn)(enum ar_log_level level, const char *msg, void *user_data);

/* Sets the process-wide log sink (NULL restores the default: stderr, INFO and above).
 * Call before starting threads; the callback itself may be called from any thread. */
AR_API void ar_log_set(ar_log_fn fn, void *user_data);
AR_API void ar_log_set_level(enum ar_log_level min_level);

/* The library's version, AR_VERSION when header and library match. Static string. */
AR_API const char *ar_version(void);

/* Frees a string the library returned (ar_engine_generate). NULL: nothing. */
AR_API void ar_string_free(char *s);

/* ---- models ------------------------------------------------------------------------------
 * A model is a GGUF file mapped read-only with its tokenizer; immutable after load, so any
 * number of threads and engines may share it. */

struct ar_model;

struct ar_model_params {
    size_t struct_size; /* sizeof(struct ar_model_params), set by ar_model_params_default */
    int n_threads;      /* threads of engines over this model that ask for 0 (2) */
};
AR_API struct ar_model_params ar_model_params_default(void);

/* Opens and validates path. params NULL: defaults. The caller owns *out (ar_model_free).
 * AR_EIO (cannot read), AR_EFORMAT (not a valid GGUF model or tokenizer), AR_ENOTSUP (an
 * architecture or tensor type the library does not run). Thread-safe. */
AR_API enum ar_status ar_model_load(const char *path, const struct ar_model_params *params,
                                    struct ar_model **out, struct ar_err *err);
/* Every engine over m must be freed first. */
AR_API void ar_model_free(struct ar_model *m);

/* Metadata; thread-safe. Strings are borrowed for the model's lifetime. NULL m: "" or 0. */
AR_API const char *ar_model_arch(const struct ar_model *m); /* "llama", "qwen2", ... */
AR_API const char *ar_model_name(const struct ar_model *m); /* file name without .gguf */
AR_API int32_t ar_model_n_ctx(const struct ar_model *m);    /* training context, tokens */
AR_API int32_t ar_model_n_vocab(const struct ar_model *m);
AR_API int32_t ar_model_token_bos(const struct ar_model *m); /* -1: none */
AR_API int32_t ar_model_token_eos(const struct ar_model *m); /* -1: none */
/* True for tokens that end generation (eos, end of turn). */
AR_API bool ar_model_token_is_eog(const struct ar_model *m, int32_t token);

/* ---- tokens ------------------------------------------------------------------------------
 * Thread-safe; the model is only read. */

/* Tokenizes text[0..len). add_special: BOS/EOS as the vocabulary asks; parse_special: text of
 * control tokens ("<|im_start|>") becomes that token. *n receives the number of ids the text
 * needs; when that is more than cap, AR_ERANGE and ids holds the first cap of them. */
AR_API enum ar_status ar_tokenize(const struct ar_model *m, const char *text, size_t len,
                                  bool add_special, bool parse_special, int32_t *ids,
                                  int64_t cap, int64_t *n, struct ar_err *err);
/* The text of ids[0..n) into buf[0..cap), NUL-terminated; *len receives its length without
 * the NUL. remove_special drops control tokens. AR_ERANGE when cap <= *len (buf untouched);
 * AR_EINVAL for an id out of range. */
AR_API enum ar_status ar_detokenize(const struct ar_model *m, const int32_t *ids, int64_t n,
                                    bool remove_special, char *buf, size_t cap, size_t *len,
                                    struct ar_err *err);
/* The bytes one token stands for (not NUL-terminated, *len bytes; possibly part of a UTF-8
 * character), borrowed for the model's lifetime; NULL when out of range. For text as it is
 * generated, use an ar_detokenizer, which never splits a character. */
AR_API const char *ar_token_piece(const struct ar_model *m, int32_t token, size_t *len);

/* Streaming detokenizer: push tokens one at a time, get text that is always whole UTF-8
 * characters (an incomplete tail waits for the next token); the chunks concatenated equal
 * ar_detokenize of the same tokens. One thread at a time per detokenizer. */
struct ar_detokenizer;
AR_API enum ar_status ar_detokenizer_create(const struct ar_model *m, bool remove_special,
                                            struct ar_detokenizer **out, struct ar_err *err);
/* *text (*len bytes, maybe 0) is borrowed until the next call on d. */
AR_API enum ar_status ar_detokenizer_push(struct ar_detokenizer *d, int32_t token,
                                          const char **text, size_t *len);
/* Ends the stream (a held incomplete character comes out as U+FFFD); d can start again. */
AR_API enum ar_status ar_detokenizer_flush(struct ar_detokenizer *d, const char **text,
                                           size_t *len);
AR_API void ar_detokenizer_free(struct ar_detokenizer *d);

/* ---- the engine --------------------------------------------------------------------------
 * Many generation requests on one model: requests run batched together (continuous
 * batching over a paged KV cache with a prefix cache), on the engine's own scheduler thread.
 * Every function is thread-safe. Callbacks run on the scheduler thread: they must be quick,
 * may call ar_engine_submit / ar_engine_cancel, and must never call ar_engine_free. */

struct ar_engine;

struct ar_engine_params {
    size_t struct_size;
    int n_threads;     /* model threads; 0: the model's n_threads */
    int n_seq_max;     /* requests running at once (16) */
    int64_t kv_tokens; /* KV cache capacity in tokens (8192) */
    int n_batch;       /* rows per forward step (512) */
    int queue_max;     /* requests waiting; beyond that ar_engine_submit says AR_EBUSY (256) */
    bool prefix_cache; /* reuse the KV of identical prompt prefixes (true) */
    bool kv_f32;       /* KV cache in F32 instead of F16: exact, twice the memory (false) */
};
AR_API struct ar_engine_params ar_engine_params_default(void);

enum ar_finish {
    AR_FINISH_STOP = 0,  /* end-of-generation token or a stop string */
    AR_FINISH_LENGTH,    /* max_tokens reached, or the context is full */
    AR_FINISH_CANCELLED, /* ar_engine_cancel, or the engine was freed */
    AR_FINISH_TIMEOUT,   /* timeout_s passed */
    AR_FINISH_ERROR      /* see status */
};
AR_API const char *ar_finish_str(enum ar_finish f); /* "stop", "length", ... */

struct ar_result {
    enum ar_status status;
    enum ar_finish finish;
    int32_t n_prompt, n_cached, n_gen; /* prompt tokens, of them from the prefix cache,
                                          generated tokens */
    const char *text; /* the generated text (stop string cut), borrowed (see where given) */
    size_t text_len;
    double queue_s, first_token_s, total_s; /* from submit: admitted, first token, done */
};

/* text: newly completed UTF-8 text (may be empty while a character or a possible stop string
 * is held back; the held tail comes last with token -1). The texts concatenated equal the
 * final result's text. Borrowed for the call. */
typedef void (*ar_token_fn)(void *user_data, int32_t token, const char *text, size_t len);
/* Called exactly once per accepted request, last; res and its text borrowed for the call. */
typedef void (*ar_done_fn)(void *user_data, const struct ar_result *res);

struct ar_request_params {
    size_t struct_size;
    int32_t max_tokens;      /* >= 1 (128) */
    float temperature;       /* <= 0: greedy (0.8) */
    int32_t top_k;           /* 0: off (40) */
    float top_p;             /* 1: off (0.95) */
    float min_p;             /* 0: off (0.05) */
    float repeat_penalty;    /* 1: off (1) */
    int32_t repeat_last_n;   /* penalty window (64) */
    uint64_t seed;           /* same seed, same prompt: same tokens (0) */
    const char *const *stop; /* (n_stop) stop strings, copied at submit; none by default */
    int32_t n_stop;
    bool ignore_eos;         /* go on past end-of-generation tokens (false) */
    bool add_special;        /* text prompts: BOS/EOS as the vocabulary asks (true) */
    bool parse_special;      /* text prompts: control-token text becomes the token (false) */
    bool bulk;               /* background work: waits behind interactive requests (false) */
    double timeout_s;        /* 0: none */
    ar_token_fn on_token;    /* may be NULL */
    ar_done_fn on_done;      /* may be NULL */
    void *user_data;
};
AR_API struct ar_request_params ar_request_params_default(void);

/* m is borrowed and must outlive the engine. params NULL: defaults. */
AR_API enum ar_status ar_engine_create(struct ar_model *m, const struct ar_engine_params *params,
                                       struct ar_engine **out, struct ar_err *err);
/* Cancels what is queued or running (their on_done runs, finish AR_FINISH_CANCELLED), then
 * stops. Not from a callback. */
AR_API void ar_engine_free(struct ar_engine *e);
/* Largest prompt + generation accepted, in tokens. */
AR_API int32_t ar_engine_n_ctx(const struct ar_engine *e);

/* Queues a generation for a text prompt (tokenized as params say) or token ids. On AR_OK *id
 * (may be NULL) names it for ar_engine_cancel and on_done will be called; otherwise neither
 * callback runs. AR_EBUSY: the queue is full (retry later); AR_ERANGE: the prompt and
 * max_tokens do not fit the context; AR_EINVAL: an empty prompt or a bad parameter. */
AR_API enum ar_status ar_engine_submit(struct ar_engine *e, const char *prompt,
                                       const struct ar_request_params *params, uint64_t *id,
                                       struct ar_err *err);
AR_API enum ar_status ar_engine_submit_tokens(struct ar_engine *e, const int32_t *ids,
                                              int32_t n, const struct ar_request_params *params,
                                              uint64_t *id, struct ar_err *err);
/* Stops a queued or running request: its on_done follows with AR_FINISH_CANCELLED. Unknown
 * or finished ids are ignored. */
AR_API void ar_engine_cancel(struct ar_engine *e, uint64_t id);

/* Generates and waits (on_token of params, if set, still streams). *text: the generated text,
 * NUL-terminated, owned by the caller (ar_string_free); res (may be NULL) receives the
 * result, its text pointing at *text. A request that ends cancelled or timed out is AR_OK
 * with res->finish saying so; AR_FINISH_ERROR gives its status. Not from a callback. */
AR_API enum ar_status ar_engine_generate(struct ar_engine *e, const char *prompt,
                                         const struct ar_request_params *params, char **text,
                                         struct ar_result *res, struct ar_err *err);

/* The model's chat prompt for an optional system message (NULL: none) and a user message,
 * ending with the assistant's opening, as token ids for ar_engine_submit_tokens: *ids is new
 * (ar_tokens_free), *n ids. The messages' text is never parsed for control tokens. */
AR_API enum ar_status ar_chat_tokens(const struct ar_model *m, const char *system,
                                     const char *user, int32_t **ids, int32_t *n,
                                     struct ar_err *err);
AR_API void ar_tokens_free(int32_t *ids);

/* ---- the review-reply service ------------------------------------------------------------
 * Answers shop reviews as `autoreply reply` does: stored answer (idempotent per shop and
 * review id), else the reply cache, else the model under the shop's profile with guardrails
 * (a failing generation is retried, then replaced by a template reply), then cached and
 * stored. Thread-safe: any number of threads may answer at once (the engine batches them). */

struct ar_reply_service;

struct ar_reply_params {
    size_t struct_size;
    const char *store;   /* where replies are kept: a SQLite file or a postgres:// URL;
                            NULL or "": in memory, forgotten at ar_reply_service_free */
    const char *shops;   /* shop profiles (JSON file, see README); NULL: the built-in one */
    const char *shop_id; /* the shop of reviews that name none ("default") */
    size_t cache_mb;     /* in-process reply cache, MiB; 0: none (64) */
    int32_t max_tokens;  /* per generation (160) */
    float temperature;   /* first attempt; 0: greedy (0) */
    uint64_t seed;       /* first attempt's seed (1234) */
    double timeout_s;    /* per generation (60) */
};
AR_API struct ar_reply_params ar_reply_params_default(void);

/* e is borrowed and must outlive the service. */
AR_API enum ar_status ar_reply_service_create(struct ar_engine *e,
                                              const struct ar_reply_params *params,
                                              struct ar_reply_service **out,
                                              struct ar_err *err);
/* Waits for answers in progress. */
AR_API void ar_reply_service_free(struct ar_reply_service *svc);

/* One review; strings borrowed for the call. */
struct ar_review {
    const char *shop_id;   /* NULL: the service's shop_id */
    const char *review_id; /* required: one review id has one reply */
    const char *text;      /* 1..4096 bytes of UTF-8 */
    int rating;            /* 1..5 */
    const char *lang;      /* "zh" or "en"; NULL: guessed */
    const char *product;   /* may be NULL */
};

enum ar_reply_source {
    AR_REPLY_SOURCE_MODEL = 0, /* generated now */
    AR_REPLY_SOURCE_CACHE,     /* reply cache hit */
    AR_REPLY_SOURCE_STORE,     /* answered before (same shop and review id) */
    AR_REPLY_SOURCE_TEMPLATE,  /* every generation failed the checks: a safe template */
    AR_REPLY_SOURCE_OFF        /* the shop's reply mode is off: no reply */
};
AR_API const char *ar_reply_source_str(enum ar_reply_source s); /* "model", "cache", ... */

enum ar_reply_action {
    AR_REPLY_ACTION_NONE = 0, /* no reply (mode off) */
    AR_REPLY_ACTION_SUGGEST,  /* for a person to check and send */
    AR_REPLY_ACTION_SEND      /* may be sent as it is (the shop's auto mode) */
};

struct ar_reply {
    char *text;           /* owned (ar_reply_clear); "" when there is no reply */
    enum ar_reply_source source;
    enum ar_reply_action action;
    bool needs_human;     /* route to a person (sensitive words, a repeating reply ...) */
    bool negative;        /* the review reads negative */
    float sentiment;      /* -1 (negative) .. 1 (positive) */
    char lang[8];         /* the reply's language */
    char model[64];
    char code[32];        /* "ok", or why it failed: "invalid_review", "review_id_conflict",
                             "overloaded", "backend_unavailable", ... */
    double latency_ms;
    int32_t attempts;     /* generations made */
    int64_t n_prompt_tokens, n_gen_tokens;
};

/* Answers rv (blocking). On failure out->code and err say why: AR_EINVAL (a bad or
 * conflicting review), AR_EBUSY (overloaded: retry), AR_EUNAVAIL (the store cannot be
 * reached), AR_EIO (internal). out is always left clearable. */
AR_API enum ar_status ar_reply_answer(struct ar_reply_service *svc, const struct ar_review *rv,
                                      struct ar_reply *out, struct ar_err *err);
AR_API void ar_reply_clear(struct ar_reply *r);

#ifdef __cplusplus
}
#endif
#endif
