"""Helpers shared by the sharded-trainer tests (FSDP: test_trainer_parallel.py, TP: test_trainer_tp.py)."""
from __future__ import annotations

import random
import socket
from typing import Any

import torch

from rlexp.config.model import ModelConfig
from rlexp.models.policy import load_policy, sequence_logprobs
from rlexp.types import TrainBatch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpo_batch(cfg: ModelConfig, model_dir: str, seed: int, groups: int, k: int = 4) -> TrainBatch:
    """GRPO-shaped rows (groups share a prompt); old logprobs = the initial policy's plus noise, so some clip."""
    rng = random.Random(seed)
    prompts, responses = [], []
    for _ in range(groups):
        p = [rng.randrange(1, 128) for _ in range(rng.randrange(4, 9))]
        for _ in range(k):
            prompts.append(p)
            responses.append([rng.randrange(1, 128) for _ in range(rng.randrange(1, 5))])
    with torch.no_grad():
        lp, _ = sequence_logprobs(load_policy(cfg, model_dir), prompts, responses, 1.0, 0)
    old = [[float(x) + rng.gauss(0, 0.1) for x in row[: len(r)]] for row, r in zip(lp, responses)]
    return TrainBatch(prompts, responses, old, [rng.gauss(0, 1) for _ in prompts])


def rank0(t: Any, endpoint: str, *args: Any) -> Any:
    """Call a (collective) endpoint on every rank of `t`; rank 0's answer."""
    return next(iter(getattr(t, endpoint).call(*args).get().values()))


def train_steps(t: Any, batches: list[TrainBatch]) -> list[dict[str, float]]:
    return [rank0(t, "train_step", b) for b in batches]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)
