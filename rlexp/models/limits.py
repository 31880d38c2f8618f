"""The limits a checkpoint's own `config.json` sets, checked against the run before anything is
spawned.

Why: the catalog and the model yamls are copies of the published numbers, and a copy can be wrong
(the catalog once gave Qwen3-8B-Base 40,960 positions where its config.json says 32,768): vLLM then
refuses `max_model_len` at engine start, minutes into the run, or, worse, the trainer's RoPE table
runs past what the model was trained on. So the checkpoint that will be loaded is read here
(`model.path`, or the Hugging Face cache entry `rlexp.models.hf.resolve_checkpoint` found; never the
network):

- vocabulary size, `rope_theta` and RoPE scaling must equal the run's `model.arch` (rlexp's
TorchTitan model
  implements plain RoPE, no YaRN or other scaling): a mismatch is refused naming both values;
- `max_position_embeddings` caps `model.arch.max_seq_len` (what vLLM gets as `max_model_len` and the
trainer
  builds its RoPE table from): a larger configured value is lowered to the checkpoint's, and said; a
  run whose
  prompt + response (`algorithm.max_prompt_tokens + algorithm.max_tokens`) does not fit even then is
  refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlexp.config.model import ModelConfig


class LimitError(ValueError):
    """The checkpoint and the run disagree on something the run cannot adjust; the message names
    both values."""


@dataclass(frozen=True)
class CheckpointLimits:
    """What the checkpoint's config.json says (None: the key is absent)."""

    source: str  # the config.json read
    max_positions: int | None
    vocab_size: int | None
    rope_theta: float | None
    rope_scaling: Any  # None, or the scaling the checkpoint asks for (a dict)


def read_limits(model_dir: str | Path) -> CheckpointLimits | None:
    """The limits in `<model_dir>/config.json`; None when the folder has none (a bare weights
    folder)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    c = json.loads(path.read_text())
    if not isinstance(c, dict):
        raise LimitError(f"{path}: not a JSON object")
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    # transformers 5 moved it into rope_parameters
    theta = c.get("rope_theta", rope.get("rope_theta"))
    scaling = c.get("rope_scaling")
    if scaling is None and rope.get("rope_type") not in (None, "default"):
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    n = c.get("max_position_embeddings")
    vocab = c.get("vocab_size")
    return CheckpointLimits(str(path), int(n) if n is not None else None,
                            int(vocab) if vocab is not None else None,
                            float(theta) if theta is not None else None, scaling)


def apply_limits(model: ModelConfig, limits: CheckpointLimits, prompt_tokens: int,
                 max_tokens: int) -> list[str]:
    """Check `model.arch`, and a run of `prompt_tokens + max_tokens` per sequence, against `limits`;
    lower `model.arch.max_seq_len` to the checkpoint's positions when it is larger. Returns what was
    changed, one line each, for the caller to say; raises `LimitError` for what cannot be
    adjusted."""
    arch, src, name = model.arch, limits.source, model.name
    if limits.vocab_size is not None and limits.vocab_size != arch.vocab_size:
        raise LimitError(f"model={name}: model.arch.vocab_size={arch.vocab_size} but the "
                         f"checkpoint's vocab_size is {limits.vocab_size} ({src}): set "
                         f"model.arch.vocab_size={limits.vocab_size}, or point model.path/hf_repo "
                         f"at the checkpoint the config describes")
    if limits.rope_theta is not None and float(limits.rope_theta) != float(arch.rope_theta):
        raise LimitError(f"model={name}: model.arch.rope_theta={arch.rope_theta:g} but the "
                         f"checkpoint's rope_theta is {limits.rope_theta:g} ({src}): set "
                         f"model.arch.rope_theta={limits.rope_theta:g}")
    if limits.rope_scaling:
        raise LimitError(f"model={name}: the checkpoint asks for RoPE scaling "
                         f"{limits.rope_scaling} ({src}), which rlexp's TorchTitan model does not "
                         f"implement (plain RoPE only), so the trainer's logprobs would not be the "
                         f"generator's: use a checkpoint without rope_scaling")
    notes = []
    cap = limits.max_positions
    if cap is not None and arch.max_seq_len > cap:
        notes.append(f"model.arch.max_seq_len {arch.max_seq_len} lowered to {cap}, the "
                     f"checkpoint's max_position_embeddings ({src}): vLLM's max_model_len and the "
                     f"trainer's RoPE table use it")
        arch.max_seq_len = cap
    if prompt_tokens + max_tokens > arch.max_seq_len:
        raise LimitError(f"model={name}: algorithm.max_prompt_tokens + algorithm.max_tokens = "
                         f"{prompt_tokens} + {max_tokens} tokens per sequence, more than the "
                         f"model's {arch.max_seq_len} positions (model.arch.max_seq_len, at most "
                         f"the checkpoint's max_position_embeddings {cap}): set "
                         f"algorithm.max_tokens={max(arch.max_seq_len - prompt_tokens, 1)} or "
                         f"lower algorithm.max_prompt_tokens")
    return notes


def cached_limits(model: ModelConfig,
                  cache_dir: str | Path | None = None) -> CheckpointLimits | None:
    """The limits of `model`'s checkpoint when it is on this machine (`model.path`, or the Hugging
    Face cache: never a download); None when it is not, and the run checks them when it resolves the
    checkpoint."""
    from rlexp.models.hf_files import CheckpointError, find_checkpoint

    try:
        found = find_checkpoint(model, cache_dir=cache_dir)
        # None: the tiny model, whose checkpoint is written from model.arch
        return None if found is None else read_limits(found)
    except CheckpointError:
        return None
