"""Builds the trackers the `logger` config group asks for; imports the implementations (base does not)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.tracking.base import JsonlTracker, Tracker, Trackers
from rlexp.tracking.manifest import Manifest
from rlexp.tracking.mlflow_tracker import MlflowTracker
from rlexp.tracking.wandb_tracker import WandbTracker


def _section(logger_cfg: Any, key: str) -> Any:
    if logger_cfg is None:
        return None
    if isinstance(logger_cfg, DictConfig):
        return OmegaConf.select(logger_cfg, key)
    if isinstance(logger_cfg, Mapping):
        return logger_cfg.get(key)
    return getattr(logger_cfg, key, None)


def build_trackers(
    logger_cfg: Any,
    cfg: DictConfig | Mapping[str, Any],
    run_dir: str | os.PathLike[str],
    manifest: Manifest,
) -> Trackers:
    """Trackers for the `logger` config group (JSONL always first). Nothing is started until `with`/`start()`,
    so building is cheap and config errors surface before any run is created remotely."""
    trackers: list[Tracker] = [JsonlTracker()]
    interval = _section(logger_cfg, "system_metrics_interval_s")
    wb = _section(logger_cfg, "wandb")
    if wb is not None and _section(wb, "enabled"):
        trackers.append(WandbTracker.from_config(wb, stats_interval_s=interval))
    ml = _section(logger_cfg, "mlflow")
    if ml is not None and _section(ml, "enabled"):
        trackers.append(MlflowTracker.from_config(ml, runs_root=_section(logger_cfg, "runs_root"),
                                                  system_metrics_interval_s=interval))
    every = _section(logger_cfg, "log_every_n_steps")
    samples = _section(logger_cfg, "rollout_samples")
    return Trackers(
        trackers, cfg, run_dir, manifest,
        log_every_n_steps=int(every) if every is not None else 1,
        rollout_samples=int(samples) if samples is not None else None,
    )
