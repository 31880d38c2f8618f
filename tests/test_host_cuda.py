"""`rlexp train`'s GPU checks before torch loads (`rlexp.cluster.cuda_env.host_cuda`): what torch
will see, told from its version file, `nvidia-smi` and `CUDA_VISIBLE_DEVICES`, and None wherever
only torch can tell. This machine has no GPU: `nvidia-smi`'s answers on a GPU node are written by
hand (the rows below, and a FAKE `nvidia-smi` script on PATH for the real subprocess call); torch's
build is read for real and compared with the imported torch."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlexp.cluster.cuda_env import (
    SmiGpu,
    driver_problem,
    host_cuda,
    smi_gpus,
    torch_build,
    visible_count,
)

H100 = SmiGpu(memory_mib=81559.0, mig="Disabled", driver="580.82.07")  # nvidia-smi on an H100 node
CUDA13 = ("2.14.0+cu130", "13.0", None)


def test_torch_build_is_read_without_importing_torch() -> None:
    import torch

    assert torch_build() == (torch.__version__, torch.version.cuda, torch.version.hip)


@pytest.mark.parametrize(("mask", "gpus", "seen"), [
    (None, 8, 8), ("", 8, 0), ("0,1", 8, 2), ("3", 8, 1),
    ("1,9,2", 8, 1),  # CUDA stops at an invalid one
    ("-1", 8, 0), ("0,0", 8, 1), ("GPU-8f3a", 8, None), ("MIG-1c2d", 8, None),
    (" 2 , 5 ", 8, 2)])
def test_visible_count_reads_the_mask_as_cuda_does(mask: str | None, gpus: int,
                                                   seen: int | None) -> None:
    assert visible_count(mask, gpus) == seen


def test_host_cuda_answers_only_where_torch_would_say_the_same() -> None:
    facts, n, gib = host_cuda(("2.13.0+cpu", None, None), [H100] * 8, None) or (None, -1, -1)
    assert n == 0 and facts is not None and not facts.available  # a CPU build sees no GPU
    facts, n, gib = host_cuda(CUDA13, [H100] * 8, "0,1,2") or (None, -1, -1)
    assert (n, round(gib, 1)) == (3, 79.6) and facts is not None and facts.driver == "580.82.07"
    none = host_cuda(CUDA13, [], None)  # no NVIDIA driver on this machine: no GPU
    assert none is not None and none[1:] == (0, 0.0) and not none[0].available
    assert host_cuda(CUDA13, None, None) is None  # a driver, but nvidia-smi did not answer
    assert host_cuda(("2.14.0+rocm", None, "6.2"), [], None) is None  # ROCm: torch tells
    mig = SmiGpu(81559.0, "Enabled", "580.82.07")
    assert host_cuda(CUDA13, [mig], None) is None
    assert host_cuda(CUDA13, [H100] * 8, "GPU-8f3a") is None  # a UUID mask
    small = SmiGpu(40960.0, "Disabled", "580.82.07")
    assert host_cuda(CUDA13, [H100, small], "1") is None  # which GPU a mask picks: CUDA's order
    assert (host_cuda(CUDA13, [H100, small], None) or (None, 0, 0.0))[1:] == (2, 40.0)
    old = host_cuda(CUDA13, [SmiGpu(81559.0, "Disabled", "575.57.08")], None)
    assert old is not None and "older than 580.65.06" in (driver_problem(old[0]) or "")


def test_smi_gpus_parses_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FAKE `nvidia-smi` printing what the real one prints for the query on a 2-GPU node."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '81559, Disabled, 580.82.07'\n"
                    "echo '81559, [N/A], 580.82.07'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert smi_gpus() == [H100, SmiGpu(81559.0, "[N/A]", "580.82.07")]
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert smi_gpus() is None
