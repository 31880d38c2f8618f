"""scripts/gpu_check.py at tiny sizes on CPU: the same code paths the H200 run takes (titan trainer step,
planner comparison, titan/transformers logit parity, KV-cache sampler against `generate`), real models,
no fakes; the report's rows must all be there with finite numbers."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

REPO = Path(__file__).resolve().parent.parent


def load_gpu_check():
    return load_script("gpu_check")


def table(md: str, heading: str) -> list[list[str]]:
    """The data rows of the table under `## heading`, as cells."""
    section = md.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[1:]]  # skip the header row


def floats(cells: list[str]) -> list[float]:
    return [float(c) for c in cells]


@pytest.mark.slow  # ~15 s, most of it importing transformers and TorchTitan
def test_cpu_tiny_report(tmp_path: Path) -> None:
    gc = load_gpu_check()
    out = tmp_path / "gpu.md"
    assert gc.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    md = out.read_text()
    assert "CPU tiny sizes" in md and "torch " in md and "- command: `python" in md

    steps = table(md, "Trainer step")
    assert [r[0] for r in steps] == [c.name for c in gc.tiny_cases()]
    for r in steps:
        step_s, peak, plan, ratio = floats(r[4:8])
        assert all(math.isfinite(x) and x > 0 for x in (step_s, peak, plan, ratio)), r
        assert ratio == pytest.approx(peak / plan, rel=0.02)
        assert peak < plan, f"planner must bound what the step holds: {r}"  # upper-bound style estimate
        assert r[8] == "", r

    parity = table(md, "TorchTitan against transformers")
    assert [r[0] for r in parity] == [c.name for c in gc.tiny_cases() if not c.mixed_precision]
    for r in parity:
        max_diff, mean_diff, max_logit, agree = floats(r[1:5])
        # Same weights, bf16: differences at bf16 rounding of the logits, not of a different model.
        assert 0 <= mean_diff <= max_diff < 0.05 * max_logit + 0.02, r
        assert agree >= 0.9, r

    speed = table(md, "Greedy sampling")
    for r in speed:
        titan, hf, ratio, agree, first = floats(r[3:8])
        assert all(math.isfinite(x) and x > 0 for x in (titan, hf, ratio)), r
        assert ratio == pytest.approx(titan / hf, rel=0.02)
        assert 0 <= agree <= 1 and 0 <= first <= 16

    data = json.loads(out.with_suffix(".json").read_text())
    assert data["meta"]["complete"] and len(data["cases"]) == len(steps)


def test_without_torchtitan_steps_on_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image without TorchTitan (stood in for by making the availability probe report it missing): the
    trainer step and `generate` still run on transformers' Qwen3, the titan rows say why they are empty."""
    gc = load_gpu_check()
    monkeypatch.setattr(gc, "titan_status", lambda: "torchtitan not importable (test: image without it)")
    out = tmp_path / "gpu.md"
    assert gc.main(["--tiny", "--device", "cpu", "--out", str(out), "--only", "tiny untied (like 8B)"]) == 0
    md = out.read_text()
    assert "trainer-step model: transformers (torchtitan not importable (test: image without it))" in md
    (step,) = table(md, "Trainer step")
    assert all(math.isfinite(x) for x in floats(step[4:8]))
    (parity,) = table(md, "TorchTitan against transformers")
    assert parity[1:5] == ["n/a"] * 4 and "no torchtitan" in parity[5]
    (speed,) = table(md, "Greedy sampling")
    assert speed[3] == "n/a" and float(speed[4]) > 0 and "no torchtitan" in speed[8]


def test_bad_inputs_refused_before_work(tmp_path: Path) -> None:
    gc = load_gpu_check()
    with pytest.raises(SystemExit, match="full sizes on CPU"):
        gc.main(["--device", "cpu", "--out", str(tmp_path / "x.md")])
    with pytest.raises(SystemExit, match="unknown --only"):
        gc.main(["--tiny", "--device", "cpu", "--only", "Qwen3-70B", "--out", str(tmp_path / "x.md")])
    assert not (tmp_path / "x.md").exists()


@pytest.mark.slow
def test_wrapper_runs_one_case(tmp_path: Path) -> None:
    """The bash entry point as a user runs it (its python lookup, PYTHONPATH, time limit)."""
    out = tmp_path / "gpu.md"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh"), "--tiny", "--device", "cpu", "--out", str(out),
                           "--only", "tiny tied (like 0.6B)"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = out.read_text()
    assert re.search(r"- command: `bash scripts/gpu_check.sh --tiny --device cpu", md)
    assert len(table(md, "Trainer step")) == 1
