/* jobs_fuzz.c - fuzz target for the JSONL job parser (src/reply/jobs.c): the input is a job
 * body, split and judged both ways job creation does (strict: every line checked as a review;
 * lenient: lines kept for the runner), with and without a default shop. A body is never
 * accepted with more lines than it has newlines + 1, nor with more bad lines than lines; a
 * refusal says why; the two splits agree on the count when both accept. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reply/reply_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    int64_t max_lines = 1, n_strict = -1, n_lenient = -1;
    for (size_t i = 0; i < size; i++)
        max_lines += data[i] == '\n';
    for (int shop = 0; shop < 2; shop++) {
        for (int strict = 1; strict >= 0; strict--) {
            struct ar_err err = {0};
            int64_t n = -1, bad = -1;
            enum ar_status st =
                reply_job_lines_check(body, size, shop ? "shop-1" : NULL, strict, &n, &bad, &err);
            if (st != AR_OK) {
                check(st == AR_ENOMEM || (st == AR_EINVAL && err.msg[0]));
                continue;
            }
            check(n >= 0 && n <= max_lines);
            check(bad >= 0 && bad <= n && (strict || bad == 0));
            if (strict)
                n_strict = n;
            else
                n_lenient = n;
        }
        check(n_strict < 0 || n_lenient < 0 || n_strict == n_lenient);
    }
    return 0;
}
