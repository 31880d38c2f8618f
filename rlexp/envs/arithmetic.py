"""The embedded default task: the last digit of a two-number sum, answered with one token.

Chosen so that RL from *random* weights learns in minutes on two CPU cores: the answer is a single
digit, so a random policy already succeeds about once in ten tries and almost every group of 16
has both a right and a wrong response (non-zero GRPO advantage). Held-out problems are operand pairs
never drawn for training, so rising held-out accuracy means the policy learned the rule, not the table.
"""
from __future__ import annotations

import random

from rlexp.envs.base import Check, Environment, register_env
from rlexp.types import Problem, Sample


@register_env("arithmetic")
class Arithmetic(Environment):
    stop = ()

    def _pairs(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        hi = int(self.cfg.options.get("max_operand", 99))
        n_eval = int(self.cfg.eval_size)
        pairs = [(a, b) for a in range(hi + 1) for b in range(hi + 1)]
        if n_eval >= len(pairs):
            raise ValueError(f"environment.eval_size={n_eval} leaves no training problems for max_operand={hi}; "
                             f"lower eval_size or raise environment.options.max_operand")
        # The held-out split is a fixed function of the task, not of the run seed: every run is scored on
        # the same problems, so runs with different seeds stay comparable.
        random.Random(20261129).shuffle(pairs)
        return pairs[n_eval:], pairs[:n_eval]

    def load_samples(self, split: str) -> list[Sample]:
        train, held = self._pairs()
        pairs = held if split == self.cfg.eval_split else train
        width = len(str(int(self.cfg.options.get("max_operand", 99))))
        return [
            Sample(Problem(id=f"{a}+{b}", prompt=f"{a:0{width}d}+{b:0{width}d}="), answer=str((a + b) % 10))
            for a, b in pairs
        ]

    def check(self, sample: Sample, response: str) -> Check:
        text = response.strip()
        if len(text) != 1 or not text.isdigit():
            return Check(correct=False, parseable=False, extracted=None)
        return Check(correct=text == sample.answer, parseable=True, extracted=text)
