"""Prompts and answers checked against the CPU character tokenizer before anything spawns
(issue 45): a `→` used to train as "?" without a word."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlexp.config.schema import TrainConfig
from rlexp.config.validate import ConfigError
from rlexp.models.tokenizer import ASSET, CharTokenizer, copy_char_tokenizer
from rlexp.run.inputs import VOCAB_TRAIN_CHECKED, check_vocabulary
from rlexp.types import Problem, Sample
from tests.conftest import REPO, kill_tagged, tagged_env


def _s(i: int, prompt: str = "abab:", answer: str = "2") -> Sample:
    return Sample(Problem(id=f"p{i}", prompt=prompt), answer=answer)


@pytest.fixture
def char_dir(tmp_path: Path) -> str:
    copy_char_tokenizer(tmp_path)
    return str(tmp_path)


def test_unknown_finds_the_first_character_outside_the_vocabulary() -> None:
    tok = CharTokenizer(ASSET)
    assert tok.unknown("ab\tc\n~ ") is None
    assert tok.unknown("a → b é") == "→"


def test_refused_naming_sample_character_code_point_and_fix(char_dir: str) -> None:
    t = TrainConfig()
    held = [_s(0), _s(1, "3 → ?", "x")]
    with pytest.raises(ConfigError) as e:
        check_vocabulary(t, [_s(2), _s(3, answer="caf\u00e9")], held, char_dir)
    msg = str(e.value)
    for part in ("'→' (U+2192)", "prompt of problem 'p1'", "'3 → ?'",
                 "2 of the 4 samples checked",
                 "2 held-out", "2 of 2 training", "model.unknown_chars=map", "'->'"):
        assert part in msg, msg


def test_map_warns_and_records(char_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    t = TrainConfig()
    t.model.unknown_chars = "map"  # type: ignore[assignment]
    got = check_vocabulary(t, [_s(0, answer="\u00e9")], [], char_dir)
    assert got == {"checked": 1, "of": 1, "unknown": 1, "mode": "map"}
    assert "U+00E9" in capsys.readouterr().err


def test_bounded_and_hf_tokenizer_skipped(char_dir: str, tmp_path: Path) -> None:
    train = [_s(i) for i in range(VOCAB_TRAIN_CHECKED + 500)]
    got = check_vocabulary(TrainConfig(), train, [_s(-1)], char_dir)
    assert got == {"checked": VOCAB_TRAIN_CHECKED + 1, "of": VOCAB_TRAIN_CHECKED + 501,
                   "unknown": 0, "mode": "refuse"}
    hf = tmp_path / "hf"
    hf.mkdir()
    # A Hugging Face tokenizer is byte-level: nothing to check.
    assert check_vocabulary(TrainConfig(), [_s(0, "→")], [], str(hf)) is None


ARROW_TASK = '''
from mytask.tasks import CountA
from rlexp.types import Problem, Sample


class Arrow(CountA):
    def load_samples(self, split):
        return [Sample(Problem(id=s.id, prompt=s.id + " \u2192"), answer=s.answer)
                for s in super().load_samples(split)]
'''


def test_train_refuses_an_arrow_before_spawning(tmp_path: Path) -> None:
    """A user's environment whose prompts end in `→`: `rlexp train` stops in its checks, one line,
    before any actor is spawned."""
    project = tmp_path / "my_task"
    shutil.copytree(REPO / "examples" / "my_task", project,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (project / "mytask" / "arrow.py").write_text(ARROW_TASK)
    tag = "vocab-" + tmp_path.name
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "rlexp", "train",
                            f"config_path={project / 'conf'}", "environment=count_a",
                            "environment.name=mytask.arrow:Arrow", "steps=1",
                            f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=tagged_env(tag),
                           capture_output=True, text=True, timeout=300)
    finally:
        kill_tagged(tag)
    assert p.returncode == 2, p.stderr[-3000:]
    err = p.stderr
    assert "Traceback" not in err and "U+2192" in err and "problem '" in err, err[-3000:]
    assert "checks done" not in err, err[-3000:]  # refused in the checks, before any actor
    assert time.monotonic() - t0 < 120
