"""Run manifest: everything needed to explain (and re-run) a run, in `run_dir/manifest.json`, as typed records
(`Manifest` and its sections), read and written here only.

A run is only reproducible if we can answer "what exactly ran?" after the fact, so the manifest is written
*before* training starts (a crashed run still has one) and completed at the end.

API (the launcher calls these; `Trackers` calls `finish_manifest` for you when used as a context manager):

    manifest = write_start_manifest(run_dir, cfg, sys.argv, seeds={"global": 1, "generator": 2},
                                    extra={"determinism": {...}, "datasets": {...}, "model": {...}})
    ...
    finish_manifest(run_dir, "completed", final_metrics={"eval/accuracy": 0.5}, artifacts=[path, ...])
    read_manifest(run_dir).identity.run_name

Helpers for `extra`: `rlexp.tracking.files.fingerprint_examples` (dataset contents, order-sensitive) and
`rlexp.tracking.files.hash_files` (model checkpoint directories).

Design notes:
- A manifest is data someone else may have written (`rlexp reproduce` a downloaded run): it is read as JSON
  only, and every known field is checked for its type (`ManifestError` names the file and the field). A
  manifest without `schema` (older rlexp) reads as version 1; keys this version does not know are kept, in
  `extra`, and written back unchanged.
- The file is replaced atomically (`rlexp.tracking.files.atomic_write_text`), so a crash mid-write never corrupts
  the manifest that is already there.
- `config_sha256` (`rlexp.tracking.runconfig.config_hash`) hashes the resolved config without run-local keys.
- Secrets are redacted before anything is written or hashed, by name and by value (rlexp.tracking.redact: the
  rules and why), in everything recorded: config values, overrides, argv/command, env, hydra info, extra.
  Hydra's own copies (`run_dir/.hydra/*.yaml`, the sweep's `multirun.yaml`) are rewritten redacted when the
  start manifest is written. `git.diff` holds tracked changes only; untracked files are listed by name.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from omegaconf import DictConfig

from .files import atomic_write_json, hash_files, sha256_file
from .hydra_run import hydra_info, redact_hydra_files, run_identity, shell_command
from .redact import redact, redact_argv, redact_text
from .runconfig import config_hash, config_to_container
from .system import git_info, package_versions, relevant_env, system_info

MANIFEST_NAME = "manifest.json"
GIT_DIFF_NAME = "git.diff"
STATUSES = ("running", "completed", "failed", "interrupted")
# A run started by `rlexp reproduce` records the run it re-creates here (the folder, absolute),
# passed to the re-run through `REPRODUCTION_ENV`: `rlexp compare` leaves such runs out of a sweep
# folder, since a re-run is not one more seed.
REPRODUCTION_KEY = "reproduction_of"
REPRODUCTION_ENV = "RLEXP_REPRODUCTION_OF"
SCHEMA_VERSION = 1  # the `schema` key every manifest has carried; a manifest without it is version 1


class ManifestError(ValueError):
    """A manifest.json that is not JSON, or whose fields have the wrong types (named, with the file)."""


R = TypeVar("R", bound="_Record")


class _Record:
    """A JSON object with typed fields, in the order they are written, plus `extra`: keys this version does not
    know (a newer rlexp's, a plugin's), kept and written back after the known ones."""

    _TAIL: ClassVar[tuple[str, ...]] = ()  # optional fields written after `extra`, and only when set
    extra: dict[str, Any]

    @classmethod
    def from_dict(cls: type[R], data: Any, source: str = "manifest") -> R:
        """`data` (parsed JSON) checked field by field; ManifestError names `source` (the file) and the field."""
        try:
            return cls._from(data, "")
        except ManifestError as e:
            raise ManifestError(f"{source}: {e}") from None

    @classmethod
    def _from(cls: type[R], data: Any, where: str) -> R:
        if not isinstance(data, Mapping):
            raise ManifestError(f"{_field(where)} must be an object, got {_kind(data)}")
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]  # type: ignore[arg-type]
        known = {k: _check(data[k], hints[k], f"{where}.{k}".lstrip(".")) for k in names if k in data}
        return cls(**known, extra={str(k): v for k, v in data.items() if k not in names})  # type: ignore[call-arg]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name != "extra" and f.name not in self._TAIL:
                out[f.name] = _plain(getattr(self, f.name))
        out.update(self.extra)
        for name in self._TAIL:
            if getattr(self, name) is not None:
                out[name] = _plain(getattr(self, name))
        return out


def _field(where: str) -> str:
    return f"`{where}`" if where else "the top level"


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _check(value: Any, tp: Any, where: str) -> Any:
    """`value` (parsed JSON) as type `tp`, or ManifestError naming the field. Records become dataclasses."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(tp)
        if value is None and type(None) in arms:
            return None
        errors = []
        for arm in (a for a in arms if a is not type(None)):
            try:
                return _check(value, arm, where)
            except ManifestError as e:
                errors.append(e)
        raise errors[0] if len(errors) == 1 else ManifestError(f"{_field(where)}: unexpected {_kind(value)}")
    if isinstance(tp, type) and issubclass(tp, _Record):
        return tp._from(value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ManifestError(f"{_field(where)} must be a list, got {_kind(value)}")
        (item,) = typing.get_args(tp)
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ManifestError(f"{_field(where)} must be an object, got {_kind(value)}")
        _, item = typing.get_args(tp)
        return {str(k): _check(v, item, f"{where}.{k}") for k, v in value.items()}
    ok = {str: isinstance(value, str), bool: isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, (int, float)) and not isinstance(value, bool)}.get(tp)
    if ok is None:
        raise TypeError(f"manifest field type {tp!r} is not supported")  # a bug here, not in the file
    if not ok:
        raise ManifestError(f"{_field(where)} must be {_kind(tp())} or absent, got {_kind(value)}")
    return value


def _plain(v: Any) -> Any:
    if isinstance(v, _Record):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


@dataclass
class HydraInfo(_Record):
    """What Hydra knew about the run (`rlexp.tracking.hydra_run.hydra_info`)."""

    mode: str | None = None
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str | None] = field(default_factory=dict)
    job_name: str | None = None
    job_num: int | None = None
    sweep_dir: str | None = None
    run_dir: str | None = None
    config_name: str | None = None
    config_dir: str | None = None
    runtime_cwd: str | None = None
    swept: dict[str, str] = field(default_factory=dict)
    redacted_files: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Identity(_Record):
    """The names every tracker and `rlexp compare` agree on (`rlexp.tracking.hydra_run.run_identity`)."""

    run_name: str | None = None
    group: str | None = None
    sweep_id: str | None = None
    sweep_dir: str | None = None
    job_num: int | None = None
    folder_name: str | None = None
    swept: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class GitInfo(_Record):
    """The code that ran (`rlexp.tracking.system.git_info`); all None outside a git checkout."""

    repo: str | None = None
    commit: str | None = None
    branch: str | None = None
    remote: str | None = None
    dirty: bool | None = None
    untracked: list[str] = field(default_factory=list)
    diff_file: str | None = None
    diff_sha256: str | None = None
    diff_redacted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Artifact(_Record):
    path: str = ""
    exists: bool = False
    sha256: str | None = None
    bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Manifest(_Record):
    """manifest.json. `trackers` (where each tracker keeps the run) is set once trackers start, `error` (why the
    run failed, one line) when it fails; both are written after the keys `extra` carries, as they always were."""

    _TAIL: ClassVar[tuple[str, ...]] = ("trackers", "error")

    schema: int = SCHEMA_VERSION
    status: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    run_dir: str | None = None
    command: str | None = None
    argv: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str | None] = field(default_factory=dict)
    hydra: HydraInfo = field(default_factory=HydraInfo)
    identity: Identity = field(default_factory=Identity)
    config: dict[str, Any] = field(default_factory=dict)
    config_sha256: str | None = None
    git: GitInfo = field(default_factory=GitInfo)
    packages: dict[str, str | None] = field(default_factory=dict)
    system: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    seeds: dict[str, int] = field(default_factory=dict)
    determinism: dict[str, Any] = field(default_factory=dict)
    datasets: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    final_metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)
    trackers: dict[str, Any] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def numerics(self) -> dict[str, Any] | None:
        """What decided bitwise agreement on the run's machine (None in manifests older than that record)."""
        found = self.system.get("numerics")
        return found if isinstance(found, dict) and found else None


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """`run_dir/manifest.json`, typed. OSError when it is missing; ManifestError (a ValueError) naming the file
    when it is not JSON or a field has the wrong type. JSON only: reading a manifest never runs anything."""
    path = Path(run_dir) / MANIFEST_NAME
    text = path.read_bytes()
    try:
        data = json.loads(text.decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON
        raise ManifestError(f"{path}: not JSON ({str(e)[:200]})") from None
    except RecursionError:  # nested deeper than any manifest rlexp writes: someone else's file
        raise ManifestError(f"{path}: not a manifest rlexp wrote (JSON nested too deep to read)") from None
    return Manifest.from_dict(data, str(path))


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    atomic_write_json(Path(run_dir) / MANIFEST_NAME, manifest.to_dict())


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------------------------- API
def write_start_manifest(
    run_dir: str | os.PathLike[str],
    cfg: DictConfig | Mapping[str, Any],
    argv: Sequence[str],
    seeds: Mapping[str, int],
    extra: Mapping[str, Any] | None = None,
    *,
    repo_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Write `run_dir/manifest.json` with status "running" and return it.

    `extra` is merged in at the top level; by convention it carries `determinism` (flags actually set),
    `datasets` ({name: fingerprint_examples(...)}), `model` ({"revision": ..., "sha256": hash_files(dir)}).
    `repo_dir` defaults to the checkout that holds the rlexp package (the code that actually ran).
    """
    run = Path(run_dir).resolve()
    run.mkdir(parents=True, exist_ok=True)
    resolved = redact(config_to_container(cfg))
    hyd = hydra_info(run)  # reads run/.hydra/ before the copies there are redacted below
    argv_clean = redact_argv(list(argv))
    repo = Path(repo_dir) if repo_dir is not None else Path(__file__).resolve().parents[2]
    manifest: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "status": "running",
        "start_time": _now(),
        "end_time": None,
        "run_dir": str(run),
        "command": shell_command(argv_clean, hyd),
        "argv": argv_clean,
        "overrides": hyd["overrides"],
        "choices": hyd["choices"],
        "hydra": hyd,
        "identity": run_identity(hyd, run),
        "config": resolved,
        "config_sha256": config_hash(cfg),
        "git": git_info(repo, run / GIT_DIFF_NAME),
        "packages": package_versions(),
        "system": system_info(),
        "env": relevant_env(),
        "seeds": {str(k): int(v) for k, v in seeds.items()},
        "determinism": {},
        "datasets": {},
        "model": {},
        "final_metrics": {},
        "artifacts": [],
    }
    if os.environ.get(REPRODUCTION_ENV):
        manifest[REPRODUCTION_KEY] = os.environ[REPRODUCTION_ENV]
    for k, v in redact(dict(extra or {})).items():
        manifest[k] = v
    # Hydra wrote run/.hydra/{config,overrides,hydra}.yaml (and multirun.yaml in the sweep dir) with the raw
    # values: redact those copies too, so every file of the run (and every upload of it) is clean.
    manifest["hydra"]["redacted_files"] = redact_hydra_files(run, hyd.get("sweep_dir"))
    # Last pass over everything stored (hydra info, identity, paths): a value only changes here when it holds a
    # token shape, e.g. a job dir named by `hydra.job.override_dirname` after a secret override.
    built = Manifest.from_dict(redact(manifest), str(run / MANIFEST_NAME))
    write_manifest(run, built)
    return built


def update_manifest(run_dir: str | os.PathLike[str], **fields: Any) -> Manifest:
    """Set top-level fields of an existing manifest (tracker ids once the trackers have started), atomically."""
    run = Path(run_dir).resolve()
    manifest = _read_or_new(run)
    known = {f.name for f in dataclasses.fields(Manifest)} - {"extra"}
    hints = typing.get_type_hints(Manifest)
    for k, v in redact(fields).items():
        if k in known:
            setattr(manifest, k, _check(v, hints[k], f"update_manifest({k}=...)"))
        else:
            manifest.extra[k] = v
    write_manifest(run, manifest)
    return manifest


def _read_or_new(run: Path) -> Manifest:
    """The manifest to complete; a new one when it is missing or unreadable, rather than losing the outcome."""
    try:
        return read_manifest(run)
    except (OSError, ValueError):
        return Manifest(run_dir=str(run))


def artifact_entry(path: str | os.PathLike[str], run_dir: Path | None = None) -> Artifact:
    p = Path(path)
    entry = Artifact(path=str(p), exists=p.exists())
    if run_dir is not None:
        with contextlib.suppress(ValueError):  # outside run_dir: keep the path as given
            entry.path = p.resolve().relative_to(run_dir).as_posix()
    if p.is_file():
        entry.sha256, entry.bytes = sha256_file(p), p.stat().st_size
    elif p.is_dir():
        entry.sha256, entry.bytes = hash_files(p), sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
    return entry


def finish_manifest(
    run_dir: str | os.PathLike[str],
    status: str,
    final_metrics: Mapping[str, Any] | None = None,
    artifacts: Iterable[str | os.PathLike[str]] = (),
    error: str | None = None,
) -> Manifest:
    """Set status/end time/final metrics/artifact hashes, and `error` (why a run failed, one line). Safe to
    call more than once (last call wins) and on a run whose start manifest is missing (a minimal one is
    created rather than losing the outcome)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    run = Path(run_dir).resolve()
    manifest = _read_or_new(run)
    manifest.status = status
    manifest.end_time = _now()
    manifest.error = redact_text(error) if error is not None else None  # a resumed run that completes is not failed
    manifest.final_metrics = {str(k): _jsonable_number(v) for k, v in (final_metrics or {}).items()}
    seen = {a.path: a for a in manifest.artifacts}
    for a in artifacts:
        e = artifact_entry(a, run)
        seen[e.path] = e
    manifest.artifacts = list(seen.values())
    write_manifest(run, manifest)
    return manifest


def _jsonable_number(v: Any) -> Any:
    try:
        return float(v) if not isinstance(v, (int, bool)) else v
    except (TypeError, ValueError):
        return str(v)

