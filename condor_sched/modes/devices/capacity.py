"""Coprocessor accounting shared by the device planners of paper 002 (knapsack, global,
exclusive, random): which jobs and slots they consider, Eq. 1 values, capacities, the
aging rule and the reasons a job stays unplaced.

Jobs considered: idle jobs with ``uses_device`` (device memory requested). Slots considered:
``SlotKind.DEVICE`` (the cycle gives a policy only the slots of each job's device kind).
A job fits a device when its whole request fits the slot's free resources, in the four
named dimensions of :class:`Capacity`:

- ``device_memory_granules``: device memory in granules of ``settings.memory_granularity_mb``:
  job memory rounded UP, free memory rounded DOWN, so a plan never oversubscribes it;
- ``device_threads``: the device's compute (hardware threads for a Xeon Phi): free threads
  plus ``total * (thread_overcommit - 1)`` where the device kind lets compute be
  overcommitted (``DeviceKind.compute_overcommit``). With the default overcommit 1.0 this
  is a hard limit (a deliberate deviation from paper 002, whose DP is over memory only and
  only zeroes a knapsack's value when threads overflow; see ``knapsack.py``). A single job
  never gets more threads than the device has;
- ``cpus``: host cpus of the device slot;
- ``memory_mb``: host memory of the device slot (MB).

Aging rule (no job starves). Every placed job is worth ``COUNT_WEIGHT`` plus its scaled
Eq. 1 value, so the planners maximise the number of jobs placed first and the Eq. 1 sum
second, and even a job with t = T (Eq. 1 value 0) has positive worth. That alone does not
stop a stream of small jobs from beating one big job forever, so: a job idle for more than
``settings.age_limit_cycles`` cycles is *starving*. Its age is the current cycle minus the
cycle it was first seen (``PlanRequest.age_of``: the cycle keeps the first-seen cycles; a job
not seen before is first seen this cycle).
Before any knapsack runs, starving jobs, oldest first, are each placed on the device with
the most free resources that fits them now; a starving job that fits no device now reserves
the device with the most free resources whose total fits it (that device gets no other job
this cycle, so it drains), and is placed once enough has finished there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from operator import le
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from condor_sched.device_kinds import DEFAULT_KIND, device_kind
from condor_sched.model import Assignment, Job, JobKey, Plan, Slot, SlotKind, Unplaced
from condor_sched.modes.planning import PlanSettings, PolicyError

#: Eq. 1 values are scaled to integers by this factor for the exact solvers.
VALUE_SCALE = 10_000



class Capacity(NamedTuple):
    """A device plan's demand or capacity, dimension by name (module docstring). Its field
    order is the column order of the solvers' weight rows and numpy arrays."""

    device_memory_granules: int
    device_threads: int
    cpus: int
    memory_mb: int

    @property
    def shape_class(self) -> ShapeClass:
        return ShapeClass(self.device_threads, self.cpus, self.memory_mb)


class ShapeClass(NamedTuple):
    """Jobs equal in every dimension but device memory (equal in Eq. 1 value too)."""

    device_threads: int
    cpus: int
    memory_mb: int


DIMENSIONS = Capacity._fields
N_DIMENSIONS = len(DIMENSIONS)
#: Column of each dimension in the mutable residual rows and numpy arrays.
MEMORY, THREADS = DIMENSIONS.index("device_memory_granules"), DIMENSIONS.index("device_threads")
#: Columns of a shape class's dimensions, in ShapeClass order.
CLASS_COLUMNS = tuple(DIMENSIONS.index(f) for f in ShapeClass._fields)
DIMENSION_NAMES = {"device_memory_granules": "device memory", "device_threads": "device threads",
                   "cpus": "host cpus", "memory_mb": "host memory"}


def eq1_value(threads: int, hardware_threads: int) -> float:
    """Eq. 1 of paper 002, v = 1 - (t / T)^2, with T the device's hardware threads (the
    paper hard-codes T = 240); clamped at 0 for t > T."""
    if hardware_threads <= 0:
        return 0.0
    return max(0.0, 1.0 - (threads / hardware_threads) ** 2)


def scaled_value(threads: int, hardware_threads: int) -> int:
    """Eq. 1 as an integer in [0, VALUE_SCALE], rounded half up, the same for every solver."""
    if hardware_threads <= 0 or threads >= hardware_threads:
        return 0
    tt = hardware_threads * hardware_threads
    return (VALUE_SCALE * (tt - threads * threads) * 2 + tt) // (2 * tt)


def count_weight(max_jobs_placed: int) -> int:
    """The profit every placed job gets before its Eq. 1 value: larger than any sum of
    scaled values of ``max_jobs_placed`` jobs, so one more job always wins."""
    return VALUE_SCALE * (max_jobs_placed + 1)


def check_settings(settings: PlanSettings) -> None:
    if settings.memory_granularity_mb < 1:
        raise PolicyError(f"memory_granularity_mb must be >= 1, got {settings.memory_granularity_mb}")
    if settings.thread_overcommit < 1.0:
        raise PolicyError(f"thread_overcommit must be >= 1.0, got {settings.thread_overcommit}")
    if settings.knapsack_solver not in ("dp", "ortools"):
        raise PolicyError(f"knapsack_solver must be 'dp' or 'ortools', got {settings.knapsack_solver!r}")


def job_order(job: Job) -> tuple:
    """FIFO: older jobs first, then by key (deterministic)."""
    return (job.submitted_at_s, job.key)


def device_jobs(jobs: Iterable[Job]) -> list[Job]:
    """The idle jobs that use a device, oldest first."""
    return sorted((j for j in jobs if j.is_idle and j.uses_device), key=job_order)


def device_slots(slots: Iterable[Slot]) -> list[Slot]:
    """The device slots, in name order (the order Fig. 4 fills them in)."""
    return sorted((s for s in slots if s.kind is SlotKind.DEVICE), key=lambda s: s.name)


def demand(job: Job, settings: PlanSettings) -> Capacity:
    r = job.request
    g = settings.memory_granularity_mb
    return Capacity(-(-r.device_memory_mb // g), r.device_threads, r.cpus, r.memory_mb)


def compute_overcommit(slot: Slot, settings: PlanSettings) -> float:
    """The thread overcommit a slot's device kind allows (1.0: compute is hard)."""
    if settings.thread_overcommit == 1.0 or not device_kind(slot.device_kind or DEFAULT_KIND).compute_overcommit:
        return 1.0
    return settings.thread_overcommit


def free_capacity(slot: Slot, settings: PlanSettings) -> Capacity:
    """What a plan may still put on ``slot`` (see the module docstring)."""
    f, t = slot.free, slot.total
    extra_threads = math.floor(t.device_threads * (compute_overcommit(slot, settings) - 1.0) + 1e-9)
    return Capacity(
        device_memory_granules=max(0, f.device_memory_mb // settings.memory_granularity_mb),
        device_threads=max(0, f.device_threads + extra_threads),
        cpus=max(0, f.cpus),
        memory_mb=max(0, f.memory_mb),
    )


def total_capacity(slot: Slot, settings: PlanSettings) -> Capacity:
    t = slot.total
    return Capacity(t.device_memory_mb // settings.memory_granularity_mb, t.device_threads, t.cpus, t.memory_mb)


def fits(need: Sequence[int], cap: Sequence[int]) -> bool:
    return all(map(le, need, cap))


def fits_device(job: Job, need: Capacity, cap: Sequence[int], slot: Slot) -> bool:
    """Fits the capacity left and never more threads than the device has."""
    return fits(need, cap) and job.request.device_threads <= slot.total.device_threads


def too_big_reason(job: Job, slots: Sequence[Slot], settings: PlanSettings) -> str | None:
    """Why ``job`` fits no device even when every device is empty, or None."""
    return _too_big_reason(job, demand(job, settings), _Totals.of(slots, settings), settings)


@dataclass(frozen=True, slots=True)
class _Totals:
    caps: tuple[Capacity, ...]  # distinct total capacities
    largest_mb: int

    @classmethod
    def of(cls, slots: Sequence[Slot], settings: PlanSettings) -> _Totals:
        return cls(
            tuple(sorted({total_capacity(s, settings) for s in slots})),
            max((s.total.device_memory_mb for s in slots), default=0),
        )


def _too_big_reason(job: Job, need: Capacity, totals: _Totals, settings: PlanSettings) -> str | None:
    if not totals.caps:
        return "no device slots in the pool"
    if any(fits(need, t) for t in totals.caps):
        return None
    r = job.request
    g = settings.memory_granularity_mb
    largest = Capacity(*(max(column) for column in zip(*totals.caps)))
    parts = []
    if need.device_memory_granules > largest.device_memory_granules:
        if r.device_memory_mb > totals.largest_mb:
            parts.append(f"needs {r.device_memory_mb} MB device memory, largest device has {totals.largest_mb}")
        else:
            parts.append(
                f"needs {need.device_memory_granules} x {g} MB granules of device memory ({r.device_memory_mb} MB "
                f"rounded up), largest device has {largest.device_memory_granules} ({totals.largest_mb} MB)"
            )
    if need.device_threads > largest.device_threads:
        parts.append(f"needs {r.device_threads} device threads, largest device has {largest.device_threads}")
    if need.cpus > largest.cpus:
        parts.append(f"needs {r.cpus} host cpus, largest device slot has {largest.cpus}")
    if need.memory_mb > largest.memory_mb:
        parts.append(f"needs {r.memory_mb} MB host memory, largest device slot has {largest.memory_mb}")
    if not parts:
        parts.append(
            f"needs {r.device_memory_mb} MB device memory, {r.device_threads} threads, {r.cpus} cpus and "
            f"{r.memory_mb} MB host memory together; no device has all of them"
        )
    return "; ".join(parts)


def _not_fitted_reason(need: Capacity, residual: np.ndarray, hardware_threads: np.ndarray) -> str:
    """Why a job that fits some empty device was left out this cycle (``residual``: one
    row of free capacity per open device)."""
    usable = residual[hardware_threads >= need.device_threads]
    if len(usable) and (usable >= np.asarray(need)).all(axis=1).any():
        return "not chosen this cycle: other jobs gave a better packing"
    short = [DIMENSION_NAMES[name] for d, name in enumerate(DIMENSIONS)
             if not len(usable) or need[d] > usable[:, d].max()]
    if short:
        return f"no device with enough free {' and '.join(short)} this cycle"
    return "no device with enough free resources together this cycle"


def _roominess(cap: Sequence[int], total: Sequence[int]) -> float:
    return sum(c / t for c, t in zip(cap, total) if t > 0)


@dataclass(slots=True)
class DeviceState:
    """The mutable planning state of one cycle: residual capacities and the plan so far."""

    slots: list[Slot]
    residual: dict[str, list[int]]
    reserved: set[str]
    assignments: list[Assignment]
    notes: dict[JobKey, str]

    @classmethod
    def start(cls, slots: Sequence[Slot], settings: PlanSettings) -> DeviceState:
        return cls(list(slots), {s.name: list(free_capacity(s, settings)) for s in slots}, set(), [], {})

    def assign(self, job: Job, slot: Slot, need: Sequence[int], details: Mapping[str, Any] | None = None) -> None:
        cap = self.residual[slot.name]
        for d in range(N_DIMENSIONS):
            cap[d] -= need[d]
        self.assignments.append(Assignment(job=job.key, slot=slot.name, details=dict(details or {})))

    def open_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.name not in self.reserved]


def split_too_big(jobs: Sequence[Job], slots: Sequence[Slot], settings: PlanSettings) -> tuple[list[Job], list[Unplaced]]:
    """Separate the jobs no device could ever hold (with the reason) from the rest."""
    ok, bad = [], []
    totals = _Totals.of(slots, settings)
    memo: dict[Capacity, str | None] = {}
    for job in jobs:
        need = demand(job, settings)
        if need not in memo:
            memo[need] = _too_big_reason(job, need, totals, settings)
        reason = memo[need]
        if reason is None:
            ok.append(job)
        else:
            bad.append(Unplaced(job=job.key, reason=reason))
    return ok, bad


def place_starving(jobs: Sequence[Job], state: DeviceState, settings: PlanSettings,
                   ages: Mapping[JobKey, int]) -> list[Job]:
    """The aging rule (module docstring): place or reserve for starving jobs (``ages``: cycles
    idle per job); return the jobs left for the knapsack."""
    starving = [j for j in jobs if ages[j.key] > settings.age_limit_cycles]
    if not starving:
        return list(jobs)
    starving.sort(key=lambda j: (-ages[j.key], job_order(j)))
    done: set[JobKey] = set()
    # Residuals only shrink and reserved devices only grow: once a job of a shape can be
    # neither placed nor given a device, no later job of that shape can.
    hopeless: set[Capacity] = set()
    totals = {s.name: total_capacity(s, settings) for s in state.slots}

    def roomiest(slots: list[Slot]) -> Slot:
        return min(slots, key=lambda s: (-_roominess(state.residual[s.name], totals[s.name]), s.name))

    for job in starving:
        need = demand(job, settings)
        if need in hopeless:
            continue
        open_slots = [s for s in state.open_slots() if s.total.device_threads >= job.request.device_threads]
        now = [s for s in open_slots if fits(need, state.residual[s.name])]
        if now:
            state.assign(job, roomiest(now), need)
            done.add(job.key)
            continue
        later = [s for s in open_slots if fits(need, totals[s.name])]
        if later:
            best = roomiest(later)
            state.reserved.add(best.name)
            state.notes[job.key] = f"starving (idle {ages[job.key]} cycles): reserved {best.name} to drain"
            done.add(job.key)
        else:
            hopeless.add(need)
    return [j for j in jobs if j.key not in done]


def finish_plan(
    policy: str,
    jobs: Sequence[Job],
    slots: Sequence[Slot],
    state: DeviceState,
    too_big: Sequence[Unplaced],
    settings: PlanSettings,
    stats: Mapping[str, object],
) -> Plan:
    """Assemble the Plan: every considered job is assigned once or unplaced with a reason."""
    placed = {a.job for a in state.assignments}
    unplaced = list(too_big)
    big = {u.job for u in too_big}
    open_slots = state.open_slots()
    residual = np.array([state.residual[s.name] for s in open_slots], dtype=np.int64).reshape(-1, N_DIMENSIONS)
    hardware_threads = np.array([s.total.device_threads for s in open_slots], dtype=np.int64)
    memo: dict[Capacity, str] = {}
    for job in jobs:
        if job.key in placed or job.key in big:
            continue
        reason = state.notes.get(job.key)
        if reason is None:
            need = demand(job, settings)
            if need not in memo:
                memo[need] = _not_fitted_reason(need, residual, hardware_threads)
            reason = memo[need]
        unplaced.append(Unplaced(job=job.key, reason=reason))
    by_key = {j.key: j for j in jobs}
    total_t = {s.name: s.total.device_threads for s in slots}
    value = sum(eq1_value(by_key[a.job].request.device_threads, total_t[a.slot]) for a in state.assignments)
    full_stats = {
        "jobs_considered": len(jobs),
        "devices": len(slots),
        "placed": len(state.assignments),
        "unplaced": len(unplaced),
        "eq1_value_sum": round(value, 6),
        "reserved_devices": sorted(state.reserved),
    }
    full_stats.update(stats)
    if settings.deterministic:  # byte-identical plans: no wall-clock numbers
        full_stats.pop("solve_time_s", None)
    return Plan(policy=policy, assignments=tuple(state.assignments), unplaced=tuple(unplaced), stats=full_stats)
