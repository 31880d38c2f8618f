"""Where a run's processes go: the Monarch job and its hosts (`hosts`), the job kinds (`registry`, one module each
under `jobs/`), GPUs per role and host (`layout`) and the per-GPU memory plan (`planner`).

Importing the package registers the built-in job kinds, so any module of it finds them in the registry."""
from rlexp.cluster.jobs import kubernetes, local, process, slurm  # noqa: F401  (registers the built-in kinds)
