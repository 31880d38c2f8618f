"""One row of `rlexp bench`'s table, and the timing every row uses."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

# torch is imported inside the functions that use it, so that `rlexp bench --help` stays instant.


@dataclass
class Row:
    what: str
    value: float
    unit: str
    baseline: str
    baseline_value: float | None
    note: str = ""

    def ratio(self) -> str:
        if self.baseline_value is None or self.value != self.value:
            return "-"
        value, base = self.value, self.baseline_value
        r = value / base if self.unit.endswith("/s") else base / value  # higher is better for x/s
        return f"{r:.2f}x"


def median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
