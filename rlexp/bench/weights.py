"""`rlexp bench`'s weight rows: the shm transport's sync in one process, and each transport between
two processes (Monarch actors), next to memcpy or a plain socket copy measured in the same run."""
from __future__ import annotations

import os
import statistics
from pathlib import Path

from rlexp.bench.rows import Row, median_time


def bench_sync(total_mb: int, reps: int, root: Path | None = None) -> list[Row]:
    import torch

    from rlexp.models.hf import read_hf_state_dict

    # Monarch loads only when the sync rows run
    from rlexp.transport.probe import synthetic_hf_state_dict
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
    memcpy_s = median_time(lambda: dst.copy_(src), reps)
    fresh_s = median_time(lambda: torch.empty_like(src).copy_(src), reps)

    root = root or default_root()
    # keep=2: the dropped version's pages are reused
    t = ShmTransport(f"rlexp-bench-{os.getpid()}", root=root, keep=2)
    version = [0]
    locs: list[str] = []
    # the generator's existing (already faulted) weights
    params = {k: v.clone() for k, v in sd.items()}

    def publish():
        version[0] += 1
        locs.append(t.publish(version[0], sd))

    def fetch_copy():  # what the titan generator's update_weights does
        for k, v in read_hf_state_dict(locs[-1]).items():
            params[k].copy_(v)

    def fetch_into():
        t.fetch_into(locs[-1], params)

    try:
        # warm-up (the first writes allocate shm pages; later ones reuse the dropped version's)
        publish()
        publish()
        pub_s = median_time(publish, reps)
        fetch_s = median_time(fetch_into, reps)
        assert all(torch.equal(params[k], sd[k]) for k in sd)
        for v in params.values():
            v.zero_()
        copy_s = median_time(fetch_copy, reps)
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
        Row("shm publish + fetch", (pub_s + fetch_s) / gb, "s/GB", "2 x memcpy", 2 * memcpy_per_gb,
            where),
        Row("memcpy, destination already faulted", memcpy_per_gb, "s/GB", "-", None,
            f"{gb / memcpy_s:.1f} GB/s"),
        Row("memcpy into a fresh allocation", fresh_s / gb, "s/GB", "-", None,
            "first-touch page faults included: the floor for any write into new memory or new "
            "tmpfs pages"),
    ]


def bench_transports(sizes_mb: list[int], reps: int, chunk_mb: int = 64,
                     names: tuple[str, ...] = ("shm", "shm copy", "monarch")) -> list[Row]:
    """Each transport from one process to another (Monarch actors: `rlexp.transport.probe`): publish
    by the first, fetch by the second the way a generator does, checked bit for bit every time.
    `shm` serves the version file's tensors from its mapping under a lease (the titan generator's
    path: one copy per sync, the publish); `shm copy` copies the file into already-allocated weights
    (two copies: vLLM's and the pre-lease path), measured in the same run so the two compare.
    Reported as GB/s of the state dict over publish + fetch, median and range over `reps` after one
    warm-up; the baseline is one memcpy of the same bytes into a faulted buffer, measured in this
    process in this run."""
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
            memcpy = [nbytes / 1e9 / median_time(lambda a=dst, b=src: a.copy_(b), 1)
                      for _ in range(reps)]
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
                        raise RuntimeError(f"bench: {label} delivered different bytes than were "
                                           "published")
                    if r:
                        pubs.append(pub_s)
                        fetches.append(fetch_s)
                gbps = [nbytes / 1e9 / (p + f) for p, f in zip(pubs, fetches)]
                how = {"serve": "; fetch = lease + serve from the mapped file (zero-copy)",
                       "copy": "; fetch = copy into existing weights" if name == "shm" else ""
                       }[mode]
                rows.append(Row(
                    f"{label} publish + fetch, {nbytes / 2**20:.0f} MiB bf16",
                    statistics.median(gbps), "GB/s", "memcpy", memcpy_gbps,
                    f"range {min(gbps):.3g}-{max(gbps):.3g} GB/s over {reps}; median publish "
                    f"{statistics.median(pubs):.3f} s, fetch {statistics.median(fetches):.4f} s; "
                    "process to process"
                    + how + (f", {chunk_mb} MiB messages" if name == "monarch" else "")
                    + f"; memcpy range {min(memcpy):.3g}-{max(memcpy):.3g} GB/s"))
            sub.close.call_one().get()
            pub.close.call_one().get()
        finally:
            for m in meshes:
                m.stop().get(timeout=30)
    return rows


def bench_tcp(sizes_mb: list[int], reps: int, tiny: bool = True) -> list[Row]:
    """The tcp transport's fetch against a plain TCP socket copy of as many bytes between the same
    two processes (one `sendall` per request byte, `recv_into` on the other side:
    `TransportProbe.plain_*`), on loopback, each on a connection kept across reps. Each rep
    publishes, then fetches by both, in turns first, so the publisher's process is as busy for
    either and load on a shared machine hits both alike; two warm-up reps. The fetch is what a
    generator's `update_weights` waits for before `load_state_dict`: request, header, the stream
    into its receive buffer (kept across versions), the end mark, tensors viewed from the buffer;
    the publish (the trainer's pack) is reported beside it. `tiny`: the same rows with the tiny
    model's weights."""
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
            # One torch thread: no OpenMP pool left spinning by the checks between timed fetches
            # (TransportProbe)
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
                    # Each right after a publish, in turns first: the publisher's process is equally
                    # busy for both
                    first_plain = (r + i) % 2 == 0
                    plain_s = sub.plain_fetch.call_one(host, port).get() if first_plain else 0.0
                    fetch_s = sub.fetch.call_one("tcp", version, loc).get()
                    plain_s = plain_s or sub.plain_fetch.call_one(host, port).get()
                    if not sub.check_and_clear.call_one().get():
                        raise RuntimeError(f"bench: tcp{label} delivered different bytes than "
                                           "were published")
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
                    f"{min(got):.3g}-{max(got):.3g} GB/s, plain {min(plain):.3g}-{max(plain):.3g} "
                    f"GB/s; publish (pack{' + checksums' if label else ''}) median "
                    f"{statistics.median(pubs[label]):.4f} s"))
            sub.close.call_one().get()
            pub.close.call_one().get()
        finally:
            for m in meshes:
                m.stop().get(timeout=30)
    return rows
