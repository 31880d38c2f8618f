"""The tcp weight transport: a real listening socket on loopback, real streams, and a real second process (plain
multiprocessing) for the publisher whose death or stop a receiver must report, not hang on; end to end, a
`cluster=process` run fed by tcp gives the metrics of the same run fed by shm."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import threading
from pathlib import Path

import pytest
import torch

from rlexp.transport import TransportError, check_transport, pair_transport
from rlexp.transport.registry import build_transport
from rlexp.transport.tcp import TcpTransport
from rlexp.transport.tcp_wire import (
    MAGIC,
    REPLY,
    Client,
    Where,
    check_header,
    fetch,
    location,
    open_stream,
    parse_location,
    read_body,
    unpack,
)
from tests.conftest import SHORT, FinishedRun, metrics, rlexp


def _odd_state_dict(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(37, 3, generator=g).to(torch.bfloat16),
            "b.weight": torch.randn(5, 41, generator=g),
            "c.bias": torch.rand(3, generator=g).to(torch.float16),
            "scalar": torch.tensor(3.5 + seed, dtype=torch.float64),
            "ids": torch.arange(7, dtype=torch.int64) * seed,
            "empty": torch.zeros(0, 4),
            "special": torch.tensor([float("nan"), float("inf"), -0.0, 1e-45], dtype=torch.float32)}


def _same_bits(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k


@pytest.fixture
def publisher():
    t = build_transport("tcp", "tcp-test", keep=2, host="127.0.0.1", chunk_mb=1, checksum=True)
    yield t
    t.close()


def test_auto_picks_tcp_across_hosts_and_settings_are_checked() -> None:
    assert pair_transport("auto", "h0", "h1") == "tcp"
    assert pair_transport("auto", "h0", "h0") == "shm"
    assert pair_transport("tcp", "h0", "h0") == "tcp"  # not one-host: also works within one
    check_transport("tcp", hosts=3)
    with pytest.raises(TransportError, match=r"tcp.timeout_s=0: give seconds > 0"):
        TcpTransport.check({"timeout_s": 0})
    with pytest.raises(TransportError, match=r"tcp.port=70000"):
        TcpTransport.check({"port": 70000})
    with pytest.raises(TransportError, match=r"transport_options.tcp: .*'bogus'"):
        TcpTransport.check({"bogus": 1})


def test_versions_stream_bit_exact_and_old_ones_are_dropped(publisher: TcpTransport) -> None:
    sds = {v: _odd_state_dict(v) for v in (1, 2, 3)}
    locs = {v: publisher.publish(v, sd) for v, sd in sds.items()}
    assert parse_location(locs[3]).host == "127.0.0.1"  # loopback, as asked: no traffic beyond it
    buf = None
    for v in (2, 3, 3):
        h, buf = fetch(locs[v], v, into=buf)
        _same_bits(unpack(h, buf), sds[v])
    with pytest.raises(TransportError, match=r"version 1 of run 'tcp-test' is not published \(have \[2, 3\]\)"):
        fetch(locs[1], 1)
    with pytest.raises(TransportError, match=r"asked to load version 2 from .*/v3, which holds version 3"):
        fetch(locs[3], 2)
    big = {"w": torch.randn(700, 1024)}  # 2.7 MiB: three 1 MiB chunks, each checksummed while the next arrives
    h, flat = fetch(publisher.publish(3, big), 3)  # a re-publish replaces the version whole
    assert h["publish_id"] != json.loads(publisher.versions[2].header)["publish_id"] and len(h["crc32"]) == 3
    _same_bits(unpack(h, flat), big)
    _same_bits(publisher.fetch(locs[2]), sds[2])


def test_a_client_keeps_its_connection_and_redials_one_cut_while_idle() -> None:
    t = TcpTransport("tcp-keep", keep=2, host="127.0.0.1")
    client = Client(timeout_s=10)
    try:
        flat, views = None, None
        for v in (1, 2):
            h, flat = client.fetch(t.publish(v, _odd_state_dict(v)), v, flat)
            assert h["crc32"] is None  # checksums are off by default (the module says why)
            got = client.tensors(h, flat)
            _same_bits(got, _odd_state_dict(v))
            assert views is None or got is views  # same layout, same buffer: the same views, refilled
            views = got
            assert len(t.listener.conns) == 1  # one connection served both versions
        first = client.sock
        for c in list(t.listener.conns):  # as a firewall's idle timeout would
            c.shutdown(socket.SHUT_RDWR)
        h, flat = client.fetch(t.publish(3, _odd_state_dict(3)), 3)
        _same_bits(unpack(h, flat), _odd_state_dict(3))
        assert client.sock is not first
    finally:
        client.close()
        t.close()


def test_a_version_being_streamed_is_never_overwritten_by_later_publishes() -> None:
    """keep=1: the streamed version is dropped mid-stream and later publishes recycle dropped buffers; the stream
    still delivers exactly the version it started with (its buffer is recycled only once no stream reads it)."""
    t = TcpTransport("tcp-recycle", keep=1, host="127.0.0.1")
    try:
        first = {"w": torch.full((2**20,), 1.0)}  # 4 MiB: more than the small receive buffer holds in flight
        sock, reply = open_stream(t.publish(1, first), 1, timeout_s=10, rcvbuf=64 * 1024)
        with sock:
            for v in (2, 3, 4):  # 2 is dropped unread, so 3 and 4 pack into recycled buffers
                t.publish(v, {"w": torch.full((2**20,), float(v))})
            assert t.spare is None or t.spare.data_ptr() != t.versions[4].flat.data_ptr()
            _same_bits(unpack(reply.header, read_body(sock, reply)), first)
        h, flat = fetch(t.publish(5, first), 5)
        _same_bits(unpack(h, flat), first)
    finally:
        t.close()


def test_requests_without_the_key_are_refused_and_locations_checked(publisher: TcpTransport) -> None:
    where = parse_location(publisher.publish(1, _odd_state_dict(1)))
    stranger = location(where.host, where.port, where.run, 1, bytes(16))
    with pytest.raises(TransportError, match="refused: wrong magic, protocol or key"):
        fetch(stranger, 1)
    assert "key" not in where.shown
    with pytest.raises(TransportError, match="is not a tcp://<address>:<port>/<run>/v<version>"):
        parse_location("tcp://127.0.0.1/run/v1")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(TransportError, match="cannot connect to the trainer's weight server"):
        fetch(location("127.0.0.1", port, "r", 1, bytes(16)), 1, timeout_s=2)


def test_a_header_that_cannot_be_true_is_refused_before_allocating() -> None:
    where = Where("127.0.0.1", 1, "r", 4, bytes(16))
    good = {"version": 4, "publish_id": "x", "total": 64, "chunk": 64, "crc32": [0],
            "entries": [["w", "float32", [2, 2], 0, 16]]}
    assert check_header(good, where) is good
    bad = [({"version": 5}, "answered version 5"),
           ({"total": -1}, "total -1"),
           ({"entries": [["w", "complex128", [2], 0, 32]]}, "has an entry"),
           ({"entries": [["w", "float32", [2, 2], 0, 17]]}, "17 bytes at offset 0"),
           ({"entries": [["w", "float32", [2, 2], 56, 16]]}, "at offset 56 of 64"),
           ({"crc32": [0, 0]}, "2 checksums for 1 chunks")]
    for change, why in bad:
        with pytest.raises(TransportError, match=why):
            check_header({**good, **change}, where)


def _serve_in_child(conn, n_floats: int) -> None:
    """A second process: a publisher of two small versions and one big one; answers with their locations."""
    t = TcpTransport("child", keep=3, host="127.0.0.1", chunk_mb=1, timeout_s=30)
    locs = [t.publish(v, _odd_state_dict(v)) for v in (1, 2)]
    locs.append(t.publish(3, {"big": torch.ones(n_floats)}))
    conn.send(locs)
    conn.recv()  # until the parent is done (or kills this process)


@pytest.mark.slow
def test_two_processes_exact_bytes_then_a_stopped_and_a_killed_sender_fail_fast() -> None:
    """A stream stalled by a stopped sender, or cut by its death, is a TransportError naming how far it got, within
    the timeout, never a hang. The receiver asks for a small socket buffer so the 32 MiB version cannot be in
    flight whole when the sender stops."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_serve_in_child, args=(child, 8 * 2**20), daemon=True)
    p.start()
    try:
        assert parent.poll(120), "the publisher process did not start"
        locs = parent.recv()
        for v in (1, 2):
            h, flat = fetch(locs[v - 1], v, timeout_s=30)
            _same_bits(unpack(h, flat), _odd_state_dict(v))
        for stop, why in ((signal.SIGSTOP, "no data from the trainer .* for 1.5 s after"),
                          (signal.SIGKILL, "closed the stream after|stream from .* failed after")):
            sock, reply = open_stream(locs[2], 3, timeout_s=1.5, rcvbuf=64 * 1024)
            with sock:
                os.kill(p.pid, stop)
                with pytest.raises(TransportError, match=why):
                    read_body(sock, reply)
            os.kill(p.pid, signal.SIGCONT)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)


def test_a_reply_cut_short_names_the_missing_bytes() -> None:
    """A server that dies between header and body (here: one that sends a header then closes)."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    header = json.dumps({"version": 1, "publish_id": "x", "total": 128, "chunk": 64, "crc32": None,
                         "entries": [["w", "uint8", [128], 0, 128]]}).encode()
    def serve() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.recv(64)
            conn.sendall(REPLY.pack(MAGIC, 0, len(header)) + header + b"\0" * 100)

    th = threading.Thread(target=serve)
    th.start()
    try:
        why = r"closed the stream after 100 of 140 bytes of version 1 \(128 bytes\) and its end mark"
        with pytest.raises(TransportError, match=why):
            fetch(location("127.0.0.1", port, "r", 1, bytes(16)), 1, timeout_s=10)
    finally:
        th.join(10)
        lsock.close()


@pytest.mark.slow
def test_train_by_tcp_matches_shm(tmp_path: Path, tag: str, short_run: FinishedRun) -> None:
    """cluster=process puts the trainer and the generators on hosts of their own; tcp over loopback
    feeds the generators the same weights as shm, so the metrics (timings aside) are identical. The
    shm run is the session's shared default run (`short_run`: one host, shm), which computes what
    the same run on `cluster=process` hosts computes (placement changes no number)."""
    from rlexp.tracking.reproduce import compare_metrics

    assert "trainer -> generators by shm" in short_run.stdout
    run = tmp_path / "tcp"
    p = rlexp("train", *SHORT, "cluster=process", "cluster.transport=tcp",
              "+cluster.transport_options.tcp.host=127.0.0.1", f"hydra.run.dir={run}",
              f"cluster.shm_dir={tmp_path / 'shm'}", tag=tag)
    assert "trainer -> generators by tcp (cluster.transport=tcp)" in p.stdout
    assert len(metrics(run)) == len(metrics(short_run.run)) >= 7
    assert compare_metrics(short_run.run / "metrics.jsonl", run / "metrics.jsonl") is None


def test_plan_estimates_the_weight_sync_of_each_preset(capsys: pytest.CaptureFixture[str]) -> None:
    """Across hosts the trainer's link carries one copy per generator replica; on one host, shm's two copies."""
    from rlexp.cluster.plan_cli import main as plan
    from rlexp.cluster.weight_sync import weight_sync

    est = weight_sync(10**9, 2, replicas=4, cross_hosts=True, network_gbps=100)
    assert est.seconds == pytest.approx(2e9 * 4 * 8 / 100e9)
    assert weight_sync(10**9, 2, 4, cross_hosts=False).seconds == pytest.approx(2 * 2e9 / 10e9)
    with pytest.raises(ValueError, match=r"cluster\.network_gbps=0"):
        weight_sync(1, 2, 1, True, network_gbps=0)
    plan(["model=qwen3_14b", "cluster.network_gbps=200"])
    out = capsys.readouterr().out
    assert ("weight sync (estimate): 29.54 GB bfloat16 x 4 generator replica(s) across hosts by tcp at 200 Gb/s "
            "(cluster.network_gbps), the trainer's link carrying every copy = 4.73 s per sync") in out
    plan(["model=qwen3_8b"])
    assert "16.38 GB bfloat16 on one host by shm" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_measures_tcp_against_a_plain_socket_between_two_processes() -> None:
    """`rlexp bench`'s tcp rows: both ways of moving the bytes between the same two Monarch processes, every
    version checked bit for bit inside (a mismatch raises)."""
    from rlexp.bench import bench_tcp

    rows = bench_tcp([6], reps=1, tiny=False)  # one 6 MiB tensor
    assert [r.what for r in rows] == ["tcp fetch, 6 MiB bf16", "tcp fetch with CRC32s, 6 MiB bf16"]
    for r in rows:
        assert r.baseline == "plain TCP socket copy" and r.value > 0 and r.baseline_value > 0
