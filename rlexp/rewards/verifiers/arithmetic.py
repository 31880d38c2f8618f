"""Weak verifiers for the embedded arithmetic task (prompt "07+45=", answer: last digit of the sum).

Each check reads the operands from the PROMPT and the digit from the response; none sees the gold answer.
They are deliberately weak, with known error rates, so the CPU-scale replication of Weaver has something to
combine: a check that only tests parity, one that only tests the residue mod 5, one that makes a classic
carry mistake, two ladders of accuracies ("close enough" windows; adders that misread some digits), a
control with no signal at all (digit swap), and a format check that carries no signal once the policy
answers with a digit. conf/reward/weaver.yaml explains which of them suit the label model and why.

The TPR (P(accept | correct)) and FPR (P(accept | wrong)) in the docstrings assume operands uniform over
0..99 (so the units digits are uniform and independent) and a wrong response that is a uniformly random
wrong digit (what an untrained policy emits). A trained policy's mistakes are not uniform -- it tends to be
off by one, or to produce the carry error -- so the real FPRs drift; that is why Weaver estimates them online
instead of trusting these numbers. Note also that the checks are NOT conditionally independent given a wrong
response (e.g. parity and mod 5 together pin the digit down), which is realistic for Weaver's verifiers.
"""
from __future__ import annotations

import re

from rlexp.rewards.verifiers.base import Rule, register_rule
from rlexp.types import Problem

_SUM = re.compile(r"(\d+)\s*\+\s*(\d+)\s*=")


def operands(problem: Problem) -> tuple[int, int]:
    """The two operands of the last "a+b=" in the prompt."""
    found = _SUM.findall(problem.prompt)
    if not found:
        raise ValueError(f"arithmetic verifier: cannot find 'a+b=' in prompt {problem.prompt!r} of problem "
                         f"{problem.id!r}; these verifiers only work with environment=arithmetic")
    a, b = found[-1]
    return int(a), int(b)


def response_digit(text: str) -> int | None:
    """Same parse as the environment's check: exactly one digit after stripping whitespace."""
    t = text.strip()
    return int(t) if len(t) == 1 and t.isdigit() else None


class _DigitRule(Rule):
    """Unparseable responses are rejected by every content check."""

    def check(self, problem: Problem, text: str) -> float:
        a, b = operands(problem)  # first, so a non-arithmetic prompt fails loudly whatever the response
        r = response_digit(text)
        if r is None:
            return 0.0
        return 1.0 if self.accept(a, b, r) else 0.0

    def accept(self, a: int, b: int, r: int) -> bool:
        raise NotImplementedError


@register_rule("arithmetic_format")
class FormatCheck(Rule):
    """Accepts any single-digit response.

    TPR = 1; FPR = share of wrong responses that are still one digit = 1 for a policy that always emits a
    digit. Its positive rate is then 1 - (unparseable rate), above the 0.95 drop band as soon as the policy
    learned the format, so Weaver drops it as carrying no signal; it is in the default set to show that.
    """

    def check(self, problem: Problem, text: str) -> float:
        operands(problem)  # fail loudly on a non-arithmetic prompt, like the other checks
        return 1.0 if response_digit(text) is not None else 0.0


@register_rule("arithmetic_parity")
class ParityCheck(_DigitRule):
    """Accepts r when r and a+b have the same parity.

    TPR = 1 (the right digit has the right parity); FPR = 4/9 ~ 0.444 (4 of the 9 wrong digits share it).
    Accuracy at a correct-rate p: p + (1-p) * 5/9.
    """

    def accept(self, a: int, b: int, r: int) -> bool:
        return r % 2 == (a + b) % 2


@register_rule("arithmetic_mod5")
class Mod5Check(_DigitRule):
    """Accepts r when r = a+b (mod 5).

    TPR = 1; FPR = 1/9 ~ 0.111 (only the digit 5 away passes). Accuracy at a correct-rate p: p + (1-p) * 8/9.
    The most accurate single check in this module at every p, hence the default for `reward=single_rm`.
    """

    def accept(self, a: int, b: int, r: int) -> bool:
        return r % 5 == (a + b) % 5


@register_rule("arithmetic_tens_confusion")
class TensConfusionCheck(_DigitRule):
    """Confuses the carry into the tens column with the units digit: expects (ua+ub + [ua+ub >= 10]) mod 10.

    It is exact when the units column does not carry (55 of the 100 units-digit pairs) and expects the digit
    one above the right one otherwise (45 of 100). So TPR = 0.55 and FPR = 0.45 * 1/9 = 0.05 -- the only
    check here that rejects right answers, i.e. its errors are of the other kind from the window checks'.
    """

    def accept(self, a: int, b: int, r: int) -> bool:
        units = a % 10 + b % 10
        return r == (units + (units >= 10)) % 10


@register_rule("arithmetic_window")
class WindowCheck(_DigitRule):
    """A heuristic ladder: accepts r within circular distance k (1..4) of the right last digit.

    TPR = 1; FPR = 2k/9 (k=1: 0.222, k=2: 0.444, k=3: 0.667, k=4: 0.889). k=0 would be the exact answer
    check -- an oracle, not a weak verifier -- and is refused; use reward=annotated for the oracle.
    """

    def __init__(self, k: int = 1) -> None:
        k = int(k)
        if not 1 <= k <= 4:
            raise ValueError(f"arithmetic_window: k must be in 1..4, got {k} (k=0 is the exact oracle, use "
                             f"reward=annotated; k>=5 accepts every digit)")
        self.k = k

    def accept(self, a: int, b: int, r: int) -> bool:
        d = (r - (a + b)) % 10
        return min(d, 10 - d) <= self.k


@register_rule("arithmetic_digit_swap")
class DigitSwapCheck(_DigitRule):
    """Misreads the second operand with its digits swapped: expects (ua + tens(b)) mod 10.

    Right only when b's two digits agree: TPR = 1/10, FPR = (9/10) * (1/9) = 1/10. TPR = FPR, i.e. no signal
    at all although its positive rate (~0.1) sits inside the drop band: the label model, not the band, has to
    give it zero weight.
    """

    def accept(self, a: int, b: int, r: int) -> bool:
        return r == (a % 10 + (b // 10) % 10) % 10


@register_rule("arithmetic_misread")
class MisreadCheck(_DigitRule):
    """An exact adder that misreads some digits of one operand's units place (e.g. 6 as 9 and 9 as 6).

    `operand` ("a" or "b") and `pairs` (e.g. ["69"] or ["17", "38"], k disjoint digit pairs) choose the bug.
    It accepts only the digit it computes: the right one unless the misread digit occurs, in which case it
    accepts one specific wrong digit. A ladder of accuracies by k: TPR = 1 - 2k/10 (k=1: 0.8, k=2: 0.6,
    k=3: 0.4), FPR = (2k/10) * (1/9) (0.022, 0.044, 0.067).

    Unlike parity/mod5/windows -- all functions of the distance between the response and the right digit,
    hence strongly dependent given a wrong response -- its errors are triggered by a feature of the prompt,
    so verifiers that misread different digits or operands are close to conditionally independent: the
    assumption of Weaver's label model. That is why the default Weaver set leans on this family.
    """

    def __init__(self, operand: str = "b", pairs: list[str] | tuple[str, ...] = ("69",)) -> None:
        if operand not in ("a", "b"):
            raise ValueError(f"arithmetic_misread: operand must be 'a' or 'b', got {operand!r}")
        pairs = [str(p) for p in pairs]
        digits = "".join(pairs)
        if not pairs or any(len(p) != 2 or not p.isdigit() or p[0] == p[1] for p in pairs) \
                or len(set(digits)) != len(digits):
            raise ValueError(f"arithmetic_misread: pairs must be disjoint two-digit strings like ['69', '17'], "
                             f"got {pairs}")
        self.operand = operand
        self.swap = {int(p[0]): int(p[1]) for p in pairs} | {int(p[1]): int(p[0]) for p in pairs}

    def accept(self, a: int, b: int, r: int) -> bool:
        ua, ub = a % 10, b % 10
        if self.operand == "a":
            ua = self.swap.get(ua, ua)
        else:
            ub = self.swap.get(ub, ub)
        return r == (ua + ub) % 10
