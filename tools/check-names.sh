#!/bin/sh
# check-names.sh - one prefix per module (docs/architecture.md, "Names"): every symbol that a
# module's archive defines with external linkage starts with the module's name and "_" ("ar_"
# for base; api: "ar_", the public API, or "api_"; src/cli, the program: "cli_", "cmd_" or main). Fails naming module and symbol.
#   sh tools/check-names.sh [LIBDIR]     LIBDIR: where libar_<module>.a are (default build/lib)
lib=${1:-build/lib}
set -- "$lib"/libar_*.a
[ -e "$1" ] || { echo "check-names: no libar_*.a in $lib (build first)" >&2; exit 2; }
bad=0
for a in "$@"; do
    m=$(basename "$a" .a)
    m=${m#libar_}
    case $m in
    base) allow='^ar_' ;;
    api) allow='^(ar_|api_)' ;; # the public API (include/autoreply.h) is ar_, its internals api_
    cli) allow='^(cli_|cmd_|main$)' ;;
    *) allow="^${m}_" ;;
    esac
    # names beginning with "__" are the implementation's (sanitizers add __odr_asan.<name>)
    syms=$(nm -g --defined-only "$a" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBRVWGS]$/ {print $3}' |
        grep -v '^__' | grep -Ev "$allow" | sort -u)
    for s in $syms; do
        echo "$m: $s does not start with the module's prefix (${allow#^})"
        bad=$((bad + 1))
    done
done
if [ $bad -ne 0 ]; then
    echo "check-names: $bad name(s)"
    exit 1
fi
echo "check-names: ok ($# archives)"
