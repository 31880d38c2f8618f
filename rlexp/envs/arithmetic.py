"""The embedded default task: add nine 0/1 terms ("1+0+1+1+0+0+1+0+1=" -> "5"), one-token answers.

Chosen so that RL from *random* weights learns in minutes on two CPU cores, measured: the answer is a
single digit (a random policy is right about one time in ten, so most GRPO groups contain both right
and wrong responses), and the sum depends on how many terms are 1, not on where they stand, so what
is learned on training problems carries over to held-out ones. A harder variant (two-digit operands,
last digit of the sum) did not move from chance within 400 steps; see docs/quickstart.md, "What
`rlexp train` does by default".

Held-out problems are term sequences never drawn for training: a fixed quarter of the sequences of
each sum value. Training draws the sum uniformly first, so every answer is equally common and the
best constant answer scores 0.1.
"""
from __future__ import annotations

import collections
import itertools
import random
from dataclasses import dataclass

from rlexp.envs.base import Check, Environment, register_env
from rlexp.types import Problem, Sample

_SPLIT_SEED = 20261129  # the split is a fixed function of the task, not of the run seed
_VERIFIER_SPLIT_SEED = 20270113  # likewise the verifier split


@dataclass
class ArithmeticOptions:
    n_terms: int = 9
    max_term: int = 1
    # Fraction of the training sequences set aside for the weak verifiers (rlexp/rewards/verifiers/tiny.py).
    verifier_frac: float = 0.0
    # Which sums the training draw covers: all (0-9), or held_out (those the held-out set has, 1-8 by default).
    # Sums 0 and 9 have one sequence each, which only the policy trains on: with all, a fifth of the training draw
    # is two problems no weak verifier has seen (measured: their AUC there is 0.05-0.56, mostly below chance,
    # studies/weaver/results/weaver_panels_all_sums.md) and the balanced held-out metric does not count them.
    train_sums: str = "all"
    # Evaluate only the answer classes with at least this many held-out prompts (issue 46 item 3):
    # with 9 terms, sums 1 and 8 hold out 2 prompts each, so 4 prompts carry a quarter of the
    # balanced metric. A dropped class's held-out prompts are set aside, not moved, so the training
    # and verifier splits do not change (with train_sums=held_out the class leaves training too).
    held_out_min: int = 0


@register_env("arithmetic")
class Arithmetic(Environment):
    # the arithmetic checks in rewards/verifiers/arithmetic.py
    own_verifier_kinds = frozenset({"rule"})
    Options = ArithmeticOptions

    def _terms(self) -> tuple[int, int]:
        n, hi = self.opts.n_terms, self.opts.max_term
        if n < 2 or hi < 1 or n * hi > 9:
            raise ValueError(f"environment.options n_terms={n}, max_term={hi}: need n_terms >= 2, max_term >= 1 and "
                             f"n_terms * max_term <= 9 so that every answer is one digit")
        return n, hi

    def _split(self) -> tuple[dict[int, list[tuple[int, ...]]], list[tuple[int, ...]]]:
        """(training sequences by sum, held-out sequences); with `options.verifier_frac` the verifier split
        (`verifier_sequences`) is taken out of training, so the policy never trains on a problem its weak
        verifiers learned from; `options.train_sums` may keep training to the held-out set's sums,
        and `options.held_out_min` evaluates only the classes with that many held-out prompts."""
        train, held = self._base_split()
        if self.opts.held_out_min < 0:
            raise ValueError("environment.options.held_out_min must be >= 0, got "
                             f"{self.opts.held_out_min}")
        if self.opts.held_out_min:
            count = collections.Counter(sum(t) for t in held)
            held = [t for t in held if count[sum(t)] >= self.opts.held_out_min]
            if not held:
                raise ValueError(f"environment.options.held_out_min={self.opts.held_out_min}: no "
                                 "answer class has that many held-out prompts (the most is "
                                 f"{max(count.values())}); lower it")
        if self.opts.train_sums not in ("all", "held_out"):
            raise ValueError(f"environment.options.train_sums must be all|held_out, got {self.opts.train_sums!r}")
        if self.opts.train_sums == "held_out":
            sums = {sum(t) for t in held}
            train = {s: seqs for s, seqs in train.items() if s in sums}
        frac = self.opts.verifier_frac
        if frac > 0:
            taken = set(self.verifier_sequences(frac))
            train = {s: [t for t in seqs if t not in taken] for s, seqs in train.items()}
        return train, held

    def verifier_sequences(self, frac: float) -> list[tuple[int, ...]]:
        """The sequences weak verifiers learn from (rlexp/rewards/verifiers/tiny.py): a fixed `frac` of the
        training sequences of each sum, never a held-out one. Each sum keeps at least one sequence for the
        policy (the task draws a sum first); the choice is nested, a larger `frac` keeps a smaller one's."""
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"environment.options.verifier_frac must be in [0, 1), got {frac}")
        n, hi = self._terms()
        train, _ = self._base_split()
        out: list[tuple[int, ...]] = []
        for s in sorted(train):
            seqs = sorted(train[s])  # only the set matters, not the split's shuffle order
            random.Random(f"{_VERIFIER_SPLIT_SEED}:{n}:{hi}:{s}").shuffle(seqs)
            out += seqs[:min(int(frac * len(seqs) + 0.5), len(seqs) - 1)]
        return out

    def _base_split(self) -> tuple[dict[int, list[tuple[int, ...]]], list[tuple[int, ...]]]:
        n, hi = self._terms()
        by_sum: dict[int, list[tuple[int, ...]]] = {}
        for t in itertools.product(range(hi + 1), repeat=n):
            by_sum.setdefault(sum(t), []).append(t)
        rng = random.Random(_SPLIT_SEED)
        train, held = {}, []
        for s in sorted(by_sum):
            seqs = by_sum[s]
            rng.shuffle(seqs)
            k = len(seqs) // 4  # sums with fewer than 4 sequences (0 and 9) are only trained on
            held += seqs[:k]
            train[s] = seqs[k:]
        return train, held

    @staticmethod
    def _sample(t: tuple[int, ...]) -> Sample:
        text = "+".join(map(str, t))
        return Sample(Problem(id=text, prompt=f"{text}="), answer=str(sum(t)))

    def load_samples(self, split: str) -> list[Sample]:
        train, held = self._split()
        seqs = held if split == self.cfg.eval_split else [t for s in sorted(train) for t in train[s]]
        return [self._sample(t) for t in seqs]

    def sample_batch(self, n: int, rng: random.Random) -> list[Sample]:
        """Uniform over sums, then uniform over the training sequences with that sum."""
        if not hasattr(self, "_by_sum"):
            train, _ = self._split()
            self._by_sum = [[self._sample(t) for t in train[s]] for s in sorted(train)]
        return [rng.choice(self._by_sum[rng.randrange(len(self._by_sum))]) for _ in range(n)]

    def extract(self, problem: Problem, response: str) -> str | None:
        text = response.strip()
        return text if len(text) == 1 and text.isdigit() else None

    def check(self, sample: Sample, response: str) -> Check:
        text = response.strip()
        if len(text) != 1 or not text.isdigit():
            return Check(correct=False, parseable=False, extracted=None)
        return Check(correct=text == sample.answer, parseable=True, extracted=text)
