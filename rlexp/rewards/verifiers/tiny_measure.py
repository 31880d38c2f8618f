"""The tiny verifiers (`tiny.py`) as functions, and how good they are: scoring through the paths a
run uses, hard verdicts at their natural thresholds, accuracy on fresh noise-free examples, and a
panel's report.

`python -m rlexp.rewards.verifiers.tiny_measure` trains panel A (or reuses it) and prints its
accuracies and pairwise agreement.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlexp.models.numerics import pinned_numerics
from rlexp.rewards.verifiers.reward_model import RewardModelVerifier
from rlexp.rewards.verifiers.tiny import TinyVerifierSpec, ensure_tiny_verifier, read_meta
from rlexp.rewards.verifiers.tiny_data import (
    JUDGE_TEMPLATE,
    MIX_KINDS,
    VerifierExample,
    held_out_sequences,
    last_logits,
    make_examples,
    pad_rows,
    verifier_split_sequences,
    yes_no_token_ids,
)
from rlexp.rewards.verifiers.tiny_panels import PANELS
from rlexp.types import Problem

# measure_accuracy's examples: same for every spec, so predictions can be compared
_EVAL_SEED = 7_000_003


class TinyJudge:
    """A tiny judge folder as a function: judge prompts in, P(yes-like) / P(yes- or no-like) out.

    Reads yes/no as token sets (`yes_no_token_ids`), which is what a real judge's scorer must do.
    """

    def __init__(self, path: str | Path, batch_size: int = 64) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()
        self.yes, self.no = yes_no_token_ids(self.tokenizer)
        self.batch_size = batch_size

    def __call__(self, judge_prompts: list[str]) -> list[float]:
        out: list[float] = []
        pad = self.tokenizer.pad_token_id
        with torch.inference_mode():
            for i in range(0, len(judge_prompts), self.batch_size):
                rows = [self.tokenizer.encode(p, add_special_tokens=False)
                        for p in judge_prompts[i:i + self.batch_size]]
                ids, mask = pad_rows(rows, pad)
                p = torch.softmax(last_logits(self.model, ids, mask).float(), dim=-1)
                y, n = p[:, self.yes].sum(-1), p[:, self.no].sum(-1)
                out.extend((y / (y + n).clamp_min(1e-12)).tolist())
        return out


def score_examples(path: str | Path, examples: list[VerifierExample]) -> np.ndarray:
    """Scores through the path a run uses: `RewardModelVerifier` (format=auto, so the chat template
    from the folder) for a reward model; for a judge, `TinyJudge` on the judge template
    (`JUDGE_TEMPLATE`, the lm_judge verifier's free-form template) rendered from the env's prompt
    and the response."""
    kind = read_meta(path)["spec"]["kind"]
    texts = [e.response for e in examples]
    if kind == "reward_model":

        v = RewardModelVerifier("tiny_rm", {"path": str(path), "format": "auto", "batch_size": 256})
        return v.score([Problem(id=e.prompt, prompt=e.prompt) for e in examples], texts)
    judge = TinyJudge(path, batch_size=256)
    return np.asarray(
        judge(
            [JUDGE_TEMPLATE.format(prompt=e.prompt, response=t) for e, t in zip(examples, texts)]
        ),
        dtype=np.float64,
    )


def predict(path: str | Path, examples: list[VerifierExample]) -> np.ndarray:
    """Hard verdicts at the natural threshold stored in the folder: RM logit > 0 (BCE was trained on
    roughly balanced labels, and symmetric label noise leaves the Bayes threshold at 0, so no
    threshold is tuned on data), judge P(yes) > 0.5."""
    return score_examples(path, examples) > float(read_meta(path)["threshold"])


def evaluation_examples(spec: TinyVerifierSpec, split: str, n: int = 1000,
                        seed: int = _EVAL_SEED) -> list[VerifierExample]:
    """Noise-free examples on `split` ("verifier" or "held_out"); independent of `spec.seed`, so
    every verifier of the same task is measured on the same examples and their verdicts can be
    compared."""
    if split == "verifier":
        seqs = verifier_split_sequences(spec.n_terms, spec.max_term, spec.verifier_frac)
    elif split == "held_out":
        seqs = held_out_sequences(spec.n_terms, spec.max_term)
    else:
        raise ValueError(
            f"evaluation_examples: split must be 'verifier' or 'held_out', got {split!r}"
        )
    return make_examples(seqs, n, seed + (split == "held_out"), mix=spec.mix, n_terms=spec.n_terms,
                         max_term=spec.max_term)


def _accuracy(pred: np.ndarray, ex: list[VerifierExample]) -> dict[str, float]:
    y = np.array([e.label for e in ex], dtype=bool)
    both = y.any() and (~y).any()
    out = {
        "acc": float((pred == y).mean()),
        "balanced_acc": float(0.5 * (pred[y].mean() + (~pred[~y]).mean()))
        if both
        else float("nan"),
    }
    kinds = np.array([e.kind for e in ex])
    for k in MIX_KINDS:
        if (kinds == k).any():
            out[f"acc_{k}"] = float((pred[kinds == k] == y[kinds == k]).mean())
    return out


def measure_accuracy(path: str | Path, spec: TinyVerifierSpec, n: int = 1000) -> dict[str, float]:
    """Accuracy on fresh noise-free examples from the verifier split (which the verifier trained on,
    so close to training accuracy) and from the held-out split (what matters), at the natural
    threshold (see `predict`). Keys: verifier_acc, held_out_acc, held_out_balanced_acc and
    held_out_acc_<kind> per response kind; the response mix is `spec.mix` (half correct: 0.5 is
    chance)."""
    out: dict[str, float] = {}
    for split in ("verifier", "held_out"):
        ex = evaluation_examples(spec, split, n)
        with pinned_numerics():
            pred = predict(path, ex)
        for k, v in _accuracy(pred, ex).items():
            if split == "verifier" and k != "acc":
                continue
            out[f"{split}_{k}"] = v
    return out


def panel_report(specs: dict[str, TinyVerifierSpec] | None = None, n: int = 1000,
                 cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Train (or reuse) every spec, measure it, and compute pairwise agreement of held-out
    verdicts."""
    specs = PANELS["A"] if specs is None else specs
    rows: dict[str, dict[str, Any]] = {}
    verdicts: dict[str, np.ndarray] = {}
    for name, spec in specs.items():
        path = ensure_tiny_verifier(spec, cache_dir)
        rows[name] = measure_accuracy(path, spec, n)
        with pinned_numerics():
            verdicts[name] = predict(path, evaluation_examples(spec, "held_out", n))
    names = list(specs)
    agreement = {a: {b: float((verdicts[a] == verdicts[b]).mean()) for b in names} for a in names}
    return {"rows": rows, "agreement": agreement}


def _main() -> None:
    rep = panel_report()
    cols = ["verifier_acc", "held_out_acc", "held_out_balanced_acc",
            *[f"held_out_acc_{k}" for k in MIX_KINDS]]
    print("name".ljust(14) + "".join(c.removeprefix("held_out_").ljust(14) for c in cols))
    for name, row in rep["rows"].items():
        print(name.ljust(14) + "".join(f"{row.get(c, float('nan')):<14.3f}" for c in cols))
    names = list(rep["rows"])
    print("\nheld-out agreement\n" + " " * 14 + "".join(n.ljust(14) for n in names))
    for a in names:
        print(a.ljust(14) + "".join(f"{rep['agreement'][a][b]:<14.3f}" for b in names))


if __name__ == "__main__":
    _main()
