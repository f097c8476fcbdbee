/* options_test.c - every command's options as a user meets them: --help (exit 0, a usage line
 * and the options, from the command's table), a bad number or an unknown option (exit 2, one
 * line naming it), and the serve flags the shipped systemd unit and fleet.sh rely on. Nothing
 * here loads a model: a line that ends in --help is checked whole and then only answered. */
#include "harness/harness.h"

#include <stdbool.h>

#include "harness/process.h"

#define RUN(...)                                                                                   \
    th_run_exec(th_bin_path(), (char *const[]){"autoreply", __VA_ARGS__, NULL}, NULL, false)
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* A command, an option of it that takes a whole number, and a value out of its range. */
static const struct {
    char *cmd, *int_flag, *too_big;
} COMMANDS[] = {
    {"serve", "--port", "65536"},     {"generate", "--threads", "257"},
    {"reply", "--rating", "6"},       {"batch", "--threads", "257"},
    {"bench", "--reps", "101"},       {"inspect", NULL, NULL},
    {"quantize", "--threads", "257"}, {"gen-model", "--n-layer", "257"},
    {"tokenize", NULL, NULL},         {"check-fixtures", "--threads", "257"},
};

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

/* Exit 2, nothing on stdout, one line on stderr holding want1 (and want2 when given). */
static void expect_refusal(struct th_run *r, const char *what, const char *want1, const char *want2)
{
    if (r->status != 2 || count_lines(r->err) != 1 || !strstr(r->err, want1) ||
        (want2 && !strstr(r->err, want2)) || r->out[0])
        fail_msg("%s: status %d, stdout '%s', stderr '%s' (want '%s' %s)", what, r->status, r->out,
                 r->err, want1, want2 ? want2 : "");
}

static void every_command_answers_help(void **state)
{
    (void)state;
    for (size_t i = 0; i < COUNT(COMMANDS); i++) {
        char *cmd = COMMANDS[i].cmd;
        char usage[64];
        struct th_run r = RUN(cmd, "--help");
        struct th_run h = RUN(cmd, "-h");
        snprintf(usage, sizeof(usage), "usage: autoreply %s", cmd);
        if (r.status != 0 || strncmp(r.out, usage, strlen(usage)) ||
            !strstr(r.out, "  -h, --help ") || r.err[0])
            fail_msg("%s --help: status %d, stdout '%s', stderr '%s'", cmd, r.status, r.out, r.err);
        assert_int_equal(h.status, 0);
        assert_string_equal(h.out, r.out);
        if (COMMANDS[i].int_flag && !strstr(r.out, COMMANDS[i].int_flag))
            fail_msg("%s --help does not list %s:\n%s", cmd, COMMANDS[i].int_flag, r.out);
        th_run_free(&r);
        th_run_free(&h);
    }
}

static void bad_values_and_unknown_options_are_one_line(void **state)
{
    (void)state;
    for (size_t i = 0; i < COUNT(COMMANDS); i++) {
        char *cmd = COMMANDS[i].cmd, *flag = COMMANDS[i].int_flag;
        char what[128];
        struct th_run r = RUN(cmd, "--no-such-option");
        snprintf(what, sizeof(what), "%s --no-such-option", cmd);
        expect_refusal(&r, what, "unknown option '--no-such-option'", cmd);
        th_run_free(&r);
        if (!flag)
            continue;
        r = RUN(cmd, flag, "many");
        snprintf(what, sizeof(what), "%s %s many", cmd, flag);
        expect_refusal(&r, what, flag, "'many' is not an integer");
        th_run_free(&r);
        r = RUN(cmd, flag, COMMANDS[i].too_big);
        snprintf(what, sizeof(what), "%s %s %s", cmd, flag, COMMANDS[i].too_big);
        expect_refusal(&r, what, flag, "out of range");
        th_run_free(&r);
        r = RUN(cmd, flag);
        snprintf(what, sizeof(what), "%s %s", cmd, flag);
        expect_refusal(&r, what, flag, "needs a value");
        th_run_free(&r);
        /* a bad value refuses the line even when --help follows it */
        r = RUN(cmd, flag, "many", "--help");
        snprintf(what, sizeof(what), "%s %s many --help", cmd, flag);
        expect_refusal(&r, what, flag, "'many' is not an integer");
        th_run_free(&r);
    }
}

/* The serve command line of deploy/systemd/autoreply@.service, its ${VARS} and %i given
 * values, with --help at the end: exit 0 means every flag and value on it was accepted. */
static void the_systemd_units_serve_line_parses(void **state)
{
    char *unit = th_read_file("deploy/systemd/autoreply@.service", NULL), *line, *tok, *save;
    static char prog[] = "autoreply", number[] = "8", word[] = "x://y", help[] = "--help";
    char *argv[64];
    int argc = 0;
    struct th_run r;
    (void)state;
    assert_non_null(unit);
    line = strstr(unit, "ExecStart=");
    assert_non_null(line);
    line = strstr(line, " serve ");
    assert_non_null(line);
    *strstr(line, "\n\n") = '\0'; /* the command ends at the blank line after it */
    argv[argc++] = prog;
    for (tok = strtok_r(line, " \t\\\n", &save); tok && argc < 60;
         tok = strtok_r(NULL, " \t\\\n", &save)) {
        if (!strcmp(tok, "$EXTRA_ARGS"))
            continue;
        if (!strcmp(tok, "${PORT}") || !strcmp(tok, "${THREADS}") || !strcmp(tok, "${MAX_CONNS}"))
            tok = number;
        else if (tok[0] == '$' || strchr(tok, '%'))
            tok = word; /* a name, a path or a URL: a URL-like word does for each */
        argv[argc++] = tok;
    }
    assert_true(argc > 10);
    argv[argc++] = help;
    argv[argc] = NULL;
    r = th_run_exec(th_bin_path(), argv, NULL, false);
    if (r.status != 0)
        fail_msg("the unit's serve line is refused: %s", r.err);
    th_run_free(&r);
    free(unit);
}

/* fleet.sh looks for "--store ", "--cache ", "--queue " and "--instance-name " in serve --help
 * (deploy/fleet.sh FLAG_*) before it starts instances with them. */
static void serve_help_names_the_flags_fleet_sh_looks_for(void **state)
{
    char *fleet = th_read_file("deploy/fleet.sh", NULL);
    struct th_run r = RUN("serve", "--help");
    int n = 0;
    (void)state;
    assert_non_null(fleet);
    assert_int_equal(r.status, 0);
    for (const char *p = strstr(fleet, "\nFLAG_"); p; p = strstr(p + 1, "\nFLAG_")) {
        char flag[64], want[72];
        if (sscanf(p, "\nFLAG_%*[A-Z]=%63s", flag) != 1)
            continue;
        snprintf(want, sizeof(want), "%s ", flag);
        if (!strstr(r.out, want))
            fail_msg("serve --help lacks '%s' (fleet.sh looks for it)", want);
        n++;
    }
    assert_true(n >= 4);
    th_run_free(&r);
    free(fleet);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_command_answers_help),
        cmocka_unit_test(bad_values_and_unknown_options_are_one_line),
        cmocka_unit_test(the_systemd_units_serve_line_parses),
        cmocka_unit_test(serve_help_names_the_flags_fleet_sh_looks_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
