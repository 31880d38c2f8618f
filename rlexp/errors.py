"""Errors that mean "your input is wrong" (not "rlexp is broken"), and how every command reports them:
one clear message on stderr and exit code 2, no traceback. Ctrl-C is reported the same way: one line, exit
code 130 (what a shell reports for SIGINT)."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

# Matched by class name so this module needs none of the packages that define them.
USER_ERRORS = ("ConfigError", "PlanError", "TransportError", "CheckpointError", "ResumeError", "DatasetMissing")


class RunStopped(RuntimeError):
    """A process the run cannot do without died (a trainer rank): the run stopped cleanly, its last checkpoint
    intact. Reported like a user error, without a traceback, with exit code 3 and how to continue."""


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
        raise
