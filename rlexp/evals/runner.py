"""Run an environment's held-out problems through a generator and score them; used by `rlexp eval` and by
the training loop every `eval.every_n_steps`.

`generate_fn(prompt_ids, n, max_tokens, temperature, seed) -> list[Completion]` returns the `n` completions
of each prompt consecutively (prompt 0's n, then prompt 1's...). Multi-turn environments are driven here:
after each turn `env.step` may return tool output to append, and the episode continues from
prompt + transcript until it returns None or `environment.max_turns` is reached. Stop strings of the
environment are applied to the text here as well, so a backend that ignores `stop` still behaves.

Sampling uses the same seed at every evaluation: the curve then moves only when the policy does.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlexp.config.eval import EvalConfig
from rlexp.envs.base import Check, Environment
from rlexp.evals.metrics import summarize
from rlexp.types import Completion, Problem, Sample

log = logging.getLogger(__name__)

GenerateFn = Callable[[list[list[int]], int, int, float, int], list[Completion]]


class _Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass
class SampleRecord:
    """One scored response: a line of the per-sample JSONL."""

    prompt_id: str
    prompt: str
    response: str
    extracted: str | None
    gold: str
    correct: bool
    parseable: bool
    # Partial credit in [0, 1]: `Check.score`, or 1.0/0.0 from `correct` when there is none.
    score: float = 0.0
    sample_index: int = 0
    turns: int = 1
    finish_reason: str = "stop"
    choice_permutation: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BenchmarkResult:
    name: str
    metrics: dict[str, float]
    records: list[SampleRecord]
    seconds: float = 0.0
    # The problems scored, in order (`records` holds `n` responses per problem, consecutively).
    problems: list[Problem] = field(default_factory=list)
    # Test-time selection measured on these responses (rlexp.evals.selection.SelectionReport), when asked for.
    selection: Any = None


def apply_stop(text: str, stops: tuple[str, ...]) -> str:
    """Cut after the first stop string (kept, so a tool call stays well-formed)."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i >= 0 and i + len(s) < cut:
            cut = i + len(s)
    return text[:cut]


class Progress:
    """One stderr line rewritten in place, `name  done/total problems  elapsed  ETA`, so a long evaluation is
    never silent. Plain text (a newline per update when stderr is not a terminal, e.g. a log file). Updates come
    per batch of problems (the generator's batch, which sets the results and cannot shrink), and a batch can take
    minutes (GPQA's long prompts on a CPU): between them a line every `every_s` seconds says which problems are
    being generated, with the ETA from the problems done so far. Nothing is printed before `after_s` seconds (an
    evaluation inside a training run speaks only when it is slow)."""

    def __init__(self, name: str, total: int, stream: Any = None, every_s: float = 15.0, after_s: float = 0.0
                 ) -> None:
        self.name, self.total, self.t0 = name, total, time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s, self.after_s = every_s, after_s
        self.done_n, self.batch = 0, 0
        self.shown = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _eta(self, el: float) -> str:
        if not self.done_n:
            return f"ETA after the first {self.batch} problems" if self.batch else "ETA ?"
        return f"ETA {el / self.done_n * (self.total - self.done_n):.0f}s"

    def _print(self, working: str = "") -> None:
        el = time.perf_counter() - self.t0
        if el < self.after_s and not self.shown:  # quiet while fast (the last line too, if nothing came before)
            return
        self.shown = True
        width = 24
        bar = "#" * (width * self.done_n // max(1, self.total))
        line = (f"[rlexp eval] {self.name} [{bar:<{width}}] {self.done_n}/{self.total} problems  {el:.0f}s  "
                f"{self._eta(el)}{working}")
        end = "" if self.tty and self.done_n < self.total else "\n"
        print(("\r" if self.tty else "") + line, end=end, file=self.stream, flush=True)

    def update(self, done: int, batch: int = 0) -> None:
        """`done` problems finished; `batch`: how many the generator works on next (0: none)."""
        self.done_n, self.batch = done, batch
        self._print()
        if batch and self._beat is None and self.every_s > 0:
            self._beat = threading.Thread(target=self._heartbeat, name="rlexp-eval-progress", daemon=True)
            self._beat.start()
        if done >= self.total:
            self.close()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.batch:
                self._print(f"  (generating problems {self.done_n + 1}-{self.done_n + self.batch})")

    def close(self) -> None:
        self._stop.set()


def rollout(env: Environment, samples: list[Sample], generate_fn: GenerateFn, tokenizer: _Tokenizer, *, n: int,
            max_tokens: int, temperature: float, seed: int, batch_size: int = 64,
            progress: Progress | None = None) -> list[list[tuple[str, int, str]]]:
    """For each sample, `n` episodes as (transcript, turns, finish_reason)."""
    out: list[list[tuple[str, int, str]]] = []
    if progress is not None:
        progress.update(0, min(batch_size, len(samples)))
    max_turns = max(1, int(getattr(env.cfg, "max_turns", 1)))
    for b0 in range(0, len(samples), batch_size):
        batch = samples[b0: b0 + batch_size]
        first = generate_fn([tokenizer.encode(s.problem.prompt) for s in batch], n, max_tokens, temperature,
                            seed + b0)
        if len(first) != len(batch) * n:
            raise RuntimeError(f"generate_fn returned {len(first)} completions for {len(batch)} prompts x n={n}")
        eps = [_Episode(batch[i // n], newest=apply_stop(c.text, env.stop), finish=c.finish_reason)
               for i, c in enumerate(first)]
        turn = 1
        while True:
            for ep in eps:
                if not ep.active:
                    continue
                extra = env.step(ep.sample, ep.prior, ep.newest) if ep.turns < max_turns else None
                if extra is None:
                    ep.active = False
                else:
                    ep.prior, ep.newest = ep.prior + ep.newest + extra, ""
            active = [ep for ep in eps if ep.active]
            if not active:
                break
            comps = generate_fn([tokenizer.encode(ep.sample.problem.prompt + ep.prior) for ep in active], 1,
                                max_tokens, temperature, seed + b0 + 7919 * turn)
            turn += 1
            for ep, c in zip(active, comps):
                ep.newest, ep.finish = apply_stop(c.text, env.stop), c.finish_reason
                ep.turns += 1
        for i in range(len(batch)):
            out.append([(ep.prior + ep.newest, ep.turns, ep.finish) for ep in eps[i * n: (i + 1) * n]])
        if progress is not None:
            progress.update(len(out), min(batch_size, len(samples) - len(out)))
    return out


@dataclass
class _Episode:
    sample: Sample
    newest: str  # the latest model response
    prior: str = ""  # earlier responses and tool output
    turns: int = 1
    finish: str = "stop"
    active: bool = True


def check_all(env: Environment, samples: list[Sample], responses: list[str]) -> list[Check]:
    """Score in one batch where the environment supports it (math: one trip through the verifier pool)."""
    batch = getattr(env, "check_batch", None)
    if batch is not None:
        return batch(samples, responses)
    return [env.check(s, r) for s, r in zip(samples, responses)]


def run_benchmark(name: str, env: Environment, generate_fn: GenerateFn, tokenizer: _Tokenizer, *, n: int = 1,
                  max_tokens: int = 256, temperature: float = 0.0, seed: int = 0, max_samples: int | None = None,
                  batch_size: int = 64, progress: bool | float = False) -> BenchmarkResult:
    """`progress`: a progress line with ETA on stderr; True from the start (`rlexp eval`), a number of seconds
    after which a slow evaluation starts to report (one inside a training run, which has its own step lines)."""
    t0 = time.perf_counter()
    samples = env.eval_samples()
    if max_samples:
        samples = samples[:max_samples]
    shown = None if progress is False else Progress(
        name, len(samples), after_s=0.0 if progress is True else float(progress),
        every_s=15.0 if progress is True else float(progress))
    try:
        episodes = rollout(env, samples, generate_fn, tokenizer, n=n, max_tokens=max_tokens,
                           temperature=temperature, seed=seed, batch_size=batch_size, progress=shown)
    finally:
        if shown is not None:
            shown.close()
    flat_s = [s for s, eps in zip(samples, episodes) for _ in eps]
    flat_e = [e for eps in episodes for e in eps]
    checks = check_all(env, flat_s, [e[0] for e in flat_e])
    record_extra = getattr(env, "record", None)
    records: list[SampleRecord] = []
    for idx, (s, (text, turns, finish), chk) in enumerate(zip(flat_s, flat_e, checks)):
        extra = record_extra(s) if record_extra else {}
        records.append(SampleRecord(prompt_id=s.id, prompt=s.problem.prompt, response=text, extracted=chk.extracted,
                                    gold=s.answer, correct=chk.correct, parseable=chk.parseable,
                                    score=partial_credit(chk), sample_index=idx % n, turns=turns,
                                    finish_reason=finish,
                                    choice_permutation=extra.pop("choice_permutation", None), extra=extra))
    groups = [records[i * n: (i + 1) * n] for i in range(len(samples))]
    metrics = summarize([[r.correct for r in g] for g in groups], [[r.parseable for r in g] for g in groups],
                        [[r.extracted for r in g] for g in groups], k=n)
    metrics["partial_credit"] = sum(r.score for r in records) / max(1, len(records))
    return BenchmarkResult(name, metrics, records, time.perf_counter() - t0, problems=[s.problem for s in samples])


SLOW_EVAL_S = 30.0  # an evaluation inside a training run reports its progress once it has taken this long


def partial_credit(chk: Check) -> float:
    """One response's partial credit: the environment's `Check.score` (e.g. sort's fraction of
    positions right), or 1.0/0.0 from `correct` when it gives none, so every benchmark reports it
    beside exact match."""
    return float(chk.score) if chk.score is not None else float(chk.correct)


def metric_names(result: BenchmarkResult, prefix: str) -> dict[str, float]:
    keep = ("accuracy", "partial_credit", "unparseable", "ci_low", "ci_high")
    return {f"{prefix}/{k}": float(v) for k, v in result.metrics.items() if k in keep or "@" in k}


def evaluate(env: Environment, generate_fn: GenerateFn, tokenizer: _Tokenizer, eval_cfg: EvalConfig, step: int,
             benchmark: str | None = None, samples_dir: str | Path | None = None) -> dict[str, float]:
    """Metrics for the training loop: `eval/accuracy`... for the training environment (benchmark=None),
    `eval/<benchmark>/accuracy`... for an extra benchmark. With `samples_dir`, also writes the scored
    responses to `samples_dir/<benchmark or train>_step<step>.jsonl` for later inspection."""
    res = run_benchmark(benchmark or env.name, env, generate_fn, tokenizer, n=max(1, eval_cfg.k),
                        max_tokens=eval_cfg.max_tokens, temperature=eval_cfg.temperature, seed=eval_cfg.seed,
                        max_samples=eval_cfg.max_samples, batch_size=eval_cfg.batch_size,
                        progress=SLOW_EVAL_S)
    if samples_dir is not None:
        from rlexp.evals.results import write_samples

        write_samples(Path(samples_dir) / f"{benchmark or 'train'}_step{step:06d}.jsonl", res.records)
    m = res.metrics
    log.info("step %d eval %s: accuracy %.4f, partial credit %.4f (%d problems, %.1fs)", step,
             res.name, m["accuracy"], m["partial_credit"], int(m["n_problems"]), res.seconds)
    return metric_names(res, "eval" if benchmark is None else f"eval/{benchmark}")
