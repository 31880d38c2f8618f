"""A multirun ends with its answer: Hydra's `on_multirun_end` runs `rlexp compare` over the sweep folder.

Why a Hydra callback: it runs once, in the process that launched the sweep, after every job has finished,
whichever launcher ran them (in-process, subprocesses, Slurm); no job knows it is the last one. It prints
the ranked configurations and the winner sentence, writes `summary.md`, `compare.csv`, `runs.csv` and the
PNGs into the sweep folder, and puts the winner sentence on the sweep's MLflow parent run (its description,
`mlflow.note.content`) when the jobs logged to MLflow. A summary that cannot be made (no job wrote a run
folder) is one line; it never changes the sweep's outcome, which the jobs' own folders already hold.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .cells import md_text

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.md"


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        summarise(Path(str(config.hydra.sweep.dir)))


def summarise(sweep_dir: Path) -> dict[str, Any] | None:
    """Compare the sweep's run folders into the sweep folder; None (and one printed line) when there are none."""
    from .compare import compare

    try:
        res = compare([str(sweep_dir)], sweep_dir, report=SUMMARY_FILE)
    except ValueError as e:
        print(f"rlexp: no sweep summary: {e}", flush=True)
        return None
    print(f"\n== sweep summary ({sweep_dir / SUMMARY_FILE}) ==\n{res['markdown']}\n", flush=True)
    note_mlflow_parent(res)
    return res


def note_mlflow_parent(res: dict[str, Any]) -> None:
    """The winner sentence as the MLflow parent run's description, after the sweep's own note."""
    refs = {(m.get("parent_run_id"), m.get("tracking_uri")) for r in res["runs"]
            if (m := ((r.manifest.get("trackers") or {}).get("mlflow") or {})).get("parent_run_id")}
    if len(refs) != 1:
        return
    (parent, uri), = refs
    child = next((m for r in res["runs"] if (m := (r.manifest.get("trackers") or {}).get("mlflow") or {}).get("url")
                  and m.get("run_id")), None)
    if child:  # the child's link (it opens the UI on runs, rlexp.tracking.mlflow_tracker.UI_VIEW), for the parent
        print(f"MLflow sweep run: {child['url'].replace(child['run_id'], parent)}", flush=True)
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        note = client.get_run(parent).data.tags.get("mlflow.note.content", "")
        client.set_tag(parent, "mlflow.note.content",
                       md_text(res["verdict"].sentence) + ("\n\n" + note if note else ""))
        if res["verdict"].best is not None:
            client.set_tag(parent, "rlexp.winner", res["verdict"].best.label)
    except Exception as e:  # the store may be remote and gone by now: the summary files are already written
        log.warning("MLflow parent run %s: winner not noted: %s", parent, e)
