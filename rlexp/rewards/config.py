"""Schema of the `reward` config group."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class VerifierConfig:
    name: str = ""
    kind: str = "rule"  # rule | reward_model | lm_judge
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardConfig:
    name: str = "rule"  # registry key: rule | single_rm | weaver | annotated
    verifiers: list[VerifierConfig] = field(default_factory=list)
    replicas: int = 1
    options: dict[str, Any] = field(default_factory=dict)
