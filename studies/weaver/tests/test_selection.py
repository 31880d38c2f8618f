"""studies/weaver/selection.py's registered statistics (addendum v15), against hand computations:
the exact sign test, Holm's step-down correction, the paired bootstrap's verdict, first-of-equal
picks, the committed responses refused when they are not whole groups, and majority voting through
the real arithmetic environment."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
for p in (REPO, REPO / "studies" / "weaver"):
    sys.path.insert(0, str(p))
import selection as sel  # noqa: E402


def test_sign_test_is_the_exact_binomial_on_the_discordant_prompts():
    a = np.array([1, 1, 1, 1, 1, 0, 1, 0])
    b = np.array([0, 0, 0, 0, 0, 0, 1, 0])
    t = sel.sign_test(a, b)  # 5 prompts only a right, 0 only b: p = 2 x (1/2)^5
    assert (t["a_only"], t["b_only"]) == (5, 0) and t["p"] == pytest.approx(2 / 32)
    t = sel.sign_test(np.array([1, 0, 1, 0]), np.array([0, 1, 0, 1]))  # 2 vs 2: p = 1
    assert t["p"] == 1.0
    assert sel.sign_test(a, a)["p"] == 1.0  # no discordant prompt


def test_holm_multiplies_by_the_remaining_count_and_stays_monotone():
    assert sel.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert sel.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_the_bootstrap_verdict_follows_the_interval():
    n = 126
    idx = np.random.default_rng(0).integers(0, n, size=(2000, n))
    better = np.array([1] * 30 + [0] * 96)
    worse = np.zeros(n, dtype=int)
    r = sel.paired(better, worse, idx)
    assert r["diff"] == pytest.approx(30 / 126) and r["low"] > 0 and r["verdict"] == "better"
    assert sel.paired(worse, better, idx)["verdict"] == "worse"
    assert sel.paired(better, better, idx)["verdict"] == "indistinguishable"


def test_picks_take_the_first_of_equal_scores_and_score_them_with_gold():
    scores = np.array([0.2, 0.9, 0.9, 0.1, 0, 0, 0, 0] + [0.5] * 8)
    ok = np.array([0, 0, 1, 0, 0, 0, 0, 0] + [1] + [0] * 7, dtype=bool)
    assert sel.picks(scores).tolist() == [1, 0]
    # the tie goes to response 1 (wrong), then 0 (right)
    assert sel.picked_correct(scores, ok).tolist() == [0, 1]
    lo, hi = sel.wilson(63, 126)
    assert lo < 0.5 < hi and math.isclose(hi - 0.5, 0.5 - lo, rel_tol=1e-9)


def test_committed_responses_that_are_not_whole_groups_are_refused(tmp_path: Path):
    rows = [
        {
            "prompt_id": "1+1",
            "prompt": "1+1=",
            "response": "2",
            "gold": "2",
            "correct": True,
            "sample_index": i,
        }
        for i in range(sel.N)
    ]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sel.load_samples(good)["correct"].all()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    with pytest.raises(SystemExit, match="consecutive groups of 8"):
        sel.load_samples(bad)


def test_majority_picks_the_first_response_of_the_commonest_answer():
    from rlexp.config.environment import EnvConfig
    from rlexp.envs.registry import build_env

    env = build_env(EnvConfig(name="arithmetic", options={"verifier_frac": 0.25}))
    part = {
        "prompts": ["1+2="] * 8,
        "gold": ["3"] * 8,
        "texts": ["4", "3", "4", "3", "5", "3", "4", "x"],
    }
    # "4" and "3" three times each: the answer seen first ("4") wins, at its first response
    assert sel.majority_scores(env, part).tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
