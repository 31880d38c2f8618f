"""Tiny *learned* weak verifiers for the embedded arithmetic task, written as Hugging Face folders: the spec,
the training and the cache.

Why they exist: Weaver's claim is that many weak verifiers, combined without labels, approach the gold
reward. On the embedded task the rule verifiers can only check the format, so a label-free reward built
from them has nothing to learn from. Real weak verifiers are *models* (reward models, LM judges) that
read the question and the response and are right only some of the time; these stand in for them.

What makes them honest stand-ins:

* They never see or recompute the gold answer when scoring: a reward model reads the chat-formatted
  (question, response) pair, a judge reads the judge prompt; both are networks whose weights had to
  learn to count the ones. Gold labels are used only to *train* them, as for any public RM.
* They learn from a **verifier split** of the task's training sequences (`verifier_split_sequences`)
  that is disjoint from the held-out evaluation sequences, and the policy is meant to train on the
  rest (`environment.options.verifier_frac`), so no problem is shared by the verifiers' training data,
  the policy's training data and the evaluation.
* They go through the same loading paths as real checkpoints: the reward model is a
  `Qwen3ForSequenceClassification` with a tokenizer carrying a chat template in tokenizer_config.json
  (what `RewardModelVerifier` reads with `format=auto`, like a Skywork-Reward-V2 folder); the judge is
  a `Qwen3ForCausalLM` with a BPE tokenizer in which " Yes"/" No" are single multi-character tokens,
  so a scorer must read yes/no as token *sets* (`yes_no_token_ids`), as with a real judge.
* They are weak on purpose and differently so (`tiny_panels.TINY_VERIFIERS`): sizes, label noise,
  training budgets and seeds differ, so their errors are correlated but not identical.

Like `rlexp.models.tiny`, a folder is a pure function of its spec on one kind of machine
(`rlexp.models.numerics`): content-addressed under `$RLEXP_CACHE/verifiers/`, trained once (seconds on CPU)
with pinned numerics, written atomically, reused afterwards. Its record holds nothing that depends on
the clock or the path, so the folder's sha256 (what a run's manifest records) names the weights.
The data and tokenizers are in `tiny_data.py`, the measurement in `tiny_measure.py`, the panels in
`tiny_panels.py`; `python -m rlexp.rewards.verifiers.tiny_measure` trains panel A and prints its accuracies.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from rlexp.models.numerics import machine_kind, pinned_numerics
from rlexp.rewards.verifiers.tiny_data import (
    DEFAULT_MIX,
    JUDGE_ANSWERS,
    MIX_KINDS,
    VerifierExample,
    build_chat_char_tokenizer,
    build_judge_bpe_tokenizer,
    chat_text,
    judge_rows,
    last_logits,
    make_examples,
    pad_rows,
    verifier_split_sequences,
)

# Bump when anything that changes a trained folder changes (data generation, tokenizers, training loop, the
# record): it is part of the cache key, so old folders are never reused for a new recipe. 3: the record no
# longer holds the training time (it made every build's folder hash differ, issue 46) and names the machine.
FORMAT_VERSION = 3
META_FILE = "rlexp_verifier.json"  # spec + training record; written last, so its presence marks a complete folder


@dataclass(frozen=True)
class TinyVerifierSpec:
    """Everything that determines a trained verifier folder; its hash (with FORMAT_VERSION) is the cache key.

    `label_noise` flips that fraction of the training labels (an imperfect annotator); `n_examples`
    is the size of the training set drawn from the verifier split; `train_steps` AdamW steps on
    mini-batches of `batch_size`. The architecture is a Qwen3 (n_kv_heads = n_heads).
    """

    kind: Literal["reward_model", "lm_judge"] = "reward_model"
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int = 8
    hidden_dim: int = 64
    n_examples: int = 2048
    label_noise: float = 0.0
    seed: int = 0
    train_steps: int = 300
    lr: float = 3e-3
    batch_size: int = 64
    task: str = "arithmetic"
    n_terms: int = 9
    max_term: int = 1
    verifier_frac: float = 0.25
    mix: tuple[float, float, float, float] = DEFAULT_MIX
    judge_vocab_size: int = 320  # BPE vocabulary of the judge's tokenizer (lm_judge only)
    # lm_judge only. Untied by default: tied judges sat at a constant answer for 300+ steps (the " Yes"/" No"
    # embeddings are also inputs, in "Answer Yes or No."), untied ones learned in the same budget.
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("reward_model", "lm_judge"):
            raise ValueError(f"TinyVerifierSpec.kind must be 'reward_model' or 'lm_judge', got {self.kind!r}")
        if self.task != "arithmetic":
            raise ValueError(f"TinyVerifierSpec.task: only 'arithmetic' is implemented, got {self.task!r}")
        if not 0.0 <= self.label_noise < 0.5:
            raise ValueError(f"TinyVerifierSpec.label_noise must be in [0, 0.5), got {self.label_noise}")
        if len(self.mix) != 4 or min(self.mix) < 0 or sum(self.mix) <= 0:
            raise ValueError(f"TinyVerifierSpec.mix must be 4 non-negative weights {MIX_KINDS}, got {self.mix}")
        object.__setattr__(self, "mix", tuple(float(x) for x in self.mix))  # JSON round trips give lists

    def key(self) -> str:
        d = asdict(self)
        d["format_version"] = FORMAT_VERSION
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TinyVerifierSpec:
        return TinyVerifierSpec(**{k: tuple(v) if k == "mix" else v for k, v in d.items()})


# ----------------------------------------------------------------------------------------------------
# Models and training
# ----------------------------------------------------------------------------------------------------


def _qwen3_config(spec: TinyVerifierSpec, vocab_size: int, **extra: Any) -> Any:
    """Qwen3 numbers for `spec`. rope_theta is Qwen3's own 1e6: transformers 5 writes it inside
    `rope_parameters`, and a reader that looks for a top-level `rope_theta` (rlexp.models.hf's
    `model_config_from_dir`, which the Titan judge backend uses) falls back to 1e6, so any other value
    would be read differently by the two loaders (measured: judge scores off by up to 0.67)."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=vocab_size, hidden_size=spec.dim, intermediate_size=spec.hidden_dim,
                       num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                       num_key_value_heads=spec.n_heads, head_dim=spec.head_dim, max_position_embeddings=1024,
                       rope_theta=1e6, rms_norm_eps=1e-6, attention_dropout=0.0,
                       attn_implementation="eager", **extra)


def _fit(model: torch.nn.Module, n: int, spec: TinyVerifierSpec, loss_of: Any) -> list[float]:
    """AdamW on mini-batches drawn without replacement per epoch; linear warm-up, cosine decay to 10%.

    Returns the loss every 25 steps (kept in the folder's META_FILE as the training record)."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, spec.train_steps // 10)

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        p = (step - warm) / max(1, spec.train_steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    g = torch.Generator().manual_seed(spec.seed)
    order = torch.randperm(n, generator=g)
    pos, losses = 0, []
    model.train()
    for step in range(spec.train_steps):
        if pos + spec.batch_size > n:
            order, pos = torch.randperm(n, generator=g), 0
        idx = order[pos:pos + spec.batch_size]
        pos += spec.batch_size
        loss = loss_of(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == spec.train_steps - 1:
            losses.append(round(float(loss.detach()), 4))
    model.eval()
    return losses


def _train_reward_model(spec: TinyVerifierSpec, examples: list[VerifierExample], out: Path) -> list[float]:
    """Pointwise BCE on the scalar logit of a `Qwen3ForSequenceClassification`, on chat-formatted text."""
    from transformers import Qwen3ForSequenceClassification

    tok = build_chat_char_tokenizer()
    rows = [tok.encode(chat_text(tok, e.prompt, e.response), add_special_tokens=False) for e in examples]
    ids, mask = pad_rows(rows, tok.pad_token_id)
    labels = torch.tensor([float(e.label) for e in examples])
    cfg = _qwen3_config(spec, 128, num_labels=1, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                        bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed)
        model = Qwen3ForSequenceClassification(cfg)
    bce = torch.nn.BCEWithLogitsLoss()

    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        m = mask[idx]
        w = int(m.sum(1).max())
        logits = model(input_ids=ids[idx, :w], attention_mask=m[:, :w]).logits[:, 0]
        return bce(logits, labels[idx])

    losses = _fit(model, len(examples), spec, loss_of)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out), save_jinja_files=False)  # chat template inside tokenizer_config.json
    return losses



def _train_lm_judge(spec: TinyVerifierSpec, examples: list[VerifierExample], out: Path) -> list[float]:
    """Next-token cross-entropy on the answer token only (" Yes" / " No") after the judge prompt:
    supervised fine-tuning on completions, as judges are made."""
    from transformers import GenerationConfig, Qwen3ForCausalLM

    tok = build_judge_bpe_tokenizer(spec.seed, spec.judge_vocab_size)
    yes_id, no_id = (tok.encode(a, add_special_tokens=False)[0] for a in JUDGE_ANSWERS)
    ids, mask = pad_rows(judge_rows(tok, [e.prompt for e in examples], [e.response for e in examples]),
                     tok.pad_token_id)
    targets = torch.tensor([yes_id if e.label else no_id for e in examples])
    eos = tok.eos_token_id
    cfg = _qwen3_config(spec, len(tok), pad_token_id=eos, eos_token_id=eos, bos_token_id=eos,
                        tie_word_embeddings=spec.tie_embeddings)
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(cfg)
    ce = torch.nn.CrossEntropyLoss()

    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        return ce(last_logits(model, ids[idx], mask[idx]), targets[idx])

    losses = _fit(model, len(examples), spec, loss_of)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos, max_new_tokens=1)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return losses


# ----------------------------------------------------------------------------------------------------
# Cache
# ----------------------------------------------------------------------------------------------------


def verifier_cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else $RLEXP_CACHE/verifiers (read at call time), else ~/.cache/rlexp/verifiers."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("RLEXP_CACHE", Path.home() / ".cache" / "rlexp")) / "verifiers"


def tiny_verifier_dir(spec: TinyVerifierSpec, cache_dir: str | Path | None = None) -> Path:
    return verifier_cache_root(cache_dir) / f"{spec.kind}-{spec.key()}"


def train_tiny_verifier(spec: TinyVerifierSpec, out_dir: str | Path) -> Path:
    """Train `spec` into `out_dir` atomically: everything is written to a temporary sibling folder that is
    renamed into place last, so a reader never sees a half-written verifier. If another process finished
    the same folder first, its (equivalent) copy is kept."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        t0 = time.perf_counter()
        seqs = verifier_split_sequences(spec.n_terms, spec.max_term, spec.verifier_frac)
        examples = make_examples(seqs, spec.n_examples, spec.seed, mix=spec.mix,
                                 label_noise=spec.label_noise, n_terms=spec.n_terms, max_term=spec.max_term)
        train = _train_reward_model if spec.kind == "reward_model" else _train_lm_judge
        with pinned_numerics():
            losses = train(spec, examples, tmp)
        # Nothing here depends on the clock, the process or the path: the folder's hash names the weights
        # (the training time, once kept here, made every build's hash differ). `numerics` names what the
        # bits also depend on, the machine kind (rlexp.models.numerics).
        meta = {"format_version": FORMAT_VERSION, "key": spec.key(), "spec": asdict(spec), "losses": losses,
                "threshold": 0.0 if spec.kind == "reward_model" else 0.5, "numerics": machine_kind()}
        print(f"[rlexp] tiny verifier {spec.kind}-{spec.key()} trained in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        try:
            os.replace(tmp, out)  # atomic; fails if `out` is a non-empty folder
        except OSError:
            if not (out / META_FILE).exists():
                raise RuntimeError(f"{out} exists but holds no {META_FILE} (not a finished tiny verifier); "
                                   f"remove it to retrain") from None
            shutil.rmtree(tmp)  # another process finished the same spec first: keep its copy
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def ensure_tiny_verifier(spec: TinyVerifierSpec, cache_dir: str | Path | None = None) -> Path:
    """The folder of `spec`'s trained verifier, training it on first use (seconds on CPU)."""
    out = tiny_verifier_dir(spec, cache_dir)
    if not (out / META_FILE).exists():
        train_tiny_verifier(spec, out)
    return out


def read_meta(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / META_FILE).read_text())


