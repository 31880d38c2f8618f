"""GPU-hours for `rlexp plan`: of one run, and of a whole sweep preset (`rlexp plan ... +sweeps=NAME`).

A run's hours are the planner's FLOP estimate (`rlexp.cluster.planner.StepTime`: seconds per step at
`cluster.mfu` x `cluster.steps`), a lower bound that leaves out start-up and evaluation. Its GPUs are counted
two ways: the GPUs its layout uses (trainer, generators, served verifiers) and the GPUs it holds, every host it
touches counted whole (`cluster.gpus_per_host`), which is what a scheduler that hands out nodes charges. GPU-hours
are held GPUs x hours.

A sweep preset is the YAML `rlexp train -m +sweeps=NAME` reads (`conf/sweeps/NAME.yaml`): its
`hydra.sweeper.params` are expanded as Hydra's basic sweeper does for comma-separated lists (the cartesian
product), each run composed and planned like a single one. Kept apart from the planner, which is restructured
separately, behind one call each in rlexp/cluster/plan_cli.py.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR

if TYPE_CHECKING:
    from rlexp.cluster.planner import PlanReport
    from rlexp.config.schema import TrainConfig

SWEEP_ARG = re.compile(r"^\+sweeps=([A-Za-z0-9_\-]+)$")


class SweepError(ValueError):
    """A sweep preset `rlexp plan` cannot expand; the message names the fix."""


@dataclass(frozen=True)
class RunCost:
    label: str  # the run's sweep overrides, e.g. "reward=weaver_paper seed=0"
    gpus_used: int
    gpus_held: int  # every host the layout touches, counted whole
    hours: float | None  # None: cluster.gpu_peak_tflops or cluster.mfu unset
    fits: bool

    @property
    def gpu_hours(self) -> float | None:
        return None if self.hours is None else self.gpus_held * self.hours


def run_cost(cfg: TrainConfig, report: PlanReport, label: str = "") -> RunCost:
    """One run's typed config and its `PlanReport` -> its GPUs and hours."""
    from rlexp.cluster.layout import check_hosts_fit, gpu_layout
    from rlexp.config.validate import ConfigError

    _, used = gpu_layout(cfg)
    per_host = int(cfg.cluster.gpus_per_host or 0)
    held = sum(per_host or n for n in used.values())
    fits = bool(report.ok)
    try:
        check_hosts_fit(cfg)
    except ConfigError:
        fits = False
    t = report.time
    hours = t.step_s * t.steps / 3600 if t is not None and t.peak_tflops and t.mfu > 0 else None
    return RunCost(label, sum(used.values()), held, hours, fits)


def cost_line(c: RunCost) -> str:
    """The line `rlexp plan` prints for a single run."""
    if c.hours is None:
        return (f"GPU-hours: unknown (set cluster.gpu_peak_tflops and cluster.mfu); {c.gpus_used} GPU(s) used, "
                f"{c.gpus_held} held")
    return (f"GPU-hours: {c.gpu_hours:.1f} ({c.gpus_held} GPU(s) held, whole hosts; {c.gpus_used} used) x "
            f"{c.hours:.2f} h, the FLOP estimate above: a lower bound, start-up and evaluation not counted")


def take_sweep(overrides: list[str]) -> tuple[list[str], str | None]:
    """`+sweeps=NAME` taken out of the overrides (the rest compose as a run), and NAME (None when absent)."""
    names = [m.group(1) for o in overrides if (m := SWEEP_ARG.match(o))]
    if len(names) > 1:
        raise SweepError(f"rlexp plan: several sweep presets {names}; plan one at a time")
    return [o for o in overrides if not SWEEP_ARG.match(o)], (names[0] if names else None)


def sweep_file(name: str, roots: list[Path] | None = None) -> Path:
    roots = roots or [CONF_DIR / "sweeps", Path.cwd() / "conf" / "sweeps", Path.cwd() / "sweeps"]
    for root in roots:
        if (root / f"{name}.yaml").is_file():
            return root / f"{name}.yaml"
    raise SweepError(f"rlexp plan: no sweep preset {name!r} in {', '.join(str(r) for r in roots)}; name a file "
                     f"sweeps/<name>.yaml as `+sweeps=<name>`")


def expand(path: Path) -> list[list[str]]:
    """Every run's overrides, in Hydra's basic-sweeper order (the first parameter varies slowest)."""
    params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params")
    if not params:
        raise SweepError(f"{path}: no hydra.sweeper.params to expand")
    axes = []
    for key, value in OmegaConf.to_container(params).items():
        text = str(value)
        if re.search(r"[\[\]()]|\$\{", text):
            raise SweepError(f"{path}: hydra.sweeper.params.{key}={text!r} is not a plain comma-separated list "
                             f"(range(), choice(), lists and interpolations are not expanded here); list the values "
                             f"as a,b,c")
        axes.append([f"{key}={v.strip()}" for v in text.split(",")])
    return [list(run) for run in itertools.product(*axes)]


def plan_sweep(name: str, base: list[str], plan: Callable[[list[str]], tuple[Any, Any]],
               roots: list[Path] | None = None) -> tuple[list[str], bool]:
    """Plan every run of sweep preset `name` over the `base` overrides; `plan(overrides) -> (cfg, PlanReport)`.
    Returns the lines to print and whether every run fits."""
    path = sweep_file(name, roots)
    costs = []
    for run in expand(path):
        cfg, report = plan([*base, *run])
        costs.append(run_cost(cfg, report, " ".join(run)))
    width = max(len(c.label) for c in costs)
    lines = [f"sweep {path.name}: {len(costs)} runs over {' '.join(base) or '(no base overrides)'}",
             f"  {'run':<{width}}  GPUs used  held  h/run  GPU-h  fits"]
    for c in costs:
        h = "?" if c.hours is None else f"{c.hours:.2f}"
        gh = "?" if c.gpu_hours is None else f"{c.gpu_hours:.1f}"
        lines.append(f"  {c.label:<{width}}  {c.gpus_used:>9}  {c.gpus_held:>4}  {h:>5}  {gh:>5}  "
                     f"{'yes' if c.fits else 'NO'}")
    known = [c.gpu_hours for c in costs if c.gpu_hours is not None]
    total = f"{sum(known):,.0f}" if len(known) == len(costs) else "unknown (set cluster.gpu_peak_tflops, cluster.mfu)"
    lines.append(f"GPU-hours of the sweep: {total} (held GPUs x the FLOP estimate per run: a lower bound, start-up "
                 f"and evaluation not counted)")
    bad = [c.label for c in costs if not c.fits]
    if bad:
        lines.append(f"refused: {len(bad)} run(s) do not fit (plan one alone for its 'fix:' lines): {bad[0]} ...")
    return lines, not bad
