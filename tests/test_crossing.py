"""Values from the user's code checked where they cross into the loop (issue 45): a NaN reward
stops the run naming the reward, the problem and the response (or is dropped and counted), an
exception in `check()` names the environment, the problem and the response."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlexp.algorithm.loop import check_rewards
from rlexp.config.schema import TrainConfig
from rlexp.envs.base import Check
from rlexp.errors import UserCodeError, is_user_error
from rlexp.rewards.crossing import bad_rewards, checked
from rlexp.types import Problem, Sample
from tests.conftest import REPO, metrics, tagged_env, wait_no_orphans


def _samples(n: int) -> list[Sample]:
    return [Sample(Problem(id=f"p{i}", prompt=f"prompt {i}:"), answer="1") for i in range(n)]


def _cfg(mode: str = "stop") -> TrainConfig:
    cfg = TrainConfig()
    cfg.algorithm.nonfinite_reward = mode  # type: ignore[assignment]
    cfg.reward.name = "mytask.tasks:NearMiss"
    return cfg


def test_bad_rewards_finds_nan_inf_and_out_of_range() -> None:
    assert bad_rewards([0.0, 1.0, 0.5], None) == []
    assert bad_rewards([0.0, math.nan, math.inf, -math.inf], None) == [1, 2, 3]
    assert bad_rewards([0.0, 1.5, -0.1, 1.0], (0.0, 1.0)) == [1, 2]
    assert bad_rewards([7.0], None) == []  # no declared range: any finite value passes


def test_stop_names_reward_problem_response_and_value() -> None:
    samples, texts = _samples(4), ["3", "4", "x" * 500, "2"]
    with pytest.raises(UserCodeError) as e:
        check_rewards([1.0, 0.0, math.nan, 0.0], samples, texts, _cfg(), None, 2)
    msg = str(e.value)
    assert is_user_error(e.value)
    for part in ("'mytask.tasks:NearMiss'", "nan", "'p2'", "prompt 2:",
                 "algorithm.nonfinite_reward=drop"):
        assert part in msg, msg
    assert "x" * 120 in msg and "x" * 121 not in msg and "(500 chars)" in msg  # the response, cut
    with pytest.raises(UserCodeError, match=r"returned 1\.5 .* in \[0\.0, 1\.0\]"):
        check_rewards([1.0, 1.5], samples[:2], texts[:2], _cfg(), (0.0, 1.0), 2)


def test_drop_sets_bad_rewards_to_their_group_mean() -> None:
    values = [1.0, math.nan, 0.0, 0.0, math.inf, math.nan]
    dropped = check_rewards(values, _samples(6), ["a"] * 6, _cfg("drop"), None, 3)
    assert dropped == {1, 4, 5}
    assert values == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0]  # group 2: only 0.0 is good


class _Raises:
    name = ""

    class cfg:  # shaped like EnvConfig: a plug-in's name is its import path
        name = "mytask.tasks:Broken"

    def check(self, sample: Sample, response: str) -> Check:
        raise KeyError("boom")


def test_check_exception_names_environment_problem_and_response() -> None:
    with pytest.raises(UserCodeError) as e:
        checked(_Raises(), _samples(1)[0], "my answer")
    msg = str(e.value)
    for part in ("'mytask.tasks:Broken'", "check() raised KeyError", "'p0'", "'my answer'"):
        assert part in msg, msg


NAN_REWARD = '''
import math
from mytask.tasks import NearMiss


class NanReward(NearMiss):
    """NearMiss, but NaN for every response to a problem whose string starts with b (a bug)."""

    def _score(self, samples, texts, group_size):
        out = super()._score(samples, texts, group_size)
        out.rewards = [math.nan if s.id.startswith("b") else r
                       for s, r in zip(samples, out.rewards)]
        return out
'''
TINY = ["algorithm.prompts_per_step=8", "algorithm.group_size=4", "eval.every_n_steps=0", "steps=2"]


def _train(tmp_path: Path, tag: str, name: str, *extra: str
           ) -> tuple[subprocess.CompletedProcess[str], Path]:
    project = tmp_path / "my_task"
    if not project.exists():
        shutil.copytree(REPO / "examples" / "my_task", project,
                        ignore=shutil.ignore_patterns("__pycache__"))
        (project / "mytask" / "nan_reward.py").write_text(NAN_REWARD)
    run = tmp_path / name
    p = subprocess.run([sys.executable, "-m", "rlexp", "train", f"config_path={project / 'conf'}",
                        "environment=count_a", "reward.name=mytask.nan_reward:NanReward", *TINY,
                        *extra, f"hydra.run.dir={run}"], cwd=tmp_path, env=tagged_env(tag),
                       capture_output=True, text=True, timeout=600)
    return p, run


@pytest.mark.slow
def test_nan_reward_stops_the_run_naming_it_or_is_dropped(tmp_path: Path, tag: str) -> None:
    """A user's reward (in the reward actor) returns NaN: the run stops at step 1 with one line
    naming the reward, the problem and the value, not a crash in the sampler a step later; with
    `drop` it trains on and counts."""
    p, _ = _train(tmp_path, tag, "stop")
    assert p.returncode == 2, p.stderr[-3000:]
    line = [x for x in p.stderr.splitlines() if x.startswith("rlexp: error:")]
    assert len(line) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    for part in ("'mytask.nan_reward:NanReward'", "returned nan", "problem 'b", "response "):
        assert part in line[0], line[0]
    p, run = _train(tmp_path, tag, "drop", "algorithm.nonfinite_reward=drop")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [r for r in metrics(run) if "reward/dropped_nonfinite" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/dropped_nonfinite"] > 0 and math.isfinite(r["reward/mean"])
               for r in rows), rows
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["algorithm"]["nonfinite_reward"] == "drop"
    assert wait_no_orphans(tag) == []


def test_a_nan_verifier_score_names_the_verifier_prompt_and_response() -> None:
    from rlexp.config.reward import RewardConfig, VerifierConfig
    from rlexp.rewards.registry import build_reward
    from rlexp.rewards.verifiers.base import Rule, register_rule

    @register_rule("test_nan_on_9")
    class NanOn9(Rule):
        def check(self, problem: Problem, text: str) -> float:
            return math.nan if "9" in text else 1.0

    reward = build_reward(RewardConfig(name="weaver", verifiers=[
        VerifierConfig(name="nanny", kind="rule", options={"rule": "test_nan_on_9"})]), env=None)
    texts = ["1", "2", "answer 9", "3"]
    with pytest.raises(UserCodeError) as e:
        reward.score(_samples(4), texts, group_size=2)
    msg = str(e.value)
    for part in ("verifier 'nanny'", "returned nan", "prompt 'prompt 2:'", "response 'answer 9'",
                 "1 non-finite of 4"):
        assert part in msg, msg
