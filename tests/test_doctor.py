"""The CUDA preflight (`rlexp doctor`, and the driver check at the start of `rlexp train` on CUDA).

This machine has no GPU, so the CUDA queries are replaced by `fake_cuda_node`: a named fake giving what torch and
the driver would report on a GPU node (the facts are plain values; the refusal logic reads nothing else). The real
queries run too, and must say "CPU run" here."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlexp.cluster.cuda_env import (
    MIN_DRIVER,
    CudaFacts,
    check_cuda,
    check_driver,
    describe,
    driver_problem,
    find_driver,
    query_cuda,
)
from rlexp.cluster.doctor import role_lines
from rlexp.cluster.plan_cli import compose_run_config
from rlexp.config.validate import ConfigError


def fake_cuda_node(driver: str | None = "580.82.07", cuda: str | None = "13.0", gpus: int = 8,
                   mask: str | None = None) -> CudaFacts:
    """A fake for the CUDA queries: what torch 2.14 (CUDA 13.0 build) and the driver report on an H100 node."""
    return CudaFacts(torch="2.14.0+cu130", cuda=cuda, available=gpus > 0, driver=driver, driver_from="NVML",
                     gpus=("NVIDIA H100 80GB HBM3",) * gpus, visible_devices=mask)


@pytest.mark.parametrize(("cuda", "driver", "refused"), [
    ("13.0", "575.57.08", True),   # the 575 branch: CUDA 12.9's, too old for 13
    ("13.0", "580.65.06", False),  # exactly the minimum
    ("13.0", "580.82.07", False),
    ("13.0", "595.10", False),
    ("13.0", "550.163.01", True),
    ("12.8", "550.163.01", False),  # a CUDA 12 build runs on the 525+ branches
    ("12.8", "470.256.02", True),
    ("13.0", None, False),          # no driver found: nothing says it is too old (the GPU check still runs)
    (None, "470.256.02", False),    # a CPU build uses no driver
])
def test_a_driver_older_than_the_cuda_build_needs_is_refused_with_the_fix(cuda, driver, refused) -> None:
    problem = driver_problem(fake_cuda_node(driver=driver, cuda=cuda))
    assert (problem is not None) == refused
    if refused:
        need = MIN_DRIVER[int(cuda.split(".")[0])]
        assert driver in problem and need in problem and f"CUDA {cuda}" in problem and "Fix: install" in problem
        with pytest.raises(ConfigError, match="older than"):
            check_driver(fake_cuda_node(driver=driver, cuda=cuda))
    else:
        check_driver(fake_cuda_node(driver=driver, cuda=cuda))


def test_the_gpu_preflight_refuses_no_gpu_and_too_few_gpus() -> None:
    check_cuda(fake_cuda_node(), gpus_needed=8)
    with pytest.raises(ConfigError, match="sees 4"):
        check_cuda(fake_cuda_node(gpus=4, mask="0,1,2,3"), gpus_needed=8)
    with pytest.raises(ConfigError, match="sees no GPU"):
        check_cuda(fake_cuda_node(gpus=0), gpus_needed=1)
    with pytest.raises(ConfigError, match="CPU build"):
        check_cuda(CudaFacts(torch="2.13.0+cpu", cuda=None, available=False), gpus_needed=1)


def test_the_driver_comes_from_the_first_query_that_answers() -> None:
    def absent() -> str | None:
        raise ModuleNotFoundError("pynvml")

    assert find_driver((("NVML", absent), ("nvidia-smi", lambda: "580.82.07\n"))) == ("580.82.07", "nvidia-smi")
    assert find_driver((("NVML", absent), ("nvidia-smi", lambda: None))) == (None, "not found")


def test_describe_names_the_build_the_driver_and_the_mask() -> None:
    text = "\n".join(describe(fake_cuda_node(gpus=2, mask="6,7")))
    assert "built for CUDA 13.0" in text and "580.82.07 (NVML)" in text and "needs >= 580.65.06" in text
    assert "CUDA_VISIBLE_DEVICES=6,7): 2" in text and "cuda:1 NVIDIA H100" in text


def test_each_role_s_gpus_for_the_8b_preset_within_a_scheduler_s_mask() -> None:
    typed = OmegaConf.to_object(compose_run_config(["model=qwen3_8b", "cluster=gpu_node"]))
    lines = "\n".join(role_lines(typed, "8,9,10,11,12,13,14,15"))
    assert "trainer: rank 0 -> GPU 0 (physical 8)" in lines
    assert "generator0: rank 0 -> GPU" in lines and "hosts: local" in lines


def test_the_real_queries_on_this_machine_say_cpu() -> None:
    f = query_cuda()
    if f.available:
        pytest.skip("a GPU is visible: the CPU case does not apply")
    assert f.gpus == () and "no CUDA device visible" in "\n".join(describe(f))


def test_rlexp_doctor_on_a_cpu_machine() -> None:
    from tests.cli_batch import rlexp_each

    if query_cuda().available:
        pytest.skip("a GPU is visible")
    # both in one child (tests/cli_batch.py): one interpreter start and torch import, not two
    p, q = rlexp_each([["doctor"], ["doctor", "cluster=gpu_node", "model=qwen3_0_6b"]], timeout=300)
    assert p.returncode == 0, p.stderr
    assert "no CUDA; CPU run" in p.stdout and "torch " in p.stdout
    p = q  # a CUDA run on a machine without one: refused, roles shown
    assert p.returncode == 1, p.stdout + p.stderr
    assert "trainer: rank 0 -> GPU 0" in p.stdout and "refused: cluster.device=cuda" in p.stderr
    assert "Traceback" not in p.stderr
