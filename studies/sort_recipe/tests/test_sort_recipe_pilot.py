"""studies/sort_recipe/sort_recipe_pilot.py: the pre-registered rule picks its winner from run
folders (written here, not run)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml

STUDY = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sort_recipe_pilot", STUDY / "sort_recipe_pilot.py")
pilot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pilot)


def _run(
    root: Path, name: str, seed: int, overrides: list[str], prompts: int, curve: dict[int, float]
) -> None:
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra/overrides.yaml").write_text(yaml.safe_dump([f"seed={seed}", *overrides]))
    (job / ".hydra/config.yaml").write_text(
        yaml.safe_dump({"algorithm": {"prompts_per_step": prompts}})
    )
    (job / "manifest.json").write_text(json.dumps({"status": "completed"}))
    (job / "metrics.jsonl").write_text("\n".join(
        json.dumps({"step": s, "eval/accuracy": a, "time/eval_s": 1.0, "time/wall_s": 2.0 * s})
        for s, a in curve.items()))


def test_winner_is_the_stable_recipe_needing_fewest_training_prompts(tmp_path: Path):
    steady = lambda hit: {s: (0.9 if s >= hit else 0.1) for s in range(0, 401, 10)}  # noqa: E731
    dips = {s: (0.9 if s in (100, 110, 400) else 0.1) for s in range(0, 401, 10)}
    cos = ["trainer.lr_schedule=cosine", "trainer.warmup_steps=10"]
    for seed in range(5):
        _run(tmp_path, f"cos-{seed}", seed, cos, 64, dips)  # never stable: the control
        # stable on every seed, 100 steps x 128 prompts = 12,800 prompts to 0.8
        _run(
            tmp_path,
            f"p128-{seed}",
            seed,
            [*cos, "algorithm.prompts_per_step=128"],
            128,
            steady(100),
        )
        # stable on 4 of 5 seeds, 150 steps x 64 = 9,600 prompts: more steps, fewer prompts, so it
        # wins
        _run(
            tmp_path,
            f"b05-{seed}",
            seed,
            [*cos, "trainer.betas=[0.5,0.999]"],
            64,
            dips if seed == 0 else steady(150),
        )
    runs = [r for job in sorted(tmp_path.iterdir()) if (r := pilot.load(job))]
    control = "trainer.lr_schedule=cosine trainer.warmup_steps=10"
    res = pilot.choose(runs, control)
    by = {r["recipe"]: r for r in res["recipes"]}
    assert res["winner"] == f"{control} trainer.betas=[0.5,0.999]"
    assert by[control]["stable"] == 0 and not by[control]["meets_goal"]
    assert by[f"{control} algorithm.prompts_per_step=128"]["median_prompts_to_08"] == 12800
    assert by[f"{control} trainer.betas=[0.5,0.999]"]["median_steps_to_08"] == 150
    paired = by[f"{control} algorithm.prompts_per_step=128"]["paired_auc_vs_control"]
    assert paired["control"] == control and paired["n"] == 5 and paired["low"] > 0


def test_no_winner_when_no_recipe_has_four_stable_seeds(tmp_path: Path):
    for seed in range(5):
        _run(
            tmp_path,
            f"c-{seed}",
            seed,
            [],
            64,
            {s: (0.9 if s in (100, 400) else 0.1) for s in range(0, 401, 10)},
        )
    res = pilot.choose([r for job in sorted(tmp_path.iterdir()) if (r := pilot.load(job))])
    assert res["winner"] is None and res["recipes"][0]["recipe"] == pilot.CONTROL


def test_the_defaults_earlier_rounds_pin_are_not_part_of_a_recipes_name(tmp_path: Path):
    """Since round 7's recipe became the sort default, rounds 1-6 pin the defaults they ran under;
    their labels (and so their analysis commands' --control) stay what they were."""
    pinned = ["trainer.lr_schedule=constant", "trainer.warmup_steps=0", "trainer.ema_decay=0"]
    _run(tmp_path, "const", 100, pinned, 64, {0: 0.0})
    _run(
        tmp_path,
        "cos",
        100,
        [*pinned, "trainer.lr_schedule=cosine", "trainer.warmup_steps=10"],
        64,
        {0: 0.0},
    )
    _run(tmp_path, "ema", 100, ["trainer.ema_decay=0.99"], 64, {0: 0.0})
    assert pilot.recipe(tmp_path / "const") == pilot.CONTROL
    assert pilot.recipe(tmp_path / "cos") == "trainer.lr_schedule=cosine trainer.warmup_steps=10"
    assert pilot.recipe(tmp_path / "ema") == "trainer.ema_decay=0.99"
