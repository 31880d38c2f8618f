"""Chaos runs: `kill -9` a role's process mid-run on simulated hosts (`cluster=process`) and check
what the run did about it against a fault-free run of the same command.

    python scripts/chaos.py [--steps 40] [--seed 0] [--out results/faults.md]

Each scenario starts `rlexp train cluster=process ...`, waits until a step drawn from `--seed` is
logged, reads `placement.json` (which pid runs what) and kills that process with SIGKILL. A
generator or reward replica fault must end with every step done, per-request accounting exact
(completed == issued) and the metrics identical to the fault-free run (request seeds do not depend
on the replica that serves them). A trainer rank fault must stop the run with exit code 3 and the
last checkpoint intact; `resume=auto` then finishes it, with the metrics of the fault-free run.
tests/test_faults.py runs the same scenarios, shorter.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlexp.tracking.reproduce import compare_metrics

REPO = Path(__file__).resolve().parent.parent
# Two generator replicas on two simulated hosts, trainer and reward on hosts of their own.
LAYOUT = [
    "cluster=process",
    "generator.replicas=2",
    "cluster.hosts_per_role.generator=2",
    "cluster.hosts=4",
]


def rows(run: Path) -> list[dict[str, Any]]:
    f = run / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []


def same_metrics(a: Path, b: Path) -> str | None:
    """None when the two runs agree on every metric except timings and the request accounting (what
    `rlexp reproduce` compares), else the first difference."""
    return compare_metrics(a / "metrics.jsonl", b / "metrics.jsonl")


def start(args: list[str], run: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlexp", "train", *args, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(r["step"] >= step for r in rows(run)):
            return time.time()
        if proc.poll() is not None:
            raise RuntimeError(
                f"run exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}"
            )
        time.sleep(0.1)
    raise TimeoutError(f"step {step} not reached in {timeout}s")


@dataclass
class Outcome:
    scenario: str
    killed: str
    at_step: int
    returncode: int
    steps_done: int
    recovery_s: float  # kill -> the next step logged (detection + respawn + the re-issued work)
    matched: str | None  # same_metrics against the fault-free run
    accounting: dict[str, float] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""


def inject(args: list[str], run: Path, env: dict[str, str], target: str, at_step: int,
           timeout: float = 600, more: list[tuple[str, int]] = ()) -> Outcome:
    """Run `args`, SIGKILL the process of mesh `target` (e.g. "generator1", "reward0", "trainer")
    once step `at_step` is logged, then each (target, step) of `more` in turn, and let the run go
    on."""
    proc = start(args, run, env)
    killed_at, pids = 0.0, []
    for name, step in [(target, at_step), *more]:
        wait_step(run, step, proc)
        pid = json.loads((run / "placement.json").read_text())[name][0]["pid"]
        pids.append(pid)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
    step_at_kill = max(r["step"] for r in rows(run))
    recovery = float("nan")
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        if any(r["step"] > step_at_kill for r in rows(run)) and recovery != recovery:
            recovery = time.time() - killed_at
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    elif proc.returncode != 0:
        recovery = time.time() - killed_at  # a run that stops: how long until it has stopped
    out, err = proc.communicate()
    last = rows(run)[-1] if rows(run) else {}
    return Outcome(
        target,
        f"{target} pid {pids[0]}",
        step_at_kill,
        proc.returncode,
        int(last.get("step", 0)),
        recovery,
        None,
        {k: v for k, v in last.items() if k.startswith("service/")},
        out,
        err,
    )


def scenarios(steps: int, seed: int, work: Path, env: dict[str, str]) -> list[Outcome]:
    rng = random.Random(seed)
    common = [
        *LAYOUT,
        f"steps={steps}",
        f"eval.every_n_steps={steps // 2}",
        "checkpoint.every_n_steps=5",
    ]
    clean = work / "fault_free"
    subprocess.run(
        [sys.executable, "-m", "rlexp", "train", *common, f"hydra.run.dir={clean}"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    out = []
    for target in ("generator1", "reward0"):
        o = inject(common, work / target, env, target, rng.randint(3, steps - 5))
        o.matched = same_metrics(clean, work / target) if o.returncode == 0 else "run failed"
        out.append(o)
    run = work / "trainer"
    o = inject(common, run, env, "trainer", rng.randint(6, steps - 5))
    resumed = subprocess.run(
        [sys.executable, "-m", "rlexp", "train", *common, "resume=auto", f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    o.matched = (
        same_metrics(clean, run)
        if resumed.returncode == 0
        else f"resume failed: {resumed.stderr[-500:]}"
    )
    o.steps_done = int(rows(run)[-1]["step"]) if rows(run) else 0
    out.append(o)
    return out


def report(outcomes: list[Outcome], cmd: str) -> str:
    lines = [
        "# Fault tolerance on simulated hosts (`cluster=process`)",
        "",
        f"Reproduce: `{cmd}` (2-core CPU machine, tiny Qwen3 policy, default arithmetic task).",
        "",
        "| fault (kill -9) | at step | exit | steps done | recovery s | failures seen | "
        "requests issued / retried / completed | replicas respawned | requests lost | metrics "
        "vs fault-free |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        a = o.accounting
        svc = "generators" if o.scenario.startswith("generator") else "rewards"
        acc = (
            f"{a.get(f'service/{svc}/issued', 0):.0f} / {a.get(f'service/{svc}/retried', 0):.0f} / "
            f"{a.get(f'service/{svc}/completed', 0):.0f}"
            if o.scenario != "trainer"
            else "n/a (run stopped)"
        )
        lost = (a.get(f"service/{svc}/issued", 0) - a.get(f"service/{svc}/completed", 0)
                if o.scenario != "trainer" else 0)
        resp = f"{a.get(f'service/{svc}/respawned', 0):.0f}" if o.scenario != "trainer" else "-"
        seen = (
            f"{a.get(f'service/{svc}/failures', 0):.0f}"
            if o.scenario != "trainer"
            else "1 (rank 0)"
        )
        rec = f"{o.recovery_s:.1f}" if o.scenario != "trainer" else f"stopped in {o.recovery_s:.1f}"
        lines.append(
            f"| {o.killed.split(' pid')[0]} | {o.at_step} | {o.returncode} | {o.steps_done} | "
            f"{rec} | {seen} | {acc} | {resp} | {lost:.0f} | "
            f"{'identical' if o.matched is None else o.matched} |"
        )
    lines += [
        "",
        "Recovery time runs from the kill to the next logged step: Monarch's supervision "
        "reports the dead process (most of the time: about 7-10 s here), the service starts a "
        "new process on the same host, replays the current weights version into it, and "
        "re-issues the lost requests with their own seeds. `retried` is 0 when the death was "
        "first seen by a weights update (the replacement receives that version when it starts, "
        "so nothing is re-sent). Requests lost = issued - completed. The trainer row: the run "
        "stops with exit code 3 naming its last checkpoint (every 5 steps here); the steps and "
        "metrics columns are for the same run after `resume=auto` finished it. Metrics are "
        "compared as `rlexp reproduce` does: every value except timings and request accounting, "
        "every step.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlexp_chaos"))
    ap.add_argument("--out", type=Path, default=REPO / "results" / "faults.md")
    a = ap.parse_args()
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPO)}
    outcomes = scenarios(a.steps, a.seed, a.work, env)
    text = report(outcomes, f"python scripts/chaos.py --steps {a.steps} --seed {a.seed}")
    a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
