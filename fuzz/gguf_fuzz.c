/* gguf_fuzz.c - fuzz target for the GGUF reader: open arbitrary bytes; when they are accepted,
 * walk every key, nested array and tensor (first and last data byte), check the lookups agree
 * with the index, and push the file through the writer and back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void check(int cond)
{
    if (!cond)
        abort();
}

static void walk_value(const struct gguf_value *v)
{
    switch (v->type) {
    case GGUF_VTYPE_STRING:
        if (v->v.str.len)
            sink += (uint8_t)v->v.str.ptr[0] + (uint8_t)v->v.str.ptr[v->v.str.len - 1];
        break;
    case GGUF_VTYPE_ARRAY: {
        const struct gguf_arr *a = &v->v.arr;
        for (uint64_t i = 0; i < a->n; i++) {
            if (a->type == GGUF_VTYPE_STRING || a->type == GGUF_VTYPE_ARRAY) {
                check(a->items[i].type == a->type);
                walk_value(&a->items[i]);
            } else if (a->type == GGUF_VTYPE_F32 || a->type == GGUF_VTYPE_F64) {
                sink += (uint64_t)(gguf_arr_f32(a, i) != 0.0f);
            } else {
                sink += (uint64_t)gguf_arr_int(a, i);
            }
        }
        break;
    }
    default:
        sink += v->v.u64;
        break;
    }
}

/* Writes everything back out and reads it again: same keys, same tensors. */
static void round_trip(const struct gguf_file *f)
{
    struct gguf_writer *w;
    struct gguf_file *g;
    void *out;
    size_t len;
    char key[256];
    if (gguf_writer_create(&w) != AR_OK)
        return;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (kv->key.len >= sizeof(key))
            goto done;
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = '\0';
        check(gguf_writer_set_value(w, key, &kv->value) == AR_OK);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        check(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size,
                                     true) == AR_OK);
    }
    check(gguf_writer_write_memory(w, &out, &len, NULL) == AR_OK);
    check(gguf_open_memory(out, len, &g, NULL) == AR_OK);
    check(gguf_n_kv(g) == gguf_n_kv(f) && gguf_n_tensors(g) == gguf_n_tensors(f));
    check(gguf_alignment(g) == gguf_alignment(f));
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor *a = gguf_tensor_at(f, i), *b = gguf_tensor_at(g, i);
        check(a->size == b->size && memcmp(a->data, b->data, (size_t)a->size) == 0);
    }
    gguf_close(g);
    ar_free(out);
done:
    gguf_writer_destroy(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file *f;
    struct ar_err err;
    char key[256];

    if (gguf_open_memory(data, size, &f, &err) != AR_OK) {
        check(memchr(err.msg, '\0', sizeof(err.msg)) != NULL && err.msg[0] != '\0');
        return 0;
    }
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        walk_value(&kv->value);
        if (kv->key.len < sizeof(key)) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = '\0';
            check(gguf_find(f, key) == &kv->value);
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        check(gguf_find_tensor(f, t->name) == t);
        check(t->size > 0 && t->offset % gguf_alignment(f) == 0);
        check(p >= data && p + t->size <= data + size);
        sink += p[0] + p[t->size - 1];
    }
    if (size < 1 << 16)
        round_trip(f);
    gguf_close(f);
    return 0;
}
