"""Reading the shm transport's version files (rlexp.transport.shm writes them): the file format's
names, the memory maps kept across versions by inode (`Mapped`), the torn-read check
(`check_intact`), copies (`fetch`, `fetch_into`) and leases that serve a version from its mapping
(`Lease`).

Serving from the mapping (leases): a copying reader pays a second memcpy, so a sync costs two
copies, at best half a memcpy's bandwidth. A generator that can (the titan backend on CPU) instead
points its parameters at views of the version file's read-only mapping (`Lease`), and the only copy
left is the trainer's write. That is safe only if the file never changes while parameters view it,
and the torn-read check cannot help there (it checks a copy after the fact; a view is read for as
long as the version is served). So the reader holds a shared `flock` on the file for as long as it
serves from it, and the trainer recycles (or deletes, `gc`) a file only under an exclusive lock it
takes without waiting, before renaming the folder out of sight, held until the new version is
renamed in. Refused, it writes a fresh file instead (or recycles another unleased old one) and gc
retries later: a slow generator costs RAM (`keep` + leased versions in the folder), never
correctness, and never blocks the trainer. The reader takes its lock before it checks the version
mark: granted with the expected mark, the file is whole and stays so; a reader that opened the file
just before the trainer took it waits for the trainer's lock and then reads the new mark, and
refuses like a torn copy. A flock dies with its process, so a killed generator frees its file. Views
of a read-only mapping must never be written (SIGSEGV), so a backend gives its parameters their own
storage back before any copying load, and releases a lease only after it has switched to the next
version.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import mmap
import os
import re
import struct
import time
import warnings
from pathlib import Path

import torch

from rlexp.core.weights import (
    IGNORED_SUFFIXES,
    ST_DTYPES,
    TransportError,
    read_hf_state_dict,
    read_hf_state_dict_into,
)

_VERSION_DIR = re.compile(r"^v(\d+)$")
WEIGHTS = "model.safetensors"
MARK = "rlexp_version"
_WRITING = "w" * 20  # the mark while a recycled file is being overwritten (as wide as a version)


def _mark(version: int) -> str:
    return f"{version:020d}"


class Mapped:
    """Files this process keeps memory-mapped across versions, by inode. A mapping outlives the
    file's name (renames, recycling), so a file that was deleted is unmapped at the next `view` (its
    pages would otherwise stay allocated): at most the run's `keep` files stay mapped, and they are
    in RAM anyway.

    Pins: `torch.frombuffer` keeps no buffer export on the mmap, so closing a mapping under live
    tensor views would not fail, it would leave them pointing at unmapped memory (a SIGSEGV on the
    next read). A `Lease` hands its views to a generator's parameters, so it pins its mapping: a
    pinned mapping is never closed, not by `prune` (its file deleted meanwhile), nor by `close`;
    unpinned, it stays cached for reuse when the trainer recycles the same inode (then the next
    lease maps nothing).
    """

    def __init__(self, writable: bool) -> None:
        self.writable = writable
        self.maps: dict[tuple[int, int], tuple[int, mmap.mmap, torch.Tensor]] = {}
        self.pins: dict[tuple[int, int], int] = {}

    def view(self, fd: int, *, pin: bool = False) -> torch.Tensor:
        """The whole file open as `fd` (read-write for a writer) as a uint8 tensor over shared
        pages; a reader's is read-only, never write to it. `pin`: keep it mapped until `unpin` (see
        the class)."""
        self.prune()
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        hit = self.maps.get(key)
        if hit is not None and len(hit[1]) != st.st_size:
            # the trainer recycles only same-layout files, and never a leased one
            if self.pins.get(key):
                raise TransportError("transport=shm: a weights file in use changed size ("
                                     f"{st.st_size} bytes now); only the trainer may write the "
                                     "run's folder")
            self._drop(key)
            hit = None
        if hit is None:
            hit = self.maps[key] = self._map(fd, st.st_size)
        if pin:
            self.pins[key] = self.pins.get(key, 0) + 1
        return hit[2]

    def _map(self, fd: int, size: int) -> tuple[int, mmap.mmap, torch.Tensor]:
        fd = os.dup(fd)  # the mapping's own, closed with it
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.writable else 0)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(fd, size, flags=flags, prot=prot)
        except BaseException:
            os.close(fd)
            raise
        # a reader's mapping is read-only by design; torch warns about that
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(mm, dtype=torch.uint8)
        return fd, mm, t

    def unpin(self, fd: int) -> None:
        """Undo one `view(fd, pin=True)`: the views it handed out are no longer used."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        n = self.pins.get(key, 0) - 1
        if n > 0:
            self.pins[key] = n
        else:
            self.pins.pop(key, None)

    def prune(self) -> None:
        for key, (fd, _, _) in list(self.maps.items()):
            if self.pins.get(key):
                continue
            try:
                gone = os.fstat(fd).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                self._drop(key)

    def _drop(self, key: tuple[int, int]) -> None:
        fd, mm, t = self.maps.pop(key)
        del t
        with contextlib.suppress(BufferError):
            mm.close()
        os.close(fd)

    def close(self) -> None:
        for key in list(self.maps):
            if not self.pins.get(key):
                self._drop(key)


_READ_MAPS = Mapped(writable=False)  # a generator's view of the versions it loads or serves


# a publish holds its exclusive lock for one memcpy; a minute means something else holds it
LEASE_WAIT_S = 60.0


def _lock_shared(fd: int, path: Path, wait_s: float | None = None) -> None:
    """`LOCK_SH` on `fd`, waiting while the trainer overwrites the file, but not forever: a process
    that holds the exclusive lock much longer than any publish takes (a stopped trainer, someone
    else's process) gets a TransportError naming the file, instead of a generator hung in
    `update_weights`."""
    deadline = time.monotonic() + (LEASE_WAIT_S if wait_s is None else wait_s)
    pause = 1e-4
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TransportError(f"transport=shm: {path} has been locked for writing for over "
                                     f"{LEASE_WAIT_S if wait_s is None else wait_s:.0f} s (a "
                                     "publish takes one copy): another process holds it (`fuser "
                                     f"{path}` names it); only the run's trainer may write the "
                                     "run's folder") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)


def read_mark(folder: str | Path) -> str | None:
    """The version mark of a folder's weights file; None for files without one (never overwritten in
    place)."""
    f = Path(folder) / WEIGHTS
    try:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            return json.loads(fh.read(n)).get("__metadata__", {}).get(MARK)
    except (OSError, struct.error, ValueError):
        return None


def check_intact(location: str | Path, version: int | None = None) -> None:
    """Call before and after reading `location` (a `v<version>` folder) as `version`: refuses a
    folder of another version, and one whose file was overwritten in place for a newer version
    meanwhile (the reader fell more than `keep` versions behind), so torn weights are refused, never
    used."""
    p = Path(location)
    m = _VERSION_DIR.match(p.name)
    if m is not None and version is not None and int(m.group(1)) != version:
        raise TransportError(f"transport=shm: asked to load version {version} from {p}, which "
                             f"holds version {m.group(1)}; refusing a mismatched version")
    # renamed away for recycling (or dropped) while it was being read: cannot vouch for it
    if not p.is_dir():
        raise TransportError(f"transport=shm: {p} does not exist (any more): dropped or "
                             "overwritten past `keep` while it was being read; what was read must "
                             "not be used: raise `keep`")
    expected = int(m.group(1)) if m is not None else version
    mark = read_mark(p)
    if expected is not None and mark is not None and mark != _mark(expected):
        raise TransportError(f"transport=shm: {p} was overwritten with a newer version while it "
                             "was being read (the reader was more than `keep` versions behind); "
                             "the weights read are torn and must not be used: load the latest "
                             "version, or raise `keep`")


def fetch(location: str | Path) -> dict[str, torch.Tensor]:
    """`ShmTransport.fetch` for any reader: a copy of the version at `location`, checked intact
    after reading."""
    p = Path(location)
    if not p.is_dir():
        raise TransportError(f"transport=shm: {p} does not exist (garbage-collected? raise `keep`)")
    # copies, not views of a recyclable file
    sd = {k: v.clone() for k, v in read_hf_state_dict(p).items()}
    check_intact(p)
    return sd


def fetch_into(location: str | Path, dest: dict[str, torch.Tensor]) -> set[str]:
    """`ShmTransport.fetch_into` for a reader that does not own the run's folder (generators, bench
    probes)."""
    p = Path(location)
    if not p.is_dir():
        raise TransportError(f"transport=shm: {p} does not exist (garbage-collected? raise `keep`)")
    f = p / WEIGHTS
    # an unmarked (e.g. sharded) folder, or one renamed away just now
    if read_mark(p) is None or not f.is_file():
        keys = read_hf_state_dict_into(p, dest)
        check_intact(p)  # gone meanwhile: what was (or was not) read must not be used
        return keys
    with open(f, "rb", buffering=0) as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        base = 8 + n
        fast, slow = [], []
        for k, meta in header.items():
            if k == "__metadata__":
                continue
            t = dest[k]
            s, e = meta["data_offsets"]
            ok = (t.device.type == "cpu" and t.is_contiguous()
                  and ST_DTYPES.get(meta["dtype"]) == t.dtype
                  and list(t.shape) == meta["shape"])
            (fast if ok else slow).append((k, s, e - s))
        size = os.fstat(fh.fileno()).st_size
        if any(base + s + n > size for _, s, n in fast):
            raise TransportError(f"transport=shm: {f} is truncated")
        view = _READ_MAPS.view(fh.fileno())
        with torch.no_grad():
            for k, s, n in fast:
                dest[k].reshape(-1).view(torch.uint8).copy_(view[base + s:base + s + n])
    if slow:
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as st, torch.no_grad():
            for k, _, _ in slow:
                dest[k].copy_(st.get_tensor(k))
    check_intact(p)
    return {k for k, _, _ in fast + slow}


class Lease:
    """A reader's hold on one version file, serving its tensors as views of the file's read-only
    mapping (no copy).

    Taking it: open the file by its version's path, wait for `LOCK_SH` on that open file
    description, then check the version mark. The order is the point: the trainer overwrites a file
    only while holding `LOCK_EX` on it (`ShmTransport.publish`), so once the shared lock is granted
    and the mark reads this version, the file cannot change until `release`. A reader that opened
    the file just before the trainer took it waits for the trainer's lock, then reads the new
    version's mark and refuses (TransportError, like a torn copy).

    `tensors`: the file's tensors in HF naming, views of the mapping where their offset is aligned
    to their element size (always, for files `Layout` wrote), copies otherwise (`copied` names
    them). The mapping is read-only: writing to a view kills the process (SIGSEGV), so a user must
    give its tensors their own storage back before loading weights by copying. Release only after
    switching to the next version's tensors: the views stay readable until then (the mapping is
    pinned, `Mapped`), and the trainer may recycle the file right after. The kernel drops the lock
    when the process dies, so a killed reader never blocks the trainer.
    """

    def __init__(self, location: str | Path, version: int, maps: Mapped | None = None) -> None:
        p = Path(location)
        m = _VERSION_DIR.match(p.name)
        if m is None or int(m.group(1)) != version:
            raise TransportError(f"transport=shm: asked to serve version {version} from {p}, which "
                                 f"is not a v{version} folder; refusing a mismatched version")
        self.path, self.version, self.maps = p / WEIGHTS, version, maps or _READ_MAPS
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise TransportError(f"transport=shm: {self.path} does not exist (any more): dropped "
                                 "or recycled past `keep` before it could be served; load the "
                                 "latest version, or raise `keep`") from None
        self._fd: int | None = fd
        self.tensors: dict[str, torch.Tensor] = {}
        self.copied: list[str] = []
        try:
            _lock_shared(fd, self.path)  # waits while the trainer overwrites this file
            header, base = self._header(fd)
            mark = header.get("__metadata__", {}).get(MARK)
            if mark != _mark(version):
                raise TransportError(f"transport=shm: {p} holds "
                                     f"{'no marked version' if mark is None else mark} now, not "
                                     f"version {version}: it was recycled for a newer version "
                                     "before it could be served (the reader was more than `keep` "
                                     "versions behind); nothing was loaded: load the latest "
                                     "version, or raise `keep`")
            size = os.fstat(fd).st_size
            whole = self.maps.view(fd, pin=True)
            self._pinned = True
            for k, meta in header.items():
                if k == "__metadata__" or k.endswith(IGNORED_SUFFIXES):
                    continue
                dtype = ST_DTYPES.get(meta.get("dtype"))
                s, e = meta["data_offsets"]
                nbytes = math.prod(meta["shape"]) * (dtype.itemsize if dtype else 0)
                if dtype is None or base + e > size or e - s != nbytes:
                    raise TransportError(f"transport=shm: {self.path}: key {k!r} has dtype "
                                         f"{meta.get('dtype')} or offsets {meta['data_offsets']} "
                                         f"this reader cannot serve (file of {size} bytes); was it "
                                         "written by ShmTransport?")
                raw = whole[base + s:base + e]
                # a view needs an aligned offset: this one is copied
                if (base + s) % dtype.itemsize:
                    raw = raw.clone()
                    self.copied.append(k)
                self.tensors[k] = raw.view(dtype).view(meta["shape"])
        except BaseException:
            self.release()
            raise

    @staticmethod
    def _header(fd: int) -> tuple[dict, int]:
        try:
            n = struct.unpack("<Q", os.pread(fd, 8, 0))[0]
            return json.loads(os.pread(fd, n, 8)), 8 + n
        except (struct.error, ValueError) as e:
            raise TransportError(f"transport=shm: unreadable safetensors header ({e})") from None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drop the lease (idempotent): the views in `tensors` must no longer be in use."""
        fd, self._fd = self._fd, None
        self.tensors = {}
        if fd is None:
            return
        if getattr(self, "_pinned", False):
            self.maps.unpin(fd)
            self._pinned = False
        # Unlock explicitly: the lock belongs to the open file description, which the cached
        # mapping's fd (a dup) shares, so closing this fd alone would leave the file leased for as
        # long as the mapping stays cached.
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def can_serve(location: str | Path) -> bool:
    """Whether `location` can be served by a `Lease`: one marked file (what `Layout` writes), not a
    sharded or unmarked folder (those are copied, `fetch_into`)."""
    return read_mark(location) is not None and (Path(location) / WEIGHTS).is_file()
