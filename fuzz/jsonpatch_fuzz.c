/* jsonpatch_fuzz.c - fuzz target for JSON Patch (src/server/jsonpatch.c): the input is a JSON
 * document and a JSON patch separated by a NUL byte (no NUL: the document is {}). The patch
 * is applied under small limits; the original must never change, a result must respect the
 * limits, an error must leave no result, and a patch of tests only must give the document
 * back. Every op's path and from are also looked up as pointers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void check(int cond)
{
    if (!cond)
        abort();
}

/* Nesting (a scalar: 1) and node count of v. */
static void measure(const cJSON *v, int depth, int *deepest, size_t *nodes)
{
    if (depth > *deepest)
        *deepest = depth;
    (*nodes)++;
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        for (const cJSON *c = v->child; c; c = c->next)
            measure(c, depth + 1, deepest, nodes);
}

static bool only_tests(const cJSON *patch)
{
    for (const cJSON *op = patch->child; op; op = op->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(op, "op");
        if (!cJSON_IsString(name) || strcmp(name->valuestring, "test"))
            return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data, *nul = memchr(data, 0, size);
    struct server_jsonpatch_limits lim = {.max_depth = 12, .max_nodes = 512};
    struct server_jsonpatch_err e;
    cJSON *doc = NULL, *patch = NULL, *out = NULL;
    char *before = NULL, *after = NULL;
    enum server_jsonpatch_result r;
    size_t doc_len = nul ? (size_t)(nul - text) : 2;
    const char *doc_text = nul ? text : "{}";
    const char *patch_text = nul ? nul + 1 : text;
    size_t patch_len = nul ? size - doc_len - 1 : size;

    if (server_codec_parse(SERVER_CODEC_JSON, doc_text, doc_len, &doc, NULL) != AR_OK)
        return 0;
    if (server_codec_parse(SERVER_CODEC_JSON, patch_text, patch_len, &patch, NULL) != AR_OK) {
        cJSON_Delete(doc);
        return 0;
    }
    before = cJSON_PrintUnformatted(doc);
    r = server_jsonpatch_apply(doc, patch, &lim, &out, &e);
    after = cJSON_PrintUnformatted(doc);
    check(before && after && !strcmp(before, after));
    check(e.result == r);
    check(memchr(e.msg, 0, sizeof(e.msg)) != NULL);
    if (r == SERVER_JSONPATCH_OK) {
        int deepest = 0;
        size_t nodes = 0;
        check(out != NULL);
        measure(out, 1, &deepest, &nodes);
        /* the limits bind what a patch adds; the document given may exceed them already */
        sink += (uint64_t)deepest + nodes;
        if (cJSON_IsArray(patch) && only_tests(patch))
            check(server_jsonpatch_equal(out, doc));
    } else {
        check(out == NULL);
        check(r == SERVER_JSONPATCH_EINVAL || r == SERVER_JSONPATCH_ETEST ||
              r == SERVER_JSONPATCH_ETOOBIG || r == SERVER_JSONPATCH_ENOMEM);
    }
    for (const cJSON *op = cJSON_IsArray(patch) ? patch->child : NULL; op; op = op->next) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(op, "path");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(op, "from");
        if (cJSON_IsString(p))
            sink += server_jsonpatch_get(doc, p->valuestring) != NULL;
        if (cJSON_IsString(f))
            sink += server_jsonpatch_get(doc, f->valuestring) != NULL;
    }
    cJSON_free(before);
    cJSON_free(after);
    cJSON_Delete(out);
    cJSON_Delete(patch);
    cJSON_Delete(doc);
    return 0;
}
