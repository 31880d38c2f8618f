"""How long one weight sync takes, from the weights' size and the path they take (`rlexp plan`'s sync line).

Across hosts (`tcp`): every generator replica on another host pulls its own copy from the trainer's host, so the
trainer's link carries `replicas` copies of the serving-dtype weights; at `cluster.network_gbps` (default 100
Gb/s, a common cross-node Ethernet or IPoIB link; set it to the link the trainer's host name resolves to) that is
the time, since the transport runs at the speed of a plain socket copy
(`rlexp bench`, studies/perf/results/perf_cpu.md).
On one host (`shm`): one memcpy by the trainer into /dev/shm and one by a copying reader (vLLM's reload; the
titan backend serves the mapping without it) at `SHM_GBYTES_S`, what one core of a server copies.
Here, not in rlexp.transport, so that `rlexp plan` stays free of torch and Monarch. Either way an estimate, not a
measurement: the GPU-to-host copy of the trainer's gather and the generators'
host-to-GPU copies are left out, and async (`sync=async`) hides part of it behind generation.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_NETWORK_GBPS = 100.0
SHM_GBYTES_S = 10.0  # single-threaded memcpy on a server CPU, GB/s
SHM_COPIES = 2  # the trainer's write and a copying generator's read


@dataclass(frozen=True)
class SyncEstimate:
    nbytes: int  # one copy of the weights, in the generators' dtype
    replicas: int
    cross_hosts: bool
    network_gbps: float
    seconds: float

    def line(self, dtype: str) -> str:
        size = f"{self.nbytes / 1e9:.2f} GB" if self.nbytes >= 1e8 else f"{self.nbytes / 1e6:.3g} MB"
        if self.cross_hosts:
            how = (f"{size} {dtype} x {self.replicas} generator replica(s) across hosts by tcp at "
                   f"{self.network_gbps:g} Gb/s (cluster.network_gbps), the trainer's link carrying every copy")
        else:
            how = (f"{size} {dtype} on one host by shm: {SHM_COPIES} memcpy at ~{SHM_GBYTES_S:g} GB/s "
                   f"(the generators share the trainer's one write)")
        return f"weight sync (estimate): {how} = {self.seconds:.3g} s per sync"


def weight_sync(n_params: int, dtype_bytes: int, replicas: int, cross_hosts: bool,
                network_gbps: float = DEFAULT_NETWORK_GBPS) -> SyncEstimate:
    """Seconds to get one version of `n_params` weights of `dtype_bytes` each to `replicas` generator replicas."""
    if network_gbps <= 0:
        raise ValueError(f"cluster.network_gbps={network_gbps}: give the trainer host's link speed in Gb/s (> 0)")
    nbytes = n_params * dtype_bytes
    if cross_hosts:
        seconds = nbytes * replicas * 8 / (network_gbps * 1e9)
    else:
        seconds = nbytes * SHM_COPIES / (SHM_GBYTES_S * 1e9)
    return SyncEstimate(nbytes, replicas, cross_hosts, network_gbps, seconds)
