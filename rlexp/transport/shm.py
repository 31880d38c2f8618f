"""Weight sync through shared memory: HF safetensors under /dev/shm/<run>/v<version>/.

Why files and not a socket: vLLM reloads weights from a folder (`reload_weights(weights_path=...)`)
and the `titan` backend memory-maps the same safetensors, so one format serves both, and a
crashed generator can always re-read the newest version. /dev/shm is RAM-backed, so a publish costs
one memcpy-speed write and every reader on the host shares the same pages.

Atomicity: a version is written into a hidden temporary folder and renamed into place (rename is
atomic on one filesystem), so a `v<version>` folder is always complete; `LATEST` is replaced
atomically after it. Old versions beyond `keep` are deleted on publish; with async (off-policy)
generation keep at least max policy lag + 2 so no generator loses the version it is loading.

Recycled pages: writing into fresh tmpfs pages costs page faults (about 6x a memcpy into faulted
memory, studies/perf/results/bench_cpu.md), so a publish that would drop the oldest version (and leaves at least one
other complete version readable meanwhile) takes that version's folder instead: renamed out of sight
(opening it by path now fails), its single safetensors file overwritten in place (same layout: same names,
shapes, dtypes), then renamed in as the new version. Writer and readers keep such files memory-mapped
(`Mapped`): a recycled file keeps its inode, so after the first round a publish or a fetch is one plain
memcpy through mapped pages, with no page faults and no system call per piece. A reader that opened the old
file before the rename could see it change, so each file carries its version in the safetensors
metadata (`rlexp_version`, fixed width), set to a "writing" mark before the data is overwritten and to
the new version after; readers check it after reading (`check_intact`) and refuse torn weights.

Serving from the mapping (leases): a copying reader pays a second memcpy, so a sync costs two copies, at best half a
memcpy's bandwidth. A generator that can (the titan backend on CPU) instead points its parameters at views of the
version file's read-only mapping (`Lease`), and the only copy left is the trainer's write. That is safe only if the
file never changes while parameters view it, and the torn-read check cannot help there (it checks a copy after the
fact; a view is read for as long as the version is served). So the reader holds a shared `flock` on the file for as
long as it serves from it, and the trainer recycles (or deletes, `gc`) a file only under an exclusive lock it takes
without waiting, before renaming the folder out of sight, held until the new version is renamed in. Refused, it
writes a fresh file instead (or recycles another unleased old one) and gc retries later: a slow generator costs
RAM (`keep` + leased versions in the folder), never correctness, and never blocks the trainer. The reader takes its
lock before it checks the version mark: granted with the expected mark, the file is whole and stays so; a reader
that opened the file just before the trainer took it waits for the trainer's lock and then reads the new mark, and
refuses like a torn copy. A flock dies with its process, so a killed generator frees its file. Views of a read-only
mapping must never be written (SIGSEGV), so a backend gives its parameters their own storage back before any
copying load, and releases a lease only after it has switched to the next version.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import mmap
import os
import re
import shutil
import stat
import struct
import tempfile
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlexp.core.weights import (
    IGNORED_SUFFIXES,
    ST_DTYPES,
    ST_NAMES,
    TransportError,
    read_hf_state_dict,
    read_hf_state_dict_into,
    staging_root,
    write_hf_state_dict,
)
from rlexp.transport.base import WeightReceiver, WeightSink, WeightTransport, register_transport

LATEST = "LATEST"
_VERSION_DIR = re.compile(r"^v(\d+)$")
WEIGHTS = "model.safetensors"
MARK = "rlexp_version"
_WRITING = "w" * 20  # the mark while a recycled file is being overwritten (as wide as a version)
_THREADS = max(1, min(4, os.cpu_count() or 1))  # parallel pwrite of a fresh file: one kernel copy per thread


def _mark(version: int) -> str:
    return f"{version:020d}"


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _pwrite_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], offset + done)


def _parallel(fn, items: list) -> None:
    """Large copies split over threads: os.pwrite releases the GIL, so each runs a kernel copy."""
    if len(items) < 2 or _THREADS == 1:
        for it in items:
            fn(it)
        return
    with ThreadPoolExecutor(_THREADS) as pool:
        list(pool.map(fn, items))


class Mapped:
    """Files this process keeps memory-mapped across versions, by inode. A mapping outlives the file's name
    (renames, recycling), so a file that was deleted is unmapped at the next `view` (its pages would otherwise
    stay allocated): at most the run's `keep` files stay mapped, and they are in RAM anyway.

    Pins: `torch.frombuffer` keeps no buffer export on the mmap, so closing a mapping under live tensor views
    would not fail, it would leave them pointing at unmapped memory (a SIGSEGV on the next read). A `Lease`
    hands its views to a generator's parameters, so it pins its mapping: a pinned mapping is never closed,
    not by `prune` (its file deleted meanwhile), nor by `close`; unpinned, it stays cached for reuse when the
    trainer recycles the same inode (then the next lease maps nothing)."""

    def __init__(self, writable: bool) -> None:
        self.writable = writable
        self.maps: dict[tuple[int, int], tuple[int, mmap.mmap, torch.Tensor]] = {}
        self.pins: dict[tuple[int, int], int] = {}

    def view(self, fd: int, *, pin: bool = False) -> torch.Tensor:
        """The whole file open as `fd` (read-write for a writer) as a uint8 tensor over shared pages; a
        reader's is read-only, never write to it. `pin`: keep it mapped until `unpin` (see the class)."""
        self.prune()
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        hit = self.maps.get(key)
        if hit is not None and len(hit[1]) != st.st_size:
            if self.pins.get(key):  # the trainer recycles only same-layout files, and never a leased one
                raise TransportError(f"transport=shm: a weights file in use changed size ({st.st_size} bytes now); "
                                     f"only the trainer may write the run's folder")
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
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=prot)
        except BaseException:
            os.close(fd)
            raise
        with warnings.catch_warnings():  # a reader's mapping is read-only by design; torch warns about that
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


def _pieces(entries: list[tuple[str, int, int]], size: int = 8 * 2**20) -> list[tuple[str, int, int]]:
    """(key, start, stop) byte ranges of at most `size`, so threads share big tensors too."""
    return [(k, s, min(s + size, n)) for k, _, n in entries for s in range(0, n, size)]


@dataclass
class Layout:
    """One-file safetensors layout of a state dict, with a fixed-width version mark in its metadata, so a
    file of the same names/shapes/dtypes can be overwritten in place (see the module docstring)."""

    header: bytes  # 8-byte length + JSON (mark placeholder), padded to 8 bytes
    mark_at: int  # byte offset of the mark's value in the file
    entries: list[tuple[str, int, int]]  # (key, data offset from the data start, nbytes)

    @staticmethod
    def of(sd: dict[str, torch.Tensor]) -> Layout:
        """Entries in the state dict's own order, larger elements first. Why: a reader serves tensors as views of
        the mapped file (`Lease`), and a view needs its byte offset to be a multiple of its element size; element
        sizes are powers of two and the data starts 8-aligned, so largest-first keeps every offset aligned. The
        dict's order (stable within one element size) keeps tensors the model fuses next to each other (the
        trainer's q, k and v projections), so a generator can serve the fused weight as one view too."""
        meta: dict = {"__metadata__": {"format": "pt", MARK: _WRITING}}
        entries, off = [], 0
        for k in sorted(sd, key=lambda k: -sd[k].element_size()):  # stable: the dict's order within a size
            t = sd[k]
            n = t.numel() * t.element_size()
            meta[k] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
            entries.append((k, off, n))
            off += n
        js = json.dumps(meta, separators=(",", ":")).encode()
        js += b" " * (-len(js) % 8)
        header = struct.pack("<Q", len(js)) + js
        return Layout(header, header.index(f'"{MARK}":"{_WRITING}"'.encode()) + len(MARK) + 4, entries)

    @property
    def size(self) -> int:
        return len(self.header) + sum(n for _, _, n in self.entries)

    def matches(self, path: Path) -> bool:
        """Whether `path` has exactly this layout (only its mark may differ): safe to overwrite in place."""
        try:
            if path.stat().st_size != self.size:
                return False
            with open(path, "rb") as fh:
                old = fh.read(len(self.header))
        except OSError:
            return False
        cut = slice(self.mark_at, self.mark_at + len(_WRITING))
        return old[:cut.start] == self.header[:cut.start] and old[cut.stop:] == self.header[cut.stop:]

    def write(self, path: Path, version: int, sd: dict[str, torch.Tensor], *, fresh: bool,
              maps: Mapped | None = None) -> None:
        """Mark "writing", write the data, then mark `version`. A fresh file is written with `pwrite` (threads
        share the copy); a recycled one through its mapping in `maps`, a memcpy into pages mapped already."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC if fresh else os.O_RDWR, 0o644)
        try:
            _pwrite_all(fd, self.header, 0)  # carries the "writing" mark
            base = len(self.header)
            if fresh or maps is None:
                offsets = {k: off for k, off, _ in self.entries}
                _parallel(lambda p: _pwrite_all(fd, _bytes(sd[p[0]])[p[1]:p[2]], base + offsets[p[0]] + p[1]),
                          _pieces(self.entries))
            else:
                view = maps.view(fd)
                for k, off, n in self.entries:
                    view[base + off:base + off + n].copy_(sd[k].reshape(-1).view(torch.uint8))
            _pwrite_all(fd, _mark(version).encode(), self.mark_at)
        finally:
            os.close(fd)


def _lock_exclusive(path: Path) -> int | None:
    """An fd of `path` holding `LOCK_EX`, taken without waiting, or None when a generator holds a lease on it
    (`Lease`); raises FileNotFoundError when there is no such file. Closing the fd releases the lock."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


LEASE_WAIT_S = 60.0  # a publish holds its exclusive lock for one memcpy; a minute means something else holds it


def _lock_shared(fd: int, path: Path, wait_s: float | None = None) -> None:
    """`LOCK_SH` on `fd`, waiting while the trainer overwrites the file, but not forever: a process that holds
    the exclusive lock much longer than any publish takes (a stopped trainer, someone else's process) gets a
    TransportError naming the file, instead of a generator hung in `update_weights`."""
    deadline = time.monotonic() + (LEASE_WAIT_S if wait_s is None else wait_s)
    pause = 1e-4
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TransportError(f"transport=shm: {path} has been locked for writing for over "
                                     f"{LEASE_WAIT_S if wait_s is None else wait_s:.0f} s (a publish takes one copy): "
                                     f"another process holds it (`fuser {path}` names it); only the run's trainer "
                                     f"may write the run's folder") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)


def read_mark(folder: str | Path) -> str | None:
    """The version mark of a folder's weights file; None for files without one (never overwritten in place)."""
    f = Path(folder) / WEIGHTS
    try:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            return json.loads(fh.read(n)).get("__metadata__", {}).get(MARK)
    except (OSError, struct.error, ValueError):
        return None


def check_intact(location: str | Path, version: int | None = None) -> None:
    """Call before and after reading `location` (a `v<version>` folder) as `version`: refuses a folder of
    another version, and one whose file was overwritten in place for a newer version meanwhile (the reader
    fell more than `keep` versions behind), so torn weights are refused, never used."""
    p = Path(location)
    m = _VERSION_DIR.match(p.name)
    if m is not None and version is not None and int(m.group(1)) != version:
        raise TransportError(f"transport=shm: asked to load version {version} from {p}, which holds version "
                             f"{m.group(1)}; refusing a mismatched version")
    if not p.is_dir():  # renamed away for recycling (or dropped) while it was being read: cannot vouch for it
        raise TransportError(f"transport=shm: {p} does not exist (any more): dropped or overwritten past `keep` "
                             f"while it was being read; what was read must not be used: raise `keep`")
    expected = int(m.group(1)) if m is not None else version
    mark = read_mark(p)
    if expected is not None and mark is not None and mark != _mark(expected):
        raise TransportError(f"transport=shm: {p} was overwritten with a newer version while it was being read "
                             f"(the reader was more than `keep` versions behind); the weights read are torn and "
                             f"must not be used: load the latest version, or raise `keep`")


default_root = staging_root  # /dev/shm when the host has one, else the temp dir
# In every run folder the shm transport creates: cleanup (a crashed run's leftovers, a run's own folder at the end)
# deletes only folders holding it, never what else lies in `cluster.shm_dir` (a folder the user, or a manifest
# someone sent, may have pointed anywhere).
OWNER = ".rlexp-weights"


def owned(folder: str | Path) -> bool:
    """A folder rlexp's shm transport made: a real folder (not a link), this user's, holding the `OWNER` file."""
    try:
        st, mark = os.lstat(folder), os.lstat(Path(folder) / OWNER)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and stat.S_ISREG(mark.st_mode) and st.st_uid == os.getuid()


def remove_owned(folder: str | Path) -> bool:
    """Delete `folder` when `owned`; anything else is left alone. True when it was deleted."""
    if not owned(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def check_shm(*, hosts: int = 1, root: str | Path | None = None, need_bytes: int | None = None) -> None:
    if hosts > 1:
        raise TransportError(f"cluster.transport=shm needs the trainer and every generator on one host, but the "
                             f"layout spans {hosts} hosts (/dev/shm is per host): use cluster.transport=auto (shm "
                             f"where a pair shares a host, tcp across hosts) or cluster.transport=tcp")
    r = Path(root) if root else default_root()
    if not r.is_dir() or not os.access(r, os.W_OK):
        raise TransportError(f"transport=shm: {r} is not a writable folder")
    if need_bytes is not None:
        free = shutil.disk_usage(r).free
        if need_bytes > free:
            raise TransportError(f"transport=shm: needs {need_bytes / 2**30:.1f} GiB in {r} (weights x versions kept), "
                                 f"only {free / 2**30:.1f} GiB free; in Docker raise --shm-size, or lower `keep`")


class ShmReceiver(WeightReceiver):
    """Generator side. A backend that can serve weights straight from the mapped version file (`serve_mapped`, the
    titan backend on CPU) gets the tensors of a `Lease` and keeps the lease until it has switched to the next
    version: one copy per sync (the trainer's write) instead of two. Otherwise (vLLM, a sharded or unmarked
    folder, `zero_copy=false`, or a backend that declines: GPU, other dtypes) the backend reads the folder itself
    (vLLM reloads from a folder; titan copies), checked intact before and after, so torn weights are refused,
    never counted as loaded."""

    async def afetch(self, version: int, location: str) -> dict[str, torch.Tensor]:
        check_intact(location, version)
        return fetch(location)

    async def receive(self, version: int, location: str, backend: WeightSink) -> None:
        if not os.path.isdir(location):
            raise FileNotFoundError(f"generator: weights for version {version} are not at {location}")
        serve = getattr(backend, "serve_mapped", None)
        if serve is not None and self.settings.get("zero_copy", True) and can_serve(location):
            lease = Lease(location, version)  # refuses a file recycled meanwhile, before anything is loaded
            try:
                if serve(version, lease.tensors, lease.release):
                    return  # the backend releases the lease once it serves another version
            except BaseException:
                lease.release()
                raise
            lease.release()
        check_intact(location, version)
        backend.load_folder(version, location, check=lambda: check_intact(location, version))


@register_transport("shm")
class ShmTransport(WeightTransport):
    receiver = ShmReceiver
    one_host = True  # /dev/shm is per host
    leaves_files = True  # a run killed with -9 leaves its folder in RAM: `release_stale` frees it

    @classmethod
    def release_stale(cls, settings: dict[str, Any]) -> None:
        """Remove weights published by runs that died without tearing down (kill -9, OOM): folder
        names end in the controller's pid, so a folder whose process is gone belongs to nobody. Only
        folders this transport made (`owned`: its marker file, this user's, no link) are touched:
        whatever else `root` holds is never deleted."""
        root = Path(settings["root"])
        if not root.is_dir():
            return
        for d in root.iterdir():
            pid = d.name.rsplit("-", 1)[-1]
            if not pid.isdigit() or int(pid) == os.getpid() or not owned(d):
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                remove_owned(d)
            except PermissionError:  # alive, another user's
                pass

    @classmethod
    def release(cls, settings: dict[str, Any], run_name: str) -> None:
        """Remove the run's published weights (RAM-backed /dev/shm), also when the trainer died
        first."""
        remove_owned(Path(settings["root"]) / run_name)

    @classmethod
    def settings(cls, cfg: Any) -> dict[str, Any]:
        """`cluster.shm_dir`, plus `cluster.transport_options.shm` (e.g. `zero_copy: false`, checked by `check`)."""
        options = getattr(cfg.cluster, "transport_options", None) or {}
        return {"root": cfg.cluster.shm_dir, **dict(options.get("shm") or {})}

    @classmethod
    def check(cls, settings: dict[str, Any], *, hosts: int = 1) -> None:
        super().check(settings, hosts=hosts)
        if not isinstance(settings.get("zero_copy", True), bool):
            raise TransportError(f"cluster.transport_options.shm.zero_copy={settings['zero_copy']!r}: give true "
                                 f"(generators serve from the mapped file) or false (they copy it)")
        check_shm(hosts=hosts)

    def __init__(self, run_name: str, *, root: str | Path | None = None, keep: int = 2,
                 config: dict | None = None, max_shard_bytes: int = 5 * 2**30, zero_copy: bool = True) -> None:
        """`zero_copy` is the generators' setting (`ShmReceiver`): taken here so `check` can vouch for it."""
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.dir = (Path(root) if root else default_root()) / run_name
        self.keep = keep
        self.config = config  # written as config.json next to the weights when given
        self.max_shard_bytes = max_shard_bytes
        self.maps = Mapped(writable=True)  # the version files this writer recycles
        # A folder left by a crashed run of the same name holds versions this trainer did not write; keeping
        # them would make `gc` delete the newest real version (it sorts by number). The trainer owns the folder,
        # but deletes one only when rlexp made it (`owned`): anything else of that name is refused.
        if (self.dir.exists() or self.dir.is_symlink()) and not remove_owned(self.dir):
            raise TransportError(f"transport=shm: {self.dir} exists and was not made by rlexp (no {OWNER} in it); "
                                 f"rlexp deletes only its own folders: move it away or choose another "
                                 f"cluster.shm_dir")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / OWNER).write_text(f"{os.getpid()}\n")

    def version_dir(self, version: int) -> Path:
        return self.dir / f"v{version}"

    def versions(self) -> list[int]:
        out = []
        for p in self.dir.iterdir() if self.dir.exists() else ():
            m = _VERSION_DIR.match(p.name)
            if m and p.is_dir():
                out.append(int(m.group(1)))
        return sorted(out)

    def _recyclable(self, version: int, layout: Layout) -> tuple[Path, int] | None:
        """A version folder this publish would drop anyway (oldest first), of this exact layout, that no generator
        serves from, with the exclusive lock on its file that proves it (the caller closes the returned fd after
        renaming the folder in as the new version); None when there is none, and the publish writes a fresh file.
        Another complete version always stays readable meanwhile (the newest is never taken)."""
        vs = self.versions()
        if version in vs or len(vs) < 2 or len(vs) + 1 <= self.keep:
            return None
        for v in vs[: min(len(vs) - 1, len(vs) + 1 - self.keep)]:
            old = self.version_dir(v)
            if not layout.matches(old / WEIGHTS):
                continue
            with contextlib.suppress(FileNotFoundError):
                fd = _lock_exclusive(old / WEIGHTS)
                if fd is not None:
                    return old, fd
        return None

    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        sd = {k: v.detach().to("cpu").contiguous() for k, v in hf_state_dict.items()}
        need = sum(t.numel() * t.element_size() for t in sd.values())
        layout = Layout.of(sd) if need <= self.max_shard_bytes and all(t.dtype in ST_NAMES for t in sd.values()) \
            else None
        taken = self._recyclable(version, layout) if layout is not None else None
        recycled, lock = taken if taken is not None else (None, None)
        try:
            free = shutil.disk_usage(self.dir).free
            if need > free and recycled is None:
                raise TransportError(f"transport=shm: version {version} needs {need / 2**30:.2f} GiB in {self.dir}, "
                                     f"{free / 2**30:.2f} GiB free (versions still served by a generator are kept "
                                     f"past `keep`); in Docker raise --shm-size, or lower `keep`")
            if recycled is not None:
                tmp = self.dir / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
                os.rename(recycled, tmp)  # from here, opening the old version by path fails ("does not exist")
            else:
                tmp = Path(tempfile.mkdtemp(prefix=f".tmp-v{version}-", dir=self.dir))
            try:
                if layout is not None:
                    layout.write(tmp / WEIGHTS, version, sd, fresh=recycled is None, maps=self.maps)
                else:
                    write_hf_state_dict(sd, tmp, max_shard_bytes=self.max_shard_bytes)
                if self.config is not None and not (tmp / "config.json").exists():
                    (tmp / "config.json").write_text(json.dumps(self.config, indent=2))
                final = self.version_dir(version)
                if final.exists():  # re-publishing a version (e.g. after a trainer restart): swap it out
                    trash = Path(tempfile.mkdtemp(prefix=f".old-v{version}-", dir=self.dir))
                    os.rename(final, trash / "v")
                    shutil.rmtree(trash, ignore_errors=True)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            if lock is not None:  # after the rename in: a reader waiting for its lease now sees the new mark
                os.close(lock)
        latest_tmp = self.dir / f".{LATEST}.{os.getpid()}"
        latest_tmp.write_text(str(version))
        os.replace(latest_tmp, self.dir / LATEST)
        self.gc()
        return str(final)

    def latest(self) -> tuple[int, str] | None:
        """The newest complete version, for a generator that (re)starts mid-run."""
        try:
            v = int((self.dir / LATEST).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return v, str(self.version_dir(v))

    def gc(self) -> None:
        """Delete the versions past `keep`, except those a generator still serves from (its lease refuses the
        exclusive lock): deleting one would not hurt the generator (its mapping keeps the pages), but its RAM would
        then be invisible in the folder. A later gc retries, so the folder holds `keep` + leased versions."""
        vs = self.versions()
        for v in vs[: max(0, len(vs) - self.keep)]:
            folder = self.version_dir(v)
            try:
                lock = _lock_exclusive(folder / WEIGHTS)
                if lock is None:
                    continue  # leased
            except FileNotFoundError:  # a sharded (never leased) version
                lock = None
            try:
                shutil.rmtree(folder, ignore_errors=True)
            finally:
                if lock is not None:
                    os.close(lock)

    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        return fetch(location)

    def fetch_into(self, location: str, dest: dict[str, torch.Tensor]) -> set[str]:
        """Read `location` straight into existing tensors (the titan backend's parameters, in HF naming):
        one memcpy from the file's mapping, kept across versions (`Mapped`). Returns the keys written; raises
        (after writing) when the file was recycled meanwhile: `dest` then holds torn values and must not be used."""
        return fetch_into(location, dest)

    def close(self) -> None:
        self.maps.close()
        remove_owned(self.dir)


def fetch(location: str | Path) -> dict[str, torch.Tensor]:
    """`ShmTransport.fetch` for any reader: a copy of the version at `location`, checked intact after reading."""
    p = Path(location)
    if not p.is_dir():
        raise TransportError(f"transport=shm: {p} does not exist (garbage-collected? raise `keep`)")
    sd = {k: v.clone() for k, v in read_hf_state_dict(p).items()}  # copies, not views of a recyclable file
    check_intact(p)
    return sd


def fetch_into(location: str | Path, dest: dict[str, torch.Tensor]) -> set[str]:
    """`ShmTransport.fetch_into` for a reader that does not own the run's folder (generators, bench probes)."""
    p = Path(location)
    if not p.is_dir():
        raise TransportError(f"transport=shm: {p} does not exist (garbage-collected? raise `keep`)")
    f = p / WEIGHTS
    if read_mark(p) is None or not f.is_file():  # an unmarked (e.g. sharded) folder, or one renamed away just now
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
            ok = (t.device.type == "cpu" and t.is_contiguous() and ST_DTYPES.get(meta["dtype"]) == t.dtype
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
    """A reader's hold on one version file, serving its tensors as views of the file's read-only mapping (no copy).

    Taking it: open the file by its version's path, wait for `LOCK_SH` on that open file description, then check
    the version mark. The order is the point: the trainer overwrites a file only while holding `LOCK_EX` on it
    (`ShmTransport.publish`), so once the shared lock is granted and the mark reads this version, the file cannot
    change until `release`. A reader that opened the file just before the trainer took it waits for the trainer's
    lock, then reads the new version's mark and refuses (TransportError, like a torn copy).

    `tensors`: the file's tensors in HF naming, views of the mapping where their offset is aligned to their element
    size (always, for files `Layout` wrote), copies otherwise (`copied` names them). The mapping is read-only:
    writing to a view kills the process (SIGSEGV), so a user must give its tensors their own storage back before
    loading weights by copying. Release only after switching to the next version's tensors: the views stay
    readable until then (the mapping is pinned, `Mapped`), and the trainer may recycle the file right after.
    The kernel drops the lock when the process dies, so a killed reader never blocks the trainer.
    """

    def __init__(self, location: str | Path, version: int, maps: Mapped | None = None) -> None:
        p = Path(location)
        m = _VERSION_DIR.match(p.name)
        if m is None or int(m.group(1)) != version:
            raise TransportError(f"transport=shm: asked to serve version {version} from {p}, which is not a "
                                 f"v{version} folder; refusing a mismatched version")
        self.path, self.version, self.maps = p / WEIGHTS, version, maps or _READ_MAPS
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise TransportError(f"transport=shm: {self.path} does not exist (any more): dropped or recycled past "
                                 f"`keep` before it could be served; load the latest version, or raise "
                                 f"`keep`") from None
        self._fd: int | None = fd
        self.tensors: dict[str, torch.Tensor] = {}
        self.copied: list[str] = []
        try:
            _lock_shared(fd, self.path)  # waits while the trainer overwrites this file
            header, base = self._header(fd)
            mark = header.get("__metadata__", {}).get(MARK)
            if mark != _mark(version):
                raise TransportError(f"transport=shm: {p} holds {'no marked version' if mark is None else mark} "
                                     f"now, not version {version}: it was recycled for a newer version before it "
                                     f"could be served (the reader was more than `keep` versions behind); nothing "
                                     f"was loaded: load the latest version, or raise `keep`")
            size = os.fstat(fd).st_size
            whole = self.maps.view(fd, pin=True)
            self._pinned = True
            for k, meta in header.items():
                if k == "__metadata__" or k.endswith(IGNORED_SUFFIXES):
                    continue
                dtype = ST_DTYPES.get(meta.get("dtype"))
                s, e = meta["data_offsets"]
                if dtype is None or base + e > size or e - s != math.prod(meta["shape"]) * dtype.itemsize:
                    raise TransportError(f"transport=shm: {self.path}: key {k!r} has dtype {meta.get('dtype')} or "
                                         f"offsets {meta['data_offsets']} this reader cannot serve (file of "
                                         f"{size} bytes); was it written by ShmTransport?")
                raw = whole[base + s:base + e]
                if (base + s) % dtype.itemsize:  # a view needs an aligned offset: this one is copied
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
        # Unlock explicitly: the lock belongs to the open file description, which the cached mapping's fd (a dup)
        # shares, so closing this fd alone would leave the file leased for as long as the mapping stays cached.
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def can_serve(location: str | Path) -> bool:
    """Whether `location` can be served by a `Lease`: one marked file (what `Layout` writes), not a sharded or
    unmarked folder (those are copied, `fetch_into`)."""
    return read_mark(location) is not None and (Path(location) / WEIGHTS).is_file()
