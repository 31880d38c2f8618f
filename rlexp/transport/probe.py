"""A Monarch actor that measures the transports between two processes (`rlexp bench`'s transport rows).

One probe publishes (the trainer's side), another on a different process fetches into weights it has
already allocated (the generator's side), so each measurement crosses a process boundary the way a run
does. The state dict is made inside the probe, not sent to it, so only the transport moves the bytes.
"""
from __future__ import annotations

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
                 chunk_bytes: int | None = None) -> None:
        self.run_name, self.total_mb, self.shm_root, self.chunk_bytes = run_name, total_mb, shm_root, chunk_bytes
        self.sd = synthetic_hf_state_dict(total_mb)
        self.params = {k: torch.zeros_like(v) for k, v in self.sd.items()}  # the generator's own weights
        self.transports: dict[str, WeightTransport] = {}
        self.client: Any = None

    @endpoint
    async def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.sd.values())

    @endpoint
    async def publish(self, name: str, version: int) -> tuple[str, float]:
        from rlexp.transport.registry import build_transport

        if name not in self.transports:
            # keep=2: what a run keeps at least, and what lets shm reuse the dropped version's pages
            settings = {"shm": {"root": self.shm_root}, "monarch": {"chunk_bytes": self.chunk_bytes}}.get(name, {})
            self.transports[name] = build_transport(name, self.run_name, keep=2,
                                                    **{k: v for k, v in settings.items() if v is not None})
        t0 = time.perf_counter()
        loc = await self.transports[name].apublish(version, self.sd)
        return loc, time.perf_counter() - t0

    @endpoint
    async def fetch(self, name: str, version: int, location: str, server: Any = None) -> float:
        """Seconds to get `location` into this probe's existing weights, the way a generator does."""
        from rlexp.transport.monarch import MonarchWeightClient
        from rlexp.transport.shm import fetch_into

        t0 = time.perf_counter()
        if name == "shm":
            fetch_into(location, self.params)
        elif name == "monarch":
            self.client = self.client or MonarchWeightClient(server)
            for k, v in (await self.client.afetch(location, version)).items():
                self.params[k].copy_(v)
        else:
            raise ValueError(f"probe: no fetch for transport {name!r}")
        return time.perf_counter() - t0

    @endpoint
    async def check_and_clear(self) -> bool:
        """Whether the fetched weights equal the published ones bit for bit (both probes build the same
        synthetic state dict); then zero them so the next fetch is checked afresh."""
        ok = all(torch.equal(self.params[k].view(torch.uint8), v.view(torch.uint8)) for k, v in self.sd.items())
        for v in self.params.values():
            v.zero_()
        return ok

    @endpoint
    async def close(self) -> None:
        for t in self.transports.values():
            t.close()
