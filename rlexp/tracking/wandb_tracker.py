"""Weights & Biases tracker.

- `mode: auto` follows WANDB_DISABLED / WANDB_MODE when set, else is offline unless WANDB_API_KEY is set, so a
  laptop/CI run never blocks on a login prompt or the network, and WANDB_MODE=offline is never overridden by a
  key in the environment (`resolve_mode`); `wandb sync <run_dir>/wandb/offline-run-*` uploads it later.
- One W&B run per rlexp run, created with `reinit="create_new"` and always finished: Hydra's basic launcher
  runs multirun jobs in one process, and reusing the global run would merge jobs (a known complaint).
- group = the configuration: the run's overrides but the seed (`reward=rule`), so W&B's grouped runs table
  averages seeds the way `rlexp compare` does; job_type = train, name = the run's overrides
  (`reward=rule,seed=0`), tags = Hydra group choices plus `sweep:<sweep id>` for a multirun job; all from
  the manifest's `identity` / `choices` so every tracker names runs the same way.
- The result is declared, not left to W&B's guess: `define_metric` puts `eval/*` on the `step` axis and keeps
  `eval/accuracy`'s best and last value in the summary (`eval/accuracy.max`, `.last`), and `finish` writes
  `result/eval_accuracy_final` and `result/eval_accuracy_best` into the summary for the runs table.
- A sweep ends with its answer in W&B too: the job that finishes last (`last_of_sweep`: every job of the
  sweep's grid, `hydra_run.sweep_size`, has a finished manifest) logs the compare table of the whole sweep
  (`sweep/compare`, rlexp.tracking.verdict, ranked, numbers as numbers) and puts the winner sentence in its
  summary (`sweep/winner`, `sweep/best_configuration`). On the last run because W&B cannot append to an
  offline run once it has finished, and a run of its own would sit in the runs table as a fake run.
- The W&B folder lives in the run folder (`<run_dir>/wandb/offline-run-*`), next to the rest of the run;
  `wandb sync runs/multirun/<time>/*/wandb/offline-run-*` uploads a whole sweep.
- W&B's own panels: system metrics (its sampler, `logger.wandb.system_metrics`, every
  `logger.system_metrics_interval_s`) and the git commit and remote in W&B's git fields, given from the
  manifest (`logger.wandb.git`), so W&B does not read the repository itself.
- Artifacts under stable names, versioned across runs of the project: `checkpoint` (type `model`),
  `manifest` (manifest.json + git.diff) and `config` (`.hydra/`); anything else goes to `results`.
- Secrets: everything uploaded comes from the redacted manifest (config, overrides, tags, git remote), passed
  through `redact` once more; W&B's own metadata records `sys.argv`, so `wandb.init` runs with the manifest's
  redacted argv in its place. The raw `cfg` is never read here.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlexp.core.runfolder import artifact_files

from .base import Tracker, register_tracker, setting
from .files import file_lock
from .hydra_run import group_tags, name_from_overrides, override_key, sweep_size
from .manifest import Manifest, read_manifest
from .redact import redact, redact_argv, redact_text
from .runs import NUISANCE_KEYS, find_run_dirs, load_runs
from .verdict import answer, build_table, unique_names

log = logging.getLogger(__name__)
_EXIT_CODES = {"completed": 0, "failed": 1, "interrupted": 130}


# WANDB_MODE values W&B accepts, as the mode passed to `wandb.init` (`dryrun` and `run` are its old names).
_ENV_MODES = {"online": "online", "offline": "offline", "disabled": "disabled", "dryrun": "offline", "run": "online"}
_TRUE = ("1", "true", "yes", "on")


def resolve_mode(mode: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The W&B mode of this run: an explicit `logger.wandb.mode` > WANDB_DISABLED / WANDB_MODE > auto (online
    when WANDB_API_KEY is set, else offline).

    The result is passed to `wandb.init(mode=...)`, which overrides W&B's own reading of WANDB_MODE, so the
    environment has to be honoured here: a user who said WANDB_MODE=offline (or WANDB_DISABLED=true, the
    convention of the HF Trainer, which W&B itself ignores) must never upload, whatever key the environment
    also holds."""
    env = os.environ if environ is None else environ
    mode = (mode or "auto").lower()
    if mode != "auto":
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.wandb.mode must be auto|online|offline|disabled, got {mode!r}")
        return mode
    if env.get("WANDB_DISABLED", "").strip().lower() in _TRUE:
        return "disabled"
    wanted = env.get("WANDB_MODE", "").strip().lower()
    if wanted:
        if wanted not in _ENV_MODES:
            raise ValueError(f"WANDB_MODE={wanted!r} is not a W&B mode: set it to online, offline or disabled "
                             "(or unset it)")
        return _ENV_MODES[wanted]
    return "online" if env.get("WANDB_API_KEY") else "offline"


# Artifact kind (rlexp.tracking.base) -> (W&B artifact name, W&B artifact type). Stable names: every run of
# the project adds a version (v0, v1, ...) to the same collection instead of a collection of its own.
ARTIFACTS = {"checkpoint": ("checkpoint", "model"), "manifest": ("manifest", "manifest"),
             "config": ("config", "config"), "result": ("results", "result")}


RESULT_METRIC = "eval/accuracy"
GROUP_MAX = 128  # W&B's limit on a group name
SWEEP_TABLE = "sweep/compare"
_ANSWERED = ".wandb_sweep_answer"  # in the sweep folder: which run holds the sweep's table (one only)


def configuration_group(manifest: Manifest) -> str:
    """The W&B group: the run's overrides without the seed, so seeds of one configuration group together
    across sweeps; `defaults` when only the seed was set. Too long a name keeps a hash of the whole."""
    rest = [o for o in manifest.overrides if override_key(o) not in NUISANCE_KEYS]
    group = name_from_overrides(rest) or "defaults"
    if len(group) > GROUP_MAX:
        group = group[: GROUP_MAX - 9] + "~" + hashlib.sha1(group.encode()).hexdigest()[:8]
    return group


@register_tracker("wandb")
@dataclass
class WandbTracker(Tracker):
    project: str = "rlexp"
    entity: str | None = None
    mode: str = "auto"
    system_metrics: bool = True
    git: bool = True
    stats_interval_s: float = 15.0
    section = "wandb"  # logger.wandb (rlexp/config/logger.py WandbConfig)

    def __post_init__(self) -> None:
        self.run: Any = None
        self._pending: dict[str, list[Path]] = {}
        self._defined = False
        self._result: list[float] = []
        self._sweep_dir: Path | None = None
        self._last_step: int | None = None
        self.run_dir: Path | None = None  # artifacts are only regular files inside it

    @classmethod
    def from_logger(cls, options: Any, logger_cfg: Any) -> WandbTracker:
        interval = setting(logger_cfg, "system_metrics_interval_s")
        return cls.from_config(options, stats_interval_s=interval)

    @classmethod
    def from_config(cls, c: Any, stats_interval_s: float | None = None) -> WandbTracker:
        get = c.get if isinstance(c, Mapping | DictConfig) else lambda k, d=None: getattr(c, k, d)
        return cls(project=get("project", "rlexp"), entity=get("entity", None), mode=get("mode", "auto"),
                   system_metrics=bool(get("system_metrics", True)), git=bool(get("git", True)),
                   stats_interval_s=float(stats_interval_s or 15.0))

    def ref(self) -> dict[str, Any]:
        if self.run is None:
            return {}
        url = None
        if not self.run.offline:  # an offline run gets its URL when synced (asking warns on the console)
            with contextlib.suppress(Exception):
                url = self.run.url
        return {"run_id": self.run.id, "project": self.project, "entity": self.entity, "group": self.run.group,
                "url": url, "dir": str(Path(self.run.dir).parent), "mode": self.run.settings.mode}

    def start(self, cfg: DictConfig | Mapping[str, Any], run_dir: Path, manifest: Manifest) -> None:
        mode = resolve_mode(self.mode)
        if mode == "disabled":  # nothing to start: no W&B folder, no service process
            return
        import wandb

        self._sweep_dir = Path(manifest.identity.sweep_dir) if manifest.identity.sweep_dir else None
        self.run_dir = Path(run_dir)
        # redacted already when built by write_start_manifest: belt and braces
        manifest = Manifest.from_dict(redact(manifest.to_dict()))
        ident = manifest.identity
        config = dict(manifest.config)
        config["rlexp_meta"] = redact({
            "config_sha256": manifest.config_sha256,
            "git_commit": manifest.git.commit,
            "git_dirty": manifest.git.dirty,
            "overrides": manifest.overrides,
            "run_dir": str(run_dir),
            "seeds": manifest.seeds,
        })
        tags = [t[:64] for t in group_tags(manifest.choices)]
        if ident.sweep_id:
            tags.append(f"sweep:{ident.sweep_id}"[:64])
        argv = manifest.argv or redact_argv(sys.argv)
        git = manifest.git
        # Git from the manifest (commit, redacted remote): W&B's own capture would read the repository, whose
        # remote URL can carry a token; without a commit there is nothing to show.
        use_git = self.git and bool(git.commit)
        git_settings = {"git_commit": git.commit, "git_remote_url": redact_text(git.remote or "") or None,
                        "git_root": git.repo} if use_git else {}
        with _argv_as(redact_argv(argv)):
            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                group=configuration_group(manifest),
                name=ident.run_name or redact_text(Path(run_dir).name),
                job_type="train",
                tags=tags,
                config=config,
                dir=str(run_dir),
                mode=mode,  # type: ignore[arg-type]
                reinit="create_new",
                settings=wandb.Settings(silent=True, x_disable_stats=not self.system_metrics,
                                        x_stats_sampling_interval=self.stats_interval_s,
                                        disable_git=not use_git, **git_settings),
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is not None:
            if not self._defined:
                self._defined = True
                self.run.define_metric("step", hidden=True)
                self.run.define_metric("eval/*", step_metric="step")
                self.run.define_metric(RESULT_METRIC, step_metric="step", summary="max,last")
            value = metrics.get(RESULT_METRIC)
            if isinstance(value, (int, float)) and not math.isnan(value):
                self._result.append(float(value))
            self.run.log({**metrics, "step": int(step)}, step=int(step))
            self._last_step = int(step)

    def log_artifact(self, path: str | os.PathLike[str], kind: str = "result") -> None:
        """Checkpoints go up at once; the other kinds are collected and logged at finish as one version each
        (manifest.json and git.diff belong to one `manifest` version). Records and eval samples stay in the run
        folder: W&B already holds the history, the console output and the rollout tables."""
        if self.run is None or kind not in ARTIFACTS:
            return
        self._pending.setdefault(kind, []).append(Path(path))
        if kind == "checkpoint":
            self._flush_artifacts(("checkpoint",))

    def _flush_artifacts(self, kinds: Iterable[str]) -> None:
        import wandb

        for kind in kinds:
            paths = self._pending.pop(kind, [])
            if not paths:
                continue
            name, typ = ARTIFACTS[kind]
            art = wandb.Artifact(name=name, type=typ, metadata={"files": [p.name for p in paths]})
            for p in paths:  # file by file: W&B's add_dir would follow a link out of the run folder
                prefix = Path(p.name) if p.is_dir() and kind != "checkpoint" else Path()
                for f, rel in artifact_files(p, self.run_dir or p.parent):
                    art.add_file(str(f), name=(prefix / rel).as_posix())
            self.run.log_artifact(art)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int | None = None) -> None:
        import wandb

        if self.run is None or not rows:
            return
        columns = list(dict.fromkeys(k for r in rows for k in r))
        data = [[_cell(r.get(c)) for c in columns] for r in rows]
        # At the rows' own step, in the same history row as that step's metrics (logged right after).
        self.run.log({name: wandb.Table(columns=columns, data=data)}, step=step, commit=False if step is not None
                     else None)

    def finish(self, status: str) -> None:
        run = self.run
        if run is None:
            return
        try:
            self._flush_artifacts(list(ARTIFACTS))
        finally:
            self.run = None
        run.summary["rlexp/status"] = status
        if self._result:
            run.summary["result/eval_accuracy_final"] = self._result[-1]
            run.summary["result/eval_accuracy_best"] = max(self._result)
        if self._sweep_dir is not None:
            try:
                if last_of_sweep(self._sweep_dir, run.id):
                    self._log_sweep_answer(run, self._sweep_dir)
            except Exception as e:  # the run must still finish; the sweep summary files hold the answer too
                log.warning("W&B: the sweep's compare table was not logged: %s", e)
        run.finish(exit_code=_EXIT_CODES.get(status, 1))
        import wandb

        # wandb 0.31's core service can still be flushing the offline transaction log after finish() returns;
        # a reader right after the run (compare, the next job, a test) then sees an empty run. teardown() waits
        # for the flush, and the next multirun job starts from a clean service (about a second).
        wandb.teardown()


    def _log_sweep_answer(self, run: Any, sweep_dir: Path) -> None:
        """The whole sweep's compare table on this (its last) run, at its last step, and the winner sentence."""
        import wandb

        runs = load_runs(str(sweep_dir))
        unique_names(runs)
        ans = answer(runs)
        header, rows = build_table(ans.verdict.ranked, ans.headlines)
        run.log({SWEEP_TABLE: wandb.Table(columns=header, data=[[_number(c) for c in r] for r in rows])},
                step=self._last_step)
        run.summary["sweep/winner"] = ans.verdict.sentence
        if ans.verdict.best is not None:
            run.summary["sweep/best_configuration"] = ans.verdict.best.label


def last_of_sweep(sweep_dir: Path, run_id: str) -> bool:
    """True for exactly one job of a sweep: the first to finish (its manifest final) after every other job of
    the grid has. Decided under a lock in the sweep folder and recorded there, so parallel jobs finishing
    together do not both answer. A sweep whose size cannot be told (rlexp.tracking.hydra_run.sweep_size) has
    no last job."""
    total = sweep_size(sweep_dir)
    if total is None:
        return False
    with file_lock(sweep_dir / f"{_ANSWERED}.lock"):
        if (sweep_dir / _ANSWERED).exists():
            return False
        done = 0
        for d in find_run_dirs(sweep_dir):
            with contextlib.suppress(OSError, ValueError):
                done += read_manifest(d).status not in (None, "running")
        if done < total:
            return False
        (sweep_dir / _ANSWERED).write_text(run_id + "\n", encoding="utf-8")
        return True


def _number(cell: str) -> Any:
    """A table cell as W&B should sort it: numbers as numbers, the rest as text."""
    for kind in (int, float):
        try:
            return kind(cell) if cell.strip() else None
        except ValueError:
            continue
    return cell


@contextlib.contextmanager
def _argv_as(argv: Sequence[str]) -> Iterator[None]:
    """W&B records `sys.argv[1:]` as the run's args when it starts: let it see the redacted command line."""
    saved = sys.argv
    sys.argv = [str(a) for a in argv]
    try:
        yield
    finally:
        sys.argv = saved


def _cell(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
