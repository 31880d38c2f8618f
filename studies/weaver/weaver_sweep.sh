#!/usr/bin/env bash
# The pre-registered Weaver sweep (studies/weaver/preregistration.md): headline arms seed-major, so that a sweep
# cut short still holds whole seeds; then the secondary arms. Each run is its own process and folder: a failed run
# is reported and the sweep goes on. Usage: studies/weaver/weaver_sweep.sh SWEEP_DIR (the analysis reads SWEEP_DIR/A).
# From addendum v12 on, single_rm and best_verifier carry the per-answer debiasing every other verifier arm has
# (reward=single_rm_debiased); the committed sweeps up to v11 ran reward=single_rm without it (git history).
set -uo pipefail
SWEEP=${1:?usage: studies/weaver/weaver_sweep.sh SWEEP_DIR}
RLEXP=${RLEXP:-.venv/bin/rlexp}
mkdir -p "$SWEEP/A"
run() {  # name, then overrides
  local name=$1; shift
  [ -f "$SWEEP/A/$name/manifest.json" ] && grep -q '"status": "completed"' "$SWEEP/A/$name/manifest.json" && return
  if ! "$RLEXP" train experiment=weaver_cpu "$@" hydra.run.dir="$SWEEP/A/$name" > "$SWEEP/$name.log" 2>&1; then
    echo "FAILED: $name (see $SWEEP/$name.log)"
  fi
  echo "$(date +%T) $name: $(grep -h 'done:' "$SWEEP/$name.log" | tail -1)"
}
for seed in 0 1 2 3 4 5 6 7 8 9; do
  for arm in single_rm verifier_mean verifier_vote weaver_paper annotated; do
    reward=$arm; [ "$arm" = single_rm ] && reward=single_rm_debiased
    run "$arm-$seed" reward=$reward seed=$seed
  done
done
for seed in 0 1 2 3 4; do
  run "best_verifier-$seed" reward=single_rm_debiased +reward.options.verifier=rm_small seed=$seed
  run "weaver-$seed" reward=weaver seed=$seed
done
