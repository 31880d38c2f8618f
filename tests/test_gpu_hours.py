"""`rlexp plan ... +sweeps=NAME` prints a sweep's GPU-hours (issue 46 item 5): the preset is expanded as Hydra's
basic sweeper expands it, every run is composed with real Hydra and planned by the real planner, and the hours are
the planner's own step-time estimate times the GPUs the layout holds."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlexp.cluster import gpu_hours
from rlexp.cluster.plan_cli import compose_run_config
from rlexp.cluster.planner import plan_memory
from rlexp.config.typed import typed_config
from tests.conftest import REPO


def test_the_sweep_argument_is_taken_out_and_only_one_is_allowed():
    assert gpu_hours.take_sweep(["experiment=x", "+sweeps=weaver_table", "seed=1"]) == (
        ["experiment=x", "seed=1"], "weaver_table")
    assert gpu_hours.take_sweep(["experiment=x"]) == (["experiment=x"], None)
    with pytest.raises(gpu_hours.SweepError, match="one at a time"):
        gpu_hours.take_sweep(["+sweeps=a", "+sweeps=b"])


def test_the_weaver_table_expands_to_seven_arms_by_five_seeds():
    runs = gpu_hours.expand(REPO / "conf" / "sweeps" / "weaver_table.yaml")
    assert len(runs) == 35 and runs[0][:2] == ["reward=single_rm_debiased", "seed=0"]
    assert {r[0] for r in runs} == {f"reward={a}" for a in ("single_rm_debiased", "best_verifier", "verifier_mean",
                                                            "verifier_vote", "weaver_paper", "weaver", "annotated")}


def test_a_sweep_hydra_cannot_list_plainly_is_refused_by_name(tmp_path: Path):
    (tmp_path / "s.yaml").write_text("hydra:\n  sweeper:\n    params:\n      seed: range(0,5)\n")
    with pytest.raises(gpu_hours.SweepError, match=r"seed=.*not a plain comma-separated list"):
        gpu_hours.expand(tmp_path / "s.yaml")
    with pytest.raises(gpu_hours.SweepError, match="no sweep preset 'nope'"):
        gpu_hours.sweep_file("nope", [tmp_path])


def test_a_sweeps_gpu_hours_are_the_planners_hours_times_the_gpus_held(tmp_path: Path):
    (tmp_path / "mini.yaml").write_text("hydra:\n  sweeper:\n    params:\n      reward: annotated,weaver_paper\n"
                                        "      cluster: slurm_2nodes_verifiers\n      verifier_set: math_wide\n")
    planned = {}

    def plan(run: list[str]):
        cfg = typed_config(compose_run_config(run))
        planned[next(o for o in run if o.startswith("reward="))] = report = plan_memory(cfg)
        return cfg, report

    lines, ok = gpu_hours.plan_sweep("mini", ["experiment=qwen3_8b_math"], plan, roots=[tmp_path])
    assert ok and lines[0].startswith("sweep mini.yaml: 2 runs")
    t = planned["reward=weaver_paper"].time
    hours = t.step_s * t.steps / 3600
    # annotated uses the controller's node only (trainer 3 + generators 2); weaver_paper adds the six verifiers'.
    assert f"{5:>9}  {8:>4}  {hours:>5.2f}  {8 * hours:>5.1f}  yes" in lines[2]
    assert f"{11:>9}  {16:>4}  {hours:>5.2f}  {16 * hours:>5.1f}  yes" in lines[3]
    assert lines[-1].startswith(f"GPU-hours of the sweep: {24 * hours:,.0f} ")


def test_the_expansion_is_hydras_own_multirun_split_and_a_job_composes_with_cfg_job(tmp_path: Path):
    """What `rlexp plan +sweeps=` counts is what `rlexp train -m` launches: Hydra's basic sweeper splits the
    preset's params into the same 35 jobs in the same order; one of them composes as a job (`--cfg job`)."""
    import subprocess
    import sys

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    path = REPO / "conf" / "sweeps" / "weaver_table.yaml"
    params = OmegaConf.to_container(OmegaConf.load(path).hydra.sweeper.params)
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    (jobs,) = BasicSweeper.split_arguments(parsed, None)
    assert gpu_hours.expand(path) == jobs and len(jobs) == 35
    p = subprocess.run([sys.executable, "-m", "rlexp", "train", "experiment=qwen3_8b_math",
                        "+sweeps=weaver_table", *jobs[22], "--cfg", "job"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    cfg = OmegaConf.create(p.stdout)
    assert jobs[22][:2] == ["reward=weaver_paper", "seed=2"] and cfg.seed == 2 and cfg.reward.name == "weaver"
    assert cfg.cluster.name == "slurm_2nodes_verifiers" and cfg.verifier_set.name == "math_wide"
    assert len(cfg.verifier_set.members) == 8


def test_plan_of_one_run_prints_its_gpu_hours(capsys):
    from rlexp.cluster import plan_cli

    assert plan_cli.main(["model=qwen3_8b", "reward=weaver"]) == 0
    out = capsys.readouterr().out
    report = plan_memory(compose_run_config(["model=qwen3_8b", "reward=weaver"]))
    hours = report.time.step_s * report.time.steps / 3600
    # one node: trainer 3 + generators 2 + three verifiers use all 8 GPUs of the host
    assert f"GPU-hours: {8 * hours:.1f} (8 GPU(s) held, whole hosts; 8 used) x {hours:.2f} h" in out
