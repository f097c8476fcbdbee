/* cmd_tokenize.c - `autoreply tokenize` (ids and pieces of a text) and the tokenizer part of
 * `check-fixtures`: tokenizer/tok-<vocab>.json cases and the vocabs/<file>.inp/.out pairs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "base/opts.h"
#include "cli.h"
#include "cli_internal.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

/* Loads the vocabulary of a GGUF file (model or vocab-only). */
static enum ar_status load_tokenizer(const char *path, const char *pre, struct tokenizer **out,
                                     struct ar_err *err)
{
    struct gguf_file *f;
    enum ar_status st = gguf_open(path, &f, err);
    if (st != AR_OK)
        return st;
    st = tokenizer_load_opts(f, &(struct tokenizer_opts){pre}, out, err);
    gguf_close(f);
    return st;
}

static void print_escaped(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

int cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL, *text = NULL, *pre = NULL;
    bool ids_only = false, raw = false;
    struct tokenizer *tok = NULL;
    struct ar_err err = {0};
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc, first_arg;
    const struct ar_opt opts[] = {
        {"model", 'm', AR_OPT_STRING, &path, 0, 0, "MODEL", "GGUF model (required)", NULL, NULL},
        /* model-loading options (--tokenizer-pre NAME, ...) go here, beside --model */
        {"tokenizer-pre", 0, AR_OPT_STRING, &pre, 0, 0, "NAME",
         "pre-tokenizer instead of the model's tokenizer.ggml.pre", NULL, NULL},
        {"prompt", 'p', AR_OPT_STRING, &text, 0, 0, "TEXT", "the text (or the one argument)", NULL,
         NULL},
        {"ids", 0, AR_OPT_SET, &ids_only, 0, 0, NULL, "print only the ids", NULL, NULL},
        {"raw", 0, AR_OPT_SET, &raw, 0, 0, NULL,
         "no BOS/EOS, special-token text spelled out as plain text", NULL, NULL},
    };
    const struct ar_opts spec = {.cmd = "tokenize",
                                 .usage = "tokenize -m MODEL [--ids] [--raw] TEXT",
                                 .opts = opts,
                                 .n_opts = AR_ARRAY_LEN(opts),
                                 .max_args = 1};
    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    if (first_arg < argc) {
        if (text) {
            cli_error("tokenize: one text: -p or an argument");
            return 2;
        }
        text = argv[first_arg];
    }
    if (!path || !text) {
        cli_error("tokenize: usage: autoreply tokenize -m MODEL [--ids] TEXT");
        return 2;
    }
    if (load_tokenizer(path, pre, &tok, &err) != AR_OK) {
        cli_error("%s: %s", path, err.msg);
        return 1;
    }
    if (tokenizer_encode(tok, text, strlen(text), !raw, !raw, &ids, &n) != AR_OK) {
        cli_error("tokenize: cannot tokenize the text");
        tokenizer_destroy(tok);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (ids_only) {
            printf("%s%d", i ? " " : "", ids[i]);
        } else {
            size_t len;
            const char *t = tokenizer_token_text(tok, ids[i], &len);
            printf("%6d  '", ids[i]);
            print_escaped(t, len);
            printf("'\n");
        }
    }
    if (ids_only)
        putchar('\n');
    ar_free(ids);
    tokenizer_destroy(tok);
    return 0;
}

/* ---- check-fixtures: tokenizer ------------------------------------------------------------ */

/* The vocabulary named `vocab` in a fixture set: tokenizer/vocabs/ggml-vocab-<vocab>.gguf, or
 * the vocabulary inside models/<vocab>-f32.gguf or any models/<vocab>-*.gguf. */
static bool find_vocab_file(const char *dir, const char *vocab, char *path, size_t size)
{
    char **names;
    int n;
    FILE *f;
    snprintf(path, size, "%s/tokenizer/vocabs/ggml-vocab-%s.gguf", dir, vocab);
    if ((f = fopen(path, "rb"))) {
        fclose(f);
        return true;
    }
    snprintf(path, size, "%s/models/%s-f32.gguf", dir, vocab);
    if ((f = fopen(path, "rb"))) {
        fclose(f);
        return true;
    }
    snprintf(path, size, "%s/models", dir);
    n = cli_list_dir(path, ".gguf", &names);
    for (int i = 0; i < n; i++) {
        size_t vl = strlen(vocab);
        if (!strncmp(names[i], vocab, vl) && names[i][vl] == '-') {
            snprintf(path, size, "%s/models/%s", dir, names[i]);
            cli_free_names(names, n);
            return true;
        }
    }
    cli_free_names(names, n);
    return false;
}

static bool ids_equal(const int32_t *a, int64_t na, cJSON *ref)
{
    int64_t i = 0;
    cJSON *v;
    if (!cJSON_IsArray(ref) || cJSON_GetArraySize(ref) != na)
        return false;
    cJSON_ArrayForEach(v, ref)
    {
        if (!cJSON_IsNumber(v) || (int32_t)v->valuedouble != a[i++])
            return false;
    }
    return true;
}

static int check_tok_json(const char *dir, const char *file, int *n_fail)
{
    char path[4096];
    cJSON *j, *c;
    struct tokenizer *tok = NULL;
    struct ar_err err = {0};
    const char *vocab;
    int n_cases = 0, bad = 0;
    snprintf(path, sizeof(path), "%s/tokenizer/%s", dir, file);
    if (!(j = cli_read_json(path)) || !cJSON_IsArray(j) || !cJSON_GetArraySize(j)) {
        printf("FAIL %s: cannot read or parse\n", file);
        (*n_fail)++;
        cJSON_Delete(j);
        return 1;
    }
    vocab = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "vocab"));
    if (!vocab || !find_vocab_file(dir, vocab, path, sizeof(path)) ||
        load_tokenizer(path, NULL, &tok, &err) != AR_OK) {
        printf("FAIL %s: cannot load vocabulary '%s': %s\n", file, vocab ? vocab : "?", err.msg);
        (*n_fail)++;
        cJSON_Delete(j);
        return 1;
    }
    cJSON_ArrayForEach(c, j)
    {
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
        const char *detok = cJSON_GetStringValue(cJSON_GetObjectItem(c, "detokenized"));
        int32_t *ids = NULL, *ids_sp = NULL;
        int64_t n = 0, n_sp = 0;
        char *dec = NULL;
        size_t dec_len = 0;
        bool ok;
        if (!text)
            continue;
        n_cases++;
        ok = tokenizer_encode(tok, text, strlen(text), false, false, &ids, &n) == AR_OK &&
             ids_equal(ids, n, cJSON_GetObjectItem(c, "ids")) &&
             tokenizer_encode(tok, text, strlen(text), true, true, &ids_sp, &n_sp) == AR_OK &&
             ids_equal(ids_sp, n_sp, cJSON_GetObjectItem(c, "ids_with_special"));
        if (ok && detok)
            ok = tokenizer_decode(tok, ids, n, false, &dec, &dec_len) == AR_OK &&
                 dec_len == strlen(detok) && !memcmp(dec, detok, dec_len);
        if (!ok) {
            if (bad < 3)
                printf("     %s: mismatch for text \"%.60s\"\n", file, text);
            bad++;
        }
        ar_free(ids);
        ar_free(ids_sp);
        ar_free(dec);
    }
    printf("%s %-24s %d/%d strings match (ids, ids_with_special, detokenized)\n",
           bad ? "FAIL" : "ok  ", file, n_cases - bad, n_cases);
    if (bad)
        (*n_fail)++;
    tokenizer_destroy(tok);
    cJSON_Delete(j);
    return 1;
}

/* vocabs/<name>.gguf.inp: inputs separated by "\n__ggml_vocab_test__\n"; .out: one line of
 * space-separated ids per input (no BOS/EOS, special text not parsed). */
static int check_inp_out(const char *dir, const char *gguf_name, int *n_fail)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char path[4096], *inp, *out, *p, *o;
    struct tokenizer *tok = NULL;
    struct ar_err err = {0};
    int n_cases = 0, bad = 0;
    snprintf(path, sizeof(path), "%s/tokenizer/vocabs/%s.inp", dir, gguf_name);
    inp = cli_read_text(path);
    snprintf(path, sizeof(path), "%s/tokenizer/vocabs/%s.out", dir, gguf_name);
    out = cli_read_text(path);
    if (!inp || !out) {
        free(inp);
        free(out);
        return 0;
    }
    snprintf(path, sizeof(path), "%s/tokenizer/vocabs/%s", dir, gguf_name);
    if (load_tokenizer(path, NULL, &tok, &err) != AR_OK) {
        printf("FAIL %s: %s\n", gguf_name, err.msg);
        (*n_fail)++;
        free(inp);
        free(out);
        return 1;
    }
    p = inp;
    o = out;
    for (;;) {
        char *end = strstr(p, sep);
        char *eol;
        int32_t *ids = NULL;
        int64_t n = 0, k = 0;
        bool ok;
        if (!end)
            break;
        eol = strchr(o, '\n');
        if (!eol)
            eol = o + strlen(o);
        ok = tokenizer_encode(tok, p, (size_t)(end - p), false, false, &ids, &n) == AR_OK;
        for (char *q = o; ok && q < eol;) {
            char *qe;
            long v = strtol(q, &qe, 10);
            if (qe == q)
                break;
            ok = k < n && ids[k] == v;
            k++;
            q = qe;
        }
        ok = ok && k == n;
        if (!ok) {
            if (bad < 3)
                printf("     %s: mismatch for input \"%.*s\"\n", gguf_name,
                       (int)AR_MIN(end - p, 60), p);
            bad++;
        }
        ar_free(ids);
        n_cases++;
        p = end + sizeof(sep) - 1;
        o = *eol ? eol + 1 : eol;
    }
    printf("%s %-32s %d/%d inputs match (.inp/.out)\n", bad ? "FAIL" : "ok  ", gguf_name,
           n_cases - bad, n_cases);
    if (bad || !n_cases)
        (*n_fail)++;
    tokenizer_destroy(tok);
    free(inp);
    free(out);
    return 1;
}

int cli_check_tokenizer_fixtures(const char *dir, int *n_fail)
{
    char path[4096], **names;
    int n, n_checked = 0;
    snprintf(path, sizeof(path), "%s/tokenizer", dir);
    n = cli_list_dir(path, ".json", &names);
    if (n > 0)
        printf("== tokenizer (%d vocabularies)\n", n);
    for (int i = 0; i < n; i++)
        if (!strncmp(names[i], "tok-", 4))
            n_checked += check_tok_json(dir, names[i], n_fail);
    cli_free_names(names, n);
    snprintf(path, sizeof(path), "%s/tokenizer/vocabs", dir);
    n = cli_list_dir(path, ".gguf", &names);
    for (int i = 0; i < n; i++)
        n_checked += check_inp_out(dir, names[i], n_fail);
    cli_free_names(names, n);
    return n_checked;
}
