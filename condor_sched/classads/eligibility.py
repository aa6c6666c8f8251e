"""Matchmaking: each job's eligible slots (:func:`eligible_slots`: its own Requirements and
the slots' START, evaluated once per group of equal jobs and class of slots) and its Rank of
each slot (:func:`slot_ranks`), on probe targets (``_probe_target``), with the keys a job
is grouped by (``_eligibility_key``, ``_rank_key``) and the cost guard of a probe job
(``_probe_checked``)."""
from __future__ import annotations

import math
from typing import Any, Iterable

import classad2

from condor_sched.classads.json_values import _EXPR_PREFIX, _EXPR_SUFFIX, _expression
from condor_sched.classads.plain import (
    AdError,
    _EXPRESSIONS,
    _MAX_CACHED,
    _PlainAd,
    _carried,
    _check_cost,
    _classad_of,
    _eval,
    _lookup_text,
    _raw_values,
)
from condor_sched.classads.references import _LITERAL, _own_references_of, start_references
from condor_sched.classads.slot_classes import _SlotClasses, _classes_accepting
from condor_sched.expression_cost import expression_cost_problem
from condor_sched.model import PIN_ORIGINAL_ATTR, PIN_SLOT_ATTR, PIN_TIME_ATTR, Job, JobKey


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


def _eval_quietly(ad: classad2.ClassAd, attr: str) -> Any:
    try:
        return _eval(ad, attr)
    except AdError:
        return None
