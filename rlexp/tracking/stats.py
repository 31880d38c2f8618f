"""95% t-intervals over seeds, for `rlexp compare`: the one statistical method the comparison states.

Why t and not a normal interval: sweeps have 2-5 seeds, where the normal quantile (1.96) claims far more
certainty than the data holds (the t quantile for 2 seeds is 12.7). Why no scipy: it is not a dependency;
the 0.975 quantiles for 1-30 degrees of freedom are tabled and larger ones use the Cornish-Fisher expansion
(error below 1e-4 there). n=1 has no interval: one seed says nothing about seed-to-seed spread.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
METHOD = "95% t-interval over seeds"
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788,
         2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
         2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (two-sided 95%)."""
    if df < 1:
        raise ValueError(f"t quantile needs at least 1 degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z, v = 1.959964, float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))


@dataclass(frozen=True)
class Estimate:
    """Mean of per-seed values with its 95% t-interval half-width (None for one seed)."""
    mean: float
    half: float | None
    n: int
    std: float | None

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half

    def covers_zero(self) -> bool:
        """True when the interval includes 0, or there is no interval (one value cannot tell a difference)."""
        return self.half is None or (self.mean - self.half) <= 0.0 <= (self.mean + self.half)

    def text(self, fmt: str = ".4g") -> str:
        if self.half is None:
            return f"{self.mean:{fmt}} (n=1, no interval)"
        return f"{self.mean:{fmt}} ± {self.half:{fmt}} (n={self.n})"


def estimate(values: Sequence[float]) -> Estimate | None:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return None
    if len(vals) == 1:
        return Estimate(vals[0], None, 1, None)
    sd = statistics.stdev(vals)
    return Estimate(statistics.fmean(vals), t975(len(vals) - 1) * sd / math.sqrt(len(vals)), len(vals), sd)
