/* process.c - the standard process_* metrics (CPU time, memory, descriptors, start time),
 * read from Linux's /proc/self at every scrape and rendered by a registry collector under the
 * names and types Prometheus client libraries use, so fleet dashboards and alerts written for
 * any exporter work unchanged. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/base.h"
#include "metrics.h"
#include "metrics_internal.h"

/* ---- reading /proc ------------------------------------------------------------------------ */

/* Reads the whole of a small /proc file into buf (NUL-terminated); false when it cannot. */
static bool read_small(const char *path, char *buf, size_t size, size_t *len)
{
    FILE *f = fopen(path, "r");
    size_t n;
    if (!f)
        return false;
    n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return n > 0;
}

/* Fields 14 (utime), 15 (stime), 22 (starttime, clock ticks after boot), 23 (vsize, bytes)
 * and 24 (rss, pages) of /proc/self/stat. The second field is the command name in
 * parentheses and may itself hold spaces and parentheses, so fields are counted from the
 * last ')'. */
static enum ar_status read_stat(uint64_t *utime, uint64_t *stime, uint64_t *start, uint64_t *vsize,
                                uint64_t *rss, struct ar_err *err)
{
    char buf[2048];
    size_t len;
    const char *p;
    if (!read_small("/proc/self/stat", buf, sizeof(buf), &len))
        return ar_err_set(err, AR_EIO, 0, "cannot read /proc/self/stat");
    if (!(p = strrchr(buf, ')')) || p[1] != ' ')
        return ar_err_set(err, AR_EFORMAT, 0, "/proc/self/stat: no command name");
    p += 2;
    for (int field = 3; field <= 24; field++) {
        const char *tok = p;
        uint64_t *dst = field == 14   ? utime
                        : field == 15 ? stime
                        : field == 22 ? start
                        : field == 23 ? vsize
                        : field == 24 ? rss
                                      : NULL;
        while (*p && *p != ' ' && *p != '\n')
            p++;
        if (p == tok)
            return ar_err_set(err, AR_EFORMAT, (uint64_t)(tok - buf),
                              "/proc/self/stat: field %d missing", field);
        if (dst) {
            char *end;
            errno = 0;
            *dst = strtoull(tok, &end, 10);
            if (end != p || errno || *tok == '-')
                return ar_err_set(err, AR_EFORMAT, (uint64_t)(tok - buf),
                                  "/proc/self/stat: field %d is not a count", field);
        }
        if (*p == ' ')
            p++;
    }
    return AR_OK;
}

/* The "btime" line of /proc/stat: when the system booted, seconds since the epoch. Read line by
 * line: the "intr" line before it is tens of kilobytes on large machines. */
static enum ar_status read_boot_time(uint64_t *btime, struct ar_err *err)
{
    FILE *f = fopen("/proc/stat", "r");
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    if (!f)
        return ar_err_set(err, AR_EIO, 0, "cannot read /proc/stat");
    while (!found && getline(&line, &cap, f) > 0) {
        char *end;
        if (strncmp(line, "btime ", 6) != 0)
            continue;
        *btime = strtoull(line + 6, &end, 10);
        found = end != line + 6;
    }
    free(line);
    fclose(f);
    return found ? AR_OK : ar_err_set(err, AR_EFORMAT, 0, "/proc/stat: no btime line");
}

/* Entries of /proc/self/fd, less the one the listing itself holds open. */
static enum ar_status count_fds(double *out, struct ar_err *err)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int self, n = 0;
    if (!d)
        return ar_err_set(err, AR_EIO, 0, "cannot list /proc/self/fd");
    self = dirfd(d);
    while ((e = readdir(d)) != NULL) {
        char *end;
        long fd;
        if (e->d_name[0] == '.')
            continue;
        fd = strtol(e->d_name, &end, 10);
        if (*end == '\0' && fd != self)
            n++;
    }
    closedir(d);
    *out = (double)n;
    return AR_OK;
}

enum ar_status metrics_process_read(struct metrics_process *out, struct ar_err *err)
{
    uint64_t utime = 0, stime = 0, start = 0, vsize = 0, rss = 0, btime = 0;
    long ticks = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    struct rlimit rl;
    enum ar_status st;
    if (!out)
        return AR_EINVAL;
    if (ticks <= 0 || page <= 0)
        return ar_err_set(err, AR_EIO, 0, "sysconf: no clock tick or page size");
    if ((st = read_stat(&utime, &stime, &start, &vsize, &rss, err)) != AR_OK ||
        (st = read_boot_time(&btime, err)) != AR_OK ||
        (st = count_fds(&out->open_fds, err)) != AR_OK)
        return st;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return ar_err_set(err, AR_EIO, 0, "getrlimit(RLIMIT_NOFILE) failed");
    out->cpu_seconds = (double)(utime + stime) / (double)ticks;
    out->resident_bytes = (double)rss * (double)page;
    out->virtual_bytes = (double)vsize;
    out->max_fds = rl.rlim_cur == RLIM_INFINITY ? (double)INFINITY : (double)rl.rlim_cur;
    out->start_time_s = (double)btime + (double)start / (double)ticks;
    return AR_OK;
}

/* ---- the collector ------------------------------------------------------------------------- */

static void family(struct ar_buf *b, const char *name, const char *type, const char *help, double v)
{
    char num[40];
    metrics_format_double(num, sizeof(num), v);
    ar_buf_puts(b, "# HELP ");
    ar_buf_puts(b, name);
    ar_buf_puts(b, " ");
    ar_buf_puts(b, help);
    ar_buf_puts(b, "\n# TYPE ");
    ar_buf_puts(b, name);
    ar_buf_puts(b, " ");
    ar_buf_puts(b, type);
    ar_buf_puts(b, "\n");
    ar_buf_puts(b, name);
    ar_buf_puts(b, " ");
    ar_buf_puts(b, num);
    ar_buf_puts(b, "\n");
}

static void collect_process(struct ar_buf *b, void *user)
{
    struct metrics_process p;
    struct ar_err err = {0};
    (void)user;
    if (metrics_process_read(&p, &err) != AR_OK) {
        AR_DEBUG("metrics: process metrics left out: %s", err.msg);
        return;
    }
    family(b, "process_cpu_seconds_total", "counter",
           "User and system CPU time of the process, in seconds.", p.cpu_seconds);
    family(b, "process_resident_memory_bytes", "gauge", "Resident memory size, in bytes.",
           p.resident_bytes);
    family(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size, in bytes.",
           p.virtual_bytes);
    family(b, "process_open_fds", "gauge", "Open file descriptors.", p.open_fds);
    family(b, "process_max_fds", "gauge", "Limit on open file descriptors.", p.max_fds);
    family(b, "process_start_time_seconds", "gauge",
           "When the process started, in seconds since the Unix epoch.", p.start_time_s);
}

enum ar_status metrics_process_register(struct metrics_registry *reg)
{
    return metrics_collector_add(reg, collect_process, NULL);
}
