"""Errors that mean "your input is wrong" (not "rlexp is broken"), and how every command reports them:
one clear message on stderr and exit code 2, no traceback."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

# Matched by class name so this module needs none of the packages that define them.
USER_ERRORS = ("ConfigError", "PlanError", "TransportError", "CheckpointError", "ResumeError", "DatasetMissing",
               "RunFolderBusy", "MetricsFileError")


class RunStopped(RuntimeError):
    """A process the run cannot do without died (a trainer rank): the run stopped cleanly, its last checkpoint
    intact. Reported like a user error, without a traceback, with exit code 3 and how to continue."""


def is_user_error(e: BaseException) -> bool:
    return any(c.__name__ in USER_ERRORS for c in type(e).__mro__)


@contextlib.contextmanager
def friendly_errors() -> Iterator[None]:
    try:
        yield
    except Exception as e:
        if isinstance(e, RunStopped):
            print(f"rlexp: stopped: {e}", file=sys.stderr)
            raise SystemExit(3) from None
        if is_user_error(e):
            print(f"rlexp: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
