"""`rlexp.run.interrupts.Interrupts`: a signal during the step loop waits for the step boundary; a second one, or one
outside the loop, acts at once. (End to end through real runs: tests/test_train_e2e.py.)"""
from __future__ import annotations

import signal

import pytest

from rlexp.errors import friendly_errors
from rlexp.run.interrupts import Interrupts


def test_first_signal_in_the_loop_is_raised_at_the_next_check() -> None:
    i = Interrupts()
    i.deferred = True
    i.handler(signal.SIGINT, None)  # returns: the step in progress finishes
    with pytest.raises(KeyboardInterrupt):
        i.check()
    with pytest.raises(SystemExit) as e:  # after the deferred one was raised, signals act at once
        i.handler(signal.SIGTERM, None)
    assert e.value.code == 143


def test_second_signal_acts_at_once_and_outside_the_loop_nothing_waits() -> None:
    i = Interrupts()
    i.deferred = True
    i.handler(signal.SIGTERM, None)
    with pytest.raises(KeyboardInterrupt):
        i.handler(signal.SIGINT, None)
    j = Interrupts()  # not deferred: start-up
    with pytest.raises(KeyboardInterrupt):
        j.handler(signal.SIGINT, None)
    k = Interrupts()
    k.deferred = True
    k.check(final=True)  # after the last step: final evaluation and export are interruptible at once
    with pytest.raises(SystemExit):
        k.handler(signal.SIGTERM, None)


def test_ctrl_c_ends_in_one_line_with_exit_code_130(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e, friendly_errors(interrupted=lambda: "run folder X"):
        raise KeyboardInterrupt
    assert e.value.code == 130
    assert capsys.readouterr().err == "rlexp: interrupted; run folder X\n"


def test_a_signal_while_the_run_is_recorded_does_not_cut_the_record_short() -> None:
    """The second Ctrl-C racing the first one's teardown: once the run's `with` body is left, the trackers'
    finish (which writes the manifest's final status) runs to its end; graph teardown after it stays
    interruptible."""
    i = Interrupts()
    i.deferred = True
    i.handler(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt), i.record_on_exit():
        i.check()  # the first signal ends the step loop
    i.handler(signal.SIGINT, None)  # the second, while the trackers finish: returns, nothing raised
    with pytest.raises(KeyboardInterrupt):  # a third (a hung upload) stops at once
        i.handler(signal.SIGINT, None)
    j = Interrupts()
    with j.record_on_exit():
        pass
    j.recording = False  # the launcher's teardown, after the trackers finished
    with pytest.raises(SystemExit):
        j.handler(signal.SIGTERM, None)
