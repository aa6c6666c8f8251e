"""The spare mode's planners (pure): idle spare-capacity jobs onto SPARE slots whose free
amounts the mode has already capped at what each node publishes as spare (``mode.py``).

- ``spare-spread`` (default): each job, in the order given (fair share), to the slot that fits
  it with the most spare cores left, then the most spare memory. Paper 003 hands its
  data-intensive tasks every node's share (Mesos offers, Section III); spreading keeps each
  node's spare load, and so the pressure on its primaries' caches and bandwidth, low.
- ``spare-pack``: to the fitting slot with the fewest spare cores left (best fit), keeping
  whole nodes' spare room for large jobs.
"""
from __future__ import annotations

import time

from condor_sched.model import Assignment, Job, Plan, Resources, Slot, Unplaced
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind


def _fits(request: Resources, free: Resources) -> bool:
    return request.cpus <= free.cpus and request.memory_mb <= free.memory_mb


def _no_room_reason(job: Job, slots: tuple[Slot, ...], free: dict[str, Resources]) -> str:
    if not slots:
        return "no node offers spare capacity now"
    most_cpus = max(f.cpus for f in free.values())
    most_memory = max(f.memory_mb for f in free.values())
    return (f"no node has {job.request.cpus} spare cores and {job.request.memory_mb} MB spare memory now "
            f"(the most: {most_cpus} cores, {most_memory} MB)")


class _SparePlanner:
    """Greedy placement in the given order; subclasses choose among the fitting slots."""

    name = ""
    kind = PolicyKind.SPARE

    def choose(self, fitting: list[Slot], free: dict[str, Resources]) -> Slot:
        raise NotImplementedError

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        t0 = time.perf_counter()
        free = {s.name: s.free for s in request.slots}
        assignments: list[Assignment] = []
        unplaced: list[Unplaced] = []
        for job in request.idle:
            allowed = request.eligible.get(job.key)
            fitting = [s for s in request.slots if (allowed is None or s.name in allowed)
                       and _fits(job.request, free[s.name])]
            if not fitting:
                unplaced.append(Unplaced(job.key, _no_room_reason(job, request.slots, free)))
                continue
            slot = self.choose(fitting, free)
            free[slot.name] = free[slot.name] - Resources(cpus=job.request.cpus, memory_mb=job.request.memory_mb)
            assignments.append(Assignment(job.key, slot.name))
        return Plan(self.name, tuple(assignments), tuple(unplaced),
                    {"solve_time_s": round(time.perf_counter() - t0, 6)})


class SpareSpreadPolicy(_SparePlanner):
    """Most spare cores left first (then memory, then name: deterministic)."""

    name = "spare-spread"

    def choose(self, fitting: list[Slot], free: dict[str, Resources]) -> Slot:
        return min(fitting, key=lambda s: (-free[s.name].cpus, -free[s.name].memory_mb, s.name))


class SparePackPolicy(_SparePlanner):
    """Fewest spare cores left first (best fit; then memory, then name)."""

    name = "spare-pack"

    def choose(self, fitting: list[Slot], free: dict[str, Resources]) -> Slot:
        return min(fitting, key=lambda s: (free[s.name].cpus, free[s.name].memory_mb, s.name))
