#!/bin/sh
# Runs every test binary and fuzz-corpus replay of $BUILD from the repository root and
# prints one closing line "N passed, N failed" (N = test cases, from cmocka's summaries).
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
log=$(mktemp)
for t in $(find "$BUILD/tests" -type f -name '*_test' | sort); do
    echo "== $t"
    if "$t" >"$log" 2>&1; then rc=0; else rc=$?; fi
    cat "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "!! $t exited with status $rc"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
done
for r in $(find "$BUILD/fuzz" -type f -name '*_replay' 2>/dev/null | sort); do
    n=$(basename "$r" _replay)
    echo "== $r fuzz/corpus/$n"
    if "$r" "fuzz/corpus/$n" >"$log" 2>&1; then
        passed=$((passed + 1))
        tail -n 1 "$log"
    else
        cat "$log"
        echo "!! corpus replay $n failed"
        failed=$((failed + 1))
    fi
done
rm -f "$log"
echo "$passed passed, $failed failed"
echo "$passed $failed" >"$BUILD/test-summary"
[ "$failed" -eq 0 ]
