"""`reward=rule`: the environment's own answer check, 1.0 for right and 0.0 otherwise, or the partial credit
the check gives (`Check.score`, e.g. `sort`'s fraction of positions right).

The check lives in the environment (not here) so that training rewards and evaluation accuracy come from
the same code. Unparseable responses get the same 0.0 as wrong ones, but they are counted apart: a policy
that stops emitting a parseable answer is a different failure from one that answers wrongly.
"""
from __future__ import annotations

from rlexp.rewards.base import Reward, register_reward
from rlexp.rewards.crossing import checked
from rlexp.types import RewardOutput, Sample


def check_batch(reward: Reward, samples: list[Sample], texts: list[str], prefix: str = "reward") -> RewardOutput:
    """Score with `env.check`; shared by `rule` and `annotated` so the two can never drift apart."""
    rewards, details = [], []
    n_correct = n_unparseable = 0
    for sample, text in zip(samples, texts):
        c = checked(reward.env, sample, text)
        rewards.append(float(c.score) if c.score is not None else 1.0 if c.correct else 0.0)
        n_correct += bool(c.correct)
        n_unparseable += not c.parseable
        details.append({"correct": bool(c.correct), "parseable": bool(c.parseable), "extracted": c.extracted})
    n = max(len(texts), 1)
    metrics = {
        f"{prefix}/mean": sum(rewards) / n,
        f"{prefix}/correct_frac": n_correct / n,
        f"{prefix}/unparseable_frac": n_unparseable / n,
        # Wrong among the parseable ones: separates "answers wrongly" from "does not answer".
        f"{prefix}/wrong_parseable_frac": (n - n_correct - n_unparseable) / n,
    }
    return RewardOutput(rewards=rewards, metrics=metrics, details=details)


@register_reward("rule")
class RuleReward(Reward):
    needs_gold = True
    pure = True
    value_range = (0.0, 1.0)  # 1/0, or `Check.score`'s partial credit

    def _score(self, samples: list[Sample], texts: list[str], group_size: int) -> RewardOutput:
        return check_batch(self, samples, texts)
