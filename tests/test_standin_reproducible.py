"""The stand-ins (the warm start, the tiny verifiers) are pure functions of their inputs on one
machine kind (issue 46 item 2): a fresh clone regenerates the draw a table names, bit for bit.

What broke it, measured: each verifier folder kept its training time (rm_large 16294859fc17 in the
audit's clone is this machine's weights with train_seconds 27.52; the cache here has them with
40.86, 9281a6a78b71), the warm start's record kept the base checkpoint's absolute path, and the
warm-up ran on as many threads as the machine has cores. The instruction set and the BLAS path still
decide the bits (rlexp/models/numerics.py), so the committed hashes
(studies/weaver/standin_sha256.json) are per machine kind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlexp.models import numerics
from rlexp.tracking.files import hash_files
from tests.conftest import REPO

SCRIPT = REPO / "studies" / "weaver" / "standin_hashes.py"
EXPECTED = REPO / "studies" / "weaver" / "standin_sha256.json"
NAMES = ["start", "rm_small", "judge_small"]  # the warm start, a reward model and a judge


def test_pinned_numerics_pins_one_thread_and_deterministic_kernels_then_restores():
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)
    try:
        with numerics.pinned_numerics():
            assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
        assert torch.get_num_threads() == 2
        assert torch.are_deterministic_algorithms_enabled() == before[1]
    finally:
        torch.set_num_threads(before[0])


def test_the_machine_kind_names_the_cpu_vendor_and_instruction_set(tmp_path):
    cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n"
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    assert numerics._cpu_vendor(tmp_path / "cpuinfo") == "GenuineIntel"
    assert numerics._cpu_vendor(tmp_path / "absent") == "unknown"
    kind = numerics.machine_kind()
    assert kind["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    name = numerics.machine_kind_name({**kind, "cpu_vendor": "GenuineIntel"})
    assert name.startswith("GenuineIntel/") and name != numerics.machine_kind_name(
        {**kind, "cpu_vendor": "AuthenticAMD"})


def test_a_verifier_built_in_two_cache_folders_hashes_alike(tmp_path):
    """No clock, process or path in the folder: two builds of one spec are the same bytes."""
    from rlexp.rewards.verifiers import tiny

    spec = tiny.TinyVerifierSpec(kind="reward_model", dim=8, n_layers=1, n_heads=2, head_dim=4,
                                 hidden_dim=16, n_examples=64, train_steps=3, batch_size=16,
                                 seed=99)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the caller's setting; the build pins its own
    try:
        a = tiny.ensure_tiny_verifier(spec, tmp_path / "a")
        b = tiny.ensure_tiny_verifier(spec, tmp_path / "elsewhere" / "b")
    finally:
        torch.set_num_threads(threads)
    assert hash_files(a) == hash_files(b)
    meta = tiny.read_meta(a)
    assert "train_seconds" not in meta and meta["numerics"] == numerics.machine_kind()


def test_a_warm_start_built_under_two_cache_roots_hashes_alike(tmp_path, monkeypatch):
    from rlexp.envs.registry import build_env
    from rlexp.models import tiny as tiny_model
    from rlexp.run import warmup
    from rlexp.run.prepare import check_config, resolve_model
    from tests.test_warmup import composed

    t = check_config(composed("experiment=weaver_cpu", "reward=annotated", "model.warmup.steps=2"))
    env, paths = build_env(t.environment), []
    for root in (tmp_path / "a", tmp_path / "b"):  # the base too: its path was in the record
        monkeypatch.setattr(tiny_model, "DEFAULT_CACHE", root)
        monkeypatch.setattr(warmup, "DEFAULT_CACHE", root)
        path, record = warmup.ensure_warm_checkpoint(resolve_model(t.model), t, env)
        assert str(tmp_path) not in json.dumps(record)
        paths.append(path)
    assert paths[0] != paths[1] and hash_files(paths[0]) == hash_files(paths[1])


def _build(cache: Path, threads: int, cwd: Path, hashseed: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RLEXP_CACHE"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads), PYTHONHASHSEED=hashseed)
    cmd = [sys.executable, str(SCRIPT), "--cache", str(cache), "--names", ",".join(NAMES),
           "--threads", str(threads), "--print"]
    return subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory) -> list[dict]:
    """The stand-ins built twice from nothing, in two processes that differ in thread count, working
    folder, hash seed and cache root."""
    tmp = tmp_path_factory.mktemp("standins")
    (tmp / "cwd").mkdir()
    procs = [_build(tmp / "one", 1, REPO, "0"),
             _build(tmp / "two" / "deeper", 2, tmp / "cwd", "12345")]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1500)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.soak  # two fresh builds of the start and two verifiers, minutes: `pytest -m soak`
def test_two_fresh_builds_are_bit_identical(two_builds):
    a, b = two_builds
    assert set(a["sha256"]) == set(NAMES)
    assert a["sha256"] == b["sha256"], f"same inputs, other bits: {a['sha256']} vs {b['sha256']}"


@pytest.mark.soak
def test_a_fresh_build_gives_the_committed_hashes_of_its_machine_kind(two_builds):
    table = json.loads(EXPECTED.read_text())
    kind = two_builds[0]["kind"]
    if kind not in table:
        pytest.skip(f"{EXPECTED.name} has no hashes for {kind} (known: {sorted(table)}): this "
                    f"machine kind draws its own stand-ins; `python "
                    f"{SCRIPT.relative_to(REPO)} --cache NEW_DIR --write` records them")
    assert two_builds[0]["sha256"] == {n: table[kind][n] for n in NAMES}
