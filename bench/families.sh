#!/bin/sh
# Model-family benchmark (issue 9): random-weight models of real shapes for each family (a few
# layers where the real model is large), Q8_0 and Q4_K_M, prefill (pp512) and decode (tg128) on
# 1 and 2 threads against the memory read bandwidth measured in the same run, next to the
# Qwen2.5-0.5B-shaped qwen2 model of bench/engine.sh. Prints one JSON object per measurement
# (the first line of each bench: the CPU and kernels).
#   sh bench/families.sh [FAMILY...]      FAMILY: qwen2 qwen3 qwen3moe glm4 chatglm gemma3 phi3
# With OLD_BIN=path/to/older/autoreply it instead runs that binary and this one alternately,
# ROUNDS times (default 5), on the qwen2 model: the fast pass's speed before and after a change.
set -e
cd "$(dirname "$0")/.."
DIR=${AR_BENCH_DIR:-/tmp/autoreply-bench}
BIN=./bin/autoreply
mkdir -p "$DIR"
make -s -j2 bin/autoreply

# name and gen-model flags of each family's model
shape() {
    case $1 in
    qwen2) echo "qwen05 --arch qwen2 --n-embd 896 --n-layer 24 --n-head 14 --n-head-kv 2 --n-ff 4864 --n-vocab 151936" ;;
    qwen3) echo "qwen3-0.6b --arch qwen3 --n-embd 1024 --n-layer 28 --n-head 16 --n-head-kv 8 --head-dim 128 --n-ff 3072 --n-vocab 151936 --n-ctx 40960" ;;
    qwen3moe) echo "qwen3-30b-a3b-4l --arch qwen3moe --n-embd 2048 --n-layer 4 --n-head 32 --n-head-kv 4 --head-dim 128 --n-ff 6144 --n-expert 128 --n-expert-used 8 --n-ff-exp 768 --n-vocab 151936 --n-ctx 40960" ;;
    glm4) echo "glm4-9b-2l --arch glm4 --n-embd 4096 --n-layer 2 --n-head 32 --n-head-kv 2 --n-ff 13696 --n-vocab 151552 --n-ctx 32768" ;;
    chatglm) echo "glm4-9b-chat-2l --arch chatglm --n-embd 4096 --n-layer 2 --n-head 32 --n-head-kv 2 --n-ff 13696 --n-vocab 151552 --n-ctx 131072" ;;
    gemma3) echo "gemma3-1b --arch gemma3 --n-embd 1152 --n-layer 26 --n-head 4 --n-head-kv 1 --head-dim 256 --n-ff 6912 --n-vocab 262144 --swa-window 512 --swa-pattern 6 --rope-scale 1 --n-ctx 32768" ;;
    phi3) echo "phi4-mini-4l --arch phi3 --n-embd 3072 --n-layer 4 --n-head 24 --n-head-kv 8 --n-ff 8192 --n-vocab 200064" ;;
    *) echo "unknown family $1" >&2; exit 2 ;;
    esac
}

# model_path FAMILY TYPE: generates the model once, prints its path
model_path() {
    s=$(shape "$1")
    [ -n "$s" ] || exit 2
    m="$DIR/${s%% *}-$2.gguf"
    if [ ! -f "$m" ]; then
        echo "+ $BIN gen-model ${s#* } --type $2 -o $m" >&2
        $BIN gen-model ${s#* } --type "$2" -o "$m" >&2
    fi
    echo "$m"
}

if [ -n "${OLD_BIN:-}" ]; then
    for type in q8_0 q4_k_m; do
        m=$(model_path qwen2 $type)
        cat "$m" >/dev/null
        for r in $(seq "${ROUNDS:-5}"); do
            for b in "$OLD_BIN" "$BIN"; do
                echo "+ $b bench -m $m -t 1,2 -r 1 --json  # round $r" >&2
                "$b" bench -m "$m" -t 1,2 -r 1 --json | sed "s|^{|{\"bin\":\"$b\",\"round\":$r,|"
            done
        done
    done
    exit 0
fi

families=${*:-"qwen2 qwen3 qwen3moe glm4 chatglm gemma3 phi3"}
for type in q8_0 q4_k_m; do
    for f in $families; do
        m=$(model_path "$f" $type)
        cat "$m" >/dev/null # in the page cache before the first repetition
        echo "+ $BIN bench -m $m -t 1,2 -r 3 --json" >&2
        $BIN bench -m "$m" -t 1,2 -r 3 --json
    done
done
