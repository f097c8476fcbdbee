/* limits_redis.c - the per-client token buckets of limits.c kept in Redis, so that a fleet of
 * N instances admits a client at the configured rate, not N times it. One Lua script does a
 * whole admission atomically on Redis's own clock (TIME: instances with skewed clocks agree)
 * and gives each client's hash a TTL of the time its buckets take to refill, after which a
 * fresh entry is the same thing (as limits.c's sweep). Called through limits.c, which falls
 * back to its in-process buckets whenever this answers anything but AR_OK. */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "server_internal.h"

/* KEYS[1]: the client's hash {r: request tokens, k: tokens, t: last refill (Redis seconds)}.
 * ARGV: op ("r": one request, "t": n tokens), rps, burst, tpm, n, admission ("1"/"0").
 * Returns {ok (1/0), retry seconds as text}. The arithmetic is limits.c's, line for line:
 * find() creates full buckets, refill() runs when time moved forward, then
 * server_limiter_request() or server_limiter_tokens(). Numbers are stored with 17 digits so they
 * survive the round trip exactly. */
static const char rate_script[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"
    "local rps, burst, tpm = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local krate = tpm / 60\n"
    "local h = redis.call('HMGET', KEYS[1], 'r', 'k', 't')\n"
    "local r, k, last = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])\n"
    "if not (r and k and last) then r, k, last = burst, tpm, now end\n"
    "local dt = now - last\n"
    "if dt > 0 then\n"
    "  r = math.min(burst, r + dt * rps)\n"
    "  k = math.min(tpm, k + dt * krate)\n"
    "  last = now\n"
    "end\n"
    "local ok, retry = 1, 0\n"
    "if ARGV[1] == 'r' then\n"
    "  if r >= 1 then r = r - 1 else ok = 0; retry = (1 - r) / rps end\n"
    "else\n"
    "  local n = tonumber(ARGV[5])\n"
    "  local need = math.min(n, tpm)\n"
    "  if ARGV[6] == '1' and k < need then ok = 0; retry = (need - k) / krate\n"
    "  else k = k - n end\n"
    "end\n"
    "local idle = 0\n"
    "if rps > 0 then idle = math.max(idle, (burst - r) / rps) end\n"
    "if krate > 0 then idle = math.max(idle, (tpm - k) / krate) end\n"
    "idle = math.min(idle, 1e8)\n"
    "redis.call('HSET', KEYS[1], 'r', string.format('%.17g', r), 'k', string.format('%.17g', k),\n"
    "  't', string.format('%.17g', last))\n"
    "redis.call('PEXPIRE', KEYS[1], string.format('%.0f', math.ceil(idle * 1000) + 1000))\n"
    "return {ok, string.format('%.17g', retry)}\n";

#define RATE_KEY_PREFIX "ar:rl:"

struct server_rlimit {
    struct cache_redis_pool *pool;
    pthread_mutex_t mu;
    char sha[41];                 /* under mu; "" until SCRIPT LOAD answered */
    struct metrics_child *errors; /* borrowed; NULL without metrics */
};

enum ar_status server_rlimit_create(const char *url, struct metrics_registry *reg,
                                    struct server_rlimit **out, struct ar_err *err)
{
    struct cache_redis_pool_params pp = cache_redis_pool_default_params();
    struct server_rlimit *rl;
    enum ar_status st;
    *out = NULL;
    if (!(rl = ar_calloc(1, sizeof(*rl))))
        return AR_ENOMEM;
    pthread_mutex_init(&rl->mu, NULL);
    pp.url = url;
    pp.what = "rate limits";
    if ((st = cache_redis_pool_create(&pp, &rl->pool, err)) != AR_OK) {
        server_rlimit_destroy(rl);
        return st;
    }
    if (reg) {
        static const char *const backend[] = {"backend", NULL};
        struct metrics_family *f;
        if (metrics_counter(reg, "autoreply_rate_limit_backend_errors_total",
                            "Rate-limit checks the shared backend could not answer (the "
                            "instance's own buckets decided them)",
                            backend, &f) == AR_OK)
            rl->errors = metrics_child(f, (const char *const[]){"redis"});
    }
    *out = rl;
    return AR_OK;
}

void server_rlimit_destroy(struct server_rlimit *rl)
{
    if (!rl)
        return;
    cache_redis_pool_destroy(rl->pool);
    pthread_mutex_destroy(&rl->mu);
    ar_free(rl);
}

bool server_rlimit_healthy(const struct server_rlimit *rl)
{
    return rl && cache_redis_pool_healthy(rl->pool);
}

uint64_t server_rlimit_errors(const struct server_rlimit *rl)
{
    return rl ? cache_redis_pool_errors(rl->pool) : 0;
}

static bool reply_error_is(const redisReply *r, const char *prefix)
{
    return r->type == REDIS_REPLY_ERROR && strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/* The script's SHA1 from SCRIPT LOAD (once); false when Redis cannot say. */
static bool script_sha(struct server_rlimit *rl, char sha[41])
{
    const char *argv[3] = {"SCRIPT", "LOAD", rate_script};
    size_t argvlen[3] = {6, 4, sizeof(rate_script) - 1};
    redisReply *r = NULL;
    bool ok = false;
    pthread_mutex_lock(&rl->mu);
    memcpy(sha, rl->sha, 41);
    pthread_mutex_unlock(&rl->mu);
    if (sha[0])
        return true;
    if (cache_redis_pool_command(rl->pool, 3, argv, argvlen, &r) != AR_OK)
        return false;
    if (r->type == REDIS_REPLY_STRING && r->len == 40) {
        memcpy(sha, r->str, 40);
        sha[40] = '\0';
        pthread_mutex_lock(&rl->mu);
        memcpy(rl->sha, sha, 41);
        pthread_mutex_unlock(&rl->mu);
        ok = true;
    } else {
        cache_redis_pool_note_error(rl->pool);
        AR_DEBUG("rate limits: SCRIPT LOAD answered %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected type");
    }
    freeReplyObject(r);
    return ok;
}

/* Runs the script for client; AR_OK with *ok and, when refused, *retry_s. */
static enum ar_status run(struct server_rlimit *rl, const char *client, const char *op, double rps,
                          double burst, double tpm, int64_t n, bool admission, bool *ok,
                          double *retry_s)
{
    char sha[41], key[300], a_rps[32], a_burst[32], a_tpm[32], a_n[32];
    const char *argv[10];
    size_t argvlen[10];
    redisReply *r = NULL;
    enum ar_status st;
    int klen = snprintf(key, sizeof(key), RATE_KEY_PREFIX "%s", client);
    if (klen < 0 || (size_t)klen >= sizeof(key))
        return AR_EINVAL; /* client names are short: "key:<i>" or an address */
    snprintf(a_rps, sizeof(a_rps), "%.17g", rps);
    snprintf(a_burst, sizeof(a_burst), "%.17g", burst);
    snprintf(a_tpm, sizeof(a_tpm), "%.17g", tpm);
    snprintf(a_n, sizeof(a_n), "%lld", (long long)n);
    if (!script_sha(rl, sha)) {
        st = AR_EUNAVAIL;
        goto out;
    }
    argv[0] = "EVALSHA";
    argv[1] = sha;
    argv[2] = "1";
    argv[3] = key;
    argv[4] = op;
    argv[5] = a_rps;
    argv[6] = a_burst;
    argv[7] = a_tpm;
    argv[8] = a_n;
    argv[9] = admission ? "1" : "0";
    for (int i = 0; i < 10; i++)
        argvlen[i] = strlen(argv[i]);
    if ((st = cache_redis_pool_command(rl->pool, 10, argv, argvlen, &r)) != AR_OK)
        goto out;
    if (reply_error_is(r, "NOSCRIPT")) { /* Redis restarted or SCRIPT FLUSH: send it whole */
        freeReplyObject(r);
        r = NULL;
        argv[0] = "EVAL";
        argv[1] = rate_script;
        argvlen[0] = 4;
        argvlen[1] = sizeof(rate_script) - 1;
        if ((st = cache_redis_pool_command(rl->pool, 10, argv, argvlen, &r)) != AR_OK)
            goto out;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_STRING) {
        *ok = r->element[0]->integer != 0;
        if (!*ok)
            *retry_s = strtod(r->element[1]->str, NULL);
        st = AR_OK;
    } else {
        AR_DEBUG("rate limits: the script answered %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
        cache_redis_pool_note_error(rl->pool);
        st = AR_EIO;
    }
out:
    if (r)
        freeReplyObject(r);
    if (st != AR_OK)
        metrics_inc(rl->errors, 1);
    return st;
}

enum ar_status server_rlimit_request(struct server_rlimit *rl, const char *client, double rps,
                                     double burst, double tpm, bool *ok, double *retry_s)
{
    return run(rl, client, "r", rps, burst, tpm, 0, false, ok, retry_s);
}

enum ar_status server_rlimit_tokens(struct server_rlimit *rl, const char *client, double rps,
                                    double burst, double tpm, int64_t n, bool admission, bool *ok,
                                    double *retry_s)
{
    return run(rl, client, "t", rps, burst, tpm, n, admission, ok, retry_s);
}
