/* batch_test.c - `autoreply batch` as a user runs it, on the demo model: results reach the -o
 * file while the batch still runs, a batch killed with SIGKILL resumes with every input line
 * exactly once, "id" and "review_id" both name a review (two different ones are a per-line
 * error, as is every other bad line), progress on stderr (lines without a terminal, a bar
 * redrawn with \r on one), and a file that is not a job leaves no output behind. */
#include "harness/harness.h"

#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "harness/process.h"

#define DEMO "models/autoreply-demo-q8_0.gguf"
/* Runs the binary with the arguments to its end, stdout and stderr captured. */
#define RUN(...)                                                                                   \
    th_run_exec(th_bin_path(), (char *const[]){"autoreply", __VA_ARGS__, NULL}, NULL, false)
#define BIG_LINES 240 /* a few seconds of work: long enough to look inside while it runs */

/* A scratch folder: the input, the results, the data directory. */
struct scratch {
    char dir[64];
    char in[128], out[128], data[128], err[128];
};

static void scratch_make(struct scratch *s)
{
    snprintf(s->dir, sizeof(s->dir), "/tmp/ar_batch_XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->in, sizeof(s->in), "%s/in.jsonl", s->dir);
    snprintf(s->out, sizeof(s->out), "%s/out.jsonl", s->dir);
    snprintf(s->data, sizeof(s->data), "%s/var", s->dir);
    snprintf(s->err, sizeof(s->err), "%s/stderr", s->dir);
}

static void scratch_remove(struct scratch *s)
{
    struct th_run r = th_sh_run("rm -rf '%s'", s->dir);
    th_run_free(&r);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* The first n lines of shared/data/reviews-eval.jsonl (real reviews with an "id") as the input;
 * their ids in ids[0..n) (owned by the returned array, cJSON_Delete). */
static cJSON *write_eval_input(const char *path, int n)
{
    char shared[512];
    char *data = th_read_file(th_shared_path(shared, sizeof(shared), "data/reviews-eval.jsonl"),
                              NULL);
    char *p = data, *end;
    cJSON *ids = cJSON_CreateArray();
    FILE *f = fopen(path, "w");
    assert_non_null(data);
    assert_non_null(f);
    for (int i = 0; i < n; i++, p = end + 1) {
        cJSON *j;
        assert_non_null(end = strchr(p, '\n'));
        *end = '\0';
        assert_non_null(j = cJSON_Parse(p));
        assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "id")));
        cJSON_AddItemToArray(ids, cJSON_CreateString(cJSON_GetObjectItem(j, "id")->valuestring));
        cJSON_Delete(j);
        fprintf(f, "%s\n", p);
    }
    assert_int_equal(fclose(f), 0);
    free(data);
    return ids;
}

/* The results file as parsed lines, indexed by their "line" (1-based; NULL where none): every
 * line must be a whole JSON object carrying a "line" in 1..n_in, none twice. *count: lines. */
static cJSON **read_results(const char *path, int n_in, int *count)
{
    char *text = th_read_file(path, NULL), *p, *nl;
    cJSON **by_line = calloc((size_t)n_in + 1, sizeof(*by_line));
    assert_non_null(text);
    assert_non_null(by_line);
    *count = 0;
    for (p = text; *p; p = nl + 1) {
        cJSON *j, *line;
        int k;
        if (!(nl = strchr(p, '\n')))
            fail_msg("%s ends in a partial line: %.80s", path, p);
        *nl = '\0';
        if (!(j = cJSON_Parse(p)) || !cJSON_IsObject(j))
            fail_msg("%s: not a JSON object: %.120s", path, p);
        line = cJSON_GetObjectItem(j, "line");
        assert_true(cJSON_IsNumber(line));
        k = line->valueint;
        assert_true(k >= 1 && k <= n_in);
        if (by_line[k])
            fail_msg("%s: line %d appears twice", path, k);
        by_line[k] = j;
        ++*count;
    }
    free(text);
    return by_line;
}

static void free_results(cJSON **by_line, int n_in)
{
    for (int i = 0; i <= n_in; i++)
        cJSON_Delete(by_line[i]);
    free(by_line);
}

static const char *str_field(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItem(j, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Every result present is the reply to its input line: that line's id, a non-empty reply. */
static void check_replies(cJSON **by_line, const cJSON *ids)
{
    int n = cJSON_GetArraySize(ids);
    for (int k = 1; k <= n; k++) {
        const char *id, *reply;
        if (!by_line[k])
            continue;
        id = str_field(by_line[k], "review_id");
        reply = str_field(by_line[k], "reply");
        if (!id || strcmp(id, cJSON_GetArrayItem(ids, k - 1)->valuestring) != 0 || !reply ||
            !*reply)
            fail_msg("line %d: %s", k, cJSON_PrintUnformatted(by_line[k]));
    }
}

/* Starts `autoreply batch IN -o OUT --data-dir DATA` with stderr in s->err. */
static pid_t start_batch(const struct scratch *s)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int e = open(s->err, O_WRONLY | O_CREAT | O_TRUNC, 0600), nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(e, 2);
        execl(th_bin_path(), "autoreply", "batch", s->in, "-o", s->out, "--data-dir", s->data,
              "-m", DEMO, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Lines in a file now (0 when it does not exist yet). */
static int file_lines(const char *path)
{
    char *t = th_read_file(path, NULL);
    int n = 0;
    for (char *p = t; p && *p; p++)
        n += *p == '\n';
    free(t);
    return n;
}

/* Waits until the running batch has written at least n lines; fails if it ends first. */
static void wait_for_lines(pid_t pid, const char *out, int n)
{
    double until = ar_time_s() + 120;
    int st;
    while (file_lines(out) < n) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            fail_msg("the batch ended (status %d) before %d result lines were in %s", st, n, out);
        if (ar_time_s() > until)
            fail_msg("no %d result lines in %s after 120 s", n, out);
        th_sleep_s(0.005);
    }
}

/* The last line of a text ("" when empty). */
static const char *last_line(const char *text, char *buf, size_t size)
{
    size_t n = strlen(text);
    const char *b;
    while (n && text[n - 1] == '\n')
        n--;
    b = text + n;
    while (b > text && b[-1] != '\n')
        b--;
    snprintf(buf, size, "%.*s", (int)(text + n - b), b);
    return buf;
}

static void results_reach_the_file_while_the_batch_runs(void **state)
{
    struct scratch s;
    cJSON *ids, **res;
    char *err, last[256], want[64];
    pid_t pid;
    int st, n;
    (void)state;
    scratch_make(&s);
    ids = write_eval_input(s.in, BIG_LINES);
    pid = start_batch(&s);
    wait_for_lines(pid, s.out, 1);
    /* frozen mid-run: what is in the file is whole, answered lines, and not all of them */
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
    assert_true(WIFSTOPPED(st));
    res = read_results(s.out, BIG_LINES, &n);
    assert_true(n >= 1 && n < BIG_LINES);
    check_replies(res, ids);
    free_results(res, BIG_LINES);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    res = read_results(s.out, BIG_LINES, &n);
    assert_int_equal(n, BIG_LINES);
    check_replies(res, ids);
    free_results(res, BIG_LINES);
    /* stderr is no terminal: plain progress lines, the last with the final count */
    assert_non_null(err = th_read_file(s.err, NULL));
    assert_null(strchr(err, '\r'));
    snprintf(want, sizeof(want), "batch: %d/%d done", BIG_LINES, BIG_LINES);
    if (strncmp(last_line(err, last, sizeof(last)), want, strlen(want)) != 0)
        fail_msg("the last line of stderr is not the final count (%s):\n%s", want, err);
    free(err);
    cJSON_Delete(ids);
    scratch_remove(&s);
}

static void a_killed_batch_resumes_with_every_line_once(void **state)
{
    struct scratch s;
    cJSON *ids, **part, **all;
    struct th_run r;
    pid_t pid;
    int st, n_part, n;
    (void)state;
    scratch_make(&s);
    ids = write_eval_input(s.in, BIG_LINES);
    pid = start_batch(&s);
    wait_for_lines(pid, s.out, 20);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    /* what the killed run left: whole lines only (read_results fails on a partial one) */
    part = read_results(s.out, BIG_LINES, &n_part);
    assert_true(n_part >= 20 && n_part < BIG_LINES);
    check_replies(part, ids);
    r = RUN("batch", s.in, "-o", s.out, "--data-dir", s.data, "-m", DEMO);
    if (r.status != 0 || !strstr(r.err, "resuming job"))
        fail_msg("status %d, stderr: %s", r.status, r.err);
    th_run_free(&r);
    all = read_results(s.out, BIG_LINES, &n);
    assert_int_equal(n, BIG_LINES);
    check_replies(all, ids);
    /* the lines finished before the kill are kept as they were, not answered again */
    for (int k = 1; k <= BIG_LINES; k++) {
        char *a, *b;
        if (!part[k])
            continue;
        a = cJSON_PrintUnformatted(part[k]);
        b = cJSON_PrintUnformatted(all[k]);
        if (strcmp(a, b) != 0)
            fail_msg("line %d changed on resume:\n%s\n%s", k, a, b);
        cJSON_free(a);
        cJSON_free(b);
    }
    free_results(part, BIG_LINES);
    free_results(all, BIG_LINES);
    cJSON_Delete(ids);
    scratch_remove(&s);
}

/* 8 lines: "id", "review_id", both equal, both different, and four bad lines. */
static const char mixed_input[] =
    "{\"id\":\"i-1\",\"text\":\"物流很快，包装完好\",\"rating\":5}\n"
    "{\"review_id\":\"r-2\",\"text\":\"size runs small, returned it\",\"rating\":2}\n"
    "{\"review_id\":\"b-3\",\"id\":\"b-3\",\"text\":\"好评\",\"rating\":4}\n"
    "{\"review_id\":\"r-4\",\"id\":\"i-4\",\"text\":\"ok\",\"rating\":4}\n"
    "{\"id\":\"x-5\",\"text\":\"truncated\n"
    "{\"id\":\"x-6\",\"rating\":3}\n"
    "\n"
    "[1,2]\n"
    "{\"id\":\"x-9\",\"text\":\"好\",\"rating\":9}\n";

static void check_mixed_results(const char *path)
{
    static const char *const ids[] = {"i-1", "r-2", "b-3"};
    /* the error of each bad line names what is wrong (line 7 is blank: not a review) */
    static const struct {
        int line;
        const char *words[2];
    } bad[] = {{4, {"r-4", "i-4"}}, {5, {"JSON", NULL}}, {6, {"text", NULL}},
               {8, {"object", NULL}}, {9, {"rating", NULL}}};
    int n;
    cJSON **res = read_results(path, 9, &n);
    assert_int_equal(n, 8);
    assert_null(res[7]);
    for (int k = 1; k <= 3; k++) {
        const char *id = str_field(res[k], "review_id"), *reply = str_field(res[k], "reply");
        if (!id || strcmp(id, ids[k - 1]) != 0 || !reply || !*reply)
            fail_msg("line %d: %s", k, cJSON_PrintUnformatted(res[k]));
    }
    for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
        const cJSON *j = res[bad[i].line];
        const char *e = str_field(j, "error");
        assert_non_null(j);
        if (!e || str_field(j, "reply") || !strstr(e, bad[i].words[0]) ||
            (bad[i].words[1] && !strstr(e, bad[i].words[1])))
            fail_msg("line %d: %s", bad[i].line, cJSON_PrintUnformatted(j));
    }
    free_results(res, 9);
}

static void id_and_review_id_both_name_a_review_and_bad_lines_are_errors(void **state)
{
    struct scratch s;
    struct th_run r;
    (void)state;
    scratch_make(&s);
    write_text(s.in, mixed_input);
    r = RUN("batch", s.in, "-o", s.out, "--data-dir", s.data, "-m", DEMO);
    if (r.status != 0)
        fail_msg("status %d, stderr: %s", r.status, r.err);
    /* each bad line is told on stderr with its number */
    assert_non_null(strstr(r.err, "batch: line 4: "));
    assert_non_null(strstr(r.err, "batch: line 9: "));
    assert_non_null(strstr(r.err, "batch: 8/8 done, 5 errors"));
    th_run_free(&r);
    check_mixed_results(s.out);
    /* run again, to stdout and quiet: the finished job's results, nothing on stderr */
    r = RUN("batch", s.in, "--data-dir", s.data, "-m", DEMO, "--quiet");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    write_text(s.out, r.out);
    th_run_free(&r);
    check_mixed_results(s.out);
    scratch_remove(&s);
}

static void a_file_that_is_not_a_job_leaves_no_output(void **state)
{
    struct scratch s;
    struct th_run r;
    (void)state;
    scratch_make(&s);
    write_text(s.in, "\n\n");
    r = RUN("batch", s.in, "-o", s.out, "--data-dir", s.data, "-m", DEMO);
    if (r.status != 2 || !strstr(r.err, "no reviews") || strchr(r.err, '\n') != strrchr(r.err, '\n'))
        fail_msg("status %d, stderr: %s", r.status, r.err);
    th_run_free(&r);
    assert_int_equal(access(s.out, F_OK), -1);
    r = RUN("batch", s.in, "-o", s.out, "--bogus");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--bogus"));
    th_run_free(&r);
    scratch_remove(&s);
}

/* On a terminal the progress is one bar redrawn in place: \r, the counts, and a final newline. */
static void a_terminal_gets_a_bar_redrawn_in_place(void **state)
{
    struct scratch s;
    cJSON *ids;
    char buf[65536], want[32];
    size_t len = 0;
    int master, st;
    pid_t pid;
    (void)state;
    scratch_make(&s);
    ids = write_eval_input(s.in, 40);
    pid = forkpty(&master, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(th_bin_path(), "autoreply", "batch", s.in, "-o", s.out, "--data-dir", s.data,
              "-m", DEMO, (char *)NULL);
        _exit(127);
    }
    for (;;) { /* until the child is gone (EIO once the last holder of the slave closes) */
        ssize_t n = read(master, buf + len, sizeof(buf) - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == sizeof(buf) - 1)
            len = 0; /* keep the tail: the final bar is what matters */
    }
    buf[len] = '\0';
    close(master);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    snprintf(want, sizeof(want), "] 40/40");
    if (!strchr(buf, '\r') || !strstr(buf, want) || !strstr(buf, "[####") || !strstr(buf, "/s"))
        fail_msg("no bar on the terminal:\n%s", buf);
    assert_int_equal(file_lines(s.out), 40);
    cJSON_Delete(ids);
    scratch_remove(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(results_reach_the_file_while_the_batch_runs),
        cmocka_unit_test(a_killed_batch_resumes_with_every_line_once),
        cmocka_unit_test(id_and_review_id_both_name_a_review_and_bad_lines_are_errors),
        cmocka_unit_test(a_file_that_is_not_a_job_leaves_no_output),
        cmocka_unit_test(a_terminal_gets_a_bar_redrawn_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
