"""Schema of the `reward` config group."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# rule: a task-specific check (registered rules); format: the response states a readable answer; majority:
# it agrees with its group's most common answer; reward_model / lm_judge: a model, served apart.
VerifierKind = StrEnum("VerifierKind", {v: v for v in ("rule", "format", "majority", "reward_model", "lm_judge")})


@dataclass
class VerifierConfig:
    name: str = ""
    kind: VerifierKind = VerifierKind.rule
    # Model kinds take their checkpoint as `path` (a local folder), `hf_repo` + `revision` (the Hugging Face
    # cache; never downloaded implicitly) or `tiny` (a stand-in trained here: rlexp.rewards.verifiers.tiny.py).
    options: dict[str, Any] = field(default_factory=dict)
    # Model kinds: processes of the verifier's own service (one GPU each on CUDA), and the memory one
    # replica needs, which `rlexp plan` counts.
    replicas: int = 1
    memory_gb: float = 0.0


@dataclass
class VerifierSetConfig:
    """The weak verifiers available for one environment; `verifier_set` defaults to the environment's name
    (rlexp/conf/verifier_set/<environment>.yaml), so `reward=weaver` finds a set that fits the task."""

    name: str = ""
    members: list[VerifierConfig] = field(default_factory=list)


@dataclass
class RewardConfig:
    name: str = "rule"  # registry key: rule | single_rm | weaver | annotated
    # Empty: the members of `verifier_set`. A reward that lists its own verifiers uses those instead.
    verifiers: list[VerifierConfig] = field(default_factory=list)
    replicas: int = 1
    options: dict[str, Any] = field(default_factory=dict)
