/* cli.h - shared by the `autoreply` subcommands: argument parsing helpers and the
 * subcommand entry points. Only cli/ prints usage or exits. */
#ifndef AR_CLI_H
#define AR_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Each returns the process exit status (0 ok, 1 runtime failure, 2 usage error). */
int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_check_fixtures(int argc, char **argv);

/* Prints "autoreply: <msg>" on stderr (one line). */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Strict number parsing for flags: whole string, in range; on failure print an error naming
 * the flag and return false. */
bool cli_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_f64(const char *flag, const char *s, double lo, double hi, double *out);
/* Returns argv[*i + 1] and advances *i, or prints "<flag> needs a value" and returns NULL. */
const char *cli_value(int argc, char **argv, int *i);

#endif
