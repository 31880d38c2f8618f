"""Summarise a pytest junit XML into what CI costs: seconds per tier, the slowest files and tests.

`.ci/run` writes the XML (`pytest --junitxml=...`) and prints this summary, so every run records
where its minutes went and a growing file is seen the day it grows. A test's time is its setup,
call and teardown (a module- or session-scoped fixture counts in the first test that uses it).
The tier of each test is the `tier` property tests/conftest.py records (unit, e2e, slurm, soak), and
its CPU seconds the `cpu_s` property (this process and the children it reaped): CPU well under the
wall time is a test that waits, which is where running tiers side by side pays.

    python scripts/ci_durations.py results.xml [more.xml ...] [--top 10] [--all]

Several reports (scripts/test.sh writes one per tier, the tiers run side by side) are summed as
one run; each one's own wall time is printed first.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent


class Case(NamedTuple):
    file: str
    name: str
    seconds: float  # wall: setup + call + teardown
    tier: str
    cpu: float  # user + system of pytest and its reaped children; 0 in reports without it


UNIT_S = 10.0  # a unit test slower than this is listed: it belongs in the e2e tier


def test_file(classname: str) -> str:
    """`tests.test_x.TestY` -> `tests/test_x.py`: the longest dotted prefix that is a repo file."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        rel = "/".join(parts[:i]) + ".py"
        if (REPO / rel).is_file():
            return rel
    return "/".join(parts) + ".py"


def read(xml_path: Path) -> list[Case]:
    """Every test case in the report."""
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases.append(Case(test_file(case.get("classname", "")), case.get("name", ""),
                          float(case.get("time") or 0.0), props.get("tier", "?"),
                          float(props.get("cpu_s") or 0.0)))
    return cases


def session_seconds(xml_path: Path) -> float:
    """The report's whole pytest session (collection included): junit's <testsuite time=>."""
    return sum(float(s.get("time") or 0.0) for s in ET.parse(xml_path).getroot().iter("testsuite"))


def summary(cases: list[Case], top: int = 10, every_file: bool = False) -> str:
    per_file: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    per_tier: dict[str, float] = defaultdict(float)
    tier_cpu: dict[str, float] = defaultdict(float)
    tier_count: dict[str, int] = defaultdict(int)
    for c in cases:
        per_file[c.file] += c.seconds
        count[c.file] += 1
        per_tier[c.tier] += c.seconds
        tier_cpu[c.tier] += c.cpu
        tier_count[c.tier] += 1
    total = sum(per_tier.values())
    lines = [f"CI durations: {len(cases)} tests, {total:.0f} s of test time "
             f"({total / 60:.1f} min), {sum(tier_cpu.values()):.0f} s of CPU"]
    lines += [f"  tier {t:<6} {tier_count[t]:>5} tests {s:>8.1f} s  cpu {tier_cpu[t]:>7.1f} s"
              for t, s in sorted(per_tier.items(), key=lambda kv: -kv[1])]
    ranked = sorted(per_file.items(), key=lambda kv: -kv[1])
    lines.append(f"Slowest {min(top, len(ranked))} files (s, tests):")
    lines += [f"  {s:>8.1f} {count[f]:>5}  {f}" for f, s in ranked[:top]]
    slow_cases = sorted(cases, key=lambda c: -c.seconds)[:top]
    lines.append(f"Slowest {len(slow_cases)} tests (s wall, s cpu):")
    lines += [f"  {c.seconds:>8.1f} {c.cpu:>7.1f}  {c.file}::{c.name}" for c in slow_cases]
    slow_units = [c for c in cases if c.tier == "unit" and c.seconds > UNIT_S]
    # A unit test that takes this long spawns processes: mark it `slow` (the e2e tier).
    if slow_units:
        lines.append(f"Unit tests over {UNIT_S:.0f} s (e2e work in the unit tier? mark them slow):")
        slow_units.sort(key=lambda c: -c.seconds)
        lines += [f"  {c.seconds:>8.1f}  {c.file}::{c.name}" for c in slow_units]
    if every_file:
        lines.append("Every file (s, tests):")
        lines += [f"  {s:>8.1f} {count[f]:>5}  {f}" for f, s in sorted(per_file.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("xml", type=Path, nargs="+", help="pytest's --junitxml output(s)")
    ap.add_argument("--top", type=int, default=10,
                    help="how many of the slowest files and tests to list")
    ap.add_argument("--all", action="store_true", help="also list every file's total")
    args = ap.parse_args(argv)
    missing = [str(x) for x in args.xml if not x.is_file()]
    if missing:
        print(f"ci_durations: no junit XML at {', '.join(missing)} (did pytest run with "
              f"--junitxml?)", file=sys.stderr)
        return 2
    for x in args.xml:
        print(f"{x}: pytest session {session_seconds(x):.0f} s wall")
    print(summary([c for x in args.xml for c in read(x)], args.top, args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
