/* jobs.c - bulk jobs: a JSONL or JSON-array body becomes one stored line per review before the
 * job id is returned, then one queue message per line (reply.h, "jobs"). The runner consumes the
 * queue: line workers answer at bulk priority and store each line's result, and only then does
 * the consumer thread ack the message, so a crash at any point leaves the lines in flight to be
 * redelivered, and the store's (shop_id, review_id) idempotency keeps one reply per review. A
 * sweeper queues the lines of jobs that were never queued and keeps the backlog gauge.
 * reply_job_run answers a job's lines directly, without the queue (the CLI's one-shot jobs). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/deadline.h"
#include "reply_internal.h"

#define JOB_CHUNK 16
#define JOB_DEFAULT_SHOP "default"

/* ---- creation ---------------------------------------------------------------------------- */

struct lines {
    struct store_item_in *items; /* owned */
    char **texts;                /* owned copies the items point at (array bodies) */
    size_t n, cap;
};

static void lines_free(struct lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->texts)
            ar_free(l->texts[i]);
    ar_free(l->texts);
    ar_free(l->items);
    memset(l, 0, sizeof(*l));
}

static enum ar_status lines_add(struct lines *l, int64_t line, char *owned_text)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct store_item_in *it = ar_realloc(l->items, cap * sizeof(*it));
        char **tx;
        if (!it)
            return AR_ENOMEM;
        l->items = it;
        tx = ar_realloc(l->texts, cap * sizeof(*tx));
        if (!tx)
            return AR_ENOMEM;
        l->texts = tx;
        l->cap = cap;
    }
    l->items[l->n].line = line;
    l->items[l->n].input = owned_text;
    l->texts[l->n] = owned_text;
    l->n++;
    return AR_OK;
}

static enum ar_status lines_from_array(const cJSON *arr, struct lines *l, struct ar_err *err)
{
    const cJSON *it;
    int64_t line = 0;
    cJSON_ArrayForEach(it, arr)
    {
        char *s = cJSON_PrintUnformatted(it);
        char *copy;
        line++;
        if (line > REPLY_JOB_LINES_MAX) {
            if (s)
                cJSON_free(s);
            return ar_err_set(err, AR_EINVAL, 0, "more than %d reviews in one job",
                              REPLY_JOB_LINES_MAX);
        }
        if (!s)
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        copy = ar_strdup(s);
        cJSON_free(s);
        if (!copy || lines_add(l, line, copy) != AR_OK) {
            ar_free(copy);
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        }
    }
    return AR_OK;
}

/* The next non-blank line of a JSONL body from *pos: [*a, *e) without its leading and trailing
 * spaces, tabs and CRs, its 1-based number in *line (blank lines count). False at the end. */
static bool jsonl_next(const char *body, size_t len, size_t *pos, int64_t *line, size_t *a,
                       size_t *e)
{
    while (*pos < len) {
        const char *nl = memchr(body + *pos, '\n', len - *pos);
        size_t b = *pos, z = nl ? (size_t)(nl - body) : len;
        *pos = nl ? z + 1 : len;
        (*line)++;
        while (b < z && (body[b] == ' ' || body[b] == '\t' || body[b] == '\r'))
            b++;
        while (z > b && (body[z - 1] == ' ' || body[z - 1] == '\t' || body[z - 1] == '\r'))
            z--;
        if (b < z) {
            *a = b;
            *e = z;
            return true;
        }
    }
    return false; /* blank lines are not reviews */
}

static enum ar_status lines_from_jsonl(const char *body, size_t len, struct lines *l,
                                       struct ar_err *err)
{
    size_t i = 0, a, e;
    int64_t line = 0;
    while (jsonl_next(body, len, &i, &line, &a, &e)) {
        /* cJSON would cut a string at its NUL when the line is answered (the server's codec
         * refuses the same in a parsed body; see ar_json_has_nul) */
        char field[96], *copy;
        if (ar_json_has_nul(body + a, e - a, NULL, field, sizeof(field)))
            return ar_err_set(err, AR_EINVAL, (uint64_t)a,
                              "line %lld: \"%s\" contains a NUL character (\\u0000)",
                              (long long)line, field[0] ? field : "(the line)");
        if ((int64_t)l->n >= REPLY_JOB_LINES_MAX)
            return ar_err_set(err, AR_EINVAL, 0, "more than %d reviews in one job",
                              REPLY_JOB_LINES_MAX);
        copy = ar_strndup(body + a, e - a);
        if (!copy || lines_add(l, line, copy) != AR_OK) {
            ar_free(copy);
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        }
    }
    return AR_OK;
}

static enum ar_status publish_lines(struct reply_service *svc, const char *job_id,
                                    const char *shop_id, const int64_t *lines, size_t n,
                                    struct ar_err *err);

/* A bad line of a job created with per-line errors: recorded as its result at creation. */
struct bad_rec {
    int64_t line;
    char why[200];
};

static enum ar_status create_from_lines(struct reply_service *svc,
                                        const struct store_job_spec *spec, struct lines *l,
                                        const struct bad_rec *bad, size_t n_bad,
                                        char job_id[STORE_JOB_ID_LEN + 1], int64_t *n_lines,
                                        struct ar_err *err)
{
    enum ar_status st;
    int64_t *nums;
    if (l->n == 0)
        return ar_err_set(err, AR_EINVAL, 0, "the job has no reviews");
    nums = ar_malloc(l->n * sizeof(*nums));
    if (!nums)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    for (size_t i = 0; i < l->n; i++)
        nums[i] = l->items[i].line;
    st = store_job_create_spec(svc->p.store, spec, l->items, l->n, job_id, err);
    /* bad lines get their errors before any worker sees them (a line already finished is
     * acked without work) */
    for (size_t i = 0; i < n_bad && st == AR_OK; i++) {
        st = store_job_item_error(svc->p.store, job_id, bad[i].line, bad[i].why, err);
        if (st == AR_OK)
            metrics_inc(svc->m.job_items_error, 1);
        if (st != AR_OK) {
            /* stored but not whole: better no job than one whose bad lines would run */
            bool found;
            store_job_delete(svc->p.store, job_id, &found, NULL);
        }
    }
    if (st == AR_OK) {
        /* the job is accepted once stored: a queue that cannot take its lines now only delays
         * it (the sweeper queues unpublished jobs), so creation succeeds either way */
        struct ar_err qerr = {AR_OK, 0, {0}};
        enum ar_status qst = publish_lines(svc, job_id, spec->shop_id, nums, l->n, &qerr);
        if (qst == AR_OK)
            qst = store_job_set_published(svc->p.store, job_id, &qerr);
        if (qst != AR_OK)
            AR_WARN("job %s: stored, but its lines are not queued yet: %s (%s); the sweeper "
                    "queues them",
                    job_id, ar_status_str(qst), qerr.msg);
        if (n_lines)
            *n_lines = (int64_t)l->n;
    }
    ar_free(nums);
    return st;
}

static enum ar_status create_plain(struct reply_service *svc, const char *default_shop,
                                   struct lines *l, char job_id[STORE_JOB_ID_LEN + 1],
                                   int64_t *n_lines, struct ar_err *err)
{
    struct store_job_spec spec = {default_shop ? default_shop : JOB_DEFAULT_SHOP, NULL, NULL};
    return create_from_lines(svc, &spec, l, NULL, 0, job_id, n_lines, err);
}

enum ar_status reply_job_create(struct reply_service *svc, const char *default_shop,
                                const char *body, size_t len, char job_id[STORE_JOB_ID_LEN + 1],
                                int64_t *n_lines, struct ar_err *err)
{
    struct lines l = {0};
    enum ar_status st;
    size_t a = 0;
    if (!body)
        return ar_err_set(err, AR_EINVAL, 0, "no body");
    while (a < len && (body[a] == ' ' || body[a] == '\n' || body[a] == '\r' || body[a] == '\t'))
        a++;
    if (a < len && body[a] == '[') {
        char field[96];
        cJSON *arr;
        if (ar_json_has_nul(body, len, NULL, field, sizeof(field)))
            return ar_err_set(err, AR_EINVAL, 0, "\"%s\" contains a NUL character (\\u0000)",
                              field);
        arr = cJSON_ParseWithLength(body, len);
        if (!cJSON_IsArray(arr)) {
            cJSON_Delete(arr);
            return ar_err_set(err, AR_EINVAL, 0, "the body is not a valid JSON array");
        }
        st = lines_from_array(arr, &l, err);
        cJSON_Delete(arr);
    } else {
        st = lines_from_jsonl(body, len, &l, err);
    }
    if (st == AR_OK)
        st = create_plain(svc, default_shop, &l, job_id, n_lines, err);
    lines_free(&l);
    return st;
}

enum ar_status reply_job_create_json(struct reply_service *svc, const char *default_shop,
                                     const cJSON *array, char job_id[STORE_JOB_ID_LEN + 1],
                                     int64_t *n_lines, struct ar_err *err)
{
    struct lines l = {0};
    enum ar_status st;
    if (!cJSON_IsArray(array))
        return ar_err_set(err, AR_EINVAL, 0, "reviews must be an array");
    st = lines_from_array(array, &l, err);
    if (st == AR_OK)
        st = create_plain(svc, default_shop, &l, job_id, n_lines, err);
    lines_free(&l);
    return st;
}

/* ---- the jobs API: strict creation ------------------------------------------------------- */

/* Every non-blank line of a JSONL body, NULs and all (they are judged with the other lines). */
static enum ar_status lines_all_jsonl(const char *body, size_t len, struct lines *l,
                                      struct ar_err *err)
{
    size_t i = 0, a, e;
    int64_t line = 0;
    while (jsonl_next(body, len, &i, &line, &a, &e)) {
        char *copy;
        if ((int64_t)l->n >= REPLY_JOB_LINES_MAX)
            return ar_err_set(err, AR_EINVAL, 0, "more than %d reviews in one job",
                              REPLY_JOB_LINES_MAX);
        /* a NUL inside a line is kept in the copy's length check below (strlen stops there) */
        copy = ar_malloc(e - a + 1);
        if (!copy || lines_add(l, line, copy) != AR_OK) {
            ar_free(copy);
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        }
        memcpy(copy, body + a, e - a);
        copy[e - a] = '\0';
        if (memchr(copy, '\0', e - a))
            copy[0] = '\0'; /* a raw NUL byte: judged as not JSON */
    }
    return AR_OK;
}

/* Whether one stored line is a review; why (size n) says what is wrong when not. */
static bool line_ok(const char *text, const char *shop, char *why, size_t n)
{
    char field[96];
    struct reply_review rv;
    cJSON *j;
    bool ok;
    if (ar_json_has_nul(text, strlen(text), NULL, field, sizeof(field))) {
        snprintf(why, n, "\"%s\" contains a NUL character (\\u0000)",
                 field[0] ? field : "(the line)");
        return false;
    }
    j = cJSON_Parse(text);
    if (!j) {
        snprintf(why, n, "not valid JSON");
        return false;
    }
    if (!cJSON_IsObject(j)) {
        snprintf(why, n, "not a JSON object");
        cJSON_Delete(j);
        return false;
    }
    ok = reply_review_from_json(j, shop, &rv, why, n) == AR_OK;
    cJSON_Delete(j);
    return ok;
}

enum ar_status reply_job_lines_check(const char *body, size_t len, const char *default_shop,
                                     bool strict, int64_t *n_lines, int64_t *n_bad,
                                     struct ar_err *err)
{
    struct lines l = {0};
    enum ar_status st = strict ? lines_all_jsonl(body, len, &l, err)
                               : lines_from_jsonl(body, len, &l, err);
    *n_lines = (int64_t)l.n;
    *n_bad = 0;
    for (size_t i = 0; st == AR_OK && strict && i < l.n; i++) {
        char why[160];
        if (!line_ok(l.items[i].input, default_shop, why, sizeof(why)))
            (*n_bad)++;
    }
    lines_free(&l);
    return st;
}

enum ar_status reply_job_submit(struct reply_service *svc, const struct reply_job_opts *opts,
                                const char *jsonl, size_t len, const cJSON *array,
                                struct reply_job_outcome *out, struct ar_err *err)
{
    struct reply_job_opts o = opts ? *opts : (struct reply_job_opts){0};
    struct store_job_spec spec;
    struct lines l = {0};
    struct bad_rec *bad = NULL;
    size_t n_rec = 0;
    enum ar_status st;
    memset(out, 0, sizeof(*out));
    spec.shop_id = o.default_shop ? o.default_shop : JOB_DEFAULT_SHOP;
    spec.owner = o.owner ? o.owner : "";
    spec.callback_url = o.callback_url;
    if (o.callback_url && *o.callback_url) {
        char why[160];
        if (!reply_callback_url_ok(o.callback_url, why, sizeof(why))) {
            out->refused = REPLY_JOB_BAD_BODY;
            return ar_err_set(err, AR_EINVAL, 0, "%s", why);
        }
    }
    if (jsonl)
        st = lines_all_jsonl(jsonl, len, &l, err);
    else if (cJSON_IsArray(array))
        st = lines_from_array(array, &l, err);
    else
        st = ar_err_set(err, AR_EINVAL, 0, "the job must be JSONL text or a JSON array");
    if (st == AR_OK && l.n == 0)
        st = ar_err_set(err, AR_EINVAL, 0, "the job has no reviews");
    if (st != AR_OK) {
        if (st == AR_EINVAL)
            out->refused = REPLY_JOB_BAD_BODY;
        lines_free(&l);
        return st;
    }
    /* every line is judged before anything is stored */
    for (size_t i = 0; i < l.n; i++) {
        char why[160];
        out->job_bytes += (int64_t)strlen(l.items[i].input);
        if (line_ok(l.items[i].input, spec.shop_id, why, sizeof(why)))
            continue;
        if (out->n_bad < REPLY_JOB_BAD_MAX) {
            out->bad[out->n_bad].line = l.items[i].line;
            snprintf(out->bad[out->n_bad].why, sizeof(out->bad[0].why), "%s", why);
            out->n_bad++;
        }
        out->n_invalid++;
        if (o.per_line_errors) {
            if (n_rec % 64 == 0) {
                struct bad_rec *nb = ar_realloc(bad, (n_rec + 64) * sizeof(*bad));
                if (!nb) {
                    st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
                    break;
                }
                bad = nb;
            }
            bad[n_rec].line = l.items[i].line;
            snprintf(bad[n_rec].why, sizeof(bad[n_rec].why), "line %lld: %s",
                     (long long)l.items[i].line, why);
            n_rec++;
        }
    }
    if (st == AR_OK && out->n_invalid > 0 && !o.per_line_errors) {
        out->refused = REPLY_JOB_BAD_LINES;
        st = ar_err_set(err, AR_EINVAL, 0, "%lld of %zu lines are not valid reviews; line %lld: %s",
                        (long long)out->n_invalid, l.n, (long long)out->bad[0].line,
                        out->bad[0].why);
    }
    if (st == AR_OK && (o.max_open_jobs > 0 || o.max_bytes > 0)) {
        /* checked, not reserved: instances creating jobs for one owner at once may pass the
         * quota by what they create together */
        st = store_job_usage(svc->p.store, spec.owner, &out->open_jobs, &out->bytes, err);
        if (st == AR_OK && o.max_open_jobs > 0 && out->open_jobs >= o.max_open_jobs) {
            out->refused = REPLY_JOB_TOO_MANY_OPEN;
            st = ar_err_set(err, AR_EINVAL, 0,
                            "%lld jobs are queued or running for this key, the most allowed; "
                            "wait for one to finish or cancel one (DELETE /v1/jobs/ID)",
                            (long long)out->open_jobs);
        } else if (st == AR_OK && o.max_bytes > 0 && out->bytes + out->job_bytes > o.max_bytes) {
            out->refused = REPLY_JOB_TOO_LARGE;
            st = ar_err_set(err, AR_EINVAL, 0,
                            "this job (%lld bytes) and the stored jobs of this key (%lld bytes) "
                            "pass the quota of %lld bytes; delete finished jobs "
                            "(DELETE /v1/jobs/ID) to make room",
                            (long long)out->job_bytes, (long long)out->bytes,
                            (long long)o.max_bytes);
        }
    }
    if (st == AR_OK)
        st = create_from_lines(svc, &spec, &l, bad, n_rec, out->id, &out->n_lines, err);
    ar_free(bad);
    lines_free(&l);
    return st;
}

/* ---- running ----------------------------------------------------------------------------- */

static bool stopping(struct reply_service *svc)
{
    bool s;
    pthread_mutex_lock(&svc->q_mu);
    s = svc->stopping;
    pthread_mutex_unlock(&svc->q_mu);
    return s;
}

/* The stored result of a done line: the reply's JSON with "line" first. */
static char *result_line_json(int64_t line, const struct reply_result *r, const char *review_id)
{
    cJSON *j = reply_result_to_json(r, review_id);
    char *s, *copy;
    if (!j)
        return NULL;
    cJSON_AddNumberToObject(j, "line", (double)line);
    s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s)
        return NULL;
    copy = ar_strdup(s);
    cJSON_free(s);
    return copy;
}

/* An error line of the results: {"line": N, "error": msg}, new (ar_free); NULL when out of
 * memory. */
static char *error_line_json(int64_t line, const char *msg)
{
    cJSON *j = cJSON_CreateObject();
    char *s = NULL, *copy = NULL;
    if (j && cJSON_AddNumberToObject(j, "line", (double)line) &&
        cJSON_AddStringToObject(j, "error", msg ? msg : ""))
        s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s) {
        copy = ar_strdup(s);
        cJSON_free(s);
    }
    return copy;
}

/* Who hears of each line as it is stored (reply_job_run_lines). */
struct line_sink {
    reply_job_line_fn fn; /* NULL: nobody */
    void *user;
};

/* Stores an error line's message and tells the sink. */
static enum ar_status line_error(struct reply_service *svc, const char *job_id, int64_t line,
                                 const char *msg, const struct line_sink *sink, struct ar_err *err)
{
    enum ar_status st = store_job_item_error(svc->p.store, job_id, line, msg, err);
    metrics_inc(svc->m.job_items_error, 1);
    if (st == AR_OK && sink->fn) {
        char *js = error_line_json(line, msg);
        if (!js)
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        sink->fn(sink->user, line, js, msg);
        ar_free(js);
    }
    return st;
}

/* Answers one chunk of pending lines; false when the job must pause (busy or stopping). */
static enum ar_status run_chunk(struct reply_service *svc, const char *job_id, const char *job_shop,
                                struct store_item *items, size_t n, const struct line_sink *sink,
                                struct ar_err *err)
{
    struct reply_review rv[JOB_CHUNK];
    cJSON *parsed[JOB_CHUNK];
    char msg[JOB_CHUNK][200];
    bool bad[JOB_CHUNK];
    struct reply_result res[JOB_CHUNK];
    size_t idx[JOB_CHUNK], n_ok = 0;
    struct reply_review ok_rv[JOB_CHUNK] = {{0}};
    struct reply_result ok_res[JOB_CHUNK];
    enum ar_status st = AR_OK;
    bool busy = false;

    for (size_t i = 0; i < n; i++) {
        /* lines stored before NULs were refused at creation are refused here */
        bool nul = ar_json_has_nul(items[i].input, strlen(items[i].input), NULL, NULL, 0);
        parsed[i] = nul ? NULL : cJSON_Parse(items[i].input);
        bad[i] = false;
        if (nul) {
            snprintf(msg[i], sizeof(msg[i]), "line %lld contains a NUL character (\\u0000)",
                     (long long)items[i].line);
            bad[i] = true;
        } else if (!parsed[i]) {
            snprintf(msg[i], sizeof(msg[i]), "line %lld is not valid JSON",
                     (long long)items[i].line);
            bad[i] = true;
        } else if (reply_review_from_json(parsed[i], job_shop, &rv[i], msg[i], sizeof(msg[i])) !=
                   AR_OK) {
            bad[i] = true;
        } else {
            idx[n_ok] = i;
            ok_rv[n_ok++] = rv[i];
        }
    }
    reply_service_answer_many(svc, ok_rv, n_ok, ENGINE_PRIO_BULK, REPLY_DUP_SAME, ok_res);
    for (size_t k = 0; k < n_ok; k++)
        res[idx[k]] = ok_res[k];
    for (size_t i = 0; i < n && st == AR_OK; i++) {
        if (bad[i]) {
            st = line_error(svc, job_id, items[i].line, msg[i], sink, err);
        } else if (res[i].err == REPLY_OK) {
            char *js = result_line_json(items[i].line, &res[i], rv[i].review_id);
            if (!js)
                st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
            else
                st = store_job_item_done(svc->p.store, job_id, items[i].line, js, err);
            if (st == AR_OK && sink->fn)
                sink->fn(sink->user, items[i].line, js, NULL);
            ar_free(js);
            metrics_inc(svc->m.job_items_done, 1);
        } else if (res[i].err != REPLY_EBUSY && res[i].err != REPLY_EUNAVAIL) {
            st = line_error(svc, job_id, items[i].line, res[i].error, sink, err);
        } else {
            busy = true; /* busy or unreachable: left pending, retried on the next pass */
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!bad[i])
            reply_result_fini(&res[i]);
        cJSON_Delete(parsed[i]);
    }
    if (st == AR_OK && busy)
        st = AR_EBUSY;
    return st;
}

enum ar_status reply_job_run(struct reply_service *svc, const char *job_id,
                             reply_job_progress_fn progress, void *user, struct ar_err *err)
{
    return reply_job_run_lines(svc, job_id, progress, NULL, user, err);
}

enum ar_status reply_job_run_lines(struct reply_service *svc, const char *job_id,
                                   reply_job_progress_fn progress, reply_job_line_fn line,
                                   void *user, struct ar_err *err)
{
    const struct line_sink sink = {line, user};
    struct store_job_info info;
    bool found = false;
    enum ar_status st;
    int64_t after = 0;
    int busy_passes = 0;
    if ((st = store_job_get(svc->p.store, job_id, &info, &found, err)) != AR_OK)
        return st;
    if (!found)
        return ar_err_set(err, AR_EINVAL, 0, "no job %s", job_id);
    if (info.status != STORE_JOB_QUEUED && info.status != STORE_JOB_RUNNING)
        return AR_OK;
    for (;;) {
        struct store_item *items = NULL;
        size_t n = 0;
        if (stopping(svc))
            return AR_ECANCELED;
        st = store_job_next_pending(svc->p.store, job_id, after, JOB_CHUNK, &items, &n, err);
        if (st != AR_OK)
            return st;
        if (n == 0) {
            if (after == 0)
                break; /* nothing pending at all: finished */
            after = 0; /* lines left pending by a busy pass: go round again */
            continue;
        }
        after = items[n - 1].line;
        st = run_chunk(svc, job_id, info.shop_id, items, n, &sink, err);
        store_items_free(items, n);
        if (st == AR_EBUSY) {
            /* the engine is full: back off a little, then retry the pending lines */
            if (++busy_passes > 600)
                return ar_err_set(err, AR_EBUSY, 0, "the model stayed busy");
            {
                struct timespec ts = {0, 100 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        } else if (st != AR_OK) {
            return st;
        } else {
            busy_passes = 0;
        }
        if (progress && store_job_get(svc->p.store, job_id, &info, &found, NULL) == AR_OK && found)
            progress(user, &info);
    }
    if (progress && store_job_get(svc->p.store, job_id, &info, &found, NULL) == AR_OK && found)
        progress(user, &info);
    return AR_OK;
}

/* ---- the queue: messages ------------------------------------------------------------------ */

#define JOB_PUBLISH_CHUNK 1000 /* messages per queue_publish_many */
#define JOB_GAUGE_S 5.0        /* the backlog gauge is refreshed this often */
#define JOB_BACKOFF_MIN_S 0.1  /* a line that must be retried waits this long, doubling ... */
#define JOB_BACKOFF_MAX_S 5.0  /* ... to this, before its message goes back to the queue */
#define JOB_GET_WAIT_S 0.1     /* longest wait for a message (acks wait at most this long) */

/* What a message names: one line of one job. */
struct line_ref {
    char job_id[STORE_JOB_ID_LEN + 1];
    int64_t line;
};

/* {"job_id":"...","line":N,"shop_id":"..."}, new (ar_free); NULL when out of memory. */
static char *line_message(const char *job_id, int64_t line, const char *shop_id)
{
    cJSON *j = cJSON_CreateObject();
    char *s, *copy = NULL;
    if (!j)
        return NULL;
    if (cJSON_AddStringToObject(j, "job_id", job_id) &&
        cJSON_AddNumberToObject(j, "line", (double)line) &&
        cJSON_AddStringToObject(j, "shop_id", shop_id)) {
        s = cJSON_PrintUnformatted(j);
        if (s) {
            copy = ar_strdup(s);
            cJSON_free(s);
        }
    }
    cJSON_Delete(j);
    return copy;
}

static bool parse_line_message(const char *body, size_t len, struct line_ref *out)
{
    cJSON *j = cJSON_ParseWithLength(body, len);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "job_id");
    const cJSON *ln = cJSON_GetObjectItemCaseSensitive(j, "line");
    bool ok = cJSON_IsString(id) && strlen(id->valuestring) == STORE_JOB_ID_LEN &&
              strspn(id->valuestring, "0123456789abcdef") == STORE_JOB_ID_LEN &&
              cJSON_IsNumber(ln) && ln->valuedouble >= 1 && ln->valuedouble <= 1e15 &&
              ln->valuedouble == (double)(int64_t)ln->valuedouble;
    if (ok) {
        memcpy(out->job_id, id->valuestring, STORE_JOB_ID_LEN + 1);
        out->line = (int64_t)ln->valuedouble;
    }
    cJSON_Delete(j);
    return ok;
}

static enum ar_status publish_lines(struct reply_service *svc, const char *job_id,
                                    const char *shop_id, const int64_t *lines, size_t n,
                                    struct ar_err *err)
{
    struct queue_body b[JOB_PUBLISH_CHUNK];
    char *msg[JOB_PUBLISH_CHUNK];
    enum ar_status st = AR_OK;
    for (size_t i0 = 0; i0 < n && st == AR_OK; i0 += JOB_PUBLISH_CHUNK) {
        size_t m = AR_MIN((size_t)JOB_PUBLISH_CHUNK, n - i0), k;
        for (k = 0; k < m; k++) {
            msg[k] = line_message(job_id, lines[i0 + k], shop_id);
            if (!msg[k])
                break;
            b[k].data = msg[k];
            b[k].len = strlen(msg[k]);
        }
        st = k < m ? ar_err_set(err, AR_ENOMEM, 0, "out of memory")
                   : queue_publish_many(svc->queue, b, m, err);
        for (size_t x = 0; x < k; x++)
            ar_free(msg[x]);
    }
    return st;
}

/* Queues every pending line of a job, then marks it published. */
static enum ar_status publish_pending(struct reply_service *svc, const struct store_job_info *info,
                                      struct ar_err *err)
{
    int64_t after = 0, nums[JOB_PUBLISH_CHUNK];
    for (;;) {
        struct store_item *items = NULL;
        size_t n = 0;
        enum ar_status st = store_job_next_pending(svc->p.store, info->id, after, JOB_PUBLISH_CHUNK,
                                                   &items, &n, err);
        if (st != AR_OK)
            return st;
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++)
            nums[i] = items[i].line;
        after = items[n - 1].line;
        store_items_free(items, n);
        if ((st = publish_lines(svc, info->id, info->shop_id, nums, n, err)) != AR_OK)
            return st;
    }
    return store_job_set_published(svc->p.store, info->id, err);
}

/* ---- the queue: answering one line ---------------------------------------------------------- */

enum line_outcome {
    LINE_SETTLED, /* the line has its result (now or before), or there is nothing to do: ack */
    LINE_RETRY    /* the store or the model cannot take it now: back to the queue, later */
};

static void notice_if_done(struct reply_service *svc, const char *job_id);

static enum line_outcome record_error(struct reply_service *svc, const struct line_ref *ref,
                                      const char *msg)
{
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st = store_job_item_error(svc->p.store, ref->job_id, ref->line, msg, &err);
    if (st == AR_OK) {
        metrics_inc(svc->m.job_items_error, 1);
        return LINE_SETTLED;
    }
    if (st == AR_EINVAL)
        return LINE_SETTLED; /* finished meanwhile (a copy of this message was faster) */
    AR_WARN("job %s line %lld: cannot store its error: %s (%s)", ref->job_id, (long long)ref->line,
            ar_status_str(st), err.msg);
    return LINE_RETRY;
}

/* Answers one line unless it is finished already, and stores its result. Never acks: the
 * consumer thread does, after this returned LINE_SETTLED. */
static enum line_outcome work_line(struct reply_service *svc, const struct line_ref *ref)
{
    struct store_job_info info;
    struct store_item it;
    struct reply_review rv;
    struct reply_result res;
    struct ar_err err = {AR_OK, 0, {0}};
    char msg[200];
    bool found = false;
    enum ar_status st;
    enum line_outcome out;
    cJSON *parsed;

    st = store_job_get(svc->p.store, ref->job_id, &info, &found, &err);
    if (st != AR_OK) {
        AR_WARN("job %s: cannot read it: %s (%s)", ref->job_id, ar_status_str(st), err.msg);
        return LINE_RETRY;
    }
    if (!found) {
        /* deleted by its owner (DELETE /v1/jobs/ID) */
        AR_DEBUG("job %s: no such job; its line %lld is dropped from the queue", ref->job_id,
                 (long long)ref->line);
        return LINE_SETTLED;
    }
    if (info.status != STORE_JOB_QUEUED && info.status != STORE_JOB_RUNNING) {
        /* finished, failed or cancelled: nothing to do but, for a job whose lines all
         * finished before any worker saw them (per-line errors), its notice */
        if (info.status == STORE_JOB_DONE && info.callback_url[0] && !info.notified)
            notice_if_done(svc, ref->job_id);
        return LINE_SETTLED;
    }
    memset(&it, 0, sizeof(it));
    st = store_job_item_get(svc->p.store, ref->job_id, ref->line, &it, &found, &err);
    if (st != AR_OK) {
        AR_WARN("job %s line %lld: cannot read it: %s (%s)", ref->job_id, (long long)ref->line,
                ar_status_str(st), err.msg);
        return LINE_RETRY;
    }
    if (!found) {
        AR_WARN("job %s: no line %lld; dropped from the queue", ref->job_id, (long long)ref->line);
        return LINE_SETTLED;
    }
    if (it.status != STORE_ITEM_PENDING) {
        store_item_fini(&it); /* a redelivery or a duplicate of a finished line */
        if (info.callback_url[0])
            notice_if_done(svc, ref->job_id);
        return LINE_SETTLED;
    }
    parsed = cJSON_Parse(it.input);
    store_item_fini(&it);
    if (!parsed) {
        snprintf(msg, sizeof(msg), "line %lld is not valid JSON", (long long)ref->line);
        return record_error(svc, ref, msg);
    }
    if (reply_review_from_json(parsed, info.shop_id, &rv, msg, sizeof(msg)) != AR_OK) {
        cJSON_Delete(parsed);
        return record_error(svc, ref, msg);
    }
    reply_service_answer(svc, &rv, ENGINE_PRIO_BULK, &res);
    if (res.err == REPLY_OK) {
        char *js = result_line_json(ref->line, &res, rv.review_id);
        st = js ? store_job_item_done(svc->p.store, ref->job_id, ref->line, js, &err) : AR_ENOMEM;
        ar_free(js);
        if (st == AR_OK) {
            metrics_inc(svc->m.job_items_done, 1);
            out = LINE_SETTLED;
        } else if (st == AR_EINVAL) {
            out = LINE_SETTLED; /* finished meanwhile by a copy of this message */
        } else {
            AR_WARN("job %s line %lld: cannot store its result: %s (%s)", ref->job_id,
                    (long long)ref->line, ar_status_str(st), err.msg);
            out = LINE_RETRY;
        }
    } else if (res.err == REPLY_EBUSY || res.err == REPLY_EUNAVAIL ||
               (res.err == REPLY_EINTERNAL && !strncmp(res.error, "store", 5))) {
        out = LINE_RETRY; /* the model is busy or the store cannot be reached: later */
    } else {
        out = record_error(svc, ref, res.error);
    }
    reply_result_fini(&res);
    cJSON_Delete(parsed);
    if (out == LINE_SETTLED && info.callback_url[0])
        notice_if_done(svc, ref->job_id);
    return out;
}

/* ---- the queue: the runner --------------------------------------------------------------------
 * One consumer thread owns the queue's consumer side: it takes messages while fewer than
 * n_slots are held, hands them to n_slots line workers, and acks (or nacks) each message once
 * its worker is done with it. A sweeper thread queues the lines of unpublished jobs and keeps
 * the backlog gauge. */

enum reply_line_state { REPLY_LINE_TODO, REPLY_LINE_WORKING, REPLY_LINE_DONE };

/* One delivered message, from delivery until it is acked or nacked. */
struct reply_line {
    struct reply_line *next;
    uint64_t tag;
    struct line_ref ref;
    bool valid; /* the message names a line */
    enum reply_line_state state;
    bool requeue; /* REPLY_LINE_DONE: nack and requeue it (else ack) */
};

struct reply_runner {
    struct reply_service *svc;
    struct queue *q;
    int n_slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* CLOCK_MONOTONIC: a line changed state, or stop */
    struct reply_line *head, *tail; /* held (delivered, not settled), in delivery order */
    int n_held;
    bool stop;         /* under mu */
    bool workers_gone; /* under mu: every worker has returned */
    pthread_t consumer, sweeper, notifier, *workers;
    int n_workers; /* started */
    bool consumer_on, sweeper_on, notifier_on;
    struct reply_notice *notices; /* under mu: completion callbacks to deliver */
};

/* ---- the queue: completion callbacks ------------------------------------------------------------
 * When a line settles the last one of a job with a callback_url, the store hands the job's
 * notice to exactly one caller (store_job_claim_notify), whose runner POSTs the job's summary
 * from its notifier thread, retrying with a doubling pause; a notice not delivered when the
 * process stops is lost (at most once, never twice). */

struct reply_notice {
    struct reply_notice *next;
    char job_id[STORE_JOB_ID_LEN + 1];
    int tries;      /* attempts made */
    double next_at; /* ar_time_s() of the next attempt */
};

/* Waits on the runner's condition for at most s seconds (mu held). */
static void runner_wait(struct reply_runner *r, double s)
{
    struct timespec ts;
    if (s <= 0)
        return;
    ts = ar_deadline_in(CLOCK_MONOTONIC, AR_MIN(s, 3600));
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

static bool runner_stopping(struct reply_runner *r)
{
    bool s;
    pthread_mutex_lock(&r->mu);
    s = r->stop;
    pthread_mutex_unlock(&r->mu);
    return s;
}

static void notice_if_done(struct reply_service *svc, const char *job_id)
{
    struct reply_runner *r = svc->runner;
    struct reply_notice *n;
    struct ar_err err = {AR_OK, 0, {0}};
    bool claimed = false;
    enum ar_status st = store_job_claim_notify(svc->p.store, job_id, &claimed, &err);
    if (st != AR_OK) {
        AR_WARN("job %s: cannot claim its completion notice: %s (%s)", job_id, ar_status_str(st),
                err.msg);
        return;
    }
    if (!claimed || !r)
        return;
    n = ar_calloc(1, sizeof(*n));
    if (!n) {
        AR_WARN("job %s: out of memory; its completion callback is not sent", job_id);
        return;
    }
    memcpy(n->job_id, job_id, sizeof(n->job_id));
    n->next_at = ar_time_s();
    pthread_mutex_lock(&r->mu);
    n->next = r->notices;
    r->notices = n;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* One attempt: true when the receiver answered 2xx (or the job is gone: nothing to say). */
static bool deliver_notice(struct reply_service *svc, const struct reply_notice *n)
{
    struct store_job_info info;
    struct ar_err err = {AR_OK, 0, {0}};
    bool found = false;
    enum ar_status st = store_job_get(svc->p.store, n->job_id, &info, &found, &err);
    cJSON *j;
    char *body;
    int status = 0;
    if (st != AR_OK)
        return false;
    if (!found || !info.callback_url[0])
        return true;
    j = reply_job_info_to_json(&info);
    if (!j || !cJSON_AddStringToObject(j, "event", "job.done")) {
        cJSON_Delete(j);
        return false;
    }
    body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!body)
        return false;
    st = reply_http_post_json(info.callback_url, body, strlen(body),
                              svc->p.webhook_timeout_s > 0 ? svc->p.webhook_timeout_s : 5, &status,
                              &err);
    cJSON_free(body);
    if (st == AR_OK && status >= 200 && status < 300)
        return true;
    AR_WARN("job %s: completion callback attempt %d failed: %s", n->job_id, n->tries + 1,
            st == AR_OK ? "the receiver did not answer 2xx" : err.msg);
    return false;
}

static void *notifier_main(void *arg)
{
    struct reply_runner *r = arg;
    struct reply_service *svc = r->svc;
    int tries = svc->p.webhook_tries > 0 ? svc->p.webhook_tries : 4;
    double backoff = svc->p.webhook_backoff_s > 0 ? svc->p.webhook_backoff_s : 1;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct reply_notice **pp, **due = NULL, *n;
        double now = ar_time_s(), next = now + 1;
        for (pp = &r->notices; *pp; pp = &(*pp)->next) {
            if ((*pp)->next_at <= now && !due)
                due = pp;
            next = AR_MIN(next, (*pp)->next_at);
        }
        if (!due) {
            runner_wait(r, next - now);
            continue;
        }
        n = *due;
        *due = n->next;
        pthread_mutex_unlock(&r->mu);
        if (deliver_notice(svc, n)) {
            ar_free(n);
            n = NULL;
        } else if (++n->tries >= tries) {
            AR_WARN("job %s: completion callback given up after %d attempts", n->job_id, tries);
            ar_free(n);
            n = NULL;
        }
        pthread_mutex_lock(&r->mu);
        if (n) {
            double pause = backoff;
            for (int i = 1; i < n->tries; i++)
                pause *= 2;
            n->next_at = ar_time_s() + pause;
            n->next = r->notices;
            r->notices = n;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void *line_worker(void *arg)
{
    struct reply_runner *r = arg;
    double backoff = JOB_BACKOFF_MIN_S;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct reply_line *l = r->head;
        enum line_outcome out;
        while (l && l->state != REPLY_LINE_TODO)
            l = l->next;
        if (!l) {
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        l->state = REPLY_LINE_WORKING;
        pthread_mutex_unlock(&r->mu);
        out = l->valid ? work_line(r->svc, &l->ref) : LINE_SETTLED;
        pthread_mutex_lock(&r->mu);
        if (out == LINE_RETRY) {
            /* wait before giving it back, so that a store that is down or a busy model is not
             * hammered; stopping cuts the wait short */
            double until = ar_time_s() + backoff;
            while (!r->stop && ar_time_s() < until)
                runner_wait(r, until - ar_time_s());
            backoff = AR_MIN(backoff * 2, JOB_BACKOFF_MAX_S);
        } else {
            backoff = JOB_BACKOFF_MIN_S;
        }
        l->requeue = out == LINE_RETRY;
        l->state = REPLY_LINE_DONE;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Acks or nacks every line its worker is done with. */
static void settle(struct reply_runner *r)
{
    struct reply_line *done = NULL, *prev = NULL;
    pthread_mutex_lock(&r->mu);
    for (struct reply_line *l = r->head, *next; l; l = next) {
        next = l->next;
        if (l->state != REPLY_LINE_DONE) {
            prev = l;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            r->head = next;
        if (r->tail == l)
            r->tail = prev;
        r->n_held--;
        l->next = done;
        done = l;
    }
    pthread_mutex_unlock(&r->mu);
    while (done) {
        struct reply_line *l = done;
        struct ar_err err = {AR_OK, 0, {0}};
        enum ar_status st =
            l->requeue ? queue_nack(r->q, l->tag, true, &err) : queue_ack(r->q, l->tag, &err);
        if (st != AR_OK) /* the connection is gone: the broker redelivers the message */
            AR_DEBUG("job queue: %s of a line failed: %s", l->requeue ? "nack" : "ack", err.msg);
        done = l->next;
        ar_free(l);
    }
}

/* Takes a delivered message into the held list. */
static void take(struct reply_runner *r, const struct queue_msg *m)
{
    struct reply_line *l = ar_calloc(1, sizeof(*l));
    bool settled = false;
    if (!l) {
        queue_nack(r->q, m->tag, true, NULL);
        return;
    }
    l->tag = m->tag;
    l->valid = parse_line_message(m->body, m->len, &l->ref);
    if (!l->valid) {
        /* requeued it would come back forever */
        AR_WARN("job queue: a message that names no job line was dropped (%zu bytes)", m->len);
        settled = true;
    }
    pthread_mutex_lock(&r->mu);
    for (struct reply_line *x = r->head; x && !settled; x = x->next)
        settled = x->valid && x->ref.line == l->ref.line && !strcmp(x->ref.job_id, l->ref.job_id);
    /* a copy of a line held here already is acked at once: the held one settles the line (or
     * goes back to the queue) */
    l->state = settled ? REPLY_LINE_DONE : REPLY_LINE_TODO;
    if (r->tail)
        r->tail->next = l;
    else
        r->head = l;
    r->tail = l;
    r->n_held++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void *consumer_main(void *arg)
{
    struct reply_runner *r = arg;
    struct ar_err err = {AR_OK, 0, {0}};
    if (queue_set_prefetch(r->q, r->n_slots, &err) != AR_OK)
        AR_DEBUG("job queue: prefetch: %s (applied when connected)", err.msg);
    for (;;) {
        struct queue_msg m;
        enum ar_status st;
        bool full;
        settle(r);
        pthread_mutex_lock(&r->mu);
        if (r->stop) {
            /* take nothing more; settle what the workers finish, until they are gone */
            bool gone = r->workers_gone;
            if (!gone)
                runner_wait(r, 0.05);
            pthread_mutex_unlock(&r->mu);
            if (gone)
                break;
            continue;
        }
        full = r->n_held >= r->n_slots;
        pthread_mutex_unlock(&r->mu);
        /* when full, a get that does not wait still lets the connection do its chores
         * (heartbeats) while the workers are busy */
        st = queue_get(r->q, full ? 0 : JOB_GET_WAIT_S, &m, &err);
        if (st == AR_OK) {
            take(r, &m);
            queue_msg_fini(&m);
        } else if (full || st == AR_ENOMEM) {
            pthread_mutex_lock(&r->mu);
            if (!r->stop)
                runner_wait(r, 0.05);
            pthread_mutex_unlock(&r->mu);
        }
    }
    settle(r);
    /* the lines taken but not started go back to the queue, for this instance or another */
    queue_consumer_close(r->q);
    return NULL;
}

/* Seconds between sweeps (reply_service_params.job_sweep_s; 0 or less: 10). */
static double sweep_period(const struct reply_service *svc)
{
    return svc->p.job_sweep_s > 0 ? svc->p.job_sweep_s : 10;
}

/* The unfinished jobs as the sweeper sees them. */
struct job_scan {
    bool collect;                /* gather the jobs to queue */
    bool all;                    /* every unfinished job (the in-process queue after a restart) */
    int64_t before_s;            /* else: unpublished jobs created before this (unix s) */
    int64_t pending;             /* pending lines of every unfinished job */
    struct store_job_info *jobs; /* owned, (n) */
    size_t n, cap;
    bool oom;
};

static bool scan_job(const struct store_job_info *info, void *user)
{
    struct job_scan *sc = user;
    sc->pending += info->n_total - info->n_done - info->n_failed;
    if (!sc->collect || !(sc->all || (!info->published && info->created_s <= sc->before_s)))
        return true;
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 16;
        struct store_job_info *j = ar_realloc(sc->jobs, cap * sizeof(*j));
        if (!j) {
            sc->oom = true;
            return false;
        }
        sc->jobs = j;
        sc->cap = cap;
    }
    sc->jobs[sc->n++] = *info;
    return true;
}

/* Ids of done jobs whose completion notice nobody claimed. */
struct unnotified {
    char ids[100][STORE_JOB_ID_LEN + 1];
    size_t n;
};

static bool note_unnotified(const struct store_job_info *info, void *user)
{
    struct unnotified *u = user;
    if (u->n == AR_ARRAY_LEN(u->ids))
        return false;
    memcpy(u->ids[u->n++], info->id, sizeof(u->ids[0]));
    return true;
}

/* Claims the notices of done jobs that an instance finished but died before claiming: their
 * last line's worker is gone, so nobody else would. */
static void sweep_notices(struct reply_runner *r)
{
    struct unnotified *u = ar_calloc(1, sizeof(*u));
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st;
    if (!u)
        return;
    st = store_jobs_unnotified(r->svc->p.store, note_unnotified, u, &err);
    if (st != AR_OK && st != AR_ECANCELED)
        AR_WARN("jobs: cannot look for completion notices to send: %s (%s)", ar_status_str(st),
                err.msg);
    for (size_t i = 0; i < u->n; i++)
        notice_if_done(r->svc, u->ids[i]);
    ar_free(u);
}

/* Refreshes the backlog gauge and, when sweep, queues the lines of the jobs that need it.
 * *all is cleared once every unfinished job was queued. */
static void sweep_once(struct reply_runner *r, bool sweep, bool *all)
{
    struct reply_service *svc = r->svc;
    struct job_scan sc;
    struct ar_err err = {AR_OK, 0, {0}};
    enum ar_status st;
    bool ok = true;
    memset(&sc, 0, sizeof(sc));
    sc.collect = sweep;
    sc.all = *all;
    sc.before_s = (int64_t)time(NULL) - (int64_t)(3 * sweep_period(svc));
    st = store_jobs_unfinished(svc->p.store, scan_job, &sc, &err);
    if (st != AR_OK || sc.oom) {
        AR_WARN("jobs: cannot list unfinished jobs: %s (%s)",
                sc.oom ? "out of memory" : ar_status_str(st), err.msg);
        ar_free(sc.jobs);
        return;
    }
    metrics_set(svc->m.job_items_pending, (double)sc.pending);
    for (size_t i = 0; i < sc.n && !runner_stopping(r); i++) {
        st = publish_pending(svc, &sc.jobs[i], &err);
        if (st == AR_OK) {
            AR_INFO("job %s: pending lines queued (%s)", sc.jobs[i].id,
                    sc.all ? "unfinished at start; the in-process queue starts empty"
                           : "not queued at creation");
        } else {
            ok = false;
            AR_WARN("job %s: cannot queue its lines now: %s (%s); tried again in %.1f s",
                    sc.jobs[i].id, ar_status_str(st), err.msg, sweep_period(svc));
            if (st == AR_EUNAVAIL || st == AR_EBUSY)
                break; /* the queue cannot take any now */
        }
    }
    if (sweep && ok && !runner_stopping(r))
        *all = false;
    ar_free(sc.jobs);
    if (sweep && !runner_stopping(r))
        sweep_notices(r);
}

static void *sweeper_main(void *arg)
{
    struct reply_runner *r = arg;
    double period = sweep_period(r->svc), next_sweep = 0, next_gauge = 0;
    /* the in-process queue died with the previous process: queue every unfinished job once */
    bool all = !queue_durable(r->q);
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        double now = ar_time_s();
        if (now >= next_gauge || now >= next_sweep) {
            bool sweep = now >= next_sweep;
            pthread_mutex_unlock(&r->mu);
            sweep_once(r, sweep, &all);
            pthread_mutex_lock(&r->mu);
            now = ar_time_s();
            next_gauge = now + AR_MIN(JOB_GAUGE_S, period);
            if (sweep)
                next_sweep = now + period;
            continue;
        }
        runner_wait(r, AR_MIN(next_gauge, next_sweep) - now);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

enum ar_status reply_jobs_init(struct reply_service *svc)
{
    if (svc->p.queue) {
        svc->queue = svc->p.queue;
    } else {
        struct queue_params qp = queue_default_params();
        if (queue_memory_create(qp.max_messages, &svc->owned_queue) != AR_OK)
            return AR_ENOMEM;
        svc->queue = svc->owned_queue;
    }
    if (svc->p.metrics) {
        struct metrics_family *f;
        if (metrics_gauge(svc->p.metrics, "autoreply_job_items_pending",
                          "Lines of unfinished jobs without a result yet (the job backlog, read "
                          "from the store every few seconds: the same on every instance)",
                          NULL, &f) == AR_OK)
            svc->m.job_items_pending = metrics_child(f, NULL);
    }
    return AR_OK;
}

void reply_jobs_fini(struct reply_service *svc)
{
    queue_destroy(svc->owned_queue);
    svc->owned_queue = NULL;
    svc->queue = NULL;
}

enum ar_status reply_jobs_start(struct reply_service *svc)
{
    struct reply_runner *r;
    pthread_condattr_t ca;
    if (svc->runner)
        return AR_OK;
    r = ar_calloc(1, sizeof(*r));
    if (!r)
        return AR_ENOMEM;
    r->svc = svc;
    r->q = svc->queue;
    r->n_slots = AR_MIN(svc->p.job_slots > 0 ? svc->p.job_slots : svc->p.n_workers, 1024);
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    svc->runner = r;
    r->workers = ar_calloc((size_t)r->n_slots, sizeof(pthread_t));
    if (!r->workers)
        goto fail;
    for (int i = 0; i < r->n_slots; i++) {
        if (pthread_create(&r->workers[i], NULL, line_worker, r) != 0)
            goto fail;
        r->n_workers++;
    }
    if (pthread_create(&r->consumer, NULL, consumer_main, r) != 0)
        goto fail;
    r->consumer_on = true;
    if (pthread_create(&r->sweeper, NULL, sweeper_main, r) != 0)
        goto fail;
    r->sweeper_on = true;
    if (pthread_create(&r->notifier, NULL, notifier_main, r) != 0)
        goto fail;
    r->notifier_on = true;
    return AR_OK;
fail:
    reply_jobs_stop(svc);
    return AR_ENOMEM;
}

void reply_jobs_stop(struct reply_service *svc)
{
    struct reply_runner *r = svc->runner;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    /* the lines in progress finish (their results are stored) ... */
    for (int i = 0; i < r->n_workers; i++)
        pthread_join(r->workers[i], NULL);
    pthread_mutex_lock(&r->mu);
    r->workers_gone = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    /* ... the consumer acks them and gives the rest back */
    if (r->consumer_on)
        pthread_join(r->consumer, NULL);
    if (r->sweeper_on)
        pthread_join(r->sweeper, NULL);
    if (r->notifier_on)
        pthread_join(r->notifier, NULL);
    while (r->notices) {
        struct reply_notice *n = r->notices;
        r->notices = n->next;
        AR_WARN("job %s: stopping before its completion callback was delivered", n->job_id);
        ar_free(n);
    }
    while (r->head) {
        struct reply_line *l = r->head;
        r->head = l->next;
        ar_free(l);
    }
    ar_free(r->workers);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    ar_free(r);
    svc->runner = NULL;
}

/* ---- reading ----------------------------------------------------------------------------- */

cJSON *reply_job_info_to_json(const struct store_job_info *info)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    if (!cJSON_AddStringToObject(j, "id", info->id) ||
        !cJSON_AddStringToObject(j, "status", store_job_status_str(info->status)) ||
        !cJSON_AddNumberToObject(j, "total", (double)info->n_total) ||
        !cJSON_AddNumberToObject(j, "done", (double)info->n_done) ||
        !cJSON_AddNumberToObject(j, "failed", (double)info->n_failed) ||
        !cJSON_AddNumberToObject(j, "pending",
                                 (double)(info->n_total - info->n_done - info->n_failed)) ||
        !cJSON_AddNumberToObject(j, "created", (double)info->created_s) ||
        !cJSON_AddNumberToObject(j, "updated", (double)info->updated_s) ||
        !cJSON_AddStringToObject(j, "shop_id", info->shop_id) ||
        !cJSON_AddNumberToObject(j, "bytes", (double)info->bytes) ||
        (info->callback_url[0] &&
         !cJSON_AddStringToObject(j, "callback_url", info->callback_url))) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

bool reply_job_result_line(struct ar_buf *b, const struct store_item *it,
                           enum store_job_status job_status)
{
    if (it->status == STORE_ITEM_DONE) {
        ar_buf_puts(b, it->result);
    } else if (it->status == STORE_ITEM_ERROR) {
        char *s = error_line_json(it->line, it->result);
        if (!s) {
            b->oom = true;
            return false;
        }
        ar_buf_puts(b, s);
        ar_free(s);
    } else {
        char s[80];
        snprintf(s, sizeof(s), "{\"line\":%lld,\"status\":\"%s\"}", (long long)it->line,
                 job_status == STORE_JOB_CANCELLED ? "cancelled" : "pending");
        ar_buf_puts(b, s);
    }
    ar_buf_put(b, "\n", 1);
    return !b->oom;
}

static bool add_result_line(const struct store_item *it, void *user)
{
    return reply_job_result_line(user, it, STORE_JOB_RUNNING);
}

enum ar_status reply_job_results_jsonl(struct reply_service *svc, const char *job_id, char **out,
                                       size_t *len, struct ar_err *err)
{
    struct ar_buf b = {0};
    enum ar_status st = store_job_results(svc->p.store, job_id, add_result_line, &b, err);
    if (st != AR_OK) {
        ar_free(b.s);
        return b.oom ? ar_err_set(err, AR_ENOMEM, 0, "out of memory") : st;
    }
    *out = ar_buf_take(&b, len);
    return *out ? AR_OK : ar_err_set(err, AR_ENOMEM, 0, "out of memory");
}

struct each_line {
    reply_job_line_fn fn;
    void *user;
    bool oom;
};

static bool each_finished_line(const struct store_item *it, void *user)
{
    struct each_line *e = user;
    if (it->status == STORE_ITEM_DONE) {
        e->fn(e->user, it->line, it->result, NULL);
    } else if (it->status == STORE_ITEM_ERROR) {
        char *s = error_line_json(it->line, it->result);
        if (!s) {
            e->oom = true;
            return false;
        }
        e->fn(e->user, it->line, s, it->result ? it->result : "");
        ar_free(s);
    }
    return true;
}

enum ar_status reply_job_results_each(struct reply_service *svc, const char *job_id,
                                      reply_job_line_fn fn, void *user, struct ar_err *err)
{
    struct each_line e = {fn, user, false};
    enum ar_status st = store_job_results(svc->p.store, job_id, each_finished_line, &e, err);
    return e.oom ? ar_err_set(err, AR_ENOMEM, 0, "out of memory") : st;
}
