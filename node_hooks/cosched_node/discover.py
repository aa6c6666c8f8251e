"""Print one execute node's HTCondor slot configuration, from its node config and devices.

Runs on the execute node with nothing but the standard library. Reads the node config
(``cosched_describe_node.py`` writes it; docs/node-config.md; the local pool's from
``condor_sched.inventory.node_config``) and, when ``micinfo`` is installed, takes each
coprocessor's memory and thread count from it instead (devices of a kind whose discovery
is ``micinfo``). Prints config lines (prefixed with the startd's local name when one is
given, ``NODE1.SLOT_TYPE_1 = ...``):

- one partitionable slot type per socket (cores, memory, LLCWays, MemBW), then one per
  device (host cores and memory, and its kind's memory and compute resources, e.g.
  PhiMemory and PhiThreads), so slot ids follow ``condor_sched.inventory.node_slots``;
- on a node-sharing node (paper 001's live mapping) a NODE slot and its overlapping GUEST slot
  (same cores and memory, ``SLOT<n>_CoSchedNodeSlot`` / ``SLOT<n>_CoSchedGuestSlot``) in place
  of the socket slots;
- on a node with spare capacity (paper 003) a last SPARE slot overlapping the socket or node
  slots (``SLOT<n>_CoSchedSpareSlot``), which runs only the spare-capacity jobs pinned to it;
- on an overcommitting node (``multiplicity`` M above 1; paper 004) its socket slots with each
  core counted M times and ``SLOT<n>_CoSchedMultiplicity = M``, which run only the opted-in jobs
  pinned to them (config.d/20), so HTCondor's own accounting holds each core to M jobs;
- machine totals (NUM_CPUS, MEMORY, MACHINE_RESOURCE_*), which are the sums (a GUEST or SPARE
  slot's cores and memory are counted twice: that is what makes it overlap);
- ``SLOT<n>_LLCCacheId`` (socket slots) and ``SLOT<n>_<device name attribute>`` (device
  slots, e.g. ``PhiDeviceName``) for STARTD_ATTRS;
- on a GPU node (``gpus`` in the node config) one partitionable slot of all cores and
  memory and every GPU k's CoSchedGPU<k>Memory / CoSchedGPU<k>Compute (1000 times the node's
  ``gpu_compute_overcommit``), the GPUs' properties and CoSchedGPUSingleAccount
  (``render_gpu_node``), taken from ``nvidia-smi`` when it runs (or saved
  ``condor_gpu_discovery -properties`` output), else from the node config.

Every value read from the file or from micinfo is validated; bad input exits 2 with the
reason on stderr and prints nothing.

Usage (as root, on the execute node; the startd reads the file at its next reconfig):
  discover_devices.py --output /etc/condor/config.d/31-cosched-slots.conf
Several startds on one host: --node-config /etc/condor_sched/nodes/node1.json --local-name NODE1
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from typing import Iterable

from cosched_node import gpus as gpu_tools
from cosched_node.config import DEFAULT_NODE_CONFIG, MAX_MULTIPLICITY, parse_device_kind, plain_absolute_path
from cosched_node.config import parse_node_config as parse_full_config
from cosched_node.errors import ConfigError
from cosched_node.rules import NODE_RE
from cosched_node.state import replace_file
from cosched_node.gpus import WHOLE_GPU_COMPUTE

DEVICE_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")
LOCAL_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")
MAX_INT = 2**31 - 1
#: Knights Corner runs 4 hardware threads per core and keeps one core for its own OS
#: (a 61-core card offers 240 threads to offloaded code).
THREADS_PER_CORE = 4
RESERVED_CORES = 1


class BadInput(ValueError):
    """A node file or micinfo output that cannot be trusted."""


def _int(where: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_INT:
        raise BadInput(f"{where}: expected an integer in [{minimum}, {MAX_INT}], got {value!r}")
    return value


def _gbs(where: str, value: object) -> int:
    """Memory bandwidth in whole GB/s, rounded down (HTCondor resources are integers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_INT:
        raise BadInput(f"{where}: expected a bandwidth in GB/s, got {value!r}")
    return int(math.floor(value))


def parse_node_config(data: object) -> dict:
    """Validate the node JSON; return {"node", "cores", "memory_mb", "sockets", "devices"}."""
    if not isinstance(data, dict):
        raise BadInput("node config: top level must be an object")
    node = data.get("node")
    if not isinstance(node, str) or not NODE_RE.match(node):
        raise BadInput(f"node config: bad node name {node!r}")
    cores = _int("cores", data.get("cores"), 1)
    memory_mb = _int("memory_mb", data.get("memory_mb"), 1)
    slots = data.get("slots")
    if not isinstance(slots, list) or not slots or len(slots) > 64:
        raise BadInput("node config: 'slots' must be a list of 1 to 64 entries")
    if data.get("gpus") is not None or any(isinstance(s, dict) and s.get("kind") == "gpu-node" for s in slots):
        return _parse_gpu_node(data, node, cores, memory_mb)
    sockets, devices, shared, spare = [], [], [], []
    for i, s in enumerate(slots):
        where = f"slots[{i}]"
        if not isinstance(s, dict):
            raise BadInput(f"{where}: must be an object")
        if _int(f"{where}.slot_id", s.get("slot_id"), 1) != i + 1:
            raise BadInput(f"{where}: slot ids must be 1, 2, ... in order")
        common = {"cores": _int(f"{where}.cores", s.get("cores"), 1),
                  "memory_mb": _int(f"{where}.memory_mb", s.get("memory_mb"), 1)}
        if s.get("kind") == "spare":
            if i != len(slots) - 1 or spare:
                raise BadInput(f"{where}: the spare slot must be the last slot, and the only one")
            spare.append(common)
        elif s.get("kind") in ("node", "guest"):
            if i != len(shared) or (s["kind"] == "guest") != (i == 1):
                raise BadInput(f"{where}: a node slot and then its guest slot must come first")
            if s["kind"] == "guest" and (common["cores"], common["memory_mb"]) != (shared[0]["cores"],
                                                                                  shared[0]["memory_mb"]):
                raise BadInput(f"{where}: the guest slot must have its node slot's cores and memory")
            shared.append(common)
        elif s.get("kind") == "socket":
            if devices or shared:
                raise BadInput(f"{where}: socket slots must come before device slots")
            # No resctrl or no L3 cache id on the node: no LLCCacheId, and 0 LLC ways (unknown).
            sockets.append({**common,
                            "cache_id": _int(f"{where}.cache_id", s["cache_id"]) if "cache_id" in s else None,
                            "llc_ways": _int(f"{where}.llc_ways", s["llc_ways"], 1) if "llc_ways" in s else 0,
                            "mem_bw_gbs": _gbs(f"{where}.mem_bw_gbs", s.get("mem_bw_gbs"))})
        elif s.get("kind") == "device":
            name = s.get("device")
            if not isinstance(name, str) or not DEVICE_NAME.match(name):
                raise BadInput(f"{where}: bad device name {name!r}")
            if any(d["name"] == name for d in devices):
                raise BadInput(f"{where}: device {name} repeats")
            try:
                kind = parse_device_kind(s.get("device_kind"), where)
            except ConfigError as e:
                raise BadInput(str(e)) from None
            devices.append({**common, "name": name, "kind": kind,
                            "device_memory_mb": _int(f"{where}.device_memory_mb", s.get("device_memory_mb"), 1),
                            "hardware_threads": _int(f"{where}.hardware_threads", s.get("hardware_threads"), 1)})
        else:
            raise BadInput(f"{where}: kind must be 'socket', 'device', 'node', 'guest' or 'spare', "
                           f"got {s.get('kind')!r}")
    if len(shared) == 1:
        raise BadInput("node config: a node slot needs its guest slot")
    if not sockets and not shared:
        raise BadInput("node config: no socket or node slot")
    real = sockets + shared[:1] + devices  # the guest slot overlaps the node slot
    if sum(x["cores"] for x in real) > cores or sum(x["memory_mb"] for x in real) > memory_mb:
        raise BadInput("node config: slots hold more cores or memory than the node")
    cpu_slots = sockets + shared[:1]      # the spare slot overlaps these
    if spare and (spare[0]["cores"] > sum(x["cores"] for x in cpu_slots)
                  or spare[0]["memory_mb"] > sum(x["memory_mb"] for x in cpu_slots)):
        raise BadInput("node config: the spare slot holds more cores or memory than the socket / node slots")
    multiplicity = _int("multiplicity", data.get("multiplicity", 1), 1)
    if multiplicity > MAX_MULTIPLICITY:
        raise BadInput(f"node config: 'multiplicity' must be 1 to {MAX_MULTIPLICITY}, got {multiplicity}")
    if multiplicity > 1 and (devices or shared or spare):
        raise BadInput("node config: an overcommitting node ('multiplicity' above 1) has socket slots only")
    return {"node": node, "cores": cores, "memory_mb": memory_mb, "sockets": sockets, "devices": devices,
            "shared": shared, "spare": spare[0] if spare else None, "multiplicity": multiplicity}


def _parse_gpu_node(data: dict, node: str, cores: int, memory_mb: int) -> dict:
    """A GPU node (issue 13): one gpu-node slot of all cores and memory, and its GPUs."""
    slots = data["slots"]
    if len(slots) != 1 or not isinstance(slots[0], dict) or slots[0].get("kind") != "gpu-node" \
            or slots[0].get("slot_id") != 1:
        raise BadInput("node config: a GPU node has exactly one slot, slot 1 of kind gpu-node")
    if (_int("slots[0].cores", slots[0].get("cores"), 1), _int("slots[0].memory_mb", slots[0].get("memory_mb"), 1)) \
            != (cores, memory_mb):
        raise BadInput("node config: a GPU node's slot holds all its cores and memory")
    try:
        config = parse_full_config(data)
    except ConfigError as e:
        raise BadInput(str(e)) from None
    return {"node": node, "cores": cores, "memory_mb": memory_mb, "sockets": [], "devices": [], "shared": [],
            "gpus": [{"uuid": g.uuid, "model": g.model, "memory_mb": g.memory_mb, "capability": g.capability}
                     for g in config.gpus],
            "gpu_compute": config.gpu_compute, "single_account": config.single_account}


def merge_gpus(node: dict, found: list, source: str, warn=lambda msg: None) -> dict:
    """The node with each GPU's model, memory and capability taken from a tool's report
    (``gpus.GpuInfo`` list, matched by uuid: the inventory and the hardware must agree on
    which GPU is index k)."""
    by_uuid = {g.uuid: g for g in found}
    gpus = []
    for k, g in enumerate(node["gpus"]):
        seen = by_uuid.get(g["uuid"])
        if seen is None:
            warn(f"GPU {k} ({g['uuid']}) of {node['node']} not reported by {source}; using the node config")
            gpus.append(g)
        else:
            gpus.append({**g, "model": seen.model, "memory_mb": seen.memory_mb, "capability": seen.capability})
    for extra in sorted(set(by_uuid) - {g["uuid"] for g in node["gpus"]}):
        warn(f"{source} reports GPU {extra}, which the inventory of {node['node']} does not list; ignored")
    return {**node, "gpus": gpus}


def _classad_string(value: str) -> str:
    if not re.match(r"^[A-Za-z0-9 ._()/+:-]{1,80}$", value):
        raise BadInput(f"value {value[:40]!r} cannot be a ClassAd string here")
    return f'"{value}"'


def render_gpu_node(node: dict, local_name: str = "") -> str:
    """A GPU node's startd: one partitionable slot of all cores and memory and, for every GPU
    k, the custom resources CoSchedGPU<k>Memory (MB) and CoSchedGPU<k>Compute (thousandths:
    1000 times the node's ``gpu_compute_overcommit``), so HTCondor itself accounts every GPU's
    share; the GPUs' properties and CoSchedGPUSingleAccount (the node config's
    ``mps.single_account``: every job runs under one execute account) as slot attributes;
    and what the clauses condor_submit adds for request_GPUs, request_GPUMemory,
    request_GPUCompute and require_gpus compare against: HTCondor's own GPUs resource as a
    plain count of the node's GPUs (a whole-GPU claim's RequestGPUs must be carved from it;
    without it the startd refuses the claim), GPUMemory / GPUCompute (the most any one GPU
    has free) and AvailableGPUs (every GPU's properties)."""
    p = local_name + "." if local_name else ""
    gpus = node["gpus"]
    lines = [f"# slots of {node['node']} (a GPU node): generated by discover_devices.py; do not edit",
             f"{p}NUM_CPUS = {node['cores']}", f"{p}MEMORY = {node['memory_mb']}",
             f"{p}MACHINE_RESOURCE_LLCWays = 0", f"{p}MACHINE_RESOURCE_MemBW = 0"]
    amounts = []
    compute = node.get("gpu_compute", WHOLE_GPU_COMPUTE)
    for k, g in enumerate(gpus):
        lines += [f"{p}MACHINE_RESOURCE_CoSchedGPU{k}Memory = {g['memory_mb']}",
                  f"{p}MACHINE_RESOURCE_CoSchedGPU{k}Compute = {compute}"]
        amounts.append(f"CoSchedGPU{k}Memory={g['memory_mb']}, CoSchedGPU{k}Compute={compute}")
    lines += [f"{p}MACHINE_RESOURCE_GPUs = {len(gpus)}",
              f"{p}SLOT_TYPE_1 = cpus={node['cores']}, memory={node['memory_mb']}, {', '.join(amounts)}, "
              f"GPUs={len(gpus)}, LLCWays=0, MemBW=0"]
    s = f"{p}SLOT1_"
    lines += [f"{s}CoSchedGPUNode = True", f"{s}CoSchedGPUCount = {len(gpus)}",
              f"{s}CoSchedGPUSingleAccount = {node.get('single_account') is True}"]
    for k, g in enumerate(gpus):
        lines += [f"{s}CoSchedGPU{k}Uuid = {_classad_string(g['uuid'])}",
                  f"{s}CoSchedGPU{k}DeviceName = {_classad_string(g['model'])}",
                  f"{s}CoSchedGPU{k}Capability = {float(g['capability']):.1f}",
                  f"{s}CoSchedGPU{k}GlobalMemoryMb = {g['memory_mb']}"]
    memory = ", ".join(f"CoSchedGPU{k}Memory" for k in range(len(gpus)))
    compute_free = ", ".join(f"CoSchedGPU{k}Compute" for k in range(len(gpus)))
    available = ", ".join(f"[ Id = {_classad_string(g['uuid'])}; DeviceName = {_classad_string(g['model'])}; "
                          f"Capability = {float(g['capability']):.1f}; GlobalMemoryMb = {g['memory_mb']} ]"
                          for g in gpus)
    lines += [f"{s}GPUMemory = max({{ {memory} }})", f"{s}GPUCompute = max({{ {compute_free} }})",
              f"{s}AvailableGPUs = {{ {available} }}",
              f"{p}NUM_SLOTS_TYPE_1 = 1", f"{p}SLOT_TYPE_1_PARTITIONABLE = True"]
    return "\n".join(lines) + "\n"


_DEVICE_LINE = re.compile(r"^\s*Device No:\s*(\d+)\s*,\s*Device Name:\s*(\S+)\s*$")
_FIELD_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*$")


def parse_micinfo(text: str) -> dict[str, dict[str, int]]:
    """Device name -> {"device_memory_mb", "hardware_threads"} from ``micinfo`` output.

    Reads each "Device No: N, Device Name: micN" section's "GDDR Size : <n> MB" and
    "Total No of Active Cores : <n>" lines; a section missing either, or holding a
    malformed value, is left out. Names must look like ``mic<N>``.
    """
    devices: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines()[:100000]:
        m = _DEVICE_LINE.match(line)
        if m:
            name = m.group(2)
            current = {} if re.match(r"^mic\d{1,3}$", name) and name not in devices else None
            if current is not None:
                devices[name] = current
            continue
        if current is None:
            continue
        f = _FIELD_LINE.match(line)
        if not f:
            continue
        key, value = f.group(1).strip().lower(), f.group(2)
        if key == "gddr size":
            v = re.match(r"^(\d{1,9})\s*(MB|GB)$", value, re.IGNORECASE)
            memory_mb = int(v.group(1)) * (1024 if v.group(2).upper() == "GB" else 1) if v else 0
            if 0 < memory_mb <= MAX_INT:       # HTCondor reads a machine resource as a 32-bit int
                current["device_memory_mb"] = memory_mb
        elif key == "total no of active cores":
            v = re.match(r"^(\d{1,5})$", value)
            if v and int(v.group(1)) > RESERVED_CORES:
                current["hardware_threads"] = (int(v.group(1)) - RESERVED_CORES) * THREADS_PER_CORE
    return {n: d for n, d in devices.items()
            if set(d) == {"device_memory_mb", "hardware_threads"} and d["device_memory_mb"] > 0}


def merge_micinfo(node: dict, found: dict[str, dict[str, int]], warn=lambda msg: None) -> dict:
    """The node with device memory and threads taken from micinfo where it names the device."""
    devices = []
    for d in node["devices"]:
        if d["kind"].discovery != "micinfo":
            devices.append(d)
        elif d["name"] in found:
            devices.append({**d, **found[d["name"]]})
        else:
            warn(f"device {d['name']} of {node['node']} not reported by micinfo; using the node config")
            devices.append(d)
    for extra in sorted(set(found) - {d["name"] for d in node["devices"]}):
        warn(f"micinfo reports {extra}, which the inventory of {node['node']} does not list; ignored")
    return {**node, "devices": devices}


def _total(what: str, amounts: Iterable[int]) -> int:
    """A machine total, which HTCondor reads as a 32-bit int: BadInput beyond it."""
    total = sum(amounts)
    if total > MAX_INT:
        raise BadInput(f"the node's {what} totals {total}, more than {MAX_INT}")
    return total


def render_slots(node: dict, local_name: str = "", node_config_path: str = DEFAULT_NODE_CONFIG) -> str:
    """The config lines of one startd for a validated node: the node's only startd (no local
    name: plain knobs, and what the startd reads only unprefixed), or the startd of local name
    ``local_name`` among several on one host (its knobs ``<LOCAL_NAME>.``-prefixed, then its
    node config, hook arguments and node agent, and the unprefixed declarations every startd
    of the host needs: :func:`_startd_knobs`; several startds' outputs concatenate)."""
    if local_name and not LOCAL_NAME.match(local_name):
        raise BadInput(f"bad local name {local_name!r}")
    text = render_gpu_node(node, local_name) if node.get("gpus") else _render_cpu_node(node, local_name)
    if local_name:
        return text + _startd_knobs(node, text, local_name, node_config_path)
    return text + _host_knobs(node, text)


#: HTCondor's default MAX_SLOT_TYPES: a node with more slot types must raise it.
DEFAULT_MAX_SLOT_TYPES = 10
#: On a GPU node the starter's own GPU variables go here, not to CUDA_VISIBLE_DEVICES, which the
#: PREPARE_JOB hook sets (HTCondor 25 sets CUDA_VISIBLE_DEVICES=10000 after the hook otherwise).
GPU_STARTER_ENVIRONMENT = "ENVIRONMENT_FOR_AssignedGPUs = COSCHED_HTCONDOR_ASSIGNED_GPUS"


def _host_knobs(node: dict, text: str) -> str:
    """What a one-startd node also needs: MAX_SLOT_TYPES when it has more slot types than the
    default, and on a GPU node the starter's GPU variables out of the hook's way."""
    types = len(re.findall(r"^SLOT_TYPE_\d+ = ", text, re.MULTILINE))
    lines = [f"MAX_SLOT_TYPES = {types}"] if types > DEFAULT_MAX_SLOT_TYPES else []
    if node.get("gpus"):
        lines.append(GPU_STARTER_ENVIRONMENT)
    return "".join(line + "\n" for line in lines)


def _startd_knobs(node: dict, text: str, local_name: str, node_config_path: str) -> str:
    """One startd among several on a host (docs/admin.md, "Several startds on one host"): its
    node config for the startd cron (``L.COSCHED_NODE_CONFIG``), its address file, the hook's
    node config and (GPU node) the starter's GPU variables through ``L_ENVIRONMENT`` (its
    starters run as ``slot_type_<n>``, never as ``L``), its own node agent in
    ``COSCHED_NODE_AGENTS``, and what the startd reads only unprefixed: every custom resource
    it uses declared at 0 (its prefixed line sets the amount), its slot types partitionable."""
    if not plain_absolute_path(node_config_path):
        raise BadInput(f"--node-config {node_config_path!r}: a startd's config needs an absolute plain path here")
    name, agent = node["node"], f"COSCHED_NODE_AGENT_{local_name}"
    address = f"$(LOG)/.startd_address.{name}"
    environment = [f"_CONDOR_COSCHED_HOOK_PREPARE_JOB_ARGS='--node-config {node_config_path}'"]
    if node.get("gpus"):
        environment.append("_CONDOR_" + GPU_STARTER_ENVIRONMENT.replace(" = ", "="))
    prefix = re.escape(local_name) + r"\."
    resources = sorted(set(re.findall(rf"^{prefix}MACHINE_RESOURCE_(\w+) = ", text, re.MULTILINE)))
    types = sorted({int(t) for t in re.findall(rf"^{prefix}SLOT_TYPE_(\d+) = ", text, re.MULTILINE)})
    lines = [f"# startd {local_name} (node {name}): its node config, hook arguments and node agent",
             f"{local_name}.COSCHED_NODE_CONFIG = {node_config_path}",
             f"{local_name}.STARTD_ADDRESS_FILE = {address}",
             f'{local_name}_ENVIRONMENT = "{" ".join(environment)}"',
             f"{agent} = $(COSCHED_PYTHON)",
             f"{agent}_ARGS = -Es $(COSCHED_NODE_HOOKS)/cosched_node_agent.py --node-config {node_config_path} "
             f"--startd-address-file {address}",
             f"COSCHED_NODE_AGENTS = $(COSCHED_NODE_AGENTS) {agent}",
             "# read only unprefixed, for every startd of the host",
             *[f"MACHINE_RESOURCE_{r} = 0" for r in resources],
             *[f"SLOT_TYPE_{t}_PARTITIONABLE = True" for t in types]]
    if len(types) > DEFAULT_MAX_SLOT_TYPES:
        lines.append(f"MAX_SLOT_TYPES = {len(types)}")
    return "".join(line + "\n" for line in lines)


def _render_cpu_node(node: dict, local_name: str) -> str:
    p = local_name + "." if local_name else ""
    sockets, devices, shared = node["sockets"], node["devices"], node.get("shared", [])
    kinds = list({d["kind"].name: d["kind"] for d in devices}.values())
    none = {"cores": 0, "memory_mb": 0}
    guest = shared[1] if shared else none
    spare = node.get("spare") or none
    m = node.get("multiplicity", 1)   # an overcommitting node counts each core m times (socket slots only)
    lines = [f"# slots of {node['node']}: generated by discover_devices.py; do not edit",
             f"{p}NUM_CPUS = {_total('NUM_CPUS', (m * node['cores'], guest['cores'], spare['cores']))}",
             f"{p}MEMORY = {_total('MEMORY', (node['memory_mb'], guest['memory_mb'], spare['memory_mb']))}"]
    for k in kinds:
        lines += [f"{p}MACHINE_RESOURCE_{k.memory_attr} = "
                  f"{_total(k.memory_attr, (d['device_memory_mb'] for d in devices if d['kind'] == k))}",
                  f"{p}MACHINE_RESOURCE_{k.compute_attr} = "
                  f"{_total(k.compute_attr, (d['hardware_threads'] for d in devices if d['kind'] == k))}"]
    lines += [f"{p}MACHINE_RESOURCE_LLCWays = {sum(s['llc_ways'] for s in sockets)}",
              f"{p}MACHINE_RESOURCE_MemBW = {sum(s['mem_bw_gbs'] for s in sockets)}"]

    def device_amounts(own: object, memory_mb: int, compute: int) -> str:
        """Every device kind's two resources on a slot type: its own device's, 0 for the others."""
        return "".join(f"{k.memory_attr}={memory_mb if k == own else 0}, {k.compute_attr}={compute if k == own else 0}, "
                       for k in kinds)

    slot_id = 0
    for s, attr in zip(shared, ("CoSchedNodeSlot", "CoSchedGuestSlot")):
        slot_id += 1
        lines += [f"{p}SLOT_TYPE_{slot_id} = cpus={s['cores']}, memory={s['memory_mb']}, "
                  f"{device_amounts(None, 0, 0)}LLCWays=0, MemBW=0",
                  f"{p}SLOT{slot_id}_{attr} = True"]
    for s in sockets:
        slot_id += 1
        lines += [f"{p}SLOT_TYPE_{slot_id} = cpus={m * s['cores']}, memory={s['memory_mb']}, "
                  f"{device_amounts(None, 0, 0)}LLCWays={s['llc_ways']}, MemBW={s['mem_bw_gbs']}",
                  *([f"{p}SLOT{slot_id}_LLCCacheId = {s['cache_id']}"] if s["cache_id"] is not None else []),
                  *([f"{p}SLOT{slot_id}_CoSchedMultiplicity = {m}"] if m > 1 else [])]
    for d in devices:
        slot_id += 1
        lines += [f"{p}SLOT_TYPE_{slot_id} = cpus={d['cores']}, memory={d['memory_mb']}, "
                  f"{device_amounts(d['kind'], d['device_memory_mb'], d['hardware_threads'])}LLCWays=0, MemBW=0",
                  f'{p}SLOT{slot_id}_{d["kind"].device_name_attr} = "{d["name"]}"']
    if node.get("spare"):
        slot_id += 1
        lines += [f"{p}SLOT_TYPE_{slot_id} = cpus={spare['cores']}, memory={spare['memory_mb']}, "
                  f"{device_amounts(None, 0, 0)}LLCWays=0, MemBW=0",
                  f"{p}SLOT{slot_id}_CoSchedSpareSlot = True"]
    for i in range(1, slot_id + 1):
        lines += [f"{p}NUM_SLOTS_TYPE_{i} = 1", f"{p}SLOT_TYPE_{i}_PARTITIONABLE = True"]
    return "\n".join(lines) + "\n"


NVIDIA_SMI_QUERY = ("--query-gpu=index,uuid,name,memory.total,compute_cap", "--format=csv,noheader")


def discover_gpus(node: dict, nvidia_smi: str | None, gpu_discovery: str | None, warn) -> dict:
    """A GPU node's GPUs from nvidia-smi when it runs (as micinfo is for Xeon Phi), else from
    saved condor_gpu_discovery output, else as the node config lists them. Garbage output is
    an error (exit 2: the startd keeps its old slots), not a silent fallback."""
    if nvidia_smi and not shutil.which(nvidia_smi):
        with open(nvidia_smi, encoding="utf-8", errors="replace") as f:
            return merge_gpus(node, gpu_tools.parse_query_gpu(f.read(1_000_000)), "nvidia-smi", warn)
    exe = shutil.which(nvidia_smi or "nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, *NVIDIA_SMI_QUERY], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0:
            return merge_gpus(node, gpu_tools.parse_query_gpu(out.stdout[:1_000_000].decode("utf-8", "replace")),
                              "nvidia-smi", warn)
        warn(f"{exe} failed; GPUs of {node['node']} from the node config")
    if gpu_discovery:
        with open(gpu_discovery, encoding="utf-8", errors="replace") as f:
            return merge_gpus(node, gpu_tools.parse_gpu_discovery(f.read(1_000_000)), "condor_gpu_discovery", warn)
    return node


def run_micinfo(path: str) -> str | None:
    try:
        out = subprocess.run([path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout[:4_000_000].decode("utf-8", errors="replace") if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node-config", default=DEFAULT_NODE_CONFIG,
                    help=f"the node's JSON file (default {DEFAULT_NODE_CONFIG})")
    ap.add_argument("--local-name", default="",
                    help="several startds on one host: this one's local name, e.g. NODE1 (default: none)")
    ap.add_argument("--output", default="-",
                    help="write the lines to this file, replaced atomically and only on success (default: stdout)")
    ap.add_argument("--micinfo", default=None,
                    help="micinfo executable (default: from PATH), or a file of its saved output")
    ap.add_argument("--nvidia-smi", default=None,
                    help="GPU nodes: nvidia-smi executable (default: from PATH), or a file of the saved output "
                         "of " + " ".join(NVIDIA_SMI_QUERY))
    ap.add_argument("--gpu-discovery", default=None,
                    help="GPU nodes without nvidia-smi: a file of saved `condor_gpu_discovery -properties` output")
    args = ap.parse_args(argv)

    def warn(msg: str) -> None:
        print(f"discover_devices: {msg}", file=sys.stderr)

    try:
        with open(args.node_config, encoding="utf-8") as f:
            node = parse_node_config(json.loads(f.read(1_000_000)))
        text = None
        if args.micinfo and not shutil.which(args.micinfo):
            with open(args.micinfo, encoding="utf-8", errors="replace") as f:
                text = f.read(4_000_000)
        else:
            exe = shutil.which(args.micinfo or "micinfo")
            text = run_micinfo(exe) if exe else None
        if text is not None:
            node = merge_micinfo(node, parse_micinfo(text), warn)
        if node.get("gpus"):
            node = discover_gpus(node, args.nvidia_smi, args.gpu_discovery, warn)
        text = render_slots(node, args.local_name, os.path.abspath(args.node_config))
        if args.output == "-":
            sys.stdout.write(text)
        else:
            replace_file(args.output, text)   # the startd never reads half a file
    except (OSError, ValueError) as e:
        warn(str(e))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
