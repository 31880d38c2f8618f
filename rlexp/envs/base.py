"""What an environment is: a dataset, prompt formatting, interaction/termination, and a rule check.

A user adds an environment with one module of their own (a subclass, named in config as `package.module:Class`
or registered with `@register_env("name")` in a module listed in `plugins`) and one YAML file in a config folder
of their own (`config_path`); see examples/my_task. The rule check lives here, not in
a reward, so training-time scores and evaluation scores come from the same code path. This module imports
no implementation: they import it, and `registry` imports them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from rlexp.config.environment import EnvConfig
from rlexp.config.validate import check_options
from rlexp.registry import Registry
from rlexp.types import Problem, Sample


@dataclass(frozen=True)
class Check:
    """Outcome of checking one response against the gold answer."""

    correct: bool
    parseable: bool
    extracted: str | None = None
    # Partial credit in [0, 1] for `reward=rule` (e.g. the fraction of positions right); None: 1.0 when correct,
    # else 0.0. Accuracy always counts `correct`.
    score: float | None = None


@dataclass
class NoOptions:
    """The options of an environment that takes none."""


class Environment:
    """Base class. Single-turn environments implement `load_samples` and `check` only."""

    name: ClassVar[str] = ""
    # Tokens after which generation stops (e.g. "\n"); the generator also stops at EOS.
    stop: ClassVar[tuple[str, ...]] = ()
    # Verifier kinds a label-free reward may score this environment with (checked before anything
    # spawns): None, every kind that declares itself generic (rlexp/rewards/verifiers/kinds.py),
    # plus `own_verifier_kinds` (the kinds written for this task, e.g. its rules); a set: exactly
    # those.
    verifier_kinds: ClassVar[frozenset[str] | None] = None
    own_verifier_kinds: ClassVar[frozenset[str]] = frozenset()
    # Which LM-judge template fits its answers: free_form (a number, an expression) or multiple_choice.
    answer_format: ClassVar[str] = "free_form"
    # The dataclass of `environment.options` (names, types, defaults): an unknown name is refused, with the close
    # matches, when the environment is built (before anything spawns), not silently left at its default.
    Options: ClassVar[type] = NoOptions

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        if not self.name:  # named by import path (`mytask.tasks:CountA`), not registered: its config name
            self.name = cfg.name  # type: ignore[misc]
        self.opts: Any = check_options(self.Options, cfg.options, f"environment={self.name}")
        self._train: list[Sample] | None = None
        self._eval: list[Sample] | None = None

    # --- data -------------------------------------------------------------------------------------
    def load_samples(self, split: str) -> list[Sample]:
        raise NotImplementedError

    def train_samples(self) -> list[Sample]:
        if self._train is None:
            self._train = self.load_samples(self.cfg.split)
        return self._train

    def eval_samples(self) -> list[Sample]:
        if self._eval is None:
            samples = self.load_samples(self.cfg.eval_split)
            self._eval = samples[: self.cfg.eval_size] if self.cfg.eval_size else samples
        return self._eval

    def sample_batch(self, n: int, rng: random.Random) -> list[Sample]:
        """Draw `n` training problems with the data-order RNG (recorded in the checkpoint)."""
        pool = self.train_samples()
        return [pool[rng.randrange(len(pool))] for _ in range(n)]

    # --- scoring ----------------------------------------------------------------------------------
    def check(self, sample: Sample, response: str) -> Check:
        raise NotImplementedError

    def extract(self, problem: Problem, response: str) -> str | None:
        """The answer a response gives, normalised so that equal answers compare equal, or None when it gives
        none. Reads no gold label: label-free verifiers (`format`, `majority`) are built on it."""
        raise NotImplementedError(f"environment {self.name!r} does not extract answers, so the format and "
                                  f"majority verifiers cannot score it")

    # --- multi-turn -------------------------------------------------------------------------------
    # True when every reply is a tool's output (counted as tool calls in `episode/tool_calls_mean`).
    replies_are_tool_calls: ClassVar[bool] = False
    # Longest response (tokens) `check` can judge; 0: any. `rlexp train` refuses a larger algorithm.max_tokens.
    max_response_tokens: ClassVar[int] = 0

    @property
    def min_response_tokens(self) -> int:
        """Tokens a right answer needs (0: no minimum). `rlexp train` refuses a smaller algorithm.max_tokens,
        which could never be right."""
        return 0

    def step(self, sample: Sample, transcript: str, response: str) -> str | None:
        """Return the text to append (e.g. a tool result) and continue, or None when the episode ends.
        `transcript`: the episode's earlier responses and replies after the prompt; `response`: the newest turn.
        Exceptions, time-outs and unusable output (rlexp/envs/guard.py) reach the model as `error_reply`."""
        return None

    def error_reply(self, message: str) -> str:
        """How a failed step (a tool error, a time-out, an over-long or undecodable reply) is shown to the model."""
        return f"error: {message}"

    def turn_reward(self, sample: Sample, transcript: str, response: str) -> float:
        """Optional per-turn reward, summed into the episode's reward (only called when overridden)."""
        return 0.0

    @property
    def multi_turn(self) -> bool:
        """Episodes of several turns: the environment replies (`step`) and allows more than one response."""
        return type(self).step is not Environment.step and self.cfg.max_turns > 1


ENVIRONMENTS: Registry[type[Environment]] = Registry(
    "environment", Environment, "a subclass of rlexp.envs.base.Environment; see examples/my_task")
register_env = ENVIRONMENTS.register
