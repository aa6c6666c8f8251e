"""Paper 004's overcommitting scheduler on a live pool (Section 3.3), pure: the planners of the
``overcommit`` mode.

A job that opted in (``+CoSchedOvercommit = true``) may run on an overcommitting node: one whose
startd counts each core M times (``CoSchedMultiplicity = M``, ``NUM_CPUS`` = M x the cores;
docs/admin.md), so HTCondor's own accounting never lets a core hold more than M such jobs.
The node does not pin cores: past one job per core its jobs time-share all of them, so once a
node's jobs outnumber its cores any two of them may share one.

* ``overcommit`` (Section 3.3, step 3): for each job in fair-share order, the nodes where it
  fits; a node where it gets a core of its own comes first (Section 3.2: overcommit only when
  demand exceeds the cores), then one where it time-shares. Among them, the node with the
  smallest predicted degradation: the largest Pr(Ev > t), both ways, of the pairs the job would
  form with what runs or is pinned there (on separate cores, the separate model; time-shared,
  the time-shared one), then the emptiest. A node where a pair would be ill-matched by a model
  that applies (time-shared: both, as the jobs share the node's cache too), or where a
  dangerous program runs (Section 3.3: "avoid nodes on which dangerous jobs are already
  running"), is refused, and a job no node takes waits, its reason naming the pair. The model is the
  cycle's interference guard (``COSCHED_INTERFERENCE``); with it off, or for a program not yet
  profiled, every pair is allowed and the emptiest node wins.
* ``naive-overcommit``: the emptiest node, blind to what runs (the simulator's ``naive``).

The separate model's refusals are also applied by the slot modes' shared mechanics
(``slot_mode.SlotView.plan``: ``narrow`` and ``admit``); this planner adds the time-shared
model and the order, and notes each pin on its node in the guard so the next job sees it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from condor_sched.interference.guard import PLACEMENT, SHARED
from condor_sched.model import Assignment, Job, Plan, Slot, Unplaced
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind


def full(job: Job) -> str:
    """Why a job waits when no node has room for it: HTCondor's accounting is the bound."""
    return (f"no overcommitting node has {job.request.cpus} CPUs and {job.request.memory_mb} MB free (each core "
            "holds at most its node's CoSchedMultiplicity jobs)")


def cores_of(slot: Slot) -> int:
    """The physical cores of an overcommitting slot (its total counts each one M times)."""
    return max(1, int(slot.total.cpus) // max(1, slot.multiplicity))


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """One node a job may take: whether it would time-share a core, the degradation predicted
    (largest Pr(Ev > t) of its pairs there) and the node's load (CPUs held over cores)."""

    slot: Slot
    time_shared: bool
    predicted: float
    load: float


class OvercommitPolicy:
    """Section 3.3: the node of least predicted degradation, a core of its own first."""

    name = "overcommit"
    kind = PolicyKind.OVERCOMMIT
    blind = False

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        guard = None if self.blind else request.interference
        free = {s.name: s for s in request.slots}
        assignments: list[Assignment] = []
        unplaced: list[Unplaced] = []
        spare_cpus = sum(max(0, s.free.cpus) for s in free.values())
        for job in request.idle:
            if job.request.cpus > spare_cpus:   # the pool is full: the rest of the queue waits at no cost
                unplaced.append(Unplaced(job.key, full(job)))
                continue
            name = guard.program_of(job) if guard is not None else None
            best: NodeChoice | None = None
            refused: str | None = None
            for slot in free.values():
                choice, why = self.judge(job, name, slot, guard)
                refused = refused or why
                if choice is not None and (best is None or self.order(choice) < self.order(best)):
                    best = choice
            if best is None:
                unplaced.append(Unplaced(job.key, refused or full(job)))
                continue
            slot = best.slot
            free[slot.name] = slot.with_free(slot.free - job.request)
            spare_cpus -= job.request.cpus
            if guard is not None:   # the next jobs of this cycle see it on its node
                guard.note_pin(job, slot.name)
            assignments.append(Assignment(job.key, slot.name, {"time_shared": best.time_shared}))
        return Plan(self.name, tuple(assignments), tuple(unplaced),
                    {"time_shared": sum(1 for a in assignments if a.details["time_shared"])})

    def order(self, choice: NodeChoice) -> tuple:
        return (choice.time_shared, round(choice.predicted, 6), choice.load, choice.slot.name)

    def judge(self, job: Job, name: str | None, slot: Slot, guard: Any) -> tuple[NodeChoice | None, str | None]:
        """The node as a choice for ``job``, or None and why it is refused (None: it is full)."""
        request = job.request
        if request.cpus > slot.free.cpus or request.memory_mb > slot.free.memory_mb:
            return None, None
        cores = cores_of(slot)
        held = slot.total.cpus - slot.free.cpus
        time_shared = held + request.cpus > cores
        worst = 0.0
        if guard is not None and name is not None:
            placements = (PLACEMENT, SHARED) if time_shared else (PLACEMENT,)
            for who, other, cluster in guard.members.get(slot.machine, ()):
                if cluster == job.key.cluster:
                    continue
                for placement in placements:   # the last one's probabilities are the prediction
                    verdict = guard.verdict(name, other, placement)
                    if verdict.ill_matched:
                        return None, (f"the interference model keeps it off {slot.machine}, where {who} runs "
                                      f"{other}: {verdict.reason}")
                worst = max(worst, verdict.probability_ab, verdict.probability_ba)
        return NodeChoice(slot, time_shared, worst, held / cores), None


class NaiveOvercommitPolicy(OvercommitPolicy):
    """Overcommitting blind to what runs: the emptiest node (the simulator's ``naive``)."""

    name = "naive-overcommit"
    blind = True

    def order(self, choice: NodeChoice) -> tuple:
        return (choice.load, choice.slot.name)
