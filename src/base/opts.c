/* opts.c - the table-driven option parser over getopt_long (opts.h): one pass reads and checks
 * every option into a list, a second stores them once the whole command line is good; the
 * help text is laid out from the same table. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "opts.h"

#define HELP_COL 24   /* the help text's column */
#define CODE_HELP 2   /* getopt_long's answer for --help (1 is a positional argument) */
#define CODE_BASE 256 /* ... and for the table's entry i: CODE_BASE + i (above every char) */

/* One option as read: its entry and its checked value. */
struct opt_read {
    const struct ar_opt *o;
    const char *value;
    int64_t i;
    double d;
};

static bool takes_value(enum ar_opt_kind k)
{
    return k != AR_OPT_SECTION && k != AR_OPT_SET && k != AR_OPT_CLEAR && k != AR_OPT_ACTION;
}

/* "--name", else "-x": how errors and setters name an option. */
static void flag_name(const struct ar_opt *o, char *out, size_t size)
{
    if (o->name)
        snprintf(out, size, "--%s", o->name);
    else
        snprintf(out, size, "-%c", o->short_name);
}

bool ar_opts_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out,
                       struct ar_err *err)
{
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        ar_err_set(err, AR_EINVAL, 0, "%s: '%s' is not an integer", flag, s);
        return false;
    }
    if (v < lo || v > hi) {
        ar_err_set(err, AR_EINVAL, 0, "%s: %lld is out of range [%lld, %lld]", flag, v,
                   (long long)lo, (long long)hi);
        return false;
    }
    *out = v;
    return true;
}

bool ar_opts_parse_f64(const char *flag, const char *s, double lo, double hi, double *out,
                       struct ar_err *err)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        ar_err_set(err, AR_EINVAL, 0, "%s: '%s' is not a number", flag, s);
        return false;
    }
    if (v < lo || v > hi) {
        ar_err_set(err, AR_EINVAL, 0, "%s: %g is out of range [%g, %g]", flag, v, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

/* A range bound as an integer (2^63 and above saturate). */
static int64_t bound_i64(double d)
{
    if (d >= 0x1p63)
        return INT64_MAX;
    if (d <= -0x1p63)
        return INT64_MIN;
    return (int64_t)d;
}

/* Checks value for o into r. False after filling err. */
static bool read_value(const struct ar_opt *o, const char *value, struct opt_read *r,
                       struct ar_err *err)
{
    char flag[80];
    bool any = o->lo == 0 && o->hi == 0;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    flag_name(o, flag, sizeof(flag));
    r->o = o;
    r->value = value;
    switch (o->kind) {
    case AR_OPT_INT:
        lo = INT_MIN;
        hi = INT_MAX;
        break;
    case AR_OPT_SIZE:
        lo = 0;
        hi = SIZE_MAX < (uint64_t)INT64_MAX ? (int64_t)SIZE_MAX : INT64_MAX;
        break;
    case AR_OPT_I64:
        break;
    case AR_OPT_DOUBLE:
        return ar_opts_parse_f64(flag, value, any ? -HUGE_VAL : o->lo, any ? HUGE_VAL : o->hi,
                                 &r->d, err);
    default:
        return true; /* strings, flags; a setter checks its own */
    }
    if (!any) {
        lo = AR_MAX(lo, bound_i64(o->lo));
        hi = AR_MIN(hi, bound_i64(o->hi));
    }
    return ar_opts_parse_i64(flag, value, lo, hi, &r->i, err);
}

/* The entry getopt_long's answer c stands for, or NULL. */
static const struct ar_opt *entry_of(const struct ar_opts *spec, int c)
{
    if (c >= CODE_BASE && (size_t)(c - CODE_BASE) < spec->n_opts)
        return &spec->opts[c - CODE_BASE];
    for (size_t i = 0; i < spec->n_opts; i++)
        if (spec->opts[i].kind != AR_OPT_SECTION && spec->opts[i].short_name == c)
            return &spec->opts[i];
    return NULL;
}

/* getopt_long answered '?' (unknown option, or a value for one that takes none) or ':' (no
 * value): the error, naming the option. */
static void bad_option(const struct ar_opts *spec, int c, char **argv, struct ar_err *err)
{
    const struct ar_opt *o = optopt ? entry_of(spec, optopt) : NULL;
    char flag[80];
    if (optopt == CODE_HELP || optopt == 'h') {
        ar_err_set(err, AR_EINVAL, 0, "--help takes no value");
        return;
    }
    if (o) {
        flag_name(o, flag, sizeof(flag));
        if (c == ':')
            ar_err_set(err, AR_EINVAL, 0, "%s needs a value", flag);
        else
            ar_err_set(err, AR_EINVAL, 0, "%s takes no value", flag);
        return;
    }
    if (optopt) /* an unknown short option */
        snprintf(flag, sizeof(flag), "-%c", optopt);
    else /* an unknown (or ambiguous) long option, as given up to any "=VALUE" */
        snprintf(flag, sizeof(flag), "%.*s", (int)strcspn(argv[optind - 1], "="), argv[optind - 1]);
    ar_err_set(err, AR_EINVAL, 0, "%s: unknown option '%s' (autoreply %s --help)", spec->cmd, flag,
               spec->cmd);
}

/* Stores what r read. False after filling err (a setter refused the value). */
static bool store(const struct ar_opts *spec, const struct opt_read *r, struct ar_err *err)
{
    const struct ar_opt *o = r->o;
    char flag[80];
    switch (o->kind) {
    case AR_OPT_SET:
        *(bool *)o->target = true;
        break;
    case AR_OPT_CLEAR:
        *(bool *)o->target = false;
        break;
    case AR_OPT_INT:
        *(int *)o->target = (int)r->i;
        break;
    case AR_OPT_I64:
        *(int64_t *)o->target = r->i;
        break;
    case AR_OPT_SIZE:
        *(size_t *)o->target = (size_t)r->i;
        break;
    case AR_OPT_DOUBLE:
        *(double *)o->target = r->d;
        break;
    case AR_OPT_STRING:
        *(const char **)o->target = r->value;
        break;
    case AR_OPT_CALL:
    case AR_OPT_ACTION:
        flag_name(o, flag, sizeof(flag));
        if (!o->set(spec->ctx, flag, r->value, err)) {
            if (!err || !err->msg[0])
                ar_err_set(err, AR_EINVAL, 0, "%s: bad value '%s'", flag, r->value);
            return false;
        }
        break;
    case AR_OPT_SECTION:
        break;
    }
    return true;
}

enum ar_opts_result ar_opts_parse(const struct ar_opts *spec, int argc, char **argv, int *first_arg,
                                  FILE *help_out, struct ar_err *err)
{
    struct option *longs = ar_calloc(spec->n_opts + 2, sizeof(*longs));
    char *shorts = ar_malloc(2 * spec->n_opts + 5);
    struct opt_read *reads = ar_calloc((size_t)(argc > 0 ? argc : 1), sizeof(*reads));
    char **pos = ar_calloc((size_t)(argc > 0 ? argc : 1), sizeof(*pos));
    enum ar_opts_result res = AR_OPTS_BAD;
    size_t n_long = 0, n_short = 0, n_reads = 0;
    int n_pos = 0;
    bool help = false;
    int c;
    *first_arg = argc;
    if (!longs || !shorts || !reads || !pos) {
        ar_err_set(err, AR_ENOMEM, 0, "%s: out of memory", spec->cmd);
        goto done;
    }
    /* '-': positional arguments answer 1 in their place (whatever POSIXLY_CORRECT says), ':':
     * a missing value answers ':', an unknown option '?' */
    shorts[n_short++] = '-';
    shorts[n_short++] = ':';
    shorts[n_short++] = 'h';
    for (size_t i = 0; i < spec->n_opts; i++) {
        const struct ar_opt *o = &spec->opts[i];
        if (o->kind == AR_OPT_SECTION)
            continue;
        if (o->name)
            longs[n_long++] =
                (struct option){o->name, takes_value(o->kind) ? required_argument : no_argument,
                                NULL, CODE_BASE + (int)i};
        if (o->short_name) {
            shorts[n_short++] = o->short_name;
            if (takes_value(o->kind))
                shorts[n_short++] = ':';
        }
    }
    shorts[n_short] = '\0';
    longs[n_long++] = (struct option){"help", no_argument, NULL, CODE_HELP};
    opterr = 0;
    optind = 0; /* glibc: start afresh, also after an earlier parse */
    while ((c = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        const struct ar_opt *o;
        if (c == '?' || c == ':') {
            bad_option(spec, c, argv, err);
            goto done;
        }
        if (c == 'h' || c == CODE_HELP) {
            help = true;
            continue;
        }
        if (c == 1) {
            pos[n_pos++] = optarg;
            continue;
        }
        if (!(o = entry_of(spec, c)) || !read_value(o, optarg, &reads[n_reads], err))
            goto done;
        n_reads++;
    }
    while (optind < argc) /* after "--" */
        pos[n_pos++] = argv[optind++];
    if (help) {
        ar_opts_help(spec, help_out);
        res = AR_OPTS_HELP;
        goto done;
    }
    if (spec->max_args >= 0 && n_pos > spec->max_args) {
        ar_err_set(err, AR_EINVAL, 0, "%s: unexpected argument '%s' (autoreply %s --help)",
                   spec->cmd, pos[spec->max_args], spec->cmd);
        goto done;
    }
    for (size_t i = 0; i < n_reads; i++)
        if (!store(spec, &reads[i], err))
            goto done;
    for (int i = 0; i < n_pos; i++) /* the positional arguments last, in their order */
        argv[argc - n_pos + i] = pos[i];
    *first_arg = argc - n_pos;
    res = AR_OPTS_OK;
done:
    ar_free(longs);
    ar_free(shorts);
    ar_free(reads);
    ar_free(pos);
    return res;
}

/* The default o shows in --help into out ("" for none). */
static void default_of(const struct ar_opt *o, char *out, size_t size)
{
    out[0] = '\0';
    if (o->def) {
        snprintf(out, size, "%s", o->def);
        return;
    }
    if (!o->target)
        return;
    switch (o->kind) {
    case AR_OPT_INT:
        snprintf(out, size, "%d", *(const int *)o->target);
        break;
    case AR_OPT_I64:
        snprintf(out, size, "%lld", (long long)*(const int64_t *)o->target);
        break;
    case AR_OPT_SIZE:
        snprintf(out, size, "%zu", *(const size_t *)o->target);
        break;
    case AR_OPT_DOUBLE:
        snprintf(out, size, "%g", *(const double *)o->target);
        break;
    case AR_OPT_STRING:
        if (*(const char *const *)o->target)
            snprintf(out, size, "%s", *(const char *const *)o->target);
        break;
    default:
        break;
    }
}

/* "  -x, --name ARG" padded to HELP_COL (or on a line of its own when longer), then the help's
 * lines, the default in parentheses after the last. */
static void help_entry(FILE *out, const char *left, const char *help, const char *def)
{
    int n = fprintf(out, "%s", left);
    const char *p = help ? help : "";
    if (n >= HELP_COL)
        fprintf(out, "\n%*s", HELP_COL, "");
    else
        fprintf(out, "%*s", HELP_COL - n, "");
    for (;;) {
        size_t len = strcspn(p, "\n");
        fwrite(p, 1, len, out);
        p += len;
        if (!*p)
            break;
        p++;
        fprintf(out, "\n%*s", HELP_COL, "");
    }
    if (def[0])
        fprintf(out, "%s(default: %s)", help && help[0] ? " " : "", def);
    fputc('\n', out);
}

void ar_opts_help(const struct ar_opts *spec, FILE *out)
{
    char left[128], def[128];
    fprintf(out, "usage: autoreply %s\n", spec->usage);
    for (size_t i = 0; i < spec->n_opts; i++) {
        const struct ar_opt *o = &spec->opts[i];
        int n = 0;
        if (o->kind == AR_OPT_SECTION) {
            fprintf(out, "%s\n", o->help);
            continue;
        }
        n += snprintf(left + n, sizeof(left) - (size_t)n, "  ");
        if (o->short_name)
            n += snprintf(left + n, sizeof(left) - (size_t)n, "-%c%s", o->short_name,
                          o->name ? ", " : "");
        if (o->name)
            n += snprintf(left + n, sizeof(left) - (size_t)n, "--%s", o->name);
        if (takes_value(o->kind) && (size_t)n < sizeof(left))
            snprintf(left + n, sizeof(left) - (size_t)n, " %s", o->arg ? o->arg : "VALUE");
        default_of(o, def, sizeof(def));
        help_entry(out, left, o->help, def);
    }
    help_entry(out, "  -h, --help", "this help", "");
    if (spec->about)
        fprintf(out, "%s\n", spec->about);
}
