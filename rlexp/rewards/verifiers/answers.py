"""Label-free verifiers built on the environment's answer extraction: is there an answer at all
(`format`), and does it agree with what most of the group answered (`majority`, as in Weaver)?

Both read `Environment.extract(problem, response)`, which returns the answer a response gives without
judging it, so they see no gold label: extraction needs only the problem and the response.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from rlexp.rewards.verifiers.base import Verifier
from rlexp.types import Problem


class FormatVerifier(Verifier):
    """1 when the response states an answer the environment can read (a boxed expression, a letter, a
    digit), else 0: cheap, and a strong signal early in training when a policy rambles."""

    kind = "format"

    def __init__(self, name: str, env: Any) -> None:
        super().__init__(name)
        self.env = env

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        return np.array([float(self.env.extract(p, t) is not None) for p, t in zip(problems, texts)])


class MajorityVerifier(Verifier):
    """1 when the response's answer is the most common answer among the responses to the same problem
    (ties: every most-common answer counts), 0 otherwise or when it gives no answer. Responses to one
    problem arrive next to each other; a run of equal `Problem.id`s is one group."""

    kind = "majority"

    def __init__(self, name: str, env: Any) -> None:
        super().__init__(name)
        self.env = env

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        answers = [self.env.extract(p, t) for p, t in zip(problems, texts)]
        out = np.zeros(len(texts))
        start = 0
        for i in range(1, len(texts) + 1):
            if i == len(texts) or problems[i].id != problems[start].id:
                counts = Counter(a for a in answers[start:i] if a is not None)
                if counts:
                    top = max(counts.values())
                    for j in range(start, i):
                        out[j] = float(answers[j] is not None and counts[answers[j]] == top)
                start = i
        return out
