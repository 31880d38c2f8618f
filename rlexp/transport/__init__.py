"""Weight transports: how a new policy version gets from the trainer to the generators.

`shm` (default) writes HF-named safetensors to /dev/shm and generators reload from that folder
(what vLLM's `reload_weights(weights_path=...)` takes). `torchstore` moves the same state dict
through TorchStore's Monarch storage volumes, for trainer and generators on different hosts.
`check_transport(name)` runs in the launcher before anything spawns.
"""
from rlexp.transport.base import TransportError, WeightTransport
from rlexp.transport.registry import build_transport, check_transport

__all__ = ["TransportError", "WeightTransport", "build_transport", "check_transport"]
