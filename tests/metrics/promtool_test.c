/* promtool_test.c - our exposition text, scrape config and alert rules held to Prometheus's own
 * checker: a registry with every kind of family plus the process collector passes
 * `promtool check metrics`; deploy/prometheus/ passes `check config`, `check rules` and its
 * own unit tests (`test rules`), and every alert there is tested firing and silent. Negative
 * controls show promtool does complain where it should, so a pass means something. */
#include "harness/harness.h"
#include "harness/promtool.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "base/base.h"
#include "metrics/metrics.h"

#define PROM_DIR "deploy/prometheus"

static char *render(struct metrics_registry *reg)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(metrics_render(reg, &text, &len), AR_OK);
    assert_int_equal(strlen(text), len);
    return text;
}

static void free_run(struct promtool_run *r)
{
    free(r->out);
    r->out = NULL;
}

/* ---- exposition text ----------------------------------------------------------------------- */

static void registry_with_every_kind_of_family_passes_promtool(void **state)
{
    static const char *const method_status[] = {"method", "status", NULL};
    static const char *const reason[] = {"reason", NULL};
    static const double bounds[] = {0.1, 0.3, 0.5, 1.0, 3.0};
    static const char *const process_families[] = {
        "process_cpu_seconds_total counter",
        "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge",
        "process_open_fds gauge",
        "process_max_fds gauge",
        "process_start_time_seconds gauge",
    };
    struct metrics_registry *reg;
    struct metrics_family *f;
    char *text, line[128];
    (void)state;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    /* counters: plain, labelled, a label value that needs escaping, the shared "other" child */
    assert_int_equal(metrics_counter(reg, "t_requests_total", "Requests.", NULL, &f), AR_OK);
    metrics_inc(metrics_child(f, NULL), 3);
    assert_int_equal(
        metrics_counter(reg, "t_rejected_total", "Refused \"for load\"\\n.", reason, &f), AR_OK);
    metrics_inc(metrics_child(f, (const char *const[]){"queue_full"}), 2);
    metrics_inc(metrics_child(f, (const char *const[]){"a \"quoted\\\" one\nand a line"}), 1);
    metrics_inc(metrics_child(f, NULL), 1); /* "other" */
    /* gauges: negative, fractional, huge */
    assert_int_equal(metrics_gauge(reg, "t_temperature_celsius", "Help with\nnewline.", NULL, &f),
                     AR_OK);
    metrics_set(metrics_child(f, NULL), -12.5);
    assert_int_equal(metrics_gauge(reg, "t_queue_length", "Waiting.", reason, &f), AR_OK);
    metrics_set(metrics_child(f, (const char *const[]){"bulk"}), 1e300);
    /* histograms: default buckets with labels, explicit buckets, one without observations */
    assert_int_equal(metrics_histogram(reg, "t_request_duration_seconds", "Latency.", method_status,
                                       NULL, 0, &f),
                     AR_OK);
    for (int i = 0; i < 100; i++)
        metrics_observe(metrics_child(f, (const char *const[]){"POST", "200"}), 0.01 * i);
    metrics_observe(metrics_child(f, (const char *const[]){"GET", "503"}), 120.0);
    assert_int_equal(metrics_histogram(reg, "t_reply_seconds", "Reply.", NULL, bounds, 5, &f),
                     AR_OK);
    metrics_observe(metrics_child(f, NULL), 0.3); /* exactly on an edge */
    assert_int_equal(metrics_histogram(reg, "t_idle_seconds", "Idle.", NULL, NULL, 0, &f), AR_OK);
    assert_int_equal(metrics_process_register(reg), AR_OK);

    text = render(reg);
    promtool_check_metrics(text);
    for (size_t i = 0; i < AR_ARRAY_LEN(process_families); i++) {
        snprintf(line, sizeof(line), "# TYPE %s\n", process_families[i]);
        if (!strstr(text, line))
            fail_msg("no \"%s\" in:\n%s", line, text);
    }
    ar_free(text);
    metrics_registry_destroy(reg);
}

/* The control: promtool must fail the mistakes the families above avoid, or their pass would
 * prove nothing. */
static void promtool_fails_misnamed_families(void **state)
{
    static const char *const args[] = {"check", "metrics", NULL};
    struct metrics_registry *reg;
    struct metrics_family *f;
    struct promtool_run r;
    char *text;
    (void)state;
    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    assert_int_equal(metrics_gauge(reg, "t_blocks_total", "Blocks.", NULL, &f), AR_OK);
    metrics_set(metrics_child(f, NULL), 512);
    text = render(reg);
    r = promtool(args, text);
    assert_int_not_equal(r.status, 0);
    if (!strstr(r.out, "t_blocks_total") || !strstr(r.out, "_total"))
        fail_msg("promtool said: %s", r.out);
    free_run(&r);
    ar_free(text);
    metrics_registry_destroy(reg);

    assert_int_equal(metrics_registry_create(&reg), AR_OK);
    assert_int_equal(metrics_counter(reg, "t_requests", "Requests.", NULL, &f), AR_OK);
    metrics_inc(metrics_child(f, NULL), 1);
    text = render(reg);
    r = promtool(args, text);
    assert_int_not_equal(r.status, 0);
    if (!strstr(r.out, "counter metrics should have \"_total\" suffix"))
        fail_msg("promtool said: %s", r.out);
    free_run(&r);
    ar_free(text);
    metrics_registry_destroy(reg);
}

/* ---- deploy/prometheus ---------------------------------------------------------------------- */

static void expect_success(const char *const *args, const char *what)
{
    struct promtool_run r = promtool(args, NULL);
    if (r.status != 0 || !strstr(r.out, "SUCCESS"))
        fail_msg("promtool %s: status %d:\n%s", what, r.status, r.out);
    free_run(&r);
}

static void scrape_config_and_rules_pass_promtool(void **state)
{
    static const char *const config[] = {"check", "config", PROM_DIR "/prometheus.yml", NULL};
    static const char *const rules[] = {"check", "rules", PROM_DIR "/alerts.yml", NULL};
    static const char *const tests[] = {"test", "rules", PROM_DIR "/alerts_test.yml", NULL};
    (void)state;
    expect_success(config, "check config");
    expect_success(rules, "check rules");
    expect_success(tests, "test rules");
}

/* The control for `test rules`: a test that expects an instance whose up is 0 to raise no
 * alert must fail, so the rules really are evaluated against the tests' expectations. */
static void rule_tests_fail_a_wrong_expectation(void **state)
{
    char dir[] = "/tmp/ar_rules_XXXXXX", path[256], rules[4096], cwd[2048];
    const char *args[] = {"test", "rules", path, NULL};
    struct promtool_run r;
    FILE *f;
    (void)state;
    assert_non_null(mkdtemp(dir));
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    snprintf(rules, sizeof(rules), "%s/" PROM_DIR "/alerts.yml", cwd);
    snprintf(path, sizeof(path), "%s/wrong_test.yml", dir);
    assert_non_null(f = fopen(path, "w"));
    fprintf(f,
            "rule_files: ['%s']\n"
            "evaluation_interval: 1m\n"
            "tests:\n"
            "  - interval: 1m\n"
            "    input_series:\n"
            "      - series: 'up{job=\"autoreply\", instance=\"127.0.0.1:8081\"}'\n"
            "        values: '0x20'\n"
            "    alert_rule_test:\n"
            "      - eval_time: 10m\n"
            "        alertname: AutoreplyInstanceDown\n"
            "        exp_alerts: []\n",
            rules);
    fclose(f);
    r = promtool(args, NULL);
    assert_int_not_equal(r.status, 0);
    if (!strstr(r.out, "AutoreplyInstanceDown") || !strstr(r.out, "127.0.0.1:8081"))
        fail_msg("promtool said: %s", r.out);
    free_run(&r);
    unlink(path);
    rmdir(dir);
}

/* What follows "alertname: <name>" in a test file: the next line's exp_alerts, empty ([]) or a
 * list. Counts both kinds for one alert. */
static void count_expectations(const char *tests, const char *name, int *firing, int *silent)
{
    char key[160];
    size_t n = (size_t)snprintf(key, sizeof(key), "alertname: %s", name);
    *firing = *silent = 0;
    for (const char *p = strstr(tests, key); p; p = strstr(p + 1, key)) {
        const char *nl = p + n, *next;
        if (*nl != '\n' && *nl != '\r' && *nl != ' ')
            continue; /* a longer name with this one as its prefix */
        next = strchr(p, '\n');
        if (!next)
            break;
        next++;
        while (*next == ' ')
            next++;
        if (!strncmp(next, "exp_alerts: []", 14))
            (*silent)++;
        else if (!strncmp(next, "exp_alerts:", 11))
            (*firing)++;
    }
}

static void every_alert_is_tested_firing_and_silent(void **state)
{
    char *rules = th_read_file(PROM_DIR "/alerts.yml", NULL);
    char *tests = th_read_file(PROM_DIR "/alerts_test.yml", NULL);
    int n_alerts = 0;
    (void)state;
    assert_non_null(rules);
    assert_non_null(tests);
    for (const char *p = strstr(rules, "- alert: "); p; p = strstr(p + 1, "- alert: ")) {
        char name[128];
        int firing, silent;
        size_t n = strcspn(p + 9, " \r\n");
        assert_true(n > 0 && n < sizeof(name));
        memcpy(name, p + 9, n);
        name[n] = '\0';
        count_expectations(tests, name, &firing, &silent);
        if (firing < 1 || silent < 1)
            fail_msg("alert %s: %d firing and %d silent expectations in alerts_test.yml", name,
                     firing, silent);
        n_alerts++;
    }
    assert_true(n_alerts >= 6); /* down, latency, errors, overload, cache, backlog */
    free(rules);
    free(tests);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registry_with_every_kind_of_family_passes_promtool),
        cmocka_unit_test(promtool_fails_misnamed_families),
        cmocka_unit_test(scrape_config_and_rules_pass_promtool),
        cmocka_unit_test(rule_tests_fail_a_wrong_expectation),
        cmocka_unit_test(every_alert_is_tested_firing_and_silent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
