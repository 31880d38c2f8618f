"""`reward=annotated`: gold-label reward used as the oracle upper bound for label-free rewards.

Numerically it is the `rule` check; it exists under its own name so that a run's config and manifest say
"this used gold labels as an oracle" rather than "this used the environment's verifier", which matters
when comparing against Weaver (whose point is to do without gold).
"""
from __future__ import annotations

from rlexp.rewards.base import Reward, register_reward
from rlexp.rewards.rule import check_batch
from rlexp.types import RewardOutput, Sample


@register_reward("annotated")
class AnnotatedReward(Reward):
    needs_gold = True
    pure = True

    def _score(self, samples: list[Sample], texts: list[str], group_size: int) -> RewardOutput:
        out = check_batch(self, samples, texts)
        out.metrics["reward/oracle"] = 1.0
        return out
