"""Each tiny verifier measured on the starting policy's own outputs (issue 23 item 4), not only on the mix it
was trained on: what the reward actually scores in RL is the policy's samples, whose wrong answers
are mostly near misses, and the constant answer a collapsing policy drifts to.

    python studies/weaver/weaver_panels.py [--panels A,B,C] [--out
    studies/weaver/results/weaver_panels]

For the starting checkpoint of `experiment=weaver_cpu` (the warm-up, rlexp/run/warmup.py) it samples
`--k` responses at temperature 1 to each of the policy's training prompts (the prompts RL scores: no
held-out, no verifier-split problem), labels them with the task's check, and scores them through the
path a run uses (`score_examples`). Per verifier: ROC AUC (threshold-free), TPR and FPR at the
verifier's natural threshold, accuracy on near misses (off by one) and on the policy's most common
answer, and the answer bias: every prompt answered with each digit, the spread of the positive rate
across digits (a verifier that says yes to "8" whatever the question can pull a policy onto "8").
Writes OUT.md and OUT.json.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rlexp.envs.registry import build_env  # noqa: E402
from rlexp.models.numerics import pinned_numerics  # noqa: E402
from rlexp.models.tokenizer import load_tokenizer  # noqa: E402
from rlexp.rewards.verifiers.tiny import ensure_tiny_verifier, read_meta  # noqa: E402
from rlexp.rewards.verifiers.tiny_data import VerifierExample  # noqa: E402
from rlexp.rewards.verifiers.tiny_measure import score_examples  # noqa: E402
from rlexp.rewards.verifiers.tiny_panels import PANELS  # noqa: E402
from rlexp.run.prepare import check_config, resolve_model  # noqa: E402
from rlexp.run.warmup import ensure_warm_checkpoint  # noqa: E402


def starting_policy(overrides: list[str]) -> tuple[Path, Any, Any]:
    from hydra import compose, initialize_config_dir

    from rlexp.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=weaver_cpu", "reward=annotated", *overrides])
    t = check_config(cfg)
    env = build_env(t.environment)
    warm, _ = ensure_warm_checkpoint(resolve_model(t.model), t, env)
    return warm, env, t


@torch.no_grad()
def policy_examples(policy: Path, env: Any, k: int, seed: int) -> list[VerifierExample]:
    """`k` temperature-1 samples per training prompt, labelled by the task's check; kind = correct |
    near (off by one) | wrong (another digit) | junk (not a digit)."""
    from transformers import Qwen3ForCausalLM

    tok = load_tokenizer(policy)
    model = Qwen3ForCausalLM.from_pretrained(str(policy)).eval()
    gen = torch.Generator().manual_seed(seed)
    out = []
    # The prompts RL scores: the task's own draw (uniform over sums), not the training list
    # (binomial in sums).
    for s in env.sample_batch(len(env.train_samples()), random.Random(seed)):
        p = torch.softmax(
            model(torch.tensor([tok.encode(s.problem.prompt)])).logits[0, -1].float(), -1
        )
        for i in torch.multinomial(p, k, replacement=True, generator=gen).tolist():
            r = tok.decode([i])
            ok = env.check(s, r).correct
            kind = ("correct" if ok else "junk" if not (len(r) == 1 and r.isdigit())
                    else "near" if abs(int(r) - int(s.answer)) == 1 else "wrong")
            out.append(VerifierExample(s.problem.prompt, r, int(ok), kind))
    return out


def unseen_prompts(env: Any) -> set[str]:
    """Training prompts whose sum has no sequence in the verifier split: the verifiers never saw
    such a problem (sums 0 and 9 have one sequence each, which the policy keeps)."""
    from rlexp.rewards.verifiers.tiny_data import verifier_split_sequences

    seen = {
        sum(t)
        for t in verifier_split_sequences(
            env.opts.n_terms, env.opts.max_term, env.opts.verifier_frac
        )
    }
    return {s.problem.prompt for s in env.train_samples() if int(s.answer) not in seen}


def constant_examples(env: Any) -> list[VerifierExample]:
    return [VerifierExample(s.problem.prompt, str(d), int(str(d) == s.answer), f"const{d}")
            for s in env.train_samples() for d in range(10)]


def auc(scores: np.ndarray, y: np.ndarray) -> float:
    """ROC AUC by ranks (ties averaged): the chance a right response outscores a wrong one."""
    from scipy.stats import rankdata

    if y.all() or not y.any():
        return float("nan")
    r = rankdata(scores)
    return float((r[y].sum() - y.sum() * (y.sum() + 1) / 2) / (y.sum() * (~y).sum()))


def measure(path: Path, ex: list[VerifierExample], const: list[VerifierExample], common: str,
            unseen: set[str]) -> dict[str, float]:
    with pinned_numerics():
        s = score_examples(path, ex)
        sc = score_examples(path, const)
    thr = float(read_meta(path)["threshold"])
    y = np.array([e.label for e in ex], dtype=bool)
    kinds = np.array([e.kind for e in ex])
    v = s > thr
    resp = np.array([e.response for e in ex])
    rate = {
        d: float((sc[np.array([e.kind == f"const{d}" for e in const])] > thr).mean())
        for d in range(10)
    }
    new = np.array([e.prompt in unseen for e in ex])
    return {
        "auc": auc(s, y),
        "auc_seen": auc(s[~new], y[~new]),
        "auc_unseen": auc(s[new], y[new]),
        "tpr": float(v[y].mean()),
        "fpr": float(v[~y].mean()),
        "quality": float(v[y].mean() - v[~y].mean()),
        "acc_near": float((~v[kinds == "near"]).mean())
        if (kinds == "near").any()
        else float("nan"),
        "acc_common": float((v[resp == common] == y[resp == common]).mean()),
        "bias_spread": max(rate.values()) - min(rate.values()),
        "bias_top": float(max(rate, key=rate.get)),
        **{f"const_rate_{d}": r for d, r in rate.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--panels", default=",".join(PANELS))
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="studies/weaver/results/weaver_panels")
    ap.add_argument(
        "--override", action="append", default=[], help="a Hydra override of experiment=weaver_cpu"
    )
    a = ap.parse_args()
    policy, env, t = starting_policy(a.override)
    ex = policy_examples(policy, env, a.k, a.seed)
    kinds = collections.Counter(e.kind for e in ex)
    common = collections.Counter(e.response for e in ex).most_common(1)[0][0]
    const = constant_examples(env)
    unseen = unseen_prompts(env)
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for panel in a.panels.split(","):
        rows[panel] = {}
        for name, spec in PANELS[panel].items():
            rows[panel][name] = measure(ensure_tiny_verifier(spec), ex, const, common, unseen)
            print(
                panel,
                name,
                {k: round(v, 3) for k, v in rows[panel][name].items() if "const" not in k},
                flush=True,
            )
    cmd = "python studies/weaver/weaver_panels.py " + " ".join(sys.argv[1:])
    meta = {
        "command": cmd.strip(),
        "policy": str(policy),
        "n_responses": len(ex),
        "kinds": dict(kinds),
        "correct_share": kinds["correct"] / len(ex),
        "most_common_answer": common,
        "most_common_share": sum(e.response == common for e in ex) / len(ex),
        "seed": a.seed,
        "k": a.k,
        "unseen_share": sum(e.prompt in unseen for e in ex) / len(ex),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "panels": rows}, indent=2))
    L = [
        "# Tiny verifier panels measured on the starting policy's own outputs (issue 23 item 4)",
        "",
        f"Command: `{meta['command']}` (writes this file and {out.with_suffix('.json').name}).",
        "",
        "Starting policy: the warm-up checkpoint of "
        f"`{' '.join(['experiment=weaver_cpu', *a.override])}` (training "
        f"sums: {t.environment.options['train_sums']}). {len(ex)} responses ({a.k} samples at "
        f"temperature 1 per training prompt, sampling seed {a.seed}): "
        + ", ".join(f"{k} {v / len(ex):.3f}" for k, v in sorted(kinds.items()))
        + f"; most common answer {common!r} ({meta['most_common_share']:.3f} of responses).",
        "",
        "Columns: ROC AUC (threshold-free; 0.5 = chance), TPR / FPR at the verifier's natural "
        "threshold, TPR - FPR, share of near misses (off by one) rejected, accuracy on "
        "responses equal to the most common answer, and the answer bias: every training prompt "
        "answered with each digit, the largest minus the smallest positive rate across digits, "
        "and the digit with the largest.",
        "",
        (
            f"{meta['unseen_share']:.3f} of the responses answer a problem whose sum has no "
            "sequence in the verifiers' split (sums 0 and 9: one sequence each, kept for the "
            "policy); AUC is also given on those (unseen) and on the rest (seen)."
            if meta["unseen_share"]
            else "No response answers a problem whose sum the verifiers' "
            "split lacks (AUC unseen: nan)."
        ),
        "",
        "| panel | verifier | AUC | AUC seen | AUC unseen | TPR | FPR | TPR - FPR | near misses "
        "rejected | acc on the common answer | bias spread | favourite digit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for panel, r in rows.items():
        for name, m in r.items():
            L.append(
                f"| {panel} | {name} | {m['auc']:.3f} | {m['auc_seen']:.3f} "
                f"| {m['auc_unseen']:.3f} | {m['tpr']:.3f} | {m['fpr']:.3f} | "
                f"{m['quality']:.3f} | {m['acc_near']:.3f} | {m['acc_common']:.3f} "
                f"| {m['bias_spread']:.3f} | {int(m['bias_top'])} |"
            )
    out.with_suffix(".md").write_text("\n".join(L) + "\n")
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    random.seed(0)
    main()
