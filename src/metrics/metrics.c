/* metrics.c - metric families, label-set children and the Prometheus text renderer.
 * Values live in 64-bit atomics (doubles stored as their bits and updated by
 * compare-and-swap); locks guard only the structure: family registration (registry lock)
 * and child creation (family lock), both taken by the renderer. */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "base/hash.h"
#include "metrics_internal.h"

/* the edges of earlier releases (so queries on le="0.25" or "2.5" keep working) plus 0.3 and 3 */
const double metrics_default_buckets[METRICS_DEFAULT_BUCKETS_LEN] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25, 0.3,
    0.5,    1.0,   2.5,    3.0,   5.0,  10.0,  20.0, 30.0, 60.0,
};

#define INDEX_SIZE 2048 /* open-addressing slots, a power of two >= 2 * METRICS_MAX_CHILDREN */

struct metrics_child {
    struct metrics_family *fam;
    char **values;              /* owned, (n_labels,) */
    _Atomic uint64_t bits;      /* counter/gauge value or histogram sum, as double bits */
    atomic_bool touched;        /* the "other" child is rendered only once handed out */
    _Atomic uint64_t buckets[]; /* histogram only: (n_bounds + 1,) per bucket, last is +Inf */
};

struct metrics_family {
    char *name; /* owned */
    char *help; /* owned */
    enum metrics_type type;
    size_t n_labels;
    char **label_names; /* owned, (n_labels,) */
    double *bounds;     /* owned, (n_bounds,) histogram upper bounds, increasing */
    size_t n_bounds;
    pthread_mutex_t lock;            /* guards children, n_children, index */
    struct metrics_child **children; /* owned, (METRICS_MAX_CHILDREN,) in creation order */
    size_t n_children;
    uint32_t *index;             /* owned, (INDEX_SIZE,): child position + 1, 0 = empty */
    struct metrics_child *other; /* owned, labelled families only */
};

struct metrics_collector {
    metrics_collect_fn fn;
    void *user; /* borrowed */
};

struct metrics_registry {
    pthread_mutex_t lock;             /* guards families, n_families, cap, collectors */
    struct metrics_family **families; /* owned, registration order */
    size_t n_families, cap;
    struct metrics_collector collectors[METRICS_MAX_COLLECTORS];
    size_t n_collectors;
};

/* ---- doubles in atomics ---------------------------------------------------------------- */

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

/* ---- names ----------------------------------------------------------------------------- */

static bool name_valid(const char *s, bool colon)
{
    if (!s || !*s)
        return false;
    for (size_t i = 0; s[i]; i++) {
        char ch = s[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
                  (colon && ch == ':') || (i > 0 && ch >= '0' && ch <= '9');
        if (!ok)
            return false;
    }
    return true;
}

/* ---- children -------------------------------------------------------------------------- */

static void child_free(struct metrics_child *c, size_t n_labels)
{
    if (!c)
        return;
    if (c->values)
        for (size_t i = 0; i < n_labels; i++)
            ar_free(c->values[i]);
    ar_free(c->values);
    ar_free(c);
}

static struct metrics_child *child_new(struct metrics_family *f, const char *const *values)
{
    size_t n_buckets = f->type == METRICS_TYPE_HISTOGRAM ? f->n_bounds + 1 : 0;
    struct metrics_child *c = ar_calloc(1, sizeof(*c) + n_buckets * sizeof(c->buckets[0]));
    if (!c)
        return NULL;
    c->fam = f;
    atomic_init(&c->bits, dbits(0.0));
    atomic_init(&c->touched, false);
    for (size_t i = 0; i < n_buckets; i++)
        atomic_init(&c->buckets[i], 0);
    if (f->n_labels) {
        c->values = ar_calloc(f->n_labels, sizeof(*c->values));
        if (!c->values)
            goto fail;
        for (size_t i = 0; i < f->n_labels; i++) {
            c->values[i] = ar_strdup(values && values[i] ? values[i] : "");
            if (!c->values[i])
                goto fail;
        }
    }
    return c;
fail:
    child_free(c, f->n_labels);
    return NULL;
}

static uint32_t hash_values(const struct metrics_family *f, const char *const *values)
{
    uint32_t h = AR_FNV32_BASIS; /* FNV-1a over the values, each followed by a 0xff byte */
    for (size_t i = 0; i < f->n_labels; i++) {
        const char *v = values[i] ? values[i] : "";
        h = ar_fnv1a32(h, v, strlen(v));
        h = ar_fnv1a32(h, "\xff", 1);
    }
    return h;
}

static bool values_equal(const struct metrics_family *f, const struct metrics_child *c,
                         const char *const *values)
{
    for (size_t i = 0; i < f->n_labels; i++)
        if (strcmp(c->values[i], values[i] ? values[i] : "") != 0)
            return false;
    return true;
}

struct metrics_child *metrics_child(struct metrics_family *f, const char *const *values)
{
    struct metrics_child *c = NULL;
    uint32_t slot;
    if (!f)
        return NULL;
    if (f->n_labels == 0)
        return f->children[0];
    if (!values || values_equal(f, f->other, values)) {
        atomic_store_explicit(&f->other->touched, true, memory_order_relaxed);
        return f->other;
    }
    pthread_mutex_lock(&f->lock);
    slot = hash_values(f, values) & (INDEX_SIZE - 1);
    for (; f->index[slot]; slot = (slot + 1) & (INDEX_SIZE - 1)) {
        struct metrics_child *e = f->children[f->index[slot] - 1];
        if (values_equal(f, e, values)) {
            c = e;
            break;
        }
    }
    if (!c && f->n_children < METRICS_MAX_CHILDREN) {
        c = child_new(f, values);
        if (c) {
            f->children[f->n_children++] = c;
            f->index[slot] = (uint32_t)f->n_children;
        }
    }
    pthread_mutex_unlock(&f->lock);
    if (!c) {
        atomic_store_explicit(&f->other->touched, true, memory_order_relaxed);
        c = f->other;
    }
    return c;
}

/* ---- families -------------------------------------------------------------------------- */

static void family_free(struct metrics_family *f)
{
    if (!f)
        return;
    if (f->children)
        for (size_t i = 0; i < f->n_children; i++)
            child_free(f->children[i], f->n_labels);
    child_free(f->other, f->n_labels);
    if (f->label_names)
        for (size_t i = 0; i < f->n_labels; i++)
            ar_free(f->label_names[i]);
    pthread_mutex_destroy(&f->lock);
    ar_free(f->index);
    ar_free(f->children);
    ar_free(f->label_names);
    ar_free(f->bounds);
    ar_free(f->help);
    ar_free(f->name);
    ar_free(f);
}

static enum ar_status family_new(enum metrics_type type, const char *name, const char *help,
                                 const char *const *labels, size_t n_labels, const double *bounds,
                                 size_t n_bounds, struct metrics_family **out)
{
    const char *other_values[METRICS_MAX_LABELS];
    struct metrics_family *f = ar_calloc(1, sizeof(*f));
    if (!f)
        return AR_ENOMEM;
    pthread_mutex_init(&f->lock, NULL);
    f->type = type;
    f->n_labels = n_labels;
    f->n_bounds = n_bounds;
    f->name = ar_strdup(name);
    f->help = ar_strdup(help);
    f->children = ar_calloc(n_labels ? METRICS_MAX_CHILDREN : 1, sizeof(*f->children));
    if (!f->name || !f->help || !f->children)
        goto fail;
    if (n_bounds) {
        f->bounds = ar_malloc(n_bounds * sizeof(*f->bounds));
        if (!f->bounds)
            goto fail;
        memcpy(f->bounds, bounds, n_bounds * sizeof(*f->bounds));
    }
    if (n_labels) {
        f->label_names = ar_calloc(n_labels, sizeof(*f->label_names));
        f->index = ar_calloc(INDEX_SIZE, sizeof(*f->index));
        if (!f->label_names || !f->index)
            goto fail;
        for (size_t i = 0; i < n_labels; i++) {
            f->label_names[i] = ar_strdup(labels[i]);
            if (!f->label_names[i])
                goto fail;
            other_values[i] = "other";
        }
        f->other = child_new(f, other_values);
        if (!f->other)
            goto fail;
    } else {
        f->children[0] = child_new(f, NULL);
        if (!f->children[0])
            goto fail;
        f->n_children = 1;
    }
    *out = f;
    return AR_OK;
fail:
    family_free(f);
    return AR_ENOMEM;
}

static bool family_matches(const struct metrics_family *f, enum metrics_type type,
                           const char *const *labels, size_t n_labels, const double *bounds,
                           size_t n_bounds)
{
    if (f->type != type || f->n_labels != n_labels || f->n_bounds != n_bounds)
        return false;
    for (size_t i = 0; i < n_labels; i++)
        if (strcmp(f->label_names[i], labels[i]) != 0)
            return false;
    for (size_t i = 0; i < n_bounds; i++)
        if (f->bounds[i] != bounds[i])
            return false;
    return true;
}

static enum ar_status registry_add(struct metrics_registry *reg, enum metrics_type type,
                                   const char *name, const char *help, const char *const *labels,
                                   const double *bounds, size_t n_bounds,
                                   struct metrics_family **out)
{
    size_t n_labels = 0;
    enum ar_status st = AR_OK;
    struct metrics_family *f = NULL;
    if (!reg || !out || !name_valid(name, true) || !help || !*help)
        return AR_EINVAL;
    for (; labels && labels[n_labels]; n_labels++) {
        const char *l = labels[n_labels];
        if (n_labels == METRICS_MAX_LABELS || !name_valid(l, false) ||
            (l[0] == '_' && l[1] == '_') ||
            (type == METRICS_TYPE_HISTOGRAM && strcmp(l, "le") == 0))
            return AR_EINVAL;
        for (size_t j = 0; j < n_labels; j++)
            if (strcmp(labels[j], l) == 0)
                return AR_EINVAL;
    }
    if (type == METRICS_TYPE_HISTOGRAM) {
        if (n_bounds == 0 || n_bounds > METRICS_MAX_BUCKETS)
            return AR_EINVAL;
        for (size_t i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
                return AR_EINVAL;
    }
    pthread_mutex_lock(&reg->lock);
    for (size_t i = 0; i < reg->n_families; i++) {
        if (strcmp(reg->families[i]->name, name) == 0) {
            f = reg->families[i];
            if (!family_matches(f, type, labels, n_labels, bounds, n_bounds))
                st = AR_EINVAL;
            goto out;
        }
    }
    if (reg->n_families == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 16;
        struct metrics_family **fs = ar_realloc(reg->families, cap * sizeof(*fs));
        if (!fs) {
            st = AR_ENOMEM;
            goto out;
        }
        reg->families = fs;
        reg->cap = cap;
    }
    st = family_new(type, name, help, labels, n_labels, bounds, n_bounds, &f);
    if (st == AR_OK)
        reg->families[reg->n_families++] = f;
out:
    pthread_mutex_unlock(&reg->lock);
    if (st == AR_OK)
        *out = f;
    return st;
}

enum ar_status metrics_counter(struct metrics_registry *reg, const char *name, const char *help,
                               const char *const *label_names, struct metrics_family **out)
{
    return registry_add(reg, METRICS_TYPE_COUNTER, name, help, label_names, NULL, 0, out);
}

enum ar_status metrics_gauge(struct metrics_registry *reg, const char *name, const char *help,
                             const char *const *label_names, struct metrics_family **out)
{
    return registry_add(reg, METRICS_TYPE_GAUGE, name, help, label_names, NULL, 0, out);
}

enum ar_status metrics_histogram(struct metrics_registry *reg, const char *name, const char *help,
                                 const char *const *label_names, const double *bounds,
                                 size_t n_bounds, struct metrics_family **out)
{
    if (!bounds) {
        bounds = metrics_default_buckets;
        n_bounds = METRICS_DEFAULT_BUCKETS_LEN;
    }
    return registry_add(reg, METRICS_TYPE_HISTOGRAM, name, help, label_names, bounds, n_bounds,
                        out);
}

enum ar_status metrics_collector_add(struct metrics_registry *reg, metrics_collect_fn fn,
                                     void *user)
{
    enum ar_status st = AR_OK;
    if (!reg || !fn)
        return AR_EINVAL;
    pthread_mutex_lock(&reg->lock);
    for (size_t i = 0; i < reg->n_collectors; i++)
        if (reg->collectors[i].fn == fn && reg->collectors[i].user == user)
            goto out;
    if (reg->n_collectors == METRICS_MAX_COLLECTORS) {
        st = AR_EINVAL;
        goto out;
    }
    reg->collectors[reg->n_collectors].fn = fn;
    reg->collectors[reg->n_collectors].user = user;
    reg->n_collectors++;
out:
    pthread_mutex_unlock(&reg->lock);
    return st;
}

enum ar_status metrics_registry_create(struct metrics_registry **out)
{
    struct metrics_registry *reg;
    if (!out)
        return AR_EINVAL;
    reg = ar_calloc(1, sizeof(*reg));
    if (!reg)
        return AR_ENOMEM;
    pthread_mutex_init(&reg->lock, NULL);
    *out = reg;
    return AR_OK;
}

void metrics_registry_destroy(struct metrics_registry *reg)
{
    if (!reg)
        return;
    for (size_t i = 0; i < reg->n_families; i++)
        family_free(reg->families[i]);
    ar_free(reg->families);
    pthread_mutex_destroy(&reg->lock);
    ar_free(reg);
}

/* ---- updates and reads ----------------------------------------------------------------- */

void metrics_inc(struct metrics_child *c, double v)
{
    if (!c || c->fam->type == METRICS_TYPE_HISTOGRAM)
        return;
    if (c->fam->type == METRICS_TYPE_COUNTER && !(v >= 0.0))
        return;
    atomic_add_double(&c->bits, v);
}

void metrics_set(struct metrics_child *c, double v)
{
    if (!c || c->fam->type != METRICS_TYPE_GAUGE)
        return;
    atomic_store_explicit(&c->bits, dbits(v), memory_order_relaxed);
}

void metrics_observe(struct metrics_child *c, double v)
{
    const struct metrics_family *f;
    size_t lo = 0, hi;
    if (!c || c->fam->type != METRICS_TYPE_HISTOGRAM || isnan(v))
        return;
    f = c->fam;
    hi = f->n_bounds;
    while (lo < hi) { /* first bound >= v; n_bounds is the +Inf bucket */
        size_t mid = lo + (hi - lo) / 2;
        if (v <= f->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&c->buckets[lo], 1, memory_order_relaxed);
    atomic_add_double(&c->bits, v);
}

double metrics_value(const struct metrics_child *c)
{
    return c ? bitsd(atomic_load_explicit(&c->bits, memory_order_relaxed)) : 0.0;
}

/* Non-cumulative bucket counts into counts (n_bounds + 1); returns their total. */
static uint64_t snapshot_buckets(const struct metrics_child *c, uint64_t *counts)
{
    uint64_t total = 0;
    for (size_t i = 0; i <= c->fam->n_bounds; i++) {
        counts[i] = atomic_load_explicit(&c->buckets[i], memory_order_relaxed);
        total += counts[i];
    }
    return total;
}

uint64_t metrics_histogram_count(const struct metrics_child *c)
{
    uint64_t counts[METRICS_MAX_BUCKETS + 1];
    if (!c || c->fam->type != METRICS_TYPE_HISTOGRAM)
        return 0;
    return snapshot_buckets(c, counts);
}

double metrics_buckets_quantile(const double *bounds, size_t n_bounds, const uint64_t *counts,
                                double q)
{
    uint64_t total = 0, cum = 0;
    double rank;
    if (!bounds || !counts || n_bounds == 0 || !(q >= 0.0 && q <= 1.0))
        return NAN;
    for (size_t i = 0; i <= n_bounds; i++)
        total += counts[i];
    if (total == 0)
        return NAN;
    rank = q * (double)total;
    for (size_t i = 0; i < n_bounds; i++) {
        if (counts[i] > 0 && (double)(cum + counts[i]) >= rank) {
            double lower = i > 0 ? bounds[i - 1] : (bounds[0] > 0.0 ? 0.0 : bounds[0]);
            double upper = bounds[i];
            return lower + (upper - lower) * (rank - (double)cum) / (double)counts[i];
        }
        cum += counts[i];
    }
    return bounds[n_bounds - 1];
}

double metrics_quantile(const struct metrics_child *c, double q)
{
    uint64_t counts[METRICS_MAX_BUCKETS + 1];
    if (!c || c->fam->type != METRICS_TYPE_HISTOGRAM)
        return NAN;
    snapshot_buckets(c, counts);
    return metrics_buckets_quantile(c->fam->bounds, c->fam->n_bounds, counts, q);
}

/* ---- sums over children ---------------------------------------------------------------- */

static void sum_child(const struct metrics_family *f, const struct metrics_child *c,
                      metrics_keep_fn keep, void *user, struct metrics_sum *out)
{
    if (keep && !keep((const char *const *)f->label_names, (const char *const *)c->values,
                      f->n_labels, user))
        return;
    out->value += metrics_value(c);
    if (f->type == METRICS_TYPE_HISTOGRAM) {
        uint64_t counts[METRICS_MAX_BUCKETS + 1];
        out->count += snapshot_buckets(c, counts);
        for (size_t i = 0; i <= f->n_bounds; i++)
            out->buckets[i] += counts[i];
    }
}

enum ar_status metrics_sum(struct metrics_registry *reg, const char *name, metrics_keep_fn keep,
                           void *user, struct metrics_sum *out)
{
    if (!reg || !name || !out)
        return AR_EINVAL;
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&reg->lock);
    for (size_t i = 0; i < reg->n_families; i++) {
        struct metrics_family *f = reg->families[i];
        if (strcmp(f->name, name) != 0)
            continue;
        out->found = true;
        out->type = f->type;
        if (f->type == METRICS_TYPE_HISTOGRAM) {
            out->n_bounds = f->n_bounds;
            memcpy(out->bounds, f->bounds, f->n_bounds * sizeof(f->bounds[0]));
        }
        pthread_mutex_lock(&f->lock);
        for (size_t j = 0; j < f->n_children; j++)
            sum_child(f, f->children[j], keep, user, out);
        pthread_mutex_unlock(&f->lock);
        if (f->other && atomic_load_explicit(&f->other->touched, memory_order_relaxed))
            sum_child(f, f->other, keep, user, out);
        break;
    }
    pthread_mutex_unlock(&reg->lock);
    return AR_OK;
}

/* ---- rendering ------------------------------------------------------------------------- */

/* Escapes backslash and newline, and also the double quote when quote is set. */
static void sb_escaped(struct ar_buf *b, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            ar_buf_puts(b, "\\\\");
        else if (*s == '\n')
            ar_buf_puts(b, "\\n");
        else if (quote && *s == '"')
            ar_buf_puts(b, "\\\"");
        else
            ar_buf_put(b, s, 1);
    }
}

void metrics_format_double(char *buf, size_t size, double v)
{
    if (isnan(v)) {
        snprintf(buf, size, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, size, v > 0 ? "+Inf" : "-Inf");
    } else {
        snprintf(buf, size, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, size, "%.17g", v);
    }
}

static void sb_double(struct ar_buf *b, double v)
{
    char buf[40];
    metrics_format_double(buf, sizeof(buf), v);
    ar_buf_puts(b, buf);
}

/* name{l1="v1",...[,le="x"]} value\n */
static void render_sample(struct ar_buf *b, const struct metrics_family *f,
                          const struct metrics_child *c, const char *suffix, const char *le,
                          double v)
{
    ar_buf_puts(b, f->name);
    ar_buf_puts(b, suffix);
    if (f->n_labels || le) {
        ar_buf_puts(b, "{");
        for (size_t i = 0; i < f->n_labels; i++) {
            if (i)
                ar_buf_puts(b, ",");
            ar_buf_puts(b, f->label_names[i]);
            ar_buf_puts(b, "=\"");
            sb_escaped(b, c->values[i], true);
            ar_buf_puts(b, "\"");
        }
        if (le) {
            ar_buf_puts(b, f->n_labels ? ",le=\"" : "le=\"");
            ar_buf_puts(b, le);
            ar_buf_puts(b, "\"");
        }
        ar_buf_puts(b, "}");
    }
    ar_buf_puts(b, " ");
    sb_double(b, v);
    ar_buf_puts(b, "\n");
}

static void render_child(struct ar_buf *b, const struct metrics_family *f,
                         const struct metrics_child *c)
{
    uint64_t counts[METRICS_MAX_BUCKETS + 1], total, cum = 0;
    char le[40];
    double sum;
    if (f->type != METRICS_TYPE_HISTOGRAM) {
        render_sample(b, f, c, "", NULL, metrics_value(c));
        return;
    }
    /* the count is the sum of the snapshot, so +Inf == _count even under concurrent
     * observations; the sum may be a few observations ahead or behind */
    total = snapshot_buckets(c, counts);
    sum = metrics_value(c);
    for (size_t i = 0; i < f->n_bounds; i++) {
        cum += counts[i];
        metrics_format_double(le, sizeof(le), f->bounds[i]);
        render_sample(b, f, c, "_bucket", le, (double)cum);
    }
    render_sample(b, f, c, "_bucket", "+Inf", (double)total);
    render_sample(b, f, c, "_sum", NULL, sum);
    render_sample(b, f, c, "_count", NULL, (double)total);
}

static const char *type_name(enum metrics_type t)
{
    switch (t) {
    case METRICS_TYPE_COUNTER:
        return "counter";
    case METRICS_TYPE_GAUGE:
        return "gauge";
    case METRICS_TYPE_HISTOGRAM:
        return "histogram";
    }
    return "untyped";
}

enum ar_status metrics_render(struct metrics_registry *reg, char **out, size_t *len)
{
    struct ar_buf b = {0};
    struct metrics_collector collectors[METRICS_MAX_COLLECTORS];
    size_t n_collectors;
    if (!reg || !out || !len)
        return AR_EINVAL;
    pthread_mutex_lock(&reg->lock);
    n_collectors = reg->n_collectors;
    memcpy(collectors, reg->collectors, n_collectors * sizeof(collectors[0]));
    for (size_t i = 0; i < reg->n_families; i++) {
        struct metrics_family *f = reg->families[i];
        ar_buf_puts(&b, "# HELP ");
        ar_buf_puts(&b, f->name);
        ar_buf_puts(&b, " ");
        sb_escaped(&b, f->help, false);
        ar_buf_puts(&b, "\n# TYPE ");
        ar_buf_puts(&b, f->name);
        ar_buf_puts(&b, " ");
        ar_buf_puts(&b, type_name(f->type));
        ar_buf_puts(&b, "\n");
        pthread_mutex_lock(&f->lock);
        for (size_t j = 0; j < f->n_children; j++)
            render_child(&b, f, f->children[j]);
        pthread_mutex_unlock(&f->lock);
        if (f->other && atomic_load_explicit(&f->other->touched, memory_order_relaxed))
            render_child(&b, f, f->other);
    }
    pthread_mutex_unlock(&reg->lock);
    for (size_t i = 0; i < n_collectors; i++)
        collectors[i].fn(&b, collectors[i].user);
    if (!(*out = ar_buf_take(&b, len)))
        return AR_ENOMEM;
    return AR_OK;
}
