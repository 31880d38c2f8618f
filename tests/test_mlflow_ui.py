"""The MLflow UI server over a sweep's store answers what its users look for: the runs listed, the winner
sentence on the parent, the curated parent metrics, the experiment kind. A real store written by the real
tracker and the multirun summary, the real `mlflow ui` server on a free loopback port (started and always
stopped by scripts/mlflow_ui_screenshots.py, which also takes the browser screenshots in results/)."""
from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import load_script

pytestmark = pytest.mark.slow  # the server's start-up alone is 10-50 s on two cores


def _write_sweep(tmp_path: Path) -> Path:
    from omegaconf import OmegaConf

    from rlexp.tracking.manifest import Identity, write_start_manifest
    from rlexp.tracking.registry import build_trackers

    sweep = tmp_path / "runs" / "multirun"
    for job, (lr, seed, acc) in enumerate([(1e-3, 0, 0.3), (3e-3, 0, 0.6), (1e-3, 1, 0.35), (3e-3, 1, 0.62)]):
        cfg = OmegaConf.create({"seed": seed, "trainer": {"lr": lr},
                                "logger": {"mlflow": {"enabled": True, "tracking_uri": None, "experiment": "ui",
                                                      "system_metrics": False},
                                           "wandb": {"enabled": False}, "log_every_n_steps": 1,
                                           "rollout_samples": 0, "runs_root": str(tmp_path / "runs")}})
        run = sweep / str(job)
        m = write_start_manifest(run, cfg, ["rlexp", "train"], {"global": seed}, {}, repo_dir=tmp_path)
        m.overrides = [f"trainer.lr={lr}", f"seed={seed}", "steps=2"]
        m.identity = Identity(run_name=f"seed={seed},trainer.lr={lr},steps=2", group="ui", sweep_id="ui",
                              sweep_dir=str(sweep), job_num=job, swept={"trainer.lr": "1e-3,3e-3", "seed": "0,1"})
        with build_trackers(cfg.logger, cfg, run, m) as tr:
            for step in range(2):
                tr.log({"eval/accuracy": acc * (step + 1) / 2, "reward/mean": acc / 2, "loss": 1 - acc,
                        "time/wall_s": float(step)}, step)
    return sweep


def test_ui_server_answers_runs_winner_and_curated_metrics(tmp_path: Path, offline_trackers: None) -> None:
    from rlexp.tracking.cells import md_text
    from rlexp.tracking.mlflow_tracker import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, PARENT_METRICS, local_store_uri
    from rlexp.tracking.sweep_summary import summarise

    sweep = _write_sweep(tmp_path)
    res = summarise(sweep)
    assert res is not None
    ui = load_script("mlflow_ui_screenshots")
    log = tmp_path / "server.log"
    with ui.ui_server(local_store_uri(tmp_path / "runs"), start_timeout_s=240, log_path=log) as base:
        host, port = base.removeprefix("http://").split(":")
        assert host == "127.0.0.1"
        exp, parent, children = ui.sweep_runs(base, "ui")
        assert {t["key"]: t["value"] for t in exp["tags"]}[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
        assert sorted(c["info"]["run_name"] for c in children) == [  # named by what varies only
            "seed=0,trainer.lr=0.001", "seed=0,trainer.lr=0.003", "seed=1,trainer.lr=0.001", "seed=1,trainer.lr=0.003"]
        assert all(c["info"]["status"] == "FINISHED" for c in children) and parent["info"]["status"] == "FINISHED"
        note = ui.tags(parent)["mlflow.note.content"]
        assert note.startswith(md_text(res["verdict"].sentence))  # escaped: MLflow renders it as markdown
        assert note.startswith("Best configuration by eval/accuracy (final, higher is better): trainer.lr=0.003")
        assert ui.tags(parent)["rlexp.winner"] == "trainer.lr=0.003"
        names = sorted(m["key"] for m in parent["data"]["metrics"])
        assert names == sorted(f"sweep/trainer.lr:{lr}/{m}/{s}" for lr in ("0.001", "0.003") for m in PARENT_METRICS
                               for s in ("mean", "std", "n"))
        means = {m["key"]: m["value"] for m in parent["data"]["metrics"]}
        assert means["sweep/trainer.lr:0.003/eval/accuracy/mean"] == pytest.approx(0.61)
        # the page the browser loads is the server's own UI
        with urllib.request.urlopen(f"{base}/", timeout=30) as r:
            assert b"<html" in r.read().lower()
    with socket.socket() as s:  # stopped: nothing listens on the port any more
        s.settimeout(5)
        assert s.connect_ex((host, int(port))) != 0
    assert "Uvicorn running on http://127.0.0.1:" in log.read_text()
