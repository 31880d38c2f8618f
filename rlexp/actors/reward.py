"""Reward service actor: verifiers run here, in their own processes, scaled apart from generators.

LM-judge verifiers are served by a generator (the policy's own replicas, through the same `generate`
endpoint the rollouts use): the launcher hands this actor the generator handles after spawn, and the
judge's score for a response is P("Y") of the judge's first token under greedy decoding.
"""
from __future__ import annotations

import math
from typing import Any

from monarch.actor import Actor, endpoint

from rlexp.config.environment import EnvConfig
from rlexp.config.reward import RewardConfig
from rlexp.envs.registry import build_env
from rlexp.models.tokenizer import load_tokenizer
from rlexp.rewards.registry import build_reward
from rlexp.types import RewardOutput, Sample


def judge_names(cfg: RewardConfig) -> list[str]:
    """Names of the `lm_judge` verifiers a reward config declares (Weaver's list, or single_rm's one)."""
    names = [v.name for v in cfg.verifiers if v.kind == "lm_judge"]
    if cfg.options.get("kind") == "lm_judge":
        names.append(str(cfg.options.get("name", "")))
    return names


class RewardService(Actor):
    def __init__(self, reward_cfg: RewardConfig, env_cfg: EnvConfig) -> None:
        self.cfg = reward_cfg
        self.env = build_env(env_cfg)
        self.reward = build_reward(reward_cfg, self.env)

    # Synchronous endpoints: a judge call waits on another actor's reply, which an event-loop endpoint must not.
    @endpoint
    def attach_judges(self, generator: Any, model_dir: str) -> list[str]:
        """Serve every `lm_judge` verifier with `generator` (a Generator actor handle)."""
        tok = load_tokenizer(model_dir)
        yes = tok.encode("Y")[0] if tok.encode("Y") else None

        def judge(prompts: list[str]) -> list[float]:
            outs = generator.generate.call_one([tok.encode(p) for p in prompts], 1, 1, 0.0, 0).get()
            return [(math.exp(o.logprobs[0]) if o.token_ids[0] == yes else 1.0 - math.exp(o.logprobs[0]))
                    if o.token_ids else 0.0 for o in outs]

        names = judge_names(self.cfg)
        for name in names:
            self.reward.attach_judge(name, judge)
        return names

    @endpoint
    def score(self, samples: list[Sample], texts: list[str], group_size: int) -> RewardOutput:
        return self.reward.score(samples, texts, group_size)

    @endpoint
    def state_dict(self) -> dict[str, Any]:
        return self.reward.state_dict()

    @endpoint
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reward.load_state_dict(state)
