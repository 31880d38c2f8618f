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

Readers (the generators) and their leases, which serve a version straight from its mapping, are in
`rlexp.transport.shm_read`.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import struct
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlexp.core.weights import (
    ST_NAMES,
    TransportError,
    staging_root,
    write_hf_state_dict,
)
from rlexp.transport.base import WeightReceiver, WeightSink, WeightTransport, register_transport
from rlexp.transport.shm_read import (  # the reader side, also importable from here as before
    _READ_MAPS as _READ_MAPS,
    _VERSION_DIR,
    _WRITING,
    LEASE_WAIT_S as LEASE_WAIT_S,
    MARK,
    WEIGHTS,
    Lease,
    Mapped,
    _mark,
    can_serve,
    check_intact,
    fetch,
    fetch_into,
    read_mark as read_mark,
)

if TYPE_CHECKING:
    from rlexp.config.schema import ClusterConfig


LATEST = "LATEST"
_THREADS = max(1, min(4, os.cpu_count() or 1))  # parallel pwrite of a fresh file: one kernel copy per thread


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
    def settings(cls, cluster: ClusterConfig) -> dict[str, Any]:
        """`cluster.shm_dir`, plus `cluster.transport_options.shm` (e.g. `zero_copy: false`, checked by `check`)."""
        options = getattr(cluster, "transport_options", None) or {}
        return {"root": cluster.shm_dir, **dict(options.get("shm") or {})}

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
