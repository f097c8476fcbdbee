/* main.c - the `autoreply` command: subcommands over the library. The only place that
 * prints usage or exits. */
#include <stdio.h>
#include <string.h>

#include "autoreply.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: autoreply <command> [options]\n"
                 "commands: version\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "version") == 0) {
        printf("autoreply %s\n", AR_VERSION);
        return 0;
    }
    fprintf(stderr, "autoreply: unknown command '%s'\n", argv[1]);
    return 2;
}
