"""The planner interface every mode's planners share: jobs and slots in, a Plan out, no I/O.

The sidecar, the offline planner and the simulator find a planner by name through the mode
registry (``condor_sched.modes.registry.get_policy``) and call ``plan``; a new planner is one
class in its mode's package, listed in that mode's ``planners``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from condor_sched.model import Assignment, Job, JobKey, NodeMeasurements, Plan, Resources, RunningJob, Slot, Unplaced

if TYPE_CHECKING:
    from condor_sched.profiles import ProfileStore

#: Why a job waits when its Requirements or every slot's START refuse every slot.
NO_SLOT_ACCEPTS = "no slot accepts it: its Requirements or the slots' START refuse every slot"


class PolicyError(ValueError):
    """An unknown policy name or an invalid policy setting."""


class PolicyKind(str, enum.Enum):
    """What a policy places: device jobs on device slots, or spread jobs on socket slots."""

    DEVICE = "device"
    SPREAD = "spread"
    #: Rigid multi-node CPU jobs on whole NODE slots (paper 001: ``backfill``, ``sd``).
    NODE = "node"
    #: Spare-capacity jobs on SPARE slots (paper 003: ``spare-spread``, ``spare-pack``).
    SPARE = "spare"
    #: Jobs that may time-share a core, on OVERCOMMIT slots (paper 004: ``overcommit``,
    #: ``naive-overcommit``).
    OVERCOMMIT = "overcommit"


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """The knobs every policy may read; the sidecar fills them from COSCHED_* knobs, ``plan``
    and ``simulate`` from their options.

    ``seed`` makes random choices reproducible, ``deterministic`` asks CP-SAT for one worker
    and a deterministic time limit (the simulator's byte-identical runs).
    ``sns_block_on_aged``: an aged spread job that fits nowhere holds lower-priority jobs back
    so that nodes drain for it; ``sns_global_max_jobs``: jobs in ``sns-global``'s joint model.

    Aging has two limits, in cycles: ``age_limit_cycles`` for the device policies and
    ``spread_age_limit_cycles`` for the spread policies (``sns``, ``sns-global``, ``ce``,
    ``cs``); None there means "as ``age_limit_cycles``". Separate because the measured
    sweep (docs/results.md, paper 000's aging sweep) puts them far apart: a spread job aged early is placed relaxed
    (below its alpha) and holds back every job after it, which on paper 000's sequences
    costs throughput at every limit short of the sequences' longest wait; the default 30
    is 1800 s at the sidecar's 60 s interval, the shortest limit of the sweep that cost
    nothing. :meth:`spread_age_limit` is the value to use.
    """

    memory_granularity_mb: int = 50
    knapsack_solver: str = "dp"
    thread_overcommit: float = 1.0
    solver_time_limit_s: float = 2.0
    age_limit_cycles: int = 10
    seed: int = 0
    deterministic: bool = False
    sns_block_on_aged: bool = True
    sns_global_max_jobs: int = 16
    spread_age_limit_cycles: int | None = 30
    #: SD-Policy (paper 001, Section 3.2): MAX_SLOWDOWN, the cut-off of a mate's penalty
    #: (math.inf: unbounded; None: DynAVGSD, the running jobs' average predicted slowdown),
    #: the most mates of one guest (m) and the SharingFactor. The default 10 is ours
    #: (``sd.DEFAULT_MAX_SLOWDOWN``), m and SharingFactor the paper's.
    sd_max_slowdown: float | None = 10.0
    sd_max_mates: int = 2
    sd_sharing_factor: float = 0.5
    #: ``plan`` on a snapshot: a SPARE slot whose node agent published nothing takes the
    #: running primaries' own ``CpusUsage``/``MemoryUsage`` (the live sidecar never does).
    spare_from_job_usage: bool = False

    def spread_age_limit(self) -> int:
        """The aging limit (cycles) of the spread policies."""
        return self.age_limit_cycles if self.spread_age_limit_cycles is None else self.spread_age_limit_cycles


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What one policy call sees, all typed: the idle jobs to place, the jobs already running,
    the partitionable slots with their free amounts, each job's eligible slots, the nodes'
    measurements, the cycle number and when each job was first seen (aging), the program
    profiles and the piggyback-profiling scales.

    A job missing from ``eligible`` may use every slot. Through :func:`run_policy` (the only
    way the cycle calls a policy) every job of a call is eligible for every slot of it."""

    idle: tuple[Job, ...]
    slots: tuple[Slot, ...]
    running: tuple[RunningJob, ...] = ()
    eligible: Mapping[JobKey, frozenset[str]] = field(default_factory=dict)
    nodes: Mapping[str, NodeMeasurements] = field(default_factory=dict)
    cycle: int = 0
    first_seen_cycle: Mapping[JobKey, int] = field(default_factory=dict)
    profiles: ProfileStore | None = None
    exploration_scales: Mapping[str, int] = field(default_factory=dict)
    #: The time the state was observed (s); the node-sharing policies plan against it.
    now_s: float | None = None
    #: The cycle's interference guard (``interference.guard.CycleGuard``; None: off), for the
    #: planners that weigh pairs (paper 004's ``overcommit``).
    interference: Any = None

    @classmethod
    def of(cls, jobs: Sequence[Job], slots: Sequence[Slot], **more) -> PlanRequest:
        """A request from plain sequences (tests, benchmarks)."""
        return cls(tuple(jobs), tuple(slots), **more)

    def age_of(self, job: JobKey) -> int:
        """Cycles since ``job`` was first seen (0 when it was not seen before)."""
        return self.cycle - self.first_seen_cycle.get(job, self.cycle)


class Policy(Protocol):
    name: str
    kind: PolicyKind

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        """Place ``request.idle`` on the free resources of ``request.slots``."""
        ...


def assigned_request(job: Job, assignment: Assignment) -> Resources:
    """What a placed job's dynamic slot takes from its slot: the job's request, with the ways
    and bandwidth a spread plan gave a proc (its ``llc_ways``/``mem_bw_gbs`` details)."""
    details = assignment.details
    if "llc_ways" not in details:
        return job.request
    return replace(job.request, llc_ways=int(details["llc_ways"]), mem_bw_gbs=float(details["mem_bw_gbs"]))


def run_policy(policy: Policy, request: PlanRequest, settings: PlanSettings) -> Plan:
    """``policy.plan`` so that no job lands outside its eligible slots: jobs are grouped by
    eligible set and each group, oldest job first, is planned on its own slots with what the
    groups before it left free. With one group (the usual queue) this is one call."""
    groups: dict[frozenset[str] | None, list[Job]] = {}
    names = frozenset(s.name for s in request.slots)
    # Jobs of one class share one eligible set object: intersect each object once.
    narrowed: dict[int, frozenset[str] | None] = {}
    for job in request.idle:
        allowed = request.eligible.get(job.key)
        if allowed is None:
            group = None
        elif id(allowed) in narrowed:
            group = narrowed[id(allowed)]
        else:
            group = narrowed[id(allowed)] = None if names <= allowed else allowed & names
        groups.setdefault(group, []).append(job)
    if set(groups) <= {None}:  # every job may use every slot
        return policy.plan(replace(request, eligible={}), settings)
    free = {s.name: s for s in request.slots}
    by_key = {j.key: j for j in request.idle}
    assignments: list[Assignment] = []
    unplaced: list[Unplaced] = []
    stats: dict[str, object] = {"eligibility_groups": len(groups)}
    ordered = sorted(groups.items(), key=lambda kv: min((j.submitted_at_s, j.key) for j in kv[1]))
    for allowed, jobs in ordered:
        slots = tuple(s for n, s in free.items() if allowed is None or n in allowed)
        if not slots:
            unplaced += [Unplaced(j.key, too_large_reason(j, request.slots)
                                  or NO_SLOT_ACCEPTS)
                         for j in jobs]
            continue
        part = policy.plan(replace(request, idle=tuple(jobs), slots=slots, eligible={}), settings)
        for a in part.assignments:
            taken = assigned_request(by_key[a.job], a)
            free[a.slot] = free[a.slot].with_free(free[a.slot].free - taken)
        assignments += part.assignments
        unplaced += part.unplaced
        stats.update(part.stats)
    return Plan(policy.name, tuple(assignments), tuple(unplaced), stats)


_AMOUNTS = (("device_memory_mb", "MB device memory"), ("device_threads", "device threads"), ("cpus", "cpus"),
            ("memory_mb", "MB memory"), ("llc_ways", "LLC ways"), ("mem_bw_gbs", "GB/s memory bandwidth"))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def too_large_reason(job: Job, slots: Sequence[Slot]) -> str | None:
    """Why no slot of ``slots`` could hold ``job`` even empty (its requests against the
    largest totals), or None."""
    parts = []
    for attr, label in _AMOUNTS:
        largest = max((getattr(s.total, attr) for s in slots), default=0)
        if getattr(job.request, attr) > largest:
            parts.append(f"needs {_number(getattr(job.request, attr))} {label}, the largest slot has {_number(largest)}")
    return "; ".join(parts) or None


def cp_sat_solver(settings: PlanSettings, time_limit_s: float | None = None):
    """A CP-SAT solver set up the same way for every policy: wall-clock limit and all cores
    normally; one worker and a deterministic limit when ``settings.deterministic`` (the
    simulator's byte-identical runs)."""
    import os

    from ortools.sat.python import cp_model

    limit = max(0.01, settings.solver_time_limit_s if time_limit_s is None else time_limit_s)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.random_seed = settings.seed
    if settings.deterministic:
        params.num_workers = 1
        params.max_deterministic_time = limit
    else:
        params.num_workers = max(1, min(8, os.cpu_count() or 1))
        params.max_time_in_seconds = limit
    return solver
