"""``backfill``: EASY backfill of rigid multi-node jobs on whole nodes (paper 001's static
baseline, Table 1 and Section 4: SLURM's backfill with exclusive nodes).

Jobs are served first come, first served. A job that fits the free nodes starts; the first
one that does not gets a reservation at the earliest time the running jobs' predicted ends
(start + requested time) free enough nodes (the shadow time); a later job may start now only
if it fits the free nodes and either ends (by its requested time) before the shadow time or
uses no more nodes than the reservation leaves spare at it, so backfilled jobs never delay
the reservation. ``sd`` (paper 001's SD-Policy) is this loop with a malleable try after each
failed static try (:func:`easy_backfill`'s ``malleable``).

``slurm-backfill`` is the baseline paper 001 really ran: SLURM's sched/backfill (main
scheduler at events, :func:`slurm_main_schedule`; a backfill pass every ``bf_interval``,
:func:`slurm_backfill_pass`), which reserves for every job it tests, not the head alone.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from condor_sched.model import Plan
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyError, PolicyKind
from condor_sched.modes.mates.cpu_nodes import (
    NodeCluster,
    Role,
    RunningNodeJob,
    Start,
    WaitingJob,
    node_view,
    plan_of,
    shrunk_view,
    started_view,
)

#: A malleable try: (job, predicted static wait s, running jobs now) -> a malleable start or None.
MalleableTry = Callable[[WaitingJob, float, dict], "Start | None"]


class ReleaseProfile:
    """The running jobs' predicted node releases as a step function: when will n nodes be free."""

    def __init__(self, free_nodes: int, running: dict, now_s: float) -> None:
        releases = sorted(r.release(now_s) for r in running.values())
        self.now_s = now_s
        self.free_nodes = free_nodes
        self.times = [t for t, _ in releases]
        self.freed: list[int] = []
        total = 0
        for _, n in releases:
            total += n
            self.freed.append(total)

    def earliest(self, nodes: int) -> tuple[float, int]:
        """(earliest time ``nodes`` nodes are free, nodes spare beyond them then); (inf, 0)
        when the running jobs never free that many."""
        if nodes <= self.free_nodes:
            return self.now_s, self.free_nodes - nodes
        i = bisect.bisect_left(self.freed, nodes - self.free_nodes)
        if i == len(self.freed):
            return math.inf, 0
        at = self.times[i]
        released = self.freed[bisect.bisect_right(self.times, at) - 1]
        return at, self.free_nodes + released - nodes


#: Queued jobs a planning call gives a reservation in the wait map of malleable tries, and
#: offers to them: SLURM's backfill tests at most ``bf_max_job_test`` jobs per pass, 100 by
#: default (paper 001 runs SD-Policy inside SLURM's backfill and states no other value).
MAP_JOBS = 100


class ReservationMap:
    """Free nodes over time (a step function) with the running jobs' predicted releases and
    the reservations of queued jobs, as SLURM's backfill builds it: the map in which paper
    001's Listing 1 reads a job's static wait (Section 3.1)."""

    def __init__(self, free_nodes: int, running: dict, now_s: float) -> None:
        releases = sorted(r.release(now_s) for r in running.values())
        times = [now_s]
        free = [free_nodes]
        for t, n in releases:
            if t == times[-1]:
                free[-1] += n
            else:
                times.append(t)
                free.append(free[-1] + n)
        self.times = np.array(times, dtype=float)
        self.free = np.array(free, dtype=np.int64)
        self._earliest: dict[tuple[int, float], float] = {}  # memo until the next reserve

    def earliest(self, nodes: int, duration_s: float) -> float:
        """The first time ``nodes`` nodes stay free for ``duration_s`` (inf: never)."""
        found = self._earliest.get((nodes, duration_s))
        if found is None:
            found = self._earliest[nodes, duration_s] = self._search(nodes, duration_s)
        return found

    def _search(self, nodes: int, duration_s: float) -> float:
        short = self.free < nodes
        bad_before = np.concatenate(([0], np.cumsum(short)))
        ends = np.searchsorted(self.times, self.times + duration_s, side="left")
        fits = (~short) & (bad_before[ends] - bad_before[np.arange(len(self.times))] == 0)
        found = np.flatnonzero(fits)
        return float(self.times[found[0]]) if len(found) else math.inf

    def reserve(self, start_s: float, duration_s: float, nodes: int) -> None:
        """Take ``nodes`` nodes from ``start_s`` for ``duration_s``."""
        if not math.isfinite(start_s):
            return
        self._earliest.clear()
        for t in (start_s, start_s + duration_s):
            i = int(np.searchsorted(self.times, t, side="left"))
            if i == len(self.times) or self.times[i] != t:
                self.times = np.insert(self.times, i, t)
                self.free = np.insert(self.free, i, self.free[i - 1])
        lo = int(np.searchsorted(self.times, start_s, side="left"))
        hi = int(np.searchsorted(self.times, start_s + duration_s, side="left"))
        self.free[lo:hi] -= nodes


@dataclass(frozen=True, slots=True)
class SlurmBackfillConfig:
    """SLURM's ``sched/backfill`` SchedulerParameters at the defaults of SLURM 17.11
    (slurm.conf(5) of that release; paper 001 names no version and no value, its code being
    of 2018): ``bf_interval`` 30 s between passes, ``bf_window`` 1440 min planned ahead,
    ``bf_max_job_test`` 100 and ``bf_resolution`` 60 s (the same defaults in 17.02 to
    20.11's backfill.c)."""

    interval_s: float = 30.0
    window_s: float = 1440 * 60.0
    max_job_test: int = 100
    resolution_s: float = 60.0

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.window_s > 0 and self.resolution_s > 0 and self.max_job_test >= 1):
            raise PolicyError(f"SLURM backfill parameters must be positive: {self}")


#: SLURM 17.11's defaults (the baseline ``slurm-backfill`` and ``slurm-sd`` run).
SLURM_DEFAULTS = SlurmBackfillConfig()


def slurm_main_schedule(cluster: NodeCluster) -> list[Start]:
    """SLURM's main scheduler, run at every submit and finish (sched_config.html: "jobs are
    evaluated in a strict priority order and once any job ... in a partition is left pending,
    no other jobs in that partition will be scheduled"): static starts in queue order up to
    the first job that does not fit the free nodes. It knows no reservation and makes no
    malleable try (SD-Policy lives in the backfill plugin, paper 001 Section 3.1)."""
    free = list(cluster.free_nodes)
    starts: list[Start] = []
    for job in cluster.queue:
        if job.nodes > cluster.total_nodes:
            continue
        if job.nodes > len(free):
            break
        nodes = tuple(free[-job.nodes:])
        del free[-job.nodes:]
        starts.append(Start(job.key, nodes, cluster.now_s + job.requested_s))
    return starts


def slurm_backfill_pass(cluster: NodeCluster, config: SlurmBackfillConfig = SLURM_DEFAULTS,
                        malleable: MalleableTry | None = None) -> list[Start]:
    """One pass of SLURM's backfill plugin (``_attempt_backfill`` of sched/backfill/backfill.c,
    17.11), read and rewritten here with node counts instead of node bitmaps.

    The map starts from the running jobs' predicted ends (start + time limit). Every queued
    job, in priority order, gets its earliest start in the map, where it holds its nodes for
    its whole requested time. A job that can start now starts (static backfill). Otherwise
    ``malleable`` (paper 001's Listing 1) is tried with that wait. Otherwise the job gets a
    reservation in the map, from its start to start + requested time, both rounded down to
    ``bf_resolution``, unless its start lies beyond ``bf_window`` from now: such a job gets
    none, so later jobs may take its nodes. The map holds at most ``bf_max_job_test`` records
    (1 + the distinct reservation bounds): when it is full the pass stops, and the jobs after
    that point are not tried at all in this pass.
    """
    now = cluster.now_s
    free = list(cluster.free_nodes)
    running: dict = {r.key: r for r in cluster.running}
    starts: list[Start] = []
    wait_map = ReservationMap(len(free), running, now)
    window_end_s = now + config.window_s
    reservations: list[tuple[float, float, int]] = []
    bounds: set[float] = set()
    # The map only loses free nodes during a pass, so a job with at least the nodes and the
    # request of one whose start lay beyond the window starts beyond it too (``beyond_window``
    # keeps the Pareto-least such (nodes, request)): it is skipped without a search unless
    # the malleable try may start it (its ``may_start``, when it has one).
    beyond_window: list[tuple[int, float]] = []
    may_start: Callable[[WaitingJob], bool] = getattr(malleable, "may_start", lambda job: malleable is not None)
    # A malleable try that takes this pass's static starts as mates (``slurm-sd``) hears of each.
    take_new_starts: Callable[[dict], None] = getattr(malleable, "take_new_starts", lambda running: None)
    for job in cluster.queue:
        if job.nodes > cluster.total_nodes:
            continue
        dominated = any(n <= job.nodes and d <= job.requested_s for n, d in beyond_window)
        if dominated and not may_start(job):
            continue
        at = wait_map.earliest(job.nodes, job.requested_s)
        if at <= now and len(free) >= job.nodes:
            nodes = tuple(free[-job.nodes:])
            del free[-job.nodes:]
            start = Start(job.key, nodes, now + job.requested_s)
            starts.append(start)
            running[job.key] = started_view(start, job, now, cluster.cores_per_node)
            take_new_starts(running)
            wait_map.reserve(now, job.requested_s, job.nodes)
            continue
        if malleable is not None:
            start = malleable(job, at - now, running)
            if start is not None:
                starts.append(start)
                for mate in start.mates:
                    running[mate] = shrunk_view(running[mate], start)
                running[job.key] = started_view(start, job, now, cluster.cores_per_node)
                wait_map = ReservationMap(len(free), running, now)
                for reservation in reservations:
                    wait_map.reserve(*reservation)
                continue
        if at > window_end_s:
            if not dominated:
                beyond_window = [(n, d) for n, d in beyond_window if n < job.nodes or d < job.requested_s]
                beyond_window.append((job.nodes, job.requested_s))
            continue
        if 1 + len(bounds) >= config.max_job_test:
            break
        begin_s = max(now, math.floor(at / config.resolution_s) * config.resolution_s)
        end_s = math.floor((at + job.requested_s) / config.resolution_s) * config.resolution_s
        if end_s > begin_s:
            reservations.append((begin_s, end_s - begin_s, job.nodes))
            wait_map.reserve(begin_s, end_s - begin_s, job.nodes)
            bounds.update((begin_s, end_s))
    return starts


def easy_backfill(cluster: NodeCluster, malleable: MalleableTry | None = None, *,
                  static_backfill: bool = True) -> list[Start]:
    """The starts of one planning call (module docstring). With ``malleable``, a job whose
    static try fails is offered to it at once, before the next job (Section 3.1: malleable
    backfill runs right after each job's static trial); a malleable start of the reserved
    job releases its reservation. ``static_backfill=False`` starts jobs statically only in
    order, up to the first that waits (first come, first served: a diagnostic baseline, not
    a registered policy), the malleable tries unchanged.

    The wait a malleable try is given is the job's start in SLURM's backfill map
    (:class:`ReservationMap`): the running jobs' predicted ends, the jobs started in this
    call and a reservation for each earlier queued job that did not start, at its own
    earliest fit. As SLURM's backfill, only the first :data:`MAP_JOBS` jobs that fail their
    static try get a reservation and a malleable try (static tries go on for every job)."""
    now = cluster.now_s
    free = list(cluster.free_nodes)
    running: dict = {r.key: r for r in cluster.running}
    starts: list[Start] = []
    profile: ReleaseProfile | None = None
    wait_map: ReservationMap | None = None
    reservations: list[tuple[float, float, int]] = []
    tested = 0
    shadow_s: float | None = None
    spare = 0
    for job in cluster.queue:
        if job.nodes > cluster.total_nodes:
            continue
        end_s = now + job.requested_s
        fits = len(free) >= job.nodes and (shadow_s is None or (static_backfill and (end_s <= shadow_s
                                                                                  or job.nodes <= spare)))
        if fits:
            nodes = tuple(free[-job.nodes:])
            del free[-job.nodes:]
            start = Start(job.key, nodes, end_s)
            starts.append(start)
            running[job.key] = started_view(start, job, now, cluster.cores_per_node)
            profile = None
            if wait_map is not None:  # a map built later sees it among the running jobs
                wait_map.reserve(now, job.requested_s, job.nodes)
            if shadow_s is not None and end_s > shadow_s:
                spare -= job.nodes
            continue
        if malleable is None:
            if not free:
                break
            if shadow_s is None:
                profile = profile or ReleaseProfile(len(free), running, now)
                shadow_s, spare = profile.earliest(job.nodes)
            continue
        profile = profile or ReleaseProfile(len(free), running, now)
        reserved_here = shadow_s is None
        if reserved_here:
            shadow_s, spare = profile.earliest(job.nodes)
        tested += 1
        if tested > MAP_JOBS:
            continue
        if wait_map is None:
            wait_map = ReservationMap(len(free), running, now)
            for reservation in reservations:
                wait_map.reserve(*reservation)
        at = wait_map.earliest(job.nodes, job.requested_s)
        start = malleable(job, at - now, running)
        if start is None:
            reservations.append((at, job.requested_s, job.nodes))
            wait_map.reserve(at, job.requested_s, job.nodes)
            continue
        starts.append(start)
        for mate in start.mates:
            running[mate] = shrunk_view(running[mate], start)
        running[job.key] = started_view(start, job, now, cluster.cores_per_node)
        profile = wait_map = None
        if reserved_here:
            shadow_s, spare = None, 0
    return starts


def plan_nodes(policy_name: str, request: PlanRequest, planner: Callable[[NodeCluster], list[Start]]) -> Plan:
    """Run a node planner on a PlanRequest of NODE slots (the common interface)."""
    if request.now_s is None:
        raise PolicyError(f"{policy_name} plans against the time of the state: PlanRequest.now_s is missing")
    cluster, left_out = node_view(request.slots, request.running, request.idle, request.now_s)
    return plan_of(policy_name, planner(cluster), request.slots, cluster, left_out)


class EasyBackfillPolicy:
    """EASY backfill on whole nodes (module docstring)."""

    name = "backfill"
    kind = PolicyKind.NODE

    def starts(self, cluster: NodeCluster, settings: PlanSettings) -> list[Start]:
        """The planner on a node view (what ``plan`` and the CPU-job simulator call)."""
        return easy_backfill(cluster)

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        return plan_nodes(self.name, request, lambda cluster: self.starts(cluster, settings))


class SlurmBackfillPolicy:
    """SLURM's scheduling as paper 001 ran it (``sched/backfill`` at SLURM 17.11's defaults):
    the main scheduler at every submit and finish (:func:`slurm_main_schedule`), a backfill
    pass every ``bf_interval`` (:func:`slurm_backfill_pass`). Through ``plan`` (one call, no
    clock) a call is one backfill pass, which starts whatever the main scheduler would."""

    name = "slurm-backfill"
    kind = PolicyKind.NODE
    config = SLURM_DEFAULTS
    #: The simulator runs ``starts`` at these ticks and ``event_starts`` at every event.
    backfill_interval_s = SLURM_DEFAULTS.interval_s

    def starts(self, cluster: NodeCluster, settings: PlanSettings) -> list[Start]:
        """A backfill pass."""
        return slurm_backfill_pass(cluster, self.config)

    def event_starts(self, cluster: NodeCluster, settings: PlanSettings) -> list[Start]:
        """The main scheduler (at a submit or finish)."""
        return slurm_main_schedule(cluster)

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        return plan_nodes(self.name, request, lambda cluster: self.starts(cluster, settings))


__all__ = ["EasyBackfillPolicy", "MalleableTry", "ReleaseProfile", "Role", "RunningNodeJob", "SLURM_DEFAULTS",
           "SlurmBackfillConfig", "SlurmBackfillPolicy", "easy_backfill", "plan_nodes", "slurm_backfill_pass",
           "slurm_main_schedule"]
