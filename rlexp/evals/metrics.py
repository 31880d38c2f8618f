"""Benchmark metrics over per-sample outcomes: accuracy, pass@k, maj@k, unparseable rate, Wilson CI.

Inputs are grouped per problem (`n` samples each) because pass@k and maj@k are per-problem quantities;
accuracy is the mean over all samples (= pass@1 estimated from every sample, lower variance than using
only the first). The confidence interval is Wilson's score interval: unlike the normal approximation it
stays inside [0, 1] and is sensible at 0% or 100% accuracy on a few hundred problems, which is exactly
where small-model evaluations live.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def accuracy(correct: list[bool]) -> float:
    return sum(correct) / len(correct) if correct else 0.0


def unparseable_rate(parseable: list[bool]) -> float:
    return 1.0 - sum(parseable) / len(parseable) if parseable else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of P(at least one of k draws is correct) from n samples with c correct.

    1 - C(n-c, k) / C(n, k) (Chen et al. 2021), computed as a product to avoid huge binomials.
    """
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_pass_at_k(groups: list[list[bool]], k: int) -> float:
    return sum(pass_at_k(len(g), sum(g), k) for g in groups) / len(groups) if groups else 0.0


def majority_correct(extracted: list[str | None], correct: list[bool]) -> bool:
    """Is the most frequent parseable answer correct? Ties go to the answer seen first (deterministic).

    Answers are grouped by their extracted text, so "0.5" and "1/2" vote separately; for numeric and
    letter benchmarks that is exact, for free-form math it slightly under-counts agreement.
    """
    votes = Counter(a for a in extracted if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in extracted if a is not None and votes[a] == top)
    return next(c for a, c in zip(extracted, correct) if a == winner)


def maj_at_k(groups_extracted: list[list[str | None]], groups_correct: list[list[bool]], k: int) -> float:
    """Fraction of problems whose majority vote over the first k samples is correct."""
    if not groups_extracted:
        return 0.0
    hits = [majority_correct(e[:k], c[:k]) for e, c in zip(groups_extracted, groups_correct)]
    return sum(hits) / len(hits)


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a binomial proportion; (0, 1) when there is no data.

    `successes` may be fractional (a sum of per-problem accuracies over several samples each): the
    interval is then over problems, which are the independent units, and a little conservative.
    """
    if n == 0:
        return Interval(0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def summarize(groups_correct: list[list[bool]], groups_parseable: list[list[bool]],
              groups_extracted: list[list[str | None]], k: int = 1) -> dict[str, float]:
    """All metrics of one benchmark; the CI counts problems (not samples) as the independent units."""
    flat_c = [c for g in groups_correct for c in g]
    flat_p = [p for g in groups_parseable for p in g]
    per_problem = [sum(g) / len(g) for g in groups_correct if g]
    ci = wilson_interval(sum(per_problem), len(per_problem))
    out = {
        "accuracy": accuracy(flat_c),
        "unparseable": unparseable_rate(flat_p),
        "ci_low": ci.low,
        "ci_high": ci.high,
        "n_problems": float(len(groups_correct)),
        "n_samples": float(len(flat_c)),
    }
    n_min = min((len(g) for g in groups_correct), default=0)
    if n_min >= k > 1:
        out[f"pass@{k}"] = mean_pass_at_k(groups_correct, k)
        out[f"maj@{k}"] = maj_at_k(groups_extracted, groups_correct, k)
    return out
