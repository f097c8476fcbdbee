/* private_services.h - a backend server of the test's own, for tests that stop and restart
 * it to watch a client reconnect: deploy/services.sh starts it in a mkdtemp folder on a free
 * port (or the same port again); the shared servers of tests/run.sh (AR_TEST_*_URL) are
 * never stopped. Also th_env_url: the URL of a shared server, failing the test without it, and
 * th_redis_direct: a test's own connection to a Redis server, for checking what it holds. */
#ifndef AR_TEST_PRIVATE_SERVICES_H
#define AR_TEST_PRIVATE_SERVICES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "cache/cache.h"
#include "harness/harness.h"

/* The URL in environment variable var (tests/run.sh exports them); fails the test when it is
 * missing: a test that needs a server never passes without one. */
static inline const char *th_env_url(const char *var)
{
    const char *u = getenv(var);
    if (!u || !*u)
        fail_msg("%s is not set: start the servers (tests/run.sh does, or "
                 "`sh deploy/services.sh start KIND DIR`) and export it",
                 var);
    return u;
}

struct th_private {
    char kind[16]; /* "redis", "postgres", "rabbitmq" */
    char dir[256]; /* its data, removed by th_private_cleanup */
    char url[256];
    int port;
    int running;
};

/* Runs services.sh start (port 0: a free one); fills url and port. */
static inline int th_private_run_start(struct th_private *s, int port)
{
    char cmd[768], line[256] = "";
    FILE *f;
    if (port)
        snprintf(cmd, sizeof(cmd), "sh deploy/services.sh start %s %s %d 2>>%s/services.log",
                 s->kind, s->dir, port, s->dir);
    else
        snprintf(cmd, sizeof(cmd), "sh deploy/services.sh start %s %s 2>>%s/services.log", s->kind,
                 s->dir, s->dir);
    if (!(f = popen(cmd, "r")))
        return -1;
    if (!fgets(line, sizeof(line), f))
        line[0] = '\0';
    if (pclose(f) != 0 || !line[0])
        return -1;
    line[strcspn(line, "\r\n")] = '\0';
    snprintf(s->url, sizeof(s->url), "%s", line);
    {
        char path[300];
        FILE *pf;
        snprintf(path, sizeof(path), "%s/%s.port", s->dir, s->kind);
        if ((pf = fopen(path, "r"))) {
            if (fscanf(pf, "%d", &s->port) != 1)
                s->port = 0;
            fclose(pf);
        }
    }
    s->running = 1;
    return s->port > 0 ? 0 : -1;
}

/* Starts a private server of kind in a new temporary folder; fails the test if it cannot. */
static inline void th_private_start(struct th_private *s, const char *kind)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->kind, sizeof(s->kind), "%s", kind);
    snprintf(s->dir, sizeof(s->dir), "/tmp/ar-private-%s.XXXXXX", kind);
    if (!mkdtemp(s->dir))
        fail_msg("mkdtemp failed");
    if (th_private_run_start(s, 0) != 0)
        fail_msg("cannot start a private %s (see %s/services.log)", kind, s->dir);
}

/* Stops it (by pid, through services.sh); its port stays known for a restart. */
static inline void th_private_stop(struct th_private *s)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "sh deploy/services.sh stop %s %s 2>>%s/services.log", s->kind,
             s->dir, s->dir);
    if (system(cmd) != 0)
        fail_msg("cannot stop the private %s in %s", s->kind, s->dir);
    s->running = 0;
}

/* Starts it again on the same port. */
static inline void th_private_restart(struct th_private *s)
{
    int port = s->port;
    if (th_private_run_start(s, port) != 0 || s->port != port)
        fail_msg("cannot restart the private %s on port %d (see %s/services.log)", s->kind, port,
                 s->dir);
}

/* Stops whatever still runs and removes the folder. Safe to call twice. */
static inline void th_private_cleanup(struct th_private *s)
{
    char cmd[600];
    if (!s->dir[0])
        return;
    snprintf(cmd, sizeof(cmd), "sh deploy/services.sh stop-all %s >/dev/null 2>&1; rm -rf %s",
             s->dir, s->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: cleaning %s failed\n", s->dir);
    s->dir[0] = '\0';
    s->running = 0;
}

/* The private server of the current test in a test file that starts one, and the cmocka
 * teardown that removes it whether the test passed or failed. */
static struct th_private th_priv;

static inline int th_private_teardown(void **state)
{
    (void)state;
    th_private_cleanup(&th_priv);
    return 0;
}

/* The test's own connection to the Redis server at url (redis://host:port/db), for checking
 * what it holds; fails the test when it cannot connect. */
static inline redisContext *th_redis_direct(const char *url)
{
    struct cache_redis_url u;
    redisContext *rc;
    redisReply *r;
    assert_int_equal(cache_redis_url_parse(url, &u, NULL), AR_OK);
    rc = redisConnect(u.host, u.port);
    if (!rc || rc->err)
        fail_msg("cannot connect to %s", url);
    r = redisCommand(rc, "SELECT %d", u.db);
    assert_non_null(r);
    freeReplyObject(r);
    return rc;
}

#endif
