#!/bin/sh
# replay.sh - the review-reply benchmark: builds bin/autoreply and build/bench/replay, then
# replays ../shared/data/reviews-sample.jsonl against `autoreply serve` on the bundled demo
# model (scenario A: cache hits at 2,000 requests/s; scenario B: mean response time with
# reply cache, batching and prefix cache on vs off; about 3 minutes). Extra arguments go to
# the benchmark: bench/replay.sh --scenario a --json
set -eu
cd "$(dirname "$0")/.."
run() {
    echo "+ $*" >&2
    "$@"
}
run make -j2 bin/autoreply build/bench/replay
if [ ! -f ../shared/data/reviews-sample.jsonl ]; then
    echo "replay.sh: ../shared/data/reviews-sample.jsonl is missing" >&2
    exit 1
fi
run build/bench/replay -m models/autoreply-demo-q8_0.gguf "$@"
