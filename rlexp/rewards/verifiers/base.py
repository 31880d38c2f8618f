"""The verifier interface, rule verifiers, and the stand-in for a verifier whose model is served elsewhere.

A verifier maps (Problem, response) to a float, higher meaning "more likely correct". It never sees a
`Sample`, so it has no gold answer to consult. Rule verifiers are small classes registered by name with
`@register_rule`; `VerifierConfig(kind="rule", options={"rule": <name>, ...})` selects one, and the other
options (except the reward-level keys in `registry.RESERVED_OPTIONS`) are passed to its constructor.

Building from config lives in `registry`, which imports the implementations; this module imports none, so
implementations can import it without a cycle.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from rlexp.registry import Registry
from rlexp.types import Problem


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


RULES: Registry[type[Rule]] = Registry(
    "rule", Rule, "a subclass of rlexp.rewards.verifiers.base.Rule; see examples/my_task")
register_rule = RULES.register


class RuleVerifier(Verifier):
    kind = "rule"

    def __init__(self, name: str, rule: Rule) -> None:
        super().__init__(name)
        self.rule = rule

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        return np.array([float(self.rule.check(p, t)) for p, t in zip(problems, texts)], dtype=np.float64)


class ServedVerifier(Verifier):
    """A model verifier (reward model, LM judge) whose model lives in its own service: the reward service
    holds this stand-in and attaches the function that starts a remote scoring call once the services are
    up. `start` returns at once (anything with `.get()`), so a reward can keep every service busy at once."""

    def __init__(self, name: str, kind: str, cfg: Any) -> None:
        super().__init__(name)
        self.kind = kind  # type: ignore[misc]
        self.cfg = cfg  # its VerifierConfig: what its service builds
        self.remote: Callable[[list[Problem], list[str]], Any] | None = None

    def attach(self, remote: Callable[[list[Problem], list[str]], Any]) -> None:
        self.remote = remote

    def start(self, problems: list[Problem], texts: list[str]) -> Any:
        if self.remote is None:
            raise RuntimeError(f"{self.kind} verifier {self.name!r} is served by its own service, and none is "
                               f"attached: build the reward inside rlexp's actor graph (rlexp.run.launcher)")
        return self.remote(problems, texts)

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        return np.asarray(self.start(problems, texts).get(), dtype=np.float64)
