"""Values that cross from the user's code into the loop, checked where they cross.

A reward is the user's code (a `Reward`, an environment's `check()`); what it returns feeds the
advantages, and a NaN there surfaces one step later as "probability tensor contains inf/nan" in
the generator's sampler, naming nothing. So every reward is checked as it arrives (finite, and
inside the reward's declared `value_range`), and an exception in `check()` is reported with the
environment, the problem and the response that raised it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rlexp.errors import UserCodeError
from rlexp.types import Sample

SHOWN = 120  # characters of a response or prompt quoted in a message


def clip(text: str, n: int = SHOWN) -> str:
    """`text` quoted, cut to `n` characters (said so)."""
    return repr(text if len(text) <= n else text[:n] + f"... ({len(text)} chars)")


def where(sample: Sample, text: str) -> str:
    p = sample.problem
    return f"problem {p.id!r} (prompt {clip(p.prompt, 60)}), response {clip(text)}"


def bad_rewards(rewards: Sequence[float], value_range: tuple[float, float] | None) -> list[int]:
    """Indices of rewards that are not finite numbers, or outside `value_range` (inclusive)."""
    bad = []
    for i, r in enumerate(rewards):
        ok = isinstance(r, (int, float)) and math.isfinite(r)
        if ok and value_range is not None:
            ok = value_range[0] <= r <= value_range[1]
        if not ok:
            bad.append(i)
    return bad


def refuse(reward: str, sample: Sample, text: str, value: Any,
           value_range: tuple[float, float] | None, n_bad: int) -> UserCodeError:
    """The error for the first bad reward of a batch: the reward, sample, response and value."""
    want = "a finite number" + (f" in [{value_range[0]}, {value_range[1]}]" if value_range else "")
    more = f" ({n_bad - 1} more in this batch)" if n_bad > 1 else ""
    value = float(value) if isinstance(value, (int, float)) else value  # nan, not np.float64(nan)
    return UserCodeError(
        f"reward {reward!r} returned {value!r} for {where(sample, text)}{more}; a reward must be "
        f"{want}. Fix the reward (or the environment's check().score), or set "
        f"algorithm.nonfinite_reward=drop to leave such responses out of training (counted in "
        f"reward/dropped_nonfinite)")


def checked(env: Any, sample: Sample, text: str) -> Any:
    """`env.check(sample, text)`; an exception in it is reported as the environment's, naming the
    sample and the response."""
    try:
        return env.check(sample, text)
    except Exception as e:
        name = (getattr(env, "name", "") or getattr(getattr(env, "cfg", None), "name", "")
                or type(env).__name__)
        raise UserCodeError(f"environment {name!r}: check() raised {type(e).__name__}: "
                            f"{str(e).strip()[:200]} on {where(sample, text)}") from e
