/* memory.c - the in-process queue: a bounded FIFO of ready messages plus the list of those
 * delivered and not yet acked, under one mutex. What a single process without a broker uses;
 * nothing survives the process (queue_durable is false), so the job runner republishes
 * unfinished work when it starts. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "base/deadline.h"
#include "queue.h"

struct mem_msg {
    struct mem_msg *next;
    uint64_t tag; /* while unacked */
    bool redelivered;
    size_t len;
    char body[]; /* len bytes and a NUL */
};

struct mem_queue {
    struct queue base;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* CLOCK_MONOTONIC: a message became ready or the window opened */
    struct mem_msg *head, *tail; /* ready, FIFO */
    struct mem_msg *unacked;     /* delivered, newest first (at most the prefetch) */
    size_t n_ready, n_unacked, max;
    int prefetch;
    uint64_t next_tag;
};

static struct mem_queue *mq_of(struct queue *q)
{
    return (struct mem_queue *)q;
}

static enum ar_status mem_publish_many(struct queue *q, const struct queue_body *b, size_t n,
                                       struct ar_err *err)
{
    struct mem_queue *m = mq_of(q);
    struct mem_msg *first = NULL, *last = NULL;
    for (size_t i = 0; i < n; i++) { /* allocate outside the lock, all or nothing */
        struct mem_msg *x = ar_malloc(sizeof(*x) + b[i].len + 1);
        if (!x) {
            while (first) {
                struct mem_msg *nx = first->next;
                ar_free(first);
                first = nx;
            }
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        }
        x->next = NULL;
        x->tag = 0;
        x->redelivered = false;
        x->len = b[i].len;
        if (b[i].len)
            memcpy(x->body, b[i].data, b[i].len);
        x->body[b[i].len] = '\0';
        if (last)
            last->next = x;
        else
            first = x;
        last = x;
    }
    pthread_mutex_lock(&m->mu);
    if (m->n_ready + m->n_unacked + n > m->max) {
        size_t held = m->n_ready + m->n_unacked;
        pthread_mutex_unlock(&m->mu);
        while (first) {
            struct mem_msg *nx = first->next;
            ar_free(first);
            first = nx;
        }
        return ar_err_set(err, AR_EBUSY, 0, "the in-process queue is full (%zu of %zu messages)",
                          held, m->max);
    }
    if (m->tail)
        m->tail->next = first;
    else
        m->head = first;
    m->tail = last;
    m->n_ready += n;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return AR_OK;
}

static bool can_deliver(const struct mem_queue *m)
{
    return m->head && m->n_unacked < (size_t)m->prefetch;
}

static enum ar_status mem_get(struct queue *q, double timeout_s, struct queue_msg *out,
                              struct ar_err *err)
{
    struct mem_queue *m = mq_of(q);
    struct mem_msg *x;
    struct timespec dl = ar_deadline_in(CLOCK_MONOTONIC, AR_MIN(timeout_s, 1e6));
    pthread_mutex_lock(&m->mu);
    while (!can_deliver(m))
        if (pthread_cond_timedwait(&m->cv, &m->mu, &dl) != 0)
            break;
    if (!can_deliver(m)) {
        bool full = m->head != NULL;
        pthread_mutex_unlock(&m->mu);
        return full ? ar_err_set(err, AR_EBUSY, 0, "the consumer holds its prefetch of messages")
                    : ar_err_set(err, AR_EBUSY, 0, "no message within %.3f s", timeout_s);
    }
    x = m->head;
    out->body = ar_malloc(x->len + 1);
    if (!out->body) {
        pthread_mutex_unlock(&m->mu);
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    m->head = x->next;
    if (!m->head)
        m->tail = NULL;
    m->n_ready--;
    x->tag = ++m->next_tag;
    x->next = m->unacked;
    m->unacked = x;
    m->n_unacked++;
    memcpy(out->body, x->body, x->len + 1);
    out->len = x->len;
    out->tag = x->tag;
    out->redelivered = x->redelivered;
    pthread_mutex_unlock(&m->mu);
    return AR_OK;
}

/* Unlinks the unacked message with tag (mu held); NULL when there is none. */
static struct mem_msg *take_unacked(struct mem_queue *m, uint64_t tag)
{
    for (struct mem_msg **pp = &m->unacked; *pp; pp = &(*pp)->next) {
        if ((*pp)->tag == tag) {
            struct mem_msg *x = *pp;
            *pp = x->next;
            m->n_unacked--;
            x->next = NULL;
            return x;
        }
    }
    return NULL;
}

/* Puts x back at the front of the ready list, as a redelivery (mu held). */
static void requeue_front(struct mem_queue *m, struct mem_msg *x)
{
    x->redelivered = true;
    x->tag = 0;
    x->next = m->head;
    m->head = x;
    if (!m->tail)
        m->tail = x;
    m->n_ready++;
}

static enum ar_status mem_ack(struct queue *q, uint64_t tag, struct ar_err *err)
{
    struct mem_queue *m = mq_of(q);
    struct mem_msg *x;
    pthread_mutex_lock(&m->mu);
    x = take_unacked(m, tag);
    if (x)
        pthread_cond_broadcast(&m->cv); /* the prefetch window opened */
    pthread_mutex_unlock(&m->mu);
    if (!x)
        return ar_err_set(err, AR_EINVAL, 0, "no unacked message with tag %llu",
                          (unsigned long long)tag);
    ar_free(x);
    return AR_OK;
}

static enum ar_status mem_nack(struct queue *q, uint64_t tag, bool requeue, struct ar_err *err)
{
    struct mem_queue *m = mq_of(q);
    struct mem_msg *x;
    pthread_mutex_lock(&m->mu);
    x = take_unacked(m, tag);
    if (!x) {
        pthread_mutex_unlock(&m->mu);
        return ar_err_set(err, AR_EINVAL, 0, "no unacked message with tag %llu",
                          (unsigned long long)tag);
    }
    if (requeue) {
        requeue_front(m, x);
        x = NULL;
    }
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    ar_free(x);
    return AR_OK;
}

static enum ar_status mem_set_prefetch(struct queue *q, int n, struct ar_err *err)
{
    struct mem_queue *m = mq_of(q);
    (void)err;
    pthread_mutex_lock(&m->mu);
    m->prefetch = n;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return AR_OK;
}

/* Every unacked message goes back, oldest delivery first in the ready list. */
static void mem_consumer_close(struct queue *q)
{
    struct mem_queue *m = mq_of(q);
    pthread_mutex_lock(&m->mu);
    while (m->unacked) { /* newest first: pushing each to the front leaves the oldest first */
        struct mem_msg *x = m->unacked;
        m->unacked = x->next;
        m->n_unacked--;
        requeue_front(m, x);
    }
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

static bool mem_healthy(struct queue *q)
{
    (void)q;
    return true;
}

static void free_list(struct mem_msg *x)
{
    while (x) {
        struct mem_msg *nx = x->next;
        ar_free(x);
        x = nx;
    }
}

static void mem_destroy(struct queue *q)
{
    struct mem_queue *m = mq_of(q);
    free_list(m->head);
    free_list(m->unacked);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    ar_free(m);
}

static const struct queue_ops mem_ops = {
    .name = "memory",
    .durable = false,
    .publish_many = mem_publish_many,
    .get = mem_get,
    .ack = mem_ack,
    .nack = mem_nack,
    .set_prefetch = mem_set_prefetch,
    .consumer_close = mem_consumer_close,
    .healthy = mem_healthy,
    .destroy = mem_destroy,
};

enum ar_status queue_memory_create(size_t max_messages, struct queue **out)
{
    struct mem_queue *m;
    pthread_condattr_t ca;
    if (!out || max_messages < 1)
        return AR_EINVAL;
    m = ar_calloc(1, sizeof(*m));
    if (!m)
        return AR_ENOMEM;
    m->base.ops = &mem_ops;
    m->max = max_messages;
    m->prefetch = 1;
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = &m->base;
    return AR_OK;
}
