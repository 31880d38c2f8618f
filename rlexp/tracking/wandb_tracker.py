"""Weights & Biases tracker.

- `mode: auto` is offline unless WANDB_API_KEY is set, so a laptop/CI run never blocks on a login prompt
  or the network; `wandb sync <run_dir>/wandb/offline-run-*` uploads it later.
- One W&B run per rlexp run, created with `reinit="create_new"` and always finished: Hydra's basic launcher
  runs multirun jobs in one process, and reusing the global run would merge jobs (a known complaint).
- group = the sweep id (shared by a multirun's jobs), name = the job's run name, tags = Hydra group choices;
  all from `manifest["identity"]` / `manifest["choices"]` so every tracker names runs the same way.
- The W&B folder lives in the run folder (`<run_dir>/wandb/`), next to the rest of the run.
- Secrets: everything uploaded comes from the redacted manifest (config, overrides, tags), passed through
  `redact` once more; W&B's own metadata records `sys.argv`, so `wandb.init` runs with the manifest's redacted
  argv in its place; git capture is off (a remote URL can carry a token). The raw `cfg` is never read here.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .base import Tracker, safe_name
from .manifest import group_tags, redact, redact_argv, redact_text

_EXIT_CODES = {"completed": 0, "failed": 1, "interrupted": 130}


def resolve_mode(mode: str | None) -> str:
    mode = (mode or "auto").lower()
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    if mode not in ("online", "offline", "disabled"):
        raise ValueError(f"logger.wandb.mode must be auto|online|offline|disabled, got {mode!r}")
    return mode


@dataclass
class WandbTracker(Tracker):
    project: str = "rlexp"
    entity: str | None = None
    mode: str = "auto"
    name = "wandb"

    def __post_init__(self) -> None:
        self.run: Any = None

    @classmethod
    def from_config(cls, c: Any) -> WandbTracker:
        get = c.get if isinstance(c, Mapping | DictConfig) else lambda k, d=None: getattr(c, k, d)
        return cls(project=get("project", "rlexp"), entity=get("entity", None), mode=get("mode", "auto"))

    def start(self, cfg: DictConfig | Mapping[str, Any], run_dir: Path, manifest: dict[str, Any]) -> None:
        import wandb

        manifest = redact(manifest)  # redacted already when built by write_start_manifest: belt and braces
        ident = manifest.get("identity") or {}
        config = dict(manifest.get("config") or {})
        config["rlexp_meta"] = redact({
            "config_sha256": manifest.get("config_sha256"),
            "git_commit": (manifest.get("git") or {}).get("commit"),
            "git_dirty": (manifest.get("git") or {}).get("dirty"),
            "overrides": manifest.get("overrides"),
            "run_dir": str(run_dir),
            "seeds": manifest.get("seeds"),
        })
        tags = [t[:64] for t in group_tags(manifest.get("choices") or {})]
        argv = manifest.get("argv") or redact_argv(sys.argv)
        with _argv_as(redact_argv(argv)):
            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                group=(ident.get("group") or None),
                name=ident.get("run_name") or redact_text(Path(run_dir).name),
                job_type="train",
                tags=tags,
                config=config,
                dir=str(run_dir),
                mode=resolve_mode(self.mode),  # type: ignore[arg-type]
                reinit="create_new",
                settings=wandb.Settings(silent=True, x_disable_stats=True, disable_git=True),
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is not None:
            self.run.log(dict(metrics), step=int(step))

    def log_artifact(self, path: str | os.PathLike[str]) -> None:
        import wandb

        if self.run is None:
            return
        p = Path(path)
        kind = "manifest" if p.name in ("manifest.json", "git.diff") else "result"
        art = wandb.Artifact(name=safe_name(f"{self.run.id}-{p.name}"), type=kind)
        if p.is_dir():
            art.add_dir(str(p))
        else:
            art.add_file(str(p))
        self.run.log_artifact(art)

    def log_table(self, name: str, rows: list[dict[str, Any]]) -> None:
        import wandb

        if self.run is None or not rows:
            return
        columns = list(dict.fromkeys(k for r in rows for k in r))
        data = [[_cell(r.get(c)) for c in columns] for r in rows]
        self.run.log({name: wandb.Table(columns=columns, data=data)})

    def finish(self, status: str) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        run.summary["rlexp/status"] = status
        run.finish(exit_code=_EXIT_CODES.get(status, 1))
        import wandb

        # wandb 0.31's core service can still be flushing the offline transaction log after finish() returns;
        # a reader right after the run (compare, the next job, a test) then sees an empty run. teardown() waits
        # for the flush, and the next multirun job starts from a clean service (about a second).
        wandb.teardown()


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
