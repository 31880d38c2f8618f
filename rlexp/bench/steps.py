"""`rlexp bench`'s step rows: the actor graph against the same components in one process
(`--overhead-steps`), and a `sync=async` step against its ideal (`--overlap-steps`)."""
from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rlexp.bench.rows import Row


def _train_rows(overrides: list[str], out: Path) -> list[dict[str, float]]:
    """`rlexp train` in a subprocess, as a user runs it; its step rows from metrics.jsonl."""
    import json

    cmd = [sys.executable, "-m", "rlexp", "train", *overrides, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/step_s" in r]


def _median(rows: list[dict[str, float]], key: str, warmup: int) -> float:
    return statistics.median(r[key] for r in rows if r["step"] > warmup)


def _iqr(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4)
    return f"[{q[0]:.4g}, {q[2]:.4g}]"


def bench_overhead(steps: int, rounds: int, warmup: int, overrides: list[str]) -> list[Row]:
    """Median step time, actor graph vs one process, over `rounds` alternating pairs of runs (so
    drifting load falls on both); the loop's metrics must agree exactly between the two, or the row
    says so."""
    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.run.inprocess import train_inprocess
    from rlexp.run.prepare import prepare
    from rlexp.tracking.reproduce import is_operational_key

    args = ["sync=on_policy", f"steps={steps}", "eval.every_n_steps=0", *overrides]
    graph: list[dict[str, float]] = []
    local: list[dict[str, float]] = []
    same = True
    with tempfile.TemporaryDirectory(prefix="rlexp-overhead-") as tmp:
        for r in range(rounds):
            g = _train_rows(args, Path(tmp) / f"graph{r}")
            one = train_inprocess(prepare(compose_run_config(args)), f"overhead{os.getpid()}-{r}")
            # The one-process rows hold the loop's metrics only; the run's rows add evaluation and
            # service accounting.
            same = same and len(g) == len(one) and all(
                a.get(k) == v for a, b in zip(g,
                      one) for k, v in b.items() if not is_operational_key(k))
            graph += g
            local += one
    rows = []
    for key, what in (("time/step_s", "step"), ("time/train_step_s", "train step"),
                      ("time/score_s", "scoring"),
                      ("time/generate_busy_s",
                       "generation (generator busy)"), ("time/weight_sync_s", "weight sync")):
        gs = [r[key] for r in graph if r["step"] > warmup]
        ls = [r[key] for r in local if r["step"] > warmup]
        same_note = f"; loop metrics identical: {'yes' if same else 'NO'}"
        rows.append(Row(f"overhead: {what}, actor graph ({' '.join(args)})", statistics.median(gs),
                        "s", "same components, one process (rlexp.run.inprocess)",
                        statistics.median(ls),
                        f"IQR {_iqr(gs)} vs {_iqr(ls)}; {rounds} alternating pairs, steps "
                        f"{warmup + 1}-{steps}" + (same_note if key == "time/step_s" else "")))
    return rows


def bench_overlap(steps: int, warmup: int, overrides: list[str]) -> list[Row]:
    """A `sync=async` run's step against its own ideal, and against an on-policy run of the same
    config."""
    args = [f"steps={steps}", "eval.every_n_steps=0", *overrides]
    with tempfile.TemporaryDirectory(prefix="rlexp-overlap-") as tmp:
        on = _train_rows(["sync=on_policy", *args], Path(tmp) / "on")
        asy = _train_rows(["sync=async", *args], Path(tmp) / "async")
    kept = [r for r in asy if r["step"] > warmup]
    ideal = [max(r["time/generate_busy_s"], r["time/serial_s"]) for r in kept]
    eff = [r["perf/overlap_efficiency"] for r in kept]
    return [
        Row(f"overlap: sync=async step ({' '.join(args)})",
            statistics.median(r["time/step_s"] for r in kept), "s",
            "ideal max(generator busy, score+train+sync) of the same steps",
            statistics.median(ideal),
            f"perf/overlap_efficiency median {statistics.median(eff):.3f} IQR {_iqr(eff)}; "
            f"generator busy {_median(asy, 'time/generate_busy_s', warmup):.4g} s, "
            f"rest {_median(asy, 'time/serial_s', warmup):.4g} s; steps {warmup + 1}-{steps}"),
        Row("overlap: sync=async step", statistics.median(r["time/step_s"] for r in kept), "s",
            "sync=on_policy step, same config, run just before", _median(on, "time/step_s", warmup),
            "on-policy perf/overlap_efficiency median "
            f"{_median(on, 'perf/overlap_efficiency', warmup):.3f} "
            "(the most an overlap could gain, inverted)"),
    ]
