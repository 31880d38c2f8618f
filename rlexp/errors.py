"""Errors that mean "your input is wrong" (not "rlexp is broken"), and how every command reports them:
one clear message on stderr and exit code 2, no traceback. Ctrl-C is reported the same way: one line, exit
code 130 (what a shell reports for SIGINT)."""
from __future__ import annotations

import contextlib
import errno
import re
import sys
from collections.abc import Callable, Iterator

# Matched by class name so this module needs none of the packages that define them.
USER_ERRORS = ("ConfigError", "PlanError", "TransportError", "CheckpointError", "ResumeError", "DatasetMissing",
               "RunFolderBusy", "MetricsFileError", "ManifestError", "RunFolderUnsafe",
               "UserCodeError")


class UserCodeError(RuntimeError):
    """A value or an exception that came back from the user's own code (an environment's `check()`,
    a reward's `score`) and cannot be used: reported where it crosses into the loop, naming the
    code, the problem and the response, not as a crash downstream (a NaN in `torch.multinomial`)."""


class RunStopped(RuntimeError):
    """A process the run cannot do without died (a trainer rank): the run stopped cleanly, its last checkpoint
    intact. Reported like a user error, without a traceback, with exit code 3 and how to continue."""


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_ERRNO_TEXT = re.compile(rf"\[Errno ({'|'.join(str(n) for n in _DISK_FULL)})\] ([^\n]*)")


def disk_full(e: BaseException) -> str | None:
    """'ENOSPC (No space left on device): <file>' when `e`, its cause, or the text of an error relayed from
    another process (a trainer rank writing its checkpoint) is a full disk or quota; else None."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in _DISK_FULL:
            return f"{errno.errorcode[x.errno]} ({x.strerror})" + (f": {x.filename}" if x.filename else "")
        if m := _ERRNO_TEXT.search(str(x)):
            return f"{errno.errorcode[int(m.group(1))]} ({m.group(2).strip()})"
        x = x.__cause__ or x.__context__
    return None


def failure_reason(e: BaseException) -> str:
    """One line saying why a run failed, for its manifest."""
    text = str(e).strip()
    return disk_full(e) or f"{type(e).__name__}: {text.splitlines()[-1][:300] if text else ''}".rstrip(": ")


def is_user_error(e: BaseException) -> bool:
    return any(c.__name__ in USER_ERRORS for c in type(e).__mro__)


@contextlib.contextmanager
def friendly_errors(interrupted: Callable[[], str] | None = None) -> Iterator[None]:
    """`interrupted` says, after Ctrl-C, what is left and how to go on (the run folder, resume=auto)."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"rlexp: interrupted{'; ' + interrupted() if interrupted else ''}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except Exception as e:
        if isinstance(e, RunStopped):
            print(f"rlexp: stopped: {e}", file=sys.stderr)
            raise SystemExit(3) from None
        if is_user_error(e):
            print(f"rlexp: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        if (full := disk_full(e)) is not None:
            print(f"rlexp: failed: the disk is full, {full}; the run is marked failed and its temporary files "
                  f"removed. Free space, then continue with resume=auto", file=sys.stderr)
            raise SystemExit(1) from None
        raise
