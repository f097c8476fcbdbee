#!/bin/sh
# fleet.sh - the fleet benchmark: builds bin/autoreply and build/bench/fleet, then runs it on
# the bundled demo model (about 2 minutes): deploy/fleet.sh brings up PostgreSQL, Redis,
# RabbitMQ, the instances and nginx, twice (1 instance x 2 threads, then 2 x 1), next to a
# plain `autoreply serve`; everything is stopped at the end, also on failure or Ctrl-C.
# Part 1: what nginx and Redis add to a reply-cache hit; part 2: replies/s on model misses,
# 2 x 1 against 1 x 2; part 3: pgbench / redis-benchmark against the fleet's own servers.
# Extra arguments go to the benchmark: bench/fleet.sh --json
set -eu
cd "$(dirname "$0")/.."
run() {
    echo "+ $*" >&2
    "$@"
}
run make -j2 bin/autoreply build/bench/fleet
if [ ! -f ../shared/data/reviews-sample.jsonl ]; then
    echo "fleet.sh: ../shared/data/reviews-sample.jsonl is missing" >&2
    exit 1
fi
run build/bench/fleet -m models/autoreply-demo-q8_0.gguf "$@"
