"""studies/crosscheck/crosscheck.py: its hand-written response set and its comparison logic (the
cross-check against lm-evaluation-harness itself needs lm-eval in another venv, so it is not run
here)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from crosscheck import _cases, compare


def test_crosscheck_cases_are_well_formed():
    """The lm-eval cross-check itself needs lm-eval in another venv (see
    studies/crosscheck/results/crosscheck_mc.md); here only its response set and comparison logic
    are checked."""
    cases = _cases()
    assert len(cases) == 100 and len({c.id for c in cases}) == 100
    assert all(c.gold in ("ABCD" if c.task == "gpqa" else "ABCDEFGHIJ") for c in cases)
    gp = [c for c in cases if c.task == "gpqa"]
    mm = [c for c in cases if c.task == "mmlu_pro"]
    lm = {
        "tasks": {
            "gpqa": {
                "metric": {"ignore_case": True, "ignore_punctuation": True},
                "filters": {"f": {"extracted": [f"({c.gold})" for c in gp], "filter": []}},
            },
            "mmlu_pro": {
                "metric": {},
                "filters": {"f": {"extracted": [c.gold for c in mm], "filter": []}},
            },
        }
    }
    rows, summary = compare(lm, cases)
    assert summary["gpqa/f"]["n"] == len(gp) and summary["mmlu_pro/f"]["n"] == len(mm)
    assert all(r["agree"] == r["rlexp_correct"] for r in rows)  # lm side always right here
