"""How a run stops: signals deferred to a step boundary, the checkpoint a scheduler's notice asks
for, and the message a dead process leaves.

Why a module of its own: the launcher spawns and wires the actor graph; when and how it stops
(Ctrl-C, SIGTERM/SIGUSR1 from a scheduler, a trainer rank that died) is a separate question with its
own state (`Interrupts`) and its own tests (tests/test_interrupts.py, tests/test_resume_sigterm.py).
"""
from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlexp.core.services import is_process_failure
from rlexp.run import checkpoints
from rlexp.run.controller import Controller
from rlexp.tracking import runlog
from rlexp.tracking.manifest import read_manifest, update_manifest


class Interrupts:
    """Ctrl-C (SIGINT), SIGTERM and SIGUSR1. From the first evaluation to the last step, the first
    signal stops the run at the end of the current step, where no actor call is half-done: an
    exception raised inside Monarch's waiting code could leave teardown hanging. SIGTERM and SIGUSR1
    (what a scheduler sends before it kills: Slurm at a time limit or preemption, SIGUSR1 ahead of
    it with `--signal`) first write a checkpoint of that step (`stop_checkpoint`). A second signal,
    or one during start-up or the final evaluation and export, stops at once. SIGINT ends as
    KeyboardInterrupt, SIGTERM as exit code 143, SIGUSR1 as 138 (128 + the signal, as a shell
    reports a process killed by it); all mark the run interrupted. Except while the run's record or
    that checkpoint is written (`recording`): a signal raised inside the trackers' finish would
    leave the manifest saying "running", and the run is stopping anyway, so the first one arriving
    then is only announced; another stops at once (a hung upload)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    # the step done is checkpointed before the run stops
    CHECKPOINT = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.deferred = False
        self.pending: int | None = None
        self.recording = False
        self.busy = "writing the run's record"  # what `recording` protects, for the message

    @contextlib.contextmanager
    def shielded(self, busy: str) -> Iterator[None]:
        """While the body runs, the first signal is only announced (`busy` says why); another
        acts at once."""
        self.recording, self.busy = True, busy
        try:
            yield
        finally:
            self.recording, self.busy = False, "writing the run's record"

    @contextlib.contextmanager
    def record_on_exit(self) -> Iterator[None]:
        """Entered just inside the trackers' `with`: from its exit (the run ending, however) until
        `recording` is cleared, signals no longer interrupt the trackers' finish."""
        try:
            yield
        finally:
            self.recording = True

    def handler(self, signum: int, frame: Any) -> None:
        if self.recording:
            self.recording = False
            print(f"\n[rlexp] {signal.Signals(signum).name}: {self.busy} first "
                  f"(send it again to stop now)",
                  file=sys.stderr, flush=True)
            return
        if not self.deferred or self.pending is not None:
            raise self._exception(signum)
        self.pending = signum
        then = "checkpointing and stopping" if signum in self.CHECKPOINT else "stopping"
        print(f"\n[rlexp] {signal.Signals(signum).name}: {then} after this step "
              f"(send it again to stop now)",
              file=sys.stderr, flush=True)

    def check(self, final: bool = False) -> None:
        if final:
            self.deferred = False
        if self.pending is not None:
            signum, self.pending, self.deferred = self.pending, None, False
            raise self._exception(signum)

    @staticmethod
    def _exception(signum: int) -> BaseException:
        return KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)


def stop_checkpoint(ctl: Controller, interrupts: Interrupts, run_dir: Path) -> None:
    """SIGTERM or SIGUSR1 (a scheduler's notice before it kills): the step just done is
    checkpointed, whatever `checkpoint.every_n_steps` says, and the manifest says why the run
    stopped and how to continue it, before the run stops (`Interrupts.check`). A second signal while
    the checkpoint is written is only announced (the write is atomic either way: a cut one leaves no
    folder behind); a third stops at once."""
    assert interrupts.pending is not None
    name = signal.Signals(interrupts.pending).name
    with interrupts.shielded(f"writing the checkpoint of step {ctl.state.step}"):
        ckpt = ctl.checkpoint_now()
        command = checkpoints.resume_command(read_manifest(run_dir).command, run_dir)
        update_manifest(run_dir, interrupted={"signal": name, "step": ctl.state.step,
                                              "checkpoint": str(ckpt), "resume": command})
    runlog.announce(f"[rlexp] {name}: checkpoint {ckpt} written at step {ctl.state.step}; "
                    f"stopping. Continue with: {command}")


def stop_message(e: BaseException, step: int, last: Path | None) -> str:
    what = (f"a trainer process died at step {step + 1} ({_last_line(e)}). Trainer ranks hold the "
            f"only copy of the optimizer state, so the run cannot go on without them"
            if is_process_failure(e) else f"at step {step + 1}: {e}")
    if last:
        return what + (f". The last checkpoint, {last}, is intact: continue with the same "
                       f"command plus resume=auto")
    return what + (". No checkpoint was written yet (checkpoint.every_n_steps): start again with "
                   "resume=restart")


def report_fault(failure: Any) -> None:
    """Monarch's hook for a process failure nobody supervises: by default it exits the controller.
    Here it only reports; the call that was waiting on the process raises, and its service respawns
    or retires the replica (rlexp/core/services.py), or, for a trainer rank, the run stops with its
    checkpoint intact."""
    print(f"[rlexp] process failure: {_last_line(failure)}", file=sys.stderr, flush=True)


def _last_line(e: Any) -> str:
    text = str(e).strip()
    return text.splitlines()[-1].strip()[:300] if text else type(e).__name__
