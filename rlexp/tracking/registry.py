"""Builds the trackers the `logger` config group asks for: the JSONL file always, each registered
tracker whose section is enabled (`logger.wandb.enabled`, the built-ins), and each entry of
`logger.trackers` (a plug-in's, by name or package.module:Class, with its typed options). Imports
the built-in implementations (base does not)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.config.validate import ConfigError, check_options
from rlexp.tracking import mlflow_tracker, wandb_tracker  # noqa: F401  (they register)
from rlexp.tracking.base import TRACKERS, JsonlTracker, Tracker, Trackers, setting
from rlexp.tracking.manifest import Manifest


def configured_trackers(logger_cfg: Any) -> list[Tracker]:
    """The trackers besides JSONL, built (not started): an unknown name or a bad option is refused
    here, before any run is created remotely."""
    out: list[Tracker] = []
    for _, cls in TRACKERS.items():
        section = setting(logger_cfg, cls.section) if cls.section else None
        if section is not None and setting(section, "enabled"):
            out.append(cls.from_logger(section, logger_cfg))
    for i, entry in enumerate(setting(logger_cfg, "trackers") or []):
        name = str(setting(entry, "name") or "")
        cls = TRACKERS.get(name)
        raw = setting(entry, "options") or {}
        raw = (
            OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else dict(raw)
        )
        who = f"logger.trackers[{i}] ({name})"
        if cls.Options is None and raw:
            raise ConfigError(f"{who}: takes no options, got {sorted(raw)}; remove them")
        out.append(
            cls.from_logger(
                check_options(cls.Options, raw, who) if cls.Options else None, logger_cfg
            )
        )
    return out


def build_trackers(
    logger_cfg: Any,
    cfg: DictConfig | Mapping[str, Any],
    run_dir: str | os.PathLike[str],
    manifest: Manifest,
) -> Trackers:
    """Trackers for the `logger` config group (JSONL always first). Nothing is started until
    `with`/`start()`, so building is cheap and config errors surface before any run is created
    remotely."""
    trackers: list[Tracker] = [JsonlTracker(), *configured_trackers(logger_cfg)]
    every = setting(logger_cfg, "log_every_n_steps")
    samples = setting(logger_cfg, "rollout_samples")
    return Trackers(
        trackers,
        cfg,
        run_dir,
        manifest,
        log_every_n_steps=int(every) if every is not None else 1,
        rollout_samples=int(samples) if samples is not None else None,
    )
