"""Per-token logprobs of a TorchTitan policy, shared by the trainer, the reference model and the
`titan` generator so that all three compute them with literally the same code."""
from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch
import torch.nn as nn

from rlexp.config.model import ModelConfig
from rlexp.models import titan
from rlexp.models.hf import load_hf_into_titan


def load_policy(cfg: ModelConfig, model_dir: str, device: str = "cpu") -> nn.Module:
    """TorchTitan Qwen3 with the HF checkpoint in `model_dir` (validated: names file and key on mismatch)."""
    model = titan.build_model(cfg, device=device)
    load_hf_into_titan(model, model_dir, cfg)
    return model


_NUMPY = {torch.long: np.int64, torch.float32: np.float32}


def pad_rows(rows: Sequence[Sequence[float]], pad: float, dtype: torch.dtype, width: int | None = None
             ) -> torch.Tensor:
    """Right-padded [B, width] tensor of `rows` (each cut to `width`; default the longest row), built with one
    scatter from one flat array: a tensor per row, or torch.tensor over a list of Python numbers, cost 10 ms per
    1,024 rows (a step's batch); numpy reads the list at a fraction of that, with the same rounding."""
    if width is not None and any(len(r) > width for r in rows):
        rows = [r[:width] for r in rows]
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter(chain.from_iterable(rows), dtype=_NUMPY[dtype], count=int(lens.sum()))
    out = torch.full((len(rows), int(lens.max()) if width is None else width), pad, dtype=dtype)
    out[torch.arange(out.shape[1]).unsqueeze(0) < torch.from_numpy(lens).unsqueeze(1)] = torch.from_numpy(flat)
    return out


def pad_sequences(seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-padded [B, max_len] token tensor."""
    return pad_rows(seqs, pad_id, torch.long)


def forward_unique(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits for `tokens`, running the model once per *distinct* row.

    A GRPO group repeats its prompt `group_size` times; with short responses most rows are identical
    up to the last position, so this cuts the forward (and backward) by up to `group_size`x. Rows are
    deduplicated in sorted order, which also gives the sampler and the trainer the same batch shape and
    order for the same prompts, one of the conditions for bit-identical logprobs.

    Rows are expanded with `index_select`, never `out[inverse]`: the backward of advanced indexing on the CPU
    adds duplicate rows' gradients with atomic float adds when torch runs more than one thread, so the sum's
    order (and its last bits) changed from run to run; `index_select`'s backward adds them in index order.
    """
    uniq, inverse = torch.unique(tokens, dim=0, return_inverse=True)
    if uniq.shape[0] == tokens.shape[0]:
        return model(tokens)
    out = model(uniq)
    if _is_dtensor(out):  # tensor-parallel logits: rows are whole on every rank, so index the local shard
        from torch.distributed.tensor import DTensor

        rows = out.to_local().index_select(0, inverse)
        return DTensor.from_local(rows, out.device_mesh, out.placements, run_check=False)
    return out.index_select(0, inverse)


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position. Vocabulary-sharded (tensor-parallel) logits go through a
    loss-parallel cross-entropy, which never gathers the vocabulary; the caller must run forward *and*
    backward inside `torch.distributed.tensor.parallel.loss_parallel()` (the trainer does)."""
    if _is_dtensor(logits):
        import torch.nn.functional as F

        nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return -nll.to_local().view(targets.shape)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def sequence_logprobs(
    model: nn.Module, prompts: list[list[int]], responses: list[list[int]], temperature: float, pad_id: int,
    device: torch.device | str = "cpu", autocast: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs of each response token at the sampling temperature: ([B, T] logprobs, [B, T] mask) on `device`.

    Sequences are right-padded, so causal attention never lets a real token see padding. The forward
    runs on `tokens[:, :-1]`, the same shape the sampler's last decoding step sees, which is what lets
    the `titan` backend match the trainer bit for bit. `autocast` (e.g. bf16) applies to the model's
    forward only: the log-softmax and everything the loss sees stay fp32.
    """
    seqs = [p + r for p, r in zip(prompts, responses)]
    tokens = pad_sequences(seqs, pad_id).to(device)
    if autocast is None:
        logits = forward_unique(model, tokens[:, :-1])
    else:
        with torch.autocast(tokens.device.type, dtype=autocast):
            logits = forward_unique(model, tokens[:, :-1])
    logp = token_logprobs(logits.float() / temperature, tokens[:, 1:])
    t_max = max(len(r) for r in responses)
    starts = torch.tensor([len(p) - 1 for p in prompts], device=logp.device).unsqueeze(1)
    idx = (starts + torch.arange(t_max, device=logp.device).unsqueeze(0)).clamp(max=logp.shape[1] - 1)
    lens = torch.tensor([len(r) for r in responses], device=logp.device).unsqueeze(1)
    mask = (torch.arange(t_max, device=logp.device).unsqueeze(0) < lens).to(logp.dtype)
    return logp.gather(1, idx) * mask, mask
