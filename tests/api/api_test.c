/* api_test.c - the public C API (include/autoreply.h) as an embedding program uses it: only
 * the ar_* calls, never the modules behind them. Truth comes from the shared fixtures
 * (tokenizer cases, llama.cpp's greedy continuations) and from invariants (streamed text adds
 * up to the final text, a cancelled request stops early, two threads get what one gets). */
#include "harness/harness.h"

#include <pthread.h>
#include <stdbool.h>

#include "autoreply.h"
#include "base/base.h" /* ar_alloc_fail_after: fault injection, not part of the API */

#define TINY "fixtures/models/tiny-llama-f32.gguf"
#define DEMO "models/autoreply-demo-q8_0.gguf"
#define PATH_LEN 512
#define GEN 32
/* F32 logits tolerance of the fixtures (README section 3): a greedy step whose top-1/top-2
 * margin is below it may differ from llama.cpp's pick */
#define MARGIN_TOL 1e-3

static struct ar_model *tiny;

static int group_setup(void **state)
{
    char path[PATH_LEN];
    struct ar_err err = {0};
    (void)state;
    if (ar_model_load(th_shared_path(path, sizeof(path), TINY), NULL, &tiny, &err) != AR_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    ar_model_free(tiny);
    return 0;
}

static struct ar_engine *tiny_engine(int n_seq_max)
{
    struct ar_engine_params p = ar_engine_params_default();
    struct ar_err err = {0};
    struct ar_engine *e = NULL;
    p.n_threads = 2;
    p.n_seq_max = n_seq_max;
    p.kv_tokens = 2048;
    p.kv_f32 = true; /* the fixtures' KV type */
    if (ar_engine_create(tiny, &p, &e, &err) != AR_OK)
        fail_msg("ar_engine_create: %s", err.msg);
    return e;
}

static int32_t *json_ints(const cJSON *a, int *n)
{
    int len = cJSON_GetArraySize(a);
    int32_t *v = calloc((size_t)(len ? len : 1), sizeof(int32_t));
    assert_non_null(v);
    for (int i = 0; i < len; i++)
        v[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
    *n = len;
    return v;
}

/* ---- errors ------------------------------------------------------------------------------ */

static void bad_model_paths_give_a_status_and_a_message(void **state)
{
    struct ar_model *m = (struct ar_model *)&m; /* not NULL: the call must clear it */
    struct ar_err err = {0};
    struct ar_model_params p = ar_model_params_default();
    (void)state;
    assert_int_equal(ar_model_load("/nonexistent/model.gguf", NULL, &m, &err), AR_EIO);
    assert_null(m);
    assert_int_equal(err.code, AR_EIO);
    assert_true(strlen(err.msg) > 0);
    memset(&err, 0, sizeof(err));
    assert_int_equal(ar_model_load("README.md", NULL, &m, &err), AR_EFORMAT);
    assert_null(m);
    assert_true(strlen(err.msg) > 0);
    memset(&err, 0, sizeof(err));
    assert_int_equal(ar_model_load(NULL, NULL, &m, &err), AR_EINVAL);
    assert_true(strlen(err.msg) > 0);
    assert_int_equal(ar_model_load("x.gguf", NULL, NULL, NULL), AR_EINVAL);
    /* params not from ar_model_params_default */
    p.struct_size = 0;
    memset(&err, 0, sizeof(err));
    assert_int_equal(ar_model_load(DEMO, &p, &m, &err), AR_EINVAL);
    assert_non_null(strstr(err.msg, "ar_model_params_default"));
    p = ar_model_params_default();
    p.n_threads = 0;
    assert_int_equal(ar_model_load(DEMO, &p, &m, &err), AR_EINVAL);
}

static void null_handles_are_safe(void **state)
{
    struct ar_err err = {0};
    struct ar_engine *e = NULL;
    struct ar_reply_service *s = NULL;
    struct ar_detokenizer *d = NULL;
    struct ar_reply r;
    char *text = (char *)"x";
    const char *piece;
    size_t len = 7;
    int64_t n = 0;
    int32_t id = 5, *ids = NULL, n32 = 0;
    (void)state;
    ar_model_free(NULL);
    ar_engine_free(NULL);
    ar_reply_service_free(NULL);
    ar_detokenizer_free(NULL);
    ar_string_free(NULL);
    ar_tokens_free(NULL);
    ar_reply_clear(NULL);
    ar_engine_cancel(NULL, 1);
    assert_string_equal(ar_model_arch(NULL), "");
    assert_string_equal(ar_model_name(NULL), "");
    assert_int_equal(ar_model_n_ctx(NULL), 0);
    assert_int_equal(ar_model_n_vocab(NULL), 0);
    assert_int_equal(ar_model_token_bos(NULL), -1);
    assert_false(ar_model_token_is_eog(NULL, 0));
    assert_int_equal(ar_engine_n_ctx(NULL), 0);
    assert_null(ar_token_piece(NULL, 0, &len));
    assert_int_equal(len, 0);
    assert_int_equal(ar_tokenize(NULL, "a", 1, false, false, &id, 1, &n, &err), AR_EINVAL);
    assert_int_equal(ar_detokenize(NULL, &id, 1, false, NULL, 0, &len, &err), AR_EINVAL);
    assert_int_equal(ar_detokenizer_create(NULL, true, &d, &err), AR_EINVAL);
    assert_int_equal(ar_detokenizer_push(NULL, 1, &piece, &len), AR_EINVAL);
    assert_int_equal(ar_detokenizer_flush(NULL, &piece, &len), AR_EINVAL);
    assert_int_equal(ar_engine_create(NULL, NULL, &e, &err), AR_EINVAL);
    assert_null(e);
    assert_int_equal(ar_engine_submit(NULL, "a", NULL, NULL, &err), AR_EINVAL);
    assert_int_equal(ar_engine_submit_tokens(NULL, &id, 1, NULL, NULL, &err), AR_EINVAL);
    assert_int_equal(ar_engine_generate(NULL, "a", NULL, &text, NULL, &err), AR_EINVAL);
    assert_null(text);
    assert_int_equal(ar_chat_tokens(NULL, NULL, "a", &ids, &n32, &err), AR_EINVAL);
    assert_int_equal(ar_reply_service_create(NULL, NULL, &s, &err), AR_EINVAL);
    assert_null(s);
    assert_int_equal(ar_reply_answer(NULL, NULL, &r, &err), AR_EINVAL);
    assert_true(strlen(err.msg) > 0);
    ar_reply_clear(&r);
    assert_true(strlen(ar_status_str(AR_EUNAVAIL)) > 0);
    assert_string_equal(ar_finish_str(AR_FINISH_CANCELLED), "cancelled");
    assert_string_equal(ar_reply_source_str(AR_REPLY_SOURCE_STORE), "store");
    assert_string_equal(ar_version(), AR_VERSION);
}

/* ---- models and tokens ------------------------------------------------------------------- */

static void model_metadata_matches_the_fixture(void **state)
{
    char path[PATH_LEN];
    cJSON *j = th_read_json(th_shared_path(path, sizeof(path), "fixtures/logits/tiny-llama-f32.json"));
    (void)state;
    assert_non_null(j);
    assert_string_equal(ar_model_arch(tiny), cJSON_GetObjectItem(j, "arch")->valuestring);
    assert_int_equal(ar_model_n_vocab(tiny), cJSON_GetObjectItem(j, "n_vocab")->valueint);
    assert_string_equal(ar_model_name(tiny), "tiny-llama-f32");
    assert_true(ar_model_n_ctx(tiny) > 0);
    assert_true(ar_model_token_eos(tiny) >= 0);
    assert_true(ar_model_token_is_eog(tiny, ar_model_token_eos(tiny)));
    assert_false(ar_model_token_is_eog(tiny, ar_model_n_vocab(tiny)));
    cJSON_Delete(j);
}

static void expect_ids(const char *text, bool add_special, const cJSON *want)
{
    int n_want;
    int32_t *w = json_ints(want, &n_want), *ids;
    int64_t n = -1, need = -1;
    struct ar_err err = {0};
    /* sized by a first call without room: AR_ERANGE (unless empty) and the count needed */
    enum ar_status st = ar_tokenize(tiny, text, strlen(text), add_special, add_special, NULL, 0,
                                    &need, &err);
    assert_int_equal(st, n_want ? AR_ERANGE : AR_OK);
    assert_int_equal(need, n_want);
    ids = calloc((size_t)need + 1, sizeof(int32_t));
    assert_non_null(ids);
    /* with specials as llama.cpp's fixtures make them: BOS added, control text parsed */
    assert_int_equal(ar_tokenize(tiny, text, strlen(text), add_special, add_special, ids, need,
                                 &n, &err),
                     AR_OK);
    assert_int_equal(n, n_want);
    if (n_want)
        assert_memory_equal(ids, w, sizeof(int32_t) * (size_t)n_want);
    free(ids);
    free(w);
}

static void tokenize_and_detokenize_round_trip_on_fixtures(void **state)
{
    char path[PATH_LEN];
    cJSON *cases = th_read_json(th_shared_path(path, sizeof(path), "fixtures/tokenizer/tok-tiny-llama.json"));
    const cJSON *c;
    int n_cases = 0;
    (void)state;
    assert_non_null(cases);
    cJSON_ArrayForEach(c, cases)
    {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const char *want = cJSON_GetObjectItem(c, "detokenized")->valuestring;
        struct ar_detokenizer *d = NULL;
        struct ar_err err = {0};
        char buf[4096], streamed[4096];
        size_t len = 0, sn = 0;
        int n;
        int32_t *ids = json_ints(cJSON_GetObjectItem(c, "ids"), &n);
        expect_ids(text, false, cJSON_GetObjectItem(c, "ids"));
        expect_ids(text, true, cJSON_GetObjectItem(c, "ids_with_special"));
        assert_int_equal(ar_detokenize(tiny, ids, n, true, buf, sizeof(buf), &len, &err), AR_OK);
        assert_int_equal(len, strlen(want));
        assert_string_equal(buf, want);
        if (len > 0) { /* a buffer without room for the NUL: AR_ERANGE, the length needed */
            size_t need = 0;
            assert_int_equal(ar_detokenize(tiny, ids, n, true, buf, len, &need, &err), AR_ERANGE);
            assert_int_equal(need, len);
        }
        /* the streaming detokenizer's chunks add up to the same text, whole characters each */
        assert_int_equal(ar_detokenizer_create(tiny, true, &d, &err), AR_OK);
        for (int i = 0; i <= n; i++) {
            const char *piece;
            size_t pl;
            if (i < n)
                assert_int_equal(ar_detokenizer_push(d, ids[i], &piece, &pl), AR_OK);
            else
                assert_int_equal(ar_detokenizer_flush(d, &piece, &pl), AR_OK);
            assert_true(sn + pl < sizeof(streamed));
            memcpy(streamed + sn, piece, pl);
            sn += pl;
        }
        assert_int_equal(sn, len);
        assert_memory_equal(streamed, want, len);
        ar_detokenizer_free(d);
        free(ids);
        n_cases++;
    }
    assert_true(n_cases >= 10);
    {   /* an id out of range is refused with a message */
        int32_t bad = ar_model_n_vocab(tiny);
        size_t len;
        char buf[16];
        struct ar_err err = {0};
        assert_int_equal(ar_detokenize(tiny, &bad, 1, true, buf, sizeof(buf), &len, &err),
                         AR_EINVAL);
        assert_true(strlen(err.msg) > 0);
        assert_null(ar_token_piece(tiny, bad, &len));
    }
    cJSON_Delete(cases);
}

/* ---- the engine -------------------------------------------------------------------------- */

struct obs {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[1024];
    int n_tokens;
    char text[16384]; /* streamed */
    size_t len;
    bool done;
    struct ar_result res;
    char final[16384]; /* res.text copied */
};

static void obs_init(struct obs *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
}

static void obs_fini(struct obs *o)
{
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
}

static void obs_token(void *user, int32_t token, const char *text, size_t len)
{
    struct obs *o = user;
    pthread_mutex_lock(&o->mu);
    if (token >= 0 && o->n_tokens < 1024)
        o->tokens[o->n_tokens++] = token;
    if (o->len + len < sizeof(o->text)) {
        memcpy(o->text + o->len, text, len);
        o->len += len;
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void obs_done(void *user, const struct ar_result *res)
{
    struct obs *o = user;
    pthread_mutex_lock(&o->mu);
    o->res = *res;
    assert_true(res->text_len < sizeof(o->final));
    memcpy(o->final, res->text, res->text_len);
    o->res.text = o->final;
    o->done = true;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void obs_wait(struct obs *o)
{
    pthread_mutex_lock(&o->mu);
    while (!o->done)
        pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
}

static struct ar_request_params greedy(int max_tokens, struct obs *o)
{
    struct ar_request_params p = ar_request_params_default();
    p.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.on_token = obs_token;
    p.on_done = obs_done;
    p.user_data = o;
    return p;
}

/* Every fixture prompt: the streamed tokens are llama.cpp's greedy continuation (while its
 * margins are clear of the tolerance), and the streamed text adds up to the final text. */
static void streamed_text_adds_up_to_the_final_text_and_tokens_match_the_reference(void **state)
{
    char path[PATH_LEN];
    cJSON *j = th_read_json(th_shared_path(path, sizeof(path), "fixtures/logits/tiny-llama-f32.json"));
    const cJSON *c;
    struct ar_engine *e = tiny_engine(4);
    int n_cases = 0;
    (void)state;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases"))
    {
        int n_prompt, n_ref;
        int32_t *prompt = json_ints(cJSON_GetObjectItem(c, "prompt_tokens"), &n_prompt);
        int32_t *ref = json_ints(cJSON_GetObjectItem(c, "greedy_tokens"), &n_ref);
        const cJSON *margins = cJSON_GetObjectItem(c, "greedy_margins");
        struct obs o;
        struct ar_request_params p;
        struct ar_err err = {0};
        char dec[16384];
        size_t dl = 0;
        uint64_t id = 0;
        struct ar_detokenizer *d = NULL;
        int checked = 0;
        obs_init(&o);
        p = greedy(GEN, &o);
        assert_int_equal(ar_engine_submit_tokens(e, prompt, n_prompt, &p, &id, &err), AR_OK);
        obs_wait(&o);
        assert_int_equal(o.res.status, AR_OK);
        assert_int_equal(o.res.finish, AR_FINISH_LENGTH);
        assert_int_equal(o.res.n_gen, GEN);
        assert_int_equal(o.n_tokens, GEN);
        assert_int_equal(o.len, o.res.text_len);
        assert_memory_equal(o.text, o.final, o.len);
        /* the text is the tokens' text, rendered as a streaming detokenizer renders it (the
         * tiny model's random bytes are not always UTF-8: both replace them alike) */
        assert_int_equal(ar_detokenizer_create(tiny, true, &d, &err), AR_OK);
        for (int i = 0; i <= o.n_tokens; i++) {
            const char *piece;
            size_t pl;
            if (i < o.n_tokens)
                assert_int_equal(ar_detokenizer_push(d, o.tokens[i], &piece, &pl), AR_OK);
            else
                assert_int_equal(ar_detokenizer_flush(d, &piece, &pl), AR_OK);
            assert_true(dl + pl < sizeof(dec));
            memcpy(dec + dl, piece, pl);
            dl += pl;
        }
        ar_detokenizer_free(d);
        assert_int_equal(dl, o.len);
        assert_memory_equal(dec, o.text, dl);
        for (int i = 0; i < n_ref && i < GEN; i++) {
            assert_int_equal(o.tokens[i], ref[i]);
            checked++;
            if (cJSON_GetArrayItem(margins, i)->valuedouble < MARGIN_TOL)
                break; /* a near tie: later tokens may follow the other branch */
        }
        assert_true(checked >= 1);
        obs_fini(&o);
        free(prompt);
        free(ref);
        n_cases++;
    }
    assert_true(n_cases >= 1);
    ar_engine_free(e);
    cJSON_Delete(j);
}

/* ar_engine_generate streams through on_token too, and its text is the streamed text. */
static void generate_returns_the_streamed_text(void **state)
{
    struct ar_engine *e = tiny_engine(2);
    struct obs o;
    struct ar_request_params p;
    struct ar_result res;
    struct ar_err err = {0};
    char *text = NULL;
    (void)state;
    obs_init(&o);
    p = greedy(24, &o);
    p.on_done = NULL; /* generate waits itself */
    assert_int_equal(ar_engine_generate(e, "物流很快，包装完好", &p, &text, &res, &err), AR_OK);
    assert_non_null(text);
    assert_int_equal(res.n_gen, 24);
    assert_int_equal(strlen(text), res.text_len);
    assert_ptr_equal(res.text, text);
    assert_int_equal(o.len, res.text_len);
    assert_memory_equal(o.text, text, o.len);
    assert_int_equal(o.n_tokens, 24);
    ar_string_free(text);
    obs_fini(&o);
    ar_engine_free(e);
}

/* A stop string taken from the middle of a greedy generation ends the same generation there:
 * the text is what came before it, and the finish says stop. */
static void stop_strings_end_generation_before_them(void **state)
{
    struct ar_engine *e = tiny_engine(2);
    struct ar_request_params p = ar_request_params_default();
    struct ar_result res;
    struct ar_err err = {0};
    char *full = NULL, *cut = NULL, stop[8];
    const char *stops[1] = {stop};
    size_t at = 0;
    (void)state;
    p.temperature = 0;
    p.max_tokens = 40;
    p.ignore_eos = true;
    assert_int_equal(ar_engine_generate(e, "The tea", &p, &full, &res, &err), AR_OK);
    assert_int_equal(res.finish, AR_FINISH_LENGTH);
    /* the first printable ASCII pair after the first few bytes: a whole-character stop */
    for (size_t i = 4; i + 1 < strlen(full) && !at; i++)
        if (full[i] > ' ' && full[i] < 127 && full[i + 1] > ' ' && full[i + 1] < 127)
            at = i;
    if (!at)
        fail_msg("no ASCII pair in the tiny model's text: %s", full);
    /* the pair's first occurrence is where generation must stop */
    memcpy(stop, full + at, 2);
    stop[2] = '\0';
    at = (size_t)(strstr(full, stop) - full);
    p.stop = stops;
    p.n_stop = 1;
    assert_int_equal(ar_engine_generate(e, "The tea", &p, &cut, &res, &err), AR_OK);
    assert_int_equal(res.finish, AR_FINISH_STOP);
    assert_int_equal(strlen(cut), at);
    assert_memory_equal(cut, full, at);
    ar_string_free(full);
    ar_string_free(cut);
    ar_engine_free(e);
}

static void bad_requests_are_refused_with_a_message(void **state)
{
    struct ar_engine *e = tiny_engine(2);
    struct ar_request_params p = ar_request_params_default();
    struct ar_err err = {0};
    const char *stops[] = {""};
    int32_t bad = ar_model_n_vocab(tiny), one = 1;
    char *text = NULL;
    (void)state;
    p.max_tokens = 0;
    assert_int_equal(ar_engine_submit(e, "a", &p, NULL, &err), AR_EINVAL);
    assert_non_null(strstr(err.msg, "max_tokens"));
    p = ar_request_params_default();
    p.max_tokens = ar_engine_n_ctx(e);
    assert_int_equal(ar_engine_submit(e, "a b c", &p, NULL, &err), AR_ERANGE);
    assert_true(strlen(err.msg) > 0);
    p = ar_request_params_default();
    p.add_special = false;
    assert_int_equal(ar_engine_submit(e, "", &p, NULL, &err), AR_EINVAL);
    assert_int_equal(ar_engine_submit_tokens(e, &bad, 1, NULL, NULL, &err), AR_EINVAL);
    p = ar_request_params_default();
    p.stop = stops;
    p.n_stop = 1;
    assert_int_equal(ar_engine_submit_tokens(e, &one, 1, &p, NULL, &err), AR_EINVAL);
    p = ar_request_params_default();
    p.struct_size = 0;
    assert_int_equal(ar_engine_generate(e, "a", &p, &text, NULL, &err), AR_EINVAL);
    assert_null(text);
    p = ar_request_params_default();
    p.top_p = 2; /* the sampler refuses it */
    assert_int_equal(ar_engine_submit(e, "a", &p, NULL, &err), AR_EINVAL);
    ar_engine_free(e);
}

/* A caller built against an older header passes a shorter struct: the fields it does not know
 * keep their defaults, whatever lies behind its struct in memory. */
static void shorter_params_structs_keep_defaults_for_later_fields(void **state)
{
    struct ar_engine_params p = ar_engine_params_default();
    struct ar_engine *e = NULL;
    struct ar_err err = {0};
    (void)state;
    p.struct_size = offsetof(struct ar_engine_params, n_seq_max);
    p.n_threads = 1;
    p.n_seq_max = -5; /* beyond the caller's struct: not read */
    p.kv_tokens = -1;
    assert_int_equal(ar_engine_create(tiny, &p, &e, &err), AR_OK);
    assert_true(ar_engine_n_ctx(e) > 0);
    ar_engine_free(e);
    p = ar_engine_params_default();
    p.n_seq_max = -5; /* now it is read */
    assert_int_equal(ar_engine_create(tiny, &p, &e, &err), AR_EINVAL);
    assert_null(e);
    assert_true(strlen(err.msg) > 0);
}

static void cancel_stops_a_running_request(void **state)
{
    struct ar_engine *e = tiny_engine(2);
    struct obs o;
    struct ar_request_params p;
    struct ar_err err = {0};
    uint64_t id = 0;
    int max;
    (void)state;
    obs_init(&o);
    max = ar_engine_n_ctx(e) - 16;
    p = greedy(max, &o);
    assert_int_equal(ar_engine_submit(e, "hello", &p, &id, &err), AR_OK);
    pthread_mutex_lock(&o.mu);
    while (o.n_tokens < 3 && !o.done)
        pthread_cond_wait(&o.cv, &o.mu);
    pthread_mutex_unlock(&o.mu);
    ar_engine_cancel(e, id);
    obs_wait(&o);
    assert_int_equal(o.res.finish, AR_FINISH_CANCELLED);
    assert_true(o.res.n_gen >= 3);
    assert_true(o.res.n_gen < max);
    assert_int_equal(o.len, o.res.text_len); /* what streamed is still the whole text */
    ar_engine_cancel(e, id);                 /* a finished id: ignored */
    ar_engine_cancel(e, 987654321);          /* an unknown one too */
    obs_fini(&o);
    /* freeing the engine cancels what still runs: on_done comes, cancelled */
    obs_init(&o);
    p = greedy(max, &o);
    assert_int_equal(ar_engine_submit(e, "again", &p, &id, &err), AR_OK);
    ar_engine_free(e);
    assert_true(o.done);
    assert_true(o.res.finish == AR_FINISH_CANCELLED || o.res.finish == AR_FINISH_LENGTH);
    obs_fini(&o);
}

struct thread_arg {
    struct ar_engine *e;
    const char *prompt;
    char *text;
    enum ar_status st;
};

static void *generate_thread(void *arg)
{
    struct thread_arg *a = arg;
    struct ar_request_params p = ar_request_params_default();
    struct ar_err err = {0};
    p.temperature = 0;
    p.max_tokens = 20;
    p.ignore_eos = true;
    for (int i = 0; i < 3 && a->st == AR_OK; i++) {
        char *t = NULL;
        a->st = ar_engine_generate(a->e, a->prompt, &p, &t, NULL, &err);
        if (a->st == AR_OK && a->text && strcmp(a->text, t) != 0)
            a->st = AR_EFORMAT; /* a later round differs from the first */
        if (!a->text)
            a->text = t;
        else
            ar_string_free(t);
    }
    return NULL;
}

/* Two threads generate at once (batched together by the engine) and get what each prompt
 * gets alone. */
static void concurrent_requests_from_two_threads_match_requests_alone(void **state)
{
    const char *prompts[2] = {"物流很快，包装完好", "The tea arrived late but"};
    struct ar_engine *e = tiny_engine(4);
    char *alone[2];
    struct thread_arg args[2];
    pthread_t th[2];
    (void)state;
    for (int i = 0; i < 2; i++) {
        struct thread_arg a = {e, prompts[i], NULL, AR_OK};
        generate_thread(&a);
        assert_int_equal(a.st, AR_OK);
        alone[i] = a.text;
    }
    for (int i = 0; i < 2; i++) {
        args[i] = (struct thread_arg){e, prompts[i], NULL, AR_OK};
        assert_int_equal(pthread_create(&th[i], NULL, generate_thread, &args[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].st, AR_OK);
        assert_string_equal(args[i].text, alone[i]);
        ar_string_free(args[i].text);
        ar_string_free(alone[i]);
    }
    ar_engine_free(e);
}

/* ---- the reply service (the demo model: its chat template and trained reply format) ------- */

static void reply_service_answers_reviews_once_per_id(void **state)
{
    char path[PATH_LEN];
    struct ar_model *demo = NULL;
    struct ar_engine *e = NULL;
    struct ar_reply_service *s = NULL;
    struct ar_reply r = {0}, again = {0}, neg = {0}, bad = {0};
    struct ar_err err = {0};
    struct ar_review rv = {.review_id = "r1", .text = "物流很快，包装完好，茶叶很香。", .rating = 5};
    struct ar_review nv = {.review_id = "r2", .text = "收到的是假货，我要投诉！", .rating = 1};
    struct ar_review bv = {.review_id = "r3", .text = "ok", .rating = 9};
    int32_t *ids = NULL, n = 0;
    (void)state;
    assert_int_equal(ar_model_load(th_shared_path(path, sizeof(path), DEMO), NULL, &demo, &err),
                     AR_OK);
    assert_int_equal(ar_engine_create(demo, NULL, &e, &err), AR_OK);
    assert_int_equal(ar_reply_service_create(e, NULL, &s, &err), AR_OK);
    assert_int_equal(ar_reply_answer(s, &rv, &r, &err), AR_OK);
    assert_non_null(r.text);
    assert_true(strlen(r.text) > 0);
    assert_string_equal(r.code, "ok");
    assert_true(r.source == AR_REPLY_SOURCE_MODEL || r.source == AR_REPLY_SOURCE_TEMPLATE);
    assert_false(r.negative);
    assert_string_equal(r.model, "autoreply-demo-q8_0");
    /* the same review again: the stored reply, no model call */
    assert_int_equal(ar_reply_answer(s, &rv, &again, &err), AR_OK);
    assert_int_equal(again.source, AR_REPLY_SOURCE_STORE);
    assert_string_equal(again.text, r.text);
    assert_int_equal(again.attempts, 0);
    /* a sensitive word and a low rating: negative, for a person */
    assert_int_equal(ar_reply_answer(s, &nv, &neg, &err), AR_OK);
    assert_true(neg.negative);
    assert_true(neg.needs_human);
    assert_int_equal(neg.action, AR_REPLY_ACTION_SUGGEST);
    /* a bad review: AR_EINVAL, its code and a message */
    memset(&err, 0, sizeof(err));
    assert_int_equal(ar_reply_answer(s, &bv, &bad, &err), AR_EINVAL);
    assert_string_equal(bad.code, "invalid_review");
    assert_true(strlen(err.msg) > 0);
    assert_null(bad.text);
    bv.review_id = NULL;
    assert_int_equal(ar_reply_answer(s, &bv, &bad, &err), AR_EINVAL);
    /* the chat prompt the service uses starts as the vocabulary asks */
    assert_int_equal(ar_chat_tokens(demo, NULL, "你好", &ids, &n, &err), AR_OK);
    assert_true(n > 2);
    ar_tokens_free(ids);
    ar_reply_clear(&r);
    ar_reply_clear(&again);
    ar_reply_clear(&neg);
    ar_reply_clear(&bad);
    ar_reply_service_free(s);
    ar_engine_free(e);
    ar_model_free(demo);
}

static void reply_service_refuses_a_bad_shops_file(void **state)
{
    struct ar_engine *e = tiny_engine(1);
    struct ar_reply_params p = ar_reply_params_default();
    struct ar_reply_service *s = NULL;
    struct ar_err err = {0};
    (void)state;
    p.shops = "/nonexistent/shops.json";
    assert_int_equal(ar_reply_service_create(e, &p, &s, &err), AR_EIO);
    assert_null(s);
    assert_true(strlen(err.msg) > 0);
    p = ar_reply_params_default();
    p.store = "/nonexistent/dir/replies.db";
    memset(&err, 0, sizeof(err));
    assert_int_not_equal(ar_reply_service_create(e, &p, &s, &err), AR_OK);
    assert_null(s);
    assert_true(strlen(err.msg) > 0);
    ar_engine_free(e);
}

/* Each constructor with its Nth allocation failing, for every N until it succeeds: an error
 * (out of memory, with a message), the handle left NULL, nothing leaked (ASan's leak check). */
static void constructors_fail_cleanly_on_every_allocation(void **state)
{
    char path[PATH_LEN];
    struct ar_engine *e = tiny_engine(1);
    th_shared_path(path, sizeof(path), TINY);
    (void)state;
    for (uint64_t n = 1;; n++) {
        struct ar_model *m = (struct ar_model *)&n;
        struct ar_err err = {0};
        enum ar_status st;
        ar_alloc_fail_after(n);
        st = ar_model_load(path, NULL, &m, &err);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            ar_model_free(m);
            assert_true(n > 1);
            break;
        }
        assert_int_equal(st, AR_ENOMEM);
        assert_null(m);
        assert_true(strlen(err.msg) > 0);
    }
    for (uint64_t n = 1;; n++) {
        struct ar_engine *x = (struct ar_engine *)&n;
        struct ar_err err = {0};
        enum ar_status st;
        ar_alloc_fail_after(n);
        st = ar_engine_create(tiny, NULL, &x, &err);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            ar_engine_free(x);
            break;
        }
        assert_int_equal(st, AR_ENOMEM);
        assert_null(x);
        assert_true(strlen(err.msg) > 0);
    }
    for (uint64_t n = 1;; n++) {
        struct ar_reply_service *s = (struct ar_reply_service *)&n;
        struct ar_err err = {0};
        enum ar_status st;
        ar_alloc_fail_after(n);
        st = ar_reply_service_create(e, NULL, &s, &err);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            ar_reply_service_free(s);
            break;
        }
        assert_int_not_equal(st, AR_OK);
        assert_null(s);
        assert_true(strlen(err.msg) > 0);
    }
    for (uint64_t n = 1;; n++) {
        struct ar_detokenizer *d = NULL;
        int32_t ids[64];
        int64_t k = 0;
        enum ar_status st, st2;
        ar_alloc_fail_after(n);
        st = ar_detokenizer_create(tiny, true, &d, NULL);
        st2 = ar_tokenize(tiny, "物流很快，包装完好", strlen("物流很快，包装完好"), true, false, ids,
                          64, &k, NULL);
        ar_alloc_fail_after(0);
        ar_detokenizer_free(d);
        if (st == AR_OK && st2 == AR_OK)
            break;
        assert_true(st == AR_ENOMEM || st2 == AR_ENOMEM);
    }
    ar_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_model_paths_give_a_status_and_a_message),
        cmocka_unit_test(null_handles_are_safe),
        cmocka_unit_test(model_metadata_matches_the_fixture),
        cmocka_unit_test(tokenize_and_detokenize_round_trip_on_fixtures),
        cmocka_unit_test(streamed_text_adds_up_to_the_final_text_and_tokens_match_the_reference),
        cmocka_unit_test(generate_returns_the_streamed_text),
        cmocka_unit_test(stop_strings_end_generation_before_them),
        cmocka_unit_test(bad_requests_are_refused_with_a_message),
        cmocka_unit_test(shorter_params_structs_keep_defaults_for_later_fields),
        cmocka_unit_test(cancel_stops_a_running_request),
        cmocka_unit_test(concurrent_requests_from_two_threads_match_requests_alone),
        cmocka_unit_test(reply_service_answers_reviews_once_per_id),
        cmocka_unit_test(reply_service_refuses_a_bad_shops_file),
        cmocka_unit_test(constructors_fail_cleanly_on_every_allocation),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
