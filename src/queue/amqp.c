/* amqp.c - the queue on RabbitMQ (librabbitmq-c): a durable classic queue, persistent
 * messages published with publisher confirms, one consumer per handle with manual acks and a
 * prefetch window (basic.qos).
 *
 * librabbitmq connections are not thread-safe, so a handle keeps two: the publishing one, used
 * by any thread under a mutex, and the consuming one, used only by the consumer thread. Each
 * reconnects by itself: a lost connection is dropped and made again on the next call, failed
 * attempts back off from 100 ms, doubling to 5 s, and while waiting publish fails at once with
 * AR_EUNAVAIL. Deliveries of a lost consumer connection are redelivered by the broker; the tags
 * handed out carry the connection's generation so an ack can never reach a later connection's
 * message of the same number. */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queue.h"

#define AMQ_CHANNEL 1
#define AMQ_BACKOFF_MIN_S 0.1
#define AMQ_BACKOFF_MAX_S 5.0
#define AMQ_CONNECT_TIMEOUT_S 2
#define AMQ_RPC_TIMEOUT_S 5
#define AMQ_CONFIRM_TIMEOUT_S 10.0
#define AMQ_CONFIRM_CHUNK 512 /* messages in flight before waiting for their confirms */
#define AMQ_HEARTBEAT_S 30    /* consumer connection; the publisher's has none (idle often) */
#define AMQ_FRAME_MAX 131072
#define AMQ_TAG_BITS 40 /* delivery tag bits of our tags; the rest is the connection's number */
#define AMQ_TAG_MASK ((UINT64_C(1) << AMQ_TAG_BITS) - 1)

struct amq_conn {
    amqp_connection_state_t c; /* NULL while down */
    double next_try;           /* ar_time_s(): no attempt before this */
    double backoff;            /* wait after the next failed attempt */
    bool warned;               /* this outage was logged */
};

struct amq_queue {
    struct queue base;
    char *host, *user, *pass, *vhost, *name; /* owned */
    int port;
    /* publishing: any thread, under pub_mu */
    pthread_mutex_t pub_mu;
    struct amq_conn pub;
    uint64_t pub_seq; /* messages published on pub.c (the broker's confirm numbering) */
    /* consuming: the consumer thread only */
    struct amq_conn con;
    uint64_t con_gen; /* consumer connections made; the high bits of our tags */
    int prefetch;
    /* read by queue_healthy from any thread */
    atomic_bool pub_ok, con_ok, con_used;
};

static struct amq_queue *aq_of(struct queue *q)
{
    return (struct amq_queue *)q;
}

/* ---- URL --------------------------------------------------------------------------------- */

static int hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes s[0..n) into a new string; NULL (and *bad) for a bad escape or a NUL. */
static char *pct_decode(const char *s, size_t n, bool *bad)
{
    char *o = ar_malloc(n + 1), *p = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            int hi = i + 2 < n ? hex_val(s[i + 1]) : -1, lo = i + 2 < n ? hex_val(s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                *bad = true;
                ar_free(o);
                return NULL;
            }
            *p++ = (char)(hi * 16 + lo);
            i += 2;
        } else {
            *p++ = s[i];
        }
    }
    *p = '\0';
    return o;
}

/* amqp://[user[:pass]@]host[:port][/vhost] into q's fields. */
static enum ar_status parse_url(struct amq_queue *q, const char *url, struct ar_err *err)
{
    const char *p = url + 7, *auth_end, *at = NULL, *host, *host_end, *port_s = NULL;
    bool bad = false;
    auth_end = p + strcspn(p, "/?#");
    if (strpbrk(p, "?#"))
        return ar_err_set(err, AR_EINVAL, 0, "queue URL: query and fragment are not supported");
    for (const char *s = p; s < auth_end; s++)
        if (*s == '@')
            at = s;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);
        q->user = pct_decode(p, ulen, &bad);
        if (q->user && colon)
            q->pass = pct_decode(colon + 1, (size_t)(at - colon - 1), &bad);
        else if (q->user)
            q->pass = ar_strdup("guest");
        if (!q->user || !q->pass)
            return bad ? ar_err_set(err, AR_EINVAL, 0, "queue URL: bad %%-escape in user:password")
                       : ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        if (!*q->user)
            return ar_err_set(err, AR_EINVAL, 0, "queue URL: empty user name before '@'");
        host = at + 1;
    } else {
        q->user = ar_strdup("guest");
        q->pass = ar_strdup("guest");
        if (!q->user || !q->pass)
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        host = p;
    }
    if (*host == '[') { /* [IPv6] */
        const char *rb = memchr(host, ']', (size_t)(auth_end - host));
        if (!rb)
            return ar_err_set(err, AR_EINVAL, 0, "queue URL: '[' without ']' in the host");
        q->host = ar_strndup(host + 1, (size_t)(rb - host - 1));
        host_end = rb + 1;
        if (host_end < auth_end && *host_end != ':')
            return ar_err_set(err, AR_EINVAL, 0, "queue URL: junk after ']' in the host");
        if (host_end < auth_end)
            port_s = host_end + 1;
    } else {
        const char *colon = memchr(host, ':', (size_t)(auth_end - host));
        host_end = colon ? colon : auth_end;
        q->host = ar_strndup(host, (size_t)(host_end - host));
        if (colon)
            port_s = colon + 1;
    }
    if (!q->host)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    if (!*q->host)
        return ar_err_set(err, AR_EINVAL, 0, "queue URL: no host in '%.100s'", url);
    q->port = 5672;
    if (port_s) {
        long v = 0;
        if (port_s == auth_end)
            return ar_err_set(err, AR_EINVAL, 0, "queue URL: empty port after ':'");
        for (const char *s = port_s; s < auth_end; s++) {
            if (*s < '0' || *s > '9' || v > 65535)
                return ar_err_set(err, AR_EINVAL, 0, "queue URL: bad port '%.*s'",
                                  (int)AR_MIN(auth_end - port_s, 20), port_s);
            v = v * 10 + (*s - '0');
        }
        if (v < 1 || v > 65535)
            return ar_err_set(err, AR_EINVAL, 0, "queue URL: port %ld out of 1..65535", v);
        q->port = (int)v;
    }
    if (*auth_end == '/' && auth_end[1]) {
        const char *v = auth_end + 1;
        if (strchr(v, '/'))
            return ar_err_set(err, AR_EINVAL, 0,
                              "queue URL: the vhost is one path segment (write '/' as %%2f)");
        q->vhost = pct_decode(v, strlen(v), &bad);
        if (!q->vhost)
            return bad ? ar_err_set(err, AR_EINVAL, 0, "queue URL: bad %%-escape in the vhost")
                       : ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    } else {
        q->vhost = ar_strdup("/"); /* "amqp://host" and "amqp://host/": the default vhost */
        if (!q->vhost)
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    return AR_OK;
}

/* ---- connections ------------------------------------------------------------------------- */

/* One line about an RPC reply that was not normal. */
static void reply_text(amqp_rpc_reply_t r, char *buf, size_t size)
{
    switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        snprintf(buf, size, "ok");
        break;
    case AMQP_RESPONSE_NONE:
        snprintf(buf, size, "no reply");
        break;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(buf, size, "%s", amqp_error_string2(r.library_error));
        break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD && r.reply.decoded) {
            const amqp_connection_close_t *m = r.reply.decoded;
            snprintf(buf, size, "broker closed the connection: %u %.*s", m->reply_code,
                     (int)AR_MIN(m->reply_text.len, 180), (const char *)m->reply_text.bytes);
        } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD && r.reply.decoded) {
            const amqp_channel_close_t *m = r.reply.decoded;
            snprintf(buf, size, "broker closed the channel: %u %.*s", m->reply_code,
                     (int)AR_MIN(m->reply_text.len, 180), (const char *)m->reply_text.bytes);
        } else {
            snprintf(buf, size, "broker error (method 0x%08x)", (unsigned)r.reply.id);
        }
        break;
    }
}

/* Closes and frees k's connection; graceful: says goodbye first (the broker is up). */
static void conn_close(struct amq_conn *k, bool graceful)
{
    if (!k->c)
        return;
    if (graceful) {
        amqp_channel_close(k->c, AMQ_CHANNEL, AMQP_REPLY_SUCCESS);
        amqp_connection_close(k->c, AMQP_REPLY_SUCCESS);
    }
    amqp_destroy_connection(k->c);
    k->c = NULL;
}

/* A connection that worked was lost: the next call reconnects at once (then backs off). */
static void conn_lost(struct amq_queue *q, struct amq_conn *k, const char *role, const char *why)
{
    conn_close(k, false);
    k->next_try = 0;
    k->backoff = AMQ_BACKOFF_MIN_S;
    if (!k->warned)
        AR_WARN("queue %s: %s connection to %s:%d lost: %s", q->name, role, q->host, q->port, why);
    k->warned = true;
}

static enum ar_status rpc_check(amqp_connection_state_t c, const char *what, char *why,
                                size_t why_size)
{
    amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
    char t[220];
    if (r.reply_type == AMQP_RESPONSE_NORMAL)
        return AR_OK;
    reply_text(r, t, sizeof(t));
    snprintf(why, why_size, "%s: %s", what, t);
    return AR_EUNAVAIL;
}

/* Makes k's connection: login, channel, the durable queue, then confirms (publisher) or qos and
 * a consumer. why receives the reason of a failure. */
static enum ar_status conn_open(struct amq_queue *q, struct amq_conn *k, bool consumer, char *why,
                                size_t why_size)
{
    struct timeval ctv = {AMQ_CONNECT_TIMEOUT_S, 0}, rtv = {AMQ_RPC_TIMEOUT_S, 0};
    amqp_connection_state_t c = amqp_new_connection();
    amqp_socket_t *s;
    amqp_rpc_reply_t r;
    amqp_bytes_t qname = amqp_cstring_bytes(q->name);
    int rc;
    if (!c) {
        snprintf(why, why_size, "out of memory");
        return AR_ENOMEM;
    }
    s = amqp_tcp_socket_new(c);
    if (!s) {
        amqp_destroy_connection(c);
        snprintf(why, why_size, "out of memory");
        return AR_ENOMEM;
    }
    rc = amqp_socket_open_noblock(s, q->host, q->port, &ctv);
    if (rc != AMQP_STATUS_OK) {
        amqp_destroy_connection(c);
        snprintf(why, why_size, "cannot connect (%s)", amqp_error_string2(rc));
        return AR_EUNAVAIL;
    }
    amqp_set_handshake_timeout(c, &rtv);
    amqp_set_rpc_timeout(c, &rtv);
    r = amqp_login(c, q->vhost, 0, AMQ_FRAME_MAX, consumer ? AMQ_HEARTBEAT_S : 0,
                   AMQP_SASL_METHOD_PLAIN, q->user, q->pass);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        char t[220];
        reply_text(r, t, sizeof(t));
        snprintf(why, why_size, "login as %s to vhost %s: %s", q->user, q->vhost, t);
        amqp_destroy_connection(c);
        return AR_EUNAVAIL;
    }
    amqp_channel_open(c, AMQ_CHANNEL);
    if (rpc_check(c, "channel.open", why, why_size) != AR_OK)
        goto fail;
    /* durable, not exclusive, not auto-deleted: it outlives every client and a broker restart */
    amqp_queue_declare(c, AMQ_CHANNEL, qname, 0, 1, 0, 0, amqp_empty_table);
    if (rpc_check(c, "queue.declare", why, why_size) != AR_OK)
        goto fail;
    if (consumer) {
        /* global: the channel's limit, which (unlike a per-consumer one) a later basic.qos
         * changes for the running consumer; the channel has this one consumer only */
        amqp_basic_qos(c, AMQ_CHANNEL, 0, (uint16_t)q->prefetch, 1);
        if (rpc_check(c, "basic.qos", why, why_size) != AR_OK)
            goto fail;
        amqp_basic_consume(c, AMQ_CHANNEL, qname, amqp_empty_bytes, 0, 0 /* manual ack */, 0,
                           amqp_empty_table);
        if (rpc_check(c, "basic.consume", why, why_size) != AR_OK)
            goto fail;
    } else {
        amqp_confirm_select(c, AMQ_CHANNEL);
        if (rpc_check(c, "confirm.select", why, why_size) != AR_OK)
            goto fail;
    }
    k->c = c;
    return AR_OK;
fail:
    amqp_destroy_connection(c);
    return AR_EUNAVAIL;
}

/* Connects k when it is down and its backoff allows; AR_EUNAVAIL (err filled) when it stays
 * down. */
static enum ar_status conn_ensure(struct amq_queue *q, struct amq_conn *k, bool consumer,
                                  struct ar_err *err)
{
    const char *role = consumer ? "consumer" : "publisher";
    char why[300];
    double now;
    enum ar_status st;
    if (k->c)
        return AR_OK;
    now = ar_time_s();
    if (now < k->next_try)
        return ar_err_set(err, AR_EUNAVAIL, 0,
                          "RabbitMQ at %s:%d is unreachable (next attempt in %.1f s)", q->host,
                          q->port, k->next_try - now);
    st = conn_open(q, k, consumer, why, sizeof(why));
    if (st != AR_OK) {
        k->next_try = ar_time_s() + k->backoff;
        k->backoff = AR_MIN(k->backoff * 2, AMQ_BACKOFF_MAX_S);
        if (!k->warned)
            AR_WARN("queue %s: %s cannot reach RabbitMQ at %s:%d: %s (retrying with backoff)",
                    q->name, role, q->host, q->port, why);
        k->warned = true;
        return ar_err_set(err, st, 0, "RabbitMQ at %s:%d: %s", q->host, q->port, why);
    }
    if (k->warned)
        AR_INFO("queue %s: %s connected to RabbitMQ at %s:%d again", q->name, role, q->host,
                q->port);
    k->warned = false;
    k->next_try = 0;
    k->backoff = AMQ_BACKOFF_MIN_S;
    return AR_OK;
}

/* ---- publishing -------------------------------------------------------------------------- */

/* Waits until the broker confirmed the messages numbered first..last on the publishing
 * connection. A nack or an unroutable message (basic.return: the queue is gone) fails. */
static enum ar_status wait_confirms(struct amq_queue *q, uint64_t first, uint64_t last,
                                    struct ar_err *err)
{
    amqp_connection_state_t c = q->pub.c;
    size_t m = (size_t)(last - first + 1), n_seen = 0;
    bool *seen = ar_calloc(m, sizeof(bool)), nacked = false, returned = false;
    double deadline = ar_time_s() + AMQ_CONFIRM_TIMEOUT_S;
    enum ar_status st = AR_OK;
    if (!seen)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    while (n_seen < m) {
        amqp_frame_t f;
        double left = deadline - ar_time_s();
        struct timeval tv;
        int rc;
        if (left <= 0) {
            conn_lost(q, &q->pub, "publisher", "no confirm within the timeout");
            st = ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ did not confirm within %.0f s",
                            AMQ_CONFIRM_TIMEOUT_S);
            break;
        }
        tv.tv_sec = (time_t)left;
        tv.tv_usec = (suseconds_t)((left - (double)tv.tv_sec) * 1e6);
        rc = amqp_simple_wait_frame_noblock(c, &f, &tv);
        if (rc == AMQP_STATUS_TIMEOUT)
            continue;
        if (rc != AMQP_STATUS_OK) {
            conn_lost(q, &q->pub, "publisher", amqp_error_string2(rc));
            st = ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ connection lost: %s",
                            amqp_error_string2(rc));
            break;
        }
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        if (f.payload.method.id == AMQP_BASIC_ACK_METHOD ||
            f.payload.method.id == AMQP_BASIC_NACK_METHOD) {
            uint64_t tag;
            bool multiple;
            if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
                const amqp_basic_ack_t *a = f.payload.method.decoded;
                tag = a->delivery_tag;
                multiple = a->multiple;
            } else {
                const amqp_basic_nack_t *a = f.payload.method.decoded;
                tag = a->delivery_tag;
                multiple = a->multiple;
                nacked = true;
            }
            /* tags outside first..last belong to an earlier, failed call: ignored */
            for (uint64_t t = multiple ? first : tag; t <= tag && t <= last; t++) {
                if (t >= first && !seen[t - first]) {
                    seen[t - first] = true;
                    n_seen++;
                }
            }
        } else if (f.payload.method.id == AMQP_BASIC_RETURN_METHOD) {
            amqp_message_t msg;
            amqp_rpc_reply_t r = amqp_read_message(c, f.channel, &msg, 0);
            returned = true;
            if (r.reply_type != AMQP_RESPONSE_NORMAL) {
                conn_lost(q, &q->pub, "publisher", "reading a returned message");
                st = ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ connection lost");
                break;
            }
            amqp_destroy_message(&msg);
        } else if (f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
                   f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD) {
            amqp_rpc_reply_t r;
            char t[220];
            r.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION;
            r.reply = f.payload.method;
            r.library_error = 0;
            reply_text(r, t, sizeof(t));
            conn_lost(q, &q->pub, "publisher", t);
            st = ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ: %s", t);
            break;
        }
    }
    ar_free(seen);
    if (st == AR_OK && q->pub.c)
        amqp_maybe_release_buffers(q->pub.c);
    if (st == AR_OK && returned) {
        /* unroutable: the queue was deleted; a new connection declares it again */
        conn_close(&q->pub, true);
        st = ar_err_set(err, AR_EUNAVAIL, 0,
                        "queue %s is missing on the broker (declared again "
                        "on the next attempt)",
                        q->name);
    } else if (st == AR_OK && nacked) {
        st = ar_err_set(err, AR_EIO, 0, "RabbitMQ refused a message (nack)");
    }
    return st;
}

static enum ar_status publish_on(struct amq_queue *q, const struct queue_body *b, size_t n,
                                 struct ar_err *err)
{
    amqp_basic_properties_t props;
    amqp_bytes_t rk = amqp_cstring_bytes(q->name);
    memset(&props, 0, sizeof(props));
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT; /* written to disk before the confirm */
    props.content_type = amqp_cstring_bytes("application/octet-stream");
    for (size_t i0 = 0; i0 < n; i0 += AMQ_CONFIRM_CHUNK) {
        size_t m = AR_MIN((size_t)AMQ_CONFIRM_CHUNK, n - i0);
        uint64_t first = q->pub_seq + 1;
        enum ar_status st;
        for (size_t i = i0; i < i0 + m; i++) {
            amqp_bytes_t body;
            int rc;
            body.len = b[i].len;
            body.bytes = (void *)(uintptr_t)b[i].data;
            /* the default exchange routes by queue name; mandatory: an unroutable message
             * comes back (basic.return) instead of vanishing */
            rc =
                amqp_basic_publish(q->pub.c, AMQ_CHANNEL, amqp_empty_bytes, rk, 1, 0, &props, body);
            if (rc != AMQP_STATUS_OK) {
                conn_lost(q, &q->pub, "publisher", amqp_error_string2(rc));
                return ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ publish: %s",
                                  amqp_error_string2(rc));
            }
            q->pub_seq++;
        }
        if ((st = wait_confirms(q, first, q->pub_seq, err)) != AR_OK)
            return st;
    }
    return AR_OK;
}

static enum ar_status amq_publish_many(struct queue *qq, const struct queue_body *b, size_t n,
                                       struct ar_err *err)
{
    struct amq_queue *q = aq_of(qq);
    enum ar_status st;
    pthread_mutex_lock(&q->pub_mu);
    for (int attempt = 0;; attempt++) {
        bool fresh = !q->pub.c;
        if ((st = conn_ensure(q, &q->pub, false, err)) != AR_OK)
            break;
        if (fresh)
            q->pub_seq = 0; /* confirm numbers start again on a new channel */
        st = publish_on(q, b, n, err);
        /* a connection that went stale while idle (e.g. the broker restarted) is retried at
         * once on a new one; a fresh one that fails means the broker is down */
        if (st != AR_EUNAVAIL || fresh || attempt > 0)
            break;
    }
    atomic_store(&q->pub_ok, q->pub.c != NULL);
    pthread_mutex_unlock(&q->pub_mu);
    return st;
}

/* ---- consuming --------------------------------------------------------------------------- */

static void sleep_s(double s)
{
    struct timespec ts;
    if (s <= 0)
        return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* Handles a frame that is not a delivery on the consumer connection; false when the
 * connection is gone. */
static bool consumer_other_frame(struct amq_queue *q)
{
    amqp_frame_t f;
    struct timeval tv = {0, 100000};
    int rc = amqp_simple_wait_frame_noblock(q->con.c, &f, &tv);
    if (rc == AMQP_STATUS_TIMEOUT)
        return true;
    if (rc != AMQP_STATUS_OK) {
        conn_lost(q, &q->con, "consumer", amqp_error_string2(rc));
        return false;
    }
    if (f.frame_type == AMQP_FRAME_METHOD && (f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
                                              f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD ||
                                              f.payload.method.id == AMQP_BASIC_CANCEL_METHOD)) {
        /* the broker closed us or cancelled the consumer (e.g. the queue was deleted): a new
         * connection declares the queue and consumes again */
        char t[220];
        amqp_rpc_reply_t r;
        r.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION;
        r.reply = f.payload.method;
        r.library_error = 0;
        if (f.payload.method.id == AMQP_BASIC_CANCEL_METHOD)
            snprintf(t, sizeof(t), "the broker cancelled the consumer");
        else
            reply_text(r, t, sizeof(t));
        conn_lost(q, &q->con, "consumer", t);
        return false;
    }
    return true; /* anything else is of no use to a consumer */
}

static enum ar_status amq_get(struct queue *qq, double timeout_s, struct queue_msg *out,
                              struct ar_err *err)
{
    struct amq_queue *q = aq_of(qq);
    double deadline = ar_time_s() + timeout_s;
    atomic_store(&q->con_used, true);
    for (;;) {
        amqp_envelope_t env;
        amqp_rpc_reply_t r;
        struct timeval tv;
        double left;
        if (!q->con.c) {
            enum ar_status st = conn_ensure(q, &q->con, true, err);
            if (st == AR_OK) {
                q->con_gen++;
                atomic_store(&q->con_ok, true);
            } else {
                double now = ar_time_s();
                atomic_store(&q->con_ok, false);
                if (now >= deadline)
                    return st;
                sleep_s(AR_MIN(deadline, AR_MAX(q->con.next_try, now + 0.001)) - now);
                continue;
            }
        }
        left = AR_MAX(0.0, deadline - ar_time_s());
        tv.tv_sec = (time_t)left;
        tv.tv_usec = (suseconds_t)((left - (double)tv.tv_sec) * 1e6);
        amqp_maybe_release_buffers(q->con.c);
        r = amqp_consume_message(q->con.c, &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            out->body = ar_malloc(env.message.body.len + 1);
            if (!out->body) {
                /* not ours to drop: back to the queue */
                amqp_basic_nack(q->con.c, AMQ_CHANNEL, env.delivery_tag, 0, 1);
                amqp_destroy_envelope(&env);
                return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
            }
            if (env.message.body.len)
                memcpy(out->body, env.message.body.bytes, env.message.body.len);
            out->body[env.message.body.len] = '\0';
            out->len = env.message.body.len;
            out->tag = (q->con_gen << AMQ_TAG_BITS) | (env.delivery_tag & AMQ_TAG_MASK);
            out->redelivered = env.redelivered != 0;
            amqp_destroy_envelope(&env);
            return AR_OK;
        }
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT)
            return ar_err_set(err, AR_EBUSY, 0, "no message within %.3f s", timeout_s);
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            consumer_other_frame(q);
        } else {
            char t[220];
            reply_text(r, t, sizeof(t));
            conn_lost(q, &q->con, "consumer", t);
        }
        if (!q->con.c)
            atomic_store(&q->con_ok, false);
        if (ar_time_s() >= deadline && !q->con.c)
            return ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ at %s:%d: connection lost", q->host,
                              q->port);
    }
}

/* Our tag's delivery tag on the current consumer connection, or false when the delivery came
 * on a connection that is gone (the broker has put it back already). */
static bool tag_current(const struct amq_queue *q, uint64_t tag, uint64_t *dtag)
{
    if (!q->con.c || (tag >> AMQ_TAG_BITS) != q->con_gen)
        return false;
    *dtag = tag & AMQ_TAG_MASK;
    return true;
}

/* Acks a delivery (ack), or nacks it (requeue: back to the queue), on the consumer connection
 * it came on. */
static enum ar_status settle(struct queue *qq, uint64_t tag, bool ack, bool requeue,
                             struct ar_err *err)
{
    struct amq_queue *q = aq_of(qq);
    uint64_t dtag;
    int rc;
    if (!tag_current(q, tag, &dtag))
        return ar_err_set(err, AR_EUNAVAIL, 0,
                          "the delivery's connection is gone: RabbitMQ redelivers the message");
    rc = ack ? amqp_basic_ack(q->con.c, AMQ_CHANNEL, dtag, 0)
             : amqp_basic_nack(q->con.c, AMQ_CHANNEL, dtag, 0, requeue ? 1 : 0);
    if (rc != AMQP_STATUS_OK) {
        conn_lost(q, &q->con, "consumer", amqp_error_string2(rc));
        return ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ %s: %s", ack ? "ack" : "nack",
                          amqp_error_string2(rc));
    }
    return AR_OK;
}

static enum ar_status amq_ack(struct queue *qq, uint64_t tag, struct ar_err *err)
{
    return settle(qq, tag, true, false, err);
}

static enum ar_status amq_nack(struct queue *qq, uint64_t tag, bool requeue, struct ar_err *err)
{
    return settle(qq, tag, false, requeue, err);
}

static enum ar_status amq_set_prefetch(struct queue *qq, int n, struct ar_err *err)
{
    struct amq_queue *q = aq_of(qq);
    char why[300];
    q->prefetch = n; /* a later connection starts with it */
    if (!q->con.c)
        return AR_OK;
    amqp_basic_qos(q->con.c, AMQ_CHANNEL, 0, (uint16_t)n, 1);
    if (rpc_check(q->con.c, "basic.qos", why, sizeof(why)) != AR_OK) {
        conn_lost(q, &q->con, "consumer", why);
        atomic_store(&q->con_ok, false);
        return ar_err_set(err, AR_EUNAVAIL, 0, "RabbitMQ %s", why);
    }
    return AR_OK;
}

static void amq_consumer_close(struct queue *qq)
{
    struct amq_queue *q = aq_of(qq);
    conn_close(&q->con, true); /* the broker puts every unacked delivery back */
    atomic_store(&q->con_used, false);
}

static bool amq_healthy(struct queue *qq)
{
    struct amq_queue *q = aq_of(qq);
    bool ok;
    pthread_mutex_lock(&q->pub_mu);
    if (q->pub.c) {
        /* an idle connection learns of a broker shutdown only by reading */
        amqp_frame_t f;
        struct timeval tv = {0, 0};
        int rc = amqp_simple_wait_frame_noblock(q->pub.c, &f, &tv);
        if (rc != AMQP_STATUS_OK && rc != AMQP_STATUS_TIMEOUT)
            conn_lost(q, &q->pub, "publisher", amqp_error_string2(rc));
        else if (rc == AMQP_STATUS_OK && f.frame_type == AMQP_FRAME_METHOD &&
                 (f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD ||
                  f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD))
            conn_lost(q, &q->pub, "publisher", "closed by the broker");
    }
    if (!q->pub.c && conn_ensure(q, &q->pub, false, NULL) == AR_OK)
        q->pub_seq = 0;
    ok = q->pub.c != NULL;
    atomic_store(&q->pub_ok, ok);
    pthread_mutex_unlock(&q->pub_mu);
    return ok && (!atomic_load(&q->con_used) || atomic_load(&q->con_ok));
}

static void amq_destroy(struct queue *qq)
{
    struct amq_queue *q = aq_of(qq);
    conn_close(&q->con, true);
    conn_close(&q->pub, true);
    pthread_mutex_destroy(&q->pub_mu);
    ar_free(q->host);
    ar_free(q->user);
    ar_free(q->pass);
    ar_free(q->vhost);
    ar_free(q->name);
    ar_free(q);
}

static const struct queue_ops amq_ops = {
    .name = "amqp",
    .durable = true,
    .publish_many = amq_publish_many,
    .get = amq_get,
    .ack = amq_ack,
    .nack = amq_nack,
    .set_prefetch = amq_set_prefetch,
    .consumer_close = amq_consumer_close,
    .healthy = amq_healthy,
    .destroy = amq_destroy,
};

enum ar_status queue_amqp_create(const char *url, const char *name, struct queue **out,
                                 struct ar_err *err)
{
    struct amq_queue *q;
    enum ar_status st;
    if (!out)
        return ar_err_set(err, AR_EINVAL, 0, "no output handle");
    *out = NULL;
    if (!url || strncmp(url, "amqp://", 7) != 0)
        return ar_err_set(err, AR_EINVAL, 0, "queue URL must start with amqp://");
    if (!name)
        name = QUEUE_DEFAULT_NAME;
    if (!*name || strlen(name) > 255)
        return ar_err_set(err, AR_EINVAL, 0, "queue name must be 1..255 bytes");
    q = ar_calloc(1, sizeof(*q));
    if (!q)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    q->base.ops = &amq_ops;
    pthread_mutex_init(&q->pub_mu, NULL);
    q->pub.backoff = q->con.backoff = AMQ_BACKOFF_MIN_S;
    q->prefetch = 1;
    atomic_init(&q->pub_ok, false);
    atomic_init(&q->con_ok, false);
    atomic_init(&q->con_used, false);
    q->name = ar_strdup(name);
    if (!q->name) {
        amq_destroy(&q->base);
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    if ((st = parse_url(q, url, err)) != AR_OK) {
        amq_destroy(&q->base);
        return st;
    }
    /* connect now when the broker is there (it declares the queue early); a broker that is
     * down is no error: the first use connects */
    pthread_mutex_lock(&q->pub_mu);
    if (conn_ensure(q, &q->pub, false, NULL) == AR_OK)
        atomic_store(&q->pub_ok, true);
    pthread_mutex_unlock(&q->pub_mu);
    *out = &q->base;
    return AR_OK;
}
