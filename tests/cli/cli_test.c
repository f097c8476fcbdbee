/* cli_test.c - the autoreply binary driven as a user would: fixtures, generation on the demo model,
 * model tools, and bad input (one clear line on stderr, non-zero exit, no partial files). */
#include "harness/harness.h"

#include <fcntl.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/process.h"

#define DEMO "models/autoreply-demo-q8_0.gguf"

/* Runs the binary with the arguments, stdout and stderr captured. */
#define RUN(...)                                                                                   \
    th_run_exec(th_bin_path(), (char *const[]){"autoreply", __VA_ARGS__, NULL}, NULL, false)

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

/* A failed command: non-zero exit, not a crash, and exactly one line on stderr that says what
 * is wrong (containing `needle`). */
static void expect_clean_failure(struct th_run *r, const char *needle)
{
    if (r->status == 0 || r->status >= 128 || !strstr(r->err, needle) || count_lines(r->err) != 1)
        fail_msg("status %d, stderr: %s", r->status, r->err);
}

static void check_fixtures_passes_on(const char *folder)
{
    char dir[512];
    struct th_run r;
    th_shared_path(dir, sizeof(dir), folder);
    r = RUN("check-fixtures", dir);
    if (r.status != 0)
        fail_msg("check-fixtures %s failed:\n%s\n%s", folder, r.out, r.err);
    assert_non_null(strstr(r.out, " 0 failed"));
    assert_null(strstr(r.out, "FAIL"));
    th_run_free(&r);
}

static void check_fixtures_passes_on_shared_fixtures(void **state)
{
    (void)state;
    check_fixtures_passes_on("fixtures");
}

/* the new families' folder: logits, greedy runs, dequantization, tokenizers, chat templates */
static void check_fixtures_passes_on_shared_fixtures_arch(void **state)
{
    (void)state;
    check_fixtures_passes_on("fixtures-arch");
}

/* check-fixtures on a folder holding one file of shared/fixtures (tiny-qwen2-q6_k), its numpy
 * reference and the tolerances, with llama.cpp's greedy run in logits/ changed by edit. */
#define EDITED_MODEL "tiny-qwen2-q6_k"

static struct th_run check_edited_greedy(void (*edit)(cJSON *cases))
{
    char dir[] = "/tmp/ar_cli_fx_XXXXXX", shared[4096], src[8192], dst[2][512];
    static const char *const links[3] = {"models", "tolerances.json",
                                         "logits_numpy/" EDITED_MODEL ".json"};
    struct th_run r;
    cJSON *ref;
    char *text;
    FILE *f;
    assert_non_null(realpath(th_shared_path(src, sizeof(src), "fixtures"), shared));
    assert_non_null(mkdtemp(dir));
    snprintf(dst[0], sizeof(dst[0]), "%s/logits_numpy", dir);
    snprintf(dst[1], sizeof(dst[1]), "%s/logits", dir);
    assert_int_equal(mkdir(dst[0], 0700), 0);
    assert_int_equal(mkdir(dst[1], 0700), 0);
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof(src), "%s/%s", shared, links[i]);
        snprintf(dst[0], sizeof(dst[0]), "%s/%s", dir, links[i]);
        assert_int_equal(symlink(src, dst[0]), 0);
    }
    snprintf(src, sizeof(src), "%s/logits/" EDITED_MODEL ".json", shared);
    assert_non_null(ref = th_read_json(src));
    edit(cJSON_GetObjectItem(ref, "cases"));
    snprintf(dst[0], sizeof(dst[0]), "%s/logits/" EDITED_MODEL ".json", dir);
    assert_non_null(text = cJSON_PrintUnformatted(ref));
    assert_non_null(f = fopen(dst[0], "w"));
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
    free(text);
    cJSON_Delete(ref);
    r = RUN("check-fixtures", dir);
    unlink(dst[0]);
    for (int i = 0; i < 3; i++) {
        snprintf(dst[0], sizeof(dst[0]), "%s/%s", dir, links[i]);
        unlink(dst[0]);
    }
    snprintf(dst[0], sizeof(dst[0]), "%s/logits_numpy", dir);
    snprintf(dst[1], sizeof(dst[1]), "%s/logits", dir);
    rmdir(dst[0]);
    rmdir(dst[1]);
    rmdir(dir);
    return r;
}

/* every margin 0: no step can be decided, which must fail rather than pass as "0/0" */
static void zero_margins(cJSON *cases)
{
    cJSON *c, *m;
    cJSON_ArrayForEach(c, cases)
    {
        cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "greedy_margins"))
        {
            cJSON_SetNumberValue(m, 0);
        }
    }
}

/* one token changed at a decode step whose margin is far above any threshold (> 2, where the
 * file's threshold is about 0.43) */
static void wrong_decided_token(cJSON *cases)
{
    cJSON *c = cJSON_GetArrayItem(cases, 0);
    cJSON *toks = cJSON_GetObjectItem(c, "greedy_tokens");
    cJSON *margins = cJSON_GetObjectItem(c, "greedy_margins");
    for (int g = 1; g < cJSON_GetArraySize(margins); g++) {
        if (cJSON_GetArrayItem(margins, g)->valuedouble > 2) {
            cJSON *t = cJSON_GetArrayItem(toks, g);
            int other = (t->valueint + 1) % 1024; /* tiny-qwen2: 1024 tokens */
            cJSON_SetNumberValue(t, other);
            return;
        }
    }
    fail_msg("no greedy step with a margin above 2 in " EDITED_MODEL " case 0");
}

static void check_fixtures_fails_when_no_greedy_step_is_decided(void **state)
{
    struct th_run r = check_edited_greedy(zero_margins);
    (void)state;
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.out, "cannot decide the greedy run"));
    assert_non_null(strstr(r.out, "FAIL " EDITED_MODEL ".json"));
    th_run_free(&r);
}

static void check_fixtures_fails_on_a_wrong_decided_greedy_token(void **state)
{
    struct th_run r = check_edited_greedy(wrong_decided_token);
    (void)state;
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.out, "case 0 (1 tokens) greedy step"));
    assert_non_null(strstr(r.out, "FAIL " EDITED_MODEL ".json"));
    th_run_free(&r);
}

static void check_fixtures_fails_on_a_missing_directory(void **state)
{
    struct th_run r = RUN("check-fixtures", "/nonexistent/fixtures");
    (void)state;
    expect_clean_failure(&r, "/nonexistent/fixtures");
    th_run_free(&r);
}

/* Writes DIR/chat/templates.json with llama.cpp's chat fixture, entry `broken` (if >= 0)
 * given another expected text, into a fresh directory (returned in dir). */
static void write_chat_fixture(char dir[64], int broken)
{
    char src[512], path[128];
    cJSON *arr =
        th_read_json(th_shared_path(src, sizeof(src), "fixtures-arch/chat/templates.json"));
    char *text;
    FILE *f;
    assert_non_null(arr);
    if (broken >= 0) {
        cJSON *e = cJSON_GetArrayItem(arr, broken);
        assert_non_null(e);
        cJSON_ReplaceItemInObject(e, "expected", cJSON_CreateString("<|im_start|>nothing"));
    }
    snprintf(dir, 64, "/tmp/cli_chat_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/chat", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/chat/templates.json", dir);
    text = cJSON_Print(arr);
    assert_non_null(f = fopen(path, "w"));
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(arr);
}

static void remove_chat_fixture(const char *dir)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/chat/templates.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/chat", dir);
    rmdir(path);
    rmdir(dir);
}

/* chat/templates.json: llama.cpp's text for every conversation passes; one changed expected
 * text fails the run and is named. */
static void check_fixtures_checks_chat_templates(void **state)
{
    char dir[64];
    struct th_run r;
    (void)state;
    write_chat_fixture(dir, -1);
    r = RUN("check-fixtures", dir);
    if (r.status != 0 || !strstr(r.out, "ok   chat templates: 91/91"))
        fail_msg("status %d:\n%s\n%s", r.status, r.out, r.err);
    th_run_free(&r);
    remove_chat_fixture(dir);

    write_chat_fixture(dir, 5);
    r = RUN("check-fixtures", dir);
    if (r.status != 1 || !strstr(r.out, "FAIL chat templates: 90/91") ||
        !strstr(r.out, "entry 5 ") || !strstr(r.out, " 1 failed"))
        fail_msg("status %d:\n%s\n%s", r.status, r.out, r.err);
    th_run_free(&r);
    remove_chat_fixture(dir);
}

static void generate_answers_a_review_through_the_chat_template(void **state)
{
    struct th_run r = RUN("generate", "-m", DEMO, "--chat", "--temp", "0", "-n", "120", "-p",
                          "评分：5星\n评价：物流很快，包装完好");
    (void)state;
    assert_int_equal(r.status, 0);
    /* a Chinese reply (CJK bytes), and the run stopped at the end-of-turn token */
    assert_true(strlen(r.out) > 6);
    assert_true((unsigned char)r.out[0] >= 0xe4);
    assert_null(strstr(r.out, "<|im_end|>"));
    assert_non_null(strstr(r.err, "stopped: end of turn"));
    th_run_free(&r);
}

static void generate_is_deterministic_for_a_seed(void **state)
{
    struct th_run a = RUN("generate", "-m", DEMO, "--chat", "--temp", "0.9", "--seed", "7", "-n",
                          "40", "-p", "Rating: 2 stars\nReview: arrived broken");
    struct th_run b = RUN("generate", "-m", DEMO, "--chat", "--temp", "0.9", "--seed", "7", "-n",
                          "40", "-p", "Rating: 2 stars\nReview: arrived broken");
    (void)state;
    assert_int_equal(a.status, 0);
    assert_int_equal(b.status, 0);
    assert_string_equal(a.out, b.out);
    th_run_free(&a);
    th_run_free(&b);
}

static void generate_rejects_bad_input_with_one_line(void **state)
{
    struct th_run r;
    char big[40000];
    (void)state;
    r = RUN("generate", "-m", "/nonexistent.gguf", "-p", "hi");
    expect_clean_failure(&r, "/nonexistent.gguf");
    th_run_free(&r);
    r = RUN("generate", "-m", DEMO, "-p", "hi", "-t", "0");
    expect_clean_failure(&r, "-t");
    th_run_free(&r);
    r = RUN("generate", "-m", DEMO, "-p", "hi", "-n", "99999999999");
    expect_clean_failure(&r, "-n");
    th_run_free(&r);
    r = RUN("generate", "-m", DEMO, "-p", "hi", "--temp", "abc");
    expect_clean_failure(&r, "--temp");
    th_run_free(&r);
    /* a prompt longer than the context (512 tokens) */
    for (size_t i = 0; i + 1 < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    big[sizeof(big) - 1] = '\0';
    r = RUN("generate", "-m", DEMO, "-p", big);
    expect_clean_failure(&r, "context");
    th_run_free(&r);
    r = RUN("generate", "-m", "README.md", "-p", "hi");
    expect_clean_failure(&r, "README.md");
    th_run_free(&r);
    r = RUN("frobnicate");
    expect_clean_failure(&r, "frobnicate");
    th_run_free(&r);
}

static void inspect_prints_metadata_and_tensors(void **state)
{
    struct th_run r = RUN("inspect", "-m", DEMO);
    (void)state;
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "general.architecture"));
    assert_non_null(strstr(r.out, "\"llama\""));
    assert_non_null(strstr(r.out, "blk.3.ffn_down.weight"));
    assert_non_null(strstr(r.out, "parameters: 6220032"));
    th_run_free(&r);
}

static void tokenize_prints_ids(void **state)
{
    struct th_run r = RUN("tokenize", "-m", DEMO, "--ids", "<|im_start|>user");
    (void)state;
    assert_int_equal(r.status, 0);
    /* <|im_start|> is id 3 in the demo vocabulary (model card) */
    assert_int_equal(strncmp(r.out, "3 ", 2), 0);
    th_run_free(&r);
}

/* the four real vocabularies (issue 14): llama.cpp's ids for its 46 standard strings */
static void check_fixtures_passes_on_real_tokenizer_vocabularies(void **state)
{
    (void)state;
    check_fixtures_passes_on("fixtures-tokenizer-real");
}

/* --tokenizer-pre: an unknown name fails with one line naming it; a known one replaces the
 * file's pre-tokenizer (DeepSeek-V3 keeps "'t" whole, "default" cuts the apostrophe off) */
static void tokenize_pre_tokenizer_override(void **state)
{
    char vocab[512];
    struct th_run own, other, bad;
    (void)state;
    th_shared_path(vocab, sizeof(vocab),
                   "fixtures-tokenizer-real/tokenizer/vocabs/ggml-vocab-deepseek_v3.gguf");
    own = RUN("tokenize", "-m", vocab, "--ids", "--raw", "didn't");
    other = RUN("tokenize", "-m", vocab, "--ids", "--raw", "--tokenizer-pre", "default", "didn't");
    bad = RUN("tokenize", "-m", vocab, "--tokenizer-pre", "no-such-pre", "didn't");
    assert_int_equal(own.status, 0);
    assert_int_equal(other.status, 0);
    assert_true(strcmp(own.out, other.out) != 0);
    expect_clean_failure(&bad, "'no-such-pre'");
    th_run_free(&own);
    th_run_free(&other);
    th_run_free(&bad);
}

static bool file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void quantize_round_trip_and_no_partial_output(void **state)
{
    char dir[] = "/tmp/ar_cli_q_XXXXXX", f32[256], q8[256], q4[256], bad[256], fx[512];
    struct th_run r;
    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(f32, sizeof(f32), "%s/m-f32.gguf", dir);
    snprintf(q8, sizeof(q8), "%s/m-q8.gguf", dir);
    snprintf(q4, sizeof(q4), "%s/m-q4km.gguf", dir);
    snprintf(bad, sizeof(bad), "%s/bad.gguf", dir);
    r = RUN("gen-model", "--arch", "llama", "--n-embd", "256", "--n-layer", "2", "--n-head", "4",
            "--n-head-kv", "2", "--n-ff", "512", "--n-vocab", "300", "--type", "f32", "-o", f32);
    assert_int_equal(r.status, 0);
    th_run_free(&r);
    r = RUN("quantize", f32, q8, "q8_0");
    assert_int_equal(r.status, 0);
    th_run_free(&r);
    r = RUN("quantize", f32, q4, "q4_k_m");
    assert_int_equal(r.status, 0);
    th_run_free(&r);
    r = RUN("inspect", q4);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "q4_K"));
    assert_non_null(strstr(r.out, "q6_K")); /* output matrix and the mixed layers */
    th_run_free(&r);
    /* both quantized files run; ids in, ids out (no vocabulary) */
    r = RUN("generate", "-m", q8, "--ids", "-p", "1 2 3", "-n", "4", "--temp", "0");
    assert_int_equal(r.status, 0);
    th_run_free(&r);
    /* a quantized input is refused and no output file is left behind */
    r = RUN("quantize", q8, bad, "q4_0");
    expect_clean_failure(&r, "F32, F16 or BF16");
    assert_false(file_exists(bad));
    th_run_free(&r);
    r = RUN("quantize", f32, bad, "q3_x");
    expect_clean_failure(&r, "q3_x");
    assert_false(file_exists(bad));
    th_run_free(&r);
    snprintf(fx, sizeof(fx), "%s/no-such-dir/out.gguf", dir);
    r = RUN("quantize", f32, fx, "q8_0");
    assert_true(r.status != 0 && r.status < 128);
    th_run_free(&r);
    unlink(f32);
    unlink(q8);
    unlink(q4);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(check_fixtures_passes_on_shared_fixtures),
        cmocka_unit_test(check_fixtures_passes_on_shared_fixtures_arch),
        cmocka_unit_test(check_fixtures_passes_on_real_tokenizer_vocabularies),
        cmocka_unit_test(tokenize_pre_tokenizer_override),
        cmocka_unit_test(check_fixtures_fails_on_a_missing_directory),
        cmocka_unit_test(check_fixtures_fails_when_no_greedy_step_is_decided),
        cmocka_unit_test(check_fixtures_fails_on_a_wrong_decided_greedy_token),
        cmocka_unit_test(check_fixtures_checks_chat_templates),
        cmocka_unit_test(generate_answers_a_review_through_the_chat_template),
        cmocka_unit_test(generate_is_deterministic_for_a_seed),
        cmocka_unit_test(generate_rejects_bad_input_with_one_line),
        cmocka_unit_test(inspect_prints_metadata_and_tensors),
        cmocka_unit_test(tokenize_prints_ids),
        cmocka_unit_test(quantize_round_trip_and_no_partial_output),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
