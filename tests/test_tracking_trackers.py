"""Trackers against the real backends: JSONL file, MLflow (local SQLite store, read back with MlflowClient),
W&B offline (run folder + transaction log read back). No network: W&B is offline, MLflow is a local file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.tracking.base import JsonlTracker, Tracker, Trackers
from rlexp.tracking.manifest import Identity, Manifest, write_start_manifest
from rlexp.tracking.registry import build_trackers


@pytest.fixture(autouse=True)
def _offline(offline_trackers: None) -> None:
    pass


def _cfg(wandb: bool = False, mlflow: bool = False):
    return OmegaConf.create({
        "seed": 3,
        "model": {"name": "tiny"},
        "reward": {"name": "weaver", "api_key": "sk-should-not-leak"},
        "logger": {"wandb": {"enabled": wandb, "mode": "auto", "project": "rlexp-test", "entity": None},
                   "mlflow": {"enabled": mlflow, "tracking_uri": None, "experiment": "rlexp-test"},
                   "log_every_n_steps": 1, "rollout_samples": 2, "runs_root": None},
    })


def _manifest(run_dir: Path, cfg, choices=None) -> Manifest:
    m = write_start_manifest(run_dir, cfg, ["rlexp", "train"], {"global": 3}, {})
    m.choices = choices or {"model": "tiny", "reward": "weaver", "hydra/launcher": "basic"}
    return m


def test_jsonl_format_and_composite_finish(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = _cfg()
    with build_trackers(cfg.logger, cfg, run, _manifest(run, cfg)) as tr:
        assert [t.name for t in tr] == ["jsonl"]
        tr.log({"reward/mean": 0.25, "loss": 1, "flag": True, "text": "x"}, 0)
        # flushed per line: readable while the run is still going
        assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["reward/mean"] == 0.25
        tr.log({"eval/accuracy": 0.5}, 1)
        tr.log_table("rollouts", [{"prompt": "1+1", "text": "2"}] * 5)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and rows[0]["reward/mean"] == 0.25 and rows[0]["loss"] == 1.0
    assert "text" not in rows[0] and rows[0]["flag"] == 1.0 and "time/unix_s" in rows[0]
    assert rows[1] == {"step": 1, "eval/accuracy": 0.5, "time/unix_s": rows[1]["time/unix_s"],
                       "time/wall_s": rows[1]["time/wall_s"]}
    # one clock on every row, evaluation rows included: seconds since the start, never running backwards
    assert 0 <= rows[0]["time/wall_s"] <= rows[1]["time/wall_s"] < 60
    assert len((run / "tables" / "rollouts.jsonl").read_text().splitlines()) == 2  # rollout_samples cap
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "completed" and m["final_metrics"] == {"reward/mean": 0.25, "loss": 1.0, "flag": 1.0,
                                                                 "eval/accuracy": 0.5}


def test_composite_status_on_errors(tmp_path: Path) -> None:
    for exc, status in ((RuntimeError("boom"), "failed"), (KeyboardInterrupt(), "interrupted"),
                        (SystemExit(143), "interrupted")):
        run = tmp_path / status
        with pytest.raises(type(exc)), Trackers([JsonlTracker()], {}, run, {}) as tr:
            tr.log({"loss": 1.0}, 0)
            raise exc
        assert json.loads((run / "manifest.json").read_text())["status"] == status


@pytest.fixture(scope="module")
def mlflow_root(tmp_path_factory) -> Path:
    """One local store for the MLflow tests: creating the SQLite schema costs seconds (copied from
    tests/mlflow_store.py's empty store, made once per process)."""
    from tests.mlflow_store import fresh_store

    root = tmp_path_factory.mktemp("mlflow")
    fresh_store(root / "runs" / "mlruns" / "mlflow.db")
    return root


def test_mlflow_run_queried_back(tmp_path: Path, mlflow_root: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = mlflow_root / "runs" / "single"
    cfg = _cfg(mlflow=True)
    manifest = _manifest(run, cfg)
    art = run / "eval_results.json"
    with build_trackers(cfg.logger, cfg, run, manifest) as tr:
        ml = tr.get("mlflow")
        for s in range(3):
            tr.log({"reward/mean": 0.1 * s, "loss": 1.0 - 0.1 * s}, s)
        art.write_text('{"accuracy": 0.5}')
        tr.log_artifact(art)
        tr.log_table("rollouts", [{"prompt": "p", "text": "t", "reward": 1.0}])
    uri = f"sqlite:///{(mlflow_root / 'runs' / 'mlruns' / 'mlflow.db').as_posix()}"
    assert ml.uri == uri
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rlexp-test")
    (r,) = client.search_runs([exp.experiment_id], filter_string="tags.`rlexp.status` = 'completed'")
    assert r.info.status == "FINISHED"
    assert r.data.params["seed"] == "3" and r.data.params["model.name"] == "tiny"
    assert r.data.params["reward.api_key"] == "***REDACTED***"
    assert [m.value for m in client.get_metric_history(r.info.run_id, "reward/mean")] == pytest.approx([0, .1, .2])
    assert [m.step for m in client.get_metric_history(r.info.run_id, "loss")] == [0, 1, 2]
    tags = r.data.tags
    assert "mlflow.source.git.commit" in tags and tags["choice.reward"] == "weaver" and tags["choice.model"] == "tiny"
    assert "choice.hydra/launcher" not in tags and tags["rlexp.status"] == "completed"
    assert "mlflow.parentRunId" not in tags
    arts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {"eval_results.json", "manifest.json", "tables"} <= arts
    # the uncommitted diff of tracked files is uploaded exactly when there is one (a CI clone has none)
    assert ("git.diff" in arts) == bool(manifest.git.diff_file)
    local = Path(client.download_artifacts(r.info.run_id, "manifest.json", str(tmp_path / "dl")))
    assert json.loads(local.read_text())["status"] == "completed"  # the final manifest was uploaded
    assert "sk-should-not-leak" not in (mlflow_root / "runs" / "mlruns" / "mlflow.db").read_bytes().decode("latin-1")


def test_mlflow_failed_run_status(mlflow_root: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = mlflow_root / "runs" / "bad"
    cfg = _cfg(mlflow=True)
    with pytest.raises(RuntimeError), build_trackers(cfg.logger, cfg, run, _manifest(run, cfg)) as tr:
        tr.log({"loss": 1.0}, 0)
        raise RuntimeError("diverged")
    client = MlflowClient(tracking_uri=tr.get("mlflow").uri)
    (r,) = client.search_runs([client.get_experiment_by_name("rlexp-test").experiment_id],
                              filter_string="attributes.run_name = 'run-runs_bad'")
    assert r.info.status == "FAILED" and r.data.tags["rlexp.status"] == "failed"


def test_wandb_offline_run_folder(tmp_path: Path) -> None:
    from rlexp.tracking.runs import load_wandb_dir

    run = tmp_path / "runs" / "wb"
    cfg = _cfg(wandb=True)
    manifest = _manifest(run, cfg)
    with build_trackers(cfg.logger, cfg, run, manifest) as tr:
        for s in range(3):
            tr.log({"reward/mean": 0.5 + s, "eval/accuracy": 0.1 * s}, s)
        tr.log_table("rollouts", [{"prompt": "1+1", "text": "2", "reward": 1.0}])
    (offline,) = list((run / "wandb").glob("offline-run-*"))
    files = {p.name for p in offline.rglob("*") if p.is_file()}
    assert any(f.endswith(".wandb") for f in files) and "debug.log" in files
    assert any(f.startswith("rollouts") and f.endswith(".table.json") for f in files)
    (rec,) = load_wandb_dir(run / "wandb")
    assert rec.name == manifest.identity.run_name and rec.status == "completed"
    assert rec.series("reward/mean") == ([0.0, 1.0, 2.0], [0.5, 1.5, 2.5])
    assert rec.config["model.name"] == "tiny" and rec.config["reward.api_key"] == "***REDACTED***"
    meta = rec.manifest["wandb"]
    assert meta["group"] == "defaults" and meta["project"] == "rlexp-test"  # no override but the seed
    assert sorted(meta["tags"]) == ["model=tiny", "reward=weaver"]  # Hydra's own groups are not tags


def test_wandb_multirun_jobs_are_separate_runs_in_one_process(tmp_path: Path) -> None:
    """Hydra's basic launcher runs jobs in one process: each job must get its own, finished W&B run."""
    from rlexp.tracking.compare import main as compare_main

    sweep = tmp_path / "multirun"
    cfg = _cfg(wandb=True)
    names = []
    for job, reward in enumerate(("rule", "weaver")):
        run = sweep / str(job)
        m = _manifest(run, cfg, {"reward": reward})
        m.overrides = [f"reward={reward}", "seed=3"]
        m.identity = Identity(run_name=f"train-sw-{job}", group="sw", sweep_id="sw", sweep_dir=str(sweep),
                              job_num=job)
        names.append(m.identity.run_name)
        with build_trackers(cfg.logger, cfg, run, m) as tr:
            tr.log({"reward/mean": float(job), "eval/accuracy": 0.5 + job / 10}, 0)
            tr.log({"reward/mean": float(job) + 1, "eval/accuracy": 0.6 + job / 10}, 1)
    offline = sorted(sweep.glob("*/wandb/offline-run-*"))
    assert len(offline) == 2 and offline[0].name.split("-")[-1] != offline[1].name.split("-")[-1]
    out = tmp_path / "cmp"
    assert compare_main([f"wandb:{sweep}", "--out", str(out)]) == 0
    text = (out / "runs.csv").read_text()
    assert all(n in text for n in names) and "completed" in text
    from rlexp.tracking.runs import load_wandb_dir

    recs = load_wandb_dir(sweep)
    # group = the configuration (overrides but the seed); the sweep id is a tag
    assert [r.manifest["wandb"]["group"] for r in recs] == ["reward=rule", "reward=weaver"]
    assert [r.manifest["wandb"]["tags"] for r in recs] == [["reward=rule", "sweep:sw"], ["reward=weaver", "sweep:sw"]]
    assert (out / "eval_accuracy_vs_step.png").exists()


def test_truncate_metrics_for_resume(tmp_path: Path) -> None:
    from rlexp.run.checkpoints import truncate_metrics

    run = tmp_path / "r"
    with Trackers([JsonlTracker()], {}, run, {}, manage_manifest=False) as tr:
        for s in range(5):
            tr.log({"loss": float(s)}, s)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss"')  # cut by a crash
    assert truncate_metrics(run, 2) == 3
    with Trackers([JsonlTracker()], {}, run, {}, manage_manifest=False) as tr:
        tr.log({"loss": 3.0}, 3)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]


class _FlakyRemoteTracker(Tracker):  # a Tracker whose backend is down (fake: no server here)
    name = "flaky"

    def __init__(self) -> None:
        self.finished_with: str | None = None

    def start(self, cfg, run_dir, manifest) -> None:
        pass

    def log(self, metrics, step) -> None:
        raise ConnectionError("tracking server unreachable")

    def finish(self, status: str) -> None:
        self.finished_with = status


def test_remote_tracker_errors_do_not_kill_the_run_fake_backend(tmp_path: Path) -> None:
    flaky = _FlakyRemoteTracker()
    run = tmp_path / "r"
    with Trackers([JsonlTracker(), flaky], {}, run, {}) as tr:
        tr.log({"loss": 1.0}, 0)
        tr.log({"loss": 0.5}, 1)
    assert flaky.finished_with == "completed"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((run / "manifest.json").read_text())["final_metrics"] == {"loss": 0.5}


def _run_files(run: Path) -> None:
    """The files a real run leaves in its folder, for the upload at finish."""
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 3\n")
    (run / "train.log").write_text("[rlexp] done: 2 steps\n")
    (run / "eval_samples").mkdir(exist_ok=True)
    (run / "eval_samples" / "step_2.jsonl").write_text('{"response": "4"}\n')


def _checkpoint(run: Path) -> Path:
    ckpt = run / "checkpoints" / "final"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "config.json").write_text('{"model_type": "qwen3"}')
    (ckpt / "model.safetensors").write_bytes(b"\0" * 16)
    return ckpt


def test_mlflow_as_users_expect(tmp_path: Path, mlflow_root: Path) -> None:
    """System metrics from MLflow's own sampler, datasets with the manifest's hashes, the run folder's files,
    the checkpoint under checkpoints/ and registered, rollout tables appended per step, ids in the manifest."""
    import time

    from mlflow.tracking import MlflowClient

    run = mlflow_root / "runs" / "users"
    cfg = _cfg(mlflow=True)
    cfg.logger.mlflow.registered_model = "rlexp-policy"
    cfg.logger.system_metrics_interval_s = 0.2
    manifest = _manifest(run, cfg)
    manifest.identity.run_name = "reward=weaver,seed=3"
    manifest.datasets = {"arithmetic/train": {"n": 5, "sha256": "ab" * 32},
                            "arithmetic/eval": {"n": 2, "sha256": "cd" * 32}}
    with build_trackers(cfg.logger, cfg, run, manifest) as tr:
        ml = tr.get("mlflow")
        tr.log({"reward/mean": 0.1}, 1)
        tr.log_table("rollouts", [{"prompt": "1+1", "response": "2", "reward": 1.0}], 1)
        time.sleep(1.0)  # a few sampling periods
        tr.log({"reward/mean": 0.2}, 2)
        tr.log_table("rollouts", [{"prompt": "2+2", "response": "4", "reward": 1.0}], 2)
        tr.log_artifact(_checkpoint(run), kind="checkpoint")
        _run_files(run)
    client = MlflowClient(tracking_uri=ml.uri)
    r = client.get_run(json.loads((run / "manifest.json").read_text())["trackers"]["mlflow"]["run_id"])
    assert r.info.run_name == "reward=weaver,seed=3" and r.info.status == "FINISHED"
    assert any(k.startswith("system/cpu_utilization") for k in r.data.metrics), sorted(r.data.metrics)
    got = {d.dataset.name: d for d in r.inputs.dataset_inputs}
    assert got["arithmetic/train"].dataset.digest == "ab" * 16
    assert json.loads(got["arithmetic/train"].dataset.profile) == {"sha256": "ab" * 32, "num_rows": 5}
    assert {t.value for d in got.values() for t in d.tags if t.key == "mlflow.data.context"} == {"train", "eval"}
    arts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {".hydra", "metrics.jsonl", "train.log", "eval_samples", "manifest.json", "checkpoints", "tables"} <= arts
    assert [a.path for a in client.list_artifacts(r.info.run_id, "checkpoints")] == ["checkpoints/final"]
    (mv,) = client.search_model_versions("name = 'rlexp-policy'")
    assert mv.run_id == r.info.run_id and mv.source.endswith("checkpoints/final")
    local = client.download_artifacts(r.info.run_id, "tables/rollouts.json", str(tmp_path))
    table = json.loads(Path(local).read_text())
    steps = [row[table["columns"].index("step")] for row in table["data"]]
    assert steps == [1, 2]  # appended per call, each row with its step
    ref = json.loads((run / "manifest.json").read_text())["trackers"]["mlflow"]
    assert ref["url"].endswith(f"#/experiments/{r.info.experiment_id}/runs/{r.info.run_id}"
                               "?workflowType=machine_learning")  # MLflow 3.17's UI would open on GenAI
    assert ref["open"] == f"mlflow ui --backend-store-uri {ml.uri}"


def _wandb_run(run: Path, cfg, name: str) -> dict:
    manifest = _manifest(run, cfg)
    manifest.identity.run_name = name
    with build_trackers(cfg.logger, cfg, run, manifest) as tr:
        import time

        tr.log({"reward/mean": 0.5}, 1)
        tr.log_table("rollouts", [{"prompt": "1+1", "response": "2", "reward": 1.0}], 1)
        time.sleep(1.5)  # a few sampling periods
        tr.log({"reward/mean": 0.7}, 2)
        tr.log_artifact(_checkpoint(run), kind="checkpoint")
        _run_files(run)
    return json.loads((run / "manifest.json").read_text())


def test_wandb_as_users_expect(tmp_path: Path) -> None:
    """Stable artifact names (one collection each, versioned across runs), the checkpoint as a model, git and
    system metrics in W&B's own records, switchable off; the offline folder recorded in the manifest."""
    from rlexp.tracking.runs import load_wandb_dir

    cfg = _cfg(wandb=True)
    cfg.logger.system_metrics_interval_s = 0.5
    recs = []
    for i in range(2):
        m = _wandb_run(tmp_path / "runs" / f"r{i}", cfg, f"seed={i}")
        (rec,) = load_wandb_dir(tmp_path / "runs" / f"r{i}" / "wandb")
        assert m["trackers"]["wandb"]["run_id"] == rec.manifest["wandb"]["id"] and rec.name == f"seed={i}"
        assert Path(m["trackers"]["wandb"]["dir"]).is_dir() and m["trackers"]["wandb"]["mode"] == "offline"
        recs.append(rec)
    for rec in recs:
        meta = rec.manifest["wandb"]
        arts = {a["name"]: a for a in meta["artifacts"] if a["type"] != "run_table"}
        assert {n: a["type"] for n, a in arts.items()} == {"checkpoint": "model", "manifest": "manifest",
                                                           "config": "config"}
        assert "model.safetensors" in arts["checkpoint"]["files"] and "manifest.json" in arts["manifest"]["files"]
        assert arts["config"]["files"] == [".hydra/config.yaml"]
        assert meta["git"]["commit"] and meta["git"]["commit"] == json.loads(
            (tmp_path / "runs" / "r0" / "manifest.json").read_text())["git"]["commit"]
        assert meta["job_type"] == "train" and "cpu" in meta["stats"]  # W&B's own system metrics
    cfg.logger.wandb.system_metrics = False
    cfg.logger.wandb.git = False
    _wandb_run(tmp_path / "runs" / "off", cfg, "off")
    (off,) = load_wandb_dir(tmp_path / "runs" / "off" / "wandb")
    assert off.manifest["wandb"]["stats"] == [] and off.manifest["wandb"]["git"]["commit"] == ""


def test_resumed_run_continues_its_clock(tmp_path: Path) -> None:
    """A resumed run appends to metrics.jsonl; its `time/wall_s` goes on from the last logged value."""
    from rlexp.run.checkpoints import truncate_metrics

    run = tmp_path / "r"
    with Trackers([JsonlTracker()], {}, run, {}, manage_manifest=False) as tr:
        for s in range(3):
            tr.log({"loss": 1.0, "time/wall_s": 10.0 * s}, s)  # as if 10 s per step
        tr.log({"loss": 1.0, "time/wall_s": 99.0}, 3)  # lost with the crash: truncated below
    truncate_metrics(run, 2)
    with Trackers([JsonlTracker()], {}, run, {}, manage_manifest=False) as tr:
        tr.start_clock()
        tr.log({"loss": 0.5}, 3)
    walls = [json.loads(x)["time/wall_s"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert walls[:3] == [0.0, 10.0, 20.0] and 20.0 <= walls[3] < 30.0


# --------------------------------------------------------------------------------------------- issue 20: modes, stores
@pytest.mark.parametrize(("explicit", "env", "expected"), [
    ("auto", {"WANDB_API_KEY": "k" * 40}, "online"),
    ("auto", {}, "offline"),
    ("auto", {"WANDB_API_KEY": "k" * 40, "WANDB_MODE": "offline"}, "offline"),  # the user said offline
    ("auto", {"WANDB_API_KEY": "k" * 40, "WANDB_MODE": "dryrun"}, "offline"),
    ("auto", {"WANDB_API_KEY": "k" * 40, "WANDB_MODE": "disabled"}, "disabled"),
    ("auto", {"WANDB_API_KEY": "k" * 40, "WANDB_DISABLED": "true"}, "disabled"),
    ("auto", {"WANDB_MODE": "online", "WANDB_DISABLED": "1"}, "disabled"),
    ("auto", {"WANDB_API_KEY": "k" * 40, "WANDB_DISABLED": "false"}, "online"),
    ("offline", {"WANDB_API_KEY": "k" * 40, "WANDB_MODE": "online"}, "offline"),  # the config says more
    ("online", {"WANDB_MODE": "offline"}, "online"),
    ("disabled", {"WANDB_MODE": "online"}, "disabled"),
])
def test_wandb_mode_precedence(explicit: str, env: dict, expected: str) -> None:
    from rlexp.tracking.wandb_tracker import resolve_mode

    assert resolve_mode(explicit, env) == expected


def test_wandb_mode_rejects_an_unknown_env_value() -> None:
    from rlexp.tracking.wandb_tracker import resolve_mode

    with pytest.raises(ValueError, match="WANDB_MODE='ofline' is not a W&B mode"):
        resolve_mode("auto", {"WANDB_MODE": "ofline"})


def test_wandb_offline_env_wins_over_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WANDB_MODE=offline with a (fake) key set: the real W&B writes an offline run folder and makes no
    connection. The W&B server and every HTTP(S) proxy point at a local listener that records connections."""
    from tests.conftest import NetListener

    net = NetListener()
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{net.port}")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "15")  # before the fix: fail in seconds, not minutes
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{net.port}")
    run = tmp_path / "runs" / "keyed"
    cfg = _cfg(wandb=True)
    try:
        with build_trackers(cfg.logger, cfg, run, _manifest(run, cfg)) as tr:
            tr.log({"loss": 1.0}, 0)
            ref = tr.get("wandb").ref()
    finally:
        net.close()
    assert net.seen == [], f"W&B went online: {net.seen}"
    assert ref["mode"] == "offline" and ref["url"] is None
    assert not list((run / "wandb").glob("run-*"))  # no online run folder
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))


def test_wandb_disabled_env_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_DISABLED", "true")
    run = tmp_path / "runs" / "off"
    cfg = _cfg(wandb=True)
    with build_trackers(cfg.logger, cfg, run, _manifest(run, cfg)) as tr:
        tr.log({"loss": 1.0}, 0)
    assert not (run / "wandb").exists()
    assert "wandb" not in (json.loads((run / "manifest.json").read_text()).get("trackers") or {})


def test_mlflow_user_sqlite_store_keeps_artifacts_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLFLOW_TRACKING_URI=sqlite:///... without an artifact location: MLflow alone would write the artifacts to
    `./mlruns` of the launch directory; they go to `<store dir>/artifacts`, and the launch directory stays empty."""
    from mlflow.tracking import MlflowClient

    work, store = tmp_path / "work", tmp_path / "store" / "mlflow.db"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    run = tmp_path / "runs" / "userstore"
    cfg = _cfg(mlflow=True)
    with build_trackers(cfg.logger, cfg, run, _manifest(run, cfg)) as tr:
        art = run / "eval_results.json"
        art.write_text('{"accuracy": 0.5}')
        tr.log_artifact(art)
    assert list(work.iterdir()) == []
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (r,) = client.search_runs([client.get_experiment_by_name("rlexp-test").experiment_id])
    assert r.info.artifact_uri.startswith((store.parent / "artifacts").as_uri())
    assert (store.parent / "artifacts" / "rlexp-test" / r.info.run_id / "artifacts" / "eval_results.json").is_file()


def test_mlflow_first_metric_is_the_result_not_system_use(tmp_path: Path, mlflow_root: Path) -> None:
    """MLflow lists a run's metrics in first-logged order and its compare view plots the first: with the sampler
    running through the actors' start-up that was system/cpu_utilization_percentage (seen on a real sweep)."""
    import time

    from mlflow.tracking import MlflowClient

    run = mlflow_root / "runs" / "first_metric"
    cfg = _cfg(mlflow=True)
    cfg.logger.system_metrics_interval_s = 0.2
    with build_trackers(cfg.logger, cfg, run, _manifest(run, cfg)) as tr:
        time.sleep(1.5)  # start-up: several sampling periods before the first metrics
        tr.log({"buffer/size": 4.0, "loss": 0.5, "eval/accuracy": 0.25, "reward/mean": 0.1}, 0)
        run_id = tr.get("mlflow").run_id
    client = MlflowClient(tracking_uri=f"sqlite:///{mlflow_root / 'runs' / 'mlruns' / 'mlflow.db'}")
    (got,) = [r for r in client.search_runs([client.get_run(run_id).info.experiment_id])
              if r.info.run_id == run_id]
    keys = list(got.data.metrics)
    assert keys[:2] == ["eval/accuracy", "reward/mean"]
    assert any(k.startswith("system/") for k in keys)  # still sampled, after the result
