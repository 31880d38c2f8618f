r"""MATH-style problems with free-form LaTeX answers (MATH-500 by default).

Data: `HuggingFaceH4/MATH-500` (500 test problems; fields `problem`, `solution`, `answer`, `subject`,
`level`, `unique_id`) at the revision pinned in `conf/environment/math.yaml`, read with `datasets` (from the
local cache under HF_HUB_OFFLINE=1). For RL training point `environment.dataset` at another dataset with
the same fields (or a local file); the loader is the same.

Prompt (override with `environment.options.template`, which receives `{question}`):

    Solve the following math problem. Reason step by step, and put your final answer within \boxed{}.

    {question}

Scoring: the last `\boxed{...}` after thinking blocks are removed, compared with Math-Verify
(`rlexp.envs.answers.check_math_batch`). `check_batch` sends a whole batch to the worker pool at once.
"""
from __future__ import annotations

from dataclasses import dataclass

from rlexp.envs.answers import check_math_batch, last_boxed
from rlexp.envs.base import Check, Environment, register_env
from rlexp.envs.data import DatasetMissing, is_local_path, load_hf, read_local
from rlexp.types import Problem, Sample

MATH500 = "HuggingFaceH4/MATH-500"
TEMPLATE = ("Solve the following math problem. Reason step by step, and put your final answer within "
            "\\boxed{{}}.\n\n{question}")


@dataclass
class MathOptions:
    template: str = TEMPLATE  # receives {question}
    hf_config: str | None = None
    question_key: str = "problem"  # the dataset's fields
    answer_key: str = "answer"


@register_env("math")
class MathEnv(Environment):
    Options = MathOptions

    def _records(self, split: str) -> list[dict]:
        ds = self.cfg.dataset or MATH500
        if is_local_path(ds):
            return read_local(ds, split)
        if ds == MATH500 and split != "test":
            raise DatasetMissing(f"{MATH500} has only a test split (the 500 evaluation problems), not {split!r}; "
                                 f"to train, set environment.dataset to a MATH training set with `problem` and "
                                 f"`answer` fields (an HF id with environment.revision, or a local JSONL file)")
        return load_hf(ds, self.cfg.revision, split, self.opts.hf_config)

    def load_samples(self, split: str) -> list[Sample]:
        template, question_key, answer_key = self.opts.template, self.opts.question_key, self.opts.answer_key
        out = []
        for i, r in enumerate(self._records(split)):
            meta = {k: r[k] for k in ("subject", "level") if k in r}
            out.append(Sample(Problem(id=str(r.get("unique_id", f"math/{split}/{i}")),
                                      prompt=template.format(question=r[question_key]), meta=meta),
                              answer=str(r[answer_key])))
        return out

    def extract(self, problem: Problem, response: str) -> str | None:
        """The last boxed answer, spaces removed (majority voting compares text; `check` compares math)."""
        boxed = last_boxed(response)
        return None if boxed is None else "".join(boxed.split())

    def check(self, sample: Sample, response: str) -> Check:
        return self.check_batch([sample], [response])[0]

    def check_batch(self, samples: list[Sample], responses: list[str]) -> list[Check]:
        results = check_math_batch([s.answer for s in samples], responses)
        return [Check(correct=r.correct, parseable=r.parseable, extracted=r.extracted) for r in results]
