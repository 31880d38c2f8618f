"""Weight transports: shm round trip is bit-exact and atomic; torchstore is checked before use."""
from __future__ import annotations

import json
import os
import sys
import threading
import types
from pathlib import Path

import pytest
import torch

from rlexp.models.hf import read_hf_state_dict
from rlexp.transport import TransportError, build_transport, check_transport
from rlexp.transport.shm import ShmTransport, check_intact


def _state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(48, 32, generator=g),
        "model.norm.weight": torch.rand(32, generator=g).to(torch.float16),
        # values that must survive as bits, not numbers
        "special": torch.tensor([float("nan"), float("inf"), -0.0, 1e-45], dtype=torch.float32),
    }


def _same_bits(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.uint8) if a[k].dim() else a[k], b[k].view(torch.uint8)), k


def test_shm_round_trip_bit_exact_and_gc(tmp_path):
    t = ShmTransport("run1", root=tmp_path, keep=2, config={"architectures": ["Qwen3ForCausalLM"]})
    sds = {v: _state_dict(v) for v in range(1, 5)}
    for v, sd in sds.items():
        loc = t.publish(v, sd)
        assert loc == str(tmp_path / "run1" / f"v{v}")
        _same_bits(sd, t.fetch(loc))
    assert t.versions() == [3, 4]  # older versions garbage-collected
    assert t.latest() == (4, str(tmp_path / "run1" / "v4"))
    assert json.loads((tmp_path / "run1" / "v4" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    assert not [p for p in (tmp_path / "run1").iterdir() if p.name.startswith(".tmp")]
    t.publish(4, sds[1])  # re-publishing a version replaces it whole
    _same_bits(sds[1], t.fetch(t.latest()[1]))
    t.close()
    assert not (tmp_path / "run1").exists()


def test_shm_sharded_versions_reload_in_transformers_layout(tmp_path):
    t = ShmTransport("run2", root=tmp_path, max_shard_bytes=4096)
    sd = _state_dict(7)
    loc = t.publish(0, sd)
    assert (tmp_path / "run2" / "v0" / "model.safetensors.index.json").exists()
    _same_bits(sd, t.fetch(loc))


def test_shm_fetch_into_existing_tensors_bit_exact(tmp_path):
    """The generator-side fast path: bytes land in the caller's tensors; a dtype mismatch is cast."""
    t = ShmTransport("run4", root=tmp_path, max_shard_bytes=4096)
    sd = _state_dict(5)
    loc = t.publish(1, sd)
    dest = {k: torch.zeros_like(v) for k, v in sd.items()}
    ptrs = {k: v.data_ptr() for k, v in dest.items()}
    assert t.fetch_into(loc, dest) == set(sd)
    _same_bits(sd, dest)
    assert all(dest[k].data_ptr() == ptrs[k] for k in dest)  # in place, no new tensors
    as_fp32 = {k: torch.zeros(v.shape, dtype=torch.float32) for k, v in sd.items()}
    t.fetch_into(loc, as_fp32)  # slow path: cast on copy
    assert torch.equal(as_fp32["model.embed_tokens.weight"], sd["model.embed_tokens.weight"].float())


def test_shm_failed_publish_leaves_no_partial_version(tmp_path, monkeypatch):
    t = ShmTransport("run3", root=tmp_path, keep=2)
    t.publish(1, _state_dict(1))

    def boom(*a, **k):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr("rlexp.transport.shm._pwrite_all", boom)
        with pytest.raises(OSError):
            t.publish(2, _state_dict(2))
    assert t.versions() == [1] and t.latest()[0] == 1
    assert [p.name for p in (tmp_path / "run3").iterdir() if p.is_dir()] == ["v1"]
    # A failed publish into recycled pages loses only the version it was recycling (the one past `keep`
    # that a successful publish drops): the newest stays whole and LATEST.
    t.publish(2, _state_dict(2))
    with monkeypatch.context() as m:
        m.setattr("rlexp.transport.shm._pwrite_all", boom)
        with pytest.raises(OSError):
            t.publish(3, _state_dict(3))
    assert t.versions() == [2] and t.latest()[0] == 2
    assert [p.name for p in (tmp_path / "run3").iterdir() if p.is_dir()] == ["v2"]
    _same_bits(_state_dict(2), t.fetch(t.latest()[1]))


def test_check_transport_errors():
    with pytest.raises(TransportError, match=r"spans 2 hosts.*cluster.transport=auto.*cluster.transport=tcp"):
        check_transport("shm", hosts=2)
    with pytest.raises(TransportError, match="unknown weight transport 'nccl'"):
        check_transport("nccl")
    check_transport("shm")


def _torchstore_usable() -> str | None:
    try:
        check_transport("torchstore")
    except TransportError as e:
        return str(e)
    return None


def test_torchstore_missing_says_how_to_install():
    if "torchstore" in sys.modules or _torchstore_usable() is None:
        pytest.skip("torchstore is installed here; the not-installed message cannot be observed")
    try:
        import torchstore  # noqa: F401
        pytest.skip("torchstore importable")
    except ImportError:
        pass
    with pytest.raises(TransportError) as e:
        check_transport("torchstore")
    msg = str(e.value)
    assert "not installed" in msg and "pip install" in msg and "torchmonarch" in msg and "cluster.transport=auto" in msg


def test_torchstore_0_1_2_mixed_endpoints_refused_fake_torchstore(monkeypatch):
    """A fake `torchstore` whose Controller mixes sync and async endpoints (as 0.1.2's did, fixed by
    torchstore PR #74) is refused by Monarch's own endpoint-kind rule, with the Monarch message."""
    from monarch.actor import Actor, endpoint

    class Controller(Actor):
        @endpoint
        async def init(self) -> None: ...

        @endpoint
        def keys(self) -> list: ...

    pkg = types.ModuleType("torchstore")
    ctl = types.ModuleType("torchstore.controller")
    ctl.Controller = Controller
    pkg.controller = ctl
    monkeypatch.setitem(sys.modules, "torchstore", pkg)
    monkeypatch.setitem(sys.modules, "torchstore.controller", ctl)
    monkeypatch.setitem(sys.modules, "torchstore.storage_volume", None)
    with pytest.raises(TransportError, match=r"mixes both async and sync endpoints.*install a TorchStore built for"):
        check_transport("torchstore")


@pytest.mark.skipif(_torchstore_usable() is not None,
                    reason=f"torchstore unusable here: {(_torchstore_usable() or '').split('. ')[0]}")
def test_torchstore_round_trip_bit_exact():
    import asyncio

    async def go():
        t = build_transport("torchstore", "test-run", keep=1)
        await t.ainitialize()
        sd = _state_dict(3)
        loc = await t.apublish(1, sd)
        _same_bits(sd, await t.afetch(loc))
        await t.apublish(2, _state_dict(4))
        assert not await t.ts.keys(t.key(1) + "/")
        await t.aclose()
        await t.ts.shutdown()

    asyncio.run(go())


def _const_state_dict(value: int, mb: int = 4) -> dict[str, torch.Tensor]:
    n = mb * 2**20 // 4 // 2
    return {"a.weight": torch.full((n,), float(value)), "b.weight": torch.full((n // 2, 2), float(value))}


def test_shm_recycles_the_dropped_version_in_place_and_refuses_a_torn_read(tmp_path):
    t = ShmTransport("run5", root=tmp_path, keep=2)
    v1, v2 = t.publish(1, _const_state_dict(1)), t.publish(2, _const_state_dict(2))
    inode = os.stat(Path(v1) / "model.safetensors").st_ino
    reading = read_hf_state_dict(v1)  # a reader mid-way through v1 (safetensors maps the file)
    v3 = t.publish(3, _const_state_dict(3))  # v1 is dropped: its pages are reused for v3
    assert os.stat(Path(v3) / "model.safetensors").st_ino == inode and t.versions() == [2, 3]
    assert reading["a.weight"][0] == 3.0  # what the slow reader holds changed under it...
    with pytest.raises(TransportError, match=r"does not exist .*while it was being read"):
        check_intact(v1, 1)  # ...and it is told so before using it
    check_intact(v2, 2)
    with pytest.raises(TransportError, match=r"asked to load version 3 from .*v2"):
        check_intact(v2, 3)
    dest = {k: torch.zeros_like(v) for k, v in _const_state_dict(0).items()}
    t.fetch_into(v3, dest)
    assert all(bool((x == 3.0).all()) for x in dest.values())
    t.close()


def test_shm_reads_racing_publishes_never_return_torn_weights(tmp_path):
    """A reader keeps fetching the version the next publish recycles while a writer publishes: every read
    either returns one whole version or is refused; never a mix of two."""
    t = ShmTransport("run6", root=tmp_path, keep=2)
    for v in (1, 2):
        t.publish(v, _const_state_dict(v, mb=8))
    stop = threading.Event()
    outcome = {"whole": 0, "refused": 0, "torn": 0}
    dest = {k: torch.zeros_like(v) for k, v in _const_state_dict(0, mb=8).items()}

    def reader() -> None:
        while not stop.is_set():
            vs = t.versions()
            if not vs:
                continue
            loc = str(t.version_dir(vs[0]))  # the oldest: next in line to be overwritten
            try:
                t.fetch_into(loc, dest)
            except (TransportError, FileNotFoundError, KeyError, ValueError, OSError):
                outcome["refused"] += 1
                continue
            values = torch.cat([x.reshape(-1) for x in dest.values()])
            outcome["whole" if bool((values == float(vs[0])).all()) else "torn"] += 1

    th = threading.Thread(target=reader)
    th.start()
    try:
        for v in range(3, 30):
            t.publish(v, _const_state_dict(v, mb=8))
    finally:
        stop.set()
        th.join()
        t.close()
    assert outcome["torn"] == 0, outcome
    assert outcome["whole"] > 0, outcome


@pytest.mark.slow  # 3 real training steps through Monarch actors: the e2e tier (it ran as a unit test)
def test_a_transport_outside_rlexp_is_one_module_and_one_yaml(tmp_path: Path, tag: str) -> None:
    """tests/toy_transport.py (a module rlexp never imports) plus a cluster YAML naming it: 3 real training steps
    send every version through it (the generators sample with the trainer's weights bit for bit, which a
    generator left on old weights would not), and the actor processes import it by the name in the config."""
    from tests.conftest import REPO, metrics, rlexp

    weights, conf, run = tmp_path / "weights", tmp_path / "conf", tmp_path / "run"
    (conf / "cluster").mkdir(parents=True)
    (conf / "cluster" / "file_local.yaml").write_text(
        f"name: file_local\ntransport: tests.toy_transport:FileTransport\n"
        f"transport_options:\n  file:\n    dir: {weights}\n")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), old]))  # the actors import the module
    try:
        p = rlexp("train", "cluster=file_local", f"hydra.searchpath=[file://{conf}]", "steps=3",
                  "eval.every_n_steps=0", f"hydra.run.dir={run}", tag=tag)
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.update(PYTHONPATH=old)
    assert "trainer -> generators by file (cluster.transport=tests.toy_transport:FileTransport)" in p.stdout
    rows = [r for r in metrics(run) if "logprob_diff/max" in r]
    assert [r["policy/version"] for r in rows] == [1, 2, 3]
    assert all(r["logprob_diff/max"] == 0.0 for r in rows), rows
    published = sorted(f.name for f in weights.glob("*/v*.safetensors"))
    assert published == ["v1.safetensors", "v2.safetensors", "v3.safetensors"]


def test_unknown_transport_is_refused_before_spawning_with_the_known_names(tmp_path: Path, tag: str) -> None:
    from tests.cli_batch import rlexp_each
    from tests.conftest import tagged_env

    # both refusals come after torch loads: one child runs the two commands (tests/cli_batch.py)
    toy = "cluster.transport=tests.toy_transport:FileTransport"
    p, q = rlexp_each([["train", "cluster.transport=nfs", f"hydra.run.dir={tmp_path}"],
                       ["train", toy, f"hydra.run.dir={tmp_path}"]], env=tagged_env(tag))
    assert p.returncode == 2, p.stderr
    assert "unknown weight transport 'nfs'; choose one of ['auto', 'monarch', 'shm', 'tcp', 'torchstore']" in p.stderr
    assert "actor graph" not in p.stdout
    # its required option is missing
    assert q.returncode == 2
    assert "cluster.transport_options.file: missing a required argument: 'dir'" in q.stderr
