/* opts.h - command-line options from one table: getopt_long reads them, values are checked
 * (numbers whole or finite and in range) before anything is stored, and --help is written
 * from the same table, so that a flag, its check and its help cannot drift apart. The cli/
 * commands each declare such a table. */
#ifndef AR_BASE_OPTS_H
#define AR_BASE_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "autoreply.h"

enum ar_opt_kind {
    AR_OPT_SECTION, /* no option: a heading line in --help (help holds it, name is NULL) */
    AR_OPT_SET,     /* no value: *(bool *)target = true */
    AR_OPT_CLEAR,   /* no value: *(bool *)target = false ("--no-..." flags) */
    AR_OPT_INT,     /* int */
    AR_OPT_I64,     /* int64_t */
    AR_OPT_SIZE,    /* size_t (a whole number >= 0) */
    AR_OPT_DOUBLE,  /* double (finite) */
    AR_OPT_STRING,  /* const char *, borrowed from argv */
    AR_OPT_CALL,    /* the value (a string) goes to set(), which checks and stores it */
    AR_OPT_ACTION,  /* no value: set() is called with value NULL (flags that do more) */
};

/* The setter of an AR_OPT_CALL or AR_OPT_ACTION entry: flag is the option's name as --help
 * shows it ("--cache-mb"). False after filling err (one line naming the flag) for a bad
 * value. */
typedef bool (*ar_opt_set_fn)(void *ctx, const char *flag, const char *value, struct ar_err *err);

struct ar_opt {
    const char *name; /* long name without "--"; NULL for AR_OPT_SECTION */
    char short_name;  /* 0: none */
    enum ar_opt_kind kind;
    void *target;      /* what the kind names; NULL for SECTION and CALL */
    double lo, hi;     /* numbers: the accepted range, both ends in; 0 and 0: the type's */
    const char *arg;   /* the value's name in --help ("N", "FILE"); NULL: "VALUE" */
    const char *help;  /* may hold '\n' for more lines */
    const char *def;   /* the default as --help shows it; NULL: the target's value before
                          parsing (numbers, and strings that are set); "": none shown */
    ar_opt_set_fn set; /* AR_OPT_CALL */
};

struct ar_opts {
    const char *cmd;   /* "serve": in errors ("serve: unknown option") and the usage line */
    const char *usage; /* what follows "usage: autoreply " ("serve [-m MODEL] [options]") */
    const char *about; /* more text after the options (may be NULL), '\n'-separated lines */
    const struct ar_opt *opts;
    size_t n_opts;
    int max_args; /* positional arguments allowed after the options (-1: any number) */
    void *ctx;    /* handed to the setters */
};

enum ar_opts_result {
    AR_OPTS_OK,   /* every option stored; positional arguments from argv[*first_arg] */
    AR_OPTS_HELP, /* -h or --help: the help went to help_out, nothing was stored */
    AR_OPTS_BAD,  /* err holds one line naming the flag (exit status 2) */
};

/* Parses argv[1..argc) (argv[0] is the command's name) against spec: long options as "--name
 * VALUE" or "--name=VALUE", short ones as "-x VALUE" or "-xVALUE"; positional arguments may
 * come between options or after "--" (on success argv holds them last, in their order, from
 * argv[*first_arg]; the options' entries before them are overwritten). Each value is
 * checked first; the targets are written only when the whole line is good (in the order
 * given; a later value of the same option wins), the setters called in that order too (so a
 * setter's refusal comes after the options before it were stored). -h and --help are built
 * in. Uses getopt's globals: not thread-safe. */
enum ar_opts_result ar_opts_parse(const struct ar_opts *spec, int argc, char **argv, int *first_arg,
                                  FILE *help_out, struct ar_err *err);

/* Writes the usage line, one line (or more) per option with its value's name, help and
 * default, the sections' headings, and spec->about. */
void ar_opts_help(const struct ar_opts *spec, FILE *out);

/* The checks the numeric kinds use, for setters: the whole string a number in [lo, hi]. False
 * after filling err ("--port: 'x' is not an integer", "--port: 70000 is out of range [0,
 * 65535]"). */
bool ar_opts_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out,
                       struct ar_err *err);
bool ar_opts_parse_f64(const char *flag, const char *s, double lo, double hi, double *out,
                       struct ar_err *err);

#endif
