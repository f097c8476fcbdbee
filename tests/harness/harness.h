/* harness.h - what every test shares: cmocka, the fixture and model paths, file and JSON
 * loading, a fixed-seed RNG, sleeping. Tests run from the repository root (tests/run.sh does
 * so). */
#ifndef AR_TEST_HARNESS_H
#define AR_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

/* ../shared beside the checkout, or $AR_SHARED. */
static inline const char *th_shared_dir(void)
{
    const char *d = getenv("AR_SHARED");
    return d && *d ? d : "../shared";
}

/* Writes "<shared>/<rel>" into buf and returns buf. */
static inline const char *th_shared_path(char *buf, size_t size, const char *rel)
{
    snprintf(buf, size, "%s/%s", th_shared_dir(), rel);
    return buf;
}

/* Reads a whole file (NUL-terminated); NULL on failure. Caller frees with free(). */
static inline char *th_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

/* Parses a JSON file; fails the test when it cannot. Caller frees with cJSON_Delete. */
static inline cJSON *th_read_json(const char *path)
{
    char *text = th_read_file(path, NULL);
    cJSON *j;
    if (!text)
        fail_msg("cannot read %s", path);
    j = cJSON_Parse(text);
    free(text);
    if (!j)
        fail_msg("cannot parse %s", path);
    return j;
}

/* xorshift64*: deterministic data for kernel tests. */
struct th_rng {
    uint64_t s;
};
static inline uint64_t th_rng_u64(struct th_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ull;
}
/* Uniform in [-1, 1). */
static inline float th_rng_f32(struct th_rng *r)
{
    return (float)((double)(th_rng_u64(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Sleeps s seconds (a fraction allowed). */
/* The value of the first sample line "<series> <value>" in Prometheus text (series with its
 * labels, e.g. "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l2\"}"); absent when
 * there is none. */
static inline double th_metric_sample(const char *text, const char *series, double absent)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return absent;
}

static inline void th_sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* ---- skipping ------------------------------------------------------------------------------
 * A test that has nothing to compare reports itself skipped, never passed: tests/run.sh counts
 * cmocka's skips and whole programs that exit TH_EXIT_SKIP (77, as automake does) and prints
 * them in its summary. Two kinds of skip:
 *   th_skip_missing - data the test needs is absent (demo model, fixtures). CI always has it,
 *                     so AR_REQUIRE_ALL=1 (set by .ci/run) turns the skip into a failure;
 *   th_skip_hw      - the machine lacks what the test exercises (an ISA): always a skip. */
#define TH_EXIT_SKIP 77

static inline int th_require_all(void)
{
    const char *v = getenv("AR_REQUIRE_ALL");
    return v && *v && strcmp(v, "0") != 0;
}

/* Inside a cmocka test: skips it, or fails it under AR_REQUIRE_ALL=1. */
static inline void th_skip_missing(const char *what)
{
    if (th_require_all())
        fail_msg("%s missing, and AR_REQUIRE_ALL=1 requires it", what);
    print_message("skipped: %s missing\n", what);
    skip();
}

static inline void th_skip_hw(const char *why)
{
    print_message("skipped: %s\n", why);
    skip();
}

/* For main(): the exit status of a test program with nothing to run because `what` is missing:
 * TH_EXIT_SKIP, or 1 (a failure) under AR_REQUIRE_ALL=1. */
static inline int th_exit_missing(const char *what)
{
    if (th_require_all()) {
        printf("!! %s missing, and AR_REQUIRE_ALL=1 requires it\n", what);
        return 1;
    }
    printf("skipped: %s missing\n", what);
    return TH_EXIT_SKIP;
}

#endif
