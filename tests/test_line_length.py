"""The 100-character ratchet (scripts/line_length.py): no file gets more lines over 100 characters
than `.ci/long_lines.txt` records, and a file not recorded there has none.

To lower the baseline after wrapping lines: `python scripts/line_length.py --lower` and commit
`.ci/long_lines.txt` (it only ever writes counts that fell). A file that git records as moved
keeps its count with `--accept` (review the diff of `.ci/long_lines.txt`: only the moved paths
should change).
"""
from __future__ import annotations

from pathlib import Path

from tests.conftest import load_script

line_length = load_script("line_length")


def test_no_file_has_more_long_lines_than_its_baseline() -> None:
    grown = line_length.grown(line_length.current(), line_length.read_baseline())
    assert not grown, ("lines over 100 characters were added (wrap them; `python "
                       "scripts/line_length.py` lists the same):\n" + "\n".join(grown))


def test_a_grown_file_and_a_new_file_fail_and_lower_never_raises(tmp_path: Path) -> None:
    """The ratchet itself, on a tree of its own (not a git checkout: the walk is used)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "old.py").write_text("x = 1\n" + "#" * 101 + "\n" + "#" * 101 + "\n")
    (tmp_path / "pkg" / "new.py").write_text("y = '" + "a" * 120 + "'\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "skipped.py").write_text("z" * 200 + "\n")
    now = line_length.current(tmp_path)
    assert now == {"pkg/new.py": 1, "pkg/old.py": 2}
    assert line_length.grown(now, {"pkg/old.py": 2, "pkg/new.py": 1}) == []
    assert line_length.grown(now, {"pkg/old.py": 1}) == [
        "pkg/new.py: 1 lines over 100 characters, baseline 0",
        "pkg/old.py: 2 lines over 100 characters, baseline 1"]
    base = tmp_path / "long_lines.txt"
    line_length.write_baseline({"pkg/old.py": min(2, 5)}, base)
    assert line_length.read_baseline(base) == {"pkg/old.py": 2}
    assert line_length.read_baseline(tmp_path / "absent.txt") == {}

