"""Generator replicas resized between steps, from a number written into the run folder.

Why a module of its own: resizing is a control loop over a running graph (read the file, add or
retire replicas at a step boundary), not part of spawning it; the launcher only checks it between
steps.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from rlexp.tracking import runlog

if TYPE_CHECKING:
    from rlexp.run.launcher import Graph


class Elastic:
    """Generator replicas resized between steps: write a number to `<run dir>/generator_replicas`
    and the run adds replicas (new processes, given the current weights first) or retires the newest
    ones, with a logged reason, at the next step boundary. Samples do not change: they depend on
    `generator.shards`, not on the replicas serving them."""

    FILE = "generator_replicas"

    def __init__(self, graph: Graph, run_dir: Path) -> None:
        self.graph, self.path = graph, run_dir / self.FILE
        self._refused: str | None = None  # the last unusable content, announced once

    def check(self) -> None:
        try:
            text = self.path.read_text().strip()
        except (FileNotFoundError, UnicodeDecodeError):
            return
        if not text.isdigit() or len(text) > 6:  # a count of replicas, nothing else
            if text != self._refused:
                runlog.announce(f"[rlexp] {self.path}: {text[:40]!r} is not a number of replicas; "
                                f"ignored")
                self._refused = text
            return
        want = int(text)
        svc = self.graph.services.generators if self.graph.services else None
        if svc is None or self.graph.add_generator is None:
            return
        if want < 1:
            runlog.announce(f"[rlexp] {self.path}: {want} replicas would stop generation; keeping "
                            f"{len(svc)}")
            return
        while len(svc) < want:
            self.graph.add_generator()
        while len(svc) > want:
            i = svc.healthy()[-1]
            svc.retire(i, f"scaled down to {want} ({self.path})")
            with contextlib.suppress(Exception):
                self.graph.mesh(f"generator{i}").stop().get(timeout=30)
