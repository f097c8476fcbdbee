/* limits.c - who may call the server and how often: the API key list (--api-key-file) and
 * per-client token buckets for requests per second and tokens per minute. Buckets refill
 * continuously; the table is bounded (idle full buckets are swept when it fills). With
 * rate_redis_url the buckets live in Redis (limits_redis.c) and these are the fallback. */
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/hash.h"
#include "server_internal.h"

/* ---- API keys ------------------------------------------------------------------------------ */

struct server_keys {
    char **keys; /* owned */
    size_t *lens;
    int n;
};

void server_keys_destroy(struct server_keys *k)
{
    if (!k)
        return;
    for (int i = 0; i < k->n; i++)
        ar_free(k->keys[i]);
    ar_free(k->keys);
    ar_free(k->lens);
    ar_free(k);
}

enum ar_status server_keys_load(const char *path, struct server_keys **out, struct ar_err *err)
{
    FILE *f = fopen(path, "r");
    struct server_keys *k;
    char line[1024];
    int cap = 0;
    enum ar_status st = AR_OK;
    *out = NULL;
    if (!f)
        return ar_err_set(err, AR_EIO, 0, "cannot open API key file %s", path);
    if (!(k = ar_calloc(1, sizeof(*k)))) {
        fclose(f);
        return AR_ENOMEM;
    }
    while (fgets(line, sizeof(line), f)) {
        char *s = line, *e;
        if (!strchr(line, '\n') && !feof(f)) {
            st = ar_err_set(err, AR_EFORMAT, 0, "%s: a line is longer than 1023 bytes", path);
            break;
        }
        while (isspace((unsigned char)*s))
            s++;
        e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
            e--;
        *e = '\0';
        if (!*s || *s == '#')
            continue;
        if (k->n == cap) {
            int nc = cap ? cap * 2 : 8;
            char **nk = ar_realloc(k->keys, (size_t)nc * sizeof(*nk));
            size_t *nl;
            if (nk)
                k->keys = nk;
            nl = nk ? ar_realloc(k->lens, (size_t)nc * sizeof(*nl)) : NULL;
            if (!nl) {
                st = AR_ENOMEM;
                break;
            }
            k->lens = nl;
            cap = nc;
        }
        if (!(k->keys[k->n] = ar_strdup(s))) {
            st = AR_ENOMEM;
            break;
        }
        k->lens[k->n++] = (size_t)(e - s);
    }
    fclose(f);
    if (st == AR_OK && k->n == 0)
        st = ar_err_set(err, AR_EFORMAT, 0, "%s holds no API key", path);
    if (st != AR_OK) {
        server_keys_destroy(k);
        return st;
    }
    *out = k;
    return AR_OK;
}

/* Equality in time that depends on the lengths only, not on where the bytes differ. */
static bool same_bytes(const char *a, size_t na, const char *b, size_t nb)
{
    unsigned char d = na != nb;
    size_t n = AR_MIN(na, nb);
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

int server_keys_find(const struct server_keys *k, const char *key, size_t len)
{
    int found = -1;
    for (int i = 0; i < k->n; i++)
        if (same_bytes(k->keys[i], k->lens[i], key, len) && found < 0)
            found = i;
    return found;
}

/* ---- token buckets ------------------------------------------------------------------------- */

#define LIMITER_SLOTS 4096        /* hash chains */
#define LIMITER_MAX_CLIENTS 65536 /* beyond: sweep idle entries */

struct bucket {
    double level; /* tokens in the bucket; may be negative (debt) for the token bucket */
    double cap;
    double rate; /* per second */
};

struct client {
    struct client *next;
    char *name; /* owned */
    struct bucket req, tok;
    double t; /* last refill */
};

struct server_limiter {
    pthread_mutex_t mu;
    double rps, burst, tpm;
    struct client *slots[LIMITER_SLOTS];
    int n_clients;
    struct server_rlimit *redis; /* owned; NULL: the buckets live in this process only */
};

enum ar_status server_limiter_create(double rps, double burst, double tpm,
                                     struct server_limiter **out)
{
    struct server_limiter *l = ar_calloc(1, sizeof(*l));
    if (!l)
        return AR_ENOMEM;
    pthread_mutex_init(&l->mu, NULL);
    l->rps = rps;
    l->burst = burst > 0 ? burst : AR_MAX(1.0, rps);
    l->tpm = tpm;
    *out = l;
    return AR_OK;
}

void server_limiter_destroy(struct server_limiter *l)
{
    if (!l)
        return;
    for (int i = 0; i < LIMITER_SLOTS; i++) {
        struct client *c = l->slots[i];
        while (c) {
            struct client *n = c->next;
            ar_free(c->name);
            ar_free(c);
            c = n;
        }
    }
    server_rlimit_destroy(l->redis);
    pthread_mutex_destroy(&l->mu);
    ar_free(l);
}

enum ar_status server_limiter_use_redis(struct server_limiter *l, const char *url,
                                        struct metrics_registry *reg, struct ar_err *err)
{
    return server_rlimit_create(url, reg, &l->redis, err);
}

bool server_limiter_backend_healthy(const struct server_limiter *l)
{
    return !l || !l->redis || server_rlimit_healthy(l->redis);
}

static void refill(struct client *c, double now)
{
    double dt = now - c->t;
    if (dt > 0) {
        c->req.level = AR_MIN(c->req.cap, c->req.level + dt * c->req.rate);
        c->tok.level = AR_MIN(c->tok.cap, c->tok.level + dt * c->tok.rate);
        c->t = now;
    }
}

/* Drops clients whose buckets have refilled completely (they are as good as new). */
static void sweep(struct server_limiter *l, double now)
{
    for (int i = 0; i < LIMITER_SLOTS; i++) {
        struct client **pp = &l->slots[i];
        while (*pp) {
            struct client *c = *pp;
            refill(c, now);
            if (c->req.level >= c->req.cap && c->tok.level >= c->tok.cap) {
                *pp = c->next;
                ar_free(c->name);
                ar_free(c);
                l->n_clients--;
            } else {
                pp = &c->next;
            }
        }
    }
}

/* The client's entry, created full; NULL when out of memory or the table is full. */
static struct client *find(struct server_limiter *l, const char *name, double now)
{
    uint32_t h = ar_fnv1a32(AR_FNV32_BASIS, name, strlen(name));
    struct client *c;
    for (c = l->slots[h % LIMITER_SLOTS]; c; c = c->next)
        if (!strcmp(c->name, name)) {
            refill(c, now);
            return c;
        }
    if (l->n_clients >= LIMITER_MAX_CLIENTS)
        sweep(l, now);
    if (l->n_clients >= LIMITER_MAX_CLIENTS || !(c = ar_calloc(1, sizeof(*c))))
        return NULL;
    if (!(c->name = ar_strdup(name))) {
        ar_free(c);
        return NULL;
    }
    c->req = (struct bucket){l->burst, l->burst, l->rps};
    c->tok = (struct bucket){l->tpm, l->tpm, l->tpm / 60.0};
    c->t = now;
    c->next = l->slots[h % LIMITER_SLOTS];
    l->slots[h % LIMITER_SLOTS] = c;
    l->n_clients++;
    return c;
}

bool server_limiter_request(struct server_limiter *l, const char *client, double now,
                            double *retry_s)
{
    struct client *c;
    bool ok = true;
    if (!l || l->rps <= 0)
        return true;
    if (l->redis &&
        server_rlimit_request(l->redis, client, l->rps, l->burst, l->tpm, &ok, retry_s) == AR_OK)
        return ok;
    pthread_mutex_lock(&l->mu);
    c = find(l, client, now);
    if (!c) { /* table full of busy clients: refuse rather than grow */
        *retry_s = 1;
        ok = false;
    } else if (c->req.level >= 1) {
        c->req.level -= 1;
    } else {
        *retry_s = (1 - c->req.level) / c->req.rate;
        ok = false;
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}

bool server_limiter_tokens(struct server_limiter *l, const char *client, int64_t n, bool admission,
                           double now, double *retry_s)
{
    struct client *c;
    bool ok = true;
    if (!l || l->tpm <= 0 || n <= 0)
        return true;
    if (l->redis && server_rlimit_tokens(l->redis, client, l->rps, l->burst, l->tpm, n, admission,
                                         &ok, retry_s) == AR_OK)
        return ok;
    pthread_mutex_lock(&l->mu);
    c = find(l, client, now);
    if (!c) {
        if (admission) {
            *retry_s = 1;
            ok = false;
        }
    } else {
        double need = AR_MIN((double)n, c->tok.cap);
        if (admission && c->tok.level < need) {
            *retry_s = (need - c->tok.level) / c->tok.rate;
            ok = false;
        } else {
            c->tok.level -= (double)n;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}
