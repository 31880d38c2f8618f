"""What Slurm says about one job, from `squeue --json`, in either layout rlexp meets:

* Slurm 22.05 (Debian 12's): `squeue --json` ignores `--job` and lists every job in the queue,
  `job_state` is a string, the nodes are `job_resources.allocated_nodes[].nodename` (and `nodes` a
  hostlist string);
* newer Slurm (what Monarch 0.7 reads): `job_state` a list, the nodes
  `job_resources.nodes.allocation[].name`.

The job is always matched by its id, never taken as `jobs[0]`: another job in the queue (a sweep's
own array jobs) must not be mistaken for the run's."""

from __future__ import annotations

import json
import subprocess
from typing import Any

TERMINAL = frozenset(
    {
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
        "COMPLETED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def find_job(data: dict[str, Any], job_id: str) -> dict[str, Any] | None:
    """The record of `job_id` in `squeue --json` output, whichever jobs else it lists."""
    return next((j for j in data.get("jobs", []) if str(j.get("job_id")) == str(job_id)), None)


def states(job: dict[str, Any]) -> list[str]:
    """`job_state` as a list: a string in 22.05 ("RUNNING"), a list in newer Slurm (["RUNNING"])."""
    s = job.get("job_state", [])
    return [s] if isinstance(s, str) else [str(x) for x in s]


def ended(job_states: list[str]) -> bool:
    return any(s in TERMINAL for s in job_states)


def node_names(job: dict[str, Any]) -> list[str]:
    """The job's nodes in allocation order (the order of SLURM_NODEID), from either layout."""
    res = job.get("job_resources") or {}
    nodes = res.get("nodes")
    if isinstance(nodes, dict):  # newer Slurm
        return [n["name"] for n in nodes.get("allocation", [])]
    allocated = res.get("allocated_nodes")
    if isinstance(allocated, list) and allocated:  # 22.05
        return [n["nodename"] for n in allocated]
    hostlist = nodes if isinstance(nodes, str) else job.get("nodes")
    return expand_hostlist(hostlist) if isinstance(hostlist, str) and hostlist else []


def reason(job: dict[str, Any]) -> str:
    """Slurm's reason for the job's state ("Resources", "PartitionTimeLimit"...), "" for none."""
    r = job.get("state_reason") or ""
    return "" if r == "None" else str(r)


def nodes_asked(job: dict[str, Any]) -> int:
    n = job.get("node_count")
    if isinstance(n, dict):  # newer Slurm: {"set": true, "number": 2}
        n = n.get("number")
    return int(n) if isinstance(n, int) else 0


def expand_hostlist(hostlist: str) -> list[str]:
    """`n[1-2]` -> [n1, n2], through Slurm's own `scontrol show hostnames`."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, timeout=30
    )
    return out.stdout.split() if out.returncode == 0 else [hostlist]


def query(job_id: str) -> dict[str, Any] | None:
    """`job_id`'s squeue record; None once the queue no longer lists it. RuntimeError when squeue
    fails."""
    out = subprocess.run(
        ["squeue", "--jobs", str(job_id), "--json"], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return None
        raise RuntimeError(f"squeue --jobs {job_id} --json failed: {out.stderr.strip()[-500:]}")
    try:
        return find_job(json.loads(out.stdout or "{}"), job_id)
    except json.JSONDecodeError as e:
        raise RuntimeError(
            f"squeue --json gave no JSON ({e}); this Slurm is older than 20.02?"
        ) from None


def node_hostnames(names: list[str]) -> list[str]:
    """Each node's NodeHostname (what its worker binds), which is its name on most clusters but
    not for nodes
    emulated on one host (Slurm's multiple-slurmd); the name itself where sinfo does not say."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N %n"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    known = dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)
    return [known.get(n, n) for n in names]


def partition_nodes(partition: str) -> str:
    """`debug: 1 node (1 idle)`: the partition's nodes by state, for a pending job's message."""
    out = subprocess.run(
        ["sinfo", "-h", "-p", partition, "-o", "%D %T"], capture_output=True, text=True, timeout=30
    )
    counts = [line.split() for line in out.stdout.splitlines() if len(line.split()) == 2]
    if out.returncode != 0 or not counts:
        return f"{partition}: no nodes listed by sinfo"
    total = sum(int(n) for n, _ in counts)
    by_state = ", ".join(f"{n} {s}" for n, s in counts)
    return f"{partition}: {total} node{'s' if total != 1 else ''} ({by_state})"


def describe_pending(job: dict[str, Any]) -> str:
    """`pending (Resources): 2 nodes asked, partition debug: 1 node (1 idle)`."""
    why = reason(job) or "no reason given"
    part = str(job.get("partition") or "")
    have = partition_nodes(part) if part else "partition unknown"
    return f"pending ({why}): {nodes_asked(job)} node(s) asked; partition {have}"
