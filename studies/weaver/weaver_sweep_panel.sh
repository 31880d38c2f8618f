#!/usr/bin/env bash
# The pre-registered Weaver sweep on a further verifier panel (studies/weaver/preregistration.md, addendum): seeds
# 0-4, all seven arms, seed-major. Usage: studies/weaver/weaver_sweep_panel.sh SWEEP_DIR VERIFIER_SET BEST_VERIFIER
# (arithmetic_b -> SWEEP_DIR/B). Each run is its own process and folder; a failed run is reported, the sweep goes on.
set -uo pipefail
SWEEP=${1:?usage: studies/weaver/weaver_sweep_panel.sh SWEEP_DIR VERIFIER_SET BEST_VERIFIER}
SET=${2:?verifier set, e.g. arithmetic_b}
BEST=${3:?the best verifier on the labelled verifier split, e.g. b_rm_wide}
PANEL=$(echo "${SET##*_}" | tr '[:lower:]' '[:upper:]')
RLEXP=${RLEXP:-.venv/bin/rlexp}
mkdir -p "$SWEEP/$PANEL"
run() {  # name, then overrides
  local name=$1; shift
  [ -f "$SWEEP/$PANEL/$name/manifest.json" ] && grep -q '"status": "completed"' "$SWEEP/$PANEL/$name/manifest.json" && return
  if ! "$RLEXP" train experiment=weaver_cpu verifier_set="$SET" "$@" hydra.run.dir="$SWEEP/$PANEL/$name" \
      > "$SWEEP/$PANEL-$name.log" 2>&1; then
    echo "FAILED: $PANEL $name (see $SWEEP/$PANEL-$name.log)"
  fi
  echo "$(date +%T) $PANEL $name: $(grep -h 'done:' "$SWEEP/$PANEL-$name.log" | tail -1)"
}
# SEEDS and ARMS narrow a later extension (e.g. addendum v7: seeds 5-9 of the headline arms); defaults: the addendum.
# EXTRA adds the same overrides to every run of a variant recipe (addendum v10: EXTRA="algorithm=grpo_kl ...").
read -ra extra <<< "${EXTRA:-}"
for seed in ${SEEDS:-0 1 2 3 4}; do
  for arm in ${ARMS:-single_rm verifier_mean verifier_vote weaver_paper annotated weaver best_verifier}; do
    if [ "$arm" = best_verifier ]; then
      run "best_verifier-$seed" reward=single_rm +reward.options.verifier="$BEST" seed=$seed ${extra[@]+"${extra[@]}"}
    else
      run "$arm-$seed" reward=$arm seed=$seed ${extra[@]+"${extra[@]}"}
    fi
  done
done
