"""How long a refused `rlexp train` takes, this tree against another checkout (issue 45 item 5).

    python studies/perf/preflight_ab.py --before /tmp/base65 --out studies/perf/results/preflight_ab

Each mistake runs through the real CLI (`python -m rlexp train ...`) in a fresh copy of
examples/my_task (a user's project), once with each tree on PYTHONPATH, alternating; recorded: the
exit code, wall and CPU seconds (user + system of the child), whether torch was imported
(`-X importtime` in a second run) and the message's last line. The machine's 1-minute load is
written beside the numbers: compare the two trees within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARROW = ('from mytask.tasks import CountA\nfrom rlexp.types import Problem, Sample\n\n\n'
         'class Arrow(CountA):\n    def load_samples(self, split):\n'
         '        return [Sample(Problem(id=s.id, prompt=s.id + " \\u2192"), answer=s.answer)\n'
         '                for s in super().load_samples(split)]\n')
MISTAKES = [
    ["environment=gpqa"],
    ["config_path=conf", "environment=count_a", "environment.name=mytask.arrow:Arrow"],
    ["cluster=gpu_node"],
    ["model.path=/nonexistent/ckpt"],
    ["algorithm.loss=grpoo"],
]


def run(tree: Path, project: Path, args: list[str], importtime: bool) -> dict:
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "rlexp", "train",
           *args]
    env = {**os.environ, "PYTHONPATH": str(tree), "CUDA_VISIBLE_DEVICES": ""}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("rlexp: ")]
    lines = lines or p.stderr.strip().splitlines()[-1:] or [""]
    return {"rc": p.returncode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "torch": re.search(r"\|\s+torch$", p.stderr, re.M) is not None,
            "message": lines[-1][:200]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="another checkout of rlexp")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    a = ap.parse_args()
    rows = []
    for args in MISTAKES:
        row: dict = {"args": " ".join(args), "load": round(os.getloadavg()[0], 2)}
        for name, tree in (("before", a.before.resolve()), ("after", ROOT)):
            with tempfile.TemporaryDirectory() as tmp:
                project = Path(tmp) / "my_task"
                shutil.copytree(tree / "examples" / "my_task", project)
                (project / "mytask" / "arrow.py").write_text(ARROW)
                timed = run(tree, project, args, importtime=False)
                timed["torch"] = run(tree, project, args, importtime=True)["torch"]
                timed["left_a_folder"] = any((project / d).exists() for d in ("runs", "outputs"))
                row[name] = timed
        rows.append(row)
        print(json.dumps(row), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    md = [f"# A refused `rlexp train`: {a.before.name} against this tree", "",
          f"`python studies/perf/preflight_ab.py --before {a.before} --out {a.out}` (2-core CPU "
          "machine; `CUDA_VISIBLE_DEVICES` empty). Wall and CPU seconds of one refusal; torch: "
          "imported before the refusal.", "",
          "| mistake | load | before: rc, wall / CPU s, torch, folder left | after: the same | "
          "after's message |", "|---|---|---|---|---|"]
    for r in rows:
        b, f = r["before"], r["after"]
        cells = [f"{t['rc']}, {t['wall_s']} / {t['cpu_s']}, {t['torch']}, {t['left_a_folder']}"
                 for t in (b, f)]
        md.append(f"| `{r['args']}` | {r['load']} | {cells[0]} | {cells[1]} | "
                  f"{f['message'].replace('|', '/')[:120]} |")
    a.out.with_suffix(".md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
