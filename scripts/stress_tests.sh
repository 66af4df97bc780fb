#!/usr/bin/env bash
# Runs the built suites (ctest, then pytest) ROUNDS times in a row while BUSY
# busy-loop processes compete for the cores, and stops at the first round
# that fails: timing flakes show up here long before they show up in CI.
#
#   bash scripts/stress_tests.sh [ROUNDS=10] [BUSY=2] [LOG_DIR=/tmp/mc-stress] [PYTEST_ARGS...]
#
# Needs a build (scripts/build.sh). Each round's logs go to LOG_DIR/round-N-*.log;
# the last line is a JSON summary (rounds passed, seconds per round).
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-10}
BUSY=${2:-2}
LOG_DIR=${3:-/tmp/mc-stress}
shift $(($# >= 3 ? 3 : $#))
PY=${PYTHON:-python3}
mkdir -p "$LOG_DIR"

busy_pids=()
stop_busy() {
    for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap stop_busy EXIT
for ((i = 0; i < BUSY; i++)); do
    (while :; do :; done) &
    busy_pids+=($!)
done

passed=0
durations=()
failed_step=""
for ((round = 1; round <= ROUNDS; round++)); do
    t0=$SECONDS
    if ! ctest --test-dir build --no-tests=error -j 2 --timeout 600 \
        > "$LOG_DIR/round-$round-ctest.log" 2>&1; then
        failed_step="ctest"
    elif ! PYTHONPATH=python $PY -m pytest -q -rs tests/python "$@" \
        > "$LOG_DIR/round-$round-pytest.log" 2>&1; then
        failed_step="pytest"
    fi
    durations+=($((SECONDS - t0)))
    if [ -n "$failed_step" ]; then
        echo "round $round: $failed_step FAILED after $((SECONDS - t0)) s (log: $LOG_DIR/round-$round-$failed_step.log)"
        grep -E "^FAILED|Failed|\*\*\*" "$LOG_DIR/round-$round-$failed_step.log" | head -20
        break
    fi
    passed=$round
    echo "round $round: passed in $((SECONDS - t0)) s"
done
printf '{"rounds_asked": %d, "rounds_passed": %d, "busy_loops": %d, "failed_step": "%s", "seconds_per_round": [%s]}\n' \
    "$ROUNDS" "$passed" "$BUSY" "$failed_step" "$(IFS=,; echo "${durations[*]}")"
[ "$passed" -eq "$ROUNDS" ]
