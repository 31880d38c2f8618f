"""docs/DESIGN.md stays true to the code: every `rlexp.*` name it writes in backticks imports, and every file path
it mentions exists.

A name resolves when its longest importable module prefix imports and the rest is reached by getattr (a dataclass
field or annotated attribute without a class-level value counts as present). Paths are relative to the repo root.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "DESIGN.md"

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_NAME = re.compile(r"(?<![\w.])rlexp(?:\.[A-Za-z_]\w*)+")
# A repository file: at least one folder, a .py name; not part of a longer word, URL or dotted name.
_PY_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.py)\b")
# Other repository paths (folders, YAML...) when they start at a top-level folder of the repo.
_REPO_PATH = re.compile(r"(?<![\w./-])((?:rlexp|scripts|tests|docs|examples|launchers|studies|conf)/[\w./<>*-]*)")


def code_spans(text: str) -> list[str]:
    """Inline code spans plus whole fenced blocks (code there is checked too)."""
    fenced = _FENCE.findall(text)
    return _SPAN.findall(_FENCE.sub("", text)) + fenced


def dotted_names(text: str) -> list[str]:
    return sorted({m for span in code_spans(text) for m in _NAME.findall(span)})


def names_outside_code(text: str) -> list[str]:
    prose = _SPAN.sub("", _FENCE.sub("", text))
    return sorted(set(_NAME.findall(prose)))


def repo_paths(text: str) -> list[str]:
    paths = set(_PY_PATH.findall(text))
    paths |= {p.rstrip(".") for p in _REPO_PATH.findall(text)}
    return sorted(p for p in paths if p)


def _has_member(obj: Any, attr: str) -> bool:
    if hasattr(obj, attr):
        return True
    if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
        return True
    return any(attr in getattr(k, "__annotations__", {}) for k in getattr(obj, "__mro__", (obj,)))


def resolve(name: str) -> None:
    """Import the longest importable prefix of `name`, then getattr the rest; raise when something is missing."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            # Only "this prefix is not a module" moves on; a module that exists but fails to import is a real failure.
            if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
                continue
            raise
        for j, attr in enumerate(parts[i:], start=i):
            if not _has_member(obj, attr):
                raise AttributeError(f"{'.'.join(parts[:j])} has no attribute {attr!r}")
            obj = getattr(obj, attr, None)
        return
    raise ModuleNotFoundError(f"no importable prefix of {name}")


def path_exists(rel: str) -> bool:
    if "<" in rel or "*" in rel:
        pattern = re.sub(r"<[^>]*>", "*", rel).rstrip("/")
        return any(REPO.glob(pattern))
    return (REPO / rel).exists()


TEXT = DOC.read_text(encoding="utf-8")
NAMES = dotted_names(TEXT)
PATHS = repo_paths(TEXT)


def test_doc_mentions_enough_to_be_checked() -> None:
    assert len(NAMES) >= 100, NAMES
    assert any(p.endswith(".py") for p in PATHS), PATHS


def unresolved(names: list[str]) -> list[str]:
    """Every name of `names` that does not resolve, each with why: one test reports them all."""
    failures = []
    for name in names:
        try:
            resolve(name)
        except Exception as e:  # any failure to import or reach the name is a finding
            failures.append(f"{name}: {type(e).__name__}: {e}")
    return failures


def test_every_dotted_name_resolves() -> None:
    """Each of the ~400 names is checked; the message lists every one that fails."""
    failures = unresolved(NAMES)
    assert not failures, (
        f"{len(failures)} of the {len(NAMES)} rlexp names in docs/DESIGN.md do not resolve (rename "
        "them in the document or restore them in the code):\n" + "\n".join(failures))


def test_every_path_exists() -> None:
    missing = [rel for rel in PATHS if not path_exists(rel)]
    assert not missing, (
        f"docs/DESIGN.md mentions {len(missing)} paths that do not exist under {REPO}:\n"
        + "\n".join(missing))


def test_code_names_are_in_backticks() -> None:
    """A dotted rlexp name outside backticks would escape the check above."""
    assert names_outside_code(TEXT) == []


def test_checker_rejects_what_does_not_exist() -> None:
    """The checks themselves: a wrong attribute, a wrong module and a missing path all fail."""
    sample = ("see `rlexp.core.services.Service.route` and `rlexp.nowhere.thing` in rlexp/not_here.py; "
              "`rlexp.algorithm.loop.train`")
    assert dotted_names(sample) == ["rlexp.algorithm.loop.train", "rlexp.core.services.Service.route",
                                    "rlexp.nowhere.thing"]
    resolve("rlexp.algorithm.loop.train")
    resolve("rlexp.types.Problem.prompt")  # a dataclass field without a default
    with pytest.raises(AttributeError):
        resolve("rlexp.core.services.Service.route")  # endpoints live on rlexp.core.services._Endpoint
    with pytest.raises((ImportError, AttributeError)):
        resolve("rlexp.nowhere.thing")
    assert [f.split(":")[0] for f in unresolved(dotted_names(sample))] == [
        "rlexp.core.services.Service.route", "rlexp.nowhere.thing"]  # every failure, not the first
    assert repo_paths(sample) == ["rlexp/not_here.py"]
    assert not path_exists("rlexp/not_here.py")
