"""Shared parts of multiple-choice environments: prompt layout, seeded choice shuffling, letter scoring.

Shuffling: GPQA lists the correct answer first in its source file, so choices must be permuted or "A" is
always right. The permutation of each question comes from `random.Random(seed)` with
seed = sha256("<shuffle_seed>:<question id>"): independent of load order, of Python's hash
randomisation and of which other questions are loaded, so the same (shuffle_seed, id) gives the same
order on every machine. `shuffle_seed` is a config value and so lands in the run manifest.

What is recorded where: `Problem.meta["choices"]` maps each letter to the choice text shown (exactly what
the prompt shows) plus `shuffle_seed`; the source index of each letter (`permutation`) reveals the gold
letter, so it is kept out of `Problem` (which label-free verifiers see) and is available from
`MultipleChoiceEnv.record(sample)` for evaluation logs.
"""
from __future__ import annotations

import hashlib
import random
import string

from rlexp.envs.base import Check, Environment
from rlexp.evals.extract import check_choice
from rlexp.types import Problem, Sample

LETTERS = string.ascii_uppercase

TEMPLATE = ("Answer the following multiple choice question. Think step by step, then answer with the "
            "letter of the correct choice, ending with \"The answer is (X)\".\n\n{question}\n\n{choices}\n")


def permutation(question_id: str, shuffle_seed: int, n: int) -> list[int]:
    """Source index shown at each letter position: `perm[j]` is the original choice shown as LETTERS[j]."""
    seed = int.from_bytes(hashlib.sha256(f"{shuffle_seed}:{question_id}".encode()).digest()[:8], "big")
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    return perm


def format_choices(choices: list[str]) -> str:
    return "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))


def make_sample(qid: str, question: str, choices: list[str], correct_index: int, template: str,
                perm: list[int] | None = None, shuffle_seed: int | None = None,
                extra_meta: dict | None = None) -> tuple[Sample, list[int]]:
    """Build a sample whose gold letter follows the correct choice through the permutation."""
    perm = perm if perm is not None else list(range(len(choices)))
    shown = [choices[i] for i in perm]
    gold = LETTERS[perm.index(correct_index)]
    meta = {"choices": {LETTERS[j]: c for j, c in enumerate(shown)}, **(extra_meta or {})}
    if shuffle_seed is not None:
        meta["shuffle_seed"] = shuffle_seed
    prompt = template.format(question=question.strip(), choices=format_choices(shown))
    return Sample(Problem(id=qid, prompt=prompt, meta=meta), answer=gold), perm


class MultipleChoiceEnv(Environment):
    """Scores the chosen letter; the number of valid letters comes from the sample's choices."""

    def __init__(self, cfg) -> None:  # noqa: ANN001 - EnvConfig, kept loose for subclasses
        super().__init__(cfg)
        self._perms: dict[str, list[int]] = {}

    def check(self, sample: Sample, response: str) -> Check:
        r = check_choice(sample.answer, response, len(sample.problem.meta["choices"]))
        return Check(correct=r.correct, parseable=r.parseable, extracted=r.extracted)

    def record(self, sample: Sample) -> dict:
        """Evaluation-log extras (gold-revealing, so never put into Problem.meta)."""
        return {"choice_permutation": self._perms.get(sample.id), "gold_letter": sample.answer}
