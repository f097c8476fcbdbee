/* cli.h - shared by the `autoreply` subcommands: option parsing (over base/opts.h) and the
 * subcommand entry points. Only cli/ prints usage or exits. */
#ifndef AR_CLI_H
#define AR_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Each returns the process exit status (0 ok, 1 runtime failure, 2 usage error). */
int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_check_fixtures(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_reply(int argc, char **argv);
int cmd_batch(int argc, char **argv);

/* The review-reply service on a server (cmd_reply.c wires it: profiles, store, cache, service;
 * the server's review routes, server_reviews_attach, answer over it): attach before
 * server_start, give it the engine once the model is loaded (this starts the job runner and
 * resumes unfinished jobs), detach after server_stop and before engine_destroy and
 * server_destroy. */
struct server;
struct engine;
struct tokenizer;
struct cli_reply;
struct cli_reply_opts {
    const char *shops_file; /* shop profiles (JSON) or NULL: the built-in default */
    const char *data_dir;   /* replies.db lives here; created (with parents) if missing;
                               NULL: ./var */
    bool reply_cache;       /* false: every review not yet stored goes to the model */
    size_t max_job_body;    /* POST /v1/jobs body limit, bytes; 0: 64 MiB */
    int64_t job_max_open;   /* queued or running jobs per key; 0: the server's default */
    int64_t job_max_bytes;  /* stored job bytes per key; 0: the server's default */
    const char *store_url;  /* postgres://... or a SQLite file; NULL: <data_dir>/replies.db */
    const char *cache_url;  /* redis://... (L2 behind the in-process cache); NULL: in process */
    const char *queue_url;  /* amqp://... (job items); NULL: in process */
    int job_slots;          /* job lines answered at once (the queue prefetch): the engine's
                               sequences; 0: the reply service's default */
    /* Per traffic class ([0] interactive, [1] bulk: enum cache_class), each its own cache:
     * in-process budget in MiB, 0: none (with cache_url: Redis alone), < 0: the default
     * (interactive 64, bulk 16); TTL in seconds, 0: never, < 0: the default (3600). */
    int64_t cache_mb[2];
    double cache_ttl_s[2];
};
/* Returns 0, or 1 after printing why it failed. */
int cli_reply_attach(struct server *srv, const struct cli_reply_opts *o, struct cli_reply **out);
void cli_reply_set_engine(struct cli_reply *cr, struct engine *e, const struct tokenizer *tok,
                          const char *model_name);
void cli_reply_detach(struct cli_reply *cr);

/* Prints "autoreply: <msg>" on stderr (one line). */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A command's options from its table (base/opts.h): true when the command goes on (its
 * positional arguments from argv[*first_arg]); else false with *exit_code 0 after --help
 * (printed on stdout) or 2 after printing the error. */
struct ar_opts;
bool cli_parse_opts(const struct ar_opts *spec, int argc, char **argv, int *first_arg,
                    int *exit_code);

#endif
