/* kv_test.c - the paged KV cache: block allocation until full, reference counts, block
 * tables (reserve, truncate, fini), geometry, and out-of-memory handling; the local pool of
 * sliding-window layers (own storage and counts, release behind the window, no leaks). */
#include "harness/harness.h"

#include "base/base.h"
#include "kv/kv.h"

static struct kv_params small_params(int64_t n_blocks, enum ar_type type)
{
    struct kv_params p = {
        .n_layers = 2, .n_kv_heads = 2, .head_dim = 8,
        .block_tokens = 4, .n_blocks = n_blocks, .type = type,
    };
    return p;
}

static void alloc_hands_out_distinct_blocks_until_full_then_minus_one(void **state)
{
    struct kv_params p = small_params(5, AR_TYPE_F16);
    struct kv_cache *kv;
    int seen[5] = {0};
    (void)state;
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    assert_int_equal(kv_n_free(kv), 5);
    for (int i = 0; i < 5; i++) {
        int32_t b = kv_block_alloc(kv);
        assert_true(b >= 0 && b < 5);
        assert_int_equal(seen[b], 0);
        seen[b] = 1;
        assert_int_equal(kv_block_refcount(kv, b), 1);
        assert_int_equal(kv_n_free(kv), 4 - i);
    }
    assert_int_equal(kv_block_alloc(kv), -1);
    assert_int_equal(kv_block_alloc(kv), -1);
    kv_block_unref(kv, 3);
    assert_int_equal(kv_n_free(kv), 1);
    assert_int_equal(kv_block_alloc(kv), 3);
    assert_int_equal(kv_block_alloc(kv), -1);
    kv_destroy(kv);
}

static void block_is_freed_only_when_last_reference_drops(void **state)
{
    struct kv_params p = small_params(3, AR_TYPE_F32);
    struct kv_cache *kv;
    int32_t b;
    (void)state;
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    b = kv_block_alloc(kv);
    kv_block_ref(kv, b);
    kv_block_ref(kv, b);
    assert_int_equal(kv_block_refcount(kv, b), 3);
    assert_int_equal(kv_n_free(kv), 2);
    kv_block_unref(kv, b);
    kv_block_unref(kv, b);
    assert_int_equal(kv_block_refcount(kv, b), 1);
    assert_int_equal(kv_n_free(kv), 2);
    kv_block_unref(kv, b);
    assert_int_equal(kv_block_refcount(kv, b), 0);
    assert_int_equal(kv_n_free(kv), 3);
    kv_destroy(kv);
}

static void geometry_follows_params(void **state)
{
    struct kv_params p = small_params(6, AR_TYPE_F16);
    struct kv_cache *kv;
    uint8_t *base, *k, *v;
    (void)state;
    /* 2 layers x (K, V) x 6 blocks x 4 tokens x 2 heads x 8 dims x 2 bytes */
    assert_int_equal(kv_total_size(&p), 2 * 2 * 6 * 4 * 2 * 8 * 2);
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    assert_int_equal(kv_row_size(kv), 2 * 8 * 2);
    assert_int_equal(kv_params(kv)->n_blocks, 6);
    /* Every (layer, K/V, block) region is distinct, block_tokens rows long, and inside
     * one allocation: write a distinct byte pattern to each and read them all back. */
    size_t bsz = 4 * kv_row_size(kv);
    for (int l = 0; l < 2; l++)
        for (int32_t b = 0; b < 6; b++) {
            memset(kv_k_block(kv, l, b), 1 + l * 12 + b * 2, bsz);
            memset(kv_v_block(kv, l, b), 2 + l * 12 + b * 2, bsz);
        }
    for (int l = 0; l < 2; l++)
        for (int32_t b = 0; b < 6; b++) {
            k = kv_k_block(kv, l, b);
            v = kv_v_block(kv, l, b);
            for (size_t i = 0; i < bsz; i++) {
                assert_int_equal(k[i], 1 + l * 12 + b * 2);
                assert_int_equal(v[i], 2 + l * 12 + b * 2);
            }
        }
    base = kv_k_block(kv, 0, 0);
    assert_true((uintptr_t)base % 64 == 0);
    kv_destroy(kv);

    p.type = AR_TYPE_F32;
    assert_int_equal(kv_total_size(&p), 2 * 2 * 6 * 4 * 2 * 8 * 4);
}

static void create_rejects_bad_params(void **state)
{
    struct kv_cache *kv = NULL;
    struct kv_params p = small_params(4, AR_TYPE_Q8_0);
    (void)state;
    assert_int_equal(kv_create(&p, &kv), AR_EINVAL);
    p = small_params(0, AR_TYPE_F16);
    assert_int_equal(kv_create(&p, &kv), AR_EINVAL);
    p = small_params(4, AR_TYPE_F16);
    p.block_tokens = 0;
    assert_int_equal(kv_create(&p, &kv), AR_EINVAL);
    p = small_params((int64_t)1 << 40, AR_TYPE_F16); /* more block ids than int32 */
    assert_int_equal(kv_create(&p, &kv), AR_EINVAL);
    assert_int_equal(kv_total_size(&p), 0);
    assert_null(kv);
    kv_destroy(NULL);
}

static void reserve_covers_positions_and_truncate_releases_tail(void **state)
{
    struct kv_params p = small_params(8, AR_TYPE_F16);
    struct kv_cache *kv;
    struct kv_seq s;
    (void)state;
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    kv_seq_init(&s);
    assert_int_equal(s.n_blocks, 0);
    assert_int_equal(kv_seq_reserve(kv, &s, 0), AR_OK);
    assert_int_equal(s.n_blocks, 0);
    assert_int_equal(kv_seq_reserve(kv, &s, 1), AR_OK);
    assert_int_equal(s.n_blocks, 1);
    assert_int_equal(kv_seq_reserve(kv, &s, 4), AR_OK); /* still one block of 4 tokens */
    assert_int_equal(s.n_blocks, 1);
    assert_int_equal(kv_seq_reserve(kv, &s, 5), AR_OK);
    assert_int_equal(s.n_blocks, 2);
    assert_int_equal(kv_seq_reserve(kv, &s, 30), AR_OK); /* ceil(30 / 4) = 8 */
    assert_int_equal(s.n_blocks, 8);
    assert_true(s.cap >= 8);
    assert_int_equal(kv_n_free(kv), 0);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(kv_block_refcount(kv, s.blocks[i]), 1);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(s.blocks[i], s.blocks[j]);
    }
    /* reserving less than held changes nothing */
    assert_int_equal(kv_seq_reserve(kv, &s, 3), AR_OK);
    assert_int_equal(s.n_blocks, 8);

    int32_t first = s.blocks[0], second = s.blocks[1];
    kv_seq_truncate(kv, &s, 5); /* keeps ceil(5 / 4) = 2 */
    assert_int_equal(s.n_blocks, 2);
    assert_int_equal(s.blocks[0], first);
    assert_int_equal(s.blocks[1], second);
    assert_int_equal(kv_n_free(kv), 6);
    kv_seq_truncate(kv, &s, 8); /* exactly two blocks: nothing to drop */
    assert_int_equal(s.n_blocks, 2);
    kv_seq_truncate(kv, &s, 0);
    assert_int_equal(s.n_blocks, 0);
    assert_int_equal(kv_n_free(kv), 8);
    assert_int_equal(kv_seq_reserve(kv, &s, -1), AR_EINVAL);
    kv_seq_fini(kv, &s);
    kv_destroy(kv);
}

static void reserve_is_busy_and_allocates_nothing_when_too_few_blocks(void **state)
{
    struct kv_params p = small_params(4, AR_TYPE_F16);
    struct kv_cache *kv;
    struct kv_seq a, b;
    (void)state;
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    kv_seq_init(&a);
    kv_seq_init(&b);
    assert_int_equal(kv_seq_reserve(kv, &a, 9), AR_OK); /* 3 blocks */
    assert_int_equal(kv_n_free(kv), 1);
    assert_int_equal(kv_seq_reserve(kv, &b, 5), AR_EBUSY); /* needs 2 */
    assert_int_equal(b.n_blocks, 0);
    assert_int_equal(kv_n_free(kv), 1);
    assert_int_equal(kv_seq_reserve(kv, &a, 17), AR_EBUSY); /* needs 2 more */
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(kv_n_free(kv), 1);
    assert_int_equal(kv_seq_reserve(kv, &b, 4), AR_OK);
    assert_int_equal(kv_n_free(kv), 0);
    kv_seq_fini(kv, &a);
    assert_int_equal(kv_n_free(kv), 3);
    assert_int_equal(a.n_blocks, 0);
    assert_null(a.blocks);
    kv_seq_fini(kv, &b);
    assert_int_equal(kv_n_free(kv), 4);
    kv_destroy(kv);
}

static void shared_prefix_blocks_survive_until_every_sequence_is_done(void **state)
{
    struct kv_params p = small_params(4, AR_TYPE_F16);
    struct kv_cache *kv;
    struct kv_seq a, b;
    (void)state;
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    kv_seq_init(&a);
    kv_seq_init(&b);
    assert_int_equal(kv_seq_reserve(kv, &a, 8), AR_OK);
    /* b shares a's first block (a cached prefix), then grows on its own */
    b.blocks = ar_malloc(sizeof(int32_t));
    assert_non_null(b.blocks);
    b.cap = 1;
    b.blocks[b.n_blocks++] = a.blocks[0];
    kv_block_ref(kv, a.blocks[0]);
    assert_int_equal(kv_seq_reserve(kv, &b, 8), AR_OK);
    assert_int_equal(kv_block_refcount(kv, a.blocks[0]), 2);
    assert_int_equal(kv_n_free(kv), 1);
    int32_t shared = a.blocks[0];
    kv_seq_fini(kv, &a);
    assert_int_equal(kv_block_refcount(kv, shared), 1);
    assert_int_equal(kv_n_free(kv), 2);
    kv_seq_fini(kv, &b);
    assert_int_equal(kv_n_free(kv), 4);
    kv_destroy(kv);
}

static void allocation_failures_return_enomem_and_leak_nothing(void **state)
{
    struct kv_params p = small_params(4, AR_TYPE_F16);
    (void)state;
    for (uint64_t n = 1; n < 10; n++) {
        struct kv_cache *kv = NULL;
        ar_alloc_fail_after(n);
        enum ar_status st = kv_create(&p, &kv);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            struct kv_seq s;
            kv_seq_init(&s);
            ar_alloc_fail_after(1);
            assert_int_equal(kv_seq_reserve(kv, &s, 5), AR_ENOMEM);
            ar_alloc_fail_after(0);
            assert_int_equal(s.n_blocks, 0);
            assert_int_equal(kv_n_free(kv), 4);
            kv_seq_fini(kv, &s);
            kv_destroy(kv);
            break;
        }
        assert_int_equal(st, AR_ENOMEM);
        assert_null(kv);
    }
}

/* 3 layers, 0 and 2 sliding (window 8), blocks of 4 tokens; n_local local blocks. */
static const uint8_t swa_010[3] = {1, 0, 1};
static struct kv_params swa_params(int64_t n_blocks, int64_t n_local)
{
    struct kv_params p = {
        .n_layers = 3, .n_kv_heads = 2, .head_dim = 8, .block_tokens = 4,
        .n_blocks = n_blocks, .type = AR_TYPE_F32, .swa_window = 8,
        .swa_layers = swa_010, .n_local_blocks = n_local,
    };
    return p;
}

static void local_pool_has_its_own_storage_free_list_and_refcounts(void **state)
{
    struct kv_params p = swa_params(6, 3);
    struct kv_cache *kv;
    size_t bs = 4 * 2 * 8 * sizeof(float); /* one block of one layer's K (or V) */
    int32_t lb[3];
    (void)state;
    /* the global pool holds layer 1 for 6 blocks, the local one layers 0 and 2 for 3 */
    assert_int_equal(kv_total_size(&p), (6 * 1 + 3 * 2) * 2 * bs);
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    assert_true(kv_has_local(kv));
    assert_int_equal(kv_layer_pool(kv, 0), KV_POOL_LOCAL);
    assert_int_equal(kv_layer_pool(kv, 1), KV_POOL_GLOBAL);
    assert_int_equal(kv_layer_pool(kv, 2), KV_POOL_LOCAL);
    assert_int_equal(kv_pool_n_blocks(kv, KV_POOL_GLOBAL), 6);
    assert_int_equal(kv_pool_n_blocks(kv, KV_POOL_LOCAL), 3);

    /* every (layer, K/V, block) is its own memory: fill each with its own byte, read back */
    for (int pass = 0; pass < 2; pass++)
        for (int l = 0; l < 3; l++)
            for (int32_t b = 0; b < (l == 1 ? 6 : 3); b++)
                for (int w = 0; w < 2; w++) {
                    uint8_t *d = w ? kv_v_block(kv, l, b) : kv_k_block(kv, l, b);
                    uint8_t v = (uint8_t)(l * 32 + b * 2 + w + 1);
                    if (pass == 0)
                        memset(d, v, bs);
                    for (size_t i = 0; pass == 1 && i < bs; i++)
                        assert_int_equal(d[i], v);
                }

    /* the pools count apart: the local one runs dry while the global one is untouched */
    for (int i = 0; i < 3; i++)
        assert_true((lb[i] = kv_pool_alloc(kv, KV_POOL_LOCAL)) >= 0);
    assert_int_equal(kv_pool_alloc(kv, KV_POOL_LOCAL), -1);
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 0);
    assert_int_equal(kv_n_free(kv), 6);
    kv_pool_ref(kv, KV_POOL_LOCAL, lb[0]);
    assert_int_equal(kv_pool_refcount(kv, KV_POOL_LOCAL, lb[0]), 2);
    assert_int_equal(kv_block_refcount(kv, lb[0]), 0);
    kv_pool_unref(kv, KV_POOL_LOCAL, lb[0]);
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 0);
    for (int i = 0; i < 3; i++)
        kv_pool_unref(kv, KV_POOL_LOCAL, lb[i]);
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 3);
    kv_destroy(kv);

    /* no local pool without local blocks, sliding layers or a window: one pool as before */
    for (int c = 0; c < 3; c++) {
        p = swa_params(6, c == 0 ? 0 : 3);
        if (c == 1)
            p.swa_layers = NULL;
        if (c == 2)
            p.swa_window = 0;
        assert_int_equal(kv_total_size(&p), 3 * 6 * 2 * bs);
        assert_int_equal(kv_create(&p, &kv), AR_OK);
        assert_false(kv_has_local(kv));
        assert_int_equal(kv_layer_pool(kv, 0), KV_POOL_GLOBAL);
        assert_int_equal(kv_pool_n_blocks(kv, KV_POOL_LOCAL), 0);
        assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 0);
        kv_destroy(kv);
    }
    p = swa_params(6, -1);
    assert_int_equal(kv_create(&p, &kv), AR_EINVAL);
}

static void sliding_releases_local_blocks_behind_every_window(void **state)
{
    struct kv_params p = swa_params(16, 4);
    struct kv_cache *kv;
    struct kv_seq s, t;
    (void)state;
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    kv_seq_init(&s);
    kv_seq_init(&t);
    /* decode 40 positions one at a time: block i is kept while some later query's window
     * (p - 8, p] reaches it, i.e. while (i + 1) * 4 > n + 1 - 8 after n positions */
    for (int64_t n = 0; n < 40; n++) {
        assert_true(kv_seq_window_held(kv, &s, n));
        assert_int_equal(kv_seq_reserve_at(kv, &s, n + 1, n), AR_OK);
        assert_true(s.local[n / 4] >= 0);
        assert_true(kv_seq_n_local(&s) <= 4); /* ceil(8 / 4) + 1, + the block opened */
        kv_seq_slide(kv, &s, n + 1);
        assert_int_equal(s.n_blocks, n / 4 + 1);
        for (int32_t i = 0; i < s.n_blocks; i++) {
            assert_true(s.blocks[i] >= 0);
            assert_int_equal(s.local[i] >= 0, (i + 1) * 4 > n + 1 + 1 - 8);
        }
        assert_true(kv_seq_n_local(&s) <= 3);
        assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 4 - kv_seq_n_local(&s));
        assert_int_equal(kv_n_free(kv), 16 - s.n_blocks);
    }
    /* a released block cannot be had back: the window of position 8 is not held */
    assert_false(kv_seq_window_held(kv, &s, 8));

    /* a second table sharing s's entries holds their blocks after s is gone */
    for (int32_t i = 0; i < s.n_blocks; i++)
        assert_int_equal(kv_seq_append(kv, &t, s.blocks[i], s.local[i]), AR_OK);
    assert_int_equal(kv_pool_refcount(kv, KV_POOL_LOCAL, s.local[s.n_blocks - 1]), 2);
    kv_seq_fini(kv, &s);
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 4 - kv_seq_n_local(&t));
    kv_seq_truncate(kv, &t, 36); /* drops the last block, local and global */
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 4 - kv_seq_n_local(&t));
    kv_seq_fini(kv, &t);

    /* taking local blocks for every position of 20 needs 5 of 4: busy, nothing taken */
    assert_int_equal(kv_seq_reserve(kv, &s, 20), AR_EBUSY);
    assert_int_equal(s.n_blocks, 0);
    assert_int_equal(kv_seq_reserve(kv, &s, 16), AR_OK);
    assert_int_equal(kv_seq_n_local(&s), 4);
    /* global blocks only (from beyond the end), then the rows [16, 20) */
    assert_int_equal(kv_seq_reserve_at(kv, &s, 24, INT64_MAX), AR_OK);
    assert_int_equal(kv_seq_n_local(&s), 4);
    assert_int_equal(kv_seq_reserve_at(kv, &s, 20, 16), AR_EBUSY);
    kv_seq_slide(kv, &s, 16);
    assert_int_equal(kv_seq_reserve_at(kv, &s, 20, 16), AR_OK);
    assert_int_equal(kv_seq_n_local(&s), 3);
    kv_seq_fini(kv, &s);
    assert_int_equal(kv_n_free(kv), 16);
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 4);
    kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(alloc_hands_out_distinct_blocks_until_full_then_minus_one),
        cmocka_unit_test(block_is_freed_only_when_last_reference_drops),
        cmocka_unit_test(geometry_follows_params),
        cmocka_unit_test(create_rejects_bad_params),
        cmocka_unit_test(reserve_covers_positions_and_truncate_releases_tail),
        cmocka_unit_test(reserve_is_busy_and_allocates_nothing_when_too_few_blocks),
        cmocka_unit_test(shared_prefix_blocks_survive_until_every_sequence_is_done),
        cmocka_unit_test(allocation_failures_return_enomem_and_leak_nothing),
        cmocka_unit_test(local_pool_has_its_own_storage_free_list_and_refcounts),
        cmocka_unit_test(sliding_releases_local_blocks_behind_every_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
