/* quants.h - quantized block layouts, byte for byte as GGUF files store them (ggml's).
 * Shared by the reference kernels, the SIMD kernels and the quantizer. */
#ifndef AR_QUANTS_H
#define AR_QUANTS_H

#include <assert.h>
#include <stdint.h>

#include "base/base.h"

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* 32 weights: w = d * (q - 8); qs[j] low nibble is element j, high nibble element j + 16. */
struct block_q4_0 {
    ar_f16 d;
    uint8_t qs[QK4_0 / 2];
};
static_assert(sizeof(struct block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 layout");

/* 32 weights: w = d * q + m, q in 0..15; nibbles as in block_q4_0. */
struct block_q4_1 {
    ar_f16 d;
    ar_f16 m;
    uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(struct block_q4_1) == 4 + QK4_1 / 2, "block_q4_1 layout");

/* 32 weights: w = d * (q - 16), q in 0..31. The low 4 bits are nibbles as in block_q4_0; the
 * fifth bit of element j is bit j of qh read as a little-endian uint32 (so elements 0..15, the
 * low nibbles, use bits 0..15 and elements 16..31 bits 16..31). */
struct block_q5_0 {
    ar_f16 d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
static_assert(sizeof(struct block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 layout");

/* 32 weights: w = d * q + m, q in 0..31; qh and qs as in block_q5_0. */
struct block_q5_1 {
    ar_f16 d;
    ar_f16 m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(struct block_q5_1) == 4 + 4 + QK5_1 / 2, "block_q5_1 layout");

/* 32 weights: w = d * q. Also the activation format for the dot products of Q8_0 and the
 * 32-element legacy types (Q4_0, Q4_1, Q5_0, Q5_1). */
struct block_q8_0 {
    ar_f16 d;
    int8_t qs[QK8_0];
};
static_assert(sizeof(struct block_q8_0) == 2 + QK8_0, "block_q8_0 layout");

/* 256 weights in 8 sub-blocks of 32: w = d * sc[j] * q - dmin * m[j], q in 0..15;
 * 6-bit scales and mins packed in scales[12]. */
struct block_q4_K {
    ar_f16 d;
    ar_f16 dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct block_q4_K) == 4 + K_SCALE_SIZE + QK_K / 2, "block_q4_K layout");

/* As q4_K with a fifth bit per weight in qh. */
struct block_q5_K {
    ar_f16 d;
    ar_f16 dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct block_q5_K) == 4 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2,
              "block_q5_K layout");

/* 256 weights in 16 sub-blocks of 16: w = d * scales[j] * (q - 32), q 6 bits (ql + qh). */
struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    ar_f16 d;
};
static_assert(sizeof(struct block_q6_K) == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, "block_q6_K layout");

/* Activation format for K-quant dot products: float scale, 256 int8, sums per 16. */
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
static_assert(sizeof(struct block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K layout");

#endif
