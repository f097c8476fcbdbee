/* forward.c - one transformer forward pass over a batch of (token, position, sequence) rows,
 * with K/V in the paged cache: the fast form of reference.c's pass (same steps, same
 * per-family data; tests hold the two together). The pass is one list of phases (per layer:
 * q/k/v products, attention, output projection, gate/up products, down projection; then the
 * output matrix), each parallel work followed by a tail of row work (see "the pass" below).
 * Two schedules run that one list: large batches as one pool run per phase and per tail;
 * small ones as a single pool job whose threads claim each phase's items in turn (see
 * stage_pass). No result depends on the thread count or on the schedule. */
#include "model_internal.h"

#include <assert.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "kernels/kernels.h"

/* Weight rows per thread split unit; weight rows and batch rows per gemm call (a call's
 * weight rows stay in cache while every batch row streams past them). Every gemm computes
 * each output by the same operations wherever it falls in a call, so neither the thread
 * split nor the call boundaries change a result. */
#define MM_TILE_ROWS 16
#define MM_CALL_ROWS 128
/* weight rows per gemm call with more than MM_FEW_COLS input rows (prefill): each call starts
 * its chunks on weights not yet fetched and prepares its input rows' blocks anew, so longer
 * calls paid on Zen 5 (2026-12-05): 24 cold 4864 x 896 Q8_0 matrices against 512 rows in
 * calls of 64 rows went from 0.57 to 0.59 of the int8 peak with 256 weight rows a call instead
 * of 128 (the other qwen2-0.5B shapes alike), prefill_cpu on qwen05 Q8_0 3.5 % faster */
#define MM_MANY_ROWS 256
#define MM_FEW_COLS 16 /* input rows up to which matmul units are sized as mm_call_rows says */
#define MM_TILE_COLS 64
#define MM_MAX_MATS 3

/* One matmul of a stage: out[j * ldy + i] = dot(w row i, input row j). Its input rows are
 * the stage's (x NULL: c->mm_x, c->n_rows of them) or its own (x: n_cols rows, x_row bytes
 * apart, already in w's activation type). */
struct mm_item {
    const struct model_mat *w;
    float *out;
    size_t ldy;
    const void *x;
    size_t x_row;
    int n_cols;
    /* stage_gu only: the up matrix (its input is w's) and the first row of gu_dst written
     * (0; a mixture's expert: its first sorted pair) */
    const struct model_mat *w_up;
    int p0;
};

struct model_ctx {
    const struct model *m;
    const struct kernel_ops *ops;
    struct ar_pool *pool; /* borrowed */
    int nth;
    int n_batch_max;
    int64_t n_ctx; /* the context the caller runs (model_ctx_set_n_ctx); 0: unset */

    /* scratch, (n_batch_max, width) row-major, allocated once */
    float *x;       /* owned, n_embd: the residual stream */
    float *xn;      /* owned, n_embd: normed input of a matmul */
    float *proj;    /* owned, n_embd: attention / ffn output before the residual add */
    float *q;       /* owned, n_heads * head_dim */
    float *k;       /* owned, n_kv_heads * head_dim */
    float *v;       /* owned, n_kv_heads * head_dim */
    float *att;     /* owned, n_heads * head_dim: attention output */
    float *gate;    /* owned, n_ff */
    float *up;      /* owned, n_ff */
    float *hid;     /* owned, n_ff: silu(gate) * up */
    /* the fused gate/up stage (see stage_gu): per thread, a gate and an up tile of
     * MM_TILE_COLS rows x MM_MANY_ROWS outputs and one row of their product; NULL where
     * batches never take it */
    float *gu_tile;
    uint8_t *act_ff; /* owned with gu_tile, act_row bytes per row: the down projection's input */
    bool gu_fuse;    /* AR_FUSE_FFN=0 in the environment turns the fused stage off */
    int gu_fused;    /* layers that took it in the running (or last) pass */
    /* row strides (floats) of the matmul outputs proj, q, k and v, gate and up, moe_gate and
     * moe_up, moe_down: out_ld of their widths */
    int64_t embd_ld, q_ld, kv_ld, ff_ld, ffe_ld;
    float *rope;    /* owned, n_rope * rope_dim: (cos, sin) pairs per rotated pair and rope
                     * (global, local), set per pass */
    uint8_t *act;   /* owned, act_row bytes per row: input rows in a vec_dot type */
    size_t act_row; /* max bytes of one converted input row over all matrices */
    float *scores;  /* owned, (nth * attn_tile_rows, out_ld(score_cap)) */
    int64_t score_cap;
    /* prefill attention (see attn_rows_item): blocks of rows sharing one pass over K/V */
    int attn_rows;      /* rows per block at most */
    float *attn_tile;   /* owned, (nth, 2 * attn_tile_rows * head_dim): gathered queries,
                         * then outputs */
    int32_t *attn_blk;  /* owned, (n_batch_max + 1): first row of each block of the pass */
    int n_attn_blk;
    int32_t *out_rows; /* owned, (n_batch_max): batch row of each logits row */
    /* mixture of experts (see run_moe) */
    /* A "pair" is (row, slot): row r's slot-th chosen expert; pairs are sorted by expert so
     * each expert's input rows lie together. P = n_batch_max * n_expert_used pairs at most. */
    float *moe_logits;   /* owned, (n_batch_max, n_expert): router output, then probabilities */
    int32_t *moe_sel;    /* owned, (P): chosen experts, each row's best first */
    float *moe_w;        /* owned, (P): their renormalized weights */
    int32_t *moe_order;  /* owned, (P): sorted position -> pair r * n_expert_used + slot */
    int32_t *moe_pos;    /* owned, (P): pair -> sorted position */
    int32_t *moe_start;  /* owned, (n_expert + 1): each expert's first sorted position */
    struct mm_item *moe_items; /* owned, (2 * n_expert) */
    uint8_t *moe_act;          /* owned, (P, act_row): gate/up inputs, then unfused down inputs */
    uint8_t *moe_act_up; /* owned, (P, act_row): up's inputs when its type differs from gate's */
    float *moe_gate;     /* owned, (P, ffe_ld) */
    float *moe_up;       /* owned, (P, ffe_ld) */
    float *moe_down;     /* owned, (P, embd_ld): each pair's expert output */
    int moe_pairs;       /* pairs of the running step */
    uint8_t *moe_dst;    /* stage_moe_gather's destination (moe_act or moe_act_up), then
                          * the down projections' input (moe_act, or moe_act_up fused) */
    enum ar_type moe_vt; /* and the type of its rows */

    /* What act holds now: rows of `act_src` converted to act_type (NULL: nothing). */
    const float *act_src;
    enum ar_type act_type;

    /* ---- state of the running forward pass, read by the stages ---- */
    struct kv_cache *kv;
    struct kv_seq *const *seqs;
    const struct model_batch *b;
    int n_rows; /* rows the current row stage covers */
    int layer;
    size_t kv_elem; /* 2 (F16) or 4 (F32) */
    int n_out;  /* rows that produce logits */
    float *logits;
    /* row stages */
    int tail_p;             /* the phase whose tail stage_tail runs */
    const float *conv_src;  /* convert stage source */
    int64_t conv_n;         /* elements per row */
    enum ar_type conv_type; /* AR_TYPE_F32: no conversion */
    /* matmul stage */
    const struct mm_item *mm; /* (n_mm) borrowed from the caller for the stage */
    int n_mm;
    int64_t *mm_units; /* owned, (max items + 1): first work unit of each item (mm_plan) */
    int64_t *mm_call;  /* owned, (max items): weight rows per unit of each item */
    int64_t *mm_cspan; /* owned, (max items): input rows per unit of each item */
    int mm_max;        /* items a stage may hold */
    const void *mm_x; /* input rows */
    size_t mm_x_row;  /* bytes between input rows */
    /* stage_gu: act(gate) * up goes to gu_dst, gu_row bytes a row, converted to gu_vt
     * (floats where F32) */
    uint8_t *gu_dst;
    size_t gu_row;
    enum ar_type gu_vt;
    /* attention items also do their row's K/V writes and RoPE (rows of distinct sequences) */
    bool fuse_post;
    /* work items of the running stage are claimed from this counter (see run_stage) */
    atomic_int_fast64_t next;

    /* ---- small batches: the whole pass as one pool job of phases (see stage_pass) ---- */
    bool ph_ok;              /* dense FFNs, and each phase's matrices share an activation type */
    struct ph_seg *ph_seg;   /* owned, (ph_count, ph_segs): claim segments */
    struct ph_done *ph_done; /* owned, (ph_count) */
    int ph_count;            /* PH_PER_LAYER * n_layers + 1 */
    int ph_segs;             /* min(nth, PH_MAX_SEGS) */
    atomic_int ph_cur;       /* the running phase; ph_count when the pass is done */
};

/* A phase's items are split into ph_segs contiguous segments, one per thread: a thread
 * claims from the front of its own segment (so each thread streams one contiguous stretch of
 * a matrix, which memory serves much faster than two threads taking turns on neighbouring
 * pieces), then steals from the backs of the others (so a thread that never joins, or lags,
 * holds up nobody). span: (back << 32) | front, unclaimed items [front, back). */
struct ph_seg {
    _Atomic uint64_t span;
    char pad[64 - sizeof(uint64_t)];
};
struct ph_done {
    atomic_int_fast64_t done; /* items completed */
    char pad[64 - sizeof(atomic_int_fast64_t)];
};
#define PH_MAX_SEGS 16

/* Batches of at most this many rows run as one pool job (stage_pass), or, where that
 * schedule does not apply, do their tails on the calling thread: a few rows' norms cost less
 * than a pool rendezvous. */
#define SMALL_ROWS 8

/* The phases of one layer (p = layer * PH_PER_LAYER + k; then PH_OUT), see "the pass". */
enum { PH_QKV, PH_ATTN, PH_WO, PH_GU, PH_DOWN, PH_PER_LAYER };
#define PH_HEAD (-1) /* the tail before phase 0: embedding, layer 0's attention norm */

/* Prefill attention tiles hold at most this many query vectors (rows x heads per KV head), and
 * at most ATTN_MAX_ROWS rows. */
#define ATTN_TILE_Q 64
#define ATTN_MAX_ROWS 32
/* Rows of a block that see only part of a K/V span (the causal diagonal) go in runs of this
 * many, each over the positions its last row sees. */
#define ATTN_DIAG_ROWS 4

/* ---- allocation ---------------------------------------------------------------------- */

/* Score rows (query vectors) of one thread's attention tile: attn_rows rows x the heads per
 * KV head. */
static int attn_tile_rows(const struct model_ctx *c)
{
    return c->attn_rows * (c->m->hp.n_heads / c->m->hp.n_kv_heads);
}

static enum ar_status alloc_rows(float **p, int n_rows, int64_t width)
{
    uint64_t bytes;
    if (ar_mul_overflow_u64((uint64_t)n_rows * (uint64_t)width, sizeof(float), &bytes) ||
        bytes > SIZE_MAX)
        return AR_ENOMEM;
    *p = ar_malloc_aligned((size_t)bytes);
    return *p ? AR_OK : AR_ENOMEM;
}

/* The row stride (floats) of rows of n floats that kernels write many of at once: n rounded
 * up to an odd multiple of 64 bytes. The gemm kernels update 8 output rows at a time, a tile
 * of up to 64 rows per call; at widths that are multiples of 4 KiB (1024, 2048, 3072 floats:
 * Qwen3's) those rows all fell into the same L1 sets and evicted each other at every pass
 * (measured: the same Q8_0 tile ran 1.1-2x slower than with the rows 64 bytes further apart).
 * The attention score rows (a power-of-two capacity of positions) likewise: their stores and
 * the value pass's reads of up to 64 rows at one position evicted each other. */
static int64_t out_ld(int64_t n)
{
    int64_t ld = (n + 15) / 16 * 16;
    return ld / 16 % 2 ? ld : ld + 16;
}

static size_t mat_act_row(const struct model_mat *w)
{
    return w->vec_type == AR_TYPE_F32 ? 0 : ar_type_row_size(w->vec_type, w->n_in);
}

enum ar_status model_ctx_create(const struct model *m, int n_batch_max, struct ar_pool *pool,
                                struct model_ctx **out)
{
    const struct model_hparams *hp;
    struct model_ctx *c;
    enum ar_status st = AR_ENOMEM;
    int64_t n_q, n_kv;
    uint64_t bytes;
    const char *env;
    if (!m || !out || n_batch_max < 1 || n_batch_max > (1 << 20))
        return AR_EINVAL;
    hp = &m->hp;
    n_q = (int64_t)hp->n_heads * hp->head_dim;
    n_kv = (int64_t)hp->n_kv_heads * hp->head_dim;
    c = ar_calloc(1, sizeof(*c));
    if (!c)
        return AR_ENOMEM;
    c->m = m;
    c->ops = kernels_get();
    c->pool = pool;
    c->nth = ar_pool_size(pool);
    c->n_batch_max = n_batch_max;

    c->act_row = mat_act_row(&m->output);
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct model_mat *ws[] = {&L->wq,    &L->wk,  &L->wv,   &L->wo,
                                        &L->wgate, &L->wup, &L->wdown, &L->router};
        for (size_t i = 0; i < AR_ARRAY_LEN(ws); i++)
            if (ws[i]->data)
                c->act_row = AR_MAX(c->act_row, mat_act_row(ws[i]));
        for (int e = 0; L->exp_gate && e < hp->n_expert; e++)
            c->act_row = AR_MAX(c->act_row,
                                AR_MAX(mat_act_row(&L->exp_gate[e]),
                                       AR_MAX(mat_act_row(&L->exp_up[e]),
                                              mat_act_row(&L->exp_down[e]))));
    }
    c->embd_ld = out_ld(hp->n_embd);
    c->q_ld = out_ld(n_q);
    c->kv_ld = out_ld(n_kv);
    c->ff_ld = out_ld(hp->n_ff);
    c->ffe_ld = out_ld(hp->n_ff_exp);
    /* grown on demand by ensure_scores; a huge context_length must not cost memory up front */
    c->score_cap = AR_MAX(AR_MIN(hp->n_ctx_train, 4096), 16);
    c->attn_rows = AR_MIN(AR_MIN(ATTN_MAX_ROWS, n_batch_max),
                          AR_MAX(1, ATTN_TILE_Q / (hp->n_heads / hp->n_kv_heads)));

    if (alloc_rows(&c->x, n_batch_max, hp->n_embd) || alloc_rows(&c->xn, n_batch_max, hp->n_embd) ||
        alloc_rows(&c->proj, n_batch_max, c->embd_ld) || alloc_rows(&c->q, n_batch_max, c->q_ld) ||
        alloc_rows(&c->k, n_batch_max, c->kv_ld) || alloc_rows(&c->v, n_batch_max, c->kv_ld) ||
        alloc_rows(&c->att, n_batch_max, n_q) || alloc_rows(&c->gate, n_batch_max, c->ff_ld) ||
        alloc_rows(&c->up, n_batch_max, c->ff_ld) || alloc_rows(&c->hid, n_batch_max, hp->n_ff) ||
        alloc_rows(&c->rope, n_batch_max, (int64_t)m->n_rope * hp->rope_dim) ||
        alloc_rows(&c->scores, c->nth * attn_tile_rows(c), out_ld(c->score_cap)) ||
        alloc_rows(&c->attn_tile, c->nth * 2 * attn_tile_rows(c), hp->head_dim))
        goto fail;
    if (!(c->attn_blk = ar_malloc((size_t)(n_batch_max + 1) * sizeof(*c->attn_blk))))
        goto fail;
    if (ar_mul_overflow_u64((uint64_t)n_batch_max, AR_MAX(c->act_row, 1), &bytes) ||
        bytes > SIZE_MAX || !(c->act = ar_malloc_aligned((size_t)bytes)))
        goto fail;
    if (!(c->out_rows = ar_malloc((size_t)n_batch_max * sizeof(*c->out_rows))))
        goto fail;
    env = getenv("AR_FUSE_FFN");
    c->gu_fuse = !(env && strcmp(env, "0") == 0);
    if (c->gu_fuse && n_batch_max > MM_FEW_COLS &&
        (alloc_rows(&c->gu_tile, c->nth, (2 * MM_TILE_COLS + 1) * out_ld(MM_MANY_ROWS)) ||
         (hp->n_expert == 0 && !(c->act_ff = ar_malloc_aligned((size_t)bytes)))))
        goto fail;
    c->mm_max = AR_MAX(MM_MAX_MATS, 2 * hp->n_expert);
    if (!(c->mm_units = ar_malloc((size_t)(c->mm_max + 1) * sizeof(*c->mm_units))) ||
        !(c->mm_call = ar_malloc((size_t)c->mm_max * sizeof(*c->mm_call))) ||
        !(c->mm_cspan = ar_malloc((size_t)c->mm_max * sizeof(*c->mm_cspan))))
        goto fail;
    if (hp->n_expert > 0) {
        int64_t pairs = (int64_t)n_batch_max * hp->n_expert_used;
        if (alloc_rows(&c->moe_logits, n_batch_max, hp->n_expert) ||
            alloc_rows(&c->moe_w, n_batch_max, hp->n_expert_used) ||
            alloc_rows(&c->moe_gate, (int)pairs, c->ffe_ld) ||
            alloc_rows(&c->moe_up, (int)pairs, c->ffe_ld) ||
            alloc_rows(&c->moe_down, (int)pairs, c->embd_ld) ||
            !(c->moe_sel = ar_malloc((size_t)pairs * sizeof(*c->moe_sel))) ||
            !(c->moe_order = ar_malloc((size_t)pairs * sizeof(*c->moe_order))) ||
            !(c->moe_pos = ar_malloc((size_t)pairs * sizeof(*c->moe_pos))) ||
            !(c->moe_start = ar_malloc((size_t)(hp->n_expert + 1) * sizeof(*c->moe_start))) ||
            !(c->moe_items = ar_calloc((size_t)(2 * hp->n_expert), sizeof(*c->moe_items))) ||
            ar_mul_overflow_u64((uint64_t)pairs, AR_MAX(c->act_row, 4 * (size_t)hp->n_ff_exp +
                                                                       4 * (size_t)hp->n_embd),
                                &bytes) ||
            bytes > SIZE_MAX || !(c->moe_act = ar_malloc_aligned((size_t)bytes)) ||
            !(c->moe_act_up = ar_malloc_aligned((size_t)bytes)))
            goto fail;
    }
    c->ph_count = PH_PER_LAYER * hp->n_layers + 1;
    c->ph_segs = AR_MIN(c->nth, PH_MAX_SEGS);
    if (!(c->ph_seg = ar_malloc_aligned((size_t)c->ph_count * (size_t)c->ph_segs *
                                        sizeof(*c->ph_seg))) ||
        !(c->ph_done = ar_malloc_aligned((size_t)c->ph_count * sizeof(*c->ph_done))))
        goto fail;
    /* the phase pass covers dense FFNs; mixture-of-experts layers run as stages */
    c->ph_ok = hp->n_expert == 0;
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        if (L->wk.vec_type != L->wq.vec_type || L->wv.vec_type != L->wq.vec_type ||
            L->wup.vec_type != L->wgate.vec_type)
            c->ph_ok = false;
    }
    *out = c;
    return AR_OK;
fail:
    model_ctx_destroy(c);
    return st;
}

void model_ctx_set_n_ctx(struct model_ctx *c, int64_t n_ctx)
{
    if (c)
        c->n_ctx = n_ctx;
}

void model_ctx_destroy(struct model_ctx *c)
{
    if (!c)
        return;
    ar_free_aligned(c->x);
    ar_free_aligned(c->xn);
    ar_free_aligned(c->proj);
    ar_free_aligned(c->q);
    ar_free_aligned(c->k);
    ar_free_aligned(c->v);
    ar_free_aligned(c->att);
    ar_free_aligned(c->gate);
    ar_free_aligned(c->up);
    ar_free_aligned(c->hid);
    ar_free_aligned(c->rope);
    ar_free_aligned(c->act);
    ar_free_aligned(c->gu_tile);
    ar_free_aligned(c->act_ff);
    ar_free_aligned(c->scores);
    ar_free_aligned(c->attn_tile);
    ar_free(c->attn_blk);
    ar_free(c->out_rows);
    ar_free(c->mm_units);
    ar_free(c->mm_call);
    ar_free(c->mm_cspan);
    ar_free_aligned(c->moe_logits);
    ar_free_aligned(c->moe_w);
    ar_free_aligned(c->moe_gate);
    ar_free_aligned(c->moe_up);
    ar_free_aligned(c->moe_down);
    ar_free_aligned(c->moe_act);
    ar_free_aligned(c->moe_act_up);
    ar_free(c->moe_sel);
    ar_free(c->moe_order);
    ar_free(c->moe_pos);
    ar_free(c->moe_start);
    ar_free(c->moe_items);
    ar_free_aligned(c->ph_seg);
    ar_free_aligned(c->ph_done);
    ar_free(c);
}

int model_ctx_gu_fused(const struct model_ctx *c)
{
    return c->gu_fused;
}

/* Grows the per-thread attention score rows to hold n positions (only when a sequence
 * gets longer than any before). */
static enum ar_status ensure_scores(struct model_ctx *c, int64_t n)
{
    int64_t cap = c->score_cap;
    float *s;
    if (n <= cap)
        return AR_OK;
    while (cap < n)
        cap *= 2;
    if (alloc_rows(&s, c->nth * attn_tile_rows(c), out_ld(cap)) != AR_OK)
        return AR_ENOMEM;
    ar_free_aligned(c->scores);
    c->scores = s;
    c->score_cap = cap;
    return AR_OK;
}

/* ---- row stages ---------------------------------------------------------------------- */

/* Stages take their work in chunks from a shared counter, so whichever threads are running do
 * all of it: a worker descheduled by another process does not hold up the step (the pool's
 * shared mode lets the caller finish without it). Each item is computed by the same code
 * whichever thread claims it, so results do not depend on the thread count. */
static bool claim(struct model_ctx *c, int64_t n, int64_t chunk, int64_t *b, int64_t *e)
{
    int64_t s = atomic_fetch_add_explicit(&c->next, chunk, memory_order_relaxed);
    if (s >= n)
        return false;
    *b = s;
    *e = AR_MIN(s + chunk, n);
    return true;
}

/* Rows per claim for row stages: a few claims per thread. */
static int64_t row_chunk(const struct model_ctx *c)
{
    return AR_MAX(1, c->n_rows / (4 * c->nth));
}

static void run_stage(struct model_ctx *c, ar_pool_fn fn)
{
    atomic_store_explicit(&c->next, 0, memory_order_relaxed);
    ar_pool_run_shared(c->pool, fn, c);
}

/* Runs a row or pair stage: on the pool for a batch, on this thread for a few rows (decode),
 * where a pool rendezvous costs more than the work. */
static void run_small_stage(struct model_ctx *c, ar_pool_fn fn)
{
    if (c->n_rows <= SMALL_ROWS) {
        atomic_store_explicit(&c->next, 0, memory_order_relaxed);
        fn(c, 0, 1);
    } else {
        run_stage(c, fn);
    }
}

/* Converts rows [r0, r1) of conv_src into act (the caller checks conv_type != F32). */
static void convert_rows(struct model_ctx *c, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        c->ops->from_float[c->conv_type](c->conv_src + r * c->conv_n, c->act + r * c->act_row,
                                         c->conv_n);
}

/* Row r's RoPE (cos, sin) pairs for each of the model's ropes, computed once per pass and
 * used by every layer (see model_rope_table). */
static void rope_table_row(struct model_ctx *c, int64_t r)
{
    const struct model *m = c->m;
    for (int k = 0; k < m->n_rope; k++)
        model_rope_table(m, model_rope_for(m, k, c->n_ctx), c->b->pos[r],
                         c->rope + (r * m->n_rope + k) * m->hp.rope_dim);
}

static void embed_scale(const struct model *m, float *x)
{
    if (m->hp.embd_scale != 1.0f)
        for (int i = 0; i < m->hp.n_embd; i++)
            x[i] *= m->hp.embd_scale;
}

/* x += p, the output of a block: first p = rmsnorm(p) * post when the block has a post norm. */
static void add_block_output(const struct model_ctx *c, float *x, float *p, const float *post)
{
    int n = c->m->hp.n_embd;
    if (post)
        c->ops->rmsnorm(n, p, p, post, c->m->hp.rms_eps);
    for (int i = 0; i < n; i++)
        x[i] += p[i];
}

static void stage_convert(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    int64_t r0, r1;
    (void)ith, (void)nth;
    while (claim(c, c->n_rows, row_chunk(c), &r0, &r1))
        convert_rows(c, r0, r1);
}

/* Row r's biases, RoPE on q and k and its K/V rows written into its sequence's block, for
 * KV heads [g0, g1) and their query heads. */
static void qkv_post_row(struct model_ctx *c, int64_t r, int g0, int g1)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct model_layer *L = &c->m->layers[c->layer];
    int hd = hp->head_dim, group = hp->n_heads / hp->n_kv_heads;
    int q0 = g0 * group * hd, q1 = g1 * group * hd, k0 = g0 * hd, k1 = g1 * hd;
    int bt = kv_params(c->kv)->block_tokens;
    size_t row_size = kv_row_size(c->kv);
    float *q = c->q + r * c->q_ld, *k = c->k + r * c->kv_ld, *v = c->v + r * c->kv_ld;
    const float *csp = c->rope + (r * c->m->n_rope + L->rope) * hp->rope_dim;
    int32_t pos = c->b->pos[r];
    const struct kv_seq *s = c->seqs[c->b->seq[r]];
    int32_t block = kv_seq_table(c->kv, s, c->layer)[pos / bt];
    size_t off = (size_t)(pos % bt) * row_size;
    uint8_t *kd = (uint8_t *)kv_k_block(c->kv, c->layer, block) + off;
    uint8_t *vd = (uint8_t *)kv_v_block(c->kv, c->layer, block) + off;

    if (L->bq)
        for (int i = q0; i < q1; i++)
            q[i] += L->bq[i];
    if (L->bk)
        for (int i = k0; i < k1; i++)
            k[i] += L->bk[i];
    if (L->bv)
        for (int i = k0; i < k1; i++)
            v[i] += L->bv[i];
    if (L->q_norm) /* per head, before rope */
        for (int h = q0; h < q1; h += hd)
            c->ops->rmsnorm(hd, q + h, q + h, L->q_norm, hp->rms_eps);
    if (L->k_norm)
        for (int h = k0; h < k1; h += hd)
            c->ops->rmsnorm(hd, k + h, k + h, L->k_norm, hp->rms_eps);
    c->ops->rope(q + q0, (g1 - g0) * group, hd, hp->rope_dim, hp->rope_neox, csp);
    c->ops->rope(k + k0, g1 - g0, hd, hp->rope_dim, hp->rope_neox, csp);
    if (c->kv_elem == 4) {
        memcpy(kd + (size_t)k0 * 4, k + k0, (size_t)(k1 - k0) * 4);
        memcpy(vd + (size_t)k0 * 4, v + k0, (size_t)(k1 - k0) * 4);
    } else {
        /* F16C's conversion rounds as ar_f32_to_f16 (to nearest even) */
        ar_f16 *kh = (ar_f16 *)(void *)kd, *vh = (ar_f16 *)(void *)vd;
        c->ops->from_float[AR_TYPE_F16](k + k0, kh + k0, k1 - k0);
        c->ops->from_float[AR_TYPE_F16](v + k0, vh + k0, k1 - k0);
    }
}

/* Splits the batch's rows into attention blocks (c->attn_blk): runs of consecutive rows of
 * one sequence at consecutive positions (prefill), at most attn_rows each; every other row is
 * a block of its own. Positions between a block's first row's first visible one and its last
 * row are each visible to some row of the block, so all of them hold written K/V. */
static void plan_attn_blocks(struct model_ctx *c)
{
    const struct model_batch *b = c->b;
    int n = 0;
    for (int r = 0; r < b->n_tokens; r++)
        if (r == 0 || r - c->attn_blk[n - 1] >= c->attn_rows || b->seq[r] != b->seq[r - 1] ||
            b->pos[r] != b->pos[r - 1] + 1)
            c->attn_blk[n++] = r;
    c->attn_blk[n] = b->n_tokens;
    c->n_attn_blk = n;
}

/* The calls that cover positions [t0, t0 + nt) for the nr rows of a block whose row i is at
 * position p0 + i: the rows that see all of them in one call, the others in runs of
 * ATTN_DIAG_ROWS rows over the positions the run's last row sees; rows that see none are left
 * out (their scores there are zero and add nothing). Each call is (first row, end row,
 * positions) in sp; returns their number (at most 1 + ceil(nr / ATTN_DIAG_ROWS)). */
static int attn_spans(int32_t p0, int nr, int32_t t0, int32_t nt, int sp[][3])
{
    int first = AR_MIN(nr, AR_MAX(0, t0 - p0));
    int all = AR_MIN(nr, AR_MAX(first, t0 + nt - 1 - p0)), n = 0;
    if (all < nr) {
        sp[n][0] = all, sp[n][1] = nr, sp[n][2] = nt;
        n++;
    }
    for (int i = first; i < all; i += ATTN_DIAG_ROWS) {
        int e = AR_MIN(i + ATTN_DIAG_ROWS, all);
        sp[n][0] = i, sp[n][1] = e, sp[n][2] = p0 + e - t0; /* row e - 1 sees [t0, p0 + e) */
        n++;
    }
    return n;
}

/* Asks for rows [in, in + n) of one head's K or V in a cache block: n rows of `bytes`, row_size
 * apart. A head's rows lie 2-4 KiB apart, every one or two on another 4 KiB page, which the
 * hardware prefetchers do not follow; asking for a block's rows ahead turns the cache misses
 * of a long context into one overlapped wave per block. */
static void prefetch_head_rows(const uint8_t *block, int in, int n, size_t row_size, size_t bytes)
{
    for (int t = in; t < in + n; t++)
        for (size_t o = 0; o < bytes; o += 64)
            __builtin_prefetch(block + (size_t)t * row_size + o, 0, 2);
}

/* Attention of the nr rows r0.. of one block (see plan_attn_blocks) for KV head kvh, in one
 * pass over their K/V blocks: their query vectors (nr x group) gathered into one tile, so each
 * key and value row is loaded and converted once for all of them (a lone row, decode's case,
 * is read and written in place). Each row's scores are softmaxed over its own visible
 * positions and zero at the block's others (which adds nothing to its output); where the
 * causal diagonal crosses a K/V block, rows are taken in runs that stop at what they see
 * (attn_spans). For a lone row those are its visible positions, [first, pos + 1), the
 * window's on a sliding layer (whose earlier blocks are never read). */
static void attn_rows_item(struct model_ctx *c, int ith, int64_t r0, int nr, int kvh)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct kernel_ops *ops = c->ops;
    int hd = hp->head_dim, n_q = hp->n_heads * hd;
    int group = hp->n_heads / hp->n_kv_heads;
    int bt = kv_params(c->kv)->block_tokens;
    size_t row_size = kv_row_size(c->kv), es = c->kv_elem, cap = (size_t)out_ld(c->score_cap);
    size_t tile = (size_t)attn_tile_rows(c) * (size_t)hd, head_bytes = (size_t)group * hd * 4;
    enum ar_type kt = es == 4 ? AR_TYPE_F32 : AR_TYPE_F16;
    float scale = (float)(1.0 / sqrt((double)hd));
    float *scores = c->scores + (size_t)ith * (size_t)attn_tile_rows(c) * cap;
    float *qt = c->attn_tile + (size_t)ith * 2 * tile, *ot = qt + tile;
    bool in_place = nr == 1;
    /* the layer's block table (a sliding layer's: the local pool's) */
    const int32_t *tab = kv_seq_table(c->kv, c->seqs[c->b->seq[r0]], c->layer);
    size_t head_row = (size_t)hd * es, head_off = (size_t)kvh * head_row;
    int swa = c->m->layers[c->layer].swa_window;
    /* positions [lo, hi) are visible to some row of the block */
    int32_t lo = swa > 0 && c->b->pos[r0] + 1 > swa ? c->b->pos[r0] + 1 - swa : 0;
    int32_t hi = c->b->pos[r0 + nr - 1] + 1, p0 = c->b->pos[r0];
    int sp[1 + ATTN_MAX_ROWS][3];

    if (in_place) {
        qt = c->q + r0 * c->q_ld + (int64_t)kvh * group * hd;
        ot = c->att + r0 * n_q + (int64_t)kvh * group * hd;
    } else {
        for (int i = 0; i < nr; i++)
            memcpy(qt + (size_t)i * group * hd,
                   c->q + (r0 + i) * c->q_ld + (int64_t)kvh * group * hd, head_bytes);
    }
    if (lo < hi)
        prefetch_head_rows((const uint8_t *)kv_k_block(c->kv, c->layer, tab[lo / bt]) + head_off,
                           lo % bt, AR_MIN(bt - lo % bt, hi - lo), row_size, head_row);
    for (int32_t t0 = lo; t0 < hi;) {
        int32_t bi = t0 / bt, in = t0 % bt, nt = AR_MIN(bt - in, hi - t0);
        const uint8_t *kb = (const uint8_t *)kv_k_block(c->kv, c->layer, tab[bi]);
        int n_sp = attn_spans(p0, nr, t0, nt, sp);
        /* the next block's keys, and this block's values for the second pass */
        if (t0 + nt < hi)
            prefetch_head_rows((const uint8_t *)kv_k_block(c->kv, c->layer, tab[bi + 1]) + head_off,
                               0, AR_MIN(bt, hi - t0 - nt), row_size, head_row);
        prefetch_head_rows((const uint8_t *)kv_v_block(c->kv, c->layer, tab[bi]) + head_off, in, nt,
                           row_size, head_row);
        for (int j = 0; j < n_sp; j++) {
            size_t v0 = (size_t)sp[j][0] * (size_t)group;
            ops->attn_scores(hd, (sp[j][1] - sp[j][0]) * group, sp[j][2], qt + v0 * (size_t)hd,
                             kb + (size_t)in * row_size + head_off, row_size, kt, scale,
                             scores + v0 * cap + t0, cap);
        }
        t0 += nt;
    }
    for (int i = 0; i < nr; i++) {
        int32_t n_pos = c->b->pos[r0 + i] + 1;
        int32_t first = swa > 0 && n_pos > swa ? n_pos - swa : 0;
        for (int h = 0; h < group; h++) {
            float *sr = scores + (size_t)(i * group + h) * cap;
            memset(sr + lo, 0, (size_t)(first - lo) * sizeof(float));
            ops->softmax(n_pos - first, sr + first);
            memset(sr + n_pos, 0, (size_t)(hi - n_pos) * sizeof(float));
        }
    }
    memset(ot, 0, (size_t)nr * head_bytes);
    for (int32_t t0 = lo; t0 < hi;) {
        int32_t bi = t0 / bt, in = t0 % bt, nt = AR_MIN(bt - in, hi - t0);
        const uint8_t *vb = (const uint8_t *)kv_v_block(c->kv, c->layer, tab[bi]);
        int n_sp = attn_spans(p0, nr, t0, nt, sp);
        for (int j = 0; j < n_sp; j++) {
            size_t v0 = (size_t)sp[j][0] * (size_t)group;
            ops->attn_values(hd, (sp[j][1] - sp[j][0]) * group, sp[j][2], scores + v0 * cap + t0,
                             cap, vb + (size_t)in * row_size + head_off, row_size, kt,
                             ot + v0 * (size_t)hd);
        }
        t0 += nt;
    }
    for (int i = 0; !in_place && i < nr; i++)
        memcpy(c->att + (r0 + i) * n_q + (int64_t)kvh * group * hd, ot + (size_t)i * group * hd,
               head_bytes);
}

/* att[r, head h] = softmax(q·K^T * scale) V over positions 0..pos[r] of row r's sequence;
 * query head h reads KV head h / (n_heads / n_kv_heads). Units are (block of rows, KV head)
 * (see plan_attn_blocks; a block is one decode row or a prefill run): the query heads of a
 * group, and the rows of a prefill block, share each key and value row loaded. Both schedules
 * run these units. */
static void attn_unit(struct model_ctx *c, int ith, int64_t it)
{
    int n_kv = c->m->hp.n_kv_heads;
    int32_t r0 = c->attn_blk[it / n_kv], nr = c->attn_blk[it / n_kv + 1] - r0;
    if (nr == 1 && c->fuse_post) /* decode: no other row of this batch reads its K/V */
        qkv_post_row(c, r0, (int)(it % n_kv), (int)(it % n_kv) + 1);
    attn_rows_item(c, ith, r0, nr, (int)(it % n_kv));
}

static int64_t attn_units(const struct model_ctx *c)
{
    return (int64_t)c->n_attn_blk * c->m->hp.n_kv_heads;
}

static void stage_attn(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    int64_t i0, i1, n_items = attn_units(c);
    (void)nth;
    /* last units first: a prefill's later blocks see the most positions, so the claims that
     * end the stage are its shortest and the threads finish together */
    while (claim(c, n_items, AR_MAX(1, n_items / (8 * c->nth)), &i0, &i1))
        for (int64_t it = i0; it < i1; it++)
            attn_unit(c, ith, n_items - 1 - it);
}

/* ---- matmul stage -------------------------------------------------------------------- */

/* Weight rows per matmul unit with n_cols input rows. With up to MM_FEW_COLS rows a gemm call's
 * fixed costs (preparing every input row's blocks) weigh more against its few products, so
 * large matrices take longer calls, while there are still MM_FEW_UNITS units per thread to
 * share out. Multiples of 16 rows (the lane kernels' width). */
#define MM_FEW_UNITS 16
#define MM_FEW_MAX_ROWS 1024
static int64_t mm_call_rows(const struct model_mat *w, int n_cols, int nth)
{
    int64_t r;
    if (n_cols > MM_FEW_COLS)
        return MM_MANY_ROWS;
    r = (w->n_out / ((int64_t)MM_FEW_UNITS * nth) + 15) / 16 * 16;
    return AR_MIN(AR_MAX(r, MM_CALL_ROWS), MM_FEW_MAX_ROWS);
}

/* Rows [i, i + nr) of w (i a multiple of 16 where w is packed) times nc input rows x: from
 * the packed copy when this context's kernels can read it (a context may run another table
 * than the one the model was packed for), else from the file's layout. */
static void mat_gemm(const struct model_ctx *c, const struct model_mat *w, int64_t i, int nr, int nc,
                     const void *x, size_t x_row, float *y, size_t ldy)
{
    if (w->packed && c->ops->gemm_packed[w->type]) {
        assert(i % KERNELS_PACK_ROWS == 0);
        c->ops->gemm_packed[w->type]((int)w->n_in, nr, nc,
                                     (const uint8_t *)w->packed +
                                         kernels_packed_offset(w->type, w->n_in, i),
                                     x, x_row, y, ldy);
    } else {
        c->ops->gemm[w->type]((int)w->n_in, nr, nc, (const uint8_t *)w->data + (size_t)i * w->row_size,
                              w->row_size, x, x_row, y, ldy);
    }
}

/* Work unit u of the running matmul stage: blocks of mm_call weight rows times mm_cspan input
 * rows, numbered across the stage's matrices, the input spans of one block of weight rows next
 * to each other (see run_mm_stage). Its item, weight rows [*i, *i + *nr), input rows
 * [*j0, *j1) of *x (*x_row bytes apart). */
static const struct mm_item *mm_unit(const struct model_ctx *c, int64_t u, int64_t *i, int *nr,
                                     int *j0, int *j1, const void **x, size_t *x_row)
{
    const int64_t *units = c->mm_units, *call = c->mm_call, *cspan = c->mm_cspan;
    int k = 0;
    while (u >= units[k + 1])
        k++;
    const struct mm_item *it = &c->mm[k];
    int cols = it->x ? it->n_cols : c->n_rows;
    int64_t spans = (cols + cspan[k] - 1) / cspan[k];
    u -= units[k];
    *i = u / spans * call[k];
    *nr = (int)AR_MIN(call[k], it->w->n_out - *i);
    *j0 = (int)(u % spans * cspan[k]);
    *j1 = (int)AR_MIN(*j0 + cspan[k], cols);
    *x = it->x ? it->x : c->mm_x;
    *x_row = it->x ? it->x_row : c->mm_x_row;
    return it;
}

static void stage_matmul(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    int64_t u0, u1;
    (void)ith, (void)nth;
    while (claim(c, c->mm_units[c->n_mm], 1, &u0, &u1)) {
        int64_t i;
        int nr, j0, j1;
        const void *x;
        size_t x_row;
        const struct mm_item *it = mm_unit(c, u0, &i, &nr, &j0, &j1, &x, &x_row);
        for (int j = j0; j < j1; j += MM_TILE_COLS) {
            int nc = AR_MIN(MM_TILE_COLS, j1 - j);
            mat_gemm(c, it->w, i, nr, nc, (const uint8_t *)x + (size_t)j * x_row, x_row,
                     it->out + (size_t)j * it->ldy + i, it->ldy);
        }
    }
}

/* One fused gate/up work unit (stage_gu) on thread ith: weight rows [i, i + nr)
 * of wg and wu times input rows [j0, j1) of x, tile by tile into the thread's scratch, then
 * act(gate) * up into elements [i, i + nr) of row j of dst (dst_row bytes apart), converted to
 * vt (floats where vt is F32). */
static void gu_unit(const struct model_ctx *c, int ith, const struct model_mat *wg,
                    const struct model_mat *wu, int64_t i, int nr, int j0, int j1, const void *x,
                    size_t x_row, enum ar_type vt, uint8_t *dst, size_t dst_row)
{
    size_t ld = (size_t)out_ld(MM_MANY_ROWS);
    float *tg = c->gu_tile + (size_t)ith * (2 * MM_TILE_COLS + 1) * ld;
    float *tu = tg + MM_TILE_COLS * ld, *th = tu + MM_TILE_COLS * ld;
    for (int j = j0; j < j1; j += MM_TILE_COLS) {
        int nc = AR_MIN(MM_TILE_COLS, j1 - j);
        const uint8_t *xj = (const uint8_t *)x + (size_t)j * x_row;
        mat_gemm(c, wg, i, nr, nc, xj, x_row, tg, ld);
        mat_gemm(c, wu, i, nr, nc, xj, x_row, tu, ld);
        for (int r = 0; r < nc; r++) {
            uint8_t *d = dst + (size_t)(j + r) * dst_row;
            float *h = vt == AR_TYPE_F32 ? (float *)(void *)d + i : th;
            model_act_mul(c->ops, c->m->hp.act, nr, h, tg + (size_t)r * ld, tu + (size_t)r * ld);
            if (vt != AR_TYPE_F32)
                c->ops->from_float[vt](h, d + ar_type_row_size(vt, i), nr);
        }
    }
}

/* The gate and up products of an FFN and what follows them, fused per work unit: for each
 * tile of input rows a unit's gate and up outputs go to this thread's tiles, their activation
 * product straight into the down projection's input (gu_dst, converted to gu_vt; floats where
 * that input stays float), row j of item it at row it->p0 + j. The stage's items are a dense
 * FFN's gate matrix (one item), or a mixture's chosen experts' gate matrices (units of
 * MM_MANY_ROWS rows; their pairs' rows of moe_gate and moe_up are never read or written);
 * w_up is the up matrix of the same shape. The outputs of a unit are elements [i, i + nr) of
 * each row, i a multiple of the down input's block size (gu_fusable, moe_gu_fusable), so each
 * block is converted from the same floats as a whole row's conversion would see: the bits are
 * those of the unfused pass. Without it the gate and up outputs (n_ff floats a row each) went
 * out to memory and came back twice, for the product and then for its conversion. */
static void stage_gu(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    int64_t u0, u1;
    (void)nth;
    while (claim(c, c->mm_units[c->n_mm], 1, &u0, &u1)) {
        int64_t i;
        int nr, j0, j1;
        const void *x;
        size_t x_row;
        const struct mm_item *it = mm_unit(c, u0, &i, &nr, &j0, &j1, &x, &x_row);
        gu_unit(c, ith, it->w, it->w_up, i, nr, j0, j1, x, x_row, c->gu_vt,
                c->gu_dst + (size_t)it->p0 * c->gu_row, c->gu_row);
    }
}

/* Input rows per matmul unit: all of them, unless the matrix has too few blocks of weight rows
 * to give every thread MM_UNITS_PER_THREAD units; then spans of whole MM_TILE_COLS tiles, as
 * long as needed for that. A thread's last claim ends a stage while the others may already
 * wait: one unit in eight per thread costs at most 1/16 of the stage on average, where a
 * 896-row matrix cut in 7 blocks of 128 rows for 2 threads kept one of them idle for 1/8. The
 * weight rows of a unit are read once per unit, so more spans read them more often (from L3 or
 * memory, a small share of prefill's work per byte). */
#define MM_UNITS_PER_THREAD 8
static int64_t mm_col_span(int64_t row_units, int n_cols, int nth, bool even)
{
    int64_t tiles = (n_cols + MM_TILE_COLS - 1) / MM_TILE_COLS, want = MM_UNITS_PER_THREAD * nth;
    int64_t spans = nth > 1 ? AR_MIN(tiles, (want + row_units - 1) / row_units) : 1;
    /* even: a stage of one item (a dense FFN's stage_gu) takes more spans where that makes
     * its units a multiple of the thread count; on 2 threads the 19 units of a 4864-row FFN
     * had left one thread a whole unit (1/19 of the stage) alone at the end */
    for (int64_t s = spans; even && s < tiles && s < 2 * spans + 2; s++)
        if (row_units * s % nth == 0) {
            spans = s;
            break;
        }
    int64_t per = (tiles + spans - 1) / spans;
    return AR_MAX(per, 1) * MM_TILE_COLS;
}

/* Runs the n items (at most mm_max) as one matmul stage (fn: stage_matmul, or stage_gu):
 * numbers their work units. */
static void run_mm_stage(struct model_ctx *c, const struct mm_item *items, int n, ar_pool_fn fn)
{
    assert(n <= c->mm_max);
    c->mm = items;
    c->n_mm = n;
    c->mm_units[0] = 0;
    for (int k = 0; k < n; k++) {
        int cols = items[k].x ? items[k].n_cols : c->n_rows;
        int64_t row_units;
        /* stage_gu's units are whole tiles of its per-thread scratch (for a dense FFN
         * gu_fusable made sure mm_call_rows says so) */
        c->mm_call[k] = fn == stage_gu ? MM_MANY_ROWS : mm_call_rows(items[k].w, cols, c->nth);
        row_units = (items[k].w->n_out + c->mm_call[k] - 1) / c->mm_call[k];
        c->mm_cspan[k] = mm_col_span(row_units, cols, c->nth, fn == stage_gu && n == 1);
        c->mm_units[k + 1] =
            c->mm_units[k] + row_units * ((cols + c->mm_cspan[k] - 1) / c->mm_cspan[k]);
    }
    run_stage(c, fn);
}

/* Sets the conversion fields for input rows src (n elements each) to type t. */
static void set_conv(struct model_ctx *c, const float *src, int64_t n, enum ar_type t)
{
    c->conv_src = src;
    c->conv_n = n;
    c->conv_type = t;
}

/* Records that act now holds src converted to t (after a stage with conversion ran). */
static void note_act(struct model_ctx *c, const float *src, enum ar_type t)
{
    c->act_src = t == AR_TYPE_F32 ? NULL : src;
    c->act_type = t;
}

/* Points mm_x at the c->n_rows input rows in (n_in floats each) as type vt, converting them
 * into act unless act holds them already. */
static void mm_input(struct model_ctx *c, const float *in, int64_t n_in, enum ar_type vt)
{
    if (vt == AR_TYPE_F32) {
        c->mm_x = in;
        c->mm_x_row = (size_t)n_in * sizeof(float);
        return;
    }
    if (c->act_src != in || c->act_type != vt) {
        set_conv(c, in, n_in, vt);
        run_small_stage(c, stage_convert);
        note_act(c, in, vt);
    }
    c->mm_x = c->act;
    c->mm_x_row = c->act_row; /* converted rows sit act_row bytes apart */
}

/* out_k = W_k · in for each item, over c->n_rows input rows of n_in floats. Items that
 * consume the same activation type share one conversion and one pool run. */
static void run_matmuls(struct model_ctx *c, const float *in, const struct mm_item *items,
                        int n_items)
{
    int k = 0;
    while (k < n_items) {
        enum ar_type vt = items[k].w->vec_type;
        int e = k + 1;
        while (e < n_items && items[e].w->vec_type == vt)
            e++;
        mm_input(c, in, items[k].w->n_in, vt);
        run_mm_stage(c, items + k, e - k, stage_matmul);
        k = e;
    }
}

/* Whether layer L's gate and up products take the fused stage (stage_gu) in this pass: a
 * dense FFN, a batch large enough for units of MM_MANY_ROWS weight rows, and those units
 * whole blocks of the down projection's input type. */
static bool gu_fusable(const struct model_ctx *c, const struct model_layer *L)
{
    const struct model_mat *g = &L->wgate, *u = &L->wup;
    int bs = ar_type_info(L->wdown.vec_type)->block_size;
    return c->gu_tile && !L->exp_gate && g->data && u->data && g->vec_type == u->vec_type &&
           g->n_in == u->n_in && g->n_out == u->n_out && g->n_out == L->wdown.n_in &&
           mm_call_rows(g, c->n_rows, c->nth) == MM_MANY_ROWS && bs > 0 && MM_MANY_ROWS % bs == 0;
}

/* Whether layer L's mixture takes the fused gate/up stage (stage_gu) in this pass: a
 * batch larger than MM_FEW_COLS rows, gate and up of one input type, and units of
 * MM_MANY_ROWS rows whole blocks of the down projections' input type (set in conv_type). */
static bool moe_gu_fusable(const struct model_ctx *c, const struct model_layer *L)
{
    int bs = ar_type_info(c->conv_type)->block_size;
    return c->gu_tile && c->n_rows > MM_FEW_COLS &&
           L->exp_gate[0].vec_type == L->exp_up[0].vec_type && bs > 0 && MM_MANY_ROWS % bs == 0;
}

/* Sorted pairs [p0, p1): hid = act(gate) * up, converted for the down projections into
 * moe_dst. */
static void stage_moe_act(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    const struct model_hparams *hp = &c->m->hp;
    int64_t n = hp->n_ff_exp, p0, p1;
    enum ar_type vt = c->conv_type;
    size_t row = vt == AR_TYPE_F32 ? (size_t)n * sizeof(float) : c->act_row;
    (void)ith, (void)nth;
    while (claim(c, c->moe_pairs, AR_MAX(1, c->moe_pairs / (4 * c->nth)), &p0, &p1)) {
        for (int64_t p = p0; p < p1; p++) {
            float *g = c->moe_gate + p * c->ffe_ld; /* act(gate) * up in place of gate */
            model_act_mul(c->ops, hp->act, (int)n, g, g, c->moe_up + p * c->ffe_ld);
            if (vt == AR_TYPE_F32)
                memcpy(c->moe_dst + (size_t)p * row, g, (size_t)n * sizeof(float));
            else
                c->ops->from_float[vt](g, c->moe_dst + (size_t)p * row, n);
        }
    }
}

/* Rows' routing: each row's chosen experts and their weights from its router logits. */
static void stage_moe_route(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    const struct model_hparams *hp = &c->m->hp;
    int64_t ne = hp->n_expert, k = hp->n_expert_used, r0, r1;
    (void)ith, (void)nth;
    while (claim(c, c->n_rows, row_chunk(c), &r0, &r1))
        for (int64_t r = r0; r < r1; r++)
            model_moe_route(c->ops, hp, c->moe_logits + r * ne, c->moe_sel + r * k,
                            c->moe_w + r * k);
}

/* Sorted pairs' inputs: the row of xn of each (as moe_vt, from act when converted) copied to
 * its sorted position in moe_dst. */
static void stage_moe_gather(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    int64_t n = c->m->hp.n_embd, k = c->m->hp.n_expert_used, p0, p1;
    bool f32 = c->moe_vt == AR_TYPE_F32;
    size_t row = f32 ? (size_t)n * sizeof(float) : c->act_row;
    const uint8_t *src = f32 ? (const uint8_t *)c->xn : c->act;
    (void)ith, (void)nth;
    while (claim(c, c->moe_pairs, AR_MAX(1, c->moe_pairs / (4 * c->nth)), &p0, &p1))
        for (int64_t p = p0; p < p1; p++)
            memcpy(c->moe_dst + (size_t)p * row, src + (size_t)(c->moe_order[p] / k) * row, row);
}

/* Rows' outputs: the weighted sum of their experts' outputs (model_moe_combine). */
static void stage_moe_combine(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    const struct model_hparams *hp = &c->m->hp;
    int64_t k = hp->n_expert_used, r0, r1;
    const float *outs[MODEL_MAX_EXPERTS_USED];
    (void)ith, (void)nth;
    while (claim(c, c->n_rows, row_chunk(c), &r0, &r1))
        for (int64_t r = r0; r < r1; r++) {
            for (int64_t j = 0; j < k; j++)
                outs[j] = c->moe_down + (size_t)c->moe_pos[r * k + j] * (size_t)c->embd_ld;
            model_moe_combine(hp, outs, c->moe_w + r * k, c->proj + r * c->embd_ld);
        }
}

/* Gathers every sorted pair's input row, as type vt, into dst (stage_moe_gather). */
static void moe_gather(struct model_ctx *c, uint8_t *dst, enum ar_type vt)
{
    c->moe_dst = dst;
    c->moe_vt = vt;
    run_small_stage(c, stage_moe_gather);
}

/* proj[r] = sum over row r's chosen experts j (best first) of w[r, j] * down_j(act(gate_j
 * xn[r]) * up_j xn[r]). The step's (row, expert) pairs are sorted by expert, so each chosen
 * expert's matrices are read once per step, not once per row, and all experts run in one
 * stage for gate/up and one for down. The sum runs in the same order for every row whatever
 * the grouping, so a row's result does not depend on the rest of the batch. */
static void run_moe(struct model_ctx *c, const struct model_layer *L)
{
    const struct model_hparams *hp = &c->m->hp;
    int n_rows = c->n_rows, ne = hp->n_expert, k = hp->n_expert_used, n_items = 0;
    int n_pairs = n_rows * k;
    bool fuse;
    int64_t n_embd = hp->n_embd, n_ff = hp->n_ff_exp;
    enum ar_type vt_g = L->exp_gate[0].vec_type, vt_u = L->exp_up[0].vec_type;
    enum ar_type vt_d = L->exp_down[0].vec_type;
    struct mm_item route = {.w = &L->router, .out = c->moe_logits, .ldy = (size_t)ne};

    run_matmuls(c, c->xn, &route, 1);
    run_small_stage(c, stage_moe_route);
    /* counting sort of the pairs by expert (stable: within an expert, by row) */
    memset(c->moe_start, 0, (size_t)(ne + 1) * sizeof(*c->moe_start));
    for (int i = 0; i < n_pairs; i++)
        c->moe_start[c->moe_sel[i] + 1]++;
    for (int e = 0; e < ne; e++)
        c->moe_start[e + 1] += c->moe_start[e];
    for (int i = 0; i < n_pairs; i++) {
        int p = c->moe_start[c->moe_sel[i]]++; /* advances to the expert's end */
        c->moe_order[p] = i;
        c->moe_pos[i] = p;
    }
    for (int e = ne; e > 0; e--) /* back to each expert's start */
        c->moe_start[e] = c->moe_start[e - 1];
    c->moe_start[0] = 0;

    /* gate/up inputs: each pair's row of xn in the experts' activation type(s) */
    if (vt_g != AR_TYPE_F32 || vt_u != AR_TYPE_F32) {
        enum ar_type vt = vt_g != AR_TYPE_F32 ? vt_g : vt_u;
        set_conv(c, c->xn, n_embd, vt);
        run_small_stage(c, stage_convert);
        note_act(c, c->xn, vt);
    }
    c->moe_pairs = n_pairs;
    moe_gather(c, c->moe_act, vt_g);
    if (vt_u != vt_g) {
        if (vt_g != AR_TYPE_F32 && vt_u != AR_TYPE_F32) {
            set_conv(c, c->xn, n_embd, vt_u);
            run_small_stage(c, stage_convert);
            note_act(c, c->xn, vt_u);
        }
        moe_gather(c, c->moe_act_up, vt_u);
    }
    set_conv(c, NULL, n_ff, vt_d); /* the down projections' input type */
    fuse = moe_gu_fusable(c, L);
    for (int e = 0; e < ne; e++) {
        int p0 = c->moe_start[e], cnt = c->moe_start[e + 1] - p0;
        size_t rg = vt_g == AR_TYPE_F32 ? (size_t)n_embd * 4 : c->act_row;
        size_t ru = vt_u == AR_TYPE_F32 ? (size_t)n_embd * 4 : c->act_row;
        const uint8_t *xu = vt_u == vt_g ? c->moe_act : c->moe_act_up;
        if (cnt == 0)
            continue;
        c->moe_items[n_items++] = (struct mm_item){.w = &L->exp_gate[e],
                                                   .out = c->moe_gate + p0 * c->ffe_ld,
                                                   .ldy = (size_t)c->ffe_ld,
                                                   .x = c->moe_act + p0 * rg,
                                                   .x_row = rg,
                                                   .n_cols = cnt,
                                                   .w_up = &L->exp_up[e],
                                                   .p0 = p0};
        if (!fuse)
            c->moe_items[n_items++] = (struct mm_item){.w = &L->exp_up[e],
                                                       .out = c->moe_up + p0 * c->ffe_ld,
                                                       .ldy = (size_t)c->ffe_ld,
                                                       .x = xu + p0 * ru,
                                                       .x_row = ru,
                                                       .n_cols = cnt};
    }
    if (fuse) {
        /* act(gate) * up straight into the down projections' input: moe_act_up, unused here
         * since gate and up share their input */
        c->moe_dst = c->moe_act_up;
        c->gu_dst = c->moe_dst;
        c->gu_vt = vt_d;
        c->gu_row = vt_d == AR_TYPE_F32 ? (size_t)n_ff * sizeof(float) : c->act_row;
        run_mm_stage(c, c->moe_items, n_items, stage_gu);
        c->gu_fused++;
    } else {
        run_mm_stage(c, c->moe_items, n_items, stage_matmul);
        /* act(gate) * up, as the down projections' input, in place of the spent gate/up
         * inputs */
        c->moe_dst = c->moe_act;
        run_small_stage(c, stage_moe_act);
    }
    c->act_src = NULL;
    n_items = 0;
    for (int e = 0; e < ne; e++) {
        int p0 = c->moe_start[e], cnt = c->moe_start[e + 1] - p0;
        size_t rd = vt_d == AR_TYPE_F32 ? (size_t)n_ff * 4 : c->act_row;
        if (cnt == 0)
            continue;
        c->moe_items[n_items++] = (struct mm_item){.w = &L->exp_down[e],
                                                   .out = c->moe_down + p0 * c->embd_ld,
                                                   .ldy = (size_t)c->embd_ld,
                                                   .x = c->moe_dst + p0 * rd,
                                                   .x_row = rd,
                                                   .n_cols = cnt};
    }
    run_mm_stage(c, c->moe_items, n_items, stage_matmul);
    run_small_stage(c, stage_moe_combine);
}

/* Moves the residual and attention rows listed in out_rows (ascending) to the front and
 * shrinks the row count: the rest of the last layer and the output run on those only. */
static void compact_rows(struct model_ctx *c, int n_out)
{
    const struct model_hparams *hp = &c->m->hp;
    size_t n_q = (size_t)hp->n_heads * (size_t)hp->head_dim;
    for (int j = 0; j < n_out; j++) {
        int r = c->out_rows[j];
        if (r == j)
            continue;
        memmove(c->x + (size_t)j * hp->n_embd, c->x + (size_t)r * hp->n_embd,
                (size_t)hp->n_embd * sizeof(float));
        memmove(c->att + (size_t)j * n_q, c->att + (size_t)r * n_q, n_q * sizeof(float));
    }
    c->n_rows = n_out;
}

/* ---- the pass ----------------------------------------------------------------------------
 * One list of phases, run in order by both schedules. A phase is parallel work: matmul units
 * (a run of one matrix's weight rows against every input row) or attention items (row, KV
 * head). Layer l has the phases p = l * PH_PER_LAYER + k, k in
 *   PH_QKV   q, k, v = Wq, Wk, Wv · xn                  (n_heads, n_kv_heads, n_kv_heads × hd)
 *   PH_ATTN  att = softmax(q·K^T / sqrt(hd)) V per query head over its row's visible positions
 *   PH_WO    proj = Wo · att                             (n_embd)
 *   PH_GU    gate, up = Wgate, Wup · xn                  (n_ff; mixture of experts: run_moe)
 *   PH_DOWN  proj = Wdown · hid                          (n_embd; none after run_moe)
 * and the last phase, PH_OUT = n_layers * PH_PER_LAYER, is logits = Woutput · xn.
 * Each phase ends in its tail: row work (tail_rows) that makes the next phase's input:
 *   head     x = embedding (× embd_scale); xn = rmsnorm(x) * attn_norm[0]
 *   QKV      biases, q/k norms, RoPE, K/V rows written (unless the attention items do it)
 *   ATTN     (last layer: only the rows that produce logits go on)
 *   WO       x += post_attn(proj); xn = rmsnorm(x) * ffn_norm
 *   GU       hid = act(gate) * up
 *   DOWN     x += post_ffn(proj); xn = rmsnorm(x) * (next layer's attn_norm, or output_norm)
 * each followed by the conversion of that input into the activation type of the next phase's
 * matrices. In a large batch of a dense FFN, GU's tail happens inside its matmul units instead
 * (stage_gu): same operations, done while the unit's outputs are still in cache. */

static int ph_out(const struct model_ctx *c)
{
    return c->ph_count - 1;
}

static const struct model_layer *ph_layer(const struct model_ctx *c, int p)
{
    int l = p < 0 ? 0 : p / PH_PER_LAYER;
    return &c->m->layers[AR_MIN(l, c->m->hp.n_layers - 1)];
}

/* The matmuls of phase p (none for attention, and for the FFN of a mixture of experts, which
 * run_moe computes); returns their count. */
static int ph_mats(const struct model_ctx *c, int p, struct mm_item *it)
{
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = ph_layer(c, p);
    if (p == ph_out(c)) {
        it[0] = (struct mm_item){.w = &m->output, .out = c->logits, .ldy = (size_t)hp->n_vocab};
        return 1;
    }
    switch (p % PH_PER_LAYER) {
    case PH_QKV:
        it[0] = (struct mm_item){.w = &L->wq, .out = c->q, .ldy = (size_t)c->q_ld};
        it[1] = (struct mm_item){.w = &L->wk, .out = c->k, .ldy = (size_t)c->kv_ld};
        it[2] = (struct mm_item){.w = &L->wv, .out = c->v, .ldy = (size_t)c->kv_ld};
        return 3;
    case PH_WO:
        it[0] = (struct mm_item){.w = &L->wo, .out = c->proj, .ldy = (size_t)c->embd_ld};
        return 1;
    case PH_GU:
        if (L->exp_gate)
            return 0;
        it[0] = (struct mm_item){.w = &L->wgate, .out = c->gate, .ldy = (size_t)c->ff_ld};
        it[1] = (struct mm_item){.w = &L->wup, .out = c->up, .ldy = (size_t)c->ff_ld};
        return 2;
    case PH_DOWN:
        if (L->exp_gate)
            return 0;
        it[0] = (struct mm_item){.w = &L->wdown, .out = c->proj, .ldy = (size_t)c->embd_ld};
        return 1;
    default:
        return 0;
    }
}

/* The input rows of phase p's matrices: src (n floats per row), wanted as type *t (that of
 * the first matrix; a mixture of experts: its router's). False when p has no matrix input. */
static bool ph_input(const struct model_ctx *c, int p, const float **src, int64_t *n,
                     enum ar_type *t)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct model_layer *L = ph_layer(c, p);
    if (p == ph_out(c)) {
        *src = c->xn, *n = hp->n_embd, *t = c->m->output.vec_type;
        return true;
    }
    switch (p % PH_PER_LAYER) {
    case PH_QKV:
        *src = c->xn, *n = hp->n_embd, *t = L->wq.vec_type;
        return true;
    case PH_WO:
        *src = c->att, *n = (int64_t)hp->n_heads * hp->head_dim, *t = L->wo.vec_type;
        return true;
    case PH_GU:
        *src = c->xn, *n = hp->n_embd, *t = L->exp_gate ? L->router.vec_type : L->wgate.vec_type;
        return true;
    case PH_DOWN:
        *src = c->hid, *n = hp->n_ff, *t = L->wdown.vec_type;
        return !L->exp_gate;
    default:
        return false;
    }
}

/* Tail of phase p (PH_HEAD: the head) on rows [r0, r1); see "the pass". */
static void tail_rows(struct model_ctx *c, int p, int64_t r0, int64_t r1)
{
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = ph_layer(c, p);
    int l = p < 0 ? -1 : p / PH_PER_LAYER, k = p < 0 ? PH_DOWN : p % PH_PER_LAYER;
    int64_t n = hp->n_embd, f = hp->n_ff;
    const float *src;
    int64_t src_n;
    enum ar_type t;

    for (int64_t r = r0; r < r1; r++) {
        float *x = c->x + r * n, *xn = c->xn + r * n;
        if (p < 0) { /* the head */
            const struct model_mat *e = &m->tok_embd;
            const uint8_t *row = (const uint8_t *)e->data + (size_t)c->b->tokens[r] * e->row_size;
            c->ops->to_float[e->type](row, x, n);
            embed_scale(m, x);
            rope_table_row(c, r);
            c->ops->rmsnorm((int)n, xn, x, m->layers[0].attn_norm, hp->rms_eps);
            continue;
        }
        switch (k) {
        case PH_QKV:
            if (!c->fuse_post)
                qkv_post_row(c, r, 0, hp->n_kv_heads);
            break;
        case PH_WO:
            add_block_output(c, x, c->proj + r * c->embd_ld, L->post_attn_norm);
            c->ops->rmsnorm((int)n, xn, x, L->ffn_norm, hp->rms_eps);
            break;
        case PH_GU:
            if (!L->exp_gate)
                model_act_mul(c->ops, hp->act, (int)f, c->hid + r * f, c->gate + r * c->ff_ld,
                              c->up + r * c->ff_ld);
            break;
        case PH_DOWN:
            add_block_output(c, x, c->proj + r * c->embd_ld, L->post_ffn_norm);
            c->ops->rmsnorm((int)n, xn, x,
                            l + 1 < hp->n_layers ? m->layers[l + 1].attn_norm : m->output_norm,
                            hp->rms_eps);
            break;
        default:
            break;
        }
    }
    if (ph_input(c, p + 1, &src, &src_n, &t) && t != AR_TYPE_F32)
        for (int64_t r = r0; r < r1; r++)
            c->ops->from_float[t](src + r * src_n, c->act + (size_t)r * c->act_row, src_n);
}

/* The serial part of phase p's tail before its rows: after the last layer's attention only
 * the rows that produce logits go on. Returns false when none does (the pass ends). */
static bool tail_begin(struct model_ctx *c, int p)
{
    if (p == (c->m->hp.n_layers - 1) * PH_PER_LAYER + PH_ATTN && c->n_rows > c->n_out) {
        compact_rows(c, c->n_out); /* K/V are written */
        return c->n_out > 0;
    }
    return true;
}

/* The serial part after phase p's tail rows: phase p + 1's input is ready. */
static void tail_end(struct model_ctx *c, int p)
{
    const float *src;
    int64_t n;
    enum ar_type t;
    if (!ph_input(c, p + 1, &src, &n, &t)) {
        c->act_src = NULL;
        return;
    }
    note_act(c, src, t);
    c->mm_x = t == AR_TYPE_F32 ? (const void *)src : c->act;
    c->mm_x_row = t == AR_TYPE_F32 ? (size_t)n * sizeof(float) : c->act_row;
}

/* ---- large batches: one pool run per phase and per tail ----------------------------------- */

static void stage_tail(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    int64_t r0, r1;
    (void)ith, (void)nth;
    while (claim(c, c->n_rows, row_chunk(c), &r0, &r1))
        tail_rows(c, c->tail_p, r0, r1);
}

/* Tail of phase p (rows split over the pool, or on this thread for a few rows); false when
 * the pass ends there. */
static bool run_tail(struct model_ctx *c, int p)
{
    if (p >= 0 && !tail_begin(c, p))
        return false;
    c->tail_p = p;
    run_small_stage(c, stage_tail);
    tail_end(c, p);
    return true;
}

static void pass_stages(struct model_ctx *c)
{
    struct mm_item it[MM_MAX_MATS];
    run_tail(c, PH_HEAD);
    for (int p = 0; p < c->ph_count; p++) {
        const struct model_layer *L = ph_layer(c, p);
        const float *src;
        int64_t n;
        enum ar_type t;
        int n_mm;
        c->layer = p / PH_PER_LAYER;
        if (p != ph_out(c) && p % PH_PER_LAYER == PH_ATTN)
            run_stage(c, stage_attn);
        else if (p != ph_out(c) && p % PH_PER_LAYER == PH_GU && L->exp_gate)
            run_moe(c, L);
        else if (p != ph_out(c) && p % PH_PER_LAYER == PH_GU && gu_fusable(c, L)) {
            /* the tail's product and conversion happen in the stage: no tail */
            ph_input(c, p, &src, &n, &t);
            mm_input(c, src, n, t);
            ph_mats(c, p, it);
            it[0].w_up = &L->wup;
            it[0].p0 = 0;
            c->gu_vt = L->wdown.vec_type;
            c->gu_dst = c->gu_vt == AR_TYPE_F32 ? (uint8_t *)c->hid : c->act_ff;
            c->gu_row =
                c->gu_vt == AR_TYPE_F32 ? (size_t)c->m->hp.n_ff * sizeof(float) : c->act_row;
            run_mm_stage(c, it, 1, stage_gu);
            c->gu_fused++;
            continue;
        } else if (p != ph_out(c) && p % PH_PER_LAYER == PH_DOWN && gu_fusable(c, L) &&
                   L->wdown.vec_type != AR_TYPE_F32) {
            c->mm_x = c->act_ff; /* stage_gu converted the input */
            c->mm_x_row = c->act_row;
            ph_mats(c, p, it);
            run_mm_stage(c, it, 1, stage_matmul);
        } else if ((n_mm = ph_mats(c, p, it)) > 0 && ph_input(c, p, &src, &n, &t))
            run_matmuls(c, src, it, n_mm);
        if (p == ph_out(c) || !run_tail(c, p))
            return;
    }
}

/* ---- small batches: the pass as one pool job ---------------------------------------------
 * With a few rows a phase is short (tens of microseconds), and a pool rendezvous per phase
 * costs as much as the work. So the pass runs as one job: each phase's items are claimed from
 * its own segments; the thread that completes a phase's last item runs its tail (a few rows:
 * serially) and opens the next phase; a thread with nothing left to claim waits for that.
 * Every item and tail is computed by the same code whichever thread runs it, so results do
 * not depend on the thread count (and equal pass_stages'). */

/* Weight rows per matmul item: small items keep two threads even on a 7-item matrix. */
static int64_t ph_unit_rows(const struct model_mat *w)
{
    return w->n_out > 8192 ? MM_CALL_ROWS : 32;
}

/* The tail of phase p; returns the phase to open next (ph_count: the pass is done). */
static int ph_finish(struct model_ctx *c, int p)
{
    if (p == ph_out(c) || !tail_begin(c, p))
        return c->ph_count;
    tail_rows(c, p, 0, c->n_rows);
    tail_end(c, p);
    return p + 1;
}

/* Claims items of segment sg: from its front when it is the claimer's own (a quarter of what
 * is left, at least one: long gemm calls while much is left, single items at the end), else
 * one item from its back. Returns false when the segment is empty. */
static bool ph_claim_seg(struct ph_seg *sg, bool own, int64_t *i0, int64_t *i1)
{
    uint64_t cur = atomic_load_explicit(&sg->span, memory_order_relaxed);
    for (;;) {
        uint32_t f = (uint32_t)cur, e = (uint32_t)(cur >> 32), k = 1;
        uint64_t nxt;
        if (f >= e)
            return false;
        if (own)
            k = AR_MAX(1u, (e - f) / 4);
        nxt = own ? ((uint64_t)e << 32) | (f + k) : ((uint64_t)(e - 1) << 32) | f;
        if (atomic_compare_exchange_weak_explicit(&sg->span, &cur, nxt, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *i0 = own ? f : e - 1;
            *i1 = own ? f + k : e;
            return true;
        }
    }
}

/* Thread ith's next items [i0, i1) of phase p: its own segment first, then the others. */
static bool ph_claim(struct model_ctx *c, int p, int ith, int64_t *i0, int64_t *i1)
{
    struct ph_seg *segs = c->ph_seg + (size_t)p * (size_t)c->ph_segs;
    int home = ith % c->ph_segs;
    for (int k = 0; k < c->ph_segs; k++) {
        int sgi = (home + k) % c->ph_segs;
        if (ph_claim_seg(&segs[sgi], k == 0 && ith < c->ph_segs, i0, i1))
            return true;
    }
    return false;
}

/* The work items of phase p: matmul units (it, units) or attention items. */
static int64_t ph_items(const struct model_ctx *c, int p, struct mm_item *it, int64_t *units,
                        int *n_mm)
{
    *n_mm = ph_mats(c, p, it);
    units[0] = 0;
    for (int k = 0; k < *n_mm; k++) {
        int64_t rows = ph_unit_rows(it[k].w);
        units[k + 1] = units[k] + (it[k].w->n_out + rows - 1) / rows;
    }
    return *n_mm ? units[*n_mm] : attn_units(c);
}

/* Opens phase p (its items split into segments); the opener then publishes ph_cur = p. */
static void ph_open(struct model_ctx *c, int p)
{
    struct mm_item it[MM_MAX_MATS];
    int64_t units[MM_MAX_MATS + 1];
    int n_mm;
    int64_t n = p < c->ph_count ? ph_items(c, p, it, units, &n_mm) : 0;
    if (p >= c->ph_count)
        return;
    for (int k = 0; k < c->ph_segs; k++) {
        uint64_t f = (uint64_t)(n * k / c->ph_segs), e = (uint64_t)(n * (k + 1) / c->ph_segs);
        atomic_store_explicit(&c->ph_seg[(size_t)p * (size_t)c->ph_segs + (size_t)k].span,
                              (e << 32) | f, memory_order_relaxed);
    }
    atomic_store_explicit(&c->ph_done[p].done, 0, memory_order_relaxed);
    c->layer = p / PH_PER_LAYER;
}

static void stage_pass(void *arg, int ith, int nth)
{
    struct model_ctx *c = arg;
    (void)nth;
    for (;;) {
        int p = atomic_load_explicit(&c->ph_cur, memory_order_acquire);
        struct mm_item it[MM_MAX_MATS];
        int64_t units[MM_MAX_MATS + 1], n_items, u0, u1;
        int n_mm;
        if (p >= c->ph_count)
            return;
        if (ph_claim(c, p, ith, &u0, &u1)) {
            /* phase p is not complete while we hold items: its state is stable */
            n_items = ph_items(c, p, it, units, &n_mm);
            if (n_mm) {
                /* units [u0, u1): one gemm call per matrix they cover */
                for (int k = 0; k < n_mm; k++) {
                    const struct model_mat *w = it[k].w;
                    int64_t rows = ph_unit_rows(w);
                    int64_t a = AR_MAX(u0, units[k]), b = AR_MIN(u1, units[k + 1]);
                    if (a >= b)
                        continue;
                    int64_t i = (a - units[k]) * rows, e = AR_MIN((b - units[k]) * rows, w->n_out);
                    mat_gemm(c, w, i, (int)(e - i), c->n_rows, c->mm_x, c->mm_x_row,
                             it[k].out + i, it[k].ldy);
                }
            } else {
                for (int64_t u = u0; u < u1; u++)
                    attn_unit(c, ith, u);
            }
            if (atomic_fetch_add_explicit(&c->ph_done[p].done, u1 - u0, memory_order_acq_rel) +
                    (u1 - u0) ==
                n_items) {
                int next = ph_finish(c, p);
                ph_open(c, next);
                atomic_store_explicit(&c->ph_cur, next, memory_order_release);
            }
            continue;
        }
        /* nothing left to claim: the thread with the last item opens the next phase */
        for (int spins = 0; atomic_load_explicit(&c->ph_cur, memory_order_acquire) == p; spins++) {
            if (spins < 4096)
                ar_cpu_relax();
            else
                sched_yield();
        }
    }
}

static void pass_phases(struct model_ctx *c)
{
    tail_rows(c, PH_HEAD, 0, c->n_rows);
    tail_end(c, PH_HEAD);
    ph_open(c, 0);
    atomic_store_explicit(&c->ph_cur, 0, memory_order_release);
    ar_pool_run_shared(c->pool, stage_pass, c);
}

/* ---- model_forward ------------------------------------------------------------------------ */

static enum ar_status check_batch(const struct model_ctx *c, const struct kv_cache *kv,
                                  struct kv_seq *const *seqs, const struct model_batch *b,
                                  const float *logits, int *n_out)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct kv_params *kp;
    if (!kv || !b || !seqs || b->n_tokens < 0 || b->n_tokens > c->n_batch_max)
        return AR_EINVAL;
    if (b->n_tokens > 0 && (!b->tokens || !b->pos || !b->seq))
        return AR_EINVAL;
    kp = kv_params(kv);
    if (kp->n_layers != hp->n_layers || kp->n_kv_heads != hp->n_kv_heads ||
        kp->head_dim != hp->head_dim || (kp->type != AR_TYPE_F32 && kp->type != AR_TYPE_F16))
        return AR_EINVAL;
    *n_out = 0;
    for (int r = 0; r < b->n_tokens; r++) {
        const struct kv_seq *s;
        if (b->tokens[r] < 0 || b->tokens[r] >= hp->n_vocab || b->pos[r] < 0 || b->seq[r] < 0 ||
            (b->n_seqs > 0 && b->seq[r] >= b->n_seqs))
            return AR_EINVAL;
        s = seqs[b->seq[r]];
        if (!s || (int64_t)b->pos[r] >= (int64_t)s->n_blocks * kp->block_tokens)
            return AR_EINVAL;
        for (int32_t i = 0; i <= b->pos[r] / kp->block_tokens; i++)
            if (s->blocks[i] < 0 || s->blocks[i] >= kp->n_blocks)
                return AR_EINVAL; /* a table from another cache */
        /* the local blocks of the row's window (sliding layers), released or never taken */
        for (int32_t i = AR_MAX(0, b->pos[r] + 1 - kp->swa_window) / kp->block_tokens;
             kv_has_local(kv) && i <= b->pos[r] / kp->block_tokens; i++)
            if (!s->local || s->local[i] < 0 || s->local[i] >= kp->n_local_blocks)
                return AR_EINVAL;
        if (b->logits ? b->logits[r] != 0 : r == b->n_tokens - 1)
            (*n_out)++;
    }
    if (*n_out > 0 && !logits)
        return AR_EINVAL;
    return AR_OK;
}

enum ar_status model_forward(struct model_ctx *c, struct kv_cache *kv, struct kv_seq *const *seqs,
                             const struct model_batch *b, float *logits)
{
    enum ar_status st;
    int n, n_out;
    int32_t max_pos = 0;
    if (!c)
        return AR_EINVAL;
    if ((st = check_batch(c, kv, seqs, b, logits, &n_out)) != AR_OK)
        return st;
    n = b->n_tokens;
    if (n == 0)
        return AR_OK;
    for (int r = 0; r < n; r++)
        max_pos = AR_MAX(max_pos, b->pos[r]);
    if ((st = ensure_scores(c, (int64_t)max_pos + 1)) != AR_OK)
        return st;

    c->kv = kv;
    c->seqs = seqs;
    c->b = b;
    c->kv_elem = kv_params(kv)->type == AR_TYPE_F32 ? 4 : 2;
    c->n_rows = n;
    c->n_out = n_out;
    c->logits = logits;
    c->act_src = NULL;
    c->gu_fused = 0;
    /* a row's K/V can be written by its own attention item when no other row of the batch
     * belongs to the same sequence */
    c->fuse_post = n <= SMALL_ROWS;
    for (int r = 0; r < n && c->fuse_post; r++)
        for (int r2 = 0; r2 < r; r2++)
            if (b->seq[r2] == b->seq[r])
                c->fuse_post = false;
    for (int r = 0, j = 0; r < n; r++)
        if (b->logits ? b->logits[r] != 0 : r == n - 1)
            c->out_rows[j++] = r;
    plan_attn_blocks(c);

    if (n <= SMALL_ROWS && c->ph_ok)
        pass_phases(c);
    else
        pass_stages(c);
    c->kv = NULL;
    c->seqs = NULL;
    c->b = NULL;
    return AR_OK;
}
