"""A verifier kind of a user's own, outside the rlexp package: `short_answer` says yes when a
response is a bare answer (the environment can read one, and the whole response is at most
`max_chars` characters), the kind of cheap, label-free signal Weaver combines with others. It reads
no gold label: only the problem and the response.

One module and one YAML (conf/verifier_set/arithmetic_short.yaml, which names the kind by import
path, `short_answer:ShortAnswer`); registering a name (`@register_verifier_kind`) also lets a module
listed in `plugins` offer it as `kind: short_answer`. rlexp imports this module in every process
that builds the verifier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlexp.rewards.verifiers.base import Verifier
from rlexp.rewards.verifiers.kinds import VerifierKind, register_verifier_kind
from rlexp.types import Problem


@dataclass
class ShortAnswerOptions:
    # Longest response, in characters after stripping whitespace, that still counts as a bare
    # answer.
    max_chars: int = 8


class ShortAnswerVerifier(Verifier):
    kind = "short_answer"

    def __init__(self, name: str, env: Any, max_chars: int) -> None:
        super().__init__(name)
        self.env, self.max_chars = env, max_chars

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        return np.array(
            [
                float(self.env.extract(p, t) is not None and len(t.strip()) <= self.max_chars)
                for p, t in zip(problems, texts)
            ]
        )


@register_verifier_kind("short_answer")
class ShortAnswer(VerifierKind):
    """Generic (any environment that extracts answers), no model of its own, and measures
    readability rather than correctness, so Weaver may give it a separable role."""

    generic = True
    separable = True
    Options = ShortAnswerOptions

    @classmethod
    def build(cls, name: str, options: ShortAnswerOptions, env: Any, device: str) -> Verifier:
        if env is None:
            raise ValueError(
                f"verifier {name!r}: kind short_answer reads answers through the environment"
            )
        if options.max_chars < 1:
            raise ValueError(
                f"verifier {name!r}: options.max_chars={options.max_chars} must be >= 1"
            )
        return ShortAnswerVerifier(name, env, options.max_chars)
