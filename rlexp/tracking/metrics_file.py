"""Reading `metrics.jsonl` back: the one reader resume and `rlexp reproduce` share, so they agree on what a
damaged file means.

The tracker appends one line per step and flushes it, so a crash (kill -9, power loss) can cut only the last
line: that one is skipped with a warning naming the file and line. A bad line anywhere else was not made by
a crash, and silently dropping it would shift every comparison after it, so it is an error naming the file
and line.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class MetricsFileError(ValueError):
    """metrics.jsonl has an unreadable line that a crash cannot explain; the message names file and line."""


def _warn(msg: str) -> None:
    print(f"[rlexp] warning: {msg}", file=sys.stderr, flush=True)


def read_metrics(path: str | os.PathLike[str], warn: Callable[[str], None] = _warn) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl file (blank lines ignored); [] when it does not exist."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"a {type(row).__name__}, not an object")
        except ValueError as e:
            if i == last:
                warn(f"{path}:{i + 1}: skipping a partial last line (a crash mid-write): {line[:80]!r}")
                continue
            raise MetricsFileError(
                f"{path}:{i + 1}: unreadable line ({str(e).splitlines()[0]}): {line[:80]!r}; only the last line "
                f"can be cut by a crash, so this file was edited or damaged. Fix or delete that line") from None
        rows.append(row)
    return rows
