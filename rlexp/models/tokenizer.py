"""Tokenizers. The embedded default uses a character tokenizer kept in the repo (rlexp/assets).

Characters, not BPE, because the tiny default must learn from random weights in minutes: one token per
digit keeps the answer a single action. It covers printable ASCII, so any benchmark prompt still
encodes (the tiny model just answers badly), which lets the whole eval path run offline.
Real models use their Hugging Face tokenizer from the checkpoint folder.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Protocol

CHAR_TOKENIZER_FILE = "rlexp_char_tokenizer.json"
ASSET = Path(__file__).resolve().parent.parent / "assets" / CHAR_TOKENIZER_FILE


class Tokenizer(Protocol):
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_texts(self) -> list[str]: ...


class CharTokenizer:
    def __init__(self, path: Path = ASSET) -> None:
        spec = json.loads(Path(path).read_text())
        self.chars: list[str] = spec["chars"]
        self.specials: list[str] = spec["specials"]
        self.pad_id = self.specials.index("<pad>")
        self.eos_id = self.specials.index("<eos>")
        self.vocab_size = int(spec["vocab_size"])
        self._offset = len(self.specials)
        self._ids = {c: i + self._offset for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> list[int]:
        # Characters outside printable ASCII become "?". A run refuses them before spawning unless
        # the config opts into it (`model.unknown_chars=map`, rlexp.run.inputs.check_vocabulary).
        unknown = self._ids["?"]
        return [self._ids.get(c, unknown) for c in text]

    def unknown(self, text: str) -> str | None:
        """The first character of `text` this vocabulary lacks (`encode` makes it "?"), or None."""
        return next((c for c in text if c not in self._ids), None)

    def decode(self, ids: list[int]) -> str:
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            j = i - self._offset
            if 0 <= j < len(self.chars):
                out.append(self.chars[j])
        return "".join(out)

    def token_texts(self) -> list[str]:
        """Each id's text on its own (specials and unused ids: empty)."""
        return [self.decode([i]) if i != self.eos_id else "" for i in range(self.vocab_size)]


class HFTokenizer:
    """Wraps a Hugging Face tokenizer found in the checkpoint folder."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.eos_id = int(self._tok.eos_token_id)
        self.pad_id = int(self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_id)
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_texts(self) -> list[str]:
        """Each id's text on its own, decoded in one batch (a fast tokenizer does it in Rust: 0.3 s over
        Qwen's 151k ids, where one call per id takes seconds)."""
        ids = [[i] for i in range(self.vocab_size)]
        backend = getattr(self._tok, "backend_tokenizer", None)
        if backend is not None:
            return backend.decode_batch(ids, skip_special_tokens=True)
        return self._tok.batch_decode(ids, skip_special_tokens=True)


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    model_dir = Path(model_dir)
    if (model_dir / CHAR_TOKENIZER_FILE).exists():
        return CharTokenizer(model_dir / CHAR_TOKENIZER_FILE)
    return HFTokenizer(model_dir)


def copy_char_tokenizer(model_dir: Path) -> None:
    shutil.copyfile(ASSET, Path(model_dir) / CHAR_TOKENIZER_FILE)


def yes_no_ids(tok: Tokenizer) -> tuple[list[int], list[int]]:
    """Every vocabulary token that reads as "yes" / "no", whatever its case and surrounding spaces (a BPE
    judge writes "Yes", " Yes" or "yes", each its own token). A vocabulary without whole-word tokens (the
    character tokenizer) falls back to the first letters, "Y"/"y" and "N"/"n"."""
    words: dict[str, list[int]] = {"yes": [], "no": [], "y": [], "n": []}
    for i, text in enumerate(tok.token_texts()):
        key = text.strip().lower()
        if key in words and i not in (tok.eos_id, tok.pad_id):
            words[key].append(i)
    if words["yes"] and words["no"]:
        return words["yes"], words["no"]
    return words["yes"] + words["y"], words["no"] + words["n"]
