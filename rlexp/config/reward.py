"""Schema of the `reward` config group."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlexp.config.trust import CODE, DATA, OPTIONS

# rule: a task-specific check (registered rules); format: the response states a readable answer; majority:
# it agrees with its group's most common answer; reward_model / lm_judge: a model, served apart.
VerifierKind = StrEnum("VerifierKind", {v: v for v in ("rule", "format", "majority", "reward_model", "lm_judge")})


@dataclass
class VerifierConfig:
    # The verifier's name, unique within its set: metrics (`weaver/<name>/tpr`) and
    # `reward.options.verifier` use it.
    name: str = field(default="", metadata=DATA)
    # What scores: rule | format | majority | reward_model | lm_judge.
    kind: VerifierKind = VerifierKind.rule
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
    # Empty: the members of `verifier_set`. A reward that lists its own verifiers uses those instead.
    verifiers: list[VerifierConfig] = field(default_factory=list)
    # Processes of the reward's own service; 1 with a pure reward: scored in the controller.
    replicas: int = 1
    # Reward-specific options (e.g. Weaver's, rlexp.rewards.weaver.WeaverOptions), checked by the
    # reward.
    options: dict[str, Any] = field(default_factory=dict, metadata=OPTIONS)


# Verifier kinds that hold a model of their own: each gets a service (and, on CUDA, one GPU per replica).
MODEL_KINDS = frozenset({"reward_model", "lm_judge"})
# Options of reward=single_rm that belong to the reward, not to a verifier given inline.
SINGLE_RM_OPTIONS = frozenset({"kind", "name", "transform", "verifier", "debias_answers", "reference_groups"})


def is_served(v: VerifierConfig) -> bool:
    """A model verifier that is not the policy itself: it gets a service of its own."""
    return str(v.kind) in MODEL_KINDS and not bool((v.options or {}).get("policy", False))


def chosen_verifiers(reward: str, options: dict[str, Any], members: list[VerifierConfig]) -> list[VerifierConfig]:
    """The verifiers a reward scores with, from its options and the available members (its own list or the
    verifier set's): reward=weaver (and verifier_mean / verifier_vote, which extend it) uses every member;
    reward=single_rm one: given inline (`options.kind`), named (`options.verifier`), the only member, or else
    the first reward model; any other reward none. The reward and the GPU layout both ask here."""
    if reward == "weaver":
        return list(members)
    if reward != "single_rm":
        return []
    names = [v.name for v in members]
    if "kind" in options:  # a verifier of its own, given inline
        return [VerifierConfig(name=str(options.get("name", "")), kind=str(options["kind"]),  # type: ignore[arg-type]
                               options={k: v for k, v in options.items() if k not in SINGLE_RM_OPTIONS})]
    if "verifier" in options:  # one member of the verifier set, by name
        match = [v for v in members if v.name == options["verifier"]]
        if not match:
            raise ValueError(f"reward=single_rm: options.verifier={options['verifier']!r} is not in the verifier "
                             f"set {names}; choose one of them")
        return match[:1]
    if len(members) == 1:
        return list(members)
    rms = [v for v in members if str(v.kind) == "reward_model"]  # "the single reward model"
    if not rms:
        raise ValueError(f"reward=single_rm: the verifier set {names} has no reward_model; choose one member "
                         f"with reward.options.verifier=NAME, or give options.kind and its options")
    return rms[:1]
