/* tokenize_bench.c - tokenizer load time and throughput on review text: 10 MB of the "text"
 * fields of shared/data/reviews-sample.jsonl (mixed Chinese/English), encoded on one thread
 * with the tiny-qwen2 byte-level BPE vocabulary, the demo model's SPM vocabulary and the four
 * real vocabularies of shared/fixtures-tokenizer-real (Qwen3, Llama 3, GPT-4o, DeepSeek-V3).
 * Times are this thread's CPU time. Prints the load time (tokenizer_load on an open file,
 * best of 3), MB/s for per-review calls
 * and the time of one 5 MB call against one 10 MB call (linearity). An argument keeps only
 * the vocabularies whose label contains it ("Llama"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#define TARGET_SIZE ((size_t)10 << 20)

/* CPU seconds of this thread: the machine is shared, so wall time would count other jobs. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *shared_path(char *buf, size_t size, const char *rel)
{
    const char *d = getenv("AR_SHARED");
    snprintf(buf, size, "%s/%s", d && *d ? d : "../shared", rel);
    return buf;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes the JSON string starting after its opening quote at s into o; returns the bytes
 * written and sets *end past the closing quote. A crude scanner, enough for this file. */
static size_t json_string(const char *s, char *o, const char **end)
{
    size_t n = 0;
    while (*s && *s != '"') {
        if (*s != '\\') {
            o[n++] = *s++;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': o[n++] = '\n'; s++; break;
        case 't': o[n++] = '\t'; s++; break;
        case 'r': o[n++] = '\r'; s++; break;
        case 'b': o[n++] = '\b'; s++; break;
        case 'f': o[n++] = '\f'; s++; break;
        case 'u': {
            unsigned cp = (unsigned)strtoul((char[5]){s[1], s[2], s[3], s[4], 0}, NULL, 16);
            s += 5;
            if (cp >= 0xd800 && cp < 0xdc00 && s[0] == '\\' && s[1] == 'u') {
                unsigned lo = (unsigned)strtoul((char[5]){s[2], s[3], s[4], s[5], 0}, NULL, 16);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                s += 6;
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default: o[n++] = *s++; break; /* \" \\ \/ */
        }
    }
    *end = *s ? s + 1 : s;
    return n;
}

/* Review texts joined by '\n', repeated up to TARGET_SIZE bytes (cut at a newline).
 * offs[i] is where review i starts; *n_reviews of them. */
static char *load_reviews(size_t *size, size_t **offs, size_t *n_reviews)
{
    char path[1024];
    FILE *f = fopen(shared_path(path, sizeof(path), "data/reviews-sample.jsonl"), "rb");
    char *file, *texts, *out;
    long fsize;
    size_t n = 0, cap = 1024, o = 0, n_texts = 0;
    const char *p;
    size_t *toffs;
    if (!f) {
        fprintf(stderr, "tokenize_bench: cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    fsize = ftell(f);
    fseek(f, 0, SEEK_SET);
    file = malloc((size_t)fsize + 1);
    texts = malloc((size_t)fsize + 1);
    toffs = malloc(cap * sizeof(size_t));
    if (!file || !texts || !toffs || fread(file, 1, (size_t)fsize, f) != (size_t)fsize)
        exit(1);
    fclose(f);
    file[fsize] = '\0';
    for (p = file; (p = strstr(p, "\"text\": \"")) != NULL;) {
        if (n_texts == cap && !(toffs = realloc(toffs, (cap *= 2) * sizeof(size_t))))
            exit(1);
        toffs[n_texts++] = o;
        o += json_string(p + 9, texts + o, &p);
        texts[o++] = '\n';
    }
    free(file);
    if (!o)
        exit(1);
    out = malloc(TARGET_SIZE + 1);
    *offs = malloc((TARGET_SIZE / 2 + 1) * sizeof(size_t));
    if (!out || !*offs)
        exit(1);
    /* repeat whole reviews until the next one would not fit */
    for (size_t i = 0, w = 0;; i = (i + 1) % n_texts) {
        size_t a = toffs[i], b = i + 1 < n_texts ? toffs[i + 1] : o;
        if (w + (b - a) > TARGET_SIZE)
            break;
        memcpy(out + w, texts + a, b - a);
        (*offs)[n++] = w;
        w += b - a;
        *size = w;
    }
    (*offs)[n] = *size;
    *n_reviews = n;
    free(texts);
    free(toffs);
    return out;
}

/* Loads the vocabulary of rel three times; *load_s: the best tokenizer_load time. */
static struct tokenizer *load_tok(const char *rel, double *load_s)
{
    char path[1024];
    struct gguf_file *f = NULL;
    struct tokenizer *tok = NULL;
    struct ar_err err = {0};
    *load_s = 1e30;
    if (gguf_open(shared_path(path, sizeof(path), rel), &f, &err) != AR_OK)
        goto fail;
    for (int rep = 0; rep < 3; rep++) {
        double t = cpu_s();
        tokenizer_destroy(tok);
        tok = NULL;
        if (tokenizer_load(f, &tok, &err) != AR_OK)
            goto fail;
        t = cpu_s() - t;
        *load_s = t < *load_s ? t : *load_s;
    }
    gguf_close(f);
    return tok;
fail:
    fprintf(stderr, "tokenize_bench: %s: %s\n", path, err.msg);
    exit(1);
}

static void encode(const struct tokenizer *tok, const char *s, size_t len, int64_t *n)
{
    int32_t *ids = NULL;
    if (tokenizer_encode(tok, s, len, false, false, &ids, n) != AR_OK)
        exit(1);
    ar_free(ids);
}

/* Reading the thread CPU clock is a system call: timed once per call here, never per review. */
static double encode_once(const struct tokenizer *tok, const char *s, size_t len, int64_t *n)
{
    double t0 = cpu_s();
    encode(tok, s, len, n);
    return cpu_s() - t0;
}

int main(int argc, char **argv)
{
    static const char *const models[][2] = {
        {"tiny-qwen2 (byte-level BPE, pre qwen2)", "fixtures/models/tiny-qwen2-f32.gguf"},
        {"autoreply-demo (SPM, 6000 pieces)", "models/autoreply-demo-q8_0.gguf"},
        {"Qwen3 (151,669 tokens, pre qwen2)",
         "fixtures-tokenizer-real/tokenizer/vocabs/ggml-vocab-qwen3.gguf"},
        {"Llama 3 (128,256 tokens, pre llama-bpe)",
         "fixtures-tokenizer-real/tokenizer/vocabs/ggml-vocab-llama3.gguf"},
        {"GPT-4o (200,019 tokens, pre gpt-4o)",
         "fixtures-tokenizer-real/tokenizer/vocabs/ggml-vocab-gpt4o.gguf"},
        {"DeepSeek-V3 (128,815 tokens, pre deepseek-v3)",
         "fixtures-tokenizer-real/tokenizer/vocabs/ggml-vocab-deepseek_v3.gguf"},
    };
    size_t size = 0, n_reviews = 0, *offs = NULL, half;
    char *text = load_reviews(&size, &offs, &n_reviews);
    if (!text)
        return 1;
    half = offs[n_reviews / 2]; /* about 5 MB, on a review boundary */
    printf("text: %.2f MB, %zu reviews (half: %.2f MB)\n", (double)size / 1e6, n_reviews,
           (double)half / 1e6);
    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); m++) {
        double load_s;
        if (argc > 1 && !strstr(models[m][0], argv[1])) /* optional filter: a name part */
            continue;
        struct tokenizer *tok = load_tok(models[m][1], &load_s);
        int64_t n_tok = 0, n5, n10;
        double t = cpu_s(), t5, t10;
        for (size_t i = 0; i < n_reviews; i++) {
            int64_t n;
            encode(tok, text + offs[i], offs[i + 1] - offs[i], &n);
            n_tok += n;
        }
        t = cpu_s() - t;
        t5 = encode_once(tok, text, half, &n5);
        t10 = encode_once(tok, text, size, &n10);
        printf("%s\n  load: %.1f ms\n", models[m][0], load_s * 1e3);
        printf("  per review: %.2f MB in %.3f s = %.1f MB/s, %lld tokens (%.2f bytes/token)\n",
               (double)size / 1e6, t, (double)size / 1e6 / t, (long long)n_tok,
               (double)size / (double)n_tok);
        printf("  one call:   5 MB %.3f s (%.1f MB/s), 10 MB %.3f s (%.1f MB/s), ratio %.2f\n",
               t5, (double)half / 1e6 / t5, t10, (double)size / 1e6 / t10, t10 / t5);
        tokenizer_destroy(tok);
    }
    free(offs);
    free(text);
    return 0;
}
