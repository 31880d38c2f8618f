"""The config reference (docs/config.md), generated from the typed schema and its field comments.

A field is documented where it is declared, as in TorchTitan: the comment at the end of its line,
or the comment lines directly above it (no blank line between). This module reads those comments
with `ast` and `tokenize` while walking `TrainConfig` from the root, so the reference lists exactly
the keys composition accepts, with the defaults the schema holds. `python scripts/gen_docs.py`
rewrites docs/config.md and `rlexp config-reference` prints it;
tests/test_docs.py fails when a field has no comment or the file is stale.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
import typing
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, replace
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

REGENERATE = "python scripts/gen_docs.py"


@dataclass(frozen=True)
class FieldDoc:
    group: str  # the dotted path of the dataclass holding the field ("" for the root)
    # the full dotted key, as given on the command line (list items: `reward.verifiers[].name`)
    key: str
    type: str  # the annotation as written in the schema; an enum: its allowed values
    default: str  # the default, as the composed config shows it (interpolations as `${...}`)
    doc: str  # the field's comment, joined into one line
    source: str  # file:line of the declaration


@cache
def _class_comments(cls: type) -> tuple[dict[str, str], dict[str, str], str]:
    """Per field name of `cls`: its comment, its annotation text; and the class's file."""
    path = inspect.getsourcefile(cls)
    assert path is not None, cls
    text = Path(path).read_text()
    comments: dict[int, str] = {}
    full_line: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
            if not tok.line[: tok.start[1]].strip():
                full_line.add(tok.start[0])
    node = next(
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )
    docs: dict[str, str] = {}
    types: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        types[name] = ast.unparse(stmt.annotation)
        end = stmt.end_lineno or stmt.lineno
        trailing = [
            comments[i] for i in range(stmt.lineno, end + 1) if i in comments and i not in full_line
        ]
        above: list[str] = []
        line = stmt.lineno - 1
        while line in full_line:
            above.insert(0, comments[line])
            line -= 1
        docs[name] = " ".join(above + trailing).strip()
    return docs, types, Path(path).name


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if isinstance(value, Enum):
        return str(value.value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value.startswith("${") else repr(value)
    return repr(value)


def _nested(tp: Any) -> tuple[type | None, bool]:
    """The dataclass a field holds (directly, or as list items), and whether it is a list."""
    if dataclasses.is_dataclass(tp):
        return tp, False  # type: ignore[return-value]
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (None,)
        if dataclasses.is_dataclass(item):
            return item, True  # type: ignore[return-value]
    return None, False


def walk(cls: type | None = None, prefix: str = "") -> list[FieldDoc]:
    """Every leaf field under `cls` (default: the whole `TrainConfig`), in declaration order."""
    if cls is None:
        from rlexp.config.schema import TrainConfig

        cls = TrainConfig
    docs, types, fname = _class_comments(cls)
    hints = typing.get_type_hints(cls)
    out: list[FieldDoc] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        inner, is_list = _nested(hints[f.name])
        if inner is not None:
            out += walk(inner, f"{key}[]." if is_list else f"{key}.")
            continue
        line = _field_line(cls, f.name)
        tp = hints[f.name]
        shown = (
            " | ".join(m.value for m in tp)
            if isinstance(tp, type) and issubclass(tp, Enum)
            else types[f.name]
        )
        out.append(
            FieldDoc(
                group=prefix.rstrip("."),
                key=key,
                type=shown,
                default=_default(f),
                doc=docs[f.name],
                source=f"{fname}:{line}",
            )
        )
    return out


# Plug-in settings documented beside the schema: (group shown, key prefix, dataclass), e.g. the
# built-in job backends' `Settings` under `cluster.job_options.`
# (`rlexp.cluster.registry.job_settings`, passed in by the callers above this layer:
# `rlexp config-reference`, scripts/gen_docs.py).
Extra = Sequence[tuple[str, str, type]]


def walk_all(extra: Extra = ()) -> list[FieldDoc]:
    """The schema's fields (`walk`), then each plug-in settings dataclass of `extra` under its key
    prefix, grouped by the plug-in it belongs to."""
    out = walk()
    for group, prefix, cls in extra:
        out += [replace(d, group=group) for d in walk(cls, prefix)]
    return out


def _field_line(cls: type, name: str) -> int:
    lines, start = inspect.getsourcelines(cls)
    for i, text in enumerate(lines):
        if text.lstrip().startswith(f"{name}:"):
            return start + i
    return start


def undocumented(extra: Extra = ()) -> list[str]:
    """`key (file:line)` of every field without a comment."""
    return [f"{d.key} ({d.source})" for d in walk_all(extra) if not d.doc]


def _cell(text: str) -> str:
    """`text` for a table cell: pipes escaped, and `<` outside code spans (`<name>` is not HTML)."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p.replace("<", "&lt;") if i % 2 == 0 else p for i, p in enumerate(parts))


def render(extra: Extra = ()) -> str:
    """docs/config.md: one table per group, in the schema's order, then `extra`'s."""
    fields = walk_all(extra)
    intro = (
        f"Generated from the typed schema (`rlexp/config/`) by `{REGENERATE}`; do not edit by "
        "hand. Each key's text is the comment where its field is declared; `rlexp config-reference "
        "[KEY_OR_GROUP...]` prints the same in a terminal. Set any key on the command line "
        "(`rlexp train trainer.lr=3e-3`) or in a preset (`conf/<group>/<option>.yaml`); the groups "
        "and their options are in [configuration.md](configuration.md). `${...}` defaults follow "
        "another key."
    )
    wrapped = textwrap.fill(intro, 100, break_on_hyphens=False, break_long_words=False)
    out = ["# Config reference", "", wrapped]
    groups: dict[str, list[FieldDoc]] = {}
    for d in fields:
        groups.setdefault(d.group, []).append(d)
    for group, items in groups.items():
        out += [
            "",
            f"## {group or 'top level'}",
            "",
            "| key | type | default | what it does |",
            "|---|---|---|---|",
        ]
        out += [
            f"| `{d.key}` | {_cell(f'`{d.type}`')} | {_cell(f'`{d.default}`')} | {_cell(d.doc)} |"
            for d in items
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str], extra: Extra = ()) -> int:
    """`rlexp config-reference [KEY_OR_GROUP ...]`: the reference in the terminal, narrowed."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="rlexp config-reference",
        description="Every config key with its type, default and meaning, read from "
        "the typed schema (the same text as docs/config.md).",
    )
    ap.add_argument(
        "keys",
        nargs="*",
        metavar="KEY_OR_GROUP",
        help="show only these keys and groups (e.g. trainer, cluster.job_options, "
        "algorithm.kl_coef)",
    )
    ap.add_argument(
        "--markdown", action="store_true", help="print docs/config.md's Markdown instead"
    )
    args = ap.parse_args(argv)
    if args.markdown:
        print(render(extra), end="")
        return 0
    wanted = [k.rstrip(".") for k in args.keys]
    shown = [
        d
        for d in walk_all(extra)
        if not wanted or any(d.key == k or d.key.startswith(f"{k}.") for k in wanted)
    ]
    if not shown:
        groups = sorted({d.key.split(".")[0] for d in walk_all(extra)})
        print(
            f"rlexp config-reference: no key or group {' '.join(args.keys)!r}; groups and "
            "top-level keys: "
            f"{', '.join(groups)}",
            file=sys.stderr,
        )
        return 2
    for d in shown:
        print(f"{d.key} ({d.type}) = {d.default}")
        print(textwrap.fill(d.doc, 100, initial_indent="    ", subsequent_indent="    "))
    return 0
