"""Plain data passed between rlexp's services.

Kept free of torch so that rewards, environments and trackers can be imported (and tested) without
spawning anything. The split between `Problem` and `Sample` is deliberate: label-free rewards such as
Weaver receive `Problem`s, which have no gold-answer field at all, so a gold label cannot leak into them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """What a policy (and a label-free verifier) may see: the id and the formatted prompt."""

    id: str
    prompt: str
    # Environment-specific, non-secret data (e.g. the shuffled choice letters of a multiple-choice item).
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """A problem together with its gold answer. Only gold-using rewards and evaluation read `answer`."""

    problem: Problem
    answer: str

    @property
    def id(self) -> str:
        return self.problem.id


@dataclass
class Completion:
    """One generated response, with the sampling logprobs the trainer needs for off-policy correction."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    policy_version: int
    finish_reason: str = "stop"


@dataclass
class RewardOutput:
    """Rewards for a batch of responses plus per-step diagnostics that trackers log as-is."""

    rewards: list[float]
    metrics: dict[str, float] = field(default_factory=dict)
    # Per response extras (e.g. per-verifier scores) written to rollout tables; must be JSON-serialisable.
    details: list[dict[str, Any]] = field(default_factory=list)
