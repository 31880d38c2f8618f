"""A user's own code and configs, outside the rlexp package: found, imported in every process, and recorded.

`plugins: [mypkg.tasks]` (top-level config) lists modules imported before anything is built, so that their
`@register_env`/`@register_reward`/`@register_rule` decorators run; a class can also be named directly as
`mypkg.tasks:CountA` (`rlexp.registry`). They are searched on `sys.path` plus the run's working folder and the
parent of every folder in `config_path` (a user project keeps `conf/` next to its package). The controller
imports them in `prepare`, before anything is spawned, and leaves the list and the folders in the environment
variable `PLUGINS_ENV`; every actor process inherits it and calls `activate_from_env` when it starts, so the
same names resolve in the reward, verifier, generator and trainer processes.

`describe_plugins` and `describe_config_dirs` are what the manifest records (file, sha256 of the source, version,
git commit; a hash of every YAML of a config folder), and what `rlexp reproduce` checks before a re-run.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rlexp.config.validate import ConfigError
from rlexp.registry import BY_NAME, IMPORTED, PluginError, import_module

# `rlexp eval` once took `trust_plugins=true` where `rlexp reproduce` took `--trust-plugins`: one spelling now,
# the old one still taken (a script that used it keeps working) with this note.
OLD_TRUST_SPELLING = ("rlexp: note: trust_plugins=true is the old spelling; use --trust-plugins (the same flag in "
                      "rlexp eval and rlexp reproduce)")
PLUGINS_ENV = "RLEXP_PLUGINS"  # JSON {"modules": [...], "paths": [...]}, set by the controller, read by actors


def search_paths(config_path: Iterable[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """Folders a plug-in is looked for in besides `sys.path`: the working folder and each config folder's parent."""
    out = [str(Path(cwd or os.getcwd()).resolve())]
    out += [str(Path(d).expanduser().resolve().parent) for d in config_path]
    return list(dict.fromkeys(out))


def activate(modules: Sequence[str], paths: Sequence[str]) -> None:
    """Put `paths` on `sys.path` (after what is there: a user module never shadows rlexp or its dependencies),
    import `modules` (a `PluginError` names the first that fails), and pass both on to processes started later."""
    for p in paths:
        if p not in sys.path:
            sys.path.append(p)
    for m in modules:
        import_module(str(m), "plugins")
    os.environ[PLUGINS_ENV] = json.dumps({"modules": list(modules), "paths": list(paths)})


def activate_from_env() -> None:
    """In an actor process: what the controller activated (a no-op when it activated nothing)."""
    raw = os.environ.get(PLUGINS_ENV)
    if raw:
        spec = json.loads(raw)
        activate(spec.get("modules") or [], spec.get("paths") or [])


def used_modules(modules: Sequence[str]) -> list[str]:
    """`modules`, then every module outside rlexp whose class a lookup returned in this process, each once."""
    return list(dict.fromkeys([*modules, *IMPORTED]))


def module_folders(modules: Sequence[str]) -> list[str]:
    """The folder holding each module's top-level package (or single-file module): where another process finds it,
    also when it was imported by a script run from elsewhere rather than found through `config_path`."""
    return list(dict.fromkeys(str(source_root(m)[1].parent) for m in modules))


def export_used(modules: Sequence[str], config_path: Sequence[str]) -> None:
    """After every lookup of `prepare`: the modules the run uses (`used_modules`: also one that a wrapper script
    imported and whose registered names the config uses) and their folders, for every actor started later."""
    used = used_modules(modules)
    activate(used, [*search_paths(config_path), *module_folders(used)])


def _sha256_files(files: Iterable[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def source_root(module: str) -> tuple[Path, Path]:
    """(the module's file, what its hash covers): the top-level package's folder, or a single-file module."""
    mod = sys.modules.get(module) or import_module(module, f"plugins: {module}")
    file = Path(getattr(mod, "__file__", "") or "")
    if not file.is_file():
        raise PluginError(f"plugins: module {module!r} has no source file to record")
    top = sys.modules.get(module.split(".")[0])
    top_file = Path(getattr(top, "__file__", "") or file)
    return file.resolve(), (top_file.parent if top_file.name == "__init__.py" else top_file).resolve()


def source_hash(module: str) -> str:
    """sha256 over every .py file of the module's top-level package (a helper module it imports counts too)."""
    _, root = source_root(module)
    return _sha256_files(root.rglob("*.py") if root.is_dir() else [root], root if root.is_dir() else root.parent)


def _git(folder: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def describe_plugins(modules: Sequence[str]) -> list[dict[str, Any]]:
    """One manifest entry per plug-in module: import path, file, source sha256, distribution version, git, and
    `by_name` when the config used a name it registered (so a re-run lists it in `plugins`: it may have been
    imported by a wrapper script rather than by rlexp)."""
    if not modules:  # most runs: no need to read every installed distribution's file list (~0.3 s)
        return []
    dists = metadata.packages_distributions()
    out = []
    for m in modules:
        file, root = source_root(m)
        dist = (dists.get(m.split(".")[0]) or [None])[0]
        version = None
        if dist:
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = None
        folder = root if root.is_dir() else root.parent
        commit = _git(folder, "rev-parse", "HEAD")
        dirty = bool(_git(folder, "status", "--porcelain", "--", ".")) if commit else None
        out.append({"module": m, "file": str(file), "sha256": source_hash(m), "version": version,
                    "git_commit": commit, "git_dirty": dirty, "by_name": m in BY_NAME})
    return out


def config_dir_hash(folder: str | os.PathLike[str]) -> str:
    root = Path(folder)
    return _sha256_files([*root.rglob("*.yaml"), *root.rglob("*.yml")], root)


def describe_config_dirs(dirs: Sequence[str]) -> list[dict[str, str]]:
    """One manifest entry per user config folder: its absolute path and a hash of its YAML files."""
    return [{"path": str(Path(d).resolve()), "sha256": config_dir_hash(d)} for d in dirs]


def recorded_folders(plugins: Any) -> list[str]:
    """The folder above each recorded plug-in's top-level package (`a.b` in /x/a/b.py: /x), from a manifest's
    `plugins` entries: where another process finds them again, whichever folder the run started in."""
    out = []
    for p in plugins or []:
        # Data someone else wrote: only an absolute path to a file that is there names a folder (a relative one
        # would resolve inside whatever folder the reader stands in, e.g. the run folder itself).
        if (isinstance(p, dict) and isinstance(p.get("file"), str) and isinstance(p.get("module"), str)
                and Path(p["file"]).is_absolute() and Path(p["file"]).is_file()):
            file, depth = Path(p["file"]), len(p["module"].split("."))
            up = depth - 1 + (file.name == "__init__.py")
            if 0 <= up < len(file.parents):
                out.append(str(file.parents[up]))
    return list(dict.fromkeys(out))


def recorded_code(plugins: Any, config_dirs: Any) -> list[str]:
    """What a manifest says to import or read as config: one line per plug-in module and config folder. A run folder
    is data from whoever wrote it, so a command that would run this code asks its user first (`--trust-plugins`):
    a recorded sha256 shows drift, not who wrote the file."""
    out = [f"plug-in {p.get('module')} from {p.get('file')}" if isinstance(p, dict) else f"plug-in entry {p!r}"
           for p in plugins or []]
    out += [f"config folder {d.get('path')}" if isinstance(d, dict) else f"config_path entry {d!r}"
            for d in config_dirs or []]
    return out


def activate_recorded(plugins: Any, config_dirs: Any, cwd: str | None) -> list[str]:
    """In a process that reads a finished run (`rlexp eval run=DIR`): import the run's plug-ins from where the
    manifest says they were, so its environment resolves from any folder. Returns `recorded_changes` (a caller
    warns: the code is no longer what the run used)."""
    dirs = [str(d["path"]) for d in config_dirs or [] if isinstance(d, dict) and isinstance(d.get("path"), str)]
    modules = [str(p["module"]) for p in plugins or [] if isinstance(p, dict) and isinstance(p.get("module"), str)]
    paths = [*search_paths(dirs, cwd if cwd and Path(cwd).is_dir() else None), *recorded_folders(plugins)]
    activate(modules, paths)
    return recorded_changes(plugins, config_dirs)


def recorded_changes(plugins: Any, config_dirs: Any) -> list[str]:
    """What differs now from a manifest's `plugins` and `config_path` entries (a missing folder, another hash);
    the entries are data someone else wrote, so their shape is checked too."""
    out = []
    for d in config_dirs or []:
        if not isinstance(d, dict) or not isinstance(d.get("path"), str):
            out.append(f"config_path entry {d!r} is not {{path, sha256}}")
        elif not Path(d["path"]).is_dir():
            out.append(f"config folder {d['path']} no longer exists")
        elif config_dir_hash(d["path"]) != d.get("sha256"):
            out.append(f"config folder {d['path']}: its YAML files changed since the run")
    for p in plugins or []:
        if not isinstance(p, dict) or not isinstance(p.get("file"), str) or not isinstance(p.get("module"), str):
            out.append(f"plugins entry {p!r} is not {{module, file, sha256}}")
            continue
        file = Path(p["file"])
        if not file.is_file():
            out.append(f"plug-in {p['module']}: {file} no longer exists")
            continue
        top = p["module"].split(".")[0]
        root = next((a for a in [file.parent, *file.parents] if a.name == top), None)
        root = root if root is not None and (root / "__init__.py").is_file() else file
        now = _sha256_files(root.rglob("*.py") if root.is_dir() else [root], root if root.is_dir() else root.parent)
        if now != p.get("sha256"):
            out.append(f"plug-in {p['module']} ({file}): its source changed since the run")
    return out


def with_config_path(argv: list[str]) -> list[str]:
    """`config_path=DIR` or `config_path=[DIR,...]` (user config folders beside the shipped presets) made absolute,
    checked to exist, and put on Hydra's search path (`hydra.searchpath`, derived here, so a recorded run replays
    `config_path` alone). A `hydra.searchpath=[file://DIR]` typed by hand is taken as `config_path` (so it is
    recorded too); other search-path schemes are refused. A folder that is not there is refused before Hydra
    composes anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out, dirs = [], []
    for a in argv:
        key = a.split("=", 1)[0].lstrip("+")
        if key not in ("config_path", "hydra.searchpath"):
            out.append(a)
            continue
        value = OverridesParser.create().parse_override(a).value()
        for d in (value if isinstance(value, list) else [value]):
            if key == "hydra.searchpath":
                if not str(d).startswith("file://"):
                    raise ConfigError(f"hydra.searchpath: {d} is not a file:// folder; give user config folders as "
                                      f"config_path=[DIR,...]")
                d = str(d)[len("file://"):]
            path = Path(str(d)).expanduser().resolve()
            if not path.is_dir():
                raise ConfigError(f"config_path: {d} is not a folder (resolved: {path}); give folders holding "
                                  f"config groups such as environment/, reward/, sweeps/")
            dirs.append(str(path))
    if not dirs:
        return out
    quoted = ",".join("'" + d.replace("'", "\\'") + "'" for d in dirs)
    files = ",".join("'file://" + d.replace("'", "\\'") + "'" for d in dirs)
    return [*out, f"config_path=[{quoted}]", f"hydra.searchpath=[{files}]"]
