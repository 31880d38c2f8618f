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
    p = rlexp("train", "config_path=conf", "environment=count_a", "reward=near_miss", "steps=2", *TINY,
              f"hydra.run.dir={run}", cwd=project, tag=tag)
    phases = [line.split(" (")[0] for line in p.stderr.splitlines() if line.startswith("[rlexp] ")]
    assert phases[:5] == ["[rlexp] started, config composed", "[rlexp] checks done", "[rlexp] hosts up",
                          "[rlexp] processes spawned", "[rlexp] weights loaded, engines ready"], p.stderr[-3000:]
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


WRAPPER = """import sys
import wraptasks  # registers count_w; a module beside this script, not listed in plugins
from rlexp.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_wrapper_script_route(tmp_path: Path, tag: str) -> None:
    """The route the issue saw die in the reward actor 73 s in: a script imports its own module (which registers a
    name) and calls `rlexp.cli.main`, run from another folder. The actors import that module too."""
    import subprocess
    import sys

    from tests.conftest import tagged_env

    project = tmp_path / "my_task"
    shutil.copytree(REPO / "examples" / "my_task", project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "wraptasks.py").write_text("from mytask.tasks import CountA\nfrom rlexp.envs.base import register_env"
                                          "\n\n\n@register_env('count_w')\nclass CountW(CountA):\n    pass\n")
    (project / "run.py").write_text(WRAPPER)
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = subprocess.run([sys.executable, str(project / "run.py"), "train", f"config_path={project / 'conf'}",
                        "environment=count_a", "environment.name=count_w", "reward=near_miss", "steps=1", *TINY,
                        f"hydra.run.dir={run}"], cwd=elsewhere, env=tagged_env(tag), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert [r["step"] for r in metrics(run) if "reward/mean" in r] == [1]
    m = json.loads((run / "manifest.json").read_text())
    assert {"module": "wraptasks", "by_name": True}.items() <= next(
        e for e in m["plugins"] if e["module"] == "wraptasks").items()
    assert wait_no_orphans(tag) == []
