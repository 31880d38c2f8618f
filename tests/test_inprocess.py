"""The one-process baseline of `rlexp bench --overhead-steps` (rlexp/run/inprocess.py) and the loop's overlap figure."""
from __future__ import annotations

import pytest

from rlexp.actors.buffer import ReplayBuffer
from rlexp.actors.reward import RewardService
from rlexp.actors.settings import BufferSettings, RewardSettings
from rlexp.algorithm.loop import overlap_metrics
from rlexp.cluster.plan_cli import compose_run_config
from rlexp.core.services import Local
from rlexp.run.inprocess import check_inprocess
from rlexp.run.prepare import prepare
from rlexp.types import Completion


def _completion(gen_s: float) -> Completion:
    return Completion(prompt_ids=[1], token_ids=[2], logprobs=[0.0], text="x", policy_version=0, gen_s=gen_s)


def test_overlap_is_the_ideal_over_the_step() -> None:
    groups = [[_completion(0.25), _completion(0.25)], [_completion(0.5)]]  # 1.0 s of generator work
    m = overlap_metrics(groups, replicas=2, serial_s=0.3, step_s=1.0)
    assert m["time/generate_busy_s"] == pytest.approx(0.5)  # spread over two replicas
    assert m["perf/overlap_efficiency"] == pytest.approx(0.5)  # max(0.5, 0.3) / 1.0
    assert overlap_metrics(groups, replicas=1, serial_s=2.0, step_s=4.0)["perf/overlap_efficiency"] == 0.5


def test_local_calls_sync_and_async_endpoints_and_names_a_missing_one() -> None:
    import asyncio

    events = asyncio.new_event_loop()
    buf = Local(ReplayBuffer, BufferSettings(0, 1), events=events)
    assert buf.add.call_one([]).get() == 0  # async endpoint, run on the shared event loop
    assert buf.sample.call(0, 1).get() == {"rank": None}  # a collective's shape: rank -> answer
    cfg = compose_run_config([])
    c = prepare(cfg).cfg
    reward = Local(RewardService, RewardSettings(c.reward, c.environment), events=events)
    assert reward.attach_verifiers.call_one({}).get() == []  # sync endpoint
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        buf.nope  # noqa: B018
    events.close()


@pytest.mark.parametrize(("override", "fix"), [("sync=async", "sync=on_policy"), ("generator=vllm", "generator=titan"),
                                               ("model.parallelism.trainer_fsdp=2", "trainer_fsdp=1")])
def test_what_cannot_run_in_one_process_is_refused_with_the_fix(override: str, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        check_inprocess(prepare(compose_run_config([override])))


@pytest.mark.slow
def test_overhead_bench_runs_the_same_steps_in_both() -> None:
    """`rlexp train` (actor graph) and the same components in one process: identical loop metrics, so the
    step-time ratio compares the same work."""
    from rlexp.bench import bench_overhead

    rows = bench_overhead(steps=3, rounds=1, warmup=0, overrides=["algorithm.prompts_per_step=8"])
    step = rows[0]
    assert step.what.startswith("overhead: step") and "loop metrics identical: yes" in step.note
    assert step.value > 0 and step.baseline_value > 0
    assert {r.what.split(",")[0] for r in rows} >= {"overhead: step", "overhead: train step", "overhead: weight sync"}
