"""Slot ads to :class:`model.Slot` records (:func:`slot_from_ad`): partitionable slots of a
device kind, GPU nodes and their GPUs, guest and node slots, why a slot takes no new job
now, and skipped slots (:func:`slots_from_ads`)."""
from __future__ import annotations

import re
from typing import Iterable

import classad2
from cosched_node import rules
from cosched_node.config import MAX_MULTIPLICITY
from cosched_node.interference_duty import PUBLISHED_RE

from condor_sched.classads.plain import (
    AdError,
    _PlainAd,
    _READING_SLOT,
    _carried,
    _check_cost,
    _eval,
    _lenient,
    _number,
    _string,
)
from condor_sched.device_kinds import GPU, DeviceKind, device_kinds
from condor_sched.model import (
    MAX_GPU_COMPUTE_OVERCOMMIT, MULTIPLICITY_ATTR, Gpu, GpuClaim, Resources, Skipped, Slot, SlotKind, SpareCapacity,
)


#: A device name as the execute node accepts it: the request rules live once, in
#: ``cosched_node.rules`` (``jobs.request_problem``).
DEVICE_NAME = rules.DEVICE_RE


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: Slot states in which a startd takes no new claim (HTCondor's ``State``).
_UNAVAILABLE_STATES = {"Owner": "is in the Owner state (its START is false)", "Drained": "is drained",
                       "Preempting": "is preempting its job"}


def _unavailable(ad: classad2.ClassAd) -> str | None:
    """Why a partitionable slot takes no new job now, or None."""
    if _lenient(ad, "Offline", bool):
        return "is offline"
    if _lenient(ad, "Draining", bool) or _lenient(ad, "Activity", str) == "Draining":
        return "is draining"
    return _UNAVAILABLE_STATES.get(_lenient(ad, "State", str) or "")


def slot_from_ad(ad: classad2.ClassAd) -> Slot | None:
    """A partitionable slot record; None for other slot ads (dynamic slots are already
    subtracted from their parent's free resources). Raises AdError on a malformed one, and
    on one whose expressions cost more than the bound (``_check_cost``: of a snapshot's ad,
    every attribute; of a live one, what matchmaking walks first)."""
    _check_cost(ad, tuple(ad.values) if ad.__class__ is _PlainAd else _SLOT_WALKED, slot=True)
    if ad.__class__ is _PlainAd:  # a file's ad (a live one came as ClassAd text, which holds no NUL)
        for attr, value in ad.values.items():
            if value.__class__ is str and "\0" in value:
                _carried(attr, value)
    reading = _READING_SLOT.set(True)
    try:
        return _slot_record(ad)
    finally:
        _READING_SLOT.reset(reading)


def _slot_record(ad: classad2.ClassAd) -> Slot | None:
    if _eval(ad, "PartitionableSlot") is not True:
        return None
    name = _string(ad, "Name", required=True)
    machine = _string(ad, "Machine", required=True)

    kinds = [k for k in device_kinds() if _number(ad, f"TotalSlot{k.memory_attr}", required=False) > 0]
    if len(kinds) > 1:
        raise AdError(f"TotalSlot{kinds[1].memory_attr}", f"a slot holds one device, but it also has {kinds[0].name}")
    kind = kinds[0] if kinds else None

    def amounts(prefix: str) -> Resources:
        return Resources(
            cpus=_number(ad, f"{prefix}Cpus", required=True),
            memory_mb=_number(ad, f"{prefix}Memory", required=True),
            device_memory_mb=_number(ad, f"{prefix}{kind.memory_attr}", required=False) if kind else 0,
            device_threads=_number(ad, f"{prefix}{kind.compute_attr}", required=False) if kind else 0,
            llc_ways=_number(ad, f"{prefix}LLCWays", required=False),
            mem_bw_gbs=_number(ad, f"{prefix}MemBW", required=False, integer=False),
        )

    total, free = amounts("TotalSlot"), amounts("")
    cache_id = _number(ad, "LLCCacheId", required=False, default=None) if "LLCCacheId" in ad else None
    slot_kind = SlotKind.DEVICE if kind else SlotKind.SOCKET
    gpus: tuple[Gpu, ...] = ()
    single_account = False
    if kind is None and _lenient(ad, GPU.node_attr, bool):
        slot_kind, gpus = SlotKind.GPU_NODE, _gpus_of(ad)
        single_account = _lenient(ad, GPU_SINGLE_ACCOUNT_ATTR, bool) is True
    elif kind is None and _lenient(ad, "CoSchedGuestSlot", bool):
        slot_kind = SlotKind.GUEST
    elif kind is None and _lenient(ad, "CoSchedSpareSlot", bool):
        slot_kind = SlotKind.SPARE
    elif kind is None and _lenient(ad, "CoSchedNodeSlot", bool):
        slot_kind = SlotKind.NODE
    multiplicity = 1
    if slot_kind is SlotKind.SOCKET and MULTIPLICITY_ATTR in ad:
        slot_kind = SlotKind.OVERCOMMIT
        multiplicity = _number(ad, MULTIPLICITY_ATTR, required=True, minimum=2, maximum=MAX_MULTIPLICITY)
        if total.cpus < multiplicity:
            raise AdError("TotalSlotCpus", f"{total.cpus} CPUs: an overcommitting slot counts each of its cores "
                                           f"{MULTIPLICITY_ATTR} = {multiplicity} times")
    return Slot(name=name, machine=machine, kind=slot_kind, total=total,
                free=free, device_name=_device_name(ad, kind), cache_id=cache_id,
                device_kind=kind.name if kind else None,
                updated_at_s=_number(ad, "LastHeardFrom", required=False) or _number(ad, "MyCurrentTime", required=False),
                children=_child_names(ad), unavailable=_unavailable(ad) or _no_guests(ad, slot_kind), gpus=gpus,
                gpu_single_account=single_account,
                spare=_spare_of(ad, total) if slot_kind is SlotKind.SPARE else None,
                running_exes=_running_exes(ad), multiplicity=multiplicity,
                waiting_gpu_claims=_waiting_gpu_claims(ad, len(gpus)) if gpus else ())


#: The most GPUs a GPU node slot may hold (the schedd transform of config.d/10 defines the
#: claim's requests for GPU indices 0..MAX_GPUS_PER_NODE-1).
MAX_GPUS_PER_NODE = GPU.max_per_node
GPU_UUID = re.compile(r"^(?:GPU|MIG)-[A-Za-z0-9-]{1,80}$")
GPU_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/-]{0,63}$")
#: A GPU node whose jobs all run under one execute account (its node config says so).
GPU_SINGLE_ACCOUNT_ATTR = f"{GPU.resource_prefix}SingleAccount"


def _gpus_of(ad: classad2.ClassAd) -> tuple[Gpu, ...]:
    """A GPU node slot's GPUs (``CoSchedGPUCount``, and per GPU k ``CoSchedGPU<k>Uuid``,
    ``...DeviceName``, ``...Capability``, and the resources ``[TotalSlot]CoSchedGPU<k>Memory``
    and ``...Compute`` HTCondor accounts; names from the ``gpu`` kind's record); AdError
    naming the first bad attribute."""
    count = _number(ad, GPU.count_attr, required=True, minimum=1, maximum=MAX_GPUS_PER_NODE)
    gpus = []
    seen: dict[str, str] = {}
    for k in range(count):
        uuid_attr, model_attr = GPU.resource_attr(k, "Uuid"), GPU.resource_attr(k, "DeviceName")
        memory_attr, compute_attr = GPU.resource_attr(k, "Memory"), GPU.resource_attr(k, "Compute")
        uuid = _string(ad, uuid_attr, required=True)
        if not GPU_UUID.match(uuid):
            raise AdError(uuid_attr, f"must be a GPU or MIG uuid ({GPU_UUID.pattern}), got {_shown(uuid)}")
        if uuid.lower() in seen:
            raise AdError(uuid_attr, f"repeats {seen[uuid.lower()]} ({uuid}): one GPU advertised twice")
        seen[uuid.lower()] = uuid_attr
        model = _string(ad, model_attr, required=True)
        if not GPU_MODEL.match(model):
            raise AdError(model_attr, f"must be a GPU model name ({GPU_MODEL.pattern}), got {_shown(model)}")
        memory = _number(ad, f"TotalSlot{memory_attr}", required=True, minimum=1)
        compute = _number(ad, f"TotalSlot{compute_attr}", required=True, minimum=GPU.whole_compute,
                          maximum=int(MAX_GPU_COMPUTE_OVERCOMMIT * GPU.whole_compute))
        gpus.append(Gpu(index=k, uuid=uuid, model=model, memory_mb=memory,
                        free_memory_mb=_number(ad, memory_attr, required=True, maximum=memory),
                        free_compute=_number(ad, compute_attr, required=True, maximum=compute), compute=compute,
                        capability=_number(ad, GPU.resource_attr(k, "Capability"), required=False, integer=False,
                                           maximum=100.0)))
    return tuple(gpus)


def _spare_of(ad: classad2.ClassAd, total: Resources) -> SpareCapacity | None:
    """What a SPARE slot's node agent publishes through the startd cron (``CoSchedSpareUsable``,
    ``CoSchedSpareCpus``, ``CoSchedSpareMemory``, ``CoSchedSpareConfidence``,
    ``CoSchedSpareSamples``, ``CoSchedSpareUpdated``, ``CoSchedSpareProblem``); None when it
    publishes nothing. A value out of range makes the node take no spare-capacity job, named."""
    usable = _lenient(ad, "CoSchedSpareUsable", bool)
    if usable is None:
        return None
    evictions, vacated = _spare_evictions(ad)
    if not usable:
        why = _lenient(ad, "CoSchedSpareProblem", str)
        return SpareCapacity(0.0, 0, problem="its node agent takes no spare-capacity job now" +
                             (f": {why[:200]}" if why else " (CoSchedSpareUsable is false)"),
                             evictions=evictions, vacated=vacated)
    try:
        return SpareCapacity(
            cpus=float(_number(ad, "CoSchedSpareCpus", required=True, integer=False, maximum=total.cpus)),
            memory_mb=int(_number(ad, "CoSchedSpareMemory", required=True, maximum=total.memory_mb)),
            confidence=float(_number(ad, "CoSchedSpareConfidence", required=False, default=0.0, integer=False,
                                     maximum=1.0)),
            samples=int(_number(ad, "CoSchedSpareSamples", required=False)),
            updated_at_s=int(_number(ad, "CoSchedSpareUpdated", required=False)),
            evictions=evictions, vacated=vacated)
    except AdError as exc:
        return SpareCapacity(0.0, 0, problem=f"its node agent's estimate does not read: {exc}",
                             evictions=evictions, vacated=vacated)


SPARE_EVICT = re.compile(r"^CoSchedSpareEvict_slot\d{1,4}_\d{1,6}$", re.IGNORECASE)
EVICTION = re.compile(r"^(\d{1,12}\.\d{1,9}) (.{1,300})$", re.DOTALL)
SPARE_VACATED = re.compile(r"^CoSchedSpareVacated_(\d{1,12})_(\d{1,9})$", re.IGNORECASE)
VACATED = re.compile(r"^(\d{1,11}) (.{1,300})$", re.DOTALL)


def _spare_evictions(ad: classad2.ClassAd | _PlainAd) -> tuple[dict[str, str], dict[str, tuple[int, str]]]:
    """What a node's agent says of the spare jobs it asked the startd to vacate (the startd
    cron's node-wide lines): ``CoSchedSpareEvict_<slot> = "<Cluster.Proc> <why>"`` while the
    claim lasts, job id -> why; ``CoSchedSpareVacated_<Cluster>_<Proc> = "<unix time> <why>"``
    after, job id -> (time, why). Lines that do not read are left out."""
    evictions: dict[str, str] = {}
    vacated: dict[str, tuple[int, str]] = {}
    names = ad.values.keys() if ad.__class__ is _PlainAd else ad.keys()
    for attr in [a for a in names if a[:12].lower() == "coschedspare"][:256]:
        text = _lenient(ad, attr, str)
        if not text:
            continue
        if SPARE_EVICT.match(attr) and (match := EVICTION.match(text)):
            evictions[match.group(1)] = match.group(2)
        elif (name := SPARE_VACATED.match(attr)) and (match := VACATED.match(text)):
            vacated[f"{int(name.group(1))}.{int(name.group(2))}"] = (int(match.group(1)), match.group(2))
    return evictions, vacated


RUNNING_EXE = re.compile(r"^CoSchedJobExe_(\d{1,12})_(\d{1,9})$", re.IGNORECASE)


def _running_exes(ad: classad2.ClassAd | _PlainAd) -> dict[str, tuple[str, str]]:
    """What the node's agent read of its running jobs (the startd cron's
    ``CoSchedJobExe_<Cluster>_<Proc> = "<owner> <sha256>"``): job id -> (owner, sha256); lines
    that do not read are left out."""
    names = ad.values.keys() if ad.__class__ is _PlainAd else ad.keys()
    out: dict[str, tuple[str, str]] = {}
    for attr in [a for a in names if a[:13].lower() == "coschedjobexe"][:256]:
        name, text = RUNNING_EXE.match(attr), _lenient(ad, attr, str)
        if name and text and (match := PUBLISHED_RE.match(text)):
            out[f"{int(name.group(1))}.{int(name.group(2))}"] = (match.group(1), match.group(2))
    return out


def _no_guests(ad: classad2.ClassAd, kind: SlotKind) -> str | None:
    """Why a GUEST slot hosts no guest: its node agent does not say it can move cores between
    jobs (``CoSchedNodeSharing``, advertised by the node's startd cron)."""
    if kind is not SlotKind.GUEST or _lenient(ad, "CoSchedNodeSharing", bool) is True:
        return None
    return "hosts no guest: its node agent cannot set cgroup-v2 cpusets (CoSchedNodeSharing is not true)"


def _device_name(ad: classad2.ClassAd, kind: DeviceKind | None) -> str | None:
    """The device a device slot holds (None: not named), as the execute node accepts it."""
    name = _string(ad, kind.device_name_attr) if kind else None
    if name is not None and not DEVICE_NAME.match(name):
        raise AdError(kind.device_name_attr, f"must be a device name ({DEVICE_NAME.pattern}), got {_shown(name)}")
    return name


def _child_names(ad: classad2.ClassAd) -> tuple[str, ...] | None:
    """The ad's ``ChildName`` list of dynamic slot names, None when absent or not a list of strings."""
    names = _eval(ad, "ChildName")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return tuple(names)


def _child_column(ad: classad2.ClassAd, attr: str, kind: type, length: int) -> list | None:
    """The ad's ``attr`` list (one value per dynamic slot), each value not a ``kind`` as None;
    None when the list is absent, does not evaluate or is of another length than ``ChildName``."""
    try:
        values = _eval(ad, attr)
    except AdError:
        return None
    if not isinstance(values, list) or len(values) != length:
        return None
    return [v if isinstance(v, kind) and not (kind is int and isinstance(v, bool)) else None for v in values]


def _waiting_gpu_claims(ad: classad2.ClassAd, gpu_count: int) -> tuple[GpuClaim, ...]:
    """The GPU node's dynamic slots claimed for a job that has not started in them yet
    (``ChildState`` Claimed, ``ChildActivity`` Idle), with their ``ChildRemoteOwner``,
    ``ChildEnteredCurrentState`` and ``ChildCoSchedGPU<k>Memory`` / ``Compute``. Optional: a
    list that does not read gives none (a child whose values do not read is left out), and
    the planner then counts every kept pin afresh."""
    names = _child_names(ad)
    if not names:
        return ()
    n = len(names)
    columns = [_child_column(ad, attr, kind, n) for attr, kind in (
        ("ChildState", str), ("ChildActivity", str), ("ChildRemoteOwner", str), ("ChildEnteredCurrentState", int))]
    amounts = [(_child_column(ad, f"Child{GPU.resource_attr(k, 'Memory')}", int, n),
                _child_column(ad, f"Child{GPU.resource_attr(k, 'Compute')}", int, n)) for k in range(gpu_count)]
    if any(c is None for c in columns) or any(m is None or c is None for m, c in amounts):
        return ()
    states, activities, owners, entered = columns
    claims = []
    for i, name in enumerate(names):
        if states[i] != "Claimed" or activities[i] != "Idle" or owners[i] is None or entered[i] is None:
            continue
        shares = tuple((k, memory[i], compute[i]) for k, (memory, compute) in enumerate(amounts)  # type: ignore[index]
                       if compute[i] is not None and compute[i] > 0 and memory[i] is not None)  # type: ignore[index]
        if shares:
            claims.append(GpuClaim(name, owners[i].split("@", 1)[0], entered[i], shares))
    return tuple(claims)


def slots_from_ads(ads: Iterable[classad2.ClassAd]) -> tuple[list[tuple[Slot, classad2.ClassAd]], list[Skipped]]:
    """Partitionable slot records, each with its ad, and the slots skipped with the reason."""
    slots: list[tuple[Slot, classad2.ClassAd]] = []
    skipped: list[Skipped] = []
    for ad in ads:
        try:
            slot = slot_from_ad(ad)
        except AdError as e:
            skipped.append(Skipped(f"slot {ad.get('Name', '?')}", str(e)))
            continue
        if slot is not None:
            slots.append((slot, ad))
    return slots, skipped


#: The slot expressions matchmaking walks for references (START, and the slot's own
#: Requirements and Rank): checked on every live slot ad before they are.
_SLOT_WALKED = ("Start", "Requirements", "Rank")
