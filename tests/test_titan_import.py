"""TorchTitan's model modules imported without torch's Inductor (rlexp/models/titan.py).

TorchTitan's attention module calls `torch.compile` when it is imported; rlexp imports it with those
calls deferred to their first call, which rlexp's SDPA model never makes. These check that an actor
process's import skips Inductor, that `torch.compile` is torch's own again afterwards, and that a
deferred function is compiled, once, by the real `torch.compile` when it is called.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from rlexp.models.titan import _compile_on_first_call

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, torch
real = torch.compile
from rlexp.models.titan import import_titan_models
import_titan_models()
from torchtitan.models.common.attention import FlexAttention
print(json.dumps({"inductor": "torch._inductor.compile_fx" in sys.modules,
                  "restored": torch.compile is real,
                  "flex": FlexAttention._compiled_flex_attn.__name__}))
"""


def test_titan_models_import_without_inductor() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"inductor": False, "restored": True, "flex": "flex_attention"}


def test_deferred_compile_compiles_once_on_first_call() -> None:
    graphs: list[object] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        graphs.append(gm)
        return gm.forward

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2

    def h(x: torch.Tensor) -> torch.Tensor:  # its own code object: dynamo caches per code object
        return torch.cos(x) + 1

    real = torch.compile
    with _compile_on_first_call():
        g = torch.compile(f, backend=backend)
        decorated = torch.compile(backend=backend)(h)  # the decorator form
        module = torch.nn.Linear(2, 2)
        compiled_module = torch.compile(module, backend=backend)
    assert torch.compile is real
    assert g.__name__ == "f" and not graphs  # nothing compiled yet
    x = torch.arange(4.0)
    assert torch.equal(g(x), f(x)) and len(graphs) == 1
    assert torch.equal(g(x + 1), f(x + 1)) and len(graphs) == 1  # same shapes: compiled once
    assert torch.equal(decorated(x), h(x)) and len(graphs) == 2
    assert isinstance(compiled_module, torch.nn.Module)  # a module goes to torch.compile at once
