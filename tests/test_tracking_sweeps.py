"""Multirun tracking through real Hydra: the sweep presets in conf/sweeps/, the logger group in conf/logger, and the
MLflow parent/child runs, with jobs both sequential in one process and in a separate process.

The train app here is a stand-in (a tiny Hydra task that logs a few metrics through the real tracking API and
returns eval/accuracy like the real train function); everything else is the shipped config and code."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

APP = textwrap.dedent('''
    import sys
    from pathlib import Path
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from rlexp.tracking import build_trackers, write_start_manifest

    @hydra.main(version_base="1.3", config_path="conf", config_name="train")
    def main(cfg) -> float:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        # repo_dir: this app's folder (no git), git capture is covered in test_tracking_manifest
        manifest = write_start_manifest(run_dir, cfg, sys.argv, {"global": int(cfg.seed)}, {},
                                        repo_dir=Path(__file__).parent)
        bonus = {"rule": 0.0, "single_rm": 0.1, "weaver": 0.3, "annotated": 0.2}[cfg.reward.name]
        acc = 0.0
        with build_trackers(cfg.logger, cfg, run_dir, manifest) as tr:
            for step in range(3):
                acc = round(0.1 * step + bonus + 0.01 * cfg.seed, 6)
                tr.log({"reward/mean": acc / 2, "eval/accuracy": acc, "time/wall_s": float(step)}, step)
        return acc

    if __name__ == "__main__":
        main()
''')


@pytest.fixture
def app(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    (d / "conf" / "reward").mkdir(parents=True)
    for r in ("rule", "single_rm", "weaver", "annotated"):
        (d / "conf" / "reward" / f"{r}.yaml").write_text(f"name: {r}\n")
    (d / "conf" / "train.yaml").write_text(textwrap.dedent(f"""
        defaults:
          - reward: rule
          - logger: default
          - _self_
        seed: 0
        hydra:
          searchpath:
            - file://{REPO / 'conf'}
    """))
    (d / "train_app.py").write_text(APP)
    return d


def _run(app: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("WANDB_API_KEY", None)
    p = subprocess.run([sys.executable, str(app / "train_app.py"), *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_grid_sweep_mlflow_parent_child_across_processes(app: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    sweep = tmp_path / "runs" / "sweep1"
    # Two jobs, sequential inside one process (Hydra's basic launcher), from the shipped grid preset.
    _run(app, "-m", "+sweeps=grid", "logger=mlflow",
         "reward=rule,weaver", "seed=0",
         f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    # A third job of the same sweep from a separate process: must join the same parent run.
    _run(app, "-m", "logger=mlflow", "reward=annotated", "seed=1", f"hydra.sweep.dir={sweep}",
         "hydra.sweep.subdir=late", cwd=tmp_path)

    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'runs' / 'mlruns' / 'mlflow.db').as_posix()}")
    exp = client.get_experiment_by_name("rlexp")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("rlexp.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("rlexp.role") == "child"]
    assert len(parents) == 1 and len(children) == 3
    parent = parents[0]
    assert parent.data.tags["rlexp.sweep_dir"] == str(sweep.resolve()) and parent.info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.data.tags["choice.reward"] for c in children) == ["annotated", "rule", "weaver"]
    assert len({c.info.run_name for c in children}) == 3 and all(c.info.status == "FINISHED" for c in children)
    # What the MLflow UI shows (read without a browser): each child named by what varies across its sweep
    # (the grid varies reward only; the late job, a sweep of one, keeps all its overrides)
    assert sorted(c.info.run_name for c in children) == ["reward=annotated,seed=1", "reward=rule", "reward=weaver"]
    # The parent is the sweep's: its name and params say what was swept, its status is final, it holds the
    # aggregates of the children's final metrics per configuration and none of a job's own fields
    assert parent.info.run_name == "sweep reward=rule,weaver"
    assert parent.data.params["sweep.reward"] == "rule,weaver" and "reward.name" not in parent.data.params
    assert parent.data.params["seed"] == "0"
    assert parent.data.tags["rlexp.status"] == "completed" and parent.data.tags["rlexp.swept_keys"] == "reward"
    assert not {"rlexp.run_dir", "rlexp.config_sha256", "rlexp.job_num", "rlexp.overrides"} & set(parent.data.tags)
    agg = parent.data.metrics
    assert agg["sweep/reward:rule/eval/accuracy/mean"] == pytest.approx(0.2)  # 0.1 * 2 + 0.0 bonus, seed 0
    assert agg["sweep/reward:weaver/eval/accuracy/n"] == 1
    assert agg["sweep/all/eval/accuracy/mean"] == pytest.approx(0.41)  # the late job: annotated, seed 1
    rows = json.loads(Path(client.download_artifacts(parent.info.run_id, "aggregates.json", str(tmp_path))).read_text())
    rule = next(r for r in rows if (r["config"], r["metric"]) == ("reward=rule", "eval/accuracy"))
    assert rule["n"] == 1 and rule["std"] == 0.0 and rule["values"] == [pytest.approx(0.2)]

    manifests = [json.loads((sweep / j / "manifest.json").read_text()) for j in ("0", "1", "late")]
    assert len({m["identity"]["group"] for m in manifests}) == 1  # W&B group = sweep id, shared
    assert [m["overrides"] for m in manifests[:2]] == [["reward=rule", "seed=0", "+sweeps=grid", "logger=mlflow"],
                                                       ["reward=weaver", "seed=0", "+sweeps=grid", "logger=mlflow"]]
    assert manifests[0]["choices"]["reward"] == "rule" and manifests[0]["choices"]["logger"] == "mlflow"
    assert manifests[0]["hydra"]["mode"] == "MULTIRUN" and manifests[0]["identity"]["job_num"] == 0
    assert manifests[0]["config_sha256"] != manifests[1]["config_sha256"]

    # compare over the sweep folder and over the MLflow experiment
    from rlexp.tracking.compare import main as compare_main

    out = tmp_path / "cmp"
    assert compare_main([str(sweep), "--out", str(out)]) == 0
    header = next(csv.reader((out / "runs.csv").read_text().splitlines()))  # every cell quoted
    assert "reward.name" in header and "seed" in header and "eval/accuracy final" in header
    assert next(csv.reader((out / "compare.csv").read_text().splitlines()))[:5] == [
        "rank", "configuration", "reward.name", "n", "seeds"]
    assert (out / "eval_accuracy_vs_wall.png").stat().st_size > 0
    out2 = tmp_path / "cmp_mlflow"
    assert compare_main(["mlflow:rlexp", "--tracking-uri", client.tracking_uri, "--out", str(out2)]) == 0
    assert len((out2 / "runs.csv").read_text().splitlines()) == 4  # header + 3 children, no parent


@pytest.mark.slow
def test_optuna_preset_maximises_returned_metric(app: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "opt"
    _run(app, "-m", "+sweeps=optuna", "hydra.sweeper.n_trials=3",
         f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    res = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert res["name"] == "optuna"
    accs = [json.loads((d / "manifest.json").read_text())["final_metrics"]["eval/accuracy"]
            for d in sweep.iterdir() if (d / "manifest.json").exists()]
    assert len(accs) == 3 and res["best_value"] == pytest.approx(max(accs))


def test_launcher_and_logger_presets_compose() -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlexp.config.logger import LoggerConfig

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for name, wb, ml in (("default", False, False), ("wandb", True, False), ("mlflow", False, True),
                             ("all", True, True)):
            c = compose(overrides=[f"+logger={name}"])
            merged = OmegaConf.merge(OmegaConf.structured(LoggerConfig), c.logger)  # matches the schema
            assert (merged.wandb.enabled, merged.mlflow.enabled) == (wb, ml)
            assert merged.wandb.mode == "auto"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for name, target in (("slurm", "SlurmLauncher"), ("local", "LocalLauncher")):
            c = compose(overrides=[f"+launchers={name}"], return_hydra_config=True)
            assert c.hydra.launcher._target_.endswith(target)
    k8s = yaml.safe_load((REPO / "conf" / "launchers" / "k8s" / "job.yaml.in").read_text())
    assert k8s["kind"] == "Job" and "rlexp train" in k8s["spec"]["template"]["spec"]["containers"][0]["args"][0]
