"""`rlexp.core.fast_exit`: a process ends without the interpreter's teardown, but with every
clean-up the interpreter would have run first (other threads finished, atexit handlers, buffered
output), and with the status `sys.exit` would have given. Real subprocesses: what is checked is
what survives the process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlexp.core.fast_exit import exit_status

CHILD = """
import atexit, sys, threading, time
from pathlib import Path
from rlexp.core.fast_exit import fast_exit

out = Path(sys.argv[1])
atexit.register(lambda: out.with_suffix(".atexit").write_text("ran"))

def late():
    time.sleep(0.5)
    out.with_suffix(".thread").write_text("finished")

threading.Thread(target=late).start()  # not a daemon: the interpreter would wait for it
sys.stdout.write("buffered, no newline")  # a pipe's stdout is block-buffered: flushed at exit
fast_exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
"""


@pytest.mark.parametrize("code, status", [("0", 0), ("3", 3), ("refused: a message", 1)])
def test_fast_exit_runs_clean_up_keeps_status(tmp_path: Path, code: str, status: int) -> None:
    out = tmp_path / "child"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), code], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == "buffered, no newline"
    assert out.with_suffix(".atexit").read_text() == "ran"
    assert out.with_suffix(".thread").read_text() == "finished"
    if status == 1:
        assert proc.stderr.strip() == code  # sys.exit prints a non-int code to stderr


def test_exit_status_is_what_sys_exit_gives() -> None:
    assert exit_status(None) == 0 and exit_status(0) == 0 and exit_status(2) == 2


def test_python_m_rlexp_ends_through_fast_exit_with_the_command_status() -> None:
    """The entry point: help is status 0, an unknown command 2, as before the fast exit."""
    def rlexp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rlexp", *args], capture_output=True,
                              text=True, timeout=120)

    ok = rlexp("--help")
    assert ok.returncode == 0 and "usage: rlexp" in ok.stdout
    bad = rlexp("nosuch")
    assert bad.returncode == 2 and "unknown command 'nosuch'" in bad.stderr
