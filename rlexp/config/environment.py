"""Schema of the `environment` config group."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlexp.config.trust import CODE, DATA, OPTIONS, location_meta


@dataclass
class EnvConfig:
    name: str = field(default="arithmetic", metadata=CODE)  # registry key in rlexp.envs.registry
    # Dataset source (HF id or package data); ignored by generated environments.
    dataset: str | None = field(default=None, metadata=location_meta(hub_ids=True))
    # Pinned revision of `dataset` on the Hugging Face hub (null: the cached default).
    revision: str | None = field(default=None, metadata=DATA)
    # Dataset split trained on.
    split: str = field(default="train", metadata=DATA)
    # Held-out split the run evaluates on every `eval.every_n_steps` (never trained on).
    eval_split: str = field(default="test", metadata=DATA)
    eval_size: int = 0  # 0 = the whole eval split
    max_turns: int = 1  # policy responses per episode; > 1 (with an environment that implements `step`): multi-turn
    # Multi-turn limits: response tokens per episode, the policy's and the environment's (0: the model's context
    # length), and tokens per environment reply (a longer one reaches the model as a short error message).
    max_episode_tokens: int = 0
    # Tokens per environment reply (multi-turn); a longer one reaches the model as a short
    # error message.
    max_reply_tokens: int = 256
    # Seconds one `step` (a tool call) may take before the model is told it timed out (0: no limit, run inline).
    step_timeout_s: float = 10.0
    # Environment-specific knobs (e.g. arithmetic's operand range); validated by the environment itself.
    options: dict[str, Any] = field(default_factory=dict, metadata=OPTIONS)
