"""studies/weaver/weaver_anchor.py (issue 23, addendum v10): an arm that peaks and falls back gives
back the difference, one that holds gives back nothing, and the anchored sweep is paired by seed
with the same arm without the anchor."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parents[1]
REPO = STUDY.parents[1]

sys.path.insert(0, str(STUDY))
import weaver_anchor as wk  # noqa: E402  (the study folder is on sys.path just above)


def _write_run(root: Path, arm: str, seed: int, tenths_by_step: dict[int, int]) -> None:
    """Ten held-out prompts per sum 1-8; at each step the first k of every sum are answered right:
    balanced = k/10."""
    job = root / f"{arm}-{seed}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra/overrides.yaml").write_text(f"- reward={arm}\n- seed={seed}\n")
    (job / "eval_samples").mkdir()
    for step, k in tenths_by_step.items():
        lines = []
        for g in range(1, 9):
            for i in range(10):
                ans = str(g) if i < k else "0"
                lines.append(
                    json.dumps(
                        {
                            "gold": str(g),
                            "correct": ans == str(g),
                            "response": ans,
                            "extracted": ans,
                        }
                    )
                )
        (job / "eval_samples" / f"train_step{step:06d}.jsonl").write_text("\n".join(lines) + "\n")


def test_give_back_is_the_fall_from_the_best_later_evaluation(tmp_path: Path):
    _write_run(tmp_path, "weaver_paper", 0, {0: 5, 10: 9, 20: 8, 30: 6, 40: 6})
    _write_run(tmp_path, "annotated", 0, {0: 5, 10: 7, 20: 8, 30: 9, 40: 9})
    runs = wk.runs_by_arm(tmp_path, None)
    assert wk.give_back(runs["weaver_paper"][0]) == pytest.approx(0.9 - 0.6)
    assert wk.give_back(runs["annotated"][0]) == 0.0


def test_anchored_sweep_is_paired_by_seed_with_its_base(tmp_path: Path):
    base, anchored = tmp_path / "base", tmp_path / "anchored"
    for seed in range(4):
        _write_run(base, "verifier_vote", seed, {0: 5, 10: 9, 20: 6, 30: 5 + seed % 2})
        _write_run(anchored, "verifier_vote", seed, {0: 5, 10: 8, 20: 8, 30: 8 - seed % 2})
    # no anchored counterpart: left out, not an error
    _write_run(base, "verifier_mean", 0, {0: 5, 10: 6})
    out = tmp_path / "res"
    assert wk.main([str(anchored), "--base", str(base), "--out", str(out)]) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert list(res["arms"]) == ["verifier_vote"] and res["arms"]["verifier_vote"]["seeds"] == [
        0,
        1,
        2,
        3,
    ]
    assert res["arms"]["verifier_vote"]["auc_change"]["low"] > 0
    assert res["arms"]["verifier_vote"]["give_back_change"]["high"] < 0
    assert "python studies/weaver/weaver_anchor.py" in out.with_suffix(".md").read_text()


def test_no_common_arm_is_an_error(tmp_path: Path):
    _write_run(tmp_path / "a", "verifier_vote", 0, {0: 5, 10: 6})
    _write_run(tmp_path / "b", "verifier_mean", 0, {0: 5, 10: 6})
    assert (
        wk.main([str(tmp_path / "a"), "--base", str(tmp_path / "b"), "--out", str(tmp_path / "r")])
        == 1
    )
