#!/bin/sh
# Builds and runs every test: install dependencies, warnings-as-errors build, the suite,
# the same suite under ASan+UBSan, the threaded tests under TSan, a short libFuzzer run of each parser (which also runs
# the fixture check through tests/cli). Ends with one line: "total: N passed, N failed".
cd "$(dirname "$0")/.." || exit 1
sh tools/install-deps.sh || exit 1
J=$(nproc 2>/dev/null || echo 2)
rc=0
rm -f build/test-summary build-asan/test-summary build-tsan/test-summary
make -j"$J" WERROR=1 all tests || rc=1
[ $rc -eq 0 ] && { make WERROR=1 test || rc=1; }
make -j"$J" WERROR=1 asan || rc=1
make -j"$J" WERROR=1 tsan || rc=1
fuzz_pass=0
fuzz_fail=0
if [ -n "$(ls fuzz/*_fuzz.c 2>/dev/null)" ]; then
    if make FUZZ_SECONDS="${FUZZ_SECONDS:-20}" fuzz-run; then
        fuzz_pass=$(ls fuzz/*_fuzz.c | wc -l)
    else
        fuzz_fail=1
        rc=1
    fi
fi
p=$fuzz_pass
f=$fuzz_fail
for s in build/test-summary build-asan/test-summary build-tsan/test-summary; do
    if [ -f "$s" ]; then
        read sp sf <"$s"
        p=$((p + sp))
        f=$((f + sf))
    else
        f=$((f + 1)) # that suite did not run to the end
    fi
done
echo "total: $p passed, $f failed"
exit $rc
