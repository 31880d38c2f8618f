"""environment=sort: the fixed held-out split, per-position reward through `reward=rule`, exact-match
accuracy, bad options, and (slow) a short `rlexp train environment=sort`."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from rlexp.config.environment import EnvConfig
from rlexp.config.reward import RewardConfig
from rlexp.envs.registry import build_env
from rlexp.rewards.registry import build_reward
from tests.conftest import metrics, rlexp


def sort_env(**options):
    return build_env(EnvConfig(name="sort", options=options))


def test_split_is_fixed_disjoint_and_covers_every_string():
    env = sort_env()
    train, held = env.train_samples(), env.eval_samples()
    ids_train, ids_held = {s.id for s in train}, {s.id for s in held}
    assert not ids_train & ids_held
    assert len(ids_train | ids_held) == 2 ** 8 and len(held) == 63  # a quarter of each answer's strings
    assert [s.id for s in sort_env().eval_samples()] == [s.id for s in held]  # not a function of the run
    assert all(s.answer == "".join(sorted(s.id)) and s.problem.prompt == f"{s.id}:" for s in held)
    # Training draws the answer uniformly (9 answers for 8 binary digits), never a held-out string.
    drawn = env.sample_batch(9000, random.Random(0))
    assert not {s.id for s in drawn} & ids_held
    counts = Counter(s.answer for s in drawn)
    assert len(counts) == 9 and min(counts.values()) > 850


def test_rule_reward_is_per_position_and_accuracy_is_exact_match():
    env = sort_env()
    sample = next(s for s in env.eval_samples() if s.answer == "00001111")
    reward = build_reward(RewardConfig(name="rule"), env)
    texts = ["00001111", "00000111", "0000111", "11110000", " 0001111", "abc"]
    out = reward.score([sample] * len(texts), texts, 1)
    assert out.rewards == [1.0, 7 / 8, 7 / 8, 0.0, 7 / 8, 0.0]
    assert [d["correct"] for d in out.details] == [True, False, False, False, False, False]
    assert [d["parseable"] for d in out.details] == [True, True, False, True, False, False]
    assert out.metrics["reward/correct_frac"] == pytest.approx(1 / 6)
    assert env.extract(sample.problem, "01010101") == "01010101" and env.extract(sample.problem, "0102") is None


def test_ternary_strings_and_bad_options():
    env = sort_env(length=5, base=3)
    assert len(env.train_samples()) + len(env.eval_samples()) == 3 ** 5
    assert env.eval_samples()[0].answer == "".join(sorted(env.eval_samples()[0].id))
    with pytest.raises(ValueError, match="base <= 10"):
        sort_env(base=11).train_samples()


@pytest.mark.slow
def test_train_environment_sort_three_steps(tmp_path: Path) -> None:
    run = tmp_path / "run"
    rlexp("train", "environment=sort", "steps=3", "eval.every_n_steps=3", "algorithm.prompts_per_step=8",
          "algorithm.group_size=4", "checkpoint.save_final=false", f"hydra.run.dir={run}")
    rows = metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["response/len_mean"] > 1  # 8-token answers are generated (algorithm.max_tokens=8)
    # Partial credit: the mean reward is not the exact-match rate (a random policy hits single positions).
    assert rows[1]["reward/mean"] > 0 and rows[1]["reward/mean"] != rows[1]["reward/correct_frac"]
    assert "eval/accuracy" in rows[3]


def test_a_generation_budget_shorter_than_the_answer_is_refused_before_start():
    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.config.validate import ConfigError
    from rlexp.run.prepare import prepare

    with pytest.raises(ConfigError, match=r"right answer is 10 tokens long.*algorithm.max_tokens=10"):
        prepare(compose_run_config(["environment=sort", "+environment.options.length=10"]))
    assert prepare(compose_run_config(["environment=sort"])).cfg.algorithm.max_tokens == 8
