"""Rigid multi-node CPU jobs on whole nodes, malleable when shared (paper 001's simulations).

An SWF log maps onto whole nodes of C cores (:func:`read_swf_nodes`): a job asking for P
processors takes ceil(P / C) nodes, runs one rank per node whose threads use the node's
cores, and states a requested time apart from its run time. A job's run time is work in
static seconds; it drains at the rate its cores give it under a runtime model of Section
3.4 (:func:`~condor_sched.modes.mates.cpu_nodes.progress_rate`): a mate shrunk to C - k cores
drains at (C - k) / C, a guest at k / C; when a mate ends first, the guest takes that mate's
nodes whole (Listing 3) and, unbalanced, drains at the ideal model's mean over its nodes or
the worst case's least-served node. Every change of cores re-times the jobs it touches.

Why its own event loop rather than :class:`~condor_sched.simulate.engine.Simulation`:
``backfill`` and ``sd`` plan at every submit and every finish, as SLURM's backfill does
(paper 001 runs them in the BSC SLURM simulator), not at negotiation cycles, and they need
the malleable execution above, which the cycle engine's device and socket models do not
have. Each planning call builds the same :class:`~condor_sched.modes.mates.cpu_nodes.NodeCluster`
the policies' ``plan`` builds from a PlanRequest and calls the same planner function, so the
simulator and the common interface share the decision code. Events at one instant are
applied together (finishes, then arrivals) and planned once: ``--cycle-s`` plays no part,
event-driven planning being the limit of a negotiation interval going to zero.

A policy with a ``backfill_interval_s`` (``slurm-backfill``, ``slurm-sd``) is run as SLURM
runs sched/backfill: its ``event_starts`` (the main scheduler) at every submit and finish,
its ``starts`` (a backfill pass) at ticks every ``backfill_interval_s`` from the trace's
start, and, as SLURM's backfill thread (``_more_work``), only at a tick after some job was
submitted, ended or started since the last pass. A tick at the instant of other events runs
after the main scheduler.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from condor_sched.model import JobKey, Skipped
from condor_sched.modes.planning import PlanSettings, PolicyError, PolicyKind
from condor_sched.modes.registry import get_policy, policy_names
from condor_sched.modes.mates.cpu_nodes import (
    NodeCluster,
    Role,
    RunningNodeJob,
    RuntimeModel,
    Start,
    WaitingJob,
    progress_rate,
    shrunk_view,
)
from condor_sched.modes.mates.sd import SD_POLICIES
from condor_sched.simulate.workloads import MAX_WORKLOAD_JOBS, SIM_SCHEDD, WorkloadError, swf_jobs

Planner = Callable[[NodeCluster], Sequence[Start]]

#: Work (static seconds) below which a job counts as done (float rounding of re-timed runs).
DONE_EPS_S = 1e-6


@dataclass(frozen=True, slots=True)
class NodeJob:
    """One trace job: ``nodes`` whole nodes, its run time alone on them (``runtime_s``), the
    time the user requested and its arrival."""

    index: int
    nodes: int
    runtime_s: float
    requested_s: float
    arrival_s: float

    @property
    def key(self) -> JobKey:
        return JobKey(SIM_SCHEDD, 1, self.index)


@dataclass(frozen=True, slots=True)
class NodeWorkload:
    name: str
    jobs: tuple[NodeJob, ...]
    skipped: tuple[Skipped, ...] = ()


def read_swf_nodes(path: str | Path, cores_per_node: int, limit: int | None = None) -> NodeWorkload:
    """An SWF log as whole-node CPU jobs: nodes = ceil(requested processors (field 8, else
    5) / C); run time field 4 (else 9); requested time field 9 (else the run time); arrival
    = submit time minus the first job's. Jobs are not killed at their requested time (a run
    longer than requested is the trace's, and the planners then predict it ends now)."""
    if cores_per_node < 1:
        raise WorkloadError(f"cores per node must be at least 1, got {cores_per_node}")
    path = Path(path)
    wanted = MAX_WORKLOAD_JOBS if limit is None else min(limit, MAX_WORKLOAD_JOBS)
    skipped: list[Skipped] = []
    jobs: list[NodeJob] = []
    for _, values, runtime, processors, arrival in swf_jobs(path, skipped):
        requested = values["requested_time"] if values["requested_time"] > 0 else runtime
        jobs.append(NodeJob(len(jobs), math.ceil(processors / cores_per_node), runtime, requested, arrival))
        if len(jobs) >= wanted:
            break
    if not jobs:
        raise WorkloadError(f"{path}: no usable job")
    return NodeWorkload(str(path), tuple(jobs), tuple(skipped))


@dataclass(slots=True)
class _Run:
    """A running job's mutable state (the engine's, not the planners')."""

    job: NodeJob
    nodes: tuple[int, ...]
    started_s: float
    view: RunningNodeJob
    work_left_s: float
    rate: float = 1.0
    since_s: float = 0.0
    version: int = 0
    mates: list[int] = field(default_factory=list)
    guest: int | None = None
    ended_mate_nodes: int = 0
    guest_cores: int = 0


@dataclass(frozen=True, slots=True)
class NodeRunResult:
    """Per-job outcome and the run's counts."""

    finish_s: dict[int, float]
    started_s: dict[int, float]
    malleable_jobs: int
    mate_jobs: int
    planning_calls: int


class NodeSimulation:
    """Event-driven simulation of ``jobs`` on ``nodes`` nodes of ``cores_per_node`` cores."""

    def __init__(self, jobs: Sequence[NodeJob], nodes: int, cores_per_node: int, planner: Planner,
                 runtime_model: RuntimeModel = RuntimeModel.IDEAL, *, event_planner: Planner | None = None,
                 backfill_interval_s: float | None = None) -> None:
        """``planner`` runs at every submit and finish; with ``backfill_interval_s``, it runs
        at the backfill ticks instead and ``event_planner`` at submits and finishes (module
        docstring)."""
        too_big = [j for j in jobs if j.nodes > nodes]
        if too_big:
            raise ValueError(f"job {too_big[0].index} needs {too_big[0].nodes} nodes, the pool has {nodes}"
                             f" ({len(too_big)} such jobs)")
        self.jobs = {j.index: j for j in jobs}
        self.nodes = nodes
        self.cores = cores_per_node
        self.planner = planner
        self.event_planner = event_planner
        self.interval_s = backfill_interval_s
        if backfill_interval_s is not None and (event_planner is None or not backfill_interval_s > 0):
            raise ValueError("a backfill interval needs a positive length and an event planner")
        self.tick_pending = False
        self.changed_since_pass = False
        self.model = runtime_model
        self.free: list[int] = list(range(nodes - 1, -1, -1))
        self.queue: dict[int, WaitingJob] = {}
        self.running: dict[int, _Run] = {}
        self.events: list[tuple[float, int, int, int]] = []  # (time, 0 finish / 1 arrival / 2 tick, job, version)
        self.finish_s: dict[int, float] = {}
        self.started_s: dict[int, float] = {}
        self.guests: set[int] = set()
        self.mates: set[int] = set()
        self.calls = 0
        for j in jobs:
            heapq.heappush(self.events, (j.arrival_s, 1, j.index, 0))

    def run(self) -> NodeRunResult:
        while self.events:
            now = self.events[0][0]
            changed = tick = False
            while self.events and self.events[0][0] == now:
                _, kind, index, version = heapq.heappop(self.events)
                if kind == 1:
                    j = self.jobs[index]
                    self.queue[index] = WaitingJob(j.key, j.nodes, j.requested_s, j.arrival_s)
                    changed = True
                elif kind == 2:
                    tick, self.tick_pending = True, False
                elif index in self.running and self.running[index].version == version:
                    self._finish(index, now)
                    changed = True
            if self.interval_s is None:
                if self.queue:
                    self._plan(now, self.planner)
                continue
            self.changed_since_pass |= changed
            if changed and self.queue:
                self._plan(now, self.event_planner)
            if tick and self.changed_since_pass and self.queue:
                self.changed_since_pass = self._plan(now, self.planner) > 0
            if self.queue and self.changed_since_pass and not self.tick_pending:
                next_tick_s = math.ceil(now / self.interval_s) * self.interval_s
                if tick or next_tick_s < now:
                    next_tick_s = (math.floor(now / self.interval_s) + 1) * self.interval_s
                heapq.heappush(self.events, (next_tick_s, 2, -1, 0))
                self.tick_pending = True
        if self.queue:
            raise RuntimeError(f"{len(self.queue)} jobs never started")
        return NodeRunResult(self.finish_s, self.started_s, len(self.guests), len(self.mates), self.calls)

    # --- planning ---------------------------------------------------------------------

    def _plan(self, now: float, planner: Planner) -> int:
        """One planning call; the number of jobs it started."""
        self.calls += 1
        cluster = NodeCluster(now, self.cores, self.nodes, tuple(self.free),
                              tuple(r.view for r in self.running.values()), tuple(self.queue.values()))
        starts = planner(cluster)
        for start in starts:
            self._start(start, now)
        return len(starts)

    def _start(self, start: Start, now: float) -> None:
        index = start.job.proc
        job = self.jobs[index]
        del self.queue[index]
        self.started_s[index] = now
        nodes = tuple(int(n) for n in start.nodes)
        if not start.malleable:
            taken = set(nodes)
            if len(taken) != job.nodes or not taken <= set(self.free):
                raise RuntimeError(f"job {index}: static start on nodes that are not free: {sorted(taken)}")
            self.free = [n for n in self.free if n not in taken]
            view = RunningNodeJob(job.key, nodes, job.arrival_s, now, job.requested_s, start.predicted_end_s,
                                  self.cores)
            run = self.running[index] = _Run(job, nodes, now, view, job.runtime_s, since_s=now)
            self._retime(run, now, 1.0)
            return
        mates = [self.running[m.proc] for m in start.mates]
        if sum(len(m.nodes) for m in mates) != job.nodes or any(m.guest is not None or m.mates for m in mates):
            raise RuntimeError(f"job {index}: malleable start on mates that cannot host it")
        view = RunningNodeJob(job.key, nodes, job.arrival_s, now, job.requested_s, start.predicted_end_s,
                              start.cores_per_node, Role.GUEST)
        guest = self.running[index] = _Run(job, nodes, now, view, job.runtime_s, since_s=now,
                                           mates=[m.job.index for m in mates], guest_cores=start.cores_per_node)
        self.guests.add(index)
        for mate in mates:
            self.mates.add(mate.job.index)
            mate.guest = index
            mate.guest_cores = start.cores_per_node
            mate.view = shrunk_view(mate.view, start)
            self._retime(mate, now, (self.cores - start.cores_per_node) / self.cores)
        self._retime(guest, now, self._guest_rate(guest))

    # --- execution ----------------------------------------------------------------------

    def _guest_rate(self, guest: _Run) -> float:
        alive = sum(len(self.running[m].nodes) for m in guest.mates if m in self.running)
        shares = [(guest.guest_cores, alive), (self.cores, len(guest.nodes) - alive)]
        return progress_rate([s for s in shares if s[1] > 0], self.cores, self.model)

    def _retime(self, run: _Run, now: float, rate: float) -> None:
        """Drain ``run``'s work at its old rate up to ``now``, then go on at ``rate``."""
        run.work_left_s -= (now - run.since_s) * run.rate
        run.since_s, run.rate = now, rate
        run.version += 1
        end = now + max(0.0, run.work_left_s) / rate
        heapq.heappush(self.events, (end, 0, run.job.index, run.version))

    def _finish(self, index: int, now: float) -> None:
        run = self.running.pop(index)
        self.finish_s[index] = now
        released: list[int] = []
        if run.view.role is Role.GUEST:
            released += [n for m in run.mates if m not in self.running
                         for n in self._nodes_of_ended(run, m)]
            for m in run.mates:
                mate = self.running.get(m)
                if mate is None:
                    continue
                unspent = max(0.0, run.view.predicted_end_s - now) * run.guest_cores / self.cores
                mate.view = replace(mate.view, predicted_end_s=mate.view.predicted_end_s - unspent,
                                    cores_per_node=self.cores, role=Role.STATIC, guest_end_s=None)
                mate.guest = None
                self._retime(mate, now, 1.0)
        elif run.guest is not None and run.guest in self.running:
            guest = self.running[run.guest]
            guest.ended_mate_nodes += len(run.nodes)
            guest.view = replace(guest.view, sole_nodes=guest.ended_mate_nodes)
            self._retime(guest, now, self._guest_rate(guest))
        else:
            released += run.nodes
        self.free += released

    def _nodes_of_ended(self, guest: _Run, mate_index: int) -> tuple[int, ...]:
        """The nodes of a guest's mate that ended before it (the guest held them alone)."""
        offset = 0
        for m in guest.mates:
            size = self.jobs[m].nodes
            if m == mate_index:
                return guest.nodes[offset:offset + size]
            offset += size
        return ()


def node_metrics(jobs: Sequence[NodeJob], result: NodeRunResult) -> dict[str, float | int]:
    """Paper 001's metrics (Section 4): makespan (last end - first arrival), mean response
    time (end - submit, our ``mean_turnaround_s``), mean slowdown (response / static run
    time), and the jobs that ran malleably (guests) and served as mates."""
    first = min(j.arrival_s for j in jobs)
    responses = [result.finish_s[j.index] - j.arrival_s for j in jobs]
    waits = [result.started_s[j.index] - j.arrival_s for j in jobs]
    return {
        "jobs": len(jobs),
        "makespan_s": max(result.finish_s.values()) - first,
        "mean_turnaround_s": sum(responses) / len(jobs),
        "mean_wait_s": sum(waits) / len(jobs),
        "mean_slowdown": sum(r / j.runtime_s for r, j in zip(responses, jobs)) / len(jobs),
        "malleable_jobs": result.malleable_jobs,
        "mate_jobs": result.mate_jobs,
        "malleable_fraction": result.malleable_jobs / len(jobs),
        "planning_calls": result.planning_calls,
    }


def simulate_nodes(jobs: Sequence[NodeJob], nodes: int, cores_per_node: int, planner: Planner,
                   runtime_model: RuntimeModel = RuntimeModel.IDEAL, *, event_planner: Planner | None = None,
                   backfill_interval_s: float | None = None) -> dict[str, float | int]:
    """Run ``jobs`` under ``planner`` (and ``event_planner``, :class:`NodeSimulation`) and
    return :func:`node_metrics`."""
    result = NodeSimulation(jobs, nodes, cores_per_node, planner, runtime_model, event_planner=event_planner,
                            backfill_interval_s=backfill_interval_s).run()
    return node_metrics(jobs, result)


def simulate_node_policy(workload: NodeWorkload, nodes: int, cores_per_node: int, policy: str,
                         settings: PlanSettings, runtime_model: RuntimeModel) -> dict[str, object]:
    """The ``simulate --cores-per-node`` report: a registered NODE policy, found by name, on
    ``workload``; its metrics with the run's settings."""
    found = get_policy(policy)
    if found.kind is not PolicyKind.NODE:
        raise PolicyError(f"policy {policy!r} does not plan whole-node CPU jobs; use one of "
                          f"{', '.join(policy_names(PolicyKind.NODE))}")
    interval_s = getattr(found, "backfill_interval_s", None)
    event_planner = None if interval_s is None else (lambda c: found.event_starts(c, settings))
    metrics = simulate_nodes(workload.jobs, nodes, cores_per_node, lambda c: found.starts(c, settings), runtime_model,
                             event_planner=event_planner, backfill_interval_s=interval_s)
    report: dict[str, object] = {"workload": workload.name, "nodes": nodes, "cores_per_node": cores_per_node,
                                 "policy": policy, "runtime_model": runtime_model.value,
                                 "skipped_jobs": len(workload.skipped), **metrics}
    if interval_s is not None:
        config = found.config
        report |= {"bf_interval_s": config.interval_s, "bf_window_s": config.window_s,
                   "bf_max_job_test": config.max_job_test, "bf_resolution_s": config.resolution_s}
    if policy in SD_POLICIES:
        report |= {"max_slowdown": max_slowdown_label(settings.sd_max_slowdown),
                   "max_mates": settings.sd_max_mates, "sharing_factor": settings.sd_sharing_factor}
    return report


def max_slowdown_label(value: float | None) -> str | float:
    """MAX_SLOWDOWN as the CLI writes it: a number, ``unbounded`` or ``dynamic`` (DynAVGSD)."""
    if value is None:
        return "dynamic"
    return "unbounded" if math.isinf(value) else value


def parse_max_slowdown(text: str) -> float | None:
    """The inverse of :func:`max_slowdown_label`; a bad value raises ValueError."""
    word = text.strip().lower()
    if word == "dynamic":
        return None
    if word in ("unbounded", "inf", "infinite"):
        return math.inf
    value = float(word)
    if not value > 0 or math.isnan(value):
        raise ValueError(f"--max-slowdown must be a positive number, 'unbounded' or 'dynamic', got {text!r}")
    return value
