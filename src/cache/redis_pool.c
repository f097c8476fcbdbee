/* redis_pool.c - connections to one Redis server for the reply cache (redis.c) and the
 * server's rate limits (server/limits_redis.c): a few hiredis contexts, each used by one
 * thread at a time, and a circuit breaker so that a Redis that is down costs callers nothing
 * but a failed status until the exponential backoff allows the next try. */
#include "cache.h"

#include <ctype.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/deadline.h"

/* ---- URL ---------------------------------------------------------------------------------- */

/* Copies s[0..n) into dst (size bytes); false when it does not fit. */
static bool copy_part(char *dst, size_t size, const char *s, size_t n)
{
    if (n >= size)
        return false;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return true;
}

/* Decimal digits s[0..n) as a number in [lo, hi]; false otherwise. */
static bool parse_int(const char *s, size_t n, long lo, long hi, int *out)
{
    long v = 0;
    if (n == 0 || n > 9)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

enum ar_status cache_redis_url_parse(const char *url, struct cache_redis_url *out,
                                     struct ar_err *err)
{
    const char *p, *end, *auth_end, *at = NULL, *host, *host_end, *q;
    if (!out)
        return AR_EINVAL;
    memset(out, 0, sizeof(*out));
    out->port = 6379;
    if (!url || !*url)
        return ar_err_set(err, AR_EINVAL, 0, "no Redis URL given (redis://host:port/db)");
    for (p = url; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            return ar_err_set(err, AR_EINVAL, 0,
                              "Redis URL: spaces or control characters are not allowed");
    if (strncmp(url, "redis://", 8) != 0)
        return ar_err_set(err, AR_EINVAL, 0,
                          "Redis URL must start with redis:// (redis://host:port/db)");
    p = url + 8;
    end = p + strlen(p);
    auth_end = strchr(p, '/');
    if (!auth_end)
        auth_end = end;
    for (q = p; q < auth_end; q++) /* the last '@' before the path ends the user info */
        if (*q == '@')
            at = q;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon)
            return ar_err_set(err, AR_EINVAL, 0,
                              "Redis URL: the part before '@' must be [user]:password");
        if (!copy_part(out->user, sizeof(out->user), p, (size_t)(colon - p)) ||
            !copy_part(out->password, sizeof(out->password), colon + 1, (size_t)(at - colon - 1)))
            return ar_err_set(err, AR_EINVAL, 0, "Redis URL: the user or password is too long");
        if (!out->password[0])
            return ar_err_set(err, AR_EINVAL, 0, "Redis URL: the password after ':' is empty");
        p = at + 1;
    }
    if (*p == '[') { /* [IPv6] */
        host = p + 1;
        host_end = memchr(host, ']', (size_t)(auth_end - host));
        if (!host_end)
            return ar_err_set(err, AR_EINVAL, 0, "Redis URL: '[' without a closing ']'");
        p = host_end + 1;
    } else {
        host = p;
        for (host_end = host; host_end < auth_end && *host_end != ':'; host_end++)
            ;
        p = host_end;
    }
    if (host_end == host)
        return ar_err_set(err, AR_EINVAL, 0, "Redis URL: the host is empty (redis://host:port/db)");
    if (memchr(host, '@', (size_t)(host_end - host)) ||
        !copy_part(out->host, sizeof(out->host), host, (size_t)(host_end - host)))
        return ar_err_set(err, AR_EINVAL, 0, "Redis URL: the host is not valid");
    if (*p == ':') {
        p++;
        if (!parse_int(p, (size_t)(auth_end - p), 1, 65535, &out->port))
            return ar_err_set(err, AR_EINVAL, 0, "Redis URL: the port is not a number in 1..65535");
        p = auth_end;
    }
    if (p != auth_end)
        return ar_err_set(err, AR_EINVAL, 0, "Redis URL: unexpected text after the host");
    if (*p == '/') {
        p++;
        if (*p && !parse_int(p, (size_t)(end - p), 0, 1000000, &out->db))
            return ar_err_set(err, AR_EINVAL, 0,
                              "Redis URL: the database after '/' is not a number in 0..1000000");
    }
    return AR_OK;
}

/* ---- SIGPIPE ------------------------------------------------------------------------------ */

/* hiredis writes with write(2): on a socket the server closed that raises SIGPIPE, which
 * would end the process. The signal is blocked in the calling thread around each use of a
 * connection, and one raised meanwhile is taken off the pending set before unblocking. */
struct sigpipe_guard {
    sigset_t old;
    bool was_pending;
};

static void sigpipe_block(struct sigpipe_guard *g)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    g->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
}

static void sigpipe_restore(struct sigpipe_guard *g)
{
    sigset_t set, pending;
    if (!g->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- the pool ----------------------------------------------------------------------------- */

struct slot {
    redisContext *ctx; /* owned; NULL: not connected */
    uint64_t epoch;    /* the pool's epoch when connected */
    bool busy;         /* under the pool's mu */
};

struct cache_redis_pool {
    struct cache_redis_url url;
    char what[64];
    struct timeval connect_tv, command_tv;
    double backoff_min, backoff_max; /* seconds */
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* a slot was released */
    struct slot *slots; /* owned, (n_slots) */
    int n_slots;
    /* the breaker, under mu */
    bool down;
    bool probing;    /* while down: one call is trying */
    double next_try; /* while down: ar_time_s() from which one call may try */
    double backoff;  /* the wait after the next failed try */
    uint64_t epoch;  /* bumped by every failure: connections made before are dropped */
    atomic_bool healthy;
    _Atomic uint64_t errors;
    /* while down, a prober thread tries again when the backoff allows, so that the pool (and
     * /health) comes back by itself even when no caller asks */
    pthread_t prober;
    bool prober_on;
    bool stopping;         /* under mu */
    pthread_cond_t wake;   /* under mu: went down, or stopping */
};

static void *prober_main(void *arg);

struct cache_redis_pool_params cache_redis_pool_default_params(void)
{
    struct cache_redis_pool_params p;
    memset(&p, 0, sizeof(p));
    p.what = "redis";
    p.connect_timeout_ms = 50;
    p.command_timeout_ms = 100;
    p.pool_size = 4;
    p.backoff_min_ms = 100;
    p.backoff_max_ms = 5000;
    return p;
}

static struct timeval ms_tv(int ms)
{
    struct timeval tv;
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    return tv;
}

static bool reply_is_ok(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_STATUS && r->len == 2 && memcmp(r->str, "OK", 2) == 0;
}

/* A new connection, authenticated and on the URL's database; NULL with the reason in why. */
static redisContext *connect_one(struct cache_redis_pool *pool, char *why, size_t why_size)
{
    const struct cache_redis_url *u = &pool->url;
    redisContext *c = redisConnectWithTimeout(u->host, u->port, pool->connect_tv);
    redisReply *r = NULL;
    if (!c) {
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    if (c->err) {
        snprintf(why, why_size, "%s", c->errstr);
        goto fail;
    }
    if (redisSetTimeout(c, pool->command_tv) != REDIS_OK) {
        snprintf(why, why_size, "cannot set the command timeout: %s", c->errstr);
        goto fail;
    }
    redisEnableKeepAlive(c);
    if (u->password[0]) {
        if (u->user[0])
            r = redisCommand(c, "AUTH %s %s", u->user, u->password);
        else
            r = redisCommand(c, "AUTH %s", u->password);
        if (!reply_is_ok(r)) {
            snprintf(why, why_size, "AUTH failed: %s",
                     r && r->type == REDIS_REPLY_ERROR ? r->str : c->errstr);
            goto fail;
        }
        freeReplyObject(r);
        r = NULL;
    }
    if (u->db) {
        r = redisCommand(c, "SELECT %d", u->db);
        if (!reply_is_ok(r)) {
            snprintf(why, why_size, "SELECT %d failed: %s", u->db,
                     r && r->type == REDIS_REPLY_ERROR ? r->str : c->errstr);
            goto fail;
        }
        freeReplyObject(r);
    }
    return c;
fail:
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return NULL;
}

enum ar_status cache_redis_pool_create(const struct cache_redis_pool_params *p,
                                       struct cache_redis_pool **out, struct ar_err *err)
{
    struct cache_redis_pool *pool;
    enum ar_status st;
    char why[160] = "";
    if (!out)
        return AR_EINVAL;
    *out = NULL;
    if (!p)
        return ar_err_set(err, AR_EINVAL, 0, "no Redis parameters");
    if (p->pool_size < 1 || p->pool_size > 64 || p->connect_timeout_ms < 1 ||
        p->connect_timeout_ms > 60000 || p->command_timeout_ms < 1 ||
        p->command_timeout_ms > 60000 || p->backoff_min_ms < 1 ||
        p->backoff_max_ms < p->backoff_min_ms || p->backoff_max_ms > 3600000)
        return ar_err_set(err, AR_EINVAL, 0,
                          "Redis: pool size must be 1..64, timeouts 1..60000 ms and the "
                          "backoff 1 ms..1 h with min <= max");
    if (!(pool = ar_calloc(1, sizeof(*pool))))
        return AR_ENOMEM;
    if ((st = cache_redis_url_parse(p->url, &pool->url, err)) != AR_OK) {
        ar_free(pool);
        return st;
    }
    if (!(pool->slots = ar_calloc((size_t)p->pool_size, sizeof(*pool->slots)))) {
        ar_free(pool);
        return AR_ENOMEM;
    }
    snprintf(pool->what, sizeof(pool->what), "%s", p->what ? p->what : "redis");
    pool->n_slots = p->pool_size;
    pool->connect_tv = ms_tv(p->connect_timeout_ms);
    pool->command_tv = ms_tv(p->command_timeout_ms);
    pool->backoff_min = p->backoff_min_ms / 1000.0;
    pool->backoff_max = p->backoff_max_ms / 1000.0;
    pool->backoff = pool->backoff_min;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pthread_cond_init(&pool->wake, NULL);
    atomic_init(&pool->errors, 0);
    /* one connection now, so that healthy() tells the truth from the start */
    {
        struct sigpipe_guard g;
        sigpipe_block(&g);
        pool->slots[0].ctx = connect_one(pool, why, sizeof(why));
        sigpipe_restore(&g);
    }
    atomic_init(&pool->healthy, pool->slots[0].ctx != NULL);
    if (!pool->slots[0].ctx) {
        pool->down = true;
        pool->next_try = ar_time_s() + pool->backoff;
        pool->backoff = AR_MIN(2 * pool->backoff, pool->backoff_max);
        AR_WARN("%s: Redis %s:%d cannot be reached yet (%s); will retry by itself", pool->what,
                pool->url.host, pool->url.port, why);
    }
    pool->prober_on = pthread_create(&pool->prober, NULL, prober_main, pool) == 0;
    if (!pool->prober_on)
        AR_WARN("%s: no prober thread: Redis health updates only when called", pool->what);
    *out = pool;
    return AR_OK;
}

void cache_redis_pool_destroy(struct cache_redis_pool *pool)
{
    if (!pool)
        return;
    if (pool->prober_on) {
        pthread_mutex_lock(&pool->mu);
        pool->stopping = true;
        pthread_cond_signal(&pool->wake);
        pthread_mutex_unlock(&pool->mu);
        pthread_join(pool->prober, NULL);
    }
    for (int i = 0; i < pool->n_slots; i++)
        if (pool->slots[i].ctx)
            redisFree(pool->slots[i].ctx);
    ar_free(pool->slots);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    ar_free(pool);
}

/* Whether the failed call on c (errno_after: errno right after it) was the server having
 * closed the connection, which a new connection may not meet (a restarted Redis). */
static bool closed_by_server(const redisContext *c, int errno_after)
{
    return c->err == REDIS_ERR_EOF ||
           (c->err == REDIS_ERR_IO && (errno_after == ECONNRESET || errno_after == EPIPE));
}

/* Runs the command on slot s (connecting it first when needed); NULL with why on failure,
 * when s->ctx has been dropped. */
static redisReply *run_on(struct cache_redis_pool *pool, struct slot *s, uint64_t epoch, int argc,
                          const char **argv, const size_t *argvlen, char *why, size_t why_size)
{
    redisReply *r = NULL;
    bool fresh = false;
    if (s->ctx && s->epoch != epoch) { /* made before a failure: may be dead */
        redisFree(s->ctx);
        s->ctx = NULL;
    }
    if (!s->ctx) {
        if (!(s->ctx = connect_one(pool, why, why_size)))
            return NULL;
        s->epoch = epoch;
        fresh = true;
    }
    r = redisCommandArgv(s->ctx, argc, argv, argvlen);
    if (!r && !fresh && closed_by_server(s->ctx, errno)) {
        redisFree(s->ctx);
        if (!(s->ctx = connect_one(pool, why, why_size)))
            return NULL;
        s->epoch = epoch;
        r = redisCommandArgv(s->ctx, argc, argv, argvlen);
    }
    if (!r) {
        int e = errno;
        if (s->ctx->err == REDIS_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK))
            snprintf(why, why_size, "no answer within %ld ms",
                     (long)(pool->command_tv.tv_sec * 1000 + pool->command_tv.tv_usec / 1000));
        else
            snprintf(why, why_size, "%s", s->ctx->err ? s->ctx->errstr : "no reply");
        redisFree(s->ctx);
        s->ctx = NULL;
    }
    return r;
}

static enum ar_status pool_command(struct cache_redis_pool *pool, int argc, const char **argv,
                                   const size_t *argvlen, struct redisReply **reply, bool counted)
{
    struct slot *s = NULL;
    struct sigpipe_guard g;
    redisReply *r;
    bool probe = false, went_down = false, came_back = false;
    uint64_t epoch;
    char why[160] = "";
    double wait = 0;
    if (!reply)
        return AR_EINVAL;
    *reply = NULL;
    if (!pool || argc < 1 || !argv || !argvlen)
        return AR_EINVAL;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        if (pool->down && !probe) {
            if (pool->probing || ar_time_s() < pool->next_try) { /* the breaker is open */
                pthread_mutex_unlock(&pool->mu);
                if (counted)
                    atomic_fetch_add_explicit(&pool->errors, 1, memory_order_relaxed);
                return AR_EUNAVAIL;
            }
            pool->probing = probe = true;
        }
        for (int i = 0; i < pool->n_slots && !s; i++)
            if (!pool->slots[i].busy)
                s = &pool->slots[i];
        if (s)
            break;
        pthread_cond_wait(&pool->cv, &pool->mu);
    }
    s->busy = true;
    epoch = pool->epoch;
    pthread_mutex_unlock(&pool->mu);

    sigpipe_block(&g);
    r = run_on(pool, s, epoch, argc, argv, argvlen, why, sizeof(why));
    sigpipe_restore(&g);

    pthread_mutex_lock(&pool->mu);
    s->busy = false;
    pthread_cond_signal(&pool->cv);
    if (probe)
        pool->probing = false;
    if (r) {
        came_back = pool->down;
        pool->down = false;
        pool->backoff = pool->backoff_min;
        atomic_store(&pool->healthy, true);
    } else {
        pool->epoch++;
        /* only the first failure and failed tries move the schedule: calls that were in
         * flight when the server went away do not push it further */
        if (!pool->down || probe) {
            went_down = !pool->down;
            pool->down = true;
            wait = pool->backoff;
            pool->next_try = ar_time_s() + wait;
            pool->backoff = AR_MIN(2 * pool->backoff, pool->backoff_max);
        }
        atomic_store(&pool->healthy, false);
        pthread_cond_signal(&pool->wake);
    }
    pthread_mutex_unlock(&pool->mu);

    if (came_back)
        AR_INFO("%s: Redis %s:%d is reachable again", pool->what, pool->url.host, pool->url.port);
    if (!r) {
        if (counted)
            atomic_fetch_add_explicit(&pool->errors, 1, memory_order_relaxed);
        if (went_down)
            AR_WARN("%s: Redis %s:%d cannot be reached (%s); retrying in %.1f s, backing off "
                    "to %.0f s",
                    pool->what, pool->url.host, pool->url.port, why, wait, pool->backoff_max);
        return AR_EUNAVAIL;
    }
    *reply = r;
    return AR_OK;
}

enum ar_status cache_redis_pool_command(struct cache_redis_pool *pool, int argc, const char **argv,
                                        const size_t *argvlen, struct redisReply **reply)
{
    return pool_command(pool, argc, argv, argvlen, reply, true);
}

/* While the pool is down: a PING when the backoff allows (not counted as a caller's error). */
static void *prober_main(void *arg)
{
    struct cache_redis_pool *pool = arg;
    const char *ping[] = {"PING"};
    const size_t ping_len[] = {4};
    pthread_mutex_lock(&pool->mu);
    while (!pool->stopping) {
        double now = ar_time_s();
        if (pool->down && !pool->probing && now >= pool->next_try) {
            redisReply *r = NULL;
            pthread_mutex_unlock(&pool->mu);
            if (pool_command(pool, 1, ping, ping_len, &r, false) == AR_OK)
                freeReplyObject(r);
            pthread_mutex_lock(&pool->mu);
            continue;
        }
        {
            /* until the next try (down), or until woken (up: went down, or stopping) */
            double until = pool->down ? AR_MAX(pool->next_try, now + 0.01) : now + 60.0;
            struct timespec ts = ar_deadline_in(CLOCK_REALTIME, until - now);
            pthread_cond_timedwait(&pool->wake, &pool->mu, &ts);
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

bool cache_redis_pool_healthy(const struct cache_redis_pool *pool)
{
    return pool && atomic_load(&pool->healthy);
}

uint64_t cache_redis_pool_errors(const struct cache_redis_pool *pool)
{
    return pool ? atomic_load_explicit(&pool->errors, memory_order_relaxed) : 0;
}

void cache_redis_pool_note_error(struct cache_redis_pool *pool)
{
    if (pool)
        atomic_fetch_add_explicit(&pool->errors, 1, memory_order_relaxed);
}
