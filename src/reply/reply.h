/* reply.h - the review-reply product: shop profiles, sentiment, prompt building, guardrails,
 * the reply service (store -> cache -> model -> guardrails -> cache + store) and bulk jobs.
 * It knows no HTTP: a failed review carries an enum reply_error, and the front end (the HTTP
 * server's review endpoints, src/server/reviews.c; the CLI) decides what its client sees.
 *
 * The path of one review (reply_service_answer):
 *   1. validate (text 1..REPLY_TEXT_MAX bytes of valid UTF-8, rating 1..5, ids)
 *   2. the store already has (shop_id, review_id): return that row exactly as stored (reply,
 *      needs_human, sentiment, lang, model; the action from the stored rating and needs_human),
 *      no model call. A request whose text (normalized, normalize.h) differs from the stored
 *      review's text is a different review under a used id: REPLY_ECONFLICT
 * *   3. profile of the shop; review language; sentiment; needs_human
 *   4. reply cache (key: normalize.h, includes the shop): a hit never touches the model
 *   5. generate: system prompt of the shop + "评分：N星\n评价：..." user turn; the profile's
 *      candidates (greedy + sampled, submitted together) are checked (empty, repetition loop,
 *      language, banned words, length; a clause said twice is said once) and the best
 *      reply_candidate_score wins (the review's aspects named, tone, no repeated phrase); none
 *      passing: regenerated with another seed up to max_retries times, then a safe template
 *      reply. An aspect the winner misses gets a note; a winner that still repeats a phrase
 *      needs a human (never sent automatically) and is not cached
 *   6. signature, banned words stripped once more, cache put, store put (the stored row wins a
 *      race, so one review always has exactly one reply)
 *
 * Requests may carry a reply_call (below): generations are charged to the caller's token
 * budget (cache hits and stored replies cost nothing) and a client that goes away cancels
 * the generations in flight.
 *
 * Thread safety: profiles are immutable after load. A reply_service may be used from any
 * number of threads at once; its generator is called from those threads. */
#ifndef AR_REPLY_H
#define AR_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "engine/engine.h"
#include "metrics/metrics.h"
#include "queue/queue.h"
#include "store/store.h"
#include "tokenizer/tokenizer.h"
#include "cache/cache.h"

#define REPLY_TEXT_MAX 4096     /* review text limit in bytes; longer: REPLY_EINVAL */
#define REPLY_PRODUCT_MAX 256   /* product name limit in bytes */
#define REPLY_BATCH_MAX 256     /* reviews a front end takes in one batch request */
#define REPLY_JOB_LINES_MAX 100000
#define REPLY_WORDS_MAX 256     /* banned or sensitive words of one profile */

/* The demo model's default system prompt (models/MODEL_CARD.md), used verbatim. */
#define REPLY_DEFAULT_SYSTEM_PROMPT                                                              \
    "你是一家网店的客服，负责回复顾客的商品评价。回复要礼貌、真诚、简洁，使用与顾客相同的语言。"

/* ---- errors -------------------------------------------------------------------------------
 * Why a review (or a request of a front end) was not answered, in the product's own terms. The
 * front end decides what its client sees: the HTTP server maps each to a status
 * (server_status_of_reply_error, server.h). */

enum reply_error {
    REPLY_OK = 0,
    REPLY_EINVAL,     /* bad input: a field missing, malformed or out of range, or a review that
                         does not fit the model's context */
    REPLY_EDUPLICATE, /* the review id appears earlier in the same batch */
    REPLY_ECONFLICT,  /* the review id was answered before for another text or rating */
    REPLY_ELIMITED,   /* the caller's token budget is spent (reply_result.retry_after_s) */
    REPLY_ECANCELLED, /* the caller went away; nothing was stored */
    REPLY_EBUSY,      /* the model is overloaded or not loaded yet, or the worker queue is full */
    REPLY_EUNAVAIL,   /* a backend (store, cache, queue) cannot be reached now (AR_EUNAVAIL) */
    REPLY_ENOTFOUND,  /* no such job */
    REPLY_EINTERNAL,  /* out of memory, or a backend failed in another way */
    REPLY_ERROR_COUNT
};
/* A short description ("the review id appears earlier in the same batch"). Static, never
 * NULL (a value out of range: "unknown error"). */
const char *reply_error_str(enum reply_error e);
/* The stable code clients see in error bodies: "ok", "invalid_review", "duplicate_review_id",
 * "review_id_conflict", "rate_limit_exceeded", "cancelled", "overloaded", "backend_unavailable",
 * "not_found", "internal_error" (also for a value out of range). Static, never NULL. */
const char *reply_error_code(enum reply_error e);
/* The error of a failed backend call (store, cache, queue): AR_OK -> REPLY_OK, AR_EBUSY ->
 * REPLY_EBUSY, AR_EUNAVAIL -> REPLY_EUNAVAIL, AR_ECANCELED -> REPLY_ECANCELLED, any other
 * status -> REPLY_EINTERNAL (a backend refusing our own arguments is our fault, not the
 * client's). */
enum reply_error reply_error_of_backend(enum ar_status st);

/* ---- shop profiles ---------------------------------------------------------------------- */

enum reply_lang_policy {
    REPLY_LANG_SAME = 0, /* the review's language */
    REPLY_LANG_ZH,
    REPLY_LANG_EN
};

enum reply_mode {
    REPLY_MODE_OFF = 0, /* no reply is generated */
    REPLY_MODE_SUGGEST, /* generated and stored, never sent */
    REPLY_MODE_AUTO     /* sent when rating >= auto_min_rating (and not held for a human) */
};

struct reply_profile {
    char *shop_id;       /* owned; "" for the default profile */
    char *name;          /* owned, may be "" */
    char *persona;       /* owned or NULL: appended to the system prompt only when set */
    char *refund_policy; /* owned or NULL: appended to the system prompt only when set */
    char *signature;     /* owned or NULL: appended to every reply (after "\n") */
    char *system;        /* owned: the full system prompt (base + persona + policy) */
    char *system_base;   /* owned or NULL: the profile's "system_prompt" (NULL: the model
                            card's default) */
    enum reply_lang_policy lang_policy;
    int min_chars, max_chars; /* reply length bounds in code points (signature excluded) */
    char **banned;       /* owned, (n_banned): never in a reply (ASCII case-insensitive) */
    int n_banned;
    char **sensitive;    /* owned, (n_sensitive): in a review they force needs_human */
    int n_sensitive;
    enum reply_mode mode;
    int auto_min_rating;  /* auto mode: below this rating the reply is only suggested */
    bool hold_needs_human; /* auto mode: a needs_human reply is held (suggested), not sent */
    int candidates;       /* replies generated per review (1..8): the first greedy, the others
                             sampled, submitted together; the best score is kept (2) */
    bool aspect_notes;    /* a review aspect no candidate names gets a short note (true) */
};

struct reply_profiles;

/* Config file (JSON), every member optional:
 *   { "default": PROFILE,                   overrides the built-in default profile
 *     "shops": { "<shop_id>": PROFILE, ... } }  each starts from the default profile
 * PROFILE: { "name": str, "persona": str, "system_prompt": str (replaces the base prompt),
 *   "lang": "same"|"zh"|"en", "min_chars": int, "max_chars": int, "refund_policy": str,
 *   "banned_words": [str], "sensitive_words": [str], "signature": str,
 *   "mode": "off"|"suggest"|"auto", "auto_min_rating": 1..5, "hold_needs_human": bool,
 *   "candidates": 1..8, "aspect_notes": bool }
 * Unknown members, wrong types and out-of-range values are errors (AR_EFORMAT, with the
 * member named in err), so a typo never silently falls back to a default.
 * The built-in default: the model card's system prompt verbatim, lang "same", 2..300
 * characters, no banned words, sensitive words 假货 诈骗 过敏 投诉 起诉 报警 律师 fake scam
 * fraud allergic lawyer lawsuit, mode "suggest", auto_min_rating 4, hold_needs_human true,
 * candidates 2, aspect_notes true. */
enum ar_status reply_profiles_parse(const char *json, size_t len, struct reply_profiles **out,
                                    struct ar_err *err);
/* Reads and parses path (AR_EIO when it cannot be read). */
enum ar_status reply_profiles_load(const char *path, struct reply_profiles **out,
                                   struct ar_err *err);
/* Only the built-in default profile. */
enum ar_status reply_profiles_default(struct reply_profiles **out);
void reply_profiles_destroy(struct reply_profiles *ps);
/* The shop's profile, or the default one for a shop the file does not name. Borrowed. */
const struct reply_profile *reply_profiles_get(const struct reply_profiles *ps,
                                               const char *shop_id);
int reply_profiles_count(const struct reply_profiles *ps); /* named shops */
/* The i-th named shop's profile (0 <= i < reply_profiles_count), in shop_id order; borrowed. */
const struct reply_profile *reply_profiles_at(const struct reply_profiles *ps, int i);

/* One shop's profile from a PROFILE object (the config file's format above), starting from
 * ps's default profile as the file's shops do; a member "shop_id" is allowed when it equals
 * shop_id. Errors as reply_profiles_parse, the member named as "shop.<member>". The caller
 * owns *out (reply_profile_destroy). */
enum ar_status reply_profile_from_json(const struct reply_profiles *ps, const char *shop_id,
                                       const cJSON *o, struct reply_profile **out,
                                       struct ar_err *err);
void reply_profile_destroy(struct reply_profile *p);
/* The profile as a PROFILE object plus "shop_id" (what reply_profile_from_json reads back to
 * the same profile); NULL when out of memory. */
cJSON *reply_profile_to_json(const struct reply_profile *p);

/* ---- sentiment ------------------------------------------------------------------------- */

enum reply_sentiment { REPLY_SENT_NEGATIVE = -1, REPLY_SENT_NEUTRAL = 0, REPLY_SENT_POSITIVE = 1 };
const char *reply_sentiment_str(enum reply_sentiment s); /* "negative", ... */

/* Lexicon score of the text alone (zh or en word lists, negation, contrast clauses): > 0
 * positive, < 0 negative, 0 when no cue word is found. lang NULL: guessed. Thread-safe. */
float reply_sentiment_lexicon(const char *text, size_t len, const char *lang);
/* Text and rating together: score in [-1, 1] (0.6 * rating part + 0.4 * text part), label
 * by +-0.15. rating 0 means unknown (text only). */
enum reply_sentiment reply_sentiment_classify(const char *text, size_t len, const char *lang,
                                              int rating, float *score);
/* The label of a score: positive above 0.15, negative below -0.15, else neutral. */
enum reply_sentiment reply_sentiment_label(float score);

/* ---- prompt ---------------------------------------------------------------------------- */

/* Review text as it goes into the user turn: chat control markup ("<|im_start|>", "<|...|>",
 * "<s>", "</s>", "[INST]", "<<SYS>>" ...) removed, newlines and tabs turned into spaces,
 * surrounding spaces trimmed. *out is new (ar_free). */
enum ar_status reply_sanitize_review(const char *text, size_t len, char **out, size_t *out_len);
/* The user turn in the demo model's trained format: "评分：N星\n评价：TEXT" for lang "zh",
 * "Rating: N stars\nReview: TEXT" otherwise, TEXT sanitized and clipped to 300 code points (the
 * demo model was trained on reviews of at most 160). *out is new (ar_free). */
enum ar_status reply_user_message(const char *text, size_t len, int rating, const char *lang,
                                  char **out);

/* ---- guardrails ------------------------------------------------------------------------ */

enum reply_guard {
    REPLY_GUARD_OK = 0,
    REPLY_GUARD_EMPTY,
    REPLY_GUARD_REPEAT,   /* a repetition loop */
    REPLY_GUARD_LANG,     /* not in the wanted language */
    REPLY_GUARD_BANNED,   /* holds a banned word */
    REPLY_GUARD_SHORT,    /* fewer than min_chars */
    REPLY_GUARD_LONG,     /* more than max_chars and no sentence boundary to cut at */
    REPLY_GUARD_COUNT
};
const char *reply_guard_str(enum reply_guard g); /* "ok", "empty", ... */

size_t reply_utf8_count(const char *s, size_t len); /* code points (valid UTF-8) */

/* Index of the first banned word found in text (ASCII case-insensitive), or -1. */
int reply_find_word(const char *text, size_t len, char *const *words, int n_words);
/* Copy of text with every occurrence of every word removed (repeated until none is left).
 * *out is new (ar_free). */
enum ar_status reply_strip_words(const char *text, size_t len, char *const *words, int n_words,
                                 char **out, size_t *out_len);
/* True for a repetition loop: a unit of 2+ code points repeated 3+ times in a row (one code
 * point: 5+ times, punctuation and digits excluded), or one 6-code-point n-gram (zh; 3-word n-gram in
 * text without CJK) occurring 3+ times anywhere. */
bool reply_is_repetitive(const char *text, size_t len);
/* Whether text is in lang: "zh" needs CJK ideographs and no more Latin letters than half of
 * them; "en" needs Latin letters and no CJK ideograph. */
bool reply_lang_ok(const char *text, size_t len, const char *lang);
/* Length in bytes of the longest prefix of text that ends at a sentence end (。！？!?.~…；;
 * and a closing quote after them) and holds at most max_chars code points; 0 if none. */
size_t reply_cut_sentence(const char *text, size_t len, int max_chars);
/* Checks a generated reply against the profile and language. Trims spaces; a reply over
 * max_chars is cut at a sentence boundary when one keeps at least min_chars (then OK). On OK
 * *fixed (may be NULL) receives the final text (new, ar_free). */
enum reply_guard reply_guard_check(const struct reply_profile *p, const char *lang,
                                   const char *text, size_t len, char **fixed);
/* A safe template reply in lang ("zh"/"en"), apologetic when negative. Static string. */
const char *reply_fallback_text(const char *lang, bool negative);

/* ---- quality: aspects, repetition, the candidate score (quality.c) ----------------------
 * The points a review raises and whether a reply answers them, from phrase tables per aspect
 * (Chinese and English). The pipeline generates several candidates and keeps the best score. */

enum reply_aspect {
    REPLY_ASPECT_DELIVERY = 0, /* logistics, delivery speed, the courier */
    REPLY_ASPECT_PACKAGING,
    REPLY_ASPECT_QUALITY,      /* the product's quality, defects, how well it works */
    REPLY_ASPECT_SIZE,         /* size and fit */
    REPLY_ASPECT_TASTE,
    REPLY_ASPECT_PRICE,
    REPLY_ASPECT_SERVICE,      /* the shop's or the courier's attitude, after-sales */
    REPLY_ASPECT_FRESHNESS,
    REPLY_ASPECT_PORTION,      /* takeaway portion size */
    REPLY_ASPECT_HYGIENE,      /* a hair, a bug, dirt */
    REPLY_ASPECT_AUTHENTIC,    /* genuine or fake goods */
    REPLY_ASPECT_ORDER,        /* missing or wrong items */
    REPLY_ASPECT_COUNT
};
const char *reply_aspect_str(enum reply_aspect a); /* "delivery", ...; "unknown" */
/* Bit (1u << aspect) for each aspect the review raises / the reply names. Thread-safe. */
unsigned reply_aspects_of_review(const char *text, size_t len);
unsigned reply_aspects_of_reply(const char *text, size_t len);

enum reply_repeat {
    REPLY_REPEAT_NONE = 0,
    REPLY_REPEAT_CLAUSE, /* two clauses (split at ，。！？、；, . ! ? ; ~ and newlines) are the
                            same, e.g. "谢谢您对我们包装的认可，谢谢您对我们包装的认可" */
    REPLY_REPEAT_NGRAM   /* two clauses share a run of 4 CJK characters or 3 English words */
};
/* Whether a reply repeats itself across clauses (first 1024 code points). Thread-safe. */
enum reply_repeat reply_find_repeat(const char *text, size_t len);
const char *reply_repeat_str(enum reply_repeat r); /* "none", "clause", "ngram" */

/* text without the clauses that repeat an earlier clause exactly (as reply_find_repeat compares
 * them), each dropped clause's end mark taking the place of the one before it:
 * "谢谢您对我们包装的认可，谢谢您对我们包装的认可。欢迎再来！" -> "谢谢您对我们包装的认可。欢迎再来！".
 * Shared n-grams are left alone (no safe cut). *out new (ar_free). */
enum ar_status reply_drop_repeated_clauses(const char *text, size_t len, char **out);

/* A candidate reply judged against the review. */
struct reply_score {
    float total;         /* higher is better */
    unsigned named;      /* aspects the reply names */
    int wanted, covered; /* aspects the review raises; of them, named by the reply */
    int extra;           /* aspects named that the review did not raise */
    bool lang_ok, banned, length_ok, tone_ok;
    enum reply_repeat repeat;
};
/* Scores text as a reply in lang to a review of this rating raising review_aspects: language
 * or banned word or length (p's bounds; p may be NULL) wrong: -1000 each; a repeat: -100;
 * +10 per aspect named, -2 per aspect named that the review did not raise; +3 for a tone that
 * fits the rating (an apology at 1-2 stars, thanks and no apology at 4-5). out may be NULL. */
float reply_candidate_score(const struct reply_profile *p, const char *lang, int rating,
                            unsigned review_aspects, const char *text, size_t len,
                            struct reply_score *out);
/* text with one short sentence naming the aspects of missing (at most max_notes of them, in
 * aspect order, as many as keep the reply within max_chars code points; 0: no bound), put
 * before the reply's last sentence (its closing) and worded for the rating: at 1-2 stars
 * "配送和包装方面的问题已经记下，会尽快跟进处理。", at 4-5 "关于配送和包装，您说的我们都记下了。"
 * (English alike). A second wording is tried when the first would repeat the reply's own
 * words (reply_find_repeat); when both would, or no note fits, *out is text unchanged. *out
 * new (ar_free). */
enum ar_status reply_add_aspect_notes(const char *text, size_t len, const char *lang, int rating,
                                      unsigned missing, int max_notes, int max_chars, char **out);

/* ---- one request's control: token budget and cancellation -------------------------------
 * A front end makes one reply_call per request (the HTTP server: per HTTP request) and passes
 * it to reply_service_answer_call / reply_service_answer_many_call. Generators use it to charge the
 * tokens they process to the caller and to register how to stop an engine request when the caller
 * goes away. Every function is thread-safe and accepts a NULL call (no budget, never cancelled). */

/* Charges n_tokens to the caller. admission true: refuse (return false, *retry_after_s set)
 * when the caller's budget cannot take the tokens now, charging nothing; admission false:
 * always charge (the budget may go into debt) and return true. The HTTP server passes its
 * per-client token bucket (server_req_charge_tokens). */
typedef bool (*reply_charge_fn)(void *user, int64_t n_tokens, bool admission,
                                double *retry_after_s);

struct reply_call;
/* charge may be NULL (nothing is charged). The caller owns *out (reply_call_destroy), which
 * must outlive every use by the request it was given to. */
enum ar_status reply_call_create(reply_charge_fn charge, void *user, struct reply_call **out);
void reply_call_destroy(struct reply_call *c);
/* The caller went away: every generation in flight for the call is stopped through its hook
 * (engine_cancel: its KV is freed) and later ones are not started; the request ends with
 * REPLY_ECANCELLED and stores nothing. Quick; idempotent; callable from any
 * thread (e.g. the server's abort hook). */
void reply_call_cancel(struct reply_call *c);
bool reply_call_cancelled(struct reply_call *c);
/* Tokens charged so far (admitted prompts plus generated tokens). */
int64_t reply_call_tokens(struct reply_call *c);
/* The largest wait a refused admission asked for (0: none was refused). */
double reply_call_retry_after(struct reply_call *c);

/* For generators. Charges through the call's charge function (see reply_charge_fn); true when
 * charged. */
bool reply_call_charge(struct reply_call *c, int64_t n_tokens, bool admission,
                       double *retry_after_s);
/* A way to stop one generation in flight: fn(arg) is called (with the call's lock held: it
 * must be quick and must not use the call) when the call is cancelled while the hook is
 * registered. */
struct reply_call_hook {
    void (*fn)(void *arg);
    void *arg;
    struct reply_call_hook *prev, *next; /* private */
};
/* Registers h (owned by the caller, e.g. on its stack); false, without registering, when the
 * call is cancelled already. reply_call_unwatch must follow before h goes away; after it
 * returns fn is not running and will not run. */
bool reply_call_watch(struct reply_call *c, struct reply_call_hook *h);
void reply_call_unwatch(struct reply_call *c, struct reply_call_hook *h);

/* ---- generator --------------------------------------------------------------------------- */

/* What a generation used, filled by the generator (which adds to the counts). */
struct reply_gen_usage {
    int64_t n_prompt, n_gen; /* prompt tokens charged and tokens generated */
    bool limited;            /* the caller's token budget refused the prompt (then AR_EBUSY) */
    double retry_after_s;    /* with limited: when the budget can take it */
};

struct reply_gen_request {
    const char *system; /* system prompt (stable per shop: the engine's prefix cache serves it) */
    const char *user;   /* user turn (reply_user_message) */
    int max_tokens;
    float temperature;  /* <= 0: greedy */
    uint64_t seed;
    enum engine_priority priority;
    double timeout_s;
    struct reply_call *call;       /* may be NULL: the request's budget and cancellation */
    bool admission;                /* the first attempt of a review: the prompt must fit the
                                      caller's budget (reply_call_charge with admission);
                                      regenerations are charged without asking */
    struct reply_gen_usage *usage; /* may be NULL: receives what was used */
};

/* Produces a reply for a chat prompt. Blocking; called from many threads at once. *text is
 * new (ar_free). AR_EBUSY when the model is overloaded (the review ends with REPLY_EBUSY) or
 * the caller's token budget refused the prompt (usage->limited; REPLY_ELIMITED);
 * AR_ECANCELED when r->call was cancelled (checked before starting, and a generation in
 * flight is stopped through a reply_call_hook). A generator charges the prompt tokens before
 * it runs (r->admission: asking) and the generated tokens after. */
struct reply_generator {
    enum ar_status (*generate)(struct reply_generator *g, const struct reply_gen_request *r,
                               char **text, size_t *len);
    void (*destroy)(struct reply_generator *g);
    const char *model_name;
};

/* The generator over the serving engine (engine and tok borrowed, must outlive it): the
 * prompt is the model's chat template (reply_prompt_tokens) submitted with on_done waiting
 * on a condition variable; the call's cancel hook is engine_cancel. Charges the whole prompt
 * (cached prefix included, like the OpenAI routes) and the generated tokens. model_name is
 * copied. The caller owns *out (reply_generator_destroy). */
enum ar_status reply_engine_generator(struct engine *e, const struct tokenizer *tok,
                                      const char *model_name, struct reply_generator **out);
void reply_generator_destroy(struct reply_generator *g);

/* Token ids of the chat prompt: system turn, user turn, then the assistant opening (ChatML:
 * "<|im_start|>assistant\n"). Template markup is encoded with special-token parsing, the user
 * turn's text (and the system text) without it, split exactly where the whole prompt would
 * split at special tokens, so the ids equal encoding the whole formatted prompt when the texts
 * hold no special-token text. *ids is new (ar_free). */
enum ar_status reply_prompt_tokens(const struct tokenizer *tok, const char *system,
                                   const char *user, int32_t **ids, int64_t *n);

/* ---- the service ------------------------------------------------------------------------ */

struct reply_service_params {
    const struct reply_profiles *profiles; /* borrowed, required */
    struct store *store;                   /* borrowed, required */
    /* The reply cache, one per traffic class so that bulk work cannot evict what customers
     * hit: interactive requests (ENGINE_PRIO_INTERACTIVE) look up and insert into cache;
     * bulk ones (ENGINE_PRIO_BULK: job lines) look up cache read-only (CACHE_GET_READ_ONLY),
     * then bulk_cache, and insert into bulk_cache only. */
    struct cache *cache;                   /* borrowed; NULL: no interactive reply cache */
    struct cache *bulk_cache;              /* borrowed; NULL: bulk replies are not cached
                                              (bulk work still reads cache); the same as cache:
                                              one budget for both (as before classes) */
    struct metrics_registry *metrics;      /* borrowed; NULL: no metrics */
    struct reply_generator *gen;           /* borrowed; NULL: set later (until then
                                              REPLY_EBUSY) */
    int max_retries;         /* regenerations after a failed check (2) */
    float temperature;       /* first attempt (0: greedy, the model card's advice) */
    float retry_temperature; /* retries sample with another seed (0.7) */
    uint64_t seed;           /* seed of the first attempt; retry i uses seed + i (1234) */
    int max_tokens;          /* 160 */
    double timeout_s;        /* per generation (60) */
    int n_workers;           /* threads for batches, jobs and async requests (8) */
    int queue_max;           /* tasks waiting for a worker (256); beyond: reply_service_submit
                                says AR_EBUSY */
    /* A new review is claimed in the store before it is generated, so that of the requests
     * for it (on this instance or any other sharing the store) one generates and the others
     * wait (up to timeout_s) for its stored reply. Instances sharing a store need distinct,
     * stable names: reply_service_create ends the claims that a previous run under the same
     * name left (a crash), so that their reviews need not wait for the leases. */
    const char *instance;    /* borrowed; this instance's name in claims (NULL: the host's) */
    double claim_lease_s;    /* a claim outlives a dead owner this long (15); a live owner
                                renews its claims every claim_lease_s / 3 */
    struct queue *queue;     /* borrowed: the job-line queue (RabbitMQ for a fleet); NULL: the
                                service makes an in-process one (one process, as before). It
                                must outlive the service. */
    int job_slots;           /* job lines this instance answers at once, which is also how
                                many queue messages it holds (its prefetch): the bulk share of
                                the engine's batch, e.g. its n_seq_max (0: n_workers) */
    double job_sweep_s;      /* how often unfinished jobs whose lines were never queued are
                                looked for and queued (10; 0: 10); a job gets 3 periods of
                                grace */
    int webhook_tries;       /* attempts at a job's completion callback (4; 0: 4) */
    double webhook_backoff_s; /* pause after the first failed attempt, doubling after each
                                 (1; 0: 1) */
    double webhook_timeout_s; /* one attempt's time limit: connect, send, status line (5) */
};
struct reply_service_params reply_service_default_params(void);

struct reply_service;
enum ar_status reply_service_create(const struct reply_service_params *p,
                                    struct reply_service **out);
/* Stops the job runner and the workers (waiting for requests in progress), then frees. */
void reply_service_destroy(struct reply_service *svc);
/* Sets (or replaces) the generator; borrowed. Thread-safe. */
void reply_service_set_generator(struct reply_service *svc, struct reply_generator *gen);

/* One review. Strings borrowed. */
struct reply_review {
    const char *shop_id;
    const char *review_id;
    const char *text;
    size_t text_len;
    int rating;
    const char *product; /* may be NULL; validated and accepted, not used by the demo prompt */
    const char *lang;    /* review language "zh"/"en"; NULL: guessed */
};

/* Fills rv from a JSON object {shop_id, review_id, text, rating, product?, lang?} (strings
 * borrowed from j). shop_id may be missing when default_shop is given. A review without
 * "review_id" takes its "id" (a string) instead, as data files of reviews name it (the same
 * for single reviews, batch items and job lines); both may be given when they are equal (two
 * different ones are an error: which one was meant cannot be known). On a bad field
 * returns AR_EINVAL and a message (naming the field) in msg. */
enum ar_status reply_review_from_json(const cJSON *j, const char *default_shop,
                                      struct reply_review *rv, char *msg, size_t msg_size);

enum reply_source {
    REPLY_SOURCE_MODEL = 0, /* generated now */
    REPLY_SOURCE_CACHE,     /* reply cache hit */
    REPLY_SOURCE_STORE,     /* already answered (idempotent replay) */
    REPLY_SOURCE_FALLBACK,  /* every generation failed the checks: template reply */
    REPLY_SOURCE_OFF        /* the shop's reply mode is off */
};
const char *reply_source_str(enum reply_source s);

enum reply_action { REPLY_ACTION_NONE = 0, REPLY_ACTION_SUGGEST, REPLY_ACTION_SEND };
const char *reply_action_str(enum reply_action a);

struct reply_result {
    enum reply_error err; /* REPLY_OK, or why the review was not answered */
    char error[200];      /* err != REPLY_OK: what went wrong, for people */
    double retry_after_s; /* REPLY_ELIMITED: when the budget can take the review (seconds) */
    char *reply;       /* owned (ar_free); "" in mode off */
    bool cached;       /* came from the reply cache or the store, not the model */
    enum reply_source source;
    bool needs_human;
    enum reply_action action;
    enum reply_sentiment sentiment;
    float sentiment_score;
    char lang[8];      /* the reply's language */
    char model[64];
    double latency_ms;
    int attempts;      /* generations made for this request */
    int64_t n_prompt_tokens, n_gen_tokens; /* what the generations used (0: cache, store) */
};
void reply_result_fini(struct reply_result *r);
/* {review_id?, reply, cached, needs_human, sentiment, lang, model, latency_ms, source, action,
 *  sentiment_score} or {review_id?, error: {message, code}} (code: reply_error_code; the HTTP
 * server shapes its error items itself, server_review_result_json). NULL when out of memory.
 * action: "none" (mode off: no reply), "suggest" (for a person to review and send), "send" (mode
 * auto, rating >= auto_min_rating and not held because needs_human). A stored answer (source
 * "store") carries the stored fields; its action is decided from the stored rating and needs_human
 * under the shop's profile now. */
cJSON *reply_result_to_json(const struct reply_result *r, const char *review_id);

/* Answers one review (blocking). Never fails as a call: errors are in out->err. */
void reply_service_answer(struct reply_service *svc, const struct reply_review *rv,
                          enum engine_priority prio, struct reply_result *out);
/* The same on behalf of a caller (call may be NULL). */
void reply_service_answer_call(struct reply_service *svc, const struct reply_review *rv,
                               enum engine_priority prio, struct reply_call *call,
                               struct reply_result *out);

/* What a later review with the same (shop_id, review_id) as an earlier one of the same call
 * gets: REPLY_DUP_ERROR: REPLY_EDUPLICATE (the batch endpoint); REPLY_DUP_SAME: the stored
 * reply, answered after the first one finished (jobs; REPLY_ECONFLICT when its text
 * differs). */
enum reply_dup_policy { REPLY_DUP_ERROR, REPLY_DUP_SAME };
/* Answers n reviews concurrently (up to n_workers at once, so the engine batches them);
 * out[i] for rv[i]. Blocking. */
void reply_service_answer_many(struct reply_service *svc, const struct reply_review *rv,
                               size_t n, enum engine_priority prio, enum reply_dup_policy dup,
                               struct reply_result *out);
/* The same on behalf of a caller (call may be NULL): once it is cancelled, the reviews that
 * still need the model end with REPLY_ECANCELLED at once (stored and cached ones are still
 * answered). */
void reply_service_answer_many_call(struct reply_service *svc, const struct reply_review *rv,
                                    size_t n, enum engine_priority prio,
                                    enum reply_dup_policy dup, struct reply_call *call,
                                    struct reply_result *out);

/* ---- jobs ---------------------------------------------------------------------------------
 * A job is a list of reviews stored line by line (store.h) before its id is returned, so a
 * crash loses nothing accepted. Then one message per line ({"job_id", "line", "shop_id"}; the
 * input stays in the store, which is the truth) goes to the service's queue and the job is
 * marked published. Every instance that runs reply_jobs_start consumes that queue: it answers
 * each line at ENGINE_PRIO_BULK (interactive requests go first), stores the line's result, and
 * only then acks the message, so a consumer that dies mid-line (kill -9) leaves its messages to
 * be redelivered to another. A message for a line that is no longer pending (a redelivery, a
 * duplicate publish) or of a finished or cancelled job is acked without work; while the store
 * cannot be reached a message is nacked (requeued) after a backoff, never acked. Replies are
 * stored once per (shop_id, review_id), so redeliveries never make a second reply: each line
 * gets exactly one result. A line that is not a valid review becomes a per-line error; the job
 * goes on. Lines are objects as for reply_review_from_json ("id" stands for a missing
 * "review_id"). Jobs run in the background, on no caller's token budget.
 *
 * When the queue cannot take the lines (broker down, in-process queue full), creation still
 * succeeds (the client gets 202 and its job id: answering 503 would make it upload the job
 * again, a second job, since the first is stored already); the job stays unpublished and a
 * sweeper on every instance queues the pending lines of jobs left unpublished for
 * 3 * job_sweep_s. With the in-process queue (not durable), the runner also queues the pending
 * lines of every unfinished job when it starts: a previous process's queue died with it. */

/* Creates a job from a body: a JSON array of review objects (the body's first non-blank byte
 * is '['), or raw JSONL text (one object per line; blank lines skipped, line numbers are the
 * body's; a body that is one object is a job of one review). Malformed lines are accepted and turn
 * into per-line errors when the job runs. AR_EINVAL (msg in err) for an empty body or more
 * than REPLY_JOB_LINES_MAX lines. default_shop (may be NULL) is the shop of lines without
 * one. */
enum ar_status reply_job_create(struct reply_service *svc, const char *default_shop,
                                const char *body, size_t len, char job_id[STORE_JOB_ID_LEN + 1],
                                int64_t *n_lines, struct ar_err *err);
/* The same from a parsed JSON array (MessagePack bodies). */
enum ar_status reply_job_create_json(struct reply_service *svc, const char *default_shop,
                                     const cJSON *array, char job_id[STORE_JOB_ID_LEN + 1],
                                     int64_t *n_lines, struct ar_err *err);

/* ---- the jobs API (POST /v1/jobs): strict creation, owners and quotas ---------------------- */

#define REPLY_JOB_BAD_MAX 5 /* bad lines named in a refusal */

/* How reply_job_submit creates a job (strings borrowed). */
struct reply_job_opts {
    const char *default_shop; /* the shop of lines without one; NULL: "default" */
    const char *owner;        /* who creates it (an API key's identity, a client address);
                                 NULL: "" */
    const char *callback_url; /* http://host[:port]/path POSTed the job's summary once when it
                                 is done (retried with backoff); NULL: none */
    bool per_line_errors;     /* bad lines become error results at once and the rest runs
                                 (else one bad line refuses the whole job) */
    int64_t max_open_jobs;    /* owner's queued or running jobs allowed, this one included;
                                 0: no limit */
    int64_t max_bytes;        /* owner's stored job bytes allowed, this one included; 0: none */
};

enum reply_job_refusal {
    REPLY_JOB_ACCEPTED = 0,
    REPLY_JOB_BAD_BODY,      /* not a job at all (empty, not JSON, too many lines): err says */
    REPLY_JOB_BAD_LINES,     /* some lines are not reviews: bad[] names the first ones */
    REPLY_JOB_TOO_MANY_OPEN, /* the owner has max_open_jobs unfinished jobs already */
    REPLY_JOB_TOO_LARGE      /* the owner's stored bytes would pass max_bytes */
};

struct reply_job_bad_line {
    int64_t line;  /* 1-based: the body's line (JSONL) or the array's element */
    char why[160]; /* what is wrong with it */
};

struct reply_job_outcome {
    char id[STORE_JOB_ID_LEN + 1]; /* the new job (accepted) */
    int64_t n_lines;               /* lines stored */
    int64_t n_invalid;             /* bad lines (refused, or recorded as errors) */
    enum reply_job_refusal refused;
    struct reply_job_bad_line bad[REPLY_JOB_BAD_MAX];
    size_t n_bad;                  /* of n_invalid, named in bad[] */
    int64_t open_jobs, bytes;      /* the owner's usage before this job (quota refusals) */
    int64_t job_bytes;             /* this job's bytes */
};

/* Checks every line of a job, then stores it for opts->owner within its quota and queues it.
 * The body is JSONL text (jsonl, len: one object per line, blank lines skipped) or a parsed
 * JSON array (array; jsonl NULL). A line is bad when it has a NUL, is not JSON, not an object,
 * or not a review (reply_review_from_json). AR_OK: accepted (out->id); AR_EINVAL: refused,
 * out->refused says why (err has a message); another status: the store failed. */
enum ar_status reply_job_submit(struct reply_service *svc, const struct reply_job_opts *opts,
                                const char *jsonl, size_t len, const cJSON *array,
                                struct reply_job_outcome *out, struct ar_err *err);

/* Checks a completion callback URL: http://host[:port][/path], at most STORE_URL_MAX bytes.
 * False with why (size n) filled otherwise. */
bool reply_callback_url_ok(const char *url, char *why, size_t n);

/* POSTs a JSON body to an http:// URL (reply_callback_url_ok) with a plain HTTP/1.1 client:
 * *status receives the answer's status. AR_EINVAL for a bad URL, AR_EUNAVAIL when the host
 * cannot be reached or did not answer within timeout_s, AR_EFORMAT for a broken answer. */
enum ar_status reply_http_post_json(const char *url, const char *body, size_t len,
                                    double timeout_s, int *status, struct ar_err *err);

/* Appends one line of a job's results (as reply_job_results_jsonl writes it, with its
 * newline) to b; a pending line of a cancelled job reads {"line", "status": "cancelled"}.
 * False when out of memory. */
bool reply_job_result_line(struct ar_buf *b, const struct store_item *it,
                           enum store_job_status job_status);

/* The service's store (borrowed): what the jobs API lists, cancels and deletes. */
struct store *reply_service_store(struct reply_service *svc);

/* Called after each chunk of lines (from the running thread). */
typedef void (*reply_job_progress_fn)(void *user, const struct store_job_info *info);
/* Runs a job's pending lines to the end in the calling thread. AR_ECANCELED when the service
 * is stopping; AR_EINVAL for an unknown job. */
enum ar_status reply_job_run(struct reply_service *svc, const char *job_id,
                             reply_job_progress_fn progress, void *user, struct ar_err *err);
/* One finished line of a job, as its results show it (reply_job_results_jsonl): json is the
 * line's result object (it carries "line") or {"line", "error"}, without a newline; error is
 * the message of an error line, NULL for a done one. Both borrowed for the call. */
typedef void (*reply_job_line_fn)(void *user, int64_t line, const char *json, const char *error);
/* reply_job_run that also calls line (may be NULL) for every line as soon as its result is
 * stored, in the order they finish (line order but for lines retried after a busy pass), so
 * that a caller can write results out as they come (the CLI's batch). */
enum ar_status reply_job_run_lines(struct reply_service *svc, const char *job_id,
                                   reply_job_progress_fn progress, reply_job_line_fn line,
                                   void *user, struct ar_err *err);
/* Starts consuming the job queue in the background: a consumer thread holding at most
 * job_slots messages (its prefetch), job_slots line workers, and the sweeper, which also keeps
 * the gauge autoreply_job_items_pending (pending lines of unfinished jobs, from the store: the
 * same on every instance) up to date every few seconds. Stopped by reply_service_destroy, which
 * lets the lines in progress finish and gives the rest back to the queue. */
enum ar_status reply_jobs_start(struct reply_service *svc);

/* {id, status, total, done, failed, pending, created, updated, shop_id, bytes,
 * callback_url?}. */
cJSON *reply_job_info_to_json(const struct store_job_info *info);
/* All lines as JSONL in line order: a done line's result object (it carries "line"), an error
 * {"line", "error"}, a pending one {"line", "status": "pending"}. *out new (ar_free). AR_EINVAL
 * for an unknown job. */
enum ar_status reply_job_results_jsonl(struct reply_service *svc, const char *job_id,
                                       char **out, size_t *len, struct ar_err *err);
/* Calls fn for every finished line (done or error) in line order, skipping pending ones (what
 * a resumed run has already). fn must not call into the service. AR_EINVAL for an unknown
 * job. */
enum ar_status reply_job_results_each(struct reply_service *svc, const char *job_id,
                                      reply_job_line_fn fn, void *user, struct ar_err *err);

/* ---- the review workflow ------------------------------------------------------------------
 * Every stored reply has a status (store.h): "send" answers are stored sent, "suggest" ones
 * pending. A person then approves (optionally with an edited reply), rejects or regenerates
 * it; the front end (src/server/workflow.c) changes the store, the service regenerates. */

/* Whether a person's edited reply may be approved for the shop of p: not empty, at most
 * REPLY_TEXT_MAX bytes, no banned word of the shop. False with why (size n) filled. */
bool reply_check_edit(const struct reply_profile *p, const char *text, char *why, size_t n);

/* A new draft for a stored review: the model again with a fresh seed (never the reply cache or
 * the stored answer), the shop's profile now, the guardrails and the signature, stored as
 * pending with an audit entry (action "regenerate", key) if the review's status did not change
 * meanwhile. r->err: REPLY_ENOTFOUND (no such review), REPLY_ECONFLICT (sent already, or
 * changed during the generation), or what generation gives; on REPLY_OK *row (the caller owns
 * it: store_reply_fini) is the row now stored. */
void reply_service_regenerate(struct reply_service *svc, const char *shop_id,
                              const char *review_id, const char *key, struct reply_call *call,
                              struct store_reply *row, struct reply_result *r);

/* ---- shop profiles saved through the API ----------------------------------------------------
 * A profile saved with reply_service_put_shop is kept in the store (durable, shared by every
 * instance on the same database) and replaces the config file's profile of that shop: on this
 * instance at once, on the others within REPLY_SHOP_REFRESH_S seconds (each re-reads a shop's
 * stored profile at most that often). */
#define REPLY_SHOP_REFRESH_S 5.0

/* The profile reviews of shop_id are answered with now (borrowed, lives as long as svc). */
const struct reply_profile *reply_service_profile(struct reply_service *svc,
                                                  const char *shop_id);
/* Validates profile (reply_profile_from_json: AR_EFORMAT/AR_EINVAL with the member named in
 * err), stores it and uses it from now on; *out (may be NULL; cJSON_Delete) receives the
 * profile as reply_profile_to_json shows it, with "source": "store". Other statuses: the
 * store failed. */
enum ar_status reply_service_put_shop(struct reply_service *svc, const char *shop_id,
                                      const cJSON *profile, cJSON **out, struct ar_err *err);
/* The profile of shop_id read now (reply_profile_to_json) with "source": "store" (saved
 * through the API), "config" (the config file's) or "default" (neither names the shop). */
enum ar_status reply_service_get_shop(struct reply_service *svc, const char *shop_id,
                                      cJSON **out, struct ar_err *err);
/* Every shop the config file names or the store keeps, in shop_id order, as
 * reply_service_get_shop shows them: a new JSON array. */
enum ar_status reply_service_list_shops(struct reply_service *svc, cJSON **out,
                                        struct ar_err *err);

/* ---- for front ends ------------------------------------------------------------------------ */

/* Queues fn(arg) on the service's worker pool (n_workers threads), so that a front end's own
 * thread (an HTTP event loop) is never blocked by the model or the database. AR_EBUSY when
 * queue_max tasks wait already or the service is stopping, AR_ENOMEM; fn is then not
 * called. */
enum ar_status reply_service_submit(struct reply_service *svc, void (*fn)(void *arg), void *arg);
/* A job's state. *found false (and AR_OK) for an unknown job; a backend error otherwise. */
enum ar_status reply_job_get(struct reply_service *svc, const char *job_id,
                             struct store_job_info *info, bool *found, struct ar_err *err);

#endif
