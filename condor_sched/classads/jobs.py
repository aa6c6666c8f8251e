"""Job ads to :class:`model.Job` records (:func:`job_from_ad`): the request rules the execute
node applies (:func:`request_problem`), GPU requests (:func:`gpu_request`), the sidecar's pin
and node-sharing marks, a record made once per equal values of what it reads
(``_job_record``), the pin clause of a Requirements (:func:`has_pin_clause`), and skipped
jobs (:func:`jobs_from_ads`)."""
from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import replace
from typing import Any, Iterable, Iterator

import classad2
from cosched_node import rules

from condor_sched.classads.json_values import _EXPR_PREFIX, _EXPR_SUFFIX, _PLAIN
from condor_sched.classads.plain import (
    MAX_AMOUNT,
    AdError,
    _MAX_CACHED,
    _MISSING,
    _PlainAd,
    _cost_of,
    _eval,
    _integer,
    _lenient,
    _lookup_text,
    _number,
    _raw_values,
    _string,
)
from condor_sched.device_kinds import GPU, DeviceKind, device_kinds
from condor_sched.model import (
    HOLDS_A_SLOT,
    MALLEABLE_ATTR,
    SPARE_ATTR,
    OVERCOMMIT_ATTR,
    USAGE_ATTRS,
    PIN_CLAUSE,
    GPU_PIN_CLAUSE,
    PIN_CYCLE_ATTR,
    GPU_CONSTRAINT_ATTR,
    GPU_PROPERTIES,
    PIN_GPUS_ATTR,
    WHOLE_GPU,
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
    Resources,
    Skipped,
    duration_s,
)

DEFAULT_SLOWDOWN_THRESHOLD = 0.9
#: ``VacateReasonCode`` of a job the PREPARE_JOB hook sent back to Idle (``HookStatusCode``
#: 300 or more, POOL.md).
HOOK_REFUSED_VACATE_CODE = 1007


#: The request rules the execute node applies live once, in ``cosched_node.rules``: the
#: planner refuses exactly what the PREPARE_JOB hook and the node agent refuse (issue 10), so
#: no pin is written for a start the node would refuse.
MAX_SPREAD_CPUS = 100_000
PROGRAM_NAME = rules.PROGRAM_RE


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
    """The job's constraint on the GPUs' properties, as one expression text (evaluated against
    each GPU's properties by ``modes/gpus/live.py``): HTCondor's ``RequireGPUs`` (from
    ``require_gpus``, kept by condor_submit only with ``request_GPUs``) and our own
    ``CoSchedRequireGPUs`` string, both when both are set. AdError naming the attribute when
    either is too long, or ours is not an expression over GPU properties only."""
    texts = []
    if GPU.match_request_attr in ad:
        texts.append(_lookup_text(ad, GPU.match_request_attr))
        if len(texts[-1]) > MAX_REQUIRE_GPUS_CHARS:
            raise AdError(GPU.match_request_attr, f"longer than {MAX_REQUIRE_GPUS_CHARS} characters")
        _cost_of([(GPU.match_request_attr, texts[-1])])
    if GPU_CONSTRAINT_ATTR in ad:
        texts.append(checked_gpu_constraint(_string(ad, GPU_CONSTRAINT_ATTR, required=True) or ""))
    return " && ".join(f"({t})" for t in texts) if len(texts) > 1 else (texts[0] if texts else None)


def checked_gpu_constraint(text: str) -> str:
    """``text`` when it is a ClassAd expression naming only GPU properties (``GPU_PROPERTIES``),
    else AdError on ``CoSchedRequireGPUs`` saying what is wrong."""
    if len(text) > MAX_REQUIRE_GPUS_CHARS:
        raise AdError(GPU_CONSTRAINT_ATTR, f"longer than {MAX_REQUIRE_GPUS_CHARS} characters")
    try:
        expr = classad2.ExprTree(text)
    except Exception:  # noqa: BLE001 - classad2 raises its own exception class for a parse error
        raise AdError(GPU_CONSTRAINT_ATTR, f"= {text[:40]!r} is not a ClassAd expression") from None
    allowed = {p.lower() for p in GPU_PROPERTIES}
    others = sorted(r for r in classad2.ClassAd().externalRefs(expr) if r.lower() not in allowed)
    if others:
        raise AdError(GPU_CONSTRAINT_ATTR, f"may name only GPU properties ({', '.join(GPU_PROPERTIES)}), "
                                           f"not {', '.join(others)[:80]}")
    _cost_of([(GPU_CONSTRAINT_ATTR, text)])
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
        has_pin_clause=requirements is not None and has_pin_clause(requirements, gpu is not None),
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
        spare=_lenient(ad, SPARE_ATTR, bool) is True,
        overcommit=_lenient(ad, OVERCOMMIT_ATTR, bool) is True,
        gpu=gpu,
        pinned_gpus=_pinned_gpus(ad) if gpu is not None else (),
        pinned_at_s=_lenient(ad, PIN_TIME_ATTR, int),
        executable=(_lenient(ad, "Cmd", str) or "")[:4096],
        attributes={
            "Requirements": requirements,
            PIN_ORIGINAL_ATTR: _lookup_text(ad, PIN_ORIGINAL_ATTR) if PIN_ORIGINAL_ATTR in ad else None,
            **_node_sharing_attributes(ad),
            **({GPU.match_request_attr: _require_gpus(ad)} if gpu is not None else {}),
            **({"usage": _usage(ad)} if status in HOLDS_A_SLOT else {}),
        },
    )


def _usage(ad: classad2.ClassAd) -> dict[str, float]:
    """A running job's ``CpusUsage`` and ``MemoryUsage`` as HTCondor measured them, those that
    read as non-negative numbers (``plan`` on a snapshot without spare-capacity estimates)."""
    out: dict[str, float] = {}
    for attr in USAGE_ATTRS:
        value = _lenient(ad, attr, (int, float)) if attr in ad else None
        if value is not None and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            out[attr] = float(value)
    return out


def _node_sharing_attributes(ad: classad2.ClassAd) -> dict[str, Any]:
    """The sidecar's node-sharing marks on a guest or a mate (``condor_sched.modes.mates.live``),
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
            "JobCurrentStartDate", "AccountingGroup", "User", PIN_REASON_ATTR, MALLEABLE_ATTR, SPARE_ATTR,
            OVERCOMMIT_ATTR, *USAGE_ATTRS, PIN_MATE_ATTR,
            PIN_GUEST_ATTR, PIN_MATE_INCREASE_ATTR, PIN_MATE_BASE_ATTR, *GPU_JOB_ATTRS)


#: The GPU attributes of a job the sidecar reads (issue 13).
GPU_JOB_ATTRS = (GPU.request_memory_attr, GPU.request_compute_attr, GPU.count_request_attr, GPU.match_request_attr,
                 GPU_CONSTRAINT_ATTR, PIN_GPUS_ATTR)
_RECORD_TEXTS = 2
#: Read per job; they can only make ``submitted_at_s``, ``job_prio``, ``start_refused`` and
#: ``pinned_at_s`` differ.
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
                   start_refused=_start_refused(ad, template.status), hook_refusal=_hook_refusal(ad, template.status),
                   pinned_at_s=_lenient(ad, PIN_TIME_ATTR, int))


def _plain_json(value: Any) -> bool:
    """True for a JSON value a ClassAd holds as itself (not an expression, list or nested ad)."""
    kind = value.__class__
    return (kind is str and not (value.startswith(_EXPR_PREFIX) and value.endswith(_EXPR_SUFFIX))) or kind in _PLAIN \
        or value is _MISSING


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
def has_pin_clause(requirements: str, gpu: bool = False) -> bool:
    """True when ``requirements`` is a conjunction one of whose operands is the pin clause (or,
    for a GPU job, the GPU pin clause), so the job cannot match before it is pinned, but for a
    whole-GPU job on a node under HTCondor's own GPU allocation (a clause merely mentioned,
    e.g. under an ``||``, does not count)."""
    conjuncts = _top_level_conjuncts(_strip_parentheses(requirements.strip()))
    if conjuncts is None:
        return False
    canonical = {_canonical(c) for c in conjuncts}
    return _canonical(PIN_CLAUSE) in canonical or (gpu and _canonical(GPU_PIN_CLAUSE) in canonical)


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
