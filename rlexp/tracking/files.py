"""File helpers shared by everything a run writes: atomic replacement (a crash mid-write leaves the old file,
never half of a new one) and content hashes (manifest fields, artifact and checkpoint digests)."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rlexp.core.runfolder import nofollow_opener


def atomic_write_text(path: Path, text: str) -> None:
    """Write via tmp file + fsync + rename so readers see either the old or the new file, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", opener=nofollow_opener) as f:  # a planted link is refused
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: leave the old file, not a half-written temporary one
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    """Keeps NaN (a diverged metric is recorded as such, not dropped); non-JSON values as their str()."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str, allow_nan=True) + "\n")


def sha256_json(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def fingerprint_examples(examples: Iterable[Any]) -> str:
    """sha256 over JSON-serialisable examples, order-sensitive (a reshuffled dataset is a different run)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps(ex, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Read in 1 MiB chunks: checkpoints and model files do not fit in memory twice."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_files(directory: str | os.PathLike[str]) -> str:
    """sha256 over (relative path, file sha256) of every file under `directory`, sorted, so the hash does
    not depend on filesystem order or mtimes. A single file is hashed as its content."""
    root = Path(directory)
    if root.is_file():
        return sha256_file(root)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Cross-process mutual exclusion (flock); in-process sequential use is trivially safe."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
