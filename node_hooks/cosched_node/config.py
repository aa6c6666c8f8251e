"""The node config: the JSON ``condor_sched.inventory.node_config`` writes for one execute
node (its slots, devices and their kinds, sockets and caches; a GPU node's one ``gpu-node``
slot, its ``gpus``, its ``mps`` directories and ``single_account`` flag, and its
``gpu_compute_overcommit``; an overcommitting node's ``multiplicity``). Root-owned, read by
every node program; validated in full before use."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from cosched_node.errors import ConfigError
from cosched_node.gpus import MAX_GPU_COMPUTE_OVERCOMMIT, WHOLE_GPU_COMPUTE
from cosched_node.placement import Units, core_ranges, format_ranges, units_count
from cosched_node.rules import (CACHE_ID_MAX, CBM_WIDTH_MAX, DEVICE_RE, DOMAIN_RE, MAX_BW_GBS, MAX_INT,
                                MAX_UNITS, NODE_RE)

THREADS_PER_PHI_CORE = 4
#: The most jobs a core of an overcommitting node may hold (paper 004, Section 3.3's M; the paper
#: runs M = 2 and leaves larger M to future work).
MAX_MULTIPLICITY = 4
MAX_CONFIG_BYTES = 1 << 20
DEFAULT_STATE_ROOT = "/var/lib/condor_sched"
#: Where every node program reads the node config when no ``--node-config`` names another
#: (``cosched_describe_node.py`` writes it there).
DEFAULT_NODE_CONFIG = "/etc/condor_sched/node.json"
#: The only owner a node config (and every directory above it) may have: root.
TRUSTED_UID = 0
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ABS_PATH_RE = re.compile(r"^/[A-Za-z0-9_./@+-]{1,4000}$")


def plain_absolute_path(path: Any) -> bool:
    """An absolute path of safe characters with no ``..`` component."""
    return isinstance(path, str) and bool(ABS_PATH_RE.match(path)) and "/../" not in path + "/"


KIND_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
KIND_ATTR_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")
TEMPLATE_RE = re.compile(r"^[\x20-\x7e]{0,256}$")
TEMPLATE_FIELDS = frozenset({"compute", "cores", "core_list", "unit_list", "cpu_list", "compute_per_core",
                             "device", "device_index"})


@dataclass(frozen=True)
class DeviceKindConfig:
    """A device kind's record as the node config carries it (``condor_sched.device_kinds``):
    the attributes naming its memory, compute and device, its compute units per core, the
    device OS's logical CPU number of compute unit 0 (``cpu_offset``), and the environment
    templates the PREPARE_JOB hook fills."""
    name: str
    memory_attr: str
    compute_attr: str
    device_name_attr: str
    compute_per_core: int
    environment: Tuple[Tuple[str, str], ...]
    discovery: str = "inventory"
    cpu_offset: int = 0

    def job_environment(self, device: str, compute: int, units: "Units") -> List[Tuple[str, str]]:
        """The filled templates for a job placed on ``units`` (sorted half-open ranges of the
        device's compute units; unit u is thread u % compute_per_core of core
        u // compute_per_core, logical CPU cpu_offset + u of the device's OS).  Fields:
        ``{compute}`` units, ``{cores}`` cores touched, ``{core_list}``, ``{unit_list}``,
        ``{cpu_list}`` as ``a-b,c`` lists, ``{compute_per_core}``, ``{device}``,
        ``{device_index}``.  A variable whose template needs a device index the device name
        does not end with is left out."""
        index = re.search(r"(\d{1,6})$", device)
        cores = core_ranges(units, self.compute_per_core)
        values = {"compute": compute, "cores": units_count(cores), "core_list": format_ranges(cores),
                  "unit_list": format_ranges(units), "cpu_list": format_ranges(units, self.cpu_offset),
                  "compute_per_core": self.compute_per_core, "device": device,
                  "device_index": index.group(1) if index else None}
        out = []
        for name, template in self.environment:
            fields = set(re.findall(r"{(\w*)}", template))
            if any(values[f] is None for f in fields):
                continue
            out.append((name, template.format(**{f: values[f] for f in fields})))
        return out


#: The kind of a device slot whose node config names none (configs written before kinds).
#: Xeon Phi (KNC): logical CPU 0 and the last three sit on the last core, which the card's OS
#: keeps for itself; threads 0-3 of core c are logical CPUs 1+4c .. 4+4c, so cpu_offset is 1.
#: Offloaded OpenMP threads are bound one per listed logical CPU (``explicit`` affinity,
#: ``MIC_`` variables forwarded to the card without the prefix).
PHI_KIND = DeviceKindConfig(
    "phi", "PhiMemory", "PhiThreads", "PhiDeviceName", THREADS_PER_PHI_CORE,
    (("OMP_NUM_THREADS", "{compute}"), ("MIC_ENV_PREFIX", "MIC"), ("MIC_OMP_NUM_THREADS", "{compute}"),
     ("MIC_KMP_AFFINITY", "granularity=fine,explicit,proclist=[{cpu_list}]"), ("COSCHED_DEVICE", "{device}"),
     ("COSCHED_DEVICE_CORES", "{core_list}"), ("COSCHED_DEVICE_THREADS", "{unit_list}"),
     ("OFFLOAD_DEVICES", "{device_index}")), "micinfo", 1)


def parse_device_kind(raw: Any, where: str) -> DeviceKindConfig:
    """Validate a node config's ``device_kind`` object (absent: the Xeon Phi kind)."""
    if raw is None:
        return PHI_KIND
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: 'device_kind' is not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not KIND_NAME_RE.match(name):
        raise ConfigError(f"{where}: device_kind 'name' is not a valid kind name")
    attrs = [raw.get(key) for key in ("memory_attr", "compute_attr", "device_name_attr")]
    if not all(isinstance(a, str) and KIND_ATTR_RE.match(a) for a in attrs) or len(set(attrs)) != 3:
        raise ConfigError(f"{where}: device_kind attributes must be three distinct attribute names")
    environment = raw.get("environment", [])
    if not isinstance(environment, list) or len(environment) > 32:
        raise ConfigError(f"{where}: device_kind 'environment' must be a list of [name, template]")
    pairs = []
    for entry in environment:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)
                and ENV_NAME_RE.match(entry[0]) and TEMPLATE_RE.match(entry[1])
                and set(re.findall(r"{(\w*)}", entry[1])) <= TEMPLATE_FIELDS
                and "{" not in re.sub(r"{\w*}", "", entry[1]) and "}" not in re.sub(r"{\w*}", "", entry[1])):
            raise ConfigError(f"{where}: device_kind environment entry {entry!r} is not [NAME, template] "
                              f"with fields from {sorted(TEMPLATE_FIELDS)}")
        if any(entry[0] == name for name, _ in pairs):   # the hook sets each variable once
            raise ConfigError(f"{where}: device_kind environment sets {entry[0]} twice")
        pairs.append((entry[0], entry[1]))
    discovery = raw.get("discovery", "inventory")
    if not isinstance(discovery, str) or not KIND_NAME_RE.match(discovery):
        raise ConfigError(f"{where}: device_kind 'discovery' is not a valid name")
    cpu_offset = _cfg_int(raw, "cpu_offset", 0, 1024, where) if "cpu_offset" in raw else 0
    return DeviceKindConfig(name, attrs[0], attrs[1], attrs[2], _cfg_int(raw, "compute_per_core", 1, 1024, where),
                            tuple(pairs), discovery, cpu_offset)


@dataclass(frozen=True)
class SlotConfig:
    slot_id: int
    kind: str
    cores: int
    memory_mb: int
    device: Optional[str] = None
    device_memory_mb: int = 0
    hardware_threads: int = 0
    cache_id: Optional[int] = None     # socket slots: the L3 cache id (resctrl schemata key)
    llc_ways: int = 0                  # socket slots: LLC ways of that cache (0: unknown)
    mem_bw_gbs: float = 0.0            # socket slots: peak memory bandwidth, GB/s (0: unknown)
    device_kind: DeviceKindConfig = PHI_KIND  # device slots: the device's kind
    sharing_factor: float = 0.0        # guest slots: the share of its mate's cores a guest takes, in (0, 1)

    @property
    def device_cores(self) -> int:
        return self.hardware_threads // self.device_kind.compute_per_core


@dataclass(frozen=True)
class GpuConfig:
    """GPU ``index`` of a GPU node (its CoSchedGPU<index>* resources), as the inventory lists it."""
    index: int
    name: str
    uuid: str
    model: str
    memory_mb: int
    capability: float


@dataclass(frozen=True)
class NodeConfig:
    node: str
    domain: str
    cores: int
    memory_mb: int
    slots: Tuple[SlotConfig, ...]
    state_dir: Optional[str] = None
    gpus: Tuple[GpuConfig, ...] = ()          # a GPU node's GPUs (issue 13), index order
    mps_pipe_directory: str = ""              # the node's MPS control daemon's pipes (GPU nodes)
    mps_log_directory: str = ""
    #: Every job runs under one execute account, so jobs of different Owners may share a GPU
    #: (one MPS server per Linux user); the admin says so, no job can.
    single_account: bool = False
    #: GPU compute overcommit (issue 13): every GPU offers ``gpu_compute`` thousandths, up to
    #: this many whole GPUs' worth of MPS shares (MPS time-shares SMs); memory is never overcommitted.
    gpu_compute_overcommit: float = 1.0
    #: An overcommitting node (paper 004, Section 3.3): its startd counts each core this many
    #: times, so up to M opted-in jobs time-share a core; socket slots only.
    multiplicity: int = 1

    @property
    def gpu_compute(self) -> int:
        """What each GPU advertises as ``CoSchedGPU<k>Compute``: round(1000 * overcommit)."""
        return gpu_compute_of(self.gpu_compute_overcommit)

    def gpu(self, index: int) -> Optional[GpuConfig]:
        return self.gpus[index] if 0 <= index < len(self.gpus) else None

    @property
    def gpu_slot(self) -> Optional[SlotConfig]:
        """A GPU node's one partitionable slot, or None."""
        return next((s for s in self.slots if s.kind == "gpu-node"), None)

    def slot(self, slot_id: int) -> Optional[SlotConfig]:
        for slot in self.slots:
            if slot.slot_id == slot_id:
                return slot
        return None

    def device(self, name: str) -> Optional[SlotConfig]:
        for slot in self.slots:
            if slot.kind == "device" and slot.device == name:
                return slot
        return None

    @property
    def devices(self) -> Tuple[SlotConfig, ...]:
        return tuple(s for s in self.slots if s.kind == "device")

    @property
    def sockets(self) -> Tuple[SlotConfig, ...]:
        return tuple(s for s in self.slots if s.kind == "socket")

    @property
    def node_slot(self) -> Optional[SlotConfig]:
        """The node-sharing node's "node" slot (paper 001's mates run here), or None."""
        return next((s for s in self.slots if s.kind == "node"), None)

    @property
    def guest_slot(self) -> Optional[SlotConfig]:
        """The overlapping "guest" slot of a node-sharing node, or None."""
        return next((s for s in self.slots if s.kind == "guest"), None)

    @property
    def spare_slot(self) -> Optional[SlotConfig]:
        """The overlapping "spare" slot of paper 003's spare-capacity jobs, or None."""
        return next((s for s in self.slots if s.kind == "spare"), None)


def _cfg_int(obj: Dict[str, Any], key: str, low: int, high: int, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: '{key}' must be an integer in [{low}, {high}]")
    return value


def parse_node_config(obj: Any) -> NodeConfig:
    """Validate the JSON written by ``condor_sched.inventory.node_config``."""
    if not isinstance(obj, dict):
        raise ConfigError("node config: top level is not an object")
    node, domain = obj.get("node"), obj.get("domain")
    if not isinstance(node, str) or not NODE_RE.match(node):
        raise ConfigError("node config: 'node' is not a valid host name")
    if not isinstance(domain, str) or not DOMAIN_RE.match(domain):
        raise ConfigError("node config: 'domain' is not a valid domain")
    state_dir = obj.get("state_dir")
    if state_dir is not None and not plain_absolute_path(state_dir):
        raise ConfigError("node config: 'state_dir' must be an absolute path")
    raw_slots = obj.get("slots")
    if not isinstance(raw_slots, list) or len(raw_slots) > 256:
        raise ConfigError("node config: 'slots' must be a list")
    slots: List[SlotConfig] = []
    for index, raw in enumerate(raw_slots):
        where = f"node config slot #{index}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: not an object")
        kind = raw.get("kind")
        slot_id = _cfg_int(raw, "slot_id", 1, 9999, where)
        cores = _cfg_int(raw, "cores", 0, 100000, where)
        memory_mb = _cfg_int(raw, "memory_mb", 0, MAX_INT, where)
        if kind == "device":
            device = raw.get("device")
            if not isinstance(device, str) or not DEVICE_RE.match(device):
                raise ConfigError(f"{where}: 'device' is not a valid device name")
            device_kind = parse_device_kind(raw.get("device_kind"), where)
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb, device,
                                    _cfg_int(raw, "device_memory_mb", 1, MAX_INT, where),
                                    _cfg_int(raw, "hardware_threads", device_kind.compute_per_core, MAX_UNITS, where),
                                    device_kind=device_kind))
        elif kind == "socket":
            cache_id = _cfg_int(raw, "cache_id", 0, CACHE_ID_MAX, where) if "cache_id" in raw else None
            llc_ways = _cfg_int(raw, "llc_ways", 1, CBM_WIDTH_MAX, where) if "llc_ways" in raw else 0
            mem_bw = raw.get("mem_bw_gbs", 0.0)
            if isinstance(mem_bw, bool) or not isinstance(mem_bw, (int, float)) \
                    or not math.isfinite(mem_bw) or not 0 <= mem_bw <= MAX_BW_GBS:
                raise ConfigError(f"{where}: 'mem_bw_gbs' must be a number in [0, {MAX_BW_GBS:g}]")
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb, cache_id=cache_id,
                                    llc_ways=llc_ways, mem_bw_gbs=float(mem_bw)))
        elif kind == "node":
            if cores < 1:
                raise ConfigError(f"{where}: a node slot needs 'cores' >= 1")
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb))
        elif kind == "gpu-node":
            if cores < 1 or memory_mb < 1:
                raise ConfigError(f"{where}: a gpu-node slot needs 'cores' and 'memory_mb' >= 1")
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb))
        elif kind == "spare":
            if cores < 1 or memory_mb < 1:
                raise ConfigError(f"{where}: a spare slot needs 'cores' and 'memory_mb' >= 1")
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb))
        elif kind == "guest":
            factor = raw.get("sharing_factor")
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
                    or not 0 < factor < 1:
                raise ConfigError(f"{where}: 'sharing_factor' must be a number in (0, 1)")
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb, sharing_factor=float(factor)))
        else:
            raise ConfigError(f"{where}: unknown kind")
    ids = [s.slot_id for s in slots]
    names = [s.device for s in slots if s.device]
    cache_ids = [s.cache_id for s in slots if s.cache_id is not None]
    if len(set(ids)) != len(ids) or len(set(names)) != len(names) or len(set(cache_ids)) != len(cache_ids):
        raise ConfigError("node config: duplicate slot id, device name or cache id")
    _check_node_sharing(slots)
    _check_spare(slots)
    cores = _cfg_int(obj, "cores", 0, 100000, "node config")
    if any(s.kind == "node" and s.cores > cores for s in slots):
        raise ConfigError("node config: the node slot has more cores than the node")
    memory_mb = _cfg_int(obj, "memory_mb", 0, MAX_INT, "node config")
    gpus, mps = _parse_gpus(obj, slots)
    return NodeConfig(node, domain, cores, memory_mb, tuple(slots), state_dir, gpus, mps[0], mps[1], mps[2],
                      _parse_overcommit(obj, bool(gpus)), _parse_multiplicity(obj, slots))


def _parse_multiplicity(obj: Dict[str, Any], slots: List[SlotConfig]) -> int:
    """``multiplicity``: an integer in [1, MAX_MULTIPLICITY], default 1; above 1 only on a node of
    socket slots alone (no device, node, guest, spare or GPU slot shares its cores)."""
    value = obj.get("multiplicity", 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MULTIPLICITY:
        raise ConfigError(f"node config: 'multiplicity' must be an integer from 1 to {MAX_MULTIPLICITY}, "
                          f"got {str(value)[:30]!r}")
    if value > 1 and any(s.kind != "socket" for s in slots):
        raise ConfigError("node config: an overcommitting node ('multiplicity' above 1) has socket slots only")
    return value


def gpu_compute_of(overcommit: float) -> int:
    """A GPU's compute, in thousandths, on a node with this overcommit factor."""
    return round(WHOLE_GPU_COMPUTE * overcommit)


def _parse_overcommit(obj: Dict[str, Any], gpu_node: bool) -> float:
    """``gpu_compute_overcommit``: a number in [1, MAX_GPU_COMPUTE_OVERCOMMIT], default 1.0,
    only on a GPU node."""
    if "gpu_compute_overcommit" not in obj:
        return 1.0
    if not gpu_node:
        raise ConfigError("node config: 'gpu_compute_overcommit' is for GPU nodes (with 'gpus') only")
    value = obj["gpu_compute_overcommit"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 1.0 <= value <= MAX_GPU_COMPUTE_OVERCOMMIT:
        raise ConfigError(f"node config: 'gpu_compute_overcommit' must be a number from 1.0 to "
                          f"{MAX_GPU_COMPUTE_OVERCOMMIT}, got {str(value)[:30]!r}")
    return float(value)


GPU_UUID_RE = re.compile(r"^(?:GPU-|MIG-|MIG-GPU-)[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
                         r"(?:/\d{1,2}/\d{1,2})?$")
GPU_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,63}$")
MAX_GPUS_PER_NODE = 8


def _parse_gpus(obj: Dict[str, Any], slots: List[SlotConfig]) -> Tuple[Tuple[GpuConfig, ...], Tuple[str, str, bool]]:
    """A GPU node's ``gpus`` and ``mps`` (issue 13): only with one gpu-node slot and nothing else."""
    raw = obj.get("gpus")
    gpu_slots = [s for s in slots if s.kind == "gpu-node"]
    if raw is None and not gpu_slots:
        return (), ("", "", False)
    if len(gpu_slots) != 1 or len(slots) != 1:
        raise ConfigError("node config: a GPU node has exactly one slot, of kind gpu-node")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_GPUS_PER_NODE:
        raise ConfigError(f"node config: 'gpus' must be a list of 1 to {MAX_GPUS_PER_NODE} GPUs")
    gpus = []
    for k, g in enumerate(raw):
        where = f"node config gpu #{k}"
        if not isinstance(g, dict):
            raise ConfigError(f"{where}: not an object")
        if _cfg_int(g, "index", 0, MAX_GPUS_PER_NODE - 1, where) != k:
            raise ConfigError(f"{where}: 'index' must be {k} (GPUs in index order)")
        name, uuid, model = g.get("name"), g.get("uuid"), g.get("model")
        if not isinstance(name, str) or not DEVICE_RE.match(name):
            raise ConfigError(f"{where}: 'name' is not a valid device name")
        if not isinstance(uuid, str) or not GPU_UUID_RE.match(uuid):
            raise ConfigError(f"{where}: 'uuid' is not GPU-<uuid> or MIG-<uuid>")
        if not isinstance(model, str) or not GPU_MODEL_RE.match(model):
            raise ConfigError(f"{where}: 'model' is not a GPU model name")
        capability = g.get("capability")
        if isinstance(capability, bool) or not isinstance(capability, (int, float)) or not math.isfinite(capability) \
                or not 1 <= capability < 100:
            raise ConfigError(f"{where}: 'capability' must be a compute capability such as 7.5")
        gpus.append(GpuConfig(k, name, uuid, model, _cfg_int(g, "memory_mb", 1, MAX_INT, where), float(capability)))
    if len({g.uuid for g in gpus}) != len(gpus) or len({g.name for g in gpus}) != len(gpus):
        raise ConfigError("node config: GPU names or uuids repeat")
    mps = obj.get("mps")
    if not isinstance(mps, dict):
        raise ConfigError("node config: a GPU node needs an 'mps' object")
    pipe, log = mps.get("pipe_directory"), mps.get("log_directory")
    if not plain_absolute_path(pipe) or not plain_absolute_path(log):
        raise ConfigError("node config: mps 'pipe_directory' and 'log_directory' must be plain absolute paths")
    single = mps.get("single_account", False)
    if not isinstance(single, bool):
        raise ConfigError("node config: mps 'single_account' must be true or false")
    return tuple(gpus), (pipe, log, single)


def _check_node_sharing(slots: List[SlotConfig]) -> None:
    """A node-sharing node (issue 14, paper 001) has one "node" slot and at most one "guest"
    slot overlapping it with the same cores and memory, and no socket slots."""
    nodes = [s for s in slots if s.kind == "node"]
    guests = [s for s in slots if s.kind == "guest"]
    if len(nodes) > 1 or len(guests) > 1:
        raise ConfigError("node config: at most one node slot and one guest slot")
    if guests and not nodes:
        raise ConfigError("node config: a guest slot needs a node slot")
    if nodes and any(s.kind == "socket" for s in slots):
        raise ConfigError("node config: a node-sharing node (node slot) has no socket slots")
    if guests and (guests[0].cores, guests[0].memory_mb) != (nodes[0].cores, nodes[0].memory_mb):
        raise ConfigError("node config: the guest slot's cores and memory_mb must equal the node slot's")


def _check_spare(slots: List[SlotConfig]) -> None:
    """At most one "spare" slot (paper 003), the last, on a socket or node-sharing node, of at
    most the cores and memory of the node's CPU slots (socket slots, or the node slot) that it
    overlaps."""
    spares = [s for s in slots if s.kind == "spare"]
    if not spares:
        return
    if len(spares) > 1 or slots[-1].kind != "spare":
        raise ConfigError("node config: at most one spare slot, and it is the last slot")
    real = [s for s in slots if s.kind in ("socket", "node")]
    if not real or any(s.kind == "gpu-node" for s in slots):
        raise ConfigError("node config: a spare slot needs socket slots or a node slot (not on a GPU node)")
    spare = spares[0]
    if spare.cores > sum(s.cores for s in real) or spare.memory_mb > sum(s.memory_mb for s in real):
        raise ConfigError("node config: the spare slot has more cores or memory than the node's socket / node slots")


def check_trusted_path(path: str, trusted_uid: int = TRUSTED_UID) -> str:
    """The real path of ``path`` once no one but root could have written it: every directory
    above it owned by root and writable by no group or other (a root-owned sticky directory
    such as /tmp passes: no one else can replace root's file there). ConfigError otherwise."""
    real = os.path.realpath(path)
    directory = os.path.dirname(real)
    while True:
        try:
            info = os.stat(directory)
        except OSError as exc:
            raise ConfigError(f"node config {path}: {directory}: {exc.strerror}") from None
        sticky = bool(info.st_mode & stat.S_ISVTX)
        if info.st_uid != trusted_uid or (info.st_mode & 0o022 and not sticky):
            raise ConfigError(f"node config {path}: directory {directory} is not owned by root or is writable "
                              "by group or others (a job's user could replace the config)")
        if directory == "/":
            return real
        directory = os.path.dirname(directory)


def load_node_config(path: str = DEFAULT_NODE_CONFIG, trusted_uid: int = TRUSTED_UID) -> NodeConfig:
    """Read and validate the node config at ``path``: a regular file owned by root and
    writable by no group or other, in directories only root can write (``check_trusted_path``)."""
    real = check_trusted_path(path, trusted_uid)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"node config {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"node config {path}: not a regular file")
        if info.st_uid != trusted_uid or info.st_mode & 0o022:
            raise ConfigError(f"node config {path}: not owned by root or writable by group or others "
                              f"(mode {stat.S_IMODE(info.st_mode):o}); chown root and chmod 644 it")
        try:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"node config {path}: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"node config {path}: too large")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"node config {path}: not valid JSON ({exc.__class__.__name__})") from None
    return parse_node_config(obj)


def state_dir_for(config: NodeConfig, override: Optional[str] = None) -> str:
    """The state dir: an explicit ``--state-dir``, else the config's, else the default
    ``/var/lib/condor_sched/<node>`` (never an environment variable: a hook's environment is
    not the admin's to vouch for)."""
    for candidate in (override, config.state_dir):
        if candidate:
            if not plain_absolute_path(candidate):
                raise ConfigError("state dir must be a plain absolute path")
            return candidate.rstrip("/") or "/"
    return os.path.join(DEFAULT_STATE_ROOT, config.node)
