/* base.h - helpers every module uses: error filling, allocation with fault injection,
 * logging, half-precision conversion, checked arithmetic. Depends on nothing but libc. */
#ifndef AR_BASE_H
#define AR_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "autoreply.h"

#define AR_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define AR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define AR_MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define AR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define AR_PRINTF(f, a)
#endif

/* Fills err (if not NULL) and returns code, so callers can write
 * `return ar_err_set(err, AR_EFORMAT, off, "bad magic");`. */
enum ar_status ar_err_set(struct ar_err *err, enum ar_status code, uint64_t offset,
                          const char *fmt, ...) AR_PRINTF(4, 5);

/* ---- allocation ---------------------------------------------------------------------- */
/* All library allocations go through these so that tests can inject failures. */
void *ar_malloc(size_t size);
void *ar_calloc(size_t n, size_t size);
void *ar_realloc(void *p, size_t size);
void ar_free(void *p);
char *ar_strdup(const char *s);
char *ar_strndup(const char *s, size_t len);
/* Cache-line (64 B) aligned allocation; free with ar_free_aligned. */
void *ar_malloc_aligned(size_t size);
void ar_free_aligned(void *p);
/* size bytes of zeroed, page-aligned anonymous memory that asks for transparent huge pages
 * (madvise), for what is streamed from memory: weights, the bandwidth probe's buffer. Read
 * through 4 KiB pages, a buffer whose page tables have left the caches streamed at a fraction
 * of the rate on a virtual machine. Not counted by ar_alloc_fail_after; free with
 * ar_huge_free and the same size. */
void *ar_huge_alloc(size_t size);
void ar_huge_free(void *p, size_t size);
/* Read the size bytes at p (64-byte aligned, size a multiple of 64) for a bandwidth probe and
 * return a sum of what was read, so that no read is optimised away. Two forms, since which one
 * streams faster depends on the CPU: every 8-byte word (ar_read_words), or one word per 64-byte
 * line (ar_read_lines: the memory moves the same lines, the core issues an eighth of the
 * loads). On an Intel Xeon (family 6 model 0xcf, 2026-12-07) one thread read 1 GiB at 9-12
 * GB/s by words, 17 by lines, which is what the decode kernels stream at best there. */
uint64_t ar_read_words(const void *p, size_t size);
uint64_t ar_read_lines(const void *p, size_t size);

/* Test hook: the n-th allocation from now (1-based) and all after it fail; 0 disables.
 * Returns the number of allocations made since the last call. Not thread-safe. */
uint64_t ar_alloc_fail_after(uint64_t n);
/* Routes cJSON's allocations through ar_malloc/ar_free (cJSON_InitHooks), so they are counted
 * and fail under ar_alloc_fail_after like the library's own. Idempotent; called by the CLI's
 * main, server_create and reply_service_create before any thread parses JSON, and by tests. */
void ar_json_use_ar_alloc(void);
/* Whether a cJSON allocation failed on this thread since the last call (and clears that): tells
 * cJSON_Parse's NULL for out of memory from its NULL for bad text. Call it once before parsing
 * to clear, once after a NULL to ask. Only meaningful after ar_json_use_ar_alloc. */
bool ar_json_oom_take(void);

/* ---- growable string ------------------------------------------------------------------ */
/* Caller storage, zero-initialised. s is NUL-terminated once anything was put; an allocation
 * failure is sticky (oom), so a series of puts is checked once at the end. */
struct ar_buf {
    char *s; /* owned */
    size_t n, cap;
    bool oom;
};
void ar_buf_put(struct ar_buf *b, const char *s, size_t n);
void ar_buf_puts(struct ar_buf *b, const char *s);
/* Hands over the string (never NULL unless oom: "" when nothing was put) and its length, and
 * resets b. On oom frees what was built and returns NULL. */
char *ar_buf_take(struct ar_buf *b, size_t *len);

/* ---- JSON text ------------------------------------------------------------------------- */
/* Whether the JSON text s[0..len) carries a NUL character in a string: a raw 0 byte or a
 * \u0000 escape. cJSON decodes \u0000 into a 0 byte and every user of its strings stops
 * there, so "victim\u0000attacker" would silently read as "victim"; callers reject such text
 * instead. The scan follows strings and escapes from the start (an escaped backslash followed by
 * "u0000" is text, not a NUL) and needs no valid JSON. When found: *offset (optional) is the byte
 * of the NUL or its escape, and field (optional, field_size > 0) the path of the string, e.g.
 * "reviews[].shop_id" ("" at the top level; a NUL in a key names the key's object, then
 * "(a key)"). */
bool ar_json_has_nul(const char *s, size_t len, size_t *offset, char *field, size_t field_size);

/* ---- logging ------------------------------------------------------------------------- */
void ar_log(enum ar_log_level level, const char *fmt, ...) AR_PRINTF(2, 3);
#define AR_DEBUG(...) ar_log(AR_LOG_DEBUG, __VA_ARGS__)
#define AR_INFO(...) ar_log(AR_LOG_INFO, __VA_ARGS__)
#define AR_WARN(...) ar_log(AR_LOG_WARN, __VA_ARGS__)
#define AR_ERROR(...) ar_log(AR_LOG_ERROR, __VA_ARGS__)

/* ---- checked arithmetic (sizes read from files) --------------------------------------- */
static inline bool ar_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}
static inline bool ar_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out);
}

/* ---- time ---------------------------------------------------------------------------- */
double ar_time_s(void); /* monotonic seconds */

/* ---- pseudo-random numbers ------------------------------------------------------------ */
/* splitmix64: advances *state by the golden-ratio step and returns 64 well-mixed bits. Seeds
 * larger generators (the sampler's xoshiro256**) and makes deterministic data from a seed;
 * never for secrets. */
static inline uint64_t ar_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- half precision ------------------------------------------------------------------ */
typedef uint16_t ar_f16;  /* IEEE 754 binary16 bits */
typedef uint16_t ar_bf16; /* bfloat16 bits */

static inline uint32_t ar_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float ar_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Exact binary16 -> binary32 (subnormals, inf, nan). */
static inline float ar_f16_to_f32(ar_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            man &= 0x3ff;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return ar_bits_f32(u);
}

/* binary32 -> binary16, round to nearest even (as F16C's vcvtps2ph with imm 0). */
static inline ar_f16 ar_f32_to_f16(float f)
{
    uint32_t x = ar_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (ar_f16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (ar_f16)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* result is subnormal or zero */
        if (ax < 0x33000000u) /* < 2^-25: rounds to zero */
            return (ar_f16)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (112 - e) */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (ar_f16)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias 127 -> 15 */
    uint32_t out = r >> 13;
    uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (out & 1)))
        out++;
    return (ar_f16)(sign | out);
}

static inline float ar_bf16_to_f32(ar_bf16 h)
{
    return ar_bits_f32((uint32_t)h << 16);
}

/* binary32 -> bfloat16, round to nearest even; nan stays nan (as ggml does). */
static inline ar_bf16 ar_f32_to_bf16(float f)
{
    uint32_t u = ar_f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000u)
        return (ar_bf16)((u >> 16) | 64);
    return (ar_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

#endif
