"""Reliability table: faults, corruptions, bad inputs, secrets and concurrent runs, each tried through the CLI
as a hostile or unlucky user would, expected vs observed.

    python scripts/reliability.py [--out results/reliability.md] [--only SUBSTRING] [--keep DIR]

Every case runs real `rlexp` subprocesses (tiny model, a few steps) in a scratch folder. One short finished run
(`steps=4 checkpoint.every_n_steps=2`) is made once and copied for each case that needs a run folder, so a case
never sees another's leftovers. A case passes when the observed outcome matches what README's "Untrusted run
folders and manifests" promises: refused before anything spawns with the cause named, nothing already written
lost, no process left behind. Takes about 15 minutes on a 2-core machine.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = ["steps=4", "eval.every_n_steps=2", "checkpoint.every_n_steps=2"]


@dataclass
class Outcome:
    observed: str
    ok: bool
    seconds: float = 0.0


@dataclass
class Case:
    area: str
    what: str
    command: str
    expected: str
    run: Callable[[Path], Outcome]


def env_for(tag: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, RLEXP_TEST_TAG=tag, PYTHONUNBUFFERED="1", WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("WANDB_API_KEY", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(extra)
    return env


def tagged_pids(tag: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if f"RLEXP_TEST_TAG={tag}".encode() in (p / "environ").read_bytes().split(b"\0"):
                if (p / "stat").read_text().split(") ")[-1].split()[0] != "Z":
                    pids.append(int(p.name))
    return pids


def wait_clean(tag: str, timeout: float = 30.0) -> tuple[list[int], float]:
    t0 = time.time()
    while time.time() - t0 < timeout:
        left = tagged_pids(tag)
        if not left:
            return [], time.time() - t0
        time.sleep(0.25)
    return tagged_pids(tag), time.time() - t0


def rlexp(args: list[str], cwd: Path, timeout: float = 600, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "rlexp", *args], cwd=cwd, env=env_for(uuid.uuid4().hex, **env),
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.time() - t0


def last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "").strip()[:220]


def has_traceback(p: subprocess.CompletedProcess) -> bool:
    return "Traceback (most recent call last)" in p.stdout + p.stderr


class Base:
    """One finished tiny run, copied per case."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "base"
        p, _ = rlexp(["train", *TINY, f"hydra.run.dir={self.dir}"], cwd=root)
        if p.returncode != 0:
            raise SystemExit(f"base run failed:\n{p.stderr[-3000:]}")

    def copy(self, work: Path, name: str = "run") -> Path:
        dst = work / name
        shutil.copytree(self.dir, dst, symlinks=True)
        return dst


def refused(p: subprocess.CompletedProcess, secs: float, *needles: str, limit_s: float = 30.0) -> Outcome:
    text = p.stdout + p.stderr
    named = all(n in text for n in needles)
    ok = p.returncode not in (0, None) and named and not has_traceback(p) and secs < limit_s
    return Outcome(f"exit {p.returncode} in {secs:.1f} s: {last_line(p.stderr) or last_line(p.stdout)}", ok, secs)


CASES: list[Case] = []


def case(area: str, what: str, command: str, expected: str) -> Callable[[Callable[[Path], Outcome]], Callable]:
    def deco(fn: Callable[[Path], Outcome]) -> Callable[[Path], Outcome]:
        CASES.append(Case(area, what, command, expected, fn))
        return fn
    return deco


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "results" / "reliability.md")
    ap.add_argument("--only", default="", help="run only cases whose description contains this")
    ap.add_argument("--keep", type=Path, default=None, help="scratch folder to keep (default: a temp folder, removed)")
    args = ap.parse_args(argv)
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="rlexp-reliability-"))
    scratch.mkdir(parents=True, exist_ok=True)
    global BASE
    BASE = Base(scratch)
    rows = []
    for i, c in enumerate(CASES):
        if args.only and args.only not in c.what:
            continue
        work = scratch / f"case{i:02d}"
        work.mkdir(exist_ok=True)
        try:
            out = c.run(work)
        except Exception as e:  # a case that breaks is a failed case, reported, not a crashed table
            out = Outcome(f"case raised {type(e).__name__}: {e}"[:220], False)
        print(f"[{'ok' if out.ok else 'FAIL'}] {c.area}: {c.what} -> {out.observed}", flush=True)
        rows.append((c, out))
    write_table(args.out, rows, argv if argv is not None else sys.argv[1:])
    if args.keep is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(o.ok for _, o in rows) else 1


def write_table(out: Path, rows: list[tuple[Case, Outcome]], argv: list[str]) -> None:
    passed = sum(o.ok for _, o in rows)
    lines = [
        "# Reliability: faults, corruptions, bad inputs, secrets, concurrent runs",
        "",
        f"Reproduce: `python scripts/reliability.py{' ' + ' '.join(argv) if argv else ''}` (2-core CPU machine, "
        "tiny Qwen3 policy; each case is a real `rlexp` subprocess in a scratch folder).",
        "",
        f"{passed} of {len(rows)} cases behave as promised. Commands are shown as a user would type them; `RUN` is a",
        "copy of one finished `rlexp train steps=4 eval.every_n_steps=2 checkpoint.every_n_steps=2` run.",
        "",
        "| area | case | command | expected | observed | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c, o in rows:
        obs = o.observed.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {c.area} | {c.what} | `{c.command}` | {c.expected} | {obs} | {'as expected' if o.ok else 'NOT as expected'} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {passed}/{len(rows)} as expected")


BASE: Base


if __name__ == "__main__":
    sys.exit(main())
