"""The cluster group: which Monarch job provides the hosts, which host each role and GPU gets, and the
refusals a layout deserves before anything is spawned. Slurm and Kubernetes cannot run here, so their jobs
are checked as the exact arguments rlexp gives Monarch's SlurmJob / KubernetesJob (and SlurmJob is built)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.cluster.hosts import check_cluster, job_spec, weight_hosts
from rlexp.cluster.layout import auto_threads, gpu_layout
from rlexp.config.schema import TrainConfig, register_configs
from rlexp.config.validate import ConfigError, validate
from tests.conftest import REPO, metrics, rlexp, wait_no_orphans

CONF = REPO / "conf"
register_configs()


def cfg(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_object(compose("train", overrides=list(overrides)))


@pytest.mark.parametrize(("overrides", "cores", "threads"), [
    ([], 2, 2),  # on-policy: generator and trainer take turns, each gets every core
    ([], 16, 16),
    (["sync=async"], 2, 1),  # generator and trainer compute at once
    (["sync=async"], 16, 8),
    (["generator.replicas=2"], 2, 1),  # two replicas generate at once
    (["cluster=process"], 2, 2),  # simulated hosts are this machine's processes
    (["reward=weaver", "verifier_set=arithmetic"], 2, 1),  # six verifier processes score at once
    (["cluster=slurm"], 2, 0),  # another machine's cores: torch's default there
    (["cluster.device=cuda"], 2, 0),
])
def test_unset_threads_share_this_machines_cores_among_processes_computing_at_once(
        overrides: list[str], cores: int, threads: int) -> None:
    assert auto_threads(cfg(*overrides), cores=cores) == threads


def test_the_derived_thread_count_is_written_into_the_run_config_and_a_set_one_is_kept() -> None:
    from rlexp.run.prepare import check_config, recorded
    expected = auto_threads(cfg("sync=async"))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        raw = compose("train", overrides=["sync=async"])
        kept = compose("train", overrides=["cluster.threads_per_proc=3"])
    assert raw.cluster.threads_per_proc is None
    typed = check_config(raw)
    assert typed.cluster.threads_per_proc == expected >= 1
    assert raw.cluster.threads_per_proc is None  # decided once, in the typed config
    assert recorded(raw, typed)["cluster"]["threads_per_proc"] == expected  # the manifest's config records what ran
    assert check_config(kept).cluster.threads_per_proc == 3


def test_process_job_gives_each_role_simulated_hosts() -> None:
    c = cfg("cluster=process", "generator.replicas=2", "cluster.hosts_per_role.generator=2")
    assert job_spec(c.cluster) == ("ProcessJob", {"generator": 2, "trainer": 1, "reward": 1}, {})
    assert weight_hosts(c.cluster) == 1  # simulated hosts share this machine's /dev/shm
    assert job_spec(cfg().cluster)[0] == "LocalJob"


def test_slurm_job_takes_every_site_value_from_the_config() -> None:
    c = cfg("cluster=slurm", "cluster.job_options.partition=gpu", "cluster.job_options.account=proj",
            "cluster.job_options.qos=high", "cluster.job_options.time_limit=12:00:00",
            "cluster.job_options.extra_args=[--exclusive]")
    kind, meshes, kw = job_spec(c.cluster)
    assert (kind, meshes) == ("SlurmJob", {"trainer": 1, "generator": 1})
    assert kw["partition"] == "gpu" and kw["account"] == "proj" and kw["qos"] == "high"
    assert kw["time_limit"] == "12:00:00" and kw["gpus_per_node"] == 8 and kw["slurm_args"] == ["--exclusive"]
    assert "mem" not in kw  # unset values are Monarch's defaults, not ours
    # The arguments are ones rlexp's SlurmJob (Monarch's, adapted) takes (building it submits
    # nothing). In a process of its own: SlurmJob switches Monarch's default channel transport to
    # TCP for the whole process.
    code = f"from rlexp.cluster.jobs.slurm import SlurmJob; SlurmJob.make({meshes!r}, {kw!r}, None)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert weight_hosts(c.cluster) == 2  # real hosts: /dev/shm cannot carry the weights


def test_kubernetes_job_spec_carries_image_and_gpus() -> None:
    c = cfg("cluster=kubernetes", "cluster.job_options.image=repo/rlexp:1",
            "cluster.job_options.namespace=rl")
    kind, meshes, kw = job_spec(c.cluster)
    assert (kind, meshes) == ("KubernetesJob", {"trainer": 1, "generator": 1})
    assert kw["image"] == "repo/rlexp:1" and kw["namespace"] == "rl" and kw["gpus_per_pod"] == 8


def test_the_built_in_backends_settings_are_their_job_options_as_a_users_are() -> None:
    """slurm and kubernetes declare a `Settings` dataclass filled from `cluster.job_options`, the
    contract a user's backend follows (docs/plugins.md); their presets list every setting, so each
    is set without `+`; a mistyped one is refused naming the close match; the old section's key
    names its new spelling."""
    import dataclasses

    from rlexp.cluster.registry import job_backend
    from rlexp.config.suggest import unknown_key

    for preset, name in (("slurm", "slurm"), ("slurm_cpu", "slurm"), ("kubernetes", "kubernetes")):
        settings = job_backend(name).Settings
        given = cfg(f"cluster={preset}").cluster.job_options
        assert sorted(given) == sorted(f.name for f in dataclasses.fields(settings)), preset
    defaults = dataclasses.asdict(job_backend("slurm").Settings())
    assert dict(cfg("cluster=slurm").cluster.job_options) == defaults  # the preset repeats them
    with pytest.raises(ValueError, match=r"unknown option 'partiton'; did you mean partition"):
        check_cluster(cfg("cluster=slurm", "+cluster.job_options.partiton=gpu").cluster)
    with pytest.raises(ValueError, match=r"extra_args='--exclusive' must be a list"):
        check_cluster(cfg("cluster=slurm", "cluster.job_options.extra_args=--exclusive").cluster)
    assert unknown_key("cluster.slurm.partition") == (
        "cluster.slurm.partition moved: it is now cluster.job_options.partition (the slurm backend's "
        "settings, its `Settings` in rlexp/cluster/jobs/slurm.py)")
    from rlexp.config.overrides import OverrideError, check_overrides

    with pytest.raises(OverrideError, match=r"moved: it is now cluster.job_options.image"):
        check_overrides(["cluster.kubernetes.image=x"], "an old manifest's overrides")


@pytest.mark.parametrize("overrides,message", [
    (["cluster.hosts_per_role.generator=2"], "cluster.job=local has this one host"),
    (["cluster=process", "cluster.hosts_per_role.generator=0", "cluster.hosts_per_role.trainer=0",
      "cluster.hosts_per_role.reward=0"], "needs cluster.hosts_per_role"),
])
def test_impossible_layouts_are_refused_with_the_fix(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_cluster(cfg(*overrides).cluster)


def gpu_cfg(*overrides: str) -> TrainConfig:
    c = cfg("cluster=slurm", "generator=vllm", *overrides)
    return c


def test_gpus_are_numbered_per_host() -> None:
    # Qwen3-14B on two 8-GPU nodes: trainer FSDP 8 on one, four TP-2 generator replicas on the other.
    c = gpu_cfg("model=qwen3_14b")
    assign, used = gpu_layout(c)
    assert assign["trainer"] == [str(r) for r in range(8)]
    assert [assign[f"generator{i}"] for i in range(4)] == [["0,1"], ["2,3"], ["4,5"], ["6,7"]]
    assert used == {"trainer_0": 8, "generator_0": 8}
    # Qwen3-32B: trainer FSDP 8 x TP 2 over two nodes (rank r on node r // 8), two TP-4 replicas on a third.
    c = gpu_cfg("model=qwen3_32b", "cluster.hosts=3", "cluster.hosts_per_role.trainer=2")
    assign, used = gpu_layout(c)
    assert assign["trainer"] == [str(r % 8) for r in range(16)]
    assert used == {"trainer_0": 8, "trainer_1": 8, "generator_0": 8}


def test_a_host_that_cannot_hold_its_roles_is_refused_naming_it() -> None:
    from rlexp.cluster.layout import check_hosts_fit

    c = gpu_cfg("model=qwen3_14b", "cluster.hosts_per_role.generator=0", "model.parallelism.generator_replicas=5")
    with pytest.raises(ConfigError, match="local: 10"):  # the generators fall back to the controller's host
        check_hosts_fit(c)
    c = gpu_cfg("model=qwen3_32b", "cluster.hosts=3", "cluster.hosts_per_role.trainer=3")
    with pytest.raises(ConfigError, match="whole TP groups"):
        check_hosts_fit(c)
    check_hosts_fit(gpu_cfg("model=qwen3_14b"))  # the 80 GB two-node layout is launchable


def test_cpu_process_cluster_validates() -> None:
    validate(cfg("cluster=process"))


@pytest.mark.parametrize("experiment", ["qwen3_14b_math", "qwen3_32b_math"])
def test_multi_node_presets_plan_and_fit_their_hosts(experiment: str) -> None:
    from rlexp.cluster import plan_cli

    assert plan_cli.main([f"experiment={experiment}", "reward=weaver"]) == 0
    c = cfg(f"experiment={experiment}", "reward=weaver")
    from rlexp.cluster.layout import check_hosts_fit

    check_hosts_fit(c)
    _, used = gpu_layout(c)
    assert all(n <= 8 for n in used.values()) and len(used) == c.cluster.hosts


def test_a_job_kind_registered_from_outside_rlexp_is_recognised_by_prepare_and_plan() -> None:
    """One module (tests/toy_job.py) adds a job kind: job spec, checks, config check and `rlexp plan` take it by its
    `package.module:Class` name, with no edit anywhere in rlexp."""
    from rlexp.cluster import plan_cli
    from rlexp.cluster.registry import JOBS, job_backend
    from rlexp.run.prepare import check_config

    name = "tests.toy_job:LocalTwo"
    c = cfg(f"cluster.job={name}")
    check_cluster(c.cluster)
    assert job_backend(name) is JOBS["local2"]
    assert job_spec(c.cluster) == ("LocalJob", {}, {}) and weight_hosts(c.cluster) == 1
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert check_config(compose("train", overrides=[f"cluster.job={name}"])).cluster.job == name
    assert plan_cli.main(["model=qwen3_8b", "reward=weaver", f"cluster.job={name}"]) == 0


def test_an_unknown_job_kind_is_refused_naming_the_choices() -> None:
    from rlexp.run.prepare import check_config

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        bad = compose("train", overrides=["cluster.job=lsf"])
    with pytest.raises(ConfigError,
                       match=r"unknown cluster.job 'lsf'; choose one of \[.*'kubernetes', "
                             r"'local', .*slurm"):
        check_config(bad)
    with pytest.raises(ConfigError, match=r"unknown cluster.job 'slrum'; did you mean 'slurm'"):
        check_config(OmegaConf.merge(bad, {"cluster": {"job": "slrum"}}))
    with pytest.raises(ConfigError,
                       match=r"cluster.job tests.nope:X: cannot import module 'tests.nope'"):
        check_config(OmegaConf.merge(bad, {"cluster": {"job": "tests.nope:X"}}))


@pytest.mark.slow
def test_rlexp_train_runs_on_a_job_kind_from_outside_rlexp(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    p = rlexp("train", "cluster.job=tests.toy_job:LocalTwo", "steps=2", "eval.every_n_steps=0",
              f"hydra.run.dir={run}", tag=tag)
    assert "actor graph (cluster=local: local2 job, cpu, 1 host" in p.stdout
    assert [r["step"] for r in metrics(run) if "loss" in r] == [1, 2]
    assert wait_no_orphans(tag) == []
