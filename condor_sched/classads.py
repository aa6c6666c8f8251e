"""ClassAds to model records, live or from snapshot files (classad2 only, no daemons).

Bad input rule: a file that breaks a bound (``MAX_SNAPSHOT_BYTES``, ``MAX_ADS``,
``MAX_VALUE_DEPTH``, ``MAX_EXPRESSION_CHARS``) or does not parse raises
:class:`SnapshotError` naming the file and the place (line, item, attribute); one job or
slot with a missing or malformed attribute, or a request the execute node would refuse
(:func:`request_problem`), is skipped with a :class:`Skipped` record naming it and the
attribute, and the rest is used under the rules of ``consistency`` (one ad per slot Name
and job id, free amounts within the totals).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import classad2
from cosched_node import rules

# classad2 switches on HTCondor's ClassAd semantics (``MY.`` names the ad itself, as in the
# daemons) the first time it parses an ad that has an attribute; until then ``MY.Name`` in a
# slot's START is undefined and no job matches. The JSON reader builds ads from values
# without parsing any, so a process that reads only JSON (``condor-sched plan``) parses one here.
classad2.parseOne("CoSchedClassAdSemantics = true")

from condor_sched.consistency import consistent_state, distinct_slots
from condor_sched.device_kinds import DeviceKind, device_kinds
from condor_sched.model import (
    PIN_CLAUSE,
    PIN_CYCLE_ATTR,
    PIN_ORIGINAL_ATTR,
    PIN_REASON_ATTR,
    PIN_SLOT_ATTR,
    PIN_TIME_ATTR,
    Job,
    JobKey,
    JobStatus,
    PoolState,
    Resources,
    Skipped,
    Slot,
    SlotKind,
)

DEFAULT_SLOWDOWN_THRESHOLD = 0.9
#: ``VacateReasonCode`` of a job the PREPARE_JOB hook sent back to Idle (``HookStatusCode``
#: 300 or more, POOL.md).
HOOK_REFUSED_VACATE_CODE = 1007
#: Largest value accepted for any resource amount (guards against absurd ads).
MAX_AMOUNT = 2**40


#: The request rules the execute node applies live once, in ``cosched_node.rules``: the
#: planner refuses exactly what the PREPARE_JOB hook and the node agent refuse (issue 10), so
#: no pin is written for a start the node would refuse.
MAX_SPREAD_CPUS = 100_000
PROGRAM_NAME = rules.PROGRAM_RE
DEVICE_NAME = rules.DEVICE_RE


def request_problem(kind: DeviceKind | None, *, memory: object = None, compute: object = None,
                    program: object = None, cpus: object = None) -> str | None:
    """Why the execute node would refuse a job's request, or None when it takes it: the
    shared rules of ``cosched_node.rules``, which the PREPARE_JOB hook and the node agent
    apply to the same values.

    A device job (``kind`` given): ``memory`` and ``compute`` are its evaluated
    ``Request<memory_attr>`` and ``Request<compute_attr>`` (None: undefined); no device
    memory is no device job (``rules.device_request``). A spread job (``kind`` None):
    ``program`` (``CoSchedProgram``) must be a program name, ``cpus`` (``RequestCpus``,
    None: 1) an integer in [1, MAX_SPREAD_CPUS]."""
    try:
        if kind is None:
            rules.program_name(program)
            rules.count("RequestCpus", 1 if cpus is None else cpus, 1, MAX_SPREAD_CPUS)
        else:
            rules.device_request(kind.request_memory_attr, memory, kind.request_compute_attr, compute)
    except rules.RuleError as exc:
        return str(exc)
    return None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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


def _integer(ad: classad2.ClassAd, attr: str, maximum: int = MAX_AMOUNT) -> int:
    """A required attribute that must hold an integer (job ids): a real is not rounded into
    an id that does not exist."""
    value = _eval(ad, attr)
    if value is None:
        raise AdError(attr, "is missing")
    try:
        return rules.count(attr, value, 0, maximum)
    except rules.RuleError as exc:
        raise AdError(attr, str(exc).removeprefix(f"{attr} = ")) from None


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


def _requested_kind(ad: classad2.ClassAd) -> DeviceKind | None:
    """The device kind whose memory the job requests (at most one; any value but undefined
    and 0, as ``pool.covered_jobs`` reads them), None for a CPU job. A request the execute
    node would refuse (:func:`request_problem`) raises AdError."""
    kinds = [k for k in device_kinds() if _eval(ad, k.request_memory_attr) not in (None, 0)]
    if len(kinds) > 1:
        raise AdError(kinds[1].request_memory_attr, f"a job uses one device, but it also requests {kinds[0].name}")
    if not kinds:
        return None
    kind = kinds[0]
    problem = request_problem(kind, memory=_eval(ad, kind.request_memory_attr),
                              compute=_eval(ad, kind.request_compute_attr))
    if problem is not None:
        raise AdError(*problem.split(" ", 1))
    return kind


def _check_spread(ad: classad2.ClassAd) -> None:
    """AdError naming the attribute when a spread job (``CoSchedProgram`` set, no device)
    requests what the execute node would refuse (:func:`request_problem`)."""
    if "CoSchedProgram" not in ad:
        return
    problem = request_problem(None, program=_eval(ad, "CoSchedProgram"), cpus=_eval(ad, "RequestCpus"))
    if problem is not None:
        raise AdError(*problem.split(" ", 1))


def job_from_ad(ad: classad2.ClassAd, schedd: str) -> Job:
    """One job record; raises AdError naming the attribute that is missing or malformed."""
    cluster = _integer(ad, "ClusterId")
    proc = _integer(ad, "ProcId")
    status_code = _number(ad, "JobStatus", required=True)
    try:
        status = JobStatus(status_code)
    except ValueError:
        raise AdError("JobStatus", f"unknown code {status_code}") from None
    kind = _requested_kind(ad)
    if kind is None:
        _check_spread(ad)
    request = Resources(
        cpus=_number(ad, "RequestCpus", required=True),
        memory_mb=_number(ad, "RequestMemory", required=True),
        device_memory_mb=_number(ad, kind.request_memory_attr, required=False) if kind else 0,
        device_threads=_number(ad, kind.request_compute_attr, required=True) if kind else 0,
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
        has_pin_clause=requirements is not None and has_pin_clause(str(requirements)),
        program=program,
        spread="CoSchedProgram" in ad,
        device_kind=kind.name if kind else None,
        slowdown_threshold=_number(ad, "CoSchedAlpha", required=False, default=DEFAULT_SLOWDOWN_THRESHOLD,
                                   integer=False, minimum=0.01, maximum=1.0),
        remote_slot=_string(ad, "RemoteHost"),
        requested_runtime_s=_number(ad, "AllowedExecuteDuration", required=False, default=None)
        if "AllowedExecuteDuration" in ad else None,
        started_at_s=_number(ad, "JobCurrentStartDate", required=False, default=None)
        if "JobCurrentStartDate" in ad else None,
        submitter=_lenient(ad, "AccountingGroup", str) or _lenient(ad, "User", str) or _string(ad, "Owner") or "",
        job_prio=int(_lenient(ad, "JobPrio", int) or 0),
        pin_reason=_lenient(ad, PIN_REASON_ATTR, str),
        start_refused=_start_refused(ad, status),
        attributes={
            "Requirements": str(requirements) if requirements is not None else None,
            PIN_ORIGINAL_ATTR: str(ad.lookup(PIN_ORIGINAL_ATTR)) if PIN_ORIGINAL_ATTR in ad else None,
        },
    )


def _lenient(ad: classad2.ClassAd, attr: str, kind: type) -> Any:
    """``attr``'s value when it is a ``kind`` (bools are not ints), else None: for attributes
    that only inform (a user's JobPrio, our own reason text), never a reason to skip a job."""
    try:
        value = _eval(ad, attr)
    except AdError:
        return None
    return value if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) else None


def _start_refused(ad: classad2.ClassAd, status: JobStatus) -> str | None:
    """The execute node's reason when it sent this idle job back to Idle (a PREPARE_JOB hook
    refusal: ``VacateReasonCode`` 1007) at or after its current pin was written
    (``LastVacateTime`` >= ``CoSchedPinTime``; without a vacate time, when it went Idle)."""
    if status is not JobStatus.IDLE or _lenient(ad, "VacateReasonCode", int) != HOOK_REFUSED_VACATE_CODE:
        return None
    pinned_at = _lenient(ad, PIN_TIME_ATTR, int)
    vacated_at = _lenient(ad, "LastVacateTime", int) or _lenient(ad, "EnteredCurrentStatus", int) or 0
    if _lenient(ad, PIN_SLOT_ATTR, str) is None or (pinned_at is not None and vacated_at < pinned_at):
        return None
    return (_lenient(ad, "VacateReason", str) or "the execute node refused the start")[:300]


def has_pin_clause(requirements: str) -> bool:
    """True when ``requirements`` is a conjunction one of whose operands is the pin clause,
    so the job cannot match before it is pinned (a clause merely mentioned, e.g. under an
    ``||``, does not count)."""
    conjuncts = _top_level_conjuncts(_strip_parentheses(requirements.strip()))
    return conjuncts is not None and _canonical(PIN_CLAUSE) in {_canonical(c) for c in conjuncts}


def _canonical(expr: str) -> str:
    try:
        text = str(classad2.ExprTree(expr))
    except Exception:
        return expr
    return _strip_parentheses("".join(text.split()).lower())


def _strip_parentheses(text: str) -> str:
    """``text`` without parentheses that enclose all of it."""
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for char, top in _scan(text):
        depth += {"(": 1, ")": -1}.get(char, 0) if top is not None else 0
        if depth < 0:
            return False
    return depth == 0


def _scan(text: str) -> Iterator[tuple[str, int | None]]:
    """Each character with its bracket depth, None inside string literals."""
    depth, quoted, escaped = 0, False, False
    for char in text:
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
            yield char, None
            continue
        if char == '"':
            quoted = True
            yield char, None
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        yield char, depth


def _top_level_conjuncts(text: str) -> list[str] | None:
    """The operands of ``text``'s top-level ``&&``; None when its top level also has ``||``
    or ``?:`` (then no single operand constrains the whole expression)."""
    parts, start, previous = [], 0, ""
    for i, (char, depth) in enumerate(_scan(text.replace("=?=", "=~="))):  # not a ternary's "?"
        if depth == 0 and (char == "?" or (char == "|" and previous == "|")):
            return None
        if depth == 0 and char == "&" and previous == "&":
            parts.append(text[start:i - 1])
            start = i + 1
            previous = ""
            continue
        previous = char if depth == 0 else ""
    parts.append(text[start:])
    return [p.strip() for p in parts]


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
    subtracted from their parent's free resources). Raises AdError on a malformed one."""
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
    return Slot(name=name, machine=machine, kind=SlotKind.DEVICE if kind else SlotKind.SOCKET, total=total,
                free=free, device_name=_device_name(ad, kind), cache_id=cache_id,
                device_kind=kind.name if kind else None,
                updated_at_s=_number(ad, "LastHeardFrom", required=False) or _number(ad, "MyCurrentTime", required=False),
                children=_child_names(ad), unavailable=_unavailable(ad))


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


def _describe_job(ad: classad2.ClassAd, schedd: str) -> str:
    return f"job {schedd}#{ad.get('ClusterId', '?')}.{ad.get('ProcId', '?')}"


def _key_and_pin(ad: classad2.ClassAd, schedd: str) -> tuple[JobKey | None, str | None, bool]:
    """What is still known of a skipped job: its key and pin, so a pin is never left on it,
    and whether it is idle (then it is held with the reason)."""
    cluster, proc, pin = ad.get("ClusterId"), ad.get("ProcId"), ad.get(PIN_SLOT_ATTR)
    if not (isinstance(cluster, int) and isinstance(proc, int)) or isinstance(cluster, bool):
        return None, None, False
    return JobKey(schedd, cluster, proc), pin if isinstance(pin, str) else None, ad.get("JobStatus") == 1


def jobs_from_ads(ads: Iterable[classad2.ClassAd], schedd: str | None = None
                  ) -> tuple[list[tuple[Job, classad2.ClassAd]], list[Skipped]]:
    """Job records, each with its ad; the schedd comes from each GlobalJobId unless given."""
    jobs: list[tuple[Job, classad2.ClassAd]] = []
    skipped: list[Skipped] = []
    for ad in ads:
        source = schedd or schedd_of(ad, "unknown-schedd")
        try:
            jobs.append((job_from_ad(ad, source), ad))
        except AdError as e:
            skipped.append(Skipped(_describe_job(ad, source), str(e), *_key_and_pin(ad, source)))
    return jobs, skipped


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


def state_from_ads(job_ads: Mapping[str | None, Iterable[classad2.ClassAd]],
                   slot_ads: Iterable[classad2.ClassAd]) -> PoolState:
    """The pool state of job ads (per schedd name; None: from each ad's GlobalJobId) and
    startd ads, with each idle job's eligible slots, under the rules of ``consistency``
    (one ad per slot Name and job id, free amounts within the totals)."""
    pairs: list[tuple[Job, classad2.ClassAd]] = []
    skipped: list[Skipped] = []
    for schedd, ads in job_ads.items():
        read, bad = jobs_from_ads(ads, schedd)
        pairs += read
        skipped += bad
    slot_pairs, slot_skips = slots_from_ads(slot_ads)
    slots, duplicates = distinct_slots([slot for slot, _ in slot_pairs])
    kept = {id(slot) for slot in slots}
    slot_ads = [ad for slot, ad in slot_pairs if id(slot) in kept]
    state = consistent_state(PoolState(tuple(job for job, _ in pairs), tuple(slots),
                                       tuple(skipped + slot_skips + duplicates)))
    read = {id(job) for job in state.jobs}
    idle = [(job, ad) for job, ad in pairs if job.is_idle and id(job) in read]
    return replace(state, eligible=eligible_slots(idle, slot_ads), ranks=slot_ranks(idle, slot_ads))


def slot_ranks(jobs: Iterable[tuple[Job, classad2.ClassAd]],
               slot_ads: Iterable[classad2.ClassAd]) -> dict[JobKey, dict[str, float]]:
    """Each job's ``Rank`` of every partitionable slot (HTCondor's preference among slots
    that match: higher is better), for jobs whose Rank is not a constant; evaluated once per
    group of jobs equal in Rank and in every job attribute it reads. A Rank that does not
    evaluate to a number ranks a slot 0, as in HTCondor."""
    targets = [(ad.get("Name"), _probe_target(ad)) for ad in slot_ads if _eval_quietly(ad, "PartitionableSlot")]
    memo: dict[tuple, dict[str, float]] = {}
    out: dict[JobKey, dict[str, float]] = {}
    for job, ad in jobs:
        if "Rank" not in ad:
            continue
        rank = ad.lookup("Rank")
        if not ad.externalRefs(rank) and not ad.internalRefs(rank):
            continue  # a constant prefers no slot
        text = str(rank)
        refs = sorted(r for r in _own_references(ad, rank) if r in ad and r.lower() != "rank")
        key = (text, tuple((r, str(ad.lookup(r))) for r in refs))
        if key not in memo:
            probe = classad2.ClassAd()
            for r, value in key[1]:
                probe[r] = classad2.ExprTree(value)
            expr = classad2.ExprTree(text)
            memo[key] = {name: _rank_value(expr, probe, target) for name, target in targets}
        if len(set(memo[key].values())) > 1:
            out[job.key] = memo[key]
    return out


def _rank_value(expr: classad2.ExprTree, job: classad2.ClassAd, slot: classad2.ClassAd) -> float:
    try:
        value = expr.eval(job, slot)
    except Exception:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return float(value) if isinstance(value, bool) else 0.0
    return float(value)


def _probe_target(slot_ad: classad2.ClassAd) -> classad2.ClassAd:
    """A copy of a partitionable slot's ad that asks whether a job could ever run there: its
    totals advertised as free (``Cpus`` = ``TotalSlotCpus``, ...; the planners account what
    is free now) and its START as its Requirements (the startd's ``WithinResourceLimits``
    left to the planners), so a symmetric match is the job's Requirements and the slot's START."""
    ad = classad2.ClassAd()
    ad.update(slot_ad)
    for attr in list(slot_ad.keys()):
        if attr.lower().startswith("totalslot") and len(attr) > len("TotalSlot"):
            ad[attr[len("TotalSlot"):]] = slot_ad.lookup(attr)
    ad["Requirements"] = classad2.ExprTree(str(slot_ad.lookup("Start"))) if "Start" in slot_ad else True
    return ad


def _own_references(ad: classad2.ClassAd, expr: classad2.ExprTree) -> set[str]:
    """The attributes ``expr`` may read from a job ad: ``MY.`` ones and every unqualified one
    (HTCondor looks those up in the job first). Independent of which of them ``ad`` has, so
    it can be kept per expression."""
    refs = set(ad.internalRefs(expr))
    for ref in ad.externalRefs(expr):
        if ref.lower().startswith("my."):
            refs.add(ref[3:])
        elif "." not in ref:
            refs.add(ref)
    return refs


def start_references(slot_ads: Iterable[classad2.ClassAd]) -> set[str]:
    """The job attributes the slots' START expressions read (``TARGET.`` ones): a live
    query must project on them for :func:`eligible_slots` to judge START."""
    refs: set[str] = set()
    for ad in slot_ads:
        if "Start" in ad:
            try:
                refs |= {r[7:] for r in ad.externalRefs(ad.lookup("Start")) if r.lower().startswith("target.")}
            except Exception:  # a START that does not parse refers to nothing
                continue
    return refs


def eligible_slots(jobs: Iterable[tuple[Job, classad2.ClassAd]],
                   slot_ads: Iterable[classad2.ClassAd]) -> dict[JobKey, frozenset[str]]:
    """Each job's slots that its own Requirements (the user's, before the pin clause) accept
    and whose START accepts it as if pinned there now, evaluated with classad2 once per group of
    jobs equal in Requirements and in every job attribute the two read. Jobs every slot
    accepts are left out (the mapping's default); a job whose Requirements do not evaluate
    gets no slot."""
    slot_ads = [ad for ad in slot_ads if _eval_quietly(ad, "PartitionableSlot")]
    targets = [(ad.get("Name"), _probe_target(ad)) for ad in slot_ads]
    every = frozenset(name for name, _ in targets)
    start_refs = start_references(slot_ads)
    memo: dict[tuple, frozenset[str]] = {}
    references: dict[str, list[str]] = {}
    out: dict[JobKey, frozenset[str]] = {}
    for job, ad in jobs:
        original = ad.lookup(PIN_ORIGINAL_ATTR) if PIN_ORIGINAL_ATTR in ad else None
        requirements = original if original is not None else ad.lookup("Requirements") if "Requirements" in ad else None
        if requirements is None:
            continue
        text = str(requirements)
        if text not in references:
            refs = _own_references(ad, requirements) | start_refs
            references[text] = sorted(r for r in refs if r.lower() not in _PROBED)
        refs = [r for r in references[text] if r in ad]
        key = (text, tuple((r, str(ad.lookup(r))) for r in refs))
        if key not in memo:
            memo[key] = _accepting(key[0], key[1], targets)
        if memo[key] != every:
            out[job.key] = memo[key]
    return out


#: Job attributes the probe sets itself (a pin written now), and Requirements.
_PROBED = {PIN_SLOT_ATTR.lower(), PIN_TIME_ATTR.lower(), "requirements"}


def _accepting(requirements: str, values: Iterable[tuple[str, str]],
               targets: Iterable[tuple[str, classad2.ClassAd]]) -> frozenset[str]:
    # Expressions are copied as their text: an ExprTree looked up from one ad does not
    # always evaluate the same once inserted into another (seen with classad2 25.14).
    probe = classad2.ClassAd()
    for r, value in values:
        probe[r] = classad2.ExprTree(value)
    probe["Requirements"] = classad2.ExprTree(requirements)
    # As if pinned there now: a start the node refused before this pin does not count
    # (config.d/20's START keeps a job off only the pin it was refused on).
    probe[PIN_TIME_ATTR] = classad2.ExprTree("time()")
    accepted = set()
    for name, target in targets:
        probe[PIN_SLOT_ATTR] = name
        try:
            if target.symmetricMatch(probe):
                accepted.add(name)
        except Exception:  # a hostile expression matches nothing, as in HTCondor
            pass
    return frozenset(accepted)


def _eval_quietly(ad: classad2.ClassAd, attr: str) -> Any:
    try:
        return _eval(ad, attr)
    except AdError:
        return None


#: Bounds of what a snapshot reader accepts: the file's size, the ClassAds in it, a value's
#: nesting (lists and nested ads inside an attribute) and an expression's text (classad2 25.14
#: overflows the C stack parsing some 400 KB of ``1+1+...``).
MAX_SNAPSHOT_BYTES = 2**30
MAX_ADS = 1_000_000
MAX_VALUE_DEPTH = 16
MAX_EXPRESSION_CHARS = 65_536
#: The deepest JSON the reader parses (the list of ads, an ad, then its values).
_MAX_JSON_DEPTH = MAX_VALUE_DEPTH + 2


def read_ads(path: str | Path) -> list[classad2.ClassAd]:
    """Ads from a ``condor_q -json`` / ``condor_status -json`` file or ``-long`` text; a file
    that breaks a bound or does not parse raises :class:`SnapshotError` naming it and the place."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"{path}: larger than {MAX_SNAPSHOT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SnapshotError(f"{path}: not UTF-8 text (line {line}, byte {e.start})") from None
    if text.lstrip().startswith(("[", "{")):
        return _ads_from_json(path, text)
    return _ads_from_long(path, text)


def _json_int(digits: str) -> int | float:
    """A JSON integer as a ClassAd holds it: beyond 64 bits, a real (then out of every range)."""
    if len(digits) < 19:
        return int(digits)
    value = int(digits) if len(digits) <= 20 else float(digits)
    return value if isinstance(value, int) and -2**63 <= value < 2**63 else float(digits)


def _ads_from_json(path: Path, text: str) -> list[classad2.ClassAd]:
    """ClassAds built straight from the parsed JSON (``condor_q -json``): numbers, strings,
    booleans, null (undefined), lists and nested ads as ClassAd values, ``"/Expr(...)/"``
    strings as expressions."""
    try:
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as e:
        raise SnapshotError(f"{path}: bad JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        line, column = _too_deep(text, _MAX_JSON_DEPTH)
        raise SnapshotError(f"{path}: nested deeper than {_MAX_JSON_DEPTH} levels at line {line} "
                            f"column {column}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise SnapshotError(f"{path}: expected a JSON list of ClassAds")
    if len(data) > MAX_ADS:
        raise SnapshotError(f"{path}: more than {MAX_ADS} ClassAds")
    ads = []
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise SnapshotError(f"{path}: item {i} is not a JSON object")
        try:
            ads.append(_classad(obj, 0))
        except _BadValue as e:
            raise SnapshotError(f"{path}: item {i}, attribute {e.attribute}: {e.problem}") from None
    return ads


class _BadValue(ValueError):
    def __init__(self, problem: str, attribute: str = "") -> None:
        super().__init__(problem)
        self.problem, self.attribute = problem, attribute


def _classad(obj: dict, depth: int) -> classad2.ClassAd:
    values = {}
    for attr, value in obj.items():
        if value.__class__ in _PLAIN or (value.__class__ is str and not value.startswith(_EXPR_PREFIX)):
            values[attr] = value
            continue
        try:
            values[attr] = _value(value, depth)
        except _BadValue as e:
            raise _BadValue(e.problem, e.attribute or attr) from None
    try:
        return classad2.ClassAd(values)
    except Exception as e:  # an attribute name classad2 refuses
        raise _BadValue(f"not a ClassAd ({e})", next(iter(values), "?")) from None


_PLAIN = (int, float, bool, type(None))
_EXPR_PREFIX, _EXPR_SUFFIX = "/Expr(", ")/"


def _value(value: Any, depth: int) -> Any:
    """One JSON value as a ClassAd value (module ``_ads_from_json``)."""
    if isinstance(value, str):
        if not (value.startswith(_EXPR_PREFIX) and value.endswith(_EXPR_SUFFIX)):
            return value
        return _expression(value[len(_EXPR_PREFIX):-len(_EXPR_SUFFIX)])
    if value.__class__ in _PLAIN:
        return value
    if depth >= MAX_VALUE_DEPTH:
        raise _BadValue(f"nested deeper than {MAX_VALUE_DEPTH} levels")
    if isinstance(value, list):
        return [_value(v, depth + 1) for v in value]
    return _classad(value, depth + 1)


def _expression(text: str) -> classad2.ExprTree:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise _BadValue(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        return classad2.ExprTree(text)
    except Exception:
        raise _BadValue("expression does not parse") from None


def _too_deep(text: str, limit: int) -> tuple[int, int]:
    """Line and column where JSON ``text`` first nests deeper than ``limit`` (strings skipped)."""
    depth = 0
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, token.start()) + 1
                return line, token.start() - text.rfind("\n", 0, token.start())
        elif char in "]}":
            depth -= 1
    return 1, 1


#: ``-long`` text: ``Attr = value`` lines (HTCondor's attribute names) and ``#`` comments.
_LONG_LINE = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_.]*)[ \t]*=(.*)$")
_LONG_NAMES = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_.]*)[ \t]*=", re.MULTILINE)
_LONG_AD = re.compile(r"(?:[ \t]*(?:[A-Za-z_][A-Za-z0-9_.]*[ \t]*=[^\n]{0,%d}|#[^\n]*)(?:\n|\Z))*"
                      % MAX_EXPRESSION_CHARS)
_LONG_BLOCK = re.compile(r"(?:^[ \t\r\f\v]*\S.*(?:\n|\Z))+", re.MULTILINE)


def _ads_from_long(path: Path, text: str) -> list[classad2.ClassAd]:
    """Ads from ``-long`` text: ``Attr = value`` lines, ads separated by lines holding only
    whitespace, ``#`` comment lines. Any other line, or a value that does not parse, is an
    error naming the line: such a file is cut off or not ``-long`` output, and planning on
    part of it would lose jobs without a reason."""
    text = text.replace("\r\n", "\n")
    ads: list[classad2.ClassAd] = []
    line, at = 1, 0
    for block in _LONG_BLOCK.finditer(text):
        line += text.count("\n", at, block.start())
        at = block.start()
        if len(ads) == MAX_ADS:
            raise SnapshotError(f"{path}: more than {MAX_ADS} ClassAds (line {line})")
        ad = _long_ad(path, block.group(), line)
        if ad is not None:
            ads.append(ad)
    return ads


def _long_ad(path: Path, block: str, first_line: int) -> classad2.ClassAd | None:
    """One ``-long`` ad (None: only comments). The lines are checked and classad2 parses the
    block at once (fast); it must have read every attribute, else the line it refused is named."""
    listed = _LONG_NAMES.findall(block)
    names = set(map(str.lower, listed))
    if _LONG_AD.fullmatch(block) is None:
        _refuse_long_line(path, block, first_line)
        raise SnapshotError(f"{path}: the ClassAd at line {first_line} does not parse")
    if len(names) < len(listed):
        _refuse_repeated(path, block, first_line)
    if not names:
        return None
    try:
        ad = classad2.parseNext(block, classad2.ParserType.Old)  # parseOne copies it attribute by attribute
    except Exception:
        ad = None
    if ad is not None and len(ad) == len(names):
        return ad
    _refuse_long_line(path, block, first_line)
    raise SnapshotError(f"{path}: the ClassAd at line {first_line} does not parse")


def _refuse_repeated(path: Path, block: str, first_line: int) -> None:
    """Raise SnapshotError naming an attribute given twice in one ad (two ads without the
    blank line between them would otherwise read as one, losing a job)."""
    seen: dict[str, int] = {}
    for number, line in enumerate(block.splitlines(), first_line):
        match = _LONG_LINE.match(line)
        if match is not None:
            name = match.group(1).lower()
            if name in seen:
                raise SnapshotError(f"{path}: line {number}: {match.group(1)} again (as on line {seen[name]}): "
                                    "is a blank line missing between two ClassAds?")
            seen[name] = number


def _refuse_long_line(path: Path, block: str, first_line: int) -> None:
    """Raise SnapshotError naming the first line of ``block`` that is not ``Attr = value``,
    holds too long a value or does not parse; return when every line is a comment."""
    for number, line in enumerate(block.splitlines(), first_line):
        match = _LONG_LINE.match(line)
        if match is None:
            if line.lstrip().startswith("#"):
                continue
            raise SnapshotError(f"{path}: line {number} is not 'Attr = value'")
        name, value = match.group(1), match.group(2).strip()
        if len(value) > MAX_EXPRESSION_CHARS:
            raise SnapshotError(f"{path}: line {number}: {name}: value longer than {MAX_EXPRESSION_CHARS} characters")
        try:
            classad2.ExprTree(value)
        except Exception:
            raise SnapshotError(f"{path}: line {number}: {name} does not parse") from None


def ads_to_json(ads: Iterable[classad2.ClassAd]) -> str:
    """The ``condor_q -json`` format: a JSON list of ClassAd objects."""
    return "[\n" + ",\n".join(ad.printJson().strip() for ad in ads) + "\n]\n"
