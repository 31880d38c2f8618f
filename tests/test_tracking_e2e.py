"""Issues 6 and 15 end to end: a 2x2 sweep of real CPU runs lands in MLflow (read back with MLflow's own client),
in offline W&B run folders, and `rlexp compare` turns it into a table and plots; the runs read well there:
named by their overrides, a sweep parent with aggregates, one clock in every source, the run folder complete."""
from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest

from tests.conftest import metrics, rlexp, wait_no_orphans

pytestmark = pytest.mark.slow  # a 2x2 sweep of real `rlexp train` runs


@pytest.mark.soak  # parent/child names: test_tracking_sweeps; MLflow/W&B readbacks: test_tracking_trackers
def test_sweep_2x2_tracked_in_mlflow_and_wandb_then_compared(tmp_path: Path, tag: str) -> None:
    sweep = tmp_path / "sweep"
    rlexp("train", "-m", "reward=rule,annotated", "seed=0,1", "steps=3", "eval.every_n_steps=3",
          "algorithm.prompts_per_step=8", "logger=all", f"logger.runs_root={tmp_path}", f"hydra.sweep.dir={sweep}",
          tag=tag, timeout=900)
    jobs = sorted(d for d in sweep.iterdir() if (d / "manifest.json").exists())
    assert len(jobs) == 4
    names = {"reward=annotated,seed=0", "reward=annotated,seed=1", "reward=rule,seed=0", "reward=rule,seed=1"}
    refs = {}
    for d in jobs:
        m = json.loads((d / "manifest.json").read_text())
        assert m["status"] == "completed" and m["final_metrics"]["eval/accuracy"] == metrics(d)[-1]["eval/accuracy"]
        assert m["git"]["commit"] and m["packages"]["torch"] and m["seeds"]["data"]
        assert list((d / "wandb").glob("offline-run-*/run-*.wandb")), f"no offline W&B run in {d}"
        name = m["identity"]["run_name"]
        assert ",".join(name.split(",")[:2]) in names  # swept keys first, then the fixed overrides
        assert name.endswith("algorithm.prompts_per_step=8,eval.every_n_steps=3,steps=3")
        refs[name] = m["trackers"]
        # pastable: the job's own command, not the sweep's
        cmd = shlex.split(m["command"])
        assert cmd[:2] == ["rlexp", "train"] and "-m" not in cmd and "reward=rule,annotated" not in cmd
        assert m["system"]["numerics"]["cpu_flags"] and m["system"]["numerics"]["torch"]["blas"]
        rows = metrics(d)
        walls = [r["time/wall_s"] for r in rows]  # every row, step 0's evaluation included
        assert walls == sorted(walls) and walls[0] >= 0 and [r["step"] for r in rows] == [0, 1, 2, 3]
        log = (d / "train.log").read_text()
        assert "actor graph" in log and "step 3/3" in log and "[rlexp] done: 3 steps" in log
        assert "@ step 3" in log and "eval None" not in log and "[actor=" not in log
        tables = [json.loads(x) for x in (d / "tables" / "rollouts.jsonl").read_text().splitlines()]
        assert tables and {t["step"] for t in tables} == {3}  # the last step, though not a multiple of 10

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
    # what the MLflow UI lists, read without a browser: distinct names holding only the swept values
    assert {r.info.run_name for r in children} == names
    assert {refs[r.data.tags["rlexp.run_name"]]["mlflow"]["run_id"] for r in children} == \
        {r.info.run_id for r in children}
    (parent,) = parents
    assert parent.info.run_name == "sweep reward=rule,annotated seed=0,1" and parent.info.status == "FINISHED"
    assert parent.data.tags["rlexp.status"] == "completed" and "rlexp.run_dir" not in parent.data.tags
    assert parent.data.params["sweep.seed"] == "0,1" and "seed" not in parent.data.params
    assert parent.data.metrics["sweep/reward:rule/eval/accuracy/n"] == 2
    rule = [r.data.metrics["eval/accuracy"] for r in children if r.data.params["reward.name"] == "rule"]
    assert parent.data.metrics["sweep/reward:rule/eval/accuracy/mean"] == pytest.approx(sum(rule) / 2)
    assert any(k.startswith("system/") for r in children for k in r.data.metrics)
    assert {d.dataset.name for d in children[0].inputs.dataset_inputs} == {"arithmetic/train", "arithmetic/eval"}
    arts = {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert {".hydra", "metrics.jsonl", "train.log", "eval_samples", "checkpoints", "tables"} <= arts

    # one clock, one name: the folder, MLflow and W&B give the same curves against wall time
    from rlexp.tracking.runs import load_runs

    sources = {"folder": load_runs(str(sweep)), "mlflow": load_runs("mlflow:rlexp", uri),
               "wandb": load_runs(f"wandb:{sweep}")}
    by_name = {src: {r.name: r for r in recs} for src, recs in sources.items()}
    assert set(by_name["folder"]) == set(by_name["mlflow"]) == set(by_name["wandb"]) == set(refs)
    for name in refs:
        for metric in ("reward/mean", "eval/accuracy"):
            curves = [by_name[src][name].series(metric, "wall") for src in sources]
            assert curves[0][0] and curves[0] == curves[1] == curves[2], (name, metric, curves)
        wb = by_name["wandb"][name].manifest["wandb"]
        assert wb["id"] == refs[name]["wandb"]["run_id"] and wb["job_type"] == "train"
        assert {a["name"]: a["type"] for a in wb["artifacts"] if a["type"] != "run_table"} == {
            "checkpoint": "model", "manifest": "manifest", "config": "config"}
    # W&B groups seeds of one configuration; the sweep id is a tag
    assert len({by_name["wandb"][n].manifest["wandb"]["group"] for n in refs}) == 2
    assert all(any(t.startswith("sweep:") for t in by_name["wandb"][n].manifest["wandb"]["tags"]) for n in refs)

    out = tmp_path / "cmp"
    p = rlexp("compare", str(sweep), "--out", str(out), tag=tag)
    assert "Best configuration by eval/accuracy" in p.stdout and "reward.name=rule" in p.stdout
    with open(out / "runs.csv", newline="") as f:
        assert {row["run"] for row in csv.DictReader(f)} == set(refs)  # per-run rows named like the runs
    with open(out / "compare.csv", newline="") as f:
        assert [row["n"] for row in csv.DictReader(f)] == ["2", "2"]  # two configurations of two seeds
    assert list(out.glob("*.csv")) and len(list(out.glob("*.png"))) >= 2
    assert wait_no_orphans(tag) == []
