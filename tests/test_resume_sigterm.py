"""Resume that never logs a step twice, and SIGTERM/SIGUSR1 that checkpoint before the run stops (issue 41,
findings 6 and 7). Fast tests use the real functions in-process on real files; the `slow` ones signal a real
`rlexp train` and resume it, the default cluster and `cluster=process`, and compare it with the
session's shared default run (`short_run`)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.run import checkpoints
from rlexp.run.checkpoints import ResumeError
from rlexp.run.interrupts import Interrupts
from rlexp.tracking import files
from rlexp.tracking.base import status_from_exception
from rlexp.tracking.manifest import write_start_manifest
from rlexp.tracking.reproduce import compare_metrics
from tests.conftest import REPO, SHORT, FinishedRun, metrics, rlexp, tagged_env, wait_no_orphans

EXIT_BOUND_S = 60  # README: a signalled run has checkpointed, torn down and exited within this


def _rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _save(run: Path, step: int, evaluated_at: int | None = None) -> Path:
    def write_trainer(path: Path) -> None:
        torch.save({"w": torch.zeros(4)}, path)

    state = {"controller": {"evaluated_at": evaluated_at}}
    return checkpoints.save(run, step, step, "h", keep=5, write_trainer=write_trainer, controller_state=state)


# --------------------------------------------------------------------------------------------- resume refusals
@pytest.mark.parametrize("resume", ["auto", "never"])
def test_a_folder_holding_steps_without_a_checkpoint_is_refused_naming_restart(tmp_path: Path, resume: str) -> None:
    _rows(tmp_path / "metrics.jsonl", [{"step": s, "loss": 1.0} for s in range(14)])
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "interrupted"}))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(ResumeError) as e:
        checkpoints.resume_point(tmp_path, resume, 20, False, "h", "h", say=print)
    msg = str(e.value)
    assert f"resume={resume}: {tmp_path} already holds a run (status interrupted, steps 0-13 in metrics.jsonl)" in msg
    assert "add resume=restart" in msg and "another hydra.run.dir" in msg
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # nothing written
    fresh = tmp_path / "fresh"
    assert checkpoints.resume_point(fresh, "auto", 20, False, "h", "h", say=print) is None  # a new folder starts


def test_restart_discards_the_history_and_starts_at_step_0(tmp_path: Path) -> None:
    _rows(tmp_path / "metrics.jsonl", [{"step": s} for s in range(3)])
    _rows(tmp_path / "tables" / "rollouts.jsonl", [{"step": 2}])
    _save(tmp_path, 2)
    said: list[str] = []
    assert checkpoints.resume_point(tmp_path, "restart", 5, False, "h", "h", say=said.append) is None
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
    assert said == [f"[rlexp] resume=restart: removed metrics.jsonl, tables, checkpoints from {tmp_path}; "
                    f"starting at step 0"]


def test_steps_below_the_checkpoint_is_refused_naming_both_numbers(tmp_path: Path) -> None:
    ckpt = _save(tmp_path, 10)
    with pytest.raises(ResumeError, match=r"steps=5 is below the step of the checkpoint being resumed, 10 \("):
        checkpoints.resume_point(tmp_path, "auto", 5, False, "h", "h", say=print)
    with pytest.raises(ResumeError, match=r"steps=10 is not above .* 10 .*Use steps=11 or more"):
        checkpoints.resume_point(tmp_path, "auto", 10, False, "h", "h", say=print)
    assert checkpoints.resume_point(tmp_path, "auto", 11, False, "h", "h", say=print) == ckpt
    # Checkpointed at its last step, evaluated there (a SIGTERM during the last step): resuming finishes it.
    last = _save(tmp_path, 12, evaluated_at=12)
    assert checkpoints.resume_point(tmp_path, "auto", 12, False, "h", "h", say=print) == last


def test_the_hash_of_an_older_checkpoint_with_derived_values_is_accepted(tmp_path: Path) -> None:
    ckpt = _save(tmp_path, 2)  # written with hash "h"
    checkpoints.check_resume_config(ckpt, "new", False, legacy_hash="h")
    with pytest.raises(ResumeError, match="force_resume=true"):
        checkpoints.check_resume_config(ckpt, "new", False, legacy_hash="other")


def test_a_finished_run_checkpointed_with_derived_values_in_its_hash_is_recognised(tmp_path: Path) -> None:
    """Checkpoints written before derived values were left out hashed them in: the finished-run check fills
    them in from the manifest, so the original command still says "complete" instead of "config differs"."""
    given = OmegaConf.create({"seed": 0, "cluster": {"threads_per_proc": None}, "trainer": {"micro_batch_size": 4}})
    derived = OmegaConf.create({"seed": 0, "cluster": {"threads_per_proc": 3}, "trainer": {"micro_batch_size": 4}})
    checkpoints.save(tmp_path, 2, 2, checkpoints.resume_hash(derived), keep=2, controller_state={},
                     write_trainer=lambda path: torch.save({}, path))
    write_start_manifest(tmp_path, derived, ["rlexp", "train"], {"global": 0}, repo_dir=tmp_path)
    checkpoints.check_finished_config(tmp_path, given)
    other = OmegaConf.create({"seed": 1, "cluster": {"threads_per_proc": None}, "trainer": {"micro_batch_size": 4}})
    with pytest.raises(ResumeError, match="config differs"):
        checkpoints.check_finished_config(tmp_path, other)


def test_a_checkpoint_without_an_average_is_refused_when_the_run_keeps_one(tmp_path: Path) -> None:
    """trainer.ema_decay > 0 resumed from a checkpoint whose trainer saved no average (forced past
    the config check): refused before anything spawns, naming the fix; nothing is truncated."""
    _rows(tmp_path / "metrics.jsonl", [{"step": s} for s in range(4)])
    ckpt = checkpoints.save(tmp_path, 2, 2, "h", keep=2,
                            controller_state={"controller": {"ema": False}},
                            write_trainer=lambda path: torch.save({}, path))
    with pytest.raises(ResumeError, match=r"holds no weight average, but trainer.ema_decay=0.9: .*"
                                          r"\(trainer.ema_decay=0\)"):
        checkpoints.resume_point(tmp_path, "auto", 5, True, "other", "other", say=print,
                                 ema_decay=0.9)
    assert [r["step"] for r in metrics(tmp_path)] == [0, 1, 2, 3]
    # no average asked for: resumed
    assert checkpoints.resume_point(tmp_path, "auto", 5, True, "h", "h", say=print) == ckpt
    older = _save(tmp_path / "older", 2)  # older: no record, so the trainer's own check stays
    record = checkpoints.load_controller_state(older).get("controller", {})
    checkpoints.check_average(older, record, 0.9)


# --------------------------------------------------------------------------------------------- truncation
def test_resume_truncates_metrics_and_tables_to_the_checkpoint(tmp_path: Path) -> None:
    _rows(tmp_path / "metrics.jsonl", [{"step": s, "loss": s} for s in range(9)])
    _rows(tmp_path / "tables" / "rollouts.jsonl", [{"step": s, "text": "x"} for s in (4, 6, 8)])
    ckpt = _save(tmp_path, 6)
    assert checkpoints.resume_point(tmp_path, "auto", 9, False, "h", "h", say=print) == ckpt
    assert [r["step"] for r in metrics(tmp_path)] == list(range(7))
    table = [json.loads(x) for x in (tmp_path / "tables" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in table] == [4, 6]


def test_a_crash_while_truncating_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated crash: the fsync of the truncated copy fails (as a full disk or a kill would stop it)."""
    _rows(tmp_path / "metrics.jsonl", [{"step": s} for s in range(9)])
    before = (tmp_path / "metrics.jsonl").read_bytes()

    def crash(fd: int) -> None:
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(files.os, "fsync", crash)
    with pytest.raises(OSError, match="simulated crash"):
        checkpoints.truncate_metrics(tmp_path, 4)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary copy left


# --------------------------------------------------------------------------------------------- compare
def test_compare_metrics_flags_a_step_logged_twice(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    once = [{"step": s, "loss": 1.0} for s in range(4)]
    _rows(a, once)
    _rows(b, once + once)  # a second history appended: steps 0-3 twice
    assert compare_metrics(b, b) == (f"{b}: row 5 goes back to step 0 after step 3: a second history was "
                                     f"appended to the run's own (restarted or resumed in the same folder), so "
                                     f"it is not one run's")
    assert "goes back to step 0" in compare_metrics(a, b)
    _rows(b, [*once, {"step": 3, "loss": 2.0}])  # step 3 again, a metric carried twice
    assert compare_metrics(a, b) == (f"{b}: step 3 is logged twice (rows 4 and 5 both carry 'loss'), so the file "
                                     f"is not one run's history")
    split = [{"step": 0, "loss": 1.0, "time/wall_s": 1.0}, {"step": 0, "eval/accuracy": 0.5, "time/wall_s": 2.0}]
    _rows(a, split)  # one step logged in two rows with different metrics is one step
    assert compare_metrics(a, a) is None


# --------------------------------------------------------------------------------------------- signals
def test_sigusr1_and_sigterm_end_as_128_plus_the_signal_and_mark_interrupted() -> None:
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGUSR1, 138)):
        i = Interrupts()
        i.deferred = True
        i.handler(sig, None)
        assert i.pending == sig and sig in Interrupts.CHECKPOINT
        with pytest.raises(SystemExit) as e:
            i.check()
        assert e.value.code == code and status_from_exception(e.value) == "interrupted"
    assert signal.SIGINT not in Interrupts.CHECKPOINT  # Ctrl-C stops as it always did


def test_a_second_signal_while_the_checkpoint_is_written_is_only_announced(capsys: pytest.CaptureFixture[str]) -> None:
    i = Interrupts()
    i.deferred = True
    i.handler(signal.SIGTERM, None)
    with i.shielded("writing the checkpoint of step 5"):
        i.handler(signal.SIGTERM, None)  # returns: the checkpoint write goes on
        with pytest.raises(SystemExit):  # a third stops at once (the write is atomic: nothing half-done stays)
            i.handler(signal.SIGTERM, None)
    assert "SIGTERM: writing the checkpoint of step 5 first (send it again to stop now)" in capsys.readouterr().err
    assert not i.recording


def test_the_resume_command_names_the_folder_and_resume_auto(tmp_path: Path) -> None:
    cmd = checkpoints.resume_command("rlexp train steps=12 resume=never 'x.y=a b'", tmp_path)
    assert shlex.split(cmd) == ["rlexp", "train", "steps=12", "x.y=a b", f"hydra.run.dir={tmp_path}", "resume=auto"]
    given = checkpoints.resume_command(f"rlexp train hydra.run.dir={tmp_path} resume=auto", tmp_path)
    assert shlex.split(given) == ["rlexp", "train", f"hydra.run.dir={tmp_path}", "resume=auto"]


# --------------------------------------------------------------------------------------------- end to end
# The session's shared default run (`short_run`, conftest.py: SHORT, 6 steps) is the uninterrupted
# run every signalled run is compared with (no periodic checkpoint): one `rlexp train` fewer.
STEPS = int(next(a for a in SHORT if a.startswith("steps=")).split("=")[1])
# The signal goes once step 3 is logged (its row holds step 3's evaluation): the run stops at a
# step in [3, STEPS) with no evaluation left before it checkpoints, as the old signal at step 5 of
# 12 did.
SIGNAL_AT = 3


def _signal_at_step(run: Path, args: list[str], sig: int, tag: str,
                    step: int = SIGNAL_AT) -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-m", "rlexp", "train", *args, f"hydra.run.dir={run}"], cwd=REPO,
                            env=tagged_env(tag), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not any(r["step"] >= step for r in (metrics(run) if (run / "metrics.jsonl").exists() else [])):
        assert proc.poll() is None and time.time() < deadline, (proc.stdout.read() if proc.stdout else "")[-3000:]
        time.sleep(0.05)
    t = time.time()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    took = time.time() - t
    assert wait_no_orphans(tag, timeout=30) == [], out[-3000:]
    return proc.returncode, took


@pytest.mark.slow  # `rlexp train` in subprocesses, signalled and resumed
@pytest.mark.parametrize(("cluster", "sig"), [("local", signal.SIGTERM), ("process", signal.SIGUSR1)])
def test_a_signalled_run_checkpoints_and_resumes_to_identical_metrics(tmp_path: Path, tag: str,
                                                                      short_run: FinishedRun,
                                                                      cluster: str, sig: int) -> None:
    run, straight = tmp_path / "run", short_run.run
    args = [*SHORT, f"cluster={cluster}"]  # no checkpoint.every_n_steps: the signal writes one
    code, took = _signal_at_step(run, args, sig, tag)
    assert code == 128 + sig and took < EXIT_BOUND_S, (code, took)
    m = json.loads((run / "manifest.json").read_text())
    stop = m["interrupted"]
    assert m["status"] == "interrupted" and stop["signal"] == signal.Signals(sig).name, m
    ckpt = run / "checkpoints" / f"step_{stop['step']:06d}"
    assert stop["checkpoint"] == str(ckpt) and (ckpt / "COMPLETE").is_file()
    assert SIGNAL_AT <= stop["step"] < STEPS
    assert [r["step"] for r in metrics(run)] == list(range(stop["step"] + 1))
    resume = shlex.split(stop["resume"])
    assert resume[:2] == ["rlexp", "train"] and resume[-2:] == [f"hydra.run.dir={run}", "resume=auto"]

    # The refusal of steps below the checkpoint and the finished-run check come before the
    # cluster is chosen (rlexp.train.RunFolderGuard; rlexp.run.launcher.run before
    # Hosts(...)): checked once, on `local`. A resume cannot go back: steps below the
    # checkpoint is refused, naming both.
    if cluster == "local":
        below = stop["step"] - 1
        back = rlexp("train", *args, f"steps={below}", f"hydra.run.dir={run}", "resume=auto",
                     check=False, tag=tag)
        said = f"steps={below} is below the step of the checkpoint being resumed, {stop['step']}"
        assert back.returncode == 2 and said in back.stderr, back.stderr[-2000:]
    p = rlexp(*resume[1:], tag=tag)  # the recorded command, as a scheduler's requeue would run it
    assert f"resumed from {ckpt} at step {stop['step']}" in p.stdout
    assert compare_metrics(straight / "metrics.jsonl", run / "metrics.jsonl") is None
    assert [r["step"] for r in metrics(run)] == list(range(STEPS + 1))  # each step once
    assert json.loads((run / "manifest.json").read_text())["status"] == "completed"
    if cluster == "local":
        # The original command plus resume=auto on the finished run: complete, although `prepare`
        # derives cluster.threads_per_proc (it no longer enters the resume hash).
        done = rlexp("train", *args, f"hydra.run.dir={run}", "resume=auto", tag=tag)
        assert f"is already complete ({STEPS} steps" in done.stdout


@pytest.mark.slow  # `rlexp train` in subprocesses
def test_resume_auto_without_a_checkpoint_refuses_and_changes_nothing(
        tmp_path: Path, tag: str, short_run: FinishedRun) -> None:
    """The finished run has no checkpoint (every_n_steps=0): more steps cannot continue it, and starting at
    step 0 would append a second history."""
    run, straight = tmp_path / "run", short_run.run
    subprocess.run(["cp", "-r", str(straight), str(run)], check=True)
    before = (run / "metrics.jsonl").read_bytes()
    p = rlexp("train", *SHORT, f"steps={STEPS + 2}", f"hydra.run.dir={run}", "resume=auto",
              check=False, tag=tag)
    assert p.returncode == 2 and "no checkpoint to continue from" in p.stderr and "resume=restart" in p.stderr
    assert (run / "metrics.jsonl").read_bytes() == before
    assert "actor graph" not in p.stdout  # refused before anything spawned
    assert sorted(os.listdir(run)) == sorted(os.listdir(straight))
