"""ClassAds to model records, live or from snapshot files (classad2 only, no daemons).

Bad input rule: a file that cannot be parsed at all raises :class:`SnapshotError` naming
the file and the place; one job or slot with a missing or malformed attribute is skipped
with a :class:`Skipped` record naming it and the attribute, and the rest is used.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import classad2

from condor_sched.model import (
    PIN_CYCLE_ATTR,
    PIN_ORIGINAL_ATTR,
    PIN_SLOT_ATTR,
    Job,
    JobKey,
    JobStatus,
    Resources,
    Skipped,
    Slot,
    SlotKind,
)

DEFAULT_SLOWDOWN_THRESHOLD = 0.9
#: Largest value accepted for any resource amount (guards against absurd ads).
MAX_AMOUNT = 2**40


class SnapshotError(ValueError):
    """A snapshot file that cannot be parsed at all; names the file and the place."""


class AdError(ValueError):
    """One ad with a missing or malformed attribute."""

    def __init__(self, attribute: str, problem: str):
        super().__init__(f"{attribute} {problem}")
        self.attribute = attribute


def _eval(ad: classad2.ClassAd, attr: str) -> Any:
    """The evaluated value of ``attr``, or None when missing/undefined."""
    if attr not in ad:
        return None
    try:
        value = ad.eval(attr)
    except Exception as e:  # classad2 raises on evaluation failures
        raise AdError(attr, f"does not evaluate ({e})") from None
    if isinstance(value, classad2.Value):
        if value == classad2.Value.Error:
            raise AdError(attr, "evaluates to error")
        return None
    return value


def _number(ad: classad2.ClassAd, attr: str, *, required: bool, default: float = 0,
            integer: bool = True, minimum: float = 0, maximum: float = MAX_AMOUNT) -> Any:
    value = _eval(ad, attr)
    if value is None:
        if required:
            raise AdError(attr, "is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdError(attr, f"must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum or value > maximum:
        raise AdError(attr, f"out of range [{minimum}, {maximum}]: {value!r}")
    if integer:
        return int(math.ceil(value))
    return float(value)


def _string(ad: classad2.ClassAd, attr: str, *, required: bool = False) -> str | None:
    value = _eval(ad, attr)
    if value is None:
        if required:
            raise AdError(attr, "is missing")
        return None
    if not isinstance(value, str):
        raise AdError(attr, f"must be a string, got {value!r}")
    return value


def schedd_of(ad: classad2.ClassAd, fallback: str) -> str:
    """The schedd a job ad came from: the prefix of GlobalJobId (``schedd#1.0#time``)."""
    gid = ad.get("GlobalJobId")
    if isinstance(gid, str) and gid.count("#") >= 2:
        return gid.split("#", 1)[0]
    return fallback


def job_from_ad(ad: classad2.ClassAd, schedd: str) -> Job:
    """One job record; raises AdError naming the attribute that is missing or malformed."""
    cluster = _number(ad, "ClusterId", required=True)
    proc = _number(ad, "ProcId", required=True)
    status_code = _number(ad, "JobStatus", required=True)
    try:
        status = JobStatus(status_code)
    except ValueError:
        raise AdError("JobStatus", f"unknown code {status_code}") from None
    device_memory = _number(ad, "RequestPhiMemory", required=False)
    request = Resources(
        cpus=_number(ad, "RequestCpus", required=True),
        memory_mb=_number(ad, "RequestMemory", required=True),
        device_memory_mb=device_memory,
        device_threads=_number(ad, "RequestPhiThreads", required=device_memory > 0),
        llc_ways=_number(ad, "RequestLLCWays", required=False),
        mem_bw_gbs=_number(ad, "RequestMemBW", required=False, integer=False),
    )
    requirements = ad.lookup("Requirements") if "Requirements" in ad else None
    program = _string(ad, "CoSchedProgram") or os.path.basename(_string(ad, "Cmd") or "")
    return Job(
        key=JobKey(schedd, cluster, proc),
        owner=_string(ad, "Owner") or "",
        status=status,
        request=request,
        submitted_at_s=_number(ad, "QDate", required=False),
        pinned_slot=_string(ad, PIN_SLOT_ATTR),
        pinned_cycle=_number(ad, PIN_CYCLE_ATTR, required=False, default=None) if PIN_CYCLE_ATTR in ad else None,
        has_pin_clause=requirements is not None and PIN_SLOT_ATTR in str(requirements),
        program=program,
        spread="CoSchedProgram" in ad,
        slowdown_threshold=_number(ad, "CoSchedAlpha", required=False, default=DEFAULT_SLOWDOWN_THRESHOLD,
                                   integer=False, minimum=0.01, maximum=1.0),
        remote_slot=_string(ad, "RemoteHost"),
        started_at_s=_number(ad, "JobCurrentStartDate", required=False, default=None)
        if "JobCurrentStartDate" in ad else None,
        attributes={
            "Requirements": str(requirements) if requirements is not None else None,
            PIN_ORIGINAL_ATTR: str(ad.lookup(PIN_ORIGINAL_ATTR)) if PIN_ORIGINAL_ATTR in ad else None,
        },
    )


def slot_from_ad(ad: classad2.ClassAd) -> Slot | None:
    """A partitionable slot record; None for other slot ads (dynamic slots are already
    subtracted from their parent's free resources). Raises AdError on a malformed one."""
    if _eval(ad, "PartitionableSlot") is not True:
        return None
    name = _string(ad, "Name", required=True)
    machine = _string(ad, "Machine", required=True)

    def amounts(prefix: str) -> Resources:
        return Resources(
            cpus=_number(ad, f"{prefix}Cpus", required=True),
            memory_mb=_number(ad, f"{prefix}Memory", required=True),
            device_memory_mb=_number(ad, f"{prefix}PhiMemory", required=False),
            device_threads=_number(ad, f"{prefix}PhiThreads", required=False),
            llc_ways=_number(ad, f"{prefix}LLCWays", required=False),
            mem_bw_gbs=_number(ad, f"{prefix}MemBW", required=False, integer=False),
        )

    total, free = amounts("TotalSlot"), amounts("")
    kind = SlotKind.DEVICE if total.device_memory_mb > 0 else SlotKind.SOCKET
    cache_id = _number(ad, "LLCCacheId", required=False, default=None) if "LLCCacheId" in ad else None
    return Slot(name=name, machine=machine, kind=kind, total=total, free=free,
                device_name=_string(ad, "PhiDeviceName"), cache_id=cache_id,
                updated_at_s=_number(ad, "LastHeardFrom", required=False) or _number(ad, "MyCurrentTime", required=False),
                children=_child_names(ad))


def _child_names(ad: classad2.ClassAd) -> tuple[str, ...] | None:
    """The ad's ``ChildName`` list of dynamic slot names, None when absent or not a list of strings."""
    names = _eval(ad, "ChildName")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return tuple(names)


def _describe_job(ad: classad2.ClassAd, schedd: str) -> str:
    return f"job {schedd}#{ad.get('ClusterId', '?')}.{ad.get('ProcId', '?')}"


def _key_and_pin(ad: classad2.ClassAd, schedd: str) -> tuple[JobKey | None, str | None]:
    """What is still known of a skipped job: its key and pin, so a pin is never left on it."""
    cluster, proc, pin = ad.get("ClusterId"), ad.get("ProcId"), ad.get(PIN_SLOT_ATTR)
    if not (isinstance(cluster, int) and isinstance(proc, int)) or isinstance(cluster, bool):
        return None, None
    return JobKey(schedd, cluster, proc), pin if isinstance(pin, str) else None


def jobs_from_ads(ads: Iterable[classad2.ClassAd], schedd: str | None = None) -> tuple[list[Job], list[Skipped]]:
    """Job records from ads; the schedd comes from each GlobalJobId unless given."""
    jobs: list[Job] = []
    skipped: list[Skipped] = []
    for ad in ads:
        source = schedd or schedd_of(ad, "unknown-schedd")
        try:
            jobs.append(job_from_ad(ad, source))
        except AdError as e:
            skipped.append(Skipped(_describe_job(ad, source), str(e), *_key_and_pin(ad, source)))
    return jobs, skipped


def slots_from_ads(ads: Iterable[classad2.ClassAd]) -> tuple[list[Slot], list[Skipped]]:
    slots: list[Slot] = []
    skipped: list[Skipped] = []
    for ad in ads:
        try:
            slot = slot_from_ad(ad)
        except AdError as e:
            skipped.append(Skipped(f"slot {ad.get('Name', '?')}", str(e)))
            continue
        if slot is not None:
            slots.append(slot)
    return slots, skipped


def read_ads(path: str | Path) -> list[classad2.ClassAd]:
    """Ads from a ``condor_q -json`` / ``condor_status -json`` file or ``-long`` text."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise SnapshotError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if text.lstrip().startswith(("[", "{")):
        return list(_ads_from_json(path, text))
    return list(_ads_from_long(path, text))


def _ads_from_json(path: Path, text: str) -> Iterator[classad2.ClassAd]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SnapshotError(f"{path}: bad JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise SnapshotError(f"{path}: expected a JSON list of ClassAds")
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise SnapshotError(f"{path}: item {i} is not a JSON object")
        try:
            yield classad2.parseOne(json.dumps(obj), classad2.ParserType.JSON)
        except Exception as e:
            raise SnapshotError(f"{path}: item {i} is not a valid ClassAd: {e}") from None


def _ads_from_long(path: Path, text: str) -> Iterator[classad2.ClassAd]:
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    if not blocks:
        return
    line = 1
    for block in blocks:
        try:
            ad = classad2.parseOne(block, classad2.ParserType.Old)
        except Exception as e:
            raise SnapshotError(f"{path}: ClassAd starting near line {line} does not parse: {e}") from None
        if len(ad) == 0:
            raise SnapshotError(f"{path}: ClassAd starting near line {line} does not parse")
        line += block.count("\n") + 2
        yield ad


def ads_to_json(ads: Iterable[classad2.ClassAd]) -> str:
    """The ``condor_q -json`` format: a JSON list of ClassAd objects."""
    return "[\n" + ",\n".join(ad.printJson().strip() for ad in ads) + "\n]\n"
