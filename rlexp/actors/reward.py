"""Reward service actor: verifiers run here, in their own processes, scaled apart from generators."""
from __future__ import annotations

from typing import Any

from monarch.actor import Actor, endpoint

from rlexp.envs.config import EnvConfig
from rlexp.rewards.config import RewardConfig
from rlexp.types import RewardOutput, Sample


class RewardService(Actor):
    def __init__(self, reward_cfg: RewardConfig, env_cfg: EnvConfig) -> None:
        from rlexp.envs.base import build_env
        from rlexp.rewards.registry import build_reward

        self.env = build_env(env_cfg)
        self.reward = build_reward(reward_cfg, self.env)

    @endpoint
    async def score(self, samples: list[Sample], texts: list[str], group_size: int) -> RewardOutput:
        return self.reward.score(samples, texts, group_size)

    @endpoint
    async def state_dict(self) -> dict[str, Any]:
        return self.reward.state_dict()

    @endpoint
    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reward.load_state_dict(state)
