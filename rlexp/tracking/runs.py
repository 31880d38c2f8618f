"""Read finished (or running) runs back from any place rlexp logs to, into one `RunRecord` shape.

Sources, so `rlexp compare` works whichever tracker a team used:
- a run folder (`manifest.json` + `metrics.jsonl` + `.hydra/config.yaml`) or any folder containing run folders
  (a multirun sweep dir, a runs root);
- `mlflow:EXPERIMENT` (tracking URI from `--tracking-uri` / MLFLOW_TRACKING_URI); sweep parent runs are skipped;
- `wandb:DIR` (W&B offline run folders `offline-run-*/run-*.wandb` under DIR), read directly from the
  transaction log because offline runs have no API to query and wandb >= 0.2x dropped its Python reader.

Every source gives the same record for the same run: the name from the manifest's identity (the run's
overrides, `reward=rule,seed=0`), one history row per step (rows logged at the same step are merged, later
values winning, as W&B and MLflow store them), and `_wall_s` = the row's own `time/wall_s`: the one clock the
trackers stamp on every row. System metrics (`system/*`, W&B stats) are not history rows.
"""
from __future__ import annotations

import datetime as _dt
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .base import METRICS_FILE
from .manifest import MANIFEST_NAME, Manifest, read_manifest
from .metric_rows import check_row, duplicate_steps, loads_bounded, ranges, read_rows
from .redact import redact
from .runconfig import RUN_LOCAL_ANY_KEYS, RUN_LOCAL_TOP_KEYS

# Config keys that vary between runs without making them different configurations: runs that differ only
# here are repeats (`rlexp compare` averages them, W&B groups them).
NUISANCE_KEYS = ("seed",)


@dataclass
class RunRecord:
    name: str
    source: str
    config: dict[str, Any]  # flat "a.b.c" -> value, run-local keys removed
    history: list[dict[str, Any]]  # rows with "step", metrics, and "_wall_s" (seconds since run start)
    status: str | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    # What was wrong with the files read (`FILE:LINE: what; what was done`, rlexp.tracking.metric_rows).
    problems: list[str] = field(default_factory=list)

    def series(self, metric: str, x: str = "step") -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for r in self.history:
            v = r.get(metric)
            xv = r.get("step" if x == "step" else "_wall_s")
            if v is not None and xv is not None:
                xs.append(float(xv))
                ys.append(float(v))
        return xs, ys

    def metric_names(self) -> list[str]:
        names = dict.fromkeys(k for r in self.history for k in r if k != "step" and not k.startswith(("_", "time/")))
        return list(names)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, Mapping):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping) and v:
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out


def strip_run_local(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Config differences that only say *where* a run lived are noise in a comparison."""
    out = {}
    for k, v in flat.items():
        parts = k.split(".")
        if parts[0] in RUN_LOCAL_TOP_KEYS or parts[0] == "rlexp_meta" or any(p in RUN_LOCAL_ANY_KEYS for p in parts):
            continue
        out[k] = v
    return out


def _parse_time(s: str | None) -> float | None:
    if not s:
        return None
    try:
        return _dt.datetime.fromisoformat(s).timestamp()
    except ValueError:
        return None


def merge_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step, in order of first appearance; a later value of a key at the same step wins."""
    merged: dict[Any, dict[str, Any]] = {}
    for r in rows:
        merged.setdefault(r.get("step"), {}).update(r)
    return list(merged.values())


def _add_wall(history: list[dict[str, Any]], t0: float | None) -> None:
    """`_wall_s`: the row's own `time/wall_s`; only rows of runs older than that clock fall back to timestamps
    relative to the start."""
    stamps = [r["time/unix_s"] for r in history if isinstance(r.get("time/unix_s"), (int, float))]
    base = t0 if t0 is not None else (min(stamps) if stamps else None)
    for r in history:
        if isinstance(r.get("time/wall_s"), (int, float)):
            r["_wall_s"] = float(r["time/wall_s"])
        elif base is not None and isinstance(r.get("time/unix_s"), (int, float)):
            r["_wall_s"] = float(r["time/unix_s"]) - base


# --------------------------------------------------------------------------------------------- run folders
def is_run_dir(p: Path) -> bool:
    return (p / METRICS_FILE).is_file() or (p / MANIFEST_NAME).is_file()


MAX_SIDE_FILE_BYTES = 64 << 20  # a manifest (config, git diff) or Hydra config larger than this is no run's


def _read_manifest(p: Path, problems: list[str]) -> tuple[Manifest, bool]:
    """The manifest, or an empty one and a problem: unreadable or mistyped, the metrics still say a lot."""
    path = p / MANIFEST_NAME
    if not path.is_file():
        return Manifest(), False
    try:
        if path.stat().st_size > MAX_SIDE_FILE_BYTES:
            raise ValueError(f"{path.stat().st_size} bytes, over the limit of {MAX_SIDE_FILE_BYTES}")
        loads_bounded(path.read_text(encoding="utf-8"), max_depth=64)  # depth first: no RecursionError below
        return read_manifest(p), True
    except (OSError, ValueError, TypeError) as e:
        problems.append(f"{path}: unreadable ({str(e).splitlines()[0][:200]}); run read without it")
        return Manifest(), False


def _hydra_config(p: Path, problems: list[str]) -> Any:
    """Hydra's copy of the config, unresolved: resolving a folder's file would run its resolvers
    (`${oc.env:AWS_SECRET_ACCESS_KEY}` would put your secret in the comparison's files)."""
    path = p / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    try:
        if path.stat().st_size > MAX_SIDE_FILE_BYTES:
            raise ValueError(f"{path.stat().st_size} bytes, over the limit of {MAX_SIDE_FILE_BYTES}")
        return redact(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
    except Exception as e:  # YAML of any shape: one line, never a traceback
        problems.append(f"{path}: unreadable ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__}); "
                        "run read without its config")
        return {}


def history_of(rows: list[dict[str, Any]], where: str, problems: list[str]) -> list[dict[str, Any]]:
    """Checked rows -> one row per step; a step logged twice is named (the later rows win)."""
    dups = duplicate_steps(rows)
    if dups:
        problems.append(f"{where}: steps {ranges(dups)} are logged more than once (a run restarted or resumed "
                        "without truncating its metrics); the later rows are used")
    return merge_steps(rows)


def load_run_dir(run_dir: str | os.PathLike[str], name: str | None = None) -> RunRecord:
    p = Path(run_dir)
    problems: list[str] = []
    manifest, found = _read_manifest(p, problems)
    config: Any = manifest.config or _hydra_config(p, problems)  # the manifest's: resolved, redacted at start
    history = history_of(read_rows(p / METRICS_FILE, problems), str(p / METRICS_FILE), problems)
    _add_wall(history, _parse_time(manifest.start_time))
    return RunRecord(
        name=manifest.identity.run_name or name or p.name, source=str(p), config=strip_run_local(flatten(config)),
        history=history,
        status=manifest.status, manifest=manifest.to_dict() if found else {}, problems=problems,
    )


def find_run_dirs(root: Path, max_depth: int = 4) -> list[Path]:
    """Run folders under `root` (a sweep dir holds job dirs 0, 1, ...), in natural order."""
    if is_run_dir(root):
        return [root]
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        for c in sorted((c for c in d.iterdir() if c.is_dir() and not c.name.startswith((".", "wandb", "mlruns"))),
                        key=_natural):
            if is_run_dir(c):
                found.append(c)
            elif depth < max_depth:
                walk(c, depth + 1)

    if root.is_dir():
        walk(root, 1)
    return found


def _natural(p: Path) -> tuple[Any, ...]:
    return (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name)


# --------------------------------------------------------------------------------------------- MLflow
def _param_value(s: str) -> Any:
    try:
        return loads_bounded(s)
    except (ValueError, TypeError):
        return s


def _checked(rows: list[dict[str, Any]], where: str, problems: list[str]) -> list[dict[str, Any]]:
    """A tracker's history rows with the checks of a metrics.jsonl row (rlexp.tracking.metric_rows.check_row):
    values that are not finite numbers dropped, rows without a usable step skipped, each named."""
    out = []
    for r in rows:
        row, bad = check_row(r)
        problems += [f"{where} step {_short(r.get('step'))}: {b}" for b in bad]
        if row is not None:
            out.append(row)
    return out


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:40] + "..."


def load_mlflow(experiment: str, tracking_uri: str | None) -> list[RunRecord]:
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError("mlflow:EXPERIMENT needs --tracking-uri or MLFLOW_TRACKING_URI")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"no MLflow experiment {experiment!r} in {uri}")
    out = []
    for run in client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"], max_results=10000):
        if run.data.tags.get("rlexp.role") == "parent":
            continue
        t0 = run.info.start_time / 1000.0 if run.info.start_time else None
        rows: dict[int, dict[str, Any]] = {}
        for key in run.data.metrics:
            if key.startswith("system/"):  # MLflow's sampler, on a step counter of its own
                continue
            for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp)):
                row = rows.setdefault(m.step, {"step": m.step})
                row[key] = max(row.get(key, m.value), m.value) if key == "time/wall_s" else m.value
                if t0 is not None:
                    row["_ts_wall_s"] = max(row.get("_ts_wall_s", 0.0), m.timestamp / 1000.0 - t0)
        source = f"mlflow:{experiment}/{run.info.run_id}"
        problems: list[str] = []
        history = _checked([rows[s] for s in sorted(rows)], source, problems)
        for r in history:
            ts_wall = r.pop("_ts_wall_s", None)
            r["_wall_s"] = r["time/wall_s"] if isinstance(r.get("time/wall_s"), (int, float)) else ts_wall
            if r["_wall_s"] is None:
                del r["_wall_s"]
        config = {k: _param_value(v) for k, v in run.data.params.items() if not k.startswith("seed.")}
        status = {"FINISHED": "completed", "FAILED": "failed", "KILLED": "interrupted"}.get(run.info.status, "running")
        out.append(RunRecord(
            name=run.data.tags.get("rlexp.run_name") or run.info.run_name or run.info.run_id, source=source,
            config=strip_run_local(config), history=history, status=status,
            manifest={"mlflow": {"run_id": run.info.run_id, "tags": dict(run.data.tags),
                                 "system_metrics": sorted(k for k in run.data.metrics if k.startswith("system/"))}},
            problems=problems,
        ))
    return out


# --------------------------------------------------------------------------------------------- W&B offline
_WB_BLOCK = 32768
_WB_HEADER = 7  # ":W&B" + magic (2 bytes) + version (1 byte)


def wandb_records(path: Path) -> Iterator[bytes]:
    """Records of a `.wandb` file (LevelDB log format: 32 KiB blocks, 7-byte chunk headers)."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, buf = _WB_HEADER, b""
    while pos + 7 <= len(data):
        left = _WB_BLOCK - pos % _WB_BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left - 7
            continue
        chunk = data[pos : pos + length]
        pos += length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk
            buf = b""


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _wandb_parsed(path: Path, problems: list[str]) -> Iterator[Any]:
    """The file's records, parsed; a record that does not parse ends the reading there, named."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    for i, blob in enumerate(wandb_records(path)):
        rec = pb.Record()
        try:
            rec.ParseFromString(blob)
        except (DecodeError, RecursionError, ValueError) as e:
            problems.append(f"{path}: record {i + 1} does not parse ({e or type(e).__name__}); "
                            "the rest of the file is skipped")
            return
        yield rec


def _wb_value(s: str) -> Any:
    """A W&B JSON value (config, summary); None for one that is not JSON or nested too deep."""
    try:
        return loads_bounded(s)
    except ValueError:
        return None


def load_wandb_file(path: Path) -> RunRecord:
    problems: list[str] = []
    config: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    name, status = path.parent.name, None
    meta: dict[str, Any] = {}
    artifacts: list[dict[str, Any]] = []
    stats: set[str] = set()
    summary: dict[str, Any] = {}
    defined: dict[str, dict[str, Any]] = {}
    tables: dict[str, str] = {}  # history key -> the table's JSON file, relative to the run's files/ folder
    for rec in _wandb_parsed(path, problems):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            name = rec.run.display_name or rec.run.run_id or name
            meta = {"id": rec.run.run_id, "group": rec.run.run_group, "tags": list(rec.run.tags),
                    "project": rec.run.project, "job_type": rec.run.job_type,
                    "git": {"commit": rec.run.git.commit, "remote_url": rec.run.git.remote_url}}
            for u in rec.run.config.update:
                config[_item_key(u)] = _wb_value(u.value_json)
        elif kind == "config":
            for u in rec.config.update:
                config[_item_key(u)] = _wb_value(u.value_json)
        elif kind == "history":
            row: dict[str, Any] = {}
            media: dict[str, dict[str, Any]] = {}  # a table arrives as one item per field: nested_key [name, field]
            for it in rec.history.item:
                try:
                    v = loads_bounded(it.value_json)
                except ValueError:
                    continue
                if len(it.nested_key) > 1:
                    media.setdefault("/".join(it.nested_key[:-1]), {})[it.nested_key[-1]] = v
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[_item_key(it)] = v
            tables.update({k: str(m["path"]) for k, m in media.items() if m.get("_type") == "table-file"})
            if "_step" in row and any(not k.startswith("_") for k in row):  # not a row of tables only
                row["step"] = row.pop("_step")
                history.append(row)
        elif kind == "stats":
            stats.update(_item_key(it) for it in rec.stats.item)
        elif kind == "artifact":
            artifacts.append({"name": rec.artifact.name, "type": rec.artifact.type,
                              "files": sorted(e.path for e in rec.artifact.manifest.contents)})
        elif kind == "summary":
            for u in rec.summary.update:
                summary[_item_key(u)] = _wb_value(u.value_json)
                if _item_key(u) == "rlexp/status" and isinstance(summary["rlexp/status"], str):
                    status = summary["rlexp/status"]
        elif kind == "metric":
            m = rec.metric
            defined[m.name or m.glob_name] = {"step_metric": m.step_metric, "goal": int(m.goal),
                                              "summary": sorted(f.name for f, v in m.summary.ListFields() if v)}
        elif kind == "exit" and status is None:
            status = "completed" if rec.exit.exit_code == 0 else "failed"
    config.pop("_wandb", None)
    history = history_of(_checked(history, str(path), problems), str(path), problems)
    ts = [r["_timestamp"] for r in history if "_timestamp" in r]
    for r in history:
        if "time/wall_s" in r:
            r["_wall_s"] = r["time/wall_s"]
        elif "_runtime" in r:
            r["_wall_s"] = r["_runtime"]
        elif ts and "_timestamp" in r:
            r["_wall_s"] = r["_timestamp"] - ts[0]
    meta.update(artifacts=artifacts, stats=sorted(stats), summary=summary, defined_metrics=defined, tables=tables)
    return RunRecord(name=name, source=str(path), config=strip_run_local(flatten(config)), history=history,
                     status=status, manifest={"wandb": meta}, problems=problems)


def load_wandb_dir(root: Path) -> list[RunRecord]:
    files = sorted(root.rglob("run-*.wandb"))
    if not files:
        raise ValueError(f"no W&B offline runs (offline-run-*/run-*.wandb) under {root}")
    return [load_wandb_file(f) for f in files]


# --------------------------------------------------------------------------------------------- dispatch
def load_runs(spec: str, tracking_uri: str | None = None) -> list[RunRecord]:
    """One CLI argument -> runs. `mlflow:NAME`, `wandb:DIR`, or a path (run folder / sweep folder / runs root)."""
    if spec.startswith("mlflow:"):
        return load_mlflow(spec[len("mlflow:") :], tracking_uri)
    if spec.startswith("wandb:"):
        return load_wandb_dir(Path(spec[len("wandb:") :]))
    root = Path(spec)
    if not root.exists():
        raise ValueError(f"{spec}: no such run folder")
    dirs = find_run_dirs(root)
    if not dirs:
        raise ValueError(f"{spec}: no run folders (manifest.json / metrics.jsonl) found")
    multi = len(dirs) > 1 or dirs[0] != root
    return [load_run_dir(d, name=(f"{root.name}/{d.relative_to(root).as_posix()}" if multi else d.name)) for d in dirs]
