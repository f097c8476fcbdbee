/* frontend.c - what a front end (the HTTP server's review endpoints, the CLI) needs from the
 * service beside answering reviews: the product's errors as descriptions and stable codes, the
 * service's worker pool for work that must not block the front end's own thread, and a job's
 * state. No HTTP here: statuses are the server's business (server_status_of_reply_error). */
#include "reply_internal.h"

static const struct {
    const char *str, *code;
} errors[REPLY_ERROR_COUNT] = {
    [REPLY_OK] = {"ok", "ok"},
    [REPLY_EINVAL] = {"bad input", "invalid_review"},
    [REPLY_EDUPLICATE] = {"the review id appears earlier in the same batch", "duplicate_review_id"},
    [REPLY_ECONFLICT] = {"the review id was answered for another text or rating",
                         "review_id_conflict"},
    [REPLY_ELIMITED] = {"the caller's token budget is spent", "rate_limit_exceeded"},
    [REPLY_ECANCELLED] = {"the caller went away", "cancelled"},
    [REPLY_EBUSY] = {"the model is busy", "overloaded"},
    [REPLY_EUNAVAIL] = {"a backend cannot be reached now", "backend_unavailable"},
    [REPLY_ENOTFOUND] = {"no such job", "not_found"},
    [REPLY_EINTERNAL] = {"internal error", "internal_error"},
};

const char *reply_error_str(enum reply_error e)
{
    return (unsigned)e < REPLY_ERROR_COUNT ? errors[e].str : "unknown error";
}

const char *reply_error_code(enum reply_error e)
{
    return (unsigned)e < REPLY_ERROR_COUNT ? errors[e].code : "internal_error";
}

enum reply_error reply_error_of_backend(enum ar_status st)
{
    switch (st) {
    case AR_OK:
        return REPLY_OK;
    case AR_EBUSY:
        return REPLY_EBUSY;
    case AR_EUNAVAIL:
        return REPLY_EUNAVAIL;
    case AR_ECANCELED:
        return REPLY_ECANCELLED;
    default:
        return REPLY_EINTERNAL;
    }
}

enum ar_status reply_service_submit(struct reply_service *svc, void (*fn)(void *arg), void *arg)
{
    return reply_submit(svc, fn, arg, true);
}

struct store *reply_service_store(struct reply_service *svc)
{
    return svc->p.store;
}

enum ar_status reply_job_get(struct reply_service *svc, const char *job_id,
                             struct store_job_info *info, bool *found, struct ar_err *err)
{
    return store_job_get(svc->p.store, job_id, info, found, err);
}
