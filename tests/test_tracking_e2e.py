"""Issue 6 end to end: a 2x2 sweep of real CPU runs lands in MLflow (read back with MLflow's own client),
in offline W&B run folders, and `rlexp compare` turns it into a table and plots."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import metrics, rlexp, wait_no_orphans

pytestmark = pytest.mark.slow  # a 2x2 sweep of real `rlexp train` runs


def test_sweep_2x2_tracked_in_mlflow_and_wandb_then_compared(tmp_path: Path, tag: str) -> None:
    sweep = tmp_path / "sweep"
    rlexp("train", "-m", "reward=rule,annotated", "seed=0,1", "steps=3", "eval.every_n_steps=3",
          "algorithm.prompts_per_step=8", "logger=all", f"logger.runs_root={tmp_path}", f"hydra.sweep.dir={sweep}",
          tag=tag, timeout=900)
    jobs = sorted(d for d in sweep.iterdir() if (d / "manifest.json").exists())
    assert len(jobs) == 4
    for d in jobs:
        m = json.loads((d / "manifest.json").read_text())
        assert m["status"] == "completed" and m["final_metrics"]["eval/accuracy"] == metrics(d)[-1]["eval/accuracy"]
        assert m["git"]["commit"] and m["packages"]["torch"] and m["seeds"]["data"]
        assert list((d / "wandb").glob("offline-run-*/run-*.wandb")), f"no offline W&B run in {d}"

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rlexp")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("rlexp.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and len(children) == 4
    for r in children:
        assert r.info.status == "FINISHED"
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert "mlflow.source.git.commit" in r.data.tags
        assert "reward/mean" in r.data.metrics and "eval/accuracy" in r.data.metrics
        assert len(client.get_metric_history(r.info.run_id, "reward/mean")) == 3
    assert {r.data.params["reward.name"] for r in children} == {"rule", "annotated"}

    out = tmp_path / "cmp"
    p = rlexp("compare", str(sweep), "--out", str(out), tag=tag)
    assert "reward" in p.stdout and "seed" in p.stdout
    assert list(out.glob("*.csv")) and len(list(out.glob("*.png"))) >= 2
    assert wait_no_orphans(tag) == []
