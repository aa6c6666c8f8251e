"""Pure rendering of the local pool's HTCondor configuration: strings in, strings out.

Paths here are paths inside the pool root (the chroot), except where a name says host.
The slot layout itself is rendered on the node by ``node_hooks/discover_devices.py``
(device discovery); this module renders everything else.
"""
from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from condor_sched.device_kinds import device_kinds
from condor_sched.inventory import Node

#: DNS domain of the fake execute nodes (all on 127.0.0.1).
DOMAIN = "cosched.test"
#: Where the repository's node_hooks/ appear inside the pool root (read-only bind mount).
HOOKS_DIR = PurePosixPath("/opt/condor_sched/node_hooks")
NODE_CONFIG_DIR = PurePosixPath("/etc/condor_sched/nodes")
WRAPPER_DIR = PurePosixPath("/etc/condor_sched/wrappers")
AGENT_STATE_DIR = PurePosixPath("/var/lib/condor_sched")
#: Where the host's cgroup mounts appear in the chroot for the agents of nodes with a spare
#: slot (``--cgroup-root``): not /sys/fs/cgroup, so HTCondor itself still sees no cgroups
#: there and runs every other job as before (../shared/POOL.md).
SPARE_CGROUP_ROOT = PurePosixPath("/run/cosched-cgroup")
#: The host's cgroup mounts bound there.
HOST_CGROUP_ROOT = PurePosixPath("/sys/fs/cgroup")
#: Where the node agents' piggyback profiling writes run records (shared by all nodes).
PROFILE_RUNS_DIR = AGENT_STATE_DIR / "profiles"
CONDOR_LOG_DIR = PurePosixPath("/var/log/condor")
CONDOR_EXECUTE_DIR = PurePosixPath("/var/lib/condor/execute")
PYTHON = "/usr/bin/python3"
#: The sidecar's venv, built with the chroot's python3 (the host venv does not load there).
SIDECAR_VENV = PurePosixPath("/opt/condor_sched/venv")
#: Where the working tree appears inside the pool root (read-only bind mount, on the venv's path).
SOURCE_DIR = PurePosixPath("/opt/condor_sched/src")
SIDECAR_COMMAND = SIDECAR_VENV / "bin" / "condor-sched"
#: The admin's sidecar snippet (config.d/), and the pool's overrides of it.
SIDECAR_SNIPPET = "50-cosched-sidecar.conf"
SIDECAR_POOL_SNIPPET = "55-cosched-pool-sidecar.conf"
#: A second schedd under the same master (``localpool.set_second_schedd``): its local name,
#: its config snippet and its spool (its own job queue) inside the pool root.
SECOND_SCHEDD = "SCHEDD2"
SECOND_SCHEDD_SNIPPET = "40-cosched-pool-schedd2.conf"
CONDOR_SPOOL_DIR = PurePosixPath("/var/spool/condor")

STARTD_CRON_SCRIPT = "cosched_startd_cron.py"
PREPARE_JOB_SCRIPT = "cosched_prepare_job.py"
NODE_AGENT_SCRIPT = "cosched_node_agent.py"
DISCOVER_SCRIPT = "discover_devices.py"
STARTD_CRON_PERIOD_S = 30
#: HTCondor custom resources of the slot layout (condor_sched.inventory.node_slots).
def custom_resources(gpus_per_node: int = 0) -> tuple[str, ...]:
    """The custom resources every startd declares: each device kind's two, LLC ways, bandwidth,
    and on a pool with GPU nodes every GPU index's CoSchedGPU<k>Memory and CoSchedGPU<k>Compute."""
    gpu = tuple(f"CoSchedGPU{k}{what}" for k in range(gpus_per_node) for what in ("Memory", "Compute"))
    gpu += ("GPUs",) if gpus_per_node else ()   # HTCondor's own, a plain count on GPU nodes (config.d/20)
    return (*(a for k in device_kinds() for a in (k.memory_attr, k.compute_attr)), "LLCWays", "MemBW", *gpu)


#: The fake ``nvidia-smi`` of the pool's GPU nodes (node_hooks/fake_nvidia_smi.py), a
#: per-node wrapper naming its node config and its process directory.
FAKE_NVIDIA_SMI_SCRIPT = "fake_nvidia_smi.py"


def fake_gpu_apps_dir(node: str) -> PurePosixPath:
    """Where a test job on GPU node ``node`` declares the "GPU memory" its processes use: a file
    ``<pid>`` holding ``<gpu uuid> <MiB>`` lines. World-writable (mode 1777) by necessity: it
    emulates the hardware a job's CUDA calls would fill. The fake nvidia-smi reports only
    pids alive in /proc, so what a job writes is what a real GPU would show of it."""
    return AGENT_STATE_DIR / "fake-gpu" / node


def nvidia_smi_wrapper_path(node: str) -> PurePosixPath:
    return WRAPPER_DIR / node / "nvidia-smi"


def render_nvidia_smi_wrapper(node: str) -> str:
    """GPU node ``node``'s nvidia-smi: the fake, answering from the node's config and apps dir."""
    return "\n".join(["#!/bin/sh", f"# fake nvidia-smi of GPU node {node} (written by condor-sched pool up)",
                      f'exec {PYTHON} -Es {HOOKS_DIR / FAKE_NVIDIA_SMI_SCRIPT} --node-config {node_config_path(node)} '
                      f'--apps-dir {fake_gpu_apps_dir(node)} "$@"', ""])

_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")


def local_name(index: int) -> str:
    """The startd local name of the ``index``-th node (1-based): NODE1, NODE2, ..."""
    return f"NODE{index}"


def probe_dir(node: str) -> PurePosixPath:
    """The node agent's ``file`` device-memory probe: ``<dir>/<device>/<Cluster>.<Proc>`` holds
    a job's device memory use in MB (the pool has no real Phi; tests write these files)."""
    return AGENT_STATE_DIR / "probe" / node


def startd_address_file(node: str) -> PurePosixPath:
    """The node's startd address file: the node agent asks that startd for its claims."""
    return CONDOR_LOG_DIR / f".startd_address.{node}"


def agent_name(index: int) -> str:
    """The master's name for the node agent of the ``index``-th node."""
    return f"COSCHED_AGENT{index}"


def node_config_path(node: str) -> PurePosixPath:
    return NODE_CONFIG_DIR / f"{node}.json"


@dataclass(frozen=True, slots=True)
class HookFiles:
    """Which node_hooks programs exist at ``up`` time (a missing one is not wired)."""

    startd_cron: bool = True
    prepare_job: bool = True
    node_agent: bool = True


def render_hosts(host_names: list[str], nodes: list[str], domain: str = DOMAIN) -> str:
    """ROOT/etc/hosts: the host's names and every node's name on 127.0.0.1."""
    names = ["localhost", *host_names]
    for n in nodes:
        names += [f"{n}.{domain}", n]
    seen: list[str] = []
    for n in names:
        if n and n not in seen:
            seen.append(n)
    return f"127.0.0.1\t{' '.join(seen)}\n::1\tlocalhost ip6-localhost ip6-loopback\n"


#: HTCondor's default MAX_SLOT_TYPES.
DEFAULT_MAX_SLOT_TYPES = 10


def slot_types(nodes: list[Node]) -> int:
    """Slot types the busiest node needs: one partitionable slot per socket (a node-sharing
    node: its node and guest slots) and per device."""
    return max((2 if nd.node_sharing else 1 if nd.gpus else len(nd.sockets)) + len(nd.devices) + nd.spare_capacity
               for nd in nodes)


def render_pool_config(nodes: list[Node], hooks: HookFiles, domain: str = DOMAIN,
                       super_users: tuple[str, ...] = ("root", "condor")) -> str:
    """The central manager, schedd and shared settings of the one-machine pool."""
    daemons = ["MASTER", "COLLECTOR", "NEGOTIATOR", "SCHEDD", "SHARED_PORT"]
    for i, _ in enumerate(nodes, 1):
        daemons.append(local_name(i))
        if hooks.node_agent:
            daemons.append(agent_name(i))
    lines = [
        "# The condor_sched local test pool (written by `condor-sched pool up`; do not edit).",
        "# Loopback only, CLAIMTOBE authentication: anyone on this machine may claim any",
        "# identity. Never use these security settings on a real pool.",
        "CONDOR_HOST = 127.0.0.1",
        "NETWORK_INTERFACE = 127.0.0.1",
        "ENABLE_IPV6 = False",
        "USE_SHARED_PORT = True",
        f"UID_DOMAIN = {domain}",
        "TRUST_UID_DOMAIN = True",
        "SEC_DEFAULT_AUTHENTICATION_METHODS = CLAIMTOBE, FS",
        "SEC_CLIENT_AUTHENTICATION_METHODS = CLAIMTOBE, FS",
        "ALLOW_READ = *",
        "ALLOW_WRITE = *",
        "ALLOW_ADMINISTRATOR = *",
        "ALLOW_NEGOTIATOR = *",
        "ALLOW_DAEMON = *",
        f"QUEUE_SUPER_USERS = {', '.join(super_users)}",
        "",
        "# Fast negotiation cycles; the sidecar follows cycles through the negotiator ad.",
        "NEGOTIATOR_INTERVAL = 2",
        "NEGOTIATOR_MIN_INTERVAL = 1",
        "NEGOTIATOR_CYCLE_DELAY = 1",
        "NEGOTIATOR_UPDATE_AFTER_CYCLE = True",
        "SCHEDD_INTERVAL = 5",
        "UPDATE_INTERVAL = 5",
        "STARTER_UPDATE_INTERVAL = 5",
        "RUNBENCHMARKS = 0",
        "",
        "# The startd finds custom resource names only in unprefixed MACHINE_RESOURCE_<name>",
        "# parameters; each node's NODE<i>.MACHINE_RESOURCE_<name> then sets its amount.",
        *[f"MACHINE_RESOURCE_{r} = 0" for r in custom_resources(max((len(n.gpus) for n in nodes), default=0))],
        "# Likewise SLOT_TYPE_<n>_PARTITIONABLE is read unprefixed (a NODE<i>. form is ignored and",
        "# the slot comes up Static): every slot type of this layout is partitionable.",
        *[f"SLOT_TYPE_{n}_PARTITIONABLE = True" for n in range(1, 1 + slot_types(nodes))],
        "# The startd ignores slot types beyond MAX_SLOT_TYPES (default 10): a node with more",
        "# devices and sockets than that raises it.",
        f"MAX_SLOT_TYPES = {max(DEFAULT_MAX_SLOT_TYPES, slot_types(nodes))}",
        "",
        f"DAEMON_LIST = {', '.join(daemons)}",
        "# The node agents run python3, no DaemonCore binary, so the master starts them",
        "# without -f and stops them with SIGTERM; DC_DAEMON_LIST must stay the default.",
    ]
    if hooks.startd_cron:
        lines += [
            "",
            "# Node facts for the sidecar (per-node arguments below).",
            "STARTD_CRON_JOBLIST = $(STARTD_CRON_JOBLIST) COSCHEDINFO",
            f"STARTD_CRON_COSCHEDINFO_EXECUTABLE = {PYTHON}",
            "STARTD_CRON_COSCHEDINFO_MODE = Periodic",
            f"STARTD_CRON_COSCHEDINFO_PERIOD = {STARTD_CRON_PERIOD_S}s",
        ]
    if hooks.prepare_job:
        lines += [
            "",
            "# Job hook: every starter runs with -local-name slot_type_N, so each node's",
            "# NODE<i>_ENVIRONMENT sets _CONDOR_COSCHED_HOOK_PREPARE_JOB_ARGS to its node's config.",
            "STARTER_DEFAULT_JOB_HOOK_KEYWORD = COSCHED",
            f"COSCHED_HOOK_PREPARE_JOB = {WRAPPER_DIR / 'prepare_job'}",
        ]
    return "\n".join(lines) + "\n"


def render_node_daemons(node: Node, index: int, hooks: HookFiles, domain: str = DOMAIN) -> str:
    """One execute node: its startd (local name NODE<i>), hooks and node agent."""
    p = local_name(index) + "."
    conf = node_config_path(node.name)
    lines = [
        f"# Execute node {node.name} (startd {local_name(index)}).",
        f"{local_name(index)} = $(STARTD)",
        f"{local_name(index)}_ARGS = -local-name {local_name(index)}",
        f"{p}STARTD_NAME = {node.name}",
        f"{p}NETWORK_HOSTNAME = {node.name}.{domain}",
        f"{p}STARTD_LOG = $(LOG)/StartLog.{node.name}",
        f"{p}STARTD_ADDRESS_FILE = {startd_address_file(node.name)}",
        f"{p}EXECUTE = {CONDOR_EXECUTE_DIR / node.name}",
        f"{local_name(index)}_ENVIRONMENT = {starter_environment(node.name, hooks, bool(node.gpus))}",
    ]
    if hooks.startd_cron:
        lines.append(f"{p}STARTD_CRON_COSCHEDINFO_ARGS = -Es {HOOKS_DIR / STARTD_CRON_SCRIPT} --node-config {conf}")
    if hooks.node_agent:
        a = agent_name(index)
        gpu = f" --nvidia-smi {nvidia_smi_wrapper_path(node.name)}" if node.gpus else ""
        gpu += f" --cgroup-root {SPARE_CGROUP_ROOT}" if node.spare_capacity else ""
        lines += [
            f"{a} = {PYTHON}",
            f"{a}_ARGS = -Es {HOOKS_DIR / NODE_AGENT_SCRIPT} --node-config {conf} "
            f"--state-dir {AGENT_STATE_DIR / node.name} --startd-address-file {startd_address_file(node.name)} "
            f"--probe file --probe-dir {probe_dir(node.name)} --profile-dir {PROFILE_RUNS_DIR} --interval 2{gpu}",
        ]
    return "\n".join(lines) + "\n"


#: On a GPU node the starter's own GPU variables go to this one, not CUDA_VISIBLE_DEVICES,
#: which the PREPARE_JOB hook sets (config.d/20).
GPU_NODE_STARTER_ENV = ("ENVIRONMENT_FOR_AssignedGPUs", "COSCHED_HTCONDOR_ASSIGNED_GPUS")


def starter_environment(node: str, hooks: HookFiles, gpu_node: bool = False) -> str:
    """``NODE<i>_ENVIRONMENT``: what the master puts in the node's startd's environment, which
    its starters and their PREPARE_JOB hooks inherit (every starter of the host runs under the
    local name slot_type_<n>, so no NODE<i>. knob reaches it): its own starter log, its node's
    hook arguments and, on a GPU node, HTCondor's GPU variables out of the hook's way
    (docs/admin.md, "Several startds on one host")."""
    pairs = [f"_CONDOR_STARTER_LOG={CONDOR_LOG_DIR}/StarterLog.{node}"]
    if gpu_node:
        pairs.append(f"_CONDOR_{GPU_NODE_STARTER_ENV[0]}={GPU_NODE_STARTER_ENV[1]}")
    if hooks.prepare_job:
        pairs.append(f"_CONDOR_COSCHED_HOOK_PREPARE_JOB_ARGS='--node-config {node_config_path(node)}'")
    return '"' + " ".join(pairs) + '"'


def render_prepare_job_wrapper() -> str:
    """Runs the repository's prepare-job hook with the chroot's python3 (the read-only bind
    mount of the working tree keeps whatever modes a checkout gave its files)."""
    return "\n".join(["#!/bin/sh", "# COSCHED prepare-job hook wrapper (written by condor-sched pool up)",
                      f'exec {PYTHON} -Es {HOOKS_DIR / PREPARE_JOB_SCRIPT} "$@"', ""])


#: The pool negotiates about every 2 s where a production pool does every 60 s: the sidecar's
#: aging limits, counted in cycles, keep their wall-clock meaning (device: 10 cycles of 60 s,
#: 10 min; spread: 30 cycles of 60 s, 30 min).
POOL_AGE_LIMIT = ["# The pool cycles every ~2 s (production: 60 s): aging keeps its ~10 (device) and",
                  "# ~30 (spread) minutes.",
                  "COSCHED_AGE_LIMIT_CYCLES = 300",
                  "COSCHED_SPREAD_AGE_LIMIT_CYCLES = 900"]


def render_client_config(user: str) -> str:
    """CONDOR_CONFIG for the host's htcondor2 (and tools) claiming to be ``user``."""
    if not _USER.match(user):
        raise ValueError(f"bad user name {user!r}")
    return "\n".join([
        f"# Client of the condor_sched local test pool as {user} (CLAIMTOBE: test pools only).",
        "CONDOR_HOST = 127.0.0.1",
        "ENABLE_IPV6 = False",
        "SEC_CLIENT_AUTHENTICATION_METHODS = CLAIMTOBE",
        f"SEC_CLAIMTOBE_USER = {user}",
        f"UID_DOMAIN = {DOMAIN}",
        *POOL_AGE_LIMIT,
        "",
    ])


def sidecar_requirements(setup_cfg: str, condor_version: str) -> list[str]:
    """The project's install_requires (setup.cfg text), with the htcondor wheel pinned to the
    pool's own HTCondor version."""
    parser = configparser.ConfigParser()
    parser.read_string(setup_cfg)
    lines = [line.strip() for line in parser.get("options", "install_requires").splitlines()]
    return [f"htcondor=={condor_version}" if re.match(r"^htcondor\b", line) else line for line in lines if line]


def condor_version_of(banner: str) -> str:
    """The version in ``condor_version``'s ``$CondorVersion: 25.14.1 ... $`` line."""
    m = re.search(r"\$CondorVersion: (\d+\.\d+\.\d+)", banner)
    if m is None:
        raise ValueError(f"no $CondorVersion in {banner[:200]!r}")
    return m.group(1)


def render_sidecar_launcher() -> str:
    """``condor-sched`` of the chroot's venv: the working tree's CLI, run by the venv's python."""
    return "\n".join([f"#!{SIDECAR_VENV / 'bin' / 'python3'}",
                      "# condor-sched in the local pool (written by condor-sched pool up)",
                      "import sys",
                      "from condor_sched.cli import main",
                      "sys.exit(main())", ""])


def render_sidecar_pool_config() -> str:
    """What the local pool changes in the admin's sidecar snippet: the chroot's command, the
    unprivileged ``condor`` account (a queue super user; CLAIMTOBE claims it), and the node
    agents' run records for piggyback profiling."""
    return "\n".join([
        f"# The sidecar in the local pool, over {SIDECAR_SNIPPET} (written by condor-sched pool up).",
        f"COSCHED_SIDECAR = {SIDECAR_COMMAND}",
        "COSCHED_SIDECAR_USERID = condor",
        f"COSCHED_PROFILE_RUNS_DIR = {PROFILE_RUNS_DIR}",
        *POOL_AGE_LIMIT,
        "",
    ])


def second_schedd_spool() -> PurePosixPath:
    return CONDOR_SPOOL_DIR / SECOND_SCHEDD.lower()


def render_second_schedd() -> str:
    """A second schedd beside the pool's own, as the HTCondor manual configures several
    schedds on one host: ``SCHEDD2 = $(SCHEDD)`` with a local name, its own ``SCHEDD_NAME``
    (its Name becomes ``schedd2@<host>``), spool (job queue), log and address file. The
    schedd transform of ``10-cosched-schedd.conf`` applies to it as to the first."""
    name, spool = SECOND_SCHEDD, second_schedd_spool()
    return "\n".join([
        "# A second schedd (written by condor_sched.localpool.set_second_schedd; tests only).",
        f"{name} = $(SCHEDD)",
        f"{name}_ARGS = -local-name {name}",
        f"{name}.SCHEDD_NAME = {name.lower()}",
        f"{name}.SPOOL = {spool}",
        f"{name}.SCHEDD_LOG = $(LOG)/SchedLog.{name.lower()}",
        f"{name}.SCHEDD_ADDRESS_FILE = {spool}/.schedd_address",
        f"{name}.SCHEDD_DAEMON_AD_FILE = {spool}/.schedd_classad",
        f"DAEMON_LIST = $(DAEMON_LIST) {name}",
        ""])
