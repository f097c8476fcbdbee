/* api.c - the public API's models and tokens (include/autoreply.h): an ar_model is the
 * model module's weights plus the tokenizer read from the same file; the token calls are
 * the tokenizer's, with the caller's buffers and NULL checks a library boundary needs. */
#include <stdio.h>
#include <string.h>

#include "api_internal.h"

enum ar_status api_params(void *dst, const void *src, size_t size, const char *what,
                          struct ar_err *err)
{
    size_t n;
    if (!src)
        return AR_OK; /* dst keeps the defaults */
    memcpy(&n, src, sizeof(n)); /* struct_size is the first member of every params struct */
    if (n < sizeof(size_t))
        return ar_err_set(err, AR_EINVAL, 0,
                          "%s params have struct_size %zu: take them from %s_default()", what, n,
                          what);
    /* the caller's struct_size bytes exist; bytes of ours past them keep their defaults */
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t),
           (n < size ? n : size) - sizeof(size_t));
    return AR_OK;
}

void api_err_begin(struct ar_err *err)
{
    if (err) {
        err->code = AR_OK;
        err->offset = 0;
        err->msg[0] = '\0';
    }
}

enum ar_status api_err_end(struct ar_err *err, enum ar_status st)
{
    if (err && st != AR_OK) {
        err->code = st;
        if (!err->msg[0])
            snprintf(err->msg, sizeof(err->msg), "%s", ar_status_str(st));
    }
    return st;
}

const char *ar_version(void)
{
    return AR_VERSION;
}

void ar_string_free(char *s)
{
    ar_free(s);
}

void ar_tokens_free(int32_t *ids)
{
    ar_free(ids);
}

/* ---- models ---------------------------------------------------------------------------- */

struct ar_model_params ar_model_params_default(void)
{
    struct ar_model_params p;
    memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.n_threads = 2;
    return p;
}

static char *name_of(const char *path)
{
    const char *b = strrchr(path, '/');
    size_t n;
    b = b ? b + 1 : path;
    n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf"))
        n -= 5;
    return ar_strndup(b, n);
}

enum ar_status ar_model_load(const char *path, const struct ar_model_params *params,
                             struct ar_model **out, struct ar_err *err)
{
    struct ar_model_params p = ar_model_params_default();
    struct ar_model *m;
    enum ar_status st;
    if (!out)
        return ar_err_set(err, AR_EINVAL, 0, "ar_model_load: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return ar_err_set(err, AR_EINVAL, 0, "ar_model_load: no path");
    if ((st = api_params(&p, params, sizeof(p), "ar_model_params", err)) != AR_OK)
        return st;
    if (p.n_threads < 1 || p.n_threads > 1024)
        return ar_err_set(err, AR_EINVAL, 0, "n_threads %d is not in 1..1024", p.n_threads);
    m = ar_calloc(1, sizeof(*m));
    if (!m)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    m->n_threads = p.n_threads;
    if (!(m->name = name_of(path))) {
        st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        goto fail;
    }
    api_err_begin(err);
    if ((st = model_load(path, &m->model, err)) != AR_OK)
        goto fail;
    if ((st = tokenizer_load(model_gguf(m->model), &m->tok, err)) != AR_OK)
        goto fail;
    *out = m;
    return AR_OK;
fail:
    ar_model_free(m);
    return api_err_end(err, st);
}

void ar_model_free(struct ar_model *m)
{
    if (!m)
        return;
    tokenizer_destroy(m->tok);
    model_destroy(m->model);
    ar_free(m->name);
    ar_free(m);
}

const char *ar_model_arch(const struct ar_model *m)
{
    return m ? model_arch_name(model_hparams(m->model)->arch) : "";
}

const char *ar_model_name(const struct ar_model *m)
{
    return m ? m->name : "";
}

int32_t ar_model_n_ctx(const struct ar_model *m)
{
    return m ? model_hparams(m->model)->n_ctx_train : 0;
}

int32_t ar_model_n_vocab(const struct ar_model *m)
{
    return m ? tokenizer_n_vocab(m->tok) : 0;
}

int32_t ar_model_token_bos(const struct ar_model *m)
{
    return m ? tokenizer_bos(m->tok) : -1;
}

int32_t ar_model_token_eos(const struct ar_model *m)
{
    return m ? tokenizer_eos(m->tok) : -1;
}

bool ar_model_token_is_eog(const struct ar_model *m, int32_t token)
{
    return m && token >= 0 && token < tokenizer_n_vocab(m->tok) && tokenizer_is_eog(m->tok, token);
}

/* ---- tokens ---------------------------------------------------------------------------- */

enum ar_status ar_tokenize(const struct ar_model *m, const char *text, size_t len,
                           bool add_special, bool parse_special, int32_t *ids, int64_t cap,
                           int64_t *n, struct ar_err *err)
{
    enum ar_status st;
    if (!m || !n || (!text && len) || (!ids && cap) || cap < 0)
        return ar_err_set(err, AR_EINVAL, 0, "ar_tokenize: NULL model, text, ids or n");
    st = tokenizer_encode_into(m->tok, text ? text : "", len, add_special, parse_special, ids,
                               cap, n);
    if (st == AR_ERANGE)
        return ar_err_set(err, st, 0, "%lld ids do not fit %lld", (long long)*n,
                          (long long)cap);
    if (st != AR_OK)
        return ar_err_set(err, st, 0, "cannot tokenize: %s", ar_status_str(st));
    return AR_OK;
}

enum ar_status ar_detokenize(const struct ar_model *m, const int32_t *ids, int64_t n,
                             bool remove_special, char *buf, size_t cap, size_t *len,
                             struct ar_err *err)
{
    enum ar_status st;
    char *s = NULL;
    size_t l = 0;
    if (!m || !len || (!ids && n) || n < 0 || (!buf && cap))
        return ar_err_set(err, AR_EINVAL, 0, "ar_detokenize: NULL model, ids, buf or len");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(m->tok))
            return ar_err_set(err, AR_EINVAL, 0, "token %d at %lld is not in 0..%d", ids[i],
                              (long long)i, tokenizer_n_vocab(m->tok) - 1);
    if ((st = tokenizer_decode(m->tok, ids, n, remove_special, &s, &l)) != AR_OK)
        return ar_err_set(err, st, 0, "cannot detokenize: %s", ar_status_str(st));
    *len = l;
    if (cap <= l) {
        ar_free(s);
        return ar_err_set(err, AR_ERANGE, 0, "%zu bytes and the NUL do not fit %zu", l, cap);
    }
    memcpy(buf, s, l);
    buf[l] = '\0';
    ar_free(s);
    return AR_OK;
}

const char *ar_token_piece(const struct ar_model *m, int32_t token, size_t *len)
{
    size_t l = 0;
    const char *p = m ? tokenizer_token_piece(m->tok, token, &l) : NULL;
    if (len)
        *len = p ? l : 0;
    return p;
}

struct ar_detokenizer {
    const struct tokenizer *tok; /* borrowed from the model */
    struct tokenizer_stream st;
};

enum ar_status ar_detokenizer_create(const struct ar_model *m, bool remove_special,
                                     struct ar_detokenizer **out, struct ar_err *err)
{
    struct ar_detokenizer *d;
    if (!m || !out)
        return ar_err_set(err, AR_EINVAL, 0, "ar_detokenizer_create: NULL model or out");
    d = ar_calloc(1, sizeof(*d));
    if (!d)
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    d->tok = m->tok;
    tokenizer_stream_init(&d->st, remove_special);
    *out = d;
    return AR_OK;
}

enum ar_status ar_detokenizer_push(struct ar_detokenizer *d, int32_t token, const char **text,
                                   size_t *len)
{
    if (!d || !text || !len)
        return AR_EINVAL;
    return tokenizer_stream_push(d->tok, &d->st, token, text, len);
}

enum ar_status ar_detokenizer_flush(struct ar_detokenizer *d, const char **text, size_t *len)
{
    if (!d || !text || !len)
        return AR_EINVAL;
    return tokenizer_stream_flush(&d->st, text, len);
}

void ar_detokenizer_free(struct ar_detokenizer *d)
{
    if (!d)
        return;
    tokenizer_stream_fini(&d->st);
    ar_free(d);
}
