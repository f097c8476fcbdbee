/* prefix_test.c - the prefix cache: chained matching of full blocks, exact token comparison
 * under forced hash collisions, reference counting, duplicate registration, LRU eviction
 * (leaves first, blocks in use never), stale handles and allocation failures; with a local
 * pool (sliding-window layers), entries' local blocks and where a match may end.
 * The file is compiled in with a switchable hash so a test can make every key collide. */
#include "harness/harness.h"

#include <stdbool.h>

#include "base/base.h"
#include "kv/kv.h"

static bool force_collisions;
static uint64_t test_hash(uint64_t parent_key, const int32_t *tokens, int n);
#define KV_PREFIX_HASH test_hash
#include "../../src/kv/prefix.c"

static uint64_t test_hash(uint64_t parent_key, const int32_t *tokens, int n)
{
    return force_collisions ? 7 : prefix_hash_fnv(parent_key, tokens, n);
}

#define BT 4

struct fixture {
    struct kv_cache *kv;
    struct kv_prefix *pc;
};

static int setup(void **state)
{
    static struct fixture f;
    struct kv_params p = {
        .n_layers = 1, .n_kv_heads = 1, .head_dim = 4,
        .block_tokens = BT, .n_blocks = 16, .type = AR_TYPE_F32,
    };
    force_collisions = false;
    if (kv_create(&p, &f.kv) != AR_OK || kv_prefix_create(f.kv, &f.pc) != AR_OK)
        return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    kv_prefix_destroy(f->pc);
    /* every block must be back: sequences were released by the tests, the cache just now */
    int64_t n_free = kv_n_free(f->kv);
    kv_destroy(f->kv);
    force_collisions = false;
    return n_free == 16 ? 0 : -1;
}

/* Computes a sequence the way the engine does: reserve blocks for tokens, then register the
 * full blocks in order. Returns the handle of the last registered block. */
static uint64_t compute_and_register(struct fixture *f, struct kv_seq *s, const int32_t *tokens,
                                     int64_t n)
{
    uint64_t parent = 0;
    kv_seq_init(s);
    assert_int_equal(kv_seq_reserve(f->kv, s, n), AR_OK);
    for (int64_t b = 0; (b + 1) * BT <= n; b++)
        assert_int_equal(kv_prefix_insert(f->pc, parent, tokens + b * BT, &s->blocks[b], &parent),
                         AR_OK);
    return parent;
}

static void hash_is_chained_over_parent_and_tokens(void **state)
{
    int32_t a[BT] = {1, 2, 3, 4}, b[BT] = {1, 2, 3, 5};
    (void)state;
    assert_true(kv_prefix_hash(0, a, BT) == kv_prefix_hash(0, a, BT));
    assert_true(kv_prefix_hash(0, a, BT) != kv_prefix_hash(0, b, BT));
    assert_true(kv_prefix_hash(0, a, BT) != kv_prefix_hash(1, a, BT));
    /* token order matters */
    int32_t c[BT] = {2, 1, 3, 4};
    assert_true(kv_prefix_hash(0, a, BT) != kv_prefix_hash(0, c, BT));
}

static void lookup_matches_registered_full_blocks_in_order(void **state)
{
    struct fixture *f = *state;
    int32_t t[11] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    struct kv_seq a, b;
    uint64_t last;
    compute_and_register(f, &a, t, 11); /* 2 full blocks + 3 tokens */
    assert_int_equal(kv_prefix_n_entries(f->pc), 2);
    kv_seq_init(&b);
    assert_int_equal(kv_prefix_lookup(f->pc, t, 11, &b, &last), 8);
    assert_int_equal(b.n_blocks, 2);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    assert_true(last != 0);
    /* seq a, the cache and seq b each hold a reference */
    assert_int_equal(kv_block_refcount(f->kv, a.blocks[0]), 3);
    assert_int_equal(kv_block_refcount(f->kv, a.blocks[2]), 1); /* partial block not cached */
    kv_seq_fini(f->kv, &b);
    /* a shorter limit matches fewer blocks */
    kv_seq_init(&b);
    assert_int_equal(kv_prefix_lookup(f->pc, t, 7, &b, NULL), 4);
    assert_int_equal(b.n_blocks, 1);
    kv_seq_fini(f->kv, &b);
    kv_seq_fini(f->kv, &a);
    /* cached blocks survive their sequence */
    assert_int_equal(kv_prefix_n_evictable(f->pc), 2);
    assert_int_equal(kv_n_free(f->kv), 14);
}

static void prompt_differing_in_one_token_matches_only_common_blocks(void **state)
{
    struct fixture *f = *state;
    int32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int32_t u[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 99}; /* last token differs */
    int32_t v[12] = {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}; /* first token differs */
    struct kv_seq a, b;
    compute_and_register(f, &a, t, 12);
    kv_seq_init(&b);
    assert_int_equal(kv_prefix_lookup(f->pc, u, 12, &b, NULL), 8);
    kv_seq_fini(f->kv, &b);
    kv_seq_init(&b);
    assert_int_equal(kv_prefix_lookup(f->pc, v, 12, &b, NULL), 0);
    assert_int_equal(b.n_blocks, 0);
    kv_seq_fini(f->kv, &b);
    kv_seq_fini(f->kv, &a);
}

static void colliding_keys_never_match_different_tokens(void **state)
{
    struct fixture *f = *state;
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t u[8] = {9, 9, 9, 9, 5, 6, 7, 8}; /* second block equal, first differs */
    int32_t w[8] = {1, 2, 3, 4, 8, 7, 6, 5};
    struct kv_seq a, b, c;
    force_collisions = true;
    assert_true(kv_prefix_hash(0, t, BT) == kv_prefix_hash(0, u, BT));
    compute_and_register(f, &a, t, 8);
    compute_and_register(f, &b, u, 8);
    assert_int_equal(kv_prefix_n_entries(f->pc), 4);
    /* each prompt finds exactly its own blocks although every key is the same */
    kv_seq_init(&c);
    assert_int_equal(kv_prefix_lookup(f->pc, u, 8, &c, NULL), 8);
    assert_int_equal(c.blocks[0], b.blocks[0]);
    assert_int_equal(c.blocks[1], b.blocks[1]);
    kv_seq_fini(f->kv, &c);
    kv_seq_init(&c);
    assert_int_equal(kv_prefix_lookup(f->pc, t, 8, &c, NULL), 8);
    assert_int_equal(c.blocks[0], a.blocks[0]);
    assert_int_equal(c.blocks[1], a.blocks[1]);
    kv_seq_fini(f->kv, &c);
    /* same first block, a second block that exists only under another parent: one block */
    kv_seq_init(&c);
    assert_int_equal(kv_prefix_lookup(f->pc, w, 8, &c, NULL), 4);
    assert_int_equal(c.blocks[0], a.blocks[0]);
    kv_seq_fini(f->kv, &c);
    kv_seq_fini(f->kv, &a);
    kv_seq_fini(f->kv, &b);
}

static void registering_a_duplicate_swaps_in_the_cached_block(void **state)
{
    struct fixture *f = *state;
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct kv_seq a, b;
    uint64_t h1, h2;
    compute_and_register(f, &a, t, 8);
    /* b computed the same prompt concurrently, in its own blocks */
    kv_seq_init(&b);
    assert_int_equal(kv_seq_reserve(f->kv, &b, 8), AR_OK);
    int32_t own0 = b.blocks[0];
    assert_int_not_equal(own0, a.blocks[0]);
    assert_int_equal(kv_n_free(f->kv), 12);
    assert_int_equal(kv_prefix_insert(f->pc, 0, t, &b.blocks[0], &h1), AR_OK);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(kv_block_refcount(f->kv, own0), 0); /* its own copy went back */
    assert_int_equal(kv_prefix_insert(f->pc, h1, t + 4, &b.blocks[1], &h2), AR_OK);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    assert_int_equal(kv_n_free(f->kv), 14);
    assert_int_equal(kv_prefix_n_entries(f->pc), 2);
    assert_int_equal(kv_block_refcount(f->kv, a.blocks[1]), 3);
    kv_seq_fini(f->kv, &a);
    kv_seq_fini(f->kv, &b);
}

static void eviction_frees_least_recently_used_leaves_first(void **state)
{
    struct fixture *f = *state;
    int32_t ta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tb[4] = {20, 21, 22, 23};
    struct kv_seq a, b, c;
    compute_and_register(f, &a, ta, 8);
    compute_and_register(f, &b, tb, 4);
    int32_t a0 = a.blocks[0], a1 = a.blocks[1], b0 = b.blocks[0];
    kv_seq_fini(f->kv, &a);
    kv_seq_fini(f->kv, &b);
    /* touch chain a: b0 becomes the least recently used */
    kv_seq_init(&c);
    assert_int_equal(kv_prefix_lookup(f->pc, ta, 8, &c, NULL), 8);
    kv_seq_fini(f->kv, &c);
    assert_int_equal(kv_prefix_n_evictable(f->pc), 3);
    assert_int_equal(kv_prefix_evict(f->pc, 1), 1);
    assert_int_equal(kv_block_refcount(f->kv, b0), 0);
    /* a0 was used before a1 but is a1's parent: the leaf goes first */
    assert_int_equal(kv_prefix_evict(f->pc, 1), 1);
    assert_int_equal(kv_block_refcount(f->kv, a1), 0);
    assert_int_equal(kv_block_refcount(f->kv, a0), 1);
    assert_int_equal(kv_prefix_evict(f->pc, 5), 1);
    assert_int_equal(kv_prefix_evict(f->pc, 1), 0);
    assert_int_equal(kv_prefix_n_entries(f->pc), 0);
    assert_int_equal(kv_n_free(f->kv), 16);
    /* gone means gone */
    kv_seq_init(&c);
    assert_int_equal(kv_prefix_lookup(f->pc, ta, 8, &c, NULL), 0);
    kv_seq_fini(f->kv, &c);
}

static void blocks_in_use_are_never_evicted_and_stale_handles_are_refused(void **state)
{
    struct fixture *f = *state;
    int32_t ta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tb[8] = {20, 21, 22, 23, 24, 25, 26, 27};
    struct kv_seq a, b;
    uint64_t hb, h;
    compute_and_register(f, &a, ta, 8); /* still held by a */
    hb = compute_and_register(f, &b, tb, 8);
    kv_seq_fini(f->kv, &b);
    assert_int_equal(kv_prefix_n_evictable(f->pc), 2);
    assert_int_equal(kv_prefix_evict(f->pc, 100), 2);
    assert_int_equal(kv_prefix_n_entries(f->pc), 2);
    assert_int_equal(kv_block_refcount(f->kv, a.blocks[0]), 2);
    /* b's last entry was evicted: its handle no longer names anything */
    int32_t blk = kv_block_alloc(f->kv);
    assert_int_equal(kv_prefix_insert(f->pc, hb, tb, &blk, &h), AR_EINVAL);
    assert_int_equal(kv_block_refcount(f->kv, blk), 1);
    kv_block_unref(f->kv, blk);
    kv_seq_fini(f->kv, &a);
    assert_int_equal(kv_prefix_evict(f->pc, 100), 2);
}

static void create_fails_cleanly_on_every_allocation(void **state)
{
    struct fixture *f = *state;
    for (uint64_t n = 1;; n++) {
        struct kv_prefix *pc = NULL;
        enum ar_status st;
        ar_alloc_fail_after(n);
        st = kv_prefix_create(f->kv, &pc);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            kv_prefix_destroy(pc);
            assert_true(n > 1);
            break;
        }
        assert_int_equal(st, AR_ENOMEM);
    }
}

/* Layer 0 sliding (window 8), layer 1 global; blocks of BT = 4 tokens. A match ending after n
 * tokens needs the local blocks of positions [n + 1 - 8, n): blocks (n - 7) / 4 .. n / 4 - 1. */
static void matches_end_only_where_the_window_local_blocks_are_cached(void **state)
{
    static const uint8_t swa[2] = {1, 0};
    struct kv_params p = {
        .n_layers = 2, .n_kv_heads = 1, .head_dim = 4, .block_tokens = BT, .n_blocks = 16,
        .type = AR_TYPE_F32, .swa_window = 8, .swa_layers = swa, .n_local_blocks = 16,
    };
    int32_t a[24], q[24];
    uint64_t h[6], parent = 0, last;
    struct kv_cache *kv;
    struct kv_prefix *pc;
    struct kv_seq s, b;
    (void)state;
    for (int i = 0; i < 24; i++) {
        a[i] = 100 + i;
        q[i] = i < 16 ? a[i] : 500 + i; /* shares blocks 0..3 with a */
    }
    assert_int_equal(kv_create(&p, &kv), AR_OK);
    assert_int_equal(kv_prefix_create(kv, &pc), AR_OK);

    /* a's 6 blocks registered, block 2 without its local block */
    kv_seq_init(&s);
    assert_int_equal(kv_seq_reserve(kv, &s, 24), AR_OK);
    for (int i = 0; i < 6; i++) {
        if (i == 2)
            assert_int_equal(kv_prefix_insert(pc, parent, a + i * BT, &s.blocks[i], &parent),
                             AR_OK);
        else
            assert_int_equal(kv_prefix_insert_local(pc, parent, a + i * BT, &s.blocks[i],
                                                    &s.local[i], &parent),
                             AR_OK);
        h[i] = parent;
    }
    kv_seq_fini(kv, &s);
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 16 - 5);

    /* all of a: the window of 24 is blocks 4 and 5, both cached */
    assert_int_equal(kv_prefix_lookup(pc, a, 24, &s, &last), 24);
    assert_int_equal(last, h[5]);
    for (int i = 0; i < 6; i++)
        assert_int_equal(s.local[i] >= 0, i != 2);
    assert_true(kv_seq_window_held(kv, &s, 24));
    kv_seq_fini(kv, &s);

    /* q walks blocks 0..3, but ends at 16 and 12 need block 2's local K/V: the match ends
     * at 8 (window blocks 0 and 1), and the blocks beyond are not held */
    assert_int_equal(kv_prefix_lookup(pc, q, 24, &s, &last), 8);
    assert_int_equal(s.n_blocks, 2);
    assert_int_equal(last, h[1]);
    assert_true(kv_seq_window_held(kv, &s, 8));
    for (int i = 0; i < 6; i++) {
        int32_t blk = pc->e[(h[i] & 0xffffffffu) - 1].block;
        assert_int_equal(kv_block_refcount(kv, blk), i < 2 ? 2 : 1);
    }
    kv_seq_fini(kv, &s);

    /* b computes block 2 again and registers it: the entry takes b's local block (and b gets
     * the cached global block); now q's match may end at 16 */
    kv_seq_init(&b);
    assert_int_equal(kv_prefix_lookup(pc, a, 8, &b, &last), 8);
    assert_int_equal(kv_seq_reserve_at(kv, &b, 12, 8), AR_OK);
    int32_t own = b.blocks[2];
    assert_int_equal(kv_prefix_insert_local(pc, last, a + 8, &b.blocks[2], &b.local[2], &last),
                     AR_OK);
    assert_int_equal(last, h[2]);
    assert_true(b.blocks[2] != own);
    assert_int_equal(kv_pool_refcount(kv, KV_POOL_LOCAL, b.local[2]), 2);
    assert_int_equal(kv_prefix_lookup(pc, q, 24, &s, &last), 16);
    assert_int_equal(last, h[3]);
    kv_seq_fini(kv, &s);

    /* local eviction frees what only the cache holds (blocks 3..5, not b's 0..2), entries
     * stay */
    assert_int_equal(kv_prefix_evict_local(pc, 100), 3);
    assert_int_equal(kv_prefix_n_entries(pc), 6);
    kv_seq_fini(kv, &b);
    assert_int_equal(kv_prefix_evict_local(pc, 100), 3);
    assert_int_equal(kv_pool_n_free(kv, KV_POOL_LOCAL), 16);
    /* no local block left: no end has its window */
    assert_int_equal(kv_prefix_lookup(pc, a, 24, &s, &last), 0);
    assert_int_equal(last, 0);
    assert_int_equal(s.n_blocks, 0);
    kv_seq_fini(kv, &s); /* the table may have grown */
    kv_prefix_destroy(pc);
    assert_int_equal(kv_n_free(kv), 16);
    kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hash_is_chained_over_parent_and_tokens),
        cmocka_unit_test(matches_end_only_where_the_window_local_blocks_are_cached),
        cmocka_unit_test_setup_teardown(lookup_matches_registered_full_blocks_in_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(prompt_differing_in_one_token_matches_only_common_blocks,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(colliding_keys_never_match_different_tokens, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(registering_a_duplicate_swaps_in_the_cached_block, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(eviction_frees_least_recently_used_leaves_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            blocks_in_use_are_never_evicted_and_stale_handles_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(create_fails_cleanly_on_every_allocation, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
