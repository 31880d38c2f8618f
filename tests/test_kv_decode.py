"""The `titan` generator's KV-cached decoding (rlexp/models/kv_decode.py, TitanBackend).

Sampling runs on cached keys/values, whose logits only approximate a full forward; the logprobs the
backend returns are recomputed with the trainer's `sequence_logprobs` and must equal it bit for bit.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlexp.config.model import ArchConfig, ModelConfig
from rlexp.models.backends import TitanBackend
from rlexp.models.kv_decode import KVDecoder
from rlexp.models.policy import load_policy, sequence_logprobs
from rlexp.models.tiny import ensure_tiny_checkpoint
from rlexp.models.tokenizer import Tokenizer, load_tokenizer

# tiny, tied embeddings, GQA (2 query heads share 1 KV head)
CFG = ModelConfig(arch=ArchConfig(max_seq_len=256, tie_embeddings=True))
MHA_UNTIED = ModelConfig(arch=ArchConfig(n_kv_heads=2, tie_embeddings=False))  # the other code paths
# Max |cached - full| on logits with std ~0.25: observed 7e-7 (fp32; a decode step sums attention over
# the cache in another order than the causal square of a full forward).
CACHED_VS_FULL_ATOL = 1e-5


@dataclass
class EosAs:
    """The char tokenizer with another end-of-sequence id, so a random model's common token ends rows."""

    base: Tokenizer
    eos_id: int

    @property
    def pad_id(self) -> int:
        return self.base.pad_id

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.base.decode(ids)


def _backend(cfg: ModelConfig, tok: Tokenizer | None = None) -> TitanBackend:
    d = ensure_tiny_checkpoint(cfg)
    return TitanBackend(cfg, str(d), tok or load_tokenizer(d))


@pytest.fixture(scope="module")
def backend() -> TitanBackend:
    return _backend(CFG)


def _prompts(seed: int, lengths: tuple[int, ...], count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 128) for _ in range(rng.choice(lengths))] for _ in range(count)]


def _greedy_uncached(model: torch.nn.Module, prompt: list[int], max_tokens: int, eos_id: int,
                     limit: int) -> list[int]:
    """Reference: a full forward over the whole prefix for every token."""
    seq, out = list(prompt), []
    with torch.no_grad():
        while len(out) < max_tokens and len(seq) < limit:
            logits = model(torch.tensor([seq]))[0, -1].float()
            t = int(torch.log_softmax(logits, -1).argmax())
            out.append(t)
            seq.append(t)
            if t == eos_id:
                break
    return out


@pytest.mark.parametrize("cfg", [CFG, MHA_UNTIED], ids=["gqa-tied", "mha-untied"])
def test_cached_logits_match_full_forward(cfg: ModelConfig) -> None:
    model = load_policy(cfg, str(ensure_tiny_checkpoint(cfg))).eval()
    dec = KVDecoder(model)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, cfg.arch.vocab_size, (6, 48), generator=g)
    x[3:] = x[:3].clone()
    x[3:, 20:] = torch.randint(3, cfg.arch.vocab_size, (3, 28), generator=g)  # same prompts, other continuations
    prompt = 12
    with torch.no_grad():
        full = model(x)
        logits, cache = dec.prefill(x[:, :prompt], capacity=x.shape[1])
        assert (logits - model(x[:, :prompt])[:, -1]).abs().max() <= CACHED_VS_FULL_ATOL
        rows = torch.arange(x.shape[0])
        worst = 0.0
        for pos in range(prompt, x.shape[1]):
            if pos == 30:  # rows finishing early leave the cache; the others must be unaffected
                rows = torch.tensor([0, 2, 5])
                cache.select(rows)
            logits = dec.step(x[rows, pos], cache)
            worst = max(worst, float((logits - full[rows, pos]).abs().max()))
    assert worst <= CACHED_VS_FULL_ATOL, worst
    assert cache.length == x.shape[1]


def test_greedy_picks_the_uncached_tokens(backend: TitanBackend) -> None:
    prompts = _prompts(1, (5, 9, 14), 7)
    comps = backend.generate(prompts, n=2, max_tokens=24, temperature=0.0, seed=0)
    limit = CFG.arch.max_seq_len
    for c in comps:
        assert c.token_ids == _greedy_uncached(backend.model, c.prompt_ids, 24, backend.tok.eos_id, limit)


def test_rows_stop_at_eos_independently(backend: TitanBackend) -> None:
    """Make a token the greedy model emits often the eos: rows end at different steps and leave the
    batch, and every row still gets exactly the tokens of the uncached loop."""
    prompts = _prompts(2, (6, 10), 8)
    free = backend.generate(prompts, n=1, max_tokens=20, temperature=0.0, seed=0)
    counts: dict[int, int] = {}
    for c in free:
        for t in set(c.token_ids):
            counts[t] = counts.get(t, 0) + 1
    eos = max(counts, key=counts.__getitem__)
    b = copy.copy(backend)  # same model and decoder, another tokenizer
    b.tok = EosAs(backend.tok, eos)
    comps = b.generate(prompts, n=1, max_tokens=20, temperature=0.0, seed=0)
    lengths = {len(c.token_ids) for c in comps}
    assert len(lengths) > 1, "want rows that end at different steps"
    for c, f in zip(comps, free):
        cut = f.token_ids.index(eos) + 1 if eos in f.token_ids else len(f.token_ids)
        assert c.token_ids == f.token_ids[:cut]
        assert c.finish_reason == ("stop" if eos in f.token_ids else "length")
        assert c.token_ids == _greedy_uncached(b.model, c.prompt_ids, 20, eos, CFG.arch.max_seq_len)


def test_stop_strings_end_a_row_at_the_first_match(backend: TitanBackend) -> None:
    prompts = _prompts(3, (7,), 6)
    free = backend.generate(prompts, n=1, max_tokens=30, temperature=0.0, seed=0)
    text = max((c.text for c in free), key=len)
    assert len(text) >= 4
    stop = text[2:4]
    comps = backend.generate(prompts, n=1, max_tokens=30, temperature=0.0, seed=0, stop=[stop])
    for c, f in zip(comps, free):
        cut = next((k for k in range(1, len(f.token_ids) + 1) if stop in backend.tok.decode(f.token_ids[:k])),
                   len(f.token_ids))
        assert c.token_ids == f.token_ids[:cut]
    assert any(len(c.token_ids) < 30 for c in comps)


def test_max_seq_len_bounds_prompt_plus_response(tmp_path: Path) -> None:
    cfg = ModelConfig(arch=ArchConfig(max_seq_len=24))
    d = ensure_tiny_checkpoint(cfg, tmp_path / "tiny24")
    b = TitanBackend(cfg, str(d), EosAs(load_tokenizer(d), -1))  # no eos: only the length limits apply
    prompts = [[5] * 20, [6] * 23, [7] * 24, [8] * 30]
    comps = b.generate(prompts, n=2, max_tokens=50, temperature=1.0, seed=0)
    assert [len(c.token_ids) for c in comps] == [4, 4, 1, 1, 0, 0, 0, 0]
    assert all(len(c.logprobs) == len(c.token_ids) for c in comps)
    assert [len(c.token_ids) for c in b.generate([[5] * 20], 1, 2, 1.0, 0)] == [2]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_returned_logprobs_are_the_trainers_bit_for_bit(backend: TitanBackend, temperature: float) -> None:
    """What the trainer computes for one micro-batch holding the call's rows (in the buffer's shuffled
    order, with its own model instance in train mode and autograd on) equals what the generator returned."""
    prompts = _prompts(4, (6, 9, 13), 6)
    comps = backend.generate(prompts, n=4, max_tokens=16, temperature=temperature, seed=7)
    assert len({len(c.token_ids) for c in comps}) > 1 or any(len(c.token_ids) > 1 for c in comps)
    trainer_model = load_policy(CFG, str(ensure_tiny_checkpoint(CFG))).train()
    order = list(range(len(comps)))
    random.Random(0).shuffle(order)
    shuffled = [comps[i] for i in order]
    lp, mask = sequence_logprobs(trainer_model, [c.prompt_ids for c in shuffled], [c.token_ids for c in shuffled],
                                 temperature, backend.tok.pad_id)
    for row, m, c in zip(lp.detach(), mask, shuffled):
        n = int(m.sum())
        assert n == len(c.logprobs)
        assert torch.equal(row[:n], torch.tensor(c.logprobs, dtype=torch.float32))


@pytest.mark.parametrize("n,temperature", [(8, 1.0), (8, 0.0), (1, 1.0)])
def test_one_token_calls_run_the_model_once(backend: TitanBackend, n: int, temperature: float) -> None:
    """max_tokens=1 (the default task): the logprob recompute's forward input is the sampling forward's,
    so the model runs once per call, and the logprobs are still the trainer's."""
    prompts = _prompts(8, (18,), 16)
    calls = []
    hook = backend.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        comps = backend.generate(prompts, n=n, max_tokens=1, temperature=temperature, seed=3)
    finally:
        hook.remove()
    assert len(calls) == 1
    trainer_model = load_policy(CFG, str(ensure_tiny_checkpoint(CFG))).train()
    lp, _ = sequence_logprobs(trainer_model, [c.prompt_ids for c in comps], [c.token_ids for c in comps],
                              temperature or 1.0, backend.tok.pad_id)
    assert lp.detach()[:, 0].tolist() == [c.logprobs[0] for c in comps]


def test_greedy_reports_unscaled_logprobs(backend: TitanBackend) -> None:
    prompts = _prompts(5, (8,), 3)
    comps = backend.generate(prompts, n=1, max_tokens=6, temperature=0.0, seed=0)
    with torch.no_grad():
        lp, _ = sequence_logprobs(backend.model, prompts, [c.token_ids for c in comps], 1.0, backend.tok.pad_id)
    for row, c in zip(lp, comps):
        assert row[:len(c.token_ids)].tolist() == c.logprobs


def test_sampling_is_reproducible_per_seed(backend: TitanBackend) -> None:
    prompts = _prompts(6, (5, 8), 4)
    a = backend.generate(prompts, n=3, max_tokens=12, temperature=1.0, seed=11)
    b = backend.generate(prompts, n=3, max_tokens=12, temperature=1.0, seed=11)
    c = backend.generate(prompts, n=3, max_tokens=12, temperature=1.0, seed=12)
    assert [(x.token_ids, x.logprobs) for x in a] == [(x.token_ids, x.logprobs) for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_weight_updates_reach_the_cached_decoder(tmp_path: Path) -> None:
    """update_weights loads in place (and re-ties the embedding): the decoder must decode the new weights."""
    from safetensors.torch import save_file

    from rlexp.models.titan import hf_state_dict

    b = _backend(CFG)
    other = load_policy(CFG, str(ensure_tiny_checkpoint(CFG)))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    (tmp_path / "v1").mkdir()
    save_file(hf_state_dict(other, CFG.arch), str(tmp_path / "v1" / "model.safetensors"))
    prompts = _prompts(7, (6,), 3)
    before = b.generate(prompts, n=1, max_tokens=10, temperature=0.0, seed=0)
    b.load_folder(1, str(tmp_path / "v1"))
    after = b.generate(prompts, n=1, max_tokens=10, temperature=0.0, seed=0)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    for c in after:
        assert c.policy_version == 1
        assert c.token_ids == _greedy_uncached(other.eval(), c.prompt_ids, 10, b.tok.eos_id, CFG.arch.max_seq_len)


def test_ignore_eos_runs_every_row_to_max_tokens(backend: TitanBackend) -> None:
    """`generator.ignore_eos`: with eos set to a token the model samples often, rows still run to
    `max_tokens` and carry that token inside; without it the same seed ends some rows early."""
    prompts = _prompts(4, (6, 10), 6)
    free = backend.generate(prompts, n=2, max_tokens=16, temperature=1.0, seed=3)
    counts: dict[int, int] = {}
    for c in free:
        for t in c.token_ids:
            counts[t] = counts.get(t, 0) + 1
    eos = max(counts, key=counts.__getitem__)
    stopping = copy.copy(backend)
    stopping.tok = EosAs(backend.tok, eos)
    ignoring = copy.copy(stopping)
    ignoring.ignore_eos = True
    short = stopping.generate(prompts, n=2, max_tokens=16, temperature=1.0, seed=3)
    full = ignoring.generate(prompts, n=2, max_tokens=16, temperature=1.0, seed=3)
    assert any(len(c.token_ids) < 16 for c in short), "want some rows that eos would end"
    assert all(len(c.token_ids) == 16 and c.finish_reason == "length" for c in full)
    assert sum(eos in c.token_ids[:-1] for c in full) > 0


class FakeCudaGenerator:
    """A named fake for `torch.Generator(device="cuda:1")`, which this CPU-only machine cannot construct: records
    the device and seed it is given, as the real one would hold them."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device, self.seed = torch.device(device), None

    def manual_seed(self, seed: int) -> FakeCudaGenerator:
        self.seed = seed
        return self


def test_the_sampling_generator_lives_on_the_probabilities_device(monkeypatch) -> None:
    from rlexp.models import backends

    cpu = backends.sampling_generator(torch.device("cpu"), 7)
    assert cpu.device == torch.device("cpu")
    assert torch.equal(torch.rand(5, generator=cpu), torch.rand(5, generator=torch.Generator().manual_seed(7)))
    monkeypatch.setattr(torch, "Generator", FakeCudaGenerator)
    cuda = backends.sampling_generator(torch.device("cuda", 1), 7)
    assert (cuda.device, cuda.seed) == (torch.device("cuda", 1), 7)


def test_the_backend_samples_with_a_generator_on_its_own_device(backend: TitanBackend, monkeypatch) -> None:
    """Every sampling path (the cached decode and the one-token forward) draws from the generator made for the
    backend's device: on CUDA that is a CUDA generator, which `torch.multinomial` needs for CUDA probabilities."""
    from rlexp.models import backends

    asked: list[torch.device] = []
    real = backends.sampling_generator

    def recording(device: torch.device, seed: int) -> torch.Generator:
        asked.append(device)
        return real(device, seed)

    monkeypatch.setattr(backends, "sampling_generator", recording)
    prompts = _prompts(3, (4, 6), 2)
    for max_tokens in (1, 3):  # one token: no cache; more: the KV-cached decode
        backend.generate(prompts, 2, max_tokens, 1.0, seed=5)
    assert asked == [backend.device, backend.device]
