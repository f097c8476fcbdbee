/* queue.h - a durable work queue for job lines: one interface, two implementations, picked by
 * URL (queue_open). memory.c keeps messages in this process (the single-process default: a
 * crash loses them, so the job runner republishes unfinished work at start); amqp.c uses a
 * durable RabbitMQ queue (persistent messages, publisher confirms, manual acks, prefetch), so
 * every instance of a fleet publishes to and consumes from the same queue.
 *
 * Delivery is at least once: a message is removed only by queue_ack; a message whose consumer
 * nacks it with requeue, closes (queue_consumer_close) or dies (its connection is lost) is
 * delivered again, with redelivered set. Consumers therefore ack only after the work is done
 * and durably recorded, and make the work idempotent (a redelivered message may have been done).
 *
 * Thread safety: queue_publish, queue_publish_many and queue_healthy may be called from any
 * number of threads at once. The consumer side (queue_get, queue_ack, queue_nack,
 * queue_set_prefetch, queue_consumer_close) belongs to one thread at a time: a handle has one
 * consumer. queue_destroy must not run concurrently with any other call on the handle.
 *
 * Errors: AR_EUNAVAIL when the broker cannot be reached now (the handle reconnects by itself,
 * with a backoff of 100 ms doubling to 5 s); AR_EBUSY when the memory queue is full or no
 * message came before the timeout; AR_EINVAL for bad arguments (a bad URL, with a message);
 * AR_EIO when the broker refused an operation; AR_ENOMEM. */
#ifndef AR_QUEUE_H
#define AR_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define QUEUE_DEFAULT_NAME "autoreply.jobs"
#define QUEUE_BODY_MAX (1u << 20) /* largest message body, bytes */

/* One delivered message. body is owned (queue_msg_fini) and NUL-terminated after len bytes
 * (bodies are binary-safe: len counts every byte, NULs included). */
struct queue_msg {
    uint64_t tag; /* for queue_ack / queue_nack on the same handle */
    char *body;   /* owned */
    size_t len;
    bool redelivered; /* delivered before and not acked (nack, a consumer closed or died) */
};
void queue_msg_fini(struct queue_msg *m); /* frees body; NULL or a zeroed msg does nothing */

/* One body of queue_publish_many (borrowed). */
struct queue_body {
    const void *data;
    size_t len;
};

struct queue;

/* What an implementation fills. Callers use the queue_* functions below. */
struct queue_ops {
    const char *name; /* "memory", "amqp" */
    bool durable;     /* messages outlive this process (and a broker restart) */
    enum ar_status (*publish_many)(struct queue *q, const struct queue_body *b, size_t n,
                                   struct ar_err *err);
    enum ar_status (*get)(struct queue *q, double timeout_s, struct queue_msg *out,
                          struct ar_err *err);
    enum ar_status (*ack)(struct queue *q, uint64_t tag, struct ar_err *err);
    enum ar_status (*nack)(struct queue *q, uint64_t tag, bool requeue, struct ar_err *err);
    enum ar_status (*set_prefetch)(struct queue *q, int n, struct ar_err *err);
    void (*consumer_close)(struct queue *q);
    bool (*healthy)(struct queue *q);
    void (*destroy)(struct queue *q);
};

struct queue {
    const struct queue_ops *ops; /* first member: implementations embed struct queue first */
};

struct queue_params {
    const char *name;    /* broker queue name (amqp); NULL: QUEUE_DEFAULT_NAME */
    size_t max_messages; /* memory: ready + unacked messages held at most (400000) */
};
struct queue_params queue_default_params(void);

/* By URL: NULL, "" or "memory:" -> the memory queue; "amqp://user:pass@host:port/vhost" ->
 * RabbitMQ (user and password default to guest, the port to 5672, an empty vhost to "/";
 * user, password and vhost may be percent-encoded). p may be NULL (defaults). Creating an amqp
 * queue while the broker is down succeeds: it connects when first used. The caller owns *out
 * (queue_destroy). AR_EINVAL with a message for a URL it cannot use. */
enum ar_status queue_open(const char *url, const struct queue_params *p, struct queue **out,
                          struct ar_err *err);
enum ar_status queue_memory_create(size_t max_messages, struct queue **out);
/* name NULL: QUEUE_DEFAULT_NAME. */
enum ar_status queue_amqp_create(const char *url, const char *name, struct queue **out,
                                 struct ar_err *err);

/* Returns once the queue holds the message durably: for RabbitMQ, a persistent message to a
 * durable queue, confirmed by the broker (publisher confirms; no confirm within 10 s:
 * AR_EUNAVAIL). While the broker is down it fails fast with AR_EUNAVAIL (at most one connection
 * attempt per backoff period). A broker that blocks publishers (its memory or disk alarm) makes
 * it fail after that timeout, or wait longer when a large batch fills the socket first. len may
 * be 0; at most QUEUE_BODY_MAX. */
enum ar_status queue_publish(struct queue *q, const void *body, size_t len, struct ar_err *err);
/* The same for n bodies, confirmed together (much faster than n calls). On failure some of
 * them may have been queued already: consumers must take duplicates. */
enum ar_status queue_publish_many(struct queue *q, const struct queue_body *b, size_t n,
                                  struct ar_err *err);

/* Waits up to timeout_s (>= 0) for one message. AR_OK: *out filled (the caller owns it:
 * queue_msg_fini; it must then ack or nack out->tag). AR_EBUSY: none came in time, or this
 * consumer already holds its prefetch of unacked messages; AR_EUNAVAIL: the broker was
 * unreachable the whole time (returned after the timeout, reconnecting meanwhile; a connection
 * attempt under way may add up to its own 2 s limit). */
enum ar_status queue_get(struct queue *q, double timeout_s, struct queue_msg *out,
                         struct ar_err *err);
/* Removes a delivered message for good. A tag from a connection that has since been lost
 * gives AR_EUNAVAIL: the broker already put that message back for redelivery. */
enum ar_status queue_ack(struct queue *q, uint64_t tag, struct ar_err *err);
/* Gives a delivered message back: requeue true -> delivered again (redelivered set), to this
 * consumer or another; false -> dropped. */
enum ar_status queue_nack(struct queue *q, uint64_t tag, bool requeue, struct ar_err *err);
/* How many unacked messages this consumer may hold (n >= 1; the default is 1). Applies at once,
 * to messages delivered from now on. */
enum ar_status queue_set_prefetch(struct queue *q, int n, struct ar_err *err);
/* Ends this handle's consumer: every message it holds unacked goes back to the queue, as if the
 * consumer had died. A later queue_get starts a new consumer. */
void queue_consumer_close(struct queue *q);
/* Whether the queue works now (for readiness checks): the memory queue always; amqp: the
 * broker answered on the publishing connection (reconnecting when the backoff allows) and the
 * consumer, if one was started, is connected. Never blocks longer than a connection attempt. */
bool queue_healthy(struct queue *q);
/* Whether messages outlive this process (amqp: yes; memory: no). */
bool queue_durable(const struct queue *q);
/* Closes connections (unacked messages go back to the queue) and frees; NULL does nothing. */
void queue_destroy(struct queue *q);

#endif
