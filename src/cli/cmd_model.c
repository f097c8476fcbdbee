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
#include "base/opts.h"
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
    int rc, first_arg;
    const struct ar_opt opts[] = {
        {"model", 'm', AR_OPT_STRING, &path, 0, 0, "MODEL.gguf", "the model (or the one argument)",
         "", NULL},
    };
    const struct ar_opts spec = {.cmd = "inspect",
                                 .usage = "inspect -m MODEL.gguf",
                                 .opts = opts,
                                 .n_opts = AR_ARRAY_LEN(opts),
                                 .max_args = 1};
    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    if (first_arg < argc) {
        if (path) {
            cli_error("inspect: one model: -m %s or %s", path, argv[first_arg]);
            return 2;
        }
        path = argv[first_arg];
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
    {"f32", FTYPE_F32},       {"f16", FTYPE_F16},       {"bf16", FTYPE_BF16},
    {"q8_0", FTYPE_Q8_0},     {"q4_0", FTYPE_Q4_0},     {"q4_k", FTYPE_Q4_K},
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
 * the logits (output.weight, or token_embd.weight when the output is tied). n_expert: experts
 * per layer (0: dense). */
static enum ar_type tensor_type_for(enum file_type ft, const char *name, int64_t row_len,
                                    bool is_output, int n_layers, int n_expert)
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
        /* the value projection (alone or inside the fused qkv) and the FFN's down projection
         * (dense or the experts') */
        bool mixed = strstr(name, "attn_v.weight") || strstr(name, "attn_qkv.weight") ||
                     strstr(name, "ffn_down.weight") || strstr(name, "ffn_down_exps.weight");
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
    /* llama-quantize's rule for 8-expert models (Mixtral's size): the small k and v
     * projections to Q8_0, and the attention output up one step in the 4-bit mixes */
    if (n_expert == 8 && (strstr(name, "attn_k.weight") || strstr(name, "attn_v.weight")))
        t = AR_TYPE_Q8_0;
    if (n_expert == 8 && strstr(name, "attn_output.weight") && ft == FTYPE_Q4_K_M)
        t = AR_TYPE_Q5_K;
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
    float stddev; /* random rows: N(mean, stddev^2) */
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
    int n_layers = 0, n_expert = 0;
    bool has_output;
    int first_arg;
    const struct ar_opt opts[] = {
        {"threads", 't', AR_OPT_I64, &n_threads, 1, 256, "N", "threads", NULL, NULL},
    };
    const struct ar_opts spec = {.cmd = "quantize",
                                 .usage = "quantize IN.gguf OUT.gguf TYPE [-t N]",
                                 .about = "TYPE: f32 f16 bf16 q8_0 q4_0 q4_k q4_k_m q5_k_m q6_k",
                                 .opts = opts,
                                 .n_opts = AR_ARRAY_LEN(opts),
                                 .max_args = -1};
    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    rc = 1;
    if (argc - first_arg > 3) {
        cli_error("quantize: too many arguments");
        return 2;
    }
    in = first_arg < argc ? argv[first_arg] : NULL;
    out = first_arg + 1 < argc ? argv[first_arg + 1] : NULL;
    type = first_arg + 2 < argc ? argv[first_arg + 2] : NULL;
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
    {
        struct gguf_str arch;
        char key[128];
        int64_t v;
        if (gguf_get_str(f, "general.architecture", &arch)) {
            snprintf(key, sizeof(key), "%.*s.expert_count", (int)AR_MIN(arch.len, 64), arch.ptr);
            if (gguf_get_i64(f, key, &v) && v > 0 && v < 1 << 20)
                n_expert = (int)v;
        }
    }
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
        /* matrices (3-D: a mixture's experts, one after another) are converted; vectors and
         * the experts' router stay as they are */
        if ((t->n_dims == 2 || t->n_dims == 3) && len > 7 &&
            !strcmp(t->name + len - 7, ".weight") && !strstr(t->name, "ffn_gate_inp"))
            dt = tensor_type_for(ft, t->name, t->ne[0], is_output, n_layers, n_expert);
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

/* What llama.cpp's converter writes for each family: the writer's own description of the
 * layouts (../shared/fixtures-arch/README.md section 1), kept apart from the loader's
 * (src/model/arch.c) so that a test loading these files checks one against the other. */
struct gen_family {
    const char *name;
    bool qkv_bias;      /* q/k/v biases (in attn_qkv.bias when fused) */
    bool fused_qkv;     /* attn_qkv: q rows, then k rows, then v rows */
    bool fused_gate_up; /* ffn_up: the gate rows, then the up rows; no ffn_gate */
    bool qk_norm;       /* attn_q_norm, attn_k_norm (head_dim) */
    bool post_norms;    /* post_attention_norm, post_ffw_norm */
    bool moe;           /* ffn_gate_inp (F32) and 3-D ffn_{gate,up,down}_exps */
    bool swa;           /* sliding window, its pattern and rope base; linear scaling */
    bool rope_factors;  /* rope_factors_short/long, attn_factor, original_context_length */
    bool tied;          /* default: no output.weight */
    bool head_dim_keys; /* attention.key_length / value_length always written */
    bool rope_dim_key;  /* rope.dimension_count written */
    int rope_pct;       /* rotated share of each head, percent */
    float eps, base;    /* rms epsilon, rope base */
    float embd_sd;      /* token_embd's spread */
};

/* clang-format off */
static const struct gen_family gen_families[] = {
    /* name        bias   fqkv   fgu    qknorm post   moe    swa    factor tied   hdkeys rdkey  pct eps        base    embd */
    {"llama",    false, false, false, false, false, false, false, false, false, false, true,  100, 1e-5f,     1e4f,   0.25f},
    {"qwen2",    true,  false, false, false, false, false, false, false, true,  false, true,  100, 1e-6f,     1e6f,   0.25f},
    {"qwen3",    false, false, false, true,  false, false, false, false, true,  true,  false, 100, 1e-6f,     1e6f,   0.25f},
    {"qwen3moe", false, false, false, true,  false, true,  false, false, false, true,  false, 100, 1e-6f,     1e6f,   0.25f},
    {"glm4",     true,  false, true,  false, true,  false, false, false, false, true,  true,  50,  1e-5f,     1e4f,   0.25f},
    {"chatglm",  true,  true,  true,  false, false, false, false, false, false, false, true,  50,  1.5625e-7f, 5e6f,  0.25f},
    {"gemma3",   false, false, false, true,  true,  false, true,  false, true,  true,  false, 100, 1e-6f,     1e6f,   0.03f},
    {"phi3",     false, true,  true,  false, false, false, false, true,  true,  false, true,  75,  1e-5f,     1e4f,   0.25f},
};
/* clang-format on */

static const struct gen_family *gen_family_find(const char *name)
{
    for (size_t i = 0; i < AR_ARRAY_LEN(gen_families); i++)
        if (!strcmp(gen_families[i].name, name))
            return &gen_families[i];
    return NULL;
}

/* 0 in an int field: the family's default, filled in by gen_resolve. */
struct gen_opts {
    const char *arch, *out, *type;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx, seed, threads;
    int64_t head_dim, rope_dim, n_expert, n_expert_used, n_ff_exp, swa_window, swa_pattern,
        n_ctx_orig;
    double rope_scale; /* linear rope scaling factor (gemma3's global layers); 1: none */
    bool tied;
};

/* Fills in the family defaults and checks the shape; false after printing the error. */
static bool gen_resolve(struct gen_opts *o, const struct gen_family *fam)
{
    if (o->n_head % o->n_head_kv) {
        cli_error("gen-model: --n-head %lld is not a multiple of --n-head-kv %lld",
                  (long long)o->n_head, (long long)o->n_head_kv);
        return false;
    }
    if (!o->head_dim) {
        if (o->n_embd % o->n_head) {
            cli_error("gen-model: --n-embd is not a multiple of --n-head (or give --head-dim)");
            return false;
        }
        o->head_dim = o->n_embd / o->n_head;
    }
    if (!o->rope_dim)
        o->rope_dim = o->head_dim * fam->rope_pct / 100 / 2 * 2;
    if (o->head_dim % 2 || o->rope_dim % 2 || o->rope_dim > o->head_dim || o->rope_dim < 2) {
        cli_error("gen-model: head size %lld and rotated dimensions %lld must be even, the "
                  "second at most the first",
                  (long long)o->head_dim, (long long)o->rope_dim);
        return false;
    }
    if (!o->n_ctx)
        o->n_ctx = fam->rope_factors ? 131072 : 4096; /* Phi-4-mini's context */
    if (!o->n_ctx_orig)
        o->n_ctx_orig = AR_MIN(o->n_ctx, 4096);
    if (fam->moe) {
        o->n_expert = o->n_expert ? o->n_expert : 8;
        o->n_expert_used = o->n_expert_used ? o->n_expert_used : 2;
        o->n_ff_exp = o->n_ff_exp ? o->n_ff_exp : o->n_ff;
        if (o->n_expert_used > o->n_expert || o->n_expert_used > 64) {
            cli_error("gen-model: --n-expert-used must be at most --n-expert and 64");
            return false;
        }
    } else if (o->n_expert || o->n_expert_used || o->n_ff_exp) {
        cli_error("gen-model: --n-expert, --n-expert-used, --n-ff-exp are for qwen3moe only");
        return false;
    }
    if (fam->swa) {
        o->swa_window = o->swa_window ? o->swa_window : 512;
        o->swa_pattern = o->swa_pattern ? o->swa_pattern : 6;
    } else if (o->swa_window || o->swa_pattern) {
        cli_error("gen-model: --swa-window and --swa-pattern are for gemma3 only");
        return false;
    }
    if (o->rope_scale == 0)
        o->rope_scale = fam->swa ? 8.0 : 1.0; /* Gemma 3 4B and larger */
    return true;
}

/* The metadata of the file's header: general.*, <arch>.* as the converter names them. */
static void gen_write_hparams(struct gguf_writer *w, const struct gen_opts *o,
                              const struct gen_family *fam, enum file_type ft)
{
    char key[128];
    gguf_writer_set_str(w, "general.architecture", o->arch);
    gguf_writer_set_str(w, "general.name", "autoreply random-weight model");
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft);
#define KEY(s) (snprintf(key, sizeof(key), "%s." s, o->arch), key)
    /* the newer families' conversions leave the vocabulary size to the token list */
    if (!strcmp(o->arch, "llama") || !strcmp(o->arch, "qwen2"))
        gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)o->n_vocab);
    gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)o->n_ctx);
    gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)o->n_embd);
    gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)o->n_layer);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)o->n_ff);
    gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)o->n_head);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)o->n_head_kv);
    if (fam->head_dim_keys || o->head_dim * o->n_head != o->n_embd) {
        gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)o->head_dim);
        gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)o->head_dim);
    }
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), fam->eps);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), fam->base);
    if (fam->rope_dim_key || o->rope_dim != o->head_dim)
        gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)o->rope_dim);
    if (o->rope_scale != 1.0) {
        gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear");
        gguf_writer_set_f32(w, KEY("rope.scaling.factor"), (float)o->rope_scale);
    }
    if (fam->moe) {
        gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)o->n_expert);
        gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)o->n_expert_used);
        gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)o->n_ff_exp);
    }
    if (fam->swa) {
        gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)o->swa_window);
        gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)o->swa_pattern);
        gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), 10000.0f);
    }
    if (fam->rope_factors) {
        /* LongRoPE's magnitude correction for a context stretched beyond the original */
        double s = (double)o->n_ctx / (double)o->n_ctx_orig;
        double attn = s > 1.0 ? sqrt(1.0 + log(s) / log((double)o->n_ctx_orig)) : 1.0;
        gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), (float)attn);
        gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                            (uint32_t)o->n_ctx_orig);
        /* Phi-4-mini's config value; llama.cpp ignores it for phi3 (and so do we) */
        gguf_writer_set_u32(w, KEY("attention.sliding_window"), 262144);
    }
#undef KEY
}

/* One tensor to generate: n_mat matrices of rows x cols (1-D vectors: rows == 1, vec),
 * entries N(mean, sd^2). */
struct gen_spec {
    char name[64];
    int64_t rows, cols, n_mat;
    float mean, sd;
    bool vec;      /* 1-D, F32 */
    bool keep_f32; /* a 2-D matrix that stays F32 (the MoE router) */
};

struct gen_list {
    struct gen_spec *s;
    int n, cap;
};

static void gen_add(struct gen_list *l, const char *name, int64_t rows, int64_t cols, int64_t n_mat,
                    float mean, float sd, bool vec)
{
    struct gen_spec *s = &l->s[l->n++];
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->rows = rows;
    s->cols = cols;
    s->n_mat = n_mat;
    s->mean = mean;
    s->sd = sd;
    s->vec = vec;
    s->keep_f32 = false;
}

/* The tensors of one layer, in the family's layout (numpy-style shapes rows x cols). */
static void gen_layer(struct gen_list *l, const struct gen_opts *o, const struct gen_family *f,
                      int il)
{
    int64_t e = o->n_embd, nq = o->n_head * o->head_dim, nkv = o->n_head_kv * o->head_dim;
    char nm[64];
#define L(suffix) (snprintf(nm, sizeof(nm), "blk.%d." suffix, il), nm)
#define VEC(suffix, n, mean, sd) gen_add(l, L(suffix), 1, n, 1, mean, sd, true)
#define MAT(suffix, r, c, sd) gen_add(l, L(suffix), r, c, 1, 0, sd, false)
    VEC("attn_norm.weight", e, 1, 0.05f);
    if (f->fused_qkv) {
        MAT("attn_qkv.weight", nq + 2 * nkv, e, 0.07f);
        if (f->qkv_bias)
            VEC("attn_qkv.bias", nq + 2 * nkv, 0, 0.1f);
    } else {
        MAT("attn_q.weight", nq, e, 0.08f);
        MAT("attn_k.weight", nkv, e, 0.08f);
        MAT("attn_v.weight", nkv, e, 0.06f);
        if (f->qkv_bias) {
            VEC("attn_q.bias", nq, 0, 0.1f);
            VEC("attn_k.bias", nkv, 0, 0.1f);
            VEC("attn_v.bias", nkv, 0, 0.05f);
        }
    }
    if (f->qk_norm) {
        VEC("attn_q_norm.weight", o->head_dim, 1, 0.05f);
        VEC("attn_k_norm.weight", o->head_dim, 1, 0.05f);
    }
    MAT("attn_output.weight", e, nq, 0.06f);
    if (f->post_norms)
        VEC("post_attention_norm.weight", e, 1, 0.05f);
    VEC("ffn_norm.weight", e, 1, 0.05f);
    if (f->moe) {
        MAT("ffn_gate_inp.weight", o->n_expert, e, 0.2f);
        l->s[l->n - 1].keep_f32 = true; /* the converter keeps the router F32 */
        gen_add(l, L("ffn_gate_exps.weight"), o->n_ff_exp, e, o->n_expert, 0, 0.06f, false);
        gen_add(l, L("ffn_up_exps.weight"), o->n_ff_exp, e, o->n_expert, 0, 0.06f, false);
        gen_add(l, L("ffn_down_exps.weight"), e, o->n_ff_exp, o->n_expert, 0, 0.1f, false);
    } else {
        if (f->fused_gate_up) {
            MAT("ffn_up.weight", 2 * o->n_ff, e, 0.06f);
        } else {
            MAT("ffn_gate.weight", o->n_ff, e, 0.06f);
            MAT("ffn_up.weight", o->n_ff, e, 0.06f);
        }
        MAT("ffn_down.weight", e, o->n_ff, 0.04f);
    }
    if (f->post_norms)
        VEC("post_ffw_norm.weight", e, 1, 0.05f);
#undef MAT
#undef VEC
#undef L
}

/* Every tensor of the model, in file order. */
static bool gen_tensors(struct gen_list *l, const struct gen_opts *o, const struct gen_family *f)
{
    l->cap = (int)o->n_layer * 20 + 8;
    if (!(l->s = ar_calloc((size_t)l->cap, sizeof(*l->s))))
        return false;
    if (f->rope_factors) {
        /* LongRoPE divides each pair's frequency by its factor: near 1 for the short
         * contexts, larger for the long; Box-Muller's |z| < 9 keeps both positive */
        gen_add(l, "rope_factors_long.weight", 1, o->rope_dim / 2, 1, 4.0f, 0.4f, true);
        gen_add(l, "rope_factors_short.weight", 1, o->rope_dim / 2, 1, 1.05f, 0.03f, true);
    }
    gen_add(l, "token_embd.weight", o->n_vocab, o->n_embd, 1, 0, f->embd_sd, false);
    for (int il = 0; il < (int)o->n_layer; il++)
        gen_layer(l, o, f, il);
    gen_add(l, "output_norm.weight", 1, o->n_embd, 1, 1, 0.05f, true);
    if (!o->tied)
        gen_add(l, "output.weight", o->n_vocab, o->n_embd, 1, 0, 0.25f, false);
    return true;
}

/* --tied, --untied: the choice made (the later wins), else the family's. */
struct gen_tie {
    struct gen_opts *o;
    bool set;
};

static bool set_tied(void *ctx, const char *flag, const char *value, struct ar_err *err)
{
    struct gen_tie *tie = ctx;
    (void)value;
    (void)err;
    tie->o->tied = !strcmp(flag, "--tied");
    tie->set = true;
    return true;
}

/* Parses the flags into o; returns -1 to go on, else the exit code. */
static int gen_parse(int argc, char **argv, struct gen_opts *o, bool *tied_set, bool *vocab)
{
    struct gen_tie tie = {o, false};
    int rc, first_arg;
    const struct ar_opt opts[] = {
        {"arch", 0, AR_OPT_STRING, &o->arch, 0, 0, "ARCH",
         "llama qwen2 qwen3 qwen3moe glm4 chatglm gemma3 phi3", NULL, NULL},
        {"type", 0, AR_OPT_STRING, &o->type, 0, 0, "TYPE",
         "f32 f16 bf16 q8_0 q4_0 q4_k q4_k_m q6_k", NULL, NULL},
        {"output", 'o', AR_OPT_STRING, &o->out, 0, 0, "FILE", "the model file (required)", NULL,
         NULL},
        {"n-embd", 0, AR_OPT_I64, &o->n_embd, 32, 65536, "N", "embedding width", NULL, NULL},
        {"n-layer", 0, AR_OPT_I64, &o->n_layer, 1, 256, "N", "layers", NULL, NULL},
        {"n-head", 0, AR_OPT_I64, &o->n_head, 1, 1024, "N", "attention heads", NULL, NULL},
        {"n-head-kv", 0, AR_OPT_I64, &o->n_head_kv, 1, 1024, "N", "KV heads", NULL, NULL},
        {"n-ff", 0, AR_OPT_I64, &o->n_ff, 32, 262144, "N", "feed-forward width", NULL, NULL},
        {"n-vocab", 0, AR_OPT_I64, &o->n_vocab, 2, 1048576, "N", "vocabulary size", NULL, NULL},
        {"n-ctx", 0, AR_OPT_I64, &o->n_ctx, 16, 1 << 24, "N", "context length", "family's", NULL},
        {"head-dim", 0, AR_OPT_I64, &o->head_dim, 2, 4096, "N", "head width", "family's", NULL},
        {"rope-dim", 0, AR_OPT_I64, &o->rope_dim, 2, 4096, "N", "rotated dimensions per head",
         "family's", NULL},
        {"n-expert", 0, AR_OPT_I64, &o->n_expert, 1, 1024, "N", "experts (qwen3moe)", "family's",
         NULL},
        {"n-expert-used", 0, AR_OPT_I64, &o->n_expert_used, 1, 1024, "N", "experts per token",
         "family's", NULL},
        {"n-ff-exp", 0, AR_OPT_I64, &o->n_ff_exp, 32, 262144, "N", "an expert's feed-forward width",
         "family's", NULL},
        {"swa-window", 0, AR_OPT_I64, &o->swa_window, 1, 1 << 24, "N", "sliding-window size",
         "family's", NULL},
        {"swa-pattern", 0, AR_OPT_I64, &o->swa_pattern, 1, 256, "N", "every N-th layer is global",
         "family's", NULL},
        {"rope-scale", 0, AR_OPT_DOUBLE, &o->rope_scale, 1.0, 1024.0, "F",
         "linear rope scaling of the global layers", "family's", NULL},
        {"n-ctx-orig", 0, AR_OPT_I64, &o->n_ctx_orig, 16, 1 << 24, "N",
         "the context trained before rope scaling", "family's", NULL},
        {"tied", 0, AR_OPT_ACTION, NULL, 0, 0, NULL, "output matrix shared with the embedding",
         "family's", set_tied},
        {"untied", 0, AR_OPT_ACTION, NULL, 0, 0, NULL, "an output matrix of its own", "", set_tied},
        {"seed", 0, AR_OPT_I64, &o->seed, 0, 0x1p63, "S", "random seed of the weights", NULL, NULL},
        {"threads", 't', AR_OPT_I64, &o->threads, 1, 256, "N", "threads", NULL, NULL},
        {"no-vocab", 0, AR_OPT_CLEAR, vocab, 0, 0, NULL, "no vocabulary", NULL, NULL},
    };
    const struct ar_opts spec = {
        .cmd = "gen-model",
        .usage = "gen-model --arch ARCH --n-embd N ... -o FILE",
        .about = "Each ARCH in the tensor layout and metadata of llama.cpp's converter. Unset\n"
                 "values take the family's default: head-dim n_embd/n_head; rope-dim the head\n"
                 "(glm4, chatglm half, phi3 three quarters); qwen3moe 8 experts, 2 used, n-ff-exp\n"
                 "= n-ff; gemma3 window 512, pattern 6, rope-scale 8 (1: none); phi3 n-ctx\n"
                 "131072, n-ctx-orig 4096; tied for qwen2, qwen3, gemma3, phi3. A synthetic\n"
                 "vocabulary (byte tokens, <|im_start|>, <|im_end|>, pieces) is written unless\n"
                 "--no-vocab, so the model can be served and given text.",
        .opts = opts,
        .n_opts = AR_ARRAY_LEN(opts),
        .max_args = 0,
        .ctx = &tie};
    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    *tied_set = tie.set;
    return -1;
}

int cmd_gen_model(int argc, char **argv)
{
    struct gen_opts o = {.arch = "qwen2",
                         .type = "f32",
                         .n_embd = 256,
                         .n_layer = 2,
                         .n_head = 4,
                         .n_head_kv = 2,
                         .n_ff = 768,
                         .n_vocab = 1024,
                         .seed = 1,
                         .threads = 2};
    bool tied_set = false, vocab = true;
    const struct gen_family *fam;
    enum file_type ft;
    struct gguf_writer *w = NULL;
    struct ar_pool *pool = NULL;
    struct ar_err err = {0};
    struct gen_list specs = {0};
    uint8_t **bufs = NULL;
    int n_bufs = 0, rc;
    if ((rc = gen_parse(argc, argv, &o, &tied_set, &vocab)) >= 0)
        return rc;
    rc = 1;
    if (!o.out) {
        cli_error("gen-model: -o FILE is required");
        return 2;
    }
    if (!(fam = gen_family_find(o.arch))) {
        cli_error("gen-model: unknown architecture '%s' (llama, qwen2, qwen3, qwen3moe, glm4, "
                  "chatglm, gemma3, phi3)",
                  o.arch);
        return 2;
    }
    if (!ftype_parse(o.type, &ft)) {
        cli_error("gen-model: unknown type '%s'", o.type);
        return 2;
    }
    if (!gen_resolve(&o, fam))
        return 2;
    if (vocab && o.n_vocab < 262) {
        cli_error("gen-model: the synthetic vocabulary needs --n-vocab >= 262 (or --no-vocab)");
        return 2;
    }
    if (!tied_set)
        o.tied = fam->tied;
    if (ar_pool_create((int)o.threads, &pool) != AR_OK || gguf_writer_create(&w) != AR_OK ||
        !gen_tensors(&specs, &o, fam) || !(bufs = ar_calloc((size_t)specs.n, sizeof(*bufs)))) {
        cli_error("gen-model: out of memory");
        goto done;
    }
    gen_write_hparams(w, &o, fam, ft);
    if (vocab && add_synthetic_vocab(w, o.n_vocab) != AR_OK) {
        cli_error("gen-model: out of memory");
        goto done;
    }
    for (int i = 0; i < specs.n; i++) {
        const struct gen_spec *s = &specs.s[i];
        bool is_output =
            !strcmp(s->name, "output.weight") || (o.tied && !strcmp(s->name, "token_embd.weight"));
        enum ar_type t = s->vec || s->keep_f32 ? AR_TYPE_F32
                                               : tensor_type_for(ft, s->name, s->cols, is_output,
                                                                 (int)o.n_layer, (int)o.n_expert);
        int64_t ne[3] = {s->cols, s->rows, s->n_mat};
        int n_dims = s->vec ? 1 : s->n_mat > 1 ? 3 : 2;
        uint64_t size = 0;
        uint8_t *buf =
            convert_tensor(pool, AR_TYPE_F32, NULL, t, s->rows * s->n_mat, s->cols, s->mean, s->sd,
                           (uint64_t)o.seed * 1000003u + (uint64_t)i, &size);
        if (!buf) {
            cli_error("gen-model: cannot make %s as %s", s->name, ar_type_name(t));
            goto done;
        }
        bufs[n_bufs++] = buf;
        if (gguf_writer_add_tensor(w, s->name, t, n_dims, ne, buf, size, true) != AR_OK) {
            cli_error("gen-model: cannot add %s", s->name);
            goto done;
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
    ar_free(bufs);
    ar_free(specs.s);
    gguf_writer_destroy(w);
    ar_pool_destroy(pool);
    return rc;
}
