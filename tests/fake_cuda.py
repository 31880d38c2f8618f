"""FAKE CUDA: `torch.cuda`'s queries answered as a GPU node would answer them, for tests on machines
without one.

Only what rlexp asks before it spawns anything is faked: `is_available`, `device_count`,
`get_device_properties` (`total_memory`, `name`), `mem_get_info`, `is_initialized` (always False:
nothing here initialises CUDA), and the process's `CUDA_VISIBLE_DEVICES` (a scheduler's mask, as
Slurm sets it on a shared node). The count honours the mask as the CUDA runtime does: the GPUs it
names, the node's GPUs without it, none for an empty mask. No kernel, allocation or tensor is faked:
code that would run on the GPU cannot be tested with this.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

GiB = 2**30


@dataclass
class FakeNode:
    """The node the fake describes: `gpus` physical GPUs of `gib` GiB, and the mask the process
    inherited."""

    gpus: int = 8
    gib: float = 80.0
    mask: str | None = None  # CUDA_VISIBLE_DEVICES the scheduler set; None: unset

    def visible(self) -> list[str]:
        if self.mask is None:
            return [str(i) for i in range(self.gpus)]
        names = [v.strip() for v in self.mask.split(",") if v.strip()]
        return [v for v in names if v.isdigit() and int(v) < self.gpus]


def fake_cuda(monkeypatch: pytest.MonkeyPatch, gpus: int = 8, gib: float = 80.0,
              mask: str | None = None) -> FakeNode:
    """Patch `torch.cuda` and the environment (undone by `monkeypatch` after the test) so this
    process sees `FakeNode(gpus, gib, mask)`. With `gpus=0` CUDA is not available (a login node)."""
    node = FakeNode(gpus, gib, mask)
    if mask is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)

    def count() -> int:
        return len(node.visible())

    def props(i: int = 0) -> SimpleNamespace:
        if not 0 <= i < count():
            raise RuntimeError(f"FAKE CUDA: invalid device ordinal {i} (visible: {count()})")
        return SimpleNamespace(total_memory=int(gib * GiB), name="FAKE-H100", major=9, minor=0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count() > 0)
    monkeypatch.setattr(torch.cuda, "device_count", count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda i=0: (int(gib * GiB * 0.99), props(i).total_memory))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    return node
