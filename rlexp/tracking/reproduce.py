"""`rlexp reproduce RUN_DIR [--dry-run] [--config-dir DIR] [--allow-changed-plugins] [-- EXTRA_OVERRIDES...]`:
re-run a run from its manifest and check that it produced the same metrics.

The re-run is `python -m rlexp train <same overrides> hydra.run.dir=<RUN_DIR's parent>/reproduce/<name>-<time>`
(plus `--config-name` when the original used one, and `--config-dir` when the user passes it: a manifest never
picks a config folder), started from this folder (the original working directory only with `--trust-plugins`),
which is not put on the module path (`-P`).
A manifest is data someone else may have written: its overrides pass `rlexp.config.overrides.check_overrides`
(schema keys only; no Hydra callbacks, `_target_` or resolvers; no value that names code, a place on this
machine or a network endpoint, judged by the schema's `rlexp.config.trust` declarations) before anything runs.
A run's own code and configs (`plugins`, `config_path`: rlexp.core.plugins) run again only with `--trust-plugins`
and only as recorded: every folder and plug-in source must hash as it did, else the re-run is refused
(`--allow-changed-plugins`: warned).
A sweep job's re-run goes beside the sweep instead, `<SWEEP>.reproduce/<job>-<time>`: never inside
the tree that `rlexp compare SWEEP` reads, where it would count as one more seed (its manifest's
`reproduction_of` makes compare leave it out of any folder anyway).
Exit codes: 0 identical metrics, 1 first differing step/metric printed, 2 the re-run itself failed or could
not be built (a refused override, or one redacted as a secret: pass it again after `--`).

Bitwise identity holds only on a machine that computes the same way: the manifest records what decides it
(`system.numerics`: CPU model and instruction-set flags, BLAS backend, kernel level and threads, GPU model,
driver, CUDA, cuDNN). Before the re-run starts, every difference from this machine is printed. After it,
besides the bitwise verdict (first diverging step and metric), `curve_agreement` says whether the headline
curves agree within a stated tolerance (`CURVE_TOLERANCE` on a `CURVE_WINDOW`-step moving average of
`reward/mean`, and on every `eval/accuracy` point): on another CPU a run that is not bitwise identical is still
a reproduction when its curves agree.

`compare_metrics(a, b)` is the reusable check (also used by the resume test): metrics.jsonl files compared
line by line, exactly (NaN equals NaN), ignoring timing keys: `time/*`, and keys containing `throughput`,
`_per_s` or an `eta` word (`eta`, `train/eta_s`; not `beta`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlexp.config.overrides import RUN_DIR_KEYS, OverrideError, check_config_name, check_overrides, refusals
from rlexp.config.paths import CONF_DIR
from rlexp.config.trust import IMPORT_PATH, Trust
from rlexp.core.plugins import OLD_TRUST_SPELLING, recorded_changes, recorded_code, recorded_folders

from .base import METRICS_FILE
from .manifest import REPRODUCTION_ENV, Manifest, ManifestError, read_manifest
from .metrics_file import read_metrics
from .redact import REDACTED
from .runs import load_run_dir
from .system import git_info, numerics_differences, numerics_info

_ETA = re.compile(r"(^|[/_.\-])eta($|[/_.\-])")
CURVE_METRICS = ("reward/mean", "eval/accuracy")
CURVE_TOLERANCE = 0.05  # absolute: 6 of 126 held-out problems, or a 0.05 shift of the mean reward in [0, 1]
CURVE_WINDOW = 10  # steps of the moving average a training curve is compared on (eval points: one by one)


def is_operational_key(key: str) -> bool:
    """Timings (`time/*`, and `perf/*` built from them), and the services' request accounting (`service/*`),
    describe the processes that ran, not the experiment: a resumed run or one that recovered from a dead replica
    counts other requests by design."""
    return (key.startswith(("time/", "perf/", "service/")) or "throughput" in key or "_per_s" in key
            or bool(_ETA.search(key)))


@dataclass
class MetricDiff:
    line: int  # 1-based line number in the files
    step: Any
    metric: str
    a: Any
    b: Any

    def __str__(self) -> str:
        return (f"first difference at line {self.line}, step {self.step}, metric {self.metric!r}: "
                f"{self.a!r} != {self.b!r}")


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


def _rows(path: Path) -> list[dict[str, Any]]:
    return read_metrics(path)  # a crash-cut last line is skipped with a warning; damage elsewhere is an error


def first_difference(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> MetricDiff | None:
    """Structured form of `compare_metrics`; `metric` is "<missing line>" when one file is shorter."""
    ra, rb = _rows(Path(a)), _rows(Path(b))
    for i, (x, y) in enumerate(zip(ra, rb), start=1):
        if not _same(x.get("step"), y.get("step")):
            return MetricDiff(i, x.get("step"), "step", x.get("step"), y.get("step"))
        for k in sorted(set(x) | set(y), key=lambda s: (s != "step", s)):
            if k == "step" or is_operational_key(k):
                continue
            if not _same(x.get(k, "<absent>"), y.get(k, "<absent>")):
                return MetricDiff(i, x.get("step"), k, x.get(k, "<absent>"), y.get(k, "<absent>"))
    if len(ra) != len(rb):
        i = min(len(ra), len(rb))
        longer = ra if len(ra) > len(rb) else rb
        return MetricDiff(i + 1, longer[i].get("step"), "<missing line>", len(ra), len(rb))
    return None


def compare_metrics(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> str | None:
    """None when the two metrics.jsonl files agree on every non-timing value, else a one-line description of
    the first step and metric that differ, or of a step that either file logs twice (a run restarted or
    resumed into its own folder without dropping the rows after its checkpoint: two equal files of that kind
    must not pass as a match)."""
    for path in (a, b):
        if (dup := duplicate_step(path)) is not None:
            return dup
    d = first_difference(a, b)
    return None if d is None else str(d)


def duplicate_step(path: str | os.PathLike[str]) -> str | None:
    """A one-line description of the first step `path` (a metrics.jsonl) logs twice, else None: a step lower
    than one already logged (a second history appended), or a step whose rows both carry a metric. Several
    rows of one step with different metrics (a loop logging its evaluation apart) are one step's."""
    newest, first_row, seen = None, {}, {}
    for line, row in enumerate(_rows(Path(path)), start=1):
        step = row.get("step")
        if not isinstance(step, int | float) or isinstance(step, bool):
            continue  # not a step at all: `first_difference` reports it
        keys = {k for k in row if k != "step" and not is_operational_key(k)}
        if newest is not None and step < newest:
            return (f"{path}: row {line} goes back to step {step} after step {newest}: a second history was "
                    f"appended to the run's own (restarted or resumed in the same folder), so it is not one run's")
        if step == newest and keys & seen[step]:
            return (f"{path}: step {step} is logged twice (rows {first_row[step]} and {line} both carry "
                    f"{sorted(keys & seen[step])[0]!r}), so the file is not one run's history")
        if step != newest:
            newest, first_row[step], seen[step] = step, line, set()
        seen[step] |= keys
    return None


def _moving_average(ys: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def curve_agreement(a: str | os.PathLike[str], b: str | os.PathLike[str], metrics: Sequence[str] = CURVE_METRICS,
                    window: int = CURVE_WINDOW) -> dict[str, float]:
    """{metric: largest absolute difference} between two runs (metrics.jsonl files or run folders) over their
    steps: a moving average for training metrics, every point for `eval/*` (evaluations are sparse and already
    averages). A metric neither run logged is left out; one logged by one run only, or at other steps, counts
    as infinitely far."""
    ra, rb = (load_run_dir(Path(x).parent if Path(x).is_file() else Path(x)) for x in (a, b))  # files or folders
    out: dict[str, float] = {}
    for m in metrics:
        sa, sb = dict(zip(*ra.series(m))), dict(zip(*rb.series(m)))
        if not sa and not sb:
            continue
        steps = sorted(set(sa) & set(sb))
        if not steps or set(sa) != set(sb):
            out[m] = math.inf
            continue
        ya, yb = [sa[s] for s in steps], [sb[s] for s in steps]
        if not m.startswith("eval/"):
            ya, yb = _moving_average(ya, window), _moving_average(yb, window)
        out[m] = max(abs(x - y) for x, y in zip(ya, yb))
    return out


def machine_differences(manifest: Manifest) -> list[str]:
    """What differs, between the run's machine and this one, in what decides bitwise identity."""
    recorded = manifest.numerics
    if recorded is None:
        return []
    return numerics_differences(recorded, numerics_info(torch_probe=bool(recorded.get("torch"))))


# --------------------------------------------------------------------------------------------- command
def _quote_value(v: str) -> str:
    return v if re.fullmatch(r"[\w/.\-+:]+", v) else "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _override_key(o: str) -> str:
    return o.split("=", 1)[0].lstrip("~+")


def build_command(manifest: Manifest, new_dir: Path, extra: Sequence[str] = (),
                  config_dir: Path | None = None, source: str = "manifest.json", trusted: bool = False) -> list[str]:
    """The train command that re-creates the run. Raises ValueError when a needed value was redacted, and
    `OverrideError` when the manifest asks for anything but plain data in rlexp's own config keys
    (`rlexp.config.overrides.check_overrides`: no code, no place on this machine, no network endpoint; code only
    when `trusted`, and then only the recorded plug-ins) or for a config folder the user did not give
    (`config_dir`): configs there can run code, so only the user may choose it. `extra` is the user's own and not
    checked; a recorded override of a key the user gives is dropped before the check (the user chose it).
    The field types were checked when the manifest was read (`rlexp.tracking.manifest.read_manifest`)."""
    hyd = manifest.hydra
    user_dirs = user_config_dirs(manifest, source)
    conf_dirs = [CONF_DIR, *([config_dir] if config_dir else []), *user_dirs]
    if hyd.config_dir and config_dir is None:
        raise OverrideError(f"{source}: the run loaded configs from its own folder (--config-dir "
                            f"{hyd.config_dir}); YAML there can run code, so rlexp reproduce will not take it "
                            f"from a manifest. Check that folder, then pass it yourself: rlexp reproduce RUN_DIR "
                            f"--config-dir {hyd.config_dir}")
    name = hyd.config_name
    if name:
        check_config_name(name, conf_dirs, f"{source} hydra.config_name")
    extra_keys = {_override_key(e) for e in extra}
    if not isinstance(manifest.overrides, list):
        raise OverrideError(f"{source} overrides: must be a list of strings, got {type(manifest.overrides).__name__}")
    mine = [o for o in manifest.overrides if not (isinstance(o, str) and _override_key(o) in extra_keys)]
    recorded = check_overrides(mine, f"{source} overrides", conf_dirs, allow_code=trusted)
    check_user_code(recorded, user_dirs, manifest, source)
    overrides = [o for o in recorded if _override_key(o) not in RUN_DIR_KEYS]
    overrides += by_name_plugins(manifest)
    overrides += derived_pins(manifest, {_override_key(o) for o in overrides})
    overrides = [o for o in overrides if _override_key(o) not in extra_keys] + list(extra)
    redacted = [o for o in overrides if REDACTED in o]
    if redacted:
        raise ValueError(f"overrides were redacted as secrets, pass them again after `--`: {redacted}")
    # -P: the working directory is not put on the module path, so no file there is imported as code.
    cmd = [sys.executable, "-P", "-m", "rlexp", "train"]
    if config_dir:
        cmd += ["--config-dir", str(config_dir)]
    if name:
        cmd += ["--config-name", name]
    return [*cmd, *overrides, f"hydra.run.dir={_quote_value(str(new_dir))}"]


# Values `prepare` derives from the machine when the run left them unset; the thread count decides float
# reductions, so a re-run elsewhere must use the recorded one to be bitwise comparable.
DERIVED = ("cluster.threads_per_proc",)


def derived_pins(manifest: Manifest, given: set[str]) -> list[str]:
    """Overrides fixing each derived value to what the run recorded, unless the run set it itself."""
    pins = []
    for key in DERIVED:
        node: Any = manifest.config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if key not in given and isinstance(node, int) and not isinstance(node, bool):
            pins.append(f"{key}={node}")
    return pins


def by_name_plugins(manifest: Manifest) -> list[str]:
    """A `plugins=[...]` override for the modules whose registered names the run used without listing them in its
    `plugins` (a wrapper script imported them before calling rlexp): the re-run imports them itself. Empty when
    there are none."""
    listed = list(manifest.config.get("plugins") or [])
    recorded = {str(p.get("module")) for p in manifest.extra.get("plugins") or [] if isinstance(p, dict)}
    extra = [str(p["module"]) for p in manifest.extra.get("plugins") or []
             if isinstance(p, dict) and p.get("by_name") is True and p.get("module") not in listed]
    bad = [m for m in [*map(str, listed), *extra] if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", m)]
    if bad:
        raise OverrideError(f"manifest plugins: {bad} are not module names")
    unrecorded = sorted({str(m) for m in listed} - recorded) if extra else []
    if unrecorded:
        raise OverrideError(f"manifest plugins: {unrecorded} are listed in its config but not recorded with a hash; "
                            f"pass them yourself after `--` if you trust them")
    return [f"plugins=[{','.join([*map(str, listed), *extra])}]"] if extra else []


def user_config_dirs(manifest: Manifest, source: str) -> list[Path]:
    """The run's own config folders (`config_path`), as recorded with their hashes; `recorded_changes` says
    whether they are still there and unchanged."""
    dirs = manifest.extra.get("config_path") or []
    if not isinstance(dirs, list) or not all(isinstance(d, dict) and isinstance(d.get("path"), str) for d in dirs):
        raise OverrideError(f"{source}: config_path must be a list of {{path, sha256}}, got {dirs!r}")
    return [Path(d["path"]) for d in dirs]


def check_user_code(overrides: Sequence[str], user_dirs: Sequence[Path], manifest: Manifest,
                    source: str) -> None:
    """With `--trust-plugins`, code a recorded override names must still be what the manifest recorded with a
    hash: an import path `package.module:Class` only from a recorded plug-in's package, a `config_path=` or
    `plugins=` only the recorded folders and modules, never one slipped in unrecorded. Values are judged as Hydra
    parses them (`'pkg:Cls'` quoted is the same import path)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    modules = {p.get("module") for p in manifest.extra.get("plugins") or [] if isinstance(p, dict)}
    known = {"config_path": {str(d) for d in user_dirs}, "plugins": modules}
    packages = {str(m).split(".")[0] for m in modules if m}
    parser = OverridesParser.create()
    for o in overrides:
        key = _override_key(o)
        if key.startswith(("hydra.", "hydra/")) or "/" in key or ("." not in key and key not in known):
            continue  # Hydra's run-folder keys and group options: checked by check_overrides
        parsed = parser.parse_override(o)
        if parsed.is_delete():
            continue
        value = parsed.value()
        if key in known:
            names = {str(v) for v in (value if isinstance(value, list) else [value])}
            if not names <= known[key]:
                raise OverrideError(f"{source}: refusing override {o!r}: {sorted(names - known[key])} not recorded "
                                    f"in the manifest's {key} (with a hash); pass it yourself after `--`")
            continue
        for k, kind, v in refusals(key.split("."), value):
            path = IMPORT_PATH.match(v) if isinstance(v, str) and kind == Trust.CODE else None
            if path and v.split(":")[0].strip().split(".")[0] not in packages:
                raise OverrideError(f"{source}: refusing override {o!r}: {k} names code to import ({v.strip()}) "
                                    f"from a package the manifest did not record as a plug-in (with a hash); pass "
                                    f"it yourself after `--` if you trust it")


def child_env(manifest: Manifest | None = None, reproduction_of: Path | None = None
              ) -> dict[str, str]:
    """This process's environment, with the folder this rlexp is imported from first on PYTHONPATH: `-P` drops
    the working directory, which may have been how the original run found rlexp. The folders that held the run's
    plug-ins (recorded with their hashes, checked before this) come last, so a module a wrapper script imported
    from its own folder is found again. `reproduction_of`: the run re-created, which the re-run's
    manifest records (`REPRODUCTION_ENV`), so `rlexp compare` never counts the re-run as a seed."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    if reproduction_of is not None:
        env[REPRODUCTION_ENV] = str(reproduction_of.resolve())
    folders = recorded_folders(manifest.extra.get("plugins")) if manifest is not None else []
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []), *folders])
    return env


def sweep_root(run_dir: Path) -> Path | None:
    """The sweep folder holding `run_dir` (the nearest folder above it with Hydra's
    `multirun.yaml`), or None."""
    for d in run_dir.resolve().parents:
        if (d / "multirun.yaml").is_file():
            return d
    return None


def reproduce_dir(run_dir: Path) -> Path:
    """Where the re-run writes: beside a plain run (`<parent>/reproduce/`), beside a sweep for one
    of its jobs (`<sweep>.reproduce/`, the job's path inside the sweep as its name), so
    `rlexp compare <sweep>` never reads it."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run = run_dir.resolve()
    sweep = sweep_root(run)
    if sweep is None:
        base = run.parent / "reproduce" / f"{run.name}-{stamp}"
    else:
        job = run.relative_to(sweep).as_posix().replace("/", "_")
        base = sweep.with_name(f"{sweep.name}.reproduce") / f"{job}-{stamp}"
    new, i = base, 1
    while new.exists():  # two reproductions within a second must not share a folder
        new, i = base.with_name(f"{base.name}-{i}"), i + 1
    return new


def _warn_code_drift(manifest: Manifest) -> None:
    old = manifest.git
    if not old.repo:
        return
    now = git_info(Path(old.repo), None)
    if now.get("commit") != old.commit or now.get("dirty") or old.dirty:
        print(f"warning: code differs from the run (run: {old.commit} dirty={old.dirty}; "
              f"now: {now.get('commit')} dirty={now.get('dirty')}); see git.diff in the run folder", file=sys.stderr)


def parser() -> argparse.ArgumentParser:
    """`rlexp reproduce`'s command line (apart from `main`, long enough with what it checks)."""
    ap = argparse.ArgumentParser(
        prog="rlexp reproduce", description="Re-run a run from its manifest and diff metrics.",
        epilog="exit codes: 0 identical metrics, 1 metrics differ (first difference printed), "
               "2 the re-run failed or could not be built")
    ap.add_argument("run_dir", type=Path,
                    help="a finished run folder (holds manifest.json and metrics.jsonl)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the manifest (the trust gate included), print the command, run "
                         "nothing")
    ap.add_argument("--config-dir", type=Path, default=None,
                    help="the config folder the run used (its manifest names it; never taken from "
                         "the manifest)")
    ap.add_argument("--trust-plugins", action="store_true",
                    help="run the plug-in modules, class paths and config folders the manifest "
                         "records (they run as your code: pass it only for a run folder whose "
                         "author you trust; the old spelling trust_plugins=true still works, "
                         "with a note). Places and endpoints are never taken from a manifest: "
                         "give them after `--`")
    ap.add_argument("--allow-changed-plugins", action="store_true",
                    help="re-run even when a plug-in's source or a config folder changed since the "
                         "run (warns)")
    ap.add_argument("extra", nargs="*",
                    help="overrides appended after `--` (replace same-key ones)")
    return ap


def verdict(run_dir: Path, new_dir: Path, differs: bool) -> int:
    """The re-run's metrics against the run's: 0 bit for bit, else 1 with the first difference
    and whether the curves agree within tolerance (`differs`: this machine is not the run's, said
    again); 2 when the re-run wrote no metrics."""
    a, b = run_dir / METRICS_FILE, new_dir / METRICS_FILE
    if not b.exists():
        print(f"rlexp reproduce: the re-run wrote no {b}", file=sys.stderr)
        return 2
    diff = compare_metrics(a, b)
    if diff is None:
        print(f"reproduced bit for bit: {b} matches {a} (timing keys ignored)")
        return 0
    print(f"NOT reproduced bit for bit ({new_dir}): {diff}")
    agree = curve_agreement(a, b)
    ok = bool(agree) and all(v <= CURVE_TOLERANCE for v in agree.values())
    detail = ", ".join(f"{m} max |diff| {v:.4f}" for m, v in agree.items())
    print(f"curves {'agree' if ok else 'do NOT agree'} within tolerance {CURVE_TOLERANCE} "
          f"({CURVE_WINDOW}-step moving average for training metrics, every point for eval): "
          f"{detail}" + (" (this machine differs from the run's, see above)" if differs else ""))
    return 1


def main(argv: list[str] | None = None, runner: Callable[..., int] | None = None) -> int:
    """`runner(cmd, cwd=...) -> returncode` is injectable so the command logic is testable without training."""
    args = parser().parse_args(argv)
    if any(e.lower() in ("trust_plugins=true", "+trust_plugins=true") for e in args.extra):  # `rlexp eval`'s spelling
        args.trust_plugins = True
        print(OLD_TRUST_SPELLING, file=sys.stderr)
        args.extra = [e for e in args.extra if e.lower() not in ("trust_plugins=true", "+trust_plugins=true")]
    run_dir: Path = args.run_dir
    try:
        manifest = read_manifest(run_dir)
    except (OSError, ValueError) as e:
        print(f"rlexp reproduce: {e if isinstance(e, ManifestError) else f'cannot read {run_dir}/manifest.json: {e}'}",
              file=sys.stderr)
        return 2
    code = recorded_code(manifest.extra.get("plugins"), manifest.extra.get("config_path"))
    if code and not args.trust_plugins:
        print("rlexp reproduce: this run used code of its own, which a re-run would import and run as yours:\n  - "
              + "\n  - ".join(code) + "\nnothing was run. If you trust who wrote this run folder, pass "
              "--trust-plugins", file=sys.stderr)
        return 2
    new_dir = reproduce_dir(run_dir)
    try:
        cmd = build_command(manifest, new_dir, args.extra, args.config_dir, source=f"{run_dir}/manifest.json",
                            trusted=args.trust_plugins)
    except ValueError as e:
        print(f"rlexp reproduce: {e}", file=sys.stderr)
        return 2
    for p in manifest.extra.get("plugins") or []:
        print(f"plug-in {p.get('module')}: {p.get('file')} (sha256 {str(p.get('sha256'))[:12]}, version "
              f"{p.get('version')}, git {p.get('git_commit')})", flush=True)
    for d in manifest.extra.get("config_path") or []:
        print(f"config folder {d.get('path')} (sha256 {str(d.get('sha256'))[:12]})", flush=True)
    changed = recorded_changes(manifest.extra.get("plugins"), manifest.extra.get("config_path"))
    if changed and not args.allow_changed_plugins:
        print("rlexp reproduce: the run's own code or configs changed, so this would not be the same run:\n  - "
              + "\n  - ".join(changed) + "\nrestore them (see git_commit above), or pass --allow-changed-plugins",
              file=sys.stderr)
        return 2
    for c in changed:
        print(f"warning: {c} (--allow-changed-plugins)", file=sys.stderr)
    # The run's working folder, from the manifest, only with --trust-plugins: a plug-in run found its modules there.
    # Otherwise the re-run starts here (with `-P`), and no folder the manifest names is searched for code.
    cwd = manifest.hydra.runtime_cwd if args.trust_plugins else None
    cwd = cwd if cwd and Path(cwd).is_absolute() and Path(cwd).is_dir() else None
    print("+", " ".join(cmd), flush=True)
    differs = machine_differences(manifest)
    if differs:
        print("this machine differs from the run's in what decides bitwise identity, so expect curves that agree "
              "within tolerance rather than identical metrics:\n  - " + "\n  - ".join(differs), flush=True)
    elif manifest.numerics:
        print("this machine matches the run's in what decides bitwise identity (CPU, flags, BLAS, threads, GPU)",
              flush=True)
    if args.dry_run:
        return 0
    _warn_code_drift(manifest)
    env = child_env(manifest if args.trust_plugins else None, reproduction_of=run_dir)
    run = runner or (lambda c, cwd=None: subprocess.run(c, cwd=cwd, env=env).returncode)
    rc = run(cmd, cwd=cwd)
    if rc != 0:
        print(f"rlexp reproduce: the re-run failed with exit code {rc} ({new_dir})", file=sys.stderr)
        return 2
    return verdict(run_dir, new_dir, bool(differs))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
