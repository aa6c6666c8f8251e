"""Start, stop and inspect the local pool: one master in the cached chroot, one startd per node."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from condor_sched import resources
from condor_sched.inventory import (Inventory, default_inventory_path, load_inventory, node_config, node_slots,
                                    slot_name)
from condor_sched.localpool import chroot, config
from condor_sched.localpool.chroot import PoolError

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/var/cache/condor-sched/pool-root")
DEFAULT_WORKDIR = Path("/var/tmp/condor-sched-work")
#: The config.d snippets the pool installs (the sidecar's own snippet is for its host).
POOL_SNIPPETS = ("10-cosched-schedd.conf", "20-cosched-startd.conf")


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Where the pool lives; ``from_env`` reads COSCHED_POOL_ROOT and COSCHED_POOL_WORKDIR."""

    root: Path = DEFAULT_ROOT
    workdir: Path = DEFAULT_WORKDIR
    user: str = "alice"
    uid: int = 2001
    #: A second submitting user (fair share, several users' jobs), uid + 1.
    second_user: str = "bob"
    admin_user: str = "condor"
    hooks_dir: Path = field(default_factory=resources.node_hooks_dir)
    config_d: Path = field(default_factory=resources.config_d_dir)
    #: The source checkout the chroot's sidecar runs (bind-mounted read-only).
    source_dir: Path = field(default_factory=resources.source_checkout)
    mirror: str | None = None

    @classmethod
    def from_env(cls, **overrides: Any) -> PoolSettings:
        env: dict[str, Any] = {}
        if os.environ.get("COSCHED_POOL_ROOT"):
            env["root"] = Path(os.environ["COSCHED_POOL_ROOT"])
        if os.environ.get("COSCHED_POOL_WORKDIR"):
            env["workdir"] = Path(os.environ["COSCHED_POOL_WORKDIR"])
        env.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**env)

    @property
    def cache_dir(self) -> Path:
        return self.root.parent

    @property
    def client_dir(self) -> Path:
        return self.cache_dir / f"{self.root.name}.client"

    @property
    def state_file(self) -> Path:
        return self.cache_dir / f"{self.root.name}.state.json"

    def in_root(self, inner: Any) -> Path:
        return self.root / str(inner).lstrip("/")


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """What tests and the CLI need from a running pool."""

    root: Path
    workdir: Path
    domain: str
    user: str
    admin_user: str
    client_configs: dict[str, Path]
    nodes: tuple[str, ...]
    slot_names: tuple[str, ...]
    wired_hooks: dict[str, bool] = field(default_factory=dict)


# --- client side ---------------------------------------------------------------------

def client_config_path(user: str, settings: PoolSettings | None = None) -> Path:
    """The CONDOR_CONFIG file claiming ``user`` (written on first use)."""
    settings = settings or PoolSettings.from_env()
    path = settings.client_dir / f"{user}.condor_config"
    text = config.render_client_config(user)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
    return path


def client_env(user: str = "alice", settings: PoolSettings | None = None) -> dict[str, str]:
    """Environment variables for a host client of the pool acting as ``user``.

    Set them in ``os.environ`` and call ``htcondor2.reload_config()``, or pass them to a
    subprocess.
    """
    return {"CONDOR_CONFIG": str(client_config_path(user, settings))}


# --- up ------------------------------------------------------------------------------

def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _hook_files(settings: PoolSettings) -> config.HookFiles:
    exists = {name: (settings.hooks_dir / script).is_file() for name, script in (
        ("startd_cron", config.STARTD_CRON_SCRIPT),
        ("prepare_job", config.PREPARE_JOB_SCRIPT),
        ("node_agent", config.NODE_AGENT_SCRIPT))}
    for name, ok in exists.items():
        if not ok:
            log.warning("node_hooks has no %s script yet; not wiring it", name)
    return config.HookFiles(**exists)


def _config_d(settings: PoolSettings) -> Path:
    return settings.root / "etc/condor/config.d"


def _install_sidecar_config(settings: PoolSettings, enabled: bool) -> None:
    """Install the admin's sidecar snippet and the pool's overrides of it, or remove both."""
    cfg_d = _config_d(settings)
    if enabled:
        shutil.copyfile(settings.config_d / config.SIDECAR_SNIPPET, cfg_d / config.SIDECAR_SNIPPET)
        _write(cfg_d / config.SIDECAR_POOL_SNIPPET, config.render_sidecar_pool_config())
    else:
        for name in (config.SIDECAR_SNIPPET, config.SIDECAR_POOL_SNIPPET):
            (cfg_d / name).unlink(missing_ok=True)


def _install_config(settings: PoolSettings, inventory: Inventory, hooks: config.HookFiles,
                    sidecar: bool) -> None:
    root = settings.root
    cfg_d = _config_d(settings)
    for old in cfg_d.glob("*"):
        if old.name == "00-security" or "cosched" in old.name:
            old.unlink()
    nodes = list(inventory.nodes)
    _write(cfg_d / "05-cosched-pool.conf", config.render_pool_config(nodes, hooks))
    for name in POOL_SNIPPETS:
        shutil.copyfile(settings.config_d / name, cfg_d / name)
    _install_sidecar_config(settings, sidecar)
    host_names = sorted({socket.gethostname(), socket.getfqdn()})
    _write(root / "etc/hosts", config.render_hosts(host_names, [n.name for n in nodes]))
    shutil.rmtree(settings.in_root(config.WRAPPER_DIR), ignore_errors=True)
    shutil.rmtree(settings.in_root(config.NODE_CONFIG_DIR), ignore_errors=True)
    if hooks.prepare_job:
        _write(settings.in_root(config.WRAPPER_DIR / "prepare_job"), config.render_prepare_job_wrapper(), 0o755)
    condor = chroot.in_chroot(root, ["id", "-u", "condor"]).stdout.strip()
    condor_gid = chroot.in_chroot(root, ["id", "-g", "condor"]).stdout.strip()
    for i, node in enumerate(nodes, 1):
        _write(settings.in_root(config.node_config_path(node.name)),
               json.dumps(node_config(node, config.DOMAIN), indent=2) + "\n")
        execute = settings.in_root(config.CONDOR_EXECUTE_DIR / node.name)
        execute.mkdir(parents=True, exist_ok=True)
        os.chown(execute, int(condor), int(condor_gid))
        execute.chmod(0o755)
        settings.in_root(config.AGENT_STATE_DIR / node.name).mkdir(parents=True, exist_ok=True)
        # Readings are per ClusterId.ProcId, and a new pool numbers clusters from 1 again: a
        # reading left by an earlier pool's job would stop this pool's job of that id.
        probes = settings.in_root(config.probe_dir(node.name))
        shutil.rmtree(probes, ignore_errors=True)
        probes.mkdir(parents=True, exist_ok=True)
        settings.in_root(config.PROFILE_RUNS_DIR).mkdir(parents=True, exist_ok=True)
        daemons = config.render_node_daemons(node, i, hooks)
        discover = [config.PYTHON, str(config.HOOKS_DIR / config.DISCOVER_SCRIPT),
                    "--node-config", str(config.node_config_path(node.name)), "--local-name", config.local_name(i)]
        if node.gpus:
            _install_fake_gpus(settings, node.name)
            discover += ["--nvidia-smi", str(config.nvidia_smi_wrapper_path(node.name))]
        slots = chroot.in_chroot(root, discover).stdout
        _write(cfg_d / f"30-cosched-node-{node.name}.conf", daemons + "\n" + slots)


def _install_fake_gpus(settings: PoolSettings, node: str) -> None:
    """A GPU node's fake nvidia-smi (test pools only: no GPU on this machine) and the
    job-writable directory where test jobs declare their GPU memory
    (``config.fake_gpu_apps_dir``), emptied: pids of an earlier pool mean nothing now."""
    _write(settings.in_root(config.nvidia_smi_wrapper_path(node)), config.render_nvidia_smi_wrapper(node), 0o755)
    apps = settings.in_root(config.fake_gpu_apps_dir(node))
    shutil.rmtree(apps, ignore_errors=True)
    apps.mkdir(parents=True, exist_ok=True)
    apps.chmod(0o1777)


def _expected_slots(inventory: Inventory) -> list[str]:
    """Every partitionable slot's name; a GPU node has one, slot 1."""
    names = []
    for n in inventory.nodes:
        slots = [s.name for s in node_slots(n, config.DOMAIN)]
        names += slots if slots or not n.gpus else [slot_name(1, n.name, config.DOMAIN)]
    return names


def _wait_for_pool(settings: PoolSettings, expected: list[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        out = chroot.in_chroot(settings.root, ["condor_status", "-af", "Name"], check=False, timeout_s=30)
        seen = sorted(out.stdout.split()) if out.returncode == 0 else []
        sched = chroot.in_chroot(settings.root, ["condor_status", "-schedd", "-af", "Name"],
                                 check=False, timeout_s=30)
        if sorted(expected) == seen and sched.returncode == 0 and sched.stdout.strip():
            return
        time.sleep(1)
    raise PoolError(f"pool did not come up within {timeout_s} s: expected slots {sorted(expected)}, "
                    f"saw {seen}; see {settings.root}/var/log/condor/")


def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise PoolError(f"pool {action} needs root (the pool is a chroot with mounts and processes "
                        "of other users); run it with sudo")


def build(settings: PoolSettings | None = None) -> Path:
    """Build the cached chroot unless it is already complete, and the sidecar's venv in it
    unless it is current (a cache built before the venv step gets it); return its path."""
    settings = settings or PoolSettings.from_env()
    if not chroot.is_built(settings.root):
        chroot.build_root(settings.root, settings.user, settings.uid, settings.mirror)
    banner = chroot.in_chroot(settings.root, ["condor_version"]).stdout
    requirements = config.sidecar_requirements((settings.source_dir / "setup.cfg").read_text(),
                                               config.condor_version_of(banner))
    # condor_sched from the source, and the node package it imports the request rules from.
    chroot.ensure_venv(settings.root, str(config.SIDECAR_VENV), requirements,
                       [str(config.SOURCE_DIR), str(config.HOOKS_DIR)],
                       {config.SIDECAR_COMMAND.name: config.render_sidecar_launcher()})
    return settings.root


def up(inventory_path: str | Path | None = None, workdir: str | Path | None = None,
       settings: PoolSettings | None = None, sidecar: bool = False) -> PoolInfo:
    """Start the pool for ``inventory_path`` (default: the example inventory); with
    ``sidecar``, its master also runs the sidecar daemon (see :func:`set_sidecar`).

    Builds the chroot on first use (about a minute), restarts a cached one in seconds.
    A pool that is already up is stopped first. Needs root.
    """
    require_root("up")
    settings = settings or PoolSettings.from_env()
    if workdir is not None:
        settings = replace(settings, workdir=Path(workdir))
    inventory = load_inventory(inventory_path or default_inventory_path())
    if not (settings.hooks_dir / config.DISCOVER_SCRIPT).is_file():
        raise PoolError(f"{settings.hooks_dir / config.DISCOVER_SCRIPT} is missing")
    down(settings)
    build(settings)
    root = settings.root
    try:
        chroot.ensure_user(root, settings.user, settings.uid)
        chroot.ensure_user(root, settings.second_user, settings.uid + 1)
        settings.workdir.mkdir(parents=True, exist_ok=True)
        settings.workdir.chmod(0o1777)
        chroot.mount_root(root)
        chroot.bind(settings.hooks_dir, settings.in_root(config.HOOKS_DIR), read_only=True)
        chroot.bind(settings.workdir, settings.in_root(settings.workdir))
        chroot.bind(settings.source_dir, settings.in_root(config.SOURCE_DIR), read_only=True)
        if any(n.spare_capacity for n in inventory.nodes):
            chroot.bind(Path(config.HOST_CGROUP_ROOT), settings.in_root(config.SPARE_CGROUP_ROOT), recursive=True)
        hooks = _hook_files(settings)
        _install_config(settings, inventory, hooks, sidecar)
        settings.state_file.write_text(json.dumps({
            "root": str(root), "workdir": str(settings.workdir),
            "inventory": str(Path(inventory_path or default_inventory_path()).resolve()),
            "nodes": [n.name for n in inventory.nodes]}, indent=2) + "\n")
        chroot.run(["env", "-i", *[f"{k}={v}" for k, v in chroot.CLEAN_ENV.items()],
                    "chroot", str(root), "/usr/sbin/condor_master"], env=dict(chroot.CLEAN_ENV))
        expected = _expected_slots(inventory)
        _wait_for_pool(settings, expected)
    except BaseException:
        log.error("pool up failed; stopping what was started")
        down(settings)
        raise
    clients = {u: client_config_path(u, settings) for u in (settings.user, settings.second_user, settings.admin_user)}
    return PoolInfo(root=root, workdir=settings.workdir, domain=config.DOMAIN, user=settings.user,
                    admin_user=settings.admin_user, client_configs=clients,
                    nodes=tuple(n.name for n in inventory.nodes), slot_names=tuple(expected),
                    wired_hooks={"startd_cron": hooks.startd_cron, "prepare_job": hooks.prepare_job,
                                 "node_agent": hooks.node_agent})


def set_sidecar(enabled: bool, settings: PoolSettings | None = None) -> None:
    """Let the running pool's master run the sidecar daemon (``COSCHED_SIDECAR``) or not.

    Installs (or removes) ``config.d/50-cosched-sidecar.conf`` with the pool's overrides and
    runs ``condor_reconfig``: the master starts a daemon added to its DAEMON_LIST and stops
    (SIGTERM) one removed from it. Once listed, ``condor_off``/``condor_on -daemon
    COSCHED_SIDECAR`` stop and start it.
    """
    require_root("sidecar")
    settings = settings or PoolSettings.from_env()
    if not chroot.processes_in(settings.root):
        raise PoolError(f"the pool in {settings.root} is not running; run pool up first")
    _install_sidecar_config(settings, enabled)
    chroot.in_chroot(settings.root, ["condor_reconfig"], timeout_s=30)


def set_second_schedd(enabled: bool, settings: PoolSettings | None = None) -> None:
    """Run a second schedd (``SCHEDD2``, Name ``schedd2@<host>``) in the running pool, or stop
    it and delete its queue. For tests of a pool with several schedds: ``condor_off -daemon
    SCHEDD2`` then stops one schedd while the other goes on."""
    require_root("schedd")
    settings = settings or PoolSettings.from_env()
    if not chroot.processes_in(settings.root):
        raise PoolError(f"the pool in {settings.root} is not running; run pool up first")
    snippet = _config_d(settings) / config.SECOND_SCHEDD_SNIPPET
    spool = settings.in_root(config.second_schedd_spool())
    if enabled:
        if not snippet.exists():  # not running: start from an empty queue
            shutil.rmtree(spool, ignore_errors=True)
        spool.mkdir(parents=True, exist_ok=True)
        condor = int(chroot.in_chroot(settings.root, ["id", "-u", "condor"]).stdout)
        condor_gid = int(chroot.in_chroot(settings.root, ["id", "-g", "condor"]).stdout)
        os.chown(spool, condor, condor_gid)
        _write(snippet, config.render_second_schedd())
        chroot.in_chroot(settings.root, ["condor_reconfig"], timeout_s=30)
        return
    snippet.unlink(missing_ok=True)
    chroot.in_chroot(settings.root, ["condor_reconfig"], timeout_s=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
            f"-local-name {config.SECOND_SCHEDD}" in _cmdline(p) for p in chroot.processes_in(settings.root)):
        time.sleep(0.2)
    shutil.rmtree(spool, ignore_errors=True)


# --- down / status -------------------------------------------------------------------

def down(settings: PoolSettings | None = None, timeout_s: float = 30) -> None:
    """Stop every process of the pool and unmount everything under the root. Idempotent."""
    require_root("down")
    settings = settings or PoolSettings.from_env()
    root = settings.root
    if root.is_dir() and chroot.processes_in(root):
        # A fast shutdown sends SIGQUIT to non-DaemonCore daemons; stop the node agents
        # first with the master's graceful per-daemon stop, which sends them SIGTERM.
        agents = _agent_names(settings)
        if agents:
            for agent in agents:
                chroot.in_chroot(root, ["condor_off", "-daemon", agent], check=False, timeout_s=30)
            _wait_agents_gone(root, timeout_s=10)
        chroot.in_chroot(root, ["condor_off", "-fast", "-master"], check=False, timeout_s=30)
        left = chroot.wait_gone(root, timeout_s)
        if left:
            log.warning("still running after condor_off: %s", left)
        chroot.stop_processes(root)
    if chroot.mounts_under(root):
        chroot.unmount_all(root)
    _remove_spare_groups()


#: The groups the spare nodes' agents make in the host's hierarchies (``spare_cgroups``).
SPARE_GROUP_PARENT = "cosched_spare"


def _remove_spare_groups() -> None:
    """Remove what the pool's spare nodes' agents left of their groups in the host's cgroup
    hierarchies (an agent removes a claim's group when the claim ends; a pool stopped with
    claims leaves theirs). Only empty groups go (``rmdir`` refuses one with a process)."""
    host = Path(config.HOST_CGROUP_ROOT)
    for parent in host.glob(f"*/{SPARE_GROUP_PARENT}") if host.is_dir() else ():
        for group in [p for p in parent.iterdir() if p.is_dir()]:
            try:
                group.rmdir()
            except OSError as exc:
                log.warning("cgroup %s left: %s", group, exc.strerror)
        try:
            parent.rmdir()
        except OSError:
            pass


def _agent_names(settings: PoolSettings) -> list[str]:
    """The node agents named in the installed pool config's DAEMON_LIST."""
    conf = settings.in_root("/etc/condor/config.d/05-cosched-pool.conf")
    try:
        text = conf.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("DAEMON_LIST = "):
            return [d for d in line.split(" = ", 1)[1].split(", ") if d.startswith("COSCHED_AGENT")]
    return []


def _wait_agents_gone(root: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(config.NODE_AGENT_SCRIPT in _cmdline(p) for p in chroot.processes_in(root)):
            return
        time.sleep(0.2)
    log.warning("node agents did not stop on SIGTERM within %s s", timeout_s)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def status(settings: PoolSettings | None = None) -> dict[str, Any]:
    """Built? mounted? master pid, and the daemons and slots the collector knows."""
    require_root("status")
    settings = settings or PoolSettings.from_env()
    root = settings.root
    pids = chroot.processes_in(root) if root.is_dir() else []
    master = [p for p in pids if chroot.process_name(p) == "condor_master"]
    result: dict[str, Any] = {
        "root": str(root), "built": chroot.is_built(root), "mounts": chroot.mounts_under(root),
        "mounted": bool(chroot.mounts_under(root)), "master_pid": master[0] if master else None,
        "processes": {p: chroot.process_name(p) for p in pids}, "daemons": [], "slots": [],
    }
    if master:
        for key, cmd in (("daemons", ["condor_status", "-any", "-af", "MyType", "Name"]),
                         ("slots", ["condor_status", "-af", "Name"])):
            out = chroot.in_chroot(root, cmd, check=False, timeout_s=30)
            if out.returncode == 0:
                result[key] = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return result
