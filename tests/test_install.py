"""A non-editable `pip install .` into a new venv finds its configs (they ship inside the package) and
`rlexp train` runs from another directory.

The new venv sees the test venv's dependencies through a .pth line (no network here, and torch/vLLM
wheels are large); rlexp itself is built and installed from a copy of the tracked files, not linked.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_install_trains_from_another_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    venv = tmp_path / "venv"
    # No pip or setuptools of its own: the .pth below lends it the test venv's (a new venv's bundled
    # setuptools is too old to build a wheel).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                   check=True, cwd=tmp_path)
    shutil.rmtree(src)  # nothing may still point at the source tree

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run([str(py), "-c", "import rlexp; print(rlexp.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(site)), where
    out = subprocess.run([str(venv / "bin" / "rlexp"), "train", "steps=5", "algorithm.prompts_per_step=8",
                          "eval.max_samples=16", "checkpoint.save_final=false", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[rlexp] done: 5 steps" in out.stdout
    assert (tmp_path / "run" / "metrics.jsonl").exists()

    # A user's project outside the package (examples/my_task) against the installed wheel: its own environment
    # and reward, found through its config folder and plug-in list, in the controller and the actors.
    project = elsewhere / "my_task"
    shutil.copytree(REPO / "examples" / "my_task", project, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([str(venv / "bin" / "rlexp"), "train", "config_path=conf", "environment=count_a",
                          "reward=near_miss", "steps=2", "algorithm.prompts_per_step=8", "algorithm.group_size=4",
                          "eval.every_n_steps=2", f"hydra.run.dir={tmp_path / 'my_run'}"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line for line in (tmp_path / "my_run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) >= 2 and '"reward/mean"' in rows[-1]
