"""MMLU-Pro: 12,032 multiple-choice questions over 14 subjects with up to ten choices, letters A-J.

Data: `TIGER-Lab/MMLU-Pro` (splits `test`, `validation`; fields `question_id`, `question`, `options`,
`answer` (letter), `answer_index`, `category`, `src`) at the revision pinned in
`conf/environment/mmlu_pro.yaml`, read with `datasets` (local cache under HF_HUB_OFFLINE=1), or a local file
with the same fields via `environment.dataset`. Choices keep the dataset's order (as in the official
evaluation and lm-eval-harness); set `environment.options.shuffle_seed` to shuffle them like GPQA.

Prompt: the multiple-choice template of rlexp/envs/multiple_choice.py with (A)..(J).
Scoring: letter extraction among as many letters as the question has options.
"""
from __future__ import annotations

from rlexp.envs.base import register_env
from rlexp.envs.data import is_local_path, load_hf, read_local
from rlexp.envs.multiple_choice import LETTERS, TEMPLATE, MultipleChoiceEnv, make_sample, permutation
from rlexp.types import Sample


@register_env("mmlu_pro")
class MMLUPro(MultipleChoiceEnv):
    def _records(self, split: str) -> list[dict]:
        ds = self.cfg.dataset or "TIGER-Lab/MMLU-Pro"
        if is_local_path(ds):
            return read_local(ds, split)
        return load_hf(ds, self.cfg.revision, split)

    def load_samples(self, split: str) -> list[Sample]:
        template = self.cfg.options.get("template", TEMPLATE)
        seed = self.cfg.options.get("shuffle_seed")
        out = []
        for r in self._records(split):
            qid = str(r["question_id"])
            options = [str(o).strip() for o in r["options"]]
            correct = int(r["answer_index"]) if r.get("answer_index") is not None else LETTERS.index(r["answer"])
            perm = permutation(qid, int(seed), len(options)) if seed is not None else None
            sample, perm = make_sample(qid, str(r["question"]), options, correct, template, perm,
                                       None if seed is None else int(seed), {"category": r.get("category", "")})
            self._perms[qid] = perm
            out.append(sample)
        return out
