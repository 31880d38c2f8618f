"""Every environment x verifier set that composes either runs or is refused before anything spawns (issue 23).

`rlexp train environment=gpqa reward=weaver verifier_set=tiny steps=2` used to die minutes after spawning, in
the trainer, on a GPQA prompt longer than the tiny policy's context. Here `rlexp.run.prepare.prepare` (no process)
is run on every pair with an empty, offline Hugging Face cache: it must end with a user error (one line,
naming the problem and the fix) or succeed, and the pairs that succeed are exactly `RUNS`, each of which the
slow test then runs for 2 steps through the real actor graph.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from rlexp.cluster.plan_cli import compose_run_config
from rlexp.errors import is_user_error
from rlexp.rewards.verifiers.tiny_panels import PANEL_SETS, WIDE_SET
from rlexp.run.prepare import prepare
from tests.conftest import REPO, metrics, rlexp

CONF = REPO / "conf"
ENVS = sorted(p.stem for p in (CONF / "environment").glob("*.yaml"))
SETS = sorted(p.stem for p in (CONF / "verifier_set").glob("*.yaml"))
# The pairs that prepare on this machine (tiny stand-ins; the task sets name public checkpoints not cached here,
# MATH and MMLU-Pro data are not installed, GPQA's prompts exceed the tiny policy's 1,024 tokens, and the guess game
# takes no verifiers; the learned arithmetic set's models score any text). A pair that starts to prepare must be
# added here, so that it is also run.
RUNS = {("arithmetic", "arithmetic"), ("arithmetic", "arithmetic_rules"), ("arithmetic", "arithmetic_rules_judge"),
        ("arithmetic", "tiny"), ("calculator", "arithmetic"), ("calculator", "tiny"), ("sort", "arithmetic"),
        ("sort", "tiny")}
# The further panels of learned arithmetic verifiers (issue 23 item 4) prepare wherever `arithmetic` does; they share
# its code path, so their pairs are checked here but not run again below (the Weaver sweeps run them).
PANELS = (set(PANEL_SETS.values()) | {WIDE_SET}) - {"arithmetic"}  # W: A, D and E's together
PANEL_RUNS = {(env, p) for env, vs in RUNS if vs == "arithmetic" for p in PANELS}
def outcome(env: str, vs: str) -> str | None:
    """None when `prepare` accepts the pair, else the user error's message."""
    try:
        prepare(compose_run_config([f"environment={env}", f"verifier_set={vs}", "reward=weaver", "steps=2"]))
    except Exception as e:  # a user error is the expected refusal; anything else fails below
        assert is_user_error(e), f"environment={env} verifier_set={vs}: {type(e).__name__}: {e}"
        return str(e)
    return None


@pytest.mark.slow  # prepares every pair (8 x 12), training the tiny stand-in verifiers once (cached after)
def test_every_pair_prepares_or_is_refused_before_spawning(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prepared, refused = set(), {}
    for env in ENVS:
        for vs in SETS:
            msg = outcome(env, vs)
            if msg is None:
                prepared.add((env, vs))
            else:
                refused[(env, vs)] = msg
    expected = RUNS | PANEL_RUNS
    assert prepared == expected, (f"prepared {sorted(prepared - expected)} not run; "
                                  f"expected {sorted(expected - prepared)}")
    # A refusal names what to change: an environment or verifier key, or a checkpoint's download command.
    unexplained = {k: m for k, m in refused.items() if not any(w in m for w in ("environment", "verifier"))}
    assert not unexplained, unexplained
    assert "cannot score environment=gpqa" in refused[("gpqa", "arithmetic_rules")]
    assert "missing verifier checkpoints" in refused[("gpqa", "gpqa")]
    gpqa = refused[("gpqa", "tiny")]
    assert "do not fit the policy's context" in gpqa and "model.arch.max_seq_len=1024" in gpqa


def test_gpqa_on_the_tiny_policy_is_refused_with_the_fix() -> None:
    """The pair of the issue, refused in seconds with the length and the key to raise."""
    msg = outcome("gpqa", "tiny")
    assert msg is not None and "train prompts (longest" in msg and "raise model.arch.max_seq_len to at least" in msg


# Two pairs in CI (a multi-token task with tiny stand-in models, rules with a judge); the other six, 1-2 min each on
# two cores, under `pytest -m soak`, to keep CI under 30 minutes.
IN_CI = {("sort", "tiny"), ("arithmetic", "arithmetic_rules_judge")}


@pytest.mark.slow  # spawns the actor graph for 2 steps
@pytest.mark.parametrize("env,vs", [pytest.param(e, v, id=f"{e}-{v}", marks=() if (e, v) in IN_CI else pytest.mark.soak)
                                    for e, v in sorted(RUNS)])
def test_prepared_pairs_run_two_steps(env: str, vs: str, tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    rlexp("train", f"environment={env}", f"verifier_set={vs}", "reward=weaver", "steps=2", "eval.every_n_steps=0",
          "eval.max_samples=8", "algorithm.prompts_per_step=4", f"hydra.run.dir={run}", tag=tag)
    rows = [r for r in metrics(run) if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
