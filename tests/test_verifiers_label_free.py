"""The label-free verifier kinds built on answer extraction (format, majority) and the judge's yes/no
normalisation: each reads only what a `Problem` shows."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlexp.config.environment import EnvConfig
from rlexp.envs.registry import build_env
from rlexp.models.tokenizer import CharTokenizer, yes_no_ids
from rlexp.rewards.verifiers.lm_judge import judge_probability
from rlexp.rewards.verifiers.registry import build_verifier
from rlexp.types import Problem


@pytest.fixture(scope="module")
def arithmetic():
    return build_env(EnvConfig(name="arithmetic"))


def test_majority_agrees_with_each_groups_most_common_answer(arithmetic):
    a, b = Problem("1+1", "1+1="), Problem("1+0", "1+0=")
    problems = [a] * 5 + [b] * 4
    texts = ["2", "2", "3", "x", "2", "1", "0", "0", "1"]  # b's group ties between "1" and "0"
    v = build_verifier({"name": "maj", "kind": "majority"}, arithmetic)
    assert v.score(problems, texts).tolist() == [1, 1, 0, 0, 1, 1, 1, 1, 1]
    assert v.score([a] * 3, ["x", "y", "??"]).tolist() == [0, 0, 0]  # nothing parseable: no majority


def test_format_accepts_a_readable_answer_only(arithmetic):
    v = build_verifier({"name": "fmt", "kind": "format"}, arithmetic)
    assert v.score([Problem("p", "1+1=")] * 4, ["2", " 7 ", "22", "two"]).tolist() == [1, 1, 0, 0]


def test_extraction_normalises_equal_answers():
    gsm = build_env(EnvConfig(name="gsm8k"))
    p = Problem("q", "How many?")
    assert gsm.extract(p, "The answer is $1,200.") == gsm.extract(p, "#### 1200") == "1200"
    assert gsm.extract(p, "no number here") is None
    math_env = build_env(EnvConfig(name="math", dataset="tests/fixtures/math.jsonl"))
    assert math_env.extract(p, r"so \boxed{\frac{1}{2} }") == math_env.extract(p, r"\boxed{\frac{1}{2}}")


def test_multiple_choice_answers_are_the_chosen_text(tmp_path):
    from rlexp.envs.multiple_choice import MultipleChoiceEnv

    p = Problem("q", "pick", meta={"choices": {"A": "red", "B": "blue", "C": "red"}})
    env = MultipleChoiceEnv.__new__(MultipleChoiceEnv)  # extraction needs no data
    assert env.answer_format == "multiple_choice"
    assert env.extract(p, "The answer is (A)") == env.extract(p, "The answer is (C)") == "red"
    assert env.extract(p, "The answer is (B)") == "blue"
    assert env.extract(p, "I do not know") is None


def test_yes_no_are_token_sets_and_the_score_is_normalised():
    tok = CharTokenizer()
    yes, no = yes_no_ids(tok)  # a character vocabulary: the first letters stand for the words
    assert sorted(tok.decode([i]) for i in yes) == ["Y", "y"] and sorted(tok.decode([i]) for i in no) == ["N", "n"]
    # Two yes-like and one no-like token: the score sums each side before normalising.
    p = judge_probability([[math.log(0.3), math.log(0.3), math.log(0.2)]], n_yes=2)[0]
    assert p == pytest.approx(0.6 / 0.8)
    assert judge_probability([[-math.inf, -math.inf, -math.inf]], n_yes=2) == [0.5]
    assert np.isclose(judge_probability([[-1000.0, 0.0]], n_yes=1)[0], 0.0)
