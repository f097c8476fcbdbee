#!/bin/sh
# check-includes.sh - the include graph of src/ against the module map. Fails, naming the file
# and line, when a file of src/<module>/ includes a header of a module that <module> may not use
# (the Makefile's DEPS_<module>, read through `make print-deps`: the one source of truth, which
# also decides what each test links), when an include names no file or is not written in the
# one style (a header of the own module as "header.h", of another module as "module/header.h",
# the public header as "autoreply.h"), and when the table of docs/architecture.md ("Who may
# use whom") says otherwise than the Makefile.
#   sh tools/check-includes.sh [ROOT]      ROOT: the checkout (default: this script's)
# An include resolves as the compiler resolves it: beside the including file first, then
# include/ (autoreply.h, the public header, which every module may use), then src/.
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2
deps=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -s print-deps) || {
    echo "check-includes: 'make print-deps' failed in $root" >&2
    exit 2
}
# every file an include may name, then the map, then the sources
files=$(mktemp) || exit 2
trap 'rm -f "$files"' EXIT
find src include -type f 2>/dev/null | sort >"$files"
sources=$(find src -mindepth 2 -maxdepth 2 -type f \( -name '*.c' -o -name '*.h' \) | sort)
[ -n "$sources" ] || { echo "check-includes: no sources under $root/src" >&2; exit 2; }

printf '%s\n' "$deps" | awk -v FILES="$files" -v DOC="docs/architecture.md" '
function fail(msg) { print msg; bad++ }
# a/b/../c -> a/c
function norm(p,    n, i, k, part, out) {
    n = split(p, part, "/"); k = 0
    for (i = 1; i <= n; i++) {
        if (part[i] == "." || part[i] == "") continue
        if (part[i] == ".." && k > 0 && out[k] != "..") { k--; continue }
        out[++k] = part[i]
    }
    p = ""
    for (i = 1; i <= k; i++) p = p (i > 1 ? "/" : "") out[i]
    return p
}
function sorted_words(s,    n, i, j, w, t, r) {
    n = split(s, w, /[ \t,]+/); r = ""
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (w[j] < w[i]) { t = w[i]; w[i] = w[j]; w[j] = t }
    for (i = 1; i <= n; i++) if (w[i] != "") r = r (r == "" ? "" : " ") w[i]
    return r
}
BEGIN {
    while ((getline line < FILES) > 0) exists[line] = 1
    close(FILES)
}
# make print-deps: "module: dep dep" per folder of src/, "module?" when it has no DEPS line
{
    if ($0 ~ /\?$/) { fail("Makefile: src/" substr($0, 1, length($0) - 1) "/ has no DEPS_" substr($0, 1, length($0) - 1)); next }
    m = $1; sub(/:$/, "", m); known[m] = 1; mods[++n_mods] = m
    list[m] = ""
    for (i = 2; i <= NF; i++) { may[m, $i] = 1; list[m] = list[m] " " $i }
}
END {
    # the includes of every file of src/<module>/
    while (("find src -mindepth 2 -maxdepth 2 -type f \\( -name \"*.c\" -o -name \"*.h\" \\) | sort" | getline f) > 0) {
        split(f, fp, "/"); m = fp[2]; dir = "src/" m; ln = 0
        if (!(m in known)) { fail(f ": src/" m "/ is not a module of the Makefile (MODULES, DEPS_" m ")"); continue }
        while ((getline line < f) > 0) {
            ln++
            if (line !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
            p = line; sub(/^[ \t]*#[ \t]*include[ \t]*"/, "", p); sub(/".*/, "", p)
            if (norm(dir "/" p) in exists) target = norm(dir "/" p)
            else if (norm("include/" p) in exists) target = norm("include/" p)
            else if (norm("src/" p) in exists) target = norm("src/" p)
            else { fail(f ":" ln ": #include \"" p "\" names no file (beside it, in include/ or src/)"); continue }
            if (target ~ /^include\//) {
                if (p != substr(target, 9))
                    fail(f ":" ln ": #include \"" p "\": the public header is written \"" substr(target, 9) "\"")
                continue
            }
            split(target, tp, "/"); t = tp[2]
            if (target !~ /^src\//) continue
            # one style: "header.h" in the own module, "module/header.h" for another
            if (t == m && p != substr(target, length(dir) + 2))
                fail(f ":" ln ": #include \"" p "\": a header of the own module is written \"" substr(target, length(dir) + 2) "\"")
            else if (t != m && p != substr(target, 5))
                fail(f ":" ln ": #include \"" p "\": a header of another module is written \"" substr(target, 5) "\"")
            if (t == m) continue
            if (!((m, t) in may))
                fail(f ":" ln ": #include \"" p "\": " m " may not use " t " (Makefile DEPS_" m " :=" list[m] ")")
        }
        close(f)
    }
    # docs/architecture.md: | `module` | `dep`, `dep` | rows under "## Who may use whom"
    in_table = 0; rows = 0
    while ((getline line < DOC) > 0) {
        if (line ~ /^## /) { in_table = (line ~ /^## Who may use whom/); continue }
        if (!in_table || line !~ /^\| *`[a-z_]+` *\|/) continue
        n = split(line, col, "|")
        dm = col[2]; gsub(/[` ]/, "", dm)
        dl = ""; rest = col[3]   # the `names` of the second column
        while (match(rest, /`[^`]*`/)) { dl = dl " " substr(rest, RSTART + 1, RLENGTH - 2); rest = substr(rest, RSTART + RLENGTH) }
        rows++; doc_has[dm] = 1
        if (!(dm in known)) { fail(DOC ": the table names " dm ", which the Makefile has no DEPS for"); continue }
        if (sorted_words(dl) != sorted_words(list[dm]))
            fail(DOC ": " dm " may use \"" sorted_words(dl) "\" there but \"" sorted_words(list[dm]) "\" in the Makefile (DEPS_" dm ")")
    }
    if (rows == 0) fail(DOC ": no table under \"## Who may use whom\"")
    else for (i = 1; i <= n_mods; i++) if (!(mods[i] in doc_has)) fail(DOC ": no row for " mods[i])
    if (bad) { print "check-includes: " bad " problem(s)"; exit 1 }
    print "check-includes: ok (" n_mods " modules)"
}'
