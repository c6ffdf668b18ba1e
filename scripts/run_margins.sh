#!/usr/bin/env bash
# The `leasectl run` fencing bench: repeats, RUNS times (default 20), the test that stops a
# supervisor with SIGSTOP for twice the ttl (its watchdog must kill its children before its
# trust deadline, and the peer's children start only after), and the test that kills a
# supervisor with SIGKILL (its children and grandchildren must die at once). Prints, per run,
# the smallest margin between the last line of a child the stop had killed and the first line
# of the next child of its bucket; the smallest margin of any move in the run (the graceful
# moves back after the resume too); how long after the stop the watchdog had killed the
# children; and the time from SIGKILL to the children's death. Then the smallest margin of
# the moves the stops caused. A margin of 0 or less fails the test itself. Needs what
# scripts/test.sh installs (Postgres, python3).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-20}
cargo test -q -p leasectl --test run --test run_faults --no-run >/dev/null 2>&1
margins=()
kills=()
printf '| run | SIGSTOP: margin of the moves the stop caused (s) | SIGSTOP: smallest margin of any move (s) | SIGSTOP: watchdog kill after the stop | SIGKILL: children gone within |\n'
printf '|---|---|---|---|---|\n'
for i in $(seq 1 "$runs"); do
    # A failing test fails the run, with its output (not a silent exit under `set -e`).
    if ! stop=$(cargo test -q -p leasectl --test run_faults a_stopped_supervisor -- --nocapture 2>&1); then
        echo "run $i: the SIGSTOP test failed:" >&2
        tail -40 <<<"$stop" >&2
        exit 1
    fi
    if ! kill=$(cargo test -q -p leasectl --test run a_killed_supervisor -- --nocapture 2>&1); then
        echo "run $i: the SIGKILL test failed:" >&2
        tail -40 <<<"$kill" >&2
        exit 1
    fi
    stopped=$(sed -n 's/.*margin of the moves the stop caused: \([0-9.]*\) s.*/\1/p' <<<"$stop")
    margin=$(sed -n 's/.*smallest margin of any move.*: \([0-9.]*\) s.*/\1/p' <<<"$stop")
    killed=$(sed -n 's/.*the watchdog killed a.s children \(.*\) after the stop.*/\1/p' <<<"$stop")
    gone=$(sed -n 's/.*gone within \(.*\)$/\1/p' <<<"$kill")
    if [ -z "$stopped" ] || [ -z "$margin" ] || [ -z "$gone" ]; then
        echo "run $i failed:" >&2
        echo "$stop" "$kill" | tail -30 >&2
        exit 1
    fi
    margins+=("$stopped")
    kills+=("$gone")
    printf '| %d | %s | %s | %s | %s |\n' "$i" "$stopped" "$margin" "$killed" "$gone"
done
smallest=$(printf '%s\n' "${margins[@]}" | sort -g | head -1)
echo
echo "smallest margin of the moves the stops caused, over $runs runs: $smallest s (must be > 0)"
