"""examples/my_task as a user runs it: copied out of the repository, commands run from that folder, the rlexp
that is installed (here the editable install of this checkout, with the checkout first on PYTHONPATH; building a
wheel per test is what tests/test_install.py does, once). Train, a two-seed sweep from the project's own preset,
compare, and a bit-for-bit reproduce that finds the project's code again through the manifest alone."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, metrics, rlexp, wait_no_orphans

TINY = ["algorithm.prompts_per_step=8", "algorithm.group_size=4", "eval.every_n_steps=2"]


@pytest.mark.slow
def test_my_task_outside_the_package(tmp_path: Path, tag: str) -> None:
    project = tmp_path / "my_task"
    shutil.copytree(REPO / "examples" / "my_task", project, ignore=shutil.ignore_patterns("__pycache__"))
    run = tmp_path / "run"
    rlexp("train", "config_path=conf", "environment=count_a", "reward=near_miss", "steps=2", *TINY,
          f"hydra.run.dir={run}", cwd=project, tag=tag)
    rows = metrics(run)
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]  # scored by NearMiss in the reward actor
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]  # CountA's held-out check
    m = json.loads((run / "manifest.json").read_text())
    assert [p["module"] for p in m["plugins"]] == ["mytask.tasks"]
    assert m["plugins"][0]["file"] == str(project / "mytask" / "tasks.py") and len(m["plugins"][0]["sha256"]) == 64
    assert m["config_path"][0]["path"] == str(project / "conf")

    sweep = tmp_path / "sweep"
    rlexp("train", "-m", "config_path=conf", "+sweeps=two_seeds", "environment=count_a", "reward=near_miss",
          "steps=2", *TINY, f"hydra.sweep.dir={sweep}", cwd=project, tag=tag)
    jobs = sorted(d.name for d in sweep.iterdir() if (d / "metrics.jsonl").is_file())
    assert jobs == ["0", "1"]
    seeds = [json.loads((sweep / j / "manifest.json").read_text())["seeds"]["data"] for j in jobs]
    assert seeds[0] != seeds[1]

    out = tmp_path / "compare"
    p = rlexp("compare", str(sweep), "--out", str(out), cwd=project, tag=tag)
    assert "seed" in p.stdout and any(out.iterdir())

    # From elsewhere: the manifest alone brings back the config folder and the plug-in (hash-checked).
    p = rlexp("reproduce", str(run), cwd=tmp_path, tag=tag)
    assert "reproduced bit for bit" in p.stdout and "plug-in mytask.tasks" in p.stdout, p.stdout[-3000:]
    assert wait_no_orphans(tag) == []
