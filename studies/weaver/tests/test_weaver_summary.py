"""studies/weaver/weaver_summary.py (issue 23, addendum v11): the cross-panel summary reads the
committed per-panel files, computes each baseline's gap fraction the way the headline's is computed,
counts the goal's conditions, refuses a missing file by name and keeps the hand-written part of its
output."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parents[1]
REPO = STUDY.parents[1]

sys.path.insert(0, str(STUDY))
import weaver_summary as ws  # noqa: E402  (the study folder is on sys.path just above)

SEEDS = ("0", "1", "2", "3")


def _arm(per_seed: dict[str, float], top: float = 0.25) -> dict:
    m = sum(per_seed.values()) / len(per_seed)
    return {
        "auc": {"mean": m, "low": m - 0.01, "high": m + 0.01},
        "n_seeds": len(per_seed),
        "per_seed": per_seed,
        "top_share": {"mean": top, "low": top, "high": top},
    }


def _replication(mean_frac: float, vote_low: float) -> dict:
    single = {s: 0.2 + 0.01 * i for i, s in enumerate(SEEDS)}
    gold = {s: 0.8 - 0.02 * i for i, s in enumerate(SEEDS)}
    between = {s: single[s] + mean_frac * (gold[s] - single[s]) for s in SEEDS}
    paired = {
        "verifier_vote": {
            "diff": vote_low + 0.05,
            "low": vote_low,
            "high": vote_low + 0.1,
            "p": 0.1,
            "n": 4,
        },
        "verifier_mean": {"diff": 0.0, "low": -0.02, "high": 0.02, "p": 0.9, "n": 4},
    }
    return {
        "command": "python studies/weaver/weaver_analysis.py SWEEP --out X",
        "arms": {
            "single_rm": _arm(single),
            "annotated": _arm(gold),
            "verifier_mean": _arm(between),
            "verifier_vote": _arm(single),
            "weaver_paper": _arm(gold),
        },
        "gap_fraction": {"point": 1.0, "low": 0.9, "high": 1.1},
        "paired": paired,
        "collapse": {"headline_top_share": 0.25, "gold_top_share": 0.25},
        "goal_met": False,
    }


def _label_model(keys: set[str]) -> dict:
    group = {"diff": 0.01, "low": -0.01, "high": 0.03}
    diag = {"active": ["v1", "v2", "v3"], "verifiers": {
        "v1": {"active": True, "est_tpr": 0.9, "est_fpr": 0.1},
        "v2": {"active": True, "est_tpr": 0.5, "est_fpr": 0.1},
        "v3": {"active": True, "est_tpr": 0.2, "est_fpr": 0.3},  # worse than chance: weight 0
        "v4": {"active": False, "est_tpr": math.nan, "est_fpr": math.nan}}}
    paired = {f"pool: weaver_paper[quality] - {b}": {"group_auc": group} for b in ws.BASELINES}
    return {"command": "python studies/weaver/weaver_label_diag.py", "panels": {
        k: {"pool_diagnosis": diag, "paired": paired} for k in keys}}


def _root(tmp_path: Path, skip: str | None = None) -> Path:
    (tmp_path / "studies" / "weaver" / "results").mkdir(parents=True)
    by_file: dict[str, set[str]] = {}
    for i, p in enumerate(ws.PANELS):
        by_file.setdefault(p.label_model, set()).add(p.key)
        if p.replication != skip:
            # Panel i: the mean closes half the gap; vote's paired interval is above zero on the
            # first panel only.
            (tmp_path / p.replication).write_text(
                json.dumps(_replication(0.5, 0.01 if i == 0 else -0.01))
            )
    for f, keys in by_file.items():
        (tmp_path / f).write_text(json.dumps(_label_model(keys)))
    return tmp_path


def test_baseline_gap_fraction_and_conditions(tmp_path: Path):
    root = _root(tmp_path)
    rows = [ws.summarise(p, root) for p in ws.PANELS]
    assert rows[0]["gap"]["verifier_mean"]["point"] == pytest.approx(0.5)
    g = rows[0]["gap"]["verifier_mean"]
    assert g["low"] <= 0.5 + 1e-9 <= g["high"] + 2e-9 and g["n_seeds"] == len(SEEDS)
    assert rows[0]["gap"]["verifier_vote"]["point"] == pytest.approx(0.0)
    assert rows[0]["conditions"] == {
        "gap": True,
        "gap from start": False,
        "beats vote": True,
        "beats mean": False,
        # an older file has no gap from the start: not met
        "no collapse": True,
    }
    assert not rows[1]["conditions"]["beats vote"]
    text = ws.markdown(rows, "cmd")
    assert f"beats vote 1; beats mean 0; no collapse {len(ws.PANELS)}" in text


def test_weights_sum_to_one_and_a_zero_weight_is_named(tmp_path: Path):
    row = ws.summarise(ws.PANELS[0], _root(tmp_path))
    assert row["weights"] == pytest.approx({"v1": 0.8 / 1.2, "v2": 0.4 / 1.2, "v3": 0.0})
    assert row["weight_spread"] is None
    assert "a weight is 0" in ws.markdown([row], "cmd")


def test_a_missing_or_broken_file_is_named(tmp_path: Path):
    missing = ws.PANELS[0].replication
    with pytest.raises(SystemExit, match=missing):
        ws.summarise(ws.PANELS[0], _root(tmp_path, skip=missing))
    (tmp_path / missing).write_text("{truncated")
    with pytest.raises(SystemExit, match=f"{missing} is not JSON"):
        ws.summarise(ws.PANELS[0], tmp_path)


def test_rerun_keeps_the_hand_written_part(tmp_path: Path):
    root = _root(tmp_path)
    out = tmp_path / "summary"
    assert ws.main(["--out", str(out), "--root", str(root)]) == 0
    out.with_suffix(".md").write_text(
        out.with_suffix(".md").read_text() + "\n" + ws.HAND + ")\n\nkept\n"
    )
    assert ws.main(["--out", str(out), "--root", str(root)]) == 0
    text = out.with_suffix(".md").read_text()
    assert text.count("# Weaver (issue 23) across") == 1 and text.endswith("kept\n")
    assert json.loads(out.with_suffix(".json").read_text())["panels"][0]["panel"] == "A"


def test_the_gap_from_the_start_is_the_panels_own_and_the_rebased_goal_counts_it(tmp_path: Path):
    """Addendum v12: the summary shows each panel's start_gap_fraction as its analysis computed it,
    names a degenerate single_rm, and counts the re-based goal (gap from the start >= 0.6 with low >
    0, vote, mean, collapse)."""
    root = _root(tmp_path)
    rel = ws.PANELS[0].replication
    rep = json.loads((root / rel).read_text())
    start = {s: 0.6 for s in SEEDS}
    gold = rep["arms"]["annotated"]["per_seed"]
    paper = {s: 0.6 + 0.7 * (gold[s] - 0.6) for s in SEEDS}  # 0.7 of each seed's start -> gold gain
    rep["start_gap_fraction"] = {"weaver_paper": ws.gap_fraction(paper, start, gold),
                                 # never moves: 0
                                 "verifier_mean": ws.gap_fraction(start, start, gold)}
    rep["paired"]["verifier_mean"] = {"diff": 0.05, "low": 0.01, "high": 0.09, "p": 0.01, "n": 4}
    rep["baselines"] = {"no_learning_policy": {"mean": 0.6}}
    rep["degenerate_single_rm"] = True
    (root / rel).write_text(json.dumps(rep))
    rows = [ws.summarise(p, root) for p in ws.PANELS]
    assert rows[0]["start_gap"]["weaver_paper"]["point"] == pytest.approx(0.7)
    assert rows[0]["start_gap"]["verifier_mean"]["point"] == 0.0
    assert rows[0]["conditions"]["gap from start"] and rows[0]["goal_met_rebased"]
    assert not any(r["goal_met_rebased"] for r in rows[1:])
    text = ws.markdown(rows, "cmd")
    assert "| A | 0.600 | " in text and "| 0.700 [" in text and "| yes | yes | yes |" in text
    assert "Panels meeting the re-based gap condition (of 5): 1; the re-based goal: 1." in text
