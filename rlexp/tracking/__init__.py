"""Reproducibility tracking: run manifest, metrics trackers (JSONL always; W&B, MLflow optional),
`rlexp compare` and `rlexp reproduce`. See base.py for the launcher-facing API."""
from .base import JsonlTracker, Tracker, Trackers
from .files import fingerprint_examples, hash_files
from .manifest import finish_manifest, write_start_manifest
from .registry import build_trackers

__all__ = [
    "JsonlTracker", "Tracker", "Trackers", "build_trackers", "fingerprint_examples",
    "finish_manifest", "hash_files", "write_start_manifest",
]

