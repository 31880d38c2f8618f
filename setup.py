"""What pyproject.toml cannot say: the wheel's `rlexp/conf` is the repository's top-level `conf/`.

rlexp has one config home, `conf/` at the top of the repository (config groups, train.yaml,
eval.yaml, sweeps/, launchers/), where a reader of the design card looks for it. An installed rlexp
must ship and search it, so the wheel maps it into the package as `rlexp.conf` (each folder a
data-only package, so setuptools copies its files); `rlexp.config.paths.config_root` finds it there,
or beside the package in a checkout.
"""
from pathlib import Path

from setuptools import find_namespace_packages, setup

CONF = Path(__file__).resolve().parent / "conf"
# presets, their READMEs, the Kubernetes templates (launchers/k8s)
CONF_FILES = ["*.yaml", "*.md", "*.in"]


def conf_packages() -> dict[str, Path]:
    """`rlexp.conf` and one data package per folder under conf/, each with the folder it is built
    from."""
    dirs = [CONF, *sorted(d for d in CONF.rglob("*") if d.is_dir() and d.name != "__pycache__")]
    return {".".join(("rlexp", "conf", *d.relative_to(CONF).parts)): d for d in dirs}


# setuptools runs this file as __main__; tests import it to read conf_packages()
if __name__ == "__main__":
    packages = conf_packages()
    setup(
        packages=[
            *find_namespace_packages(include=["rlexp", "rlexp.*"], exclude=["*.__pycache__"]),
            *packages,
        ],
        package_dir={"rlexp.conf": "conf"},
        package_data={**dict.fromkeys(packages, CONF_FILES), "rlexp": ["assets/*"]},
    )
