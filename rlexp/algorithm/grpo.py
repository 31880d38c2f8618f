"""GRPO math: group-normalised advantages and the clipped, importance-corrected policy loss.

Pure tensor functions so they can be checked against hand-computed values. The surrogate is computed
against the *generator's* logprobs (`old_logprobs`), so samples produced by stale weights (async mode)
are re-weighted by the importance ratio instead of being trained on as if they were on-policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlexp.config.schema import LossAgg
from rlexp.registry import Registry

LOSS_AGG_MODES = tuple(m.value for m in LossAgg)


def group_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """Advantage of each response relative to the other responses to the same prompt.

    `rewards` is flat, ordered group after group. With `norm_by_std=False` this is Dr.GRPO's
    mean-only baseline, which avoids up-weighting groups whose rewards barely differ.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    adv = grouped - grouped.mean(dim=1, keepdim=True)
    if norm_by_std:
        adv = adv / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)
    return adv.view(-1)


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, float]


def policy_token_mask(mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """The response positions the loss trains on: real tokens (`mask`) the policy wrote (`loss_mask` 1).

    Multi-turn episodes interleave the policy's turns with the environment's replies; the replies are
    context the policy conditions on, never actions, so they enter neither the surrogate, nor the KL, nor
    the importance ratio, and every position they occupy gets an exactly zero gradient (`grpo_loss`
    multiplies by the mask before exponentiating and before aggregating)."""
    return mask * loss_mask.to(mask.dtype)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    agg: str = "token_mean",
    max_len: int | None = None,
) -> LossOutput:
    """Clipped surrogate (PPO/GRPO) with an optional k3 KL penalty to the reference policy.

    Shapes: logprobs, old_logprobs, ref_logprobs, mask are [B, T]; advantages is [B].
    `agg` chooses how token losses become one number: `token_mean` (every token weighs the same),
    `seq_mean_token_mean` (every sequence weighs the same), `seq_mean_token_sum_norm` (Dr.GRPO:
    token sums divided by a constant `max_len`, free of length bias).
    """
    if agg not in LOSS_AGG_MODES:
        raise ValueError(f"loss aggregation {agg!r} is not one of {LOSS_AGG_MODES}")
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and kl_coef > 0:
        # k3 estimator: unbiased, always >= 0, low variance (Schulman 2020).
        delta = (ref_logprobs - logprobs) * mask
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl
    loss = _aggregate(per_token, mask, agg, max_len)
    with torch.no_grad():
        n = mask.sum().clamp_min(1.0)
        clip_frac = (((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).to(mask.dtype) * mask).sum() / n
        metrics = {
            "loss/policy": float(loss.detach()),
            "loss/clip_frac": float(clip_frac),
            "loss/ratio_mean": float((ratio * mask).sum() / n),
            "loss/kl": float((kl * mask).sum() / n),
        }
    return LossOutput(loss, metrics)


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: str, max_len: int | None) -> torch.Tensor:
    if agg == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp_min(1.0)
    seq_tokens = mask.sum(dim=1).clamp_min(1.0)
    if agg == "seq_mean_token_mean":
        return ((per_token * mask).sum(dim=1) / seq_tokens).mean()
    norm = float(max_len if max_len is not None else mask.shape[1])
    return ((per_token * mask).sum(dim=1) / norm).mean()


class PolicyLoss:
    """The trainer's loss, chosen by `algorithm.loss`: a built-in name or a user's `package.module:Class`.

    Called once per micro-batch with [B, T] tensors (`ref_logprobs` None without a reference model) and the
    `algorithm` config (its knobs are the loss's to read); returns the loss and its `loss/*` metrics. The
    trainer weighs micro-batches by `algorithm.loss_agg`, so a loss that aggregates otherwise says so there."""

    name: str = ""

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, ref_logprobs: torch.Tensor | None, algo: Any) -> LossOutput:
        raise NotImplementedError


LOSSES: Registry[type[PolicyLoss]] = Registry("loss", PolicyLoss, "a subclass of rlexp.algorithm.grpo.PolicyLoss")


@LOSSES.register("grpo")
class GRPOLoss(PolicyLoss):
    """`grpo_loss` with the clip range, KL coefficient and aggregation of `algorithm`."""

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, ref_logprobs: torch.Tensor | None, algo: Any) -> LossOutput:
        return grpo_loss(logprobs, old_logprobs, advantages, mask, algo.clip_low, algo.clip_high, ref_logprobs,
                         algo.kl_coef, algo.loss_agg, max_len=algo.max_tokens)
