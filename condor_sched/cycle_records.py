"""What a cycle starts from and decides: its memory (``CycleMemory``), its modes' planners and
knobs (``CycleConfig``) and its decision (``CycleDecision``: each mode's part, and what the
cycle does with ads that do not read), with the documented ``plan --json`` object
(:meth:`CycleDecision.to_json`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

from condor_sched.cycle_cache import PlanCache
from condor_sched.model import Assignment, JobKey, Plan, PoolState, Skipped, Unplaced
from condor_sched.modes.gpus.fleet_policy import GpuPolicy
from condor_sched.modes.gpus.live import GpuSharingDecision, gpu_pin_details
from condor_sched.modes.interface import Enroll, Hold, ModeDecision, SharingMode, Unpin
from condor_sched.modes.mates.live import NodeSharingDecision
from condor_sched.modes.planning import PlanSettings, Policy
from condor_sched.modes.registry import get_policy, gpu_policy, gpu_policy_names, modes
from condor_sched.modes.slot_mode import Pin, pin_reason, waiting_reason

if TYPE_CHECKING:
    from condor_sched.profiles import ProfileStore
    from condor_sched.settings import SidecarSettings

__all__ = ["CycleConfig", "CycleDecision", "CycleMemory", "Enroll", "Hold", "Pin", "Unpin", "pin_reason",
           "waiting_reason"]

#: The built-in modes' planners in ``CycleConfig``, by the names its knobs and callers use.
_PLANNER_FIELDS = {"devices": "device_policy", "spread": "spread_policy", "mates": "node_policy", "gpus": "gpu_policy",
                   "spare": "spare_policy", "overcommit": "overcommit_policy"}
#: Modes whose part ``plan --json`` shows under keys of their own (``gpu_*``, ``guest*``).
_OWN_JSON_KEYS = ("mates", "gpus")


@dataclass(frozen=True, slots=True)
class CycleMemory:
    """What a cycle remembers of earlier ones: this cycle's number and the cycle each covered
    idle job was first seen (its age drives the aging rules), and ``cache``, what earlier
    cycles derived from the jobs (it saves work, never changes the decision; None: start
    empty). A source without memory (``plan``, a sidecar just started) uses :meth:`fresh`."""

    cycle: int
    first_seen: Mapping[JobKey, int] = field(default_factory=dict)
    cache: PlanCache | None = field(default=None, compare=False, repr=False)
    #: The numbers of the latest cycles that followed a new negotiation cycle, oldest first
    #: (``unpin_age_cycles`` of them at most): a pin ages by these only, so a pin made while
    #: no negotiator ran is not taken back the moment one runs again. None: every cycle
    #: follows one (``plan``, the simulator, a sidecar not following the negotiator).
    negotiated: tuple[int, ...] | None = None
    #: What idle jobs run (paper 004's guard): the sha256 a node agent last read for a running
    #: job of each (schedd, Owner, Cmd); empty while COSCHED_INTERFERENCE is off.
    exes: Mapping[tuple[str, str, str], str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def fresh(cls, state: PoolState) -> CycleMemory:
        """The memory a snapshot holds: cycle numbers go on after the newest pin's
        ``CoSchedPinCycle``; no job was seen before (every age is 0)."""
        return cls(1 + max((j.pinned_cycle or 0 for j in state.jobs), default=0))


@dataclass(frozen=True, slots=True)
class CycleConfig:
    """The planner of each mode and the knobs of a cycle: ``device_policy``, ``spread_policy``
    (None: spread jobs are left to HTCondor, COSCHED_SPREAD_POLICY = none), ``node_policy``
    (the mates' ``sd``, COSCHED_NODE_POLICY) and ``gpu_policy`` (COSCHED_GPU_POLICY) for the
    built-in modes, ``planners`` for any other registered mode (by mode name; a mode not
    named there plans with its ``default_planner``, None turns it off)."""

    device_policy: Policy
    spread_policy: Policy | None
    plan: PlanSettings = PlanSettings()
    unpin_age_cycles: int = 3
    profiles: ProfileStore | None = None
    #: Plan ``BOUNDED_POLICIES`` on the jobs that can matter only (same decision, less work);
    #: False: every policy sees the whole queue (the baseline ``scripts/bench_simulate`` times).
    bounded: bool = True
    node_policy: Policy | None = None
    gpu_policy: GpuPolicy | None = None
    planners: Mapping[str, Any] = field(default_factory=dict)
    #: Spare-capacity jobs (paper 003; COSCHED_SPARE_POLICY); None: they wait.
    spare_policy: Policy | None = None
    #: Jobs that may time-share a core (paper 004; COSCHED_OVERCOMMIT_POLICY); None: they wait.
    overcommit_policy: Policy | None = None
    #: COSCHED_INTERFERENCE (paper 004, ``interference/guard.py``): pairs the model predicts
    #: ill-matched are kept off one node; None: off.
    interference: Any = None

    @classmethod
    def from_settings(cls, settings: SidecarSettings, profiles: ProfileStore | None = None) -> CycleConfig:
        spread = None if settings.spread_policy == "none" else get_policy(settings.spread_policy)
        node = None if settings.node_policy == "none" else get_policy(settings.node_policy)
        gpu = None if settings.gpu_policy == "none" else gpu_policy(settings.gpu_policy)
        spare = None if settings.spare_policy == "none" else get_policy(settings.spare_policy)
        overcommit = None if settings.overcommit_policy == "none" else get_policy(settings.overcommit_policy)
        interference = None
        if settings.interference:
            from condor_sched.interference.dataset import DatasetError
            from condor_sched.interference.guard import InterferenceSetting
            from condor_sched.interference.report import default_dataset
            from condor_sched.settings import SettingsError

            try:
                interference = InterferenceSetting.from_dataset(
                    settings.interference_dataset or default_dataset(), settings.interference_cutoff)
            except (DatasetError, OSError, ValueError) as exc:
                raise SettingsError(f"COSCHED_INTERFERENCE_DATASET = {settings.interference_dataset!r}: the "
                                    f"interference model cannot be fitted: {exc}") from None
        return cls(get_policy(settings.policy), spread, settings.plan, settings.unpin_age_cycles, profiles,
                   node_policy=node, gpu_policy=gpu, spare_policy=spare, overcommit_policy=overcommit,
                   interference=interference)

    def planner_of(self, mode: SharingMode) -> Any:
        """The planner ``mode`` plans with this cycle (None: the mode is off)."""
        if mode.name in _PLANNER_FIELDS:
            return getattr(self, _PLANNER_FIELDS[mode.name])
        if mode.name in self.planners:
            return self.planners[mode.name]
        return None if mode.default_planner is None else mode.planners[mode.default_planner]()

    def active(self) -> list[tuple[SharingMode, Any]]:
        """Each registered mode that runs this cycle, with its planner (None: off, but it still
        lets go of its stale pins)."""
        out = []
        for mode in modes():
            planner = self.planner_of(mode)
            if planner is not None or mode.keeps_pins_when_off:
                out.append((mode, planner))
        return out

    def with_policy(self, name: str) -> CycleConfig:
        """This config with planner ``name`` in the place of its mode's (a device planner's name
        sets the device mode's, see :meth:`with_gpu_policy`)."""
        if name in gpu_policy_names(device_policies=False):
            return replace(self, gpu_policy=gpu_policy(name))
        mode = next((m for m in modes() if m.policy_kind is not None and name in m.planners), None)
        if mode is None:
            get_policy(name)  # raises, naming the known ones
        policy = get_policy(name)
        if mode.name in _PLANNER_FIELDS:  # type: ignore[union-attr]
            return replace(self, **{_PLANNER_FIELDS[mode.name]: policy})  # type: ignore[union-attr]
        return replace(self, planners={**self.planners, mode.name: policy})  # type: ignore[union-attr]

    def with_gpu_policy(self, name: str) -> CycleConfig:
        """This config with GPU policy ``name`` (any of ``gpu_policy_names()``; ``none``: no GPU sharing)."""
        return replace(self, gpu_policy=None if name == "none" else gpu_policy(name))


@dataclass(frozen=True, slots=True)
class CycleDecision:
    """Everything one cycle decided, as callers read it: the slot modes' kept pins, unpins,
    enrollments, new pins and plans (devices, spread and any other mode that pins to a slot),
    holds, each job's reason, and the mates' and the GPU shares' parts in records of their
    own. ``parts`` holds each mode's part as it decided it (registry order), and
    ``bad_ad_unpins``/``bad_ad_holds`` what the cycle does with ads that do not read (also
    in ``unpins``/``holds``); :meth:`of` builds the rest from them. ``first_seen`` is the
    memory the next cycle starts from."""

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
    #: What each idle job planned or left waiting this cycle is told (``CoSchedPinReason``);
    #: kept pins keep theirs.
    reasons: Mapping[JobKey, str] = field(default_factory=dict)
    cache: PlanCache | None = field(default=None, compare=False, repr=False)
    #: Guests and mates of malleable jobs (the mates mode's part).
    node_sharing: NodeSharingDecision = field(default_factory=NodeSharingDecision)
    #: GPU jobs' pins (the GPU mode's part).
    gpu_sharing: GpuSharingDecision = field(default_factory=GpuSharingDecision)
    parts: tuple[ModeDecision, ...] = field(default=(), compare=False, repr=False)
    bad_ad_unpins: tuple[Unpin, ...] = field(default=(), compare=False, repr=False)
    bad_ad_holds: tuple[Hold, ...] = field(default=(), compare=False, repr=False)
    #: ``CycleMemory.exes`` for the next cycle.
    exes: Mapping[tuple[str, str, str], str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, cycle: int, seen: int, parts: tuple[ModeDecision, ...], skipped: tuple[Skipped, ...],
           first_seen: Mapping[JobKey, int], bad_ad_unpins: tuple[Unpin, ...], bad_ad_holds: tuple[Hold, ...],
           cache: PlanCache | None) -> CycleDecision:
        """The decision of a cycle whose modes decided ``parts``."""
        slot_parts = [p for p in parts if p.mode not in _OWN_JSON_KEYS]
        reasons: dict[JobKey, str] = {}
        for p in parts:
            reasons.update(p.reasons)
        return cls(
            cycle, seen, tuple(Assignment(j.key, j.pinned_slot) for p in slot_parts for j in p.kept),  # type: ignore[arg-type]
            (*(u for p in slot_parts for u in p.unpins), *bad_ad_unpins),
            tuple(e for p in slot_parts for e in p.enrolls), tuple(pin for p in slot_parts for pin in p.pins),
            tuple(plan for p in slot_parts for plan in p.plans), skipped, first_seen,
            (*bad_ad_holds, *(h for p in slot_parts for h in p.holds)), reasons, cache,
            _node_sharing(_part(parts, "mates")), _gpu_sharing(_part(parts, "gpus")), parts, bad_ad_unpins,
            bad_ad_holds)

    @property
    def unplaced(self) -> tuple[Unplaced, ...]:
        return tuple(u for p in self.plans for u in p.unplaced)

    def next_memory(self, cycle: int | None = None) -> CycleMemory:
        """The memory of the next cycle, numbered ``cycle`` (default: this one plus one)."""
        return CycleMemory(self.cycle + 1 if cycle is None else cycle, self.first_seen, self.cache, exes=self.exes)

    def to_json(self) -> dict[str, Any]:
        """The documented ``plan --json`` object: placements of this cycle (``assignments``,
        with each policy's details), ``unplaced`` and ``skipped`` with reasons, per-policy
        ``stats``, and what happens to pins: ``kept``, ``unpins``, ``enrolls``; the mates'
        and GPU shares' parts under keys of their own."""

        def job(key: JobKey) -> dict[str, Any]:
            return {"job": key.job_id, "schedd": key.schedd}

        devices, spread = _part(self.parts, "devices").plans, _part(self.parts, "spread").plans
        nodes, gpu = self.node_sharing, self.gpu_sharing
        return {
            "cycle": self.cycle,
            "policy": devices[0].policy if devices else None,
            "spread_policy": spread[0].policy if spread else None,
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
                        "mate_increase_s": g.increase_s, "predicted_end_s": g.predicted_end_s} for g in nodes.pins],
            "guest_kept": [job(k) for k in nodes.kept],
            "guest_unpins": [{**job(k), "reason": r} for k, r in nodes.unpins],
            "mates": [{**job(m.job), "writes": dict(m.writes), "why": m.why} for m in (*nodes.lengthen, *nodes.restore)],
            "gpu_policy": gpu.plan.policy if gpu.plan else None,
            "gpu_pins": [{**job(p.job), "slot": p.slot, **gpu_pin_details(p)} for p in gpu.pins],
            "gpu_kept": [job(k) for k in gpu.kept],
            "gpu_unpins": [{**job(k), "reason": r} for k, r in gpu.unpins],
            "gpu_enrolls": [job(k) for k, _ in gpu.enrolls],
            "gpu_holds": [{**job(k), "reason": r} for k, r in gpu.holds],
        }



def _part(parts: tuple[ModeDecision, ...], mode: str) -> ModeDecision:
    """The part of mode ``mode`` (empty when it did not run)."""
    return next((p for p in parts if p.mode == mode), ModeDecision(mode))


def _node_sharing(p: ModeDecision) -> NodeSharingDecision:
    return NodeSharingDecision(tuple(j.key for j in p.kept), tuple((u.job, u.reason) for u in p.unpins),
                               p.before_pins, p.after_unpins, p.pins, p.reasons, p.plans)


def _gpu_sharing(p: ModeDecision) -> GpuSharingDecision:
    return GpuSharingDecision(tuple(j.key for j in p.kept), tuple((u.job, u.reason) for u in p.unpins),
                              tuple((e.job, e.requirements) for e in p.enrolls), tuple((h.job, h.reason) for h in p.holds),
                              p.pins, p.reasons, p.plans[0] if p.plans else None)
