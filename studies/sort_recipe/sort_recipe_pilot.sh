#!/usr/bin/env bash
# Issue 25 item 2, the sort task's learning-rate recipe (studies/sort_recipe/results/sort_recipe_pilot.md): rlexp only, pilot seeds
# 100-104 (a later peers run confirms on seeds 0-4), two recipes. Usage: studies/sort_recipe/sort_recipe_pilot.sh DIR [ROUND: 1, or 2 / 3 / 4 / 5 / 6 / 7 for the addenda]; then
# python studies/sort_recipe/sort_recipe_pilot.py DIR --out studies/sort_recipe/results/sort_recipe_pilot
set -uo pipefail
DIR=${1:?usage: studies/sort_recipe/sort_recipe_pilot.sh DIR}
RLEXP=${RLEXP:-.venv/bin/rlexp}
mkdir -p "$DIR"
run() {  # name, then overrides
  local name=$1; shift
  [ -f "$DIR/$name/manifest.json" ] && grep -q '"status": "completed"' "$DIR/$name/manifest.json" && return
  # Rounds 1-6 ran before the sort task's defaults became round 7's recipe: they pin the defaults they ran under.
  local pinned=(trainer.lr_schedule=constant trainer.warmup_steps=0 trainer.ema_decay=0)
  [ "$ROUND" = 7 ] && pinned=()
  "$RLEXP" train environment=sort steps=400 eval.every_n_steps=10 "${pinned[@]}" "$@" hydra.run.dir="$DIR/$name" \
    > "$DIR/$name.log" 2>&1 || echo "FAILED: $name (see $DIR/$name.log)"
  echo "$(date +%T) $name: $(grep -h 'done:' "$DIR/$name.log" | tail -1)"
}
ROUND=${2:-1}
for seed in 100 101 102 103 104; do
  if [ "$ROUND" = 1 ]; then
    run "cos1e-3-$seed" seed=$seed trainer.lr_schedule=cosine trainer.warmup_steps=10
    run "const1e-3-$seed" seed=$seed
  elif [ "$ROUND" = 2 ]; then  # the addendum's second candidate (studies/sort_recipe/results/sort_recipe_pilot.md)
    run "cos5e-4-$seed" seed=$seed trainer.lr=5e-4 trainer.lr_schedule=cosine trainer.warmup_steps=10
  elif [ "$ROUND" = 3 ]; then  # the third candidate (second addendum)
    run "cos1e-3-nostd-$seed" seed=$seed trainer.lr_schedule=cosine trainer.warmup_steps=10 \
      algorithm.norm_adv_by_std=false
  elif [ "$ROUND" = 4 ]; then  # the fourth round (third addendum): the pad row frozen, against today's defaults
    run "const1e-3-$seed" seed=$seed
    run "const1e-3-padfrozen-$seed" seed=$seed trainer.freeze_pad_row=true
  elif [ "$ROUND" = 7 ]; then  # the confirmation (seventh addendum): the EMA readout through the actor graph
    s=$((seed - 100))  # fresh seeds 0-4
    run "cos1e-3-ema099-$s" seed=$s trainer.lr_schedule=cosine trainer.warmup_steps=10 trainer.ema_decay=0.99
  elif [ "$ROUND" = 6 ]; then  # the sixth round (fifth addendum): 128 prompts a step with less lr or less momentum
    cos=(trainer.lr_schedule=cosine trainer.warmup_steps=10)
    run "cos1e-3-$seed" seed=$seed "${cos[@]}"
    run "cos5e-4-p128-$seed" seed=$seed "${cos[@]}" trainer.lr=5e-4 algorithm.prompts_per_step=128
    run "cos1e-3-b05-p128-$seed" seed=$seed "${cos[@]}" "trainer.betas=[0.5,0.999]" algorithm.prompts_per_step=128
  else  # the fifth round (fourth addendum): two changes on top of the cosine recipe, which runs again beside them
    cos=(trainer.lr_schedule=cosine trainer.warmup_steps=10)
    run "cos1e-3-$seed" seed=$seed "${cos[@]}"
    run "cos1e-3-b05-$seed" seed=$seed "${cos[@]}" "trainer.betas=[0.5,0.999]"
    run "cos1e-3-p128-$seed" seed=$seed "${cos[@]}" algorithm.prompts_per_step=128
  fi
done
