"""Metric rows read as someone else's file: `rlexp compare` reads sweeps that others made or mailed, so every
row of `metrics.jsonl` (and every W&B or MLflow history row) is checked before a statistic touches it.

One rule, the same for every source: **a damaged part is dropped, named, and the rest is compared.** A reader
that refused a whole sweep over one bad line would hide every good run in it; one that dropped it silently
would shift the verdict unseen. So each problem is one line `FILE:LINE: what is wrong; what was done`, printed
as a warning and listed in compare.md's notes:

* a line that is not UTF-8, longer than `MAX_LINE_BYTES`, nested deeper than `MAX_DEPTH` (Python's json
  parser would raise RecursionError on very deep input), not JSON, or not a JSON object: the row is skipped;
* a `step` that is missing or not a whole number in [0, 2^63) (`"step": "two"`, `1.5`, `true`): the row is
  skipped, it cannot be placed on any curve;
* a metric value that is not a number (a string, a list, `true`), is `Infinity` / `-Infinity` (a mean
  with it is meaningless) or beyond `MAX_ABS` (sums overflow): that value is dropped, the row kept. `NaN` is
  kept as "no value": rlexp's own tracker writes it for a metric undefined at a step, and every statistic
  skips it;
* a step logged twice with the same metric (a run restarted or resumed without truncating its file):
  `duplicate_steps` names the steps and **the later rows win**, as they do in W&B and MLflow, because the
  later rows are the ones the run continued from.
"""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

MAX_LINE_BYTES = 1 << 20  # rlexp writes rows of a few KB; a megabyte is no metrics row
MAX_DEPTH = 16  # rlexp's rows are flat; nesting only matters as an attack on the parser
MAX_ABS = 1e100  # a larger metric is no measurement, and the statistics' sums of such values overflow
MAX_STEP = 2**63  # the range of every schema int (rlexp.config.validate.check_numbers)


class TooDeep(ValueError):
    """JSON nested deeper than a reader allows."""


def json_depth(obj: Any) -> int:
    """How deeply lists and objects nest in a parsed value (a scalar: 0), without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def loads_bounded(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` that raises ValueError (`TooDeep`), never RecursionError, for input nested deeper than
    `max_depth`. The C parser raises RecursionError past Python's recursion limit; anything below it is parsed
    (in linear time, no regular expression an attacker could make quadratic) and measured."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested more than {sys.getrecursionlimit()} levels deep, over the limit of {max_depth}"
                      ) from None
    if (d := json_depth(obj)) > max_depth:
        raise TooDeep(f"nested {d} levels deep, over the limit of {max_depth}")
    return obj


def _lines(path: Path) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, bytes or None when over the limit, length) without holding a huge line in memory."""
    with open(path, "rb") as f:
        n = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            n += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                size = len(raw)
                while raw and not raw.endswith(b"\n"):  # the rest of the long line, read and dropped
                    raw = f.readline(MAX_LINE_BYTES)
                    size += len(raw)
                yield n, None, size
            else:
                yield n, raw, len(raw)


def parse_line(raw: bytes) -> dict[str, Any]:
    """One metrics line -> an object; ValueError saying what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    try:
        obj = loads_bounded(text)
    except TooDeep:
        raise
    except ValueError as e:
        raise ValueError(f"not JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a JSON {type(obj).__name__}, not an object")
    return obj


def _describe(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (str, bool)) or v is None else repr(v)
    return (s[:40] + "...") if len(s) > 40 else s


def check_row(obj: dict[str, Any], step_key: str = "step") -> tuple[dict[str, Any] | None, list[str]]:
    """The row with only usable values (None when it has no usable step), and what was wrong."""
    step = obj.get(step_key)
    if isinstance(step, float) and math.isfinite(step) and step.is_integer():
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < MAX_STEP:
        what = ("no step" if step_key not in obj
                else f"step {_describe(step)} is not a whole number in [0, 2^63)")
        return None, [f"{what}; row skipped"]
    row: dict[str, Any] = {"step": step}
    problems: list[str] = []
    for k, v in obj.items():
        if k == step_key:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            problems.append(f"{k!r} is {_describe(v)}, not a number; value dropped")
        elif math.isinf(v):
            problems.append(f"{k!r} is {v}, not finite; value dropped")
        elif abs(v) > MAX_ABS:
            problems.append(f"{k!r} is {_describe(v)}, beyond {MAX_ABS:g} in magnitude; value dropped")
        else:
            row[k] = v
    return row, problems


def read_rows(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The usable rows of a metrics.jsonl file, in file order; each problem appended as `FILE:LINE: ...`."""
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    for n, raw, size in _lines(path):
        if raw is None:
            problems.append(f"{path}:{n}: a line of {size} bytes, over the limit of {MAX_LINE_BYTES}; row skipped")
            continue
        if not raw.strip():
            continue
        try:
            obj = parse_line(raw)
        except ValueError as e:
            problems.append(f"{path}:{n}: {e}; row skipped")
            continue
        row, bad = check_row(obj)
        problems += [f"{path}:{n}: {b}" for b in bad]
        if row is not None:
            rows.append(row)
    return rows


def duplicate_steps(rows: Iterable[dict[str, Any]]) -> list[int]:
    """Steps at which some metric is logged more than once. Two rows at one step are normal (a run's final
    evaluation has its own row); the same metric twice is a step run twice. Clock keys (`time/`, `_`) are
    stamped on every row and do not count."""
    seen: dict[Any, set[str]] = {}
    dup: set[Any] = set()
    for r in rows:
        keys = {k for k in r if k != "step" and not k.startswith(("time/", "_"))}
        have = seen.setdefault(r.get("step"), set())
        if have & keys:
            dup.add(r.get("step"))
        have |= keys
    return sorted(dup)


def ranges(steps: list[int]) -> str:
    """[0, 1, 2, 3, 7] -> "0-3, 7"."""
    spans: list[list[int]] = []
    for s in steps:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
