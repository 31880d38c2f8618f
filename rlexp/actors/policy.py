"""Per-token logprobs of a TorchTitan policy, shared by the trainer, the reference model and the
`titan` generator so that all three compute them with literally the same code."""
from __future__ import annotations

import torch
import torch.nn as nn

from rlexp.models import titan
from rlexp.models.config import ModelConfig


def load_policy(cfg: ModelConfig, model_dir: str, device: str = "cpu") -> nn.Module:
    """TorchTitan Qwen3 with the HF checkpoint in `model_dir` (validated: names file and key on mismatch)."""
    from rlexp.models.hf import load_hf_into_titan

    model = titan.build_model(cfg, device=device)
    load_hf_into_titan(model, model_dir, cfg)
    return model


def pad_sequences(seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def forward_unique(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits for `tokens`, running the model once per *distinct* row.

    A GRPO group repeats its prompt `group_size` times; with short responses most rows are identical
    up to the last position, so this cuts the forward (and backward) by up to `group_size`x. Rows are
    deduplicated in sorted order, which also gives the sampler and the trainer the same batch shape and
    order for the same prompts, one of the conditions for bit-identical logprobs.
    """
    uniq, inverse = torch.unique(tokens, dim=0, return_inverse=True)
    if uniq.shape[0] == tokens.shape[0]:
        return model(tokens)
    return model(uniq)[inverse]


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
    logits = logits.float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    t_max = max(len(r) for r in responses)
    starts = torch.tensor([len(p) - 1 for p in prompts], device=logp.device).unsqueeze(1)
    idx = (starts + torch.arange(t_max, device=logp.device).unsqueeze(0)).clamp(max=logp.shape[1] - 1)
    lens = torch.tensor([len(r) for r in responses], device=logp.device).unsqueeze(1)
    mask = (torch.arange(t_max, device=logp.device).unsqueeze(0) < lens).to(logp.dtype)
    return logp.gather(1, idx) * mask, mask
