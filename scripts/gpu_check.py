"""One-shot GPU check: trainer step memory against the planner, TorchTitan/transformers bf16 logit parity,
and titan KV-cache sampling speed against `transformers.generate`, for randomly initialised Qwen3 sizes.

Why a script and not tests: these are the figures that only a GPU gives (allocator peak, bf16 kernels,
decode throughput), and a GPU is at hand rarely and briefly. So everything runs in one process, in one
go, each section guarded so one failure is recorded as a row and the rest still runs; `--tiny` runs the
same code paths at tiny sizes on CPU, which is what the test suite runs.

Needs torch and transformers. TorchTitan (what `rlexp.models.titan` builds on) is optional: without it the
trainer-step rows run on transformers' Qwen3 and the titan rows say why they were skipped.
`scripts/gpu_check.sh` is the entry point (it finds a carried TorchTitan first).
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import shlex
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: `python scripts/gpu_check.py`
    sys.path.insert(0, str(ROOT))

from rlexp.cluster.planner import RUNTIME_OVERHEAD_GIB, GiB, TrainerSetup, trainer_plan  # noqa: E402
from rlexp.config.model import ArchConfig, ModelConfig  # noqa: E402
from rlexp.models.catalog import QWEN3_SIZES, param_count  # noqa: E402


def require_transformers() -> Any:
    try:
        import transformers
        from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"gpu_check: transformers with Qwen3 support is required ({e}); install it "
                         "(or carry its wheel: `pip install --no-index --no-deps transformers-*.whl`)") from e
    return transformers


def titan_status() -> str | None:
    """None when TorchTitan's Qwen3 and rlexp's KV decoder import; otherwise why not (recorded in the table)."""
    try:
        from torchtitan.models.qwen3.model import Qwen3Model  # noqa: F401

        import rlexp.models.kv_decode  # noqa: F401  (imports torchtitan at module level)
    except Exception as e:
        return (f"torchtitan not importable ({type(e).__name__}: {e}); run `bash scripts/gpu_check.sh --pack DIR` "
                "on a machine with rlexp installed and carry DIR (see scripts/gpu_check.sh)")
    return None


# ----------------------------------------------------------------------------------------------------
# Sizes
# ----------------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    arch: ArchConfig
    seq_len: int  # trainer micro-batch 1 x seq_len tokens
    optimizer: str  # "adamw", states in the parameter dtype (the only optimizer the planner models)
    mixed_precision: bool  # fp32 parameters + bf16 autocast (rlexp's single-GPU trainer.mixed_precision=true)
    prompts: int  # sampler batch
    prompt_len: int
    new_tokens: int


def gpu_cases() -> list[Case]:
    """8B: bf16 params 16.4 GB + grads 16.4 GB + AdamW m, v in bf16 32.8 GB = 66 GB, fits 139 GiB. With
    mixed precision (fp32 master, grads and moments, 16 B/param) it would need 131 GB before activations,
    so mixed precision runs only for 0.6B and 1.7B."""
    out = []
    for key, label in (("0_6b", "Qwen3-0.6B"), ("1_7b", "Qwen3-1.7B"), ("8b", "Qwen3-8B")):
        arch = QWEN3_SIZES[key].arch()
        out.append(Case(label, arch, 1024, "adamw", False, 8, 64, 128))
        if key != "8b":
            out.append(Case(label + " mp", arch, 1024, "adamw", True, 8, 64, 128))
    return out


def tiny_cases() -> list[Case]:
    """The GPU cases' code paths (tied and untied embeddings, both precisions) at sizes a CPU runs in seconds."""
    def arch(tie: bool, layers: int) -> ArchConfig:
        return ArchConfig(dim=64, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128,
                          vocab_size=512, max_seq_len=256, rope_theta=1_000_000.0, tie_embeddings=tie)
    return [
        Case("tiny tied (like 0.6B)", arch(True, 2), 64, "adamw", False, 4, 8, 16),
        Case("tiny tied (like 0.6B) mp", arch(True, 2), 64, "adamw", True, 4, 8, 16),
        Case("tiny untied (like 8B)", arch(False, 3), 64, "adamw", False, 4, 8, 16),
    ]


# ----------------------------------------------------------------------------------------------------
# Models on the same random weights
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def random_init_(model: nn.Module, seed: int) -> None:
    """Norm weights 1, everything else N(0, 0.02): the scale HF's Qwen3 initialiser uses. Drawn on the
    model's device (8B of CPU draws would take most of a minute)."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            p.normal_(0.0, 0.02, generator=gen)


def build_titan(arch: ArchConfig, device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    from rlexp.models.titan import titan_config

    with torch.device(device):
        model = titan_config(arch).build()
    model = model.to(dtype=dtype)
    if arch.tie_embeddings:
        model.lm_head.weight = model.tok_embeddings.weight
    random_init_(model, seed)
    return model


def build_hf(arch: ArchConfig, device: torch.device, dtype: torch.dtype, seed: int | None) -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rlexp.models.tiny import hf_config_dict

    cfg = hf_config_dict(ModelConfig(arch=arch, dtype="bfloat16"))
    cfg.pop("architectures")
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # allocate in the target dtype: an 8B model in fp32 would be 33 GB
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(Qwen3Config(**cfg))
    finally:
        torch.set_default_dtype(old)
    model = model.to(dtype=dtype)
    if seed is not None:
        random_init_(model, seed)
    return model


@torch.no_grad()
def hf_from_titan(titan: nn.Module, arch: ArchConfig, device: torch.device) -> nn.Module:
    """transformers' Qwen3 holding exactly the titan model's weights (through rlexp's HF name mapping)."""
    from rlexp.models.titan import titan_to_hf

    hf = build_hf(arch, device, next(titan.parameters()).dtype, seed=None)  # weights come from titan
    sd = {k: v.detach() for k, v in titan.state_dict().items() if not k.endswith(("rope.cache", "freqs_cis"))}
    missing, unexpected = hf.load_state_dict(titan_to_hf(sd, arch), strict=False)
    missing = [k for k in missing if not (arch.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"titan -> HF mapping left missing {missing[:5]}, unexpected {unexpected[:5]}")
    if arch.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def unique_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ----------------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def logits_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out = model(tokens)
    return out.logits if hasattr(out, "logits") else out


def trainer_step(model: nn.Module, case: Case, device: torch.device, seed: int) -> dict[str, Any]:
    """Two policy-gradient steps (rlexp's trainer loss shape: advantage-weighted token logprobs, fp32
    log-softmax) on micro-batch 1 x seq_len; peak memory over both (the first allocates optimizer state)."""
    from rlexp.models.policy import token_logprobs

    gen = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, case.arch.vocab_size, (1, case.seq_len + 1), generator=gen).to(device)
    adv = torch.randn(1, case.seq_len, generator=gen).to(device)
    params = list({id(p): p for p in model.parameters()}.values())
    opt = torch.optim.AdamW(params, lr=1e-5)  # as the trainer builds it: torch's defaults (foreach on CUDA)
    model.train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for _ in range(2):
        sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=case.mixed_precision):
            logits = logits_of(model, tokens[:, :-1])
        loss = -(token_logprobs(logits.float(), tokens[:, 1:]) * adv).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        del logits, loss
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        how = "torch.cuda.max_memory_allocated"
    else:  # no allocator peak on CPU: what the step must hold (weights, one set of grads, optimizer state)
        state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor))
        peak = sum(p.numel() * p.element_size() * 2 for p in params) + state
        how = "CPU: parameter + gradient + optimizer-state bytes (no allocator peak)"
    del opt
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"step_s": times[1], "first_step_s": times[0], "loss": losses[1], "peak_bytes": peak, "peak_how": how}


def plan_bytes(case: Case) -> tuple[float, float]:
    """`rlexp plan`'s trainer estimate for this layout (the function `rlexp plan` calls), total and without
    its fixed runtime overhead (CUDA context, NCCL, fragmentation), which max_memory_allocated does not see."""
    setup = TrainerSetup(fsdp=1, tp=1, micro_batch_size=1, seq_len=case.seq_len, activation_checkpointing=False,
                         mixed_precision=case.mixed_precision, dtype="float32" if case.mixed_precision else "bfloat16")
    total = trainer_plan(case.arch, setup).total_bytes
    return total, total - RUNTIME_OVERHEAD_GIB * GiB


@torch.no_grad()
def logit_parity(titan: nn.Module, hf: nn.Module, case: Case, device: torch.device, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    tokens = torch.randint(0, case.arch.vocab_size, (4, min(case.seq_len, 256)), generator=gen).to(device)
    a, b = logits_of(titan, tokens).float(), logits_of(hf, tokens).float()
    diff = (a - b).abs()
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "max_abs_logit": float(a.abs().max()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


@torch.no_grad()
def titan_greedy(model: nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding as rlexp's titan backend does it: KV-cache prefill, then one-token steps."""
    from rlexp.models.kv_decode import KVDecoder

    dec = KVDecoder(model)
    logits, cache = dec.prefill(prompts, capacity=prompts.shape[1] + new_tokens - 1)
    out = []
    for i in range(new_tokens):
        nxt = torch.log_softmax(logits.float(), dim=-1).argmax(dim=-1)
        out.append(nxt)
        if i < new_tokens - 1:
            logits = dec.step(nxt, cache)
    return torch.stack(out, dim=1)


@torch.no_grad()
def hf_greedy(model: nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None,
                         use_cache=True)
    return out[:, prompts.shape[1]:]


def timed(fn: Any, device: torch.device, *args: Any) -> tuple[Any, float]:
    fn(*(args[:-1]), 2)  # warm-up: kernels, caches, CUDA graphs of the first call
    sync(device)
    t0 = time.perf_counter()
    out = fn(*args)
    sync(device)
    return out, time.perf_counter() - t0


def sampler_speed(titan: nn.Module | None, hf: nn.Module, case: Case, device: torch.device,
                  seed: int) -> dict[str, Any]:
    gen = torch.Generator(device="cpu").manual_seed(seed + 2)
    prompts = torch.randint(3, case.arch.vocab_size, (case.prompts, case.prompt_len), generator=gen).to(device)
    n = case.prompts * case.new_tokens
    hf_ids, hf_s = timed(hf_greedy, device, hf, prompts, case.new_tokens)
    row: dict[str, Any] = {"hf_tok_s": n / hf_s, "new_tokens": case.new_tokens, "prompts": case.prompts,
                           "prompt_len": case.prompt_len}
    if titan is not None:
        ti_ids, ti_s = timed(titan_greedy, device, titan, prompts, case.new_tokens)
        same = (ti_ids == hf_ids).int()
        row.update(titan_tok_s=n / ti_s, ratio=hf_s / ti_s,
                   token_agree=float(same.float().mean()),
                   # greedy paths diverge after the first bf16 near-tie; the prefix before it is what agrees
                   first_diff_mean=float(torch.where(same.all(1), torch.full_like(same[:, 0], case.new_tokens),
                                                     (1 - same).argmax(1)).float().mean()))
    return row


# ----------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------


def run_case(case: Case, device: torch.device, titan_why: str | None, seed: int) -> dict[str, Any]:
    res: dict[str, Any] = {"case": case.name, "params": param_count(case.arch), "seq_len": case.seq_len,
                           "optimizer": case.optimizer, "mixed_precision": case.mixed_precision, "errors": {}}
    model_kind = "titan" if titan_why is None else "transformers"
    dtype = torch.float32 if case.mixed_precision else torch.bfloat16
    res["step_model"] = model_kind
    model: nn.Module | None = None
    try:
        t0 = time.perf_counter()
        model = (build_titan if titan_why is None else build_hf)(case.arch, device, dtype, seed)
        res["build_s"] = time.perf_counter() - t0
        res["built_params"] = unique_params(model)
        if res["built_params"] != res["params"]:
            raise RuntimeError(f"built model has {res['built_params']:,} parameters, the catalog's count is "
                               f"{res['params']:,}: the architecture is not the one planned")
        step = trainer_step(model, case, device, seed)
        total, no_overhead = plan_bytes(case)
        res.update(step, plan_bytes=total, plan_no_overhead_bytes=no_overhead,
                   peak_over_plan=step["peak_bytes"] / no_overhead)
    except Exception as e:
        res["errors"]["step"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    if case.mixed_precision:  # parity and speed are bf16 figures; the bf16 row of this size has them
        del model
        free(device)
        return res
    hf = None
    try:
        if model is None:
            raise RuntimeError("no model (the step section failed to build it)")
        model.eval()
        if titan_why is None:
            hf = hf_from_titan(model, case.arch, device)
            res["parity"] = logit_parity(model, hf, case, device, seed)
        else:
            hf, model = model, None
        res["sampler"] = sampler_speed(model, hf, case, device, seed)
    except Exception as e:
        res["errors"]["parity/sampler"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    del model, hf
    free(device)
    return res


def fmt(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "n/a"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    gib = lambda b: None if b is None else b / GiB  # noqa: E731
    lines = [f"# GPU check: {meta['title']}", "",
             f"- command: `{meta['command']}`",
             f"- device: {meta['device_name']}; torch {meta['torch']}; transformers {meta['transformers']}; "
             f"torchtitan {meta['torchtitan']}; python {meta['python']}",
             f"- date (UTC): {meta['date']}; wall time {meta['wall_s']:.0f} s"
             + ("" if meta["complete"] else " (INCOMPLETE: the run stopped before the last case)"),
             f"- trainer-step model: {meta['step_model']}" + (f" ({meta['titan_why']})" if meta["titan_why"] else ""),
             "- weights: random N(0, 0.02), norms 1, seed 0, drawn on the device; for the logit and sampler rows "
             "transformers' Qwen3 gets the TorchTitan model's tensors through `rlexp.models.titan.titan_to_hf`", "",
             "## Trainer step (micro-batch 1) against `rlexp plan`", "",
             "Peak is " + results[0].get("peak_how", "?") + " over two optimizer steps. The plan is "
             "`rlexp.cluster.planner.trainer_plan` (what `rlexp plan` prints for FSDP 1 x TP 1), shown without its "
             f"fixed {RUNTIME_OVERHEAD_GIB:g} GiB runtime overhead, which the allocator does not see. bf16 rows: "
             "parameters, gradients and AdamW moments in bf16 (planner `mixed_precision=false, dtype=bfloat16`); "
             "mp rows: fp32 parameters with bf16 autocast (`trainer.mixed_precision=true`); 8B has no mp row, its "
             "16 B/parameter (131 GB) would not leave room for activations on one 141 GB GPU.", "",
             "| case | params | tokens | optimizer | step s | peak GiB | plan GiB (no overhead) | peak / plan "
             "| error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['case']} | {r['params'] / 1e6:,.1f}M | {r['seq_len']} | {r['optimizer']} | "
                     f"{fmt(r.get('step_s'))} | {fmt(gib(r.get('peak_bytes')), '.4g')} | "
                     f"{fmt(gib(r.get('plan_no_overhead_bytes')), '.4g')} | {fmt(r.get('peak_over_plan'), '.2f')} | "
                     f"{r['errors'].get('step', '')} |")
    lines += ["", "## TorchTitan against transformers logits, bf16, same weights", "",
              "4 random sequences; max/mean absolute logit difference, largest |logit|, argmax agreement.", "",
              "| case | max abs diff | mean abs diff | max abs logit | argmax agree | error |",
              "|---|---|---|---|---|---|"]
    for r in results:
        if r["mixed_precision"]:
            continue
        p = r.get("parity", {})
        err = r["errors"].get("parity/sampler", "") or ("" if p else "skipped: no torchtitan (see above)")
        lines.append(f"| {r['case']} | {fmt(p.get('max_abs_diff'))} | {fmt(p.get('mean_abs_diff'))} | "
                     f"{fmt(p.get('max_abs_logit'))} | {fmt(p.get('argmax_agree'))} | {err} |")
    lines += ["", "## Greedy sampling: titan KV cache against `transformers.generate`", "",
              "Same prompts and weights, bf16, exactly `new tokens` per row (no eos), one warm-up call each; "
              "tokens/s = prompts x new tokens / wall time. Token agreement and the mean position of the first "
              "differing token show how far the two greedy paths stay together before a bf16 near-tie.", "",
              "| case | prompts x prompt len | new tokens | titan tok/s | transformers tok/s | titan / transformers | "
              "token agree | first diff at | error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["mixed_precision"]:
            continue
        s = r.get("sampler", {})
        err = r["errors"].get("parity/sampler", "") or (
            "" if "titan_tok_s" in s else "titan skipped: no torchtitan (see above)")
        lines.append(f"| {r['case']} | {s.get('prompts', '?')} x {s.get('prompt_len', '?')} | "
                     f"{s.get('new_tokens', '?')} | {fmt(s.get('titan_tok_s'), '.1f')} | "
                     f"{fmt(s.get('hf_tok_s'), '.1f')} | {fmt(s.get('ratio'), '.2f')} | "
                     f"{fmt(s.get('token_agree'), '.2f')} | {fmt(s.get('first_diff_mean'), '.1f')} | {err} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU test's mode)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available, else cpu)")
    ap.add_argument("--out", default=None, help="markdown report (default: results/gpu_h200.md on a full GPU run, "
                                                "else /tmp/gpu_check_<device>_tiny.md)")
    ap.add_argument("--only", default=None, help="comma-separated case names to run (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--command", default=None, help="the command line to print in the report (the .sh passes its own)")
    args = ap.parse_args(argv)
    transformers = require_transformers()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda but torch.cuda.is_available() is False; use --device cpu --tiny")
    if device.type == "cpu" and not args.tiny:
        raise SystemExit("gpu_check: full sizes on CPU would take hours (8B: 66 GB); add --tiny, or run on a GPU")
    out = Path(args.out) if args.out else (ROOT / "results/gpu_h200.md" if device.type == "cuda" and not args.tiny
                                           else Path(f"/tmp/gpu_check_{device.type}_tiny.md"))
    cases = tiny_cases() if args.tiny else gpu_cases()
    if args.only:
        wanted = {c.strip() for c in args.only.split(",")}
        unknown = wanted - {c.name for c in cases}
        if unknown:
            raise SystemExit(f"gpu_check: unknown --only case(s) {sorted(unknown)}; known: {[c.name for c in cases]}")
        cases = [c for c in cases if c.name in wanted]
    titan_why = titan_status()
    if titan_why:
        print(f"gpu_check: {titan_why}; the trainer step runs on transformers' Qwen3, titan rows are skipped",
              file=sys.stderr)
    t0 = time.perf_counter()
    try:
        from importlib.metadata import version

        import torchtitan  # noqa: F401
        tt_version = version("torchtitan")
    except Exception:
        tt_version = "not installed"
    results: list[dict[str, Any]] = []
    for i, case in enumerate(cases):
        print(f"gpu_check: {case.name} ...", file=sys.stderr, flush=True)
        results.append(run_case(case, device, titan_why, args.seed))
        print(json.dumps(results[-1], default=str), file=sys.stderr, flush=True)
        # Written after every case, so a run cut by the time limit still leaves the finished rows.
        write(out, results, run_meta(args, device, transformers, tt_version, titan_why, t0, done=i + 1 == len(cases)))
    print(f"gpu_check: wrote {out} and {out.with_suffix('.json')} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    bad = [(r["case"], r["errors"]) for r in results if r["errors"]]
    return 1 if bad else 0


def run_meta(args: argparse.Namespace, device: torch.device, transformers: Any, tt_version: str, titan_why: str | None,
         t0: float, done: bool) -> dict[str, Any]:
    return {
        "title": ("CPU tiny sizes (code-path check, not GPU figures)" if device.type == "cpu"
                  else ("tiny sizes" if args.tiny else "Qwen3 0.6B / 1.7B / 8B, random weights")),
        "command": args.command or "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else f"CPU ({platform.processor() or platform.machine()})"),
        "torch": torch.__version__, "transformers": transformers.__version__, "torchtitan": tt_version,
        "python": platform.python_version(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "wall_s": time.perf_counter() - t0, "step_model": "titan" if titan_why is None else "transformers",
        "titan_why": titan_why, "complete": done,
    }


def write(out: Path, results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((out, report(results, meta)),
                       (out.with_suffix(".json"), json.dumps({"meta": meta, "cases": results}, indent=1, default=str))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
