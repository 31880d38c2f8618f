#!/usr/bin/env bash
# The pre-registered sweep of addendum v18 (studies/weaver/preregistration.md; issue 46 item 3): panel A on the
# task with headroom (environment.options.held_out_min=8: sums 2-7, >= 9 held-out prompts each), six arms, seeds
# 0-4, seed-major so a sweep cut short holds whole seeds. The machine is shared: every run is `nice -n 19` inside
# `timeout`, WORKERS runs at a time (default 2) take the next run of the queue, none starts after DEADLINE (epoch
# seconds, default none) or while the file SWEEP_DIR/PAUSE exists (checked between runs), and none runs past END
# (epoch seconds): a run stopped there is moved to SWEEP_DIR/incomplete/ and reported missing, never analysed.
# A finished run is skipped, so the same command resumes. Usage: studies/weaver/weaver_sweep_headroom.sh SWEEP_DIR
# (writes SWEEP_DIR/H; the analysis reads SWEEP_DIR/H).
set -uo pipefail
SWEEP=${1:?usage: studies/weaver/weaver_sweep_headroom.sh SWEEP_DIR}
RLEXP=${RLEXP:-.venv/bin/rlexp}
WORKERS=${WORKERS:-2}
DEADLINE=${DEADLINE:-0}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
END=${END:-0}
TASK="experiment=weaver_cpu +environment.options.held_out_min=8"
mkdir -p "$SWEEP/H"
queue=()
for seed in ${SEEDS:-0 1 2 3 4}; do
  for arm in ${ARMS:-annotated single_rm verifier_mean verifier_vote weaver_paper best_verifier}; do
    queue+=("$arm-$seed")
  done
done
done_already() { [ -f "$SWEEP/H/$1/manifest.json" ] && grep -q '"status": "completed"' "$SWEEP/H/$1/manifest.json"; }
run() {  # arm-seed
  local name=$1 arm=${1%-*} seed=${1##*-} over limit=$RUN_TIMEOUT
  if [ "$END" -gt 0 ] && [ $((END - $(date +%s))) -lt "$limit" ]; then limit=$((END - $(date +%s))); fi
  case $arm in
    single_rm) over="reward=single_rm_debiased" ;;
    best_verifier) over="reward=single_rm_debiased +reward.options.verifier=rm_small" ;;
    *) over="reward=$arm" ;;
  esac
  # shellcheck disable=SC2086
  if ! nice -n 19 timeout "$limit" "$RLEXP" train $TASK $over seed="$seed" hydra.run.dir="$SWEEP/H/$name" \
      > "$SWEEP/H-$name.log" 2>&1; then
    echo "$(date -u +%T) FAILED: $name (see $SWEEP/H-$name.log)"
  else
    echo "$(date -u +%T) $name: $(grep -h 'done:' "$SWEEP/H-$name.log" | tail -1)"
  fi
  if ! done_already "$name" && [ -d "$SWEEP/H/$name" ]; then
    mkdir -p "$SWEEP/incomplete" && mv "$SWEEP/H/$name" "$SWEEP/incomplete/$name.$(date +%s)"
    echo "$(date -u +%T) INCOMPLETE: $name moved to $SWEEP/incomplete/ (missing from the analysis)"
  fi
}
running=0
for name in "${queue[@]}"; do
  done_already "$name" && continue
  # wait for a free worker first, then check the pause file and the deadline: a run never starts after DEADLINE
  if [ "$running" -ge "$WORKERS" ]; then wait -n; running=$((running - 1)); fi
  while [ -e "$SWEEP/PAUSE" ]; do sleep 10; done
  if [ "$DEADLINE" -gt 0 ] && [ "$(date +%s)" -ge "$DEADLINE" ]; then
    echo "$(date -u +%T) DEADLINE: not started: $name and the rest of the queue"; break
  fi
  echo "$(date -u +%T) start $name"
  run "$name" & running=$((running + 1))
done
wait
