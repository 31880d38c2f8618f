"""A label-free binary latent-class model over verifier votes (the weak-supervision core of Weaver).

Model: a hidden y in {0, 1} ("the response is correct") with prior pi; given y, verifier i votes 1 with
probability TPR_i (y=1) or FPR_i (y=0), independently of the other verifiers. With three or more verifiers
that carry signal this model is identifiable from unlabeled votes alone, up to swapping the two classes;
we break that symmetry by assuming the verifiers are better than random on the whole (sum of TPR-FPR > 0),
which still allows individual verifiers to be worse than random.

Fit: EM, started from a moment ("triplet") estimate. Under conditional independence the covariance of two
votes is Cov(v_i, v_j) = pi(1-pi) d_i d_j with d_i = TPR_i - FPR_i, so w_i^2 = C_ij C_ik / C_jk recovers
w_i = sqrt(pi(1-pi)) d_i from any triple; the class prior is then the value on a grid that maximises the
likelihood of the implied TPR/FPR. EM from there (and from the previous fit, when refitting online) refines
all parameters; the best likelihood wins. Unlike Weaver's best configs, the class prior is estimated, not
read from gold labels. Work is done per distinct vote pattern (at most 2^m of them), so refitting a large
window each step costs little.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class LabelModelParams:
    prior: float
    tpr: np.ndarray
    fpr: np.ndarray
    loglik: float = float("nan")  # mean log-likelihood per sample of the votes it was fit on
    iters: int = 0
    init: str = ""  # which start won: "moments" or "warm"

    @property
    def accuracy(self) -> np.ndarray:
        """Per-verifier accuracy implied by the fit: P(vote == y)."""
        return self.prior * self.tpr + (1 - self.prior) * (1 - self.fpr)

    def to_dict(self) -> dict[str, Any]:
        return {"prior": float(self.prior), "tpr": [float(x) for x in self.tpr], "fpr": [float(x) for x in self.fpr],
                "loglik": float(self.loglik), "iters": int(self.iters), "init": self.init}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LabelModelParams:
        return cls(prior=float(d["prior"]), tpr=np.asarray(d["tpr"], dtype=np.float64),
                   fpr=np.asarray(d["fpr"], dtype=np.float64), loglik=float(d.get("loglik", float("nan"))),
                   iters=int(d.get("iters", 0)), init=str(d.get("init", "")))


@dataclass
class BinaryLabelModel:
    # Rates are kept in [eps, 1-eps]: a verifier estimated to be perfect must not turn one vote into an
    # infinite log-odds (and a NaN posterior when two "perfect" verifiers disagree).
    eps: float = 1e-3
    # Beta(1+s, 1+s) MAP smoothing, in pseudo-counts per class; negligible at window sizes of 1000+.
    smoothing: float = 0.5
    prior_bounds: tuple[float, float] = (0.01, 0.99)
    max_iter: int = 500
    tol: float = 1e-7
    prior_grid: int = 49

    # --- public ------------------------------------------------------------------------------------
    def fit(self, votes: np.ndarray, warm: LabelModelParams | None = None,
            prior: float | None = None, labelled: tuple[np.ndarray, np.ndarray] | None = None) -> LabelModelParams:
        """Fit on an (n, m) 0/1 vote matrix; `warm` (the previous fit) is tried as a second start. `prior`
        holds the class balance fixed (read from labelled data or stated), which the votes of an optimised
        policy cannot then move: with it free, a collapsed policy's agreeing verifiers read as "mostly right".
        `labelled` = (votes (k, m), y (k,)): responses whose class is known enter EM with it fixed
        (semi-supervised), so a handful of labels anchor the rates that correlated verifiers pull together."""
        votes = _as_votes(votes)
        lab = None
        if labelled is not None:
            lv, ly = _as_votes(labelled[0]), np.asarray(labelled[1], dtype=np.float64).reshape(-1)
            if lv.shape[0] != ly.shape[0] or lv.shape[1] != votes.shape[1] or not np.isin(ly, (0.0, 1.0)).all():
                raise ValueError(f"label model: labelled votes {lv.shape} and labels {ly.shape} must pair up, with "
                                 f"{votes.shape[1]} verifiers and labels 0/1")
            lab = (lv, ly)
        if prior is not None and not 0.0 < prior < 1.0:
            raise ValueError(f"label model: a fixed class balance must be in (0, 1), got {prior}")
        n, m = votes.shape
        if n == 0 or m == 0:
            raise ValueError("label model: need at least one sample and one verifier, "
                             f"got votes of shape {votes.shape}")
        pats, counts = np.unique(votes, axis=0, return_counts=True)
        counts = counts.astype(np.float64)
        starts = [("moments", self._moment_init(votes, pats, counts, prior))]
        if warm is not None and len(warm.tpr) == m:
            starts.append(("warm", warm if prior is None else LabelModelParams(prior, warm.tpr, warm.fpr)))
        best: LabelModelParams | None = None
        for name, start in starts:
            p = self._em(pats, counts, start, fixed_prior=prior is not None, labelled=lab)
            p.init = name
            if best is None or p.loglik > best.loglik + 1e-12:
                best = p
        assert best is not None
        # With the class balance fixed, or labels given, the two labellings are no longer symmetric, so the fit
        # stands as EM left it.
        return self._orient(best) if prior is None and lab is None else best

    def posterior(self, votes: np.ndarray, params: LabelModelParams) -> np.ndarray:
        """P(y=1 | votes) for each row."""
        l1, l0 = self._joint(_as_votes(votes), params)
        return _sigmoid(l1 - l0)

    # --- internals ---------------------------------------------------------------------------------
    def _clip(self, x: np.ndarray) -> np.ndarray:
        return np.clip(x, self.eps, 1 - self.eps)

    def _joint(self, pats: np.ndarray, p: LabelModelParams) -> tuple[np.ndarray, np.ndarray]:
        """log P(votes, y=1) and log P(votes, y=0) per row."""
        tpr, fpr = self._clip(p.tpr), self._clip(p.fpr)
        prior = float(np.clip(p.prior, *self.prior_bounds))
        l1 = np.log(prior) + pats @ np.log(tpr) + (1 - pats) @ np.log1p(-tpr)
        l0 = np.log1p(-prior) + pats @ np.log(fpr) + (1 - pats) @ np.log1p(-fpr)
        return l1, l0

    def _loglik(self, pats: np.ndarray, counts: np.ndarray, p: LabelModelParams) -> float:
        l1, l0 = self._joint(pats, p)
        return float((counts * np.logaddexp(l1, l0)).sum() / counts.sum())

    def _moment_init(self, votes: np.ndarray, pats: np.ndarray, counts: np.ndarray,
                     fixed: float | None = None) -> LabelModelParams:
        mu = votes.mean(axis=0)
        w = triplet_weights(votes)
        best: LabelModelParams | None = None
        lo, hi = self.prior_bounds
        grid = [fixed] if fixed is not None else np.linspace(max(lo, 0.02), min(hi, 0.98), self.prior_grid)
        for prior in grid:
            d = w / np.sqrt(prior * (1 - prior))
            fpr = self._clip(mu - prior * d)
            tpr = self._clip(fpr + d)
            cand = LabelModelParams(prior=float(prior), tpr=tpr, fpr=fpr)
            cand.loglik = self._loglik(pats, counts, cand)
            if best is None or cand.loglik > best.loglik:
                best = cand
        assert best is not None
        return best

    def _em(self, pats: np.ndarray, counts: np.ndarray, start: LabelModelParams,
            fixed_prior: bool = False, labelled: tuple[np.ndarray, np.ndarray] | None = None) -> LabelModelParams:
        s = self.smoothing
        # Known classes add fixed counts to every M-step; without labels these are zeros.
        m = pats.shape[1]
        lv, ly = labelled if labelled is not None else (np.zeros((0, m)), np.zeros(0))
        lq_pats, lr_pats, lq, lr = ly @ lv, (1 - ly) @ lv, float(ly.sum()), float((1 - ly).sum())
        n = counts.sum() + len(ly)
        p = LabelModelParams(prior=float(np.clip(start.prior, *self.prior_bounds)),
                             tpr=self._clip(np.asarray(start.tpr, dtype=np.float64)),
                             fpr=self._clip(np.asarray(start.fpr, dtype=np.float64)))
        it = 0
        for it in range(1, self.max_iter + 1):  # noqa: B007 - read after the loop (p.iters)
            l1, l0 = self._joint(pats, p)
            q = _sigmoid(l1 - l0) * counts  # expected number of correct responses per pattern
            r = counts - q
            n1, n0 = q.sum() + lq, r.sum() + lr
            new = LabelModelParams(
                prior=p.prior if fixed_prior else float(np.clip((n1 + s) / (n + 2 * s), *self.prior_bounds)),
                tpr=self._clip((q @ pats + lq_pats + s) / (n1 + 2 * s)),
                fpr=self._clip((r @ pats + lr_pats + s) / (n0 + 2 * s)),
            )
            delta = max(abs(new.prior - p.prior), np.abs(new.tpr - p.tpr).max(), np.abs(new.fpr - p.fpr).max())
            p = new
            if delta < self.tol:
                break
        p.iters = it
        p.loglik = self._loglik(pats, counts, p)
        if len(ly):  # the starts compete on the whole objective: the labelled rows' complete-data likelihood too
            l1, l0 = self._joint(lv, p)
            p.loglik = float((p.loglik * counts.sum() + (ly * l1 + (1 - ly) * l0).sum()) / n)
        return p

    @staticmethod
    def _orient(p: LabelModelParams) -> LabelModelParams:
        """Pick the class labelling in which the verifiers are, on the whole, better than random."""
        if float((p.tpr - p.fpr).sum()) >= 0:
            return p
        return LabelModelParams(prior=1 - p.prior, tpr=p.fpr.copy(), fpr=p.tpr.copy(), loglik=p.loglik,
                                iters=p.iters, init=p.init)


def triplet_weights(votes: np.ndarray) -> np.ndarray:
    """w_i = sqrt(pi(1-pi)) (TPR_i - FPR_i) from pairwise covariances, with signs, oriented so sum(w) >= 0.

    The median over all triples (i, j, k) keeps one near-zero covariance in a denominator from blowing up
    the estimate; triples whose C_jk is too small to divide by are skipped.
    """
    votes = _as_votes(votes)
    m = votes.shape[1]
    c = np.cov(votes.T, bias=True) if votes.shape[0] > 1 else np.zeros((m, m))
    c = np.atleast_2d(c)
    w2 = np.zeros(m)
    for i in range(m):
        vals = [c[i, j] * c[i, k] / c[j, k]
                for j in range(m) for k in range(j + 1, m)
                if i not in (j, k) and abs(c[j, k]) > 1e-4]
        if vals:
            w2[i] = max(float(np.median(vals)), 0.0)
    w = np.sqrt(w2)
    if not w.any():
        return w
    anchor = int(np.argmax(w2))
    signs = np.where(c[:, anchor] < 0, -1.0, 1.0)
    signs[anchor] = 1.0
    w = w * signs
    return w if w.sum() >= 0 else -w


def _as_votes(votes: np.ndarray) -> np.ndarray:
    v = np.asarray(votes, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"votes must be a 2-D (samples, verifiers) array, got shape {v.shape}")
    if not np.isin(v, (0.0, 1.0)).all():
        raise ValueError("votes must be 0/1")
    return v


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
