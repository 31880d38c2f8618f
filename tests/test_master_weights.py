"""fp32 master weights, bf16 compute (rlexp/models/parallel.py), on one rank: no actors, the trainer's own builder.

A `model.dtype: bfloat16` policy (every Qwen3 preset) used to be trained in bf16: at lr 1e-6 one AdamW step moved
2% of the weights (a bf16 weight of magnitude 0.02 moves in steps of ~1e-4). Here the trainer's copy keeps fp32
parameters (and so fp32 gradients and AdamW moments) and runs its forward in bf16, op for op as the generators'
bf16 model runs it, so their logprobs stay bit-identical.
"""
from __future__ import annotations

import random

import pytest
import torch

from rlexp.config.model import ModelConfig
from rlexp.models.parallel import PolicySettings, build_policy
from rlexp.models.policy import load_policy, sequence_logprobs
from rlexp.models.tiny import ensure_tiny_checkpoint

BF16 = ModelConfig(dtype="bfloat16")


def _batch(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 60) for _ in range(rng.randrange(4, 9))] for _ in range(6)]
    return prompts, [[rng.randrange(1, 60) for _ in range(rng.randrange(2, 6))] for _ in prompts]


def _one_step(train: bool, **settings) -> tuple[torch.nn.Module, dict, dict]:
    """One AdamW step at lr 1e-6 on the tiny bf16 model; (model, weights before, gradients)."""
    d = str(ensure_tiny_checkpoint(BF16))
    model, _ = build_policy(PolicySettings(BF16, d, 0, **settings), 0, torch.device("cpu"), train=train)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    prompts, responses = _batch()
    logp, mask = sequence_logprobs(model, prompts, responses, 1.0, 0)
    (-(logp * mask).sum() / mask.sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0).step()
    return model, before, grads


def _moved(model: torch.nn.Module, before: dict, grads: dict) -> tuple[int, int]:
    """(weights that moved, weights with a gradient large enough that AdamW's first step is ~lr: |g| >> eps)."""
    moved = with_grad = 0
    for n, p in model.named_parameters():
        g = grads[n].abs() > 1e-6
        with_grad += int(g.sum())
        moved += int(((p.detach() != before[n]) & g).sum())
    return moved, with_grad


def test_a_bf16_model_takes_an_adamw_step_at_lr_1e_6_in_every_weight_with_a_gradient() -> None:
    model, before, grads = _one_step(train=True)
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # master weights
    assert {g.dtype for g in grads.values()} == {torch.float32}      # gradients, hence AdamW's moments
    moved, with_grad = _moved(model, before, grads)
    assert with_grad > 200_000  # the tiny model has 328,576 weights; almost all get a gradient
    assert moved == with_grad, f"{with_grad - moved} of {with_grad} weights with a gradient did not move"


def test_the_serving_dtype_copy_barely_moves_which_is_why_the_trainer_keeps_fp32() -> None:
    """The frozen (reference-model) build is the serving dtype throughout; trained as it is, it barely learns:
    the failure the fp32 masters fix, measured on the same batch (the test above would fail with it)."""
    model, before, grads = _one_step(train=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    moved, with_grad = _moved(model, before, grads)
    assert moved < 0.1 * with_grad


@pytest.mark.parametrize("ac", [False, True])
def test_bf16_compute_gives_the_generators_logprobs_bit_for_bit(ac: bool) -> None:
    """The trainer's forward (fp32 masters cast per module) is the bf16 model's, as the titan generator holds it;
    with activation checkpointing the recompute casts again, and the gradients are the same bits."""
    d = str(ensure_tiny_checkpoint(BF16))
    served = load_policy(BF16, d)  # what TitanBackend samples with
    trained, _ = build_policy(PolicySettings(BF16, d, 0, activation_checkpointing=ac), 0, torch.device("cpu"),
                              train=True)
    prompts, responses = _batch(1)
    with torch.no_grad():
        want, _ = sequence_logprobs(served, prompts, responses, 0.7, 0)
    got, mask = sequence_logprobs(trained, prompts, responses, 0.7, 0)
    assert torch.equal(got.detach(), want)
    assert {p.dtype for p in trained.parameters()} == {torch.float32}  # put back after every forward
    (got * mask).sum().backward()
    grads = [p.grad.clone() for p in trained.parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    if ac:
        plain, _ = build_policy(PolicySettings(BF16, d, 0), 0, torch.device("cpu"), train=True)
        logp, mask = sequence_logprobs(plain, prompts, responses, 0.7, 0)
        (logp * mask).sum().backward()
        assert all(torch.equal(a, p.grad) for a, p in zip(grads, plain.parameters()))
