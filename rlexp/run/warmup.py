"""A short supervised warm-up of the embedded tiny policy on the task's own training split (`model.warmup`).

Why: RL from a label-free reward assumes a starting policy that already answers sensibly, as a base model
does (the Weaver write-up starts from Qwen3-Base). From random weights the policy is right on ~1% of its
samples, so a reward built from verifier agreement is fitted to telling digits from junk rather than right
from wrong (studies/weaver/results/weaver_pilot.md). A few supervised steps give a start above chance
and far from solved.

What keeps it honest: its data is `env.sample_batch` on the training split, which already excludes the
held-out problems and, with `environment.options.verifier_frac`, the verifiers' split; the checkpoint is a
pure function of (base checkpoint, training data, code, recipe) on one kind of machine
(`rlexp.models.numerics`: pinned threads and deterministic kernels; the record names the machine kind),
content-addressed like the tiny model, written atomically, and carries its own record
(`rlexp_warmup.json`), which the run's manifest copies.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rlexp.config.schema import TrainConfig
from rlexp.envs.base import Environment
from rlexp.models.numerics import machine_kind, pinned_numerics
from rlexp.models.tiny import DEFAULT_CACHE
from rlexp.models.tokenizer import load_tokenizer
from rlexp.tracking.files import fingerprint_examples, hash_files, sha256_file

RECORD = "rlexp_warmup.json"  # written last: its presence marks a complete folder
FORMAT_VERSION = 1  # bump when the recipe below changes what a given config writes


def code_version() -> dict[str, str]:
    """rlexp's version and a hash of this module, the recipe: an edited warm-up never reuses an old
    folder."""
    try:
        version = importlib.metadata.version("rlexp")
    except importlib.metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        version = "unknown"
    return {"rlexp": version, "warmup_code": sha256_file(Path(__file__))[:16]}


def warm_spec(base_dir: Path, t: TrainConfig, env: Environment) -> dict[str, Any]:
    """Everything the warmed-up weights depend on: the base checkpoint's files (weights, tokenizer),
    the training split it learns from (every prompt and answer: a task whose answers changed is a
    different warm-up, whatever its name and options), the code and the recipe."""
    train = env.train_samples()
    return {"base": hash_files(base_dir), "env": t.environment.name,
            "options": dict(t.environment.options),
            "data": fingerprint_examples([(s.id, s.problem.prompt, s.answer) for s in train]),
            "code": code_version(), "max_tokens": t.algorithm.max_tokens,
            "warmup": asdict(t.model.warmup), "format": FORMAT_VERSION}


def warm_key(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def ensure_warm_checkpoint(base_dir: Path, t: TrainConfig, env: Environment
                           ) -> tuple[Path, dict[str, Any]]:
    """The warmed-up folder for this (base, data, code, recipe), trained on first use; returns it
    and its record. Says which, with the key: a stale folder cannot pass unseen."""
    spec = warm_spec(base_dir, t, env)
    key = warm_key(spec)
    out = DEFAULT_CACHE / "warm" / key
    if (out / RECORD).exists():
        print(f"[rlexp] model.warmup: cache hit, key {key} ({out}): same base, training data "
              f"{spec['data'][:12]}, code and recipe", file=sys.stderr, flush=True)
    else:
        print(f"[rlexp] model.warmup: training {t.model.warmup.steps} steps, key {key}",
              file=sys.stderr, flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        _write(base_dir, out, t, env, spec)
    return out, json.loads((out / RECORD).read_text())


class WarmupProgress:
    """The warm-up's own progress lines on stderr (it can take minutes on a loaded CPU, before the first RL
    step): a line about every tenth of the steps, or every `every_s` seconds, with the loss and an ETA."""

    def __init__(self, steps: int, every_s: float = 10.0, stream: Any = None) -> None:
        self.steps, self.every_s, self.stream = steps, every_s, stream
        self.n, self.t0 = 0, time.perf_counter()
        self.last = self.t0

    def step(self, loss: float) -> None:
        self.n += 1
        now = time.perf_counter()
        if self.n < self.steps and self.n % max(1, self.steps // 10) and now - self.last < self.every_s:
            return
        self.last = now
        el = now - self.t0
        print(f"[rlexp] model.warmup: step {self.n}/{self.steps}, loss {loss:.3f}, {el:.1f} s, ETA "
              f"{el / self.n * (self.steps - self.n):.0f} s", file=self.stream or sys.stderr, flush=True)

    def measuring(self, n: int) -> None:
        print(f"[rlexp] model.warmup: greedy answers on {n} training problems (the record's accuracy)",
              file=self.stream or sys.stderr, flush=True)

    def done(self, losses: list[float], accuracy: float, n: int) -> None:
        loss = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, " if losses else ""
        print(f"[rlexp] model.warmup: trained {self.steps} steps in {time.perf_counter() - self.t0:.1f} s ({loss}"
              f"greedy accuracy {accuracy:.3f} on {n} training problems)", file=self.stream or sys.stderr,
              flush=True)


def _batch(env: Environment, tok: Any, n: int, rng: random.Random, max_tokens: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, labels): prompt then gold answer, loss on the answer tokens only. An answer
    shorter than `max_tokens` ends with end-of-sequence, as the policy's responses do."""
    rows, labels = [], []
    for s in env.sample_batch(n, rng):
        p = tok.encode(s.problem.prompt)
        a = tok.encode(s.answer)[:max_tokens]
        a = [*a, tok.eos_id] if len(a) < max_tokens else a
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, y) in enumerate(zip(rows, labels)):
        ids[i, :len(r)], lab[i, :len(y)], mask[i, :len(r)] = torch.tensor(r), torch.tensor(y), 1
    return ids, mask, lab


@torch.no_grad()
def _greedy_accuracy(model: Any, env: Environment, tok: Any, samples: list[Any], max_tokens: int) -> float:
    """Greedy answers on `samples` (the warm-up's own training problems: the record never looks at held-out)."""
    right = 0
    for s in samples:
        ids = tok.encode(s.problem.prompt)
        out: list[int] = []
        for _ in range(max_tokens):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt == tok.eos_id:
                break
            out.append(nxt)
        right += env.check(s, tok.decode(out)).correct
    return right / max(len(samples), 1)


def _write(base_dir: Path, out: Path, t: TrainConfig, env: Environment, spec: dict[str, Any]
           ) -> None:
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    w, max_tokens = t.model.warmup, int(t.algorithm.max_tokens)
    tok = load_tokenizer(base_dir)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".warm-"))
    try:
        # One thread and deterministic kernels (rlexp.models.numerics): torch's default thread count is the
        # machine's core count, which splits float reductions, so the same inputs could draw other weights.
        with torch.random.fork_rng(), pinned_numerics():
            torch.manual_seed(w.seed)
            rng = random.Random(w.seed)
            model = Qwen3ForCausalLM.from_pretrained(str(base_dir), torch_dtype=torch.float32)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=w.lr)
            losses = []
            progress = WarmupProgress(w.steps)
            for _ in range(w.steps):
                ids, mask, lab = _batch(env, tok, w.batch_size, rng, max_tokens)
                loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                progress.step(losses[-1])
            model.eval()
            train = env.train_samples()
            progress.measuring(min(256, len(train)))
            acc = _greedy_accuracy(model, env, tok, random.Random(w.seed + 1).sample(train, min(256, len(train))),
                                   max_tokens)
            progress.done(losses, acc, min(256, len(train)))
        for f in base_dir.iterdir():  # tokenizer, config.json, generation_config.json: unchanged
            if f.is_file() and f.name != "model.safetensors":
                shutil.copy2(f, tmp / f.name)
        sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        # Nothing keyed on the clock, the process or the path (the base folder's location once was): the
        # folder's hash, which the run manifest records as the start's sha256, names the weights.
        record = {"base_sha256": sha256_file(base_dir / "model.safetensors"),
                  "environment": t.environment.name, "options": dict(t.environment.options),
                  "data": "env.sample_batch on the training split (no held-out, no verifier-split problem)",
                  **asdict(w), "first_loss": losses[0] if losses else None,
                  "last_loss": losses[-1] if losses else None, "train_greedy_accuracy": acc,
                  "train_accuracy_n": min(256, len(train)), "key": warm_key(spec),
                  "data_sha256": spec["data"], "code": spec["code"], "numerics": machine_kind()}
        (tmp / RECORD).write_text(json.dumps(record, indent=2, default=str))
        if (out / RECORD).exists():  # another process finished first: keep its (identical) copy
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(out, ignore_errors=True)  # an incomplete folder from a killed writer
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
