"""scripts/gpu_check.py at tiny sizes on CPU: the code the H100 run takes (rlexp's Trainer with fp32 masters and bf16
compute, the titan generator sampling at temperature 1, the weight push cast to bf16, the planner's figure), real
models, nothing faked but Monarch where it is absent (the script's own stand-in); the report has every row."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

REPO = Path(__file__).resolve().parent.parent


def table(md: str, heading: str) -> list[list[str]]:
    """The data rows of the table under `## heading`, as cells."""
    section = md.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[1:]]  # skip the header row


def check_report(md: str, steps: int) -> None:
    checks = {r[0]: r[1:] for r in table(md, "Checks")}
    assert checks["trainer master weights"] == ["float32", "float32", "yes"]
    assert checks["weights pushed to the generator"] == ["bfloat16", "bfloat16", "yes"]
    assert checks["sampler generator on the probabilities' device"] == ["cpu", "cpu", "yes"]
    assert checks["weights moved by one AdamW step at lr 1e-6"][2] == "yes"
    assert checks["trainer peak memory, GiB (measured / plan)"][2] == "n/a (no allocator peak on CPU)"
    # One micro-batch holds the step's rows: bf16 compute from fp32 masters gives the generator's logprobs exactly.
    assert checks["logprob_diff/max, trainer vs generator"][:1] == ["0"]
    rows = table(md, "Steps")
    assert [int(r[0]) for r in rows] == list(range(1, steps + 1))
    for r in rows:
        assert all(float(x) > 0 for x in r[1:6]), r
        assert r[8:10] == ["0", "0"] and r[10] == "n/a", r
    (speed,) = table(md, "Summary")
    assert all(float(x) > 0 for x in speed[:3])
    assert md.rstrip().endswith("## Errors\n\nnone")


@pytest.mark.slow  # ~30 s: a tiny checkpoint, the Trainer, the generator, 3 steps
def test_cpu_tiny_report(tmp_path: Path) -> None:
    gc = load_script("gpu_check")
    out = tmp_path / "gpu.md"
    assert gc.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    md = out.read_text()
    assert "CPU tiny sizes" in md and "torch 2." in md and "- command: `python" in md
    check_report(md, steps=3)
    data = json.loads(out.with_suffix(".json").read_text())
    assert len(data["result"]["steps"]) == 3 and data["summary"]["steps_per_s"] > 0


def test_bad_inputs_refused_before_work(tmp_path: Path) -> None:
    gc = load_script("gpu_check")
    with pytest.raises(SystemExit, match="full sizes on CPU"):
        gc.main(["--device", "cpu", "--out", str(tmp_path / "x.md")])
    with pytest.raises(SystemExit, match="--steps must be >= 2"):
        gc.main(["--tiny", "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "x.md")])
    assert not (tmp_path / "x.md").exists()


def test_the_full_shape_fits_one_h100_by_the_plan() -> None:
    """The GPU run's trainer plan leaves room on a 78 GiB H100 for the generator (bf16 weights + KV cache)."""
    gc = load_script("gpu_check")
    shape = gc.full_shape()
    assert shape.arch.dim == 1024 and shape.arch.n_layers == 28 and shape.arch.tie_embeddings
    assert 5 < gc.plan_gib(shape) < 50


@pytest.mark.slow
def test_wrapper_without_monarch(tmp_path: Path) -> None:
    """The bash entry point as a user runs it (its python lookup, PYTHONPATH, time limit), on a python where Monarch
    does not import, as on the bare GPU image: the script's stand-in runs rlexp's Trainer in-process."""
    shim = tmp_path / "shim"
    (shim / "monarch").mkdir(parents=True)
    (shim / "monarch" / "__init__.py").write_text("raise ImportError('test: an image without Monarch')\n")
    out = tmp_path / "gpu.md"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(shim)}
    proc = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh"), "--tiny", "--device", "cpu", "--out", str(out),
                           "--steps", "2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = out.read_text()
    assert re.search(r"- command: `bash scripts/gpu_check.sh --tiny --device cpu", md)
    assert "monarch not importable (ImportError: test: an image without Monarch)" in md
    check_report(md, steps=2)
