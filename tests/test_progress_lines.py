"""Issue 45 item 6: start-up and progress lines that tell the truth. The warm-up is a phase with its own
progress, a sweep's later jobs time themselves, a plug-in environment is named, the reward is named as the user
chose it, and a slow evaluation reports between batches with an ETA."""
from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_reward_is_named_as_chosen() -> None:
    from rlexp.run.labels import reward_label

    mean = SimpleNamespace(name="weaver", options={"combine": "mean", "pool": 8})
    assert reward_label(mean, "verifier_mean") == "reward=verifier_mean (weaver, combine=mean)"
    assert reward_label(SimpleNamespace(name="weaver", options={}), "weaver") == "reward=weaver"
    assert reward_label(SimpleNamespace(name="rule", options={})) == "reward=rule"  # no Hydra run: the name


def test_a_plugin_environment_is_named_by_its_config_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlexp.config.environment import EnvConfig
    from rlexp.envs.registry import build_env

    monkeypatch.setattr(sys, "path", [*sys.path, str(REPO / "examples" / "my_task")])
    assert build_env(EnvConfig(name="mytask.tasks:CountA")).name == "mytask.tasks:CountA"  # was ""
    assert build_env(EnvConfig(name="arithmetic")).name == "arithmetic"


def test_warmup_has_its_own_progress_lines() -> None:
    from rlexp.run.warmup import WarmupProgress

    out = io.StringIO()
    p = WarmupProgress(30, every_s=1e9, stream=out)
    for i in range(30):
        p.step(3.0 - i / 10)
    p.measuring(256)
    p.done([3.0, 0.1], 0.4, 256)
    lines = out.getvalue().splitlines()
    assert len(lines) == 12, lines  # every tenth of the steps, the accuracy's start, then the summary
    assert "greedy answers on 256 training problems" in lines[-2]
    assert lines[0].startswith("[rlexp] model.warmup: step 3/30, loss 2.800") and "ETA" in lines[0]
    assert re.match(r"\[rlexp\] model\.warmup: trained 30 steps in [\d.]+ s \(loss 3\.000 -> 0\.100, greedy "
                    r"accuracy 0\.400 on 256 training problems\)", lines[-1]), lines[-1]


def test_a_slow_evaluation_reports_between_batches() -> None:
    """GPQA's eval printed nothing for 378 s: one update per batch of 64 problems. Between updates a line every
    `every_s` says which problems are generating, with the ETA from the problems done."""
    from rlexp.evals.runner import Progress

    out = io.StringIO()
    p = Progress("gpqa_diamond", 10, stream=out, every_s=0.05)
    p.update(0, 4)
    time.sleep(0.3)
    p.update(4, 4)
    time.sleep(0.3)
    p.update(8, 2)
    p.update(10, 0)
    text = out.getvalue()
    assert "0/10 problems" in text and "ETA after the first 4 problems  (generating problems 1-4)" in text
    assert re.search(r"4/10 problems  \d+s  ETA \d+s  \(generating problems 5-8\)", text), text
    assert text.rstrip().endswith("10/10 problems  1s  ETA 0s") or "10/10 problems" in text.splitlines()[-1]
    n = len(text)
    time.sleep(0.2)
    assert len(out.getvalue()) == n  # finished: the heartbeat stopped

    quiet = io.StringIO()
    q = Progress("arithmetic", 10, stream=quiet, every_s=0.05, after_s=30)  # inside a training run: fast, silent
    q.update(0, 5)
    q.update(5, 5)
    q.update(10, 0)
    assert quiet.getvalue() == ""


def test_a_sweeps_later_jobs_time_themselves(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from rlexp import train

    monkeypatch.setattr(train, "_JOBS", [])
    monkeypatch.setattr("rlexp.run.phases.process_age", lambda: 478.7)  # a sweep that has run for minutes
    train.start_phases()
    train.start_phases()
    first, second = capsys.readouterr().err.splitlines()
    assert first.startswith("[rlexp] started, config composed (478.")
    assert re.fullmatch(r"\[rlexp\] job 1 started, config composed \(0\.\d s\)", second), second


def test_sweep_presets_name_keys_that_exist() -> None:
    """The Optuna preset's comment named `algorithm.lr`, which is no key (it is `trainer.lr`)."""
    from rlexp.config.suggest import unknown_key

    for f in (REPO / "sweeps").glob("*.yaml"):
        for key in re.findall(r"^\s*#\s*([a-z_]+(?:\.[a-z_]+)+):", f.read_text(), re.M):
            assert unknown_key(key) is None, f"{f.name}: {key}"
