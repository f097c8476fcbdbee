/* fleet_test.c - two reply services ("instances"), each on its own store handle to one
 * database, answering the same new review from many threads at once: the model is asked once
 * in all and every caller gets the one stored reply. On PostgreSQL (a fresh database on
 * AR_TEST_PG_URL, required) and on a shared SQLite file. Also: a failed generation hands the
 * review to a waiting request, a waiting request honours its cancellation, and a restarted
 * instance ends the claims its previous run left. */
#include "harness/harness.h"
#include "harness/reply_fakes.h"
#include "harness/pg.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "reply/reply.h"

/* ---- a generator that counts its calls ------------------------------------------------- */

struct counting_gen {
    struct reply_generator base;
    atomic_int calls;
    atomic_int fail_first; /* this many first calls fail with AR_EBUSY */
    int delay_ms;
};

static enum ar_status counting_generate(struct reply_generator *g,
                                        const struct reply_gen_request *r, char **text, size_t *len)
{
    struct counting_gen *c = (struct counting_gen *)g;
    int k = atomic_fetch_add(&c->calls, 1);
    struct timespec ts = {c->delay_ms / 1000, (long)(c->delay_ms % 1000) * 1000000L};
    char buf[96];
    (void)r;
    nanosleep(&ts, NULL);
    if (k < atomic_load(&c->fail_first))
        return AR_EBUSY;
    /* each call's reply differs, so that a second generation would show */
    snprintf(buf, sizeof(buf), "感谢您的评价，第%d次生成，欢迎再来！", k + 1);
    *text = ar_strdup(buf);
    *len = strlen(buf);
    return *text ? AR_OK : AR_ENOMEM;
}

/* ---- fixture: one database, two instances ---------------------------------------------- */

struct fleet {
    bool pg;
    char dir[64];
    char url[512];
    struct th_pg_db db;
    struct reply_profiles *profiles;
    struct counting_gen gen; /* shared: counts the calls of both instances */
    struct store *store[2];
    struct reply_service *svc[2];
};

static const char *const instance_names[2] = {"inst-a", "inst-b"};

static void open_instance(struct fleet *x, int i)
{
    struct reply_service_params p = reply_service_default_params();
    struct ar_err err = {0};
    enum ar_status s = store_open_url(x->url, &x->store[i], &err);
    if (s != AR_OK)
        fail_msg("store_open_url(%s): %s: %s", x->url, ar_status_str(s), err.msg);
    p.profiles = x->profiles;
    p.store = x->store[i];
    p.gen = &x->gen.base;
    p.n_workers = 2;
    p.timeout_s = 10;
    p.instance = instance_names[i];
    assert_int_equal(reply_service_create(&p, &x->svc[i]), AR_OK);
}

static int setup_with(void **state, bool pg)
{
    struct fleet *x = calloc(1, sizeof(*x));
    if (!x)
        return -1;
    x->pg = pg;
    snprintf(x->dir, sizeof(x->dir), "/tmp/ar_fleet_XXXXXX");
    if (!mkdtemp(x->dir)) {
        free(x);
        return -1;
    }
    snprintf(x->url, sizeof(x->url), "%s/replies.db", x->dir);
    if (pg) {
        if (th_pg_create(&x->db) != 0) {
            rmdir(x->dir);
            free(x);
            return -1;
        }
        /* libpq's connect_timeout 15 s instead of the store's 3: under ThreadSanitizer on a
         * loaded 2-core CI machine, one of many connections opened at once once took longer
         * than 3 s (what this test checks is the fleet's one generation, not connect speed) */
        if (th_pg_url_with(x->url, sizeof(x->url), x->db.admin, x->db.name, "connect_timeout=15") !=
            0)
            fail_msg("cannot add connect_timeout to %s", x->db.url);
    }
    assert_int_equal(th_profiles_single(&x->profiles), AR_OK);
    x->gen.base.generate = counting_generate;
    x->gen.base.model_name = "counting";
    x->gen.delay_ms = 50;
    for (int i = 0; i < 2; i++)
        open_instance(x, i);
    *state = x;
    return 0;
}

static int setup_sqlite(void **state)
{
    return setup_with(state, false);
}

static int setup_pg(void **state)
{
    return setup_with(state, true);
}

static void close_instance(struct fleet *x, int i)
{
    reply_service_destroy(x->svc[i]);
    store_close(x->store[i]);
    x->svc[i] = NULL;
    x->store[i] = NULL;
}

static int teardown(void **state)
{
    struct fleet *x = *state;
    char cmd[160];
    for (int i = 0; i < 2; i++)
        close_instance(x, i);
    reply_profiles_destroy(x->profiles);
    if (x->pg && th_pg_drop(&x->db) != 0)
        fprintf(stderr, "could not drop %s\n", x->db.name);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", x->dir);
    assert_int_equal(system(cmd), 0);
    free(x);
    return 0;
}

/* ---- callers ------------------------------------------------------------------------------ */

#define PER_INSTANCE 8
#define CALLERS (2 * PER_INSTANCE)

struct caller {
    struct reply_service *svc;
    pthread_barrier_t *go;
    struct reply_call *call; /* may be NULL */
    const char *review_id;
    struct reply_result res;
    double took_s;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *caller_run(void *arg)
{
    struct caller *c = arg;
    struct reply_review rv;
    double t0;
    memset(&rv, 0, sizeof(rv));
    rv.shop_id = "fleet-shop";
    rv.review_id = c->review_id;
    rv.text = "物流很快，包装完好，宝贝质量不错！";
    rv.text_len = strlen(rv.text);
    rv.rating = 5;
    if (c->go)
        pthread_barrier_wait(c->go);
    t0 = now_s();
    reply_service_answer_call(c->svc, &rv, ENGINE_PRIO_INTERACTIVE, c->call, &c->res);
    c->took_s = now_s() - t0;
    return NULL;
}

/* Sixteen callers, eight per instance, released at once on one new review. */
static void run_callers(struct fleet *x, const char *review_id, struct caller *c)
{
    pthread_t th[CALLERS];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, CALLERS);
    for (int i = 0; i < CALLERS; i++) {
        memset(&c[i], 0, sizeof(c[i]));
        c[i].svc = x->svc[i % 2];
        c[i].go = &go;
        c[i].review_id = review_id;
        assert_int_equal(pthread_create(&th[i], NULL, caller_run, &c[i]), 0);
    }
    for (int i = 0; i < CALLERS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
}

static void one_generation_for_a_review_sent_to_every_instance_at_once(void **state)
{
    struct fleet *x = *state;
    struct caller c[CALLERS];
    struct store_reply row;
    bool found = false;
    int n_model = 0;
    run_callers(x, "r-same", c);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    /* the reply stored is the one generation's, and everybody answers it */
    assert_int_equal(store_reply_get(x->store[1], "fleet-shop", "r-same", &row, &found, NULL),
                     AR_OK);
    assert_true(found);
    assert_non_null(strstr(row.reply, "第1次生成"));
    for (int i = 0; i < CALLERS; i++) {
        if (c[i].res.err != REPLY_OK)
            fail_msg("caller %d: %s %s", i, reply_error_str(c[i].res.err), c[i].res.error);
        assert_string_equal(c[i].res.reply, row.reply);
        if (c[i].res.source == REPLY_SOURCE_MODEL)
            n_model++;
        else
            assert_int_equal(c[i].res.source, REPLY_SOURCE_STORE);
        reply_result_fini(&c[i].res);
    }
    assert_int_equal(n_model, 1);
    store_reply_fini(&row);

    /* asked again later: from the store, still no new generation */
    run_callers(x, "r-same", c);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    for (int i = 0; i < CALLERS; i++) {
        assert_int_equal(c[i].res.err, REPLY_OK);
        assert_int_equal(c[i].res.source, REPLY_SOURCE_STORE);
        reply_result_fini(&c[i].res);
    }
}

/* The owner's generation fails (503): its claim ends at once and one waiting caller takes the
 * review over; the others get that caller's reply. */
static void a_failed_generation_hands_the_review_to_a_waiting_caller(void **state)
{
    struct fleet *x = *state;
    struct caller c[CALLERS];
    int n_ok = 0, n_busy = 0;
    const char *reply = NULL;
    atomic_store(&x->gen.fail_first, 1);
    run_callers(x, "r-fail", c);
    assert_int_equal(atomic_load(&x->gen.calls), 2);
    for (int i = 0; i < CALLERS; i++) {
        if (c[i].res.err == REPLY_OK) {
            n_ok++;
            if (!reply)
                reply = c[i].res.reply;
            assert_string_equal(c[i].res.reply, reply);
            assert_non_null(strstr(c[i].res.reply, "第2次生成"));
        } else {
            assert_int_equal(c[i].res.err, REPLY_EBUSY);
            n_busy++;
        }
    }
    assert_int_equal(n_busy, 1);
    assert_int_equal(n_ok, CALLERS - 1);
    for (int i = 0; i < CALLERS; i++)
        reply_result_fini(&c[i].res);
}

/* A caller waiting for another instance's generation goes when its client goes. */
static void a_waiting_caller_honours_cancellation(void **state)
{
    struct fleet *x = *state;
    struct caller owner, waiter;
    pthread_t t_owner, t_waiter;
    struct timespec ts = {0, 150 * 1000000L};
    x->gen.delay_ms = 1500;
    memset(&owner, 0, sizeof(owner));
    memset(&waiter, 0, sizeof(waiter));
    owner.svc = x->svc[0];
    owner.review_id = "r-slow";
    waiter.svc = x->svc[1];
    waiter.review_id = "r-slow";
    assert_int_equal(reply_call_create(NULL, NULL, &waiter.call), AR_OK);
    assert_int_equal(pthread_create(&t_owner, NULL, caller_run, &owner), 0);
    nanosleep(&ts, NULL); /* the owner is generating now */
    assert_int_equal(pthread_create(&t_waiter, NULL, caller_run, &waiter), 0);
    nanosleep(&ts, NULL);
    reply_call_cancel(waiter.call);
    pthread_join(t_waiter, NULL);
    assert_int_equal(waiter.res.err, REPLY_ECANCELLED);
    assert_true(waiter.took_s < 1.0); /* long before the generation ends */
    pthread_join(t_owner, NULL);
    assert_int_equal(owner.res.err, REPLY_OK);
    assert_int_equal(atomic_load(&x->gen.calls), 1);
    reply_result_fini(&owner.res);
    reply_result_fini(&waiter.res);
    reply_call_destroy(waiter.call);
}

/* inst-b died holding a claim (a long lease); restarted under its name, it ends that claim, so
 * the review is answered at once instead of after the lease. */
static void a_restarted_instance_ends_the_claims_of_its_previous_run(void **state)
{
    struct fleet *x = *state;
    struct store_reply row;
    enum store_claim claim;
    struct caller c;
    assert_int_equal(store_reply_claim(x->store[1], "fleet-shop", "r-orphan",
                                       "inst-b/deadbeefdeadbeef/7", 600, &claim, &row, NULL),
                     AR_OK);
    assert_int_equal(claim, STORE_CLAIM_OWNED);
    /* another instance's claim survives the restart */
    assert_int_equal(store_reply_claim(x->store[0], "fleet-shop", "r-other",
                                       "inst-a/deadbeefdeadbeef/8", 600, &claim, &row, NULL),
                     AR_OK);
    close_instance(x, 1);
    open_instance(x, 1);
    memset(&c, 0, sizeof(c));
    c.svc = x->svc[1];
    c.review_id = "r-orphan";
    caller_run(&c);
    assert_int_equal(c.res.err, REPLY_OK);
    assert_int_equal(c.res.source, REPLY_SOURCE_MODEL);
    assert_true(c.took_s < 2.0);
    reply_result_fini(&c.res);
    assert_int_equal(
        store_reply_claim(x->store[1], "fleet-shop", "r-other", "someone", 600, &claim, &row, NULL),
        AR_OK);
    assert_int_equal(claim, STORE_CLAIM_HELD);
}

#define BOTH(f)                                                                                    \
    {"sqlite/" #f, f, setup_sqlite, teardown, NULL},                                               \
    {                                                                                              \
        "postgres/" #f, f, setup_pg, teardown, NULL                                                \
    }

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(one_generation_for_a_review_sent_to_every_instance_at_once),
        BOTH(a_failed_generation_hands_the_review_to_a_waiting_caller),
        BOTH(a_waiting_caller_honours_cancellation),
        BOTH(a_restarted_instance_ends_the_claims_of_its_previous_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
