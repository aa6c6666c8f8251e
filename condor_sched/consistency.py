"""The rules that make one pool state consistent, whatever its source (issue 10): the live
pool and snapshot files (``classads.state_from_ads``) and the simulator all reach the cycle
through :func:`consistent_state`, which ``cycle.decide_cycle`` applies first (pure).

- A slot Name seen more than once (two ads of one slot in a concatenated snapshot, two
  startds configured alike): the ad heard last (``LastHeardFrom``, else ``MyCurrentTime``)
  is the slot, the first of equally recent ones; every other is reported, naming the one used.
- A job id seen more than once (schedd, ClusterId, ProcId): the first ad that reads is the
  job; every other copy, readable or not, is reported and never held or unpinned for.
- A free amount above the slot's total: planned as the total, and reported, so no plan
  puts more on a slot than it has.
- A GPU uuid advertised by more than one slot (one physical GPU cannot be on two nodes; a
  node repeating another's uuids, or discovery gone wrong): every slot that advertises it is
  left out and reported, naming the other, so no GPU is booked twice. (A uuid repeated within
  one slot ad makes that ad unreadable: ``classads``.)
"""
from __future__ import annotations

from dataclasses import fields, replace
from operator import attrgetter
from typing import Mapping, Sequence

from condor_sched.device_kinds import DEFAULT_KIND, device_kind
from condor_sched.model import HOLDS_A_SLOT, Job, JobKey, PoolState, Resources, Skipped, Slot, partitionable_slot_of


def distinct_slots(slots: Sequence[Slot]) -> tuple[list[Slot], list[Skipped]]:
    """One slot per Name (module docstring): the kept records themselves, in input order, and
    a Skipped record for each other one."""
    chosen: dict[str, int] = {}
    for i, slot in enumerate(slots):
        best = chosen.get(slot.name)
        if best is None or slot.updated_at_s > slots[best].updated_at_s:
            chosen[slot.name] = i
    keep = set(chosen.values())
    skipped = [Skipped(f"slot {slot.name}", f"duplicate Name: the ad of {slots[chosen[slot.name]].machine} "
                                            f"heard at {slots[chosen[slot.name]].updated_at_s} is used")
               for i, slot in enumerate(slots) if i not in keep]
    kept = [slot for i, slot in enumerate(slots) if i in keep]
    shared = _shared_gpus(kept)
    skipped += [Skipped(f"slot {slot.name}", why) for slot in kept if (why := shared.get(slot.name))]
    return [slot for slot in kept if slot.name not in shared], skipped


def _shared_gpus(slots: Sequence[Slot]) -> dict[str, str]:
    """Why each slot advertising a GPU uuid that another slot advertises too is left out."""
    owners: dict[str, list[str]] = {}
    for slot in slots:
        for gpu in slot.gpus:
            owners.setdefault(gpu.uuid.lower(), []).append(slot.name)
    why: dict[str, str] = {}
    for uuid, names in owners.items():
        for name in names if len(names) > 1 else ():
            other = next(n for n in names if n != name)
            why.setdefault(name, f"GPU {uuid} is also advertised by slot {other}: one GPU cannot be booked on two "
                                 f"slots, so neither is planned")
    return why


def _duplicate_job(key: JobKey) -> Skipped:
    return Skipped(f"job {key}", "duplicate job id (same schedd, ClusterId and ProcId): the first ad "
                                 "that reads is used, this copy is left out", job=key)


def _attributes(slot: Slot, field: str) -> tuple[str, str]:
    """The slot ad's free and total attribute of a Resources field."""
    names = {"cpus": "Cpus", "memory_mb": "Memory", "llc_ways": "LLCWays", "mem_bw_gbs": "MemBW"}
    if field not in names:
        kind = device_kind(slot.device_kind or DEFAULT_KIND)
        names = {"device_memory_mb": kind.memory_attr, "device_threads": kind.compute_attr}
    return names[field], f"TotalSlot{names[field]}"


def _within_total(slot: Slot) -> tuple[Slot, Skipped | None]:
    """``slot`` with every free amount above its total taken as the total, and why."""
    over = [f.name for f in fields(Resources) if getattr(slot.free, f.name) > getattr(slot.total, f.name)]
    if not over:
        return slot, None
    said = ", ".join(f"{free} {getattr(slot.free, f):g} > {total} {getattr(slot.total, f):g}"
                     for f in over for free, total in [_attributes(slot, f)])
    clamped = replace(slot.free, **{f: getattr(slot.total, f) for f in over})
    return slot.with_free(clamped), Skipped(f"slot {slot.name}", f"free amount above the total ({said}): "
                                                                 "planned with the total free")


def consistent_state(state: PoolState) -> PoolState:
    """``state`` under the rules of the module docstring, each departure in ``skipped``;
    ``state`` itself when it already keeps them."""
    slots, skipped = distinct_slots(state.slots)
    checked = [_within_total(s) for s in slots]
    skipped += [note for _, note in checked if note is not None]
    seen: set[JobKey] = set(map(attrgetter("key"), state.jobs))
    jobs: Sequence[Job] = state.jobs
    if len(seen) < len(jobs):  # some id repeats: keep each one's first record
        seen, jobs = set(), []
        for job in state.jobs:
            if job.key in seen:
                skipped.append(_duplicate_job(job.key))
            else:
                seen.add(job.key)
                jobs.append(job)
    reported = []
    for skip in state.skipped:
        if skip.job is not None and skip.job in seen:
            reported.append(_duplicate_job(skip.job))
        else:
            if skip.job is not None:
                seen.add(skip.job)
            reported.append(skip)
    if not skipped and len(jobs) == len(state.jobs) and reported == list(state.skipped):
        return state
    return replace(state, jobs=tuple(jobs), slots=tuple(s for s, _ in checked),
                   skipped=tuple(reported + skipped))


def claim_not_yet_in_ad(job: Job, slots: Mapping[str, Slot]) -> str | None:
    """The slot of a started job that its slot's ad may not show yet: its resources are not
    yet out of the ad's free amounts. That is when the ad lists its dynamic slots
    (``ChildName``) without the job's, or when the ad predates the job's start or the job has
    no start time yet (conservative: the claim precedes the start). A listed name alone is not
    enough: the startd reuses dynamic slot names, so an ad sent before the job started may
    list its name for an earlier claim that has ended (seen on the local pool, GPU scale test);
    only an ad without a time is taken at its names.

    The schedd marks a job running before it records ``RemoteHost`` (a separate transaction,
    when it spawns the shadow), so a started job without one counts on the slot it is pinned to.
    """
    if job.status not in HOLDS_A_SLOT:
        return None
    if not job.remote_slot:
        return job.pinned_slot if job.pinned_slot in slots else None
    slot = slots.get(partitionable_slot_of(job.remote_slot))
    if slot is None:
        return None
    if slot.children is not None and job.remote_slot not in slot.children:
        return slot.name
    if slot.children is not None and not slot.updated_at_s:
        return None  # an ad without a time says only its names
    return slot.name if job.started_at_s is None or job.started_at_s >= slot.updated_at_s else None
