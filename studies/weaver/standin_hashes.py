"""Build the Weaver study's stand-ins in a fresh cache; print, write or check their sha256.

    python studies/weaver/standin_hashes.py --cache /tmp/fresh --check   # every stand-in, ~15 min
    python studies/weaver/standin_hashes.py --cache DIR --names start,rm_large --print
    python studies/weaver/standin_hashes.py --cache DIR --write   # record this machine kind's draw

The stand-ins: `start`, the warm start every arm of `experiment=weaver_cpu` begins from,
`start_headroom`, that of the task with headroom (addendum v18:
`+environment.options.held_out_min=8`), and every tiny verifier of panels A-E and W
(rlexp/rewards/verifiers/tiny_panels.py). The hash of each is
`hash_files` of its folder, what a run's manifest records and `studies/weaver/weaver_analysis.py`
prints.

Why per machine kind: the builds pin threads and ask for deterministic kernels
(rlexp/models/numerics.py), but the instruction set ATen dispatches to and MKL's vendor path still
decide the bits, so the committed hashes (studies/weaver/standin_sha256.json) are keyed by
`machine_kind_name()`; a kind not listed there is a new draw, to be recorded with --write.
`--threads` sets torch's threads before the build, to show that the build does not depend on them.
The cache must be empty: a reused folder proves nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).resolve().parent / "standin_sha256.json"
# the warm starts, by name: the overrides of the experiment whose runs begin from it
STARTS = {"start": ["experiment=weaver_cpu"],
          "start_headroom": ["experiment=weaver_cpu", "+environment.options.held_out_min=8"]}


def build(names: list[str] | None) -> dict[str, str]:
    """{name: sha256 of its folder} for `names` (None: all), built under $RLEXP_CACHE."""
    from hydra import compose, initialize_config_dir

    from rlexp.config.paths import CONF_DIR
    from rlexp.config.schema import register_configs
    from rlexp.envs.registry import build_env
    from rlexp.rewards.verifiers.tiny import ensure_tiny_verifier
    from rlexp.rewards.verifiers.tiny_panels import TINY_VERIFIERS
    from rlexp.run.prepare import check_config, resolve_model
    from rlexp.run.warmup import ensure_warm_checkpoint
    from rlexp.tracking.files import hash_files

    wanted = [*STARTS, *TINY_VERIFIERS] if names is None else names
    unknown = [n for n in wanted if n not in STARTS and n not in TINY_VERIFIERS]
    if unknown:
        raise SystemExit(f"--names: {unknown} are no stand-ins; choose among "
                         f"{', '.join([*STARTS, *TINY_VERIFIERS])}")
    out: dict[str, str] = {}
    for name in wanted:
        if name in STARTS:
            register_configs()
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("train", overrides=[*STARTS[name], "reward=annotated"])
            t = check_config(cfg)
            path, _ = ensure_warm_checkpoint(resolve_model(t.model), t, build_env(t.environment))
        else:
            path = ensure_tiny_verifier(TINY_VERIFIERS[name])
        out[name] = hash_files(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path,
                    help="an empty or new folder: the cache root")
    ap.add_argument("--names", help="comma-separated stand-ins (default: all)")
    ap.add_argument("--threads", type=int, help="torch's intra-op threads before the build")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--print", action="store_true", help="print {kind, hashes} as JSON")
    mode.add_argument("--check", action="store_true", help="compare with the committed hashes")
    mode.add_argument("--write", action="store_true",
                      help="record the hashes for this machine kind")
    a = ap.parse_args(argv)
    if a.cache.exists() and any(a.cache.iterdir()):
        raise SystemExit(f"--cache {a.cache} is not empty: a stand-in found there would be reused, "
                         "not built; give a new folder")
    # read by rlexp.models.tiny at import: set before anything imports it
    os.environ["RLEXP_CACHE"] = str(a.cache.resolve())
    sys.path.insert(0, str(REPO))
    import torch

    from rlexp.models.numerics import machine_kind, machine_kind_name

    if a.threads:
        torch.set_num_threads(a.threads)
    hashes = build(a.names.split(",") if a.names else None)
    kind = machine_kind_name()
    if a.print:
        print(json.dumps({"kind": kind, "machine": machine_kind(), "sha256": hashes}))
        return 0
    table = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    if a.write:
        table.setdefault(kind, {}).update(hashes)
        EXPECTED.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
        print(f"wrote {len(hashes)} hashes for {kind} to {EXPECTED}")
        return 0
    expected = table.get(kind)
    if expected is None:
        raise SystemExit(f"{EXPECTED} has no hashes for this machine kind ({kind}); known: "
                         f"{sorted(table)}. This machine draws its own stand-ins: record them with "
                         "--write")
    bad = {n: (h[:12], expected.get(n, "none")[:12])
           for n, h in hashes.items() if expected.get(n) != h}
    for n, (got, want) in bad.items():
        print(f"DIFFERS {n}: built {got}, committed {want}")
    print(f"{len(hashes) - len(bad)} of {len(hashes)} stand-ins bit-identical to {EXPECTED.name} "
          f"({kind})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
