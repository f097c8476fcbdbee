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

struct sbuf {
    char *s; /* owned */
    size_t n, cap;
    bool oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *p;
        while (cap < b->n + n + 1)
            cap *= 2;
        p = ar_realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void puts_(struct sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* content without leading and trailing ASCII whitespace (Llama 3 trims messages) */
static void put_trimmed(struct sbuf *b, const char *s)
{
    size_t n = strlen(s), a = 0;
    while (a < n && is_space(s[a]))
        a++;
    while (n > a && is_space(s[n - 1]))
        n--;
    put(b, s + a, n - a);
}

static void render_inst(struct sbuf *b, const struct tokenizer_chat_msg *msgs, size_t n,
                        bool with_sys)
{
    bool inside = true; /* the first "[INST] " opens the first turn */
    puts_(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        if (!inside) {
            puts_(b, "[INST] ");
            inside = true;
        }
        if (strcmp(role, "system") == 0) {
            if (with_sys) {
                puts_(b, "<<SYS>>\n");
                puts_(b, c);
                puts_(b, "\n<</SYS>>\n\n");
            } else { /* no system slot: it leads the first user turn */
                puts_(b, c);
                puts_(b, "\n");
            }
        } else if (strcmp(role, "user") == 0) {
            puts_(b, c);
            puts_(b, " [/INST]");
        } else {
            puts_(b, c);
            puts_(b, "</s>");
            inside = false;
        }
    }
}

enum ar_status tokenizer_chat_format(enum tokenizer_chat fam,
                                     const struct tokenizer_chat_msg *msgs, size_t n,
                                     bool add_generation_prompt, char **out, size_t *len)
{
    struct sbuf b = {NULL, 0, 0, false};
    if (!out || (!msgs && n) || (unsigned)fam >= TOKENIZER_CHAT_COUNT)
        return AR_EINVAL;
    *out = NULL;
    if (len)
        *len = 0;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return AR_EINVAL;
    put(&b, "", 0);

    switch (fam) {
    case TOKENIZER_CHAT_CHATML:
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|im_start|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "\n");
            puts_(&b, msgs[i].content);
            puts_(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt)
            puts_(&b, "<|im_start|>assistant\n");
        break;
    case TOKENIZER_CHAT_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|start_header_id|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content);
            puts_(&b, "<|eot_id|>");
        }
        if (add_generation_prompt)
            puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TOKENIZER_CHAT_LLAMA2:
    case TOKENIZER_CHAT_MISTRAL:
        /* the prompt already ends inside an open turn ("... [/INST]") */
        render_inst(&b, msgs, n, fam == TOKENIZER_CHAT_LLAMA2);
        break;
    case TOKENIZER_CHAT_GLM4:
        puts_(&b, "[gMASK]<sop>");
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|");
            puts_(&b, msgs[i].role);
            puts_(&b, "|>\n");
            puts_(&b, msgs[i].content);
        }
        if (add_generation_prompt)
            puts_(&b, "<|assistant|>\n");
        break;
    default:
        break;
    }
    if (b.oom) {
        ar_free(b.s);
        return AR_ENOMEM;
    }
    *out = b.s;
    if (len)
        *len = b.n;
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
