"""Reproducibility tracking: run manifest, metrics trackers (JSONL always; W&B, MLflow optional),
`rlexp compare` and `rlexp reproduce`. See base.py for the launcher-facing API."""
from typing import Any

from .base import JsonlTracker, Tracker, Trackers
from .files import fingerprint_examples, hash_files
from .manifest import finish_manifest, write_start_manifest
from .registry import build_trackers

__all__ = [
    "JsonlTracker", "Tracker", "Trackers", "build_trackers", "compare_metrics", "fingerprint_examples",
    "finish_manifest", "hash_files", "write_start_manifest",
]


def __getattr__(name: str) -> Any:
    # Lazy: importing reproduce here eagerly would make `python -m rlexp.tracking.reproduce` warn.
    if name == "compare_metrics":
        from .reproduce import compare_metrics

        return compare_metrics
    raise AttributeError(name)
