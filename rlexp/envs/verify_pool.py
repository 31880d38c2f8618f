"""Math-Verify behind a reusable pool of worker processes with a per-item wall-clock timeout.

Why a process pool of our own: Math-Verify's built-in timeout uses `signal.alarm`, which raises outside the
main thread (Monarch actors, reward services and thread pools all call us from other threads), and a
pathological LaTeX expression can keep SymPy busy for minutes. So we switch its signal timeout off
(`parsing_timeout=None`, `timeout_seconds=None`) and enforce time from the outside: each worker gets one item
at a time, and a worker that misses its deadline is killed and replaced. `concurrent.futures` cannot do this
(a hung task keeps its worker forever), which is why the scheduling below is hand-written.

Workers are started once (lazily) and reused: starting one costs about a second (SymPy import), checking an
item costs milliseconds, so batches of hundreds per training step stay cheap. Results are memoised per
(gold, answer) pair because a GRPO group repeats the same gold answer and often the same prediction.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

log = logging.getLogger(__name__)
_STARTUP_S = 120.0  # generous: on a loaded 2-core machine importing SymPy can take many seconds


@dataclass(frozen=True)
class VerifyResult:
    """`parseable`: Math-Verify turned the answer into something comparable; `timed_out`: it did not finish."""

    correct: bool
    parseable: bool
    timed_out: bool = False


def _worker_main(conn: Connection) -> None:
    """Worker loop: receive (gold, answer) LaTeX strings, reply with (correct, parseable)."""
    import logging as _logging

    _logging.getLogger("math_verify").setLevel(_logging.ERROR)  # silence the "timeout disabled" warning
    from math_verify import parse, verify

    conn.send("ready")  # the import takes about a second; it must not count against the first item
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        gold_text, answer_text = item
        try:
            gold = parse(gold_text, parsing_timeout=None)
            answer = parse(answer_text, parsing_timeout=None)
            parseable = len(answer) > 0
            correct = bool(parseable and gold and verify(gold, answer, timeout_seconds=None))  # gold FIRST
        except Exception:  # a malformed answer must never take the pool down
            correct, parseable = False, False
        conn.send((correct, parseable))


class _Worker:
    def __init__(self, ctx: mp.context.BaseContext) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="rlexp-math-verify")
        self.proc.start()
        child.close()
        self.ready = False
        self.deadline = 0.0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class VerifyPool:
    """Checks (gold, answer) pairs in parallel worker processes; safe to call from any thread."""

    def __init__(self, workers: int | None = None, timeout_s: float = 5.0, cache_size: int = 65536) -> None:
        self.n_workers = workers or max(1, min(4, (os.cpu_count() or 2)))
        self.timeout_s = timeout_s
        # spawn, not fork: callers may hold threads/CUDA/Monarch state that must not be forked.
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], VerifyResult] = OrderedDict()
        self._cache_size = cache_size
        self.n_timeouts = 0

    def _ensure_workers(self) -> None:
        while len(self._workers) < self.n_workers:
            self._workers.append(_Worker(self._ctx))

    def verify_many(self, pairs: list[tuple[str, str]]) -> list[VerifyResult]:
        """Check every (gold, answer) pair; each is given `timeout_s` seconds of one worker's time."""
        with self._lock:
            results: list[VerifyResult | None] = [self._cache.get(p) for p in pairs]
            todo: dict[tuple[str, str], list[int]] = {}
            for i, (pair, res) in enumerate(zip(pairs, results)):
                if res is None:
                    todo.setdefault(pair, []).append(i)
            if todo:
                computed = self._run(list(todo))
                for pair, res in computed.items():
                    for i in todo[pair]:
                        results[i] = res
                    if not res.timed_out:  # a timeout may be load-dependent: do not memoise it
                        self._cache[pair] = res
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            return [r for r in results if r is not None]

    def _run(self, pending: list[tuple[str, str]]) -> dict[tuple[str, str], VerifyResult]:
        self._ensure_workers()
        out: dict[tuple[str, str], VerifyResult] = {}
        queue = list(reversed(pending))
        busy: dict[int, tuple[str, str]] = {}  # worker index -> pair

        def assign(idx: int) -> None:
            w = self._workers[idx]
            pair = queue.pop()
            w.conn.send(pair)
            # A worker still importing gets a startup allowance; its clock restarts when it says "ready".
            w.deadline = time.monotonic() + self.timeout_s + (0.0 if w.ready else _STARTUP_S)
            busy[idx] = pair

        for idx in range(len(self._workers)):
            if queue:
                assign(idx)
        while busy:
            now = time.monotonic()
            wait_s = max(0.0, min(self._workers[i].deadline for i in busy) - now)
            ready = wait([self._workers[i].conn for i in busy], timeout=wait_s)
            for idx in list(busy):
                w = self._workers[idx]
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                        if msg == "ready":
                            w.ready = True
                            w.deadline = time.monotonic() + self.timeout_s
                            continue
                        correct, parseable = msg
                        out[busy.pop(idx)] = VerifyResult(correct, parseable)
                    except (EOFError, OSError):  # the worker died (e.g. out of memory): replace it
                        out[busy.pop(idx)] = VerifyResult(False, False, timed_out=True)
                        w.kill()
                        self._workers[idx] = _Worker(self._ctx)
                elif time.monotonic() >= w.deadline:
                    pair = busy.pop(idx)
                    log.warning("math-verify timed out after %.1fs on answer %.80r; restarting its worker",
                                self.timeout_s, pair[1])
                    self.n_timeouts += 1
                    out[pair] = VerifyResult(False, True, timed_out=True)
                    w.kill()
                    self._workers[idx] = _Worker(self._ctx)
                else:
                    continue
                if queue:
                    assign(idx)
        return out

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                with contextlib.suppress(OSError):
                    w.conn.send(None)
                w.proc.join(timeout=1)
                if w.proc.is_alive():
                    w.kill()
            self._workers.clear()


_POOL: VerifyPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> VerifyPool:
    """The process-wide pool (workers start on first use and stop at interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifyPool(timeout_s=float(os.environ.get("RLEXP_MATH_VERIFY_TIMEOUT_S", "5")))
            atexit.register(_POOL.close)
        return _POOL
