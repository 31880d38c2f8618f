"""What a config value can do, declared beside the key in the schema: the vocabulary of the trust boundary.

A value read back from a run folder (a manifest's `overrides` or recorded `config`) was written by whoever sent
the folder. Whether it may pass depends on what the value *does*, not on how it is spelt, so every schema key
says so in its dataclass field's metadata (`field(metadata=CODE)`, the constants below):

- `DATA`: a number, a name, a label; it changes what is computed, never what runs or where bytes go.
- `CODE`: names code: a registry name or a `package.module:Class` import path (`environment.name`,
  `algorithm.loss`, `cluster.job`, ...), a plug-in module, a config folder, an interpreter, a container image.
  A plain registered name picks rlexp's own shipped code and is data; an import path is code. `RUNS` keys
  (plug-in modules, config folders, an interpreter, an image, scheduler arguments) are code whatever the value.
- `LOCATION`: a place on this machine that is read, written or deleted (`cluster.shm_dir`, `model.path`,
  `logger.runs_root`, `resume=PATH`). Only an unset value (null) is data.
- `ENDPOINT`: a network address or credentials (`logger.mlflow.tracking_uri`, `logger.wandb.entity`,
  a kubeconfig): where your tokens and data would be sent. Only an unset value is data.
- `OPTIONS`: a free-form dict (environment/reward/verifier/transport options): what is below it is classified by
  its name and value shape (`option_kind`), since the schema cannot know its keys.

A key of type int, float, bool or a string enum is data by its type and needs no declaration; every other key
must declare its kind (tests/test_trust.py walks the schema). The gate that applies this is
`rlexp.config.overrides`.
"""
from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

TRUST = "trust"  # the metadata key


class Trust(StrEnum):
    DATA = "data"
    CODE = "code"
    LOCATION = "location"
    ENDPOINT = "endpoint"
    OPTIONS = "options"


# A value that names a place whose files a registry of names also accepts (`environment.dataset` is a Hugging Face
# id or a local file): the metadata flag says a value that is not a local path is a name, hence data.
HUB_IDS = "hub_ids"
WORDS = "words"  # values of a LOCATION key that name no place (`resume`: never, auto)


# The metadata of a schema field: `name: str = field(default="arithmetic", metadata=CODE)`.
DATA = {TRUST: Trust.DATA}
CODE = {TRUST: Trust.CODE}
LOCATION = {TRUST: Trust.LOCATION}
ENDPOINT = {TRUST: Trust.ENDPOINT}
OPTIONS = {TRUST: Trust.OPTIONS}
# Code whatever its spelling: a module to import, a folder of configs, an interpreter or image to run, arguments
# passed to a scheduler verbatim. Unlike a registry name, no value of such a key picks rlexp's own code.
ALWAYS = "always"
RUNS = {TRUST: Trust.CODE, ALWAYS: True}


def location_meta(*, hub_ids: bool = False, words: tuple[str, ...] = ()) -> dict[str, Any]:
    """LOCATION, with `hub_ids` (a value that is no local path is a hub name, i.e. data) and `words` (values
    that name no place: `resume` is never | auto | PATH)."""
    return {**LOCATION, **({HUB_IDS: True} if hub_ids else {}), **({WORDS: words} if words else {})}


# Free-form keys: their kind by name (the last part of the key) ...
_CODE_NAMES = re.compile(r"(^|_)(rule|loss|class|cls|module|plugins?|callable|factory|target|image|exe|command|"
                         r"cmd|script|args|argv|interpreter)$", re.I)
# ... of which these run whatever the value (`RUNS`): an interpreter, an image, a command, arguments
# passed verbatim (a backend's `python_exe`, `image`, `extra_args`); a plain name is no registry's.
_RUNS_NAMES = re.compile(r"(^|_)(image|exe|command|cmd|script|args|argv|interpreter)$", re.I)
_LOCATION_NAMES = re.compile(r"(^|_)(dir|dirs|path|paths|root|file|files|folder|cache|home|kubeconfig|dataset|"
                             r"out|output)$", re.I)
_ENDPOINT_NAMES = re.compile(r"(^|_)(url|uri|urls|host|hosts|endpoint|server|proxy|entity|token|key|secret|"
                             r"password|credentials?|auth|port)$", re.I)
# ... and by the shape of the value, whatever the name.
IMPORT_PATH = re.compile(r"^\s*[A-Za-z_][\w.]*\s*:\s*[A-Za-z_][\w.]*\s*$")
_URL = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.\-]*://|^\s*[\w.\-]+@[\w.\-]+:")
_LOCAL_PATH = re.compile(r"^\s*(/|~|\.\.?(/|$)|[A-Za-z]:[\\/]|\\\\|file:)")
# A plain name in one of rlexp's registries (or a config option): no import path, no folder.
PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*$")
_HUB_ID = re.compile(r"[A-Za-z0-9_][\w\-]*(\.[\w\-]+)*(/[A-Za-z0-9_][\w\-]*(\.[\w\-]+)*)?")  # org/name


def is_local_path(value: str) -> bool:
    """A string that names a file or folder here (absolute, home, relative with `./`/`../`, or a file: URL)."""
    return bool(_LOCAL_PATH.match(value)) or value.endswith((".jsonl", ".json", ".parquet", ".csv"))


def value_kind(value: str) -> Trust:
    """What a string does by its shape alone (free-form values, and code keys' values)."""
    if IMPORT_PATH.match(value):
        return Trust.CODE
    if _URL.match(value):
        return Trust.ENDPOINT
    if is_local_path(value) or "/" in value or "\\" in value:
        return Trust.LOCATION
    return Trust.DATA


def option_kind(name: str, value: Any) -> Trust:
    """A free-form key's kind: by its name, then, for a string, by its value's shape."""
    for kind, pattern in ((Trust.CODE, _CODE_NAMES), (Trust.LOCATION, _LOCATION_NAMES),
                          (Trust.ENDPOINT, _ENDPOINT_NAMES)):
        if pattern.search(name):
            return kind
    return value_kind(value) if isinstance(value, str) else Trust.DATA


def option_meta(name: str) -> dict[str, Any]:
    """A free-form key's metadata by its name: `RUNS` for what runs whatever its spelling (see
    `_RUNS_NAMES`), else none."""
    return RUNS if _RUNS_NAMES.search(name) else {}


def passes(kind: Trust, value: Any, meta: dict[str, Any] | None = None) -> bool:
    """Whether a value of a key of `kind` is plain data: always for DATA; for CODE a plain registered name (it
    picks rlexp's own shipped code: without trusted plug-ins nothing else is registered); for LOCATION and
    ENDPOINT only an unset value (or, for a `hub_ids` key, a hub name that is no local path)."""
    if kind == Trust.DATA:
        return True
    if value is None or value == "" or value == []:
        return True
    if kind == Trust.CODE:
        return not (meta or {}).get(ALWAYS) and isinstance(value, str) and bool(PLAIN_NAME.match(value))
    meta = meta or {}
    if kind == Trust.LOCATION and isinstance(value, str) and value in meta.get(WORDS, ()):
        return True
    if kind == Trust.LOCATION and meta.get(HUB_IDS) and isinstance(value, str):
        return not is_local_path(value) and bool(_HUB_ID.fullmatch(value))
    return False
