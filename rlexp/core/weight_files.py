"""Which files hold a checkpoint's weights, and the error for a checkpoint that cannot be used.

Standard library only: `rlexp train` checks a model's files before torch loads
(`rlexp.models.hf_files`), and the safetensors I/O in `rlexp.core.weights`, which needs torch,
re-exports these names.
"""
from __future__ import annotations

import json
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"
# HF keys that may be present but carry no weights we load.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message lists every problem found."""


def weight_files(path: Path) -> list[Path]:
    """Safetensors files of a checkpoint: those named by the index when there is one, else all.

    The index is data from whoever wrote the checkpoint: a name that is not a plain file name of
    this folder (`../x`, `/abs`) is refused, so it cannot choose what is read."""
    index = path / INDEX_FILE
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({type(e).__name__}: {e}); "
                                  f"expected {{\"weight_map\": {{key: file name}}}}") from None
        bad = [n for n in names if not isinstance(n, str) or Path(n).name != n or n in (".", "..")]
        if bad:
            raise CheckpointError(
                f"{index}: weight_map names {bad[:3]}, which are not file names in {path}; "
                "every shard must be a file of the checkpoint's own folder")
        return [path / n for n in names]
    return sorted(path.glob("*.safetensors"))
