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
from dataclasses import dataclass, field, replace
from collections import Counter
from itertools import compress, repeat
from operator import and_, attrgetter, is_, is_not, itemgetter, not_
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from condor_sched.consistency import claim_not_yet_in_ad, consistent_state
from condor_sched.device_kinds import DEFAULT_KIND
from condor_sched.gpu_sharing import GpuSharingDecision, decide_gpu_sharing, gpu_pin_details
from condor_sched.node_sharing import NodeSharingDecision, decide_node_sharing
from condor_sched.fairshare import fair_order, fair_window
from condor_sched.model import (
    HOLDS_A_SLOT,
    Assignment,
    Job,
    JobKey,
    JobStatus,
    Plan,
    PoolState,
    Resources,
    RunningJob,
    Skipped,
    Slot,
    SlotKind,
    Unplaced,
    partitionable_slot_of,
)
from condor_sched.policies.base import (
    PlanRequest,
    PlanSettings,
    Policy,
    PolicyKind,
    assigned_request,
    get_policy,
    run_policy,
)
from condor_sched.policies.gpu_policies import GpuPolicy, gpu_policy, gpu_policy_names
from condor_sched.policies.devices import Capacity, compute_overcommit, demand, free_capacity, split_too_big
from condor_sched.policies.devices import _not_fitted_reason as not_fitted_reason

if TYPE_CHECKING:
    from condor_sched.profiles import ProfileStore
    from condor_sched.settings import SidecarSettings

_submitter, _job_prio, _reason_of = attrgetter("submitter"), attrgetter("job_prio"), attrgetter("reason")
_job_of = attrgetter("job")
_has_pin_clause, _spread = attrgetter("has_pin_clause"), attrgetter("spread")
_status, _pinned_slot, _pinned_cycle = attrgetter("status"), attrgetter("pinned_slot"), attrgetter("pinned_cycle")
#: A PlanCache row's job record, whether a device plan considers it, FIFO order, demand
#: shape and last ``Unplaced`` (``_NO_ROW``: the row of a record not in the cache).
_record, _for_device, _fifo, _shape, _last_unplaced = (itemgetter(i) for i in range(5))
_NOT_YET_UNPLACED = Unplaced(JobKey("", 0, 0), "")
_NO_ROW: list = [None, False, None, None, _NOT_YET_UNPLACED]
#: Job states in which a job holds a dynamic slot of its partitionable slot.


@dataclass(slots=True)
class PlanCache:
    """What a cycle derived from each idle job, kept for the next cycle (``CycleMemory.cache``):
    per job record its FIFO order, its demand shape and the ``Unplaced`` record it was last
    given. Entries are found by the record's identity and checked against it (``is``; the entry
    holds the record, so its id is never reused), so a source that builds new records every
    cycle (the sidecar) simply recomputes them: a cache never changes a decision, only its cost."""

    granularity_mb: int = 0
    #: id(job record) -> [the record, considered by a device plan, FIFO order, demand shape, last Unplaced].
    rows: dict[int, list] = field(default_factory=dict)
    #: (shape, device MB of the shape's first job) -> why no device of ``totals`` holds it.
    too_big: dict[tuple, str | None] = field(default_factory=dict)
    #: The device slots' totals ``too_big`` holds for.
    totals: tuple = ()

    def row(self, job: Job, settings: PlanSettings) -> list:
        if self.granularity_mb != settings.memory_granularity_mb:
            self.granularity_mb, self.rows, self.too_big = settings.memory_granularity_mb, {}, {}
        row = self.rows.get(id(job))
        if row is None or row[0] is not job:
            k = job.key
            row = self.rows[id(job)] = [job, job.is_idle and job.uses_device,
                                        (job.submitted_at_s, k.schedd, k.cluster, k.proc), demand(job, settings),
                                        _NOT_YET_UNPLACED]
        return row

    #: The rows of the last bounded plan's idle jobs (``ShapeQueues``), kept from cycle to cycle.
    queues: ShapeQueues | None = None
    #: The covered idle jobs of the last state (``CoveredJobs``).
    covered: CoveredJobs | None = None
    #: This cycle's (``CoveredJobs.version``, came, gone) when the device plan gets exactly
    #: the covered jobs, else None; and the unplaced jobs of this cycle's ``bounded_run``.
    covered_changes: tuple[int, list[Job], list[Job]] | None = None
    whole_unplaced: tuple[Unplaced, ...] | None = None

    def forget_all_but(self, live: int) -> None:
        """Drop every entry when those of jobs gone outnumber the ``live`` ones (bounded size)."""
        if len(self.rows) > 2 * live + 1024:
            self.rows, self.too_big = {}, {}
            if self.queues is not None:
                self.rows.update(self.queues.live)


@dataclass(slots=True)
class CoveredJobs:
    """The covered idle jobs of the last state (``covered``) in key order, patched from one
    cycle to the next with the records that came and went (found by identity, one pass over
    the state's jobs), with what the cycle's shortcuts ask of them: their pinned records, how
    many are not device jobs, spread or lack the pin clause, and their submitters, JobPrio
    values and device kinds. A source that builds new records every cycle gets a rebuild."""

    #: id(record) -> record, every job of the last state (whatever its status), and the covered ones.
    seen: dict[int, Job] = field(default_factory=dict)
    live: dict[int, Job] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    keys: list[JobKey] = field(default_factory=list)
    pinned: dict[int, Job] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    #: Covered records that came and went in the last update, and the update's number.
    came: list[Job] = field(default_factory=list)
    gone: list[Job] = field(default_factory=list)
    version: int = 0
    #: False after a rebuild: ``came`` and ``gone`` then say nothing of the state before.
    patched: bool = False
    #: The first-seen map the last cycle returned, and the one this cycle's continued (None:
    #: built afresh, so a job that stayed may have another first-seen cycle).
    first_seen: Mapping[JobKey, int] | None = None
    continued_from: Mapping[JobKey, int] | None = None

    def update(self, state_jobs: Sequence[Job]) -> None:
        self.version += 1
        ids = list(map(id, state_jobs))
        found = list(map(self.seen.__contains__, ids))
        came = found.count(False)
        gone = len(self.seen) - (len(state_jobs) - came)
        if not came and not gone:
            self.came, self.gone, self.patched = [], [], True
            return
        if 4 * (came + gone) > len(state_jobs):
            self._rebuild(state_jobs)
            return
        self.patched = True
        gone_records = [self.seen.pop(i) for i in _absent(self.seen, ids)] if gone else []
        came_records = list(compress(state_jobs, map(not_, found)))
        self.seen.update(zip(map(id, came_records), came_records))
        self.gone = [j for j in gone_records if id(j) in self.live]
        self.came = [j for j in came_records if covered(j)]
        for job in self.gone:
            del self.live[id(job)]
            self.pinned.pop(id(job), None)
            self._count(job, -1)
            at = bisect_left(self.keys, job.key)
            while self.jobs[at] is not job:
                at += 1
            del self.jobs[at], self.keys[at]
        for job in self.came:
            self._add(job)
            at = bisect_left(self.keys, job.key)
            self.keys.insert(at, job.key)
            self.jobs.insert(at, job)

    def _rebuild(self, state_jobs: Sequence[Job]) -> None:
        self.seen = dict(zip(map(id, state_jobs), state_jobs))
        self.jobs = _covered_idle(state_jobs)
        self.keys = list(map(_key_order, self.jobs))
        self.live, self.pinned, self.counts = {}, {}, Counter()
        for job in self.jobs:
            self._add(job)
        self.came, self.gone, self.first_seen, self.patched = list(self.jobs), [], None, False

    def _add(self, job: Job) -> None:
        self.live[id(job)] = job
        if job.pinned_slot is not None or job.pinned_cycle is not None:
            self.pinned[id(job)] = job
        self._count(job, 1)

    def _count(self, job: Job, n: int) -> None:
        counts = self.counts
        counts[("submitter", job.submitter)] += n
        counts[("prio", job.job_prio)] += n
        if job.request.device_memory_mb > 0:
            counts[("kind", job.device_kind or DEFAULT_KIND)] += n
        else:
            counts["not_device"] += n
            counts["spread_only"] += n if job.spread else 0
        counts["no_pin_clause"] += 0 if job.has_pin_clause else n

    def distinct(self, what: str) -> set:
        return {k[1] for k, n in self.counts.items() if isinstance(k, tuple) and k[0] == what and n > 0}

    def first_seen_map(self, remembered: Mapping[JobKey, int], cycle: int) -> dict[JobKey, int]:
        """Each covered job's first-seen cycle: ``remembered``'s, else ``cycle``."""
        self.continued_from = None
        if remembered is not self.first_seen or self.first_seen is None or not isinstance(remembered, dict):
            keys = self.keys
            return dict(zip(keys, map(remembered.get, keys, repeat(cycle))))
        self.continued_from = remembered
        out = dict(remembered)
        came_keys = set(map(_key_order, self.came))
        for job in self.gone:
            if job.key not in came_keys:
                out.pop(job.key, None)
        for key in came_keys:
            out[key] = remembered.get(key, cycle)
        return out


def _absent(by_id: Mapping[int, Any], ids: Iterable[int]) -> set[int]:
    """The keys of ``by_id`` not in ``ids`` (in C: a set of them, less ``ids``)."""
    out = set(by_id)
    out.difference_update(ids)
    return out


#: Fewest jobs a queue must hold before ``ShapeQueues`` patches itself rather than rebuild.
_PATCH_MIN_JOBS = 256


@dataclass(slots=True)
class ShapeQueues:
    """A bounded plan's idle jobs as PlanCache rows, in FIFO order overall (``rows``) and per
    demand shape (``by_shape``), patched from one cycle to the next with the rows of records
    that came and went (found by identity), so a cycle's work follows what changed. Each row's
    last ``Unplaced`` stays right from cycle to cycle: a row gets its shape's reason when it
    comes, when its shape's reason changes, or when the plan stops speaking of it alone."""

    granularity_mb: int = -1
    #: id(job record) -> row, for the records of the last request.
    live: dict[int, list] = field(default_factory=dict)
    #: FIFO keys and rows, overall and per shape (sorted together).
    order: list[tuple] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    shape_order: dict[Capacity, list[tuple]] = field(default_factory=dict)
    shape_rows: dict[Capacity, list[list]] = field(default_factory=dict)
    #: The reason each shape's rows were last given, and the rows the plan spoke of alone.
    shape_reason: dict[Capacity, str] = field(default_factory=dict)
    own: list[list] = field(default_factory=list)
    #: ``_GONE`` entries in ``rows`` (a rebuild clears them).
    dead: int = 0
    #: The ``CoveredJobs.version`` whose jobs the rows are (-1: other jobs).
    version: int = -1
    #: What each unplaced row's job is told (``waiting_reason``), kept with the rows
    #: (``told_valid`` False: to be built again from the plan).
    told: dict[JobKey, str] = field(default_factory=dict)
    told_valid: bool = False
    waiting: _Waiting = field(default_factory=lambda: _Waiting())
    #: Per shape, its rows in the order they starve ((first-seen cycle, FIFO) keys and rows),
    #: kept only while the first-seen map goes on from the one they were built with (``seen_map``).
    seen_order: dict[Capacity, list[tuple]] | None = None
    seen_rows: dict[Capacity, list[list]] | None = None
    seen_map: Mapping[JobKey, int] | None = None
    seen_cycle: int = 0
    seen_key: dict[int, tuple] = field(default_factory=dict)

    def update(self, idle: Sequence[Job], cache: PlanCache, settings: PlanSettings) -> list[list]:
        """Follow ``idle`` (the request's jobs, all idle device jobs); the rows that came. When
        ``idle`` is the covered jobs, as last cycle, their changes (``cache.covered_changes``)
        say what came and went without a pass over the queue."""
        changes, last = cache.covered_changes, self.version
        self.version = -1 if changes is None else changes[0]
        if (changes is not None and last == changes[0] - 1 and self.granularity_mb == settings.memory_granularity_mb
                and len(idle) >= _PATCH_MIN_JOBS and 4 * (len(changes[1]) + len(changes[2]) + self.dead) <= len(idle)):
            gone_rows = [self.live.pop(id(job), None) for job in changes[2]]
            if None not in gone_rows:
                for row in gone_rows:
                    self._remove(row)
                came_rows = [cache.row(job, settings) for job in changes[1]]
                for row in came_rows:
                    self.live[id(row[0])] = row
                    self._insert(row)
                if len(self.live) == len(idle):
                    return came_rows
            return self._rebuild(idle, cache, settings)
        ids = list(map(id, idle))
        found = list(map(self.live.get, ids))
        came = found.count(None)
        gone = len(self.live) - (len(idle) - came)
        if not came and not gone and self.granularity_mb == settings.memory_granularity_mb:
            return []
        if (self.granularity_mb != settings.memory_granularity_mb or len(idle) < _PATCH_MIN_JOBS
                or 4 * (came + gone + self.dead) > len(idle)):
            return self._rebuild(idle, cache, settings)
        if gone:
            for i in _absent(self.live, ids):
                self._remove(self.live.pop(i))
        new_rows = [cache.row(job, settings) for job in compress(idle, map(is_, found, repeat(None)))]
        for row in new_rows:
            self.live[id(row[0])] = row
            self._insert(row)
        return new_rows

    def _rebuild(self, idle: Sequence[Job], cache: PlanCache, settings: PlanSettings) -> list[list]:
        if cache.granularity_mb != settings.memory_granularity_mb and idle:
            cache.row(idle[0], settings)  # resets the cache
        self.granularity_mb = settings.memory_granularity_mb
        rows = [cache.row(job, settings) for job in idle]
        rows.sort(key=_fifo)
        self.live = dict(zip(map(id, map(_record, rows)), rows))
        self.rows, self.order, self.dead = rows, list(map(_fifo, rows)), 0
        self.told, self.told_valid = {}, False
        self.seen_order = self.seen_rows = None
        self.seen_key = {}
        self.shape_rows, self.shape_order, self.shape_reason, self.own = {}, {}, {}, []
        for row in rows:
            self.shape_rows.setdefault(row[3], []).append(row)
        for need, members in self.shape_rows.items():
            self.shape_order[need] = list(map(_fifo, members))
        return rows

    def _remove(self, row: list) -> None:
        """Out of its shape's lists; in the FIFO list, ``_GONE`` takes its place (no shift)."""
        at = bisect_left(self.order, row[2])
        while self.rows[at] is not row:
            at += 1
        self.rows[at] = _GONE
        self.dead += 1
        self.told.pop(row[0].key, None)
        order, rows = self.shape_order[row[3]], self.shape_rows[row[3]]
        at = bisect_left(order, row[2])
        del order[at], rows[at]
        if self.seen_order is not None:
            order, rows = self.seen_order[row[3]], self.seen_rows[row[3]]  # type: ignore[index]
            at = bisect_left(order, self.seen_key.pop(id(row)))
            while rows[at] is not row:
                at += 1
            del order[at], rows[at]
            if not rows:
                del self.seen_order[row[3]], self.seen_rows[row[3]]  # type: ignore[misc]
        if not rows:
            del self.shape_rows[row[3]], self.shape_order[row[3]]
            self.shape_reason.pop(row[3], None)

    def _insert(self, row: list) -> None:
        if row[3] not in self.shape_rows:
            self.shape_rows[row[3]], self.shape_order[row[3]] = [], []
        for order, rows in ((self.order, self.rows), (self.shape_order[row[3]], self.shape_rows[row[3]])):
            at = bisect_left(order, row[2])
            order.insert(at, row[2])
            rows.insert(at, row)
        if self.seen_order is not None:
            seen = self.seen_key[id(row)] = (self.seen_map.get(row[0].key, self.seen_cycle), row[2])  # type: ignore[union-attr]
            order, rows = self.seen_order.setdefault(row[3], []), self.seen_rows.setdefault(row[3], [])  # type: ignore[union-attr]
            at = bisect_left(order, seen)
            order.insert(at, seen)
            rows.insert(at, row)

    def follow_first_seen(self, first_seen: Mapping[JobKey, int], cycle: int,
                          continued_from: Mapping[JobKey, int] | None) -> None:
        """Before ``update``: the first-seen map of this cycle. The rows' starving order is kept
        only while each map goes on from the last one (``continued_from``)."""
        if self.seen_order is not None and (continued_from is None or continued_from is not self.seen_map):
            self.seen_order = self.seen_rows = None
            self.seen_key = {}
        self.seen_map, self.seen_cycle = first_seen, cycle

    def starving_rows(self, limit: int) -> dict[Capacity, list[list]]:
        """Per shape, its rows of jobs idle more than ``limit`` cycles, longest-starving first
        (first-seen cycle, then FIFO; built when first asked, then kept with the rows)."""
        first_seen, cycle = self.seen_map, self.seen_cycle
        if self.seen_order is None:
            self.seen_order, self.seen_rows, self.seen_key = {}, {}, {}
            for need, members in self.shape_rows.items():
                ranked = sorted(((first_seen.get(r[0].key, cycle), r[2]), r) for r in members)  # type: ignore[union-attr]
                self.seen_order[need] = [k for k, _ in ranked]
                self.seen_rows[need] = [r for _, r in ranked]
                self.seen_key.update((id(r), k) for k, r in ranked)
        out = {}
        for need, order in self.seen_order.items():
            n = bisect_left(order, (cycle - limit,))
            if n:
                out[need] = self.seen_rows[need][:n]  # type: ignore[index]
        return out


#: What takes a gone row's place in ``ShapeQueues.rows`` (its ``Unplaced`` is never listed).
_GONE: list = [None, False, None, None, _NOT_YET_UNPLACED]


@dataclass(frozen=True, slots=True)
class CycleMemory:
    """What a cycle remembers of earlier ones: this cycle's number and the cycle each covered
    idle job was first seen (its age drives the aging rules), and ``cache``, what earlier
    cycles derived from the jobs (it saves work, never changes the decision; None: start
    empty). A source without memory (``plan``, a sidecar just started) uses :meth:`fresh`."""

    cycle: int
    first_seen: Mapping[JobKey, int] = field(default_factory=dict)
    cache: PlanCache | None = field(default=None, compare=False, repr=False)

    @classmethod
    def fresh(cls, state: PoolState) -> CycleMemory:
        """The memory a snapshot holds: cycle numbers go on after the newest pin's
        ``CoSchedPinCycle``; no job was seen before (every age is 0)."""
        return cls(1 + max((j.pinned_cycle or 0 for j in state.jobs), default=0))


@dataclass(frozen=True, slots=True)
class CycleConfig:
    """The policies and knobs of a cycle (``spread_policy`` None: spread jobs are left to
    HTCondor, COSCHED_SPREAD_POLICY = none)."""

    device_policy: Policy
    spread_policy: Policy | None
    plan: PlanSettings = PlanSettings()
    unpin_age_cycles: int = 3
    profiles: ProfileStore | None = None
    #: Plan ``BOUNDED_POLICIES`` on the jobs that can matter only (same decision, less work);
    #: False: every policy sees the whole queue (the baseline ``scripts/bench_simulate`` times).
    bounded: bool = True
    #: Node sharing of malleable jobs (paper 001's ``sd``, live: ``condor_sched.node_sharing``);
    #: None: COSCHED_NODE_POLICY = none.
    node_policy: Policy | None = None
    #: GPU sharing (issue 13, ``condor_sched.gpu_sharing``); None: COSCHED_GPU_POLICY = none.
    gpu_policy: GpuPolicy | None = None

    @classmethod
    def from_settings(cls, settings: SidecarSettings, profiles: ProfileStore | None = None) -> CycleConfig:
        spread = None if settings.spread_policy == "none" else get_policy(settings.spread_policy)
        node = None if settings.node_policy == "none" else get_policy(settings.node_policy)
        gpu = None if settings.gpu_policy == "none" else gpu_policy(settings.gpu_policy)
        return cls(get_policy(settings.policy), spread, settings.plan, settings.unpin_age_cycles, profiles,
                   node_policy=node, gpu_policy=gpu)

    def with_policy(self, name: str) -> CycleConfig:
        """This config with policy ``name`` in the place of its kind (device, spread, node or
        GPU fleet policy; a device policy's name sets the device policy, see :meth:`with_gpu_policy`)."""
        if name in gpu_policy_names(device_policies=False):
            return replace(self, gpu_policy=gpu_policy(name))
        policy = get_policy(name)
        if policy.kind is PolicyKind.SPREAD:
            return replace(self, spread_policy=policy)
        if policy.kind is PolicyKind.NODE:
            return replace(self, node_policy=policy)
        return replace(self, device_policy=policy)

    def with_gpu_policy(self, name: str) -> CycleConfig:
        """This config with GPU policy ``name`` (any of ``gpu_policy_names()``; ``none``: no GPU sharing)."""
        return replace(self, gpu_policy=None if name == "none" else gpu_policy(name))


@dataclass(frozen=True, slots=True)
class Unpin:
    job: JobKey
    reason: str


@dataclass(frozen=True, slots=True)
class Enroll:
    job: JobKey
    requirements: str | None


@dataclass(frozen=True, slots=True)
class Hold:
    """An idle covered job the sidecar can never place as its ad stands; ``reason`` names the
    attribute (it becomes the job's HoldReason; the user fixes it and releases the job)."""

    job: JobKey
    reason: str


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


@dataclass(frozen=True, slots=True)
class CycleDecision:
    """Everything one cycle decided. ``first_seen`` is the memory the next cycle starts from."""

    cycle: int
    seen: int
    kept: tuple[Assignment, ...]
    unpins: tuple[Unpin, ...]
    enrolls: tuple[Enroll, ...]
    pins: tuple[Pin, ...]
    plans: tuple[Plan, ...]
    skipped: tuple[Skipped, ...] = ()
    first_seen: Mapping[JobKey, int] = field(default_factory=dict)
    holds: tuple[Hold, ...] = ()
    #: What each idle covered job that was pinned or left waiting this cycle is told
    #: (``CoSchedPinReason``); kept pins keep theirs.
    reasons: Mapping[JobKey, str] = field(default_factory=dict)
    cache: PlanCache | None = field(default=None, compare=False, repr=False)
    #: Guests and mates of malleable jobs (``condor_sched.node_sharing``).
    node_sharing: NodeSharingDecision = field(default_factory=NodeSharingDecision)
    #: GPU jobs' pins (``condor_sched.gpu_sharing``).
    gpu_sharing: GpuSharingDecision = field(default_factory=GpuSharingDecision)

    @property
    def unplaced(self) -> tuple[Unplaced, ...]:
        return tuple(u for p in self.plans for u in p.unplaced)

    def next_memory(self, cycle: int | None = None) -> CycleMemory:
        """The memory of the next cycle, numbered ``cycle`` (default: this one plus one)."""
        return CycleMemory(self.cycle + 1 if cycle is None else cycle, self.first_seen, self.cache)

    def to_json(self) -> dict[str, Any]:
        """The documented ``plan --json`` object: placements of this cycle (``assignments``,
        with each policy's details), ``unplaced`` and ``skipped`` with reasons, per-policy
        ``stats``, and what happens to pins: ``kept``, ``unpins``, ``enrolls``."""

        def job(key: JobKey) -> dict[str, Any]:
            return {"job": key.job_id, "schedd": key.schedd}

        return {
            "cycle": self.cycle,
            "policy": self.plans[0].policy if self.plans else None,
            "spread_policy": self.plans[1].policy if len(self.plans) > 1 else None,
            "assignments": [{**job(a.job), "slot": a.slot, **dict(a.details)} for p in self.plans for a in p.assignments],
            "unplaced": [{**job(u.job), "reason": u.reason} for u in self.unplaced],
            "skipped": [{"what": s.what, "reason": s.reason} for s in self.skipped],
            "kept": [{**job(a.job), "slot": a.slot} for a in self.kept],
            "unpins": [{**job(u.job), "reason": u.reason} for u in self.unpins],
            "enrolls": [job(e.job) for e in self.enrolls],
            "holds": [{**job(h.job), "reason": h.reason} for h in self.holds],
            "reasons": [{**job(k), "reason": r} for k, r in sorted(self.reasons.items())],
            "stats": {p.policy: dict(p.stats) for p in self.plans},
            "guests": [{**job(g.job), "slot": g.slot, "mate": g.mate.job_id, "mate_schedd": g.mate.schedd,
                        "mate_increase_s": g.increase_s, "predicted_end_s": g.predicted_end_s}
                       for g in self.node_sharing.pins],
            "guest_kept": [job(k) for k in self.node_sharing.kept],
            "guest_unpins": [{**job(k), "reason": r} for k, r in self.node_sharing.unpins],
            "mates": [{**job(m.job), "writes": dict(m.writes), "why": m.why}
                      for m in (*self.node_sharing.lengthen, *self.node_sharing.restore)],
            "gpu_policy": self.gpu_sharing.plan.policy if self.gpu_sharing.plan else None,
            "gpu_pins": [{**job(p.job), "slot": p.slot, **gpu_pin_details(p)} for p in self.gpu_sharing.pins],
            "gpu_kept": [job(k) for k in self.gpu_sharing.kept],
            "gpu_unpins": [{**job(k), "reason": r} for k, r in self.gpu_sharing.unpins],
            "gpu_enrolls": [job(k) for k, _ in self.gpu_sharing.enrolls],
            "gpu_holds": [{**job(k), "reason": r} for k, r in self.gpu_sharing.holds],
        }


def covered(job: Job) -> bool:
    """The idle jobs the device and spread policies plan (``Job.sharing_mode`` devices or
    spread); GPU and node sharing cover theirs apart."""
    return job.is_idle and (job.uses_device or job.wants_spread)


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


def pin_reason(pin: Pin, cycle: int) -> str:
    return f"pinned to {pin.slot} in cycle {cycle}; waiting for the negotiator to match it there"


def waiting_reason(unplaced: Unplaced) -> str:
    return f"waiting: {unplaced.reason}"


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


#: Device policies whose plan depends, per demand shape, only on the shape's oldest and
#: longest-starving jobs, as many as the free capacity could hold (``bounded_run``):
#: ``knapsack`` (Fig. 4 takes each class's smallest-memory jobs, oldest first within a shape,
#: never more than a device's residual holds) and ``exclusive`` (FIFO: once a job of a shape
#: fits no empty device, no later job of that shape does). ``random`` draws over and
#: ``global`` solves over the whole queue: they always get it all.
BOUNDED_POLICIES = frozenset({"knapsack", "exclusive"})


def bounded_run(policy: Policy, request: PlanRequest, settings: PlanSettings, cache: PlanCache) -> Plan:
    """``run_policy`` for a policy of ``BOUNDED_POLICIES`` on a queue every job of which may use
    every slot, and equal to it, planning only the jobs that can matter. Of each demand shape,
    L = (the jobs of the shape each device's free capacity holds, summed over the devices) + 2,
    plus the number of devices when some job starves: the policy gets the shape's L oldest
    jobs and its L longest-starving ones. No plan places more of a shape or looks further down
    it (a device's candidates of a shape are at most what its residual holds, and residuals
    only shrink), and once a starving job of a shape can neither be placed nor reserve a
    device, no later one of its shape can. Each job left out is unplaced for the reason
    ``finish_plan`` gives its shape (too big, or why the final residuals cannot take it).
    The queue's rows are kept per shape from cycle to cycle (``ShapeQueues``)."""
    device_slots = [s for s in request.slots if s.kind is SlotKind.DEVICE]
    caps = [free_capacity(s, settings) for s in device_slots]
    if cache.queues is None:
        cache.queues = ShapeQueues()
    queues = cache.queues
    if len(queues.waiting) > 4096:  # reasons that name a cycle count grow without end
        queues.waiting = _Waiting()
    continued = cache.covered.continued_from if cache.covered is not None else None
    queues.follow_first_seen(request.first_seen_cycle, request.cycle, continued)
    came = queues.update(request.idle, cache, settings)
    rows = queues.rows  # in FIFO order, with ``_GONE`` in the place of rows gone
    n_rows = len(queues.live)
    cache.forget_all_but(n_rows)
    cycle, first_seen, limit = request.cycle, request.first_seen_cycle, settings.age_limit_cycles
    starving: dict[Capacity, list[list]] = {}
    if first_seen and cycle - min(first_seen.values()) > limit:
        starving = queues.starving_rows(limit)
    extra = 2 + (len(device_slots) if starving else 0)
    shapes = list(queues.shape_rows)
    most = dict(zip(shapes, _most_per_shape(shapes, caps, device_slots, extra)))
    if policy.name == "knapsack" and not starving:
        _past_a_full_shape(most, queues.shape_rows)
    kept_rows = [r for need in shapes for r in queues.shape_rows[need][:most[need]]]
    if starving:
        kept_rows += [r for need, rows_ in starving.items() for r in rows_[:most[need]]]
        kept_rows = list({id(r): r for r in kept_rows}.values())
    if len(kept_rows) == n_rows:
        queues.shape_reason, queues.own = {}, []  # every row's reason is set afresh next time
        queues.told_valid = False
        return run_policy(policy, request, settings)
    kept_rows.sort(key=_fifo)
    plan = policy.plan(replace(request, idle=tuple(map(_record, kept_rows)), eligible={}), settings)
    said = {u.job: u.reason for u in plan.unplaced}
    need_of = {r[0].key: r[3] for r in kept_rows}
    reserved = set(plan.stats.get("reserved_devices", ()))
    open_caps = {s.name: list(c) for s, c in zip(device_slots, caps) if s.name not in reserved}
    for a in plan.assignments:
        if a.slot in open_caps:
            open_caps[a.slot] = [c - n for c, n in zip(open_caps[a.slot], need_of[a.job])]
    residual = np.array(list(open_caps.values()), dtype=np.int64).reshape(-1, len(Capacity._fields))
    hardware = np.array([s.total.device_threads for s in device_slots if s.name in open_caps], dtype=np.int64)
    totals = tuple(s.total for s in device_slots)
    if totals != cache.totals:  # the same records cycle after cycle: compared by identity
        cache.totals, cache.too_big = totals, {}
    shape_reason: dict[Capacity, str] = {}
    too_big: set[Capacity] = set()
    for need in shapes:
        first = queues.shape_rows[need][0][0]
        memo = (need, first.request.device_memory_mb)
        if memo not in cache.too_big:
            bad = split_too_big([first], device_slots, settings)[1]
            cache.too_big[memo] = bad[0].reason if bad else None
        if cache.too_big[memo] is not None:
            too_big.add(need)
        shape_reason[need] = cache.too_big[memo] or not_fitted_reason(need, residual, hardware)
    placed = set(map(_job_of, plan.assignments))
    _tell_rows(queues, kept_rows, came, shape_reason, placed, said)
    units = list(map(_last_unplaced, rows))
    present = list(map(is_not, units, repeat(_NOT_YET_UNPLACED))) if placed or queues.dead else None
    if too_big:
        is_big = list(map(too_big.__contains__, map(_shape, rows)))
        if present is None:
            present = [True] * len(rows)
        unplaced = (tuple(compress(units, map(and_, is_big, present)))
                    + tuple(compress(units, map(and_, map(not_, is_big), present))))
    else:
        unplaced = tuple(units) if present is None else tuple(compress(units, present))
    if not queues.told_valid:
        waiting = queues.waiting
        queues.told = dict(zip(map(_job_of, unplaced), map(waiting.__getitem__, map(_reason_of, unplaced))))
        queues.told_valid = True
    cache.whole_unplaced = unplaced
    return replace(plan, unplaced=unplaced, stats={**plan.stats, "jobs_considered": n_rows, "unplaced": len(unplaced)})


def _most_per_shape(shapes: Sequence[Capacity], caps: Sequence[Capacity], device_slots: Sequence[Slot],
                    extra: int) -> list[int]:
    """Per shape, how many of its jobs the devices' free ``caps`` hold, each device on its own
    (a device that has fewer hardware threads than a job asks holds none), summed, plus ``extra``."""
    if not shapes:
        return []
    need = np.array(shapes, dtype=np.int64)  # shapes x dimensions
    free = np.array(caps, dtype=np.int64).reshape(-1, len(Capacity._fields))  # devices x dimensions
    per_dim = np.where(need[None, :, :] > 0, free[:, None, :] // np.maximum(need[None, :, :], 1), 1 << 40)
    per_device = per_dim.min(axis=2)
    hardware = np.array([s.total.device_threads for s in device_slots], dtype=np.int64)
    per_device[hardware[:, None] < need[None, :, 1]] = 0
    return (per_device.sum(axis=0) + extra).tolist()


def _past_a_full_shape(most: dict[Capacity, int], shape_rows: Mapping[Capacity, list]) -> None:
    """Knapsack only, no job starving: a shape none of whose jobs any device can take, set to 0.
    Within a class (``ShapeClass``), a device's candidates are the smallest-memory shapes'
    jobs first (``JobPool.candidates``); once a shape has more jobs than all devices can take
    of it, each device's candidates stop at it (its jobs use up the class's count or the
    memory a bigger shape would need), and so do the jobs taken (``take_from_class``)."""
    by_class: dict[Any, list[Capacity]] = {}
    for need in most:
        by_class.setdefault(need.shape_class, []).append(need)
    for members in by_class.values():
        members.sort(key=attrgetter("device_memory_granules"))
        for i, need in enumerate(members):
            if len(shape_rows[need]) > most[need]:
                for later in members[i + 1:]:
                    most[later] = 0
                break


def _tell_rows(queues: ShapeQueues, kept_rows: list[list], came: list[list], shape_reason: Mapping[Capacity, str],
               placed: set[JobKey], said: Mapping[JobKey, str]) -> None:
    """Give each row its ``Unplaced`` for this cycle (placed rows: ``_NOT_YET_UNPLACED``),
    and its job what it is told, touching only rows whose reason may have changed (``ShapeQueues``)."""
    own = set(map(id, kept_rows))
    told, waiting = queues.told, queues.waiting
    for r in kept_rows:
        key = r[0].key
        if key in placed:
            r[4] = _NOT_YET_UNPLACED
            told.pop(key, None)
            continue
        if r[4].reason != said[key]:
            r[4] = Unplaced(key, said[key])
        told[key] = waiting[said[key]]
    live = queues.live
    redo = [r for r in queues.own if id(r) not in own and live.get(id(r[0])) is r]
    redo += [r for r in came if id(r) not in own]
    for need, reason in shape_reason.items():
        if queues.shape_reason.get(need) != reason:
            queues.shape_reason[need] = reason
            redo += [r for r in queues.shape_rows[need] if id(r) not in own]
    for r in redo:
        reason = shape_reason[r[3]]
        if r[4].reason != reason:
            r[4] = Unplaced(r[0].key, reason)
            told[r[0].key] = waiting[reason]
    for r in came:
        if id(r) not in own:
            told[r[0].key] = waiting[r[4].reason]
    queues.own = kept_rows


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


#: A job's key, the cycle's order of jobs (a tuple: compared without calling Python code).
_key_order = attrgetter("key")


class _Waiting(dict):
    """``waiting_reason`` of each reason string, each built once."""

    def __missing__(self, reason: str) -> str:
        self[reason] = out = f"waiting: {reason}"
        return out


def _where(jobs: Sequence[Job], attr: Callable[[Job], Any], test: Callable[[Any, Any], bool], value: Any) -> list[Job]:
    """The jobs whose ``attr`` passes ``test(attr, value)``, in order (one pass in C)."""
    return list(compress(jobs, map(test, map(attr, jobs), repeat(value))))


def _covered_idle(jobs: Sequence[Job]) -> list[Job]:
    """``covered`` jobs of ``jobs`` (idle, and a device job or a spread one: ``Job.sharing_mode``), in key order."""
    out = [j for j in _where(jobs, _status, is_, JobStatus.IDLE)
           if j.request.device_memory_mb > 0 or (j.spread and j.gpu is None)]
    out.sort(key=_key_order)
    return out


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
