#!/bin/sh
# Builds and runs every test: install dependencies, warnings-as-errors build, the suite,
# the same suite under ASan+UBSan, the threaded tests under TSan, a short libFuzzer run of each parser (which also runs
# the fixture check through tests/cli). Ends with one line: "total: N passed, M failed, K skipped"
# (a skipped test had nothing to compare; see tests/run.sh), and when anything failed, a line
# "failed: ..." just above it naming each failed case, a suite that did not finish, or fuzz-run.
cd "$(dirname "$0")/.." || exit 1
sh tools/install-deps.sh || exit 1
J=$(nproc 2>/dev/null || echo 2)
rc=0
# One PostgreSQL, Redis and RabbitMQ for every suite (plain, sanitizers, TSan), on free loopback
# ports with their data in a temporary folder, stopped by pid at the end (tests/run.sh starts
# its own when run alone).
AR_TEST_SVC_DIR=$(mktemp -d /tmp/autoreply-svc.XXXXXX)
export AR_TEST_SVC_DIR
trap 'sh deploy/services.sh stop-all "$AR_TEST_SVC_DIR" >/dev/null 2>&1; rm -rf "$AR_TEST_SVC_DIR"' EXIT
for kind in postgres redis rabbitmq; do
    url=$(sh deploy/services.sh start $kind "$AR_TEST_SVC_DIR") || { echo "!! $kind did not start"; rc=1; }
    case $kind in
    postgres) AR_TEST_PG_URL=$url ;;
    redis) AR_TEST_REDIS_URL=$url ;;
    rabbitmq) AR_TEST_AMQP_URL=$url ;;
    esac
done
export AR_TEST_PG_URL AR_TEST_REDIS_URL AR_TEST_AMQP_URL
rm -f build/test-summary build-asan/test-summary build-tsan/test-summary \
    build/test-failures build-asan/test-failures build-tsan/test-failures
make -j"$J" WERROR=1 all tests || rc=1
[ $rc -eq 0 ] && { make WERROR=1 test || rc=1; }
make -j"$J" WERROR=1 asan || rc=1
make -j"$J" WERROR=1 tsan || rc=1
fuzz_pass=0
fuzz_fail=0
failures=""
if [ -n "$(ls fuzz/*_fuzz.c 2>/dev/null)" ]; then
    if make FUZZ_SECONDS="${FUZZ_SECONDS:-20}" fuzz-run; then
        fuzz_pass=$(ls fuzz/*_fuzz.c | wc -l)
    else
        fuzz_fail=1
        failures="$failures fuzz-run"
        rc=1
    fi
fi
p=$fuzz_pass
f=$fuzz_fail
k=0
for s in build/test-summary build-asan/test-summary build-tsan/test-summary; do
    if [ -f "$s" ]; then
        read sp sf sk <"$s"
        p=$((p + sp))
        f=$((f + sf))
        k=$((k + ${sk:-0}))
        [ -s "${s%summary}failures" ] && failures="$failures $(cat "${s%summary}failures")"
    else
        f=$((f + 1)) # that suite did not run to the end
        failures="$failures ${s%/test-summary}(did-not-finish)"
    fi
done
# CI shows only the end of this output: name what failed right above the total
[ -n "$(echo $failures)" ] && echo "failed:" $failures
echo "total: $p passed, $f failed, $k skipped"
exit $rc
