"""Weight sync through shared memory: HF safetensors under /dev/shm/<run>/v<version>/.

Why files and not a socket: vLLM reloads weights from a folder (`reload_weights(weights_path=...)`)
and the `titan` backend memory-maps the same safetensors, so one format serves both, and a
crashed generator can always re-read the newest version. /dev/shm is RAM-backed, so a publish costs
one memcpy-speed write and every reader on the host shares the same pages.

Atomicity: a version is written into a hidden temporary folder and renamed into place (rename is
atomic on one filesystem), so a `v<version>` folder is always complete; `LATEST` is replaced
atomically after it. Old versions beyond `keep` are deleted on publish; with async (off-policy)
generation keep at least max policy lag + 2 so no generator loses the version it is loading.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from rlexp.models.hf import (
    read_hf_state_dict,
    read_hf_state_dict_into,
    write_hf_state_dict,
)
from rlexp.transport.base import TransportError, WeightTransport

SHM = Path("/dev/shm")
LATEST = "LATEST"
_VERSION_DIR = re.compile(r"^v(\d+)$")


def default_root() -> Path:
    """/dev/shm when the host has one (Linux), else the temp dir (still correct, slower)."""
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())


def check_shm(*, hosts: int = 1, root: str | Path | None = None, need_bytes: int | None = None) -> None:
    if hosts > 1:
        raise TransportError(f"cluster.transport=shm needs the trainer and every generator on one host, but the "
                             f"layout spans {hosts} hosts (/dev/shm is per host): use cluster.transport=auto (shm "
                             f"where a pair shares a host, monarch across hosts) or cluster.transport=monarch")
    r = Path(root) if root else default_root()
    if not r.is_dir() or not os.access(r, os.W_OK):
        raise TransportError(f"transport=shm: {r} is not a writable folder")
    if need_bytes is not None:
        free = shutil.disk_usage(r).free
        if need_bytes > free:
            raise TransportError(f"transport=shm: needs {need_bytes / 2**30:.1f} GiB in {r} (weights x versions kept), "
                                 f"only {free / 2**30:.1f} GiB free; in Docker raise --shm-size, or lower `keep`")


class ShmTransport(WeightTransport):
    name = "shm"

    def __init__(self, run_name: str, *, root: str | Path | None = None, keep: int = 2,
                 config: dict | None = None, max_shard_bytes: int = 5 * 2**30) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.dir = (Path(root) if root else default_root()) / run_name
        self.keep = keep
        self.config = config  # written as config.json next to the weights when given
        self.max_shard_bytes = max_shard_bytes
        # A folder left by a crashed run of the same name holds versions this trainer did not write; keeping
        # them would make `gc` delete the newest real version (it sorts by number). The trainer owns the folder.
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)

    def version_dir(self, version: int) -> Path:
        return self.dir / f"v{version}"

    def versions(self) -> list[int]:
        out = []
        for p in self.dir.iterdir() if self.dir.exists() else ():
            m = _VERSION_DIR.match(p.name)
            if m and p.is_dir():
                out.append(int(m.group(1)))
        return sorted(out)

    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        need = sum(t.numel() * t.element_size() for t in hf_state_dict.values())
        free = shutil.disk_usage(self.dir).free
        if need > free:
            raise TransportError(f"transport=shm: version {version} needs {need / 2**30:.2f} GiB in {self.dir}, "
                                 f"{free / 2**30:.2f} GiB free; in Docker raise --shm-size, or lower `keep`")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-v{version}-", dir=self.dir))
        try:
            write_hf_state_dict({k: v.detach().to("cpu").contiguous() for k, v in hf_state_dict.items()}, tmp,
                                max_shard_bytes=self.max_shard_bytes)
            if self.config is not None:
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
        vs = self.versions()
        for v in vs[: max(0, len(vs) - self.keep)]:
            shutil.rmtree(self.version_dir(v), ignore_errors=True)

    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        p = Path(location)
        if not p.is_dir():
            raise TransportError(f"transport=shm: {p} does not exist (garbage-collected? raise `keep`)")
        return read_hf_state_dict(p)

    def fetch_into(self, location: str, dest: dict[str, torch.Tensor]) -> set[str]:
        """Read `location` straight into existing tensors (the titan backend's parameters, in HF naming):
        about one memcpy instead of mmap-fault + copy. Returns the keys written."""
        p = Path(location)
        if not p.is_dir():
            raise TransportError(f"transport=shm: {p} does not exist (garbage-collected? raise `keep`)")
        return read_hf_state_dict_into(p, dest)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
