"""A Hugging Face checkpoint's files, found and checked without torch: `rlexp train` refuses a
missing or mismatched model before torch loads (`rlexp.run.inputs`), and `rlexp.models.hf`, which
loads and saves, re-exports these names.

Validation reads only safetensors headers (no tensor data), so it runs on a 64 GB checkpoint in
well under a second and reports every problem at once, each naming the file and the key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rlexp.config.model import ArchConfig, ModelConfig
from rlexp.core.weight_files import IGNORED_SUFFIXES, INDEX_FILE, CheckpointError, weight_files

# safetensors refuses headers over 100 MB; so does this reader.
MAX_HEADER = 100 * 2**20
QWEN3_ARCHITECTURE = "Qwen3ForCausalLM"
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


# --- Resolution ---


def download_hint(repo: str, revision: str) -> str:
    return (
        f"get it with `hf download {repo} --revision {revision}` "
        f"(older huggingface_hub: `huggingface-cli download {repo} --revision {revision}`), "
        f"or set model.path to a local folder"
    )


def hf_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "0").lower() in (
        "1",
        "true",
        "yes",
    )


def find_checkpoint(
    cfg: ModelConfig, *, allow_download: bool = False, cache_dir: str | Path | None = None
) -> Path | None:
    """The local folder holding `cfg`'s weights, or None for the embedded tiny model (no path, no
    repo: `rlexp.models.hf.resolve_checkpoint` writes it, which needs torch).

    Order: `cfg.path` (a local folder wins), then the HF cache entry for `hf_repo@revision`. The
    cache is read with `local_files_only=True`, so finding never touches the network unless
    `allow_download` is set and HF_HUB_OFFLINE is not.
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
            return Path(
                snapshot_download(
                    cfg.hf_repo, revision=cfg.revision, cache_dir=cache_dir, local_files_only=True
                )
            )
        except LocalEntryNotFoundError:
            pass
        if allow_download and not hf_offline():
            return Path(
                snapshot_download(
                    cfg.hf_repo,
                    revision=cfg.revision,
                    cache_dir=cache_dir,
                    allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"],
                )
            )
        from huggingface_hub import constants

        where = cache_dir or constants.HF_HUB_CACHE
        offline = " (HF_HUB_OFFLINE is set)" if hf_offline() else ""
        raise CheckpointError(
            f"checkpoint {cfg.hf_repo}@{cfg.revision} is not in the Hugging Face cache "
            f"{where}{offline}: {download_hint(cfg.hf_repo, cfg.revision)}"
        )

    return None


# --- Validation ---


def expected_hf_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a Qwen3ForCausalLM checkpoint of this architecture holds, with its shape."""
    q, kv, d = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim, arch.dim
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (arch.vocab_size, d),
        "model.norm.weight": (d,),
    }
    if not arch.tie_embeddings:
        out["lm_head.weight"] = (arch.vocab_size, d)
    for i in range(arch.n_layers):
        p = f"model.layers.{i}."
        out.update(
            {
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
            }
        )
    return out


def read_tensor_infos(path: Path) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes from the safetensors headers only: an 8-byte little-endian length,
    then that much JSON; no tensor data is read, no torch. A header that does not parse, or that
    claims more than `MAX_HEADER` bytes, is refused naming the file."""
    infos: dict[str, TensorInfo] = {}
    for f in weight_files(path):
        if not f.exists():
            raise CheckpointError(
                f"{path / INDEX_FILE}: names {f.name}, which is missing from {path}"
            )
        try:
            with open(f, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                if not 2 <= size <= MAX_HEADER:
                    raise ValueError(f"header length {size}")
                header = json.loads(fh.read(size))
            for k in sorted(header):
                if k != "__metadata__":
                    info = header[k]
                    infos[k] = TensorInfo(
                        f.name, tuple(int(n) for n in info["shape"]), str(info["dtype"])
                    )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"{f}: not a safetensors file ({type(e).__name__}: {e}); "
                f"a partial download? fetch it again"
            ) from None
    return infos


def validate_checkpoint(path: str | Path, cfg: ModelConfig) -> CheckpointInfo:
    """Check that the folder holds a Qwen3ForCausalLM matching `cfg.arch`; raise listing every
    problem."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(
            f"{cfg_file}: missing (not a Hugging Face checkpoint folder)"
            + (f"; {download_hint(cfg.hf_repo, cfg.revision)}" if cfg.hf_repo else "")
        )
    hf_cfg = json.loads(cfg_file.read_text())
    errors: list[str] = []
    archs = hf_cfg.get("architectures") or []
    if archs != [QWEN3_ARCHITECTURE]:
        raise CheckpointError(
            f"{cfg_file}: key 'architectures' is {archs}, expected [{QWEN3_ARCHITECTURE!r}] "
            f"(rlexp builds dense Qwen3 only)"
        )
    for hf_key, field_name in _HF_ARCH_KEYS.items():
        want = getattr(cfg.arch, field_name)
        if hf_key not in hf_cfg:
            if hf_key == "tie_word_embeddings":  # HF default is True for Qwen3Config
                got = True
            else:
                errors.append(
                    f"{cfg_file}: key {hf_key!r} missing (model.arch.{field_name}={want})"
                )
                continue
        else:
            got = hf_cfg[hf_key]
        if got != want:
            errors.append(f"{cfg_file}: key {hf_key!r} is {got}, model.arch.{field_name} is {want}")
    hint = (
        [f"incomplete or wrong download? {download_hint(cfg.hf_repo, cfg.revision)}"]
        if cfg.hf_repo
        else []
    )
    if not weight_files(path):
        errors.append(f"{path}: no *.safetensors files")
        raise CheckpointError(_format(path, errors, hint))
    infos = read_tensor_infos(path)
    expected = expected_hf_shapes(cfg.arch)
    for k, shape in expected.items():
        if k not in infos:
            errors.append(f"{path}: missing key {k!r} (expected shape {list(shape)})")
        elif infos[k].shape != shape:
            errors.append(
                f"{path / infos[k].file}: key {k!r} has shape {list(infos[k].shape)}, "
                f"expected {list(shape)}"
            )
    for k, info in infos.items():
        if k in expected or k.endswith(IGNORED_SUFFIXES):
            continue
        if k == "lm_head.weight" and cfg.arch.tie_embeddings:
            # Some tied checkpoints store the (identical) head anyway; accept it if its shape fits.
            if info.shape != (cfg.arch.vocab_size, cfg.arch.dim):
                errors.append(
                    f"{path / info.file}: key {k!r} has shape {list(info.shape)}, "
                    f"expected {[cfg.arch.vocab_size, cfg.arch.dim]}"
                )
            continue
        errors.append(f"{path / info.file}: unexpected key {k!r} (shape {list(info.shape)})")
    if errors:
        raise CheckpointError(_format(path, errors, hint))
    return CheckpointInfo(path=path, config=hf_cfg, tensors=infos)


def _format(path: Path, errors: list[str], tail: list[str] | None = None, limit: int = 20) -> str:
    shown = (
        errors[:limit]
        + ([f"... and {len(errors) - limit} more"] if len(errors) > limit else [])
        + (tail or [])
    )
    return f"checkpoint {path} cannot be loaded:\n  " + "\n  ".join(shown)


def model_config_from_dir(model_dir: str | Path) -> ModelConfig:
    """Architecture numbers read back from an HF `config.json` (for evaluating a bare
    checkpoint)."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c.setdefault("tie_word_embeddings", False)
    # transformers 5 writes rope_theta inside rope_parameters; older versions at the top level.
    rope_theta = c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta", 1e6))
    arch = ArchConfig(
        **{field_name: c[key] for key, field_name in _HF_ARCH_KEYS.items()},
        max_seq_len=c.get("max_position_embeddings", 4096),
        rope_theta=rope_theta,
    )
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "float32")
    return ModelConfig(
        name=Path(str(model_dir).rstrip("/")).name, path=str(model_dir), dtype=dtype, arch=arch
    )
