/* stream.c - streaming generation through libautoreply's C API: the text of each token is
 * printed as the engine produces it.
 *   cc examples/stream.c $(pkg-config --cflags --libs autoreply) -o stream
 *   ./stream [MODEL.gguf] [PROMPT] [MAX_TOKENS]
 * The model: the argument, else $AR_MODEL, else the demo model in ./models or ../shared/models.
 * Greedy (temperature 0), so the output is what `autoreply generate --temp 0` prints. On stderr:
 * how many tokens came and why generation stopped. */
#define _POSIX_C_SOURCE 200809L /* access() under -std=c11 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <autoreply.h>

static const char *model_path(int argc, char **argv)
{
    static const char *const demo[] = {"models/autoreply-demo-q8_0.gguf",
                                       "../shared/models/autoreply-demo-q8_0.gguf"};
    const char *env = getenv("AR_MODEL");
    if (argc > 1)
        return argv[1];
    if (env && *env)
        return env;
    for (size_t i = 0; i < sizeof(demo) / sizeof(demo[0]); i++)
        if (access(demo[i], R_OK) == 0)
            return demo[i];
    return demo[0];
}

struct seen {
    int n_tokens;
    size_t n_bytes;
};

/* Runs on the engine's thread: quick, no engine calls but submit/cancel. */
static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    struct seen *s = user;
    if (token >= 0)
        s->n_tokens++;
    s->n_bytes += len;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    struct ar_err err = {0};
    struct ar_model *model = NULL;
    struct ar_engine *engine = NULL;
    struct ar_request_params rq = ar_request_params_default();
    struct ar_result res;
    struct seen seen = {0, 0};
    char *text = NULL;
    int rc = 1;

    if (ar_model_load(model_path(argc, argv), NULL, &model, &err) != AR_OK ||
        ar_engine_create(model, NULL, &engine, &err) != AR_OK) {
        fprintf(stderr, "stream: %s\n", err.msg);
        goto done;
    }
    rq.temperature = 0;
    rq.max_tokens = argc > 3 ? atoi(argv[3]) : 32;
    rq.on_token = on_token;
    rq.user_data = &seen;
    if (ar_engine_generate(engine, argc > 2 ? argv[2] : "The shop", &rq, &text, &res, &err) !=
        AR_OK) {
        fprintf(stderr, "stream: %s\n", err.msg);
        goto done;
    }
    putchar('\n');
    fprintf(stderr, "stream: %d tokens (%d generated), %zu bytes, finish %s\n", seen.n_tokens,
            (int)res.n_gen, seen.n_bytes, ar_finish_str(res.finish));
    /* what streamed adds up to the final text */
    rc = seen.n_bytes == res.text_len ? 0 : 1;
    if (rc)
        fprintf(stderr, "stream: streamed %zu bytes of %zu\n", seen.n_bytes, res.text_len);
done:
    ar_string_free(text);
    ar_engine_free(engine);
    ar_model_free(model);
    return rc;
}
