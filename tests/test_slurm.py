"""`cluster=slurm` against a real Slurm: Debian's slurm-wlm (22.05) brought up on this machine by
scripts/slurm_local.sh (installed with apt-get when missing; skipped only where that is impossible),
and taken down after the tests. A run trains on it, a sweep runs through the in-package submitit
preset, and no allocation outlives its run: `kill -9` of the controller, SIGTERM, a job cancelled
from outside, a job that cannot start.

The parsing of `squeue --json` (both layouts) and the presets are checked first, without Slurm, in
the unmarked tests at the top."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.cluster.hosts import job_spec
from rlexp.cluster.jobs import slurm_queue as q
from rlexp.config.schema import TrainConfig, register_configs
from tests.conftest import (
    REPO,
    SHORT,
    FinishedRun,
    kill_tagged,
    metrics,
    rlexp,
    tagged_env,
    wait_no_orphans,
)

SCRIPT = REPO / "scripts" / "slurm_local.sh"
CONF = REPO / "conf"
GONE_S = (
    15.0  # the bound on "the allocation and its processes are gone" after the controller is killed
)
QUICK = ["eval.every_n_steps=0", "algorithm.prompts_per_step=8"]
# Monarch's bounds for declaring a host that vanished dead (defaults 60 s and 30 s), shortened
# for the one test that waits on them; above a loaded machine's worst pause between status polls.
MONARCH_FAST_DEATH = {
    "HYPERACTOR_MESH_GET_PROC_STATE_MAX_IDLE": "15s",
    "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT": "15s",
}
TIMING = ("perf/",)  # metrics that measure this machine's speed, not what the run computed
register_configs()


def cfg(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_object(compose("train", overrides=list(overrides)))


# --- without Slurm --------------------------------------------------------------------------------
# One job of Slurm 22.05's `squeue --json` (trimmed), as this machine's Slurm printed it, and the
# newer layout
# Monarch 0.7 reads.
OLD = {
    "job_id": 7,
    "job_state": "RUNNING",
    "state_reason": "None",
    "nodes": "n[1-2]",
    "node_count": 2,
    "partition": "debug",
    "job_resources": {
        "nodes": "n[1-2]",
        "allocated_nodes": [{"nodename": "n1"}, {"nodename": "n2"}],
    },
}
NEW = {
    "job_id": 7,
    "job_state": ["RUNNING"],
    "state_reason": "None",
    "node_count": {"set": True, "number": 2},
    "job_resources": {"nodes": {"allocation": [{"name": "gpu-a"}, {"name": "gpu-b"}]}},
}


@pytest.mark.parametrize(("job", "names"), [(OLD, ["n1", "n2"]), (NEW, ["gpu-a", "gpu-b"])])
def test_both_squeue_layouts_give_the_jobs_nodes_in_order(job: dict, names: list[str]) -> None:
    assert q.states(job) == ["RUNNING"] and q.node_names(job) == names and q.nodes_asked(job) == 2
    assert q.reason(job) == ""


def test_the_job_is_found_by_its_id_among_every_job_22_05_lists() -> None:
    other = {**OLD, "job_id": 3, "job_state": "PENDING", "state_reason": "Resources"}
    data = {
        "jobs": [other, OLD]
    }  # 22.05 ignores --jobs: another job (a sweep's array job) may come first
    assert (
        q.find_job(data, "7") is OLD
        and q.find_job(data, "3") is other
        and q.find_job(data, "9") is None
    )
    assert q.reason(other) == "Resources" and not q.ended(q.states(other))
    assert q.ended(["CANCELLED"]) and q.ended(["FAILED"]) and not q.ended(["RUNNING", "COMPLETING"])


def test_slurm_defaults_run_this_interpreter_for_a_finite_time() -> None:
    _, meshes, kw = job_spec(cfg("cluster=slurm").cluster)
    assert kw["python_exe"] == sys.executable  # not whatever `python` is on PATH
    assert kw["time_limit"] and kw["job_start_timeout"] > 0 and kw["gpus_per_node"] == 8
    _, meshes, kw = job_spec(cfg("cluster=slurm_cpu").cluster)
    assert meshes == {"generator": 1} and "gpus_per_node" not in kw  # no gres on a CPU partition


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.job_options.start_timeout_s=0", "start_timeout_s=0: give seconds > 0, or null"),
        (
            "cluster.job_options.heartbeat_timeout_s=5",
            "heartbeat_timeout_s=5: give 0 .no guard. or >= 15 s",
        ),
        ("cluster.job_options.port=80", "cluster.job_options.port=80: give a port from 1024"),
    ],
)
def test_slurm_values_that_cannot_work_are_refused_naming_the_key(
    override: str, message: str
) -> None:
    from rlexp.cluster.hosts import check_cluster

    with pytest.raises(ValueError, match=message):
        check_cluster(cfg("cluster=slurm_cpu", override).cluster)


def test_the_cpu_presets_ship_inside_the_package() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose("train", overrides=["+launchers=slurm_cpu"], return_hydra_config=True)
    assert (
        c.hydra.launcher._target_.endswith("SlurmLauncher")
        and c.hydra.launcher.gpus_per_node is None
    )
    import importlib.util

    spec = importlib.util.spec_from_file_location("rlexp_setup", REPO / "setup.py")
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # not as __main__: nothing is built
    shipped = {  # what the wheel holds under rlexp/ (tests/test_install.py installs one)
        "/".join([*pkg.split(".")[1:], f.name]) for pkg, d in setup_py.conf_packages().items()
        for g in setup_py.CONF_FILES for f in d.glob(g)
    }
    assert {"conf/cluster/slurm_cpu.yaml", "conf/launchers/slurm_cpu.yaml"} <= shipped


# --- a real Slurm ---------------------------------------------------------------------------------
def slurm(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def slurm_up() -> object:
    """A one-node Slurm for the session (`up` is quick when it already runs); down afterwards."""
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip(
            "no Slurm here and no apt-get to install Debian's slurm-wlm (scripts/slurm_local.sh)"
        )
    if os.geteuid() != 0 and shutil.which("slurmctld") is None:
        pytest.skip(
            "no Slurm here, and installing Debian's slurm-wlm needs root (scripts/slurm_local.sh)"
        )
    up = slurm("up", "--nodes", "1")
    assert up.returncode == 0, f"scripts/slurm_local.sh up failed:\n{up.stdout}\n{up.stderr}"
    conf = next(
        line.split("=", 1)[1]
        for line in up.stdout.splitlines()
        if line.startswith("export SLURM_CONF=")
    )
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # for squeue here and every rlexp the tests start
    yield up
    down = slurm("down")
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    assert down.returncode == 0, down.stderr
    assert not [p for p in _daemons()], f"daemons left after down: {_daemons()}"


def _daemons() -> list[str]:
    out = subprocess.run(
        ["pgrep", "-a", "-f", "slurmctld|slurmd -N|munged --force --socket=/tmp/rlexp-slurm"],
        capture_output=True,
        text=True,
    )
    return out.stdout.splitlines()


def queue() -> list[str]:
    """Job ids Slurm still holds as pending, running or completing."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "PD,R,CG,CF", "-o", "%i"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def wait_queue_empty(timeout: float) -> tuple[list[str], float]:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not queue():
            return [], time.time() - t0
        time.sleep(0.25)
    return queue(), time.time() - t0


def start(
    run: Path, tag: str, *overrides: str, env: dict[str, str] | None = None,
    quick: tuple[str, ...] | list[str] = tuple(QUICK),
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlexp",
            "train",
            "cluster=slurm_cpu",
            *quick,
            *overrides,
            f"hydra.run.dir={run}",
        ],
        cwd=REPO,
        env={**tagged_env(tag), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until(proc: subprocess.Popen, needle: str, timeout: float = 300) -> str:
    seen, t0 = "", time.time()
    while time.time() - t0 < timeout:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen += line
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} not seen in {timeout} s:\n{seen[-3000:]}")


@dataclass(frozen=True)
class StoppedAndResumed:
    """One run on Slurm (the session's default run, `SHORT`), stopped by SIGTERM at step 2, what
    was seen right after the stop, then `resume=auto` to the end: both tests below read it."""

    run: Path
    stopped_out: str  # the controller's output up to its exit after SIGTERM
    left: list[str]  # Slurm's queue GONE_S after the stop
    orphans: list[int]  # processes of the run still alive GONE_S after the stop
    resume_from: Path | None  # the checkpoint `resume=auto` finds after the stop
    status: str  # the manifest's status after the stop
    resumed: subprocess.CompletedProcess  # `resume=auto` to the end


@pytest.fixture(scope="module")
def stopped_and_resumed(
    slurm_up: object, tmp_path_factory: pytest.TempPathFactory
) -> StoppedAndResumed:
    """SIGTERM is what Slurm sends a controller running inside an allocation at its time limit or
    preemption. Two `rlexp train` starts serve two tests: the run that trains on Slurm and ends
    with its allocation, and the one stopped by SIGTERM and resumed (its uninterrupted reference is
    the session's `short_run`, the same config on one host: placement changes no number)."""
    from rlexp.run import checkpoints

    run, tag = tmp_path_factory.mktemp("slurm") / "run", uuid.uuid4().hex
    try:
        proc = start(run, tag, quick=SHORT)
        seen = read_until(proc, "step 2/6")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
        out = seen + out
        left, _ = wait_queue_empty(GONE_S)
        orphans = wait_no_orphans(tag, timeout=GONE_S)
        resume_from = checkpoints.find_resume("auto", run)
        status = json.loads((run / "manifest.json").read_text())["status"]
        resumed = rlexp("train", "cluster=slurm_cpu", *SHORT, "resume=auto",
                        f"hydra.run.dir={run}", tag=tag)
    except BaseException:
        kill_tagged(tag)
        raise
    return StoppedAndResumed(run, out, left, orphans, resume_from, status, resumed)


@pytest.mark.slurm
@pytest.mark.slow
def test_rlexp_trains_on_slurm_and_the_allocation_ends_with_the_run(
    stopped_and_resumed: StoppedAndResumed,
) -> None:
    run, p = stopped_and_resumed.run, stopped_and_resumed.resumed
    assert [r["step"] for r in metrics(run) if "loss" in r] == [1, 2, 3, 4, 5, 6]
    for out in (stopped_and_resumed.stopped_out, p.stdout):  # the generator ran in the allocation
        assert "generator0  {'procs': 1} on host generator_0" in out
    jobs = [f.stem for f in (run / "slurm").glob("*.out")]  # each start's job output, in the run
    assert len(jobs) == 2 and all((run / "slurm" / f"{job}.err").exists() for job in jobs)
    assert (run / "slurm" / "heartbeat").exists()
    assert queue() == []


@pytest.mark.slurm
@pytest.mark.slow
def test_a_seed_sweep_runs_as_slurm_jobs_through_the_packaged_launcher(
    slurm_up: object, tmp_path: Path, tag: str
) -> None:
    sweep = tmp_path / "sweep"
    rlexp(
        "train",
        "-m",
        "seed=0,1",
        "steps=1",
        *QUICK,
        "+launchers=slurm_cpu",
        "hydra.launcher.timeout_min=15",
        f"hydra.sweep.dir={sweep}",
        tag=tag,
        timeout=900,
    )
    for member in ("0", "1"):
        assert [r["step"] for r in metrics(sweep / member) if "loss" in r] == [1]
    assert (
        len(list((sweep / ".submitit").glob("*/*_log.out"))) == 2
    )  # each member was a Slurm job of its own
    assert (
        wait_queue_empty(GONE_S)[0] == []
    )  # a member's job completes just after submitit has its result


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize(
    "moment", ["submitted (1 node(s))", "step 2/50"]
)  # just after sbatch; mid-run
def test_kill_9_of_the_controller_cancels_its_allocation(
    slurm_up: object, tmp_path: Path, tag: str, moment: str
) -> None:
    proc = start(tmp_path / "run", tag, "steps=50")
    read_until(proc, moment)
    assert len(queue()) == 1
    proc.kill()
    proc.wait()
    left, took = wait_queue_empty(GONE_S)
    assert left == [], f"the allocation outlived its controller by {GONE_S} s"
    assert wait_no_orphans(tag, timeout=GONE_S) == []  # the workers, the local trainer, the reaper
    print(f"allocation gone {took:.1f} s after kill -9 at {moment!r}")


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_cancelled_from_outside_stops_the_run_with_the_resume_command(
    slurm_up: object, tmp_path: Path, tag: str
) -> None:
    """The run announces the cancel within seconds (its watch thread), but stops only once Monarch
    declares the generator's host dead: no proc status for 60 s and an unacknowledged message for
    30 s by default, most of this test's time. Shorter here (MONARCH_FAST_DEATH: this run only)."""
    proc = start(
        tmp_path / "run",
        tag,
        "steps=50",
        "checkpoint.every_n_steps=1",
        "cluster.fault.max_restarts=0",
        env=MONARCH_FAST_DEATH,
    )
    read_until(proc, "step 2/50")
    subprocess.run(["scancel", *queue()], check=True)
    t0 = time.time()
    out, _ = proc.communicate(timeout=240)
    took = time.time() - t0
    assert proc.returncode == 3, out[-3000:]
    assert "ended outside this run: CANCELLED" in out and "resume=auto" in out
    assert "CANCELLED AT" in out  # the job's own last lines, from the run folder's slurm/<id>.err
    assert queue() == [] and wait_no_orphans(tag, timeout=GONE_S) == []
    print(f"run stopped {took:.1f} s after scancel")


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_that_cannot_start_times_out_saying_why_and_is_cancelled(
    slurm_up: object, tmp_path: Path, tag: str
) -> None:
    p = rlexp(
        "train",
        "cluster=slurm_cpu",
        "cluster.hosts=2",
        "cluster.hosts_per_role.trainer=1",
        "steps=2",
        "cluster.job_options.start_timeout_s=3",
        *QUICK,
        f"hydra.run.dir={tmp_path / 'run'}",
        tag=tag,
        check=False,
    )
    assert p.returncode == 3, p.stderr[-3000:]
    line = next(x for x in p.stderr.splitlines() if x.startswith("rlexp: stopped:"))
    assert "did not start within 3 s: pending (PartitionNodeLimit): 2 node(s) asked" in line
    assert "partition debug: 1 node (1 idle)" in line and "It is cancelled" in line
    assert "Traceback" not in p.stderr
    assert queue() == [] and wait_no_orphans(tag) == []


@pytest.mark.slurm
@pytest.mark.slow
def test_sigterm_checkpoints_ends_the_allocation_and_resume_continues_identically(
    stopped_and_resumed: StoppedAndResumed, short_run: FinishedRun
) -> None:
    """The allocation must be gone at once, a checkpoint written and the manifest marked, and
    `resume=auto` must end with the metrics of an uninterrupted run (`compare_metrics`: the
    services' per-process request counters and timings aside)."""
    from rlexp.tracking.reproduce import compare_metrics

    r = stopped_and_resumed
    assert r.left == [] and r.orphans == [], r.stopped_out[-2000:]
    assert r.resume_from is not None, r.stopped_out[-2000:]
    assert r.status == "interrupted"
    assert "resumed from" in r.resumed.stdout
    assert compare_metrics(short_run.run / "metrics.jsonl", r.run / "metrics.jsonl") is None


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_whose_controller_vanished_cancels_itself_when_the_heartbeat_goes_stale(
    slurm_up: object, tmp_path: Path
) -> None:
    """The guard for a controller whose host died with its reaper: nobody touches the heartbeat, so
    the worker
    (the real one the batch script runs, Monarch included) cancels its own job after --stale-s."""
    beat = tmp_path / "heartbeat"
    beat.touch()
    worker = (
        f"{sys.executable} -m rlexp.cluster.jobs.slurm_worker --port 23456 "
        f"--heartbeat {beat} --stale-s 2"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    job = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/%j.out", "--wrap", f"srun {worker}"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    left, took = wait_queue_empty(60)
    assert left == [], f"job {job} still there {took:.0f} s after its heartbeat went stale"
    text = (tmp_path / f"{job}.out").read_text()
    assert "has not changed for 2 s: the controller is gone; cancelling Slurm job" in text, text[
        -2000:
    ]
    print(f"job gone {took:.1f} s after submission (stale after 2 s)")


def strip_timing(rows: list[dict]) -> list[dict]:
    return [
        {
            k: v
            for k, v in r.items()
            if not k.startswith(TIMING) and "time" not in k and not k.endswith("_s")
        }
        for r in rows
    ]


@pytest.mark.slurm
@pytest.mark.soak
def test_two_slurm_nodes_on_one_host_train_like_the_process_cluster(
    slurm_up: object, tmp_path: Path, tag: str
) -> None:
    """Trainer and generator on two Slurm nodes (emulated on this host, each worker on its own port)
    compute
    exactly what simulated hosts do (`cluster=process`, the same layout)."""
    two = slurm("up", "--nodes", "2")
    assert two.returncode == 0, two.stderr
    try:
        layout = ["cluster.hosts=2", "steps=4", *QUICK]
        p = rlexp(
            "train",
            "cluster=slurm_cpu",
            "cluster.hosts_per_role.trainer=1",
            *layout,
            f"hydra.run.dir={tmp_path / 'slurm'}",
            tag=tag,
        )
        rlexp(
            "train",
            "cluster=process",
            "cluster.hosts_per_role.reward=0",
            *layout,
            f"hydra.run.dir={tmp_path / 'process'}",
            tag=tag,
        )
    finally:
        assert slurm("up", "--nodes", "1").returncode == 0
    assert "trainer     {'hosts': 1, 'procs': 1} on host trainer_0" in p.stdout
    err = "".join(f.read_text() for f in (tmp_path / "slurm" / "slurm").glob("*.err"))
    assert "worker of node n1 (index 0) at" in err and "worker of node n2 (index 1) at" in err
    assert ":22222" in err and ":22223" in err  # one port per node
    assert strip_timing(metrics(tmp_path / "slurm")) == strip_timing(metrics(tmp_path / "process"))
