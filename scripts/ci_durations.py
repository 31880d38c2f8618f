"""Summarise a pytest junit XML into what CI costs: seconds per tier, the slowest files and tests.

`.ci/run` writes the XML (`pytest --junitxml=...`) and prints this summary, so every run records
where its minutes went and a growing file is seen the day it grows. A test's time is its setup,
call and teardown (a module- or session-scoped fixture counts in the first test that uses it).
The tier of each test is the `tier` property tests/conftest.py records (unit, e2e, slurm, soak).

    python scripts/ci_durations.py results.xml [more.xml ...] [--top 10] [--all]

Several reports (`.ci/run` writes one for the unit tier, run on two workers, and one for the
rest) are summed as one run.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
Case = tuple[str, str, float, str]  # file, test name, seconds, tier
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
    """(file, test name, seconds, tier) for every test case in the report."""
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases.append((test_file(case.get("classname", "")), case.get("name", ""),
                      float(case.get("time") or 0.0), props.get("tier", "?")))
    return cases


def summary(cases: list[Case], top: int = 10, every_file: bool = False) -> str:
    per_file: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    per_tier: dict[str, float] = defaultdict(float)
    tier_count: dict[str, int] = defaultdict(int)
    for file, _, secs, tier in cases:
        per_file[file] += secs
        count[file] += 1
        per_tier[tier] += secs
        tier_count[tier] += 1
    total = sum(per_tier.values())
    lines = [f"CI durations: {len(cases)} tests, {total:.0f} s of test time "
             f"({total / 60:.1f} min)"]
    lines += [f"  tier {t:<6} {tier_count[t]:>5} tests {s:>8.1f} s" for t, s in
              sorted(per_tier.items(), key=lambda kv: -kv[1])]
    ranked = sorted(per_file.items(), key=lambda kv: -kv[1])
    lines.append(f"Slowest {min(top, len(ranked))} files (s, tests):")
    lines += [f"  {s:>8.1f} {count[f]:>5}  {f}" for f, s in ranked[:top]]
    slow_cases = sorted(cases, key=lambda c: -c[2])[:top]
    lines.append(f"Slowest {len(slow_cases)} tests (s):")
    lines += [f"  {c[2]:>8.1f}  {c[0]}::{c[1]}" for c in slow_cases]
    slow_units = [c for c in cases if c[3] == "unit" and c[2] > UNIT_S]
    # A unit test that takes this long spawns processes: mark it `slow` (the e2e tier).
    if slow_units:
        lines.append(f"Unit tests over {UNIT_S:.0f} s (e2e work in the unit tier? mark them slow):")
        slow_units.sort(key=lambda c: -c[2])
        lines += [f"  {c[2]:>8.1f}  {c[0]}::{c[1]}" for c in slow_units]
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
    print(summary([c for x in args.xml for c in read(x)], args.top, args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
