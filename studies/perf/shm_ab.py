#!/usr/bin/env python3
"""Paired A/B of the shm transport: this tree's `ShmTransport` against the one at a git revision, on
one noisy machine. Each repeat measures, back to back, a memcpy of the same bytes into a faulted
buffer, the old transport's publish + fetch_into and the new one's, so every ratio to memcpy is
taken under the same load; medians and ranges over repeats are printed as a markdown table.

    python studies/perf/shm_ab.py --rev 9a11c76 --mb 256 --reps 9
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rlexp.transport import shm as new_shm  # noqa: E402
from rlexp.transport.probe import synthetic_hf_state_dict  # noqa: E402


def load_old(rev: str):
    src = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:rlexp/transport/shm.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_shm.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_shm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--rev", required=True, help="git revision of the baseline rlexp/transport/shm.py"
    )
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--keep", type=int, default=2)
    a = ap.parse_args()
    sd = synthetic_hf_state_dict(a.mb)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    params = {k: torch.zeros_like(v) for k, v in sd.items()}
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = src.clone()
    old = load_old(a.rev)
    arms = {"old": old.ShmTransport("rlexp-ab-old", keep=a.keep),
            "new": new_shm.ShmTransport("rlexp-ab-new", keep=a.keep)}
    ratio: dict[str, list[float]] = {k: [] for k in arms}
    gbps: dict[str, list[float]] = {k: [] for k in [*arms, "memcpy"]}
    version = 0
    try:
        # two warm-ups: the new arm reuses pages from its third publish on
        for r in range(a.reps + 2):
            t0 = time.perf_counter()
            dst.copy_(src)
            mem = time.perf_counter() - t0
            for name, t in arms.items():
                version += 1
                t0 = time.perf_counter()
                loc = t.publish(version, sd)
                t.fetch_into(loc, params)
                dt = time.perf_counter() - t0
                assert all(torch.equal(params[k], sd[k]) for k in sd), name
                for v in params.values():
                    v.zero_()
                if r >= 2:
                    ratio[name].append(mem / dt)
                    gbps[name].append(nbytes / 1e9 / dt)
            if r >= 2:
                gbps["memcpy"].append(nbytes / 1e9 / mem)
    finally:
        for t in arms.values():
            t.close()
    print(
        f"| arm ({nbytes / 2**20:.0f} MiB bf16, keep={a.keep}, {a.reps} paired repeats) | GB/s "
        "median [range] | share of memcpy bandwidth, median [range] |"
    )
    print("|---|---|---|")
    for name in [*arms, "memcpy"]:
        g = gbps[name]
        share = (
            f"{statistics.median(ratio[name]):.2f} [{min(ratio[name]):.2f}-{max(ratio[name]):.2f}]"
            if name in ratio
            else "1"
        )
        label = {
            "old": f"shm publish + fetch_into at {a.rev}",
            "new": "shm publish + fetch_into (this tree)",
            "memcpy": "memcpy into a faulted buffer",
        }[name]
        print(f"| {label} | {statistics.median(g):.3g} [{min(g):.3g}-{max(g):.3g}] | {share} |")


if __name__ == "__main__":
    main()
