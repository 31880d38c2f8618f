"""Is the sort task's held-out dip a property of the weights at one step, or of where training is heading?
(issue 25 item 2, seventh pre-registered round; studies/sort_recipe/results/sort_recipe_pilot.md,
sixth addendum)

    python studies/sort_recipe/sort_ema_readout.py OUT_DIR [--seeds 100,101,102,103,104] [--decays
    0.9,0.97,0.99] python studies/sort_recipe/sort_ema_readout.py OUT_DIR --analyse --out
    studies/sort_recipe/results/sort_ema_readout

Six rounds of learning-rate, momentum and batch recipes left the cosine recipe (lr 1e-3, 10 warm-up
steps, cosine to 0.1x) stable on 2 of 5 seeds: it ends at 1.00 everywhere but dips mid-run, and a
dip is a shift of the count of ones across every answer class at once. If a dip is the live weights
overshooting around a good point, an exponential moving average of the weights (Polyak averaging,
what "model EMA" ships) should not dip.

One run per seed of exactly the control recipe, in one process (`rlexp.run.inprocess`: the actor
graph's components, the same settings and seeds), so training is the control's. After every step the
EMA of the trainer's weights is updated for each decay; at step 0 and every 10 steps the live policy
and each EMA are evaluated greedily on the held-out set, the EMA through a titan sampler of its own
(the live generator never sees it, so training is untouched). Faithfulness check: the live curve
must equal the sixth round's control curve for the same seed
(studies/sort_recipe/results/sort_recipe_pilot_round6.json), evaluation for evaluation.

Rule (the pilot's, unchanged): a readout is stable when it reaches 0.8 and no later evaluation falls
below 0.8; it meets the goal with >= 4 of 5 stable seeds; among readouts meeting it, the fewest
steps to 0.8 (median over seeds) wins. Reported beside it: final accuracy, AUC of the curve, and the
AUC paired by seed against the live policy.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics as st
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "studies" / "peers"))  # the stability rule is peers'

THRESHOLD, NEED_STABLE, EVERY, STEPS = 0.8, 4, 10, 400
RECIPE = [
    "environment=sort",
    f"eval.every_n_steps={EVERY}",
    "trainer.lr_schedule=cosine",
    "trainer.warmup_steps=10",
]
ROUND6 = HERE / "results" / "sort_recipe_pilot_round6.json"


def run_seed(seed: int, decays: list[float], out: Path, steps: int = STEPS) -> dict[str, Any]:
    """Train one seed of the control recipe in this process; the live and EMA held-out curves."""
    import torch

    from rlexp.algorithm import loop
    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.config.eval import EvalConfig
    from rlexp.evals.runner import evaluate
    from rlexp.models.backends import build_backend
    from rlexp.models.titan import hf_state_dict
    from rlexp.models.tokenizer import load_tokenizer
    from rlexp.run.inprocess import build_inprocess
    from rlexp.run.prepare import prepare

    p = prepare(compose_run_config([*RECIPE, f"steps={steps}", f"seed={seed}"]))
    c = p.cfg
    svc = build_inprocess(p, f"ema{os.getpid()}-{seed}")
    trainer = svc.trainer.mesh.obj
    gen = svc.generators.replicas[0].obj
    tok = load_tokenizer(p.model_dir)
    st_ = gen.settings
    sampler = build_backend(st_.backend, st_.model_dir, tok, st_.seed, st_.model, **st_.options)
    emas = {d: copy.deepcopy(trainer.model).requires_grad_(False) for d in decays}
    ecfg = EvalConfig(**{**vars(c.eval), "max_tokens": c.algorithm.max_tokens})
    curves: dict[str, dict[int, float]] = {"live": {}, **{f"ema{d}": {} for d in decays}}

    def route(prompt_ids, n, max_tokens, temperature, eval_seed, stop=None):
        return svc.generators.generate.route(
            prompt_ids, n, max_tokens, temperature, eval_seed, stop
        ).get()

    def own(prompt_ids, n, max_tokens, temperature, eval_seed, stop=None):
        return sampler.generate(prompt_ids, n, max_tokens, temperature, eval_seed, stop)

    def read(step: int) -> None:
        curves["live"][step] = evaluate(p.env, route, tok, ecfg, step)["eval/accuracy"]
        for d, m in emas.items():
            sampler.load_state_dict(step, hf_state_dict(m, c.model.arch), where=f"ema {d}")
            curves[f"ema{d}"][step] = evaluate(p.env, own, tok, ecfg, step)["eval/accuracy"]

    def on_step(step: int, metrics: dict[str, float], rollouts: list[dict[str, Any]]) -> None:
        live = [q.detach() for q in trainer.model.parameters()]
        with torch.no_grad():
            for d, m in emas.items():
                torch._foreach_lerp_([q for q in m.parameters()], live, 1.0 - d)
        if step % EVERY == 0 or step == steps:
            read(step)

    t = time.perf_counter()
    read(0)
    state = loop.LoopState(data_rng=random.Random(p.seeds["data"]))
    try:
        loop.train(c, svc, p.env, tok.encode, state, on_step)
    finally:
        svc.trainer.shutdown.call()
        svc.generators.shutdown.fanout().get()
        sampler.close()
    rec = {"seed": seed, "seconds": time.perf_counter() - t, "threads": torch.get_num_threads(),
           "curves": {k: {str(s): a for s, a in v.items()} for k, v in curves.items()}}
    (out / f"seed{seed}.json").write_text(json.dumps(rec, indent=1))
    return rec


def analyse(out: Path, dest: Path) -> dict[str, Any]:
    import peers
    from scipy import stats

    recs = [json.loads(f.read_text()) for f in sorted(out.glob("seed*.json"))]
    control = json.loads(ROUND6.read_text())["curves"] if ROUND6.exists() else {}
    faithful = {}
    for r in recs:
        ref = next((v for k, v in control.items() if k == f"cos1e-3-{r['seed']}"), None)
        live = {int(s): a for s, a in r["curves"]["live"].items()}
        faithful[r["seed"]] = (
            None
            if ref is None
            else all(
                abs(live.get(int(s), -1.0) - a) < 1e-9
                for s, a in (ref.items() if isinstance(ref, dict) else ref)
            )
        )
    readouts: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        for name, curve in r["curves"].items():
            pts = sorted((int(s), a) for s, a in curve.items())
            hit = next((s for s, a in pts if a >= THRESHOLD), None)
            readouts.setdefault(name, []).append(
                {
                    "seed": r["seed"],
                    "stable": peers.stable(pts, THRESHOLD),
                    "steps_to_08": hit,
                    "final": pts[-1][1],
                    "auc": peers.auc(pts),
                    "min_after_08": None if hit is None else min(a for s, a in pts if s >= hit),
                }
            )
    live = {x["seed"]: x for x in readouts.get("live", [])}
    rows = []
    for name, ss in readouts.items():
        hits = [s["steps_to_08"] for s in ss if s["steps_to_08"] is not None]
        row = {
            "readout": name,
            "seeds": [s["seed"] for s in ss],
            "stable": sum(s["stable"] for s in ss),
            "meets_goal": len(ss) >= 5 and sum(s["stable"] for s in ss) >= NEED_STABLE,
            "median_steps_to_08": st.median(hits) if hits else None,
            "reached_08": len(hits),
            "mean_final": st.mean(s["final"] for s in ss),
            "mean_auc": st.mean(s["auc"] for s in ss),
            "per_seed": ss,
        }
        d = [s["auc"] - live[s["seed"]]["auc"] for s in ss if s["seed"] in live]
        if name != "live" and len(d) >= 2:
            half = stats.t.ppf(0.975, len(d) - 1) * st.stdev(d) / len(d) ** 0.5
            row["paired_auc_vs_live"] = {"n": len(d), "mean": st.mean(d), "low": st.mean(d) - half,
                                         "high": st.mean(d) + half}
        rows.append(row)
    rows.sort(key=lambda r: (not r["meets_goal"], r["median_steps_to_08"] or 1e9))
    res = {
        "rule": f"stable: reaches {THRESHOLD} and never falls below it after; goal: "
                f">= {NEED_STABLE} of 5 seeds stable; winner: lowest median steps to 0.8 among "
                "readouts meeting the goal",
        "winner": rows[0]["readout"] if rows and rows[0]["meets_goal"] else None,
        "live_equals_round6_control": faithful,
        "readouts": rows,
        "seconds_per_run": [round(r["seconds"], 1) for r in recs],
        "threads": [r["threads"] for r in recs],
        "command": " ".join(["python", "studies/sort_recipe/sort_ema_readout.py", *sys.argv[1:]]),
        "curves": {r["seed"]: r["curves"] for r in recs},
    }
    dest.with_suffix(".json").write_text(json.dumps(res, indent=1))
    lines = [
        f"Produced by `{res['command']}` from the runs of "
        f"`python studies/sort_recipe/sort_ema_readout.py {out}`.",
        "",
        "| readout | stable seeds (goal >= 4 of 5) | median steps to 0.8 | final per seed | "
        "mean AUC | AUC vs live, paired (95% t) | lowest after first 0.8, per seed |",
        "|---|---|---:|---|---:|---|---|",
    ]
    for r in rows:
        pv = r.get("paired_auc_vs_live")
        pv_s = "-" if pv is None else f"{pv['mean']:+.3f} [{pv['low']:+.3f}, {pv['high']:+.3f}]"
        lows = ", ".join(
            "never" if s["min_after_08"] is None else f"{s['min_after_08']:.2f}"
            for s in r["per_seed"]
        )
        lines.append(
            f"| {r['readout']} | {r['stable']} / {len(r['per_seed'])} | "
            f"{r['median_steps_to_08']} | "
            + ", ".join(f"{s['final']:.2f}" for s in r["per_seed"])
            + f" | {r['mean_auc']:.3f} | {pv_s} | {lows} |"
        )
    lines += ["", f"Winner by the rule: {res['winner'] or 'none (no readout meets the goal)'}.",
              f"Live curve equal to round 6's control, per seed: {faithful}."]
    dest.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--seeds", default="100,101,102,103,104")
    ap.add_argument("--decays", default="0.9,0.97,0.99")
    ap.add_argument(
        "--steps", type=int, default=STEPS, help="a smoke test's shorter run; the round uses 400"
    )
    ap.add_argument("--analyse", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "sort_ema_readout")
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    if a.analyse:
        print(
            json.dumps({k: v for k, v in analyse(a.dir, a.out).items() if k != "curves"}, indent=1)[
                :4000
            ]
        )
        return 0
    for seed in (int(s) for s in a.seeds.split(",")):
        if (a.dir / f"seed{seed}.json").exists():
            continue
        rec = run_seed(seed, [float(d) for d in a.decays.split(",")], a.dir, a.steps)
        print(
            f"{time.strftime('%T')} seed {seed}: {rec['seconds']:.0f}s, finals "
            + ", ".join(f"{k} {v[str(a.steps)]:.3f}" for k, v in rec["curves"].items()),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
