/* kv.h - the paged KV cache: one allocation of fixed-size blocks of token rows, a block
 * table per sequence, reference-counted blocks (so sequences can share a cached prompt
 * prefix). The model writes and reads K/V through block tables; the engine owns admission. */
#ifndef AR_KV_H
#define AR_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../base/types.h"

struct kv_params {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_tokens;  /* tokens per block, e.g. 16 */
    int64_t n_blocks;  /* total blocks (capacity = n_blocks * block_tokens tokens) */
    enum ar_type type; /* AR_TYPE_F16 (default) or AR_TYPE_F32 */
};

struct kv_cache;

/* Allocates the whole cache once. The caller owns *out (kv_destroy). */
enum ar_status kv_create(const struct kv_params *p, struct kv_cache **out);
void kv_destroy(struct kv_cache *kv);
const struct kv_params *kv_params(const struct kv_cache *kv);
/* Bytes of one token's K (or V) row in one layer: n_kv_heads * head_dim elements. */
size_t kv_row_size(const struct kv_cache *kv);
/* Bytes for the whole cache (for reporting and sizing). */
size_t kv_total_size(const struct kv_params *p);

/* K (or V) rows of one block in one layer: block_tokens rows of kv_row_size bytes,
 * row t holding heads [0, n_kv_heads) of head_dim elements each. */
void *kv_k_block(struct kv_cache *kv, int layer, int32_t block);
void *kv_v_block(struct kv_cache *kv, int layer, int32_t block);

/* Block allocation. alloc returns -1 when none is free. A new block has refcount 1. */
int32_t kv_block_alloc(struct kv_cache *kv);
void kv_block_ref(struct kv_cache *kv, int32_t block);
void kv_block_unref(struct kv_cache *kv, int32_t block); /* frees at 0 */
int kv_block_refcount(const struct kv_cache *kv, int32_t block);
int64_t kv_n_free(const struct kv_cache *kv);

/* A sequence's block table: blocks[i] holds positions [i*block_tokens, (i+1)*block_tokens). */
struct kv_seq {
    int32_t *blocks; /* owned, (cap) */
    int32_t n_blocks;
    int32_t cap;
};

void kv_seq_init(struct kv_seq *s);
/* Releases the sequence's references; the seq is empty afterwards. */
void kv_seq_fini(struct kv_cache *kv, struct kv_seq *s);
/* Ensures blocks cover positions [0, n_tokens). AR_EBUSY when the cache has too few free
 * blocks (nothing is allocated then), AR_ENOMEM when the table cannot grow. */
enum ar_status kv_seq_reserve(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens);
/* Drops blocks beyond n_tokens positions (keeps ceil(n_tokens / block_tokens)). */
void kv_seq_truncate(struct kv_cache *kv, struct kv_seq *s, int64_t n_tokens);

#endif
