/* deploy_test.c - the deployment files as an operator uses them: the shipped nginx config passes
 * `nginx -t` and holds what the fleet needs (balancing, failover, keepalive, unbuffered streams,
 * limits equal to the server's), and deploy/fleet.sh brings a real fleet up behind a real nginx,
 * spreads requests, survives a killed instance, restarts it and stops everything it started. */
#include "harness/harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/http_client.h"
#include "harness/process.h"

/* serve learns --store/--cache/--queue/--instance-name (and answers with X-Autoreply-Instance)
 * in the fleet-store, fleet-cache, fleet-queue and fleet-http branches. Until those are merged
 * the fleet here runs with --no-backends and instances are told apart by the address nginx
 * reports (X-Autoreply-Upstream); with FLEET_FULL 1 it runs the default path (PostgreSQL, Redis,
 * RabbitMQ shared by the instances) and checks X-Autoreply-Instance too. */
#ifndef FLEET_FULL
#define FLEET_FULL 1
#endif

#define CONF "deploy/nginx/autoreply.conf"
#define FLEET "deploy/fleet.sh"

static const char *nginx_path(void)
{
    const char *b = getenv("AR_NGINX");
    return b && *b ? b : "/usr/sbin/nginx";
}

/* ---- processes ------------------------------------------------------------------------------- */

/* A /proc file, read to its end (they report size 0, so th_read_file reads nothing); NULL when
 * it cannot be opened. NUL-terminated; *len its length. Caller frees. */
static char *read_proc(const char *path, size_t *len)
{
    size_t cap = 4096, n = 0, k;
    char *buf;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    buf = malloc(cap);
    assert_non_null(buf);
    while ((k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n < 2) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    }
    fclose(f);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* A process that runs: it exists and is not a zombie waiting to be reaped. */
static bool alive(int pid)
{
    char path[64], *stat, *p;
    bool zombie;
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH))
        return false;
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    if (!(stat = read_proc(path, NULL)))
        return false;
    p = strrchr(stat, ')');
    zombie = p && p[1] == ' ' && p[2] == 'Z';
    free(stat);
    return !zombie;
}

/* Live processes whose command line contains `needle`, their pids in pids[] (up to max). */
static int procs_mentioning(const char *needle, int *pids, int max)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    assert_non_null(d);
    while ((e = readdir(d))) {
        char path[300];
        size_t len = 0;
        char *cmd;
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == getpid())
            continue;
        snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
        if (!(cmd = read_proc(path, &len)))
            continue;
        for (size_t i = 0; i + 1 < len; i++)
            if (cmd[i] == '\0')
                cmd[i] = ' ';
        if (strstr(cmd, needle) && alive(pid) && n < max)
            pids[n++] = pid;
        free(cmd);
    }
    closedir(d);
    return n;
}

/* Children of pid (nginx's workers). */
static int children_of(int ppid, int *pids, int max)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    assert_non_null(d);
    while ((e = readdir(d))) {
        char path[300], *stat, *p;
        int pid = atoi(e->d_name), parent = 0;
        char state;
        if (pid <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
        if (!(stat = read_proc(path, NULL)))
            continue;
        p = strrchr(stat, ')');
        if (p && sscanf(p + 1, " %c %d", &state, &parent) == 2 && parent == ppid && n < max)
            pids[n++] = pid;
        free(stat);
    }
    closedir(d);
    return n;
}

/* ---- a small reader of nginx configuration --------------------------------------------------- */

/* One directive: its words (args[0] the name) and, for a block, what the block holds. */
struct ngx {
    char *args[12];
    int n_args;
    struct ngx *child;
    int n_child;
    bool block;
};

static void ngx_free(struct ngx *n)
{
    for (int i = 0; i < n->n_args; i++)
        free(n->args[i]);
    for (int i = 0; i < n->n_child; i++)
        ngx_free(&n->child[i]);
    free(n->child);
}

/* The next word, or one of "{", "}", ";" (a NUL-terminated copy); NULL at the end. */
static char *ngx_token(const char **pp)
{
    const char *p = *pp, *s;
    char *t;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p != '#')
            break;
        while (*p && *p != '\n')
            p++;
    }
    if (!*p) {
        *pp = p;
        return NULL;
    }
    if (*p == '{' || *p == '}' || *p == ';') {
        *pp = p + 1;
        return strndup(p, 1);
    }
    if (*p == '"' || *p == '\'') {
        char q = *p++;
        s = p;
        while (*p && *p != q)
            p += p[0] == '\\' && p[1] ? 2 : 1;
        t = strndup(s, (size_t)(p - s));
        *pp = *p ? p + 1 : p;
        return t;
    }
    s = p;
    while (*p && !strchr(" \t\r\n;{}#", *p))
        p++;
    *pp = p;
    return strndup(s, (size_t)(p - s));
}

/* Reads directives into blk until "}" (nested) or the end (top level); fails the test on a
 * syntax error. */
static void ngx_parse_block(const char **pp, struct ngx *blk, bool nested)
{
    struct ngx cur = {0};
    char *t;
    while ((t = ngx_token(pp))) {
        if (!strcmp(t, ";") || !strcmp(t, "{")) {
            if (cur.n_args == 0)
                fail_msg("nginx config: '%s' without a directive", t);
            cur.block = t[0] == '{';
            free(t);
            if (cur.block)
                ngx_parse_block(pp, &cur, true);
            blk->child = realloc(blk->child, sizeof(*blk->child) * (size_t)(blk->n_child + 1));
            blk->child[blk->n_child++] = cur;
            memset(&cur, 0, sizeof(cur));
        } else if (!strcmp(t, "}")) {
            free(t);
            if (!nested || cur.n_args)
                fail_msg("nginx config: unexpected '}'");
            return;
        } else {
            if (cur.n_args == (int)AR_ARRAY_LEN(cur.args))
                fail_msg("nginx config: directive %s has too many words", cur.args[0]);
            cur.args[cur.n_args++] = t;
        }
    }
    if (nested || cur.n_args)
        fail_msg("nginx config: unexpected end");
}

/* The first directive of blk named name whose other words, joined by spaces, are `rest` (NULL:
 * any). */
static const struct ngx *ngx_find(const struct ngx *blk, const char *name, const char *rest)
{
    for (int i = 0; blk && i < blk->n_child; i++) {
        const struct ngx *d = &blk->child[i];
        char joined[512] = "";
        if (strcmp(d->args[0], name))
            continue;
        for (int k = 1; k < d->n_args; k++)
            snprintf(joined + strlen(joined), sizeof(joined) - strlen(joined), "%s%s",
                     k > 1 ? " " : "", d->args[k]);
        if (!rest || !strcmp(joined, rest))
            return d;
    }
    return NULL;
}

/* The same, failing the test when absent. */
static const struct ngx *ngx_need(const struct ngx *blk, const char *name, const char *rest,
                                  const char *where)
{
    const struct ngx *d = ngx_find(blk, name, rest);
    if (!d)
        fail_msg("%s: no \"%s%s%s\"", where, name, rest ? " " : "", rest ? rest : "");
    return d;
}

static bool ngx_has_word(const struct ngx *d, const char *word)
{
    for (int k = 1; d && k < d->n_args; k++)
        if (!strcmp(d->args[k], word))
            return true;
    return false;
}

/* nginx sizes ("64m", "1k", "512") in bytes; times ("25s", "2m", "600") in seconds */
static long long ngx_size(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    switch (*end) {
    case 'k':
    case 'K':
        return v << 10;
    case 'm':
    case 'M':
        return v << 20;
    case 'g':
    case 'G':
        return v << 30;
    default:
        return v;
    }
}
static long long ngx_seconds(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    return *end == 'm' && end[1] != 's' ? v * 60 : *end == 'h' ? v * 3600 : v;
}

static void ngx_load(const char *path, struct ngx *root)
{
    char *text = th_read_file(path, NULL);
    const char *p = text;
    if (!text)
        fail_msg("cannot read %s", path);
    memset(root, 0, sizeof(*root));
    ngx_parse_block(&p, root, false);
    free(text);
}

/* The default of a `serve` flag from `autoreply serve --help`: the number in the last (...) of
 * the line naming it. */
static long long serve_default(const char *help, const char *flag)
{
    char key[64];
    const char *line, *eol, *open = NULL;
    snprintf(key, sizeof(key), "  %s ", flag);
    if (!(line = strstr(help, key)))
        fail_msg("serve --help does not list %s", flag);
    eol = strchr(line, '\n');
    /* the option table's help ends a line with "(default: VALUE)" */
    for (const char *p = line; p < eol; p++)
        if (!strncmp(p, "(default: ", 10))
            open = p + 10;
    if (!open)
        fail_msg("serve --help gives no default for %s", flag);
    return strtoll(open, NULL, 10);
}

/* ---- the shipped nginx config ---------------------------------------------------------------- */

/* A main config in dir that keeps every path (pid, logs, temporary files) inside dir and
 * includes conf. */
static void write_wrapper(const char *dir, const char *conf)
{
    char path[600], cwd[4096];
    FILE *f;
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    snprintf(path, sizeof(path), "%s/nginx.conf", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "pid %s/nginx.pid;\nerror_log %s/error.log;\nevents { worker_connections 64; }\n"
            "http {\n  client_body_temp_path %s/body;\n  proxy_temp_path %s/proxy;\n"
            "  fastcgi_temp_path %s/fastcgi;\n  uwsgi_temp_path %s/uwsgi;\n"
            "  scgi_temp_path %s/scgi;\n  access_log %s/access.log;\n  include %s%s%s;\n}\n",
            dir, dir, dir, dir, dir, dir, dir, dir, conf[0] == '/' ? "" : cwd,
            conf[0] == '/' ? "" : "/", conf);
    fclose(f);
}

static struct th_run nginx_t(const char *dir)
{
    return th_sh_run("'%s' -t -c %s/nginx.conf -p %s -e %s/error.log", nginx_path(), dir, dir, dir);
}

static void shipped_nginx_config_passes_nginx_t(void **state)
{
    char dir[] = "/tmp/ar_deploy_ngx_XXXXXX", broken[600];
    struct th_run r;
    char *text, *typo;
    FILE *f;
    (void)state;
    assert_non_null(mkdtemp(dir));
    write_wrapper(dir, CONF);
    r = nginx_t(dir);
    if (r.status != 0)
        fail_msg("nginx -t on %s: status %d\n%s%s", CONF, r.status, r.out, r.err);
    assert_non_null(strstr(r.err, "test is successful"));
    th_run_free(&r);

    /* the same check catches a broken copy: one misspelt directive */
    text = th_read_file(CONF, NULL);
    assert_non_null(text);
    assert_non_null(typo = strstr(text, "least_conn;"));
    memcpy(typo, "least_comm", 10);
    snprintf(broken, sizeof(broken), "%s/broken.conf", dir);
    f = fopen(broken, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    write_wrapper(dir, broken);
    r = nginx_t(dir);
    assert_int_not_equal(r.status, 0);
    assert_non_null(strstr(r.err, "least_comm"));
    th_run_free(&r);
    {
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

static void shipped_nginx_config_has_what_the_fleet_needs(void **state)
{
    struct ngx root, *http = &root;
    const struct ngx *up, *srv, *d, *loc;
    struct th_run help;
    int n_servers = 0;
    (void)state;
    ngx_load(CONF, &root);
    help = th_sh_run("'%s' serve --help", th_bin_path());
    assert_int_equal(help.status, 0);

    /* the upstream: least connections, shared state, failure handling, kept-alive connections */
    up = ngx_need(http, "upstream", "autoreply", CONF);
    assert_true(up->block);
    ngx_need(up, "least_conn", NULL, "upstream");
    ngx_need(up, "zone", NULL, "upstream");
    for (int i = 0; i < up->n_child; i++) {
        const struct ngx *s = &up->child[i];
        bool weight = false, fails = false, timeout = false;
        if (strcmp(s->args[0], "server"))
            continue;
        n_servers++;
        for (int k = 2; k < s->n_args; k++) {
            weight |= !strncmp(s->args[k], "weight=", 7) && atoi(s->args[k] + 7) >= 1;
            fails |= !strncmp(s->args[k], "max_fails=", 10) && atoi(s->args[k] + 10) >= 1;
            timeout |= !strncmp(s->args[k], "fail_timeout=", 13);
        }
        if (!weight || !fails || !timeout)
            fail_msg("upstream server %s lacks weight, max_fails or fail_timeout", s->args[1]);
    }
    assert_true(n_servers >= 2);
    d = ngx_need(up, "keepalive", NULL, "upstream");
    assert_true(atoi(d->args[1]) >= 1);
    /* nginx must drop an idle upstream connection before the server closes it (--timeout) */
    d = ngx_need(up, "keepalive_timeout", NULL, "upstream");
    assert_true(ngx_seconds(d->args[1]) < serve_default(help.out, "--timeout"));

    srv = ngx_need(http, "server", NULL, CONF);
    assert_true(srv->block);
    /* keepalive to the upstream needs HTTP/1.1 and no "Connection: close" passed on */
    ngx_need(srv, "proxy_http_version", "1.1", "server");
    d = ngx_need(srv, "proxy_set_header", NULL, "server");
    {
        bool conn_empty = false;
        for (int i = 0; i < srv->n_child; i++) {
            const struct ngx *h = &srv->child[i];
            if (!strcmp(h->args[0], "proxy_set_header") && h->n_args == 3 &&
                !strcmp(h->args[1], "Connection") && !h->args[2][0])
                conn_empty = true;
        }
        assert_true(conn_empty);
    }
    ngx_need(srv, "proxy_cache", "off", "server");
    /* X-Autoreply-Instance must not be hidden */
    for (int i = 0; i < srv->n_child; i++)
        if (!strcmp(srv->child[i].args[0], "proxy_hide_header"))
            assert_false(ngx_has_word(&srv->child[i], "X-Autoreply-Instance"));

    /* body limits equal to the server's */
    d = ngx_need(srv, "client_max_body_size", NULL, "server");
    assert_int_equal(ngx_size(d->args[1]), serve_default(help.out, "--max-body"));
    loc = ngx_need(srv, "location", "= /v1/jobs", "server");
    d = ngx_need(loc, "client_max_body_size", NULL, "location = /v1/jobs");
    assert_int_equal(ngx_size(d->args[1]), serve_default(help.out, "--max-job-body"));

    /* retries: 503 and errors go to the next instance, a bounded number of times */
    d = ngx_need(srv, "proxy_next_upstream", NULL, "server");
    assert_true(ngx_has_word(d, "error") && ngx_has_word(d, "http_503"));
    d = ngx_need(srv, "proxy_next_upstream_tries", NULL, "server");
    assert_true(atoi(d->args[1]) >= 2);
    /* a job POST that reached an instance is never sent again; a review reply may be */
    d = ngx_need(loc, "proxy_next_upstream", NULL, "location = /v1/jobs");
    assert_false(ngx_has_word(d, "non_idempotent"));
    loc = ngx_need(srv, "location", "= /v1/reviews/reply", "server");
    d = ngx_need(loc, "proxy_next_upstream", NULL, "location = /v1/reviews/reply");
    assert_true(ngx_has_word(d, "non_idempotent") && ngx_has_word(d, "http_503"));
    /* a reply may take up to 3 generations of 60 s */
    d = ngx_need(loc, "proxy_read_timeout", NULL, "location = /v1/reviews/reply");
    assert_true(ngx_seconds(d->args[1]) >= 180);

    /* server-sent events: both generation routes unbuffered, not cached */
    loc = ngx_need(srv, "location", "~ ^/v1/(chat/)?completions$", "server");
    ngx_need(loc, "proxy_buffering", "off", "completions");
    ngx_need(loc, "proxy_cache", "off", "completions");
    ngx_need(loc, "add_header", "X-Accel-Buffering no always", "completions");
    ngx_need(loc, "proxy_pass", "http://autoreply", "completions");
    d = ngx_need(loc, "proxy_read_timeout", NULL, "completions");
    assert_true(ngx_seconds(d->args[1]) >= 60);

    th_run_free(&help);
    ngx_free(&root);
}

/* ---- the fleet ------------------------------------------------------------------------------- */

static char fleet_dir[256]; /* the fleet of the running test, for teardown */

static int fleet_teardown(void **state)
{
    char cmd[600];
    (void)state;
    if (fleet_dir[0]) {
        snprintf(cmd, sizeof(cmd), "timeout 120 sh %s down --dir '%s' >/dev/null 2>&1; rm -rf '%s'",
                 FLEET, fleet_dir, fleet_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "teardown: %s failed\n", cmd);
        fleet_dir[0] = '\0';
    }
    return 0;
}

struct proc {
    char name[32];
    int pid;
    char url[256];
    int port; /* of an http:// URL */
};

/* "NAME pid PID URL" lines of `fleet.sh up`; fails the test on any other line. */
static int parse_procs(const char *out, struct proc *p, int max)
{
    int n = 0;
    for (const char *line = out; *line;) {
        const char *eol = strchr(line, '\n');
        char buf[512];
        snprintf(buf, sizeof(buf), "%.*s", (int)(eol ? eol - line : (ptrdiff_t)strlen(line)), line);
        if (n == max || sscanf(buf, "%31s pid %d %255s", p[n].name, &p[n].pid, p[n].url) != 3)
            fail_msg("unexpected line from fleet.sh: '%s'", buf);
        p[n].port = 0;
        sscanf(p[n].url, "http://127.0.0.1:%d", &p[n].port);
        n++;
        line = eol ? eol + 1 : line + strlen(line);
    }
    return n;
}

static const struct proc *proc_named(const struct proc *p, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(p[i].name, name))
            return &p[i];
    fail_msg("fleet.sh printed no line for %s", name);
    return NULL;
}

/* GET path through port: the status, and the port of the instance that answered (the last
 * address of X-Autoreply-Upstream; 0 without one) and its X-Autoreply-Instance. */
static int get_via(int port, const char *path, int *upstream, char *instance, size_t size)
{
    struct resp r;
    char up[256];
    const char *last;
    int status;
    http(port, "GET", path, NULL, NULL, 0, &r);
    *upstream = 0;
    if (resp_header(&r, "X-Autoreply-Upstream", up, sizeof(up))) {
        last = strrchr(up, ' ') ? strrchr(up, ' ') + 1 : up;
        sscanf(last, "127.0.0.1:%d", upstream);
    }
    if (instance && !resp_header(&r, "X-Autoreply-Instance", instance, size))
        instance[0] = '\0';
    status = r.status;
    resp_free(&r);
    return status;
}

static void fleet_balances_survives_a_killed_instance_and_stops_everything(void **state)
{
    struct proc p[8], again;
    struct th_run r;
    const struct proc *i1, *i2, *ngx;
    int n, nginx_port = th_free_port(), seen1 = 0, seen2 = 0, workers[16], n_workers;
    int old_i2;
    char state_file[400], *text;
    (void)state;
    snprintf(fleet_dir, sizeof(fleet_dir), "/tmp/ar_fleet_XXXXXX");
    assert_non_null(mkdtemp(fleet_dir));

    r = th_sh_run("timeout 300 sh %s up --instances 2 --port %d --dir %s --bin '%s' --wait 120%s",
                  FLEET, nginx_port, fleet_dir, th_bin_path(), FLEET_FULL ? "" : " --no-backends");
    if (r.status != 0)
        fail_msg("fleet.sh up: status %d\nstdout: %s\nstderr: %s", r.status, r.out, r.err);
    n = parse_procs(r.out, p, 8);
    th_run_free(&r);

    /* the printed lines: the servers (when shared), i1, i2, then nginx, each running */
    assert_int_equal(n, FLEET_FULL ? 6 : 3);
    if (FLEET_FULL) {
        assert_string_equal(p[0].name, "postgres");
        assert_int_equal(strncmp(p[0].url, "postgres://", 11), 0);
        assert_string_equal(p[1].name, "redis");
        assert_int_equal(strncmp(p[1].url, "redis://", 8), 0);
        assert_string_equal(p[2].name, "rabbitmq");
        assert_int_equal(strncmp(p[2].url, "amqp://", 7), 0);
    }
    i1 = proc_named(p, n, "i1");
    i2 = proc_named(p, n, "i2");
    ngx = proc_named(p, n, "nginx");
    assert_ptr_equal(ngx, &p[n - 1]);
    assert_int_equal(ngx->port, nginx_port);
    assert_true(i1->port > 0 && i2->port > 0 && i1->port != i2->port && i1->port != nginx_port);
    for (int i = 0; i < n; i++)
        if (!alive(p[i].pid))
            fail_msg("%s (pid %d) does not run", p[i].name, p[i].pid);
    /* another shell finds the ports in the folder */
    snprintf(state_file, sizeof(state_file), "%s/i2.port", fleet_dir);
    assert_non_null(text = th_read_file(state_file, NULL));
    assert_int_equal(atoi(text), i2->port);
    free(text);

    /* each instance answers by itself, and through nginx */
    for (int i = 0; i < n; i++) {
        struct resp h;
        if (!p[i].port)
            continue;
        http(p[i].port, "GET", "/health", NULL, NULL, 0, &h);
        assert_int_equal(h.status, 200);
        assert_non_null(strstr(h.body, "\"status\""));
        resp_free(&h);
    }
    /* least_conn with idle instances takes turns: a few requests reach both */
    for (int k = 0; k < 12; k++) {
        int up;
        char name[64];
        assert_int_equal(get_via(nginx_port, "/health", &up, name, sizeof(name)), 200);
        if (up != i1->port && up != i2->port)
            fail_msg("answered by %d, neither i1 (%d) nor i2 (%d)", up, i1->port, i2->port);
        seen1 += up == i1->port;
        seen2 += up == i2->port;
        if (FLEET_FULL)
            assert_string_equal(name, up == i1->port ? "i1" : "i2");
    }
    if (!seen1 || !seen2)
        fail_msg("12 requests through nginx: %d to i1, %d to i2", seen1, seen2);

    /* a streamed completion comes through as server-sent events, marked unbuffered */
    {
        struct resp s;
        const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Rating: 5 stars\\n"
                           "Review: great\"}],\"stream\":true,\"max_tokens\":8}";
        char ct[128], xab[32];
        http(nginx_port, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n", body,
             strlen(body), &s);
        assert_int_equal(s.status, 200);
        assert_non_null(resp_header(&s, "Content-Type", ct, sizeof(ct)));
        assert_non_null(strstr(ct, "text/event-stream"));
        assert_non_null(resp_header(&s, "X-Accel-Buffering", xab, sizeof(xab)));
        assert_string_equal(xab, "no");
        assert_non_null(strstr(s.body, "data: [DONE]"));
        resp_free(&s);
    }

    /* kill i2: nginx skips it, every request still answered (by i1) */
    r = th_sh_run("timeout 60 sh %s kill i2 --dir %s", FLEET, fleet_dir);
    assert_int_equal(r.status, 0);
    {
        char want[128];
        snprintf(want, sizeof(want), "i2 pid %d killed\n", i2->pid);
        assert_string_equal(r.out, want);
    }
    th_run_free(&r);
    assert_false(alive(i2->pid));
    for (int k = 0; k < 8; k++) {
        int up;
        assert_int_equal(get_via(nginx_port, "/health", &up, NULL, 0), 200);
        assert_int_equal(up, i1->port);
    }
    r = th_sh_run("timeout 60 sh %s status --dir %s", FLEET, fleet_dir);
    assert_int_equal(r.status, 3); /* not everything runs */
    {
        char want[400];
        snprintf(want, sizeof(want), "i2 - %s stopped\n", i2->url);
        assert_non_null(strstr(r.out, want));
        snprintf(want, sizeof(want), "i1 pid %d %s running\n", i1->pid, i1->url);
        assert_non_null(strstr(r.out, want));
    }
    th_run_free(&r);

    /* start it again: same port; nginx takes it back once its fail_timeout has passed */
    r = th_sh_run("timeout 180 sh %s start 2 --dir %s", FLEET, fleet_dir);
    if (r.status != 0)
        fail_msg("fleet.sh start 2: status %d\n%s", r.status, r.err);
    assert_int_equal(parse_procs(r.out, &again, 1), 1);
    th_run_free(&r);
    assert_string_equal(again.name, "i2");
    assert_string_equal(again.url, i2->url);
    assert_true(alive(again.pid));
    assert_int_not_equal(again.pid, i2->pid);
    old_i2 = i2->pid;
    {
        bool back = false;
        for (int k = 0; k < 150 && !back; k++) { /* 30 s; fail_timeout is 10 s */
            int up;
            assert_int_equal(get_via(nginx_port, "/health", &up, NULL, 0), 200);
            back = up == i2->port;
            if (!back)
                usleep(200 * 1000);
        }
        if (!back)
            fail_msg("restarted i2 got no request through nginx within 30 s");
    }
    r = th_sh_run("timeout 60 sh %s status --dir %s", FLEET, fleet_dir);
    assert_int_equal(r.status, 0);
    th_run_free(&r);

    /* down stops every process it started, nginx's workers included; down again is harmless */
    n_workers = children_of(ngx->pid, workers, 16);
    assert_true(n_workers >= 1);
    {
        /* the instances and nginx's master name the folder on their command lines (what
         * procs_mentioning finds after down must be nothing) */
        int found[16], n_found = procs_mentioning(fleet_dir, found, 16);
        assert_true(n_found >= 3);
    }
    r = th_sh_run("timeout 120 sh %s down --dir %s", FLEET, fleet_dir);
    if (r.status != 0)
        fail_msg("fleet.sh down: status %d\n%s", r.status, r.err);
    th_run_free(&r);
    for (int i = 0; i < n; i++)
        if (alive(p[i].pid))
            fail_msg("%s (pid %d) still runs after down", p[i].name, p[i].pid);
    assert_false(alive(again.pid));
    assert_false(alive(old_i2));
    for (int i = 0; i < n_workers; i++)
        assert_false(alive(workers[i]));
    {
        int left[8];
        assert_int_equal(procs_mentioning(fleet_dir, left, 8), 0);
    }
    assert_int_equal(http_try(nginx_port, "GET", "/health", NULL, NULL, 0, &(struct resp){0}),
                     false);
    r = th_sh_run("timeout 60 sh %s down --dir %s", FLEET, fleet_dir);
    assert_int_equal(r.status, 0);
    th_run_free(&r);
}

/* An instance that cannot start: up fails with the reason from its log and leaves nothing
 * running. */
static void fleet_up_fails_clearly_when_an_instance_cannot_start(void **state)
{
    struct th_run r;
    int left[8];
    char pidfile[400];
    (void)state;
    snprintf(fleet_dir, sizeof(fleet_dir), "/tmp/ar_fleet_XXXXXX");
    assert_non_null(mkdtemp(fleet_dir));
    r = th_sh_run("timeout 120 sh %s up --instances 2 --port %d --dir %s --bin '%s' --no-backends "
                  "--wait 30 -- --no-such-flag",
                  FLEET, th_free_port(), fleet_dir, th_bin_path());
    assert_int_not_equal(r.status, 0);
    assert_true(r.status < 124); /* failed by itself, not by the timeout */
    assert_string_equal(r.out, "");
    assert_non_null(strstr(r.err, "i1"));
    assert_non_null(strstr(r.err, "exited"));
    /* the instance's own message, from its log */
    assert_non_null(strstr(r.err, "unknown option '--no-such-flag'"));
    th_run_free(&r);
    assert_int_equal(procs_mentioning(fleet_dir, left, 8), 0);
    snprintf(pidfile, sizeof(pidfile), "%s/nginx/nginx.pid", fleet_dir);
    assert_int_not_equal(access(pidfile, F_OK), 0);
}

/* nginx's port already taken: nothing starts, the message says why. */
static void fleet_up_refuses_a_port_in_use(void **state)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof(a);
    struct th_run r;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port, left[8];
    char want[64];
    (void)state;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    port = ntohs(a.sin_port);
    snprintf(fleet_dir, sizeof(fleet_dir), "/tmp/ar_fleet_XXXXXX");
    assert_non_null(mkdtemp(fleet_dir));
    r = th_sh_run("timeout 60 sh %s up --instances 1 --port %d --dir %s --bin '%s' --no-backends",
                  FLEET, port, fleet_dir, th_bin_path());
    close(fd);
    assert_int_equal(r.status, 1);
    snprintf(want, sizeof(want), "port %d is in use", port);
    assert_non_null(strstr(r.err, want));
    assert_string_equal(r.out, "");
    th_run_free(&r);
    assert_int_equal(procs_mentioning(fleet_dir, left, 8), 0);
}

/* Bad arguments: a non-zero exit and a message naming the problem, before anything starts or
 * the folder is touched. */
static void fleet_commands_reject_bad_input(void **state)
{
    static const struct {
        const char *args, *needle;
    } cases[] = {
        {"up --port 8080 --dir DIR", "usage"},
        {"up --instances 0 --port 8080 --dir DIR", "--instances"},
        {"up --instances 2 --port 99999 --dir DIR", "--port"},
        {"up --instances 2 --port 8080", "--dir"},
        {"up --instances 2 --port 8080 --dir DIR --threads x", "--threads"},
        {"up --instances 2 --port 8080 --dir DIR --bin /nonexistent", "/nonexistent"},
        {"up --instances 2 --port 8080 --dir DIR --bogus", "unknown option"},
        {"status --dir DIR/nonexistent-folder", "no folder"},
        {"kill i1 --dir DIR", "no fleet"},
        {"frobnicate --dir DIR", "unknown command"},
    };
    char dir[] = "/tmp/ar_fleet_bad_XXXXXX";
    (void)state;
    assert_non_null(mkdtemp(dir));
    for (size_t i = 0; i < AR_ARRAY_LEN(cases); i++) {
        char args[512], *at;
        struct th_run r;
        snprintf(args, sizeof(args), "%s", cases[i].args);
        if ((at = strstr(args, "DIR"))) {
            char rest[256];
            snprintf(rest, sizeof(rest), "%s", at + 3);
            snprintf(at, sizeof(args) - (size_t)(at - args), "%s%s", dir, rest);
        }
        r = th_sh_run("timeout 30 sh %s %s", FLEET, args);
        if (r.status == 0 || r.status >= 124 || !strstr(r.err, cases[i].needle))
            fail_msg("fleet.sh %s: status %d, stderr: %s", args, r.status, r.err);
        assert_string_equal(r.out, "");
        th_run_free(&r);
    }
    /* nothing was written there */
    assert_int_equal(rmdir(dir), 0);
}

/* kill/start name an instance of the fleet, nothing else */
static void fleet_kill_and_start_reject_an_unknown_instance(void **state)
{
    char conf[400];
    FILE *f;
    (void)state;
    snprintf(fleet_dir, sizeof(fleet_dir), "/tmp/ar_fleet_XXXXXX");
    assert_non_null(mkdtemp(fleet_dir));
    snprintf(conf, sizeof(conf), "%s/fleet.conf", fleet_dir);
    assert_non_null(f = fopen(conf, "w"));
    fputs("N=2\nPORT=1\nBACKENDS=0\nWAIT=5\n", f);
    fclose(f);
    for (int i = 0; i < 4; i++) {
        static const char *const bad[] = {"kill i3", "start 0", "kill x1", "start i"};
        struct th_run r = th_sh_run("timeout 30 sh %s %s --dir %s", FLEET, bad[i], fleet_dir);
        if (r.status == 0 || r.status >= 124 || !strstr(r.err, "no instance"))
            fail_msg("fleet.sh %s: status %d, stderr: %s", bad[i], r.status, r.err);
        th_run_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shipped_nginx_config_passes_nginx_t),
        cmocka_unit_test(shipped_nginx_config_has_what_the_fleet_needs),
        cmocka_unit_test(fleet_commands_reject_bad_input),
        cmocka_unit_test_teardown(fleet_kill_and_start_reject_an_unknown_instance, fleet_teardown),
        cmocka_unit_test_teardown(fleet_up_refuses_a_port_in_use, fleet_teardown),
        cmocka_unit_test_teardown(fleet_up_fails_clearly_when_an_instance_cannot_start,
                                  fleet_teardown),
        cmocka_unit_test_teardown(fleet_balances_survives_a_killed_instance_and_stops_everything,
                                  fleet_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
