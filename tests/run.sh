#!/bin/sh
# Runs every test binary and fuzz-corpus replay of $BUILD from the repository root and
# prints one closing line "N passed, M failed, K skipped" (test cases, from cmocka's summaries).
# A test with nothing to compare reports itself skipped, never passed: a cmocka skip() is counted
# from cmocka's "[  SKIPPED ]" summary, and a whole program that exits 77 (automake's convention,
# TH_EXIT_SKIP in tests/harness/harness.h) counts as one skipped test. AR_REQUIRE_ALL=1 (set by
# .ci/run, where the demo model and fixtures are always present) makes such a program's skip a
# failure; the harness already fails its required in-test skips (th_skip_missing) then, so only
# hardware skips (an ISA this CPU lacks) stay skips in CI.
BUILD=${BUILD:-build}
# the autoreply binary the CLI and HTTP tests drive (the sanitizer build has its own)
export AR_BIN=${AR_BIN:-./bin/autoreply}
export CMOCKA_MESSAGE_OUTPUT=stdout
# The real servers the backend tests talk to (PostgreSQL, Redis, RabbitMQ), started once on free
# loopback ports with their data in a temporary folder, stopped by pid at the end. A test that
# needs one reads its URL from AR_TEST_PG_URL / AR_TEST_REDIS_URL / AR_TEST_AMQP_URL and fails
# when it is missing; AR_TEST_SERVICES=0 starts none (those tests then fail, never pass empty).
if [ "${AR_TEST_SERVICES:-1}" != 0 ] && [ -z "${AR_TEST_SVC_DIR:-}" ]; then
    AR_TEST_SVC_DIR=$(mktemp -d /tmp/autoreply-svc.XXXXXX)
    export AR_TEST_SVC_DIR
    trap 'sh deploy/services.sh stop-all "$AR_TEST_SVC_DIR" >/dev/null 2>&1; rm -rf "$AR_TEST_SVC_DIR"' EXIT
    AR_TEST_PG_URL=$(sh deploy/services.sh start postgres "$AR_TEST_SVC_DIR") || echo "!! PostgreSQL did not start"
    AR_TEST_REDIS_URL=$(sh deploy/services.sh start redis "$AR_TEST_SVC_DIR") || echo "!! Redis did not start"
    AR_TEST_AMQP_URL=$(sh deploy/services.sh start rabbitmq "$AR_TEST_SVC_DIR") || echo "!! RabbitMQ did not start"
    export AR_TEST_PG_URL AR_TEST_REDIS_URL AR_TEST_AMQP_URL
fi
passed=0
failed=0
skipped=0
skipped_names=""
failed_names=""
log=$(mktemp)
for t in $(find "$BUILD/tests" -type f -name '*_test' | sort); do
    echo "== $t"
    if "$t" >"$log" 2>&1; then rc=0; else rc=$?; fi
    cat "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    k=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    [ "$k" -gt 0 ] && skipped_names="$skipped_names $(basename "$t")($k)"
    # cmocka names each failed case ("[  FAILED  ] name", listed again after its summary) and
    # each case that could not run ("[  ERROR   ] name": its group's setup failed)
    for c in $(sed -En 's/^\[  (FAILED  |ERROR   )\] ([^ ]+)$/\2/p' "$log" | sort -u); do
        failed_names="$failed_names $t:$c"
    done
    if [ "$rc" -eq 77 ] && [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
        if [ "${AR_REQUIRE_ALL:-0}" != 0 ]; then
            echo "!! $t skipped itself, and AR_REQUIRE_ALL=1 requires it to run"
            f=1
            failed_names="$failed_names $t(skipped)"
        else
            echo "-- $t skipped"
            k=$((k + 1))
            skipped_names="$skipped_names $(basename "$t")"
        fi
    elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "!! $t exited with status $rc"
        f=1
        failed_names="$failed_names $t(status-$rc)"
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + k))
done
for r in $(find "$BUILD/fuzz" -type f -name '*_replay' 2>/dev/null | sort); do
    n=$(basename "$r" _replay)
    echo "== $r fuzz/corpus/$n"
    if "$r" "fuzz/corpus/$n" >"$log" 2>&1; then
        tail -n 1 "$log"
        if grep -q '^replayed 0 inputs' "$log"; then
            echo "-- corpus replay $n had no inputs: skipped"
            skipped=$((skipped + 1))
            skipped_names="$skipped_names $n"
        else
            passed=$((passed + 1))
        fi
    else
        cat "$log"
        echo "!! corpus replay $n failed"
        failed=$((failed + 1))
        failed_names="$failed_names $r"
    fi
done
rm -f "$log"
[ "$skipped" -gt 0 ] && echo "skipped:$skipped_names"
[ -n "$failed_names" ] && echo "failed:$failed_names"
echo "$passed passed, $failed failed, $skipped skipped"
echo "$passed $failed $skipped" >"$BUILD/test-summary"
# the names again for tools/test-all.sh, which repeats them beside its closing total
echo "$failed_names" >"$BUILD/test-failures"
[ "$failed" -eq 0 ]
