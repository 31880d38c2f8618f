"""Weight transports: how a new policy version gets from the trainer to the generators.

`shm` writes HF-named safetensors to /dev/shm and generators reload from that folder (what vLLM's
`reload_weights(weights_path=...)` takes): the same-host fast path. `tcp` streams a version from a listening
socket on the trainer's host straight into each generator's buffer: the cross-host path, at the speed of a plain
socket copy. `monarch` sends the same state dict in chunked Monarch actor messages from a weight-server actor on
the trainer's process: it crosses hosts with nothing but Monarch, slowly. `torchstore` is an optional adapter
for TorchStore's storage volumes. `cluster.transport=auto` (the default) picks per trainer->generator pair
(`pair_transport`): shm on one host, tcp across hosts. `check_transport(name)` runs in `prepare` before anything
spawns. Each transport is one module registering itself (`rlexp.transport.base.register_transport`); see
rlexp/transport/base.py.
"""
from rlexp.transport.base import (
    TransportError,
    TransportSpec,
    WeightReceiver,
    WeightTransport,
    check_weights,
    register_transport,
    spec_of,
)
from rlexp.transport.registry import (
    build_publisher,
    build_receiver,
    build_transport,
    check_transport,
    pair_transport,
    pair_transports,
    transport_spec,
)

__all__ = ["TransportError", "TransportSpec", "WeightReceiver", "WeightTransport", "build_publisher",
           "build_receiver", "build_transport", "check_transport", "check_weights", "pair_transport",
           "pair_transports", "register_transport", "spec_of", "transport_spec"]
