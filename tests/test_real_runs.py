"""What a real model brings (conf/scale/), the derived micro-batch, the refusal on a machine without the
GPUs, `rlexp plan`'s time estimate, `rlexp eval` offline and on a run's held-out split, start-up phases."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from rlexp.cluster import plan_cli
from rlexp.cluster.plan_cli import compose_run_config
from rlexp.cluster.planner import PlanError, check_devices, plan_memory
from rlexp.config.schema import TrainConfig
from rlexp.config.typed import typed_config
from rlexp.run.phases import Phases


def typed(overrides: list[str]) -> TrainConfig:
    """The run config as `rlexp plan` and `prepare` read it: composed, then made typed once."""
    return typed_config(compose_run_config(overrides))


SIZES = ["qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "qwen3_14b", "qwen3_32b"]
NODES = {"qwen3_14b": 3, "qwen3_32b": 4}  # documented in model/*.yaml; the others one node


def test_tiny_default_is_the_cpu_demo():
    c = compose_run_config([])
    assert (c.model.name, c.environment.name, c.generator.backend, c.cluster.name, c.cluster.device) == \
        ("tiny", "arithmetic", "titan", "local", "cpu")
    assert (c.algorithm.group_size, c.algorithm.prompts_per_step, c.algorithm.max_tokens,
            c.trainer.micro_batch_size, c.trainer.lr) == (16, 64, 1, 1024, 1e-3)


@pytest.mark.parametrize("model", SIZES)
def test_every_size_with_weaver_fits_its_documented_nodes(model):
    c = typed([f"model={model}", "reward=weaver"])
    assert c.environment.name == "math" and c.verifier_set.name == "math" and c.generator.backend == "vllm"
    assert c.cluster.hosts == NODES.get(model, 1) and c.algorithm.max_tokens == 3072
    r = plan_memory(c)
    assert r.ok, r.table()
    assert r.micro_batch_derived and r.micro_batch_size >= 1 and len(r.verifiers) == 3
    assert r.time is not None and r.time.step_s > 0


@pytest.mark.parametrize("preset", ["qwen3_8b_math", "qwen3_14b_math", "qwen3_32b_math", "weaver_cpu"])
def test_each_experiment_preset_fits(preset):
    assert plan_memory(typed([f"experiment={preset}", "reward=weaver"])).ok


def test_command_line_wins_over_what_the_model_brings():
    c = compose_run_config(["model=qwen3_8b", "environment=gsm8k", "cluster=slurm", "algorithm.max_tokens=512"])
    assert (c.environment.name, c.verifier_set.name, c.cluster.name, c.algorithm.max_tokens) == \
        ("gsm8k", "gsm8k", "slurm", 512)
    assert compose_run_config(["model=qwen3_32b", "cluster=gpu_node"]).cluster.hosts == 1


def test_derived_micro_batch_is_the_largest_that_fits():
    c = typed(["model=qwen3_8b", "reward=weaver"])
    r = plan_memory(c)
    mb = r.micro_batch_size
    c.trainer.micro_batch_size = mb
    assert plan_memory(c).trainer.fits
    c.trainer.micro_batch_size = mb + 1
    assert not plan_memory(c).trainer.fits
    assert "accumulated" in r.trainer.layout  # 128 rows / FSDP 3 > mb: gradient accumulation


def test_plan_exits_nonzero_without_a_cluster_argument(capsys):
    # the model's own cluster (gpu_node, 80 GiB stated) is used: a layout beyond it is refused
    assert plan_cli.main(["model=qwen3_8b", "reward=weaver", "model.parallelism.trainer_fsdp=1"]) == 1
    assert plan_cli.main(["model=qwen3_8b", "reward=weaver"]) == 0
    out = capsys.readouterr().out
    assert "80 GiB" in out and "s per step" in out and "h for 300 steps" in out


def test_plan_refuses_a_real_model_on_a_cpu_cluster(capsys):
    """`cluster=local` is CPU-only: a GPU plan with no memory limit used to print "3 GPU(s)" and exit 0."""
    assert plan_cli.main(["model=qwen3_8b", "cluster=local"]) == 1
    assert "needs GPUs, but cluster=local is CPU-only" in capsys.readouterr().err
    assert plan_cli.main([]) == 0  # the tiny CPU demo plans on CPU


def test_time_estimate_follows_mfu_and_peak():
    c = typed(["model=qwen3_8b", "cluster.mfu=0.4"])
    t1 = plan_memory(c).time.step_s
    c.cluster.mfu = 0.2
    assert plan_memory(c).time.step_s == pytest.approx(2 * t1)
    c.cluster.gpu_peak_tflops = 0
    assert "time: unknown" in plan_memory(c).table()


def test_refused_on_a_machine_without_the_gpus():
    c = typed(["model=qwen3_8b", "reward=weaver"])
    r = plan_memory(c)
    with pytest.raises(PlanError) as e:
        check_devices(r, c.cluster, have=(0, 0.0), argv=["train", "model=qwen3_8b", "reward=weaver"])
    msg = str(e.value)
    assert "needs 8 GPUs" in msg and "no GPU" in msg and "memory plan for model=qwen3_8b" in msg
    assert msg.rstrip().endswith("nearest command that runs here: rlexp train reward=weaver")
    with pytest.raises(PlanError, match="4 GPU"):
        check_devices(r, c.cluster, have=(4, 80.0), argv=["model=qwen3_8b"])
    check_devices(r, c.cluster, have=(8, 80.0))  # enough: no error


def test_train_refuses_before_spawning(tmp_path):
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlexp", "train", "model=qwen3_8b", "reward=weaver",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "nearest command that runs here: rlexp train reward=weaver" in proc.stdout + proc.stderr
    assert "checks done" not in proc.stderr and time.perf_counter() - t < 120


def test_eval_offline_fails_fast_with_the_fix(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache; no network in the sandbox
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # never the real hub from a test: a closed local port
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlexp", "eval", "benchmark=math500"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    took = time.perf_counter() - t
    assert proc.returncode == 2 and "huggingface-cli download HuggingFaceH4/MATH-500" in proc.stderr
    assert took < 10, took
    # The message waits for no torch import (8 s of a loaded 2-core machine: the exception handler used to import
    # rlexp.models.hf to name the checkpoint error it also catches).
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert "torch" not in imported and "rlexp.models.hf" not in imported


def test_eval_run_defaults_to_its_heldout_split(tmp_path):
    from rlexp.config.model import ModelConfig
    from rlexp.evals.cli import main
    from rlexp.models.tiny import ensure_tiny_checkpoint

    run = tmp_path / "run"
    ensure_tiny_checkpoint(ModelConfig(), run / "checkpoints" / "final")
    cfg = OmegaConf.to_container(compose_run_config([]), resolve=True)
    (run / "manifest.json").write_text(json.dumps({"config": cfg}))
    err = io.StringIO()
    sys_stderr, sys.stderr = sys.stderr, err
    try:
        rc = main([f"run={run}", "max_samples=6", "batch_size=4", "--out", str(tmp_path / "out")])
    finally:
        sys.stderr = sys_stderr
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "samples_arithmetic_heldout.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert "[rlexp eval] arithmetic_heldout" in err.getvalue() and "6/6 problems" in err.getvalue()


def test_eval_help_names_the_offline_benchmarks():
    from rlexp.evals.cli import help_text

    text = help_text()
    assert "Offline" in text and "gpqa_diamond, gsm8k" in text and "run=PATH" in text


def test_phases_print_one_line_each_with_time():
    out = io.StringIO()
    p = Phases(out)
    p.done("checks done")
    p.done("hosts up")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[rlexp] checks done (") and lines[0].endswith(" s)")




def test_first_phase_counts_from_the_process_start():
    out = io.StringIO()
    time.sleep(0.2)
    assert Phases(out, since_start=True).done("started") >= 0.2
