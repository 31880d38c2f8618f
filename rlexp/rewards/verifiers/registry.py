"""Builds verifiers from config. It imports every built-in implementation so that `@register_rule` has
run before a rule name is looked up; `base` cannot, since the implementations import it. A user's rule is named
by import path (`options.rule: package.module:Class`) or registered by a module listed in `plugins`."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from rlexp.config.model import ModelConfig
from rlexp.config.reward import MODEL_KINDS, VerifierConfig, VerifierKind, is_served
from rlexp.models.hf import CheckpointError, resolve_checkpoint
from rlexp.rewards.base import plain
from rlexp.rewards.verifiers import arithmetic  # noqa: F401  (registers the arithmetic rules)
from rlexp.rewards.verifiers.answers import FormatVerifier, MajorityVerifier
from rlexp.rewards.verifiers.base import RULES, Rule, RuleVerifier, ServedVerifier, Verifier
from rlexp.rewards.verifiers.lm_judge import LMJudgeVerifier
from rlexp.rewards.verifiers.reward_model import RewardModelVerifier
from rlexp.rewards.verifiers.tiny import ensure_tiny_verifier
from rlexp.rewards.verifiers.tiny_panels import TINY_VERIFIERS

# Options read by the reward that combines verifiers (Weaver's per-verifier threshold), not by the verifier.
RESERVED_OPTIONS = frozenset({"threshold"})
VERIFIER_KINDS = tuple(k.value for k in VerifierKind)


def rule_names() -> list[str]:
    return RULES.names()


def build_rule(options: dict[str, Any], who: str) -> Rule:
    options = {k: v for k, v in options.items() if k not in RESERVED_OPTIONS}
    rule_name = options.pop("rule", None)
    if rule_name is None:
        raise ValueError(f"{who}: a rule verifier needs options.rule; choose one of {rule_names()}")
    cls = RULES.get(str(rule_name))  # a built-in, a plug-in's, or package.module:Class
    try:
        return cls(**options)
    except TypeError as e:
        raise ValueError(f"{who}: bad options {options} for rule {rule_name!r}: {e}") from e


def build_verifier(cfg: VerifierConfig | dict[str, Any], env: Any = None, *, served: bool = True,
                   device: str = "cpu") -> Verifier:
    """One verifier from its config (a dataclass, an OmegaConf node or a plain dict).

    `served=True` (inside a run) turns a model verifier into a stand-in scored by its own service;
    `served=False` loads the model in this process (the verifier's service itself, `rlexp eval`, tests).
    `env` is needed by the kinds that read answers (`format`, `majority`) and picks the judge template."""
    cfg = plain(cfg)
    if isinstance(cfg, dict):
        cfg = VerifierConfig(**cfg)
    options = dict(plain(cfg.options) or {})
    kind = str(cfg.kind)
    name = cfg.name or str(options.get("rule", kind))
    if kind == "rule":
        return RuleVerifier(name, build_rule(options, f"verifier {name!r}"))
    if kind in ("format", "majority"):
        if env is None:
            raise ValueError(f"verifier {name!r}: kind {kind} reads answers through the environment")
        return (FormatVerifier if kind == "format" else MajorityVerifier)(name, env)
    model_options = {k: v for k, v in options.items() if k not in RESERVED_OPTIONS}
    if kind in MODEL_KINDS and served and is_served(cfg):
        return ServedVerifier(name, kind, cfg)
    if kind == "reward_model":
        return RewardModelVerifier(name, {**model_options, "device": device})
    if kind == "lm_judge":
        judge = LMJudgeVerifier(name, model_options, getattr(env, "answer_format", "free_form"))
        if not judge.opts.policy:
            judge.load(device=device)
        return judge  # a policy judge is attached to the generators by the reward service
    raise ValueError(f"verifier {cfg.name!r}: unknown kind {kind!r}; choose one of {list(VERIFIER_KINDS)}")


def verifier_checkpoint(v: VerifierConfig) -> VerifierConfig:
    """`v` with `options.path` set to its checkpoint folder; `tiny` builds a stand-in, `hf_repo` reads the
    Hugging Face cache and never downloads (the error gives the command)."""
    v = VerifierConfig(**v) if isinstance(v, dict) else v
    o = dict(v.options)
    if "tiny" in o:
        name = o.pop("tiny")
        if name not in TINY_VERIFIERS:
            raise ValueError(f"verifier {v.name!r}: options.tiny={name!r} is not a tiny verifier; choose one of "
                              f"{sorted(TINY_VERIFIERS)}")
        o["path"] = str(ensure_tiny_verifier(TINY_VERIFIERS[name]))
    elif "hf_repo" in o:
        repo, revision = o.pop("hf_repo"), str(o.pop("revision", "main"))
        try:
            o["path"] = str(resolve_checkpoint(ModelConfig(name=v.name, hf_repo=repo, revision=revision)))
        except CheckpointError as e:
            msg = str(e).replace("set model.path to a local folder", f"set options.path of verifier {v.name}")
            raise CheckpointError(f"verifier {v.name!r} ({v.kind}): {msg}") from None
    elif not o.get("path") or not Path(str(o["path"])).expanduser().is_dir():
        raise CheckpointError(f"verifier {v.name!r} ({v.kind}): options.path={o.get('path')!r} is not a folder; give "
                              f"`path` (a local Hugging Face folder), `hf_repo` + `revision`, or `tiny`")
    return replace(v, options=o)
