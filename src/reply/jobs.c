/* jobs.c - bulk jobs: a JSONL or JSON-array body becomes one stored line per review before the
 * job id is returned; a runner answers pending lines in chunks at bulk priority, storing each
 * reply before marking its line, so a crash at any point redoes at most the chunk in flight
 * and the store's (shop_id, review_id) idempotency keeps one reply per review. */
#include <stdio.h>
#include <string.h>
#include <time.h>

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

static enum ar_status lines_from_jsonl(const char *body, size_t len, struct lines *l,
                                       struct ar_err *err)
{
    size_t i = 0;
    int64_t line = 0;
    while (i < len) {
        size_t a = i, e;
        const char *nl = memchr(body + i, '\n', len - i);
        e = nl ? (size_t)(nl - body) : len;
        i = nl ? e + 1 : len;
        line++;
        while (a < e && (body[a] == ' ' || body[a] == '\t' || body[a] == '\r'))
            a++;
        {
            size_t z = e;
            while (z > a && (body[z - 1] == ' ' || body[z - 1] == '\t' || body[z - 1] == '\r'))
                z--;
            e = z;
        }
        if (a == e)
            continue; /* blank lines are not reviews */
        if ((int64_t)l->n >= REPLY_JOB_LINES_MAX)
            return ar_err_set(err, AR_EINVAL, 0, "more than %d reviews in one job",
                              REPLY_JOB_LINES_MAX);
        {
            char *copy = ar_strndup(body + a, e - a);
            if (!copy || lines_add(l, line, copy) != AR_OK) {
                ar_free(copy);
                return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
            }
        }
    }
    return AR_OK;
}

static enum ar_status create_from_lines(struct reply_service *svc, const char *default_shop,
                                        struct lines *l, char job_id[STORE_JOB_ID_LEN + 1],
                                        int64_t *n_lines, struct ar_err *err)
{
    enum ar_status st;
    if (l->n == 0)
        return ar_err_set(err, AR_EINVAL, 0, "the job has no reviews");
    st = store_job_create(svc->p.store, default_shop ? default_shop : JOB_DEFAULT_SHOP, l->items,
                          l->n, job_id, err);
    if (st == AR_OK) {
        if (n_lines)
            *n_lines = (int64_t)l->n;
        rp_jobs_kick(svc);
    }
    return st;
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
        cJSON *arr = cJSON_ParseWithLength(body, len);
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
        st = create_from_lines(svc, default_shop, &l, job_id, n_lines, err);
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
        st = create_from_lines(svc, default_shop, &l, job_id, n_lines, err);
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

/* Answers one chunk of pending lines; false when the job must pause (busy or stopping). */
static enum ar_status run_chunk(struct reply_service *svc, const char *job_id, const char *job_shop,
                                struct store_item *items, size_t n, struct ar_err *err)
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
        parsed[i] = cJSON_Parse(items[i].input);
        bad[i] = false;
        if (!parsed[i]) {
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
            st = store_job_item_error(svc->p.store, job_id, items[i].line, msg[i], err);
            metrics_inc(svc->m.job_items_error, 1);
        } else if (res[i].err == REPLY_OK) {
            char *js = result_line_json(items[i].line, &res[i], rv[i].review_id);
            if (!js)
                st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
            else
                st = store_job_item_done(svc->p.store, job_id, items[i].line, js, err);
            ar_free(js);
            metrics_inc(svc->m.job_items_done, 1);
        } else if (res[i].err != REPLY_EBUSY && res[i].err != REPLY_EUNAVAIL) {
            st = store_job_item_error(svc->p.store, job_id, items[i].line, res[i].error, err);
            metrics_inc(svc->m.job_items_error, 1);
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
        st = run_chunk(svc, job_id, info.shop_id, items, n, err);
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

/* ---- the background runner --------------------------------------------------------------- */

struct id_list {
    char ids[64][STORE_JOB_ID_LEN + 1];
    int n;
};

static bool collect_job(const struct store_job_info *info, void *user)
{
    struct id_list *l = user;
    if (l->n >= 64)
        return false;
    memcpy(l->ids[l->n++], info->id, STORE_JOB_ID_LEN + 1);
    return true;
}

static void *job_main(void *arg)
{
    struct reply_service *svc = arg;
    while (!stopping(svc)) {
        struct id_list l;
        enum ar_status st;
        l.n = 0;
        st = store_jobs_unfinished(svc->p.store, collect_job, &l, NULL);
        if (st != AR_OK && st != AR_ECANCELED)
            AR_WARN("jobs: cannot list unfinished jobs: %s", ar_status_str(st));
        for (int i = 0; i < l.n && !stopping(svc); i++) {
            struct ar_err err = {AR_OK, 0, {0}};
            st = reply_job_run(svc, l.ids[i], NULL, NULL, &err);
            if (st != AR_OK && st != AR_ECANCELED)
                AR_WARN("job %s: %s (%s)", l.ids[i], ar_status_str(st), err.msg);
        }
        pthread_mutex_lock(&svc->q_mu);
        if (!svc->job_kick && !svc->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 2; /* and look again now and then (a busy engine left lines) */
            pthread_cond_timedwait(&svc->job_cv, &svc->q_mu, &ts);
        }
        svc->job_kick = false;
        pthread_mutex_unlock(&svc->q_mu);
    }
    return NULL;
}

enum ar_status reply_jobs_start(struct reply_service *svc)
{
    if (svc->job_thread_on)
        return AR_OK;
    if (pthread_create(&svc->job_thread, NULL, job_main, svc) != 0)
        return AR_ENOMEM;
    svc->job_thread_on = true;
    return AR_OK;
}

void rp_jobs_stop(struct reply_service *svc)
{
    if (svc->job_thread_on) {
        pthread_join(svc->job_thread, NULL);
        svc->job_thread_on = false;
    }
}

void rp_jobs_kick(struct reply_service *svc)
{
    pthread_mutex_lock(&svc->q_mu);
    svc->job_kick = true;
    pthread_cond_broadcast(&svc->job_cv);
    pthread_mutex_unlock(&svc->q_mu);
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
        !cJSON_AddStringToObject(j, "shop_id", info->shop_id)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static bool add_result_line(const struct store_item *it, void *user)
{
    struct ar_buf *b = user;
    if (it->status == STORE_ITEM_DONE) {
        ar_buf_puts(b, it->result);
    } else {
        cJSON *j = cJSON_CreateObject();
        char *s = NULL;
        if (j) {
            cJSON_AddNumberToObject(j, "line", (double)it->line);
            if (it->status == STORE_ITEM_ERROR)
                cJSON_AddStringToObject(j, "error", it->result ? it->result : "");
            else
                cJSON_AddStringToObject(j, "status", "pending");
            s = cJSON_PrintUnformatted(j);
            cJSON_Delete(j);
        }
        if (!s) {
            b->oom = true;
            return false;
        }
        ar_buf_puts(b, s);
        cJSON_free(s);
    }
    ar_buf_put(b, "\n", 1);
    return !b->oom;
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
