/* gguf_internal.h - helpers shared by the GGUF reader (gguf.c) and writer (writer.c):
 * little-endian byte access and the value-type size table. Not part of the module API. */
#ifndef AR_GGUF_INTERNAL_H
#define AR_GGUF_INTERNAL_H

#include <stdint.h>

#include "gguf.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_DEPTH 8       /* nesting limit for arrays of arrays */
#define GGUF_MAX_KEY_LEN 65535 /* the format's limit on key length */
#define GGUF_ALIGNMENT_KEY "general.alignment"

/* Bytes of one fixed-size element; 0 for STRING, ARRAY and unknown types. */
static inline uint64_t gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_VTYPE_U8:
    case GGUF_VTYPE_I8:
    case GGUF_VTYPE_BOOL:
        return 1;
    case GGUF_VTYPE_U16:
    case GGUF_VTYPE_I16:
        return 2;
    case GGUF_VTYPE_U32:
    case GGUF_VTYPE_I32:
    case GGUF_VTYPE_F32:
        return 4;
    case GGUF_VTYPE_U64:
    case GGUF_VTYPE_I64:
    case GGUF_VTYPE_F64:
        return 8;
    default:
        return 0;
    }
}

static inline uint64_t gguf_le_load(const void *p, unsigned n)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static inline void gguf_le_store(void *p, uint64_t v, unsigned n)
{
    uint8_t *b = p;
    for (unsigned i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static inline bool gguf_is_pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

#endif
