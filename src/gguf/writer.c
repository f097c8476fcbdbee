/* writer.c - GGUF writer (version 3): collects metadata and tensors, then writes them in
 * insertion order with tensor data aligned, atomically (path.tmp, then rename). Used by the
 * quantize tool and the test-model generator. Values are kept already encoded. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_internal.h"

/* Growable byte buffer; `oom` sticks after the first failed allocation. */
struct bytes {
    uint8_t *p;
    size_t len;
    size_t cap;
    bool oom;
};

static void bytes_put(struct bytes *b, const void *data, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = ar_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void bytes_le(struct bytes *b, uint64_t v, unsigned n)
{
    uint8_t tmp[8];
    gguf_le_store(tmp, v, n);
    bytes_put(b, tmp, n);
}

struct wkv {
    char *key;    /* owned */
    uint8_t *val; /* owned: u32 value type + encoded value */
    size_t val_size;
};

struct wtensor {
    char *name; /* owned */
    enum ar_type type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data; /* owned_data or the caller's */
    void *owned_data;
    uint64_t size;
};

struct gguf_writer {
    struct wkv *kvs; /* owned, (n_kv) */
    size_t n_kv, cap_kv;
    struct wtensor *tensors; /* owned, (n_tensors) */
    size_t n_tensors, cap_tensors;
};

enum ar_status gguf_writer_create(struct gguf_writer **out)
{
    if (!out)
        return AR_EINVAL;
    *out = ar_calloc(1, sizeof(**out));
    return *out ? AR_OK : AR_ENOMEM;
}

void gguf_writer_destroy(struct gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        ar_free(w->kvs[i].key);
        ar_free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        ar_free(w->tensors[i].name);
        ar_free(w->tensors[i].owned_data);
    }
    ar_free(w->kvs);
    ar_free(w->tensors);
    ar_free(w);
}

static bool key_ok(const char *key)
{
    return key && key[0] && strlen(key) <= GGUF_MAX_KEY_LEN;
}

/* Stores an encoded value under key, replacing an existing one in place. Takes ownership of
 * b->p on success and on failure. */
static enum ar_status put_kv(struct gguf_writer *w, const char *key, struct bytes *b)
{
    if (b->oom) {
        ar_free(b->p);
        return AR_ENOMEM;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            ar_free(w->kvs[i].val);
            w->kvs[i].val = b->p;
            w->kvs[i].val_size = b->len;
            return AR_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        struct wkv *kvs = ar_realloc(w->kvs, cap * sizeof(*kvs));
        if (!kvs) {
            ar_free(b->p);
            return AR_ENOMEM;
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    char *k = ar_strdup(key);
    if (!k) {
        ar_free(b->p);
        return AR_ENOMEM;
    }
    w->kvs[w->n_kv].key = k;
    w->kvs[w->n_kv].val = b->p;
    w->kvs[w->n_kv].val_size = b->len;
    w->n_kv++;
    return AR_OK;
}

static enum ar_status set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                                 uint64_t raw)
{
    struct bytes b = {0};
    if (!w || !key_ok(key))
        return AR_EINVAL;
    bytes_le(&b, (uint64_t)type, 4);
    bytes_le(&b, raw, (unsigned)gguf_vtype_size(type));
    return put_kv(w, key, &b);
}

enum ar_status gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return set_scalar(w, key, GGUF_VTYPE_U32, v);
}

enum ar_status gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return set_scalar(w, key, GGUF_VTYPE_I32, (uint32_t)v);
}

enum ar_status gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return set_scalar(w, key, GGUF_VTYPE_U64, v);
}

enum ar_status gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
    return set_scalar(w, key, GGUF_VTYPE_F32, ar_f32_bits(v));
}

enum ar_status gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v)
{
    return set_scalar(w, key, GGUF_VTYPE_BOOL, v ? 1 : 0);
}

enum ar_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v)
{
    struct bytes b = {0};
    if (!w || !key_ok(key) || !v)
        return AR_EINVAL;
    size_t len = strlen(v);
    bytes_le(&b, GGUF_VTYPE_STRING, 4);
    bytes_le(&b, len, 8);
    bytes_put(&b, v, len);
    return put_kv(w, key, &b);
}

/* Fixed-size elements; bools are normalised to 0/1 as the reader requires. */
static void encode_fixed(struct bytes *b, enum gguf_vtype type, const void *data, uint64_t n)
{
    uint64_t esize = gguf_vtype_size(type);
    if (type == GGUF_VTYPE_BOOL) {
        const uint8_t *p = data;
        for (uint64_t i = 0; i < n; i++)
            bytes_le(b, p[i] != 0, 1);
    } else {
        bytes_put(b, data, (size_t)(n * esize));
    }
}

enum ar_status gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                                   const void *data, uint64_t n)
{
    struct bytes b = {0};
    uint64_t esize = gguf_vtype_size(type), total;
    if (!w || !key_ok(key) || !esize || (!data && n))
        return AR_EINVAL;
    if (ar_mul_overflow_u64(n, esize, &total) || total > SIZE_MAX / 2)
        return AR_EINVAL;
    bytes_le(&b, GGUF_VTYPE_ARRAY, 4);
    bytes_le(&b, (uint64_t)type, 4);
    bytes_le(&b, n, 8);
    encode_fixed(&b, type, data, n);
    return put_kv(w, key, &b);
}

enum ar_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key,
                                       const struct gguf_str *items, uint64_t n)
{
    struct bytes b = {0};
    if (!w || !key_ok(key) || (!items && n))
        return AR_EINVAL;
    for (uint64_t i = 0; i < n; i++)
        if (!items[i].ptr && items[i].len)
            return AR_EINVAL;
    bytes_le(&b, GGUF_VTYPE_ARRAY, 4);
    bytes_le(&b, GGUF_VTYPE_STRING, 4);
    bytes_le(&b, n, 8);
    for (uint64_t i = 0; i < n; i++) {
        bytes_le(&b, items[i].len, 8);
        bytes_put(&b, items[i].ptr, (size_t)items[i].len);
    }
    return put_kv(w, key, &b);
}

/* Encodes a value's payload (without its type word when it is an array element). */
static enum ar_status encode_value(struct bytes *b, const struct gguf_value *v, int depth)
{
    uint64_t esize = gguf_vtype_size(v->type);
    if (esize) {
        uint64_t raw;
        if (v->type == GGUF_VTYPE_F32)
            raw = ar_f32_bits((float)v->v.f64);
        else if (v->type == GGUF_VTYPE_F64)
            memcpy(&raw, &v->v.f64, 8);
        else if (v->type == GGUF_VTYPE_BOOL)
            raw = v->v.u64 != 0;
        else
            raw = v->v.u64; /* signed values: two's complement, truncated to the size */
        bytes_le(b, raw, (unsigned)esize);
        return AR_OK;
    }
    if (v->type == GGUF_VTYPE_STRING) {
        if (!v->v.str.ptr && v->v.str.len)
            return AR_EINVAL;
        bytes_le(b, v->v.str.len, 8);
        bytes_put(b, v->v.str.ptr, (size_t)v->v.str.len);
        return AR_OK;
    }
    if (v->type != GGUF_VTYPE_ARRAY || depth >= GGUF_MAX_DEPTH)
        return AR_EINVAL;
    const struct gguf_arr *a = &v->v.arr;
    uint64_t aesize = gguf_vtype_size(a->type), total;
    bytes_le(b, (uint64_t)a->type, 4);
    bytes_le(b, a->n, 8);
    if (aesize) {
        if (!a->data && a->n)
            return AR_EINVAL;
        if (ar_mul_overflow_u64(a->n, aesize, &total) || total > SIZE_MAX / 2)
            return AR_EINVAL;
        encode_fixed(b, a->type, a->data, a->n);
        return AR_OK;
    }
    if (a->type != GGUF_VTYPE_STRING && a->type != GGUF_VTYPE_ARRAY)
        return AR_EINVAL;
    if (!a->items && a->n)
        return AR_EINVAL;
    for (uint64_t i = 0; i < a->n; i++) {
        enum ar_status st;
        if (a->items[i].type != a->type)
            return AR_EINVAL;
        if ((st = encode_value(b, &a->items[i], depth + 1)) != AR_OK)
            return st;
    }
    return AR_OK;
}

enum ar_status gguf_writer_set_value(struct gguf_writer *w, const char *key,
                                     const struct gguf_value *v)
{
    struct bytes b = {0};
    enum ar_status st;
    if (!w || !key_ok(key) || !v || (unsigned)v->type >= GGUF_VTYPE_COUNT)
        return AR_EINVAL;
    bytes_le(&b, (uint64_t)v->type, 4);
    if ((st = encode_value(&b, v, 0)) != AR_OK) {
        ar_free(b.p);
        return st;
    }
    return put_kv(w, key, &b);
}

enum ar_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ar_type type,
                                      int n_dims, const int64_t *ne, const void *data,
                                      uint64_t size, bool borrow)
{
    const struct ar_type_info *ti = ar_type_info((uint32_t)type);
    uint64_t n_el = 1, expect;
    if (!w || !key_ok(name) || !ti->name || n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne || !data)
        return AR_EINVAL;
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 1 || ar_mul_overflow_u64(n_el, (uint64_t)ne[d], &n_el))
            return AR_EINVAL;
    if (n_el > (uint64_t)INT64_MAX || ne[0] % ti->block_size != 0)
        return AR_EINVAL;
    if (ar_mul_overflow_u64((uint64_t)(ne[0] / ti->block_size) * (uint64_t)ti->type_size,
                            n_el / (uint64_t)ne[0], &expect) ||
        expect != size || size > SIZE_MAX)
        return AR_EINVAL;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return AR_EINVAL;
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        struct wtensor *ts = ar_realloc(w->tensors, cap * sizeof(*ts));
        if (!ts)
            return AR_ENOMEM;
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    struct wtensor t = {0};
    t.type = type;
    t.n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = d < n_dims ? ne[d] : 1;
    t.size = size;
    if (!(t.name = ar_strdup(name)))
        return AR_ENOMEM;
    if (borrow) {
        t.data = data;
    } else {
        if (!(t.owned_data = ar_malloc((size_t)size))) {
            ar_free(t.name);
            return AR_ENOMEM;
        }
        memcpy(t.owned_data, data, (size_t)size);
        t.data = t.owned_data;
    }
    w->tensors[w->n_tensors++] = t;
    return AR_OK;
}

/* ---- output ------------------------------------------------------------------------------ */

/* Where bytes go: a stdio stream or a memory buffer. */
struct sink {
    FILE *fp;
    struct bytes *mem;
    bool failed;
};

static void sink_put(struct sink *s, const void *data, size_t n)
{
    if (s->failed || n == 0)
        return;
    if (s->fp) {
        if (fwrite(data, 1, n, s->fp) != n)
            s->failed = true;
    } else {
        bytes_put(s->mem, data, n);
        s->failed = s->mem->oom;
    }
}

static void sink_le(struct sink *s, uint64_t v, unsigned n)
{
    uint8_t tmp[8];
    gguf_le_store(tmp, v, n);
    sink_put(s, tmp, n);
}

static void sink_pad(struct sink *s, uint64_t pos, uint64_t alignment)
{
    static const uint8_t zeros[64];
    uint64_t pad = (alignment - pos % alignment) % alignment;
    while (pad) {
        size_t n = (size_t)AR_MIN(pad, sizeof(zeros));
        sink_put(s, zeros, n);
        pad -= n;
    }
}

static enum ar_status writer_alignment(const struct gguf_writer *w, uint64_t *out,
                                       struct ar_err *err)
{
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, GGUF_ALIGNMENT_KEY) != 0)
            continue;
        const struct wkv *kv = &w->kvs[i];
        uint64_t a;
        if (gguf_le_load(kv->val, 4) != GGUF_VTYPE_U32)
            return ar_err_set(err, AR_EINVAL, 0, "gguf writer: %s must be a u32",
                              GGUF_ALIGNMENT_KEY);
        a = gguf_le_load(kv->val + 4, 4);
        if (!gguf_is_pow2(a))
            return ar_err_set(err, AR_EINVAL, 0,
                              "gguf writer: %s %" PRIu64 " is not a power of two",
                              GGUF_ALIGNMENT_KEY, a);
        *out = a;
    }
    return AR_OK;
}

static enum ar_status emit(const struct gguf_writer *w, struct sink *s, struct ar_err *err)
{
    uint64_t alignment, pos = 0, offset = 0;
    enum ar_status st = writer_alignment(w, &alignment, err);
    if (st != AR_OK)
        return st;

    sink_put(s, GGUF_MAGIC, 4);
    sink_le(s, 3, 4);
    sink_le(s, w->n_tensors, 8);
    sink_le(s, w->n_kv, 8);
    pos = 24;
    for (size_t i = 0; i < w->n_kv; i++) {
        size_t len = strlen(w->kvs[i].key);
        sink_le(s, len, 8);
        sink_put(s, w->kvs[i].key, len);
        sink_put(s, w->kvs[i].val, w->kvs[i].val_size);
        pos += 8 + len + w->kvs[i].val_size;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        size_t len = strlen(t->name);
        sink_le(s, len, 8);
        sink_put(s, t->name, len);
        sink_le(s, (uint64_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims; d++)
            sink_le(s, (uint64_t)t->ne[d], 8);
        sink_le(s, (uint64_t)t->type, 4);
        sink_le(s, offset, 8);
        pos += 8 + len + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
        offset += t->size + (alignment - t->size % alignment) % alignment;
    }
    if (w->n_tensors) {
        sink_pad(s, pos, alignment);
        for (size_t i = 0; i < w->n_tensors; i++) {
            const struct wtensor *t = &w->tensors[i];
            sink_put(s, t->data, (size_t)t->size);
            sink_pad(s, t->size, alignment);
        }
    }
    if (s->failed)
        return s->fp ? ar_err_set(err, AR_EIO, 0, "gguf writer: write failed")
                     : ar_err_set(err, AR_ENOMEM, 0, "gguf writer: out of memory");
    return AR_OK;
}

enum ar_status gguf_writer_write_memory(struct gguf_writer *w, void **out, size_t *out_size,
                                        struct ar_err *err)
{
    struct bytes b = {0};
    struct sink s = {NULL, &b, false};
    enum ar_status st;
    if (!w || !out || !out_size)
        return ar_err_set(err, AR_EINVAL, 0, "gguf writer: invalid argument");
    *out = NULL;
    *out_size = 0;
    if ((st = emit(w, &s, err)) != AR_OK) {
        ar_free(b.p);
        return st;
    }
    *out = b.p;
    *out_size = b.len;
    return AR_OK;
}

enum ar_status gguf_writer_write(struct gguf_writer *w, const char *path, struct ar_err *err)
{
    struct sink s = {NULL, NULL, false};
    enum ar_status st;
    char *tmp;
    size_t len;
    if (!w || !path || !path[0])
        return ar_err_set(err, AR_EINVAL, 0, "gguf writer: invalid argument");
    len = strlen(path);
    if (!(tmp = ar_malloc(len + 5)))
        return ar_err_set(err, AR_ENOMEM, 0, "gguf writer: out of memory");
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    if (!(s.fp = fopen(tmp, "wb"))) {
        st = ar_err_set(err, AR_EIO, 0, "gguf writer: cannot create %s: %s", tmp, strerror(errno));
        ar_free(tmp);
        return st;
    }
    st = emit(w, &s, err);
    if (st == AR_OK && (fflush(s.fp) != 0 || fsync(fileno(s.fp)) != 0))
        st = ar_err_set(err, AR_EIO, 0, "gguf writer: cannot flush %s: %s", tmp, strerror(errno));
    if (fclose(s.fp) != 0 && st == AR_OK)
        st = ar_err_set(err, AR_EIO, 0, "gguf writer: cannot close %s: %s", tmp, strerror(errno));
    if (st == AR_OK && rename(tmp, path) != 0)
        st = ar_err_set(err, AR_EIO, 0, "gguf writer: cannot rename %s to %s: %s", tmp, path,
                        strerror(errno));
    if (st != AR_OK)
        unlink(tmp);
    ar_free(tmp);
    return st;
}
