"""Do rlexp's trainer and the plain loop of studies/peers/peers.py take the same step? (issue 25 item 1)

    python studies/peers/peers_step_check.py --task sort --seed 0 --out
    studies/peers/results/peers_step_check

One batch is drawn the way both draw it (rlexp's prompt stream for the seed, `group` samples per
prompt from the starting weights), scored and group-normalised once; then each framework computes
its loss and gradient on that same batch from the same starting weights: rlexp with its trainer's
own functions (TorchTitan model, `sequence_logprobs`, the configured policy loss), the plain loop
with `peers.plain_loss` (transformers `Qwen3ForCausalLM`). Reported per HF-named tensor: both
gradient norms and their cosine; and the embedding row of the pad token on its own, because
transformers builds Qwen3's embedding with `padding_idx=config.pad_token_id` (that row gets no
gradient) while TorchTitan's embedding has no padding index (it does). The gradient-norm clip
(`trainer.grad_clip`) then scales each step by a factor that is reported too.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


def _peers() -> Any:
    spec = importlib.util.spec_from_file_location(
        "peers", Path(__file__).resolve().parent / "peers.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["peers"] = mod  # its dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod


def check(
    task_name: str, seed: int, prompts_per_step: int | None = None, freeze_pad_row: bool = False
) -> dict[str, Any]:
    """`prompts_per_step`: a smaller batch than the task's (tests). `freeze_pad_row`: rlexp's
    trainer as `trainer.freeze_pad_row=true` builds it (the embedding's padding index set, as
    transformers sets it)."""
    from rlexp.algorithm.grpo import LOSSES
    from rlexp.models.policy import load_policy, sequence_logprobs
    from rlexp.models.titan import hf_state_dict

    peers = _peers()
    task = peers.load_task(task_name, seed)
    if prompts_per_step is not None:
        task = dataclasses.replace(task, prompts=prompts_per_step)
    cfg = peers.run_config(task_name, seed)
    tok, G = task.tok, task.group
    torch.manual_seed(seed)
    samples = task.env.sample_batch(task.prompts, peers.data_rng(seed))
    prompts = [tok.encode(s.problem.prompt) for s in samples]
    hf = peers.load_model(task).train()
    comps = peers.decode(hf, prompts, G, task.max_tokens, 1.0, tok.pad_id, tok.eos_id,
                         torch.Generator().manual_seed(seed))
    rewards = peers.rewards_of(
        task, [s for s in samples for _ in range(G)], [tok.decode(c) for c in comps]
    )
    adv = peers.plain_advantages(rewards, G)

    peers.plain_loss(task, hf, prompts, comps, adv).backward()
    plain = {k: p.grad.detach().clone() for k, p in hf.named_parameters()}

    titan = load_policy(cfg.model, str(task.model_dir)).train()
    if freeze_pad_row:
        titan.tok_embeddings.padding_idx = tok.pad_id
    rows = [p for p in prompts for _ in range(G)]
    logp, mask = sequence_logprobs(titan, rows, comps, cfg.algorithm.temperature, tok.pad_id, "cpu")
    out = LOSSES.get(str(cfg.algorithm.loss))()(logp, logp.detach(), adv, mask, None, cfg.algorithm)
    out.loss.backward()
    # the gradients in HF naming: the model's own state-dict hooks split the fused QKV
    with torch.no_grad():
        for p in titan.parameters():
            p.data = p.grad
    ours = hf_state_dict(titan, cfg.model.arch)

    emb = next(k for k in plain if k.endswith("embed_tokens.weight"))
    pad_row = {
        "rlexp": float(ours[emb][tok.pad_id].norm()),
        "plain": float(plain[emb][tok.pad_id].norm()),
    }
    per_tensor = {}
    for k in sorted(plain):
        a, b = ours[k].flatten(), plain[k].flatten()
        if k == emb:  # the pad row apart: it is the one difference the module docstring names
            keep = torch.ones_like(ours[k], dtype=torch.bool)
            keep[tok.pad_id] = False
            a, b = ours[k][keep], plain[k][keep]
        cos = (
            float(torch.nn.functional.cosine_similarity(a, b, dim=0))
            if a.norm() > 0 and b.norm() > 0
            else math.nan
        )
        per_tensor[k] = {
            "rlexp_norm": float(a.norm()),
            "plain_norm": float(b.norm()),
            "cosine": cos,
        }
    total = {
        name: math.sqrt(sum(float(g[k].pow(2).sum()) for k in g))
        for name, g in (("rlexp", ours), ("plain", plain))
    }
    clip = cfg.trainer.grad_clip
    return {
        "task": task_name,
        "seed": seed,
        "batch": f"{task.prompts} prompts x {G} samples",
        "freeze_pad_row": freeze_pad_row,
        "responses_with_pad_before_their_end": sum(tok.pad_id in c[:-1] for c in comps),
        "loss": {
            "rlexp": float(out.loss.detach()),
            "plain": float(peers.plain_loss(task, hf, prompts, comps, adv).detach()),
        },
        "grad_norm": total,
        "pad_row_grad_norm": pad_row,
        "grad_norm_without_pad_row": {
            "rlexp": math.sqrt(max(0.0, total["rlexp"] ** 2 - pad_row["rlexp"] ** 2)),
            "plain": math.sqrt(max(0.0, total["plain"] ** 2 - pad_row["plain"] ** 2)),
        },
        "clip_scale": {name: min(1.0, clip / n) if n > 0 else 1.0 for name, n in total.items()},
        "hf_padding_idx": hf.model.embed_tokens.padding_idx,
        "min_cosine_elsewhere": min(
            v["cosine"] for v in per_tensor.values() if not math.isnan(v["cosine"])
        ),
        "per_tensor": per_tensor,
    }


def render(r: dict[str, Any], command: str) -> str:
    n, pr, wo, cs = (
        r["grad_norm"],
        r["pad_row_grad_norm"],
        r["grad_norm_without_pad_row"],
        r["clip_scale"],
    )
    lines = [
        f"Produced by `{command}`.",
        "",
        f"# rlexp's trainer and the plain loop on one identical batch ({r['task']}, "
        f"seed {r['seed']}, {r['batch']}"
        + (", rlexp with trainer.freeze_pad_row=true)" if r["freeze_pad_row"] else ")"),
        "",
        "Same starting weights, same sampled batch, same rewards and advantages; each "
        "framework's own loss and gradient (studies/peers/peers_step_check.py says how). No "
        "statistic over seeds: this is one step, checked tensor by tensor.",
        "",
        "| | rlexp | plain loop |",
        "|---|---:|---:|",
        f"| loss | {r['loss']['rlexp']:.9f} | {r['loss']['plain']:.9f} |",
        f"| gradient norm, all tensors | {n['rlexp']:.4f} | {n['plain']:.4f} |",
        f"| of which the pad token's embedding row (id of `<pad>`) | {pr['rlexp']:.4f} "
        f"| {pr['plain']:.4f} |",
        f"| gradient norm without that row | {wo['rlexp']:.4f} | {wo['plain']:.4f} |",
        f"| scale the gradient-norm clip applies to this step | {cs['rlexp']:.4f} "
        f"| {cs['plain']:.4f} |",
        "",
        "Every other gradient agrees: the lowest cosine between the two over "
        f"the {len(r['per_tensor'])} HF-named tensors (the embedding without its pad row) "
        f"is {r['min_cosine_elsewhere']:.6f}. transformers builds the embedding with "
        f"`padding_idx={r['hf_padding_idx']}` (the checkpoint's `pad_token_id`), so that row "
        "never gets a gradient there; TorchTitan's embedding has "
        f"none. {r['responses_with_pad_before_their_end']} of the batch's responses contain a "
        "sampled `<pad>` before their last token, which is how the row enters the loss; it "
        "starts at zero, and RMSNorm's backward through an all-zero row is scaled by about "
        "1/sqrt(eps).",
        "",
        "| tensor | rlexp grad norm | plain grad norm | cosine |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {k} | {v['rlexp_norm']:.6g} | {v['plain_norm']:.6g} | {v['cosine']:.6f} |"
              for k, v in r["per_tensor"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="sort")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--freeze-pad-row", action="store_true", help="rlexp as trainer.freeze_pad_row=true runs it"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="PREFIX: writes PREFIX.md and PREFIX.json"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    r = check(args.task, args.seed, freeze_pad_row=args.freeze_pad_row)
    command = "python studies/peers/peers_step_check.py " + " ".join(
        shlex.quote(a) for a in (argv or sys.argv[1:])
    )
    text = render(r, command)
    print(text)
    if args.out is not None:
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(
            json.dumps({"command": command, **r}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
