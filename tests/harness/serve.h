/* serve.h - `autoreply serve` as a child process for tests: started with its output in a log
 * file, ready once the log says so (the port it listens on read from there), stopped with
 * SIGTERM and reaped. */
#ifndef TH_SERVE_H
#define TH_SERVE_H

#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "process.h"

struct th_serve {
    char log[256];
    pid_t pid;
    int port;
};

/* Starts `autoreply serve ARGS...` (args: NULL-terminated, after "serve") with stdout and
 * stderr in log; a log left by an earlier server is removed first, so readiness is never
 * read from it. */
static inline void th_serve_spawn(struct th_serve *s, const char *log, const char *const *args)
{
    const char *argv[64];
    int n = 0;
    snprintf(s->log, sizeof(s->log), "%s", log);
    s->port = 0;
    argv[n++] = "autoreply";
    argv[n++] = "serve";
    for (int i = 0; args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    unlink(s->log);
    s->pid = fork();
    assert_true(s->pid >= 0);
    if (s->pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        int out = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(in, 0);
        dup2(out, 1);
        dup2(out, 2);
        execv(th_bin_path(), (char *const *)(void *)argv);
        _exit(127);
    }
}

/* Waits up to timeout_s for "serve: ready" and the port in "listening on"; false when the
 * process exits first (its log is printed) or time runs out. */
static inline bool th_serve_wait_ready(struct th_serve *s, double timeout_s)
{
    static const char key[] = "listening on http://127.0.0.1:";
    for (int i = 0; i < (int)(timeout_s * 10); i++) {
        char *log = th_read_file(s->log, NULL);
        const char *l = log ? strstr(log, key) : NULL;
        bool ready = log && strstr(log, "serve: ready");
        int st;
        if (l)
            s->port = atoi(l + strlen(key));
        if (ready && s->port > 0) {
            free(log);
            return true;
        }
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            fprintf(stderr, "serve exited early:\n%s\n", log ? log : "");
            free(log);
            s->pid = 0;
            return false;
        }
        free(log);
        usleep(100 * 1000);
    }
    fprintf(stderr, "serve not ready after %.0f s\n", timeout_s);
    return false;
}

/* SIGTERM, then up to 20 s for its graceful stop; returns its exit status (128 + signal when
 * killed by one), -1 when it had to be killed or was not running. */
static inline int th_serve_stop(struct th_serve *s)
{
    int st = 0;
    if (s->pid <= 0)
        return -1;
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 200; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(100 * 1000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return -1;
}

#endif
