/* kv.c - the paged KV cache: one aligned allocation holding, for every layer, the K and the
 * V rows of every block; a free stack of block ids; a reference count per block; and the
 * per-sequence block tables the model reads and writes through.
 * Layout: data + ((layer * 2 + {0: K, 1: V}) * n_blocks + block) * block_size. */
#include "kv.h"

#include <assert.h>

struct kv_cache {
    struct kv_params p;
    size_t row_size;   /* bytes of one token's K (or V) row in one layer */
    size_t block_size; /* block_tokens * row_size */
    uint8_t *data;     /* owned (ar_malloc_aligned), kv_total_size bytes */
    int32_t *refs;     /* owned, (n_blocks): 0 = free */
    int32_t *free_ids; /* owned, (n_blocks): stack of free block ids, top at n_free - 1 */
    int64_t n_free;
};

/* Element size of a supported cache type; 0 otherwise. */
static size_t kv_elem_size(enum ar_type t)
{
    switch (t) {
    case AR_TYPE_F16:
        return 2;
    case AR_TYPE_F32:
        return 4;
    default:
        return 0;
    }
}

/* Checks the geometry and computes the total size; false when invalid or overflowing. */
static bool kv_geometry(const struct kv_params *p, size_t *row_size, size_t *total)
{
    uint64_t row, blk, all;
    size_t es = kv_elem_size(p->type);
    if (!es || p->n_layers <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 ||
        p->block_tokens <= 0 || p->n_blocks <= 0 || p->n_blocks > INT32_MAX)
        return false;
    if (ar_mul_overflow_u64((uint64_t)p->n_kv_heads * (uint64_t)p->head_dim, es, &row) ||
        ar_mul_overflow_u64(row, (uint64_t)p->block_tokens, &blk) ||
        ar_mul_overflow_u64(blk, (uint64_t)p->n_blocks, &all) ||
        ar_mul_overflow_u64(all, 2u * (uint64_t)p->n_layers, &all) || all > SIZE_MAX)
        return false;
    *row_size = (size_t)row;
    *total = (size_t)all;
    return true;
}

size_t kv_total_size(const struct kv_params *p)
{
    size_t row, total;
    return kv_geometry(p, &row, &total) ? total : 0;
}

enum ar_status kv_create(const struct kv_params *p, struct kv_cache **out)
{
    size_t row, total;
    struct kv_cache *kv;
    if (!p || !out || !kv_geometry(p, &row, &total))
        return AR_EINVAL;
    kv = ar_calloc(1, sizeof(*kv));
    if (!kv)
        return AR_ENOMEM;
    kv->p = *p;
    kv->row_size = row;
    kv->block_size = row * (size_t)p->block_tokens;
    kv->data = ar_malloc_aligned(total);
    kv->refs = ar_calloc((size_t)p->n_blocks, sizeof(*kv->refs));
    kv->free_ids = ar_malloc((size_t)p->n_blocks * sizeof(*kv->free_ids));
    if (!kv->data || !kv->refs || !kv->free_ids) {
        kv_destroy(kv);
        return AR_ENOMEM;
    }
    /* Lowest ids on top, so a fresh cache hands out blocks 0, 1, 2 ... */
    for (int64_t i = 0; i < p->n_blocks; i++)
        kv->free_ids[i] = (int32_t)(p->n_blocks - 1 - i);
    kv->n_free = p->n_blocks;
    *out = kv;
    return AR_OK;
}

void kv_destroy(struct kv_cache *kv)
{
    if (!kv)
        return;
    ar_free_aligned(kv->data);
    ar_free(kv->refs);
    ar_free(kv->free_ids);
    ar_free(kv);
}

const struct kv_params *kv_params(const struct kv_cache *kv)
{
    return &kv->p;
}

size_t kv_row_size(const struct kv_cache *kv)
{
    return kv->row_size;
}

static void *kv_block_ptr(struct kv_cache *kv, int layer, int which, int32_t block)
{
    assert(layer >= 0 && layer < kv->p.n_layers);
    assert(block >= 0 && block < kv->p.n_blocks);
    size_t idx = ((size_t)layer * 2 + (size_t)which) * (size_t)kv->p.n_blocks + (size_t)block;
    return kv->data + idx * kv->block_size;
}

void *kv_k_block(struct kv_cache *kv, int layer, int32_t block)
{
    return kv_block_ptr(kv, layer, 0, block);
}

void *kv_v_block(struct kv_cache *kv, int layer, int32_t block)
{
    return kv_block_ptr(kv, layer, 1, block);
}

/* ---- blocks -------------------------------------------------------------------------- */

int32_t kv_block_alloc(struct kv_cache *kv)
{
    int32_t b;
    if (kv->n_free == 0)
        return -1;
    b = kv->free_ids[--kv->n_free];
    assert(kv->refs[b] == 0);
    kv->refs[b] = 1;
    return b;
}

void kv_block_ref(struct kv_cache *kv, int32_t block)
{
    assert(block >= 0 && block < kv->p.n_blocks && kv->refs[block] > 0);
    kv->refs[block]++;
}

void kv_block_unref(struct kv_cache *kv, int32_t block)
{
    assert(block >= 0 && block < kv->p.n_blocks && kv->refs[block] > 0);
    if (--kv->refs[block] == 0)
        kv->free_ids[kv->n_free++] = block;
}

int kv_block_refcount(const struct kv_cache *kv, int32_t block)
{
    if (block < 0 || block >= kv->p.n_blocks)
        return 0;
    return kv->refs[block];
}

int64_t kv_n_free(const struct kv_cache *kv)
{
    return kv->n_free;
}

/* ---- sequences ----------------------------------------------------------------------- */

void kv_seq_init(struct kv_seq *s)
{
    s->blocks = NULL;
    s->n_blocks = 0;
    s->cap = 0;
}

void kv_seq_fini(struct kv_cache *kv, struct kv_seq *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->n_blocks; i++)
        kv_block_unref(kv, s->blocks[i]);
    ar_free(s->blocks);
    kv_seq_init(s);
}

enum ar_status kv_seq_reserve(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens)
{
    int64_t bt = kv->p.block_tokens;
    int64_t need, extra;
    if (n_tokens < 0)
        return AR_EINVAL;
    need = n_tokens / bt + (n_tokens % bt != 0);
    if (need <= s->n_blocks)
        return AR_OK;
    extra = need - s->n_blocks;
    if (extra > kv->n_free)
        return AR_EBUSY;
    if (need > s->cap) {
        int64_t cap = s->cap ? s->cap : 4;
        int32_t *nb;
        while (cap < need)
            cap *= 2;
        if (cap > INT32_MAX)
            cap = INT32_MAX; /* need <= n_free + n_blocks <= INT32_MAX */
        nb = ar_realloc(s->blocks, (size_t)cap * sizeof(*nb));
        if (!nb)
            return AR_ENOMEM;
        s->blocks = nb;
        s->cap = (int32_t)cap;
    }
    while (s->n_blocks < need) {
        int32_t b = kv_block_alloc(kv);
        assert(b >= 0); /* checked against n_free above */
        s->blocks[s->n_blocks++] = b;
    }
    return AR_OK;
}

void kv_seq_truncate(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens)
{
    int64_t bt = kv->p.block_tokens;
    int64_t keep;
    if (n_tokens < 0)
        n_tokens = 0;
    keep = n_tokens / bt + (n_tokens % bt != 0);
    while (s->n_blocks > keep)
        kv_block_unref(kv, s->blocks[--s->n_blocks]);
}
