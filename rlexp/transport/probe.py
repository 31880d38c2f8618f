"""A Monarch actor that measures the transports between two processes (`rlexp bench`'s transport rows).

One probe publishes (the trainer's side), another on a different process fetches the way a generator does
(the generator's side), so each measurement crosses a process boundary the way a run does. The state dict is
made inside the probe, not sent to it, so only the transport moves the bytes. For shm, two ways: `serve` takes
a lease and serves the version file's tensors from its mapping (`rlexp.transport.shm.Lease`, what the titan
generator does), `copy` copies it into weights the probe has already allocated (what other backends pay).
For tcp, `copy` streams into the probe's receive buffer, kept across versions, and views its tensors (what a
generator hands to `load_state_dict`); `plain_serve` / `plain_fetch` are its baseline, one `sendall` of the
same bytes read with `recv_into` between the same two processes.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import torch
from monarch.actor import Actor, endpoint

from rlexp.transport.base import WeightTransport


def synthetic_hf_state_dict(total_mb: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """bf16 tensors shaped like Qwen3-0.6B's MLP weights (3072 x 1024, 6 MiB each) up to `total_mb`."""
    g = torch.Generator().manual_seed(seed)
    per = 3072 * 1024 * 2
    n = max(1, total_mb * 2**20 // per)
    return {f"model.layers.{i // 3}.mlp.{('gate', 'up', 'down')[i % 3]}_proj.weight":
            torch.randn(3072, 1024, generator=g).to(torch.bfloat16) for i in range(n)}


class TransportProbe(Actor):
    def __init__(self, run_name: str, total_mb: int, shm_root: str | None = None,
                 chunk_bytes: int | None = None, checkpoint: str | None = None, threads: int | None = None) -> None:
        """`checkpoint`: a model folder whose weights are the state dict (the tiny model's), else `total_mb` of
        synthetic ones. `threads`: torch's intra-op threads here; 1 keeps the bit-for-bit checks between timed
        fetches from leaving an OpenMP pool spinning on the cores the next fetch needs (sub-millisecond fetches
        measured 3-10x slower right after one on a 2-core host)."""
        from rlexp.core.weights import read_hf_state_dict

        if threads:
            torch.set_num_threads(threads)

        self.run_name, self.total_mb, self.shm_root, self.chunk_bytes = run_name, total_mb, shm_root, chunk_bytes
        self.sd = read_hf_state_dict(checkpoint) if checkpoint else synthetic_hf_state_dict(total_mb)
        self.params = {k: torch.zeros_like(v) for k, v in self.sd.items()}  # the generator's own weights
        self.transports: dict[str, WeightTransport] = {}
        self.client: Any = None
        self.tcp_clients: dict[tuple[str, int], Any] = {}  # rlexp.transport.tcp_wire.Client per server
        self.served: dict[str, torch.Tensor] | None = None  # the weights a `serve` fetch switched to
        self.lease: Any = None  # the lease behind them, released after the next switch
        self.buf: torch.Tensor | None = None  # tcp: the receive buffer, reused across versions
        self.plain: socket.socket | None = None  # the baseline's listening socket
        self.plain_buf: torch.Tensor | None = None
        self.plain_conn: socket.socket | None = None

    @endpoint
    async def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.sd.values())

    @endpoint
    async def publish(self, name: str, version: int, options: dict[str, Any] | None = None) -> tuple[str, float]:
        """`options`: settings beyond the probe's (a second instance of the transport, e.g. tcp with checksums)."""
        from rlexp.transport.registry import build_transport

        key = f"{name}{sorted((options or {}).items())}"
        if key not in self.transports:
            # keep=2: what a run keeps at least, and what lets shm reuse the dropped version's pages
            settings = {"shm": {"root": self.shm_root}, "monarch": {"chunk_bytes": self.chunk_bytes},
                        "tcp": {"host": "127.0.0.1"}}.get(name, {})
            settings = {**{k: v for k, v in settings.items() if v is not None}, **(options or {})}
            self.transports[key] = build_transport(name, self.run_name, keep=2, **settings)
        t0 = time.perf_counter()
        loc = await self.transports[key].apublish(version, self.sd)
        return loc, time.perf_counter() - t0

    @endpoint
    async def fetch(self, name: str, version: int, location: str, server: Any = None, mode: str = "copy") -> float:
        """Seconds to get `location` in use the way a generator does: `serve` (shm only) switches to the version
        file's mapped tensors under a lease and releases the previous lease; `copy` fills this probe's own weights."""
        from rlexp.transport import tcp_wire as tcp
        from rlexp.transport.monarch import MonarchWeightClient
        from rlexp.transport.shm import Lease, fetch_into

        if mode not in ("copy", "serve") or (mode == "serve" and name != "shm"):
            raise ValueError(f"probe: no {mode!r} fetch for transport {name!r} (serve is shm's; copy any)")
        t0 = time.perf_counter()
        if mode == "serve":
            lease = Lease(location, version)
            self.served = lease.tensors  # the switch
            self._release()
            self.lease = lease
        elif name == "shm":
            self._release()
            fetch_into(location, self.params)
        elif name == "monarch":
            self._release()
            self.client = self.client or MonarchWeightClient(server)
            for k, v in (await self.client.afetch(location, version)).items():
                self.params[k].copy_(v)
        elif name == "tcp":
            self._release()
            w = tcp.parse_location(location)  # a client per server: each keeps its connection
            client = self.tcp_clients.setdefault((w.host, w.port), tcp.Client())
            h, self.buf = client.fetch(location, version, self.buf)
            self.served = client.tensors(h, self.buf)
        else:
            raise ValueError(f"probe: no fetch for transport {name!r}")
        return time.perf_counter() - t0

    def _release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    @endpoint
    async def check_and_clear(self) -> bool:
        """Whether the weights in use equal the published ones bit for bit (both probes build the same synthetic
        state dict; the baseline's bytes too, when it ran); then clear them so the next fetch is checked afresh
        (own weights zeroed, served ones dropped: the mapping is read-only)."""
        got, self.served = (self.served, None) if self.served is not None else (self.params, None)
        ok = sorted(got) == sorted(self.sd) and all(
            torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)) for k, v in self.sd.items())
        if self.plain_buf is not None and not torch.equal(self.plain_buf, self._flat()):
            raise RuntimeError("probe: the baseline socket delivered different bytes than were sent")
        for v in self.params.values():
            v.zero_()
        for b in (self.buf, self.plain_buf):
            if b is not None:
                b.zero_()
        return ok

    def _flat(self) -> torch.Tensor:
        """The state dict's bytes back to back (the baseline's payload: exactly as many bytes)."""
        return torch.cat([v.reshape(-1).view(torch.uint8) for v in self.sd.values()])

    @endpoint
    async def plain_serve(self) -> tuple[str, int]:
        """The baseline's sender: a listening socket on loopback; on a connection, each request byte is answered
        with the state dict's bytes in one `sendall`. Returns (address, port)."""
        flat = self._flat()
        self.plain = socket.create_server(("127.0.0.1", 0))

        def serve(lsock: socket.socket) -> None:
            while True:
                try:
                    conn, _ = lsock.accept()
                except OSError:
                    return
                with conn:
                    while conn.recv(1):
                        conn.sendall(memoryview(flat.numpy()))

        threading.Thread(target=serve, args=(self.plain,), daemon=True).start()
        return self.plain.getsockname()[:2]

    @endpoint
    async def plain_fetch(self, host: str, port: int) -> float:
        """Seconds to ask for the baseline's bytes and `recv_into` all of them (into a buffer kept across calls), on
        a connection kept across calls, as the tcp transport's `Client` keeps its own."""
        n = sum(v.numel() * v.element_size() for v in self.sd.values())
        if self.plain_buf is None:
            self.plain_buf = torch.empty(n, dtype=torch.uint8)
            self.plain_conn = socket.create_connection((host, port), timeout=60)
            self.plain_conn.settimeout(None)  # blocking: Python polls before each call on a socket with a timeout
        mv = memoryview(self.plain_buf.numpy())
        t0 = time.perf_counter()
        self.plain_conn.sendall(b"x")
        got = 0
        while got < n:
            r = self.plain_conn.recv_into(mv[got:], min(n - got, 4 * 2**20))
            if r == 0:
                raise ConnectionError(f"probe: the baseline stream ended after {got} of {n} bytes")
            got += r
        return time.perf_counter() - t0  # checked by `check_and_clear`: no torch work between two timed fetches

    @endpoint
    async def close(self) -> None:
        for c in self.tcp_clients.values():
            c.close()
        if self.plain_conn is not None:
            self.plain_conn.close()
        if self.plain is not None:
            with contextlib.suppress(OSError):  # wakes the accept loop (a close alone would not)
                self.plain.shutdown(socket.SHUT_RDWR)
            self.plain.close()
        self.served = None
        self._release()
        for t in self.transports.values():
            t.close()
