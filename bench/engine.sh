#!/bin/sh
# Inference-engine benchmark (issue 2): random-weight models of the Qwen2.5-0.5B shape in Q8_0
# and Q4_K_M, prefill (pp512) and decode (tg128) with 1 and 2 threads, against the memory read
# bandwidth measured in the same run. Prints one JSON object per measurement.
set -e
cd "$(dirname "$0")/.."
DIR=${AR_BENCH_DIR:-/tmp/autoreply-bench}
mkdir -p "$DIR"
make -s -j2 bin/autoreply
for type in q8_0 q4_k_m; do
    m="$DIR/qwen05-$type.gguf"
    if [ ! -f "$m" ]; then
        cmd="./bin/autoreply gen-model --arch qwen2 --n-embd 896 --n-layer 24 --n-head 14 --n-head-kv 2 --n-ff 4864 --n-vocab 151936 --type $type -o $m"
        echo "+ $cmd" >&2
        $cmd
    fi
    echo "+ ./bin/autoreply bench -m $m -t 1,2 -r 3 --json" >&2
    ./bin/autoreply bench -m "$m" -t 1,2 -r 3 --json
done
