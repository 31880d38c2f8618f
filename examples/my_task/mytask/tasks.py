"""Count the `a`s in an 8-letter a/b string ("abbabaab:" -> "4"): an environment, a near-miss reward
and a rule verifier that live in a user's own package. Config names them by import path
(`mytask.tasks:CountA`), and rlexp imports this module in every process of the run (the config
folder's parent is searched).

Why this task: one answer token, 256 strings, and the answer depends only on how many `a`s there
are, so a tiny model on a CPU moves its reward within a few steps. Held-out strings (a fixed
quarter) are never trained on.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from rlexp.envs.base import Check, Environment
from rlexp.rewards.base import Reward
from rlexp.rewards.verifiers.base import Rule
from rlexp.types import Problem, RewardOutput, Sample

_SPLIT_SEED = 8  # the split is part of the task, not of the run seed


@dataclass
class CountAOptions:
    length: int = 8


class CountA(Environment):
    Options = CountAOptions

    def load_samples(self, split: str) -> list[Sample]:
        strings = ["".join(t) for t in itertools.product("ab", repeat=self.opts.length)]
        random.Random(_SPLIT_SEED).shuffle(strings)
        k = len(strings) // 4
        chosen = strings[:k] if split == self.cfg.eval_split else strings[k:]
        return [Sample(Problem(id=s, prompt=f"{s}:"), answer=str(s.count("a"))) for s in chosen]

    def extract(self, problem: Problem, response: str) -> str | None:
        return response.strip() if response.strip().isdigit() else None

    def check(self, sample: Sample, response: str) -> Check:
        got = self.extract(sample.problem, response)
        return Check(correct=got == sample.answer, parseable=got is not None, extracted=got)


class NearMiss(Reward):
    """1.0 for the right count, `options.near` (0.5) for a count one off, 0.0 otherwise: partial
    credit, so a random policy already sees reward differences within a group."""

    needs_gold = True

    def _score(self, samples: list[Sample], texts: list[str], group_size: int) -> RewardOutput:
        near = float(self.cfg.options.get("near", 0.5))
        rewards = []
        for s, t in zip(samples, texts):
            got = self.env.extract(s.problem, t)
            off = abs(int(got) - int(s.answer)) if got is not None else None
            rewards.append(1.0 if off == 0 else near if off == 1 else 0.0)
        n = max(len(rewards), 1)
        return RewardOutput(
            rewards=rewards,
            metrics={
                "reward/mean": sum(rewards) / n,
                "reward/correct_frac": rewards.count(1.0) / n,
            },
        )


class AtMostLength(Rule):
    """A weak check without the gold answer: the count is a digit no larger than the string is
    long."""

    def check(self, problem: Problem, text: str) -> float:
        n = len(problem.prompt.rstrip(":"))
        return float(text.strip().isdigit() and int(text.strip()) <= n)
