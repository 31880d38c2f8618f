"""Aggregate the Weaver replication sweep: per-run held-out accuracy at fixed steps, AUC, summary, gap fraction."""
import csv
import json
import os
import statistics as st
import sys
from itertools import pairwise
from pathlib import Path

import yaml

out_csv = Path(sys.argv[1])
sweeps = [Path(a) for a in sys.argv[2:]]
rows = []
jobs = [p for sw in sweeps
        for p in sorted((p for p in sw.iterdir() if p.is_dir() and (p / "metrics.jsonl").exists()),
                        key=lambda p: int(p.name))]
for job in jobs:
    ov = dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra/overrides.yaml").read_text()))
    acc = {}
    for line in (job / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "eval/accuracy" in d:
            acc[int(d["step"])] = float(d["eval/accuracy"])
    steps = sorted(acc)
    # AUC: trapezoid of accuracy over steps, divided by the step span -> mean accuracy over training (0..1)
    auc = (sum((acc[b] + acc[a]) / 2 * (b - a) for a, b in pairwise(steps)) / (steps[-1] - steps[0])
           if len(steps) > 1 else float("nan"))
    late = [acc[s] for s in steps if s >= 225]
    first90 = next((s for s in steps if acc[s] >= 0.9), None)
    cfg = yaml.safe_load((job / ".hydra/config.yaml").read_text())
    man = json.loads((job / "manifest.json").read_text())
    row = {"job": f"{job.parent.name}/{job.name}", "tie_embeddings": cfg["model"]["arch"]["tie_embeddings"],
           "commit": man["git"]["commit"][:7], "reward": ov["reward"], "seed": int(ov["seed"]),
           **{f"acc@{s}": round(acc[s], 4) for s in steps},
           "auc": round(auc, 4), "late_mean_225_300": round(sum(late) / len(late), 4) if late else float("nan"),
           "final": round(acc[steps[-1]], 4), "first_step_acc>=0.9": first90 if first90 is not None else ""}
    rows.append(row)
keys = list(dict.fromkeys(k for r in rows for k in r))
with out_csv.open("w", newline="") as f:
    f.write(f"# produced by: .venv/bin/python scripts/weaver_table.py {' '.join(sys.argv[1:])} "
            f"(runs: see weaver_replication.md); read with comment=\"#\"\n")
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
if os.environ.get("TIE"):
    rows = [r for r in rows if str(r["tie_embeddings"]).lower() == os.environ["TIE"]]
order = ["single_rm", "weaver", "annotated"]
metrics = [k for k in keys if k.startswith("acc@") and k != "acc@0"] + ["late_mean_225_300", "auc"]
summary = {}
print("| reward | n | " + " | ".join(metrics) + " |")
print("|---|---|" + "---|" * len(metrics))
for r in order:
    sel = [x for x in rows if x["reward"] == r]
    if not sel:
        continue
    summary[r] = {}
    cells = []
    for m in metrics:
        vals = [x[m] for x in sel if m in x and x[m] == x[m]]
        mu = st.mean(vals)
        sd = st.stdev(vals) if len(vals) > 1 else 0.0
        summary[r][m] = mu
        cells.append(f"{mu:.3f} ± {sd:.3f}")
    print(f"| {r} | {len(sel)} | " + " | ".join(cells) + " |")
if all(r in summary for r in order):
    print()
    print("| metric | gap fraction (weaver - single_rm) / (annotated - single_rm) |")
    print("|---|---|")
    for m in metrics:
        g = summary["annotated"][m] - summary["single_rm"][m]
        frac = (summary["weaver"][m] - summary["single_rm"][m]) / g if abs(g) > 1e-9 else float("nan")
        print(f"| {m} | {frac:.2f} (gap {g:+.3f}) |")
print()
print("| job | reward | seed | " + " | ".join(metrics[:-2]) + " | late mean | auc | first step >= 0.9 |")
print("|---|---|---|" + "---|" * (len(metrics) + 1))
for x in rows:
    accs = " | ".join(f"{x.get(m, float('nan')):.3f}" for m in metrics[:-2])
    print(f"| {x['job']} | {x['reward']} | {x['seed']} | {accs} | {x['late_mean_225_300']:.3f} | {x['auc']:.3f} "
          f"| {x['first_step_acc>=0.9']} |")
