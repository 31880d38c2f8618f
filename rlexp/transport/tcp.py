"""Weight sync over one TCP stream per fetch: the transport for trainer and generators on different hosts.

Why a socket: Monarch actor messages cross hosts at 0.01-0.02x of memcpy (results/perf_cpu.md), because every
chunk is pickled, copied into a message and out again. A TCP stream moves the same bytes with the kernel's
copies only: the trainer's server sends straight from the published buffer (`sendall` of memoryviews, no
user-space copy) and the generator receives straight into its own contiguous buffer (`recv_into`, pinned
memory where CUDA is present so the host-to-device copy is fast too), so a fetch runs at the speed of a plain
socket copy of the same bytes (`rlexp bench`, results/perf_cpu.md). The kernel pipelines the stream: the
server's next `sendall` fills the socket while the receiver drains the last; a checksum thread on the receiver
verifies chunk k (`zlib.crc32`, which releases the GIL) while chunk k+1 arrives.

Trainer side (`TcpTransport`): `publish` packs the HF state dict into one flat buffer (the trainer's one copy:
it goes on training in place while generators read) with per-chunk CRC32s, keeps the newest `keep` versions, and
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
byte count, the per-chunk CRC32s (`checksum`, on by default) and an end mark carrying the version. A trainer that
dies mid-stream gives a closed connection, one that hangs a timeout (`timeout_s` per receive): either way a
`TransportError` that says how many bytes of which version arrived, and nothing is loaded.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import secrets
import socket
import struct
import threading
import uuid
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import torch

from rlexp.transport.base import TransportError, WeightReceiver, WeightSink, WeightTransport, register_transport

URI = "tcp://"
MAGIC, END, PROTOCOL = b"RLXW", b"DONE", 1
_REQUEST = struct.Struct("<4sH16sQ")  # magic, protocol, key, version
REPLY = struct.Struct("<4sBI")  # magic, status (0 ok, 1 refused), header bytes
_TRAILER = struct.Struct("<4sQ")  # END, version: the server sent the whole version
_ALIGN = 64  # byte alignment of each tensor in the flat buffer, so a view of any dtype is legal
_RECV_MAX = 4 * 2**20  # bytes asked of one recv_into
_MAX_HEADER = 64 * 2**20
DEFAULT_TIMEOUT_S = 60.0
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)}


@dataclass(frozen=True)
class Where:
    """A parsed location: where to dial, which version, and the key that opens a request."""

    host: str
    port: int
    run: str
    version: int
    key: bytes

    @property
    def shown(self) -> str:
        """The location without its key (for messages and logs)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{URI}{host}:{self.port}/{quote(self.run, safe='')}/v{self.version}"


def location(host: str, port: int, run: str, version: int, key: bytes) -> str:
    return f"{Where(host, port, run, version, key).shown}?key={key.hex()}"


def parse_location(loc: str) -> Where:
    try:
        u = urlsplit(loc)
        run, v = u.path.lstrip("/").rsplit("/v", 1)
        key = bytes.fromhex(u.query.removeprefix("key="))
        if u.scheme != "tcp" or not u.hostname or u.port is None or len(key) != 16 or not u.query.startswith("key="):
            raise ValueError
        return Where(u.hostname, u.port, unquote(run), int(v), key)
    except ValueError:
        raise TransportError(f"transport=tcp: {loc.split('?')[0]!r} is not a {URI}<address>:<port>/<run>/v<version>"
                             f"?key=<32 hex digits> location (what TcpTransport.publish returns)") from None


@dataclass
class Published:
    """One version: `flat` is never written again while it is registered or read (`readers`)."""

    version: int
    publish_id: str
    header: bytes  # JSON: version, publish_id, total, chunk, entries, crc32
    flat: torch.Tensor  # uint8
    readers: int = 0
    dropped: bool = False


def pack(version: int, sd: dict[str, torch.Tensor], chunk: int, checksum: bool,
         into: torch.Tensor | None = None) -> Published:
    """Copy the state dict into one flat buffer (`into` when its size fits: the dropped version's, already faulted
    in), tensors in name order at 64-byte aligned offsets, padding zeroed; with a CRC32 per `chunk` bytes."""
    entries, off = [], 0
    for k in sorted(sd):
        t = sd[k]
        n = t.numel() * t.element_size()
        if str(t.dtype).removeprefix("torch.") not in DTYPES:
            raise TransportError(f"transport=tcp: {k!r} has dtype {t.dtype}, which this transport does not carry "
                                 f"(it carries {sorted(DTYPES)})")
        entries.append([k, str(t.dtype).removeprefix("torch."), list(t.shape), off, n])
        off += -(-n // _ALIGN) * _ALIGN
    total = off
    flat = into if into is not None and into.numel() == total else torch.empty(total, dtype=torch.uint8)
    for k, _, _, o, n in entries:
        flat[o:o + n].copy_(sd[k].detach().contiguous().reshape(-1).view(torch.uint8))
        flat[o + n:o - (-n // _ALIGN) * _ALIGN].zero_()
    crcs = None
    if checksum:
        mv = memoryview(flat.numpy())
        crcs = [zlib.crc32(mv[s:s + chunk]) for s in range(0, total, chunk)]
    publish_id = uuid.uuid4().hex
    header = {"version": version, "publish_id": publish_id, "total": total, "chunk": chunk, "entries": entries,
              "crc32": crcs}
    return Published(version, publish_id, json.dumps(header).encode(), flat)


def unpack(header: dict[str, Any], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of the flat buffer, one per tensor (no copy); `header` passed `check_header`."""
    return {k: flat[o:o + n].view(DTYPES[d]).view(tuple(shape)) for k, d, shape, o, n in header["entries"]}


def check_header(h: Any, where: Where) -> dict[str, Any]:
    """The reply header, checked before anything is allocated from it: a value the other end sent is data."""
    def bad(why: str) -> TransportError:
        return TransportError(f"transport=tcp: {where.shown} answered a header that {why}; not loading it "
                              f"(is the trainer's rlexp the same version as this generator's?)")

    if not isinstance(h, dict) or not isinstance(h.get("entries"), list):
        raise bad("is not a version manifest")
    if h.get("version") != where.version:
        raise TransportError(f"transport=tcp: asked {where.shown} for version {where.version}, it answered version "
                             f"{h.get('version')}; refusing a mismatched version")
    total, chunk = h.get("total"), h.get("chunk")
    if not (isinstance(total, int) and isinstance(chunk, int) and total >= 0 and chunk > 0):
        raise bad(f"has total {total!r} / chunk {chunk!r}")
    end = 0
    for e in h["entries"]:
        if not (isinstance(e, list) and len(e) == 5 and e[1] in DTYPES and isinstance(e[2], list)
                and all(isinstance(x, int) and x >= 0 for x in (*e[2], e[3], e[4]))):
            raise bad(f"has an entry {str(e)[:200]} (name, dtype, shape, offset, bytes) it cannot be")
        k, d, shape, o, n = e
        if n != math.prod(shape) * DTYPES[d].itemsize or o % _ALIGN or o < end or o + n > total:
            raise bad(f"gives {k!r} ({d}, shape {shape}) {n} bytes at offset {o} of {total}")
        end = o + n
    crcs = h.get("crc32")
    if crcs is not None and (not isinstance(crcs, list) or len(crcs) != -(-total // chunk)):
        raise bad(f"has {len(crcs) if isinstance(crcs, list) else crcs!r} checksums for {-(-total // chunk)} chunks")
    return h


# ----------------------------------------------------------------------------------------------- receiving


def _recv_exact(sock: socket.socket, n: int, what: str, where: Where) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf), what, where)
    return bytes(buf)


def _recv_into(sock: socket.socket, mv: memoryview, what: str, where: Where,
               done: Any = None) -> None:
    """Fill `mv` from `sock`; `done(received)` after each receive. A closed stream or a silent one
    (`sock`'s timeout) raises a TransportError saying how far it got."""
    got, n = 0, len(mv)
    try:
        while got < n:
            r = sock.recv_into(mv[got:], min(n - got, _RECV_MAX))
            if r == 0:
                raise TransportError(f"transport=tcp: the trainer at {where.shown} closed the stream after {got} of "
                                     f"{n} bytes of {what} (did the trainer's process die?); nothing was loaded")
            got += r
            if done is not None:
                done(got)
    except TimeoutError:
        raise TransportError(f"transport=tcp: no data from the trainer at {where.shown} for {sock.gettimeout():g} "
                             f"s after {got} of {n} bytes of {what} (is the trainer's process stopped or the network "
                             f"down? `cluster.transport_options.tcp.timeout_s` sets the wait); nothing was "
                             f"loaded") from None
    except OSError as e:
        raise TransportError(f"transport=tcp: the stream from {where.shown} failed after {got} of {n} bytes of "
                             f"{what}: {e}; nothing was loaded") from None


def open_stream(loc: str, version: int | None = None, timeout_s: float = 60.0,
                rcvbuf: int | None = None) -> tuple[socket.socket, dict[str, Any], Where]:
    """Dial the location, ask for its version and read the reply header: (socket, checked header, where).
    The caller reads the body (`read_body`) and closes the socket. Socket buffers are the kernel's, which grows
    them to the path's bandwidth-delay product (setting one turns that off); `rcvbuf` pins it (tests)."""
    where = parse_location(loc)
    if version is not None and where.version != version:
        raise TransportError(f"transport=tcp: asked to load version {version} from {where.shown}, which holds "
                             f"version {where.version}; refusing a mismatched version")
    try:
        sock = socket.create_connection((where.host, where.port), timeout=timeout_s)
    except OSError as e:
        raise TransportError(f"transport=tcp: cannot connect to the trainer's weight server at {where.shown}: {e} "
                             f"(is the trainer alive, and its address reachable from this host? "
                             f"`cluster.transport_options.tcp.host` sets the address it serves on)") from None
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_REQUEST.pack(MAGIC, PROTOCOL, where.key, where.version))
        magic, status, n = REPLY.unpack(_recv_exact(sock, REPLY.size, "the reply", where))
        if magic != MAGIC or n > _MAX_HEADER:
            raise TransportError(f"transport=tcp: {where.shown} is not an rlexp weight server (bad reply)")
        body = _recv_exact(sock, n, "the reply header", where)
        try:
            h = json.loads(body)
        except ValueError:
            raise TransportError(f"transport=tcp: {where.shown} sent an unreadable header") from None
        if status != 0:
            raise TransportError(f"transport=tcp: {where.shown} refused: {str(h.get('error', h))[:500]}")
        return sock, check_header(h, where), where
    except BaseException:
        sock.close()
        raise


def read_body(sock: socket.socket, h: dict[str, Any], where: Where, into: torch.Tensor | None = None,
              pin: bool = False) -> torch.Tensor:
    """The version's bytes into `into` (reused when its size fits) or a new buffer, checksums verified by a
    second thread chunk by chunk while the next chunks arrive, then the end mark."""
    total, chunk, crcs = h["total"], h["chunk"], h["crc32"]
    flat = into if into is not None and into.numel() == total else torch.empty(total, dtype=torch.uint8,
                                                                              pin_memory=pin)
    mv = memoryview(flat.numpy()) if total else memoryview(bytearray(0))
    what = f"version {where.version} ({total} bytes)"
    # A second thread only when there is a next chunk to overlap with; one chunk is checked inline after it.
    pool = ThreadPoolExecutor(1) if crcs and len(crcs) > 1 else None
    checks: list[Future] = []

    def chunk_done(got: int) -> None:  # hand every complete chunk to the checksum thread
        while pool is not None and len(checks) < len(crcs) and got >= min((len(checks) + 1) * chunk, total):
            k = len(checks)
            checks.append(pool.submit(zlib.crc32, mv[k * chunk:min((k + 1) * chunk, total)]))

    try:
        _recv_into(sock, mv, what, where, chunk_done)
        mark, v = _TRAILER.unpack(_recv_exact(sock, _TRAILER.size, f"the end of {what}", where))
        if mark != END or v != where.version:
            raise TransportError(f"transport=tcp: {where.shown}: the stream of {what} did not end with its end "
                                 f"mark; nothing was loaded")
        if crcs and pool is None:
            checks = [_done(zlib.crc32(mv[:total]))] if total else []
        for k, f in enumerate(checks):
            if f.result() != crcs[k]:
                raise TransportError(f"transport=tcp: chunk {k} of {what} from {where.shown} failed its CRC32 "
                                     f"check: corrupted on the way; nothing was loaded")
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return flat


def _done(value: int) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def fetch(loc: str, version: int | None = None, *, into: torch.Tensor | None = None, timeout_s: float = 60.0,
          pin: bool = False) -> tuple[dict[str, Any], torch.Tensor]:
    """(header, flat buffer) of the version at `loc`; `unpack` gives its tensors."""
    sock, h, where = open_stream(loc, version, timeout_s)
    with sock:
        return h, read_body(sock, h, where, into, pin)


class TcpReceiver(WeightReceiver):
    """Generator side: one stream per version into a buffer kept across versions (the backend copies out of it
    in `load_state_dict`, so the next version can reuse it: no allocation, pages already faulted in)."""

    def __init__(self, run_name: str, settings: dict[str, Any]) -> None:
        super().__init__(run_name, settings)
        self.timeout_s = float(settings.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.pin = torch.cuda.is_available()
        self.buf: torch.Tensor | None = None

    async def afetch(self, version: int, location: str) -> dict[str, torch.Tensor]:
        h, flat = await asyncio.to_thread(fetch, location, version, timeout_s=self.timeout_s, pin=self.pin)
        return unpack(h, flat)

    async def receive(self, version: int, location: str, backend: WeightSink) -> None:
        h, self.buf = await asyncio.to_thread(fetch, location, version, into=self.buf, timeout_s=self.timeout_s,
                                              pin=self.pin)
        backend.load_state_dict(version, unpack(h, self.buf), where=parse_location(location).shown)


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
        try:
            conn.settimeout(self.timeout_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            req = bytearray(_REQUEST.size)
            view, got = memoryview(req), 0
            while got < len(req):
                r = conn.recv_into(view[got:])
                if r == 0:
                    return
                got += r
            magic, proto, key, version = _REQUEST.unpack(req)
            if magic != MAGIC or proto != PROTOCOL or not hmac.compare_digest(key, self.key):
                return self._refuse(conn, "wrong magic, protocol or key: not a request of this run's generators")
            try:
                pub = self.owner.checkout(version)
            except TransportError as e:
                return self._refuse(conn, str(e))
            try:
                conn.sendall(REPLY.pack(MAGIC, 0, len(pub.header)) + pub.header)
                mv = memoryview(pub.flat.numpy()) if pub.flat.numel() else memoryview(b"")
                chunk = self.owner.chunk
                for s in range(0, len(mv), chunk):
                    conn.sendall(mv[s:s + chunk])
                conn.sendall(_TRAILER.pack(END, version))
            finally:
                self.owner.checkin(pub)
        except OSError:
            pass  # the generator hung up or timed out: its fetch reports it; the server goes on
        finally:
            with self.lock:
                self.conns.discard(conn)
            conn.close()

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
    sending and of the CRC32s; `checksum`; `timeout_s`, how long either end waits for the other's next bytes."""

    receiver = TcpReceiver

    def __init__(self, run_name: str, *, keep: int = 2, host: str = "", port: int = 0, chunk_mb: int = 8,
                 checksum: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
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
