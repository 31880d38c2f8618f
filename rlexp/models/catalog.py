"""The Qwen3 dense family as published, in one table.

Why a table in code as well as the yamls: the yamls are what users edit, the table is what they are
checked against (tests compare every `conf/model/qwen3_*.yaml` to it), and the planner and parameter
counts need the numbers without composing Hydra. Numbers come from each model's published
`config.json` (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
intermediate_size, vocab_size, tie_word_embeddings) and are identical to TorchTitan 0.3.0's
`qwen3_configs`; `published_params_b` is the "Number of Parameters" line of each model card.

`REVISIONS` pins each repo to a commit. They could not be read from the Hub here (no network); each is
the revision that independent public projects pin for that repo (e.g. marin-community/marin's
`experiments/models.py` and a C checkpoint registry that read its numbers from the pinned
config.json), at least two agreeing per repo. Where a repo has moved since, `rlexp` still loads the
pinned commit, which is the point of pinning; check one with `HfApi().model_info(repo).sha`.
"""
from __future__ import annotations

from dataclasses import dataclass

from rlexp.config.model import ArchConfig

QWEN3_VOCAB = 151936
# `max_position_embeddings` of the published config.json: 32,768 for the base (pre-trained)
# checkpoints, whose third pre-training stage extends sequences to 32k; 40,960 for the post-trained
# ones (Qwen/Qwen3-0.6B ... Qwen/Qwen3-32B, also the 32B "base" yaml's checkpoint). vLLM refuses a
# longer max_model_len, so the yamls carry these and `rlexp.models.limits` checks them against the
# checkpoint itself before a run spawns.
QWEN3_BASE_MAX_POSITIONS = 32768
QWEN3_MAX_POSITIONS = 40960
QWEN3_ROPE_THETA = 1_000_000.0


@dataclass(frozen=True)
class Qwen3Size:
    key: str  # config-name stem, e.g. "8b" -> conf/model/qwen3_8b.yaml
    flavor: str  # TorchTitan qwen3_configs key
    base_repo: str
    instruct_repo: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    tie_embeddings: bool
    published_params_b: float  # model card, total incl. embeddings, rounded to 0.1B
    head_dim: int = 128

    def max_positions(self, repo: str) -> int:
        """The published `max_position_embeddings` of `repo` (this size's base or post-trained
        checkpoint)."""
        return QWEN3_BASE_MAX_POSITIONS if repo.endswith("-Base") else QWEN3_MAX_POSITIONS

    def arch(self, repo: str | None = None) -> ArchConfig:
        """The architecture of `repo` (default the base checkpoint); only the context length
        differs."""
        return ArchConfig(
            dim=self.dim,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            hidden_dim=self.hidden_dim,
            vocab_size=QWEN3_VOCAB,
            max_seq_len=self.max_positions(repo or self.base_repo),
            rope_theta=QWEN3_ROPE_THETA,
            tie_embeddings=self.tie_embeddings,
        )


QWEN3_SIZES: dict[str, Qwen3Size] = {
    s.key: s
    for s in (
        Qwen3Size("0_6b", "0.6B", "Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-0.6B", 1024, 28, 16, 8, 3072, True, 0.6),
        Qwen3Size("1_7b", "1.7B", "Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-1.7B", 2048, 28, 16, 8, 6144, True, 1.7),
        Qwen3Size("4b", "4B", "Qwen/Qwen3-4B-Base", "Qwen/Qwen3-4B", 2560, 36, 32, 8, 9728, True, 4.0),
        Qwen3Size("8b", "8B", "Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B", 4096, 36, 32, 8, 12288, False, 8.2),
        Qwen3Size("14b", "14B", "Qwen/Qwen3-14B-Base", "Qwen/Qwen3-14B", 5120, 40, 40, 8, 17408, False, 14.8),
        Qwen3Size("32b", "32B", "Qwen/Qwen3-32B", "Qwen/Qwen3-32B", 5120, 64, 64, 8, 25600, False, 32.8),
    )
}
# Qwen did not release a Qwen3-32B-Base; both 32B yamls point at the post-trained Qwen/Qwen3-32B
# (the base yaml uses it without the chat template).


REVISIONS: dict[str, str] = {
    "Qwen/Qwen3-0.6B-Base": "da87bfb608c14b7cf20ba1ce41287e8de496c0cd",
    "Qwen/Qwen3-0.6B": "c1899de289a04d12100db370d81485cdf75e47ca",
    "Qwen/Qwen3-1.7B-Base": "ea980cb0a6c2ae4b936e82123acc929f1cec04c1",
    "Qwen/Qwen3-1.7B": "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e",
    "Qwen/Qwen3-4B-Base": "906bfd4b4dc7f14ee4320094d8b41684abff8539",
    "Qwen/Qwen3-4B": "1cfa9a7208912126459214e8b04321603b3df60c",
    "Qwen/Qwen3-8B-Base": "49e3418fbbbca6ecbdf9608b4d22e5a407081db4",
    "Qwen/Qwen3-8B": "b968826d9c46dd6066d109eabc6255188de91218",
    "Qwen/Qwen3-14B-Base": "0b0bd3732e2c374d483664439ea334928b65f304",
    "Qwen/Qwen3-14B": "40c069824f4251a91eefaf281ebe4c544efd3e18",
    "Qwen/Qwen3-32B": "9216db5781bf21249d130ec9da846c4624c16137",
}


def param_count(arch: ArchConfig) -> int:
    """Exact parameter count of a dense Qwen3 (tied embeddings counted once).

    Per layer: q/k/v/o projections (no biases), q_norm and k_norm over head_dim, SwiGLU w1/w2/w3,
    two RMSNorms. Written out so the planner does not need to build a model.
    """
    q = arch.n_heads * arch.head_dim
    kv = arch.n_kv_heads * arch.head_dim
    attn = arch.dim * q + 2 * arch.dim * kv + q * arch.dim + 2 * arch.head_dim
    mlp = 3 * arch.dim * arch.hidden_dim
    layer = attn + mlp + 2 * arch.dim
    emb = arch.vocab_size * arch.dim
    return arch.n_layers * layer + emb * (1 if arch.tie_embeddings else 2) + arch.dim


def layer_param_count(arch: ArchConfig) -> int:
    q = arch.n_heads * arch.head_dim
    kv = arch.n_kv_heads * arch.head_dim
    return (arch.dim * q + 2 * arch.dim * kv + q * arch.dim + 2 * arch.head_dim
            + 3 * arch.dim * arch.hidden_dim + 2 * arch.dim)
