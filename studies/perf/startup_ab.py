"""A run's fixed cost, this tree against another checkout (issue 44 item 6).

    python studies/perf/startup_ab.py --before /work/main --pairs 5 \
        --out studies/perf/results/startup_ab.jsonl
    python studies/perf/startup_ab.py --report studies/perf/results/startup_ab.jsonl
    python studies/perf/startup_ab.py --before /work/main --imports 6

Pairs of `rlexp train steps=2` (niced, alternating which tree goes first), each tree on PYTHONPATH:
the elapsed time at which each start-up line was read from its output, the exit, and user+sys CPU
of the whole process tree (`/usr/bin/time`). `--imports N`: CPU of what a generator actor imports to
set up (its module, then the model config), N alternating pairs. The 1-minute load is recorded with
each run: on a shared machine compare ratios within pairs, not seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINES = {"config composed": "composed", "torch and Monarch": "loaded", "checks done": "checks",
         "hosts up": "hosts", "processes spawned": "spawned", "generator0 ready": "gen_ready",
         "trainer ready": "trainer_ready", "weights loaded": "engines",
         "first step done": "first_step", "[rlexp] done": "done"}
IMPORTS = ("import resource, rlexp.actors.generator\nfrom rlexp.config.model import ArchConfig\n"
           "from rlexp.models.titan import titan_config\ntitan_config(ArchConfig())\n"
           "r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)")


def one_run(tag: str, tree: Path, run_dir: str) -> dict:
    cmd = ["nice", "-n", "10", "/usr/bin/time", "-f", "TIME %e wall %U user %S sys", sys.executable,
           "-m", "rlexp", "train", "steps=2", f"hydra.run.dir={run_dir}"]
    load, t0 = os.getloadavg()[0], time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)})
    at: dict[str, float] = {}
    cpu = None
    for line in p.stdout or ():
        now = round(time.monotonic() - t0, 3)
        for text, key in LINES.items():
            if text in line:
                at.setdefault(key, now)
        if m := re.match(r"TIME [\d.]+ wall ([\d.]+) user ([\d.]+) sys", line):
            cpu = float(m.group(1)) + float(m.group(2))
    rc = p.wait()
    at["exit"] = round(time.monotonic() - t0, 3)
    return {"tag": tag, "tree": str(tree), "rc": rc, "load": load, "cpu": cpu, "phases": at}


def report(path: Path) -> None:
    """Median per phase (seconds since the line before), before and after, and per-pair ratios."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by: dict[str, dict[str, dict[str, float]]] = {"before": {}, "after": {}}
    for r in rows:
        _, which, i = r["tag"].split("-")
        prev, out = 0.0, {}
        for key in [*LINES.values(), "exit"]:
            if key in r["phases"]:
                out[key], prev = r["phases"][key] - prev, r["phases"][key]
        by[which][i] = {**out, "total": r["phases"]["exit"], "cpu": r["cpu"], "load": r["load"]}
    pairs = sorted(set(by["before"]) & set(by["after"]))
    print("| phase (s since the previous line) | before median | after median | ratio | per pair |")
    print("|---|---|---|---|---|")
    for key in [*LINES.values(), "exit", "total", "cpu", "load"]:
        b = [by["before"][i][key] for i in pairs if key in by["before"][i]]
        a = [by["after"][i][key] for i in pairs if key in by["after"][i]]
        if len(a) != len(b) or not a:
            continue
        ratios = [f"{x / y:.2f}" if y else "-" for x, y in zip(a, b)]
        mb, ma = statistics.median(b), statistics.median(a)
        ratio = f"{ma / mb:.2f}" if mb else "-"
        print(f"| {key} | {mb:.2f} | {ma:.2f} | {ratio} | {', '.join(ratios)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--imports", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report", type=Path)
    a = ap.parse_args()
    if a.report:
        return report(a.report)
    trees = {"before": a.before, "after": ROOT}
    for i in range(1, (a.imports or a.pairs) + 1):
        for which in (("before", "after") if i % 2 else ("after", "before")):
            if a.imports:
                env = {**os.environ, "PYTHONPATH": str(trees[which])}
                cpu = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True,
                                     text=True, env=env, check=True)
                print(which, cpu.stdout.strip(), f"load {os.getloadavg()[0]:.1f}", flush=True)
                continue
            rec = one_run(f"pair-{which}-{i}", trees[which], f"/tmp/startup_ab/pair-{which}-{i}")
            print(json.dumps(rec), flush=True)
            if a.out:
                with a.out.open("a") as f:
                    f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
