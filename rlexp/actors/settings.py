"""What each actor of the graph is built from: one typed settings object per actor class.

An actor takes its settings plus keyword-only arguments for what only the launcher knows once processes exist
(a weight transport, a rendezvous port). The wiring table (`rlexp.run.wiring.roles`) fills these from the run's
config once, for the actor graph and for its in-process twin alike, so an argument can be neither forgotten in
one of them nor passed in the wrong position.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlexp.config.environment import EnvConfig
from rlexp.config.model import ModelConfig
from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.config.schema import AlgorithmConfig, TrainerConfig
from rlexp.models.parallel import PolicySettings


@dataclass(frozen=True)
class TrainerSettings:
    policy: PolicySettings
    trainer: TrainerConfig
    algorithm: AlgorithmConfig
    total_steps: int
    seed: int


@dataclass(frozen=True)
class GeneratorSettings:
    """One generator replica: its backend and backend options (`rlexp.models.backends.build_backend`)."""

    model: ModelConfig
    model_dir: str
    backend: str
    seed: int
    threads: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    gpus: str | None = None  # this replica's CUDA_VISIBLE_DEVICES (None on CPU)


@dataclass(frozen=True)
class VerifierSettings:
    """One model verifier's service; `gpus[rank]` per replica on CUDA."""

    verifier: VerifierConfig
    environment: EnvConfig
    threads: int = 0
    device: str = "cpu"
    gpus: list[str] | None = None


@dataclass(frozen=True)
class RewardSettings:
    reward: RewardConfig
    environment: EnvConfig


@dataclass(frozen=True)
class BufferSettings:
    seed: int
    max_policy_age: int
