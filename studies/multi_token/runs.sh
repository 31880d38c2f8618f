#!/usr/bin/env bash
# The runs of docs/multi_token.md: two multi-token tasks (environment=sort, shipped;
# examples/reverse, a user's task outside the package) x {defaults, experiment=multi_token} x
# seeds 0 1 2, one lane per task, in the background at nice 10 (NICE). ARMS=warmup_only: the
# defaults plus the preset's warm-up alone (docs/multi_token.md's addendum). Runs from a snapshot
# of the tree (so later edits do not reach running processes); every run's folder is under
# $OUT/<task>_<arm>_s<seed>/.
#   studies/multi_token/runs.sh /tmp/mt/runs
set -u
OUT=${1:?usage: studies/multi_token/runs.sh OUT_DIR}
STEPS=${STEPS:-30}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SNAP=$OUT/snapshot  # made once: lanes started later share it (and never change code under a run)
# conf/: the one config home beside the package (rlexp.config.paths.config_root)
[ -d "$SNAP/rlexp" ] ||
  { mkdir -p "$SNAP" && cp -r "$ROOT/rlexp" "$ROOT/conf" "$ROOT/examples" "$SNAP/"; }
PY=$ROOT/.venv/bin/python
# Run size, the same for both arms (the 2-core machine is shared): 8 prompts x 8 samples per step.
# EVERY: steps between evaluations (the statistics need only step 0 and the last step).
SIZE="steps=$STEPS algorithm.prompts_per_step=8 algorithm.group_size=8 eval.every_n_steps=${EVERY:-10}"
SEEDS=${SEEDS:-0 1 2}
TASKS=${TASKS:-sort reverse}
ARMS=${ARMS:-default multi_token}

lane() {  # task, then the env args
  local task=$1; shift
  for seed in $SEEDS; do
    for arm in $ARMS; do
      local d=$OUT/${task}_${arm}_s${seed}
      [ -f "$d/done" ] && continue
      mkdir -p "$d"
      local extra=""
      case $arm in
        multi_token) extra="experiment=multi_token" ;;
        warmup_only) extra="model.warmup.steps=30" ;;
      esac
      (cd "$d" && PYTHONPATH=$SNAP nice -n "${NICE:-10}" "$PY" -m rlexp train "$@" $extra seed=$seed $SIZE \
        > "$d/log.txt" 2>&1 && touch "$d/done")
    done
  done
}

for task in $TASKS; do
  case $task in
    sort) lane sort environment=sort & ;;
    reverse) lane reverse config_path="$SNAP/examples/reverse/conf" environment=reverse & ;;
  esac
done
wait
