"""Host RAM and process count planned before anything spawns (rlexp.cluster.host_plan): figures checked against
hand computations, refusals naming the key and the largest value that fits, the examples of issue 41 refused
in seconds through the real `rlexp train`, and the shipped configs still accepted.

The machine's size is the one fake here (`machine`, returning 24 GiB and 2 CPUs like the machine these tests
were written on), so a refusal does not depend on where CI runs."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.cluster import host_plan
from rlexp.cluster.host_plan import (
    MIB,
    PROCESS_MIB,
    SHARED_MIB,
    HostPlanError,
    Sizes,
    check_context,
    check_host,
    check_sizes,
    estimate,
    param_count,
)
from rlexp.config.model import ArchConfig
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import register_configs
from rlexp.config.typed import typed_config

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
SMALL = Sizes(group_size=4, prompts_per_step=2, max_tokens=6, max_prompt_tokens=10, max_seq_len=1024, replicas=1,
              generator_tp=1, trainer_world=1, reward_replicas=1, micro_batch_size=1024, vocab=128, params=1000,
              layers=2, kv_dim=64, kl=False, cpu=True, local_actors=True, vllm_kv_gb=None)


def test_param_count_of_the_tiny_model() -> None:
    # embeddings in and out 2 * 128 * 128; per layer attention 128 * 64 * (2 * 2 + 2 * 1), SwiGLU 3 * 128 * 256
    assert param_count(ArchConfig()) == 2 * 128 * 128 + 2 * (128 * 64 * 6 + 3 * 128 * 256) == 327_680


def test_estimate_by_hand() -> None:
    p = estimate(SMALL)  # 8 samples of 16 tokens (10 prompt + 6 response)
    assert p.processes == {"controller": 1, "generator": 1, "trainer": 1, "reward": 1}
    assert p.items == {
        "processes": 4 * PROCESS_MIB * MIB + SHARED_MIB * MIB,
        "rollouts": 8 * (1024 + 8 * 16 + 32 * 6),
        "trainer batch": 8 * 16 * 16,
        "trainer state": 1000 * 16,
        "trainer logits": 1 * 8 * 16 * 128 * 8,  # one micro-batch of all 8 rows, logits and log-softmax
        "generator weights": 1000 * 4,
        "generator KV cache": 1 * 4 * 16 * 2 * 2 * 64 * 4,  # one group of 4 rows, K and V, 2 layers
    }
    # The same sizes on Slurm: only the controller and the rollouts it holds are on this host.
    remote = estimate(replace(SMALL, local_actors=False))
    assert remote.processes == {"controller": 1}
    assert remote.items == {"processes": (PROCESS_MIB + SHARED_MIB) * MIB, "rollouts": 8 * (1024 + 8 * 16 + 32 * 6)}
    # vLLM on CPU reserves its KV cache per replica; the KL reference adds a weight copy.
    assert estimate(replace(SMALL, vllm_kv_gb=0.25, replicas=2)).items["generator KV cache"] == 0.5 * GIB
    assert estimate(replace(SMALL, kl=True)).items["trainer state"] == 1000 * 20


def test_refusal_names_the_key_and_the_largest_value_that_fits() -> None:
    # Controller only; budget 90% of total. With one prompt per step a sample costs 1024 + 8 * 16 + 32 * 6
    # = 1344 bytes, so a machine whose budget is the process figure plus 1000 samples fits group_size 1000.
    s = replace(SMALL, local_actors=False, prompts_per_step=1, group_size=5000)
    total = ((PROCESS_MIB + SHARED_MIB) * MIB + 1000 * 1344) / 0.9
    with pytest.raises(HostPlanError) as e:
        check_host(s, have=(total, total, 64))
    assert "algorithm.group_size=5000 -> at most 1000" in str(e.value)
    assert "algorithm.prompts_per_step" not in str(e.value)  # 1 is already its least
    assert check_host(replace(s, group_size=1000), have=(total, total, 64)).n_processes == 1


def test_processes_per_cpu() -> None:
    s = replace(SMALL, replicas=10)  # 13 processes; one CPU allows 8: 1 + 5 + 1 + 1
    with pytest.raises(HostPlanError) as e:
        check_host(s, have=(1024 * GIB, 1024 * GIB, 1))
    assert "starts 13 processes on this host, more than 8 per CPU (1 CPUs)" in str(e.value)
    assert "generator.replicas=10 -> at most 5" in str(e.value) and "reward.replicas" not in str(e.value)


def test_over_available_memory_warns_but_runs(capsys) -> None:
    plan = check_host(SMALL, have=(100 * GIB, 1 * GIB, 8))
    assert plan.total_bytes > GIB and "only 1.00 GiB is available now" in capsys.readouterr().out


@pytest.fixture
def this_machine(monkeypatch) -> None:
    """A fake: the size of the 2-CPU, 24 GiB machine the issue's examples were measured on."""
    monkeypatch.setattr(host_plan, "machine", lambda: (23.5 * GIB, 20 * GIB, 2))


def _cfg(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("train", overrides=overrides)


@pytest.mark.parametrize("overrides,expected", [
    (["algorithm.group_size=1000000"], "algorithm.group_size=1000000 -> at most "),
    (["algorithm.prompts_per_step=100000000"], "algorithm.prompts_per_step=100000000 -> at most "),
    (["algorithm.max_tokens=100000000"], "algorithm.max_tokens=100000000 is beyond model=tiny's context, "
                                         "model.arch.max_seq_len=1024"),
    (["generator.replicas=64", "cluster=process"], "generator.replicas=64 -> at most "),
])
def test_issue_examples_refused(this_machine: None, overrides: list[str], expected: str) -> None:
    cfg = _cfg(overrides)
    t0 = time.monotonic()
    with pytest.raises(HostPlanError) as e:
        check_sizes(cfg)
    assert expected in str(e.value) and time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("overrides", [
    [], ["environment=sort"], ["environment=guess"], ["experiment=weaver_cpu"], ["reward=weaver"],
    ["cluster=process", "generator.replicas=2"], ["generator=vllm"], ["environment=sort", "algorithm.max_tokens=512"],
    ["model.parallelism.trainer_fsdp=4", "generator.replicas=2", "reward.replicas=2"],
    ["algorithm.group_size=32", "algorithm.prompts_per_step=128", "algorithm.max_tokens=64"],
    ["model=qwen3_8b", "cluster=slurm"], ["experiment=qwen3_32b_math"],
])
def test_shipped_configs_fit(this_machine: None, overrides: list[str]) -> None:
    check_sizes(_cfg(overrides))


def test_context_check_names_both_values() -> None:
    t = typed_config(OmegaConf.create({"model": {"name": "tiny", "arch": {"max_seq_len": 1024}},
                                       "algorithm": {"max_tokens": 1023, "max_prompt_tokens": 64},
                                       "eval": {"max_tokens": 64}}))
    check_context(t)
    t.eval.max_tokens = 4096
    with pytest.raises(HostPlanError, match=r"eval.max_tokens=4096 is beyond model=tiny's context, "
                                            r"model.arch.max_seq_len=1024"):
        check_context(t)


def test_refused_by_the_real_cli_before_torch_loads(tmp_path: Path) -> None:
    """`rlexp train` in a child process: refused with exit 2 and one line, before the imports of a run."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "rlexp", "train", "algorithm.prompts_per_step=100000000",
                        f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t0
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    out = p.stdout + p.stderr
    assert "algorithm.prompts_per_step=100000000 -> at most" in out and "Traceback" not in out
    assert "torch and Monarch loaded" not in out and took < 60
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_plan_prints_the_host_line(this_machine: None, capsys) -> None:
    from rlexp.cluster import plan_cli

    assert plan_cli.main([]) == 0
    assert "host: at least 1." in capsys.readouterr().out  # 4 processes of the default run, about 1.5 GiB
    assert plan_cli.main(["algorithm.group_size=1000000"]) == 1
    assert "refused: this run needs at least" in capsys.readouterr().err
