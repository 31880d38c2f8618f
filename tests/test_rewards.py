"""Reward interface, registry, gold isolation, rule/annotated counting, the arithmetic weak verifiers and the
conf/reward YAMLs."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from rlexp.envs.base import build_env
from rlexp.envs.config import EnvConfig
from rlexp.rewards.base import Reward, register_reward, strip_gold
from rlexp.rewards.config import RewardConfig
from rlexp.rewards.registry import build_reward, reward_names
from rlexp.rewards.verifiers import build_verifier, rule_names
from rlexp.rewards.verifiers.arithmetic import operands
from rlexp.types import Problem, RewardOutput, Sample

CONF = Path(__file__).resolve().parents[1] / "conf" / "reward"


@pytest.fixture(scope="module")
def env():
    return build_env(EnvConfig(name="arithmetic", eval_size=16))


def arithmetic_sample(a: int, b: int) -> Sample:
    return Sample(Problem(id=f"{a}+{b}", prompt=f"{a:02d}+{b:02d}="), answer=str((a + b) % 10))


# --- registry -----------------------------------------------------------------------------------------
def test_registry_lists_builtins_and_rejects_unknown_names(env):
    assert {"rule", "annotated", "single_rm", "weaver"} <= set(reward_names())
    with pytest.raises(ValueError, match=r"unknown reward 'nope'; choose one of \[.*'annotated'.*'weaver'"):
        build_reward(RewardConfig(name="nope"), env)


def test_register_a_new_reward_in_one_class(env):
    @register_reward("test_constant")
    class Constant(Reward):
        needs_gold = False

        def _score(self, problems, texts, group_size):
            return RewardOutput(rewards=[0.25] * len(texts))

    r = build_reward(RewardConfig(name="test_constant"), env)
    assert r.score([arithmetic_sample(1, 2)] * 2, ["3", "4"], group_size=2).rewards == [0.25, 0.25]


# --- gold isolation -----------------------------------------------------------------------------------
def test_label_free_reward_cannot_read_gold(env):
    received = []

    @register_reward("test_cheater")
    class Cheater(Reward):
        needs_gold = False

        def _score(self, problems, texts, group_size):
            received.extend(problems)
            return RewardOutput(rewards=[float(p.answer == t) for p, t in zip(problems, texts)])

    r = build_reward(RewardConfig(name="test_cheater"), env)
    with pytest.raises(AttributeError, match="answer"):
        r.score([arithmetic_sample(1, 2)], ["3"], group_size=1)
    assert received and all(type(p) is Problem and not hasattr(p, "answer") for p in received)


def test_gold_reward_does_receive_samples(env):
    r = build_reward(RewardConfig(name="rule"), env)
    assert r.needs_gold and r.score([arithmetic_sample(1, 2)], ["3"], 1).rewards == [1.0]


def test_gold_smuggled_in_meta_is_refused():
    leaky = Sample(Problem(id="p", prompt="1+2=", meta={"answer": "3"}), answer="3")
    with pytest.raises(ValueError, match="gold-like meta keys"):
        strip_gold([leaky])
    assert strip_gold([Sample(Problem(id="p", prompt="1+2=", meta={"choices": "ABCD"}), answer="3")])[0].id == "p"


def test_batch_shape_is_validated(env):
    r = build_reward(RewardConfig(name="rule"), env)
    with pytest.raises(ValueError, match="2 samples but 1 responses"):
        r.score([arithmetic_sample(1, 2)] * 2, ["3"], 1)
    with pytest.raises(ValueError, match="whole number of groups"):
        r.score([arithmetic_sample(1, 2)] * 3, ["3"] * 3, 2)


# --- rule / annotated ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rule", "annotated"])
def test_rule_and_annotated_count_unparseable_apart_from_wrong(env, name):
    r = build_reward(RewardConfig(name=name), env)
    s = arithmetic_sample(7, 45)  # answer 2
    texts = ["2", " 2\n", "3", "12", "", "two", "9", "2"]
    out = r.score([s] * len(texts), texts, group_size=4)
    assert out.rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert out.metrics["reward/mean"] == pytest.approx(3 / 8)
    assert out.metrics["reward/correct_frac"] == pytest.approx(3 / 8)
    assert out.metrics["reward/unparseable_frac"] == pytest.approx(3 / 8)  # "12", "", "two"
    assert out.metrics["reward/wrong_parseable_frac"] == pytest.approx(2 / 8)  # "3", "9"
    assert out.details[3] == {"correct": False, "parseable": False, "extracted": None}
    json.dumps(out.details)
    assert r.state_dict() == {}
    r.load_state_dict({})
    with pytest.raises(ValueError, match="stateless"):
        r.load_state_dict({"window": []})
    assert ("reward/oracle" in out.metrics) == (name == "annotated")


# --- arithmetic weak verifiers ------------------------------------------------------------------------
# Documented (TPR, FPR) under uniform operands 0..99 and a uniformly random wrong digit.
DOCUMENTED = {
    ("arithmetic_parity", ()): (1.0, 4 / 9),
    ("arithmetic_mod5", ()): (1.0, 1 / 9),
    ("arithmetic_tens_confusion", ()): (0.55, 0.05),
    ("arithmetic_window", (("k", 1),)): (1.0, 2 / 9),
    ("arithmetic_window", (("k", 3),)): (1.0, 6 / 9),
    ("arithmetic_digit_swap", ()): (0.1, 0.1),
    ("arithmetic_format", ()): (1.0, 1.0),
    ("arithmetic_misread", (("operand", "b"), ("pairs", ("69",)))): (0.8, 0.2 / 9),
    ("arithmetic_misread", (("operand", "a"), ("pairs", ("17", "38")))): (0.6, 0.4 / 9),
    ("arithmetic_misread", (("operand", "b"), ("pairs", ("25", "04", "13")))): (0.4, 0.6 / 9),
}


@pytest.mark.parametrize("rule,params", list(DOCUMENTED), ids=[f"{r}{dict(p)}" for r, p in DOCUMENTED])
def test_arithmetic_verifier_rates_match_docstrings_exactly(rule, params):
    """Exhaustive over every operand pair and every response digit: the docstrings' TPR/FPR are exact."""
    v = build_verifier({"name": rule, "kind": "rule", "options": {"rule": rule, **dict(params)}})
    problems, texts, correct = [], [], []
    for a in range(100):
        for b in range(100):
            p = Problem(id=f"{a}+{b}", prompt=f"{a:02d}+{b:02d}=")
            for r in range(10):
                problems.append(p)
                texts.append(str(r))
                correct.append(r == (a + b) % 10)
    scores, correct = v.score(problems, texts), np.array(correct)
    tpr, fpr = DOCUMENTED[(rule, params)]
    assert scores[correct].mean() == pytest.approx(tpr)
    assert scores[~correct].mean() == pytest.approx(fpr)


def test_arithmetic_verifiers_reject_unparseable_and_read_only_the_prompt():
    p = Problem(id="7+45", prompt="07+45=")
    assert operands(p) == (7, 45)
    assert operands(Problem(id="x", prompt="Compute: 3 + 4 =")) == (3, 4)
    for rule in ["arithmetic_parity", "arithmetic_mod5", "arithmetic_tens_confusion", "arithmetic_digit_swap"]:
        v = build_verifier({"kind": "rule", "options": {"rule": rule}})
        assert v.score([p] * 3, ["", "12", "x"]).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="cannot find 'a\\+b='"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_mod5"}}).score(
            [Problem(id="q", prompt="What is the capital of France?")], ["P"])


def test_verifier_config_errors():
    with pytest.raises(ValueError, match="k=0 is the exact oracle"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_window", "k": 0}})
    with pytest.raises(ValueError, match="unknown rule 'nope'; choose one of .*arithmetic_mod5"):
        build_verifier({"kind": "rule", "options": {"rule": "nope"}})
    with pytest.raises(ValueError, match="pairs must be disjoint"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_misread", "pairs": ["69", "96"]}})
    with pytest.raises(ValueError, match="bad options"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_mod5", "k": 2}})
    with pytest.raises(ValueError, match="unknown kind 'oracle'"):
        build_verifier({"kind": "oracle"})
    assert "arithmetic_tens_confusion" in rule_names()


# --- single_rm with a rule verifier -------------------------------------------------------------------
def test_single_rm_with_one_weak_rule_verifier(env):
    r = build_reward(RewardConfig(name="single_rm", options={"kind": "rule", "rule": "arithmetic_mod5"}), env)
    assert not r.needs_gold
    s = arithmetic_sample(7, 45)  # answer 2; mod5 also accepts 7
    out = r.score([s] * 4, ["2", "7", "3", "oops"], group_size=4)
    assert out.rewards == [1.0, 1.0, 0.0, 0.0]
    assert out.metrics["reward/mean"] == 0.5 and out.metrics["single_rm/positive_frac"] == 0.5
    with pytest.raises(ValueError, match="needs options.kind"):
        build_reward(RewardConfig(name="single_rm"), env)


# --- conf/reward YAMLs --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rule", "annotated", "single_rm", "weaver"])
def test_yaml_composes_into_schema_and_scores_arithmetic(env, name):
    cfg = OmegaConf.merge(OmegaConf.structured(RewardConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    assert cfg.name == name
    reward = build_reward(cfg, env)
    rng = random.Random(0)
    samples = [s for s in env.sample_batch(16, rng) for _ in range(8)]
    texts = [s.answer if rng.random() < 0.3 else str(rng.randrange(10)) for s in samples]
    out = reward.score(samples, texts, group_size=8)
    assert len(out.rewards) == len(texts) and "reward/mean" in out.metrics
    if name == "weaver":
        assert out.metrics["weaver/format/dropped"] == 1.0  # a digit-only policy: format check has no signal
        assert out.metrics["weaver/n_active"] == 5
        assert abs(out.metrics["weaver/prior"] - np.mean([t == s.answer for s, t in zip(samples, texts)])) < 0.1
        correct = np.array([t == s.answer for s, t in zip(samples, texts)])
        rewards = np.array(out.rewards)
        assert rewards[correct].mean() > rewards[~correct].mean() + 0.5


def test_default_weaver_yaml_selects_better_than_single_rm_default(env):
    """The CPU-replication claim in miniature: on arithmetic, with a policy right 30% of the time and
    uniformly wrong otherwise, Weaver's top-1 pick per group beats single_rm's (mod5) pick."""
    def load(name):
        return build_reward(OmegaConf.merge(OmegaConf.structured(RewardConfig),
                                            OmegaConf.load(CONF / f"{name}.yaml")), env)

    weaver, single = load("weaver"), load("single_rm")
    rng, nrng, group = random.Random(1), np.random.default_rng(1), 16
    picks = {"weaver": [], "single_rm": []}
    for step in range(8):
        samples = [s for s in env.sample_batch(16, rng) for _ in range(group)]
        texts = [s.answer if rng.random() < 0.3 else str(rng.choice([d for d in range(10) if str(d) != s.answer]))
                 for s in samples]
        correct = np.array([t == s.answer for s, t in zip(samples, texts)]).reshape(-1, group)
        for name, reward in [("weaver", weaver), ("single_rm", single)]:
            r = np.array(reward.score(samples, texts, group).rewards).reshape(-1, group)
            if step >= 2:  # let the window fill a little
                pick = (r + 1e-9 * nrng.random(r.shape)).argmax(axis=1)
                picks[name].append(correct[np.arange(len(r)), pick].mean())
    acc = {k: float(np.mean(v)) for k, v in picks.items()}
    assert acc["weaver"] > acc["single_rm"] + 0.1, acc
