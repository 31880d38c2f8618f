"""An LM-as-judge verifier: the interface only; the model behind it is injected after the actors spawn.

An LM judge is a generator (vLLM or the policy's own engine) that lives in another actor, so the reward
cannot build it from config. The reward service calls `Reward.attach_judge(name, handle)` with a callable
that takes rendered judge prompts and returns one score per prompt (e.g. P("Yes") of the judge, or a
parsed 1-10 grade). Higher means "more likely correct"; Weaver min-max normalises and thresholds it like
any other verifier, so the scale does not matter.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlexp.rewards.verifiers.base import Verifier
from rlexp.types import Problem

DEFAULT_TEMPLATE = ("Problem:\n{prompt}\n\nProposed answer:\n{response}\n\n"
                    "Is the proposed answer correct? Answer Yes or No.")


class LMJudgeVerifier(Verifier):
    kind = "lm_judge"

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__(name)
        unknown = set(options) - {"template"}
        if unknown:
            raise ValueError(f"verifier {name!r}: unknown lm_judge options {sorted(unknown)} (known: template)")
        self.template = str(options.get("template", DEFAULT_TEMPLATE))
        self.handle: Callable[[list[str]], list[float]] | None = None

    def attach(self, handle: Callable[[list[str]], list[float]]) -> None:
        self.handle = handle

    def render(self, problems: list[Problem], texts: list[str]) -> list[str]:
        return [self.template.format(prompt=p.prompt, response=t) for p, t in zip(problems, texts)]

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        if self.handle is None:
            raise RuntimeError(f"lm_judge verifier {self.name!r} has no model attached; the reward service must "
                               f"call reward.attach_judge({self.name!r}, handle) before scoring")
        scores = list(self.handle(self.render(problems, texts)))
        if len(scores) != len(texts):
            raise RuntimeError(f"lm_judge {self.name!r}: handle returned {len(scores)} scores for {len(texts)}")
        return np.asarray(scores, dtype=np.float64)
