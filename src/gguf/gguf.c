/* gguf.c - GGUF reader: maps a file (or takes caller memory), validates every count, length
 * and offset against the bytes that are really there, and exposes metadata and the tensor
 * index without copying strings or weights. The model loader and tokenizer read through it. */
#include "gguf.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/hash.h"
#include "gguf_internal.h"

/* Smallest encodings, used to bound counts before anything is allocated. */
#define MIN_KV_BYTES 13     /* u64 key len + 1 key byte + u32 type + 1-byte value */
#define MIN_TENSOR_BYTES 33 /* u64 len + 1 name byte + u32 n_dims + u64 ne + u32 type + u64 off */
#define MIN_ARRAY_BYTES 12  /* u32 elem type + u64 n */
#define MIN_STRING_BYTES 8  /* u64 len */

/* Open-addressing index from names to positions; slots hold index + 1 (0 = empty). */
struct name_index {
    uint64_t *slots;
    uint64_t mask;
};

struct gguf_file {
    const uint8_t *base; /* the whole file */
    size_t size;
    void *map; /* owned mapping (gguf_open), NULL for caller memory */
    size_t map_size;

    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;

    int64_t n_kv;
    struct gguf_kv *kvs;     /* owned, (n_kv) */
    struct gguf_value *pool; /* owned: elements of string and nested arrays */
    struct name_index kv_index;

    int64_t n_tensors;
    struct gguf_tensor *tensors; /* owned, (n_tensors); names owned too */
    struct name_index tensor_index;
};

/* ---- cursor over the input --------------------------------------------------------------- */

struct cursor {
    const uint8_t *p;
    size_t size;
    size_t pos;
    struct ar_err *err;
};

static size_t cur_left(const struct cursor *c)
{
    return c->size - c->pos;
}

static enum ar_status cur_need(struct cursor *c, uint64_t n, const char *what)
{
    if (n > cur_left(c))
        return ar_err_set(c->err, AR_EFORMAT, c->pos,
                          "gguf: %s (%" PRIu64 " bytes) runs past the end of the file "
                          "(%zu bytes left) at offset %zu",
                          what, n, cur_left(c), c->pos);
    return AR_OK;
}

static enum ar_status cur_u32(struct cursor *c, uint32_t *v, const char *what)
{
    enum ar_status st = cur_need(c, 4, what);
    if (st != AR_OK)
        return st;
    *v = (uint32_t)gguf_le_load(c->p + c->pos, 4);
    c->pos += 4;
    return AR_OK;
}

static enum ar_status cur_u64(struct cursor *c, uint64_t *v, const char *what)
{
    enum ar_status st = cur_need(c, 8, what);
    if (st != AR_OK)
        return st;
    *v = gguf_le_load(c->p + c->pos, 8);
    c->pos += 8;
    return AR_OK;
}

/* Reads a string: u64 length, then the bytes, all within the file. */
static enum ar_status cur_str(struct cursor *c, struct gguf_str *s, const char *what)
{
    uint64_t len;
    size_t at = c->pos;
    enum ar_status st = cur_u64(c, &len, what);
    if (st != AR_OK)
        return st;
    if (len > cur_left(c))
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: %s length %" PRIu64 " runs past the end of the file "
                          "(%zu bytes left) at offset %zu",
                          what, len, cur_left(c), at);
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return AR_OK;
}

/* Keys and tensor names: non-empty, bounded, no NUL inside (they are looked up as C strings). */
static enum ar_status cur_name(struct cursor *c, struct gguf_str *s, const char *what)
{
    size_t at = c->pos;
    enum ar_status st = cur_str(c, s, what);
    if (st != AR_OK)
        return st;
    if (s->len == 0)
        return ar_err_set(c->err, AR_EFORMAT, at, "gguf: empty %s at offset %zu", what, at);
    if (s->len > GGUF_MAX_KEY_LEN)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: %s of %" PRIu64 " bytes is too long at offset %zu", what, s->len,
                          at);
    if (memchr(s->ptr, '\0', (size_t)s->len))
        return ar_err_set(c->err, AR_EFORMAT, at, "gguf: %s contains a NUL byte at offset %zu",
                          what, at);
    return AR_OK;
}

/* ---- name index ------------------------------------------------------------------------------ */

static uint64_t name_hash(const char *s, size_t len)
{
    return ar_fnv1a64(AR_FNV64_BASIS, s, len);
}

static enum ar_status index_init(struct name_index *ix, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    ix->slots = ar_calloc((size_t)cap, sizeof(*ix->slots));
    if (!ix->slots)
        return AR_ENOMEM;
    ix->mask = cap - 1;
    return AR_OK;
}

/* Finds name; name_at(ctx, i) gives the stored name of entry i. Returns the slot position. */
typedef struct gguf_str (*name_at_fn)(const struct gguf_file *f, uint64_t i);

static uint64_t index_probe(const struct name_index *ix, const struct gguf_file *f,
                            name_at_fn name_at, const char *name, size_t len, bool *found)
{
    uint64_t h = name_hash(name, len) & ix->mask;
    *found = false;
    while (ix->slots[h]) {
        struct gguf_str s = name_at(f, ix->slots[h] - 1);
        if (s.len == len && memcmp(s.ptr, name, len) == 0) {
            *found = true;
            break;
        }
        h = (h + 1) & ix->mask;
    }
    return h;
}

static struct gguf_str kv_name_at(const struct gguf_file *f, uint64_t i)
{
    return f->kvs[i].key;
}

static struct gguf_str tensor_name_at(const struct gguf_file *f, uint64_t i)
{
    struct gguf_str s = {f->tensors[i].name, strlen(f->tensors[i].name)};
    return s;
}

/* ---- metadata values --------------------------------------------------------------------- */

/* Elements of string and nested arrays. Counting pass: items == NULL, only `used` grows. */
struct value_pool {
    struct gguf_value *items;
    uint64_t cap;
    uint64_t used;
};

static enum ar_status parse_value(struct cursor *c, uint32_t type, int depth,
                                  struct gguf_value *out, struct value_pool *pool);

static enum ar_status parse_array(struct cursor *c, int depth, struct gguf_arr *out,
                                  struct value_pool *pool)
{
    uint32_t et;
    uint64_t n;
    size_t at = c->pos;
    enum ar_status st;
    if (depth >= GGUF_MAX_DEPTH)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: arrays nested deeper than %d at offset %zu", GGUF_MAX_DEPTH, at);
    if ((st = cur_u32(c, &et, "array element type")) != AR_OK)
        return st;
    if (et >= GGUF_VTYPE_COUNT)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: unknown array element type %" PRIu32 " at offset %zu", et, at);
    if ((st = cur_u64(c, &n, "array length")) != AR_OK)
        return st;
    uint64_t esize = gguf_vtype_size(et);
    if (esize) {
        uint64_t bytes;
        if (ar_mul_overflow_u64(n, esize, &bytes) || bytes > cur_left(c))
            return ar_err_set(c->err, AR_EFORMAT, at,
                              "gguf: array of %" PRIu64 " %s elements runs past the end of the "
                              "file at offset %zu",
                              n, gguf_vtype_name((enum gguf_vtype)et), at);
        if (out) {
            out->type = (enum gguf_vtype)et;
            out->n = n;
            out->data = c->p + c->pos;
            out->items = NULL;
        }
        if (et == GGUF_VTYPE_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (c->p[c->pos + i] > 1)
                    return ar_err_set(c->err, AR_EFORMAT, c->pos + i,
                                      "gguf: bool array element is %u, not 0 or 1, at offset %zu",
                                      c->p[c->pos + i], (size_t)(c->pos + i));
        }
        c->pos += (size_t)bytes;
        return AR_OK;
    }
    /* Strings and arrays: every element takes at least a few bytes, which bounds n. */
    uint64_t min = et == GGUF_VTYPE_STRING ? MIN_STRING_BYTES : MIN_ARRAY_BYTES;
    if (n > cur_left(c) / min)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: array of %" PRIu64 " %s elements runs past the end of the file "
                          "at offset %zu",
                          n, gguf_vtype_name((enum gguf_vtype)et), at);
    struct gguf_value *items = NULL;
    if (pool->items) {
        if (n > pool->cap - pool->used) /* cannot happen: the counting pass sized the pool */
            return ar_err_set(c->err, AR_EFORMAT, at, "gguf: internal pool overflow");
        items = n ? pool->items + pool->used : NULL;
    }
    pool->used += n;
    if (out) {
        out->type = (enum gguf_vtype)et;
        out->n = n;
        out->data = NULL;
        out->items = items;
    }
    for (uint64_t i = 0; i < n; i++)
        if ((st = parse_value(c, et, depth + 1, items ? &items[i] : NULL, pool)) != AR_OK)
            return st;
    return AR_OK;
}

static enum ar_status parse_value(struct cursor *c, uint32_t type, int depth,
                                  struct gguf_value *out, struct value_pool *pool)
{
    struct gguf_value tmp;
    size_t at = c->pos;
    enum ar_status st;
    if (!out)
        out = &tmp;
    out->type = (enum gguf_vtype)type;
    if (type == GGUF_VTYPE_STRING)
        return cur_str(c, &out->v.str, "string value");
    if (type == GGUF_VTYPE_ARRAY)
        return parse_array(c, depth, &out->v.arr, pool);
    uint64_t size = gguf_vtype_size(type);
    if (!size)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: unknown value type %" PRIu32 " at offset %zu", type, at);
    if ((st = cur_need(c, size, "value")) != AR_OK)
        return st;
    uint64_t raw = gguf_le_load(c->p + c->pos, (unsigned)size);
    c->pos += (size_t)size;
    switch (type) {
    case GGUF_VTYPE_U8:
    case GGUF_VTYPE_U16:
    case GGUF_VTYPE_U32:
    case GGUF_VTYPE_U64:
        out->v.u64 = raw;
        break;
    case GGUF_VTYPE_BOOL:
        if (raw > 1)
            return ar_err_set(c->err, AR_EFORMAT, at,
                              "gguf: bool value is %" PRIu64 ", not 0 or 1, at offset %zu", raw,
                              at);
        out->v.u64 = raw;
        break;
    case GGUF_VTYPE_I8:
        out->v.i64 = (int8_t)raw;
        break;
    case GGUF_VTYPE_I16:
        out->v.i64 = (int16_t)raw;
        break;
    case GGUF_VTYPE_I32:
        out->v.i64 = (int32_t)raw;
        break;
    case GGUF_VTYPE_I64:
        out->v.i64 = (int64_t)raw;
        break;
    case GGUF_VTYPE_F32:
        out->v.f64 = (double)ar_bits_f32((uint32_t)raw);
        break;
    case GGUF_VTYPE_F64: {
        double d;
        memcpy(&d, &raw, 8);
        out->v.f64 = d;
        break;
    }
    default:
        break;
    }
    return AR_OK;
}

/* One pass over the key/value section. kvs == NULL: validate and count pool elements only. */
static enum ar_status parse_kvs(struct cursor *c, uint64_t n_kv, struct gguf_kv *kvs,
                                struct value_pool *pool)
{
    enum ar_status st;
    for (uint64_t i = 0; i < n_kv; i++) {
        struct gguf_str key;
        uint32_t type;
        size_t at;
        if ((st = cur_name(c, &key, "key")) != AR_OK)
            return st;
        at = c->pos;
        if ((st = cur_u32(c, &type, "value type")) != AR_OK)
            return st;
        if (type >= GGUF_VTYPE_COUNT)
            return ar_err_set(c->err, AR_EFORMAT, at,
                              "gguf: key '%.*s' has unknown value type %" PRIu32 " at offset %zu",
                              (int)AR_MIN(key.len, 64), key.ptr, type, at);
        if ((st = parse_value(c, type, 0, kvs ? &kvs[i].value : NULL, pool)) != AR_OK)
            return st;
        if (kvs)
            kvs[i].key = key;
    }
    return AR_OK;
}

static enum ar_status read_kvs(struct gguf_file *f, struct cursor *c, uint64_t n_kv)
{
    struct value_pool pool = {NULL, 0, 0};
    size_t start = c->pos;
    enum ar_status st;

    if ((st = parse_kvs(c, n_kv, NULL, &pool)) != AR_OK)
        return st;
    f->kvs = ar_calloc((size_t)(n_kv ? n_kv : 1), sizeof(*f->kvs));
    if (!f->kvs)
        return AR_ENOMEM;
    if (pool.used) {
        f->pool = ar_calloc((size_t)pool.used, sizeof(*f->pool));
        if (!f->pool)
            return AR_ENOMEM;
    }
    pool.items = f->pool;
    pool.cap = pool.used;
    pool.used = 0;
    c->pos = start;
    if ((st = parse_kvs(c, n_kv, f->kvs, &pool)) != AR_OK)
        return st;
    f->n_kv = (int64_t)n_kv;

    if ((st = index_init(&f->kv_index, n_kv)) != AR_OK)
        return st;
    for (uint64_t i = 0; i < n_kv; i++) {
        const struct gguf_str *k = &f->kvs[i].key;
        bool found;
        uint64_t h = index_probe(&f->kv_index, f, kv_name_at, k->ptr, (size_t)k->len, &found);
        if (found)
            return ar_err_set(c->err, AR_EFORMAT, (uint64_t)(k->ptr - (const char *)f->base),
                              "gguf: duplicate key '%.*s' at offset %zu", (int)AR_MIN(k->len, 64),
                              k->ptr, (size_t)(k->ptr - (const char *)f->base));
        f->kv_index.slots[h] = i + 1;
    }
    return AR_OK;
}

static const struct gguf_kv *find_kv(const struct gguf_file *f, const char *key)
{
    bool found;
    uint64_t h;
    if (!key || !f->kv_index.slots)
        return NULL;
    h = index_probe(&f->kv_index, f, kv_name_at, key, strlen(key), &found);
    return found ? &f->kvs[f->kv_index.slots[h] - 1] : NULL;
}

static enum ar_status read_alignment(struct gguf_file *f, struct ar_err *err)
{
    const struct gguf_kv *kv = find_kv(f, GGUF_ALIGNMENT_KEY);
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv)
        return AR_OK;
    const struct gguf_value *v = &kv->value;
    uint64_t at = (uint64_t)(kv->key.ptr - (const char *)f->base) - 8;
    if (v->type != GGUF_VTYPE_U32)
        return ar_err_set(err, AR_EFORMAT, at,
                          "gguf: %s has type %s, expected u32 (key at offset %" PRIu64 ")",
                          GGUF_ALIGNMENT_KEY, gguf_vtype_name(v->type), at);
    if (!gguf_is_pow2(v->v.u64))
        return ar_err_set(err, AR_EFORMAT, at,
                          "gguf: %s is %" PRIu64
                          ", not a nonzero power of two (key at offset %" PRIu64 ")",
                          GGUF_ALIGNMENT_KEY, v->v.u64, at);
    f->alignment = v->v.u64;
    return AR_OK;
}

/* ---- tensor index ------------------------------------------------------------------------ */

static enum ar_status read_tensor_info(struct cursor *c, struct gguf_tensor *t, size_t *name_at)
{
    struct gguf_str name;
    uint32_t n_dims, type;
    size_t at;
    enum ar_status st;

    *name_at = c->pos;
    if ((st = cur_name(c, &name, "tensor name")) != AR_OK)
        return st;
    t->name = ar_strndup(name.ptr, (size_t)name.len);
    if (!t->name)
        return AR_ENOMEM;
    at = c->pos;
    if ((st = cur_u32(c, &n_dims, "tensor n_dims")) != AR_OK)
        return st;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: tensor '%s' has %" PRIu32 " dimensions (1..%d allowed) at "
                          "offset %zu",
                          t->name, n_dims, GGUF_MAX_DIMS, at);
    t->n_dims = (int)n_dims;
    uint64_t n_el = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        at = c->pos;
        if ((st = cur_u64(c, &ne, "tensor dimension")) != AR_OK)
            return st;
        if (ne < 1 || ne > (uint64_t)INT64_MAX)
            return ar_err_set(c->err, AR_EFORMAT, at,
                              "gguf: tensor '%s' dimension %" PRIu32 " is %" PRId64
                              " (must be >= 1) at offset %zu",
                              t->name, d, (int64_t)ne, at);
        if (ar_mul_overflow_u64(n_el, ne, &n_el) || n_el > (uint64_t)INT64_MAX)
            return ar_err_set(c->err, AR_EFORMAT, at,
                              "gguf: tensor '%s' element count overflows at offset %zu", t->name,
                              at);
        t->ne[d] = (int64_t)ne;
    }
    at = c->pos;
    if ((st = cur_u32(c, &type, "tensor type")) != AR_OK)
        return st;
    const struct ar_type_info *ti = ar_type_info(type);
    if (!ti->name)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: tensor '%s' has unknown type %" PRIu32 " at offset %zu", t->name,
                          type, at);
    t->type = (enum ar_type)type;
    if (t->ne[0] % ti->block_size != 0)
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: tensor '%s' row length %" PRId64
                          " is not a multiple of the %s block size %d at offset %zu",
                          t->name, t->ne[0], ti->name, ti->block_size, at);
    uint64_t rows = n_el / (uint64_t)t->ne[0], row_size;
    if (ar_mul_overflow_u64((uint64_t)(t->ne[0] / ti->block_size), (uint64_t)ti->type_size,
                            &row_size) ||
        ar_mul_overflow_u64(row_size, rows, &t->size))
        return ar_err_set(c->err, AR_EFORMAT, at,
                          "gguf: tensor '%s' byte size overflows at offset %zu", t->name, at);
    at = c->pos;
    if ((st = cur_u64(c, &t->offset, "tensor offset")) != AR_OK)
        return st;
    return AR_OK;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
    const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static enum ar_status check_tensor_data(struct gguf_file *f, struct ar_err *err)
{
    uint64_t data_size = f->size - f->data_offset;
    const struct gguf_tensor **order;
    enum ar_status st = AR_OK;

    for (int64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0)
            return ar_err_set(err, AR_EFORMAT, f->data_offset,
                              "gguf: tensor '%s' offset %" PRIu64
                              " is not a multiple of the alignment %" PRIu64
                              " (data section at offset %" PRIu64 ")",
                              t->name, t->offset, f->alignment, f->data_offset);
        if (t->offset > data_size || t->size > data_size - t->offset)
            return ar_err_set(err, AR_EFORMAT, f->data_offset,
                              "gguf: tensor '%s' data [%" PRIu64 ", +%" PRIu64
                              ") runs past the end of the data section (%" PRIu64
                              " bytes at offset %" PRIu64 ")",
                              t->name, t->offset, t->size, data_size, f->data_offset);
        t->data = f->base + f->data_offset + t->offset;
    }
    if (f->n_tensors < 2)
        return AR_OK;
    order = ar_malloc((size_t)f->n_tensors * sizeof(*order));
    if (!order)
        return AR_ENOMEM;
    for (int64_t i = 0; i < f->n_tensors; i++)
        order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof(*order), cmp_by_offset);
    for (int64_t i = 0; i + 1 < f->n_tensors; i++) {
        if (order[i]->offset + order[i]->size > order[i + 1]->offset) {
            st = ar_err_set(err, AR_EFORMAT, f->data_offset + order[i + 1]->offset,
                            "gguf: data of tensors '%s' and '%s' overlap at offset %" PRIu64,
                            order[i]->name, order[i + 1]->name,
                            f->data_offset + order[i + 1]->offset);
            break;
        }
    }
    ar_free(order);
    return st;
}

static enum ar_status read_tensors(struct gguf_file *f, struct cursor *c, uint64_t n_tensors)
{
    enum ar_status st;
    if (n_tensors == 0)
        return AR_OK;
    f->tensors = ar_calloc((size_t)n_tensors, sizeof(*f->tensors));
    if (!f->tensors)
        return AR_ENOMEM;
    f->n_tensors = (int64_t)n_tensors; /* so that gguf_close frees the names read so far */
    if ((st = index_init(&f->tensor_index, n_tensors)) != AR_OK)
        return st;
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        size_t name_at;
        bool found;
        if ((st = read_tensor_info(c, t, &name_at)) != AR_OK)
            return st;
        uint64_t h =
            index_probe(&f->tensor_index, f, tensor_name_at, t->name, strlen(t->name), &found);
        if (found)
            return ar_err_set(c->err, AR_EFORMAT, name_at,
                              "gguf: duplicate tensor name '%s' at offset %zu", t->name, name_at);
        f->tensor_index.slots[h] = i + 1;
    }
    return AR_OK;
}

/* ---- open / close ------------------------------------------------------------------------ */

static enum ar_status parse(struct gguf_file *f, struct ar_err *err)
{
    struct cursor c = {f->base, f->size, 0, err};
    uint64_t n_tensors, n_kv;
    enum ar_status st;

    if (f->size < 4 || memcmp(f->base, GGUF_MAGIC, 4) != 0)
        return ar_err_set(err, AR_EFORMAT, 0, "gguf: bad magic at offset 0 (not a GGUF file)");
    c.pos = 4;
    if ((st = cur_u32(&c, &f->version, "version")) != AR_OK)
        return st;
    if (f->version != 2 && f->version != 3) {
        if (f->version == 0x03000000u || f->version == 0x02000000u)
            return ar_err_set(err, AR_EFORMAT, 4,
                              "gguf: big-endian GGUF files are not supported (offset 4)");
        return ar_err_set(err, AR_EFORMAT, 4,
                          "gguf: unsupported version %" PRIu32 " at offset 4 (2 and 3 are read)",
                          f->version);
    }
    if ((st = cur_u64(&c, &n_tensors, "tensor count")) != AR_OK)
        return st;
    if ((st = cur_u64(&c, &n_kv, "key/value count")) != AR_OK)
        return st;
    if (n_kv > cur_left(&c) / MIN_KV_BYTES)
        return ar_err_set(err, AR_EFORMAT, 16,
                          "gguf: key/value count %" PRIu64 " is impossible for a file of %zu "
                          "bytes (offset 16)",
                          n_kv, f->size);
    if (n_tensors > cur_left(&c) / MIN_TENSOR_BYTES)
        return ar_err_set(err, AR_EFORMAT, 8,
                          "gguf: tensor count %" PRIu64 " is impossible for a file of %zu "
                          "bytes (offset 8)",
                          n_tensors, f->size);
    if ((st = read_kvs(f, &c, n_kv)) != AR_OK)
        return st;
    if ((st = read_alignment(f, err)) != AR_OK)
        return st;
    if (n_tensors > cur_left(&c) / MIN_TENSOR_BYTES)
        return ar_err_set(err, AR_EFORMAT, 8,
                          "gguf: tensor count %" PRIu64 " does not fit in the %zu bytes after "
                          "the metadata (offset 8)",
                          n_tensors, cur_left(&c));
    if ((st = read_tensors(f, &c, n_tensors)) != AR_OK)
        return st;

    /* Data section: aligned start. A file without tensors may end right after the index. */
    uint64_t pad = (f->alignment - c.pos % f->alignment) % f->alignment;
    f->data_offset = (uint64_t)c.pos + pad;
    if (f->data_offset > f->size) {
        if (n_tensors)
            return ar_err_set(err, AR_EFORMAT, c.pos,
                              "gguf: data section at offset %" PRIu64
                              " starts past the end of the file (%zu bytes)",
                              f->data_offset, f->size);
        f->data_offset = f->size;
    }
    return check_tensor_data(f, err);
}

enum ar_status gguf_open_memory(const void *data, size_t size, struct gguf_file **out,
                                struct ar_err *err)
{
    struct gguf_file *f;
    enum ar_status st;
    if (!out || (!data && size))
        return ar_err_set(err, AR_EINVAL, 0, "gguf: invalid argument");
    *out = NULL;
    f = ar_calloc(1, sizeof(*f));
    if (!f)
        return ar_err_set(err, AR_ENOMEM, 0, "gguf: out of memory");
    f->base = data;
    f->size = size;
    st = parse(f, err);
    if (st != AR_OK) {
        if (st == AR_ENOMEM)
            ar_err_set(err, AR_ENOMEM, 0, "gguf: out of memory");
        gguf_close(f);
        return st;
    }
    *out = f;
    return AR_OK;
}

enum ar_status gguf_open(const char *path, struct gguf_file **out, struct ar_err *err)
{
    struct stat sb;
    void *map;
    int fd;
    enum ar_status st;

    if (!path || !out)
        return ar_err_set(err, AR_EINVAL, 0, "gguf: invalid argument");
    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ar_err_set(err, AR_EIO, 0, "gguf: cannot open %s", path);
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ar_err_set(err, AR_EIO, 0, "gguf: %s is not a regular file", path);
    }
    if (sb.st_size == 0) { /* cannot be mapped */
        close(fd);
        return ar_err_set(err, AR_EFORMAT, 0, "gguf: %s is empty (bad magic at offset 0)", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return ar_err_set(err, AR_EIO, 0, "gguf: %s is too large to map", path);
    }
    map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return ar_err_set(err, AR_EIO, 0, "gguf: cannot map %s", path);
    st = gguf_open_memory(map, (size_t)sb.st_size, out, err);
    if (st != AR_OK) {
        munmap(map, (size_t)sb.st_size);
        return st;
    }
    (*out)->map = map;
    (*out)->map_size = (size_t)sb.st_size;
    return AR_OK;
}

void gguf_release_range(const struct gguf_file *f, const void *p, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a, b;
    if (!f || !f->map || !p || (const uint8_t *)p < (const uint8_t *)f->map ||
        len > f->map_size || (size_t)((const uint8_t *)p - (const uint8_t *)f->map) > f->map_size - len)
        return;
    a = ((uintptr_t)p + page - 1) & ~(page - 1); /* whole pages inside the range only */
    b = ((uintptr_t)p + len) & ~(page - 1);
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

void gguf_close(struct gguf_file *f)
{
    if (!f)
        return;
    if (f->tensors)
        for (int64_t i = 0; i < f->n_tensors; i++)
            ar_free(f->tensors[i].name);
    ar_free(f->tensors);
    ar_free(f->tensor_index.slots);
    ar_free(f->kv_index.slots);
    ar_free(f->pool);
    ar_free(f->kvs);
    if (f->map)
        munmap(f->map, f->map_size);
    ar_free(f);
}

/* ---- accessors --------------------------------------------------------------------------- */

uint32_t gguf_version(const struct gguf_file *f)
{
    return f->version;
}

uint64_t gguf_alignment(const struct gguf_file *f)
{
    return f->alignment;
}

uint64_t gguf_data_offset(const struct gguf_file *f)
{
    return f->data_offset;
}

size_t gguf_file_size(const struct gguf_file *f)
{
    return f->size;
}

int64_t gguf_n_kv(const struct gguf_file *f)
{
    return f->n_kv;
}

const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i)
{
    if (i < 0 || i >= f->n_kv)
        return NULL;
    return &f->kvs[i];
}

const struct gguf_value *gguf_find(const struct gguf_file *f, const char *key)
{
    const struct gguf_kv *kv = find_kv(f, key);
    return kv ? &kv->value : NULL;
}

/* Integer (or bool) value as a sign flag plus magnitude-free pair. */
static bool value_int(const struct gguf_value *v, bool *neg, uint64_t *u, int64_t *s)
{
    switch (v->type) {
    case GGUF_VTYPE_U8:
    case GGUF_VTYPE_U16:
    case GGUF_VTYPE_U32:
    case GGUF_VTYPE_U64:
    case GGUF_VTYPE_BOOL:
        *neg = false;
        *u = v->v.u64;
        *s = v->v.u64 > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v->v.u64;
        return true;
    case GGUF_VTYPE_I8:
    case GGUF_VTYPE_I16:
    case GGUF_VTYPE_I32:
    case GGUF_VTYPE_I64:
        *neg = v->v.i64 < 0;
        *u = *neg ? 0 : (uint64_t)v->v.i64;
        *s = v->v.i64;
        return true;
    default:
        return false;
    }
}

bool gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
    const struct gguf_value *v = gguf_find(f, key);
    bool neg;
    uint64_t u;
    int64_t s;
    if (!v || !value_int(v, &neg, &u, &s) || neg || u > UINT32_MAX)
        return false;
    *out = (uint32_t)u;
    return true;
}

bool gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out)
{
    const struct gguf_value *v = gguf_find(f, key);
    bool neg;
    uint64_t u;
    int64_t s;
    if (!v || !value_int(v, &neg, &u, &s) || (!neg && u > (uint64_t)INT64_MAX))
        return false;
    *out = s;
    return true;
}

bool gguf_get_f32(const struct gguf_file *f, const char *key, float *out)
{
    const struct gguf_value *v = gguf_find(f, key);
    if (!v || (v->type != GGUF_VTYPE_F32 && v->type != GGUF_VTYPE_F64))
        return false;
    *out = (float)v->v.f64;
    return true;
}

bool gguf_get_bool(const struct gguf_file *f, const char *key, bool *out)
{
    const struct gguf_value *v = gguf_find(f, key);
    if (!v || v->type != GGUF_VTYPE_BOOL)
        return false;
    *out = v->v.u64 != 0;
    return true;
}

bool gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out)
{
    const struct gguf_value *v = gguf_find(f, key);
    if (!v || v->type != GGUF_VTYPE_STRING)
        return false;
    *out = v->v.str;
    return true;
}

bool gguf_get_arr(const struct gguf_file *f, const char *key, const struct gguf_arr **out)
{
    const struct gguf_value *v = gguf_find(f, key);
    if (!v || v->type != GGUF_VTYPE_ARRAY)
        return false;
    *out = &v->v.arr;
    return true;
}

struct gguf_str gguf_arr_str(const struct gguf_arr *arr, uint64_t i)
{
    struct gguf_str none = {"", 0};
    if (arr->type != GGUF_VTYPE_STRING || i >= arr->n)
        return none;
    return arr->items[i].v.str;
}

float gguf_arr_f32(const struct gguf_arr *arr, uint64_t i)
{
    const uint8_t *p = arr->data;
    if (i >= arr->n)
        return 0.0f;
    if (arr->type == GGUF_VTYPE_F32)
        return ar_bits_f32((uint32_t)gguf_le_load(p + 4 * i, 4));
    if (arr->type == GGUF_VTYPE_F64) {
        uint64_t raw = gguf_le_load(p + 8 * i, 8);
        double d;
        memcpy(&d, &raw, 8);
        return (float)d;
    }
    return 0.0f;
}

int64_t gguf_arr_int(const struct gguf_arr *arr, uint64_t i)
{
    const uint8_t *p = arr->data;
    if (i >= arr->n)
        return 0;
    switch (arr->type) {
    case GGUF_VTYPE_U8:
    case GGUF_VTYPE_BOOL:
        return p[i];
    case GGUF_VTYPE_I8:
        return (int8_t)p[i];
    case GGUF_VTYPE_U16:
        return (int64_t)gguf_le_load(p + 2 * i, 2);
    case GGUF_VTYPE_I16:
        return (int16_t)gguf_le_load(p + 2 * i, 2);
    case GGUF_VTYPE_U32:
        return (int64_t)gguf_le_load(p + 4 * i, 4);
    case GGUF_VTYPE_I32:
        return (int32_t)gguf_le_load(p + 4 * i, 4);
    case GGUF_VTYPE_U64:
    case GGUF_VTYPE_I64:
        return (int64_t)gguf_le_load(p + 8 * i, 8);
    default:
        return 0;
    }
}

int64_t gguf_n_tensors(const struct gguf_file *f)
{
    return f->n_tensors;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int64_t i)
{
    if (i < 0 || i >= f->n_tensors)
        return NULL;
    return &f->tensors[i];
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    bool found;
    uint64_t h;
    if (!name || !f->tensor_index.slots)
        return NULL;
    h = index_probe(&f->tensor_index, f, tensor_name_at, name, strlen(name), &found);
    return found ? &f->tensors[f->tensor_index.slots[h] - 1] : NULL;
}

const char *gguf_vtype_name(enum gguf_vtype t)
{
    static const char *const names[GGUF_VTYPE_COUNT] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                                        "i32", "f32", "bool", "string", "array",
                                                        "u64", "i64", "f64"};
    if ((unsigned)t >= GGUF_VTYPE_COUNT)
        return "?";
    return names[t];
}
