"""The negotiation-cycle sidecar: read -> decide -> apply -> log, once per cycle.

``decide_cycle`` is pure (records in, edits out), so tests and ``--dry-run`` see exactly
what a cycle would do. ``apply_cycle`` performs the edits one job at a time; each job's
edits keep it either pinned (original Requirements saved) or unpinned, so a crash at any
point leaves the queue consistent.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Protocol

from condor_sched.model import (
    PIN_EXCLUSIVE_ATTR,
    PIN_LLC_WAYS_ATTR,
    PIN_MEM_BW_ATTR,
    PIN_SCALE_ATTR,
    Assignment,
    Job,
    JobKey,
    JobStatus,
    Plan,
    PoolState,
    Resources,
    Slot,
    SlotKind,
    partitionable_slot_of,
)
from condor_sched.piggyback import exploration_scales
from condor_sched.policies.base import Policy
from condor_sched.settings import SidecarSettings

log = logging.getLogger("condor_sched.sidecar")


@dataclass(frozen=True, slots=True)
class Unpin:
    job: JobKey
    reason: str


@dataclass(frozen=True, slots=True)
class Enroll:
    job: JobKey
    requirements: str | None


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
    cycle: int
    seen: int
    kept: int
    unpins: tuple[Unpin, ...]
    enrolls: tuple[Enroll, ...]
    pins: tuple[Pin, ...]
    plans: tuple[Plan, ...]
    skipped: tuple[str, ...] = ()

    @property
    def unplaced(self) -> int:
        return sum(len(p.unplaced) for p in self.plans)


def covered(job: Job) -> bool:
    """The jobs condor_sched covers: idle jobs that request device memory (device
    policies) or name their program with +CoSchedProgram (spread policy)."""
    return job.is_idle and (job.uses_device or job.wants_spread)


def _pin_of(assignment: Assignment) -> Pin:
    d = assignment.details
    if "llc_ways" not in d:
        return Pin(assignment.job, assignment.slot, whole_device=bool(d.get("whole_device", False)))
    # HTCondor's custom resources are integers: bandwidth rounds up so it is never under-booked.
    return Pin(assignment.job, assignment.slot, int(d["llc_ways"]), int(math.ceil(float(d["mem_bw_gbs"]))),
               int(d.get("scale_factor", 1)))


def _stale_reason(job: Job, slots: dict[str, Slot], cycle: int, unpin_age: int) -> str | None:
    if job.pinned_slot not in slots:
        return f"pinned slot {job.pinned_slot} vanished"
    if job.pinned_cycle is None or cycle - job.pinned_cycle >= unpin_age:
        return f"pin to {job.pinned_slot} not matched within {unpin_age} cycles"
    return None


#: Job states in which a job holds a dynamic slot of its partitionable slot.
_HOLDS_A_SLOT = frozenset({JobStatus.RUNNING, JobStatus.TRANSFERRING_OUTPUT, JobStatus.SUSPENDED})


def _not_yet_in_ad(job: Job, slots: dict[str, Slot]) -> str | None:
    """The slot of a started job that its slot's ad may not show yet: its resources are not
    yet out of the ad's free amounts. Exact when the ad lists its dynamic slots (``ChildName``:
    the job's slot is missing from it); otherwise when the ad predates the job's start, or
    the job has no start time yet (conservative: the claim precedes the start).

    The schedd marks a job running before it records ``RemoteHost`` (a separate transaction,
    when it spawns the shadow), so a started job without one counts on the slot it is pinned to.
    """
    if job.status not in _HOLDS_A_SLOT:
        return None
    if not job.remote_slot:
        return job.pinned_slot if job.pinned_slot in slots else None
    slot = slots.get(partitionable_slot_of(job.remote_slot))
    if slot is None:
        return None
    if slot.children is not None:
        return slot.name if job.remote_slot not in slot.children else None
    return slot.name if job.started_at_s is None or job.started_at_s >= slot.updated_at_s else None


def _reserve(slots: dict[str, Slot], pinned: list[Job], all_jobs: Iterable[Job]) -> list[Slot]:
    """Slots with the requests taken out of jobs pinned to them and not yet matched, and of
    jobs started after the slot's ad was sent (so a stale ad never looks free)."""
    held: dict[str, Resources] = {}
    for job in pinned:
        held[job.pinned_slot] = held.get(job.pinned_slot, Resources()) + job.request  # type: ignore[index]
    for job in all_jobs:
        name = _not_yet_in_ad(job, slots)
        if name is not None:
            held[name] = held.get(name, Resources()) + job.request
    return [s.with_free(s.free - held[s.name]) if s.name in held else s for s in slots.values()]


def decide_cycle(state: PoolState, cycle: int, settings: SidecarSettings, policy: Policy,
                 first_seen: dict[JobKey, int] | None = None, spread_policy: Policy | None = None,
                 extra: Mapping[str, Any] | None = None) -> CycleDecision:
    """What one cycle does: unpin stale pins, enroll jobs lacking the pin clause, plan the
    rest of the idle co-scheduled jobs on what is left free, pin what was placed.

    Device jobs go to ``policy`` on device slots, spread jobs to ``spread_policy`` on
    socket slots (left alone when it is None); ``extra`` reaches the policies (profiles)."""
    slots = {s.name: s for s in state.slots}
    jobs = [j for j in state.jobs if covered(j)]
    unpins, kept, to_plan = [], [], []
    for job in jobs:
        if job.pinned_slot is not None:
            reason = _stale_reason(job, slots, cycle, settings.unpin_age_cycles)
            if reason is None:
                kept.append(job)
                continue
            unpins.append(Unpin(job.key, reason))
        to_plan.append(replace(job, pinned_slot=None, pinned_cycle=None))
    # A pinned job whose ad went bad cannot be planned: take its pin away so it is never
    # left pinned to a slot that cannot run it (it stays untouched otherwise).
    unpins += [Unpin(s.job, f"malformed ad: {s.reason}") for s in state.skipped
               if s.job is not None and s.pinned_slot is not None]
    if spread_policy is None:
        to_plan = [j for j in to_plan if j.uses_device]
    enrolls = [Enroll(j.key, j.attributes.get("Requirements")) for j in to_plan if not j.has_pin_clause]
    plan_settings = replace(settings.plan, cycle=cycle, extra={**settings.plan.extra, **(extra or {}),
                                                               "first_seen_cycle": dict(first_seen or {})})
    free = _reserve(slots, kept, state.jobs)
    plans = [policy.plan([j for j in to_plan if j.uses_device],
                         [s for s in free if s.kind is SlotKind.DEVICE], plan_settings)]
    if spread_policy is not None:
        plans.append(spread_policy.plan([j for j in to_plan if j.wants_spread],
                                        [s for s in free if s.kind is SlotKind.SOCKET], plan_settings))
    pins = tuple(_pin_of(a) for p in plans for a in p.assignments)
    return CycleDecision(cycle, len(jobs), len(kept), tuple(unpins), tuple(enrolls), pins, tuple(plans),
                         tuple(str(s) for s in state.skipped))


def pin_details(pin: Pin) -> dict[str, int]:
    """The sidecar-owned attributes a pin carries besides its slot: a device job whether it
    needs the whole device, a spread proc its ways, bandwidth and scale factor."""
    if pin.llc_ways is None:
        return {PIN_EXCLUSIVE_ATTR: int(pin.whole_device)}
    return {PIN_LLC_WAYS_ATTR: pin.llc_ways, PIN_MEM_BW_ATTR: pin.mem_bw_gbs or 0,
            PIN_SCALE_ATTR: pin.scale_factor or 1}


class Editor(Protocol):
    def pin(self, job: JobKey, slot: str, cycle: int, details: Mapping[str, int] | None = None) -> None: ...
    def unpin(self, job: JobKey) -> None: ...
    def enroll(self, job: JobKey, requirements: str | None) -> None: ...


@dataclass
class CycleOutcome:
    pinned: int = 0
    unpinned: int = 0
    enrolled: int = 0
    failed: list[str] = field(default_factory=list)


def apply_cycle(decision: CycleDecision, editor: Editor) -> CycleOutcome:
    """Unpin, enroll, then pin; one failing job is logged and the rest go on."""
    outcome = CycleOutcome()

    def attempt(job: JobKey, what: str, action: Callable[[], None]) -> bool:
        try:
            action()
            return True
        except Exception as e:  # one job's failure must not stop the cycle
            outcome.failed.append(f"{what} {job}: {e}")
            log.warning("could not %s job %s: %s", what, job, e)
            return False

    for u in decision.unpins:
        if attempt(u.job, "unpin", lambda u=u: editor.unpin(u.job)):
            outcome.unpinned += 1
            log.info("unpinned %s: %s", u.job, u.reason)
    enrolled_ok = set()
    for e in decision.enrolls:
        if attempt(e.job, "enroll", lambda e=e: editor.enroll(e.job, e.requirements)):
            outcome.enrolled += 1
            enrolled_ok.add(e.job)
    failed_enroll = {e.job for e in decision.enrolls} - enrolled_ok
    for p in decision.pins:
        if p.job in failed_enroll:
            continue
        if attempt(p.job, "pin", lambda p=p: editor.pin(p.job, p.slot, decision.cycle, pin_details(p))):
            outcome.pinned += 1
            log.info("pinned %s to %s", p.job, p.slot)
    return outcome


class Sidecar:
    """The loop around read -> decide -> apply -> log."""

    def __init__(self, settings: SidecarSettings, policy: Policy, read_state: Callable[[], PoolState],
                 editor: Editor | None, cycle_end: Callable[[], int | None] | None = None,
                 spread_policy: Policy | None = None, extra: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.policy = policy
        self.spread_policy = spread_policy
        self.extra = dict(extra or {})
        self.read_state = read_state
        self.editor = editor  # None: dry run
        self.cycle_end = cycle_end
        self.cycle = 0
        self.first_seen: dict[JobKey, int] = {}

    def _extra_for(self, state: PoolState) -> dict[str, Any]:
        """Policy extras: the profiles, and the piggyback-profiling scale of each spread
        job's program that has no profile yet (from the node agents' run records)."""
        if not self.settings.profile_runs_dir or self.spread_policy is None:
            return self.extra
        store = self.extra.get("profiles")
        unknown = {j.program for j in state.jobs
                   if covered(j) and j.wants_spread and (store is None or j.program not in store)}
        return {**self.extra, "exploration_scales": exploration_scales(unknown, self.settings.profile_runs_dir)}

    def run_cycle(self) -> CycleDecision:
        started = time.perf_counter()
        state = self.read_state()
        if self.cycle == 0:
            self.cycle = 1 + max((j.pinned_cycle or 0 for j in state.jobs), default=0)
        current = {j.key for j in state.jobs if covered(j)}
        self.first_seen = {k: self.first_seen.get(k, self.cycle) for k in current}
        decision = decide_cycle(state, self.cycle, self.settings, self.policy, self.first_seen,
                                self.spread_policy, self._extra_for(state))
        for reason in decision.skipped:
            log.warning("skipped %s", reason)
        if self.editor is None:
            for p in decision.pins:
                log.info("dry run: would pin %s to %s", p.job, p.slot)
            for u in decision.unpins:
                log.info("dry run: would unpin %s (%s)", u.job, u.reason)
            outcome = CycleOutcome()
        else:
            outcome = apply_cycle(decision, self.editor)
        log.info("cycle %d: %d idle co-scheduled jobs seen, %d pins kept, %d pinned, %d unpinned, "
                 "%d enrolled, %d unplaced, %d skipped, %d failed edits, %.3f s",
                 self.cycle, decision.seen, decision.kept, outcome.pinned, outcome.unpinned,
                 outcome.enrolled, decision.unplaced, len(decision.skipped),
                 len(outcome.failed), time.perf_counter() - started)
        self.cycle += 1
        return decision

    def wait_for_next_cycle(self, last_end: int | None, sleep: Callable[[float], None] = time.sleep) -> int | None:
        """Block until the negotiator finishes a new cycle (or the interval passes)."""
        if self.settings.cycle_source == "interval" or self.cycle_end is None:
            sleep(self.settings.interval_s)
            return None
        deadline = time.monotonic() + max(self.settings.interval_s, 1.0)
        while time.monotonic() < deadline:
            try:
                end = self.cycle_end()
            except Exception as e:
                log.warning("cannot read the negotiator ad: %s", e)
                end = None
            if end is not None and end != last_end:
                return end
            sleep(0.5)
        return last_end

    def run_forever(self, stop: Callable[[], bool] = lambda: False) -> None:
        last_end = None
        while not stop():
            try:
                self.run_cycle()
            except Exception as e:  # the pool may be down for a while; keep going
                log.error("cycle %d failed: %s", self.cycle, e)
            last_end = self.wait_for_next_cycle(last_end)
