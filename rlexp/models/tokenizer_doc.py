"""docs/tokenizer.md, generated from the character tokenizer's asset, so the page cannot drift.

The embedded tiny model's tokenizer (rlexp/assets/rlexp_char_tokenizer.json,
rlexp/models/tokenizer.py) has one id per character. A user writing an environment for the CPU
default needs to know which characters those are before a run refuses a prompt
(`model.unknown_chars`, rlexp.run.inputs.check_vocabulary).
"""

from __future__ import annotations

import textwrap
import unicodedata
from pathlib import Path

from rlexp.models.tokenizer import ASSET, CharTokenizer

REGENERATE = "python scripts/gen_docs.py"
_SHOWN = {" ": "space", "\t": "tab (`\\t`)", "\n": "newline (`\\n`)"}

_INTRO = (
    "The embedded tiny model (`model=tiny`, the CPU default) reads text one character at a time "
    "with rlexp's character tokenizer (`rlexp/models/tokenizer.py`), so that the arithmetic task's "
    "answer is one token. Real models (`model=qwen3_*`) use their checkpoint's own byte-level "
    "tokenizer, which encodes any text: nothing on this page applies to them."
)
_OTHERS = (
    "Any other character (`→`, `é`, `ü`, a non-breaking space, an emoji) would be encoded as `?`. "
    "A run does not let that happen silently: before torch loads, `rlexp train` checks the "
    "held-out prompts and answers and a seeded sample of the training ones "
    "(`rlexp.run.inputs.check_vocabulary`) and refuses the run, naming the character, its code "
    "point and a problem that holds it. Either write the environment's text in ASCII (`->` for "
    "`→`), use a model with its own tokenizer, or set `model.unknown_chars=map` to encode each "
    "such character as `?` with one warning. What was checked is recorded in the run's manifest."
)


def _span(c: str) -> str:
    """`c` as a Markdown code span (a backtick needs a longer fence around it)."""
    return f"`` {c} ``" if c == "`" else f"`{c}`"


def _name(c: str) -> str:
    if c in _SHOWN:
        return _SHOWN[c]
    return f"{_span(c).replace('|', chr(92) + '|')} {unicodedata.name(c, '').lower()}"


def _fill(text: str) -> str:
    return textwrap.fill(text, 100, break_on_hyphens=False, break_long_words=False)


def render(path: Path = ASSET) -> str:
    tok = CharTokenizer(path)
    rows = [f"| {tok.encode(c)[0]} | {_name(c)} |" for c in tok.chars]
    specials = ", ".join(f"`{s}` ({i})" for i, s in enumerate(tok.specials))
    used = len(tok.specials) + len(tok.chars)
    printable = "".join(c for c in tok.chars if c not in _SHOWN)
    encodes = (
        f"{len(tok.chars)} characters: space, the {len(printable)} visible printable ASCII "
        f"characters, tab and newline; {len(tok.specials)} special tokens, {specials}; {used} of "
        f"the model's {tok.vocab_size} ids are used (`model.arch.vocab_size`), the rest are never "
        "produced. The visible characters, in id order:"
    )
    generated = (
        f"Generated from `rlexp/assets/rlexp_char_tokenizer.json` by `{REGENERATE}`; do not edit "
        "by hand (tests/test_docs.py fails when it differs from the asset)."
    )
    return (
        "\n".join(
            [
                "# The CPU tokenizer's vocabulary",
                "",
                _fill(generated),
                "",
                _fill(_INTRO),
                "",
                "## What it encodes",
                "",
                _fill(encodes),
                "",
                "```text",
                printable,
                "```",
                "",
                "## Any other character",
                "",
                _fill(_OTHERS),
                "",
                "## Every id",
                "",
                "| id | character |",
                "|---|---|",
                *rows,
            ]
        )
        + "\n"
    )
