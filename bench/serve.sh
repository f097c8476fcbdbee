#!/bin/sh
# serve.sh - the serving benchmark: builds bin/autoreply and build/bench/serve, makes the
# random-weight Qwen2.5-0.5B-shape Q8_0 model if it is missing (with gen-model's synthetic
# vocabulary: the server needs one; prompts are token ids),
# then runs the benchmark with its defaults (levels 1,4,16,64, 30 s each, 2 threads; about
# 3-4 minutes on 2 cores). Extra arguments go to the benchmark: bench/serve.sh --json
# AR_BENCH_DIR (default /tmp/autoreply-bench) holds the model.
set -eu
cd "$(dirname "$0")/.."
DIR=${AR_BENCH_DIR:-/tmp/autoreply-bench}
MODEL=$DIR/qwen05-q8_0.gguf
run() {
    echo "+ $*" >&2
    "$@"
}
run make -j2 bin/autoreply build/bench/serve
mkdir -p "$DIR"
if [ ! -f "$MODEL" ]; then
    run ./bin/autoreply gen-model --arch qwen2 --n-embd 896 --n-layer 24 --n-head 14 \
        --n-head-kv 2 --n-ff 4864 --n-vocab 151936 --type q8_0 -o "$MODEL"
fi
run build/bench/serve -m "$MODEL" "$@"
