/* families_test.c - `autoreply serve` on each new family's fixture model (qwen3, qwen3moe,
 * glm4, chatglm, gemma3, phi3) answers chat requests through the model's own chat format:
 * /apply-template renders llama.cpp's result for that model's Jinja template (from
 * ../shared/fixtures-arch/chat/templates.json; Qwen3 adds its empty think block, thinking is
 * off), a chat completion runs on exactly those tokens, and a streamed one ends properly. */
#include "harness/harness.h"
#include "harness/http_client.h"
#include "harness/process.h"
#include "harness/serve.h"

#define PATH_LEN 512

struct family {
    const char *arch;          /* fixture file tiny-<arch>-q8_0.gguf */
    const char *template_file; /* the Jinja template its file carries (templates.json) */
    const char *gen_suffix;    /* what our generation prompt adds to llama.cpp's */
};

static const struct family FAMILIES[] = {
    {"qwen3", "qwen3.jinja", "<think>\n\n</think>\n\n"},
    {"qwen3moe", "qwen3.jinja", "<think>\n\n</think>\n\n"},
    {"glm4", "glm4.jinja", ""},
    {"chatglm", "glm4.jinja", ""},
    {"gemma3", "gemma3.jinja", ""},
    {"phi3", "phi4-mini.jinja", ""},
};

static struct {
    char dir[64];
    struct th_serve srv;
} g;

static int setup(void **state)
{
    (void)state;
    snprintf(g.dir, sizeof(g.dir), "/tmp/ar-families.XXXXXX");
    return mkdtemp(g.dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    th_serve_stop(&g.srv);
    struct th_run r = th_sh_run("rm -rf '%s'", g.dir);
    th_run_free(&r);
    return 0;
}

/* {"messages": ...} as a request body (with extra fields appended). */
static char *body_of(const cJSON *messages, const char *extra)
{
    cJSON *b = cJSON_CreateObject();
    char *s, *out;
    size_t n;
    cJSON_AddItemToObject(b, "messages", cJSON_Duplicate(messages, 1));
    s = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    assert_non_null(s);
    n = strlen(s) + strlen(extra) + 2;
    out = malloc(n);
    assert_non_null(out);
    /* drop the closing brace, append ,extra} */
    s[strlen(s) - 1] = '\0';
    snprintf(out, n, "%s%s}", s, extra);
    free(s);
    return out;
}

/* The number of tokens of text as the model reads a prompt (BOS as the model adds it,
 * special tokens parsed), from the server's own /tokenize. */
static int count_tokens(const char *text)
{
    cJSON *b = cJSON_CreateObject(), *r;
    char *s;
    int st, n;
    cJSON_AddStringToObject(b, "content", text);
    cJSON_AddBoolToObject(b, "add_special", 1);
    cJSON_AddBoolToObject(b, "parse_special", 1);
    s = cJSON_PrintUnformatted(b);
    r = post_json(g.srv.port, "/tokenize", NULL, s, &st);
    assert_int_equal(st, 200);
    n = cJSON_GetArraySize(cJSON_GetObjectItem(r, "tokens"));
    free(s);
    cJSON_Delete(b);
    cJSON_Delete(r);
    return n;
}

static void check_family(const struct family *f, const cJSON *templates)
{
    char rel[128], path[PATH_LEN], data[128], log[128];
    const char *args[] = {"-m",   path, "--port",     "0", "--data-dir", data, "-t",
                          "1",    "--parallel", "2", "--kv-size", "2048", NULL};
    const cJSON *e;
    int cases = 0;
    snprintf(rel, sizeof(rel), "fixtures-arch/models/tiny-%s-q8_0.gguf", f->arch);
    th_shared_path(path, sizeof(path), rel);
    snprintf(data, sizeof(data), "%s/var", g.dir);
    snprintf(log, sizeof(log), "%s/serve.log", g.dir);
    th_serve_spawn(&g.srv, log, args);
    if (!th_serve_wait_ready(&g.srv, 30))
        fail_msg("%s: serve did not start", f->arch);

    cJSON_ArrayForEach(e, templates)
    {
        const cJSON *tf = cJSON_GetObjectItem(e, "template_file");
        const cJSON *msgs = cJSON_GetObjectItem(e, "messages");
        char *body, *want;
        cJSON *r;
        int st, n_prompt;
        size_t n;
        if (!cJSON_IsString(tf) || strcmp(tf->valuestring, f->template_file) ||
            !cJSON_IsTrue(cJSON_GetObjectItem(e, "add_ass")))
            continue;
        n = strlen(cJSON_GetObjectItem(e, "expected")->valuestring) + strlen(f->gen_suffix) + 1;
        want = malloc(n);
        assert_non_null(want);
        snprintf(want, n, "%s%s", cJSON_GetObjectItem(e, "expected")->valuestring, f->gen_suffix);

        /* the rendered prompt is llama.cpp's for this model's template */
        body = body_of(msgs, "");
        r = post_json(g.srv.port, "/apply-template", NULL, body, &st);
        assert_int_equal(st, 200);
        if (strcmp(cJSON_GetObjectItem(r, "prompt")->valuestring, want) != 0)
            fail_msg("%s: /apply-template gave\n%s\nexpected\n%s", f->arch,
                     cJSON_GetObjectItem(r, "prompt")->valuestring, want);
        cJSON_Delete(r);
        free(body);

        /* a chat completion runs on exactly those tokens */
        n_prompt = count_tokens(want);
        body = body_of(msgs, ",\"max_tokens\":4,\"temperature\":0");
        r = post_json(g.srv.port, "/v1/chat/completions", NULL, body, &st);
        if (st != 200)
            fail_msg("%s: chat completion %d: %s", f->arch, st, cJSON_PrintUnformatted(r));
        assert_int_equal(
            cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "prompt_tokens")->valueint,
            n_prompt);
        assert_true(cJSON_IsString(cJSON_GetObjectItem(
            cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0),
                                "message"),
            "content")));
        cJSON_Delete(r);
        free(body);
        free(want);
        cases++;
    }
    assert_true(cases >= 5); /* the fixture has 6 add_ass conversations per template file */

    /* a streamed answer ends with [DONE] */
    {
        struct resp rs;
        const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"物流很快\"}],"
                        "\"max_tokens\":3,\"stream\":true}";
        http(g.srv.port, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n", b,
             strlen(b), &rs);
        assert_int_equal(rs.status, 200);
        assert_non_null(strstr(rs.body, "data: [DONE]"));
        resp_free(&rs);
    }
    th_serve_stop(&g.srv);
}

static void every_family_serves_chat_through_its_own_template(void **state)
{
    char path[PATH_LEN];
    cJSON *templates = th_read_json(th_shared_path(path, sizeof(path), "fixtures-arch/chat/templates.json"));
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(FAMILIES); i++)
        check_family(&FAMILIES[i], templates);
    cJSON_Delete(templates);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_family_serves_chat_through_its_own_template),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
