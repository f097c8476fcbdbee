/* serve_metrics_test.c - `autoreply serve` on the demo model as an operator's Prometheus sees
 * it: after real traffic (a chat completion, review replies, a job) its /metrics passes
 * `promtool check metrics`, counts exactly the requests made, carries sane process_* figures,
 * and exports every family the alert rules in deploy/prometheus/alerts.yml read. */
#include "harness/harness.h"
#include "harness/http_client.h"
#include "harness/process.h"
#include "harness/promtool.h"
#include "harness/serve.h"

#include <ctype.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEMO "models/autoreply-demo-q8_0.gguf"
#define ALERTS "deploy/prometheus/alerts.yml"

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct {
    char dir[64];
    struct th_serve srv;
    double spawned; /* wall clock just before fork */
    char *metrics;  /* /metrics after the traffic of group_setup */
} g;

/* ---- the server process ----------------------------------------------------------------- */

static void spawn_serve(void)
{
    char data[128], log[128];
    /* both reply cache classes with budgets and TTLs of their own (the flags' own test) */
    const char *args[] = {"-m",          DEMO,       "--port",     "0",
                          "--data-dir",  data,       "-t",         "1",
                          "--parallel",  "4",        "--cache-mb", "interactive=8,bulk=2",
                          "--cache-ttl", "bulk=600", NULL};
    snprintf(data, sizeof(data), "%s/var", g.dir);
    snprintf(log, sizeof(log), "%s/serve.log", g.dir);
    g.spawned = wall_s();
    th_serve_spawn(&g.srv, log, args);
}

/* ---- traffic ----------------------------------------------------------------------------- */

static char *scrape(char **content_type)
{
    struct resp r;
    char ct[128];
    char *body;
    http(g.srv.port, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    if (content_type)
        *content_type = strdup(resp_header(&r, "Content-Type", ct, sizeof(ct)) ? ct : "");
    body = r.body;
    r.body = NULL;
    resp_free(&r);
    return body;
}

/* The value of the sample "<series> <value>" in text; NAN when there is none. */
static double sample(const char *text, const char *series)
{
    return th_metric_sample(text, series, (double)NAN);
}

static void post_expect(const char *path, const char *body, int status, char *id, size_t id_size)
{
    int got;
    cJSON *j = post_json(g.srv.port, path, NULL, body, &got);
    if (got != status) {
        char *s = cJSON_PrintUnformatted(j);
        fail_msg("POST %s: %d, expected %d: %s", path, got, status, s);
    }
    if (id) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "id");
        assert_true(cJSON_IsString(v));
        snprintf(id, id_size, "%s", v->valuestring);
    }
    cJSON_Delete(j);
}

static void wait_job_done(const char *id)
{
    char path[128];
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    for (int i = 0; i < 300; i++) {
        struct resp r;
        bool done;
        http(g.srv.port, "GET", path, NULL, NULL, 0, &r);
        assert_int_equal(r.status, 200);
        done = strstr(r.body, "\"status\":\"done\"") != NULL;
        resp_free(&r);
        if (done)
            return;
        usleep(100 * 1000);
    }
    fail_msg("job %s not done after 30 s", id);
}

/* One chat completion, three review replies (the third the text of the first under another
 * id: a reply cache hit), a job of three reviews (the third again the text of the first: a bulk
 * lookup that the interactive cache answers), one unknown path: then one scrape. */
static void make_traffic(void)
{
    char id[80];
    struct resp r;
    post_expect("/v1/chat/completions",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":8}", 200,
                NULL, 0);
    post_expect("/v1/reviews/reply",
                "{\"shop_id\":\"demo\",\"review_id\":\"m1\",\"rating\":5,"
                "\"text\":\"Great kettle, boils fast and looks good\"}",
                200, NULL, 0);
    post_expect("/v1/reviews/reply",
                "{\"shop_id\":\"demo\",\"review_id\":\"m2\",\"rating\":2,"
                "\"text\":\"The lid broke after a week\"}",
                200, NULL, 0);
    post_expect("/v1/reviews/reply",
                "{\"shop_id\":\"demo\",\"review_id\":\"m3\",\"rating\":5,"
                "\"text\":\"Great kettle, boils fast and looks good\"}",
                200, NULL, 0);
    post_expect("/v1/jobs",
                "{\"shop_id\":\"demo\",\"reviews\":[{\"review_id\":\"j1\",\"rating\":4,"
                "\"text\":\"Arrived on time\"},{\"review_id\":\"j2\",\"rating\":1,"
                "\"text\":\"Never arrived\"},{\"review_id\":\"j3\",\"rating\":5,"
                "\"text\":\"Great kettle, boils fast and looks good\"}]}",
                202, id, sizeof(id));
    wait_job_done(id);
    http(g.srv.port, "GET", "/no/such/path", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    resp_free(&r);
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(g.dir, sizeof(g.dir), "/tmp/ar_serve_metrics_XXXXXX");
    if (!mkdtemp(g.dir))
        return -1;
    spawn_serve();
    if (!th_serve_wait_ready(&g.srv, 60))
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    char cmd[128];
    int rc = th_serve_stop(&g.srv);
    (void)state;
    free(g.metrics);
    snprintf(cmd, sizeof(cmd), "/bin/rm -rf '%s'", g.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g.dir);
    if (rc != 0) {
        fprintf(stderr, "serve did not stop cleanly on SIGTERM (status %d)\n", rc);
        return -1;
    }
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void metrics_after_real_traffic_pass_promtool(void **state)
{
    char *ct = NULL;
    (void)state;
    make_traffic();
    g.metrics = scrape(&ct);
    if (!strstr(ct, "text/plain") || !strstr(ct, "version=0.0.4"))
        fail_msg("Content-Type: %s", ct);
    free(ct);
    promtool_check_metrics(g.metrics);
}

static void metrics_count_exactly_the_requests_made(void **state)
{
    const char *m = g.metrics;
    (void)state;
    assert_non_null(m);
    assert_true(sample(m, "autoreply_http_request_duration_seconds_count{method=\"POST\","
                          "endpoint=\"/v1/chat/completions\",status=\"200\"}") == 1);
    assert_true(sample(m, "autoreply_http_request_duration_seconds_count{method=\"POST\","
                          "endpoint=\"/v1/reviews/reply\",status=\"200\"}") == 3);
    assert_true(sample(m, "autoreply_http_request_duration_seconds_count{method=\"POST\","
                          "endpoint=\"/v1/jobs\",status=\"202\"}") == 1);
    assert_true(sample(m, "autoreply_http_request_duration_seconds_count{method=\"GET\","
                          "endpoint=\"other\",status=\"404\"}") == 1);
    /* the review replies: three over HTTP and three in the job, two from the reply cache */
    assert_true(sample(m, "autoreply_reply_latency_seconds_count{cached=\"false\"}") +
                    sample(m, "autoreply_reply_latency_seconds_count{cached=\"true\"}") ==
                6);
    assert_true(sample(m, "autoreply_reply_replies_total{source=\"cache\"}") == 2);
    assert_true(sample(m, "autoreply_jobs_items_total{status=\"done\"}") == 3);
    /* the cache lookups by class: interactive m1, m2 missed and m3 hit; bulk j1, j2 missed and
     * j3 hit (in the interactive cache, read by the bulk class) */
    assert_true(sample(m, "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l1\"}") ==
                1);
    assert_true(sample(m, "autoreply_reply_cache_misses_total{class=\"interactive\"}") == 2);
    assert_true(sample(m, "autoreply_reply_cache_hits_total{class=\"bulk\",level=\"l1\"}") == 1);
    assert_true(sample(m, "autoreply_reply_cache_misses_total{class=\"bulk\"}") == 2);
    assert_true(sample(m, "autoreply_reply_cache_hits_total{class=\"interactive\",level=\"l2\"}") ==
                0);
    assert_true(sample(m, "autoreply_reply_cache_evictions_total{class=\"bulk\"}") == 0);
    assert_true(sample(m, "autoreply_rejected_total{reason=\"queue_full\"}") == 0);
    /* the objective's edges are buckets of their own */
    assert_false(isnan(sample(m, "autoreply_http_request_duration_seconds_bucket{method=\"POST\","
                                 "endpoint=\"/v1/reviews/reply\",status=\"200\",le=\"1\"}")));
    assert_false(isnan(sample(m, "autoreply_reply_latency_seconds_bucket{cached=\"false\","
                                 "le=\"0.3\"}")));
    assert_false(isnan(sample(m, "autoreply_reply_latency_seconds_bucket{cached=\"false\","
                                 "le=\"3\"}")));
}

/* Bad --cache-mb / --cache-ttl values fail before anything starts, with one line naming the
 * flag. */
static void bad_cache_class_flags_are_rejected(void **state)
{
    static char *const bad[][2] = {
        {"--cache-mb", "64"},              /* no class */
        {"--cache-mb", "batch=4"},         /* no such class */
        {"--cache-mb", "interactive=-1"},  /* out of range */
        {"--cache-mb", "interactive=1.5"}, /* MiB are whole */
        {"--cache-mb", "interactive=8,"},  /* trailing comma */
        {"--cache-ttl", "bulk=soon"},      /* not a number */
        {"--cache-ttl", "interactive"},    /* no value */
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct th_run r =
            th_run_exec(th_bin_path(),
                        (char *const[]){"autoreply", "serve", "-m", "/nonexistent.gguf",
                                        bad[i][0], bad[i][1], NULL},
                        NULL, false);
        if (r.status != 2 || !strstr(r.err, bad[i][0]) ||
            strchr(r.err, '\n') != strrchr(r.err, '\n'))
            fail_msg("%s %s: status %d, stderr: %s", bad[i][0], bad[i][1], r.status, r.err);
        th_run_free(&r);
    }
}

static void process_metrics_are_sane(void **state)
{
    const char *m = g.metrics;
    double rss = sample(m, "process_resident_memory_bytes");
    double vsz = sample(m, "process_virtual_memory_bytes");
    double start = sample(m, "process_start_time_seconds");
    double cpu = sample(m, "process_cpu_seconds_total");
    double fds = sample(m, "process_open_fds"), max_fds = sample(m, "process_max_fds");
    double now = wall_s();
    char *again;
    (void)state;
    assert_non_null(m);
    if (!(rss > 0 && rss < 4.0 * (1u << 30)))
        fail_msg("process_resident_memory_bytes %g", rss);
    assert_true(vsz >= rss);
    /* it started when we spawned it (boot time is known to the second), within the hour */
    if (!(start >= g.spawned - 2.0 && start <= now + 1.0 && now - start < 3600))
        fail_msg("process_start_time_seconds %.2f, spawned at %.2f, now %.2f", start, g.spawned,
                 now);
    if (!(fds >= 3 && max_fds >= fds))
        fail_msg("process_open_fds %g, process_max_fds %g", fds, max_fds);
    assert_true(cpu > 0); /* it loaded a model and generated */
    /* read at each scrape: the counter never goes back, the start time stays */
    again = scrape(NULL);
    assert_true(sample(again, "process_cpu_seconds_total") >= cpu);
    assert_true(sample(again, "process_start_time_seconds") == start);
    free(again);
}

/* Every autoreply_* name in the rules (not the recorded job:...:rate15m series) is a family on
 * /metrics: a histogram for _bucket/_count/_sum, else one of that exact name. */
static void every_family_the_alert_rules_read_is_exported(void **state)
{
    char *rules = th_read_file(ALERTS, NULL);
    int n_names = 0;
    (void)state;
    assert_non_null(g.metrics);
    assert_non_null(rules);
    for (const char *p = strstr(rules, "autoreply_"); p; p = strstr(p + 1, "autoreply_")) {
        char name[128], type_line[160], base[128];
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
        bool found;
        if (p > rules && (p[-1] == ':' || p[-1] == '_' || isalnum((unsigned char)p[-1])))
            continue; /* inside a recorded series' name */
        assert_true(n < sizeof(name));
        memcpy(name, p, n);
        name[n] = '\0';
        snprintf(type_line, sizeof(type_line), "# TYPE %s ", name);
        found = strstr(g.metrics, type_line) != NULL;
        if (!found) {
            static const char *const suffixes[] = {"_bucket", "_count", "_sum"};
            for (size_t i = 0; i < AR_ARRAY_LEN(suffixes); i++) {
                size_t sl = strlen(suffixes[i]);
                if (n > sl && !strcmp(name + n - sl, suffixes[i])) {
                    snprintf(base, sizeof(base), "# TYPE %.*s histogram\n", (int)(n - sl), name);
                    found = strstr(g.metrics, base) != NULL;
                }
            }
        }
        if (!found)
            fail_msg("the alert rules read %s, which /metrics does not export", name);
        n_names++;
    }
    assert_true(n_names >= 5);
    free(rules);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(metrics_after_real_traffic_pass_promtool),
        cmocka_unit_test(metrics_count_exactly_the_requests_made),
        cmocka_unit_test(bad_cache_class_flags_are_rejected),
        cmocka_unit_test(process_metrics_are_sane),
        cmocka_unit_test(every_family_the_alert_rules_read_is_exported),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
