"""Tiny *learned* weak verifiers for the embedded arithmetic task, written as Hugging Face folders.

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
* They are weak on purpose and differently so (`TINY_VERIFIERS`): sizes, label noise,
  training budgets and seeds differ, so their errors are correlated but not identical.

Like `rlexp.models.tiny`, a folder is a pure function of its spec: content-addressed under
`$RLEXP_CACHE/verifiers/`, trained once (seconds on CPU), written atomically, reused afterwards.
`python -m rlexp.rewards.verifiers.tiny` trains the defaults and prints their measured accuracies.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import random
import shutil
import string
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from rlexp.config.environment import EnvConfig
from rlexp.envs.arithmetic import Arithmetic
from rlexp.envs.registry import build_env
from rlexp.models.tokenizer import ASSET as CHAR_TOKENIZER_ASSET
from rlexp.rewards.verifiers.lm_judge import TEMPLATES
from rlexp.rewards.verifiers.reward_model import RewardModelVerifier
from rlexp.types import Problem, Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

# Bump when anything that changes a trained folder changes (data generation, tokenizers, training loop):
# it is part of the cache key, so old folders are never reused for a new recipe.
FORMAT_VERSION = 2
META_FILE = "rlexp_verifier.json"  # spec + training record; written last, so its presence marks a complete folder
_EVAL_SEED = 7_000_003  # measure_accuracy's examples: same for every spec, so predictions can be compared

# Qwen-style ChatML. Kept in tokenizer_config.json (not chat_template.jinja) because that is where the
# public sequence-classification RMs of the Skywork-Reward-V2 generation carry it.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
JUDGE_TEMPLATE = TEMPLATES["free_form"]  # what the lm_judge verifier asks on free-form tasks
JUDGE_ANSWERS = (" Yes", " No")  # what the judge is trained to write after the judge prompt
JUDGE_EOS = "<|endoftext|>"
# The response mix the verifiers are trained and measured on: (correct, wrong digit, near miss, junk).
# Half correct, so accuracy 0.5 is chance and a format-only verifier ("any digit is right") scores 0.6.
DEFAULT_MIX: tuple[float, float, float, float] = (0.5, 0.2, 0.2, 0.1)
MIX_KINDS = ("correct", "wrong", "near", "junk")


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
# Data: the verifier split and labelled (prompt, response) examples
# ----------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _arithmetic_env(n_terms: int, max_term: int) -> Arithmetic:
    return build_env(EnvConfig(name="arithmetic", options={"n_terms": n_terms, "max_term": max_term}))


def _env_split(n_terms: int, max_term: int) -> tuple[dict[int, list[tuple[int, ...]]], list[tuple[int, ...]]]:
    """The environment's own (train-by-sum, held-out) split; called, not copied, so the two cannot drift."""
    train, held = _arithmetic_env(n_terms, max_term)._split()
    return {s: list(v) for s, v in train.items()}, list(held)


def verifier_split_sequences(n_terms: int = 9, max_term: int = 1, frac: float = 0.25) -> list[tuple[int, ...]]:
    """The term sequences the tiny verifiers learn from: the environment's verifier split
    (`Arithmetic.verifier_sequences`), which `environment.options.verifier_frac` keeps the policy off."""
    return _arithmetic_env(n_terms, max_term).verifier_sequences(frac)


def held_out_sequences(n_terms: int = 9, max_term: int = 1) -> list[tuple[int, ...]]:
    """The env's held-out evaluation sequences (for measuring verifiers where the policy is measured)."""
    return _env_split(n_terms, max_term)[1]


@dataclass(frozen=True)
class VerifierExample:
    prompt: str  # exactly the env's prompt, e.g. "1+0+1+1+0+0+1+0+1="
    response: str
    label: int  # 1 if the env's own check accepts the response, else 0 (possibly flipped by label noise)
    kind: str  # which part of the response mix produced it (correct | wrong | near | junk)


def _junk(rng: random.Random, s: int, text: str) -> str:
    """Non-answers a small char-level policy emits: two digits, digit plus symbol, echoes, letters, nothing."""
    r = rng.randrange(6)
    if r == 0:
        return f"{rng.randrange(10)}{rng.randrange(10)}"
    if r == 1:
        return f"{rng.randrange(10)}{rng.choice('+=.,')}"
    if r == 2:
        i = 2 * rng.randrange(len(text) // 2)
        return text[i:i + 3]  # a fragment of the question, e.g. "1+0"
    if r == 3:
        return "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, 4)))
    if r == 4:
        return "".join(rng.choice(string.punctuation + string.digits) for _ in range(rng.randint(2, 4)))
    return ""


def _response(kind: str, s: int, rng: random.Random, text: str) -> str:
    if kind == "correct":
        return str(s)
    if kind == "wrong":
        return str(rng.choice([d for d in range(10) if d != s]))
    if kind == "near":
        return str(rng.choice([d for d in (s - 1, s + 1) if 0 <= d <= 9]))
    return _junk(rng, s, text)


def make_examples(seqs: list[tuple[int, ...]], n: int, seed: int, *, mix: tuple[float, ...] = DEFAULT_MIX,
                  label_noise: float = 0.0, n_terms: int = 9, max_term: int = 1) -> list[VerifierExample]:
    """`n` labelled examples over `seqs`: uniform over sums first (as the env samples problems), then a
    response drawn from the mix, labelled by the env's `check`, then exactly round(label_noise * n)
    labels flipped."""
    if not seqs:
        raise ValueError("make_examples: no sequences")

    env = _arithmetic_env(n_terms, max_term)
    by_sum: dict[int, list[tuple[int, ...]]] = {}
    for t in seqs:
        by_sum.setdefault(sum(t), []).append(t)
    sums = sorted(by_sum)
    rng = random.Random(seed)
    out: list[VerifierExample] = []
    for _ in range(n):
        s = rng.choice(sums)
        t = rng.choice(by_sum[s])
        text = "+".join(map(str, t))
        kind = rng.choices(MIX_KINDS, weights=mix)[0]
        resp = _response(kind, s, rng, text)
        ok = env.check(Sample(Problem(id=text, prompt=f"{text}="), answer=str(s)), resp).correct
        out.append(VerifierExample(f"{text}=", resp, int(ok), kind))
    for i in rng.sample(range(n), round(label_noise * n)):
        e = out[i]
        out[i] = VerifierExample(e.prompt, e.response, 1 - e.label, e.kind)
    return out


# ----------------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------------


def build_chat_char_tokenizer() -> PreTrainedTokenizerFast:
    """The repo's character tokenizer as a real HF tokenizer, plus ChatML tokens and a chat template.

    Same ids as `CharTokenizer` (specials 0-2, the asset's characters after them; unknown characters
    become "?" as there), with <|im_start|>/<|im_end|> appended, so the RM reads text exactly as the
    policy writes it but through `AutoTokenizer` and `apply_chat_template`, like a public RM.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    asset = json.loads(Path(CHAR_TOKENIZER_ASSET).read_text())
    vocab: dict[str, int] = {}
    for t in [*asset["specials"], *asset["chars"], *CHAT_TOKENS]:
        vocab[t] = len(vocab)
    if len(vocab) > int(asset["vocab_size"]):
        raise ValueError(f"char tokenizer: {len(vocab)} tokens do not fit vocab_size {asset['vocab_size']}")
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tok.decoder = decoders.Fuse()  # characters join without separators
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in [*asset["specials"], *CHAT_TOKENS]])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   model_max_length=1024, padding_side="right")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _judge_corpus(seed: int, n: int = 600) -> list[str]:
    """Synthetic text for the judge's BPE: judge prompts with their answers, and answers at line starts,
    so that "Yes", " Yes", "No", " No" are all frequent enough to become tokens."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n):
        t = [rng.randrange(2) for _ in range(9)]
        s = sum(t)
        resp = str(s) if i % 2 else str(rng.randrange(10))
        ans = JUDGE_ANSWERS[0] if resp == str(s) else JUDGE_ANSWERS[1]
        lines.append(JUDGE_TEMPLATE.format(prompt="+".join(map(str, t)) + "=", response=resp) + ans)
        lines.append(ans.strip() + ", the answer is " + ("right." if ans == JUDGE_ANSWERS[0] else "wrong."))
        lines.append(ans.strip() + "\n" + ans.strip())
    return lines


def build_judge_bpe_tokenizer(seed: int, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2/Qwen style) trained on `_judge_corpus(seed)`.

    Why BPE and not characters: real judges answer with multi-character tokens and have several
    yes-like tokens ("Yes", " Yes", "yes", ...); a scorer that reads one hard-coded id works on a toy and
    fails on a real judge. Digits stay one token each (`Digits(individual_digits=True)`) so the judge
    sees the terms as the policy does. The asserted property is what the judge scorer relies on.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[JUDGE_EOS])
    tok.train_from_iterator(_judge_corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(JUDGE_EOS, special=True, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=JUDGE_EOS, pad_token=JUDGE_EOS,
                                   model_max_length=1024, padding_side="right")
    for word in ("Yes", " Yes", "No", " No"):
        ids = fast.encode(word, add_special_tokens=False)
        if len(ids) != 1 or len(word.strip()) < 2:
            raise AssertionError(f"judge BPE: {word!r} must be one multi-character token, got ids {ids} "
                                 f"({fast.convert_ids_to_tokens(ids)}); enlarge the corpus or vocab_size")
    return fast


def yes_no_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """Every vocabulary id whose decoded text, stripped and lower-cased, is "yes" (first list) or "no".

    A judge's verdict is spread over all of them (" Yes", "Yes", "yes", ...); the judge score is
    P(yes-like) / (P(yes-like) + P(no-like)) at the next position. Decoding (not the raw vocabulary
    string) is what makes byte-level entries such as "ĠYes" count.
    """
    ids = [[i] for i in range(len(tokenizer))]
    # A fast tokenizer decodes in Rust: 0.3 s instead of 2.4 s over Qwen's 151k-token vocabulary.
    backend = getattr(tokenizer, "backend_tokenizer", None)
    texts = (backend.decode_batch(ids, skip_special_tokens=False) if backend is not None
             else tokenizer.batch_decode(ids, skip_special_tokens=False))
    yes = [i for i, t in enumerate(texts) if t.strip().lower() == "yes"]
    no = [i for i, t in enumerate(texts) if t.strip().lower() == "no"]
    return yes, no


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


def chat_text(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> str:
    """The RM's input: the pair as a user/assistant conversation, rendered as `RewardModelVerifier` does."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                          {"role": "assistant", "content": response}], tokenize=False)


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run tiny-model work on one intra-op thread, then restore the caller's setting.

    Why: these models are so small that OpenMP's thread hand-offs dominate; on a shared 2-core machine
    two spinning threads made a training step 2-20x slower (measured: 75-100 ms on one thread, 0.2-2.3 s
    on two). One thread
    also makes training bitwise reproducible whatever the machine's core count, which the cache relies
    on (a spec names one set of weights).
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


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
    ids, mask = _pad(rows, tok.pad_token_id)
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


def _judge_rows(tok: PreTrainedTokenizerBase, prompts: list[str], responses: list[str]) -> list[list[int]]:
    return [tok.encode(JUDGE_TEMPLATE.format(prompt=p, response=r), add_special_tokens=False)
            for p, r in zip(prompts, responses)]


def _last_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token logits after each (right-padded) row's last real token."""
    w = int(mask.sum(1).max())
    logits = model(input_ids=ids[:, :w], attention_mask=mask[:, :w]).logits
    last = mask[:, :w].sum(1) - 1
    return logits[torch.arange(len(ids)), last]


def _train_lm_judge(spec: TinyVerifierSpec, examples: list[VerifierExample], out: Path) -> list[float]:
    """Next-token cross-entropy on the answer token only (" Yes" / " No") after the judge prompt:
    supervised fine-tuning on completions, as judges are made."""
    from transformers import GenerationConfig, Qwen3ForCausalLM

    tok = build_judge_bpe_tokenizer(spec.seed, spec.judge_vocab_size)
    yes_id, no_id = (tok.encode(a, add_special_tokens=False)[0] for a in JUDGE_ANSWERS)
    ids, mask = _pad(_judge_rows(tok, [e.prompt for e in examples], [e.response for e in examples]),
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
        return ce(_last_logits(model, ids[idx], mask[idx]), targets[idx])

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
        examples = make_examples(seqs, spec.n_examples, spec.seed, mix=spec.mix, label_noise=spec.label_noise,
                                 n_terms=spec.n_terms, max_term=spec.max_term)
        train = _train_reward_model if spec.kind == "reward_model" else _train_lm_judge
        with one_torch_thread():
            losses = train(spec, examples, tmp)
        meta = {"format_version": FORMAT_VERSION, "key": spec.key(), "spec": asdict(spec),
                "train_seconds": round(time.perf_counter() - t0, 2), "losses": losses,
                "threshold": 0.0 if spec.kind == "reward_model" else 0.5,
                "torch": torch.__version__}
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


# ----------------------------------------------------------------------------------------------------
# Scoring and measurement
# ----------------------------------------------------------------------------------------------------


class TinyJudge:
    """A tiny judge folder as a function: judge prompts in, P(yes-like) / P(yes- or no-like) out.

    Reads yes/no as token sets (`yes_no_token_ids`), which is what a real judge's scorer must do.
    """

    def __init__(self, path: str | Path, batch_size: int = 64) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()
        self.yes, self.no = yes_no_token_ids(self.tokenizer)
        self.batch_size = batch_size

    def __call__(self, judge_prompts: list[str]) -> list[float]:
        out: list[float] = []
        pad = self.tokenizer.pad_token_id
        with torch.inference_mode():
            for i in range(0, len(judge_prompts), self.batch_size):
                rows = [self.tokenizer.encode(p, add_special_tokens=False)
                        for p in judge_prompts[i:i + self.batch_size]]
                ids, mask = _pad(rows, pad)
                p = torch.softmax(_last_logits(self.model, ids, mask).float(), dim=-1)
                y, n = p[:, self.yes].sum(-1), p[:, self.no].sum(-1)
                out.extend((y / (y + n).clamp_min(1e-12)).tolist())
        return out


def score_examples(path: str | Path, examples: list[VerifierExample]) -> np.ndarray:
    """Scores through the path a run uses: `RewardModelVerifier` (format=auto, so the chat template from
    the folder) for a reward model; for a judge, `TinyJudge` on the judge template (`JUDGE_TEMPLATE`,
    the lm_judge verifier's free-form template) rendered from the env's prompt and the response."""
    kind = read_meta(path)["spec"]["kind"]
    texts = [e.response for e in examples]
    if kind == "reward_model":

        v = RewardModelVerifier("tiny_rm", {"path": str(path), "format": "auto", "batch_size": 256})
        return v.score([Problem(id=e.prompt, prompt=e.prompt) for e in examples], texts)
    judge = TinyJudge(path, batch_size=256)
    return np.asarray(judge([JUDGE_TEMPLATE.format(prompt=e.prompt, response=t) for e, t in zip(examples, texts)]),
                      dtype=np.float64)


def predict(path: str | Path, examples: list[VerifierExample]) -> np.ndarray:
    """Hard verdicts at the natural threshold stored in the folder: RM logit > 0 (BCE was trained on
    roughly balanced labels, and symmetric label noise leaves the Bayes threshold at 0, so no threshold
    is tuned on data), judge P(yes) > 0.5."""
    return score_examples(path, examples) > float(read_meta(path)["threshold"])


def evaluation_examples(spec: TinyVerifierSpec, split: str, n: int = 1000,
                        seed: int = _EVAL_SEED) -> list[VerifierExample]:
    """Noise-free examples on `split` ("verifier" or "held_out"); independent of `spec.seed`, so every
    verifier of the same task is measured on the same examples and their verdicts can be compared."""
    if split == "verifier":
        seqs = verifier_split_sequences(spec.n_terms, spec.max_term, spec.verifier_frac)
    elif split == "held_out":
        seqs = held_out_sequences(spec.n_terms, spec.max_term)
    else:
        raise ValueError(f"evaluation_examples: split must be 'verifier' or 'held_out', got {split!r}")
    return make_examples(seqs, n, seed + (split == "held_out"), mix=spec.mix, n_terms=spec.n_terms,
                         max_term=spec.max_term)


def _accuracy(pred: np.ndarray, ex: list[VerifierExample]) -> dict[str, float]:
    y = np.array([e.label for e in ex], dtype=bool)
    both = y.any() and (~y).any()
    out = {"acc": float((pred == y).mean()),
           "balanced_acc": float(0.5 * (pred[y].mean() + (~pred[~y]).mean())) if both else float("nan")}
    kinds = np.array([e.kind for e in ex])
    for k in MIX_KINDS:
        if (kinds == k).any():
            out[f"acc_{k}"] = float((pred[kinds == k] == y[kinds == k]).mean())
    return out


def measure_accuracy(path: str | Path, spec: TinyVerifierSpec, n: int = 1000) -> dict[str, float]:
    """Accuracy on fresh noise-free examples from the verifier split (which the verifier trained on, so
    close to training accuracy) and from the held-out split (what matters), at the natural threshold
    (see `predict`). Keys: verifier_acc, held_out_acc, held_out_balanced_acc and held_out_acc_<kind>
    per response kind; the response mix is `spec.mix` (half correct: 0.5 is chance)."""
    out: dict[str, float] = {}
    for split in ("verifier", "held_out"):
        ex = evaluation_examples(spec, split, n)
        with one_torch_thread():
            pred = predict(path, ex)
        for k, v in _accuracy(pred, ex).items():
            if split == "verifier" and k != "acc":
                continue
            out[f"{split}_{k}"] = v
    return out


# ----------------------------------------------------------------------------------------------------
# The default panel
# ----------------------------------------------------------------------------------------------------

# Four reward models and two judges, weak in different ways: too little signal to learn to count (heavy
# label noise), over-fitting a small training set, or stopped part-way through learning to count. Training
# curves are steep (a plateau near 0.65-0.7, where a model rejects junk and some far-off digits, then a jump
# to ~0.95 once it counts), so the budgets are tuned, and each number is a property of the exact spec on
# this software stack (torch 2.13 CPU, transformers 5.19; training is bitwise reproducible there).
# Measured held-out accuracy on the default mix (1000 examples; chance 0.5, format-only 0.6):
# rm_small 0.855, rm_noisy 0.650, rm_overfit 0.794, rm_large 0.711, judge_small 0.747, judge_medium 0.708;
# pairwise agreement of their verdicts 0.55-0.77. `python -m rlexp.rewards.verifiers.tiny` re-measures.
TINY_VERIFIERS: dict[str, TinyVerifierSpec] = {
    "rm_small": TinyVerifierSpec(kind="reward_model", dim=12, n_layers=1, n_heads=2, head_dim=6, hidden_dim=24,
                                 n_examples=512, label_noise=0.1, seed=10, train_steps=300, lr=5e-3),
    "rm_noisy": TinyVerifierSpec(kind="reward_model", dim=16, n_layers=1, n_heads=2, head_dim=8, hidden_dim=32,
                                 n_examples=2048, label_noise=0.3, seed=3, train_steps=300, lr=3e-3),
    "rm_overfit": TinyVerifierSpec(kind="reward_model", dim=24, n_layers=2, n_heads=3, head_dim=8, hidden_dim=48,
                                   n_examples=512, label_noise=0.15, seed=4, train_steps=250, lr=3e-3),
    "rm_large": TinyVerifierSpec(kind="reward_model", dim=24, n_layers=2, n_heads=3, head_dim=8, hidden_dim=48,
                                 n_examples=768, label_noise=0.1, seed=8, train_steps=260, lr=3e-3),
    "judge_small": TinyVerifierSpec(kind="lm_judge", dim=16, n_layers=1, n_heads=2, head_dim=8, hidden_dim=32,
                                    n_examples=2048, label_noise=0.05, seed=5, train_steps=400, lr=5e-3),
    "judge_medium": TinyVerifierSpec(kind="lm_judge", dim=16, n_layers=2, n_heads=2, head_dim=8, hidden_dim=32,
                                     n_examples=2048, label_noise=0.1, seed=6, train_steps=330, lr=3e-3),
}

# Two more panels, trained independently of the first (other seeds, so other examples from the verifier split;
# other response mixes; other shapes), for issue 23 item 4: a result that holds on one panel only could be a
# property of that panel. Panel B's mix is heavy in near misses (a policy's usual errors), panel C's in far-off
# digits. Their strengths were not tuned: studies/weaver/weaver_panels.py measures what they turned out to be on the
# starting policy's outputs (studies/weaver/results/weaver_panels.md). In each panel the first
# reward model listed is `single_rm`.
_MIX_B = (0.45, 0.1, 0.4, 0.05)
_MIX_C = (0.5, 0.25, 0.2, 0.05)
PANEL_B: dict[str, TinyVerifierSpec] = {
    "b_rm_mid": TinyVerifierSpec(kind="reward_model", dim=24, n_layers=2, n_heads=3, head_dim=8, hidden_dim=48,
                                 n_examples=1024, label_noise=0.15, seed=22, train_steps=300, mix=_MIX_B),
    "b_rm_wide": TinyVerifierSpec(kind="reward_model", dim=32, n_layers=1, n_heads=4, head_dim=8, hidden_dim=64,
                                  n_examples=2048, label_noise=0.05, seed=21, train_steps=400, mix=_MIX_B),
    "b_rm_weak": TinyVerifierSpec(kind="reward_model", dim=12, n_layers=1, n_heads=2, head_dim=6, hidden_dim=24,
                                  n_examples=256, label_noise=0.25, seed=23, train_steps=150, mix=_MIX_B),
    "b_rm_deep": TinyVerifierSpec(kind="reward_model", dim=16, n_layers=3, n_heads=2, head_dim=8, hidden_dim=32,
                                  n_examples=2048, label_noise=0.1, seed=24, train_steps=350, mix=_MIX_B),
    "b_judge_a": TinyVerifierSpec(kind="lm_judge", dim=16, n_layers=1, n_heads=2, head_dim=8, hidden_dim=32,
                                  n_examples=2048, label_noise=0.05, seed=25, train_steps=400, lr=5e-3, mix=_MIX_B),
    "b_judge_b": TinyVerifierSpec(kind="lm_judge", dim=24, n_layers=2, n_heads=3, head_dim=8, hidden_dim=48,
                                  n_examples=1024, label_noise=0.2, seed=26, train_steps=300, mix=_MIX_B),
}
PANEL_C: dict[str, TinyVerifierSpec] = {
    "c_rm_a": TinyVerifierSpec(kind="reward_model", dim=32, n_layers=2, n_heads=4, head_dim=8, hidden_dim=96,
                               n_examples=1536, label_noise=0.1, seed=31, train_steps=350, mix=_MIX_C),
    "c_rm_b": TinyVerifierSpec(kind="reward_model", dim=20, n_layers=1, n_heads=2, head_dim=10, hidden_dim=40,
                               n_examples=768, label_noise=0.2, seed=32, train_steps=250, mix=_MIX_C),
    "c_rm_c": TinyVerifierSpec(kind="reward_model", dim=28, n_layers=2, n_heads=4, head_dim=8, hidden_dim=56,
                               n_examples=2048, label_noise=0.35, seed=33, train_steps=300, mix=_MIX_C),
    "c_rm_d": TinyVerifierSpec(kind="reward_model", dim=16, n_layers=2, n_heads=2, head_dim=8, hidden_dim=32,
                               n_examples=512, label_noise=0.05, seed=34, train_steps=200, mix=_MIX_C),
    "c_judge_a": TinyVerifierSpec(kind="lm_judge", dim=20, n_layers=2, n_heads=2, head_dim=10, hidden_dim=40,
                                  n_examples=2048, label_noise=0.1, seed=35, train_steps=380, mix=_MIX_C),
    "c_judge_b": TinyVerifierSpec(kind="lm_judge", dim=12, n_layers=1, n_heads=2, head_dim=6, hidden_dim=24,
                                  n_examples=1024, label_noise=0.15, seed=36, train_steps=300, lr=5e-3, mix=_MIX_C),
}
# Panel D (issue 23 item 4): panels B and C have no strong verifier on the policy's own outputs, whose wrong
# answers are mostly near misses (studies/weaver/results/weaver_panels.md). D was screened on the
# starting policy's samples for the
# spread a real panel has: one reward model that counts (AUC ~0.9), an LM judge trained on responses shaped like the
# policy's (correct 0.35, near 0.42, other digits 0.15, junk 0.08) that partly counts, a reward model and a judge
# that mostly reject far-off digits and junk, and two small or noisy reward models near chance. Each is trained on
# its own data (seed) and mix. d_rm_b was swapped in (for a near-chance model) so that three verifiers pass the
# shared filters on the starting policy's pool: with two, the label model is not fit and weaver_paper is the mean.
# Fixed before any RL run on it; studies/weaver/results/weaver_panels_d.md and
# studies/weaver/results/weaver_label_model_d.md measure it.
_MIX_D = (0.35, 0.15, 0.42, 0.08)
PANEL_D: dict[str, TinyVerifierSpec] = {
    "d_rm_a": TinyVerifierSpec(kind="reward_model", dim=16, n_layers=2, n_heads=2, head_dim=8, hidden_dim=32,
                               n_examples=1024, label_noise=0.1, seed=52, train_steps=250, mix=(0.5, 0.25, 0.2, 0.05)),
    "d_rm_b": TinyVerifierSpec(kind="reward_model", dim=24, n_layers=2, n_heads=3, head_dim=8, hidden_dim=48,
                               n_examples=768, label_noise=0.1, seed=55, train_steps=200, mix=DEFAULT_MIX),
    "d_rm_c": TinyVerifierSpec(kind="reward_model", dim=16, n_layers=1, n_heads=2, head_dim=8, hidden_dim=32,
                               n_examples=1024, label_noise=0.15, seed=53, train_steps=200, mix=(0.5, 0.3, 0.0, 0.2)),
    "d_rm_d": TinyVerifierSpec(kind="reward_model", dim=12, n_layers=1, n_heads=2, head_dim=6, hidden_dim=24,
                               n_examples=512, label_noise=0.25, seed=44, train_steps=500, lr=5e-3, mix=_MIX_D),
    "d_judge_a": TinyVerifierSpec(kind="lm_judge", dim=24, n_layers=2, n_heads=3, head_dim=8, hidden_dim=48,
                                  n_examples=4096, label_noise=0.05, seed=45, train_steps=1200, lr=5e-3, mix=_MIX_D),
    "d_judge_b": TinyVerifierSpec(kind="lm_judge", dim=16, n_layers=2, n_heads=2, head_dim=8, hidden_dim=32,
                                  n_examples=2048, label_noise=0.1, seed=54, train_steps=330),
}
# Panel E (issue 23 item 4 asks for three panels spanning strong to near-chance on the policy's outputs; A and D do):
# its own seeds, shapes and mixes, none of them D's. A deeper reward model trained on near-miss-heavy data that
# should count, a wide one-layer reward model and two judges in the middle, a small noisy reward model and one that
# never saw a near miss near chance. Screened on the starting policy's samples before any RL run on it
# (studies/weaver/results/weaver_panels_e.md); pre-registered in studies/weaver/preregistration.md, addendum v9.
_MIX_E = (0.4, 0.2, 0.3, 0.1)
PANEL_E: dict[str, TinyVerifierSpec] = {
    "e_rm_a": TinyVerifierSpec(kind="reward_model", dim=20, n_layers=3, n_heads=2, head_dim=10, hidden_dim=40,
                               n_examples=1536, label_noise=0.05, seed=61, train_steps=700,
                               mix=(0.45, 0.2, 0.3, 0.05)),
    "e_rm_b": TinyVerifierSpec(kind="reward_model", dim=32, n_layers=1, n_heads=4, head_dim=8, hidden_dim=64,
                               n_examples=1024, label_noise=0.1, seed=63, train_steps=500, mix=_MIX_E),
    "e_rm_c": TinyVerifierSpec(kind="reward_model", dim=12, n_layers=1, n_heads=2, head_dim=6, hidden_dim=24,
                               n_examples=384, label_noise=0.3, seed=65, train_steps=150, mix=_MIX_E),
    "e_rm_d": TinyVerifierSpec(kind="reward_model", dim=16, n_layers=2, n_heads=2, head_dim=8, hidden_dim=32,
                               n_examples=512, label_noise=0.2, seed=66, train_steps=120, mix=(0.5, 0.3, 0.0, 0.2)),
    "e_judge_a": TinyVerifierSpec(kind="lm_judge", dim=24, n_layers=2, n_heads=3, head_dim=8, hidden_dim=48,
                                  n_examples=3072, label_noise=0.1, seed=62, train_steps=1000, lr=5e-3, mix=_MIX_E),
    "e_judge_b": TinyVerifierSpec(kind="lm_judge", dim=16, n_layers=1, n_heads=2, head_dim=8, hidden_dim=32,
                                  n_examples=1024, label_noise=0.15, seed=64, train_steps=300, mix=_MIX_E),
}
# Panel W (issue 46 item 4, addendum v14): the paper's regime, many verifiers of uneven quality, some correlated.
# A, D and E's model verifiers together (verifier_set=arithmetic_wide), plus near-duplicates: four of them
# retrained from another seed (same data recipe, architecture and label noise), so their errors correlate.
PANEL_W: dict[str, TinyVerifierSpec] = {
    f"{name}_twin": replace(spec, seed=spec.seed + 1000)
    for name, spec in (("rm_large", TINY_VERIFIERS["rm_large"]), ("judge_small", TINY_VERIFIERS["judge_small"]),
                       ("d_rm_a", PANEL_D["d_rm_a"]), ("e_rm_a", PANEL_E["e_rm_a"]))
}
PANELS: dict[str, dict[str, TinyVerifierSpec]] = {"A": dict(TINY_VERIFIERS), "B": PANEL_B, "C": PANEL_C,
                                                   "D": PANEL_D, "E": PANEL_E, "W": PANEL_W}
# The verifier set (rlexp/conf/verifier_set/) that wires each panel (W's twins only ever join A, D and E's).
PANEL_SETS: dict[str, str] = {"A": "arithmetic", "B": "arithmetic_b", "C": "arithmetic_c", "D": "arithmetic_d",
                              "E": "arithmetic_e"}
WIDE_SET, WIDE_PANELS = "arithmetic_wide", ("A", "D", "E", "W")
for _panel in (PANEL_B, PANEL_C, PANEL_D, PANEL_E, PANEL_W):
    TINY_VERIFIERS.update(_panel)


def smallest_spec(specs: dict[str, TinyVerifierSpec] | None = None, kind: str = "reward_model") -> TinyVerifierSpec:
    """The cheapest spec of `kind` in a panel (by parameters x steps): what the tests round-trip."""
    specs = PANELS["A"] if specs is None else specs
    cands = [s for s in specs.values() if s.kind == kind]
    return min(cands, key=lambda s: (s.n_layers * s.dim * (s.hidden_dim + 4 * s.n_heads * s.head_dim)) * s.train_steps)


def panel_report(specs: dict[str, TinyVerifierSpec] | None = None, n: int = 1000,
                 cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Train (or reuse) every spec, measure it, and compute pairwise agreement of held-out verdicts."""
    specs = PANELS["A"] if specs is None else specs
    rows: dict[str, dict[str, Any]] = {}
    verdicts: dict[str, np.ndarray] = {}
    for name, spec in specs.items():
        path = ensure_tiny_verifier(spec, cache_dir)
        rows[name] = {"train_seconds": read_meta(path)["train_seconds"], **measure_accuracy(path, spec, n)}
        with one_torch_thread():
            verdicts[name] = predict(path, evaluation_examples(spec, "held_out", n))
    names = list(specs)
    agreement = {a: {b: float((verdicts[a] == verdicts[b]).mean()) for b in names} for a in names}
    return {"rows": rows, "agreement": agreement}


def _main() -> None:
    rep = panel_report()
    cols = ["train_seconds", "verifier_acc", "held_out_acc", "held_out_balanced_acc",
            *[f"held_out_acc_{k}" for k in MIX_KINDS]]
    print("name".ljust(14) + "".join(c.removeprefix("held_out_").ljust(14) for c in cols))
    for name, row in rep["rows"].items():
        print(name.ljust(14) + "".join(f"{row.get(c, float('nan')):<14.3f}" for c in cols))
    names = list(rep["rows"])
    print("\nheld-out agreement\n" + " " * 14 + "".join(n.ljust(14) for n in names))
    for a in names:
        print(a.ljust(14) + "".join(f"{rep['agreement'][a][b]:<14.3f}" for b in names))


if __name__ == "__main__":
    _main()
