"""Weight sync in Monarch actor messages: the transport that crosses hosts with nothing but Monarch.

Trainer side (`MonarchTransport.publish`): the HF state dict is packed into byte chunks of at most
`chunk_bytes` (64 MiB by default; one actor message each, so no message is unbounded) and kept in a
module-level registry of the trainer's process, keyed by run name. Packing is the one copy the trainer
pays: it must copy anyway, since it goes on training in place while generators read.

Serving (`WeightServer`): a small actor spawned on the trainer's first process. Actors of one process
share its memory but not its mailbox or thread, so the server reads the registry without a copy and
answers generators while the trainer's own mailbox is busy with `train_step` (async mode), which
serving from the Trainer actor itself could not do.

Generator side (`MonarchWeightClient.afetch`): asks the server for a version's manifest (names,
dtypes, shapes, byte offsets, a publish id), pulls the chunks with a bounded number in flight into one
flat buffer, and returns views of it. Every chunk reply carries the version and publish id it came from;
a chunk of another publish (the version was re-published, or dropped past `keep`) fails the fetch with a
clear error, so a generator never loads torn weights. Compatibility with the generator's own parameters
is checked by the backend (`rlexp.core.weights.check_weights`).

Why not Monarch RDMA buffers (`monarch.rdma.RDMABuffer`): they import and work on this CPU build, but
without ibverbs hardware `get_rdma_backend()` is "tcp", a TCP fallback Monarch itself warns is slow. On
this 2-core host a 64 MiB read measured 0.19 GB/s by RDMABuffer (tcp) against 0.15 GB/s by a tensor in
an actor reply (median of 3, machine under load; studies/perf/results/transport_cpu.md), while buffers need their
lifetimes managed across processes (an explicit `drop` per version) and 60 s per-transfer timeouts. So
the message path ships; RDMA is the next step on hosts where the backend is "ibverbs".
"""
from __future__ import annotations

import threading
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from monarch.actor import Actor, endpoint

from rlexp.transport.base import TransportError, WeightReceiver, WeightTransport, register_transport

if TYPE_CHECKING:
    from rlexp.config.schema import ClusterConfig

URI = "monarch://"
DEFAULT_CHUNK_BYTES = 64 * 2**20
_ALIGN = 64  # byte alignment of each tensor in the flat buffer, so a view of any dtype is legal
_IN_FLIGHT = 2  # chunk requests a generator keeps outstanding (bounds its extra memory to 2 chunks)


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # "float32", ...: torch dtype attribute name
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Published:
    """One published version: immutable once registered, so a reader never sees it change."""

    version: int
    publish_id: str
    entries: tuple[Entry, ...]
    total: int
    chunk_bytes: int
    chunks: tuple[torch.Tensor, ...]  # uint8, each its own storage (a reply sends exactly its bytes)

    def manifest(self) -> dict[str, Any]:
        return {"version": self.version, "publish_id": self.publish_id, "total": self.total,
                "chunk_bytes": self.chunk_bytes, "n_chunks": len(self.chunks),
                "entries": [(e.name, e.dtype, e.shape, e.offset, e.nbytes) for e in self.entries]}


_LOCK = threading.Lock()  # the trainer and the server run on different threads of one process
_RUNS: dict[str, dict[int, Published]] = {}


def location(run_name: str, version: int) -> str:
    return f"{URI}{run_name}/v{version}"


def parse_location(loc: str) -> tuple[str, int]:
    if not loc.startswith(URI) or "/v" not in loc:
        raise TransportError(f"transport=monarch: {loc!r} is not a {URI}<run>/v<version> location")
    run, v = loc[len(URI):].rsplit("/v", 1)
    return run, int(v)


def pack(version: int, hf_state_dict: dict[str, torch.Tensor], chunk_bytes: int) -> Published:
    """Copy the state dict into fresh byte chunks (the trainer's one copy; alignment padding is zeroed)."""
    entries, off = [], 0
    for k in sorted(hf_state_dict):
        t = hf_state_dict[k]
        n = t.numel() * t.element_size()
        entries.append(Entry(k, str(t.dtype).removeprefix("torch."), tuple(t.shape), off, n))
        off += -(-n // _ALIGN) * _ALIGN
    total = off
    chunks = [torch.empty(min(chunk_bytes, total - s), dtype=torch.uint8) for s in range(0, total, chunk_bytes)]
    pad = torch.zeros(_ALIGN, dtype=torch.uint8)
    for e in entries:
        src = hf_state_dict[e.name].detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        _write(chunks, chunk_bytes, e.offset, src)
        _write(chunks, chunk_bytes, e.offset + e.nbytes, pad[:(-e.nbytes) % _ALIGN])
    return Published(version, uuid.uuid4().hex, tuple(entries), total, chunk_bytes, tuple(chunks))


def _write(chunks: list[torch.Tensor], chunk_bytes: int, start: int, src: torch.Tensor) -> None:
    """Bytes `src` at flat offset `start` of the chunked buffer (a tensor may straddle chunk boundaries)."""
    pos = 0
    while pos < src.numel():
        c, within = divmod(start + pos, chunk_bytes)
        n = min(src.numel() - pos, chunk_bytes - within)
        chunks[c][within:within + n].copy_(src[pos:pos + n])
        pos += n


def unpack(manifest: dict[str, Any], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of the flat buffer, one per tensor (no copy)."""
    out = {}
    for name, dtype, shape, off, n in manifest["entries"]:
        out[name] = flat[off:off + n].view(getattr(torch, dtype)).view(tuple(shape))
    return out


def _lookup(run: str, version: int) -> Published:
    with _LOCK:
        versions = _RUNS.get(run)
        if versions is None:
            raise TransportError(f"transport=monarch: nothing published for run {run!r} in this process "
                                 f"(is the weight server on the trainer's first process?)")
        pub = versions.get(version)
        have = sorted(versions)
    if pub is None:
        raise TransportError(f"transport=monarch: version {version} of run {run!r} is not published (have {have}); "
                             f"it was dropped past `keep` or not pushed yet")
    return pub


class WeightServer(Actor):
    """Serves published versions to generators on any host; spawn it on the trainer's first process."""

    @endpoint
    async def manifest(self, run: str, version: int) -> dict[str, Any]:
        return _lookup(run, version).manifest()

    @endpoint
    async def chunk(self, run: str, version: int, publish_id: str, index: int) -> tuple[int, str, torch.Tensor]:
        pub = _lookup(run, version)
        return pub.version, pub.publish_id, pub.chunks[index]


class MonarchWeightClient:
    """Generator side: pulls a version from a `WeightServer` actor (a handle passed at wiring time)."""

    def __init__(self, server: Any, in_flight: int = _IN_FLIGHT) -> None:
        self.server, self.in_flight = server, max(1, in_flight)

    async def afetch(self, loc: str, version: int | None = None) -> dict[str, torch.Tensor]:
        run, v = parse_location(loc)
        if version is not None and v != version:
            raise TransportError(f"transport=monarch: asked to load version {version} from {loc}, which holds "
                                 f"version {v}; refusing a mismatched version")
        man = await self.server.manifest.call_one(run, v)
        if man["version"] != v:
            raise TransportError(f"transport=monarch: the server answered version {man['version']} for {loc}")
        flat = torch.empty(man["total"], dtype=torch.uint8)
        cb, n = man["chunk_bytes"], man["n_chunks"]
        pending: deque[tuple[int, Any]] = deque()
        for i in range(n + self.in_flight):
            if i < n:
                pending.append((i, self.server.chunk.call_one(run, v, man["publish_id"], i)))
            if pending and (len(pending) >= self.in_flight or i >= n):
                j, fut = pending.popleft()
                got_v, got_id, data = await fut
                if got_v != v or got_id != man["publish_id"]:
                    raise TransportError(f"transport=monarch: chunk {j} of {loc} came from another publish "
                                         f"(version {got_v}, id {got_id[:8]} != {man['publish_id'][:8]}): the "
                                         f"version was re-published mid-fetch; not loading torn weights")
                want = min(cb, man["total"] - j * cb)
                if data.numel() != want:
                    raise TransportError(f"transport=monarch: chunk {j} of {loc} has {data.numel()} bytes, "
                                         f"expected {want}")
                flat[j * cb:j * cb + want].copy_(data)
        return unpack(man, flat)


class MonarchReceiver(WeightReceiver):
    """Generator side: a `MonarchWeightClient` of the run's `WeightServer` (handed over by `connect`)."""

    client: MonarchWeightClient | None = None

    def connect(self, server: Any) -> None:
        self.client = MonarchWeightClient(server)

    async def afetch(self, version: int, location: str) -> dict[str, torch.Tensor]:
        if self.client is None:
            raise TransportError("generator: transport=monarch but no weight server was connected "
                                 "(the launcher connects it after spawning)")
        return await self.client.afetch(location, version)


@register_transport("monarch")
class MonarchTransport(WeightTransport):
    """Trainer side: publishes into this process's registry, which `WeightServer` serves."""

    receiver = MonarchReceiver
    server = WeightServer
    server_actor = "weights"  # the name its actor has always had (logs, placement.json)

    @classmethod
    def settings(cls, cluster: ClusterConfig) -> dict[str, Any]:
        return {"chunk_bytes": cluster.transport_chunk_mb * 2**20}

    def __init__(self, run_name: str, *, keep: int = 2, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        if chunk_bytes < _ALIGN or chunk_bytes % _ALIGN:
            raise ValueError(f"transport=monarch: chunk size {chunk_bytes} bytes must be a positive multiple "
                             f"of {_ALIGN}; set cluster.transport_chunk_mb")
        self.run, self.keep, self.chunk_bytes = run_name, keep, chunk_bytes
        with _LOCK:
            _RUNS[run_name] = {}

    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        pub = pack(version, hf_state_dict, self.chunk_bytes)
        with _LOCK:
            versions = _RUNS.setdefault(self.run, {})
            versions[version] = pub  # replaces a re-published version whole (new publish id)
            for v in sorted(versions)[: max(0, len(versions) - self.keep)]:
                del versions[v]
        return location(self.run, version)

    def versions(self) -> list[int]:
        with _LOCK:
            return sorted(_RUNS.get(self.run, {}))

    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        """In-process read (tests, bench); generators use `MonarchWeightClient`."""
        run, version = parse_location(location)
        pub = _lookup(run, version)
        return {k: v.clone() for k, v in unpack(pub.manifest(), torch.cat(pub.chunks)).items()}

    def close(self) -> None:
        with _LOCK:
            _RUNS.pop(self.run, None)
