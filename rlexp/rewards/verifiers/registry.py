"""Builds verifiers from config. It imports every built-in implementation so that `@register_rule` has
run before a rule name is looked up; `base` cannot, since the implementations import it. Add new rule
modules to the import list below."""
from __future__ import annotations

from typing import Any

from rlexp.config.reward import VerifierConfig
from rlexp.rewards.base import plain
from rlexp.rewards.verifiers import arithmetic  # noqa: F401  (registers the arithmetic rules)
from rlexp.rewards.verifiers.base import _RULES, Rule, RuleVerifier, Verifier
from rlexp.rewards.verifiers.lm_judge import LMJudgeVerifier
from rlexp.rewards.verifiers.reward_model import RewardModelVerifier

# Options read by the reward that combines verifiers (Weaver's per-verifier threshold), not by the verifier.
RESERVED_OPTIONS = frozenset({"threshold"})
VERIFIER_KINDS = ("rule", "reward_model", "lm_judge")


def rule_names() -> list[str]:
    return sorted(_RULES)


def build_rule(options: dict[str, Any], who: str) -> Rule:
    options = {k: v for k, v in options.items() if k not in RESERVED_OPTIONS}
    rule_name = options.pop("rule", None)
    if rule_name is None:
        raise ValueError(f"{who}: a rule verifier needs options.rule; choose one of {rule_names()}")
    if rule_name not in _RULES:
        raise ValueError(f"{who}: unknown rule {rule_name!r}; choose one of {rule_names()}")
    try:
        return _RULES[rule_name](**options)
    except TypeError as e:
        raise ValueError(f"{who}: bad options {options} for rule {rule_name!r}: {e}") from e


def build_verifier(cfg: VerifierConfig | dict[str, Any]) -> Verifier:
    """Build one verifier from its config (a dataclass, an OmegaConf node or a plain dict)."""
    cfg = plain(cfg)
    if isinstance(cfg, dict):
        cfg = VerifierConfig(**cfg)
    options = dict(plain(cfg.options) or {})
    kind = cfg.kind
    if kind == "rule":
        name = cfg.name or str(options.get("rule", "rule"))
        return RuleVerifier(name, build_rule(options, f"verifier {name!r}"))
    model_options = {k: v for k, v in options.items() if k not in RESERVED_OPTIONS}
    if kind == "reward_model":
        return RewardModelVerifier(cfg.name or "reward_model", model_options)
    if kind == "lm_judge":
        return LMJudgeVerifier(cfg.name or "lm_judge", model_options)
    raise ValueError(f"verifier {cfg.name!r}: unknown kind {kind!r}; choose one of {list(VERIFIER_KINDS)}")
