"""`reward=single_rm`: one label-free verifier's score is the reward.

Usually a reward model (a Hugging Face sequence classifier), but any verifier kind is allowed, because the
CPU-scale replication of "single RM vs Weaver" uses one weak rule verifier as the single reward model.
Select it with `options.kind` plus that kind's options, e.g. `{kind: rule, rule: arithmetic_mod5}` or
`{kind: reward_model, path: /models/rm}`; or give exactly one entry in `verifiers`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlexp.config.reward import RewardConfig, VerifierConfig, chosen_verifiers
from rlexp.rewards.base import Reward, plain, register_reward
from rlexp.rewards.verifiers.base import Verifier
from rlexp.rewards.verifiers.registry import build_verifier
from rlexp.types import Problem, RewardOutput


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


@register_reward("single_rm")
class SingleRMReward(Reward):
    needs_gold = False

    def __init__(self, cfg: RewardConfig, env: Any, served: bool = True) -> None:
        super().__init__(cfg, env, served)
        options = dict(plain(cfg.options) or {})
        verifiers = [v if isinstance(v, VerifierConfig) else VerifierConfig(**v) for v in plain(cfg.verifiers) or []]
        vcfg = chosen_verifiers("single_rm", options, verifiers)[0]
        self.verifier: Verifier = build_verifier(vcfg, env, served=served)
        self.verifiers = [self.verifier]
        # A reward model's logit is unbounded; squash it so reward/mean reads as a probability-like number.
        # Rule checks already give 0/1. (GRPO normalises advantages within a group, so neither changes ranks.)
        default = "sigmoid" if self.verifier.kind == "reward_model" else "raw"
        self.transform = str(options.get("transform", default))
        if self.transform not in {"sigmoid", "raw"}:
            raise ValueError(f"reward=single_rm: transform must be sigmoid|raw, got {self.transform!r}")

    def _score(self, problems: list[Problem], texts: list[str], group_size: int) -> RewardOutput:
        raw = self.verifier.score(problems, texts)
        rewards = _sigmoid(raw) if self.transform == "sigmoid" else raw
        n = max(len(texts), 1)
        metrics = {
            "reward/mean": float(rewards.mean()) if len(texts) else 0.0,
            "reward/std": float(rewards.std()) if len(texts) else 0.0,
            "single_rm/raw_mean": float(raw.mean()) if len(texts) else 0.0,
            # Share of groups whose rewards are all equal: those give GRPO zero advantage.
            "single_rm/flat_group_frac": float(np.mean([np.ptp(rewards[g:g + group_size]) == 0
                                                        for g in range(0, len(texts), group_size)]))
            if len(texts) else 0.0,
        }
        if self.verifier.kind == "rule":
            metrics["single_rm/positive_frac"] = float((raw > 0.5).sum() / n)
        details = [{"score": float(r), "raw": float(s) if math.isfinite(s) else None}
                   for r, s in zip(rewards, raw)]
        return RewardOutput(rewards=[float(r) for r in rewards], metrics=metrics, details=details)
