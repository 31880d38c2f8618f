"""`reward=single_rm`: one label-free verifier's score is the reward.

Usually a reward model (a Hugging Face sequence classifier), but any verifier kind is allowed, because the
CPU-scale replication of "single RM vs Weaver" uses one weak rule verifier as the single reward model.
Select it with `options.kind` plus that kind's options, e.g. `{kind: rule, rule: arithmetic_mod5}` or
`{kind: reward_model, path: /models/rm}`; or give exactly one entry in `verifiers`.

`options.debias_answers` (with `options.reference_groups`) gives it the same per-answer debiasing as
`reward=weaver_paper` and its baselines (issue 46): the first `reference_groups` groups (the starting policy's
samples) fix each answer's mean score offset (answers seen at least 8 times), which is subtracted from every later
raw score. Without it the comparison is unfair: every other verifier arm has it, and a reward model that favours
one answer whatever the question pulls the policy onto that answer.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.rewards.base import Reward, plain, register_reward
from rlexp.rewards.verifiers.base import Verifier
from rlexp.rewards.verifiers.registry import build_verifier
from rlexp.types import Problem, RewardOutput

# Options of reward=single_rm that belong to the reward, not to a verifier given inline.
SINGLE_RM_OPTIONS = frozenset({"kind", "name", "transform", "verifier", "debias_answers",
                               "reference_groups"})


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


@register_reward("single_rm")
class SingleRMReward(Reward):
    needs_gold = False

    @classmethod
    def chosen_verifiers(cls, options: dict[str, Any],
                         members: list[VerifierConfig]) -> list[VerifierConfig]:
        """One verifier: given inline (`options.kind`), named (`options.verifier`), the only member,
        or else the first reward model."""
        names = [v.name for v in members]
        if "kind" in options:  # a verifier of its own, given inline
            return [VerifierConfig(name=str(options.get("name", "")), kind=str(options["kind"]),
                                   options={k: v for k, v in options.items()
                                            if k not in SINGLE_RM_OPTIONS})]
        if "verifier" in options:  # one member of the verifier set, by name
            match = [v for v in members if v.name == options["verifier"]]
            if not match:
                raise ValueError(f"reward=single_rm: options.verifier={options['verifier']!r} "
                                 f"is not in the "
                                 f"verifier set {names}; choose one of them")
            return match[:1]
        if len(members) == 1:
            return list(members)
        rms = [v for v in members if str(v.kind) == "reward_model"]  # "the single reward model"
        if not rms:
            raise ValueError(f"reward=single_rm: the verifier set {names} has no reward_model; "
                             f"choose one member with reward.options.verifier=NAME, or give "
                             f"options.kind and its options")
        return rms[:1]

    def __init__(self, cfg: RewardConfig, env: Any, served: bool = True) -> None:
        super().__init__(cfg, env, served)
        options = dict(plain(cfg.options) or {})
        verifiers = [v if isinstance(v, VerifierConfig) else VerifierConfig(**v) for v in plain(cfg.verifiers) or []]
        vcfg = self.chosen_verifiers(options, verifiers)[0]
        self.verifier: Verifier = build_verifier(vcfg, env, served=served)
        self.verifiers = [self.verifier]
        # A reward model's logit is unbounded; squash it so reward/mean reads as a probability-like number.
        # Rule checks already give 0/1. (GRPO normalises advantages within a group, so neither changes ranks.)
        default = "sigmoid" if self.verifier.kind == "reward_model" else "raw"
        self.transform = str(options.get("transform", default))
        if self.transform not in {"sigmoid", "raw"}:
            raise ValueError(f"reward=single_rm: transform must be sigmoid|raw, got {self.transform!r}")
        self.debias = bool(options.get("debias_answers", False))
        self.reference_groups = int(options.get("reference_groups", 0))
        if self.debias and self.reference_groups < 1:
            raise ValueError("reward=single_rm: options.debias_answers measures each answer's score offset on the "
                             "starting policy's samples: set options.reference_groups > 0 (weaver_paper uses 128)")
        self.pool: list[float] = []  # raw scores of the reference groups' responses
        self.pool_keys: list[str] = []  # their extracted answers
        self.pool_groups = 0
        self.offsets: dict[str, float] | None = None  # answer -> offset, fixed when the pool fills

    def _debiased(self, problems: list[Problem], texts: list[str], raw: np.ndarray,
                  group_size: int) -> np.ndarray:
        keys = [self.env.extract(p, t) or "" for p, t in zip(problems, texts)]
        if self.offsets is None:
            take = min(self.reference_groups - self.pool_groups, -(-len(texts) // max(group_size, 1)))
            n = min(len(texts), take * group_size)
            self.pool += [float(x) for x in raw[:n]]
            self.pool_keys += keys[:n]
            self.pool_groups += take
            if self.pool_groups < self.reference_groups:
                return raw
            scores, answers = np.asarray(self.pool), np.asarray(self.pool_keys)
            self.offsets = {a: float(scores[answers == a].mean() - scores.mean())
                            for a in sorted(set(self.pool_keys)) if (answers == a).sum() >= 8}
        return raw - np.array([self.offsets.get(k, 0.0) for k in keys], dtype=np.float64)

    def _score(self, problems: list[Problem], texts: list[str], group_size: int) -> RewardOutput:
        raw = np.asarray(self.verifier.score(problems, texts), dtype=np.float64)
        if self.debias:
            raw = self._debiased(problems, texts, raw, group_size)
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
        if self.debias:  # 0 until the pool fills; then the largest answer offset removed
            off = self.offsets or {}
            metrics["single_rm/max_answer_offset"] = max((abs(v) for v in off.values()), default=0.0)
        if self.verifier.kind == "rule":
            metrics["single_rm/positive_frac"] = float((raw > 0.5).sum() / n)
        details = [{"score": float(r), "raw": float(s) if math.isfinite(s) else None}
                   for r, s in zip(rewards, raw)]
        return RewardOutput(rewards=[float(r) for r in rewards], metrics=metrics, details=details)

    def state_dict(self) -> dict[str, Any]:
        if not self.debias:
            return {}
        return {"pool": list(self.pool), "pool_keys": list(self.pool_keys), "pool_groups": self.pool_groups,
                "offsets": self.offsets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.debias:
            return super().load_state_dict(state)
        self.pool = [float(x) for x in state.get("pool", [])]
        self.pool_keys = [str(k) for k in state.get("pool_keys", [])]
        self.pool_groups = int(state.get("pool_groups", 0))
        off = state.get("offsets")
        self.offsets = {str(k): float(v) for k, v in off.items()} if off is not None else None
