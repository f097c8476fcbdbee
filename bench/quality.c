/* quality.c - reply quality benchmark (issue 11). Answers the reviews of
 * ../shared/data/reviews-eval.jsonl one at a time through the reply service over the demo model
 * (in process, a fresh SQLite store per configuration, no reply cache: every review is a model
 * miss), once per configuration of the shop profile (candidates, aspect notes), and prints:
 *   - language match: the reply is in the review's language (this file's own character count);
 *   - negative flagged: reviews rated <= 2 answered with needs_human;
 *   - aspect named: of the reviews that raise an aspect, the share whose reply names every
 *     aspect raised, and the share of (review, aspect) pairs named. Judged with the JUDGE table
 *     below, written apart from the picking table of src/reply/quality.c (other phrases, its own
 *     matcher): the pipeline's own view is printed beside it, never in its place;
 *   - repeated clause: two identical clauses in a reply (this file's splitter), and the
 *     library's wider clause-or-n-gram check (reply_find_repeat);
 *   - empty replies, fallbacks, and the median / p90 latency of the misses, with its ratio to
 *     the first configuration (today's behaviour: one greedy generation, no notes). The
 *     configurations answer each review in turn (rotating which goes first), so a machine
 *     shared with other work loads them alike.
 * Usage: build/bench/quality [-m MODEL] [--data FILE] [--limit N] [--every K]
 *        [--configs 1:off,3:off,3:on] [-t THREADS] [--samples FILE] */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "reply/reply.h"
#include "store/store.h"
#include "tokenizer/tokenizer.h"

/* ---- the judge -----------------------------------------------------------------------------
 * Written for this benchmark, not shared with the pipeline: a review raises an aspect when it
 * holds one of the "raised" phrases; a reply names it when it holds one of the "named" ones.
 * Matching: plain substring for Chinese, lower-cased substring for English (no word
 * boundaries: a different matcher from the pipeline's on purpose). */

#define J_MAX 32
struct judge_row {
    const char *aspect;
    const char *raised[J_MAX];
    const char *named[J_MAX];
};

static const struct judge_row judge[] = {
    {"delivery",
     {"快递", "物流", "配送", "送餐", "骑手", "送货", "送来", "送到", "送达", "到货", "发货",
      "按时", "准时", "超时", "很快", "太慢", "速度", "deliver", "ship", "arriv", "courier",
      "on time", "waited", NULL},
     {"配送", "送达", "送餐", "物流", "快递", "送货", "到货", "发货", "速度", "久等", "deliver",
      "ship", "arriv", "wait", NULL}},
    {"packaging",
     {"包装", "盒子", "餐盒", "箱", "袋子", "打包", "洒", "压扁", "packag", "box", "wrap",
      "container", "spill", NULL},
     {"包装", "打包", "盒", "packag", "box", NULL}},
    {"quality",
     {"质量", "品质", "做工", "材质", "质感", "故障", "耐用", "毛病", "死机", "quality", "broke",
      "defect", "durable", "flimsy", "junk", "stopped working", NULL},
     {"质量", "品质", "做工", "瑕疵", "故障", "quality", "defect", "fault", "not work",
      "didn't work", NULL}},
    {"size",
     {"尺码", "尺寸", "码数", "大小", "偏大", "偏小", "合身", "size", "fits", "tight", "loose",
      NULL},
     {"尺码", "尺寸", "码", "大小", "size", "fit", NULL}},
    {"taste",
     {"味道", "口味", "口感", "好吃", "难吃", "太咸", "太淡", "辣", "好喝", "taste", "tasty",
      "delicious", "flavor", "bland", "salty", "spicy", NULL},
     {"味道", "口味", "口感", "菜", "厨", "taste", "flavo", "dish", "food", "kitchen", "chef",
      NULL}},
    {"price",
     {"价格", "价钱", "贵", "便宜", "实惠", "划算", "性价比", "price", "expensive", "cheap",
      "worth", "overpriced", NULL},
     {"价格", "价钱", "性价比", "差价", "实惠", "优惠", "物有所值", "price", "value", "cost",
      NULL}},
    {"service",
     {"服务", "态度", "客服", "售后", "热情", "service", "staff", "waiter", "waitress", "rude",
      "friendly", "manager", NULL},
     {"服务态度", "态度", "服务质量", "服务不", "服务的", "our service", "the service", "staff",
      "attitude", NULL}},
    {"freshness",
     {"新鲜", "变质", "过期", "发霉", "馊", "fresh", "stale", "spoil", "rotten", "expired", NULL},
     {"新鲜", "保质", "变质", "fresh", NULL}},
    {"portion",
     {"分量", "份量", "量少", "量太少", "吃不饱", "portion", NULL},
     {"分量", "份量", "portion", NULL}},
    {"hygiene",
     {"头发", "卫生", "异物", "苍蝇", "虫子", "dirty", "a hair", "hygien", NULL},
     {"卫生", "异物", "头发", "hygien", "clean", NULL}},
    {"authenticity",
     {"正品", "假货", "假的", "盗版", "山寨", "fake", "counterfeit", NULL},
     {"正品", "真伪", "genuine", "authentic", NULL}},
    {"order",
     {"漏送", "送错", "少送", "漏发", "发错", "wrong item", "missing", NULL},
     {"漏", "错", "少送", "订单", "missing", "wrong", "order", NULL}},
};
#define N_JUDGE ((int)(sizeof(judge) / sizeof(judge[0])))

/* text lower-cased (ASCII) into buf */
static void lower(const char *s, char *buf, size_t size)
{
    size_t i = 0;
    for (; s[i] && i + 1 < size; i++)
        buf[i] = (char)tolower((unsigned char)s[i]);
    buf[i] = '\0';
}

static unsigned judge_match(const char *text, bool raised)
{
    static char buf[8192];
    unsigned m = 0;
    lower(text, buf, sizeof(buf));
    for (int a = 0; a < N_JUDGE; a++) {
        const char *const *list = raised ? judge[a].raised : judge[a].named;
        for (int k = 0; list[k]; k++)
            if (strstr(buf, list[k])) {
                m |= 1u << a;
                break;
            }
    }
    return m;
}

/* Language by characters: CJK ideographs (3-byte UTF-8 lead E4..E9) against ASCII letters. */
static bool judge_lang(const char *text, const char *lang)
{
    int cjk = 0, latin = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p >= 0xe4 && *p <= 0xe9)
            cjk++;
        else if (isalpha(*p))
            latin++;
    }
    if (!strcmp(lang, "zh"))
        return cjk > 0 && latin <= cjk;
    return latin > 0 && cjk == 0;
}

/* Two identical clauses (split at Chinese and ASCII punctuation), each at least 2 bytes. */
static bool judge_repeated_clause(const char *text)
{
    char clauses[64][512];
    int n = 0;
    size_t len = 0;
    const char *p = text;
    static const char *const seps[] = {"，", "。", "！", "？", "；", "、", ",", ".", "!", "?",
                                       ";", "~", "\n", NULL};
    while (*p && n < 64) {
        size_t sep = 0;
        for (int k = 0; seps[k]; k++)
            if (!strncmp(p, seps[k], strlen(seps[k]))) {
                sep = strlen(seps[k]);
                break;
            }
        if (sep || !p[1]) {
            if (!sep && len < 511)
                clauses[n][len++] = *p;
            while (len && clauses[n][len - 1] == ' ')
                len--;
            clauses[n][len] = '\0';
            {
                size_t st = 0;
                while (clauses[n][st] == ' ')
                    st++;
                memmove(clauses[n], clauses[n] + st, len - st + 1);
                len -= st;
            }
            if (len >= 2)
                n++;
            len = 0;
            p += sep ? sep : 1;
            continue;
        }
        if (len < 511)
            clauses[n][len++] = (char)tolower((unsigned char)*p);
        p++;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (!strcmp(clauses[i], clauses[j]))
                return true;
    return false;
}

/* ---- data --------------------------------------------------------------------------------- */

struct review {
    char *id, *text, *lang;
    int rating;
};

static int load(const char *path, int limit, int every, struct review **out)
{
    FILE *f = fopen(path, "rb");
    char *line = NULL;
    size_t cap = 0;
    int n = 0, i = 0, max = 4096;
    struct review *rv;
    if (!f) {
        fprintf(stderr, "quality: cannot open %s\n", path);
        return -1;
    }
    rv = calloc((size_t)max, sizeof(*rv));
    while (getline(&line, &cap, f) > 0 && n < max && (limit <= 0 || n < limit)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *id = cJSON_GetObjectItem(j, "id"), *t = cJSON_GetObjectItem(j, "text");
        cJSON *r = cJSON_GetObjectItem(j, "rating"), *l = cJSON_GetObjectItem(j, "lang");
        if (j && cJSON_IsString(id) && cJSON_IsString(t) && cJSON_IsNumber(r) &&
            cJSON_IsString(l) && i++ % every == 0) {
            rv[n].id = strdup(id->valuestring);
            rv[n].text = strdup(t->valuestring);
            rv[n].lang = strdup(l->valuestring);
            rv[n].rating = r->valueint;
            n++;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    *out = rv;
    return n;
}

/* ---- one configuration ---------------------------------------------------------------------- */

#define MAX_CONFIGS 8

struct figures {
    int n, lang_ok, neg, neg_flagged, bearing, all_named, pairs, pairs_named, any_named;
    int picker_bearing, picker_all_named;
    int repeated, repeated_lib, empty, fallback, errors, held;
    double p50_ms, p90_ms;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int popc(unsigned m)
{
    int n = 0;
    for (; m; m &= m - 1)
        n++;
    return n;
}

/* One configuration's service (its own store, no reply cache) and what it measured. */
struct config {
    const char *name;
    char dir[64];
    struct reply_profiles *profiles;
    struct store *store;
    struct reply_service *svc;
    struct figures fg;
    double *lat;
    int n_lat;
};

static bool config_open(struct reply_generator *gen, const char *name, int n, struct config *c)
{
    int cands = atoi(name);
    bool notes = strstr(name, ":on") != NULL;
    char json[200], db[128];
    struct reply_service_params p = reply_service_default_params();
    struct ar_err err = {AR_OK, 0, {0}};
    memset(c, 0, sizeof(*c));
    c->name = name;
    c->lat = calloc((size_t)n, sizeof(double));
    snprintf(json, sizeof(json), "{\"default\": {\"candidates\": %d, \"aspect_notes\": %s}}",
             cands, notes ? "true" : "false");
    if (reply_profiles_parse(json, strlen(json), &c->profiles, &err) != AR_OK) {
        fprintf(stderr, "quality: config %s: %s\n", name, err.msg);
        return false;
    }
    snprintf(c->dir, sizeof(c->dir), "/tmp/ar_quality_XXXXXX");
    if (!mkdtemp(c->dir))
        return false;
    snprintf(db, sizeof(db), "%s/replies.db", c->dir);
    if (store_open(db, &c->store, &err) != AR_OK) {
        fprintf(stderr, "quality: %s: %s\n", db, err.msg);
        return false;
    }
    p.profiles = c->profiles;
    p.store = c->store;
    p.gen = gen; /* no reply cache: every review is a miss */
    return reply_service_create(&p, &c->svc) == AR_OK;
}

static void config_close(struct config *c)
{
    char cmd[100];
    reply_service_destroy(c->svc);
    store_close(c->store);
    reply_profiles_destroy(c->profiles);
    free(c->lat);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", c->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "quality: could not remove %s\n", c->dir);
}

/* Answers review rv under configuration c and judges the reply. */
static void config_answer(struct config *c, const struct review *rv, FILE *samples)
{
    struct figures *fg = &c->fg;
    struct reply_review r;
    struct reply_result res;
    memset(&r, 0, sizeof(r));
    r.shop_id = "bench";
    r.review_id = rv->id;
    r.text = rv->text;
    r.text_len = strlen(rv->text);
    r.rating = rv->rating;
    r.lang = rv->lang;
    reply_service_answer(c->svc, &r, ENGINE_PRIO_INTERACTIVE, &res);
    fg->n++;
    if (res.err != REPLY_OK) {
        fg->errors++;
        reply_result_fini(&res);
        return;
    }
    {
        const char *t = res.reply ? res.reply : "";
        unsigned raised = judge_match(rv->text, true), named = judge_match(t, false);
        unsigned pr = reply_aspects_of_review(rv->text, strlen(rv->text));
        unsigned pn = reply_aspects_of_reply(t, strlen(t));
        bool rep = judge_repeated_clause(t);
        const char *s = t;
        while (*s == ' ' || *s == '\n')
            s++;
        fg->lang_ok += judge_lang(t, rv->lang);
        if (rv->rating <= 2) {
            fg->neg++;
            fg->neg_flagged += res.needs_human;
        }
        if (raised) {
            fg->bearing++;
            fg->all_named += (raised & named) == raised;
            fg->any_named += (raised & named) != 0;
            fg->pairs += popc(raised);
            fg->pairs_named += popc(raised & named);
        }
        if (pr) {
            fg->picker_bearing++;
            fg->picker_all_named += (pr & pn) == pr;
        }
        fg->repeated += rep;
        fg->repeated_lib += reply_find_repeat(t, strlen(t)) != REPLY_REPEAT_NONE;
        fg->held += res.needs_human && rv->rating > 2;
        fg->empty += *s == '\0';
        fg->fallback += res.source == REPLY_SOURCE_FALLBACK;
        if (res.source == REPLY_SOURCE_MODEL || res.source == REPLY_SOURCE_FALLBACK)
            c->lat[c->n_lat++] = res.latency_ms;
        if (samples) {
            cJSON *o = cJSON_CreateObject();
            char *line;
            cJSON_AddStringToObject(o, "config", c->name);
            cJSON_AddStringToObject(o, "id", rv->id);
            cJSON_AddNumberToObject(o, "rating", rv->rating);
            cJSON_AddStringToObject(o, "text", rv->text);
            cJSON_AddStringToObject(o, "reply", t);
            cJSON_AddBoolToObject(o, "needs_human", res.needs_human);
            cJSON_AddNumberToObject(o, "raised", raised);
            cJSON_AddNumberToObject(o, "named", named);
            cJSON_AddBoolToObject(o, "repeated", rep);
            cJSON_AddNumberToObject(o, "latency_ms", res.latency_ms);
            line = cJSON_PrintUnformatted(o);
            fprintf(samples, "%s\n", line);
            cJSON_free(line);
            cJSON_Delete(o);
        }
    }
    reply_result_fini(&res);
}

static void config_latency(struct config *c)
{
    qsort(c->lat, (size_t)c->n_lat, sizeof(double), cmp_double);
    c->fg.p50_ms = c->n_lat ? c->lat[c->n_lat / 2] : 0;
    c->fg.p90_ms = c->n_lat ? c->lat[(c->n_lat * 9) / 10] : 0;
}

static double share(int a, int b)
{
    return b ? (double)a / b : 0.0;
}

int main(int argc, char **argv)
{
    const char *model_path = "../shared/models/autoreply-demo-q8_0.gguf";
    const char *data = "../shared/data/reviews-eval.jsonl", *samples_path = NULL;
    const char *configs = "1:off,3:off,3:on";
    int limit = 0, every = 1, threads = 2, n;
    struct review *rv = NULL;
    struct ar_err err = {AR_OK, 0, {0}};
    struct model *model = NULL;
    struct tokenizer *tok = NULL;
    struct engine *engine = NULL;
    struct engine_params ep = engine_default_params();
    struct reply_generator *gen = NULL;
    FILE *samples = NULL;
    char list[256], *save = NULL;
    double base_p50 = 0;
    struct config cfg[MAX_CONFIGS];
    int n_cfg = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "quality: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-m"))
            model_path = v;
        else if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--limit"))
            limit = atoi(v);
        else if (!strcmp(a, "--every"))
            every = AR_MAX(1, atoi(v));
        else if (!strcmp(a, "--configs"))
            configs = v;
        else if (!strcmp(a, "-t"))
            threads = AR_MAX(1, atoi(v));
        else if (!strcmp(a, "--samples"))
            samples_path = v;
        else {
            fprintf(stderr, "quality: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    n = load(data, limit, every, &rv);
    if (n <= 0)
        return 1;
    if (model_load(model_path, &model, &err) != AR_OK ||
        tokenizer_load(model_gguf(model), &tok, &err) != AR_OK) {
        fprintf(stderr, "quality: %s: %s\n", model_path, err.msg);
        return 1;
    }
    ep.n_threads = threads;
    if (engine_create(model, tok, &ep, &engine, &err) != AR_OK ||
        reply_engine_generator(engine, tok, "autoreply-demo", &gen) != AR_OK) {
        fprintf(stderr, "quality: engine: %s\n", err.msg);
        return 1;
    }
    if (samples_path && !(samples = fopen(samples_path, "w"))) {
        fprintf(stderr, "quality: cannot write %s\n", samples_path);
        return 1;
    }
    printf("reply quality: %d reviews of %s (every %d, limit %d), model %s, %d threads\n", n,
           data, every, limit, model_path, threads);
    printf("%-8s %6s %6s %8s %8s %8s %8s %8s %7s %7s %5s %5s %8s %8s %6s\n", "config", "lang",
           "neg", "asp_all", "asp_any", "asp_pair", "picker", "rep_cl", "rep_ng", "empty", "fb",
           "err", "p50_ms", "p90_ms", "x_p50");
    /* the configurations answer each review in turn, so that they share the machine's load
     * (latency ratios are paired, not taken minutes apart) */
    snprintf(list, sizeof(list), "%s", configs);
    for (char *c = strtok_r(list, ",", &save); c && n_cfg < MAX_CONFIGS; c = strtok_r(NULL, ",", &save))
        if (!config_open(gen, c, n, &cfg[n_cfg++]))
            return 1;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < n_cfg; k++)
            config_answer(&cfg[(i + k) % n_cfg], &rv[i], samples); /* rotating first place */
        if ((i + 1) % 200 == 0)
            fprintf(stderr, "quality: %d/%d\n", i + 1, n);
    }
    for (int k = 0; k < n_cfg; k++) {
        struct figures *fg = &cfg[k].fg;
        config_latency(&cfg[k]);
        if (k == 0)
            base_p50 = fg->p50_ms;
        printf("%-8s %6.4f %6.4f %8.4f %8.4f %8.4f %8.4f %8d %7d %7d %5d %5d %8.1f %8.1f %6.2f\n",
               cfg[k].name, share(fg->lang_ok, fg->n - fg->errors), share(fg->neg_flagged, fg->neg),
               share(fg->all_named, fg->bearing), share(fg->any_named, fg->bearing),
               share(fg->pairs_named, fg->pairs),
               share(fg->picker_all_named, fg->picker_bearing), fg->repeated, fg->repeated_lib,
               fg->empty, fg->fallback, fg->errors, fg->p50_ms, fg->p90_ms,
               base_p50 > 0 ? fg->p50_ms / base_p50 : 0.0);
        printf("         (%d answered, %d rated <= 2, %d rated >= 3 held for a person, %d raise an "
               "aspect by the judge, %d by the picker)\n",
               fg->n - fg->errors, fg->neg, fg->held, fg->bearing, fg->picker_bearing);
    }
    for (int k = 0; k < n_cfg; k++)
        config_close(&cfg[k]);
    if (samples)
        fclose(samples);
    reply_generator_destroy(gen);
    engine_destroy(engine);
    tokenizer_destroy(tok);
    model_destroy(model);
    for (int i = 0; i < n; i++) {
        free(rv[i].id);
        free(rv[i].text);
        free(rv[i].lang);
    }
    free(rv);
    return 0;
}
