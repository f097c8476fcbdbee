/* cmd_generate.c - `autoreply generate`: one prompt (text, chat message or token ids) through
 * the model, the generated text streamed to stdout as it is produced; logs go to stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/opts.h"
#include "cli.h"
#include "cli_internal.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

#define MAX_STOP_IDS 16

/* "1 2 3" or "1,2,3" -> ids; false on anything else. */
static bool parse_ids(const char *s, int32_t **ids, int *n)
{
    int cap = 16, k = 0;
    int32_t *v = malloc(sizeof(*v) * (size_t)cap);
    while (v && *s) {
        char *end;
        long x;
        while (*s == ' ' || *s == ',' || *s == '\t')
            s++;
        if (!*s)
            break;
        x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX) {
            free(v);
            return false;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, sizeof(*v) * (size_t)(cap *= 2));
            if (!nv) {
                free(v);
                return false;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = end;
    }
    *ids = v;
    *n = k;
    return v && k > 0;
}

int cmd_generate(int argc, char **argv)
{
    const char *path = NULL, *prompt = NULL, *system = NULL;
    struct tokenizer_opts to = {NULL};
    bool chat = false, ids_mode = false, ignore_eos = false, kv_f32 = false;
    int64_t n_predict = 128, seed = -1; /* -1: from the clock */
    int n_threads = 2, n_ctx = 0, first_arg;
    struct sampler_params sp = sampler_default_params();
    double temp = (double)sp.temperature, top_p = (double)sp.top_p, min_p = (double)sp.min_p,
           rep = (double)sp.repeat_penalty;
    int top_k = sp.top_k, last_n = sp.repeat_last_n;
    struct cli_runner *r = NULL;
    struct tokenizer *tok = NULL;
    struct sampler *smp = NULL;
    struct ar_err err = {0};
    int32_t *ids = NULL, stop_ids[MAX_STOP_IDS];
    int n_ids = 0, n_stop = 0, rc = 1;
    char *formatted = NULL;
    struct tokenizer_stream ts;
    bool stream_init = false;
    const struct ar_opt opts[] = {
        {"model", 'm', AR_OPT_STRING, &path, 0, 0, "FILE", "GGUF model (required)", NULL, NULL},
        /* model-loading options (--tokenizer-pre NAME, ...) go here, beside --model */
        {"tokenizer-pre", 0, AR_OPT_STRING, &to.pre, 0, 0, "NAME",
         "pre-tokenizer instead of the model's tokenizer.ggml.pre", NULL, NULL},
        {"prompt", 'p', AR_OPT_STRING, &prompt, 0, 0, "TEXT", "the prompt (required)", NULL, NULL},
        {"system", 0, AR_OPT_STRING, &system, 0, 0, "TEXT", "system message with --chat", NULL,
         NULL},
        {"chat", 0, AR_OPT_SET, &chat, 0, 0, NULL,
         "apply the model's chat template to -p as a user message", NULL, NULL},
        {"ids", 0, AR_OPT_SET, &ids_mode, 0, 0, NULL,
         "-p is a list of token ids; the output is ids too when the model\n"
         "has no vocabulary",
         NULL, NULL},
        {"n-predict", 'n', AR_OPT_I64, &n_predict, 1, 1 << 20, "N", "tokens to generate", NULL,
         NULL},
        {"threads", 't', AR_OPT_INT, &n_threads, 1, 256, "N", "model threads", NULL, NULL},
        {"ctx-size", 'c', AR_OPT_INT, &n_ctx, 16, 1 << 20, "CTX", "context size in tokens",
         "the model's", NULL},
        {"temp", 0, AR_OPT_DOUBLE, &temp, 0, 100, "T", "temperature; 0: greedy", NULL, NULL},
        {"top-k", 0, AR_OPT_INT, &top_k, 0, 1 << 24, "K", "keep the K best tokens; 0: off", NULL,
         NULL},
        {"top-p", 0, AR_OPT_DOUBLE, &top_p, 0, 1, "P", "nucleus sampling; 1: off", NULL, NULL},
        {"min-p", 0, AR_OPT_DOUBLE, &min_p, 0, 1, "P", "drop tokens below P times the best; 0: off",
         NULL, NULL},
        {"repeat-penalty", 0, AR_OPT_DOUBLE, &rep, 0.01, 100, "R", "repetition penalty; 1: off",
         NULL, NULL},
        {"repeat-last-n", 0, AR_OPT_INT, &last_n, 0, 1 << 20, "N",
         "tokens the penalty looks back at", NULL, NULL},
        {"seed", 's', AR_OPT_I64, &seed, 0, 0x1p63, "S", "sampling seed", "from the clock", NULL},
        {"ignore-eos", 0, AR_OPT_SET, &ignore_eos, 0, 0, NULL, "go on past end-of-text", NULL,
         NULL},
        {"kv-f32", 0, AR_OPT_SET, &kv_f32, 0, 0, NULL, "keep the KV cache in F32 rather than F16",
         NULL, NULL},
    };
    const struct ar_opts spec = {.cmd = "generate",
                                 .usage = "generate -m MODEL -p PROMPT [options]",
                                 .opts = opts,
                                 .n_opts = AR_ARRAY_LEN(opts),
                                 .max_args = 0};

    if (!cli_parse_opts(&spec, argc, argv, &first_arg, &rc))
        return rc;
    rc = 1;
    sp.temperature = (float)temp;
    sp.top_k = (int32_t)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.repeat_penalty = (float)rep;
    sp.repeat_last_n = (int32_t)last_n;
    if (!path || !prompt) {
        cli_error("generate: -m MODEL and -p PROMPT are required");
        return 2;
    }
    if (chat && ids_mode) {
        cli_error("generate: --chat and --ids cannot be combined");
        return 2;
    }
    sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    if (cli_runner_open(path, n_threads, kv_f32 ? AR_TYPE_F32 : AR_TYPE_F16, n_ctx, &r, &err) !=
        AR_OK) {
        cli_error("%s: %s", path, err.msg);
        return 1;
    }
    if (tokenizer_load_opts(model_gguf(cli_runner_model(r)), &to, &tok, &err) != AR_OK) {
        if (to.pre) { /* asked for explicitly: its error, not "no vocabulary" */
            cli_error("%s: %s", path, err.msg);
            goto done;
        }
        if (!ids_mode) {
            cli_error("%s: no usable vocabulary (%s); use --ids with token ids", path, err.msg);
            goto done;
        }
        tok = NULL;
    }
    if (ids_mode) {
        if (!parse_ids(prompt, &ids, &n_ids)) {
            cli_error("generate: --ids: '%s' is not a list of token ids", prompt);
            goto done;
        }
        for (int i = 0; i < n_ids; i++) {
            if (ids[i] >= cli_runner_n_vocab(r)) {
                cli_error("generate: token id %d is outside the vocabulary (%d tokens)", ids[i],
                          cli_runner_n_vocab(r));
                goto done;
            }
        }
    } else {
        const char *text = prompt;
        size_t text_len = strlen(prompt);
        int64_t n = 0;
        if (chat) {
            enum tokenizer_chat fam = tokenizer_chat_family(tok);
            struct tokenizer_chat_msg msgs[2];
            size_t nm = 0;
            if (system)
                msgs[nm++] = (struct tokenizer_chat_msg){"system", system};
            msgs[nm++] = (struct tokenizer_chat_msg){"user", prompt};
            if (tokenizer_chat_format(fam, msgs, nm, true, &formatted, &text_len) != AR_OK) {
                cli_error("generate: cannot format the chat prompt");
                goto done;
            }
            text = formatted;
            n_stop = tokenizer_chat_stop_ids(tok, fam, stop_ids, MAX_STOP_IDS);
            if (n_stop > MAX_STOP_IDS)
                n_stop = MAX_STOP_IDS;
        }
        /* chat prompts carry their control tokens as text: parse them; plain prompts get
         * the vocabulary's BOS but spell out special-token text */
        if (tokenizer_encode(tok, text, text_len, !chat || tokenizer_add_bos(tok), chat, &ids,
                             &n) != AR_OK) {
            cli_error("generate: cannot tokenize the prompt");
            goto done;
        }
        n_ids = (int)n;
        if (n_ids == 0) {
            cli_error("generate: the prompt is empty");
            goto done;
        }
    }
    if (n_ids >= cli_runner_n_ctx(r)) {
        cli_error("generate: the prompt has %d tokens; the context holds %d (use -c)", n_ids,
                  cli_runner_n_ctx(r));
        goto done;
    }
    if (sampler_create(&sp, cli_runner_n_vocab(r), &smp) != AR_OK) {
        cli_error("generate: invalid sampling parameters");
        goto done;
    }
    sampler_accept_many(smp, ids, (size_t)n_ids);
    float *logits;
    double t0 = ar_time_s(), t_prompt;
    if (cli_runner_prefill(r, ids, n_ids, false, &logits, &err) != AR_OK) {
        cli_error("generate: %s", err.msg);
        goto done;
    }
    t_prompt = ar_time_s() - t0;
    if (tok) {
        tokenizer_stream_init(&ts, true);
        stream_init = true;
    }
    int n_gen = 0;
    const char *why = "length";
    t0 = ar_time_s();
    for (; n_gen < n_predict; n_gen++) {
        int32_t t;
        bool stop = false;
        if (sampler_sample(smp, logits, &t) != AR_OK) {
            cli_error("generate: sampling failed (non-finite logits)");
            goto done;
        }
        if (tok && !ignore_eos && tokenizer_is_eog(tok, t))
            stop = true;
        for (int k = 0; k < n_stop && !stop; k++)
            stop = !ignore_eos && t == stop_ids[k];
        if (stop) {
            why = "end of turn";
            break;
        }
        sampler_accept(smp, t);
        if (tok) {
            const char *out;
            size_t len;
            if (tokenizer_stream_push(tok, &ts, t, &out, &len) == AR_OK && len)
                fwrite(out, 1, len, stdout);
        } else {
            printf("%s%d", n_gen ? " " : "", t);
        }
        fflush(stdout);
        if (cli_runner_n_past(r) >= cli_runner_n_ctx(r)) {
            n_gen++;
            why = "context full";
            break;
        }
        if (cli_runner_decode(r, t, &logits, &err) != AR_OK) {
            cli_error("generate: %s", err.msg);
            goto done;
        }
    }
    if (stream_init) {
        const char *out;
        size_t len;
        if (tokenizer_stream_flush(&ts, &out, &len) == AR_OK && len)
            fwrite(out, 1, len, stdout);
    }
    putchar('\n');
    fflush(stdout);
    double t_gen = ar_time_s() - t0;
    fprintf(stderr,
            "autoreply: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s "
            "(%.1f tok/s); stopped: %s\n",
            n_ids, t_prompt, n_ids / (t_prompt > 0 ? t_prompt : 1e-9), n_gen, t_gen,
            n_gen / (t_gen > 0 ? t_gen : 1e-9), why);
    rc = 0;
done:
    if (stream_init)
        tokenizer_stream_fini(&ts);
    sampler_destroy(smp);
    tokenizer_destroy(tok);
    ar_free(formatted);
    if (ids_mode)
        free(ids);
    else
        ar_free(ids);
    cli_runner_close(r);
    return rc;
}
