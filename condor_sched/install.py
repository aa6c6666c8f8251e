"""What a pool admin takes from the package: the node hooks and the config.d snippets.

``install_node_hooks`` copies the execute-node programs into a directory of the admin's
choice; ``config_snippets`` names the HTCondor config files an admin drops into a host's
``config.d/``, and ``config_snippet`` renders one with this install's paths
(:class:`InstallPaths`), so it is copied as it is. Both read the shipped files through
:mod:`condor_sched.resources`.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from condor_sched.resources import ResourceMissing, config_d_dir, node_hooks_dir

#: Every hook file is installed executable (the programs are run directly; the helper
#: modules next to them are harmless so).
HOOK_MODE = 0o755


class InstallConflict(Exception):
    """Files in the target directory that differ from the shipped ones (``--force`` replaces them)."""


class UnknownSnippet(KeyError):
    """A config.d snippet name the package does not ship."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class InstalledFile:
    """One hook file and what installing it did: ``wrote``, ``replaced`` or ``unchanged``."""

    path: Path
    action: str


#: The node programs' package: installed next to them, in a directory of the same name.
NODE_PACKAGE = "cosched_node"


#: Test doubles shipped for the test pools (``fake_nvidia_smi.py``): never installed on a node.
TEST_DOUBLE_PREFIX = "fake_"


def node_hook_files() -> list[Path]:
    """The shipped execute-node programs, then the modules of their package, relative to
    node_hooks/ (``cosched_prepare_job.py``, ``cosched_node/agent.py`` ...); no test double."""
    root = node_hooks_dir()
    found = [p for p in sorted(root.glob("*.py")) if not p.name.startswith(TEST_DOUBLE_PREFIX)] \
        + sorted((root / NODE_PACKAGE).glob("*.py"))
    if not found:
        raise ResourceMissing(f"{root}: no node hook shipped")
    return [p.relative_to(root) for p in found]


def _same_content(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def _copy_replacing(source: Path, destination: Path) -> None:
    """Write through a temporary file and a rename, so a hook that runs meanwhile never
    reads half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(source.read_bytes())
        os.chmod(tmp, HOOK_MODE)
        os.replace(tmp, destination)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_node_hooks(target_dir: Path, force: bool = False) -> list[InstalledFile]:
    """Copy every node hook into ``target_dir`` (created if missing), mode 0755.

    An identical file is left alone (made executable); a different file, or a link, is an
    :class:`InstallConflict` naming all of them before anything is written, unless
    ``force``. A directory in the way is never replaced.
    """
    if target_dir.exists() and not target_dir.is_dir():
        raise InstallConflict(f"{target_dir}: not a directory")
    root = node_hooks_dir()
    actions: list[tuple[Path, Path, str]] = []
    for relative in node_hook_files():
        source, destination = root / relative, target_dir / relative
        if destination.is_dir() and not destination.is_symlink():
            raise InstallConflict(f"{destination}: a directory is in the way")
        if not os.path.lexists(destination):
            actions.append((source, destination, "wrote"))
        elif not destination.is_symlink() and _same_content(source, destination):
            actions.append((source, destination, "unchanged"))
        else:
            actions.append((source, destination, "replaced"))
    conflicts = [str(d) for _, d, action in actions if action == "replaced"]
    if conflicts and not force:
        raise InstallConflict("these files differ from the shipped node hooks (--force replaces them): "
                              + ", ".join(conflicts))
    (target_dir / NODE_PACKAGE).mkdir(parents=True, exist_ok=True)
    for source, destination, action in actions:
        if action == "unchanged":
            os.chmod(destination, HOOK_MODE)
        else:
            _copy_replacing(source, destination)
    return [InstalledFile(destination, action) for _, destination, action in actions]


#: Where, under an install prefix, the sidecar's command and the node programs live.
SIDECAR_IN_PREFIX = Path("bin") / "condor-sched"
NODE_HOOKS_IN_PREFIX = Path("libexec") / "condor_sched"


@dataclass(frozen=True, slots=True)
class InstallPaths:
    """The paths a rendered snippet names: the sidecar's command (``COSCHED_SIDECAR``) and the
    directory of node programs on every execute node (``COSCHED_NODE_HOOKS``)."""

    sidecar: Path
    node_hooks: Path

    @classmethod
    def under(cls, prefix: Path) -> "InstallPaths":
        """The paths of an install under ``prefix`` (a venv's directory, /opt/condor-sched)."""
        return cls(prefix / SIDECAR_IN_PREFIX, prefix / NODE_HOOKS_IN_PREFIX)

    @classmethod
    def running(cls) -> "InstallPaths":
        """This install's: the ``condor-sched`` beside the running Python (a venv's bin/), and
        the node programs under its prefix (where ``install-node`` copies them by default)."""
        return cls(Path(sys.executable).parent / "condor-sched", Path(sys.prefix) / NODE_HOOKS_IN_PREFIX)


#: The knobs that name an install path, and which path each takes.
_PATH_KNOBS = {"COSCHED_SIDECAR": "sidecar", "COSCHED_NODE_HOOKS": "node_hooks"}
_KNOB_LINE = re.compile(r"^(?P<knob>" + "|".join(_PATH_KNOBS) + r")\s*=.*$", re.MULTILINE)


def render_snippet(text: str, paths: InstallPaths) -> str:
    """``text`` with every install-path knob's value set to ``paths``' (other lines as shipped)."""
    return _KNOB_LINE.sub(lambda m: f"{m['knob']} = {getattr(paths, _PATH_KNOBS[m['knob']])}", text)


def config_snippets() -> dict[str, Path]:
    """The shipped config.d snippets, by file name, in the order HTCondor reads them."""
    return {p.name: p for p in sorted(config_d_dir().glob("*.conf"))}


def config_snippet(name: str, paths: InstallPaths | None = None) -> str:
    """The text of the snippet ``name`` (e.g. ``50-cosched-sidecar.conf``) with ``paths``
    (default: this install's) in its path knobs."""
    snippets = config_snippets()
    if name not in snippets:
        raise UnknownSnippet(f"no config snippet {name!r}; the package ships: {', '.join(snippets)}")
    return render_snippet(snippets[name].read_text(), paths or InstallPaths.running())
