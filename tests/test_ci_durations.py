"""scripts/ci_durations.py: the junit XML pytest writes in `.ci/run`, summed per file and tier."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.conftest import load_script

ci_durations = load_script("ci_durations")

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4" time="75.5">
<testcase classname="tests.test_design_doc" name="test_a" time="0.5">
  <properties><property name="tier" value="unit"/></properties></testcase>
<testcase classname="tests.test_design_doc" name="test_b" time="11.5">
  <properties><property name="tier" value="unit"/></properties></testcase>
<testcase classname="tests.test_train_e2e" name="test_run" time="40.0">
  <properties><property name="tier" value="e2e"/><property name="cpu_s" value="52.50"/></properties>
</testcase>
<testcase classname="tests.test_slurm.TestJobs" name="test_job" time="20.0">
  <properties><property name="tier" value="slurm"/><property name="cpu_s" value="3.25"/>
  </properties>
</testcase>
</testsuite></testsuites>
"""


def test_per_file_per_tier_and_slowest(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(XML)
    cases = ci_durations.read(xml)
    # The class name gives its file.
    assert ("tests/test_slurm.py", "test_job", 20.0, "slurm", 3.25) in cases
    assert cases[0].cpu == 0.0  # a report written without the cpu_s property
    text = ci_durations.summary(cases, top=2, every_file=True)
    lines = text.splitlines()
    assert lines[0] == "CI durations: 4 tests, 72 s of test time (1.2 min), 56 s of CPU"
    assert lines[1].split() == ["tier", "e2e", "1", "tests", "40.0", "s", "cpu", "52.5", "s"]
    # The test that waits is told from the one that computes by its CPU beside its wall time.
    assert "      20.0     3.2  tests/test_slurm.py::test_job" in lines
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
    """scripts/test.sh writes one report for the slurm tier (run beside the rest) and one
    for the rest."""
    unit, rest = tmp_path / "unit.xml", tmp_path / "rest.xml"
    unit.write_text(XML)
    rest.write_text(XML.replace("test_run", "test_other"))
    assert ci_durations.main([str(unit), str(rest)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[:2] == [f"{unit}: pytest session 76 s wall", f"{rest}: pytest session 76 s wall"]
    assert lines[2] == "CI durations: 8 tests, 144 s of test time (2.4 min), 112 s of CPU"
    assert "tests/test_train_e2e.py::test_other" in out
    assert "tests/test_train_e2e.py::test_run" in out
    assert ci_durations.main([str(unit), str(tmp_path / "none.xml")]) == 2
    assert "none.xml" in capsys.readouterr().err



def test_the_test_script_runs_each_tier_beside_the_others_and_fails_if_one_fails(
        tmp_path: Path) -> None:
    """scripts/test.sh (README's test command): each tier in its own pytest run, side by side; a run
    in the background keeps its tests, output and failure, and the others' passes do not hide it."""
    import os
    import subprocess

    from tests.conftest import REPO

    suite = tmp_path / "test_three_tiers.py"  # outside tests/: its tier marks are its own
    suite.write_text("import pytest\n\n"
                     "@pytest.mark.unit\ndef test_computes():\n"
                     "    import os\n    assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE'\n\n"
                     "@pytest.mark.e2e\ndef test_runs():\n    assert True\n\n"
                     "@pytest.mark.slurm\ndef test_waits():\n"
                     "    assert 1 == 2, 'slurm side failed'\n")
    env = {**os.environ, "RLEXP_TEST_JUNIT_DIR": str(tmp_path / "junit")}
    env.pop("OMP_WAIT_POLICY", None)  # the script's own: OpenMP threads sleep while they wait
    cmd = ["bash", str(REPO / "scripts/test.sh"), str(suite), "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ran = {t: [c.name for c in ci_durations.read(tmp_path / f"junit/junit_{t}.xml")]
           for t in ("e2e", "unit", "slurm")}
    assert ran == {"e2e": ["test_runs"], "unit": ["test_computes"], "slurm": ["test_waits"]}
    out = proc.stdout
    unit_at = out.index("--- the unit tier, run beside the tests above:")
    slurm_at = out.index("--- the slurm tier, run beside the tests above:")
    assert out.index("1 passed") < unit_at < slurm_at < out.index("slurm side failed")
    assert "CI durations: 3 tests" in out

    # One tier's tests only (a file, -k): the other runs select none, and that is no failure.
    proc = subprocess.run([*cmd, "-k", "computes"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([*cmd, "-k", "nothing_has_this_name"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 5, proc.stdout + proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_test_script_interrupts_every_run_and_leaves_none(tmp_path: Path,
                                                                         sig: int) -> None:
    """Ctrl-C, or a CI timeout's SIGTERM, to scripts/test.sh: each of the three runs gets SIGINT
    (pytest's own interrupt: fixtures torn down) although two run in the background, where bash
    ignores SIGINT; the script exits 130 / 143 at once, and no pytest is left running."""
    import os
    import subprocess
    import time

    from tests.conftest import REPO

    started = tmp_path / "started"
    started.mkdir()
    suite = tmp_path / "test_three_waits.py"
    suite.write_text("import os, time, pytest\n\n" + "".join(
        f"@pytest.mark.{t}\ndef test_{t}():\n"
        f"    open(os.path.join({str(started)!r}, {t!r}), 'w').close()\n    time.sleep(120)\n\n"
        for t in ("unit", "e2e", "slurm")))
    env = {**os.environ, "RLEXP_TEST_JUNIT_DIR": str(tmp_path / "junit")}
    cmd = ["bash", str(REPO / "scripts/test.sh"), str(suite), "-p", "no:cacheprovider"]
    # As from a terminal: SIGINT not ignored, whatever this pytest was started under (a shell's
    # background job ignores it, and an ignored signal stays ignored across exec)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while len(list(started.iterdir())) < 3:
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
        time.sleep(0.1)
    t = time.time()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig and time.time() - t < 15, (proc.returncode, out)
    assert out.count("KeyboardInterrupt") >= 3, out  # each run's own report, the logs printed
    left = subprocess.run(["pgrep", "-f", suite.name], capture_output=True,
                          text=True).stdout.split()
    assert left == [], left
