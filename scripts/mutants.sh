#!/usr/bin/env bash
# The safety-mutant catalogue: each entry of scripts/mutants.txt removes or weakens one rule
# that keeps a bucket to one owner, and names the test command expected to fail because of it.
# For each entry this script applies the edit to a scratch copy of the working tree, runs the
# command there and reports:
#
#   killed          the command failed (the names of the failing tests are shown)
#   survived        the command passed with the rule gone: a hole in the suite
#   not applicable  the entry's text is not in its file exactly once (the catalogue is stale)
#   unbuilt         the mutant did not compile, or the command failed before any test did
#                   (the entry or the scratch build is wrong, not the suite)
#
# It exits 0 only when every selected entry was killed; 1 if one survived; 2 if the catalogue
# is stale or wrong. Not part of CI's time budget: a full run rebuilds the mutated crate and
# its test binary for each entry (about an hour on two cores).
#
# Usage: scripts/mutants.sh [--list] [--check] [--only REGEX] [--no-baseline] [--keep-going]
#   --list         print the entries and stop
#   --check        only check that each entry's text is in its file exactly once (seconds; CI
#                  runs it, so a change that moves a rule moves its entry too)
#   --only REGEX   run only the entries whose rule matches REGEX (grep -E)
#   --no-baseline  skip the check that each command passes on the unmutated tree
#   --table FILE   also write the result table (Markdown) to FILE
# Environment: MUTANTS_DIR (scratch copy and its build, default target/mutants),
# MUTANT_TIMEOUT (seconds per command, default 1200), PROPTEST_CASES (default 1: a kill must
# not depend on a random test's luck).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

catalogue=scripts/mutants.txt
only=""
baseline=1
list=0
check=0
table=""
while [ $# -gt 0 ]; do
    case "$1" in
        --list) list=1 ;;
        --check) check=1 ;;
        --only) only="$2"; shift ;;
        --no-baseline) baseline=0 ;;
        --table) table="$2"; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "mutants.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done

# ---- the catalogue ------------------------------------------------------------------------
# Entries are blocks of `key: value` lines (rule, file, find, replace, test) separated by blank
# lines; `#` starts a comment line. `find` is literal text that must occur exactly once in
# `file`; `replace` may be empty (the text is deleted). In both, `\n` stands for a newline.
rules=() files=() finds=() replaces=() tests=()
flush() {
    if [ -n "$rule$file$find$test" ]; then
        if [ -z "$rule" ] || [ -z "$file" ] || [ -z "$find" ] || [ -z "$test" ]; then
            echo "mutants.txt: an entry near line $lineno lacks rule, file, find or test" >&2
            exit 2
        fi
        if [ -z "$only" ] || grep -qE -- "$only" <<<"$rule"; then
            rules+=("$rule") files+=("$file") finds+=("$find") replaces+=("$replace")
            tests+=("$test")
        fi
    fi
    rule="" file="" find="" replace="" test=""
}
rule="" file="" find="" replace="" test="" lineno=0
while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    case "$line" in
        '#'*) continue ;;
        '') flush; continue ;;
    esac
    key=${line%%:*}
    value=${line#*:}
    value=${value# }
    value=${value#"${value%%[! ]*}"}
    case "$key" in
        rule) rule=$value ;;
        file) file=$value ;;
        find) find=$value ;;
        replace) replace=$value ;;
        test) test=$value ;;
        *) echo "mutants.txt:$lineno: unknown key '$key'" >&2; exit 2 ;;
    esac
done <"$catalogue"
flush

if [ ${#rules[@]} -eq 0 ]; then
    echo "mutants.sh: no entry matches" >&2
    exit 2
fi
if [ "$list" = 1 ]; then
    for i in "${!rules[@]}"; do
        printf '%3d  %s\n     %s\n     %s\n' "$((i + 1))" "${rules[$i]}" "${files[$i]}" "${tests[$i]}"
    done
    exit 0
fi

unescape() { printf '%b' "${1//\\n/\\n}"; }
occurrences() {
    F=$(unescape "$2") perl -0777 -ne 'my $n = () = /\Q$ENV{F}\E/g; print $n' "$1"
}

if [ "$check" = 1 ]; then
    stale=0
    for i in "${!rules[@]}"; do
        n=$(occurrences "${files[$i]}" "${finds[$i]}" 2>/dev/null || echo 0)
        if [ "$n" != 1 ]; then
            echo "stale: ${rules[$i]} (${files[$i]}: its text occurs ${n:-0} times)" >&2
            stale=$((stale + 1))
        fi
    done
    echo "mutants.sh --check: ${#rules[@]} entries, $stale stale"
    [ "$stale" = 0 ] || exit 2
    exit 0
fi

# ---- the scratch copy ---------------------------------------------------------------------
# The working tree's files (tracked, and untracked ones git does not ignore), copied only where
# they differ, so the scratch build stays warm between runs.
scratch=${MUTANTS_DIR:-$root/target/mutants}
src=$scratch/src
mkdir -p "$src"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
    [ -f "$f" ] || continue
    if ! cmp -s "$f" "$src/$f"; then
        mkdir -p "$src/$(dirname "$f")"
        cp -p "$f" "$src/$f"
    fi
done
# Files the working tree no longer has go from the copy too (a test file turned into a
# directory would otherwise leave two targets of one name, and nothing would build).
comm -13 <(git ls-files -co --exclude-standard | sort) <(cd "$src" && find . -type f | sed 's|^\./||' | sort) \
    | while IFS= read -r gone; do rm -f "$src/$gone"; done
export CARGO_TARGET_DIR=$scratch/target
export PROPTEST_CASES=${PROPTEST_CASES:-1}
limit=${MUTANT_TIMEOUT:-1200}
logs=$scratch/logs
mkdir -p "$logs"

apply() {
    F=$(unescape "$2") R=$(unescape "$3") perl -0777 -i -pe 's/\Q$ENV{F}\E/$ENV{R}/' "$1"
}
run() {
    (cd "$src" && timeout "$limit" bash -c "$1") >"$2" 2>&1
}
failing_tests() {
    grep -E '^test .* \.\.\. FAILED$|^    [A-Za-z_:0-9]+$' "$1" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/; s/^ +//' \
        | sort -u | head -n 4 | paste -sd ',' -
}

# ---- baseline: every command passes on the unmutated tree -----------------------------------
if [ "$baseline" = 1 ]; then
    mapfile -t commands < <(printf '%s\n' "${tests[@]}" | sort -u)
    for c in "${commands[@]}"; do
        echo "baseline: $c" >&2
        if ! run "$c" "$logs/baseline.log"; then
            echo "mutants.sh: the command fails without any mutant: $c (see $logs/baseline.log)" >&2
            exit 2
        fi
    done
fi

# ---- each mutant --------------------------------------------------------------------------
killed=0 survived=0 stale=0
rows=()
for i in "${!rules[@]}"; do
    n=$((i + 1))
    f=${files[$i]}
    target=$src/$f
    log=$logs/mutant-$n.log
    start=$(date +%s)
    if [ ! -f "$target" ] || [ "$(occurrences "$target" "${finds[$i]}")" != 1 ]; then
        outcome="not applicable"; by="text not found exactly once"
        stale=$((stale + 1))
    else
        cp -p "$target" "$scratch/original"
        apply "$target" "${finds[$i]}" "${replaces[$i]}"
        echo "[$n/${#rules[@]}] ${rules[$i]}" >&2
        run "${tests[$i]}" "$log"
        status=$?
        if [ "$status" = 0 ]; then
            outcome="survived"; by="-"
            survived=$((survived + 1))
        elif grep -qE '^error\[E[0-9]+\]|could not compile' "$log"; then
            outcome="unbuilt"; by="see $log"
            stale=$((stale + 1))
        elif [ "$status" = 124 ]; then
            outcome="killed"; by="timeout after ${limit}s"
            killed=$((killed + 1))
        elif by=$(failing_tests "$log") && [ -n "$by" ]; then
            outcome="killed"
            killed=$((killed + 1))
        else
            # The command failed before any test did (a manifest or a build script): nothing
            # was judged, so nothing was killed.
            outcome="unbuilt"; by="no test failed; see $log"
            stale=$((stale + 1))
        fi
        # Restore the file (a newer mtime, so the next build sees the change back).
        cp "$scratch/original" "$target"
        touch "$target"
    fi
    secs=$(( $(date +%s) - start ))
    echo "    $outcome ($secs s) ${by}" >&2
    rows+=("| $n | ${rules[$i]} | \`$f\` | $outcome | $by | $secs s |")
done

{
    echo "| # | rule | file | outcome | killed by | time |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "killed $killed, survived $survived, not applicable or unbuilt $stale, of ${#rules[@]}"
} | tee ${table:+"$table"}

if [ "$survived" -gt 0 ]; then exit 1; fi
if [ "$stale" -gt 0 ]; then exit 2; fi
exit 0
