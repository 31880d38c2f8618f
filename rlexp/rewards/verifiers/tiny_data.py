"""What the tiny learned verifiers (`tiny.py`) read and learn from: the verifier split of the
arithmetic task, labelled (prompt,
                response) examples, and the two tokenizers (a reward model's character tokenizer
with a chat template, a judge's byte-level BPE), with the helpers that turn text into padded
tensors.

Kept apart from the training and the cache because the measurement (`tiny_measure.py`) and the
studies read the same examples and tokenizers without training anything.
"""
from __future__ import annotations

import functools
import json
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlexp.config.environment import EnvConfig
from rlexp.envs.arithmetic import Arithmetic
from rlexp.envs.registry import build_env
from rlexp.models.tokenizer import ASSET as CHAR_TOKENIZER_ASSET
from rlexp.rewards.verifiers.lm_judge import TEMPLATES
from rlexp.types import Problem, Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
# Qwen-style ChatML. Kept in tokenizer_config.json (not chat_template.jinja) because that is where
# the public sequence-classification RMs of the Skywork-Reward-V2 generation carry it.
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
# The response mix the verifiers are trained and measured on: (correct, wrong digit, near miss,
# junk). Half correct, so accuracy 0.5 is chance and a format-only verifier ("any digit is right")
# scores 0.6.
DEFAULT_MIX: tuple[float, float, float, float] = (0.5, 0.2, 0.2, 0.1)
MIX_KINDS = ("correct", "wrong", "near", "junk")


# --------------------------------------------------------------------------------------------------
# Data: the verifier split and labelled (prompt, response) examples
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _arithmetic_env(n_terms: int, max_term: int) -> Arithmetic:
    return build_env(
        EnvConfig(name="arithmetic", options={"n_terms": n_terms, "max_term": max_term})
    )


def _env_split(
    n_terms: int, max_term: int
) -> tuple[dict[int, list[tuple[int, ...]]], list[tuple[int, ...]]]:
    """The environment's own (train-by-sum, held-out) split; called, not copied, so the two cannot
    drift."""
    train, held = _arithmetic_env(n_terms, max_term)._split()
    return {s: list(v) for s, v in train.items()}, list(held)


def verifier_split_sequences(
    n_terms: int = 9, max_term: int = 1, frac: float = 0.25
) -> list[tuple[int, ...]]:
    """The term sequences the tiny verifiers learn from: the environment's verifier split
    (`Arithmetic.verifier_sequences`), which `environment.options.verifier_frac` keeps the policy
    off."""
    return _arithmetic_env(n_terms, max_term).verifier_sequences(frac)


def held_out_sequences(n_terms: int = 9, max_term: int = 1) -> list[tuple[int, ...]]:
    """The env's held-out evaluation sequences (for measuring verifiers where the policy is
    measured)."""
    return _env_split(n_terms, max_term)[1]


@dataclass(frozen=True)
class VerifierExample:
    prompt: str  # exactly the env's prompt, e.g. "1+0+1+1+0+0+1+0+1="
    response: str
    # 1 if the env's own check accepts the response, else 0 (possibly flipped by label noise)
    label: int
    kind: str  # which part of the response mix produced it (correct | wrong | near | junk)


def _junk(rng: random.Random, s: int, text: str) -> str:
    """Non-answers a small char-level policy emits: two digits, digit plus symbol, echoes, letters,
    nothing."""
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
        return "".join(
            rng.choice(string.punctuation + string.digits) for _ in range(rng.randint(2, 4))
        )
    return ""


def _response(kind: str, s: int, rng: random.Random, text: str) -> str:
    if kind == "correct":
        return str(s)
    if kind == "wrong":
        return str(rng.choice([d for d in range(10) if d != s]))
    if kind == "near":
        return str(rng.choice([d for d in (s - 1, s + 1) if 0 <= d <= 9]))
    return _junk(rng, s, text)


def make_examples(
    seqs: list[tuple[int, ...]],
    n: int,
    seed: int,
    *,
    mix: tuple[float, ...] = DEFAULT_MIX,
    label_noise: float = 0.0,
    n_terms: int = 9,
    max_term: int = 1,
) -> list[VerifierExample]:
    """`n` labelled examples over `seqs`: uniform over sums first (as the env samples problems),
    then a response drawn from the mix, labelled by the env's `check`, then exactly
    round(label_noise * n) labels flipped."""
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


# --------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------


def build_chat_char_tokenizer() -> PreTrainedTokenizerFast:
    """The repo's character tokenizer as a real HF tokenizer, plus ChatML tokens and a chat
    template.

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
        raise ValueError(
            f"char tokenizer: {len(vocab)} tokens do not fit vocab_size {asset['vocab_size']}"
        )
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tok.decoder = decoders.Fuse()  # characters join without separators
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in [*asset["specials"], *CHAT_TOKENS]])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        model_max_length=1024,
        padding_side="right",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _judge_corpus(seed: int, n: int = 600) -> list[str]:
    """Synthetic text for the judge's BPE: judge prompts with their answers, and answers at line
    starts, so that "Yes", " Yes", "No", " No" are all frequent enough to become tokens."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n):
        t = [rng.randrange(2) for _ in range(9)]
        s = sum(t)
        resp = str(s) if i % 2 else str(rng.randrange(10))
        ans = JUDGE_ANSWERS[0] if resp == str(s) else JUDGE_ANSWERS[1]
        lines.append(JUDGE_TEMPLATE.format(prompt="+".join(map(str, t)) + "=", response=resp) + ans)
        lines.append(
            ans.strip() + ", the answer is " + ("right." if ans == JUDGE_ANSWERS[0] else "wrong.")
        )
        lines.append(ans.strip() + "\n" + ans.strip())
    return lines


def build_judge_bpe_tokenizer(seed: int, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2/Qwen style) trained on `_judge_corpus(seed)`.

    Why BPE and not characters: real judges answer with multi-character tokens and have several
    yes-like tokens ("Yes", " Yes", "yes", ...); a scorer that reads one hard-coded id works on a
    toy and fails on a real judge. Digits stay one token each (`Digits(individual_digits=True)`) so
    the judge sees the terms as the policy does. The asserted property is what the judge scorer
    relies on.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[JUDGE_EOS],
    )
    tok.train_from_iterator(_judge_corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(JUDGE_EOS, special=True, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=JUDGE_EOS, pad_token=JUDGE_EOS,
                                   model_max_length=1024, padding_side="right")
    for word in ("Yes", " Yes", "No", " No"):
        ids = fast.encode(word, add_special_tokens=False)
        if len(ids) != 1 or len(word.strip()) < 2:
            raise AssertionError(
                f"judge BPE: {word!r} must be one multi-character token, got ids {ids} "
                f"({fast.convert_ids_to_tokens(ids)}); enlarge the corpus or vocab_size"
            )
    return fast


def yes_no_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """Every vocabulary id whose decoded text, stripped and lower-cased, is "yes" (first list) or
    "no".

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


def chat_text(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> str:
    """The RM's input: the pair as a user/assistant conversation, rendered as `RewardModelVerifier`
    does."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
        tokenize=False,
    )


def pad_rows(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of right-padded rows."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def judge_rows(tok: PreTrainedTokenizerBase, prompts: list[str], responses: list[str]
               ) -> list[list[int]]:
    """The judge prompt (`JUDGE_TEMPLATE`) of each pair, tokenized."""
    return [tok.encode(JUDGE_TEMPLATE.format(prompt=p, response=r), add_special_tokens=False)
            for p, r in zip(prompts, responses)]


def last_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token logits after each (right-padded) row's last real token."""
    w = int(mask.sum(1).max())
    logits = model(input_ids=ids[:, :w], attention_mask=mask[:, :w]).logits
    last = mask[:, :w].sum(1) - 1
    return logits[torch.arange(len(ids)), last]

