/* workflow_test.c - the merchant's review workflow and shop profiles over HTTP, on SQLite and
 * on PostgreSQL (AR_TEST_PG_URL, required like store_test): a review answered with action send
 * is stored sent, with suggest pending; approve (with an edit held to the shop's banned words),
 * reject and regenerate move it only where allowed (404 unknown, 409 wrong state, 400 bad
 * input), each change in the audit log with the key that made it and the reply before and
 * after; regenerate calls the model again although the reply cache holds the review; an approve
 * and a reject of one draft at once: exactly one wins; the list filters by status, shop,
 * rating and sentiment and pages newest first with no duplicate and no gap; a shop profile
 * saved with PUT changes the next reply (suggest -> auto: stored sent) here at once and on
 * another service over the same store.
 * Independent truth: the reviews the test answered itself (their results, ratings and sentiment
 * scores labelled with reply_sentiment_label), the fake model's call count, the store read
 * directly, and the profile read back by a second service. */
#include "harness/harness.h"
#include "harness/pg.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "harness/http_client.h"
#include "harness/reply_fakes.h"

#include "base/base.h"
#include "reply/reply.h"
#include "server/server.h"
#include "store/store.h"

#define KEY_A "wf-key-a-0123456789"
#define KEY_B "wf-key-b-9876543210"

/* ---- a fake model: a new text on every call ------------------------------------------------ */

struct fake {
    struct reply_generator base;
    atomic_int calls;
};

static enum ar_status fake_generate(struct reply_generator *g, const struct reply_gen_request *r,
                                    char **text, size_t *len)
{
    struct fake *f = (struct fake *)g;
    char buf[128];
    int n = atomic_fetch_add(&f->calls, 1);
    snprintf(buf, sizeof(buf), "Thank you for your review, note %u-%d.", th_fnv32(r->user), n);
    *text = ar_strdup(buf);
    *len = strlen(buf);
    return *text ? AR_OK : AR_ENOMEM;
}

/* ---- fixture ------------------------------------------------------------------------------- */

/* "cfg" is named by the config file: auto mode, one banned word */
static const char shops_config[] =
    "{\"shops\": {\"cfg\": {\"mode\": \"auto\", \"banned_words\": [\"cheap\"]}}}";

struct fx {
    bool pg;
    char dir[64], url[512];
    struct th_pg_db db;
    struct store *store;
    struct reply_profiles *profiles;
    struct cache *cache;
    struct reply_service *svc;
    struct fake gen;
    struct server *srv;
    int port;
};

static int setup_with(void **state, bool pg)
{
    struct fx *x = calloc(1, sizeof(*x));
    struct cache_memory_params cp = cache_memory_default_params();
    struct reply_service_params p = reply_service_default_params();
    struct server_params sp = server_default_params();
    struct ar_err err = {0};
    char keys[128];
    FILE *kf;
    signal(SIGPIPE, SIG_IGN);
    ar_log_set_level(AR_LOG_ERROR);
    x->pg = pg;
    snprintf(x->dir, sizeof(x->dir), "/tmp/ar_workflow_XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    snprintf(x->url, sizeof(x->url), "%s/replies.db", x->dir);
    if (pg) {
        if (th_pg_create(&x->db) != 0)
            return -1;
        snprintf(x->url, sizeof(x->url), "%s", x->db.url);
    }
    if (store_open_url(x->url, &x->store, &err) != AR_OK)
        fail_msg("store_open_url: %s", err.msg);
    assert_int_equal(reply_profiles_parse(shops_config, strlen(shops_config), &x->profiles, &err),
                     AR_OK);
    cp.max_bytes = 1 << 20;
    assert_int_equal(cache_memory_create(&cp, &x->cache), AR_OK);
    x->gen.base.generate = fake_generate;
    x->gen.base.model_name = "fake";
    p.profiles = x->profiles;
    p.store = x->store;
    p.cache = x->cache;
    p.gen = &x->gen.base;
    p.n_workers = 4;
    assert_int_equal(reply_service_create(&p, &x->svc), AR_OK);
    snprintf(keys, sizeof(keys), "%s/keys", x->dir);
    kf = fopen(keys, "w");
    assert_non_null(kf);
    fprintf(kf, "# the console's keys\n%s\n%s\n", KEY_A, KEY_B);
    fclose(kf);
    sp.host = "127.0.0.1";
    sp.port = 0;
    sp.api_key_file = keys;
    if (server_create(&sp, &x->srv, &err) != AR_OK)
        fail_msg("server_create: %s", err.msg);
    assert_int_equal(server_reviews_attach(x->srv, x->svc, NULL), AR_OK);
    if (server_start(x->srv, &err) != AR_OK)
        fail_msg("server_start: %s", err.msg);
    x->port = server_port(x->srv);
    *state = x;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, false);
}

static int setup_pg(void **state)
{
    return setup_with(state, true);
}

static int teardown(void **state)
{
    struct fx *x = *state;
    char cmd[160];
    server_stop(x->srv, 5);
    reply_service_destroy(x->svc);
    server_destroy(x->srv);
    cache_destroy(x->cache);
    reply_profiles_destroy(x->profiles);
    store_close(x->store);
    if (x->pg && th_pg_drop(&x->db) != 0)
        fprintf(stderr, "could not drop %s\n", x->db.name);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", x->dir);
    assert_int_equal(system(cmd), 0);
    free(x);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* A request as key (NULL: none) with a JSON body (NULL: none); the answer parsed. */
static cJSON *req(struct fx *x, const char *key, const char *method, const char *path,
                  const char *body, int *status)
{
    char head[256];
    struct resp r;
    cJSON *j;
    int n = 0;
    head[0] = '\0';
    if (key)
        n += snprintf(head + n, sizeof(head) - (size_t)n, "Authorization: Bearer %s\r\n", key);
    if (body)
        snprintf(head + n, sizeof(head) - (size_t)n, "Content-Type: application/json\r\n");
    http(x->port, method, path, head, body, body ? strlen(body) : 0, &r);
    *status = r.status;
    j = r.body ? cJSON_Parse(r.body) : NULL;
    if (!j)
        fail_msg("%s %s: not JSON (status %d): %.300s", method, path, r.status,
                 r.body ? r.body : "");
    resp_free(&r);
    return j;
}

static const char *str_of(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItem(j, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static const char *err_code(const cJSON *j)
{
    return str_of(cJSON_GetObjectItem(j, "error"), "code");
}

static const char *err_msg(const cJSON *j)
{
    return str_of(cJSON_GetObjectItem(j, "error"), "message");
}

/* Answers one review through the pipeline (no engine needed); the result's action. */
static enum reply_action answer(struct fx *x, const char *shop, const char *id, const char *text,
                                int rating, struct reply_result *keep)
{
    struct reply_review rv = {shop, id, text, strlen(text), rating, NULL, NULL};
    struct reply_result r;
    enum reply_action a;
    reply_service_answer(x->svc, &rv, ENGINE_PRIO_INTERACTIVE, &r);
    if (r.err != REPLY_OK)
        fail_msg("answer %s/%s: %s", shop, id, r.error);
    a = r.action;
    if (keep)
        *keep = r;
    else
        reply_result_fini(&r);
    return a;
}

/* The stored status of a review, read from the store directly. */
static enum store_review_status stored_status(struct fx *x, const char *shop, const char *id)
{
    struct store_reply row;
    bool found = false;
    enum store_review_status s;
    assert_int_equal(store_reply_get(x->store, shop, id, &row, &found, NULL), AR_OK);
    assert_true(found);
    s = row.status;
    store_reply_fini(&row);
    return s;
}

/* ---- transitions --------------------------------------------------------------------------- */

static void statuses_follow_the_action_and_changes_are_checked(void **state)
{
    struct fx *x = *state;
    int st;
    cJSON *j, *audit, *e;
    char draft[256];
    int calls;
    /* the default profile suggests; cfg sends 4 and 5 stars */
    assert_int_equal(answer(x, "s1", "r1", "Fast delivery, nice box.", 4, NULL),
                     REPLY_ACTION_SUGGEST);
    assert_int_equal(answer(x, "cfg", "r2", "Great quality, will buy again.", 5, NULL),
                     REPLY_ACTION_SEND);
    assert_int_equal(stored_status(x, "s1", "r1"), STORE_REVIEW_PENDING);
    assert_int_equal(stored_status(x, "cfg", "r2"), STORE_REVIEW_SENT);

    j = req(x, KEY_A, "GET", "/v1/reviews/s1/r1", NULL, &st);
    assert_int_equal(st, 200);
    assert_string_equal(str_of(j, "status"), "pending");
    assert_string_equal(str_of(j, "text"), "Fast delivery, nice box.");
    snprintf(draft, sizeof(draft), "%s", str_of(j, "reply"));
    assert_true(strlen(draft) > 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "audit")), 0);
    cJSON_Delete(j);

    /* regenerate: the model again (one call per candidate of the shop's profile), although the
     * cache holds this review's reply */
    calls = atomic_load(&x->gen.calls);
    j = req(x, KEY_B, "POST", "/v1/reviews/s1/r1/regenerate", NULL, &st);
    if (st != 200)
        fail_msg("regenerate: %d %s", st, err_msg(j));
    assert_int_equal(atomic_load(&x->gen.calls),
                     calls + reply_profiles_get(x->profiles, "s1")->candidates);
    assert_string_equal(str_of(j, "status"), "pending");
    assert_string_not_equal(str_of(j, "reply"), draft);
    cJSON_Delete(j);

    /* approve with an edit, then the wrong moves */
    j = req(x, KEY_A, "POST", "/v1/reviews/s1/r1/approve", "{\"reply\": \"Thanks, see you!\"}",
            &st);
    assert_int_equal(st, 200);
    assert_string_equal(str_of(j, "status"), "approved");
    assert_string_equal(str_of(j, "reply"), "Thanks, see you!");
    cJSON_Delete(j);
    assert_int_equal(stored_status(x, "s1", "r1"), STORE_REVIEW_APPROVED);
    j = req(x, KEY_A, "POST", "/v1/reviews/s1/r1/reject", NULL, &st);
    assert_int_equal(st, 409);
    assert_string_equal(err_code(j), "invalid_state");
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/cfg/r2/approve", NULL, &st);
    assert_int_equal(st, 409);
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/cfg/r2/regenerate", NULL, &st);
    assert_int_equal(st, 409);
    cJSON_Delete(j);
    assert_int_equal(stored_status(x, "cfg", "r2"), STORE_REVIEW_SENT);

    /* unknown reviews and routes */
    j = req(x, KEY_A, "POST", "/v1/reviews/s1/nope/reject", NULL, &st);
    assert_int_equal(st, 404);
    assert_string_equal(err_code(j), "not_found");
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/s1/nope/regenerate", NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    j = req(x, KEY_A, "GET", "/v1/reviews/s1/nope", NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/s1/r1/publish", NULL, &st);
    assert_int_equal(st, 404);
    cJSON_Delete(j);

    /* bad edits: not a string, empty, a banned word of the shop (cfg: "cheap") */
    assert_int_equal(answer(x, "cfg", "r3", "It broke after a day.", 2, NULL),
                     REPLY_ACTION_SUGGEST);
    j = req(x, KEY_A, "POST", "/v1/reviews/cfg/r3/approve", "{\"reply\": 5}", &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/cfg/r3/approve", "[\"ok\"]", &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/cfg/r3/approve", "{\"reply\": ", &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/cfg/r3/approve", "{\"reply\": \"  \"}", &st);
    assert_int_equal(st, 400);
    cJSON_Delete(j);
    j = req(x, KEY_A, "POST", "/v1/reviews/cfg/r3/approve",
            "{\"reply\": \"Sorry! A CHEAP fix is on its way.\"}", &st);
    assert_int_equal(st, 400);
    assert_non_null(strstr(err_msg(j), "cheap"));
    cJSON_Delete(j);
    assert_int_equal(stored_status(x, "cfg", "r3"), STORE_REVIEW_PENDING);
    j = req(x, KEY_B, "POST", "/v1/reviews/cfg/r3/reject", "{}", &st);
    assert_int_equal(st, 200);
    assert_string_equal(str_of(j, "status"), "rejected");
    cJSON_Delete(j);

    /* the audit log of s1/r1: regenerate by key B, approve by key A, oldest first */
    j = req(x, KEY_A, "GET", "/v1/reviews/s1/r1", NULL, &st);
    assert_int_equal(st, 200);
    audit = cJSON_GetObjectItem(j, "audit");
    assert_int_equal(cJSON_GetArraySize(audit), 2);
    e = cJSON_GetArrayItem(audit, 0);
    assert_string_equal(str_of(e, "action"), "regenerate");
    assert_string_equal(str_of(e, "key"), "key:1");
    assert_string_equal(str_of(e, "before"), draft);
    assert_string_not_equal(str_of(e, "after"), draft);
    e = cJSON_GetArrayItem(audit, 1);
    assert_string_equal(str_of(e, "action"), "approve");
    assert_string_equal(str_of(e, "key"), "key:0");
    assert_string_equal(str_of(e, "after"), "Thanks, see you!");
    assert_string_equal(str_of(e, "from"), "pending");
    assert_string_equal(str_of(e, "to"), "approved");
    assert_true(cJSON_GetObjectItem(e, "at")->valuedouble >=
                cJSON_GetObjectItem(j, "created")->valuedouble);
    cJSON_Delete(j);

    /* no key: refused before anything happens */
    j = req(x, NULL, "POST", "/v1/reviews/s1/r1/approve", NULL, &st);
    assert_int_equal(st, 401);
    cJSON_Delete(j);
    /* a server without keys is open (loopback): its changes name no key */
    {
        struct server_params sp = server_default_params();
        struct server *open_srv = NULL;
        struct ar_err err = {0};
        int port = x->port;
        sp.host = "127.0.0.1";
        sp.port = 0;
        assert_int_equal(server_create(&sp, &open_srv, &err), AR_OK);
        assert_int_equal(server_reviews_attach(open_srv, x->svc, NULL), AR_OK);
        assert_int_equal(server_start(open_srv, &err), AR_OK);
        answer(x, "s1", "open", "Nice colour.", 4, NULL);
        x->port = server_port(open_srv);
        j = req(x, NULL, "POST", "/v1/reviews/s1/open/reject", NULL, &st);
        assert_int_equal(st, 200);
        cJSON_Delete(j);
        j = req(x, NULL, "GET", "/v1/reviews/s1/open", NULL, &st);
        assert_int_equal(st, 200);
        e = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "audit"), 0);
        assert_non_null(e);
        assert_string_equal(str_of(e, "key"), "");
        assert_string_equal(str_of(e, "action"), "reject");
        cJSON_Delete(j);
        x->port = port;
        server_stop(open_srv, 5);
        server_destroy(open_srv);
    }
}

/* ---- concurrent approve and reject --------------------------------------------------------- */

struct racer {
    struct fx *x;
    const char *action;
    pthread_barrier_t *go;
    int ok[10];
};

static void *racer_run(void *arg)
{
    struct racer *r = arg;
    for (int i = 0; i < 10; i++) {
        char path[96];
        int st = 0;
        cJSON *j;
        snprintf(path, sizeof(path), "/v1/reviews/race/r%d/%s", i, r->action);
        pthread_barrier_wait(r->go);
        j = req(r->x, KEY_A, "POST", path, NULL, &st);
        cJSON_Delete(j);
        r->ok[i] = st;
    }
    return NULL;
}

static void approve_and_reject_at_once_one_wins(void **state)
{
    struct fx *x = *state;
    pthread_barrier_t go;
    struct racer a = {x, "approve", &go, {0}}, b = {x, "reject", &go, {0}};
    pthread_t ta, tb;
    for (int i = 0; i < 10; i++) {
        char id[16];
        snprintf(id, sizeof(id), "r%d", i);
        answer(x, "race", id, "The size is a bit off but fine.", 3, NULL);
    }
    pthread_barrier_init(&go, NULL, 2);
    assert_int_equal(pthread_create(&ta, NULL, racer_run, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, racer_run, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 10; i++) {
        char id[16];
        snprintf(id, sizeof(id), "r%d", i);
        /* one 200 and one 409, and the store holds the winner's status */
        assert_true((a.ok[i] == 200 && b.ok[i] == 409) || (a.ok[i] == 409 && b.ok[i] == 200));
        assert_int_equal(stored_status(x, "race", id),
                         a.ok[i] == 200 ? STORE_REVIEW_APPROVED : STORE_REVIEW_REJECTED);
    }
}

/* ---- listing ------------------------------------------------------------------------------- */

#define N_LIST 26

struct listed_review {
    char shop[8], id[16]; /* "L" and any int */
    int rating;
    enum reply_sentiment label;
    bool sent;
};

static const char *const list_texts[] = {"Terrible, it broke and smells bad.",
                                         "Okay I guess.",
                                         "Love it, perfect gift!",
                                         "Delivery was slow but the quality is great.",
                                         "Not what I expected, disappointed.",
                                         "Fine.",
                                         "Excellent service and fast shipping!"};

/* Pages through GET /v1/reviews?<query> with limit per page; checks newest-first order, no
 * duplicate, and returns the ids (shop/id) seen in *out (count returned). */
static int list_all(struct fx *x, const char *query, int limit, char out[][20], int max)
{
    char path[1024], cursor[800] = "";
    int n = 0;
    double last_created = 1e18;
    for (int pages = 0;; pages++) {
        const cJSON *data, *it, *next;
        int st;
        cJSON *j;
        assert_true(pages <= max + 1);
        snprintf(path, sizeof(path), "/v1/reviews?limit=%d%s%s%s%s", limit, query[0] ? "&" : "",
                 query, cursor[0] ? "&cursor=" : "", cursor);
        j = req(x, KEY_A, "GET", path, NULL, &st);
        assert_int_equal(st, 200);
        assert_string_equal(str_of(j, "object"), "list");
        data = cJSON_GetObjectItem(j, "data");
        assert_true(cJSON_GetArraySize(data) <= limit);
        cJSON_ArrayForEach(it, data)
        {
            double created = cJSON_GetObjectItem(it, "created")->valuedouble;
            assert_true(created <= last_created);
            last_created = created;
            assert_true(n < max);
            snprintf(out[n], 20, "%.7s/%.7s", str_of(it, "shop_id"), str_of(it, "review_id"));
            for (int k = 0; k < n; k++)
                assert_string_not_equal(out[k], out[n]);
            n++;
        }
        next = cJSON_GetObjectItem(j, "next_cursor");
        if (cJSON_IsNull(next)) {
            cJSON_Delete(j);
            break;
        }
        assert_true(cJSON_IsString(next));
        assert_int_equal(cJSON_GetArraySize(data), limit);
        snprintf(cursor, sizeof(cursor), "%s", next->valuestring);
        cJSON_Delete(j);
    }
    return n;
}

static bool seen(char got[][20], int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(got[i], key))
            return true;
    return false;
}

static void list_filters_and_pages(void **state)
{
    struct fx *x = *state;
    struct listed_review rv[N_LIST];
    char got[N_LIST + 1][20];
    int n, want;
    int st;
    cJSON *j;
    for (int i = 0; i < N_LIST; i++) {
        struct reply_result r;
        const char *text = list_texts[i % AR_ARRAY_LEN(list_texts)];
        snprintf(rv[i].shop, sizeof(rv[i].shop), "%s", i % 3 == 0 ? "cfg" : i % 3 == 1 ? "a" : "b");
        snprintf(rv[i].id, sizeof(rv[i].id), "L%02d", i);
        rv[i].rating = 1 + (i * 3) % 5;
        rv[i].sent = answer(x, rv[i].shop, rv[i].id, text, rv[i].rating, &r) == REPLY_ACTION_SEND;
        rv[i].label = reply_sentiment_label(r.sentiment_score);
        reply_result_fini(&r);
    }
    /* everything, in pages of 4 and of 1: no duplicate, no gap */
    n = list_all(x, "", 4, got, N_LIST + 1);
    assert_int_equal(n, N_LIST);
    for (int i = 0; i < N_LIST; i++) {
        char key[20];
        snprintf(key, sizeof(key), "%.7s/%.7s", rv[i].shop, rv[i].id);
        assert_true(seen(got, n, key));
    }
    assert_int_equal(list_all(x, "", 1, got, N_LIST + 1), N_LIST);
    assert_int_equal(list_all(x, "", 100, got, N_LIST + 1), N_LIST);
    /* each filter: exactly the reviews it names */
    {
        static const char *const labels[] = {"negative", "neutral", "positive"};
        for (int s = -1; s <= 1; s++) {
            char q[64];
            snprintf(q, sizeof(q), "sentiment=%s", labels[s + 1]);
            n = list_all(x, q, 3, got, N_LIST + 1);
            want = 0;
            for (int i = 0; i < N_LIST; i++) {
                char key[20];
                snprintf(key, sizeof(key), "%.7s/%.7s", rv[i].shop, rv[i].id);
                if ((int)rv[i].label == s) {
                    want++;
                    assert_true(seen(got, n, key));
                }
            }
            assert_int_equal(n, want);
        }
    }
    n = list_all(x, "rating=1", 2, got, N_LIST + 1);
    want = 0;
    for (int i = 0; i < N_LIST; i++)
        want += rv[i].rating == 1;
    assert_int_equal(n, want);
    n = list_all(x, "status=sent", 2, got, N_LIST + 1);
    want = 0;
    for (int i = 0; i < N_LIST; i++)
        want += rv[i].sent;
    assert_true(want > 0);
    assert_int_equal(n, want);
    n = list_all(x, "shop_id=a&status=pending", 2, got, N_LIST + 1);
    want = 0;
    for (int i = 0; i < N_LIST; i++)
        want += !strcmp(rv[i].shop, "a") && !rv[i].sent;
    assert_int_equal(n, want);
    /* bad queries */
    {
        static const char *const bad[] = {"/v1/reviews?status=done", "/v1/reviews?rating=9",
                                          "/v1/reviews?rating=x",    "/v1/reviews?limit=0",
                                          "/v1/reviews?limit=101",   "/v1/reviews?cursor=zz",
                                          "/v1/reviews?cursor=31",   "/v1/reviews?sentiment=meh"};
        for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
            j = req(x, KEY_A, "GET", bad[i], NULL, &st);
            if (st != 400)
                fail_msg("%s: %d", bad[i], st);
            assert_string_equal(err_code(j), "invalid_request");
            cJSON_Delete(j);
        }
    }
}

/* ---- shops --------------------------------------------------------------------------------- */

static const cJSON *shop_in(const cJSON *list, const char *id)
{
    const cJSON *it;
    cJSON_ArrayForEach(
        it, cJSON_GetObjectItem(list, "data")) if (!strcmp(str_of(it, "shop_id"), id)) return it;
    return NULL;
}

static void shop_put_changes_the_next_reply(void **state)
{
    struct fx *x = *state;
    struct reply_service_params p = reply_service_default_params();
    struct reply_service *other = NULL;
    const struct reply_profile *prof;
    double t_put;
    int st;
    cJSON *j;
    /* another instance on the same store, which has read s2's profile already */
    p.profiles = x->profiles;
    p.store = x->store;
    p.gen = &x->gen.base;
    p.n_workers = 1;
    p.instance = "other";
    assert_int_equal(reply_service_create(&p, &other), AR_OK);
    assert_int_equal(reply_service_profile(other, "s2")->mode, REPLY_MODE_SUGGEST);
    /* before: s2 has the default profile (suggest) */
    j = req(x, KEY_A, "GET", "/v1/shops/s2", NULL, &st);
    assert_int_equal(st, 200);
    assert_string_equal(str_of(j, "source"), "default");
    assert_string_equal(str_of(j, "mode"), "suggest");
    cJSON_Delete(j);
    assert_int_equal(answer(x, "s2", "before", "Great product, thank you.", 5, NULL),
                     REPLY_ACTION_SUGGEST);
    assert_int_equal(stored_status(x, "s2", "before"), STORE_REVIEW_PENDING);

    j = req(x, KEY_A, "PUT", "/v1/shops/s2",
            "{\"shop_id\": \"s2\", \"mode\": \"auto\", \"banned_words\": [\"refund\", "
            "\"REVIEW\"], \"persona\": \"小店客服\", \"lang\": \"same\"}",
            &st);
    t_put = ar_time_s();
    assert_int_equal(st, 200);
    assert_string_equal(str_of(j, "source"), "store");
    assert_string_equal(str_of(j, "mode"), "auto");
    assert_string_equal(str_of(j, "persona"), "小店客服");
    cJSON_Delete(j);

    /* this instance at once: 5 stars are sent now, 3 stars still a draft */
    {
        struct reply_result r;
        assert_int_equal(answer(x, "s2", "after", "Great product, thanks again.", 5, &r),
                         REPLY_ACTION_SEND);
        /* the fake model writes "review": a banned word now, stripped from the reply */
        assert_null(strstr(r.reply, "review"));
        assert_non_null(strstr(r.reply, "Thank you for your"));
        reply_result_fini(&r);
    }
    assert_int_equal(stored_status(x, "s2", "after"), STORE_REVIEW_SENT);
    assert_int_equal(answer(x, "s2", "meh", "It is okay, nothing special.", 3, NULL),
                     REPLY_ACTION_SUGGEST);
    j = req(x, KEY_A, "POST", "/v1/reviews/s2/meh/approve",
            "{\"reply\": \"We can offer a Refund.\"}", &st);
    assert_int_equal(st, 400);
    assert_non_null(strstr(err_msg(j), "refund"));
    cJSON_Delete(j);

    /* listed with the config file's shop; read back */
    j = req(x, KEY_A, "GET", "/v1/shops", NULL, &st);
    assert_int_equal(st, 200);
    assert_non_null(shop_in(j, "cfg"));
    assert_string_equal(str_of(shop_in(j, "cfg"), "source"), "config");
    assert_non_null(shop_in(j, "s2"));
    assert_string_equal(str_of(shop_in(j, "s2"), "mode"), "auto");
    cJSON_Delete(j);

    /* the other instance follows within REPLY_SHOP_REFRESH_S (plus a margin for a loaded
     * machine) */
    while ((prof = reply_service_profile(other, "s2"))->mode != REPLY_MODE_AUTO &&
           ar_time_s() - t_put < REPLY_SHOP_REFRESH_S + 5)
        th_sleep_s(0.1);
    assert_int_equal(prof->mode, REPLY_MODE_AUTO);
    assert_int_equal(prof->n_banned, 2);
    assert_string_equal(prof->banned[0], "refund");
    assert_non_null(strstr(prof->system, "小店客服"));
    reply_service_destroy(other);

    /* bad profiles: 400 naming the member, nothing changed */
    {
        static const char *const bad[] = {"{\"mode\": \"sometimes\"}", "{\"auto_min_rating\": 9}",
                                          "{\"colour\": \"red\"}",     "{\"shop_id\": \"other\"}",
                                          "{\"banned_words\": [1]}",   "[1, 2]"};
        static const char *const named[] = {"mode",    "auto_min_rating", "colour",
                                            "shop_id", "banned_words",    "object"};
        for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
            j = req(x, KEY_A, "PUT", "/v1/shops/s2", bad[i], &st);
            if (st != 400 || !strstr(err_msg(j), named[i]))
                fail_msg("%s: %d %s", bad[i], st, err_msg(j));
            cJSON_Delete(j);
        }
    }
    j = req(x, KEY_A, "GET", "/v1/shops/s2", NULL, &st);
    assert_int_equal(st, 200);
    assert_string_equal(str_of(j, "mode"), "auto");
    cJSON_Delete(j);
}

/* ---- profiles saved while reviews are answered ---------------------------------------------- */

struct flipper {
    struct fx *x;
    atomic_bool stop;
    atomic_int puts;
};

static void *flipper_run(void *arg)
{
    struct flipper *f = arg;
    while (!atomic_load(&f->stop) && atomic_load(&f->puts) < 200) {
        int st;
        cJSON *j = req(
            f->x, KEY_A, "PUT", "/v1/shops/flip",
            atomic_load(&f->puts) % 2 ? "{\"mode\": \"auto\"}" : "{\"mode\": \"suggest\"}", &st);
        assert_int_equal(st, 200);
        cJSON_Delete(j);
        atomic_fetch_add(&f->puts, 1);
    }
    return NULL;
}

/* Every review answered while the shop's mode flips is stored with the status of the action it
 * was answered with (sent for send, pending for suggest), whichever profile it met. */
static void profiles_saved_while_reviews_are_answered(void **state)
{
    struct fx *x = *state;
    struct flipper f = {x, false, 0};
    pthread_t th;
    int n = 0;
    assert_int_equal(pthread_create(&th, NULL, flipper_run, &f), 0);
    /* at least 30 reviews, and on until the mode flipped a few times */
    for (; n < 30 || (atomic_load(&f.puts) < 6 && n < 2000); n++) {
        char id[16], text[64];
        enum reply_action a;
        snprintf(id, sizeof(id), "f%d", n);
        snprintf(text, sizeof(text), "Lovely item number %d, thanks!", n);
        a = answer(x, "flip", id, text, 5, NULL);
        assert_int_equal(stored_status(x, "flip", id),
                         a == REPLY_ACTION_SEND ? STORE_REVIEW_SENT : STORE_REVIEW_PENDING);
    }
    atomic_store(&f.stop, true);
    pthread_join(th, NULL);
    assert_true(atomic_load(&f.puts) >= 6);
}

#define BOTH(f)                                                                                    \
    {"sqlite/" #f, f, setup, teardown, NULL},                                                      \
    {                                                                                              \
        "postgres/" #f, f, setup_pg, teardown, NULL                                                \
    }

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(statuses_follow_the_action_and_changes_are_checked),
        BOTH(approve_and_reject_at_once_one_wins),
        BOTH(list_filters_and_pages),
        BOTH(shop_put_changes_the_next_reply),
        BOTH(profiles_saved_while_reviews_are_answered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
