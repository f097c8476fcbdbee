/* request.c - validation of OpenAI chat and text completion requests into the engine's terms.
 * Works on the parsed body tree only (no engine, no tokenizer), so the fuzzer can drive it.
 * Wrong types and out-of-range values are 400 naming the field; features we do not have
 * (tools, logprobs, n > 1, response formats) are 400 "unsupported"; other fields are ignored. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "server_internal.h"

void server_oai_error_set(struct server_oai_error *e, int status, const char *type,
                          const char *code, const char *param, const char *fmt, ...)
{
    va_list ap;
    if (!e)
        return;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
}

static enum ar_status bad(struct server_oai_error *e, const char *code, const char *param,
                          const char *what)
{
    server_oai_error_set(e, 400, "invalid_request_error", code, param, "'%s' %s", param, what);
    return AR_EINVAL;
}

static enum ar_status unsupported(struct server_oai_error *e, const char *param, const char *what)
{
    server_oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter", param,
                         "'%s' %s is not supported", param, what);
    return AR_EINVAL;
}

/* ---- typed field readers: absent (or null) leaves *out alone -------------------------------- */

static enum ar_status get_number(const cJSON *body, const char *name, double lo, double hi,
                                 double *out, bool *present, struct server_oai_error *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!j || cJSON_IsNull(j))
        return AR_OK;
    if (!cJSON_IsNumber(j))
        return bad(e, "invalid_type", name, "must be a number");
    if (!isfinite(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi) {
        server_oai_error_set(e, 400, "invalid_request_error", "invalid_value", name,
                             "'%s' must be between %g and %g", name, lo, hi);
        return AR_EINVAL;
    }
    *out = j->valuedouble;
    if (present)
        *present = true;
    return AR_OK;
}

static enum ar_status get_float(const cJSON *body, const char *name, double lo, double hi,
                                float *out, struct server_oai_error *e)
{
    double v = (double)*out;
    enum ar_status st = get_number(body, name, lo, hi, &v, NULL, e);
    *out = (float)v;
    return st;
}

/* Integers: a JSON number without a fraction. */
static enum ar_status get_int(const cJSON *body, const char *name, double lo, double hi,
                              double *out, bool *present, struct server_oai_error *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, name);
    if (j && cJSON_IsNumber(j) && j->valuedouble != floor(j->valuedouble))
        return bad(e, "invalid_type", name, "must be an integer");
    return get_number(body, name, lo, hi, out, present, e);
}

static enum ar_status get_bool(const cJSON *body, const char *name, bool *out,
                               struct server_oai_error *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!j || cJSON_IsNull(j))
        return AR_OK;
    if (!cJSON_IsBool(j))
        return bad(e, "invalid_type", name, "must be a boolean");
    *out = cJSON_IsTrue(j);
    return AR_OK;
}

/* ---- features we do not implement ------------------------------------------------------- */

static enum ar_status check_unsupported(const cJSON *body, struct server_oai_error *e)
{
    const cJSON *j;
    double n = 1;
    enum ar_status st;
    static const char *const never[] = {"tools",  "functions", "tool_choice", "function_call",
                                        "suffix", "audio",     "prediction"};
    for (size_t i = 0; i < AR_ARRAY_LEN(never); i++) {
        j = cJSON_GetObjectItemCaseSensitive(body, never[i]);
        if (!j || cJSON_IsNull(j))
            continue;
        if (cJSON_IsArray(j) && cJSON_GetArraySize(j) == 0)
            continue;
        if (cJSON_IsString(j) && !strcmp(j->valuestring, "none"))
            continue;
        return unsupported(e, never[i], "");
    }
    if ((st = get_int(body, "n", -1e9, 1e9, &n, NULL, e)) != AR_OK)
        return st;
    if (n != 1)
        return unsupported(e, "n", "other than 1");
    if ((st = get_int(body, "best_of", -1e9, 1e9, &(double){1}, NULL, e)) != AR_OK)
        return st;
    j = cJSON_GetObjectItemCaseSensitive(body, "best_of");
    if (j && cJSON_IsNumber(j) && j->valuedouble != 1)
        return unsupported(e, "best_of", "other than 1");
    j = cJSON_GetObjectItemCaseSensitive(body, "logprobs");
    if (j && (cJSON_IsTrue(j) || (cJSON_IsNumber(j) && j->valuedouble > 0)))
        return unsupported(e, "logprobs", "");
    j = cJSON_GetObjectItemCaseSensitive(body, "top_logprobs");
    if (j && cJSON_IsNumber(j) && j->valuedouble > 0)
        return unsupported(e, "top_logprobs", "");
    j = cJSON_GetObjectItemCaseSensitive(body, "echo");
    if (j && cJSON_IsTrue(j))
        return unsupported(e, "echo", "");
    j = cJSON_GetObjectItemCaseSensitive(body, "logit_bias");
    if (j && !cJSON_IsNull(j) && !(cJSON_IsObject(j) && !j->child))
        return unsupported(e, "logit_bias", "");
    j = cJSON_GetObjectItemCaseSensitive(body, "response_format");
    if (j && !cJSON_IsNull(j)) {
        const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "type") : NULL;
        if (!cJSON_IsObject(j) || !cJSON_IsString(t))
            return bad(e, "invalid_type", "response_format", "must be an object with a type");
        if (strcmp(t->valuestring, "text") != 0)
            return unsupported(e, "response_format", "other than text");
    }
    return AR_OK;
}

/* ---- messages and prompts --------------------------------------------------------------- */

static enum ar_status parse_content(const cJSON *c, size_t i, const char **text, char **owned,
                                    struct server_oai_error *e)
{
    char param[64];
    size_t total = 0, off = 0;
    snprintf(param, sizeof(param), "messages[%zu].content", i);
    if (cJSON_IsString(c)) {
        *text = c->valuestring;
        return AR_OK;
    }
    if (!cJSON_IsArray(c))
        return bad(e, c ? "invalid_type" : "missing_required_parameter", param,
                   "must be a string or an array of text parts");
    /* an array of {"type": "text", "text": "..."} parts, joined */
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t))
            return bad(e, "invalid_type", param, "parts must be objects with a type");
        if (strcmp(t->valuestring, "text") != 0)
            return unsupported(e, param, "part type other than text");
        if (!cJSON_IsString(x))
            return bad(e, "invalid_type", param, "text parts need a string 'text'");
        total += strlen(x->valuestring);
    }
    if (!(*owned = ar_malloc(total + 1)))
        return AR_ENOMEM;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *x = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(x);
        memcpy(*owned + off, x, n);
        off += n;
    }
    (*owned)[off] = '\0';
    *text = *owned;
    return AR_OK;
}

static enum ar_status parse_messages(const cJSON *body, struct server_oai_request *r,
                                     struct server_oai_error *e)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "messages");
    size_t n, i = 0;
    if (!m || cJSON_IsNull(m))
        return bad(e, "missing_required_parameter", "messages", "is required");
    if (!cJSON_IsArray(m))
        return bad(e, "invalid_type", "messages", "must be an array");
    n = (size_t)cJSON_GetArraySize(m);
    if (n == 0)
        return bad(e, "invalid_value", "messages", "must not be empty");
    if (n > SERVER_OAI_MAX_MESSAGES)
        return bad(e, "invalid_value", "messages", "has too many entries");
    r->msgs = ar_calloc(n, sizeof(*r->msgs));
    r->owned_text = ar_calloc(n, sizeof(*r->owned_text));
    if (!r->msgs || !r->owned_text)
        return AR_ENOMEM;
    r->n_msgs = n;
    for (const cJSON *x = m->child; x; x = x->next, i++) {
        char param[64];
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(x, "role");
        enum ar_status st;
        snprintf(param, sizeof(param), "messages[%zu].role", i);
        if (!cJSON_IsObject(x)) {
            snprintf(param, sizeof(param), "messages[%zu]", i);
            return bad(e, "invalid_type", param, "must be an object");
        }
        if (!cJSON_IsString(role))
            return bad(e, role ? "invalid_type" : "missing_required_parameter", param,
                       "must be a string");
        if (!strcmp(role->valuestring, "system") || !strcmp(role->valuestring, "developer"))
            r->msgs[i].role = "system";
        else if (!strcmp(role->valuestring, "user"))
            r->msgs[i].role = "user";
        else if (!strcmp(role->valuestring, "assistant"))
            r->msgs[i].role = "assistant";
        else
            return bad(e, "invalid_value", param, "must be system, user or assistant");
        st = parse_content(cJSON_GetObjectItemCaseSensitive(x, "content"), i, &r->msgs[i].content,
                           &r->owned_text[i], e);
        if (st != AR_OK)
            return st;
    }
    return AR_OK;
}

static enum ar_status parse_prompt(const cJSON *body, int32_t n_vocab, struct server_oai_request *r,
                                   struct server_oai_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    int n, i = 0;
    if (!p || cJSON_IsNull(p))
        return bad(e, "missing_required_parameter", "prompt", "is required");
    if (cJSON_IsString(p)) {
        r->prompt = p->valuestring;
        r->prompt_len = strlen(p->valuestring);
        return AR_OK;
    }
    if (!cJSON_IsArray(p))
        return bad(e, "invalid_type", "prompt", "must be a string or an array of token ids");
    n = cJSON_GetArraySize(p);
    if (n == 0)
        return bad(e, "invalid_value", "prompt", "must not be empty");
    if (cJSON_IsString(p->child)) { /* a batch of prompts: only one */
        if (n != 1)
            return unsupported(e, "prompt", "with more than one string");
        r->prompt = p->child->valuestring;
        r->prompt_len = strlen(p->child->valuestring);
        return AR_OK;
    }
    if (!(r->prompt_ids = ar_malloc((size_t)n * sizeof(int32_t))))
        return AR_ENOMEM;
    for (const cJSON *x = p->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble))
            return bad(e, "invalid_type", "prompt", "token ids must be integers");
        if (x->valuedouble < 0 || x->valuedouble >= (double)n_vocab) {
            server_oai_error_set(e, 400, "invalid_request_error", "invalid_value", "prompt",
                                 "token id %.0f is outside the vocabulary [0, %d)", x->valuedouble,
                                 (int)n_vocab);
            return AR_EINVAL;
        }
        r->prompt_ids[i] = (int32_t)x->valuedouble;
    }
    r->n_prompt_ids = n;
    return AR_OK;
}

static enum ar_status parse_stop(const cJSON *body, struct server_oai_request *r,
                                 struct server_oai_error *e)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(body, "stop");
    if (!s || cJSON_IsNull(s))
        return AR_OK;
    if (cJSON_IsString(s)) {
        if (strlen(s->valuestring) > SERVER_OAI_MAX_STOP_LEN)
            return bad(e, "invalid_value", "stop", "is too long");
        if (s->valuestring[0])
            r->stop[r->n_stop++] = s->valuestring;
        return AR_OK;
    }
    if (!cJSON_IsArray(s))
        return bad(e, "invalid_type", "stop", "must be a string or an array of strings");
    if (cJSON_GetArraySize(s) > SERVER_OAI_MAX_STOP) {
        server_oai_error_set(e, 400, "invalid_request_error", "invalid_value", "stop",
                             "'stop' has more than %d entries", SERVER_OAI_MAX_STOP);
        return AR_EINVAL;
    }
    for (const cJSON *x = s->child; x; x = x->next) {
        if (!cJSON_IsString(x))
            return bad(e, "invalid_type", "stop", "entries must be strings");
        if (strlen(x->valuestring) > SERVER_OAI_MAX_STOP_LEN)
            return bad(e, "invalid_value", "stop", "entry is too long");
        if (x->valuestring[0])
            r->stop[r->n_stop++] = x->valuestring;
    }
    return AR_OK;
}

static enum ar_status parse_priority(const cJSON *body, struct server_oai_request *r,
                                     struct server_oai_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "priority");
    r->priority = ENGINE_PRIO_INTERACTIVE;
    if (!p || cJSON_IsNull(p))
        return AR_OK;
    if (cJSON_IsString(p)) {
        if (!strcmp(p->valuestring, "interactive"))
            return AR_OK;
        if (!strcmp(p->valuestring, "bulk")) {
            r->priority = ENGINE_PRIO_BULK;
            return AR_OK;
        }
        return bad(e, "invalid_value", "priority", "must be \"interactive\" or \"bulk\"");
    }
    if (cJSON_IsNumber(p)) { /* 0: interactive, > 0: bulk (lower runs first) */
        if (p->valuedouble != floor(p->valuedouble) || p->valuedouble < 0)
            return bad(e, "invalid_value", "priority", "must be an integer >= 0");
        if (p->valuedouble > 0)
            r->priority = ENGINE_PRIO_BULK;
        return AR_OK;
    }
    return bad(e, "invalid_type", "priority", "must be a string or an integer");
}

/* ---- the whole request -------------------------------------------------------------------- */

enum ar_status server_oai_request_parse(enum server_oai_kind kind, const cJSON *body, int n_ctx,
                                        int32_t n_vocab, struct server_oai_request *r,
                                        struct server_oai_error *e)
{
    enum ar_status st;
    const cJSON *j;
    double v;
    bool have = false;
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->sampling = sampler_default_params();
    r->sampling.repeat_penalty = 1.0f;
    r->sampling.frequency_penalty = 0.0f;
    r->sampling.presence_penalty = 0.0f;
    if (!cJSON_IsObject(body)) {
        server_oai_error_set(e, 400, "invalid_request_error", "invalid_type", "",
                             "the request body must be an object");
        return AR_EINVAL;
    }
    if ((st = check_unsupported(body, e)) != AR_OK)
        return st;
    j = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (j && !cJSON_IsNull(j)) {
        if (!cJSON_IsString(j))
            return bad(e, "invalid_type", "model", "must be a string");
        r->model = j->valuestring;
    }
    st = kind == SERVER_OAI_CHAT ? parse_messages(body, r, e) : parse_prompt(body, n_vocab, r, e);
    if (st != AR_OK)
        return st;

    /* max_tokens: 1..n_ctx (the engine stops earlier when the context fills up) */
    v = 0;
    if ((st = get_int(body, "max_tokens", -1e18, 1e18, &v, &have, e)) != AR_OK)
        return st;
    if (!have && (st = get_int(body, "max_completion_tokens", -1e18, 1e18, &v, &have, e)) != AR_OK)
        return st;
    if (have && (v < 1 || v > n_ctx)) {
        const char *name =
            cJSON_GetObjectItemCaseSensitive(body, "max_tokens") &&
                    !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(body, "max_tokens"))
                ? "max_tokens"
                : "max_completion_tokens";
        server_oai_error_set(e, 400, "invalid_request_error", "invalid_value", name,
                             "'%s' must be between 1 and %d (the context size)", name, n_ctx);
        return AR_EINVAL;
    }
    r->max_tokens = have ? (int)v : 0;

    if ((st = get_float(body, "temperature", 0, 2, &r->sampling.temperature, e)) != AR_OK ||
        (st = get_float(body, "top_p", 0, 1, &r->sampling.top_p, e)) != AR_OK ||
        (st = get_float(body, "min_p", 0, 1, &r->sampling.min_p, e)) != AR_OK ||
        (st = get_float(body, "repeat_penalty", 0.01, 10, &r->sampling.repeat_penalty, e)) !=
            AR_OK ||
        (st = get_float(body, "frequency_penalty", -2, 2, &r->sampling.frequency_penalty, e)) !=
            AR_OK ||
        (st = get_float(body, "presence_penalty", -2, 2, &r->sampling.presence_penalty, e)) !=
            AR_OK)
        return st;
    v = r->sampling.top_k;
    if ((st = get_int(body, "top_k", 0, 1e9, &v, NULL, e)) != AR_OK)
        return st;
    r->sampling.top_k = (int32_t)AR_MIN(v, (double)n_vocab);
    v = r->sampling.repeat_last_n;
    if ((st = get_int(body, "repeat_last_n", 0, 1e6, &v, NULL, e)) != AR_OK)
        return st;
    r->sampling.repeat_last_n = (int32_t)v;
    v = 0;
    if ((st = get_int(body, "seed", -9.2e18, 1.8e19, &v, &r->seed_set, e)) != AR_OK)
        return st;
    if (r->seed_set)
        r->sampling.seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;

    if ((st = parse_stop(body, r, e)) != AR_OK || (st = parse_priority(body, r, e)) != AR_OK)
        return st;
    if ((st = get_bool(body, "ignore_eos", &r->ignore_eos, e)) != AR_OK ||
        (st = get_bool(body, "stream", &r->stream, e)) != AR_OK ||
        (st = get_bool(body, "truncate", &r->truncate, e)) != AR_OK)
        return st;
    j = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (j && !cJSON_IsNull(j)) {
        if (!cJSON_IsObject(j))
            return bad(e, "invalid_type", "stream_options", "must be an object");
        if ((st = get_bool(j, "include_usage", &r->include_usage, e)) != AR_OK)
            return st;
    }
    return AR_OK;
}

void server_oai_request_fini(struct server_oai_request *r)
{
    if (r->owned_text)
        for (size_t i = 0; i < r->n_msgs; i++)
            ar_free(r->owned_text[i]);
    ar_free(r->owned_text);
    ar_free(r->msgs);
    ar_free(r->prompt_ids);
    memset(r, 0, sizeof(*r));
}
