"""Which GPUs every process of a run gets, checked on CPU: the 8B, 14B and 32B presets and
docs/gpu_checks.md's rows, walked role by role through the launcher's per-rank spawn command
(`rlexp.core.gpu_mask.spawn_masks`) and the process bootstrap that applies it
(`rlexp.core.gpu_mask`), under a scheduler's mask; `check_devices` for every CUDA run.
`tests/fake_cuda.py` is a FAKE of `torch.cuda`'s queries (no GPU here); everything else is real:
Hydra composition, the layout, Monarch's bootstrap command objects and, in the slow test, real
processes."""
from __future__ import annotations

import os

import pytest
from monarch._rust_bindings.monarch_hyperactor.shape import Extent, Point
from omegaconf import OmegaConf

from rlexp.cluster.layout import controller_gpus, gpu_placement
from rlexp.cluster.plan_cli import compose_run_config
from rlexp.cluster.planner import PlanError
from rlexp.core import gpu_mask
from rlexp.core.gpu_mask import spawn_masks
from rlexp.run.prepare import check_config
from tests.fake_cuda import fake_cuda

PRESETS = {
    "8B preset": ["experiment=qwen3_8b_math"],
    "8B preset, weaver": ["experiment=qwen3_8b_math", "reward=weaver"],
    "14B preset": ["experiment=qwen3_14b_math"],
    "32B preset": ["experiment=qwen3_32b_math"],
    # docs/gpu_checks.md's rows that launch a run
    "gpu_checks: FSDP x TP trainer": [
        "cluster=gpu_node", "generator.replicas=1", "model.parallelism.trainer_fsdp=2",
        "model.parallelism.trainer_tp=2", "model.arch.n_heads=4", "model.arch.n_kv_heads=2",
        "model.arch.head_dim=32", "steps=20"],
    "gpu_checks: tied 0.6B on vLLM": [
        "cluster=gpu_node", "model=qwen3_0_6b", "generator=vllm", "steps=3"],
}


def spawned(overrides: list[str], masks: dict[str, str | None]) -> dict[str, list[tuple[str, str]]]:
    """Each mesh's processes as (host, CUDA_VISIBLE_DEVICES they start with): the launcher's
    per-rank bootstrap command for the rank, then the bootstrap's `apply` over the environment a
    host's scheduler gave (`masks[host]`, default no mask)."""
    c = OmegaConf.to_object(compose_run_config(overrides))
    place, _ = gpu_placement(c)
    out: dict[str, list[tuple[str, str]]] = {}
    for mesh, ranks in place.items():
        command = spawn_masks([gpus for _, gpus in ranks])
        out[mesh] = []
        for r, (host, gpus) in enumerate(ranks):
            cmd = command(Point(r, Extent(["procs"], [len(ranks)])))
            assert cmd.args == ["-m", "rlexp.core.gpu_mask"] and cmd.env[gpu_mask.GPUS_ENV] == gpus
            env = {k: v for k, v in cmd.env.items() if v is not None}
            if masks.get(host) is not None:
                env["CUDA_VISIBLE_DEVICES"] = masks[host]
            out[mesh].append((host, gpu_mask.apply(env, modules={})))
            gpu_mask.check_mask(gpus, env)  # what the actor asserts in its __init__
    return out


def walk(overrides: list[str],
         masks: dict[str, str | None] | None = None) -> dict[str, list[tuple[str, str]]]:
    """`spawned`, and the invariants every layout must keep: no GPU shared by two processes of a
    host, one GPU per trainer rank and verifier replica, generator.tp per generator replica."""
    c = OmegaConf.to_object(compose_run_config(overrides))
    out = spawned(overrides, masks or {})
    taken: dict[str, list[str]] = {}
    for mesh, procs in out.items():
        for host, visible in procs:
            gpus = visible.split(",")
            want = c.generator.gpus_per_replica if mesh.startswith("generator") else 1
            assert len(gpus) == want, (mesh, visible)
            taken.setdefault(host, []).extend(gpus)
    for host, gpus in taken.items():
        assert len(gpus) == len(set(gpus)), f"{host}: a GPU given twice: {sorted(gpus)}"
        assert len(gpus) <= c.cluster.gpus_per_host
    return out


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_role_gets_its_own_gpus(name):
    out = walk(PRESETS[name])
    assert out["trainer"] and any(m.startswith("generator") for m in out)


def test_8b_preset_by_role():
    """experiment=qwen3_8b_math on one 8-GPU node: trainer FSDP 3 on GPUs 0-2, generators 3 and 4.
    """
    out = walk(PRESETS["8B preset"])
    assert out["trainer"] == [("local", "0"), ("local", "1"), ("local", "2")]
    assert out["generator0"] == [("local", "3")] and out["generator1"] == [("local", "4")]


def test_32b_preset_by_role_under_slurm_masks():
    """experiment=qwen3_32b_math: trainer 16 ranks over two hosts (8 each, TP pairs inside a host),
    two TP-4 generators on a third, verifiers on a fourth; each host's numbering runs through the
    mask Slurm gave it."""
    masks = {"trainer_0": "0,1,2,3,4,5,6,7", "trainer_1": "7,6,5,4,3,2,1,0",
             "generator_0": "4,5,6,7,0,1,2,3"}
    out = walk(PRESETS["32B preset"], masks)
    assert [h for h, _ in out["trainer"]] == ["trainer_0"] * 8 + ["trainer_1"] * 8
    assert [g for _, g in out["trainer"][8:]] == ["7", "6", "5", "4", "3", "2", "1", "0"]
    assert out["generator0"] == [("generator_0", "4,5,6,7")]
    assert out["generator1"] == [("generator_0", "0,1,2,3")]
    verifier_hosts = [h for m, procs in out.items() if m.startswith("verifier_") for h, _ in procs]
    assert verifier_hosts and all(h.startswith("verifier_") for h in verifier_hosts)


def test_scheduler_mask_is_respected_on_a_shared_node():
    """Slurm gave this job GPUs 4-7 of a shared node: rlexp's GPU 0 is physical 4, and nothing lands
    on 0-3."""
    overrides = ["cluster=gpu_node", "model.parallelism.trainer_fsdp=2", "generator.replicas=2"]
    out = walk(overrides, {"local": "4,5,6,7"})
    assert out["trainer"] == [("local", "4"), ("local", "5")]
    assert out["generator0"] == [("local", "6")] and out["generator1"] == [("local", "7")]


def test_mask_refusals():
    # UUID masks map by position
    assert gpu_mask.through_mask("0,1", "GPU-aa,GPU-bb") == "GPU-aa,GPU-bb"
    assert gpu_mask.through_mask("2", None) == "2"
    with pytest.raises(gpu_mask.MaskError, match=r"mask CUDA_VISIBLE_DEVICES='4,5' shows "
                                                 r"2.*--gpus-per-node"):
        gpu_mask.through_mask("2", "4,5")
    with pytest.raises(gpu_mask.MaskError, match="expected GPU indices"):
        gpu_mask.through_mask("x", None)

    class InitialisedCuda:  # torch after something opened CUDA
        cuda = type("cuda", (), {"is_initialized": staticmethod(lambda: True)})

    with pytest.raises(gpu_mask.MaskError, match="CUDA was initialised in this process before its "
                                                 "GPU mask"):
        gpu_mask.apply({gpu_mask.GPUS_ENV: "0"}, modules={"torch": InitialisedCuda})
    env = {gpu_mask.GPUS_ENV: "1", "CUDA_VISIBLE_DEVICES": "3,2"}
    # idempotent
    assert gpu_mask.apply(env, modules={}) == "2" and gpu_mask.apply(env, modules={}) == "2"
    with pytest.raises(gpu_mask.MaskError, match="not set when it was spawned"):
        gpu_mask.check_mask("0", {})  # an actor in a process spawned without its mask
    env["CUDA_VISIBLE_DEVICES"] = "0"
    with pytest.raises(gpu_mask.MaskError, match="changed after spawn"):
        gpu_mask.check_mask("1", env)
    gpu_mask.check_mask(None, {})  # a CPU process: nothing to check


def test_cpu_processes_start_with_rlexps_bootstrap_and_no_mask():
    """A CPU mesh gets the same bootstrap (for its fast exit, `rlexp.core.fast_exit`), with the
    mask variables removed from what the host passes on: `apply` then sets nothing."""
    cmd = spawn_masks([])(Point(0, Extent(["procs"], [1])))
    assert cmd.args == ["-m", "rlexp.core.gpu_mask"]
    assert cmd.env[gpu_mask.GPUS_ENV] is None and cmd.env[gpu_mask.APPLIED_ENV] is None
    env = {k: v for k, v in cmd.env.items() if v is not None}
    assert gpu_mask.apply(env, modules={}) is None and "CUDA_VISIBLE_DEVICES" not in env


def test_layout_beyond_the_visible_gpus_is_refused_before_spawning(monkeypatch):
    """check_devices runs for every CUDA run, the tiny model too: 5 GPUs needed, 4 visible under the
    mask."""
    fake_cuda(monkeypatch, gpus=8, mask="4,5,6,7")
    cfg = compose_run_config(["cluster=gpu_node", "model.parallelism.trainer_fsdp=3",
                              "generator.replicas=2"])
    with pytest.raises(PlanError, match=r"model=tiny needs 5 GPUs .*this machine has 4 GPU\(s\).*"
                                        r"CUDA_VISIBLE_DEVICES=4,5,6,7"):
        check_config(cfg)
    cfg = compose_run_config(["cluster=gpu_node", "model.parallelism.trainer_fsdp=2",
                              "generator.replicas=2"])
    t = check_config(cfg)  # 4 of 4: accepted
    assert t.generator.gpu_memory_utilization > 0  # derived from the plan, not a fixed 0.85


def test_8b_preset_checked_against_the_node(monkeypatch):
    fake_cuda(monkeypatch, gpus=8, gib=80)
    t = check_config(compose_run_config(PRESETS["8B preset, weaver"]))
    assert controller_gpus(t) == 8 and 0.5 < t.generator.gpu_memory_utilization <= 0.9
    fake_cuda(monkeypatch, gpus=8, gib=40)
    with pytest.raises(PlanError, match=r"of 80\.0 GiB on this machine"):
        check_config(compose_run_config(PRESETS["8B preset, weaver"]))


def test_slurm_controller_without_gpus_is_not_refused(monkeypatch):
    """experiment=qwen3_32b_math runs every role on Slurm hosts of its own: the controller (a login
    node, no GPU) hosts none, so it is not asked for any; a role left on it would be."""
    fake_cuda(monkeypatch, gpus=0)
    t = check_config(compose_run_config(PRESETS["32B preset"]))
    assert controller_gpus(t) == 0
    with pytest.raises(PlanError, match=r"needs 16 GPUs .*no GPU visible"):
        check_config(compose_run_config([*PRESETS["32B preset"], "cluster.hosts_per_role.trainer=0",
                                         "cluster.hosts=2", "cluster.gpus_per_host=16"]))


@pytest.mark.slow
def test_real_processes_start_with_their_masks(monkeypatch):
    """Real Monarch processes spawned by `Graph.procs` under a scheduler's mask: each rank's
    CUDA_VISIBLE_DEVICES is set before its actor runs, mapped through the mask, and the actor's
    check passes."""
    from monarch.actor import Actor, endpoint

    from rlexp.cluster.hosts import Hosts
    from rlexp.config.schema import ClusterConfig
    from rlexp.run.launcher import Graph

    class Where(Actor):
        @endpoint
        def env(self, expected: str) -> dict[str, str | None]:
            gpu_mask.check_mask(expected)
            return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", gpu_mask.APPLIED_ENV)}

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    g = Graph(Hosts(ClusterConfig()))
    try:
        g.gpus = {"trainer": ["1", "0"]}
        mesh = g.procs("trainer", 2)
        got = mesh.spawn("where", Where)
        envs = [got.slice(procs=r).env.call_one(e).get() for r, e in enumerate(["1", "0"])]
        assert envs == [{"CUDA_VISIBLE_DEVICES": "7", gpu_mask.APPLIED_ENV: "1->7"},
                        {"CUDA_VISIBLE_DEVICES": "6", gpu_mask.APPLIED_ENV: "0->6"}]
    finally:
        g.stop()


def test_wiring_gives_masks_to_spawned_roles_only(monkeypatch):
    """The launcher's roles carry their GPUs (checked against the spawn mask in each actor); the
    in-process twin (`rlexp.run.inprocess`, every role in one process) carries none: its roles share
    this process's device."""
    from rlexp.run.prepare import prepare
    from rlexp.run.wiring import wiring

    fake_cuda(monkeypatch, gpus=8)
    p = prepare(compose_run_config(["cluster=gpu_node", "generator.replicas=2"]))
    w = wiring(p)
    assert w.trainer.settings.policy.ranks.gpus == ["0"]
    assert [g.settings.gpus for g in w.generators] == ["1", "2"]
    one = wiring(p, spawned=False)
    assert one.trainer.settings.policy.ranks.gpus is None
    assert [g.settings.gpus for g in one.generators] == [None] * 2


def test_plan_prints_each_roles_devices_through_the_mask():
    """`rlexp plan` lists every mesh's GPUs, on this machine through its CUDA_VISIBLE_DEVICES."""
    from rlexp.cluster.plan_cli import role_devices

    overrides = ["cluster=gpu_node", "model.parallelism.trainer_fsdp=3", "generator.replicas=2"]
    t = OmegaConf.to_object(compose_run_config(overrides))
    line = role_devices(t, mask="4,5,6,7")
    assert line.startswith("devices: trainer local:0(=GPU 4) local:1(=GPU 5) local:2(=GPU 6);")
    assert "generator0 local:3(=GPU 7)" in line
    assert "generator1 local:4(beyond CUDA_VISIBLE_DEVICES=4,5,6,7)" in line
