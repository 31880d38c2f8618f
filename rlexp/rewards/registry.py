"""Imports every built-in reward so that `@register_reward` runs, and builds one from its config.

A user's reward is a `Reward` subclass in their own module, named in config as `package.module:Class` or
registered with `@register_reward("name")` in a module listed in `plugins` (see `rlexp.core.plugins`,
examples/my_task); only built-ins are imported here.
"""
from __future__ import annotations

from typing import Any

from rlexp.config.reward import RewardConfig
from rlexp.rewards import annotated, rule, single_rm, weaver  # noqa: F401  (registration side effects)
from rlexp.rewards.base import Reward, register_reward, reward_class, reward_names

__all__ = ["build_reward", "register_reward", "reward_names"]


def build_reward(cfg: RewardConfig, env: Any, served: bool = True) -> Reward:
    """Construct the reward named by `cfg.name`; unknown names fail listing the registered choices.
    `served=False` loads model verifiers into this process instead of expecting services (see `Reward`)."""
    return reward_class(cfg.name)(cfg, env, served)
