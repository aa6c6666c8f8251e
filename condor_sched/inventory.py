"""The node inventory: one YAML format read by the local pool, the planners and the simulator.

Schema (units in the key names)::

    nodes:
      - name: node1              # [a-z][a-z0-9-]*, unique
        cores: 8                 # host cores, >= 1
        memory_mb: 8192          # host memory
        sockets:                 # >= 1; one LLC (cache id = list index) per socket
          - llc_ways: 20         # last-level cache ways of this socket
            mem_bw_gbs: 59.0     # peak memory bandwidth of this socket, GB/s
        spare_capacity: false    # optional: a last SPARE slot of the socket slots' cores and
                                 # memory again, for +CoSchedSpare jobs (paper 003)
        multiplicity: 1          # optional, 1 to 4: an overcommitting node (paper 004) whose
                                 # socket slots count each core M times, for +CoSchedOvercommit
                                 # jobs; no devices, node_sharing or spare_capacity beside it
        devices:                 # 0 or more coprocessors
          - name: mic0           # [a-z][a-z0-9]*, unique within the node
            memory_mb: 8192      # device memory
            hardware_threads: 240 # device compute, in the unit of its kind
            host_cores: 4        # optional, default 4: host cores set aside for the
                                 # jobs that offload to this device
            host_memory_mb: 1024 # optional, default 1024
            kind: phi            # optional, default phi: a registered device kind
                                 # (condor_sched.device_kinds)
      - name: node6              # a GPU node (issue 13): no sockets, devices or node_sharing
        cores: 8
        memory_mb: 8192
        gpus:                    # 1 to 8 NVIDIA GPUs (a MIG instance is one GPU here)
          - name: gpu0           # [a-z][a-z0-9]*, unique within the node
            uuid: GPU-5f1c...    # nvidia-smi's uuid (GPU-<hex/dashes>, or MIG-<...>), unique
            model: Tesla T4      # nvidia-smi's name (DeviceName)
            memory_mb: 15360     # GPU memory (GlobalMemoryMb)
            capability: 7.5      # CUDA compute capability
        gpu_compute_overcommit: 1.0  # optional, 1.0 to 4.0, default 1.0: every GPU offers
                                 # round(1000 * f) thousandths of MPS compute shares
                                 # (CoSchedGPU<k>Compute); one job still takes at most 1000
                                 # of a GPU. GPU memory is never overcommitted.
        mps_single_account: false  # optional, default false: every job on the node runs
                                 # under one execute account (the admin's HTCondor config,
                                 # README), so one MPS server serves all Owners and jobs of
                                 # different Owners may share a GPU (CoSchedGPUSingleAccount)

Slot layout (fixed once for every later issue): each device is one partitionable slot
holding that device's memory and threads and its share of host cores and memory; each
socket is one partitionable slot holding the socket's LLC ways, memory bandwidth and the
remaining host cores and memory, split evenly over sockets. So a device is accountable as
one unit (pin a job to its slot) and so is each cache id (pin a process to a socket slot).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from condor_sched import resources
from condor_sched.device_kinds import DEFAULT_KIND, DEVICE_LAYOUT, GPU, DeviceKindError, device_kind
from condor_sched.model import MAX_GPU_COMPUTE_OVERCOMMIT, WHOLE_GPU, Gpu, Resources, Slot, SlotKind
from condor_sched.yamlio import check_keys, checked_number, load_yaml, shown
from cosched_node.config import MAX_MULTIPLICITY

NODE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
DEVICE_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")
#: The most nodes of an inventory, and sockets and devices of a node.
MAX_NODES = 10_000
MAX_SOCKETS = 16
MAX_DEVICES = 64
NODE_KEYS = ("name", "cores", "memory_mb", "sockets", "devices", "node_sharing", "spare_capacity", "multiplicity",
             "gpus", "gpu_compute_overcommit", "mps_single_account")
#: The keys only a GPU node has.
GPU_NODE_KEYS = ("gpu_compute_overcommit", "mps_single_account")
GPU_KEYS = ("name", "uuid", "model", "memory_mb", "capability")
#: The most GPUs of a GPU node (config.d/10's transform covers CoSchedGPU0..7).
MAX_GPUS_PER_NODE = GPU.max_per_node
#: The lower bound of a GPU node's ``gpu_compute_overcommit`` (the node config checks the same).
MIN_GPU_COMPUTE_OVERCOMMIT = 1.0
#: nvidia-smi's GPU and MIG uuids: ``GPU-<8-4-4-4-12 hex>``, ``MIG-<uuid>`` (R470+) or
#: ``MIG-GPU-<uuid>/<gi>/<ci>`` (older drivers).
GPU_UUID = re.compile(r"^(GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
                      r"|MIG-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
                      r"|MIG-GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}/\d{1,2}/\d{1,2})$")
GPU_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,63}$")
SOCKET_KEYS = ("llc_ways", "mem_bw_gbs")
DEVICE_KEYS = ("name", "memory_mb", "hardware_threads", "host_cores", "host_memory_mb", "kind")


class InventoryError(ValueError):
    """A node inventory that cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Socket:
    cache_id: int
    llc_ways: int
    mem_bw_gbs: float


@dataclass(frozen=True, slots=True)
class Device:
    """One device; ``hardware_threads`` is its compute in the unit of its ``kind``."""

    name: str
    memory_mb: int
    hardware_threads: int
    host_cores: int = 4
    host_memory_mb: int = 1024
    kind: str = DEFAULT_KIND


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One NVIDIA GPU (or MIG instance) of a GPU node: index k of the node's ``gpus`` list is
    its ``CoSchedGPU<k>*`` resources and attributes."""

    name: str
    uuid: str
    model: str
    memory_mb: int
    capability: float


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cores: int
    memory_mb: int
    sockets: tuple[Socket, ...]
    devices: tuple[Device, ...] = ()
    #: Paper 001's live mapping: one NODE slot of the host's cores and its overlapping GUEST
    #: slot instead of socket slots (README, "SD-Policy: the live mapping").
    node_sharing: bool = False
    #: Paper 003: a last SPARE slot of the socket (or node) slots' cores and memory again, for
    #: spare-capacity jobs (``+CoSchedSpare``) in what the primaries leave idle.
    spare_capacity: bool = False
    #: Paper 004's overcommitting node: its socket slots count each core this many times (M).
    multiplicity: int = 1
    #: A GPU node (issue 13): one partitionable slot of all cores and memory and every GPU's
    #: memory and compute; such a node has no sockets, devices or node_sharing.
    gpus: tuple[GpuSpec, ...] = ()
    #: A GPU node's GPU compute overcommit factor: each GPU offers ``gpu_compute`` thousandths.
    gpu_compute_overcommit: float = 1.0
    #: A GPU node whose jobs all run under one execute account (one MPS server for all Owners).
    mps_single_account: bool = False

    @property
    def gpu_compute(self) -> int:
        """Each GPU's compute in thousandths (``CoSchedGPU<k>Compute``): round(1000 * overcommit)."""
        return round(WHOLE_GPU * self.gpu_compute_overcommit)

    def host_share(self) -> tuple[int, int]:
        """(cores, memory_mb) the devices' host shares leave."""
        return (self.cores - sum(d.host_cores for d in self.devices),
                self.memory_mb - sum(d.host_memory_mb for d in self.devices))

    def socket_shares(self) -> list[tuple[int, int]]:
        """(cores, memory_mb) of each socket slot: what the devices leave, split evenly."""
        cores, memory = self.host_share()
        n = len(self.sockets)
        if n == 0:   # a GPU node
            return []
        return [(cores // n + (1 if i < cores % n else 0), memory // n) for i in range(n)]


@dataclass(frozen=True, slots=True)
class Inventory:
    nodes: tuple[Node, ...]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def _number(where: str, raw: dict[str, Any], key: str, kind: type, minimum: float, default: Any = None) -> Any:
    return checked_number(where, raw, key, kind, minimum, InventoryError, default)


def _parse_node(where: str, raw: Any) -> Node:
    if not isinstance(raw, dict):
        raise InventoryError(f"{where}: a node must be a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not NODE_NAME.match(name):
        raise InventoryError(f"{where}: 'name' must match {NODE_NAME.pattern}, got {shown(name)}")
    where = f"{where} ({name})"
    check_keys(where, raw, NODE_KEYS, InventoryError)
    if raw.get("gpus") is not None:
        return _parse_gpu_node(where, name, raw)
    gpu_only = [k for k in GPU_NODE_KEYS if k in raw]
    if gpu_only:
        raise InventoryError(f"{where}: {', '.join(repr(k) for k in gpu_only)} only on a GPU node (with 'gpus')")
    sockets_raw = raw.get("sockets")
    if not isinstance(sockets_raw, list) or not 1 <= len(sockets_raw) <= MAX_SOCKETS:
        raise InventoryError(f"{where}: 'sockets' must be a list of 1 to {MAX_SOCKETS} sockets")
    sockets = tuple(
        Socket(
            cache_id=i,
            llc_ways=_number(f"{where} socket {i}", s, "llc_ways", int, 1),
            mem_bw_gbs=_number(f"{where} socket {i}", s, "mem_bw_gbs", float, 0),
        )
        for i, s in enumerate(sockets_raw)
        if _socket_mapping(f"{where} socket {i}", s)
    )
    devices_raw = raw.get("devices", []) or []
    if not isinstance(devices_raw, list) or len(devices_raw) > MAX_DEVICES:
        raise InventoryError(f"{where}: 'devices' must be a list of at most {MAX_DEVICES} devices")
    devices = []
    for i, d in enumerate(devices_raw):
        dw = f"{where} device {i}"
        if not isinstance(d, dict):
            raise InventoryError(f"{dw}: must be a mapping")
        check_keys(dw, d, DEVICE_KEYS, InventoryError)
        dname = d.get("name")
        if not isinstance(dname, str) or not DEVICE_NAME.match(dname):
            raise InventoryError(f"{dw}: 'name' must match {DEVICE_NAME.pattern}, got {shown(dname)}")
        devices.append(
            Device(
                name=dname,
                memory_mb=_number(dw, d, "memory_mb", int, 1),
                hardware_threads=_number(dw, d, "hardware_threads", int, 1),
                host_cores=_number(dw, d, "host_cores", int, 1, default=4),
                host_memory_mb=_number(dw, d, "host_memory_mb", int, 1, default=1024),
                kind=_kind(dw, d),
            )
        )
    if len({d.name for d in devices}) != len(devices):
        raise InventoryError(f"{where}: device names repeat")
    node = Node(
        name=name,
        cores=_number(where, raw, "cores", int, 1),
        memory_mb=_number(where, raw, "memory_mb", int, 1),
        sockets=sockets,
        devices=tuple(devices),
        node_sharing=_flag(where, raw, "node_sharing"),
        spare_capacity=_flag(where, raw, "spare_capacity"),
        multiplicity=_number(where, raw, "multiplicity", int, 1, default=1),
    )
    if node.multiplicity > MAX_MULTIPLICITY:
        raise InventoryError(f"{where}: 'multiplicity' must be 1 to {MAX_MULTIPLICITY}, got {node.multiplicity}")
    if node.multiplicity > 1 and (node.devices or node.node_sharing or node.spare_capacity):
        raise InventoryError(f"{where}: an overcommitting node ('multiplicity' above 1) has socket slots only: "
                             "no devices, node_sharing or spare_capacity")
    for i, (cores, memory) in enumerate(node.socket_shares()):
        if cores < 1 or memory < 1:
            raise InventoryError(f"{where}: devices' host_cores/host_memory_mb leave socket {i} no cores or memory")
    return node


def _parse_gpu_node(where: str, name: str, raw: dict[str, Any]) -> Node:
    """A GPU node: cores, memory and 1 to MAX_GPUS_PER_NODE GPUs, nothing else."""
    mixed = [k for k in ("sockets", "devices", "node_sharing", "spare_capacity", "multiplicity") if k in raw]
    if mixed:
        raise InventoryError(f"{where}: a GPU node (with 'gpus') has no {', '.join(repr(k) for k in mixed)}: "
                             "its one slot holds all its cores, memory and GPUs")
    gpus_raw = raw["gpus"]
    if not isinstance(gpus_raw, list) or not 1 <= len(gpus_raw) <= MAX_GPUS_PER_NODE:
        raise InventoryError(f"{where}: 'gpus' must be a list of 1 to {MAX_GPUS_PER_NODE} GPUs")
    gpus = []
    for i, g in enumerate(gpus_raw):
        gw = f"{where} gpu {i}"
        if not isinstance(g, dict):
            raise InventoryError(f"{gw}: must be a mapping")
        check_keys(gw, g, GPU_KEYS, InventoryError)
        for key, pattern in (("name", DEVICE_NAME), ("uuid", GPU_UUID), ("model", GPU_MODEL)):
            value = g.get(key)
            if not isinstance(value, str) or not pattern.match(value):
                raise InventoryError(f"{gw}: '{key}' must match {pattern.pattern}, got {shown(value)}")
        capability = checked_number(gw, g, "capability", float, 1.0, InventoryError, maximum=99.9)
        gpus.append(GpuSpec(g["name"], g["uuid"], g["model"], _number(gw, g, "memory_mb", int, 1),
                            round(float(capability), 1)))
    for key in ("name", "uuid"):
        if len({getattr(g, key) for g in gpus}) != len(gpus):
            raise InventoryError(f"{where}: GPU {key}s repeat")
    return Node(name=name, cores=_number(where, raw, "cores", int, 1),
                memory_mb=_number(where, raw, "memory_mb", int, 1), sockets=(), gpus=tuple(gpus),
                gpu_compute_overcommit=_overcommit(where, raw),
                mps_single_account=_flag(where, raw, "mps_single_account"))


def _overcommit(where: str, raw: dict[str, Any]) -> float:
    """A GPU node's ``gpu_compute_overcommit``: a number from 1.0 to 4.0, default 1.0."""
    value = raw.get("gpu_compute_overcommit", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not MIN_GPU_COMPUTE_OVERCOMMIT <= value <= MAX_GPU_COMPUTE_OVERCOMMIT:
        raise InventoryError(f"{where}: 'gpu_compute_overcommit' must be a number from {MIN_GPU_COMPUTE_OVERCOMMIT} "
                             f"to {MAX_GPU_COMPUTE_OVERCOMMIT} (1.0: no overcommit), got {shown(value)}")
    return float(value)


def _flag(where: str, raw: dict[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise InventoryError(f"{where}: '{key}' must be true or false, got {shown(value)}")
    return value


def _socket_mapping(where: str, raw: Any) -> bool:
    """True for a socket mapping of known keys; raise otherwise."""
    if not isinstance(raw, dict):
        raise InventoryError(f"{where}: must be a mapping")
    check_keys(where, raw, SOCKET_KEYS, InventoryError)
    return True


def parse_inventory(data: Any, source: str = "<inventory>") -> Inventory:
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not 1 <= len(data["nodes"]) <= MAX_NODES:
        raise InventoryError(f"{source}: top level must be a mapping with a 'nodes' list of 1 to {MAX_NODES} nodes")
    check_keys(source, data, ("nodes",), InventoryError)
    nodes = tuple(_parse_node(f"{source}: nodes[{i}]", n) for i, n in enumerate(data["nodes"]))
    if len({n.name for n in nodes}) != len(nodes):
        raise InventoryError(f"{source}: node names repeat")
    return Inventory(nodes)


def load_inventory(path: str | Path) -> Inventory:
    return parse_inventory(load_yaml(path, InventoryError), str(path))


def default_inventory_path() -> Path:
    """The inventory shipped with the package (``examples/pools/default.yaml`` of the repository)."""
    return resources.default_inventory_path()


def slot_name(slot_id: int, node: str, domain: str) -> str:
    """The partitionable slot Name HTCondor gives slot ``slot_id`` of local-name startd ``node``."""
    return f"slot{slot_id}@{node}@{node}.{domain}"


def _kind(where: str, raw: dict[str, Any]) -> str:
    """A device's ``kind`` (default: the first registered, Xeon Phi), which must be registered."""
    name = raw.get("kind", DEFAULT_KIND)
    if not isinstance(name, str) or not DEVICE_NAME.match(name):
        raise InventoryError(f"{where}: 'kind' must be a device kind name, got {shown(name)}")
    try:
        kind = device_kind(name)
    except DeviceKindError as e:
        raise InventoryError(f"{where}: 'kind': {e}") from None
    if kind.slot_layout != DEVICE_LAYOUT:
        raise InventoryError(f"{where}: 'kind': {name} devices are not listed under 'devices' (one slot per device); "
                             f"a node with them lists them under '{name}s'")
    return kind.name


#: Paper 001's SharingFactor (Section 3.2.3): a mate gives a guest at most this share of its
#: cores. The node config carries it, so what the node agent enforces is root's, not the job's.
NODE_SHARING_FACTOR = 0.5


def node_slots(node: Node, domain: str) -> list[Slot]:
    """The partitionable slots of an idle node, in slot-id order: sockets (or, on a
    node-sharing node, its NODE slot and the overlapping GUEST slot), then devices; a GPU
    node's one GPU_NODE slot.

    This is the layout the local pool configures; the simulator uses it directly.
    """
    slots: list[Slot] = []
    if node.gpus:
        res = Resources(cpus=node.cores, memory_mb=node.memory_mb)
        gpus = tuple(Gpu(index=k, uuid=g.uuid, model=g.model, memory_mb=g.memory_mb, free_memory_mb=g.memory_mb,
                         free_compute=node.gpu_compute, compute=node.gpu_compute, capability=g.capability)
                     for k, g in enumerate(node.gpus))
        return [Slot(slot_name(1, node.name, domain), f"{node.name}.{domain}", SlotKind.GPU_NODE, res, res, gpus=gpus,
                     gpu_single_account=node.mps_single_account)]
    if node.node_sharing:
        cores, memory = node.host_share()
        res = Resources(cpus=cores, memory_mb=memory)
        for kind in (SlotKind.NODE, SlotKind.GUEST):
            slots.append(Slot(slot_name(len(slots) + 1, node.name, domain), f"{node.name}.{domain}", kind, res, res))
    m = node.multiplicity
    for socket, (cores, memory) in zip(() if node.node_sharing else node.sockets, node.socket_shares()):
        res = Resources(cpus=m * cores, memory_mb=memory, llc_ways=socket.llc_ways, mem_bw_gbs=socket.mem_bw_gbs)
        slots.append(Slot(slot_name(len(slots) + 1, node.name, domain), f"{node.name}.{domain}",
                          SlotKind.OVERCOMMIT if m > 1 else SlotKind.SOCKET, res, res, cache_id=socket.cache_id,
                          multiplicity=m))
    for device in node.devices:
        res = Resources(cpus=device.host_cores, memory_mb=device.host_memory_mb,
                        device_memory_mb=device.memory_mb, device_threads=device.hardware_threads)
        slots.append(Slot(slot_name(len(slots) + 1, node.name, domain), f"{node.name}.{domain}",
                          SlotKind.DEVICE, res, res, device_name=device.name, device_kind=device.kind))
    if node.spare_capacity:
        cores, memory = spare_share(node)
        res = Resources(cpus=cores, memory_mb=memory)
        slots.append(Slot(slot_name(len(slots) + 1, node.name, domain), f"{node.name}.{domain}", SlotKind.SPARE,
                          res, res))
    return slots


def spare_share(node: Node) -> tuple[int, int]:
    """A spare slot's (cores, memory_mb): those of the CPU slots it overlaps (the socket slots,
    or the node slot)."""
    return node.host_share() if node.node_sharing else \
        (sum(c for c, _ in node.socket_shares()), sum(m for _, m in node.socket_shares()))


#: Where a GPU node's MPS control daemon keeps its pipes and logs (root-created, in the node config).
GPU_MPS_ROOT = "/var/run/condor_sched/mps"


def node_config(node: Node, domain: str) -> dict[str, Any]:
    """The per-node JSON file the execute node's hooks and agent read (stdlib only there).

    Written by ``condor-sched pool up`` to ``/etc/condor_sched/nodes/<node>.json`` in the
    pool root; slot ids follow :func:`node_slots`.
    """
    if node.gpus:
        return {"node": node.name, "domain": domain, "cores": node.cores, "memory_mb": node.memory_mb,
                "slots": [{"slot_id": 1, "kind": "gpu-node", "cores": node.cores, "memory_mb": node.memory_mb}],
                "gpus": [{"index": k, "name": g.name, "uuid": g.uuid, "model": g.model, "memory_mb": g.memory_mb,
                          "capability": g.capability} for k, g in enumerate(node.gpus)],
                "mps": {"pipe_directory": f"{GPU_MPS_ROOT}/{node.name}/pipe",
                        "log_directory": f"{GPU_MPS_ROOT}/{node.name}/log",
                        "single_account": node.mps_single_account},
                "gpu_compute_overcommit": node.gpu_compute_overcommit}
    slots: list[dict[str, Any]] = []
    if node.node_sharing:
        cores, memory = node.host_share()
        slots.append({"slot_id": 1, "kind": "node", "cores": cores, "memory_mb": memory})
        slots.append({"slot_id": 2, "kind": "guest", "cores": cores, "memory_mb": memory,
                      "sharing_factor": NODE_SHARING_FACTOR})
    for socket, (cores, memory) in zip(() if node.node_sharing else node.sockets, node.socket_shares()):
        slots.append({"slot_id": len(slots) + 1, "kind": "socket", "cache_id": socket.cache_id,
                      "cores": cores, "memory_mb": memory,
                      "llc_ways": socket.llc_ways, "mem_bw_gbs": socket.mem_bw_gbs})
    for device in node.devices:
        slots.append({"slot_id": len(slots) + 1, "kind": "device", "device": device.name,
                      "cores": device.host_cores, "memory_mb": device.host_memory_mb,
                      "device_memory_mb": device.memory_mb, "hardware_threads": device.hardware_threads,
                      "device_kind": device_kind(device.kind).to_node_json()})
    if node.spare_capacity:
        cores, memory = spare_share(node)
        slots.append({"slot_id": len(slots) + 1, "kind": "spare", "cores": cores, "memory_mb": memory})
    config = {"node": node.name, "domain": domain, "cores": node.cores, "memory_mb": node.memory_mb, "slots": slots}
    if node.multiplicity > 1:
        config["multiplicity"] = node.multiplicity
    return config
