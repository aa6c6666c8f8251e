"""The device-packing mode (paper 002): device jobs on device slots of their kind, their
planners by name, ``Rank`` choosing among slots that would do, and the bounded run of
``BOUNDED_POLICIES`` that keeps a 50k-job cycle to the jobs that can matter."""
from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from operator import attrgetter
from typing import Iterable, Mapping, Sequence

from condor_sched.device_kinds import DEFAULT_KIND
from condor_sched.model import Job, JobKey, Plan, Slot, SlotKind
from condor_sched.modes.devices.bounded import BOUNDED_POLICIES, bounded_run
from condor_sched.modes.devices.capacity import compute_overcommit
from condor_sched.modes.devices.even_drain import EvenDrainPolicy
from condor_sched.modes.devices.exclusive import ExclusivePolicy
from condor_sched.modes.devices.global_cpsat import GlobalPolicy
from condor_sched.modes.devices.knapsack import KnapsackPolicy
from condor_sched.modes.devices.lp_pack import LpPackPolicy
from condor_sched.modes.devices.random_packing import RandomPolicy
from condor_sched.modes.devices.thread_fill import ThreadFillPolicy
from condor_sched.modes.planning import PlanRequest, PlanSettings, Policy, PolicyKind, assigned_request
from condor_sched.modes.slot_mode import SlotMode, SlotView


class DeviceMode(SlotMode):
    """Paper 002's device packing: a job asking for a device kind's memory
    (``condor_sched.device_kinds``) is pinned to one device slot of its kind."""

    name = "devices"
    paper = "paper 002 (Section IV-C, Eq. 1, Fig. 4): device knapsack packing"
    planners = {"knapsack": KnapsackPolicy, "global": GlobalPolicy, "lp-pack": LpPackPolicy,
                "thread-fill": ThreadFillPolicy, "random": RandomPolicy, "exclusive": ExclusivePolicy,
                "even-drain": EvenDrainPolicy}
    default_planner = "knapsack"
    policy_kind = PolicyKind.DEVICE
    knob = "COSCHED_POLICY"
    slot_kind = SlotKind.DEVICE

    def extra_threads(self, slot: Slot, settings: PlanSettings) -> int:
        """Device compute a kept pin may take beyond the slot's threads (the kind's overcommit)."""
        return math.floor(slot.total.device_threads * (compute_overcommit(slot, settings) - 1.0) + 1e-9)

    def narrow(self, eligible: Mapping[JobKey, frozenset[str]], jobs: Sequence[Job], slots: Sequence[Slot],
               view: SlotView) -> Mapping[JobKey, frozenset[str]]:
        cache = view.context.cache
        kinds = cache.covered.distinct("kind") if cache is not None and cache.covered is not None else None
        return with_device_kinds(eligible, jobs, slots, kinds)

    def run(self, planner: Policy, request: PlanRequest, view: SlotView) -> Plan:
        """In fair-share turns; one submitter's queue of a ``BOUNDED_POLICIES`` planner without
        eligibility limits through ``bounded_run`` (the same plan, less work); then ``Rank``."""
        context = view.context
        cache = context.cache
        bounded_queue = None
        if cache is not None:
            covered = cache.covered
            # ``bounded_run`` may patch its rows with the covered jobs that came and went when
            # it plans exactly the covered jobs, as it did last cycle.
            exact = covered is not None and covered.patched and not covered.pinned \
                and len(request.idle) == len(covered.jobs)
            cache.covered_changes = (covered.version, covered.came, covered.gone) if exact else None  # type: ignore[union-attr]
            if planner.name in BOUNDED_POLICIES and not request.eligible:
                bounded_queue = partial(bounded_run, settings=context.settings, cache=cache)
        return by_rank(self.turns(planner, request, view, bounded_queue), request, context.state.ranks)

    def told_before(self, plan: Plan, view: SlotView) -> dict[JobKey, str] | None:
        cache = view.context.cache
        if cache is not None and cache.queues is not None and plan.unplaced is cache.whole_unplaced:
            return cache.queues.told
        return None


def with_device_kinds(eligible: Mapping[JobKey, frozenset[str]], jobs: Iterable[Job],
                       slots: Iterable[Slot], kinds: set[str] | None = None) -> Mapping[JobKey, frozenset[str]]:
    """``eligible`` narrowed so that a device job may use only the slots of its device kind
    (unchanged while every job and slot is of one kind; a record without one is of the default
    kind). ``kinds``: device kinds that include every job's, when the caller knows them."""
    by_kind: dict[str, set[str]] = {}
    for slot in slots:
        by_kind.setdefault(slot.device_kind or DEFAULT_KIND, set()).add(slot.name)
    if len(by_kind) <= 1 and kinds is not None and kinds <= set(by_kind):
        return eligible
    jobs = list(jobs)
    if len(by_kind) <= 1 and {k or DEFAULT_KIND for k in set(map(attrgetter("device_kind"), jobs))} <= set(by_kind):
        return eligible
    narrowed = dict(eligible)
    for job in jobs:
        own = frozenset(by_kind.get(job.device_kind or DEFAULT_KIND, ()))
        narrowed[job.key] = own & eligible[job.key] if job.key in eligible else own
    return narrowed


def by_rank(plan: Plan, request: PlanRequest, ranks: Mapping[JobKey, Mapping[str, float]]) -> Plan:
    """The job's ``Rank`` as HTCondor uses it, to choose among slots that would do: a device
    job moves from its planned slot to an eligible one it ranks higher that still has room
    for it once every planned job is in place (best first). The same jobs are placed on as
    many slots' worth of room, so the policy's packing stands; a whole-device pin stays."""
    if not ranks or not any(a.job in ranks for a in plan.assignments):
        return plan
    jobs = {j.key: j for j in request.idle}
    slots = {s.name: s for s in request.slots}
    left = {name: s.free for name, s in slots.items()}
    for a in plan.assignments:
        left[a.slot] = left[a.slot] - assigned_request(jobs[a.job], a)
    moved = []
    for a in plan.assignments:
        rank, allowed = ranks.get(a.job), request.eligible.get(a.job)
        if rank and not a.details.get("whole_device"):
            need = assigned_request(jobs[a.job], a)
            better = sorted((n for n in slots if rank.get(n, 0.0) > rank.get(a.slot, 0.0)
                             and (allowed is None or n in allowed)), key=lambda n: (-rank.get(n, 0.0), n))
            for name in better:
                if need.fits_in(left[name]) and jobs[a.job].request.device_threads <= slots[name].total.device_threads:
                    left[name], left[a.slot] = left[name] - need, left[a.slot] + need
                    a = replace(a, slot=name)
                    break
        moved.append(a)
    return replace(plan, assignments=tuple(moved))


#: Most turns a cycle gives a policy when several submitters wait (each turn is one policy run).
MAX_TURNS = 4


DEVICES = DeviceMode()
