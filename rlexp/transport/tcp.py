"""Weight sync over one TCP stream per fetch: the transport for trainer and generators on different hosts.

Why a socket: Monarch actor messages cross hosts at 0.01-0.02x of memcpy
(studies/perf/results/perf_cpu.md), because every chunk is pickled, copied into a message and out again.
A TCP stream moves the same bytes with the kernel's
copies only: the trainer's server sends straight from the published buffer (`sendall` of memoryviews, no
user-space copy) and the generator receives straight into its own contiguous buffer (`recv_into`, pinned
memory where CUDA is present so the host-to-device copy is fast too), so a fetch runs at the speed of a plain
socket copy of the same bytes (`rlexp bench`, studies/perf/results/perf_cpu.md). The kernel pipelines the stream: the
server's next `sendall` fills the socket while the receiver drains the last. A generator keeps its connection
across versions (`Client`), so a sync is one request and its stream: no handshake, no new thread.

Trainer side (`TcpTransport`): `publish` packs the HF state dict into one flat buffer (the trainer's one copy:
it goes on training in place while generators read), keeps the newest `keep` versions, and
a listening socket on this host (a thread per connection) serves them. A published version is immutable: a
re-publish of the same version replaces it whole (a new publish id), and a dropped version's buffer is reused
only once no stream reads it, so a generator never receives torn weights.

Address exchange: the location a publish returns, `tcp://<address>:<port>/<run>/v<version>?key=<hex>`, reaches
each generator in the `update_weights` actor message, so the generator dials only the address Monarch's own
messages told it. The address is the one the trainer's host name resolves to (what Monarch's workers advertise;
loopback on one machine and in tests), or `cluster.transport_options.tcp.host`. The key (16 random bytes per
publisher) must open every request, so another process that finds the port reads nothing.

Integrity: the reply header names the version, publish id, every tensor's dtype, shape and byte range; the
receiver checks the header (known dtypes, sizes that add up, ranges inside the buffer) before allocating, the
byte count, and an end mark carrying the version. CRC32s per chunk are optional (`checksum`, off by default):
one core computes CRC32 at about 4 GB/s, below a 100 Gb/s link's 12.5 GB/s and, on a busy host, enough to cost a
third of the speed (studies/perf/results/perf_cpu.md), while TCP's checksum and the link's frame CRC
already guard the wire;
with it on, a second thread on the receiver checks chunk k while chunk k+1 arrives. A trainer that dies mid-stream
gives a closed connection, one that hangs a timeout (`timeout_s` per receive): either way a `TransportError` that
says how many bytes of which version arrived, and nothing is loaded.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
import struct
import threading
from typing import Any

import torch

from rlexp.transport.base import TransportError, WeightReceiver, WeightSink, WeightTransport, register_transport
from rlexp.transport.tcp_wire import (
    DEFAULT_TIMEOUT_S,
    END,
    MAGIC,
    PROTOCOL,
    REPLY,
    REQUEST,
    TRAILER,
    Client,
    Published,
    kernel_timeouts,
    location,
    pack,
    parse_location,
    send_all,
    unpack,
)


class TcpReceiver(WeightReceiver):
    """Generator side: a `Client` streaming each version into a buffer kept across versions (the backend copies
    out of it in `load_state_dict`, so the next version reuses it: no allocation, pages already faulted in)."""

    def __init__(self, run_name: str, settings: dict[str, Any]) -> None:
        super().__init__(run_name, settings)
        self.client = Client(float(settings.get("timeout_s", DEFAULT_TIMEOUT_S)), pin=torch.cuda.is_available())
        self.buf: torch.Tensor | None = None

    async def afetch(self, version: int, location: str) -> dict[str, torch.Tensor]:
        h, flat = await asyncio.to_thread(self.client.fetch, location, version)
        return unpack(h, flat)  # a buffer of its own: the caller may keep these

    async def receive(self, version: int, location: str, backend: WeightSink) -> None:
        h, self.buf = await asyncio.to_thread(self.client.fetch, location, version, self.buf)
        backend.load_state_dict(version, self.client.tensors(h, self.buf), where=parse_location(location).shown)


# ----------------------------------------------------------------------------------------------- serving


class _Server:
    """A listening socket and a thread per connection; `lookup(version)` / `release(pub)` bracket a send."""

    def __init__(self, host: str, port: int, key: bytes, owner: TcpTransport, timeout_s: float) -> None:
        self.key, self.owner, self.timeout_s = key, owner, timeout_s
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(addr)
        except OSError as e:
            raise TransportError(f"transport=tcp: cannot serve weights on {host}:{port}: {e}; set "
                                 f"cluster.transport_options.tcp.host (an address of the trainer's host the "
                                 f"generators reach) and .port (0: any free port)") from None
        self.sock.listen(64)
        self.sock.settimeout(0.2)  # the accept loop looks at `stopped` this often
        self.address, self.port = self.sock.getsockname()[:2]
        self.stopped = threading.Event()
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.accepter = threading.Thread(target=self._accept, name="rlexp-tcp-weights", daemon=True)
        self.accepter.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            with self.lock:
                self.conns.add(conn)
                self.threads = [t for t in self.threads if t.is_alive()]
                t = threading.Thread(target=self._serve, args=(conn,), name="rlexp-tcp-send", daemon=True)
                self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        """Answer requests on one connection until the generator hangs up: it waits for the next request as long as
        it takes (a step may be long; `close` cuts it), then sends within `timeout_s` per send."""
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # a vanished generator host ends the wait
            kernel_timeouts(conn, self.timeout_s)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))  # requests: any time
            while self._serve_one(conn):
                pass
        except OSError:
            pass  # the generator hung up or timed out: its fetch reports it; the server goes on
        finally:
            with self.lock:
                self.conns.discard(conn)
            conn.close()

    def _serve_one(self, conn: socket.socket) -> bool:
        """One request and its stream; False when the connection is done."""
        req = bytearray(REQUEST.size)
        if conn.recv_into(req, len(req), socket.MSG_WAITALL) < len(req):
            return False  # the generator hung up
        magic, proto, key, version = REQUEST.unpack(req)
        if magic != MAGIC or proto != PROTOCOL or not hmac.compare_digest(key, self.key):
            self._refuse(conn, "wrong magic, protocol or key: not a request of this run's generators")
            return False
        try:
            pub = self.owner.checkout(version)
        except TransportError as e:
            self._refuse(conn, str(e))
            return False
        try:  # header, chunks and end mark in as few calls as can be: each costs the GIL once
            head, tail = REPLY.pack(MAGIC, 0, len(pub.header)) + pub.header, TRAILER.pack(END, version)
            mv = memoryview(pub.flat.numpy()) if pub.flat.numel() else memoryview(b"")
            chunk = self.owner.chunk
            pieces = [mv[s:s + chunk] for s in range(0, len(mv), chunk)] or [mv]
            for i, piece in enumerate(pieces):
                send_all(conn, [head] * (i == 0) + [piece] + [tail] * (i == len(pieces) - 1))
        finally:
            self.owner.checkin(pub)
        return True

    @staticmethod
    def _refuse(conn: socket.socket, why: str) -> None:
        body = json.dumps({"error": why}).encode()
        conn.sendall(REPLY.pack(MAGIC, 1, len(body)) + body)

    def close(self) -> None:
        """Stop accepting, cut the streams in flight (their receivers get a clear error) and join the threads."""
        self.stopped.set()
        self.accepter.join(timeout=5)
        self.sock.close()
        with self.lock:
            conns, threads = list(self.conns), list(self.threads)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in threads:
            t.join(timeout=5)


@register_transport("tcp")
class TcpTransport(WeightTransport):
    """Trainer side: publishes into its own buffers, served on this host by a listening socket (see the module).

    Settings (`cluster.transport_options.tcp`): `host`, the address to serve on and hand to generators ("" this
    host's name, resolved, as Monarch's workers advertise it); `port` (0: any free one); `chunk_mb`, the unit of
    sending and of the CRC32s; `checksum` (CRC32 per chunk, see the module); `timeout_s`, how long either end
    waits for the other's next bytes within a request."""

    receiver = TcpReceiver

    def __init__(self, run_name: str, *, keep: int = 2, host: str = "", port: int = 0, chunk_mb: int = 8,
                 checksum: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        _check_values(keep=keep, port=port, chunk_mb=chunk_mb, timeout_s=timeout_s)
        self.run, self.keep, self.chunk, self.checksum = run_name, keep, chunk_mb * 2**20, checksum
        self.lock = threading.Lock()
        self.versions: dict[int, Published] = {}
        self.spare: torch.Tensor | None = None  # a dropped version's buffer no stream reads: the next publish's
        self.key = secrets.token_bytes(16)
        self.listener = _Server(host or socket.gethostname(), port, self.key, self, timeout_s)

    @classmethod
    def check(cls, settings: dict[str, Any], *, hosts: int = 1) -> None:
        super().check(settings, hosts=hosts)
        try:
            _check_values(**{k: settings[k] for k in ("port", "chunk_mb", "timeout_s") if k in settings})
        except ValueError as e:
            raise TransportError(str(e)) from None

    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        with self.lock:
            spare, self.spare = self.spare, None
        pub = pack(version, hf_state_dict, self.chunk, self.checksum, into=spare)
        with self.lock:
            old = self.versions.pop(version, None)  # a re-publish replaces the version whole (new publish id)
            self.versions[version] = pub
            dropped = [old] if old is not None else []
            dropped += [self.versions.pop(v) for v in sorted(self.versions)[: max(0, len(self.versions) - self.keep)]]
            for p in dropped:
                p.dropped = True
                if p.readers == 0 and self.spare is None:
                    self.spare = p.flat
        return location(self.listener.address, self.listener.port, self.run, version, self.key)

    def checkout(self, version: int) -> Published:
        """The version a stream is about to send; it stays unwritten until `checkin`."""
        with self.lock:
            pub = self.versions.get(version)
            if pub is None:
                raise TransportError(f"version {version} of run {self.run!r} is not published (have "
                                     f"{sorted(self.versions)}): dropped past `keep`, or not pushed yet")
            pub.readers += 1
            return pub

    def checkin(self, pub: Published) -> None:
        with self.lock:
            pub.readers -= 1
            if pub.dropped and pub.readers == 0 and self.spare is None:
                self.spare = pub.flat

    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        """In-process read (tests): a copy of the version this publisher holds."""
        pub = self.checkout(parse_location(location).version)
        try:
            return {k: v.clone() for k, v in unpack(json.loads(pub.header), pub.flat).items()}
        finally:
            self.checkin(pub)

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            self.versions.clear()
            self.spare = None


def _check_values(keep: int = 1, port: int = 0, chunk_mb: int = 8, timeout_s: float = 1.0) -> None:
    if keep < 1:
        raise ValueError("keep must be >= 1")
    if not 0 <= port < 65536:
        raise ValueError(f"cluster.transport_options.tcp.port={port}: give 0 (any free port) or a port below 65536")
    if chunk_mb < 1:
        raise ValueError(f"cluster.transport_options.tcp.chunk_mb={chunk_mb}: give at least 1 (MiB per send and "
                         f"per checksum)")
    if not timeout_s > 0:
        raise ValueError(f"cluster.transport_options.tcp.timeout_s={timeout_s}: give seconds > 0")
