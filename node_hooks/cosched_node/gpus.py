"""NVIDIA GPUs on a GPU node (issue 13): the pure parts the node programs share.

- what ``nvidia-smi --query-gpu=index,uuid,name,memory.total,compute_cap --format=csv,noheader``
  and ``condor_gpu_discovery -properties`` print about a node's GPUs (MIG instances are
  separate GPUs, named by their ``MIG-...`` uuid), and what
  ``nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits``
  prints about the processes using them;
- a claim's GPUs from its dynamic slot ad (``CoSchedGPU<k>Memory`` / ``CoSchedGPU<k>Compute``,
  which the startd carved from the node's partitionable slot: no job can write them);
- the MPS environment of a job on those GPUs, and which jobs hold more GPU memory than
  their claim.

Every field of every tool's output is validated; garbage raises ``GpuError`` naming the line
and the field. Nothing here runs a program or reads a file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

#: The most GPUs of one node (config.d/10's transform covers CoSchedGPU0..7).
MAX_GPUS_PER_NODE = 8
#: Compute in thousandths of a GPU: 1000 is a whole GPU, and the most one job takes of one GPU.
WHOLE_GPU_COMPUTE = 1000
#: The highest GPU compute overcommit factor a node may set (``gpu_compute_overcommit``): each
#: GPU then offers up to MAX_GPU_COMPUTE thousandths of MPS shares.
MAX_GPU_COMPUTE_OVERCOMMIT = 4.0
MAX_GPU_COMPUTE = round(WHOLE_GPU_COMPUTE * MAX_GPU_COMPUTE_OVERCOMMIT)
#: What HTCondor's ``use feature:GPUs`` gives a job with no GPU
#: (``ENVIRONMENT_VALUE_FOR_UnAssignedGPUs``): no device index CUDA would accept.
UNASSIGNED_GPUS = "10000"
MAX_GPU_MEMORY_MB = 1 << 24          # 16 TB: more is garbage
MAX_OUTPUT_LINES = 4096

_HEX_UUID = r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
#: ``GPU-<uuid>``, ``MIG-<uuid>`` (R470 and later) or ``MIG-GPU-<uuid>/<gi>/<ci>`` (R450).
GPU_UUID_RE = re.compile(rf"^(?:GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/\d{{1,2}}/\d{{1,2}})$")
GPU_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,63}$")
_CAPABILITY_RE = re.compile(r"^(\d{1,2})\.(\d)$")
_MEMORY_RE = re.compile(r"^(\d{1,9})(?:\s*MiB)?$")
_PID_RE = re.compile(r"^\d{1,7}$")
_NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]")


class GpuError(ValueError):
    """Tool output or a slot ad about GPUs that cannot be trusted; names the line and field."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU (or MIG instance) as a tool reports it."""
    uuid: str
    model: str
    memory_mb: int
    capability: float
    index: Optional[int] = None      # the tool's own index (nvidia-smi), None from condor_gpu_discovery


@dataclass(frozen=True)
class ComputeApp:
    """One process on one GPU (``nvidia-smi --query-compute-apps``); ``used_mb`` None when the
    driver does not report it (MIG instances on some drivers)."""
    pid: int
    gpu_uuid: str
    used_mb: Optional[int]


@dataclass(frozen=True)
class GpuShare:
    """What one claim holds of GPU ``index`` of its node (the slot ad's CoSchedGPU<k>*)."""
    index: int
    memory_mb: int
    compute: int


def _uuid(value: str, where: str) -> str:
    if not GPU_UUID_RE.match(value):
        raise GpuError(f"{where}: uuid {value[:60]!r} is not GPU-<uuid> or MIG-<uuid>")
    return value


def _capability(value: str, where: str) -> float:
    match = _CAPABILITY_RE.match(value)
    if not match or int(match.group(1)) < 1:
        raise GpuError(f"{where}: compute capability {value[:20]!r} is not <major>.<minor>")
    return float(value)


def _model(value: str, where: str) -> str:
    if not GPU_MODEL_RE.match(value):
        raise GpuError(f"{where}: GPU name {value[:60]!r} has characters or a length no GPU model has")
    return value


def _memory(value: str, where: str) -> int:
    match = _MEMORY_RE.match(value)
    if not match or not 1 <= int(match.group(1)) <= MAX_GPU_MEMORY_MB:
        raise GpuError(f"{where}: memory {value[:30]!r} is not a number of MiB")
    return int(match.group(1))


def _lines(text: str, what: str) -> List[str]:
    if "\x00" in text:
        raise GpuError(f"{what}: contains a NUL byte")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > MAX_OUTPUT_LINES:
        raise GpuError(f"{what}: more than {MAX_OUTPUT_LINES} lines")
    return lines


def _check_unique(gpus: Sequence[GpuInfo], what: str) -> None:
    if len({g.uuid for g in gpus}) != len(gpus):
        raise GpuError(f"{what}: a GPU uuid repeats")


def parse_query_gpu(text: str) -> List[GpuInfo]:
    """``nvidia-smi --query-gpu=index,uuid,name,memory.total,compute_cap --format=csv,noheader``
    (with or without ``nounits``), e.g. ``0, GPU-5f1c..., Tesla T4, 15360 MiB, 7.5``."""
    gpus = []
    for number, line in enumerate(_lines(text, "nvidia-smi --query-gpu"), 1):
        where = f"nvidia-smi --query-gpu line {number}"
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise GpuError(f"{where}: {len(fields)} fields, expected 5 (index, uuid, name, memory.total, compute_cap)")
        index, uuid, name, memory, capability = fields
        if not re.match(r"^\d{1,2}$", index):
            raise GpuError(f"{where}: index {index[:20]!r} is not a GPU index")
        gpus.append(GpuInfo(_uuid(uuid, where), _model(name, where), _memory(memory, where),
                            _capability(capability, where), int(index)))
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise GpuError(f"nvidia-smi --query-gpu: {len(gpus)} GPUs, at most {MAX_GPUS_PER_NODE} per node")
    _check_unique(gpus, "nvidia-smi --query-gpu")
    return gpus


_PROPERTY_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,127})\s*=\s*(.*)$")
_RECORD_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,63})\s*=\s*(.*)$")


def _discovery_value(text: str, where: str) -> Any:
    text = text.strip()
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2 or '"' in text[1:-1] or "\\" in text:
            raise GpuError(f"{where}: malformed string {text[:40]!r}")
        return text[1:-1]
    if re.match(r"^[+-]?\d{1,12}(\.\d{1,6})?$", text):
        return float(text) if "." in text else int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise GpuError(f"{where}: value {text[:40]!r} is not a string, number or boolean")


def _discovery_record(text: str, where: str) -> Dict[str, Any]:
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise GpuError(f"{where}: not a [ ... ] record")
    record = {}
    for part in [p.strip() for p in body[1:-1].split(";") if p.strip()]:
        match = _RECORD_FIELD.match(part)
        if not match:
            raise GpuError(f"{where}: field {part[:40]!r} is not Name=value")
        record[match.group(1)] = _discovery_value(match.group(2), where)
    return record


def parse_gpu_discovery(text: str) -> List[GpuInfo]:
    """``condor_gpu_discovery -properties`` (HTCondor 10 and later: nested records):

        DetectedGPUs="GPU-c4a646d7, MIG-2f2b..."
        Common=[ Capability=7.5; DeviceName="Tesla T4"; GlobalMemoryMb=15102; ... ]
        GPU_c4a646d7=[ id="GPU-c4a646d7"; DeviceUuid="c4a646d7-aa14-..."; ... ]

    A device's own record overrides ``Common``. Its uuid is ``GPU-`` (or ``MIG-``) and its
    DeviceUuid, or its id when that is a full uuid already."""
    properties: Dict[str, str] = {}
    for number, line in enumerate(_lines(text, "condor_gpu_discovery"), 1):
        match = _PROPERTY_LINE.match(line)
        if not match:
            raise GpuError(f"condor_gpu_discovery line {number}: not Name=value")
        properties[match.group(1)] = match.group(2)
    detected = _discovery_value(properties.get("DetectedGPUs", "0"), "condor_gpu_discovery DetectedGPUs")
    if detected in (0, False):
        return []
    if not isinstance(detected, str):
        raise GpuError("condor_gpu_discovery: DetectedGPUs is not a list of GPU ids")
    ids = [i.strip() for i in detected.split(",") if i.strip()]
    if not 1 <= len(ids) <= MAX_GPUS_PER_NODE:
        raise GpuError(f"condor_gpu_discovery: {len(ids)} GPUs, expected 1 to {MAX_GPUS_PER_NODE}")
    common = _discovery_record(properties["Common"], "condor_gpu_discovery Common") if "Common" in properties else {}
    gpus = []
    for gpu_id in ids:
        where = f"condor_gpu_discovery GPU {gpu_id[:40]!r}"
        match = re.match(r"^(GPU|MIG)-([0-9a-fA-F-]{8,36}|GPU-[0-9a-fA-F-]{36}/\d{1,2}/\d{1,2})$", gpu_id)
        if not match:
            raise GpuError(f"{where}: id is not GPU-<uuid> or MIG-<uuid>")
        key = re.sub(r"[^A-Za-z0-9]", "_", gpu_id)
        if key not in properties:
            raise GpuError(f"{where}: no {key}=[ ... ] record (run with -properties)")
        record = {**common, **_discovery_record(properties[key], where)}
        device_uuid = record.get("DeviceUuid")
        if isinstance(device_uuid, str) and re.match(rf"^{_HEX_UUID}$", device_uuid):
            uuid = f"{match.group(1)}-{device_uuid}"
        else:
            uuid = gpu_id
        name, memory, capability = record.get("DeviceName"), record.get("GlobalMemoryMb"), record.get("Capability")
        if not isinstance(name, str):
            raise GpuError(f"{where}: no DeviceName")
        if isinstance(memory, bool) or not isinstance(memory, int) or not 1 <= memory <= MAX_GPU_MEMORY_MB:
            raise GpuError(f"{where}: GlobalMemoryMb {memory!r} is not a number of MB")
        if isinstance(capability, bool) or not isinstance(capability, (int, float)):
            raise GpuError(f"{where}: Capability {capability!r} is not a number")
        gpus.append(GpuInfo(_uuid(uuid, where), _model(name, where), memory,
                            _capability(f"{float(capability):.1f}", where)))
    _check_unique(gpus, "condor_gpu_discovery")
    return gpus


def parse_compute_apps(text: str) -> List[ComputeApp]:
    """``nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits``,
    e.g. ``4711, GPU-5f1c..., 4000``; ``[N/A]`` memory is None (unknown, never stopped for)."""
    if text.strip().lower().startswith("no running"):   # older drivers print a sentence
        return []
    apps = []
    for number, line in enumerate(_lines(text, "nvidia-smi --query-compute-apps"), 1):
        where = f"nvidia-smi --query-compute-apps line {number}"
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            raise GpuError(f"{where}: {len(fields)} fields, expected 3 (pid, gpu_uuid, used_memory)")
        pid, uuid, used = fields
        if not _PID_RE.match(pid) or int(pid) < 1:
            raise GpuError(f"{where}: pid {pid[:20]!r} is not a process id")
        if used in _NOT_AVAILABLE:
            used_mb = None
        else:
            match = re.match(r"^(\d{1,9})(?:\s*MiB)?$", used)
            if not match:
                raise GpuError(f"{where}: used_memory {used[:20]!r} is not a number of MiB")
            used_mb = int(match.group(1))
        apps.append(ComputeApp(int(pid), _uuid(uuid, where), used_mb))
    return apps


def claim_shares(ad: Mapping[str, Any], gpu_count: int,
                 gpu_compute: int = WHOLE_GPU_COMPUTE) -> Tuple[GpuShare, ...]:
    """The GPUs a dynamic slot holds: every k < ``gpu_count`` whose ``CoSchedGPU<k>Compute``
    is > 0 (``CoSchedGPU<k>Memory`` with it). ``ad`` maps attribute names, compared without
    case, to values; a missing amount is 0. ``gpu_compute`` is what each GPU of the node
    offers (the node config's ``gpu_compute``: 1000 times its overcommit factor), the most
    a claim can hold of one GPU. GpuError for a non-integer or out-of-range amount, or GPU
    memory without compute."""
    lowered = {str(k).lower(): v for k, v in ad.items()}
    shares = []
    for k in range(min(gpu_count, MAX_GPUS_PER_NODE)):
        amounts = []
        for what, high in (("Memory", MAX_GPU_MEMORY_MB), ("Compute", min(gpu_compute, MAX_GPU_COMPUTE))):
            value = lowered.get(f"coschedgpu{k}{what}".lower(), 0)
            value = 0 if value is None else value
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
                raise GpuError(f"attribute CoSchedGPU{k}{what} {str(value)[:30]!r} is not an integer in [0, {high}]")
            amounts.append(value)
        memory, compute = amounts
        if compute > 0:
            shares.append(GpuShare(k, memory, compute))
        elif memory > 0:
            raise GpuError(f"attribute CoSchedGPU{k}Memory is {memory} but CoSchedGPU{k}Compute is 0")
    return tuple(shares)


_PIN_GPUS_RE = re.compile(r"^[0-7](?:,[0-7]){0,7}$")


def describe_shares(shares: Sequence[GpuShare]) -> str:
    """``GPU 1 (250/1000, 3800 MB)``, one entry per share; ``no GPU`` for none."""
    return ", ".join(f"GPU {s.index} ({s.compute}/1000, {s.memory_mb} MB)" for s in shares) or "no GPU"


def pin_shares(pinned_gpus: Any, compute: Any, memory_mb: Any) -> Optional[Tuple[GpuShare, ...]]:
    """The shares a job's GPU pin asks for (``CoSchedPinGPUs`` "0,3", ``CoSchedPinGPUCompute``
    and ``CoSchedPinGPUMemory`` of each GPU: what config.d/10 turns into the claim's
    RequestCoSchedGPU<k>*); () for a job with no pin; None for a pin that does not read."""
    if pinned_gpus is None and compute is None and memory_mb is None:
        return ()
    if not isinstance(pinned_gpus, str) or not _PIN_GPUS_RE.match(pinned_gpus):
        return None
    for value, high in ((compute, MAX_GPU_COMPUTE), (memory_mb, MAX_GPU_MEMORY_MB)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            return None
    indices = sorted({int(k) for k in pinned_gpus.split(",")})
    return tuple(GpuShare(k, memory_mb, compute) for k in indices)


def pin_disagreement(shares: Sequence[GpuShare], pinned_gpus: Any, compute: Any, memory_mb: Any) -> Optional[str]:
    """Why a claim holding ``shares`` is not what the job's ad pins now, or None.

    The startd carves a claim from the pin the job ad carried when the schedd claimed the slot.
    Should the sidecar pin the job again before it starts (its pin aged out, or others crowded
    it), the claim holds the old pin's GPUs while the ad names the new ones: the job would run
    where its ad and the sidecar's books do not say. Such a start is refused (back to Idle, a
    new match carves the new pin), so every running GPU job holds exactly its pin."""
    wanted = pin_shares(pinned_gpus, compute, memory_mb)
    if wanted is None:
        return f"its GPU pin ({str(pinned_gpus)[:20]!r}) does not read, and its claim holds {describe_shares(shares)}"
    if tuple(sorted(shares, key=lambda s: s.index)) == wanted:
        return None
    if not wanted:
        return f"its claim holds {describe_shares(shares)} but the job is no longer pinned (unpinned after the match)"
    return (f"its claim holds {describe_shares(shares)} but its pin now names {describe_shares(wanted)} "
            "(pinned again after the match)")


def mps_environment(shares: Sequence[GpuShare], uuids: Sequence[str], pipe_directory: str) -> List[Tuple[str, str]]:
    """The CUDA / MPS variables of a job holding ``shares`` (``uuids[k]`` is GPU k's uuid).

    CUDA_VISIBLE_DEVICES names the GPUs by uuid (MPS renumbers devices); visible device i is
    ``shares[i]``. CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is the largest share's compute in
    percent, rounded up, at most 100 (on a node whose GPU compute is overcommitted a claim may
    hold more than 1000 thousandths of a GPU; MPS caps a client at all SMs);
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT caps each visible device at its
    claimed memory (``0=6000M,1=6000M``). Advisory: the job can change them; the node agent
    enforces the memory. No share: CUDA_VISIBLE_DEVICES=10000 (HTCondor's own value for a
    job with no GPU), and nothing else."""
    if not shares:
        return [("CUDA_VISIBLE_DEVICES", UNASSIGNED_GPUS)]
    visible = ",".join(uuids[s.index] for s in shares)
    percent = max(1, min(100, math.ceil(max(s.compute for s in shares) / 10)))
    limits = ",".join(f"{i}={s.memory_mb}M" for i, s in enumerate(shares))
    return [("CUDA_VISIBLE_DEVICES", visible), ("CUDA_MPS_PIPE_DIRECTORY", pipe_directory),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(percent)), ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limits)]


def memory_by_gpu(apps: Iterable[ComputeApp], pids: Iterable[int]) -> Dict[str, int]:
    """GPU memory (MB) the processes ``pids`` use, by GPU uuid (unknown amounts left out)."""
    mine = set(pids)
    used: Dict[str, int] = {}
    for app in apps:
        if app.pid in mine and app.used_mb is not None:
            used[app.gpu_uuid] = used.get(app.gpu_uuid, 0) + app.used_mb
    return used


def over_memory(used_by_uuid: Mapping[str, int], allowed_by_uuid: Mapping[str, int]) -> List[Tuple[str, int, int]]:
    """(uuid, used MB, allowed MB) of every GPU where a job uses more memory than its claim
    holds there; a GPU the claim does not hold allows 0 MB."""
    return sorted((uuid, used, allowed_by_uuid.get(uuid, 0)) for uuid, used in used_by_uuid.items()
                  if used > allowed_by_uuid.get(uuid, 0))
