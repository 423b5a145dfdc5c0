#!/usr/bin/env bash
# Runs one stage of the test command and prints how long it took.
name=$1
shift
t0=${EPOCHREALTIME/./}
echo "=== stage $name: $*"
"$@"
rc=$?
dt=$(( (${EPOCHREALTIME/./} - t0) / 100000 ))
verdict=ok
[ "$rc" = 0 ] || verdict="FAILED (exit $rc)"
echo "=== stage $name: $verdict in $((dt / 10)).$((dt % 10))s"
exit $rc
