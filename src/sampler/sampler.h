/* sampler.h - logits -> token id: penalties, greedy, temperature, top-k, top-p, min-p and a
 * seeded private PRNG; plus a helper that finds stop strings in streamed text.
 * The engine owns one sampler per sequence; a sampler is not thread-safe (one thread at a
 * time), distinct samplers may be used from different threads. */
#ifndef AR_SAMPLER_H
#define AR_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "autoreply.h"

struct sampler_params {
    float temperature;       /* <= 0: greedy argmax (ties -> lowest id) */
    int32_t top_k;           /* keep the k largest logits; 0 = off */
    float top_p;             /* nucleus, in [0, 1]; 1 = off; 0 keeps only the best token */
    float min_p;             /* drop tokens with p < min_p * p_max, in [0, 1]; 0 = off */
    float repeat_penalty;    /* > 0; 1 = off. Logit of a recent token: l > 0 ? l / r : l * r */
    float frequency_penalty; /* l -= count * frequency_penalty (count in the window) */
    float presence_penalty;  /* l -= presence_penalty if count > 0 */
    int32_t repeat_last_n;   /* penalty window in tokens, >= 0 (0 = penalties off) */
    uint64_t seed;           /* same seed + same inputs -> same tokens */
};

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, repeat_last_n 64,
 * seed 0. Thread-safe. */
struct sampler_params sampler_default_params(void);

struct sampler;

/* Returns a new sampler for a vocabulary of n_vocab tokens; the caller owns it
 * (sampler_destroy). All scratch memory is allocated here; sampling never allocates.
 * AR_EINVAL when a parameter is out of range (see sampler_params), AR_ENOMEM. */
enum ar_status sampler_create(const struct sampler_params *params, int32_t n_vocab,
                              struct sampler **out);
void sampler_destroy(struct sampler *s);

/* Forgets the token history and restarts the PRNG from params.seed. */
void sampler_reset(struct sampler *s);

/* Records a token in the penalty window: feed the prompt tokens, then every generated
 * token. AR_EINVAL (and nothing recorded) when token is not in [0, n_vocab). */
enum ar_status sampler_accept(struct sampler *s, int32_t token);
enum ar_status sampler_accept_many(struct sampler *s, const int32_t *tokens, size_t n);

/* Applies repeat, frequency and presence penalties for the tokens in the window to
 * logits (n_vocab) in place. sampler_sample does this itself on a private copy. */
void sampler_apply_penalties(struct sampler *s, float *logits);

/* Picks a token from logits (n_vocab, not modified). Order: penalties -> greedy if
 * temperature <= 0 -> top-k -> softmax(logits / temperature) -> top-p -> min-p ->
 * renormalise -> draw. Does not record the token (call sampler_accept).
 * O(n_vocab log top_k) at worst, about O(n_vocab) on real logits; top-p without top-k is
 * an expected-O(n_vocab) weighted quickselect. AR_EINVAL when a logit is NaN or +inf, or all are
 * -inf. */
enum ar_status sampler_sample(struct sampler *s, const float *logits, int32_t *out_token);

/* Like sampler_sample without the draw: the surviving candidates and their renormalised
 * probabilities, in no particular order (greedy: one token with probability 1).
 * Borrowed: *ids and *probs stay valid until the next call on s. */
enum ar_status sampler_probs(struct sampler *s, const float *logits, const int32_t **ids,
                             const float **probs, int32_t *n);

/* ---- stop strings ----------------------------------------------------------------------
 * Streaming use: keep a buffer of text not yet sent (the held-back tail plus each new
 * chunk) and pass it here. If found, send text[0, pos) and stop. Otherwise send
 * text[0, len - hold_len) and keep the last hold_len bytes: no stop string can start in
 * text already sent, so a stop split across chunks is still found. */
struct sampler_stop_match {
    bool found;
    size_t pos;        /* byte offset of the earliest match (found only) */
    size_t stop_index; /* which stop string matched (found only; first listed on a tie) */
    size_t hold_len;   /* not found: longest suffix of text that is a proper prefix of a
                          stop string; 0 when found */
};

/* stops: n_stops NUL-terminated strings; empty ones (and NULL) are ignored. Thread-safe. */
void sampler_stop_find(const char *text, size_t len, const char *const *stops, size_t n_stops,
                       struct sampler_stop_match *out);

#endif
