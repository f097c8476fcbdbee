/* kv.h - the paged KV cache: one allocation of fixed-size blocks of token rows, a block
 * table per sequence, reference-counted blocks (so sequences can share a cached prompt
 * prefix). The model writes and reads K/V through block tables; the engine owns admission.
 * Sliding-window models (gemma3) may get a second pool: the "local" pool holds the K/V of
 * the sliding-window layers only, in blocks a sequence releases once every later query's
 * window has passed them, so a long sequence keeps full-length K/V in its global layers
 * only. Without it (n_local_blocks 0, or no sliding layer) there is one pool, as before. */
#ifndef AR_KV_H
#define AR_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "base/types.h"

struct kv_params {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_tokens;  /* tokens per block, e.g. 16 */
    int64_t n_blocks;  /* total blocks (capacity = n_blocks * block_tokens tokens) */
    enum ar_type type; /* AR_TYPE_F16 (default) or AR_TYPE_F32 */
    /* Sliding-window layers: swa_layers[l] != 0 marks layer l (NULL: none); a query at
     * position p of such a layer sees positions (p - swa_window, p]. kv_create copies the
     * flags (kv_params() of the cache points at its copy). n_local_blocks > 0 with at least
     * one sliding layer gives those layers their own pool of that many blocks. */
    int swa_window;
    const uint8_t *swa_layers;
    int64_t n_local_blocks;
};

/* The pools: every block id names a block of one pool. */
enum kv_pool { KV_POOL_GLOBAL = 0, KV_POOL_LOCAL = 1 };

struct kv_cache;

/* Allocates the whole cache once. The caller owns *out (kv_destroy). */
enum ar_status kv_create(const struct kv_params *p, struct kv_cache **out);
void kv_destroy(struct kv_cache *kv);
const struct kv_params *kv_params(const struct kv_cache *kv);
/* Bytes of one token's K (or V) row in one layer: n_kv_heads * head_dim elements. */
size_t kv_row_size(const struct kv_cache *kv);
/* Bytes for the whole cache (for reporting and sizing). */
size_t kv_total_size(const struct kv_params *p);
/* Whether the cache has a local pool; the pool holding layer l's K/V. */
bool kv_has_local(const struct kv_cache *kv);
enum kv_pool kv_layer_pool(const struct kv_cache *kv, int layer);

/* K (or V) rows of one block in one layer: block_tokens rows of kv_row_size bytes,
 * row t holding heads [0, n_kv_heads) of head_dim elements each. block is an id of the
 * layer's pool (kv_layer_pool). */
void *kv_k_block(struct kv_cache *kv, int layer, int32_t block);
void *kv_v_block(struct kv_cache *kv, int layer, int32_t block);

/* Block allocation in pool `pool`. alloc returns -1 when none is free. A new block has
 * refcount 1. The kv_block_* forms are the global pool's. */
int32_t kv_pool_alloc(struct kv_cache *kv, enum kv_pool pool);
void kv_pool_ref(struct kv_cache *kv, enum kv_pool pool, int32_t block);
void kv_pool_unref(struct kv_cache *kv, enum kv_pool pool, int32_t block); /* frees at 0 */
int kv_pool_refcount(const struct kv_cache *kv, enum kv_pool pool, int32_t block);
int64_t kv_pool_n_free(const struct kv_cache *kv, enum kv_pool pool);
int64_t kv_pool_n_blocks(const struct kv_cache *kv, enum kv_pool pool); /* 0: no such pool */
int32_t kv_block_alloc(struct kv_cache *kv);
void kv_block_ref(struct kv_cache *kv, int32_t block);
void kv_block_unref(struct kv_cache *kv, int32_t block); /* frees at 0 */
int kv_block_refcount(const struct kv_cache *kv, int32_t block);
int64_t kv_n_free(const struct kv_cache *kv);

/* A sequence's block table: blocks[i] holds positions [i*block_tokens, (i+1)*block_tokens)
 * of the global pool's layers; with a local pool, local[i] holds the same positions of the
 * sliding-window layers, or is -1 where it was released (behind every window) or not yet
 * taken (see kv_seq_reserve_at). */
struct kv_seq {
    int32_t *blocks; /* owned, (cap) */
    int32_t *local;  /* owned, (cap) with a local pool, else NULL */
    int32_t n_blocks;
    int32_t cap;
    int32_t n_slid; /* local[0, n_slid) are released (kv_seq_slide) */
};

void kv_seq_init(struct kv_seq *s);
/* Releases the sequence's references; the seq is empty afterwards. */
void kv_seq_fini(struct kv_cache *kv, struct kv_seq *s);
/* Ensures blocks cover positions [0, n_tokens), with local blocks for the new ones (a table
 * grown this way holds all its positions). AR_EBUSY when the cache has too few free blocks
 * (nothing is allocated then), AR_ENOMEM when the table cannot grow. */
enum ar_status kv_seq_reserve(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens);
/* As kv_seq_reserve for the global blocks, but takes local blocks only for the table entries
 * from block from / block_tokens on that lack one (from >= n_tokens: none): the rows about to
 * be computed are [from, n_tokens), and the earlier positions of their windows must already
 * be held. */
enum ar_status kv_seq_reserve_at(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens,
                                 int64_t from);
/* Blocks kv_seq_reserve_at would take from each pool. */
void kv_seq_need(const struct kv_cache *kv, const struct kv_seq *s, int64_t n_tokens, int64_t from,
                 int64_t *n_global, int64_t *n_local);
/* Releases the local blocks that no query at position >= n_past can see: block i when
 * (i + 1) * block_tokens <= n_past + 1 - swa_window. No-op without a local pool. */
void kv_seq_slide(struct kv_cache *kv, struct kv_seq *s, int64_t n_past);
/* Whether the next query, at position n_past, finds every position of its window: the local
 * blocks of [n_past + 1 - swa_window, n_past) are held (true without a local pool). */
bool kv_seq_window_held(const struct kv_cache *kv, const struct kv_seq *s, int64_t n_past);
/* Local blocks the sequence holds. */
int64_t kv_seq_n_local(const struct kv_seq *s);
/* Appends one table entry, taking a reference on block and (>= 0) on local. AR_ENOMEM when
 * the table cannot grow. */
enum ar_status kv_seq_append(struct kv_cache *kv, struct kv_seq *s, int32_t block, int32_t local);
/* The table of layer's pool: blocks or local. */
const int32_t *kv_seq_table(const struct kv_cache *kv, const struct kv_seq *s, int layer);
/* Drops blocks beyond n_tokens positions (keeps ceil(n_tokens / block_tokens)). */
void kv_seq_truncate(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens);

/* ---- prefix cache ----------------------------------------------------------------------
 * Reuse of the KV of identical prompt prefixes (kv/prefix.c). Only FULL blocks are cached.
 * An entry is one block of block_tokens token ids at a fixed place in a chain: its key is a
 * 64-bit hash of (parent entry's key, the block's token ids), and the entry also stores its
 * parent entry's handle and the exact token ids, both compared on lookup, so a hash
 * collision can never hand out the KV of a different prefix. By induction, a matched chain
 * of n entries holds exactly the tokens [0, n * block_tokens) of the prompt.
 * The cache holds one reference on each cached block; a block referenced only by the cache
 * is evictable, least recently used first, children before parents.
 * Model identity: a cache belongs to one kv_cache used by one model, so the key is only the
 * token ids (a cache must never be shared between models).
 * Handles: 0 is the root (no parent); a handle names an entry and becomes stale (never
 * matches) once the entry is evicted. Not thread-safe: one thread at a time.
 * Local pool: an entry may also hold the block's local-pool block (kv_prefix_insert_local),
 * and loses it first when local blocks run short (kv_prefix_evict_local). A match may only
 * END where the next query's window is complete (kv_seq_window_held): lookup shortens it to
 * the longest such end, since the local K/V of a released block cannot be had back. */
struct kv_prefix;

/* kv is borrowed and must outlive the cache. The caller owns *out (kv_prefix_destroy). */
enum ar_status kv_prefix_create(struct kv_cache *kv, struct kv_prefix **out);
/* Drops every entry and its block reference. */
void kv_prefix_destroy(struct kv_prefix *pc);

/* The chained key of one block: parent_key (0 for the first block) and its tokens. */
uint64_t kv_prefix_hash(uint64_t parent_key, const int32_t *tokens, int n);

/* Walks the full blocks of tokens[0, n_tokens) from the start while they are cached and
 * appends each matching block (and its local block, or -1) to s (taking references), which
 * must be empty; the match then ends at the longest end whose window is held (see above).
 * Returns the number of tokens matched (a multiple of block_tokens) and, in *last, the
 * handle of the last matched entry (0 when none). Matched entries become most recently
 * used. */
int64_t kv_prefix_lookup(struct kv_prefix *pc, const int32_t *tokens, int64_t n_tokens,
                         struct kv_seq *s, uint64_t *last);

/* Registers a computed full block: tokens (block_tokens ids) following the entry `parent`
 * (0: first block). *block is the caller's block holding their K/V. If an equal entry exists
 * already, *block is replaced by the cached block (a reference is taken on it and the
 * caller's reference on the old one released: same tokens, same positions, same KV), so a
 * sequence always holds the blocks of all ancestors of the entries it holds. Otherwise a new
 * entry takes a reference on *block. *handle receives the entry's handle.
 * AR_EINVAL when parent is stale (evicted): nothing is registered then. */
enum ar_status kv_prefix_insert(struct kv_prefix *pc, uint64_t parent, const int32_t *tokens,
                                int32_t *block, uint64_t *handle);
/* kv_prefix_insert with the block's local-pool block too (local may be NULL or point at -1:
 * none). An entry without one takes a reference on *local; an entry with one replaces
 * *local by it as for *block. */
enum ar_status kv_prefix_insert_local(struct kv_prefix *pc, uint64_t parent,
                                      const int32_t *tokens, int32_t *block, int32_t *local,
                                      uint64_t *handle);

/* Evicts up to n blocks held only by the cache (LRU, leaves first); returns how many were
 * freed. */
int64_t kv_prefix_evict(struct kv_prefix *pc, int64_t n);
/* Releases up to n local blocks held only by the cache (LRU; the entries stay, without
 * their local K/V); returns how many were freed. */
int64_t kv_prefix_evict_local(struct kv_prefix *pc, int64_t n);
/* Blocks held only by the cache (all evictable); entries in the cache. */
int64_t kv_prefix_n_evictable(const struct kv_prefix *pc);
int64_t kv_prefix_n_entries(const struct kv_prefix *pc);

#endif
