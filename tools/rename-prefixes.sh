#!/bin/sh
# rename-prefixes.sh - one prefix per module (docs/architecture.md, "Names"): renames what still
# carries an old internal prefix (srv_, oai_, codec_, jsonpatch_ in server; rp_ in reply; tok_ in
# tokenizer; cpu_features in base; reply's static engine_* functions), as whole words, over src/,
# tests/, fuzz/ (not its corpora), bench/, examples/, tools/, docs/ and README.md.
# Re-runnable, e.g. after merging branches written before the rename: the names are collected
# from src/ at each run, so names added since are caught; a run with nothing left to rename
# changes nothing. Stops before changing anything when a new name already exists.
#   sh tools/rename-prefixes.sh [-n]     -n: only print the renames
set -eu
cd "$(dirname "$0")/.."
dry=0
[ "${1:-}" = "-n" ] && dry=1
map=$(mktemp)
trap 'rm -f "$map" "$map.sed"' EXIT

# names whose plain renaming would meet a name that exists (struct srv_metrics and the
# function server_metrics, struct rp_claim and store's reply_claim, rp_profile and struct
# reply_profile)
special='srv_metrics server_http_metrics
srv_metrics_of server_http_metrics_of
rp_claim reply_held_claim
rp_profile reply_profile_of'

# folder of src/, old prefix, new prefix: every word of src/<folder>/ starting with the old
# prefix gets the new one instead
while read -r dir old new; do
    grep -rhoE "\\b${old}[A-Za-z0-9_]*[A-Za-z0-9]" "src/$dir" 2>/dev/null | sort -u |
        while read -r name; do
            s=$(printf '%s\n' "$special" | awk -v n="$name" '$1 == n {print $2}')
            echo "$name ${s:-$new${name#"$old"}}"
        done
done >"$map" <<'RULES'
server srv_ server_
server SRV_ SERVER_
server oai_ server_oai_
server OAI_ SERVER_OAI_
server codec_ server_codec_
server CODEC_ SERVER_CODEC_
server jsonpatch_ server_jsonpatch_
server JSONPATCH_ SERVER_JSONPATCH_
reply rp_ reply_
reply RP_ REPLY_
tokenizer tok_ tokenizer_
tokenizer TOK_ TOKENIZER_
RULES
# single names: base's CPU features; server's route tables and console assets (the generated
# file of tools/embed-console.sh included; "nodot": console_assets.h keeps its file name);
# statics of reply named like engine functions
for pair in "cpu_features ar_cpu_features" "cpu_features_get ar_cpu_features_get" \
    "cpu_features_str ar_cpu_features_str" "openai_register server_openai_register" \
    "console_register server_console_register" "console_asset server_console_asset" \
    "console_n_assets server_console_n_assets" "console_assets server_console_assets nodot" \
    "engine_generate generate_on_engine" "engine_gen_destroy destroy_engine_gen"; do
    set -- $pair
    if [ "${3:-}" = nodot ]; then re="\\b$1\\b([^.]|$)"; else re="\\b$1\\b"; fi
    if grep -rqE "$re" src tools/embed-console.sh; then echo "$*" >>"$map"; fi
done

files() {
    grep -rlIw -E "$1" src tests fuzz bench examples tools docs README.md 2>/dev/null |
        grep -v '^fuzz/corpus/' | grep -v '^tools/rename-prefixes.sh$' || true
}

if [ ! -s "$map" ]; then
    echo "rename-prefixes: nothing to rename"
    exit 0
fi
# a new name that exists already in code would merge two things into one
code_files() {
    files "$1" | grep -E '^(src|tests|fuzz|bench|examples)/' || true
}
clash=$(while read -r old new _; do
    if [ -n "$(code_files "$new")" ]; then
        echo "$old -> $new: $new exists ($(code_files "$new" | head -n 3 | tr '\n' ' '))"
    fi
done <"$map")
if [ -n "$clash" ]; then
    echo "rename-prefixes: stopped, nothing changed:" >&2
    echo "$clash" >&2
    exit 1
fi
if [ $dry -eq 1 ]; then
    cat "$map"
    exit 0
fi
# whole words; a "nodot" name only where no "." follows (a file name)
awk '$3 == "nodot" { printf "s/\\<%s\\>\\([^.]\\|$\\)/%s\\1/g\n", $1, $2; next }
     { printf "s/\\<%s\\>/%s/g\n", $1, $2 }' "$map" >"$map.sed"
pattern=$(cut -d' ' -f1 "$map" | paste -sd'|')
changed=$(files "$pattern")
n=0
for f in $changed; do
    sed -i -f "$map.sed" "$f"
    n=$((n + 1))
done
echo "rename-prefixes: $(wc -l <"$map") names renamed in $n files"
# longer names push lines past the column limit: clang-format the lines that differ from HEAD
# in the changed C files (AR_RENAME_NO_FORMAT=1 skips it)
c_files=$(printf '%s\n' $changed | grep -E '\.[ch]$' || true)
if [ "${AR_RENAME_NO_FORMAT:-0}" != 1 ] && [ -n "$c_files" ] &&
    command -v git-clang-format >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
    git clang-format -f -q -- $c_files >/dev/null || echo "rename-prefixes: git clang-format failed" >&2
fi
