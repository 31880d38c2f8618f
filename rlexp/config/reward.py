"""Schema of the `reward` config group."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

VerifierKind = StrEnum("VerifierKind", {v: v for v in ("rule", "reward_model", "lm_judge")})


@dataclass
class VerifierConfig:
    name: str = ""
    kind: VerifierKind = VerifierKind.rule
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardConfig:
    name: str = "rule"  # registry key: rule | single_rm | weaver | annotated
    verifiers: list[VerifierConfig] = field(default_factory=list)
    replicas: int = 1
    options: dict[str, Any] = field(default_factory=dict)
