#!/usr/bin/env bash
# The test suite as CI runs it: every tier but `soak`, the same tests and assertions as
# `.venv/bin/python -m pytest -q -m "not soak"`, in three pytest runs side by side, one per tier:
# `e2e` in the foreground, `unit` and `slurm` beside it. Alone, the e2e tier keeps about one of the
# two cores busy (its runs wait on actors, on process start-up and on each other) and the unit tier
# the other; the `slurm` tier drives a real local Slurm and spends most of its wall time waiting on the
# scheduler and on jobs that run outside this process tree. Side by side, the waits cost no wall time.
# The tiers share no fixture (a finished run is made once per tier that reads it) and nothing on disk.
#
#   bash scripts/test.sh [pytest args]   # e.g. -x, --lf, -k resume (given to every run; for -m, run pytest)
#
# Each run writes a junit XML into .ci/ (or $RLEXP_TEST_JUNIT_DIR): junit_e2e.xml, junit_unit.xml,
# junit_slurm.xml; the end prints the output of the runs beside, then what each tier, file and test cost
# (scripts/ci_durations.py). Exit status: the first failure's (e2e, then unit, then slurm).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${RLEXP_TEST_JUNIT_DIR:-.ci}
BESIDE=(unit slurm)
# Side by side, the runs share the two cores: an OpenMP thread that spin-waits for its peers (libgomp's
# default) burns the core another run's process needs, and the e2e runs' torch threads are sized for a quiet
# machine (`cluster.threads_per_proc`). Passive, a waiting thread sleeps: the same numbers, less CPU. Measured
# in results/ci_time.md (test_ema beside a busy core: 59 s -> 48 s; alone 34 s either way).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
mkdir -p "$OUT"
rm -f "$OUT"/junit*.xml  # a report left by an earlier run is not summed
LOGS=$(mktemp -d)
declare -A PIDS
tier() { # $1: tier, then pytest's args. Its own SIGINT handling back (bash ignores SIGINT in a
  # background job), so an interrupt ends each run as Ctrl-C ends pytest: fixtures torn down.
  local t=$1
  shift
  (trap - INT; exec $PY -m pytest -q -m "$t and not soak" --junitxml="$OUT/junit_$t.xml" "$@") &
  PIDS[$t]=$!
}
for t in "${BESIDE[@]}"; do tier "$t" "$@" >"$LOGS/$t" 2>&1; done
tier e2e "$@"
# Interrupted (Ctrl-C, or SIGTERM from a CI timeout): every run is given SIGINT and waited for, and
# one still running 20 s later (started where SIGINT was ignored) SIGTERM, so none is left behind
# (the local Slurm is .ci/run's trap's to stop).
stop() {
  kill -INT "${PIDS[@]}" 2>/dev/null
  for _ in $(seq 1 200); do kill -0 "${PIDS[@]}" 2>/dev/null || break; sleep 0.1; done
  kill -TERM "${PIDS[@]}" 2>/dev/null
  wait
  for t in "${BESIDE[@]}"; do echo "--- the $t tier, interrupted:"; cat "$LOGS/$t"; done
  exit "$1"
}
trap 'stop 130' INT
trap 'stop 143' TERM
trap 'rm -rf "$LOGS"' EXIT

codes=()
for t in e2e "${BESIDE[@]}"; do
  rc=0
  wait "${PIDS[$t]}" || rc=$?
  if [ "$t" != e2e ]; then
    echo "--- the $t tier, run beside the tests above:"
    cat "$LOGS/$t"
  fi
  codes+=("$rc")
done

reports=()
for x in "$OUT"/junit_{e2e,unit,slurm}.xml; do [ -s "$x" ] && reports+=("$x"); done
[ "${#reports[@]}" -gt 0 ] && $PY scripts/ci_durations.py "${reports[@]}" --top 10
# pytest's 5 is "no test selected": some runs may select none (-k, --lf, a file of one tier); all none is a 5.
status=5
for c in "${codes[@]}"; do
  if [ "$c" -ne 0 ] && [ "$c" -ne 5 ]; then exit "$c"; fi
  [ "$c" -eq 0 ] && status=0
done
exit "$status"
