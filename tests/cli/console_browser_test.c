/* console_browser_test.c - the console in a real browser: `autoreply serve` on the demo model
 * with a fresh data directory, then tests/browser/console.mjs drives Debian's Chromium
 * (headless, 1280x800, through playwright-core) against it: it fails on any JavaScript error,
 * checks the live and jobs views, and the inbox's approve path when the review workflow API is
 * there. Screenshots go to $BUILD/browser/ (build/ by default). Chromium, Node.js and the
 * driver come from tools/install-deps.sh; when one is missing this test fails, saying which. */
#include "harness/harness.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/serve.h"

#define SCRIPT "tests/browser/console.mjs"
#define DRIVER "tests/browser/node_modules/playwright-core/package.json"

static struct {
    char dir[64];
    char model[512];
    struct th_serve srv;
} g;

static const char *chromium_path(void)
{
    const char *p = getenv("AR_CHROMIUM");
    return p && *p ? p : "/usr/bin/chromium";
}

static int group_setup(void **state)
{
    char data[128], log[128];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (access(th_bin_path(), X_OK) != 0)
        fail_msg("%s not found: build it first (make bin/autoreply)", th_bin_path());
    th_shared_path(g.model, sizeof(g.model), "models/autoreply-demo-q8_0.gguf");
    if (access(g.model, R_OK) != 0)
        snprintf(g.model, sizeof(g.model), "models/autoreply-demo-q8_0.gguf");
    snprintf(g.dir, sizeof(g.dir), "/tmp/ar_browser_XXXXXX");
    assert_non_null(mkdtemp(g.dir));
    snprintf(data, sizeof(data), "%s/var", g.dir);
    snprintf(log, sizeof(log), "%s/serve.log", g.dir);
    th_serve_spawn(
        &g.srv, log,
        (const char *const[]){"-m", g.model, "--port", "0", "--data-dir", data, "-t", "1", NULL});
    return th_serve_wait_ready(&g.srv, 60) ? 0 : -1;
}

static int group_teardown(void **state)
{
    char cmd[128];
    (void)state;
    if (g.srv.pid > 0)
        th_serve_stop(&g.srv);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g.dir);
    return 0;
}

static void test_console_in_chromium(void **state)
{
    const char *build = getenv("BUILD");
    char out[256], base[64];
    pid_t pid;
    int st;
    (void)state;
    if (access(chromium_path(), X_OK) != 0)
        fail_msg("%s not found: run tools/install-deps.sh (Debian package chromium)",
                 chromium_path());
    if (access(DRIVER, R_OK) != 0)
        fail_msg("%s not found: run tools/install-deps.sh (npm ci in tests/browser)", DRIVER);
    snprintf(out, sizeof(out), "%s/browser", build && *build ? build : "build");
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", g.srv.port);
    fflush(stdout);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execlp("node", "node", SCRIPT, "--base", base, "--out", out, "--chromium", chromium_path(),
               (char *)NULL);
        fprintf(stderr, "cannot run node: install Node.js (tools/install-deps.sh)\n");
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s failed (status %d): see its lines above", SCRIPT,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_console_in_chromium),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
