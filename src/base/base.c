/* base.c - status strings, error filling, allocation with fault injection, logging, time.
 * The only global state of the library lives here (log sink, fault-injection counter). */
#define _POSIX_C_SOURCE 200809L
#include "base.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cjson/cJSON.h>

const char *ar_status_str(enum ar_status st)
{
    switch (st) {
    case AR_OK:
        return "ok";
    case AR_ENOMEM:
        return "out of memory";
    case AR_EIO:
        return "i/o error";
    case AR_EFORMAT:
        return "malformed input";
    case AR_EINVAL:
        return "invalid argument";
    case AR_EBUSY:
        return "busy";
    case AR_ENOTSUP:
        return "not supported";
    case AR_ERANGE:
        return "out of range";
    case AR_ECANCELED:
        return "cancelled";
    case AR_EUNAVAIL:
        return "backend unavailable";
    }
    return "unknown status";
}

enum ar_status ar_err_set(struct ar_err *err, enum ar_status code, uint64_t offset,
                          const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        err->offset = offset;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- allocation ---------------------------------------------------------------------- */

static uint64_t alloc_count;
static uint64_t alloc_fail_at; /* 0: never */

static bool alloc_should_fail(void)
{
    if (!alloc_fail_at)
        return false;
    return ++alloc_count >= alloc_fail_at;
}

uint64_t ar_alloc_fail_after(uint64_t n)
{
    uint64_t c = alloc_count;
    alloc_count = 0;
    alloc_fail_at = n;
    return c;
}

void *ar_malloc(size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *ar_calloc(size_t n, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *ar_realloc(void *p, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return realloc(p, size ? size : 1);
}

void ar_free(void *p)
{
    free(p);
}

static _Thread_local bool json_oom;

static void *json_malloc(size_t size)
{
    void *p = ar_malloc(size);
    if (!p)
        json_oom = true;
    return p;
}

bool ar_json_oom_take(void)
{
    bool was = json_oom;
    json_oom = false;
    return was;
}

static void json_hooks_install(void)
{
    cJSON_Hooks h = {json_malloc, ar_free};
    cJSON_InitHooks(&h);
}

void ar_json_use_ar_alloc(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, json_hooks_install);
}

char *ar_strndup(const char *s, size_t len)
{
    char *d = ar_malloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *ar_strdup(const char *s)
{
    return ar_strndup(s, strlen(s));
}

void *ar_malloc_aligned(size_t size)
{
    void *p = NULL;
    if (alloc_should_fail())
        return NULL;
    size = (size + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, size ? size : 64) != 0)
        return NULL;
    return p;
}

void ar_free_aligned(void *p)
{
    free(p);
}

void *ar_huge_alloc(size_t size)
{
    void *p;
    if (size == 0)
        return NULL;
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

void ar_huge_free(void *p, size_t size)
{
    if (p)
        munmap(p, size);
}

/* ---- growable string ------------------------------------------------------------------ */

void ar_buf_put(struct ar_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        char *p;
        while (cap < b->n + n + 1)
            cap *= 2;
        p = ar_realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void ar_buf_puts(struct ar_buf *b, const char *s)
{
    ar_buf_put(b, s, strlen(s));
}

char *ar_buf_take(struct ar_buf *b, size_t *len)
{
    char *s = NULL;
    if (!b->oom && !b->s)
        ar_buf_put(b, "", 0);
    if (b->oom) {
        ar_free(b->s);
    } else {
        s = b->s;
        if (len)
            *len = b->n;
    }
    memset(b, 0, sizeof(*b));
    return s;
}

/* ---- logging ------------------------------------------------------------------------- */

static ar_log_fn log_fn;
static void *log_user;
static enum ar_log_level log_min = AR_LOG_INFO;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

void ar_log_set(ar_log_fn fn, void *user_data)
{
    log_fn = fn;
    log_user = user_data;
}

void ar_log_set_level(enum ar_log_level min_level)
{
    log_min = min_level;
}

void ar_log(enum ar_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    char buf[1024];
    va_list ap;
    if (level < log_min)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (log_fn) {
        log_fn(level, buf, log_user);
        return;
    }
    pthread_mutex_lock(&log_mu);
    fprintf(stderr, "autoreply: %s: %s\n", names[level], buf);
    pthread_mutex_unlock(&log_mu);
}

uint64_t ar_read_words(const void *p, size_t size)
{
    const uint64_t *u = p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= size / 8; i += 4) {
        s0 += u[i];
        s1 += u[i + 1];
        s2 += u[i + 2];
        s3 += u[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

uint64_t ar_read_lines(const void *p, size_t size)
{
    const uint64_t *u = p;
    uint64_t s0 = 0, s1 = 0;
    size_t i = 0;
    for (; i + 16 <= size / 8; i += 16) {
        s0 += u[i];
        s1 += u[i + 8];
    }
    if (i + 8 <= size / 8)
        s0 += u[i];
    return s0 + s1;
}

double ar_time_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- JSON text ------------------------------------------------------------------------- */

#define JSON_NUL_FRAMES 16 /* levels named in the path (deeper ones are left out) */
#define JSON_NUL_KEY 48    /* bytes of a key kept for the path */

struct json_frame {
    bool object;
    char key[JSON_NUL_KEY]; /* the object's current key, as written (escapes kept) */
};

static void json_path(const struct json_frame *f, size_t depth, bool in_key, char *out, size_t size)
{
    size_t o = 0;
    if (!out || !size)
        return;
    out[0] = '\0';
    for (size_t i = 0; i < depth && i < JSON_NUL_FRAMES; i++) {
        int n;
        /* the innermost object's key is the NUL's own when the NUL sits in that key */
        if (f[i].object && (in_key && i + 1 == depth))
            n = snprintf(out + o, size - o, "%s(a key)", o ? "." : "");
        else if (f[i].object)
            n = snprintf(out + o, size - o, "%s%s", o && f[i].key[0] ? "." : "", f[i].key);
        else
            n = snprintf(out + o, size - o, "[]");
        if (n < 0 || (size_t)n >= size - o)
            return;
        o += (size_t)n;
    }
}

static bool is_hex0(const char *s)
{
    return s[0] == '0' && s[1] == '0' && s[2] == '0' && s[3] == '0';
}

bool ar_json_has_nul(const char *s, size_t len, size_t *offset, char *field, size_t field_size)
{
    struct json_frame f[JSON_NUL_FRAMES];
    size_t depth = 0, i = 0;
    bool expect_key = false; /* in an object, after '{' or ',' */
    if (field && field_size)
        field[0] = '\0';
    while (i < len) {
        char c = s[i];
        if (c == '\0') {
            if (offset)
                *offset = i;
            json_path(f, depth, false, field, field_size);
            return true;
        }
        if (c == '{' || c == '[') {
            if (depth < JSON_NUL_FRAMES) {
                f[depth].object = c == '{';
                f[depth].key[0] = '\0';
            }
            depth++;
            expect_key = c == '{';
            i++;
        } else if (c == '}' || c == ']') {
            if (depth)
                depth--;
            expect_key = false;
            i++;
        } else if (c == ',') {
            expect_key = depth && depth <= JSON_NUL_FRAMES && f[depth - 1].object;
            i++;
        } else if (c == ':') {
            expect_key = false;
            i++;
        } else if (c == '"') {
            bool key = expect_key;
            size_t k = 0, a = ++i;
            char *kb = key && depth && depth <= JSON_NUL_FRAMES ? f[depth - 1].key : NULL;
            while (i < len && s[i] != '"') {
                bool nul = s[i] == '\0';
                size_t at = i;
                if (s[i] == '\\' && i + 1 < len) {
                    nul = s[i + 1] == 'u' && i + 5 < len && is_hex0(s + i + 2);
                    i += 2;
                } else {
                    i++;
                }
                if (nul) {
                    if (offset)
                        *offset = at;
                    json_path(f, depth, key, field, field_size);
                    return true;
                }
            }
            if (kb) { /* the key as written, cut to its buffer */
                k = i - a < JSON_NUL_KEY - 1 ? i - a : JSON_NUL_KEY - 1;
                memcpy(kb, s + a, k);
                kb[k] = '\0';
            }
            expect_key = false;
            i++; /* the closing quote */
        } else {
            i++;
        }
    }
    return false;
}
