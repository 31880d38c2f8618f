"""Multi-turn episodes in training (rlexp/algorithm/rollouts.py, rlexp/envs/guard.py, rlexp/envs/guess.py): loss masks,
logprob parity across turns, per-turn seeds, the guessing task's ceilings, bad environment output.

The rollout tests drive the real titan backend and the real tiny model in this process; only Monarch's
message passing is replaced (`InProcessReplica`: an endpoint's `call_one(...).get()` as a direct call), so
they run in seconds. The same path through real actors is in tests/test_train_multiturn.py (slow).
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlexp.algorithm.grpo import grpo_loss, policy_token_mask
from rlexp.algorithm.rollouts import MultiTurn
from rlexp.config.environment import EnvConfig
from rlexp.config.model import ModelConfig
from rlexp.core.seeding import request_seed
from rlexp.core.services import Service, Services
from rlexp.envs.base import Environment
from rlexp.envs.guard import EnvOutputError, GuardedSteps
from rlexp.envs.guess import Guess, reply
from rlexp.envs.registry import build_env
from rlexp.models.backends import TitanBackend
from rlexp.models.policy import load_policy, sequence_logprobs
from rlexp.models.tiny import ensure_tiny_checkpoint
from rlexp.models.tokenizer import load_tokenizer
from rlexp.types import Episode, Problem, Sample, TrainBatch

MODEL = ModelConfig()


# --- the loss never sees environment tokens ---------------------------------------------------------------
@pytest.fixture(scope="module")
def policy() -> torch.nn.Module:
    return load_policy(MODEL, str(ensure_tiny_checkpoint(MODEL)))


def test_loss_gradient_on_environment_tokens_is_exactly_zero(policy: torch.nn.Module) -> None:
    prompts = [[5, 6, 7], [5, 6, 7], [9, 8]]
    responses = [[20, 30, 21, 31, 22], [23, 33, 24], [25, 35, 26, 36]]
    loss_masks = [[1, 0, 1, 0, 1], [1, 0, 1], [1, 0, 1, 0]]
    adv = torch.tensor([1.0, -0.5, 0.7])
    for agg, kl in (("token_mean", 0.1), ("seq_mean_token_mean", 0.0), ("seq_mean_token_sum_norm", 0.1)):
        grads, losses = [], []
        for garbage in (False, True):
            logp, mask = sequence_logprobs(policy, prompts, responses, 1.0, 0)
            logp.retain_grad()
            width = logp.shape[1]
            lm = torch.tensor([m + [0] * (width - len(m)) for m in loss_masks], dtype=torch.float32)
            pmask = policy_token_mask(mask, lm)
            env = (lm == 0) & (mask > 0)
            old = logp.detach() + 0.05 * torch.sin(torch.arange(logp.numel()).view_as(logp).float())
            if garbage:  # whatever the generator said at environment positions: never in the ratio
                old = torch.where(env, torch.full_like(old, -50.0), old)
            out = grpo_loss(logp, old, adv, pmask, ref_logprobs=logp.detach() - 0.1, kl_coef=kl, agg=agg,
                            max_len=8)
            out.loss.backward()
            assert env.sum() == 5
            assert torch.equal(logp.grad[env], torch.zeros(int(env.sum()))), (agg, kl)  # exactly zero
            assert (logp.grad[pmask > 0] != 0).all()  # every policy token is trained on
            grads.append(logp.grad)
            losses.append(out.loss.detach())
        assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])


def test_train_batch_carries_masks_only_for_multi_turn_episodes() -> None:
    single = Episode([1], [2, 3], [-1.0, -1.0], 0.5, 1.0, 0)
    assert TrainBatch.of([single, single]).loss_masks is None  # the single-turn path is untouched
    multi = Episode([1], [2, 3, 4], [-1.0, 0.0, -1.0], 0.5, 1.0, 0, loss_mask=[1, 0, 1])
    assert TrainBatch.of([multi, single]).loss_masks == [[1, 0, 1], [1, 1]]
    assert Episode.from_plain(multi.to_plain()) == multi


# --- the guessing task ------------------------------------------------------------------------------------
def _play(env: Guess, sample: Sample, policy: Any) -> bool:
    transcript = ""
    for turn in range(env.cfg.max_turns):
        g = policy(transcript)
        r = env.step(sample, transcript, g) if turn + 1 < env.cfg.max_turns else None
        transcript += g
        if r is None:
            break
        transcript += r
    return env.check(sample, transcript).correct


def _binary_search(transcript: str) -> str:
    lo, hi = 0, 9
    for g, r in zip(transcript[::2], transcript[1::2]):
        lo, hi = (lo, int(g) - 1) if r == "<" else (int(g) + 1, hi)
    return str((lo + hi) // 2) if len(transcript) else "3"


def test_guess_needs_feedback_blind_at_most_3_in_10_using_it_7_in_10() -> None:
    env = build_env(EnvConfig(name="guess", max_turns=3))
    held = env.eval_samples()
    assert len(held) == 200 and sorted({s.answer for s in held}) == list("0123456789")
    blind = sum(_play(env, s, lambda t: "012"[len(t) // 2]) for s in held) / len(held)
    search = sum(_play(env, s, _binary_search) for s in held) / len(held)
    assert blind == pytest.approx(0.3) and search == pytest.approx(0.7)
    # held-out games are prompts training never draws
    assert not {s.problem.prompt for s in held} & {s.problem.prompt for s in env.train_samples()}


def test_guess_check_reads_only_games_the_environment_could_have_played() -> None:
    env = build_env(EnvConfig(name="guess", max_turns=3))
    s = Sample(Problem("X/3", "guess X:"), "3")
    assert env.check(s, "5<2>3").correct and env.check(s, "3").correct
    assert not env.check(s, "5<2>4").correct and env.check(s, "5<2>4").parseable
    assert not env.check(s, "5>3").parseable  # a reply the game would not give
    assert not env.check(s, "5<2>4<3").correct  # more turns than allowed
    assert reply("3", "x") == "?" and reply("3", "") == "?" and reply("3", "35") == "?"


# --- bad environment output -------------------------------------------------------------------------------
class _Tool(Environment):
    """A multi-turn environment whose step returns whatever the response asks for."""

    name = "tool_test"

    def __init__(self, cfg: EnvConfig) -> None:
        super().__init__(cfg)

    def step(self, sample: Sample, transcript: str, response: str) -> Any:
        if response == "raise":
            raise RuntimeError("tool crashed\n" + "x" * 1000)
        if response == "raise_short":
            raise RuntimeError("short crash")
        if response == "hang":
            time.sleep(5)
            return "late"
        return {"bytes": b"\xff\xfe bad", "good_bytes": "caf\u00e9".encode(), "empty": "", "huge": "9" * 10_000,
                "surrogate": "bad \udcff", "int": 7, "ok": "fine"}[response]


def _guard(timeout: float = 2.0) -> GuardedSteps:
    env = _Tool(EnvConfig(name="tool_test", max_turns=3, max_reply_tokens=64, step_timeout_s=timeout))
    return GuardedSteps(env, load_tokenizer(ensure_tiny_checkpoint(MODEL)).encode)


@pytest.mark.parametrize("timeout", [0.0, 2.0])
def test_bad_environment_output_reaches_the_model_as_a_short_error(timeout: float, caplog: Any) -> None:
    s = Sample(Problem("p1", "q"), "a")
    kinds = ["bytes", "good_bytes", "empty", "huge", "surrogate", "raise", "ok"]
    out = _guard(timeout)([(s, "", k) for k in kinds])
    by = dict(zip(kinds, out))
    assert by["ok"].text == "fine" and by["ok"].error is None
    assert by["good_bytes"].text == "caf\u00e9"
    assert by["bytes"].text == "error: output is not valid UTF-8" and by["bytes"].error == "not_utf8"
    assert by["surrogate"].text == "error: output is not valid UTF-8"
    assert by["empty"].text is None and by["empty"].error == "empty"  # ends the episode
    assert by["huge"].text == "error: output too long (10000 tokens, limit 64)"
    assert by["raise"].text == "error: raised"  # "RuntimeError: tool crashed xxx..." would not fit in 64
    short = _guard(timeout)([(s, "", "raise_short")])[0]
    assert short.text == "error: RuntimeError: short crash"
    assert all(len(r.ids) <= 64 for r in out)
    log = caplog.text
    assert "not UTF-8" in log and "empty reply" in log and "max_reply_tokens=64" in log and "raised" in log
    assert "problem 'p1'" in log


def test_a_hanging_tool_times_out_and_the_calls_behind_it_still_run() -> None:
    s = Sample(Problem("p1", "q"), "a")
    g = _guard(timeout=0.5)
    t = time.perf_counter()
    out = g([(s, "", "ok"), (s, "", "hang"), (s, "", "ok")])
    assert time.perf_counter() - t < 3
    assert [r.text for r in out] == ["fine", "error: timed out after 0.5s", "fine"]
    assert out[1].error == "timeout"


def test_a_step_that_returns_a_wrong_type_stops_with_the_fix() -> None:
    with pytest.raises(EnvOutputError, match=r"step returned int .* return the text to append \(str\) or None"):
        _guard()([(Sample(Problem("p1", "q"), "a"), "", "int")])


# --- the rollout: masks, per-turn seeds, logprob parity with the trainer ----------------------------------
class InProcessReplica:
    """Stand-in for Monarch's actor messaging only: `endpoint.call_one(*args).get()` calls the real backend."""

    def __init__(self, backend: TitanBackend) -> None:
        self.backend = backend
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        fn = {"generate": self.backend.generate,
              "score": lambda p, r, t: (self.backend.score(p, r, t), self.backend.policy_version)}[name]

        def call_one(*args: Any) -> Any:
            self.calls.append((name, args))
            return SimpleNamespace(get=lambda: fn(*args))

        return SimpleNamespace(call_one=call_one)


def _rollout(max_turns: int = 3, max_episode_tokens: int = 0, seed: int = 11):
    d = ensure_tiny_checkpoint(MODEL)
    tok = load_tokenizer(d)
    env = build_env(EnvConfig(name="guess", max_turns=max_turns, max_episode_tokens=max_episode_tokens))
    cfg = SimpleNamespace(algorithm=SimpleNamespace(group_size=8, max_tokens=1, temperature=1.0),
                          generator=SimpleNamespace(backend="titan"), model=MODEL)
    replica = InProcessReplica(TitanBackend(MODEL, str(d), tok))
    svc = Services(generators=Service("generators", [replica]), trainer=None, rewards=None, buffer=None,  # type: ignore[arg-type]
                   generator_seeds=(seed,))
    samples = env.train_samples()[:6]
    groups = MultiTurn(env, tok.encode, cfg).generate(svc, samples, step=4).get()
    return env, samples, groups, replica, load_policy(MODEL, str(d))


@pytest.fixture(scope="module")
def rollout() -> Any:
    return _rollout()


def test_multi_turn_rollout_masks_replies_and_matches_the_trainer_bit_for_bit(rollout: Any) -> None:
    _, samples, groups, replica, model = rollout
    flat = [c for g in groups for c in g]
    assert len(groups) == 6 and all(len(g) == 8 for g in groups)
    assert max(c.turns for c in flat) == 3  # a random policy rarely wins: most episodes use every turn
    for s, g in zip(samples, groups):
        for c in g:
            assert c.prompt_ids == replica.backend.tok.encode(s.problem.prompt)
            roles = [seg["role"] for seg in c.segments]
            assert roles == ["policy", "environment"] * (c.turns - 1) + ["policy"]
            # every environment token is masked, every policy token is not
            text_by_mask = "".join(replica.backend.tok.decode([t]) for t, m in zip(c.token_ids, c.loss_mask) if m)
            assert text_by_mask == "".join(seg["text"] for seg in c.segments if seg["role"] == "policy")
            env_text = "".join(seg["text"] for seg in c.segments if seg["role"] == "environment")
            decoded = "".join(replica.backend.tok.decode([t]) for t, m in zip(c.token_ids, c.loss_mask) if not m)
            assert decoded == env_text
            assert c.text == "".join(seg["text"] for seg in c.segments)
            assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if not m)
    # the trainer's logprobs of the same rows, as Trainer.train_step computes them: equal bit for bit
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, [c.prompt_ids for c in flat], [c.token_ids for c in flat], 1.0,
                                       replica.backend.tok.pad_id)
    for row, c in zip(logp.tolist(), flat):
        got = [lp for lp, m in zip(c.logprobs, c.loss_mask) if m]
        want = [lp for lp, m in zip(row[: len(c.token_ids)], c.loss_mask) if m]
        assert got == want


def test_each_turn_has_its_own_seed_and_the_rollout_is_reproducible(rollout: Any) -> None:
    _, _, groups, replica, _ = rollout
    seeds = [args[4] for name, args in replica.calls if name == "generate"]
    assert seeds == [request_seed(11, 4, t) for t in range(len(seeds))] and len(set(seeds)) == len(seeds) == 3
    assert seeds[0] == request_seed(11, 4)  # turn 0 is the single-turn request
    _, _, again, _, _ = _rollout()
    assert [[c.token_ids for c in g] for g in groups] == [[c.token_ids for c in g] for g in again]


def test_episode_token_budget_ends_episodes_before_a_turn_that_cannot_fit() -> None:
    _, _, groups, _, _ = _rollout(max_turns=3, max_episode_tokens=3)
    flat = [c for g in groups for c in g]
    assert all(len(c.token_ids) <= 3 for c in flat)
    assert max(c.turns for c in flat) == 2  # guess, reply, guess = 3 tokens; a third guess would not fit
