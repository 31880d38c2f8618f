"""A non-editable `pip install .` into a new venv finds its configs (the top-level conf/, shipped inside the
package as rlexp/conf, sweep and launcher presets included) and `rlexp train` runs from another directory;
examples/my_task, copied out of the repository, runs its README route against that wheel (a
two-seed sweep, compare, reproduce of one of its runs), with the start-up phase lines of a real run.

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
import yaml

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
    out = subprocess.run([str(venv / "bin" / "rlexp"), "train", "steps=2",
                          "algorithm.prompts_per_step=8", "eval.max_samples=8",
                          "checkpoint.save_final=false", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[rlexp] done: 2 steps" in out.stdout
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    # The sweep and launcher presets ship in the wheel's one config home (conf/ -> rlexp/conf): composed from
    # outside any checkout with no --config-dir.
    out = subprocess.run([str(venv / "bin" / "rlexp"), "train", "+sweeps=grid", "+launchers=local", "--cfg", "hydra"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    hydra_cfg = yaml.safe_load(out.stdout)["hydra"]
    assert hydra_cfg["sweeper"]["params"]["reward"] == "rule,single_rm,weaver,annotated", out.stdout[-3000:]
    assert hydra_cfg["launcher"]["_target_"].endswith("LocalLauncher"), out.stdout[-3000:]

    # A user's project outside the package (examples/my_task) against the installed wheel, as
    # its README runs it from its own folder: a two-seed sweep from its own preset (its first run
    # is the project's `rlexp train`: the same process start, the same phase lines), compare, and
    # a reproduce of that run from elsewhere that finds the project's code again through the
    # manifest alone (hash-checked), bit for bit.
    project = elsewhere / "my_task"
    shutil.copytree(REPO / "examples" / "my_task", project, ignore=shutil.ignore_patterns("__pycache__"))
    small = ["environment=count_a", "reward=near_miss", "steps=2", "algorithm.prompts_per_step=8",
             "algorithm.group_size=4", "eval.every_n_steps=2"]

    def rlexp(*args: str, cwd: Path = project) -> subprocess.CompletedProcess:
        p = subprocess.run([str(venv / "bin" / "rlexp"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, f"rlexp {' '.join(args)}\n" + p.stdout[-3000:] + p.stderr[-3000:]
        return p

    sweep = tmp_path / "my_sweep"
    p = rlexp("train", "-m", "config_path=conf", "+sweeps=two_seeds", *small,
              f"hydra.sweep.dir={sweep}")
    assert sorted(d.name for d in sweep.iterdir() if (d / "metrics.jsonl").is_file()) == ["0", "1"]
    run = sweep / "0"
    rows = [line for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) >= 2 and '"reward/mean"' in rows[-1]
    phases = [line.split(" (")[0][len("[rlexp] "):] for line in p.stderr.splitlines()
              if line.startswith("[rlexp] ") and line.endswith(" s)")]  # one line each, with its time
    first_run = ["started, config composed", "torch and Monarch loaded", "checks done", "hosts up",
                 "processes spawned", "generator0 ready", "trainer ready",
                 "weights loaded, engines ready", "first step done"]
    n = len(first_run)
    assert phases[:n] == first_run and phases[n] == "job 1 started, config composed", \
        p.stderr[-3000:]
    p = rlexp("compare", str(sweep), "--out", str(tmp_path / "my_compare"))
    assert "seed" in p.stdout and (tmp_path / "my_compare" / "compare.md").is_file()
    p = rlexp("reproduce", str(run), "--trust-plugins", cwd=tmp_path)
    assert "reproduced bit for bit" in p.stdout and "plug-in mytask.tasks" in p.stdout, p.stdout[-3000:]
