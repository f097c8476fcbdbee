/* api_internal.h - what the public API's files (api.c, generate.c, service.c) share: the
 * handles behind the opaque structs of include/autoreply.h and the params copy that lets a
 * caller built against an older or newer header pass its structs. */
#ifndef AR_API_INTERNAL_H
#define AR_API_INTERNAL_H

#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

struct ar_model {
    struct model *model;    /* owned */
    struct tokenizer *tok;  /* owned */
    char *name;             /* owned: file name without .gguf */
    int n_threads;
};

struct ar_engine {
    struct ar_model *m; /* borrowed */
    struct engine *e;   /* owned */
};

/* Copies the caller's params over defaults: the first min(struct_size, size) bytes, the
 * fields both sides know. AR_EINVAL (message in err) when struct_size is too small to hold
 * even the size field, i.e. the struct was not made by its *_params_default(). */
enum ar_status api_params(void *dst, const void *src, size_t size, const char *what,
                          struct ar_err *err);

/* For calls into modules that may fail without a message: api_err_begin clears *err (may be
 * NULL), api_err_end gives a failure that left no message the status's own text. Returns st. */
void api_err_begin(struct ar_err *err);
enum ar_status api_err_end(struct ar_err *err, enum ar_status st);

#endif
