/* pretok.c - the pre-tokenizers of byte-level BPE vocabularies: one table from every
 * tokenizer.ggml.pre name llama.cpp's vocabulary loader accepts to the split rules (regex
 * sequence) it runs and the vocabulary flags that come with the name (merges ignored for
 * whole-word tokens, implicit BOS, detokenizer space clean-up).
 *
 * The patterns are the published split patterns of each family (the Pre-tokenizer "Split"
 * of its Hugging Face tokenizer.json), written for PCRE2 (UTF, UCP) so that they cut text
 * where the reference does. Where the reference's regex engine reads a pattern differently
 * from its author's intent, the pattern here follows the reference (each such place says
 * why). Facts about the reference that shape the patterns:
 *   - patterns that use \p{..} classes run over text whose non-ASCII characters are reduced
 *     to their general category; in that mode ASCII '~' belongs neither to \p{P} nor to
 *     \p{S}, and the case classes (\p{Lu}, \p{Ll}, ...) stand for "a letter" (any ASCII
 *     or non-ASCII letter);
 *   - patterns without \p{..} run over code points;
 *   - empty matches (lookahead-only patterns) are split points.
 *
 * Adding a name: one line in pre_names[] (and, for a new family, its patterns and a line
 * in rules[]). */
#include "tokenizer_internal.h"

/* ---- building blocks ---------------------------------------------------------------------- */

#define CONTR "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define GPT2_CORE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* GPT-2's pattern as the reference runs it (a hand-written splitter that gives every
 * character left over its own piece, which a trailing \s+ says for the only ones left) */
#define RE_GPT2 GPT2_CORE "|\\s+"
#define RE_LLAMA3                                                                             \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"         \
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                              \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"              \
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* o200k-style case classes: "upper" is a letter that is not a-z, "lower" a letter that is
 * not A-Z ("not a non-letter and not a-z" is one class, repeated without a backtracking
 * frame per character). */
#define UPPER "[^\\P{L}a-z]"
#define LOWER "[^\\P{L}A-Z]"
#define RE_GPT4O                                                                              \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+" CONTR "?"                                    \
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*" CONTR "?"                                   \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                             \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+"                                              \
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*"                                             \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* the same with combining marks counted as letters of either case */
#define UPPER_M "(?:\\p{M}|" UPPER ")"
#define LOWER_M "(?:\\p{M}|" LOWER ")"
#define RE_GRANITE_MULTI                                                                      \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPER_M "*" LOWER_M "+" CONTR "?"                                \
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER_M "+" LOWER_M "*" CONTR "?"                               \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* case classes read as "a letter or a mark" (see the header comment) */
#define LM "[\\p{L}\\p{M}]"
#define RE_CASED_LM(num)                                                                      \
    "[^\\r\\n\\p{L}\\p{N}]?" LM "*" LM "+" CONTR "?|[^\\r\\n\\p{L}\\p{N}]?" LM "+" LM "*" CONTR \
    "?|" num "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* DeepSeek-V3: \p{P} and \p{S} without '~' (see the header comment): "[^ L M N Z C ~]" is
 * "punctuation or symbol, but not ~"; a character that is none of \r \n L P S is '~' or one
 * of M N Z C other than \r \n. */
#define PS_NOT_TILDE "[^\\p{L}\\p{M}\\p{N}\\p{Z}\\p{C}~]"
#define NOT_CR_LF_L_P_S "(?:~|[^\\r\\n\\p{L}\\p{P}\\p{S}])"
#define DSV3_MAIN(ps_tail)                                                                    \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"                                   \
    "|" NOT_CR_LF_L_P_S "?[\\p{L}\\p{M}]+| ?" PS_NOT_TILDE "+" ps_tail
#define RE_DSV3_MAIN DSV3_MAIN("[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
#define RE_SPARK_MAIN DSV3_MAIN("|[\\r\\n]|\\s+(?!\\S)|\\s+")
#define RE_CJK_KANA "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+"

/* Digit runs cut into groups of three aligned to the run's end ("1234567": "1" "234" "567"),
 * as the reference's hand-written splitter for AFMoE and Tiny Aya does (for any \p{N}). */
#define RE_DIGITS_END3 "\\p{N}{1,3}(?=(?:\\p{N}{3})*(?!\\p{N}))"

/* Kimi-K2 as the reference's hand-written splitter runs Moonshot's pattern: Han runs (its
 * ranges), then letter runs without Han and without case splitting (marks are not letters
 * there), the rest as Llama 3. */
#define HAN                                                                                   \
    "\\x{4e00}-\\x{9fff}\\x{3400}-\\x{4dbf}\\x{20000}-\\x{2a6df}\\x{2a700}-\\x{2b73f}"        \
    "\\x{2b740}-\\x{2b81f}\\x{2b820}-\\x{2ceaf}\\x{2ceb0}-\\x{2ebef}\\x{f900}-\\x{faff}"       \
    "\\x{2f800}-\\x{2fa1f}"
#define RE_KIMI_K2                                                                            \
    "[" HAN "]+|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}" HAN "]+" CONTR "?|\\p{N}{1,3}|"                 \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* AFMoE's CJK and South-East Asian scripts */
#define RE_AFMOE_ASIAN                                                                        \
    "[\\x{4e00}-\\x{9fff}\\x{3400}-\\x{4dbf}\\x{f900}-\\x{faff}\\x{3040}-\\x{309f}"          \
    "\\x{30a0}-\\x{30ff}\\x{ff65}-\\x{ff9f}\\x{2f00}-\\x{2fdf}\\x{0e40}-\\x{0e7f}"            \
    "\\x{0e80}-\\x{0eff}\\x{1780}-\\x{17ff}\\x{1000}-\\x{109f}\\x{aa60}-\\x{aa7f}"            \
    "\\x{a9e0}-\\x{a9ff}\\x{ac00}-\\x{d7af}\\x{1100}-\\x{11ff}]+"

/* BLOOM's "everything but whitespace and sentence punctuation" (the parentheses and the bar
 * are part of the class, as published) */
#define RE_BLOOM                                                                              \
    " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{0964}\\x{06d4}\\x{060c})]+"

/* ---- split rules ---------------------------------------------------------------------------- */

static const char *const re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    GPT2_CORE,
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};
static const char *const re_gpt2[] = {RE_GPT2};
static const char *const re_llama3[] = {RE_LLAMA3};
static const char *const re_qwen2[] = {RE_QWEN2};
static const char *const re_qwen35[] = {
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
static const char *const re_gpt4o[] = {RE_GPT4O};
static const char *const re_tekken[] = {RE_TEKKEN};
static const char *const re_granite_multi[] = {RE_GRANITE_MULTI};
static const char *const re_deepseek_llm[] = {
    "[\\r\\n]",
    /* Latin, Greek, Cyrillic, ... cased letters */
    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"
    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"
    "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}"
    "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}"
    "\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}"
    "\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}"
    "\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}"
    "\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}"
    "\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}"
    "\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}"
    "\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}"
    "\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}"
    "\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}"
    "\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}"
    "\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}"
    "\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}"
    "\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}"
    "\\x{1e900}-\\x{1e943}]+",
    /* ASCII and full-width punctuation, curly quotes, ideographic space and full stop */
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
    /* "\s+$": the lookbehind only skips start positions inside a whitespace run, which
     * cannot begin the leftmost match, and keeps the search linear */
    "(?<!\\s)\\s+$",
    "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+",
    "\\p{N}+",
};
static const char *const re_deepseek_coder[] = {
    "[\\r\\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+",
    "\\p{N}",
};
static const char *const re_deepseek3[] = {"\\p{N}{1,3}", RE_CJK_KANA, RE_DSV3_MAIN};
static const char *const re_spark2_5[] = {"\\p{N}{1,3}", RE_CJK_KANA, RE_SPARK_MAIN,
                                          "\\p{N}"};
static const char *const re_falcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    RE_GPT2,
    "[0-9][0-9][0-9]",
};
static const char *const re_starcoder[] = {"\\p{N}", RE_GPT2};
static const char *const re_bloom[] = {RE_BLOOM};
static const char *const re_viking[] = {RE_BLOOM, "\\p{N}"};
static const char *const re_chameleon[] = {
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    RE_GPT2,
};
static const char *const re_jais2[] = {
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|"
          "\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"};
static const char *const re_tiny_aya[] = {RE_DIGITS_END3, RE_CASED_LM("\\p{N}{1,3}")};
static const char *const re_afmoe[] = {RE_DIGITS_END3, RE_AFMOE_ASIAN, RE_DSV3_MAIN};
static const char *const re_kimi_k2[] = {RE_KIMI_K2};
static const char *const re_youtu[] = {
    "[\\x{ac00}-\\x{d7a3}\\x{3131}-\\x{318e}]+"
    "|[\\x{ff01}\\x{2026}\\x{201c}\\x{201d}\\x{2018}\\x{2019}\\x{2014}\\x{ff1a}\\x{ff1b}"
    "\\x{ff0c}\\x{3001}-\\x{303f}\\x{fe30}-\\x{fe4f}]+"
    "|[\\x{3105}-\\x{312f}]+|" RE_CJK_KANA,
    RE_CASED_LM("\\p{N}")};
/* digits, then split points before every group of three that ends the number */
static const char *const re_superbpe[] = {"\\p{N}+", "(?=(?:[0-9]{3})+(?![0-9]))"};
static const char *const re_bailingmoe[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"};
static const char *const re_seed_coder[] = {
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
static const char *const re_laguna[] = {"[^\\n]+|[\\n]+", RE_QWEN2};
static const char *const re_exaone_moe[] = {
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}|"
          " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"};
static const char *const re_minicpm5[] = {
    "\\p{N}{1,3}",
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};

#define RULE(name) {re_##name, (int)AR_ARRAY_LEN(re_##name)}
static const struct {
    const char *const *re;
    int n;
} rules[] = {
    [TOKENIZER_SPLIT_DEFAULT] = RULE(default),
    [TOKENIZER_SPLIT_GPT2] = RULE(gpt2),
    [TOKENIZER_SPLIT_LLAMA3] = RULE(llama3),
    [TOKENIZER_SPLIT_QWEN2] = RULE(qwen2),
    [TOKENIZER_SPLIT_QWEN35] = RULE(qwen35),
    [TOKENIZER_SPLIT_GPT4O] = RULE(gpt4o),
    [TOKENIZER_SPLIT_TEKKEN] = RULE(tekken),
    [TOKENIZER_SPLIT_GRANITE_MULTI] = RULE(granite_multi),
    [TOKENIZER_SPLIT_DEEPSEEK_LLM] = RULE(deepseek_llm),
    [TOKENIZER_SPLIT_DEEPSEEK_CODER] = RULE(deepseek_coder),
    [TOKENIZER_SPLIT_DEEPSEEK3] = RULE(deepseek3),
    [TOKENIZER_SPLIT_SPARK2_5] = RULE(spark2_5),
    [TOKENIZER_SPLIT_FALCON] = RULE(falcon),
    [TOKENIZER_SPLIT_STARCODER] = RULE(starcoder),
    [TOKENIZER_SPLIT_BLOOM] = RULE(bloom),
    [TOKENIZER_SPLIT_VIKING] = RULE(viking),
    [TOKENIZER_SPLIT_CHAMELEON] = RULE(chameleon),
    [TOKENIZER_SPLIT_JAIS2] = RULE(jais2),
    [TOKENIZER_SPLIT_TINY_AYA] = RULE(tiny_aya),
    [TOKENIZER_SPLIT_YOUTU] = RULE(youtu),
    [TOKENIZER_SPLIT_SUPERBPE] = RULE(superbpe),
    [TOKENIZER_SPLIT_BAILINGMOE] = RULE(bailingmoe),
    [TOKENIZER_SPLIT_SEED_CODER] = RULE(seed_coder),
    [TOKENIZER_SPLIT_LAGUNA] = RULE(laguna),
    [TOKENIZER_SPLIT_EXAONE_MOE] = RULE(exaone_moe),
    [TOKENIZER_SPLIT_MINICPM5] = RULE(minicpm5),
    [TOKENIZER_SPLIT_AFMOE] = RULE(afmoe),
    [TOKENIZER_SPLIT_KIMI_K2] = RULE(kimi_k2),
};
#undef RULE
_Static_assert(AR_ARRAY_LEN(rules) == TOKENIZER_SPLIT_COUNT, "one rule per split");

/* ---- names ---------------------------------------------------------------------------------- */

/* flags of a name */
#define IGN TOKENIZER_PRE_IGNORE_MERGES
#define BOS TOKENIZER_PRE_ADD_BOS
#define KEEP TOKENIZER_PRE_KEEP_SPACES
#define UNS TOKENIZER_PRE_UNSUPPORTED

static const struct tokenizer_pre_info pre_names[] = {
    {"default", TOKENIZER_SPLIT_DEFAULT, 0},
    /* Llama 3's split */
    {"llama3", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"llama-v3", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"llama-bpe", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"falcon3", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"falcon-h1", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"pixtral", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"midm-2.0", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"lfm2", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"jina-v5-nano", TOKENIZER_SPLIT_LLAMA3, IGN | BOS},
    {"dbrx", TOKENIZER_SPLIT_LLAMA3, 0},
    {"smaug-bpe", TOKENIZER_SPLIT_LLAMA3, 0},
    {"glm4", TOKENIZER_SPLIT_LLAMA3, 0}, /* merges kept, no implicit BOS (nor a default BOS id) */
    {"chatglm-bpe", TOKENIZER_SPLIT_LLAMA3, 0},
    {"jais-2", TOKENIZER_SPLIT_JAIS2, 0},
    /* DeepSeek */
    {"deepseek-llm", TOKENIZER_SPLIT_DEEPSEEK_LLM, KEEP},
    {"deepseek-coder", TOKENIZER_SPLIT_DEEPSEEK_CODER, KEEP},
    {"deepseek-v3", TOKENIZER_SPLIT_DEEPSEEK3, KEEP},
    {"hunyuan-dense", TOKENIZER_SPLIT_DEEPSEEK3, KEEP},
    {"joyai-llm", TOKENIZER_SPLIT_DEEPSEEK3, KEEP},
    {"spark2_5", TOKENIZER_SPLIT_SPARK2_5, KEEP},
    /* GPT-2's split */
    {"gpt-2", TOKENIZER_SPLIT_GPT2, 0},
    {"phi-2", TOKENIZER_SPLIT_GPT2, 0},
    {"jina-es", TOKENIZER_SPLIT_GPT2, 0},
    {"jina-de", TOKENIZER_SPLIT_GPT2, 0},
    {"gigachat", TOKENIZER_SPLIT_GPT2, 0},
    {"jina-v2-es", TOKENIZER_SPLIT_GPT2, 0},
    {"jina-v2-de", TOKENIZER_SPLIT_GPT2, 0},
    {"a.x-4.0", TOKENIZER_SPLIT_GPT2, 0},
    {"mellum", TOKENIZER_SPLIT_GPT2, 0},
    {"modern-bert", TOKENIZER_SPLIT_GPT2, 0},
    {"jina-v1-en", TOKENIZER_SPLIT_GPT2, 0}, /* the reference also appends a separator token */
    {"jina-v2-code", TOKENIZER_SPLIT_GPT2, 0},
    {"roberta-bpe", TOKENIZER_SPLIT_GPT2, 0},
    {"mpt", TOKENIZER_SPLIT_GPT2, 0},
    {"olmo", TOKENIZER_SPLIT_GPT2, 0},
    {"jais", TOKENIZER_SPLIT_GPT2, 0},
    {"exaone4", TOKENIZER_SPLIT_GPT2, 0},
    {"trillion", TOKENIZER_SPLIT_GPT2, KEEP},
    {"granite-docling", TOKENIZER_SPLIT_GPT2, KEEP},
    /* digits one by one, then GPT-2's split */
    {"starcoder", TOKENIZER_SPLIT_STARCODER, 0},
    {"refact", TOKENIZER_SPLIT_STARCODER, 0},
    {"command-r", TOKENIZER_SPLIT_STARCODER, KEEP},
    {"smollm", TOKENIZER_SPLIT_STARCODER, KEEP},
    {"codeshell", TOKENIZER_SPLIT_STARCODER, 0},
    {"exaone", TOKENIZER_SPLIT_STARCODER, 0},
    {"minerva-7b", TOKENIZER_SPLIT_STARCODER, 0},
    {"mellum2", TOKENIZER_SPLIT_STARCODER, 0},
    {"falcon", TOKENIZER_SPLIT_FALCON, 0},
    /* Qwen2's split */
    {"qwen2", TOKENIZER_SPLIT_QWEN2, KEEP},
    {"deepseek-r1-qwen", TOKENIZER_SPLIT_QWEN2, KEEP},
    {"kormo", TOKENIZER_SPLIT_QWEN2, KEEP},
    {"f2llmv2", TOKENIZER_SPLIT_QWEN2, KEEP},
    {"megrez", TOKENIZER_SPLIT_QWEN2, 0},
    {"stablelm2", TOKENIZER_SPLIT_QWEN2, 0},
    {"hunyuan", TOKENIZER_SPLIT_QWEN2, KEEP},
    {"solar-open", TOKENIZER_SPLIT_QWEN2, KEEP},
    {"grok-2", TOKENIZER_SPLIT_QWEN2, KEEP},
    {"qwen35", TOKENIZER_SPLIT_QWEN35, KEEP},
    {"laguna", TOKENIZER_SPLIT_LAGUNA, KEEP},
    {"minicpm5", TOKENIZER_SPLIT_MINICPM5, IGN},
    {"seed-coder", TOKENIZER_SPLIT_SEED_CODER, KEEP},
    {"bailingmoe", TOKENIZER_SPLIT_BAILINGMOE, KEEP},
    {"bailingmoe2", TOKENIZER_SPLIT_BAILINGMOE, KEEP},
    {"llada-moe", TOKENIZER_SPLIT_BAILINGMOE, KEEP},
    {"exaone-moe", TOKENIZER_SPLIT_EXAONE_MOE, 0},
    /* o200k-style splits */
    {"gpt-4o", TOKENIZER_SPLIT_GPT4O, KEEP},
    {"llama4", TOKENIZER_SPLIT_GPT4O, KEEP},
    {"kanana2", TOKENIZER_SPLIT_GPT4O, KEEP},
    {"talkie", TOKENIZER_SPLIT_GPT4O, KEEP},
    {"minimax-m2", TOKENIZER_SPLIT_GPT4O, KEEP},
    {"tekken", TOKENIZER_SPLIT_TEKKEN, KEEP | IGN | BOS},
    {"granite-embed-multi-97m", TOKENIZER_SPLIT_GRANITE_MULTI, KEEP | IGN},
    {"tiny_aya", TOKENIZER_SPLIT_TINY_AYA, KEEP},
    {"cohere2moe", TOKENIZER_SPLIT_TINY_AYA, KEEP},
    {"youtu", TOKENIZER_SPLIT_YOUTU, KEEP | IGN},
    /* sentence-punctuation splits */
    {"bloom", TOKENIZER_SPLIT_BLOOM, 0},
    {"gpt3-finnish", TOKENIZER_SPLIT_BLOOM, 0},
    {"poro-chat", TOKENIZER_SPLIT_BLOOM, KEEP},
    {"viking", TOKENIZER_SPLIT_VIKING, KEEP},
    {"chameleon", TOKENIZER_SPLIT_CHAMELEON, KEEP | BOS},
    {"superbpe", TOKENIZER_SPLIT_SUPERBPE, KEEP},
    /* known to the reference, but not byte-level BPE there (spaces as U+2581, raw UTF-8
     * merges): refused by name rather than tokenized differently */
    {"kimi-k2", TOKENIZER_SPLIT_KIMI_K2, KEEP},
    {"afmoe", TOKENIZER_SPLIT_AFMOE, KEEP},
    {"gemma4", TOKENIZER_SPLIT_DEFAULT, UNS},
    {"granite-embed-multi-311m", TOKENIZER_SPLIT_DEFAULT, UNS},
    {"sarvam-moe", TOKENIZER_SPLIT_DEFAULT, UNS},
    {"whitespace", TOKENIZER_SPLIT_DEFAULT, UNS},
};

#undef IGN
#undef BOS
#undef KEEP
#undef UNS

const struct tokenizer_pre_info *tokenizer_pre_lookup(const char *name, size_t len)
{
    for (size_t i = 0; i < AR_ARRAY_LEN(pre_names); i++)
        if (strlen(pre_names[i].name) == len && memcmp(pre_names[i].name, name, len) == 0)
            return &pre_names[i];
    return NULL;
}

size_t tokenizer_pre_count(void)
{
    return AR_ARRAY_LEN(pre_names);
}

const struct tokenizer_pre_info *tokenizer_pre_at(size_t i)
{
    return i < AR_ARRAY_LEN(pre_names) ? &pre_names[i] : NULL;
}

int tokenizer_split_patterns(enum tokenizer_split split, const char *const **re)
{
    *re = rules[split].re;
    return rules[split].n;
}

bool tokenizer_pre_known(const char *name)
{
    const struct tokenizer_pre_info *p = name ? tokenizer_pre_lookup(name, strlen(name)) : NULL;
    return p && !(p->flags & TOKENIZER_PRE_UNSUPPORTED);
}
