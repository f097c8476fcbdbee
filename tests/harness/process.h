/* process.h - running programs from a test: the autoreply binary's path, a command run to its
 * end with its exit status, stdout and stderr captured, and a free loopback port for a server
 * the test starts. Used by the tests that drive binaries (cli, deploy, http, promtool.h). */
#ifndef AR_TEST_PROCESS_H
#define AR_TEST_PROCESS_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/harness.h"

/* ./bin/autoreply, or $AR_BIN (tests/run.sh points it at the build being tested). */
static inline const char *th_bin_path(void)
{
    const char *b = getenv("AR_BIN");
    return b && *b ? b : "./bin/autoreply";
}

struct th_run {
    int status; /* exit code, or 128 + signal */
    char *out;  /* stdout (and stderr, when merged), NUL-terminated */
    char *err;  /* stderr; "" when merged into out */
};

static inline void th_run_free(struct th_run *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof(*r));
}

/* Runs path with argv (NULL-terminated; argv[0] is only its name) to its end, input on its
 * stdin (NULL: none), stdout and stderr captured in files; with merge, stderr goes with
 * stdout into out. Exit status 127: path could not be run. */
static inline struct th_run th_run_exec(const char *path, char *const argv[], const char *input,
                                        bool merge)
{
    struct th_run r = {0};
    char in_path[] = "/tmp/ar_run_in_XXXXXX", out_path[] = "/tmp/ar_run_out_XXXXXX",
         err_path[] = "/tmp/ar_run_err_XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path), fe = merge ? fo : mkstemp(err_path), st = 0;
    pid_t pid;
    assert_true(fi >= 0 && fo >= 0 && fe >= 0);
    if (input) {
        size_t len = strlen(input);
        assert_true(write(fi, input, len) == (ssize_t)len);
    }
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        lseek(fi, 0, SEEK_SET);
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(path, argv);
        _exit(127);
    }
    waitpid(pid, &st, 0);
    close(fi);
    close(fo);
    if (!merge)
        close(fe);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = th_read_file(out_path, NULL);
    r.err = merge ? strdup("") : th_read_file(err_path, NULL);
    unlink(in_path);
    unlink(out_path);
    if (!merge)
        unlink(err_path);
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

/* Runs `sh -c cmd` (formatted), stdout and stderr captured, stdin empty. */
static inline struct th_run th_sh_run(const char *fmt, ...)
{
    char cmd[4096];
    char *argv[] = {"sh", "-c", cmd, NULL};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    return th_run_exec("/bin/sh", argv, NULL, false);
}

/* A loopback TCP port nobody listens on right now (the kernel's pick, released again). */
static inline int th_free_port(void)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;
    assert_true(fd >= 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

#endif
