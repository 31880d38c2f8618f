"""Shared parts of multiple-choice environments: prompt layout, leak-free choice ordering, letter scoring.

Ordering: GPQA lists the correct answer first in its source file, so the source order cannot be shown (or
"A" is always right), and it must not be merely *permuted* either: any permutation that is a public function
of the question (id, a config seed) lets whoever sees the `Problem` (a label-free verifier, the policy)
recompute it and read off where source index 0 went, i.e. the gold letter. An earlier version did exactly
that (`random.Random(sha256("<shuffle_seed>:<id>")).shuffle(range(n))` with the seed in `Problem.meta`).

So the shown order is computed from the choices' own texts: each choice is ranked by the keyed hash
sha256("<shuffle_seed>:<question id>:<choice text>"), a hash tie (astronomically unlikely between different
texts) falling back to the text itself. The order is therefore a function of (shuffle_seed, id, the *set* of
choice texts) only, never of the source positions: two source files that list the same choices in any order,
with any one of them marked correct, give the identical prompt. Nothing computable from the `Problem`, with
or without the seed and this rule, can tell which choice is correct beyond the content of the question
itself, and over many questions the gold letter is spread uniformly (the hash is a pseudo-random function of
the text). The rule needs nothing but `hashlib`, so it gives the same order on every machine and Python
version, independent of load order, hash randomisation and which other questions are loaded;
`shuffle_seed` is a config value and lands in the run manifest, and another seed gives another (equally
leak-free) order.

Identical choice texts: copies of one text are indistinguishable in the prompt, so their relative order is
invisible; among them the correct copy (if the correct text is duplicated) is put first, so the gold letter
is the first copy, and `check` accepts every letter that shows the gold text (which copy the source marked
correct is not something a reader of the prompt could know).

What is recorded where: `Problem.meta["choices"]` maps each letter to the choice text shown (exactly what
the prompt shows, so it adds nothing to the prompt); `shuffle_seed` is not put there (the order does not
need it to be checked, and the config/manifest keeps it). The source index of each letter reveals the gold
letter (source index 0 is GPQA's correct answer), so it stays in environment-private state and is reported
by `MultipleChoiceEnv.record(sample)` for evaluation logs only.
"""
from __future__ import annotations

import hashlib
import string

from rlexp.envs.answers import check_choice, extract_choice
from rlexp.envs.base import Check, Environment
from rlexp.types import Problem, Sample

LETTERS = string.ascii_uppercase

TEMPLATE = ("Answer the following multiple choice question. Think step by step, then answer with the "
            "letter of the correct choice, ending with \"The answer is (X)\".\n\n{question}\n\n{choices}\n")


def choice_key(question_id: str, shuffle_seed: int, text: str) -> bytes:
    """The keyed hash that ranks one choice: depends on the choice's text, never on its source position."""
    return hashlib.sha256(f"{shuffle_seed}:{question_id}:{text}".encode()).digest()


def text_order(question_id: str, shuffle_seed: int, choices: list[str], correct_index: int | None = None) -> list[int]:
    """Source index shown at each letter position (`order[j]` is the source choice shown as LETTERS[j]).

    Sorted by (keyed hash of the text, text): a function of the set of texts only. The last two sort keys
    only order identical copies of one text, which look the same in the prompt: the correct copy first, then
    by source index (both invisible to a reader of the prompt)."""
    return sorted(range(len(choices)),
                  key=lambda i: (choice_key(question_id, shuffle_seed, choices[i]), choices[i], i != correct_index, i))


def format_choices(choices: list[str]) -> str:
    return "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))


def make_sample(qid: str, question: str, choices: list[str], correct_index: int, template: str,
                order: list[int] | None = None, extra_meta: dict | None = None) -> tuple[Sample, list[int]]:
    """Build a sample showing `choices` in `order` (source indices; None keeps the source order); the gold
    letter follows the correct choice. Returns the sample and the order (for `record`, never for meta)."""
    order = order if order is not None else list(range(len(choices)))
    if sorted(order) != list(range(len(choices))):
        raise ValueError(f"question {qid!r}: order {order} is not a permutation of {len(choices)} choices")
    shown = [choices[i] for i in order]
    gold = LETTERS[order.index(correct_index)]
    meta = {"choices": {LETTERS[j]: c for j, c in enumerate(shown)}, **(extra_meta or {})}
    prompt = template.format(question=question.strip(), choices=format_choices(shown))
    return Sample(Problem(id=qid, prompt=prompt, meta=meta), answer=gold), order


class MultipleChoiceEnv(Environment):
    """Scores the chosen letter; the number of valid letters comes from the sample's choices."""

    answer_format = "multiple_choice"

    def __init__(self, cfg) -> None:  # EnvConfig, kept loose for subclasses
        super().__init__(cfg)
        self._perms: dict[str, list[int]] = {}

    def orders_by_text(self) -> bool:
        """Whether choices are shown in `text_order` (then every copy of the gold text scores, see above)."""
        return True

    def extract(self, problem: Problem, response: str) -> str | None:
        """The chosen option's text (two letters showing the same text are the same answer)."""
        choices = problem.meta["choices"]
        letter = extract_choice(response, len(choices))
        return None if letter is None else choices[letter]

    def check(self, sample: Sample, response: str) -> Check:
        choices = sample.problem.meta["choices"]
        r = check_choice(sample.answer, response, len(choices))
        correct = r.correct or (r.parseable and self.orders_by_text()
                                and choices.get(r.extracted) == choices.get(sample.answer))
        return Check(correct=correct, parseable=r.parseable, extracted=r.extracted)

    def record(self, sample: Sample) -> dict:
        """Evaluation-log extras (gold-revealing, so never put into Problem.meta): the source index shown at
        each letter and the gold letter."""
        return {"choice_permutation": self._perms.get(sample.id), "gold_letter": sample.answer}
