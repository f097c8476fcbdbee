/* queue_test.c - the job queue over both implementations: binary-safe round trips, nack and
 * redelivery, prefetch windows, a closed consumer's messages coming back, the memory queue's
 * bound and bad URLs; and against a real RabbitMQ (AR_TEST_AMQP_URL; the tests fail without
 * it): two consumers sharing a queue, a consumer killed with SIGKILL whose messages come back,
 * and a private broker stopped and started again (messages survive, publish fails fast while it
 * is down, consumption resumes by itself). The broker's own counts (a passive queue.declare on
 * a separate raw connection) are the independent check that nothing is lost or left over. */
#include "harness/harness.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness/private_services.h"

#include "base/base.h"
#include "queue/queue.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* A queue name no other test (or run) uses. */
static void unique_name(char *buf, size_t size, const char *what)
{
    static int counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, size, "ar-test-%s-%d-%ld%09ld-%d", what, (int)getpid(), (long)ts.tv_sec,
             ts.tv_nsec, ++counter);
}

/* A raw connection to the broker of url (host and port taken from it; guest, vhost "/"), for
 * the broker's own view. NULL when it cannot connect. */
static amqp_connection_state_t raw_connect(const char *url)
{
    char host[128] = "";
    int port = 0;
    amqp_connection_state_t c;
    amqp_socket_t *s;
    amqp_rpc_reply_t r;
    if (sscanf(url, "amqp://%*[^@]@%127[^:]:%d", host, &port) != 2)
        return NULL;
    c = amqp_new_connection();
    s = amqp_tcp_socket_new(c);
    if (!s || amqp_socket_open(s, host, port) != AMQP_STATUS_OK) {
        amqp_destroy_connection(c);
        return NULL;
    }
    r = amqp_login(c, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest");
    if (r.reply_type != AMQP_RESPONSE_NORMAL || !amqp_channel_open(c, 1)) {
        amqp_destroy_connection(c);
        return NULL;
    }
    return c;
}

static void raw_close(amqp_connection_state_t c)
{
    amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
    amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c);
}

/* Ready messages in the queue as the broker counts them (unacked ones excluded); -1 when the
 * queue does not exist. */
static long raw_ready(const char *url, const char *name)
{
    amqp_connection_state_t c = raw_connect(url);
    amqp_queue_declare_ok_t *ok;
    long n;
    if (!c)
        fail_msg("cannot reach the broker at %s", url);
    ok = amqp_queue_declare(c, 1, amqp_cstring_bytes(name), 1 /* passive */, 0, 0, 0,
                            amqp_empty_table);
    n = ok ? (long)ok->message_count : -1;
    if (ok)
        raw_close(c);
    else
        amqp_destroy_connection(c);
    return n;
}

static void raw_delete(const char *url, const char *name)
{
    amqp_connection_state_t c = raw_connect(url);
    if (!c)
        return;
    amqp_queue_delete(c, 1, amqp_cstring_bytes(name), 0, 0);
    raw_close(c);
}

static struct queue *open_queue(const char *url, const char *name)
{
    struct queue_params p = queue_default_params();
    struct queue *q = NULL;
    struct ar_err err = {0};
    enum ar_status st;
    p.name = name;
    st = queue_open(url, &p, &q, &err);
    if (st != AR_OK)
        fail_msg("queue_open(%s): %s: %s", url ? url : "memory", ar_status_str(st), err.msg);
    return q;
}

static void publish_str(struct queue *q, const char *s)
{
    struct ar_err err = {0};
    enum ar_status st = queue_publish(q, s, strlen(s), &err);
    if (st != AR_OK)
        fail_msg("publish %s: %s: %s", s, ar_status_str(st), err.msg);
}

/* Gets one message within timeout_s or fails the test. */
static void get_one(struct queue *q, double timeout_s, struct queue_msg *m)
{
    struct ar_err err = {0};
    enum ar_status st = queue_get(q, timeout_s, m, &err);
    if (st != AR_OK)
        fail_msg("get: %s: %s", ar_status_str(st), err.msg);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- fixture: one queue of either kind ---------------------------------------------------- */

enum kind { KIND_MEMORY, KIND_AMQP };
static enum kind kind_memory = KIND_MEMORY, kind_amqp = KIND_AMQP;

struct fx {
    enum kind kind;
    const char *url; /* NULL for memory */
    char name[128];
    struct queue *q;
};

static int setup(void **state)
{
    struct fx *x = calloc(1, sizeof(*x));
    x->kind = *(const enum kind *)*state;
    x->url = x->kind == KIND_AMQP ? th_env_url("AR_TEST_AMQP_URL") : NULL;
    unique_name(x->name, sizeof(x->name), "q");
    x->q = open_queue(x->url, x->name);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fx *x = *state;
    queue_destroy(x->q);
    if (x->kind == KIND_AMQP)
        raw_delete(x->url, x->name);
    free(x);
    return 0;
}

/* ---- both implementations ---------------------------------------------------------------- */

static void round_trip_keeps_binary_bodies(void **state)
{
    struct fx *x = *state;
    static unsigned char big[70000];
    const unsigned char nul3[3] = {'a', 0, 'b'};
    struct queue_body b[4];
    struct th_rng rng = {42};
    struct queue_msg m;
    struct ar_err err = {0};
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)th_rng_u64(&rng);
    b[0] = (struct queue_body){nul3, 3};
    b[1] = (struct queue_body){"", 0};
    b[2] = (struct queue_body){big, sizeof(big)};
    b[3] = (struct queue_body){"\xff\xfe\x00\x01", 4};
    assert_int_equal(queue_publish_many(x->q, b, 4, &err), AR_OK);
    assert_int_equal(queue_set_prefetch(x->q, 4, NULL), AR_OK);
    for (int i = 0; i < 4; i++) { /* one consumer: in publishing order */
        get_one(x->q, 5, &m);
        assert_int_equal(m.len, b[i].len);
        if (b[i].len)
            assert_memory_equal(m.body, b[i].data, b[i].len);
        assert_int_equal(m.body[m.len], '\0');
        assert_false(m.redelivered);
        assert_int_equal(queue_ack(x->q, m.tag, &err), AR_OK);
        queue_msg_fini(&m);
    }
    /* nothing is left: a short get times out */
    {
        double t0 = ar_time_s();
        assert_int_equal(queue_get(x->q, 0.3, &m, &err), AR_EBUSY);
        assert_true(ar_time_s() - t0 >= 0.25);
    }
    if (x->kind == KIND_AMQP)
        assert_int_equal(raw_ready(x->url, x->name), 0);
    /* arguments */
    assert_int_equal(queue_publish(x->q, NULL, 1, NULL), AR_EINVAL);
    assert_int_equal(queue_set_prefetch(x->q, 0, NULL), AR_EINVAL);
    assert_int_equal(queue_get(x->q, -1, &m, NULL), AR_EINVAL);
    {
        char *huge = calloc(1, QUEUE_BODY_MAX + 1);
        assert_int_equal(queue_publish(x->q, huge, QUEUE_BODY_MAX + 1, &err), AR_EINVAL);
        free(huge);
    }
}

static void nack_requeue_redelivers_with_the_flag(void **state)
{
    struct fx *x = *state;
    struct queue_msg m, m2;
    struct ar_err err = {0};
    publish_str(x->q, "first");
    get_one(x->q, 5, &m);
    assert_string_equal(m.body, "first");
    assert_false(m.redelivered);
    assert_int_equal(queue_nack(x->q, m.tag, true, &err), AR_OK);
    get_one(x->q, 5, &m2);
    assert_string_equal(m2.body, "first");
    assert_true(m2.redelivered);
    assert_int_equal(queue_ack(x->q, m2.tag, &err), AR_OK);
    queue_msg_fini(&m);
    queue_msg_fini(&m2);
    /* nack without requeue drops the message */
    publish_str(x->q, "dropped");
    get_one(x->q, 5, &m);
    assert_int_equal(queue_nack(x->q, m.tag, false, &err), AR_OK);
    queue_msg_fini(&m);
    assert_int_equal(queue_get(x->q, 0.3, &m, &err), AR_EBUSY);
    if (x->kind == KIND_AMQP)
        assert_int_equal(raw_ready(x->url, x->name), 0);
}

static void prefetch_bounds_what_one_consumer_holds(void **state)
{
    struct fx *x = *state;
    struct queue_msg m[5];
    struct queue_msg extra;
    char s[16];
    for (int i = 0; i < 5; i++) {
        snprintf(s, sizeof(s), "m%d", i);
        publish_str(x->q, s);
    }
    assert_int_equal(queue_set_prefetch(x->q, 2, NULL), AR_OK);
    get_one(x->q, 5, &m[0]);
    get_one(x->q, 5, &m[1]);
    /* two held unacked: the third does not come */
    assert_int_equal(queue_get(x->q, 0.5, &extra, NULL), AR_EBUSY);
    /* an ack opens the window by one */
    assert_int_equal(queue_ack(x->q, m[0].tag, NULL), AR_OK);
    get_one(x->q, 5, &m[2]);
    assert_int_equal(queue_get(x->q, 0.5, &extra, NULL), AR_EBUSY);
    /* a larger prefetch applies at once to the running consumer */
    assert_int_equal(queue_set_prefetch(x->q, 4, NULL), AR_OK);
    get_one(x->q, 5, &m[3]);
    get_one(x->q, 5, &m[4]);
    for (int i = 0; i < 5; i++) {
        snprintf(s, sizeof(s), "m%d", i);
        assert_string_equal(m[i].body, s);
        if (i > 0)
            assert_int_equal(queue_ack(x->q, m[i].tag, NULL), AR_OK);
        queue_msg_fini(&m[i]);
    }
    assert_int_equal(queue_get(x->q, 0.3, &extra, NULL), AR_EBUSY);
}

static void closed_consumer_gives_its_messages_back(void **state)
{
    struct fx *x = *state;
    struct queue_msg a, b, c;
    publish_str(x->q, "one");
    publish_str(x->q, "two");
    publish_str(x->q, "three");
    assert_int_equal(queue_set_prefetch(x->q, 2, NULL), AR_OK);
    get_one(x->q, 5, &a);
    get_one(x->q, 5, &b);
    assert_string_equal(a.body, "one");
    assert_string_equal(b.body, "two");
    queue_consumer_close(x->q);
    /* a tag of the closed consumer acks nothing */
    assert_int_not_equal(queue_ack(x->q, a.tag, NULL), AR_OK);
    assert_int_equal(queue_set_prefetch(x->q, 3, NULL), AR_OK);
    {
        /* both come back (redelivered), and the third one too: three distinct, none lost */
        struct queue_msg got[3];
        int seen_one = 0, seen_two = 0, seen_three = 0;
        for (int i = 0; i < 3; i++) {
            get_one(x->q, 5, &got[i]);
            if (!strcmp(got[i].body, "one")) {
                seen_one++;
                assert_true(got[i].redelivered);
            } else if (!strcmp(got[i].body, "two")) {
                seen_two++;
                assert_true(got[i].redelivered);
            } else if (!strcmp(got[i].body, "three")) {
                seen_three++;
                assert_false(got[i].redelivered);
            }
            assert_int_equal(queue_ack(x->q, got[i].tag, NULL), AR_OK);
            queue_msg_fini(&got[i]);
        }
        assert_int_equal(seen_one, 1);
        assert_int_equal(seen_two, 1);
        assert_int_equal(seen_three, 1);
    }
    assert_int_equal(queue_get(x->q, 0.3, &c, NULL), AR_EBUSY);
    queue_msg_fini(&a);
    queue_msg_fini(&b);
    if (x->kind == KIND_AMQP)
        assert_int_equal(raw_ready(x->url, x->name), 0);
}

/* ---- memory only ------------------------------------------------------------------------- */

static void memory_queue_is_bounded(void **state)
{
    struct queue *q = NULL;
    struct queue_body two[2] = {{"x", 1}, {"y", 1}};
    struct queue_msg m;
    struct ar_err err = {0};
    (void)state;
    assert_int_equal(queue_memory_create(3, &q), AR_OK);
    assert_false(queue_durable(q));
    assert_true(queue_healthy(q));
    publish_str(q, "a");
    publish_str(q, "b");
    /* all or nothing: two do not fit beside two */
    assert_int_equal(queue_publish_many(q, two, 2, &err), AR_EBUSY);
    assert_non_null(strstr(err.msg, "full"));
    publish_str(q, "c");
    assert_int_equal(queue_publish(q, "d", 1, NULL), AR_EBUSY);
    /* unacked messages count: getting one frees no room, acking it does */
    get_one(q, 1, &m);
    assert_string_equal(m.body, "a");
    assert_int_equal(queue_publish(q, "d", 1, NULL), AR_EBUSY);
    assert_int_equal(queue_ack(q, m.tag, NULL), AR_OK);
    assert_int_equal(queue_ack(q, m.tag, NULL), AR_EINVAL); /* twice: unknown */
    queue_msg_fini(&m);
    publish_str(q, "d");
    queue_destroy(q); /* frees what is left (ASan checks) */
}

/* A consumer blocked in get wakes up when another thread publishes. */
struct pub_later {
    struct queue *q;
};
static void *publish_later(void *arg)
{
    struct pub_later *p = arg;
    sleep_ms(200);
    publish_str(p->q, "late");
    return NULL;
}

static void get_wakes_when_a_message_is_published(void **state)
{
    struct fx *x = *state;
    pthread_t th;
    struct pub_later p = {x->q};
    struct queue_msg m;
    double t0 = ar_time_s();
    assert_int_equal(pthread_create(&th, NULL, publish_later, &p), 0);
    get_one(x->q, 10, &m);
    assert_true(ar_time_s() - t0 < 5);
    assert_string_equal(m.body, "late");
    assert_int_equal(queue_ack(x->q, m.tag, NULL), AR_OK);
    queue_msg_fini(&m);
    pthread_join(th, NULL);
}

/* ---- URLs -------------------------------------------------------------------------------- */

static void bad_urls_are_refused_with_a_message(void **state)
{
    static const char *const bad[] = {
        "amqp://127.0.0.1:0/",
        "amqp://127.0.0.1:99999/",
        "amqp://127.0.0.1:12ab/",
        "amqp://127.0.0.1:/",
        "amqp://:5672/",
        "amqp://u:p@/",
        "amqp://h/a/b",
        "amqp://h/%zz",
        "amqp://u%2:p@h/",
        "amqp://h/?heartbeat=10",
        "amqps://h/",
        "http://h/",
        "amqp://[::1/",
        "amqp://@h/",
    };
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
        struct queue *q = (struct queue *)1;
        struct ar_err err = {0};
        enum ar_status st = queue_open(bad[i], NULL, &q, &err);
        if (st != AR_EINVAL)
            fail_msg("%s: %s, not EINVAL", bad[i], ar_status_str(st));
        assert_null(q);
        assert_true(strlen(err.msg) > 10);
    }
    {
        struct queue *q = NULL;
        struct ar_err err = {0};
        assert_int_equal(queue_amqp_create("amqp://h/", "", &q, &err), AR_EINVAL);
        assert_non_null(strstr(err.msg, "name"));
    }
}

/* A broker that is not there: creating works, publish fails at once, get waits its timeout. */
static void unreachable_broker_fails_fast_and_create_still_works(void **state)
{
    struct queue *q = NULL;
    struct queue_msg m;
    struct ar_err err = {0};
    double t0;
    char name[128];
    (void)state;
    unique_name(name, sizeof(name), "down");
    /* port 1 on loopback: nobody listens, connections are refused */
    assert_int_equal(queue_amqp_create("amqp://guest:guest@127.0.0.1:1/", name, &q, &err), AR_OK);
    assert_true(queue_durable(q));
    assert_false(queue_healthy(q));
    for (int i = 0; i < 20; i++) {
        t0 = ar_time_s();
        assert_int_equal(queue_publish(q, "x", 1, &err), AR_EUNAVAIL);
        assert_true(ar_time_s() - t0 < 1.0); /* no connect or confirm wait */
        assert_non_null(strstr(err.msg, "127.0.0.1:1"));
    }
    t0 = ar_time_s();
    assert_int_equal(queue_get(q, 0.4, &m, &err), AR_EUNAVAIL);
    assert_true(ar_time_s() - t0 >= 0.35 && ar_time_s() - t0 < 3);
    queue_destroy(q);
}

/* ---- RabbitMQ: two consumers, kill -9, broker restart ------------------------------------ */

static void second_consumer_gets_what_the_first_cannot_hold(void **state)
{
    struct fx *x = *state;
    struct queue *b = open_queue(x->url, x->name);
    struct queue_msg held[2], m;
    int seen[6] = {0};
    char s[16];
    for (int i = 0; i < 6; i++) {
        snprintf(s, sizeof(s), "%d", i);
        publish_str(x->q, s);
    }
    assert_int_equal(queue_set_prefetch(x->q, 2, NULL), AR_OK);
    assert_int_equal(queue_set_prefetch(b, 100, NULL), AR_OK);
    get_one(x->q, 5, &held[0]);
    get_one(x->q, 5, &held[1]);
    seen[atoi(held[0].body)]++;
    seen[atoi(held[1].body)]++;
    /* consumer A holds two; every other message goes to B */
    for (int i = 0; i < 4; i++) {
        get_one(b, 5, &m);
        seen[atoi(m.body)]++;
        assert_int_equal(queue_ack(b, m.tag, NULL), AR_OK);
        queue_msg_fini(&m);
    }
    assert_int_equal(queue_get(x->q, 0.5, &m, NULL), AR_EBUSY);
    assert_int_equal(queue_get(b, 0.5, &m, NULL), AR_EBUSY);
    for (int i = 0; i < 6; i++)
        assert_int_equal(seen[i], 1);
    /* the broker still holds A's two, unacked: none ready */
    assert_int_equal(raw_ready(x->url, x->name), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(queue_ack(x->q, held[i].tag, NULL), AR_OK);
        queue_msg_fini(&held[i]);
    }
    queue_destroy(b);
}

#define KILL_TOTAL 10
#define KILL_HELD 4

static void killed_consumer_messages_are_redelivered_none_lost(void **state)
{
    struct fx *x = *state;
    int fds[2];
    pid_t pid;
    char child_got[KILL_HELD][16];
    int seen[KILL_TOTAL] = {0}, redelivered = 0, status;
    char s[16];
    for (int i = 0; i < KILL_TOTAL; i++) {
        snprintf(s, sizeof(s), "%d", i);
        publish_str(x->q, s);
    }
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the child: its own connection; takes KILL_HELD messages, never acks, waits to die */
        struct queue *cq = NULL;
        struct queue_params p = queue_default_params();
        close(fds[0]);
        p.name = x->name;
        if (queue_open(x->url, &p, &cq, NULL) != AR_OK ||
            queue_set_prefetch(cq, KILL_HELD, NULL) != AR_OK)
            _exit(3);
        for (int i = 0; i < KILL_HELD; i++) {
            struct queue_msg m;
            char line[16] = {0};
            if (queue_get(cq, 10, &m, NULL) != AR_OK)
                _exit(4);
            snprintf(line, sizeof(line), "%s", m.body);
            if (write(fds[1], line, sizeof(line)) != (ssize_t)sizeof(line))
                _exit(5);
        }
        for (;;)
            pause();
    }
    close(fds[1]);
    for (int i = 0; i < KILL_HELD; i++)
        assert_int_equal(read(fds[0], child_got[i], 16), 16);
    close(fds[0]);
    /* the broker counts the child's four as unacked, the rest ready */
    assert_int_equal(raw_ready(x->url, x->name), KILL_TOTAL - KILL_HELD);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* the parent's consumer gets all ten: the child's four again, redelivered */
    assert_int_equal(queue_set_prefetch(x->q, KILL_TOTAL, NULL), AR_OK);
    for (int i = 0; i < KILL_TOTAL; i++) {
        struct queue_msg m;
        bool was_child = false;
        get_one(x->q, 10, &m);
        seen[atoi(m.body)]++;
        for (int k = 0; k < KILL_HELD; k++)
            was_child |= !strcmp(child_got[k], m.body);
        assert_int_equal(m.redelivered, was_child);
        redelivered += m.redelivered;
        assert_int_equal(queue_ack(x->q, m.tag, NULL), AR_OK);
        queue_msg_fini(&m);
    }
    for (int i = 0; i < KILL_TOTAL; i++)
        assert_int_equal(seen[i], 1);
    assert_int_equal(redelivered, KILL_HELD);
    {
        struct queue_msg m;
        assert_int_equal(queue_get(x->q, 0.3, &m, NULL), AR_EBUSY);
    }
    assert_int_equal(raw_ready(x->url, x->name), 0);
}

/* Runs deploy/services.sh with args; its stdout's first line into out (may be NULL). */
static int services(const char *args, char *out, size_t out_size)
{
    char cmd[512];
    FILE *p;
    int rc;
    snprintf(cmd, sizeof(cmd), "sh deploy/services.sh %s", args);
    p = popen(cmd, "r");
    if (!p)
        return -1;
    if (out) {
        out[0] = '\0';
        if (fgets(out, (int)out_size, p))
            out[strcspn(out, "\n")] = '\0';
    }
    while (fgetc(p) != EOF)
        ;
    rc = pclose(p);
    return rc;
}

/* The private broker's folder; teardown stops whatever it runs and removes it, also after a
 * failed check. */
static int broker_setup(void **state)
{
    char *dir = strdup("/tmp/ar_queue_broker_XXXXXX");
    if (!dir || !mkdtemp(dir)) {
        free(dir);
        return -1;
    }
    *state = dir;
    return 0;
}

static int broker_teardown(void **state)
{
    char *dir = *state, args[256];
    snprintf(args, sizeof(args), "stop-all %s", dir);
    services(args, NULL, 0);
    snprintf(args, sizeof(args), "rm -rf %s", dir);
    if (system(args) != 0)
        return -1;
    free(dir);
    return 0;
}

static void broker_restart_keeps_messages_and_consumption_resumes(void **state)
{
    const char *dir = *state;
    char args[256], url[256], port[16] = "";
    char name[128];
    struct queue *q;
    struct queue_msg m;
    struct ar_err err = {0};
    uint64_t stale_tag = 0;
    double t0;
    FILE *f;
    snprintf(args, sizeof(args), "start rabbitmq %s", dir);
    if (services(args, url, sizeof(url)) != 0 || strncmp(url, "amqp://", 7) != 0)
        fail_msg("cannot start a private RabbitMQ in %s", dir);
    snprintf(args, sizeof(args), "%s/rabbitmq.port", dir);
    f = fopen(args, "r");
    assert_non_null(f);
    assert_non_null(fgets(port, sizeof(port), f));
    fclose(f);
    port[strcspn(port, "\n")] = '\0';

    unique_name(name, sizeof(name), "restart");
    q = open_queue(url, name);
    assert_true(queue_healthy(q));
    publish_str(q, "before-1");
    publish_str(q, "before-2");
    publish_str(q, "before-3");
    get_one(q, 10, &m); /* the consumer is connected */
    assert_string_equal(m.body, "before-1");
    assert_int_equal(queue_ack(q, m.tag, NULL), AR_OK);
    queue_msg_fini(&m);

    snprintf(args, sizeof(args), "stop rabbitmq %s", dir);
    assert_int_equal(services(args, NULL, 0), 0);

    /* down: publish fails fast (after the first notices the lost connection), get waits its
     * timeout, health says no */
    (void)queue_publish(q, "lost?", 5, NULL); /* may find the connection gone */
    for (int i = 0; i < 10; i++) {
        t0 = ar_time_s();
        assert_int_equal(queue_publish(q, "x", 1, &err), AR_EUNAVAIL);
        assert_true(ar_time_s() - t0 < 1.0); /* no connect or confirm wait */
    }
    {
        /* a delivery the broker pushed before it stopped (prefetch 1) may still sit in the
         * client's buffer: it comes out, but cannot be acked for good */
        enum ar_status st;
        int n_buffered = 0;
        for (;;) {
            t0 = ar_time_s();
            st = queue_get(q, 0.5, &m, &err);
            if (st != AR_OK)
                break;
            assert_string_equal(m.body, "before-2");
            stale_tag = m.tag;
            n_buffered++;
            queue_msg_fini(&m);
        }
        assert_true(n_buffered <= 1);
        assert_int_equal(st, AR_EUNAVAIL);
        assert_true(ar_time_s() - t0 >= 0.45);
    }
    assert_false(queue_healthy(q));

    /* up again, same port and data: the durable queue and its persistent messages are back */
    snprintf(args, sizeof(args), "start rabbitmq %s %s", dir, port);
    if (services(args, url, sizeof(url)) != 0)
        fail_msg("cannot restart the private RabbitMQ");
    {
        const char *want[2] = {"before-2", "before-3"};
        int got = 0;
        t0 = ar_time_s();
        while (got < 2 && ar_time_s() - t0 < 60) {
            enum ar_status st = queue_get(q, 1, &m, &err);
            if (st != AR_OK)
                continue;
            assert_string_equal(m.body, want[got]);
            /* the tag from before the restart names a delivery of a lost connection: refused,
             * even though the new connection numbers its deliveries from 1 again */
            if (got == 0 && stale_tag)
                assert_int_equal(queue_ack(q, stale_tag, NULL), AR_EUNAVAIL);
            got++;
            assert_int_equal(queue_ack(q, m.tag, NULL), AR_OK);
            queue_msg_fini(&m);
        }
        assert_int_equal(got, 2);
    }
    /* and publishing works again by itself */
    t0 = ar_time_s();
    while (queue_publish(q, "after", 5, &err) != AR_OK && ar_time_s() - t0 < 30)
        sleep_ms(100);
    assert_true(queue_healthy(q));
    get_one(q, 10, &m);
    assert_string_equal(m.body, "after");
    assert_int_equal(queue_ack(q, m.tag, NULL), AR_OK);
    queue_msg_fini(&m);
    assert_int_equal(queue_get(q, 0.3, &m, NULL), AR_EBUSY);
    assert_int_equal(raw_ready(url, name), 0);
    queue_destroy(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define BOTH(f)                                                                                    \
    cmocka_unit_test_prestate_setup_teardown(f, setup, teardown, (void *)&kind_memory),            \
        cmocka_unit_test_prestate_setup_teardown(f, setup, teardown, (void *)&kind_amqp)
#define AMQP(f) cmocka_unit_test_prestate_setup_teardown(f, setup, teardown, (void *)&kind_amqp)
        BOTH(round_trip_keeps_binary_bodies),
        BOTH(nack_requeue_redelivers_with_the_flag),
        BOTH(prefetch_bounds_what_one_consumer_holds),
        BOTH(closed_consumer_gives_its_messages_back),
        BOTH(get_wakes_when_a_message_is_published),
        cmocka_unit_test(memory_queue_is_bounded),
        cmocka_unit_test(bad_urls_are_refused_with_a_message),
        cmocka_unit_test(unreachable_broker_fails_fast_and_create_still_works),
        AMQP(second_consumer_gets_what_the_first_cannot_hold),
        AMQP(killed_consumer_messages_are_redelivered_none_lost),
        cmocka_unit_test_setup_teardown(broker_restart_keeps_messages_and_consumption_resumes,
                                        broker_setup, broker_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
