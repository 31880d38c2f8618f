"""The actor graph's components called in this one process: the baseline its overhead is measured against.

`rlexp bench --overhead-steps N` runs the same config twice, as `rlexp train` (actors in processes of their
own, Monarch messages between them) and here, and compares step times; the loop's metrics must agree exactly,
which is what shows both ran the same work. Each actor class is built as a plain object and its endpoints are
called directly (the function under Monarch's `@endpoint`), so what differs is messaging, serialisation and
processes, nothing else. A call completes when made, so nothing overlaps: compare with `sync.mode=on_policy`.
"""
from __future__ import annotations

import asyncio
import random
from typing import Any

from rlexp.actors.buffer import ReplayBuffer
from rlexp.algorithm import loop
from rlexp.core.services import Collective, Local, Service, Services
from rlexp.models.tokenizer import load_tokenizer
from rlexp.run.prepare import Prepared
from rlexp.run.wiring import Role, wiring
from rlexp.transport.registry import AUTO, pair_transport, transport_spec


def check_inprocess(p: Prepared) -> None:
    """What cannot run in one process, refused before anything loads."""
    cfg = p.cfg
    reasons = []
    if cfg.model.parallelism.trainer_world > 1:
        reasons.append(f"a sharded trainer (trainer_world={cfg.model.parallelism.trainer_world}) needs one process "
                       f"per rank; set model.parallelism.trainer_fsdp=1 trainer_tp=1")
    if p.served_verifiers:
        reasons.append(f"model verifiers ({', '.join(v.name for v in p.served_verifiers)}) are served by actors of "
                       f"their own; use a reward without them (reward=rule or annotated)")
    if cfg.generator.backend != "titan":
        reasons.append(f"generator.backend={cfg.generator.backend} runs an engine process of its own; use "
                       f"generator=titan")
    if cfg.sync.mode != "on_policy":
        reasons.append("calls complete when made here, so nothing overlaps; use sync=on_policy")
    if reasons:
        raise ValueError("in-process run: " + "; ".join(reasons))


def build_inprocess(p: Prepared, run_name: str) -> Services:
    """The `Services` of `launcher.build_graph` from the same wiring table, with every actor a `Local` object (same
    settings, same seeds), all on one host: weights travel by shm."""
    check_inprocess(p)
    # one process: no per-role GPU masks, every role on this process's device
    w = wiring(p, spawned=False)
    events = asyncio.new_event_loop()  # one loop for every async endpoint, as an actor's process has one
    one_host = pair_transport(AUTO, "here", "here")  # what `auto` picks when both ends share a host
    weights = transport_spec(one_host, run_name, p.cfg.cluster)

    def local(role: Role, **given: Any) -> Local:
        return Local(role.actor, role.settings, events=events, **given)

    gens = [local(role, weights=weights) for role in w.generators]
    trainer = local(w.trainer, transports=[weights])
    reference = local(w.reference) if w.reference is not None else None
    buffer = Local(ReplayBuffer, w.buffer, events=events)
    rewards = [local(role) for role in w.rewards]
    for g in gens:
        g.setup.call_one().get()
    trainer.setup.call().get()
    if reference is not None:
        reference.setup.call().get()
    generators = Service("generators", gens, shards=len(w.generator_seeds), sticky=("update_weights",))
    for i, r in enumerate(rewards):
        r.attach_verifiers.call_one({}).get()
        r.attach_judges.call_one(generators.in_turn(i), p.model_dir).get()
    return Services(generators=generators,
                    trainer=Collective("trainer", trainer), rewards=Service("rewards", rewards),
                    buffer=Service("buffer", [buffer]),
                    reference=Collective("reference", reference) if reference is not None else None,
                    generator_seeds=w.generator_seeds)


def train_inprocess(p: Prepared, run_name: str) -> list[dict[str, float]]:
    """`loop.train` over `p.cfg.steps` steps in this process; the loop's metrics per step (no evaluation,
    checkpoints or trackers: the step is what is compared)."""
    svc = build_inprocess(p, run_name)
    rows: list[dict[str, float]] = []
    state = loop.LoopState(data_rng=random.Random(p.seeds["data"]))
    encode = load_tokenizer(p.model_dir).encode
    try:
        loop.train(p.cfg, svc, p.env, encode, state, lambda step, m, _: rows.append({"step": step, **m}))
    finally:
        svc.trainer.shutdown.call()
        svc.generators.shutdown.fanout().get()
    return rows
