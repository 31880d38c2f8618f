"""Metrics against values computed by hand (shown in the comments)."""
from __future__ import annotations

import pytest

from rlexp.evals.metrics import (
    accuracy,
    maj_at_k,
    majority_correct,
    mean_pass_at_k,
    pass_at_k,
    summarize,
    unparseable_rate,
    wilson_interval,
)


def test_accuracy_and_unparseable():
    assert accuracy([True, False, True, True]) == 0.75
    assert unparseable_rate([True, False, False, True]) == 0.5
    assert accuracy([]) == 0.0


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c/n
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k: every draw of 2 contains a correct one
    assert pass_at_k(6, 1, 3) == pytest.approx(0.5)  # 1 - C(5,3)/C(6,3) = 1 - 10/20
    assert mean_pass_at_k([[True, False], [False, False]], 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_majority_vote():
    assert majority_correct(["4", "5", "4", None], [True, False, True, False])
    assert not majority_correct(["5", "4"], [False, True])  # tie: first seen wins
    assert not majority_correct([None, None], [False, False])
    assert maj_at_k([["4", "5", "5"], ["1", "1", "2"]], [[True, False, False], [True, True, False]], 3) == 0.5


def test_wilson_interval_hand_values():
    ci = wilson_interval(8, 10)  # p=.8, z=1.96: centre .71674, half-width .22657
    assert (round(ci.low, 4), round(ci.high, 4)) == (0.4902, 0.9433)
    ci = wilson_interval(0, 10)  # z^2/(n+z^2) = 3.8415/13.8415
    assert ci.low == pytest.approx(0.0, abs=1e-12) and round(ci.high, 4) == 0.2775
    ci = wilson_interval(10, 10)
    assert round(ci.low, 4) == 0.7225 and ci.high == pytest.approx(1.0)
    assert wilson_interval(0, 0) == wilson_interval(0, 0).__class__(0.0, 1.0)


def test_summarize_with_k():
    m = summarize([[True, False], [False, False]], [[True, True], [True, False]], [["1", "2"], ["3", None]], k=2)
    assert m["accuracy"] == 0.25 and m["unparseable"] == 0.25
    assert m["pass@2"] == 0.5 and m["maj@2"] == 0.5  # problem 1: tie "1" vs "2", "1" first and correct
    assert m["n_problems"] == 2 and m["n_samples"] == 4
    assert 0 <= m["ci_low"] <= m["accuracy"] <= m["ci_high"] <= 1
