"""Run folders and checkpoints under damage and contention: one process per run folder, checkpoint digests
with fallback to the newest intact checkpoint, a full disk, a metrics file cut by a crash, resuming a run
that already finished. Fast tests use the real functions in-process; the `slow` ones run `rlexp train`."""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlexp.errors import friendly_errors
from rlexp.run import checkpoints
from rlexp.run.checkpoints import ResumeError
from rlexp.run.runlock import LOCK_FILE, RunFolderBusy, hold
from rlexp.tracking import files
from rlexp.tracking.base import JsonlTracker, Trackers
from rlexp.tracking.files import atomic_write_text
from rlexp.tracking.manifest import write_start_manifest
from rlexp.tracking.metrics_file import MetricsFileError, read_metrics
from rlexp.tracking.reproduce import compare_metrics
from tests.conftest import CHECKPOINTED_STEPS, CheckpointedRun, metrics, rlexp, wait_no_orphans

TINY = ["eval.every_n_steps=0", "algorithm.prompts_per_step=8", "checkpoint.every_n_steps=2"]


# --------------------------------------------------------------------------------------------- the lock
def test_a_held_run_folder_is_refused_naming_pid_and_host(tmp_path: Path) -> None:
    code = (f"import sys, time; from pathlib import Path; from rlexp.run.runlock import hold\n"
            f"with hold(Path({str(tmp_path)!r})):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        busy = rf"in use by pid {holder.pid} on host {socket.gethostname()}.*that process is alive"
        with pytest.raises(RunFolderBusy, match=busy), hold(tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()
    with hold(tmp_path), hold(tmp_path):  # re-entrant in one process (the Hydra callback, then the task)
        pass
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released on exit: the next run takes it silently


def test_a_crashed_holders_lock_is_taken_over_with_a_message(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": int(dead), "host": socket.gethostname(), "time": 1}))
    with hold(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert f"taking over the lock left by pid {dead} on host {socket.gethostname()}" in err
    assert "that process is gone" in err


def test_a_lock_held_from_another_host_says_liveness_cannot_be_checked(tmp_path: Path) -> None:
    import fcntl

    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as another host's process would, through a shared filesystem
        os.write(fd, json.dumps({"pid": 4242, "host": "node-17", "time": 1}).encode())
        with pytest.raises(RunFolderBusy, match=r"pid 4242 on host node-17.*cannot be checked from here"), \
                hold(tmp_path):
            pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------- checkpoints
def _save(run: Path, step: int) -> Path:
    def write_trainer(path: Path) -> None:
        torch.save({"model": {"w": torch.arange(4096, dtype=torch.float32) * step}, "version": step}, path)

    return checkpoints.save(run, step, step, "h", keep=3, write_trainer=write_trainer,
                            controller_state={"loop": {"step": step}})


def _flip(path: Path, at: int = 1024, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[at:at + n] = bytes(b ^ 0xFF for b in data[at:at + n])
    path.write_bytes(bytes(data))


def test_a_corrupt_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path: Path) -> None:
    older, newest = _save(tmp_path, 2), _save(tmp_path, 4)
    assert set(checkpoints.read_meta(newest)["sha256"]) == {"trainer.pt", "controller.pt"}
    _flip(newest / "trainer.pt")
    with pytest.raises(ResumeError, match=r"step_000004/trainer\.pt is corrupt: its sha256 differs"):
        checkpoints.check_resumable(newest)
    said: list[str] = []
    assert checkpoints.find_resume("auto", tmp_path, say=said.append) == older
    assert len(said) == 1 and "step_000004/trainer.pt is corrupt" in said[0] and "resuming from step_000002" in said[0]
    with pytest.raises(ResumeError, match="is corrupt"):  # chosen by path: no silent substitute
        checkpoints.find_resume(str(newest), tmp_path)
    _flip(older / "controller.pt", at=100, n=8)
    with pytest.raises(ResumeError, match=r"no intact checkpoint.*start again with resume=restart"):
        checkpoints.find_resume("auto", tmp_path, say=said.append)


def test_a_corrupt_meta_json_names_its_path_and_is_skipped(tmp_path: Path) -> None:
    older, newest = _save(tmp_path, 2), _save(tmp_path, 4)
    (newest / "meta.json").write_text('{"step": 4, "vers')
    with pytest.raises(ResumeError, match=rf"{newest / 'meta.json'} is corrupt"):
        checkpoints.read_meta(newest)
    said: list[str] = []
    assert checkpoints.find_resume("auto", tmp_path, say=said.append) == older
    assert "meta.json is corrupt" in said[0]


def test_hashing_the_tiny_checkpoint_is_cheap(tmp_path: Path) -> None:
    """The cost noted in rlexp/run/checkpoints.py: streaming sha256 of a 4 MB trainer state."""
    f = tmp_path / "trainer.pt"
    f.write_bytes(os.urandom(4 << 20))
    t = time.perf_counter()
    files.sha256_file(f)
    assert time.perf_counter() - t < 0.5


# --------------------------------------------------------------------------------------------- a full disk
def _enospc(*_: object, **__: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_simulated_full_disk_during_a_checkpoint_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """Simulated fault: the trainer's write raises ENOSPC (the real disk is not filled)."""
    with pytest.raises(OSError) as e:
        checkpoints.save(tmp_path, 2, 2, "h", keep=2, write_trainer=_enospc, controller_state={})
    assert e.value.errno == errno.ENOSPC
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_simulated_full_disk_during_an_atomic_write_keeps_the_old_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated fault: fsync raises ENOSPC while the manifest's temporary file is written."""
    path = tmp_path / "manifest.json"
    path.write_text('{"status": "running"}')
    monkeypatch.setattr(files.os, "fsync", _enospc)
    with pytest.raises(OSError):
        atomic_write_text(path, '{"status": "failed"}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    assert path.read_text() == '{"status": "running"}'


def test_a_run_failing_on_a_full_disk_is_marked_failed_with_the_reason(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    write_start_manifest(tmp_path, {"steps": 1}, ["rlexp", "train"], {"global": 0}, repo_dir=tmp_path)
    with pytest.raises(SystemExit) as e, friendly_errors(), Trackers([JsonlTracker()], {}, tmp_path, {}):
        checkpoints.save(tmp_path, 2, 2, "h", keep=2, write_trainer=_enospc, controller_state={})
    assert e.value.code == 1
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith("ENOSPC (No space left on device)")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlexp: failed: the disk is full, ENOSPC")


# --------------------------------------------------------------------------------------------- metrics.jsonl
def _metrics_file(path: Path, tail: str = "") -> Path:
    path.write_text("".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in range(3)) + tail)
    return path


def test_a_partial_last_line_is_skipped_with_a_warning_everywhere(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = _metrics_file(tmp_path / "a.jsonl", '{"step": 3, "lo')
    b = _metrics_file(tmp_path / "b.jsonl")
    assert compare_metrics(a, b) is None  # used to raise JSONDecodeError
    assert f"{a}:4: skipping a partial last line" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    _metrics_file(run / "metrics.jsonl", '{"step": 3, "lo')
    assert checkpoints.truncate_metrics(run, 1) == 2
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1]
    assert "metrics.jsonl:4: skipping a partial last line" in capsys.readouterr().err


def test_a_corrupt_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"step": 0}\n{"step": 1, "lo\n{"step": 2}\n')
    with pytest.raises(MetricsFileError, match=rf"{bad}:2: unreadable line"):
        compare_metrics(bad, bad)
    with pytest.raises(MetricsFileError, match=rf"{bad}:2"):  # used to drop it silently, and step 2 with it
        checkpoints.truncate_metrics(tmp_path, 5)
    assert bad.read_text().count("\n") == 3  # nothing rewritten


# --------------------------------------------------------------------------------------------- a finished run
def test_finished_needs_a_completed_manifest_and_the_last_step(tmp_path: Path) -> None:
    _metrics_file(tmp_path / "metrics.jsonl")
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "completed"}))
    assert "already complete (2 steps" in checkpoints.finished(tmp_path, 2)
    assert checkpoints.finished(tmp_path, 4) is None  # more steps asked for: resume
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "failed"}))
    assert checkpoints.finished(tmp_path, 2) is None


# --------------------------------------------------------------------------------------------- end to end
def _snapshot(run: Path) -> dict[str, bytes]:
    """Every file of the run folder but the lock, `.hydra/` included (rlexp.train.RunFolderGuard acts before
    Hydra would rewrite it)."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


@pytest.mark.slow  # reads the session's `checkpointed_run` (conftest.py), which tried the second
def test_second_train_on_a_live_run_folder_is_refused_at_once(
        checkpointed_run: CheckpointedRun) -> None:
    c = checkpointed_run
    second = c.second  # the same command with resume=auto, started once the first's manifest was
    assert second.returncode == 2, second.stderr[-2000:]
    assert c.second_s < 30  # no torch, no actors: refused at once
    assert f"in use by pid {c.pid} on host {socket.gethostname()}" in second.stderr
    assert "Traceback" not in second.stderr and "actor graph" not in second.stdout
    assert c.overrides_kept  # .hydra/overrides.yaml is not Hydra's copy of `resume=auto`
    if c.first_was_live:
        assert c.manifest_kept  # not rewritten by the refused process
    assert c.returncode == 0, c.stderr[-3000:]
    steps = [r["step"] for r in metrics(c.run)]
    assert steps == list(range(CHECKPOINTED_STEPS + 1))  # once, not twice
    assert json.loads((c.run / "manifest.json").read_text())["status"] == "completed"
    assert c.orphans == []


@pytest.mark.slow  # `rlexp train` in subprocesses
def test_resume_finished_run_then_fall_back_past_a_corrupt_checkpoint(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    rlexp("train", "steps=6", *TINY, f"hydra.run.dir={run}", tag=tag)  # checkpoints at steps 2 and 4
    before = _snapshot(run)
    done = rlexp("train", "steps=6", *TINY, f"hydra.run.dir={run}", "resume=auto", tag=tag)
    assert done.stdout.strip() == f"[rlexp] run {run} is already complete (6 steps, status completed in " \
                                  f"manifest.json); nothing to do. To train further, resume=auto with more steps; " \
                                  f"to start over, use another hydra.run.dir"
    assert _snapshot(run) == before  # used to re-train steps 5-6
    changed = rlexp("train", "steps=6", *TINY, "trainer.lr=0.5", f"hydra.run.dir={run}", "resume=auto",
                    check=False, tag=tag)
    assert changed.returncode == 2 and "force_resume=true" in changed.stderr, changed.stderr[-2000:]
    assert _snapshot(run) == before  # refused, not "nothing to do" under a config that never ran

    _flip(run / "checkpoints" / "step_000004" / "trainer.pt", at=200_000)
    p = rlexp("train", "steps=8", *TINY, f"hydra.run.dir={run}", "resume=auto", tag=tag)
    assert "step_000004/trainer.pt is corrupt" in p.stdout and "resuming from step_000002" in p.stdout
    assert f"resumed from {run / 'checkpoints' / 'step_000002'} at step 2" in p.stdout
    assert [r["step"] for r in metrics(run)] == list(range(9))
    assert wait_no_orphans(tag) == []


@pytest.mark.slow  # `rlexp train` on a real 2 MB tmpfs (needs root to mount; skipped otherwise)
def test_a_real_full_disk_fails_the_run_cleanly(tmp_path: Path, tag: str) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    try:
        run = disk / "run"
        p = rlexp("train", "steps=4", *TINY, f"hydra.run.dir={run}", check=False, tag=tag)
        assert p.returncode == 1, p.stderr[-3000:]
        lines = [x for x in p.stderr.splitlines() if x.startswith("rlexp:")]
        assert lines == [lines[0]] and lines[0].startswith("rlexp: failed: the disk is full, ENOSPC")
        assert "Traceback" not in p.stderr
        m = json.loads((run / "manifest.json").read_text())
        assert m["status"] == "failed" and m["error"].startswith("ENOSPC")
        assert not [q for q in run.rglob("*") if "tmp" in q.name]  # .tmp_step_*, .manifest.json.tmp.*
        assert wait_no_orphans(tag) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
