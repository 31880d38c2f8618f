"""MLflow tracker (client API only, never the fluent `mlflow.start_run` global stack).

- Store: `logger.mlflow.tracking_uri`, else MLFLOW_TRACKING_URI, else a local SQLite store
  `sqlite:///<runs_root>/mlruns/mlflow.db` with artifacts in `<runs_root>/mlruns/artifacts/`. MLflow 3.17 refuses
  the plain file store by default (maintenance mode), and SQLite needs no server.
- Multirun: one *parent* run per sweep, found by the tag `rlexp.sweep_dir` (plus `rlexp.role=parent`) under an
  flock in the sweep dir, so it is created exactly once whether the jobs run sequentially in one process
  (Hydra's basic launcher) or in separate processes (submitit/joblib). Each job is a child run
  (`mlflow.parentRunId`). The parent is set RUNNING while a child runs and, when no child is running, to the
  worst child status (FAILED > KILLED > FINISHED), so the sweep's status in the UI is honest.
- Every run ends in `finish()` with FINISHED / FAILED / KILLED from the rlexp status.
- Secrets: params and tags come from the redacted manifest, passed through `redact` once more (never from the
  raw `cfg`); the tracking URI itself (it may carry `user:pass@`) is only used to connect, never recorded.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .base import Tracker, safe_name
from .manifest import group_tags, redact, redact_text
from .runs import flatten

STATUS_MAP = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_SEVERITY = {"FINISHED": 0, "KILLED": 1, "FAILED": 2}
PARAM_VALUE_MAX = 6000


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Cross-process mutual exclusion (flock); in-process sequential use is trivially safe."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def default_runs_root(run_dir: Path, manifest: Mapping[str, Any]) -> Path:
    sweep = (manifest.get("identity") or {}).get("sweep_dir")
    return Path(sweep).parent if sweep else Path(run_dir).resolve().parent


def local_store_uri(runs_root: str | os.PathLike[str]) -> str:
    return f"sqlite:///{(Path(runs_root).resolve() / 'mlruns' / 'mlflow.db').as_posix()}"


def _param_str(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= PARAM_VALUE_MAX else s[: PARAM_VALUE_MAX - 3] + "..."


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class MlflowTracker(Tracker):
    tracking_uri: str | None = None
    experiment: str = "rlexp"
    runs_root: str | None = None
    name = "mlflow"

    def __post_init__(self) -> None:
        self.client: Any = None
        self.run_id: str | None = None
        self.parent_id: str | None = None
        self.uri: str | None = None
        self.experiment_id: str | None = None

    @classmethod
    def from_config(cls, c: Any, runs_root: str | None = None) -> MlflowTracker:
        get = c.get if isinstance(c, Mapping | DictConfig) else lambda k, d=None: getattr(c, k, d)
        return cls(tracking_uri=get("tracking_uri", None), experiment=get("experiment", "rlexp"), runs_root=runs_root)

    # ----------------------------------------------------------------------------------------- setup
    def _resolve_store(self, run_dir: Path, manifest: Mapping[str, Any]) -> tuple[str, Path | None]:
        """(uri, local mlruns dir or None for a remote/user store)."""
        if self.tracking_uri:
            return self.tracking_uri, None
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"], None
        root = Path(self.runs_root) if self.runs_root else default_runs_root(run_dir, manifest)
        mlruns = root.resolve() / "mlruns"
        mlruns.mkdir(parents=True, exist_ok=True)
        return local_store_uri(root), mlruns

    def _experiment_id(self, mlruns: Path | None) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        kwargs = {"artifact_location": (mlruns / "artifacts" / safe_name(self.experiment)).as_uri()} if mlruns else {}
        try:
            return self.client.create_experiment(self.experiment, **kwargs)
        except Exception:  # created concurrently by another job
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def _find_or_create_parent(self, ident: Mapping[str, Any], base_tags: dict[str, str],
                               lock_dir: Path | None = None) -> str:
        sweep_dir = str(ident["sweep_dir"])
        with file_lock(Path(lock_dir or sweep_dir) / ".mlflow_parent.lock"):
            found = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`rlexp.sweep_dir` = {_quote(sweep_dir)} and tags.`rlexp.role` = 'parent'",
                max_results=1,
            )
            if found:
                return found[0].info.run_id
            tags = {k: v for k, v in base_tags.items() if not k.startswith("choice.")}
            tags.update({"rlexp.role": "parent", "rlexp.sweep_dir": sweep_dir,
                         "rlexp.sweep_id": str(ident.get("sweep_id"))})
            run = self.client.create_run(self.experiment_id, run_name=str(ident.get("sweep_id") or "sweep"), tags=tags)
            return run.info.run_id

    def start(self, cfg: DictConfig | Mapping[str, Any], run_dir: Path, manifest: dict[str, Any]) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir)
        self.uri, mlruns = self._resolve_store(run_dir, manifest)
        raw_sweep_dir = (manifest.get("identity") or {}).get("sweep_dir")  # a real path, for the lock only
        manifest = redact(manifest)  # already redacted when built by write_start_manifest: belt and braces
        lock = file_lock(mlruns / ".init.lock") if mlruns else contextlib.nullcontext()
        with lock:  # two processes creating the same SQLite schema/experiment at once would collide
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = self._experiment_id(mlruns)

        ident = manifest.get("identity") or {}
        git = manifest.get("git") or {}
        tags: dict[str, str] = {
            "mlflow.source.git.commit": str(git.get("commit") or ""),
            "mlflow.source.type": "LOCAL",
            "mlflow.source.name": str((manifest.get("argv") or ["rlexp"])[0]),
            "rlexp.git_dirty": str(git.get("dirty")),
            "rlexp.config_sha256": str(manifest.get("config_sha256")),
            "rlexp.run_dir": redact_text(str(run_dir.resolve())),
            "rlexp.status": "running",
        }
        for t in group_tags(manifest.get("choices") or {}):
            k, v = t.split("=", 1)
            tags[f"choice.{k}"] = v
        if ident.get("sweep_dir"):
            self.parent_id = self._find_or_create_parent(ident, tags, lock_dir=Path(raw_sweep_dir))
            self.client.update_run(self.parent_id, status="RUNNING")
            tags.update({
                "mlflow.parentRunId": self.parent_id,
                "rlexp.role": "child",
                "rlexp.sweep_dir": str(ident["sweep_dir"]),
                "rlexp.job_num": str(ident.get("job_num")),
            })
        run = self.client.create_run(self.experiment_id, run_name=ident.get("run_name") or run_dir.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k[:250], _param_str(v)) for k, v in flatten(manifest.get("config") or {}).items()]
        params += [Param(f"seed.{k}", str(v)) for k, v in (manifest.get("seeds") or {}).items()]
        for i in range(0, len(params), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        overrides = _param_str(manifest.get("overrides") or [])
        self.client.log_batch(self.run_id, tags=[RunTag("rlexp.overrides", overrides)])

    # ----------------------------------------------------------------------------------------- logging
    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if self.run_id is None:
            return
        ts = int(time.time() * 1000)
        batch = [Metric(k, float(v), ts, int(step)) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_artifact(self, path: str | os.PathLike[str]) -> None:
        if self.run_id is None:
            return
        p = Path(path)
        if p.is_dir():
            self.client.log_artifacts(self.run_id, str(p), artifact_path=p.name)
        else:
            self.client.log_artifact(self.run_id, str(p))

    def log_table(self, name: str, rows: list[dict[str, Any]]) -> None:
        if self.run_id is None or not rows:
            return
        self.client.log_dict(self.run_id, rows, f"tables/{safe_name(name)}.json")

    # ----------------------------------------------------------------------------------------- finish
    def finish(self, status: str) -> None:
        run_id, self.run_id = self.run_id, None
        if run_id is None or self.client is None:
            return
        self.client.set_tag(run_id, "rlexp.status", status)
        self.client.set_terminated(run_id, STATUS_MAP.get(status, "FAILED"))
        if self.parent_id:
            self._settle_parent()

    def _settle_parent(self) -> None:
        children = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = {_quote(self.parent_id or '')}"
        )
        statuses = [c.info.status for c in children]
        if any(s in ("RUNNING", "SCHEDULED") for s in statuses):
            return
        worst = max(statuses, key=lambda s: _SEVERITY.get(s, 2), default="FINISHED")
        self.client.set_terminated(self.parent_id, worst)
