"""Chaos on simulated hosts (`cluster=process`, Monarch's ProcessJob): kill -9 a generator replica, a reward
replica and a trainer rank mid-run (scripts/chaos.py does the killing, and writes results/faults.md with
longer runs). Replica faults: the run completes, no request is lost or counted twice, and the metrics are
those of the fault-free run. Trainer fault: a clean stop (exit 3) with the checkpoint intact; resume=auto
finishes the run with the fault-free metrics. Also: roles really run on different simulated hosts, with
the same result as one host, and a killed controller leaves no process behind while another run goes on."""
from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, rlexp, tagged_env, wait_no_orphans

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location("chaos", REPO / "scripts" / "chaos.py")
chaos = importlib.util.module_from_spec(_spec)
sys.modules["chaos"] = chaos  # dataclasses look their module up there
_spec.loader.exec_module(chaos)

STEPS = 10
# The reward is the policy itself as a judge: its replica asks the generators, so a generator's
# death reaches the reward replica too (it passes over the dead one, then is given the replacement).
COMMON = [*chaos.LAYOUT, f"steps={STEPS}", "eval.every_n_steps=5", "checkpoint.every_n_steps=4",
          "algorithm.prompts_per_step=16", "reward=single_judge"]


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("chaos") / "fault_free"
    p = rlexp("train", *COMMON, f"hydra.run.dir={run}")
    for host in ("generator_0", "generator_1", "trainer_0", "reward_0"):
        assert f"host {host}" in p.stdout  # the placement names the simulated host of every role
    placement = json.loads((run / "placement.json").read_text())
    hosts = {name: w[0]["host"] for name, w in placement.items()}
    assert hosts == {"generator0": "generator_0", "generator1": "generator_1", "trainer": "trainer_0",
                     "reward0": "reward_0"}
    assert len({w[0]["pid"] for w in placement.values()}) == 4
    return run


def test_one_host_elastic_run_gives_the_process_cluster_result(fault_free: Path, tmp_path: Path, tag: str) -> None:
    """Same command on one host, with generator replicas resized mid-run (2 -> 1 -> 3): the metrics are
    those of the simulated-hosts run, because samples depend on the shards, not on who serves them."""
    local = tmp_path / "local"
    args = [a for a in COMMON if a not in chaos.LAYOUT] + ["generator.replicas=2"]
    proc = chaos.start(args, local, tagged_env(tag))
    chaos.wait_step(local, 2, proc)
    (local / "generator_replicas").write_text("1")
    chaos.wait_step(local, 5, proc)
    (local / "generator_replicas").write_text("3")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "retired: scaled down to 1" in out and "generator2@local added" in out
    last = chaos.rows(local)[-1]
    assert last["service/generators/replicas"] == 3 and last["service/generators/retired"] == 1
    assert chaos.same_metrics(local, fault_free) is None


def test_replicas_killed_mid_run_change_nothing(fault_free: Path, tmp_path: Path, tag: str) -> None:
    """A generator replica killed at step 3, the reward replica at step 6, in one run. Generator 0:
    the one whose handle the reward replica was first given, so its replacement must be attached to
    the reward replica's judges, and to the reward replica's own replacement."""
    run = tmp_path / "faults"
    o = chaos.inject(COMMON, run, tagged_env(tag), "generator0", at_step=3, more=[("reward0", 6)])
    assert o.returncode == 0, o.stderr[-3000:]
    assert o.steps_done == STEPS
    a = o.accounting
    for service, alive in (("generators", 2), ("rewards", 1)):
        assert a[f"service/{service}/failures"] == 1 and a[f"service/{service}/respawned"] == 1
        assert a[f"service/{service}/issued"] == a[f"service/{service}/completed"]  # nothing lost or doubled
        assert a[f"service/{service}/replicas"] == alive
        assert f"{service}: {'generator0' if service == 'generators' else 'reward0'}@" in o.stdout
    # The reward replica is only ever asked to score: its death is seen by a request, which is re-sent. (A
    # generator's may be seen first by a weights update, which its replacement receives when it starts.)
    assert a["service/rewards/retried"] >= 1
    assert "respawned in" in o.stdout
    assert chaos.same_metrics(fault_free, run) is None
    placement = json.loads((run / "placement.json").read_text())
    # placement.json names the replacement
    assert str(placement["generator0"][0]["pid"]) not in o.killed
    assert wait_no_orphans(tag) == []


def test_trainer_rank_killed_stops_cleanly_and_resume_finishes(fault_free: Path, tmp_path: Path, tag: str) -> None:
    run = tmp_path / "trainer"
    o = chaos.inject(COMMON, run, tagged_env(tag), "trainer", at_step=5)
    assert o.returncode == 3, o.stderr[-3000:]
    assert "a trainer process died" in o.stderr and "resume=auto" in o.stderr
    assert "Traceback" not in o.stderr
    assert (run / "checkpoints" / "step_000004" / "COMPLETE").exists()
    assert json.loads((run / "manifest.json").read_text())["status"] != "finished"
    assert wait_no_orphans(tag) == []
    rlexp("train", *COMMON, "resume=auto", f"hydra.run.dir={run}", tag=tag)
    assert chaos.same_metrics(fault_free, run) is None


def test_two_runs_at_once_and_a_killed_controller_leaves_nothing(tmp_path: Path) -> None:
    tags = ["chaos-a-" + str(time.time_ns()), "chaos-b-" + str(time.time_ns())]
    args = [*chaos.LAYOUT, "eval.every_n_steps=0", "checkpoint.save_final=false"]
    a = subprocess.Popen([sys.executable, "-m", "rlexp", "train", *args, "steps=100000",
                          f"hydra.run.dir={tmp_path / 'a'}"], cwd=REPO, env=tagged_env(tags[0]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chaos.wait_step(tmp_path / "a", 0, a)  # a is up; b starts its own job beside it
    b = subprocess.Popen([sys.executable, "-m", "rlexp", "train", *args, "steps=4",
                          f"hydra.run.dir={tmp_path / 'b'}"], cwd=REPO, env=tagged_env(tags[1]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chaos.wait_step(tmp_path / "b", 0, b)
    chaos.wait_step(tmp_path / "a", 2, a)
    a.send_signal(signal.SIGKILL)  # no teardown runs: the reaper must end the simulated hosts
    a.wait()
    assert wait_no_orphans(tags[0], timeout=30) == []
    _, err = b.communicate(timeout=600)
    assert b.returncode == 0, err[-3000:]
    assert chaos.rows(tmp_path / "b")[-1]["step"] == 4
    assert wait_no_orphans(tags[1], timeout=30) == []


def test_verifier_replica_killed_is_retired_and_scores_do_not_change(tmp_path: Path, tag: str) -> None:
    """A reward model served by two replicas (its own processes): one is killed mid-run; the reward service
    retires it and scores the whole batch on the other, so every reward, hence every metric, is unchanged."""
    args = ["experiment=weaver_cpu", "reward=single_rm", "verifier_set.members.0.replicas=2", "steps=6",
            "eval.every_n_steps=3", "algorithm.prompts_per_step=16"]
    clean = tmp_path / "clean"
    rlexp("train", *args, f"hydra.run.dir={clean}", tag=tag)
    o = chaos.inject(args, tmp_path / "fault", tagged_env(tag), "verifier_rm_large", at_step=2)
    assert o.returncode == 0, o.stderr[-3000:]
    last = chaos.rows(tmp_path / "fault")[-1]
    assert last["service/verifier_rm_large/retired"] == 1 and last["service/verifier_rm_large/replicas"] == 1
    assert last["service/verifier_rm_large/issued"] == last["service/verifier_rm_large/completed"]
    assert chaos.same_metrics(clean, tmp_path / "fault") is None
    assert wait_no_orphans(tag) == []
