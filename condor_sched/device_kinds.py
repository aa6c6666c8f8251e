"""Device kinds as data: each kind of shared device is one record, and the only place that
names its HTCondor attributes.

A kind has two dimensions the planners account, memory (MB, always hard: a device never
holds more) and compute (in the kind's own unit: hardware threads for a Xeon Phi), which
``thread_overcommit`` may overcommit in what-if plans when the kind allows it. The records
say how HTCondor sees the kind (the partitionable slot's custom resources ``<memory_attr>``
and ``<compute_attr>``, which jobs request as ``request_<attr>``, and the slot attribute
naming the device), how discovery finds a device, and how the node side enforces a share:
the environment the PREPARE_JOB hook gives the job (templates over ``{compute}``,
``{cores}``, ``{core_list}``, ``{unit_list}``, ``{cpu_list}``, ``{compute_per_core}``,
``{device}``, ``{device_index}``) on the ``compute`` units it places the job on (whole free
cores first, not necessarily contiguous; unit u is thread u % compute_per_core of core
u // compute_per_core and logical CPU ``cpu_offset`` + u of the device's OS), and the node
agent stopping a job over its memory request. The node side gets the record through
its node config (:meth:`DeviceKind.to_node_json`), written by root, never by a job.

A kind's ``slot_layout`` says how HTCondor accounts its devices. ``"device"`` (Xeon Phi): one
partitionable slot per device, whose custom resources are ``<memory_attr>`` and
``<compute_attr>``. ``"node"`` (GPUs, issue 13): a node's one partitionable slot holds all its
devices, device k's memory and compute being the custom resources
``<resource_prefix><k>Memory`` and ``...Compute`` (:meth:`DeviceKind.resource_attr`), so that
one claim can take several devices of a node and HTCondor still accounts every device;
the slot says it is such a node with ``<resource_prefix>Node`` and how many devices it has
with ``<resource_prefix>Count``. Jobs still request ``request_<memory_attr>`` and
``request_<compute_attr>`` (per device) and ``<count_request_attr>`` devices. The device
planners (knapsack, global, ...) plan a node-layout kind through a view of one device slot
per device (``modes/gpus/on_devices.py``), unchanged.

Adding a kind is registering one record (:func:`register_device_kind`); the ClassAd
readers, the live-pool queries, the planners, the simulator and the hook find it there.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: ``DeviceKind.slot_layout`` (module docstring).
DEVICE_LAYOUT, NODE_LAYOUT = "device", "node"
_ATTR = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: The placeholders an environment template may use (the hook fills them with numbers and
#: the validated device name).
TEMPLATE_FIELDS = frozenset({"compute", "cores", "core_list", "unit_list", "cpu_list", "compute_per_core",
                             "device", "device_index"})


class DeviceKindError(ValueError):
    """A device kind record that cannot be used, or an unknown kind name."""


@dataclass(frozen=True, slots=True)
class DeviceKind:
    """One kind of shared device (module docstring)."""

    name: str
    memory_attr: str
    compute_attr: str
    device_name_attr: str
    compute_unit: str
    compute_per_core: int = 1
    compute_overcommit: bool = False
    discovery: str = "inventory"
    environment: tuple[tuple[str, str], ...] = ()
    stop_over_memory: bool = True
    cpu_offset: int = 0
    slot_layout: str = DEVICE_LAYOUT
    #: A node-layout kind's names: device k's resources ``<resource_prefix><k>Memory`` and
    #: ``...Compute``, the node's ``<resource_prefix>Node`` and ``<resource_prefix>Count``.
    resource_prefix: str = ""
    #: The compute of one whole device (node layout; a job takes at most this of one device).
    whole_compute: int = 0
    #: How many whole devices a job asks for (node layout; HTCondor's ``RequestGPUs``).
    count_request_attr: str = ""
    #: A job's constraint on a device's properties (node layout; HTCondor's ``RequireGPUs``).
    match_request_attr: str = ""
    #: The most devices of one node (node layout).
    max_per_node: int = 1

    def __post_init__(self) -> None:
        if not re.match(r"^[a-z][a-z0-9-]{0,31}$", self.name):
            raise DeviceKindError(f"device kind name {self.name!r}: use [a-z][a-z0-9-]*")
        if self.slot_layout not in (DEVICE_LAYOUT, NODE_LAYOUT):
            raise DeviceKindError(f"device kind {self.name}: slot_layout must be {DEVICE_LAYOUT!r} or {NODE_LAYOUT!r}")
        if self.slot_layout == NODE_LAYOUT:
            for attr in (self.resource_prefix, self.count_request_attr, self.match_request_attr):
                if not _ATTR.match(attr):
                    raise DeviceKindError(f"device kind {self.name}: {attr!r} is not a ClassAd attribute name")
            if self.whole_compute < 1 or not 1 <= self.max_per_node <= 64:
                raise DeviceKindError(f"device kind {self.name}: whole_compute >= 1 and max_per_node in [1, 64]")
        for attr in (self.memory_attr, self.compute_attr, self.device_name_attr):
            if not _ATTR.match(attr):
                raise DeviceKindError(f"device kind {self.name}: {attr!r} is not a ClassAd attribute name")
        if self.compute_per_core < 1:
            raise DeviceKindError(f"device kind {self.name}: compute_per_core must be >= 1")
        if not 0 <= self.cpu_offset <= 1024:
            raise DeviceKindError(f"device kind {self.name}: cpu_offset must be in [0, 1024]")
        for env, template in self.environment:
            fields = set(re.findall(r"{(\w*)}", template))
            if not _ENV_NAME.match(env) or not fields <= TEMPLATE_FIELDS:
                raise DeviceKindError(f"device kind {self.name}: environment {env}={template!r} "
                                      f"(names [A-Za-z_][A-Za-z0-9_]*, fields {sorted(TEMPLATE_FIELDS)})")
        names = [env for env, _ in self.environment]
        if len(set(names)) < len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise DeviceKindError(f"device kind {self.name}: environment sets {', '.join(twice)} more than once "
                                  f"(the job gets each variable once)")

    @property
    def request_memory_attr(self) -> str:
        return f"Request{self.memory_attr}"

    @property
    def request_compute_attr(self) -> str:
        return f"Request{self.compute_attr}"

    def resource_attr(self, index: int, what: str) -> str:
        """A node-layout kind's per-device attribute: ``resource_attr(0, "Memory")`` is
        ``CoSchedGPU0Memory`` for GPUs (``what``: Memory, Compute, Uuid, DeviceName, ...)."""
        return f"{self.resource_prefix}{index}{what}"

    @property
    def node_attr(self) -> str:
        """A node-layout kind's slot flag (``CoSchedGPUNode``)."""
        return f"{self.resource_prefix}Node"

    @property
    def count_attr(self) -> str:
        """How many devices a node-layout slot holds (``CoSchedGPUCount``)."""
        return f"{self.resource_prefix}Count"

    def to_node_json(self) -> dict[str, Any]:
        """The record as the node config carries it to the execute node's hooks."""
        return {"name": self.name, "memory_attr": self.memory_attr, "compute_attr": self.compute_attr,
                "device_name_attr": self.device_name_attr, "compute_per_core": self.compute_per_core,
                "discovery": self.discovery, "environment": [list(e) for e in self.environment],
                "stop_over_memory": self.stop_over_memory, "cpu_offset": self.cpu_offset}


#: Intel Xeon Phi (paper 002): device memory and hardware threads (4 a core), found by
#: ``micinfo``. An offload gets exactly its threads: OpenMP thread caps and an explicit list
#: of their logical CPUs on the card (``granularity=fine,explicit,proclist=[...]``, ``MIC_``
#: variables forwarded without the prefix). Logical CPU 0 (and the last three) sit on the
#: card's last core, which its OS keeps; core c's threads are CPUs 1+4c .. 4+4c: cpu_offset 1.
#: Threads may be overcommitted in what-if plans (COSMIC serialises offloads, Section IV-D2).
PHI = DeviceKind(
    name="phi", memory_attr="PhiMemory", compute_attr="PhiThreads", device_name_attr="PhiDeviceName",
    compute_unit="hardware threads", compute_per_core=4, compute_overcommit=True, discovery="micinfo",
    cpu_offset=1,
    environment=(("OMP_NUM_THREADS", "{compute}"), ("MIC_ENV_PREFIX", "MIC"), ("MIC_OMP_NUM_THREADS", "{compute}"),
                 ("MIC_KMP_AFFINITY", "granularity=fine,explicit,proclist=[{cpu_list}]"),
                 ("COSCHED_DEVICE", "{device}"), ("COSCHED_DEVICE_CORES", "{core_list}"),
                 ("COSCHED_DEVICE_THREADS", "{unit_list}"), ("OFFLOAD_DEVICES", "{device_index}")))

#: NVIDIA GPUs (docs/gpu-sharing.md): GPU memory (MB, hard) and compute in thousandths
#: of a GPU (1000 = whole; MPS caps a client's SMs with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
#: and time-shares them), found by ``nvidia-smi`` or ``condor_gpu_discovery``; model and compute
#: capability are match attributes (``require_gpus``). Node layout: every GPU of a node is
#: ``CoSchedGPU<k>Memory`` / ``CoSchedGPU<k>Compute`` of the node's one slot. Compute is soft up to
#: the node's advertised total (``gpu_compute_overcommit`` times 1000 per GPU, set by the admin
#: on the node), so the planners' what-if ``thread_overcommit`` does not apply. The hook's
#: environment is GPU-specific (uuids, MPS pipes and limits; ``cosched_node/gpus.py``), not templates.
GPU = DeviceKind(
    name="gpu", memory_attr="GPUMemory", compute_attr="GPUCompute", device_name_attr="DeviceName",
    compute_unit="thousandths of a GPU", discovery="nvidia-smi", slot_layout=NODE_LAYOUT,
    resource_prefix="CoSchedGPU", whole_compute=1000, count_request_attr="RequestGPUs",
    match_request_attr="RequireGPUs", max_per_node=8)

_KINDS: dict[str, DeviceKind] = {}


def register_device_kind(kind: DeviceKind) -> DeviceKind:
    """Make ``kind`` known everywhere; its attribute names must not clash with another kind's."""
    for other in _KINDS.values():
        if other.name == kind.name:
            raise DeviceKindError(f"device kind {kind.name!r} registered twice")
        if {other.memory_attr, other.compute_attr} & {kind.memory_attr, kind.compute_attr}:
            raise DeviceKindError(f"device kind {kind.name!r} reuses the attributes of {other.name!r}")
    _KINDS[kind.name] = kind
    return kind


def unregister_device_kind(name: str) -> None:
    """Forget a kind (tests that register a dummy one)."""
    _KINDS.pop(name, None)


def device_kinds(layout: str | None = DEVICE_LAYOUT) -> tuple[DeviceKind, ...]:
    """The registered kinds of one slot layout (None: all), the first registered (Xeon Phi) first."""
    return tuple(k for k in _KINDS.values() if layout is None or k.slot_layout == layout)


def device_kind(name: str) -> DeviceKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise DeviceKindError(f"unknown device kind {name!r}; known: {', '.join(_KINDS)}") from None


DEFAULT_KIND = register_device_kind(PHI).name
GPU_KIND = register_device_kind(GPU).name
