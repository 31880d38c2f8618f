"""A multirun ends with its answer (rlexp.tracking.sweep_summary): the ranked configurations and the winner
printed, `summary.md` and the PNGs in the sweep folder, the winner sentence on the MLflow parent run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlexp.tracking.sweep_summary import SUMMARY_FILE, summarise
from tests.conftest import rlexp
from tests.test_compare import _sweep


def test_summary_lands_in_the_sweep_folder(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "multirun"
    _sweep(sweep, {"rule": [0.30, 0.35], "weaver": [0.60, 0.62]})
    res = summarise(sweep)
    printed = capsys.readouterr().out
    assert res is not None and res["verdict"].best.label == "reward.name=weaver"
    assert "== sweep summary" in printed and "Best configuration by eval/accuracy (final" in printed
    text = (sweep / SUMMARY_FILE).read_text()
    assert text.startswith("**Best configuration") and "| 1 | reward.name=weaver | 2 |" in text
    assert {p.name for p in sweep.glob("*.png")} == {"eval_accuracy_vs_step.png", "eval_accuracy_vs_wall.png",
                                                    "reward_mean_vs_step.png", "reward_mean_vs_wall.png"}
    # a sweep whose jobs wrote nothing: one line, no exception, nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    assert summarise(empty) is None
    assert capsys.readouterr().out.strip() == f"rlexp: no sweep summary: {empty}: no run folders " \
                                              "(manifest.json / metrics.jsonl) found"
    assert list(empty.iterdir()) == []


@pytest.mark.slow  # four real `rlexp train` runs on CPU
def test_real_2x2_sweep_ends_with_its_answer(tmp_path: Path, tag: str) -> None:
    sweep = tmp_path / "sweep"
    proc = rlexp("train", "-m", "seed=0,1", "trainer.lr=1e-3,2e-3", "steps=3", "eval.every_n_steps=1",
                 "algorithm.prompts_per_step=8", "logger=mlflow", f"logger.runs_root={tmp_path}",
                 f"hydra.sweep.dir={sweep}", tag=tag, timeout=900)
    assert "== sweep summary" in proc.stdout and "configuration" in proc.stdout
    text = (sweep / SUMMARY_FILE).read_text()
    first = text.splitlines()[0]
    assert first.startswith("**Best configuration by eval/accuracy (final, higher is better): trainer.lr=")
    assert "Paired difference over seeds 0, 1:" in first or "Not distinguishable" in first
    assert text.count("| trainer.lr=") == 2 and "| 2 |" in text  # two configurations of two seeds each
    assert (sweep / "eval_accuracy_vs_step.png").stat().st_size > 10_000
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlexp")
    (parent,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("rlexp.role") == "parent"]
    assert parent.data.tags["mlflow.note.content"].startswith(first.strip("*"))
    assert parent.data.tags["rlexp.winner"].startswith("trainer.lr=")
    print(json.dumps({"summary": text}))  # what the sweep printed, for the record
