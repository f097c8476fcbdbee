/* types.c - the tensor type table (block sizes and byte sizes as in GGUF/ggml). */
#include "types.h"

#include <strings.h>

static const struct ar_type_info type_table[AR_TYPE_COUNT] = {
    [AR_TYPE_F32] = {"f32", 1, 4, true},
    [AR_TYPE_F16] = {"f16", 1, 2, true},
    [AR_TYPE_Q4_0] = {"q4_0", 32, 18, true},
    [AR_TYPE_Q4_1] = {"q4_1", 32, 20, true},
    [AR_TYPE_Q5_0] = {"q5_0", 32, 22, true},
    [AR_TYPE_Q5_1] = {"q5_1", 32, 24, true},
    [AR_TYPE_Q8_0] = {"q8_0", 32, 34, true},
    [AR_TYPE_Q8_1] = {"q8_1", 32, 36, false},
    [AR_TYPE_Q2_K] = {"q2_K", 256, 84, false},
    [AR_TYPE_Q3_K] = {"q3_K", 256, 110, false},
    [AR_TYPE_Q4_K] = {"q4_K", 256, 144, true},
    [AR_TYPE_Q5_K] = {"q5_K", 256, 176, true},
    [AR_TYPE_Q6_K] = {"q6_K", 256, 210, true},
    [AR_TYPE_Q8_K] = {"q8_K", 256, 292, true},
    [AR_TYPE_I8] = {"i8", 1, 1, false},
    [AR_TYPE_I16] = {"i16", 1, 2, false},
    [AR_TYPE_I32] = {"i32", 1, 4, false},
    [AR_TYPE_I64] = {"i64", 1, 8, false},
    [AR_TYPE_F64] = {"f64", 1, 8, false},
    [AR_TYPE_BF16] = {"bf16", 1, 2, true},
};

static const struct ar_type_info unknown_type = {NULL, 0, 0, false};

const struct ar_type_info *ar_type_info(uint32_t type)
{
    if (type >= AR_TYPE_COUNT || !type_table[type].name)
        return &unknown_type;
    return &type_table[type];
}

const char *ar_type_name(uint32_t type)
{
    const char *n = ar_type_info(type)->name;
    return n ? n : "?";
}

bool ar_type_from_name(const char *name, enum ar_type *out)
{
    for (uint32_t t = 0; t < AR_TYPE_COUNT; t++) {
        if (type_table[t].name && strcasecmp(type_table[t].name, name) == 0) {
            *out = (enum ar_type)t;
            return true;
        }
    }
    return false;
}

size_t ar_type_row_size(uint32_t type, int64_t n)
{
    const struct ar_type_info *ti = ar_type_info(type);
    if (!ti->name || n < 0 || n % ti->block_size != 0)
        return 0;
    return (size_t)(n / ti->block_size) * (size_t)ti->type_size;
}
