"""A Hugging Face sequence-classification reward model scoring (prompt, response) pairs.

Loaded from a local folder with transformers. Downloads are never implicit: a missing folder is an error
that says where the checkpoint was expected and how to put it there, because a run that silently fetches
(or, under HF_HUB_OFFLINE=1, silently fails deep inside transformers) is not reproducible.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlexp.rewards.verifiers.base import Verifier
from rlexp.types import Problem

log = logging.getLogger(__name__)


@dataclass
class RewardModelOptions:
    path: str = ""
    # "auto": chat template when the tokenizer has one (how most public RMs were trained), else prompt+response.
    format: str = "auto"  # auto | chat | concat | pair
    batch_size: int = 16
    max_length: int = 1024
    device: str = "cpu"
    dtype: str = "float32"
    # Which logit is the score: with one label the logit itself; with two or more, `label` is the
    # "correct" class and the score is its log-odds against the rest.
    label: int = 1


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def missing_checkpoint_message(path: str) -> str:
    return (f"reward model checkpoint not found: {path!r} is not a local folder. Provide it by downloading a "
            f"sequence-classification checkpoint there, e.g. `huggingface-cli download <org>/<model> "
            f"--local-dir {path or '<dir>'}` on a machine with network, then copy the folder, or point "
            f"`options.path` at an existing folder (one with config.json, weights and tokenizer files)"
            + (" (HF_HUB_OFFLINE is set, so nothing will be downloaded)" if _offline() else ""))


class RewardModelVerifier(Verifier):
    kind = "reward_model"

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__(name)
        try:
            self.opts = RewardModelOptions(**options)
        except TypeError as e:
            raise ValueError(f"verifier {name!r}: bad reward_model options {sorted(options)}: {e}") from e
        if self.opts.format not in {"auto", "chat", "concat", "pair"}:
            raise ValueError(f"verifier {name!r}: format must be auto|chat|concat|pair, got {self.opts.format!r}")
        path = os.path.expanduser(str(self.opts.path))
        if not path or not os.path.isdir(path):
            raise FileNotFoundError(f"verifier {name!r}: " + missing_checkpoint_message(path))
        self.path = path
        self.truncated = 0  # inputs cut at max_length so far (reported in the log as they happen)
        self._load()

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        # local_files_only: the folder is the whole truth (honours HF_HUB_OFFLINE by never asking the Hub).
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        dtype = getattr(torch, self.opts.dtype)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path, local_files_only=True,
                                                                        dtype=dtype)
        self.model.to(self.opts.device).eval()
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # Sequence classifiers pool the last non-pad token; without a pad id they refuse batches > 1.
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        # Right padding is what the last-non-pad pooling assumes in every HF *ForSequenceClassification.
        self.tokenizer.padding_side = "right"
        fmt = self.opts.format
        if fmt == "auto":
            fmt = "chat" if getattr(self.tokenizer, "chat_template", None) else "concat"
        self.fmt = fmt

    def _encode(self, prompts: list[str], responses: list[str]) -> Any:
        kw = dict(padding=True, truncation=True, max_length=self.opts.max_length, return_tensors="pt")
        if self.fmt == "pair":
            return self.tokenizer(prompts, responses, **kw)
        if self.fmt == "chat":
            texts = [self.tokenizer.apply_chat_template(
                [{"role": "user", "content": p}, {"role": "assistant", "content": r}], tokenize=False)
                for p, r in zip(prompts, responses)]
        else:
            texts = [p + r for p, r in zip(prompts, responses)]
        return self.tokenizer(texts, **kw)

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        import torch

        out: list[float] = []
        bs = max(int(self.opts.batch_size), 1)
        truncated = 0
        with torch.inference_mode():
            for i in range(0, len(texts), bs):
                enc = self._encode([p.prompt for p in problems[i:i + bs]], list(texts[i:i + bs]))
                # A row that fills max_length was cut (or fits exactly): its score ignores what was cut.
                truncated += int((enc["attention_mask"].sum(dim=1) >= self.opts.max_length).sum())
                logits = self.model(**enc.to(self.opts.device)).logits.float()
                if logits.shape[-1] == 1:
                    s = logits[:, 0]
                else:
                    lp = torch.log_softmax(logits, dim=-1)
                    s = lp[:, self.opts.label] - torch.log1p(-lp[:, self.opts.label].exp().clamp(max=1 - 1e-7))
                out.extend(s.cpu().tolist())
        self.truncated += truncated
        if truncated:
            log.warning("reward model %r: %d of %d inputs reached max_length=%d and were truncated (%d so far); "
                        "raise options.max_length if answers come at the end", self.name, truncated, len(texts),
                        self.opts.max_length, self.truncated)
        return np.asarray(out, dtype=np.float64)
