/* sampler.c - turns one row of logits into a token id. Each call works on a candidate
 * array allocated once at create; filters narrow it without a full sort: a bounded heap for
 * top-k, a weighted quickselect for top-p, a scan for min-p, all on one total order. */
#include "sampler.h"

#include <math.h>

#include "base/base.h"

struct cand {
    float v;    /* logit, then probability after the softmax */
    int32_t id; /* token id */
};

struct sampler {
    struct sampler_params params;
    int32_t n_vocab;
    uint64_t rng[4];    /* xoshiro256** state */
    float *logits;      /* owned, (n_vocab,) scratch: penalised copy of the input */
    struct cand *cands; /* owned, (n_vocab,) scratch */
    int32_t *counts;    /* owned, (n_vocab,) all zero between calls */
    int32_t *ring;      /* owned, (repeat_last_n,) recent tokens */
    int32_t ring_head;  /* next slot to write */
    int32_t ring_len;   /* tokens stored, <= repeat_last_n */
    int32_t *probs_ids; /* owned, (n_vocab,) output of sampler_probs */
    float *probs_vals;  /* owned, (n_vocab,) output of sampler_probs */
};

/* ---- PRNG: xoshiro256**, seeded by base's splitmix64 ----------------------------------- */

static uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s[i] = ar_splitmix64(&x);
}

/* ---- lifetime -------------------------------------------------------------------------- */

struct sampler_params sampler_default_params(void)
{
    struct sampler_params p;
    memset(&p, 0, sizeof(p));
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.repeat_last_n = 64;
    p.seed = 0;
    return p;
}

static bool params_valid(const struct sampler_params *p)
{
    if (isnan(p->temperature) || isinf(p->temperature))
        return false;
    if (p->top_k < 0 || p->repeat_last_n < 0)
        return false;
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return false;
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return false;
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return false;
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return false;
    return true;
}

enum ar_status sampler_create(const struct sampler_params *params, int32_t n_vocab,
                              struct sampler **out)
{
    struct sampler *s;
    size_t n;
    if (!params || !out || n_vocab <= 0 || !params_valid(params))
        return AR_EINVAL;
    n = (size_t)n_vocab;
    s = ar_calloc(1, sizeof(*s));
    if (!s)
        return AR_ENOMEM;
    s->params = *params;
    s->n_vocab = n_vocab;
    s->logits = ar_malloc(n * sizeof(*s->logits));
    s->cands = ar_malloc(n * sizeof(*s->cands));
    s->counts = ar_calloc(n, sizeof(*s->counts));
    s->ring = ar_malloc((size_t)AR_MAX(params->repeat_last_n, 1) * sizeof(*s->ring));
    s->probs_ids = ar_malloc(n * sizeof(*s->probs_ids));
    s->probs_vals = ar_malloc(n * sizeof(*s->probs_vals));
    if (!s->logits || !s->cands || !s->counts || !s->ring || !s->probs_ids || !s->probs_vals) {
        sampler_destroy(s);
        return AR_ENOMEM;
    }
    sampler_reset(s);
    *out = s;
    return AR_OK;
}

void sampler_destroy(struct sampler *s)
{
    if (!s)
        return;
    ar_free(s->probs_vals);
    ar_free(s->probs_ids);
    ar_free(s->ring);
    ar_free(s->counts);
    ar_free(s->cands);
    ar_free(s->logits);
    ar_free(s);
}

void sampler_reset(struct sampler *s)
{
    s->ring_head = 0;
    s->ring_len = 0;
    rng_seed(s->rng, s->params.seed);
}

enum ar_status sampler_accept(struct sampler *s, int32_t token)
{
    int32_t cap = s->params.repeat_last_n;
    if (token < 0 || token >= s->n_vocab)
        return AR_EINVAL;
    if (cap == 0)
        return AR_OK;
    s->ring[s->ring_head] = token;
    s->ring_head = (s->ring_head + 1) % cap;
    if (s->ring_len < cap)
        s->ring_len++;
    return AR_OK;
}

enum ar_status sampler_accept_many(struct sampler *s, const int32_t *tokens, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->n_vocab)
            return AR_EINVAL;
    for (size_t i = 0; i < n; i++)
        sampler_accept(s, tokens[i]);
    return AR_OK;
}

/* ---- penalties ------------------------------------------------------------------------- */

void sampler_apply_penalties(struct sampler *s, float *logits)
{
    const struct sampler_params *p = &s->params;
    if (s->ring_len == 0 ||
        (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f))
        return;
    /* ring holds the last ring_len tokens, order does not matter here */
    for (int32_t i = 0; i < s->ring_len; i++)
        s->counts[s->ring[i]]++;
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t t = s->ring[i];
        int32_t c = s->counts[t];
        float l;
        if (c == 0) /* already applied for an earlier copy of t */
            continue;
        l = logits[t];
        if (p->repeat_penalty != 1.0f)
            l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        logits[t] = l;
        s->counts[t] = 0;
    }
}

/* ---- selection on a total order: larger v first, then smaller id ------------------------ */

static bool better(const struct cand *a, const struct cand *b)
{
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static void swap_cand(struct cand *a, struct cand *b)
{
    struct cand t = *a;
    *a = *b;
    *b = t;
}

/* Partitions c[lo, hi) (hi - lo >= 2) around a median-of-three pivot: on return the pivot
 * is at the returned index, better candidates before it, worse after. *mass receives the
 * sum of v over the candidates before the pivot. */
static int32_t partition(struct cand *c, int32_t lo, int32_t hi, double *mass)
{
    int32_t mid = lo + (hi - lo) / 2, last = hi - 1, store = lo;
    double m = 0.0;
    /* order c[lo], c[mid], c[last] so that the median ends at last */
    if (better(&c[mid], &c[lo]))
        swap_cand(&c[mid], &c[lo]);
    if (better(&c[last], &c[lo]))
        swap_cand(&c[last], &c[lo]);
    if (better(&c[mid], &c[last]))
        swap_cand(&c[mid], &c[last]);
    for (int32_t j = lo; j < last; j++) {
        if (better(&c[j], &c[last])) {
            swap_cand(&c[store], &c[j]);
            m += (double)c[store].v;
            store++;
        }
    }
    swap_cand(&c[store], &c[last]);
    *mass = m;
    return store;
}

/* Min-heap on the total order: h[0] is the worst of the kept candidates. */
static void heap_sift_down(struct cand *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l]))
            w = l;
        if (r < n && better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        swap_cand(&h[i], &h[w]);
        i = w;
    }
}

static void heap_push(struct cand *h, int32_t n, struct cand x)
{
    int32_t i = n;
    h[i] = x;
    while (i > 0 && better(&h[(i - 1) / 2], &h[i])) {
        swap_cand(&h[(i - 1) / 2], &h[i]);
        i = (i - 1) / 2;
    }
}

/* The k best finite logits of l (n_vocab) into c[0, result), unordered. O(n log k), and
 * close to O(n) on typical logits, where few candidates beat the heap's worst. */
static int32_t gather_top_k(const float *l, int32_t n_vocab, int32_t k, struct cand *c)
{
    int32_t m = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        struct cand x;
        if (l[i] == -INFINITY)
            continue;
        x.v = l[i];
        x.id = i;
        if (m < k) {
            heap_push(c, m++, x);
        } else if (better(&x, &c[0])) {
            c[0] = x;
            heap_sift_down(c, m, 0);
        }
    }
    return m;
}

/* Smallest m such that the m best of c[0, n) have total v >= need, moved into c[0, m).
 * Weighted quickselect. Invariant: c[0, lo) are better than the rest and included, with
 * mass acc < need; c[hi, n) are excluded; the answer lies in (lo, hi]. */
static int32_t select_top_mass(struct cand *c, int32_t n, double need)
{
    int32_t lo = 0, hi = n;
    double acc = 0.0;
    while (hi - lo > 1) {
        double up;
        int32_t i = partition(c, lo, hi, &up);
        if (acc + up >= need) {
            hi = i;
        } else if (acc + up + (double)c[i].v >= need) {
            return i + 1;
        } else {
            acc += up + (double)c[i].v;
            lo = i + 1;
        }
    }
    return hi;
}

/* ---- the pipeline ---------------------------------------------------------------------- */

/* Fills s->cands with the surviving candidates, v = unnormalised probability, and returns
 * their count and total mass. Greedy: one candidate with v = 1. */
static enum ar_status prepare(struct sampler *s, const float *logits, int32_t *out_n,
                              double *out_total)
{
    const struct sampler_params *p = &s->params;
    const float *l = logits;
    struct cand *c = s->cands;
    int32_t n = 0;
    float lmax = -INFINITY;
    double total = 0.0;

    /* penalties work on a copy indexed by id; without any, the caller's logits are read as
     * they are (a step of many sequences samples each one: a 600 KB copy per token adds up) */
    if (s->ring_len > 0 && (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                            p->presence_penalty != 0.0f)) {
        memcpy(s->logits, logits, (size_t)s->n_vocab * sizeof(*logits));
        sampler_apply_penalties(s, s->logits);
        l = s->logits;
    }

    if (p->temperature <= 0.0f) {
        int32_t best = -1;
        bool bad = false;
        for (int32_t i = 0; i < s->n_vocab; i++) {
            bad |= isnan(l[i]) || l[i] == INFINITY;
            if (l[i] > lmax) { /* strict: the lowest id wins a tie */
                lmax = l[i];
                best = i;
            }
        }
        if (bad || best < 0)
            return AR_EINVAL;
        c[0].v = 1.0f;
        c[0].id = best;
        *out_n = 1;
        *out_total = 1.0;
        return AR_OK;
    }
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (isnan(l[i]) || l[i] == INFINITY)
            return AR_EINVAL;
    if (p->top_k > 0 && p->top_k < s->n_vocab) {
        n = gather_top_k(l, s->n_vocab, p->top_k, c);
    } else {
        for (int32_t i = 0; i < s->n_vocab; i++) {
            if (l[i] != -INFINITY) {
                c[n].v = l[i];
                c[n].id = i;
                n++;
            }
        }
    }
    if (n == 0)
        return AR_EINVAL;
    for (int32_t i = 0; i < n; i++)
        lmax = AR_MAX(lmax, c[i].v);

    /* softmax with temperature, unnormalised: the best token gets exactly expf(0) = 1 */
    for (int32_t i = 0; i < n; i++) {
        c[i].v = expf((c[i].v - lmax) / p->temperature);
        total += (double)c[i].v;
    }

    /* Top-p and min-p each keep a prefix of the order (largest v first, ties by id), so
     * top-p followed by min-p keeps the shorter of the two prefixes. Min-p is a cheap scan,
     * so it runs first and top-p only searches inside its result, and only when that
     * result holds more than the nucleus mass. The outcome is that of the documented order. */
    if (n > 1 && p->top_p <= 0.0f) {
        for (int32_t i = 1; i < n; i++)
            if (better(&c[i], &c[0]))
                swap_cand(&c[i], &c[0]);
        n = 1;
        total = (double)c[0].v;
    } else if (n > 1 && (p->top_p < 1.0f || p->min_p > 0.0f)) {
        double need = p->top_p < 1.0f ? (double)p->top_p * total : (double)INFINITY;
        double mass = 0.0;
        float floor_v;
        int32_t m = 0;
        if (p->min_p > 0.0f) {
            floor_v = p->min_p; /* min_p * p_max with p_max = 1 */
        } else {
            /* tokens below this floor have total mass < (1 - top_p) / 2: they form a tail
             * that the nucleus never reaches */
            floor_v = (float)((1.0 - (double)p->top_p) * total / (double)n * 0.5);
        }
        for (int32_t i = 0; i < n; i++) {
            if (c[i].v >= floor_v) {
                c[m++] = c[i];
                mass += (double)c[i].v;
            }
        }
        n = m;
        total = mass;
        if (mass >= need && n > 1) {
            n = select_top_mass(c, n, need);
            total = 0.0;
            for (int32_t i = 0; i < n; i++)
                total += (double)c[i].v;
        }
    }
    *out_n = n;
    *out_total = total;
    return AR_OK;
}

enum ar_status sampler_sample(struct sampler *s, const float *logits, int32_t *out_token)
{
    int32_t n;
    double total, r, acc = 0.0;
    enum ar_status st = prepare(s, logits, &n, &total);
    if (st != AR_OK)
        return st;
    if (n == 1) {
        *out_token = s->cands[0].id;
        return AR_OK;
    }
    r = rng_uniform(s->rng) * total;
    for (int32_t i = 0; i < n; i++) {
        acc += (double)s->cands[i].v;
        if (r < acc) {
            *out_token = s->cands[i].id;
            return AR_OK;
        }
    }
    /* rounding left r at the very top: the last candidate with non-zero mass */
    for (int32_t i = n - 1; i >= 0; i--) {
        if (s->cands[i].v > 0.0f) {
            *out_token = s->cands[i].id;
            return AR_OK;
        }
    }
    *out_token = s->cands[0].id;
    return AR_OK;
}

enum ar_status sampler_probs(struct sampler *s, const float *logits, const int32_t **ids,
                             const float **probs, int32_t *n_out)
{
    int32_t n;
    double total;
    enum ar_status st = prepare(s, logits, &n, &total);
    if (st != AR_OK)
        return st;
    for (int32_t i = 0; i < n; i++) {
        s->probs_ids[i] = s->cands[i].id;
        s->probs_vals[i] = (float)((double)s->cands[i].v / total);
    }
    *ids = s->probs_ids;
    *probs = s->probs_vals;
    *n_out = n;
    return AR_OK;
}

/* ---- stop strings ---------------------------------------------------------------------- */

void sampler_stop_find(const char *text, size_t len, const char *const *stops, size_t n_stops,
                       struct sampler_stop_match *out)
{
    memset(out, 0, sizeof(*out));
    for (size_t k = 0; k < n_stops; k++) {
        const char *stop = stops[k];
        size_t slen = stop ? strlen(stop) : 0;
        const char *hit;
        size_t limit = out->found ? out->pos + slen : len; /* only earlier matches count */
        if (slen == 0 || slen > len)
            continue;
        hit = memmem(text, AR_MIN(limit, len), stop, slen);
        if (hit && (!out->found || (size_t)(hit - text) < out->pos)) {
            out->found = true;
            out->pos = (size_t)(hit - text);
            out->stop_index = k;
        }
    }
    if (out->found)
        return;
    for (size_t k = 0; k < n_stops; k++) {
        const char *stop = stops[k];
        size_t slen = stop ? strlen(stop) : 0;
        /* proper prefixes only: a whole match would have been found above */
        for (size_t h = AR_MIN(slen ? slen - 1 : 0, len); h > out->hold_len; h--) {
            if (memcmp(text + len - h, stop, h) == 0) {
                out->hold_len = h;
                break;
            }
        }
    }
}
