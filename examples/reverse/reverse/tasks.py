"""Write a 6-letter `abcde` string backwards (answers of 6 tokens: "cadeba:" -> "abedac"). An
environment of a user's own, named in config by import path (`reverse.tasks:Reverse`); the reward is
rlexp's `reward=rule`, which pays `Check.score`, the fraction of positions right, so a random policy
already sees reward differences within a group.

Why this task beside `environment=sort`: sort's answer depends only on how many of each digit the
prompt holds, so every answer position can be written from counts; here each answer position copies
one prompt position, a different one for each, so the model must attend by position. Held-out
strings (a fixed quarter, 3,906 of 15,625) are never trained on; evaluation scores the first 200 of
them.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from rlexp.envs.base import Check, Environment
from rlexp.types import Problem, Sample

_SPLIT_SEED = 6  # the split is part of the task, not of the run seed
_LETTERS = "abcde"


@dataclass
class ReverseOptions:
    length: int = 6
    held_out_shown: int = (
        200  # held-out strings scored at each evaluation (the first of a fixed shuffle)
    )


class Reverse(Environment):
    Options = ReverseOptions

    @property
    def min_response_tokens(self) -> int:
        return self.opts.length

    def load_samples(self, split: str) -> list[Sample]:
        strings = ["".join(t) for t in itertools.product(_LETTERS, repeat=self.opts.length)]
        random.Random(_SPLIT_SEED).shuffle(strings)
        k = len(strings) // 4
        chosen = (
            strings[:k][: self.opts.held_out_shown] if split == self.cfg.eval_split else strings[k:]
        )
        return [Sample(Problem(id=s, prompt=f"{s}:"), answer=s[::-1]) for s in chosen]

    def extract(self, problem: Problem, response: str) -> str | None:
        got = response.strip()
        return got if got and set(got) <= set(_LETTERS) else None

    def check(self, sample: Sample, response: str) -> Check:
        """Exact match is `correct`; `score` is the fraction of the answer's positions right
        (partial credit)."""
        got = self.extract(sample.problem, response)
        right = sum(a == b for a, b in zip(got or "", sample.answer))
        return Check(
            correct=got == sample.answer,
            parseable=got is not None,
            extracted=got,
            score=right / len(sample.answer),
        )
