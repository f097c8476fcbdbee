/* opts_test.c - the table-driven option parser (base/opts.c): every kind of value stored, bad
 * numbers, missing values, unknown options and stray arguments refused with one line naming
 * the option and nothing stored, --help listing every entry of the table. */
#include "harness/harness.h"

#include <limits.h>
#include <math.h>

#include "base/base.h"
#include "base/opts.h"

/* The targets of the test table, reset before each parse. */
struct vals {
    const char *model, *host;
    int port, threads;
    int64_t seed;
    size_t max_body;
    double temp;
    bool verbose, cache;
    char called[64];
    int n_called;
};

static bool set_mode(void *ctx, const char *flag, const char *value, struct ar_err *err)
{
    struct vals *v = ctx;
    if (strcmp(value, "fast") && strcmp(value, "slow")) {
        ar_err_set(err, AR_EINVAL, 0, "%s: '%s' is neither fast nor slow", flag, value);
        return false;
    }
    snprintf(v->called, sizeof(v->called), "%s=%s", flag, value);
    v->n_called++;
    return true;
}

static bool set_fast(void *ctx, const char *flag, const char *value, struct ar_err *err)
{
    struct vals *v = ctx;
    (void)err;
    assert_null(value);
    snprintf(v->called, sizeof(v->called), "%s", flag);
    v->n_called++;
    return true;
}

static struct vals V;

static const struct ar_opt TABLE[] = {
    {"model", 'm', AR_OPT_STRING, &V.model, 0, 0, "FILE", "the model file", NULL, NULL},
    {"host", 0, AR_OPT_STRING, &V.host, 0, 0, "ADDR", "listen address", NULL, NULL},
    {"port", 'p', AR_OPT_INT, &V.port, 0, 65535, "N", "port;\n0 picks a free one", NULL, NULL},
    {NULL, 0, AR_OPT_SECTION, NULL, 0, 0, NULL, "generation:", NULL, NULL},
    {"threads", 't', AR_OPT_INT, &V.threads, 1, 1024, "N", "threads", NULL, NULL},
    {"seed", 0, AR_OPT_I64, &V.seed, -1, 0x1p63, "S", "random seed", "random", NULL},
    {"max-body", 0, AR_OPT_SIZE, &V.max_body, 1, 1 << 20, "BYTES", "body limit", NULL, NULL},
    {"temp", 0, AR_OPT_DOUBLE, &V.temp, 0, 100, "T", "temperature", NULL, NULL},
    {"verbose", 'v', AR_OPT_SET, &V.verbose, 0, 0, NULL, "say more", NULL, NULL},
    {"no-cache", 0, AR_OPT_CLEAR, &V.cache, 0, 0, NULL, "no cache", NULL, NULL},
    {"mode", 0, AR_OPT_CALL, NULL, 0, 0, "M", "fast or slow", "", set_mode},
    {"fast", 0, AR_OPT_ACTION, NULL, 0, 0, NULL, "the same as --mode fast", NULL, set_fast},
};

static const struct ar_opts SPEC = {
    .cmd = "demo",
    .usage = "demo [options] [FILE]",
    .about = "the end of the help",
    .opts = TABLE,
    .n_opts = AR_ARRAY_LEN(TABLE),
    .max_args = 1,
    .ctx = &V,
};

static void reset(void)
{
    memset(&V, 0, sizeof(V));
    V.host = "127.0.0.1";
    V.port = 8080;
    V.threads = 2;
    V.seed = -1;
    V.max_body = 1024;
    V.temp = 0.5;
    V.cache = true;
}

/* Parses the words (NULL-terminated, argv[0] "demo" added; copied, as argv's strings are
 * writable) into V; argv holds the positional arguments afterwards. */
static enum ar_opts_result parse(char **argv, int *first, struct ar_err *err, const char *w0, ...)
{
    va_list ap;
    int argc = 0;
    static char demo[] = "demo";
    argv[argc++] = demo;
    va_start(ap, w0);
    static char pool[32][64];
    for (const char *w = w0; w; w = va_arg(ap, const char *)) {
        assert_true(argc < (int)AR_ARRAY_LEN(pool));
        snprintf(pool[argc], sizeof(pool[argc]), "%s", w);
        argv[argc] = pool[argc];
        argc++;
    }
    va_end(ap);
    argv[argc] = NULL;
    reset();
    memset(err, 0, sizeof(*err));
    return ar_opts_parse(&SPEC, argc, argv, first, stdout, err);
}

static void every_kind_is_stored(void **state)
{
    char *argv[32];
    struct ar_err err;
    enum ar_opts_result r;
    int first = -1;
    (void)state;
    r = parse(argv, &first, &err, "-m", "a.gguf", "--host=::1", "--port", "0", "-t16", "--seed",
              "9223372036854775807", "--max-body", "1048576", "--temp", "1e-3", "-v", "--no-cache",
              "--mode", "fast", NULL);
    if (r != AR_OPTS_OK)
        fail_msg("refused: %s", err.msg);
    assert_string_equal(V.model, "a.gguf");
    assert_string_equal(V.host, "::1");
    assert_int_equal(V.port, 0);
    assert_int_equal(V.threads, 16);
    assert_true(V.seed == INT64_MAX);
    assert_true(V.max_body == (size_t)1 << 20);
    assert_true(fabs(V.temp - 1e-3) < 1e-12);
    assert_true(V.verbose);
    assert_false(V.cache);
    assert_string_equal(V.called, "--mode=fast");
    assert_int_equal(first, 17); /* no positional argument: argc */
    /* setters run in the order given: the action after --mode is the last call */
    assert_int_equal(parse(argv, &first, &err, "--mode", "slow", "--fast", NULL), AR_OPTS_OK);
    assert_string_equal(V.called, "--fast");
    assert_int_equal(V.n_called, 2);
}

static void positional_argument_and_later_value_wins(void **state)
{
    char *argv[32];
    struct ar_err err;
    int first = -1;
    (void)state;
    /* the file between options is moved behind them; a second --port overrides the first */
    assert_int_equal(parse(argv, &first, &err, "--port", "1", "in.txt", "-p", "2", NULL),
                     AR_OPTS_OK);
    assert_int_equal(V.port, 2);
    assert_int_equal(first, 5);
    assert_string_equal(argv[first], "in.txt");
    /* after "--" a word that looks like an option is an argument */
    assert_int_equal(parse(argv, &first, &err, "-p", "3", "--", "--port", NULL), AR_OPTS_OK);
    assert_int_equal(V.port, 3);
    assert_string_equal(argv[first], "--port");
    /* a negative value is a value, not an option */
    assert_int_equal(parse(argv, &first, &err, "--seed", "-1", NULL), AR_OPTS_OK);
    assert_true(V.seed == -1);
}

/* Positional arguments keep their order and are found between options even when
 * POSIXLY_CORRECT asks getopt to stop at the first one. */
static void positional_arguments_keep_their_order(void **state)
{
    char *argv[16];
    struct ar_err err = {0};
    struct ar_opts spec = SPEC;
    int first = -1, argc = 0;
    static char w[][16] = {"demo", "a", "--port", "1", "b", "-v", "c", "--", "-d"};
    (void)state;
    spec.max_args = -1;
    for (size_t i = 0; i < AR_ARRAY_LEN(w); i++)
        argv[argc++] = w[i];
    argv[argc] = NULL;
    setenv("POSIXLY_CORRECT", "1", 1);
    reset();
    assert_int_equal(ar_opts_parse(&spec, argc, argv, &first, stdout, &err), AR_OPTS_OK);
    unsetenv("POSIXLY_CORRECT");
    assert_int_equal(V.port, 1);
    assert_true(V.verbose);
    assert_int_equal(first, argc - 4);
    assert_string_equal(argv[first], "a");
    assert_string_equal(argv[first + 1], "b");
    assert_string_equal(argv[first + 2], "c");
    assert_string_equal(argv[first + 3], "-d");
}

/* A refused line: the result, the message's parts, and no target written (the earlier, good
 * --port 7 included). */
static void check_refused(const char *want1, const char *want2, const char *w1, const char *w2)
{
    char *argv[8];
    struct ar_err err;
    int first = -1;
    enum ar_opts_result r = parse(argv, &first, &err, "--port", "7", "-v", w1, w2, NULL);
    assert_int_equal(r, AR_OPTS_BAD);
    if (!strstr(err.msg, want1) || (want2 && !strstr(err.msg, want2)))
        fail_msg("'%s %s': message '%s' lacks '%s' / '%s'", w1, w2 ? w2 : "", err.msg, want1,
                 want2 ? want2 : "");
    assert_null(strchr(err.msg, '\n'));
    assert_int_equal(V.port, 8080);
    assert_false(V.verbose);
    assert_int_equal(V.n_called, 0);
}

static void bad_numbers_name_the_flag(void **state)
{
    (void)state;
    check_refused("--threads: 'x' is not an integer", NULL, "--threads", "x");
    check_refused("--threads: '4x' is not an integer", NULL, "-t", "4x");
    check_refused("--threads: '' is not an integer", NULL, "--threads=", NULL);
    check_refused("--threads: 0 is out of range [1, 1024]", NULL, "-t", "0");
    check_refused("--port: 65536 is out of range [0, 65535]", NULL, "--port", "65536");
    check_refused("--seed", "is not an integer", "--seed", "99999999999999999999");
    check_refused("--max-body: -1 is out of range", NULL, "--max-body", "-1");
    check_refused("--max-body: '1.5' is not an integer", NULL, "--max-body", "1.5");
    check_refused("--temp: 'nan' is not a number", NULL, "--temp", "nan");
    check_refused("--temp: 'inf' is not a number", NULL, "--temp", "inf");
    check_refused("--temp: '1e' is not a number", NULL, "--temp", "1e");
    check_refused("--temp: 101 is out of range [0, 100]", NULL, "--temp", "101");
}

/* A setter sees only values the other checks passed; its refusal is one line too (the
 * options before it are stored by then: setters run in order with the others). */
static void setter_refusal_names_the_flag(void **state)
{
    char *argv[8];
    struct ar_err err;
    int first = -1;
    (void)state;
    assert_int_equal(parse(argv, &first, &err, "--mode", "medium", NULL), AR_OPTS_BAD);
    assert_string_equal(err.msg, "--mode: 'medium' is neither fast nor slow");
    assert_int_equal(V.n_called, 0);
    /* a bad number anywhere on the line: the setter is never called */
    assert_int_equal(parse(argv, &first, &err, "--mode", "fast", "-t", "x", NULL), AR_OPTS_BAD);
    assert_int_equal(V.n_called, 0);
}

static void missing_values_and_unknown_options(void **state)
{
    (void)state;
    check_refused("--threads needs a value", NULL, "--threads", NULL);
    check_refused("--model needs a value", NULL, "-m", NULL);
    check_refused("demo: unknown option '--colour'", "(autoreply demo --help)", "--colour", NULL);
    check_refused("demo: unknown option '--colour'", NULL, "--colour=red", NULL);
    check_refused("demo: unknown option '-x'", NULL, "-x", NULL);
    check_refused("--verbose takes no value", NULL, "--verbose=1", NULL);
    check_refused("--fast takes no value", NULL, "--fast=yes", NULL);
    check_refused("demo: unexpected argument 'b'", NULL, "a", "b");
}

static void help_lists_every_entry(void **state)
{
    char *argv[8], *text = NULL;
    size_t len = 0;
    struct ar_err err = {0};
    int first = -1, n_args = 0;
    FILE *out = open_memstream(&text, &len);
    (void)state;
    assert_non_null(out);
    reset();
    static char w0[] = "demo", w1[] = "--port", w2[] = "9", w3[] = "--help";
    argv[n_args++] = w0;
    argv[n_args++] = w1;
    argv[n_args++] = w2;
    argv[n_args++] = w3;
    argv[n_args] = NULL;
    assert_int_equal(ar_opts_parse(&SPEC, n_args, argv, &first, out, &err), AR_OPTS_HELP);
    fclose(out);
    assert_int_equal(V.port, 8080); /* nothing stored */
    assert_non_null(strstr(text, "usage: autoreply demo [options] [FILE]\n"));
    for (size_t i = 0; i < AR_ARRAY_LEN(TABLE); i++) {
        const struct ar_opt *o = &TABLE[i];
        char want[128], first_line[64];
        snprintf(first_line, sizeof(first_line), "%.*s", (int)strcspn(o->help, "\n"), o->help);
        if (o->kind == AR_OPT_SECTION) {
            snprintf(want, sizeof(want), "\n%s\n", o->help);
        } else if (o->short_name) {
            snprintf(want, sizeof(want), "  -%c, --%s%s%s", o->short_name, o->name,
                     o->arg ? " " : "", o->arg ? o->arg : "");
        } else {
            snprintf(want, sizeof(want), "  --%s%s%s", o->name, o->arg ? " " : "",
                     o->arg ? o->arg : "");
        }
        if (!strstr(text, want))
            fail_msg("--help lacks '%s':\n%s", want, text);
        if (!strstr(text, first_line))
            fail_msg("--help lacks the help '%s':\n%s", first_line, text);
    }
    /* defaults: the targets' values before parsing, or the table's words */
    assert_non_null(strstr(text, "0 picks a free one (default: 8080)\n"));
    assert_non_null(strstr(text, "listen address (default: 127.0.0.1)\n"));
    assert_non_null(strstr(text, "random seed (default: random)\n"));
    assert_non_null(strstr(text, "temperature (default: 0.5)\n"));
    assert_non_null(strstr(text, "fast or slow\n"));
    assert_non_null(strstr(text, "  -h, --help"));
    assert_non_null(strstr(text, "the end of the help\n"));
    free(text);
}

static void parses_again_and_survives_oom(void **state)
{
    char *argv[8];
    struct ar_err err;
    int first = -1;
    (void)state;
    for (int k = 0; k < 3; k++) { /* getopt's state starts afresh each time */
        assert_int_equal(parse(argv, &first, &err, "-t", "3", NULL), AR_OPTS_OK);
        assert_int_equal(V.threads, 3);
    }
    for (uint64_t n = 1; n <= 3; n++) {
        enum ar_opts_result r;
        ar_alloc_fail_after(n);
        r = parse(argv, &first, &err, "-t", "3", NULL);
        ar_alloc_fail_after(0);
        assert_int_equal(r, AR_OPTS_BAD);
        assert_non_null(strstr(err.msg, "out of memory"));
        assert_int_equal(V.threads, 2);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_kind_is_stored),
        cmocka_unit_test(positional_argument_and_later_value_wins),
        cmocka_unit_test(positional_arguments_keep_their_order),
        cmocka_unit_test(bad_numbers_name_the_flag),
        cmocka_unit_test(setter_refusal_names_the_flag),
        cmocka_unit_test(missing_values_and_unknown_options),
        cmocka_unit_test(help_lists_every_entry),
        cmocka_unit_test(parses_again_and_survives_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
