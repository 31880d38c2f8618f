"""`trainer.ema_decay`: the run's product is an exponential moving average of the weights (issue 25 item 2).

Through the real actor graph: training (sampling included) must be exactly the run without the average, the live
policy's accuracy is logged beside the average's, and the exported checkpoint and the trainer checkpoint hold the
average. Bad settings are refused before anything spawns."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlexp.config.paths import checkpoint_root, final_dir
from rlexp.core.weights import read_hf_state_dict, safe_load
from tests.conftest import metrics, rlexp
from tests.test_config import compose_error

# bf16, as a real model trains: at decay 0.99 a step moves the average by 1% of its gap to the weights, below bf16's
# rounding for most elements, so an average kept in the model's dtype would hardly move.
RUN = ["train", "environment=sort", "steps=6", "eval.every_n_steps=3", "seed=3", "checkpoint.every_n_steps=3",
       "model.dtype=bfloat16"]


@pytest.mark.parametrize("override,expect", [
    ("trainer.ema_decay=1.0", "trainer.ema_decay=1.0 must be in [0, 1)"),
    ("trainer.ema_decay=-0.5", "trainer.ema_decay=-0.5 must be in [0, 1)"),
])
def test_a_decay_outside_zero_one_is_refused(override: str, expect: str) -> None:
    assert expect in compose_error(override)


def test_an_average_under_async_is_refused_with_the_fix() -> None:
    msg = compose_error("trainer.ema_decay=0.9", "sync=async")
    assert "needs sync=on_policy" in msg and "trainer.ema_decay=0" in msg


def _evals(run: Path, key: str) -> dict[int, float]:
    return {m["step"]: m[key] for m in metrics(run) if key in m}


@pytest.mark.slow  # four `rlexp train` runs (~80 s): the e2e tier, not unit
def test_the_average_is_evaluated_exported_kept_in_fp32_and_training_is_untouched(tmp_path: Path, tag: str) -> None:
    plain, avg = tmp_path / "plain", tmp_path / "ema"
    rlexp(*RUN, "trainer.ema_decay=0", f"hydra.run.dir={plain}", tag=tag)
    rlexp(*RUN, "trainer.ema_decay=0.99", f"hydra.run.dir={avg}", tag=tag)
    # Training is the plain run's, step for step: the average never reaches sampling.
    train_keys = ("reward/mean", "train/grad_norm", "loss", "logprob_diff/max")
    rows = {m["step"]: m for m in metrics(plain) if "reward/mean" in m}
    for m in metrics(avg):
        if "reward/mean" in m:
            assert all(m[k] == rows[m["step"]][k] for k in train_keys), m["step"]
    # The live policy is evaluated as the plain run was; eval/accuracy is the average's.
    assert _evals(avg, "eval/live/accuracy") == _evals(plain, "eval/accuracy")
    assert set(_evals(avg, "eval/accuracy")) == {0, 3, 6}
    # The trainer checkpoint keeps the fp32 master weights of the bf16 model and the average in fp32 (most of its
    # values are not bf16 numbers).
    step3 = next(p for p in checkpoint_root(avg).iterdir() if p.name != "final")
    ckpt = safe_load(step3 / "trainer.pt")
    assert len(ckpt["ema"]) == len(ckpt["optim"]["param_groups"][0]["params"])
    assert {t.dtype for t in ckpt["model"].values() if t.is_floating_point()} == {torch.float32}
    assert all(e.dtype == torch.float32 for e in ckpt["ema"])
    flat = torch.cat([e.flatten() for e in ckpt["ema"]])
    assert (flat != flat.bfloat16().float()).float().mean() > 0.5
    # The exported checkpoint is the average, not the live weights.
    final_avg, final_plain = read_hf_state_dict(final_dir(avg)), read_hf_state_dict(final_dir(plain))
    assert final_avg.keys() == final_plain.keys()
    assert {v.dtype for v in final_avg.values()} == {torch.bfloat16}  # exported in the serving dtype
    assert any(not torch.equal(final_avg[k], final_plain[k]) for k in final_avg)
    # Resumed from step 3, the average carries on where it was, reloaded in fp32: the same evaluations and export.
    resumed = tmp_path / "resumed"
    rlexp(*RUN, "trainer.ema_decay=0.99", f"resume={step3}", f"hydra.run.dir={resumed}", tag=tag)
    assert _evals(resumed, "eval/accuracy")[6] == _evals(avg, "eval/accuracy")[6]
    again = read_hf_state_dict(final_dir(resumed))
    assert all(torch.equal(again[k], final_avg[k]) for k in final_avg)
    # A checkpoint without an average (forced past the config check) cannot silently start one
    # from the live weights: refused before anything spawns (its controller.pt says it has none).
    plain3 = next(p for p in checkpoint_root(plain).iterdir() if p.name != "final")
    p = rlexp(*RUN, "trainer.ema_decay=0.99", f"resume={plain3}", "force_resume=true",
              f"hydra.run.dir={tmp_path / 'mixed'}", tag=tag, check=False)
    assert p.returncode == 2 and "holds no weight average" in p.stderr, p.stderr[-2000:]
    assert "trainer.ema_decay=0.99" in p.stderr and "actor graph" not in p.stdout
