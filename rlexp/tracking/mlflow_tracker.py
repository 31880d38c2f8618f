"""MLflow tracker (client API only, never the fluent `mlflow.start_run` global stack).

- Store: `logger.mlflow.tracking_uri`, else MLFLOW_TRACKING_URI, else a local SQLite store
  `sqlite:///<runs_root>/mlruns/mlflow.db` with artifacts in `<runs_root>/mlruns/artifacts/`. A SQLite store
  the user names gets its artifacts beside it too (`<db dir>/artifacts/<experiment>`), never in the cwd.
  MLflow 3.17 refuses the plain file store by default (maintenance mode), and SQLite needs no server.
  Open it with `mlflow ui --backend-store-uri sqlite:///<runs_root>/mlruns/mlflow.db` (the URI is in the
  manifest, `trackers.mlflow.tracking_uri`).
- Run names come from the overrides (`reward=rule,seed=0`, see hydra_run.run_identity).
- Multirun: one *parent* run per sweep, found by the tag `rlexp.sweep_dir` (plus `rlexp.role=parent`) under an
  flock in the sweep dir, so it is created exactly once whether the jobs run sequentially in one process
  (Hydra's basic launcher) or in separate processes (submitit/joblib). Each job is a child run
  (`mlflow.parentRunId`). The parent is the sweep's, not a job's: named after the swept values, its params are
  the config every job shares plus `sweep.<key>` = the swept values, and no job's run folder or config hash.
  It is set RUNNING while a child runs and, when no child is running, to the worst child status
  (FAILED > KILLED > FINISHED, and the tag `rlexp.status` with it), with aggregates of the children's final
  metrics per configuration (the swept keys but the seed): `sweep/<config>/<metric>/mean|std|n` metrics for
  the few `PARENT_METRICS` (held-out accuracy first) and every metric in an `aggregates.json` table. Children
  are named by the overrides that vary across the sweep only. The experiment carries
  `mlflow.experimentKind=custom_model_development`, so MLflow 3's UI opens on runs, not GenAI traces. The
  winner sentence goes into the parent's description when the sweep ends (rlexp.tracking.sweep_summary).
- Every run ends in `finish()` with FINISHED / FAILED / KILLED from the rlexp status.
- As MLflow users expect: system metrics from MLflow's own sampler (`system/*`, needs psutil), the manifest's
  dataset hashes as MLflow datasets (digest = the first 32 hex of the sha256, the full hash in the profile),
  the checkpoint under `checkpoints/` (registered as a model version when `logger.mlflow.registered_model`
  is set), `.hydra/`, `metrics.jsonl`, `train.log`, eval samples and rollout tables (`tables/rollouts.json`,
  one row per rollout with its step) as artifacts.
- Secrets: params and tags come from the redacted manifest, passed through `redact` once more (never from the
  raw `cfg`); the tracking URI itself (it may carry `user:pass@`) is only used to connect, never recorded.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlexp.core.runfolder import artifact_files

from .base import Tracker, register_tracker, safe_name, setting
from .files import file_lock
from .hydra_run import group_tags, name_from_overrides
from .manifest import Identity, Manifest
from .redact import redact, redact_text
from .runconfig import RUN_LOCAL_ANY_KEYS, RUN_LOCAL_TOP_KEYS
from .runs import flatten

log = logging.getLogger(__name__)

STATUS_MAP = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
RLEXP_STATUS = {v: k for k, v in STATUS_MAP.items()}
_SEVERITY = {"FINISHED": 0, "KILLED": 1, "FAILED": 2}
PARAM_VALUE_MAX = 6000
AGGREGATES_FILE = "aggregates.json"
# MLflow 3 opens an experiment without this tag on its GenAI traces page; the tag and value are the ones its
# UI reads (mlflow/server/js: ExperimentKind.CUSTOM_MODEL_DEVELOPMENT), so the UI opens on the runs table.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# MLflow 3.17's UI has a global GenAI / Model training switch (default GenAI, kept in the browser's storage)
# that wins over the tag: seen in headless Chromium, the tagged experiment opened on GenAI's Overview. The
# switch also reads this query, so the links rlexp records open on the runs and set it for the next visit.
UI_VIEW = "?workflowType=machine_learning"
# The parent run's metrics: these few per configuration (mean/std/n), held-out accuracy first; every metric's
# aggregate stays in the aggregates.json artifact. Hundreds of metrics in the parent bury the answer.
PARENT_METRICS = ("eval/accuracy", "reward/mean", "time/wall_s")


def default_runs_root(run_dir: Path, manifest: Manifest) -> Path:
    sweep = manifest.identity.sweep_dir
    return Path(sweep).parent if sweep else Path(run_dir).resolve().parent


def local_store_uri(runs_root: str | os.PathLike[str]) -> str:
    return f"sqlite:///{(Path(runs_root).resolve() / 'mlruns' / 'mlflow.db').as_posix()}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///<path>` URI (absolute as `sqlite:////abs/x.db`, else relative to the
    working directory, as SQLAlchemy reads it); None for any other store or an in-memory database."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path).resolve() if path and path != ":memory:" else None


def _param_str(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= PARAM_VALUE_MAX else s[: PARAM_VALUE_MAX - 3] + "..."


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _metric_name(s: str) -> str:
    """MLflow metric names allow letters, digits, `_-. /:` only: `reward=rule,lr=1e-3` -> `reward:rule lr:1e-3`."""
    s = s.replace("=", ":").replace(",", " ")
    return "".join(c if c.isalnum() or c in "_-. /:" else "_" for c in s)


def _sweep_params(config: Mapping[str, Any], swept: Mapping[str, str]) -> dict[str, Any]:
    """The config every job of the sweep shares: a job's config minus what the swept keys decide (a swept group
    `reward` decides `reward.*`) and minus where the job lives."""
    out = {}
    for k, v in flatten(config).items():
        parts = k.split(".")
        if parts[0] in RUN_LOCAL_TOP_KEYS or any(p in RUN_LOCAL_ANY_KEYS for p in parts):
            continue
        if any(k == s or k.startswith(s + ".") for s in swept):
            continue
        out[k] = v
    return out


def aggregate(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread of final metrics per configuration. `children`: [{"config": label, "metrics": {...}}].
    std is the sample standard deviation (n-1; 0 for one run)."""
    groups: dict[str, dict[str, list[float]]] = {}
    for c in children:
        g = groups.setdefault(c["config"], {})
        for k, v in c["metrics"].items():
            g.setdefault(k, []).append(float(v))
    rows = []
    for config, metrics in groups.items():
        for k, vals in sorted(metrics.items()):
            rows.append({"config": config, "metric": k, "n": len(vals), "mean": statistics.fmean(vals),
                         "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "values": vals})
    return rows


@register_tracker("mlflow")
@dataclass
class MlflowTracker(Tracker):
    tracking_uri: str | None = None
    experiment: str = "rlexp"
    runs_root: str | None = None
    system_metrics: bool = True
    system_metrics_interval_s: float = 10.0
    registered_model: str | None = None
    section = "mlflow"  # logger.mlflow (rlexp/config/logger.py MlflowConfig)

    def __post_init__(self) -> None:
        self.client: Any = None
        self.run_id: str | None = None
        self.parent_id: str | None = None
        self.uri: str | None = None
        self.experiment_id: str | None = None
        self.monitor: Any = None
        self._sampler_due = False
        self.model_version: str | None = None
        self.run_dir: Path | None = None  # artifacts are only regular files inside it

    @classmethod
    def from_logger(cls, options: Any, logger_cfg: Any) -> MlflowTracker:
        interval = setting(logger_cfg, "system_metrics_interval_s")
        return cls.from_config(options, runs_root=setting(logger_cfg, "runs_root"),
                               system_metrics_interval_s=interval)

    @classmethod
    def from_config(cls, c: Any, runs_root: str | None = None,
                    system_metrics_interval_s: float | None = None) -> MlflowTracker:
        get = c.get if isinstance(c, Mapping | DictConfig) else lambda k, d=None: getattr(c, k, d)
        return cls(tracking_uri=get("tracking_uri", None), experiment=get("experiment", "rlexp"), runs_root=runs_root,
                   system_metrics=bool(get("system_metrics", True)),
                   system_metrics_interval_s=float(system_metrics_interval_s or 10.0),
                   registered_model=get("registered_model", None))

    def ref(self) -> dict[str, Any]:
        if self.run_id is None:
            return {}
        uri = redact_text(self.uri or "")
        path = f"#/experiments/{self.experiment_id}/runs/{self.run_id}{UI_VIEW}"
        remote = uri.startswith(("http://", "https://"))
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "experiment": self.experiment,
                "parent_run_id": self.parent_id, "tracking_uri": uri,
                "url": f"{uri.rstrip('/')}/{path}" if remote else f"http://127.0.0.1:5000/{path}",
                "open": None if remote else f"mlflow ui --backend-store-uri {uri}"}

    # ----------------------------------------------------------------------------------------- setup
    def _resolve_store(self, run_dir: Path, manifest: Manifest) -> tuple[str, Path | None]:
        """(uri, local folder that holds the store's artifacts and locks, or None for a remote store).

        A SQLite URI the user gave (config or MLFLOW_TRACKING_URI) keeps its artifacts beside the database: MLflow
        would put a new experiment's artifacts in `./mlruns` of whatever directory the run was launched from."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            db = sqlite_path(uri)
            if db is None:
                return uri, None
            db.parent.mkdir(parents=True, exist_ok=True)
            return uri, db.parent
        root = Path(self.runs_root) if self.runs_root else default_runs_root(run_dir, manifest)
        mlruns = root.resolve() / "mlruns"
        mlruns.mkdir(parents=True, exist_ok=True)
        return local_store_uri(root), mlruns

    def _experiment_id(self, mlruns: Path | None) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            if EXPERIMENT_KIND_TAG not in exp.tags:  # never overrides a kind someone chose in the UI
                self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return exp.experiment_id
        kwargs = {"artifact_location": (mlruns / "artifacts" / safe_name(self.experiment)).as_uri()} if mlruns else {}
        try:
            return self.client.create_experiment(self.experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
                                                 **kwargs)
        except Exception:  # created concurrently by another job
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def _find_or_create_parent(self, ident: Identity, manifest: Manifest, lock_dir: Path | None = None) -> str:
        from mlflow.entities import Param

        sweep_dir = str(ident.sweep_dir)
        swept = dict(ident.swept)
        with file_lock(Path(lock_dir or sweep_dir) / ".mlflow_parent.lock"):
            found = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`rlexp.sweep_dir` = {_quote(sweep_dir)} and tags.`rlexp.role` = 'parent'",
                max_results=1,
            )
            if found:
                return found[0].info.run_id
            git = manifest.git
            tags = {"rlexp.role": "parent", "rlexp.sweep_dir": sweep_dir, "rlexp.sweep_id": str(ident.sweep_id),
                    "rlexp.swept_keys": ",".join(sorted(swept)), "rlexp.status": "running",
                    "mlflow.source.git.commit": str(git.commit or ""), "mlflow.source.type": "LOCAL",
                    "mlflow.note.content": "Sweep " + (" ".join(f"{k}={v}" for k, v in sorted(swept.items()))
                                                      or str(ident.sweep_id))
                    + f"; folder {sweep_dir}. Metrics: mean, std and n of the children's final values per "
                      "configuration (sweep/<config>/<metric>/...); table aggregates.json."}
            name = "sweep " + " ".join(f"{k}={v}" for k, v in sorted(swept.items())) if swept else \
                f"sweep {ident.sweep_id}"
            run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
            shared = _sweep_params(manifest.config, swept)
            params = [Param(k[:250], _param_str(v)) for k, v in shared.items()]
            params += [Param(f"sweep.{k}"[:250], _param_str(v)) for k, v in sorted(swept.items())]
            for i in range(0, len(params), 100):
                self.client.log_batch(run.info.run_id, params=params[i : i + 100])
            return run.info.run_id

    def start(self, cfg: DictConfig | Mapping[str, Any], run_dir: Path, manifest: Manifest) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        run_dir = self.run_dir = Path(run_dir)
        # MLflow's download bars (it re-reads a table to append rows) would interleave with the progress lines.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        self.uri, mlruns = self._resolve_store(run_dir, manifest)
        raw_sweep_dir = manifest.identity.sweep_dir  # a real path, for the lock only
        # already redacted when built by write_start_manifest: belt and braces
        manifest = Manifest.from_dict(redact(manifest.to_dict()))
        lock = file_lock(mlruns / ".init.lock") if mlruns else contextlib.nullcontext()
        with lock:  # two processes creating the same SQLite schema/experiment at once would collide
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = self._experiment_id(mlruns)

        ident = manifest.identity
        git = manifest.git
        tags: dict[str, str] = {
            "mlflow.source.git.commit": str(git.commit or ""),
            "mlflow.source.type": "LOCAL",
            "mlflow.source.name": str((manifest.argv or ["rlexp"])[0]),
            "rlexp.git_dirty": str(git.dirty),
            "rlexp.config_sha256": str(manifest.config_sha256),
            "rlexp.run_dir": redact_text(str(run_dir.resolve())),
            "rlexp.status": "running",
            # the full name every source gives this run (rlexp compare matches sources by it); the MLflow run
            # name below may be shorter
            "rlexp.run_name": str(ident.run_name or run_dir.name),
        }
        swept_all = list(ident.swept)
        for t in group_tags(manifest.choices):
            k, v = t.split("=", 1)
            tags[f"choice.{k}"] = v
        if ident.sweep_dir:
            self.parent_id = self._find_or_create_parent(ident, manifest, lock_dir=Path(str(raw_sweep_dir)))
            self.client.update_run(self.parent_id, status="RUNNING")
            self.client.set_tag(self.parent_id, "rlexp.status", "running")
            swept = [k for k in ident.swept if k != "seed"]
            label = name_from_overrides([o for o in manifest.overrides
                                         if o.split("=", 1)[0].lstrip("~+") in swept], swept)
            tags.update({
                "mlflow.parentRunId": self.parent_id,
                "rlexp.role": "child",
                "rlexp.sweep_dir": str(ident.sweep_dir),
                "rlexp.job_num": str(ident.job_num),
                "rlexp.config_label": label or "all",
            })
        run_name = ident.run_name or run_dir.name
        if ident.sweep_dir:  # a child is named by what varies across the sweep, not what all jobs share
            varying = [o for o in manifest.overrides if o.split("=", 1)[0].lstrip("~+") in swept_all]
            run_name = name_from_overrides(varying, swept_all) or run_name
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k[:250], _param_str(v)) for k, v in flatten(manifest.config).items()]
        for i in range(0, len(params), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        # The per-component seeds derived from `seed` are a tag, not params: they differ between every two
        # seeds, and MLflow's compare view plots the first three differing params (sorted), which buried the
        # swept learning rate under seed.buffer, seed.data... (seen on a real sweep).
        self.client.log_batch(self.run_id, tags=[RunTag("rlexp.overrides", _param_str(manifest.overrides)),
                                                 RunTag("rlexp.seeds", _param_str(manifest.seeds))])
        self._log_datasets(manifest.datasets)
        # The sampler starts after the first metrics (log): MLflow lists a run's metrics in the order they were
        # first logged and its compare view plots the first one, which was system/cpu_utilization_percentage
        # when the sampler ran through the actors' start-up (seen on a real sweep).
        self._sampler_due = self.system_metrics

    def _log_datasets(self, datasets: Mapping[str, Any]) -> None:
        """The manifest's dataset hashes as MLflow datasets (the run page's Datasets column)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = []
        for name, d in datasets.items():
            if not isinstance(d, Mapping) or not d.get("sha256"):
                continue
            sha = str(d["sha256"])
            info = {"sha256": sha, "num_rows": d.get("n")}
            inputs.append(DatasetInput(
                Dataset(name=str(name), digest=sha[:32], source_type="rlexp", source=json.dumps({"name": name}),
                        profile=json.dumps(info)),
                tags=[InputTag("mlflow.data.context", str(name).rsplit("/", 1)[-1])]))
        if inputs:
            self.client.log_inputs(self.run_id, datasets=inputs)

    def _start_system_metrics(self) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self.monitor = SystemMetricsMonitor(self.run_id, sampling_interval=self.system_metrics_interval_s,
                                                tracking_uri=self.uri)
            self.monitor.start()
        except Exception as e:  # psutil missing, or a platform the sampler does not know
            log.warning("MLflow system metrics off: %s", e)
            self.monitor = None

    # ----------------------------------------------------------------------------------------- logging
    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if self.run_id is None:
            return
        ts = int(time.time() * 1000)
        # the headline metrics first, so the first metric MLflow knows of the run is the result
        ordered = sorted(metrics.items(), key=lambda kv: PARENT_METRICS.index(kv[0]) if kv[0] in PARENT_METRICS
                         else len(PARENT_METRICS))
        batch = [Metric(k, float(v), ts, int(step)) for k, v in ordered]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])
        if self._sampler_due:
            self._sampler_due = False
            self._start_system_metrics()

    def log_artifact(self, path: str | os.PathLike[str], kind: str = "result") -> None:
        if self.run_id is None:
            return
        p = Path(path)
        folder = "checkpoints" if kind == "checkpoint" else None
        # File by file, never a folder at once: MLflow's own copy would follow a link out of the run folder.
        base = (f"{folder}/{p.name}" if folder else p.name) if p.is_dir() else folder
        for f, rel in artifact_files(p, self.run_dir or p.parent):
            where = "/".join(x for x in (base, rel.parent.as_posix()) if x and x != ".")
            self.client.log_artifact(self.run_id, str(f), artifact_path=where or None)
        if kind == "checkpoint" and self.registered_model:
            self._register(f"checkpoints/{p.name}")

    def _register(self, artifact_path: str) -> None:
        from mlflow.exceptions import MlflowException

        name = str(self.registered_model)
        try:
            self.client.create_registered_model(name)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        run = self.client.get_run(self.run_id)
        mv = self.client.create_model_version(name, f"{run.info.artifact_uri}/{artifact_path}", run_id=self.run_id)
        self.model_version = str(mv.version)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int | None = None) -> None:
        """Appended to `tables/<name>.json`, MLflow's own table format (one file, rows from every call)."""
        if self.run_id is None or not rows:
            return
        columns = list(dict.fromkeys(k for r in rows for k in r))
        data = {c: [_cell(r.get(c)) for r in rows] for c in columns}
        if step is not None and "step" not in data:
            data["step"] = [int(step)] * len(rows)
        self.client.log_table(self.run_id, data=data, artifact_file=f"tables/{safe_name(name)}.json")

    # ----------------------------------------------------------------------------------------- finish
    def finish(self, status: str) -> None:
        run_id = self.run_id
        if run_id is None or self.client is None:
            return
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            monitor.finish()  # before the run ends: the sampler stops when it sees the run terminated
            # One last sample, so a run shorter than the sampling interval shows its system metrics too.
            try:
                monitor.collect_metrics()
                monitor.publish_metrics(monitor.aggregate_metrics())
                monitor.mlflow_logger.flush()
            except Exception as e:  # the sampler's own failure must not fail the run's ending
                log.warning("MLflow system metrics: last sample not logged: %s", e)
        self.run_id = None
        if self.model_version is not None:
            self.client.set_tag(run_id, "rlexp.registered_model", f"{self.registered_model}/{self.model_version}")
        self.client.set_tag(run_id, "rlexp.status", status)
        self.client.set_terminated(run_id, STATUS_MAP.get(status, "FAILED"))
        if self.parent_id:
            self._settle_parent()

    def _settle_parent(self) -> None:
        """When no child is running: the sweep's status, and aggregates of the children's final metrics."""
        children = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = {_quote(self.parent_id or '')}"
        )
        statuses = [c.info.status for c in children]
        if any(s in ("RUNNING", "SCHEDULED") for s in statuses):
            return
        worst = max(statuses, key=lambda s: _SEVERITY.get(s, 2), default="FINISHED")
        done = [c for c in children if c.info.status == "FINISHED"]
        rows = aggregate([{"config": c.data.tags.get("rlexp.config_label", "all"),
                           "metrics": {k: v for k, v in c.data.metrics.items()
                                       if not k.startswith(("system/", "time/")) or k == "time/wall_s"}}
                          for c in done])
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        curated = sorted((r for r in rows if r["metric"] in PARENT_METRICS),
                         key=lambda r: (PARENT_METRICS.index(r["metric"]), r["config"]))
        metrics = [Metric(_metric_name(f"sweep/{r['config']}/{r['metric']}/{stat}"), float(r[stat]), ts, len(done))
                   for r in curated for stat in ("mean", "std", "n")]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.parent_id, metrics=metrics[i : i + 1000])
        if rows:
            self.client.log_dict(self.parent_id, rows, AGGREGATES_FILE)
        self.client.set_tag(self.parent_id, "rlexp.status", RLEXP_STATUS.get(worst, "failed"))
        self.client.set_tag(self.parent_id, "rlexp.children", f"{len(done)} finished of {len(children)}")
        self.client.set_terminated(self.parent_id, worst)


def _cell(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v, default=str)
