"""One-shot GPU check of rlexp's own trainer and titan generator on one GPU: a Qwen3-0.6B-shaped
random model configured as every Qwen3 preset is (`model.dtype: bfloat16`: fp32 master weights, bf16
compute), a few GRPO steps of sample (titan backend, temperature 1) -> train (the Trainer actor's
`train_step`) -> weight push (cast to the serving dtype, loaded into the generator). Measures what
only a GPU gives: the trainer's allocator peak against `rlexp plan`'s figure, the logprob difference
between the trainer and the generator, steps/s and tokens/s.

Why a script and not tests: a GPU is at hand rarely and briefly (one H100, 78 GiB, a few minutes).
So everything runs in one process, each step guarded so a failure is recorded in the report and the
rest still runs; `--tiny` runs the same code at tiny sizes on CPU, which is what
tests/test_gpu_check.py runs.

The bare GPU image has torch, triton and transformers, not Monarch, Hydra, TorchTitan or vLLM:
`scripts/gpu_check.sh --pack DIR` carries TorchTitan, Hydra and omegaconf (pure Python, a few MiB);
Monarch (a 93 MB wheel) is replaced by `monarch_stand_in` so `rlexp.actors.trainer.Trainer` runs in
this process, called through `rlexp.core.services.Local` as `rlexp.run.inprocess` calls it. The
report says which was used.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import sys
import tempfile
import time
import traceback
import types
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: `python scripts/gpu_check.py`
    sys.path.insert(0, str(ROOT))

from rlexp.cluster.cuda_env import describe, query_cuda  # noqa: E402
from rlexp.cluster.memory import RUNTIME_OVERHEAD_GIB, GiB, TrainerSetup, trainer_plan  # noqa: E402
from rlexp.config.model import ArchConfig, ModelConfig  # noqa: E402
from rlexp.models.catalog import QWEN3_SIZES, param_count  # noqa: E402

PLAN_TOLERANCE = 0.10  # the measured trainer peak must lie within 10% of the plan's figure
# bf16 compute, trainer micro-batches vs the generator's batch: rounding only
LOGPROB_DIFF_BF16 = 0.1


@dataclass(frozen=True)
class Shape:
    """What one check runs: the model, the step's rows and lengths, the trainer's micro-batch."""

    name: str
    arch: ArchConfig
    prompts: int
    group: int
    prompt_len: int
    max_tokens: int
    micro_batch: int
    steps: int

    @property
    def rows(self) -> int:
        return self.prompts * self.group


def full_shape() -> Shape:
    """Qwen3-0.6B on one H100: 64 rows of 128 + 256 tokens, micro-batches of 16 (plan ~25 GiB for
    the trainer)."""
    return Shape(
        "Qwen3-0.6B",
        QWEN3_SIZES["0_6b"].arch(),
        prompts=8,
        group=8,
        prompt_len=128,
        max_tokens=256,
        micro_batch=16,
        steps=4,
    )


def tiny_shape() -> Shape:
    """The same code at a size a CPU runs in seconds (tied embeddings, GQA, as 0.6B). One
    micro-batch holds the step's rows, so the trainer's logprobs are the generator's bit for bit
    (bf16 compute on both sides)."""
    arch = ArchConfig(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        hidden_dim=128,
        vocab_size=512,
        max_seq_len=256,
        rope_theta=1_000_000.0,
        tie_embeddings=True,
    )
    return Shape(
        "tiny (like 0.6B)",
        arch,
        prompts=2,
        group=4,
        prompt_len=8,
        max_tokens=8,
        micro_batch=8,
        steps=3,
    )


def monarch_stand_in() -> str | None:
    """None when Monarch imports; else installs a stand-in for `monarch.actor` (Actor, endpoint,
    current_rank) with which `rlexp.actors.trainer` imports and `rlexp.core.services.Local` calls
    its endpoints in this process (one rank: nothing else of Monarch is used), and says so for the
    report."""
    try:
        import monarch.actor  # noqa: F401
        return None
    except Exception as e:
        why = f"{type(e).__name__}: {e}"

    class Endpoint:
        def __init__(self, fn: Any) -> None:
            self._method = fn

        def __get__(self, obj: Any, owner: Any = None) -> Any:
            return self._method if obj is None else self._method.__get__(obj, owner)

    actor = types.ModuleType("monarch.actor")
    actor.Actor = type("Actor", (), {})  # type: ignore[attr-defined]
    actor.endpoint = Endpoint  # type: ignore[attr-defined]
    actor.current_rank = lambda: types.SimpleNamespace(rank=0)  # type: ignore[attr-defined]
    pkg = types.ModuleType("monarch")
    pkg.actor = actor  # type: ignore[attr-defined]
    sys.modules.update({"monarch": pkg, "monarch.actor": actor})
    return (f"monarch not importable ({why}): a one-rank stand-in for monarch.actor ran the "
            "Trainer in-process")


class IdsOnly:
    """The generator's tokenizer for a random model: ids in, no text out (random weights sample any
    of the 151,936 ids; nothing here reads text). eos is -1 so every row runs to max_tokens, a fixed
    amount of work."""

    eos_id, pad_id = -1, 0

    def decode(self, ids: list[int]) -> str:
        return ""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def plan_gib(shape: Shape) -> float:
    """`rlexp plan`'s trainer figure for this layout, less its fixed runtime overhead (CUDA context,
    NCCL, fragmentation), which `torch.cuda.max_memory_allocated` does not see."""
    setup = TrainerSetup(
        fsdp=1,
        tp=1,
        micro_batch_size=shape.micro_batch,
        seq_len=shape.prompt_len + shape.max_tokens,
        activation_checkpointing=False,
        mixed_precision=True,
        dtype="bfloat16",
    )
    return (trainer_plan(shape.arch, setup).total_bytes - RUNTIME_OVERHEAD_GIB * GiB) / GiB


def build(shape: Shape, device: torch.device, work: Path, seed: int) -> dict[str, Any]:
    """The random checkpoint, rlexp's Trainer (fp32 masters, bf16 compute) and the titan generator
    (bf16)."""
    from rlexp.actors.settings import TrainerSettings
    from rlexp.actors.trainer import Trainer
    from rlexp.config.schema import AlgorithmConfig, TrainerConfig
    from rlexp.core.services import Local
    from rlexp.models.backends import TitanBackend
    from rlexp.models.parallel import PolicySettings, Ranks
    from rlexp.models.tiny import write_tiny_checkpoint

    cfg = ModelConfig(name=shape.name, dtype="bfloat16", arch=shape.arch, init_seed=seed)
    t0 = time.perf_counter()
    model_dir = str(write_tiny_checkpoint(cfg, work / "model"))
    algo = AlgorithmConfig(
        group_size=shape.group,
        prompts_per_step=shape.prompts,
        max_tokens=shape.max_tokens,
        max_prompt_tokens=shape.prompt_len,
        temperature=1.0,
        kl_coef=0.0,
    )
    settings = TrainerSettings(
        PolicySettings(cfg, model_dir, 0, Ranks(device=device.type)),
        TrainerConfig(lr=1e-6, micro_batch_size=shape.micro_batch),
        algo,
        shape.steps,
        seed,
    )
    t1 = time.perf_counter()
    trainer = Local(Trainer, settings, transports=[])
    trainer.setup.call_one().get()
    sync(device)
    t2 = time.perf_counter()
    before = allocated(device)
    backend = TitanBackend(  # type: ignore[arg-type]
        cfg, model_dir, IdsOnly(), device=str(device), ignore_eos=True
    )
    sync(device)
    return {
        "cfg": cfg,
        "algo": algo,
        "trainer": trainer,
        "backend": backend,
        "gen_bytes": allocated(device) - before,
        "checkpoint_s": t1 - t0,
        "trainer_setup_s": t2 - t1,
        "generator_setup_s": time.perf_counter() - t2,
    }


def one_step(
    parts: dict[str, Any], shape: Shape, device: torch.device, version: int, rng: random.Random
) -> dict[str, Any]:
    """Sample, train, push: one GRPO step as the loop runs it (advantages drawn at random: the
    weights are)."""
    from rlexp.types import TrainBatch

    trainer, backend = parts["trainer"], parts["backend"]
    vocab = shape.arch.vocab_size
    prompts = [
        [rng.randrange(1, vocab) for _ in range(shape.prompt_len)] for _ in range(shape.prompts)
    ]
    sync(device)
    t0 = time.perf_counter()
    done = backend.generate(prompts, shape.group, shape.max_tokens, 1.0, seed=version)
    sync(device)
    t1 = time.perf_counter()
    batch = TrainBatch(
        [c.prompt_ids for c in done],
        [c.token_ids for c in done],
        [c.logprobs for c in done],
        [rng.gauss(0.0, 1.0) for _ in done],
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    m = trainer.train_step.call_one(batch).get()
    sync(device)
    t2 = time.perf_counter()
    peak = (
        (torch.cuda.max_memory_allocated(device) - parts["gen_bytes"]) / GiB
        if device.type == "cuda"
        else None
    )
    sd = push_state(trainer.obj)
    backend.load_state_dict(version, sd, "gpu_check")
    sync(device)
    t3 = time.perf_counter()
    new = sum(len(c.token_ids) for c in done)
    return {
        "version": version,
        "gen_s": t1 - t0,
        "gen_tokens": new,
        "train_s": t2 - t1,
        "train_tokens": sum(len(c.prompt_ids) + len(c.token_ids) for c in done),
        "push_s": t3 - t2,
        "push_dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in sd.values()}),
        "loss": m["loss"],
        "grad_norm": m["train/grad_norm"],
        "logprob_diff_max": m["logprob_diff/max"],
        "logprob_diff_mean": m["logprob_diff/mean"],
        "peak_gib": peak,
    }


def push_state(trainer: Any) -> dict[str, torch.Tensor]:
    """What `Trainer.push_weights` publishes on one rank (HF naming, cast to the serving dtype),
    without a transport: the generator here lives in the same process."""
    from rlexp.models.titan import hf_state_dict

    return {
        k: v.to(trainer.serving_dtype)
        for k, v in hf_state_dict(trainer.model, trainer.model_cfg.arch).items()
    }


def run(shape: Shape, device: torch.device, seed: int) -> dict[str, Any]:
    """Every measurement, each failure recorded (with its traceback's last lines) instead of
    stopping the rest."""
    out: dict[str, Any] = {
        "shape": asdict(shape) | {"arch": asdict(shape.arch)},
        "params": param_count(shape.arch),
        "plan_gib": plan_gib(shape),
        "steps": [],
        "errors": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        try:
            parts = build(shape, device, Path(work), seed)
        except Exception:
            out["errors"].append("build: " + traceback.format_exc(limit=-6))
            return out
        out.update({k: parts[k] for k in ("checkpoint_s", "trainer_setup_s", "generator_setup_s")})
        model = parts["trainer"].obj.model
        out["master_dtypes"] = sorted(
            {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
        )
        from rlexp.models.backends import sampling_generator

        out["sampler_device"] = str(sampling_generator(parts["backend"].device, 0).device)
        out["generator_device"] = str(next(parts["backend"].model.parameters()).device)
        first = {n: p.detach().clone() for n, p in model.named_parameters()}
        rng = random.Random(seed)
        for version in range(1, shape.steps + 1):
            try:
                out["steps"].append(one_step(parts, shape, device, version, rng))
            except Exception:
                out["errors"].append(f"step {version}: " + traceback.format_exc(limit=-6))
                break
            # lr 1e-6 from fp32 masters: nearly every weight moves (bf16 weights: 2% did)
            if version == 1:
                moved = sum(
                    int((p.detach() != first[n]).sum()) for n, p in model.named_parameters()
                )
                out["moved_fraction"] = moved / sum(p.numel() for p in model.parameters())
                del first
    return out


def fmt(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "n/a"
    return format(x, spec) if isinstance(x, float) else str(x)


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """Speed over the steps after the first (the first pays allocator and kernel warm-up)."""
    steps = r["steps"][1:] or r["steps"]
    if not steps:
        return {}
    train_s, gen_s = sum(s["train_s"] for s in steps), sum(s["gen_s"] for s in steps)
    whole = sum(s["gen_s"] + s["train_s"] + s["push_s"] for s in steps)
    peaks = [s["peak_gib"] for s in r["steps"] if s["peak_gib"] is not None]
    return {
        "steps_per_s": len(steps) / whole,
        "train_tokens_per_s": sum(s["train_tokens"] for s in steps) / train_s,
        "gen_tokens_per_s": sum(s["gen_tokens"] for s in steps) / gen_s,
        "peak_gib": max(peaks) if peaks else None,
        "logprob_diff_max": max(s["logprob_diff_max"] for s in r["steps"]),
    }


def checks(r: dict[str, Any], device: torch.device) -> list[tuple[str, str, str, str]]:
    """(check, measured, expected, verdict) rows; a verdict of "no" is a finding to act on."""
    s = summary(r)
    yes = lambda ok: "yes" if ok else "NO"  # noqa: E731
    rows = [
        (
            "trainer master weights",
            ",".join(r.get("master_dtypes", [])) or "n/a",
            "float32",
            yes(r.get("master_dtypes") == ["float32"]),
        ),
        (
            "weights pushed to the generator",
            ",".join(r["steps"][0]["push_dtypes"]) if r["steps"] else "n/a",
            "bfloat16",
            yes(bool(r["steps"]) and r["steps"][0]["push_dtypes"] == ["bfloat16"]),
        ),
        (
            "sampler generator on the probabilities' device",
            r.get("sampler_device", "n/a"),
            r.get("generator_device", "n/a"),
            yes(r.get("sampler_device") == r.get("generator_device") is not None),
        ),
        (
            "weights moved by one AdamW step at lr 1e-6",
            fmt(r.get("moved_fraction")),
            "> 0.9",
            yes((r.get("moved_fraction") or 0) > 0.9),
        ),
    ]
    peak = s.get("peak_gib")
    ratio = peak / r["plan_gib"] if peak else None
    rows.append(
        (
            "trainer peak memory, GiB (measured / plan)",
            f"{fmt(peak)} / {fmt(r['plan_gib'])}",
            f"ratio within 1 +- {PLAN_TOLERANCE}",
            "n/a (no allocator peak on CPU)"
            if device.type != "cuda" or ratio is None
            else f"{yes(abs(ratio - 1) <= PLAN_TOLERANCE)} (ratio {ratio:.3f})",
        )
    )
    diff = s.get("logprob_diff_max")
    rows.append(
        (
            "logprob_diff/max, trainer vs generator",
            fmt(diff),
            f"< {LOGPROB_DIFF_BF16} (bf16 rounding)",
            yes(diff is not None and diff < LOGPROB_DIFF_BF16),
        )
    )
    return rows


def report(r: dict[str, Any], meta: dict[str, Any], device: torch.device) -> str:
    lines = [
        f"# GPU check: {meta['device_name']}",
        "",
        *(f"- {k}: {v}" for k, v in meta["lines"].items()),
        "",
        f"Model: {r['shape']['name']}-shaped random weights, {r['params']:,} parameters, "
        f"`model.dtype: bfloat16` (fp32 master weights, bf16 compute); {r['shape']['prompts']} "
        f"prompts x {r['shape']['group']} samples of {r['shape']['prompt_len']} "
        f"+ {r['shape']['max_tokens']} tokens per step, trainer "
        f"micro-batch {r['shape']['micro_batch']}, lr 1e-6, temperature 1.",
        "",
        "## Checks",
        "",
        "| check | measured | expected | ok |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in checks(r, device)]
    lines += [
        "",
        "## Steps",
        "",
        "| step | generate s | generated tokens/s | train s | trained tokens/s | push s "
        "| loss | grad norm | logprob_diff/max | logprob_diff/mean | trainer peak GiB |",
        "|" + "---|" * 11,
    ]
    for s in r["steps"]:
        lines.append(
            f"| {s['version']} | {s['gen_s']:.3f} | {s['gen_tokens'] / s['gen_s']:.1f} "
            f"| {s['train_s']:.3f} | {s['train_tokens'] / s['train_s']:.1f} | {s['push_s']:.3f} "
            f"| {s['loss']:.4g} | {s['grad_norm']:.4g} | {s['logprob_diff_max']:.3g} "
            f"| {s['logprob_diff_mean']:.3g} | {fmt(s['peak_gib'])} |"
        )
    sm = summary(r)
    lines += [
        "",
        "## Summary",
        "",
        "| steps/s | trained tokens/s | generated tokens/s | set-up s (checkpoint, "
        "trainer, generator) |",
        "|---|---|---|---|",
        f"| {fmt(sm.get('steps_per_s'))} | {fmt(sm.get('train_tokens_per_s'))} "
        f"| {fmt(sm.get('gen_tokens_per_s'))} | "
        f"{fmt(r.get('checkpoint_s'))}, "
        f"{fmt(r.get('trainer_setup_s'))}, {fmt(r.get('generator_setup_s'))} |",
        "",
        "## Errors",
        "",
    ]
    lines += [f"```\n{e.strip()}\n```" for e in r["errors"]] or ["none"]
    return "\n".join(lines) + "\n"


def device_slug(device: torch.device) -> str:
    """`results/gpu_<slug>.md`: the GPU's model ("NVIDIA H100 80GB HBM3" -> h100), or cpu."""
    if device.type != "cuda":
        return "cpu"
    words = torch.cuda.get_device_name(device).lower().replace("nvidia", "").split()
    return words[0] if words else "cuda"


def run_meta(
    args: argparse.Namespace, device: torch.device, stand_in: str | None
) -> dict[str, Any]:
    import transformers

    try:
        import torchtitan
        titan = getattr(torchtitan, "__version__", "importable")
    except Exception as e:
        titan = f"not importable ({e})"
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or '?'})"
    )
    lines = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"`{args.command}`",
        "machine": "; ".join(describe(query_cuda())),
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "torchtitan": titan,
        "trainer": stand_in
        or "rlexp.actors.trainer.Trainer via rlexp.core.services.Local (Monarch installed)",
    }
    if args.tiny:
        lines["mode"] = "CPU tiny sizes (--tiny): the code paths of the GPU run, not its figures"
    return {"device_name": name, "lines": lines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU test's mode)")
    ap.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda when available, else cpu)"
    )
    ap.add_argument(
        "--out",
        default=None,
        help="markdown report (default: results/gpu_<device>.md), JSON beside it",
    )
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: 4 full, 3 tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--command",
        default=None,
        help="the command line to print in the report (the .sh passes its own)",
    )
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_check: --device cuda, but torch sees no GPU (`rlexp doctor` says why)"
        )
    if device.type == "cpu" and not args.tiny:
        raise SystemExit("gpu_check: full sizes on CPU would take hours; use --tiny on CPU")
    if args.steps is not None and args.steps < 2:
        raise SystemExit(
            "gpu_check: --steps must be >= 2 (the first step is warm-up, left out of the speed)"
        )
    shape = tiny_shape() if args.tiny else full_shape()
    if args.steps:
        shape = Shape(**{**asdict(shape), "arch": shape.arch, "steps": args.steps})
    args.command = args.command or "python " + " ".join(
        shlex.quote(a) for a in [sys.argv[0], *(argv or [])]
    )
    out = Path(args.out or ROOT / "results" / f"gpu_{device_slug(device)}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    stand_in = monarch_stand_in()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    r = run(shape, device, args.seed)
    meta = run_meta(args, device, stand_in)
    out.write_text(report(r, meta, device))
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "result": r, "summary": summary(r)}, indent=1)
    )
    print(out.read_text())
    return 1 if r["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
