"""One process per run folder: an OS lock on `RUN_DIR/.lock`, held for as long as the run lives.

Two `rlexp train` processes on one folder interleave `metrics.jsonl`, race on checkpoint renames and overwrite
each other's manifest, so the second one is refused before it loads anything. The lock is `fcntl.flock`: the
kernel drops it when its holder dies, however it dies (kill -9 too), so a crashed run never blocks the next one.
The file also records the holder's pid, host and start time, for the refusal message and to tell the user
when a crashed run's lock was taken over; it is emptied on a clean release, so leftover content means a crash.
On a shared filesystem the holder may be on another host: its pid cannot be checked from here, which the
message says (NFSv4 and Lustre pass flock between hosts; a filesystem that does not makes two hosts' locks
independent, and the recorded host is then the only hint).

Taking the lock is the gate to writing in a run folder, so it first checks the folder
(`rlexp.core.runfolder.check_run_folder`: no link or special file inside, writable), and the lock itself must be
a regular file: it is opened without following a link, so it can never truncate a file elsewhere.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlexp.core.runfolder import RunFolderUnsafe, check_run_folder, nofollow_opener

LOCK_FILE = ".lock"
_HELD: set[Path] = set()  # run folders this process holds: a nested `hold` of one of them is a no-op


class RunFolderBusy(RuntimeError):
    """Another live process holds the run folder; the message names it and what to do."""


def _holder(text: str) -> dict[str, Any]:
    try:
        h = json.loads(text)
    except ValueError:
        return {}
    return h if isinstance(h, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _describe(h: dict[str, Any]) -> str:
    t = h.get("time")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "?"
    return f"pid {h.get('pid', '?')} on host {h.get('host', '?')} (since {since})"


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", errors="replace")


def _open_lock(run_dir: Path) -> int:
    """The lock's descriptor, after checking the folder; `RunFolderUnsafe` naming the problem and the fix when
    the folder cannot be created or used, or the lock is not a regular file."""
    check_run_folder(run_dir)  # an existing folder; one created just below is empty
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderUnsafe(f"cannot create the run folder {run_dir}: {e.strerror}; write to a folder you can "
                              f"create (hydra.run.dir=...)") from None
    path = run_dir / LOCK_FILE
    with contextlib.suppress(FileNotFoundError):
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            what = ("a link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
                    else "not a regular file")
            raise RunFolderUnsafe(f"the run-folder lock {path} is {what}; it must be a regular file that rlexp "
                                  f"writes. Remove it (rm -r {path}) and run again")
    try:  # O_NONBLOCK: a fifo planted after the check fails here instead of blocking the open
        return nofollow_opener(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)  # O_CLOEXEC: not inherited
    except PermissionError as e:
        raise RunFolderUnsafe(f"cannot open the run-folder lock {path}: {e.strerror}; make the run folder "
                              f"writable (chmod -R u+w {run_dir}) or write to another folder "
                              f"(hydra.run.dir=...)") from None


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir`'s lock for the body, or raise `RunFolderBusy` at once when a live process holds it.
    Re-entrant within a process: `rlexp.train.RunFolderGuard` takes it before Hydra writes `.hydra/`, and the
    task function's own `hold` then finds it held."""
    run_dir = Path(run_dir)
    if run_dir.resolve() in _HELD:
        yield
        return
    fd = _open_lock(run_dir)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            h = _holder(_read(fd))
            here = h.get("host") == socket.gethostname()
            why = ("that process is alive" if here and isinstance(h.get("pid"), int) and _alive(h["pid"])
                   else "it is on another host, so whether it is still alive cannot be checked from here" if not here
                   else "the lock is held although that pid is gone: a process it started may still hold it")
            raise RunFolderBusy(
                f"run folder {run_dir} is in use by {_describe(h)}; {why}. Wait for that run to end (or stop it), "
                f"or write to another folder (hydra.run.dir=...)") from None
        previous = _holder(_read(fd))
        if previous:  # a holder that never released: it crashed (or ran on another host and is unreachable)
            where = ("that process is gone" if previous.get("host") == socket.gethostname()
                     else "on another host, which cannot be checked from here; the OS lock was free, so it is "
                          "taken to be gone")
            print(f"[rlexp] run folder {run_dir}: taking over the lock left by {_describe(previous)} ({where})",
                  file=sys.stderr, flush=True)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": int(time.time())})
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        _HELD.add(run_dir.resolve())
        try:
            yield
        finally:
            _HELD.discard(run_dir.resolve())
            with contextlib.suppress(OSError):  # emptied: leftover content means the holder crashed
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock
