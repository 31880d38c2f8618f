"""How the cost of an rlexp GRPO step grows: step time per stage and peak memory against model
width, answer length, group size and prompts per step, one axis at a time from the default run's
config.

    python studies/scaling/scaling.py --out studies/scaling/results/scaling_cpu  # the whole grid
    (~15 min, 2 cores)
    python studies/scaling/scaling.py --out /tmp/s --grid width=128,256 --steps 3 --warmup 1

Every point is a real `rlexp train ... steps=N` subprocess (the actor graph: controller, trainer,
generator, reward processes), so the numbers are the product's own. Per point:

- time: the run's own `time/*` metrics (metrics.jsonl): median over the steps after the first
`--warmup` of
  `time/step_s` and its stages `time/generate_s`, `time/score_s` (rewards + advantages + buffer
  add), `time/train_step_s`, `time/weight_sync_s`; `other` is step minus the four (buffer sample,
  bookkeeping).
- memory: peak resident set size (`VmHWM` in /proc/<pid>/status, which the kernel keeps as the
process's
  high-water mark) of the trainer, generator and controller processes, whose pids the run writes to
  `placement.json`; sampled every 0.2 s while the run lives, the last sample before exit kept. It
  counts shared pages too (torch's libraries, the shm weight files a process has mapped).
- load: the 1-minute load average (os.getloadavg) sampled during the run; other work on the machine
  shares the cores and shows up there.

Axes (everything else is the default run's config): width sets `model.arch.dim` with head_dim 64
kept, so `n_heads = dim/64`, `hidden_dim = 2*dim`, one KV head, 2 layers; answer length sets
`algorithm.max_tokens` with `generator.ignore_eos=true`, so every response is exactly that long
(checked: `response/len_mean` must equal it on every step); group size and prompts per step set
`algorithm.group_size` / `algorithm.prompts_per_step`. The evaluation is cut to one held-out problem
of one token and no final checkpoint is written, so a run's wall time is its steps plus start-up.
Every config is composed and passed through rlexp's own validation before the first run starts.

Fits (chosen before the runs): width, a power law `t = c * dim^k` (least squares on log t against
log dim, R^2 in log space); the other axes, a line `t = a + b*x` (R^2 of the line). Memory: a line
in the axis value, and for width a line in the trainer's parameter count (what `rlexp plan` assumes
grows).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import statistics as st
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

GRID: dict[str, list[int]] = {
    "width": [128, 256, 512, 1024],
    "tokens": [1, 4, 16, 64],
    "group": [4, 8, 16, 32],
    "prompts": [8, 16, 32, 64, 128],
}
LABEL = {
    "width": "model.arch.dim",
    "tokens": "algorithm.max_tokens",
    "group": "algorithm.group_size",
    "prompts": "algorithm.prompts_per_step",
}
# What makes each run cheap to start and stop without touching what a step does.
COMMON = [
    "eval.every_n_steps=0",
    "eval.max_samples=1",
    "eval.max_tokens=1",
    "checkpoint.save_final=false",
]
STAGES = {"generate": "time/generate_s", "score": "time/score_s", "train": "time/train_step_s",
          "sync": "time/weight_sync_s"}
ROLES = ("trainer", "generator0", "controller")
HEAD_DIM = 64
NOTES = [
    "- Fixed on every axis: 2 layers, one KV head, vocabulary 128, fp32, "
    "`cluster.threads_per_proc=1` (one torch thread per trainer and generator process); "
    "trainer, generator, reward and controller share the machine's cores with each other and "
    "with whatever else runs.",
    "- `other` is the step's median minus the sum of the stages' medians: medians do not add, "
    "so it can come out slightly negative.",
    "- Peak RSS includes the ~0.5 GiB every torch + Monarch process holds before it does any "
    "work (libraries); growth, not level, is the model's. A width's first run also builds its "
    "random tiny checkpoint in the controller, which raises that process's peak.",
    "- With one-token answers (the default task) the model runs once per distinct prompt (see "
    "the summary), so the batch axes measure mostly per-sample overhead; multi-token answers "
    "cost per sample.",
]


def axis_overrides(axis: str, value: int) -> list[str]:
    """The overrides that move one axis to `value` (nothing else changes)."""
    if axis == "width":
        if value % HEAD_DIM:
            raise ValueError(f"width {value} must be a multiple of head_dim {HEAD_DIM}")
        return [f"model.arch.dim={value}", f"model.arch.n_heads={value // HEAD_DIM}",
                f"model.arch.hidden_dim={2 * value}", f"model.arch.head_dim={HEAD_DIM}"]
    if axis == "tokens":
        return [f"algorithm.max_tokens={value}"] + (
            ["generator.ignore_eos=true"] if value > 1 else []
        )
    if axis in ("group", "prompts"):
        return [f"{LABEL[axis]}={value}"]
    raise ValueError(f"unknown axis {axis!r}; choose from {sorted(GRID)}")


def default_value(axis: str) -> int:
    """The default run's value on an axis, from the schema (the one home of defaults)."""
    from rlexp.config.schema import TrainConfig

    c = TrainConfig()
    return {
        "width": c.model.arch.dim,
        "tokens": c.algorithm.max_tokens,
        "group": c.algorithm.group_size,
        "prompts": c.algorithm.prompts_per_step,
    }[axis]


def check_configs(points: list[tuple[str, int]], base: list[str], steps: int) -> None:
    """Compose and validate every point's config now, so a bad one stops the sweep before any
    run."""
    from omegaconf import OmegaConf

    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.config.validate import validate

    for axis, value in points:
        cfg = compose_run_config([*COMMON, *base, f"steps={steps}", *axis_overrides(axis, value)])
        validate(OmegaConf.to_object(cfg))


@dataclass
class Row:
    """One point of an axis, over all its replicate runs: medians over every measured step of every
    run."""

    axis: str
    value: int
    overrides: list[str]
    steps_measured: int
    step_s: float
    stages: dict[str, float]  # median seconds per stage
    other_s: float
    len_mean: float
    rss_mib: dict[str, float]  # peak RSS per role, the highest over the replicates
    load_mean: float
    load_max: float
    params_m: float | None
    wall_s: float  # mean wall time of one `rlexp train` process (start-up included)
    run_dirs: list[str]
    # each replicate run's own median step time: the spread between runs
    replicate_step_s: list[float]


def _peak_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Sampler(threading.Thread):
    """Peak RSS of a run's processes and the machine's load, sampled while the run lives."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.proc, self.run_dir, self.interval = proc, run_dir, interval
        self.peak: dict[str, int] = {}
        self.loads: list[float] = []

    def _pids(self) -> dict[str, int]:
        pids = {"controller": self.proc.pid}
        try:
            placement = json.loads((self.run_dir / "placement.json").read_text())
        except (OSError, ValueError):  # not written yet, or half-written
            return pids
        pids.update(
            {role: int(p[0]["pid"]) for role, p in placement.items() if role in ROLES and p}
        )
        return pids

    def run(self) -> None:
        while self.proc.poll() is None:
            for role, pid in self._pids().items():
                kib = _peak_rss_kib(pid)
                if kib is not None:
                    self.peak[role] = max(self.peak.get(role, 0), kib)
            self.loads.append(os.getloadavg()[0])
            time.sleep(self.interval)


SAMPLES = "scaling_samples.json"  # what the sampler saw, beside the run's own metrics.jsonl


def run_point(
    axis: str, value: int, base: list[str], steps: int, run_dir: Path, timeout_s: float = 900
) -> Path:
    """One `rlexp train` subprocess into `run_dir`, with its sampled memory and load written
    there."""
    ovr = [*COMMON, *base, f"steps={steps}", *axis_overrides(axis, value)]
    cmd = [sys.executable, "-m", "rlexp", "train", *ovr, f"hydra.run.dir={run_dir}"]
    # this checkout's rlexp runs
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "offline",
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(proc, run_dir)
    sampler.start()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise RuntimeError(
            f"{axis}={value}: rlexp train ran past {timeout_s}s\n{out[-3000:]}"
        ) from None
    wall = time.perf_counter() - t
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{axis}={value}: rlexp train exited {proc.returncode}\n{out[-4000:]}")
    (run_dir / SAMPLES).write_text(json.dumps({"overrides": ovr, "peak_rss_kib": sampler.peak,
                                               "load_1m": sampler.loads, "wall_s": wall}))
    return run_dir


def row_from_runs(axis: str, value: int, run_dirs: list[Path], warmup: int) -> Row:
    """Medians over the steps after `warmup` of every run; refuses a length point whose answers were
    short."""
    measured, per_run, samples, params = [], [], [], None
    for run_dir in run_dirs:
        rows = [
            json.loads(line)
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        trained = sorted((r for r in rows if "time/train_step_s" in r), key=lambda r: r["step"])
        if len(trained) <= warmup:
            raise RuntimeError(
                f"{run_dir}: {len(trained)} trained steps, none left after warm-up {warmup}"
            )
        if axis == "tokens":  # the answers must really be that long
            short = [r["response/len_mean"] for r in trained if r["response/len_mean"] != value]
            if short:
                raise RuntimeError(
                    f"tokens={value}: response/len_mean {short} != {value} in {run_dir}; "
                    f"responses were cut short"
                )
        measured += trained[warmup:]
        per_run.append(st.median(r["time/step_s"] for r in trained[warmup:]))
        sample = json.loads((run_dir / SAMPLES).read_text())
        missing = [r for r in ROLES if r not in sample["peak_rss_kib"]]
        if missing:
            raise RuntimeError(
                f"{run_dir}: no memory sample for {missing} (placement.json not read in time)"
            )
        samples.append(sample)
        log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
        m = re.search(r"Qwen3 ([0-9.]+)M params", log)
        params = float(m.group(1)) if m else params
    stages = {name: st.median(r[key] for r in measured) for name, key in STAGES.items()}
    step = st.median(r["time/step_s"] for r in measured)
    loads = [x for s in samples for x in s["load_1m"]]
    return Row(
        axis,
        value,
        samples[0]["overrides"],
        len(measured),
        step,
        stages,
        step - sum(stages.values()),
        st.mean(r["response/len_mean"] for r in measured),
        {role: max(s["peak_rss_kib"][role] for s in samples) / 1024 for role in ROLES},
        st.mean(loads) if loads else math.nan,
        max(loads) if loads else math.nan,
        params,
        st.mean(s["wall_s"] for s in samples),
        [str(d) for d in run_dirs],
        per_run,
    )


def sweep(grid: dict[str, list[int]], base: list[str], steps: int, warmup: int, runs_dir: Path,
          repeats: int = 1, log: Any = print) -> list[Row]:
    """Every point of every axis, `repeats` passes over the whole grid (so drifting load spreads
    over all points); the default run's point is run once per pass and shared by every axis."""
    points = [(axis, v) for axis, values in grid.items() for v in values]
    check_configs(points, base, steps)
    defaults = {axis: default_value(axis) for axis in GRID}
    runs: dict[tuple[str, int], list[Path]] = {p: [] for p in points}
    for rep in range(repeats):
        default_dir: Path | None = None
        for axis, value in points:
            is_default = value == defaults[axis]
            if is_default and default_dir is not None:
                runs[(axis, value)].append(default_dir)
                continue
            run_dir = runs_dir / f"rep{rep}" / ("default" if is_default else f"{axis}_{value}")
            run_point(axis, value, base, steps, run_dir)
            default_dir = run_dir if is_default else default_dir
            runs[(axis, value)].append(run_dir)
            r = row_from_runs(axis, value, [run_dir], warmup)
            log(
                f"[pass {rep + 1}/{repeats}] {axis}={value}: step {r.step_s:.3f}s "
                + " ".join(f"{k} {v:.3f}" for k, v in r.stages.items())
                + f" | rss trainer {r.rss_mib['trainer']:.0f} MiB, "
                  f"generator {r.rss_mib['generator0']:.0f} MiB"
                + f" | load {r.load_mean:.2f} | wall {r.wall_s:.0f}s"
            )
    return [row_from_runs(axis, value, runs[(axis, value)], warmup) for axis, value in points]


# ---- fits ----------------------------------------------------------------------------------------


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x: (b, a, R^2). R^2 is 1.0 when the points lie on the line (or y is
    constant)."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError(f"a line needs at least two distinct x values, got {xs}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    return b, a, 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def fit_power(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """y = c x^k by least squares in log-log space: (k, c, R^2 of the log-log line)."""
    if min(xs) <= 0 or min(ys) <= 0:
        raise ValueError("a power law needs positive x and y")
    k, log_c, r2 = fit_line([math.log(x) for x in xs], [math.log(y) for y in ys])
    return k, math.exp(log_c), r2


@dataclass
class Fit:
    axis: str
    quantity: str
    law: str  # "power" or "line"
    slope: float  # k (power) or b (line)
    intercept: float  # c (power) or a (line)
    r2: float
    x: str  # what the law is in
    over: str = "all points"

    def text(self) -> str:
        if self.law == "power":
            return (f"{self.quantity} = {self.intercept:.3g} * {self.x}^{self.slope:.2f} "
                    f"(R^2 {self.r2:.3f})")
        sign = "+" if self.slope >= 0 else "-"
        return (f"{self.quantity} = {self.intercept:.4g} {sign} {abs(self.slope):.4g} * "
                f"{self.x} (R^2 {self.r2:.3f})")


def fits(rows: list[Row]) -> list[Fit]:
    """Per axis: a power law for the step and each stage (the exponent is the growth rate whatever
    the law), and on the non-width axes also a line (its intercept is the cost that does not grow).
    One-token answers take their own code path (the sampling forward is reused by the logprob pass,
    identical rows are deduplicated), so the length axis also gets its line over the points above
    one token."""
    out: list[Fit] = []
    for axis in dict.fromkeys(r.axis for r in rows):
        pts = sorted((r for r in rows if r.axis == axis), key=lambda r: r.value)
        if len(pts) < 2:
            continue
        x = "dim" if axis == "width" else axis
        series = {
            "step_s": [r.step_s for r in pts],
            **{f"{k}_s": [r.stages[k] for r in pts] for k in STAGES},
        }
        for q, ys in series.items():
            xs = [float(r.value) for r in pts]
            k, c, r2 = fit_power(xs, ys)
            out.append(Fit(axis, q, "power", k, c, r2, x))
            if axis != "width":
                b, a, r2 = fit_line(xs, ys)
                out.append(Fit(axis, q, "line", b, a, r2, x))
            long = [(float(r.value), y) for r, y in zip(pts, ys) if r.value > 1]
            if axis == "tokens" and len(long) >= 2 and len(long) < len(pts):
                b, a, r2 = fit_line([p[0] for p in long], [p[1] for p in long])
                out.append(Fit(axis, q, "line", b, a, r2, x, f"{x} > 1"))
        for role in ("trainer", "generator0"):
            rss = [r.rss_mib[role] for r in pts]
            b, a, r2 = fit_line([float(r.value) for r in pts], rss)
            out.append(Fit(axis, f"{role}_rss_mib", "line", b, a, r2, x))
            if axis == "width" and all(r.params_m for r in pts):
                b, a, r2 = fit_line([r.params_m for r in pts], rss)  # type: ignore[misc]
                out.append(Fit(axis, f"{role}_rss_mib", "line", b, a, r2, "params_M"))
    return out


def summary(rows: list[Row], fitted: list[Fit]) -> list[str]:
    """The fitted growth of each axis in one sentence each, from the fits above."""
    def get(axis: str, q: str, law: str, x: str | None = None) -> Fit | None:
        return next((f for f in fitted if f.axis == axis and f.quantity == q and f.law == law
                     and (x is None or f.x == x)), None)

    out = []
    width = sorted((r for r in rows if r.axis == "width"), key=lambda r: r.value)
    step, train, gen = get("width", "step_s", "power"), get("width", "train_s", "power"), \
        get("width", "generate_s", "power")
    if step and train and gen:
        line = (
            f"- **Width**: step time grows as dim^{step.slope:.2f} (R^2 {step.r2:.2f}); train as "
            f"dim^{train.slope:.2f}, generate as dim^{gen.slope:.2f}"
        )
        # the small widths are overhead-bound; the last pair shows where the trend heads
        if len(width) > 2:
            a, b = width[-2], width[-1]
            local = math.log(b.stages["train"] / a.stages["train"]) / math.log(b.value / a.value)
            line += f" (train between dim {a.value} and {b.value}: dim^{local:.2f})"
        if len(width) > 1 and all(r.params_m for r in width):
            kp, _, _ = fit_power(  # type: ignore[misc]
                [float(r.value) for r in width], [r.params_m for r in width]
            )
            line += (f"; the parameter count grows as dim^{kp:.2f} over these widths (2 layers, "
                     "vocabulary 128)")
        mem = get("width", "trainer_rss_mib", "line", "params_M")
        if mem:
            line += (
                f". Trainer peak RSS grows {mem.slope:.1f} MiB per million parameters "
                f"(R^2 {mem.r2:.2f}); fp32 weights, gradients and two AdamW moments alone are "
                "15.3 MiB per million"
            )
        out.append(line + ".")
    step, gen, train = (
        next(
            (
                f
                for f in fitted
                if f.axis == "tokens" and f.quantity == q and f.over != "all points"
            ),
            None,
        )
        for q in ("step_s", "generate_s", "train_s")
    )
    if step and gen and train:
        out.append(
            "- **Answer length**: above one token, each answer token "
            f"adds {step.slope * 1000:.0f} ms to a step (line, R^2 {step.r2:.2f}; "
            f"generate {gen.slope * 1000:.0f} ms, train {train.slope * 1000:.0f} ms per token), "
            f"over a fixed {step.intercept:.2f} s. One-token answers sit far below that line: "
            "the generator's forward, its logprob recompute and the trainer's forward and "
            "backward then all run once per distinct prompt (the trainer's input is prompt + "
            "answer minus its last token, and rows are deduplicated), not once per sample."
        )
    per_sample = []
    for axis, other in (("group", "prompts"), ("prompts", "group")):
        f, pw = get(axis, "step_s", "line"), get(axis, "step_s", "power")
        if f and pw:
            n = setting(next(r for r in rows if r.axis == axis), other)
            per_sample.append(f"{LABEL[axis]}: {f.slope * 1000:.2f} ms per unit (R^2 {f.r2:.2f}), "
                              f"{f.slope / n * 1e6:.0f} us per sample at {LABEL[other]}={n}; "
                              f"log-log exponent {pw.slope:.2f}")
    if per_sample:
        batch = [r for r in rows if r.axis in ("group", "prompts")]
        lengths = {setting(r, 'tokens') for r in batch}
        why = (
            " Exponents below 1 here are the one-token answers again: a group shares its "
            "prompt, so the model runs once per distinct prompt and group size adds only "
            "per-sample work (sampling, rewards, the loss over rows, messages)."
            if lengths == {1}
            else ""
        )
        out.append(
            f"- **Batch** at {'/'.join(map(str, sorted(lengths)))}-token answers (samples per "
            "step = group size x prompts per step): " + "; ".join(per_sample) + "." + why
        )
    return out


def setting(row: Row, axis: str) -> int:
    """The value a row ran with on `axis` (its own overrides, the last one winning; else the
    default)."""
    given = [int(o.split("=", 1)[1]) for o in row.overrides if o.startswith(f"{LABEL[axis]}=")]
    return given[-1] if given else default_value(axis)


def fit_table(fitted: list[Fit], axis: str) -> list[str]:
    lines = ["| quantity | fitted law | fitted over | R^2 |", "|---|---|---|---|"]
    for f in (f for f in fitted if f.axis == axis):
        law = f.text().split(" = ", 1)[1].rsplit(" (R^2", 1)[0]
        lines.append(f"| {f.quantity} | {law} | {f.over} | {f.r2:.3f} |")
    return lines


# ---- report --------------------------------------------------------------------------------------


def table(rows: list[Row], axis: str) -> list[str]:
    lines = [
        f"| {LABEL[axis]} | params (M) | step s | generate | score | train | sync | other | len | "
        "trainer RSS MiB | generator RSS MiB | controller RSS MiB | load 1m (mean/max) | steps | "
        "step s per run |",
        "|" + "---|" * 15,
    ]
    for r in sorted((r for r in rows if r.axis == axis), key=lambda r: r.value):
        s = r.stages
        lines.append(
            f"| {r.value} | {r.params_m if r.params_m is not None else '?'} | {r.step_s:.3f} | "
            f"{s['generate']:.3f} | {s['score']:.3f} | {s['train']:.3f} | {s['sync']:.3f} | "
            f"{r.other_s:.3f} | {r.len_mean:g} | {r.rss_mib['trainer']:.0f} | "
            f"{r.rss_mib['generator0']:.0f} | {r.rss_mib['controller']:.0f} | "
            f"{r.load_mean:.2f}/{r.load_max:.2f} | {r.steps_measured} | "
            f"{', '.join(f'{x:.3f}' for x in r.replicate_step_s)} |"
        )
    return lines


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError, StopIteration):  # no /proc/cpuinfo, or no model name in it
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM"


def spread(rows: list[Row]) -> str:
    """How far apart the replicate runs of one point landed: (max - min) / median of their step
    medians."""
    gaps = {(r.axis, r.value): (max(r.replicate_step_s) - min(r.replicate_step_s)) / r.step_s
            for r in rows if len(r.replicate_step_s) > 1}
    unique = {tuple(r.run_dirs): gaps[(r.axis, r.value)] for r in rows if (r.axis, r.value) in gaps}
    if not unique:
        return ""
    worst = max(gaps, key=gaps.__getitem__)
    return (
        " Run-to-run spread of a point's step time ((max - min) / median of its runs): "
        f"median {100 * st.median(unique.values()):.0f}%, largest {100 * gaps[worst]:.0f}% "
        f"({worst[0]}={worst[1]})."
    )


def write_report(
    rows: list[Row], out: Path, command: str, meta: dict[str, Any]
) -> tuple[Path, list[Fit]]:
    """`out`.md (tables, fitted laws), `out`.json (the rows) and `out`.png."""
    fitted = fits(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows],
                                                    "fits": [asdict(f) for f in fitted]}, indent=1))
    md = [
        f"# How an rlexp GRPO step's cost grows ({meta.get('machine', machine())})",
        "",
        "Measured with (from the repository root):",
        "",
        "```bash",
        command,
        "```",
        "",
        *(
            [
                "Report rendered from the measured rows (`.json`) with:",
                "",
                "```bash",
                meta["rendered_with"],
                "```",
                "",
            ]
            if meta.get("rendered_with")
            else []
        ),
        f"Each point: `rlexp train {' '.join(COMMON)} {' '.join(meta.get('base', []))} "
        f"steps={meta['steps']}` plus the axis' overrides; times are medians of the run's own "
        f"`time/*` metrics over steps {meta['warmup'] + 1}..{meta['steps']} (the "
        f"first {meta['warmup']} dropped as warm-up). Memory is each process's peak RSS (VmHWM "
        "from /proc/<pid>/status of the pids in the run's placement.json, sampled every 0.2 s; "
        "shared pages such as torch's libraries and mapped shm weight files included). Load is "
        "the 1-minute load average during the run (os.getloadavg): other work shared the "
        "cores, so points carry noise (measured below when there are repeats); read trends, "
        "not digits. See the docstring of studies/scaling/scaling.py for what each axis changes."
        + (
            f" The sweep took {meta['sweep_wall_s'] / 60:.1f} min ({meta.get('repeats', 1)} "
            "pass(es) over the grid, one run per point per pass; `step s per run` gives each "
            "run's own median)."
            if "sweep_wall_s" in meta
            else ""
        )
        + spread(rows),
        "",
    ]
    lines = summary(rows, fitted)
    if lines:
        md += ["## Fitted growth", "", *lines, ""]
    for axis in dict.fromkeys(r.axis for r in rows):
        md += [f"## {axis} ({LABEL[axis]})", "", *table(rows, axis), ""]
        md += ["Fitted laws (least squares; power laws in log-log space, R^2 there):", "",
               *fit_table(fitted, axis), ""]
    md += ["## Notes", "", *NOTES, *meta.get("notes", []), ""]
    png = out.with_suffix(".png")
    plot(rows, fitted, png)
    md += [f"![scaling]({png.name})", ""]
    path = out.with_suffix(".md")
    path.write_text("\n".join(md))
    return path, fitted


def plot(rows: list[Row], fitted: list[Fit], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = list(dict.fromkeys(r.axis for r in rows))
    fig, axs = plt.subplots(2, len(axes_names), figsize=(4.2 * len(axes_names), 7), squeeze=False)
    for j, axis in enumerate(axes_names):
        pts = sorted((r for r in rows if r.axis == axis), key=lambda r: r.value)
        xs = [r.value for r in pts]
        top, bottom = axs[0][j], axs[1][j]
        bottoms = [0.0] * len(pts)
        for name in STAGES:
            ys = [r.stages[name] for r in pts]
            top.bar([str(x) for x in xs], ys, bottom=bottoms, label=name)
            bottoms = [b + y for b, y in zip(bottoms, ys)]
        top.plot([str(x) for x in xs], [r.step_s for r in pts], "k.-", label="step (median)")
        f = next((f for f in fitted if f.axis == axis and f.quantity == "step_s"), None)
        top.set_title(f"{LABEL[axis]}\n{f.text() if f else ''}", fontsize=8)
        top.set_ylabel("seconds per step")
        for role in ROLES:
            bottom.plot([str(x) for x in xs], [r.rss_mib[role] for r in pts], "o-", label=role)
        bottom.set_ylabel("peak RSS (MiB)")
        bottom.set_xlabel(LABEL[axis])
        if j == 0:
            top.legend(fontsize=7)
            bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_grid(specs: list[str] | None) -> dict[str, list[int]]:
    if not specs:
        return dict(GRID)
    grid = {}
    for spec in specs:
        axis, _, values = spec.partition("=")
        if axis not in GRID or not values:
            raise SystemExit(f"--grid {spec!r}: want AXIS=V1,V2,... with AXIS in {sorted(GRID)}")
        grid[axis] = [int(v) for v in values.split(",")]
    return grid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "scaling_cpu",
        help="report path, no suffix",
    )
    ap.add_argument(
        "--grid", action="append", help="AXIS=V1,V2 (repeatable); default: the whole grid"
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument(
        "--repeats", type=int, default=1, help="passes over the whole grid (one run per point each)"
    )
    ap.add_argument(
        "--runs", type=Path, default=None, help="where the runs go (default runs/scaling/<time>)"
    )
    ap.add_argument("--base", nargs="*", default=[], help="extra overrides applied to every point")
    ap.add_argument(
        "--from-json", type=Path, help="re-render the report from a previous --out .json"
    )
    ap.add_argument(
        "--note",
        action="append",
        default=[],
        help="a line added to the report's notes (repeatable)",
    )
    args = ap.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"--warmup {args.warmup} must be in [0, --steps {args.steps})")
    command = shlex.join(
        ["python", "studies/scaling/scaling.py", *(sys.argv[1:] if argv is None else argv)]
    )
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        rows = [Row(**r) for r in data["rows"]]
        meta = {**data["meta"], "rendered_with": command}
    else:
        runs = args.runs or REPO / "runs" / "scaling" / time.strftime("%Y-%m-%d_%H-%M-%S")
        t = time.perf_counter()
        rows = sweep(parse_grid(args.grid), args.base, args.steps, args.warmup, runs, args.repeats)
        meta = {
            "steps": args.steps,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "base": args.base,
            "machine": machine(),
            "sweep_wall_s": time.perf_counter() - t,
            "runs": str(runs),
            "command": command,
        }
    meta["notes"] = [f"- {n}" for n in args.note]
    path, fitted = write_report(rows, args.out, meta.get("command", command), meta)
    print(f"wrote {path}")
    for f in fitted:
        print(f"  {f.axis}: {f.text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
