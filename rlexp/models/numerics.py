"""Pinned numerics for the content-addressed builds (the tiny verifiers, the warm start), and the
fingerprint of what pinning inside a process cannot fix.

Why: a stand-in is cached under a key computed from its inputs, so the key promises one set of
weights, and a table names its draw by the folders' sha256. Issue 46 measured what decides the bits
beyond the inputs:

* the intra-op thread count, which splits float reductions (torch's default is the machine's core
  count);
* the instruction set ATen's vectorised kernels dispatch to: the warm start of
  `experiment=weaver_cpu` is ba39d4a4defb on an AMD EPYC with AVX512 and a3e47025e84e under
  `ATEN_CPU_CAPABILITY=avx2`, same code;
* the BLAS code path: `MKL_CBWR=COMPATIBLE` gives d13dd06e6464; MKL also chooses by CPU vendor,
  and the headline table's draw (made on another machine kind) is reproduced by no setting on the
  AMD machine.

`pinned_numerics` fixes the first (one thread) and asks for deterministic algorithms (an op without
a deterministic kernel fails instead of drawing silently). The other two are properties of the
machine: `machine_kind` names them, each build's record carries it, and committed expected hashes
are per kind."""
from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import torch


@contextlib.contextmanager
def pinned_numerics() -> Iterator[None]:
    """One intra-op thread and deterministic algorithms inside, the caller's settings restored.

    One thread also keeps these tiny models fast on a shared machine: OpenMP hand-offs dominate at
    their size (measured on 2 cores: 75-100 ms a training step on one thread, 0.2-2.3 s on two)."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_num_threads(threads)


def _cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor id (GenuineIntel, AuthenticAMD, ...): MKL picks its kernels by it."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def machine_kind() -> dict[str, str]:
    """What, besides a build's inputs, decides its bits: torch and transformers (kernels,
    initialisers), the instruction set ATen dispatches to, and the CPU vendor (MKL's code path).
    Narrower than the run manifest's `system.numerics`: threads are pinned here, not recorded."""
    return {"torch": torch.__version__, "transformers": _version("transformers"),
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "cpu_vendor": _cpu_vendor()}


def machine_kind_name(kind: dict[str, str] | None = None) -> str:
    """A short stable name of a machine kind, the key of committed expected hashes."""
    k = machine_kind() if kind is None else kind
    return "/".join(f"{k[f]}" for f in ("cpu_vendor", "cpu_capability", "torch", "transformers"))
