"""The negotiation-cycle sidecar: read -> decide -> apply -> log, once per cycle.

``decide_cycle`` is pure (records in, edits out), so tests and ``--dry-run`` see exactly
what a cycle would do. ``apply_cycle`` performs the edits one job at a time; each job's
edits keep it either pinned (original Requirements saved) or unpinned, so a crash at any
point leaves the queue consistent.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from condor_sched.model import Job, JobKey, Plan, PoolState, Resources, Slot
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
    job: JobKey
    slot: str


@dataclass(frozen=True, slots=True)
class CycleDecision:
    cycle: int
    seen: int
    kept: int
    unpins: tuple[Unpin, ...]
    enrolls: tuple[Enroll, ...]
    pins: tuple[Pin, ...]
    plan: Plan
    skipped: tuple[str, ...] = ()


def covered(job: Job) -> bool:
    """The jobs the device policies cover: idle jobs that request device memory."""
    return job.is_idle and job.uses_device


def _stale_reason(job: Job, slots: dict[str, Slot], cycle: int, unpin_age: int) -> str | None:
    if job.pinned_slot not in slots:
        return f"pinned slot {job.pinned_slot} vanished"
    if job.pinned_cycle is None or cycle - job.pinned_cycle >= unpin_age:
        return f"pin to {job.pinned_slot} not matched within {unpin_age} cycles"
    return None


def _reserve(slots: dict[str, Slot], jobs: list[Job]) -> list[Slot]:
    """Slots with the requests of jobs pinned to them (and not yet matched) taken out."""
    held: dict[str, Resources] = {}
    for job in jobs:
        held[job.pinned_slot] = held.get(job.pinned_slot, Resources()) + job.request  # type: ignore[index]
    return [s.with_free(s.free - held[s.name]) if s.name in held else s for s in slots.values()]


def decide_cycle(state: PoolState, cycle: int, settings: SidecarSettings, policy: Policy,
                 first_seen: dict[JobKey, int] | None = None) -> CycleDecision:
    """What one cycle does: unpin stale pins, enroll jobs lacking the pin clause, plan the
    rest of the idle co-scheduled jobs on what is left free, pin what was placed."""
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
    enrolls = [Enroll(j.key, j.attributes.get("Requirements")) for j in to_plan if not j.has_pin_clause]
    plan_settings = replace(settings.plan, cycle=cycle, extra={**settings.plan.extra,
                                                               "first_seen_cycle": dict(first_seen or {})})
    plan = policy.plan(to_plan, _reserve(slots, kept), plan_settings)
    pins = tuple(Pin(a.job, a.slot) for a in plan.assignments)
    return CycleDecision(cycle, len(jobs), len(kept), tuple(unpins), tuple(enrolls), pins, plan,
                         tuple(str(s) for s in state.skipped))


class Editor(Protocol):
    def pin(self, job: JobKey, slot: str, cycle: int) -> None: ...
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
        if attempt(p.job, "pin", lambda p=p: editor.pin(p.job, p.slot, decision.cycle)):
            outcome.pinned += 1
            log.info("pinned %s to %s", p.job, p.slot)
    return outcome


class Sidecar:
    """The loop around read -> decide -> apply -> log."""

    def __init__(self, settings: SidecarSettings, policy: Policy, read_state: Callable[[], PoolState],
                 editor: Editor | None, cycle_end: Callable[[], int | None] | None = None) -> None:
        self.settings = settings
        self.policy = policy
        self.read_state = read_state
        self.editor = editor  # None: dry run
        self.cycle_end = cycle_end
        self.cycle = 0
        self.first_seen: dict[JobKey, int] = {}

    def run_cycle(self) -> CycleDecision:
        started = time.perf_counter()
        state = self.read_state()
        if self.cycle == 0:
            self.cycle = 1 + max((j.pinned_cycle or 0 for j in state.jobs), default=0)
        current = {j.key for j in state.jobs if covered(j)}
        self.first_seen = {k: self.first_seen.get(k, self.cycle) for k in current}
        decision = decide_cycle(state, self.cycle, self.settings, self.policy, self.first_seen)
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
                 outcome.enrolled, len(decision.plan.unplaced), len(decision.skipped),
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
