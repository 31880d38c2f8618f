"""What `reward=weaver` can be told (`WeaverOptions`, the `options:` of
rlexp/conf/reward/weaver*.yaml) and the threshold rule its `fit_thresholds` uses. Kept apart from
rlexp/rewards/weaver.py, which runs the reward: every option is declared and checked here, once,
before a verifier is built, so a bad combination fails with its fix before any model loads."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

# What a verifier kept out of the label model is (majority_as / format_as).
ROLES = ("model", "gate", "term", "off")
# What the label model's fit is turned into (WeaverOptions.weighting).
WEIGHTINGS = ("posterior", "quality", "logodds")


@dataclass
class WeaverOptions:
    # Groups (one problem's responses each) the label model is refit on every step. ~1000+ responses
    # keep the estimated rates within a few points; far more makes the fit lag behind the policy.
    window_groups: int = 128
    # A verifier whose window positive rate is outside this open interval is dropped (Weaver uses
    # (0.1, 0.9)). Only while the class balance is estimated: a known one replaces the band by
    # `max_imbalance` (a policy right 1% of the time has verifiers that rightly say yes 1% of the
    # time).
    drop_band: tuple[float, float] = (0.05, 0.95)
    # Threshold on the min-max normalised score for verifiers that do not set options.threshold.
    threshold: float = 0.5
    # Below three informative verifiers the latent-class model is not identifiable; fall back to
    # mean vote.
    min_active: int = 3
    # How the active verifiers' votes become a reward: label_model (Weaver: P(correct | votes) from
    # the latent-class model), mean (unweighted average of the normalised scores), vote (majority of
    # the votes: 1, 0.5 on a tie, 0). mean and vote are the baselines Weaver must beat, on the same
    # verifiers.
    combine: str = "label_model"
    # With combine=label_model, what the fitted model's output is (results/weaver_label_model.md):
    #   posterior  P(correct | the active verifiers' binary votes) (Weaver's latent-class
    #              posterior);
    #   quality    the mean of the active verifiers' continuous normalised scores, each weighted by
    #              the label model's estimated TPR - FPR (clipped at 0), in [0, 1];
    #   logodds    the same with the naive-Bayes vote weight logit(TPR) - logit(FPR) (clipped at 0).
    # Why: binarising each verifier at one threshold leaves most candidates with the same vote
    # pattern (on the static best-of-10 candidates 66% vote all-no on panel A), so the posterior
    # cannot rank them; even with each verifier's true TPR/FPR plugged in it selects worse than the
    # plain mean. The weighted variants keep the label model's job (which verifier to trust, read
    # from the votes' agreement and the dev class balance) and the scores' ranking. Ignored by
    # combine=mean|vote.
    weighting: str = "posterior"
    # Label model numerics (see BinaryLabelModel).
    eps: float = 1e-3
    smoothing: float = 0.5
    max_iter: int = 500
    tol: float = 1e-7
    # --- the paper's way (issue 23); these defaults are the label-free online model above ---------
    # Where the share of correct responses comes from: estimate (EM, from the votes), prior (stated
    # below), or dev (gold labels of `dev_labels` responses of the reference pool: a stated budget,
    # logged). Each reward replica keeps its own pool and fit, so with reward.replicas=R the labels
    # read are R x dev_labels.
    class_balance: str = "estimate"
    prior: float = 0.5
    dev_labels: int = 0
    # The dev-labelled responses enter the label model's fit with their class known (semi-supervised
    # EM), not only as the class balance: where verifiers' errors correlate, unlabelled EM pulls
    # their estimated rates together (panel D's pool: the counting reward model at TPR/FPR 0.73/0.14
    # against its true 0.85/0.09, results/weaver_label_model_d.md); a few labels anchor them. Needs
    # class_balance=dev.
    dev_in_fit: bool = False
    # Groups of the reference pool (the first steps' samples: the starting policy's). 0: no pool,
    # the sliding window above is the fit data every step.
    reference_groups: int = 0
    # After the pool: refit on pool + window every K steps (0: never, the paper's fit-once), moving
    # the prior and each TPR/FPR by at most max_change per refit.
    refit_every: int = 0
    max_change: float = 0.05
    # minmax (over the window, or the pool) or quantile (each score's rank in the pool, in [0, 1]).
    normalise: str = "minmax"
    # Threshold each verifier where its positive rate on the pool equals the class balance (not
    # `threshold`).
    fit_thresholds: bool = False
    # Subtract from each verifier's score its mean over the reference pool's responses with the same
    # extracted answer (less its pool mean): a verifier that likes an answer whatever the question
    # (measured: all six tiny ones like "8") then cannot pull the policy onto that answer; what is
    # left is how the score varies with the question for that answer. Fixed when the pool fills;
    # needs a pool (reference_groups > 0).
    debias_answers: bool = False
    # Filters, applied to the label model's verifiers at each fit: estimated TPR - FPR below
    # min_quality (from the dev labels when there are any, else from the fit), |positive rate -
    # class balance| above max_imbalance, and of two whose votes correlate above max_correlation the
    # weaker. Defaults: off.
    min_quality: float = -1.0
    max_imbalance: float = 1.0
    max_correlation: float = 1.0
    # What `majority` and `format` verifiers are: model (votes in the label model), gate (reward x
    # vote), term ((1 - term_weight) x reward + term_weight x vote), off (ignored).
    majority_as: str = "model"
    format_as: str = "model"
    term_weight: float = 0.1
    # The progress line warns when more than this share of a step's groups get zero advantage.
    warn_zero_adv: float = 0.8

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> WeaverOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(
                f"reward=weaver: unknown options {sorted(unknown)}; known: {sorted(known)}"
            )
        o = cls(**options)
        o.drop_band = tuple(float(x) for x in o.drop_band)  # type: ignore[assignment]
        if len(o.drop_band) != 2 or not 0.0 <= o.drop_band[0] < o.drop_band[1] <= 1.0:
            raise ValueError(
                "reward=weaver: drop_band must be (low, high) with 0 <= low < high <= 1, "
                f"got {o.drop_band}"
            )
        if o.combine not in ("label_model", "mean", "vote"):
            raise ValueError(
                f"reward=weaver: options.combine must be label_model|mean|vote, got {o.combine!r}"
            )
        if o.weighting not in WEIGHTINGS:
            raise ValueError(
                f"reward=weaver: options.weighting must be {'|'.join(WEIGHTINGS)} (what the "
                "label model outputs: the posterior of the binary votes, or its estimated "
                f"per-verifier weights on the continuous normalised scores), got {o.weighting!r}"
            )
        if o.window_groups < 1:
            raise ValueError(f"reward=weaver: window_groups must be >= 1, got {o.window_groups}")
        o.check_paper_options()
        return o

    def check_paper_options(self) -> None:
        """Combinations that cannot work, each named with its fix."""
        def bad(msg: str) -> None:
            raise ValueError(f"reward=weaver: {msg}")

        if self.class_balance not in ("estimate", "prior", "dev"):
            bad(f"options.class_balance must be estimate|prior|dev, got {self.class_balance!r}")
        if self.class_balance == "prior" and not 0.0 < self.prior < 1.0:
            bad(
                f"options.prior={self.prior} must be in (0, 1) (the stated share of correct "
                "responses)"
            )
        if self.class_balance == "dev" and (self.dev_labels < 1 or self.reference_groups < 1):
            bad(
                "class_balance=dev reads gold labels of responses in the reference pool: set "
                f"options.dev_labels (the budget, > 0; got {self.dev_labels}) and "
                f"options.reference_groups (> 0; got {self.reference_groups})"
            )
        if self.dev_in_fit and self.class_balance != "dev":
            bad(
                "options.dev_in_fit puts the dev-labelled responses into the fit: set "
                "class_balance=dev (with dev_labels and reference_groups)"
            )
        if self.class_balance != "dev" and self.dev_labels:
            bad(
                f"options.dev_labels={self.dev_labels} is only read with class_balance=dev; set "
                "it to 0 or use class_balance=dev"
            )
        if self.reference_groups < 0 or self.refit_every < 0 or self.dev_labels < 0:
            bad("options.reference_groups, refit_every and dev_labels must be >= 0")
        if self.refit_every and not self.reference_groups:
            bad(
                "options.refit_every needs a reference pool (options.reference_groups > 0); "
                "without one the model is refit every step"
            )
        if not self.max_change > 0:
            bad(f"options.max_change={self.max_change} must be > 0")
        if self.normalise not in ("minmax", "quantile"):
            bad(f"options.normalise must be minmax|quantile, got {self.normalise!r}")
        if self.debias_answers and not self.reference_groups:
            bad(
                "options.debias_answers measures each answer's score offset on the reference "
                "pool: set options.reference_groups > 0"
            )
        if self.fit_thresholds and self.class_balance == "estimate":
            bad(
                "options.fit_thresholds places thresholds at the class balance, which must be "
                "known: set class_balance=dev (with dev_labels) or class_balance=prior (with "
                "prior)"
            )
        for key in ("majority_as", "format_as"):
            if getattr(self, key) not in ROLES:
                bad(f"options.{key} must be one of {'|'.join(ROLES)}, got {getattr(self, key)!r}")
        if not 0.0 <= self.term_weight <= 1.0 or not 0.0 <= self.warn_zero_adv <= 1.0:
            bad("options.term_weight and options.warn_zero_adv must be in [0, 1]")
        if not -1.0 <= self.min_quality <= 1.0 or not 0.0 <= self.max_imbalance <= 1.0 \
                or not 0.0 <= self.max_correlation <= 1.0:
            bad(
                "options.min_quality must be in [-1, 1], max_imbalance and max_correlation in "
                "[0, 1]"
            )


def balance_threshold(values: np.ndarray, prior: float) -> float:
    """The cut (one of `values`) whose positive rate `mean(values >= cut)` is closest to the class
    balance, never the cut that accepts everything (unless there is only one value): a verifier with
    few distinct scores (0/1 votes) keeps its own split instead of being moved to "all yes"."""
    u, first = np.unique(np.sort(values), return_index=True)
    rates = (len(values) - first) / len(values)
    if len(u) > 1:
        u, rates = u[1:], rates[1:]
    return float(u[int(np.argmin(np.abs(rates - prior)))])
