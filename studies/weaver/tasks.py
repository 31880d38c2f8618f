"""What the Weaver analysis (studies/weaver/weaver_analysis.py) reads for each task, and the parts
of it that are one task's.

`--task` picks the held-out set whose curve is the statistic: the run's own evaluation
(`arithmetic`: the CPU panels; `math`: the GPU table's environment=math, its registered statistic;
`eval_samples/train_step*.jsonl`) or one of experiment=qwen3_8b_math's extra benchmarks (`math500`,
`gpqa`: GPQA Diamond, `mmlu_pro`: MMLU-Pro; `eval_samples/<benchmark>_step*.jsonl`, which every run
writes at each evaluation). Balanced accuracy is the arithmetic task's statistic (ten answer
classes, binomial held-out set); the others use plain accuracy (free-form answers are nearly one
class per problem; multiple-choice letters are permuted per problem, so no letter is favoured). The
static best-of-10 baseline answers every prompt with each digit 0-9, so it exists for the arithmetic
task only.

Whether a Weaver run fell back to the mean (addendum v15) is read from its metrics.jsonl with `rlexp
compare`'s run loader (rlexp.tracking.runs.load_run_dir: damaged rows are dropped and named), the
intervals come from rlexp.tracking.stats (the t quantiles `rlexp compare` states).
"""
from __future__ import annotations

import statistics as st
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Task:
    samples: str  # the eval_samples file prefix: <samples>_step<N>.jsonl
    balanced: bool  # balanced accuracy over gold answer classes (else plain accuracy)
    static_selection: bool  # the digits-0-9 best-of-10 baseline applies
    label: str
    # environment.options of the arithmetic task beyond verifier_frac: the held-out set the static
    # baseline answers must be the one the runs evaluated
    env_options: tuple[tuple[str, Any], ...] = ()


TASKS = {
    "arithmetic": Task("train", True, True, "the arithmetic held-out set (balanced accuracy)"),
    # addendum v18 (issue 46 item 3): environment.options.held_out_min=8, sums 2-7, >= 9 each
    "arithmetic_h": Task("train", True, True, "the arithmetic held-out set of sums 2-7 "
                         "(held_out_min=8; balanced accuracy)", (("held_out_min", 8),)),
    # The GPU table's registered statistic (addenda v13, v16): the run's own held-out set of
    # environment=math.
    "math": Task(
        "train", False, False, "the MATH held-out set of the run's environment (plain accuracy)"
    ),
    "math500": Task("math500", False, False, "MATH-500 (plain accuracy)"),
    "gpqa": Task("gpqa_diamond", False, False, "GPQA Diamond (plain accuracy)"),
    "mmlu_pro": Task("mmlu_pro", False, False, "MMLU-Pro (plain accuracy)"),
}
# rewards that can fall back
WEAVER_ARMS = ("weaver_paper", "weaver", "verifier_mean", "verifier_vote")


def task(name: str) -> Task:
    if name not in TASKS:
        raise SystemExit(
            f"--task {name!r}: choose one of {sorted(TASKS)} (the held-out set the statistic reads)"
        )
    return TASKS[name]


def fell_back(job: Path) -> bool | None:
    """True when the run's label model fell back to the mean at any step (`reward/weaver_fallback`),
    None when the run logged no such metric (not a Weaver reward, or metrics.jsonl missing)."""
    from rlexp.tracking.runs import load_run_dir

    if not (job / "metrics.jsonl").is_file():
        return None
    seen = [
        row["reward/weaver_fallback"]
        for row in load_run_dir(job).history
        if "reward/weaver_fallback" in row
    ]
    return any(float(v) > 0 for v in seen) if seen else None


def fallback_counts(runs: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per Weaver arm, [runs that fell back to the mean, runs that logged the metric]."""
    out: dict[str, list[int]] = {}
    for r in runs:
        if r["arm"] in WEAVER_ARMS and r.get("fell_back") is not None:
            n = out.setdefault(r["arm"], [0, 0])
            n[0] += int(bool(r["fell_back"]))
            n[1] += 1
    return out


def fallback_lines(counts: dict[str, list[int]]) -> list[str]:
    bad = {a: n for a, n in counts.items() if n[0]}
    if not counts:
        return []
    if not bad:
        return [
            "",
            "No Weaver run fell back to the mean (reward/weaver_fallback stayed 0 in every run "
            "that logs it).",
        ]
    return [
        "",
        "FELL BACK TO THE MEAN (addendum v15: reward/weaver_fallback = 1 at some step, so these "
        "runs measure the filtered mean, not the label model): "
        + ", ".join(f"{a} {k} of {n} runs" for a, (k, n) in bad.items())
        + ".",
    ]


# --- the static best-of-K baseline: what each reward could reach if the policy found its best
# answer ------------
def static_selection(
    best: str | None, verifier_set: str, balanced: Any, env_options: tuple = ()
) -> dict[str, dict[str, float]]:
    """Every held-out prompt answered with each digit 0-9 (K=10); each reward scores the 10
    candidates as one group and its top-scored one is the answer. Weaver the paper's way gets its
    dev budget from these candidates' gold. `balanced(records)` is the analysis's balanced
    accuracy."""
    from omegaconf import OmegaConf

    from rlexp.config.environment import EnvConfig
    from rlexp.config.paths import CONF_DIR
    from rlexp.config.reward import RewardConfig, VerifierConfig
    from rlexp.envs.registry import build_env
    from rlexp.rewards.registry import build_reward
    from rlexp.rewards.verifiers.registry import verifier_checkpoint

    env = build_env(
        EnvConfig(name="arithmetic", options={"verifier_frac": 0.25, **dict(env_options)})
    )
    held = env.eval_samples()
    listed = OmegaConf.to_container(
        OmegaConf.load(CONF_DIR / "verifier_set" / f"{verifier_set}.yaml")
    )["members"]
    members = [verifier_checkpoint(VerifierConfig(**m)) if m["kind"] in ("reward_model", "lm_judge")
               else VerifierConfig(**m) for m in listed]

    def options(name: str) -> dict[str, Any]:
        """A reward file's options over those of the files in its `defaults` (as Hydra composes
        them)."""
        c = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "reward" / f"{name}.yaml"))
        out: dict[str, Any] = {}
        for d in c.get("defaults", []):
            out.update(options(d))
        return {**out, **c.get("options", {})}

    pooled = {"reference_groups": len(held)}  # the candidates are the pool
    arms = {
        "single_rm": ("single_rm", {}),
        "verifier_mean": ("weaver", {**options("verifier_mean"), **pooled}),
        "verifier_vote": ("weaver", {**options("verifier_vote"), **pooled}),
        "weaver": ("weaver", options("weaver")),
        "weaver_paper": ("weaver", {**options("weaver_paper"), **pooled}),
    }
    if best:
        arms["best_verifier"] = ("single_rm", {"verifier": best})
    samples = [s for s in held for _ in range(10)]
    texts = [str(d) for _ in held for d in range(10)]
    out = {}
    for arm, (name, opts) in arms.items():
        reward = build_reward(
            RewardConfig(name=name, verifiers=members, options=opts), env, served=False
        )
        r = reward.score(samples, texts, group_size=10).rewards
        recs = []
        for g, s in enumerate(held):
            pick = max(range(10), key=lambda d: (r[g * 10 + d], -d))
            recs.append({"gold": s.answer, "correct": str(pick) == s.answer})
        out[arm] = {"balanced": balanced(recs), "plain": st.mean(x["correct"] for x in recs)}
    out["annotated"] = {"balanced": 1.0, "plain": 1.0}
    return out
