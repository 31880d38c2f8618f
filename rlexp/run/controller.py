"""The controller: runs `loop.train` and owns everything around a step (logging, progress, evaluation,
checkpoints, resume). Kept apart from loop.py so the loop stays a five-minute read."""
from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlexp.algorithm import loop
from rlexp.config.eval import EvalConfig
from rlexp.config.paths import final_dir
from rlexp.core.services import Services
from rlexp.evals.runner import evaluate
from rlexp.models.tokenizer import load_tokenizer
from rlexp.run import checkpoints
from rlexp.run.prepare import Prepared
from rlexp.tracking.base import Trackers, to_float
from rlexp.tracking.runlog import announce
from rlexp.types import Completion


def zero_adv_warning(m: dict[str, float]) -> str:
    """A progress-line warning when the reward stopped separating a group's responses: GRPO then has no
    gradient left, which is how a collapsed policy looks (the reward states its own limit, weaver's
    `warn_zero_adv`; rewards that state none never warn)."""
    share, limit = m.get("weaver/flat_group_frac"), m.get("weaver/zero_adv_warn_at")
    if share is None or limit is None or share <= limit:
        return ""
    return f" | WARNING: {share:.0%} of groups have zero advantage (> {limit:.0%}): no gradient left"


def weaver_fallback_warning(m: dict[str, float]) -> str:
    """A progress-line warning, every step it holds, when Weaver's label model was not fit (too few verifiers
    survived its filters): the reward is then the unweighted mean, and an arm called Weaver measures the mean
    (issue 46). The reward's own warning names the dropped verifiers once; this keeps it on screen."""
    if not m.get("reward/weaver_fallback"):
        return ""
    return (f" | WEAVER FALLBACK: {m.get('weaver/n_active', float('nan')):.0f} active verifier(s), label model not "
            "fit: the reward is the mean")


class Controller:
    def __init__(self, p: Prepared, svc: Services, run_dir: Path, trackers: Trackers, resume_hash: str,
                 between_steps: Callable[..., None] | None = None) -> None:
        self.resume_hash = resume_hash
        # Called after every step and, with final=True, after the last one: where a deferred Ctrl-C is raised.
        self.between_steps = between_steps
        self.p, self.c, self.svc, self.run_dir, self.trackers = p, p.cfg, svc, run_dir, trackers
        self.tok = load_tokenizer(p.model_dir)
        self.state = loop.LoopState(data_rng=random.Random(p.seeds["data"]))
        self.t0 = time.perf_counter()
        trackers.start_clock()  # the run's clock (time/wall_s) starts with the controller, like its own t0
        self.first_eval: float | None = None
        self.last_eval: tuple[int, float] | None = None  # (step, held-out accuracy) of the latest evaluation
        self.evaluated_at: int | None = None
        self.last: dict[str, float] = {}
        self.best_eval = float("-inf")
        self.saved_at: Path | None = None  # the newest checkpoint this process wrote

    # --- the run -----------------------------------------------------------------------------------
    def run(self, resume_from: Path | None) -> dict[str, float]:
        c = self.c
        if resume_from is not None:
            self.load_checkpoint(resume_from)
            announce(f"[rlexp] resumed from {resume_from} at step {self.state.step}")
        else:
            self.trackers.log(self.evaluate(), 0)
        loop.train(c, self.svc, self.p.env, self.tok.encode, self.state, self.on_step)
        if self.between_steps is not None:
            self.between_steps(final=True)
        final = dict(self.last)
        if self.evaluated_at != self.state.step:  # the last step evaluates in on_step; this is for steps=0
            ev = self.evaluate()
            self.trackers.log(ev, self.state.step)
            final.update(ev)
        if c.checkpoint.save_final:
            out = final_dir(self.run_dir)
            shutil.rmtree(out, ignore_errors=True)
            self.svc.trainer.export_hf.call(str(out))
            self.trackers.log_artifact(out, kind="checkpoint")
        first = self.first_eval if self.first_eval is not None else float("nan")
        final.update({"eval/accuracy_start": first, "eval/accuracy_best": self.best_eval,
                      "time/total_s": self.trackers.wall_s()})
        announce(f"[rlexp] done: {self.state.step} steps in {final['time/total_s']:.1f}s; held-out accuracy "
                 f"{first:.3f} -> {final.get('eval/accuracy', float('nan')):.3f} ({self.c.environment.name}, "
                 f"{min(len(self.p.env.eval_samples()), self.c.eval.max_samples or 10**9)} problems)")
        return final

    def on_step(self, step: int, metrics: dict[str, float], rollouts: list[dict[str, Any]]) -> None:
        c = self.c
        every = c.eval.every_n_steps
        # The last step is evaluated here, in its own row, so the final accuracy shares the step's clock.
        if (every and step % every == 0) or step == c.steps:
            metrics.update(self.evaluate())
        tables = c.logger.rollout_every_n_steps
        if (tables and step % tables == 0) or step == c.steps:
            self.trackers.log_table("rollouts", [{"step": step, **r} for r in rollouts], step)
        metrics.update(self.svc.metrics())  # requests issued/retried/completed, replicas alive
        self.trackers.log(metrics, step)
        self.last.update(metrics)
        if c.checkpoint.every_n_steps and step % c.checkpoint.every_n_steps == 0 and step < c.steps:
            self.save_checkpoint(step)
        self.progress(step, metrics)
        if self.between_steps is not None:
            self.between_steps()

    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy of the run's product: the live policy, or the weight average when the trainer keeps
        one (`trainer.ema_decay`), which is then loaded into the generators for the evaluation and replaced by the
        live weights after it, under the same version, so sampling never sees it. The live policy's accuracy on
        the training environment is logged beside it as `eval/live/...`."""
        t = time.perf_counter()
        if self.c.trainer.ema_decay <= 0:
            metrics = self._evaluate(benchmarks=True, samples=self.run_dir / "eval_samples")
        else:
            live = self._evaluate(benchmarks=False, samples=self.run_dir / "eval_samples" / "live")
            version = self.state.version
            loop.push_weights(self.svc, version, self.svc.trainer.push_weights.start(version, True))
            try:
                metrics = self._evaluate(benchmarks=True, samples=self.run_dir / "eval_samples")
            finally:
                loop.push_weights(self.svc, version)
            metrics.update({"eval/live/" + k.removeprefix("eval/"): v for k, v in live.items()})
        metrics["time/eval_s"] = time.perf_counter() - t
        acc = metrics.get("eval/accuracy", float("nan"))
        if self.first_eval is None:
            self.first_eval = acc
        self.last_eval = (self.state.step, acc)
        self.evaluated_at = self.state.step
        self.best_eval = max(self.best_eval, acc)
        return metrics

    def _evaluate(self, benchmarks: bool, samples: Path) -> dict[str, float]:
        """The training environment's held-out set (and, with `benchmarks`, every extra benchmark), greedy through
        the generators' current weights."""
        c = self.c

        def generate_fn(prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                        stop: list[str] | None = None) -> list[Completion]:
            return self.svc.generators.generate.route(prompt_ids, n, max_tokens, temperature, seed, stop).get()

        # The training environment is scored with the training budget, so eval and reward agree.
        ecfg = EvalConfig(**{**vars(c.eval), "max_tokens": c.algorithm.max_tokens})
        metrics = evaluate(self.p.env, generate_fn, self.tok, ecfg, self.state.step, samples_dir=samples)
        for name, (env, max_tokens) in (self.p.benchmarks.items() if benchmarks else ()):
            bench_cfg = EvalConfig(**{**vars(c.eval), "max_tokens": min(c.eval.max_tokens, max_tokens)})
            metrics.update(evaluate(env, generate_fn, self.tok, bench_cfg, self.state.step, benchmark=name,
                                    samples_dir=samples))
        return metrics

    def progress(self, step: int, m: dict[str, float]) -> None:
        c = self.c
        every = max(1, c.steps // 20)
        if step % every and step != c.steps:
            return
        elapsed = time.perf_counter() - self.t0
        rate = step / elapsed if elapsed > 0 else 0.0
        done = self.state.step
        eta = (c.steps - done) / rate if rate > 0 else float("inf")
        samples_s = rate * c.algorithm.prompts_per_step * c.algorithm.group_size
        bar = "#" * int(20 * step / c.steps)
        ev = "not yet" if self.last_eval is None else f"{self.last_eval[1]:.3f} @ step {self.last_eval[0]}"
        announce(f"[{bar:<20}] step {step}/{c.steps} | reward {m.get('reward/mean', float('nan')):.3f} | "
                 f"eval {ev} | {rate:.1f} steps/s, {samples_s:,.0f} samples/s | ETA {eta:.0f}s{zero_adv_warning(m)}"
                 f"{weaver_fallback_warning(m)}")

    # --- checkpoints ---------------------------------------------------------------------------------
    def save_checkpoint(self, step: int, keep: int | None = None) -> Path:
        st = self.state
        state = {
            "loop": st.to_state(),
            "buffer": self.svc.buffer.state_dict.call(),
            "reward": self.svc.rewards.state_dict.fanout().get(),
            # `last` and `evaluated_at`: a run checkpointed at its last step (a SIGTERM there) finishes on
            # resume with the same final metrics, without evaluating that step a second time.
            "controller": {"first_eval": self.first_eval, "best_eval": self.best_eval,
                           "last_eval": list(self.last_eval) if self.last_eval else None,
                           "evaluated_at": self.evaluated_at,
                           # trainer.pt holds a weight average: checked before a
                           # resume spawns anything (checkpoints.check_average)
                           "ema": self.c.trainer.ema_decay > 0,
                           "last": {k: f for k, v in self.last.items() if (f := to_float(v)) is not None}},
        }
        self.saved_at = checkpoints.save(self.run_dir, step, st.version, self.resume_hash,
                                         self.c.checkpoint.keep if keep is None else keep,
                                         lambda path: self.svc.trainer.save.call(str(path)), state)
        return self.saved_at

    def checkpoint_now(self) -> Path:
        """A checkpoint of the step just done, for a run told to stop (SIGTERM): the periodic one when this
        step wrote it, else a new one, kept whatever `checkpoint.keep` says (the run cannot go on without it)."""
        if self.saved_at is not None and self.saved_at.name == f"step_{self.state.step:06d}":
            return self.saved_at
        return self.save_checkpoint(self.state.step, keep=max(1, self.c.checkpoint.keep))

    def load_checkpoint(self, ckpt: Path) -> None:
        state = checkpoints.load_controller_state(ckpt)
        self.state.load_state(state["loop"])
        self.svc.buffer.load_state_dict.call(state["buffer"])
        self.svc.rewards.restore("load_state_dict", state["reward"])
        self.first_eval = state["controller"]["first_eval"]
        self.best_eval = state["controller"]["best_eval"]
        last = state["controller"].get("last_eval")
        self.last_eval = (int(last[0]), float(last[1])) if last else None
        self.evaluated_at = state["controller"].get("evaluated_at")
        self.last = dict(state["controller"].get("last") or {})
        self.svc.trainer.load.call(str(ckpt / "trainer.pt"))
        loop.push_weights(self.svc, self.state.version)
