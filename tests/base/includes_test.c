/* includes_test.c - tools/check-includes.sh: the repository's include graph keeps to the
 * Makefile's DEPS_<module> and docs/architecture.md says the same; and on small made-up trees,
 * that the script finds each kind of fault (so that the first check cannot pass empty).
 * tools/check-names.sh likewise: the symbols of this build's module archives carry their
 * module's prefix, and a made-up archive with a stray name fails. */
#include "harness/harness.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs the script on root (NULL: this checkout); its output in out, its exit status back. */
static int run_check(const char *root, char *out, size_t size)
{
    char cmd[1024];
    FILE *p;
    size_t n = 0;
    int st;
    snprintf(cmd, sizeof(cmd), "sh tools/check-includes.sh %s 2>&1", root ? root : "");
    p = popen(cmd, "r");
    assert_non_null(p);
    while (n + 1 < size) {
        size_t k = fread(out + n, 1, size - 1 - n, p);
        if (!k)
            break;
        n += k;
    }
    out[n] = '\0';
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void put(const char *root, const char *rel, const char *text)
{
    char path[512], dir[512];
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    snprintf(dir, sizeof(dir), "%s", path);
    for (char *s = dir + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = '\0';
        mkdir(dir, 0755);
        *s = '/';
    }
    f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Modules a and b, b may use a; the same print-deps rule as the Makefile's. */
static void make_tree(char *root, size_t size)
{
    snprintf(root, size, "/tmp/ar-includes-XXXXXX");
    assert_non_null(mkdtemp(root));
    put(root, "Makefile",
        "MODULES := a b\n"
        "DEPS_a :=\n"
        "DEPS_b := a\n"
        "SRC_DIRS := $(sort $(patsubst src/%/,%,$(wildcard src/*/)))\n"
        "print-deps:\n"
        "\t@$(foreach m,$(SRC_DIRS),echo '$(m)$(if $(filter undefined,$(origin "
        "DEPS_$(m))),?,: $(DEPS_$(m)))';)\n");
    put(root, "include/autoreply.h", "\n");
    put(root, "src/a/a.h", "#include \"autoreply.h\"\n");
    put(root, "src/a/a.c", "#include \"a.h\"\n#include <stdio.h>\n");
    put(root, "src/b/b.h", "#include \"a/a.h\"\n");
    put(root, "src/b/b.c", "#include \"b.h\"\n#include \"a/a.h\"\n");
    put(root, "docs/architecture.md",
        "# x\n\n## Who may use whom\n\n| module | may use |\n"
        "|---|---|\n| `a` | — |\n| `b` | `a` |\n\n## Next\n");
}

static void remove_tree(const char *root)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

static void repository_keeps_to_its_module_map(void **state)
{
    static char out[1 << 16];
    int rc = run_check(NULL, out, sizeof(out));
    (void)state;
    if (rc != 0)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "check-includes: ok"));
}

static void made_up_tree_that_keeps_to_its_map_passes(void **state)
{
    char root[64], out[4096];
    (void)state;
    make_tree(root, sizeof(root));
    assert_int_equal(run_check(root, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "ok (2 modules)"));
    remove_tree(root);
}

static void include_of_a_module_not_in_deps_fails_with_file_and_line(void **state)
{
    char root[64], out[4096];
    (void)state;
    make_tree(root, sizeof(root));
    put(root, "src/a/bad.c", "#include \"a.h\"\n\n#include \"b/b.h\"\n");
    put(root, "src/a/bad2.h", "#include \"../b/b.h\"\n");
    assert_int_equal(run_check(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "src/a/bad.c:3: #include \"b/b.h\": a may not use b"));
    assert_non_null(strstr(out, "src/a/bad2.h:1: #include \"../b/b.h\": a may not use b"));
    /* bad2.h also breaks the style */
    assert_non_null(strstr(out, "3 problem(s)"));
    remove_tree(root);
}

static void include_not_in_the_one_style_fails(void **state)
{
    char root[64], out[4096];
    (void)state;
    make_tree(root, sizeof(root));
    put(root, "src/b/s1.c", "#include \"../a/a.h\"\n");
    put(root, "src/b/s2.c", "#include \"b/b.h\"\n");
    put(root, "src/b/s3.c", "#include \"../b/b.h\"\n");
    put(root, "src/b/s4.c", "#include \"./b.h\"\n#include \"../../include/autoreply.h\"\n");
    assert_int_equal(run_check(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "src/b/s1.c:1: #include \"../a/a.h\": a header of another "
                                "module is written \"a/a.h\""));
    assert_non_null(strstr(out, "src/b/s2.c:1: #include \"b/b.h\": a header of the own module "
                                "is written \"b.h\""));
    assert_non_null(strstr(out, "src/b/s3.c:1: #include \"../b/b.h\": a header of the own "
                                "module is written \"b.h\""));
    assert_non_null(strstr(out, "src/b/s4.c:1: #include \"./b.h\""));
    assert_non_null(strstr(out, "src/b/s4.c:2: #include \"../../include/autoreply.h\""));
    assert_non_null(strstr(out, "5 problem(s)"));
    remove_tree(root);
}

static void include_of_no_file_fails(void **state)
{
    char root[64], out[4096];
    (void)state;
    make_tree(root, sizeof(root));
    put(root, "src/b/c.c", "#include \"nothere.h\"\n");
    assert_int_equal(run_check(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "src/b/c.c:1: #include \"nothere.h\" names no file"));
    remove_tree(root);
}

static void folder_without_deps_fails(void **state)
{
    char root[64], out[4096];
    (void)state;
    make_tree(root, sizeof(root));
    put(root, "src/c/c.c", "\n");
    assert_int_equal(run_check(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "src/c/ has no DEPS_c"));
    remove_tree(root);
}

static void doc_table_differing_from_makefile_fails(void **state)
{
    char root[64], out[4096];
    (void)state;
    make_tree(root, sizeof(root));
    put(root, "docs/architecture.md",
        "## Who may use whom\n\n| module | may use |\n|---|---|\n"
        "| `a` | `b` |\n| `b` | `a` |\n");
    assert_int_equal(run_check(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "a may use \"b\" there but \"\" in the Makefile"));
    put(root, "docs/architecture.md",
        "## Who may use whom\n\n| module | may use |\n|---|---|\n"
        "| `b` | `a` |\n");
    assert_int_equal(run_check(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "no row for a"));
    put(root, "docs/architecture.md", "## Other\n\n| `a` | — |\n| `b` | `a` |\n");
    assert_int_equal(run_check(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "no table"));
    remove_tree(root);
}

/* ---- names ------------------------------------------------------------------------------- */

static const char *argv0;

/* Runs tools/check-names.sh on lib; output and exit status as run_check. */
static int run_names(const char *lib, char *out, size_t size)
{
    char cmd[1024];
    FILE *p;
    size_t n = 0;
    int st;
    snprintf(cmd, sizeof(cmd), "sh tools/check-names.sh '%s' 2>&1", lib);
    p = popen(cmd, "r");
    assert_non_null(p);
    while (n + 1 < size) {
        size_t k = fread(out + n, 1, size - 1 - n, p);
        if (!k)
            break;
        n += k;
    }
    out[n] = '\0';
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The archives of the build this test belongs to: <build>/tests/base/includes_test ->
 * <build>/lib. */
static void build_archives_carry_their_prefixes(void **state)
{
    static char out[1 << 16];
    char lib[512], probe[600];
    char *cut;
    int rc;
    (void)state;
    snprintf(lib, sizeof(lib), "%s", argv0);
    for (int i = 0; i < 3 && (cut = strrchr(lib, '/')); i++)
        *cut = '\0';
    if (!strrchr(argv0, '/') || strcmp(lib, argv0) == 0)
        snprintf(lib, sizeof(lib), "build");
    snprintf(lib + strlen(lib), sizeof(lib) - strlen(lib), "/lib");
    snprintf(probe, sizeof(probe), "%s/libar_server.a", lib);
    if (access(probe, R_OK) != 0) {
        print_message("no %s: the module archives are not built (make tests)\n", probe);
        skip();
    }
    rc = run_names(lib, out, sizeof(out));
    if (rc != 0)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "check-names: ok"));
}

static void stray_name_in_an_archive_fails(void **state)
{
    char root[64], out[4096], cmd[600];
    (void)state;
    snprintf(root, sizeof(root), "/tmp/ar-names-XXXXXX");
    assert_non_null(mkdtemp(root));
    put(root, "foo.c",
        "int foo_count;\nint foo_get(void) { return foo_count; }\n"
        "int helper_get(void) { return 1; }\n"
        "static int local(void) { return 2; }\nint foo_local(void) { return local(); }\n");
    snprintf(cmd, sizeof(cmd), "cd '%s' && cc -c foo.c -o foo.o && ar rcs libar_foo.a foo.o", root);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(run_names(root, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "foo: helper_get does not start with the module's prefix"));
    assert_null(strstr(out, "foo_get"));
    assert_null(strstr(out, "local"));
    assert_non_null(strstr(out, "1 name(s)"));
    /* without the stray function it passes */
    put(root, "foo.c", "int foo_count;\nint foo_get(void) { return foo_count; }\n");
    assert_int_equal(system(cmd), 0);
    assert_int_equal(run_names(root, out, sizeof(out)), 0);
    remove_tree(root);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(repository_keeps_to_its_module_map),
        cmocka_unit_test(made_up_tree_that_keeps_to_its_map_passes),
        cmocka_unit_test(include_of_a_module_not_in_deps_fails_with_file_and_line),
        cmocka_unit_test(include_not_in_the_one_style_fails),
        cmocka_unit_test(include_of_no_file_fails),
        cmocka_unit_test(folder_without_deps_fails),
        cmocka_unit_test(doc_table_differing_from_makefile_fails),
        cmocka_unit_test(build_archives_carry_their_prefixes),
        cmocka_unit_test(stray_name_in_an_archive_fails),
    };
    (void)argc;
    argv0 = argv[0];
    return cmocka_run_group_tests(tests, NULL, NULL);
}
