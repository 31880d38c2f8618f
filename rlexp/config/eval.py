"""Schema of evaluation during training (`eval.*`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from rlexp.config.trust import CODE


@dataclass
class EvalConfig:
    # Steps between held-out evaluations (and one at step 0 and at the end).
    every_n_steps: int = 50
    # Held-out split of the training environment is always evaluated; these are extra benchmarks
    # (names of files in conf/benchmark/, e.g. ["gsm8k"]).
    benchmarks: list[str] = field(default_factory=list, metadata=CODE)  # config file names
    # Problems per evaluation; null: the whole held-out split (or `environment.eval_size`).
    max_samples: int | None = None
    # Sampling temperature at evaluation (0: greedy).
    temperature: float = 0.0
    # Responses sampled per problem at each evaluation.
    k: int = 1
    # Generation budget per response (per turn for multi-turn environments).
    max_tokens: int = 256
    # Same sampling seed at every evaluation, so changes between steps come from the policy, not the dice.
    seed: int = 0
    # Problems per generate call during evaluation.
    batch_size: int = 64
