"""KV-cached decoding with a TorchTitan Qwen3 model, for the `titan` generator's sampling loop.

`Decoder.forward` recomputes every position, so sampling T tokens with it costs O(T^2) per sequence;
this keeps each layer's rotated keys and values and runs only the newest token per step. Weights are
never copied: everything reads the model's own parameters and RoPE table, so an in-place weight sync
is seen by the next call.

Two paths, for two reasons:
- The prompt prefill calls the model's submodules (norms, fused QKV projection, QK-norm, RoPE, SDPA
  inner attention, output projection, feed-forward) in `Qwen3TransformerBlock.forward`'s order, so it
  runs the ops of a full forward and the first sampled token sees the logits the uncached loop saw.
- The one-token step is the hot loop. At sampling batch sizes its matmuls are tiny and per-op overhead
  dominates (module hooks, attribute lookups, RoPE's per-tensor slicing), so it applies the same
  weights with fewer, fused tensor ops: query and key heads are normed and rotated together, and the
  query heads of a KV group attend as one SDPA call without GQA expansion. It is checked against the
  full forward in tests/test_kv_decode.py.

Cached attention rounds differently from a full forward (logits agree to ~1e-6, not bit for bit). Use it
to *choose* tokens; where exact agreement with the trainer matters, recompute logprobs with
`rlexp.models.policy.sequence_logprobs`, as the titan backend does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from rlexp.models.titan import import_titan_models

import_titan_models()  # TorchTitan's attention module first imported there (see why)
from torchtitan.models.common.attention import (  # noqa: E402
    FusedQKVLinear,
    GQAttention,
    ScaledDotProductAttention,
)
from torchtitan.models.common.rope import CosSinRoPE  # noqa: E402

_Norm = tuple[torch.Tensor | None, float | None]  # (weight, eps) of an RMSNorm
_Lin = tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias) of a Linear


def _norm(m: nn.RMSNorm) -> _Norm:
    return m.weight, m.eps


def _lin(m: nn.Linear) -> _Lin:
    return m.weight, m.bias


@dataclass
class _StepLayer:
    """One block's tensors for the decode step, looked up once per prefill rather than per token."""

    attention_norm: _Norm
    wqkv: _Lin
    # q_norm's weight repeated for each query head of a KV group, then k_norm's: [heads_per_kv + 1, head_dim]
    qk_norm: torch.Tensor | None
    qk_eps: float | None
    rope: torch.Tensor  # [max_seq_len, 2 * head_dim]: cos | sin
    wo: _Lin
    ffn_norm: _Norm
    w1: _Lin
    w2: _Lin
    w3: _Lin
    heads_per_kv: int
    head_dim: int
    scale: float | None


@dataclass
class KVCache:
    """Per-layer rotated keys and values, [rows, kv_heads, capacity, head_dim], plus the weights they
    were computed with.

    All rows share one fill level: the titan backend batches equal-length prompts and advances every
    row each step, so no per-row lengths or attention masks are needed.
    """

    capacity: int
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0
    layers: list[_StepLayer] = field(default_factory=list)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (in that order): finished rows stop costing compute, and a deduplicated
        prefill expands to the full batch."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]


class KVDecoder:
    """Prefill + one-token steps over a TorchTitan Qwen3 `Decoder` as `rlexp.models.titan` builds it
    (dense blocks, fused QKV, cos/sin RoPE, SDPA attention).

    Holds the model, not its tensors, so weight loads and the embedding re-tie after a sync need no
    notification.
    """

    def __init__(self, model: nn.Module) -> None:
        for name, layer in model.layers.items():
            attn = getattr(layer, "attention", None)
            ok = (isinstance(attn, GQAttention) and isinstance(attn.inner_attention, ScaledDotProductAttention)
                  and isinstance(attn.qkv_linear, FusedQKVLinear) and isinstance(attn.rope, CosSinRoPE))
            if not ok or getattr(layer, "moe_enabled", False):
                raise TypeError(f"layer {name}: the KV decoder supports dense GQAttention blocks with fused QKV, "
                                "cos/sin RoPE and SDPA (what rlexp.models.titan builds)")
            q_norm, k_norm = attn.q_norm, attn.k_norm
            if (q_norm is None) != (k_norm is None) or (q_norm is not None and (
                    q_norm.eps != k_norm.eps or q_norm.weight is None or k_norm.weight is None)):
                raise TypeError(f"layer {name}: q_norm and k_norm must both be present, affine, with one eps")
        self.model = model

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, capacity: int) -> tuple[torch.Tensor, KVCache]:
        """Logits after the last prompt token ([B, V]) and a cache with room for `capacity` positions.

        Identical prompts (a GRPO group repeats one `group_size` times) are run once and the cache is
        expanded afterwards, the same saving `forward_unique` gives the trainer.
        """
        max_pos = min(layer.attention.rope.cache.shape[0] for layer in self.model.layers.values())
        if not tokens.shape[1] <= capacity <= max_pos:
            raise ValueError(f"cache capacity {capacity} must be in [prompt length {tokens.shape[1]}, "
                             f"RoPE table length {max_pos}]")
        uniq, inverse = torch.unique(tokens, dim=0, return_inverse=True)
        dedup = uniq.shape[0] < tokens.shape[0]
        cache = KVCache(capacity=capacity, layers=[self._step_layer(layer) for layer in self.model.layers.values()])
        m = self.model
        h = m.tok_embeddings(uniq if dedup else tokens)
        for layer in m.layers.values():
            h = h + self._prefill_attention(layer.attention, layer.attention_norm(h), cache)
            h = h + layer.feed_forward(layer.ffn_norm(h))
        cache.length = tokens.shape[1]
        # Only the last position is sampled from: skip the [B, L, vocab] projection of the prompt.
        logits = m.lm_head(m.norm(h[:, -1:]))[:, -1]
        if dedup:
            cache.select(inverse)
            logits = logits[inverse]
        return logits, cache

    @staticmethod
    def _prefill_attention(attn: GQAttention, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """`GQAttention.forward` on the prompt, keeping the rotated keys and the values."""
        xq, xk, xv = attn.qkv_linear(x)
        if attn.q_norm is not None and attn.k_norm is not None:
            xq, xk = attn.q_norm(xq), attn.k_norm(xk)
        xq, xk = attn.rope(xq, xk, None)
        shape = (xk.shape[0], xk.shape[2], cache.capacity, xk.shape[3])
        keys, values = xk.new_empty(shape), xv.new_empty(shape)
        keys[:, :, :x.shape[1]] = xk.transpose(1, 2)
        values[:, :, :x.shape[1]] = xv.transpose(1, 2)
        cache.keys.append(keys)
        cache.values.append(values)
        out = attn.inner_attention(xq, xk, xv, scale=attn.scaling, enable_gqa=attn.enable_gqa).contiguous()
        return attn.wo(out.flatten(2))

    @staticmethod
    def _step_layer(layer: nn.Module) -> _StepLayer:
        attn = layer.attention
        qkv = attn.qkv_linear
        qk_norm = None
        if attn.q_norm is not None:
            qk_norm = torch.cat([attn.q_norm.weight.detach().expand(qkv.heads_per_kv, -1),
                                 attn.k_norm.weight.detach()[None]])
        ffn = layer.feed_forward
        return _StepLayer(
            attention_norm=_norm(layer.attention_norm), wqkv=_lin(qkv.wqkv), qk_norm=qk_norm,
            qk_eps=attn.q_norm.eps if attn.q_norm is not None else None, rope=attn.rope.cache, wo=_lin(attn.wo),
            ffn_norm=_norm(layer.ffn_norm), w1=_lin(ffn.w1), w2=_lin(ffn.w2), w3=_lin(ffn.w3),
            heads_per_kv=qkv.heads_per_kv, head_dim=qkv.head_dim, scale=attn.scaling,
        )

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed one token per row ([B]) at position `cache.length`; logits for the next position, [B, V]."""
        pos = cache.length
        if pos >= cache.capacity:
            raise ValueError(f"KV cache is full ({cache.capacity} positions)")
        m = self.model
        b = tokens.shape[0]
        h = m.tok_embeddings(tokens.unsqueeze(1))  # [B, 1, D]
        for w, keys, values in zip(cache.layers, cache.keys, cache.values):
            hpk, hd = w.heads_per_kv, w.head_dim
            x = F.rms_norm(h, h.shape[-1:], *w.attention_norm)
            # FusedQKVLinear's layout: per KV head, its `hpk` query heads, then its key, then its value.
            qkv = F.linear(x, *w.wqkv).view(b, -1, hpk + 2, hd)
            qk = qkv[:, :, :hpk + 1]
            if w.qk_norm is not None:
                qk = F.rms_norm(qk, (hd,), None, w.qk_eps) * w.qk_norm
            # CosSinRoPE's rotate-half rotation at this position, in fp32 as it computes it.
            cos, sin = w.rope[pos, :hd], w.rope[pos, hd:]
            qk32 = qk.float()
            half = torch.cat([-qk32[..., hd // 2:], qk32[..., :hd // 2]], dim=-1)
            qk = (qk32 * cos + half * sin).to(qkv.dtype)
            keys[:, :, pos] = qk[:, :, hpk]
            values[:, :, pos] = qkv[:, :, hpk + 1]
            # A KV head's query heads attend as `hpk` queries over its keys: plain SDPA, no GQA expansion,
            # and no mask (the new token may see the whole cache).
            out = F.scaled_dot_product_attention(qk[:, :, :hpk], keys[:, :, :pos + 1], values[:, :, :pos + 1],
                                                 scale=w.scale)
            h = h + F.linear(out.reshape(b, 1, -1), *w.wo)
            x = F.rms_norm(h, h.shape[-1:], *w.ffn_norm)
            h = h + F.linear(F.silu(F.linear(x, *w.w1)) * F.linear(x, *w.w3), *w.w2)
        cache.length = pos + 1
        return m.lm_head(m.norm(h))[:, -1]
