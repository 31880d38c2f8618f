"""`rlexp train` on multi-turn environments end to end: real Monarch actors, real checkpoints, the CLI as a
user runs it. Kept small (a few steps of 8 prompts) so the slow suite stays lean."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from rlexp.tracking.reproduce import compare_metrics
from tests.conftest import metrics, rlexp, wait_no_orphans
from tests.test_train_e2e import _start, _wait_for_step

pytestmark = pytest.mark.slow

GUESS = ["environment=guess", "algorithm.prompts_per_step=8", "algorithm.group_size=8"]


def test_guess_trains_with_exact_logprobs_across_turns_and_reproduces(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    p = rlexp("train", *GUESS, "steps=3", "eval.every_n_steps=3", f"hydra.run.dir={run}", tag=tag)
    assert "held-out accuracy" in p.stdout and "(guess, 200 problems)" in p.stdout
    rows = metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert r["logprob_diff/max"] == 0.0  # titan: generator and trainer agree bit for bit, every turn
        assert 1.0 <= r["episode/turns_mean"] <= 3.0 and r["episode/tool_calls_mean"] == 0.0
        assert r["time/env_s"] >= 0.0 and r["episode/env_tokens_mean"] > 0
    table = [json.loads(x) for x in (run / "tables" / "rollouts.jsonl").read_text().splitlines()]
    assert table and all(set(r) >= {"prompt", "response", "reward", "advantage", "policy_version"} for r in table)
    for r in table:
        roles = [seg["role"] for seg in r["transcript"]]
        assert roles[0] == "prompt" and roles[1:] == ["policy", "environment"] * (r["turns"] - 1) + ["policy"]
        assert "".join(seg["text"] for seg in r["transcript"][1:]) == r["response"]
    rep = rlexp("reproduce", str(run), tag=tag, check=False)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert wait_no_orphans(tag) == []


def test_multi_turn_resume_after_kill_9_matches_an_uninterrupted_run(tmp_path: Path, tag: str) -> None:
    shm = tmp_path / "shm"
    common = [*GUESS, "steps=6", "eval.every_n_steps=3", "checkpoint.every_n_steps=3", f"cluster.shm_dir={shm}"]
    straight = tmp_path / "straight"
    rlexp("train", *common, f"hydra.run.dir={straight}", tag=tag)
    resumed = tmp_path / "resumed"
    proc = _start([*common, f"hydra.run.dir={resumed}"], tag)
    _wait_for_step(resumed, 4, proc)  # past the step-3 checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_no_orphans(tag, timeout=30)
    p = rlexp("train", *common, "resume=auto", f"hydra.run.dir={resumed}", tag=tag)
    assert "resumed from" in p.stdout
    assert compare_metrics(straight / "metrics.jsonl", resumed / "metrics.jsonl") is None


def test_async_multi_turn_records_each_turns_version_and_judges_staleness_by_the_oldest(tmp_path: Path,
                                                                                       tag: str) -> None:
    run = tmp_path / "run"
    rlexp("train", *GUESS, "steps=4", "eval.every_n_steps=2", "sync=async", "sync.max_policy_age=1",
          f"hydra.run.dir={run}", tag=tag)
    table = [json.loads(x) for x in (run / "tables" / "rollouts.jsonl").read_text().splitlines()]
    later = [r for r in table if r["step"] == 4]
    # The first turn was requested a step ahead, the later ones when the loop collected the rollout.
    assert any(r["turns"] > 1 and r["turn_versions"][0] < r["turn_versions"][-1] for r in later)
    assert all(r["policy_version"] == min(r["turn_versions"]) for r in table)
    rows = metrics(run)[1:]
    assert rows[-1]["policy_age/mean"] == 1.0  # the oldest turn's age
    assert wait_no_orphans(tag) == []


def test_calculator_trains_end_to_end(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    p = rlexp("train", "environment=calculator", "steps=2", "eval.every_n_steps=0", "eval.max_samples=8",
              "algorithm.prompts_per_step=4", "algorithm.group_size=4", "algorithm.max_tokens=16",
              f"hydra.run.dir={run}", tag=tag)
    assert "(calculator, 8 problems)" in p.stdout
    rows = metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]  # the final evaluation shares the last step's row
    assert "eval/accuracy" in rows[2]
    assert all(k in rows[2] for k in ("episode/turns_mean", "episode/tool_calls_mean", "time/env_s"))
    assert wait_no_orphans(tag) == []
