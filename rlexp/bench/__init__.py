"""`rlexp bench`: throughput of the parts an RL step waits on, each next to a baseline measured in
the same run on the same machine, so the numbers mean something on any box (CPU laptop or GPU node).

- weight sync (shm transport): seconds per GB for publish (trainer write) + fetch (generator read),
against plain memcpy of the same bytes (the floor any RAM-backed transport pays at least once); -
weight transports between two processes (shm, monarch): GB/s of publish + fetch into a generator's
existing weights, median and range over repeats, next to memcpy measured in the same run; the tcp
transport's fetch next to a plain TCP socket copy of the same bytes between the same two processes
(and the tiny model); - generation: tokens/s of the `titan` and `vllm` generator backends on the
tiny model, against transformers `generate` on the same prompts at each batch size, every engine
writing exactly batch x max_tokens tokens; - overhead (`--overhead-steps`): the actor graph's step
(`rlexp train`, on-policy) against the same components called in one process
(`rlexp.run.inprocess`), whose metrics must be identical; - overlap (`--overlap-steps`): a
`sync=async` step against its ideal max(generation, the rest) measured in the same run
(`perf/overlap_efficiency`, rlexp/algorithm/loop.py).

Writes a markdown table with the command line that produced it (default
studies/perf/results/bench_cpu.md). Not a timed test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from rlexp.bench.generation import bench_backend, bench_generation, bench_hf_generate
from rlexp.bench.rows import Row
from rlexp.bench.steps import bench_overhead, bench_overlap
from rlexp.bench.weights import bench_sync, bench_tcp, bench_transports

__all__ = ["Row", "bench_backend", "bench_generation", "bench_hf_generate", "bench_overhead",
           "bench_overlap", "bench_sync", "bench_tcp", "bench_transports", "main", "render"]
RESULTS = Path(__file__).resolve().parents[2] / "results"


def render(rows: list[Row], argv: list[str], seconds: float) -> str:
    import torch

    cmd = "rlexp bench " + " ".join(shlex.quote(a) for a in argv)
    lines = [
        "# rlexp bench (CPU)",
        "",
        f"Produced by: `{cmd}`  ",
        f"Host: {platform.node() or '?'}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, torch threads {torch.get_num_threads()}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}, took {seconds:.0f} s.  ",
        "The machine may be shared: compare a row with its baseline (same run), not across runs.",
        "",
        "| measurement | value | unit | baseline | baseline value | vs baseline | notes |",
        "|---|---:|---|---|---:|---:|---|",
    ]
    for r in rows:
        bv = "-" if r.baseline_value is None else f"{r.baseline_value:.4g}"
        val = "n/a" if r.value != r.value else f"{r.value:.4g}"
        lines.append(f"| {r.what} | {val} | {r.unit} | {r.baseline} | {bv} | {r.ratio()} "
                     f"| {r.note} |")
    lines += ["",
              "\"vs baseline\" > 1 means faster than the baseline (for s/GB: baseline time / "
              "measured time)."]
    return "\n".join(lines) + "\n"


def _batch_sizes(text: str) -> list[int]:
    """Refused at parse time, before any measurement starts: a typo must not cost the transport runs
    first."""
    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive batch sizes separated by "
                                         "commas, e.g. 8,64,256")
    return sizes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="rlexp bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sync-mb", type=int, default=256,
                   help="bytes moved per weight-sync measurement")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch", type=_batch_sizes, default="8,64",
                   help="comma-separated generation batch sizes")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--backends", default="titan,vllm",
                   help="comma-separated generator backends ('' for none)")
    p.add_argument("--transport-mb", default="64,256",
                   help="state-dict sizes for the transport rows ('' for none)")
    p.add_argument("--chunk-mb", type=int, default=64, help="monarch transport message size")
    p.add_argument("--overhead-steps", type=int, default=0,
                   help="actor graph vs one process, steps per run (0: skip)")
    p.add_argument("--overhead-rounds", type=int, default=2,
                   help="alternating (graph, one-process) pairs of runs")
    p.add_argument("--overlap-steps", type=int, default=0,
                   help="sync=async vs its ideal, steps per run (0: skip)")
    p.add_argument("--warmup-steps", type=int, default=3,
                   help="steps left out of the overhead/overlap medians")
    p.add_argument("--train-overrides", default="",
                   help="space-separated `rlexp train` overrides for those runs")
    p.add_argument("--skip-sync", action="store_true")
    p.add_argument("--skip-gen", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_cpu.md")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows: list[Row] = []
    if not args.skip_sync:
        rows += bench_sync(args.sync_mb, args.reps)
    sizes = [int(x) for x in args.transport_mb.split(",") if x]
    if sizes:
        rows += bench_transports(sizes, args.reps, args.chunk_mb)
        rows += bench_tcp(sizes, args.reps)
    if not args.skip_gen:
        rows += bench_generation(args.batch, args.prompt_len, args.max_tokens, args.reps,
                                 [b for b in args.backends.split(",") if b])
    overrides = args.train_overrides.split()
    if args.overhead_steps:
        rows += bench_overhead(args.overhead_steps, args.overhead_rounds, args.warmup_steps,
                               overrides)
    if args.overlap_steps:
        rows += bench_overlap(args.overlap_steps, args.warmup_steps, overrides)
    text = render(rows, argv, time.perf_counter() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
