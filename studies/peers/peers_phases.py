"""Seconds per training step in three phases of each peers run
(studies/peers/results/peers_phases.md): why a framework with more
steps per second overall can still reach a threshold later. Reads a finished
`studies/peers/peers.py` sweep folder.

    python studies/peers/peers_phases.py runs/peers/STAMP --out
    studies/peers/results/peers_phases.md

From `runs.json` (every framework): wall seconds per step, evaluation excluded, over steps 1-30,
31-100 and 201 to the end, from the evaluation points every 10 steps. From each rlexp run's
`metrics.jsonl`: the median trainer and generator seconds per step over the same phases, to say
which part changes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

PHASES = ((0, 30), (30, 100), (200, None))


def per_step(curve: list[list[float]], lo: int, hi: int | None) -> float:
    """Seconds per step between the evaluations at steps `lo` and `hi` (the last one when None)."""
    at = {int(p[0]): p[3] for p in curve}
    end = max(at) if hi is None else hi
    return (at[end] - at[lo]) / (end - lo) if lo in at and end in at and end > lo else float("nan")


def rlexp_split(rows: list[dict], lo: int, hi: int | None) -> tuple[float, float]:
    """Median trainer and generator seconds per step over steps (lo, hi] of a run's metrics rows."""
    rows = [r for r in rows if "time/train_step_s" in r and lo < r["step"] <= (hi or 10**9)]
    return (statistics.median(r["time/train_step_s"] for r in rows),
            statistics.median(r["time/generate_s"] for r in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not (args.sweep / "runs.json").is_file():
        ap.error(
            f"{args.sweep} has no runs.json: pass the folder a `studies/peers/peers.py` sweep "
            "wrote (runs/peers/STAMP)"
        )
    runs = json.loads((args.sweep / "runs.json").read_text())
    name = lambda lo, hi: f"steps {lo + 1}-{hi if hi else 'end'}"  # noqa: E731
    lines = ["Produced by `python studies/peers/peers_phases.py " + " ".join(argv or sys.argv[1:])
             + "` from the runs of studies/peers/results/peers.md.", "",
             "Wall seconds per training step, evaluation excluded (rlexp: trainer / "
             "generator medians from its metrics in brackets).", "",
             "| task | framework | seed | " + " | ".join(name(*p) for p in PHASES) + " |",
             "|---|---|---|" + "---|" * len(PHASES)]
    for r in sorted(
        runs, key=lambda r: (r["task"], r["framework"] != "rlexp", r["framework"], r["seed"])
    ):
        metrics = (
            [
                json.loads(x)
                for x in (args.sweep / f"{r['task']}-rlexp-s{r['seed']}" / "metrics.jsonl")
                .read_text()
                .splitlines()
            ]
            if r["framework"] == "rlexp"
            else []
        )
        cells = []
        for lo, hi in PHASES:
            cell = f"{per_step(r['curve'], lo, hi):.3f}"
            if metrics:
                tr, gen = rlexp_split(metrics, lo, hi)
                cell += f" ({tr:.3f} / {gen:.3f})"
            cells.append(cell)
        lines.append(
            f"| {r['task']} | {r['framework']} | {r['seed']} | " + " | ".join(cells) + " |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
