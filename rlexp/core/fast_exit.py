"""End a process without the interpreter's final teardown, once its own clean-up has run.

Why: a process that imported torch, TorchTitan and Monarch spends over a second of CPU at exit
(seconds of wall time on a loaded machine) in the interpreter's finalisation, freeing thousands
of modules one object at a time. A run pays it three times in a row, after the last line a user
reads: the generator's process, the trainer's, then the controller. Nothing rlexp relies on
happens there: the clean-up that matters is in `finally` blocks, context managers and atexit
handlers (logging's flush, Monarch's own shutdown of its actor system and runtime, a verify
pool's close), and those run here, in the order the interpreter would run them: other threads
finished first, then the atexit handlers, then the standard streams flushed, then `os._exit`.

Used by the process entry points only (`rlexp.cli.run`, `python -m rlexp`, and
`rlexp.core.gpu_mask`, every actor process's first code); never by code a test or a user may
call in-process.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_status(code: object) -> int:
    """The status `sys.exit(code)` would end with: None is 0, an int itself, anything else
    printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def fast_exit(code: object = 0) -> NoReturn:
    """`sys.exit(code)` without the interpreter's teardown: joins the threads the interpreter would
    wait for, runs the atexit handlers, flushes stdout and stderr, and ends the process."""
    status = exit_status(code)
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(status)
