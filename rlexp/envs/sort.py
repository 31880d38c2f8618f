"""Sort a digit string ("01101001:" -> "00001111"): answers of several tokens, for measuring what long
answers cost (generation dominates once an answer is more than one token).

Why binary digits and length 8 by default: a random two-layer model on two CPU cores learns it within a few
hundred GRPO steps, measured (studies/peers/results/peers.md). The sorted string depends only on how many of each digit
the prompt holds, not on where they stand, so what is learned on training strings carries over to held-out
ones, as in `arithmetic`; but every one of the 8 answer tokens has to be right, each at its own position.

Reward and accuracy differ on purpose. `Check.score` is the fraction of positions that match the sorted
string, so `reward=rule` gives partial credit and a random policy already sees reward differences within a
group (an all-or-nothing reward would be zero for nearly every sample of a random policy). `Check.correct`
is the exact match of the whole string, which is what held-out accuracy counts.

Held-out strings are never drawn for training: a fixed quarter of the strings of each answer (answers with
fewer than 4 strings, such as all zeros, are only trained on). Training draws the answer uniformly first, so
the best constant answer is right once in `length + 1` times for binary strings.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from rlexp.envs.base import Check, Environment, register_env
from rlexp.types import Problem, Sample

_SPLIT_SEED = 20261130  # the split is a fixed function of the task, not of the run seed
_DIGITS = "0123456789"


@dataclass
class SortOptions:
    length: int = 8
    base: int = 2


@register_env("sort")
class Sort(Environment):
    Options = SortOptions

    def _shape(self) -> tuple[int, int]:
        n, base = self.opts.length, self.opts.base
        if not 2 <= base <= 10 or n < 2 or base ** n > 2_000_000:
            raise ValueError(f"environment.options length={n}, base={base}: need 2 <= base <= 10, length >= 2 and "
                             f"base ** length <= 2,000,000 (every string is enumerated to split the data); the "
                             f"answer is `length` tokens, so set algorithm.max_tokens={n}")
        return n, base

    @property
    def min_response_tokens(self) -> int:
        return self._shape()[0]

    def _split(self) -> tuple[dict[str, list[str]], list[str]]:
        """(training strings by answer, held-out strings)."""
        n, base = self._shape()
        by_answer: dict[str, list[str]] = {}
        for t in itertools.product(_DIGITS[:base], repeat=n):
            s = "".join(t)
            by_answer.setdefault("".join(sorted(s)), []).append(s)
        rng = random.Random(f"{_SPLIT_SEED}:{n}:{base}")
        train, held = {}, []
        for answer in sorted(by_answer):
            strings = by_answer[answer]
            rng.shuffle(strings)
            k = len(strings) // 4
            held += strings[:k]
            train[answer] = strings[k:]
        return train, held

    @staticmethod
    def _sample(s: str) -> Sample:
        return Sample(Problem(id=s, prompt=f"{s}:"), answer="".join(sorted(s)))

    def load_samples(self, split: str) -> list[Sample]:
        train, held = self._split()
        strings = held if split == self.cfg.eval_split else [s for a in sorted(train) for s in train[a]]
        return [self._sample(s) for s in strings]

    def sample_batch(self, n: int, rng: random.Random) -> list[Sample]:
        """Uniform over answers, then uniform over the training strings with that answer."""
        if not hasattr(self, "_by_answer"):
            train, _ = self._split()
            self._by_answer = [[self._sample(s) for s in train[a]] for a in sorted(train)]
        return [rng.choice(self._by_answer[rng.randrange(len(self._by_answer))]) for _ in range(n)]

    def extract(self, problem: Problem, response: str) -> str | None:
        n, base = self._shape()
        return response if len(response) == n and all(c in _DIGITS[:base] for c in response) else None

    def check(self, sample: Sample, response: str) -> Check:
        """Read as written (no stripping): a leading space would shift every position."""
        answer = sample.answer
        hits = sum(a == b for a, b in zip(answer, response))
        extracted = self.extract(sample.problem, response)
        return Check(correct=response == answer, parseable=extracted is not None, extracted=extracted,
                     score=hits / len(answer))
