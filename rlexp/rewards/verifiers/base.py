"""The verifier interface and its three kinds: rule, reward_model, lm_judge.

A verifier maps (Problem, response) to a float, higher meaning "more likely correct". It never sees a
`Sample`, so it has no gold answer to consult. Rule verifiers are small classes registered by name with
`@register_rule`; `VerifierConfig(kind="rule", options={"rule": <name>, ...})` selects one, and the other
options (except the reward-level keys in `RESERVED_OPTIONS`) are passed to its constructor.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from rlexp.rewards.base import plain
from rlexp.rewards.config import VerifierConfig
from rlexp.types import Problem

# Options read by the reward that combines verifiers (Weaver's per-verifier threshold), not by the verifier.
RESERVED_OPTIONS = frozenset({"threshold"})
VERIFIER_KINDS = ("rule", "reward_model", "lm_judge")


class Verifier:
    kind: ClassVar[str] = ""

    def __init__(self, name: str) -> None:
        self.name = name

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        """Scores as a float64 array of len(texts)."""
        raise NotImplementedError


class Rule:
    """One cheap check of a response against what the prompt says; returns 1.0 (accept) or 0.0."""

    name: ClassVar[str] = ""

    def check(self, problem: Problem, text: str) -> float:
        raise NotImplementedError


_RULES: dict[str, type[Rule]] = {}


def register_rule(name: str) -> Callable[[type[Rule]], type[Rule]]:
    def deco(cls: type[Rule]) -> type[Rule]:
        cls.name = name
        _RULES[name] = cls
        return cls

    return deco


def rule_names() -> list[str]:
    _import_builtin_rules()
    return sorted(_RULES)


def _import_builtin_rules() -> None:
    from rlexp.rewards.verifiers import arithmetic  # noqa: F401  (registers the arithmetic rules)


class RuleVerifier(Verifier):
    kind = "rule"

    def __init__(self, name: str, rule: Rule) -> None:
        super().__init__(name)
        self.rule = rule

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        return np.array([float(self.rule.check(p, t)) for p, t in zip(problems, texts)], dtype=np.float64)


def build_rule(options: dict[str, Any], who: str) -> Rule:
    _import_builtin_rules()
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
    if kind == "reward_model":
        from rlexp.rewards.verifiers.reward_model import RewardModelVerifier

        name = cfg.name or "reward_model"
        return RewardModelVerifier(name, {k: v for k, v in options.items() if k not in RESERVED_OPTIONS})
    if kind == "lm_judge":
        from rlexp.rewards.verifiers.lm_judge import LMJudgeVerifier

        name = cfg.name or "lm_judge"
        return LMJudgeVerifier(name, {k: v for k, v in options.items() if k not in RESERVED_OPTIONS})
    raise ValueError(f"verifier {cfg.name!r}: unknown kind {kind!r}; choose one of {list(VERIFIER_KINDS)}")
