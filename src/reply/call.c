/* call.c - one request's control (reply.h): the caller's token budget, the tokens charged to
 * it, and cancellation, which stops every generation registered in flight through its hook. */
#include <pthread.h>

#include "reply_internal.h"

struct reply_call {
    pthread_mutex_t mu;
    reply_charge_fn charge;
    void *user;
    bool cancelled;              /* under mu */
    int64_t tokens;              /* under mu */
    double retry_after_s;        /* under mu */
    struct reply_call_hook head; /* circular list of hooks in flight, under mu */
};

enum ar_status reply_call_create(reply_charge_fn charge, void *user, struct reply_call **out)
{
    struct reply_call *c = ar_calloc(1, sizeof(*c));
    if (!c)
        return AR_ENOMEM;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        ar_free(c);
        return AR_ENOMEM;
    }
    c->charge = charge;
    c->user = user;
    c->head.prev = c->head.next = &c->head;
    *out = c;
    return AR_OK;
}

void reply_call_destroy(struct reply_call *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    ar_free(c);
}

void reply_call_cancel(struct reply_call *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (!c->cancelled) {
        c->cancelled = true;
        /* under the lock: a hook cannot be unwatched (and its owner return) while it runs */
        for (struct reply_call_hook *h = c->head.next; h != &c->head; h = h->next)
            if (h->fn)
                h->fn(h->arg);
    }
    pthread_mutex_unlock(&c->mu);
}

bool reply_call_cancelled(struct reply_call *c)
{
    bool v;
    if (!c)
        return false;
    pthread_mutex_lock(&c->mu);
    v = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    return v;
}

int64_t reply_call_tokens(struct reply_call *c)
{
    int64_t v;
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    v = c->tokens;
    pthread_mutex_unlock(&c->mu);
    return v;
}

double reply_call_retry_after(struct reply_call *c)
{
    double v;
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    v = c->retry_after_s;
    pthread_mutex_unlock(&c->mu);
    return v;
}

bool reply_call_charge(struct reply_call *c, int64_t n_tokens, bool admission,
                       double *retry_after_s)
{
    double retry = 0;
    bool ok = true;
    if (retry_after_s)
        *retry_after_s = 0;
    if (!c || n_tokens <= 0)
        return true;
    /* the budget has its own lock; ours is not held across the callback */
    if (c->charge)
        ok = c->charge(c->user, n_tokens, admission, &retry);
    if (!admission)
        ok = true;
    pthread_mutex_lock(&c->mu);
    if (ok)
        c->tokens += n_tokens;
    else if (retry > c->retry_after_s)
        c->retry_after_s = retry;
    pthread_mutex_unlock(&c->mu);
    if (!ok && retry_after_s)
        *retry_after_s = retry;
    return ok;
}

bool reply_call_watch(struct reply_call *c, struct reply_call_hook *h)
{
    bool ok;
    h->prev = h->next = NULL;
    if (!c)
        return true;
    pthread_mutex_lock(&c->mu);
    ok = !c->cancelled;
    if (ok) {
        h->next = c->head.next;
        h->prev = &c->head;
        c->head.next->prev = h;
        c->head.next = h;
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void reply_call_unwatch(struct reply_call *c, struct reply_call_hook *h)
{
    if (!c || !h->next)
        return;
    pthread_mutex_lock(&c->mu);
    h->prev->next = h->next;
    h->next->prev = h->prev;
    h->prev = h->next = NULL;
    pthread_mutex_unlock(&c->mu);
}
