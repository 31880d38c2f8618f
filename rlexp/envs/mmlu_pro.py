"""MMLU-Pro: 12,032 multiple-choice questions over 14 subjects with up to ten choices, letters A-J.

Data: `TIGER-Lab/MMLU-Pro` (splits `test`, `validation`; fields `question_id`, `question`, `options`,
`answer` (letter), `answer_index`, `category`, `src`) at the revision pinned in
`conf/environment/mmlu_pro.yaml`, read with `datasets` (local cache under HF_HUB_OFFLINE=1), or a local file
with the same fields via `environment.dataset`.

Choice order: by default the dataset's order, as in the official evaluation and lm-eval-harness. That does
not hand the gold letter to a label-free verifier: unlike GPQA, the source does not put the correct option at
a fixed position (`answer_index` varies per question), and `Problem` carries only what the prompt shows (the
options in the published order, and the category); no seed or permutation that could be inverted. Whatever
position prior the published order has is part of the benchmark that every evaluation of it shows (rlexp
adds nothing to it). Set `environment.options.shuffle_seed` to order the options instead by the keyed hash
of their texts, exactly as GPQA does (rlexp/envs/multiple_choice.py): a function of the set of options only,
so also leak-free, and independent of the published order and of any position prior in it. Only in that
mode does a response naming another letter with the gold text verbatim (a duplicated option) count as right;
in dataset order scoring is by letter, as in the official evaluation.

Prompt: the multiple-choice template of rlexp/envs/multiple_choice.py with (A)..(J).
Scoring: letter extraction among as many letters as the question has options.
"""
from __future__ import annotations

from dataclasses import dataclass

from rlexp.envs.base import register_env
from rlexp.envs.data import is_local_path, load_hf, read_local
from rlexp.envs.multiple_choice import LETTERS, TEMPLATE, MultipleChoiceEnv, make_sample, text_order
from rlexp.types import Sample


@dataclass
class MMLUProOptions:
    template: str = TEMPLATE  # receives {question} and {choices}
    shuffle_seed: int | None = None  # None: the dataset's order of choices


@register_env("mmlu_pro")
class MMLUPro(MultipleChoiceEnv):
    Options = MMLUProOptions

    def _records(self, split: str) -> list[dict]:
        ds = self.cfg.dataset or "TIGER-Lab/MMLU-Pro"
        if is_local_path(ds):
            return read_local(ds, split)
        return load_hf(ds, self.cfg.revision, split)

    def orders_by_text(self) -> bool:
        return self.opts.shuffle_seed is not None

    def load_samples(self, split: str) -> list[Sample]:
        template, seed = self.opts.template, self.opts.shuffle_seed
        out = []
        for r in self._records(split):
            qid = str(r["question_id"])
            options = [str(o).strip() for o in r["options"]]
            correct = int(r["answer_index"]) if r.get("answer_index") is not None else LETTERS.index(r["answer"])
            order = text_order(qid, int(seed), options, correct) if seed is not None else None
            sample, order = make_sample(qid, str(r["question"]), options, correct, template, order,
                                        {"category": r.get("category", "")})
            self._perms[qid] = order
            out.append(sample)
        return out
