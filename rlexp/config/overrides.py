"""Overrides read back from a run folder (a manifest's `overrides`, `.hydra/overrides.yaml`) are data someone
else wrote, and Hydra turns an override into behaviour: `+hydra.callbacks.x._target_=...` runs any callable,
`${oc.env:...}` reads this machine's environment, `--config-dir` loads any YAML. `check_overrides` is the one
gate such a list passes before anything is composed or spawned: every key must be a key of the schema
(`rlexp.config.schema.TrainConfig`; free-form `options`/`extra` dicts take any name below them), every group
selection must name an option file that exists, no key or value may carry Hydra's instantiation keys
(`_target_`, `_args_`, ...), and an interpolation may only be a plain `${a.b}` reference to a schema key.
Hydra keys are refused except the run-folder ones rlexp itself sets. A refusal names the override.

Beyond the syntax, every value is judged by what it does (`refusals`), as Hydra parses it (quotes, escapes, lists,
dicts): each schema field declares whether it names code, a place on this machine, a network endpoint or data
(`rlexp.config.trust`), and only data passes from a file someone else wrote. `rlexp eval run=` judges the
manifest's recorded `config.environment` node the same way.

What a user types on their own command line is theirs and is not checked here.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import re
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import TrainConfig
from rlexp.config.trust import TRUST, Trust, option_kind, option_meta, passes
from rlexp.config.validate import ConfigError

if typing.TYPE_CHECKING:
    from omegaconf import DictConfig

# The only Hydra keys a recorded run may carry: where its folder goes (reproduce replaces them anyway).
RUN_DIR_KEYS = frozenset({"hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir"})
# Keys Hydra's `instantiate` (and the config loader) give meaning to; never data in rlexp's config.
_SPECIAL_KEY = re.compile(r"^_[A-Za-z]+_$")
# An interpolation that stays inside the config: `${a.b.c}`, nothing else (no resolver, no nesting, no `..`).
_PLAIN_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_0-9][A-Za-z0-9_]*)*)\}")
_OPTION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class OverrideError(ConfigError):
    """An override read back from a file that rlexp refuses to hand to Hydra."""


def config_groups(conf_dirs: Sequence[Path]) -> set[str]:
    """Group names: sub-folders of the config folders (`model`, `environment`, `experiment`, ...)."""
    return {p.name for d in conf_dirs if d.is_dir() for p in d.iterdir() if p.is_dir() and p.name != "hydra"}


def _unwrap(tp: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return tp


# Sections that moved, old prefix -> new: the built-in backends' settings are their
# `cluster.job_options`, as a user's backend's are (docs/plugins.md).
MOVED = {"cluster.slurm.": "cluster.job_options.", "cluster.kubernetes.": "cluster.job_options."}


def moved_key(key: str) -> str | None:
    """The message for a key of a section that moved (`cluster.slurm.partition`), naming its new
    spelling; None for any other key."""
    for old, new in MOVED.items():
        if f"{key}.".startswith(old):
            rest = key[len(old):]
            now = f"{new}{rest}" if rest else new.rstrip(".")
            return (f"{key} moved: it is now {now} (the {old.split('.')[1]} backend's settings, "
                    f"its `Settings` in rlexp/cluster/jobs/{old.split('.')[1]}.py)")
    return None


def schema_path_error(parts: Sequence[str], root: type = TrainConfig) -> str | None:
    """None when `a.b.c` is a key of the schema (or lies inside a free-form dict), else why not."""
    tp: Any = root
    for i, part in enumerate(parts):
        tp = _unwrap(tp)
        where = ".".join(parts[:i]) or "the config"
        if dataclasses.is_dataclass(tp):
            hints = _schema(tp)[1]
            if part not in hints:
                return f"{where} has no key {part!r}"
            tp = hints[part]
        elif typing.get_origin(tp) is dict or tp is dict:
            return None  # free-form below here (environment/reward/verifier options, extra)
        elif typing.get_origin(tp) is list:
            if not part.isdigit():
                return f"{where} is a list: {part!r} is not an index"
            args = typing.get_args(tp)
            tp = args[0] if args else Any
        elif tp is Any:
            return None
        else:
            return f"{where} is a value, it has no key {part!r}"
    return None


_NUMERIC = (int, float, bool)


@functools.cache
def _schema(tp: type) -> tuple[dict[str, dataclasses.Field], dict[str, Any]]:
    """A dataclass's fields and resolved type hints (resolving them each time is most of the gate's cost)."""
    return {f.name: f for f in dataclasses.fields(tp)}, typing.get_type_hints(tp)


def _is_plain_type(tp: Any) -> bool:
    """int, float, bool or a string enum (or a list of them): data by its type alone."""
    tp = _unwrap(tp)
    if typing.get_origin(tp) is list:
        args = typing.get_args(tp)
        return bool(args) and _is_plain_type(args[0])
    return isinstance(tp, type) and (issubclass(tp, _NUMERIC) or issubclass(tp, enum.Enum))


def _declared(tp: Any, meta: Any) -> Trust | None:
    kind = (meta or {}).get(TRUST)
    if kind is not None:
        return Trust(kind)
    return Trust.DATA if _is_plain_type(tp) else None


def _refusals(key: str, tp: Any, meta: Any, value: Any) -> Iterable[tuple[str, Trust, Any]]:
    """(key, kind, value) for every part of `value` at schema node (`tp`, field metadata `meta`) that is not plain
    data (`rlexp.config.trust.passes`). A key the schema does not declare counts as code: refused, never let by."""
    tp = _unwrap(tp)
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        fields, hints = _schema(tp)
        for k, v in value.items():
            if str(k) in fields:
                yield from _refusals(f"{key}.{k}", hints[str(k)], fields[str(k)].metadata, v)
            else:
                yield f"{key}.{k}", Trust.CODE, v  # not a key of the schema: nothing vouches for it
        return
    kind = _declared(tp, meta)
    if typing.get_origin(tp) is list and isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _refusals(f"{key}.{i}", typing.get_args(tp)[0] if typing.get_args(tp) else Any, meta, v)
        return
    if kind == Trust.OPTIONS:
        yield from _option_refusals(key, key.rsplit(".", 1)[-1], value)
        return
    if kind == Trust.DATA and (typing.get_origin(tp) is dict or tp is dict):
        return  # free-form data (`extra`): recorded, never read
    if kind is None:
        kind = Trust.CODE
    if not passes(kind, value, meta):
        yield key, kind, value


def _option_refusals(key: str, name: str, value: Any) -> Iterable[tuple[str, Trust, Any]]:
    """A free-form options dict: each key classified by its name and its value's shape."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _option_refusals(f"{key}.{k}", str(k), v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _option_refusals(f"{key}.{i}", name, v)
    else:
        kind = option_kind(name, value)
        if not passes(kind, value, option_meta(name)):
            yield key, kind, value


def refusals(parts: Sequence[str], value: Any, root: type = TrainConfig) -> list[tuple[str, Trust, Any]]:
    """What in `value`, given for the key `parts` (`["cluster", "shm_dir"]`; a whole node such as
    `["environment"]` with a dict), is not plain data: [(key, kind, value)], empty when all of it may come from
    a file someone else wrote. A key outside the schema is refused (as code)."""
    tp: Any = root
    meta: Any = {}
    for part in parts:
        tp = _unwrap(tp)
        if dataclasses.is_dataclass(tp):
            fields, hints = _schema(tp)
            if part not in fields:
                return [(".".join(parts), Trust.CODE, value)]
            tp, meta = hints[part], fields[part].metadata
        elif typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        else:  # inside a free-form dict: classified by name (or all data, for `extra`)
            if _declared(tp, meta) == Trust.DATA:
                return []
            return list(_option_refusals(".".join(parts), parts[-1], value))
    return list(_refusals(".".join(parts), tp, meta, value))


HOW = {Trust.CODE: "it names code to import or run; a manifest may name only rlexp's own registered names",
       Trust.LOCATION: "it names a place on this machine that the run would read, write or delete",
       Trust.ENDPOINT: "it names a network endpoint or credentials, where your tokens and data would be sent"}


def refusal_text(key: str, kind: Trust, value: Any) -> str:
    """One line: the key, its value, and why a file someone else wrote may not choose it."""
    return f"{key}={value!r}: {HOW.get(kind, HOW[Trust.CODE])}"


def _strings(value: Any) -> Iterable[tuple[str, bool]]:
    """Every string in a parsed override value, with whether it is a dict key."""
    if isinstance(value, str):
        yield value, False
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k), True
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _value_error(value: Any) -> str | None:
    for s, is_key in _strings(value):
        if is_key and _SPECIAL_KEY.match(s):
            return f"its value holds the key {s!r}, which would make Hydra instantiate an object"
        rest = _PLAIN_REF.sub("", s)
        if "${" in rest:
            return (f"its value holds the interpolation in {s!r}: only a plain ${{a.b}} reference to a key of the "
                    f"config may appear (no resolvers such as oc.env)")
        for m in _PLAIN_REF.finditer(s):
            why = schema_path_error(m.group(1).split("."))
            if why:
                return f"its interpolation ${{{m.group(1)}}} refers outside the config ({why})"
    return None


def check_config_name(name: Any, conf_dirs: Sequence[Path], source: str) -> str:
    """A primary config (`--config-name`) read back from a file: a plain name of a YAML file in `conf_dirs`."""
    if not isinstance(name, str) or not _OPTION_NAME.match(name) or not any(
            (d / f"{name}.yaml").is_file() for d in conf_dirs):
        raise OverrideError(f"{source}: config name {name!r} is not a config file in {[str(d) for d in conf_dirs]}")
    return name


CODE_FIX = "If you trust who wrote this run folder, pass --trust-plugins for code; "


def check_overrides(overrides: Sequence[Any], source: str, conf_dirs: Sequence[Path] = (CONF_DIR,),
                    allow_code: bool = False) -> list[str]:
    """The overrides, unchanged, when every one may pass (see the module docstring); else `OverrideError`
    naming the first one refused and `source` (the file it came from). `conf_dirs`: where group options live
    (rlexp's own configs, plus a `--config-dir` the user gave). Every value is judged as Hydra parses it
    (quotes, escapes, lists, dicts) by what it does (`refusals`): one that names code, a place on this machine
    or a network endpoint is refused, all of them named in one message; `allow_code` (the user passed
    `--trust-plugins`) lets code through (the caller still checks it against the recorded plug-ins)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    untrusted: list[tuple[str, str, Trust]] = []

    if not isinstance(overrides, (list, tuple)):
        raise OverrideError(f"{source}: overrides must be a list of strings, got {type(overrides).__name__}")
    parser = OverridesParser.create()
    groups = config_groups(conf_dirs)
    for raw in overrides:
        if not isinstance(raw, str):
            raise OverrideError(f"{source}: override {raw!r} is not a string")

        def refuse(why: str, raw: str = raw) -> OverrideError:
            return OverrideError(f"{source}: refusing override {raw!r}: {why}")

        try:
            o = parser.parse_override(raw)
        except Exception as e:  # Hydra's grammar errors: the override cannot mean anything safe
            raise refuse(f"not a valid override ({str(e).splitlines()[0]})") from None
        key = o.key_or_group
        if o.package is not None:
            raise refuse("a package (`@...`) moves config nodes; a recorded run never needs one")
        if o.is_sweep_override():
            raise refuse("a sweep; a recorded run holds one value per key")
        parts = key.split(".")
        bad = [p for p in parts if _SPECIAL_KEY.match(p)]
        if bad:
            raise refuse(f"the key {bad[0]!r} would make Hydra instantiate an object")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            if key not in RUN_DIR_KEYS:
                raise refuse(f"Hydra's own settings (callbacks, launchers, sweepers, job environment) are not "
                             f"taken from a file; only {sorted(RUN_DIR_KEYS)} are")
        elif "/" in key or key in groups:
            group = key
            if group not in groups:
                raise refuse(f"there is no config group {group!r} in {[str(d) for d in conf_dirs]}")
            value = None if o.is_delete() else o.value()
            if value is None and o.is_delete():
                continue
            if not isinstance(value, str) or not _OPTION_NAME.match(value):
                raise refuse(f"{group} selects a config file by name; {value!r} is not one")
            if not any((d / group / f"{value}.yaml").is_file() for d in conf_dirs):
                options = sorted({p.stem for d in conf_dirs for p in (d / group).glob("*.yaml")})
                raise refuse(f"{group}={value}: no such option; choose one of {options}")
            continue
        else:
            why = schema_path_error(parts)
            if why:
                moved = moved_key(key)
                raise refuse(f"{key} is not a key of rlexp's config ({why})"
                             + (f"; {moved}" if moved else ""))
        why = _value_error(o.value())  # a delete's value too (`~k=v` deletes only when it matches)
        if why:
            raise refuse(why)
        if not o.is_delete():  # a delete brings back rlexp's own default
            untrusted += [(raw, refusal_text(k, kind, v), kind) for k, kind, v in refusals(parts, o.value())
                          if not (allow_code and kind == Trust.CODE)]
    if untrusted:
        raise _untrusted_error(source, untrusted)
    return list(overrides)


def _untrusted_error(source: str, untrusted: list[tuple[str, str, Trust]], most: int = 8) -> OverrideError:
    """One message naming every override that is not plain data (the first `most`), and how to give them."""
    shown = "; ".join(f"override {raw!r} ({why})" for raw, why, _ in untrusted[:most])
    more = f"; and {len(untrusted) - most} more" if len(untrusted) > most else ""
    keys = " ".join(dict.fromkeys(f"{raw.split('=', 1)[0].lstrip('~+')}=..." for raw, _, _ in untrusted[:most]))
    fix = CODE_FIX if any(kind == Trust.CODE for _, _, kind in untrusted) else ""
    return OverrideError(f"{source}: refusing {shown}{more}. {fix}a manifest never chooses these: give what you want "
                         f"yourself on your own command line (rlexp reproduce RUN_DIR -- {keys})")


def check_composed_keys(composed: DictConfig) -> None:
    """A composed config holds only keys of the schema, and no `_target_`-like key anywhere (free-form option
    dicts included): Hydra's `+key=...` adds keys even to a structured config, so a typo or an instantiation
    key typed on the command line would otherwise ride along unnoticed. `ConfigError` names the key."""
    from omegaconf import OmegaConf

    def walk(node: Any, parts: list[str]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                path = [*parts, str(k)]
                if _SPECIAL_KEY.match(str(k)):
                    raise ConfigError(f"{'.'.join(path)}: {k!r} would make Hydra instantiate an object; rlexp's "
                                      f"config holds data only, remove the override")
                why = schema_path_error(path)
                if why:
                    raise ConfigError(f"{'.'.join(path)}: not a key of rlexp's config ({why}); check the spelling "
                                      f"(`rlexp train --cfg job` prints every key)")
                walk(v, path)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, [*parts, str(i)])

    is_config = OmegaConf.is_config(composed)
    plain = OmegaConf.to_container(composed, resolve=False) if is_config else composed
    walk(plain, [])
