"""The tables of docs/multi_token.md from the runs of `studies/multi_token/runs.sh OUT` (the
statistics were fixed in that file before the runs): per task x arm, held-out exact match and
partial credit at step 0 and at the last step, the change, 95% t-intervals over seeds, and the
paired (by seed) difference multi_token - default.

    python studies/multi_token/table.py /tmp/mt/runs --out studies/multi_token/results/multi_token
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlexp.tracking.stats import Estimate, estimate

TASKS = ("sort", "reverse")
ARMS = ("default", "multi_token")
SEEDS = (0, 1, 2)
EVAL = ("eval/accuracy", "eval/partial_credit", "eval/live/accuracy", "eval/live/partial_credit")


def read_run(folder: Path) -> dict[str, Any] | None:
    """One finished run: its eval values at the first and last evaluation, and the drift metrics."""
    if not (folder / "done").exists():
        return None
    (metrics,) = folder.glob("runs/train/*/metrics.jsonl")
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "policy/entropy" in r]
    out: dict[str, Any] = {"run": str(metrics.parent), "last_step": evals[-1]["step"]}
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


def tables(runs: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    out = [
        "| task | arm | seeds done | metric | start | end | change (end - start) |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        for arm in ARMS:
            got = [runs[(task, arm, s)] for s in SEEDS if (task, arm, s) in runs]
            for k in EVAL:
                if arm == "default" and task == "reverse" and "live" in k:
                    continue  # no weight average: live is the product
                start = estimate([r[f"{k}@start"] for r in got])
                end = estimate([r[f"{k}@end"] for r in got])
                change = estimate([r[f"{k}@end"] - r[f"{k}@start"] for r in got])
                cells = [task, arm, str(len(got)), k, cell(start), cell(end), cell(change)]
                out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "| task | metric at the last step | paired seeds | multi_token - default |",
        "|---|---|---|---|",
    ]
    for task in TASKS:
        for k in EVAL[:2]:
            pairs = [
                s
                for s in SEEDS
                if (task, "default", s) in runs and (task, "multi_token", s) in runs
            ]
            d = estimate(
                [
                    runs[(task, "multi_token", s)][f"{k}@end"]
                    - runs[(task, "default", s)][f"{k}@end"]
                    for s in pairs
                ]
            )
            verdict = (
                ""
                if d is None or d.half is None
                else (" (interval excludes 0)" if not d.covers_zero() else " (interval covers 0)")
            )
            out.append(f"| {task} | {k} | {', '.join(map(str, pairs))} | {cell(d)}{verdict} |")
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
