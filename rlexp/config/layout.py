"""Which GPUs each role's processes get on a host: trainer ranks first, then each generator replica, then each
served model verifier's replicas; and which model verifiers a run serves (what `rlexp plan` counts)."""
from __future__ import annotations

from typing import Any

from rlexp.config.reward import VerifierConfig, chosen_verifiers, is_served


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


def reward_verifiers(c: Any) -> list[VerifierConfig]:
    """The served model verifiers the configured reward scores with (`chosen_verifiers` over `reward.verifiers`,
    or else the members of `verifier_set`). A choice the reward would refuse serves nothing here and fails with
    the reward's own message in `prepare`."""
    reward = _field(c, "reward")
    members = list(_field(reward, "verifiers", None) or []) or list(_field(_field(c, "verifier_set"), "members", None)
                                                                   or [])
    options = dict(_plain(_field(reward, "options", None)) or {})
    try:
        chosen = chosen_verifiers(str(_field(reward, "name", "")), options, [_verifier(v) for v in members])
    except ValueError:
        return []
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
