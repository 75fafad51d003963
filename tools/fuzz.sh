#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME, JOBS targets at a time.
# With JOBS > 1 each target gets one worker (-parallel=1), so that JOBS
# targets share the cores; each target's output goes to its own log, of
# which the last lines are printed when it ends. Exit status 1 if any
# target failed (its crasher is in testdata/fuzz/<target>/). Each new
# interesting input is minimized for at most 5s, not the default minute: a
# target that keeps finding new coverage otherwise spends most of its time
# minimizing, not fuzzing.
#
#   tools/fuzz.sh 10s 1    # what make fuzz runs
#   tools/fuzz.sh 1h 2     # the long run: 9 targets in 5 hours on 2 cores
set -euo pipefail
fuzztime=${1:-10s}
jobs=${2:-1}
go=${GO:-go}
logs=$(mktemp -d)
parallel=""
if [ "$jobs" -gt 1 ]; then
	parallel="-parallel=1"
fi
echo ">> fuzzing each target for $fuzztime, $jobs at a time (logs in $logs)"
for pkg in $($go list ./...); do
	dir=$($go list -f '{{.Dir}}' "$pkg")
	for t in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		echo "$pkg $t"
	done
done | xargs -P "$jobs" -L 1 sh -c '
	log=$1/$3.log pkg=$2 t=$3
	if '"$go"' test -run="^\$" -fuzz="^$t\$" -fuzztime='"$fuzztime"' -fuzzminimizetime=5s '"$parallel"' "$pkg" >"$log" 2>&1; then
		echo ">> $t ($pkg): $(grep "^fuzz: elapsed" "$log" | tail -n 1)"
	else
		echo ">> $t ($pkg) FAILED:"; cat "$log"; exit 1
	fi' _ "$logs" 2>/dev/null || { echo ">> a fuzz target failed"; exit 1; }
