"""Sharded load/save with real FSDP2 on 2 CPU ranks (gloo): what the trainer does with DTensor params.

HF checkpoint -> `load_hf_into_sharded_titan` (each rank keeps its Shard(0) slice, TorchTitan's fused
QKV merged from DTensors) -> forward equals the unsharded model -> `titan_full_hf_state_dict`
(all-gather) gives back the checkpoint bit for bit. Tied and untied embeddings.
"""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, d: str, port: int) -> None:
    sys.path[:0] = [str(ROOT), str(HERE)]
    import test_models_hf as T
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from rlexp.config.model import ModelConfig
    from rlexp.models import hf
    from rlexp.models.titan import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        for tie in (False, True):
            cfg = ModelConfig(arch=T._arch(tie), dtype="float32")
            model = build_model(cfg)
            for block in model.layers.values():
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            hf.load_hf_into_sharded_titan(model, Path(d) / f"src{int(tie)}", cfg)
            with torch.no_grad():
                logits = model(torch.arange(24).view(2, 12) % cfg.arch.vocab_size)
            logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
            sd = hf.titan_full_hf_state_dict(model, cfg)
            if rank == 0:
                torch.save({"sd": sd, "logits": logits.clone()}, Path(d) / f"out{int(tie)}.pt")
    finally:
        dist.destroy_process_group()


def test_fsdp2_two_ranks_load_forward_gather_bit_exact(tmp_path):
    sys.path.insert(0, str(HERE))
    import test_models_hf as T

    from rlexp.config.model import ModelConfig
    from rlexp.models import hf
    from rlexp.models.titan import build_model

    for tie in (False, True):
        T.write_checkpoint(tmp_path / f"src{int(tie)}", T._arch(tie), seed=3)
    mp.start_processes(_worker, args=(2, str(tmp_path), _free_port()), nprocs=2, start_method="spawn", join=True)
    for tie in (False, True):
        got = torch.load(tmp_path / f"out{int(tie)}.pt")
        src = hf.read_hf_state_dict(tmp_path / f"src{int(tie)}")
        assert sorted(got["sd"]) == sorted(src)
        assert all(torch.equal(got["sd"][k], src[k]) for k in src)
        cfg = ModelConfig(arch=T._arch(tie), dtype="float32")
        ref = build_model(cfg)
        hf.load_hf_into_titan(ref, tmp_path / f"src{int(tie)}", cfg)
        with torch.no_grad():
            want = ref(torch.arange(24).view(2, 12) % cfg.arch.vocab_size)
        torch.testing.assert_close(got["logits"], want, atol=1e-5, rtol=1e-5)
