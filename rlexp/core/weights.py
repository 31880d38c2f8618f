"""Weights on disk and in memory, in Hugging Face naming: the one home of safetensors I/O.

Both sides of a weight sync need it: `rlexp.models` loads and saves checkpoints, `rlexp.transport` moves
versions between the trainer and the generators. Keeping it here, below both, is what lets neither import
the other (the `models <-> transport` package cycle this module replaced). Standard library, torch and
safetensors only.
"""
from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

# re-exported: the torch-free part (checks before torch loads use it)
from rlexp.core.weight_files import (
    IGNORED_SUFFIXES,
    INDEX_FILE,
    CheckpointError,
    weight_files,
)

SHM = Path("/dev/shm")


def read_hf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in weight_files(Path(path)):
        sd.update(load_file(str(f)))
    return {k: v for k, v in sd.items() if not k.endswith(IGNORED_SUFFIXES)}


ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def read_hf_state_dict_into(path: str | Path, dest: dict[str, torch.Tensor]) -> set[str]:
    """Read a checkpoint folder straight into existing tensors (e.g. a generator's parameters).

    Why not `load_file` + `copy_`: safetensors memory-maps the file and every new mapping is faulted
    in page by page; `preadv` into the destination's own (already faulted) pages costs about one
    memcpy (measured 1-5x faster than load + copy on a 2-core VM, see studies/perf/results/bench_cpu.md).
    Tensors that are not CPU/contiguous or whose dtype differs from the file's fall back to load + copy (which casts).
    Returns the keys written; raises KeyError for file keys `dest` lacks.
    """
    import struct

    from safetensors import safe_open

    done: set[str] = set()
    for f in weight_files(Path(path)):
        with open(f, "rb", buffering=0) as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            base = 8 + n
            slow = []
            for k, meta in header.items():
                if k == "__metadata__" or k.endswith(IGNORED_SUFFIXES):
                    continue
                t = dest[k]
                s, e = meta["data_offsets"]
                if (t.device.type != "cpu" or not t.is_contiguous() or ST_DTYPES.get(meta["dtype"]) != t.dtype
                        or list(t.shape) != meta["shape"]):
                    slow.append(k)
                    continue
                mv = memoryview(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else memoryview(b"")
                got = 0
                while got < e - s:
                    r = os.preadv(fh.fileno(), [mv[got:]], base + s + got)
                    if r <= 0:
                        raise CheckpointError(f"{f}: truncated while reading key {k!r}")
                    got += r
                done.add(k)
        if slow:
            with safe_open(str(f), framework="pt") as st:
                for k in slow:
                    with torch.no_grad():
                        dest[k].copy_(st.get_tensor(k))
                    done.add(k)
    return done




def write_hf_state_dict(sd: dict[str, torch.Tensor], out_dir: Path, *, max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Write safetensors (sharded with an index past `max_shard_bytes`, like the Hub's checkpoints)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(sd):
        nbytes = sd[k].numel() * sd[k].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = sd[k]
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    for name, shard in zip(names, shards):
        save_file(shard, str(out_dir / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return [*names, INDEX_FILE]


ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


class TransportError(RuntimeError):
    """Weights cannot be moved or used as asked (a transport that cannot work in this layout, torn or mismatched
    weights); raised at start when it can be, before spawning."""


WeightSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def spec_of(sd: dict[str, torch.Tensor]) -> WeightSpec:
    return {k: (tuple(v.shape), v.dtype) for k, v in sd.items()}


def check_weights(version: int, got: WeightSpec, own: WeightSpec, *, where: str, check_dtype: bool = True) -> None:
    """Refuse, before anything is loaded, weights that do not fit the generator's own parameters: a
    wrong model (names), a wrong size (shapes) or a wrong precision (dtypes; vLLM casts on load, so its
    backend skips that one)."""
    missing, unexpected = sorted(set(own) - set(got)), sorted(set(got) - set(own))
    shapes = [f"{k}: {got[k][0]} != own {own[k][0]}" for k in sorted(set(got) & set(own)) if got[k][0] != own[k][0]]
    dtypes = [f"{k}: {got[k][1]} != own {own[k][1]}" for k in sorted(set(got) & set(own))
              if check_dtype and got[k][1] != own[k][1]]
    if missing or unexpected or shapes or dtypes:
        raise TransportError(
            f"generator: version {version} from {where} does not match this generator's model: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}, shape {shapes[:3]}, dtype {dtypes[:3]} "
            f"({len(missing)}/{len(unexpected)}/{len(shapes)}/{len(dtypes)}); the trainer and generators must load "
            f"the same `model=` (and model.dtype); nothing was loaded")


def checkpoint_spec(model_dir: str | Path) -> WeightSpec:
    """Names, shapes and dtypes of an HF checkpoint's tensors, from the safetensors headers (nothing loaded)."""
    from safetensors import safe_open

    spec: WeightSpec = {}
    for f in weight_files(Path(model_dir)):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():  # noqa: SIM118 - safe_open is not iterable
                if not k.endswith(IGNORED_SUFFIXES):
                    sl = fh.get_slice(k)
                    spec[k] = (tuple(sl.get_shape()), ST_DTYPES.get(sl.get_dtype(), torch.uint8))
    return spec


def staging_root() -> Path:
    """/dev/shm when the host has one (Linux), else the temp dir (still correct, slower): where weights that
    must become files on this host (shm versions, vLLM's reload folders) are written."""
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())


def check_safe(path: Path) -> None:
    """Refuse a file that is not a `torch.save` archive of tensors and plain values, without loading its
    tensors (cheap even for a large trainer state, so resume checks it before spawning anything)."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError) as e:
        raise CheckpointError(f"refusing to load {path}: it is not a checkpoint written by torch.save ({e}); "
                          f"resume from a folder rlexp wrote, or start again with resume=never") from None
    if unsafe:
        shown = ", ".join(unsafe[:5]) + (", ..." if len(unsafe) > 5 else "")
        raise CheckpointError(
            f"refusing to load {path}: it references Python objects ({shown}), not only tensors and plain values, "
            f"and loading it could run code. rlexp's checkpoints hold tensors and plain values only; if an older "
            f"rlexp wrote this one (its controller.pt held dataclasses), resume it with that version (its git "
            f"commit is in the run's manifest.json), or start again with resume=never")


def safe_load(path: Path) -> Any:
    """`torch.load` of tensors and plain values only: nothing in the file can run code."""
    check_safe(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # check_safe passed, so this is a damaged file
        raise CheckpointError(f"refusing to load {path}: {str(e).splitlines()[0]}") from None
