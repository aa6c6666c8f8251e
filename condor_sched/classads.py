"""ClassAds to model records, live or from snapshot files (classad2 only, no daemons).

Bad input rule: a file that breaks a bound (``MAX_SNAPSHOT_BYTES``, ``MAX_ADS``,
``MAX_VALUE_DEPTH``, ``MAX_EXPRESSION_CHARS``) or does not parse raises
:class:`SnapshotError` naming the file and the place (line, item, attribute); one job or
slot with a missing or malformed attribute, a request the execute node would refuse
(:func:`request_problem`), expressions that would cost more to walk or evaluate than the
bound of ``expression_cost`` (checked before classad2 touches them: ``_check_cost``) or a
value no ClassAd text carries (a NUL: ``_carried``), is skipped with a :class:`Skipped`
record naming it and the attribute, and the rest is used under the rules of
``consistency`` (one ad per slot Name and job id, free amounts within the totals, one slot
per GPU uuid).

Reading is fast (issue 11): snapshot files are streamed ad by ad (:func:`state_from_snapshot`)
and live ads read through their JSON (:func:`state_from_ads`), both as :class:`_PlainAd` views
whose plain values need no classad2 call; a ClassAd is built only where ClassAd semantics are
needed, and matchmaking is evaluated once per class of equal slots (:class:`_SlotClasses`).
"""
from __future__ import annotations

import codecs
import contextvars
import itertools
import functools
import json
import math
import multiprocessing
import os
import re
from dataclasses import replace
from pathlib import Path
from multiprocessing.connection import Connection
from typing import Any, BinaryIO, Callable, Hashable, Iterable, Iterator, Mapping, NamedTuple

import classad2
from cosched_node import rules

# classad2 switches on HTCondor's ClassAd semantics (``MY.`` names the ad itself, as in the
# daemons) the first time it parses an ad that has an attribute; until then ``MY.Name`` in a
# slot's START is undefined and no job matches. The JSON reader builds ads from values
# without parsing any, so a process that reads only JSON (``condor-sched plan``) parses one here.
classad2.parseOne("CoSchedClassAdSemantics = true")

from condor_sched.consistency import consistent_state, distinct_slots
from condor_sched.device_kinds import GPU, DeviceKind, device_kinds
from condor_sched.expression_cost import expression_cost_problem, names_read
from condor_sched.gc_pause import gc_paused
from condor_sched.model import (
    MAX_GPU_COMPUTE_OVERCOMMIT,
    MALLEABLE_ATTR,
    PIN_CLAUSE,
    PIN_CYCLE_ATTR,
    PIN_GPUS_ATTR,
    WHOLE_GPU,
    Gpu,
    GpuRequest,
    PIN_GUEST_ATTR,
    PIN_MATE_ATTR,
    PIN_MATE_BASE_ATTR,
    PIN_MATE_INCREASE_ATTR,
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
    duration_s,
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


def _eval(ad: classad2.ClassAd | _PlainAd, attr: str) -> Any:
    """The evaluated value of ``attr``, or None when missing/undefined."""
    if ad.__class__ is _PlainAd:
        return ad.eval(attr)
    if attr not in ad:
        return None
    if ad.get(attr).__class__ is classad2.ExprTree:
        _check_cost(ad, (attr,), slot=_READING_SLOT.get())
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


#: The most GPUs one job may ask for (``request_GPUs``): no node has more.
MAX_GPUS_PER_JOB = 64
#: Characters of a ``require_gpus`` expression the sidecar evaluates.
MAX_REQUIRE_GPUS_CHARS = 4096
_PIN_GPUS = re.compile(r"^\d{1,2}(?:,\d{1,2}){0,63}$")


def gpu_request(ad: classad2.ClassAd) -> GpuRequest | None:
    """A GPU job's request (issue 13), None for other jobs: a job is a GPU job when it asks for
    GPU memory or compute (``request_GPUMemory``, ``request_GPUCompute``: a share of one GPU,
    or whole GPUs) or for whole GPUs (``request_GPUs``). Raises AdError naming the attribute
    that the execute node would refuse: a share (compute < 1000) together with
    ``request_GPUs`` (which takes whole GPUs from the node's GPU count), values that are not
    positive integers in range. A share without ``request_GPUMemory`` takes its
    compute share of the GPU's memory."""
    memory_attr, compute_attr, count_attr = GPU.request_memory_attr, GPU.request_compute_attr, GPU.count_request_attr
    memory, compute, count = (_eval(ad, a) for a in (memory_attr, compute_attr, count_attr))
    if memory in (None, 0) and compute in (None, 0) and count in (None, 0):
        return None
    n = 1 if count in (None, 0) else _number(ad, count_attr, required=True, minimum=1, maximum=MAX_GPUS_PER_JOB)
    share = WHOLE_GPU if compute is None else _number(ad, compute_attr, required=True, minimum=1,
                                                      maximum=WHOLE_GPU)
    if share < WHOLE_GPU and count not in (None, 0):
        raise AdError(compute_attr, f"= {share}: a share (< {WHOLE_GPU}) of one GPU is asked without "
                      f"request_GPUs, which takes whole GPUs (request_GPUs = {count})")
    memory_mb = None if memory is None else _number(ad, memory_attr, required=True, minimum=1)
    return GpuRequest(count=n, compute=share, memory_mb=memory_mb)


def _pinned_gpus(ad: classad2.ClassAd) -> tuple[int, ...]:
    """``CoSchedPinGPUs`` as indices; () when absent or not a list the sidecar writes."""
    text = _lenient(ad, PIN_GPUS_ATTR, str)
    if not text or not _PIN_GPUS.match(text):
        return ()
    return tuple(int(g) for g in text.split(","))


def _require_gpus(ad: classad2.ClassAd) -> str | None:
    """The job's ``require_gpus`` expression text (evaluated against each GPU's properties by
    ``gpu_sharing``); AdError when it is too long to be a reasonable constraint."""
    if GPU.match_request_attr not in ad:
        return None
    text = _lookup_text(ad, GPU.match_request_attr)
    if len(text) > MAX_REQUIRE_GPUS_CHARS:
        raise AdError(GPU.match_request_attr, f"longer than {MAX_REQUIRE_GPUS_CHARS} characters")
    _cost_of([(GPU.match_request_attr, text)])
    return text


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
    gpu = gpu_request(ad) if kind is None else None
    request = Resources(
        cpus=_number(ad, "RequestCpus", required=True),
        memory_mb=_number(ad, "RequestMemory", required=True),
        device_memory_mb=_number(ad, kind.request_memory_attr, required=False) if kind else 0,
        device_threads=_number(ad, kind.request_compute_attr, required=True) if kind else 0,
        llc_ways=_number(ad, "RequestLLCWays", required=False),
        mem_bw_gbs=_number(ad, "RequestMemBW", required=False, integer=False),
    )
    requirements = _lookup_text(ad, "Requirements") if "Requirements" in ad else None
    program = _string(ad, "CoSchedProgram") or os.path.basename(_string(ad, "Cmd") or "")
    return Job(
        key=JobKey(schedd, cluster, proc),
        owner=_string(ad, "Owner") or "",
        status=status,
        request=request,
        submitted_at_s=_number(ad, "QDate", required=False),
        pinned_slot=_string(ad, PIN_SLOT_ATTR),
        pinned_cycle=_number(ad, PIN_CYCLE_ATTR, required=False, default=None) if PIN_CYCLE_ATTR in ad else None,
        has_pin_clause=requirements is not None and has_pin_clause(requirements),
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
        hook_refusal=_hook_refusal(ad, status),
        malleable=_lenient(ad, MALLEABLE_ATTR, bool) is True,
        gpu=gpu,
        pinned_gpus=_pinned_gpus(ad) if gpu is not None else (),
        attributes={
            "Requirements": requirements,
            PIN_ORIGINAL_ATTR: _lookup_text(ad, PIN_ORIGINAL_ATTR) if PIN_ORIGINAL_ATTR in ad else None,
            **_node_sharing_attributes(ad),
            **({GPU.match_request_attr: _require_gpus(ad)} if gpu is not None else {}),
        },
    )


def _node_sharing_attributes(ad: classad2.ClassAd) -> dict[str, Any]:
    """The sidecar's node-sharing marks on a guest or a mate (``condor_sched.node_sharing``),
    those present and of the type and range it writes (durations: ``model.duration_s``);
    anything else reads as absent, so nothing out of range is ever written back."""
    out: dict[str, Any] = {}
    for attr, kind in ((PIN_MATE_ATTR, str), (PIN_GUEST_ATTR, str), (PIN_MATE_INCREASE_ATTR, int),
                       (PIN_MATE_BASE_ATTR, int)):
        if attr in ad and (value := _lenient(ad, attr, kind)) is not None:
            if kind is int and duration_s(value) is None and not (attr == PIN_MATE_INCREASE_ATTR and value == 0):
                continue
            out[attr] = value
    return out


def _record_reads() -> tuple[str, ...]:
    """The job attributes ``job_from_ad`` reads besides ClusterId, ProcId and
    ``_RECORD_PER_JOB_READS`` (a test holds it to that), with the device kinds registered now:
    a record is made once per values of these (``_job_record``). The first ``_RECORD_TEXTS``
    are read only as their text, which no other attribute changes."""
    return ("Requirements", PIN_ORIGINAL_ATTR, "JobStatus",
            *(a for k in device_kinds() for a in (k.request_memory_attr, k.request_compute_attr)),
            "CoSchedProgram", "RequestCpus", "RequestMemory", "RequestLLCWays", "RequestMemBW", "Cmd", "Owner",
            PIN_SLOT_ATTR, PIN_CYCLE_ATTR, "CoSchedAlpha", "RemoteHost", "AllowedExecuteDuration",
            "JobCurrentStartDate", "AccountingGroup", "User", PIN_REASON_ATTR, MALLEABLE_ATTR, PIN_MATE_ATTR,
            PIN_GUEST_ATTR, PIN_MATE_INCREASE_ATTR, PIN_MATE_BASE_ATTR, *GPU_JOB_ATTRS)


#: The GPU attributes of a job the sidecar reads (issue 13).
GPU_JOB_ATTRS = (GPU.request_memory_attr, GPU.request_compute_attr, GPU.count_request_attr, GPU.match_request_attr,
                 PIN_GPUS_ATTR)
_RECORD_TEXTS = 2
#: Read per job; they can only make ``submitted_at_s``, ``job_prio`` and ``start_refused`` differ.
_RECORD_PER_JOB_READS = ("QDate", "JobPrio", "VacateReasonCode", PIN_TIME_ATTR, "LastVacateTime",
                         "EnteredCurrentStatus", "VacateReason")
#: Job records by the schedd, the attributes read and their JSON values (``_job_record``).
_RECORDS: dict[tuple, Job] = {}


def _job_record(ad: classad2.ClassAd | _PlainAd, schedd: str, reads: tuple[str, ...]) -> Job:
    """``job_from_ad``, made once per equal values of what it reads (``reads``, from
    ``_record_reads``) when those are plain JSON values (its request, owner, pin...) and copied
    with each job's id, submit time, priority and refusal read apart."""
    if ad.__class__ is not _PlainAd or ad.live:
        return job_from_ad(ad, schedd)
    names, values = ad.names, ad.values
    raw = _raw_values(ad, reads)
    key = (schedd, reads, raw, tuple(map(type, raw)))  # 1, 1.0 and True are equal keys, not equal values
    try:
        template = _RECORDS.get(key)
    except TypeError:  # a list or a nested ad: not a key
        return job_from_ad(ad, schedd)
    if template is None:
        job = job_from_ad(ad, schedd)
        if len(_RECORDS) < _MAX_CACHED and all(map(_plain_json, raw[_RECORD_TEXTS:])):
            _RECORDS[key] = job
        return job
    cluster, proc = values.get(names.get("clusterid")), values.get(names.get("procid"))
    if cluster.__class__ is not int or proc.__class__ is not int or not (0 <= cluster <= MAX_AMOUNT
                                                                          and 0 <= proc <= MAX_AMOUNT):
        cluster, proc = _integer(ad, "ClusterId"), _integer(ad, "ProcId")
    return replace(template, key=JobKey(schedd, cluster, proc),
                   submitted_at_s=_number(ad, "QDate", required=False), job_prio=int(_lenient(ad, "JobPrio", int) or 0),
                   start_refused=_start_refused(ad, template.status), hook_refusal=_hook_refusal(ad, template.status))


def _raw_values(ad: _PlainAd, attrs: tuple[str, ...]) -> tuple:
    """The JSON values of ``attrs`` in ``ad`` (``_MISSING`` where absent), in one C-level pass
    over their names as this layout of an ad writes them (found once per layout)."""
    key = (id(ad.names), attrs)
    columns = _COLUMNS.get(key)
    if columns is None or columns[0] is not ad.names:  # the names map is kept alive with its columns
        columns = ad.names, tuple(ad.names.get(a.lower(), "") for a in attrs)
        if len(_COLUMNS) < _MAX_CACHED:
            _COLUMNS[key] = columns
    return tuple(map(ad.values.get, columns[1], itertools.repeat(_MISSING)))


_COLUMNS: dict[tuple[int, tuple[str, ...]], tuple[dict[str, str], tuple[str, ...]]] = {}


def _plain_json(value: Any) -> bool:
    """True for a JSON value a ClassAd holds as itself (not an expression, list or nested ad)."""
    kind = value.__class__
    return (kind is str and not (value.startswith(_EXPR_PREFIX) and value.endswith(_EXPR_SUFFIX))) or kind in _PLAIN \
        or value is _MISSING


def _lenient(ad: classad2.ClassAd, attr: str, kind: type) -> Any:
    """``attr``'s value when it is a ``kind`` (bools are not ints), else None: for attributes
    that only inform (a user's JobPrio, our own reason text), never a reason to skip a job."""
    try:
        value = _eval(ad, attr)
    except AdError:
        return None
    return value if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) else None


def _hook_refusal(ad: classad2.ClassAd, status: JobStatus) -> str | None:
    """The execute node's reason when its PREPARE_JOB hook last sent this idle job back to Idle
    (``VacateReasonCode`` 1007), whether or not the job is pinned now."""
    if status is not JobStatus.IDLE or _lenient(ad, "VacateReasonCode", int) != HOOK_REFUSED_VACATE_CODE:
        return None
    return (_lenient(ad, "VacateReason", str) or "the execute node refused the start")[:300]


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


@functools.lru_cache(maxsize=4096)
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


#: True while a slot ad is read: its expressions are the startd's, which may call
#: ``evalInEachContext`` (``_check_cost``'s ``slot``).
_READING_SLOT: contextvars.ContextVar[bool] = contextvars.ContextVar("reading_slot", default=False)


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
    elif kind is None and _lenient(ad, "CoSchedNodeSlot", bool):
        slot_kind = SlotKind.NODE
    return Slot(name=name, machine=machine, kind=slot_kind, total=total,
                free=free, device_name=_device_name(ad, kind), cache_id=cache_id,
                device_kind=kind.name if kind else None,
                updated_at_s=_number(ad, "LastHeardFrom", required=False) or _number(ad, "MyCurrentTime", required=False),
                children=_child_names(ad), unavailable=_unavailable(ad) or _no_guests(ad, slot_kind), gpus=gpus,
                gpu_single_account=single_account)


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
    (one ad per slot Name and job id, free amounts within the totals). What the sidecar
    calls on each read of the live pool: the job ads are read through :func:`plain_ads`."""
    return _build_state(((schedd, plain_ads(ads)) for schedd, ads in job_ads.items()), slot_ads)


def _build_state(job_ads: Iterable[tuple[str | None, Iterable[classad2.ClassAd | _PlainAd]]]
                 | Callable[[set[str]], Iterable[_JobRead]],
                 slot_ads: Iterable[classad2.ClassAd]) -> PoolState:
    """``state_from_ads`` on job ads that are read one at a time and then dropped: of each
    idle job only what its eligible slots and Rank depend on is kept (the slots come first).
    ``job_ads`` may instead be a function of the START references giving each ad's
    :func:`_read_jobs` entry (``state_from_snapshot`` reads half a file in another process)."""
    with gc_paused():
        read_slots: list[tuple[Slot, tuple[str, classad2.ClassAd], set[str]]] = []
        slot_skips: list[Skipped] = []
        for ad in slot_ads:  # each ad is dropped once its record and probe target are built
            try:
                slot = slot_from_ad(ad)
                if slot is not None:
                    read_slots.append((slot, (slot.name, _probe_target(ad)), _start_refs(ad)))
            except AdError as e:
                slot_skips.append(Skipped(f"slot {ad.get('Name', '?')}", str(e)))
            except _BadValue as e:  # a value the probe's ClassAd cannot hold
                slot_skips.append(Skipped(f"slot {ad.get('Name', '?')}", f"{e.attribute or 'a value'}: {e.problem}"))
        slots, duplicates = distinct_slots([slot for slot, _, _ in read_slots])
        kept = {id(slot) for slot in slots}
        targets = [target for slot, target, _ in read_slots if id(slot) in kept]
        start_refs = set().union(*(refs for slot, _, refs in read_slots if id(slot) in kept))
        del read_slots
        jobs: list[Job] = []
        skipped: list[Skipped] = []
        seen: set[JobKey] = set()
        idle: list[tuple[Job, tuple | None, tuple | None]] = []
        entries = job_ads(start_refs) if callable(job_ads) else _read_jobs(job_ads, start_refs)
        for job, eligibility, rank in entries:
            if job.__class__ is Skipped:
                skipped.append(job)
                continue
            jobs.append(job)
            if job.key not in seen:  # consistency keeps the first ad of a job id that reads
                seen.add(job.key)
                if job.is_idle:
                    idle.append((job, eligibility, rank))
        state = consistent_state(PoolState(tuple(jobs), tuple(slots), tuple(skipped + slot_skips + duplicates)))
        return replace(state, eligible=_eligible([(job, key) for job, key, _ in idle], targets),
                       ranks=_ranks([(job, key) for job, _, key in idle], targets))


#: The slot expressions matchmaking walks for references (START, and the slot's own
#: Requirements and Rank): checked on every live slot ad before they are.
_SLOT_WALKED = ("Start", "Requirements", "Rank")


def _check_cost(ad: classad2.ClassAd | _PlainAd, roots: tuple[str, ...], slot: bool = False) -> None:
    """Raise :class:`AdError` when what the sidecar evaluates of ``ad`` (``roots`` and every
    attribute they read) could cost more than the bound of :mod:`condor_sched.expression_cost`.
    Checked on the text before any classad2 call walks or evaluates it, so one user's ad
    cannot stall or stop a cycle for everyone. Of a snapshot's ad, found once per expressions
    among the roots and the values of what they follow. A ``slot`` ad (the startd's, not a
    user's) may call ``evalInEachContext``, as HTCondor's own slot ads do."""
    if ad.__class__ is not _PlainAd:
        _cost_of(_expressions_read(ad, roots)[0], dynamic=slot)
        return
    raw = _raw_values(ad, roots)
    first = (slot, roots, tuple([v if v.__class__ is str and v[:6] == _EXPR_PREFIX else None for v in raw]))
    try:
        followed = _FOLLOWED.get(first)
        key = None if followed is None else (first, followed, _raw_values(ad, followed))
        verdict = _COSTS.get(key, _COSTS) if key is not None else _COSTS
    except TypeError:  # a list or a nested ad: not a key
        _cost_of(_expressions_read(ad, roots)[0], dynamic=slot)
        return
    if verdict is _COSTS:
        expressions, followed = _expressions_read(ad, roots)
        verdict = _cost_of(expressions, check=False, dynamic=slot)
        if len(_COSTS) < _MAX_CACHED:
            _FOLLOWED[first] = followed
            _COSTS[(first, followed, _raw_values(ad, followed))] = verdict
    if verdict is not None:
        raise AdError(*verdict)


def _cost_of(expressions: list[tuple[str, str]], check: bool = True,
             dynamic: bool = False) -> tuple[str, str] | None:
    """``expression_cost_problem`` of ``expressions``; raised as AdError when ``check``."""
    problem = expression_cost_problem(expressions, dynamic=dynamic) if expressions else None
    if problem is not None and check:
        raise AdError(*problem)
    return problem


def _expressions_read(ad: classad2.ClassAd | _PlainAd, roots: tuple[str, ...]
                      ) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
    """(name, ClassAd text) of every expression among ``roots`` and what they read, nested
    ads' attributes and list items included, and the names followed beyond ``roots``."""
    found: list[tuple[str, str]] = []
    seen = {name.lower() for name in roots}
    followed: list[str] = []
    todo = [(name, value) for name, value in zip(roots, _values_of(ad, roots)) if value is not _MISSING]
    while todo:
        name, value = todo.pop()
        texts = _texts_of(name, value)
        found += texts
        for _, text in texts:
            names = tuple(n for n in names_read(text) if n not in seen)
            seen.update(names)
            followed += names
            todo += ((n, v) for n, v in zip(names, _values_of(ad, names)) if v is not _MISSING)
    return found, tuple(followed)


def _values_of(ad: classad2.ClassAd | _PlainAd, names: tuple[str, ...]) -> Iterable[Any]:
    """The values of ``names`` in ``ad`` as JSON values (expressions as ``"/Expr(...)/"``
    strings), ``_MISSING`` where absent."""
    if ad.__class__ is _PlainAd:
        return _raw_values(ad, names)
    return [_json_value(ad, name) if name in ad else _MISSING for name in names]


def _json_value(ad: classad2.ClassAd, name: str) -> Any:
    value = ad.get(name)
    if value.__class__ is str or isinstance(value, (int, float, bool)) or value is None:
        return value
    return f"{_EXPR_PREFIX}{ad.lookup(name)}{_EXPR_SUFFIX}"


def _texts_of(name: str, value: Any, depth: int = 0) -> list[tuple[str, str]]:
    """The expressions of one JSON value: itself, a nested ad's attributes, a list's items."""
    kind = value.__class__
    if kind is str:
        return [(name, value[6:-2])] if value[:6] == _EXPR_PREFIX and value[-2:] == _EXPR_SUFFIX else []
    if depth > MAX_VALUE_DEPTH:
        return []
    if kind is dict:
        return [found for key, item in value.items() for found in _texts_of(key, item, depth + 1)]
    if kind is list:
        return [found for item in value for found in _texts_of(name, item, depth + 1)]
    return []


#: ``_check_cost``'s caches: the names followed beyond the roots per values of the roots, and
#: the verdict per values of the roots and of those names (equal values: equal expressions).
_FOLLOWED: dict[tuple, tuple[str, ...]] = {}
_COSTS: dict[tuple, tuple[str, str] | None] = {}

#: One job ad read: its record with, when idle, its eligibility and Rank keys; or why it is skipped.
_JobRead = tuple[Job | Skipped, tuple | None, tuple | None]


def _read_jobs(job_ads: Iterable[tuple[str | None, Iterable[classad2.ClassAd | _PlainAd]]],
               start_refs: set[str]) -> Iterator[_JobRead]:
    """Each job ad's record (``_job_record``) and the keys its eligible slots and Rank are
    found by, or its Skipped entry, in the ads' order."""
    references: dict[str, tuple[str, ...]] = {}
    reads = _record_reads()
    for schedd, ads in job_ads:
        for ad in ads:
            source = schedd or schedd_of(ad, "unknown-schedd")
            try:
                job = _job_record(ad, source, reads)
                read = (job, _eligibility_key(ad, start_refs, references), _rank_key(ad)) if job.is_idle else \
                    (job, None, None)
            except AdError as e:
                yield Skipped(_describe_job(ad, source), str(e), *_key_and_pin(ad, source)), None, None
                continue
            yield read


def _start_refs(slot_ad: classad2.ClassAd | _PlainAd) -> set[str]:
    """``start_references`` of one slot; of a snapshot's slot, found once per text of START and
    of every slot attribute it reads (:func:`_reads_in`), on an ad of just those."""
    if slot_ad.__class__ is not _PlainAd or slot_ad.live or "Start" not in slot_ad or slot_ad.is_literal("Start"):
        return start_references([slot_ad])
    texts = _reads_in(slot_ad, ["start"], values=False)
    refs = _START_REFS.get(texts)
    if refs is None:
        refs = frozenset(start_references([_ad_of_reads(texts)]))
        if len(_START_REFS) < _MAX_CACHED:
            _START_REFS[texts] = refs
    return set(refs)


_START_REFS: dict[tuple[tuple[str, str], ...], frozenset[str]] = {}


def slot_ranks(jobs: Iterable[tuple[Job, classad2.ClassAd]],
               slot_ads: Iterable[classad2.ClassAd]) -> dict[JobKey, dict[str, float]]:
    """Each job's ``Rank`` of every partitionable slot (HTCondor's preference among slots
    that match: higher is better), for jobs whose Rank is not a constant; evaluated once per
    group of jobs equal in Rank and in every job attribute it reads. A Rank that does not
    evaluate to a number ranks a slot 0, as in HTCondor."""
    return _ranks([(job, _rank_key(ad)) for job, ad in jobs], _targets(slot_ads))


def _rank_key(ad: classad2.ClassAd | _PlainAd) -> tuple | None:
    """A job's Rank and the text of every job attribute it reads; None for a constant Rank."""
    if "Rank" not in ad or (ad.__class__ is _PlainAd and ad.is_literal("Rank")):
        return None
    _check_cost(ad, ("Rank",))
    full = _classad_of(ad)
    rank = full.lookup("Rank")
    try:
        if not full.externalRefs(rank) and not full.internalRefs(rank):
            return None  # a constant prefers no slot
    except ValueError:  # it reads itself round: an error, as HTCondor evaluates it, ranks every slot 0
        return None
    refs = sorted(r for r in _own_references_of(ad, "Rank") if r in full and r.lower() != "rank")
    return _carried("Rank", str(rank)), tuple((r, _carried(r, str(full.lookup(r)))) for r in refs)


def _ranks(jobs: Iterable[tuple[Job, tuple | None]],
           targets: list[tuple[str, classad2.ClassAd]]) -> dict[JobKey, dict[str, float]]:
    memo: dict[tuple, dict[str, float]] = {}
    out: dict[JobKey, dict[str, float]] = {}
    for job, key in jobs:
        if key is None:
            continue
        if key not in memo:
            probe = classad2.ClassAd()
            for r, value in key[1]:
                probe[r] = classad2.ExprTree(value)
            expr = classad2.ExprTree(key[0])
            memo[key] = {name: _rank_value(expr, probe, _classad_of(target)) for name, target in targets}
        if len(set(memo[key].values())) > 1:
            out[job.key] = memo[key]
    return out


def _targets(slot_ads: Iterable[classad2.ClassAd]) -> list[tuple[str, classad2.ClassAd]]:
    """Each partitionable slot's name and probe target (:func:`_probe_target`)."""
    return [(name, _probe_target(ad)) for ad in slot_ads
            if _eval_quietly(ad, "PartitionableSlot") and isinstance(name := _eval_quietly(ad, "Name"), str)]


def _rank_value(expr: classad2.ExprTree, job: classad2.ClassAd, slot: classad2.ClassAd) -> float:
    try:
        value = expr.eval(job, slot)
    except Exception:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return float(value) if isinstance(value, bool) else 0.0
    return float(value)


def _probe_target(slot_ad: classad2.ClassAd | _PlainAd) -> classad2.ClassAd | _PlainAd:
    """A copy of a partitionable slot's ad that asks whether a job could ever run there: its
    totals advertised as free (``Cpus`` = ``TotalSlotCpus``, ...; the planners account what
    is free now) and its START as its Requirements (the startd's ``WithinResourceLimits``
    left to the planners), so a symmetric match is the job's Requirements and the slot's START.
    Of a snapshot's ad it is a view of the parsed JSON whose ClassAd is built only if a match
    is evaluated on it (once per class of slots: 15,000 slot ads of 211 attributes took 3.5 s)."""
    if slot_ad.__class__ is _PlainAd and not slot_ad.live:
        values, names = dict(slot_ad.values), slot_ad.names
        for attr in slot_ad.values:
            if attr.lower().startswith("totalslot") and len(attr) > len("TotalSlot"):
                free = attr[len("TotalSlot"):]
                values[names.get(free.lower(), free)] = slot_ad.values[attr]
        start: Any = True
        if "Start" in slot_ad:
            text = slot_ad.lookup_text("Start")
            start = _EXPR_PREFIX + text + _EXPR_SUFFIX
            if start not in _EXPRESSIONS and len(_EXPRESSIONS) < _MAX_CACHED:
                _EXPRESSIONS[start] = str(_expression(text))
        values[names.get("requirements", "Requirements")] = start
        return _PlainAd(values)
    slot_ad = _classad_of(slot_ad)
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


def _own_references_of(ad: classad2.ClassAd | _PlainAd, attr: str) -> set[str]:
    """``_own_references`` of ``attr``'s expression in ``ad``; of one that reads itself round,
    whose references classad2 cannot tell, found by following each attribute's text."""
    _check_cost(ad, (attr,))
    full = _classad_of(ad)
    try:
        return _own_references(full, full.lookup(attr))
    except ValueError:
        pass
    refs: dict[str, str] = {}
    todo = [attr]
    while todo:
        read = _text_and_refs(ad, todo.pop())
        for ref in read[1] if read else ():
            name = ref[3:] if ref.lower().startswith("my.") else ref
            if "." not in name and name.lower() not in refs:
                refs[name.lower()] = name
                todo.append(name)
    return set(refs.values())


def start_references(slot_ads: Iterable[classad2.ClassAd]) -> set[str]:
    """The job attributes the slots' START expressions read (``TARGET.`` ones): a live
    query must project on them for :func:`eligible_slots` to judge START."""
    refs: set[str] = set()
    for ad in slot_ads:
        if ad.__class__ is _PlainAd:
            if "Start" not in ad or ad.is_literal("Start"):
                continue
            ad = ad.classad
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
    jobs equal in Requirements and in every job attribute the two read, and within a group once
    per class of slots equal in every attribute the two read (:class:`_SlotClasses`). Jobs every
    slot accepts are left out (the mapping's default); a job whose Requirements do not evaluate
    gets no slot."""
    slot_ads = [ad for ad in slot_ads if _eval_quietly(ad, "PartitionableSlot")]
    start_refs = start_references(slot_ads)
    references: dict[str, tuple[str, ...]] = {}
    return _eligible([(job, _eligibility_key(ad, start_refs, references)) for job, ad in jobs], _targets(slot_ads))


def _eligible(jobs: Iterable[tuple[Job, tuple | None]],
              targets: list[tuple[str, classad2.ClassAd]]) -> dict[JobKey, frozenset[str]]:
    every = frozenset(name for name, _ in targets)
    classes: _SlotClasses | None = None
    memo: dict[tuple, frozenset[str] | None] = {}  # None: every slot
    out: dict[JobKey, frozenset[str]] = {}
    for job, key in jobs:
        if key is None:
            continue
        if key not in memo:
            classes = classes or _SlotClasses(targets)
            names = _accepting(key[0], key[1], targets, classes)
            memo[key] = None if names == every else names
        if memo[key] is not None:
            out[job.key] = memo[key]
    return out


def _eligibility_key(ad: Any, start_refs: set[str], references: dict[str, tuple[str, ...]]) -> tuple | None:
    """A job's Requirements (the user's) and the text of every job attribute it and the
    slots' START read: jobs equal in it are accepted by the same slots. None: no Requirements.
    ``references`` keeps what each Requirements text reads (found from its first job's ad)."""
    attr = PIN_ORIGINAL_ATTR if PIN_ORIGINAL_ATTR in ad else "Requirements" if "Requirements" in ad else None
    if attr is None:
        return None
    text = _lookup_text(ad, attr)
    if text not in references:
        refs = _own_references_of(ad, attr) | start_refs
        references[text] = tuple(sorted(r for r in refs if r.lower() not in _PROBED))

    def probe_key() -> tuple:
        return _probe_checked(attr, (text, tuple((r, _lookup_text(ad, r)) for r in references[text] if r in ad)))

    if ad.__class__ is not _PlainAd or ad.live:
        return probe_key()
    raw = _raw_values(ad, references[text])  # the texts, once per JSON values read
    key = (text, references[text], raw, tuple(map(type, raw)))  # 1, 1.0 and true print apart
    try:
        found = _ELIGIBILITY_KEYS.get(key)
    except TypeError:  # a list or a nested ad
        return probe_key()
    if found is None:
        found = probe_key()
        if len(_ELIGIBILITY_KEYS) < _MAX_CACHED:
            _ELIGIBILITY_KEYS[key] = found
    return found


def _probe_checked(attr: str, key: tuple[str, tuple[tuple[str, str], ...]]) -> tuple:
    """An eligibility key, or AdError when the probe job it makes (its Requirements and the
    attributes read, :func:`_accepting`) could cost more to match than the bound allows."""
    problem = _PROBE_COSTS.get(key, _PROBE_COSTS)
    if problem is _PROBE_COSTS:
        problem = expression_cost_problem([(attr, key[0]), *key[1]])
        if len(_PROBE_COSTS) < _MAX_CACHED:
            _PROBE_COSTS[key] = problem
    if problem is not None:
        raise AdError(*problem)
    return key


_PROBE_COSTS: dict[tuple, tuple[str, str] | None] = {}
_ELIGIBILITY_KEYS: dict[tuple, tuple] = {}


#: Job attributes the probe sets itself (a pin written now), and Requirements.
_PROBED = {PIN_SLOT_ATTR.lower(), PIN_TIME_ATTR.lower(), "requirements"}


def _accepting(requirements: str, values: Iterable[tuple[str, str]],
               targets: list[tuple[str, classad2.ClassAd]], classes: _SlotClasses | None = None) -> frozenset[str]:
    """The names of ``targets`` that match a probe job of ``requirements`` and ``values``,
    evaluated on one slot of each of ``classes`` (every slot when None)."""
    # Expressions are copied as their text: an ExprTree looked up from one ad does not
    # always evaluate the same once inserted into another (seen with classad2 25.14).
    probe = classad2.ClassAd()
    for r, value in values:
        probe[r] = classad2.ExprTree(value)
    probe["Requirements"] = classad2.ExprTree(requirements)
    # As if pinned there now: a start the node refused before this pin does not count
    # (config.d/20's START keeps a job off only the pin it was refused on).
    probe[PIN_TIME_ATTR] = classad2.ExprTree("time()")
    if classes is None:
        groups = [[i] for i in range(len(targets))]
    else:  # probes alike in their expressions and in which attributes they have read the same
        signature = (requirements, tuple(r.lower() for r, _ in values),
                     tuple((r.lower(), v) for r, v in values if not _LITERAL.fullmatch(v)))
        started = classes.start_accepting(probe, values, requirements)
        if started is not None:
            # A symmetric match is the job's Requirements on the slot and the slot's START on
            # the job (classad2's symmetricMatch): each side evaluated once per class of
            # what that side reads, START once per value of the job attributes it reads.
            return classes.both(classes.requirements_accepting(requirements, values), started)
        groups = classes.partition(probe, signature)
    accepted = _classes_accepting(groups, targets, probe, lambda target: target.symmetricMatch(probe))
    if classes is not None:
        return classes.names(groups, accepted)
    return frozenset(targets[i][0] for members in accepted for i in members)


def _classes_accepting(groups: list[list[int]], targets: list[tuple[str, classad2.ClassAd]],
                       probe: classad2.ClassAd, match: Callable[[classad2.ClassAd], bool]) -> list[list[int]]:
    """The classes of ``groups`` whose first member ``match``es ``probe`` pinned to it."""
    accepted = []
    for members in groups:
        name, target = targets[members[0]]
        probe[PIN_SLOT_ATTR] = name
        try:
            if match(_classad_of(target)):
                accepted.append(members)
        except Exception:  # a hostile expression matches nothing, as in HTCondor
            pass
    return accepted


#: A ClassAd literal as classad2 prints it (a value that reads no attribute).
_LITERAL = re.compile(r'-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|"(?:[^"\\]|\\.)*"|true|false|undefined|error',
                      re.IGNORECASE)
#: config.d/20's COSCHED_PINNED_HERE as classad2 prints it: the only place its START reads the
#: slot's Name, compared with the pin the probe sets to that very Name.
_PINNED_HERE = str(classad2.ExprTree(
    r'TARGET.CoSchedPinSlot =?= regexps("^(slot[0-9]+)(_[0-9]+)?(@.*)", MY.Name, "\\1\\3")'))
#: References after which a slot is its own class: its name, the pin (set to that name), and
#: ``eval``-like functions that read attributes no reference names.
_NAME_REFS = {"name", "my.name", PIN_SLOT_ATTR.lower(), f"my.{PIN_SLOT_ATTR.lower()}",
              f"target.{PIN_SLOT_ATTR.lower()}"}


class _SlotClasses:
    """Probe targets (``eligible_slots``) in classes whose every member gives a probe job the
    same answer: equal in START's text once its pin clause (``_PINNED_HERE``, whose value for a
    probe pinned to the slot is known per slot) is replaced by that value, and in the text of
    every slot attribute START and the probe job read (followed through expressions). A slot
    whose START still reads its Name or the pin, or calls an ``eval`` function, is a class of
    its own, as is every slot for a job that reads its own pin; HTCondor's matchmaking is then
    evaluated once per class instead of once per slot (issue 11: 10k slots)."""

    def __init__(self, targets: list[tuple[str, classad2.ClassAd]]):
        self.targets = targets
        self._values: dict[tuple[int, str], tuple[str, tuple[str, ...]]] = {}
        self._partitions: dict[tuple[frozenset[str], bool], list[list[int]]] = {}
        self._reads: dict[Hashable, frozenset[str] | None] = {}
        self._names: dict[tuple[int, ...], frozenset[str]] = {}
        self._singletons = [[i] for i in range(len(targets))]
        self._pinned_here = classad2.ExprTree(_PINNED_HERE)
        self._both: dict[tuple[int, int], frozenset[str]] = {}
        self._operands: dict[tuple[str, tuple[tuple[str, str], ...]], frozenset[str]] = {}
        self.start = [self._start_key(i) for i in range(len(targets))]
        self.start_reads = self._start_job_reads()
        self._start_groups: list[list[int]] | None = None
        self._start_memo: dict[tuple, frozenset[str]] = {}

    def _start_job_reads(self) -> frozenset[str] | None:
        """The job attributes (lower case) any slot's START reads (``TARGET.X``, and unqualified
        names the slot lacks); None when a START calls an ``eval`` function or does not parse."""
        reads: set[str] = set()
        for texts in {_reads_in(target, ["requirements"], values=False) for _, target in self.targets}:
            try:
                ad = _ad_of_reads(texts)
                expr = ad.lookup("Requirements")
                refs = ad.externalRefs(expr)
            except Exception:
                return None
            if "eval" in str(expr).lower():
                return None
            for ref in refs:
                lower = ref.lower()
                if lower.startswith("target."):
                    reads.add(lower[7:].split(".", 1)[0])
                elif "." not in lower:
                    reads.add(lower)
        return frozenset(reads)

    def start_accepting(self, probe: classad2.ClassAd, values: Iterable[tuple[str, str]],
                        requirements: str) -> frozenset[str] | None:
        """The names of the slots whose START accepts ``probe`` pinned to them, evaluated once
        per class of equal START (``start``) and memoised on the values of the job attributes
        START reads; None when that cannot be known (``start_reads`` is None)."""
        if self.start_reads is None:
            return None
        key = (tuple((r.lower(), v) for r, v in values if r.lower() in self.start_reads),
               requirements if "requirements" in self.start_reads else None)
        if key not in self._start_memo:
            if self._start_groups is None:
                classes: dict[Hashable, list[int]] = {}
                for i in range(len(self.targets)):
                    classes.setdefault(("own", i) if self.start[i] is None else self.start[i], []).append(i)
                self._start_groups = list(classes.values())
            accepted = _classes_accepting(self._start_groups, self.targets, probe, probe.matches)
            self._start_memo[key] = self.names(self._start_groups, accepted)
        return self._start_memo[key]

    def _start_key(self, i: int) -> tuple | None:
        """Slot ``i``'s START with its pin clause's value, and what it reads of the slot."""
        name, target = self.targets[i]
        if not isinstance(name, str):
            return None
        try:
            text = _lookup_text(target, "Requirements")
            if _PINNED_HERE in text:  # reads the slot's Name alone: evaluated on an ad of it
                pinned = classad2.ClassAd({PIN_SLOT_ATTR: name})
                name_ad = classad2.ClassAd({a: classad2.ExprTree(t) for a, t in _reads_in(target, ["name"])})
                here = self._pinned_here.eval(name_ad, pinned)
                if not isinstance(here, bool):
                    return None
                text = text.replace(_PINNED_HERE, "true" if here else "false")
            if "eval" in text.lower():
                return None
            refs = _direct_refs(text)
        except Exception:
            return None
        if any(r.lower() in _NAME_REFS for r in refs):
            return None
        reads = self._closure(i, _slot_side(refs))
        return None if reads is None else (text, reads)

    def _value(self, i: int, attr: str) -> tuple[str, tuple[str, ...] | None]:
        """Slot ``i``'s ``attr`` as text ("" when absent), and the slot attributes it reads when
        an expression; None when it reads the slot's Name or the pin, or calls an ``eval``
        function (it reads what no reference names)."""
        key = (i, attr)
        if key not in self._values:
            read = _text_and_refs(self.targets[i][1], attr)
            if read is None:
                self._values[key] = ("", ())
            else:
                text, refs = read
                if "eval" in text.lower() or any(r.lower() in _NAME_REFS for r in refs):
                    self._values[key] = (text, None)
                else:
                    self._values[key] = (text, tuple(_slot_side(refs)))
        return self._values[key]

    def _closure(self, i: int, attrs: Iterable[str]) -> tuple[tuple[str, str], ...] | None:
        """The text of every attribute of slot ``i`` that reading ``attrs`` reads; None when it
        reads its Name or the pin."""
        seen: dict[str, str] = {}
        todo = list(attrs)
        while todo:
            attr = todo.pop()
            if attr in seen:
                continue
            if attr in _NAME_REFS:
                return None
            seen[attr], refs = self._value(i, attr)
            if refs is None:
                return None
            todo += refs
        return tuple(sorted(seen.items()))

    def partition(self, probe: classad2.ClassAd, signature: Hashable, with_start: bool = True) -> list[list[int]]:
        """Indices of the targets in classes that answer ``probe`` alike (pin aside), a list kept
        as long as this object: in the probe's Requirements and the slot's START, or
        (``with_start`` false) in the probe's Requirements alone. ``signature``: equal for
        probes whose expressions read the same (``_accepting``)."""
        if signature not in self._reads:
            self._reads[signature] = self._slot_reads(probe)
        attrs = self._reads[signature]
        if attrs is None:
            return self._singletons
        if (attrs, with_start) not in self._partitions:
            classes: dict[tuple, list[int]] = {}
            for i in range(len(self.targets)):
                reads = None if with_start and self.start[i] is None else self._closure(i, attrs)
                own = ("own", i) if reads is None else (self.start[i] if with_start else None, reads)
                classes.setdefault(own, []).append(i)
            self._partitions[(attrs, with_start)] = list(classes.values())
        return self._partitions[(attrs, with_start)]

    def requirements_accepting(self, requirements: str, values: Iterable[tuple[str, str]]) -> frozenset[str]:
        """The names of the slots that a probe job of ``requirements`` and ``values`` (job
        attributes' texts) pinned to them matches, the job's side only. Each operand of the
        top-level ``&&`` is evaluated apart, once per class of slots and memoised on its text and
        the job attributes it reads: ``A && B`` is true only when both are (false, undefined or
        error make it not true), so the slots it accepts are the intersection. A queue's jobs
        differ in a few operands (the request sizes); the file system clause of
        ``should_transfer_files = IF_NEEDED``, which makes every node a class of its own, then
        is evaluated once per file system domain of the jobs, not per job shape."""
        by_name = {r.lower(): (r, v) for r, v in values}
        parts = _top_level_conjuncts(_strip_parentheses(requirements)) or [requirements]
        reads = [_job_attributes_read(part, by_name) for part in parts]
        if len(parts) == 1 or None in reads:  # one operand, or one reads the Requirements: the whole
            parts, reads = [requirements], [tuple(sorted(values))]
        accepted: frozenset[str] | None = None
        for part, read in zip(parts, reads):
            key = (part, read)
            if key not in self._operands:
                probe = classad2.ClassAd()
                for r, value in read:
                    probe[r] = classad2.ExprTree(value)
                probe["Requirements"] = classad2.ExprTree(part)
                probe[PIN_TIME_ATTR] = classad2.ExprTree("time()")
                signature = (part, tuple(r.lower() for r, _ in read),
                             tuple((r.lower(), v) for r, v in read if not _LITERAL.fullmatch(v)))
                groups = self.partition(probe, signature, with_start=False)
                matched = _classes_accepting(groups, self.targets, probe, lambda target: target.matches(probe))
                self._operands[key] = self.names(groups, matched)
            accepted = self._operands[key] if accepted is None else self.both(accepted, self._operands[key])
        assert accepted is not None
        return accepted

    def both(self, first: frozenset[str], second: frozenset[str]) -> frozenset[str]:
        """``first & second`` of sets this object keeps (``names``, ``start_accepting``), each
        intersection made once."""
        key = (id(first), id(second))
        if key not in self._both:
            self._both[key] = first & second
        return self._both[key]

    def names(self, partition: list[list[int]], classes: list[list[int]]) -> frozenset[str]:
        """The names of the targets in ``classes`` of ``partition`` (a list ``partition`` gave,
        kept as long as this object), each union made once."""
        key = (id(partition), *(members[0] for members in classes))
        if key not in self._names:
            self._names[key] = frozenset(self.targets[i][0] for members in classes for i in members)
        return self._names[key]

    def _slot_reads(self, probe: classad2.ClassAd) -> frozenset[str] | None:
        """The slot attributes ``probe``'s expressions read; None when they read the slot's
        name or the pin, or call an ``eval`` function (then every slot is its own class)."""
        try:
            exprs = [probe.lookup(a) for a in probe.keys() if a.lower() != PIN_SLOT_ATTR.lower()]
            reads = [r for e in exprs for r in (*probe.internalRefs(e), *probe.externalRefs(e))]
            texts = " ".join(str(e) for e in exprs).lower()
        except Exception:
            return None
        if "eval" in texts or any(r.lower() in _NAME_REFS for r in reads):
            return None
        present = {a.lower() for a in probe.keys()}
        return frozenset(a for r in reads for a in _slot_side([r], present))


def _job_attributes_read(expression: str, values: dict[str, tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
    """Of ``values`` (a job's attributes by lower-case name: name, text), those ``expression``
    reads (``MY.X`` and unqualified references, followed through their texts), in name order;
    None when it reads the job's Requirements."""
    seen: dict[str, tuple[str, str]] = {}
    todo = [expression]
    while todo:
        for ref in _direct_refs(todo.pop()):
            lower = ref.lower()
            if lower.startswith("target."):
                continue
            attr = lower.removeprefix("my.").split(".", 1)[0]
            if attr == "requirements":
                return None
            if attr in values and attr not in seen:
                seen[attr] = values[attr]
                todo.append(values[attr][1])
    return tuple(sorted(seen.values()))


def _slot_side(refs: Iterable[str], probe_attrs: set[str] | None = None) -> list[str]:
    """The slot attributes (lower case) among references: ``TARGET.X`` from a job's side,
    ``MY.X`` and unqualified ones from the slot's side (``probe_attrs`` given: a job's
    unqualified references that the probe job lacks, which HTCondor looks up in the slot)."""
    out = []
    for ref in refs:
        lower = ref.lower()
        if not lower:
            continue
        if probe_attrs is None:
            if lower.startswith("target."):
                continue
            out.append(lower.removeprefix("my.").split(".", 1)[0])
        elif lower.startswith("target."):
            out.append(lower[7:].split(".", 1)[0])
        elif "." not in lower and lower not in probe_attrs:
            out.append(lower)
    return out


#: Each expression's text (as classad2 prints it) and the references it makes, not followed
#: through any ad (``_direct_refs``); ads of a few attributes by their texts (``_ad_of_reads``).
_DIRECT_REFS: dict[str, tuple[str, ...]] = {}
_READS_ADS: dict[tuple[tuple[str, str], ...], classad2.ClassAd] = {}
_NO_AD = classad2.ClassAd()
_RAW_TEXT_REFS: dict[tuple[type, Any], tuple[str, tuple[str, ...]]] = {}


def _direct_refs(text: str) -> tuple[str, ...]:
    """The references (``X``, ``MY.X``, ``TARGET.X``, ``X.Y``) an expression's text makes."""
    refs = _DIRECT_REFS.get(text)
    if refs is None:
        try:
            refs = tuple(r for r in _NO_AD.externalRefs(classad2.ExprTree(text)) if r)
        except ValueError:  # it reads itself round (a nested ad): every name it may read, unscoped
            refs = names_read(text)
        if len(_DIRECT_REFS) < _MAX_CACHED:
            _DIRECT_REFS[text] = refs
    return refs


def _text_and_refs(ad: classad2.ClassAd | _PlainAd, attr: str) -> tuple[str, tuple[str, ...]] | None:
    """``attr`` of ``ad`` as ClassAd text and the references it makes (none for a plain value);
    None when ``ad`` lacks it. Of a snapshot's ad, found once per JSON value."""
    if ad.__class__ is _PlainAd:
        name = ad.names.get(attr.lower())
        if name is None:
            return None
        raw = ad.values[name]
        key = (raw.__class__, raw)  # True == 1 == 1.0, but their texts differ
        try:
            read = _RAW_TEXT_REFS.get(key)
        except TypeError:  # a list or a nested ad
            key = read = None
        if read is None:
            text = ad.lookup_text(attr)
            read = text, () if ad.is_literal(attr) else _direct_refs(text)
            if key is not None and not ad.live and len(_RAW_TEXT_REFS) < _MAX_CACHED:
                _RAW_TEXT_REFS[key] = read
        return read
    if attr not in ad:
        return None
    value = ad.get(attr)
    text = str(ad.lookup(attr))
    return text, () if isinstance(value, (str, int, float, bool)) or value is None else _direct_refs(text)


def _reads_in(ad: classad2.ClassAd | _PlainAd, attrs: Iterable[str],
              values: bool = True) -> tuple[tuple[str, str], ...]:
    """The text of every attribute of ``ad`` that evaluating ``attrs`` in it reads (lower-case
    names; ``MY.X`` and unqualified references followed through expressions): an ad of just
    these (``_ad_of_reads``) evaluates ``attrs`` as ``ad`` does. ``values`` false: plain values
    shown as 0, enough to tell the references ``attrs`` make (each slot's Name is its own)."""
    seen: dict[str, str] = {}
    todo = list(attrs)
    while todo:
        attr = todo.pop()
        if attr in seen:
            continue
        read = _text_and_refs(ad, attr)
        if read is None:
            continue
        seen[attr] = read[0] if values or read[1] or not _LITERAL.fullmatch(read[0]) else "0"
        todo += (r.lower().removeprefix("my.").split(".", 1)[0] for r in read[1] if not r.lower().startswith("target."))
    return tuple(sorted(seen.items()))


def _ad_of_reads(texts: tuple[tuple[str, str], ...]) -> classad2.ClassAd:
    """A ClassAd of ``_reads_in``'s attributes, built once per texts."""
    ad = _READS_ADS.get(texts)
    if ad is None:
        ad = classad2.ClassAd({attr: classad2.ExprTree(text) for attr, text in texts})
        if len(_READS_ADS) < _MAX_CACHED:
            _READS_ADS[texts] = ad
    return ad


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


def _real(value: int) -> float:
    """An integer beyond 64 bits as the real ``_json_int`` makes of its digits (infinite past
    a double's range, where ``float`` of the integer would raise)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


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
        if not attr.isascii() and _lone_surrogate(attr):
            raise _BadValue(_SURROGATE_PROBLEM, attr.encode("utf-8", "backslashreplace").decode())
        if value.__class__ in _PLAIN or (value.__class__ is str and not value.startswith(_EXPR_PREFIX)):
            if value.__class__ is str and not value.isascii() and _lone_surrogate(value):
                raise _BadValue(_SURROGATE_PROBLEM, attr)
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


def _lone_surrogate(text: str) -> bool:
    """True when ``text`` holds half of a UTF-16 pair (JSON ``"\\ud800"``): classad2 25.14
    crashes the process on such a string."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_SURROGATE_PROBLEM = "not Unicode text (an unpaired \\uD800-\\uDFFF escape)"


def _value(value: Any, depth: int) -> Any:
    """One JSON value as a ClassAd value (module ``_ads_from_json``)."""
    if isinstance(value, str) and not value.isascii() and _lone_surrogate(value):
        raise _BadValue(_SURROGATE_PROBLEM)
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


class _PlainAd:
    """One ad as parsed JSON values (``condor_q -json``, or a live ad printed as JSON): plain
    values (numbers, strings, booleans, null) are read as they are, and the ClassAd of the
    whole ad is built (or, for a live ad, used) only for what needs ClassAd semantics: an
    expression to evaluate or to read references of, a list, a nested ad. Names are looked up
    without regard to case, as in a ClassAd."""

    __slots__ = ("values", "names", "_classad", "live")

    def __init__(self, values: dict, classad: classad2.ClassAd | None = None, live: bool = False,
                 names: dict[str, str] | None = None):
        self.values = values
        self.names = names or _layout_names(values)
        self._classad = classad
        #: Values printed from a live ClassAd: a real or an expression is read from that ad
        #: (printJson rounds reals; a string is never an expression there).
        self.live = live

    @property
    def classad(self) -> classad2.ClassAd:
        if self._classad is None:
            self._classad = _classad(self.values, 0)
        return self._classad

    def __contains__(self, attr: str) -> bool:
        return attr.lower() in self.names

    def _plain(self, attr: str) -> Any:
        """The JSON value of ``attr`` when it is plain, ``_MISSING`` when absent, else ``_COMPLEX``."""
        name = self.names.get(attr.lower())
        if name is None:
            return _MISSING
        value = self.values[name]
        kind = value.__class__
        if kind is str:
            return _COMPLEX if value.startswith(_EXPR_PREFIX) and value.endswith(_EXPR_SUFFIX) else value
        if kind is int or kind is bool or value is None or (kind is float and not self.live):
            return value
        if kind is list and all(_plain_item(v) for v in value):
            return list(value)
        return _COMPLEX

    def is_literal(self, attr: str) -> bool:
        """True when ``attr`` holds a plain value (it refers to nothing)."""
        return self._plain(attr) is not _COMPLEX

    def eval(self, attr: str) -> Any:
        """``_eval``: the evaluated value, None when missing or undefined."""
        value = self._plain(attr)
        if value is _MISSING:
            return None
        if value is _COMPLEX:
            _check_cost(self, (attr,), slot=_READING_SLOT.get())
            return _eval(self.classad, attr)
        return value

    def get(self, attr: str, default: Any = None) -> Any:
        """``ClassAd.get``: a plain value as it is, undefined as ``Value.Undefined``."""
        value = self._plain(attr)
        if value is _MISSING:
            return default
        if value is _COMPLEX:
            return self.classad.get(attr, default)
        return classad2.Value.Undefined if value is None else value

    def lookup_text(self, attr: str) -> str:
        """``str(ad.lookup(attr))``: the value as ClassAd text (expressions as classad2 prints them)."""
        value = self._plain(attr)
        if value is _COMPLEX or value.__class__ is list:
            raw = self.values[self.names[attr.lower()]]
            if not self.live and raw.__class__ is str and raw in _EXPRESSIONS:
                return _EXPRESSIONS[raw]
            return _carried(attr, str(self.classad.lookup(attr)))
        key = (value.__class__, value)
        text = _UNPARSED.get(key)
        if text is None:
            text = _carried(attr, str(classad2.ClassAd({"v": value}).lookup("v")))
            if len(_UNPARSED) < _MAX_CACHED:
                _UNPARSED[key] = text
        return text


_MISSING, _COMPLEX = object(), object()


def _plain_item(value: Any) -> bool:
    """True for a list item that evaluates to itself (a string, integer, boolean)."""
    kind = value.__class__
    return (kind is str and not value.startswith(_EXPR_PREFIX)) or kind is int or kind is bool
#: Caches of the readers, each bounded by ``_MAX_CACHED`` entries: attribute names (lower case
#: to as written) per layout of an ad, expressions that parse (as in JSON -> as classad2 prints
#: them), and plain values as ClassAd text.
_MAX_CACHED = 100_000
_LAYOUTS: dict[str, dict[str, str]] = {}


def _layout_names(values: dict) -> dict[str, str]:
    """The names of ``values`` (lower case to as written), one map per layout of an ad, found
    by the names joined with NUL: one string to hash and compare where a tuple of fresh names
    cost 6 us an ad."""
    layout = "\0".join(values)
    names = _LAYOUTS.get(layout)
    if names is None:
        names = {name.lower(): name for name in values}
        if len(_LAYOUTS) < _MAX_CACHED and layout.count("\0") == len(values) - 1:  # no name holds a NUL
            _LAYOUTS[layout] = names
    return names
_EXPRESSIONS: dict[str, str] = {}
_UNPARSED: dict[tuple[type, Any], str] = {}


def _lookup_text(ad: classad2.ClassAd | _PlainAd, attr: str) -> str:
    return ad.lookup_text(attr) if ad.__class__ is _PlainAd else _carried(attr, str(ad.lookup(attr)))


def _carried(attr: str, text: str) -> str:
    """``text`` (an attribute's ClassAd text), or AdError when it holds a NUL character: no
    ClassAd carries one (classad2 prints it as ``\\000`` and refuses to parse that back, and so
    do HTCondor's daemons), so the job is skipped and told why rather than probed."""
    if "\0" in text or ("\\000" in text and "\\000" in text.replace("\\\\", "")):
        raise AdError(attr, "holds a NUL character, which a ClassAd string cannot carry")
    return text


def _classad_of(ad: classad2.ClassAd | _PlainAd) -> classad2.ClassAd:
    return ad.classad if ad.__class__ is _PlainAd else ad


def plain_ads(ads: Iterable[classad2.ClassAd], batch: int = 1000) -> Iterator[classad2.ClassAd | _PlainAd]:
    """Live ClassAds (``Schedd.query``) as :class:`_PlainAd` views, printed as JSON by classad2 and
    parsed ``batch`` at a time: the records read their plain values without one classad2 call
    per attribute. An ad whose JSON does not parse is given as it is."""
    chunk: list[classad2.ClassAd] = []
    for ad in ads:
        chunk.append(ad)
        if len(chunk) == batch:
            yield from _plain_batch(chunk)
            chunk = []
    yield from _plain_batch(chunk)


def _plain_batch(ads: list[classad2.ClassAd]) -> Iterator[classad2.ClassAd | _PlainAd]:
    if not ads:
        return
    try:
        values = json.loads("[" + ",".join(ad.printJson() for ad in ads) + "]", parse_int=_json_int)
    except Exception:
        values = [None] * len(ads)
        for i, ad in enumerate(ads):
            try:
                values[i] = json.loads(ad.printJson(), parse_int=_json_int)
            except Exception:
                pass
    for ad, obj in zip(ads, values):
        yield _PlainAd(obj, ad, live=True) if isinstance(obj, dict) and len(obj) == len(ad) else ad


class _Fallback(Exception):
    """The streaming reader met what the whole-file reader must judge (an error, a lone object)."""


class _SplitFailed(Exception):
    """Reading a file in two halves did not work out (the cut was not between two ads, a bad
    ad, the other process failed): read it in one stream instead."""


class _Span(NamedTuple):
    """Bytes ``start`` to ``end`` of a file, read as if ``head`` came before and ``tail`` after."""
    start: int
    end: int
    head: bytes
    tail: bytes


class _SpanReader:
    """``read`` of a :class:`_Span` of an open file."""

    def __init__(self, f: BinaryIO, span: _Span):
        self.f, self.left, self.pending = f, span.end - span.start, span.head
        self.tail = span.tail
        f.seek(span.start)

    def read(self, size: int) -> bytes:
        data, self.pending = self.pending, b""
        if self.left > 0:
            chunk = self.f.read(min(size, self.left))
            self.left = self.left - len(chunk) if chunk else 0
            data += chunk
        if self.left <= 0:
            data, self.tail = data + self.tail, b""
        return data


#: Queue files from this size are read in two processes, half of the ads each, when the
#: process may run on two CPUs (``plan`` on 100k ads, 520 MB: parsing JSON is half its time).
SPLIT_READ_BYTES = 64 << 20
#: Where one ad ends and the next begins: ``}``, a comma, ``{`` and the quote of a name. Inside
#: a string this cannot end in a quote; inside an ad it leaves the first half unbalanced, so the
#: first half parsing as a list proves the cut.
_AD_BOUNDARY = re.compile(rb'\}[ \t\r\n]*(,)[ \t\r\n]*(\{)[ \t\r\n]*"')


def _halves(path: Path) -> tuple[_Span, _Span] | None:
    """The two halves of a queue file worth reading apart, cut between two ads near the middle."""
    try:
        size = path.stat().st_size
        if not SPLIT_READ_BYTES <= size <= MAX_SNAPSHOT_BYTES or len(os.sched_getaffinity(0)) < 2:
            return None
        with path.open("rb") as f:
            f.seek(size // 2)
            found = _AD_BOUNDARY.search(f.read(1 << 20))
    except OSError:
        return None
    if found is None:
        return None
    comma, brace = size // 2 + found.start(1), size // 2 + found.start(2)
    return _Span(0, comma, b"", b"]"), _Span(brace, size, b"[", b"")


def _split_reader(path: Path) -> Callable[[set[str]], Iterator[_JobRead]] | None:
    """``_build_state``'s reader of a big queue file in two processes: a forked child reads the
    second half of the ads while this process reads the first, and sends its entries back.
    Raises _SplitFailed (read the file in one stream) on anything but two clean halves."""
    halves = _halves(path)
    if halves is None:
        return None

    def read(start_refs: set[str]) -> Iterator[_JobRead]:
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_read_half, args=(path, halves[1], start_refs, sender), daemon=True)
        child.start()
        sender.close()
        try:
            count = 0
            try:
                for entry in _read_jobs([(None, _span_ads(path, halves[0]))], start_refs):
                    count += 1
                    yield entry
                rest = receiver.recv()
            except (_Fallback, EOFError, OSError):
                raise _SplitFailed from None
            if rest is None or count + len(rest) > MAX_ADS:
                raise _SplitFailed
            yield from rest
        finally:
            receiver.close()
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join()

    return read


def _read_half(path: Path, span: _Span, start_refs: set[str], sender: Connection) -> None:
    """The child of ``_split_reader``: its half's entries, or None when it cannot read them."""
    try:
        entries: list[_JobRead] | None = list(_read_jobs([(None, _span_ads(path, span))], start_refs))
    except Exception:
        entries = None
    sender.send(entries)
    sender.close()


def _span_ads(path: Path, span: _Span) -> Iterator[_PlainAd]:
    """The ads of one half of a queue file; _Fallback on anything ``_stream_ads`` would fall
    back on (the caller then reads the whole file as one stream)."""
    escapes = {"surrogate": False}
    for obj in _json_items(path, escapes, span):
        yield _checked(obj, escapes["surrogate"])


def state_from_snapshot(queue: str | Path, machines: str | Path) -> PoolState:
    """The pool state of snapshot files, as ``state_from_ads(read_ads(queue), read_ads(machines))``
    gives it, with the same errors, but read as a stream: the machines first, then each job ad
    parsed alone, checked as ``read_ads`` checks it, turned into a record and dropped; only
    expressions are parsed with classad2 (each distinct text once) and a job's ClassAd is built
    only when an attribute the planner reads is an expression (issue 11). A big queue file is
    read in two processes (``_split_reader``), half of its ads each, the same entries in order."""
    try:
        try:
            split = _split_reader(Path(queue))
            if split is not None:
                return _build_state(split, _machine_ads(Path(machines)))
        except _SplitFailed:
            pass
        return _build_state([(None, _stream_ads(Path(queue)))], _machine_ads(Path(machines)))
    except _BadMachines as bad:
        try:
            for _ in _stream_ads(Path(queue)):  # a bad queue file is named first, as by read_ads
                pass
        except _Fallback:
            pass
        raise bad.error from None
    except _Fallback:
        return _build_state([(None, read_ads(queue))], read_ads(machines))


class _BadMachines(Exception):
    def __init__(self, error: SnapshotError):
        super().__init__(str(error))
        self.error = error


def _machine_ads(path: Path) -> Iterator[classad2.ClassAd | _PlainAd]:
    """``_stream_ads`` of the machines file, its SnapshotError wrapped (``state_from_snapshot``)."""
    try:
        yield from _stream_ads(path)
    except SnapshotError as e:
        raise _BadMachines(e) from None


def _stream_ads(path: Path) -> Iterator[classad2.ClassAd | _PlainAd]:
    """The ads of a snapshot file one at a time: JSON lists streamed (:func:`_json_items`), any
    other file, and any file the stream cannot judge, read whole by :func:`read_ads`. Raises
    SnapshotError as ``read_ads`` does, or _Fallback after part of a file was given (then
    ``read_ads`` has found no error: read it whole)."""
    escapes = {"surrogate": False}
    items = _json_items(path, escapes)
    try:
        first = next(items, None)
    except _Fallback:
        yield from read_ads(path)
        return
    if first is None:
        return
    try:
        yield _checked(first, escapes["surrogate"])
        for obj in items:
            yield _checked(obj, escapes["surrogate"])
    except _Fallback:
        read_ads(path)  # raises the error, as the whole-file reader names it
        raise


def _checked(obj: Any, surrogates: bool) -> _PlainAd:
    """One streamed JSON item as ``_ads_from_json`` takes it, as a view; _Fallback when it
    refuses it. ``surrogates``: the file has ``\\uD800``-like escapes, so every string is checked."""
    if obj.__class__ is not dict:
        raise _Fallback
    if surrogates:
        _big_reals(obj)
        try:
            return _PlainAd(obj, _classad(obj, 0))
        except _BadValue:
            raise _Fallback from None
    names = _LAYOUTS.get("\0".join(obj))
    if names is None and not _names_ok(tuple(obj)):
        raise _Fallback
    if _nothing_to_check(obj):
        return _PlainAd(obj, names=names)
    _check_nested(obj, -1)  # the ad's own values at depth -1, its lists and nested ads from 0
    return _PlainAd(obj)


def _nothing_to_check(obj: dict) -> bool:
    """True when every value of ``obj`` is a string that is no new expression, an integer of 64
    bits, a real, a boolean or null: the usual ad, told in one lean pass (4x the full check)."""
    for value in obj.values():
        kind = value.__class__
        if kind is str:
            if value[:6] != _EXPR_PREFIX or value in _EXPRESSIONS:
                continue
        elif kind is int:
            if -9223372036854775808 <= value < 9223372036854775808:
                continue
        elif kind is float or kind is bool or value is None:
            continue
        return False
    return True


def _known_expression(value: str) -> None:
    """Remember ``"/Expr(...)/"`` as classad2 prints it; _Fallback when it does not parse."""
    try:
        text = str(_expression(value[len(_EXPR_PREFIX):-len(_EXPR_SUFFIX)]))
    except _BadValue:
        raise _Fallback from None
    if len(_EXPRESSIONS) < _MAX_CACHED:
        _EXPRESSIONS[value] = text


def _check_nested(value: list | dict, depth: int) -> None:
    """``_value``'s checks of a list or nested ad, without building it (integers beyond 64 bits
    made reals, as ``_json_int`` reads them); _Fallback where ``_value`` refuses."""
    if depth >= MAX_VALUE_DEPTH:
        raise _Fallback
    if value.__class__ is dict:
        if not _names_ok(tuple(value)):
            raise _Fallback
        keys: Iterable = list(value)
    else:
        keys = range(len(value))
    for key in keys:
        item = value[key]
        kind = item.__class__
        if kind is str:
            if item.startswith(_EXPR_PREFIX) and item.endswith(_EXPR_SUFFIX) and item not in _EXPRESSIONS:
                _known_expression(item)
        elif kind is int:
            if not -2**63 <= item < 2**63:
                value[key] = _real(item)
        elif kind is list or kind is dict:
            _check_nested(item, depth + 1)


def _big_reals(value: list | dict) -> None:
    """Integers beyond 64 bits in ``value`` made reals, in place (``_json_int``)."""
    for key in (list(value) if value.__class__ is dict else range(len(value))):
        item = value[key]
        if item.__class__ is int and not -2**63 <= item < 2**63:
            value[key] = _real(item)
        elif item.__class__ is list or item.__class__ is dict:
            _big_reals(item)


def _names_ok(layout: tuple[str, ...]) -> bool:
    """True when classad2 takes these attribute names."""
    try:
        classad2.ClassAd(dict.fromkeys(layout, 0))
    except Exception:
        return False
    return True


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_CHUNK_BYTES = 1 << 22


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _json_items(path: Path, escapes: dict[str, bool], span: _Span | None = None) -> Iterator[Any]:
    """Each item of a file holding a JSON list, parsed one at a time from 4 MiB reads (the text
    is never held whole); _Fallback for anything else (an object, a BOM, not UTF-8, a syntax
    error, a bound broken: ``read_ads`` names it). Sets ``escapes["surrogate"]`` once the text
    has an escape of half a UTF-16 pair. ``span``: read only those bytes of the file, as a list."""
    try:
        raw = path.open("rb")
    except OSError:
        raise _Fallback from None
    with raw:
        if os.fstat(raw.fileno()).st_size > MAX_SNAPSHOT_BYTES:
            raise _Fallback
        f = raw if span is None else _SpanReader(raw, span)
        decoder = codecs.getincrementaldecoder("utf-8")()
        scan = json.JSONDecoder().raw_decode  # integers beyond 64 bits: _checked
        state = {"buf": "", "pos": 0, "eof": False, "read": 0}

        def fill() -> None:
            data = f.read(_CHUNK_BYTES)
            state["read"] += len(data)
            if state["read"] > MAX_SNAPSHOT_BYTES:
                raise _Fallback
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError:
                raise _Fallback from None
            state["buf"], state["pos"], state["eof"] = state["buf"][state["pos"]:] + text, 0, not data
            if not escapes["surrogate"] and _SURROGATE_ESCAPE.search(state["buf"]):
                escapes["surrogate"] = True

        def next_char() -> str:
            """The next non-space character ('' at the end), not consumed."""
            while True:
                pos = _JSON_SPACE.match(state["buf"], state["pos"]).end()
                state["pos"] = pos
                if pos < len(state["buf"]):
                    return state["buf"][pos]
                if state["eof"]:
                    return ""
                fill()

        if next_char() != "[":
            raise _Fallback
        state["pos"] += 1
        count = 0
        if next_char() == "]":
            state["pos"] += 1
        else:
            while True:
                if next_char() != "{":
                    raise _Fallback
                while True:
                    buf = state["buf"]
                    try:
                        obj, end = scan(buf, state["pos"])
                        break
                    except json.JSONDecodeError as e:
                        cut = e.msg.startswith("Unterminated string") or e.pos >= len(buf) - 16
                        if state["eof"] or not cut:
                            raise _Fallback from None
                        fill()
                    except (RecursionError, ValueError):  # ValueError: an integer of 4300 digits and more
                        raise _Fallback from None
                state["pos"] = end
                count += 1
                if count > MAX_ADS:
                    raise _Fallback
                yield obj
                char = next_char()
                state["pos"] += 1
                if char == "]":
                    break
                if char != ",":
                    raise _Fallback
        if next_char() != "":
            raise _Fallback
