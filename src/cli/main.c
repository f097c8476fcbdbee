/* main.c - the `autoreply` command: dispatches to subcommands. The only place (with the other
 * cli/ files) that prints usage or exits. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "autoreply.h"
#include "base/base.h"
#include "base/opts.h"
#include "cli.h"

void cli_error(const char *fmt, ...)
{
    va_list ap;
    fputs("autoreply: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

bool cli_parse_opts(const struct ar_opts *spec, int argc, char **argv, int *first_arg,
                    int *exit_code)
{
    struct ar_err err = {0};
    switch (ar_opts_parse(spec, argc, argv, first_arg, stdout, &err)) {
    case AR_OPTS_OK:
        return true;
    case AR_OPTS_HELP:
        *exit_code = 0;
        return false;
    case AR_OPTS_BAD:
        break;
    }
    cli_error("%s", err.msg);
    *exit_code = 2;
    return false;
}

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct command commands[] = {
    {"serve", cmd_serve, "start the HTTP server (OpenAI API + review replies)"},
    {"reply", cmd_reply, "answer one review from the command line"},
    {"batch", cmd_batch, "answer a JSONL file of reviews (resumable)"},
    {"generate", cmd_generate, "generate text from a prompt (streams to stdout)"},
    {"tokenize", cmd_tokenize, "show the token ids and pieces of a text"},
    {"inspect", cmd_inspect, "print a GGUF model's metadata and tensors"},
    {"quantize", cmd_quantize, "convert an F32/F16/BF16 model to Q8_0, Q4_0, Q4_K, Q6_K, Q4_K_M"},
    {"gen-model", cmd_gen_model,
     "write a random-weight model of a given shape (tests, benchmarks)"},
    {"bench", cmd_bench, "measure prefill and decode speed against memory bandwidth"},
    {"check-fixtures", cmd_check_fixtures, "check the engine against llama.cpp reference fixtures"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: autoreply <command> [options]   (autoreply <command> --help)\n\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-15s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "  %-15s %s\n", "version", "print the version");
}

int main(int argc, char **argv)
{
    ar_json_use_ar_alloc(); /* before any thread: cJSON allocates through ar_malloc */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("autoreply %s\n", AR_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    cli_error("unknown command '%s' (autoreply --help lists them)", argv[1]);
    return 2;
}
