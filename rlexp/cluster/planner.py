"""Per-GPU memory plan for a run, checked before anything launches.

Why: an 8B/32B layout that does not fit fails only after minutes of actor start-up and checkpoint
loading, with an OOM that does not say which knob to turn. The plan is arithmetic on the config
alone (no model build), so `rlexp train` can refuse in milliseconds and say what to change.

Units: `cluster.gpu_memory_gb` is read as GiB (2**30 bytes); an "80 GB" H100 exposes 79.6 GiB, so
writing 80 is fine with the default 10% headroom. All estimates are upper-bound style: they count
what PyTorch/vLLM must hold at the peak, plus a fixed runtime overhead (CUDA context, NCCL buffers,
allocator fragmentation) that experience puts at 1.5-3 GiB.

Trainer, per GPU, with S = trainer_fsdp * trainer_tp shards (FSDP2 + TP on TorchTitan). The peak is
what is held all the time plus the largest of three phases that never overlap (forward/backward, the
optimizer step, the weight push): counting their sum would refuse layouts that fit.
  held, mixed precision (`master_weight_items`, the one place these bytes live): fp32 master
    parameters 4 B + fp32 gradients 4 B + AdamW's two fp32 moments 8 B = 16 B per parameter, / S;
    without mixed precision everything is in `model.dtype`: 4 x dtype bytes.
  bf16 compute copy (mixed precision): with FSDP, two unsharded units (the one computing and the
    prefetched one) in bf16 plus fp32 for their gradients, / TP, in the forward/backward phase; the
    largest unit is a block or the (vocab x dim) embedding/head. One FSDP rank: autocast's cache of
    every weight in bf16 (n x 2 B / TP), held through the forward and backward.
  activations: tokens T = micro_batch_size * (max_prompt_tokens + max_tokens). A Qwen3 block saves,
    per token, 4*dim (two norm inputs/outputs) + 3*q_dim (q before norm, after RoPE, attention out)
    + 3*kv_dim (k twice, v) + 4*hidden_dim (w1 out, w3 out, silu out, their product) elements in the
    compute dtype; all blocks without activation checkpointing, only block inputs (dim) plus one
    block's worth with it. TP (without sequence parallelism, which rlexp does not enable) shards the
    head and hidden_dim terms; the dim-wide ones (block inputs, norms) stay whole on every TP rank.
  logits: T * vocab * LOGIT_PEAK_BYTES / TP: the peak of `rlexp.models.policy.token_logprobs`
    (logits cast to fp32, divided by the temperature, log-softmax, gather) through its backward,
    measured on CPU by counting live tensor storages
    (tests/test_planner.py::test_logits_peak_is_measured): 12.25 B per logit element for bf16
    logits, 12.5 B for fp32; the trainer's logprobs come from a loss-parallel cross-entropy on
    vocabulary-sharded logits.
  AdamW foreach temporaries (optimizer step phase): `torch._foreach_sqrt` of the second moment, one
    copy of it (4 B per parameter in fp32, measured the same way), / S.
  weight push (push phase): `titan_full_hf_state_dict` gathers one tensor at a time and moves it to
    the CPU before the next, so the GPU holds at most the largest unsharded tensor (the
    embedding/head, or a block's widest matrix) in the parameters' dtype.
  reference model (algorithm.kl_coef > 0, colocated with the trainer): bf16 weights / S.
Generator replica, per GPU (vLLM, TP = generator_tp):
  weights: params * dtype bytes / TP.
  KV cache for the whole step's batch at full length: sequences per replica
    = ceil(prompts_per_step * group_size / generator_replicas), each max_prompt_tokens + max_tokens
    long: 2 (K and V) * n_layers * max(1, n_kv_heads / TP) * head_dim * bytes * tokens.
  sampler logits: sequences * vocab * 4 B (fp32), plus the runtime overhead (CUDA graphs, activations).
  vLLM's `gpu_memory_utilization` (`generator.gpu_memory_utilization=0`, the default) is this total
    over the GPU's memory (`vllm_memory_utilization`): vLLM then holds what the plan counted, not a
    fixed 0.85.
Micro-batch: `trainer.micro_batch_size=0` (trainer=large, what a real model brings) is derived here: the largest
  micro-batch, up to the rows each data-parallel rank trains per step, whose trainer plan fits; the rest of the step's
  rows are gradient accumulation (rlexp/actors/trainer.py splits a step into micro-batches).
Time: FLOPs at a stated utilisation, so a person can size a Slurm request. Per step, with N parameters and
  T = prompts_per_step * group_size * (max_prompt_tokens + max_tokens) tokens (every sequence at full length):
  generation 2 N T over the generator GPUs, training (6 N T, 8 N T with activation checkpointing's recomputed
  forward, + 2 N T for the reference model) over the trainer GPUs, each at `cluster.mfu` x `cluster.gpu_peak_tflops`;
  on-policy the two run one after the other, async they overlap. Decoding is memory-bound and usually runs below
  the training MFU: read the generation time as a lower bound.
Model verifiers (reward models and LM judges the reward serves, `rlexp.cluster.layout.reward_verifiers`), per GPU:
  each replica has a GPU of its own and needs the verifier's `memory_gb` (read as GiB, like
  `cluster.gpu_memory_gb`; the verifier_set files size it as bf16 weights + headroom). These are the
  verifier set's numbers, not derived here: a verifier can be any architecture.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from rlexp.cluster.layout import reward_verifiers
from rlexp.cluster.registry import job_backend
from rlexp.config.model import ArchConfig
from rlexp.models.catalog import layer_param_count, param_count

GiB = 2**30
DEFAULT_HEADROOM = 0.10
RUNTIME_OVERHEAD_GIB = 2.0
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Bytes per logit element at the peak of the logprobs' forward and backward (see the module
# docstring): measured 12.25 (bf16 logits) and 12.5 (fp32) on CPU; the larger is counted.
LOGIT_PEAK_BYTES = 12.5
# Mixed precision's sharded state per parameter: fp32 master 4 + fp32 gradient 4 + AdamW's m and v,
# 4 each.
MASTER_BYTES = {"parameters (fp32 master)": 4, "gradients (fp32)": 4, "AdamW m+v (fp32)": 8}
ADAMW_TEMP_STATES = 1  # `_foreach_sqrt(exp_avg_sqs)`: one copy of the second moment during `step`
# The phases of a trainer step that never overlap; an item with no phase is held throughout.
FWD_BWD, OPTIM, PUSH = "forward/backward", "optimizer step", "weight push"


class PlanError(RuntimeError):
    """The layout cannot fit; `.report` holds the numbers, the message says what to change."""

    def __init__(self, message: str, report: PlanReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class Item:
    name: str
    bytes: float
    how: str  # the arithmetic, printed next to the number
    phase: str = ""  # "" = held all the time; else the phase (FWD_BWD, OPTIM, PUSH) that holds it


@dataclass
class RolePlan:
    role: str  # "trainer" | "generator"
    gpus: int
    layout: str
    items: list[Item]
    capacity_bytes: float | None  # usable bytes per GPU (after headroom); None = no limit known

    def phase_bytes(self, phase: str) -> float:
        return sum(i.bytes for i in self.items if i.phase == phase)

    @property
    def peak_phase(self) -> str:
        """The phase whose memory sets the peak ("" when no item has a phase)."""
        phases = dict.fromkeys(i.phase for i in self.items if i.phase)
        return max(phases, key=self.phase_bytes, default="")

    @property
    def total_bytes(self) -> float:
        """The peak: what is held throughout plus the largest phase (phases never overlap)."""
        peak = self.phase_bytes(self.peak_phase) if self.peak_phase else 0.0
        return self.phase_bytes("") + peak

    @property
    def fits(self) -> bool:
        return self.capacity_bytes is None or self.total_bytes <= self.capacity_bytes

    def get(self, name: str) -> float:
        return next(i.bytes for i in self.items if i.name == name)


@dataclass
class TrainerSetup:
    fsdp: int
    tp: int
    micro_batch_size: int
    seq_len: int
    activation_checkpointing: bool
    mixed_precision: bool
    dtype: str
    reference_model: bool = False
    rows_per_rank: int = 0  # rows of the step's batch one data-parallel rank trains (0: unknown)

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        return max(1, math.ceil(self.rows_per_rank / self.micro_batch_size)) if self.rows_per_rank else 1


@dataclass
class GeneratorSetup:
    tp: int
    replicas: int
    seqs_per_step: int  # prompts_per_step * group_size
    seq_len: int
    dtype: str
    # vLLM's scheduler budget (`generator.max_num_batched_tokens`, `max_num_seqs`): its profile run
    # sizes the memory it keeps beside the KV cache from them. 0: not a vLLM generator.
    batched_tokens: int = 0
    max_seqs: int = 0

    @property
    def seqs_per_replica(self) -> int:
        return math.ceil(self.seqs_per_step / self.replicas)


@dataclass
class VerifierPlan:
    """One served model verifier: its own mesh of `replicas` processes, one GPU each."""

    name: str
    kind: str
    replicas: int
    bytes_per_gpu: float  # memory_gb as GiB; 0 = not given (a stand-in, or an unsized checkpoint)
    checkpoint: str  # hf_repo@revision, the local path, or tiny:<name>
    capacity_bytes: float | None

    @property
    def gpus(self) -> int:
        return self.replicas

    @property
    def fits(self) -> bool:
        return self.capacity_bytes is None or self.bytes_per_gpu <= self.capacity_bytes


def verifier_checkpoint_name(options: dict[str, Any]) -> str:
    if options.get("hf_repo"):
        return f"{options['hf_repo']}@{options.get('revision', 'main')}"
    if options.get("tiny"):
        return f"tiny:{options['tiny']}"
    return str(options.get("path") or "?")


def verifier_plans(cfg: Any, capacity_bytes: float | None = None) -> list[VerifierPlan]:
    """The served model verifiers of the run's reward (none for reward=rule/annotated)."""
    return [VerifierPlan(v.name, str(v.kind), int(v.replicas), float(v.memory_gb or 0.0) * GiB,
                         verifier_checkpoint_name(dict(v.options or {})), capacity_bytes)
            for v in reward_verifiers(cfg)]


@dataclass
class PlanReport:
    model: str
    arch: ArchConfig
    trainer: RolePlan
    generator: RolePlan
    gpus_needed: int
    gpus_available: int | None
    gpu_memory_gib: float | None
    headroom: float
    problems: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    verifiers: list[VerifierPlan] = field(default_factory=list)
    reward: str = ""  # reward.name, and the verifier set the verifiers come from, for the table
    micro_batch_size: int = 0  # the trainer's micro-batch: configured, or derived from the plan
    micro_batch_derived: bool = False
    time: StepTime | None = None
    # vLLM's share of each generator GPU (`vllm_memory_utilization`)
    gpu_memory_utilization: float = 0.0

    @property
    def verifier_gpus(self) -> int:
        return sum(v.gpus for v in self.verifiers)

    @property
    def ok(self) -> bool:
        return not self.problems

    def table(self) -> str:
        lines = [f"memory plan for model={self.model} ({param_count(self.arch) / 1e9:.2f}B parameters)"]
        if self.gpu_memory_gib:
            lines.append(f"cluster: {self.gpus_available} GPUs x {self.gpu_memory_gib:g} GiB, usable "
                         f"{self.gpu_memory_gib * (1 - self.headroom):.1f} GiB each after "
                         f"{self.headroom:.0%} headroom; "
                         f"this layout uses {self.gpus_needed}")
        else:
            lines.append("cluster: no GPU memory limit configured (cluster.gpu_memory_gb unset): sizes only")
        if self.micro_batch_derived:
            lines.append(f"trainer.micro_batch_size=0: derived {self.micro_batch_size}, the largest micro-batch whose "
                         f"trainer plan fits")
        for rp in (self.trainer, self.generator):
            lines.append("")
            lines.append(f"{rp.role}: {rp.gpus} GPU(s), {rp.layout}")
            lines.append(f"  {'component':<28}{'GiB/GPU':>10}  arithmetic")
            for it in rp.items:
                during = f" [{it.phase}]" if it.phase else ""
                lines.append(f"  {it.name:<28}{it.bytes / GiB:>10.2f}  {it.how}{during}")
            cap = f" of {rp.capacity_bytes / GiB:.1f}" if rp.capacity_bytes else ""
            verdict = "" if rp.capacity_bytes is None else ("  fits" if rp.fits else "  DOES NOT FIT")
            peak = f"  (held + {rp.peak_phase}, the largest phase)" if rp.peak_phase else ""
            lines.append(f"  {'peak':<28}{rp.total_bytes / GiB:>10.2f}{cap}{verdict}{peak}")
            if rp is self.generator and self.gpu_memory_utilization:
                lines.append(f"  vLLM gpu_memory_utilization {self.gpu_memory_utilization:.2f} "
                             f"(this peak over the GPU's memory; "
                             f"generator.gpu_memory_utilization=0 takes it)")
        if self.verifiers:
            lines.append("")
            lines.append(f"verifiers: {self.verifier_gpus} GPU(s), {len(self.verifiers)} served model verifier(s) of "
                         f"{self.reward}, one mesh each, one GPU per replica")
            w = max(20, *(len(v.name) + 2 for v in self.verifiers))
            lines.append(f"  {'name':<{w}}{'kind':<14}{'replicas':>8}{'GiB/GPU':>10}  checkpoint")
            for v in self.verifiers:
                gib = f"{v.bytes_per_gpu / GiB:>10.2f}" if v.bytes_per_gpu else f"{'?':>10}"
                verdict = "" if v.capacity_bytes is None or not v.bytes_per_gpu else (
                    "  fits" if v.fits else "  DOES NOT FIT")
                lines.append(f"  {v.name:<{w}}{v.kind:<14}{v.replicas:>8}{gib}  {v.checkpoint}{verdict}")
        if self.time is not None:
            lines.append("")
            lines.extend(self.time.lines())
        if self.problems:
            lines.append("")
            lines.extend(f"problem: {p}" for p in self.problems)
            lines.extend(f"fix: {f}" for f in self.fixes)
        return "\n".join(lines)


@dataclass
class StepTime:
    """Seconds per step and per run from FLOPs (see the module docstring): a stated estimate, not a measurement."""

    gen_flops: float
    train_flops: float
    gen_gpus: int
    train_gpus: int
    peak_tflops: float  # per GPU, bf16 dense; 0 = unknown
    mfu: float
    steps: int
    overlap: bool  # async: generation overlaps training

    def seconds(self, flops: float, gpus: int) -> float:
        return flops / (max(1, gpus) * self.peak_tflops * 1e12 * self.mfu)

    @property
    def step_s(self) -> float:
        g, t = self.seconds(self.gen_flops, self.gen_gpus), self.seconds(self.train_flops, self.train_gpus)
        return max(g, t) if self.overlap else g + t

    def lines(self) -> list[str]:
        if not self.peak_tflops or self.mfu <= 0:
            return [f"time: unknown (set cluster.gpu_peak_tflops, the GPU's peak bf16 TFLOP/s, and cluster.mfu) for "
                    f"{self.gen_flops / 1e15:.1f} PFLOP of generation + {self.train_flops / 1e15:.1f} PFLOP of "
                    f"training per step"]
        g, t = self.seconds(self.gen_flops, self.gen_gpus), self.seconds(self.train_flops, self.train_gpus)
        how = "max of the two (sync=async)" if self.overlap else "their sum (sync=on_policy)"
        run_h = self.step_s * self.steps / 3600
        return [f"time at MFU {self.mfu:g} of {self.peak_tflops:g} TFLOP/s bf16 per GPU (cluster.mfu, "
                f"cluster.gpu_peak_tflops): generation {self.gen_flops / 1e15:.1f} PFLOP / {self.gen_gpus} GPU(s) = "
                f"{g:.1f} s, training {self.train_flops / 1e15:.1f} PFLOP / {self.train_gpus} GPU(s) = {t:.1f} s",
                f"  ~{self.step_s:.1f} s per step ({how}), ~{run_h:.1f} h for {self.steps} steps, plus start-up "
                f"and evaluation; generation is a lower bound (decoding is memory-bound)"]


def step_time(n_params: int, t: TrainerSetup, g: GeneratorSetup, peak_tflops: float, mfu: float, steps: int,
              overlap: bool) -> StepTime:
    tokens = g.seqs_per_step * g.seq_len
    train = ((8 if t.activation_checkpointing else 6) + (2 if t.reference_model else 0)) * n_params * tokens
    return StepTime(2 * n_params * tokens, train, g.tp * g.replicas, t.fsdp * t.tp, peak_tflops, mfu, steps,
                    overlap)


def fit_micro_batch(arch: ArchConfig, t: TrainerSetup, cap: float | None) -> int:
    """The largest micro-batch (up to the rows one rank trains per step) whose trainer plan fits; 1 when none
    does (the plan then says what else to change)."""
    hi = max(1, t.rows_per_rank)
    if cap is None:
        return hi
    fits = lambda mb: trainer_plan(arch, replace(t, micro_batch_size=mb), cap).fits  # noqa: E731
    lo = 1
    if not fits(lo):
        return 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


# ----------------------------------------------------------------------------------------------------
# Estimates
# ----------------------------------------------------------------------------------------------------


def activation_elems_per_token_per_layer(arch: ArchConfig) -> int:
    q, kv = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
    return 4 * arch.dim + 3 * q + 3 * kv + 4 * arch.hidden_dim


def master_weight_items(n: int, shards: int, mixed_precision: bool, dtype: str) -> list[Item]:
    """The sharded state every trainer rank holds: `MASTER_BYTES` per parameter with mixed precision
    (fp32 master weights and AdamW state, bf16 compute), else parameters, gradients and both moments
    in `dtype`."""
    if mixed_precision:
        return [Item(name, n * b / shards, f"{n:,} x {b} B / {shards}")
                for name, b in MASTER_BYTES.items()]
    b = _DTYPE_BYTES[dtype]
    return [Item(f"parameters ({dtype})", n * b / shards, f"{n:,} x {b} B / {shards}"),
            Item(f"gradients ({dtype})", n * b / shards, f"{n:,} x {b} B / {shards}"),
            Item(f"AdamW m+v ({dtype})", n * 2 * b / shards, f"{n:,} x 2x{b} B / {shards}")]


def largest_tensor(arch: ArchConfig) -> int:
    """Elements of the model's largest single weight: what the streamed weight push holds unsharded
    at once."""
    q, kv = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
    return max(arch.vocab_size * arch.dim, arch.dim * arch.hidden_dim, (q + 2 * kv) * arch.dim)


def trainer_plan(arch: ArchConfig, s: TrainerSetup, capacity_bytes: float | None = None) -> RolePlan:
    n = param_count(arch)
    shards = s.fsdp * s.tp
    b = _DTYPE_BYTES[s.dtype]
    act_b = 2 if s.mixed_precision else b
    state_b = 4 if s.mixed_precision else b  # master parameters and AdamW state
    items = master_weight_items(n, shards, s.mixed_precision, s.dtype)
    unit = max(layer_param_count(arch), arch.vocab_size * arch.dim)
    grad_b = 4 if s.mixed_precision else b
    if s.fsdp > 1:
        items.append(Item("FSDP all-gather buffers", 2 * unit * (act_b + grad_b) / s.tp,
                          f"2 units x {unit:,} x ({act_b}+{grad_b}) B / tp {s.tp}", FWD_BWD))
    elif s.mixed_precision:
        items.append(Item("bf16 compute copy", n * 2 / s.tp, f"{n:,} x 2 B / tp {s.tp} (autocast's "
                                                             f"weight cache)",
                          FWD_BWD))
    tokens = s.micro_batch_size * s.seq_len
    e = activation_elems_per_token_per_layer(arch)
    whole, split = 4 * arch.dim, e - 4 * arch.dim  # per token per layer: replicated over TP / sharded by it
    per_layer = f"({whole} + {split} / tp {s.tp})"
    if s.activation_checkpointing:
        act = (arch.n_layers * arch.dim + whole + split / s.tp) * tokens * act_b
        how = f"({arch.n_layers} x {arch.dim} + {per_layer}) x {tokens} tok x {act_b} B (checkpointed)"
    else:
        act = arch.n_layers * (whole + split / s.tp) * tokens * act_b
        how = f"{arch.n_layers} x {per_layer} x {tokens} tok x {act_b} B"
    items.append(Item("activations", act, how, FWD_BWD))
    items.append(Item("logits + logprob grads", tokens * arch.vocab_size * LOGIT_PEAK_BYTES / s.tp,
                      f"{tokens} tok x {arch.vocab_size} x {LOGIT_PEAK_BYTES} B / tp {s.tp}",
                      FWD_BWD))
    items.append(Item("AdamW foreach temporaries", n * ADAMW_TEMP_STATES * state_b / shards,
                      f"{n:,} x {ADAMW_TEMP_STATES} x {state_b} B / {shards} (sqrt of the second "
                      f"moment)", OPTIM))
    big = largest_tensor(arch)
    items.append(Item("weight push (streamed)", big * state_b,
                      f"{big:,} x {state_b} B (the largest tensor, gathered whole, one at a time)",
                      PUSH))
    if s.reference_model:
        items.append(Item("reference model (bf16)", n * 2 / shards, f"{n:,} x 2 B / {shards} (kl_coef > 0)"))
    items.append(Item("runtime overhead", RUNTIME_OVERHEAD_GIB * GiB, "CUDA context, NCCL, fragmentation"))
    accum = f" (x{s.accumulation} accumulated)" if s.accumulation > 1 else ""
    layout = (f"FSDP {s.fsdp} x TP {s.tp}, micro-batch {s.micro_batch_size} x {s.seq_len} tokens{accum}, "
              f"activation checkpointing {'on' if s.activation_checkpointing else 'off'}, "
              f"{'fp32 master weights, bf16 compute' if s.mixed_precision else s.dtype}")
    return RolePlan("trainer", shards, layout, items, capacity_bytes)


def generator_plan(arch: ArchConfig, g: GeneratorSetup, capacity_bytes: float | None = None) -> RolePlan:
    n = param_count(arch)
    b = _DTYPE_BYTES[g.dtype]
    seqs = g.seqs_per_replica
    tokens = seqs * g.seq_len
    kv_heads = max(1, arch.n_kv_heads // g.tp)  # vLLM replicates KV heads when TP > n_kv_heads
    items = [
        Item(f"weights ({g.dtype})", n * b / g.tp, f"{n:,} x {b} B / tp {g.tp}"),
        Item("KV cache", 2 * arch.n_layers * kv_heads * arch.head_dim * b * tokens,
             f"2 x {arch.n_layers} x {kv_heads} kv heads x {arch.head_dim} x {b} B x {seqs} seqs x {g.seq_len} tok"),
        Item("sampler logits (fp32)", seqs * arch.vocab_size * 4 / g.tp,
             f"{seqs} seqs x {arch.vocab_size} x 4 B / tp {g.tp}"),
        Item("runtime overhead", RUNTIME_OVERHEAD_GIB * GiB, "CUDA context, graphs, activations"),
    ]
    if g.batched_tokens:
        items += vllm_profile_items(arch, g, b)
    layout = (f"{g.replicas} replica(s) x TP {g.tp}, {seqs} sequences per replica "
              f"(of {g.seqs_per_step} per step) x {g.seq_len} tokens, {g.dtype}")
    return RolePlan("generator", g.tp * g.replicas, layout, items, capacity_bytes)


def vllm_profile_items(arch: ArchConfig, g: GeneratorSetup, b: int) -> list[Item]:
    """What vLLM keeps beside its weights and KV cache: the peak of its profile run, a forward over
    `max_num_batched_tokens` tokens (per token one layer's residual and norm output, 2 x dim, and
    its q, k, v, attention output and SwiGLU w1, w3 and product, sharded by TP) and a sampler over
    `max_num_seqs` full-vocabulary fp32 rows (logits and probabilities, 8 B). vLLM sizes the KV
    cache from what the profile leaves, so the plan counts it, and `gpu_memory_utilization` includes
    it."""
    q, kv = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
    per_tok = 2 * arch.dim + (2 * q + 2 * kv + 3 * arch.hidden_dim) / g.tp
    return [Item("vLLM profile activations", g.batched_tokens * per_tok * b,
                 f"{g.batched_tokens} tok x (2 x {arch.dim} + (2 x {q} + 2 x {kv} + 3 x "
                 f"{arch.hidden_dim}) / tp {g.tp}) x {b} B"),
            Item("vLLM profile sampler", g.max_seqs * arch.vocab_size * 8,
                 f"{g.max_seqs} seqs x {arch.vocab_size} x 8 B (fp32 logits and probabilities)")]


# ----------------------------------------------------------------------------------------------------
# From the run config
# ----------------------------------------------------------------------------------------------------


def _get(cfg: Any, dotted: str, default: Any = ...) -> Any:
    cur = cfg
    for part in dotted.split("."):
        try:
            cur = cur[part] if isinstance(cur, dict) else getattr(cur, part)
        except (AttributeError, KeyError):
            cur = None
        if cur is None:
            if default is ...:
                raise PlanError(f"config field {dotted!r} is required by the memory planner", None)  # type: ignore[arg-type]
            return default
    return cur


def setups_from_cfg(cfg: Any) -> tuple[ArchConfig, TrainerSetup, GeneratorSetup]:
    """Read exactly the fields listed in `PLAN_FIELDS` (the contract with the run config)."""
    m = _get(cfg, "model")
    arch = _get(m, "arch")
    if not isinstance(arch, ArchConfig):
        arch = ArchConfig(**{k: arch[k] for k in ArchConfig.__dataclass_fields__ if k in arch})
    seq_len = int(_get(cfg, "algorithm.max_prompt_tokens")) + int(_get(cfg, "algorithm.max_tokens"))
    dtype = str(_get(m, "dtype", "bfloat16"))
    seqs = int(_get(cfg, "algorithm.prompts_per_step")) * int(_get(cfg, "algorithm.group_size"))
    fsdp = int(_get(m, "parallelism.trainer_fsdp", 1))
    t = TrainerSetup(
        fsdp=fsdp,
        tp=int(_get(m, "parallelism.trainer_tp", 1)),
        micro_batch_size=int(_get(cfg, "trainer.micro_batch_size")),
        seq_len=seq_len,
        activation_checkpointing=bool(_get(cfg, "trainer.activation_checkpointing", False)),
        # the trainer keeps fp32 masters whenever it computes in a half dtype (rlexp.models.parallel)
        mixed_precision=bool(_get(cfg, "trainer.mixed_precision", True)) or dtype != "float32",
        dtype=dtype,
        reference_model=float(_get(cfg, "algorithm.kl_coef", 0.0)) > 0,
        rows_per_rank=math.ceil(seqs / fsdp),
    )
    # The effective layout: `generator.*` (which defaults to the model's layout) wins when present.
    g = GeneratorSetup(
        tp=int(_get(cfg, "generator.tp", None) or _get(m, "parallelism.generator_tp", 1)),
        replicas=int(_get(cfg, "generator.replicas", None) or _get(m, "parallelism.generator_replicas", 1)),
        seqs_per_step=seqs,
        seq_len=seq_len,
        dtype="bfloat16" if dtype == "float32" and bool(_get(cfg, "trainer.mixed_precision", True)) else dtype,
    )
    if str(_get(cfg, "generator.backend", "titan")) == "vllm":
        g = replace(g, batched_tokens=int(_get(cfg, "generator.max_num_batched_tokens", 65536)),
                    max_seqs=int(_get(cfg, "generator.max_num_seqs", 1024)))
    return arch, t, g


PLAN_FIELDS = (
    "model.name", "model.dtype", "model.arch.*", "model.parallelism.trainer_fsdp", "model.parallelism.trainer_tp",
    "generator.tp and generator.replicas (optional, default model.parallelism.generator_tp / generator_replicas)",
    "generator.backend, generator.max_num_batched_tokens, generator.max_num_seqs (optional: vLLM's "
    "profile run)",
    "cluster.gpu_memory_gb", "cluster.gpus_per_host", "cluster.hosts",
    "trainer.micro_batch_size (0: derived here)", "cluster.gpu_peak_tflops, cluster.mfu, steps, sync.mode "
    "(optional: the time estimate)", "trainer.activation_checkpointing", "trainer.mixed_precision",
    "algorithm.max_prompt_tokens", "algorithm.max_tokens", "algorithm.group_size", "algorithm.prompts_per_step",
    "algorithm.kl_coef (optional, default 0)",
    "reward.name, reward.options, reward.verifiers, verifier_set.name, verifier_set.members (optional: the served "
    "model verifiers, their replicas, memory_gb and options.hf_repo/revision/path/tiny)",
)


def plan_memory(cfg: Any, headroom: float = DEFAULT_HEADROOM) -> PlanReport:
    arch, t, g = setups_from_cfg(cfg)
    gib = _get(cfg, "cluster.gpu_memory_gb", None)
    gib = float(gib) if gib else None
    per_host = _get(cfg, "cluster.gpus_per_host", None)
    hosts = _get(cfg, "cluster.hosts", 1)
    available = int(per_host) * int(hosts) if per_host else None
    cap = gib * GiB * (1 - headroom) if gib else None
    derived = t.micro_batch_size == 0
    if derived:
        t = replace(t, micro_batch_size=fit_micro_batch(arch, t, cap))
    verifiers = verifier_plans(cfg, cap)
    set_name = _get(cfg, "verifier_set.name", None)
    report = PlanReport(
        model=str(_get(cfg, "model.name", "?")), arch=arch,
        trainer=trainer_plan(arch, t, cap), generator=generator_plan(arch, g, cap),
        gpus_needed=t.fsdp * t.tp + g.tp * g.replicas + sum(v.gpus for v in verifiers), gpus_available=available,
        gpu_memory_gib=gib, headroom=headroom, verifiers=verifiers,
        reward=f"reward={_get(cfg, 'reward.name', '?')}" + (f" (verifier_set={set_name})" if set_name else ""),
        micro_batch_size=t.micro_batch_size, micro_batch_derived=derived,
        time=step_time(param_count(arch), t, g, float(_get(cfg, "cluster.gpu_peak_tflops", 0.0)),
                       float(_get(cfg, "cluster.mfu", 0.0)), int(_get(cfg, "steps", 1)),
                       str(_get(cfg, "sync.mode", "on_policy")) == "async"),
    )
    report.gpu_memory_utilization = vllm_memory_utilization(report.generator, gib, headroom)
    _diagnose(report, arch, t, g, cap, per_host and int(per_host), available)
    return report


def vllm_memory_utilization(generator: RolePlan, gpu_memory_gib: float | None,
                            headroom: float = DEFAULT_HEADROOM) -> float:
    """vLLM's `gpu_memory_utilization` for the plan: the generator's planned peak over the GPU's
    memory, rounded up to a hundredth, at most the share the headroom leaves (beyond it the plan
    refuses the layout); that share when the GPU's memory is not configured."""
    top = round(1 - headroom, 2)
    if not gpu_memory_gib:
        return top
    return min(top, math.ceil(generator.total_bytes / (gpu_memory_gib * GiB) * 100) / 100)


def check_plan(cfg: Any, headroom: float = DEFAULT_HEADROOM) -> PlanReport:
    """The launcher's gate: returns the report when the layout fits, raises `PlanError` otherwise."""
    report = plan_memory(cfg, headroom)
    if not report.ok:
        raise PlanError("the configured layout does not fit:\n" + report.table(), report)
    return report


def _diagnose(r: PlanReport, arch: ArchConfig, t: TrainerSetup, g: GeneratorSetup, cap: float | None,
              per_host: int | None, available: int | None) -> None:
    for role, tp in (("trainer_tp", t.tp), ("generator_tp", g.tp)):
        if arch.n_heads % tp or (arch.n_kv_heads % tp and tp % arch.n_kv_heads):
            r.problems.append(f"model.parallelism.{role}={tp} does not divide n_heads={arch.n_heads} / "
                              f"n_kv_heads={arch.n_kv_heads}")
        if per_host and tp > per_host:
            r.problems.append(f"model.parallelism.{role}={tp} spans hosts (cluster.gpus_per_host={per_host}); "
                              f"tensor parallelism needs NVLink, keep it within one host")
    if available is not None and r.gpus_needed > available:
        served = (f" + verifiers {'+'.join(str(v.replicas) for v in r.verifiers)}" if r.verifiers else "")
        r.problems.append(f"the layout needs {r.gpus_needed} GPUs (trainer {t.fsdp}x{t.tp} + generators "
                          f"{g.replicas}x{g.tp}{served}) but the cluster has {available} "
                          f"(cluster.hosts x cluster.gpus_per_host)")
        r.fixes.append("raise cluster.hosts, or lower trainer_fsdp / generator_replicas")
        if r.verifiers:
            r.fixes.extend(_verifier_gpu_fixes(r, arch, t, g, cap, available))
    if cap is not None:
        for v in r.verifiers:
            if not v.fits:
                r.problems.append(f"verifier {v.name!r} ({v.checkpoint}) needs {v.bytes_per_gpu / GiB:.1f} GiB per "
                                  f"GPU, {cap / GiB:.1f} GiB usable")
                r.fixes.append(f"(verifier {v.name}) a smaller checkpoint for it, or GPUs with more memory "
                               f"(a verifier replica holds the whole model on one GPU)")
    if cap is None:
        return
    max_gpus = available or 1024
    if not r.trainer.fits:
        r.problems.append(f"trainer needs {r.trainer.total_bytes / GiB:.1f} GiB per GPU, "
                          f"{cap / GiB:.1f} GiB usable")
        r.fixes.extend(_trainer_fixes(arch, t, cap, max_gpus, per_host or 8))
    if not r.generator.fits:
        r.problems.append(f"each generator GPU needs {r.generator.total_bytes / GiB:.1f} GiB, "
                          f"{cap / GiB:.1f} GiB usable")
        r.fixes.extend(_generator_fixes(arch, g, cap, per_host or 8))


def _verifier_gpu_fixes(r: PlanReport, arch: ArchConfig, t: TrainerSetup, g: GeneratorSetup, cap: float | None,
                        available: int) -> list[str]:
    """Ways to make room for the verifiers' GPUs beside the trainer and the generators."""
    fits = lambda reps: cap is None or generator_plan(arch, replace(g, replicas=reps), cap).fits  # noqa: E731
    fewest = next((n for n in range(1, g.replicas + 1) if fits(n)), g.replicas)  # fewest replicas whose KV fits
    reps = (available - t.fsdp * t.tp - r.verifier_gpus) // g.tp
    if fewest <= reps < g.replicas:
        return [f"(verifiers) lower model.parallelism.generator_replicas to {reps}: the {r.verifier_gpus} verifier "
                f"GPU(s) then fit beside the trainer and the generators"]
    room = max(available - t.fsdp * t.tp - fewest * g.tp, 0)
    single = "" if r.reward.startswith("reward=single_rm") else ", or reward=single_rm (one reward model)"
    return [f"(verifiers) serve fewer of them: the {len(r.verifiers)} served take {r.verifier_gpus} GPU(s), and at "
            f"most {room} fit beside the trainer ({t.fsdp * t.tp}) and {fewest} generator replica(s) (the fewest whose "
            f"KV cache fits; model.parallelism.generator_replicas={fewest}): a verifier_set with fewer reward_model / "
            f"lm_judge members or replicas{single}"]


def _trainer_fixes(arch: ArchConfig, t: TrainerSetup, cap: float, max_gpus: int, per_host: int) -> list[str]:
    fits = lambda s: trainer_plan(arch, s, cap).fits  # noqa: E731
    out = []
    if not t.activation_checkpointing and fits(replace(t, activation_checkpointing=True)):
        out.append("enable activation checkpointing: trainer.activation_checkpointing=true")
    f = t.fsdp * 2
    while f <= 1024 and not fits(replace(t, fsdp=f)):
        f *= 2
    if f <= 1024:
        beyond = f" (the trainer alone then needs {f * t.tp} GPUs: raise cluster.hosts)" if f * t.tp > max_gpus else ""
        out.append(f"raise model.parallelism.trainer_fsdp to {f}{beyond}")
    for tp in (2, 4, 8):
        if tp > t.tp and tp <= per_host and arch.n_kv_heads % tp == 0 and t.fsdp * tp <= max_gpus \
                and fits(replace(t, tp=tp)):
            out.append(f"raise model.parallelism.trainer_tp to {tp}")
            break
    mb = t.micro_batch_size // 2
    while mb >= 1 and not fits(replace(t, micro_batch_size=mb)):
        mb //= 2
    if mb >= 1:
        out.append(f"shrink trainer.micro_batch_size to {mb}")
    if not out:
        out.append("no single knob fits: combine a larger trainer_fsdp/trainer_tp with activation checkpointing, "
                   "or shorten algorithm.max_tokens")
    return ["(trainer) " + o for o in out]


def _generator_fixes(arch: ArchConfig, g: GeneratorSetup, cap: float, per_host: int) -> list[str]:
    fits = lambda s: generator_plan(arch, s, cap).fits  # noqa: E731
    out = []
    for tp in (2, 4, 8):
        if g.tp < tp <= per_host and arch.n_heads % tp == 0 and fits(replace(g, tp=tp)):
            out.append(f"raise model.parallelism.generator_tp to {tp}")
            break
    for reps in (2 * g.replicas, 4 * g.replicas, 8 * g.replicas):
        if fits(replace(g, replicas=reps)):
            out.append(f"raise model.parallelism.generator_replicas to {reps} (fewer sequences per replica)")
            break
    if g.seqs_per_step > 1:
        lo, hi = 1, g.seqs_per_step
        if fits(replace(g, seqs_per_step=1)):
            while lo < hi:  # largest batch that fits
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(replace(g, seqs_per_step=mid)) else (lo, mid - 1)
            out.append(f"shrink the step batch (algorithm.prompts_per_step x group_size) to <= {lo} sequences")
    if not out:
        out.append("the weights alone do not fit: raise model.parallelism.generator_tp")
    return ["(generator) " + o for o in out]


def local_gpus() -> tuple[int, float]:
    """GPUs this machine shows torch, and the smallest one's memory in GiB ((0, 0) without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return 0, 0.0
    n = torch.cuda.device_count()
    return n, min(torch.cuda.get_device_properties(i).total_memory for i in range(n)) / GiB


def check_devices(report: PlanReport | None, cluster: Any, have: tuple[int, float] | None = None,
                  argv: list[str] | None = None, needed: int | None = None) -> None:
    """Refuse, before any process starts, a CUDA run whose roles on this machine need GPUs it does
    not have: the plan, what the machine has, and the nearest command that runs here. `needed`: the
    GPUs of the roles this machine (the controller's) hosts (`rlexp.cluster.layout.controller_gpus`:
    every role on a local job, none on a Slurm job whose roles all have hosts of their own, so a
    controller on a login node is not refused); None: the plan's total, on a job kind whose roles
    run here (`local_devices`). `torch.cuda.device_count()` already counts through a scheduler's
    `CUDA_VISIBLE_DEVICES`, which the spawned processes' masks are mapped through
    (`rlexp.core.gpu_mask`). `report` None (the tiny model): GPUs are counted, not their memory."""
    if str(_get(cluster, "device", "cpu")) != "cuda":
        return
    if needed is None:
        here = job_backend(str(_get(cluster, "job", "local"))).local_devices
        needed = (report.gpus_needed if report is not None else 0) if here else 0
    if needed == 0:
        return
    gpus, gib = have if have is not None else local_gpus()
    want_gib = report.gpu_memory_gib if report is not None else None
    if gpus >= needed and (not want_gib or gib >= want_gib * 0.95):
        return
    model = report.model if report is not None else str(_get(cluster, "name", "?"))
    machine = f"{gpus} GPU(s) of {gib:.0f} GiB" if gpus else "no GPU visible to torch (CPU only)"
    table = f"\n{report.table()}" if report is not None else ""
    raise PlanError(f"model={model} needs {needed} GPUs of {want_gib or '?'} GiB on this machine "
                    f"(cluster={_get(cluster, 'name', '?')}); this machine has {machine} "
                    f"(CUDA_VISIBLE_DEVICES="
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}).{table}\n"
                    f"nearest command that runs here: {nearest_command(argv, gpus)}", report)


def nearest_command(argv: list[str] | None, gpus: int) -> str:
    """The command line minus what needs the GPUs: without GPUs, the CPU demo (the tiny model on its own task)
    with the rest of the choices (reward, algorithm, ...); with some, the same run planned for them."""
    import sys

    from rlexp.config.paths import CONF_DIR
    from rlexp.config.suggest import user_args

    args = user_args(sys.argv[1:] if argv is None else argv)  # never rlexp's own `hydra.searchpath`
    args = [a for a in args if a not in ("train", "plan")]
    if gpus == 0:
        drop = ("model", "cluster", "experiment", "environment", "generator", "trainer", "verifier_set")

        # A group option of the user's own (a task in their config_path) is theirs to keep, with its keys.
        mine = {k for k, _, v in (a.partition("=") for a in args) if k.lstrip("+~") in drop and "." not in k
                and not (CONF_DIR / k.lstrip("+~") / f"{v}.yaml").is_file()}
        mine = {k.lstrip("+~") for k in mine}
        keep = [a for a in args if (group := a.split("=", 1)[0].split(".", 1)[0].lstrip("+~")) not in drop
                or group in mine]
        return "rlexp train " + " ".join(keep) if keep else "rlexp train"
    return (f"rlexp plan {' '.join(args)} cluster.gpus_per_host={gpus} (then lower "
            f"model.parallelism.trainer_fsdp / generator_replicas, or a smaller model, until it fits)")
