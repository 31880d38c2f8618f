"""studies/weaver/compare_sweeps.py (issue 46 item 2): a regenerated table is called identical only
when every cell's evaluation files, non-timing metrics and stand-in hashes match; a changed metric,
a changed response or a missing cell is named and makes the exit status 1."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STUDY = Path(__file__).resolve().parents[1]


def _cell(root: Path, name: str, accuracy: float, response: str = "7") -> None:
    run = root / name
    (run / "eval_samples").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(
        {"status": "completed", "model": {"sha256": "ab" * 32},
         "verifiers": {"rm_small": {"sha256": "cd" * 32}}, "git": {"commit": "0" * 40}}))
    slower = 2.0 if root.name == "b" else 1.0  # the regenerated sweep's clock is another one
    rows = [{"step": s, "eval/accuracy": accuracy, "time/step_s": 0.1 * (s + 1) * slower}
            for s in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval_samples" / "train_step000000.jsonl").write_text(json.dumps({"response": response}))


def _compare(a: Path, b: Path, out: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(STUDY / "compare_sweeps.py"), str(a), str(b),
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(out.with_suffix(".json").read_text())


def test_identical_only_when_every_cell_matches(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        _cell(root, "annotated-0", 0.9)
    _cell(a, "weaver_paper-0", 0.8)
    _cell(b, "weaver_paper-0", 0.8)
    rc, res = _compare(a, b, tmp_path / "same")
    # The timings differ (time/*); nothing else does.
    assert rc == 0 and (res["identical"], res["of"]) == (2, 2)

    (b / "weaver_paper-0" / "metrics.jsonl").write_text(
        (b / "weaver_paper-0" / "metrics.jsonl").read_text().replace("0.8", "0.81", 1))
    _cell(b, "verifier_mean-0", 0.7)  # a cell only the regenerated sweep has
    rc, res = _compare(a, b, tmp_path / "differ")
    assert rc == 1 and res["identical"] == 1 and res["of"] == 3
    assert res["cells"]["weaver_paper-0"]["metric_keys_differing"] == ["eval/accuracy"]
    assert res["cells"]["verifier_mean-0"] == {"identical": False, "missing": True}
    text = (tmp_path / "differ.md").read_text()
    assert "| weaver_paper-0 | NO |" in text and "**1 of 3 cells identical**" in text


def test_a_changed_response_is_a_different_cell(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _cell(a, "annotated-0", 0.9, response="7")
    _cell(b, "annotated-0", 0.9, response="8")
    rc, res = _compare(a, b, tmp_path / "resp")
    assert rc == 1 and res["cells"]["annotated-0"]["eval_files_same"] == 0
