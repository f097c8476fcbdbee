/* jobs_test.c - bulk jobs on the job queue. With the in-process queue: a restarted service
 * resumes what the previous one left, and lines the model cannot take yet (503) go back to the
 * queue instead of becoming errors, with the backlog gauge following the store. With RabbitMQ
 * (AR_TEST_AMQP_URL; these tests fail without it): two instances (two services, each with its
 * own store handle on one SQLite file and its own queue connections) share a 200-line job and
 * answer every line exactly once; an instance killed with SIGKILL mid-job leaves its lines to the
 * other, with nothing lost and no review answered twice; and a job stored while the queue cannot
 * take it is answered 202 and queued later by the sweeper.
 * Independent truth: the SQLite file read directly (one stored reply per review, each line's
 * result equal to it), the broker's own message counts, and generator call counts. */
#include "harness/harness.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness/private_services.h"
#include "harness/reply_fakes.h"

#include "base/base.h"
#include "queue/queue.h"
#include "reply/reply.h"

/* ---- a fast fake model that counts its calls --------------------------------------------- */

struct fake {
    struct reply_generator base;
    atomic_int calls;
    int delay_ms;
    const char *mark; /* names the instance in every reply, e.g. "甲" */
};

static enum ar_status fake_generate(struct reply_generator *g, const struct reply_gen_request *r,
                                    char **text, size_t *len)
{
    struct fake *f = (struct fake *)g;
    char buf[256];
    atomic_fetch_add(&f->calls, 1);
    if (f->delay_ms) {
        struct timespec ts = {0, (long)f->delay_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    snprintf(buf, sizeof(buf), "感谢您的评价，%s店编号%u已记录，欢迎再来！", f->mark,
             th_fnv32(r->user));
    *text = ar_strdup(buf);
    *len = strlen(buf);
    return *text ? AR_OK : AR_ENOMEM;
}

static void fake_init(struct fake *f, const char *mark, int delay_ms)
{
    memset(f, 0, sizeof(*f));
    f->base.generate = fake_generate;
    f->base.model_name = "fake";
    f->mark = mark;
    f->delay_ms = delay_ms;
}

/* ---- helpers ----------------------------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Messages ready in a broker queue, counted by the broker (a passive declare on a raw
 * connection of its own); -1 when the queue does not exist. drop: delete the queue after. */
static long broker_ready(const char *url, const char *name, bool drop)
{
    char host[128] = "";
    int port = 0;
    amqp_connection_state_t c;
    amqp_socket_t *s;
    amqp_queue_declare_ok_t *ok;
    long n;
    assert_int_equal(sscanf(url, "amqp://%*[^@]@%127[^:]:%d", host, &port), 2);
    c = amqp_new_connection();
    s = amqp_tcp_socket_new(c);
    assert_non_null(s);
    assert_int_equal(amqp_socket_open(s, host, port), AMQP_STATUS_OK);
    assert_int_equal(
        amqp_login(c, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest").reply_type,
        AMQP_RESPONSE_NORMAL);
    assert_non_null(amqp_channel_open(c, 1));
    ok = amqp_queue_declare(c, 1, amqp_cstring_bytes(name), 1, 0, 0, 0, amqp_empty_table);
    n = ok ? (long)ok->message_count : -1;
    if (ok) {
        if (drop)
            amqp_queue_delete(c, 1, amqp_cstring_bytes(name), 0, 0);
        amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
        amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    }
    amqp_destroy_connection(c);
    return n;
}

static void unique_name(char *buf, size_t size)
{
    static int counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, size, "ar-test-jobs-%d-%ld%09ld-%d", (int)getpid(), (long)ts.tv_sec, ts.tv_nsec,
             ++counter);
}

/* One integer from the SQLite file, read on a connection of its own. */
static long db_long(const char *db, const char *sql)
{
    sqlite3 *h;
    sqlite3_stmt *s;
    long v;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    sqlite3_busy_timeout(h, 5000);
    if (sqlite3_prepare_v2(h, sql, -1, &s, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(h));
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    v = (long)sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(h);
    return v;
}

/* A JSONL body of n distinct reviews of shop "q" (ids r1..rn). */
static char *job_body(int n, size_t *len)
{
    struct ar_buf b = {0};
    char line[256];
    for (int i = 1; i <= n; i++) {
        snprintf(line, sizeof(line),
                 "{\"shop_id\":\"q\",\"review_id\":\"r%d\",\"text\":\"第%d条评价，质量不错，物流"
                 "也快\",\"rating\":%d}\n",
                 i, i, 1 + i % 5);
        ar_buf_puts(&b, line);
    }
    return ar_buf_take(&b, len);
}

static struct store_job_info job_info(struct store *st, const char *id)
{
    struct store_job_info info;
    bool found = false;
    assert_int_equal(store_job_get(st, id, &info, &found, NULL), AR_OK);
    assert_true(found);
    return info;
}

/* Waits until the job has no pending line (up to timeout_s); its final info. */
static struct store_job_info wait_done(struct store *st, const char *id, double timeout_s)
{
    double t0 = ar_time_s();
    struct store_job_info info;
    for (;;) {
        info = job_info(st, id);
        if (info.n_done + info.n_failed == info.n_total)
            return info;
        if (ar_time_s() - t0 > timeout_s)
            fail_msg("job %s: %lld of %lld lines finished after %.0f s", id,
                     (long long)(info.n_done + info.n_failed), (long long)info.n_total, timeout_s);
        sleep_ms(5);
    }
}

/* Every line 1..n has a result whose reply is the one stored for its review, and every review
 * has exactly one stored reply. */
static void check_results(struct store *st, const char *db, const char *id, int n)
{
    struct reply_service *svc;
    struct reply_profiles *ps;
    struct reply_service_params p = reply_service_default_params();
    char *jsonl = NULL, *line, *save = NULL;
    size_t len;
    int k = 0;
    assert_int_equal(db_long(db, "SELECT COUNT(*) FROM replies WHERE shop_id = 'q'"), n);
    assert_int_equal(db_long(db, "SELECT COUNT(DISTINCT review_id) FROM replies"), n);
    assert_int_equal(th_profiles_single(&ps), AR_OK);
    p.profiles = ps;
    p.store = st;
    assert_int_equal(reply_service_create(&p, &svc), AR_OK);
    assert_int_equal(reply_job_results_jsonl(svc, id, &jsonl, &len, NULL), AR_OK);
    for (line = strtok_r(jsonl, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *rid = cJSON_GetObjectItem(j, "review_id");
        struct store_reply row;
        bool found = false;
        char want[32];
        k++;
        assert_int_equal(cJSON_GetObjectItem(j, "line")->valueint, k);
        if (!cJSON_IsString(rid))
            fail_msg("line %d has no reply: %s", k, line);
        snprintf(want, sizeof(want), "r%d", k);
        assert_string_equal(rid->valuestring, want);
        assert_int_equal(store_reply_get(st, "q", want, &row, &found, NULL), AR_OK);
        assert_true(found);
        assert_string_equal(cJSON_GetObjectItem(j, "reply")->valuestring, row.reply);
        store_reply_fini(&row);
        cJSON_Delete(j);
    }
    assert_int_equal(k, n);
    ar_free(jsonl);
    reply_service_destroy(svc);
    reply_profiles_destroy(ps);
}

/* One instance: its own store handle, queue handle and service. */
struct inst {
    struct store *store;
    struct queue *queue; /* NULL: the service's in-process queue */
    struct reply_service *svc;
    struct fake gen;
};

static struct reply_profiles *g_profiles;

static void inst_open(struct inst *in, const char *db, const char *url, const char *qname,
                      const char *mark, int delay_ms, struct metrics_registry *metrics)
{
    struct reply_service_params p = reply_service_default_params();
    struct ar_err err = {0};
    memset(in, 0, sizeof(*in));
    fake_init(&in->gen, mark, delay_ms);
    assert_int_equal(store_open(db, &in->store, NULL), AR_OK);
    if (url) {
        struct queue_params qp = queue_default_params();
        qp.name = qname;
        if (queue_open(url, &qp, &in->queue, &err) != AR_OK)
            fail_msg("queue: %s", err.msg);
    }
    p.profiles = g_profiles;
    p.store = in->store;
    p.queue = in->queue;
    p.gen = &in->gen.base;
    p.metrics = metrics;
    p.n_workers = 4;
    p.job_sweep_s = 0.2;
    assert_int_equal(reply_service_create(&p, &in->svc), AR_OK);
}

/* The service goes first (it borrows the queue and the store). */
static void inst_close(struct inst *in)
{
    reply_service_destroy(in->svc);
    queue_destroy(in->queue);
    store_close(in->store);
    memset(in, 0, sizeof(*in));
}

struct fx {
    char dir[64];
    char db[128];
    char qname[128];
};

static int setup(void **state)
{
    struct fx *x = calloc(1, sizeof(*x));
    snprintf(x->dir, sizeof(x->dir), "/tmp/ar_jobs_XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    snprintf(x->db, sizeof(x->db), "%s/replies.db", x->dir);
    unique_name(x->qname, sizeof(x->qname));
    assert_int_equal(th_profiles_single(&g_profiles), AR_OK);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fx *x = *state;
    char cmd[128];
    reply_profiles_destroy(g_profiles);
    g_profiles = NULL;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", x->dir);
    assert_int_equal(system(cmd), 0);
    free(x);
    return 0;
}

/* ---- in-process queue -------------------------------------------------------------------- */

static void restarted_service_resumes_what_the_in_process_queue_lost(void **state)
{
    struct fx *x = *state;
    struct inst a;
    char id[STORE_JOB_ID_LEN + 1], *body;
    size_t len;
    int64_t n = 0;
    body = job_body(30, &len);
    inst_open(&a, x->db, NULL, NULL, "甲", 0, NULL);
    assert_int_equal(reply_job_create(a.svc, NULL, body, len, id, &n, NULL), AR_OK);
    assert_int_equal(n, 30);
    assert_true(job_info(a.store, id).published);
    /* the process ends before any line ran: its in-process queue, and the messages, are gone */
    inst_close(&a);
    ar_free(body);

    inst_open(&a, x->db, NULL, NULL, "甲", 0, NULL);
    assert_int_equal(reply_jobs_start(a.svc), AR_OK);
    assert_int_equal(wait_done(a.store, id, 30).n_done, 30);
    assert_int_equal(atomic_load(&a.gen.calls), 30);
    check_results(a.store, x->db, id, 30);
    inst_close(&a);
}

/* Lines the model cannot take yet (no generator: 503) go back to the queue, not to errors; the
 * backlog gauge follows the store. */
static void busy_lines_wait_in_the_queue_and_the_gauge_counts_them(void **state)
{
    struct fx *x = *state;
    struct metrics_registry *reg;
    struct metrics_family *f;
    struct metrics_child *gauge;
    struct inst a;
    char id[STORE_JOB_ID_LEN + 1], *body;
    size_t len;
    double t0;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    body = job_body(5, &len);
    inst_open(&a, x->db, NULL, NULL, "甲", 0, reg);
    reply_service_set_generator(a.svc, NULL); /* the model is not loaded yet */
    assert_int_equal(reply_job_create(a.svc, NULL, body, len, id, NULL, NULL), AR_OK);
    assert_int_equal(reply_jobs_start(a.svc), AR_OK);
    /* the family the service registered (the same name and kind give it back) */
    assert_int_equal(metrics_gauge(reg, "autoreply_job_items_pending", "pending job lines", NULL, &f),
                     AR_OK);
    gauge = metrics_child(f, NULL);
    t0 = ar_time_s();
    while (metrics_value(gauge) != 5 && ar_time_s() - t0 < 5)
        sleep_ms(10);
    assert_true(metrics_value(gauge) == 5);
    sleep_ms(700); /* several rounds of 503 */
    {
        struct store_job_info info = job_info(a.store, id);
        assert_int_equal(info.n_done + info.n_failed, 0); /* none turned into an error */
    }
    reply_service_set_generator(a.svc, &a.gen.base);
    assert_int_equal(wait_done(a.store, id, 30).n_done, 5);
    t0 = ar_time_s();
    while (metrics_value(gauge) != 0 && ar_time_s() - t0 < 5)
        sleep_ms(10);
    assert_true(metrics_value(gauge) == 0);
    assert_int_equal(atomic_load(&a.gen.calls), 5);
    check_results(a.store, x->db, id, 5);
    inst_close(&a);
    metrics_registry_destroy(reg);
    ar_free(body);
}

/* While the store cannot take writes (another connection holds SQLite's write lock past the
 * busy timeout), lines are neither finished nor failed: their messages go back to the queue
 * and are answered once the store works again. */
static void lines_wait_while_the_store_cannot_write(void **state)
{
    struct fx *x = *state;
    struct inst a;
    char id[STORE_JOB_ID_LEN + 1], *body;
    size_t len;
    sqlite3 *h;
    body = job_body(2, &len);
    inst_open(&a, x->db, NULL, NULL, "甲", 0, NULL);
    assert_int_equal(reply_job_create(a.svc, NULL, body, len, id, NULL, NULL), AR_OK);
    ar_free(body);
    assert_int_equal(sqlite3_open(x->db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(reply_jobs_start(a.svc), AR_OK);
    sleep_ms(STORE_BUSY_TIMEOUT_MS + 1500); /* every write now waits, then fails as busy */
    {
        struct store_job_info info = job_info(a.store, id);
        assert_int_equal(info.n_done, 0);
        assert_int_equal(info.n_failed, 0);
    }
    assert_int_equal(sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    {
        struct store_job_info info = wait_done(a.store, id, 30);
        assert_int_equal(info.n_done, 2);
        assert_int_equal(info.n_failed, 0);
    }
    /* a reply that could not be stored is generated again: at least once per review */
    assert_true(atomic_load(&a.gen.calls) >= 2);
    check_results(a.store, x->db, id, 2);
    inst_close(&a);
}

/* ---- RabbitMQ ------------------------------------------------------------------------------ */

#define N_LINES 200

static void two_instances_answer_each_line_exactly_once(void **state)
{
    struct fx *x = *state;
    const char *url = th_env_url("AR_TEST_AMQP_URL");
    struct inst a, b;
    char id[STORE_JOB_ID_LEN + 1], *body;
    size_t len;
    int64_t n = 0;
    int ca, cb;
    body = job_body(N_LINES, &len);
    inst_open(&a, x->db, url, x->qname, "甲", 2, NULL);
    inst_open(&b, x->db, url, x->qname, "乙", 2, NULL);
    assert_int_equal(reply_job_create(a.svc, NULL, body, len, id, &n, NULL), AR_OK);
    assert_int_equal(n, N_LINES);
    ar_free(body);
    /* one message per line, held by the broker; the job is marked published */
    assert_int_equal(broker_ready(url, x->qname, false), N_LINES);
    assert_true(job_info(b.store, id).published); /* seen through the other instance */
    assert_int_equal(reply_jobs_start(a.svc), AR_OK);
    assert_int_equal(reply_jobs_start(b.svc), AR_OK);
    {
        struct store_job_info info = wait_done(b.store, id, 60);
        assert_int_equal(info.n_done, N_LINES);
        assert_int_equal(info.n_failed, 0);
        assert_string_equal(store_job_status_str(info.status), "done");
    }
    ca = atomic_load(&a.gen.calls);
    cb = atomic_load(&b.gen.calls);
    /* the model ran once per distinct review, and both instances took a share */
    assert_int_equal(ca + cb, N_LINES);
    assert_true(ca > 0 && cb > 0);
    assert_int_equal(db_long(x->db, "SELECT COUNT(*) FROM replies WHERE reply LIKE '%甲%'"), ca);
    assert_int_equal(db_long(x->db, "SELECT COUNT(*) FROM replies WHERE reply LIKE '%乙%'"), cb);
    check_results(a.store, x->db, id, N_LINES);
    inst_close(&a);
    inst_close(&b);
    /* every message was acked: none ready once both consumers are gone */
    assert_int_equal(broker_ready(url, x->qname, true), 0);
}

static void killed_instance_leaves_its_lines_to_the_other(void **state)
{
    struct fx *x = *state;
    const char *url = th_env_url("AR_TEST_AMQP_URL");
    struct inst a;
    char id[STORE_JOB_ID_LEN + 1], *body;
    size_t len;
    pid_t pid;
    int status;
    long by_child, at_kill;
    body = job_body(N_LINES, &len);
    /* the job is stored and queued, then this process keeps no handle (and no thread) across
     * the fork */
    inst_open(&a, x->db, url, x->qname, "甲", 0, NULL);
    assert_int_equal(reply_job_create(a.svc, NULL, body, len, id, NULL, NULL), AR_OK);
    inst_close(&a);
    ar_free(body);

    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* instance 乙: consumes until it is killed */
        struct store *st;
        struct reply_service *svc;
        struct queue *q = NULL;
        struct reply_service_params p = reply_service_default_params();
        struct queue_params qp = queue_default_params();
        static struct fake g;
        fake_init(&g, "乙", 30);
        qp.name = x->qname;
        if (store_open(x->db, &st, NULL) != AR_OK || queue_open(url, &qp, &q, NULL) != AR_OK)
            _exit(3);
        p.profiles = g_profiles;
        p.store = st;
        p.queue = q;
        p.gen = &g.base;
        p.n_workers = 4;
        if (reply_service_create(&p, &svc) != AR_OK || reply_jobs_start(svc) != AR_OK)
            _exit(4);
        for (;;)
            pause();
    }
    /* instance 甲, in this process, consumes at the same time */
    inst_open(&a, x->db, url, x->qname, "甲", 30, NULL);
    assert_int_equal(reply_jobs_start(a.svc), AR_OK);
    {
        double t0 = ar_time_s();
        while (ar_time_s() - t0 < 30 &&
               (job_info(a.store, id).n_done < 40 ||
                db_long(x->db, "SELECT COUNT(*) FROM replies WHERE reply LIKE '%乙%'") < 10))
            sleep_ms(2);
    }
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    at_kill = (long)job_info(a.store, id).n_done;
    by_child = db_long(x->db, "SELECT COUNT(*) FROM replies WHERE reply LIKE '%乙%'");
    assert_true(by_child >= 10);
    assert_true(at_kill >= 40 && at_kill < N_LINES); /* killed mid-job, holding lines */

    /* 甲 finishes everything, including the lines 乙 held unacked when it died */
    {
        struct store_job_info info = wait_done(a.store, id, 60);
        assert_int_equal(info.n_done, N_LINES);
        assert_int_equal(info.n_failed, 0);
    }
    /* none lost, none twice: one reply per review, each line's result is that reply, and 甲's
     * model ran exactly for the reviews 乙 had not stored (a reply 乙 stored before dying is
     * reused from the store, never generated again) */
    check_results(a.store, x->db, id, N_LINES);
    assert_int_equal(db_long(x->db, "SELECT COUNT(*) FROM replies WHERE reply LIKE '%乙%'"),
                     by_child);
    assert_int_equal(atomic_load(&a.gen.calls), N_LINES - by_child);
    inst_close(&a);
    assert_int_equal(broker_ready(url, x->qname, true), 0);
}

/* A queue that refuses to publish while down, over a real RabbitMQ queue. */
struct gate_queue {
    struct queue base;
    struct queue *inner;
    atomic_bool down;
};
static struct queue_ops gate_ops;

static enum ar_status gate_publish(struct queue *q, const struct queue_body *b, size_t n,
                                   struct ar_err *err)
{
    struct gate_queue *g = (struct gate_queue *)q;
    if (atomic_load(&g->down))
        return ar_err_set(err, AR_EUNAVAIL, 0, "test: the broker is down");
    return queue_publish_many(g->inner, b, n, err);
}
static enum ar_status gate_get(struct queue *q, double t, struct queue_msg *m, struct ar_err *e)
{
    return queue_get(((struct gate_queue *)q)->inner, t, m, e);
}
static enum ar_status gate_ack(struct queue *q, uint64_t tag, struct ar_err *e)
{
    return queue_ack(((struct gate_queue *)q)->inner, tag, e);
}
static enum ar_status gate_nack(struct queue *q, uint64_t tag, bool rq, struct ar_err *e)
{
    return queue_nack(((struct gate_queue *)q)->inner, tag, rq, e);
}
static enum ar_status gate_prefetch(struct queue *q, int n, struct ar_err *e)
{
    return queue_set_prefetch(((struct gate_queue *)q)->inner, n, e);
}
static void gate_close(struct queue *q)
{
    queue_consumer_close(((struct gate_queue *)q)->inner);
}
static bool gate_healthy(struct queue *q)
{
    return !atomic_load(&((struct gate_queue *)q)->down) &&
           queue_healthy(((struct gate_queue *)q)->inner);
}
static void gate_destroy(struct queue *q)
{
    (void)q;
}

static void job_stored_while_the_queue_is_down_is_queued_by_the_sweeper(void **state)
{
    struct fx *x = *state;
    const char *url = th_env_url("AR_TEST_AMQP_URL");
    struct gate_queue gate;
    struct store *st;
    struct reply_service *svc;
    struct reply_service_params p = reply_service_default_params();
    struct queue_params qp = queue_default_params();
    struct fake g;
    char id[STORE_JOB_ID_LEN + 1], *body;
    size_t len;
    int64_t n = 0;
    gate_ops =
        (struct queue_ops){"gate",    true,          gate_publish, gate_get,     gate_ack,
                           gate_nack, gate_prefetch, gate_close,   gate_healthy, gate_destroy};
    gate.base.ops = &gate_ops;
    qp.name = x->qname;
    assert_int_equal(queue_open(url, &qp, &gate.inner, NULL), AR_OK);
    atomic_init(&gate.down, true);
    fake_init(&g, "甲", 0);
    assert_int_equal(store_open(x->db, &st, NULL), AR_OK);
    p.profiles = g_profiles;
    p.store = st;
    p.queue = &gate.base;
    p.gen = &g.base;
    p.n_workers = 4;
    p.job_sweep_s = 0.2; /* grace: 0.6 s */
    assert_int_equal(reply_service_create(&p, &svc), AR_OK);
    body = job_body(20, &len);
    /* accepted (the job is stored), though its lines could not be queued */
    assert_int_equal(reply_job_create(svc, NULL, body, len, id, &n, NULL), AR_OK);
    assert_int_equal(n, 20);
    assert_false(job_info(st, id).published);
    ar_free(body);
    assert_int_equal(reply_jobs_start(svc), AR_OK);
    sleep_ms(1500); /* sweeps fail while the queue is down */
    assert_false(job_info(st, id).published);
    assert_int_equal(job_info(st, id).n_done, 0);
    /* the queue is back: the sweeper queues the job's lines, they are answered */
    atomic_store(&gate.down, false);
    assert_int_equal(wait_done(st, id, 30).n_done, 20);
    assert_true(job_info(st, id).published);
    assert_int_equal(atomic_load(&g.calls), 20);
    check_results(st, x->db, id, 20);
    reply_service_destroy(svc);
    queue_destroy(gate.inner);
    store_close(st);
    assert_int_equal(broker_ready(url, x->qname, true), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(restarted_service_resumes_what_the_in_process_queue_lost),
        T(busy_lines_wait_in_the_queue_and_the_gauge_counts_them),
        T(lines_wait_while_the_store_cannot_write),
        T(two_instances_answer_each_line_exactly_once),
        T(killed_instance_leaves_its_lines_to_the_other),
        T(job_stored_while_the_queue_is_down_is_queued_by_the_sweeper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
