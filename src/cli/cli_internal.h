/* cli_internal.h - helpers shared by the cli/ files: a single-sequence model runner, fixture
 * file discovery, JSON loading. */
#ifndef AR_CLI_INTERNAL_H
#define AR_CLI_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "base/types.h"

struct model;
struct cli_runner;

/* Loads a model and sets up one sequence with a KV cache of n_ctx tokens (kv_type F16/F32),
 * n_threads threads. */
enum ar_status cli_runner_open(const char *path, int n_threads, enum ar_type kv_type, int n_ctx,
                               struct cli_runner **out, struct ar_err *err);
void cli_runner_close(struct cli_runner *r);
int cli_runner_n_vocab(const struct cli_runner *r);
int cli_runner_n_ctx(const struct cli_runner *r);
int cli_runner_n_past(const struct cli_runner *r);
const struct model *cli_runner_model(const struct cli_runner *r);
/* Clears the sequence and runs the prompt as one batch. *logits (borrowed, valid until the next
 * call) gets n_vocab floats for the last token, or for every token when all is true. */
enum ar_status cli_runner_prefill(struct cli_runner *r, const int32_t *tokens, int n, bool all,
                                  float **logits, struct ar_err *err);
/* Appends one token; *logits gets its n_vocab logits. */
enum ar_status cli_runner_decode(struct cli_runner *r, int32_t token, float **logits,
                                 struct ar_err *err);

int32_t cli_argmax(const float *x, int n);

cJSON *cli_read_json(const char *path);
/* Whole file as a NUL-terminated string (free()), or NULL. */
char *cli_read_text(const char *path);
int cli_list_dir(const char *dir, const char *suffix, char ***out);
void cli_free_names(char **names, int n);

/* The bundled demo model (model_path.c): <exe dir>/../models/CLI_DEFAULT_MODEL, then
 * ./models/CLI_DEFAULT_MODEL; the first readable one into out. False when neither is. */
#define CLI_DEFAULT_MODEL "autoreply-demo-q8_0.gguf"
bool cli_default_model(char *out, size_t size);
/* The model id of a path: its file name without ".gguf" (ar_free), NULL when out of memory. */
char *cli_model_name(const char *path);

/* Tokenizer part of check-fixtures (cmd_tokenize.c); returns the number of checks made. */
int cli_check_tokenizer_fixtures(const char *dir, int *n_fail);

#endif
