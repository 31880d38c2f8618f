r"""Multi-turn arithmetic with a calculator tool: the model may call `<calc>EXPR</calc>` and gets the value.

Interaction (one episode):

    prompt    Compute 347*29+18. You may use a calculator: write <calc>expression</calc> and the result
              will follow as <result>value</result>. Put the final answer within \boxed{}.
    model     I need 347*29 first. <calc>347*29</calc>
    env       <result>10063</result>
    model     Then add 18: \boxed{10081}

Generation stops at "</calc>" (`stop`); `step` evaluates the expression and returns the `<result>` text to
append, or None when the response gave a final answer, made no call, or `environment.max_turns` responses
have been produced. The tool evaluates with an AST walker that admits numbers, + - * / // % ** and
parentheses only, with caps on exponent, magnitude and length: no names, calls or attributes, so a model
cannot reach Python (a subprocess sandbox would be heavier and still need such caps for `**`).

Data: problems generated from a fixed seed (held-out problems are disjoint from training ones, like the
arithmetic task), or `environment.dataset=/path.jsonl` with `question` and numeric `answer` fields.
Scoring: as GSM8K (`\boxed{}`, "####", "answer is"), numeric comparison; tool output is never scored.
"""
from __future__ import annotations

import ast
import math
import operator
import random
import re
from dataclasses import dataclass

from rlexp.envs.answers import boxed_contents, check_number, strip_thinking
from rlexp.envs.base import Check, Environment, register_env
from rlexp.envs.data import is_local_path, read_local
from rlexp.envs.gsm8k import numeric_answer
from rlexp.types import Problem, Sample

TEMPLATE = ("Compute {question}. You may use a calculator: write <calc>expression</calc> and the result will "
            "follow as <result>value</result>. Put the final answer within \\boxed{{}}.\n")
CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
_MAX_LEN = 200
_MAX_ABS = 10**30
_MAX_EXP = 64

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ValueError):
    """A model-facing error: its message is shown to the model as the tool result."""


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > _MAX_EXP
                                             or (abs(left) > 1 and abs(right) * math.log10(abs(left)) > 30)):
            raise CalcError("exponent too large")
        try:
            value = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        if isinstance(value, complex):
            raise CalcError("complex result")
        if abs(value) > _MAX_ABS:
            raise CalcError("result too large")
        return value
    raise CalcError("unsupported: only numbers, + - * / // % ** and parentheses")


def safe_eval(expr: str) -> str:
    """Evaluate an arithmetic expression; errors come back as "error: ..." text, never as exceptions."""
    # models write the multiplication and division signs too
    expr = expr.strip().replace("^", "**").replace("×", "*").replace("÷", "/")  # noqa: RUF001
    if len(expr) > _MAX_LEN:
        return "error: expression too long"
    try:
        value = _eval(ast.parse(expr, mode="eval"))
    except CalcError as e:
        return f"error: {e}"
    except (SyntaxError, ValueError, OverflowError, RecursionError):
        return "error: invalid expression"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


def _pending_call(response: str) -> str | None:
    """The expression of the last call in this response, if it has not been answered yet."""
    start = response.rfind(CALL_OPEN)
    if start < 0:
        return None
    body = response[start + len(CALL_OPEN):]
    if "<result>" in body:
        return None
    end = body.find(CALL_CLOSE)
    return body if end < 0 else body[:end]


@dataclass
class CalculatorOptions:
    template: str = TEMPLATE  # receives {question}
    max_operand: int = 999
    n_train: int = 5000


@register_env("calculator")
class Calculator(Environment):
    stop = (CALL_CLOSE,)
    Options = CalculatorOptions

    def load_samples(self, split: str) -> list[Sample]:
        template = self.opts.template
        ds = self.cfg.dataset
        if is_local_path(ds):
            rows = read_local(ds, split)
            return [Sample(Problem(id=str(r.get("id", f"calc/{split}/{i}")),
                                   prompt=template.format(question=r["question"])), answer=str(r["answer"]))
                    for i, r in enumerate(rows)]
        train, held = self._generated()
        return [Sample(Problem(id=expr, prompt=template.format(question=expr)), answer=ans)
                for expr, ans in (held if split == self.cfg.eval_split else train)]

    def _generated(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Fixed (not run-seeded) problems "a*b+c" / "a*b-c", so every run scores on the same held-out set."""
        hi, n_train = self.opts.max_operand, self.opts.n_train
        rng = random.Random(20261130)
        seen: dict[str, str] = {}
        while len(seen) < n_train + self.cfg.eval_size:
            a, b, c = rng.randint(11, hi), rng.randint(11, hi), rng.randint(1, hi)
            op = rng.choice("+-")
            expr = f"{a}*{b}{op}{c}"
            seen.setdefault(expr, str(a * b + c if op == "+" else a * b - c))
        items = list(seen.items())
        return items[self.cfg.eval_size:], items[: self.cfg.eval_size]

    def step(self, sample: Sample, transcript: str, response: str) -> str | None:
        """`transcript`: this episode's earlier responses and tool results; `response`: the newest turn."""
        turns = transcript.count("<result>") + 1
        if turns >= self.cfg.max_turns or boxed_contents(strip_thinking(response)):
            return None
        expr = _pending_call(response)
        if expr is None:
            return None
        close = "" if response.rstrip().endswith(CALL_CLOSE) else CALL_CLOSE
        return f"{close}<result>{safe_eval(expr)}</result>"

    def extract(self, problem: Problem, response: str) -> str | None:
        return numeric_answer(re.sub(r"<result>.*?</result>", "", response, flags=re.DOTALL))

    def check(self, sample: Sample, response: str) -> Check:
        text = re.sub(r"<result>.*?</result>", "", response, flags=re.DOTALL)  # tool output is not an answer
        r = check_number(sample.answer, text)
        return Check(correct=r.correct, parseable=r.parseable, extracted=r.extracted)
