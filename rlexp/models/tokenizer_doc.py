"""docs/tokenizer.md, generated from the character tokenizer's asset, so the page cannot drift from it.

The embedded tiny model's tokenizer (rlexp/assets/rlexp_char_tokenizer.json, rlexp/models/tokenizer.py) has
one id per character. A user writing an environment for the CPU default needs to know which characters those
are before a run refuses a prompt (`model.unknown_chars`, rlexp.run.prepare.check_vocabulary).
"""
from __future__ import annotations

import unicodedata
from pathlib import Path

from rlexp.models.tokenizer import ASSET, CharTokenizer

REGENERATE = "python scripts/gen_docs.py"
_SHOWN = {" ": "space", "\t": "tab (`\\t`)", "\n": "newline (`\\n`)"}


def _span(c: str) -> str:
    """`c` as a Markdown code span (a backtick needs a longer fence around it)."""
    return f"`` {c} ``" if c == "`" else f"`{c}`"


def _name(c: str) -> str:
    return _SHOWN.get(c) or f"{_span(c).replace('|', chr(92) + '|')} {unicodedata.name(c, '').lower()}"


def render(path: Path = ASSET) -> str:
    tok = CharTokenizer(path)
    rows = [f"| {tok.encode(c)[0]} | {_name(c)} |" for c in tok.chars]
    specials = ", ".join(f"`{s}` ({i})" for i, s in enumerate(tok.specials))
    used = len(tok.specials) + len(tok.chars)
    printable = "".join(c for c in tok.chars if c not in _SHOWN)
    return "\n".join([
        "# The CPU tokenizer's vocabulary",
        "",
        f"Generated from `rlexp/assets/rlexp_char_tokenizer.json` by `{REGENERATE}`; do not edit by hand",
        "(tests/test_docs.py fails when it differs from the asset).",
        "",
        "The embedded tiny model (`model=tiny`, the CPU default) reads text one character at a time with",
        "rlexp's character tokenizer (`rlexp/models/tokenizer.py`), so that the arithmetic task's answer is one",
        "token. Real models (`model=qwen3_*`) use their checkpoint's own byte-level tokenizer, which encodes",
        "any text: nothing on this page applies to them.",
        "",
        "## What it encodes",
        "",
        f"{len(tok.chars)} characters: space, the {len(printable)} visible printable ASCII characters, tab and",
        f"newline; {len(tok.specials)} special tokens, {specials}; {used} of the model's",
        f"{tok.vocab_size} ids are used (`model.arch.vocab_size`), the rest are never produced. The",
        "visible characters, in id order:",
        "",
        "```text",
        printable,
        "```",
        "",
        "## Any other character",
        "",
        "Any other character (`→`, `é`, `ü`, a non-breaking space, an emoji) would be encoded as `?`. A run",
        "does not let that happen silently: before anything spawns, `rlexp train` checks the held-out",
        "prompts and answers and a seeded sample of the training ones (`rlexp.run.prepare.check_vocabulary`)",
        "and refuses the run, naming the character, its code point and a problem that holds it. Either",
        "write the environment's text in ASCII (`->` for `→`), use a model with its own tokenizer, or set",
        "`model.unknown_chars=map` to encode each such character as `?` with one warning. What was checked",
        "is recorded in the run's manifest.",
        "",
        "## Every id",
        "",
        "| id | character |",
        "|---|---|",
        *rows,
    ]) + "\n"
