"""TorchTitan's Qwen3 as rlexp's trained (and `titan`-backend sampled) model.

The model is built from `ModelConfig.arch` so the tiny default and Qwen3-8B share one code path.
Attention is TorchTitan's `ScaledDotProductAttention` with a causal mask: flex attention has no CPU
backward, and rlexp packs one right-padded sequence per row, so no per-document mask is needed.
Weights cross process boundaries in Hugging Face naming (via TorchTitan's state-dict adapter), which
is what vLLM loads and what checkpoints on the Hub use.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from functools import partial
from itertools import pairwise
from typing import Any

import torch
import torch.nn as nn

from rlexp.config.model import ArchConfig, ModelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"model.dtype={name!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[name]


@contextlib.contextmanager
def _compile_on_first_call() -> Iterator[None]:
    """`torch.compile(fn)` compiles when `fn` is first called, not when the call is made.

    Why: TorchTitan's attention module calls `torch.compile` on flex attention and its block-mask
    builder when it is imported, and building those wrappers imports torch's Inductor (about a
    fifth of the CPU an actor process spends importing what it needs). rlexp's model uses SDPA,
    never flex attention, so every actor process paid that at start for nothing. Under this
    context a function given to `torch.compile` gets a wrapper that calls the real `torch.compile`
    on its first call (compilation happens at the first call either way), so code that does use
    them gets what `torch.compile` returns; a module, or anything that is not a plain function,
    goes to `torch.compile` at once.
    """
    real = torch.compile

    def deferred(model: Any = None, **options: Any) -> Any:
        if model is None:  # the decorator form, `@torch.compile(...)`
            return partial(deferred, **options)
        if not inspect.isfunction(model):
            return real(model, **options)
        compiled: list[Callable[..., Any]] = []

        @functools.wraps(model)
        def first_call_compiles(*args: Any, **kwargs: Any) -> Any:
            if not compiled:
                compiled.append(real(model, **options))
            return compiled[0](*args, **kwargs)

        return first_call_compiles

    torch.compile = deferred  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real


def import_titan_models() -> None:
    """TorchTitan's model modules imported, their import-time `torch.compile` calls deferred
    (`_compile_on_first_call`); every rlexp import of them goes through here first."""
    if "torchtitan.models.common" in sys.modules:
        return
    with _compile_on_first_call():
        import torchtitan.models.common
        import torchtitan.models.qwen3.model  # noqa: F401


def titan_config(arch: ArchConfig) -> Any:
    """A TorchTitan `Qwen3Model.Config` with SDPA attention for the given architecture numbers."""
    import_titan_models()
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock

    lin = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}
    norm = lambda d: RMSNorm.Config(normalized_shape=d, eps=1e-6, param_init={"weight": nn.init.ones_})  # noqa: E731
    rope = CosSinRoPE.Config(dim=arch.head_dim, max_seq_len=arch.max_seq_len, theta=arch.rope_theta)
    layers = [
        Qwen3TransformerBlock.Config(
            attention_norm=norm(arch.dim),
            ffn_norm=norm(arch.dim),
            attention=make_gqa_config(
                dim=arch.dim, n_heads=arch.n_heads, n_kv_heads=arch.n_kv_heads, head_dim=arch.head_dim,
                wqkv_param_init=lin, wo_param_init=lin, inner_attention=ScaledDotProductAttention.Config(),
                fuse_qkv=True, rope=rope, qk_norm=norm(arch.head_dim),
            ),
            feed_forward=make_ffn_config(dim=arch.dim, hidden_dim=arch.hidden_dim, w1_param_init=lin,
                                         w2w3_param_init=lin),
        )
        for _ in range(arch.n_layers)
    ]
    return Qwen3Model.Config(
        vocab_size=arch.vocab_size,
        dim=arch.dim,
        norm=norm(arch.dim),
        enable_weight_tying=arch.tie_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=arch.vocab_size, embedding_dim=arch.dim,
                                        param_init={"weight": partial(nn.init.normal_, std=0.02)}),
        lm_head=Linear.Config(in_features=arch.dim, out_features=arch.vocab_size, param_init=lin),
        layers=layers,
    )


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu") -> nn.Module:
    """An uninitialised TorchTitan Qwen3 (load weights with `load_hf_state_dict`)."""
    with torch.device(device):
        model = titan_config(cfg.arch).build()
    return model.to(dtype=torch_dtype(cfg.dtype)) if str(device) != "meta" else model


def _adapter(arch: ArchConfig) -> Any:
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    return Qwen3StateDictAdapter(titan_config(arch), None)


def hf_to_titan(hf_sd: dict[str, torch.Tensor], arch: ArchConfig) -> dict[str, torch.Tensor]:
    sd = dict(_adapter(arch).from_hf(dict(hf_sd)))  # the adapter may reuse its input dict
    if arch.tie_embeddings:
        sd["lm_head.weight"] = sd["tok_embeddings.weight"]
    return sd


def titan_to_hf(titan_sd: dict[str, torch.Tensor], arch: ArchConfig) -> dict[str, torch.Tensor]:
    sd = dict(_adapter(arch).to_hf(dict(titan_sd)))
    if arch.tie_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def load_hf_state_dict(model: nn.Module, hf_sd: dict[str, torch.Tensor], arch: ArchConfig) -> None:
    sd = hf_to_titan(hf_sd, arch)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith(("rope.cache", "freqs_cis"))]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if arch.tie_embeddings:
        model.lm_head.weight = model.tok_embeddings.weight


def hf_state_dict(model: nn.Module, arch: ArchConfig) -> dict[str, torch.Tensor]:
    """The model's weights in HF naming, detached, on the CPU and contiguous (ready for
    safetensors). Each tensor is copied to the CPU before the HF renaming and splitting, so a GPU
    model needs no second copy on the GPU (on the CPU the tensors are the parameters' own
    storage)."""
    sd = {k: v.detach().to("cpu") for k, v in model.state_dict().items()
          if not k.endswith(("rope.cache", "freqs_cis"))}
    return {k: v.contiguous() for k, v in titan_to_hf(sd, arch).items()}


def _adjacent_concat(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """`torch.cat(parts)` as a view, when the parts already lie back to back in one storage (same dtype and
    trailing shape, contiguous); else None."""
    first = parts[0]
    if not all(p.dtype == first.dtype and p.shape[1:] == first.shape[1:] and p.is_contiguous()
               and p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for p in parts):
        return None
    for a, b in pairwise(parts):
        if a.data_ptr() + a.numel() * a.element_size() != b.data_ptr():
            return None
    shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
    return first.as_strided(shape, torch.empty(shape, device="meta").stride(), first.storage_offset())


def param_tensors(model: nn.Module, hf_sd: dict[str, torch.Tensor], arch: ArchConfig) -> dict[str, torch.Tensor]:
    """A tensor for each of `model`'s parameters (by name, ties counted once), built from an HF state dict with
    as little copying as the mapping allows: a renamed weight is the HF tensor itself, and the fused QKV weight is
    one view over q, k and v when a single KV head makes the fusion a plain concatenation and the three lie back to
    back (the trainer's state-dict order, which the shm `Layout` keeps). Any other fusion (several KV heads
    interleave q, k and v) goes through the module's own load hook, a new tensor. Why: a generator serving weights
    from a read-only mapping (`TitanBackend.serve_mapped`) points its parameters at these, so every view saved is
    a copy saved. Raises ValueError (as `load_hf_state_dict`) when the names do not match the model."""
    sd = hf_to_titan(hf_sd, arch)
    for prefix, module in model.named_modules():
        merge = getattr(module, "_merge_qkv_on_load", None)
        if merge is None or not hasattr(module, "wqkv"):
            continue
        pre = f"{prefix}." if prefix else ""
        for param in ("weight", "bias"):
            keys = [f"{pre}{w}.{param}" for w in ("wq", "wk", "wv")]
            if not all(k in sd for k in keys):
                continue
            parts = [sd.pop(k) for k in keys]
            fused = _adjacent_concat(parts) if parts[1].shape[0] == module.head_dim else None  # one KV head
            if fused is None:
                merged = dict(zip(keys, parts))
                merge(module, merged, pre)
                fused = merged[f"{pre}wqkv.{param}"]
            sd[f"{pre}wqkv.{param}"] = fused
    params = dict(model.named_parameters())
    missing = [k for k in params if k not in sd]
    unexpected = [k for k in sd if k not in params and k not in ("lm_head.weight",)]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return {k: sd[k] for k in params}
