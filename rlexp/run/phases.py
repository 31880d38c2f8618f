"""Start-up phases on stderr, one line each with its time (`[rlexp] checks done (2.1 s)`), so the minute
before the first step is never silent and a slow phase is named."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TextIO


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere): the first phase, Python imports and Hydra
    composition, began before any rlexp code could start a clock."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start)
    except (OSError, ValueError, IndexError):
        return 0.0


class Phases:
    def __init__(self, stream: TextIO | None = None, since_start: bool = False) -> None:
        """`since_start`: the first phase counts from the process's start, not from now."""
        self.stream = stream
        self.last = time.perf_counter() - (process_age() if since_start else 0.0)

    def done(self, what: str) -> float:
        """Print `what` with the seconds since the previous phase; returns them."""
        now = time.perf_counter()
        took, self.last = now - self.last, now
        print(f"[rlexp] {what} ({took:.1f} s)", file=self.stream or sys.stderr, flush=True)
        return took
