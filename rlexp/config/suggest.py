"""Close matches for what a user mistyped: a config key, a group option, a class path. Pure look-ups
over the typed schema, the config folders and the files on the module path: nothing here imports or
runs user code (a class path is judged by finding its module's file and reading its top-level names
with `ast`), so a suggestion costs milliseconds and is safe to make for any input.

Also the one list of overrides rlexp adds to a command line itself (`INTERNAL_KEYS`): they are never
shown to a user, in a message or in a command suggested to them."""
from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlexp.config.overrides import _schema, _unwrap, moved_key, schema_path_error
from rlexp.config.schema import TrainConfig

# Overrides rlexp derives from what the user typed (`config_path=DIR` ->
# `hydra.searchpath=[file://DIR]`): the user's own key is what they see and what a suggested command
# repeats.
INTERNAL_KEYS = ("hydra.searchpath",)
_CLASS_PATH = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*):([A-Za-z_][\w.]*)$")


def user_args(argv: Iterable[str]) -> list[str]:
    """`argv` without the overrides rlexp added itself (`INTERNAL_KEYS`)."""
    return [a for a in argv if a.split("=", 1)[0].lstrip("+~") not in INTERNAL_KEYS]


def close(word: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    return difflib.get_close_matches(word, sorted(set(choices)), n=n, cutoff=cutoff)


def did_you_mean(matches: Sequence[str]) -> str:
    """'; did you mean a or b?' (empty without matches): the tail of a message."""
    return f"; did you mean {' or '.join(matches)}?" if matches else ""


@functools.cache
def schema_keys(root: type = TrainConfig) -> tuple[str, ...]:
    """Every dotted key of the schema, nodes and leaves (free-form dicts and lists are not
    entered)."""
    out: list[str] = []

    def walk(tp: Any, prefix: str) -> None:
        tp = _unwrap(tp)
        if not dataclasses.is_dataclass(tp):
            return
        for name, hint in _schema(tp)[1].items():
            if name not in _schema(tp)[0]:
                continue
            key = f"{prefix}{name}"
            out.append(key)
            walk(hint, f"{key}.")

    walk(root, "")
    return tuple(out)


def nearest_keys(key: str, extra: Iterable[str] = ()) -> list[str]:
    """Keys of the schema (and `extra`: group names) close to the mistyped `key`: a sibling spelt
    alike (`trainer.lrr` -> `trainer.lr`), a key of the same name elsewhere (`algorithm.lr` ->
    `trainer.lr`), or a whole path spelt alike."""
    keys = [*schema_keys(), *extra]
    parent, _, leaf = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    found = [f"{parent}.{s}" if parent else s for s in close(leaf, siblings)]
    if not found:  # the same name under another parent: `algorithm.lr` -> `trainer.lr`
        same = [k for k in keys if k.rpartition(".")[2] == leaf and k != key]
        found = sorted(same, key=lambda k: -difflib.SequenceMatcher(None, key, k).ratio())
    return (found or close(key, keys))[:3]


def unknown_key(key: str, extra: Iterable[str] = ()) -> str | None:
    """None when `key` is a key of the schema (or lies inside a free-form dict); else the
    message."""
    why = schema_path_error(key.split("."))
    if why is None:
        return None
    if (moved := moved_key(key.lstrip("+~"))) is not None:
        return moved
    return (
        f"unknown key {key}{did_you_mean(nearest_keys(key, extra))} ({why}; `rlexp train --cfg "
        "job` prints every key)"
    )


def group_options(group: str, conf_dirs: Sequence[Path]) -> list[str]:
    return sorted({p.stem for d in conf_dirs for p in (Path(d) / group).glob("*.yaml")})


def unknown_option(group: str, value: str, conf_dirs: Sequence[Path]) -> str | None:
    """None when `group=value` names a config file; else the message with the close matches and the
    choices."""
    if any((Path(d) / group / f"{value}.yaml").is_file() for d in conf_dirs):
        return None
    options = group_options(group, conf_dirs)
    return (
        f"{group}={value}: no such "
        f"option{did_you_mean([f'{group}={o}' for o in close(value, options)])} (the options "
        f"of {group}: {', '.join(options) or 'none'}; a file of your own goes in <your config "
        f"folder>/{group}/{value}.yaml, given with config_path=<your config folder>)"
    )


def option_naming(group: str, name: str, conf_dirs: Sequence[Path]) -> str | None:
    """The option of `group` a user types for what the config calls `name`: `count_a` for a plug-in
    environment named by class path (`environment.name: mytask.tasks:CountA` in `count_a.yaml`).
    `name` itself when a file of that name exists; None when no file names it. YAML is read,
    nothing is run."""
    import yaml

    if any((Path(d) / group / f"{name}.yaml").is_file() for d in conf_dirs):
        return name
    for d in conf_dirs:
        for p in sorted((Path(d) / group).glob("*.yaml")):
            try:
                data = yaml.safe_load(p.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError, UnicodeDecodeError):
                continue
            # `# @package _global_` (`environment: {name: ...}`) or the group's own package
            node = data.get(group, data) if isinstance(data, dict) else None
            if isinstance(node, dict) and node.get("name") == name:
                return p.stem
    return None


def unknown_options_key(prefix: str, given: Iterable[str], known: Sequence[str],
                        owner: str) -> str | None:
    """A free-form options mapping (`cluster.job_options`) against the fields its owner declares:
    None when every name is one; else the message naming the whole key and its close matches."""
    for name in given:
        if name not in known:
            near = [f"{prefix}.{m}" for m in close(str(name), known)]
            return (f"unknown key {prefix}.{name}{did_you_mean(near)} (the options of {owner}: "
                    f"{', '.join(known) or 'none'})")
    return None


def is_class_path(value: Any) -> bool:
    return isinstance(value, str) and _CLASS_PATH.match(value) is not None


def _module_file(module: str, paths: Sequence[str]) -> Path | bool | None:
    """The source file of `module`, found without importing it; True for one that exists without a
    source file to read (a built-in, an extension, a namespace package); None when it is not there.
    Only a top-level name goes through the import system (`find_spec` of a top-level name runs no
    code)."""
    top, *rest = module.split(".")
    root = None
    for p in [*sys.path, *paths]:
        base = Path(p or ".") / top
        if (base / "__init__.py").is_file() or (base.is_dir() and rest):
            root = base
            break
        if base.with_suffix(".py").is_file():
            return None if rest else base.with_suffix(".py")
    if root is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if not spec.submodule_search_locations:
            return (
                None
                if rest
                else (Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else True)
            )
        root = Path(next(iter(spec.submodule_search_locations)))
        if not root.is_dir():  # a zip, or a finder of its own: cannot be told without importing
            return True
    for part in rest[:-1]:
        root = root / part
        if not root.is_dir():
            return None
    if not rest:
        return root / "__init__.py" if (root / "__init__.py").is_file() else True
    last = rest[-1]
    if (root / f"{last}.py").is_file():
        return root / f"{last}.py"
    if (root / last / "__init__.py").is_file():
        return root / last / "__init__.py"
    return True if (root / last).is_dir() or any(root.glob(f"{last}.*.so")) else None


def _siblings(module: str, paths: Sequence[str]) -> list[str]:
    """Module names beside where `module` would be (for the close matches)."""
    parent, _, _ = module.rpartition(".")
    if not parent:
        import pkgutil

        return [m.name for m in pkgutil.iter_modules([*paths, *(p for p in sys.path if p)])]
    where = _module_file(parent, paths)
    if not isinstance(where, Path) or where.name != "__init__.py":
        return []
    return [f"{parent}.{p.stem if p.suffix == '.py' else p.name}" for p in where.parent.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()]


def top_level_names(file: Path) -> list[str] | None:
    """Names a module file defines at its top level, read with `ast`; None when that cannot be told
    without running it (a star import or a module `__getattr__`)."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
            if node.name == "__getattr__":
                return None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                names.append(a.asname or a.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        else:  # `if`/`try` blocks may define names too: take every name they bind
            names += [
                n.name for n in ast.walk(node) if isinstance(n, (ast.ClassDef, ast.FunctionDef))
            ]
            names += [
                n.id
                for n in ast.walk(node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            ]
            names += [a.asname or a.name.split(".")[0] for n in ast.walk(node)
                      if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names]
    return names


def class_path_error(key: str, value: str, paths: Sequence[str]) -> str | None:
    """None when `module:Class` may well resolve (its module's file is on the path and, read with
    `ast`, defines `Class`); else the message with the nearest names that exist. Nothing is
    imported."""
    m = _CLASS_PATH.match(value)
    if m is None:
        return None
    module, attr = m.group(1), m.group(2).split(".")[0]
    file = _module_file(module, paths)
    if file is None:
        parts = module.split(".")
        i = next(
            i for i in range(1, len(parts) + 1) if _module_file(".".join(parts[:i]), paths) is None
        )
        missing, rest = ".".join(parts[:i]), "".join(f".{p}" for p in parts[i:])
        near = [f"{s}{rest}:{m.group(2)}" for s in close(missing, _siblings(missing, paths))]
        return (
            f"{key}={value}: there is no module {missing!r} on the module "
            f"path{did_you_mean(near)} (searched the working folder, each config_path folder's "
            "parent and sys.path; install it or run from the folder that holds it)"
        )
    if not isinstance(file, Path):
        return None
    names = top_level_names(file)
    if names is None or attr in names:
        return None
    near = [f"{module}:{n}" for n in close(attr, [n for n in names if not n.startswith("_")])]
    return f"{key}={value}: {file} defines no {attr!r}{did_you_mean(near)}"
