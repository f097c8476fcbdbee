/* chat.c - chat prompt formats: recognizing a model's template family from the Jinja text in
 * tokenizer.chat_template, rendering a conversation in that family's fixed format, and the
 * strings that end an assistant turn. No Jinja is executed. */
#include "tokenizer_internal.h"

static bool has(const char *s, size_t n, const char *needle)
{
    size_t m = strlen(needle);
    if (m > n)
        return false;
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, m) == 0)
            return true;
    return false;
}

/* The checks run in llama.cpp's order, so a template that carries the markers of several
 * families lands where llama.cpp puts it. Families llama.cpp knows but we do not render
 * (Falcon 3, Zephyr, Vicuna, ...) are recognized only to be reported as unknown. */
enum tokenizer_chat tokenizer_chat_detect(const char *tmpl, size_t len, bool *known)
{
    enum tokenizer_chat fam = TOKENIZER_CHAT_CHATML;
    bool ok = true;
#define HAS(m) has(tmpl, len, m)
    if (!tmpl || len == 0)
        ok = false;
    else if (HAS("<|im_start|>")) {
        if (HAS("<|im_sep|>"))
            fam = TOKENIZER_CHAT_PHI4;
        else if (HAS("<end_of_utterance>")) /* SmolVLM: <|im_start|> is its BOS */
            ok = false;
        else /* Qwen3's template opens think blocks; it is ChatML otherwise */
            fam = HAS("<think>") ? TOKENIZER_CHAT_QWEN3 : TOKENIZER_CHAT_CHATML;
    } else if ((len >= 7 && memcmp(tmpl, "mistral", 7) == 0) || HAS("[INST]"))
        fam = HAS("<<SYS>>") ? TOKENIZER_CHAT_LLAMA2 : TOKENIZER_CHAT_MISTRAL;
    else if (HAS("<|assistant|>") && HAS("<|end|>"))
        fam = TOKENIZER_CHAT_PHI3;
    else if (HAS("[gMASK]<sop>"))
        fam = TOKENIZER_CHAT_GLM4;
    else if (HAS("<|assistant|>") && HAS("<|user|>") && HAS("</s>"))
        ok = false; /* Falcon 3 */
    else if (HAS("<|assistant|>") && HAS("<|user|>"))
        fam = TOKENIZER_CHAT_GLMEDGE;
    else if (HAS("<|{{ item['role'] }}|>") && HAS("<|begin_of_image|>"))
        fam = TOKENIZER_CHAT_GLMEDGE;
    else if ((HAS("<|user|>") && HAS("<|endoftext|>")) /* Zephyr */ ||
             HAS("bos_token + message['role']")) /* Monarch */
        ok = false;
    else if (HAS("<start_of_turn>"))
        fam = TOKENIZER_CHAT_GEMMA;
    else if (HAS("'\\n\\nAssistant: ' + eos_token") || HAS("GPT4 Correct ") ||
             (HAS("USER: ") && HAS("ASSISTANT: ")) || (HAS("### Instruction:") && HAS("<|EOT|>")) ||
             (HAS("<|START_OF_TURN_TOKEN|>") && HAS("<|USER_TOKEN|>")))
        ok = false; /* Orion, OpenChat, Vicuna, DeepSeek Coder, Command-R */
    else if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>"))
        fam = TOKENIZER_CHAT_LLAMA3;
    else if (HAS("[gMASK]sop"))
        fam = TOKENIZER_CHAT_CHATGLM3;
    else
        ok = false;
#undef HAS
    if (!ok)
        fam = TOKENIZER_CHAT_CHATML;
    if (known)
        *known = ok;
    return fam;
}

static const char *const chat_names[TOKENIZER_CHAT_COUNT] = {
    [TOKENIZER_CHAT_CHATML] = "chatml",     [TOKENIZER_CHAT_LLAMA3] = "llama3",
    [TOKENIZER_CHAT_LLAMA2] = "llama2-sys", [TOKENIZER_CHAT_MISTRAL] = "llama2",
    [TOKENIZER_CHAT_GLM4] = "chatglm4",     [TOKENIZER_CHAT_CHATGLM3] = "chatglm3",
    [TOKENIZER_CHAT_GLMEDGE] = "glmedge",   [TOKENIZER_CHAT_GEMMA] = "gemma",
    [TOKENIZER_CHAT_PHI3] = "phi3",         [TOKENIZER_CHAT_PHI4] = "phi4",
    [TOKENIZER_CHAT_QWEN3] = "chatml", /* llama.cpp's name: it renders plain ChatML */
};

const char *tokenizer_chat_name(enum tokenizer_chat fam)
{
    if ((unsigned)fam >= TOKENIZER_CHAT_COUNT)
        return "unknown";
    return chat_names[fam];
}

bool tokenizer_chat_from_name(const char *name, enum tokenizer_chat *fam)
{
    if (!name)
        return false;
    for (int i = 0; i < TOKENIZER_CHAT_COUNT; i++)
        if (strcmp(chat_names[i], name) == 0) { /* "chatml" finds plain ChatML first */
            if (fam)
                *fam = (enum tokenizer_chat)i;
            return true;
        }
    /* our earlier names */
    if (strcmp(name, "glm4") == 0 || strcmp(name, "mistral") == 0) {
        if (fam)
            *fam = name[0] == 'g' ? TOKENIZER_CHAT_GLM4 : TOKENIZER_CHAT_MISTRAL;
        return true;
    }
    return false;
}

/* ---- rendering ------------------------------------------------------------------------------ */

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* s without leading and trailing ASCII whitespace: *n gets its length */
static const char *trimmed(const char *s, size_t *n)
{
    size_t e = strlen(s), a = 0;
    while (a < e && is_space(s[a]))
        a++;
    while (e > a && is_space(s[e - 1]))
        e--;
    *n = e - a;
    return s + a;
}

/* content without leading and trailing ASCII whitespace (Llama 3 and Gemma trim messages) */
static void put_trimmed(struct ar_buf *b, const char *s)
{
    size_t n;
    const char *t = trimmed(s, &n);
    ar_buf_put(b, t, n);
}

/* "<|role|>" + sep + content for every message (the GLM and Phi-3 shapes); tail follows each
 * message */
static void render_role_tags(struct ar_buf *b, const struct tokenizer_chat_msg *msgs, size_t n,
                             const char *sep, const char *tail)
{
    for (size_t i = 0; i < n; i++) {
        ar_buf_puts(b, "<|");
        ar_buf_puts(b, msgs[i].role);
        ar_buf_puts(b, "|>");
        ar_buf_puts(b, sep);
        ar_buf_puts(b, msgs[i].content);
        ar_buf_puts(b, tail);
    }
}

/* Gemma has no system turn: system texts (trimmed, concatenated) open the next user turn,
 * "assistant" is called "model", and contents are trimmed. */
static void render_gemma(struct ar_buf *b, const struct tokenizer_chat_msg *msgs, size_t n,
                         bool add_generation_prompt)
{
    struct ar_buf sys = {NULL, 0, 0, false};
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (strcmp(role, "system") == 0) {
            put_trimmed(&sys, msgs[i].content);
            continue;
        }
        if (strcmp(role, "assistant") == 0)
            role = "model";
        ar_buf_puts(b, "<start_of_turn>");
        ar_buf_puts(b, role);
        ar_buf_puts(b, "\n");
        if (sys.n && strcmp(role, "model") != 0) {
            ar_buf_put(b, sys.s, sys.n);
            ar_buf_puts(b, "\n\n");
            sys.n = 0;
        }
        put_trimmed(b, msgs[i].content);
        ar_buf_puts(b, "<end_of_turn>\n");
    }
    if (sys.oom)
        b->oom = true;
    ar_free(sys.s);
    if (add_generation_prompt)
        ar_buf_puts(b, "<start_of_turn>model\n");
}

static void render_inst(struct ar_buf *b, const struct tokenizer_chat_msg *msgs, size_t n,
                        bool with_sys)
{
    bool inside = true; /* the first "[INST] " opens the first turn */
    ar_buf_puts(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        if (!inside) {
            ar_buf_puts(b, "[INST] ");
            inside = true;
        }
        if (strcmp(role, "system") == 0) {
            if (with_sys) {
                ar_buf_puts(b, "<<SYS>>\n");
                ar_buf_puts(b, c);
                ar_buf_puts(b, "\n<</SYS>>\n\n");
            } else { /* no system slot: it leads the first user turn */
                ar_buf_puts(b, c);
                ar_buf_puts(b, "\n");
            }
        } else if (strcmp(role, "user") == 0) {
            ar_buf_puts(b, c);
            ar_buf_puts(b, " [/INST]");
        } else {
            ar_buf_puts(b, c);
            ar_buf_puts(b, "</s>");
            inside = false;
        }
    }
}

enum ar_status tokenizer_chat_format(enum tokenizer_chat fam,
                                     const struct tokenizer_chat_msg *msgs, size_t n,
                                     bool add_generation_prompt, char **out, size_t *len)
{
    struct ar_buf b = {NULL, 0, 0, false};
    if (!out || (!msgs && n) || (unsigned)fam >= TOKENIZER_CHAT_COUNT)
        return AR_EINVAL;
    *out = NULL;
    if (len)
        *len = 0;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return AR_EINVAL;

    switch (fam) {
    case TOKENIZER_CHAT_CHATML:
    case TOKENIZER_CHAT_QWEN3:
        for (size_t i = 0; i < n; i++) {
            ar_buf_puts(&b, "<|im_start|>");
            ar_buf_puts(&b, msgs[i].role);
            ar_buf_puts(&b, "\n");
            ar_buf_puts(&b, msgs[i].content);
            ar_buf_puts(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|im_start|>assistant\n");
        /* thinking off: the answer starts after an empty think block, as Qwen3's template
         * writes it for enable_thinking=false */
        if (add_generation_prompt && fam == TOKENIZER_CHAT_QWEN3)
            ar_buf_puts(&b, "<think>\n\n</think>\n\n");
        break;
    case TOKENIZER_CHAT_PHI4:
        for (size_t i = 0; i < n; i++) {
            ar_buf_puts(&b, "<|im_start|>");
            ar_buf_puts(&b, msgs[i].role);
            ar_buf_puts(&b, "<|im_sep|>");
            ar_buf_puts(&b, msgs[i].content);
            ar_buf_puts(&b, "<|im_end|>");
        }
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|im_start|>assistant<|im_sep|>");
        break;
    case TOKENIZER_CHAT_PHI3:
        render_role_tags(&b, msgs, n, "\n", "<|end|>\n");
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|assistant|>\n");
        break;
    case TOKENIZER_CHAT_GEMMA:
        render_gemma(&b, msgs, n, add_generation_prompt);
        break;
    case TOKENIZER_CHAT_CHATGLM3: /* a space after each role tag's newline */
        ar_buf_puts(&b, "[gMASK]sop");
        render_role_tags(&b, msgs, n, "\n ", "");
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|assistant|>");
        break;
    case TOKENIZER_CHAT_GLMEDGE:
        render_role_tags(&b, msgs, n, "\n", "");
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|assistant|>");
        break;
    case TOKENIZER_CHAT_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            ar_buf_puts(&b, "<|start_header_id|>");
            ar_buf_puts(&b, msgs[i].role);
            ar_buf_puts(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content);
            ar_buf_puts(&b, "<|eot_id|>");
        }
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TOKENIZER_CHAT_LLAMA2:
    case TOKENIZER_CHAT_MISTRAL:
        /* the prompt already ends inside an open turn ("... [/INST]") */
        render_inst(&b, msgs, n, fam == TOKENIZER_CHAT_LLAMA2);
        break;
    case TOKENIZER_CHAT_GLM4:
        ar_buf_puts(&b, "[gMASK]<sop>");
        render_role_tags(&b, msgs, n, "\n", "");
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|assistant|>\n");
        break;
    default:
        break;
    }
    if (!(*out = ar_buf_take(&b, len)))
        return AR_ENOMEM;
    return AR_OK;
}

/* ---- stops ---------------------------------------------------------------------------------- */

static const char *const stops_chatml[] = {"<|im_end|>"};
static const char *const stops_llama3[] = {"<|eot_id|>"};
static const char *const stops_inst[] = {"</s>"};
static const char *const stops_glm4[] = {"<|user|>", "<|observation|>", "<|endoftext|>"};
static const char *const stops_gemma[] = {"<end_of_turn>"};
static const char *const stops_phi3[] = {"<|end|>", "<|endoftext|>"};

int tokenizer_chat_stops(enum tokenizer_chat fam, const char *const **strs)
{
    switch (fam) {
    case TOKENIZER_CHAT_LLAMA3:
        *strs = stops_llama3;
        return (int)AR_ARRAY_LEN(stops_llama3);
    case TOKENIZER_CHAT_LLAMA2:
    case TOKENIZER_CHAT_MISTRAL:
        *strs = stops_inst;
        return (int)AR_ARRAY_LEN(stops_inst);
    case TOKENIZER_CHAT_GLM4:
    case TOKENIZER_CHAT_CHATGLM3:
    case TOKENIZER_CHAT_GLMEDGE: /* the model ends its turn by opening the next one */
        *strs = stops_glm4;
        return (int)AR_ARRAY_LEN(stops_glm4);
    case TOKENIZER_CHAT_GEMMA:
        *strs = stops_gemma;
        return (int)AR_ARRAY_LEN(stops_gemma);
    case TOKENIZER_CHAT_PHI3:
        *strs = stops_phi3;
        return (int)AR_ARRAY_LEN(stops_phi3);
    case TOKENIZER_CHAT_CHATML:
    case TOKENIZER_CHAT_QWEN3:
    case TOKENIZER_CHAT_PHI4:
    default:
        *strs = stops_chatml;
        return (int)AR_ARRAY_LEN(stops_chatml);
    }
}

static int add_unique(int32_t *ids, int n, int32_t id)
{
    if (id < 0)
        return n;
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return n;
    ids[n] = id;
    return n + 1;
}

int tokenizer_chat_stop_ids(const struct tokenizer *tok, enum tokenizer_chat fam, int32_t *ids,
                            int cap)
{
    const char *const *strs;
    int32_t all[8];
    int n_strs = tokenizer_chat_stops(fam, &strs), n = 0;
    for (int i = 0; i < n_strs && i < 6; i++)
        n = add_unique(all, n, tokenizer_find(tok, strs[i], strlen(strs[i])));
    n = add_unique(all, n, tok->eos);
    n = add_unique(all, n, tok->eot);
    for (int i = 0; ids && i < n && i < cap; i++)
        ids[i] = all[i];
    return n;
}

/* ---- think blocks -------------------------------------------------------------------------- */

enum { THINK_OUT = 0, THINK_IN, THINK_WS };

static const char think_open[] = "<think>";   /* '<' occurs only first in either tag, so a */
static const char think_close[] = "</think>"; /* failed match can only restart at a '<' */

void tokenizer_think_init(struct tokenizer_think *t)
{
    memset(t, 0, sizeof(*t));
}

/* One input byte; visible bytes go to out[*k...]. Writes never pass the byte being read when
 * out is the input (held bytes were read earlier), so the filter can run in place. */
static void think_byte(struct tokenizer_think *t, char c, char *out, size_t *k)
{
    if (t->state == THINK_WS) {
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
            return;
        t->state = THINK_OUT;
    }
    if (t->state == THINK_IN) {
        if (c == think_close[t->matched]) {
            if (++t->matched == sizeof(think_close) - 1) {
                t->state = THINK_WS;
                t->matched = 0;
            }
        } else {
            t->matched = c == '<';
        }
        return;
    }
    if (c == think_open[t->matched]) {
        t->hold[t->matched++] = c;
        if (t->matched == sizeof(think_open) - 1) {
            t->state = THINK_IN;
            t->matched = 0;
        }
        return;
    }
    for (uint8_t i = 0; i < t->matched; i++) /* not a tag after all */
        out[(*k)++] = t->hold[i];
    t->matched = 0;
    if (c == '<')
        t->hold[t->matched++] = c;
    else
        out[(*k)++] = c;
}

size_t tokenizer_think_push(struct tokenizer_think *t, const char *in, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        think_byte(t, in[i], out, &k);
    return k;
}

size_t tokenizer_think_flush(struct tokenizer_think *t, char *out)
{
    size_t k = 0;
    if (t->state == THINK_OUT) {
        for (; k < t->matched; k++)
            out[k] = t->hold[k];
    }
    tokenizer_think_init(t);
    return k;
}

size_t tokenizer_strip_think(char *s, size_t n)
{
    struct tokenizer_think t;
    size_t k;
    if (!s || !n)
        return 0;
    tokenizer_think_init(&t);
    k = tokenizer_think_push(&t, s, n, s);
    k += tokenizer_think_flush(&t, s + k);
    if (k < n)
        s[k] = '\0';
    return k;
}
