/* gguf_test.c - the GGUF reader against the llama.cpp fixtures (metadata, tensor index,
 * offsets), the writer by round trips and by rewriting fixtures byte for byte, and the
 * reader's defences: truncation, hostile headers, allocation failures. */
#include "harness/harness.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/types.h"
#include "gguf/gguf.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static struct gguf_file *open_shared(const char *rel)
{
    char path[512];
    struct gguf_file *f = NULL;
    struct ar_err err = {0};
    th_shared_path(path, sizeof(path), rel);
    if (gguf_open(path, &f, &err) != AR_OK)
        fail_msg("cannot open %s: %s", path, err.msg);
    return f;
}

static bool str_eq(struct gguf_str s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static void assert_str_key(const struct gguf_file *f, const char *key, const char *want)
{
    struct gguf_str s;
    if (!gguf_get_str(f, key, &s))
        fail_msg("missing string key %s", key);
    if (!str_eq(s, want))
        fail_msg("%s is '%.*s', expected '%s'", key, (int)s.len, s.ptr, want);
}

static void assert_u32_key(const struct gguf_file *f, const char *key, uint32_t want)
{
    uint32_t v;
    if (!gguf_get_u32(f, key, &v))
        fail_msg("missing integer key %s", key);
    if (v != want)
        fail_msg("%s is %" PRIu32 ", expected %" PRIu32, key, v, want);
}

static uint64_t arr_len(const struct gguf_file *f, const char *key, enum gguf_vtype type)
{
    const struct gguf_arr *a;
    if (!gguf_get_arr(f, key, &a))
        fail_msg("missing array key %s", key);
    if (a->type != type)
        fail_msg("%s has element type %s", key, gguf_vtype_name(a->type));
    return a->n;
}

static const char *const model_types[] = {"f32", "f16", "bf16", "q8_0", "q6_k", "q4_k_m", "q4_0"};
/* llama.cpp's file-type numbers (llama_ftype) for those files. */
static const uint32_t model_ftypes[] = {0, 1, 32, 7, 18, 15, 2};

/* Builds hostile files by hand. */
struct fb {
    uint8_t b[8192];
    size_t len;
};

static void fb_raw(struct fb *f, const void *p, size_t n)
{
    assert_true(f->len + n <= sizeof(f->b));
    memcpy(f->b + f->len, p, n);
    f->len += n;
}

static void fb_u32(struct fb *f, uint32_t v)
{
    uint8_t t[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    fb_raw(f, t, 4);
}

static void fb_u64(struct fb *f, uint64_t v)
{
    fb_u32(f, (uint32_t)v);
    fb_u32(f, (uint32_t)(v >> 32));
}

static void fb_str(struct fb *f, const char *s)
{
    fb_u64(f, strlen(s));
    fb_raw(f, s, strlen(s));
}

static void fb_header(struct fb *f, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    f->len = 0;
    fb_raw(f, "GGUF", 4);
    fb_u32(f, version);
    fb_u64(f, n_tensors);
    fb_u64(f, n_kv);
}

static void fb_tensor(struct fb *f, const char *name, uint32_t n_dims, const uint64_t *ne,
                      uint32_t type, uint64_t offset)
{
    fb_str(f, name);
    fb_u32(f, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        fb_u64(f, ne[d]);
    fb_u32(f, type);
    fb_u64(f, offset);
}

static void fb_pad(struct fb *f, size_t alignment)
{
    while (f->len % alignment)
        fb_raw(f, "", 1);
}

static void fb_zeros(struct fb *f, size_t n)
{
    while (n--)
        fb_raw(f, "", 1);
}

/* Opens f's bytes from an exact-size heap copy (so ASan sees any over-read) and expects
 * AR_EFORMAT with `msg_part` in the message. */
static void expect_format_error(const struct fb *f, const char *msg_part)
{
    struct gguf_file *g = NULL;
    struct ar_err err = {0};
    uint8_t *copy = malloc(f->len);
    assert_non_null(copy);
    memcpy(copy, f->b, f->len);
    enum ar_status st = gguf_open_memory(copy, f->len, &g, &err);
    if (st != AR_EFORMAT)
        fail_msg("expected a format error containing '%s', got status %d (%s)", msg_part, st,
                 err.msg);
    assert_null(g);
    if (!strstr(err.msg, msg_part))
        fail_msg("message '%s' does not contain '%s'", err.msg, msg_part);
    assert_non_null(strstr(err.msg, "offset"));
    assert_null(strchr(err.msg, '\n'));
    assert_int_equal(err.code, AR_EFORMAT);
    free(copy);
}

static struct gguf_file *expect_ok(const struct fb *f)
{
    struct gguf_file *g = NULL;
    struct ar_err err = {0};
    if (gguf_open_memory(f->b, f->len, &g, &err) != AR_OK)
        fail_msg("expected success, got: %s", err.msg);
    return g;
}

/* ---- fixtures ------------------------------------------------------------------------------- */

static void tiny_models_have_documented_metadata(void **state)
{
    (void)state;
    for (int arch = 0; arch < 2; arch++) {
        const char *a = arch ? "qwen2" : "llama";
        uint32_t n_vocab = arch ? 1024 : 768;
        for (size_t ti = 0; ti < AR_ARRAY_LEN(model_types); ti++) {
            char rel[128], key[128];
            snprintf(rel, sizeof(rel), "fixtures/models/tiny-%s-%s.gguf", a, model_types[ti]);
            struct gguf_file *f = open_shared(rel);
            float eps, freq;
            bool add_bos;
            const struct gguf_arr *tokens, *types;

            assert_true(gguf_version(f) == 3);
            assert_int_equal(gguf_alignment(f), 32);
            assert_str_key(f, "general.architecture", a);
            assert_u32_key(f, "general.file_type", model_ftypes[ti]);
            uint32_t qv;
            assert_int_equal(gguf_get_u32(f, "general.quantization_version", &qv), ti != 0);
#define ARCH_KEY(s) (snprintf(key, sizeof(key), "%s." s, a), key)
            assert_u32_key(f, ARCH_KEY("embedding_length"), 256);
            assert_u32_key(f, ARCH_KEY("block_count"), 2);
            assert_u32_key(f, ARCH_KEY("context_length"), 512);
            assert_u32_key(f, ARCH_KEY("feed_forward_length"), 768);
            assert_u32_key(f, ARCH_KEY("attention.head_count"), 4);
            assert_u32_key(f, ARCH_KEY("attention.head_count_kv"), 2);
            assert_u32_key(f, ARCH_KEY("rope.dimension_count"), 64);
            assert_u32_key(f, ARCH_KEY("vocab_size"), n_vocab);
            assert_true(gguf_get_f32(f, ARCH_KEY("attention.layer_norm_rms_epsilon"), &eps));
            assert_true(gguf_get_f32(f, ARCH_KEY("rope.freq_base"), &freq));
#undef ARCH_KEY
            assert_float_equal(eps, arch ? 1e-6f : 1e-5f, 1e-12f);
            assert_float_equal(freq, arch ? 1e6f : 1e4f, 0.0f);

            assert_int_equal(arr_len(f, "tokenizer.ggml.tokens", GGUF_VTYPE_STRING), n_vocab);
            assert_int_equal(arr_len(f, "tokenizer.ggml.token_type", GGUF_VTYPE_I32), n_vocab);
            assert_true(gguf_get_arr(f, "tokenizer.ggml.tokens", &tokens));
            assert_true(gguf_get_arr(f, "tokenizer.ggml.token_type", &types));
            assert_true(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos));
            assert_int_equal(add_bos, arch == 0);
            if (arch == 0) {
                assert_str_key(f, "tokenizer.ggml.model", "llama");
                assert_str_key(f, "tokenizer.ggml.pre", "default");
                assert_int_equal(arr_len(f, "tokenizer.ggml.scores", GGUF_VTYPE_F32), n_vocab);
                assert_u32_key(f, "tokenizer.ggml.bos_token_id", 1);
                assert_u32_key(f, "tokenizer.ggml.eos_token_id", 2);
                assert_u32_key(f, "tokenizer.ggml.unknown_token_id", 0);
                assert_true(str_eq(gguf_arr_str(tokens, 0), "<unk>"));
                assert_true(str_eq(gguf_arr_str(tokens, 1), "<s>"));
                assert_true(str_eq(gguf_arr_str(tokens, 2), "</s>"));
                for (int b = 0; b < 256; b++) {
                    char piece[8];
                    snprintf(piece, sizeof(piece), "<0x%02X>", b);
                    assert_true(str_eq(gguf_arr_str(tokens, 3 + (uint64_t)b), piece));
                    assert_int_equal(gguf_arr_int(types, 3 + (uint64_t)b), 6); /* BYTE */
                }
            } else {
                assert_str_key(f, "tokenizer.ggml.model", "gpt2");
                assert_str_key(f, "tokenizer.ggml.pre", "qwen2");
                assert_int_equal(arr_len(f, "tokenizer.ggml.merges", GGUF_VTYPE_STRING), 765);
                assert_u32_key(f, "tokenizer.ggml.bos_token_id", 1021);
                assert_u32_key(f, "tokenizer.ggml.padding_token_id", 1021);
                assert_u32_key(f, "tokenizer.ggml.eos_token_id", 1023);
                assert_true(str_eq(gguf_arr_str(tokens, 1021), "<|endoftext|>"));
                assert_true(str_eq(gguf_arr_str(tokens, 1022), "<|im_start|>"));
                assert_true(str_eq(gguf_arr_str(tokens, 1023), "<|im_end|>"));
                for (uint64_t id = 1021; id < 1024; id++)
                    assert_int_equal(gguf_arr_int(types, id), 3); /* CONTROL */
                assert_non_null(gguf_find(f, "tokenizer.chat_template"));
            }
            /* llama: 2 x 9 block tensors + embeddings, output norm, output; qwen2 adds 3
             * biases per block and ties the output to the embeddings. */
            assert_int_equal(gguf_n_tensors(f), arch ? 26 : 21);
            gguf_close(f);
        }
    }
}

/* Shapes as README section 1 lists them (ne = reversed numpy shape). */
static void f32_models_have_documented_tensor_shapes(void **state)
{
    (void)state;
    for (int arch = 0; arch < 2; arch++) {
        struct gguf_file *f = open_shared(arch ? "fixtures/models/tiny-qwen2-f32.gguf"
                                               : "fixtures/models/tiny-llama-f32.gguf");
        int64_t n_vocab = arch ? 1024 : 768;
        struct {
            const char *name;
            int64_t ne0, ne1;
        } want[] = {{"token_embd.weight", 256, n_vocab}, {"blk.0.attn_norm.weight", 256, 1},
                    {"blk.1.attn_q.weight", 256, 256},   {"blk.0.attn_k.weight", 256, 128},
                    {"blk.1.attn_v.weight", 256, 128},   {"blk.0.attn_output.weight", 256, 256},
                    {"blk.1.ffn_norm.weight", 256, 1},   {"blk.0.ffn_gate.weight", 256, 768},
                    {"blk.1.ffn_up.weight", 256, 768},   {"blk.0.ffn_down.weight", 768, 256},
                    {"output_norm.weight", 256, 1}};
        for (size_t i = 0; i < AR_ARRAY_LEN(want); i++) {
            const struct gguf_tensor *t = gguf_find_tensor(f, want[i].name);
            if (!t)
                fail_msg("missing tensor %s", want[i].name);
            assert_int_equal(t->type, AR_TYPE_F32);
            assert_int_equal(t->n_dims, want[i].ne1 == 1 ? 1 : 2);
            assert_int_equal(t->ne[0], want[i].ne0);
            assert_int_equal(t->ne[1], want[i].ne1);
            assert_int_equal(t->size, 4 * (uint64_t)want[i].ne0 * (uint64_t)want[i].ne1);
        }
        const struct gguf_tensor *out = gguf_find_tensor(f, "output.weight");
        const struct gguf_tensor *qb = gguf_find_tensor(f, "blk.0.attn_q.bias");
        assert_true(arch ? out == NULL : out != NULL);
        assert_true(arch ? qb != NULL : qb == NULL);
        if (qb) {
            assert_int_equal(qb->ne[0], 256);
            assert_int_equal(gguf_find_tensor(f, "blk.1.attn_k.bias")->ne[0], 128);
        }
        assert_null(gguf_find_tensor(f, "blk.2.attn_q.weight"));
        assert_null(gguf_find_tensor(f, ""));
        gguf_close(f);
    }
}

/* Every tensor entry of dequant/<file>.json: name, type, ne and absolute data offset. */
static void tensor_index_matches_dequant_references(void **state)
{
    (void)state;
    for (int arch = 0; arch < 2; arch++) {
        for (size_t ti = 1; ti < AR_ARRAY_LEN(model_types); ti++) {
            char rel[128], path[512];
            const char *a = arch ? "qwen2" : "llama";
            snprintf(rel, sizeof(rel), "fixtures/dequant/tiny-%s-%s.json", a, model_types[ti]);
            cJSON *j = th_read_json(th_shared_path(path, sizeof(path), rel));
            snprintf(rel, sizeof(rel), "fixtures/models/tiny-%s-%s.gguf", a, model_types[ti]);
            struct gguf_file *f = open_shared(rel);
            const uint8_t *base = gguf_tensor_at(f, 0)->data;
            base -= gguf_data_offset(f) + gguf_tensor_at(f, 0)->offset; /* file start */
            cJSON *tensors = cJSON_GetObjectItem(j, "tensors"), *e;
            assert_int_equal(cJSON_GetArraySize(tensors), gguf_n_tensors(f));
            cJSON_ArrayForEach(e, tensors)
            {
                const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
                const char *type = cJSON_GetObjectItem(e, "type")->valuestring;
                cJSON *ne = cJSON_GetObjectItem(e, "ne");
                double off = cJSON_GetObjectItem(e, "offset")->valuedouble;
                const struct gguf_tensor *t = gguf_find_tensor(f, name);
                enum ar_type want_type;
                if (!t)
                    fail_msg("%s: missing tensor %s", rel, name);
                assert_true(ar_type_from_name(type, &want_type));
                assert_int_equal(t->type, want_type);
                assert_int_equal(t->n_dims, cJSON_GetArraySize(ne));
                for (int d = 0; d < t->n_dims; d++)
                    assert_int_equal(t->ne[d], (int64_t)cJSON_GetArrayItem(ne, d)->valuedouble);
                assert_int_equal(gguf_data_offset(f) + t->offset, (uint64_t)off);
                assert_ptr_equal(t->data, base + (uint64_t)off);
                assert_int_equal(t->size, ar_type_row_size(t->type, t->ne[0]) *
                                              (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]));
            }
            /* The dumped rows are the first bytes of the tensor as stored. */
            cJSON *dq = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "dequant"), 0);
            const struct gguf_tensor *t =
                gguf_find_tensor(f, cJSON_GetObjectItem(dq, "tensor")->valuestring);
            assert_non_null(t);
            assert_int_equal(cJSON_GetObjectItem(dq, "type_size")->valuedouble,
                             ar_type_info(t->type)->type_size);
            assert_int_equal(cJSON_GetObjectItem(dq, "row_bytes")->valuedouble,
                             ar_type_row_size(t->type, t->ne[0]));
            gguf_close(f);
            cJSON_Delete(j);
        }
    }
}

static void vocab_only_files_have_tokens_and_no_tensors(void **state)
{
    static const struct {
        const char *file, *model, *pre;
        uint32_t n_vocab;
    } vocabs[] = {
        {"llama-spm", "llama", "default", 32000},
        {"phi-3", "llama", "default", 32064},
        {"gpt-2", "gpt2", "gpt-2", 50257},
        {"deepseek-llm", "gpt2", "deepseek-llm", 102400},
    };
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(vocabs); i++) {
        char rel[128], path[512];
        snprintf(rel, sizeof(rel), "fixtures/tokenizer/vocabs/ggml-vocab-%s.gguf", vocabs[i].file);
        struct gguf_file *f = open_shared(rel);
        const struct gguf_arr *tokens;
        assert_int_equal(gguf_n_tensors(f), 0);
        assert_null(gguf_tensor_at(f, 0));
        assert_str_key(f, "tokenizer.ggml.model", vocabs[i].model);
        assert_str_key(f, "tokenizer.ggml.pre", vocabs[i].pre);
        assert_int_equal(arr_len(f, "tokenizer.ggml.tokens", GGUF_VTYPE_STRING), vocabs[i].n_vocab);
        assert_int_equal(arr_len(f, "tokenizer.ggml.token_type", GGUF_VTYPE_I32),
                         vocabs[i].n_vocab);
        if (!strcmp(vocabs[i].model, "llama"))
            assert_int_equal(arr_len(f, "tokenizer.ggml.scores", GGUF_VTYPE_F32),
                             vocabs[i].n_vocab);
        else
            assert_true(arr_len(f, "tokenizer.ggml.merges", GGUF_VTYPE_STRING) > 0);
        assert_true(gguf_get_arr(f, "tokenizer.ggml.tokens", &tokens));

        /* Every id in llama.cpp's own tokenizations is a valid index into the token array,
         * and its add_bos flag is the file's. */
        snprintf(rel, sizeof(rel), "fixtures/tokenizer/tok-%s.json", vocabs[i].file);
        cJSON *j = th_read_json(th_shared_path(path, sizeof(path), rel)), *e, *id;
        int n_ids = 0;
        bool add_bos;
        if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos))
            assert_int_equal(
                add_bos, cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "add_bos")));
        cJSON_ArrayForEach(e, j)
        {
            cJSON_ArrayForEach(id, cJSON_GetObjectItem(e, "ids"))
            {
                assert_true(id->valuedouble >= 0 && id->valuedouble < vocabs[i].n_vocab);
                n_ids++;
            }
        }
        assert_true(n_ids > 100);
        cJSON_Delete(j);
        gguf_close(f);
    }
}

static void demo_model_matches_its_model_card(void **state)
{
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
    (void)state;
    struct gguf_file *f = open_shared("models/autoreply-demo-q8_0.gguf");
    const struct gguf_arr *tokens;
    bool b;
    assert_int_equal(gguf_file_size(f), 6748512);
    assert_str_key(f, "general.architecture", "llama");
    assert_u32_key(f, "llama.embedding_length", 256);
    assert_u32_key(f, "llama.block_count", 4);
    assert_u32_key(f, "llama.attention.head_count", 8);
    assert_u32_key(f, "llama.attention.head_count_kv", 4);
    assert_u32_key(f, "llama.feed_forward_length", 768);
    assert_u32_key(f, "llama.context_length", 512);
    assert_u32_key(f, "llama.vocab_size", 6000);
    assert_u32_key(f, "tokenizer.ggml.eos_token_id", 4);
    assert_true(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) && !b);
    assert_true(gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b) && !b);
    assert_true(gguf_get_arr(f, "tokenizer.ggml.tokens", &tokens));
    assert_int_equal(tokens->n, 6000);
    for (uint64_t i = 0; i < AR_ARRAY_LEN(pieces); i++)
        assert_true(str_eq(gguf_arr_str(tokens, i), pieces[i]));
    /* 4 blocks x 9 tensors + token_embd, output_norm, output */
    assert_int_equal(gguf_n_tensors(f), 39);
    int64_t n_params = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        assert_true(t->type == (t->n_dims == 1 ? AR_TYPE_F32 : AR_TYPE_Q8_0));
    }
    assert_int_equal(n_params, 6220032);
    gguf_close(f);
}

/* ---- writer --------------------------------------------------------------------------------- */

/* Rewriting a llama.cpp-written file through the writer (values copied with set_value,
 * tensors borrowed) reproduces it exactly: same layout, padding and offsets. */
static void writer_reproduces_fixture_byte_for_byte(void **state)
{
    static const char *const files[] = {"fixtures/models/tiny-llama-q4_k_m.gguf",
                                        "fixtures/models/tiny-qwen2-q8_0.gguf"};
    (void)state;
    for (size_t k = 0; k < AR_ARRAY_LEN(files); k++) {
        char path[512];
        size_t orig_len, out_len;
        char *orig = th_read_file(th_shared_path(path, sizeof(path), files[k]), &orig_len);
        struct gguf_file *f = open_shared(files[k]);
        struct gguf_writer *w;
        void *out;
        struct ar_err err = {0};
        assert_non_null(orig);
        assert_int_equal(gguf_writer_create(&w), AR_OK);
        for (int64_t i = 0; i < gguf_n_kv(f); i++) {
            const struct gguf_kv *kv = gguf_kv_at(f, i);
            char key[256];
            snprintf(key, sizeof(key), "%.*s", (int)kv->key.len, kv->key.ptr);
            assert_int_equal(gguf_writer_set_value(w, key, &kv->value), AR_OK);
        }
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(f, i);
            assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                                    t->size, true),
                             AR_OK);
        }
        assert_int_equal(gguf_writer_write_memory(w, &out, &out_len, &err), AR_OK);
        assert_int_equal(out_len, orig_len);
        assert_memory_equal(out, orig, orig_len);
        ar_free(out);
        gguf_writer_destroy(w);
        gguf_close(f);
        free(orig);
    }
}

struct rt_tensor {
    const char *name;
    enum ar_type type;
    int n_dims;
    int64_t ne[4];
};

static const struct rt_tensor rt_tensors[] = {
    {"a.f32", AR_TYPE_F32, 1, {3, 1, 1, 1}},     {"b.q8_0", AR_TYPE_Q8_0, 2, {64, 3, 1, 1}},
    {"c.q4_k", AR_TYPE_Q4_K, 3, {256, 2, 2, 1}}, {"d.f16", AR_TYPE_F16, 4, {5, 1, 2, 3}},
    {"e.q5_0", AR_TYPE_Q5_0, 2, {32, 1, 1, 1}}, /* known but unsupported: still indexed */
};

/* A writer holding one value of every type, fixed arrays of every fixed type, string
 * arrays, nested arrays, and rt_tensors filled with a byte pattern. */
static struct gguf_writer *make_rich_writer(uint32_t alignment, uint8_t **tensor_data)
{
    static const uint8_t u8s[] = {0, 1, 255};
    static const int8_t i8s[] = {-128, 0, 127};
    static const uint16_t u16s[] = {0, 65535};
    static const int16_t i16s[] = {-32768, 32767};
    static const uint32_t u32s[] = {0, 7, UINT32_MAX};
    static const int32_t i32s[] = {INT32_MIN, -1, INT32_MAX};
    static const float f32s[] = {-1.5f, 0.0f, 3.25e10f};
    static const bool bools[] = {true, false, true};
    static const uint64_t u64s[] = {UINT64_MAX, 1};
    static const int64_t i64s[] = {INT64_MIN, INT64_MAX};
    static const double f64s[] = {1e-300, -2.5};
    static const struct gguf_str strs[] = {{"alpha", 5}, {"", 0}, {"z\0y", 3}};
    struct gguf_writer *w;
    struct gguf_value v, inner[2], outer[1], leaves[3];

    assert_int_equal(gguf_writer_create(&w), AR_OK);
    if (alignment)
        assert_int_equal(gguf_writer_set_u32(w, "general.alignment", alignment), AR_OK);
    assert_int_equal(gguf_writer_set_u32(w, "s.u32", 4000000000u), AR_OK);
    assert_int_equal(gguf_writer_set_i32(w, "s.i32", -7), AR_OK);
    assert_int_equal(gguf_writer_set_u64(w, "s.u64", UINT64_MAX), AR_OK);
    assert_int_equal(gguf_writer_set_f32(w, "s.f32", 0.1f), AR_OK);
    assert_int_equal(gguf_writer_set_bool(w, "s.bool", true), AR_OK);
    assert_int_equal(gguf_writer_set_str(w, "s.str", "héllo"), AR_OK);
    v.type = GGUF_VTYPE_U8, v.v.u64 = 200;
    assert_int_equal(gguf_writer_set_value(w, "s.u8", &v), AR_OK);
    v.type = GGUF_VTYPE_I8, v.v.i64 = -100;
    assert_int_equal(gguf_writer_set_value(w, "s.i8", &v), AR_OK);
    v.type = GGUF_VTYPE_U16, v.v.u64 = 60000;
    assert_int_equal(gguf_writer_set_value(w, "s.u16", &v), AR_OK);
    v.type = GGUF_VTYPE_I16, v.v.i64 = -30000;
    assert_int_equal(gguf_writer_set_value(w, "s.i16", &v), AR_OK);
    v.type = GGUF_VTYPE_I64, v.v.i64 = INT64_MIN;
    assert_int_equal(gguf_writer_set_value(w, "s.i64", &v), AR_OK);
    v.type = GGUF_VTYPE_F64, v.v.f64 = -1.0 / 3.0;
    assert_int_equal(gguf_writer_set_value(w, "s.f64", &v), AR_OK);

    assert_int_equal(gguf_writer_set_arr(w, "a.u8", GGUF_VTYPE_U8, u8s, 3), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.i8", GGUF_VTYPE_I8, i8s, 3), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.u16", GGUF_VTYPE_U16, u16s, 2), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.i16", GGUF_VTYPE_I16, i16s, 2), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.u32", GGUF_VTYPE_U32, u32s, 3), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.i32", GGUF_VTYPE_I32, i32s, 3), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.f32", GGUF_VTYPE_F32, f32s, 3), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.bool", GGUF_VTYPE_BOOL, bools, 3), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.u64", GGUF_VTYPE_U64, u64s, 2), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.i64", GGUF_VTYPE_I64, i64s, 2), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.f64", GGUF_VTYPE_F64, f64s, 2), AR_OK);
    assert_int_equal(gguf_writer_set_arr(w, "a.empty", GGUF_VTYPE_U32, NULL, 0), AR_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "a.str", strs, 3), AR_OK);

    /* [[["alpha", "", "z\0y"], []]]: array of arrays of arrays of strings */
    for (int i = 0; i < 3; i++) {
        leaves[i].type = GGUF_VTYPE_STRING;
        leaves[i].v.str = strs[i];
    }
    inner[0].type = GGUF_VTYPE_ARRAY;
    inner[0].v.arr = (struct gguf_arr){GGUF_VTYPE_STRING, 3, NULL, leaves};
    inner[1].type = GGUF_VTYPE_ARRAY;
    inner[1].v.arr = (struct gguf_arr){GGUF_VTYPE_STRING, 0, NULL, NULL};
    outer[0].type = GGUF_VTYPE_ARRAY;
    outer[0].v.arr = (struct gguf_arr){GGUF_VTYPE_ARRAY, 2, NULL, inner};
    v.type = GGUF_VTYPE_ARRAY;
    v.v.arr = (struct gguf_arr){GGUF_VTYPE_ARRAY, 1, NULL, outer};
    assert_int_equal(gguf_writer_set_value(w, "a.nested", &v), AR_OK);

    size_t total = 0;
    for (size_t i = 0; i < AR_ARRAY_LEN(rt_tensors); i++) {
        const struct rt_tensor *t = &rt_tensors[i];
        total += ar_type_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    }
    uint8_t *data = malloc(total);
    assert_non_null(data);
    for (size_t i = 0; i < total; i++)
        data[i] = (uint8_t)(i * 131 + 7);
    size_t at = 0;
    for (size_t i = 0; i < AR_ARRAY_LEN(rt_tensors); i++) {
        const struct rt_tensor *t = &rt_tensors[i];
        size_t size =
            ar_type_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data + at,
                                                size, i % 2 == 0),
                         AR_OK);
        at += size;
    }
    *tensor_data = data;
    return w;
}

static int64_t scalar_int(const struct gguf_file *f, const char *key)
{
    const struct gguf_value *v = gguf_find(f, key);
    assert_non_null(v);
    return v->v.i64;
}

static void check_rich_file(const struct gguf_file *f, uint64_t alignment, const uint8_t *data)
{
    const struct gguf_value *v;
    const struct gguf_arr *a;
    struct gguf_str s;
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;

    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), alignment);
    assert_int_equal(gguf_n_kv(f), 26 + (alignment != 32));
    /* insertion order */
    const struct gguf_kv *first = gguf_kv_at(f, alignment != 32 ? 1 : 0);
    assert_true(str_eq(first->key, "s.u32"));
    assert_true(str_eq(gguf_kv_at(f, gguf_n_kv(f) - 1)->key, "a.nested"));
    assert_null(gguf_kv_at(f, gguf_n_kv(f)));
    assert_null(gguf_kv_at(f, -1));

    assert_true(gguf_get_u32(f, "s.u32", &u32) && u32 == 4000000000u);
    assert_true(gguf_get_i64(f, "s.i32", &i64) && i64 == -7);
    assert_false(gguf_get_u32(f, "s.i32", &u32)); /* negative */
    assert_false(gguf_get_i64(f, "s.u64", &i64)); /* > INT64_MAX */
    assert_int_equal(gguf_find(f, "s.u64")->v.u64, UINT64_MAX);
    assert_true(gguf_get_f32(f, "s.f32", &f32) && f32 == 0.1f);
    assert_true(gguf_get_bool(f, "s.bool", &b) && b);
    assert_true(gguf_get_u32(f, "s.bool", &u32) && u32 == 1); /* bool counts as an integer */
    assert_false(gguf_get_bool(f, "s.u32", &b));
    assert_true(gguf_get_str(f, "s.str", &s) && str_eq(s, "héllo"));
    assert_false(gguf_get_str(f, "s.u32", &s));
    assert_false(gguf_get_f32(f, "s.u32", &f32));
    assert_false(gguf_get_u32(f, "no.such.key", &u32));
    assert_true(gguf_get_u32(f, "s.u8", &u32) && u32 == 200);
    assert_int_equal(gguf_find(f, "s.u8")->type, GGUF_VTYPE_U8);
    assert_int_equal(scalar_int(f, "s.i8"), -100);
    assert_true(gguf_get_u32(f, "s.u16", &u32) && u32 == 60000);
    assert_int_equal(scalar_int(f, "s.i16"), -30000);
    assert_int_equal(scalar_int(f, "s.i64"), INT64_MIN);
    v = gguf_find(f, "s.f64");
    assert_int_equal(v->type, GGUF_VTYPE_F64);
    assert_true(v->v.f64 == -1.0 / 3.0);
    assert_true(gguf_get_f32(f, "s.f64", &f32) && f32 == (float)(-1.0 / 3.0));

    static const struct {
        const char *key;
        enum gguf_vtype type;
        int64_t want[3];
        uint64_t n;
    } ints[] = {
        {"a.u8", GGUF_VTYPE_U8, {0, 1, 255}, 3},
        {"a.i8", GGUF_VTYPE_I8, {-128, 0, 127}, 3},
        {"a.u16", GGUF_VTYPE_U16, {0, 65535}, 2},
        {"a.i16", GGUF_VTYPE_I16, {-32768, 32767}, 2},
        {"a.u32", GGUF_VTYPE_U32, {0, 7, UINT32_MAX}, 3},
        {"a.i32", GGUF_VTYPE_I32, {INT32_MIN, -1, INT32_MAX}, 3},
        {"a.bool", GGUF_VTYPE_BOOL, {1, 0, 1}, 3},
        {"a.u64", GGUF_VTYPE_U64, {-1, 1}, 2}, /* UINT64_MAX reads back as its bits */
        {"a.i64", GGUF_VTYPE_I64, {INT64_MIN, INT64_MAX}, 2},
    };
    for (size_t i = 0; i < AR_ARRAY_LEN(ints); i++) {
        assert_true(gguf_get_arr(f, ints[i].key, &a));
        assert_int_equal(a->type, ints[i].type);
        assert_int_equal(a->n, ints[i].n);
        assert_null(a->items);
        for (uint64_t k = 0; k < a->n; k++)
            assert_int_equal(gguf_arr_int(a, k), ints[i].want[k]);
    }
    assert_true(gguf_get_arr(f, "a.f32", &a) && a->n == 3);
    assert_true(gguf_arr_f32(a, 0) == -1.5f && gguf_arr_f32(a, 2) == 3.25e10f);
    assert_true(gguf_get_arr(f, "a.f64", &a) && a->n == 2);
    assert_true(gguf_arr_f32(a, 1) == -2.5f);
    assert_true(gguf_get_arr(f, "a.empty", &a) && a->n == 0 && a->type == GGUF_VTYPE_U32);
    assert_true(gguf_get_arr(f, "a.str", &a) && a->n == 3 && a->type == GGUF_VTYPE_STRING);
    assert_true(str_eq(gguf_arr_str(a, 0), "alpha"));
    assert_int_equal(gguf_arr_str(a, 1).len, 0);
    s = gguf_arr_str(a, 2);
    assert_true(s.len == 3 && memcmp(s.ptr, "z\0y", 3) == 0);

    assert_true(gguf_get_arr(f, "a.nested", &a));
    assert_true(a->type == GGUF_VTYPE_ARRAY && a->n == 1);
    const struct gguf_arr *mid = &a->items[0].v.arr;
    assert_true(mid->type == GGUF_VTYPE_ARRAY && mid->n == 2);
    assert_true(mid->items[0].v.arr.type == GGUF_VTYPE_STRING && mid->items[0].v.arr.n == 3);
    assert_true(str_eq(gguf_arr_str(&mid->items[0].v.arr, 0), "alpha"));
    assert_true(mid->items[1].v.arr.n == 0);

    assert_int_equal(gguf_n_tensors(f), AR_ARRAY_LEN(rt_tensors));
    assert_int_equal(gguf_data_offset(f) % alignment, 0);
    size_t at = 0;
    for (size_t i = 0; i < AR_ARRAY_LEN(rt_tensors); i++) {
        const struct rt_tensor *r = &rt_tensors[i];
        const struct gguf_tensor *t = gguf_tensor_at(f, (int64_t)i);
        size_t size =
            ar_type_row_size(r->type, r->ne[0]) * (size_t)(r->ne[1] * r->ne[2] * r->ne[3]);
        assert_string_equal(t->name, r->name);
        assert_ptr_equal(gguf_find_tensor(f, r->name), t);
        assert_int_equal(t->type, r->type);
        assert_int_equal(t->n_dims, r->n_dims);
        assert_memory_equal(t->ne, r->ne, sizeof(t->ne));
        assert_int_equal(t->size, size);
        assert_int_equal(t->offset % alignment, 0);
        assert_memory_equal(t->data, data + at, size);
        at += size;
    }
}

static void writer_round_trips_every_value_type_and_tensor(void **state)
{
    static const uint32_t alignments[] = {0, 1, 64, 4096};
    (void)state;
    for (size_t k = 0; k < AR_ARRAY_LEN(alignments); k++) {
        uint8_t *data;
        void *buf;
        size_t len;
        struct gguf_file *f;
        struct ar_err err = {0};
        struct gguf_writer *w = make_rich_writer(alignments[k], &data);
        uint64_t al = alignments[k] ? alignments[k] : 32;
        assert_int_equal(gguf_writer_write_memory(w, &buf, &len, &err), AR_OK);
        gguf_writer_destroy(w);
        /* file offsets, not just relative ones, are aligned: copy to an aligned buffer */
        uint8_t *aligned = ar_malloc_aligned(len);
        memcpy(aligned, buf, len);
        assert_int_equal(gguf_open_memory(aligned, len, &f, &err), AR_OK);
        check_rich_file(f, al, data);
        if (al <= 64)
            for (int64_t i = 0; i < gguf_n_tensors(f); i++)
                assert_int_equal((uintptr_t)gguf_tensor_at(f, i)->data % al, 0);
        gguf_close(f);
        ar_free_aligned(aligned);
        ar_free(buf);
        free(data);
    }
}

static void writer_writes_files_atomically(void **state)
{
    char dir[] = "/tmp/gguf_test.XXXXXX", path[256], tmp[320], bad[300];
    uint8_t *data;
    struct ar_err err = {0};
    struct gguf_file *f;
    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/out.gguf", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    struct gguf_writer *w = make_rich_writer(128, &data);
    assert_int_equal(gguf_writer_write(w, path, &err), AR_OK);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(gguf_open(path, &f, &err), AR_OK);
    check_rich_file(f, 128, data);
    gguf_close(f);

    /* replacing a key keeps its position; the file is rewritten in place */
    assert_int_equal(gguf_writer_set_u32(w, "s.u32", 5), AR_OK);
    assert_int_equal(gguf_writer_write(w, path, &err), AR_OK);
    assert_int_equal(gguf_open(path, &f, &err), AR_OK);
    assert_true(str_eq(gguf_kv_at(f, 1)->key, "s.u32"));
    assert_int_equal(gguf_find(f, "s.u32")->v.u64, 5);
    gguf_close(f);

    /* a directory that does not exist: AR_EIO, nothing left behind, old file intact */
    snprintf(bad, sizeof(bad), "%s/missing/out.gguf", dir);
    memset(&err, 0, sizeof(err));
    assert_int_equal(gguf_writer_write(w, bad, &err), AR_EIO);
    assert_non_null(strstr(err.msg, "missing"));
    /* a target that is a directory: the rename fails and the tmp file is removed */
    snprintf(bad, sizeof(bad), "%s/sub", dir);
    assert_int_equal(mkdir(bad, 0700), 0);
    snprintf(tmp, sizeof(tmp), "%s.tmp", bad);
    assert_int_equal(gguf_writer_write(w, bad, &err), AR_EIO);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(rmdir(bad), 0);

    /* a non-power-of-two alignment is refused */
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 48), AR_OK);
    assert_int_equal(gguf_writer_write(w, path, &err), AR_EINVAL);
    gguf_writer_destroy(w);
    free(data);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

static void writer_rejects_invalid_tensors_and_values(void **state)
{
    struct gguf_writer *w;
    uint8_t buf[4096] = {0};
    int64_t ne[4] = {64, 2, 1, 1};
    struct gguf_value v;
    (void)state;
    assert_int_equal(gguf_writer_create(&w), AR_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t", AR_TYPE_Q8_0, 2, ne, buf, 4 * 34, false),
                     AR_OK);
    /* duplicate name, wrong size, ne[0] not a multiple of the block, unknown type, dims */
    assert_int_equal(gguf_writer_add_tensor(w, "t", AR_TYPE_Q8_0, 2, ne, buf, 136, false),
                     AR_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "u", AR_TYPE_Q8_0, 2, ne, buf, 135, false),
                     AR_EINVAL);
    ne[0] = 33;
    assert_int_equal(gguf_writer_add_tensor(w, "u", AR_TYPE_Q8_0, 1, ne, buf, 34, false),
                     AR_EINVAL);
    ne[0] = 4;
    assert_int_equal(gguf_writer_add_tensor(w, "u", (enum ar_type)4, 1, ne, buf, 16, false),
                     AR_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "u", AR_TYPE_F32, 5, ne, buf, 16, false), AR_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "u", AR_TYPE_F32, 0, ne, buf, 16, false), AR_EINVAL);
    ne[0] = 0;
    assert_int_equal(gguf_writer_add_tensor(w, "u", AR_TYPE_F32, 1, ne, buf, 0, false), AR_EINVAL);
    ne[0] = 4;
    assert_int_equal(gguf_writer_add_tensor(w, "", AR_TYPE_F32, 1, ne, buf, 16, false), AR_EINVAL);
    assert_int_equal(gguf_writer_set_arr(w, "k", GGUF_VTYPE_STRING, buf, 1), AR_EINVAL);
    assert_int_equal(gguf_writer_set_arr(w, "k", GGUF_VTYPE_U64, buf, UINT64_MAX / 4), AR_EINVAL);
    assert_int_equal(gguf_writer_set_u32(w, "", 1), AR_EINVAL);
    v.type = GGUF_VTYPE_ARRAY;
    v.v.arr = (struct gguf_arr){GGUF_VTYPE_STRING, 2, NULL, NULL};
    assert_int_equal(gguf_writer_set_value(w, "k", &v), AR_EINVAL);
    gguf_writer_destroy(w);
    gguf_writer_destroy(NULL);
    gguf_close(NULL);
}

/* ---- hostile input ------------------------------------------------------------------------ */

/* A small valid file: every prefix shorter than its last tensor byte must fail cleanly. */
static void every_truncation_fails_cleanly(void **state)
{
    uint8_t *data, *buf;
    size_t len;
    struct ar_err err = {0};
    struct gguf_file *f;
    (void)state;
    struct gguf_writer *w = make_rich_writer(0, &data);
    assert_int_equal(gguf_writer_write_memory(w, (void **)&buf, &len, &err), AR_OK);
    gguf_writer_destroy(w);
    assert_int_equal(gguf_open_memory(buf, len, &f, &err), AR_OK);
    uint64_t end = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        end = AR_MAX(end, gguf_data_offset(f) + t->offset + t->size);
    }
    gguf_close(f);
    assert_true(len < 65536);
    for (size_t n = 0; n <= len; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        f = (struct gguf_file *)1;
        enum ar_status st = gguf_open_memory(copy, n, &f, &err);
        if (n < end) {
            if (st != AR_EFORMAT)
                fail_msg("prefix of %zu bytes: status %d", n, st);
            assert_null(f);
        } else {
            assert_int_equal(st, AR_OK);
            gguf_close(f);
        }
        free(copy);
    }
    ar_free(buf);
    free(data);
}

static void hostile_counts_fail_fast(void **state)
{
    struct fb f;
    (void)state;
    fb_header(&f, 3, 0, (uint64_t)1 << 60);
    fb_zeros(&f, 64);
    expect_format_error(&f, "key/value count 1152921504606846976");
    fb_header(&f, 3, (uint64_t)1 << 60, 0);
    fb_zeros(&f, 64);
    expect_format_error(&f, "tensor count");
    fb_header(&f, 3, UINT64_MAX, UINT64_MAX);
    expect_format_error(&f, "count");

    /* key length far beyond the file */
    fb_header(&f, 3, 0, 1);
    fb_u64(&f, (uint64_t)1 << 63);
    fb_zeros(&f, 16);
    expect_format_error(&f, "key length 9223372036854775808");
    /* a string value whose length runs one byte past the end */
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "k");
    fb_u32(&f, GGUF_VTYPE_STRING);
    fb_u64(&f, 4);
    fb_raw(&f, "abc", 3);
    expect_format_error(&f, "string value length 4");
    /* u64 array whose n * 8 wraps around to 0 */
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "k");
    fb_u32(&f, GGUF_VTYPE_ARRAY);
    fb_u32(&f, GGUF_VTYPE_U64);
    fb_u64(&f, (uint64_t)1 << 61);
    expect_format_error(&f, "array of 2305843009213693952 u64");
    /* string array with 2^62 elements */
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "k");
    fb_u32(&f, GGUF_VTYPE_ARRAY);
    fb_u32(&f, GGUF_VTYPE_STRING);
    fb_u64(&f, (uint64_t)1 << 62);
    fb_zeros(&f, 64);
    expect_format_error(&f, "array of 4611686018427387904 string");
    /* arrays of arrays claiming more elements than bytes */
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "k");
    fb_u32(&f, GGUF_VTYPE_ARRAY);
    fb_u32(&f, GGUF_VTYPE_ARRAY);
    fb_u64(&f, 1000);
    fb_zeros(&f, 120);
    expect_format_error(&f, "array of 1000 array");
}

static void bad_headers_are_rejected_with_clear_messages(void **state)
{
    struct fb f;
    (void)state;
    fb_header(&f, 3, 0, 0);
    memcpy(f.b, "GGUG", 4);
    expect_format_error(&f, "bad magic");
    f.len = 3;
    expect_format_error(&f, "bad magic");
    fb_header(&f, 1, 0, 0);
    expect_format_error(&f, "unsupported version 1");
    fb_header(&f, 4, 0, 0);
    expect_format_error(&f, "unsupported version 4");
    fb_header(&f, 0x03000000u, 0, 0);
    expect_format_error(&f, "big-endian");
    fb_header(&f, 2, 0, 0); /* version 2 is read */
    gguf_close(expect_ok(&f));

    /* unknown value types, bad bools, bad keys, duplicates */
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "k");
    fb_u32(&f, 13);
    fb_u32(&f, 0);
    expect_format_error(&f, "unknown value type 13");
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "k");
    fb_u32(&f, GGUF_VTYPE_BOOL);
    fb_raw(&f, "\2", 1);
    expect_format_error(&f, "bool value is 2");
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "");
    fb_u32(&f, GGUF_VTYPE_U8);
    fb_raw(&f, "\1", 1);
    expect_format_error(&f, "empty key");
    fb_header(&f, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        fb_str(&f, "same.key");
        fb_u32(&f, GGUF_VTYPE_U8);
        fb_raw(&f, "\1", 1);
    }
    expect_format_error(&f, "duplicate key 'same.key'");
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "k");
    fb_u32(&f, GGUF_VTYPE_ARRAY);
    fb_u32(&f, 77);
    fb_u64(&f, 0);
    expect_format_error(&f, "unknown array element type 77");
}

static void nested_arrays_are_bounded_in_depth(void **state)
{
    struct fb f;
    (void)state;
    for (int depth = 1; depth <= 9; depth++) {
        fb_header(&f, 3, 0, 1);
        fb_str(&f, "nest");
        fb_u32(&f, GGUF_VTYPE_ARRAY);
        for (int d = 1; d < depth; d++) {
            fb_u32(&f, GGUF_VTYPE_ARRAY);
            fb_u64(&f, 1);
        }
        fb_u32(&f, GGUF_VTYPE_STRING);
        fb_u64(&f, 1);
        fb_str(&f, "leaf");
        if (depth <= 8) {
            struct gguf_file *g = expect_ok(&f);
            const struct gguf_value *v = gguf_find(g, "nest");
            for (int d = 1; d < depth; d++)
                v = &v->v.arr.items[0];
            assert_true(str_eq(gguf_arr_str(&v->v.arr, 0), "leaf"));
            gguf_close(g);
        } else {
            expect_format_error(&f, "nested deeper than 8");
        }
    }
}

static void bad_alignment_values_are_rejected(void **state)
{
    struct fb f;
    (void)state;
    static const uint32_t bad[] = {0, 3, 48, 0x80000001u};
    for (size_t i = 0; i < AR_ARRAY_LEN(bad); i++) {
        fb_header(&f, 3, 0, 1);
        fb_str(&f, "general.alignment");
        fb_u32(&f, GGUF_VTYPE_U32);
        fb_u32(&f, bad[i]);
        struct gguf_file *g = NULL;
        struct ar_err err = {0};
        assert_int_equal(gguf_open_memory(f.b, f.len, &g, &err), AR_EFORMAT);
        assert_non_null(strstr(err.msg, "not a nonzero power of two"));
    }
    fb_header(&f, 3, 0, 1);
    fb_str(&f, "general.alignment");
    fb_u32(&f, GGUF_VTYPE_U64);
    fb_u64(&f, 64);
    struct gguf_file *g = NULL;
    struct ar_err err = {0};
    assert_int_equal(gguf_open_memory(f.b, f.len, &g, &err), AR_EFORMAT);
    assert_non_null(strstr(err.msg, "expected u32"));
}

/* One f32 tensor info with the given fields, data section of data_size bytes. */
static void one_tensor(struct fb *f, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                       uint64_t offset, size_t data_size)
{
    fb_header(f, 3, 1, 0);
    fb_tensor(f, "t", n_dims, ne, type, offset);
    fb_pad(f, 32);
    fb_zeros(f, data_size);
}

static void hostile_tensor_infos_are_rejected(void **state)
{
    struct fb f;
    uint64_t ne[5] = {32, 2, 1, 1, 1};
    (void)state;
    one_tensor(&f, 2, ne, AR_TYPE_F32, 0, 256); /* the valid baseline */
    struct gguf_file *g = expect_ok(&f);
    assert_int_equal(gguf_tensor_at(g, 0)->size, 256);
    gguf_close(g);

    one_tensor(&f, 5, ne, AR_TYPE_F32, 0, 256);
    expect_format_error(&f, "has 5 dimensions");
    one_tensor(&f, 0, ne, AR_TYPE_F32, 0, 256);
    expect_format_error(&f, "has 0 dimensions");
    one_tensor(&f, 2, ne, 99, 0, 256);
    expect_format_error(&f, "unknown type 99");
    one_tensor(&f, 2, ne, 4, 0, 256); /* a number ggml retired */
    expect_format_error(&f, "unknown type 4");
    one_tensor(&f, 2, ne, AR_TYPE_F32, 32, 256);
    expect_format_error(&f, "runs past the end of the data section");
    one_tensor(&f, 2, ne, AR_TYPE_F32, 16, 512);
    expect_format_error(&f, "not a multiple of the alignment 32");
    one_tensor(&f, 2, ne, AR_TYPE_F32, UINT64_MAX - 31, 256);
    expect_format_error(&f, "runs past the end");
    one_tensor(&f, 1, ne, AR_TYPE_Q8_0, 0, 34);
    gguf_close(expect_ok(&f));
    ne[0] = 33;
    one_tensor(&f, 1, ne, AR_TYPE_Q8_0, 0, 64);
    expect_format_error(&f, "not a multiple of the q8_0 block size 32");
    ne[0] = 0;
    one_tensor(&f, 2, ne, AR_TYPE_F32, 0, 256);
    expect_format_error(&f, "dimension 0 is 0");
    ne[0] = UINT64_MAX; /* negative as int64 */
    one_tensor(&f, 2, ne, AR_TYPE_F32, 0, 256);
    expect_format_error(&f, "dimension 0 is -1");
    ne[0] = (uint64_t)1 << 32;
    ne[1] = (uint64_t)1 << 32;
    one_tensor(&f, 2, ne, AR_TYPE_F32, 0, 256);
    expect_format_error(&f, "element count overflows");
    ne[0] = (uint64_t)1 << 62;
    ne[1] = 1;
    one_tensor(&f, 2, ne, AR_TYPE_F32, 0, 256); /* 2^62 elements x 4 bytes */
    expect_format_error(&f, "byte size overflows");

    /* known but unsupported types are indexed all the same */
    ne[0] = 32;
    one_tensor(&f, 1, ne, AR_TYPE_Q5_0, 0, 22);
    g = expect_ok(&f);
    assert_int_equal(gguf_tensor_at(g, 0)->type, AR_TYPE_Q5_0);
    gguf_close(g);

    /* two tensors: overlapping data, duplicate names */
    ne[0] = 16;
    fb_header(&f, 3, 2, 0);
    fb_tensor(&f, "a", 1, ne, AR_TYPE_F32, 0);
    fb_tensor(&f, "b", 1, ne, AR_TYPE_F32, 64);
    fb_pad(&f, 32);
    fb_zeros(&f, 128);
    gguf_close(expect_ok(&f)); /* adjacent */
    fb_header(&f, 3, 2, 0);
    fb_tensor(&f, "a", 1, ne, AR_TYPE_F32, 0);
    fb_tensor(&f, "b", 1, ne, AR_TYPE_F32, 32);
    fb_pad(&f, 32);
    fb_zeros(&f, 128);
    expect_format_error(&f, "data of tensors 'a' and 'b' overlap");
    fb_header(&f, 3, 2, 0);
    fb_tensor(&f, "a", 1, ne, AR_TYPE_F32, 64);
    fb_tensor(&f, "b", 1, ne, AR_TYPE_F32, 0);
    fb_pad(&f, 32);
    fb_zeros(&f, 128);
    gguf_close(expect_ok(&f)); /* out of order but disjoint is fine */
    ne[0] = 16;
    fb_header(&f, 3, 2, 0);
    fb_tensor(&f, "a", 1, ne, AR_TYPE_F32, 32);
    ne[0] = 32;
    fb_tensor(&f, "b", 1, ne, AR_TYPE_F32, 0); /* 128 bytes: covers a */
    fb_pad(&f, 32);
    fb_zeros(&f, 128);
    expect_format_error(&f, "overlap");
    fb_header(&f, 3, 2, 0);
    fb_tensor(&f, "a", 1, ne, AR_TYPE_F32, 0);
    fb_tensor(&f, "a", 1, ne, AR_TYPE_F32, 128);
    fb_pad(&f, 32);
    fb_zeros(&f, 256);
    expect_format_error(&f, "duplicate tensor name 'a'");
}

static void open_reports_missing_and_empty_files(void **state)
{
    char dir[] = "/tmp/gguf_test.XXXXXX", path[256];
    struct gguf_file *f = NULL;
    struct ar_err err = {0};
    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/none.gguf", dir);
    assert_int_equal(gguf_open(path, &f, &err), AR_EIO);
    assert_non_null(strstr(err.msg, "none.gguf"));
    assert_int_equal(gguf_open(dir, &f, &err), AR_EIO); /* a directory */
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(gguf_open(path, &f, &err), AR_EFORMAT);
    fp = fopen(path, "wb");
    fwrite("GGUF\3\0\0\0", 1, 8, fp); /* header cut after the version */
    fclose(fp);
    assert_int_equal(gguf_open(path, &f, &err), AR_EFORMAT);
    assert_non_null(strstr(err.msg, "tensor count"));
    assert_null(f);
    assert_int_equal(gguf_open_memory(NULL, 0, &f, &err), AR_EFORMAT);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* Every allocation of gguf_open_memory can fail: AR_ENOMEM, nothing leaked (LSan). */
static void open_survives_every_allocation_failure(void **state)
{
    char path[512];
    size_t len = 0;
    (void)state;
    char *buf = th_read_file(
        th_shared_path(path, sizeof(path), "fixtures/models/tiny-qwen2-q4_0.gguf"), &len);
    assert_non_null(buf);
    uint64_t n;
    for (n = 1;; n++) {
        struct gguf_file *f = (struct gguf_file *)1;
        struct ar_err err = {0};
        ar_alloc_fail_after(n);
        enum ar_status st = gguf_open_memory(buf, len, &f, &err);
        ar_alloc_fail_after(0);
        if (st == AR_OK) {
            assert_int_equal(gguf_n_tensors(f), 26);
            gguf_close(f);
            break;
        }
        assert_int_equal(st, AR_ENOMEM);
        assert_int_equal(err.code, AR_ENOMEM);
        assert_null(f);
        assert_true(n < 1000);
    }
    assert_true(n > 5); /* the file, its tables and tensor names were all allocated */
    free(buf);
}

static void writer_survives_every_allocation_failure(void **state)
{
    uint64_t n;
    (void)state;
    for (n = 1;; n++) {
        struct gguf_writer *w = NULL;
        void *out = NULL;
        size_t len;
        enum ar_status st;
        int64_t ne[2] = {32, 2};
        static const float vals[64];
        static const struct gguf_str strs[] = {{"a", 1}, {"bc", 2}};
        ar_alloc_fail_after(n);
        st = gguf_writer_create(&w);
        if (st == AR_OK)
            st = gguf_writer_set_str(w, "general.name", "x");
        if (st == AR_OK)
            st = gguf_writer_set_arr_str(w, "tokens", strs, 2);
        if (st == AR_OK)
            st = gguf_writer_set_u32(w, "general.name", 3); /* replace */
        if (st == AR_OK)
            st = gguf_writer_add_tensor(w, "w", AR_TYPE_F32, 2, ne, vals, sizeof(vals), false);
        if (st == AR_OK)
            st = gguf_writer_write_memory(w, &out, &len, NULL);
        ar_alloc_fail_after(0);
        gguf_writer_destroy(w);
        if (st == AR_OK) {
            struct gguf_file *f;
            assert_int_equal(gguf_open_memory(out, len, &f, NULL), AR_OK);
            assert_int_equal(gguf_find(f, "general.name")->type, GGUF_VTYPE_U32);
            gguf_close(f);
            ar_free(out);
            break;
        }
        assert_int_equal(st, AR_ENOMEM);
        assert_true(n < 100);
    }
    assert_true(n > 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tiny_models_have_documented_metadata),
        cmocka_unit_test(f32_models_have_documented_tensor_shapes),
        cmocka_unit_test(tensor_index_matches_dequant_references),
        cmocka_unit_test(vocab_only_files_have_tokens_and_no_tensors),
        cmocka_unit_test(demo_model_matches_its_model_card),
        cmocka_unit_test(writer_reproduces_fixture_byte_for_byte),
        cmocka_unit_test(writer_round_trips_every_value_type_and_tensor),
        cmocka_unit_test(writer_writes_files_atomically),
        cmocka_unit_test(writer_rejects_invalid_tensors_and_values),
        cmocka_unit_test(every_truncation_fails_cleanly),
        cmocka_unit_test(hostile_counts_fail_fast),
        cmocka_unit_test(bad_headers_are_rejected_with_clear_messages),
        cmocka_unit_test(nested_arrays_are_bounded_in_depth),
        cmocka_unit_test(bad_alignment_values_are_rejected),
        cmocka_unit_test(hostile_tensor_infos_are_rejected),
        cmocka_unit_test(open_reports_missing_and_empty_files),
        cmocka_unit_test(open_survives_every_allocation_failure),
        cmocka_unit_test(writer_survives_every_allocation_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
