"""The files condor_sched ships besides its code, found through ``importlib.resources``.

They live once, at the top of the repository: ``examples/`` (profiles, the default node
inventory, the bundled snapshot), ``node_hooks/`` and ``config.d/``. The package directory
``condor_sched/data/`` holds symbolic links to them, so a checkout or an editable install
reads the repository's files, and building a wheel copies the files the links point at
into ``condor_sched/data/`` of the wheel (``package_data`` in setup.cfg). Every caller
finds them here, whichever way the package is installed.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


class ResourceMissing(FileNotFoundError):
    """A shipped file is not where the package expects it (a broken install)."""


def data_path(*parts: str) -> Path:
    """The real path of ``condor_sched/data/<parts>``, links resolved.

    Callers need a directory on disk (the local pool bind-mounts the node hooks), so a
    package that is not installed as plain files is refused rather than extracted.
    """
    resource = files("condor_sched").joinpath("data", *parts)
    if not isinstance(resource, Path):
        raise ResourceMissing(f"condor_sched/data/{'/'.join(parts)}: the package is not installed as "
                              "plain files (zipped?); reinstall it with pip")
    if not resource.exists():
        raise ResourceMissing(f"{resource}: missing from the installed package; reinstall it, or in a "
                              "checkout restore the links of condor_sched/data/ (git checkout condor_sched/data)")
    return resource.resolve()


def profiles_dir() -> Path:
    """The Spread-n-Share profiles of paper 000's 12 programs (``examples/profiles``)."""
    return data_path("examples", "profiles")


def default_inventory_path() -> Path:
    """The node inventory of the local pool (``examples/pools/default.yaml``)."""
    return data_path("examples", "pools", "default.yaml")


def default_snapshot_dir() -> Path:
    """The bundled snapshot of the local pool (``examples/snapshots/default``)."""
    return data_path("examples", "snapshots", "default")


def node_hooks_dir() -> Path:
    """The execute-node programs (``node_hooks/``)."""
    return data_path("node_hooks")


def config_d_dir() -> Path:
    """The HTCondor config snippets an admin drops in (``config.d/``)."""
    return data_path("config.d")


def source_checkout() -> Path:
    """The source checkout this package runs from (the directory with ``setup.cfg`` above
    ``condor_sched/``): the local pool's chroot runs its sidecar from it."""
    root = Path(files("condor_sched")).resolve().parent  # type: ignore[arg-type]
    if not (root / "setup.cfg").is_file():
        raise ResourceMissing(f"{root} is not a source checkout of condor_sched: the local pool "
                              "(condor-sched pool up) runs from a clone, e.g. pip install -e .")
    return root
