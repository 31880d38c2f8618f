"""GRPO math against hand-computed values."""
import math

import pytest
import torch

from rlexp.algorithm.grpo import group_advantages, grpo_loss


def test_group_advantages_normalise_within_each_group():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(r, group_size=4)
    # group 1: mean 0.25, population std sqrt(0.1875)=0.4330
    s = math.sqrt(0.1875)
    assert adv[:4].tolist() == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], rel=1e-5)
    # group 2: all equal -> zero advantage, not NaN
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_dr_grpo_advantage_is_mean_only():
    adv = group_advantages(torch.tensor([2.0, 0.0]), group_size=2, norm_by_std=False)
    assert adv.tolist() == [1.0, -1.0]


def test_group_size_must_divide():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(4), 3)


def test_clipped_surrogate_hand_computed():
    # one sequence, two tokens; ratios e^{0.5}=1.6487 (clipped to 1.2 for A>0) and e^{-0.5}=0.6065 (unclipped... )
    logp = torch.tensor([[0.0, -1.0]])
    old = torch.tensor([[-0.5, -0.5]])
    mask = torch.ones(1, 2)
    out = grpo_loss(logp, old, torch.tensor([2.0]), mask, clip_low=0.2, clip_high=0.2)
    r1, r2 = math.exp(0.5), math.exp(-0.5)
    tok1 = -min(r1 * 2, 1.2 * 2)  # clipped: -2.4
    tok2 = -min(r2 * 2, 0.8 * 2)  # min(1.213, 1.6) = 1.213 -> -1.213
    assert float(out.loss) == pytest.approx((tok1 + tok2) / 2, rel=1e-5)
    assert out.metrics["loss/clip_frac"] == pytest.approx(1.0)  # both ratios outside [0.8, 1.2]


def test_negative_advantage_clips_the_other_side():
    logp, old = torch.tensor([[-2.0]]), torch.tensor([[-1.0]])  # ratio e^-1 = 0.368 < 0.8
    out = grpo_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 1))
    # -min(0.368*-1, 0.8*-1) = -min(-0.368, -0.8) = 0.8
    assert float(out.loss) == pytest.approx(0.8, rel=1e-5)


def test_on_policy_gradient_equals_reinforce():
    logits = torch.zeros(3, requires_grad=True)
    logp_all = torch.log_softmax(logits, 0)
    lp = logp_all[1].view(1, 1)
    out = grpo_loss(lp, lp.detach(), torch.tensor([1.0]), torch.ones(1, 1))
    out.loss.backward()
    # d(-log p_1)/d logits = softmax - onehot
    assert logits.grad.tolist() == pytest.approx([1 / 3, 1 / 3 - 1, 1 / 3], abs=1e-6)


def test_loss_aggregation_modes_hand_computed():
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, 3.0])  # ratio 1 everywhere: per-token loss = -adv
    tok = grpo_loss(logp, logp, adv, mask, agg="token_mean").loss
    seq = grpo_loss(logp, logp, adv, mask, agg="seq_mean_token_mean").loss
    dr = grpo_loss(logp, logp, adv, mask, agg="seq_mean_token_sum_norm", max_len=4).loss
    assert float(tok) == pytest.approx(-(1 + 1 + 1 + 3) / 4)
    assert float(seq) == pytest.approx(-(1 + 3) / 2)
    assert float(dr) == pytest.approx(-((3 * 1) / 4 + 3 / 4) / 2)


def test_k3_kl_penalty_hand_computed():
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    out = grpo_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), ref_logprobs=ref, kl_coef=0.1)
    d = -0.5
    assert float(out.loss) == pytest.approx(0.1 * (math.exp(d) - d - 1), rel=1e-5)
    assert out.metrics["loss/kl"] == pytest.approx(math.exp(d) - d - 1, rel=1e-5)


def test_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="token_mean"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), agg="sum")
