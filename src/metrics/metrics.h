/* metrics.h - counters, gauges and histograms with label sets, rendered in the Prometheus
 * text exposition format 0.0.4 (served by the server's /metrics endpoint), plus collectors
 * that read their figures at scrape time (the standard process_* metrics, process.c).
 * Hot path: resolve a label set to a child once (metrics_child), cache the pointer, then
 * update it with lock-free atomics from any thread. */
#ifndef AR_METRICS_H
#define AR_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "autoreply.h"

/* Children per family beyond which new label sets all share one child whose label values
 * are all "other" (bounds memory when a label value comes from clients). */
#define METRICS_MAX_CHILDREN 1000
#define METRICS_MAX_LABELS 8
#define METRICS_MAX_BUCKETS 64
#define METRICS_MAX_COLLECTORS 8

enum metrics_type { METRICS_TYPE_COUNTER, METRICS_TYPE_GAUGE, METRICS_TYPE_HISTOGRAM };

struct metrics_registry;
struct metrics_family;
struct metrics_child;
struct ar_buf; /* base/base.h */

/* Default latency buckets in seconds, 0.0005 .. 60 (METRICS_DEFAULT_BUCKETS_LEN values). The
 * edges include 0.1, 0.3, 0.5, 1 and 3 s, so that latency objectives stated at those values
 * ("P99 above 1 s", "90 % under 300 ms") are read exactly from the buckets rather than
 * interpolated inside one. */
#define METRICS_DEFAULT_BUCKETS_LEN 19
extern const double metrics_default_buckets[METRICS_DEFAULT_BUCKETS_LEN];

/* Returns a new empty registry; the caller owns it (metrics_registry_destroy, which frees
 * every family and child: no pointer obtained from it may be used afterwards). */
enum ar_status metrics_registry_create(struct metrics_registry **out);
void metrics_registry_destroy(struct metrics_registry *reg);

/* Registers a family. name: [a-zA-Z_:][a-zA-Z0-9_:]*; label_names: NULL-terminated array
 * (or NULL for none) of [a-zA-Z_][a-zA-Z0-9_]* not starting with "__" ("le" is also
 * reserved for histograms), at most METRICS_MAX_LABELS, no duplicates. help: what it
 * counts, in any text but not empty (Prometheus's promtool rejects a family without one).
 * Registering the same name again with the same type, labels (and buckets) returns the
 * existing family; with different ones AR_EINVAL. *out is borrowed from reg.
 * Thread-safe. AR_EINVAL, AR_ENOMEM. */
enum ar_status metrics_counter(struct metrics_registry *reg, const char *name, const char *help,
                               const char *const *label_names, struct metrics_family **out);
enum ar_status metrics_gauge(struct metrics_registry *reg, const char *name, const char *help,
                             const char *const *label_names, struct metrics_family **out);
/* bounds: n_bounds strictly increasing finite upper bounds (the "+Inf" bucket is implicit),
 * 1 <= n_bounds <= METRICS_MAX_BUCKETS; bounds NULL: metrics_default_buckets. */
enum ar_status metrics_histogram(struct metrics_registry *reg, const char *name, const char *help,
                                 const char *const *label_names, const double *bounds,
                                 size_t n_bounds, struct metrics_family **out);

/* The child for one label set: label_values has one entry per label name of the family
 * (NULL entries read as ""; label_values may be NULL for a family without labels). Created
 * on first use; after METRICS_MAX_CHILDREN children, or if memory runs out, new label sets
 * get the shared "other" child. Never NULL for a non-NULL family. Borrowed from the
 * registry. Thread-safe; takes the family's lock, so cache the result on hot paths. */
struct metrics_child *metrics_child(struct metrics_family *fam, const char *const *label_values);

/* Updates; each is one atomic operation, thread-safe, no locks, no allocation.
 * A NULL child is ignored. metrics_inc: counters (v >= 0, negative or NaN ignored) and
 * gauges (any v). metrics_set: gauges only. metrics_observe: histograms only. */
void metrics_inc(struct metrics_child *c, double v);
void metrics_set(struct metrics_child *c, double v);
void metrics_observe(struct metrics_child *c, double v);

/* Reads, for tests and benchmarks. Thread-safe. metrics_value: counter or gauge value,
 * histogram sum. metrics_histogram_count: number of observations (0 for other types). */
double metrics_value(const struct metrics_child *c);
uint64_t metrics_histogram_count(const struct metrics_child *c);

/* The q-quantile (0 <= q <= 1) estimated from a histogram child's buckets: find the bucket
 * holding rank q * count and interpolate linearly inside it (the lowest bucket starts at 0
 * when its bound is positive). A rank in the +Inf bucket answers the largest finite bound.
 * NaN when the child has no observations or is not a histogram. Thread-safe. */
double metrics_quantile(const struct metrics_child *c, double q);

/* The q-quantile estimated from histogram buckets as metrics_quantile does: bounds (n_bounds,
 * increasing), counts (n_bounds + 1, not cumulative, the last the +Inf bucket). NaN when the
 * counts are all 0 or q is outside [0, 1]. */
double metrics_buckets_quantile(const double *bounds, size_t n_bounds, const uint64_t *counts,
                                double q);

/* One family added up over its children (for summaries such as the server's /v1/stats, read
 * without parsing the exposition text). */
struct metrics_sum {
    bool found; /* the family is registered */
    enum metrics_type type;
    double value;    /* counters and gauges: the sum of the values; histograms: of sums */
    uint64_t count;  /* histograms: observations */
    size_t n_bounds; /* histograms: the family's bounds and the summed bucket counts */
    double bounds[METRICS_MAX_BUCKETS];
    uint64_t buckets[METRICS_MAX_BUCKETS + 1]; /* not cumulative, the last the +Inf bucket */
};

/* Which children metrics_sum counts: keep(label_names, label_values, n_labels, user) true to
 * count it; NULL keeps every child. Called under the family's lock: it must only look. */
typedef bool (*metrics_keep_fn)(const char *const *names, const char *const *values,
                                size_t n_labels, void *user);

/* Adds up the family called name into *out (zeroed first; found false when there is none).
 * Thread-safe. AR_EINVAL for NULL reg, name or out. */
enum ar_status metrics_sum(struct metrics_registry *reg, const char *name, metrics_keep_fn keep,
                           void *user, struct metrics_sum *out);

/* Writes the whole registry as exposition text (families in registration order, children
 * in creation order) into a new NUL-terminated buffer *out of *len bytes (NUL excluded);
 * the caller owns it (ar_free). Thread-safe. AR_ENOMEM. */
enum ar_status metrics_render(struct metrics_registry *reg, char **out, size_t *len);

/* ---- collectors -------------------------------------------------------------------------- */

/* A collector appends whole families (# HELP, # TYPE, samples) to out each time the registry
 * is rendered, after the registered families; for figures read at scrape time from outside
 * (the kernel's view of the process). It is called from the rendering thread without the
 * registry's lock, and must not register families or render. */
typedef void (*metrics_collect_fn)(struct ar_buf *out, void *user);

/* Adds fn(out, user) to the collectors of reg; the same pair again does nothing (AR_OK).
 * user is borrowed and must outlive reg. Thread-safe. AR_EINVAL: NULL fn, or already
 * METRICS_MAX_COLLECTORS others. */
enum ar_status metrics_collector_add(struct metrics_registry *reg, metrics_collect_fn fn,
                                     void *user);

/* ---- the process collector (process.c) ----------------------------------------------------- */

/* The calling process as the kernel sees it (Linux /proc/self). */
struct metrics_process {
    double cpu_seconds;    /* user + system CPU time of all threads */
    double resident_bytes; /* resident set size */
    double virtual_bytes;  /* virtual memory size */
    double open_fds;       /* open file descriptors */
    double max_fds;        /* soft limit on open file descriptors; +Inf when unlimited */
    double start_time_s;   /* when the process started, seconds since the Unix epoch */
};

/* Reads *out now from /proc/self/stat, /proc/stat, /proc/self/fd and the descriptor limit.
 * AR_EIO when /proc cannot be read (not Linux, /proc not mounted), AR_EFORMAT when a file does
 * not have the expected form; err (optional) says which. Thread-safe. */
enum ar_status metrics_process_read(struct metrics_process *out, struct ar_err *err);

/* Adds the collector that renders, at every metrics_render, the standard families Prometheus
 * client libraries export: process_cpu_seconds_total (counter), process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds, process_start_time_seconds
 * (gauges), without labels (the instance label comes from the scrape). When /proc cannot be
 * read they are left out of that rendering. Idempotent. Thread-safe. */
enum ar_status metrics_process_register(struct metrics_registry *reg);

#endif
