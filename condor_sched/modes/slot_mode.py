"""What the modes that pin a job to one partitionable slot share (devices, spread, and any
mode planned by a ``planning.Policy``): kept pins held within each slot's totals, what kept
pins and started jobs the slot's ad does not count yet take from its free amounts, fair-share
order, the planner run in turns, and the pins and reasons of its plan.

A slot mode declares ``slot_kind`` (the slots it plans on); the device mode adds device kinds,
``Rank`` and the bounded run (``modes/devices/mode.py``), the spread mode its aging limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Callable, Iterable, Mapping, Sequence

from condor_sched.consistency import claim_not_yet_in_ad
from condor_sched.edits import JobChange, pin_change
from condor_sched.fairshare import fair_order, fair_window
from condor_sched.model import (
    PIN_EXCLUSIVE_ATTR, PIN_LLC_WAYS_ATTR, PIN_MEM_BW_ATTR, PIN_SCALE_ATTR, Assignment, Job, JobKey, JobStatus, Plan,
    PoolState, Resources, Slot, SlotKind, Unplaced,
)
from condor_sched.modes.interface import ModeContext, ModeJobs, ModePlan, SharingMode
from condor_sched.modes.planning import NO_SLOT_ACCEPTS, PlanRequest, PlanSettings, Policy, assigned_request, run_policy

_submitter, _job_prio, _key_order = attrgetter("submitter"), attrgetter("job_prio"), attrgetter("key")
_job_of, _reason_of = attrgetter("job"), attrgetter("reason")

#: Most turns a cycle gives a policy when several submitters wait (each turn is one policy run).
MAX_TURNS = 4


@dataclass(frozen=True, slots=True)
class Pin:
    """A placement to write; ``llc_ways``/``mem_bw_gbs``/``scale_factor`` only for spread
    procs, ``whole_device`` only for device jobs that must have their device alone."""

    job: JobKey
    slot: str
    llc_ways: int | None = None
    mem_bw_gbs: int | None = None
    scale_factor: int | None = None
    whole_device: bool = False

    def change(self, cycle: int, now_s: float) -> JobChange:
        """The pin's writes: cycle, time and details first, the slot last."""
        return pin_change(self.job, self.slot, cycle, int(now_s), pin_details(self))

    def describe(self) -> str:
        return self.slot


def pin_details(pin: Pin) -> dict[str, int]:
    """The sidecar-owned attributes a pin carries besides its slot: a device job whether it
    needs the whole device, a spread proc its ways, bandwidth and scale factor."""
    if pin.llc_ways is None:
        return {PIN_EXCLUSIVE_ATTR: int(pin.whole_device)}
    return {PIN_LLC_WAYS_ATTR: pin.llc_ways, PIN_MEM_BW_ATTR: pin.mem_bw_gbs or 0,
            PIN_SCALE_ATTR: pin.scale_factor or 1}


def pin_of(assignment: Assignment) -> Pin:
    d = assignment.details
    if "llc_ways" not in d:
        return Pin(assignment.job, assignment.slot, whole_device=bool(d.get("whole_device", False)))
    # HTCondor's custom resources are integers: bandwidth rounds up so it is never under-booked.
    return Pin(assignment.job, assignment.slot, int(d["llc_ways"]), int(math.ceil(float(d["mem_bw_gbs"]))),
               int(d.get("scale_factor", 1)))


def pin_reason(pin: Pin, cycle: int) -> str:
    return f"pinned to {pin.slot} in cycle {cycle}; waiting for the negotiator to match it there"


def waiting_reason(unplaced: Unplaced) -> str:
    return f"waiting: {unplaced.reason}"


class Waiting(dict):
    """``waiting_reason`` of each reason string, each built once."""

    def __missing__(self, reason: str) -> str:
        self[reason] = out = f"waiting: {reason}"
        return out


def reserve(slots: Mapping[str, Slot], pinned: Iterable[Job], all_jobs: Iterable[Job]) -> list[Slot]:
    """Slots with the requests taken out of jobs pinned to them and not yet matched, and of
    jobs started after the slot's ad was sent (so a stale ad never looks free)."""
    held: dict[str, Resources] = {}
    for job in pinned:
        held[job.pinned_slot] = held.get(job.pinned_slot, Resources()) + job.request  # type: ignore[index]
    for job in all_jobs:
        if job.status is JobStatus.IDLE:  # the common case, without hashing the status
            continue
        name = claim_not_yet_in_ad(job, slots)
        if name is not None:
            held[name] = held.get(name, Resources()) + job.request
    return [s.with_free(s.free - held[s.name]) if s.name in held else s for s in slots.values()]


def free_after_pins(state: PoolState, kept: Iterable[JobKey], plans: Iterable[Plan]) -> list[Slot]:
    """Each slot's free amounts once kept pins (their jobs' keys) and new pins (``plans``'
    assignments) hold their share."""
    slots = {s.name: s for s in state.slots}
    jobs = {j.key: j for j in state.jobs}
    free = {s.name: s for s in reserve(slots, [jobs[k] for k in kept if k in jobs], state.jobs)}
    for plan in plans:
        for a in plan.assignments:
            if a.job in jobs and a.slot in free:
                free[a.slot] = free[a.slot].with_free(free[a.slot].free - assigned_request(jobs[a.job], a))
    return list(free.values())


def without_refused_slot(eligible: Mapping[JobKey, frozenset[str]], refused: Mapping[JobKey, str],
                         slots: Iterable[Slot]) -> Mapping[JobKey, frozenset[str]]:
    """``eligible`` with the slot whose node just refused a job's start taken from that job,
    for this cycle (its free amounts may be wrong; the next cycle may try it again)."""
    if not refused:
        return eligible
    names = frozenset(s.name for s in slots)
    out = dict(eligible)
    for key, slot in refused.items():
        out[key] = out.get(key, names) - {slot}
    return out


def plan_in_turns(policy: Policy, request: PlanRequest, settings: PlanSettings, is_aged: Callable[[Job], bool],
                  one_submitter: bool = False, run: Callable[[Policy, PlanRequest], Plan] | None = None) -> Plan:
    """``run_policy`` on ``request.idle`` in fair-share order (``fairshare``): with one
    submitter, one run over every job (``run``, when the mode has a faster equal one); with
    several, turns as the negotiator's pie spins: each turn offers the fair-order prefix that
    fits what is still free (plus every aged job) and the next turn goes on with the rest,
    until a turn places nothing or ``MAX_TURNS``. So the packing chooses within a submitter's
    fair slice, never across the whole queue. ``one_submitter``: the caller knows the jobs
    have one submitter."""
    ordered = list(request.idle)
    if one_submitter or len(set(map(_submitter, ordered))) <= 1:
        return run(policy, request) if run is not None else run_policy(policy, request, settings)
    free = {s.name: s for s in request.slots}
    by_key = {j.key: j for j in ordered}
    assignments: list[Assignment] = []
    last = Plan(policy.name, ())
    turns = 0
    while ordered and turns < MAX_TURNS:
        window = fair_window(ordered, list(free.values()), is_aged)
        last = run_policy(policy, replace(request, idle=tuple(window), slots=tuple(free.values())), settings)
        turns += 1
        for a in last.assignments:
            free[a.slot] = free[a.slot].with_free(free[a.slot].free - assigned_request(by_key[a.job], a))
        placed = {a.job for a in last.assignments}
        assignments += last.assignments
        ordered = [j for j in ordered if j.key not in placed]
        if not placed:
            break
    placed = {a.job for a in assignments}
    unplaced = tuple(u for u in last.unplaced if u.job not in placed)
    return Plan(policy.name, tuple(assignments), unplaced, {**last.stats, "fair_share_turns": turns})


@dataclass(slots=True)
class SlotLedger:
    """What the slot modes of one cycle hold on partitionable slots: the kept pins' requests
    summed per slot in the order they were kept (``held``, the check against the totals), the
    kept jobs, and each mode's plan with its jobs (``placed``), for the modes planned after it."""

    held: dict[str, Resources] = field(default_factory=dict)
    kept: list[Job] = field(default_factory=list)
    placed: list[tuple[Plan, Sequence[Job]]] = field(default_factory=list)
    reserved: list[Slot] | None = None

    def free_slots(self, slots: Mapping[str, Slot], busy: Sequence[Job]) -> list[Slot]:
        """Every slot less what all kept pins and the claims its ad does not show yet hold
        (once a cycle: every mode has kept its pins before any plans)."""
        if self.reserved is None:
            self.reserved = reserve(slots, sorted(self.kept, key=_key_order), busy)
        return self.reserved

    def taken(self, names: frozenset[str]) -> dict[str, Resources]:
        """What the new pins of the modes planned so far take of the slots ``names``."""
        out: dict[str, Resources] = {}
        for plan, jobs in self.placed:
            hits = [a for a in plan.assignments if a.slot in names]
            if hits:
                by_key = {j.key: j for j in jobs}
                for a in hits:
                    out[a.slot] = out.get(a.slot, Resources()) + assigned_request(by_key[a.job], a)
        return out


class SlotMode(SharingMode):
    """A mode whose pins name one partitionable slot of ``slot_kind`` (``CoSchedPinSlot``)."""

    slot_kind: SlotKind = SlotKind.DEVICE
    #: A cluster's procs are pinned together or not at all (a spread job starts whole).
    gang = False
    ages = True
    tells_refusal = True
    keeps_pins_when_off = True

    def view(self, jobs: ModeJobs, context: ModeContext) -> SlotView:
        return SlotView(self, jobs, context)

    def extra_threads(self, slot: Slot, settings: PlanSettings) -> int:
        """Device threads a slot may hold beyond its total (overcommit; none by default)."""
        return 0

    def age_limit(self, settings: PlanSettings) -> int:
        """Cycles idle after which a job of this mode is aged (placed first)."""
        return settings.age_limit_cycles

    def narrow(self, eligible: Mapping[JobKey, frozenset[str]], jobs: Sequence[Job], slots: Sequence[Slot],
               view: SlotView) -> Mapping[JobKey, frozenset[str]]:
        """The eligible slots of each job, as the mode narrows them (device kinds)."""
        return eligible

    def run(self, planner: Policy, request: PlanRequest, view: SlotView) -> Plan:
        """The planner on the request, in fair-share turns."""
        return self.turns(planner, request, view)

    def turns(self, planner: Policy, request: PlanRequest, view: SlotView,
              run: Callable[[Policy, PlanRequest], Plan] | None = None) -> Plan:
        """``plan_in_turns`` with the mode's aging limit (``run``: a faster equal one-run plan)."""
        aged = self.age_limit(view.context.settings)
        first_seen, cycle = request.first_seen_cycle, request.cycle

        def is_aged(job: Job) -> bool:
            return cycle - first_seen.get(job.key, cycle) > aged

        return plan_in_turns(planner, request, view.context.settings, is_aged, view.jobs.key_ordered, run)

    def told_before(self, plan: Plan, view: SlotView) -> dict[JobKey, str] | None:
        """What the unplaced jobs of ``plan`` are told, when a cache kept it (None: build it)."""
        return None


class SlotView:
    """A slot mode's view of one cycle: every slot by name, the kept pins each holds."""

    never_fits = None  # a job no slot holds waits with the reason (``too_large_reason``)

    def __init__(self, mode: SlotMode, jobs: ModeJobs, context: ModeContext) -> None:
        self.mode, self.jobs, self.context = mode, jobs, context
        self.slots = {s.name: s for s in context.state.slots}
        self.ledger: SlotLedger = context.slot_ledger if context.slot_ledger is not None else SlotLedger()

    def slot(self, name: str | None) -> Slot | None:
        return self.slots.get(name) if name is not None else None

    def pin_problem(self, job: Job, slot: Slot) -> str | None:
        return None

    def keep_order(self, job: Job) -> tuple:
        return (job.pinned_cycle or 0, job.key)

    def keep(self, job: Job) -> str | None:
        """Kept pins fit their slot's totals together (device compute within the overcommit the
        kind allows): no plan ever puts more on a slot than it has."""
        slot = self.slots[job.pinned_slot]  # type: ignore[index]
        extra = self.mode.extra_threads(slot, self.context.settings)
        held = self.ledger.held
        together = held.get(slot.name, Resources()) + job.request
        if not together.fits_in(replace(slot.total, device_threads=slot.total.device_threads + extra)):
            return f"pinned slot {slot.name} cannot hold it with the pins kept before it"
        held[slot.name] = together
        self.ledger.kept.append(job)
        return None

    def offered(self, jobs: Sequence[Job], free: Sequence[Slot]) -> tuple[tuple[Job, ...], tuple[Slot, ...]]:
        """The jobs in fair-share order, and the free slots of the mode's kind."""
        context, kind = self.context, self.mode.slot_kind
        if self.jobs.key_ordered:
            ordered: Sequence[Job] = jobs
        elif len(set(map(_submitter, jobs))) <= 1 and len(set(map(_job_prio, jobs))) <= 1:
            # One submitter, one JobPrio: fair order is key order (each job's virtual finish
            # only grows along it, ties go by key).
            ordered = sorted(jobs, key=_key_order)
        else:
            ordered = fair_order(jobs, context.running, [s for s in context.state.slots if s.kind is kind],
                                 context.state.user_priorities)
        return tuple(ordered), tuple(s for s in free if s.kind is kind)

    def plan(self, planner: Policy, jobs: list[Job], refused: Mapping[JobKey, str]) -> ModePlan:
        context, mode = self.context, self.mode
        state = context.state
        kind = mode.slot_kind
        placed = self.ledger.taken(frozenset(s.name for s in state.slots if s.kind is kind)) if self.ledger.placed else {}
        free = [s.with_free(s.free - placed[s.name]) if s.name in placed else s
                for s in self.ledger.free_slots(self.slots, context.busy) if s.unavailable is None]
        ordered, slots = self.offered(jobs, free)
        eligible = mode.narrow(without_refused_slot(state.eligible, refused, free), ordered, slots, self)
        guard = context.interference
        kept_off: dict[JobKey, str] = {}
        if guard is not None:
            eligible, kept_off = guard.narrow(eligible, ordered, slots)
        request = PlanRequest(
            idle=ordered, slots=slots, running=context.running, eligible=eligible,
            nodes=state.nodes, cycle=context.cycle, first_seen_cycle=context.first_seen, profiles=context.profiles,
            exploration_scales=state.exploration_scales, interference=guard)
        plan = mode.run(planner, request, self)
        if guard is not None:
            plan, taken_back = guard.admit(plan, ordered, mode.gang)
            kept_off.update(taken_back)
        pins = tuple(map(pin_of, plan.assignments))
        if plan.assignments:  # what this mode took, for the slot modes planned after it
            self.ledger.placed.append((plan, ordered))
        told = mode.told_before(plan, self)
        if told is not None:  # the plan speaks of each job it was given once
            complete = len(plan.assignments) + len(plan.unplaced) == len(jobs)
        else:
            complete = len({*map(_job_of, pins), *map(_job_of, plan.unplaced)}) == len(jobs)
        reasons: dict[JobKey, str] = {} if told is None else dict(told)
        waiting = Waiting()
        if told is None:
            reasons.update(zip(map(_job_of, plan.unplaced), map(waiting.__getitem__, map(_reason_of, plan.unplaced))))
        if not complete:
            planned = {*map(_job_of, pins), *map(_job_of, plan.unplaced)}
            left = waiting["not offered this cycle: jobs ahead of it in fair-share order take the room"]
            reasons.update((j.key, left) for j in jobs if j.key not in planned)
        cycle = context.cycle
        reasons.update((p.job, pin_reason(p, cycle)) for p in pins)
        no_slot = waiting[NO_SLOT_ACCEPTS]
        for key, slot in refused.items():   # no slot but the one that just refused it: say so
            if reasons.get(key) == no_slot:
                reasons[key] = f"waiting: no slot but {slot} accepts it, tried again next cycle"
        pinned = set(map(_job_of, pins))
        for key, why in kept_off.items():   # the pair the interference model refused, in its own words
            told = reasons.get(key, "")
            if key not in pinned and why not in told:
                reasons[key] = f"{told}; {why}" if told else f"waiting: {why}"
        return ModePlan(pins, (plan,), reasons)
