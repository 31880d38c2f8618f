"""scripts/ci_durations.py: the junit XML pytest writes in `.ci/run`, summed per file and tier."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import load_script

ci_durations = load_script("ci_durations")

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_design_doc" name="test_a" time="0.5">
  <properties><property name="tier" value="unit"/></properties></testcase>
<testcase classname="tests.test_design_doc" name="test_b" time="11.5">
  <properties><property name="tier" value="unit"/></properties></testcase>
<testcase classname="tests.test_train_e2e" name="test_run" time="40.0">
  <properties><property name="tier" value="e2e"/></properties></testcase>
<testcase classname="tests.test_slurm.TestJobs" name="test_job" time="20.0">
  <properties><property name="tier" value="slurm"/></properties></testcase>
</testsuite></testsuites>
"""


def test_per_file_per_tier_and_slowest(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(XML)
    cases = ci_durations.read(xml)
    assert ("tests/test_slurm.py", "test_job", 20.0, "slurm") in cases  # class name -> its file
    text = ci_durations.summary(cases, top=2, every_file=True)
    lines = text.splitlines()
    assert lines[0] == "CI durations: 4 tests, 72 s of test time (1.2 min)"
    assert lines[1].split() == ["tier", "e2e", "1", "tests", "40.0", "s"]
    first = lines.index("Slowest 2 files (s, tests):") + 1
    assert [ln.split()[-1] for ln in lines[first:first + 2]] == [
        "tests/test_train_e2e.py", "tests/test_slurm.py"]
    assert "      12.0     2  tests/test_design_doc.py" in lines  # every file's total, both tests
    # A unit test over 10 s is named as e2e work in the unit tier; the 0.5 s one is not.
    assert "      11.5  tests/test_design_doc.py::test_b" in lines[lines.index(
        "Unit tests over 10 s (e2e work in the unit tier? mark them slow):"):]
    assert not any(ln.endswith("::test_a") for ln in lines)


def test_a_missing_report_says_what_to_do(tmp_path: Path, capsys) -> None:
    assert ci_durations.main([str(tmp_path / "none.xml")]) == 2
    assert "--junitxml" in capsys.readouterr().err


def test_two_reports_are_summed_as_one_run(tmp_path: Path, capsys) -> None:
    """`.ci/run` writes one report for the unit tier (two workers) and one for the rest."""
    unit, rest = tmp_path / "unit.xml", tmp_path / "rest.xml"
    unit.write_text(XML)
    rest.write_text(XML.replace("test_run", "test_other"))
    assert ci_durations.main([str(unit), str(rest)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "CI durations: 8 tests, 144 s of test time (2.4 min)"
    assert "tests/test_train_e2e.py::test_other" in out
    assert "tests/test_train_e2e.py::test_run" in out
    assert ci_durations.main([str(unit), str(tmp_path / "none.xml")]) == 2
    assert "none.xml" in capsys.readouterr().err
