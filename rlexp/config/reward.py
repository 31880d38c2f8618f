"""Schema of the `reward` config group."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlexp.config.trust import CODE, DATA, OPTIONS


@dataclass
class VerifierConfig:
    # The verifier's name, unique within its set: metrics (`weaver/<name>/tpr`) and
    # `reward.options.verifier` use it.
    name: str = field(default="", metadata=DATA)
    # A registered verifier kind (rlexp/rewards/verifiers/kinds.py): rule (a task-specific check),
    # format (the response states a readable answer), majority (it agrees with its group's most
    # common answer), reward_model / lm_judge (a model, served apart); a plug-in's, or
    # package.module:Class for one outside rlexp.
    kind: str = field(default="rule", metadata=CODE)
    # Model kinds take their checkpoint as `path` (a local folder), `hf_repo` + `revision` (the Hugging Face
    # cache; never downloaded implicitly) or `tiny` (a stand-in trained here: rlexp.rewards.verifiers.tiny.py).
    options: dict[str, Any] = field(default_factory=dict, metadata=OPTIONS)
    # Model kinds: processes of the verifier's own service (one GPU each on CUDA), and the memory one
    # replica needs, which `rlexp plan` counts.
    replicas: int = 1
    # GPU memory one replica needs, in GiB, counted by `rlexp plan` (0: not given: a stand-in or an
    # unsized checkpoint).
    memory_gb: float = 0.0


@dataclass
class VerifierSetConfig:
    """The weak verifiers available for one environment; `verifier_set` defaults to the environment's name
    (conf/verifier_set/<environment>.yaml), so `reward=weaver` finds a set that fits the task."""

    # The set's name (conf/verifier_set/<name>.yaml), recorded in the manifest.
    name: str = field(default="", metadata=DATA)
    members: list[VerifierConfig] = field(default_factory=list)


@dataclass
class RewardConfig:
    name: str = field(default="rule", metadata=CODE)  # registry key: rule | single_rm | weaver | annotated
    # Empty: the members of `verifier_set`. A reward that lists its own verifiers uses those
    # instead; which of them it scores with, the reward declares
    # (`rlexp.rewards.base.Reward.chosen_verifiers`).
    verifiers: list[VerifierConfig] = field(default_factory=list)
    # Processes of the reward's own service; 1 with a pure reward: scored in the controller.
    replicas: int = 1
    # Reward-specific options (e.g. Weaver's, rlexp.rewards.weaver.WeaverOptions), checked by the
    # reward.
    options: dict[str, Any] = field(default_factory=dict, metadata=OPTIONS)
