"""The data plane: a generator's reply (`Completions`) and the trainer's `TrainBatch` cross actor boundaries as a
few arrays, bit for bit; a pure reward is scored in the controller unless the run places it elsewhere."""
from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from monarch._src.actor.pickle import flatten

from rlexp.cluster.plan_cli import compose_run_config
from rlexp.rewards.rule import RuleReward
from rlexp.run.prepare import prepare
from rlexp.run.wiring import reward_in_controller, wiring
from rlexp.types import Completion, Completions, TrainBatch


def _reply(n_prompts: int = 64, k: int = 16) -> Completions:
    prompts = [[3 + (i * 7 + j) % 29 for j in range(12 + i % 5)] for i in range(n_prompts)]
    return Completions(
        Completion(prompt_ids=prompts[r // k], token_ids=[5 + r % 3] * (1 + r % 4),
                   logprobs=[-0.1 * (r % 7) - 1e-17] * (1 + r % 4),  # not float32-representable: must stay exact
                   text=f"{r % 10}é", policy_version=r % 3, finish_reason=("stop", "length")[r % 2], gen_s=r * 1e-5)
        for r in range(n_prompts * k))


def _objects(x: Any) -> int:
    """How many objects Monarch's pickler writes for `x` (its filter sees each one): what costs Python time."""
    seen = 0

    def count(_: Any) -> bool:
        nonlocal seen
        seen += 1
        return False

    flatten(x, count)
    return seen


def _batch(ref: bool, masks: bool) -> TrainBatch:
    reply = _reply(8, 4)
    return TrainBatch([c.prompt_ids for c in reply], [c.token_ids for c in reply], [c.logprobs for c in reply],
                      [0.1 * i - 1.7 for i in range(len(reply))],
                      [[x / 3 for x in c.logprobs] for c in reply] if ref else None,
                      [[1, 0][: len(c.token_ids)] + [1] * (len(c.token_ids) - 2) for c in reply] if masks else None)


def test_a_reply_round_trips_bit_for_bit_as_a_few_arrays() -> None:
    reply = _reply()
    back = pickle.loads(pickle.dumps(reply))
    assert type(back) is Completions and back == reply
    assert all(a.logprobs == b.logprobs for a, b in zip(back, reply))  # == on floats: exact, not approx
    assert back[0].prompt_ids is back[15].prompt_ids  # a group's prompt travels once and stays shared
    # 1,024 completions: a hundred-odd objects on the wire instead of one (and its fields) per completion
    assert _objects(reply) < 200 < 10_000 < _objects(list(reply))


def test_multi_turn_fields_travel_only_when_set_and_then_exactly() -> None:
    reply = _reply(2, 2)
    reply[1].loss_mask, reply[1].segments, reply[1].turn_versions = [1, 0, 1], [{"role": "policy", "text": "x"}], [0, 1]
    reply[2].tool_calls, reply[2].env_s, reply[2].turn_reward = 2, 0.25, -0.5
    back = pickle.loads(pickle.dumps(reply))
    assert back == reply and back[0].loss_mask is None
    assert pickle.loads(pickle.dumps(Completions())) == []


@pytest.mark.parametrize(("ref", "masks"), [(False, False), (True, True)])
def test_a_train_batch_round_trips_bit_for_bit(ref: bool, masks: bool) -> None:
    batch = _batch(ref, masks)
    back = pickle.loads(pickle.dumps(batch))
    assert back == batch and back.advantages == batch.advantages


@pytest.fixture
def echo() -> Iterator[Any]:
    from monarch.actor import this_host

    from tests.service_actors import Echo

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        yield procs.spawn("echo", Echo, 0)
    finally:
        procs.stop().get(timeout=30)


def test_both_cross_a_real_actor_boundary_unchanged(echo: Any) -> None:
    reply, batch = _reply(4, 4), _batch(True, True)
    assert echo.back.call_one(reply).get() == reply
    assert echo.back.call_one(batch).get() == batch


def test_a_pure_reward_is_scored_in_the_controller_unless_placed_elsewhere() -> None:
    assert wiring(prepare(compose_run_config([]))).rewards_in_controller  # reward=rule on one host
    assert reward_in_controller(prepare(compose_run_config(["reward=annotated"])))
    for placed in (["reward.replicas=2"], ["cluster=process"]):  # asked for processes of its own: it gets them
        assert not reward_in_controller(prepare(compose_run_config(placed))), placed


class CountingRule(RuleReward):
    """A rule reward that keeps state: inherits `pure` but must not be scored as a pure function."""

    def state_dict(self) -> dict[str, Any]:
        return {"n": 1}


def test_a_stateful_subclass_of_a_pure_reward_is_not_pure() -> None:
    p = prepare(compose_run_config([f"reward.name={__name__}:CountingRule"]))
    assert p.reward_stateful and not p.reward_pure and not reward_in_controller(p)


def test_padding_from_one_flat_array_equals_a_tensor_per_row() -> None:
    """`pad_rows` (the trainer's logprobs and masks, every token batch) must give exactly what the row-by-row
    construction it replaced gave: same values, same float32 rounding, rows cut to `width`."""
    import random

    import torch

    from rlexp.models.policy import pad_rows, pad_sequences

    rng = random.Random(0)
    rows = [[rng.uniform(-30, 0) for _ in range(rng.randrange(0, 6))] for _ in range(200)] + [[0.1] * 9]
    want = torch.zeros(len(rows), 6)
    for i, r in enumerate(rows):
        want[i, : len(r[:6])] = torch.tensor(r[:6])
    assert torch.equal(pad_rows(rows, 0.0, torch.float32, 6), want)
    ids = [[rng.randrange(50_000) for _ in range(rng.randrange(1, 30))] for _ in range(100)]
    tokens = pad_sequences(ids, 7)
    assert tokens.dtype == torch.long and tokens.shape == (100, max(map(len, ids)))
    assert all(tokens[i, : len(r)].tolist() == r and (tokens[i, len(r):] == 7).all() for i, r in enumerate(ids))
