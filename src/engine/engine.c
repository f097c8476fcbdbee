/* engine.c - the serving engine: a bounded two-class request queue, one scheduler thread
 * running continuous batching over one model_ctx, the paged KV cache with the prefix cache,
 * preemption by recomputation when KV runs out, cancellation, timeouts, streaming text with
 * stop strings held back, and statistics.
 *
 * Policies: a bulk request is "waiting too long" when it has been in the queue (since it last
 * entered it: submit or preemption) longer than bulk_max_wait_s. A request is admitted only
 * when KV blocks for all its known tokens (minus the cached prefix) are free or evictable,
 * plus one spare block while others run; decode blocks are taken one at a time, evicting
 * cached prefix blocks first and then preempting (lowest priority, newest admission first).
 * The prefix cache is keyed on token ids only: one engine serves one model.
 * Sliding-window models also have a local pool (kv.h) for their sliding layers: a sequence
 * takes local blocks step by step for the rows it computes and releases them once behind
 * every window (kv_seq_slide), so it holds about window / block_tokens + 1 of them; a
 * shortage evicts the prefix cache's local blocks, then skips or preempts.
 *
 * Locking: e->mu guards the queues, the running array, the cancel flags and the stats. The
 * scheduler thread alone touches the KV cache, the prefix cache, samplers, text buffers and
 * the model; it never holds e->mu while running the model or a callback. */
#include "engine.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "base/deadline.h"

/* ---- requests ---------------------------------------------------------------------------- */

struct req {
    uint64_t id;
    enum engine_priority prio;
    struct req *prev, *next; /* links in its priority queue while queued */

    int32_t *tokens; /* owned, (cap): prompt then generated tokens */
    int n_prompt;
    int n_tok; /* prompt + generated so far */
    int cap;   /* min(n_prompt + max_tokens, n_ctx) */
    int max_tokens;
    struct sampler_params sp;
    struct sampler *smp; /* owned; created at the first admission, kept across preemption */
    bool ignore_eos;
    bool cache_generated; /* register generated blocks too */
    char **stop; /* owned, (n_stop) owned strings */
    int n_stop;
    engine_token_fn on_token;
    engine_done_fn on_done;
    void *user;

    double t_submit, t_queued, t_admit, t_first;
    double deadline; /* 0: none */
    bool admitted_once;
    bool cancel; /* under e->mu */

    /* generated text: text[0, sent) was passed to on_token; text[sent, text.n) is held
     * back (a possible start of a stop string) */
    struct tokenizer_stream ts;
    struct ar_buf text; /* text.s owned, NUL-terminated once anything was appended */
    size_t sent;
    bool text_cut; /* a stop string ended the text: nothing more is emitted */

    /* while running */
    struct kv_seq kv;
    int n_past;          /* positions [0, n_past) have K/V in kv */
    int n_fill;          /* tokens known at admission: full blocks below are registered */
    uint64_t pc_parent;  /* prefix-cache handle of block n_reg - 1 */
    int n_reg;           /* leading blocks registered in (or matched from) the prefix cache */
    bool reg_off;        /* no (more) registration for this admission */
    uint64_t admit_seq;  /* admission order, for choosing a preemption victim */
    int n_cached;
    int n_preempted;
    /* this step */
    int b_rows;
    int b_logits; /* index of its logits row, -1: none */
};

struct req_queue {
    struct req *head, *tail;
    int n;
};

struct engine {
    const struct model *m;        /* borrowed */
    const struct tokenizer *tok;  /* borrowed */
    struct engine_params p;
    int n_vocab;     /* the model's (logits) */
    int n_vocab_tok; /* the tokenizer's, <= n_vocab */
    int n_ctx;

    struct kv_cache *kv;
    struct kv_prefix *pc; /* NULL when the prefix cache is off */
    struct ar_pool *pool;
    struct model_ctx *mctx;

    /* one step's batch, (n_batch) rows; sequences and logits (n_seq_max) */
    int32_t *b_tok, *b_pos, *b_seq;
    uint8_t *b_want;
    struct kv_seq **b_seqs;
    struct req **b_reqs;
    float *logits;

    pthread_t thread;
    bool thread_started;
    bool mu_init, cv_init;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;

    /* under mu */
    struct req_queue q[ENGINE_PRIO_COUNT];
    struct req **run; /* (n_seq_max) in admission order */
    int n_run;
    uint64_t next_id;
    uint64_t next_admit;
    struct engine_stats st;
};

static double now_s(void)
{
    return ar_time_s();
}

static void queue_push_tail(struct req_queue *q, struct req *r)
{
    r->next = NULL;
    r->prev = q->tail;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->n++;
}

static void queue_push_head(struct req_queue *q, struct req *r)
{
    r->prev = NULL;
    r->next = q->head;
    if (q->head)
        q->head->prev = r;
    else
        q->tail = r;
    q->head = r;
    q->n++;
}

static void queue_remove(struct req_queue *q, struct req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        q->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        q->tail = r->prev;
    r->prev = r->next = NULL;
    q->n--;
}

static void req_free(struct req *r)
{
    if (!r)
        return;
    sampler_destroy(r->smp);
    tokenizer_stream_fini(&r->ts);
    for (int i = 0; i < r->n_stop; i++)
        ar_free(r->stop[i]);
    ar_free(r->stop);
    ar_free(r->tokens);
    ar_free(r->text.s);
    ar_free(r);
}

/* ---- stats (call with mu held) ---------------------------------------------------------- */

static void publish_locked(struct engine *e)
{
    e->st.queued[ENGINE_PRIO_INTERACTIVE] = e->q[ENGINE_PRIO_INTERACTIVE].n;
    e->st.queued[ENGINE_PRIO_BULK] = e->q[ENGINE_PRIO_BULK].n;
    e->st.running = e->n_run;
    e->st.kv_blocks_total = kv_params(e->kv)->n_blocks;
    e->st.kv_blocks_used = e->st.kv_blocks_total - kv_n_free(e->kv);
    e->st.kv_blocks_cached = e->pc ? kv_prefix_n_evictable(e->pc) : 0;
    e->st.kv_local_blocks_total = kv_pool_n_blocks(e->kv, KV_POOL_LOCAL);
    e->st.kv_local_blocks_used =
        e->st.kv_local_blocks_total - kv_pool_n_free(e->kv, KV_POOL_LOCAL);
}

static void run_remove_locked(struct engine *e, struct req *r)
{
    for (int i = 0; i < e->n_run; i++) {
        if (e->run[i] != r)
            continue;
        memmove(&e->run[i], &e->run[i + 1], (size_t)(e->n_run - i - 1) * sizeof(*e->run));
        e->n_run--;
        return;
    }
}

/* ---- text ------------------------------------------------------------------------------- */

static enum ar_status text_append(struct req *r, const char *s, size_t n)
{
    ar_buf_put(&r->text, s, n);
    return r->text.oom ? AR_ENOMEM : AR_OK;
}

/* Decides what of text[sent, text.n) can be sent: everything up to a stop string (which
 * then cuts the text), or all but a tail that may still become one. final: no more text will
 * follow, so nothing is held back. Returns the number of bytes released at text + *from. */
static size_t text_release(struct req *r, bool final, size_t *from)
{
    size_t n = r->text.n - r->sent, out;
    *from = r->sent;
    if (r->n_stop > 0 && n > 0) {
        struct sampler_stop_match m;
        sampler_stop_find(r->text.s + r->sent, n, (const char *const *)r->stop, (size_t)r->n_stop,
                          &m);
        if (m.found) {
            r->text.n = r->sent + m.pos;
            r->text.s[r->text.n] = '\0';
            r->text_cut = true;
            out = m.pos;
        } else {
            out = final ? n : n - m.hold_len;
        }
    } else {
        out = n;
    }
    r->sent += out;
    return out;
}

/* ---- finishing ---------------------------------------------------------------------------- */

/* Ends r: frees its KV (if running) and publishes that, flushes held-back text through
 * on_token (token -1), then calls on_done and frees r. Scheduler thread, mu not held. */
static void finish(struct engine *e, struct req *r, enum engine_finish fin, enum ar_status status)
{
    struct engine_result res;
    double t = now_s();
    kv_seq_fini(e->kv, &r->kv);
    pthread_mutex_lock(&e->mu);
    run_remove_locked(e, r); /* no-op when it was queued */
    publish_locked(e);
    pthread_mutex_unlock(&e->mu);

    if (!r->text_cut && status == AR_OK) {
        const char *s;
        size_t n, from;
        if (tokenizer_stream_flush(&r->ts, &s, &n) == AR_OK && n > 0 &&
            text_append(r, s, n) != AR_OK) {
            status = AR_ENOMEM;
            fin = ENGINE_FINISH_ERROR;
        }
        n = text_release(r, true, &from);
        if (n > 0 && r->on_token)
            r->on_token(r->user, -1, r->text.s + from, n);
    }
    /* what the client saw is the final text */
    r->text.n = r->sent;
    if (r->text.s)
        r->text.s[r->text.n] = '\0';

    memset(&res, 0, sizeof(res));
    res.status = status;
    res.finish = fin;
    res.n_prompt = r->n_prompt;
    res.n_cached = r->n_cached;
    res.n_gen = r->n_tok - r->n_prompt;
    res.tokens = r->tokens + r->n_prompt;
    res.text = r->text.s ? r->text.s : "";
    res.text_len = r->text.n;
    res.queue_s = r->admitted_once ? r->t_admit - r->t_submit : t - r->t_submit;
    res.first_token_s = r->t_first > 0 ? r->t_first - r->t_submit : 0;
    res.total_s = t - r->t_submit;
    res.n_preempted = r->n_preempted;
    if (r->on_done)
        r->on_done(r->user, &res);
    req_free(r);
}

/* ---- admission ---------------------------------------------------------------------------- */

static int64_t blocks_for(const struct engine *e, int64_t n_tokens)
{
    int64_t bt = e->p.block_tokens;
    return (n_tokens + bt - 1) / bt;
}

/* Next request to admit: the head of the bulk queue once it has waited (since it last
 * entered the queue) longer than bulk_max_wait_s, else interactive first. */
static struct req *pick_locked(struct engine *e, double t)
{
    struct req *ih = e->q[ENGINE_PRIO_INTERACTIVE].head, *bh = e->q[ENGINE_PRIO_BULK].head;
    if (bh && (!ih || t - bh->t_queued > e->p.bulk_max_wait_s))
        return bh;
    return ih;
}

/* Makes n local blocks free, evicting the prefix cache's; false when it cannot. */
static bool local_free(struct engine *e, int64_t n)
{
    int64_t have = kv_pool_n_free(e->kv, KV_POOL_LOCAL);
    if (have < n && e->pc)
        have += kv_prefix_evict_local(e->pc, n - have);
    return have >= n;
}

/* Takes r's blocks for computing rows [r->n_past, n_tokens): global ones to n_tokens and the
 * local ones of those rows. AR_EBUSY when the local pool is short even after evicting the
 * prefix cache's (nothing taken then). */
static enum ar_status reserve_rows(struct engine *e, struct req *r, int64_t n_tokens)
{
    int64_t n_g, n_l;
    kv_seq_need(e->kv, &r->kv, n_tokens, r->n_past, &n_g, &n_l);
    if (n_g > kv_n_free(e->kv) && e->pc)
        kv_prefix_evict(e->pc, n_g - kv_n_free(e->kv));
    if (!local_free(e, n_l))
        return AR_EBUSY;
    return kv_seq_reserve_at(e->kv, &r->kv, n_tokens, r->n_past);
}

/* Gives r its KV: the cached prefix (prefix cache), blocks for all its known tokens (the
 * local ones for its first step only), and its sampler on the first admission. AR_EBUSY:
 * not enough KV now (nothing kept). */
static enum ar_status admit(struct engine *e, struct req *r)
{
    int64_t matched = 0, need, extra, have;
    enum ar_status st;
    r->pc_parent = 0;
    if (e->pc) {
        /* never reuse the block holding the last known token: its logits are needed */
        int64_t limit = (int64_t)(r->n_tok - 1) / e->p.block_tokens * e->p.block_tokens;
        matched = kv_prefix_lookup(e->pc, r->tokens, limit, &r->kv, &r->pc_parent);
        kv_seq_slide(e->kv, &r->kv, matched); /* local blocks behind the window */
    }
    need = blocks_for(e, r->n_tok) - r->kv.n_blocks;
    extra = e->n_run > 0 ? 1 : 0; /* keep a block for the running ones to grow into */
    have = kv_n_free(e->kv);
    if (have < need + extra && e->pc)
        have += kv_prefix_evict(e->pc, need + extra - have);
    if (have < need + extra) {
        kv_seq_fini(e->kv, &r->kv);
        return AR_EBUSY;
    }
    /* global blocks for every known token, local ones for the first step's rows */
    r->n_past = (int)matched;
    st = kv_seq_reserve_at(e->kv, &r->kv, r->n_tok, INT64_MAX);
    if (st == AR_OK &&
        (st = reserve_rows(e, r, matched + AR_MIN(e->p.prefill_chunk, r->n_tok - matched))) ==
            AR_EBUSY) {
        kv_seq_fini(e->kv, &r->kv); /* the local pool is short now */
        r->n_past = 0;
        return AR_EBUSY;
    }
    if (st == AR_OK && !r->smp) {
        st = sampler_create(&r->sp, e->n_vocab, &r->smp);
        if (st == AR_OK)
            st = sampler_accept_many(r->smp, r->tokens, (size_t)r->n_prompt);
    }
    if (st != AR_OK) {
        kv_seq_fini(e->kv, &r->kv);
        r->n_past = 0;
        return st == AR_EBUSY ? AR_ENOMEM : st;
    }
    r->n_fill = r->n_tok;
    r->n_reg = (int)(matched / e->p.block_tokens);
    r->reg_off = e->pc == NULL;
    r->admit_seq = ++e->next_admit;
    if (!r->admitted_once) {
        r->admitted_once = true;
        r->t_admit = now_s();
        r->n_cached = (int)matched;
        e->st.prompt_tokens += (uint64_t)r->n_prompt;
        if (e->pc) {
            e->st.prefix_queries++;
            e->st.prefix_hit_tokens += (uint64_t)matched;
        }
    }
    return AR_OK;
}

/* Takes r off the running set, frees its KV and puts it back at the head of its queue with
 * all its tokens to recompute. Its sampler, text and stream state are kept. */
static void preempt(struct engine *e, struct req *r)
{
    kv_seq_fini(e->kv, &r->kv);
    r->n_past = 0;
    r->n_reg = 0;
    r->pc_parent = 0;
    r->n_preempted++;
    pthread_mutex_lock(&e->mu);
    run_remove_locked(e, r);
    r->t_queued = now_s();
    queue_push_head(&e->q[r->prio], r);
    e->st.preemptions++;
    publish_locked(e);
    pthread_mutex_unlock(&e->mu);
}

/* The running sequence to preempt: lowest priority, then most recently admitted. */
static struct req *pick_victim(struct engine *e)
{
    struct req *v = NULL;
    for (int i = 0; i < e->n_run; i++) {
        struct req *r = e->run[i];
        if (!v || r->prio > v->prio || (r->prio == v->prio && r->admit_seq > v->admit_seq))
            v = r;
    }
    return v;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* Makes sure every sequence about to decode has a block for its next position, evicting
 * cached prefix blocks and then preempting as needed. Scheduler thread, mu not held. */
static void reserve_decode_blocks(struct engine *e)
{
    int i = 0;
    while (i < e->n_run) {
        struct req *r = e->run[i];
        enum ar_status st;
        if (r->n_tok - r->n_past != 1) {
            i++;
            continue;
        }
        st = kv_seq_reserve_at(e->kv, &r->kv, r->n_past + 1, r->n_past);
        if (st == AR_OK) {
            i++;
            continue;
        }
        if (st != AR_EBUSY) {
            finish(e, r, ENGINE_FINISH_ERROR, st); /* removes r: i now names the next one */
            continue;
        }
        if (e->pc && (kv_prefix_evict(e->pc, 1) == 1 || kv_prefix_evict_local(e->pc, 1) == 1))
            continue;
        struct req *v = pick_victim(e);
        preempt(e, v);
        if (v == r)
            continue;
        for (i = 0; i < e->n_run && e->run[i] != r; i++)
            ;
    }
}

/* Records token t for r after sampling: stop checks, text, callbacks. Returns true when r
 * is finished (and freed). */
static bool accept_token(struct engine *e, struct req *r, int32_t t)
{
    const char *s;
    size_t n, from;
    enum ar_status st;
    if (!r->ignore_eos && tokenizer_is_eog(e->tok, t)) {
        finish(e, r, ENGINE_FINISH_STOP, AR_OK);
        return true;
    }
    r->tokens[r->n_tok++] = t;
    if (r->t_first == 0)
        r->t_first = now_s();
    pthread_mutex_lock(&e->mu);
    e->st.generated_tokens++;
    pthread_mutex_unlock(&e->mu);
    s = "";
    n = 0;
    if ((st = sampler_accept(r->smp, t)) != AR_OK ||
        /* ids of a padded model vocabulary beyond the tokenizer's have no text */
        (t < e->n_vocab_tok && (st = tokenizer_stream_push(e->tok, &r->ts, t, &s, &n)) != AR_OK) ||
        (st = text_append(r, s, n)) != AR_OK) {
        finish(e, r, ENGINE_FINISH_ERROR, st);
        return true;
    }
    n = text_release(r, false, &from);
    if (r->on_token)
        r->on_token(r->user, t, r->text.s + from, n);
    if (r->text_cut) {
        finish(e, r, ENGINE_FINISH_STOP, AR_OK);
        return true;
    }
    if (r->n_tok - r->n_prompt >= r->max_tokens || r->n_tok >= e->n_ctx) {
        finish(e, r, ENGINE_FINISH_LENGTH, AR_OK);
        return true;
    }
    return false;
}

static int hist_bucket(int rows)
{
    int b = 0, lim = 1;
    while (rows > lim && b < 10) {
        lim *= 2;
        b++;
    }
    return b;
}

/* One forward step over all running sequences. Scheduler thread, mu not held. */
static void step(struct engine *e)
{
    struct model_batch b;
    int rows = 0, n_seq = 0, n_logits = 0;
    double t0 = now_s(), t1, t2;
    enum ar_status st;

    reserve_decode_blocks(e);
    if (e->n_run == 0)
        return;

    /* decode rows first (one per generating sequence), then prompt chunks */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < e->n_run && rows < e->p.n_batch; i++) {
            struct req *r = e->run[i];
            int pending = r->n_tok - r->n_past, c;
            if ((pass == 0) != (pending == 1))
                continue;
            c = AR_MIN(pending, AR_MIN(e->p.prefill_chunk, e->p.n_batch - rows));
            /* a prompt chunk's local blocks (decode rows have theirs): without them the chunk
             * waits for a later step */
            if (pass == 1 && reserve_rows(e, r, r->n_past + c) != AR_OK)
                continue;
            for (int j = 0; j < c; j++) {
                e->b_tok[rows + j] = r->tokens[r->n_past + j];
                e->b_pos[rows + j] = r->n_past + j;
                e->b_seq[rows + j] = n_seq;
                e->b_want[rows + j] = 0;
            }
            r->b_rows = c;
            r->b_logits = -1;
            if (c == pending) {
                e->b_want[rows + c - 1] = 1;
                r->b_logits = n_logits++;
            }
            rows += c;
            e->b_seqs[n_seq] = &r->kv;
            e->b_reqs[n_seq] = r;
            n_seq++;
        }
    }
    if (rows == 0) {
        /* every chunk waits for local blocks that only finishing work would free */
        preempt(e, pick_victim(e));
        return;
    }
    memset(&b, 0, sizeof(b));
    b.n_tokens = rows;
    b.tokens = e->b_tok;
    b.pos = e->b_pos;
    b.seq = e->b_seq;
    b.logits = e->b_want;
    b.n_seqs = n_seq;

    t1 = now_s();
    st = model_forward(e->mctx, e->kv, e->b_seqs, &b, e->logits);
    t2 = now_s();
    /* counted before any callback runs, so a client woken by on_done sees this step */
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.batch_hist[hist_bucket(rows)]++;
    e->st.batch_rows_sum += (uint64_t)rows;
    e->st.forward_s += t2 - t1;
    pthread_mutex_unlock(&e->mu);

    for (int k = 0; k < n_seq; k++) {
        struct req *r = e->b_reqs[k];
        enum ar_status sst;
        int32_t t;
        if (st != AR_OK) {
            finish(e, r, ENGINE_FINISH_ERROR, st);
            continue;
        }
        r->n_past += r->b_rows;
        /* register the full blocks this step completed (tokens known at admission only,
         * unless the request asks for its generated ones too) */
        while (!r->reg_off && (r->n_reg + 1) * e->p.block_tokens <=
                                  (r->cache_generated ? r->n_past : AR_MIN(r->n_past, r->n_fill))) {
            int bi = r->n_reg;
            if (kv_prefix_insert_local(e->pc, r->pc_parent,
                                       r->tokens + (size_t)bi * e->p.block_tokens,
                                       &r->kv.blocks[bi], r->kv.local ? &r->kv.local[bi] : NULL,
                                       &r->pc_parent) != AR_OK) {
                r->reg_off = true;
                break;
            }
            r->n_reg++;
        }
        kv_seq_slide(e->kv, &r->kv, r->n_past);
        if (r->b_logits < 0)
            continue;
        sst = sampler_sample(r->smp, e->logits + (size_t)r->b_logits * (size_t)e->n_vocab, &t);
        if (sst != AR_OK) {
            finish(e, r, ENGINE_FINISH_ERROR, sst);
            continue;
        }
        accept_token(e, r, t);
    }

    pthread_mutex_lock(&e->mu);
    e->st.busy_s += now_s() - t0;
    publish_locked(e);
    pthread_mutex_unlock(&e->mu);
}

/* ---- the scheduler thread ------------------------------------------------------------------- */

/* A request leaving before it runs, with the reason. */
struct leaving {
    struct req *r;
    enum engine_finish fin;
    enum ar_status st;
};

static void *scheduler_main(void *arg)
{
    struct engine *e = arg;
    struct leaving *out = NULL;
    int out_cap = 0;

    pthread_mutex_lock(&e->mu);
    for (;;) {
        int n_out = 0, need;
        double t;
        while (!e->stop && e->n_run == 0 && e->q[0].n == 0 && e->q[1].n == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop)
            break;
        need = e->q[0].n + e->q[1].n + e->n_run;
        if (need > out_cap) {
            struct leaving *o = ar_realloc(out, (size_t)need * 2 * sizeof(*o));
            if (o) {
                out = o;
                out_cap = need * 2;
            }
        }
        t = now_s();
        /* cancelled or timed out: queued ones leave the queue here, running ones below */
        for (int p = 0; p < ENGINE_PRIO_COUNT; p++) {
            struct req *r = e->q[p].head, *nx;
            for (; r && n_out < out_cap; r = nx) {
                nx = r->next;
                if (r->cancel || (r->deadline > 0 && t >= r->deadline)) {
                    queue_remove(&e->q[p], r);
                    out[n_out++] = (struct leaving){r,
                                                    r->cancel ? ENGINE_FINISH_CANCELLED
                                                              : ENGINE_FINISH_TIMEOUT,
                                                    AR_OK};
                }
            }
        }
        for (int i = 0; i < e->n_run && n_out < out_cap; i++) {
            struct req *r = e->run[i];
            if (r->cancel || (r->deadline > 0 && t >= r->deadline))
                out[n_out++] = (struct leaving){
                    r, r->cancel ? ENGINE_FINISH_CANCELLED : ENGINE_FINISH_TIMEOUT, AR_OK};
        }
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < n_out; i++)
            finish(e, out[i].r, out[i].fin, out[i].st);

        /* admission between steps */
        pthread_mutex_lock(&e->mu);
        while (e->n_run < e->p.n_seq_max) {
            struct req *r = pick_locked(e, now_s());
            enum ar_status st;
            if (!r || r->cancel)
                break;
            st = admit(e, r);
            if (st == AR_EBUSY)
                break;
            queue_remove(&e->q[r->prio], r);
            if (st != AR_OK) {
                pthread_mutex_unlock(&e->mu);
                finish(e, r, ENGINE_FINISH_ERROR, st);
                pthread_mutex_lock(&e->mu);
                continue;
            }
            e->run[e->n_run++] = r;
        }
        publish_locked(e);
        if (e->n_run == 0) {
            /* nothing could start (cannot happen with a consistent KV size): do not spin */
            if (e->q[0].n + e->q[1].n > 0 && !e->stop) {
                struct timespec ts = ar_deadline_in(CLOCK_REALTIME, 0.01);
                pthread_cond_timedwait(&e->cv, &e->mu, &ts);
            }
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        step(e);
        pthread_mutex_lock(&e->mu);
    }

    /* shutting down: everything still here is cancelled */
    for (;;) {
        struct req *r = NULL;
        if (e->n_run > 0)
            r = e->run[e->n_run - 1];
        else if (e->q[ENGINE_PRIO_INTERACTIVE].head)
            queue_remove(&e->q[ENGINE_PRIO_INTERACTIVE], r = e->q[ENGINE_PRIO_INTERACTIVE].head);
        else if (e->q[ENGINE_PRIO_BULK].head)
            queue_remove(&e->q[ENGINE_PRIO_BULK], r = e->q[ENGINE_PRIO_BULK].head);
        if (!r)
            break;
        pthread_mutex_unlock(&e->mu);
        finish(e, r, ENGINE_FINISH_CANCELLED, AR_OK);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    ar_free(out);
    return NULL;
}

/* ---- public API ------------------------------------------------------------------------------ */

struct engine_params engine_default_params(void)
{
    struct engine_params p = {
        .n_threads = 2,
        .kv_tokens = 8192,
        .block_tokens = 16,
        .kv_type = AR_TYPE_F16,
        .n_seq_max = 16,
        .n_batch = 512,
        .prefill_chunk = 256,
        .queue_max = 256,
        .prefix_cache = true,
        .bulk_max_wait_s = 10.0,
    };
    return p;
}

enum ar_status engine_create(const struct model *m, const struct tokenizer *tok,
                             const struct engine_params *p, struct engine **out,
                             struct ar_err *err)
{
    struct engine *e;
    struct kv_params kp;
    enum ar_status st;
    const struct model_hparams *hp;
    int64_t n_blocks;
    if (!m || !tok || !p || !out)
        return ar_err_set(err, AR_EINVAL, 0, "engine_create: NULL argument");
    if (p->n_threads < 1 || p->kv_tokens < 1 || p->block_tokens < 1 || p->n_seq_max < 1 ||
        p->n_batch < 1 || p->prefill_chunk < 1 || p->queue_max < 1 || !(p->bulk_max_wait_s >= 0) ||
        (p->kv_type != AR_TYPE_F16 && p->kv_type != AR_TYPE_F32))
        return ar_err_set(err, AR_EINVAL, 0, "engine_create: invalid parameters");
    hp = model_hparams(m);
    if (tokenizer_n_vocab(tok) > hp->n_vocab)
        return ar_err_set(err, AR_EINVAL, 0, "tokenizer has %d tokens, model %d",
                          (int)tokenizer_n_vocab(tok), hp->n_vocab);
    e = ar_calloc(1, sizeof(*e));
    if (!e)
        return AR_ENOMEM;
    e->m = m;
    e->tok = tok;
    e->p = *p;
    /* every running sequence must be able to place its decode row in a step */
    if (e->p.n_seq_max > e->p.n_batch)
        e->p.n_seq_max = e->p.n_batch;
    e->n_vocab = hp->n_vocab;
    e->n_vocab_tok = tokenizer_n_vocab(tok);
    n_blocks = (p->kv_tokens + p->block_tokens - 1) / p->block_tokens;
    if (n_blocks > INT32_MAX / p->block_tokens) {
        st = ar_err_set(err, AR_EINVAL, 0, "kv_tokens too large");
        goto fail;
    }
    e->n_ctx = (int)AR_MIN((int64_t)hp->n_ctx_train, n_blocks * p->block_tokens);
    e->next_id = 1;

    model_kv_params(m, p->block_tokens, n_blocks, p->kv_type, &kp);
    if (kp.swa_layers) {
        /* The local pool (sliding layers): after each step a sequence holds the blocks of its
         * window, at most ceil(window / bt) + 1, plus one its next decode row opens; a step's
         * prompt chunks, n_batch rows in all, take at most ceil(n_batch / bt) + 1 more each.
         * So n_seq_max * (ceil(window / bt) + 3) + ceil(n_batch / bt) blocks never run short
         * but for what the prefix cache keeps (evictable); more than the global pool is never
         * needed, as a sequence holds no more local blocks than global ones. */
        int64_t win = (kp.swa_window + p->block_tokens - 1) / p->block_tokens;
        kp.n_local_blocks = AR_MIN(n_blocks, (int64_t)e->p.n_seq_max * (win + 3) +
                                                 blocks_for(e, e->p.n_batch));
    }
    if ((st = kv_create(&kp, &e->kv)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot create the KV cache (%lld blocks)", (long long)n_blocks);
        goto fail;
    }
    if (p->prefix_cache && (st = kv_prefix_create(e->kv, &e->pc)) != AR_OK)
        goto fail;
    if ((st = ar_pool_create(p->n_threads, &e->pool)) != AR_OK)
        goto fail;
    if ((st = model_ctx_create(m, e->p.n_batch, e->pool, &e->mctx)) != AR_OK) {
        ar_err_set(err, st, 0, "cannot create the model context");
        goto fail;
    }
    model_ctx_set_n_ctx(e->mctx, e->n_ctx);
    e->b_tok = ar_malloc((size_t)e->p.n_batch * sizeof(*e->b_tok));
    e->b_pos = ar_malloc((size_t)e->p.n_batch * sizeof(*e->b_pos));
    e->b_seq = ar_malloc((size_t)e->p.n_batch * sizeof(*e->b_seq));
    e->b_want = ar_malloc((size_t)e->p.n_batch);
    e->b_seqs = ar_malloc((size_t)e->p.n_seq_max * sizeof(*e->b_seqs));
    e->b_reqs = ar_malloc((size_t)e->p.n_seq_max * sizeof(*e->b_reqs));
    e->run = ar_malloc((size_t)e->p.n_seq_max * sizeof(*e->run));
    e->logits = ar_malloc((size_t)e->p.n_seq_max * (size_t)e->n_vocab * sizeof(*e->logits));
    if (!e->b_tok || !e->b_pos || !e->b_seq || !e->b_want || !e->b_seqs || !e->b_reqs ||
        !e->run || !e->logits) {
        st = AR_ENOMEM;
        goto fail;
    }
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        st = AR_ENOMEM;
        goto fail;
    }
    e->mu_init = true;
    if (pthread_cond_init(&e->cv, NULL) != 0) {
        st = AR_ENOMEM;
        goto fail;
    }
    e->cv_init = true;
    pthread_mutex_lock(&e->mu);
    publish_locked(e);
    pthread_mutex_unlock(&e->mu);
    if (pthread_create(&e->thread, NULL, scheduler_main, e) != 0) {
        st = ar_err_set(err, AR_ENOMEM, 0, "cannot start the scheduler thread");
        goto fail;
    }
    e->thread_started = true;
    *out = e;
    return AR_OK;
fail:
    engine_destroy(e);
    return st;
}

void engine_destroy(struct engine *e)
{
    if (!e)
        return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    if (e->cv_init)
        pthread_cond_destroy(&e->cv);
    if (e->mu_init)
        pthread_mutex_destroy(&e->mu);
    model_ctx_destroy(e->mctx);
    ar_pool_destroy(e->pool);
    kv_prefix_destroy(e->pc);
    kv_destroy(e->kv);
    ar_free(e->b_tok);
    ar_free(e->b_pos);
    ar_free(e->b_seq);
    ar_free(e->b_want);
    ar_free(e->b_seqs);
    ar_free(e->b_reqs);
    ar_free(e->run);
    ar_free(e->logits);
    ar_free(e);
}

/* Checks the sampling parameters the way the sampler will (by creating one). */
static enum ar_status check_sampling(const struct engine *e, const struct sampler_params *sp)
{
    struct sampler *s;
    enum ar_status st = sampler_create(sp, e->n_vocab, &s);
    if (st == AR_OK)
        sampler_destroy(s);
    return st;
}

enum ar_status engine_submit(struct engine *e, const struct engine_request *req, uint64_t *id)
{
    struct req *r;
    enum ar_status st;
    if (!e || !req || !req->prompt || req->n_prompt < 1 || req->max_tokens < 1 ||
        (unsigned)req->priority >= ENGINE_PRIO_COUNT || !(req->timeout_s >= 0) ||
        req->n_stop < 0 || (req->n_stop > 0 && !req->stop))
        return AR_EINVAL;
    for (int i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= e->n_vocab)
            return AR_EINVAL;
    if (req->n_prompt + 1 > e->n_ctx)
        return AR_ERANGE;
    /* cheap refusal before any allocation; checked again under the lock */
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->q[0].n + e->q[1].n >= e->p.queue_max) {
        if (!e->stop)
            e->st.rejected_full++;
        pthread_mutex_unlock(&e->mu);
        return AR_EBUSY;
    }
    pthread_mutex_unlock(&e->mu);
    if ((st = check_sampling(e, &req->sampling)) != AR_OK)
        return st == AR_ENOMEM ? AR_ENOMEM : AR_EINVAL;

    r = ar_calloc(1, sizeof(*r));
    if (!r)
        return AR_ENOMEM;
    tokenizer_stream_init(&r->ts, true);
    kv_seq_init(&r->kv);
    r->prio = req->priority;
    r->n_prompt = req->n_prompt;
    r->n_tok = req->n_prompt;
    r->max_tokens = req->max_tokens;
    r->cap = (int)AR_MIN((int64_t)req->n_prompt + req->max_tokens, (int64_t)e->n_ctx);
    r->sp = req->sampling;
    r->ignore_eos = req->ignore_eos;
    r->cache_generated = req->cache_generated;
    r->on_token = req->on_token;
    r->on_done = req->on_done;
    r->user = req->user;
    r->tokens = ar_malloc((size_t)r->cap * sizeof(*r->tokens));
    if (!r->tokens)
        goto nomem;
    memcpy(r->tokens, req->prompt, (size_t)req->n_prompt * sizeof(*r->tokens));
    if (req->n_stop > 0) {
        r->stop = ar_calloc((size_t)req->n_stop, sizeof(*r->stop));
        if (!r->stop)
            goto nomem;
        for (int i = 0; i < req->n_stop; i++) {
            r->stop[i] = ar_strdup(req->stop[i] ? req->stop[i] : "");
            if (!r->stop[i]) {
                r->n_stop = i;
                goto nomem;
            }
        }
        r->n_stop = req->n_stop;
    }
    if (text_append(r, "", 0) != AR_OK)
        goto nomem;

    pthread_mutex_lock(&e->mu);
    if (e->stop || e->q[0].n + e->q[1].n >= e->p.queue_max) {
        if (!e->stop)
            e->st.rejected_full++;
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return AR_EBUSY;
    }
    r->id = e->next_id++;
    r->t_submit = r->t_queued = now_s();
    if (req->timeout_s > 0)
        r->deadline = r->t_submit + req->timeout_s;
    queue_push_tail(&e->q[r->prio], r);
    e->st.queued[r->prio] = e->q[r->prio].n;
    if (id)
        *id = r->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return AR_OK;
nomem:
    req_free(r);
    return AR_ENOMEM;
}

void engine_cancel(struct engine *e, uint64_t id)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    for (int p = 0; p < ENGINE_PRIO_COUNT; p++)
        for (struct req *r = e->q[p].head; r; r = r->next)
            if (r->id == id)
                r->cancel = true;
    for (int i = 0; i < e->n_run; i++)
        if (e->run[i]->id == id)
            e->run[i]->cancel = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_get_stats(struct engine *e, struct engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    pthread_mutex_unlock(&e->mu);
}

int engine_n_ctx(const struct engine *e)
{
    return e->n_ctx;
}
