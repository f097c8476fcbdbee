/* pretok_test.c - the pre-tokenizer table (tokenizer.ggml.pre names, refusal of unknown
 * names, the --tokenizer-pre override), the words each split rule cuts text into, and the
 * detokenizer's tokenization-space clean-up. Expected words and texts are worked out by hand
 * from each rule's published pattern (the reasoning is in the comments), not taken from our
 * output. */
#include "harness/harness.h"

#include <stdbool.h>
#include <unistd.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* Loads a three-token byte-level BPE vocabulary whose tokenizer.ggml.pre is pre (NULL: no
 * key), with opts; returns the status and the tokenizer in *out (NULL on failure). */
/* A writer holding the first n of "a", "b", "ab", "</s>" as a gpt2 vocabulary with the merge
 * "a b" (pre: tokenizer.ggml.pre, NULL for none); the caller adds keys. */
static struct gguf_writer *tiny_writer(const char *pre, uint64_t n)
{
    static const struct gguf_str toks[] = {{"a", 1}, {"b", 1}, {"ab", 2}, {"</s>", 4}};
    static const struct gguf_str merges[] = {{"a b", 3}};
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(&w), AR_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"), AR_OK);
    if (pre)
        assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), AR_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, n), AR_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1), AR_OK);
    return w;
}

/* Writes w to a temporary file, loads a tokenizer from it with opts and destroys w; returns
 * the load's status. */
static enum ar_status load_written(struct gguf_writer *w, const struct tokenizer_opts *opts,
                                   struct tokenizer **out, struct ar_err *err)
{
    struct gguf_file *f = NULL;
    char dir[] = "/tmp/pretok_test_XXXXXX", path[64];
    enum ar_status st;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/v.gguf", dir);
    assert_int_equal(gguf_writer_write(w, path, NULL), AR_OK);
    assert_int_equal(gguf_open(path, &f, NULL), AR_OK);
    *out = NULL;
    st = tokenizer_load_opts(f, opts, out, err);
    gguf_close(f);
    gguf_writer_destroy(w);
    unlink(path);
    rmdir(dir);
    return st;
}

static enum ar_status load_tiny(const char *pre, const struct tokenizer_opts *opts,
                                struct tokenizer **out, struct ar_err *err)
{
    struct gguf_writer *w = tiny_writer(pre, 3);
    assert_int_equal(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0), AR_OK);
    return load_written(w, opts, out, err);
}

static struct tokenizer *tiny_with(const char *pre)
{
    struct tokenizer *tok = NULL;
    struct ar_err err = {0};
    struct tokenizer_opts o = {pre};
    if (load_tiny("gpt-2", &o, &tok, &err) != AR_OK)
        fail_msg("pre-tokenizer %s: %s", pre, err.msg);
    return tok;
}

static struct tokenizer *load_real(const char *name)
{
    char rel[256], path[1024];
    struct gguf_file *f = NULL;
    struct tokenizer *tok = NULL;
    struct ar_err err = {0};
    snprintf(rel, sizeof(rel), "fixtures-tokenizer-real/tokenizer/vocabs/ggml-vocab-%s.gguf",
             name);
    th_shared_path(path, sizeof(path), rel);
    if (gguf_open(path, &f, &err) != AR_OK || tokenizer_load(f, &tok, &err) != AR_OK)
        fail_msg("%s: %s", path, err.msg);
    gguf_close(f);
    return tok;
}

static void print_words(const char *what, const char *text, const uint32_t *sp, size_t n)
{
    printf("    %s:", what);
    for (size_t i = 0; i < n; i++)
        printf(" [%.*s]", (int)sp[2 * i + 1], text + sp[2 * i]);
    printf("\n");
}

/* want: the words, NULL-terminated; they must concatenate to text. */
static void check_words(const char *pre, const char *text, const char *const *want)
{
    struct tokenizer *tok = tiny_with(pre);
    uint32_t *sp = NULL;
    size_t n = 0, n_want = 0, off = 0;
    bool ok;
    assert_int_equal(tokenizer_pre_split(tok, text, strlen(text), &sp, &n), AR_OK);
    while (want[n_want])
        n_want++;
    ok = n == n_want;
    for (size_t i = 0; ok && i < n; i++) {
        size_t l = strlen(want[i]);
        ok = sp[2 * i] == off && sp[2 * i + 1] == l && memcmp(text + off, want[i], l) == 0;
        off += l;
    }
    if (!ok) {
        printf("  pre %s on \"%s\"\n    want:", pre, text);
        for (size_t i = 0; i < n_want; i++)
            printf(" [%s]", want[i]);
        printf("\n");
        print_words("got ", text, sp, n);
        fail();
    }
    ar_free(sp);
    tokenizer_destroy(tok);
}

#define W(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- the table ---------------------------------------------------------------------------- */

/* The names the issue lists as llama.cpp's (gemma4 is known but not byte-level BPE, so it
 * is refused by name). */
static void every_listed_name_is_known(void **state)
{
    static const char *const names[] = {
        "llama3",     "llama-bpe",   "qwen2",        "qwen35",     "deepseek-llm",
        "deepseek-coder", "deepseek-v3", "deepseek-r1-qwen", "gpt-2", "gpt-4o",
        "falcon",     "falcon3",     "starcoder",    "refact",     "command-r",
        "stablelm2",  "olmo",        "dbrx",         "smaug-bpe",  "poro-chat",
        "chatglm-bpe", "glm4",       "viking",       "jais",       "tekken",
        "smollm",     "codeshell",   "bloom",        "gpt3-finnish", "exaone",
        "exaone4",    "chameleon",   "minerva-7b",   "megrez",     "superbpe",
        "trillion",   "bailingmoe",  "llama4",       "pixtral",    "seed-coder",
        "hunyuan",    "grok-2",      "mellum",       "lfm2",       "default"};
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(names); i++) {
        if (!tokenizer_pre_known(names[i]))
            fail_msg("pre-tokenizer '%s' is not known", names[i]);
    }
    assert_true(tokenizer_pre_known("kimi-k2"));
    assert_false(tokenizer_pre_known("gemma4")); /* not byte-level BPE */
    assert_false(tokenizer_pre_known("no-such-pre"));
    assert_false(tokenizer_pre_known(NULL));
    assert_true(tokenizer_pre_count() >= 87);
}

/* Every supported name compiles and splits any text into words that give the text back. */
static void every_name_compiles_and_splits_losslessly(void **state)
{
    static const char text[] =
        "Hello WORLD, it's 1234567 \xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c "
        "\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f e\xcc\x81 \t\n\n  x~!";
    (void)state;
    for (size_t i = 0; i < tokenizer_pre_count(); i++) {
        const struct tokenizer_pre_info *p = tokenizer_pre_at(i);
        struct tokenizer *tok;
        uint32_t *sp = NULL;
        size_t n = 0, off = 0;
        if (p->flags & TOKENIZER_PRE_UNSUPPORTED)
            continue;
        tok = tiny_with(p->name);
        assert_int_equal(tokenizer_pre_split(tok, text, sizeof(text) - 1, &sp, &n), AR_OK);
        for (size_t k = 0; k < n; k++) {
            if (sp[2 * k] != off || sp[2 * k + 1] == 0)
                fail_msg("%s: word %zu at %u (len %u), expected at %zu", p->name, k,
                         sp[2 * k], sp[2 * k + 1], off);
            off += sp[2 * k + 1];
        }
        assert_int_equal(off, sizeof(text) - 1);
        ar_free(sp);
        tokenizer_destroy(tok);
    }
}

static void unknown_names_are_refused_and_overrides_work(void **state)
{
    struct tokenizer *tok = NULL, *dflt = NULL;
    struct ar_err err = {0};
    uint32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    static const char text[] = "Hello, world 2024!!";
    (void)state;
    /* unknown file name: refused, and the message names it */
    assert_int_equal(load_tiny("no-such-pre", NULL, &tok, &err), AR_EFORMAT);
    assert_null(tok);
    assert_non_null(strstr(err.msg, "'no-such-pre'"));
    /* the override replaces it */
    memset(&err, 0, sizeof(err));
    assert_int_equal(load_tiny("no-such-pre", &(struct tokenizer_opts){"qwen2"}, &tok, &err),
                     AR_OK);
    tokenizer_destroy(tok);
    /* an unknown override is refused too, naming it */
    assert_int_equal(load_tiny("qwen2", &(struct tokenizer_opts){"qwen9"}, &tok, &err),
                     AR_EINVAL);
    assert_null(tok);
    assert_non_null(strstr(err.msg, "'qwen9'"));
    /* known to llama.cpp but not implemented here: refused by name */
    assert_int_equal(load_tiny("gemma4", NULL, &tok, &err), AR_ENOTSUP);
    assert_non_null(strstr(err.msg, "gemma4"));
    /* no key: "default", as llama.cpp. Its four patterns cut "Hello, world 2024!!" into
     * punctuation runs ("," "!!"), then GPT-2's words (" world" " 2024"), then digit runs
     * (" " "2024"), then ASCII digits in threes ("202" "4"). */
    assert_int_equal(load_tiny(NULL, NULL, &tok, &err), AR_OK);
    assert_int_equal(load_tiny("gpt-2", &(struct tokenizer_opts){"default"}, &dflt, &err),
                     AR_OK);
    assert_int_equal(tokenizer_pre_split(tok, text, strlen(text), &a, &na), AR_OK);
    assert_int_equal(tokenizer_pre_split(dflt, text, strlen(text), &b, &nb), AR_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * 2 * sizeof(uint32_t));
    ar_free(a);
    ar_free(b);
    tokenizer_destroy(tok);
    tokenizer_destroy(dflt);
    check_words("default", text, W("Hello", ",", " world", " ", "202", "4", "!!"));
}

/* ---- split rules ---------------------------------------------------------------------------- */

static void contractions_follow_each_rule(void **state)
{
    (void)state;
    /* GPT-2: lower-case contractions; a run of spaces gives all but the last to itself */
    check_words("gpt-2", "I'm   fine, 12345 thx!!\n",
                W("I", "'m", "  ", " fine", ",", " 12345", " thx", "!!", "\n"));
    /* GPT-2 knows no upper-case contraction: "'" and "M" are separate */
    check_words("gpt-2", "I'M", W("I", "'", "M"));
    /* Llama 3: any case; the lone space before digits is its own word */
    check_words("llama-bpe", "Don't 12345 ...\n\nok",
                W("Don", "'t", " ", "123", "45", " ...\n\n", "ok"));
    check_words("llama-bpe", "I'M here", W("I", "'M", " here"));
    /* GPT-4o: capitals then lower case then the contraction, as one word */
    check_words("gpt-4o", "I'M here", W("I'M", " here"));
    /* Tekken: o200k's cases without contractions: "'" leads the next lower-case run */
    check_words("tekken", "I'm", W("I", "'m"));
    /* Kimi-K2 as llama.cpp splits it: letter runs are not cut at capitals, and take any
     * contraction */
    check_words("kimi-k2", "I'M getUserName", W("I'M", " getUserName"));
    /* DeepSeek-V3: ASCII punctuation followed by ASCII letters is one word */
    check_words("deepseek-v3", "didn't", W("didn", "'t"));
}

static void cjk_follows_each_rule(void **state)
{
    (void)state;
    /* Llama 3: a non-letter may lead a letter run: the full-width comma joins the next word */
    check_words("llama-bpe", "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c",
                W("\xe4\xbd\xa0\xe5\xa5\xbd", "\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c"));
    /* DeepSeek-V3: digits in threes first, then CJK runs, so the comma stands alone:
     * "didn't 太慢，将近 1234567" */
    check_words("deepseek-v3",
                "didn't \xe5\xa4\xaa\xe6\x85\xa2\xef\xbc\x8c\xe5\xb0\x86\xe8\xbf\x91 1234567",
                W("didn", "'t", " ", "\xe5\xa4\xaa\xe6\x85\xa2", "\xef\xbc\x8c",
                  "\xe5\xb0\x86\xe8\xbf\x91", " ", "123", "456", "7"));
    /* Kimi-K2: Han runs are words of their own, and a space before one stands alone */
    check_words("kimi-k2", "ab \xe4\xbd\xa0\xe5\xa5\xbd" "cd",
                W("ab", " ", "\xe4\xbd\xa0\xe5\xa5\xbd", "cd"));
    /* a CJK run is split from Latin letters by the second pattern */
    check_words("deepseek-v3", "ab\xe4\xbd\xa0\xe5\xa5\xbd" "cd",
                W("ab", "\xe4\xbd\xa0\xe5\xa5\xbd", "cd"));
}

static void digits_follow_each_rule(void **state)
{
    (void)state;
    check_words("llama-bpe", "1234567", W("123", "456", "7"));
    check_words("qwen2", "x1234", W("x", "1", "2", "3", "4"));
    /* StarCoder: single digits first, then GPT-2's words over what is left */
    check_words("starcoder", "x 1234", W("x", " ", "1", "2", "3", "4"));
    /* SuperBPE: split points (empty matches) before each group of three ending the number */
    check_words("superbpe", "1234567", W("1", "234", "567"));
    check_words("superbpe", "123456", W("123", "456"));
    /* Tiny Aya and AFMoE: groups of three aligned to the end of the number */
    check_words("tiny_aya", "1234567", W("1", "234", "567"));
    check_words("afmoe", "1234567 ab", W("1", "234", "567", " ab"));
    /* Falcon: punctuation and symbol runs first */
    check_words("falcon", "a+b=c", W("a", "+", "b", "=", "c"));
    /* DeepSeek-Coder: letters, punctuation, then single digits */
    check_words("deepseek-coder", "ab, 12", W("ab", ",", " ", "1", "2"));
}

static void emoji_and_zwj_follow_each_rule(void **state)
{
    /* 😶 ZWJ 🌫 VS16: two symbols, a format character and a combining mark */
    static const char face[] = "\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f";
    (void)state;
    /* GPT-2: none is a letter, digit or space: one punctuation-like run */
    check_words("gpt-2", face, W(face));
    /* DeepSeek-V3: symbols are runs of their own, ZWJ matches nothing (left as a gap), and
     * the variation selector is a mark, which counts as a letter */
    check_words("deepseek-v3", face,
                W("\xf0\x9f\x98\xb6", "\xe2\x80\x8d", "\xf0\x9f\x8c\xab", "\xef\xb8\x8f"));
    /* DeepSeek-V3 as llama.cpp runs it: '~' is neither punctuation nor symbol there */
    check_words("deepseek-v3", " !~", W(" !", "~"));
    check_words("deepseek-v3", " ~x .Net", W(" ", "~x", " .", "Net"));
}

static void whitespace_runs_follow_each_rule(void **state)
{
    (void)state;
    check_words("gpt-2", "a   b", W("a", "  ", " b"));
    /* Llama 3: spaces before newlines go with the newlines */
    check_words("llama-bpe", "a \n\n b", W("a", " \n\n", " b"));
    /* an ideographic space is a non-letter that may lead a word */
    check_words("llama-bpe", "a\xe3\x80\x80" "b", W("a", "\xe3\x80\x80" "b"));
    /* Chameleon: tabs, newlines, four or two spaces, then digits one by one */
    check_words("chameleon", "a  b1", W("a", "  ", "b", "1"));
    /* BLOOM: runs of anything but whitespace and sentence punctuation */
    check_words("bloom", "Hi, there!x", W("Hi", ",", " there", "!", "x"));
}

static void combining_marks_follow_each_rule(void **state)
{
    /* "e" + U+0301 + "te" and Devanagari "नमस्ते" (virama U+094D, vowel sign U+0947) */
    static const char e_acute[] = "e\xcc\x81te";
    static const char namaste[] =
        "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87";
    (void)state;
    /* GPT-2: a mark is not a letter, so it is a run of its own */
    check_words("gpt-2", e_acute, W("e", "\xcc\x81", "te"));
    /* DeepSeek-V3 and Qwen3.5: letters and marks form one word */
    check_words("deepseek-v3", e_acute, W(e_acute));
    check_words("qwen35", namaste, W(namaste));
    /* Qwen2: the virama may lead the next letter run; the final vowel sign stands alone */
    check_words("qwen2", namaste,
                W("\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8", "\xe0\xa5\x8d\xe0\xa4\xa4",
                  "\xe0\xa5\x87"));
}

/* ---- detokenizer clean-up ------------------------------------------------------------------ */

static char *round_trip(const struct tokenizer *tok, const char *text)
{
    int32_t *ids = NULL;
    int64_t n = 0;
    char *s = NULL;
    size_t len;
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), false, false, &ids, &n), AR_OK);
    assert_int_equal(tokenizer_decode(tok, ids, n, true, &s, &len), AR_OK);
    assert_int_equal(strlen(s), len);
    ar_free(ids);
    return s;
}

static void llama3_detokenizer_cleans_tokenization_spaces(void **state)
{
    /* The clean-up rules: drop the space before ? ! . , and before 's 'm 're 've (not 't 'd
     * 'll), and " ' " becomes "'". */
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"so far .... Really ? Yes !", "so far.... Really? Yes!"},
        {"I 've seen it , he 's right", "I've seen it, he's right"},
        {"we 're sure I 'm in", "we're sure I'm in"},
        {"don 't , we 'll , I 'd", "don 't, we 'll, I 'd"},
        {"a ' b", "a'b"},
        {" .x", "."
                "x"},
        {"no change here", "no change here"},
    };
    struct tokenizer *llama3 = load_real("llama3"), *qwen3 = load_real("qwen3");
    struct tokenizer *gpt4o = load_real("gpt4o"), *dsv3 = load_real("deepseek_v3");
    (void)state;
    for (size_t i = 0; i < AR_ARRAY_LEN(cases); i++) {
        char *s = round_trip(llama3, cases[i].in);
        if (strcmp(s, cases[i].out) != 0)
            fail_msg("llama3: \"%s\" -> \"%s\", want \"%s\"", cases[i].in, s, cases[i].out);
        ar_free(s);
        /* Qwen3, GPT-4o and DeepSeek-V3 keep every space (their pre-tokenizers say so) */
        s = round_trip(qwen3, cases[i].in);
        assert_string_equal(s, cases[i].in);
        ar_free(s);
        s = round_trip(gpt4o, cases[i].in);
        assert_string_equal(s, cases[i].in);
        ar_free(s);
        s = round_trip(dsv3, cases[i].in);
        assert_string_equal(s, cases[i].in);
        ar_free(s);
    }
    tokenizer_destroy(llama3);
    tokenizer_destroy(qwen3);
    tokenizer_destroy(gpt4o);
    tokenizer_destroy(dsv3);
}

/* Every character of s[0..n) is complete (lead byte followed by all its continuations). */
static bool complete_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
        if (!l || i + l > n)
            return false;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xc0) != 0x80)
                return false;
        i += l;
    }
    return true;
}

/* The streaming detokenizer sends pieces as they come (as llama.cpp streams): no clean-up,
 * and still only complete UTF-8 characters per chunk. */
static void llama3_stream_keeps_pieces_and_utf8(void **state)
{
    static const char text[] = "so far .... \xe5\xa4\xaa\xe6\x85\xa2 \xf0\x9f\x98\xb6 ok";
    struct tokenizer *tok = load_real("llama3");
    struct tokenizer_stream st;
    int32_t *ids = NULL;
    int64_t n = 0;
    char cat[256];
    size_t cat_len = 0, len;
    const char *out;
    (void)state;
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), true, false, &ids, &n), AR_OK);
    tokenizer_stream_init(&st, true);
    for (int64_t i = 0; i < n; i++) {
        assert_int_equal(tokenizer_stream_push(tok, &st, ids[i], &out, &len), AR_OK);
        assert_true(complete_utf8(out, len));
        assert_true(cat_len + len < sizeof(cat));
        memcpy(cat + cat_len, out, len);
        cat_len += len;
    }
    assert_int_equal(tokenizer_stream_flush(&st, &out, &len), AR_OK);
    assert_int_equal(len, 0);
    tokenizer_stream_fini(&st);
    assert_int_equal(cat_len, strlen(text));
    assert_memory_equal(cat, text, cat_len);
    ar_free(ids);
    tokenizer_destroy(tok);
}

/* ---- merges by ids ---------------------------------------------------------------------- */

/* The merger by token ids gives the same tokens as the merger by text on every real
 * vocabulary, for random mixes of ASCII, CJK, emoji, marks and stray bytes. */
static void id_merges_equal_text_merges(void **state)
{
    static const char *const vocabs[] = {"qwen3", "llama3", "gpt4o", "deepseek_v3"};
    static const char *const parts[] = {
        "the ",  "The",   " don't", "'S",    "123",   " 4567",  "\n",   "  ",    "\t",   ".",
        "</s>",  "<|im_end|>", "\xe5\xa5\xbd", "\xe8\xaf\x84\xe4\xbb\xb7",
        "\xef\xbc\x8c", "\xf0\x9f\x98\x82", "\xe2\x80\x8d", "e\xcc\x81", "\xff",
        "\xc3", "Gr\xc3\xbc\xc3\x9f" "e", "\xd0\x9f\xd1\x80\xd0\xb8", "~", "!!", "ing",
        "tion"};
    struct th_rng r = {0x5eed1234u};
    (void)state;
    for (size_t v = 0; v < AR_ARRAY_LEN(vocabs); v++) {
        struct tokenizer *ids = load_real(vocabs[v]), *text = load_real(vocabs[v]);
        assert_int_equal(tokenizer_use_text_merges(text), AR_OK);
        for (int iter = 0; iter < 300; iter++) {
            char buf[600];
            size_t len = 0, n_parts = 1 + th_rng_u64(&r) % 40;
            int32_t *a = NULL, *b = NULL;
            int64_t na = 0, nb = 0;
            for (size_t k = 0; k < n_parts; k++) {
                const char *p = parts[th_rng_u64(&r) % AR_ARRAY_LEN(parts)];
                size_t l = strlen(p);
                if (len + l >= sizeof(buf))
                    break;
                memcpy(buf + len, p, l);
                len += l;
            }
            assert_int_equal(tokenizer_encode(ids, buf, len, true, iter & 1, &a, &na), AR_OK);
            assert_int_equal(tokenizer_encode(text, buf, len, true, iter & 1, &b, &nb), AR_OK);
            if (na != nb || (na && memcmp(a, b, (size_t)na * sizeof(int32_t)) != 0))
                fail_msg("%s: ids and text merges differ on \"%.*s\"", vocabs[v], (int)len,
                         buf);
            ar_free(a);
            ar_free(b);
        }
        tokenizer_destroy(ids);
        tokenizer_destroy(text);
    }
}

/* ---- the separator token ------------------------------------------------------------------ */

/* Loads a four-token vocabulary ("a", "b", "ab", "</s>" = 3) with add_eos, add_sep and a
 * separator id (sep < 0: no key); returns the status. */
static enum ar_status load_sep(bool add_eos, bool add_sep, int sep, struct tokenizer **out,
                               struct ar_err *err)
{
    struct gguf_writer *w = tiny_writer("gpt-2", 4);
    assert_int_equal(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 3), AR_OK);
    assert_int_equal(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false), AR_OK);
    assert_int_equal(gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", add_eos), AR_OK);
    assert_int_equal(gguf_writer_set_bool(w, "tokenizer.ggml.add_sep_token", add_sep), AR_OK);
    if (sep >= 0)
        assert_int_equal(
            gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", (uint32_t)sep), AR_OK);
    return load_written(w, NULL, out, err);
}

/* With tokenizer.ggml.add_sep_token the separator follows the text (and EOS) when special
 * tokens are added, never otherwise; asking for it without a separator id is refused. */
static void add_sep_appends_the_separator(void **state)
{
    static const struct {
        bool add_eos, add_sep;
        int sep;
        int32_t want[3]; /* for "ab" with add_special, -1 ends */
    } cases[] = {
        {false, false, 0, {2, -1}},   /* a separator id alone adds nothing */
        {false, true, 0, {2, 0, -1}}, /* "a" as the separator: any token may be it */
        {true, true, 1, {2, 3, 1}},   /* EOS first, then the separator */
        {true, false, -1, {2, 3, -1}},
    };
    (void)state;
    for (size_t c = 0; c < AR_ARRAY_LEN(cases); c++) {
        struct tokenizer *tok = NULL;
        struct ar_err err = {0};
        int32_t *ids = NULL;
        int64_t n = 0, n_want = 0;
        assert_int_equal(load_sep(cases[c].add_eos, cases[c].add_sep, cases[c].sep, &tok, &err),
                         AR_OK);
        while (n_want < 3 && cases[c].want[n_want] >= 0)
            n_want++;
        assert_int_equal(tokenizer_encode(tok, "ab", 2, true, false, &ids, &n), AR_OK);
        assert_int_equal(n, n_want);
        for (int64_t i = 0; i < n; i++)
            assert_int_equal(ids[i], cases[c].want[i]);
        ar_free(ids);
        assert_int_equal(tokenizer_encode(tok, "ab", 2, false, false, &ids, &n), AR_OK);
        assert_true(n == 1 && ids[0] == 2); /* without add_special: the text alone */
        ar_free(ids);
        tokenizer_destroy(tok);
    }
    {
        struct tokenizer *tok = NULL;
        struct ar_err err = {0};
        assert_int_equal(load_sep(false, true, -1, &tok, &err), AR_EFORMAT);
        assert_null(tok);
        assert_non_null(strstr(err.msg, "seperator_token_id"));
        assert_int_equal(load_sep(false, true, 9, &tok, &err), AR_EFORMAT); /* out of range */
        assert_null(tok);
    }
}

/* ---- the merger against a textbook BPE loop ---------------------------------------------- */

#define REF_MAX 4096

/* The tokens of one pre-token word of a byte-level BPE vocabulary by the textbook loop, written
 * here without the library's merger: the word's bytes as GPT-2 table characters, then the
 * adjacent pair of lowest merge rank (the leftmost of equals) merged until none is left, each
 * symbol then looked up by its text. tok must use merges by text (tokenizer_merge_rank).
 * Llama 3's ignore_merges takes a word that is a token whole; a symbol that is no plain token
 * gives the plain single-byte tokens of its text. Returns the number of ids in out. */
static size_t ref_word(const struct tokenizer *tok, const char *word, size_t len, int32_t *out)
{
    static char text[2 * REF_MAX];
    static uint32_t start[REF_MAX], n[REF_MAX];
    size_t m = 0, t = 0, k = 0;
    int32_t id;
    assert_true(len <= REF_MAX);
    for (size_t i = 0; i < len; i++) {
        start[m] = (uint32_t)t;
        n[m] = (uint32_t)ar_utf8_encode(tokenizer_byte_to_cp((uint8_t)word[i]), text + t);
        t += n[m++];
    }
    if (tok->ignore_merges && (id = tokenizer_find(tok, text, t)) >= 0 &&
        !(tok->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN))) {
        out[0] = id;
        return 1;
    }
    for (;;) {
        size_t best = m;
        int32_t best_rank = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t r = tokenizer_merge_rank(tok, text + start[i], n[i], text + start[i + 1],
                                             n[i + 1]);
            if (r >= 0 && (best_rank < 0 || r < best_rank)) {
                best = i;
                best_rank = r;
            }
        }
        if (best == m)
            break;
        n[best] += n[best + 1]; /* symbols are neighbouring spans of text */
        for (size_t i = best + 1; i + 1 < m; i++) {
            start[i] = start[i + 1];
            n[i] = n[i + 1];
        }
        m--;
    }
    for (size_t i = 0; i < m; i++) {
        id = tokenizer_find(tok, text + start[i], n[i]);
        if (id >= 0 && !(tok->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN))) {
            out[k++] = id;
            continue;
        }
        for (uint32_t j = 0; j < n[i]; j++) {
            id = tokenizer_find(tok, text + start[i] + j, 1);
            if (id >= 0 && !(tok->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN)))
                out[k++] = id;
        }
    }
    return k;
}

/* Tokenizes text with tok (merges by ids) and, word by word, with ref_word on text_tok;
 * fails on the first difference. Counts the words of more than 48 bytes in *n_long. */
static void check_against_ref(const char *vocab, const struct tokenizer *tok,
                              const struct tokenizer *text_tok, const char *text, size_t len,
                              size_t *n_long)
{
    static int32_t want[2 * REF_MAX];
    int32_t *got = NULL;
    int64_t n_got = 0;
    uint32_t *sp = NULL;
    size_t n_sp = 0, n_want = 0;
    assert_int_equal(tokenizer_encode(tok, text, len, false, false, &got, &n_got), AR_OK);
    assert_int_equal(tokenizer_pre_split(text_tok, text, len, &sp, &n_sp), AR_OK);
    for (size_t i = 0; i < n_sp; i++) {
        assert_true(n_want + 2 * sp[2 * i + 1] <= AR_ARRAY_LEN(want));
        n_want += ref_word(text_tok, text + sp[2 * i], sp[2 * i + 1], want + n_want);
        *n_long += sp[2 * i + 1] > 48;
    }
    if ((size_t)n_got != n_want || (n_got && memcmp(got, want, n_want * sizeof(int32_t)) != 0))
        fail_msg("%s: the merger and the textbook loop differ on \"%.*s\" (%lld vs %zu ids)",
                 vocab, (int)len, text, (long long)n_got, n_want);
    ar_free(got);
    ar_free(sp);
}

/* The merger (the byte-pair table, characters taken whole, the whole-word shortcut) gives the textbook loop's tokens on every
 * real vocabulary: for random strings of the vocabulary's own pieces (stray bytes and partial
 * characters included), long Chinese words (one pre-token word of up to 180 bytes), Chinese
 * characters between such pieces and long runs of one repeated character. */
static void merger_equals_textbook_bpe(void **state)
{
    static const char *const vocabs[] = {"qwen3", "llama3", "gpt4o", "deepseek_v3"};
    static const char *const runs[] = {"a", "\xe5\xa5\xbd", "=", " ", "0", "\xf0\x9f\x98\x82",
                                       "\xc3\xa9", "ab"};
    struct th_rng r = {0x7ac0ffeeu};
    (void)state;
    for (size_t v = 0; v < AR_ARRAY_LEN(vocabs); v++) {
        struct tokenizer *tok = load_real(vocabs[v]), *text_tok = load_real(vocabs[v]);
        size_t n_long = 0;
        char buf[1024];
        assert_int_equal(tokenizer_use_text_merges(text_tok), AR_OK);
        for (int iter = 0; iter < 150; iter++) { /* the vocabulary's own pieces */
            size_t len = 0, n_parts = 1 + th_rng_u64(&r) % 12;
            for (size_t k = 0; k < n_parts; k++) {
                int32_t id = (int32_t)(th_rng_u64(&r) % (uint64_t)tok->n_vocab);
                const char *p = tok->piece + tok->piece_off[id];
                size_t l = tok->piece_len[id];
                if (!(tok->attr[id] & TOKENIZER_ATTR_NORMAL) || memchr(p, '<', l) ||
                    len + l >= sizeof(buf))
                    continue; /* user-defined texts would be matched before splitting */
                memcpy(buf + len, p, l);
                len += l;
            }
            check_against_ref(vocabs[v], tok, text_tok, buf, len, &n_long);
        }
        for (int iter = 0; iter < 60; iter++) { /* Chinese words of 1..60 characters */
            size_t len = 0, n_chars = 1 + th_rng_u64(&r) % 60;
            for (size_t k = 0; k < n_chars; k++) /* CJK unified ideographs, common ones first */
                len += ar_utf8_encode(0x4e00 + (uint32_t)(th_rng_u64(&r) % (k & 1 ? 20992 : 600)),
                                      buf + len);
            check_against_ref(vocabs[v], tok, text_tok, buf, len, &n_long);
        }
        for (int iter = 0; iter < 150; iter++) { /* Chinese characters between pieces */
            size_t len = 0, n_parts = 1 + th_rng_u64(&r) % 30;
            for (size_t k = 0; k < n_parts && len + 64 < sizeof(buf); k++) {
                int32_t id = (int32_t)(th_rng_u64(&r) % (uint64_t)tok->n_vocab);
                size_t l = tok->piece_len[id];
                if (k % 3 != 2) {
                    len += ar_utf8_encode(0x4e00 + (uint32_t)(th_rng_u64(&r) % 3000), buf + len);
                } else if ((tok->attr[id] & TOKENIZER_ATTR_NORMAL) && l < 48 &&
                           !memchr(tok->piece + tok->piece_off[id], '<', l)) {
                    memcpy(buf + len, tok->piece + tok->piece_off[id], l);
                    len += l;
                }
            }
            check_against_ref(vocabs[v], tok, text_tok, buf, len, &n_long);
        }
        for (size_t k = 0; k < AR_ARRAY_LEN(runs); k++) /* one character repeated */
            for (size_t reps = 1; reps <= 120; reps += 1 + reps / 8) {
                size_t len = 0, l = strlen(runs[k]);
                for (size_t i = 0; i < reps && len + l < sizeof(buf); i++, len += l)
                    memcpy(buf + len, runs[k], l);
                check_against_ref(vocabs[v], tok, text_tok, buf, len, &n_long);
            }
        assert_true(n_long >= 50); /* long words were among them */
        assert_true(tok->n_chars > 1000); /* and characters were taken whole */
        tokenizer_destroy(tok);
        tokenizer_destroy(text_tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_listed_name_is_known),
        cmocka_unit_test(every_name_compiles_and_splits_losslessly),
        cmocka_unit_test(unknown_names_are_refused_and_overrides_work),
        cmocka_unit_test(contractions_follow_each_rule),
        cmocka_unit_test(cjk_follows_each_rule),
        cmocka_unit_test(digits_follow_each_rule),
        cmocka_unit_test(emoji_and_zwj_follow_each_rule),
        cmocka_unit_test(whitespace_runs_follow_each_rule),
        cmocka_unit_test(combining_marks_follow_each_rule),
        cmocka_unit_test(llama3_detokenizer_cleans_tokenization_spaces),
        cmocka_unit_test(llama3_stream_keeps_pieces_and_utf8),
        cmocka_unit_test(id_merges_equal_text_merges),
        cmocka_unit_test(merger_equals_textbook_bpe),
        cmocka_unit_test(add_sep_appends_the_separator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
