/* queue.c - the queue interface's front: picks the implementation by URL and checks arguments
 * before calling through the handle's ops (memory.c, amqp.c). */
#include <string.h>

#include "queue.h"

struct queue_params queue_default_params(void)
{
    struct queue_params p;
    memset(&p, 0, sizeof(p));
    p.name = QUEUE_DEFAULT_NAME;
    p.max_messages = 400000;
    return p;
}

void queue_msg_fini(struct queue_msg *m)
{
    if (!m)
        return;
    ar_free(m->body);
    memset(m, 0, sizeof(*m));
}

enum ar_status queue_open(const char *url, const struct queue_params *p, struct queue **out,
                          struct ar_err *err)
{
    struct queue_params d = queue_default_params();
    if (!out)
        return ar_err_set(err, AR_EINVAL, 0, "no output handle");
    *out = NULL;
    if (!p)
        p = &d;
    if (!url || !*url || !strcmp(url, "memory:")) {
        if (queue_memory_create(p->max_messages ? p->max_messages : d.max_messages, out) != AR_OK)
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        return AR_OK;
    }
    if (!strncmp(url, "amqp://", 7))
        return queue_amqp_create(url, p->name, out, err);
    if (!strncmp(url, "amqps://", 8))
        return ar_err_set(err, AR_EINVAL, 0,
                          "queue URL: amqps (TLS) is not supported, use amqp://");
    return ar_err_set(err, AR_EINVAL, 0,
                      "queue URL must be amqp://user:pass@host:port/vhost or memory:, not '%.100s'",
                      url);
}

enum ar_status queue_publish(struct queue *q, const void *body, size_t len, struct ar_err *err)
{
    struct queue_body b = {body, len};
    return queue_publish_many(q, &b, 1, err);
}

enum ar_status queue_publish_many(struct queue *q, const struct queue_body *b, size_t n,
                                  struct ar_err *err)
{
    if (!q || (n && !b))
        return ar_err_set(err, AR_EINVAL, 0, "no queue or no bodies");
    for (size_t i = 0; i < n; i++) {
        if (b[i].len > QUEUE_BODY_MAX)
            return ar_err_set(err, AR_EINVAL, 0, "message %zu is %zu bytes, more than %u", i,
                              b[i].len, QUEUE_BODY_MAX);
        if (b[i].len && !b[i].data)
            return ar_err_set(err, AR_EINVAL, 0, "message %zu has no data", i);
    }
    if (n == 0)
        return AR_OK;
    return q->ops->publish_many(q, b, n, err);
}

enum ar_status queue_get(struct queue *q, double timeout_s, struct queue_msg *out,
                         struct ar_err *err)
{
    if (!q || !out || !(timeout_s >= 0))
        return ar_err_set(err, AR_EINVAL, 0, "no queue, no output or a negative timeout");
    memset(out, 0, sizeof(*out));
    return q->ops->get(q, timeout_s, out, err);
}

enum ar_status queue_ack(struct queue *q, uint64_t tag, struct ar_err *err)
{
    if (!q)
        return ar_err_set(err, AR_EINVAL, 0, "no queue");
    return q->ops->ack(q, tag, err);
}

enum ar_status queue_nack(struct queue *q, uint64_t tag, bool requeue, struct ar_err *err)
{
    if (!q)
        return ar_err_set(err, AR_EINVAL, 0, "no queue");
    return q->ops->nack(q, tag, requeue, err);
}

enum ar_status queue_set_prefetch(struct queue *q, int n, struct ar_err *err)
{
    if (!q || n < 1 || n > 65535)
        return ar_err_set(err, AR_EINVAL, 0, "prefetch must be 1..65535");
    return q->ops->set_prefetch(q, n, err);
}

void queue_consumer_close(struct queue *q)
{
    if (q)
        q->ops->consumer_close(q);
}

bool queue_healthy(struct queue *q)
{
    return q && q->ops->healthy(q);
}

bool queue_durable(const struct queue *q)
{
    return q && q->ops->durable;
}

void queue_destroy(struct queue *q)
{
    if (q)
        q->ops->destroy(q);
}
