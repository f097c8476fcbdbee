/* prefix.c - the prefix cache over the paged KV cache: full prompt blocks keyed by a chained
 * 64-bit hash, stored with their exact tokens and parent entry (compared on every lookup),
 * holding one block reference each, evicted least recently used first (leaves only).
 * Entries live in a fixed table of n_blocks slots (each entry holds a distinct block, so the
 * table never fills); a hash table of slot chains finds them. With a local pool an entry may
 * also hold the block's local-pool block, given up before the entry itself. */
#include "kv.h"

#include <assert.h>

#include "base/hash.h"

struct pc_entry {
    uint64_t key;      /* kv_prefix_hash(parent's key, tokens) */
    uint64_t parent;   /* parent entry's handle, 0: first block of a prompt */
    uint64_t last_use; /* pc->tick at the last lookup or insert */
    int32_t block;     /* the cached block; -1: slot free */
    int32_t local;     /* its local-pool block; -1: none (or released) */
    uint32_t gen;      /* bumped when the slot is freed: part of the handle */
    int32_t n_children;
    int32_t next; /* next slot in the same hash bucket, -1: end */
};

struct kv_prefix {
    struct kv_cache *kv; /* borrowed */
    int bt;              /* tokens per block */
    int64_t cap;         /* slots = kv blocks */
    struct pc_entry *e;  /* owned, (cap) */
    int32_t *tokens;     /* owned, (cap, bt): slot i's tokens */
    int32_t *buckets;    /* owned, (n_buckets): first slot of each chain, -1: empty */
    uint64_t mask;       /* n_buckets - 1 (a power of two) */
    int32_t *free_slots; /* owned, (cap): stack */
    int64_t n_free;
    uint64_t tick;
};

/* ---- hashing --------------------------------------------------------------------------- */

/* FNV-1a over the parent key and the token ids (little-endian bytes), then a 64-bit
 * finalizer so that nearby inputs spread over all buckets. */
static uint64_t prefix_hash_fnv(uint64_t parent_key, const int32_t *tokens, int n)
{
    uint8_t b[8];
    uint64_t h;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(parent_key >> (8 * i));
    h = ar_fnv1a64(AR_FNV64_BASIS, b, 8);
    for (int j = 0; j < n; j++) {
        uint32_t t = (uint32_t)tokens[j];
        for (int i = 0; i < 4; i++)
            b[i] = (uint8_t)(t >> (8 * i));
        h = ar_fnv1a64(h, b, 4);
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* Tests may compile this file with their own (weak) hash to force collisions. */
#ifndef KV_PREFIX_HASH
#define KV_PREFIX_HASH prefix_hash_fnv
#endif

uint64_t kv_prefix_hash(uint64_t parent_key, const int32_t *tokens, int n)
{
    return KV_PREFIX_HASH(parent_key, tokens, n);
}

/* ---- lifetime -------------------------------------------------------------------------- */

enum ar_status kv_prefix_create(struct kv_cache *kv, struct kv_prefix **out)
{
    const struct kv_params *kp;
    struct kv_prefix *pc;
    uint64_t nb = 1;
    if (!kv || !out)
        return AR_EINVAL;
    kp = kv_params(kv);
    pc = ar_calloc(1, sizeof(*pc));
    if (!pc)
        return AR_ENOMEM;
    pc->kv = kv;
    pc->bt = kp->block_tokens;
    pc->cap = kp->n_blocks;
    while (nb < (uint64_t)pc->cap * 2)
        nb *= 2;
    pc->mask = nb - 1;
    pc->e = ar_calloc((size_t)pc->cap, sizeof(*pc->e));
    for (int64_t i = 0; pc->e && i < pc->cap; i++)
        pc->e[i].block = pc->e[i].local = -1; /* before any failure path: destroy reads it */
    pc->tokens = ar_malloc((size_t)pc->cap * (size_t)pc->bt * sizeof(*pc->tokens));
    pc->buckets = ar_malloc((size_t)nb * sizeof(*pc->buckets));
    pc->free_slots = ar_malloc((size_t)pc->cap * sizeof(*pc->free_slots));
    if (!pc->e || !pc->tokens || !pc->buckets || !pc->free_slots) {
        kv_prefix_destroy(pc);
        return AR_ENOMEM;
    }
    for (uint64_t i = 0; i < nb; i++)
        pc->buckets[i] = -1;
    for (int64_t i = 0; i < pc->cap; i++) {
        pc->e[i].next = -1;
        pc->free_slots[i] = (int32_t)(pc->cap - 1 - i);
    }
    pc->n_free = pc->cap;
    *out = pc;
    return AR_OK;
}

void kv_prefix_destroy(struct kv_prefix *pc)
{
    if (!pc)
        return;
    if (pc->e) {
        for (int64_t i = 0; i < pc->cap; i++)
            if (pc->e[i].block >= 0) {
                kv_block_unref(pc->kv, pc->e[i].block);
                if (pc->e[i].local >= 0)
                    kv_pool_unref(pc->kv, KV_POOL_LOCAL, pc->e[i].local);
            }
    }
    ar_free(pc->e);
    ar_free(pc->tokens);
    ar_free(pc->buckets);
    ar_free(pc->free_slots);
    ar_free(pc);
}

/* ---- entries --------------------------------------------------------------------------- */

static uint64_t slot_handle(const struct kv_prefix *pc, int32_t slot)
{
    return ((uint64_t)pc->e[slot].gen << 32) | (uint64_t)(slot + 1);
}

/* Slot of a live handle; -1 for the root (0); -2 when stale or invalid. */
static int32_t handle_slot(const struct kv_prefix *pc, uint64_t h)
{
    int64_t slot;
    if (h == 0)
        return -1;
    slot = (int64_t)(h & 0xffffffffu) - 1;
    if (slot < 0 || slot >= pc->cap || pc->e[slot].block < 0 ||
        pc->e[slot].gen != (uint32_t)(h >> 32))
        return -2;
    return (int32_t)slot;
}

/* The entry following parent (handle) whose tokens equal tokens[0, bt), or -1. The key only
 * picks the bucket and rejects quickly; parent identity and tokens decide. */
static int32_t find_entry(const struct kv_prefix *pc, uint64_t key, uint64_t parent,
                          const int32_t *tokens)
{
    for (int32_t i = pc->buckets[key & pc->mask]; i >= 0; i = pc->e[i].next) {
        const struct pc_entry *en = &pc->e[i];
        if (en->key == key && en->parent == parent &&
            memcmp(pc->tokens + (size_t)i * (size_t)pc->bt, tokens,
                   (size_t)pc->bt * sizeof(*tokens)) == 0)
            return i;
    }
    return -1;
}

int64_t kv_prefix_lookup(struct kv_prefix *pc, const int32_t *tokens, int64_t n_tokens,
                         struct kv_seq *s, uint64_t *last)
{
    uint64_t parent = 0, parent_key = 0, best_handle = 0;
    int64_t n = 0, best = 0, window = kv_params(pc->kv)->swa_window;
    int64_t missing = -1; /* the last block index walked without its local block */
    bool local = kv_has_local(pc->kv);
    assert(s->n_blocks == 0);
    while (n + pc->bt <= n_tokens) {
        uint64_t key = kv_prefix_hash(parent_key, tokens + n, pc->bt);
        int32_t slot = find_entry(pc, key, parent, tokens + n);
        int64_t lo;
        if (slot < 0)
            break;
        /* the table can hold every block of the cache; growth only fails on ENOMEM, in which
         * case the match simply stops here */
        if (kv_seq_append(pc->kv, s, pc->e[slot].block, pc->e[slot].local) != AR_OK)
            break;
        pc->e[slot].last_use = ++pc->tick;
        parent = slot_handle(pc, slot);
        parent_key = key;
        if (local && pc->e[slot].local < 0)
            missing = n / pc->bt;
        n += pc->bt;
        /* an end is usable when the next query's window [n + 1 - window, n) is all held */
        lo = AR_MAX(0, n + 1 - window) / pc->bt;
        if (!local || missing < lo) {
            best = n;
            best_handle = parent;
        }
    }
    kv_seq_truncate(pc->kv, s, best);
    if (last)
        *last = best_handle;
    return best;
}

enum ar_status kv_prefix_insert(struct kv_prefix *pc, uint64_t parent, const int32_t *tokens,
                                int32_t *block, uint64_t *handle)
{
    return kv_prefix_insert_local(pc, parent, tokens, block, NULL, handle);
}

/* Gives entry en the caller's local block, or the caller the entry's (see insert). */
static void share_local(struct kv_prefix *pc, struct pc_entry *en, int32_t *local)
{
    if (!local || *local < 0 || en->local == *local)
        return;
    if (en->local < 0) {
        kv_pool_ref(pc->kv, KV_POOL_LOCAL, *local);
        en->local = *local;
        return;
    }
    kv_pool_ref(pc->kv, KV_POOL_LOCAL, en->local);
    kv_pool_unref(pc->kv, KV_POOL_LOCAL, *local);
    *local = en->local;
}

enum ar_status kv_prefix_insert_local(struct kv_prefix *pc, uint64_t parent,
                                      const int32_t *tokens, int32_t *block, int32_t *local,
                                      uint64_t *handle)
{
    int32_t ps = handle_slot(pc, parent), slot;
    uint64_t key;
    struct pc_entry *en;
    if (ps == -2)
        return AR_EINVAL;
    key = kv_prefix_hash(ps >= 0 ? pc->e[ps].key : 0, tokens, pc->bt);
    slot = find_entry(pc, key, parent, tokens);
    if (slot >= 0) {
        en = &pc->e[slot];
        if (en->block != *block) {
            kv_block_ref(pc->kv, en->block);
            kv_block_unref(pc->kv, *block);
            *block = en->block;
        }
        share_local(pc, en, local);
        en->last_use = ++pc->tick;
        *handle = slot_handle(pc, slot);
        return AR_OK;
    }
    if (pc->n_free == 0)
        return AR_EBUSY; /* cannot happen: every entry holds a distinct block */
    slot = pc->free_slots[--pc->n_free];
    en = &pc->e[slot];
    en->key = key;
    en->parent = parent;
    en->last_use = ++pc->tick;
    en->block = *block;
    en->local = -1;
    share_local(pc, en, local);
    en->n_children = 0;
    memcpy(pc->tokens + (size_t)slot * (size_t)pc->bt, tokens, (size_t)pc->bt * sizeof(*tokens));
    en->next = pc->buckets[key & pc->mask];
    pc->buckets[key & pc->mask] = slot;
    kv_block_ref(pc->kv, *block);
    if (ps >= 0)
        pc->e[ps].n_children++;
    *handle = slot_handle(pc, slot);
    return AR_OK;
}

/* ---- eviction -------------------------------------------------------------------------- */

static void remove_entry(struct kv_prefix *pc, int32_t slot)
{
    struct pc_entry *en = &pc->e[slot];
    int32_t *link = &pc->buckets[en->key & pc->mask];
    int32_t ps;
    while (*link != slot)
        link = &pc->e[*link].next;
    *link = en->next;
    ps = handle_slot(pc, en->parent);
    if (ps >= 0)
        pc->e[ps].n_children--;
    kv_block_unref(pc->kv, en->block);
    if (en->local >= 0)
        kv_pool_unref(pc->kv, KV_POOL_LOCAL, en->local);
    en->block = -1;
    en->local = -1;
    en->next = -1;
    en->gen++;
    pc->free_slots[pc->n_free++] = slot;
}

int64_t kv_prefix_evict(struct kv_prefix *pc, int64_t n)
{
    int64_t done = 0;
    while (done < n) {
        int32_t best = -1;
        for (int64_t i = 0; i < pc->cap; i++) {
            const struct pc_entry *en = &pc->e[i];
            if (en->block < 0 || en->n_children > 0 || kv_block_refcount(pc->kv, en->block) != 1)
                continue;
            if (best < 0 || en->last_use < pc->e[best].last_use)
                best = (int32_t)i;
        }
        if (best < 0)
            break;
        remove_entry(pc, best);
        done++;
    }
    return done;
}

int64_t kv_prefix_evict_local(struct kv_prefix *pc, int64_t n)
{
    int64_t done = 0;
    if (!kv_has_local(pc->kv))
        return 0;
    while (done < n) {
        int32_t best = -1;
        for (int64_t i = 0; i < pc->cap; i++) {
            const struct pc_entry *en = &pc->e[i];
            if (en->block < 0 || en->local < 0 ||
                kv_pool_refcount(pc->kv, KV_POOL_LOCAL, en->local) != 1)
                continue;
            if (best < 0 || en->last_use < pc->e[best].last_use)
                best = (int32_t)i;
        }
        if (best < 0)
            break;
        kv_pool_unref(pc->kv, KV_POOL_LOCAL, pc->e[best].local);
        pc->e[best].local = -1;
        done++;
    }
    return done;
}

int64_t kv_prefix_n_evictable(const struct kv_prefix *pc)
{
    int64_t n = 0;
    for (int64_t i = 0; i < pc->cap; i++)
        if (pc->e[i].block >= 0 && kv_block_refcount(pc->kv, pc->e[i].block) == 1)
            n++;
    return n;
}

int64_t kv_prefix_n_entries(const struct kv_prefix *pc)
{
    return pc->cap - pc->n_free;
}
