"""Write this execute node's node config from its hardware and the admin's few overrides.

Run as root with the node's system ``python3`` (``cosched_describe_node.py``). It probes the
node (``hardware``), reads the optional overrides file (JSON, or INI with one ``[node]``
section), builds the config in the shape ``condor_sched.inventory.node_config`` writes,
validates it with ``config.parse_node_config`` and writes it atomically, root-owned, mode
0644. ``--check`` compares an existing config with the hardware instead. Exit codes: 0 ok,
1 the config does not match the hardware (``--check``), 2 bad input (nothing written).
Format and examples: docs/node-config.md.
"""

from __future__ import annotations

import argparse
import configparser
import json
import math
import os
import socket
import sys
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from cosched_node import hardware
from cosched_node.config import (DEFAULT_NODE_CONFIG, MAX_MULTIPLICITY, PHI_KIND, NodeConfig, load_node_config,
                                 parse_node_config, plain_absolute_path)
from cosched_node.gpus import MAX_GPU_COMPUTE_OVERCOMMIT
from cosched_node.hardware import Hardware
from cosched_node.rules import DOMAIN_RE, MAX_BW_GBS, NODE_RE
from cosched_node.state import replace_file

PROGRAM = "cosched_describe_node"
#: Where the node programs read the node config unless told otherwise.
DEFAULT_OUTPUT = DEFAULT_NODE_CONFIG
ROLES = ("auto", "device", "gpu", "socket", "node-sharing")
#: Copied from condor_sched/inventory.py NODE_SHARING_FACTOR (paper 001's SharingFactor);
#: the node side cannot import condor_sched.
NODE_SHARING_FACTOR = 0.5
#: Copied from condor_sched/inventory.py ``Device``: the host cores and memory set aside for
#: the jobs that offload to one device.
DEVICE_HOST_CORES = 4
DEVICE_HOST_MEMORY_MB = 1024
#: A GPU node's MPS control daemon's pipes and logs (the node agent creates them, root-owned).
DEFAULT_MPS_PIPE_DIRECTORY = "/var/lib/condor_sched/mps/pipe"
DEFAULT_MPS_LOG_DIRECTORY = "/var/lib/condor_sched/mps/log"
#: Copied from condor_sched/device_kinds.py PHI (not a field of config.DeviceKindConfig).
PHI_STOP_OVER_MEMORY = True
#: --check: MemTotal moves by a few MB across kernel updates; more than this share is a change.
MEMORY_TOLERANCE = 0.01
MAX_OVERRIDES_BYTES = 65536
MAX_COUNT = 10 ** 9

Warn = Callable[[str], None]


class DescribeError(ValueError):
    """Bad overrides, or hardware no node config can describe; the message names the field."""


@dataclass(frozen=True)
class Overrides:
    """The admin's settings (every one optional); ``mem_bw_gbs`` holds one value for every
    socket or one per socket."""
    node: Optional[str] = None
    domain: Optional[str] = None
    role: str = "auto"
    mem_bw_gbs: Tuple[float, ...] = ()
    reserved_cores: int = 0
    reserved_memory_mb: int = 0
    device_host_cores: int = DEVICE_HOST_CORES
    device_host_memory_mb: int = DEVICE_HOST_MEMORY_MB
    sharing_factor: float = NODE_SHARING_FACTOR
    gpu_compute_overcommit: float = 1.0
    mps_pipe_directory: str = DEFAULT_MPS_PIPE_DIRECTORY
    mps_log_directory: str = DEFAULT_MPS_LOG_DIRECTORY
    single_account: bool = False
    state_dir: Optional[str] = None
    spare_capacity: bool = False      # paper 003: add the spare slot (socket and node-sharing nodes)
    multiplicity: int = 1             # paper 004: count each core M times (socket nodes; 2 to 4 overcommits)


FIELDS = tuple(f.name for f in fields(Overrides))
GPU_FIELDS = ("gpu_compute_overcommit", "mps_pipe_directory", "mps_log_directory", "single_account")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(key: str, value: Any, ini: bool) -> float:
    if ini and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise DescribeError(f"overrides: '{key}' must be a number, got {_shown(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DescribeError(f"overrides: '{key}' must be a number, got {_shown(value)}")
    return float(value)


def _count(key: str, value: Any, ini: bool) -> int:
    if ini and isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise DescribeError(f"overrides: '{key}' must be a whole number >= 0, got {_shown(value)}")
    return value


def _flag(key: str, value: Any, ini: bool) -> bool:
    if ini and isinstance(value, str):
        words = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
        value = words.get(value.strip().lower(), value)
    if not isinstance(value, bool):
        raise DescribeError(f"overrides: '{key}' must be true or false, got {_shown(value)}")
    return value


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise DescribeError(f"overrides: '{key}' must be a string, got {_shown(value)}")
    return value.strip()


def _bandwidths(value: Any, ini: bool) -> Tuple[float, ...]:
    if ini and isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    values = value if isinstance(value, list) else [value]
    if not 1 <= len(values) <= 64:
        raise DescribeError("overrides: 'mem_bw_gbs' must be one number or a list of 1 to 64, one per socket")
    out = tuple(_number("mem_bw_gbs", v, ini) for v in values)
    if not all(0 <= v <= MAX_BW_GBS for v in out):
        raise DescribeError(f"overrides: 'mem_bw_gbs' must be GB/s in [0, {MAX_BW_GBS:g}], got {_shown(value)}")
    return out


def parse_overrides(raw: Dict[str, Any], ini: bool = False) -> Overrides:
    """Validate the overrides (``ini``: values are strings to convert)."""
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise DescribeError(f"overrides: unknown key {unknown[0]!r} (known: {', '.join(FIELDS)})")
    values: Dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("node", "domain", "role", "mps_pipe_directory", "mps_log_directory", "state_dir"):
            values[key] = _text(key, value)
        elif key == "mem_bw_gbs":
            values[key] = _bandwidths(value, ini)
        elif key in ("sharing_factor", "gpu_compute_overcommit"):
            values[key] = _number(key, value, ini)
        elif key in ("single_account", "spare_capacity"):
            values[key] = _flag(key, value, ini)
        else:
            values[key] = _count(key, value, ini)
    overrides = replace(Overrides(), **values)
    if overrides.node is not None and not NODE_RE.match(overrides.node):
        raise DescribeError(f"overrides: 'node' {_shown(overrides.node)} is not a host name ({NODE_RE.pattern})")
    if overrides.domain is not None and not DOMAIN_RE.match(overrides.domain):
        raise DescribeError(f"overrides: 'domain' {_shown(overrides.domain)} is not a DNS domain")
    if overrides.role not in ROLES:
        raise DescribeError(f"overrides: 'role' must be one of {', '.join(ROLES)}, got {_shown(overrides.role)}")
    if not 0 < overrides.sharing_factor < 1:
        raise DescribeError(f"overrides: 'sharing_factor' must be a number in (0, 1), got {overrides.sharing_factor}")
    if not 1.0 <= overrides.gpu_compute_overcommit <= MAX_GPU_COMPUTE_OVERCOMMIT:
        raise DescribeError(f"overrides: 'gpu_compute_overcommit' must be a number from 1.0 to "
                            f"{MAX_GPU_COMPUTE_OVERCOMMIT}, got {overrides.gpu_compute_overcommit}")
    if not 1 <= overrides.multiplicity <= MAX_MULTIPLICITY:
        raise DescribeError(f"overrides: 'multiplicity' must be a whole number from 1 to {MAX_MULTIPLICITY}, "
                            f"got {overrides.multiplicity}")
    for key in ("mps_pipe_directory", "mps_log_directory", "state_dir"):
        path = getattr(overrides, key)
        if path is not None and not plain_absolute_path(path):
            raise DescribeError(f"overrides: '{key}' must be a plain absolute path, got {_shown(path)}")
    return overrides


def load_overrides(path: str) -> Overrides:
    """The overrides file: ``.json`` (an object) or ``.ini`` / ``.conf`` (one ``[node]`` section)."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in (".json", ".ini", ".conf"):
        raise DescribeError(f"overrides {path}: name it .json, .ini or .conf (the format follows the name)")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_OVERRIDES_BYTES + 1)
    except OSError as exc:
        raise DescribeError(f"overrides {path}: {exc.strerror}") from None
    if len(data) > MAX_OVERRIDES_BYTES:
        raise DescribeError(f"overrides {path}: larger than {MAX_OVERRIDES_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DescribeError(f"overrides {path}: not UTF-8 text") from None
    if extension == ".json":
        try:
            raw = json.loads(text) if text.strip() else {}
        except (ValueError, RecursionError) as exc:
            raise DescribeError(f"overrides {path}: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise DescribeError(f"overrides {path}: the top level must be an object")
        return parse_overrides(raw)
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, path)
    except configparser.Error as exc:
        raise DescribeError(f"overrides {path}: not a valid INI file ({exc.message.splitlines()[0]})") from None
    sections = parser.sections()
    if any(s != "node" for s in sections):
        raise DescribeError(f"overrides {path}: one [node] section only, found {', '.join(sections)}")
    return parse_overrides(dict(parser["node"]) if sections else {}, ini=True)


def node_and_domain(overrides: Overrides, fqdn: str) -> Tuple[str, str]:
    """The node's short name (lower case) and DNS domain: the overrides', else the FQDN's."""
    host, _, rest = fqdn.strip().rstrip(".").partition(".")
    node = overrides.node or host.lower()
    if not NODE_RE.match(node):
        raise DescribeError(f"host name {_shown(host)} is not a node name ({NODE_RE.pattern}): set 'node' "
                            "in the overrides file")
    domain = overrides.domain or rest.lower()
    if not domain:
        raise DescribeError(f"the host's FQDN {_shown(fqdn)} has no domain: set 'domain' in the overrides file "
                            "(the DNS domain HTCondor names this node's slots with, e.g. cluster.example.org)")
    if not DOMAIN_RE.match(domain):
        raise DescribeError(f"domain {_shown(domain)} of the FQDN is not a DNS domain: set 'domain' in the overrides")
    return node, domain


def resolve_role(role: str, hw: Hardware) -> str:
    """``auto``: GPUs found, a GPU node; Xeon Phi cards found, a device node; else a socket node."""
    if role == "auto":
        if hw.gpus and hw.phis:
            raise DescribeError("found both GPUs and Xeon Phi cards: set 'role' to gpu or device in the overrides")
        return "gpu" if hw.gpus else "device" if hw.phis else "socket"
    if role == "gpu" and not hw.gpus:
        raise DescribeError("'role' is gpu but no GPU was found (check --nvidia-smi / --gpu-discovery)")
    if role == "device" and not hw.phis:
        raise DescribeError("'role' is device but micinfo reported no Xeon Phi card (check --micinfo)")
    return role


def phi_kind_json() -> Dict[str, Any]:
    """The Xeon Phi kind as ``condor_sched.device_kinds.PHI.to_node_json()`` writes it."""
    kind = PHI_KIND
    return {"name": kind.name, "memory_attr": kind.memory_attr, "compute_attr": kind.compute_attr,
            "device_name_attr": kind.device_name_attr, "compute_per_core": kind.compute_per_core,
            "discovery": kind.discovery, "environment": [list(e) for e in kind.environment],
            "stop_over_memory": PHI_STOP_OVER_MEMORY, "cpu_offset": kind.cpu_offset}


def socket_shares(cores: int, memory_mb: int, sockets: int) -> List[Tuple[int, int]]:
    """(cores, memory_mb) of each socket slot, split evenly (``inventory.Node.socket_shares``)."""
    return [(cores // sockets + (1 if i < cores % sockets else 0), memory_mb // sockets) for i in range(sockets)]


def _warn_unused(overrides: Overrides, role: str, hw: Hardware, warn: Warn) -> None:
    defaults = Overrides()
    unused = [k for k in GPU_FIELDS if role != "gpu" and getattr(overrides, k) != getattr(defaults, k)]
    if role != "node-sharing" and overrides.sharing_factor != defaults.sharing_factor:
        unused.append("sharing_factor")
    if role not in ("socket", "device") and overrides.mem_bw_gbs:
        unused.append("mem_bw_gbs")
    if role == "gpu" and (overrides.device_host_cores, overrides.device_host_memory_mb) != \
            (defaults.device_host_cores, defaults.device_host_memory_mb):
        unused += ["device_host_cores", "device_host_memory_mb"]
    if unused:
        warn(f"ignored on a {role} node: {', '.join(unused)}")
    if role == "gpu" and len({g.model for g in hw.gpus}) > 1:
        warn("GPUs of several models (" + ", ".join(sorted({g.model for g in hw.gpus})) + "): the sidecar plans "
             "one model per node and pins no job here")
    if hw.gpus and role != "gpu":
        warn(f"{len(hw.gpus)} GPU(s) found but the role is {role}: they are not offered")
    if hw.phis and role in ("gpu", "socket"):
        warn(f"{len(hw.phis)} Xeon Phi card(s) found but the role is {role}: they are not offered")


def _gpu_node(node: str, domain: str, cores: int, memory_mb: int, hw: Hardware,
              overrides: Overrides) -> Dict[str, Any]:
    return {"node": node, "domain": domain, "cores": cores, "memory_mb": memory_mb,
            "slots": [{"slot_id": 1, "kind": "gpu-node", "cores": cores, "memory_mb": memory_mb}],
            "gpus": [{"index": k, "name": f"gpu{k}", "uuid": g.uuid, "model": g.model, "memory_mb": g.memory_mb,
                      "capability": g.capability} for k, g in enumerate(hw.gpus)],
            "mps": {"pipe_directory": overrides.mps_pipe_directory, "log_directory": overrides.mps_log_directory,
                    "single_account": overrides.single_account},
            "gpu_compute_overcommit": overrides.gpu_compute_overcommit}


def _socket_bandwidths(overrides: Overrides, sockets: int, warn: Warn) -> Tuple[float, ...]:
    given = overrides.mem_bw_gbs
    if not given:
        warn("mem_bw_gbs not set: each socket's memory bandwidth is 0 (unknown), so Spread-n-Share cannot "
             "plan bandwidth there; set the measured GB/s per socket in the overrides")
        return (0.0,) * sockets
    if len(given) == 1:
        return given * sockets
    if len(given) != sockets:
        raise DescribeError(f"overrides: 'mem_bw_gbs' has {len(given)} values for {sockets} sockets "
                            "(give one for all or one per socket)")
    return given


def build_config(hw: Hardware, overrides: Overrides, fqdn: str, warn: Warn) -> Dict[str, Any]:
    """The node config for this hardware, validated by ``parse_node_config``."""
    node, domain = node_and_domain(overrides, fqdn)
    role = resolve_role(overrides.role, hw)
    _warn_unused(overrides, role, hw, warn)
    if overrides.spare_capacity and role not in ("socket", "node-sharing"):
        raise DescribeError(f"overrides: 'spare_capacity' is for socket and node-sharing nodes, not a {role} node")
    if overrides.multiplicity > 1 and (role != "socket" or overrides.spare_capacity):
        raise DescribeError("overrides: 'multiplicity' above 1 is for socket nodes without spare_capacity, not "
                            + ("one with spare_capacity" if role == "socket" else f"a {role} node"))
    cores, memory_mb = hw.cores - overrides.reserved_cores, hw.memory_mb - overrides.reserved_memory_mb
    if cores < 1:
        raise DescribeError(f"overrides: 'reserved_cores' {overrides.reserved_cores} leaves no core of {hw.cores}")
    if memory_mb < 1:
        raise DescribeError(f"overrides: 'reserved_memory_mb' {overrides.reserved_memory_mb} leaves no memory "
                            f"of {hw.memory_mb} MB")
    if role == "gpu":
        config = _gpu_node(node, domain, cores, memory_mb, hw, overrides)
    else:
        devices = hw.phis if role in ("device", "node-sharing") else ()
        host_cores = cores - len(devices) * overrides.device_host_cores
        host_memory = memory_mb - len(devices) * overrides.device_host_memory_mb
        host_slots = 1 if role == "node-sharing" else len(hw.sockets)
        if host_cores < host_slots or host_memory < host_slots:
            raise DescribeError(f"{cores} cores and {memory_mb} MB (after reserved_cores / reserved_memory_mb) "
                                f"leave {host_cores} cores and {host_memory} MB for {host_slots} host slot(s) once "
                                f"{len(devices)} device(s) take device_host_cores / device_host_memory_mb each")
        slots: List[Dict[str, Any]] = []
        if role == "node-sharing":
            slots.append({"slot_id": 1, "kind": "node", "cores": host_cores, "memory_mb": host_memory})
            slots.append({"slot_id": 2, "kind": "guest", "cores": host_cores, "memory_mb": host_memory,
                          "sharing_factor": overrides.sharing_factor})
        else:
            if not hw.llc_ways:
                warn("resctrl is not mounted (no /sys/fs/resctrl/info/L3/cbm_mask): llc_ways left out (unknown); "
                     "mount it (mount -t resctrl resctrl /sys/fs/resctrl) and run again")
            shares = socket_shares(host_cores, host_memory, len(hw.sockets))
            for sock, (share_cores, share_memory), bw in zip(hw.sockets, shares,
                                                             _socket_bandwidths(overrides, len(hw.sockets), warn)):
                slot: Dict[str, Any] = {"slot_id": len(slots) + 1, "kind": "socket"}
                if sock.cache_id is not None:
                    slot["cache_id"] = sock.cache_id
                slot.update({"cores": share_cores, "memory_mb": share_memory})
                if hw.llc_ways:
                    slot["llc_ways"] = hw.llc_ways
                slot["mem_bw_gbs"] = float(bw)
                slots.append(slot)
        for card in devices:
            slots.append({"slot_id": len(slots) + 1, "kind": "device", "device": card.name,
                          "cores": overrides.device_host_cores, "memory_mb": overrides.device_host_memory_mb,
                          "device_memory_mb": card.memory_mb, "hardware_threads": card.hardware_threads,
                          "device_kind": phi_kind_json()})
        if overrides.spare_capacity:
            cpu_slots = [s for s in slots if s["kind"] in ("socket", "node")]
            slots.append({"slot_id": len(slots) + 1, "kind": "spare", "cores": sum(s["cores"] for s in cpu_slots),
                          "memory_mb": sum(s["memory_mb"] for s in cpu_slots)})
        config = {"node": node, "domain": domain, "cores": cores, "memory_mb": memory_mb, "slots": slots}
        if overrides.multiplicity > 1:
            config["multiplicity"] = overrides.multiplicity
    if overrides.state_dir:
        config["state_dir"] = overrides.state_dir
    parse_node_config(config)
    return config


def differences(config: NodeConfig, hw: Hardware, overrides: Overrides) -> List[str]:
    """How an existing config disagrees with the hardware found (empty: it matches)."""
    out = []
    cores, memory_mb = hw.cores - overrides.reserved_cores, hw.memory_mb - overrides.reserved_memory_mb
    if config.cores != cores:
        out.append(f"cores: the config has {config.cores}, the hardware {cores} "
                   f"({hw.cores} physical, {overrides.reserved_cores} reserved)")
    if abs(config.memory_mb - memory_mb) > MEMORY_TOLERANCE * memory_mb:
        out.append(f"memory_mb: the config has {config.memory_mb}, the hardware {memory_mb} "
                   f"({hw.memory_mb} MemTotal, {overrides.reserved_memory_mb} reserved)")
    if config.sockets and len(config.sockets) != len(hw.sockets):
        out.append(f"sockets: the config has {len(config.sockets)} socket slots, the hardware {len(hw.sockets)} sockets")
    gpus = hw.gpus if overrides.role in ("auto", "gpu") else ()
    if len(config.gpus) != len(gpus):
        out.append(f"GPU count: the config has {len(config.gpus)}, the hardware {len(gpus)}")
    for k, (listed, found) in enumerate(zip(config.gpus, gpus)):
        if listed.uuid != found.uuid:
            out.append(f"GPU {k} uuid: the config has {listed.uuid}, the hardware {found.uuid}")
        elif listed.memory_mb != found.memory_mb:
            out.append(f"GPU {k} memory_mb: the config has {listed.memory_mb}, the hardware {found.memory_mb}")
    phis = hw.phis if overrides.role in ("auto", "device", "node-sharing") else ()
    listed_devices = {d.device: (d.device_memory_mb, d.hardware_threads) for d in config.devices}
    found_devices = {c.name: (c.memory_mb, c.hardware_threads) for c in phis}
    for name in sorted(set(listed_devices) | set(found_devices), key=lambda n: (len(n), n)):
        listed_device, found_device = listed_devices.get(name), found_devices.get(name)
        if listed_device is None:
            out.append(f"device {name}: found by micinfo, not in the config")
        elif found_device is None:
            out.append(f"device {name}: in the config, not reported by micinfo")
        elif listed_device != found_device:
            out.append(f"device {name}: the config has {listed_device[0]} MB and {listed_device[1]} threads, "
                       f"micinfo {found_device[0]} MB and {found_device[1]} threads")
    return out


def _arguments() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cosched_describe_node.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--overrides", metavar="FILE", help="the admin's overrides: FILE.json, or FILE.ini / FILE.conf "
                                                        "with one [node] section (docs/node-config.md)")
    ap.add_argument("--output", default=DEFAULT_OUTPUT, metavar="PATH",
                    help=f"where to write the node config (default {DEFAULT_OUTPUT}); - prints it")
    ap.add_argument("--check", nargs="?", const=DEFAULT_OUTPUT, metavar="CONFIG",
                    help=f"write nothing: validate CONFIG (default {DEFAULT_OUTPUT}) and compare it with the "
                         "hardware; exit 1 naming each difference")
    ap.add_argument("--nvidia-smi", metavar="EXE|FILE",
                    help="nvidia-smi executable (default: from PATH), a file of its saved output of "
                         f"{' '.join(hardware.NVIDIA_SMI_QUERY)}, or none")
    ap.add_argument("--gpu-discovery", metavar="FILE",
                    help="without nvidia-smi: a file of saved `condor_gpu_discovery -properties` output")
    ap.add_argument("--micinfo", metavar="EXE|FILE",
                    help="micinfo executable (default: from PATH), a file of its saved output, or none")
    ap.add_argument("--root", default="/", metavar="DIR", help="read /sys and /proc below DIR (tests)")
    return ap


def main(argv: Optional[List[str]] = None, fqdn: Optional[str] = None) -> int:
    args = _arguments().parse_args(argv)

    def warn(message: str) -> None:
        print(f"{PROGRAM}: {message}", file=sys.stderr)

    if args.check is None and args.output != "-" and os.geteuid() != 0:
        warn(f"run as root to write {args.output}: the node programs refuse a node config not owned by root "
             "(--output - prints it instead)")
        return 2
    try:
        overrides = load_overrides(args.overrides) if args.overrides else Overrides()
        hw = hardware.probe_hardware(args.root, args.nvidia_smi, args.gpu_discovery, args.micinfo, warn)
        if args.check is not None:
            found = differences(load_node_config(args.check), hw, overrides)
            for line in found:
                print(f"{args.check}: {line}")
            if not found:
                print(f"{args.check}: matches the hardware")
            return 1 if found else 0
        config = build_config(hw, overrides, fqdn if fqdn is not None else socket.getfqdn(), warn)
        text = json.dumps(config, indent=2) + "\n"
        if args.output == "-":
            sys.stdout.write(text)
        else:
            replace_file(args.output, text)
            print(f"{PROGRAM}: wrote {args.output}", file=sys.stderr)
    except (ValueError, OSError) as exc:   # DescribeError, HardwareError, GpuError, ConfigError
        warn(str(exc))
        return 2
    return 0
