/* embed.c - answering a shop review in your own program through libautoreply's C API.
 *   cc examples/embed.c $(pkg-config --cflags --libs autoreply) -o embed
 *   ./embed [MODEL.gguf] [REVIEW TEXT] [RATING]
 * The model: the argument, else $AR_MODEL, else the demo model in ./models or ../shared/models.
 * Prints the reply on stdout and what came with it (source, flags) on stderr. */
#define _POSIX_C_SOURCE 200809L /* access() under -std=c11 */
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv)
{
    struct ar_err err = {0};
    struct ar_model *model = NULL;
    struct ar_engine *engine = NULL;
    struct ar_reply_service *svc = NULL;
    struct ar_reply reply = {0};
    struct ar_review review = {
        .review_id = "r-1",
        .text = argc > 2 ? argv[2] : "物流很快，包装完好，茶叶很香，下次还会再买。",
        .rating = argc > 3 ? atoi(argv[3]) : 5,
    };
    struct ar_reply_params rp = ar_reply_params_default();
    int rc = 1;

    if (ar_model_load(model_path(argc, argv), NULL, &model, &err) != AR_OK ||
        ar_engine_create(model, NULL, &engine, &err) != AR_OK) {
        fprintf(stderr, "embed: %s\n", err.msg);
        goto done;
    }
    rp.shop_id = "tea-house"; /* no store given: replies are kept in memory */
    if (ar_reply_service_create(engine, &rp, &svc, &err) != AR_OK ||
        ar_reply_answer(svc, &review, &reply, &err) != AR_OK) {
        fprintf(stderr, "embed: %s\n", err.msg);
        goto done;
    }
    printf("%s\n", reply.text);
    fprintf(stderr, "source=%s needs_human=%d negative=%d lang=%s model=%s\n",
            ar_reply_source_str(reply.source), reply.needs_human, reply.negative, reply.lang,
            reply.model);
    rc = 0;
done:
    ar_reply_clear(&reply);
    ar_reply_service_free(svc);
    ar_engine_free(engine);
    ar_model_free(model);
    return rc;
}
