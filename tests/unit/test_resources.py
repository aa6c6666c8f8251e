"""The shipped files: one copy each, at the top of the repository, reached through the package."""
from pathlib import Path

import pytest

from condor_sched import resources

REPO = Path(__file__).resolve().parents[2]


def test_package_data_are_the_repositorys_top_level_files_in_a_checkout():
    assert resources.profiles_dir() == REPO / "examples" / "profiles"
    assert resources.default_inventory_path() == REPO / "examples" / "pools" / "default.yaml"
    assert resources.default_snapshot_dir() == REPO / "examples" / "snapshots" / "default"
    assert resources.node_hooks_dir() == REPO / "node_hooks"
    assert resources.config_d_dir() == REPO / "config.d"


def test_every_shipped_directory_holds_its_files():
    assert len(list(resources.profiles_dir().glob("*.yaml"))) == 12
    assert {p.name for p in resources.default_snapshot_dir().iterdir()} >= {"queue.json", "machines.json"}
    assert (resources.node_hooks_dir() / "discover_devices.py").is_file()
    assert (resources.config_d_dir() / "50-cosched-sidecar.conf").is_file()


def test_a_missing_resource_is_named():
    with pytest.raises(resources.ResourceMissing, match="nothing-here"):
        resources.data_path("examples", "nothing-here")
