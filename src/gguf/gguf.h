/* gguf.h - reading (mmap) and writing GGUF files, the model format of the llama.cpp
 * ecosystem.
 *
 * Format (little endian), versions 2 and 3:
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims (1..4) | u64 ne[n_dims] | u32 ggml_type |
 *                 u64 offset (relative to the data section, aligned) }
 *   padding to general.alignment (default 32) | data section
 * string = u64 len + bytes (no NUL). value_type: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32,
 * 6 f32, 7 bool, 8 string, 9 array (u32 elem_type + u64 n + elements; arrays nest),
 * 10 u64, 11 i64, 12 f64.
 * Every count, offset and size is checked against the file before use. */
#ifndef AR_GGUF_H
#define AR_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/types.h"

enum gguf_vtype {
    GGUF_VTYPE_U8 = 0,
    GGUF_VTYPE_I8 = 1,
    GGUF_VTYPE_U16 = 2,
    GGUF_VTYPE_I16 = 3,
    GGUF_VTYPE_U32 = 4,
    GGUF_VTYPE_I32 = 5,
    GGUF_VTYPE_F32 = 6,
    GGUF_VTYPE_BOOL = 7,
    GGUF_VTYPE_STRING = 8,
    GGUF_VTYPE_ARRAY = 9,
    GGUF_VTYPE_U64 = 10,
    GGUF_VTYPE_I64 = 11,
    GGUF_VTYPE_F64 = 12,
    GGUF_VTYPE_COUNT
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_file;

/* A string inside the mapped file: not NUL-terminated. */
struct gguf_str {
    const char *ptr;
    uint64_t len;
};

/* A metadata array. Fixed-size elements are stored contiguously at `data` (little endian,
 * possibly unaligned: read with memcpy or the gguf_arr_* getters). */
struct gguf_arr {
    enum gguf_vtype type; /* element type */
    uint64_t n;           /* number of elements */
    const void *data;     /* fixed-size elements; NULL for strings and nested arrays */
    const struct gguf_value *items; /* string or nested-array elements, (n); else NULL */
};

struct gguf_value {
    enum gguf_vtype type;
    union {
        uint64_t u64; /* U8 U16 U32 U64 BOOL */
        int64_t i64;  /* I8 I16 I32 I64 */
        double f64;   /* F32 F64 */
        struct gguf_str str;
        struct gguf_arr arr;
    } v;
};

struct gguf_kv {
    struct gguf_str key;
    struct gguf_value value;
};

struct gguf_tensor {
    char *name;    /* owned by the file, NUL-terminated */
    enum ar_type type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (innermost); unused dims are 1 */
    uint64_t offset;           /* relative to the data section */
    uint64_t size;             /* bytes */
    const void *data;          /* into the mapping: valid until gguf_close */
};

/* Opens and validates path (mmap, read-only). The caller owns *out (gguf_close). */
enum ar_status gguf_open(const char *path, struct gguf_file **out, struct ar_err *err);
/* Same, over caller memory that must outlive the file (fuzzing, tests). */
enum ar_status gguf_open_memory(const void *data, size_t size, struct gguf_file **out,
                                struct ar_err *err);
void gguf_close(struct gguf_file *f);

uint32_t gguf_version(const struct gguf_file *f);
uint64_t gguf_alignment(const struct gguf_file *f);
uint64_t gguf_data_offset(const struct gguf_file *f); /* absolute offset of the data section */
size_t gguf_file_size(const struct gguf_file *f);
/* Tells the kernel that bytes [p, p + len) of an opened file's mapping are not needed now
 * (their pages leave the process's resident set; a later read maps them again from the
 * file). Nothing for a file opened from memory, or outside the mapping. */
void gguf_release_range(const struct gguf_file *f, const void *p, size_t len);

int64_t gguf_n_kv(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i);
/* NULL when absent. */
const struct gguf_value *gguf_find(const struct gguf_file *f, const char *key);

/* Typed getters: return false when the key is absent or of an incompatible type.
 * Integer getters accept any integer (and bool) type whose value fits the result. */
bool gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
bool gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
bool gguf_get_f32(const struct gguf_file *f, const char *key, float *out); /* f32 or f64 */
bool gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
/* Borrowed pointer into the file; not NUL-terminated, length in *len. */
bool gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
bool gguf_get_arr(const struct gguf_file *f, const char *key, const struct gguf_arr **out);

/* Array element getters; i must be < arr->n and the element type must match. */
struct gguf_str gguf_arr_str(const struct gguf_arr *arr, uint64_t i);
float gguf_arr_f32(const struct gguf_arr *arr, uint64_t i);
int64_t gguf_arr_int(const struct gguf_arr *arr, uint64_t i); /* any integer element type */

int64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

const char *gguf_vtype_name(enum gguf_vtype t);

/* ---- writer --------------------------------------------------------------------------- */

struct gguf_writer;

enum ar_status gguf_writer_create(struct gguf_writer **out);
void gguf_writer_destroy(struct gguf_writer *w);

/* Setters copy their arguments. Setting an existing key replaces it (order is kept). */
enum ar_status gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
enum ar_status gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
enum ar_status gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
enum ar_status gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
enum ar_status gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
enum ar_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (type must not be STRING or ARRAY), n elements at data. */
enum ar_status gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                                   const void *data, uint64_t n);
enum ar_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key,
                                       const struct gguf_str *items, uint64_t n);
/* Copies any value (nested arrays included) read from another file. */
enum ar_status gguf_writer_set_value(struct gguf_writer *w, const char *key,
                                     const struct gguf_value *v);
/* Adds a tensor; data (size bytes, must equal the type's row size x rows) is copied unless
 * borrow is true, in which case it must stay valid until gguf_writer_write returns. */
enum ar_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ar_type type,
                                      int n_dims, const int64_t *ne, const void *data,
                                      uint64_t size, bool borrow);
/* Writes version 3 to path atomically (path.tmp, then rename): no partial file is left on
 * failure. Honours general.alignment if it was set as u32. */
enum ar_status gguf_writer_write(struct gguf_writer *w, const char *path, struct ar_err *err);
/* Same bytes as gguf_writer_write, into a new buffer of *out_size bytes that the caller
 * frees with ar_free (tests, fuzz seeds, in-memory round trips). */
enum ar_status gguf_writer_write_memory(struct gguf_writer *w, void **out, size_t *out_size,
                                        struct ar_err *err);

#endif
