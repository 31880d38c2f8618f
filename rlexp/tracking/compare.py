"""`rlexp compare PATH... [--out DIR] [--tracking-uri URI] [--metrics METRIC[:final|best|auc] ...]`

Answers "which configuration won, and can the seeds tell?" (rlexp.tracking.verdict: configurations,
declared headlines, the ranked table and the winner against the runner-up) and draws it.

PATH is a run folder, a sweep folder (multirun dir with job subdirs) or any folder holding run folders,
`mlflow:EXPERIMENT` or `wandb:DIR` (see rlexp.tracking.runs). Outputs in --out (default ./compare):
`compare.md` (table + winner), `compare.csv` (configurations), `runs.csv` (one row per run),
`<metric>_vs_step.png`, `<metric>_vs_wall.png` (mean per configuration with its band, seeds faint; one
colour per configuration in every figure).

The runs may be someone else's: each damaged row or value is dropped and named (`FILE:LINE: what`, on
stderr and in compare.md's notes; rlexp.tracking.metric_rows), and every name or value written out is made
inert for the program that reads the file (rlexp.tracking.cells: no spreadsheet formula, markdown or HTML).
"""
from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cells import CSV_QUOTING, csv_row, md_text, plot_text
from .manifest import REPRODUCTION_KEY
from .runs import NUISANCE_KEYS, RunRecord, load_runs
from .stats import METHOD, estimate
from .verdict import (
    MIN_PAIRED_SEEDS,
    Configuration,
    Headline,
    answer,
    build_run_table,
    build_table,
    markdown_table,
    unique_names,
)

PLOT_METRICS = ("eval/accuracy", "reward/mean")
UNITS: tuple[tuple[str, str], ...] = (
    (r"accuracy|pass@|correct|unparseable|truncat|fpr|tpr|partial_credit", "fraction of prompts"),
    (r"(^|/)time/|_s$", "s"),
    (r"reward", "reward per sample"),
)
BOUNDS = {"fraction of prompts": (0.0, 1.0)}  # unit -> the range a value of it can take
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
FIGSIZE, DPI = (10.0, 6.0), 120
MAX_SHOWN = 10  # problems printed per run (the rest counted), so a file of bad lines is not a flood


def unit(metric: str) -> str | None:
    for pattern, u in UNITS:
        if re.search(pattern, metric, re.I):
            return u
    return None


def mean_curve(c: Configuration, metric: str, x: str) -> tuple[list[float], list[float], list[float | None]]:
    """Mean over seeds at each step every seed logged, with the t-interval half-width there. On the wall
    axis the x of a step is the seeds' mean wall time at that step."""
    per: list[dict[float, tuple[float, float]]] = []
    for r in c.runs:
        per.append({float(row["step"]): (float(row.get("_wall_s", math.nan)), float(row[metric]))
                    for row in r.history if row.get(metric) is not None and row.get("step") is not None
                    and not math.isnan(float(row[metric]))})
    if not per:
        return [], [], []
    common = sorted(set.intersection(*(set(p) for p in per)))
    xs, ys, halves = [], [], []
    for s in common:
        e = estimate([p[s][1] for p in per])
        xv = s if x == "step" else sum(p[s][0] for p in per) / len(per)
        if e is None or math.isnan(xv):
            continue
        xs.append(xv)
        ys.append(e.mean)
        halves.append(e.half)
    return xs, ys, halves


def band(metric: str, ys: Sequence[float], halves: Sequence[float | None]) -> tuple[list[float], list[float]]:
    """The interval drawn around a mean curve, cut to the values the metric can take: with 2 seeds the
    t-interval of an accuracy easily spans [-1, 2], and a band below 0 or above 1 (all prompts) only hides
    the curves. The table keeps the interval uncut."""
    bounds = BOUNDS.get(unit(metric) or "", (-math.inf, math.inf))
    lo = [max(bounds[0], y - (h or 0.0)) for y, h in zip(ys, halves)]
    hi = [min(bounds[1], y + (h or 0.0)) for y, h in zip(ys, halves)]
    return lo, hi


def axis_label(metric: str) -> str:
    u = unit(metric)
    return f"{metric} ({u})" if u else metric


def plot(configs: Sequence[Configuration], metric: str, x: str, path: Path) -> bool:
    """One PNG per (metric, x axis); False (no file) when no run has the metric, rather than an empty plot."""
    if not any(r.series(metric)[0] for c in configs for r in c.runs):
        return False
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    try:
        seen: dict[tuple[tuple[float, ...], tuple[float, ...]], str] = {}
        for i, c in enumerate(configs):
            for r in c.runs:  # seeds faint, under the mean
                xs, ys = r.series(metric, x)
                if xs:
                    ax.plot(xs, ys, color=c.colour, alpha=0.25, linewidth=0.8)
            xs, ys, halves = mean_curve(c, metric, x)
            if not xs:
                continue
            key = (tuple(xs), tuple(ys))
            dup = seen.get(key)
            seen.setdefault(key, c.label)
            n = len(c.runs)
            label = plot_text(f"{c.label} (n={n})" + (f" = {dup}" if dup else ""))
            ax.plot(xs, ys, color=c.colour, linewidth=2.2, linestyle="--" if dup else "-",
                    marker=_MARKERS[i % len(_MARKERS)], markevery=max(1, len(xs) // 15), markersize=5,
                    label=label)
            if any(h is not None for h in halves):
                lo, hi = band(metric, ys, halves)
                ax.fill_between(xs, lo, hi, color=c.colour, alpha=0.18, linewidth=0)
        ax.set_xlabel("training step (optimizer steps)" if x == "step" else "wall time since run start (s)")
        ax.set_ylabel(axis_label(metric))
        cut = f", cut to [{BOUNDS[u][0]:g}, {BOUNDS[u][1]:g}]" if (u := unit(metric)) in BOUNDS else ""
        ax.set_title(f"{metric}: mean over seeds per configuration, band = {METHOD}{cut} (faint lines: seeds)")
        ax.grid(alpha=0.3)
        if x == "step":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                  title="configuration")
        fig.savefig(path, bbox_inches="tight")
    finally:
        plt.close(fig)
    return True


def _slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")


def problem_lines(runs: Sequence[RunRecord]) -> list[str]:
    """Each run's input problems, the first `MAX_SHOWN` of a run in full and the rest counted."""
    out = []
    for r in runs:
        out += r.problems[:MAX_SHOWN]
        if len(r.problems) > MAX_SHOWN:
            out.append(f"{r.source}: {len(r.problems) - MAX_SHOWN} more problems like these")
    return out


def leave_out_reproductions(spec: str, runs: list[RunRecord]
                            ) -> tuple[list[RunRecord], list[RunRecord]]:
    """(runs kept, reproductions left out). A re-run by `rlexp reproduce` (its manifest records
    `reproduction_of`) found inside a folder would count as one more seed of its configuration, or
    as a second run of the same seed, which stops seeds pairing: it is left out. A reproduction's
    own folder, named as `spec`, is read (the user asked for it)."""
    if len(runs) == 1 and Path(runs[0].source).resolve() == Path(spec).resolve():
        return runs, []
    kept = [r for r in runs if not r.manifest.get(REPRODUCTION_KEY)]
    return kept, [r for r in runs if r.manifest.get(REPRODUCTION_KEY)]


def compare(specs: Sequence[str], out: Path, metrics: Sequence[str] | None = None,
            tracking_uri: str | None = None, report: str = "compare.md") -> dict[str, Any]:
    """Library entry point (the CLI and the multirun summary are thin wrappers): the verdict, tables, files."""
    if metrics:  # a bad spec stops before any run is read
        for m in metrics:
            Headline.parse(m)
    runs: list[RunRecord] = []
    origins: list[int] = []
    reproductions: list[RunRecord] = []
    for i, s in enumerate(specs):
        got, left = leave_out_reproductions(s, load_runs(s, tracking_uri))
        runs.extend(got)
        reproductions += left
        origins += [i] * len(got)
    if not runs:
        raise ValueError(f"{', '.join(specs)}: only reproductions ({len(reproductions)}), which "
                         "compare leaves out of a folder; name a reproduction's own run folder")
    unique_names(runs)
    problems = problem_lines(runs)
    for line in problems:
        print(f"rlexp compare: warning: {line}", file=sys.stderr, flush=True)
    ans = answer(runs, metrics, origins)
    headlines, configs, v = ans.headlines, ans.configurations, ans.verdict
    header, rows = build_table(v.ranked, headlines)
    run_header, run_rows = build_run_table(runs, headlines)
    out.mkdir(parents=True, exist_ok=True)
    notes = [f"{len(runs)} runs in {len(configs)} configurations; runs differing only in "
             f"{', '.join(NUISANCE_KEYS)} are one configuration.",
             f"mean ± half-width of the {METHOD} (n=1: no interval); AUC = area under the curve over steps "
             "divided by the step span.",
             "better: " + "; ".join(f"{h.label} {h.direction or 'not declared (no ranking)'}"
                                    for h in headlines),
             "change from start = the statistic minus the curve's first logged value (for eval/* "
             "the step-0 evaluation); a difference is called distinguishable only over >= "
             f"{MIN_PAIRED_SEEDS} paired seeds."]
    if reproductions:
        notes.append(f"left out {len(reproductions)} reproduction(s) (`rlexp reproduce` re-runs, "
                     f"by their manifest's `{REPRODUCTION_KEY}`), which are not seeds: "
                     + ", ".join(r.source for r in reproductions))
    if problems:
        notes += [f"{len(problems)} input problem(s); the damaged rows or values are left out:", *problems]
    md = (f"**{md_text(v.sentence)}**\n\n" + markdown_table(v.ranked, headlines) + "\n\n"
          + "\n".join(f"- {md_text(n)}" for n in notes))
    (out / report).write_text(md + "\n", encoding="utf-8")
    for name, (h, rs) in (("compare.csv", (header, rows)), ("runs.csv", (run_header, run_rows))):
        with open(out / name, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, quoting=CSV_QUOTING)
            w.writerow(csv_row(h))
            w.writerows(csv_row(r) for r in rs)
    plots = []
    for m in PLOT_METRICS:
        for x in ("step", "wall"):
            p = out / f"{_slug(m)}_vs_{x}.png"
            if plot(configs, m, x, p):
                plots.append(p)
    return {"runs": runs, "configurations": v.ranked, "verdict": v, "headlines": headlines, "header": header,
            "rows": rows, "run_header": run_header, "run_rows": run_rows, "markdown": md, "notes": notes,
            "csv": out / "compare.csv", "plots": plots}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlexp compare", description=__doc__.split("\n\n")[1])
    ap.add_argument("paths", nargs="+", help="run dir | sweep dir | mlflow:EXPERIMENT | wandb:DIR")
    ap.add_argument("--out", type=Path, default=Path("compare"), help="output folder (CSV, markdown, PNGs)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking URI for mlflow:EXPERIMENT")
    ap.add_argument("--metrics", nargs="+", default=None,
                    help="headlines METRIC[:final|best|auc[:max|min]], the first ranks (default: eval/accuracy "
                         "final and auc, reward/mean final, time/wall_s final)")
    args = ap.parse_args(argv)
    try:
        res = compare(args.paths, args.out, args.metrics, args.tracking_uri)
    except (ValueError, OSError) as e:  # a bad argument or an unreadable folder: one line
        print(f"rlexp compare: {e}", file=sys.stderr)
        return 2
    print(res["markdown"])
    print(f"\nwrote {res['csv']}, {args.out / 'runs.csv'}" + "".join(f", {p}" for p in res["plots"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
