"""Rigid multi-node CPU jobs on whole nodes of C cores, as paper 001 schedules them (Section 3).

The records the ``backfill`` and ``sd`` planners see, whatever the source (the CPU-job
simulator, or a :class:`~condor_sched.modes.planning.PlanRequest` of NODE slots through
:func:`node_view`): waiting jobs with a node count and a requested time, running jobs with
their nodes, their role in node sharing and their predicted end, and the free nodes. A job
has one rank per node whose threads use the node's cores (the paper's MPI+OpenMP jobs), so a
mate can shrink to fewer cores per node and a guest can run on the cores it gave up.

The runtime models of Section 3.4 live here too: the planner predicts with one of them and
the simulator uses one as the model of what really happens.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Hashable, Mapping, Sequence

from condor_sched.model import Job, JobKey, RunningJob, Slot, SlotKind

#: Job attribute (ClassAd) naming, comma-separated, the mates whose cores a running guest holds.
GUEST_OF_ATTR = "CoSchedGuestOf"

NodeId = Hashable


class Role(str, enum.Enum):
    """A running job's part in node sharing (Section 3): alone on its nodes, shrunk for a
    guest, or a guest on its mates' nodes."""

    STATIC = "static"
    MATE = "mate"
    GUEST = "guest"


class RuntimeModel(str, enum.Enum):
    """Section 3.4's two runtime models of a job whose nodes hold unequal cores."""

    IDEAL = "ideal"
    WORST = "worst"


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A queued rigid job: ``nodes`` whole nodes for ``requested_s`` (the user's limit)."""

    key: JobKey
    nodes: int
    requested_s: float
    submitted_s: float


@dataclass(frozen=True, slots=True)
class RunningNodeJob:
    """A running job as the planners see it.

    ``predicted_end_s`` is what the scheduler expects from requested times (start + requested
    time + every predicted increase, Section 3.1); ``cores_per_node`` what it holds now on
    each node; ``guest_end_s`` the predicted end of the guest a MATE hosts; ``sole_nodes`` the
    nodes a GUEST holds alone since their mate ended (Listing 3 gives it their cores).
    """

    key: JobKey
    nodes: tuple[NodeId, ...]
    submitted_s: float
    started_s: float
    requested_s: float
    predicted_end_s: float
    cores_per_node: int
    role: Role = Role.STATIC
    guest_end_s: float | None = None
    sole_nodes: int = 0

    @property
    def wait_s(self) -> float:
        return self.started_s - self.submitted_s

    def predicted_slowdown(self, now_s: float) -> float:
        """Eq. 4 without a new increase: (wait + increases + requested) / requested, from
        requested times only (Section 3.2.2, item 1: the only times a scheduler knows)."""
        return (max(self.predicted_end_s, now_s) - self.submitted_s) / self.requested_s

    def release(self, now_s: float) -> tuple[float, int]:
        """(when, how many nodes) this job predictably gives back: a guest only its sole
        nodes, any other job all its nodes once it and its guest end."""
        if self.role is Role.GUEST:
            return max(self.predicted_end_s, now_s), self.sole_nodes
        end = self.predicted_end_s if self.guest_end_s is None else max(self.predicted_end_s, self.guest_end_s)
        return max(end, now_s), len(self.nodes)


@dataclass(frozen=True, slots=True)
class Start:
    """One planned start: a static one on free ``nodes``, or a malleable one on the nodes of
    ``mates`` with ``cores_per_node`` cores of each (the mates give them up and each mate's
    predicted end grows by ``mate_increase_s``)."""

    job: JobKey
    nodes: tuple[NodeId, ...]
    predicted_end_s: float
    mates: tuple[JobKey, ...] = ()
    cores_per_node: int = 0
    mate_increase_s: float = 0.0

    @property
    def malleable(self) -> bool:
        return bool(self.mates)


@dataclass(frozen=True, slots=True)
class NodeCluster:
    """What a planning call sees: the time, the node size, the free nodes, the running jobs
    and the waiting jobs in priority order (submission order: first come, first served)."""

    now_s: float
    cores_per_node: int
    total_nodes: int
    free_nodes: tuple[NodeId, ...]
    running: tuple[RunningNodeJob, ...]
    queue: tuple[WaitingJob, ...]


def progress_rate(shares: Sequence[tuple[int, int]], cores_requested_per_node: int, model: RuntimeModel) -> float:
    """Static seconds of work a job does per second with ``shares`` = (cores it holds, nodes
    holding that many), against ``cores_requested_per_node`` on every node.

    Eq. 5 (ideal) and Eq. 6 (worst case) of paper 001 write the stretched time of a slot t
    as time_t x req_cpus / used_cpus_t; as a rate: the ideal model (a job that rebalances its
    load) progresses as its cores summed over all nodes, the worst case (a statically
    balanced job) as its least-served node. The plain-text copy of the paper swaps the two
    bodies (the min over nodes is printed under "ideal"); we follow the prose, which says the
    worst case is "limited by the less used node".
    """
    total_nodes = sum(n for _, n in shares)
    if model is RuntimeModel.IDEAL:
        return sum(c * n for c, n in shares) / (cores_requested_per_node * total_nodes)
    return min(c for c, n in shares if n > 0) / cores_requested_per_node


def stretched_s(static_s: float, shares: Sequence[tuple[int, int]], cores_requested_per_node: int,
                model: RuntimeModel) -> float:
    """Wall time ``static_s`` seconds of work take at ``shares`` (Eq. 5/6 summed over one slot)."""
    return static_s / progress_rate(shares, cores_requested_per_node, model)


# --- the common interface: a PlanRequest of NODE slots ---------------------------------------

def node_slot_cores(slots: Sequence[Slot]) -> int:
    """C: the cores of the pool's NODE slots (they must all be the same size)."""
    sizes = {s.total.cpus for s in slots if s.kind is SlotKind.NODE}
    if len(sizes) != 1:
        raise ValueError(f"node-sharing policies need NODE slots of one size, got sizes {sorted(sizes)}")
    return sizes.pop()


def waiting_job(job: Job, cores_per_node: int) -> WaitingJob | str:
    """A queued job as whole nodes (its ``request.cpus`` are all its cores), or why it cannot be."""
    if not job.requested_runtime_s or job.requested_runtime_s <= 0:
        return "no requested run time (AllowedExecuteDuration): node sharing needs one"
    return WaitingJob(job.key, max(1, math.ceil(job.request.cpus / cores_per_node)), float(job.requested_runtime_s),
                      float(job.submitted_at_s))


def node_view(slots: Sequence[Slot], running: Sequence[RunningJob], idle: Sequence[Job],
              now_s: float) -> tuple[NodeCluster, dict[JobKey, str]]:
    """A PlanRequest's NODE slots and jobs as a :class:`NodeCluster`, with the idle jobs it
    leaves out and why. A node is free when its slot's free cores are its total; a running
    job's rows (one per node) are grouped by key; a guest names its mates in
    ``GUEST_OF_ATTR``, a mate is a non-guest holding fewer cores than its node has."""
    node_slots = [s for s in slots if s.kind is SlotKind.NODE]
    cores = node_slot_cores(node_slots)
    free = tuple(s.machine for s in node_slots if s.unavailable is None and s.free.cpus >= s.total.cpus)
    rows: dict[JobKey, list[RunningJob]] = {}
    for r in running:
        rows.setdefault(r.job.key, []).append(r)
    guests: dict[JobKey, RunningNodeJob] = {}
    views: dict[JobKey, RunningNodeJob] = {}
    for key, parts in rows.items():
        first = parts[0]
        requested = float(first.requested_runtime_s or first.job.requested_runtime_s or 0) or math.inf
        started = float(first.started_at_s if first.started_at_s is not None else now_s)
        held = first.measured.cpus if first.measured is not None else cores
        mates = str(first.job.attributes.get(GUEST_OF_ATTR, "") or "")
        role = Role.GUEST if mates else (Role.MATE if held < cores else Role.STATIC)
        view = RunningNodeJob(key, tuple(p.node for p in parts), float(first.job.submitted_at_s), started, requested,
                              started + requested, held, role)
        (guests if role is Role.GUEST else views)[key] = view
    by_name = {str(k): k for k in views}
    for key, guest in guests.items():
        named = [by_name[n] for n in str(rows[key][0].job.attributes[GUEST_OF_ATTR]).split(",") if n in by_name]
        for mate in named:
            views[mate] = replace(views[mate], role=Role.MATE, guest_end_s=guest.predicted_end_s)
        alive = sum(len(views[m].nodes) for m in named)
        views[key] = replace(guest, sole_nodes=max(0, len(guest.nodes) - alive))
    queue: list[WaitingJob] = []
    left_out: dict[JobKey, str] = {}
    for job in sorted(idle, key=lambda j: (j.submitted_at_s, j.key)):
        waiting = waiting_job(job, cores)
        if isinstance(waiting, str):
            left_out[job.key] = waiting
        else:
            queue.append(waiting)
    return NodeCluster(now_s, cores, len(node_slots), free, tuple(views.values()), tuple(queue)), left_out


def slot_names_by_node(slots: Sequence[Slot]) -> Mapping[NodeId, str]:
    return {s.machine: s.name for s in slots if s.kind is SlotKind.NODE}


def started_view(start: Start, job: WaitingJob, now_s: float, cores_per_node: int) -> RunningNodeJob:
    """The running record of a job ``start`` starts at ``now_s``."""
    role = Role.GUEST if start.malleable else Role.STATIC
    cores = start.cores_per_node if start.malleable else cores_per_node
    return RunningNodeJob(job.key, start.nodes, job.submitted_s, now_s, job.requested_s, start.predicted_end_s,
                          cores, role)


def shrunk_view(mate: RunningNodeJob, start: Start) -> RunningNodeJob:
    """A mate after ``start`` took ``start.cores_per_node`` of its cores per node: its
    predicted end grows by the increase, and it now hosts the guest until the guest's end."""
    return replace(mate, predicted_end_s=mate.predicted_end_s + start.mate_increase_s,
                   cores_per_node=mate.cores_per_node - start.cores_per_node, role=Role.MATE,
                   guest_end_s=start.predicted_end_s)


def plan_of(policy: str, starts: Sequence[Start], slots: Sequence[Slot], cluster: NodeCluster,
            left_out: Mapping[JobKey, str]):
    """A :class:`~condor_sched.model.Plan`: one assignment per node of each start (a guest's
    details name its mates, cores per node and predicted end), and why the others wait."""
    from condor_sched.model import Assignment, Plan, Unplaced

    names = slot_names_by_node(slots)
    assignments = []
    for s in starts:
        details = {"predicted_end_s": s.predicted_end_s}
        if s.malleable:
            details |= {"mates": ",".join(str(m) for m in s.mates), "cores_per_node": s.cores_per_node,
                        "mate_increase_s": s.mate_increase_s}
        assignments += [Assignment(s.job, names[n], details) for n in s.nodes]
    started = {s.job for s in starts}
    unplaced = [Unplaced(k, why) for k, why in left_out.items()]
    unplaced += [Unplaced(j.key, "waits for nodes" if j.nodes <= cluster.total_nodes
                          else f"needs {j.nodes} nodes, the pool has {cluster.total_nodes}")
                 for j in cluster.queue if j.key not in started]
    stats = {"malleable_starts": sum(s.malleable for s in starts), "starts": len(starts)}
    return Plan(policy, tuple(assignments), tuple(unplaced), stats)
