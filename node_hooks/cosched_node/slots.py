"""The slot view: the startd's own account of its claims, the node agent's source of truth.

What the agent enforces (a device job's memory and compute, a spread job's LLC ways and
memory bandwidth) is what HTCondor allocated to the job's dynamic slot: the startd carved
it from the partitionable slot of the device or socket when it accepted the claim, and no
job can change it. The agent asks the startd directly (``condor_status -direct <address>
-json``, the address from the startd's address file, which only condor writes), and takes
the claim's starter pid from the same ad (``StarterPid``), so it finds a job's processes
without trusting anything the job wrote.

A few job attributes reach the slot ad through ``STARTD_JOB_ATTRS`` (config.d/20):
``CoSchedProgram``, ``CoSchedPinSlot``, ``CoSchedPinScale`` and ``CoSchedPinNodes``, as the
schedd handed them over at the claim; they only label run records, never size a limit.
``CoSchedPinMate`` (a guest's mate, "Cluster.Proc", set by the sidecar and protected) and
``CoSchedMalleable`` name which node-slot claim a guest shares cores with (issue 14); the
cores themselves come from the claims' ``Cpus`` and the root-owned node config.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cosched_node import rules
from cosched_node.gpus import GpuError, GpuShare, claim_shares
from cosched_node.config import NodeConfig
from cosched_node.errors import StateError

#: The job attributes config.d/20 copies into slot ads (STARTD_JOB_ATTRS).
JOB_ATTRS = ("CoSchedProgram", "CoSchedPinSlot", "CoSchedPinScale", "CoSchedPinNodes", "CoSchedPinMate",
             "CoSchedMalleable")
SLOT_ATTRS = ("Name", "SlotType", "State", "JobId", "StarterPid", "ParentSlotId", "RemoteUser",
              "Cpus", "Memory", "LLCWays", "MemBW")
SINFUL_RE = re.compile(r"^<[\x21-\x3d\x3f-\x7e]{1,1024}>$")
MAX_VIEW_BYTES = 1 << 24
QUERY_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Claim:
    """One running claim (a dynamic slot with a starter) as the startd reports it."""
    slot: str                 # short dynamic slot name, slot3_1
    slot_id: int              # its partitionable slot's id (ParentSlotId)
    job: str                  # ClusterId.ProcId
    starter_pid: int
    remote_user: str
    cpus: int
    memory_mb: int            # host memory
    device: Optional[str]     # device name (device slots)
    device_memory_mb: int     # allocated device memory (device slots)
    compute: int              # allocated device compute units (device slots)
    llc_ways: int             # allocated LLC ways (socket slots)
    mem_bw_gbs: float         # allocated memory bandwidth (socket slots)
    program: Optional[str]    # CoSchedProgram, when valid
    pinned: bool              # CoSchedPinSlot was set: the sidecar placed it
    scale: int                # CoSchedPinScale (0 when unset or invalid)
    nodes: int                # CoSchedPinNodes (0 when unset or invalid)
    mate: Optional[str] = None  # CoSchedPinMate: a guest's mate job id, when a valid Cluster.Proc
    malleable: bool = False     # CoSchedMalleable is true
    gpus: Tuple[GpuShare, ...] = ()  # GPU nodes: the GPUs the claim holds (CoSchedGPU<k>Memory/Compute)

    @property
    def cluster(self) -> int:
        return int(self.job.split(".")[0])

    @property
    def proc(self) -> int:
        return int(self.job.split(".")[1])


def _optional(value: Any, check) -> Any:
    try:
        return check(value)
    except rules.RuleError:
        return None


def parse_claims(ads: Any, config: NodeConfig) -> Tuple[List[Claim], List[str]]:
    """Claims from the startd's slot ads (a JSON list), and why any ad was left out."""
    if not isinstance(ads, list):
        raise ValueError("the startd's answer is not a list of slot ads")
    claims: List[Claim] = []
    problems: List[str] = []
    for index, ad in enumerate(ads):
        if not isinstance(ad, dict) or ad.get("SlotType") != "Dynamic" or ad.get("State") != "Claimed" \
                or ad.get("StarterPid") is None:
            continue
        try:
            claims.append(_claim(ad, config))
        except (rules.RuleError, KeyError, ValueError) as exc:
            problems.append(f"slot ad #{index} ({str(ad.get('Name'))[:80]!r}): {exc}")
    return claims, problems


def _claim(ad: Dict[str, Any], config: NodeConfig) -> Claim:
    name = ad.get("Name")
    match = rules.SLOT_NAME_RE.match(name) if isinstance(name, str) else None
    if not match or match.group(3) is None:
        raise ValueError("Name is not a dynamic slot name")
    job = ad.get("JobId")
    if not isinstance(job, str) or not rules.JOB_ID_RE.match(job):
        raise ValueError("JobId is not ClusterId.ProcId")
    slot_id = rules.count("ParentSlotId", ad.get("ParentSlotId"), 1, 9999)
    if slot_id != int(match.group(2)):
        raise ValueError("ParentSlotId does not match the slot's name")
    slot = config.slot(slot_id)
    device, device_memory, compute = None, 0, 0
    if slot is not None and slot.kind == "device":
        kind = slot.device_kind
        device = slot.device
        named = ad.get(kind.device_name_attr)
        if named is not None and named != device:
            raise ValueError(f"{kind.device_name_attr} {str(named)[:40]!r} is not slot{slot_id}'s device {device}")
        device_memory = rules.count(kind.memory_attr, ad.get(kind.memory_attr, 0), 0, rules.MAX_INT)
        compute = rules.count(kind.compute_attr, ad.get(kind.compute_attr, 0), 0, rules.MAX_UNITS)
    user = ad.get("RemoteUser")
    try:
        gpu_node = slot is not None and slot.kind == "gpu-node"
        gpus = claim_shares(ad, len(config.gpus), config.gpu_compute) if gpu_node else ()
    except GpuError as exc:
        raise ValueError(str(exc)) from None
    return Claim(
        slot=match.group(1), slot_id=slot_id, job=job,
        starter_pid=rules.count("StarterPid", ad.get("StarterPid"), 2, 2 ** 22),
        remote_user=user[:128] if isinstance(user, str) else "",
        cpus=rules.count("Cpus", ad.get("Cpus", 0), 0, 100000),
        memory_mb=rules.count("Memory", ad.get("Memory", 0), 0, rules.MAX_INT),
        device=device, device_memory_mb=device_memory, compute=compute,
        llc_ways=rules.llc_ways(ad.get("LLCWays", 0), "LLCWays"),
        mem_bw_gbs=rules.mem_bw_gbs(ad.get("MemBW", 0), "MemBW"),
        program=_optional(ad.get("CoSchedProgram"), rules.program_name),
        pinned=isinstance(ad.get("CoSchedPinSlot"), str),
        scale=_optional(ad.get("CoSchedPinScale"), rules.scale_factor) or 0,
        nodes=_optional(ad.get("CoSchedPinNodes"), lambda v: rules.count("CoSchedPinNodes", v, 1, 100000)) or 0,
        mate=_mate(ad.get("CoSchedPinMate")), malleable=ad.get("CoSchedMalleable") is True, gpus=gpus)


def _mate(value: Any) -> Optional[str]:
    """A valid ``CoSchedPinMate`` ("Cluster.Proc"), else None."""
    return value if isinstance(value, str) and rules.JOB_ID_RE.match(value) else None


def startd_address(path: str) -> str:
    """The startd's address (first line of its address file, written by condor only)."""
    try:
        with open(path, "rb") as handle:
            first = handle.read(4096).decode("ascii", "replace").splitlines()[:1]
    except OSError as exc:
        raise StateError(exc.errno or 0, f"startd address file {path}: {exc.strerror}") from None
    if not first or not SINFUL_RE.match(first[0].strip()):
        raise StateError(0, f"startd address file {path} holds no address")
    return first[0].strip()


class SlotView:
    """Reads the claims of one startd through ``condor_status -direct`` (list argv, no shell)."""

    def __init__(self, config: NodeConfig, address_file: str, condor_status: str = "condor_status") -> None:
        self.config = config
        self.address_file = address_file
        self.condor_status = condor_status

    def attributes(self) -> Sequence[str]:
        kinds = {d.device_kind for d in self.config.devices}
        extra = [a for k in kinds for a in (k.memory_attr, k.compute_attr, k.device_name_attr)]
        extra += [f"CoSchedGPU{g.index}{what}" for g in self.config.gpus for what in ("Memory", "Compute")]
        return tuple(dict.fromkeys((*SLOT_ATTRS, *extra, *JOB_ATTRS)))

    def read(self) -> Tuple[List[Claim], List[str]]:
        """The running claims now; StateError when the startd does not answer."""
        argv = [self.condor_status, "-direct", startd_address(self.address_file), "-json",
                "-attributes", ",".join(self.attributes()), "-constraint", 'SlotType == "Dynamic"']
        try:
            out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=QUERY_TIMEOUT_S,
                                 check=False, env={**os.environ, "TZ": "UTC"})
        except (OSError, subprocess.SubprocessError) as exc:
            raise StateError(0, f"condor_status failed: {exc}") from None
        if out.returncode != 0 or len(out.stdout) > MAX_VIEW_BYTES:
            message = out.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            raise StateError(0, f"condor_status -direct exited {out.returncode}: {message[0][:200]}")
        text = out.stdout.decode("utf-8", "replace").strip()
        try:
            ads = json.loads(text) if text else []
        except (ValueError, RecursionError):
            raise StateError(0, "condor_status -direct printed no JSON") from None
        if not isinstance(ads, list):
            raise StateError(0, "condor_status -direct printed no list of slot ads")
        return parse_claims(ads, self.config)
