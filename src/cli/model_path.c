/* model_path.c - where the bundled demo model is found when no -m is given (reply, batch and
 * serve share it), and the model id a path gives in replies and the API. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli_internal.h"

bool cli_default_model(char *out, size_t size)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        char *slash;
        exe[n] = '\0';
        slash = strrchr(exe, '/');
        if (slash) {
            int k;
            *slash = '\0';
            k = snprintf(out, size, "%s/../models/%s", exe, CLI_DEFAULT_MODEL);
            if (k > 0 && (size_t)k < size && access(out, R_OK) == 0)
                return true;
        }
    }
    snprintf(out, size, "./models/%s", CLI_DEFAULT_MODEL);
    return access(out, R_OK) == 0;
}

char *cli_model_name(const char *path)
{
    const char *b = strrchr(path, '/');
    size_t n;
    b = b ? b + 1 : path;
    n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf"))
        n -= 5;
    return ar_strndup(b, n);
}
