/* simd256.h - small helpers on 256-bit integer vectors (AVX2) and memory, shared by the kernel
 * files that are compiled with AVX2 or more (avx2.c, avx512.c); each includes it under its own
 * flags. */
#ifndef AR_KERNELS_SIMD256_H
#define AR_KERNELS_SIMD256_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quants.h"

/* 4 bytes at p as one int32 (any alignment) */
static inline __attribute__((always_inline)) int32_t load_i32(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* 4 bytes at p as one float (any alignment: a row stride need not be a multiple of the
 * element size, so tail elements are read as the vector loads read them) */
static inline __attribute__((always_inline)) float load_f32(const void *p)
{
    float v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* Asks for the cache lines covering [p, p + len) into L2: the decode stream prefetch of the
 * weights (kernels_internal.h) and AVX2's K-quant prefetch. Past a mapping's end it reads
 * nothing: prefetches do not fault. */
static inline __attribute__((always_inline)) void prefetch_l2(const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    for (uintptr_t l = a & ~(uintptr_t)63; l < a + len; l += 64)
        _mm_prefetch((const char *)l, _MM_HINT_T1);
}

/* The sum of an activation block's 32 quants (exact: the bytes biased to unsigned, summed by
 * vpsadbw, the bias taken off) */
static inline __attribute__((always_inline)) int32_t q8_0_block_sum(const struct block_q8_0 *xb)
{
    __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)xb->qs),
                                 _mm256_set1_epi8((char)0x80));
    __m256i s = _mm256_sad_epu8(q, _mm256_setzero_si256());
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
}

#endif
