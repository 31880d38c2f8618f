"""Schema of the `environment` config group."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EnvConfig:
    name: str = "arithmetic"  # registry key in rlexp.envs.registry
    # Dataset source (HF id or package data); ignored by generated environments.
    dataset: str | None = None
    revision: str | None = None
    split: str = "train"
    eval_split: str = "test"
    eval_size: int = 0  # 0 = the whole eval split
    max_turns: int = 1
    # Environment-specific knobs (e.g. arithmetic's operand range); validated by the environment itself.
    options: dict[str, Any] = field(default_factory=dict)
