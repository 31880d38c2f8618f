"""The trainer actor: AdamW, LR schedule, the GRPO loss, checkpoints, weight pushes around one policy copy.

One rank (the default) is a plain module in one process, no process group. With
`trainer_fsdp * trainer_tp > 1` the launcher spawns one Trainer per rank on a proc mesh; every
endpoint is then collective (`rlexp.core.services.Collective` calls it on the whole mesh and keeps rank 0's answer).
How each rank builds and shards its copy (TP + FSDP2, TorchTitan's way) is `rlexp.models.parallel`.
The ranks of one TP group train on the same rows; the
fsdp ranks split every batch into contiguous slices. Losses are weighted by each micro-batch's share
of the *global* batch and FSDP's gradient division is off, so the reduced gradient is the single-rank
gradient (up to summation order). Checkpoints are gathered to rank 0 in the single-rank file format,
so any layout resumes any other.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from monarch.actor import Actor, current_rank, endpoint

from rlexp.actors.settings import PolicySettings, TrainerSettings
from rlexp.algorithm.grpo import LOSSES, policy_token_mask
from rlexp.core.gpu_mask import check_mask
from rlexp.core.plugins import activate_from_env
from rlexp.core.seeding import apply_process_determinism
from rlexp.core.weights import safe_load
from rlexp.models.hf import save_titan_as_hf, titan_full_hf_state_dict
from rlexp.models.parallel import build_policy, claim_device, full_tensor, loss_parallel_if
from rlexp.models.policy import pad_rows, sequence_logprobs
from rlexp.models.titan import hf_state_dict, torch_dtype
from rlexp.transport import TransportSpec, WeightTransport, build_publisher
from rlexp.types import TrainBatch


def _local(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's part of each tensor (a sharded parameter's local shard), detached: the weight average is
    elementwise, so each rank keeps and updates its own shards (DTensor has no sharding rule for foreach ops)."""
    return [t.detach().to_local() if hasattr(t, "to_local") else t.detach() for t in tensors]


def rank_device(ranks: Any, rank: int) -> torch.device:
    """This rank's device. On CUDA its GPU was masked when its process was spawned
    (`rlexp.core.gpu_mask`, through a scheduler's mask), so CUDA shows it alone: checked here, and
    the mask is not set again (`gpus` None)."""
    if ranks.device == "cuda" and ranks.gpus:
        check_mask(ranks.gpus[rank])
    return claim_device(ranks.device, None, rank)


def lr_lambda(schedule: str, warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - (1.0 - min_ratio) * frac
        if schedule == "cosine":
            return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac))
        raise ValueError(f"trainer.lr_schedule={schedule!r} is not one of constant, linear, cosine")

    return f


def _reshard(model: torch.nn.Module) -> None:
    """Free the all-gathered weights FSDP2 keeps after a forward (the root module keeps its own
    for the backward it expects), so the next forward gathers the shards anew: after a forward
    with other weights swapped in, the cached copy would be those (2 ranks drifted 3e-3 from 1)."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


class Trainer(Actor):
    def __init__(self, settings: TrainerSettings, *, transports: Sequence[TransportSpec]) -> None:
        """`transports`: every weight transport the generators need (resolved per pair by the launcher); a
        version is published to each."""
        activate_from_env()  # the user's plug-ins, before any name in the config is looked up
        apply_process_determinism()
        self.settings = settings
        policy, ranks = settings.policy, settings.policy.ranks
        self.model_cfg, self.model_dir = policy.model, policy.model_dir
        self.tcfg, self.acfg = settings.trainer, settings.algorithm
        self.loss_fn = LOSSES.get(str(self.acfg.loss))()  # checked in prepare; a plug-in's class needs its module here
        self.total_steps, self.seed, self.pad_id = settings.total_steps, settings.seed, policy.pad_id
        self.transport_specs = list({s.name: s for s in transports}.values())
        self.world = ranks.world
        self.rank = current_rank().rank if ranks.world > 1 else 0
        if ranks.world % ranks.tp:
            raise ValueError(f"trainer: world size {ranks.world} is not a multiple of trainer_tp={ranks.tp}")
        self.tp = ranks.tp
        # Data-parallel coordinates: the ranks of one TP group (consecutive ranks) share their rows.
        self.dp_rank, self.dp_world = self.rank // ranks.tp, ranks.world // ranks.tp
        self.dp_group: Any = None
        self.device = rank_device(ranks, self.rank)
        self.transports: dict[str, WeightTransport] = {}
        if ranks.threads:
            torch.set_num_threads(ranks.threads)

    @endpoint
    async def setup(self) -> int:
        torch.manual_seed(self.seed)  # nothing random today, but any future dropout/init draws from here
        t = self.tcfg
        self.model, dims = build_policy(self.settings.policy, self.rank, self.device, train=True)
        self.model.train()
        if self.tcfg.freeze_pad_row:  # one rank (rlexp/config/validate.py); the lookup's gradient only, as in HF
            self.model.tok_embeddings.padding_idx = self.pad_id
        if dims is not None:
            self.dp_group = dims.get_mesh("fsdp").get_group()
        # fp32 master weights always (rlexp/models/parallel.py); what the generators hold is `model.dtype`, and the
        # weights pushed to them and exported are cast to it. A bf16 model already computes in bf16 (`compute_in`);
        # an fp32 one under unsharded mixed precision gets bf16 autocast around the forward (fp32 log-softmax).
        self.serving_dtype = torch_dtype(self.model_cfg.dtype)
        self.autocast = torch.bfloat16 if t.mixed_precision and self.world == 1 \
            and self.serving_dtype == torch.float32 else None
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=tuple(t.betas),
                                       weight_decay=t.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.optim, lr_lambda(t.lr_schedule, t.warmup_steps, self.total_steps, t.min_lr_ratio))
        if self.rank == 0:
            for spec in self.transport_specs:
                self.transports[spec.name] = build_publisher(spec, keep=4)
                await self.transports[spec.name].astart()
        self.version = 0
        # The weight average (trainer.ema_decay): fp32 copies of this rank's parameters (shards when sharded). fp32
        # whatever the model's dtype: at decay 0.99 a step moves it by 1% of the gap, below bf16's rounding.
        self.ema: list[torch.Tensor] | None = [p.detach().to(torch.float32, copy=True)
                                               for p in self.model.parameters()] if t.ema_decay > 0 else None
        # The step-0 weights, for `policy/kl_to_start` when no reference model brings its logprobs.
        keep_start = t.kl_to_start_every > 0 and self.acfg.kl_coef <= 0
        self.start: list[torch.Tensor] | None = \
            [p.detach().clone() for p in self.model.parameters()] if keep_start else None
        return sum(p.numel() for p in self.model.parameters())

    @contextmanager
    def _weights(self, ema: bool, other: list[torch.Tensor] | None = None) -> Iterator[None]:
        """The model holds the weight average inside (when asked for and kept), or `other` (the
        step-0 weights), the live weights again after."""
        inside = other if other is not None else self.ema if ema else None
        if inside is None:
            yield
            return
        params = _local(self.model.parameters())  # copied in place: FSDP keeps its own views of them
        with torch.no_grad():
            live = [p.clone() for p in params]
            for p, e in zip(params, _local(inside)):
                p.copy_(e)  # cast to the model's dtype
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(params, live)

    @endpoint
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on `batch`. Sharded: every rank gets the whole batch and trains on rows
        [d*n/D, (d+1)*n/D) of it, d its data-parallel rank among D (TP peers share rows); all ranks run
        the same number of micro-batches (a rank that has run out of rows runs a zero-weight one, so the
        collectives stay matched). Under TP, forward and backward run in `loss_parallel`, which lets the
        logprobs be computed from vocabulary-sharded logits."""
        t0 = time.perf_counter()
        a = self.acfg
        n = len(batch.prompts)
        mb = max(1, min(self.tcfg.micro_batch_size, n))
        lo, hi = self.dp_rank * n // self.dp_world, (self.dp_rank + 1) * n // self.dp_world
        n_micro = math.ceil(math.ceil(n / self.dp_world) / mb)
        # (start, end) rows of each micro-batch; a rank out of rows runs a zero-weight one on row 0.
        spans = [(s, min(hi, s + mb)) if s < min(hi, s + mb) else (0, 1)
                 for s in (lo + i * mb for i in range(n_micro))]
        starts = self._start_logprobs(batch, spans)  # before any gradient: the weights swap freely
        self.optim.zero_grad(set_to_none=True)
        # Multi-turn rows train on the policy's tokens only: environment tokens are context, not actions.
        total_tokens = sum(len(r) for r in batch.responses) if batch.loss_masks is None \
            else sum(sum(m) for m in batch.loss_masks)
        metrics: dict[str, float] = {}
        diffs: list[torch.Tensor] = []
        rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        for i in range(n_micro):
            s = lo + i * mb
            e = min(hi, s + mb)
            dummy = s >= e
            if dummy:
                s, e = 0, 1
            with loss_parallel_if(self.tp):
                logp, mask = sequence_logprobs(self.model, batch.prompts[s:e], batch.responses[s:e],
                                               a.temperature, self.pad_id, self.device, self.autocast)
                width = logp.shape[1]
                if batch.loss_masks is not None:
                    policy = pad_rows(batch.loss_masks[s:e], 0, torch.float32, width)
                    mask = policy_token_mask(mask, policy.to(mask.device))
                old = pad_rows(batch.old_logprobs[s:e], 0.0, torch.float32, width).to(logp.device)
                ref = pad_rows(batch.ref_logprobs[s:e], 0.0, torch.float32, width).to(logp.device) \
                    if batch.ref_logprobs else None
                out = self.loss_fn(logp, old, torch.tensor(batch.advantages[s:e]).to(logp.device), mask, ref, a)
                # Weight each micro-batch by its share of the global batch, so accumulation (and the sum
                # over data-parallel ranks) equals one big batch.
                share = (mask.sum().item() / max(1, total_tokens)) if a.loss_agg == "token_mean" else (e - s) / n
                if dummy:
                    share = 0.0
                (out.loss * share).backward()
            for k, v in out.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v * share
            rows.append((logp.detach(), mask * (0.0 if dummy else 1.0), ref))
            if not dummy:
                diffs.append(((logp.detach() - old).abs() * mask).flatten()[mask.flatten() > 0].cpu())
        metrics.update(self._drift(rows, starts, total_tokens))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tcfg.grad_clip)
        self.optim.step()
        self.sched.step()
        if self.ema is not None:
            with torch.no_grad():
                live = [p.float() for p in _local(self.model.parameters())]  # a copy only where not fp32
                torch._foreach_lerp_(_local(self.ema), live, 1.0 - self.tcfg.ema_decay)
        d = torch.cat(diffs) if diffs else torch.zeros(0)
        d_max, d_sum, d_n = (float(d.max()) if d.numel() else 0.0), float(d.sum()), float(d.numel())
        if self.world > 1:
            metrics, d_max, d_sum, d_n = self._all_reduce_metrics(metrics, d_max, d_sum, d_n)
        metrics.update({
            "loss": metrics.get("loss/policy", 0.0),
            "train/grad_norm": float(full_tensor(grad_norm)),
            "train/lr": float(self.sched.get_last_lr()[0]),
            # generator vs trainer logprobs on the sampled tokens, before this update
            "logprob_diff/max": d_max,
            "logprob_diff/mean": (float(d.mean()) if d.numel() else 0.0) if self.world == 1 else d_sum / max(1.0, d_n),
            "time/train_step_s": time.perf_counter() - t0,
        })
        return metrics

    def _start_logprobs(self, batch: TrainBatch, spans: list[tuple[int, int]]
                        ) -> list[torch.Tensor] | None:
        """The step-0 policy's logprobs of each micro-batch's tokens, on the steps
        `policy/kl_to_start` is estimated (every `trainer.kl_to_start_every`) when no reference
        model brings them: the step-0 weights are swapped in for one forward without gradient.
        Every micro-batch, a zero-weight one too, so sharded ranks run the same collectives."""
        every = self.tcfg.kl_to_start_every
        if self.start is None or every <= 0 or self.sched.last_epoch % every:
            return None
        with torch.no_grad(), self._weights(False, self.start), loss_parallel_if(self.tp):
            a = self.acfg
            out = [sequence_logprobs(self.model, batch.prompts[s:e], batch.responses[s:e],
                                     a.temperature, self.pad_id, self.device, self.autocast)[0]
                   for s, e in spans]
            _reshard(self.model)
        return out

    def _drift(self, rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
               starts: list[torch.Tensor] | None, total_tokens: int) -> dict[str, float]:
        """How far the policy has moved, on this step's sampled tokens (before its update), as
        token means over the whole batch (summed over data-parallel ranks like the loss metrics).
        `rows`: each micro-batch's (logprobs, mask, reference logprobs or None).

        - `policy/entropy`: minus the mean logprob of the sampled tokens at the sampling
          temperature, a Monte-Carlo estimate of the per-token entropy of what the policy
          samples; it falls towards 0 as a policy collapses onto one answer. Free: the loss
          already computed these logprobs.
        - `policy/kl_to_start`: KL(current || step-0 policy), the k3 estimator on the sampled
          tokens, from the reference model's logprobs when there is one (`algorithm.kl_coef > 0`:
          free), else from `starts` (`_start_logprobs`: one more copy of this rank's weights in
          memory, and about a third of a train step's compute on the steps it is estimated)."""
        ent = sum(float(-(lp * m).sum()) for lp, m, _ in rows)
        out = {"policy/entropy": ent / max(1, total_tokens)}
        refs = starts if starts is not None else [ref for *_, ref in rows]
        if any(r is None for r in refs) or self.tcfg.kl_to_start_every <= 0:
            return out
        kl = 0.0
        for (lp, m, _), st in zip(rows, refs):
            delta = (st.to(lp.device) - lp) * m
            kl += float(((torch.exp(delta) - delta - 1.0) * m).sum())
        out["policy/kl_to_start"] = kl / max(1, total_tokens)
        return out

    def _all_reduce_metrics(self, metrics: dict[str, float], d_max: float, d_sum: float, d_n: float
                            ) -> tuple[dict[str, float], float, float, float]:
        """Share-weighted metric sums and logprob-diff sums/counts are summed over data-parallel ranks
        (TP peers computed the same rows); the max is maxed."""
        import torch.distributed as dist

        keys = sorted(metrics)  # every rank ran >= 1 micro-batch, so every rank has the same keys
        dev = self.device if self.device.type == "cuda" else torch.device("cpu")
        sums = torch.tensor([metrics[k] for k in keys] + [d_sum, d_n], dtype=torch.float64, device=dev)
        mx = torch.tensor([d_max], dtype=torch.float64, device=dev)
        dist.all_reduce(sums, group=self.dp_group)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=self.dp_group)
        vals = sums.tolist()
        return dict(zip(keys, vals[:-2])), float(mx.item()), vals[-2], vals[-1]

    @endpoint
    async def push_weights(self, version: int, ema: bool = False) -> dict[str, str]:
        """Publish the current weights (HF naming) as `version`, once per transport the generators need;
        returns {transport: location} (rank 0's answer; every rank takes part in the all-gather when
        sharded). Each generator picks its own transport's location. `ema`: the weight average instead, for
        evaluating it (the controller publishes the live weights again afterwards, under the same version)."""
        self.version = version
        with self._weights(ema):  # published inside: on one rank the state dict views the parameters' storage
            # Streamed: one tensor at a time to the CPU (what `rlexp plan` counts as the weight
            # push); the ranks that publish nothing take part in each gather and keep nothing.
            sd = ({k: v.to(self.serving_dtype) for k, v in hf_state_dict(self.model, self.model_cfg.arch).items()}
                  if self.world == 1 else titan_full_hf_state_dict(self.model, self.model_cfg, self.serving_dtype,
                                                                   keep=self.rank == 0))
            if self.rank != 0:
                return {}
            return {name: await t.apublish(version, sd) for name, t in self.transports.items()}

    def _full_state(self) -> dict[str, Any]:
        """Model and optimizer state as full CPU tensors (the single-rank file format). Collective."""
        model: dict[str, torch.Tensor] = {}
        gathered: dict[int, torch.Tensor] = {}  # tied embeddings: gather the shared parameter once
        for k, v in self.model.state_dict().items():
            if id(v) not in gathered:
                gathered[id(v)] = full_tensor(v)
            model[k] = gathered[id(v)]
        osd = self.optim.state_dict()
        osd["state"] = {i: {k: full_tensor(v) for k, v in st.items()} for i, st in osd["state"].items()}
        out: dict[str, Any] = {"model": model, "optim": osd}
        if self.ema is not None:
            out["ema"] = [full_tensor(e) for e in self.ema]
        return out

    @endpoint
    async def save(self, path: str) -> None:
        state = {"model": self.model.state_dict(), "optim": self.optim.state_dict()} if self.world == 1 \
            else self._full_state()
        if self.world == 1 and self.ema is not None:
            state["ema"] = self.ema
        if self.rank != 0:
            return
        tmp = Path(path + ".tmp")
        try:  # our own file object: closed (its space freed) at once when a full disk stops the write
            with open(tmp, "wb") as f:
                torch.save({**state, "sched": self.sched.state_dict(), "version": self.version}, f)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @endpoint
    async def load(self, path: str) -> int:
        """Load a trainer checkpoint (written by any number of ranks). Sharded: every rank reads the file
        and keeps its shard (`src_data_rank=None`: nothing is broadcast), like the HF load."""
        state = safe_load(Path(path))
        if self.world == 1:
            self.model.load_state_dict(state["model"])
            self.optim.load_state_dict(state["optim"])
        else:
            from torch.distributed.tensor import DTensor, distribute_tensor

            def shard(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
                if isinstance(like, DTensor):
                    return distribute_tensor(v.to(like.dtype), like.device_mesh, like.placements, src_data_rank=None)
                return v.to(device=like.device, dtype=like.dtype)

            current = self.model.state_dict()
            self.model.load_state_dict({k: shard(v, current[k]) for k, v in state["model"].items()})
            params = [p for g in self.optim.param_groups for p in g["params"]]  # state_dict's index order
            osd = state["optim"]
            osd["state"] = {i: {k: (shard(v, params[i]) if k != "step" and isinstance(params[i], DTensor) else v)
                                for k, v in st.items()} for i, st in osd["state"].items()}
            self.optim.load_state_dict(osd)
        if self.ema is not None:
            if "ema" not in state:
                raise ValueError(f"{path} holds no weight average, but trainer.ema_decay={self.tcfg.ema_decay}: resume "
                                 f"with the setting the run was started with (trainer.ema_decay=0)")
            # Placed like the fresh average (fp32, this rank's device and shards): the file holds full CPU tensors.
            self.ema = [shard(v, e) if self.world > 1 else v.to(device=e.device, dtype=torch.float32)
                        for v, e in zip(state["ema"], self.ema)]
        self.sched.load_state_dict(state["sched"])
        self.version = int(state["version"])
        return self.version

    @endpoint
    async def export_hf(self, out_dir: str) -> str:
        """Final checkpoint as an HF folder (what `rlexp eval run_dir=...` and vLLM load); rank 0 writes."""
        with self._weights(ema=True):  # the run's product is the weight average, when one is kept
            if self.rank == 0:
                save_titan_as_hf(self.model, out_dir, self.model_cfg, dtype=self.serving_dtype,
                                 source_dir=self.model_dir)
            else:
                # the gathers rank 0 runs
                titan_full_hf_state_dict(self.model, self.model_cfg, keep=False)
        return out_dir

    @endpoint
    async def full_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights, gathered, in HF naming (tests and tools; collective when sharded)."""
        return titan_full_hf_state_dict(self.model, self.model_cfg)

    @endpoint
    async def layout(self) -> dict[str, Any]:
        """How parameters and logits are placed on this rank's mesh (diagnostics and tests)."""
        place = lambda t: [str(p) for p in t.placements] if hasattr(t, "placements") else []  # noqa: E731
        with torch.no_grad(), loss_parallel_if(self.tp):
            logits = self.model(torch.zeros(1, 2, dtype=torch.long, device=self.device))
        return {"params": {n: place(p) for n, p in self.model.named_parameters()}, "logits": place(logits)}

    @endpoint
    async def shutdown(self) -> None:
        for t in self.transports.values():
            t.close()
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


class Reference(Actor):
    """Frozen copy of the initial policy; only spawned when `algorithm.kl_coef > 0`.

    It lives on the trainer's processes and is sharded the same way (what `rlexp plan` counts: its
    weights share the trainer's GPUs), so a reference for an 8B model is neither a ninth GPU nor a CPU
    copy. Its endpoints are collective when the trainer has several ranks.
    """

    def __init__(self, settings: PolicySettings) -> None:
        apply_process_determinism()
        ranks = settings.ranks
        if ranks.threads:
            torch.set_num_threads(ranks.threads)
        self.settings = settings
        self.rank = current_rank().rank if ranks.world > 1 else 0
        self.device = rank_device(ranks, self.rank)
        self.pad_id, self.tp = settings.pad_id, ranks.tp

    @endpoint
    async def setup(self) -> None:
        self.model, _ = build_policy(self.settings, self.rank, self.device)
        self.model.eval()

    @endpoint
    async def logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                       temperature: float) -> list[list[float]]:
        with torch.no_grad(), loss_parallel_if(self.tp):
            logp, mask = sequence_logprobs(self.model, prompts, responses, temperature, self.pad_id, self.device)
        return [row[: int(m.sum())].tolist() for row, m in zip(logp.cpu(), mask.cpu())]
