"""`rlexp bench`'s generation rows (issue 25 item 5): transformers `generate` and the titan sampler on the same
prompts and lengths, every engine writing batch x max_tokens tokens, with the cost split the row reports."""
from __future__ import annotations

import re

import pytest

from rlexp.bench import bench_generation, main


def test_generation_rows_compare_equal_token_counts_against_transformers_generate() -> None:
    # reps=3, a median: one scheduling hiccup on a busy machine must not flip the forward-vs-call check below
    rows = bench_generation([2, 3], prompt_len=4, max_tokens=5, reps=3, backends=["titan"])
    assert [r.what for r in rows] == ["transformers `generate`, batch 2", "generator backend `titan`, batch 2",
                                      "transformers `generate`, batch 3", "generator backend `titan`, batch 3"]
    for base, titan, batch in ((rows[0], rows[1], 2), (rows[2], rows[3], 3)):
        assert base.value > 0 and titan.value > 0 and titan.baseline_value == base.value
        assert f"{batch * 5} tokens per call" in base.note and f"{batch * 5} tokens per call" in titan.note
        assert "NOT the baseline" not in titan.note
        call_ms, forward_ms = map(int, re.search(r"of (\d+) ms per call, (\d+) ms is the trainer-logprob forward",
                                                 titan.note).groups())
        assert 0 <= forward_ms <= call_ms


def test_a_backend_that_cannot_start_is_reported_not_fatal() -> None:
    rows = bench_generation([2], prompt_len=4, max_tokens=3, reps=1, backends=["no_such_backend"])
    assert rows[1].value != rows[1].value  # nan
    assert "not measured" in rows[1].note


def test_a_bad_batch_list_is_refused_before_any_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("8,x", "0", ","):
        with pytest.raises(SystemExit) as e:
            main(["--batch", bad, "--skip-sync"])
        assert e.value.code == 2 and "positive batch sizes" in capsys.readouterr().err
