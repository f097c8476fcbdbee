/* kv.c - the paged KV cache: per pool one aligned allocation holding, for every layer of the
 * pool, the K and the V rows of every block; a free stack of block ids; a reference count
 * per block; and the per-sequence block tables the model reads and writes through.
 * Pools: the global one holds every layer, or, with a local pool, the layers that are not
 * sliding-window ones; the local pool holds the sliding-window layers.
 * Layout of a pool: data + ((slot * 2 + {0: K, 1: V}) * n_blocks + block) * block_size, slot
 * being the layer's index among the pool's layers. */
#include "kv.h"

#include <assert.h>

struct kv_pool_data {
    int64_t n_blocks;
    int n_layers;      /* layers stored in this pool */
    uint8_t *data;     /* owned (ar_malloc_aligned) */
    int32_t *refs;     /* owned, (n_blocks): 0 = free */
    int32_t *free_ids; /* owned, (n_blocks): stack of free block ids, top at n_free - 1 */
    int64_t n_free;
};

struct kv_cache {
    struct kv_params p;
    size_t row_size;   /* bytes of one token's K (or V) row in one layer */
    size_t block_size; /* block_tokens * row_size */
    struct kv_pool_data pool[2];
    int n_pools;       /* 1, or 2 with a local pool */
    uint8_t *swa;      /* owned, (n_layers): the copy of p.swa_layers (all 0 when NULL) */
    uint8_t *in_pool;  /* owned, (n_layers): enum kv_pool of each layer */
    int32_t *slot;     /* owned, (n_layers): the layer's index in its pool */
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

/* Layers of the sliding-window kind in p (0 when there can be no local pool). */
static int kv_n_local_layers(const struct kv_params *p)
{
    int n = 0;
    if (p->n_local_blocks <= 0 || p->swa_window <= 0 || !p->swa_layers)
        return 0;
    for (int l = 0; l < p->n_layers; l++)
        n += p->swa_layers[l] != 0;
    return n;
}

/* Bytes of a pool of n_blocks blocks of n_layers layers; false on overflow. */
static bool kv_pool_bytes(uint64_t blk, int64_t n_blocks, int n_layers, uint64_t *out)
{
    uint64_t all;
    return !ar_mul_overflow_u64(blk, (uint64_t)n_blocks, &all) &&
           !ar_mul_overflow_u64(all, 2u * (uint64_t)n_layers, out);
}

/* Checks the geometry and computes the pools' sizes; false when invalid or overflowing. */
static bool kv_geometry(const struct kv_params *p, size_t *row_size, size_t *global,
                        size_t *local)
{
    uint64_t row, blk, g, l;
    size_t es = kv_elem_size(p->type);
    int n_local;
    if (!es || p->n_layers <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 ||
        p->block_tokens <= 0 || p->n_blocks <= 0 || p->n_blocks > INT32_MAX ||
        p->swa_window < 0 || p->n_local_blocks < 0 || p->n_local_blocks > INT32_MAX)
        return false;
    n_local = kv_n_local_layers(p);
    if (ar_mul_overflow_u64((uint64_t)p->n_kv_heads * (uint64_t)p->head_dim, es, &row) ||
        ar_mul_overflow_u64(row, (uint64_t)p->block_tokens, &blk) ||
        !kv_pool_bytes(blk, p->n_blocks, p->n_layers - n_local, &g) ||
        !kv_pool_bytes(blk, n_local ? p->n_local_blocks : 0, n_local, &l) || g > SIZE_MAX ||
        l > SIZE_MAX || g + l < g || g + l > SIZE_MAX)
        return false;
    *row_size = (size_t)row;
    *global = (size_t)g;
    *local = (size_t)l;
    return true;
}

size_t kv_total_size(const struct kv_params *p)
{
    size_t row, g, l;
    return kv_geometry(p, &row, &g, &l) ? g + l : 0;
}

static enum ar_status kv_pool_init(struct kv_pool_data *pl, int64_t n_blocks, int n_layers,
                                   size_t bytes)
{
    pl->n_blocks = n_blocks;
    pl->n_layers = n_layers;
    /* a pool of no layers (every layer sliding) still hands out ids for the tables */
    pl->data = ar_malloc_aligned(bytes ? bytes : 64);
    pl->refs = ar_calloc((size_t)n_blocks, sizeof(*pl->refs));
    pl->free_ids = ar_malloc((size_t)n_blocks * sizeof(*pl->free_ids));
    if (!pl->data || !pl->refs || !pl->free_ids)
        return AR_ENOMEM;
    /* Lowest ids on top, so a fresh pool hands out blocks 0, 1, 2 ... */
    for (int64_t i = 0; i < n_blocks; i++)
        pl->free_ids[i] = (int32_t)(n_blocks - 1 - i);
    pl->n_free = n_blocks;
    return AR_OK;
}

enum ar_status kv_create(const struct kv_params *p, struct kv_cache **out)
{
    size_t row, g, l;
    struct kv_cache *kv;
    int n_slot[2] = {0, 0};
    if (!p || !out || !kv_geometry(p, &row, &g, &l))
        return AR_EINVAL;
    kv = ar_calloc(1, sizeof(*kv));
    if (!kv)
        return AR_ENOMEM;
    kv->p = *p;
    kv->row_size = row;
    kv->block_size = row * (size_t)p->block_tokens;
    kv->n_pools = kv_n_local_layers(p) > 0 ? 2 : 1;
    kv->swa = ar_calloc((size_t)p->n_layers, 1);
    kv->in_pool = ar_calloc((size_t)p->n_layers, 1);
    kv->slot = ar_malloc((size_t)p->n_layers * sizeof(*kv->slot));
    if (!kv->swa || !kv->in_pool || !kv->slot) {
        kv_destroy(kv);
        return AR_ENOMEM;
    }
    for (int i = 0; i < p->n_layers; i++) {
        kv->swa[i] = p->swa_layers && p->swa_layers[i] ? 1 : 0;
        kv->in_pool[i] = kv->n_pools == 2 && kv->swa[i] ? KV_POOL_LOCAL : KV_POOL_GLOBAL;
        kv->slot[i] = n_slot[kv->in_pool[i]]++;
    }
    kv->p.swa_layers = kv->swa;
    if (kv->n_pools == 1)
        kv->p.n_local_blocks = 0;
    if (kv_pool_init(&kv->pool[0], p->n_blocks, n_slot[0], g) != AR_OK ||
        (kv->n_pools == 2 &&
         kv_pool_init(&kv->pool[1], p->n_local_blocks, n_slot[1], l) != AR_OK)) {
        kv_destroy(kv);
        return AR_ENOMEM;
    }
    *out = kv;
    return AR_OK;
}

void kv_destroy(struct kv_cache *kv)
{
    if (!kv)
        return;
    for (int i = 0; i < 2; i++) {
        ar_free_aligned(kv->pool[i].data);
        ar_free(kv->pool[i].refs);
        ar_free(kv->pool[i].free_ids);
    }
    ar_free(kv->swa);
    ar_free(kv->in_pool);
    ar_free(kv->slot);
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

bool kv_has_local(const struct kv_cache *kv)
{
    return kv->n_pools == 2;
}

enum kv_pool kv_layer_pool(const struct kv_cache *kv, int layer)
{
    assert(layer >= 0 && layer < kv->p.n_layers);
    return (enum kv_pool)kv->in_pool[layer];
}

static void *kv_block_ptr(struct kv_cache *kv, int layer, int which, int32_t block)
{
    assert(layer >= 0 && layer < kv->p.n_layers);
    const struct kv_pool_data *pl = &kv->pool[kv->in_pool[layer]];
    assert(block >= 0 && block < pl->n_blocks);
    size_t idx = ((size_t)kv->slot[layer] * 2 + (size_t)which) * (size_t)pl->n_blocks +
                 (size_t)block;
    return pl->data + idx * kv->block_size;
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

int32_t kv_pool_alloc(struct kv_cache *kv, enum kv_pool pool)
{
    struct kv_pool_data *pl = &kv->pool[pool];
    int32_t b;
    assert((int)pool < kv->n_pools);
    if (pl->n_free == 0)
        return -1;
    b = pl->free_ids[--pl->n_free];
    assert(pl->refs[b] == 0);
    pl->refs[b] = 1;
    return b;
}

void kv_pool_ref(struct kv_cache *kv, enum kv_pool pool, int32_t block)
{
    struct kv_pool_data *pl = &kv->pool[pool];
    assert((int)pool < kv->n_pools);
    assert(block >= 0 && block < pl->n_blocks && pl->refs[block] > 0);
    pl->refs[block]++;
}

void kv_pool_unref(struct kv_cache *kv, enum kv_pool pool, int32_t block)
{
    struct kv_pool_data *pl = &kv->pool[pool];
    assert((int)pool < kv->n_pools);
    assert(block >= 0 && block < pl->n_blocks && pl->refs[block] > 0);
    if (--pl->refs[block] == 0)
        pl->free_ids[pl->n_free++] = block;
}

int kv_pool_refcount(const struct kv_cache *kv, enum kv_pool pool, int32_t block)
{
    if ((int)pool >= kv->n_pools || block < 0 || block >= kv->pool[pool].n_blocks)
        return 0;
    return kv->pool[pool].refs[block];
}

int64_t kv_pool_n_free(const struct kv_cache *kv, enum kv_pool pool)
{
    return (int)pool < kv->n_pools ? kv->pool[pool].n_free : 0;
}

int64_t kv_pool_n_blocks(const struct kv_cache *kv, enum kv_pool pool)
{
    return (int)pool < kv->n_pools ? kv->pool[pool].n_blocks : 0;
}

int32_t kv_block_alloc(struct kv_cache *kv)
{
    return kv_pool_alloc(kv, KV_POOL_GLOBAL);
}

void kv_block_ref(struct kv_cache *kv, int32_t block)
{
    kv_pool_ref(kv, KV_POOL_GLOBAL, block);
}

void kv_block_unref(struct kv_cache *kv, int32_t block)
{
    kv_pool_unref(kv, KV_POOL_GLOBAL, block);
}

int kv_block_refcount(const struct kv_cache *kv, int32_t block)
{
    return kv_pool_refcount(kv, KV_POOL_GLOBAL, block);
}

int64_t kv_n_free(const struct kv_cache *kv)
{
    return kv_pool_n_free(kv, KV_POOL_GLOBAL);
}

/* ---- sequences ----------------------------------------------------------------------- */

void kv_seq_init(struct kv_seq *s)
{
    s->blocks = NULL;
    s->local = NULL;
    s->n_blocks = 0;
    s->cap = 0;
    s->n_slid = 0;
}

void kv_seq_fini(struct kv_cache *kv, struct kv_seq *s)
{
    if (!s)
        return;
    kv_seq_truncate(kv, s, 0);
    ar_free(s->blocks);
    ar_free(s->local);
    kv_seq_init(s);
}

/* Grows the tables to hold need entries. */
static enum ar_status seq_grow(const struct kv_cache *kv, struct kv_seq *s, int64_t need)
{
    int64_t cap = s->cap ? s->cap : 4;
    int32_t *nb;
    if (need <= s->cap)
        return AR_OK;
    while (cap < need)
        cap *= 2;
    if (cap > INT32_MAX)
        cap = INT32_MAX; /* need <= n_free + n_blocks <= INT32_MAX */
    nb = ar_realloc(s->blocks, (size_t)cap * sizeof(*nb));
    if (!nb)
        return AR_ENOMEM;
    s->blocks = nb;
    if (kv_has_local(kv)) {
        nb = ar_realloc(s->local, (size_t)cap * sizeof(*nb));
        if (!nb)
            return AR_ENOMEM; /* blocks grew: harmless, cap stays */
        s->local = nb;
    }
    s->cap = (int32_t)cap;
    return AR_OK;
}

/* Table entries covering n_tokens positions. */
static int64_t seq_blocks_for(const struct kv_cache *kv, int64_t n_tokens)
{
    int64_t bt = kv->p.block_tokens;
    return n_tokens / bt + (n_tokens % bt != 0);
}

void kv_seq_need(const struct kv_cache *kv, const struct kv_seq *s, int64_t n_tokens, int64_t from,
                 int64_t *n_global, int64_t *n_local)
{
    int64_t need = n_tokens < 0 ? 0 : seq_blocks_for(kv, n_tokens);
    *n_global = need > s->n_blocks ? need - s->n_blocks : 0;
    *n_local = 0;
    if (!kv_has_local(kv) || from < 0 || from >= n_tokens)
        return;
    for (int64_t i = from / kv->p.block_tokens; i < need; i++)
        *n_local += i >= s->n_blocks || s->local[i] < 0;
}

enum ar_status kv_seq_reserve_at(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens,
                                 int64_t from)
{
    int64_t need, n_g, n_l;
    enum ar_status st;
    if (n_tokens < 0)
        return AR_EINVAL;
    kv_seq_need(kv, s, n_tokens, from, &n_g, &n_l);
    if (n_g > kv_n_free(kv) || n_l > kv_pool_n_free(kv, KV_POOL_LOCAL))
        return AR_EBUSY;
    need = seq_blocks_for(kv, n_tokens);
    if ((st = seq_grow(kv, s, need)) != AR_OK)
        return st;
    while (s->n_blocks < need) {
        int32_t b = kv_block_alloc(kv);
        assert(b >= 0); /* checked against n_free above */
        if (s->local)
            s->local[s->n_blocks] = -1;
        s->blocks[s->n_blocks++] = b;
    }
    if (n_l > 0)
        for (int64_t i = from / kv->p.block_tokens; i < need; i++)
            if (s->local[i] < 0) {
                s->local[i] = kv_pool_alloc(kv, KV_POOL_LOCAL);
                assert(s->local[i] >= 0);
            }
    return AR_OK;
}

enum ar_status kv_seq_reserve(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens)
{
    return kv_seq_reserve_at(kv, s, n_tokens, (int64_t)s->n_blocks * kv->p.block_tokens);
}

void kv_seq_slide(struct kv_cache *kv, struct kv_seq *s, int64_t n_past)
{
    int64_t bt = kv->p.block_tokens, lo = n_past + 1 - kv->p.swa_window;
    if (!kv_has_local(kv))
        return;
    /* block i is behind every later window when its last position i*bt + bt - 1 < lo */
    while (s->n_slid < s->n_blocks && ((int64_t)s->n_slid + 1) * bt <= lo) {
        if (s->local[s->n_slid] >= 0)
            kv_pool_unref(kv, KV_POOL_LOCAL, s->local[s->n_slid]);
        s->local[s->n_slid++] = -1;
    }
}

bool kv_seq_window_held(const struct kv_cache *kv, const struct kv_seq *s, int64_t n_past)
{
    int64_t bt = kv->p.block_tokens, lo = n_past + 1 - kv->p.swa_window;
    if (!kv_has_local(kv) || n_past <= 0)
        return true;
    if (lo < 0)
        lo = 0;
    for (int64_t i = lo / bt; i * bt < n_past; i++)
        if (i >= s->n_blocks || s->local[i] < 0)
            return false;
    return true;
}

int64_t kv_seq_n_local(const struct kv_seq *s)
{
    int64_t n = 0;
    for (int32_t i = 0; s->local && i < s->n_blocks; i++)
        n += s->local[i] >= 0;
    return n;
}

enum ar_status kv_seq_append(struct kv_cache *kv, struct kv_seq *s, int32_t block, int32_t local)
{
    enum ar_status st;
    if (s->n_blocks == INT32_MAX)
        return AR_ENOMEM;
    if ((st = seq_grow(kv, s, (int64_t)s->n_blocks + 1)) != AR_OK)
        return st;
    kv_block_ref(kv, block);
    if (s->local) {
        if (local >= 0)
            kv_pool_ref(kv, KV_POOL_LOCAL, local);
        s->local[s->n_blocks] = local;
    }
    s->blocks[s->n_blocks++] = block;
    return AR_OK;
}

const int32_t *kv_seq_table(const struct kv_cache *kv, const struct kv_seq *s, int layer)
{
    return kv_layer_pool(kv, layer) == KV_POOL_LOCAL ? s->local : s->blocks;
}

void kv_seq_truncate(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens)
{
    int64_t keep;
    if (n_tokens < 0)
        n_tokens = 0;
    keep = seq_blocks_for(kv, n_tokens);
    while (s->n_blocks > keep) {
        s->n_blocks--;
        if (s->local && s->local[s->n_blocks] >= 0)
            kv_pool_unref(kv, KV_POOL_LOCAL, s->local[s->n_blocks]);
        kv_block_unref(kv, s->blocks[s->n_blocks]);
    }
    if (s->n_slid > s->n_blocks)
        s->n_slid = s->n_blocks;
}
