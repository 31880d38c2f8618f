"""The tables of docs/multi_token.md from the runs of `studies/multi_token/runs.sh OUT` (the
statistics were fixed in that file before the runs): per task x arm, held-out exact match and
partial credit at step 0 and at the last step, the change, 95% t-intervals over seeds, and the
paired (by seed) differences between arms: multi_token - default (the recipe as a user names it),
multi_token - warmup_only (its RL settings) and warmup_only - default (its warm-up).

    python studies/multi_token/table.py /tmp/mt/runs --out studies/multi_token/results/multi_token
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlexp.tracking.stats import Estimate, estimate

TASKS = ("sort", "reverse")
ARMS = ("default", "warmup_only", "multi_token")
SEEDS = (0, 1, 2)
EVAL = ("eval/accuracy", "eval/partial_credit", "eval/live/accuracy", "eval/live/partial_credit")
# (a, b): the paired difference a - b, and what it measures (docs/multi_token.md fixed these)
CONTRASTS = (
    ("multi_token", "default", "the recipe"),
    ("multi_token", "warmup_only", "its RL settings"),
    ("warmup_only", "default", "its warm-up"),
)


def read_run(folder: Path) -> dict[str, Any] | None:
    """One finished run: its eval values at the first and last evaluation, and the drift metrics."""
    if not (folder / "done").exists():
        return None
    (metrics,) = folder.glob("runs/train/*/metrics.jsonl")
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "policy/entropy" in r]
    out: dict[str, Any] = {
        "run": str(metrics.parent),
        "last_step": evals[-1]["step"],
        # a weight average: eval/accuracy is its, eval/live/... the live policy's
        "has_live": "eval/live/accuracy" in evals[0],
        "eval/ci_low@end": evals[-1].get("eval/ci_low"),
        "eval/ci_high@end": evals[-1].get("eval/ci_high"),
        "eval/live/ci_low@end": evals[-1].get("eval/live/ci_low"),
        "eval/live/ci_high@end": evals[-1].get("eval/live/ci_high"),
    }
    for k in EVAL:
        # without a weight average the live policy is the product: its value is eval/accuracy's
        key = k if k in evals[0] else k.replace("live/", "")
        out[f"{k}@start"], out[f"{k}@end"] = evals[0][key], evals[-1][key]
    for k in ("policy/entropy", "policy/kl_to_start", "reward/mean"):
        out[f"{k}@first"], out[f"{k}@last"] = steps[0].get(k), steps[-1].get(k)
    return out


def cell(e: Estimate | None) -> str:
    if e is None:
        return "-"
    return f"{e.mean:.3f}" if e.half is None else f"{e.mean:.3f} ± {e.half:.3f}"


def with_interval(r: dict[str, Any], prefix: str) -> str:
    """A run's last exact match with its Wilson interval over the held-out problems."""
    lo, hi = r.get(f"{prefix}/ci_low@end"), r.get(f"{prefix}/ci_high@end")
    ci = "" if lo is None else f" [{lo:.3f}, {hi:.3f}]"
    return f"{r[f'{prefix}/accuracy@end']:.3f}{ci}"


def contrast(
    runs: dict[tuple[str, str, int], dict[str, Any]], task: str, a: str, b: str, key: str
) -> tuple[list[int], Estimate | None]:
    """The paired (by seed) difference a - b in `key` at the last step, over the seeds both arms
    finished: the seeds, and their mean with its 95% t-interval."""
    pairs = [s for s in SEEDS if (task, a, s) in runs and (task, b, s) in runs]
    d = estimate(
        [runs[(task, a, s)][f"{key}@end"] - runs[(task, b, s)][f"{key}@end"] for s in pairs]
    )
    return pairs, d


def tables(runs: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    out = [
        "| task | arm | seeds done | metric | start | end | change (end - start) |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        for arm in ARMS:
            got = [runs[(task, arm, s)] for s in SEEDS if (task, arm, s) in runs]
            if not got:
                continue
            for k in EVAL:
                if "live" in k and not any(r["has_live"] for r in got):
                    continue  # no weight average: live is the product
                start = estimate([r[f"{k}@start"] for r in got])
                end = estimate([r[f"{k}@end"] for r in got])
                change = estimate([r[f"{k}@end"] - r[f"{k}@start"] for r in got])
                cells = [task, arm, str(len(got)), k, cell(start), cell(end), cell(change)]
                out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "| task | metric at the last step | contrast (what it measures) | paired seeds | a - b |",
        "|---|---|---|---|---|",
    ]
    for task in TASKS:
        for a, b, what in CONTRASTS:
            for k in EVAL:
                pairs, d = contrast(runs, task, a, b, k)
                if d is None or ("live" in k and (a, b) != ("multi_token", "warmup_only")):
                    continue  # live: reported for the RL settings only, beside the product
                verdict = ""
                if d.half is not None:
                    verdict = f" (interval {'covers' if d.covers_zero() else 'excludes'} 0)"
                seeds = ", ".join(map(str, pairs))
                name = f"{a} - {b} ({what})"
                out.append(f"| {task} | {k} | {name} | {seeds} | {cell(d)}{verdict} |")
    out += [
        "",
        "| task | arm | policy/entropy step 1 -> last | policy/kl_to_start last "
        "| reward/mean step 1 -> last |",
        "|---|---|---|---|---|",
    ]
    for task in TASKS:
        for arm in ARMS:
            got = [runs[(task, arm, s)] for s in SEEDS if (task, arm, s) in runs]
            if not got:
                continue
            e = {
                k: estimate([r[k] for r in got if r[k] is not None])
                for k in got[0]
                if k.startswith(("policy", "reward"))
            }
            ent = f"{cell(e['policy/entropy@first'])} -> {cell(e['policy/entropy@last'])}"
            rew = f"{cell(e['reward/mean@first'])} -> {cell(e['reward/mean@last'])}"
            out.append(f"| {task} | {arm} | {ent} | {cell(e['policy/kl_to_start@last'])} | {rew} |")
    out += [
        "",
        "| run | last step | at the last step [95% Wilson interval over held-out problems]: "
        "eval/accuracy | eval/live/accuracy |",
        "|---|---|---|---|",
    ]
    for (task, arm, seed), r in sorted(runs.items()):
        acc = [with_interval(r, k) for k in ("eval", "eval/live")]
        if not r["has_live"]:
            acc[1] = "(the product)"
        out.append(f"| {task}_{arm}_s{seed} | {r['last_step']} | {acc[0]} | {acc[1]} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="write OUT.md and OUT.json")
    args = ap.parse_args()
    runs = {}
    for task in TASKS:
        for arm in ARMS:
            for seed in SEEDS:
                r = read_run(args.runs / f"{task}_{arm}_s{seed}")
                if r is not None:
                    runs[(task, arm, seed)] = r
    md = tables(runs)
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(md + "\n")
        args.out.with_suffix(".json").write_text(
            json.dumps(
                {f"{t}_{a}_s{s}": r for (t, a, s), r in runs.items()}, indent=1, sort_keys=True
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
