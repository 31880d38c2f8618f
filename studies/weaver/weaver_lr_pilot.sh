#!/usr/bin/env bash
# The gold-arm learning-rate pilot (studies/weaver/results/weaver_lr_pilot.md): reward=annotated only, pilot seeds 100 and 101 (the
# sweep uses 0-9), five recipes. Usage: studies/weaver/weaver_lr_pilot.sh PILOT_DIR; then studies/weaver/weaver_lr_pilot.py.
set -uo pipefail
PILOT=${1:?usage: studies/weaver/weaver_lr_pilot.sh PILOT_DIR}
RLEXP=${RLEXP:-.venv/bin/rlexp}
mkdir -p "$PILOT"
run() {  # name, then overrides
  local name=$1; shift
  [ -f "$PILOT/$name/manifest.json" ] && grep -q '"status": "completed"' "$PILOT/$name/manifest.json" && return
  "$RLEXP" train experiment=weaver_cpu reward=annotated "$@" hydra.run.dir="$PILOT/$name" > "$PILOT/$name.log" 2>&1 \
    || echo "FAILED: $name (see $PILOT/$name.log)"
  echo "$(date +%T) $name: $(grep -h 'done:' "$PILOT/$name.log" | tail -1)"
}
for seed in 100 101; do
  run "const1e-3-$seed" seed=$seed
  run "const3e-4-$seed" seed=$seed trainer.lr=3e-4
  run "const1e-4-$seed" seed=$seed trainer.lr=1e-4
  run "cos1e-3-$seed" seed=$seed trainer.lr=1e-3 trainer.lr_schedule=cosine trainer.warmup_steps=10
  run "cos3e-4-$seed" seed=$seed trainer.lr=3e-4 trainer.lr_schedule=cosine trainer.warmup_steps=10
done
