"""Golden tests for answer extraction: the hard cases that silently change benchmark scores."""
from __future__ import annotations

import threading
import time

import pytest

from rlexp.envs.answers import (
    boxed_contents,
    check_choice,
    check_math,
    check_math_batch,
    check_number,
    extract_choice,
    last_boxed,
    strip_thinking,
)
from rlexp.envs.verify_pool import VerifyPool


# --- thinking -----------------------------------------------------------------------------------------
def test_thinking_block_with_decoy_answer_is_ignored():
    text = "<think>maybe \\boxed{7}? The answer is (A).</think>Final: \\boxed{\\frac{1}{2}}. The answer is (C)."
    assert last_boxed(text) == "\\frac{1}{2}"
    assert extract_choice(text, 4) == "C"
    assert check_math("\\frac{1}{2}", text).correct
    assert not check_math("7", text).correct


def test_unclosed_think_has_no_answer_and_unopened_close_drops_prefix():
    assert strip_thinking("<think>the answer is \\boxed{3}") == ""
    assert check_math("3", "<think>the answer is \\boxed{3}").parseable is False
    assert strip_thinking("reasoning \\boxed{1}</think> \\boxed{2}") == " \\boxed{2}"


# --- boxed --------------------------------------------------------------------------------------------
def test_nested_braces_kept_whole():
    assert last_boxed("so \\boxed{\\frac{\\sqrt{3}}{2}} done") == "\\frac{\\sqrt{3}}{2}"
    assert boxed_contents("\\boxed{a{b{c}}d}") == ["a{b{c}}d"]


def test_several_boxed_answers_last_one_counts():
    text = "First try \\boxed{3}, wait, correcting: \\boxed{4}"
    assert last_boxed(text) == "4"
    assert check_math("4", text).correct
    assert not check_math("3", text).correct  # listing guesses is not rewarded


def test_truncated_box_is_not_an_answer():
    assert last_boxed("\\boxed{\\frac{1}{2") is None


def test_frac_vs_decimal_and_symbolic_equivalence():
    assert check_math("\\frac{1}{2}", "\\boxed{0.5}").correct
    assert check_math("0.5", "\\boxed{\\dfrac{1}{2}}").correct
    assert check_math("x^2+2x+1", "\\boxed{1 + 2x + x^{2}}").correct
    assert check_math("5\\sqrt{2}", "\\boxed{\\sqrt{50}}").correct
    assert not check_math("\\frac{1}{2}", "\\boxed{0.6}").correct


def test_tuple_is_not_a_thousands_number():
    r = check_math("12", "\\boxed{1,2}")
    assert r.parseable and not r.correct


def test_no_answer_is_unparseable():
    for text in ["I am not sure.", "", "<think>hmm</think>"]:
        r = check_math("4", text)
        assert (r.correct, r.parseable, r.extracted) == (False, False, None)
        assert check_choice("A", text, 4).parseable is False
        assert check_number("4", text).parseable is False


def test_batch_matches_single_and_is_fast_enough_for_training():
    golds = [str(i % 17) for i in range(300)]
    responses = [f"step... \\boxed{{{(i * 7) % 17}}}" for i in range(300)]
    t = time.perf_counter()
    batch = check_math_batch(golds, responses)
    assert time.perf_counter() - t < 30
    assert [b.correct for b in batch] == [g == r.split("{")[-1].rstrip("}") for g, r in zip(golds, responses)]


# --- numbers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["#### 1,234", "The answer is $1234.", "\\boxed{1234.00}", "Answer: 1234"])
def test_numbers_compare_numerically(text):
    assert check_number("1234", text).correct


def test_number_box_wins_over_hash():
    assert check_number("5", "#### 4 no wait \\boxed{5}").correct


# --- letters ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,letter", [
    ("Reasoning... The answer is (C).", "C"),
    ("so the answer is C", "C"),
    ("Answer: B", "B"),
    ("The correct answer is **(D)**", "D"),
    ("\\boxed{B}", "B"),
    ("After elimination we are left with (A)", "A"),
    ("Options (A) and (B) are wrong.\nC", "C"),
    ("The answer is (B). Hmm, actually the answer is (D).", "D"),
])
def test_letter_patterns(text, letter):
    assert extract_choice(text, 4) == letter


def test_letter_range_depends_on_number_of_choices():
    assert extract_choice("The answer is (J)", 10) == "J"
    assert extract_choice("The answer is (J)", 4) is None
    assert extract_choice("the answer is a prime number", 4) is None  # lowercase article, not a letter
    assert extract_choice("The answer is Carbon.", 4) is None


def test_choice_check_case_and_gold():
    assert check_choice("c", "The answer is (C)", 4).correct
    assert not check_choice("A", "The answer is (C)", 4).correct


# --- the process pool ---------------------------------------------------------------------------------
def test_pool_works_from_a_thread_and_times_out_without_signals():
    pool = VerifyPool(workers=1, timeout_s=1.0)
    out: dict = {}

    def worker():
        out["r"] = pool.verify_many([("\\boxed{1}", "\\boxed{9^{9^{9^{9}}}}"), ("\\boxed{2}", "\\boxed{1+1}")])

    try:
        t = threading.Thread(target=worker)
        t.start()
        t.join(timeout=120)
        slow, fine = out["r"]
        assert slow.timed_out and not slow.correct
        assert fine.correct and not fine.timed_out  # the replacement worker carries on
        assert pool.n_timeouts == 1
    finally:
        pool.close()
