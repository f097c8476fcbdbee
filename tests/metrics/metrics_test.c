/* metrics_test.c - the exposition text parsed back line by line and matched against what
 * was recorded; escaping, validation, bounded children, quantiles, threads, out of memory;
 * collectors, and the process figures checked against the kernel's own answers. */
#include "harness/harness.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "metrics/metrics.h"

/* ---- a small independent parser for the text format ----------------------------------- */

#define MAX_SAMPLES 1100

struct sample {
    char name[96];
    int n_labels;
    char lname[METRICS_MAX_LABELS + 1][32];
    char lval[METRICS_MAX_LABELS + 1][128];
    double value;
};

struct parsed {
    struct sample s[MAX_SAMPLES];
    int n;
    char help[16][2][128]; /* name, unescaped text */
    char type[16][2][96];  /* name, type */
    int n_help, n_type;
};

static const char *parse_name(const char *p, char *out, size_t size)
{
    size_t n = 0;
    while (*p && *p != '{' && *p != ' ' && n + 1 < size)
        out[n++] = *p++;
    out[n] = '\0';
    return p;
}

/* Reads an escaped string up to the closing quote (label values) or end of line (help). */
static const char *parse_escaped(const char *p, char *out, size_t size, char end)
{
    size_t n = 0;
    while (*p && *p != end && *p != '\n') {
        char ch = *p++;
        if (ch == '\\') {
            ch = *p++;
            if (ch == 'n')
                ch = '\n';
            else if (ch != '\\' && ch != '"')
                fail_msg("bad escape \\%c", ch);
        }
        if (n + 1 < size)
            out[n++] = ch;
    }
    out[n] = '\0';
    return p;
}

static void parse(const char *text, struct parsed *ps)
{
    const char *p = text;
    memset(ps, 0, sizeof(*ps));
    while (*p) {
        const char *eol = strchr(p, '\n');
        assert_non_null(eol); /* every line ends with a newline */
        if (strncmp(p, "# HELP ", 7) == 0) {
            p = parse_name(p + 7, ps->help[ps->n_help][0], 128);
            assert_int_equal(*p, ' ');
            parse_escaped(p + 1, ps->help[ps->n_help][1], 128, '\n');
            ps->n_help++;
        } else if (strncmp(p, "# TYPE ", 7) == 0) {
            p = parse_name(p + 7, ps->type[ps->n_type][0], 96);
            assert_int_equal(*p, ' ');
            assert_true(eol - p - 1 < 96);
            memcpy(ps->type[ps->n_type][1], p + 1, (size_t)(eol - p - 1));
            ps->n_type++;
        } else {
            struct sample *s = &ps->s[ps->n++];
            char *end;
            assert_true(ps->n <= MAX_SAMPLES);
            p = parse_name(p, s->name, sizeof(s->name));
            if (*p == '{') {
                p++;
                while (*p != '}') {
                    size_t n = 0;
                    while (*p != '=' && n + 1 < sizeof(s->lname[0]))
                        s->lname[s->n_labels][n++] = *p++;
                    assert_int_equal(*p++, '=');
                    assert_int_equal(*p++, '"');
                    p = parse_escaped(p, s->lval[s->n_labels], sizeof(s->lval[0]), '"');
                    assert_int_equal(*p++, '"');
                    s->n_labels++;
                    if (*p == ',')
                        p++;
                    else
                        assert_int_equal(*p, '}');
                }
                p++;
            }
            assert_int_equal(*p++, ' ');
            s->value = strtod(p, &end);
            assert_ptr_equal(end, eol);
        }
        p = eol + 1;
    }
}

static const char *label(const struct sample *s, const char *name)
{
    for (int i = 0; i < s->n_labels; i++)
        if (strcmp(s->lname[i], name) == 0)
            return s->lval[i];
    return NULL;
}

/* The one sample named name whose labels include (k, v) (k NULL: any); fails otherwise. */
static const struct sample *find(const struct parsed *ps, const char *name, const char *k,
                                 const char *v)
{
    const struct sample *hit = NULL;
    for (int i = 0; i < ps->n; i++) {
        const struct sample *s = &ps->s[i];
        if (strcmp(s->name, name) != 0)
            continue;
        if (k && (!label(s, k) || strcmp(label(s, k), v) != 0))
            continue;
        if (hit)
            fail_msg("two samples %s %s=%s", name, k ? k : "", v ? v : "");
        hit = s;
    }
    if (!hit)
        fail_msg("no sample %s %s=%s", name, k ? k : "", v ? v : "");
    return hit;
}

static int count_named(const struct parsed *ps, const char *name)
{
    int n = 0;
    for (int i = 0; i < ps->n; i++)
        n += strcmp(ps->s[i].name, name) == 0;
    return n;
}

static const char *type_of(const struct parsed *ps, const char *name)
{
    for (int i = 0; i < ps->n_type; i++)
        if (strcmp(ps->type[i][0], name) == 0)
            return ps->type[i][1];
    return NULL;
}

static struct parsed *render_parse(struct metrics_registry *reg, char **text_out)
{
    static struct parsed ps;
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(metrics_render(reg, &text, &len), AR_OK);
    assert_int_equal(strlen(text), len);
    parse(text, &ps);
    if (text_out)
        *text_out = text;
    else
        ar_free(text);
    return &ps;
}

static struct metrics_registry *new_registry(void)
{
    struct metrics_registry *reg = NULL;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    return reg;
}

/* ---- tests ----------------------------------------------------------------------------- */

static void counters_and_gauges_render_their_values(void **state)
{
    const char *names[] = {"method", "status", NULL};
    const char *get200[] = {"GET", "200"}, *post429[] = {"POST", "429"};
    struct metrics_registry *reg = new_registry();
    struct metrics_family *req, *inflight, *up;
    struct metrics_child *a, *b, *g;
    struct parsed *ps;
    (void)state;
    assert_int_equal(metrics_counter(reg, "http_requests_total", "Requests served.", names, &req),
                     AR_OK);
    assert_int_equal(metrics_gauge(reg, "inflight", "In flight.", NULL, &inflight), AR_OK);
    assert_int_equal(metrics_gauge(reg, "ns:up", "Up.", NULL, &up), AR_OK);
    a = metrics_child(req, get200);
    b = metrics_child(req, post429);
    assert_ptr_equal(metrics_child(req, get200), a);
    assert_ptr_not_equal(a, b);
    for (int i = 0; i < 5; i++)
        metrics_inc(a, 1.0);
    metrics_inc(b, 2.5);
    metrics_inc(b, -1.0); /* counters only go up */
    metrics_inc(b, NAN);
    g = metrics_child(inflight, NULL);
    metrics_set(g, 10.0);
    metrics_inc(g, -3.0);
    metrics_observe(g, 1.0); /* wrong type: ignored */
    metrics_inc(NULL, 1.0);  /* ignored */

    ps = render_parse(reg, NULL);
    assert_string_equal(type_of(ps, "http_requests_total"), "counter");
    assert_string_equal(type_of(ps, "inflight"), "gauge");
    assert_string_equal(ps->help[0][0], "http_requests_total");
    assert_string_equal(ps->help[0][1], "Requests served.");
    assert_int_equal(count_named(ps, "http_requests_total"), 2);
    assert_true(find(ps, "http_requests_total", "method", "GET")->value == 5.0);
    assert_string_equal(label(find(ps, "http_requests_total", "method", "GET"), "status"), "200");
    assert_true(find(ps, "http_requests_total", "status", "429")->value == 2.5);
    assert_true(find(ps, "inflight", NULL, NULL)->value == 7.0);
    assert_int_equal(find(ps, "inflight", NULL, NULL)->n_labels, 0);
    assert_true(find(ps, "ns:up", NULL, NULL)->value == 0.0);
    assert_true(metrics_value(a) == 5.0);
    metrics_registry_destroy(reg);
}

static void histogram_buckets_sum_and_count_match_observations(void **state)
{
    enum { N = 500 };
    const double bounds[] = {0.1, 0.5, 1.0, 5.0};
    const char *names[] = {"priority", NULL};
    const char *interactive[] = {"interactive"};
    double obs[N], sum = 0.0, prev = -1.0;
    char le[32];
    struct th_rng r = {9};
    struct metrics_registry *reg = new_registry();
    struct metrics_family *h, *d;
    struct metrics_child *c;
    struct parsed *ps;
    (void)state;
    assert_int_equal(metrics_histogram(reg, "latency_seconds", "Latency.", names, bounds, 4, &h),
                     AR_OK);
    assert_int_equal(metrics_histogram(reg, "default_seconds", "D.", NULL, NULL, 0, &d), AR_OK);
    c = metrics_child(h, interactive);
    for (int i = 0; i < N; i++) {
        obs[i] = ((double)th_rng_f32(&r) + 1.0) * 4.0; /* [0, 8) */
        if (i % 50 == 0)
            obs[i] = 0.5; /* exactly on a bound: le is inclusive */
        metrics_observe(c, obs[i]);
        sum += obs[i];
    }
    metrics_observe(c, NAN); /* ignored */
    metrics_observe(metrics_child(d, NULL), 0.003);

    ps = render_parse(reg, NULL);
    assert_string_equal(type_of(ps, "latency_seconds"), "histogram");
    assert_int_equal(count_named(ps, "latency_seconds_bucket"), 5);
    for (size_t b = 0; b < 4; b++) {
        const struct sample *s;
        int want = 0;
        for (int i = 0; i < N; i++)
            want += obs[i] <= bounds[b];
        snprintf(le, sizeof(le), "%g", bounds[b]);
        s = find(ps, "latency_seconds_bucket", "le", le);
        assert_string_equal(label(s, "priority"), "interactive");
        assert_true(s->value == (double)want);
        assert_true(s->value >= prev); /* cumulative */
        prev = s->value;
    }
    assert_true(find(ps, "latency_seconds_bucket", "le", "+Inf")->value == (double)N);
    assert_true(find(ps, "latency_seconds_count", NULL, NULL)->value == (double)N);
    assert_true(fabs(find(ps, "latency_seconds_sum", NULL, NULL)->value - sum) < 1e-9 * sum);
    assert_int_equal(metrics_histogram_count(c), N);

    /* default buckets: 0.0005 .. 60 plus +Inf; the one observation lands from 0.005 up */
    assert_int_equal(count_named(ps, "default_seconds_bucket"), METRICS_DEFAULT_BUCKETS_LEN + 1);
    for (int i = 0; i < ps->n; i++) {
        const struct sample *s = &ps->s[i];
        double bound;
        if (strcmp(s->name, "default_seconds_bucket") != 0)
            continue;
        bound = strtod(label(s, "le"), NULL);
        assert_true(bound >= 0.0005 && (bound <= 60.0 || isinf(bound)));
        assert_true(s->value == (bound >= 0.003 ? 1.0 : 0.0));
    }
    metrics_registry_destroy(reg);
}

static void label_values_and_help_are_escaped(void **state)
{
    const char *names[] = {"path", NULL};
    const char *nasty = "a\\b\"c\nd";
    const char *vals[] = {nasty};
    struct metrics_registry *reg = new_registry();
    struct metrics_family *f;
    struct parsed *ps;
    char *text;
    (void)state;
    assert_int_equal(metrics_counter(reg, "odd_total", "Back\\slash\nnewline \"q\"", names, &f),
                     AR_OK);
    metrics_inc(metrics_child(f, vals), 1.0);
    ps = render_parse(reg, &text);
    assert_non_null(strstr(text, "odd_total{path=\"a\\\\b\\\"c\\nd\"} 1\n"));
    assert_non_null(strstr(text, "# HELP odd_total Back\\\\slash\\nnewline \"q\"\n"));
    assert_string_equal(find(ps, "odd_total", NULL, NULL)->lval[0], nasty);
    assert_string_equal(ps->help[0][1], "Back\\slash\nnewline \"q\"");
    ar_free(text);
    metrics_registry_destroy(reg);
}

static void names_are_validated(void **state)
{
    const char *bad_label[] = {"__reserved", NULL};
    const char *le_label[] = {"le", NULL};
    const char *dup_labels[] = {"a", "a", NULL};
    const char *digit_label[] = {"1a", NULL};
    const char *colon_label[] = {"a:b", NULL};
    const char *ab[] = {"a", "b", NULL}, *ba[] = {"b", "a", NULL};
    const double unordered[] = {1.0, 1.0};
    const double inf_bound[] = {1.0, INFINITY};
    struct metrics_registry *reg = new_registry();
    struct metrics_family *f, *g;
    (void)state;
    assert_int_equal(metrics_counter(reg, "1abc", "H.", NULL, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "a-b", "H.", NULL, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "", "H.", NULL, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, NULL, "H.", NULL, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "ok", "H.", bad_label, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "ok", "H.", dup_labels, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "ok", "H.", digit_label, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "ok", "H.", colon_label, &f), AR_EINVAL);
    assert_int_equal(metrics_histogram(reg, "h", "H.", le_label, NULL, 0, &f), AR_EINVAL);
    assert_int_equal(metrics_histogram(reg, "h", "H.", NULL, unordered, 2, &f), AR_EINVAL);
    assert_int_equal(metrics_histogram(reg, "h", "H.", NULL, inf_bound, 2, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "ok", "", NULL, &f), AR_EINVAL); /* promtool: no help */
    assert_int_equal(metrics_gauge(reg, "ok", NULL, NULL, &f), AR_EINVAL);
    assert_int_equal(metrics_counter(reg, "_ok:name_2", "H.", le_label, &f), AR_OK);

    /* same registration again: same family; conflicting: rejected */
    assert_int_equal(metrics_counter(reg, "x_total", "H.", ab, &f), AR_OK);
    assert_int_equal(metrics_counter(reg, "x_total", "H.", ab, &g), AR_OK);
    assert_ptr_equal(f, g);
    assert_int_equal(metrics_counter(reg, "x_total", "H.", ba, &g), AR_EINVAL);
    assert_int_equal(metrics_gauge(reg, "x_total", "H.", ab, &g), AR_EINVAL);
    metrics_registry_destroy(reg);
}

static void children_are_bounded_and_extra_label_sets_share_other(void **state)
{
    const char *names[] = {"shop", "endpoint", NULL};
    char shop[32];
    const char *vals[2] = {shop, "/v1/reply"};
    struct metrics_registry *reg = new_registry();
    struct metrics_family *f;
    struct metrics_child *first, *other = NULL;
    struct parsed *ps;
    const struct sample *s;
    (void)state;
    assert_int_equal(metrics_counter(reg, "replies_total", "H.", names, &f), AR_OK);
    ps = render_parse(reg, NULL);
    assert_int_equal(count_named(ps, "replies_total"), 0); /* unused "other" not shown */

    snprintf(shop, sizeof(shop), "shop0");
    first = metrics_child(f, vals);
    for (int i = 0; i < METRICS_MAX_CHILDREN + 10; i++) {
        struct metrics_child *c;
        snprintf(shop, sizeof(shop), "shop%d", i);
        c = metrics_child(f, vals);
        metrics_inc(c, 1.0);
        if (i >= METRICS_MAX_CHILDREN) {
            if (!other)
                other = c;
            assert_ptr_equal(c, other);
        }
    }
    snprintf(shop, sizeof(shop), "shop0");
    assert_ptr_equal(metrics_child(f, vals), first); /* existing sets still resolve */
    assert_true(metrics_value(other) == 10.0);

    ps = render_parse(reg, NULL);
    assert_int_equal(count_named(ps, "replies_total"), METRICS_MAX_CHILDREN + 1);
    s = find(ps, "replies_total", "shop", "other");
    assert_string_equal(label(s, "endpoint"), "other");
    assert_true(s->value == 10.0);
    assert_true(find(ps, "replies_total", "shop", "shop999")->value == 1.0);
    metrics_registry_destroy(reg);
}

static void quantile_interpolates_within_the_bucket(void **state)
{
    const double bounds[] = {1.0, 2.0, 4.0};
    struct metrics_registry *reg = new_registry();
    struct metrics_family *f;
    struct metrics_child *c;
    (void)state;
    assert_int_equal(metrics_histogram(reg, "q_seconds", "H.", NULL, bounds, 3, &f), AR_OK);
    c = metrics_child(f, NULL);
    assert_true(isnan(metrics_quantile(c, 0.5)));
    for (int i = 0; i < 10; i++)
        metrics_observe(c, 0.5); /* (0, 1] */
    for (int i = 0; i < 10; i++)
        metrics_observe(c, 1.5); /* (1, 2] */
    for (int i = 0; i < 20; i++)
        metrics_observe(c, 3.0); /* (2, 4] */
    /* by hand: rank = q * 40 */
    assert_true(fabs(metrics_quantile(c, 0.25) - 1.0) < 1e-12); /* rank 10 */
    assert_true(fabs(metrics_quantile(c, 0.5) - 2.0) < 1e-12);  /* rank 20 */
    assert_true(fabs(metrics_quantile(c, 0.1) - 0.4) < 1e-12);  /* 0 + 4/10 */
    assert_true(fabs(metrics_quantile(c, 0.99) - (2.0 + 2.0 * 19.6 / 20.0)) < 1e-12);
    for (int i = 0; i < 60; i++)
        metrics_observe(c, 100.0); /* +Inf bucket */
    assert_true(metrics_quantile(c, 0.99) == 4.0);
    assert_true(fabs(metrics_quantile(c, 0.3) - (2.0 + 2.0 * 10.0 / 20.0)) < 1e-12);
    assert_true(isnan(metrics_quantile(c, 1.5)));
    metrics_registry_destroy(reg);
}

struct worker {
    struct metrics_family *counter, *hist;
    int n;
};

static void *work(void *arg)
{
    const struct worker *w = arg;
    const char *vals[] = {"POST", "/v1/reply"};
    /* every thread resolves the label set itself: they must all get one child */
    struct metrics_child *c = metrics_child(w->counter, vals);
    struct metrics_child *h = metrics_child(w->hist, NULL);
    for (int i = 0; i < w->n; i++) {
        metrics_inc(c, 1.0);
        metrics_observe(h, (double)(i % 4) * 0.25); /* 0, 0.25, 0.5, 0.75: exact sums */
    }
    return NULL;
}

static void concurrent_increments_sum_exactly(void **state)
{
    enum { THREADS = 4, N = 50000 };
    const char *names[] = {"method", "endpoint", NULL};
    const char *vals[] = {"POST", "/v1/reply"};
    struct metrics_registry *reg = new_registry();
    struct worker w;
    pthread_t t[THREADS];
    struct parsed *ps;
    (void)state;
    assert_int_equal(metrics_counter(reg, "c_total", "H.", names, &w.counter), AR_OK);
    assert_int_equal(metrics_histogram(reg, "h_seconds", "H.", NULL, NULL, 0, &w.hist), AR_OK);
    w.n = N;
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, work, &w), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    ps = render_parse(reg, NULL);
    assert_int_equal(count_named(ps, "c_total"), 1);
    assert_true(find(ps, "c_total", NULL, NULL)->value == (double)THREADS * N);
    assert_true(metrics_value(metrics_child(w.counter, vals)) == (double)THREADS * N);
    assert_true(find(ps, "h_seconds_count", NULL, NULL)->value == (double)THREADS * N);
    assert_true(find(ps, "h_seconds_sum", NULL, NULL)->value ==
                (double)THREADS * (N / 4) * (0.0 + 0.25 + 0.5 + 0.75));
    assert_true(find(ps, "h_seconds_bucket", "le", "0.25")->value == (double)THREADS * N / 2);
    metrics_registry_destroy(reg);
}

static void out_of_memory_is_reported_and_leaks_nothing(void **state)
{
    const char *names[] = {"a", NULL};
    const char *vals[] = {"x"};
    enum ar_status st = AR_ENOMEM;
    (void)state;
    for (uint64_t n = 1; st == AR_ENOMEM && n < 200; n++) {
        struct metrics_registry *reg = NULL;
        struct metrics_family *f, *h;
        char *text = NULL;
        size_t len;
        ar_alloc_fail_after(n);
        st = metrics_registry_create(&reg);
        if (st == AR_OK)
            st = metrics_counter(reg, "a_total", "help", names, &f);
        if (st == AR_OK)
            st = metrics_histogram(reg, "h_seconds", "help", names, NULL, 0, &h);
        if (st == AR_OK) {
            /* child creation cannot fail: without memory it answers "other" */
            struct metrics_child *c = metrics_child(f, vals);
            assert_non_null(c);
            metrics_inc(c, 1.0);
            metrics_observe(metrics_child(h, vals), 0.1);
            st = metrics_render(reg, &text, &len);
        }
        ar_alloc_fail_after(0);
        ar_free(text);
        metrics_registry_destroy(reg);
    }
    assert_int_equal(st, AR_OK);
}

/* ---- collectors -------------------------------------------------------------------------- */

struct counting_collector {
    const char *name;
    int calls;
};

static void collect_counting(struct ar_buf *b, void *user)
{
    struct counting_collector *c = user;
    char line[160];
    c->calls++;
    snprintf(line, sizeof(line), "# HELP %s Renders so far.\n# TYPE %s gauge\n%s %d\n", c->name,
             c->name, c->name, c->calls);
    ar_buf_puts(b, line);
}

static void collectors_render_after_the_families_once_per_pair(void **state)
{
    struct counting_collector a = {"coll_a", 0}, b = {"coll_b", 0};
    struct counting_collector more[METRICS_MAX_COLLECTORS];
    struct metrics_registry *reg = new_registry();
    struct metrics_family *f;
    struct parsed *ps;
    char *text;
    (void)state;
    assert_int_equal(metrics_collector_add(reg, NULL, &a), AR_EINVAL);
    assert_int_equal(metrics_collector_add(reg, collect_counting, &a), AR_OK);
    assert_int_equal(metrics_collector_add(reg, collect_counting, &a), AR_OK); /* again: once */
    assert_int_equal(metrics_collector_add(reg, collect_counting, &b), AR_OK);
    /* a family registered after the collectors still renders before them */
    assert_int_equal(metrics_counter(reg, "fam_total", "F.", NULL, &f), AR_OK);
    metrics_inc(metrics_child(f, NULL), 4);
    ps = render_parse(reg, &text);
    assert_true(find(ps, "coll_a", NULL, NULL)->value == 1.0);
    assert_true(find(ps, "coll_b", NULL, NULL)->value == 1.0);
    assert_true(strstr(text, "fam_total 4\n") < strstr(text, "# HELP coll_a"));
    assert_true(strstr(text, "# HELP coll_a") < strstr(text, "# HELP coll_b"));
    ar_free(text);
    ps = render_parse(reg, NULL); /* called at every rendering */
    assert_true(find(ps, "coll_a", NULL, NULL)->value == 2.0);
    assert_int_equal(a.calls, 2);
    assert_int_equal(b.calls, 2);
    /* bounded: two in, METRICS_MAX_COLLECTORS - 2 more fit, the next does not */
    for (int i = 0; i < METRICS_MAX_COLLECTORS; i++) {
        more[i].name = "coll_more";
        more[i].calls = 0;
        assert_int_equal(metrics_collector_add(reg, collect_counting, &more[i]),
                         i < METRICS_MAX_COLLECTORS - 2 ? AR_OK : AR_EINVAL);
    }
    metrics_registry_destroy(reg);
}

/* ---- the process collector ----------------------------------------------------------------- */

static double t_main; /* wall clock when main() began */

static double cpu_of_rusage(void)
{
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static struct metrics_process process_now(void)
{
    struct metrics_process p;
    struct ar_err err = {0};
    if (metrics_process_read(&p, &err) != AR_OK)
        fail_msg("metrics_process_read: %s", err.msg);
    return p;
}

static void process_figures_match_the_kernel(void **state)
{
    enum { N_FDS = 7, MIB = 1 << 20 };
    struct metrics_process a, b;
    struct rlimit rl, low;
    int fds[N_FDS];
    volatile double sink = 0;
    double cpu0, cpu1;
    char *mem;
    (void)state;
    assert_int_equal(metrics_process_read(NULL, NULL), AR_EINVAL);

    /* descriptors: exactly the ones opened here come and go */
    a = process_now();
    for (int i = 0; i < N_FDS; i++)
        assert_true((fds[i] = open("/dev/null", O_RDONLY)) >= 0);
    b = process_now();
    assert_true(b.open_fds == a.open_fds + N_FDS);
    for (int i = 0; i < N_FDS; i++)
        close(fds[i]);
    assert_true(process_now().open_fds == a.open_fds);
    assert_true(a.open_fds >= 3); /* stdin, stdout, stderr at least */

    /* the descriptor limit is the soft RLIMIT_NOFILE, whatever it is set to */
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    assert_true(a.max_fds ==
                (rl.rlim_cur == RLIM_INFINITY ? (double)INFINITY : (double)rl.rlim_cur));
    low = rl;
    low.rlim_cur = 200;
    if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= 200) {
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
        assert_true(process_now().max_fds == 200.0);
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }

    /* memory: 64 MiB written shows in the resident size */
    a = process_now();
    mem = malloc(64 * MIB);
    assert_non_null(mem);
    memset(mem, 1, 64 * MIB);
    b = process_now();
    assert_true(b.resident_bytes - a.resident_bytes >= 60.0 * MIB);
    assert_true(b.virtual_bytes >= b.resident_bytes);
    assert_true(b.virtual_bytes - a.virtual_bytes >= 60.0 * MIB);
    sink += mem[12345];
    free(mem);

    /* CPU: what getrusage says, to the kernel's clock tick, after burning 0.2 s */
    cpu0 = cpu_of_rusage();
    while (cpu_of_rusage() - cpu0 < 0.2)
        for (int i = 0; i < 100000; i++)
            sink += i * 0.5;
    b = process_now();
    cpu1 = cpu_of_rusage();
    assert_true(b.cpu_seconds >= cpu0 + 0.15);
    if (!(fabs(b.cpu_seconds - cpu1) <= 0.05))
        fail_msg("cpu %.3f s, getrusage %.3f s", b.cpu_seconds, cpu1);

    /* a command name with spaces and parentheses does not shift the fields read after it */
    {
        char name[17] = {0};
        struct metrics_process odd;
        assert_int_equal(prctl(PR_GET_NAME, name), 0);
        assert_int_equal(prctl(PR_SET_NAME, "x) 1 2 (y) 3"), 0);
        odd = process_now();
        assert_int_equal(prctl(PR_SET_NAME, name), 0);
        assert_true(odd.open_fds == b.open_fds);
        assert_true(odd.start_time_s == b.start_time_s);
        assert_true(odd.cpu_seconds >= b.cpu_seconds && odd.cpu_seconds <= b.cpu_seconds + 0.05);
        assert_true(fabs(odd.resident_bytes - b.resident_bytes) < 16.0 * MIB);
    }

    /* start: a little before main() began (the boot time is known to the second) */
    if (!(b.start_time_s <= t_main + 1.0 && b.start_time_s >= t_main - 60.0))
        fail_msg("start %.2f, main at %.2f", b.start_time_s, t_main);
    (void)sink;
}

static void process_collector_renders_the_standard_families(void **state)
{
    static const char *const names[][2] = {
        {"process_cpu_seconds_total", "counter"},
        {"process_resident_memory_bytes", "gauge"},
        {"process_virtual_memory_bytes", "gauge"},
        {"process_open_fds", "gauge"},
        {"process_max_fds", "gauge"},
        {"process_start_time_seconds", "gauge"},
    };
    struct metrics_registry *reg = new_registry();
    struct metrics_process before, after;
    struct parsed *ps;
    (void)state;
    assert_int_equal(metrics_process_register(reg), AR_OK);
    assert_int_equal(metrics_process_register(reg), AR_OK); /* idempotent */
    before = process_now();
    ps = render_parse(reg, NULL);
    after = process_now();
    assert_int_equal(ps->n, 6); /* one sample each, rendered once, no labels */
    for (size_t i = 0; i < AR_ARRAY_LEN(names); i++) {
        const struct sample *s = find(ps, names[i][0], NULL, NULL);
        assert_int_equal(s->n_labels, 0);
        assert_string_equal(type_of(ps, names[i][0]), names[i][1]);
    }
    assert_true(find(ps, "process_open_fds", NULL, NULL)->value == before.open_fds);
    assert_true(find(ps, "process_max_fds", NULL, NULL)->value == before.max_fds);
    assert_true(find(ps, "process_start_time_seconds", NULL, NULL)->value == before.start_time_s);
    assert_true(find(ps, "process_cpu_seconds_total", NULL, NULL)->value >= before.cpu_seconds);
    assert_true(find(ps, "process_cpu_seconds_total", NULL, NULL)->value <= after.cpu_seconds);
    assert_true(find(ps, "process_resident_memory_bytes", NULL, NULL)->value > 0);
    metrics_registry_destroy(reg);
}

/* metrics_sum adds up the children a filter keeps: checked against sums kept here while the
 * same values go in, over more label sets than a family holds (the "other" child counts). */
static bool keep_get(const char *const *names, const char *const *values, size_t n, void *user)
{
    (void)user;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], "method"))
            return values && values[i] && !strcmp(values[i], "GET");
    return false;
}

static void sum_adds_up_the_kept_children(void **state)
{
    static const char *const labels[] = {"method", "path", NULL};
    static const double bounds[] = {1, 2, 4};
    struct metrics_registry *reg;
    struct metrics_family *c, *h;
    struct metrics_sum sum;
    double want_all = 0, want_get = 0;
    uint64_t want_buckets[4] = {0};
    (void)state;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    assert_int_equal(metrics_counter(reg, "c_total", "c", labels, &c), AR_OK);
    assert_int_equal(metrics_histogram(reg, "h_seconds", "h", labels, bounds, 3, &h), AR_OK);
    for (int i = 0; i < METRICS_MAX_CHILDREN + 50; i++) {
        char path[32];
        const char *method = i % 3 ? "POST" : "GET";
        double v = (double)(i % 7) * 0.75;
        snprintf(path, sizeof(path), "/p%d", i);
        metrics_inc(metrics_child(c, (const char *const[]){method, path}), (double)i);
        metrics_observe(metrics_child(h, (const char *const[]){method, path}), v);
        want_all += (double)i;
        if (i % 3 == 0 && i < METRICS_MAX_CHILDREN) { /* past the bound: "other", no GET */
            want_get += (double)i;
        }
        want_buckets[v <= 1 ? 0 : v <= 2 ? 1 : v <= 4 ? 2 : 3]++;
    }
    assert_int_equal(metrics_sum(reg, "c_total", NULL, NULL, &sum), AR_OK);
    assert_true(sum.found && sum.type == METRICS_TYPE_COUNTER);
    assert_true(sum.value == want_all);
    assert_int_equal(metrics_sum(reg, "c_total", keep_get, NULL, &sum), AR_OK);
    assert_true(sum.value == want_get);
    assert_int_equal(metrics_sum(reg, "h_seconds", NULL, NULL, &sum), AR_OK);
    assert_int_equal(sum.n_bounds, 3);
    assert_int_equal(sum.count, METRICS_MAX_CHILDREN + 50);
    for (int b = 0; b < 4; b++)
        assert_int_equal(sum.buckets[b], want_buckets[b]);
    /* the quantile of the summed buckets lies in the bucket that holds the true one */
    {
        double q = metrics_buckets_quantile(sum.bounds, sum.n_bounds, sum.buckets, 0.5);
        assert_true(q > 2 && q <= 4); /* values 0, .75, 1.5, 2.25, 3, 3.75, 4.5: median 2.25 */
    }
    assert_int_equal(metrics_sum(reg, "nope", NULL, NULL, &sum), AR_OK);
    assert_false(sum.found);
    assert_true(sum.value == 0 && sum.count == 0);
    assert_int_equal(metrics_sum(NULL, "c_total", NULL, NULL, &sum), AR_EINVAL);
    assert_true(isnan(metrics_buckets_quantile(bounds, 3, (const uint64_t[]){0, 0, 0, 0}, 0.5)));
    metrics_registry_destroy(reg);
}

int main(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    t_main = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counters_and_gauges_render_their_values),
        cmocka_unit_test(histogram_buckets_sum_and_count_match_observations),
        cmocka_unit_test(label_values_and_help_are_escaped),
        cmocka_unit_test(names_are_validated),
        cmocka_unit_test(children_are_bounded_and_extra_label_sets_share_other),
        cmocka_unit_test(quantile_interpolates_within_the_bucket),
        cmocka_unit_test(sum_adds_up_the_kept_children),
        cmocka_unit_test(concurrent_increments_sum_exactly),
        cmocka_unit_test(out_of_memory_is_reported_and_leaks_nothing),
        cmocka_unit_test(collectors_render_after_the_families_once_per_pair),
        cmocka_unit_test(process_figures_match_the_kernel),
        cmocka_unit_test(process_collector_renders_the_standard_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
