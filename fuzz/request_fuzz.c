/* request_fuzz.c - fuzz target for the server's request path without an engine: bytes are
 * parsed as a JSON body and as a MessagePack body; each accepted tree is validated as a chat
 * and as a text completion request, then written as MessagePack and read back, which must
 * serialize to the same bytes. */
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

static void validate(const cJSON *body, enum server_oai_kind kind)
{
    struct server_oai_request r;
    struct server_oai_error e = {0};
    enum ar_status st = server_oai_request_parse(kind, body, 512, 6000, &r, &e);
    if (st == AR_OK) {
        check(r.max_tokens >= 0 && r.max_tokens <= 512);
        check(r.n_stop >= 0 && r.n_stop <= SERVER_OAI_MAX_STOP);
        for (int i = 0; i < r.n_stop; i++)
            sink += (uint8_t)r.stop[i][0];
        for (size_t i = 0; i < r.n_msgs; i++)
            sink += strlen(r.msgs[i].content) + (uint8_t)r.msgs[i].role[0];
        for (int i = 0; i < r.n_prompt_ids; i++)
            check(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < 6000);
        check(r.kind != SERVER_OAI_CHAT || r.n_msgs > 0);
    } else if (st == AR_EINVAL) {
        check(e.status == 400 && e.type && e.code);
        check(memchr(e.message, 0, sizeof(e.message)) != NULL);
    }
    server_oai_request_fini(&r);
}

static void one(enum server_codec_format fmt, const uint8_t *data, size_t size)
{
    cJSON *j = NULL, *back = NULL;
    char *out = NULL;
    size_t len = 0;
    if (server_codec_parse(fmt, (const char *)data, size, &j, NULL) != AR_OK)
        return;
    validate(j, SERVER_OAI_CHAT);
    validate(j, SERVER_OAI_COMPLETION);
    /* MessagePack out and back in must give the same bytes again (duplicate keys make
     * cJSON_Compare unreliable, so compare serializations) */
    if (server_codec_write(SERVER_CODEC_MSGPACK, j, &out, &len) == AR_OK) {
        enum ar_status st = server_codec_parse(SERVER_CODEC_MSGPACK, out, len, &back, NULL);
        check(st == AR_OK || st == AR_ENOMEM);
        if (st == AR_OK) {
            char *out2 = NULL;
            size_t len2 = 0;
            if (server_codec_write(SERVER_CODEC_MSGPACK, back, &out2, &len2) == AR_OK)
                check(len2 == len && !memcmp(out, out2, len));
            ar_free(out2);
        }
        cJSON_Delete(back);
        ar_free(out);
    }
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(SERVER_CODEC_JSON, data, size);
    one(SERVER_CODEC_MSGPACK, data, size);
    return 0;
}
