/* console_browser_test.c - the console in a real browser: `autoreply serve` on the demo model
 * with a fresh data directory, then tests/browser/console.mjs drives Debian's Chromium
 * (headless, 1280x800, through playwright-core) against it: it fails on any JavaScript error,
 * checks the live and jobs views, and the inbox's approve path when the review workflow API is
 * there. Once on a server without API keys (loopback only), once on one with a key, which the
 * page must ask for. Screenshots go to $BUILD/browser/ and $BUILD/browser-key/ (build/ by
 * default). Chromium, Node.js and the driver come from tools/install-deps.sh; when one is
 * missing this test fails, saying which. */
#include "harness/harness.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/serve.h"

#define SCRIPT "tests/browser/console.mjs"
#define DRIVER "tests/browser/node_modules/playwright-core/package.json"
#define KEY "sk-console-browser-test"

static struct {
    char dir[64];
    char model[512];
    struct th_serve open, keyed;
} g;

static const char *chromium_path(void)
{
    const char *p = getenv("AR_CHROMIUM");
    return p && *p ? p : "/usr/bin/chromium";
}

static void spawn(struct th_serve *s, const char *name, const char *key_file)
{
    char data[128], log[128];
    snprintf(data, sizeof(data), "%s/%s-var", g.dir, name);
    snprintf(log, sizeof(log), "%s/%s.log", g.dir, name);
    if (key_file)
        th_serve_spawn(s, log,
                       (const char *const[]){"-m", g.model, "--port", "0", "--data-dir", data, "-t",
                                             "1", "--api-key-file", key_file, NULL});
    else
        th_serve_spawn(s, log,
                       (const char *const[]){"-m", g.model, "--port", "0", "--data-dir", data, "-t",
                                             "1", NULL});
}

static int group_setup(void **state)
{
    char keys[128];
    FILE *f;
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (access(th_bin_path(), X_OK) != 0)
        fail_msg("%s not found: build it first (make bin/autoreply)", th_bin_path());
    th_shared_path(g.model, sizeof(g.model), "models/autoreply-demo-q8_0.gguf");
    if (access(g.model, R_OK) != 0)
        snprintf(g.model, sizeof(g.model), "models/autoreply-demo-q8_0.gguf");
    snprintf(g.dir, sizeof(g.dir), "/tmp/ar_browser_XXXXXX");
    assert_non_null(mkdtemp(g.dir));
    snprintf(keys, sizeof(keys), "%s/keys", g.dir);
    assert_non_null(f = fopen(keys, "w"));
    fputs(KEY "\n", f);
    fclose(f);
    spawn(&g.open, "open", NULL);
    spawn(&g.keyed, "keyed", keys);
    return th_serve_wait_ready(&g.open, 60) && th_serve_wait_ready(&g.keyed, 60) ? 0 : -1;
}

static int group_teardown(void **state)
{
    char cmd[128];
    (void)state;
    if (g.open.pid > 0)
        th_serve_stop(&g.open);
    if (g.keyed.pid > 0)
        th_serve_stop(&g.keyed);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g.dir);
    return 0;
}

/* Runs the script against port (with the API key when key is set); fails unless it passes. */
static void run_script(int port, const char *out_name, const char *key)
{
    const char *build = getenv("BUILD");
    char out[256], base[64];
    pid_t pid;
    int st;
    if (access(chromium_path(), X_OK) != 0)
        fail_msg("%s not found: run tools/install-deps.sh (Debian package chromium)",
                 chromium_path());
    if (access(DRIVER, R_OK) != 0)
        fail_msg("%s not found: run tools/install-deps.sh (npm ci in tests/browser)", DRIVER);
    snprintf(out, sizeof(out), "%s/%s", build && *build ? build : "build", out_name);
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", port);
    fflush(stdout);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (key)
            execlp("node", "node", SCRIPT, "--base", base, "--out", out, "--chromium",
                   chromium_path(), "--key", key, (char *)NULL);
        else
            execlp("node", "node", SCRIPT, "--base", base, "--out", out, "--chromium",
                   chromium_path(), (char *)NULL);
        fprintf(stderr, "cannot run node: install Node.js (tools/install-deps.sh)\n");
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s failed (status %d): see its lines above", SCRIPT,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static void test_console_without_keys(void **state)
{
    (void)state;
    run_script(g.open.port, "browser", NULL);
}

static void test_console_asks_for_the_key(void **state)
{
    (void)state;
    run_script(g.keyed.port, "browser-key", KEY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_console_without_keys),
        cmocka_unit_test(test_console_asks_for_the_key),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
