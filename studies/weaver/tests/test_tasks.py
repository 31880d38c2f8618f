"""The Weaver analysis on the GPU table's tasks (issue 46 item 5): `--task math|gpqa|mmlu_pro` reads
that benchmark's eval samples (what `rlexp train experiment=qwen3_8b_math` writes at each
evaluation: eval_samples/train_step* for the environment's own held-out set,
eval_samples/<benchmark>_step* for each extra benchmark), takes plain accuracy, skips the
digits-only static baseline, and reports every Weaver run that fell back to the mean (addendum v15),
read from its metrics.jsonl with rlexp compare's loader. The run folders are written here in the
formats rlexp writes (a GPU run cannot happen on this machine); the figures are computed by hand in
each test."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
for p in (REPO, REPO / "studies" / "weaver"):
    sys.path.insert(0, str(p))
import tasks  # noqa: E402
import weaver_analysis as wa  # noqa: E402

MATH = [r"\frac{1}{2}", r"3\sqrt{2}", "(1, -2)", r"\pi/4", "12", "x^2+1", r"\{1, 3\}", "0.25"] * 5
GOLDS = {
    "train": MATH,
    "math500": MATH,
    "gpqa_diamond": list("ABCD") * 10,
    "mmlu_pro": list("ABCDEFGHIJ") * 4,
}


def _run(
    root: Path, bench: str, reward: str, seed: int, acc: dict[int, float], fallback: list[int] = ()
) -> None:
    job = root / f"{reward}-{seed}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra/overrides.yaml").write_text(
        f"- experiment=qwen3_8b_math\n- reward={reward}\n- seed={seed}\n"
    )
    (job / "eval_samples").mkdir()
    golds = GOLDS[bench]
    for step, a in acc.items():
        k = round(a * len(golds))
        lines = [
            json.dumps(
                {"gold": g, "correct": i < k, "response": "...", "extracted": g if i < k else "7"}
            )
            for i, g in enumerate(golds)
        ]
        (job / "eval_samples" / f"{bench}_step{step:06d}.jsonl").write_text("\n".join(lines) + "\n")
        # another benchmark's samples too, at another accuracy: --task must not read these
        other = "mmlu_pro" if bench != "mmlu_pro" else "train"
        (job / "eval_samples" / f"{other}_step{step:06d}.jsonl").write_text(
            "\n".join(lines[:1]) + "\n"
        )
    if reward in tasks.WEAVER_ARMS:
        rows = [
            {"step": s, "reward/mean": 0.5, "reward/weaver_fallback": float(s in fallback)}
            for s in (1, 2, 3)
        ]
        (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    "name,bench",
    [("math", "train"), ("math500", "math500"), ("gpqa", "gpqa_diamond"), ("mmlu_pro", "mmlu_pro")],
)
def test_each_task_reads_its_benchmark_and_names_the_runs_that_fell_back(
    tmp_path: Path, name: str, bench: str
):
    sweep = tmp_path / "sweep"
    for seed in range(3):
        _run(
            sweep,
            bench,
            "weaver_paper",
            seed,
            {0: 0.5, 100: 0.7, 200: 0.9},
            fallback=[2] if seed == 1 else [],
        )
        _run(sweep, bench, "verifier_mean", seed, {0: 0.5, 100: 0.6, 200: 0.7})
        _run(sweep, bench, "annotated", seed, {0: 0.5, 100: 0.9, 200: 0.9})
    out = tmp_path / "res"
    assert wa.main([str(sweep), "--task", name, "--out", str(out)]) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert (
        res["statistic"]
        == f"AUC of plain held-out accuracy on {tasks.TASKS[name].label.split(' (')[0]}"
    )
    # (0.6 + 0.8) / 2, not train_step's
    assert abs(res["arms"]["weaver_paper"]["auc"]["mean"] - 0.7) < 1e-9
    assert abs(res["start_gap_fraction"]["weaver_paper"]["point"] - 2 / 3) < 1e-9
    # the digits-0-9 baseline is the arithmetic task's
    assert res["baselines"]["static_best_of_k"] == {}
    assert res["fallback_runs"] == {"weaver_paper": [1, 3], "verifier_mean": [0, 3]}
    assert (
        "FELL BACK TO THE MEAN" in (md := out.with_suffix(".md").read_text())
        and "weaver_paper 1 of 3 runs" in md
    )


def test_no_fallback_is_said_and_an_unknown_task_is_refused(tmp_path: Path):
    sweep = tmp_path / "sweep"
    for seed in range(2):
        _run(sweep, "train", "weaver_paper", seed, {0: 0.5, 100: 0.7})
        _run(sweep, "train", "annotated", seed, {0: 0.5, 100: 0.9})
    out = tmp_path / "res"
    assert wa.main([str(sweep), "--task", "math", "--out", str(out)]) == 0
    assert "No Weaver run fell back" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        wa.main([str(sweep), "--task", "aime", "--out", str(out)])
    # no metrics.jsonl: not a Weaver reward's run
    assert tasks.fell_back(sweep / "annotated-0") is None


def test_the_headroom_task_answers_the_held_out_set_its_runs_evaluate():
    """addendum v18: `--task arithmetic_h`'s static baseline must answer the 122 prompts of sums 2-7
    that `+environment.options.held_out_min=8` runs evaluate, not the 126 of sums 1-8."""
    from rlexp.config.environment import EnvConfig
    from rlexp.envs.registry import build_env

    t = tasks.TASKS["arithmetic_h"]
    assert t.balanced and t.static_selection and t.samples == "train"
    env = build_env(EnvConfig(name="arithmetic",
                              options={"verifier_frac": 0.25, **dict(t.env_options)}))
    held = env.eval_samples()
    assert len(held) == 122 and {s.answer for s in held} == set("234567")
    assert tasks.TASKS["arithmetic"].env_options == ()
