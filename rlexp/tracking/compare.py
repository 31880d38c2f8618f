"""`rlexp compare PATH... [--out DIR] [--tracking-uri URI] [--metrics M ...]`

Answers "what differs between these runs, and did it matter?": a table with only the config keys that
differ plus final and best values of the headline metrics (printed as markdown, saved as CSV), and PNG
curves of `reward/mean` and `eval/accuracy` against step and against wall time.

PATH is a run folder, a sweep folder (multirun dir with job subdirs) or any folder holding run folders,
`mlflow:EXPERIMENT` or `wandb:DIR` (see rlexp.tracking.runs). Outputs in --out (default ./compare):
`compare.csv`, `compare.md`, `<metric>_vs_step.png`, `<metric>_vs_wall.png`.

Runs are named by their overrides (`reward=rule,seed=0`) in the table and the legends, whichever source they
come from; two runs of the same name get their source appended. Wall time is the runs' own `time/wall_s`
clock, the same in every source. "best" follows each metric's declared direction (`DIRECTIONS`: max for
accuracy and reward, min for loss, unparseable answers and time; none for a metric not declared). Curves that
coincide with an earlier one are drawn dashed with their own marker and named in the legend and the output.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .runs import RunRecord, load_runs

PLOT_METRICS = ("reward/mean", "eval/accuracy")
DEFAULT_METRICS = ("reward/mean", "eval/accuracy", "loss")
# Which way is better, per metric name, first match wins. Declared, not guessed from the value: a metric
# matching none has no "best" (its column stays empty and the notes say so).
DIRECTIONS: tuple[tuple[str, str], ...] = (
    (r"(^|/)time/|_s$|(^|/)eta", "min"),
    (r"unparseable|truncat|skipped|stale", "min"),
    (r"loss|error|(^|/)kl|perplexity|ppl|regret|logprob_diff|fpr", "min"),
    (r"accuracy|reward|pass@|auc|tpr|correct|selection|gap_closed", "max"),
)
_MISSING = object()
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def direction(metric: str) -> str | None:
    """"max", "min" or None (not declared) for a metric name."""
    for pattern, d in DIRECTIONS:
        if re.search(pattern, metric, re.I):
            return d
    return None


def lower_is_better(metric: str) -> bool:
    return direction(metric) == "min"


def config_diff(runs: Sequence[RunRecord]) -> list[str]:
    """Keys whose values are not identical across all runs (a key missing in some run counts as different)."""
    keys = sorted({k for r in runs for k in r.config})
    diff = []
    for k in keys:
        vals = [json.dumps(r.config.get(k, _MISSING), sort_keys=True, default=repr) for r in runs]
        if len(set(vals)) > 1:
            diff.append(k)
    return diff


def final_and_best(run: RunRecord, metric: str) -> tuple[float | None, float | None]:
    _, ys = run.series(metric)
    ys = [y for y in ys if not math.isnan(y)]
    if not ys:
        return None, None
    d = direction(metric)
    return ys[-1], (min(ys) if d == "min" else max(ys) if d == "max" else None)


def unique_names(runs: Sequence[RunRecord]) -> None:
    """Runs of the same name (two sweeps with the same overrides, one run read from two sources) get their
    source appended, so no legend entry or table row stands for two runs."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.name] = counts.get(r.name, 0) + 1
    for r in runs:
        if counts[r.name] > 1:
            r.name = f"{r.name} [{r.source}]"
    seen: dict[str, int] = {}
    for r in runs:  # the very same source given twice
        seen[r.name] = seen.get(r.name, 0) + 1
        if seen[r.name] > 1:
            r.name = f"{r.name} #{seen[r.name]}"


def identical_curves(runs: Sequence[RunRecord], metric: str, x: str = "step") -> dict[str, str]:
    """{run name: name of an earlier run with exactly the same curve}: they would hide each other in a plot."""
    seen: dict[tuple[tuple[float, ...], tuple[float, ...]], str] = {}
    same: dict[str, str] = {}
    for r in runs:
        xs, ys = r.series(metric, x)
        if not xs:
            continue
        key = (tuple(xs), tuple(ys))
        if key in seen:
            same[r.name] = seen[key]
        else:
            seen[key] = r.name
    return same


def _fmt(v: Any) -> str:
    if v is None or v is _MISSING:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def build_table(runs: Sequence[RunRecord], metrics: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    diff = config_diff(runs)
    header = ["run", "status", *diff]
    for m in metrics:
        header += [f"{m} final", f"{m} best"]
    header += ["steps", "wall_s"]
    rows = []
    for r in runs:
        row = [r.name, r.status or "", *(_fmt(r.config.get(k, _MISSING)) for k in diff)]
        for m in metrics:
            f, b = final_and_best(r, m)
            row += [_fmt(f), _fmt(b)]
        steps = [h["step"] for h in r.history if "step" in h]
        walls = [h["_wall_s"] for h in r.history if "_wall_s" in h]
        row += [str(max(steps)) if steps else "", _fmt(max(walls)) if walls else ""]
        rows.append(row)
    return header, rows


def to_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def plot(runs: Sequence[RunRecord], metric: str, x: str, path: Path) -> bool:
    """One PNG per (metric, x axis); False (no file) when no run has the metric, rather than an empty plot."""
    series = [(r.name, *r.series(metric, x)) for r in runs]
    series = [s for s in series if s[1]]
    if not series:
        return False
    same = identical_curves(runs, metric, x)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        for i, (name, xs, ys) in enumerate(series):
            dup = name in same  # drawn over an identical curve: dashed, its own marker, named in the legend
            ax.plot(xs, ys, marker=_MARKERS[i % len(_MARKERS)], markevery=max(1, len(xs) // 15),
                    markersize=5 if dup else 3, linestyle="--" if dup else "-",
                    label=f"{name} (= {same[name]})" if dup else name)
        ax.set_xlabel("step" if x == "step" else "wall time (s)")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs {'step' if x == 'step' else 'wall time'}")
        ax.grid(alpha=0.3)
        if len(series) <= 12:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return True


def _slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")


def compare(specs: Sequence[str], out: Path, metrics: Sequence[str] | None = None,
            tracking_uri: str | None = None) -> dict[str, Any]:
    """Library entry point (the CLI is a thin wrapper): returns the table and the files written."""
    runs: list[RunRecord] = []
    for s in specs:
        runs.extend(load_runs(s, tracking_uri))
    unique_names(runs)
    if metrics is None:
        present = {m for r in runs for m in r.metric_names()}
        metrics = [m for m in DEFAULT_METRICS if m in present]
        metrics += sorted(m for m in present if m.startswith("eval/") and m not in metrics)
    header, rows = build_table(runs, metrics)
    out.mkdir(parents=True, exist_ok=True)
    notes = ["best: " + "; ".join(f"{m} {direction(m) or 'not declared (no best)'}" for m in metrics)]
    for m in PLOT_METRICS:
        for name, other in identical_curves(runs, m).items():
            notes.append(f"{m}: {name} is identical to {other} (drawn dashed)")
    md = to_markdown(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    (out / "compare.md").write_text(md + "\n", encoding="utf-8")
    with open(out / "compare.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    plots = []
    for m in PLOT_METRICS:
        for x in ("step", "wall"):
            p = out / f"{_slug(m)}_vs_{x}.png"
            if plot(runs, m, x, p):
                plots.append(p)
    return {"runs": runs, "header": header, "rows": rows, "markdown": md, "notes": notes,
            "csv": out / "compare.csv", "plots": plots}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlexp compare", description=__doc__.split("\n\n")[1])
    ap.add_argument("paths", nargs="+", help="run dir | sweep dir | mlflow:EXPERIMENT | wandb:DIR")
    ap.add_argument("--out", type=Path, default=Path("compare"), help="output folder (CSV, markdown, PNGs)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking URI for mlflow:EXPERIMENT")
    ap.add_argument("--metrics", nargs="+", default=None, help="metrics for the table (default: headline ones)")
    args = ap.parse_args(argv)
    try:
        res = compare(args.paths, args.out, args.metrics, args.tracking_uri)
    except ValueError as e:
        print(f"rlexp compare: {e}", file=sys.stderr)
        return 2
    print(res["markdown"])
    print(f"\n{len(res['runs'])} runs; wrote {res['csv']}" + "".join(f", {p}" for p in res["plots"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
