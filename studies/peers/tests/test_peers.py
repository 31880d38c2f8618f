"""studies/peers/peers.py: the clock arithmetic of the comparison, the character tokenizer TRL is
given, the plain GRPO loop (it updates the weights and records held-out accuracy), and (slow, when
TRL is installed) a TRL run."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

STUDY = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("peers", STUDY / "peers.py")
peers = importlib.util.module_from_spec(_spec)
sys.modules["peers"] = peers  # its dataclasses look their module up while the file runs
_spec.loader.exec_module(peers)


def small_task(name: str = "arithmetic"):
    """The task as peers loads it from rlexp's config, with a batch of 4 prompts x 4 samples."""
    return dataclasses.replace(peers.load_task(name, 0), prompts=4, group=4)


def test_curve_takes_evaluation_time_out_of_both_clocks():
    # launched at 100; step-0 eval ends at 110 (took 2 s), training starts at 110, evals of 1 s
    # each.
    pts = [(0, 0.0, 110.0, 2.0), (10, 0.5, 131.0, 1.0), (20, 0.9, 152.0, 1.0)]
    curve = peers.curve_of(pts, 100.0, 110.0)
    assert curve == [(0, 0.0, 8.0, 0.0), (10, 0.5, 28.0, 20.0), (20, 0.9, 48.0, 40.0)]
    assert peers.time_to(curve, 0.8, 2) == 48.0 and peers.time_to(curve, 0.95, 2) is None
    assert peers.acc_at(curve, 30) == (0.5, False) and peers.acc_at(curve, 60) == (0.9, True)
    assert math.isnan(peers.acc_at(curve, 5)[0])
    assert peers.steps_per_s(curve) == 0.5


def test_hf_char_tokenizer_has_rlexp_ids():
    task = small_task()
    hf = peers.hf_char_tokenizer(task.tok)
    text = "1+0+1=5 :x\n"
    assert hf(text, add_special_tokens=False)["input_ids"] == task.tok.encode(text)
    assert hf.decode([*task.tok.encode(text), task.tok.eos_id], skip_special_tokens=True) == text
    assert (hf.pad_token_id, hf.eos_token_id) == (task.tok.pad_id, task.tok.eos_id)


@pytest.mark.slow  # trains (two steps), a few seconds with the model load
def test_plain_loop_updates_weights_and_logs_accuracy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    task = small_task()
    model = peers.load_model(task)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(peers, "load_model", lambda _task: model)
    # A random policy rarely answers right in 16 samples: rewards 1, 0, 1, ... give every group an
    # advantage, so the check is that the loop updates the weights, not the luck of one batch
    monkeypatch.setattr(
        peers,
        "rewards_of",
        lambda _task, _samples, texts: [float(i % 2) for i in range(len(texts))],
    )
    peers.plain_worker(task, 2, 0, 1, peers.Rows(tmp_path / "rows.jsonl"), math.inf)
    rows = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "acc" in r] == [0, 1, 2]
    assert all(0.0 <= r["acc"] <= 1.0 and r["eval_s"] > 0 for r in rows if "acc" in r)
    changed = [k for k, v in model.state_dict().items() if not v.equal(before[k])]
    assert "lm_head.weight" in changed and any("layers.0" in k for k in changed)


def test_decode_greedy_is_repeatable_and_stops_at_eos():
    task = small_task("sort")
    model = peers.load_model(task)
    prompts = [task.tok.encode(s.problem.prompt) for s in task.env.eval_samples()[:3]]
    a = peers.decode(model, prompts, 2, 8, 0.0, task.tok.pad_id, task.tok.eos_id)
    assert a == peers.decode(model, prompts, 2, 8, 0.0, task.tok.pad_id, task.tok.eos_id)
    assert len(a) == 6 and a[0] == a[1]  # greedy: both copies of a prompt agree
    assert all(len(c) == 8 or c[-1] == task.tok.eos_id for c in a)


@pytest.mark.slow
def test_trl_grpo_two_steps(tmp_path: Path):
    pytest.importorskip("trl")
    task = small_task()
    rows = peers.Rows(tmp_path / "rows.jsonl")
    peers.trl_worker(task, 2, 0, 1, rows, tmp_path / "trl_out", math.inf)
    recs = [json.loads(x) for x in rows.path.read_text().splitlines()]
    assert [r["step"] for r in recs if "acc" in r] == [0, 1, 2]
    assert any("start" in r for r in recs)


@pytest.mark.parametrize(
    ("schedule", "warmup"), [("cosine", 10), ("constant", 10), ("constant", 0)]
)
def test_trl_is_offered_rlexps_schedule(schedule: str, warmup: int) -> None:
    """The schedule TRL is given follows rlexp's own (`lr_lambda`) within one warm-up step's shift,
    so a recipe that helps rlexp is offered to TRL too (issue 25 item 2)."""
    import torch
    from transformers import get_scheduler

    from rlexp.actors.trainer import lr_lambda

    task = dataclasses.replace(
        small_task(), schedule=schedule, warmup_steps=warmup, min_lr_ratio=0.1
    )
    kw = peers.trl_schedule(task)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    hf = get_scheduler(
        kw["lr_scheduler_type"],
        opt,
        num_warmup_steps=kw["warmup_steps"],
        num_training_steps=400,
        scheduler_specific_kwargs=kw.get("lr_scheduler_kwargs"),
    )
    ours = lr_lambda(schedule, warmup, 400, 0.1)
    theirs = []
    for _ in range(400):
        theirs.append(hf.get_last_lr()[0])
        opt.step()
        hf.step()
    shift = 1 / warmup if warmup else 0.0
    assert max(abs(ours(s) - theirs[s]) for s in range(400)) <= shift + 1e-6
    # identical after the warm-up
    assert max(abs(ours(s) - theirs[s]) for s in range(warmup + 1, 400)) < 1e-6
    if schedule == "cosine":
        assert theirs[-1] == pytest.approx(0.1, abs=1e-3) and ours(399) == pytest.approx(
            0.1, abs=1e-3
        )


def test_peers_refuses_a_schedule_trl_cannot_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlexp.cluster import plan_cli

    real = plan_cli.compose_run_config
    monkeypatch.setattr(
        plan_cli, "compose_run_config", lambda ov: real([*ov, "trainer.lr_schedule=linear"])
    )
    with pytest.raises(SystemExit, match="lr_schedule=linear"):
        peers.load_task("arithmetic", 0)


def test_the_peers_take_rlexps_adam_betas(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe that changes the optimiser's momentum is offered to TRL and the plain loop as
    well."""
    from rlexp.cluster import plan_cli

    real = plan_cli.compose_run_config
    monkeypatch.setattr(
        plan_cli, "compose_run_config", lambda ov: real([*ov, "trainer.betas=[0.5,0.99]"])
    )
    assert peers.load_task("arithmetic", 0).betas == (0.5, 0.99)


def test_the_peers_are_evaluated_on_rlexps_weight_average(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe whose product is the moving average of the weights (trainer.ema_decay) is offered to
    the peers too: their average moves toward the live weights by (1 - decay) a step, and evaluation
    reads it, not the live model."""
    from rlexp.cluster import plan_cli

    real = plan_cli.compose_run_config
    monkeypatch.setattr(
        plan_cli, "compose_run_config", lambda ov: real([*ov, "trainer.ema_decay=0.75"])
    )
    task = peers.load_task("arithmetic", 0)
    assert task.ema_decay == 0.75
    model = peers.load_model(task)
    avg = peers.Average(model, task.ema_decay)
    start = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    avg.update()
    assert avg.model is not model
    assert all(torch.allclose(a, s + 0.25) for a, s in zip(avg.model.parameters(), start))
    assert peers.Average(model, 0.0).model is model


def test_the_average_runs_its_own_weights_when_the_trainer_patched_forward() -> None:
    """TRL's trainer (through accelerate) sets `forward` on the model instance to a wrapper around
    the live model's bound forward. A deepcopy keeps that wrapper, so the 'average' ran the live
    weights; the copy must not."""
    import functools

    task = small_task("sort")
    model = peers.load_model(task)
    live_forward = model.forward

    @functools.wraps(live_forward)
    # what accelerate's wrapper amounts to: a closure over `model`
    def patched(*args: Any, **kwargs: Any) -> Any:
        return live_forward(*args, **kwargs)

    model.forward = patched
    avg = peers.Average(model, 0.5)
    ids = torch.tensor([task.tok.encode("1010:")])
    before = avg.model(input_ids=ids).logits
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    # the live change does not leak into the average
    assert torch.equal(avg.model(input_ids=ids).logits, before)
    avg.update()
    expected = peers.load_model(task)
    with torch.no_grad():
        for e in expected.parameters():
            e.mul_(0.75)  # halfway between the start and the halved live weights
    assert torch.allclose(
        avg.model(input_ids=ids).logits, expected(input_ids=ids).logits, atol=1e-5
    )
    assert not torch.allclose(
        avg.model(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-3
    )


def test_the_report_names_the_learning_rate_each_task_ran_at(tmp_path: Path) -> None:
    import argparse

    curve = [(0, 0.0, 1.0, 0.0), (10, 0.9, 5.0, 4.0)]
    runs = [
        peers.Run(f, "sort", 0, 0.0, curve, (0.5, 0.6), 6.0, f"{f} cmd")
        for f in ("rlexp", "trl", "plain")
    ]
    args = argparse.Namespace(tasks=["sort"], eval_every=10, max_wall=0.0)
    out = tmp_path / "peers.md"
    peers.write_report(runs, args, ["--task", "sort"], out)
    assert (
        "In all three frameworks: lr 0.001 cosine to 0.1x, 10 warm-up steps, AdamW betas (0.9, "
        "0.999), 64 prompts x 16 samples per step. Held-out accuracy is every framework's "
        "moving average of the weights (decay 0.99, rlexp's trainer.ema_decay)."
    ) in out.read_text()


def test_the_baselines_draw_rlexps_prompt_stream_for_the_same_seed():
    """A seed is a paired comparison: the plain loop and TRL draw the prompts `rlexp train seed=S`
    draws."""
    import random

    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.run.prepare import prepare

    task = small_task("sort")
    for seed in (0, 3):
        rlexp_rng = random.Random(
            prepare(compose_run_config(["environment=sort", f"seed={seed}"])).seeds["data"]
        )
        ours, theirs = peers.data_rng(seed), rlexp_rng
        for _ in range(3):
            assert [s.id for s in task.env.sample_batch(8, ours)] == [
                s.id for s in task.env.sample_batch(8, theirs)
            ]


def test_rlexps_trainer_and_the_plain_loop_take_the_same_step_but_for_the_pad_row():
    """studies/peers/peers_step_check.py on a small batch: same loss, every gradient the same
    direction and size, except the `<pad>` embedding row, which transformers freezes (padding_idx)
    and TorchTitan trains."""
    spec = importlib.util.spec_from_file_location("peers_step_check", STUDY / "peers_step_check.py")
    step_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_check)
    r = step_check.check("sort", 0, prompts_per_step=8)
    assert r["loss"]["rlexp"] == pytest.approx(r["loss"]["plain"], rel=1e-5, abs=1e-8)
    assert r["min_cosine_elsewhere"] > 0.9999
    wo = r["grad_norm_without_pad_row"]
    assert wo["rlexp"] == pytest.approx(wo["plain"], rel=1e-4)
    assert r["pad_row_grad_norm"]["plain"] == 0.0 and r["hf_padding_idx"] == 0


def test_with_the_pad_row_frozen_rlexps_step_is_the_plain_loops():
    """`trainer.freeze_pad_row=true` is transformers' padding index: then every gradient, the pad
    row's included."""
    spec = importlib.util.spec_from_file_location("peers_step_check", STUDY / "peers_step_check.py")
    step_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_check)
    r = step_check.check("sort", 0, prompts_per_step=8, freeze_pad_row=True)
    assert r["pad_row_grad_norm"] == {"rlexp": 0.0, "plain": 0.0}
    assert r["grad_norm"]["rlexp"] == pytest.approx(r["grad_norm"]["plain"], rel=1e-4)


def _run(fw: str, seed: int, accs: list[float], dt: float = 10.0) -> peers.Run:
    curve = [(10 * i, a, dt * i, dt * i) for i, a in enumerate(accs)]
    return peers.Run(fw, "sort", seed, 0.0, curve, (0.0, 0.0), dt * len(accs), "cmd")


def test_median_interval_uses_order_statistics_and_survives_infinity():
    med, lo, hi, cov = peers.median_interval([0.4, math.inf, 0.1, 0.3, 0.2])
    # n = 5: min..max
    assert (med, lo, hi) == (0.3, 0.1, math.inf) and cov == pytest.approx(1 - 2 / 32)
    # n = 11: k = 2 is the largest with coverage >= 0.95 (0.988; k = 3 gives 0.935)
    xs = list(range(1, 12))
    med, lo, hi, cov = peers.median_interval([float(x) for x in xs])
    assert (med, lo, hi) == (6.0, 2.0, 10.0) and cov == pytest.approx(1 - 2 * 12 / 2048)


def test_paired_ratio_marks_bounds_and_never():
    fast, slow, never = (
        _run("rlexp", 0, [0, 0.9]),
        _run("trl", 0, [0, 0.5, 0.85]),
        _run("trl", 0, [0, 0.5, 0.6, 0.7]),
    )
    assert peers.paired_ratio(fast, slow) == (0.5, "")
    # the peer's last time stands in, in its favour
    assert peers.paired_ratio(fast, never) == (10.0 / 30.0, "<")
    assert peers.paired_ratio(never, fast) == (math.inf, "inf")


def test_stable_and_auc():
    assert peers.stable(_run("x", 0, [0, 0.8, 0.9, 0.85]).curve)
    assert not peers.stable(_run("x", 0, [0, 0.9, 0.7, 0.95]).curve)  # fell below after reaching it
    assert not peers.stable(_run("x", 0, [0, 0.5]).curve)
    assert peers.auc(_run("x", 0, [0.0, 1.0, 1.0]).curve) == pytest.approx(0.75)


def test_summary_lines_report_the_preregistered_statistic():
    rs = [_run("rlexp", s, [0, 0.9]) for s in range(5)] + [
        _run("trl", s, [0, 0.5, 0.5, 0.9]) for s in range(5)
    ]
    text = "\n".join(peers.summary_lines(rs))
    assert (
        "rlexp / TRL, paired by seed: median **0.33** [0.33, 0.33]" in text
        and "coverage 93.8%" in text
    )
    assert "goal: median <= 0.5, met" in text and "the plain loop" not in text
    assert "| rlexp | 5 | 10 | 5 of 5 | 0.900 |" in text and "| trl | 5 | 30 | 5 of 5 |" in text


def test_rlexp_overrides_reach_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    seen = []

    def launch(cmd, log, stamp_launch=False):  # records the command instead of starting a run
        seen.append(cmd)
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps(
            {"step": 0, "eval/accuracy": 0.5, "time/unix_s": 10.0, "time/eval_s": 1.0}))
        return 5.0
    monkeypatch.setattr(peers, "_launch", launch)
    curve, _, shown = peers.run_rlexp(
        "sort", 4, 0, 2, tmp_path / "run", ("cluster.threads_per_proc=2",)
    )
    assert "cluster.threads_per_proc=2" in seen[0] and seen[0][-1].startswith("hydra.run.dir=")
    assert "cluster.threads_per_proc=2" in shown and curve[0][1] == 0.5


def test_a_later_runs_file_replaces_the_same_framework_task_and_seed(tmp_path: Path) -> None:
    """Re-running one framework after a fix: the report combines the files, and the re-run's run is
    the one shown."""
    def run(fw: str, t08: float) -> dict[str, Any]:
        return vars(
            peers.Run(
                fw,
                "sort",
                0,
                0.0,
                [(0, 0.0, 1.0, 0.0), (10, 0.9, t08, t08 - 1.0)],
                (0.5, 0.6),
                60.0,
                f"{fw} cmd",
            )
        )

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([run("rlexp", 20.0), run("trl", 10.0), run("plain", 40.0)]))
    second.write_text(json.dumps([run("trl", 80.0)]))
    out = tmp_path / "peers.md"
    peers.main(
        [
            "--task",
            "sort",
            "--seeds",
            "0",
            "--report-from",
            str(first),
            str(second),
            "--out",
            str(out),
        ]
    )
    text = out.read_text()
    assert "per seed 0: 0.25" in text  # 20 / 80: rlexp against the re-run TRL, not 20 / 10
    assert text.count("| trl | 0 |") == 1
