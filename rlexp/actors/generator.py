"""The generator actor: one Monarch actor per replica, wrapping a backend from `rlexp.models.backends`.

The backends themselves (titan, vllm) and their seeding live in that module, so code that only samples
in-process (`rlexp eval`, `rlexp bench`) does not import Monarch.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from monarch.actor import Actor, endpoint

from rlexp.actors.settings import GeneratorSettings
from rlexp.core.gpu_mask import check_mask
from rlexp.core.plugins import activate_from_env
from rlexp.core.seeding import apply_process_determinism
from rlexp.models.backends import GeneratorBackend, build_backend
from rlexp.models.tokenizer import load_tokenizer
from rlexp.transport import TransportError, TransportSpec, build_receiver
from rlexp.types import Completions


class Generator(Actor):
    """One generator replica. Built lazily in `setup` so replicas start their engines concurrently."""

    def __init__(self, settings: GeneratorSettings, *, weights: TransportSpec | None = None) -> None:
        """`weights`: how this replica receives weights, the transport of its trainer->generator pair (resolved by
        the launcher from the hosts the two run on)."""
        activate_from_env()  # the user's plug-ins, before any name in the config is looked up
        # this replica's GPUs were masked when its process was spawned (before torch)
        check_mask(settings.gpus)
        apply_process_determinism()
        self.settings = settings
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.backend: GeneratorBackend | None = None
        self.weights = weights
        self.receiver = build_receiver(weights) if weights is not None else None

    @endpoint
    async def connect_weights(self, server: Any) -> None:
        """The transport's server actor (`WeightTransport.server`, on the trainer's first process), if it has one."""
        assert self.receiver is not None, "Generator built without a weight transport"
        self.receiver.connect(server)

    @endpoint
    async def setup(self) -> float:
        t = time.perf_counter()
        st = self.settings
        self.backend = build_backend(st.backend, st.model_dir, load_tokenizer(st.model_dir), st.seed, st.model,
                                     **st.options)
        return time.perf_counter() - t

    @endpoint
    async def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                       stop: list[str] | None = None) -> Completions:
        """The reply travels packed as arrays (`rlexp.types.Completions`)."""
        assert self.backend is not None, "Generator.setup() was not awaited"
        t = time.perf_counter()
        out = self.backend.generate(prompt_ids, n, max_tokens, temperature, seed, stop)
        share = (time.perf_counter() - t) / max(1, len(out))
        for c in out:
            c.gen_s = share
        return Completions(out)

    @endpoint
    async def next_token_logprobs(self, prompt_ids: list[list[int]], token_ids: list[int]) -> list[list[float]]:
        """For an LM judge served by the policy (`lm_judge` with `options.policy=true`)."""
        assert self.backend is not None, "Generator.setup() was not awaited"
        return self.backend.next_token_logprobs(prompt_ids, token_ids)

    @endpoint
    async def score(self, prompt_ids: list[list[int]], responses: list[list[int]], temperature: float
                    ) -> tuple[list[list[float]], int] | None:
        """Logprobs of whole multi-turn episodes with this replica's weights, and their version (None when the
        backend cannot: vLLM keeps each turn's own logprobs)."""
        assert self.backend is not None, "Generator.setup() was not awaited"
        score = getattr(self.backend, "score", None)
        return None if score is None else (score(prompt_ids, responses, temperature), self.backend.policy_version)

    @endpoint
    async def update_weights(self, version: int, locations: dict[str, str]) -> float:
        """Load `version` from this replica's own transport: `locations` maps transport -> location (what
        `Trainer.push_weights` returns; every replica gets the same map)."""
        t = time.perf_counter()
        assert self.backend is not None and self.weights is not None and self.receiver is not None
        location = locations.get(self.weights.name)
        if location is None:
            raise TransportError(f"generator: version {version} was published to {sorted(locations)}, not to this "
                                 f"replica's transport {self.weights.name!r}; the trainer must be built with every "
                                 f"transport its generators use")
        await self.receiver.receive(version, location, self.backend)
        return time.perf_counter() - t

    @endpoint
    async def shutdown(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
