r"""Answer extraction and checking, shared by training rewards and evaluation so both score alike.

Order of operations for every format:
1. `strip_thinking`: reasoning inside `<think>...</think>` is dropped first, so a decoy answer the model
   considered and rejected while thinking is never scored. A `</think>` without an opening tag (the chat
   template opened it inside the prompt) drops everything before it; an opened block that never closes
   (generation cut off mid-thought) leaves no answer at all.
2. Find the candidate answer:
   - math: the LAST `\boxed{...}` (or `\fbox{...}`), braces matched so `\boxed{\frac{1}{2}}` is whole.
     Several boxed answers -> the last one counts: models that restate or correct themselves put the
     final one last, and "any boxed answer matches" would reward listing many guesses.
   - numbers (GSM8K): `\boxed{}` if present, else `#### N`, else "answer is N"; compared numerically.
   - letters (GPQA A-D, MMLU-Pro A-J): "answer is (C)" / "Answer: C" / `\boxed{C}`, then a
     parenthesised letter or a lone letter ending the response. The last statement wins (lm-eval-harness
     takes the first "answer is" match; see studies/crosscheck/results/crosscheck_mc.md for where that differs).
3. Nothing found -> `parseable=False` (counted in the unparseable rate, never silently "wrong").

Math answers are compared by Math-Verify (`parse` then `verify(gold, answer)`, gold first because
`verify` is not symmetric), run in `rlexp.envs.verify_pool` with a process-based timeout.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from rlexp.envs.verify_pool import get_pool

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class Extracted:
    """Outcome of one check. `extracted` is the answer text found (None when there was none)."""

    correct: bool
    parseable: bool
    extracted: str | None


# --- thinking -----------------------------------------------------------------------------------------
def strip_thinking(text: str) -> str:
    """Remove reasoning blocks; see the module docstring for the unclosed/unopened cases."""
    if _THINK_CLOSE in text:
        text = text[text.rindex(_THINK_CLOSE) + len(_THINK_CLOSE):]
    if _THINK_OPEN in text:  # opened and never closed: everything after it is unfinished reasoning
        text = text[: text.index(_THINK_OPEN)]
    return text


# --- boxed --------------------------------------------------------------------------------------------
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")


def boxed_contents(text: str) -> list[str]:
    r"""Every `\boxed{...}` content in order, with nested braces kept whole; `\boxed 5` also counts."""
    out: list[str] = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if depth == 0:  # an unbalanced (truncated) box is not an answer
                out.append(text[i + 1: j].strip())
        else:
            bare = re.match(r"[^\s$]+", text[i:])
            if bare and m.group(0).endswith(" "):
                out.append(bare.group(0).rstrip(".,"))
    return [c for c in out if c]


def last_boxed(text: str) -> str | None:
    boxes = boxed_contents(strip_thinking(text))
    return boxes[-1] if boxes else None


# --- math ---------------------------------------------------------------------------------------------
def _as_latex(answer: str) -> str:
    # Wrapping in \boxed{} makes Math-Verify's LaTeX extractor take the whole string as one answer.
    return "\\boxed{" + answer + "}"


def check_math_batch(golds: list[str], responses: list[str]) -> list[Extracted]:
    """Check many responses at once (one round trip through the worker pool)."""
    found = [last_boxed(r) for r in responses]
    # Fast path, positive only: identical text or the same exact number needs no SymPy round trip.
    # (Negative verdicts always go to Math-Verify, which also accepts e.g. 0.333333 for 1/3.)
    trivial = [a is not None and _trivially_equal(g, a) for g, a in zip(golds, found)]
    pairs = [(_as_latex(g), _as_latex(a)) for g, a, t in zip(golds, found, trivial) if a is not None and not t]
    results = iter(get_pool().verify_many(pairs)) if pairs else iter(())
    out: list[Extracted] = []
    for gold, ans, easy in zip(golds, found, trivial):
        if ans is None:
            out.append(Extracted(False, False, None))
            continue
        if easy:
            out.append(Extracted(True, True, ans))
            continue
        res = next(results)
        # A boxed answer Math-Verify cannot parse is still an answer: compare it as normalised text.
        correct = res.correct or (not res.parseable and _norm_text(ans) == _norm_text(gold))
        out.append(Extracted(correct, True, ans))
    return out


def check_math(gold: str, response: str) -> Extracted:
    return check_math_batch([gold], [response])[0]


def _trivially_equal(gold: str, answer: str) -> bool:
    if gold.strip() == answer.strip():
        return True
    g, a = parse_number(gold, thousands=False), parse_number(answer, thousands=False)
    return g is not None and g == a


def _norm_text(s: str) -> str:
    return re.sub(r"\s+|\\[,;!]|\\text\{|\}|\{|\$", "", s).lower()


# --- numbers (GSM8K) ----------------------------------------------------------------------------------
_NUM = r"-?\$?\s*[0-9][0-9,]*(?:\.[0-9]+)?|-?\$?\s*\.[0-9]+"
_HASH_RE = re.compile(r"####\s*(" + _NUM + ")")
_ANSWER_IS_NUM_RE = re.compile(r"answer\s*(?:is|:)\s*:?\s*\**\s*(" + _NUM + ")", re.IGNORECASE)


def parse_number(text: str, thousands: bool = True) -> Fraction | None:
    """Exact value of a plain number ("1,234", "$18", "0.50", "3/4", "\\frac{3}{4}"), else None.

    `thousands=False` for math answers, where "1,2" is a pair, not twelve.
    """
    s = text.strip()
    if thousands:
        s = s.replace(",", "")
    elif "," in s:
        return None
    s = s.replace("$", "").replace("\\!", "").replace("\\%", "").rstrip("%.")
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).strip()
    m = re.fullmatch(r"\\d?frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(int(num), int(den)) if int(den) else None
        return Fraction(Decimal(s))
    except (InvalidOperation, ValueError, ZeroDivisionError, OverflowError):
        return None


def extract_number(response: str) -> str | None:
    text = strip_thinking(response)
    boxes = boxed_contents(text)
    if boxes:
        return boxes[-1]
    for rx in (_HASH_RE, _ANSWER_IS_NUM_RE):
        hits = rx.findall(text)
        if hits:
            return hits[-1].strip()
    return None


def check_number(gold: str, response: str) -> Extracted:
    """Numeric comparison: "18", "18.0", "$18" and "\\boxed{18}" all equal gold 18."""
    ans = extract_number(response)
    if ans is None:
        return Extracted(False, False, None)
    value, gold_value = parse_number(ans), parse_number(gold)
    if value is None:
        return Extracted(False, False, ans)
    return Extracted(gold_value is not None and value == gold_value, True, ans)


# --- multiple-choice letters --------------------------------------------------------------------------
def _letter_patterns(letters: str) -> list[re.Pattern[str]]:
    L = f"[{letters}]"
    return [
        # "The answer is (C)", "answer is C", "Answer: C", "the correct answer is **(B)**", "Answer: $C$"
        # Only "answer"/"is"/"option" ignore case: a lowercase "a" ("the answer is a prime") is no letter.
        re.compile(r"(?i:answer)\s*(?:(?i:is)|:)\s*:?\s*(?:(?i:option)\s*)?[\*\$\s]*\(?(" + L
                   + r")\)?(?![A-Za-z0-9])"),
        # \boxed{C}, \boxed{(C)}, \boxed{\text{C}}
        re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{)?\s*\(?(" + L + r")\)?\s*\}?\s*\}"),
    ]


def _final_letter(text: str, letters: str) -> str | None:
    """A "(C)" ending the response, or a last line that is only a letter ("C", "(C).", "**C**")."""
    tail = text.rstrip().rstrip(".*").rstrip()
    m = re.search(r"\((" + f"[{letters}]" + r")\)$", tail)
    if m:
        return m.group(1)
    last_line = tail.splitlines()[-1].strip() if tail else ""
    m = re.fullmatch(r"[\*\s]*\(?(" + f"[{letters}]" + r")\)?[\*\s]*", last_line)
    return m.group(1) if m else None


def extract_choice(response: str, n_choices: int) -> str | None:
    """The chosen letter among the first `n_choices` letters, or None (unparseable)."""
    letters = "ABCDEFGHIJKLMNOP"[:n_choices]
    text = strip_thinking(response)
    for rx in _letter_patterns(letters):
        hits = rx.findall(text)
        if hits:
            return hits[-1].upper() if hits[-1].upper() in letters else None
    return _final_letter(text, letters)


def check_choice(gold_letter: str, response: str, n_choices: int) -> Extracted:
    letter = extract_choice(response, n_choices)
    if letter is None:
        return Extracted(False, False, None)
    return Extracted(letter == gold_letter.strip().upper(), True, letter)
