/* cmd_generate.c - `autoreply generate`: one prompt (text, chat message or token ids) through
 * the model, the generated text streamed to stdout as it is produced; logs go to stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
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
    bool chat = false, ids_mode = false, ignore_eos = false, seed_set = false, kv_f32 = false;
    int64_t n_predict = 128, n_threads = 2, n_ctx = 0, top_k, seed = 0, last_n;
    double temp, top_p, min_p, rep;
    struct sampler_params sp = sampler_default_params();
    struct cli_runner *r = NULL;
    struct tokenizer *tok = NULL;
    struct sampler *smp = NULL;
    struct ar_err err = {0};
    int32_t *ids = NULL, stop_ids[MAX_STOP_IDS];
    int n_ids = 0, n_stop = 0, rc = 1;
    char *formatted = NULL;
    struct tokenizer_stream ts;
    bool stream_init = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(path = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--system")) {
            if (!(system = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64(a, v, 1, 1 << 20, &n_predict))
                return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64(a, v, 1, 256, &n_threads))
                return 2;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64(a, v, 16, 1 << 20, &n_ctx))
                return 2;
        } else if (!strcmp(a, "--temp")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_f64(a, v, 0, 100, &temp))
                return 2;
            sp.temperature = (float)temp;
        } else if (!strcmp(a, "--top-k")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64(a, v, 0, 1 << 24, &top_k))
                return 2;
            sp.top_k = (int32_t)top_k;
        } else if (!strcmp(a, "--top-p")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_f64(a, v, 0, 1, &top_p))
                return 2;
            sp.top_p = (float)top_p;
        } else if (!strcmp(a, "--min-p")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_f64(a, v, 0, 1, &min_p))
                return 2;
            sp.min_p = (float)min_p;
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_f64(a, v, 0.01, 100, &rep))
                return 2;
            sp.repeat_penalty = (float)rep;
        } else if (!strcmp(a, "--repeat-last-n")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64(a, v, 0, 1 << 20, &last_n))
                return 2;
            sp.repeat_last_n = (int32_t)last_n;
        } else if (!strcmp(a, "--seed") || !strcmp(a, "-s")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_i64(a, v, 0, INT64_MAX, &seed))
                return 2;
            seed_set = true;
        } else if (!strcmp(a, "--chat")) {
            chat = true;
        } else if (!strcmp(a, "--ids")) {
            ids_mode = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (!strcmp(a, "--kv-f32")) {
            kv_f32 = true;
        } else if (!strcmp(a, "--tokenizer-pre")) {
            if (!(to.pre = cli_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: autoreply generate -m MODEL -p PROMPT [-n N] [--temp T] [--seed S] "
                   "[-t N]\n"
                   "       [--chat] [--system TEXT] [--ids] [--top-k K] [--top-p P] [--min-p P]\n"
                   "       [--repeat-penalty R] [--repeat-last-n N] [-c CTX] [--ignore-eos] "
                   "[--kv-f32] [--tokenizer-pre NAME]\n"
                   "  --chat   apply the model's chat template to -p as a user message\n"
                   "  --ids    -p is a list of token ids; the output is ids too when the model\n"
                   "           has no vocabulary\n");
            return 0;
        } else {
            cli_error("generate: unknown option '%s'", a);
            return 2;
        }
    }
    if (!path || !prompt) {
        cli_error("generate: -m MODEL and -p PROMPT are required");
        return 2;
    }
    if (chat && ids_mode) {
        cli_error("generate: --chat and --ids cannot be combined");
        return 2;
    }
    sp.seed = seed_set ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    if (cli_runner_open(path, (int)n_threads, kv_f32 ? AR_TYPE_F32 : AR_TYPE_F16, (int)n_ctx, &r,
                        &err) != AR_OK) {
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
