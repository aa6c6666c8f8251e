"""The spare-capacity mode (paper 003) and its planners by name.

A spare-capacity job (``+CoSchedSpare = true``) is pinned to a node's SPARE slot: an
overlapping slot of the node's cores and memory that HTCondor accounts apart from the primary
slots, so a primary's claim never evicts it and it never takes a primary's room in HTCondor's
books. What it may really use is what the node agent publishes (``Slot.spare``: C - (Q + xi)
of the primaries' CPU and memory use, Algorithm 1 at confidence 0.8) and enforces with cgroup
limits. A node's spare capacity is planned at that confidence level, never at the mean
``C - Q``: the level the primaries leave free at least 80% of the time (docs/spare-capacity.md).

The mode caps each SPARE slot's free amounts at the published spare cores (whole cores) and
memory, less what spare claims and kept pins already hold there. ``plan`` on a snapshot with
no agent's numbers (``PlanSettings.spare_from_job_usage``) takes the running primaries' own
``CpusUsage`` and ``MemoryUsage`` instead: one reading each, no confidence; the live sidecar
never does (those attributes are the job's, and a user can edit them).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from condor_sched.model import USAGE_ATTRS, Job, JobKey, Resources, Slot, SlotKind, SpareCapacity
from condor_sched.modes.interface import ModeContext, ModeJobs, ModePlan
from condor_sched.modes.planning import Policy
from condor_sched.modes.planning import PolicyKind
from condor_sched.modes.slot_mode import SlotMode, SlotView
from condor_sched.modes.spare.planners import SparePackPolicy, SpareSpreadPolicy

def capped(slot: Slot, spare: SpareCapacity) -> Slot:
    """``slot`` with its free amounts capped at ``spare`` less what spare claims and kept pins
    already hold on it (its total less its free)."""
    held = slot.total - slot.free
    cpus = max(0, min(slot.free.cpus, math.floor(spare.cpus + 1e-9) - held.cpus))
    memory = max(0, min(slot.free.memory_mb, spare.memory_mb - held.memory_mb))
    return slot.with_free(Resources(cpus=cpus, memory_mb=memory))


def from_job_usage(slot: Slot, running: Sequence[Job]) -> SpareCapacity:
    """A SPARE slot's spare capacity from the ``CpusUsage`` and ``MemoryUsage`` of the jobs
    running on its node's other slots (snapshots only)."""
    cpus = memory = 0.0
    for job in running:
        usage = job.attributes.get("usage") or {}
        cpus += usage.get(USAGE_ATTRS[0], float(job.request.cpus))
        memory += usage.get(USAGE_ATTRS[1], float(job.request.memory_mb))
    return SpareCapacity(max(0.0, slot.total.cpus - cpus), max(0, int(slot.total.memory_mb - memory)),
                         confidence=0.0, samples=1)


#: A waiting job's reason names at most this many nodes that take no spare-capacity job now.
NODES_NAMED = 3
#: How a job's reason begins once its node had it vacated; kept until it runs again.
VACATED_WORDS = "vacated from "


def eviction(job: Job, slot: Slot) -> str | None:
    """Why ``slot``'s node agent had the startd vacate idle ``job``: its request while the
    claim lasts, or the record kept after the claim ended when made during the job's last run
    (at or after ``JobCurrentStartDate``: never a request older than a later start)."""
    spare = slot.spare
    if spare is None or not job.is_idle:
        return None
    why = spare.evictions.get(job.key.job_id)
    past = spare.vacated.get(job.key.job_id) if why is None else None
    if past is not None and past[0] >= (job.started_at_s or 0):
        why = past[1]
    return why


class SpareView(SlotView):
    """The slot mode's view with each SPARE slot capped at its node's spare capacity; a slot
    whose node takes no spare-capacity job now is left out, and the waiting jobs told why."""

    def __init__(self, mode: SlotMode, jobs: ModeJobs, context: ModeContext) -> None:
        super().__init__(mode, jobs, context)
        self.left_out: dict[str, str] = {}
        self.vacated: dict[JobKey, str] = {}

    def pin_problem(self, job: Job, slot: Slot) -> str | None:
        """An idle job its node's agent asked the startd to vacate (the primaries needed the
        room back) is unpinned, and told why until it runs again."""
        why = eviction(job, slot)
        if why is None:
            return None
        self.vacated[job.key] = told = f"{VACATED_WORDS}{slot.machine}: {why}"
        return told

    def offered(self, jobs: Sequence[Job], free: Sequence[Slot]) -> tuple[tuple[Job, ...], tuple[Slot, ...]]:
        ordered, slots = super().offered(jobs, free)
        from_usage = self.context.settings.spare_from_job_usage
        machines = {s.machine for s in slots}
        primaries: dict[str, list[Job]] = {}
        if from_usage:
            kinds = {s.name: s.kind for s in self.context.state.slots}
            for run in self.context.running:
                if run.node in machines and kinds.get(run.slot) is not SlotKind.SPARE:
                    primaries.setdefault(run.node, []).append(run.job)
        out = []
        for slot in slots:
            spare = slot.spare
            if spare is None and from_usage:
                spare = from_job_usage(slot, primaries.get(slot.machine, ()))
            if spare is None or spare.problem is not None:
                self.left_out[slot.machine] = spare.problem if spare else "its node agent publishes no spare capacity"
                continue
            out.append(capped(slot, spare))
        return ordered, tuple(out)

    def plan(self, planner: Policy, jobs: list[Job], refused: dict[JobKey, str]) -> ModePlan:
        planned = super().plan(planner, jobs, refused)
        for job in jobs:   # told in an earlier cycle, and not run since (a run is told "running on")
            if job.key not in self.vacated and (job.pin_reason or "").startswith(VACATED_WORDS):
                self.vacated[job.key] = job.pin_reason.split("; now ", 1)[0]
        if not self.left_out and not self.vacated:
            return planned
        named = sorted(self.left_out.items())
        note = ("; " + ", ".join(f"{m}: {why}" for m, why in named[:NODES_NAMED]) + (
            f" and {len(named) - NODES_NAMED} more nodes" if len(named) > NODES_NAMED else "")) if named else ""
        reasons = {k: (why + note if why.startswith("waiting: no node") else why) for k, why in planned.reasons.items()}
        for key, why in self.vacated.items():
            if key in reasons:
                reasons[key] = f"{why}; now {reasons[key]}"
        return replace(planned, reasons=reasons)


class SpareMode(SlotMode):
    """Paper 003's spare capacity: a job with ``+CoSchedSpare = true`` is pinned to a SPARE slot
    within what its node publishes as spare."""

    name = "spare"
    paper = "paper 003 (Sections III-A, III-B): bootstrap-estimated spare capacity under cgroup limits"
    planners = {"spare-spread": SpareSpreadPolicy, "spare-pack": SparePackPolicy}
    default_planner = "spare-spread"
    policy_kind = PolicyKind.SPARE
    knob = "COSCHED_SPARE_POLICY"
    slot_kind = SlotKind.SPARE
    slot_words = "spare slot"
    slot_kinds = frozenset({SlotKind.SPARE})

    def refusal(self, slot: Slot, reason: str) -> str:
        return f"{slot.machine} refused it as a spare-capacity job: {reason}"

    def view(self, jobs: ModeJobs, context: ModeContext) -> SpareView:
        return SpareView(self, jobs, context)


SPARE = SpareMode()
