/* install_test.c - libautoreply as a user installs and embeds it: `make install` under DESTDIR
 * and under a PREFIX, the layout (static and shared library with its soname, header,
 * autoreply.pc), the shared library exporting exactly the functions autoreply.h declares, and
 * examples/embed.c and examples/stream.c built with `cc ... $(pkg-config --cflags --libs
 * autoreply)` against each copy, static-only and shared, then run on the demo model: embed
 * answers a review, stream prints what `autoreply generate --temp 0` prints for the same
 * prompt. `make uninstall` removes it all again. */
#include "harness/harness.h"

#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autoreply.h"
#include "harness/process.h"

#define DEMO "models/autoreply-demo-q8_0.gguf"
#define STREAM_PROMPT "物流很快"
#define STREAM_MAX 40
#define STREAM_MIN_TOKENS 8

/* A sanitizer build's library needs its runtime in the programs linked with it. */
#if defined(__SANITIZE_ADDRESS__)
#define SAN_FLAGS "-fsanitize=address,undefined"
#else
#define SAN_FLAGS ""
#endif

static char tmp[256];

static const char *build_dir(void)
{
    const char *b = getenv("BUILD");
    return b && *b ? b : "build";
}

/* Runs a shell command (formatted); fails the test with its output unless it exits 0. The
 * caller frees. */
__attribute__((format(printf, 2, 3))) static struct th_run sh_ok(const char *what,
                                                                 const char *fmt, ...)
{
    char cmd[4096];
    struct th_run r;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    r = th_sh_run("%s", cmd);
    if (r.status != 0)
        fail_msg("%s: status %d\nstdout: %s\nstderr: %s", what, r.status, r.out, r.err);
    return r;
}

static int group_setup(void **state)
{
    struct th_run r;
    (void)state;
    snprintf(tmp, sizeof(tmp), "/tmp/ar_install_XXXXXX");
    if (!mkdtemp(tmp))
        return -1;
    /* a staged install for a package (DESTDIR, PREFIX=/usr), a copy of it with only the static
     * library (a link cannot pick the .so there), and a direct install under a PREFIX */
    r = th_sh_run("make -s install BUILD=%s DESTDIR=%s/stage PREFIX=/usr && "
                  "cp -a %s/stage %s/static && rm -f %s/static/usr/lib/libautoreply.so* && "
                  "make -s install BUILD=%s PREFIX=%s/prefix",
                  build_dir(), tmp, tmp, tmp, tmp, build_dir(), tmp);
    if (r.status != 0) {
        fprintf(stderr, "make install failed:\n%s\n%s\n", r.out, r.err);
        th_run_free(&r);
        return -1;
    }
    th_run_free(&r);
    return 0;
}

static int group_teardown(void **state)
{
    struct th_run r;
    (void)state;
    r = th_sh_run("rm -rf '%s'", tmp);
    th_run_free(&r);
    return 0;
}

/* Whether "<tmp><rel>" exists (a dangling link too). */
static bool exists(const char *rel)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof(path), "%s%s", tmp, rel);
    return lstat(path, &st) == 0;
}

static void install_lays_out_libraries_header_and_pkg_config_file(void **state)
{
    struct th_run r;
    (void)state;
    assert_true(exists("/stage/usr/lib/libautoreply.a"));
    assert_true(exists("/stage/usr/lib/libautoreply.so." AR_VERSION));
    assert_true(exists("/stage/usr/include/autoreply.h"));
    assert_true(exists("/stage/usr/lib/pkgconfig/autoreply.pc"));
    /* the development link and the soname link lead to the real file */
    r = sh_ok("links", "readlink %s/stage/usr/lib/libautoreply.so && "
                       "readlink %s/stage/usr/lib/libautoreply.so.0", tmp, tmp);
    assert_string_equal(r.out, "libautoreply.so.0\nlibautoreply.so." AR_VERSION "\n");
    th_run_free(&r);
    r = sh_ok("soname", "readelf -d %s/stage/usr/lib/libautoreply.so." AR_VERSION
                        " | grep SONAME", tmp);
    assert_non_null(strstr(r.out, "[libautoreply.so.0]"));
    th_run_free(&r);
    /* the .pc names the final place, not the staging folder */
    r = sh_ok("pc", "PKG_CONFIG_PATH=%s/stage/usr/lib/pkgconfig pkg-config --modversion "
                    "--variable=includedir --libs autoreply && "
                    "cat %s/stage/usr/lib/pkgconfig/autoreply.pc", tmp, tmp);
    assert_non_null(strstr(r.out, AR_VERSION "\n/usr/include\n"));
    assert_non_null(strstr(r.out, "-lautoreply"));
    assert_non_null(strstr(r.out, "prefix=/usr\n"));
    assert_non_null(strstr(r.out, "Libs.private: "));
    assert_null(strstr(r.out, tmp));
    th_run_free(&r);
}

/* Every symbol the .so exports is a function autoreply.h declares with AR_API, and every one
 * of those is exported. */
static void shared_library_exports_exactly_the_public_api(void **state)
{
    struct th_run exported, declared;
    (void)state;
    exported = sh_ok("nm", "nm -D --defined-only %s/prefix/lib/libautoreply.so | "
                           "awk '{print $3}' | grep -v '^_' | sort", tmp);
    declared = sh_ok("header", "sed -n 's/^AR_API .*[ *]\\(ar_[a-z0-9_]*\\)(.*/\\1/p' "
                               "%s/prefix/include/autoreply.h | sort", tmp);
    assert_true(strlen(declared.out) > 200); /* some 40 functions */
    assert_string_equal(exported.out, declared.out);
    th_run_free(&exported);
    th_run_free(&declared);
}

/* Builds example ex against the install at root (a staged one: sysroot) into out. */
static void build_example(const char *ex, const char *pc_env, const char *flags, const char *out)
{
    char cmd[2048];
    struct th_run r;
    snprintf(cmd, sizeof(cmd),
             "%s; cc -Wall -Wextra -Werror %s examples/%s.c $(pkg-config %s --cflags --libs "
             "autoreply) -o %s",
             pc_env, SAN_FLAGS, ex, flags, out);
    r = th_sh_run("%s", cmd);
    if (r.status != 0)
        fail_msg("building %s: %s\n%s", ex, r.out, r.err);
    th_run_free(&r);
}

static void check_embed_output(struct th_run *r)
{
    char *nl = strchr(r->out, '\n');
    if (r->status != 0)
        fail_msg("embed: status %d\n%s\n%s", r->status, r->out, r->err);
    assert_non_null(nl);
    assert_true(nl - r->out >= 6); /* a reply of some characters on the first line */
    assert_non_null(strstr(r->err, "source="));
}

static void embed_links_the_static_library_alone_and_answers_a_review(void **state)
{
    char env[1024], exe[512], model[512];
    struct th_run r;
    (void)state;
    snprintf(env, sizeof(env),
             "export PKG_CONFIG_PATH=%s/static/usr/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=%s/static",
             tmp, tmp);
    snprintf(exe, sizeof(exe), "%s/embed_static", tmp);
    build_example("embed", env, "--static", exe);
    r = sh_ok("readelf", "readelf -d %s | grep NEEDED", exe);
    assert_null(strstr(r.out, "autoreply"));
    th_run_free(&r);
    r = th_sh_run("%s %s", exe, th_shared_path(model, sizeof(model), DEMO));
    check_embed_output(&r);
    th_run_free(&r);
}

static void embed_links_the_shared_library_and_answers_a_review(void **state)
{
    char env[1024], exe[512], model[512];
    struct th_run r;
    (void)state;
    snprintf(env, sizeof(env), "export PKG_CONFIG_PATH=%s/prefix/lib/pkgconfig", tmp);
    snprintf(exe, sizeof(exe), "%s/embed", tmp);
    build_example("embed", env, "", exe);
    r = sh_ok("readelf", "readelf -d %s | grep NEEDED", exe);
    assert_non_null(strstr(r.out, "[libautoreply.so.0]"));
    th_run_free(&r);
    /* the model from $AR_MODEL this time */
    r = th_sh_run("LD_LIBRARY_PATH=%s/prefix/lib AR_MODEL=%s %s", tmp,
                  th_shared_path(model, sizeof(model), DEMO), exe);
    check_embed_output(&r);
    th_run_free(&r);
}

/* Both link modes: stream's tokens, as they come, make up the CLI's greedy generation. */
static void stream_prints_the_greedy_generation_token_by_token(void **state)
{
    char env[1024], exe[512], model[512];
    struct th_run want, got;
    int n_tokens = 0;
    const char *s;
    (void)state;
    th_shared_path(model, sizeof(model), DEMO);
    want = th_run_exec(th_bin_path(),
                       (char *const[]){"autoreply", "generate", "-m", model, "-p", STREAM_PROMPT,
                                       "-n", "40", "--temp", "0", NULL},
                       NULL, false);
    assert_int_equal(want.status, 0);
    assert_true(strlen(want.out) > 1);
    for (int shared = 0; shared < 2; shared++) {
        if (shared)
            snprintf(env, sizeof(env), "export PKG_CONFIG_PATH=%s/prefix/lib/pkgconfig", tmp);
        else
            snprintf(env, sizeof(env),
                     "export PKG_CONFIG_PATH=%s/static/usr/lib/pkgconfig "
                     "PKG_CONFIG_SYSROOT_DIR=%s/static",
                     tmp, tmp);
        snprintf(exe, sizeof(exe), "%s/stream_%d", tmp, shared);
        build_example("stream", env, shared ? "" : "--static", exe);
        got = th_sh_run("LD_LIBRARY_PATH=%s/prefix/lib %s %s '" STREAM_PROMPT "' %d", tmp, exe,
                        model, STREAM_MAX);
        if (got.status != 0)
            fail_msg("stream: status %d\n%s\n%s", got.status, got.out, got.err);
        assert_string_equal(got.out, want.out);
        s = strstr(got.err, "stream: ");
        assert_non_null(s);
        n_tokens = atoi(s + strlen("stream: "));
        assert_true(n_tokens >= STREAM_MIN_TOKENS);
        th_run_free(&got);
    }
    th_run_free(&want);
}

static void uninstall_removes_what_install_put(void **state)
{
    struct th_run r;
    (void)state;
    r = sh_ok("uninstall", "make -s uninstall BUILD=%s PREFIX=%s/prefix", build_dir(), tmp);
    th_run_free(&r);
    assert_false(exists("/prefix/lib/libautoreply.a"));
    assert_false(exists("/prefix/lib/libautoreply.so"));
    assert_false(exists("/prefix/lib/libautoreply.so.0"));
    assert_false(exists("/prefix/lib/libautoreply.so." AR_VERSION));
    assert_false(exists("/prefix/include/autoreply.h"));
    assert_false(exists("/prefix/lib/pkgconfig/autoreply.pc"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(install_lays_out_libraries_header_and_pkg_config_file),
        cmocka_unit_test(shared_library_exports_exactly_the_public_api),
        cmocka_unit_test(embed_links_the_static_library_alone_and_answers_a_review),
        cmocka_unit_test(embed_links_the_shared_library_and_answers_a_review),
        cmocka_unit_test(stream_prints_the_greedy_generation_token_by_token),
        cmocka_unit_test(uninstall_removes_what_install_put),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
