"""`rlexp --help` and every subcommand's `--help`/`-h`: exit 0, no traceback, the command's options named.

Run in subprocesses because that is how users meet them: a help flag that reaches Hydra's override parser,
or a module that crashes on import, only shows up through the real entry point. Help must also stay cheap,
so it may not import torch or Monarch: the `--help` run of each command is made with
`-X importtime`, whose list of every module imported shows it (one process per command and flag,
not a third one for that check).
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rlexp.cli import COMMANDS
from rlexp.config.paths import CONF_DIR

FLAGS = ("--help", "-h")


def _eval_expected() -> list[str]:
    eval_keys = [f"{k}=" for k in OmegaConf.load(CONF_DIR / "eval.yaml") if k != "defaults"]
    benchmarks = [p.stem for p in (CONF_DIR / "benchmark").glob("*.yaml")]
    backends = [str(OmegaConf.load(p).backend) for p in (CONF_DIR / "generator").glob("*.yaml")]
    from rlexp.evals.selection import MODES

    sets = [p.stem for p in (CONF_DIR / "verifier_set").glob("*.yaml")]
    return ["--out", "--config-dir", "math500", "gpqa_diamond", "mmlu_pro", "titan", "vllm", "backend=titan",
            *eval_keys, *benchmarks, *backends,
            # test-time selection: every mode, and the verifier sets it scores with
            "selection=none", "selection=[MODE,...]", "none", "weaver", "majority", "best_verifier", "mean",
            "oracle choice", *MODES, "verifier_set=NAME", *sets]


EXPECTED: dict[str, list[str]] = {
    "train": ["algorithm:", "benchmark:", "environment:", "generator:", "model:", "reward:", "sync:"],
    "eval": _eval_expected(),
    "plan": ["overrides", "--headroom", "--config-dir", "--config-name"],
    "doctor": ["overrides", "--config-dir", "--config-name"],
    "compare": ["paths", "--out", "--tracking-uri", "--metrics"],
    "reproduce": ["run_dir", "--dry-run", "extra"],
    "bench": ["--sync-mb", "--reps", "--batch", "--prompt-len", "--max-tokens", "--backends", "--skip-sync",
              "--skip-gen", "--out"],
    "config-reference": ["KEY_OR_GROUP", "--markdown"],
}


def _rlexp(*args: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m rlexp ARGS`; with `importtime` its stderr also lists every module imported."""
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "rlexp", *args], capture_output=True, text=True,
                          timeout=120)


def _heavy(stderr: str) -> list[str]:
    """torch or Monarch among the modules `-X importtime` listed (a submodule imports its package
    first)."""
    return [m for m in ("torch", "monarch") if re.search(rf"\|\s+{m}$", stderr, re.M)]


def test_every_command_has_expected_options():
    assert set(EXPECTED) == set(COMMANDS), "a new command needs its help checked here"


@pytest.mark.parametrize("flag", FLAGS)
def test_top_level_help_lists_commands(flag: str):
    proc = _rlexp(flag)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    for name in COMMANDS:
        assert name in proc.stdout


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("command", list(EXPECTED))
def test_command_help(command: str, flag: str):
    proc = _rlexp(command, flag, importtime=flag == "--help")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    missing = [word for word in EXPECTED[command] if word not in proc.stdout]
    assert not missing, f"`rlexp {command} {flag}` does not mention {missing}:\n{proc.stdout}"
    if flag == "--help":  # help stays cheap: it imports neither torch nor Monarch (was its own test)
        assert _heavy(proc.stderr) == [], f"`rlexp {command} --help` imports {_heavy(proc.stderr)}"


def test_eval_help_reads_the_given_config_dir(tmp_path):
    (tmp_path / "benchmark").mkdir()
    (tmp_path / "eval.yaml").write_text("defaults:\n  - benchmark: mine\n  - _self_\n"
                                        "backend: titan\nfancy: 3  # a key\n")
    (tmp_path / "benchmark" / "mine.yaml").write_text("mine:\n  environment:\n    name: gsm8k\n  max_tokens: 7\n")
    proc = _rlexp("eval", "--config-dir", str(tmp_path), "--help")
    assert proc.returncode == 0, proc.stderr
    assert "mine" in proc.stdout and "max_tokens 7" in proc.stdout and "fancy=3" in proc.stdout
    assert "math500" not in proc.stdout
    proc = _rlexp("eval", "--config-dir", str(tmp_path / "nowhere"), "-h")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "not found" in proc.stderr
