"""Weaver: the label model recovers known verifier accuracies without labels, beats simple aggregations at
picking the right response, drops signal-free verifiers, and checkpoints its window and fit."""
from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.models.tokenizer import CharTokenizer
from rlexp.rewards.base import Reward
from rlexp.rewards.label_model import BinaryLabelModel, LabelModelParams, triplet_weights
from rlexp.rewards.registry import build_reward
from rlexp.rewards.verifiers.base import Rule, register_rule
from rlexp.types import Problem, Sample

# --- synthetic verifiers of known quality -------------------------------------------------------------
# (TPR, FPR) per verifier, conditionally independent given correctness.
MIXED = [(0.85, 0.15), (0.75, 0.30), (0.70, 0.35), (0.65, 0.40), (0.60, 0.45)]
WITH_ADVERSARY = [*MIXED[:4], (0.30, 0.65)]  # last one is worse than random


def simulate_votes(y: np.ndarray, rates: list[tuple[float, float]], rng: np.random.Generator) -> np.ndarray:
    tpr = np.array([r[0] for r in rates])
    fpr = np.array([r[1] for r in rates])
    p = np.where(y[:, None], tpr, fpr)
    return (rng.random((len(y), len(rates))) < p).astype(np.float64)


def true_accuracy(prior: float, rates: list[tuple[float, float]]) -> np.ndarray:
    return np.array([prior * t + (1 - prior) * (1 - f) for t, f in rates])


@pytest.mark.parametrize("prior,rates", [(0.5, MIXED), (0.2, MIXED), (0.35, WITH_ADVERSARY), (0.2, WITH_ADVERSARY)],
                         ids=["balanced", "prior0.2", "adversary", "prior0.2+adversary"])
def test_label_model_recovers_accuracies_without_labels(prior, rates):
    rng = np.random.default_rng(0)
    y = rng.random(3000) < prior
    votes = simulate_votes(y, rates, rng)
    fit = BinaryLabelModel().fit(votes)
    err = np.abs(fit.accuracy - true_accuracy(prior, rates))
    assert err.max() < 0.05, (err, fit)
    assert abs(fit.prior - prior) < 0.07
    assert np.abs(fit.tpr - [r[0] for r in rates]).max() < 0.1
    assert np.abs(fit.fpr - [r[1] for r in rates]).max() < 0.1
    if rates is WITH_ADVERSARY:  # recognised as anti-correlated, not flipped into a good verifier
        assert fit.tpr[-1] < fit.fpr[-1]


def test_triplet_estimate_matches_moment_identity():
    rng = np.random.default_rng(1)
    prior = 0.3
    y = rng.random(20000) < prior
    votes = simulate_votes(y, WITH_ADVERSARY, rng)
    w = triplet_weights(votes)
    d = np.array([t - f for t, f in WITH_ADVERSARY])
    assert np.allclose(w, np.sqrt(prior * (1 - prior)) * d, atol=0.03)


def test_label_model_is_numerically_safe_with_perfect_verifiers():
    # Two verifiers that never err and one noisy one: rates at 0/1 must not produce inf/NaN posteriors.
    rng = np.random.default_rng(2)
    y = rng.random(500) < 0.4
    votes = np.stack([y, y, rng.random(500) < np.where(y, 0.7, 0.3)], axis=1).astype(float)
    lm = BinaryLabelModel()
    fit = lm.fit(votes)
    post = lm.posterior(votes, fit)
    assert np.isfinite(post).all() and ((post > 0.5) == y).all()
    # A pattern never seen in training (the two perfect verifiers disagree) still gets a finite posterior.
    assert np.isfinite(lm.posterior(np.array([[1.0, 0.0, 1.0]]), fit)).all()


def test_label_model_warm_start_and_serialisation():
    rng = np.random.default_rng(3)
    y = rng.random(2000) < 0.3
    votes = simulate_votes(y, MIXED, rng)
    lm = BinaryLabelModel()
    first = lm.fit(votes)
    again = lm.fit(votes, warm=LabelModelParams.from_dict(json.loads(json.dumps(first.to_dict()))))
    assert again.loglik >= first.loglik - 1e-9
    assert np.allclose(again.accuracy, first.accuracy, atol=1e-3)


# --- top-1 selection -----------------------------------------------------------------------------------
def _argmax_random_ties(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (scores + 1e-9 * rng.random(scores.shape)).argmax(axis=1)


def selection_accuracies(prior_range: tuple[float, float], rates, n_problems=1000, group=8, seed=0):
    """Per-problem correct-rates vary (easy and hard problems); wrong answers share a popular distractor,
    which is what makes answer-level majority vote fail."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(*prior_range, size=n_problems)
    y = rng.random((n_problems, group)) < p[:, None]
    answers = np.where(y, 0, np.where(rng.random(y.shape) < 0.5, 1, rng.integers(2, 10, y.shape)))
    votes = simulate_votes(y.ravel(), rates, rng)
    lm = BinaryLabelModel()
    fit = lm.fit(votes)
    post = lm.posterior(votes, fit).reshape(n_problems, group)
    pick = lambda s: y[np.arange(n_problems), _argmax_random_ties(s, rng)].mean()  # noqa: E731
    counts = np.stack([(answers == a).sum(axis=1) for a in range(10)], axis=1)  # (problems, answers)
    freq = np.take_along_axis(counts, answers, axis=1)  # how often each response's answer occurs
    v = votes.reshape(n_problems, group, len(rates))
    return {
        "weaver": pick(post),
        "verifier_majority": pick(v.sum(axis=2)),
        "answer_majority": pick(freq.astype(float)),
        "best_single": max(pick(v[:, :, i]) for i in range(len(rates))),
        "oracle": y.any(axis=1).mean(),
    }


@pytest.mark.parametrize("prior_range,rates", [((0.05, 0.7), MIXED), ((0.05, 0.35), MIXED),
                                               ((0.05, 0.7), WITH_ADVERSARY)],
                         ids=["mixed", "prior~0.2", "adversary"])
def test_top1_selection_beats_majority_and_best_single(prior_range, rates):
    acc = selection_accuracies(prior_range, rates)
    assert acc["weaver"] > acc["verifier_majority"], acc
    assert acc["weaver"] > acc["answer_majority"], acc
    assert acc["weaver"] > acc["best_single"], acc


# --- the reward end to end ----------------------------------------------------------------------------
@register_rule("test_vote")
class VoteFromText(Rule):
    """Test-only verifier: the synthetic response text carries each verifier's vote as a digit."""

    def __init__(self, index: int) -> None:
        self.index = int(index)

    def check(self, problem: Problem, text: str) -> float:
        return float(text[self.index])


def weaver_cfg(n_verifiers: int, **options) -> RewardConfig:
    return RewardConfig(name="weaver", options=options, verifiers=[
        VerifierConfig(name=f"v{i}", kind="rule", options={"rule": "test_vote", "index": i})
        for i in range(n_verifiers)])


def synthetic_batch(rng, rates, n_groups, group, prior, extra: str = ""):
    y = rng.random(n_groups * group) < prior
    votes = simulate_votes(y, rates, rng).astype(int)
    texts = ["".join(map(str, row)) + extra for row in votes]
    samples = [Sample(Problem(id=f"p{g}", prompt=f"problem {g}"), answer="gold")
               for g in range(n_groups) for _ in range(group)]
    return samples, texts, y


def test_weaver_reward_online_estimates_and_metrics():
    rng = np.random.default_rng(4)
    rates, prior = WITH_ADVERSARY, 0.3
    reward = build_reward(weaver_cfg(len(rates), window_groups=200), env=None)
    for _ in range(4):  # 4 steps x 64 groups x 16 = 4096 responses, window keeps the last 200 groups
        samples, texts, y = synthetic_batch(rng, rates, n_groups=64, group=16, prior=prior)
        out = reward.score(samples, texts, group_size=16)
    m = out.metrics
    assert m["weaver/window_groups"] == 200 and m["weaver/window_responses"] == 3200
    est = np.array([m[f"weaver/v{i}/acc"] for i in range(len(rates))])
    assert np.abs(est - true_accuracy(prior, rates)).max() < 0.05, est
    assert abs(m["weaver/prior"] - prior) < 0.05
    for key in ["reward/mean", "weaver/n_dropped", "weaver/v0/pos_rate", "weaver/v0/tpr", "weaver/v0/fpr",
                "weaver/agree/v0__v1", "weaver/v4/dropped"]:
        assert key in m
    assert all(isinstance(v, float) and np.isfinite(v) for v in m.values())
    rewards = np.array(out.rewards)
    assert ((rewards >= 0) & (rewards <= 1)).all()
    assert rewards[y].mean() > rewards[~y].mean() + 0.3  # posterior separates right from wrong
    json.dumps(out.details)  # rollout tables need JSON
    assert set(out.details[0]) == {"scores", "votes", "posterior"}


def test_weaver_drops_signal_free_verifiers_with_reason(caplog):
    rng = np.random.default_rng(5)
    rates = MIXED[:4]
    cfg = weaver_cfg(len(rates) + 2)
    # v4 always accepts (a format check), v5 accepts ~2% (below the 0.05 band edge).
    samples, texts, _ = synthetic_batch(rng, rates, n_groups=64, group=16, prior=0.3)
    texts = [t + "1" + ("1" if rng.random() < 0.02 else "0") for t in texts]
    reward = build_reward(cfg, env=None)
    with caplog.at_level(logging.WARNING, logger="rlexp.rewards.weaver"):
        out = reward.score(samples, texts, group_size=16)
    assert set(reward.dropped) == {"v4", "v5"}
    assert "constant" in reward.dropped["v4"] and "outside (0.05, 0.95)" in reward.dropped["v5"]
    assert "dropping verifier 'v4'" in caplog.text and "dropping verifier 'v5'" in caplog.text
    assert out.metrics["weaver/n_active"] == 4 and out.metrics["weaver/v4/dropped"] == 1.0
    assert "weaver/v4/tpr" not in out.metrics and "weaver/v0/tpr" in out.metrics


def test_weaver_band_is_configurable_and_fallback_below_three_verifiers():
    rng = np.random.default_rng(6)
    samples, texts, _ = synthetic_batch(rng, MIXED, n_groups=16, group=8, prior=0.3)
    # A band so narrow that only verifiers with a positive rate in (0.40, 0.45) stay: fewer than 3.
    reward = build_reward(weaver_cfg(len(MIXED), drop_band=[0.40, 0.45]), env=None)
    out = reward.score(samples, texts, group_size=8)
    assert out.metrics["weaver/fallback"] == 1.0 and out.metrics["weaver/n_active"] < 3
    assert "weaver/prior" not in out.metrics
    assert all(0.0 <= r <= 1.0 for r in out.rewards)


def test_the_label_model_fallback_is_loud_once_and_names_each_drop(caplog):
    """Issue 46: a filter that leaves fewer than min_active verifiers turns Weaver into the unweighted mean. The
    run says so: reward/weaver_fallback = 1 every step, and one warning (not one per step) naming every dropped
    verifier with the filter that dropped it."""
    rng = np.random.default_rng(6)
    samples, texts, _ = synthetic_batch(rng, MIXED, n_groups=16, group=8, prior=0.3)
    reward = build_reward(weaver_cfg(len(MIXED), drop_band=[0.40, 0.45]), env=None)
    with caplog.at_level("WARNING", logger="rlexp"):
        outs = [reward.score(samples, texts, group_size=8)]
        dropped = dict(reward.dropped)  # as they stood when it fell back
        outs += [reward.score(samples, texts, group_size=8) for _ in range(2)]
    assert all(o.metrics["reward/weaver_fallback"] == 1.0 for o in outs)
    warned = [r.getMessage() for r in caplog.records if "LABEL MODEL FALLBACK" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"below min_active {reward.opts.min_active}" in warned[0] and dropped
    for name, why in dropped.items():
        assert f"{name}: {why}" in warned[0] and "outside (0.4, 0.45)" in why
    fine = build_reward(weaver_cfg(len(MIXED)), env=None).score(samples, texts, group_size=8)
    assert fine.metrics["reward/weaver_fallback"] == 0.0
    # The progress line says it every step it holds, from these very metrics, and not when the model is fit.
    from rlexp.run.controller import weaver_fallback_warning

    n = int(outs[-1].metrics["weaver/n_active"])
    assert weaver_fallback_warning(outs[-1].metrics) == (
        f" | WEAVER FALLBACK: {n} active verifier(s), label model not fit: the reward is the mean")
    assert weaver_fallback_warning(fine.metrics) == "" and weaver_fallback_warning({"reward/mean": 0.5}) == ""


def test_weaver_per_verifier_threshold_after_minmax():
    # A verifier whose raw scores live in [10, 20]: min-max maps them to [0, 1] before its own threshold.
    @register_rule("test_scaled")
    class Scaled(Rule):
        def check(self, problem, text):
            return 10.0 + 10.0 * int(text[0]) + 0.5 * int(text[1])  # 10, 10.5, 20, 20.5

    rng = np.random.default_rng(7)
    samples, texts, _ = synthetic_batch(rng, MIXED, n_groups=8, group=8, prior=0.5)
    verifiers = [VerifierConfig(name="hi", kind="rule", options={"rule": "test_scaled", "threshold": 0.99}),
                 VerifierConfig(name="mid", kind="rule", options={"rule": "test_scaled", "threshold": 0.5})]
    reward = build_reward(RewardConfig(name="weaver", verifiers=verifiers, options={"min_active": 3}), env=None)
    out = reward.score(samples, texts, group_size=8)
    for t, d in zip(texts, out.details):
        assert d["votes"]["hi"] == int(t[0] == "1" and t[1] == "1")
        assert d["votes"]["mid"] == int(t[0] == "1")


def test_weaver_state_dict_round_trip_resumes_identically():
    rng = np.random.default_rng(8)
    batches = [synthetic_batch(rng, MIXED, n_groups=32, group=8, prior=0.3) for _ in range(4)]
    a = build_reward(weaver_cfg(len(MIXED), window_groups=64), env=None)
    for s, t, _ in batches[:3]:
        a.score(s, t, 8)
    state = json.loads(json.dumps(a.state_dict()))  # must survive a JSON checkpoint
    assert len(state["window"]) == 64 and state["params"] is not None
    b = build_reward(weaver_cfg(len(MIXED), window_groups=64), env=None)
    b.load_state_dict(state)
    out_a, out_b = a.score(*batches[3][:2], 8), b.score(*batches[3][:2], 8)
    assert np.allclose(out_a.rewards, out_b.rewards)
    assert out_a.metrics == pytest.approx(out_b.metrics)
    other = build_reward(weaver_cfg(len(MIXED) - 1), env=None)
    with pytest.raises(ValueError, match="saved with verifiers"):
        other.load_state_dict(state)


def test_weaver_never_sees_gold():
    seen = []

    @register_rule("test_peek")
    class Peek(Rule):
        def check(self, problem, text):
            seen.append(problem)
            return float(len(problem.answer))  # a verifier that tries to read the gold label

    reward = build_reward(RewardConfig(name="weaver", verifiers=[
        VerifierConfig(name="peek", kind="rule", options={"rule": "test_peek"})]), env=None)
    samples = [Sample(Problem(id="p", prompt="1+1="), answer="2")] * 2
    with pytest.raises(AttributeError, match="answer"):
        reward.score(samples, ["2", "3"], group_size=2)
    assert seen and all(type(p) is Problem for p in seen)


def test_policy_judge_is_scored_by_yes_over_yes_and_no():
    """A judge served by the policy: the reward service attaches a next-token-logprob function and the
    policy's tokenizer. Here that function is a stand-in for the policy model (named so), sure of "Y" for
    one response and of "n" for the others: the score is P(yes-like) / (P(yes-like) + P(no-like))."""
    cfg = RewardConfig(name="weaver", verifiers=[
        VerifierConfig(name="judge", kind="lm_judge",
                       options={"policy": True, "template": "Q: {prompt} A: {response}"}),
        VerifierConfig(name="v0", kind="rule", options={"rule": "test_vote", "index": 0}),
        VerifierConfig(name="v1", kind="rule", options={"rule": "test_vote", "index": 1})])
    reward = build_reward(cfg, env=None)
    samples = [Sample(Problem(id="p", prompt="2+2="), answer="4")] * 4
    texts = ["10", "01", "11", "00"]
    with pytest.raises(RuntimeError, match="has no model"):
        reward.score(samples, texts, 4)
    tok = CharTokenizer()
    seen: list[str] = []

    def fake_policy_next_logprobs(prompt_ids: list[list[int]], token_ids: list[int]) -> list[list[float]]:
        rows = []
        for ids in prompt_ids:
            text = tok.decode(ids)
            seen.append(text)
            yes = text.endswith("A: 11")
            rows.append([(-0.1 if yes else -5.0) if tok.decode([t]).lower() == "y" else (-5.0 if yes else -0.1)
                         for t in token_ids])
        return rows

    judge = next(v for v in reward.verifiers if v.name == "judge")
    judge.attach(fake_policy_next_logprobs, tok)
    out = reward.score(samples, texts, 4)
    assert seen[0] == "Q: 2+2= A: 10"
    assert [round(d["scores"]["judge"], 3) for d in out.details] == [round(1 / (1 + math.exp(4.9)), 3)] * 2 + [
        round(1 / (1 + math.exp(-4.9)), 3), round(1 / (1 + math.exp(4.9)), 3)]
    assert [d["votes"]["judge"] for d in out.details] == [0, 0, 1, 0]


def test_weaver_config_errors():
    with pytest.raises(ValueError, match="at least one entry in `verifiers`"):
        build_reward(RewardConfig(name="weaver"), env=None)
    with pytest.raises(ValueError, match=r"unknown options.*window"):
        build_reward(weaver_cfg(3, window=5), env=None)
    with pytest.raises(ValueError, match="unique"):
        build_reward(RewardConfig(name="weaver", verifiers=[
            VerifierConfig(name="a", kind="rule", options={"rule": "test_vote", "index": 0})] * 2), env=None)
    assert isinstance(build_reward(weaver_cfg(3), env=None), Reward)
