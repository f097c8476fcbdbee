/* sampler_test.c - greedy, seeds, top-k/top-p/min-p against sort-based references,
 * frequencies against softmax, penalties against the formula, stop strings. */
#include "harness/harness.h"

#include <math.h>

#include "base/base.h"
#include "sampler/sampler.h"

/* Parameters with every filter off. */
static struct sampler_params plain_params(float temperature, uint64_t seed)
{
    struct sampler_params p = sampler_default_params();
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

static struct sampler *make(const struct sampler_params *p, int32_t n_vocab)
{
    struct sampler *s = NULL;
    assert_int_equal(sampler_create(p, n_vocab, &s), AR_OK);
    assert_non_null(s);
    return s;
}

static int32_t sample(struct sampler *s, const float *logits)
{
    int32_t t = -1;
    assert_int_equal(sampler_sample(s, logits, &t), AR_OK);
    return t;
}

static int32_t ref_argmax(const float *l, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Logits quantised to a coarse grid, so that ties are common. */
static void random_logits(struct th_rng *r, float *l, int32_t n, float scale)
{
    for (int32_t i = 0; i < n; i++)
        l[i] = roundf(th_rng_f32(r) * 8.0f) / 8.0f * scale;
}

/* Reference softmax of l / t in double. */
static void ref_softmax(const float *l, int32_t n, double t, double *p)
{
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        mx = fmax(mx, (double)l[i]);
    for (int32_t i = 0; i < n; i++) {
        p[i] = exp(((double)l[i] - mx) / t);
        sum += p[i];
    }
    for (int32_t i = 0; i < n; i++)
        p[i] /= sum;
}

static void greedy_picks_argmax_and_lowest_id_on_ties(void **state)
{
    struct sampler_params p = plain_params(0.0f, 1);
    struct th_rng r = {7};
    float l[300];
    struct sampler *s;
    (void)state;
    s = make(&p, 300);
    for (int it = 0; it < 50; it++) {
        random_logits(&r, l, 300, 3.0f);
        assert_int_equal(sample(s, l), ref_argmax(l, 300));
    }
    for (int i = 0; i < 300; i++)
        l[i] = 0.0f;
    l[17] = 2.0f;
    l[5] = 2.0f;
    l[250] = 2.0f;
    assert_int_equal(sample(s, l), 5);
    sampler_destroy(s);

    p.temperature = -1.0f; /* negative is greedy too */
    s = make(&p, 300);
    assert_int_equal(sample(s, l), 5);
    sampler_destroy(s);
}

static void same_seed_same_tokens_different_seed_differs(void **state)
{
    enum { N = 64, DRAWS = 400 };
    float l[N];
    int32_t a[DRAWS], b[DRAWS], c[DRAWS];
    struct th_rng r = {3};
    struct sampler_params p1 = plain_params(1.0f, 12345);
    struct sampler_params p2 = plain_params(1.0f, 12346);
    struct sampler *s1, *s2, *s3;
    int differ = 0;
    (void)state;
    for (int i = 0; i < N; i++)
        l[i] = th_rng_f32(&r) * 0.5f; /* near uniform: many distinct outcomes */
    s1 = make(&p1, N);
    s2 = make(&p1, N);
    s3 = make(&p2, N);
    for (int i = 0; i < DRAWS; i++) {
        a[i] = sample(s1, l);
        b[i] = sample(s2, l);
        c[i] = sample(s3, l);
    }
    assert_memory_equal(a, b, sizeof(a));
    for (int i = 0; i < DRAWS; i++)
        differ += a[i] != c[i];
    /* two independent draws from ~64 near-equal tokens agree ~1/64 of the time */
    assert_true(differ > DRAWS * 3 / 4);

    /* reset restarts the sequence */
    sampler_reset(s1);
    for (int i = 0; i < DRAWS; i++)
        assert_int_equal(sample(s1, l), a[i]);
    sampler_destroy(s1);
    sampler_destroy(s2);
    sampler_destroy(s3);
}

static void top_k_one_equals_greedy(void **state)
{
    struct sampler_params p = plain_params(1.5f, 99);
    struct th_rng r = {11};
    float l[1000];
    struct sampler *s;
    (void)state;
    p.top_k = 1;
    s = make(&p, 1000);
    for (int it = 0; it < 100; it++) {
        random_logits(&r, l, 1000, 4.0f); /* many ties at the top */
        assert_int_equal(sample(s, l), ref_argmax(l, 1000));
    }
    sampler_destroy(s);
}

struct ref_cand {
    double v;
    int32_t id;
};

/* larger v first, then lower id: the order the sampler documents */
static int ref_cmp(const void *pa, const void *pb)
{
    const struct ref_cand *a = pa, *b = pb;
    if (a->v != b->v)
        return a->v > b->v ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void top_k_keeps_exactly_the_k_largest(void **state)
{
    enum { N = 5000 };
    static float l[N];
    static struct ref_cand ref[N];
    static unsigned char kept[N];
    const int32_t ks[] = {1, 2, 3, 37, 40, 999, 4999, 5000, 6000};
    struct th_rng r = {5};
    (void)state;
    random_logits(&r, l, N, 6.0f);
    for (int32_t i = 0; i < N; i++) {
        ref[i].v = l[i];
        ref[i].id = i;
    }
    qsort(ref, N, sizeof(ref[0]), ref_cmp);
    for (size_t t = 0; t < AR_ARRAY_LEN(ks); t++) {
        struct sampler_params p = plain_params(1.0f, 1);
        const int32_t *ids;
        const float *probs;
        int32_t n, k = AR_MIN(ks[t], N);
        double sum = 0.0;
        struct sampler *s;
        p.top_k = ks[t];
        s = make(&p, N);
        assert_int_equal(sampler_probs(s, l, &ids, &probs, &n), AR_OK);
        assert_int_equal(n, k);
        memset(kept, 0, sizeof(kept));
        for (int32_t i = 0; i < n; i++) {
            assert_false(kept[ids[i]]);
            kept[ids[i]] = 1;
            sum += (double)probs[i];
        }
        for (int32_t i = 0; i < k; i++)
            assert_true(kept[ref[i].id]);
        assert_true(fabs(sum - 1.0) < 1e-5);
        sampler_destroy(s);
    }
}

/* Checks the top-p set by its definition: it is a prefix of the sorted order, it reaches
 * mass p and it would not without its worst member. */
static void top_p_keeps_smallest_set_reaching_p(void **state)
{
    enum { N = 3000 };
    static float l[N];
    static double pr[N];
    static struct ref_cand ref[N];
    static unsigned char kept[N];
    const float ps[] = {0.0f, 1e-6f, 0.1f, 0.5f, 0.9f, 0.95f, 0.999f};
    struct th_rng r = {21};
    (void)state;
    random_logits(&r, l, N, 5.0f);
    ref_softmax(l, N, 0.7, pr);
    for (int32_t i = 0; i < N; i++) {
        ref[i].v = pr[i];
        ref[i].id = i;
    }
    qsort(ref, N, sizeof(ref[0]), ref_cmp);
    for (size_t t = 0; t < AR_ARRAY_LEN(ps); t++) {
        struct sampler_params p = plain_params(0.7f, 1);
        const int32_t *ids;
        const float *probs;
        int32_t n;
        double mass = 0.0;
        struct sampler *s;
        p.top_p = ps[t];
        s = make(&p, N);
        assert_int_equal(sampler_probs(s, l, &ids, &probs, &n), AR_OK);
        assert_true(n >= 1);
        memset(kept, 0, sizeof(kept));
        for (int32_t i = 0; i < n; i++)
            kept[ids[i]] = 1;
        for (int32_t i = 0; i < n; i++) { /* prefix of the reference order */
            assert_true(kept[ref[i].id]);
            mass += ref[i].v;
        }
        if (n > 1) {
            assert_true(mass >= (double)ps[t] - 1e-5);
            assert_true(mass - ref[n - 1].v < (double)ps[t] + 1e-5);
        } else {
            assert_int_equal(ids[0], ref[0].id);
        }
        sampler_destroy(s);
    }
}

/* The documented pipeline done the slow, obvious way: full sort, top-k, softmax in double,
 * top-p prefix, min-p against the max, renormalise. Fills prob (n_vocab, 0 = dropped). */
static void ref_pipeline(const float *l, int32_t n, const struct sampler_params *p,
                         struct ref_cand *tmp, double *prob)
{
    int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n, m;
    double total = 0.0, cum = 0.0, mx;
    for (int32_t i = 0; i < n; i++) {
        tmp[i].v = l[i];
        tmp[i].id = i;
        prob[i] = 0.0;
    }
    qsort(tmp, (size_t)n, sizeof(tmp[0]), ref_cmp);
    mx = tmp[0].v;
    for (int32_t i = 0; i < k; i++) {
        tmp[i].v = exp((tmp[i].v - mx) / (double)p->temperature);
        total += tmp[i].v;
    }
    for (m = 0; m < k;) { /* smallest prefix with cumulative >= top_p */
        cum += tmp[m++].v / total;
        if (p->top_p < 1.0f && cum >= (double)p->top_p)
            break;
    }
    total = 0.0;
    for (int32_t i = 0; i < m; i++) {
        if (tmp[i].v >= (double)p->min_p * tmp[0].v) {
            prob[tmp[i].id] = tmp[i].v;
            total += tmp[i].v;
        }
    }
    for (int32_t i = 0; i < n; i++)
        prob[i] /= total;
}

static void filters_combined_match_the_slow_reference(void **state)
{
    enum { N = 2000 };
    static float l[N];
    static double want[N];
    static struct ref_cand tmp[N];
    static unsigned char kept[N];
    const float temps[] = {0.3f, 0.8f, 1.0f, 2.5f};
    const int32_t ks[] = {0, 1, 5, 40, 500};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.05f};
    const float min_ps[] = {0.0f, 0.02f, 0.1f, 0.6f};
    struct th_rng r = {31};
    int cases = 0;
    (void)state;
    for (int rep = 0; rep < 2; rep++) {
        random_logits(&r, l, N, rep ? 12.0f : 3.0f); /* peaked and flat */
        for (size_t a = 0; a < AR_ARRAY_LEN(temps); a++)
            for (size_t b = 0; b < AR_ARRAY_LEN(ks); b++)
                for (size_t c = 0; c < AR_ARRAY_LEN(top_ps); c++)
                    for (size_t d = 0; d < AR_ARRAY_LEN(min_ps); d++) {
                        struct sampler_params p = plain_params(temps[a], 1);
                        const int32_t *ids;
                        const float *probs;
                        int32_t n, n_want = 0;
                        struct sampler *s;
                        p.top_k = ks[b];
                        p.top_p = top_ps[c];
                        p.min_p = min_ps[d];
                        ref_pipeline(l, N, &p, tmp, want);
                        s = make(&p, N);
                        assert_int_equal(sampler_probs(s, l, &ids, &probs, &n), AR_OK);
                        memset(kept, 0, sizeof(kept));
                        for (int32_t i = 0; i < n; i++) {
                            assert_false(kept[ids[i]]);
                            kept[ids[i]] = 1;
                            assert_true(fabs((double)probs[i] - want[ids[i]]) < 1e-5);
                        }
                        for (int32_t i = 0; i < N; i++)
                            n_want += want[i] > 0.0;
                        assert_int_equal(n, n_want);
                        sampler_destroy(s);
                        cases++;
                    }
    }
    assert_int_equal(cases, 2 * 4 * 5 * 4 * 4);
}

static void top_p_keeps_one_token_when_the_best_alone_is_enough(void **state)
{
    struct sampler_params p = plain_params(1.0f, 4);
    float l[4] = {0.0f, 10.0f, 0.0f, 0.0f}; /* p(1) ~ 0.99986 */
    const int32_t *ids;
    const float *probs;
    int32_t n;
    struct sampler *s;
    (void)state;
    p.top_p = 0.9f;
    s = make(&p, 4);
    assert_int_equal(sampler_probs(s, l, &ids, &probs, &n), AR_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    assert_true(fabsf(probs[0] - 1.0f) < 1e-6f);
    for (int i = 0; i < 100; i++)
        assert_int_equal(sample(s, l), 1);
    sampler_destroy(s);
}

static void min_p_removes_low_tokens(void **state)
{
    enum { N = 6 };
    /* softmax ratios to the max: exp(l - 2) */
    float l[N] = {2.0f, 1.0f, 0.0f, -1.0f, 1.9f, -5.0f};
    double pr[N], kept_mass = 0.0;
    unsigned char seen[N] = {0}, keep[N];
    struct sampler_params p = plain_params(1.0f, 8);
    const int32_t *ids;
    const float *probs;
    int32_t n, n_keep = 0;
    struct sampler *s;
    (void)state;
    p.min_p = 0.2f; /* exp(-1) = 0.37 stays, exp(-2) = 0.135 goes */
    ref_softmax(l, N, 1.0, pr);
    for (int i = 0; i < N; i++) {
        keep[i] = pr[i] >= 0.2 * pr[0];
        n_keep += keep[i];
        kept_mass += keep[i] ? pr[i] : 0.0;
    }
    assert_int_equal(n_keep, 3); /* tokens 0, 1, 4 */
    s = make(&p, N);
    assert_int_equal(sampler_probs(s, l, &ids, &probs, &n), AR_OK);
    assert_int_equal(n, n_keep);
    for (int32_t i = 0; i < n; i++) {
        assert_true(keep[ids[i]]);
        assert_true(fabs((double)probs[i] - pr[ids[i]] / kept_mass) < 1e-6);
    }
    for (int i = 0; i < 2000; i++)
        seen[sample(s, l)] = 1;
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], keep[i]); /* kept ones all appear, others never */
    sampler_destroy(s);
}

static void temperature_one_frequencies_match_softmax(void **state)
{
    enum { N = 8, DRAWS = 20000 };
    const float l[N] = {0.0f, 0.5f, 1.0f, -1.0f, 2.0f, 0.3f, -0.5f, 1.5f};
    double pr[N], chi2 = 0.0;
    int counts[N] = {0};
    struct sampler_params p = plain_params(1.0f, 2024);
    const int32_t *ids;
    const float *probs;
    int32_t n;
    struct sampler *s;
    (void)state;
    ref_softmax(l, N, 1.0, pr);
    s = make(&p, N);
    assert_int_equal(sampler_probs(s, l, &ids, &probs, &n), AR_OK);
    assert_int_equal(n, N);
    for (int32_t i = 0; i < n; i++)
        assert_true(fabs((double)probs[i] - pr[ids[i]]) < 1e-6);
    for (int i = 0; i < DRAWS; i++)
        counts[sample(s, l)]++;
    for (int i = 0; i < N; i++) {
        double e = pr[i] * DRAWS;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    /* 7 degrees of freedom: P(chi2 > 24.32) = 0.001 */
    assert_true(chi2 < 24.32);
    /* and the draws are not suspiciously exact either (P(chi2 < 0.6) ~ 0.001) */
    assert_true(chi2 > 0.6);
    sampler_destroy(s);
}

static void temperature_scales_logits(void **state)
{
    enum { N = 5 };
    const float l[N] = {1.0f, 2.0f, 0.0f, -1.0f, 1.5f};
    const float temps[] = {0.25f, 0.5f, 2.0f, 10.0f};
    (void)state;
    for (size_t t = 0; t < AR_ARRAY_LEN(temps); t++) {
        struct sampler_params p = plain_params(temps[t], 1);
        double pr[N];
        const int32_t *ids;
        const float *probs;
        int32_t n;
        struct sampler *s = make(&p, N);
        ref_softmax(l, N, (double)temps[t], pr);
        assert_int_equal(sampler_probs(s, l, &ids, &probs, &n), AR_OK);
        assert_int_equal(n, N);
        for (int32_t i = 0; i < n; i++)
            assert_true(fabs((double)probs[i] - pr[ids[i]]) < 1e-6);
        sampler_destroy(s);
    }
}

static void penalties_match_the_formula(void **state)
{
    enum { N = 10 };
    const float base[N] = {1.0f, -2.0f, 3.0f, 0.5f, -0.5f, 2.0f, 0.0f, 4.0f, -1.0f, 1.5f};
    const int32_t hist[] = {9, 2, 1, 2, 4, 2, 1}; /* window 6 drops the first (9) */
    float l[N], want[N];
    int cnt[N] = {0};
    struct sampler_params p = plain_params(1.0f, 1);
    struct sampler *s;
    (void)state;
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.4f;
    p.repeat_last_n = 6;
    s = make(&p, N);
    assert_int_equal(sampler_accept_many(s, hist, AR_ARRAY_LEN(hist)), AR_OK);
    /* by hand: window = {2, 1, 2, 4, 2, 1}: counts 2 -> 3, 1 -> 2, 4 -> 1 */
    cnt[2] = 3;
    cnt[1] = 2;
    cnt[4] = 1;
    for (int i = 0; i < N; i++) {
        float x = base[i];
        if (cnt[i] > 0) {
            x = x > 0.0f ? x / 1.3f : x * 1.3f;
            x -= (float)cnt[i] * 0.25f + 0.4f;
        }
        want[i] = x;
    }
    assert_true(fabsf(want[2] - (3.0f / 1.3f - 0.75f - 0.4f)) < 1e-6f);
    assert_true(fabsf(want[1] - (-2.6f - 0.5f - 0.4f)) < 1e-6f);
    memcpy(l, base, sizeof(l));
    sampler_apply_penalties(s, l);
    for (int i = 0; i < N; i++)
        assert_true(fabsf(l[i] - want[i]) < 1e-6f);

    /* sampling sees the same penalised logits: greedy on them */
    {
        struct sampler_params g = p;
        struct sampler *sg;
        float m[N];
        int32_t t;
        g.temperature = 0.0f;
        sg = make(&g, N);
        memcpy(m, base, sizeof(m));
        m[2] = 10.0f; /* best before penalties, 10/1.3 - 1.15 = 6.54 after */
        m[7] = 6.6f;
        assert_int_equal(sampler_accept_many(sg, hist, AR_ARRAY_LEN(hist)), AR_OK);
        assert_int_equal(sampler_sample(sg, m, &t), AR_OK);
        assert_int_equal(t, 7);
        sampler_reset(sg); /* history gone: token 2 wins again */
        assert_int_equal(sampler_sample(sg, m, &t), AR_OK);
        assert_int_equal(t, 2);
        sampler_destroy(sg);
    }
    sampler_destroy(s);
}

static void penalties_off_leave_logits_alone(void **state)
{
    const float base[4] = {1.0f, -1.0f, 2.0f, 0.0f};
    float l[4];
    struct sampler_params p = plain_params(1.0f, 1);
    struct sampler *s;
    (void)state;
    s = make(&p, 4); /* repeat 1, frequency 0, presence 0 */
    sampler_accept(s, 0);
    sampler_accept(s, 1);
    memcpy(l, base, sizeof(l));
    sampler_apply_penalties(s, l);
    assert_memory_equal(l, base, sizeof(l));
    sampler_destroy(s);

    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 0; /* empty window */
    s = make(&p, 4);
    sampler_accept(s, 0);
    memcpy(l, base, sizeof(l));
    sampler_apply_penalties(s, l);
    assert_memory_equal(l, base, sizeof(l));
    sampler_destroy(s);
}

static void masked_tokens_are_never_drawn(void **state)
{
    enum { N = 50 };
    float l[N];
    struct sampler_params p = plain_params(2.0f, 77);
    struct sampler *s;
    (void)state;
    for (int i = 0; i < N; i++)
        l[i] = (i % 3 == 0) ? 0.0f : -INFINITY;
    s = make(&p, N);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(sample(s, l) % 3, 0);
    sampler_destroy(s);
}

static void rejects_bad_input(void **state)
{
    struct sampler_params p = plain_params(1.0f, 1);
    struct sampler *s = NULL;
    float l[3] = {0.0f, NAN, 1.0f};
    int32_t t;
    const int32_t bad_hist[2] = {1, 3};
    (void)state;
    assert_int_equal(sampler_create(&p, 0, &s), AR_EINVAL);
    p.top_p = 1.5f;
    assert_int_equal(sampler_create(&p, 3, &s), AR_EINVAL);
    p = plain_params(1.0f, 1);
    p.repeat_penalty = 0.0f;
    assert_int_equal(sampler_create(&p, 3, &s), AR_EINVAL);
    p = plain_params(1.0f, 1);
    p.top_k = -1;
    assert_int_equal(sampler_create(&p, 3, &s), AR_EINVAL);
    p = plain_params(NAN, 1);
    assert_int_equal(sampler_create(&p, 3, &s), AR_EINVAL);
    assert_null(s);

    p = plain_params(1.0f, 1);
    s = make(&p, 3);
    assert_int_equal(sampler_sample(s, l, &t), AR_EINVAL);
    l[1] = INFINITY;
    assert_int_equal(sampler_sample(s, l, &t), AR_EINVAL);
    l[0] = l[1] = l[2] = -INFINITY;
    assert_int_equal(sampler_sample(s, l, &t), AR_EINVAL);
    assert_int_equal(sampler_accept(s, 3), AR_EINVAL);
    assert_int_equal(sampler_accept(s, -1), AR_EINVAL);
    assert_int_equal(sampler_accept_many(s, bad_hist, 2), AR_EINVAL);
    sampler_destroy(s);
    sampler_destroy(NULL);
}

static void create_fails_cleanly_without_memory(void **state)
{
    struct sampler_params p = sampler_default_params();
    enum ar_status st = AR_ENOMEM;
    (void)state;
    for (uint64_t n = 1; st == AR_ENOMEM && n < 100; n++) {
        struct sampler *s = NULL;
        ar_alloc_fail_after(n);
        st = sampler_create(&p, 1000, &s);
        ar_alloc_fail_after(0);
        if (st == AR_OK)
            sampler_destroy(s);
        else
            assert_null(s);
    }
    assert_int_equal(st, AR_OK);
}

/* ---- stop strings ---------------------------------------------------------------------- */

static void stop_find_reports_earliest_match(void **state)
{
    const char *stops[] = {"</s>", "", NULL, "User:", "\n\n"};
    const char *text = "Thanks!\n\nUser: hi</s>";
    struct sampler_stop_match m;
    (void)state;
    sampler_stop_find(text, strlen(text), stops, AR_ARRAY_LEN(stops), &m);
    assert_true(m.found);
    assert_int_equal(m.pos, 7);
    assert_int_equal(m.stop_index, 4);
    assert_int_equal(m.hold_len, 0);

    sampler_stop_find(text, 9, stops, 4, &m); /* "Thanks!\n\n" without "\n\n" listed */
    assert_false(m.found);
    assert_int_equal(m.hold_len, 0);

    sampler_stop_find("abc</", 5, stops, AR_ARRAY_LEN(stops), &m);
    assert_false(m.found);
    assert_int_equal(m.hold_len, 2);

    sampler_stop_find("Use", 3, stops, AR_ARRAY_LEN(stops), &m);
    assert_false(m.found);
    assert_int_equal(m.hold_len, 3);

    sampler_stop_find("done\n", 5, stops, AR_ARRAY_LEN(stops), &m);
    assert_false(m.found);
    assert_int_equal(m.hold_len, 1);

    sampler_stop_find("", 0, stops, AR_ARRAY_LEN(stops), &m);
    assert_false(m.found);
    assert_int_equal(m.hold_len, 0);
}

/* Streams chunks through the documented hold-back protocol; returns what was sent. */
static void stream(const char *const *chunks, size_t n_chunks, const char *const *stops,
                   size_t n_stops, char *sent, bool *stopped)
{
    char pending[256] = "";
    size_t pl = 0, sl = 0;
    *stopped = false;
    for (size_t c = 0; c < n_chunks && !*stopped; c++) {
        struct sampler_stop_match m;
        size_t emit;
        memcpy(pending + pl, chunks[c], strlen(chunks[c]));
        pl += strlen(chunks[c]);
        sampler_stop_find(pending, pl, stops, n_stops, &m);
        emit = m.found ? m.pos : pl - m.hold_len;
        memcpy(sent + sl, pending, emit);
        sl += emit;
        memmove(pending, pending + emit, pl - emit);
        pl -= emit;
        *stopped = m.found;
    }
    if (!*stopped) { /* end of generation: flush */
        memcpy(sent + sl, pending, pl);
        sl += pl;
    }
    sent[sl] = '\0';
}

static void stop_string_split_across_chunks_is_found(void **state)
{
    const char *stops[] = {"<|im_end|>", "###"};
    const char *split[] = {"Dear customer, thank you.<|im", "_e", "nd|> trailing"};
    const char *near[] = {"a <|im_", "start|> b #", "# c"};
    char sent[256];
    bool stopped;
    (void)state;
    stream(split, 3, stops, 2, sent, &stopped);
    assert_true(stopped);
    assert_string_equal(sent, "Dear customer, thank you.");

    /* a prefix that does not complete is released, not lost */
    stream(near, 3, stops, 2, sent, &stopped);
    assert_false(stopped);
    assert_string_equal(sent, "a <|im_start|> b ## c");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_picks_argmax_and_lowest_id_on_ties),
        cmocka_unit_test(same_seed_same_tokens_different_seed_differs),
        cmocka_unit_test(top_k_one_equals_greedy),
        cmocka_unit_test(top_k_keeps_exactly_the_k_largest),
        cmocka_unit_test(top_p_keeps_smallest_set_reaching_p),
        cmocka_unit_test(filters_combined_match_the_slow_reference),
        cmocka_unit_test(top_p_keeps_one_token_when_the_best_alone_is_enough),
        cmocka_unit_test(min_p_removes_low_tokens),
        cmocka_unit_test(temperature_one_frequencies_match_softmax),
        cmocka_unit_test(temperature_scales_logits),
        cmocka_unit_test(penalties_match_the_formula),
        cmocka_unit_test(penalties_off_leave_logits_alone),
        cmocka_unit_test(masked_tokens_are_never_drawn),
        cmocka_unit_test(rejects_bad_input),
        cmocka_unit_test(create_fails_cleanly_without_memory),
        cmocka_unit_test(stop_find_reports_earliest_match),
        cmocka_unit_test(stop_string_split_across_chunks_is_found),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
