"""The wheel installs anywhere: built from a copy of the checkout, installed with its
dependencies into a fresh virtualenv, and run from a directory outside the checkout.

Marked ``wheel`` (``-m "not wheel"`` leaves it out): it needs PyPI, or pip's cache, for the
build backend and the dependencies.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parents[2]
#: Top-level entries of a working tree that a fresh clone has not: the venv, build output, caches.
NOT_IN_A_CLONE = {".git", ".venv", "build", "dist", ".pytest_cache", ".hypothesis", "var"}
SNIPPETS = ["10-cosched-schedd.conf", "20-cosched-startd.conf", "30-cosched-execute.conf", "50-cosched-sidecar.conf"]


@dataclass(frozen=True, slots=True)
class InstalledWheel:
    wheel: Path
    venv: Path
    outside: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``args`` with the venv first on PATH, from a directory outside the checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        result = subprocess.run(args, cwd=self.outside, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        return result

    def condor_sched(self, *args: str) -> str:
        return self.run(str(self.venv / "bin" / "condor-sched"), *args).stdout


def _ignore_build_state(directory: str, names: list[str]) -> set[str]:
    top = Path(directory).resolve() == REPO
    return {n for n in names if n == "__pycache__" or n.endswith(".egg-info") or (top and n in NOT_IN_A_CLONE)}


def _pip(python: Path | str, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True, timeout=900)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """Build the wheel from a copy of the working tree (links kept, as git keeps them), and
    install it into a new venv that sees neither the checkout nor its venv."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=_ignore_build_state)
    _pip(sys.executable, "wheel", str(source), "--no-deps", "-w", str(base / "dist"))
    (wheel,) = (base / "dist").glob("condor_sched-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _pip(venv / "bin" / "python", "install", str(wheel))
    outside = base / "elsewhere"
    outside.mkdir()
    return InstalledWheel(wheel, venv, outside)


def test_the_wheel_holds_the_data_files_and_executable_hooks(installed: InstalledWheel):
    with zipfile.ZipFile(installed.wheel) as wheel:
        members = {info.filename: info for info in wheel.infolist()}
    data = "condor_sched/data/"
    assert sum(n.startswith(data + "examples/profiles/") and n.endswith(".yaml") for n in members) == 12
    for name in ("examples/pools/default.yaml", "examples/snapshots/default/queue.json",
                 "examples/snapshots/default/machines.json", "node_hooks/discover_devices.py",
                 "examples/interference/kvm-epyc-2vcpu.json", *(f"config.d/{s}" for s in SNIPPETS)):
        assert data + name in members
    assert "condor_sched/interference/kernels.c" in members   # the measured programs' source
    assert members[data + "node_hooks/cosched_prepare_job.py"].external_attr >> 16 & stat.S_IXUSR
    # The node package ships twice: as node programs' files, and as the package the planner imports.
    assert data + "node_hooks/cosched_node/agent.py" in members and "cosched_node/rules.py" in members
    assert not [n for n in members if "__pycache__" in n or n.endswith(".pyc")]


def test_the_installed_package_and_its_data_come_from_the_venv(installed: InstalledWheel):
    out = installed.run(str(installed.venv / "bin" / "python"), "-c",
                        "import condor_sched, condor_sched.resources as r; "
                        "print(condor_sched.__file__); print(r.node_hooks_dir()); print(r.profiles_dir())").stdout
    for path in out.split():
        assert Path(path).is_relative_to(installed.venv), path


def test_plan_and_show_read_the_bundled_snapshot(installed: InstalledWheel):
    assert "policy lp-pack: 16 placed, 24 unplaced" in installed.condor_sched("plan")
    assert installed.condor_sched("show").startswith("40 idle jobs (40 co-scheduled)")


def test_simulate_finds_the_bundled_profiles_and_runs_both_models(installed: InstalledWheel):
    sns = json.loads(installed.condor_sched("simulate", "--workload", "sns-random", "--jobs", "4", "--nodes", "4",
                                            "--policy", "sns", "--json"))
    assert sns["jobs"] == 4 and sns["makespan_s"] > 0 and sns["alpha_violations"] == 0
    phi = json.loads(installed.condor_sched("simulate", "--workload", "phi-table1", "--jobs", "20", "--nodes", "2",
                                            "--policy", "knapsack", "--json"))
    assert phi["jobs"] == 20 and phi["makespan_s"] > 0 and phi["memory_oversubscriptions"] == 0


def test_install_node_and_config_hand_out_the_shipped_files(installed: InstalledWheel):
    target = installed.outside / "libexec" / "condor_sched"
    out = installed.condor_sched("install-node", str(target))
    hooks = sorted(str(p.relative_to(target)) for p in target.rglob("*.py"))
    assert "cosched_prepare_job.py" in hooks and "cosched_node/rules.py" in hooks and out.count("wrote") == len(hooks)
    assert all(os.access(target / name, os.X_OK) for name in hooks)
    assert installed.condor_sched("config", "--list").split() == SNIPPETS
    sidecar = installed.condor_sched("config", "50-cosched-sidecar.conf")
    assert "COSCHED_POLICY" in sidecar
    # The snippets name this install's paths: the sidecar command exists and runs, and
    # install-node's default directory is the execute snippet's COSCHED_NODE_HOOKS.
    command = next(line.split(" = ", 1)[1] for line in sidecar.splitlines() if line.startswith("COSCHED_SIDECAR = "))
    assert subprocess.run([command, "--help"], capture_output=True, timeout=120).returncode == 0, command
    execute = installed.condor_sched("config", "30-cosched-execute.conf")
    hooks_dir = next(line.split(" = ", 1)[1] for line in execute.splitlines() if line.startswith("COSCHED_NODE_HOOKS = "))
    # The condor_q print format of the reasons lies under the prefix, where docs/users.md says.
    assert "CoSchedPinReason" in (installed.venv / "share" / "condor_sched" / "cosched.cpf").read_text()
    default = installed.condor_sched("install-node")
    assert f"wrote     {hooks_dir}/cosched_prepare_job.py" in default
