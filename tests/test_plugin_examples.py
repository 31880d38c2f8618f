"""examples/my_verifier and examples/my_tracker (docs/plugins.md): a verifier kind and a tracker of
a user's own, one module and one YAML each, outside the rlexp package, in a real `rlexp train` of
two steps run from a copy of the example in another folder. The module is found beside the config
folder and named by import path."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, metrics, rlexp, wait_no_orphans

TINY = ["steps=2", "algorithm.prompts_per_step=8", "algorithm.group_size=4", "eval.every_n_steps=0"]


def _copy(example: str, tmp_path: Path) -> Path:
    project = tmp_path / example
    shutil.copytree(
        REPO / "examples" / example, project, ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "elsewhere").mkdir()
    return project


def _plugin(run: Path, module: str) -> dict:
    return next(
        e
        for e in json.loads((run / "manifest.json").read_text())["plugins"]
        if e["module"] == module
    )


@pytest.mark.slow
def test_a_users_verifier_kind_scores_in_weavers_verifier_set(tmp_path: Path, tag: str) -> None:
    project, run = _copy("my_verifier", tmp_path), tmp_path / "run"
    rlexp(
        "train",
        f"config_path=[{project / 'conf'}]",
        "reward=weaver",
        "verifier_set=arithmetic_short",
        *TINY,
        f"hydra.run.dir={run}",
        tag=tag,
        cwd=tmp_path / "elsewhere",
    )
    rows = [r for r in metrics(run) if "weaver/short/pos_rate_batch" in r]
    assert [r["step"] for r in rows] == [
        1,
        2,
    ]  # the user's verifier voted at every step, in the reward process
    assert all(0.0 <= r["weaver/short/pos_rate_batch"] <= 1.0 for r in rows)
    assert "weaver/agree/short__majority" in rows[0]
    assert _plugin(run, "short_answer")["file"] == str(
        project / "short_answer.py"
    )  # recorded, with its hash
    assert wait_no_orphans(tag) == []


@pytest.mark.slow
def test_a_users_tracker_receives_the_runs_metrics(tmp_path: Path, tag: str) -> None:
    project, run = _copy("my_tracker", tmp_path), tmp_path / "run"
    rlexp(
        "train",
        f"config_path=[{project / 'conf'}]",
        "logger=csv",
        *TINY,
        f"hydra.run.dir={run}",
        tag=tag,
        cwd=tmp_path / "elsewhere",
    )
    with (run / "metrics.csv").open() as f:
        got = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(f)}
    want = {
        (r["step"], k): float(v)
        for r in metrics(run)
        if "step" in r
        for k, v in r.items()
        if k.startswith("reward/") and isinstance(v, (int, float))
    }
    assert {s for s, _ in got} == {1, 2} and ("reward/mean" in {n for _, n in got})
    assert got == want  # every reward metric of every step, the values the JSONL file has
    assert _plugin(run, "csv_tracker")["file"] == str(project / "csv_tracker.py")
    assert wait_no_orphans(tag) == []
