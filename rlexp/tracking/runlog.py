"""`train.log`: the lines a user reads on the console (start-up summary, progress, the final line) kept in the
run folder too, next to the library logs Hydra's file handler already writes there, with one prefix.

Console lines stay plain `print`s; the same text goes through a logger whose only handlers are the root
logger's file handlers (Hydra's `<run_dir>/<job>.log`), so it is neither printed twice nor lost with the
terminal. Hydra configures logging again for every multirun job, hence `attach()` per run.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from .manifest import Manifest

_LOG = logging.getLogger("rlexp.run")
_LOG.propagate = False
_LOG.setLevel(logging.INFO)


def attach() -> list[str]:
    """Point the run log at the current file handlers of the root logger; returns their file names."""
    for h in list(_LOG.handlers):
        _LOG.removeHandler(h)
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for h in files:
        _LOG.addHandler(h)
    return [h.baseFilename for h in files]


def announce(msg: str) -> None:
    """Print a line for the user and keep it in train.log."""
    print(msg, flush=True, file=sys.stdout)
    if _LOG.handlers:
        for line in msg.splitlines():
            _LOG.info(line)


def tracker_lines(manifest: Manifest, run_dir: Path) -> list[str]:
    """Start-up summary lines saying where the run is recorded (also in manifest.json under `trackers`)."""
    lines = [f"run {manifest.identity.run_name or run_dir.name}: folder {run_dir}"]
    refs = manifest.trackers or {}
    ml = refs.get("mlflow")
    if ml:
        lines.append(f"  mlflow      run {ml['run_id']} in experiment {ml.get('experiment')!r}, {ml['url']}"
                     + (f" (open with: {ml['open']})" if ml.get("open") else ""))
    wb = refs.get("wandb")
    if wb:
        where = wb.get("url") or f"{wb.get('dir')} (sync: wandb sync {wb.get('dir')})"
        lines.append(f"  wandb       run {wb['run_id']} ({wb.get('mode')}), {where}")
    return lines
