"""The cycle's incremental caches: what a cycle derived from the queue, kept for the next
one so that a 50k-job cycle follows only what changed (issue 11). A cache never changes a
decision, only its cost (``tests/unit/test_incremental_cycle.py`` checks the decisions
against planning the whole queue afresh).

``CoveredJobs``: the covered idle jobs of the last state, patched with the records that came
and went. ``ShapeQueues``: a bounded device plan's jobs per demand shape
(``modes/devices/bounded.py``). ``PlanCache``: both, and what each job record gave.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_, itemgetter, not_
from typing import Any, Callable, Iterable, Mapping, Sequence

from condor_sched.device_kinds import DEFAULT_KIND
from condor_sched.model import Job, JobKey, JobStatus, Unplaced
from condor_sched.modes.devices.capacity import Capacity, demand
from condor_sched.modes.interface import ModeJobs, SharingMode
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.slot_mode import Waiting

_status = attrgetter("status")
#: A PlanCache row's job record, whether a device plan considers it, FIFO order, demand
#: shape and last ``Unplaced``.
_record, _for_device, _fifo, _shape, _last_unplaced = (itemgetter(i) for i in range(5))
_NOT_YET_UNPLACED = Unplaced(JobKey("", 0, 0), "")


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
    waiting: Waiting = field(default_factory=Waiting)
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


def covered(job: Job) -> bool:
    """The idle jobs the device and spread policies plan (``Job.sharing_mode`` devices or
    spread); GPU and node sharing cover theirs apart."""
    return job.is_idle and (job.uses_device or job.wants_spread)


#: A job's key, the cycle's order of jobs (a tuple: compared without calling Python code).
_key_order = attrgetter("key")



def _where(jobs: Sequence[Job], attr: Callable[[Job], Any], test: Callable[[Any, Any], bool], value: Any) -> list[Job]:
    """The jobs whose ``attr`` passes ``test(attr, value)``, in order (one pass in C)."""
    return list(compress(jobs, map(test, map(attr, jobs), repeat(value))))


def _covered_idle(jobs: Sequence[Job]) -> list[Job]:
    """``covered`` jobs of ``jobs`` (idle, and a device job or a spread one: ``Job.sharing_mode``), in key order."""
    out = [j for j in _where(jobs, _status, is_, JobStatus.IDLE)
           if j.request.device_memory_mb > 0 or (j.spread and j.gpu is None)]
    out.sort(key=_key_order)
    return out


_has_pin, _spread = attrgetter("has_pin_clause"), attrgetter("spread")


def _is_device(job: Job) -> bool:
    return job.request.device_memory_mb > 0


def _pinned(jobs: Sequence[Job]) -> list[Job]:
    return [j for j in jobs if j.pinned_slot is not None or j.pinned_cycle is not None]


@dataclass(frozen=True, slots=True)
class CycleJobs:
    """Each active mode's jobs (``by_mode``), each aged job's first-seen cycle, and how many
    covered idle jobs the cycle saw."""

    by_mode: dict[str, ModeJobs]
    first_seen: dict[JobKey, int]
    seen: int


def follow_jobs(jobs: Sequence[Job], modes: Sequence[SharingMode], remembered: Mapping[JobKey, int], cycle: int,
                cache: PlanCache | None, mode_of: Callable[[Job], SharingMode | None] | None) -> CycleJobs:
    """Split the state's ``jobs`` among the active ``modes``. The slot modes' idle jobs (the
    covered ones: device and spread, ``covered``) come in key order and keep their first-seen
    cycles (``remembered``'s, else this ``cycle``); with ``cache`` they follow only the records
    that came and went (``CoveredJobs``). ``mode_of``: the registry's rule when a mode beyond the
    built-in ones is registered (None: ``Job.sharing_mode`` decides, the fast path)."""
    view: CoveredJobs | None = None
    if cache is not None:
        if cache.covered is None:
            cache.covered = CoveredJobs()
        view = cache.covered
        view.update(jobs)
        cache.whole_unplaced = None
        idle = view.jobs  # the same order from every source; never changed here
        first_seen = view.first_seen_map(remembered, cycle)
        pinned = sorted(view.pinned.values(), key=_key_order)
        view.first_seen = first_seen
    else:
        idle = _covered_idle(jobs)  # the same order from every source
        keys = list(map(_key_order, idle))
        first_seen = dict(zip(keys, map(remembered.get, keys, repeat(cycle))))
        pinned = _pinned(idle)
    lacking = view is None or view.counts["no_pin_clause"] > 0
    # What the covered view knows of its jobs' submitters holds for the device and spread
    # modes' jobs only; any other mode finds out from its own.
    key_ordered = view is not None and len(view.distinct("submitter")) <= 1 and len(view.distinct("prio")) <= 1
    by_mode: dict[str, ModeJobs] = {}
    for mode in modes:
        if mode_of is not None:
            own = [j for j in (idle if mode.ages else jobs) if mode_of(j) is mode]
            mine = own if mode.ages else [j for j in own if j.status is JobStatus.IDLE]
            mine.sort(key=_key_order)
            by_mode[mode.name] = ModeJobs(own, mine, _pinned(mine), lacking)
        elif mode.name == "devices":  # covered jobs are device jobs or spread ones
            mine = idle if view is not None and not view.counts["not_device"] else list(filter(_is_device, idle))
            by_mode[mode.name] = ModeJobs(mine, mine, [j for j in pinned if _is_device(j)], lacking, key_ordered)
        elif mode.name == "spread":
            mine = [] if view is not None and not view.counts["spread_only"] else \
                [j for j in compress(idle, map(_spread, idle)) if not _is_device(j)]
            by_mode[mode.name] = ModeJobs(mine, mine, [j for j in pinned if not _is_device(j)], lacking, key_ordered)
        else:
            own = [j for j in jobs if j.sharing_mode == mode.name]
            mine = sorted((j for j in own if j.status is JobStatus.IDLE), key=_key_order)
            by_mode[mode.name] = ModeJobs(own, mine, _pinned(mine))
    return CycleJobs(by_mode, first_seen, len(idle))
