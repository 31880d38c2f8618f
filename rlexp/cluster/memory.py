"""What each role holds on a GPU, and how long a step takes: the arithmetic of the memory plan.

Why a module of its own: these are numbers from a model's shape and a layout alone (`TrainerSetup`,
`GeneratorSetup`), with no run config in sight; `rlexp.cluster.planner` reads the typed run config
into them, adds the served verifiers and says what to change. Scripts that size a layout by hand
(scripts/gpu_check.py) call these directly.

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
  sampler logits: sequences * vocab * 4 B (fp32), plus the runtime overhead (CUDA graphs,
  activations). vLLM's `gpu_memory_utilization` (`generator.gpu_memory_utilization=0`, the default)
  is this total
    over the GPU's memory (`vllm_memory_utilization`): vLLM then holds what the plan counted, not a
    fixed 0.85.
Time: FLOPs at a stated utilisation, so a person can size a Slurm request. Per step, with N
parameters and
  T = prompts_per_step * group_size * (max_prompt_tokens + max_tokens) tokens (every sequence at
  full length): generation 2 N T over the generator GPUs, training (6 N T, 8 N T with activation
  checkpointing's recomputed forward, + 2 N T for the reference model) over the trainer GPUs, each
  at `cluster.mfu` x `cluster.gpu_peak_tflops`; on-policy the two run one after the other, async
  they overlap. Decoding is memory-bound and usually runs below the training MFU: read the
  generation time as a lower bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
        if not self.rows_per_rank:
            return 1
        return max(1, math.ceil(self.rows_per_rank / self.micro_batch_size))


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
class StepTime:
    """Seconds per step and per run from FLOPs (see the module docstring): a stated estimate, not a
    measurement."""

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
        g = self.seconds(self.gen_flops, self.gen_gpus)
        t = self.seconds(self.train_flops, self.train_gpus)
        return max(g, t) if self.overlap else g + t

    def lines(self) -> list[str]:
        if not self.peak_tflops or self.mfu <= 0:
            return [f"time: unknown (set cluster.gpu_peak_tflops, the GPU's peak bf16 TFLOP/s, and "
                    f"cluster.mfu) for {self.gen_flops / 1e15:.1f} PFLOP of generation + "
                    f"{self.train_flops / 1e15:.1f} PFLOP of training per step"]
        g = self.seconds(self.gen_flops, self.gen_gpus)
        t = self.seconds(self.train_flops, self.train_gpus)
        how = "max of the two (sync=async)" if self.overlap else "their sum (sync=on_policy)"
        run_h = self.step_s * self.steps / 3600
        gen_pf, train_pf = self.gen_flops / 1e15, self.train_flops / 1e15
        return [f"time at MFU {self.mfu:g} of {self.peak_tflops:g} TFLOP/s bf16 per GPU "
                f"(cluster.mfu, cluster.gpu_peak_tflops): generation {gen_pf:.1f} PFLOP / "
                f"{self.gen_gpus} GPU(s) = {g:.1f} s, training {train_pf:.1f} PFLOP / "
                f"{self.train_gpus} GPU(s) = {t:.1f} s",
                f"  ~{self.step_s:.1f} s per step ({how}), ~{run_h:.1f} h for {self.steps} steps, "
                f"plus start-up and evaluation; generation is a lower bound (decoding is "
                f"memory-bound)"]


def step_time(n_params: int, t: TrainerSetup, g: GeneratorSetup, peak_tflops: float, mfu: float,
              steps: int, overlap: bool) -> StepTime:
    tokens = g.seqs_per_step * g.seq_len
    per_token = (8 if t.activation_checkpointing else 6) + (2 if t.reference_model else 0)
    return StepTime(2 * n_params * tokens, per_token * n_params * tokens, g.tp * g.replicas,
                    t.fsdp * t.tp, peak_tflops, mfu, steps, overlap)


def fit_micro_batch(arch: ArchConfig, t: TrainerSetup, cap: float | None) -> int:
    """The largest micro-batch (up to the rows one rank trains per step) whose trainer plan fits; 1
    when none does (the plan then says what else to change)."""
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


def trainer_plan(arch: ArchConfig, s: TrainerSetup,
                 capacity_bytes: float | None = None) -> RolePlan:
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
    # per token per layer: replicated over TP / sharded by it
    whole, split = 4 * arch.dim, e - 4 * arch.dim
    per_layer = f"({whole} + {split} / tp {s.tp})"
    if s.activation_checkpointing:
        act = (arch.n_layers * arch.dim + whole + split / s.tp) * tokens * act_b
        how = (f"({arch.n_layers} x {arch.dim} + {per_layer}) x {tokens} tok x {act_b} B "
               f"(checkpointed)")
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
        items.append(Item("reference model (bf16)", n * 2 / shards,
                          f"{n:,} x 2 B / {shards} (kl_coef > 0)"))
    items.append(Item("runtime overhead", RUNTIME_OVERHEAD_GIB * GiB,
                      "CUDA context, NCCL, fragmentation"))
    accum = f" (x{s.accumulation} accumulated)" if s.accumulation > 1 else ""
    layout = (f"FSDP {s.fsdp} x TP {s.tp}, micro-batch {s.micro_batch_size} x {s.seq_len} "
              f"tokens{accum}, "
              f"activation checkpointing {'on' if s.activation_checkpointing else 'off'}, "
              f"{'fp32 master weights, bf16 compute' if s.mixed_precision else s.dtype}")
    return RolePlan("trainer", shards, layout, items, capacity_bytes)


def generator_plan(arch: ArchConfig, g: GeneratorSetup,
                   capacity_bytes: float | None = None) -> RolePlan:
    n = param_count(arch)
    b = _DTYPE_BYTES[g.dtype]
    seqs = g.seqs_per_replica
    tokens = seqs * g.seq_len
    kv_heads = max(1, arch.n_kv_heads // g.tp)  # vLLM replicates KV heads when TP > n_kv_heads
    items = [
        Item(f"weights ({g.dtype})", n * b / g.tp, f"{n:,} x {b} B / tp {g.tp}"),
        Item("KV cache", 2 * arch.n_layers * kv_heads * arch.head_dim * b * tokens,
             f"2 x {arch.n_layers} x {kv_heads} kv heads x {arch.head_dim} x {b} B x {seqs} seqs x "
             f"{g.seq_len} tok"),
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
