#!/bin/sh
# Model-family benchmark (issue 9): random-weight models of real shapes for each family (a few
# layers where the real model is large), Q8_0 and Q4_K_M, prefill (pp512) and decode (tg128) on
# 1 and 2 threads against the memory read bandwidth measured in the same run, next to the
# Qwen2.5-0.5B-shaped qwen2 model of bench/engine.sh. Prints one JSON object per measurement
# (the first line of each bench: the CPU and kernels).
#   sh bench/families.sh [FAMILY...]      FAMILY: qwen2 qwen3 qwen3moe glm4 chatglm gemma3 phi3
# With ROUNDS=N it runs every model once per round (-r 1), N rounds, so that each family's
# figures and qwen2's come from the same stretches of machine load; then
#   sh bench/families.sh summary FILE
# prints the table of docs/benchmarks.md from that output: medians over the rounds, and each
# family's prefill GFLOP/s and decode efficiency as ratios to the qwen2 row of the same type and
# thread count, taken within each round and then their median.
# With OLD_BIN=path/to/older/autoreply it instead runs that binary and this one alternately,
# ROUNDS times (default 5), on the qwen2 model: the fast pass's speed before and after a change.
set -e
cd "$(dirname "$0")/.."
DIR=${AR_BENCH_DIR:-/tmp/autoreply-bench}
BIN=./bin/autoreply

# summary FILE: medians per (model, type, threads, test) over the rounds, ratios to qwen2
if [ "${1:-}" = summary ]; then
    awk '
    function field(line, k,   m) {
        if (match(line, "\"" k "\":[^,}]*")) {
            m = substr(line, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
            gsub(/"/, "", m)
            return m
        }
        return ""
    }
    function median(key,   n, i, j, t, a) {
        n = cnt[key]
        for (i = 1; i <= n; i++) a[i] = val[key, i]
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
        }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function add(key, v) { cnt[key]++; val[key, cnt[key]] = v }
    /"test":"pp/ {
        k = field($0, "model") SUBSEP field($0, "threads")
        if (!(k in seen)) { seen[k] = 1; order[++n_rows] = k }
        arch[k] = field($0, "arch"); type[k] = field($0, "type")
        mib[k] = field($0, "weight_bytes") / 1048576; mib_all[k] = field($0, "weight_bytes_all") / 1048576
        add(k SUBSEP "pp", field($0, "tokens_per_s")); add(k SUBSEP "gf", field($0, "gflops_per_s"))
        rd = field($0, "round"); gf_r[k, rd] = field($0, "gflops_per_s"); rounds[k, rd] = 1
    }
    /"test":"tg/ {
        k = field($0, "model") SUBSEP field($0, "threads")
        add(k SUBSEP "tg", field($0, "tokens_per_s")); add(k SUBSEP "eff", field($0, "efficiency"))
        add(k SUBSEP "bw", field($0, "bandwidth_gbs"))
        eff_r[k, field($0, "round")] = field($0, "efficiency")
    }
    END {
        # the ratios to qwen2 are taken within each round (the same stretch of machine load),
        # then their median over the rounds
        for (i = 1; i <= n_rows; i++) {
            k = order[i]; split(k, p, SUBSEP)
            if (arch[k] == "qwen2") base[type[k], p[2]] = k
        }
        for (i = 1; i <= n_rows; i++) {
            k = order[i]; split(k, p, SUBSEP)
            b = base[type[k], p[2]]
            if (b == "") continue
            for (kr in rounds) {
                split(kr, q, SUBSEP)
                if (q[1] SUBSEP q[2] != k || !((b, q[3]) in rounds)) continue
                if (gf_r[b, q[3]] > 0) add(k SUBSEP "rgf", gf_r[k, q[3]] / gf_r[b, q[3]])
                if (eff_r[b, q[3]] > 0) add(k SUBSEP "reff", eff_r[k, q[3]] / eff_r[b, q[3]])
            }
        }
        print "| model | type | threads | MiB/token | rounds | pp512 tok/s | prefill GFLOP/s | vs qwen2 | tg tok/s | bandwidth GB/s | decode efficiency | vs qwen2 |"
        print "|---|---|---|---|---|---|---|---|---|---|---|---|"
        for (i = 1; i <= n_rows; i++) {
            k = order[i]; split(k, p, SUBSEP)
            gf = median(k SUBSEP "gf"); eff = median(k SUBSEP "eff")
            m = mib[k] != mib_all[k] ? sprintf("%.0f of %.0f", mib[k], mib_all[k]) : sprintf("%.0f", mib[k])
            rg = cnt[k SUBSEP "rgf"] ? sprintf("%.2f", median(k SUBSEP "rgf")) : "-"
            re = cnt[k SUBSEP "reff"] ? sprintf("%.2f", median(k SUBSEP "reff")) : "-"
            printf("| %s (%s) | %s | %s | %s | %d | %.0f | %.0f | %s | %.1f | %.1f | %.3f | %s |\n",
                p[1], arch[k], type[k], p[2], m, cnt[k SUBSEP "pp"], median(k SUBSEP "pp"), gf,
                rg, median(k SUBSEP "tg"), median(k SUBSEP "bw"), eff, re)
        }
    }' "$2"
    exit 0
fi

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
if [ -n "${ROUNDS:-}" ]; then
    for type in ${TYPES:-q8_0 q4_k_m}; do
        for f in $families; do
            model_path "$f" $type >/dev/null
        done
    done
    for r in $(seq "$ROUNDS"); do
        for type in ${TYPES:-q8_0 q4_k_m}; do
            for f in $families; do
                m=$(model_path "$f" $type)
                cat "$m" >/dev/null
                echo "+ $BIN bench -m $m -t 1,2 -r 1 -n ${N_GEN:-64} --json  # round $r" >&2
                $BIN bench -m "$m" -t 1,2 -r 1 -n "${N_GEN:-64}" --json | sed "s|^{|{\"round\":$r,|"
            done
        done
    done
    exit 0
fi
for type in q8_0 q4_k_m; do
    for f in $families; do
        m=$(model_path "$f" $type)
        cat "$m" >/dev/null # in the page cache before the first repetition
        echo "+ $BIN bench -m $m -t 1,2 -r 3 --json" >&2
        $BIN bench -m "$m" -t 1,2 -r 3 --json
    done
done
