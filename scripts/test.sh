#!/usr/bin/env bash
# The test suite as CI runs it: every tier but `soak`, the same tests and assertions as
# `.venv/bin/python -m pytest -q -m "not soak"`, in two pytest runs side by side. The `slurm` tier drives
# a real local Slurm and spends most of its wall time waiting on the scheduler and on jobs that run
# outside this process tree; the other tiers compute. Beside them, its waits cost no wall time.
#
#   bash scripts/test.sh [pytest args]   # e.g. -x, --lf, -k resume (given to both runs; for -m, run pytest)
#
# Each run writes a junit XML into .ci/ (or $RLEXP_TEST_JUNIT_DIR); the end prints the slurm run's output,
# then what each tier, file and test cost (scripts/ci_durations.py). Exit status: the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${RLEXP_TEST_JUNIT_DIR:-.ci}
mkdir -p "$OUT"
rm -f "$OUT/junit.xml" "$OUT/junit_slurm.xml"  # a report left by an earlier run is not summed
SLURM_LOG=$(mktemp)

$PY -m pytest -q -m "slurm and not soak" --junitxml="$OUT/junit_slurm.xml" "$@" >"$SLURM_LOG" 2>&1 &
SLURM_PID=$!
# Killed or interrupted: the slurm run is not left behind (its local Slurm is .ci/run's trap's to stop).
trap 'kill "$SLURM_PID" 2>/dev/null; rm -f "$SLURM_LOG"' EXIT

rc=0
$PY -m pytest -q -m "not soak and not slurm" --junitxml="$OUT/junit.xml" "$@" || rc=$?
src=0
wait "$SLURM_PID" || src=$?
echo "--- the slurm tier, run beside the tests above:"
cat "$SLURM_LOG"

# pytest's 5 is "no test selected": one run of the two may select none (-k, --lf); both none is a 5.
if [ "$rc" -eq 5 ] && [ "$src" -ne 5 ]; then rc=0; fi
if [ "$src" -eq 5 ] && [ "$rc" -ne 5 ]; then src=0; fi
reports=()
for x in "$OUT/junit.xml" "$OUT/junit_slurm.xml"; do [ -s "$x" ] && reports+=("$x"); done
[ "${#reports[@]}" -gt 0 ] && $PY scripts/ci_durations.py "${reports[@]}" --top 10
[ "$rc" -ne 0 ] && exit "$rc"
exit "$src"
