/* hash.h - FNV-1a (Fowler/Noll/Vo), the one non-cryptographic byte hash of the code: hash
 * tables (GGUF names, vocabulary, merges, metrics children, rate-limit clients), prefix-cache
 * keys and names derived from content. Never for anything an attacker must not steer.
 * Chained: ar_fnv1a32(ar_fnv1a32(AR_FNV32_BASIS, a, na), b, nb) hashes a then b. */
#ifndef AR_BASE_HASH_H
#define AR_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define AR_FNV32_BASIS 0x811c9dc5u           /* offset basis, 32 bits */
#define AR_FNV32_PRIME 0x01000193u           /* 16777619 */
#define AR_FNV64_BASIS 0xcbf29ce484222325ull /* offset basis, 64 bits */
#define AR_FNV64_PRIME 0x00000100000001b3ull /* 1099511628211 */

/* h continued over p[0..n): per byte, h = (h xor byte) * prime. */
static inline uint32_t ar_fnv1a32(uint32_t h, const void *p, size_t n)
{
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * AR_FNV32_PRIME;
    return h;
}

static inline uint64_t ar_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * AR_FNV64_PRIME;
    return h;
}

#endif
