"""What a cycle starts from and decides: its memory (``CycleMemory``), its policies and
knobs (``CycleConfig``) and its decision (``CycleDecision``: pins kept, unpins, enrollments,
holds, new pins, reasons, the mates' and GPU shares' parts), with the documented
``plan --json`` object (:meth:`CycleDecision.to_json`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

from condor_sched.cycle_cache import PlanCache
from condor_sched.model import Assignment, JobKey, Plan, PoolState, Skipped, Unplaced
from condor_sched.modes.gpus.fleet_policy import GpuPolicy
from condor_sched.modes.gpus.live import GpuSharingDecision, gpu_pin_details
from condor_sched.modes.mates.live import NodeSharingDecision
from condor_sched.modes.planning import PlanSettings, Policy, PolicyKind
from condor_sched.modes.registry import get_policy, gpu_policy, gpu_policy_names

if TYPE_CHECKING:
    from condor_sched.profiles import ProfileStore
    from condor_sched.settings import SidecarSettings


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
    #: Node sharing of malleable jobs (paper 001's ``sd``, live: ``condor_sched.modes.mates.live``);
    #: None: COSCHED_NODE_POLICY = none.
    node_policy: Policy | None = None
    #: GPU sharing (issue 13, ``condor_sched.modes.gpus.live``); None: COSCHED_GPU_POLICY = none.
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
    #: Guests and mates of malleable jobs (``condor_sched.modes.mates.live``).
    node_sharing: NodeSharingDecision = field(default_factory=NodeSharingDecision)
    #: GPU jobs' pins (``condor_sched.modes.gpus.live``).
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


def pin_reason(pin: Pin, cycle: int) -> str:
    return f"pinned to {pin.slot} in cycle {cycle}; waiting for the negotiator to match it there"


def waiting_reason(unplaced: Unplaced) -> str:
    return f"waiting: {unplaced.reason}"
