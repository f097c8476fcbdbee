#!/bin/sh
# Builds and runs every test: install dependencies, warnings-as-errors build, the suite,
# the same suite under ASan+UBSan, a short libFuzzer run of each parser, the fixture check.
set -e
cd "$(dirname "$0")/.."
sh tools/install-deps.sh
J=$(nproc 2>/dev/null || echo 2)
make -j"$J" WERROR=1 all tests
make WERROR=1 test
make -j"$J" WERROR=1 asan
if [ -n "$(ls fuzz/*_fuzz.c 2>/dev/null)" ]; then
    make FUZZ_SECONDS="${FUZZ_SECONDS:-20}" fuzz-run
fi
