"""Which GPUs each role's processes get on a host: trainer ranks first, then each generator replica, then each
served model verifier's replicas; and which model verifiers a run serves (what `rlexp plan` counts)."""
from __future__ import annotations

from typing import Any

from rlexp.config.reward import VerifierConfig

# Verifier kinds that hold a model of their own and get a service (one GPU per replica on CUDA). Kept in step with
# rlexp.rewards.verifiers.registry.MODEL_KINDS, which this module cannot import (it pulls in torch and the models).
MODEL_KINDS = frozenset({"reward_model", "lm_judge"})
# Options of `reward=single_rm` that belong to the reward, not to an inline verifier (rlexp/rewards/single_rm.py).
_SINGLE_RM_OWN_OPTIONS = frozenset({"kind", "name", "transform", "verifier"})


def _plain(x: Any) -> Any:
    """OmegaConf containers as plain dicts/lists; anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return x
    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True)
    return x


def _field(node: Any, name: str, default: Any = None) -> Any:
    if node is None:
        return default
    try:
        value = node[name] if isinstance(node, dict) else getattr(node, name)
    except (AttributeError, KeyError):
        return default
    return default if value is None else value


def _verifier(v: Any) -> VerifierConfig:
    if isinstance(v, VerifierConfig):
        return v
    v = _plain(v)
    return VerifierConfig(name=str(v.get("name", "")), kind=str(v.get("kind", "rule")),  # type: ignore[arg-type]
                          options=dict(v.get("options") or {}), replicas=int(v.get("replicas", 1)),
                          memory_gb=float(v.get("memory_gb", 0.0)))


def is_served(v: VerifierConfig) -> bool:
    """A model verifier that is not the policy itself: it gets a service (and GPUs) of its own."""
    return str(v.kind) in MODEL_KINDS and not bool((_plain(v.options) or {}).get("policy", False))


def reward_verifiers(c: Any) -> list[VerifierConfig]:
    """The served model verifiers the configured reward scores with, in order: `reward.verifiers`, or else the
    members of `verifier_set`. reward=weaver (also verifier_mean / verifier_vote, which extend it): every model
    member; reward=single_rm: the one it picks (an inline `options.kind` verifier, the member named by
    `options.verifier`, the only member, or else the first reward_model); any other reward (rule, annotated):
    none. Mirrors the rewards' own choice (rlexp/rewards/weaver.py, single_rm.py); a choice the reward would
    refuse (no such member) serves nothing here and fails with the reward's own message in `prepare`."""
    reward = _field(c, "reward")
    name = str(_field(reward, "name", ""))
    members = list(_field(reward, "verifiers", None) or []) or list(_field(_field(c, "verifier_set"), "members", None)
                                                                   or [])
    members = [_verifier(v) for v in members]
    if name == "weaver":
        chosen = members
    elif name == "single_rm":
        options = dict(_plain(_field(reward, "options", None)) or {})
        if "kind" in options:
            chosen = [VerifierConfig(name=str(options.get("name", "")), kind=str(options["kind"]),  # type: ignore[arg-type]
                                     options={k: v for k, v in options.items() if k not in _SINGLE_RM_OWN_OPTIONS})]
        elif "verifier" in options:
            chosen = [v for v in members if v.name == options["verifier"]][:1]
        elif len(members) == 1:
            chosen = members
        else:
            chosen = [v for v in members if str(v.kind) == "reward_model"][:1]
    else:
        chosen = []
    return [v for v in chosen if is_served(v)]


def assign_gpus(c: Any) -> dict[str, list[str]]:
    """CUDA_VISIBLE_DEVICES per role and rank on this host: the trainer's ranks (and the reference
    model beside them) take GPUs 0..W-1, then each generator replica takes `generator.gpus_per_replica`,
    then every served model verifier (`reward_verifiers`) takes one GPU per replica, under the key
    `verifier_<name>` (one value per replica). Without it every process would open GPU 0. Empty on CPU.
    Fits are checked by `validate` and `rlexp plan`."""
    if c.cluster.device != "cuda":
        return {}
    world, per_gen = c.model.parallelism.trainer_world, c.generator.gpus_per_replica
    out = {"trainer": [str(r) for r in range(world)]}
    for i in range(c.generator.replicas):
        first = world + i * per_gen
        out[f"generator{i}"] = [",".join(str(first + j) for j in range(per_gen))]
    nxt = world + c.generator.replicas * per_gen
    for v in reward_verifiers(c):
        out[f"verifier_{v.name}"] = [str(nxt + j) for j in range(v.replicas)]
        nxt += v.replicas
    return out


def verifier_gpus(c: Any) -> int:
    """GPUs the served model verifiers take: one per replica."""
    return sum(v.replicas for v in reward_verifiers(c))


def gpus_needed(c: Any) -> int:
    return (c.model.parallelism.trainer_world + c.generator.replicas * c.generator.gpus_per_replica
            + verifier_gpus(c))
