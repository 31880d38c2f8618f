"""`rlexp eval`: Hydra composition of conf/eval.yaml, result files and manifest, the missing-data error,
the full path on the tiny random model, and that evaluating in-process never imports Monarch."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
import types
from pathlib import Path

from rlexp.evals.benchmarks import benchmark_envs
from rlexp.evals.cli import compose, main
from rlexp.types import Completion

FIX = Path(__file__).parent / "fixtures"


def test_compose_single_and_all_benchmarks():
    cfg = compose(["model=qwen3_0_6b", "benchmark=all"])
    assert list(cfg.benchmark) == ["math500", "gpqa_diamond", "mmlu_pro"]
    assert cfg.benchmark.math500.environment.revision == "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be"
    assert cfg.benchmark.mmlu_pro.environment.revision == "b189ec765aa7ed75c8acfea42df31fdae71f97be"
    cfg = compose(["model=qwen3_0_6b", "benchmark=gpqa_diamond",
                   f"benchmark.gpqa_diamond.environment.dataset={FIX / 'gpqa_diamond.csv'}"])
    envs = benchmark_envs(cfg)
    assert list(envs) == ["gpqa_diamond"] and envs["gpqa_diamond"][0].name == "gpqa"


def test_missing_data_exits_with_instructions(capsys):
    rc = main(["model=qwen3_0_6b", "benchmark=math500", "benchmark.math500.environment.dataset=/nonexistent/m.jsonl"])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_run_checkpoint(tmp_path, capsys):
    rc = main([f"run_dir={tmp_path}", "benchmark=gsm8k", f"benchmark.gsm8k.environment.dataset={FIX / 'gsm8k.jsonl'}"])
    assert rc == 2 and "checkpoints/final" in capsys.readouterr().err


def _fake_run_dir(tmp_path: Path) -> Path:
    from rlexp.models.tokenizer import copy_char_tokenizer

    final = tmp_path / "run" / "checkpoints" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    copy_char_tokenizer(final)
    return final.parents[1]


def test_eval_run_dir_writes_results_with_fake_backend(tmp_path, monkeypatch):
    """The generator is a scripted fake (no model runs here); everything else is the real CLI path."""
    class FakeBackend:
        def __init__(self, tokenizer):
            self.tok = tokenizer

        def generate(self, prompt_ids, n, max_tokens, temperature, seed, stop=None):
            out = []
            for ids in prompt_ids:
                text = "so \\boxed{16}" if "baker" in self.tok.decode(ids) else "no idea"
                out += [Completion(ids, self.tok.encode(text), [0.0] * len(text), text, 0)] * n
            return out

    fake = types.ModuleType("rlexp.models.backends")
    fake.build_backend = lambda backend, model_dir, tokenizer, seed: FakeBackend(tokenizer)
    monkeypatch.setitem(sys.modules, "rlexp.models.backends", fake)
    out = tmp_path / "out"
    run_dir = _fake_run_dir(tmp_path)
    rc = main([f"run_dir={run_dir}", "benchmark=gsm8k", f"benchmark.gsm8k.environment.dataset={FIX / 'gsm8k.jsonl'}",
               "n=2", "--out", str(out)])
    assert rc == 0
    rows = [json.loads(x) for x in (out / "samples_gsm8k.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and sum(r["correct"] for r in rows) == 2
    table = next(csv.DictReader((out / "results.csv").open()))
    assert table["accuracy"] == "0.2500" and table["unparseable"] == "0.7500" and table["pass@2"] == "0.2500"
    assert "| gsm8k |" in (out / "results.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["final_metrics"]["eval/gsm8k/accuracy"] == 0.25
    assert manifest["datasets"]["gsm8k"]["n"] == 4 and len(manifest["datasets"]["gsm8k"]["sha256"]) == 64


def test_eval_tiny_model_end_to_end(tmp_path):
    """The real path: tiny random checkpoint, the titan generator backend, scoring, files (< 60 s)."""
    from rlexp.config.model import ModelConfig
    from rlexp.models.tiny import ensure_tiny_checkpoint

    run_dir = tmp_path / "run"
    ensure_tiny_checkpoint(ModelConfig(), run_dir / "checkpoints" / "final")
    out = tmp_path / "out"
    t = time.perf_counter()
    rc = main([f"run_dir={run_dir}", "benchmark=gsm8k", f"benchmark.gsm8k.environment.dataset={FIX / 'gsm8k.jsonl'}",
               "max_tokens=8", "--out", str(out)])
    assert rc == 0 and time.perf_counter() - t < 60
    rows = [json.loads(x) for x in (out / "samples_gsm8k.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(isinstance(r["response"], str) for r in rows)
    assert json.loads((out / "manifest.json").read_text())["status"] == "completed"


def test_eval_does_not_import_monarch(tmp_path):
    """`rlexp eval` samples in its own process: importing Monarch would cost start-up time and tie a
    plain evaluation to the actor runtime. Run in a fresh interpreter, since this one may have it loaded."""
    from rlexp.config.model import ModelConfig
    from rlexp.models.tiny import ensure_tiny_checkpoint

    run_dir = tmp_path / "run"
    ensure_tiny_checkpoint(ModelConfig(), run_dir / "checkpoints" / "final")
    args = [f"run_dir={run_dir}", "benchmark=gsm8k", f"benchmark.gsm8k.environment.dataset={FIX / 'gsm8k.jsonl'}",
            "max_tokens=4", "max_samples=2", "--out", str(tmp_path / "out")]
    code = ("import sys\n"
            "from rlexp.evals.cli import main\n"
            f"rc = main({args!r})\n"
            "print('RC', rc)\n"
            "print('MONARCH', sorted(m for m in sys.modules if m == 'monarch' or m.startswith('monarch.')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "RC 0" in proc.stdout, proc.stdout + proc.stderr
    assert "MONARCH []" in proc.stdout, proc.stdout
