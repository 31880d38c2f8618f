"""A tracker of a user's own, outside the rlexp package: every metric whose name starts with
`prefix`, as rows `step,name,value` of `<run dir>/metrics.csv`, the way one would forward them to an
in-house dashboard.

One module and one YAML (conf/logger/csv.yaml, which names the class by import path,
`csv_tracker:CsvTracker`); registering a name (`@register_tracker`) also lets a module listed in
`plugins` offer it as `name: csv`. A tracker runs in the controller only; it receives what the
built-in trackers receive, after the JSONL file has it."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlexp.tracking.base import Tracker, register_tracker
from rlexp.tracking.manifest import Manifest


@dataclass
class CsvOptions:
    # Only metrics whose name starts with this ("" = every metric).
    prefix: str = ""


@register_tracker("csv")
class CsvTracker(Tracker):
    Options = CsvOptions

    def __init__(self, options: CsvOptions) -> None:
        self.options = options
        self.path: Path | None = None
        self.status: str | None = None

    def start(self, cfg: Mapping[str, Any], run_dir: Path, manifest: Manifest) -> None:
        self.path = Path(run_dir) / "metrics.csv"
        if not self.path.exists():  # a resumed run appends
            self.path.write_text("step,name,value\n")

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.path is None:
            return
        with self.path.open("a", newline="") as f:
            w = csv.writer(f)
            for name, value in sorted(metrics.items()):
                if name.startswith(self.options.prefix):
                    w.writerow([step, name, repr(float(value))])

    def finish(self, status: str) -> None:
        self.status = status
