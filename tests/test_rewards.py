"""Reward interface, registry, gold isolation, rule/annotated counting, the arithmetic weak verifiers and the
conf/reward YAMLs."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from rlexp.config.environment import EnvConfig
from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.envs.registry import build_env
from rlexp.rewards.base import Reward, register_reward, strip_gold
from rlexp.rewards.registry import build_reward, reward_names
from rlexp.rewards.verifiers.arithmetic import terms
from rlexp.rewards.verifiers.registry import build_verifier, rule_names
from rlexp.types import Problem, RewardOutput, Sample

CONF = Path(__file__).resolve().parents[1] / "conf" / "reward"
SETS = CONF.parent / "verifier_set"


def reward_cfg(name: str, verifier_set: str = "arithmetic_rules", **options: object) -> RewardConfig:
    """A reward YAML on the schema with a verifier set's members, as a run composes them (single_rm picks
    mod5 from the rule set: the most accurate single check that never rejects a right answer)."""
    raw = OmegaConf.load(CONF / f"{name}.yaml")
    parts = [OmegaConf.load(CONF / f"{d}.yaml") for d in raw.get("defaults", [])] + [raw]
    cfg = OmegaConf.merge(OmegaConf.structured(RewardConfig), *[{k: v for k, v in x.items() if k != "defaults"}
                                                                 for x in parts])
    cfg = OmegaConf.merge(cfg, {"verifiers": OmegaConf.load(SETS / f"{verifier_set}.yaml").members})
    if name == "single_rm" and verifier_set.startswith("arithmetic_rules") and "verifier" not in options:
        options["verifier"] = "mod5"
    return OmegaConf.merge(cfg, {"options": options})


@pytest.fixture(scope="module")
def env():
    return build_env(EnvConfig(name="arithmetic", eval_size=16))


def arithmetic_sample(*ts: int) -> Sample:
    """A problem of the embedded task, e.g. arithmetic_sample(1, 0, 1) -> "1+0+1=" with answer "2"."""
    text = "+".join(map(str, ts))
    return Sample(Problem(id=text, prompt=f"{text}="), answer=str(sum(ts)))


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
    assert r.score([arithmetic_sample(1, 0, 1)] * 2, ["3", "4"], group_size=2).rewards == [0.25, 0.25]


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
        r.score([arithmetic_sample(1, 0, 1)], ["3"], group_size=1)
    assert received and all(type(p) is Problem and not hasattr(p, "answer") for p in received)


def test_gold_reward_does_receive_samples(env):
    r = build_reward(RewardConfig(name="rule"), env)
    assert r.needs_gold and r.score([arithmetic_sample(1, 0, 1)], ["2"], 1).rewards == [1.0]


def test_gold_smuggled_in_meta_is_refused():
    leaky = Sample(Problem(id="p", prompt="1+2=", meta={"answer": "3"}), answer="3")
    with pytest.raises(ValueError, match="gold-like meta keys"):
        strip_gold([leaky])
    kept = strip_gold([Sample(Problem(id="p", prompt="1+2=", meta={"choices": "ABCD"}), answer="3")])[0]
    assert kept.id == "problem0" and kept.meta == {"choices": "ABCD"}


def test_batch_shape_is_validated(env):
    r = build_reward(RewardConfig(name="rule"), env)
    with pytest.raises(ValueError, match="2 samples but 1 responses"):
        r.score([arithmetic_sample(1, 0, 1)] * 2, ["3"], 1)
    with pytest.raises(ValueError, match="whole number of groups"):
        r.score([arithmetic_sample(1, 0, 1)] * 3, ["3"] * 3, 2)


# --- rule / annotated ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rule", "annotated"])
def test_rule_and_annotated_count_unparseable_apart_from_wrong(env, name):
    r = build_reward(RewardConfig(name=name), env)
    s = arithmetic_sample(1, 0, 0, 1, 0, 0, 0, 0, 0)  # answer 2
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
# Documented (TPR, FPR) under the training distribution of the default task (sum uniform over 0..9, then a
# sequence of nine 0/1 terms uniform among those with that sum) and a uniformly random wrong digit.
DOCUMENTED = {
    ("arithmetic_parity", ()): (1.0, 4 / 9),
    ("arithmetic_mod5", ()): (1.0, 1 / 9),
    ("arithmetic_mod", (("k", 3),)): (1.0, 4 / 15),
    ("arithmetic_mod", (("k", 4),)): (1.0, 8 / 45),
    ("arithmetic_window", (("k", 1),)): (1.0, 0.2),
    ("arithmetic_window", (("k", 2),)): (1.0, 17 / 45),
    ("arithmetic_format", ()): (1.0, 1.0),
    ("arithmetic_misread", (("positions", (9,)),)): (1 / 2, 1 / 18),
    ("arithmetic_misread", (("positions", (1,)), ("read_as", 1))): (1 / 2, 1 / 18),
    ("arithmetic_misread", (("positions", (4, 5)),)): (1 / 3, 2 / 27),
    ("arithmetic_misread", (("positions", (2, 5, 7)), ("read_as", 1))): (1 / 4, 3 / 36),
    ("arithmetic_copy", (("position", 2), ("source", 1))): (2 / 3, 1 / 27),
    ("arithmetic_copy", (("position", 9), ("source", 8))): (2 / 3, 1 / 27),
}


def training_distribution():
    """Every 9-term 0/1 sequence with its probability under `Arithmetic.sample_batch` (uniform sum first)."""
    by_sum: dict[int, list[tuple[int, ...]]] = {}
    for t in itertools.product((0, 1), repeat=9):
        by_sum.setdefault(sum(t), []).append(t)
    return [(t, 1 / (10 * len(seqs))) for seqs in by_sum.values() for t in seqs]


@pytest.mark.parametrize("rule,params", list(DOCUMENTED), ids=[f"{r}{dict(p)}" for r, p in DOCUMENTED])
def test_arithmetic_verifier_rates_match_docstrings_exactly(rule, params):
    """Exhaustive over every term sequence (weighted as in training) and every response digit."""
    v = build_verifier({"name": rule, "kind": "rule", "options": {"rule": rule, **dict(params)}})
    problems, texts, correct, weight = [], [], [], []
    for t, w in training_distribution():
        p = arithmetic_sample(*t).problem
        for r in range(10):
            problems.append(p)
            texts.append(str(r))
            correct.append(r == sum(t))
            weight.append(w if r == sum(t) else w / 9)  # a wrong response is a uniformly random wrong digit
    scores, correct, weight = v.score(problems, texts), np.array(correct), np.array(weight)
    tpr, fpr = DOCUMENTED[(rule, params)]
    assert np.average(scores[correct], weights=weight[correct]) == pytest.approx(tpr)
    assert np.average(scores[~correct], weights=weight[~correct]) == pytest.approx(fpr)


def test_arithmetic_verifiers_parse_every_term_and_reject_unparseable():
    p = arithmetic_sample(1, 0, 1, 1, 0, 0, 1, 0, 1).problem  # sum 5
    assert terms(p) == [1, 0, 1, 1, 0, 0, 1, 0, 1]  # all nine terms, not just the last "a+b="
    assert terms(Problem(id="x", prompt="Compute: 3 + 4 + 2 =")) == [3, 4, 2]
    mod5 = build_verifier({"kind": "rule", "options": {"rule": "arithmetic_mod5"}})
    assert mod5.score([p] * 4, ["5", "0", "1", "6"]).tolist() == [1.0, 1.0, 0.0, 0.0]
    ignore9 = build_verifier({"kind": "rule", "options": {"rule": "arithmetic_misread", "positions": [9]}})
    assert ignore9.score([p] * 2, ["5", "4"]).tolist() == [0.0, 1.0]  # the last term is a 1: it computes 4
    copy21 = build_verifier({"kind": "rule", "options": {"rule": "arithmetic_copy", "position": 2, "source": 1}})
    assert copy21.score([p] * 2, ["5", "6"]).tolist() == [0.0, 1.0]  # reads term 2 (a 0) as term 1 (a 1)
    for rule in ["arithmetic_parity", "arithmetic_mod5", "arithmetic_misread", "arithmetic_copy",
                 "arithmetic_window"]:
        v = build_verifier({"kind": "rule", "options": {"rule": rule}})
        assert v.score([p] * 3, ["", "12", "x"]).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"cannot find 't1\+t2\+\.\.\.\+tn='"):
        mod5.score([Problem(id="q", prompt="What is the capital of France?")], ["P"])
    with pytest.raises(ValueError, match="only 3 terms"):
        ignore9.score([arithmetic_sample(1, 0, 1).problem], ["2"])


def test_arithmetic_verifiers_read_only_the_prompt():
    """Same prompt, different (even wrong) gold: identical scores -- the verifiers never consult the answer."""
    s = arithmetic_sample(1, 1, 0, 0, 1, 0, 0, 0, 0)
    lying = Sample(s.problem, answer="9")
    texts = [str(d) for d in range(10)]
    env = build_env(EnvConfig(name="arithmetic"))
    # (weaver_paper, verifier_mean and verifier_vote read a stated budget of dev labels: tests/test_weaver_paper.py)
    for r in ["weaver", "single_rm"]:
        a = build_reward(reward_cfg(r), env).score([s] * 10, texts, 10)
        b = build_reward(reward_cfg(r), env).score([lying] * 10, texts, 10)
        assert a.rewards == b.rewards


def test_verifier_config_errors():
    with pytest.raises(ValueError, match="k >= 10 is the exact"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_mod", "k": 10}})
    with pytest.raises(ValueError, match="k=0 is the exact oracle"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_window", "k": 0}})
    with pytest.raises(ValueError, match=r"unknown rule 'nope'; choose one of .*arithmetic_mod5"):
        build_verifier({"kind": "rule", "options": {"rule": "nope"}})
    with pytest.raises(ValueError, match="positions must be distinct"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_misread", "positions": [3, 3]}})
    with pytest.raises(ValueError, match="positions must be distinct"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_misread", "positions": [0]}})
    with pytest.raises(ValueError, match="distinct 1-based"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_copy", "position": 2, "source": 2}})
    with pytest.raises(ValueError, match="bad options"):  # the old two-operand misread options are gone
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_misread", "operand": "b", "pairs": ["69"]}})
    with pytest.raises(ValueError, match="bad options"):
        build_verifier({"kind": "rule", "options": {"rule": "arithmetic_mod5", "k": 2}})
    with pytest.raises(ValueError, match="unknown verifier kind 'oracle'; choose one of"):
        build_verifier({"kind": "oracle"})
    assert {"arithmetic_copy", "arithmetic_misread", "arithmetic_mod"} <= set(rule_names())


# --- single_rm with a rule verifier -------------------------------------------------------------------
def test_single_rm_with_one_weak_rule_verifier(env):
    r = build_reward(RewardConfig(name="single_rm", options={"kind": "rule", "rule": "arithmetic_mod5"}), env)
    assert not r.needs_gold
    s = arithmetic_sample(0, 1, 0, 0, 0, 1, 0, 0, 0)  # answer 2; mod5 also accepts 7
    out = r.score([s] * 4, ["2", "7", "3", "oops"], group_size=4)
    assert out.rewards == [1.0, 1.0, 0.0, 0.0]
    assert out.metrics["reward/mean"] == 0.5 and out.metrics["single_rm/positive_frac"] == 0.5
    with pytest.raises(ValueError, match=r"has no reward_model"):
        build_reward(RewardConfig(name="single_rm", verifiers=[VerifierConfig(name="a", kind="format"),
                                                               VerifierConfig(name="b", kind="majority")]), env)
    with pytest.raises(ValueError, match=r"options.verifier='nope' is not in the verifier set"):
        build_reward(reward_cfg("single_rm", verifier="nope"), env)


def test_single_rm_debiases_answers_like_the_other_verifier_arms(env):
    """Issue 46: single_rm with the per-answer debiasing every weaver_paper arm has. mod5 accepts 7 for gold 2, so
    on a pool of 8 "7"s and 8 "3"s (gold 2) the answer "7" is favoured by +0.5 and "3" disfavoured by -0.5; after
    the pool fills those offsets are subtracted, an answer unseen in the pool keeps its score."""
    opts = {"kind": "rule", "rule": "arithmetic_mod5", "debias_answers": True, "reference_groups": 2}
    r = build_reward(RewardConfig(name="single_rm", options=opts), env)
    s = arithmetic_sample(0, 1, 0, 0, 0, 1, 0, 0, 0)  # answer 2
    first = r.score([s] * 8, ["7"] * 4 + ["3"] * 4, group_size=8)
    assert first.rewards == [1.0] * 4 + [0.0] * 4 and first.metrics["single_rm/max_answer_offset"] == 0.0
    filled = r.score([s] * 8, ["7"] * 4 + ["3"] * 4, group_size=8)  # the pool fills: this batch is debiased too
    assert r.offsets == {"7": 0.5, "3": -0.5} and filled.rewards == [0.5] * 8
    out = r.score([s] * 3, ["2", "7", "3"], group_size=3)
    assert out.rewards == [1.0, 0.5, 0.5] and out.metrics["single_rm/max_answer_offset"] == 0.5
    again = build_reward(RewardConfig(name="single_rm", options=opts), env)
    again.load_state_dict(json.loads(json.dumps(r.state_dict())))  # a resumed run keeps the offsets
    assert again.score([s] * 3, ["2", "7", "3"], group_size=3).rewards == out.rewards
    with pytest.raises(ValueError, match=r"set options.reference_groups > 0"):
        build_reward(RewardConfig(name="single_rm", options={**opts, "reference_groups": 0}), env)


# --- conf/reward YAMLs --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rule", "annotated", "single_rm", "weaver"])
def test_yaml_composes_into_schema_and_scores_arithmetic(env, name):
    cfg = reward_cfg(name)
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
        return build_reward(reward_cfg(name), env)

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


@pytest.mark.parametrize("p", [0.1, 0.3, 0.6, 0.9])
def test_default_weaver_estimates_track_truth_on_arithmetic(env, p):
    """The default verifiers are close enough to conditionally independent that the label-free fit tracks
    each one's true accuracy (and the class prior) over a policy's whole course, from 10% to 90% right."""
    reward = build_reward(reward_cfg("weaver"), env)
    rng = random.Random(2)
    for _ in range(3):  # 3 steps x 64 groups x 16: the window (128 groups) holds the last two
        samples = [s for s in env.sample_batch(64, rng) for _ in range(16)]
        texts = [s.answer if rng.random() < p else str(rng.choice([d for d in range(10) if str(d) != s.answer]))
                 for s in samples]
        out = reward.score(samples, texts, group_size=16)
    y = np.array([t == s.answer for s, t in zip(samples, texts)])
    m = out.metrics
    assert abs(m["weaver/prior"] - y.mean()) < 0.06, (m["weaver/prior"], y.mean())
    for name in reward.active:
        votes = np.array([d["votes"][name] for d in out.details])
        assert abs(m[f"weaver/{name}/acc"] - (votes == y).mean()) < 0.1, (name, m[f"weaver/{name}/acc"])
    rewards = np.array(out.rewards)
    assert rewards[y].mean() > rewards[~y].mean() + 0.5
