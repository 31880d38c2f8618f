"""Weak verifiers for the embedded arithmetic task (prompt "1+0+1+1+0+0+1+0+1=", answer: the sum, one digit).

Each check parses the terms from the PROMPT and the digit from the response; none sees the gold answer (a
label-free reward only ever receives `Problem`s). They are deliberately weak, with known error rates, so the
CPU-scale replication of Weaver has something to combine:

- `arithmetic_misread`: an exact adder that misreads the terms at some positions (reads them as 0, i.e.
  ignores them, or as 1). It accepts only the sum it computes, so it rejects right answers on the problems
  where the misread matters and accepts one specific wrong digit there. Verifiers that misread different
  positions err on different problems: their errors are triggered by the prompt, which keeps them close to
  conditionally independent given correctness (the label model's assumption).
- `arithmetic_mod` (and its aliases `arithmetic_parity` = mod 2, `arithmetic_mod5` = mod 5): accepts every
  digit congruent to the sum; never rejects a right answer.
- `arithmetic_window`: accepts every digit within k of the sum (a "close enough" heuristic).
- `arithmetic_format`: accepts any single digit; no signal once the policy always answers with a digit.

The TPR (P(accept | correct)) and FPR (P(accept | wrong)) in the docstrings are exact under the TRAINING
distribution of the default task (nine 0/1 terms; the sum is drawn uniformly from 0..9, then a sequence
uniformly among those with that sum -- `Arithmetic.sample_batch`) and a wrong response that is a uniformly
random wrong digit (what an untrained policy emits when it emits a digit); tests/test_rewards.py checks
them by exhaustive enumeration. Under that distribution the terms are exchangeable, so a misreading adder's
rates depend only on how many positions it misreads, k:

    P(the k misread terms are all 0) = (1/10) sum_s C(9-s, k) / C(9, k) = C(10, k+1) / (10 C(9, k)) = 1/(k+1)

(hockey-stick identity), and the same for "all 1". A trained policy's mistakes are not uniform -- it tends to
be off by one, or to settle on a digit a verifier wrongly accepts -- so the real FPRs drift; that is why
Weaver estimates them online instead of trusting these numbers. Residue and window checks are functions of
(response - sum), hence strongly dependent given a wrong response; and two residue checks whose moduli have
a least common multiple >= 10 (parity and mod 5; mod 3 and mod 5) together pin the digit down exactly, i.e.
together they ARE the gold check. conf/reward/weaver.yaml explains which checks suit the label model and why.
"""
from __future__ import annotations

import re

from rlexp.rewards.verifiers.base import Rule, register_rule
from rlexp.types import Problem

_SUM = re.compile(r"(\d+(?:\s*\+\s*\d+)+)\s*=")


def terms(problem: Problem) -> list[int]:
    """The terms of the last "t1+t2+...+tn=" in the prompt (n >= 2)."""
    found = _SUM.findall(problem.prompt)
    if not found:
        raise ValueError(f"arithmetic verifier: cannot find 't1+t2+...+tn=' in prompt {problem.prompt!r} of problem "
                         f"{problem.id!r}; these verifiers only work with environment=arithmetic")
    return [int(t) for t in re.split(r"\s*\+\s*", found[-1].strip())]


def response_digit(text: str) -> int | None:
    """Same parse as the environment's check: exactly one digit after stripping whitespace."""
    t = text.strip()
    return int(t) if len(t) == 1 and t.isdigit() else None


class _DigitRule(Rule):
    """Unparseable responses are rejected by every content check."""

    def check(self, problem: Problem, text: str) -> float:
        ts = terms(problem)  # first, so a non-arithmetic prompt fails loudly whatever the response
        r = response_digit(text)
        if r is None:
            return 0.0
        return 1.0 if self.accept(ts, r) else 0.0

    def accept(self, ts: list[int], r: int) -> bool:
        raise NotImplementedError


@register_rule("arithmetic_format")
class FormatCheck(Rule):
    """Accepts any single-digit response.

    TPR = 1; FPR = share of wrong responses that are still one digit (1 for a policy that always emits a
    digit; about 0.5 for the untrained tiny model, which emits a non-digit token about half the time). Its
    positive rate goes above the drop band's upper edge as soon as the policy has learned the format, so
    Weaver drops it as carrying no signal; it is in the default set to show that.
    """

    def check(self, problem: Problem, text: str) -> float:
        terms(problem)  # fail loudly on a non-arithmetic prompt, like the other checks
        return 1.0 if response_digit(text) is not None else 0.0


@register_rule("arithmetic_mod")
class ModCheck(_DigitRule):
    """Accepts r when r = sum (mod k), 2 <= k <= 9.

    TPR = 1 (the right digit has the right residue). FPR = sum_c n_c (n_c - 1) / 90, where n_c is the number
    of digits 0..9 with residue c (the sum is uniform over 0..9): k=2: 4/9 ~ 0.444, k=3: 4/15 ~ 0.267,
    k=4: 8/45 ~ 0.178, k=5: 1/9 ~ 0.111 (only the digit 5 away passes). k >= 10 would be the exact answer
    check -- an oracle, not a weak verifier -- and is refused; use reward=annotated for the oracle.
    """

    def __init__(self, k: int = 5) -> None:
        k = int(k)
        if not 2 <= k <= 9:
            raise ValueError(f"{self.name or 'arithmetic_mod'}: k must be in 2..9, got {k} (k >= 10 is the exact "
                             f"oracle for one-digit answers, use reward=annotated; k=1 accepts every digit)")
        self.k = k

    def accept(self, ts: list[int], r: int) -> bool:
        return r % self.k == sum(ts) % self.k


@register_rule("arithmetic_parity")
class ParityCheck(ModCheck):
    """`arithmetic_mod` with k=2: TPR = 1, FPR = 4/9 ~ 0.444. Accuracy at a correct-rate p: p + (1-p) * 5/9."""

    def __init__(self) -> None:
        super().__init__(k=2)


@register_rule("arithmetic_mod5")
class Mod5Check(ModCheck):
    """`arithmetic_mod` with k=5: TPR = 1, FPR = 1/9 ~ 0.111 (accepts the sum and the digit 5 away from it).

    Accuracy at a correct-rate p: p + (1-p) * 8/9 -- the most accurate single check in this module at every
    p (a misreading adder's is p/(k+1) + (1-p)(1 - k/(9(k+1))), lower for every p > 0), and it never rejects
    a right answer. Hence the default for `reward=single_rm` (conf/reward/single_rm.yaml says why).
    """

    def __init__(self) -> None:
        super().__init__(k=5)


@register_rule("arithmetic_window")
class WindowCheck(_DigitRule):
    """A "close enough" heuristic: accepts r with |r - sum| <= k, 1 <= k <= 8.

    TPR = 1; FPR = sum_s (min(s, k) + min(9 - s, k)) / 90 (fewer neighbours at the edges 0 and 9): k=1: 0.2,
    k=2: 17/45 ~ 0.378, k=3: 0.52. k=0 would be the exact oracle and is refused (use reward=annotated).
    """

    def __init__(self, k: int = 1) -> None:
        k = int(k)
        if not 1 <= k <= 8:
            raise ValueError(f"arithmetic_window: k must be in 1..8, got {k} (k=0 is the exact oracle, use "
                             f"reward=annotated; k>=9 accepts every digit)")
        self.k = k

    def accept(self, ts: list[int], r: int) -> bool:
        return abs(r - sum(ts)) <= self.k


@register_rule("arithmetic_misread")
class MisreadCheck(_DigitRule):
    """An exact adder that misreads the terms at some positions: reads each of them as `read_as` (0: ignores
    them, as when a parser drops a term; 1: sees a 1 there). `positions` are 1-based, e.g. [9] or [4, 5].

    It accepts only the sum it computes: the right one when every misread term already equals `read_as`,
    otherwise one specific wrong digit. With k misread positions, under the training distribution:
    TPR = 1/(k+1) (k=1: 0.5, k=2: 0.333, k=3: 0.25) and FPR = (1 - TPR)/9 = k/(9(k+1)) (0.056, 0.074, 0.083).
    (The wrong digit it computes is always a digit 0..9: reading a term as 0 lowers the sum, reading a 0 as 1
    raises it by at most the number of zeros.) Accuracy at a correct-rate p: p/(k+1) + (1-p)(1 - k/(9(k+1))).

    Its errors are triggered by the prompt (which terms stand at the misread positions), so adders that misread
    different positions err on different problems; read_as=0 errs on high sums and read_as=1 on low sums.
    They are not exactly conditionally independent given a right answer -- under the training distribution the
    terms are exchangeable but not independent (P(two given terms are both 0) = 1/3, not 1/4) -- but they are
    much closer to it than residue or window checks, which is why the default Weaver set leans on this family.
    """

    def __init__(self, positions: list[int] | tuple[int, ...] = (9,), read_as: int = 0) -> None:
        try:
            pos = [int(p) for p in positions]
        except (TypeError, ValueError):
            pos = []
        if not pos or any(p < 1 for p in pos) or len(set(pos)) != len(pos):
            raise ValueError(f"arithmetic_misread: positions must be distinct 1-based term positions like [9] or "
                             f"[4, 5], got {positions!r}")
        read_as = int(read_as)
        if read_as < 0:
            raise ValueError(f"arithmetic_misread: read_as must be a term value >= 0, got {read_as}")
        self.positions = [p - 1 for p in pos]
        self.read_as = read_as

    def accept(self, ts: list[int], r: int) -> bool:
        if max(self.positions) >= len(ts):
            raise ValueError(f"arithmetic_misread: positions {[p + 1 for p in self.positions]} but the prompt has "
                             f"only {len(ts)} terms")
        computed = sum(ts) + sum(self.read_as - ts[p] for p in self.positions)
        return r == computed


@register_rule("arithmetic_copy")
class CopyErrorCheck(_DigitRule):
    """An exact adder with a copy error: reads the term at position `position` as a copy of the term at
    position `source` (1-based; e.g. it reads the previous term twice).

    Right exactly when the two terms are equal. Under the training distribution P(two given terms are
    equal) = 2/3, so TPR = 2/3; otherwise it accepts the sum plus or minus one (depending on which of the two
    is the 1), so FPR = (1/3)/9 = 1/27 ~ 0.037. Its chance of erring given the sum s, s(9-s)/36, is highest for
    middle sums and zero at 0 and 9, unlike `arithmetic_misread` (rising with s for read_as=0, falling for
    read_as=1), and adders with copy errors on disjoint position pairs err on different problems.
    """

    def __init__(self, position: int = 2, source: int = 1) -> None:
        position, source = int(position), int(source)
        if position < 1 or source < 1 or position == source:
            raise ValueError(f"arithmetic_copy: position and source must be distinct 1-based term positions, got "
                             f"position={position}, source={source}")
        self.position, self.source = position - 1, source - 1

    def accept(self, ts: list[int], r: int) -> bool:
        if max(self.position, self.source) >= len(ts):
            raise ValueError(f"arithmetic_copy: positions {self.position + 1}, {self.source + 1} but the prompt has "
                             f"only {len(ts)} terms")
        return r == sum(ts) - ts[self.position] + ts[self.source]
