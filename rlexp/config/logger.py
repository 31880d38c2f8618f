"""Schema of the `logger` config group. The JSONL metrics file is always written."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlexp.config.trust import CODE, DATA, ENDPOINT, LOCATION, OPTIONS

# auto: WANDB_DISABLED / WANDB_MODE when set, else offline unless WANDB_API_KEY is set.
WandbMode = StrEnum("WandbMode", {v: v for v in ("auto", "offline", "online", "disabled")})


@dataclass
class WandbConfig:
    # Log to Weights & Biases (`logger=wandb` or `logger=all` set it).
    enabled: bool = False
    # auto: WANDB_DISABLED / WANDB_MODE when set, else offline unless WANDB_API_KEY is set.
    mode: WandbMode = WandbMode.auto
    # W&B project the runs go to.
    project: str = field(default="rlexp", metadata=DATA)
    # W&B team or user; null: the key's default.
    entity: str | None = field(default=None, metadata=ENDPOINT)
    system_metrics: bool = True  # W&B's own CPU/memory/disk/GPU sampler (its System panel)
    git: bool = True  # the manifest's commit and (redacted) remote in W&B's git fields


@dataclass
class MlflowConfig:
    # Log to MLflow (`logger=mlflow` or `logger=all` set it).
    enabled: bool = False
    # default: MLFLOW_TRACKING_URI, else a SQLite store under the runs folder
    tracking_uri: str | None = field(default=None, metadata=ENDPOINT)
    # MLflow experiment the runs (and a sweep's parent run) go to.
    experiment: str = field(default="rlexp", metadata=DATA)
    system_metrics: bool = True  # MLflow's own sampler (system/* metrics; needs psutil)
    # Register the final checkpoint (artifact `checkpoints/final`) as a version of this model name; None: don't.
    registered_model: str | None = field(default=None, metadata=DATA)


@dataclass
class TrackerConfig:
    """One more tracker (a plug-in's: docs/plugins.md, examples/my_tracker), beside JSONL and the
    sections above."""

    # A registered tracker's name (`@rlexp.tracking.base.register_tracker` in a module listed in
    # `plugins`), or package.module:Class for one outside rlexp.
    name: str = field(default="", metadata=CODE)
    # Its settings, checked against the tracker's `Options` dataclass before the run starts.
    options: dict[str, Any] = field(default_factory=dict, metadata=OPTIONS)


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    # Trackers of your own, each receiving the same metrics, tables and artifacts as the built-ins.
    trackers: list[TrackerConfig] = field(default_factory=list)
    # Steps between rows sent to W&B and MLflow (metrics.jsonl gets every step).
    log_every_n_steps: int = 1
    # Responses per rollout table (rows shown of each step's batch).
    rollout_samples: int = 8
    # Rollout tables (JSONL, W&B, MLflow) every this many steps and at the last step, apart from evaluation.
    rollout_every_n_steps: int = 10
    system_metrics_interval_s: float = 10.0  # sampling period of both trackers' system metrics
    # Where the default MLflow store lives (<runs_root>/mlruns). None: the folder holding the run dir (single
    # runs) or the sweep dir (multiruns), so a sweep's jobs share one store without any setting.
    runs_root: str | None = field(default=None, metadata=LOCATION)
