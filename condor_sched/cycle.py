"""The one cycle: a pool state and the memory of earlier cycles in, a decision out (pure).

Three sources obtain the state and apply the decision their own way (STYLE.md: one cycle,
three sources): the sidecar reads the live pool and edits jobs (``sidecar.py``), ``plan``
reads a snapshot and prints the decision (``cli.py``), the simulator builds the state from
its simulated pool and starts what is pinned (``simulate/engine.py``). Whatever a policy
decides, it decides here, so the three agree on the same state.

What a cycle does: unpin stale pins (not matched within ``unpin_age_cycles`` cycles, slot
vanished or taking no new job, the execute node refused the start, ad gone bad), hold idle
covered jobs whose ads can never be planned (the attribute named), enroll jobs lacking the
pin clause, take out of each slot's free amounts what kept pins and started jobs the slot's
ad does not count yet hold, order the rest of the idle covered jobs by fair share
(``fairshare``), plan them (device jobs with the device policy on device slots, spread jobs
with the spread policy on socket slots, each job only on its eligible slots) and pin what
was placed. Every idle covered job left idle gets a reason (``CoSchedPinReason``).

With a cache (``CycleMemory.cache``, ``CycleConfig.bounded``), a cycle follows only the job
records that came and went since the last one (``CoveredJobs``, ``ShapeQueues``) and plans
``BOUNDED_POLICIES`` on the jobs that can matter (``bounded_run``); the decision is the one
planning the whole queue afresh gives (``tests/unit/test_incremental_cycle.py``).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import replace
from itertools import compress, repeat
from operator import attrgetter, is_not, not_
from typing import Callable, Iterable, Mapping, Sequence

from condor_sched.consistency import claim_not_yet_in_ad, consistent_state
from condor_sched.cycle_cache import (
    CoveredJobs, PlanCache, _covered_idle, _key_order, _status, _Waiting, _where, covered,
)
from condor_sched.cycle_records import (
    CycleConfig, CycleDecision, CycleMemory, Enroll, Hold, Pin, Unpin, pin_reason, waiting_reason,
)
from condor_sched.device_kinds import DEFAULT_KIND
from condor_sched.fairshare import fair_order, fair_window
from condor_sched.model import (
    HOLDS_A_SLOT, Assignment, Job, JobKey, JobStatus, Plan, PoolState, Resources, RunningJob, Skipped, Slot, SlotKind,
    Unplaced, partitionable_slot_of,
)
from condor_sched.modes.devices.bounded import BOUNDED_POLICIES, bounded_run
from condor_sched.modes.devices.capacity import compute_overcommit
from condor_sched.modes.gpus.live import GpuSharingDecision, decide_gpu_sharing
from condor_sched.modes.mates.live import NodeSharingDecision, decide_node_sharing
from condor_sched.modes.planning import PlanRequest, PlanSettings, Policy, assigned_request, run_policy

__all__ = ["BOUNDED_POLICIES", "CycleConfig", "CycleDecision", "CycleMemory", "Enroll", "Hold", "Pin", "PlanCache",
           "Unpin", "covered", "decide_cycle", "free_after_pins", "pin_reason", "running_jobs", "waiting_reason"]

_submitter, _job_prio, _reason_of = attrgetter("submitter"), attrgetter("job_prio"), attrgetter("reason")
_job_of = attrgetter("job")
_has_pin_clause, _spread = attrgetter("has_pin_clause"), attrgetter("spread")

def _pin_of(assignment: Assignment) -> Pin:
    d = assignment.details
    if "llc_ways" not in d:
        return Pin(assignment.job, assignment.slot, whole_device=bool(d.get("whole_device", False)))
    # HTCondor's custom resources are integers: bandwidth rounds up so it is never under-booked.
    return Pin(assignment.job, assignment.slot, int(d["llc_ways"]), int(math.ceil(float(d["mem_bw_gbs"]))),
               int(d.get("scale_factor", 1)))


def _stale_reason(job: Job, slots: Mapping[str, Slot], cycle: int, unpin_age: int) -> str | None:
    if job.pinned_slot not in slots:
        return f"pinned slot {job.pinned_slot} vanished"
    if job.start_refused is not None:
        return f"the execute node refused to start it on {job.pinned_slot}: {job.start_refused}"
    if slots[job.pinned_slot].unavailable is not None:
        return f"pinned slot {job.pinned_slot} {slots[job.pinned_slot].unavailable}"
    if job.pinned_cycle is None or cycle - job.pinned_cycle >= unpin_age:
        return f"pin to {job.pinned_slot} not matched within {unpin_age} cycles"
    return None


def _pins_within_totals(kept: Iterable[Job], slots: Mapping[str, Slot],
                        settings: PlanSettings) -> tuple[list[Job], list[Unpin]]:
    """The fresh pins each slot can hold together within its totals (device compute within
    ``thread_overcommit`` where the kind allows it), older pins first, and an unpin for each
    other one (pins written against a slot that has since shrunk, or edited by hand): no
    plan ever puts more on a slot than it has."""
    held: dict[str, Resources] = {}
    out, unpins = [], []
    for job in sorted(kept, key=lambda j: (j.pinned_cycle or 0, j.key)):
        slot = slots[job.pinned_slot]  # type: ignore[index]
        extra = math.floor(slot.total.device_threads * (compute_overcommit(slot, settings) - 1.0) + 1e-9)
        together = held.get(slot.name, Resources()) + job.request
        if together.fits_in(replace(slot.total, device_threads=slot.total.device_threads + extra)):
            held[slot.name] = together
            out.append(job)
        else:
            unpins.append(Unpin(job.key, f"pinned slot {slot.name} cannot hold it with the pins kept before it"))
    return sorted(out, key=lambda j: j.key), unpins


def _reserve(slots: Mapping[str, Slot], pinned: Iterable[Job], all_jobs: Iterable[Job]) -> list[Slot]:
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


def free_after_pins(state: PoolState, decision: CycleDecision) -> list[Slot]:
    """Each slot's free amounts once the decision's kept and new pins hold their share."""
    slots = {s.name: s for s in state.slots}
    jobs = {j.key: j for j in state.jobs}
    free = {s.name: s for s in _reserve(slots, [jobs[a.job] for a in decision.kept if a.job in jobs], state.jobs)}
    for plan in decision.plans:
        for a in plan.assignments:
            if a.job in jobs and a.slot in free:
                free[a.slot] = free[a.slot].with_free(free[a.slot].free - assigned_request(jobs[a.job], a))
    return list(free.values())


def _with_device_kinds(eligible: Mapping[JobKey, frozenset[str]], jobs: Iterable[Job],
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


def _hold_reason(skipped: Skipped) -> str:
    return (f"condor_sched cannot plan this job: {skipped.reason}. Correct it (condor_qedit), "
            "then condor_release the job")


def _without_refused_slot(eligible: Mapping[JobKey, frozenset[str]], refused: Mapping[JobKey, str],
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


def plan_in_turns(policy: Policy, request: PlanRequest, settings: PlanSettings,
                  is_aged: Callable[[Job], bool], cache: PlanCache | None = None,
                  one_submitter: bool = False) -> Plan:
    """``run_policy`` on ``request.idle`` in fair-share order (``fairshare``): with one
    submitter, one run over every job; with several, turns as the negotiator's pie spins:
    each turn offers the fair-order prefix that fits what is still free (plus every aged job)
    and the next turn goes on with the rest, until a turn places nothing or ``MAX_TURNS``. So
    the packing chooses within a submitter's fair slice, never across the whole queue.
    With ``cache``, a policy of ``BOUNDED_POLICIES`` on a one-submitter queue without
    eligibility limits runs through :func:`bounded_run` (the same plan, less work).
    ``one_submitter``: the caller knows the jobs have one submitter."""
    ordered = list(request.idle)
    if one_submitter or len(set(map(_submitter, ordered))) <= 1:
        if cache is not None and policy.name in BOUNDED_POLICIES and not request.eligible:
            return bounded_run(policy, request, settings, cache)
        return run_policy(policy, request, settings)
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


def running_jobs(state: PoolState, busy: Sequence[Job] | None = None) -> tuple[RunningJob, ...]:
    """The jobs holding a dynamic slot, with their partitionable slot, node and measurements
    (``busy``: the state's jobs that are not idle, when the caller has them)."""
    slots = {s.name: s for s in state.slots}
    out = []
    for job in _where(state.jobs, _status, is_not, JobStatus.IDLE) if busy is None else busy:
        if job.status not in HOLDS_A_SLOT:
            continue
        slot = partitionable_slot_of(job.remote_slot) if job.remote_slot else job.pinned_slot
        if slot is None:
            continue
        node = slots[slot].machine if slot in slots else slot.split("@")[-1]
        measured = state.nodes[node].jobs.get(job.key) if node in state.nodes else None
        out.append(RunningJob(job, slot, node, job.started_at_s, job.requested_runtime_s,
                              job.expected_runtime_s, measured))
    return tuple(out)


def decide_cycle(state: PoolState, memory: CycleMemory, config: CycleConfig) -> CycleDecision:
    """What one cycle does (module docstring), from ``state`` and ``memory`` alone. With a
    cache (``config.bounded``), what it derives from the covered jobs follows only the records
    that changed since the last cycle (``CoveredJobs``); the decision is the same."""
    state = consistent_state(state)
    cycle = memory.cycle
    cache = (memory.cache or PlanCache()) if config.bounded else None
    view: CoveredJobs | None = None
    slots = {s.name: s for s in state.slots}
    if cache is not None:
        if cache.covered is None:
            cache.covered = CoveredJobs()
        view = cache.covered
        view.update(state.jobs)
        cache.whole_unplaced = None
        jobs = view.jobs  # the same order from every source; never changed here
        first_seen = view.first_seen_map(memory.first_seen, cycle)
        pinned_jobs = sorted(view.pinned.values(), key=_key_order)
    else:
        jobs = _covered_idle(state.jobs)  # the same order from every source
        keys = list(map(_key_order, jobs))
        first_seen = dict(zip(keys, map(memory.first_seen.get, keys, repeat(cycle))))
        pinned_jobs = [j for j in jobs if j.pinned_slot is not None or j.pinned_cycle is not None]
    unpins, kept, refused = [], [], {}
    to_plan = list(jobs)
    if pinned_jobs:
        at = {id(j): i for i, j in enumerate(jobs)} if view is None else None
        for job in pinned_jobs:
            i = at[id(job)] if at is not None else _index_of(view, job)  # type: ignore[arg-type]
            if job.pinned_slot is not None:
                reason = _stale_reason(job, slots, cycle, config.unpin_age_cycles)
                if reason is None:
                    kept.append(job)
                    to_plan[i] = None  # type: ignore[call-overload]
                    continue
                unpins.append(Unpin(job.key, reason))
                if job.start_refused is not None:
                    refused[job.key] = job.pinned_slot
            to_plan[i] = replace(job, pinned_slot=None, pinned_cycle=None)
        if kept:
            to_plan = list(compress(to_plan, map(is_not, to_plan, repeat(None))))
    kept, crowded = _pins_within_totals(kept, slots, config.plan)
    unpins += crowded
    crowded_keys = {u.job for u in crowded}
    if crowded_keys:
        to_plan += [replace(job, pinned_slot=None, pinned_cycle=None) for job in jobs if job.key in crowded_keys]
    # A pinned job whose ad went bad cannot be planned: take its pin away so it is never
    # left pinned to a slot that cannot run it (it stays untouched otherwise); an idle one
    # is held with the attribute named, or it would wait for ever.
    unpins += [Unpin(s.job, f"malformed ad: {s.reason}") for s in state.skipped
               if s.job is not None and s.pinned_slot is not None]
    holds = tuple(Hold(s.job, _hold_reason(s)) for s in state.skipped if s.job is not None and s.idle)
    all_device = view is not None and not view.counts["not_device"]
    if config.spread_policy is None and not all_device:
        to_plan = [j for j in to_plan if j.uses_device]
    enrolls = [] if view is not None and not view.counts["no_pin_clause"] else [
        Enroll(j.key, j.attributes.get("Requirements"))
        for j in compress(to_plan, map(not_, map(_has_pin_clause, to_plan)))]
    busy = _where(state.jobs, _status, is_not, JobStatus.IDLE)
    free = [s for s in _reserve(slots, kept, busy) if s.unavailable is None]
    running = running_jobs(state, busy)
    eligible = _without_refused_slot(state.eligible, refused, free)
    # One submitter and one JobPrio among the covered jobs, and ``to_plan`` still in key order.
    key_ordered = (view is not None and not crowded_keys and len(view.distinct("submitter")) <= 1
                   and len(view.distinct("prio")) <= 1)

    def is_aged(job: Job) -> bool:
        return cycle - first_seen.get(job.key, cycle) > config.plan.age_limit_cycles

    def is_spread_aged(job: Job) -> bool:
        return cycle - first_seen.get(job.key, cycle) > config.plan.spread_age_limit()

    def offered(jobs: Iterable[Job], kind: SlotKind) -> tuple[tuple[Job, ...], tuple[Slot, ...]]:
        """The jobs of one kind in fair-share order, and the slots their policy may use."""
        if key_ordered:
            ordered: Sequence[Job] = jobs  # type: ignore[assignment]
        elif len(set(map(_submitter, jobs := list(jobs)))) <= 1 and len(set(map(_job_prio, jobs))) <= 1:
            # One submitter, one JobPrio: fair order is key order (each job's virtual finish
            # only grows along it, ties go by key).
            ordered = sorted(jobs, key=_key_order)
        else:
            ordered = fair_order(jobs, running, [s for s in state.slots if s.kind is kind], state.user_priorities)
        return tuple(ordered), tuple(s for s in free if s.kind is kind)

    device_jobs, device_slots = offered(to_plan if all_device else [j for j in to_plan if j.request.device_memory_mb > 0],
                                        SlotKind.DEVICE)
    kinds = view.distinct("kind") if view is not None else None
    request = PlanRequest(
        idle=device_jobs, slots=device_slots, running=running,
        eligible=_with_device_kinds(eligible, device_jobs, device_slots, kinds), nodes=state.nodes, cycle=cycle,
        first_seen_cycle=first_seen, profiles=config.profiles, exploration_scales=state.exploration_scales)
    if view is not None and cache is not None:
        # ``bounded_run`` may patch its rows with the covered jobs that came and went when
        # it plans exactly the covered jobs, as it did last cycle.
        exact = view.patched and not pinned_jobs and len(device_jobs) == len(jobs)
        cache.covered_changes = (view.version, view.came, view.gone) if exact else None
    plans = [by_rank(plan_in_turns(config.device_policy, request, config.plan, is_aged, cache, key_ordered),
                     request, state.ranks)]
    if config.spread_policy is not None:
        spread_jobs, socket_slots = offered([] if view is not None and not view.counts["spread_only"] else
                                            [j for j in compress(to_plan, map(_spread, to_plan))
                                             if j.request.device_memory_mb <= 0], SlotKind.SOCKET)
        plans.append(plan_in_turns(config.spread_policy, replace(request, idle=spread_jobs, slots=socket_slots,
                                                                 eligible=eligible), config.plan, is_spread_aged))
    pins = tuple(_pin_of(a) for p in plans for a in p.assignments)
    if cache is not None and plans[0].unplaced is cache.whole_unplaced:
        # ``bounded_run``'s plan speaks of each job it was given once: count the others.
        planned = set(map(_job_of, pins[len(plans[0].assignments):]))
        for p in plans[1:]:
            planned.update(map(_job_of, p.unplaced))
        n_planned = len(plans[0].assignments) + len(plans[0].unplaced) + len(planned)
        complete = n_planned == len(to_plan)
    else:
        planned = set(map(_job_of, pins))
        for p in plans:
            planned.update(map(_job_of, p.unplaced))
        complete = len(planned) == len(to_plan)
    if not complete:
        planned = set(map(_job_of, pins))
        for p in plans:
            planned.update(map(_job_of, p.unplaced))
    left_out = [] if complete else [
        Unplaced(j.key, "not offered this cycle: jobs ahead of it in fair-share order take the room")
        for j in to_plan if j.key not in planned]
    waiting = _Waiting()
    reasons: dict[JobKey, str] = {}
    told = [*(p.unplaced for p in plans), left_out]
    if cache is not None and cache.queues is not None and plans[0].unplaced is cache.whole_unplaced:
        reasons, told = dict(cache.queues.told), told[1:]  # what bounded_run's rows are told, kept
    for unplaced in told:
        reasons.update(zip(map(_job_of, unplaced), map(waiting.__getitem__, map(_reason_of, unplaced))))
    reasons.update((p.job, pin_reason(p, cycle)) for p in pins)
    for u in unpins:  # a refused start stays in the user's view until the job is pinned again
        if u.job in refused and u.job in reasons:
            reasons[u.job] = f"{u.reason}; now {reasons[u.job]}"
    if view is not None:
        view.first_seen = first_seen
    sharing = NodeSharingDecision() if config.node_policy is None else decide_node_sharing(
        state, cycle, config.node_policy, config.plan, config.unpin_age_cycles)
    if sharing.reasons:
        reasons = {**reasons, **sharing.reasons}
    gpus = GpuSharingDecision() if config.gpu_policy is None else decide_gpu_sharing(
        state, cycle, config.gpu_policy, config.plan, config.unpin_age_cycles)
    if gpus.reasons:
        reasons = {**reasons, **gpus.reasons}
    return CycleDecision(cycle, len(jobs), tuple(Assignment(j.key, j.pinned_slot) for j in kept),  # type: ignore[arg-type]
                         tuple(unpins), tuple(enrolls), pins, tuple(plans), state.skipped, first_seen, holds, reasons,
                         cache, sharing, gpus)


def _index_of(view: CoveredJobs, job: Job) -> int:
    """Where ``job`` is in ``view.jobs``."""
    at = bisect_left(view.keys, job.key)
    while view.jobs[at] is not job:
        at += 1
    return at
