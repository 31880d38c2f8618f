"""A tiny actor beside each role's actor: where its process runs, for the placement printout, `placement.json`
(which process to look at, or to kill in a chaos test) and a trainer rendezvous on another host."""
from __future__ import annotations

import os
import socket

from monarch.actor import Actor, endpoint


def free_port(host: str = "") -> int:
    """A TCP port free now on `host`'s address ("": every address of this machine)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Probe(Actor):
    @endpoint
    def where(self) -> dict[str, str | int]:
        # HYPERACTOR_PROCESS_NAME is the job's name for the host ("generator_1"), set on its worker process.
        return {"pid": os.getpid(), "hostname": socket.gethostname(),
                "host": os.environ.get("HYPERACTOR_PROCESS_NAME", "").split("@")[-1].strip()}

    @endpoint
    def free_port(self) -> int:
        """A free TCP port on this process's host (the trainer's rendezvous when rank 0 is elsewhere)."""
        return free_port()
