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

enum tokenizer_chat tokenizer_chat_detect(const char *tmpl, size_t len, bool *known)
{
    enum tokenizer_chat fam = TOKENIZER_CHAT_CHATML;
    bool ok = true;
    if (!tmpl || len == 0)
        ok = false;
    else if (has(tmpl, len, "<|im_start|>"))
        fam = TOKENIZER_CHAT_CHATML;
    else if (has(tmpl, len, "<|start_header_id|>"))
        fam = TOKENIZER_CHAT_LLAMA3;
    else if (has(tmpl, len, "[INST]"))
        fam = has(tmpl, len, "<<SYS>>") ? TOKENIZER_CHAT_LLAMA2 : TOKENIZER_CHAT_MISTRAL;
    else if (has(tmpl, len, "[gMASK]") ||
             (has(tmpl, len, "<|user|>") && !has(tmpl, len, "<|end|>"))) /* not Phi-3 */
        fam = TOKENIZER_CHAT_GLM4;
    else
        ok = false;
    if (known)
        *known = ok;
    return fam;
}

const char *tokenizer_chat_name(enum tokenizer_chat fam)
{
    switch (fam) {
    case TOKENIZER_CHAT_CHATML: return "chatml";
    case TOKENIZER_CHAT_LLAMA3: return "llama3";
    case TOKENIZER_CHAT_LLAMA2: return "llama2";
    case TOKENIZER_CHAT_MISTRAL: return "mistral";
    case TOKENIZER_CHAT_GLM4: return "glm4";
    default: return "unknown";
    }
}

/* ---- rendering ------------------------------------------------------------------------------ */

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* content without leading and trailing ASCII whitespace (Llama 3 trims messages) */
static void put_trimmed(struct ar_buf *b, const char *s)
{
    size_t n = strlen(s), a = 0;
    while (a < n && is_space(s[a]))
        a++;
    while (n > a && is_space(s[n - 1]))
        n--;
    ar_buf_put(b, s + a, n - a);
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
        for (size_t i = 0; i < n; i++) {
            ar_buf_puts(&b, "<|im_start|>");
            ar_buf_puts(&b, msgs[i].role);
            ar_buf_puts(&b, "\n");
            ar_buf_puts(&b, msgs[i].content);
            ar_buf_puts(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt)
            ar_buf_puts(&b, "<|im_start|>assistant\n");
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
        for (size_t i = 0; i < n; i++) {
            ar_buf_puts(&b, "<|");
            ar_buf_puts(&b, msgs[i].role);
            ar_buf_puts(&b, "|>\n");
            ar_buf_puts(&b, msgs[i].content);
        }
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
        *strs = stops_glm4;
        return (int)AR_ARRAY_LEN(stops_glm4);
    case TOKENIZER_CHAT_CHATML:
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
