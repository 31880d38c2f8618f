"""Issue 45 item 8: a healthy on-policy run logs no `buffer/*` series (they are 0 on every step,
and their charts were the first an MLflow run page showed); with room to age (async) they are
logged every step, and on-policy too once a group came back stale. The real buffer, called in this
process as the launcher calls it (`rlexp.core.services.Local`)."""
from __future__ import annotations

import asyncio

from rlexp.actors.buffer import ReplayBuffer
from rlexp.actors.settings import BufferSettings
from rlexp.core.services import Local
from rlexp.types import Episode

BUFFER = ("buffer/dropped_stale", "buffer/dropped_total", "buffer/size")


def _groups(version: int, n: int = 2) -> list[list[Episode]]:
    return [[Episode([1], [2], [-0.5], 0.5, 1.0, version)] for _ in range(n)]


def _step(buf: Local, version: int, born: int) -> dict[str, float] | None:
    buf.add.call_one(_groups(born)).get()
    got = buf.sample.call_one(version, 2).get()
    return None if got is None else got[1]


def test_buffer_counters_are_logged_only_where_they_can_vary() -> None:
    events = asyncio.new_event_loop()
    try:
        on_policy = Local(ReplayBuffer, BufferSettings(0, 0), events=events)
        for v in range(3):
            m = _step(on_policy, v, v)
            assert m is not None and m["policy_age/mean"] == 0.0 and not set(BUFFER) & set(m), m
        assert _step(on_policy, 4, 3) is None  # a stale rollout (a fault): the step is skipped
        m = _step(on_policy, 4, 4)
        assert m is not None and m["buffer/dropped_total"] == 2.0  # from then on, said every step
        overlapped = Local(ReplayBuffer, BufferSettings(0, 1), events=events)
        rows = [_step(overlapped, v, max(v - 1, 0)) for v in range(3)]
        assert all(r is not None and set(BUFFER) <= set(r) for r in rows), rows
        assert [r["policy_age/mean"] for r in rows if r] == [0.0, 1.0, 1.0]
    finally:
        events.close()
