"""Environment steps that cannot stop a training run: exceptions, time-outs and unusable replies
become a short error message to the model (`Environment.error_reply`), a warning and a count.

Why a guard: a multi-turn episode calls `Environment.step` (a tool, a game, a sandbox) thousands of times per
training step. One tool that raises, hangs or prints a megabyte must cost that turn, not the run. A wrong
return *type* is a bug in the environment's code, not in the model's input, and stops the run at once
with the fix (`EnvOutputError`).

Time-outs: steps run on one daemon worker thread, all of a turn's calls queued at once (a round trip per call
would cost ~90 us; queued, ~3 us). A call that overruns `environment.step_timeout_s` is answered with an error;
its worker is abandoned (a thread cannot be killed, and as a daemon it does not hold the process at exit) and
the calls queued behind it go to a fresh worker. `step_timeout_s=0` calls the environment inline.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlexp.envs.base import Environment
from rlexp.types import Sample

log = logging.getLogger(__name__)

Encode = Callable[[str], list[int]]


class EnvOutputError(TypeError):
    """`Environment.step` returned something that is neither text nor None (a bug in the environment)."""


@dataclass
class Reply:
    """One step's outcome: `text` to append (None: the episode ends), its tokens, what went wrong, seconds."""

    text: str | None
    ids: list[int]
    error: str | None = None
    seconds: float = 0.0


class _Worker:
    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[tuple[Any, BaseException | None, float]] = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="rlexp-env-step").start()

    def _run(self) -> None:
        while True:
            fn, args = self.requests.get()
            t = time.perf_counter()
            try:
                out, err = fn(*args), None
            except BaseException as e:  # reported to the caller, never raised in this thread
                out, err = None, e
            self.results.put((out, err, time.perf_counter() - t))


class GuardedSteps:
    """Calls `env.step` for many episodes; see the module docstring."""

    def __init__(self, env: Environment, encode: Encode) -> None:
        self.env, self.encode = env, encode
        self.timeout = float(env.cfg.step_timeout_s)
        self.max_reply_tokens = int(env.cfg.max_reply_tokens)
        self._worker: _Worker | None = None
        self._warned: set[str] = set()

    def __call__(self, calls: Sequence[tuple[Sample, str, str]]) -> list[Reply]:
        """One reply per (sample, transcript, response), in order."""
        if self.timeout <= 0:
            out = []
            for c in calls:
                t = time.perf_counter()
                try:
                    raw, err = self.env.step(*c), None
                except Exception as e:  # the model sees it as an error message
                    raw, err = None, e
                out.append(self._reply(c[0], raw, err, time.perf_counter() - t))
            return out
        return self._threaded(calls)

    def _threaded(self, calls: Sequence[tuple[Sample, str, str]]) -> list[Reply]:
        out: list[Reply] = []
        while len(out) < len(calls):
            if self._worker is None:
                self._worker = _Worker()
            w = self._worker
            first = len(out)
            for c in calls[first:]:
                w.requests.put((self.env.step, c))
            for i in range(first, len(calls)):
                try:
                    raw, err, secs = w.results.get(timeout=self.timeout)
                except queue.Empty:
                    out.append(self._timed_out(calls[i][0]))
                    self._worker = None  # abandoned with what is queued behind the call that hangs
                    break
                if isinstance(err, Exception):
                    out.append(self._reply(calls[i][0], None, err, secs))
                elif err is not None:  # KeyboardInterrupt, SystemExit in a step: not the model's doing
                    raise err
                else:
                    out.append(self._reply(calls[i][0], raw, None, secs))
        return out

    # --- turning what came back into a reply ---------------------------------------------------------
    def _reply(self, sample: Sample, raw: Any, err: BaseException | None, secs: float) -> Reply:
        name = self.env.name or type(self.env).__name__
        if err is not None:
            msg = f"{type(err).__name__}: {err}"
            self._warn("raised", f"environment={name}: step raised {msg[:300]} (problem {sample.id!r}); the model "
                                 f"is shown a short error message and the run goes on")
            return self._error(_short(msg), secs)
        if raw is None:
            return Reply(None, [], None, secs)
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self._warn("utf8", f"environment={name}: step returned bytes that are not UTF-8 ({e}; problem "
                                   f"{sample.id!r}); the model is shown an error message. Return str, e.g. "
                                   f"data.decode('utf-8', errors='replace')")
                return self._error("output is not valid UTF-8", secs, "not_utf8")
        if not isinstance(raw, str):
            raise EnvOutputError(f"environment={name}: step returned {type(raw).__name__} ({raw!r:.80}) for problem "
                                 f"{sample.id!r}; return the text to append (str) or None to end the episode")
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            self._warn("utf8", f"environment={name}: step returned text with unpaired surrogates (undecodable input "
                               f"read with errors='surrogateescape'?; problem {sample.id!r}); the model is shown an "
                               f"error message. Decode with errors='replace'")
            return self._error("output is not valid UTF-8", secs, "not_utf8")
        if raw == "":
            self._warn("empty", f"environment={name}: step returned an empty reply for problem {sample.id!r}; the "
                                f"episode ends there. Return None to end an episode, or a non-empty text")
            return Reply(None, [], "empty", secs)
        ids = self.encode(raw)
        if self.max_reply_tokens and len(ids) > self.max_reply_tokens:
            self._warn("long", f"environment={name}: a reply of {len(ids)} tokens (problem {sample.id!r}) exceeds "
                               f"environment.max_reply_tokens={self.max_reply_tokens}; the model is shown a short "
                               f"error message instead. Raise the limit or shorten the tool's output")
            return self._error(f"output too long ({len(ids)} tokens, limit {self.max_reply_tokens})", secs, "too_long")
        return Reply(raw, ids, None, secs)

    def _timed_out(self, sample: Sample) -> Reply:
        name = self.env.name or type(self.env).__name__
        self._warn("timeout", f"environment={name}: a step took longer than environment.step_timeout_s="
                              f"{self.timeout:g} (problem {sample.id!r}); the model is told it timed out")
        return self._error(f"timed out after {self.timeout:g}s", self.timeout, "timeout")

    def _error(self, message: str, secs: float, kind: str = "raised") -> Reply:
        text = self.env.error_reply(message)
        ids = self.encode(text)
        if self.max_reply_tokens and len(ids) > self.max_reply_tokens:  # the error itself must fit too
            text = self.env.error_reply(kind)
            ids = self.encode(text)
        return Reply(text, ids, kind, secs)

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:  # once per kind: the count is in the metrics (episode/env_errors)
            self._warned.add(kind)
            log.warning(message)


def _short(msg: str, limit: int = 120) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."
