/* faults.h - allocation-failure injection over one operation: the n-th allocation through
 * ar_malloc (cJSON's too, once ar_json_use_ar_alloc ran) and every one after it fails, for
 * n = 1, 2, ... until the operation succeeds without meeting a failure. Each failed run must
 * end in a clean error (the operation's check says what that is) and leave nothing behind:
 * leaks are caught by LeakSanitizer at exit in the ASan build (make asan), a crash or a
 * sanitizer report fails the program. The hook is process-wide and not thread-safe: only the
 * thread under test may allocate through ar_malloc while a failure is armed. */
#ifndef AR_TEST_FAULTS_H
#define AR_TEST_FAULTS_H

#include "harness.h"

#include "base/base.h"

/* One attempt: arm the failure with ar_alloc_fail_after(n) just around the call under test,
 * disarm with *made = ar_alloc_fail_after(0), then check, unarmed, that an error is clean and
 * that nothing was left half done (fail_msg otherwise). Returns the call's status. */
typedef enum ar_status (*th_fault_op)(void *user, uint64_t n, uint64_t *made);

/* Runs op for n = 1.. until it succeeds having made fewer than n allocations (so none failed;
 * an operation that succeeds despite a failure, by a fallback, is run on). Fails the test
 * after max attempts, or when the operation made no allocation at all (nothing under test).
 * Returns the number of failure points tried. */
static inline uint64_t th_fail_each_alloc(const char *what, th_fault_op op, void *user,
                                          uint64_t max)
{
    uint64_t errors = 0;
    ar_json_use_ar_alloc();
    for (uint64_t n = 1; n <= max; n++) {
        uint64_t made = 0;
        enum ar_status st = op(user, n, &made);
        if (st != AR_OK)
            errors++;
        if (st == AR_OK && made < n) {
            if (n == 1)
                fail_msg("%s: made no allocation, nothing to inject", what);
            print_message("%s: %llu allocation failure points, %llu clean errors, then success "
                          "after %llu allocations\n",
                          what, (unsigned long long)(n - 1), (unsigned long long)errors,
                          (unsigned long long)made);
            return n - 1;
        }
    }
    fail_msg("%s: still failing with the %llu-th allocation failed", what, (unsigned long long)max);
    return 0;
}

#endif
