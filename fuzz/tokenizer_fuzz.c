/* tokenizer_fuzz.c - libFuzzer target for tokenizer input: arbitrary bytes are encoded with a
 * byte-level BPE vocabulary (tiny-qwen2) and an SPM one (tiny-llama), both with and without
 * special-token parsing, decoded, and streamed. Byte-level BPE is lossless, so
 * decode(encode(x)) must give x back; SPM must too for plain text without U+2581.
 * The vocabularies are read once from $AR_SHARED (default ../shared, the fuzzer runs from the
 * repository root). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct tokenizer *load(const char *rel)
{
    const char *dir = getenv("AR_SHARED");
    char path[1024];
    struct gguf_file *f = NULL;
    struct tokenizer *tok = NULL;
    struct ar_err err = {0};
    snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : "../shared", rel);
    if (gguf_open(path, &f, &err) != AR_OK || tokenizer_load(f, &tok, &err) != AR_OK) {
        fprintf(stderr, "tokenizer_fuzz: cannot load %s: %s\n", path, err.msg);
        abort();
    }
    gguf_close(f);
    return tok;
}

static void check_stream(const struct tokenizer *tok, const int32_t *ids, int64_t n)
{
    struct tokenizer_stream st;
    const char *out;
    size_t len;
    tokenizer_stream_init(&st, false);
    for (int64_t i = 0; i < n; i++)
        if (tokenizer_stream_push(tok, &st, ids[i], &out, &len) != AR_OK)
            abort();
    if (tokenizer_stream_flush(&st, &out, &len) != AR_OK)
        abort();
    tokenizer_stream_fini(&st);
}

/* Encodes and decodes data; aborts on failure, or on a lossy round trip when must_match. */
static void round_trip(const struct tokenizer *tok, const uint8_t *data, size_t size,
                       bool add_special, bool parse_special, bool must_match)
{
    int32_t *ids = NULL;
    int64_t n = 0;
    char *back = NULL;
    size_t len = 0;
    if (tokenizer_encode(tok, (const char *)data, size, add_special, parse_special, &ids, &n) !=
        AR_OK)
        abort();
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(tok))
            abort();
        if (!parse_special && (tokenizer_token_attr(tok, ids[i]) & TOKENIZER_ATTR_CONTROL))
            abort(); /* control tokens only come from parse_special */
    }
    if (tokenizer_decode(tok, ids, n, false, &back, &len) != AR_OK)
        abort();
    if (must_match && (len != size || memcmp(back, data, size) != 0)) {
        fprintf(stderr, "tokenizer_fuzz: round trip changed %zu bytes into %zu\n", size, len);
        abort();
    }
    check_stream(tok, ids, n);
    ar_free(back);
    ar_free(ids);
}

static bool has_escaped_space(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i + 2 < size; i++)
        if (data[i] == 0xe2 && data[i + 1] == 0x96 && data[i + 2] == 0x81)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct tokenizer *bpe, *spm;
    if (!bpe) {
        bpe = load("fixtures/models/tiny-qwen2-f32.gguf");
        spm = load("fixtures/models/tiny-llama-f32.gguf");
    }
    round_trip(bpe, data, size, false, false, true);
    round_trip(bpe, data, size, true, true, true); /* control tokens render as their text */
    round_trip(spm, data, size, false, false, !has_escaped_space(data, size));
    round_trip(spm, data, size, true, true, false);
    return 0;
}
