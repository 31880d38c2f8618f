"""The embedded default model: a tiny Qwen3-architecture network with random weights, written in
Hugging Face format from a fixed seed on first use.

It goes through exactly the loading path a real checkpoint takes (config.json + safetensors read by
both TorchTitan and vLLM), so the default run exercises the same code as `model=qwen3_8b`.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from rlexp.config.model import ModelConfig
from rlexp.models.tokenizer import copy_char_tokenizer

DEFAULT_CACHE = Path(os.environ.get("RLEXP_CACHE", Path.home() / ".cache" / "rlexp"))


def hf_config_dict(cfg: ModelConfig) -> dict:
    a = cfg.arch
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": a.vocab_size,
        "hidden_size": a.dim,
        "intermediate_size": a.hidden_dim,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "head_dim": a.head_dim,
        "max_position_embeddings": a.max_seq_len,
        "rope_theta": a.rope_theta,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": a.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": cfg.dtype,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }


def tiny_checkpoint_dir(cfg: ModelConfig) -> Path:
    """Content-addressed cache folder: a change of architecture or init seed gets its own checkpoint."""
    key = json.dumps({"hf": hf_config_dict(cfg), "seed": cfg.init_seed}, sort_keys=True)
    import hashlib

    return DEFAULT_CACHE / "tiny" / hashlib.sha256(key.encode()).hexdigest()[:16]


def write_tiny_checkpoint(cfg: ModelConfig, out_dir: Path) -> Path:
    """Random init with HF's Qwen3 initialiser under `cfg.init_seed`, saved as safetensors + config.json."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir = Path(out_dir)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent if out_dir.parent.exists() else None, prefix=".tiny-"))
    hf_cfg = hf_config_dict(cfg)
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(cfg.init_seed)
        model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in hf_cfg.items() if k != "architectures"}))
    sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if cfg.arch.tie_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "pad_token_id": 0}))
    copy_char_tokenizer(tmp)
    if out_dir.exists():  # another process won the race; keep its (identical) copy
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out_dir)
    return out_dir


def ensure_tiny_checkpoint(cfg: ModelConfig, out_dir: Path | None = None) -> Path:
    out_dir = Path(out_dir) if out_dir else tiny_checkpoint_dir(cfg)
    if not (out_dir / "model.safetensors").exists():
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        write_tiny_checkpoint(cfg, out_dir)
    return out_dir
