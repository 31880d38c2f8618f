"""Guess the hidden digit in at most three tries, told "lower" or "higher" after each miss: a task that can
only be solved by reading the environment's replies.

    prompt    KQZ:                            a random game id; the digit is not in the prompt
    policy    5                               one character per turn (algorithm.max_tokens=1)
    env       <                               lower than 5  (">": higher, "?": not a single digit)
    policy    2
    env       >
    policy    3                               correct: the episode ends, reward 1

Why it separates using feedback from not using it: the digit is drawn independently of the prompt, so a
policy that ignores the replies can do no better than three fixed distinct guesses, 3 games in 10. Using them,
a binary search over three tries covers 1 + 2 + 4 = 7 digits: 7 in 10 (e.g. 3, then 1 or 6, then the rest).

Held-out split: the game ids. Training draws (id, digit) pairs from 2000 ids; the held-out games use 20 ids
training never sees, each with all ten digits (200 games, every digit 20 times), so held-out success is
exact for the digit distribution and measures play on prompts the policy has never met.

Prompts and replies are short so turns sit at fixed positions and an episode is at most 9 tokens (what a
two-layer tiny model learns in minutes on two cores: a multi-turn step forwards every distinct episode),
and the check reads the transcript as one-character guesses alternating with replies, which is why
`max_response_tokens` is 1: `rlexp train` refuses a longer algorithm.max_tokens.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass

from rlexp.envs.base import Check, Environment, register_env
from rlexp.types import Problem, Sample

TEMPLATE = "{game}:"
_SPLIT_SEED = 20261130
LOWER, HIGHER, INVALID = "<", ">", "?"


def reply(answer: str, guess: str) -> str | None:
    """The environment's answer to one guess: None when it is right."""
    if len(guess) != 1 or not guess.isdigit():
        return INVALID
    if guess == answer:
        return None
    return LOWER if int(answer) < int(guess) else HIGHER


def guesses(answer: str, transcript: str, max_turns: int) -> list[str] | None:
    """The guesses of a transcript of one-character turns, None when it is not one this game could produce."""
    out: list[str] = []
    i = 0
    while i < len(transcript) and len(out) < max_turns:
        g = transcript[i]
        out.append(g)
        r = reply(answer, g)
        if r is None or len(out) == max_turns:
            return out if i + 1 == len(transcript) else None
        if transcript[i + 1: i + 2] != r:
            return None
        i += 2
    return out if i == len(transcript) and out else None


@dataclass
class GuessOptions:
    n_train_games: int = 2000
    n_heldout_games: int = 20


@register_env("guess")
class Guess(Environment):
    Options = GuessOptions
    verifier_kinds = frozenset()  # success is the game's own outcome; there is nothing for a judge to weigh
    max_response_tokens = 1

    def _games(self) -> tuple[list[str], list[str]]:
        """(training ids, held-out ids): disjoint, fixed by the task, not by the run seed."""
        n_train, n_held = self.opts.n_train_games, self.opts.n_heldout_games
        rng = random.Random(_SPLIT_SEED)
        ids: dict[str, None] = {}
        while len(ids) < n_train + n_held:
            ids["".join(rng.choice(string.ascii_uppercase) for _ in range(3))] = None
        games = list(ids)
        return games[n_held:], games[:n_held]

    def load_samples(self, split: str) -> list[Sample]:
        train, held = self._games()
        games = held if split == self.cfg.eval_split else train
        return [Sample(Problem(id=f"{g}/{d}", prompt=TEMPLATE.format(game=g)), answer=str(d))
                for g in games for d in range(10)]

    def step(self, sample: Sample, transcript: str, response: str) -> str | None:
        return reply(sample.answer, response)

    def check(self, sample: Sample, response: str) -> Check:
        played = guesses(sample.answer, response, max(1, self.cfg.max_turns))
        if played is None:
            return Check(correct=False, parseable=False, extracted=None)
        return Check(correct=played[-1] == sample.answer, parseable=True, extracted=played[-1])

    def extract(self, problem: Problem, response: str) -> str | None:
        return response[-1:] if response[-1:].isdigit() else None
