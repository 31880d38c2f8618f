"""Tracker interface, the always-on JSONL tracker, and the `Trackers` composite the launcher uses.

Launcher usage (the whole API):

    manifest = write_start_manifest(run_dir, cfg, sys.argv, seeds, extra)
    with build_trackers(cfg.logger, cfg, run_dir, manifest) as trackers:   # rlexp.tracking.registry
        trackers.log({"reward/mean": 0.3, "loss": 1.2}, step)             # -> metrics.jsonl (+ W&B/MLflow)
        trackers.log_table("rollouts", rows, step)                        # rows: list[dict]
        trackers.log_artifact(final_dir, kind="checkpoint")               # hashed into the manifest too
        trackers.final_metrics["eval/accuracy"] = acc                     # optional; default = last values
    # on exit: status from the exception (none -> completed, KeyboardInterrupt/SIGTERM exit -> interrupted,
    # anything else -> failed), finish_manifest(...), manifest + git.diff uploaded, every tracker finished.

Why a composite: the failure mode users hit is tracker runs left "running" or merged across multirun jobs.
One object that owns start/finish ordering (and always finishes in `__exit__`, even when one tracker's finish
raises) fixes that in one place instead of in every launcher.

`metrics.jsonl` is the source of truth for compare/reproduce: one JSON object per line,
`{"step": int, "<metric>": float, ..., "time/wall_s": float, "time/unix_s": float}`, flushed per line so a
killed run keeps its history. Keys under `time/` are timing and are ignored by `compare_metrics`.

One clock: every row, training or evaluation, carries `time/wall_s`, seconds since the run's start
(`start_clock()`, when the actors are up; a resumed run continues from its last logged value), stamped here,
once, and sent unchanged to every tracker, so the same row has the same time in the folder, MLflow and W&B.

Artifacts have a `kind`, so each tracker files them where its users look: `checkpoint` (W&B: a `model`
artifact named `checkpoint`; MLflow: `checkpoints/<name>`, registered as a model when configured),
`manifest` (manifest.json, git.diff), `config` (`.hydra/`), `record` (metrics.jsonl, train.log), `eval` (eval
samples) and `result` (anything else). On finish the run folder's own files are uploaded under those kinds.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig

from rlexp.core.runfolder import nofollow_opener
from rlexp.errors import failure_reason
from rlexp.registry import Registry

from .manifest import GIT_DIFF_NAME, MANIFEST_NAME, Manifest, finish_manifest, update_manifest

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TABLES_DIR = "tables"
TRAIN_LOG = "train.log"
WALL_KEY = "time/wall_s"
# The run folder's own files, uploaded by every tracker when the run finishes, with their artifact kind.
RUN_FILES = ((MANIFEST_NAME, "manifest"), (GIT_DIFF_NAME, "manifest"), (".hydra", "config"),
             (METRICS_FILE, "record"), (TRAIN_LOG, "record"), ("eval_samples", "eval"), ("eval_results.json", "eval"))
INTERRUPT_EXIT_CODES = frozenset({130, 138, 143, -2, -10, -15})  # SIGINT, SIGUSR1, SIGTERM


def to_float(v: Any) -> float | None:
    """Accept python/numpy/torch scalars; None for anything that is not a number."""
    if isinstance(v, bool):
        return float(v)
    try:
        return float(v.item() if hasattr(v, "item") else v)
    except (TypeError, ValueError):
        return None


class Tracker(ABC):
    """One experiment-tracking backend. Implementations must tolerate `finish` being called after a failed
    `start` (the composite finishes everything it tried to start)."""

    name: str = "tracker"
    # The section of the `logger` group that turns it on (`logger.wandb.enabled`) and holds its
    # settings: the built-ins' typed sections. Empty: it is turned on by an entry of
    # `logger.trackers` (a plug-in's way).
    section: ClassVar[str] = ""
    # The dataclass of its entry's `options` in `logger.trackers` (unknown names refused with the
    # close matches); None: it takes none.
    Options: ClassVar[type | None] = None

    @classmethod
    def from_logger(cls, options: Any, logger_cfg: Any) -> Tracker:
        """The tracker for one run: `options` is its section (a built-in's) or its `Options`
        instance (None when it declares none); `logger_cfg` the whole `logger` group, for the
        settings trackers share (`system_metrics_interval_s`, `runs_root`)."""
        return cls() if options is None else cls(options)  # type: ignore[call-arg]

    @abstractmethod
    def start(self, cfg: DictConfig | Mapping[str, Any], run_dir: Path, manifest: Manifest) -> None: ...

    @abstractmethod
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: str | os.PathLike[str], kind: str = "result") -> None:  # noqa: B027 - optional
        pass

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int | None = None) -> None:  # noqa: B027
        pass

    def ref(self) -> dict[str, Any]:
        """Where this run lives in the backend (run id, URL, folder), recorded in the manifest at start."""
        return {}

    @abstractmethod
    def finish(self, status: str) -> None: ...


def setting(node: Any, key: str) -> Any:
    """`node.key` for a DictConfig, a dict or a dataclass (the logger group arrives as any of them);
    None if absent."""
    if node is None:
        return None
    if isinstance(node, DictConfig):
        from omegaconf import OmegaConf

        return OmegaConf.select(node, key)
    if isinstance(node, Mapping):
        return node.get(key)
    return getattr(node, key, None)


# Trackers by name (`logger.trackers[].name`, or a built-in's section); a user's is registered with
# `@register_tracker("name")` in a module listed in `plugins`, or named as package.module:Class.
TRACKERS: Registry[type[Tracker]] = Registry(
    "tracker", Tracker, "a subclass of rlexp.tracking.base.Tracker; see examples/my_tracker")
register_tracker = TRACKERS.register


class JsonlTracker(Tracker):
    """Always on: the run folder alone must be enough to compare and reproduce runs."""

    name = "jsonl"

    def __init__(self) -> None:
        self._f: Any = None
        self.run_dir: Path | None = None

    def start(self, cfg: DictConfig | Mapping[str, Any], run_dir: Path, manifest: Manifest) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Append: a resumed run continues the same history file.
        self._f = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8",  # noqa: SIM115 - closed in finish()
                       opener=nofollow_opener)

    def last_wall_s(self) -> float:
        """The last `time/wall_s` already in the file (0 for a new run): where a resumed run's clock goes on."""
        last = 0.0
        if self.run_dir is not None and (self.run_dir / METRICS_FILE).is_file():
            for line in (self.run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines():
                try:
                    v = json.loads(line).get(WALL_KEY)
                except (ValueError, AttributeError):
                    continue
                if isinstance(v, (int, float)):
                    last = max(last, float(v))
        return last

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._f is None:
            raise RuntimeError("JsonlTracker.log before start")
        row: dict[str, Any] = {"step": int(step)}
        for k, v in metrics.items():
            f = to_float(v)
            if f is not None:
                row[str(k)] = f
        row.setdefault("time/unix_s", time.time())
        self._f.write(json.dumps(row, allow_nan=True) + "\n")
        self._f.flush()

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int | None = None) -> None:
        if self.run_dir is None:
            return
        path = self.run_dir / TABLES_DIR / f"{safe_name(name)}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8", opener=nofollow_opener) as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")

    def finish(self, status: str) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "table"


def status_from_exception(exc: BaseException | None) -> str:
    if exc is None:
        return "completed"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, SystemExit):
        code = exc.code
        if code in (None, 0):
            return "completed"
        return "interrupted" if code in INTERRUPT_EXIT_CODES else "failed"
    return "failed"


class Trackers:
    """Composite over the configured trackers; a context manager that always finishes them.

    `log_every_n_steps` throttles the remote trackers only (JSONL gets every step; any step carrying `eval/`
    metrics is forwarded too, evaluations are rare and matter most). `rollout_samples` caps table rows.
    """

    def __init__(
        self,
        trackers: list[Tracker],
        cfg: DictConfig | Mapping[str, Any] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        manifest: Manifest | None = None,
        *,
        log_every_n_steps: int = 1,
        rollout_samples: int | None = None,
        manage_manifest: bool = True,
    ) -> None:
        self.trackers = trackers
        self.cfg = cfg if cfg is not None else {}
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.manifest = manifest or Manifest()
        self.log_every_n_steps = max(1, int(log_every_n_steps))
        self.rollout_samples = rollout_samples
        self.manage_manifest = manage_manifest
        self.final_metrics: dict[str, float] = {}
        self.artifacts: list[Path] = []
        self.status: str | None = None  # set explicitly to override the exception-derived status
        self._t0 = time.perf_counter()
        self._wall_offset = 0.0
        self._started: list[Tracker] = []
        self._warned: set[str] = set()
        self._finished = False

    def __iter__(self) -> Iterator[Tracker]:
        return iter(self.trackers)

    def __len__(self) -> int:
        return len(self.trackers)

    def get(self, name: str) -> Tracker | None:
        return next((t for t in self.trackers if t.name == name), None)

    # ----------------------------------------------------------------------------------------- lifecycle
    def start(self) -> Trackers:
        if self.run_dir is None:
            raise ValueError("Trackers.start needs run_dir")
        try:
            for t in self.trackers:
                self._started.append(t)
                t.start(self.cfg, self.run_dir, self.manifest)
                if isinstance(t, JsonlTracker):
                    self._wall_offset = t.last_wall_s()
        except BaseException as e:
            self.finish(status_from_exception(e))
            raise
        self._t0 = time.perf_counter()
        refs = {}
        for t in self._started:
            try:
                if ref := t.ref():
                    refs[t.name] = ref
            except Exception:  # a run that cannot say where it lives is still a run
                log.exception("%s.ref failed", t.name)
        if refs:
            self.manifest.trackers = refs
            if self.manage_manifest:
                update_manifest(self.run_dir, trackers=refs)
        return self

    def start_clock(self) -> None:
        """The run's start for `time/wall_s`: the launcher calls it when training can begin (actors spawned),
        so tracker and actor start-up do not shift every curve; until then the clock counts from `start()`."""
        self._t0 = time.perf_counter()

    def wall_s(self) -> float:
        """Seconds since the run's start, the one clock every metric row carries (`time/wall_s`)."""
        return self._wall_offset + time.perf_counter() - self._t0

    def __enter__(self) -> Trackers:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            status = self.status or status_from_exception(exc)
            self.finish(status, failure_reason(exc) if exc is not None and status == "failed" else None)
        except Exception:
            if exc is None:
                raise
            # never mask the run's own error with a tracker's
            log.exception("tracker finish failed while the run was failing")

    def _call(self, t: Tracker, method: str, *args: Any) -> None:
        """JSONL errors propagate (it is the record); a remote tracker's error is logged and the run goes on,
        because losing hours of training to a tracking-server hiccup is worse than a gap in a dashboard."""
        if isinstance(t, JsonlTracker):
            getattr(t, method)(*args)
            return
        try:
            getattr(t, method)(*args)
        except Exception:
            if t.name not in self._warned or method == "finish":
                log.exception("%s.%s failed; continuing (metrics.jsonl is still complete)", t.name, method)
                self._warned.add(t.name)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        clean = {str(k): f for k, v in metrics.items() if (f := to_float(v)) is not None}
        clean.setdefault(WALL_KEY, self.wall_s())
        for k, v in clean.items():
            if not k.startswith("time/") and not math.isnan(v):
                self.final_metrics[k] = v
        forward = step % self.log_every_n_steps == 0 or any(k.startswith("eval/") for k in clean)
        for t in self._started:
            if isinstance(t, JsonlTracker) or forward:
                self._call(t, "log", clean, step)

    def log_artifact(self, path: str | os.PathLike[str], kind: str = "result") -> None:
        self.artifacts.append(Path(path))
        for t in self._started:
            self._call(t, "log_artifact", path, kind)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int | None = None) -> None:
        rows = list(rows)[: self.rollout_samples] if self.rollout_samples is not None else list(rows)
        for t in self._started:
            self._call(t, "log_table", name, rows, step)

    def finish(self, status: str = "completed", error: str | None = None) -> None:
        """Idempotent. Order: manifest final state (with `error`, why it failed) -> upload manifest/diff -> finish
        each tracker. Every tracker is finished even if another fails; remote-tracker errors are logged,
        manifest/JSONL errors re-raised."""
        if self._finished:
            return
        self._finished = True
        errors: list[BaseException] = []
        if self.manage_manifest and self.run_dir is not None:
            try:
                self.manifest = finish_manifest(self.run_dir, status, self.final_metrics, self.artifacts, error)
            except Exception as e:
                errors.append(e)
            uploaded = {a.resolve() for a in self.artifacts}
            for name, kind in RUN_FILES:
                p = self.run_dir / name
                if p.exists() and p.resolve() not in uploaded:
                    for t in self._started:
                        self._call(t, "log_artifact", p, kind)
        for t in reversed(self._started):
            try:
                self._call(t, "finish", status)
            except Exception as e:  # JSONL: keep finishing the others first
                errors.append(e)
        if errors:
            raise errors[0]
