"""Start-up phases on stderr, one line each with its time (`[rlexp] checks done (2.1 s)`), so the minute
before the first step is never silent and a slow phase is named."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Phases:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.t0 = self.last = time.perf_counter()

    def done(self, what: str) -> float:
        """Print `what` with the seconds since the previous phase; returns them."""
        now = time.perf_counter()
        took, self.last = now - self.last, now
        print(f"[rlexp] {what} ({took:.1f} s)", file=self.stream or sys.stderr, flush=True)
        return took
