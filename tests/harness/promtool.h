/* promtool.h - runs Prometheus's own checker, promtool (Debian package prometheus, installed by
 * tools/install-deps.sh), for the tests that hold our /metrics text, scrape config and alert
 * rules to it: its exit status and everything it printed. promtool missing fails the test. */
#ifndef AR_TEST_PROMTOOL_H
#define AR_TEST_PROMTOOL_H

#include <stdbool.h>
#include <unistd.h>

#include "harness/harness.h"
#include "harness/process.h"

struct promtool_run {
    int status; /* exit code, or 128 + signal */
    char *out;  /* stdout and stderr together, NUL-terminated; free() */
};

/* $PROMTOOL, else the first promtool on $PATH; fails the test when there is none. */
static inline const char *promtool_path(void)
{
    static char found[4096];
    const char *env = getenv("PROMTOOL"), *path = getenv("PATH");
    if (env && *env) {
        if (access(env, X_OK) != 0)
            fail_msg("PROMTOOL=%s is not an executable file", env);
        return env;
    }
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(found, sizeof(found), "%.*s/promtool", (int)n, n ? p : ".");
        if (access(found, X_OK) == 0)
            return found;
        p += n + (e ? 1 : 0);
    }
    fail_msg("promtool not found on PATH (nor in $PROMTOOL): install the Debian package "
             "prometheus (tools/install-deps.sh does)");
    return NULL;
}

/* Runs promtool with args (NULL-terminated, without the program name) and input on its stdin
 * (NULL: none). */
static inline struct promtool_run promtool(const char *const *args, const char *input)
{
    struct promtool_run r = {0};
    struct th_run run;
    const char *argv[16];
    const char *tool = promtool_path();
    int n = 0;
    argv[n++] = "promtool";
    for (; args[n - 1]; n++) {
        assert_true(n < (int)(sizeof(argv) / sizeof(argv[0])) - 1);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    run = th_run_exec(tool, (char *const *)(void *)argv, input, true);
    r.status = run.status;
    r.out = run.out;
    free(run.err);
    if (r.status == 127)
        fail_msg("%s could not be run", tool);
    return r;
}

/* `promtool check metrics` on text: passes only with exit status 0 and no complaint printed
 * (promtool prints one line per problem it finds). */
static inline void promtool_check_metrics(const char *text)
{
    static const char *const args[] = {"check", "metrics", NULL};
    struct promtool_run r = promtool(args, text);
    if (r.status != 0 || r.out[0] != '\0')
        fail_msg("promtool check metrics: status %d:\n%s", r.status, r.out);
    free(r.out);
}

#endif
