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
from typing import Any, Iterable, Iterator, Mapping

import classad2

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


def _requested_kind(ad: classad2.ClassAd) -> DeviceKind | None:
    """The device kind whose memory the job requests (at most one), None for a CPU job."""
    kinds = [k for k in device_kinds() if _number(ad, k.request_memory_attr, required=False) > 0]
    if len(kinds) > 1:
        raise AdError(kinds[1].request_memory_attr, f"a job uses one device, but it also requests {kinds[0].name}")
    return kinds[0] if kinds else None


def job_from_ad(ad: classad2.ClassAd, schedd: str) -> Job:
    """One job record; raises AdError naming the attribute that is missing or malformed."""
    cluster = _number(ad, "ClusterId", required=True)
    proc = _number(ad, "ProcId", required=True)
    status_code = _number(ad, "JobStatus", required=True)
    try:
        status = JobStatus(status_code)
    except ValueError:
        raise AdError("JobStatus", f"unknown code {status_code}") from None
    kind = _requested_kind(ad)
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
                free=free, device_name=_string(ad, kind.device_name_attr) if kind else None, cache_id=cache_id,
                device_kind=kind.name if kind else None,
                updated_at_s=_number(ad, "LastHeardFrom", required=False) or _number(ad, "MyCurrentTime", required=False),
                children=_child_names(ad), unavailable=_unavailable(ad))


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


def state_from_ads(job_ads: Mapping[str | None, Iterable[classad2.ClassAd]],
                   slot_ads: Iterable[classad2.ClassAd]) -> PoolState:
    """The pool state of job ads (per schedd name; None: from each ad's GlobalJobId) and
    startd ads, with each idle job's eligible slots."""
    slot_ads = list(slot_ads)
    pairs: list[tuple[Job, classad2.ClassAd]] = []
    skipped: list[Skipped] = []
    for schedd, ads in job_ads.items():
        read, bad = jobs_from_ads(ads, schedd)
        pairs += read
        skipped += bad
    slots, slot_skips = slots_from_ads(slot_ads)
    usable = {s.name for s in slots}
    idle = [(job, ad) for job, ad in pairs if job.is_idle]
    slot_ads = [ad for ad in slot_ads if ad.get("Name") in usable]
    return PoolState(tuple(job for job, _ in pairs), tuple(slots), tuple(skipped + slot_skips),
                     eligible_slots(idle, slot_ads), ranks=slot_ranks(idle, slot_ads))


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
            # json.loads turned HTCondor's "\/Expr(...)\/" into "/Expr(...)/"; escaping every
            # "/" again (valid JSON) lets classad2 read expressions as expressions, not strings.
            yield classad2.parseOne(json.dumps(obj).replace("/", "\\/"), classad2.ParserType.JSON)
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
