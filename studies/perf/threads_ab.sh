#!/usr/bin/env bash
# Torch threads per rlexp process (`cluster.threads_per_proc`), A/B on a quiet machine: 1 (the default until unset
# meant derived), 2, and 2 with passive OpenMP waiting, on sort's first steps (every sample distinct: the
# compute-heavy phase, studies/peers/results/peers_phases.md)
# and on the default task. Two alternating repetitions; medians of time/step_s, time/train_step_s and time/generate_s
# over steps 3-30 of both. Usage: OUT=/tmp/thr bash studies/perf/threads_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/thr}
mkdir -p "$OUT"
for rep in 1 2; do for v in t1 t2 t2p; do for env in sort arithmetic; do
  t=${v:1:1}; steps=40; [ "$env" = arithmetic ] && steps=60
  if [ "$v" = t2p ]; then export OMP_WAIT_POLICY=PASSIVE; else unset OMP_WAIT_POLICY; fi
  .venv/bin/rlexp train environment=$env steps=$steps seed=0 eval.every_n_steps=0 cluster.threads_per_proc=$t \
     hydra.run.dir="$OUT/$env-$v-$rep" > "$OUT/$env-$v-$rep.log" 2>&1 || echo "FAILED: $env $v $rep"
done; done; done
OUT="$OUT" .venv/bin/python - <<'PY'
import json, os, statistics as st
out = os.environ["OUT"]
print("| task | threads | step s, median [IQR] | train s | generate s | steps |\n|---|---|---|---|---|---|")
for env in ("sort", "arithmetic"):
    for v, name in (("t1", "1 (default)"), ("t2", "2"), ("t2p", "2, OMP_WAIT_POLICY=PASSIVE")):
        rows = [json.loads(x) for rep in (1, 2) for x in open(f"{out}/{env}-{v}-{rep}/metrics.jsonl")]
        rows = [r for r in rows if "time/step_s" in r and 3 <= r["step"] <= 30]
        def cell(k):
            q1, q2, q3 = st.quantiles([r[k] for r in rows], n=4)
            return f"{q2:.3f} [{q1:.3f}, {q3:.3f}]"
        print(f"| {env} | {name} | {cell('time/step_s')} | {cell('time/train_step_s')} | {cell('time/generate_s')} "
              f"| {len(rows)} |")
PY
