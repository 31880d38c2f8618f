"""examples/my_verifier and examples/my_tracker (docs/plugins.md): a verifier kind and a tracker of
a user's own, one module and one YAML each, outside the rlexp package, in a real `rlexp train` of
two steps run from a copy of the example in another folder. The module is found beside the config
folder and named by import path. Both examples share one run (`users_run`): two tests read it."""

from __future__ import annotations

import csv
import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, kill_tagged, metrics, rlexp, wait_no_orphans

TINY = ["steps=2", "algorithm.prompts_per_step=8", "algorithm.group_size=4", "eval.every_n_steps=0"]


def _plugin(run: Path, module: str) -> dict:
    return next(
        e
        for e in json.loads((run / "manifest.json").read_text())["plugins"]
        if e["module"] == module
    )


@dataclass(frozen=True)
class UsersRun:
    run: Path  # its hydra.run.dir
    verifier: Path  # the copy of examples/my_verifier it ran with
    tracker: Path  # the copy of examples/my_tracker
    orphans: list[int]  # processes of the run still alive after it ended


@pytest.fixture(scope="module")
def users_run(tmp_path_factory: pytest.TempPathFactory) -> UsersRun:
    """One run with both examples at once (each `rlexp train` start costs ~15 s): the user's
    verifier kind in Weaver's verifier set, the user's tracker as the logger, both copied out of
    the repository and named by two config_path folders, run from a third folder."""
    base = tmp_path_factory.mktemp("plugin_examples")
    copies = {}
    for example in ("my_verifier", "my_tracker"):
        copies[example] = base / example
        shutil.copytree(REPO / "examples" / example, copies[example],
                        ignore=shutil.ignore_patterns("__pycache__"))
    (base / "elsewhere").mkdir()
    run, tag = base / "run", uuid.uuid4().hex
    try:
        rlexp(
            "train",
            f"config_path=[{copies['my_verifier'] / 'conf'},{copies['my_tracker'] / 'conf'}]",
            "reward=weaver",
            "verifier_set=arithmetic_short",
            "logger=csv",
            *TINY,
            f"hydra.run.dir={run}",
            tag=tag,
            cwd=base / "elsewhere",
        )
        orphans = wait_no_orphans(tag)
    finally:
        kill_tagged(tag)
    return UsersRun(run, copies["my_verifier"], copies["my_tracker"], orphans)


@pytest.mark.slow
def test_a_users_verifier_kind_scores_in_weavers_verifier_set(users_run: UsersRun) -> None:
    run = users_run.run
    rows = [r for r in metrics(run) if "weaver/short/pos_rate_batch" in r]
    assert [r["step"] for r in rows] == [
        1,
        2,
    ]  # the user's verifier voted at every step, in the reward process
    assert all(0.0 <= r["weaver/short/pos_rate_batch"] <= 1.0 for r in rows)
    assert "weaver/agree/short__majority" in rows[0]
    assert _plugin(run, "short_answer")["file"] == str(
        users_run.verifier / "short_answer.py"
    )  # recorded, with its hash
    assert users_run.orphans == []


@pytest.mark.slow
def test_a_users_tracker_receives_the_runs_metrics(users_run: UsersRun) -> None:
    run = users_run.run
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
    assert _plugin(run, "csv_tracker")["file"] == str(users_run.tracker / "csv_tracker.py")
    assert users_run.orphans == []
