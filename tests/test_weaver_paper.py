"""Weaver the paper's way (issue 23): the class balance from a stated budget of labels (or a stated prior) that the
policy's later outputs cannot move, quality / imbalance / correlation filters, quantile normalisation with fitted
thresholds over a fixed reference pool, bounded and logged refits, majority and format outside the label model,
and the diagnostics that tell a collapse from learning.

Synthetic verifiers of known TPR/FPR vote through a test-only rule (their votes are written into the response
text, as in tests/test_weaver.py); the gold correctness is the text's last character, read by a test-only
environment that only checks and extracts. The learned arithmetic verifiers are run in-process at the end.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.envs.base import Check
from rlexp.rewards.label_model import BinaryLabelModel
from rlexp.rewards.registry import build_reward
from rlexp.rewards.verifiers.base import Rule, register_rule
from rlexp.run.controller import zero_adv_warning
from rlexp.types import Problem, Sample


def simulate_votes(y: np.ndarray, rates: list[tuple[float, float]], rng: np.random.Generator) -> np.ndarray:
    p = np.where(y[:, None], [r[0] for r in rates], [r[1] for r in rates])
    return (rng.random((len(y), len(rates))) < p).astype(np.float64)


@register_rule("paper_vote")
class VoteFromText(Rule):
    """Test-only verifier: the synthetic response text carries each verifier's 0/1 vote as a digit."""

    def __init__(self, index: int) -> None:
        self.index = int(index)

    def check(self, problem: Problem, text: str) -> float:
        return float(text[self.index])


GOOD = [(0.9, 0.1), (0.8, 0.2), (0.75, 0.25), (0.7, 0.3)]


class LastCharEnv:
    """Test-only environment: a response is right when its last character is "1"; its answer is that character."""

    name = "last_char"

    def check(self, sample: Sample, text: str) -> Check:
        return Check(correct=text[-1] == "1", parseable=True, extracted=text[-1])

    def extract(self, problem: Problem, text: str) -> str | None:
        return text[-1] if text[-1] in "01" else None


def cfg(n: int, **options) -> RewardConfig:
    return RewardConfig(name="weaver", options=options, verifiers=[
        VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "paper_vote", "index": i}) for i in range(n)])


def batch(rng, rates, n_groups, group, prior):
    y = rng.random(n_groups * group) < prior
    votes = simulate_votes(y, rates, rng).astype(int)
    texts = ["".join(map(str, row)) + ("1" if c else "0") for row, c in zip(votes, y)]
    samples = [Sample(Problem(id=f"p{g}", prompt=f"problem {g}"), answer="1") for g in range(n_groups)
               for _ in range(group)]
    return samples, texts, y


PAPER = dict(class_balance="dev", dev_labels=200, reference_groups=64, normalise="quantile", fit_thresholds=True)


def test_class_balance_comes_from_the_dev_budget_and_the_policy_cannot_move_it():
    """The reference pool is 30% right; then the policy collapses to 5% right answers on which the verifiers
    agree (they accept each other's favourite). Label-free, the prior follows the policy's own outputs; with dev
    labels it stays at the labelled share, and exactly the budget of labels is read, all in the reference steps."""
    rng = np.random.default_rng(0)
    env = LastCharEnv()
    paper = build_reward(cfg(4, **PAPER), env)
    free = build_reward(cfg(4, window_groups=64), env)
    asked = []
    for step in range(6):
        prior = 0.3 if step < 2 else 0.05
        s, t, y = batch(rng, GOOD, 32, 16, prior)
        asked.append(len(paper.label_request(len(t), 16)))
        out, out_free = paper.score(s, t, 16), free.score(s, t, 16)
    assert asked[0] == 200 and sum(asked) == 200 and out.metrics["weaver/dev_labels"] == 200
    assert abs(out.metrics["weaver/class_balance"] - 0.3) < 0.07
    assert out.metrics["weaver/prior"] == pytest.approx(out.metrics["weaver/class_balance"])
    assert abs(out_free.metrics["weaver/prior"] - 0.05) < 0.05  # the label-free fit follows the collapse
    r = np.array(out.rewards)
    assert r[y].mean() > r[~y].mean() + 0.3


@register_rule("test_score")
class ScoreFromText(Rule):
    """Test-only verifier: the response text carries each verifier's continuous score, comma-separated."""

    def __init__(self, index: int) -> None:
        self.index = int(index)

    def check(self, problem: Problem, text: str) -> float:
        return float(text.split(",")[self.index])


def test_fitted_thresholds_give_each_verifier_the_class_balance_on_the_pool():
    """Continuous scores (a shifted normal per class, separations 2.0 down to 0.5, on scales of their own)."""
    rng = np.random.default_rng(1)
    c = RewardConfig(name="weaver", options=PAPER, verifiers=[
        VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "test_score", "index": i}) for i in range(4)])
    reward = build_reward(c, LastCharEnv())
    y = rng.random(64 * 16) < 0.3
    scores = [(rng.normal(size=len(y)) + sep * y) * scale for sep, scale in ((2.0, 1), (1.5, 10), (1.0, 0.1), (0.5, 3))]
    t = [",".join(f"{sc[k]:.4f}" for sc in scores) + ("," + ("1" if y[k] else "0")) for k in range(len(y))]
    s = [Sample(Problem(id=f"p{k // 16}", prompt="q"), answer="1") for k in range(len(y))]
    out = reward.score(s, t, 16)
    prior = out.metrics["weaver/class_balance"]
    for i in range(4):
        assert abs(out.metrics[f"weaver/v{i}/pos_rate"] - prior) < 0.01, (i, out.metrics[f"weaver/v{i}/pos_rate"])
        assert f"weaver/v{i}/threshold" in out.metrics and f"weaver/v{i}/dev_tpr" in out.metrics


def test_a_stated_prior_is_held_and_needs_no_labels():
    rng = np.random.default_rng(2)
    reward = build_reward(cfg(4, class_balance="prior", prior=0.25, reference_groups=32), LastCharEnv())
    for _ in range(3):
        s, t, _ = batch(rng, GOOD, 32, 16, 0.05)
        assert reward.label_request(len(t), 16) == []
        out = reward.score(s, t, 16)
    assert out.metrics["weaver/prior"] == pytest.approx(0.25) and out.metrics["weaver/dev_labels"] == 0


def test_a_class_balance_below_the_label_models_bound_is_one_number_everywhere():
    """A stated prior of 0.004 (or 0 correct of 256 dev labels) is held at the label model's lower bound, 0.01, in
    the thresholds, the filters and the logged balance alike: before, the model used 0.01 and the rest 0.004."""
    rng = np.random.default_rng(3)
    reward = build_reward(cfg(4, class_balance="prior", prior=0.004, reference_groups=32), LastCharEnv())
    for _ in range(3):
        s, t, _ = batch(rng, GOOD, 32, 16, 0.05)
        out = reward.score(s, t, 16)
    assert out.metrics["weaver/class_balance"] == pytest.approx(0.01)
    assert out.metrics["weaver/prior"] == pytest.approx(0.01)


def test_filters_drop_random_imbalanced_and_duplicate_verifiers(caplog):
    rng = np.random.default_rng(3)
    # v4: no signal (TPR = FPR); v5: says yes 95% of the time; v6: v0's votes again (correlation 1).
    rates = [*GOOD, (0.5, 0.5), (0.95, 0.95)]
    opts = dict(PAPER, fit_thresholds=False, normalise="minmax", min_quality=0.1, max_imbalance=0.4,
                max_correlation=0.9)
    c = cfg(len(rates), **opts)
    c.verifiers.append(VerifierConfig(name="v0_again", kind="rule", options={"rule": "paper_vote", "index": 0}))
    reward = build_reward(c, LastCharEnv())
    s, t, _ = batch(rng, rates, 64, 16, 0.3)
    with caplog.at_level(logging.WARNING, logger="rlexp.rewards.weaver"):
        reward.score(s, t, 16)
    assert "below min_quality" in reward.dropped["v4"]
    assert "from the class balance" in reward.dropped["v5"]
    assert "correlate" in reward.dropped["v0_again"] and "'v0'" in reward.dropped["v0_again"]
    assert reward.active == ["v0", "v1", "v2", "v3"]
    assert "dropping verifier 'v0_again'" in caplog.text


def test_without_labels_quality_is_judged_by_the_fit():
    rng = np.random.default_rng(4)
    reward = build_reward(cfg(5, class_balance="prior", prior=0.3, min_quality=0.1), LastCharEnv())
    s, t, _ = batch(rng, [*GOOD, (0.5, 0.5)], 64, 16, 0.3)
    reward.score(s, t, 16)
    assert "estimated TPR - FPR" in reward.dropped["v4"] and "v0" in reward.active


def test_fit_once_then_bounded_logged_refits(caplog):
    rng = np.random.default_rng(5)
    once = build_reward(cfg(4, **PAPER), LastCharEnv())
    slow = build_reward(cfg(4, **PAPER, refit_every=1, max_change=0.02), LastCharEnv())
    s, t, _ = batch(rng, GOOD, 64, 16, 0.3)
    once.score(s, t, 16), slow.score(s, t, 16)
    start = slow.params.tpr.copy()
    fixed = once.params.tpr.copy()
    worse = [(0.6, 0.5), (0.55, 0.5), (0.9, 0.1), (0.7, 0.3)]  # v0 and v1 got much worse on the new outputs
    with caplog.at_level(logging.WARNING, logger="rlexp.rewards.weaver"):
        for _ in range(3):
            s, t, _ = batch(rng, worse, 64, 16, 0.3)
            a, b = once.score(s, t, 16), slow.score(s, t, 16)
    assert np.array_equal(once.params.tpr, fixed) and a.metrics["weaver/refit"] == 0.0  # fit once
    moved = np.abs(slow.params.tpr - start)
    assert moved.max() <= 3 * 0.02 + 1e-9 and moved[0] > 0.03  # moved, three bounded steps
    assert b.metrics["weaver/refit_bounded"] == 1.0 and "bounded to +-0.02" in caplog.text


def test_majority_and_format_as_gate_term_or_off():
    rng = np.random.default_rng(6)
    env = LastCharEnv()
    verifiers = [VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "paper_vote", "index": i})
                 for i in range(4)]
    verifiers += [VerifierConfig(name="majority", kind="majority"), VerifierConfig(name="format", kind="format")]
    s, t, _ = batch(rng, GOOD, 16, 8, 0.3)
    t = [x if i % 5 else x[:-1] + "?" for i, x in enumerate(t)]  # every fifth: no readable answer
    inside = build_reward(RewardConfig(name="weaver", verifiers=verifiers, options={}), env)
    inside.score(s, t, 8)
    assert {"majority", "format"} <= set(inside.active)  # today's model: votes in the label model
    gated = build_reward(RewardConfig(name="weaver", verifiers=verifiers,
                                      options={"majority_as": "off", "format_as": "gate"}), env)
    out = gated.score(s, t, 8)
    assert gated.active == ["v0", "v1", "v2", "v3"] and "kept out" in gated.dropped["majority"]
    fmt = [d["votes"]["format"] for d in out.details]
    assert all(r == 0.0 for r, f in zip(out.rewards, fmt) if f == 0)
    term = build_reward(RewardConfig(name="weaver", verifiers=verifiers,
                                     options={"majority_as": "term", "format_as": "off", "term_weight": 0.2}), env)
    out = term.score(s, t, 8)
    assert all(0.0 <= r <= 1.0 for r in out.rewards) and term.active == ["v0", "v1", "v2", "v3"]
    maj = np.array([d["votes"]["majority"] for d in out.details])
    post = np.array(out.rewards)
    assert post[maj == 1].min() >= 0.2 - 1e-9 or post[maj == 1].mean() > post[maj == 0].mean()


def test_diagnostics_and_the_progress_warning():
    rng = np.random.default_rng(7)
    reward = build_reward(cfg(4, **PAPER, warn_zero_adv=0.5), LastCharEnv())
    s, t, _ = batch(rng, GOOD, 32, 16, 0.3)
    m = reward.score(s, t, 16).metrics
    for k in ("weaver/est_correct_share", "weaver/class_balance", "weaver/top_answer_share", "weaver/flat_group_frac",
              "weaver/v0/tpr", "weaver/v0/fpr", "weaver/dev_correct_share", "weaver/zero_adv_warn_at"):
        assert k in m and np.isfinite(m[k]), k
    assert 0.5 <= m["weaver/top_answer_share"] <= 1.0  # two possible answers per group
    assert zero_adv_warning(m) == ""
    assert "WARNING: 94% of groups have zero advantage (> 50%)" in zero_adv_warning(
        {**m, "weaver/flat_group_frac": 0.94})
    assert zero_adv_warning({"reward/mean": 1.0}) == ""  # rewards that state no limit never warn


def test_paper_state_round_trip():
    rng = np.random.default_rng(8)
    batches = [batch(rng, GOOD, 32, 8, 0.3) for _ in range(4)]
    opts = dict(PAPER, reference_groups=48, refit_every=1)
    a = build_reward(cfg(4, **opts), LastCharEnv())
    for s, t, _ in batches[:3]:
        a.score(s, t, 8)
    state = json.loads(json.dumps(a.state_dict()))
    b = build_reward(cfg(4, **opts), LastCharEnv())
    b.load_state_dict(state)
    out_a, out_b = a.score(*batches[3][:2], 8), b.score(*batches[3][:2], 8)
    assert np.allclose(out_a.rewards, out_b.rewards) and out_a.metrics == pytest.approx(out_b.metrics)


def test_dev_labels_without_gold_say_how_to_fix():
    reward = build_reward(cfg(4, **PAPER), LastCharEnv())
    problems = [Problem(id="p", prompt="q")] * 4
    with pytest.raises(ValueError, match=r"no gold answers.*class_balance=estimate or prior"):
        reward.score(problems, ["00001", "11111", "00000", "10101"], 4)


@pytest.mark.parametrize("options,match", [
    ({"class_balance": "dev"}, "dev_labels"),
    ({"class_balance": "prior", "prior": 1.0}, "prior=1.0"),
    ({"dev_labels": 5}, "only read with class_balance=dev"),
    ({"refit_every": 5}, "needs a reference pool"),
    ({"fit_thresholds": True}, "must be known"),
    ({"majority_as": "vote"}, "model|gate|term|off"),
    ({"normalise": "rank"}, "minmax|quantile"),
    ({"weighting": "weighted"}, "posterior|quality|logodds"),
    ({"dev_in_fit": True}, "set class_balance=dev"),
])
def test_paper_option_errors(options, match):
    with pytest.raises(ValueError, match=match):
        build_reward(cfg(3, **options), LastCharEnv())


def test_a_rare_correct_class_keeps_its_verifiers():
    """A starting policy right 1.5% of the time (a random-init one): with the class balance known, each verifier
    is thresholded to say yes ~1.5% of the time, which the fixed band (0.02, 0.99) would call "no signal"; the
    imbalance filter against the class balance is what applies, so the label model keeps them (pilot, issue 23)."""
    rng = np.random.default_rng(10)
    y = rng.random(64 * 16) < 0.015
    scores = [(rng.normal(size=len(y)) + 3.0 * y) for _ in range(4)]
    t = [",".join(f"{sc[k]:.4f}" for sc in scores) + ("," + ("1" if y[k] else "0")) for k in range(len(y))]
    s = [Sample(Problem(id=f"p{k // 16}", prompt="q"), answer="1") for k in range(len(y))]
    c = RewardConfig(name="weaver", options={**PAPER, "drop_band": [0.02, 0.99], "max_imbalance": 0.4},
                     verifiers=[VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "test_score", "index": i})
                                for i in range(4)])
    reward = build_reward(c, LastCharEnv())
    out = reward.score(s, t, 16)
    assert reward.active == ["v0", "v1", "v2", "v3"] and out.metrics["weaver/fallback"] == 0.0
    r = np.array(out.rewards)
    assert r[y].mean() > r[~y].mean() + 0.3


def _texts(votes: np.ndarray, y: np.ndarray) -> tuple[list[Sample], list[str]]:
    texts = ["".join(map(str, row.astype(int))) + ("1" if c else "0") for row, c in zip(votes, y)]
    return [Sample(Problem(id=f"p{k // 16}", prompt="q"), answer="1") for k in range(len(y))], texts


def test_a_refit_that_changes_the_verifier_set_is_still_bounded(caplog):
    """v4 votes 0 on the whole pool (dropped: constant) and then starts voting, while v0 gets much worse: the refit
    that lets v4 back in must still hold v0's TPR within max_change (it used to skip the bound when the set
    changed)."""
    rng = np.random.default_rng(7)
    reward = build_reward(cfg(5, **PAPER, refit_every=1, max_change=0.02), LastCharEnv())
    y = rng.random(64 * 16) < 0.3
    pool_votes = np.concatenate([simulate_votes(y, GOOD, rng), np.zeros((len(y), 1))], axis=1)
    reward.score(*_texts(pool_votes, y), 16)
    assert "v4" in reward.dropped and reward.active == ["v0", "v1", "v2", "v3"]
    before = dict(zip(reward.fit_names, reward.params.tpr))
    y = rng.random(64 * 16) < 0.3
    later = simulate_votes(y, [(0.55, 0.5), *GOOD[1:], (0.8, 0.2)], rng)
    with caplog.at_level(logging.WARNING, logger="rlexp.rewards.weaver"):
        reward.score(*_texts(later, y), 16)
    assert "v4" in reward.active  # the set changed at this refit
    after = dict(zip(reward.fit_names, reward.params.tpr))
    assert all(abs(after[n] - before[n]) <= 0.02 + 1e-9 for n in before), (before, after)
    assert "v0/tpr by" in caplog.text


def test_min_quality_still_filters_when_every_dev_label_is_the_same():
    """Dev labels of one class give no TPR/FPR: the no-signal verifier is then judged by the fit, not kept."""
    rng = np.random.default_rng(8)
    reward = build_reward(cfg(5, **dict(PAPER, dev_labels=4, fit_thresholds=False, normalise="minmax"),
                              min_quality=0.1), LastCharEnv())
    y = rng.random(64 * 16) < 0.3
    want = reward.label_request(len(y), 16)
    y[want] = False  # the four labelled responses happen to be wrong
    votes = simulate_votes(y, [*GOOD, (0.5, 0.5)], rng)
    reward.score(*_texts(votes, y), 16)
    assert reward.dev_labels == [False] * 4 and not reward.dev_informative
    assert "estimated TPR - FPR" in reward.dropped["v4"] and "v0" in reward.active


def test_dev_labels_are_only_read_for_responses_the_pool_keeps():
    """The pool is 40 groups, a batch 32: on the second step only the first 8 groups enter it, so the labels asked
    for then all lie among their 128 responses, and every labelled response is one of the pool's."""
    rng = np.random.default_rng(9)
    reward = build_reward(cfg(4, **dict(PAPER, dev_labels=600, reference_groups=40)), LastCharEnv())
    asked = []
    for _ in range(3):
        s, t, _ = batch(rng, GOOD, 32, 16, 0.3)
        asked.append(reward.label_request(len(t), 16))
        reward.score(s, t, 16)
    assert len(asked[0]) == 512 and len(asked[1]) == 88 and max(asked[1]) < 8 * 16 and asked[2] == []
    pool = {tuple(r) for g in reward.pool for r in g}
    assert len(reward.dev_labels) == 600 and all(tuple(r) in pool for r in reward.dev_scores)


class DigitEnv:
    """Test-only environment: the response's last character is its answer, right when it equals the gold digit."""

    name = "digit"

    def check(self, sample: Sample, text: str) -> Check:
        return Check(correct=text[-1] == sample.answer, parseable=True, extracted=text[-1])

    def extract(self, problem: Problem, text: str) -> str | None:
        return text[-1]


def biased_batch(rng, n_groups, group, answers, p_right=0.3):
    """Scores: each verifier separates right from wrong by 1.5 (unit normals), and the first three add +2 to the
    answer "8" whatever the question (the bias studies/weaver/results/weaver_panels.md measured on the tiny
    verifiers)."""
    gold = rng.integers(0, 10, n_groups)
    samples, texts, y, resp = [], [], [], []
    for g in range(n_groups):
        for _ in range(group):
            a = answers(rng, gold[g], p_right)
            right = a == gold[g]
            s = rng.normal(1.5 * right, 1.0, 4) + np.array([2.0, 2.0, 2.0, 0.0]) * (a == 8)
            samples.append(Sample(Problem(id=f"p{g}", prompt=f"q{g}"), answer=str(gold[g])))
            texts.append(",".join(f"{x:.4f}" for x in s) + f",{a}")
            y.append(right)
            resp.append(a)
    return samples, texts, np.array(y), np.array(resp)


def test_debias_answers_removes_a_verifiers_favourite_answer():
    """The pool: a policy right 30% of the time, its other answers uniform. Then it collapses onto "8", which
    three of four verifiers favour whatever the question. Without debiasing every "8" earns nearly full reward
    (no gradient away from the collapse); with per-answer offsets fixed on the pool, a wrong "8" earns less
    than a right one by about what separates right from wrong elsewhere."""
    def starting(rng, g, p):
        return g if rng.random() < p else int(rng.choice([d for d in range(10) if d != g]))

    def collapsed(rng, g, p):
        return 8

    rewards = {}
    for debias in (False, True):
        rng = np.random.default_rng(5)
        c = RewardConfig(name="weaver", options={**PAPER, "debias_answers": debias}, verifiers=[
            VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "test_score", "index": i}) for i in range(4)])
        r = build_reward(c, DigitEnv())
        for _ in range(2):
            s, t, _, _ = biased_batch(rng, 32, 16, starting)
            r.score(s, t, 16)
        assert (r.offsets is not None) == debias
        s, t, y, _ = biased_batch(rng, 32, 16, collapsed)
        out = np.array(r.score(s, t, 16).rewards)
        rewards[debias] = (out[y].mean(), out[~y].mean())
        if debias:  # the offsets are what the pool measured: +2 on "8" for the biased three, ~0 otherwise
            assert r.offsets["8"][:3] == pytest.approx([1.8, 1.8, 1.8], abs=0.4)
            assert abs(r.offsets["8"][3]) < 0.4 and abs(r.offsets["3"][0]) < 0.6
            state = r.state_dict()
            again = build_reward(c, DigitEnv())
            again.load_state_dict(json.loads(json.dumps(state)))
            assert again.offsets == r.offsets and again.pool_keys == r.pool_keys
    assert rewards[False][1] > 0.7  # a wrong "8" is rewarded nearly like a right answer (measured 0.76 vs 0.99)
    assert rewards[True][0] - rewards[True][1] > rewards[False][0] - rewards[False][1] + 0.2  # 0.57 vs 0.23
    assert rewards[True][0] - rewards[True][1] > 0.4
    assert rewards[True][1] < rewards[False][1] - 0.4


def test_debias_answers_needs_a_pool():
    with pytest.raises(ValueError, match=r"debias_answers.*reference_groups > 0"):
        build_reward(RewardConfig(name="weaver", options={"debias_answers": True}, verifiers=[
            VerifierConfig(name="v0", kind="rule", options={"rule": "test_score", "index": 0})]), DigitEnv())


# --- weighting: the label model's estimated rates as weights on the continuous scores
# (studies/weaver/results/weaver_label_model.md)
def _one_strong_panel(rng: np.random.Generator, n: int, prior: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """One strong verifier (classes 2.5 sd apart) and four weak ones (0.3 sd): continuous scores, then labels."""
    y = rng.random(n) < prior
    seps = (2.5, 0.3, 0.3, 0.3, 0.3)
    return np.stack([rng.normal(size=n) + sep * y for sep in seps], axis=1), y


def _score_texts(scores: np.ndarray, y: np.ndarray) -> list[str]:
    return [",".join(f"{x:.4f}" for x in row) + ("," + ("1" if c else "0")) for row, c in zip(scores, y)]


def _score_cfg(**options) -> RewardConfig:
    return RewardConfig(name="weaver", options={**PAPER, **options}, verifiers=[
        VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "test_score", "index": i}) for i in range(5)])


def _fitted(weighting: str | None, pool: tuple[np.ndarray, np.ndarray], **options):
    reward = build_reward(_score_cfg(**({"weighting": weighting} if weighting else {"combine": "mean"}), **options),
                          LastCharEnv())
    scores, y = pool
    s = [Sample(Problem(id=f"p{k // 16}", prompt="q"), answer="1") for k in range(len(y))]
    out = reward.score(s, _score_texts(scores, y), 16)
    return reward, out


def _rank(reward, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
    s = [Sample(Problem(id="q", prompt="q"), answer="1")] * len(y)
    return np.array(reward.score(s, _score_texts(scores, y), len(y)).rewards)


def test_weighting_ranks_by_the_strong_verifiers_score_where_the_posterior_and_the_mean_do_not(caplog):
    """One strong and four weak verifiers. A right answer the strong verifier scores at its 99th percentile against
    a wrong one it scores just above its threshold, the weak ones saying yes to the wrong one (just above their
    thresholds) and no to the right one (just below): the binary posterior sees the same strong vote and four more
    yes votes for the wrong answer, the unweighted mean lets four weak verifiers outvote the strong one; the label
    model's own estimate of TPR - FPR, put on the continuous scores, ranks the right one first."""
    rng = np.random.default_rng(11)
    pool = _one_strong_panel(rng, 64 * 16)
    with caplog.at_level(logging.INFO, logger="rlexp.rewards.weaver"):
        quality, out = _fitted("quality", pool)
    posterior, _ = _fitted("posterior", pool)
    mean, _ = _fitted(None, pool)
    assert "weights on the normalised scores (weighting=quality)" in caplog.text
    w = {f"v{i}": out.metrics[f"weaver/v{i}/weight"] for i in range(5)}
    assert w["v0"] > 2 * max(w[f"v{i}"] for i in range(1, 5)), w
    cut = 1 - out.metrics["weaver/class_balance"]  # each threshold sits at this quantile of the pool
    q = lambda i, a: float(np.quantile(pool[0][:, i], a))  # noqa: E731
    right = [q(0, 0.99)] + [q(i, cut - 0.05) for i in range(1, 5)]
    wrong = [q(0, cut + 0.05)] + [q(i, cut + 0.05) for i in range(1, 5)]
    pair, y = np.array([right, wrong]), np.array([True, False])
    r_q, r_p, r_m = (_rank(r, pair, y) for r in (quality, posterior, mean))
    assert r_q[0] > r_q[1], r_q
    assert r_p[0] <= r_p[1], r_p  # the old output: the wrong answer first
    assert r_m[0] <= r_m[1], r_m
    assert r_q.min() >= 0.0 and r_q.max() <= 1.0  # a weighted mean of normalised scores


def test_weighting_selects_better_than_the_posterior_and_the_mean_with_one_right_answer_in_ten():
    """The regime of the static best-of-10 (studies/weaver/results/weaver_label_model.md): groups of 10 with one
    right answer, one strong verifier (1.5 sd), three moderate (1.0 sd), one weak (0.2 sd). Binarised at the
    class balance (0.1) most responses vote all-no and the posterior ties them; the mean lets the weak one
    dilute the rest; the weighted output selects the right answer more often than both (expected accuracy, ties split).
    Not asserted: with one strong verifier and only near-noise ones the label model's rates are unreliable in
    this regime (it needs three informative verifiers), and no weighting is reliably better than another."""
    rng = np.random.default_rng(12)
    seps = (1.5, 1.0, 1.0, 1.0, 0.2)

    def groups(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.zeros(n * 10, dtype=bool)
        y[rng.integers(0, 10, n) + 10 * np.arange(n)] = True
        return np.stack([rng.normal(size=len(y)) + sep * y for sep in seps], axis=1), y

    pool, (test_scores, test_y) = groups(100), groups(400)
    acc = {}
    for name in ("quality", "logodds", "posterior", None):
        reward = build_reward(_score_cfg(**({"weighting": name} if name else {"combine": "mean"}),
                                         reference_groups=100), LastCharEnv())
        s = [Sample(Problem(id=f"p{k // 10}", prompt="q"), answer="1") for k in range(len(pool[1]))]
        reward.score(s, _score_texts(*pool), 10)
        s = [Sample(Problem(id=f"t{k // 10}", prompt="q"), answer="1") for k in range(len(test_y))]
        r = np.array(reward.score(s, _score_texts(test_scores, test_y), 10).rewards).reshape(-1, 10)
        top = np.isclose(r, r.max(axis=1, keepdims=True), rtol=0, atol=1e-12)
        acc[name or "mean"] = float(((top & test_y.reshape(-1, 10)).sum(1) / top.sum(1)).mean())
    for name in ("quality", "logodds"):
        assert acc[name] > acc["posterior"] + 0.05 and acc[name] > acc["mean"] + 0.02, acc


def test_weighting_with_too_few_verifiers_falls_back_to_the_plain_mean_of_scores():
    rng = np.random.default_rng(13)
    scores, y = _one_strong_panel(rng, 64 * 16)
    reward, out = _fitted("quality", (scores, y), min_active=6)
    assert out.metrics["weaver/fallback"] == 1.0
    norm = reward._normaliser(np.concatenate(reward.pool, axis=0))(np.round(scores, 4))  # as the texts carry them
    assert np.allclose(out.rewards, norm.mean(axis=1))


def test_weaver_paper_config_uses_the_weighting_chosen_on_panel_a():
    """reward=weaver_paper's output is the one studies/weaver/weaver_label_diag.py chose on panel A's reference pool;
    verifier_mean / verifier_vote inherit it and ignore it (combine=mean|vote)."""
    from omegaconf import OmegaConf

    from rlexp.config.paths import CONF_DIR

    assert OmegaConf.load(CONF_DIR / "reward" / "weaver_paper.yaml").options.weighting == "quality"
    json_path = Path(__file__).resolve().parents[1] / "studies/weaver/results/weaver_label_model.json"
    if json_path.exists():
        assert json.loads(json_path.read_text())["default_weighting"] == "quality"


def _correlated_panel(rng: np.random.Generator, n: int, prior: float = 0.35) -> tuple[np.ndarray, np.ndarray]:
    """One independent strong verifier (TPR 0.85, FPR 0.09) and three that say yes together on the same 40% of the
    wrong responses: conditional independence fails, and the unlabelled fit takes the trio's agreement for truth."""
    y = rng.random(n) < prior
    shared = rng.random(n) < 0.4
    strong = np.where(y, rng.random(n) < 0.85, rng.random(n) < 0.09)
    trio = [np.where(y, rng.random(n) < 0.6, shared & (rng.random(n) < 0.9)) for _ in range(3)]
    return np.stack([strong, *trio], axis=1).astype(np.float64), y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_labelled_responses_pull_the_label_models_rates_towards_the_truth(seed):
    """dev_in_fit's core: responses of known class enter EM with that class fixed. With 256 of 2048 labelled the
    estimates move towards the true rates; with most rows labelled they are the true rates."""
    rng = np.random.default_rng(seed)
    votes, y = _correlated_panel(rng, 2048)
    true = np.array([[votes[y, i].mean(), votes[~y, i].mean()] for i in range(4)])
    lm = BinaryLabelModel()

    def error(labelled: int) -> float:
        lab = rng.choice(len(y), labelled, replace=False)
        rest = np.setdiff1d(np.arange(len(y)), lab)
        p = lm.fit(votes[rest], prior=float(y.mean()), labelled=(votes[lab], y[lab]) if labelled else None)
        return float(np.abs(np.stack([p.tpr, p.fpr], axis=1) - true).max()), float(
            np.abs(np.stack([p.tpr, p.fpr], axis=1) - true).sum())

    none, some, most = error(0), error(256), error(1900)
    assert some[1] < none[1] - 0.1  # closer overall
    assert none[0] > 0.3 and most[0] < 0.06  # unlabelled: far off; mostly labelled: the truth


def test_labelled_votes_must_pair_with_labels():
    lm = BinaryLabelModel()
    votes = np.zeros((10, 3))
    with pytest.raises(ValueError, match="must pair up"):
        lm.fit(votes, labelled=(np.zeros((4, 3)), np.zeros(5)))
    with pytest.raises(ValueError, match="must pair up"):
        lm.fit(votes, labelled=(np.zeros((4, 2)), np.zeros(4)))


def test_dev_in_fit_moves_the_dev_rows_from_unlabelled_to_labelled():
    """With dev_in_fit the fit sees each dev-labelled pool response once, with its label, and the rest unlabelled;
    the fitted rates then differ from the fit that uses the labels for the class balance only."""
    rng = np.random.default_rng(11)
    y = rng.random(64 * 16) < 0.35
    votes = _correlated_panel(rng, len(y))[0]
    votes[:, 0] = np.where(y, rng.random(len(y)) < 0.85, rng.random(len(y)) < 0.09)
    fitted = {}
    for dev_in_fit in (False, True):
        reward = build_reward(cfg(4, **dict(PAPER, fit_thresholds=False, normalise="minmax"), dev_in_fit=dev_in_fit),
                              LastCharEnv())
        want = reward.label_request(len(y), 16)
        reward.score(*_texts(votes, y), 16)
        assert reward.dev_rows == want and reward.dev_labels == [bool(y[i]) for i in want]
        unlabelled, labelled = reward._split_dev(votes)
        if dev_in_fit:
            assert len(unlabelled) == len(y) - 200 and np.array_equal(labelled[0], votes[want])
            assert np.array_equal(labelled[1], y[want].astype(float))
        else:
            assert labelled is None and len(unlabelled) == len(y)
        fitted[dev_in_fit] = reward.params
        assert reward.state_dict()["dev_rows"] == want
    assert np.abs(fitted[True].tpr - fitted[False].tpr).max() > 0.02


def test_a_checkpoint_whose_dev_rows_do_not_fit_its_pool_is_refused():
    """A reward state from elsewhere (edited, or another run's) must not index past the pool at the next refit."""
    rng = np.random.default_rng(12)
    reward = build_reward(cfg(4, **dict(PAPER, dev_in_fit=True)), LastCharEnv())
    y = rng.random(64 * 16) < 0.35
    reward.label_request(len(y), 16)
    reward.score(*_texts(simulate_votes(y, GOOD, rng), y), 16)
    state = reward.state_dict()
    fresh = build_reward(cfg(4, **dict(PAPER, dev_in_fit=True)), LastCharEnv())
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert fresh.dev_rows == reward.dev_rows
    state["dev_rows"] = [*state["dev_rows"][:-1], len(y) + 5]
    with pytest.raises(ValueError, match="dev rows"):
        build_reward(cfg(4, **dict(PAPER, dev_in_fit=True)), LastCharEnv()).load_state_dict(state)


def test_debias_answers_on_free_form_math_answers():
    """Issue 46: debias_answers was built for ten digits. On MATH the key is the real MathEnv's extracted answer
    (the last \\boxed{}, spaces removed; no maths normalisation). Three of four verifiers add +2 to the
    answer 1/2 whatever the question; the policy writes it as \\frac{1}{2} or \\frac{1} {2} (one key), as 0.5 (a
    different key: not normalised, so it gets its own offset, ~0 here because no verifier favours that spelling),
    and otherwise gives many distinct answers, each seen fewer than 8 times: those get no offset."""
    from rlexp.config.environment import EnvConfig
    from rlexp.envs.registry import build_env

    env = build_env(EnvConfig(name="math"))  # extract only: no dataset is read
    rng = np.random.default_rng(21)
    golds = [rf"{g}\sqrt{{{g + 1}}}" for g in range(64)]

    def batch(groups: range) -> tuple[list[Sample], list[str], list[bool], list[str]]:
        samples, texts, right, answers = [], [], [], []
        for g in groups:
            for k in range(16):
                u = rng.random()
                ans = (golds[g] if u < 0.3 else [r"\frac{1}{2}", r"\frac{1} {2}"][k % 2] if u < 0.6
                       else "0.5" if u < 0.7 else rf"x_{{{g}}}+{k}")  # the last: many distinct answers
                half = ans.replace(" ", "") == r"\frac{1}{2}"
                s = rng.normal(1.5 * (ans == golds[g]), 1.0, 4) + np.array([2.0, 2.0, 2.0, 0.0]) * half
                samples.append(Sample(Problem(id=f"p{g}", prompt=f"q{g}"), answer=golds[g]))
                texts.append(",".join(f"{x:.4f}" for x in s) + rf", so \boxed{{{ans}}}")
                right.append(ans == golds[g])
                answers.append(ans)
        return samples, texts, right, answers

    c = RewardConfig(name="weaver", options=dict(class_balance="prior", prior=0.3, reference_groups=32,
                                                  normalise="quantile", fit_thresholds=True, debias_answers=True),
                     verifiers=[VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "test_score", "index": i})
                                for i in range(4)])
    r = build_reward(c, env)
    r.score(*batch(range(32))[:2], 16)
    assert r.offsets is not None
    # An offset is the answer's mean score less the pool's; the favour is the biased verifiers' offset less the
    # unbiased one's: +2 less the 30% of the pool that also got it, 1.4 (both spellings, with a space or without:
    # one key). "0.5" shares none of it: its biased-less-unbiased offset is -0.6 (the pool mean it lacks).
    half, point_five = r.offsets[r"\frac{1}{2}"], r.offsets["0.5"]
    assert [h - half[3] for h in half[:3]] == pytest.approx([1.4] * 3, abs=0.35)
    assert r"\frac{1} {2}" not in r.offsets and all(x - point_five[3] < 0 for x in point_five[:3])
    assert not any(k.startswith("x_") for k in r.offsets)  # each distinct answer seen < 8 times: no offset
    assert len(set(r.pool_keys)) > 100  # many distinct answers in the pool
    s, t, right, answers = batch(range(32, 64))
    out = np.array(r.score(s, t, 16).rewards)
    wrong_half = np.array([a.replace(" ", "") == r"\frac{1}{2}" and not y for a, y in zip(answers, right)])
    assert out[np.array(right)].mean() > out[wrong_half].mean() + 0.2  # the favourite answer no longer pays
