"""A multirun ends with its answer (rlexp.tracking.sweep_summary): the ranked configurations and the winner
printed, `summary.md` and the PNGs in the sweep folder, the winner sentence on the MLflow parent run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlexp.tracking.cells import md_text
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


def test_mlflow_sweep_reads_as_an_answer(tmp_path: Path, offline_trackers: None, capsys) -> None:
    """Experiment kind set (the UI opens on runs), children named by what varies, a short parent metric list
    with the full aggregates as an artifact, and the winner sentence as the parent's description."""
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from rlexp.tracking.manifest import Identity, write_start_manifest
    from rlexp.tracking.mlflow_tracker import local_store_uri
    from rlexp.tracking.registry import build_trackers
    from tests.mlflow_store import fresh_store

    fresh_store(tmp_path / "runs" / "mlruns" / "mlflow.db")  # empty, without the migrations
    sweep = tmp_path / "runs" / "multirun"
    for job, (reward, seed, acc) in enumerate([("rule", 0, 0.3), ("weaver", 0, 0.6), ("rule", 1, 0.35),
                                               ("weaver", 1, 0.62)]):
        cfg = OmegaConf.create({"seed": seed, "steps": 3, "reward": {"name": reward},
                                "logger": {"mlflow": {"enabled": True, "tracking_uri": None, "experiment": "sw"},
                                           "wandb": {"enabled": False}, "log_every_n_steps": 1,
                                           "rollout_samples": 0, "runs_root": str(tmp_path / "runs")}})
        run = sweep / str(job)
        m = write_start_manifest(run, cfg, ["rlexp", "train"], {"global": seed}, {}, repo_dir=tmp_path)
        m.overrides = [f"reward={reward}", f"seed={seed}", "steps=3"]
        m.identity = Identity(run_name=f"reward={reward},seed={seed},steps=3", group="sw", sweep_id="sw",
                              sweep_dir=str(sweep), job_num=job, swept={"reward": "rule,weaver", "seed": "0,1"})
        with build_trackers(cfg.logger, cfg, run, m) as tr:
            for step in range(3):
                tr.log({"eval/accuracy": acc * (step + 1) / 3, "reward/mean": acc / 2, "loss": 1 - acc,
                        "time/wall_s": float(step), **{f"extra/m{i}": float(i) for i in range(20)}}, step)
    client = MlflowClient(tracking_uri=local_store_uri(tmp_path / "runs"))
    exp = client.get_experiment_by_name("sw")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("rlexp.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("rlexp.role") == "child"]
    assert sorted(c.info.run_name for c in children) == ["reward=rule,seed=0", "reward=rule,seed=1",
                                                         "reward=weaver,seed=0", "reward=weaver,seed=1"]
    # MLflow's compare view plots the first 3 params that differ (sorted): the swept keys, not derived seeds
    keys = sorted(set().union(*(c.data.params for c in children)))
    assert [k for k in keys if len({c.data.params.get(k) for c in children}) > 1] == ["reward.name", "seed"]
    assert json.loads(children[0].data.tags["rlexp.seeds"]) == {"global": int(children[0].data.params["seed"])}
    from rlexp.tracking.runs import load_runs  # the full name stays the one every source reads back

    assert sorted(r.name for r in load_runs("mlflow:sw", local_store_uri(tmp_path / "runs"))) == [
        "reward=rule,seed=0,steps=3", "reward=rule,seed=1,steps=3", "reward=weaver,seed=0,steps=3",
        "reward=weaver,seed=1,steps=3"]
    assert sorted(parent.data.metrics) == sorted(f"sweep/reward:{r}/{m}/{s}" for r in ("rule", "weaver")
                                                 for m in ("eval/accuracy", "reward/mean", "time/wall_s")
                                                 for s in ("mean", "std", "n"))
    assert parent.data.metrics["sweep/reward:weaver/eval/accuracy/mean"] == pytest.approx(0.61)
    rows = json.loads(Path(client.download_artifacts(parent.info.run_id, "aggregates.json", str(tmp_path)))
                      .read_text())
    assert {r["metric"] for r in rows} >= {"loss", "extra/m19", "eval/accuracy"}  # the full set, as a file
    capsys.readouterr()
    res = summarise(sweep)
    printed = capsys.readouterr().out  # the parent's link, opening MLflow 3.17's UI on runs rather than GenAI
    assert (f"MLflow sweep run: http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}"
            "?workflowType=machine_learning\n") in printed
    note = client.get_run(parent.info.run_id).data.tags["mlflow.note.content"]
    assert note.startswith(md_text(res["verdict"].sentence)) and "Best configuration by eval/accuracy" in note
    assert note.endswith(parent.data.tags["mlflow.note.content"])  # the sweep's own note kept after it
    assert client.get_run(parent.info.run_id).data.tags["rlexp.winner"] == "reward.name=weaver"


def test_wandb_groups_by_configuration_and_declares_the_result(tmp_path: Path, offline_trackers: None) -> None:
    from omegaconf import OmegaConf

    from rlexp.tracking.manifest import Identity, write_start_manifest
    from rlexp.tracking.registry import build_trackers
    from rlexp.tracking.runs import load_wandb_dir

    sweep = tmp_path / "multirun"
    for job, (reward, seed, accs) in enumerate([("rule", 0, [0.2, 0.5, 0.4]), ("rule", 1, [0.1, 0.3, 0.35])]):
        cfg = OmegaConf.create({"seed": seed, "reward": {"name": reward},
                                "logger": {"wandb": {"enabled": True, "mode": "offline", "project": "p",
                                                     "entity": None, "system_metrics": False},
                                           "mlflow": {"enabled": False}, "log_every_n_steps": 1,
                                           "rollout_samples": 0, "runs_root": None}})
        run = sweep / str(job)
        m = write_start_manifest(run, cfg, ["rlexp", "train"], {"global": seed}, {}, repo_dir=tmp_path)
        m.overrides = [f"reward={reward}", f"seed={seed}", "steps=3"]
        m.identity = Identity(run_name=f"reward={reward},seed={seed},steps=3", group="sw-1", sweep_id="sw-1",
                              sweep_dir=str(sweep), job_num=job)
        with build_trackers(cfg.logger, cfg, run, m) as tr:
            for step, acc in enumerate(accs):
                tr.log({"reward/mean": acc / 2, "time/wall_s": float(step)}, step)
                tr.log({"eval/accuracy": acc}, step)
    recs = load_wandb_dir(sweep)
    assert [r.manifest["wandb"]["group"] for r in recs] == ["reward=rule,steps=3"] * 2  # seeds share a group
    assert all("sweep:sw-1" in r.manifest["wandb"]["tags"] for r in recs)
    meta = recs[0].manifest["wandb"]
    assert meta["defined_metrics"]["eval/*"]["step_metric"] == "step"
    assert meta["defined_metrics"]["eval/accuracy"]["summary"] == ["last", "max"]
    assert meta["summary"]["result/eval_accuracy_final"] == 0.4 and meta["summary"]["result/eval_accuracy_best"] == 0.5
    assert recs[1].manifest["wandb"]["summary"]["result/eval_accuracy_best"] == 0.35
    assert recs[0].series("eval/accuracy") == ([0.0, 1.0, 2.0], [0.2, 0.5, 0.4])  # history unchanged by `step`


def test_last_wandb_run_of_a_sweep_holds_its_compare_table(tmp_path: Path, offline_trackers: None) -> None:
    """The job that finishes last logs the whole sweep's ranked table (W&B cannot append to a finished offline
    run, so it must be a job's own run); read back from the offline files, it says what `rlexp compare` says."""
    from omegaconf import OmegaConf

    from rlexp.tracking.compare import compare
    from rlexp.tracking.manifest import Identity, write_start_manifest
    from rlexp.tracking.registry import build_trackers
    from rlexp.tracking.runs import load_wandb_dir

    sweep = tmp_path / "multirun"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(  # what Hydra writes before the first job: a basic grid of 2
        "hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    params: null\n  overrides:\n    task:\n    - reward=rule,weaver\n    - seed=0\n")
    jobs = [("rule", 0, [0.2, 0.3]), ("weaver", 0, [0.4, 0.6])]  # two W&B runs keep it a unit test
    for job, (reward, seed, accs) in enumerate(jobs):
        cfg = OmegaConf.create({"seed": seed, "reward": {"name": reward},
                                "logger": {"wandb": {"enabled": True, "mode": "offline", "project": "p",
                                                     "entity": None, "system_metrics": False},
                                           "mlflow": {"enabled": False}, "log_every_n_steps": 1,
                                           "rollout_samples": 0, "runs_root": None}})
        run = sweep / str(job)
        m = write_start_manifest(run, cfg, ["rlexp", "train"], {"global": seed}, {}, repo_dir=tmp_path)
        m.overrides = [f"reward={reward}", f"seed={seed}"]
        m.identity = Identity(run_name=f"reward={reward},seed={seed}", group="sw", sweep_id="sw",
                              sweep_dir=str(sweep), job_num=job, swept={"reward": "rule,weaver"})
        with build_trackers(cfg.logger, cfg, run, m) as tr:
            for step, acc in enumerate(accs):
                tr.log({"reward/mean": acc / 2, "eval/accuracy": acc, "time/wall_s": float(step)}, step)
    recs = load_wandb_dir(sweep)
    assert [bool(r.manifest["wandb"]["tables"]) for r in recs] == [False, True]  # the last only
    last = recs[-1]
    table = json.loads((Path(last.source).parent / "files" / last.manifest["wandb"]["tables"]["sweep/compare"])
                       .read_text())
    cols = table["columns"]
    assert cols[:4] == ["rank", "configuration", "reward.name", "n"]
    rows = [dict(zip(cols, r)) for r in table["data"]]
    assert [(r["rank"], r["configuration"], r["n"]) for r in rows] == [(1, "reward.name=weaver", 1),
                                                                        (2, "reward.name=rule", 1)]
    assert rows[0]["eval/accuracy final mean"] == pytest.approx(0.6)  # a number W&B can sort, not text
    res = compare([str(sweep)], tmp_path / "cmp")
    assert last.manifest["wandb"]["summary"]["sweep/winner"] == res["verdict"].sentence
    assert last.manifest["wandb"]["summary"]["sweep/best_configuration"] == "reward.name=weaver"
    assert last.series("eval/accuracy") == ([0.0, 1.0], [0.4, 0.6])  # the table adds no history row
    assert (sweep / ".wandb_sweep_answer").read_text().strip() == last.manifest["wandb"]["id"]
