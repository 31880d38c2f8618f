"""A weight transport that lives outside rlexp: what a user adds to get a new one (this module, plus a YAML naming
it as `cluster.transport: tests.toy_transport:FileTransport`). Each version is one safetensors file in a folder
given by `cluster.transport_options.file.dir`; every version is kept, so a test can look at them afterwards."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlexp.transport.base import WeightReceiver, WeightTransport, register_transport


class FileReceiver(WeightReceiver):
    """Generator side: read the version's file; the backend checks it against its own parameters."""

    async def afetch(self, version: int, location: str) -> dict[str, torch.Tensor]:
        if not location.endswith(f"v{version}.safetensors"):
            raise ValueError(f"file transport: asked for version {version}, got {location}")
        return load_file(location)


@register_transport("file")
class FileTransport(WeightTransport):
    receiver = FileReceiver

    def __init__(self, run_name: str, *, keep: int = 2, dir: str) -> None:
        self.dir = Path(dir) / run_name
        self.dir.mkdir(parents=True, exist_ok=True)

    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        path = self.dir / f"v{version}.safetensors"
        save_file({k: v.detach().cpu().contiguous() for k, v in hf_state_dict.items()}, str(path))
        return str(path)

    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        return load_file(location)
