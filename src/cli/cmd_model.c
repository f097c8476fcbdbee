/* cmd_model.c - model file tools: `inspect` (metadata and tensors), `quantize` (F32/F16/BF16 ->
 * quantized types and the Q4_K_M mix) and `gen-model` (random-weight models of real shapes for
 * tests and benchmarks). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"
#include "base/pool.h"
#include "base/types.h"
#include "cli.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"

/* ---- inspect ------------------------------------------------------------------------------ */

static void print_value(const struct gguf_value *v)
{
    switch (v->type) {
    case GGUF_VTYPE_U8:
    case GGUF_VTYPE_U16:
    case GGUF_VTYPE_U32:
    case GGUF_VTYPE_U64:
        printf("%" PRIu64, v->v.u64);
        break;
    case GGUF_VTYPE_I8:
    case GGUF_VTYPE_I16:
    case GGUF_VTYPE_I32:
    case GGUF_VTYPE_I64:
        printf("%" PRId64, v->v.i64);
        break;
    case GGUF_VTYPE_F32:
    case GGUF_VTYPE_F64:
        printf("%g", v->v.f64);
        break;
    case GGUF_VTYPE_BOOL:
        printf("%s", v->v.u64 ? "true" : "false");
        break;
    case GGUF_VTYPE_STRING: {
        uint64_t n = v->v.str.len;
        int shown = n > 120 ? 120 : (int)n;
        putchar('"');
        for (int i = 0; i < shown; i++) {
            unsigned char c = (unsigned char)v->v.str.ptr[i];
            if (c == '\n')
                fputs("\\n", stdout);
            else if (c < 0x20)
                printf("\\x%02x", c);
            else
                putchar(c);
        }
        printf("\"%s", n > 120 ? "..." : "");
        if (n > 120)
            printf(" (%" PRIu64 " bytes)", n);
        break;
    }
    case GGUF_VTYPE_ARRAY: {
        const struct gguf_arr *a = &v->v.arr;
        printf("[%s x %" PRIu64 "]", gguf_vtype_name(a->type), a->n);
        if (a->n && a->type == GGUF_VTYPE_STRING) {
            struct gguf_str s = gguf_arr_str(a, 0);
            printf(" first \"%.*s\"", (int)(s.len > 40 ? 40 : s.len), s.ptr);
        }
        break;
    }
    default:
        printf("?");
    }
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    struct gguf_file *f;
    struct ar_err err = {0};
    uint64_t n_params = 0, n_bytes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(path = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: autoreply inspect -m MODEL.gguf\n");
            return 0;
        } else if (!path && argv[i][0] != '-') {
            path = argv[i];
        } else {
            cli_error("inspect: unknown option '%s'", argv[i]);
            return 2;
        }
    }
    if (!path) {
        cli_error("inspect: -m MODEL is required");
        return 2;
    }
    if (gguf_open(path, &f, &err) != AR_OK) {
        cli_error("%s: %s", path, err.msg);
        return 1;
    }
    printf("file: %s\nversion: %u\nalignment: %" PRIu64 "\nsize: %zu bytes\n", path,
           gguf_version(f), gguf_alignment(f), gguf_file_size(f));
    printf("\nmetadata (%" PRId64 " keys):\n", gguf_n_kv(f));
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        printf("  %-44.*s ", (int)kv->key.len, kv->key.ptr);
        print_value(&kv->value);
        putchar('\n');
    }
    printf("\ntensors (%" PRId64 "):\n", gguf_n_tensors(f));
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t ne = 1;
        char shape[96];
        int off = 0;
        for (int d = 0; d < t->n_dims; d++) {
            ne *= (uint64_t)t->ne[d];
            off += snprintf(shape + off, sizeof(shape) - (size_t)off, "%s%" PRId64, d ? " x " : "",
                            t->ne[d]);
        }
        n_params += ne;
        n_bytes += t->size;
        printf("  %-36s %-5s [%s] %" PRIu64 " bytes%s\n", t->name, ar_type_name(t->type), shape,
               t->size, ar_type_info(t->type)->supported ? "" : "  (type not supported)");
    }
    printf("\nparameters: %" PRIu64 " (%.2f M)\ntensor data: %" PRIu64 " bytes (%.2f MiB)\n",
           n_params, (double)n_params / 1e6, n_bytes, (double)n_bytes / 1048576.0);
    gguf_close(f);
    return 0;
}

/* ---- per-tensor type choice for a file type ---------------------------------------------- */

/* File types as GGUF's general.file_type numbers them. */
enum file_type {
    FTYPE_F32 = 0,
    FTYPE_F16 = 1,
    FTYPE_Q4_0 = 2,
    FTYPE_Q8_0 = 7,
    FTYPE_Q4_K_M = 15,
    FTYPE_Q5_K_M = 17,
    FTYPE_Q6_K = 18,
    FTYPE_BF16 = 32,
    /* not a GGUF number: every matrix Q4_K (no mix) */
    FTYPE_Q4_K = 14 /* closest GGUF number: Q4_K_S */
};

struct ftype_name {
    const char *name;
    enum file_type ftype;
};

static const struct ftype_name ftype_names[] = {
    {"f32", FTYPE_F32},     {"f16", FTYPE_F16},       {"bf16", FTYPE_BF16},
    {"q8_0", FTYPE_Q8_0},   {"q4_0", FTYPE_Q4_0},     {"q4_k", FTYPE_Q4_K},
    {"q4_k_m", FTYPE_Q4_K_M}, {"q5_k_m", FTYPE_Q5_K_M}, {"q6_k", FTYPE_Q6_K},
};

static bool ftype_parse(const char *s, enum file_type *out)
{
    for (size_t i = 0; i < AR_ARRAY_LEN(ftype_names); i++) {
        if (!strcasecmp(s, ftype_names[i].name)) {
            *out = ftype_names[i].ftype;
            return true;
        }
    }
    return false;
}

/* Layers that get more bits in the _M mixes: the first and last eighth, and every third
 * layer in between. */
static bool more_bits(int layer, int n_layers)
{
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

static int layer_of(const char *name)
{
    int l;
    if (sscanf(name, "blk.%d.", &l) == 1)
        return l;
    return -1;
}

/* Type for a 2-D weight `name` with rows of row_len elements. is_output: this matrix produces
 * the logits (output.weight, or token_embd.weight when the output is tied). */
static enum ar_type tensor_type_for(enum file_type ft, const char *name, int64_t row_len,
                                    bool is_output, int n_layers)
{
    enum ar_type t;
    int layer = layer_of(name);
    switch (ft) {
    case FTYPE_F32:
        return AR_TYPE_F32;
    case FTYPE_F16:
        return AR_TYPE_F16;
    case FTYPE_BF16:
        return AR_TYPE_BF16;
    case FTYPE_Q8_0:
        t = AR_TYPE_Q8_0;
        break;
    case FTYPE_Q4_0:
        t = is_output ? AR_TYPE_Q6_K : AR_TYPE_Q4_0;
        break;
    case FTYPE_Q6_K:
        t = AR_TYPE_Q6_K;
        break;
    case FTYPE_Q4_K:
        t = is_output ? AR_TYPE_Q6_K : AR_TYPE_Q4_K;
        break;
    case FTYPE_Q4_K_M:
    case FTYPE_Q5_K_M: {
        enum ar_type base = ft == FTYPE_Q4_K_M ? AR_TYPE_Q4_K : AR_TYPE_Q5_K;
        bool mixed = strstr(name, "attn_v.weight") || strstr(name, "ffn_down.weight");
        if (is_output)
            t = AR_TYPE_Q6_K;
        else if (mixed && layer >= 0 && more_bits(layer, n_layers))
            t = AR_TYPE_Q6_K;
        else
            t = base;
        break;
    }
    default:
        t = AR_TYPE_Q8_0;
    }
    /* rows that do not fill whole blocks fall back to a type that fits: a K-quant to the
     * legacy 32-element type of about its size (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, as
     * llama-quantize does), anything else to Q8_0; rows of no whole 32-block to F16 */
    if (row_len % ar_type_info(t)->block_size != 0) {
        if (row_len % 32 != 0)
            t = AR_TYPE_F16;
        else if (t == AR_TYPE_Q4_K)
            t = AR_TYPE_Q5_0;
        else if (t == AR_TYPE_Q5_K)
            t = AR_TYPE_Q5_1;
        else
            t = AR_TYPE_Q8_0;
    }
    return t;
}

/* ---- quantizing rows on the thread pool ---------------------------------------------------- */

struct quant_job {
    enum ar_type src_type, dst_type;
    const uint8_t *src; /* (rows, src row bytes), or NULL: random rows */
    uint8_t *dst;
    int64_t rows, row_len;
    size_t src_row, dst_row;
    float stddev;  /* random rows: N(mean, stddev^2) */
    float mean;
    uint64_t seed;
    float *scratch; /* (nth, row_len) */
    bool ok;
};

static void random_row(float *out, int64_t n, uint64_t seed, float mean, float stddev)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i += 2) {
        /* Box-Muller from two 53-bit uniforms */
        double u1 = ((double)(ar_splitmix64(&s) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = (double)(ar_splitmix64(&s) >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1));
        out[i] = mean + stddev * (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n)
            out[i + 1] = mean + stddev * (float)(r * sin(6.283185307179586 * u2));
    }
}

static void quant_rows(void *ctx, int ith, int nth)
{
    struct quant_job *j = ctx;
    float *row = j->scratch + (size_t)ith * (size_t)j->row_len;
    int64_t b, e;
    ar_pool_range(j->rows, 1, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        if (j->src)
            kernels_dequantize_row(j->src_type, j->src + (size_t)r * j->src_row, row, j->row_len);
        else
            random_row(row, j->row_len, j->seed * 0x100000001b3ull + (uint64_t)r, j->mean,
                       j->stddev);
        if (kernels_quantize_row(j->dst_type, row, j->dst + (size_t)r * j->dst_row, j->row_len) !=
            j->dst_row)
            j->ok = false;
    }
}

/* Converts (or generates, src NULL) a rows x row_len tensor into dst_type; returns a new buffer
 * (ar_free) or NULL. */
static uint8_t *convert_tensor(struct ar_pool *pool, enum ar_type src_type, const void *src,
                               enum ar_type dst_type, int64_t rows, int64_t row_len, float mean,
                               float stddev, uint64_t seed, uint64_t *size_out)
{
    struct quant_job j = {0};
    int nth = ar_pool_size(pool);
    j.src_type = src_type;
    j.dst_type = dst_type;
    j.src = src;
    j.rows = rows;
    j.row_len = row_len;
    j.src_row = ar_type_row_size(src_type, row_len);
    j.dst_row = ar_type_row_size(dst_type, row_len);
    j.mean = mean;
    j.stddev = stddev;
    j.seed = seed;
    j.ok = true;
    if (!j.dst_row)
        return NULL;
    j.dst = ar_malloc(j.dst_row * (size_t)rows);
    j.scratch = ar_malloc(sizeof(float) * (size_t)row_len * (size_t)nth);
    if (!j.dst || !j.scratch) {
        ar_free(j.dst);
        ar_free(j.scratch);
        return NULL;
    }
    ar_pool_run(pool, quant_rows, &j);
    ar_free(j.scratch);
    if (!j.ok) {
        ar_free(j.dst);
        return NULL;
    }
    *size_out = j.dst_row * (size_t)rows;
    return j.dst;
}

/* ---- quantize ------------------------------------------------------------------------------ */

static int default_threads(void)
{
    return 2;
}

int cmd_quantize(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *type = NULL;
    int64_t n_threads = default_threads();
    enum file_type ft;
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    struct ar_pool *pool = NULL;
    struct ar_err err = {0};
    uint8_t **bufs = NULL;
    int rc = 1;
    int64_t n_tensors;
    int n_layers = 0;
    bool has_output;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || !cli_parse_i64("-t", v, 1, 256, &n_threads))
                return 2;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: autoreply quantize IN.gguf OUT.gguf TYPE [-t N]\n"
                   "TYPE: f32 f16 bf16 q8_0 q4_0 q4_k q4_k_m q5_k_m q6_k\n");
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_error("quantize: unknown option '%s'", argv[i]);
            return 2;
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else if (!type) {
            type = argv[i];
        } else {
            cli_error("quantize: too many arguments");
            return 2;
        }
    }
    if (!in || !out || !type) {
        cli_error("quantize: usage: autoreply quantize IN.gguf OUT.gguf TYPE");
        return 2;
    }
    if (!ftype_parse(type, &ft)) {
        cli_error("quantize: unknown type '%s' (f32 f16 bf16 q8_0 q4_0 q4_k q4_k_m q5_k_m q6_k)",
                  type);
        return 2;
    }
    if (gguf_open(in, &f, &err) != AR_OK) {
        cli_error("%s: %s", in, err.msg);
        return 1;
    }
    n_tensors = gguf_n_tensors(f);
    has_output = gguf_find_tensor(f, "output.weight") != NULL;
    for (int64_t i = 0; i < n_tensors; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        int l = layer_of(t->name);
        if (l + 1 > n_layers)
            n_layers = l + 1;
        if (t->type != AR_TYPE_F32 && t->type != AR_TYPE_F16 && t->type != AR_TYPE_BF16) {
            cli_error("quantize: %s: tensor %s is %s; the input must be F32, F16 or BF16 "
                      "(requantizing loses quality)",
                      in, t->name, ar_type_name(t->type));
            goto done;
        }
    }
    if (ar_pool_create((int)n_threads, &pool) != AR_OK || gguf_writer_create(&w) != AR_OK ||
        !(bufs = ar_calloc((size_t)n_tensors + 1, sizeof(*bufs)))) {
        cli_error("quantize: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof(key), "%.*s", (int)kv->key.len, kv->key.ptr);
        if (!strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version"))
            continue;
        if (gguf_writer_set_value(w, key, &kv->value) != AR_OK) {
            cli_error("quantize: cannot copy metadata key %s", key);
            goto done;
        }
    }
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft);
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    for (int64_t i = 0; i < n_tensors; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        bool is_output = !strcmp(t->name, "output.weight") ||
                         (!has_output && !strcmp(t->name, "token_embd.weight"));
        enum ar_type dt = t->type;
        size_t len = strlen(t->name);
        enum ar_status st;
        if (t->n_dims == 2 && len > 7 && !strcmp(t->name + len - 7, ".weight"))
            dt = tensor_type_for(ft, t->name, t->ne[0], is_output, n_layers);
        if (dt == t->type) {
            st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size,
                                        true);
        } else {
            uint64_t size = 0;
            int64_t rows = (int64_t)(t->size / ar_type_row_size(t->type, t->ne[0]));
            bufs[i] = convert_tensor(pool, t->type, t->data, dt, rows, t->ne[0], 0, 0, 0, &size);
            if (!bufs[i]) {
                cli_error("quantize: cannot convert %s to %s", t->name, ar_type_name(dt));
                goto done;
            }
            st = gguf_writer_add_tensor(w, t->name, dt, t->n_dims, t->ne, bufs[i], size, true);
        }
        if (st != AR_OK) {
            cli_error("quantize: cannot add tensor %s: %s", t->name, ar_status_str(st));
            goto done;
        }
        fprintf(stderr, "\r[%3" PRId64 "/%3" PRId64 "] %-32s %-5s -> %-5s", i + 1, n_tensors,
                t->name, ar_type_name(t->type), ar_type_name(dt));
    }
    fputc('\n', stderr);
    if (gguf_writer_write(w, out, &err) != AR_OK) {
        cli_error("quantize: %s: %s", out, err.msg);
        goto done;
    }
    rc = 0;
done:
    if (bufs)
        for (int64_t i = 0; i < n_tensors; i++)
            ar_free(bufs[i]);
    ar_free(bufs);
    gguf_writer_destroy(w);
    ar_pool_destroy(pool);
    gguf_close(f);
    return rc;
}

/* ---- gen-model ----------------------------------------------------------------------------- */

/* A synthetic SentencePiece-style vocabulary of n_vocab tokens, so that a random-weight model
 * can be served and given text: ids 0 <unk>, 1 <s>, 2 </s>, 3 <|im_start|>, 4 <|im_end|>
 * (end of generation), 5..260 the byte tokens, then pieces "▁w<id>" (the writer copies
 * them). Needs n_vocab >= 262. */
static enum ar_status add_synthetic_vocab(struct gguf_writer *w, int64_t n_vocab)
{
    static const char *const special[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
    struct gguf_str *items = ar_malloc((size_t)n_vocab * sizeof(*items));
    float *scores = ar_malloc((size_t)n_vocab * sizeof(*scores));
    int32_t *types = ar_malloc((size_t)n_vocab * sizeof(*types));
    char *text = ar_malloc((size_t)n_vocab * 16);
    enum ar_status st = AR_ENOMEM;
    size_t off = 0;
    if (!items || !scores || !types || !text)
        goto done;
    for (int64_t i = 0; i < n_vocab; i++) {
        char *p = text + off;
        int len;
        if (i < 5) {
            len = snprintf(p, 16, "%s", special[i]);
            types[i] = i == 0 ? 2 : 3; /* unknown, control */
        } else if (i < 261) {
            len = snprintf(p, 16, "<0x%02X>", (unsigned)(i - 5));
            types[i] = 6; /* byte */
        } else {
            len = snprintf(p, 16, "\xe2\x96\x81w%lld", (long long)i);
            types[i] = 1; /* normal */
        }
        items[i].ptr = p;
        items[i].len = (uint64_t)len;
        scores[i] = -(float)i;
        off += (size_t)len;
    }
    if ((st = gguf_writer_set_str(w, "tokenizer.ggml.model", "llama")) ||
        (st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", items, (uint64_t)n_vocab)) ||
        (st = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VTYPE_F32, scores,
                                  (uint64_t)n_vocab)) ||
        (st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VTYPE_I32, types,
                                  (uint64_t)n_vocab)) ||
        (st = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
        (st = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
        (st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 4)) ||
        (st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false)) ||
        (st = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false)) ||
        (st = gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false)))
        goto done;
done:
    ar_free(items);
    ar_free(scores);
    ar_free(types);
    ar_free(text);
    return st;
}

struct gen_opts {
    const char *arch, *out, *type;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx, seed, threads;
    bool tied;
};

int cmd_gen_model(int argc, char **argv)
{
    struct gen_opts o = {"qwen2", NULL, "f32", 256, 2, 4, 2, 768, 1024, 4096, 1, 2, false};
    bool tied_set = false, vocab = true;
    enum file_type ft;
    struct gguf_writer *w = NULL;
    struct ar_pool *pool = NULL;
    struct ar_err err = {0};
    uint8_t *bufs[1024] = {0};
    int n_bufs = 0, rc = 1;
    char key[128];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        struct {
            const char *flag;
            int64_t *dst;
            int64_t lo, hi;
        } nums[] = {
            {"--n-embd", &o.n_embd, 32, 65536},   {"--n-layer", &o.n_layer, 1, 256},
            {"--n-head", &o.n_head, 1, 1024},     {"--n-head-kv", &o.n_head_kv, 1, 1024},
            {"--n-ff", &o.n_ff, 32, 262144},      {"--n-vocab", &o.n_vocab, 2, 1048576},
            {"--n-ctx", &o.n_ctx, 16, 1 << 20},   {"--seed", &o.seed, 0, INT64_MAX},
            {"-t", &o.threads, 1, 256},
        };
        bool matched = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: autoreply gen-model --arch llama|qwen2 --n-embd N --n-layer N "
                   "--n-head N --n-head-kv N --n-ff N --n-vocab N [--n-ctx N] "
                   "[--type f32|f16|bf16|q8_0|q4_0|q4_k|q4_k_m|q6_k] [--tied|--untied] "
                   "[--seed S] [-t N] [--no-vocab] -o FILE\n"
                   "A synthetic vocabulary (byte tokens, <|im_start|>, <|im_end|>, pieces) is\n"
                   "written unless --no-vocab, so the model can be served and given text.\n");
            return 0;
        }
        for (size_t k = 0; k < AR_ARRAY_LEN(nums); k++) {
            if (!strcmp(a, nums[k].flag)) {
                if (!(v = cli_value(argc, argv, &i)) ||
                    !cli_parse_i64(a, v, nums[k].lo, nums[k].hi, nums[k].dst))
                    return 2;
                matched = true;
            }
        }
        if (matched)
            continue;
        if (!strcmp(a, "--arch")) {
            if (!(o.arch = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--type")) {
            if (!(o.type = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(o.out = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--no-vocab")) {
            vocab = false;
        } else if (!strcmp(a, "--tied")) {
            o.tied = true;
            tied_set = true;
        } else if (!strcmp(a, "--untied")) {
            o.tied = false;
            tied_set = true;
        } else {
            cli_error("gen-model: unknown option '%s'", a);
            return 2;
        }
    }
    if (!o.out) {
        cli_error("gen-model: -o FILE is required");
        return 2;
    }
    if (strcmp(o.arch, "llama") && strcmp(o.arch, "qwen2")) {
        cli_error("gen-model: unknown architecture '%s' (llama, qwen2)", o.arch);
        return 2;
    }
    if (!ftype_parse(o.type, &ft)) {
        cli_error("gen-model: unknown type '%s'", o.type);
        return 2;
    }
    if (o.n_embd % o.n_head || o.n_head % o.n_head_kv || (o.n_embd / o.n_head) % 2) {
        cli_error("gen-model: n_embd must be a multiple of n_head, n_head of n_head_kv, and the "
                  "head size even");
        return 2;
    }
    if (o.n_layer * 9 + 4 > (int64_t)AR_ARRAY_LEN(bufs)) {
        cli_error("gen-model: too many layers");
        return 2;
    }
    if (!tied_set)
        o.tied = !strcmp(o.arch, "qwen2");
    if (ar_pool_create((int)o.threads, &pool) != AR_OK || gguf_writer_create(&w) != AR_OK) {
        cli_error("gen-model: out of memory");
        goto done;
    }
    int64_t head_dim = o.n_embd / o.n_head, kv_dim = head_dim * o.n_head_kv;
    gguf_writer_set_str(w, "general.architecture", o.arch);
    gguf_writer_set_str(w, "general.name", "autoreply random-weight model");
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft);
#define KEY(s) (snprintf(key, sizeof(key), "%s." s, o.arch), key)
    gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)o.n_vocab);
    gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)o.n_ctx);
    gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)o.n_embd);
    gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)o.n_layer);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)o.n_ff);
    gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)o.n_head);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)o.n_head_kv);
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"),
                        strcmp(o.arch, "qwen2") ? 1e-5f : 1e-6f);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), strcmp(o.arch, "qwen2") ? 10000.0f : 1e6f);
    gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)head_dim);
#undef KEY
    if (vocab && o.n_vocab < 262) {
        cli_error("gen-model: the synthetic vocabulary needs --n-vocab >= 262 (or --no-vocab)");
        goto done;
    }
    if (vocab && add_synthetic_vocab(w, o.n_vocab) != AR_OK) {
        cli_error("gen-model: out of memory");
        goto done;
    }
    {
        /* A tensor: name, rows, row length, mean, stddev (1-D tensors have rows == 1). */
        struct spec {
            char name[64];
            int64_t rows, cols;
            float mean, sd;
            bool vec;
        } specs[1024];
        int n = 0;
#define ADD(nm, r, c, m, s, v)                                                                     \
    do {                                                                                           \
        snprintf(specs[n].name, sizeof(specs[n].name), "%s", nm);                                  \
        specs[n].rows = (r), specs[n].cols = (c), specs[n].mean = (m), specs[n].sd = (s);          \
        specs[n].vec = (v);                                                                        \
        n++;                                                                                       \
    } while (0)
        ADD("token_embd.weight", o.n_vocab, o.n_embd, 0, 0.25f, false);
        for (int64_t l = 0; l < o.n_layer; l++) {
            char nm[64];
#define L(suffix) (snprintf(nm, sizeof(nm), "blk.%d." suffix, (int)l), nm)
            ADD(L("attn_norm.weight"), 1, o.n_embd, 1, 0.05f, true);
            ADD(L("attn_q.weight"), o.n_embd, o.n_embd, 0, 0.08f, false);
            ADD(L("attn_k.weight"), kv_dim, o.n_embd, 0, 0.08f, false);
            ADD(L("attn_v.weight"), kv_dim, o.n_embd, 0, 0.06f, false);
            if (!strcmp(o.arch, "qwen2")) {
                ADD(L("attn_q.bias"), 1, o.n_embd, 0, 0.1f, true);
                ADD(L("attn_k.bias"), 1, kv_dim, 0, 0.1f, true);
                ADD(L("attn_v.bias"), 1, kv_dim, 0, 0.05f, true);
            }
            ADD(L("attn_output.weight"), o.n_embd, o.n_embd, 0, 0.06f, false);
            ADD(L("ffn_norm.weight"), 1, o.n_embd, 1, 0.05f, true);
            ADD(L("ffn_gate.weight"), o.n_ff, o.n_embd, 0, 0.06f, false);
            ADD(L("ffn_up.weight"), o.n_ff, o.n_embd, 0, 0.06f, false);
            ADD(L("ffn_down.weight"), o.n_embd, o.n_ff, 0, 0.04f, false);
#undef L
        }
        ADD("output_norm.weight", 1, o.n_embd, 1, 0.05f, true);
        if (!o.tied)
            ADD("output.weight", o.n_vocab, o.n_embd, 0, 0.25f, false);
#undef ADD
        for (int i = 0; i < n; i++) {
            const struct spec *s = &specs[i];
            bool is_output = !strcmp(s->name, "output.weight") ||
                             (o.tied && !strcmp(s->name, "token_embd.weight"));
            enum ar_type t = s->vec ? AR_TYPE_F32
                                    : tensor_type_for(ft, s->name, s->cols, is_output,
                                                      (int)o.n_layer);
            int64_t ne[2] = {s->cols, s->rows};
            uint64_t size = 0;
            uint8_t *buf = convert_tensor(pool, AR_TYPE_F32, NULL, t, s->rows, s->cols, s->mean,
                                          s->sd, (uint64_t)o.seed * 1000003u + (uint64_t)i,
                                          &size);
            if (!buf) {
                cli_error("gen-model: cannot make %s as %s", s->name, ar_type_name(t));
                goto done;
            }
            bufs[n_bufs++] = buf;
            if (gguf_writer_add_tensor(w, s->name, t, s->vec ? 1 : 2, ne, buf, size, true) !=
                AR_OK) {
                cli_error("gen-model: cannot add %s", s->name);
                goto done;
            }
        }
    }
    if (gguf_writer_write(w, o.out, &err) != AR_OK) {
        cli_error("gen-model: %s: %s", o.out, err.msg);
        goto done;
    }
    rc = 0;
done:
    for (int i = 0; i < n_bufs; i++)
        ar_free(bufs[i]);
    gguf_writer_destroy(w);
    ar_pool_destroy(pool);
    return rc;
}
