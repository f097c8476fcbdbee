/* types.h - tensor element types, numbered exactly as GGUF files (ggml) number them, with
 * their block geometry. Shared by gguf (to size tensors) and kernels (to compute on them). */
#ifndef AR_TYPES_H
#define AR_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ar_type {
    AR_TYPE_F32 = 0,
    AR_TYPE_F16 = 1,
    AR_TYPE_Q4_0 = 2,
    AR_TYPE_Q4_1 = 3,
    AR_TYPE_Q5_0 = 6,
    AR_TYPE_Q5_1 = 7,
    AR_TYPE_Q8_0 = 8,
    AR_TYPE_Q8_1 = 9,
    AR_TYPE_Q2_K = 10,
    AR_TYPE_Q3_K = 11,
    AR_TYPE_Q4_K = 12,
    AR_TYPE_Q5_K = 13,
    AR_TYPE_Q6_K = 14,
    AR_TYPE_Q8_K = 15,
    AR_TYPE_I8 = 24,
    AR_TYPE_I16 = 25,
    AR_TYPE_I32 = 26,
    AR_TYPE_I64 = 27,
    AR_TYPE_F64 = 28,
    AR_TYPE_BF16 = 30,
    AR_TYPE_COUNT = 40 /* table size; not a type */
};

struct ar_type_info {
    const char *name;   /* "q4_K" ...; NULL for unknown numbers */
    int block_size;     /* elements per block */
    int type_size;      /* bytes per block */
    bool supported;     /* this engine can dequantize and compute with it */
};

/* Info for a type number read from a file; never NULL (unknown types have name NULL). */
const struct ar_type_info *ar_type_info(uint32_t type);
/* Name for printing: never NULL ("?" for unknown numbers). */
const char *ar_type_name(uint32_t type);
/* Parses "q8_0", "Q4_K", "f16" ... case-insensitively; returns false when unknown. */
bool ar_type_from_name(const char *name, enum ar_type *out);
/* Bytes of one row of n elements; 0 if n is not a multiple of the block size or the type is
 * unknown. */
size_t ar_type_row_size(uint32_t type, int64_t n);

#endif
