"""An LM judge: a language model asked whether a response is right, scored by how sure it is of "yes".

The score is P(yes-like) / (P(yes-like) + P(no-like)) at the judge's next position, summed over every token
of the judge's vocabulary that reads "yes" or "no" (`rlexp.models.tokenizer.yes_no_ids`). With a BPE
vocabulary a judge answers " Yes" or "Yes" or "yes", each its own token, so the probability of one token
would call a confident yes and a confident no both about 0; the normalised pair does not.

The judge runs where its config says: its own model in its own service (`options.path`, the usual case;
`rlexp.actors.verifier.VerifierService` hosts this class), or the policy's generators
(`options.policy=true`). Either way this class only needs a function giving next-token logprobs.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlexp.models.backends import build_backend
from rlexp.models.tokenizer import Tokenizer, load_tokenizer, yes_no_ids
from rlexp.rewards.verifiers.base import Verifier
from rlexp.types import Problem

# One template per answer format an environment declares (`Environment.answer_format`).
TEMPLATES = {
    "free_form": ("Problem:\n{prompt}\n\nProposed answer:\n{response}\n\n"
                  "Is the proposed answer correct? Answer Yes or No."),
    "multiple_choice": ("Question:\n{prompt}\n\nProposed answer:\n{response}\n\n"
                        "Is the chosen option the correct one? Answer Yes or No."),
}
NextLogprobs = Callable[[list[list[int]], list[int]], list[list[float]]]


@dataclass
class JudgeOptions:
    path: str = ""  # the judge checkpoint (a Hugging Face folder); empty when `policy` is true
    policy: bool = False  # ask the policy's own generators (an untrained judge, unless the policy is one)
    template: str | None = None  # default: TEMPLATES[environment answer format]
    backend: str = "titan"  # the judge's generator backend: titan (CPU, exact) or vllm (GPU)
    batch_size: int = 64


def judge_probability(logprobs: list[list[float]], n_yes: int) -> list[float]:
    """Rows of logprobs for [yes ids..., no ids...] -> P(yes) normalised over yes and no."""
    out = []
    for row in logprobs:
        ly = _logsumexp(row[:n_yes])
        ln = _logsumexp(row[n_yes:])
        if ly == -math.inf and ln == -math.inf:
            out.append(0.5)  # the judge put no mass on either: no opinion
        else:
            d = ly - ln
            out.append(1.0 / (1.0 + math.exp(-d)) if d >= 0 else math.exp(d) / (1.0 + math.exp(d)))
    return out


def _logsumexp(xs: list[float]) -> float:
    m = max(xs, default=-math.inf)
    return m if m == -math.inf else m + math.log(sum(math.exp(x - m) for x in xs))


class LMJudgeVerifier(Verifier):
    kind = "lm_judge"

    def __init__(self, name: str, options: dict[str, Any], answer_format: str = "free_form") -> None:
        super().__init__(name)
        try:
            self.opts = JudgeOptions(**options)
        except TypeError as e:
            raise ValueError(f"verifier {name!r}: bad lm_judge options {sorted(options)}: {e}") from e
        if answer_format not in TEMPLATES and self.opts.template is None:
            raise ValueError(f"verifier {name!r}: no judge template for answer format {answer_format!r}")
        self.template = self.opts.template or TEMPLATES[answer_format]
        self.next_logprobs: NextLogprobs | None = None
        self.tokenizer: Tokenizer | None = None
        self.yes: list[int] = []
        self.no: list[int] = []

    def attach(self, next_logprobs: NextLogprobs, tokenizer: Tokenizer) -> None:
        """Give the judge its model: a next-token-logprob function and the tokenizer that encodes for it."""
        self.next_logprobs, self.tokenizer = next_logprobs, tokenizer
        self.yes, self.no = yes_no_ids(tokenizer)
        if not self.yes or not self.no:
            raise ValueError(f"lm_judge {self.name!r}: the judge's vocabulary has no yes-like or no-like token "
                             f"(yes: {self.yes}, no: {self.no}); it cannot answer Yes or No")

    def load(self, seed: int = 0, device: str = "cpu") -> None:
        """Load the judge checkpoint into this process (what the judge's own service does)."""
        tok = load_tokenizer(self.opts.path)
        backend = build_backend(self.opts.backend, self.opts.path, tok, seed, device=device)
        self.attach(backend.next_token_logprobs, tok)

    def render(self, problems: list[Problem], texts: list[str]) -> list[str]:
        return [self.template.format(prompt=p.prompt, response=t) for p, t in zip(problems, texts)]

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        if self.next_logprobs is None or self.tokenizer is None:
            raise RuntimeError(f"lm_judge verifier {self.name!r} has no model: it is served by its own service "
                               f"or by the policy's generators, attached after spawn")
        prompts = [self.tokenizer.encode(t) for t in self.render(problems, texts)]
        out: list[float] = []
        bs = max(1, self.opts.batch_size)
        for i in range(0, len(prompts), bs):
            out += judge_probability(self.next_logprobs(prompts[i:i + bs], self.yes + self.no), len(self.yes))
        return np.asarray(out, dtype=np.float64)
