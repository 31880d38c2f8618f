"""Zero-copy weights on one host (issue 25 item 4): generators serve straight from the mapped version file under a
lease (LOCK_SH), and the trainer recycles or deletes only files it can lock exclusively. Real files under /dev/shm,
real processes for the lease holder that dies."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import torch

from rlexp.transport import TransportError
from rlexp.transport.shm import WEIGHTS, Lease, ShmReceiver, ShmTransport, default_root
from tests.conftest import REPO, FinishedRun


@pytest.fixture
def shm_root():
    root = default_root() / f"rlexp-test-lease-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _sd(value: float, mb: int = 2) -> dict[str, torch.Tensor]:
    n = mb * 2**20 // 4 // 2
    return {"a.weight": torch.full((n,), float(value)), "b.weight": torch.full((n // 2, 2), float(value)),
            "c.weight": torch.full((3,), float(value), dtype=torch.bfloat16)}


def _inode(loc: str) -> int:
    return os.stat(Path(loc) / WEIGHTS).st_ino


def _whole(tensors: dict[str, torch.Tensor], value: float) -> bool:
    return all(bool((t.float() == value).all()) for t in tensors.values())


def test_a_leased_file_is_never_recycled_and_a_released_one_is(shm_root: Path) -> None:
    t = ShmTransport("lease1", root=shm_root, keep=2)
    v1, v2 = t.publish(1, _sd(1)), t.publish(2, _sd(2))
    lease = Lease(v1, 1)  # a generator still serving v1, the version the next publish would recycle
    assert not lease.copied and _whole(lease.tensors, 1.0)
    v3 = t.publish(3, _sd(3))
    assert _inode(v3) not in (_inode(v1), _inode(v2))  # a fresh file: v1 is leased
    assert t.versions() == [1, 2, 3]  # gc keeps the leased version past `keep`
    assert _whole(lease.tensors, 1.0)  # what the generator serves did not change under it
    lease.release()
    inode1 = _inode(v1)
    v4 = t.publish(4, _sd(4))
    assert _inode(v4) == inode1 and t.versions() == [3, 4]  # released: recycled in place, and gc caught up
    served = Lease(v4, 4)
    assert _whole(served.tensors, 4.0)
    served.release()
    t.close()


def test_gc_skips_a_leased_version_and_takes_it_later(shm_root: Path) -> None:
    t = ShmTransport("lease2", root=shm_root, keep=1)
    v1 = t.publish(1, _sd(1))
    lease = Lease(v1, 1)
    t.publish(2, _sd(2))
    assert t.versions() == [1, 2]  # keep=1, but v1 is served
    lease.release()
    assert not lease.held and lease.tensors == {}
    lease.release()  # idempotent
    t.gc()
    assert t.versions() == [2]
    t.close()


def test_a_killed_lease_holder_frees_the_file(shm_root: Path) -> None:
    t = ShmTransport("lease3", root=shm_root, keep=2)
    v1 = t.publish(1, _sd(1))
    t.publish(2, _sd(2))
    code = ("import sys, time\nfrom rlexp.transport.shm import Lease\n"
            "lease = Lease(sys.argv[1], 1)\nprint('held', flush=True)\ntime.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    holder = subprocess.Popen([sys.executable, "-c", code, v1], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        inode1 = _inode(v1)
        v3 = t.publish(3, _sd(3))
        assert _inode(v3) != inode1 and 1 in t.versions()  # the other process's lease is honoured
    finally:
        holder.kill()
        holder.wait()
    v4 = t.publish(4, _sd(4))  # the kernel dropped the dead holder's lock
    assert _inode(v4) == inode1 and t.versions() == [3, 4]
    t.close()


def test_a_reader_that_opened_a_file_being_recycled_refuses_it(shm_root: Path) -> None:
    t = ShmTransport("lease4", root=shm_root, keep=2)
    v1 = t.publish(1, _sd(1))
    t.publish(2, _sd(2))
    # A second name for v1's file, as a reader that opened it just before the trainer took it holds one.
    early = shm_root / "early" / "v1"
    early.mkdir(parents=True)
    os.link(Path(v1) / WEIGHTS, early / WEIGHTS)
    v3 = t.publish(3, _sd(3))
    assert _inode(v3) == _inode(str(early))  # recycled: the reader's file now holds v3
    with pytest.raises(TransportError, match=r"holds 0+3 now, not version 1: it was recycled"):
        Lease(early, 1)
    with pytest.raises(TransportError, match=r"v1/model.safetensors does not exist \(any more\)"):
        Lease(v1, 1)
    with pytest.raises(TransportError, match=r"not a v2 folder"):
        Lease(v3, 2)
    t.close()


def test_serving_racing_publishes_never_serves_torn_weights(shm_root: Path) -> None:
    """A reader keeps leasing the version the next publish would recycle while a writer publishes: every lease
    either serves one whole version, unchanged for as long as it is held, or is refused; never a mix."""
    t = ShmTransport("lease5", root=shm_root, keep=2)
    for v in (1, 2):
        t.publish(v, _sd(v, mb=8))
    stop = threading.Event()
    outcome = {"whole": 0, "refused": 0, "torn": 0}

    def reader() -> None:
        last = 0
        while not stop.is_set():
            # The oldest version not served yet: the one next in line to be recycled (a reader that always took
            # the very oldest would lease it forever and the writer would never recycle it).
            vs = [v for v in t.versions() if v > last]
            if not vs:
                continue
            try:
                lease = Lease(t.version_dir(vs[0]), vs[0])
            except TransportError:
                outcome["refused"] += 1
                continue
            try:
                ok = _whole(lease.tensors, float(vs[0]))
                ok = ok and _whole(lease.tensors, float(vs[0]))  # still, later: nothing wrote under the lease
            finally:
                lease.release()
            last = vs[0]
            outcome["whole" if ok else "torn"] += 1

    th = threading.Thread(target=reader)
    th.start()
    try:
        for v in range(3, 30):
            t.publish(v, _sd(v, mb=8))
    finally:
        stop.set()
        th.join()
    assert outcome["torn"] == 0, outcome
    assert outcome["whole"] > 0, outcome
    t.gc()
    assert len(t.versions()) == 2  # no lease left behind: gc catches up
    t.close()


# ---------------------------------------------------------------------------------------------- titan backend


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlexp.config.model import ModelConfig
    from rlexp.models.tiny import ensure_tiny_checkpoint

    cfg = ModelConfig()
    return cfg, ensure_tiny_checkpoint(cfg, tmp_path_factory.mktemp("tiny") / "model")


def _trainer_sd(cfg, model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """What the trainer publishes: its model's state dict in HF naming, in the model's own order."""
    from rlexp.models.policy import load_policy
    from rlexp.models.titan import hf_state_dict

    model = load_policy(cfg, str(model_dir))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return hf_state_dict(model, cfg.arch)


def _in_mapping(t: torch.Tensor, loc: str) -> bool:
    from rlexp.transport import shm_read as shm

    st = os.stat(Path(loc) / WEIGHTS)
    whole = shm._READ_MAPS.maps[(st.st_dev, st.st_ino)][2]
    start = whole.data_ptr()
    return start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= start + whole.numel()


def test_titan_serves_from_the_mapping_bit_identical_to_the_copy_path(shm_root: Path, tiny) -> None:
    import asyncio

    from rlexp.models.backends import build_backend

    cfg, model_dir = tiny
    served, copied = (build_backend("titan", str(model_dir), model_cfg=cfg) for _ in range(2))
    t = ShmTransport("titan", root=shm_root, keep=2)
    on = ShmReceiver("titan", {"root": str(shm_root)})
    off = ShmReceiver("titan", {"root": str(shm_root), "zero_copy": False})
    tokens = torch.tensor([[5, 9, 2, 7, 1], [3, 3, 8, 4, 4]])
    locs = []
    for v in (1, 2):
        locs.append(t.publish(v, _trainer_sd(cfg, model_dir, v)))
        asyncio.run(on.receive(v, locs[-1], served))
        asyncio.run(off.receive(v, locs[-1], copied))
        assert served.policy_version == copied.policy_version == v
        params = list(served.model.named_parameters())
        outside = [k for k, p in params if not _in_mapping(p, locs[-1])]
        assert not outside, outside  # every parameter, the fused QKV included, is a view of the file: no copy
        assert not any(_in_mapping(p, locs[-1]) for p in copied.model.parameters())
        with torch.no_grad():
            assert torch.equal(served.model(tokens), copied.model(tokens))
        a = served.generate([[5, 9, 2]], 3, 4, 1.0, 7)
        b = copied.generate([[5, 9, 2]], 3, 4, 1.0, 7)
        assert [(c.token_ids, c.logprobs) for c in a] == [(c.token_ids, c.logprobs) for c in b]
    # v1 was released on the switch to v2: the trainer may take it now; v2 is leased.
    from rlexp.transport.shm import _lock_exclusive

    fd = _lock_exclusive(Path(locs[0]) / WEIGHTS)
    assert fd is not None
    os.close(fd)
    assert _lock_exclusive(Path(locs[1]) / WEIGHTS) is None
    # A copying load (monarch, torchstore) first gives the parameters writable storage: no write into the mapping.
    sd3 = _trainer_sd(cfg, model_dir, 3)
    served.load_state_dict(3, sd3, where="test")
    copied.load_state_dict(3, sd3, where="test")
    assert not any(_in_mapping(p, locs[1]) for p in served.model.parameters())
    with torch.no_grad():
        assert torch.equal(served.model(tokens), copied.model(tokens))
    fd = _lock_exclusive(Path(locs[1]) / WEIGHTS)  # the lease on v2 went with the copy
    assert fd is not None
    os.close(fd)
    # Back to serving, then close: the lease is released and the emptied parameters cannot read unmapped memory.
    loc4 = t.publish(4, _trainer_sd(cfg, model_dir, 4))
    asyncio.run(on.receive(4, loc4, served))
    served.close()
    assert all(p.numel() == 0 for p in served.model.parameters())
    t.close()


def test_titan_declines_weights_it_cannot_serve_and_copies_them(shm_root: Path, tiny) -> None:
    import asyncio

    from rlexp.models.backends import build_backend

    cfg, model_dir = tiny
    backend = build_backend("titan", str(model_dir), model_cfg=cfg)
    t = ShmTransport("decline", root=shm_root, keep=2)
    sd = {k: v.to(torch.bfloat16) for k, v in _trainer_sd(cfg, model_dir, 1).items()}  # a cast needs a copy
    loc = t.publish(1, sd)
    asyncio.run(ShmReceiver("decline", {}).receive(1, loc, backend))
    assert backend.policy_version == 1
    assert not any(_in_mapping(p, loc) for p in backend.model.parameters())
    assert torch.equal(backend.model.norm.weight, sd["model.norm.weight"].float())
    fd = os.open(Path(loc) / WEIGHTS, os.O_RDONLY)  # no lease was kept
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    t.close()


def test_zero_copy_setting_is_checked() -> None:
    from rlexp.transport import check_transport  # noqa: F401 - the registry import registers shm
    from rlexp.transport.shm import ShmTransport as T

    with pytest.raises(TransportError, match=r"zero_copy='no': give true .* or false"):
        T.check({"zero_copy": "no"})
    with pytest.raises(TransportError, match=r"cluster.transport_options.shm: .*unexpected keyword.*'zero_cpy'"):
        T.check({"zero_cpy": False})


@pytest.mark.slow
def test_train_serving_from_the_mapping_matches_the_copy_path(tmp_path: Path, tag: str,
                                                               short_run: FinishedRun) -> None:
    """`rlexp train` with the default shm transport (generators serve from the mapped file) gives
    the same metrics, timings aside, as with `zero_copy=false` (generators copy every version into
    their own weights). The served run is the session's shared default run (`short_run`: 6 steps,
    enough publishes that the trainer recycles files generators had leased; evaluations at 0, 3
    and 6 are compared too)."""
    from rlexp.tracking.reproduce import compare_metrics
    from tests.conftest import SHORT, metrics, rlexp

    assert "trainer -> generators by shm" in short_run.stdout
    served, copied = short_run.run, tmp_path / "copied"
    p = rlexp("train", *SHORT, "cluster.transport=shm", f"hydra.run.dir={copied}",
              "+cluster.transport_options.shm.zero_copy=false", tag=tag)
    assert "trainer -> generators by shm" in p.stdout
    assert len(metrics(served)) == len(metrics(copied)) >= 7
    assert compare_metrics(served / "metrics.jsonl", copied / "metrics.jsonl") is None


def test_a_file_locked_for_writing_too_long_is_refused_not_waited_on_forever(shm_root: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone else's process (or a stopped trainer) holding the exclusive lock: the generator's lease gives up with
    an error naming the file, instead of hanging `update_weights`."""
    import fcntl

    import rlexp.transport.shm_read as shm

    t = ShmTransport("lease_wait", root=shm_root, keep=2)
    v1 = t.publish(1, _sd(1))
    monkeypatch.setattr(shm, "LEASE_WAIT_S", 0.2)
    fd = os.open(Path(v1) / WEIGHTS, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: conflicts even within this process
        with pytest.raises(TransportError, match=r"locked for writing for over 0 s.*fuser"):
            Lease(v1, 1)
        fcntl.flock(fd, fcntl.LOCK_UN)
        lease = Lease(v1, 1)  # free again: served
        assert _whole(lease.tensors, 1.0)
        lease.release()
    finally:
        os.close(fd)
        t.close()
